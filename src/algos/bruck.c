/*
 * Bruck AlltoAll for small blocks: ceil(log2 n) messages per rank instead of
 * n-1, at the price of moving each block up to log2 n times and of local
 * copies. Block i of the rotated array is the data for rank (r+i)%n; round k
 * ships every block whose index has bit k set 2^k ranks forward, so after all
 * rounds a block has travelled exactly i ranks and block i holds the data
 * from rank (r-i)%n, which the inverse rotation puts in place.
 *
 * Scratch layout (b = count * esz bytes per block, m = max blocks per round):
 *   [0, n*b)             T: the rotated blocks, updated in place round by round
 *   [n*b, n*b + m*b)     P: blocks of this round packed contiguously for the send
 *   [n*b + m*b, +m*b)    R: the packed blocks received this round
 * P and R are separate: receiving into P would wait for P's send, which waits
 * for the peer's receive, which waits for its own send: a cycle around the ring.
 *
 * Each round is one message; chunk_bytes is unused because the tuner gives
 * large blocks to pairwise, which moves every byte once.
 */
#include "algos/algos.h"

typedef struct {
    int rank;
    int n;
    size_t b;             /* bytes per block */
    size_t off_p;         /* scratch offset of P */
    size_t off_r;         /* scratch offset of R */
    uint32_t *writer;     /* owned, [n]: last step that wrote T block i */
    uint32_t prev_send;   /* last round's send (reads P), UINT32_MAX before round 0 */
    uint32_t *prev_unpack; /* owned, [n]: last round's copies out of R */
    uint32_t nprev_unpack;
} bruck_t;

/* Blocks with bit k set come in runs of 2^k starting at odd multiples of 2^k. */
static int run_len(const bruck_t *g, int k, int start)
{
    int len = 1 << k;

    return start + len <= g->n ? len : g->n - start;
}

/* Blocks moved in round k; a rank sends sum_k round_blocks(n, k) * b bytes in all. */
static size_t round_blocks(int n, int k)
{
    size_t m = 0;

    for (int start = 1 << k; start < n; start += 2 << k)
        m += (size_t)((start + (1 << k) <= n) ? (1 << k) : n - start);
    return m;
}

/* dep on every distinct last writer of T blocks [start, start + len). */
static hcclResult_t after_writers(hccl_plan_t *p, const bruck_t *g, int start, int len, uint32_t id)
{
    for (int i = start; i < start + len; i++)
        if (i == start || g->writer[i] != g->writer[i - 1])
            HCCL_CHECK(hccl_plan_dep(p, g->writer[i], id));
    return hcclSuccess;
}

static hcclResult_t bruck_round(hccl_plan_t *p, bruck_t *g, int k, uint32_t *unpack)
{
    int to = (g->rank + (1 << k)) % g->n, from = (g->rank - (1 << k) + g->n) % g->n;
    size_t m = round_blocks(g->n, k), pos = 0;
    uint32_t sid, rid, nunpack = 0, id;

    HCCL_CHECK(hccl_plan_send(p, to, (uint32_t)k, hccl_bref(HCCL_SLOT_SCRATCH, g->off_p), m * g->b,
                              &sid));
    HCCL_CHECK(hccl_plan_recv(p, from, (uint32_t)k, hccl_bref(HCCL_SLOT_SCRATCH, g->off_r),
                              m * g->b, &rid));
    for (uint32_t u = 0; u < g->nprev_unpack; u++)
        HCCL_CHECK(hccl_plan_dep(p, g->prev_unpack[u], rid)); /* they still read R */
    for (int start = 1 << k; start < g->n; start += 2 << k) {
        int len = run_len(g, k, start);
        size_t bytes = (size_t)len * g->b, toff = (size_t)start * g->b;
        uint32_t pid;

        HCCL_CHECK(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_SCRATCH, g->off_p + pos),
                                  hccl_bref(HCCL_SLOT_SCRATCH, toff), bytes, &pid));
        HCCL_CHECK(after_writers(p, g, start, len, pid));
        if (g->prev_send != UINT32_MAX)
            HCCL_CHECK(hccl_plan_dep(p, g->prev_send, pid)); /* P is still being sent */
        HCCL_CHECK(hccl_plan_dep(p, pid, sid));
        HCCL_CHECK(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_SCRATCH, toff),
                                  hccl_bref(HCCL_SLOT_SCRATCH, g->off_r + pos), bytes, &id));
        HCCL_CHECK(hccl_plan_dep(p, rid, id));
        HCCL_CHECK(hccl_plan_dep(p, pid, id)); /* the pack reads what this overwrites */
        for (int i = start; i < start + len; i++)
            g->writer[i] = id;
        unpack[nunpack++] = id;
        pos += bytes;
    }
    g->prev_send = sid;
    g->nprev_unpack = nunpack;
    return hcclSuccess;
}

