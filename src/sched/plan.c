/* The plan: a DAG of steps, built once per call shape and shared by every run of it. */
#include <stdlib.h>
#include <string.h>

#include "sched/sched.h"

hcclResult_t hccl_plan_create(int rank, int nranks, hcclDataType_t dt, hcclRedOp_t op,
                              const char *algo, hccl_plan_t **plan_p)
{
    hccl_plan_t *p = hccl_calloc(1, sizeof(*p));

    if (!p)
        return HCCL_FAIL(hcclSystemError, "plan: out of memory");
    p->rank = rank;
    p->nranks = nranks;
    p->dtype = dt;
    p->op = op;
    p->algo = algo;
    atomic_init(&p->refs, 1);
    *plan_p = p;
    return hcclSuccess;
}

void hccl_plan_retain(hccl_plan_t *plan)
{
    atomic_fetch_add(&plan->refs, 1);
}

void hccl_plan_release(hccl_plan_t *plan)
{
    if (!plan || atomic_fetch_sub(&plan->refs, 1) != 1)
        return;
    hccl_free(plan->steps);
    hccl_free(plan->edges);
    hccl_free(plan->succ);
    hccl_free(plan);
}

static hcclResult_t plan_add(hccl_plan_t *p, const hccl_step_t *s, uint32_t *id_p)
{
    if (p->final)
        return HCCL_FAIL(hcclInternalError, "plan: step added after finalize");
    if (p->nsteps == p->cap) {
        uint32_t cap = p->cap ? p->cap * 2 : 64;
        hccl_step_t *steps = hccl_realloc(p->steps, cap * sizeof(*steps));
        if (!steps)
            return HCCL_FAIL(hcclSystemError, "plan: out of memory for %u steps", cap);
        p->steps = steps;
        p->cap = cap;
    }
    p->steps[p->nsteps] = *s;
    if (id_p)
        *id_p = p->nsteps;
    p->nsteps++;
    return hcclSuccess;
}

hcclResult_t hccl_plan_send(hccl_plan_t *p, int peer, uint32_t tag, hccl_bref_t src, size_t bytes,
                            uint32_t *id_p)
{
    hccl_step_t s = {.kind = HCCL_STEP_SEND, .peer = peer, .tag = tag, .src = src, .bytes = bytes};

    return plan_add(p, &s, id_p);
}

hcclResult_t hccl_plan_recv(hccl_plan_t *p, int peer, uint32_t tag, hccl_bref_t dst, size_t bytes,
                            uint32_t *id_p)
{
    hccl_step_t s = {.kind = HCCL_STEP_RECV, .peer = peer, .tag = tag, .dst = dst, .bytes = bytes};

    return plan_add(p, &s, id_p);
}

hcclResult_t hccl_plan_reduce(hccl_plan_t *p, hccl_bref_t dst, hccl_bref_t a, hccl_bref_t b,
                              size_t bytes, unsigned flags, uint32_t *id_p)
{
    hccl_step_t s = {.kind = HCCL_STEP_REDUCE, .flags = (uint8_t)flags, .peer = -1, .dst = dst,
                     .src = a, .src2 = b, .bytes = bytes};

    return plan_add(p, &s, id_p);
}

hcclResult_t hccl_plan_copy(hccl_plan_t *p, hccl_bref_t dst, hccl_bref_t src, size_t bytes,
                            uint32_t *id_p)
{
    return hccl_plan_copy_flags(p, dst, src, bytes, 0, id_p);
}

hcclResult_t hccl_plan_copy_flags(hccl_plan_t *p, hccl_bref_t dst, hccl_bref_t src, size_t bytes,
                                  unsigned flags, uint32_t *id_p)
{
    hccl_step_t s = {.kind = HCCL_STEP_COPY, .flags = (uint8_t)flags, .peer = -1, .dst = dst,
                     .src = src, .bytes = bytes};

    return plan_add(p, &s, id_p);
}

static hccl_bref_t embed_bref(const hccl_plan_embed_t *e, hccl_bref_t b)
{
    hccl_bref_t at = e->slot_map[b.slot];

    return hccl_bref((hccl_slot_t)at.slot, at.off + b.off);
}

