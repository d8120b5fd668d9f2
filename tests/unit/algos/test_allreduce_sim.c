/*
 * AllReduce algorithms over the sim link at 1-9 and 16 ranks: every dtype and
 * op, in-place and out-of-place, counts that do and do not divide by the rank
 * count, against a reference computed in double (integers exactly, with wrap).
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

static const int rank_counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};

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
            acc = is_signed(dt) ? (double)((int64_t)acc / n) : (double)((uint64_t)acc / (uint64_t)n);
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
    double rel = dt == hcclFloat16 ? 1e-3 : dt == hcclBfloat16 ? 8e-3 : dt == hcclFloat32 ? 1e-6 : 1e-12;
    return fabs(ref) * rel + rel;
}

static void check_allreduce(hccl_algo_t algo, int n, size_t count, hcclDataType_t dt,
                            hcclRedOp_t op, bool in_place)
{
    size_t esz = hccl_dtype_size(dt);
    void *send[64], *recv[64];
    unsigned seed = (unsigned)(count * 31 + (size_t)dt * 7 + (size_t)op);
    hccl_coll_shape_t shape = {HCCL_COLL_ALLREDUCE, count, dt, op, 0, NULL};
    sim_result_t out;
    hcclResult_t res;

    for (int r = 0; r < n; r++) {
        send[r] = malloc(count * esz + 1);
        recv[r] = in_place ? send[r] : malloc(count * esz + 1);
        for (size_t i = 0; i < count; i++)
            store(send[r], i, dt, input_value(dt, op, r, i, seed));
    }
    res = sim_run_allreduce(algo, n, &shape, send, recv, &out);
    if (res != hcclSuccess)
        fail_msg("%s n=%d count=%zu %s %s %s: result %d", hccl_algo_name(algo), n, count,
                 hccl_dtype_name(dt), hccl_op_name(op), in_place ? "in-place" : "out-of-place",
                 (int)res);
    for (int r = 0; r < n; r++) {
        for (size_t i = 0; i < count; i++) {
            double want = reference(dt, op, n, i, seed), got = load(recv[r], i, dt);
            bool ok = is_int(dt) ? got == want : fabs(got - want) <= tolerance(dt, want);
            if (!ok)
                fail_msg("%s n=%d count=%zu %s %s %s: rank %d element %zu is %.17g, want %.17g",
                         hccl_algo_name(algo), n, count, hccl_dtype_name(dt), hccl_op_name(op),
                         in_place ? "in-place" : "out-of-place", r, i, got, want);
        }
    }
    /* Ring: every block but one crosses each link twice, so 2(n-1)/n of the buffer per rank. */
    if (algo == HCCL_ALGO_RING && n > 1) {
        for (int r = 0; r < n; r++) {
            size_t f, l1, l2;
            hccl_algo_block(count, n, (r + 1) % n, &f, &l1);
            hccl_algo_block(count, n, (r + 2) % n, &f, &l2);
            assert_int_equal(out.bytes_sent[r], (2 * count - l1 - l2) * esz);
        }
    }
    for (int r = 0; r < n; r++) {
        free(send[r]);
        if (!in_place)
            free(recv[r]);
    }
}

static void run_matrix(hccl_algo_t algo)
{
    for (size_t k = 0; k < sizeof(rank_counts) / sizeof(rank_counts[0]); k++) {
        int n = rank_counts[k];
        /* Fixed ones, plus two drawn from a seeded generator (printed on failure with the rest). */
        unsigned seed = 12345u + (unsigned)n;
        size_t counts[] = {1, (size_t)n - 1, 13, 1031, (size_t)n * 600 + 3, 0, 0};
        for (int j = 5; j < 7; j++) {
            seed = seed * 1103515245u + 12345u;
            counts[j] = 1 + (seed >> 8) % 5000;
        }
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            if (counts[c] == 0)
                continue;
            for (int dt = 0; dt < hcclNumTypes; dt++)
                for (int op = 0; op < hcclNumOps; op++)
                    for (int ip = 0; ip < 2; ip++)
                        check_allreduce(algo, n, counts[c], (hcclDataType_t)dt, (hcclRedOp_t)op,
                                        ip);
        }
    }
}

static void test_ring(void **state)
{
    (void)state;
    run_matrix(HCCL_ALGO_RING);
}

static void test_recdbl(void **state)
{
    (void)state;
    run_matrix(HCCL_ALGO_RECDBL);
}

/* Recursive doubling sends log2(p) whole buffers; folded ranks one more each way. */
static void test_recdbl_bytes(void **state)
{
    (void)state;
    for (int n = 2; n <= 16; n++) {
        size_t count = 100;
        float *send[64], *recv[64];
        hccl_coll_shape_t shape = {HCCL_COLL_ALLREDUCE, count, hcclFloat32, hcclSum, 0, NULL};
        sim_result_t out;
        int pof2 = 1, logp = 0;
        while (pof2 * 2 <= n) {
            pof2 *= 2;
            logp++;
        }
        for (int r = 0; r < n; r++) {
            send[r] = calloc(count, sizeof(float));
            recv[r] = calloc(count, sizeof(float));
        }
        assert_int_equal(sim_run_allreduce(HCCL_ALGO_RECDBL, n, &shape, (void **)send,
                                           (void **)recv, &out), hcclSuccess);
        for (int r = 0; r < n; r++) {
            bool folded = r < 2 * (n - pof2);
            uint64_t rounds = folded ? (r % 2 == 0 ? 1 : (uint64_t)logp + 1) : (uint64_t)logp;
            uint64_t want = count * sizeof(float) * rounds;
            assert_int_equal(out.bytes_sent[r], want);
            free(send[r]);
            free(recv[r]);
        }
    }
}

/* Large buffer, many chunks: pipelining with the 4 KiB chunks of the harness. */
static void test_ring_large(void **state)
{
    (void)state;
    check_allreduce(HCCL_ALGO_RING, 5, (1u << 20) + 7, hcclFloat32, hcclSum, false);
    check_allreduce(HCCL_ALGO_RING, 8, (1u << 20), hcclInt32, hcclSum, true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring),
        cmocka_unit_test(test_recdbl),
        cmocka_unit_test(test_recdbl_bytes),
        cmocka_unit_test(test_ring_large),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
