/* The lane's data paths: publishing a block, reading, reducing and gathering the peers'. */
#include <stdio.h>
#include <string.h>

#include "links/link.h"
#include "sched/lane_impl.h"
#include "sched/sched.h"

/* What this rank puts in its block. */
static size_t op_block_bytes(const hccl_lane_t *lane, const hccl_lane_op_t *op)
{
    if (op->coll == HCCL_COLL_BROADCAST && op->root != lane->rank)
        return 0;
    return hccl_lane_call_bytes(op->coll, op->count, op->dtype, lane->nranks);
}

/*
 * Whether our block is read from sendbuf itself, single-copy, instead of copied into the slot:
 * where the call is large enough (hccl_lane_limits_t) and nobody writes what a peer reads
 * before the peer is done with it. An AlltoAll or a ReduceScatter in place would. The shares
 * of a split AllReduce or Reduce are each read by the one rank that reduces it, and each share
 * of recvbuf is written only by that rank (its result) or once its part is out (the gather);
 * not grouped, where our block takes our group's sum. Each rank decides for its own block;
 * readers take each block as it was published.
 */
static bool lane_goes_direct(hccl_lane_t *lane, const hccl_lane_op_t *op, size_t bytes)
{
    const char *s = op->sendbuf, *r = op->recvbuf;
    bool overlap = s < r + bytes && r < s + bytes;

    switch (op->coll) {
    case HCCL_COLL_ALLTOALL:
        /* Below direct_min only where rank 0 timed the read faster (lane_choice.c). */
        if ((bytes < lane->limits.direct_min && !op->read_chosen) || overlap)
            return false;
        break;
    case HCCL_COLL_REDUCESCATTER:
        if (bytes < lane->limits.reduce_direct_min || overlap)
            return false;
        break;
    case HCCL_COLL_ALLREDUCE:
    case HCCL_COLL_REDUCE:
        /* A call in pieces by the whole call: its buffers are what the caches hold. */
        if (!op->split || op->grouped ||
            op->call_count * hccl_dtype_size(op->dtype) < lane->limits.reduce_direct_min)
            return false;
        break;
    default:
        return false;
    }
    return lane->win->direct_ok(lane->wctx);
}

static void lane_share(size_t count, int nranks, int r, size_t *first, size_t *n);

static int group_size(const hccl_lane_t *lane, int g)
{
    return lane->gfirst[g + 1] - lane->gfirst[g];
}

/* The elements a split operation has us reduce: our share of all ranks, or of our group. */
static void lane_own_share(const hccl_lane_t *lane, const hccl_lane_op_t *op, size_t *first,
                           size_t *n)
{
    if (op->grouped)
        lane_share(op->count, group_size(lane, lane->group), lane->gindex, first, n);
    else
        lane_share(op->count, lane->nranks, lane->rank, first, n);
}

void hccl_lane_publish(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    size_t bytes = op_block_bytes(lane, op);
    char *block;

    if (lane->step_hook)
        lane->step_hook(lane->step_hook_arg, op->seq, 0);
    op->lseq = lane->next_lseq++;
    hccl_lane_choose_way(lane, op, bytes);
    op->direct = bytes && lane_goes_direct(lane, op, bytes);
    block = lane->win->block(lane->wctx, lane->rank, op->lseq);
    if (op->split && !op->direct) {
        /* Our own share of a split operation is read by us alone, from sendbuf. */
        size_t esz = hccl_dtype_size(op->dtype), first, n;
        lane_own_share(lane, op, &first, &n);
        memcpy(block, op->sendbuf, first * esz);
        memcpy(block + (first + n) * esz, (const char *)op->sendbuf + (first + n) * esz,
               bytes - (first + n) * esz);
    } else if (bytes && !op->direct) {
        memcpy(block, op->sendbuf, bytes);
    }
    lane->win->publish(lane->wctx, op->lseq, op->seq, op->sig, op->direct ? op->sendbuf : NULL);
    op->published = true;
}

/* Copies cb bytes at off of rank r's block to dst; our own comes from sendbuf. */
static hcclResult_t lane_copy(hccl_lane_t *lane, hccl_lane_op_t *op, int r, size_t off, void *dst,
                              size_t cb)
{
    const char *mine = (const char *)op->sendbuf + off;

    if (r == lane->rank) {
        if (dst != mine)
            memcpy(dst, mine, cb);
        return hcclSuccess;
    }
    if (lane->win->is_direct(lane->wctx, r, op->lseq))
        op->reads_direct = true;
    return lane->win->read(lane->wctx, r, op->lseq, off, dst, cb);
}

