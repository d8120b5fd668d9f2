/*
 * Rabenseifner AllReduce for large messages: a recursive-halving reduce-scatter, then a
 * recursive-doubling all-gather, each over p = 2^floor(log2 n) participants. The buffer is
 * cut into p blocks (hccl_algo_block, so nothing is padded); in the round of distance m
 * participant v keeps the m blocks [v & ~(m-1), +m) and gives away its partner's m blocks,
 * so it ends up owning block v, and the all-gather walks the same rounds backwards. With n
 * not a power of two the first 2*rem ranks fold in pairs first (the even rank hands its
 * whole buffer to the odd one and gets the result back at the end), as in recdbl.c.
 *
 * Per rank, a power of two sends 2(n-1)/n of the buffer; a folded pair one buffer more
 * each. The sums build up in RECV; partners' halves arrive in SCRATCH at the offsets they
 * have in the buffer, so every round's receive is free once the last round's reduce is
 * done. Ranges with no elements (count < p) have no steps.
 */
#include "algos/algos.h"

enum { TAG_FOLD = 0, TAG_UNFOLD = 1, TAG_ROUND0 = 2 };

#define NONE UINT32_MAX

typedef struct {
    hccl_plan_t *p;
    size_t count;
    size_t esz;
    int pof2;
    int rem;
    int v;               /* this rank's participant number */
} rab_t;

/* The real rank of participant v. */
static int real_rank(int v, int rem)
{
    return v < rem ? 2 * v + 1 : v + rem;
}

/* Byte offset of block b of p (b == p: the end of the buffer). */
static size_t block_off(const rab_t *g, int b)
{
    size_t first, len;

    hccl_algo_block(g->count, g->pof2, b, &first, &len);
    return first * g->esz;
}

/* The m blocks that start at participant v's group of distance m: [*off, *off + *len). */
static void group_range(const rab_t *g, int v, int m, size_t *off, size_t *len)
{
    int b = v & ~(m - 1);

    *off = block_off(g, b);
    *len = block_off(g, b + m) - *off;
}

static hcclResult_t dep(hccl_plan_t *p, uint32_t before, uint32_t after)
{
    return before == NONE || after == NONE ? hcclSuccess : hccl_plan_dep(p, before, after);
}

/*
 * Rounds m = p/2 .. 1 (index k), then m = 1 .. p/2. Hazards, RECV and SEND taken as one
 * buffer (in place): a round's send reads what the last reduce wrote; its receive reuses
 * SCRATCH the last reduce read; the all-gather's receive of the blocks given away in round k
 * overwrites what round k's send reads, and sends forward everything received before.
 */
static hcclResult_t rab_rounds(rab_t *g, uint32_t last_red)
{
    hccl_plan_t *p = g->p;
    hccl_slot_t cur = last_red == NONE ? HCCL_SLOT_SEND : HCCL_SLOT_RECV;
    uint32_t rs_send[32], ag_recv[32], id, rid;
    int logp = 0, nag = 0;

    while ((1 << logp) < g->pof2)
        logp++;
    for (int k = 0; k < logp; k++) {
        int m = g->pof2 >> (k + 1), peer = real_rank(g->v ^ m, g->rem);
        size_t koff, klen, goff, glen;
        uint32_t tag = TAG_ROUND0 + (uint32_t)k;

        group_range(g, g->v, m, &koff, &klen);
        group_range(g, g->v ^ m, m, &goff, &glen);
        rs_send[k] = NONE;
        if (glen) {
            HCCL_CHECK(hccl_plan_send(p, peer, tag, hccl_bref(cur, goff), glen, &rs_send[k]));
            HCCL_CHECK(dep(p, last_red, rs_send[k]));
        }
        if (klen) {
            HCCL_CHECK(hccl_plan_recv(p, peer, tag, hccl_bref(HCCL_SLOT_SCRATCH, koff), klen,
                                      &rid));
            HCCL_CHECK(dep(p, last_red, rid));
            HCCL_CHECK(hccl_plan_reduce(p, hccl_bref(HCCL_SLOT_RECV, koff), hccl_bref(cur, koff),
                                        hccl_bref(HCCL_SLOT_SCRATCH, koff), klen,
                                        m == 1 ? HCCL_STEP_FINAL_DIV : 0, &id));
            HCCL_CHECK(hccl_plan_dep(p, rid, id));
            HCCL_CHECK(dep(p, last_red, id));
            last_red = id;
        }
        cur = HCCL_SLOT_RECV;
    }
    for (int k = logp - 1; k >= 0; k--) {
        int m = g->pof2 >> (k + 1), peer = real_rank(g->v ^ m, g->rem);
        size_t off, len;
        uint32_t tag = TAG_ROUND0 + (uint32_t)(logp + (logp - 1 - k));

        group_range(g, g->v, m, &off, &len);
        if (len) {
            HCCL_CHECK(hccl_plan_send(p, peer, tag, hccl_bref(HCCL_SLOT_RECV, off), len, &id));
            HCCL_CHECK(dep(p, last_red, id));
            for (int j = 0; j < nag; j++)
                HCCL_CHECK(hccl_plan_dep(p, ag_recv[j], id));
        }
        group_range(g, g->v ^ m, m, &off, &len);
        if (len) {
            HCCL_CHECK(hccl_plan_recv(p, peer, tag, hccl_bref(HCCL_SLOT_RECV, off), len, &id));
            HCCL_CHECK(dep(p, rs_send[k], id));
            ag_recv[nag++] = id;
        }
    }
    if (g->v < g->rem) {
        HCCL_CHECK(hccl_plan_send(p, real_rank(g->v, g->rem) - 1, TAG_UNFOLD,
                                  hccl_bref(HCCL_SLOT_RECV, 0), g->count * g->esz, &id));
        HCCL_CHECK(dep(p, last_red, id));
        for (int j = 0; j < nag; j++)
            HCCL_CHECK(hccl_plan_dep(p, ag_recv[j], id));
    }
    return hcclSuccess;
}

