/*
 * van de Geijn Broadcast for large buffers: a binomial scatter cuts the root's buffer into
 * n blocks (hccl_algo_block, no padding) and leaves block v at virtual rank
 * v = (rank - root) mod n, then a ring all-gather v -> v+1 passes every block around.
 * Each rank sends about 2 buffers' worth at most instead of the log2(n) buffers the
 * binomial tree's root sends.
 *
 * The scatter leaves more than its own block at inner ranks: v > 0 receives blocks
 * [v, v + lowbit(v)) to hand on to its subtree, and the root holds all of them. The ring
 * skips a block its receiver already holds (the receiver forwards its own copy instead), so
 * no rank ever receives a block twice: no region is written twice (no hazard between the
 * scatter's sends and the ring's receives) and in total every non-root rank receives the
 * buffer exactly once, (n - 1) * count elements, as in the binomial tree.
 */
#include "algos/algos.h"

/* However small the chunks asked for, a plan keeps about this many at most (steps and tags
 * stay bounded); larger buffers get larger chunks. */
#define SAG_MAX_CHUNKS (1u << 16)

enum { TAG_SCATTER = 0, TAG_RING0 = 1 };

typedef struct {
    int n;
    int v;              /* this rank's virtual rank */
    int root;
    size_t count;
    size_t esz;
    size_t chunk_elems; /* ring pipelining granularity */
    uint32_t nch_max;   /* chunks of the largest block: the ring's tag stride */
} sag_t;

