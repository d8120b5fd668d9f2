/*
 * Two ranks of the rdma link in one process over the verbs model (verbs_model.h), each with
 * its own reactor driven by the test; set-up runs a thread per rank (it blocks until both
 * sides meet). The wire moves only when the test pumps it (or at once in auto mode).
 */
#ifndef HCCL_TEST_RDMA_HARNESS_H
#define HCCL_TEST_RDMA_HARNESS_H

#include <pthread.h>

#include "links/link.h"
#include "links/rdma/rdma.h"
#include "verbs_model.h"

typedef struct {
    hccl_xfer_t x;      /* first: the callback casts back */
    int ndone;
    hcclResult_t res;
} xf_t;

typedef struct {
    hccl_reactor_t *r;
    hccl_link_env_t env;
    hccl_params_t params;
    void *ctx;
    hccl_conn_t *conns[2];
    hcclResult_t conn_res;
    char conn_msg[512];     /* the error of a failed connect */
    int fatal;
    char fatal_msg[512];
} rank_t;

typedef struct { xf_t *xf; int n; } xfs_t;

extern hccl_card_t cards[2];
extern rank_t ranks[2];
extern const hccl_link_ops_t *ops;
extern int64_t connect_deadline_ms;
extern uint32_t post_sig; /* the signature post() stamps (0: none, as point-to-point) */

/* Creates rank r's reactor and runs the link's init. */
hcclResult_t rank_init(int r);
/* Both ranks connect, each from its own thread (rank 0's calls are the failure victims). */
void connect_both(void);
/* Rank r connects from a new thread (join it). */
void connect_start(int r, pthread_t *t);
/* A fresh model (with ODP or not), both ranks initialised and connected. */
void world_up_with(bool odp);
void world_up(void);
/* Every verbs object released and no verbs rule broken. */
void assert_released(void);
/* Optionally a graceful shutdown, then fini; asserts everything was released. */
void world_down(bool graceful);
/* Moves the wire and runs the reactors until done(arg) or the step bound. */
bool drive_until(bool (*done)(void *), void *arg, bool drive1);
bool all_done(void *arg);    /* arg: xfs_t */
bool both_done(void *arg);   /* arg: xf_t[2] */
bool never(void *arg);
/* Posts a send or receive of rank r to the other rank (tag 1, or tag). */
void post(int r, bool send, xf_t *f, uint64_t seq, void *buf, size_t len);
void post_tag(int r, bool send, xf_t *f, uint64_t seq, uint32_t tag, void *buf, size_t len);
/* Sets both ranks' zero-copy threshold (tests use small buffers). */
void set_zcopy_min(size_t min);

#endif
