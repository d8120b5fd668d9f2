/*
 * The Rabenseifner and binomial-tree AllReduce generators over the sim link at 1-9, 16, 33
 * and 64 ranks (and once at every rank count up to 64), in place and out of place, against a
 * reference computed in double: every dtype and op up to 16 ranks, a few at 33 and 64. Each
 * rank's bytes sent are checked against the algorithm's formula, and every plan statically:
 * tags unique per peer and direction, every two steps that touch the same bytes (one writing)
 * ordered by the plan's edges with the slots aliased as an in-place call binds them, and, for
 * the tree, no broadcast of chunk c waiting on a later chunk (the phases pipeline).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sim_run.h"

typedef hcclResult_t (*gen_fn_t)(int rank, int nranks, const hccl_coll_shape_t *shape,
                                 size_t chunk_bytes, hccl_plan_t **plan_p);
typedef struct {
    const char *name;
    gen_fn_t fn;
    bool chunked;
} gen_t;

static const gen_t gen_rab = {"rabenseifner", hccl_algo_rabenseifner_allreduce, 0};
static const gen_t gen_tree = {"tree", hccl_algo_tree_allreduce, 1};

static const int rank_counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33, 64};
#define NRANK_COUNTS (sizeof(rank_counts) / sizeof(rank_counts[0]))

/* ---- reference values (as in test_allreduce_sim.c) ---- */

static bool is_int(hcclDataType_t dt);
static bool is_signed(hcclDataType_t dt);

/* Input value of element i at rank r, small enough to be exact in every float type. */
static double input_value(hcclDataType_t dt, hcclRedOp_t op, int r, size_t i, unsigned seed)
{
    unsigned h = ((unsigned)r * 7919u + (unsigned)i * 104729u) ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    if (op == hcclProd) {
        static const double f[] = {1, -1, 2, 0.5};
        double v = f[h % 4];
        if (v == 2 && r >= 8)
            v = 1; /* keep products inside fp16's range at 16 ranks */
        if (is_int(dt))
            v = (double)(h % 3) + (is_signed(dt) ? -1 : 1);
        return v;
    }
    switch (dt) {
    case hcclInt8: return (double)(int8_t)h;
    case hcclUint8: return (double)(uint8_t)h;
    case hcclInt32: return (double)(int32_t)h;
    case hcclUint32: return (double)(uint32_t)h;
    case hcclInt64: return (double)((int32_t)h) * 65536.0;
    case hcclUint64: return (double)h * 65536.0;
    default: return (double)((int)(h % 17) - 8);
    }
}

static void store(void *buf, size_t i, hcclDataType_t dt, double v)
{
    switch (dt) {
    case hcclInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case hcclUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case hcclInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case hcclUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case hcclInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case hcclUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case hcclFloat16: ((uint16_t *)buf)[i] = hccl_float_to_half((float)v); break;
    case hcclBfloat16: ((uint16_t *)buf)[i] = hccl_float_to_bf16((float)v); break;
    case hcclFloat32: ((float *)buf)[i] = (float)v; break;
    case hcclFloat64: ((double *)buf)[i] = v; break;
    default: break;
    }
}

static double load(const void *buf, size_t i, hcclDataType_t dt)
{
    switch (dt) {
    case hcclInt8: return ((const int8_t *)buf)[i];
    case hcclUint8: return ((const uint8_t *)buf)[i];
    case hcclInt32: return ((const int32_t *)buf)[i];
    case hcclUint32: return ((const uint32_t *)buf)[i];
    case hcclInt64: return (double)((const int64_t *)buf)[i];
    case hcclUint64: return (double)((const uint64_t *)buf)[i];
    case hcclFloat16: return hccl_half_to_float(((const uint16_t *)buf)[i]);
    case hcclBfloat16: return hccl_bf16_to_float(((const uint16_t *)buf)[i]);
    case hcclFloat32: return ((const float *)buf)[i];
    case hcclFloat64: return ((const double *)buf)[i];
    default: return 0;
    }
}

static bool is_int(hcclDataType_t dt)
{
    return dt <= hcclUint64;
}

static unsigned bits_of(hcclDataType_t dt)
{
    return (unsigned)hccl_dtype_size(dt) * 8;
}

