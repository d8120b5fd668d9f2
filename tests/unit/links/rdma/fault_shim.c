/* The fault shim (fault_shim.h): the verbs model with chosen calls failing. */
#include <errno.h>
#include <string.h>

#include "fault_shim.h"
#include "rdma_harness.h"

fault_t fault;
hccl_rdma_shim_t fault_shim;
static int saved_cm_fd = -1, saved_comp_fd = -1;

static hccl_rdma_shim_t make(void);

void fault_reset(void)
{
    memset(&fault, 0, sizeof(fault));
    fault.post_send_opcode = -1;
    fault_shim = make();
}

void fault_on_rank(int r)
{
    ((rdma_ctx_t *)ranks[r].ctx)->v = &fault_shim;
}

static int f_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    if (fault.post_send_opcode == -2 || fault.post_send_opcode == (int)wr->opcode) {
        *bad = wr;
        return EIO;
    }
    if (fault.truncate_next_send) {
        struct ibv_sge sge = wr->sg_list[0];
        struct ibv_send_wr w = *wr;
        sge.length = (uint32_t)fault.truncate_next_send;
        w.sg_list = &sge;
        fault.truncate_next_send = 0;
        return model_shim.post_send(qp, &w, bad);
    }
    return model_shim.post_send(qp, wr, bad);
}

static int f_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    if (fault.post_recv) {
        *bad = wr;
        return EIO;
    }
    return model_shim.post_recv(qp, wr, bad);
}

static int f_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    if (fault.poll_cq) {
        errno = EIO;
        return -1;
    }
    return model_shim.poll_cq(cq, n, wc);
}

static int f_req_notify_cq(struct ibv_cq *cq, int solicited)
{
    if (fault.req_notify_cq)
        return EIO;
    return model_shim.req_notify_cq(cq, solicited);
}

static struct ibv_mr *f_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    if (fault.reg_mr) {
        errno = ENOMEM;
        return NULL;
    }
    return model_shim.reg_mr(pd, addr, len, access);
}

static int f_accept(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
    if (fault.accept) {
        model_shim.reject(id, NULL, 0); /* what the peer sees of a failed accept */
        errno = EIO;
        return -1;
    }
    return model_shim.accept(id, p);
}

static int f_query_device_ex(struct ibv_context *c, const struct ibv_query_device_ex_input *in,
                             struct ibv_device_attr_ex *a)
{
    if (fault.query_device_ex)
        return EOPNOTSUPP;
    return model_shim.query_device_ex(c, in, a);
}

static int f_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid)
{
    if (fault.query_gid)
        return EINVAL;
    return model_shim.query_gid(c, port, index, gid);
}

static int f_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
    int ret = model_shim.bind_addr(id, addr);

    if (ret == 0 && fault.unbound_listener)
        id->verbs = NULL;
    return ret;
}

static struct rdma_event_channel *f_create_event_channel(void)
{
    struct rdma_event_channel *ch = model_shim.create_event_channel();

    if (ch && fault.bad_cm_fd) {
        saved_cm_fd = ch->fd;
        ch->fd = -1;
    }
    return ch;
}

static void f_destroy_event_channel(struct rdma_event_channel *ch)
{
    if (ch->fd == -1)
        ch->fd = saved_cm_fd;
    model_shim.destroy_event_channel(ch);
}

static struct ibv_comp_channel *f_create_comp_channel(struct ibv_context *c)
{
    struct ibv_comp_channel *ch = model_shim.create_comp_channel(c);

    if (ch && fault.bad_comp_fd) {
        saved_comp_fd = ch->fd;
        ch->fd = -1;
    }
    return ch;
}

static int f_destroy_comp_channel(struct ibv_comp_channel *ch)
{
    if (ch->fd == -1)
        ch->fd = saved_comp_fd;
    return model_shim.destroy_comp_channel(ch);
}

static hccl_rdma_shim_t make(void)
{
    hccl_rdma_shim_t s = model_shim;

    s.post_send = f_post_send;
    s.post_recv = f_post_recv;
    s.poll_cq = f_poll_cq;
    s.req_notify_cq = f_req_notify_cq;
    s.reg_mr = f_reg_mr;
    s.accept = f_accept;
    s.query_device_ex = f_query_device_ex;
    s.query_gid = f_query_gid;
    s.bind_addr = f_bind_addr;
    s.create_event_channel = f_create_event_channel;
    s.destroy_event_channel = f_destroy_event_channel;
    s.create_comp_channel = f_create_comp_channel;
    s.destroy_comp_channel = f_destroy_comp_channel;
    return s;
}

