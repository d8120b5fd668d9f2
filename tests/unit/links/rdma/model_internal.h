/*
 * The verbs model's insides, shared by its parts: verbs_model.c (state, control, devices, the
 * shim table), model_res.c (PDs, MRs, channels, CQs), model_qp.c (queue pairs and the wire),
 * model_cm.c (rdma_cm). One lock guards everything: set-up runs a thread per rank.
 */
#ifndef HCCL_TEST_MODEL_INTERNAL_H
#define HCCL_TEST_MODEL_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "verbs_model.h"

#define MAXO 64     /* objects of each kind */
#define QDEPTH 256  /* work requests per queue */

typedef struct { struct ibv_comp_channel ch; int pending; bool live; } m_comp_t;
typedef struct {
    struct ibv_cq cq;
    struct ibv_wc wc[1024];
    int head, count;
    bool armed, live;
    int unacked, qps;
} m_cq_t;
typedef struct {
    struct ibv_mr mr;
    int access;
    bool live;
    uint64_t gen;   /* the model clock when registered: later frees of its range make it stale */
} m_mr_t;
typedef struct { struct ibv_pd pd; int mrs, qps; bool live; } m_pd_t;

typedef struct {
    uint64_t wr_id;
    int opcode;
    uintptr_t addr;
    uint32_t len, lkey, rkey, imm;
    uint64_t raddr;
} m_wr_t;

typedef struct m_qp {
    struct ibv_qp qp;
    bool live, error;
    struct m_qp *peer;
    m_pd_t *pd;
    m_cq_t *cq;
    m_wr_t sq[QDEPTH];
    int sq_head, sq_count, sq_out, max_send;
    m_wr_t rq[QDEPTH];
    int rq_head, rq_count, max_recv;
} m_qp_t;

typedef struct m_ev { struct rdma_cm_event ev; uint8_t data[64]; struct m_ev *next; } m_ev_t;
typedef struct { struct rdma_event_channel ch; m_ev_t *head; bool live; int ids; } m_cmch_t;
typedef struct m_id {
    struct rdma_cm_id id;
    bool live, listening, disconnected;
    int port, dst_port;
    struct m_id *connector; /* acceptor side: who asked */
    struct m_id *peer;
} m_id_t;

extern pthread_mutex_t model_mu;
#define LOCK() pthread_mutex_lock(&model_mu)
#define UNLOCK() pthread_mutex_unlock(&model_mu)

#define FIND_FREE(arr_x, n_x, i_x)                                                       \
    for (i_x = 0; i_x < (n_x) && (arr_x)[i_x].live; i_x++) {                           \
    }

extern struct ibv_context model_cm_ctx; /* librdmacm's own device context */
extern m_comp_t model_comps[MAXO];
extern m_cq_t model_cqs[MAXO];
extern m_mr_t model_mrs[MAXO * 4];
extern m_pd_t model_pds[MAXO];
extern m_qp_t model_qps[MAXO];
extern m_cmch_t model_cmchs[MAXO];
extern m_id_t model_ids[MAXO * 2];
extern model_live_t model_nlive;
extern model_stats_t model_st;
extern enum ibv_wc_status model_inject;
extern bool model_auto;
extern bool model_odp;
/* The model clock: MRs are stamped with it when registered, freed ranges when freed. */
extern uint64_t model_clock;

/* Locked: counts a broken rule (the first one's text is kept). */
void model_violate(const char *what);
/* Locked: true when this call must fail (failure injection). */
bool model_fail_now(void);
/* Locked: the MR of pd with key covering [addr, addr + len) and access, or NULL. */
m_mr_t *model_mr_check(const m_pd_t *pd, uint32_t key, uintptr_t addr, size_t len, int access);
/* Locked: the range was freed (model_free_range) since m was registered, and m is pinned. */
bool model_mr_stale(const m_mr_t *m, uintptr_t addr, size_t len);
void model_cq_push(m_cq_t *cq, const struct ibv_wc *wc);
/* Locked: the QP enters the error state; every outstanding work request is flushed. */
void model_qp_error(m_qp_t *q);
int model_pump_locked(void);

/* model_res.c */
struct ibv_pd *m_alloc_pd(struct ibv_context *c);
int m_dealloc_pd(struct ibv_pd *pd);
struct ibv_comp_channel *m_create_comp_channel(struct ibv_context *c);
int m_destroy_comp_channel(struct ibv_comp_channel *ch);
struct ibv_cq *m_create_cq(struct ibv_context *c, int cqe, void *ctx, struct ibv_comp_channel *ch,
                           int vector);
int m_destroy_cq(struct ibv_cq *cq);
struct ibv_mr *m_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access);
int m_dereg_mr(struct ibv_mr *mr);
int m_req_notify_cq(struct ibv_cq *cq, int solicited);
int m_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq_p, void **ctx_p);
void m_ack_cq_events(struct ibv_cq *cq, unsigned int n);
int m_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);

/* model_qp.c */
int m_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
int m_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int m_create_qp(struct rdma_cm_id *cid, struct ibv_pd *pd, struct ibv_qp_init_attr *a);
void m_destroy_qp(struct rdma_cm_id *cid);

/* model_cm.c */
struct rdma_event_channel *m_create_event_channel(void);
void m_destroy_event_channel(struct rdma_event_channel *ch);
int m_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id_p, void *ctx,
                enum rdma_port_space ps);
int m_destroy_id(struct rdma_cm_id *cid);
int m_bind_addr(struct rdma_cm_id *cid, struct sockaddr *addr);
int m_listen(struct rdma_cm_id *cid, int backlog);
uint16_t m_get_src_port(struct rdma_cm_id *cid);
int m_resolve_addr(struct rdma_cm_id *cid, struct sockaddr *src, struct sockaddr *dst, int ms);
int m_resolve_route(struct rdma_cm_id *cid, int ms);
int m_connect(struct rdma_cm_id *cid, struct rdma_conn_param *p);
int m_accept(struct rdma_cm_id *cid, struct rdma_conn_param *p);
int m_reject(struct rdma_cm_id *cid, const void *data, uint8_t len);
int m_disconnect(struct rdma_cm_id *cid);
int m_get_cm_event(struct rdma_event_channel *ch, struct rdma_cm_event **ev_p);
int m_ack_cm_event(struct rdma_cm_event *ev);

#endif
