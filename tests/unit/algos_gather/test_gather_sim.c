/*
 * AllGather (ring, recursive doubling, Bruck) and ReduceScatter (ring, recursive halving)
 * generators over the sim link at 1-9, 16, 33 and 64 ranks, in place and out of place:
 * AllGather byte for byte, ReduceScatter for every dtype and op against a reference computed in
 * double. Every plan is also checked statically: tags unique per peer and direction, and every
 * two steps that touch the same bytes (one writing) ordered by the plan's edges, with the slots
 * aliased the way an in-place call binds them.
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
    hccl_coll_t coll;
    gen_fn_t fn;
    bool chunked;
} gen_t;

static const gen_t ag_ring = {"ring allgather", HCCL_COLL_ALLGATHER, hccl_algo_ring_allgather, 1};
static const gen_t ag_recdbl = {"recdbl allgather", HCCL_COLL_ALLGATHER,
                                hccl_algo_recdbl_allgather, 0};
static const gen_t ag_bruck = {"bruck allgather", HCCL_COLL_ALLGATHER, hccl_algo_bruck_allgather,
                               0};
static const gen_t rs_ring = {"ring reducescatter", HCCL_COLL_REDUCESCATTER,
                              hccl_algo_ring_reducescatter, 1};
static const gen_t rs_rechalv = {"rechalv reducescatter", HCCL_COLL_REDUCESCATTER,
                                 hccl_algo_rechalv_reducescatter, 0};

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

/* Where a slot lies when the run binds it: in place, SEND sits inside RECV (AllGather) or
 * RECV inside SEND (ReduceScatter), exactly as the caller's pointers alias. */
static size_t slot_base(hccl_coll_t coll, bool in_place, int rank, size_t bsz, uint32_t slot)
{
    const size_t apart = (size_t)1 << 40;

    if (slot == HCCL_SLOT_SCRATCH)
        return 3 * apart;
    if (coll == HCCL_COLL_ALLGATHER)
        return slot == HCCL_SLOT_RECV ? apart : in_place ? apart + (size_t)rank * bsz : 2 * apart;
    return slot == HCCL_SLOT_SEND ? apart : in_place ? apart + (size_t)rank * bsz : 2 * apart;
}

static span_t span_of(hccl_coll_t coll, bool in_place, int rank, size_t bsz, hccl_bref_t b,
                      size_t bytes)
{
    size_t lo = slot_base(coll, in_place, rank, bsz, b.slot) + b.off;
    span_t s = {lo, lo + bytes};
    return s;
}

static bool overlap(span_t a, span_t b)
{
    return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi;
}

/* What step i writes (*w) and reads (r[0], r[1]); a copy onto itself touches nothing. */
static void step_spans(const hccl_plan_t *p, uint32_t i, hccl_coll_t coll, bool in_place,
                       size_t bsz, span_t *w, span_t *r)
{
    const hccl_step_t *s = &p->steps[i];
    span_t none = {0, 0};

    *w = r[0] = r[1] = none;
    if (s->kind != HCCL_STEP_SEND)
        *w = span_of(coll, in_place, p->rank, bsz, s->dst, s->bytes);
    if (s->kind != HCCL_STEP_RECV)
        r[0] = span_of(coll, in_place, p->rank, bsz, s->src, s->bytes);
    if (s->kind == HCCL_STEP_REDUCE)
        r[1] = span_of(coll, in_place, p->rank, bsz, s->src2, s->bytes);
    if (s->kind == HCCL_STEP_COPY && w->lo == r[0].lo)
        *w = r[0] = none;
}