hcclResult_t hccl_plan_embed(hccl_plan_t *p, const hccl_plan_t *sub, const hccl_plan_embed_t *e,
                             uint32_t *first_p)
{
    uint32_t first = p->nsteps;

    if (!sub->final)
        return HCCL_FAIL(hcclInternalError, "plan: embedding a plan that is not finalized");
    for (uint32_t i = 0; i < sub->nsteps; i++) {
        hccl_step_t s = sub->steps[i];
        if (s.kind == HCCL_STEP_SEND || s.kind == HCCL_STEP_RECV) {
            s.peer = e->peer_map[s.peer];
            s.tag += e->tag_base;
        }
        s.dst = embed_bref(e, s.dst);
        s.src = embed_bref(e, s.src);
        s.src2 = embed_bref(e, s.src2);
        s.flags &= (uint8_t)~HCCL_STEP_FINAL_DIV;
        s.ndeps = s.succ_first = s.nsucc = 0;
        HCCL_CHECK(plan_add(p, &s, NULL));
    }
    for (uint32_t i = 0; i < sub->nsteps; i++) {
        const hccl_step_t *s = &sub->steps[i];
        for (uint32_t k = 0; k < s->nsucc; k++)
            HCCL_CHECK(hccl_plan_dep(p, first + i, first + sub->succ[s->succ_first + k]));
        for (uint32_t a = 0; s->ndeps == 0 && a < e->nafter; a++)
            HCCL_CHECK(hccl_plan_dep(p, e->after[a], first + i));
    }
    *first_p = first;
    return hcclSuccess;
}

hcclResult_t hccl_plan_dep(hccl_plan_t *p, uint32_t before, uint32_t after)
{
    if (before >= p->nsteps || after >= p->nsteps || before == after)
        return HCCL_FAIL(hcclInternalError, "plan: bad edge %u -> %u (%u steps)", before, after,
                         p->nsteps);
    if (p->nedges == p->edge_cap) {
        uint32_t cap = p->edge_cap ? p->edge_cap * 2 : 128;
        uint32_t *e = hccl_realloc(p->edges, (size_t)cap * 2 * sizeof(*e));
        if (!e)
            return HCCL_FAIL(hcclSystemError, "plan: out of memory for %u edges", cap);
        p->edges = e;
        p->edge_cap = cap;
    }
    p->edges[2 * p->nedges] = before;
    p->edges[2 * p->nedges + 1] = after;
    p->nedges++;
    return hcclSuccess;
}

static bool bref_fits(hccl_bref_t b, size_t bytes, const size_t *slot_bytes)
{
    return b.slot < HCCL_NUM_SLOTS && b.off <= slot_bytes[b.slot] &&
           bytes <= slot_bytes[b.slot] - b.off;
}

static hcclResult_t plan_check_ranges(const hccl_plan_t *p, const size_t *slot_bytes)
{
    for (uint32_t i = 0; i < p->nsteps; i++) {
        const hccl_step_t *s = &p->steps[i];
        bool ok = true;

        switch (s->kind) {
        case HCCL_STEP_SEND:
            ok = bref_fits(s->src, s->bytes, slot_bytes) && s->peer >= 0 && s->peer < p->nranks;
            break;
        case HCCL_STEP_RECV:
            ok = bref_fits(s->dst, s->bytes, slot_bytes) && s->peer >= 0 && s->peer < p->nranks &&
                 s->dst.slot != HCCL_SLOT_SEND;
            break;
        case HCCL_STEP_REDUCE:
            ok = bref_fits(s->src2, s->bytes, slot_bytes);
            /* fall through */
        case HCCL_STEP_COPY:
            ok = ok && bref_fits(s->dst, s->bytes, slot_bytes) &&
                 bref_fits(s->src, s->bytes, slot_bytes) && s->dst.slot != HCCL_SLOT_SEND;
            break;
        default:
            ok = false;
        }
        if (!ok)
            return HCCL_FAIL(hcclInternalError, "plan %s: step %u (kind %d) is out of range",
                             p->algo, i, s->kind);
    }
    return hcclSuccess;
}

typedef struct {
    uint64_t key;  /* slot << 58 | offset (checked against the slot sizes): slots sort apart */
    uint64_t end;  /* the same for the last byte + 1 */
} plan_span_t;

static int span_cmp(const void *x, const void *y)
{
    const plan_span_t *a = x, *b = y;

    return a->key < b->key ? -1 : a->key > b->key;
}