/* Elements [*first, *first + *n) of count: share r of nranks (the remainder one each to the first).
 */
static void lane_share(size_t count, int nranks, int r, size_t *first, size_t *n)
{
    size_t base = count / (size_t)nranks, rem = count % (size_t)nranks;

    *first = (size_t)r * base + ((size_t)r < rem ? (size_t)r : rem);
    *n = base + ((size_t)r < rem);
}

/* Rank r's block: ours of a split or direct operation is sendbuf (hccl_lane_publish). */
static const char *lane_block_of(hccl_lane_t *lane, hccl_lane_op_t *op, int r)
{
    return (op->split || op->direct) && r == lane->rank ? op->sendbuf
                                                        : lane->win->block(lane->wctx, r, op->lseq);
}

/*
 * A tile of a reduction: small enough that its partial sums stay in the first-level cache.
 * Where blocks are read single-copy, each read is a syscall that pins the pages: larger
 * tiles, two read ones and the partial sums still within the second-level cache, take fewer.
 */
#define LANE_TILE_BYTES 16384
#define LANE_DIRECT_TILE_BYTES (256u << 10)

/* Whether any peer's block of op is read single-copy (then into lane->tiles): only a
 * reduction's shares are (lane_goes_direct). */
static hcclResult_t lane_reads_direct(hccl_lane_t *lane, hccl_lane_op_t *op, bool *direct)
{
    *direct = false;
    if (!op->split && op->coll != HCCL_COLL_REDUCESCATTER)
        return hcclSuccess;
    for (int r = 0; r < lane->nranks && !*direct; r++)
        *direct = r != lane->rank && lane->win->is_direct(lane->wctx, r, op->lseq);
    if (*direct && !lane->tiles && !(lane->tiles = hccl_malloc(2 * LANE_DIRECT_TILE_BYTES)))
        return HCCL_FAIL(hcclSystemError, "lane: out of memory for %u bytes of tiles",
                         2 * LANE_DIRECT_TILE_BYTES);
    op->reads_direct |= *direct;
    return hcclSuccess;
}

/* cb bytes of rank r's block from byte at: where they lie, or, where some are read
 * single-copy (direct) and r's is, read into tmp. */
static const char *lane_tile(hccl_lane_t *lane, hccl_lane_op_t *op, int r, size_t at, size_t cb,
                             bool direct, char *tmp, hcclResult_t *res)
{
    if (!direct || r == lane->rank || !lane->win->is_direct(lane->wctx, r, op->lseq))
        return lane_block_of(lane, op, r) + at;
    *res = lane->win->read(lane->wctx, r, op->lseq, at, tmp, cb);
    return tmp;
}

/*
 * dst = op over every rank's block at byte offset off, for n elements, in rank order, a tile
 * at a time: each tile of dst takes every rank's block while it is in the cache, one pass over
 * memory instead of one per rank. also: each tile of the result is copied there too while it
 * is in the cache; it may be our own block (a split operation's share in place), whose tile
 * is read before it is written.
 */
static hcclResult_t lane_reduce_all(hccl_lane_t *lane, hccl_lane_op_t *op, void *dst, void *also,
                                    size_t off, size_t n)
{
    size_t esz = hccl_dtype_size(op->dtype), tile;
    hcclResult_t res;
    bool direct;

    if ((res = lane_reads_direct(lane, op, &direct)) != hcclSuccess)
        return res;
    tile = (direct ? LANE_DIRECT_TILE_BYTES : LANE_TILE_BYTES) / esz;
    for (size_t at = 0; at < n; at += tile) {
        size_t len = n - at < tile ? n - at : tile, byte = at * esz, cb = len * esz;
        char *out = (char *)dst + byte;
        const char *b0 = lane_tile(lane, op, 0, off + byte, cb, direct, lane->tiles, &res);
        const char *b1 = lane_tile(lane, op, 1, off + byte, cb, direct,
                                   direct ? lane->tiles + LANE_DIRECT_TILE_BYTES : NULL, &res);
        if (res != hcclSuccess)
            return res;
        hccl_reduce(out, b0, b1, len, op->dtype, op->op);
        for (int r = 2; r < lane->nranks; r++) {
            const char *b = lane_tile(lane, op, r, off + byte, cb, direct, lane->tiles, &res);
            if (res != hcclSuccess)
                return res;
            hccl_reduce(out, out, b, len, op->dtype, op->op);
        }
        if (op->op == hcclAvg)
            hccl_reduce_div(out, len, op->dtype, lane->nranks);
        if (also)
            memcpy((char *)also + byte, out, cb);
    }
    return hcclSuccess;
}