static void check_plan(const gen_t *g, const hccl_plan_t *p, size_t bsz, bool in_place)
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
    for (uint32_t i = 0; i < n; i++)
        if ((left[i] = p->steps[i].ndeps) == 0)
            order[top++] = i;
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
        span_t wi, ri[2];
        step_spans(p, i, g->coll, in_place, bsz, &wi, ri);
        for (uint32_t j = i + 1; j < n; j++) {
            const hccl_step_t *sj = &p->steps[j];
            span_t wj, rj[2];
            bool conflict, ordered;
            bool xfer = si->kind == HCCL_STEP_SEND || si->kind == HCCL_STEP_RECV;
            if (xfer && si->kind == sj->kind && si->peer == sj->peer && si->tag == sj->tag)
                fail_msg("%s rank %d of %d: steps %u and %u share peer %d and tag %u", g->name,
                         p->rank, p->nranks, i, j, si->peer, si->tag);
            step_spans(p, j, g->coll, in_place, bsz, &wj, rj);
            conflict = overlap(wi, wj) || overlap(wi, rj[0]) || overlap(wi, rj[1]) ||
                       overlap(wj, ri[0]) || overlap(wj, ri[1]);
            ordered = (reach[(size_t)i * words + j / 64] >> (j % 64) & 1) ||
                      (reach[(size_t)j * words + i / 64] >> (i % 64) & 1);
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

/* Builds and checks every rank's plan, then runs them. */
static hcclResult_t run_gen(const gen_t *g, int n, const hccl_coll_shape_t *shape, size_t chunk,
                            bool in_place, void **send, void **recv, sim_result_t *out)
{
    hccl_plan_t *plans[64] = {0};
    size_t bsz = shape->count * hccl_dtype_size(shape->dtype);
    hcclResult_t res;

    for (int r = 0; r < n; r++) {
        assert_int_equal(g->fn(r, n, shape, chunk, &plans[r]), hcclSuccess);
        if (bsz == 0)
            assert_int_equal(plans[r]->nsteps, 0); /* empty blocks: nothing on either side */
        check_plan(g, plans[r], bsz, in_place);
    }
    res = sim_run_plans(n, plans, send, recv, out);
    for (int r = 0; r < n; r++)
        hccl_plan_release(plans[r]);
    return res;
}

/* Bytes rank r sends: (n-1) blocks everywhere, but a folded even rank of recursive halving
 * hands all n blocks to its partner. */
static uint64_t want_bytes(const gen_t *g, int n, int r, size_t bsz)
{
    int pof2 = 1;

    while (pof2 * 2 <= n)
        pof2 *= 2;
    if (g == &rs_rechalv && r < 2 * (n - pof2) && r % 2 == 0)
        return (uint64_t)n * bsz;
    return (uint64_t)(n - 1) * bsz;
}

/* ---- AllGather ---- */

static uint8_t pattern(int r, size_t j, unsigned seed)
{
    unsigned h = ((unsigned)r * 2654435761u) ^ ((unsigned)j * 40503u) ^ seed;
    h ^= h >> 11;
    return (uint8_t)(h * 0x9e3779b1u >> 24);
}

static void check_allgather(const gen_t *g, int n, size_t count, hcclDataType_t dt, bool in_place,
                            size_t chunk)
{
    size_t esz = hccl_dtype_size(dt), bsz = count * esz;
    unsigned seed = (unsigned)(count * 131 + (size_t)n * 17 + (size_t)dt);
    hccl_coll_shape_t shape = {HCCL_COLL_ALLGATHER, count, dt, hcclSum, 0, NULL};
    void *send[64], *recv[64];
    sim_result_t out;
    hcclResult_t res;

    for (int r = 0; r < n; r++) {
        recv[r] = malloc((size_t)n * bsz + 1);
        memset(recv[r], 0xa5, (size_t)n * bsz);
        send[r] = in_place ? (char *)recv[r] + (size_t)r * bsz : malloc(bsz + 1);
        for (size_t j = 0; j < bsz; j++)
            ((uint8_t *)send[r])[j] = pattern(r, j, seed);
    }
    res = run_gen(g, n, &shape, chunk, in_place, send, recv, &out);
    if (res != hcclSuccess)
        fail_msg("%s n=%d count=%zu %s %s chunk=%zu: result %d", g->name, n, count,
                 hccl_dtype_name(dt), in_place ? "in-place" : "out-of-place", chunk, (int)res);
    for (int r = 0; r < n; r++) {
        for (int b = 0; b < n; b++)
            for (size_t j = 0; j < bsz; j++)
                if (((uint8_t *)recv[r])[(size_t)b * bsz + j] != pattern(b, j, seed))
                    fail_msg("%s n=%d count=%zu %s %s chunk=%zu: rank %d block %d byte %zu wrong",
                             g->name, n, count, hccl_dtype_name(dt),
                             in_place ? "in-place" : "out-of-place", chunk, r, b, j);
        assert_int_equal(out.bytes_sent[r], want_bytes(g, n, r, bsz));
    }
    for (int r = 0; r < n; r++) {
        if (!in_place)
            free(send[r]);
        free(recv[r]);
    }
}

/* ---- ReduceScatter ---- */

static void check_reducescatter(const gen_t *g, int n, size_t count, hcclDataType_t dt,
                                hcclRedOp_t op, bool in_place, size_t chunk)
{
    size_t esz = hccl_dtype_size(dt), bsz = count * esz, total = (size_t)n * count;
    unsigned seed = (unsigned)(count * 31 + (size_t)dt * 7 + (size_t)op + (size_t)n * 1009);
    hccl_coll_shape_t shape = {HCCL_COLL_REDUCESCATTER, count, dt, op, 0, NULL};
    void *send[64], *recv[64];
    sim_result_t out;
    hcclResult_t res;

    for (int r = 0; r < n; r++) {
        send[r] = malloc(total * esz + 1);
        recv[r] = in_place ? (char *)send[r] + (size_t)r * bsz : malloc(bsz + 1);
        for (size_t i = 0; i < total; i++)
            store(send[r], i, dt, input_value(dt, op, r, i, seed));
    }
    res = run_gen(g, n, &shape, chunk, in_place, send, recv, &out);
    if (res != hcclSuccess)
        fail_msg("%s n=%d count=%zu %s %s %s chunk=%zu: result %d", g->name, n, count,
                 hccl_dtype_name(dt), hccl_op_name(op), in_place ? "in-place" : "out-of-place",
                 chunk, (int)res);
    for (int r = 0; r < n; r++) {
        for (size_t i = 0; i < count; i++) {
            double want = reference(dt, op, n, (size_t)r * count + i, seed);
            double got = load(recv[r], i, dt);
            bool ok = is_int(dt) ? got == want : fabs(got - want) <= tolerance(dt, want);
            if (!ok)
                fail_msg("%s n=%d count=%zu %s %s %s chunk=%zu: rank %d element %zu is %.17g, "
                         "want %.17g", g->name, n, count, hccl_dtype_name(dt), hccl_op_name(op),
                         in_place ? "in-place" : "out-of-place", chunk, r, i, got, want);
        }
        assert_int_equal(out.bytes_sent[r], want_bytes(g, n, r, bsz));
    }
    for (int r = 0; r < n; r++) {
        if (!in_place)
            free(recv[r]);
        free(send[r]);
    }
}

/* ---- matrices ---- */

/* Counts per rank count: 0, 1, a prime, one that n does not divide, and one over 4 KiB in
 * most types (several 4 KiB chunks); fewer and smaller at 33 and 64 ranks. */
static size_t counts_for(int n, size_t *counts)
{
    if (n > 16) {
        counts[0] = 0, counts[1] = 1, counts[2] = 7, counts[3] = 67;
        return 4;
    }
    counts[0] = 0, counts[1] = 1, counts[2] = 13, counts[3] = (size_t)n * 37 + 1,
    counts[4] = 1031;
    return 5;
}

/* Chunk sizes only matter for the chunked generators, and only once a block exceeds 4 KiB. */
static size_t chunks_for(const gen_t *g, size_t bsz, size_t *chunks)
{
    chunks[0] = 4096;
    chunks[1] = 1u << 20;
    return g->chunked && bsz > 4096 ? 2 : 1;
}

static void allgather_matrix(const gen_t *g)
{
    static const hcclDataType_t dts[] = {hcclInt8, hcclFloat16, hcclFloat32, hcclFloat64};

    for (size_t k = 0; k < NRANK_COUNTS; k++) {
        int n = rank_counts[k];
        size_t counts[5], nc = counts_for(n, counts);
        for (size_t c = 0; c < nc; c++)
            for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
                size_t chunks[2], nch = chunks_for(g, counts[c] * hccl_dtype_size(dts[d]), chunks);
                for (size_t ch = 0; ch < nch; ch++)
                    for (int ip = 0; ip < 2; ip++)
                        check_allgather(g, n, counts[c], dts[d], ip, chunks[ch]);
            }
    }
    /* Large blocks: many 4 KiB chunks in flight at once, or a few 1 MiB ones. */
    check_allgather(g, 3, (1u << 18) + 3, hcclFloat32, false, 4096);
    check_allgather(g, 8, (1u << 18), hcclInt8, true, 4096);
    check_allgather(g, 5, (1u << 19) + 1, hcclFloat64, true, 1u << 20);
}

