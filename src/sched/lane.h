/*
 * The lane: on a communicator whose ranks one link's window reaches (links/link.h, the window
 * capability: shm on one host, sim in tests), a collective whose block is at most
 * HCCL_LANE_MAX bytes skips the plan. Every rank publishes its block in its window slot, then
 * reads what it needs of everyone's in place: AllGather and AlltoAll copy, Broadcast copies
 * the root's, ReduceScatter reduces its share. AllReduce and Reduce reduce every block up to
 * the flat limit; above it they are split: rank r reduces the r-th share of every block into
 * its slot's part (and, where it takes the result, into recvbuf), and each rank (the root, for
 * Reduce) copies every other part. Where ranks are pinned to CPUs in groups, a split AllReduce
 * first sums each group's blocks share by share within the group, then adds the groups' sums
 * over each rank's share and gathers the shares within the group: what crosses between CPUs is
 * one sum per group. Blocks are reduced in a fixed order (rank order; grouped, rank order
 * within a group, then group order), so every rank gets the same bits. Lane operations run in
 * call order, one at a time but for the next one's publication once the current one has read
 * every block (hccl_lane_poll), apart from the plans (which never touch the slots); all ranks
 * make the same choices from the call and shared settings (and, for a split AllReduce's way,
 * from rank 0's word: hccl_lane_limits_t), so every exchange agrees. Where it is allowed, an
 * AllReduce above the largest block runs as one such operation per piece of it, in order.
 *
 * State is the reactor's: touched with its work held (the progress thread, a callback, or a
 * thread that drives it).
 */
#ifndef HCCL_LANE_H
#define HCCL_LANE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "links/link.h"
#include "reactor/reactor.h"

/* Above this an operation is split; below it the flat way is faster (docs/performance.md). */
#define HCCL_LANE_FLAT_MAX 8192

typedef struct hccl_lane hccl_lane_t;
typedef struct hccl_lane_op hccl_lane_op_t;

struct hccl_lane_op {
    hccl_lane_op_t *next;
    int coll;                   /* see hccl_lane_call_bytes */
    const void *sendbuf;
    void *recvbuf;
    size_t count;               /* as the API counts it (per rank for AllGather, ReduceScatter
                                   and AlltoAll) */
    hcclDataType_t dtype;
    hcclRedOp_t op;
    int root;                   /* Broadcast and Reduce */
    uint64_t seq;               /* the communicator's sequence number */
    /* the lane's */
    uint32_t sig;               /* hccl_sig_make of the call, compared with every peer's */
    uint64_t lseq;
    bool published;
    int next_peer;              /* ranks below it have been seen to publish */
    bool split;                 /* reduce-scatter through the parts, then gather */
    bool part_done;             /* split: our part is published (grouped: our group's sum) */
    bool grouped;               /* split AllReduce by CPU group (hccl_lane_limits_t.group_of) */
    bool final_done;            /* grouped: our share of the result is in our part */
    bool timed;                 /* a split AllReduce that may run grouped, or an AlltoAll
                                   whose block may go either way (direct_choice_min) */
    bool probe;                 /* rank 0: run the way not chosen, to time it */
    bool read_chosen;           /* timed AlltoAll: rank 0 has its blocks read single-copy
                                   below direct_min */
    int next_part;              /* split: parts below it are copied out; direct: peers below
                                   it have released our block */
    bool direct;                /* our block is read from sendbuf (hccl_window_ops_t.publish) */
    bool reads_direct;          /* a peer's block was: we release them through our part flag */
    bool part_copied;           /* split: our part was copied to recvbuf as it was reduced */
    /* The call's own buffers and count: an AllReduce above the lane's largest block runs in
     * rounds of pieces (hccl_lane_limits_t.pieces_above), sendbuf, recvbuf and count then being the
     * current piece's; done sees the call's again. */
    const void *call_sendbuf;
    void *call_recvbuf;
    size_t call_count;
    size_t call_done; /* elements of the call in the pieces before the current one */
    /* Runs once, with the reactor's work held: the op is off the lane and may be freed. */
    void (*done)(hccl_lane_op_t *op, hcclResult_t res, const char *msg);
    void *arg;
};

