/* The lane: small and medium collectives through shared slots (lane.h): set-up, queue, progress. */
#include <stdio.h>
#include <string.h>

#include "links/link.h"
#include "sched/lane_impl.h"
#include "sched/sched.h"

/* Groups only where some CPU has two ranks and there are at least two CPUs. */
static hcclResult_t lane_set_groups(hccl_lane_t *lane, const int *group_of)
{
    int n = lane->nranks, ngroups = 0, at = 0;
    bool shared = false;

    for (int r = 0; r < n; r++) {
        if (group_of[r] < 0 || group_of[r] >= n)
            return hcclSuccess;
        if (group_of[r] + 1 > ngroups)
            ngroups = group_of[r] + 1;
    }
    for (int g = 0; g < ngroups; g++) {
        int r = 0;
        while (r < n && group_of[r] != g)
            r++;
        if (r == n)
            return hcclSuccess; /* numbered with a gap: not what comm.c makes; no groups */
    }
    lane->members = hccl_calloc((size_t)n, sizeof(int));
    lane->gfirst = hccl_calloc((size_t)ngroups + 1, sizeof(int));
    lane->piece = hccl_calloc((size_t)ngroups, sizeof(*lane->piece));
    if (!lane->members || !lane->gfirst || !lane->piece)
        return HCCL_FAIL(hcclSystemError, "lane: out of memory");
    for (int g = 0; g < ngroups; g++) {
        lane->gfirst[g] = at;
        for (int r = 0; r < n; r++) {
            if (group_of[r] != g)
                continue;
            if (r == lane->rank) {
                lane->group = g;
                lane->gindex = at - lane->gfirst[g];
            }
            lane->members[at++] = r;
        }
        shared = shared || at - lane->gfirst[g] > 1;
    }
    lane->gfirst[ngroups] = at;
    lane->ngroups = ngroups > 1 && shared ? ngroups : 0;
    return hcclSuccess;
}

hcclResult_t hccl_lane_create(const hccl_window_ops_t *win, void *wctx, int rank, int nranks,
                              const hccl_lane_limits_t *limits, hccl_lane_fatal_fn on_fatal,
                              void *fatal_arg, hccl_lane_t **lane_p)
{
    hccl_lane_t *lane = hccl_calloc(1, sizeof(*lane));
    hcclResult_t res;

    if (!lane)
        return HCCL_FAIL(hcclSystemError, "lane: out of memory");
    lane->win = win;
    lane->wctx = wctx;
    lane->rank = rank;
    lane->nranks = nranks;
    lane->limits = *limits;
    if (lane->limits.max_bytes > HCCL_WINDOW_CAP)
        lane->limits.max_bytes = HCCL_WINDOW_CAP;
    if (lane->limits.rooted_max > HCCL_WINDOW_CAP)
        lane->limits.rooted_max = HCCL_WINDOW_CAP;
    lane->limits.group_of = NULL;
    lane->failed = hcclSuccess;
    lane->on_fatal = on_fatal;
    lane->fatal_arg = fatal_arg;
    res = limits->group_of ? lane_set_groups(lane, limits->group_of) : hcclSuccess;
    if (res == hcclSuccess && rank == 0)
        res = hccl_lane_choice_create(lane); /* rank 0 chooses the ways (lane_choice.c) */
    if (res != hcclSuccess) {
        hccl_lane_destroy(lane);
        return res;
    }
    *lane_p = lane;
    return hcclSuccess;
}

void hccl_lane_destroy(hccl_lane_t *lane)
{
    if (!lane)
        return;
    hccl_free(lane->members);
    hccl_free(lane->gfirst);
    hccl_free(lane->piece);
    hccl_free(lane->choice);
    hccl_free(lane->tiles);
    hccl_free(lane);
}

size_t hccl_lane_call_bytes(int coll, size_t count, hcclDataType_t dtype, int nranks)
{
    size_t esz = hccl_dtype_size(dtype);

    switch (coll) {
    case HCCL_COLL_BARRIER:
        return 0;
    case HCCL_COLL_ALLREDUCE:
    case HCCL_COLL_REDUCE:
    case HCCL_COLL_BROADCAST:
    case HCCL_COLL_ALLGATHER:
        return count > SIZE_MAX / esz ? SIZE_MAX : count * esz;
    case HCCL_COLL_REDUCESCATTER:
    case HCCL_COLL_ALLTOALL:
        return count > SIZE_MAX / esz / (size_t)nranks ? SIZE_MAX : count * esz * (size_t)nranks;
    default:
        return SIZE_MAX;
    }
}

bool hccl_lane_in_pieces(const hccl_lane_t *lane, int coll)
{
    return lane && lane->limits.pieces_above != SIZE_MAX && coll == HCCL_COLL_ALLREDUCE;
}