static void reducescatter_matrix(const gen_t *g)
{
    for (size_t k = 0; k < NRANK_COUNTS; k++) {
        int n = rank_counts[k];
        size_t counts[5], nc = counts_for(n, counts);
        for (size_t c = 0; c < nc; c++)
            for (int dt = 0; dt < hcclNumTypes; dt++) {
                size_t chunks[2];
                size_t nch = chunks_for(g, counts[c] * hccl_dtype_size((hcclDataType_t)dt), chunks);
                for (int op = 0; op < hcclNumOps; op++)
                    for (size_t ch = 0; ch < nch; ch++)
                        for (int ip = 0; ip < 2; ip++)
                            check_reducescatter(g, n, counts[c], (hcclDataType_t)dt,
                                                (hcclRedOp_t)op, ip, chunks[ch]);
            }
    }
    check_reducescatter(g, 3, (1u << 17) + 3, hcclFloat32, hcclSum, false, 4096);
    check_reducescatter(g, 8, (1u << 16), hcclInt32, hcclAvg, true, 4096);
    check_reducescatter(g, 5, (1u << 18) + 1, hcclBfloat16, hcclMax, true, 1u << 20);
}

/* Every rank count up to 64 once: each fold and Bruck shape, deadlock-free and hazard-free. */
static void all_rank_counts(const gen_t *g)
{
    for (int n = 1; n <= 64; n++)
        for (int ip = 0; ip < 2; ip++) {
            if (g->coll == HCCL_COLL_ALLGATHER)
                check_allgather(g, n, 3, hcclInt32, ip, 4);
            else
                check_reducescatter(g, n, 3, hcclInt32, hcclSum, ip, 4);
        }
}

