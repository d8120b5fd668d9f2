/* The small-collective lane (lane.h). */
#include <stdio.h>
#include <string.h>

#include "algos/algos.h"
#include "links/link.h"
#include "sched/lane.h"
#include "sched/sched.h"

struct hccl_lane {
    void *shm;                  /* borrowed: the shm link's context */
    int rank;
    int nranks;
    size_t max_bytes;
    uint64_t next_lseq;         /* the next operation's turn; the same count on every rank */
    hccl_lane_op_t *head;       /* queue, oldest first; only the head has published */
    hccl_lane_op_t *tail;
    hcclResult_t failed;        /* hcclSuccess until the communicator fails */
    bool mismatched;            /* on_fatal was called: nothing moves until the failure comes */
    hccl_lane_fatal_fn on_fatal;
    void *fatal_arg;
};

hcclResult_t hccl_lane_create(void *shm_ctx, int rank, int nranks, size_t max_bytes,
                              hccl_lane_fatal_fn on_fatal, void *fatal_arg, hccl_lane_t **lane_p)
{
    hccl_lane_t *lane = hccl_calloc(1, sizeof(*lane));

    if (!lane)
        return HCCL_FAIL(hcclSystemError, "lane: out of memory");
    lane->shm = shm_ctx;
    lane->rank = rank;
    lane->nranks = nranks;
    lane->max_bytes = max_bytes < HCCL_LANE_CAP ? max_bytes : HCCL_LANE_CAP;
    lane->failed = hcclSuccess;
    lane->on_fatal = on_fatal;
    lane->fatal_arg = fatal_arg;
    *lane_p = lane;
    return hcclSuccess;
}

void hccl_lane_destroy(hccl_lane_t *lane)
{
    hccl_free(lane);
}

bool hccl_lane_takes(const hccl_lane_t *lane, int coll, size_t bytes)
{
    if (!lane)
        return false;
    if (coll == HCCL_COLL_BARRIER)
        return true;
    return coll == HCCL_COLL_ALLREDUCE && bytes > 0 && bytes <= lane->max_bytes;
}

bool hccl_lane_idle(const hccl_lane_t *lane)
{
    return lane->head == NULL;
}

static size_t op_bytes(const hccl_lane_op_t *op)
{
    return op->coll == HCCL_COLL_ALLREDUCE ? op->count * hccl_dtype_size(op->dtype) : 0;
}

static void lane_publish(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    op->lseq = lane->next_lseq++;
    if (op_bytes(op))
        memcpy(hccl_shm_lane_block(lane->shm, lane->rank, op->lseq), op->sendbuf, op_bytes(op));
    hccl_shm_lane_publish(lane->shm, op->lseq, op->seq, op->sig);
    op->published = true;
}

/* Every block is in: the result, in rank order on every rank so that all get the same bits. */
static void lane_finish(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    if (op->coll == HCCL_COLL_ALLREDUCE) {
        void *dst = op->recvbuf;
        hccl_reduce(dst, hccl_shm_lane_block(lane->shm, 0, op->lseq),
                    hccl_shm_lane_block(lane->shm, 1, op->lseq), op->count, op->dtype, op->op);
        for (int r = 2; r < lane->nranks; r++)
            hccl_reduce(dst, dst, hccl_shm_lane_block(lane->shm, r, op->lseq), op->count, op->dtype, op->op);
        if (op->op == hcclAvg)
            hccl_reduce_div(dst, op->count, op->dtype, lane->nranks);
    }
}

static void lane_pop(hccl_lane_t *lane)
{
    lane->head = lane->head->next;
    if (!lane->head)
        lane->tail = NULL;
}

