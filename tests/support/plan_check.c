#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "plan_check.h"

typedef struct {
    size_t lo, hi; /* [lo, hi) in one address space; lo == hi: none */
} span_t;

static size_t slot_base(const plan_check_t *c, uint32_t slot)
{
    const size_t apart = (size_t)1 << 40;

    if (slot == HCCL_SLOT_SCRATCH)
        return 3 * apart;
    switch (c->slots) {
    case PLAN_SLOTS_SAME: return apart;
    case PLAN_SLOTS_SEND_IN_RECV: return slot == HCCL_SLOT_RECV ? apart : apart + c->inner_off;
    case PLAN_SLOTS_RECV_IN_SEND: return slot == HCCL_SLOT_SEND ? apart : apart + c->inner_off;
    default: return slot == HCCL_SLOT_SEND ? apart : 2 * apart;
    }
}

static span_t span_of(const plan_check_t *c, hccl_bref_t b, size_t bytes)
{
    size_t lo = slot_base(c, b.slot) + b.off;
    span_t s = {lo, lo + bytes};
    return s;
}

static bool overlap(span_t a, span_t b)
{
    return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi;
}

/* What step i writes (*w) and reads (r[0], r[1]). */
static void step_spans(const hccl_plan_t *p, uint32_t i, const plan_check_t *c, span_t *w,
                       span_t *r)
{
    const hccl_step_t *s = &p->steps[i];
    span_t none = {0, 0};

    *w = r[0] = r[1] = none;
    if (s->kind != HCCL_STEP_SEND)
        *w = span_of(c, s->dst, s->bytes);
    if (s->kind != HCCL_STEP_RECV)
        r[0] = span_of(c, s->src, s->bytes);
    if (s->kind == HCCL_STEP_REDUCE)
        r[1] = span_of(c, s->src2, s->bytes);
    if (c->self_copy_noop && s->kind == HCCL_STEP_COPY && w->lo == r[0].lo)
        *w = r[0] = none;
}

static bool reaches(const uint64_t *reach, uint32_t words, uint32_t i, uint32_t j)
{
    return reach[(size_t)i * words + j / 64] >> (j % 64) & 1;
}

static bool is_xfer(const hccl_step_t *s)
{
    return s->kind == HCCL_STEP_SEND || s->kind == HCCL_STEP_RECV;
}

static const char *slots_name(plan_slots_t slots)
{
    return slots == PLAN_SLOTS_APART ? "out of place" : "in place";
}

void plan_check(const hccl_plan_t *p, const plan_check_t *c)
{
    uint32_t n = p->nsteps, words = (n + 63) / 64, top = 0, nch = c->pipeline_nch;
    uint64_t *reach;
    uint32_t *left, *order;

    if (c->max_steps && n > c->max_steps)
        return;
    reach = calloc((size_t)n * words + 1, sizeof(*reach));
    left = calloc(n + 1, sizeof(*left));
    order = calloc(n + 1, sizeof(*order));
    assert_non_null(reach);
    assert_non_null(left);
    assert_non_null(order);
    for (uint32_t i = 0; i < n; i++) {
        if (c->nonempty_steps)
            assert_true(p->steps[i].bytes > 0);
        if ((left[i] = p->steps[i].ndeps) == 0)
            order[top++] = i;
    }
    for (uint32_t k = 0; k < top; k++) { /* Kahn: order is topological */
        const hccl_step_t *s = &p->steps[order[k]];
        for (uint32_t e = 0; e < s->nsucc; e++)
            if (--left[p->succ[s->succ_first + e]] == 0)
                order[top++] = p->succ[s->succ_first + e];
    }
    assert_int_equal(top, n);
    /* reach[i] = every step that may start only after step i, in reverse topological order. */
    for (uint32_t k = n; k-- > 0;) {
        uint32_t i = order[k];
        const hccl_step_t *s = &p->steps[i];
        for (uint32_t e = 0; e < s->nsucc; e++) {
            uint32_t j = p->succ[s->succ_first + e];
            reach[(size_t)i * words + j / 64] |= 1ull << (j % 64);
            for (uint32_t w = 0; w < words; w++)
                reach[(size_t)i * words + w] |= reach[(size_t)j * words + w];
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        const hccl_step_t *si = &p->steps[i];
        bool xi = is_xfer(si);
        span_t wi, ri[2];
        step_spans(p, i, c, &wi, ri);
        for (uint32_t j = nch ? 0 : i + 1; j < n; j++) {
            const hccl_step_t *sj = &p->steps[j];
            span_t wj, rj[2];
            bool conflict, ordered;

            if (nch && xi && is_xfer(sj) && sj->tag >= nch && si->tag % nch > sj->tag - nch &&
                reaches(reach, words, i, j))
                fail_msg("%s rank %d of %d: broadcast of chunk %u waits on step %u (tag %u)",
                         c->name, p->rank, p->nranks, sj->tag - nch, i, si->tag);
            if (j <= i)
                continue;
            if (c->unique_tags && xi && si->kind == sj->kind && si->peer == sj->peer &&
                si->tag == sj->tag)
                fail_msg("%s rank %d of %d: steps %u and %u share peer %d and tag %u", c->name,
                         p->rank, p->nranks, i, j, si->peer, si->tag);
            step_spans(p, j, c, &wj, rj);
            conflict = overlap(wi, wj) || overlap(wi, rj[0]) || overlap(wi, rj[1]) ||
                       overlap(wj, ri[0]) || overlap(wj, ri[1]);
            ordered = reaches(reach, words, i, j) || reaches(reach, words, j, i);
            if (conflict && !ordered)
                fail_msg("%s rank %d of %d %s: steps %u (kind %d) and %u (kind %d) touch the same "
                         "bytes unordered", c->name, p->rank, p->nranks, slots_name(c->slots), i,
                         si->kind, j, sj->kind);
        }
    }
    free(reach);
    free(left);
    free(order);
}