static bool is_signed(hcclDataType_t dt)
{
    return dt == hcclInt8 || dt == hcclInt32 || dt == hcclInt64;
}

/* Integer reference: arithmetic modulo 2^bits, then read back with the type's sign. */
static double int_wrap(uint64_t v, hcclDataType_t dt)
{
    unsigned b = bits_of(dt);
    uint64_t m = b == 64 ? v : v & ((1ull << b) - 1);
    if (is_signed(dt) && b < 64 && (m >> (b - 1)))
        return (double)(int64_t)(m | ~((1ull << b) - 1));
    return is_signed(dt) ? (double)(int64_t)m : (double)m;
}

static double reference(hcclDataType_t dt, hcclRedOp_t op, int n, size_t i, unsigned seed)
{
    double acc = input_value(dt, op, 0, i, seed);

    if (is_int(dt)) {
        uint64_t u = (uint64_t)(int64_t)acc;
        for (int r = 1; r < n; r++) {
            double v = input_value(dt, op, r, i, seed);
            uint64_t w = (uint64_t)(int64_t)v;
            if (op == hcclSum || op == hcclAvg)
                u += w;
            else if (op == hcclProd)
                u *= w;
            else if (op == hcclMax)
                acc = v > acc ? v : acc;
            else
                acc = v < acc ? v : acc;
        }
        if (op == hcclMax || op == hcclMin)
            return acc;
        acc = int_wrap(u, dt);
        if (op == hcclAvg)
            acc = is_signed(dt) ? (double)((int64_t)acc / n)
                                : (double)((uint64_t)acc / (uint64_t)n);
        return acc;
    }
    for (int r = 1; r < n; r++) {
        double v = input_value(dt, op, r, i, seed);
        if (op == hcclSum || op == hcclAvg)
            acc += v;
        else if (op == hcclProd)
            acc *= v;
        else if (op == hcclMax)
            acc = v > acc ? v : acc;
        else
            acc = v < acc ? v : acc;
    }
    return op == hcclAvg ? acc / n : acc;
}

static double tolerance(hcclDataType_t dt, double ref)
{
    double rel = dt == hcclFloat16    ? 1e-3
                 : dt == hcclBfloat16 ? 8e-3
                 : dt == hcclFloat32  ? 1e-6
                                      : 1e-12;
    return fabs(ref) * rel + rel;
}

/* ---- static plan checks ---- */

typedef struct {
    size_t lo, hi; /* [lo, hi) in one address space; lo == hi: none */
} span_t;

/* In place, SEND and RECV are the same memory. */
static span_t span_of(bool in_place, hccl_bref_t b, size_t bytes)
{
    const size_t apart = (size_t)1 << 40;
    size_t base = b.slot == HCCL_SLOT_SCRATCH ? 3 * apart
                  : b.slot == HCCL_SLOT_RECV && !in_place ? 2 * apart
                                                          : apart;
    span_t s = {base + b.off, base + b.off + bytes};
    return s;
}

static bool overlap(span_t a, span_t b)
{
    return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi;
}

/* What step i writes (*w) and reads (r[0], r[1]); a copy onto itself touches nothing. */
static void step_spans(const hccl_plan_t *p, uint32_t i, bool in_place, span_t *w, span_t *r)
{
    const hccl_step_t *s = &p->steps[i];
    span_t none = {0, 0};

    *w = r[0] = r[1] = none;
    if (s->kind != HCCL_STEP_SEND)
        *w = span_of(in_place, s->dst, s->bytes);
    if (s->kind != HCCL_STEP_RECV)
        r[0] = span_of(in_place, s->src, s->bytes);
    if (s->kind == HCCL_STEP_REDUCE)
        r[1] = span_of(in_place, s->src2, s->bytes);
    if (s->kind == HCCL_STEP_COPY && w->lo == r[0].lo)
        *w = r[0] = none;
}

static bool reaches(const uint64_t *reach, uint32_t words, uint32_t i, uint32_t j)
{
    return reach[(size_t)i * words + j / 64] >> (j % 64) & 1;
}

