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
 * each. The sums build up in RECV. What is to be added moves in chunks of at most
 * chunk_bytes, each received into a scratch slot (hccl_slots_t) and reduced as soon as it is
 * there, so the scratch stays a few chunks in cache whatever the size, and a round's reduces
 * overlap its receives. Ranges with no elements (count < p) have no steps.
 */
#include "algos/algos.h"



#define NONE UINT32_MAX

/* However small the chunks asked for, a range is cut into at most this many (steps and tags
 * stay bounded); larger ranges get larger chunks. */
#define RAB_MAX_CHUNKS 256u

/* Tags: the unfold, the fold's chunks, then every round's chunks. */
#define TAG_UNFOLD 0u
#define TAG_FOLD0 1u
#define TAG_ROUND0 (1u + RAB_MAX_CHUNKS)

/* The steps of one phase over byte ranges, to order the next phase after what it touches. */
typedef struct {
    size_t *off, *len;
    uint32_t *id;
    uint32_t n, cap;
} rab_steps_t;

typedef struct {
    hccl_plan_t *p;
    size_t count;
    size_t esz;
    size_t chunk_elems;
    int pof2;
    int rem;
    int v;               /* this rank's participant number */
    hccl_slots_t slots;  /* received partial sums wait here for their reduce */
    rab_steps_t prev;    /* the reduces of the last round (or the fold) */
    rab_steps_t cur;
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

static size_t div_up(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

/* Chunks of a range of len bytes; sender and receiver cut the same range the same way. */
static uint32_t range_chunks(const rab_t *g, size_t len)
{
    return (uint32_t)div_up(len / g->esz, g->chunk_elems);
}

static void chunk_of(const rab_t *g, size_t off, size_t len, uint32_t nch, uint32_t j, size_t *coff,
                     size_t *clen)
{
    size_t first, n;

    hccl_algo_block(len / g->esz, (int)nch, (int)j, &first, &n);
    *coff = off + first * g->esz;
    *clen = n * g->esz;
}

static hcclResult_t steps_add(rab_steps_t *l, size_t off, size_t len, uint32_t id)
{
    if (l->n == l->cap) {
        uint32_t cap = l->cap ? 2 * l->cap : 16;
        size_t *o = hccl_realloc(l->off, cap * sizeof(*o)), *n2 = NULL;
        uint32_t *i2 = NULL;
        if (o) {
            l->off = o;
            n2 = hccl_realloc(l->len, cap * sizeof(*n2));
        }
        if (n2) {
            l->len = n2;
            i2 = hccl_realloc(l->id, cap * sizeof(*i2));
        }
        if (!i2)
            return HCCL_FAIL(hcclSystemError, "rabenseifner: out of memory");
        l->id = i2;
        l->cap = cap;
    }
    l->off[l->n] = off;
    l->len[l->n] = len;
    l->id[l->n++] = id;
    return hcclSuccess;
}

static void steps_free(rab_steps_t *l)
{
    hccl_free(l->off);
    hccl_free(l->len);
    hccl_free(l->id);
}

/* after waits for every step of l that touches [off, off + len). */
static hcclResult_t deps_on(hccl_plan_t *p, const rab_steps_t *l, size_t off, size_t len, uint32_t after)
{
    for (uint32_t i = 0; i < l->n; i++)
        if (l->off[i] < off + len && off < l->off[i] + l->len[i])
            HCCL_CHECK(hccl_plan_dep(p, l->id[i], after));
    return hcclSuccess;
}

/*
 * Round of distance m (index k): give away the partner's m blocks, receive ours from it and
 * add them, chunk by chunk: each chunk lands in a scratch slot and is reduced into RECV as
 * soon as it is there. Hazards, RECV and SEND taken as one buffer (in place): a send reads
 * what the last round's reduces wrote there; a reduce writes over what they wrote.
 */
static hcclResult_t rab_halving_round(rab_t *g, int k, hccl_slot_t src, rab_steps_t *sends)
{
    hccl_plan_t *p = g->p;
    int m = g->pof2 >> (k + 1), peer = real_rank(g->v ^ m, g->rem);
    uint32_t tag0 = TAG_ROUND0 + (uint32_t)k * RAB_MAX_CHUNKS;
    size_t koff, klen, goff, glen, off, len;
    uint32_t nch, id, rid, slot;
    hccl_bref_t tmp;

    group_range(g, g->v, m, &koff, &klen);
    group_range(g, g->v ^ m, m, &goff, &glen);
    nch = range_chunks(g, glen);
    for (uint32_t j = 0; j < nch; j++) {
        chunk_of(g, goff, glen, nch, j, &off, &len);
        HCCL_CHECK(hccl_plan_send(p, peer, tag0 + j, hccl_bref(src, off), len, &id));
        HCCL_CHECK(deps_on(p, &g->prev, off, len, id));
        HCCL_CHECK(steps_add(sends, off, len, id));
    }
    g->cur.n = 0;
    nch = range_chunks(g, klen);
    for (uint32_t j = 0; j < nch; j++) {
        chunk_of(g, koff, klen, nch, j, &off, &len);
        slot = hccl_slots_take(&g->slots, &tmp);
        HCCL_CHECK(hccl_plan_recv(p, peer, tag0 + j, tmp, len, &rid));
        HCCL_CHECK(hccl_slots_fill(&g->slots, p, slot, rid));
        HCCL_CHECK(hccl_plan_reduce(p, hccl_bref(HCCL_SLOT_RECV, off), hccl_bref(src, off), tmp, len,
                                    m == 1 ? HCCL_STEP_FINAL_DIV : 0, &id));
        HCCL_CHECK(hccl_plan_dep(p, rid, id));
        HCCL_CHECK(deps_on(p, &g->prev, off, len, id));
        hccl_slots_done(&g->slots, slot, id);
        HCCL_CHECK(steps_add(&g->cur, off, len, id));
    }
    if (nch) { /* a participant with nothing to receive keeps the last round's reduces */
        rab_steps_t t = g->prev;
        g->prev = g->cur;
        g->cur = t;
    }
    return hcclSuccess;
}

/*
 * The reduce-scatter's rounds m = p/2 .. 1, then the all-gather's m = 1 .. p/2 whole ranges
 * (RECV to RECV, nothing to stage). The all-gather's receive of the blocks given away in
 * round k overwrites what round k's sends read; its sends forward everything received
 * before.
 */
static hcclResult_t rab_rounds(rab_t *g, bool folded_in)
{
    hccl_plan_t *p = g->p;
    hccl_slot_t src = folded_in ? HCCL_SLOT_RECV : HCCL_SLOT_SEND;
    rab_steps_t rs_send[32] = {{0}};
    uint32_t ag_recv[32], id;
    int logp = 0, nag = 0;
    hcclResult_t res = hcclSuccess;

    while ((1 << logp) < g->pof2)
        logp++;
    for (int k = 0; k < logp && res == hcclSuccess; k++) {
        res = rab_halving_round(g, k, src, &rs_send[k]);
        src = HCCL_SLOT_RECV;
    }
    for (int k = logp - 1; k >= 0 && res == hcclSuccess; k--) {
        int m = g->pof2 >> (k + 1), peer = real_rank(g->v ^ m, g->rem);
        size_t off, len;
        uint32_t tag = TAG_ROUND0 + (uint32_t)(logp + (logp - 1 - k)) * RAB_MAX_CHUNKS;

        group_range(g, g->v, m, &off, &len);
        if (len) {
            HCCL_CHECK_GOTO(hccl_plan_send(p, peer, tag, hccl_bref(HCCL_SLOT_RECV, off), len, &id), res, out);
            HCCL_CHECK_GOTO(deps_on(p, &g->prev, off, len, id), res, out);
            for (int j = 0; j < nag; j++)
                HCCL_CHECK_GOTO(hccl_plan_dep(p, ag_recv[j], id), res, out);
        }
        group_range(g, g->v ^ m, m, &off, &len);
        if (len) {
            HCCL_CHECK_GOTO(hccl_plan_recv(p, peer, tag, hccl_bref(HCCL_SLOT_RECV, off), len, &id), res, out);
            HCCL_CHECK_GOTO(deps_on(p, &rs_send[k], off, len, id), res, out);
            ag_recv[nag++] = id;
        }
    }
    if (res == hcclSuccess && g->v < g->rem) {
        HCCL_CHECK_GOTO(hccl_plan_send(p, real_rank(g->v, g->rem) - 1, TAG_UNFOLD,
                                       hccl_bref(HCCL_SLOT_RECV, 0), g->count * g->esz, &id), res, out);
        HCCL_CHECK_GOTO(deps_on(p, &g->prev, 0, g->count * g->esz, id), res, out);
        for (int j = 0; j < nag; j++)
            HCCL_CHECK_GOTO(hccl_plan_dep(p, ag_recv[j], id), res, out);
    }
out:
    for (int k = 0; k < 32; k++)
        steps_free(&rs_send[k]);
    return res;
}

static hcclResult_t rab_build(hccl_plan_t *p, int rank, int nranks, const hccl_coll_shape_t *shape,
                              size_t chunk_bytes)
{
    rab_t g = {.p = p, .count = shape->count, .esz = hccl_dtype_size(shape->dtype), .pof2 = 1};
    size_t bytes = g.count * g.esz, slot_bytes;
    uint32_t sid, rid, id, slot, nch;
    hcclResult_t res = hcclSuccess;
    hccl_bref_t tmp;

    while (g.pof2 * 2 <= nranks)
        g.pof2 *= 2;
    g.rem = nranks - g.pof2;
    g.chunk_elems = chunk_bytes / g.esz ? chunk_bytes / g.esz : 1;
    if (g.chunk_elems < div_up(g.count, RAB_MAX_CHUNKS))
        g.chunk_elems = div_up(g.count, RAB_MAX_CHUNKS);
    nch = range_chunks(&g, bytes);
    if (rank < 2 * g.rem && rank % 2 == 0) {
        /* Folded out: give our data to rank+1 (in chunks, as it adds them), get the result back. */
        HCCL_CHECK(hccl_plan_recv(p, rank + 1, TAG_UNFOLD, hccl_bref(HCCL_SLOT_RECV, 0), bytes,
                                  &rid));
        for (uint32_t j = 0; j < nch; j++) {
            size_t off, len;
            chunk_of(&g, 0, bytes, nch, j, &off, &len);
            HCCL_CHECK(hccl_plan_send(p, rank + 1, TAG_FOLD0 + j, hccl_bref(HCCL_SLOT_SEND, off), len,
                                      &sid));
            HCCL_CHECK(hccl_plan_dep(p, sid, rid)); /* in place: send before overwrite */
        }
        return hcclSuccess;
    }
    slot_bytes = (g.chunk_elems < g.count ? g.chunk_elems : g.count) * g.esz;
    hccl_slots_init(&g.slots, 0, slot_bytes);
    p->scratch_bytes = HCCL_SLOTS * slot_bytes;
    if (rank < 2 * g.rem) {
        /* The partner's whole buffer, chunk by chunk, added to ours. */
        for (uint32_t j = 0; j < nch && res == hcclSuccess; j++) {
            size_t off, len;
            chunk_of(&g, 0, bytes, nch, j, &off, &len);
            slot = hccl_slots_take(&g.slots, &tmp);
            HCCL_CHECK_GOTO(hccl_plan_recv(p, rank - 1, TAG_FOLD0 + j, tmp, len, &rid), res, out);
            HCCL_CHECK_GOTO(hccl_slots_fill(&g.slots, p, slot, rid), res, out);
            HCCL_CHECK_GOTO(hccl_plan_reduce(p, hccl_bref(HCCL_SLOT_RECV, off),
                                             hccl_bref(HCCL_SLOT_SEND, off), tmp, len, 0, &id), res, out);
            HCCL_CHECK_GOTO(hccl_plan_dep(p, rid, id), res, out);
            hccl_slots_done(&g.slots, slot, id);
            HCCL_CHECK_GOTO(steps_add(&g.prev, off, len, id), res, out);
        }
        g.v = rank / 2;
    } else {
        g.v = rank - g.rem;
    }
    res = rab_rounds(&g, rank < 2 * g.rem);
out:
    steps_free(&g.prev);
    steps_free(&g.cur);
    return res;
}

hcclResult_t hccl_algo_rabenseifner_allreduce(int rank, int nranks, const hccl_coll_shape_t *shape,
                                              size_t chunk_bytes, hccl_plan_t **plan_p)
{
    hcclResult_t res;
    hccl_plan_t *p = NULL;
    size_t bytes = shape->count * hccl_dtype_size(shape->dtype);

    HCCL_CHECK(hccl_plan_create(rank, nranks, shape->dtype, shape->op, "rabenseifner", &p));
    if (bytes == 0)
        goto finalize;
    if (nranks == 1)
        HCCL_CHECK_GOTO(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0),
                                       hccl_bref(HCCL_SLOT_SEND, 0), bytes, NULL), res, err);
    else
        HCCL_CHECK_GOTO(rab_build(p, rank, nranks, shape, chunk_bytes), res, err);
finalize:
    HCCL_CHECK_GOTO(hccl_plan_finalize(p, bytes, bytes), res, err);
    *plan_p = p;
    return hcclSuccess;

err:
    hccl_plan_release(p);
    return res;
}
