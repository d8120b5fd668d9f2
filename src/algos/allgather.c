/*
 * AllGather generators. RECV holds nranks blocks of count elements in rank
 * order, SEND this rank's block. In place, SEND is RECV's block rank: the
 * copy of our own block is then a no-op, and nothing may write that block
 * while a step still reads SEND.
 *
 * ring:   n-1 steps around r -> r+1, each block cut into chunk_bytes pieces
 *         so that a chunk is forwarded as soon as it arrived. (n-1) blocks
 *         sent per rank: bandwidth-optimal, for large buffers.
 * recdbl: log2(n) exchanges of contiguous ranges of RECV that double each
 *         round. For n not a power of two it builds Bruck's plan (as Open
 *         MPI does): the same (n-1) blocks per rank, ceil(log2 n) rounds, no
 *         padding, where folding the extra ranks in would cost two more
 *         rounds and a whole extra buffer on each folded pair.
 * bruck:  ceil(log2 n) rounds for any n; round k sends the first
 *         min(2^k, n - 2^k) blocks gathered so far to rank - 2^k. Blocks
 *         collect in SCRATCH rotated (position j holds block rank + j), which
 *         keeps every message one contiguous piece; two copies rotate them
 *         into RECV at the end. For small messages.
 *
 * Every block has count elements, so with count 0 every block is empty and
 * the plans have no steps at all.
 */
#include "algos/algos.h"

/* Enough for the rounds of any int rank count, plus the first copy. */
#define AG_MAX_ROUNDS 34

static int mod(int a, int n)
{
    return ((a % n) + n) % n;
}

static size_t div_up(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

static bool is_pow2(int n)
{
    return (n & (n - 1)) == 0;
}

static hcclResult_t plan_deps(hccl_plan_t *p, const uint32_t *before, int n, uint32_t after)
{
    for (int i = 0; i < n; i++)
        HCCL_CHECK(hccl_plan_dep(p, before[i], after));
    return hcclSuccess;
}

static hcclResult_t ring_build(hccl_plan_t *p, int rank, int n, size_t count, size_t esz,
                               size_t chunk_bytes)
{
    size_t chunk_elems = chunk_bytes / esz ? chunk_bytes / esz : 1, bsz = count * esz;
    uint32_t nch = (uint32_t)div_up(count, chunk_elems);
    uint32_t *got = hccl_calloc(nch, sizeof(*got)); /* [chunk] its recv in the previous step */
    int next = mod(rank + 1, n), prev = mod(rank - 1, n);
    hcclResult_t res = hcclSuccess;

    if (!got)
        return HCCL_FAIL(hcclSystemError, "ring allgather: out of memory for %u chunks", nch);
    /* RECV's block rank is never read: step 0 sends our block straight from SEND. */
    HCCL_CHECK_GOTO(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, (size_t)rank * bsz),
                                   hccl_bref(HCCL_SLOT_SEND, 0), bsz, NULL), res, out);
    for (int s = 0; s < n - 1; s++) {
        size_t sb = (size_t)mod(rank - s, n), rb = (size_t)mod(rank - s - 1, n);

        for (uint32_t c = 0; c < nch; c++) {
            size_t off, len;
            uint32_t sid, tag = (uint32_t)s * nch + c;
            hccl_algo_block(count, (int)nch, (int)c, &off, &len);
            hccl_bref_t src = s == 0 ? hccl_bref(HCCL_SLOT_SEND, off * esz)
                                     : hccl_bref(HCCL_SLOT_RECV, sb * bsz + off * esz);
            HCCL_CHECK_GOTO(hccl_plan_send(p, next, tag, src, len * esz, &sid), res, out);
            /* Forward the chunk once it arrived: a chunk, not the block, is the unit of wait. */
            if (s > 0)
                HCCL_CHECK_GOTO(hccl_plan_dep(p, got[c], sid), res, out);
            HCCL_CHECK_GOTO(hccl_plan_recv(p, prev, tag,
                                           hccl_bref(HCCL_SLOT_RECV, rb * bsz + off * esz),
                                           len * esz, &got[c]), res, out);
        }
    }
out:
    hccl_free(got);
    return res;
}

/*
 * n a power of two. Before round k (distance d = 2^k) we hold the d blocks of
 * our aligned group rank & ~(d-1), contiguous in RECV; the peer rank ^ d holds
 * its group, and we swap them. Receives land in blocks nobody has read or
 * written yet, so the only hazards are the sends reading what arrived.
 */
static hcclResult_t recdbl_build(hccl_plan_t *p, int rank, int n, size_t bsz)
{
    uint32_t got[AG_MAX_ROUNDS], sid;
    int ngot = 0;

    HCCL_CHECK(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, (size_t)rank * bsz),
                              hccl_bref(HCCL_SLOT_SEND, 0), bsz, &got[ngot++]));
    for (int d = 1, k = 0; d < n; d <<= 1, k++) {
        int peer = rank ^ d;
        size_t mine = (size_t)(rank & ~(d - 1)) * bsz, theirs = (size_t)(peer & ~(d - 1)) * bsz;
        /* Round 0 sends our block from SEND, without waiting for the copy. */
        hccl_bref_t src = d == 1 ? hccl_bref(HCCL_SLOT_SEND, 0) : hccl_bref(HCCL_SLOT_RECV, mine);

        HCCL_CHECK(hccl_plan_send(p, peer, (uint32_t)k, src, (size_t)d * bsz, &sid));
        if (d > 1)
            HCCL_CHECK(plan_deps(p, got, ngot, sid));
        HCCL_CHECK(hccl_plan_recv(p, peer, (uint32_t)k, hccl_bref(HCCL_SLOT_RECV, theirs),
                                  (size_t)d * bsz, &got[ngot++]));
    }
    return hcclSuccess;
}

