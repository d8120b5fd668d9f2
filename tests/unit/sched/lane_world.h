/*
 * The lane's tests with every rank in this process, over each link with the window capability:
 * test_lane and test_lane_ops run every case twice (lane_over_sim false, then true).
 *   shm: each rank's shm context is built by hand over an anonymous mapping that stands for its
 *        segment and that the others use as their peer's, so the lane's own code (slots, turns,
 *        rank-order reduction, queueing, failure) runs as between processes, driven round-robin;
 *   sim: the sim world's windows, driven only by their doorbells (a rank's lane runs when a
 *        peer published or raised a flag since it last ran), so a publication that forgets to
 *        ring leaves an operation unfinished and the test fails.
 */
#ifndef HCCL_TEST_LANE_WORLD_H
#define HCCL_TEST_LANE_WORLD_H

#include <stdbool.h>
#include <stddef.h>

#include "links/shm/shm.h"
#include "sched/lane.h"

#define MAXR 8

typedef struct {
    int n;
    hccl_link_env_t env[MAXR];
    shm_ctx_t ctx[MAXR];
    shm_conn_t conn[MAXR][MAXR];
    shm_conn_t *conns[MAXR][MAXR];
    int active[MAXR][MAXR];
    void *seg[MAXR];
    hccl_lane_t *lane[MAXR];
    char fatal[MAXR][512]; /* what on_fatal said, per rank */
    hccl_sim_world_t *sim; /* over sim: its windows, and wctx[r] is rank r's */
    const hccl_window_ops_t *win;
    void *wctx[MAXR];
} world_t;

extern bool lane_over_sim; /* which window the worlds made next run over */
/* The worlds made next take AllReduces above this many bytes in pieces (SIZE_MAX: none). */
extern size_t lane_world_pieces_above;
extern const hcclDataType_t lane_dtypes[10];
extern const hcclRedOp_t lane_ops[5];

/* A lane world's ranks and CPU groups, and whether split AllReduces run grouped on it. */
typedef struct {
    int n;
    int group_of[MAXR];
    bool grouped;
} layout_t;

typedef struct {
    hccl_lane_op_t op;
    int done;
    hcclResult_t res;
    char msg[256];
} test_op_t;

/* A world whose lanes split operations above flat_max bytes, in CPU groups group_of (or NULL);
 * always: grouped whenever there are groups. What on_fatal says lands in w->fatal[rank]. */
world_t *world_new_groups(int n, size_t max_bytes, size_t flat_max, const int *group_of,
                          bool always);
world_t *world_new_split(int n, size_t max_bytes, size_t flat_max);
world_t *world_new(int n, size_t max_bytes);
void world_free(world_t *w);
/* An operation whose completion is counted in t->done, with its result and message. */
void op_init(test_op_t *t, int coll, const void *sbuf, void *rbuf, size_t count, hcclDataType_t dt,
             hcclRedOp_t op);
/* The worlds' on_fatal: asserts hcclInvalidUsage and keeps the message in arg (w->fatal[r]). */
void lane_world_on_fatal(void *arg, hcclResult_t res, const char *msg);
/* Runs every rank's lane until nothing moves; returns the rounds that moved. */
int drive(world_t *w);
/* Enqueues every rank's t[r], rank 0 first (the others read the choice word rank 0 writes
 * publishing this operation) or last (the one it wrote at the class's previous one), drives
 * the lanes, and checks that every operation finished with hcclSuccess. */
void run_all(world_t *w, test_op_t *t, bool rank0_first);

#endif
