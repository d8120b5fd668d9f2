/*
 * The lane: on a communicator whose ranks all share one host, an AllReduce of at most
 * HCCL_LANE_MAX bytes, or a Barrier, skips the plan. Every rank publishes its block in its
 * shm lane slot (links/link.h). Up to the flat limit, each rank then reads everyone's block
 * in place and reduces them all; above it the operation is split: rank r reduces the r-th
 * share of every block into its slot's part, and each rank copies every part. Either way
 * blocks are reduced in rank order, so that every rank gets the same bits. Lane operations
 * run one at a time in call order, apart from the plans (which never touch the slots); all
 * ranks make the same choices from the call and shared settings, so every exchange agrees.
 *
 * State is the reactor's: touched with its work held (the progress thread, a callback, or a
 * thread that drives it).
 */
#ifndef HCCL_LANE_H
#define HCCL_LANE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "reactor/reactor.h"

/* Above this an operation is split (measured at 2-8 ranks on 2 cores: flat wins below). */
#define HCCL_LANE_FLAT_MAX 8192

typedef struct hccl_lane hccl_lane_t;
typedef struct hccl_lane_op hccl_lane_op_t;

struct hccl_lane_op {
    hccl_lane_op_t *next;
    int coll;                   /* HCCL_COLL_ALLREDUCE or HCCL_COLL_BARRIER */
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    hcclDataType_t dtype;
    hcclRedOp_t op;
    uint64_t seq;               /* the communicator's sequence number */
    /* the lane's */
    uint32_t sig;               /* hccl_sig_make of the call, compared with every peer's */
    uint64_t lseq;
    bool published;
    int next_peer;              /* ranks below it have been seen to publish */
    bool split;                 /* reduce-scatter through the parts, then gather */
    bool part_done;             /* split: our part is published */
    int next_part;              /* split: parts below it are copied out */
    /* Runs once, with the reactor's work held: the op is off the lane and may be freed. */
    void (*done)(hccl_lane_op_t *op, hcclResult_t res, const char *msg);
    void *arg;
};

/*
 * A lane over shm_ctx (a one-host communicator's shm link) for blocks up to max_bytes, split
 * above flat_max bytes. When
 * ranks called different collectives (a peer's block says another call, or a peer sent a
 * plan's message for the call's sequence number), on_fatal(arg, hcclInvalidUsage, why) is
 * called once, and the communicator is expected to fail (hccl_lane_fail_all).
 */
typedef void (*hccl_lane_fatal_fn)(void *arg, hcclResult_t res, const char *msg);
hcclResult_t hccl_lane_create(void *shm_ctx, int rank, int nranks, size_t max_bytes, size_t flat_max,
                              hccl_lane_fatal_fn on_fatal, void *fatal_arg, hccl_lane_t **lane_p);
void hccl_lane_destroy(hccl_lane_t *lane);
/* Whether the lane takes this call: the same answer on every rank for the same call. */
bool hccl_lane_takes(const hccl_lane_t *lane, int coll, size_t bytes);
/* Queues op behind the lane's others and starts it if it is first. */
void hccl_lane_enqueue(hccl_lane_t *lane, hccl_lane_op_t *op);
/* Advances the lane (a reactor poller); true if anything moved. */
bool hccl_lane_poll(void *lane);
/* Whether no operation is queued. */
bool hccl_lane_idle(const hccl_lane_t *lane);
/* Puts op's copy in its place in the queue (a caller that stops driving its own op). */
void hccl_lane_replace(hccl_lane_t *lane, hccl_lane_op_t *op, hccl_lane_op_t *copy);
/* Ends every queued operation with res; the lane takes nothing afterwards. */
void hccl_lane_fail_all(hccl_lane_t *lane, hcclResult_t res, const char *msg);
/* The queue, oldest first (then op->next), for diagnostics. */
const hccl_lane_op_t *hccl_lane_first(const hccl_lane_t *lane);
/* Writes the ranks op still waits for ("1, 3"; "" while it is queued behind others); false
 * if op is not on the lane. */
bool hccl_lane_waiting_for(const hccl_lane_t *lane, const hccl_lane_op_t *op, char *buf, size_t len);

#endif /* HCCL_LANE_H */