/* A span's key where SEND is part of RECV at in_place_off (UINT64_MAX: keep the slots apart). */
static uint64_t span_key(hccl_bref_t b, uint64_t in_place_off)
{
    if (b.slot == HCCL_SLOT_SEND && in_place_off != UINT64_MAX)
        return (uint64_t)HCCL_SLOT_RECV << 58 | (b.off + in_place_off);
    return (uint64_t)b.slot << 58 | b.off;
}

/* Sorts spans and makes each end the furthest end of the spans up to it (for span_hit). */
static void spans_prepare(plan_span_t *spans, size_t n)
{
    qsort(spans, n, sizeof(*spans), span_cmp);
    for (size_t k = 1; k < n; k++)
        if (spans[k].end < spans[k - 1].end)
            spans[k].end = spans[k - 1].end;
}

/* Whether [first, last) overlaps one of the prepared spans. */
static bool span_hit(const plan_span_t *spans, size_t n, uint64_t first, uint64_t last)
{
    size_t lo = 0, hi = n;

    /* the spans that start before our end: does the furthest of them reach past our start? */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (spans[mid].key < last)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && spans[lo - 1].end > first;
}

/*
 * Marks HCCL_STEP_FORWARDED the receives whose bytes a send of the plan reads (through RECV or
 * SCRATCH; a send from SEND reads the caller's input): their data is read again soon, so
 * it is not stored past the cache (exec.c). Counts the sends and the reduces too.
 */
static hcclResult_t plan_mark_forwarded(hccl_plan_t *p)
{
    plan_span_t *sends = hccl_malloc(((size_t)p->nsteps + 1) * sizeof(*sends));
    size_t n = 0;

    if (!sends)
        return HCCL_FAIL(hcclSystemError, "plan %s: out of memory for %u steps", p->algo, p->nsteps);
    p->nsends = 0;
    p->nreduces = 0;
    for (uint32_t i = 0; i < p->nsteps; i++) {
        hccl_step_t *s = &p->steps[i];
        s->flags &= (uint8_t)~HCCL_STEP_FORWARDED;
        p->nreduces += s->kind == HCCL_STEP_REDUCE;
        if (s->kind != HCCL_STEP_SEND)
            continue;
        p->nsends++;
        if (s->src.slot != HCCL_SLOT_SEND && s->bytes > 0) {
            uint64_t key = span_key(s->src, UINT64_MAX);
            sends[n++] = (plan_span_t){key, key + s->bytes};
        }
    }
    spans_prepare(sends, n);
    for (uint32_t i = 0; i < p->nsteps && n > 0; i++) {
        hccl_step_t *s = &p->steps[i];
        uint64_t first = span_key(s->dst, UINT64_MAX);
        if (s->kind == HCCL_STEP_RECV && s->bytes > 0 &&
            span_hit(sends, n, first, first + s->bytes))
            s->flags |= HCCL_STEP_FORWARDED;
    }
    hccl_free(sends);
    return hcclSuccess;
}

/*
 * Marks the sends whose bytes a step of the plan writes (a receive, reduce or copy):
 * HCCL_STEP_SRC_WRITTEN with the slots apart, HCCL_STEP_SRC_WRITTEN_IN_PLACE with SEND where
 * the API's in-place forms put it in RECV (at 0 where the two are the same size, at the
 * rank's block where RECV holds a block per rank), where a copy from SEND to the same bytes
 * writes nothing.
 */