/* nch > 0: the tree's chunk count (reduce tag c, broadcast tag nch + c). */
static void check_plan(const gen_t *g, const hccl_plan_t *p, bool in_place, uint32_t nch)
{
    uint32_t n = p->nsteps, words = (n + 63) / 64, top = 0;
    uint64_t *reach;
    uint32_t *left, *order;

    if (n > 1500)
        return; /* the pairwise check is quadratic; large counts only change chunking */
    reach = calloc((size_t)n * words + 1, sizeof(*reach));
    left = calloc(n + 1, sizeof(*left));
    order = calloc(n + 1, sizeof(*order));
    assert_non_null(reach);
    assert_non_null(left);
    assert_non_null(order);
    for (uint32_t i = 0; i < n; i++) {
        assert_true(p->steps[i].bytes > 0); /* no empty transfers or reduces */
        if ((left[i] = p->steps[i].ndeps) == 0)
            order[top++] = i;
    }
    for (uint32_t k = 0; k < top; k++) {
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
        bool xi = si->kind == HCCL_STEP_SEND || si->kind == HCCL_STEP_RECV;
        span_t wi, ri[2];
        step_spans(p, i, in_place, &wi, ri);
        for (uint32_t j = 0; j < n; j++) {
            const hccl_step_t *sj = &p->steps[j];
            bool xj = sj->kind == HCCL_STEP_SEND || sj->kind == HCCL_STEP_RECV;
            span_t wj, rj[2];
            bool conflict, ordered;

            /* Pipelining: a broadcast step of chunk c never waits on a transfer of a later
             * chunk. */
            if (nch && xi && xj && sj->tag >= nch && si->tag % nch > sj->tag - nch &&
                reaches(reach, words, i, j))
                fail_msg("%s rank %d of %d: broadcast of chunk %u waits on step %u (tag %u)",
                         g->name, p->rank, p->nranks, sj->tag - nch, i, si->tag);
            if (j <= i)
                continue;
            if (xi && si->kind == sj->kind && si->peer == sj->peer && si->tag == sj->tag)
                fail_msg("%s rank %d of %d: steps %u and %u share peer %d and tag %u", g->name,
                         p->rank, p->nranks, i, j, si->peer, si->tag);
            step_spans(p, j, in_place, &wj, rj);
            conflict = overlap(wi, wj) || overlap(wi, rj[0]) || overlap(wi, rj[1]) ||
                       overlap(wj, ri[0]) || overlap(wj, ri[1]);
            ordered = reaches(reach, words, i, j) || reaches(reach, words, j, i);
            if (conflict && !ordered)
                fail_msg("%s rank %d of %d %s: steps %u (kind %d) and %u (kind %d) touch the same "
                         "bytes unordered", g->name, p->rank, p->nranks,
                         in_place ? "in place" : "out of place", i, si->kind, j, sj->kind);
        }
    }
    free(reach);
    free(left);
    free(order);
}

/* ---- expected bytes ---- */

static int pof2_of(int n)
{
    int p = 1;

    while (p * 2 <= n)
        p *= 2;
    return p;
}

/* Elements in blocks [b, b + m) of p blocks over count. */
static size_t blocks_len(size_t count, int p, int b, int m)
{
    size_t f0, f1, len;

    hccl_algo_block(count, p, b, &f0, &len);
    hccl_algo_block(count, p, b + m, &f1, &len);
    return f1 - f0;
}

/*
 * Rabenseifner: a participant v sends every block but its own in the reduce-scatter and, in
 * the all-gather, its group of 1, 2, ..., p/2 blocks; a folded pair sends the buffer once
 * more each (the even rank only that).
 */
static uint64_t rab_bytes(int n, int r, size_t count, size_t esz)
{
    int p = pof2_of(n), rem = n - p, v = r < 2 * rem ? r / 2 : r - rem;
    uint64_t elems = 0;

    if (n == 1)
        return 0;
    if (r < 2 * rem && r % 2 == 0)
        return count * esz;
    elems = count - blocks_len(count, p, v, 1);
    for (int m = 1; m < p; m *= 2)
        elems += blocks_len(count, p, v & ~(m - 1), m);
    if (r < 2 * rem)
        elems += count;
    return elems * esz;
}

/* Tree: the buffer once up (not the root) and once to each child. */
static uint64_t tree_bytes(int n, int r, size_t count, size_t esz)
{
    int span = r > 0 ? (r & -r) : 2 * n, kids = 0;

    for (int m = 1; m < span && r + m < n; m *= 2)
        kids++;
    return (uint64_t)((r > 0) + kids) * count * esz;
}

