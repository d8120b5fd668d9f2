/*
 * Plan generators, one per algorithm family, and the tuner that picks one.
 * A generator builds the plan of one rank for one call shape; it sends no
 * padding: blocks differ by at most one element when count does not divide.
 */
#ifndef HCCL_ALGOS_H
#define HCCL_ALGOS_H

#include "sched/lane.h"
#include "sched/sched.h"

typedef enum {
    HCCL_ALGO_AUTO = 0,
    HCCL_ALGO_RING,
    HCCL_ALGO_RECDBL,        /* recursive doubling (AllReduce, AllGather) */
    HCCL_ALGO_TREE,          /* binomial tree (Broadcast, Reduce) */
    HCCL_ALGO_CHAIN,         /* pipelined chain (Broadcast, Reduce) */
    HCCL_ALGO_SCATTER_ALLGATHER, /* van de Geijn Broadcast */
    HCCL_ALGO_BRUCK,         /* AllGather, AlltoAll */
    HCCL_ALGO_RECHALV,       /* recursive halving ReduceScatter */
    HCCL_ALGO_PAIRWISE,      /* AlltoAll(v) */
    HCCL_ALGO_DISSEMINATION, /* Barrier */
    HCCL_ALGO_HIER,          /* two-level: inside hosts, then among one leader per host */
    HCCL_ALGO_RABENSEIFNER,  /* AllReduce: recursive halving + recursive doubling */
    HCCL_ALGO_LANE,          /* no plan: the lane (sched/lane.h), over a link's window */
    HCCL_NUM_ALGOS
} hccl_algo_t;

const char *hccl_algo_name(hccl_algo_t algo);

/*
 * The shape of one call; what a plan is built for. count is per collective:
 * AllReduce, Broadcast, Reduce: the buffer; AllGather: sendcount (recv holds
 * nranks blocks); ReduceScatter: recvcount (send holds nranks blocks);
 * AlltoAll: the block per peer; Barrier: 0. Slots: Broadcast uses RECV only
 * (the one buffer); Reduce's RECV exists on the root only (0 bytes elsewhere).
 * AlltoAllv: v points at 4 arrays of nranks element counts, in order
 * sendcounts, sdispls, recvcounts, rdispls (borrowed, valid while building).
 */
typedef struct hccl_coll_shape {
    hccl_coll_t coll;
    size_t count;
    hcclDataType_t dtype;
    hcclRedOp_t op;
    int root;
    const size_t *v;
} hccl_coll_shape_t;

/* Ring AllReduce: reduce-scatter then all-gather, each block cut into chunk_bytes pieces. */
hcclResult_t hccl_algo_ring_allreduce(int rank, int nranks, const hccl_coll_shape_t *shape,
                                      size_t chunk_bytes, hccl_plan_t **plan_p);
/* Recursive doubling AllReduce, with the fold step for non-powers of two. */
hcclResult_t hccl_algo_recdbl_allreduce(int rank, int nranks, const hccl_coll_shape_t *shape,
                                        hccl_plan_t **plan_p);
/* Rabenseifner AllReduce: recursive-halving reduce-scatter, recursive-doubling all-gather. */
hcclResult_t hccl_algo_rabenseifner_allreduce(int rank, int nranks, const hccl_coll_shape_t *shape,
                                              size_t chunk_bytes, hccl_plan_t **plan_p);
/* Binomial-tree AllReduce: reduce to rank 0, broadcast from it, pipelined in chunks. */
hcclResult_t hccl_algo_tree_allreduce(int rank, int nranks, const hccl_coll_shape_t *shape,
                                      size_t chunk_bytes, hccl_plan_t **plan_p);

/*
 * Generators of the other collectives (one file per family). Each builds rank's plan for
 * shape; chunk_bytes is the pipelining granularity where the algorithm pipelines.
 */
hcclResult_t hccl_algo_tree_broadcast(int rank, int nranks, const hccl_coll_shape_t *shape,
                                      size_t chunk_bytes, hccl_plan_t **plan_p);
hcclResult_t hccl_algo_chain_broadcast(int rank, int nranks, const hccl_coll_shape_t *shape,
                                       size_t chunk_bytes, hccl_plan_t **plan_p);
hcclResult_t hccl_algo_scatter_allgather_broadcast(int rank, int nranks,
                                                   const hccl_coll_shape_t *shape,
                                                   size_t chunk_bytes, hccl_plan_t **plan_p);