/* Ranks called different collectives: the communicator is told, once. */
static void lane_mismatch(hccl_lane_t *lane, const hccl_lane_op_t *op, int peer, bool by_plan,
                          uint64_t their_seq, uint32_t their_sig)
{
    char theirs[160], ours[160], msg[512];

    lane->mismatched = true;
    hccl_sig_describe(their_sig, theirs, sizeof(theirs));
    hccl_sig_describe(op->sig, ours, sizeof(ours));
    if (by_plan)
        snprintf(msg, sizeof(msg), "rank %d: collective mismatch at seq %llu: rank %d called %s (it sent "
                 "a message of it), this rank %s (every rank must call the same collectives in the same "
                 "order)", lane->rank, (unsigned long long)op->seq, peer, theirs, ours);
    else if (their_seq == op->seq)
        snprintf(msg, sizeof(msg), "rank %d: collective mismatch at seq %llu: rank %d called %s, this rank "
                 "%s (every rank must call the same collectives in the same order)", lane->rank,
                 (unsigned long long)op->seq, peer, theirs, ours);
    else
        snprintf(msg, sizeof(msg), "rank %d: collective mismatch at seq %llu: rank %d called %s as its seq "
                 "%llu, this rank %s (every rank must call the same collectives in the same order)",
                 lane->rank, (unsigned long long)op->seq, peer, theirs, (unsigned long long)their_seq, ours);
    HCCL_WARN("%s", msg);
    lane->on_fatal(lane->fatal_arg, hcclInvalidUsage, msg);
}

/* Whether every peer published op's block; a peer that called something else is reported. */
static bool lane_all_in(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    for (; op->next_peer < lane->nranks; op->next_peer++) {
        int r = op->next_peer;
        uint64_t their_seq;
        uint32_t their_sig;
        if (r == lane->rank)
            continue;
        if (!hccl_shm_lane_published(lane->shm, r, op->lseq, &their_seq, &their_sig)) {
            if (hccl_shm_lane_plan_sent(lane->shm, r, op->seq, &their_sig))
                lane_mismatch(lane, op, r, true, op->seq, their_sig);
            return false;
        }
        if (their_sig != op->sig || their_seq != op->seq) {
            lane_mismatch(lane, op, r, false, their_seq, their_sig);
            return false;
        }
    }
    return true;
}

bool hccl_lane_poll(void *arg)
{
    hccl_lane_t *lane = arg;
    bool moved = false;
    hccl_lane_op_t *op;

    while ((op = lane->head) != NULL && !lane->mismatched) {
        if (!op->published) {
            lane_publish(lane, op);
            moved = true;
        }
        if (!lane_all_in(lane, op))
            return moved;
        lane_finish(lane, op);
        lane_pop(lane);
        op->done(op, hcclSuccess, NULL);
        moved = true;
    }
    return moved;
}

void hccl_lane_enqueue(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    op->next = NULL;
    op->published = false;
    op->next_peer = 0;
    op->sig = hccl_sig_make(op->coll, op->dtype, op->op, -1, op->count);
    if (lane->failed != hcclSuccess) {
        op->done(op, lane->failed, "the communicator had failed");
        return;
    }
    if (lane->tail)
        lane->tail->next = op;
    else
        lane->head = op;
    lane->tail = op;
    if (lane->head == op)
        hccl_lane_poll(lane);
}

void hccl_lane_replace(hccl_lane_t *lane, hccl_lane_op_t *op, hccl_lane_op_t *copy)
{
    hccl_lane_op_t **at = &lane->head;

    while (*at && *at != op)
        at = &(*at)->next;
    if (!*at)
        return;
    *copy = *op;
    *at = copy;
    if (lane->tail == op)
        lane->tail = copy;
}

void hccl_lane_fail_all(hccl_lane_t *lane, hcclResult_t res, const char *msg)
{
    hccl_lane_op_t *op;

    lane->failed = res;
    while ((op = lane->head) != NULL) {
        lane_pop(lane);
        op->done(op, res, msg);
    }
}

const hccl_lane_op_t *hccl_lane_first(const hccl_lane_t *lane)
{
    return lane->head;
}

bool hccl_lane_waiting_for(const hccl_lane_t *lane, const hccl_lane_op_t *want, char *buf, size_t len)
{
    const hccl_lane_op_t *op = lane->head;
    size_t at = 0;

    while (op && op != want)
        op = op->next;
    if (!op)
        return false;
    buf[0] = '\0';
    if (op != lane->head)
        return true;
    for (int r = op->next_peer; r < lane->nranks && at + 16 < len; r++) {
        uint64_t their_seq;
        uint32_t their_sig;
        if (r != lane->rank && !hccl_shm_lane_published(lane->shm, r, op->lseq, &their_seq, &their_sig))
            at += (size_t)snprintf(buf + at, len - at, "%s%d", at ? ", " : "", r);
    }
    return true;
}
