/*
 * rdma: ranks on other hosts over RoCE or InfiniBand. librdmacm sets up one RC queue pair per
 * peer; the framing engine (links/frame.h) runs over SEND messages into registered
 * staging slots, with credits so that a sender never overruns the receiver's posted slots;
 * large transfers are written straight into the receiver's registered buffer (RDMA WRITE with
 * immediate after the receiver's clear-to-send).
 */
#ifndef HCCL_LINK_RDMA_H
#define HCCL_LINK_RDMA_H

#include <event2/event.h>

#include "links/rdma/rdma_shim.h"
#include "links/frame.h"

/* Data slots each side posts per peer: the sender's credits. */
#define RDMA_CREDITS 16
/* Receive slots beyond the credits, for credit returns (which take no credit). */
#define RDMA_CTL_EXTRA 4
#define RDMA_NRECV (RDMA_CREDITS + RDMA_CTL_EXTRA)
#define RDMA_NSEND (RDMA_CREDITS + RDMA_CTL_EXTRA)
/* Transfers of at least this many bytes go zero-copy (HCCL_BUFFSIZE-independent). */
#define RDMA_ZCOPY_MIN (256u << 10)
/* Largest single RDMA WRITE; longer zero-copy transfers are written in pieces. */
#define RDMA_WRITE_MAX (1u << 30)
/* Zero-copy receives in flight per peer (the clear-to-send ids). */
#define RDMA_ZRX_MAX 64
/* Registrations kept by the cache while no transfer uses them. */
#define RDMA_REG_CACHE 32
#define RDMA_POLL_BATCH 16
/* Completion events acknowledged together (all before ibv_destroy_cq). */
#define RDMA_ACK_BATCH 64

/* What a rank publishes in its card. */
typedef struct {
    uint8_t active;         /* 1: an active port was found; the rest is valid */
    uint8_t port_num;
    uint8_t link_layer;     /* IBV_LINK_LAYER_* */
    int8_t gid_index;
    uint16_t family;        /* AF_INET: the rdma_cm address is IPv4 (see rdma_dev.c) */
    uint16_t cm_port;       /* network order */
    uint8_t addr[16];       /* the IPv4 address in the first 4 bytes */
    char dev[32];           /* device name, NUL-terminated */
    uint8_t gid[16];
} rdma_card_t;

/* Message types in a staging slot. */
enum { RDMA_MSG_STREAM = 1, RDMA_MSG_CTS = 2, RDMA_MSG_CREDIT = 3, RDMA_MSG_RTS = 4 };

typedef struct {
    uint16_t type;
    uint16_t reserved;
    uint32_t credits;       /* receive slots the sender of this message has reposted for us */
    uint32_t len;           /* payload bytes after the header */
    uint32_t pad;
} rdma_msg_t;

/* Clear-to-send: the receiver's registered buffer for one zero-copy transfer. */
typedef struct {
    uint64_t seq;
    uint32_t tag;
    uint32_t sig;
    uint64_t len;
    uint64_t addr;
    uint32_t rkey;
    uint32_t id;            /* comes back as the immediate of the write */
} rdma_cts_t;

/*
 * Ready-to-send: a zero-copy send posted before its clear-to-send arrived. The receiver learns
 * the sender's length, so that lengths on both sides of the zero-copy threshold (one side
 * staged, the other zero-copy) fail at once instead of both sides waiting.
 */
typedef struct {
    uint64_t seq;
    uint32_t tag;
    uint32_t sig;
    uint64_t len;
} rdma_rts_t;

/* A zero-copy send: its clear-to-send, its transfer once posted, its registration while written. */
typedef struct rdma_zsend {
    rdma_cts_t cts;
    hccl_xfer_t *x;         /* borrowed: NULL until the send is posted */
    struct rdma_reg *reg;   /* while the write is in flight */
    struct rdma_zsend *next;
} rdma_zsend_t;

/* A ready-to-send whose receive is not posted yet. */
typedef struct rdma_rts_held {
    rdma_rts_t rts;
    struct rdma_rts_held *next;
} rdma_rts_held_t;

/* The private data of a connection request. */
typedef struct {
    uint32_t magic;
    uint32_t rank;
    uint64_t comm_id;
    uint8_t secret[16];
} rdma_hello_t;

#define RDMA_HELLO_MAGIC 0x414d4452u /* "RDMA" */