/* A block that only moves: rank r's (ours too) to its place in recvbuf. */
hcclResult_t hccl_lane_move(hccl_lane_t *lane, hccl_lane_op_t *op, int r)
{
    size_t cb = op->count * hccl_dtype_size(op->dtype);
    char *dst = (char *)op->recvbuf + (size_t)r * cb;

    switch (op->coll) {
    case HCCL_COLL_BROADCAST:
        return r == op->root && r != lane->rank ? lane_copy(lane, op, r, 0, op->recvbuf, cb)
                                                : hcclSuccess;
    case HCCL_COLL_ALLGATHER:
        return lane_copy(lane, op, r, 0, dst, cb);
    default:
        return lane_copy(lane, op, r, (size_t)lane->rank * cb, dst, cb);
    }
}

static void lane_group_sum(hccl_lane_t *lane, hccl_lane_op_t *op);

/* Every block is in: a flat operation's result, or a split one's part (published). */
hcclResult_t hccl_lane_reduce(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    size_t esz = hccl_dtype_size(op->dtype), cb = op->count * esz, first, n;
    hcclResult_t res = hcclSuccess;

    switch (op->coll) {
    case HCCL_COLL_BROADCAST:
    case HCCL_COLL_ALLGATHER:
    case HCCL_COLL_ALLTOALL:
        /* The peers' blocks are in recvbuf already (lane_all_in). */
        res = hccl_lane_move(lane, op, lane->rank);
        break;
    case HCCL_COLL_REDUCESCATTER:
        res = lane_reduce_all(lane, op, op->recvbuf, NULL, (size_t)lane->rank * cb, op->count);
        break;
    case HCCL_COLL_ALLREDUCE:
    case HCCL_COLL_REDUCE:
        if (!op->split) {
            if (hccl_lane_takes_result(lane, op))
                res = lane_reduce_all(lane, op, op->recvbuf, NULL, 0, op->count);
            break;
        }
        if (op->grouped) {
            lane_group_sum(lane, op);
            return hcclSuccess;
        }
        lane_share(op->count, lane->nranks, lane->rank, &first, &n);
        /* Where we take the result, our part is copied to recvbuf tile by tile as it is
         * reduced, while the tile is in the cache, instead of from the slot once it is all
         * there. */
        op->part_copied = hccl_lane_takes_result(lane, op);
        if (n)
            res = lane_reduce_all(lane, op, lane->win->part(lane->wctx, lane->rank, op->lseq),
                                  op->part_copied ? (char *)op->recvbuf + first * esz : NULL,
                                  first * esz, n);
        break;
    default:
        break;
    }
    /* A split operation's part is out; the blocks read from their owners' memory are released
     * (by the same flag). */
    if (res == hcclSuccess && (op->split || op->reads_direct))
        lane->win->raise(lane->wctx, HCCL_WINDOW_PART, op->lseq);
    return res;
}

/* Which share of count split g ways holds element i (lane_share's inverse). */
static int share_of(size_t count, int g, size_t i)
{
    size_t base = count / (size_t)g, rem = count % (size_t)g;

    return i < rem * (base + 1) ? (int)(i / (base + 1))
                                : (int)(rem + (i - rem * (base + 1)) / base);
}

/*
 * A grouped AllReduce, once our group's blocks are in: their sum over our share goes to our
 * block in place of our own elements, which no peer reads (hccl_lane_publish left them out).
 */
static void lane_group_sum(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    size_t esz = hccl_dtype_size(op->dtype), first, n;
    const int *m = lane->members + lane->gfirst[lane->group];
    int g = group_size(lane, lane->group);
    char *dst = (char *)lane->win->block(lane->wctx, lane->rank, op->lseq);

    lane_own_share(lane, op, &first, &n);
    dst += first * esz;
    if (n && g == 1) {
        memcpy(dst, (const char *)op->sendbuf + first * esz, n * esz);
    } else if (n) {
        hccl_reduce(dst, lane_block_of(lane, op, m[0]) + first * esz,
                    lane_block_of(lane, op, m[1]) + first * esz, n, op->dtype, op->op);
        for (int i = 2; i < g; i++)
            hccl_reduce(dst, dst, lane_block_of(lane, op, m[i]) + first * esz, n, op->dtype,
                        op->op);
    }
    lane->win->raise(lane->wctx, HCCL_WINDOW_GPART, op->lseq);
}