/* The tree's chunk count, as the generator cuts the buffer. */
static uint32_t tree_nch(size_t count, size_t esz, size_t chunk)
{
    size_t ce = chunk / esz ? chunk / esz : 1, min = (count + 65535) / 65536;

    if (ce < min)
        ce = min;
    return (uint32_t)((count + ce - 1) / ce);
}

/* ---- one run ---- */

static void check_allreduce(const gen_t *g, int n, size_t count, hcclDataType_t dt,
                            hcclRedOp_t op, bool in_place, size_t chunk)
{
    size_t esz = hccl_dtype_size(dt), bytes = count * esz;
    unsigned seed = (unsigned)(count * 31 + (size_t)dt * 7 + (size_t)op + (size_t)n * 1009);
    hccl_coll_shape_t shape = {HCCL_COLL_ALLREDUCE, count, dt, op, 0, NULL};
    hccl_plan_t *plans[64] = {0};
    void *send[64], *recv[64];
    uint64_t total = 0;
    sim_result_t out;
    hcclResult_t res;

    for (int r = 0; r < n; r++) {
        send[r] = malloc(bytes + 1);
        recv[r] = in_place ? send[r] : malloc(bytes + 1);
        for (size_t i = 0; i < count; i++)
            store(send[r], i, dt, input_value(dt, op, r, i, seed));
        if (!in_place)
            memset(recv[r], 0x5a, bytes);
    }
    for (int r = 0; r < n; r++) {
        assert_int_equal(g->fn(r, n, &shape, chunk, &plans[r]), hcclSuccess);
        if (bytes == 0)
            assert_int_equal(plans[r]->nsteps, 0);
        /* Plans differ across ops only in the divide flag: one op's plans stand for all. */
        if (op == hcclSum || n > 16)
            check_plan(g, plans[r], in_place, g == &gen_tree ? tree_nch(count, esz, chunk) : 0);
    }
    res = sim_run_plans(n, plans, send, recv, &out);
    for (int r = 0; r < n; r++)
        hccl_plan_release(plans[r]);
    if (res != hcclSuccess)
        fail_msg("%s n=%d count=%zu %s %s %s chunk=%zu: result %d", g->name, n, count,
                 hccl_dtype_name(dt), hccl_op_name(op), in_place ? "in-place" : "out-of-place",
                 chunk, (int)res);
    for (int r = 0; r < n; r++) {
        uint64_t want_b = g == &gen_rab ? rab_bytes(n, r, count, esz) : tree_bytes(n, r, count, esz);
        for (size_t i = 0; i < count; i++) {
            double want = reference(dt, op, n, i, seed), got = load(recv[r], i, dt);
            bool ok = is_int(dt) ? got == want : fabs(got - want) <= tolerance(dt, want);
            if (!ok)
                fail_msg("%s n=%d count=%zu %s %s %s chunk=%zu: rank %d element %zu is %.17g, "
                         "want %.17g", g->name, n, count, hccl_dtype_name(dt), hccl_op_name(op),
                         in_place ? "in-place" : "out-of-place", chunk, r, i, got, want);
        }
        if (out.bytes_sent[r] != want_b)
            fail_msg("%s n=%d count=%zu %s: rank %d sent %llu bytes, want %llu", g->name, n, count,
                     hccl_dtype_name(dt), r, (unsigned long long)out.bytes_sent[r],
                     (unsigned long long)want_b);
        total += out.bytes_sent[r];
    }
    /* Rabenseifner on a power of two: 2(n-1)/n of the buffer per rank where n divides count,
     * 2(n-1) buffers over all ranks always; a fold costs a buffer each way per pair. */
    if (g == &gen_rab && n > 1) {
        int p = pof2_of(n);
        assert_int_equal(total, (uint64_t)(2 * (p - 1) + 2 * (n - p)) * bytes);
        if (p == n && count % (size_t)n == 0)
            for (int r = 0; r < n; r++)
                assert_int_equal(out.bytes_sent[r], 2 * (uint64_t)(n - 1) * bytes / (uint64_t)n);
    }
    for (int r = 0; r < n; r++) {
        free(send[r]);
        if (!in_place)
            free(recv[r]);
    }
}

/* ---- matrices ---- */

/* Counts per rank count: 0, 1, a prime, one that n does not divide, one n divides, and one
 * over 4 KiB in most types; fewer and smaller at 33 and 64 ranks. */
