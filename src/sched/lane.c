/* The lane: small and medium collectives through shared slots (lane.h). */
#include <stdio.h>
#include <string.h>

#include "algos/algos.h"
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
    if (lane->ngroups && lane->rank == 0 && !lane->limits.group_always)
        return hccl_lane_choice_create(lane);
    return hcclSuccess;
}

hcclResult_t hccl_lane_create(void *shm_ctx, int rank, int nranks, const hccl_lane_limits_t *limits,
                              hccl_lane_fatal_fn on_fatal, void *fatal_arg, hccl_lane_t **lane_p)
{
    hccl_lane_t *lane = hccl_calloc(1, sizeof(*lane));

    if (!lane)
        return HCCL_FAIL(hcclSystemError, "lane: out of memory");
    lane->shm = shm_ctx;
    lane->rank = rank;
    lane->nranks = nranks;
    lane->limits = *limits;
    if (lane->limits.max_bytes > HCCL_LANE_CAP)
        lane->limits.max_bytes = HCCL_LANE_CAP;
    if (lane->limits.rooted_max > HCCL_LANE_CAP)
        lane->limits.rooted_max = HCCL_LANE_CAP;
    lane->limits.group_of = NULL;
    lane->failed = hcclSuccess;
    lane->on_fatal = on_fatal;
    lane->fatal_arg = fatal_arg;
    if (limits->group_of) {
        hcclResult_t res = lane_set_groups(lane, limits->group_of);
        if (res != hcclSuccess) {
            hccl_lane_destroy(lane);
            return res;
        }
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

bool hccl_lane_takes(const hccl_lane_t *lane, int coll, size_t bytes)
{
    if (!lane)
        return false;
    if (coll == HCCL_COLL_BARRIER)
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

/* What this rank puts in its block. */
static size_t op_block_bytes(const hccl_lane_t *lane, const hccl_lane_op_t *op)
{
    if (op->coll == HCCL_COLL_BROADCAST && op->root != lane->rank)
        return 0;
    return hccl_lane_call_bytes(op->coll, op->count, op->dtype, lane->nranks);
}

/*
 * Whether our block is read from sendbuf itself, single-copy, instead of copied into the slot:
 * an AlltoAll large enough (see direct_min) that does not write what peers read (in place).
 * Each rank decides for its own block; readers take each block as it was published.
 */
static bool lane_goes_direct(hccl_lane_t *lane, const hccl_lane_op_t *op, size_t bytes)
{
    const char *s = op->sendbuf, *r = op->recvbuf;

    if (op->coll != HCCL_COLL_ALLTOALL || bytes < lane->limits.direct_min || (s < r + bytes && r < s + bytes))
        return false;
    return hccl_shm_lane_direct_ok(lane->shm);
}

static void lane_share(size_t count, int nranks, int r, size_t *first, size_t *n);

static int group_size(const hccl_lane_t *lane, int g)
{
    return lane->gfirst[g + 1] - lane->gfirst[g];
}

/* The elements a split operation has us reduce: our share of all ranks, or of our group. */
static void lane_own_share(const hccl_lane_t *lane, const hccl_lane_op_t *op, size_t *first, size_t *n)
{
    if (op->grouped)
        lane_share(op->count, group_size(lane, lane->group), lane->gindex, first, n);
    else
        lane_share(op->count, lane->nranks, lane->rank, first, n);
}

static void lane_publish(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    size_t bytes = op_block_bytes(lane, op);
    char *block;

    op->lseq = lane->next_lseq++;
    hccl_lane_choose_way(lane, op, bytes);
    op->direct = bytes && lane_goes_direct(lane, op, bytes);
    block = hccl_shm_lane_block(lane->shm, lane->rank, op->lseq);
    if (op->split) {
        /* Our own share of a split operation is read by us alone, from sendbuf. */
        size_t esz = hccl_dtype_size(op->dtype), first, n;
        lane_own_share(lane, op, &first, &n);
        memcpy(block, op->sendbuf, first * esz);
        memcpy(block + (first + n) * esz, (const char *)op->sendbuf + (first + n) * esz, bytes - (first + n) * esz);
    } else if (bytes && !op->direct) {
        memcpy(block, op->sendbuf, bytes);
    }
    hccl_shm_lane_publish(lane->shm, op->lseq, op->seq, op->sig, op->direct ? op->sendbuf : NULL);
    op->published = true;
}

/* Copies cb bytes at off of rank r's block to dst; our own comes from sendbuf. */
static hcclResult_t lane_copy(hccl_lane_t *lane, hccl_lane_op_t *op, int r, size_t off, void *dst, size_t cb)
{
    const char *mine = (const char *)op->sendbuf + off;

    if (r == lane->rank) {
        if (dst != mine)
            memcpy(dst, mine, cb);
        return hcclSuccess;
    }
    if (hccl_shm_lane_is_direct(lane->shm, r, op->lseq))
        op->reads_direct = true;
    return hccl_shm_lane_read(lane->shm, r, op->lseq, off, dst, cb);
}

/* Elements [*first, *first + *n) of count: share r of nranks (the remainder one each to the first). */
static void lane_share(size_t count, int nranks, int r, size_t *first, size_t *n)
{
    size_t base = count / (size_t)nranks, rem = count % (size_t)nranks;

    *first = (size_t)r * base + ((size_t)r < rem ? (size_t)r : rem);
    *n = base + ((size_t)r < rem);
}

/* Rank r's block: ours of a split operation is sendbuf (lane_publish). */
static const char *lane_block_of(hccl_lane_t *lane, hccl_lane_op_t *op, int r)
{
    return op->split && r == lane->rank ? op->sendbuf : hccl_shm_lane_block(lane->shm, r, op->lseq);
}

/* dst = op over every rank's block at byte offset off, for n elements, in rank order. */
static void lane_reduce_all(hccl_lane_t *lane, hccl_lane_op_t *op, void *dst, size_t off, size_t n)
{
    const char *b0 = lane_block_of(lane, op, 0), *b1 = lane_block_of(lane, op, 1);

    hccl_reduce(dst, b0 + off, b1 + off, n, op->dtype, op->op);
    for (int r = 2; r < lane->nranks; r++)
        hccl_reduce(dst, dst, lane_block_of(lane, op, r) + off, n, op->dtype, op->op);
    if (op->op == hcclAvg)
        hccl_reduce_div(dst, n, op->dtype, lane->nranks);
}

/* A block that only moves: rank r's (ours too) to its place in recvbuf. */
static hcclResult_t lane_move(hccl_lane_t *lane, hccl_lane_op_t *op, int r)
{
    size_t cb = op->count * hccl_dtype_size(op->dtype);
    char *dst = (char *)op->recvbuf + (size_t)r * cb;

    switch (op->coll) {
    case HCCL_COLL_BROADCAST:
        return r == op->root && r != lane->rank ? lane_copy(lane, op, r, 0, op->recvbuf, cb) : hcclSuccess;
    case HCCL_COLL_ALLGATHER:
        return lane_copy(lane, op, r, 0, dst, cb);
    default:
        return lane_copy(lane, op, r, (size_t)lane->rank * cb, dst, cb);
    }
}

static void lane_group_sum(hccl_lane_t *lane, hccl_lane_op_t *op);

/* Every block is in: a flat operation's result, or a split one's part (published). */
static hcclResult_t lane_reduce(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    size_t esz = hccl_dtype_size(op->dtype), cb = op->count * esz, first, n;
    void *part;

    switch (op->coll) {
    case HCCL_COLL_BROADCAST:
    case HCCL_COLL_ALLGATHER:
    case HCCL_COLL_ALLTOALL: {
        /* The peers' blocks are in recvbuf already (lane_all_in); then those read from their
         * owners' memory are released. */
        hcclResult_t res = lane_move(lane, op, lane->rank);
        if (res == hcclSuccess && op->reads_direct)
            hccl_shm_lane_publish_part(lane->shm, op->lseq);
        return res;
    }
    case HCCL_COLL_REDUCESCATTER:
        lane_reduce_all(lane, op, op->recvbuf, (size_t)lane->rank * cb, op->count);
        return hcclSuccess;
    case HCCL_COLL_ALLREDUCE:
    case HCCL_COLL_REDUCE:
        break;
    default:
        return hcclSuccess;
    }
    if (!op->split) {
        if (op->coll == HCCL_COLL_ALLREDUCE || lane->rank == op->root)
            lane_reduce_all(lane, op, op->recvbuf, 0, op->count);
        return hcclSuccess;
    }
    if (op->grouped) {
        lane_group_sum(lane, op);
        return hcclSuccess;
    }
    lane_share(op->count, lane->nranks, lane->rank, &first, &n);
    part = hccl_shm_lane_part(lane->shm, lane->rank, op->lseq);
    if (n)
        lane_reduce_all(lane, op, part, first * esz, n);
    hccl_shm_lane_publish_part(lane->shm, op->lseq);
    return hcclSuccess;
}

/* Which share of count split g ways holds element i (lane_share's inverse). */
static int share_of(size_t count, int g, size_t i)
{
    size_t base = count / (size_t)g, rem = count % (size_t)g;

    return i < rem * (base + 1) ? (int)(i / (base + 1)) : (int)(rem + (i - rem * (base + 1)) / base);
}

/*
 * A grouped AllReduce, once our group's blocks are in: their sum over our share goes to our
 * block in place of our own elements, which no peer reads (lane_publish left them out).
 */
static void lane_group_sum(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    size_t esz = hccl_dtype_size(op->dtype), first, n;
    const int *m = lane->members + lane->gfirst[lane->group];
    int g = group_size(lane, lane->group);
    char *dst = (char *)hccl_shm_lane_block(lane->shm, lane->rank, op->lseq);

    lane_own_share(lane, op, &first, &n);
    dst += first * esz;
    if (n && g == 1) {
        memcpy(dst, (const char *)op->sendbuf + first * esz, n * esz);
    } else if (n) {
        hccl_reduce(dst, lane_block_of(lane, op, m[0]) + first * esz, lane_block_of(lane, op, m[1]) + first * esz,
                    n, op->dtype, op->op);
        for (int i = 2; i < g; i++)
            hccl_reduce(dst, dst, lane_block_of(lane, op, m[i]) + first * esz, n, op->dtype, op->op);
    }
    hccl_shm_lane_publish_gpart(lane->shm, op->lseq);
}

/*
 * Calls fn(lane, op, piece, from, len, arg) over our share in pieces, where piece[k] is group
 * k's sum of elements [from, from + len): each piece lies within one member's share in every
 * group. Stops at the first fn that returns false; true if none did.
 */
typedef bool (*piece_fn)(hccl_lane_t *lane, hccl_lane_op_t *op, const char *const *piece, size_t from,
                         size_t len, void *arg);

static bool lane_pieces(hccl_lane_t *lane, hccl_lane_op_t *op, piece_fn fn, void *arg)
{
    size_t esz = hccl_dtype_size(op->dtype), first, n, at;
    const char **piece = lane->piece;

    lane_own_share(lane, op, &first, &n);
    for (at = first; at < first + n;) {
        size_t end = first + n;
        for (int k = 0; k < lane->ngroups; k++) {
            int g = group_size(lane, k), i = share_of(op->count, g, at), r = lane->members[lane->gfirst[k] + i];
            size_t f, c;
            lane_share(op->count, g, i, &f, &c);
            if (f + c < end)
                end = f + c;
            piece[k] = (const char *)hccl_shm_lane_block(lane->shm, r, op->lseq) + at * esz;
            if (r != lane->rank && !hccl_shm_lane_gpart_published(lane->shm, r, op->lseq))
                piece[k] = NULL;
        }
        if (!fn(lane, op, piece, at, end - at, arg))
            return false;
        at = end;
    }
    return true;
}

static bool piece_ready(hccl_lane_t *lane, hccl_lane_op_t *op, const char *const *piece, size_t from, size_t len,
                        void *arg)
{
    (void)op, (void)from, (void)len, (void)arg;
    for (int k = 0; k < lane->ngroups; k++)
        if (!piece[k])
            return false;
    return true;
}

/* Adds the groups' sums of a piece, in group order, into our share of the result (arg). */
static bool piece_sum(hccl_lane_t *lane, hccl_lane_op_t *op, const char *const *piece, size_t from, size_t len,
                      void *arg)
{
    size_t first, n;
    char *dst;

    lane_own_share(lane, op, &first, &n);
    dst = (char *)arg + (from - first) * hccl_dtype_size(op->dtype);
    hccl_reduce(dst, piece[0], piece[1], len, op->dtype, op->op);
    for (int k = 2; k < lane->ngroups; k++)
        hccl_reduce(dst, dst, piece[k], len, op->dtype, op->op);
    return true;
}

/*
 * A grouped AllReduce: once every group's sum over our share is in, their total is our part
 * (straight into recvbuf where we are alone in our group: nobody gathers it). False until then.
 */
static bool lane_final(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    size_t esz = hccl_dtype_size(op->dtype), first, n;
    char *dst;

    if (!lane_pieces(lane, op, piece_ready, NULL))
        return false;
    lane_own_share(lane, op, &first, &n);
    dst = group_size(lane, lane->group) == 1 ? (char *)op->recvbuf + first * esz
                                             : (char *)hccl_shm_lane_part(lane->shm, lane->rank, op->lseq);
    lane_pieces(lane, op, piece_sum, dst);
    if (op->op == hcclAvg && n)
        hccl_reduce_div(dst, n, op->dtype, lane->nranks);
    hccl_shm_lane_publish_part(lane->shm, op->lseq);
    return true;
}

/* Our block went direct: whether every peer has said it is done reading it. */
static bool lane_released(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    for (; op->next_part < lane->nranks; op->next_part++)
        if (op->next_part != lane->rank && !hccl_shm_lane_part_published(lane->shm, op->next_part, op->lseq))
            return false;
    return true;
}

/* A split operation: copies out the parts published so far; true once all are. */
static bool lane_gather(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    size_t esz = hccl_dtype_size(op->dtype), first, n;
    /* Grouped: the parts of our group (ours went to recvbuf where we are alone in it). */
    int g = op->grouped ? group_size(lane, lane->group) : lane->nranks;
    const int *m = op->grouped ? lane->members + lane->gfirst[lane->group] : NULL;

    for (; g > 1 && op->next_part < g; op->next_part++) {
        int r = m ? m[op->next_part] : op->next_part;
        if (r != lane->rank && !hccl_shm_lane_part_published(lane->shm, r, op->lseq))
            return false;
        lane_share(op->count, g, op->next_part, &first, &n);
        memcpy((char *)op->recvbuf + first * esz, hccl_shm_lane_part(lane->shm, r, op->lseq), n * esz);
    }
    return true;
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

static bool lane_moves(const hccl_lane_op_t *op)
{
    return op->coll == HCCL_COLL_ALLGATHER || op->coll == HCCL_COLL_ALLTOALL || op->coll == HCCL_COLL_BROADCAST;
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
        if (!hccl_shm_lane_published(lane->shm, r, op->lseq, &their_seq, &their_sig)) {
            if (hccl_shm_lane_plan_sent(lane->shm, r, op->seq, &their_sig))
                lane_mismatch(lane, op, r, true, op->seq, their_sig);
            return false;
        }
        if (their_sig != op->sig || their_seq != op->seq) {
            lane_mismatch(lane, op, r, false, their_seq, their_sig);
            return false;
        }
        if (lane_moves(op) && (*res = lane_move(lane, op, r)) != hcclSuccess)
            return false;
    }
    return true;
}

bool hccl_lane_poll(void *arg)
{
    hccl_lane_t *lane = arg;
    bool moved = false;
    hccl_lane_op_t *op;

    while ((op = lane->head) != NULL && !lane->halted) {
        if (!op->published) {
            lane_publish(lane, op);
            moved = true;
        }
        if (!op->part_done) {
            hcclResult_t res = hcclSuccess;
            if (!lane_all_in(lane, op, &res) && res == hcclSuccess)
                return moved;
            if (res == hcclSuccess)
                res = lane_reduce(lane, op);
            if (res != hcclSuccess) {
                lane->halted = true;
                lane->on_fatal(lane->fatal_arg, res, hccl_error_last());
                return true;
            }
            op->part_done = true;
            moved = true;
        }
        if (op->grouped && !op->final_done) {
            if (!lane_final(lane, op))
                return moved;
            op->final_done = true;
            moved = true;
        }
        /* Our reads of the blocks are done: the next operation publishes while we wait for the
         * peers' parts or releases. Its slot held the operation before this one, which every
         * peer is done reading: each published this one's block after its last read of that
         * one's blocks (here), and reads of that one's parts end before a peer's block of the
         * next one is out, which we wait for before we write our part there. */
        if (op->next && !op->next->published) {
            lane_publish(lane, op->next);
            moved = true;
        }
        if (op->direct && !lane_released(lane, op))
            return moved;
        /* A split Reduce ends at the other ranks once their part is out. */
        if (op->split && (op->coll == HCCL_COLL_ALLREDUCE || lane->rank == op->root) && !lane_gather(lane, op))
            return moved;
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
    op->part_done = false;
    op->next_part = 0;
    op->direct = false;
    op->reads_direct = false;
    op->split = (op->coll == HCCL_COLL_ALLREDUCE || op->coll == HCCL_COLL_REDUCE) &&
                op->count * hccl_dtype_size(op->dtype) > lane->limits.flat_max;
    op->grouped = false; /* chosen as it is published */
    op->final_done = false;
    op->probe = false;
    op->timed = false;
    op->sig = hccl_sig_make(op->coll, op->dtype, op->op, op->root, op->count);
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

/* Whether rank r is on our CPU (grouped operations). */
static bool lane_in_group(const hccl_lane_t *lane, int r)
{
    for (int i = lane->gfirst[lane->group]; i < lane->gfirst[lane->group + 1]; i++)
        if (lane->members[i] == r)
            return true;
    return false;
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
    for (int r = 0; r < lane->nranks && at + 16 < len; r++) {
        uint64_t their_seq;
        uint32_t their_sig;
        bool waiting;
        if (r == lane->rank)
            continue;
        if (!op->part_done)
            waiting = !hccl_shm_lane_published(lane->shm, r, op->lseq, &their_seq, &their_sig);
        else if (!op->grouped)
            waiting = !hccl_shm_lane_part_published(lane->shm, r, op->lseq);
        else if (!op->final_done) /* the other CPUs' ranks whose sums are not in */
            waiting = !lane_in_group(lane, r) && !hccl_shm_lane_gpart_published(lane->shm, r, op->lseq);
        else /* the parts of our CPU's ranks */
            waiting = lane_in_group(lane, r) && !hccl_shm_lane_part_published(lane->shm, r, op->lseq);
        if (waiting)
            at += (size_t)snprintf(buf + at, len - at, "%s%d", at ? ", " : "", r);
    }
    return true;
}
