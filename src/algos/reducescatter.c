/*
 * ReduceScatter generators. SEND holds nranks blocks of count elements, RECV
 * receives the reduced block rank. In place, RECV is SEND's block rank: the
 * step that writes RECV is the one that reads that block last (a reduce is
 * elementwise, so its destination may alias a source), and no step reads
 * it afterwards.
 *
 * ring:    n-1 steps around r -> r+1: send a partial sum of block
 *          rank-s-1, receive one of block rank-s-2 and add our own data to
 *          it, so that after n-1 steps block rank is complete. Chunked by
 *          chunk_bytes so that chunk c moves on as soon as it is reduced.
 *          (n-1) blocks sent per rank.
 * rechalv: recursive halving: log2(p) exchanges of half of what is left,
 *          for latency-bound sizes. For n = p + rem
 *          (p = 2^floor(log2 n)) the first 2*rem ranks fold in pairs first,
 *          as in the recursive-doubling AllReduce: the even rank hands all
 *          its data to the odd one, which then stands for both blocks, and
 *          gets its block back at the end. (n-1) blocks sent per rank, n on
 *          the folded even ranks.
 *
 * With count 0 every block is empty and the plans have no steps at all.
 */
#include "algos/algos.h"

enum { TAG_FOLD = 0, TAG_UNFOLD = 1, TAG_ROUND0 = 2 };

static int mod(int a, int n)
{
    return ((a % n) + n) % n;
}