/* wr_id: peer rank << 16 | kind << 8 | slot. */
enum { RDMA_WR_RECV = 1, RDMA_WR_SEND = 2, RDMA_WR_WRITE = 3, RDMA_WR_WRITE_LAST = 4 };

/*
 * The request a transfer belongs to, as far as a link can tell: a collective's transfers share
 * its sequence number and signature; a transfer without a signature (point-to-point, whose
 * sequence numbers count per peer and direction) is told apart by its peer and direction too.
 */
typedef struct {
    uint64_t seq;
    uint32_t sig;
    int peer;               /* -1 for a collective */
    int send;
} rdma_req_key_t;

/*
 * A registered user buffer. Without on-demand paging the MR pins the pages the range had when
 * it was registered, so it serves only the request that registered it: the caller may free the
 * buffer once that request is done. With on-demand paging the device follows the page tables
 * and an entry serves any later request.
 */
typedef struct rdma_reg {
    void *addr;
    size_t len;
    struct ibv_mr *mr;      /* owned */
    rdma_req_key_t req;     /* the request that registered it */
    int inflight;           /* transfers using it: never released while > 0 */
    uint64_t last_use;
    struct rdma_reg *next;
} rdma_reg_t;

typedef struct rdma_conn {
    hccl_conn_t conn;       /* conn.priv points back here */
    struct rdma_ctx *ctx;   /* borrowed */
    int peer;
    struct rdma_cm_id *id;  /* owned; id->qp once created */
    bool established;
    bool failed;
    bool disconnected;      /* rdma_disconnect called */
    hccl_framer_t framer;
    char peer_addr[64];
    /* staging: one registration per direction */
    char *rx_buf;           /* owned, RDMA_NRECV slots */
    char *tx_buf;           /* owned, RDMA_NSEND slots */
    struct ibv_mr *rx_mr;
    struct ibv_mr *tx_mr;
    size_t slot;            /* bytes per slot, header included */
    /* receive side: completed slots not yet read by the framer, in order */
    int rx_ready[RDMA_NRECV];
    uint32_t rx_ready_len[RDMA_NRECV];
    int rx_head, rx_count;
    size_t rx_off;          /* bytes of the head slot's payload already read */
    uint32_t owed;          /* credits to return to the peer */
    /* send side */
    int tx_free[RDMA_NSEND];
    int ntx_free;
    uint32_t credits;       /* messages we may still send that take a credit */
    int sends_out;          /* send work requests not completed */
    /* zero-copy, sending */
    hccl_xfer_queue_t zrts_wait;   /* large sends whose ready-to-send waits for a credit */
    hccl_xfer_queue_t zsend_wait;  /* announced, waiting for their clear-to-send */
    rdma_zsend_t *cts_held;        /* clear-to-sends in arrival order, paired or not yet */
    rdma_zsend_t *zsend_out;       /* written, waiting for the completion, in posting order */
    rdma_zsend_t *zsend_out_tail;
    /* zero-copy, receiving */
    hccl_xfer_queue_t zcts_wait;   /* large receives whose clear-to-send waits for a credit */
    hccl_xfer_t *zrx[RDMA_ZRX_MAX];/* receives told to the peer, by id */
    rdma_reg_t *zrx_reg[RDMA_ZRX_MAX];
    int nzrx;                      /* entries of zrx in use */
    rdma_rts_held_t *rts_held;     /* the peer's ready-to-sends without a receive yet */
} rdma_conn_t;

typedef struct rdma_ctx {
    hccl_link_env_t *env;   /* borrowed */
    const hccl_rdma_shim_t *v;
    rdma_card_t card;
    struct rdma_event_channel *cm_ch;   /* owned */
    struct rdma_cm_id *listen_id;       /* owned */
    struct ibv_pd *pd;
    struct ibv_comp_channel *comp_ch;
    struct ibv_cq *cq;
    unsigned int unacked;   /* completion events not acknowledged yet */
    struct event *ev_cq;
    struct event *ev_cm;
    rdma_conn_t **conns;    /* [nranks], owned */
    bool odp;               /* user buffers are registered on demand (ODP) */
    rdma_reg_t *regs;       /* owned: the registration cache */
    int nregs, nregs_idle;
    uint64_t reg_clock;
    uint64_t reg_hits, reg_misses;
    size_t zcopy_min;
} rdma_ctx_t;

/* HCCL_IB_HCA (NCCL syntax: "mlx5_0:1,mlx5_1", "^" excludes, "=" exact names): may dev:port be used? */
bool hccl_rdma_hca_allowed(const char *spec, const char *dev, int port);