static size_t counts_for(int n, size_t *counts)
{
    if (n > 16) {
        counts[0] = 0, counts[1] = 1, counts[2] = 7, counts[3] = (size_t)n + 2;
        return 4;
    }
    counts[0] = 0, counts[1] = 1, counts[2] = 13, counts[3] = (size_t)n * 37 + 1,
    counts[4] = (size_t)n * 8, counts[5] = 1031;
    return 6;
}

/* The tree's chunks: the harness's 4 KiB, and 64 bytes so that small buffers pipeline too. */
static size_t chunks_for(const gen_t *g, size_t *chunks)
{
    chunks[0] = 4096;
    chunks[1] = 64;
    return g->chunked ? 2 : 1;
}

static void matrix(const gen_t *g)
{
    static const hcclDataType_t big_dts[] = {hcclInt32, hcclFloat16, hcclFloat64};

    for (size_t k = 0; k < NRANK_COUNTS; k++) {
        int n = rank_counts[k];
        size_t counts[6], nc = counts_for(n, counts), chunks[2], nch = chunks_for(g, chunks);
        for (size_t c = 0; c < nc; c++)
            for (size_t ch = 0; ch < nch; ch++)
                for (int ip = 0; ip < 2; ip++) {
                    if (chunks[ch] < 4096 && counts[c] > 1000)
                        continue; /* 4 KiB chunks already cut it; hundreds more add nothing */
                    if (n > 16) { /* a few types and ops: the shapes matter here */
                        for (size_t d = 0; d < sizeof(big_dts) / sizeof(big_dts[0]); d++)
                            check_allreduce(g, n, counts[c], big_dts[d],
                                            d == 0 ? hcclSum : d == 1 ? hcclAvg : hcclMax, ip,
                                            chunks[ch]);
                        continue;
                    }
                    for (int dt = 0; dt < hcclNumTypes; dt++)
                        for (int op = 0; op < hcclNumOps; op++)
                            check_allreduce(g, n, counts[c], (hcclDataType_t)dt, (hcclRedOp_t)op,
                                            ip, chunks[ch]);
                }
    }
}

/* Every rank count up to 64 once: each fold and tree shape, deadlock-free and hazard-free. */
static void all_rank_counts(const gen_t *g)
{
    for (int n = 1; n <= 64; n++)
        for (int ip = 0; ip < 2; ip++) {
            check_allreduce(g, n, 3, hcclInt32, hcclSum, ip, 4);
            check_allreduce(g, n, 100, hcclFloat32, hcclAvg, ip, 64);
        }
}

static void test_rabenseifner(void **state)
{
    (void)state;
    matrix(&gen_rab);
}

static void test_rabenseifner_all_ranks(void **state)
{
    (void)state;
    all_rank_counts(&gen_rab);
}

static void test_rabenseifner_large(void **state)
{
    (void)state;
    check_allreduce(&gen_rab, 5, (1u << 18) + 7, hcclFloat32, hcclSum, false, 4096);
    check_allreduce(&gen_rab, 8, 1u << 18, hcclInt32, hcclAvg, true, 4096);
    check_allreduce(&gen_rab, 16, (1u << 17) + 1, hcclBfloat16, hcclMax, true, 4096);
}

static void test_tree(void **state)
{
    (void)state;
    matrix(&gen_tree);
}

static void test_tree_all_ranks(void **state)
{
    (void)state;
    all_rank_counts(&gen_tree);
}

/* Many chunks in flight, and a buffer so large for its chunk size that the chunk cap applies. */
static void test_tree_large(void **state)
{
    (void)state;
    check_allreduce(&gen_tree, 6, (1u << 18) + 3, hcclFloat32, hcclSum, false, 4096);
    check_allreduce(&gen_tree, 16, 1u << 17, hcclInt32, hcclAvg, true, 4096);
    check_allreduce(&gen_tree, 3, (1u << 17) + 5, hcclInt32, hcclSum, true, 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rabenseifner),
        cmocka_unit_test(test_rabenseifner_all_ranks),
        cmocka_unit_test(test_rabenseifner_large),
        cmocka_unit_test(test_tree),
        cmocka_unit_test(test_tree_all_ranks),
        cmocka_unit_test(test_tree_large),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