/* Which calls a lane takes, by their bytes (hccl_lane_call_bytes). */
typedef struct {
    size_t max_bytes;  /* the largest (at most HCCL_WINDOW_CAP) */
    size_t flat_max;   /* AllReduce and Reduce are split above it */
    /* Broadcast and Reduce from rooted_min to rooted_max bytes: below, plans let the other
     * ranks run ahead of the root, where the lane holds everyone to the slowest (that wins only
     * where every rank has a CPU); above max_bytes, the plans' eager messages are what the
     * receiver falls behind on (docs/performance.md). */
    size_t rooted_min;
    size_t rooted_max;
    /* AlltoAll blocks of at least direct_min bytes, and the blocks of reductions (a
     * ReduceScatter, a split AllReduce or Reduce) whose call has at least reduce_direct_min,
     * are read from the caller's buffer single-copy, where every rank can, instead of copied
     * through the slot. */
    size_t direct_min;
    size_t reduce_direct_min;
    /* Each rank's CPU group (0 .. groups - 1; NULL: none): ranks pinned to one CPU. A split
     * AllReduce then sums each group's blocks within the group first, so that one partial sum
     * per group crosses between CPUs instead of every rank's block (hccl_lane_create copies it). */
    const int *group_of;
    /* Grouped whenever there are groups (tests); otherwise rank 0 times both ways per size
     * class, the way that took less, trying the other now and then, and every rank follows
     * (a window word). */
    bool group_always;
    /* Rank 0's choice: the least time from a class's first operation to its first try of the
     * other way, and between tries (0: 50 ms; tests make it short). */
    int64_t choice_ns;
    /* AllReduces above this many bytes (SIZE_MAX: none) take the lane too, as rounds of pieces
     * of max_bytes; so does any above max_bytes where the lane is forced (HCCL_ALGO). */
    size_t pieces_above;
    /* AlltoAll blocks from this many bytes (0: none) up to direct_min go either way: rank 0
     * times the copy and, now and then, the single-copy read, and every rank follows the
     * faster (a window word, as for the grouped way). Which wins there depends on what a copy
     * between the cores costs on the machine (docs/performance.md). */
    size_t direct_choice_min;
} hccl_lane_limits_t;

/*
 * A lane over the window win of a link's context wctx, which reaches every rank. When ranks
 * called different collectives (a peer's block says another call, or a peer sent a plan's
 * message for the call's sequence number), on_fatal(arg, hcclInvalidUsage, why) is called
 * once, and the communicator is expected to fail (hccl_lane_fail_all).
 */
typedef void (*hccl_lane_fatal_fn)(void *arg, hcclResult_t res, const char *msg);
hcclResult_t hccl_lane_create(const hccl_window_ops_t *win, void *wctx, int rank, int nranks,
                              const hccl_lane_limits_t *limits, hccl_lane_fatal_fn on_fatal,
                              void *fatal_arg, hccl_lane_t **lane_p);
void hccl_lane_destroy(hccl_lane_t *lane);
/*
 * The bytes a call puts in its block (its root's, for Broadcast): the size the lane's limits
 * apply to. SIZE_MAX for what the lane does not run (AlltoAllv, Send, Recv).
 */
size_t hccl_lane_call_bytes(int coll, size_t count, hcclDataType_t dtype, int nranks);
/* Whether the lane takes a call of that many bytes: the same answer on every rank. */
bool hccl_lane_takes(const hccl_lane_t *lane, int coll, size_t bytes);
/* Whether the lane runs calls of coll above its largest block in pieces (limits.pieces_above). */
bool hccl_lane_in_pieces(const hccl_lane_t *lane, int coll);
/* Queues op behind the lane's others and starts it if it is first. */
void hccl_lane_enqueue(hccl_lane_t *lane, hccl_lane_op_t *op);
/* Advances the lane (a reactor poller); true if anything moved. */
bool hccl_lane_poll(void *lane);
/* Whether no operation is queued. */
bool hccl_lane_idle(const hccl_lane_t *lane);
/* How many CPU groups split AllReduces may run by (0: none; see hccl_lane_limits_t). */
int hccl_lane_groups(const hccl_lane_t *lane);
/* The largest block any call may put in a slot (at most HCCL_WINDOW_CAP). */
size_t hccl_lane_reach(const hccl_lane_t *lane);
/* Puts op's copy in its place in the queue (a caller that stops driving its own op). */
void hccl_lane_replace(hccl_lane_t *lane, hccl_lane_op_t *op, hccl_lane_op_t *copy);
/*
 * Runs before each operation is published, the lane's one step (index 0), on the thread that
 * publishes it: fault injection, as the executor's step hook is for plans (same signature as
 * hccl_exec_step_hook_t). NULL, the default, costs a branch per operation.
 */
typedef void (*hccl_lane_step_hook_t)(void *arg, uint64_t seq, uint32_t step);
void hccl_lane_set_step_hook(hccl_lane_t *lane, hccl_lane_step_hook_t hook, void *arg);
/* Ends every queued operation with res; the lane takes nothing afterwards. */
void hccl_lane_fail_all(hccl_lane_t *lane, hcclResult_t res, const char *msg);
/* The queue, oldest first (then op->next), for diagnostics. */
const hccl_lane_op_t *hccl_lane_first(const hccl_lane_t *lane);
/* Writes the ranks op still waits for ("1, 3"; "" while it is queued behind others); false
 * if op is not on the lane. */
bool hccl_lane_waiting_for(const hccl_lane_t *lane, const hccl_lane_op_t *op, char *buf, size_t len);

#endif /* HCCL_LANE_H */