static hcclResult_t bruck_rounds(hccl_plan_t *p, bruck_t *g)
{
    uint32_t *cur = hccl_malloc((size_t)g->n * sizeof(*cur));
    hcclResult_t res = hcclSuccess;

    if (!cur)
        return HCCL_FAIL(hcclSystemError, "bruck: out of memory for %d ranks", g->n);
    for (int k = 0; (1 << k) < g->n && res == hcclSuccess; k++) {
        uint32_t *t;
        res = bruck_round(p, g, k, cur);
        t = g->prev_unpack; /* this round's copies become the previous ones */
        g->prev_unpack = cur;
        cur = t;
    }
    hccl_free(cur);
    return res;
}

hcclResult_t hccl_algo_bruck_alltoall(int rank, int nranks, const hccl_coll_shape_t *shape,
                                      size_t chunk_bytes, hccl_plan_t **plan_p)
{
    hcclResult_t res;
    hccl_plan_t *p = NULL;
    size_t b = shape->count * hccl_dtype_size(shape->dtype), total = (size_t)nranks * b, m = 0;
    bruck_t g = {.rank = rank, .n = nranks, .b = b, .prev_send = UINT32_MAX};
    uint32_t lo, hi, id;

    (void)chunk_bytes;
    HCCL_CHECK(hccl_plan_create(rank, nranks, shape->dtype, shape->op, "bruck", &p));
    if (nranks == 1 || b == 0) {
        /* Nothing to exchange: one rank copies its block, count 0 is an empty plan. */
        if (b)
            HCCL_CHECK_GOTO(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0),
                                           hccl_bref(HCCL_SLOT_SEND, 0), b, NULL), res, err);
        goto finalize;
    }
    for (int k = 0; (1 << k) < nranks; k++)
        m = round_blocks(nranks, k) > m ? round_blocks(nranks, k) : m;
    g.off_p = total;
    g.off_r = total + m * b;
    p->scratch_bytes = total + 2 * m * b;
    g.writer = hccl_malloc((size_t)nranks * sizeof(*g.writer));
    g.prev_unpack = hccl_malloc((size_t)nranks * sizeof(*g.prev_unpack));
    if (!g.writer || !g.prev_unpack) {
        res = HCCL_FAIL(hcclSystemError, "bruck: out of memory for %d ranks", nranks);
        goto err_free;
    }
    /* Rotation: T block i = SEND block (r+i)%n, i.e. two contiguous runs. */
    HCCL_CHECK_GOTO(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_SCRATCH, 0),
                                   hccl_bref(HCCL_SLOT_SEND, (size_t)rank * b),
                                   (size_t)(nranks - rank) * b, &lo), res, err_free);
    hi = lo;
    if (rank > 0)
        HCCL_CHECK_GOTO(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_SCRATCH, (size_t)(nranks - rank) * b),
                                       hccl_bref(HCCL_SLOT_SEND, 0), (size_t)rank * b, &hi),
                        res, err_free);
    for (int i = 0; i < nranks; i++)
        g.writer[i] = i < nranks - rank ? lo : hi;
    HCCL_CHECK_GOTO(bruck_rounds(p, &g), res, err_free);
    /* Inverse rotation: T block i came from rank (r-i)%n; block order reverses, so n copies. */
    for (int i = 0; i < nranks; i++) {
        size_t dst = (size_t)((rank - i + nranks) % nranks) * b;
        HCCL_CHECK_GOTO(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, dst),
                                       hccl_bref(HCCL_SLOT_SCRATCH, (size_t)i * b), b, &id),
                        res, err_free);
        HCCL_CHECK_GOTO(hccl_plan_dep(p, g.writer[i], id), res, err_free);
    }
    hccl_free(g.writer);
    hccl_free(g.prev_unpack);
finalize:
    HCCL_CHECK_GOTO(hccl_plan_finalize(p, total, total), res, err);
    *plan_p = p;
    return hcclSuccess;

err_free:
    hccl_free(g.writer);
    hccl_free(g.prev_unpack);
err:
    hccl_plan_release(p);
    return res;
}
