/*
 * Every libibverbs and librdmacm call of the rdma link goes through this table, so that tests
 * can replace the verbs with a model: ibv_post_send, ibv_post_recv, ibv_poll_cq,
 * ibv_req_notify_cq and ibv_query_device_ex are static inline in verbs.h and ibv_reg_mr,
 * ibv_query_port are macros, so there is no symbol to wrap at link time.
 */
#ifndef HCCL_LINK_RDMA_SHIM_H
#define HCCL_LINK_RDMA_SHIM_H

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

typedef struct hccl_rdma_shim {
    /* devices */
    struct ibv_device **(*get_device_list)(int *num_p);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *dev);
    struct ibv_context *(*open_device)(struct ibv_device *dev);
    int (*close_device)(struct ibv_context *ctx);
    int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
    /* For the on-demand paging capabilities (odp_caps). */
    int (*query_device_ex)(struct ibv_context *ctx, const struct ibv_query_device_ex_input *input,
                           struct ibv_device_attr_ex *attr);
    int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
    int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
    /* resources */
    struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
    int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
    struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_ctx,
                                struct ibv_comp_channel *ch, int vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    /* data path */
    int (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);
    int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq_p, void **cq_ctx_p);
    void (*ack_cq_events)(struct ibv_cq *cq, unsigned int n);
    int (*poll_cq)(struct ibv_cq *cq, int n, struct ibv_wc *wc);
    int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_p);
    int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_p);
    const char *(*wc_status_str)(enum ibv_wc_status status);
    /* connection management */
    struct rdma_event_channel *(*create_event_channel)(void);
    void (*destroy_event_channel)(struct rdma_event_channel *ch);
    int (*create_id)(struct rdma_event_channel *ch, struct rdma_cm_id **id_p, void *ctx,
                     enum rdma_port_space ps);
    int (*destroy_id)(struct rdma_cm_id *id);
    int (*bind_addr)(struct rdma_cm_id *id, struct sockaddr *addr);
    int (*listen)(struct rdma_cm_id *id, int backlog);
    uint16_t (*get_src_port)(struct rdma_cm_id *id); /* network order */
    int (*resolve_addr)(struct rdma_cm_id *id, struct sockaddr *src, struct sockaddr *dst,
                        int timeout_ms);
    int (*resolve_route)(struct rdma_cm_id *id, int timeout_ms);
    int (*create_qp)(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    void (*destroy_qp)(struct rdma_cm_id *id);
    int (*connect)(struct rdma_cm_id *id, struct rdma_conn_param *param);
    int (*accept)(struct rdma_cm_id *id, struct rdma_conn_param *param);
    int (*reject)(struct rdma_cm_id *id, const void *data, uint8_t len);
    int (*disconnect)(struct rdma_cm_id *id);
    int (*get_cm_event)(struct rdma_event_channel *ch, struct rdma_cm_event **ev_p);
    int (*ack_cm_event)(struct rdma_cm_event *ev);
} hccl_rdma_shim_t;

/* The table in use: the real verbs unless a test swapped it. */
extern const hccl_rdma_shim_t *hccl_rdma_shim;
extern const hccl_rdma_shim_t hccl_rdma_shim_real;

#endif /* HCCL_LINK_RDMA_SHIM_H */