bool hccl_lane_takes(const hccl_lane_t *lane, int coll, size_t bytes)
{
    if (!lane)
        return false;
    if (coll == HCCL_COLL_BARRIER)
        return true;
    if (hccl_lane_in_pieces(lane, coll) && bytes > lane->limits.pieces_above)
        return true;
    if (coll == HCCL_COLL_BROADCAST || coll == HCCL_COLL_REDUCE)
        return bytes > 0 && bytes >= lane->limits.rooted_min && bytes <= lane->limits.rooted_max;
    return bytes > 0 && bytes <= lane->limits.max_bytes;
}

bool hccl_lane_idle(const hccl_lane_t *lane)
{
    return lane->head == NULL;
}

int hccl_lane_groups(const hccl_lane_t *lane)
{
    return lane->ngroups;
}

size_t hccl_lane_reach(const hccl_lane_t *lane)
{
    return lane->limits.max_bytes > lane->limits.rooted_max ? lane->limits.max_bytes
                                                            : lane->limits.rooted_max;
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

    lane->halted = true;
    hccl_sig_describe(their_sig, theirs, sizeof(theirs));
    hccl_sig_describe(op->sig, ours, sizeof(ours));
    if (by_plan)
        snprintf(
            msg, sizeof(msg),
            "rank %d: collective mismatch at seq %llu: rank %d called %s (it sent "
            "a message of it), this rank %s (every rank must call the same collectives in the same "
            "order)",
            lane->rank, (unsigned long long)op->seq, peer, theirs, ours);
    else if (their_seq == op->seq)
        snprintf(msg, sizeof(msg),
                 "rank %d: collective mismatch at seq %llu: rank %d called %s, this rank "
                 "%s (every rank must call the same collectives in the same order)",
                 lane->rank, (unsigned long long)op->seq, peer, theirs, ours);
    else
        snprintf(msg, sizeof(msg),
                 "rank %d: collective mismatch at seq %llu: rank %d called %s as its seq "
                 "%llu, this rank %s (every rank must call the same collectives in the same order)",
                 lane->rank, (unsigned long long)op->seq, peer, theirs,
                 (unsigned long long)their_seq, ours);
    HCCL_WARN("%s", msg);
    lane->on_fatal(lane->fatal_arg, hcclInvalidUsage, msg);
}

static bool lane_moves(const hccl_lane_op_t *op)
{
    return op->coll == HCCL_COLL_ALLGATHER || op->coll == HCCL_COLL_ALLTOALL ||
           op->coll == HCCL_COLL_BROADCAST;
}

/*
 * Whether every peer published op's block; a peer that called something else is reported.
 * Peers are taken from the one after us, so that readers spread over the blocks, and blocks
 * that only move are copied out as they come: where ranks share cores, those that run read
 * each other's while the others wait for a turn.
 */
static bool lane_all_in(hccl_lane_t *lane, hccl_lane_op_t *op, hcclResult_t *res)
{
    for (; op->next_peer < lane->nranks - 1; op->next_peer++) {
        int r = (lane->rank + 1 + op->next_peer) % lane->nranks;
        uint64_t their_seq;
        uint32_t their_sig;
        if (!lane->win->published(lane->wctx, r, op->lseq, &their_seq, &their_sig)) {
            if (lane->win->holds(lane->wctx, r, op->seq, &their_sig))
                lane_mismatch(lane, op, r, true, op->seq, their_sig);
            return false;
        }
        if (their_sig != op->sig || their_seq != op->seq) {
            lane_mismatch(lane, op, r, false, their_seq, their_sig);
            return false;
        }
        if (lane_moves(op) && (*res = hccl_lane_move(lane, op, r)) != hcclSuccess)
            return false;
    }
    return true;
}

/* What one round of op starts from: nothing published or read yet. */
static void lane_round_init(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    op->published = false;
    op->next_peer = 0;
    op->part_done = false;
    op->next_part = 0;
    op->direct = false;
    op->reads_direct = false;
    op->part_copied = false;
    op->split = (op->coll == HCCL_COLL_ALLREDUCE || op->coll == HCCL_COLL_REDUCE) &&
                op->count * hccl_dtype_size(op->dtype) > lane->limits.flat_max;
    op->grouped = false; /* chosen as it is published */
    op->final_done = false;
    op->probe = false;
    op->timed = false;
}

/* op's call ends: its own buffers and count again, for whoever describes it. */
static void lane_done(hccl_lane_op_t *op, hcclResult_t res, const char *msg)
{
    op->sendbuf = op->call_sendbuf;
    op->recvbuf = op->call_recvbuf;
    op->count = op->call_count;
    op->done(op, res, msg);
}

/* Whether op's current round is its call's last (or only) piece. */
static bool lane_last_piece(const hccl_lane_op_t *op)
{
    return op->call_done + op->count >= op->call_count;
}

/* A call run in pieces whose current one is done: the next one becomes op's round. */
static bool lane_next_piece(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    size_t esz = hccl_dtype_size(op->dtype), piece = op->count, left;

    if (lane_last_piece(op))
        return false;
    op->call_done += piece;
    left = op->call_count - op->call_done;
    op->sendbuf = (const char *)op->sendbuf + piece * esz;
    op->recvbuf = (char *)op->recvbuf + piece * esz;
    op->count = left < piece ? left : piece;
    lane_round_init(lane, op);
    return true;
}

