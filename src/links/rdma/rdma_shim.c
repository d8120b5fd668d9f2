/* The real verbs behind the shim: thin functions over the inline calls and macros. */
#include "links/rdma/rdma_shim.h"

static int shim_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
    return ibv_query_port(ctx, port, attr);
}

static int shim_query_device_ex(struct ibv_context *ctx,
                                const struct ibv_query_device_ex_input *input,
                                struct ibv_device_attr_ex *attr)
{
    return ibv_query_device_ex(ctx, input, attr);
}

static struct ibv_mr *shim_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    return ibv_reg_mr(pd, addr, len, access);
}

static int shim_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
    return ibv_req_notify_cq(cq, solicited_only);
}

static int shim_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    return ibv_poll_cq(cq, n, wc);
}

static int shim_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_p)
{
    return ibv_post_send(qp, wr, bad_p);
}

static int shim_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_p)
{
    return ibv_post_recv(qp, wr, bad_p);
}

static uint16_t shim_get_src_port(struct rdma_cm_id *id)
{
    return rdma_get_src_port(id);
}

const hccl_rdma_shim_t hccl_rdma_shim_real = {
    .get_device_list = ibv_get_device_list,
    .free_device_list = ibv_free_device_list,
    .get_device_name = ibv_get_device_name,
    .open_device = ibv_open_device,
    .close_device = ibv_close_device,
    .query_device = ibv_query_device,
    .query_device_ex = shim_query_device_ex,
    .query_port = shim_query_port,
    .query_gid = ibv_query_gid,
    .alloc_pd = ibv_alloc_pd,
    .dealloc_pd = ibv_dealloc_pd,
    .create_comp_channel = ibv_create_comp_channel,
    .destroy_comp_channel = ibv_destroy_comp_channel,
    .create_cq = ibv_create_cq,
    .destroy_cq = ibv_destroy_cq,
    .reg_mr = shim_reg_mr,
    .dereg_mr = ibv_dereg_mr,
    .req_notify_cq = shim_req_notify_cq,
    .get_cq_event = ibv_get_cq_event,
    .ack_cq_events = ibv_ack_cq_events,
    .poll_cq = shim_poll_cq,
    .post_send = shim_post_send,
    .post_recv = shim_post_recv,
    .wc_status_str = ibv_wc_status_str,
    .create_event_channel = rdma_create_event_channel,
    .destroy_event_channel = rdma_destroy_event_channel,
    .create_id = rdma_create_id,
    .destroy_id = rdma_destroy_id,
    .bind_addr = rdma_bind_addr,
    .listen = rdma_listen,
    .get_src_port = shim_get_src_port,
    .resolve_addr = rdma_resolve_addr,
    .resolve_route = rdma_resolve_route,
    .create_qp = rdma_create_qp,
    .destroy_qp = rdma_destroy_qp,
    .connect = rdma_connect,
    .accept = rdma_accept,
    .reject = rdma_reject,
    .disconnect = rdma_disconnect,
    .get_cm_event = rdma_get_cm_event,
    .ack_cm_event = rdma_ack_cm_event,
};

const hccl_rdma_shim_t *hccl_rdma_shim = &hccl_rdma_shim_real;