static hcclResult_t rab_build(hccl_plan_t *p, int rank, int nranks, const hccl_coll_shape_t *shape)
{
    rab_t g = {.p = p, .count = shape->count, .esz = hccl_dtype_size(shape->dtype), .pof2 = 1};
    size_t bytes = g.count * g.esz;
    uint32_t sid, rid, last_red = NONE;

    while (g.pof2 * 2 <= nranks)
        g.pof2 *= 2;
    g.rem = nranks - g.pof2;
    if (rank < 2 * g.rem && rank % 2 == 0) {
        /* Folded out: give our data to rank+1, get the result back. */
        HCCL_CHECK(hccl_plan_send(p, rank + 1, TAG_FOLD, hccl_bref(HCCL_SLOT_SEND, 0), bytes,
                                  &sid));
        HCCL_CHECK(hccl_plan_recv(p, rank + 1, TAG_UNFOLD, hccl_bref(HCCL_SLOT_RECV, 0), bytes,
                                  &rid));
        return hccl_plan_dep(p, sid, rid); /* in place: send before overwrite */
    }
    p->scratch_bytes = bytes;
    if (rank < 2 * g.rem) {
        HCCL_CHECK(hccl_plan_recv(p, rank - 1, TAG_FOLD, hccl_bref(HCCL_SLOT_SCRATCH, 0), bytes,
                                  &rid));
        HCCL_CHECK(hccl_plan_reduce(p, hccl_bref(HCCL_SLOT_RECV, 0), hccl_bref(HCCL_SLOT_SEND, 0),
                                    hccl_bref(HCCL_SLOT_SCRATCH, 0), bytes, 0, &last_red));
        HCCL_CHECK(hccl_plan_dep(p, rid, last_red));
        g.v = rank / 2;
    } else {
        g.v = rank - g.rem;
    }
    return rab_rounds(&g, last_red);
}

/* Recursive halving and doubling need no pipelining: chunk_bytes is unused. */
hcclResult_t hccl_algo_rabenseifner_allreduce(int rank, int nranks, const hccl_coll_shape_t *shape,
                                              size_t chunk_bytes, hccl_plan_t **plan_p)
{
    hcclResult_t res;
    hccl_plan_t *p = NULL;
    size_t bytes = shape->count * hccl_dtype_size(shape->dtype);

    (void)chunk_bytes;
    HCCL_CHECK(hccl_plan_create(rank, nranks, shape->dtype, shape->op, "rabenseifner", &p));
    if (bytes == 0)
        goto finalize;
    if (nranks == 1)
        HCCL_CHECK_GOTO(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0),
                                       hccl_bref(HCCL_SLOT_SEND, 0), bytes, NULL), res, err);
    else
        HCCL_CHECK_GOTO(rab_build(p, rank, nranks, shape), res, err);
finalize:
    HCCL_CHECK_GOTO(hccl_plan_finalize(p, bytes, bytes), res, err);
    *plan_p = p;
    return hcclSuccess;

err:
    hccl_plan_release(p);
    return res;
}