static size_t div_up(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

/*
 * Partial sums alternate between two SCRATCH regions of one block: step s
 * receives into region s % 2 and reduces there, step s + 1 sends it from
 * there, so the receive of step s + 1 never waits for that send.
 */
static hcclResult_t ring_build(hccl_plan_t *p, int rank, int n, size_t count, size_t esz,
                               size_t chunk_bytes)
{
    size_t chunk_elems = chunk_bytes / esz ? chunk_bytes / esz : 1, bsz = count * esz;
    uint32_t nch = (uint32_t)div_up(count, chunk_elems);
    uint32_t *red = hccl_calloc(nch, sizeof(*red));   /* [chunk] its reduce of the last step */
    uint32_t *sent = hccl_calloc(nch, sizeof(*sent)); /* [chunk] its send of the last step */
    int next = mod(rank + 1, n), prev = mod(rank - 1, n);
    hcclResult_t res = hcclSuccess;

    if (!red || !sent) {
        res = HCCL_FAIL(hcclSystemError, "ring reducescatter: out of memory for %u chunks", nch);
        goto out;
    }
    p->scratch_bytes = (n > 2 ? 2 : 1) * bsz;
    for (int s = 0; s < n - 1; s++) {
        size_t sb = (size_t)mod(rank - s - 1, n), rb = (size_t)mod(rank - s - 2, n);
        size_t here = (size_t)(s % 2) * bsz, there = (size_t)((s + 1) % 2) * bsz;
        bool final = s == n - 2; /* rb == rank: the last contribution completes our block */

        for (uint32_t c = 0; c < nch; c++) {
            size_t off, len;
            uint32_t sid, rid, did, tag = (uint32_t)s * nch + c;
            hccl_algo_block(count, (int)nch, (int)c, &off, &len);
            off *= esz;
            len *= esz;
            hccl_bref_t src = s == 0 ? hccl_bref(HCCL_SLOT_SEND, sb * bsz + off)
                                     : hccl_bref(HCCL_SLOT_SCRATCH, there + off);
            hccl_bref_t dst = final ? hccl_bref(HCCL_SLOT_RECV, off)
                                    : hccl_bref(HCCL_SLOT_SCRATCH, here + off);

            HCCL_CHECK_GOTO(hccl_plan_send(p, next, tag, src, len, &sid), res, out);
            if (s > 0)
                HCCL_CHECK_GOTO(hccl_plan_dep(p, red[c], sid), res, out);
            HCCL_CHECK_GOTO(hccl_plan_recv(p, prev, tag, hccl_bref(HCCL_SLOT_SCRATCH, here + off),
                                           len, &rid), res, out);
            /* The region still holds the partial sum the last step's send reads. */
            if (s > 1)
                HCCL_CHECK_GOTO(hccl_plan_dep(p, sent[c], rid), res, out);
            HCCL_CHECK_GOTO(hccl_plan_reduce(p, dst, hccl_bref(HCCL_SLOT_SCRATCH, here + off),
                                             hccl_bref(HCCL_SLOT_SEND, rb * bsz + off), len,
                                             final ? HCCL_STEP_FINAL_DIV : 0, &did), res, out);
            HCCL_CHECK_GOTO(hccl_plan_dep(p, rid, did), res, out);
            red[c] = did;
            sent[c] = sid;
        }
    }
out:
    hccl_free(red);
    hccl_free(sent);
    return res;
}

/* The real rank of halving participant v. */
static int real_rank(int v, int rem)
{
    return v < rem ? 2 * v + 1 : v + rem;
}

/* The first block participant v stands for: folded pairs stand for two, so a run of
 * participants is a run of blocks and every message is one contiguous piece. */
static size_t first_block(int v, int rem)
{
    return (size_t)(v < rem ? 2 * v : v + rem);
}

/*
 * SCRATCH: ACC, the partial sums indexed like SEND (n blocks), then IN, where
 * each round's half arrives (the first round's half is the largest). The
 * current sums start in SEND, or in ACC on a folded odd rank.
 */
static hcclResult_t rechalv_build(hccl_plan_t *p, int rank, int n, size_t bsz)
{
    int pof2 = 1, rem, v;
    size_t acc = 0, in = (size_t)n * bsz, in_blocks;
    hccl_slot_t cur = HCCL_SLOT_SEND;
    uint32_t sid, rid, id, last = UINT32_MAX, prev_red = UINT32_MAX;

    while (pof2 * 2 <= n)
        pof2 *= 2;
    rem = n - pof2;
    if (rank < 2 * rem && rank % 2 == 0) {
        HCCL_CHECK(hccl_plan_send(p, rank + 1, TAG_FOLD, hccl_bref(HCCL_SLOT_SEND, 0),
                                  (size_t)n * bsz, &sid));
        HCCL_CHECK(hccl_plan_recv(p, rank + 1, TAG_UNFOLD, hccl_bref(HCCL_SLOT_RECV, 0), bsz,
                                  &rid));
        return hccl_plan_dep(p, sid, rid); /* in place, RECV is part of what the fold sends */
    }
    v = rank < 2 * rem ? rank / 2 : rank - rem;
    in_blocks = (v & (pof2 / 2)) ? first_block(pof2, rem) - first_block(pof2 / 2, rem)
                                 : first_block(pof2 / 2, rem);
    p->scratch_bytes = in + in_blocks * bsz;
    if (rank < 2 * rem) {
        HCCL_CHECK(hccl_plan_recv(p, rank - 1, TAG_FOLD, hccl_bref(HCCL_SLOT_SCRATCH, acc),
                                  (size_t)n * bsz, &rid));
        HCCL_CHECK(hccl_plan_reduce(p, hccl_bref(HCCL_SLOT_SCRATCH, acc),
                                    hccl_bref(HCCL_SLOT_SCRATCH, acc),
                                    hccl_bref(HCCL_SLOT_SEND, 0), (size_t)n * bsz, 0, &last));
        HCCL_CHECK(hccl_plan_dep(p, rid, last));
        cur = HCCL_SLOT_SCRATCH;
    }
    for (int m = pof2 / 2, k = 0, lo = 0; m >= 1; m /= 2, k++) {
        int keep = (v & m) ? lo + m : lo, give = (v & m) ? lo : lo + m;
        int peer = real_rank(v ^ m, rem);
        size_t kb = first_block(keep, rem), ke = first_block(keep + m, rem);
        size_t gb = first_block(give, rem), ge = first_block(give + m, rem);
        uint32_t tag = TAG_ROUND0 + (uint32_t)k;

        HCCL_CHECK(hccl_plan_send(p, peer, tag, hccl_bref(cur, gb * bsz), (ge - gb) * bsz, &sid));
        if (last != UINT32_MAX)
            HCCL_CHECK(hccl_plan_dep(p, last, sid));
        HCCL_CHECK(hccl_plan_recv(p, peer, tag, hccl_bref(HCCL_SLOT_SCRATCH, in),
                                  (ke - kb) * bsz, &rid));
        if (prev_red != UINT32_MAX)
            HCCL_CHECK(hccl_plan_dep(p, prev_red, rid)); /* IN is free once reduced */
        /* The last round reduces block by block: ours into RECV, a folded partner's into ACC
         * to be sent back. Before, the kept half is one reduce. */
        for (size_t b = kb; b < ke; b += m > 1 ? ke - kb : 1) {
            size_t len = m > 1 ? ke - kb : 1;
            hccl_bref_t dst = m == 1 && b == (size_t)rank
                                  ? hccl_bref(HCCL_SLOT_RECV, 0)
                                  : hccl_bref(HCCL_SLOT_SCRATCH, acc + b * bsz);

            HCCL_CHECK(hccl_plan_reduce(p, dst, hccl_bref(HCCL_SLOT_SCRATCH, in + (b - kb) * bsz),
                                        hccl_bref(cur, b * bsz), len * bsz,
                                        m == 1 ? HCCL_STEP_FINAL_DIV : 0, &id));
            HCCL_CHECK(hccl_plan_dep(p, rid, id));
            if (last != UINT32_MAX)
                HCCL_CHECK(hccl_plan_dep(p, last, id));
            if (m == 1 && b != (size_t)rank) {
                HCCL_CHECK(hccl_plan_send(p, rank - 1, TAG_UNFOLD,
                                          hccl_bref(HCCL_SLOT_SCRATCH, acc + b * bsz), bsz, &sid));
                HCCL_CHECK(hccl_plan_dep(p, id, sid));
            }
            prev_red = id;
        }
        last = prev_red;
        cur = HCCL_SLOT_SCRATCH;
        lo = keep;
    }
    return hcclSuccess;
}

typedef enum { RS_RING, RS_RECHALV } rs_kind_t;

static hcclResult_t rs_plan(rs_kind_t kind, const char *name, int rank, int nranks,
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
    else if (kind == RS_RING)
        HCCL_CHECK_GOTO(ring_build(p, rank, nranks, shape->count, esz, chunk_bytes), res, err);
    else
        HCCL_CHECK_GOTO(rechalv_build(p, rank, nranks, bsz), res, err);
finalize:
    HCCL_CHECK_GOTO(hccl_plan_finalize(p, (size_t)nranks * bsz, bsz), res, err);
    *plan_p = p;
    return hcclSuccess;

err:
    hccl_plan_release(p);
    return res;
}

hcclResult_t hccl_algo_ring_reducescatter(int rank, int nranks, const hccl_coll_shape_t *shape,
                                          size_t chunk_bytes, hccl_plan_t **plan_p)
{
    return rs_plan(RS_RING, "ring", rank, nranks, shape, chunk_bytes, plan_p);
}

/* Recursive halving needs no pipelining: chunk_bytes is unused. */
hcclResult_t hccl_algo_rechalv_reducescatter(int rank, int nranks, const hccl_coll_shape_t *shape,
                                             size_t chunk_bytes, hccl_plan_t **plan_p)
{
    (void)chunk_bytes;
    return rs_plan(RS_RECHALV, "rechalv", rank, nranks, shape, chunk_bytes, plan_p);
}