#define GEN_TESTS(id, gen, matrix)                                                              \
    static void test_##id(void **state)                                                        \
    {                                                                                           \
        (void)state;                                                                            \
        matrix(&gen);                                                                           \
    }                                                                                           \
    static void test_##id##_all_ranks(void **state)                                            \
    {                                                                                           \
        (void)state;                                                                            \
        all_rank_counts(&gen);                                                                  \
    }

GEN_TESTS(ring_allgather, ag_ring, allgather_matrix)
GEN_TESTS(recdbl_allgather, ag_recdbl, allgather_matrix)
GEN_TESTS(bruck_allgather, ag_bruck, allgather_matrix)
GEN_TESTS(ring_reducescatter, rs_ring, reducescatter_matrix)
GEN_TESTS(rechalv_reducescatter, rs_rechalv, reducescatter_matrix)

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_allgather),
        cmocka_unit_test(test_ring_allgather_all_ranks),
        cmocka_unit_test(test_recdbl_allgather),
        cmocka_unit_test(test_recdbl_allgather_all_ranks),
        cmocka_unit_test(test_bruck_allgather),
        cmocka_unit_test(test_bruck_allgather_all_ranks),
        cmocka_unit_test(test_ring_reducescatter),
        cmocka_unit_test(test_ring_reducescatter_all_ranks),
        cmocka_unit_test(test_rechalv_reducescatter),
        cmocka_unit_test(test_rechalv_reducescatter_all_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