static hcclResult_t plan_mark_rewritten(hccl_plan_t *p)
{
    uint64_t in_place_off = p->recv_bytes == p->send_bytes ? 0
                            : p->recv_bytes == (size_t)p->nranks * p->send_bytes
                                ? (uint64_t)p->rank * p->send_bytes
                                : UINT64_MAX;
    plan_span_t *apart = hccl_malloc(((size_t)p->nsteps + 1) * sizeof(*apart));
    plan_span_t *joined = hccl_malloc(((size_t)p->nsteps + 1) * sizeof(*joined));
    size_t na = 0, nj = 0;

    if (!apart || !joined) {
        hccl_free(apart);
        hccl_free(joined);
        return HCCL_FAIL(hcclSystemError, "plan %s: out of memory for %u steps", p->algo,
                         p->nsteps);
    }
    for (uint32_t i = 0; i < p->nsteps; i++) {
        const hccl_step_t *s = &p->steps[i];
        uint64_t key;
        if (s->kind == HCCL_STEP_SEND || s->bytes == 0)
            continue;
        key = span_key(s->dst, UINT64_MAX);
        apart[na++] = (plan_span_t){key, key + s->bytes};
        key = span_key(s->dst, in_place_off);
        if (in_place_off != UINT64_MAX &&
            !(s->kind == HCCL_STEP_COPY && span_key(s->src, in_place_off) == key))
            joined[nj++] = (plan_span_t){key, key + s->bytes};
    }
    spans_prepare(apart, na);
    spans_prepare(joined, nj);
    for (uint32_t i = 0; i < p->nsteps; i++) {
        hccl_step_t *s = &p->steps[i];
        uint64_t key;
        s->flags &= (uint8_t) ~(HCCL_STEP_SRC_WRITTEN | HCCL_STEP_SRC_WRITTEN_IN_PLACE);
        if (s->kind != HCCL_STEP_SEND || s->bytes == 0)
            continue;
        key = span_key(s->src, UINT64_MAX);
        if (span_hit(apart, na, key, key + s->bytes))
            s->flags |= HCCL_STEP_SRC_WRITTEN;
        key = span_key(s->src, in_place_off);
        if (in_place_off != UINT64_MAX && span_hit(joined, nj, key, key + s->bytes))
            s->flags |= HCCL_STEP_SRC_WRITTEN_IN_PLACE;
    }
    hccl_free(apart);
    hccl_free(joined);
    return hcclSuccess;
}

/* Kahn's algorithm over the successor lists: every step must be reachable in order. */
static hcclResult_t plan_check_acyclic(const hccl_plan_t *p)
{
    uint32_t *left = hccl_malloc(((size_t)p->nsteps + 1) * sizeof(*left));
    uint32_t *stack = hccl_malloc(((size_t)p->nsteps + 1) * sizeof(*stack));
    uint32_t top = 0, seen = 0;
    hcclResult_t res = hcclSuccess;

    if (!left || !stack) {
        res = HCCL_FAIL(hcclSystemError, "plan: out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < p->nsteps; i++) {
        left[i] = p->steps[i].ndeps;
        if (left[i] == 0)
            stack[top++] = i;
    }
    while (top > 0) {
        const hccl_step_t *s = &p->steps[stack[--top]];
        seen++;
        for (uint32_t k = 0; k < s->nsucc; k++) {
            uint32_t n = p->succ[s->succ_first + k];
            if (--left[n] == 0)
                stack[top++] = n;
        }
    }
    if (seen != p->nsteps)
        res = HCCL_FAIL(hcclInternalError, "plan %s: dependency cycle", p->algo);
out:
    hccl_free(left);
    hccl_free(stack);
    return res;
}

hcclResult_t hccl_plan_finalize(hccl_plan_t *p, size_t send_bytes, size_t recv_bytes)
{
    size_t slot_bytes[HCCL_NUM_SLOTS] = {send_bytes, recv_bytes, p->scratch_bytes};
    uint32_t *fill;

    HCCL_CHECK(plan_check_ranges(p, slot_bytes));
    p->send_bytes = send_bytes;
    p->recv_bytes = recv_bytes;
    HCCL_CHECK(plan_mark_forwarded(p));
    HCCL_CHECK(plan_mark_rewritten(p));
    p->succ = hccl_malloc(((size_t)p->nedges + 1) * sizeof(*p->succ));
    fill = hccl_calloc((size_t)p->nsteps + 1, sizeof(*fill));
    if (!p->succ || !fill) {
        hccl_free(fill);
        return HCCL_FAIL(hcclSystemError, "plan: out of memory for %u edges", p->nedges);
    }
    for (uint32_t i = 0; i < p->nsteps; i++)
        p->steps[i].ndeps = p->steps[i].nsucc = 0;
    for (uint32_t e = 0; e < p->nedges; e++) {
        p->steps[p->edges[2 * e]].nsucc++;
        p->steps[p->edges[2 * e + 1]].ndeps++;
    }
    for (uint32_t i = 0, off = 0; i < p->nsteps; i++) {
        p->steps[i].succ_first = off;
        off += p->steps[i].nsucc;
    }
    for (uint32_t e = 0; e < p->nedges; e++) {
        hccl_step_t *s = &p->steps[p->edges[2 * e]];
        p->succ[s->succ_first + fill[p->edges[2 * e]]++] = p->edges[2 * e + 1];
    }
    hccl_free(fill);
    hccl_free(p->edges);
    p->edges = NULL;
    p->final = true;
    return plan_check_acyclic(p);
}