static hcclResult_t bruck_build(hccl_plan_t *p, int rank, int n, size_t bsz)
{
    uint32_t got[AG_MAX_ROUNDS], sid, sid0 = 0, id;
    int ngot = 0;
    size_t head = (size_t)(n - rank) * bsz; /* positions [0, n - rank) are blocks [rank, n) */

    p->scratch_bytes = (size_t)n * bsz;
    HCCL_CHECK(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_SCRATCH, 0), hccl_bref(HCCL_SLOT_SEND, 0),
                              bsz, &got[ngot++]));
    for (int d = 1, k = 0; d < n; d <<= 1, k++) {
        size_t bytes = (size_t)(d < n - d ? d : n - d) * bsz;
        /* Position 0 is our own block: round 0 reads it from SEND and does not wait. */
        hccl_bref_t src = d == 1 ? hccl_bref(HCCL_SLOT_SEND, 0) : hccl_bref(HCCL_SLOT_SCRATCH, 0);

        HCCL_CHECK(hccl_plan_send(p, mod(rank - d, n), (uint32_t)k, src, bytes, &sid));
        if (d == 1)
            sid0 = sid;
        else
            HCCL_CHECK(plan_deps(p, got, ngot, sid)); /* it sends positions [0, d) */
        HCCL_CHECK(hccl_plan_recv(p, mod(rank + d, n), (uint32_t)k,
                                  hccl_bref(HCCL_SLOT_SCRATCH, (size_t)d * bsz), bytes,
                                  &got[ngot++]));
    }
    /* The first copy writes RECV's block rank, which in place is SEND: after round 0 read it. */
    HCCL_CHECK(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, (size_t)rank * bsz),
                              hccl_bref(HCCL_SLOT_SCRATCH, 0), head, &id));
    HCCL_CHECK(plan_deps(p, got, ngot, id));
    HCCL_CHECK(hccl_plan_dep(p, sid0, id));
    if (rank > 0) {
        HCCL_CHECK(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0),
                                  hccl_bref(HCCL_SLOT_SCRATCH, head), (size_t)rank * bsz, &id));
        HCCL_CHECK(plan_deps(p, got, ngot, id));
    }
    return hcclSuccess;
}

typedef enum { AG_RING, AG_RECDBL, AG_BRUCK } ag_kind_t;

static hcclResult_t ag_plan(ag_kind_t kind, const char *name, int rank, int nranks,
                            const hccl_coll_shape_t *shape, size_t chunk_bytes,
                            hccl_plan_t **plan_p)
{
    hcclResult_t res;
    hccl_plan_t *p = NULL;
    size_t esz = hccl_dtype_size(shape->dtype), bsz = shape->count * esz;

    HCCL_CHECK(hccl_plan_create(rank, nranks, shape->dtype, shape->op, name, &p));
    if (bsz == 0)
        goto finalize;
    if (nranks == 1)
        HCCL_CHECK_GOTO(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0),
                                       hccl_bref(HCCL_SLOT_SEND, 0), bsz, NULL), res, err);
    else if (kind == AG_RING)
        HCCL_CHECK_GOTO(ring_build(p, rank, nranks, shape->count, esz, chunk_bytes), res, err);
    else if (kind == AG_RECDBL && is_pow2(nranks))
        HCCL_CHECK_GOTO(recdbl_build(p, rank, nranks, bsz), res, err);
    else
        HCCL_CHECK_GOTO(bruck_build(p, rank, nranks, bsz), res, err);
finalize:
    HCCL_CHECK_GOTO(hccl_plan_finalize(p, bsz, (size_t)nranks * bsz), res, err);
    *plan_p = p;
    return hcclSuccess;

err:
    hccl_plan_release(p);
    return res;
}

hcclResult_t hccl_algo_ring_allgather(int rank, int nranks, const hccl_coll_shape_t *shape,
                                      size_t chunk_bytes, hccl_plan_t **plan_p)
{
    return ag_plan(AG_RING, "ring", rank, nranks, shape, chunk_bytes, plan_p);
}

hcclResult_t hccl_algo_recdbl_allgather(int rank, int nranks, const hccl_coll_shape_t *shape,
                                        size_t chunk_bytes, hccl_plan_t **plan_p)
{
    return ag_plan(AG_RECDBL, "recdbl", rank, nranks, shape, chunk_bytes, plan_p);
}

hcclResult_t hccl_algo_bruck_allgather(int rank, int nranks, const hccl_coll_shape_t *shape,
                                       size_t chunk_bytes, hccl_plan_t **plan_p)
{
    return ag_plan(AG_BRUCK, "bruck", rank, nranks, shape, chunk_bytes, plan_p);
}