hcclResult_t hccl_algo_tree_reduce(int rank, int nranks, const hccl_coll_shape_t *shape,
                                   size_t chunk_bytes, hccl_plan_t **plan_p);
hcclResult_t hccl_algo_chain_reduce(int rank, int nranks, const hccl_coll_shape_t *shape,
                                    size_t chunk_bytes, hccl_plan_t **plan_p);
hcclResult_t hccl_algo_ring_allgather(int rank, int nranks, const hccl_coll_shape_t *shape,
                                      size_t chunk_bytes, hccl_plan_t **plan_p);
hcclResult_t hccl_algo_recdbl_allgather(int rank, int nranks, const hccl_coll_shape_t *shape,
                                        size_t chunk_bytes, hccl_plan_t **plan_p);
hcclResult_t hccl_algo_bruck_allgather(int rank, int nranks, const hccl_coll_shape_t *shape,
                                       size_t chunk_bytes, hccl_plan_t **plan_p);
hcclResult_t hccl_algo_ring_reducescatter(int rank, int nranks, const hccl_coll_shape_t *shape,
                                          size_t chunk_bytes, hccl_plan_t **plan_p);
hcclResult_t hccl_algo_rechalv_reducescatter(int rank, int nranks, const hccl_coll_shape_t *shape,
                                             size_t chunk_bytes, hccl_plan_t **plan_p);
hcclResult_t hccl_algo_pairwise_alltoall(int rank, int nranks, const hccl_coll_shape_t *shape,
                                         size_t chunk_bytes, hccl_plan_t **plan_p);
hcclResult_t hccl_algo_bruck_alltoall(int rank, int nranks, const hccl_coll_shape_t *shape,
                                      size_t chunk_bytes, hccl_plan_t **plan_p);
hcclResult_t hccl_algo_pairwise_alltoallv(int rank, int nranks, const hccl_coll_shape_t *shape,
                                          size_t chunk_bytes, hccl_plan_t **plan_p);
hcclResult_t hccl_algo_dissemination_barrier(int rank, int nranks, const hccl_coll_shape_t *shape,
                                             size_t chunk_bytes, hccl_plan_t **plan_p);

/* Two-level AllReduce, Broadcast and AllGather; node_of[r] is rank r's host index. */
hcclResult_t hccl_algo_hier_allreduce(int rank, int nranks, const hccl_coll_shape_t *shape,
                                      const int *node_of, size_t chunk_bytes, hccl_plan_t **plan_p);
hcclResult_t hccl_algo_hier_broadcast(int rank, int nranks, const hccl_coll_shape_t *shape,
                                      const int *node_of, size_t chunk_bytes, hccl_plan_t **plan_p);
hcclResult_t hccl_algo_hier_allgather(int rank, int nranks, const hccl_coll_shape_t *shape,
                                      const int *node_of, size_t chunk_bytes, hccl_plan_t **plan_p);

/* Send (SEND slot) or receive (RECV slot) of count elements with peer shape->root, tag 0. */
hcclResult_t hccl_algo_p2p(int rank, int nranks, const hccl_coll_shape_t *shape, hccl_plan_t **plan_p);

/* Block b of n over count elements: [*first, *first + *len). */
void hccl_algo_block(size_t count, int n, int b, size_t *first, size_t *len);

/*
 * A few chunk-sized scratch slots used in turn, instead of a scratch as large as the
 * buffer: they stay in cache between the receive that fills one and the step that reads it,
 * and memory does not grow with the message. Every wait is on a step of an earlier chunk,
 * so a plan that takes its chunks in order cannot deadlock on them.
 */
#define HCCL_SLOTS 4
typedef struct {
    size_t base;                 /* scratch offset of slot 0 */
    size_t bytes;                /* of one slot */
    uint32_t last[HCCL_SLOTS];   /* the step that last used each slot, or UINT32_MAX */
    uint32_t next;
} hccl_slots_t;

static inline void hccl_slots_init(hccl_slots_t *s, size_t base, size_t slot_bytes)
{
    s->base = base;
    s->bytes = slot_bytes;
    s->next = 0;
    for (int i = 0; i < HCCL_SLOTS; i++)
        s->last[i] = UINT32_MAX;
}

/* The next slot, and where it is. */
static inline uint32_t hccl_slots_take(hccl_slots_t *s, hccl_bref_t *at)
{
    uint32_t k = s->next++ % HCCL_SLOTS;

    *at = hccl_bref(HCCL_SLOT_SCRATCH, s->base + k * s->bytes);
    return k;
}