bool hccl_lane_poll(void *arg)
{
    hccl_lane_t *lane = arg;
    bool moved = false;
    hccl_lane_op_t *op;

    while ((op = lane->head) != NULL && !lane->halted) {
        if (!op->published) {
            hccl_lane_publish(lane, op);
            moved = true;
        }
        if (!op->part_done) {
            hcclResult_t res = hcclSuccess;
            if (!lane_all_in(lane, op, &res) && res == hcclSuccess)
                return moved;
            if (res == hcclSuccess)
                res = hccl_lane_reduce(lane, op);
            if (res != hcclSuccess) {
                lane->halted = true;
                lane->on_fatal(lane->fatal_arg, res, hccl_error_last());
                return true;
            }
            op->part_done = true;
            moved = true;
        }
        if (op->grouped && !op->final_done) {
            if (!hccl_lane_final(lane, op))
                return moved;
            op->final_done = true;
            moved = true;
        }
        /* Our reads of the blocks are done: the next operation publishes while we wait for the
         * peers' parts or releases. Its slot held the operation before this one, which every
         * peer is done reading: each published this one's block after its last read of that
         * one's blocks (here), and reads of that one's parts end before a peer's block of the
         * next one is out, which we wait for before we write our part there. A call in pieces
         * lets the next one go only in its last: every rank must number the rounds alike. */
        if (op->next && !op->next->published && lane_last_piece(op)) {
            hccl_lane_publish(lane, op->next);
            moved = true;
        }
        /* A split Reduce ends at the other ranks once their part is out; a rank that gathers
         * every part knows that every peer is done reading its block. */
        bool gathers = op->split && hccl_lane_takes_result(lane, op);
        if (op->direct && !gathers && !hccl_lane_released(lane, op))
            return moved;
        if (gathers && !hccl_lane_gather(lane, op))
            return moved;
        moved = true;
        if (lane_next_piece(lane, op))
            continue;
        lane_pop(lane);
        lane_done(op, hcclSuccess, NULL);
    }
    return moved;
}

void hccl_lane_enqueue(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    op->next = NULL;
    op->call_sendbuf = op->sendbuf;
    op->call_recvbuf = op->recvbuf;
    op->call_count = op->count;
    op->call_done = 0;
    /* Every rank cuts the call alike: the same pieces in the same rounds. */
    if (hccl_lane_in_pieces(lane, op->coll)) {
        size_t piece = lane->limits.max_bytes / hccl_dtype_size(op->dtype);
        if (op->count > piece)
            op->count = piece ? piece : 1;
    }
    lane_round_init(lane, op);
    op->sig = hccl_sig_make(op->coll, op->dtype, op->op, op->root, op->call_count);
    if (lane->failed != hcclSuccess) {
        lane_done(op, lane->failed, "the communicator had failed");
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

void hccl_lane_set_step_hook(hccl_lane_t *lane, hccl_lane_step_hook_t hook, void *arg)
{
    lane->step_hook = hook;
    lane->step_hook_arg = arg;
}

void hccl_lane_fail_all(hccl_lane_t *lane, hcclResult_t res, const char *msg)
{
    hccl_lane_op_t *op;

    lane->failed = res;
    while ((op = lane->head) != NULL) {
        lane_pop(lane);
        lane_done(op, res, msg);
    }
}

const hccl_lane_op_t *hccl_lane_first(const hccl_lane_t *lane)
{
    return lane->head;
}

/* Whether rank r is on our CPU (grouped operations). */
static bool lane_in_group(const hccl_lane_t *lane, int r)
{
    for (int i = lane->gfirst[lane->group]; i < lane->gfirst[lane->group + 1]; i++)
        if (lane->members[i] == r)
            return true;
    return false;
}

bool hccl_lane_waiting_for(const hccl_lane_t *lane, const hccl_lane_op_t *want, char *buf,
                           size_t len)
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
    for (int r = 0; r < lane->nranks && at + 16 < len; r++) {
        uint64_t their_seq;
        uint32_t their_sig;
        bool waiting;
        if (r == lane->rank)
            continue;
        if (!op->part_done)
            waiting = !lane->win->published(lane->wctx, r, op->lseq, &their_seq, &their_sig);
        else if (!op->grouped)
            waiting = !lane->win->raised(lane->wctx, r, HCCL_WINDOW_PART, op->lseq);
        else if (!op->final_done) /* the other CPUs' ranks whose sums are not in */
            waiting = !lane_in_group(lane, r) &&
                      !lane->win->raised(lane->wctx, r, HCCL_WINDOW_GPART, op->lseq);
        else /* the parts of our CPU's ranks */
            waiting = lane_in_group(lane, r) &&
                      !lane->win->raised(lane->wctx, r, HCCL_WINDOW_PART, op->lseq);
        if (waiting)
            at += (size_t)snprintf(buf + at, len - at, "%s%d", at ? ", " : "", r);
    }
    return true;
}