/* rdma_dev.c: the device, its PD/CQ/channel, completions. */
hcclResult_t hccl_rdma_pick_device(rdma_ctx_t *ctx, hccl_sockaddr_t *addr_p);
hcclResult_t hccl_rdma_ctx_open(rdma_ctx_t *ctx);
void hccl_rdma_ctx_close(rdma_ctx_t *ctx);
void hccl_rdma_on_cq_event(evutil_socket_t fd, short what, void *arg);
/* Handles every completion ready now (also used by shutdown, with the reactor stopped). */
void hccl_rdma_drain_cq(rdma_ctx_t *ctx);

/* rdma_reg.c: the registration cache of user buffers (x's buffer, for x's request). */
hcclResult_t hccl_rdma_reg_get(rdma_ctx_t *ctx, const hccl_xfer_t *x, bool send,
                               rdma_reg_t **reg_p);
void hccl_rdma_reg_put(rdma_ctx_t *ctx, rdma_reg_t *reg);
/* Deregisters every entry (fini: no transfer is left). */
void hccl_rdma_reg_clear(rdma_ctx_t *ctx);

/* rdma_conn.c: connection set-up and teardown. */
hcclResult_t hccl_rdma_connect_all(rdma_ctx_t *ctx, const int *peers, int npeers, int64_t deadline_ms);
void hccl_rdma_on_cm_event(evutil_socket_t fd, short what, void *arg);
void hccl_rdma_conn_destroy(rdma_conn_t *rc);

/* rdma_stage.c: the staged path (slots, credits, the framer over SEND) and completions. */
uint64_t hccl_rdma_wr_id(const rdma_conn_t *rc, int kind, int slot);
hcclResult_t hccl_rdma_conn_post_recvs(rdma_conn_t *rc);
hcclResult_t hccl_rdma_repost(rdma_conn_t *rc, int slot, bool owe);
/* Sends one staged message: its length, or < 0 (message recorded). */
int hccl_rdma_send_msg(rdma_conn_t *rc, uint16_t type, const struct iovec *iov, int iovcnt,
                       size_t max);
/* A message that takes a credit may go now. */
bool hccl_rdma_can_send_data(const rdma_conn_t *rc);
void hccl_rdma_conn_init_framer(rdma_conn_t *rc);
/* Everything that may move after a completion or a post; a failure fails the connection. */
void hccl_rdma_conn_progress(rdma_conn_t *rc);
void hccl_rdma_complete(rdma_ctx_t *ctx, const struct ibv_wc *wc);
hcclResult_t hccl_rdma_protocol_error(rdma_conn_t *rc, const char *what);

/* rdma_zcopy.c: the zero-copy path (transfers of at least ctx->zcopy_min bytes). */
hcclResult_t hccl_rdma_zcopy_post_send(rdma_conn_t *rc, hccl_xfer_t *x);
hcclResult_t hccl_rdma_zcopy_post_recv(rdma_conn_t *rc, hccl_xfer_t *x);
/* A staged receive: fails if the peer announced a zero-copy send for it. */
hcclResult_t hccl_rdma_zcopy_check_staged_recv(rdma_conn_t *rc, const hccl_xfer_t *x);
/* Sends what credits allow (ready-to-sends, clear-to-sends, writes); checks the staged arrivals. */
hcclResult_t hccl_rdma_zcopy_progress(rdma_conn_t *rc);
hcclResult_t hccl_rdma_on_cts(rdma_conn_t *rc, const rdma_cts_t *cts);
hcclResult_t hccl_rdma_on_rts(rdma_conn_t *rc, const rdma_rts_t *rts);
/* The write with immediate id landed in our buffer. */
hcclResult_t hccl_rdma_on_write_imm(rdma_conn_t *rc, uint32_t id);
/* Our last write of the oldest zero-copy send completed. */
void hccl_rdma_on_write_done(rdma_conn_t *rc);
/* Fails (res) or, with res hcclSuccess at teardown, drops every zero-copy transfer and record. */
void hccl_rdma_zcopy_stop(rdma_conn_t *rc, hcclResult_t res);

/* rdma_ops.c: the link. */
void hccl_rdma_conn_fail(rdma_conn_t *rc, hcclResult_t res);

extern const hccl_link_ops_t hccl_link_rdma_ops;

#endif /* HCCL_LINK_RDMA_H */