/* The step that first writes slot k waits for the one that last used it. */
static inline hcclResult_t hccl_slots_fill(hccl_slots_t *s, hccl_plan_t *p, uint32_t k, uint32_t writer)
{
    return s->last[k] == UINT32_MAX ? hcclSuccess : hccl_plan_dep(p, s->last[k], writer);
}

static inline void hccl_slots_done(hccl_slots_t *s, uint32_t k, uint32_t last_user)
{
    s->last[k] = last_user;
}

/* ---- cost model (cost.c) ---- */

typedef enum { HCCL_COST_SHM = 0, HCCL_COST_TCP, HCCL_NUM_COST_CLASSES } hccl_cost_class_t;

typedef struct {
    double alpha_us;          /* per message */
    double beta_us_per_byte;  /* per byte on the wire */
    double gamma_us_per_byte; /* per byte reduced */
    bool cpus_shared;         /* ranks of some host take turns on its CPUs (see cost.c) */
    bool rings_wait_turns;    /* and over shm, where a ring's steps wait for them (cost.c) */
} hccl_cost_t;

hccl_cost_t hccl_cost_default(hccl_cost_class_t cls);
/* Estimated time (us) of algo for coll over bytes (shape->count * dtype size) on n ranks;
 * INFINITY where algo does not apply. */
double hccl_cost_estimate(const hccl_cost_t *c, hccl_coll_t coll, hccl_algo_t algo, size_t bytes,
                          int n, size_t chunk_bytes);

/* ---- tuner (tuner.c) ---- */

typedef struct hccl_tuner {
    hccl_algo_t forced[HCCL_NUM_COLLS]; /* HCCL_ALGO, AUTO = not forced */
    size_t chunk_bytes;                 /* pipelining granularity */
    hccl_cost_t model;                  /* of the slowest link class in the communicator */
    hccl_cost_class_t cls;
    const int *node_of;                 /* borrowed: every rank's host index, or NULL */
    bool multi_level;                   /* several hosts, every one with several ranks */
    const hccl_lane_t *lane;            /* borrowed: the communicator's lane, or NULL */
} hccl_tuner_t;

/*
 * Sets the model for the communicator's slowest link class; spec (HCCL_COST_MODEL,
 * "alpha_us,GB/s,reduce_GB/s", "" = the class's defaults) overrides it.
 */
void hccl_tuner_set_model(hccl_tuner_t *t, hccl_cost_class_t cls, const char *spec);
/* Gives the tuner the hosts of the ranks (borrowed; NULL: one level). */
void hccl_tuner_set_topology(hccl_tuner_t *t, const int *node_of, int nranks);

/* Parses HCCL_ALGO syntax ("ring", "allreduce=ring;..."); a bad entry warns and is ignored. */
void hccl_tuner_init(hccl_tuner_t *t, const char *algo_spec, size_t buffsize);
/*
 * The algorithm for a call: HCCL_ALGO_LANE where the communicator has a lane and it takes the
 * call (by its own limits, or up to its reach where HCCL_ALGO names "lane"), else a plan's
 * algorithm: the one HCCL_ALGO names, or the cheapest under the model. The same answer on
 * every rank.
 */
hccl_algo_t hccl_tuner_pick(const hccl_tuner_t *t, const hccl_coll_shape_t *shape, int nranks);
/* The plan's algorithm hccl_tuner_pick would take if the lane did not take the call. */
hccl_algo_t hccl_tuner_pick_plan(const hccl_tuner_t *t, const hccl_coll_shape_t *shape, int nranks);
/* Whether hccl_tuner_pick would return HCCL_ALGO_LANE, without pricing the plans (every call
 * asks this first; a plan's call then asks its plan cache, and the pick on a miss). */
bool hccl_tuner_picks_lane(const hccl_tuner_t *t, const hccl_coll_shape_t *shape, int nranks);
/* Whether coll has a generator for algo. */
bool hccl_algo_applies(hccl_coll_t coll, hccl_algo_t algo);
/* Builds the plan of algo for shape (not HCCL_ALGO_LANE, which runs without one). */
hcclResult_t hccl_algo_build(const hccl_tuner_t *t, hccl_algo_t algo, int rank, int nranks,
                             const hccl_coll_shape_t *shape, hccl_plan_t **plan_p);

#endif /* HCCL_ALGOS_H */