static size_t div_up(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

static int lowbit(int v)
{
    return v & -v;
}

static int mod(int a, int n)
{
    return ((a % n) + n) % n;
}

static int real_rank(const sag_t *g, int v)
{
    return (v + g->root) % g->n;
}

/* First element of block b; b == n gives count, so [first(a), first(b)) spans blocks a..b-1. */
static size_t block_first(const sag_t *g, int b)
{
    size_t first, len;

    if (b >= g->n)
        return g->count;
    hccl_algo_block(g->count, g->n, b, &first, &len);
    return first;
}

/* The blocks the scatter leaves at v > 0: [v, end). */
static int scatter_end(const sag_t *g, int v)
{
    return v + lowbit(v) < g->n ? v + lowbit(v) : g->n;
}

static bool holds(const sag_t *g, int v, int b)
{
    return v == 0 || (b >= v && b < scatter_end(g, v));
}

static uint32_t block_chunks(const sag_t *g, int b)
{
    return (uint32_t)div_up(block_first(g, b + 1) - block_first(g, b), g->chunk_elems);
}

/* Byte offset and length of chunk c of block b. */
static void chunk_range(const sag_t *g, int b, uint32_t c, size_t *off, size_t *bytes)
{
    size_t first = block_first(g, b) + (size_t)c * g->chunk_elems, end = block_first(g, b + 1);
    size_t len = end - first < g->chunk_elems ? end - first : g->chunk_elems;

    *off = first * g->esz;
    *bytes = len * g->esz;
}

/*
 * One message per tree edge, the blocks of the child's subtree; empty ranges (count < n)
 * are skipped on both sides, which agree since both compute the same range.
 */
static hcclResult_t sag_scatter(const sag_t *g, hccl_plan_t *p, uint32_t *rid_p)
{
    int span = 1;
    uint32_t sid;

    *rid_p = UINT32_MAX;
    if (g->v > 0) {
        size_t first = block_first(g, g->v), end = block_first(g, scatter_end(g, g->v));
        if (end > first)
            HCCL_CHECK(hccl_plan_recv(p, real_rank(g, g->v - lowbit(g->v)), TAG_SCATTER,
                                      hccl_bref(HCCL_SLOT_RECV, first * g->esz),
                                      (end - first) * g->esz, rid_p));
        span = lowbit(g->v);
    } else {
        while (span < g->n)
            span <<= 1;
    }
    /* The largest subtree first: it has the longest way still to go. */
    for (int m = span / 2; m >= 1; m /= 2) {
        int child = g->v + m;
        size_t first, end;

        if (child >= g->n)
            continue;
        first = block_first(g, child);
        end = block_first(g, scatter_end(g, child));
        if (end == first)
            continue;
        HCCL_CHECK(hccl_plan_send(p, real_rank(g, child), TAG_SCATTER,
                                  hccl_bref(HCCL_SLOT_RECV, first * g->esz),
                                  (end - first) * g->esz, &sid));
        if (*rid_p != UINT32_MAX)
            HCCL_CHECK(hccl_plan_dep(p, *rid_p, sid));
    }
    return hcclSuccess;
}

/*
 * Step s: send block v - s to v + 1, receive block v - s - 1 from v - 1, each cut into
 * chunks so a block is forwarded chunk by chunk as it arrives. The block sent at step s is
 * either held since the scatter or was received at step s - 1 (prev_rid, per chunk).
 */
static hcclResult_t sag_ring(const sag_t *g, hccl_plan_t *p, uint32_t scatter_rid,
                             uint32_t *prev_rid, uint32_t *cur_rid)
{
    int next = mod(g->v + 1, g->n);

    for (int s = 0; s < g->n - 1; s++) {
        int sb = mod(g->v - s, g->n), rb = mod(g->v - s - 1, g->n);
        uint32_t tag0 = TAG_RING0 + (uint32_t)s * g->nch_max, *tmp;
        uint32_t nsend = holds(g, next, sb) ? 0 : block_chunks(g, sb);
        uint32_t nrecv = holds(g, g->v, rb) ? 0 : block_chunks(g, rb);

        for (uint32_t c = 0; c < nsend; c++) {
            size_t off, len;
            uint32_t sid, after = holds(g, g->v, sb) ? scatter_rid : prev_rid[c];

            chunk_range(g, sb, c, &off, &len);
            HCCL_CHECK(hccl_plan_send(p, real_rank(g, next), tag0 + c,
                                      hccl_bref(HCCL_SLOT_RECV, off), len, &sid));
            if (after != UINT32_MAX) /* none at the root, which holds everything */
                HCCL_CHECK(hccl_plan_dep(p, after, sid));
        }
        for (uint32_t c = 0; c < nrecv; c++) {
            size_t off, len;

            chunk_range(g, rb, c, &off, &len);
            HCCL_CHECK(hccl_plan_recv(p, real_rank(g, mod(g->v - 1, g->n)), tag0 + c,
                                      hccl_bref(HCCL_SLOT_RECV, off), len, &cur_rid[c]));
        }
        tmp = prev_rid;
        prev_rid = cur_rid;
        cur_rid = tmp;
    }
    return hcclSuccess;
}

hcclResult_t hccl_algo_scatter_allgather_broadcast(int rank, int nranks,
                                                   const hccl_coll_shape_t *shape,
                                                   size_t chunk_bytes, hccl_plan_t **plan_p)
{
    hcclResult_t res;
    hccl_plan_t *p = NULL;
    uint32_t *rids = NULL, scatter_rid;
    size_t bytes = shape->count * hccl_dtype_size(shape->dtype);
    sag_t g = {.n = nranks, .v = (rank - shape->root + nranks) % nranks, .root = shape->root,
               .count = shape->count, .esz = hccl_dtype_size(shape->dtype)};

    g.chunk_elems = chunk_bytes / g.esz ? chunk_bytes / g.esz : 1;
    if (g.chunk_elems < div_up(g.count, SAG_MAX_CHUNKS))
        g.chunk_elems = div_up(g.count, SAG_MAX_CHUNKS);
    g.nch_max = block_chunks(&g, 0) ? block_chunks(&g, 0) : 1; /* block 0 is the largest */
    HCCL_CHECK(hccl_plan_create(rank, nranks, shape->dtype, shape->op, "scatter_allgather", &p));
    if (nranks > 1 && bytes > 0) {
        rids = hccl_calloc(2 * (size_t)g.nch_max, sizeof(*rids));
        if (!rids) {
            res = HCCL_FAIL(hcclSystemError, "scatter_allgather: out of memory");
            goto err;
        }
        HCCL_CHECK_GOTO(sag_scatter(&g, p, &scatter_rid), res, err);
        HCCL_CHECK_GOTO(sag_ring(&g, p, scatter_rid, rids, rids + g.nch_max), res, err);
        hccl_free(rids);
        rids = NULL;
    }
    HCCL_CHECK_GOTO(hccl_plan_finalize(p, bytes, bytes), res, err);
    *plan_p = p;
    return hcclSuccess;

err:
    hccl_free(rids);
    hccl_plan_release(p);
    return res;
}
