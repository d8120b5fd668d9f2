/*
 * The lane's state (lane.h), shared by the exchange (lane.c) and rank 0's choice of the way
 * a split AllReduce or an AlltoAll runs (lane_choice.c).
 */
#ifndef HCCL_LANE_IMPL_H
#define HCCL_LANE_IMPL_H

#include "links/link.h"
#include "sched/lane.h"

typedef struct lane_choice lane_choice_t;

typedef struct {
    bool timed, other, probe, warm; /* other: the way not taken by default (grouped; read
                                       single-copy); warm: past CHOICE_WARM_OPS */
    int coll;
    uint64_t lseq;
    size_t bytes;
    int64_t published_ns;
} lane_last_t;

struct hccl_lane {
    const hccl_window_ops_t *win; /* the window of a link that reaches every rank */
    void *wctx;                 /* borrowed: that link's context */
    int rank;
    int nranks;
    hccl_lane_limits_t limits;
    uint64_t next_lseq;         /* the next operation's turn; the same count on every rank */
    hccl_lane_op_t *head;       /* queue, oldest first; only the head and the one after it
                                   may have published */
    hccl_lane_op_t *tail;
    hcclResult_t failed;        /* hcclSuccess until the communicator fails */
    bool halted;                /* on_fatal was called: nothing moves until the failure comes */
    hccl_lane_fatal_fn on_fatal;
    void *fatal_arg;
    hccl_lane_step_hook_t step_hook; /* before each publication (fault injection) */
    void *step_hook_arg;
    /* CPU groups (limits.group_of): 0 groups where ranks are not grouped */
    int ngroups;
    int *members;               /* ranks by group, in rank order within each */
    int *gfirst;                /* [ngroups + 1]: group k is members[gfirst[k] .. gfirst[k + 1]) */
    int group, gindex;          /* ours, and our place in it */
    const char **piece;         /* [ngroups]: scratch of lane_pieces */
    lane_choice_t *choice;      /* rank 0: [HCCL_WINDOW_WORDS] (lane_choice.c) */
    lane_last_t last;           /* rank 0: the operation it published last */
    char *tiles;                /* two tiles of blocks read single-copy (lane_data.c), once
                                   needed */
};

/* An AllReduce or Reduce: whether this rank takes the result (all of them; a Reduce's root). */
static inline bool hccl_lane_takes_result(const hccl_lane_t *lane, const hccl_lane_op_t *op)
{
    return op->coll == HCCL_COLL_ALLREDUCE || lane->rank == op->root;
}

/* Rank 0's figures, one per size class and kind (lane_choice.c). */
hcclResult_t hccl_lane_choice_create(hccl_lane_t *lane);
/* As op is published (its lseq set): whether a split AllReduce runs grouped and whether an
 * AlltoAll below direct_min is read single-copy, and rank 0's timing of it. */
void hccl_lane_choose_way(hccl_lane_t *lane, hccl_lane_op_t *op, size_t bytes);

/* The data paths (lane_data.c), in the order an operation takes them. */
void hccl_lane_publish(hccl_lane_t *lane, hccl_lane_op_t *op);
/* A block that only moves: rank r's (ours too) to its place in recvbuf. */
hcclResult_t hccl_lane_move(hccl_lane_t *lane, hccl_lane_op_t *op, int r);
/* Every block is in: a flat operation's result, or a split one's part (published). */
hcclResult_t hccl_lane_reduce(hccl_lane_t *lane, hccl_lane_op_t *op);
/*
 * A grouped AllReduce: once every group's sum over our share is in, their total is our part
 * (straight into recvbuf where we are alone in our group: nobody gathers it). False until then.
 */
bool hccl_lane_final(hccl_lane_t *lane, hccl_lane_op_t *op);
/* Our block went direct: whether every peer has said it is done reading it. */
bool hccl_lane_released(hccl_lane_t *lane, hccl_lane_op_t *op);
/* A split operation: copies out the parts published so far; true once all are. */
bool hccl_lane_gather(hccl_lane_t *lane, hccl_lane_op_t *op);

#endif