/*
 * Calls fn(lane, op, piece, from, len, arg) over our share in pieces, where piece[k] is group
 * k's sum of elements [from, from + len): each piece lies within one member's share in every
 * group. Stops at the first fn that returns false; true if none did.
 */
typedef bool (*piece_fn)(hccl_lane_t *lane, hccl_lane_op_t *op, const char *const *piece,
                         size_t from, size_t len, void *arg);

static bool lane_pieces(hccl_lane_t *lane, hccl_lane_op_t *op, piece_fn fn, void *arg)
{
    size_t esz = hccl_dtype_size(op->dtype), first, n, at;
    const char **piece = lane->piece;

    lane_own_share(lane, op, &first, &n);
    for (at = first; at < first + n;) {
        size_t end = first + n;
        for (int k = 0; k < lane->ngroups; k++) {
            int g = group_size(lane, k), i = share_of(op->count, g, at),
                r = lane->members[lane->gfirst[k] + i];
            size_t f, c;
            lane_share(op->count, g, i, &f, &c);
            if (f + c < end)
                end = f + c;
            piece[k] = (const char *)lane->win->block(lane->wctx, r, op->lseq) + at * esz;
            if (r != lane->rank && !lane->win->raised(lane->wctx, r, HCCL_WINDOW_GPART, op->lseq))
                piece[k] = NULL;
        }
        if (!fn(lane, op, piece, at, end - at, arg))
            return false;
        at = end;
    }
    return true;
}

static bool piece_ready(hccl_lane_t *lane, hccl_lane_op_t *op, const char *const *piece,
                        size_t from, size_t len, void *arg)
{
    (void)op, (void)from, (void)len, (void)arg;
    for (int k = 0; k < lane->ngroups; k++)
        if (!piece[k])
            return false;
    return true;
}

/* Adds the groups' sums of a piece, in group order, into our share of the result (arg). */
static bool piece_sum(hccl_lane_t *lane, hccl_lane_op_t *op, const char *const *piece, size_t from,
                      size_t len, void *arg)
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
bool hccl_lane_final(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    size_t esz = hccl_dtype_size(op->dtype), first, n;
    char *dst;

    if (!lane_pieces(lane, op, piece_ready, NULL))
        return false;
    lane_own_share(lane, op, &first, &n);
    dst = group_size(lane, lane->group) == 1
              ? (char *)op->recvbuf + first * esz
              : (char *)lane->win->part(lane->wctx, lane->rank, op->lseq);
    lane_pieces(lane, op, piece_sum, dst);
    if (op->op == hcclAvg && n)
        hccl_reduce_div(dst, n, op->dtype, lane->nranks);
    lane->win->raise(lane->wctx, HCCL_WINDOW_PART, op->lseq);
    return true;
}

/* Our block went direct: whether every peer has said it is done reading it. */
bool hccl_lane_released(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    for (; op->next_part < lane->nranks; op->next_part++)
        if (op->next_part != lane->rank &&
            !lane->win->raised(lane->wctx, op->next_part, HCCL_WINDOW_PART, op->lseq))
            return false;
    return true;
}

/* A split operation: copies out the parts published so far; true once all are. */
bool hccl_lane_gather(hccl_lane_t *lane, hccl_lane_op_t *op)
{
    size_t esz = hccl_dtype_size(op->dtype), first, n;
    /* Grouped: the parts of our group (ours went to recvbuf where we are alone in it). */
    int g = op->grouped ? group_size(lane, lane->group) : lane->nranks;
    const int *m = op->grouped ? lane->members + lane->gfirst[lane->group] : NULL;

    for (; g > 1 && op->next_part < g; op->next_part++) {
        int r = m ? m[op->next_part] : op->next_part;
        if (r == lane->rank && op->part_copied)
            continue;
        if (r != lane->rank && !lane->win->raised(lane->wctx, r, HCCL_WINDOW_PART, op->lseq))
            return false;
        lane_share(op->count, g, op->next_part, &first, &n);
        memcpy((char *)op->recvbuf + first * esz, lane->win->part(lane->wctx, r, op->lseq),
               n * esz);
    }
    return true;
}
