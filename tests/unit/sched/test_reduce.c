/*
 * Reduction kernels: every dtype x op against a reference computed in
 * double (fp16/bf16: in float, rounded once by an independent encoder, bit
 * exact), the dtype and op names, integer wraparound, hcclAvg's division,
 * aliasing and odd counts.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reduce_helpers.h"
#include "sched/sched.h"

enum { ALIAS_NONE, ALIAS_A, ALIAS_B };

static const size_t counts[] = {0, 1, 7, 255, 256, 257, 1000003};

/* ---- helpers ---- */

static uint64_t rng_next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static bool is_narrow(hcclDataType_t dt)
{
    return dt == hcclFloat16 || dt == hcclBfloat16;
}

static bool is_int(hcclDataType_t dt)
{
    return dt <= hcclUint64;
}

/* Element i of buf as a double (not for fp16/bf16). */
static double load(const void *buf, size_t i, hcclDataType_t dt)
{
    switch (dt) {
    case hcclInt8:
        return ((const int8_t *)buf)[i];
    case hcclUint8:
        return ((const uint8_t *)buf)[i];
    case hcclInt32:
        return ((const int32_t *)buf)[i];
    case hcclUint32:
        return ((const uint32_t *)buf)[i];
    case hcclInt64:
        return (double)((const int64_t *)buf)[i];
    case hcclUint64:
        return (double)((const uint64_t *)buf)[i];
    case hcclFloat32:
        return ((const float *)buf)[i];
    case hcclFloat64:
        return ((const double *)buf)[i];
    default:
        fail_msg("load: bad dtype %d", (int)dt);
        return 0;
    }
}

/*
 * Integer ranges whose results stay exact in double and do not wrap: the
 * whole type (64-bit capped at 2^53) for max/min, about half of it for sum,
 * and a range whose products fit for prod.
 */
static void int_range(hcclDataType_t dt, hcclRedOp_t op, int64_t *lo, int64_t *hi)
{
    static const struct {
        int64_t lo, hi;
    } ranges[][3] = {
        /* max/min, sum/avg, prod */
        [hcclInt8] = {{INT8_MIN, INT8_MAX}, {-64, 63}, {-11, 11}},
        [hcclUint8] = {{0, UINT8_MAX}, {0, 127}, {0, 15}},
        [hcclInt32] = {{INT32_MIN, INT32_MAX}, {-(1 << 30), (1 << 30) - 1}, {-46340, 46340}},
        [hcclUint32] = {{0, UINT32_MAX}, {0, INT32_MAX}, {0, 65535}},
        [hcclInt64] = {{-(1ll << 53), 1ll << 53},
                       {-(1ll << 52), 1ll << 52},
                       {-(1ll << 26), 1ll << 26}},
        [hcclUint64] = {{0, 1ll << 53}, {0, 1ll << 52}, {0, 1ll << 26}},
    };
    int r = op == hcclProd ? 2 : (op == hcclSum || op == hcclAvg) ? 1 : 0;

    *lo = ranges[dt][r].lo;
    *hi = ranges[dt][r].hi;
}

/* Fills n random elements of dtype dt suited to op (finite floats, no wrap). */
static void fill(void *buf, size_t n, hcclDataType_t dt, hcclRedOp_t op, uint64_t *s)
{
    int64_t lo = 0, hi = 0;

    if (is_int(dt))
        int_range(dt, op, &lo, &hi);
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rng_next(s);
        uint64_t r2 = rng_next(s);
        int64_t v = lo + (int64_t)(r % (uint64_t)(hi - lo + 1));
        /* Random mantissa, sign and scale (2^-30 .. 2^30); one in 64 is zero. */
        int scale = (int)((r2 >> 8) % 61) - 30;
        double x = (r2 & 63) == 0 ? 0.0 : ldexp((double)(r >> 11) * 0x1p-53, scale);
        uint16_t h = (uint16_t)r;

        if (r2 & 64)
            x = -x;

        switch (dt) {
        case hcclInt8:
            ((int8_t *)buf)[i] = (int8_t)v;
            break;
        case hcclUint8:
            ((uint8_t *)buf)[i] = (uint8_t)v;
            break;
        case hcclInt32:
            ((int32_t *)buf)[i] = (int32_t)v;
            break;
        case hcclUint32:
            ((uint32_t *)buf)[i] = (uint32_t)v;
            break;
        case hcclInt64:
            ((int64_t *)buf)[i] = v;
            break;
        case hcclUint64:
            ((uint64_t *)buf)[i] = (uint64_t)v;
            break;
        case hcclFloat32:
            ((float *)buf)[i] = (float)x;
            break;
        case hcclFloat64:
            ((double *)buf)[i] = x;
            break;
        case hcclFloat16: /* any finite pattern, subnormals included */
            if ((h & 0x7c00u) == 0x7c00u)
                h &= 0x83ffu;
            ((uint16_t *)buf)[i] = h;
            break;
        case hcclBfloat16:
            if ((h & 0x7f80u) == 0x7f80u)
                h &= 0x807fu;
            ((uint16_t *)buf)[i] = h;
            break;
        default:
            fail_msg("fill: bad dtype %d", (int)dt);
        }
    }
}

static double ref_op(double x, double y, hcclRedOp_t op)
{
    switch (op) {
    case hcclProd:
        return x * y;
    case hcclMax:
        return x > y ? x : y;
    case hcclMin:
        return x < y ? x : y;
    default: /* sum; avg reduces as sum */
        return x + y;
    }
}

static float ref_op_f(float x, float y, hcclRedOp_t op)
{
    switch (op) {
    case hcclProd:
        return x * y;
    case hcclMax:
        return x > y ? x : y;
    case hcclMin:
        return x < y ? x : y;
    default:
        return x + y;
    }
}

/* Checks element i of a reduction, or of a division by k when b is NULL. */
static void check_elem(const void *res, const void *a, const void *b, size_t i, hcclDataType_t dt,
                       hcclRedOp_t op, int k, const char *what)
{
    if (is_narrow(dt)) {
        uint16_t got = ((const uint16_t *)res)[i];
        float x = (float)narrow_decode(((const uint16_t *)a)[i], dt);
        float r =
            b ? ref_op_f(x, (float)narrow_decode(((const uint16_t *)b)[i], dt), op) : x / (float)k;
        uint16_t want = narrow_encode(r, dt);

        if (got != want)
            fail_msg("%s %s %s: element %zu: got 0x%04x, want 0x%04x", what, hccl_dtype_name(dt),
                     hccl_op_name(op), i, got, want);
        return;
    }

    double x = load(a, i, dt);
    double want = b ? ref_op(x, load(b, i, dt), op) : x / k;
    double got = load(res, i, dt);
    double tol = 0;

    if (is_int(dt) && !b)
        want = trunc(want);
    if (dt == hcclFloat32)
        tol = fabs(want) * 0x1p-23; /* one float ulp against the double result */
    if (!(fabs(got - want) <= tol))
        fail_msg("%s %s %s: element %zu: got %.17g, want %.17g", what, hccl_dtype_name(dt),
                 hccl_op_name(op), i, got, want);
}

/* One reduction of count random elements, into dst, a or b. */
static void check_reduce(hcclDataType_t dt, hcclRedOp_t op, size_t count, int alias, uint64_t *s)
{
    size_t bytes = count * hccl_dtype_size(dt);
    char *a, *b, *d, *a0, *b0, *dst;

    if (count == 0) { /* nothing may be touched: NULL buffers are fine */
        hccl_reduce(NULL, NULL, NULL, 0, dt, op);
        return;
    }
    a = malloc(bytes);
    b = malloc(bytes);
    d = malloc(bytes);
    a0 = malloc(bytes);
    b0 = malloc(bytes);
    assert_true(a && b && d && a0 && b0);
    fill(a, count, dt, op, s);
    fill(b, count, dt, op, s);
    memcpy(a0, a, bytes);
    memcpy(b0, b, bytes);
    dst = alias == ALIAS_A ? a : alias == ALIAS_B ? b : d;

    hccl_reduce(dst, a, b, count, dt, op);

    for (size_t i = 0; i < count; i++)
        check_elem(dst, a0, b0, i, dt, op, 0,
                   alias == ALIAS_A   ? "dst=a"
                   : alias == ALIAS_B ? "dst=b"
                                      : "dst");
    if (alias != ALIAS_A)
        assert_memory_equal(a, a0, bytes);
    if (alias != ALIAS_B)
        assert_memory_equal(b, b0, bytes);
    free(a);
    free(b);
    free(d);
    free(a0);
    free(b0);
}

static void check_div(hcclDataType_t dt, size_t count, int k, uint64_t *s)
{
    size_t bytes = count * hccl_dtype_size(dt);
    char *buf, *orig;

    if (count == 0) {
        hccl_reduce_div(NULL, 0, dt, k);
        return;
    }
    buf = malloc(bytes);
    orig = malloc(bytes);
    assert_true(buf && orig);
    fill(buf, count, dt, hcclSum, s);
    memcpy(orig, buf, bytes);
    hccl_reduce_div(buf, count, dt, k);
    for (size_t i = 0; i < count; i++)
        check_elem(buf, orig, NULL, i, dt, hcclAvg, k, "div");
    free(buf);
    free(orig);
}

static void check_dtype(hcclDataType_t dt)
{
    static const int divisors[] = {1, 2, 3, 7, 300};
    uint64_t s = 0x1234 + (uint64_t)dt;

    for (int op = 0; op < hcclNumOps; op++) {
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            check_reduce(dt, (hcclRedOp_t)op, counts[c], ALIAS_NONE, &s);
            if (counts[c] != 0) {
                check_reduce(dt, (hcclRedOp_t)op, counts[c], ALIAS_A, &s);
                check_reduce(dt, (hcclRedOp_t)op, counts[c], ALIAS_B, &s);
            }
        }
    }
    for (size_t k = 0; k < sizeof(divisors) / sizeof(divisors[0]); k++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            check_div(dt, counts[c], divisors[k], &s);
}

/* ---- every dtype x every op ---- */

#define DTYPE_TEST(name_x, dt_x)                                                                   \
    static void test_reduce_##name_x(void **state)                                                 \
    {                                                                                              \
        (void)state;                                                                               \
        check_dtype(dt_x);                                                                         \
    }

DTYPE_TEST(int8, hcclInt8)
DTYPE_TEST(uint8, hcclUint8)
DTYPE_TEST(int32, hcclInt32)
DTYPE_TEST(uint32, hcclUint32)
DTYPE_TEST(int64, hcclInt64)
DTYPE_TEST(uint64, hcclUint64)
DTYPE_TEST(float16, hcclFloat16)
DTYPE_TEST(bfloat16, hcclBfloat16)
DTYPE_TEST(float32, hcclFloat32)
DTYPE_TEST(float64, hcclFloat64)

/* ---- names ---- */

static void test_names(void **state)
{
    static const char *const dtypes[] = {"int8",   "uint8",   "int32",    "uint32",  "int64",
                                         "uint64", "float16", "bfloat16", "float32", "float64"};
    static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};
    static const char *const ops[] = {"sum", "prod", "max", "min", "avg"};

    (void)state;
    for (int dt = 0; dt < hcclNumTypes; dt++) {
        assert_string_equal(hccl_dtype_name((hcclDataType_t)dt), dtypes[dt]);
        assert_int_equal(hccl_dtype_size((hcclDataType_t)dt), sizes[dt]);
    }
    for (int op = 0; op < hcclNumOps; op++)
        assert_string_equal(hccl_op_name((hcclRedOp_t)op), ops[op]);
    assert_string_equal(hccl_dtype_name(hcclNumTypes), "unknown");
    assert_string_equal(hccl_dtype_name((hcclDataType_t)-1), "unknown");
    assert_int_equal(hccl_dtype_size(hcclNumTypes), 0);
    assert_string_equal(hccl_op_name(hcclNumOps), "unknown");
}

/* ---- integer wraparound ---- */

static void test_int_wraps(void **state)
{
    int8_t i8a[] = {127, -128, 100, -128, 127, 16};
    int8_t i8b[] = {1, -1, 3, -1, 127, 8};
    int8_t i8d[6];
    uint8_t u8a[] = {255, 16, 0};
    uint8_t u8b[] = {1, 16, 255};
    uint8_t u8d[3];
    int32_t i32a[] = {INT32_MAX, INT32_MIN, INT32_MAX};
    int32_t i32b[] = {1, -1, 2};
    int32_t i32d[3];
    uint32_t u32a[] = {UINT32_MAX}, u32b[] = {1}, u32d[1];
    int64_t i64a[] = {INT64_MAX, INT64_MIN, INT64_MIN};
    int64_t i64b[] = {1, -1, -1};
    int64_t i64d[3];
    uint64_t u64a[] = {UINT64_MAX, UINT64_MAX}, u64b[] = {1, UINT64_MAX}, u64d[2];

    (void)state;
    hccl_reduce(i8d, i8a, i8b, 2, hcclInt8, hcclSum);
    assert_int_equal(i8d[0], -128);
    assert_int_equal(i8d[1], 127);
    hccl_reduce(i8d, i8a, i8b, 6, hcclInt8, hcclProd);
    assert_int_equal(i8d[0], 127);
    assert_int_equal(i8d[1], -128); /* -128 * -1 wraps to itself */
    assert_int_equal(i8d[2], 44);   /* 300 mod 256 */
    assert_int_equal(i8d[3], -128);
    assert_int_equal(i8d[4], 1);    /* 16129 mod 256 */
    assert_int_equal(i8d[5], -128); /* 128 */

    hccl_reduce(u8d, u8a, u8b, 3, hcclUint8, hcclSum);
    assert_int_equal(u8d[0], 0);
    assert_int_equal(u8d[1], 32);
    assert_int_equal(u8d[2], 255);
    hccl_reduce(u8d, u8a, u8b, 3, hcclUint8, hcclProd);
    assert_int_equal(u8d[0], 255);
    assert_int_equal(u8d[1], 0); /* 256 */
    assert_int_equal(u8d[2], 0);

    hccl_reduce(i32d, i32a, i32b, 3, hcclInt32, hcclSum);
    assert_int_equal(i32d[0], INT32_MIN);
    assert_int_equal(i32d[1], INT32_MAX);
    hccl_reduce(i32d, i32a, i32b, 3, hcclInt32, hcclProd);
    assert_int_equal(i32d[1], INT32_MIN); /* INT32_MIN * -1 */
    assert_int_equal(i32d[2], -2);

    hccl_reduce(u32d, u32a, u32b, 1, hcclUint32, hcclSum);
    assert_int_equal(u32d[0], 0);

    hccl_reduce(i64d, i64a, i64b, 3, hcclInt64, hcclSum);
    assert_true(i64d[0] == INT64_MIN);
    assert_true(i64d[1] == INT64_MAX);
    hccl_reduce(i64d, i64a, i64b, 3, hcclInt64, hcclProd);
    assert_true(i64d[1] == INT64_MIN);

    hccl_reduce(u64d, u64a, u64b, 2, hcclUint64, hcclSum);
    assert_true(u64d[0] == 0);
    assert_true(u64d[1] == UINT64_MAX - 1);
    hccl_reduce(u64d, u64a, u64b, 2, hcclUint64, hcclProd);
    assert_true(u64d[1] == 1);
}

/* Full-range random sums and products against modular arithmetic in uint64. */
static void test_int_wraps_random(void **state)
{
    enum { N = 4099 };
    static const hcclDataType_t dts[] = {hcclInt8,   hcclUint8, hcclInt32,
                                         hcclUint32, hcclInt64, hcclUint64};
    static uint64_t a[N], b[N], d[N]; /* large enough for any dtype */
    uint64_t s = 99;

    (void)state;
    for (size_t t = 0; t < sizeof(dts) / sizeof(dts[0]); t++) {
        hcclDataType_t dt = dts[t];
        size_t es = hccl_dtype_size(dt);
        uint64_t mask = es == 8 ? UINT64_MAX : (1ull << (8 * es)) - 1;

        for (size_t i = 0; i < N; i++) {
            a[i] = rng_next(&s);
            b[i] = rng_next(&s);
        }
        for (int op = hcclSum; op <= hcclProd; op++) {
            hccl_reduce(d, a, b, N, dt, (hcclRedOp_t)op);
            for (size_t i = 0; i < N; i++) {
                uint64_t x = 0, y = 0, got = 0, want;

                /* Element i of each buffer, little-endian, as its low bits. */
                memcpy(&x, (char *)a + i * es, es);
                memcpy(&y, (char *)b + i * es, es);
                memcpy(&got, (char *)d + i * es, es);
                want = (op == hcclSum ? x + y : x * y) & mask;
                if (got != want)
                    fail_msg("%s %s: element %zu: got 0x%llx, want 0x%llx", hccl_dtype_name(dt),
                             hccl_op_name((hcclRedOp_t)op), i, (unsigned long long)got,
                             (unsigned long long)want);
            }
        }
    }
}

/* ---- hcclAvg ---- */

static void test_avg_truncates(void **state)
{
    int32_t i32a[] = {-3, 3, -7, 7, 5, -5}, i32b[] = {-4, 4, 0, 0, 0, 0}, i32d[6];
    int8_t i8[] = {-7, 7, -128, 127};
    uint8_t u8[] = {7, 255};
    int64_t i64[] = {-7, INT64_MIN};
    uint64_t u64[] = {7, UINT64_MAX};

    (void)state;
    hccl_reduce(i32d, i32a, i32b, 6, hcclInt32, hcclAvg);
    hccl_reduce_div(i32d, 6, hcclInt32, 2);
    assert_int_equal(i32d[0], -3); /* -7 / 2 */
    assert_int_equal(i32d[1], 3);
    assert_int_equal(i32d[2], -3);
    assert_int_equal(i32d[3], 3);
    assert_int_equal(i32d[4], 2);
    assert_int_equal(i32d[5], -2);

    hccl_reduce_div(i8, 4, hcclInt8, 2);
    assert_int_equal(i8[0], -3);
    assert_int_equal(i8[1], 3);
    assert_int_equal(i8[2], -64);
    assert_int_equal(i8[3], 63);
    hccl_reduce_div(i8, 4, hcclInt8, 300); /* a divisor wider than the type */
    assert_int_equal(i8[0], 0);
    assert_int_equal(i8[2], 0);

    hccl_reduce_div(u8, 2, hcclUint8, 2);
    assert_int_equal(u8[0], 3);
    assert_int_equal(u8[1], 127);
    hccl_reduce_div(u8, 2, hcclUint8, 256);
    assert_int_equal(u8[1], 0);

    hccl_reduce_div(i64, 2, hcclInt64, 2);
    assert_true(i64[0] == -3);
    assert_true(i64[1] == INT64_MIN / 2);
    hccl_reduce_div(u64, 2, hcclUint64, 2);
    assert_true(u64[0] == 3);
    assert_true(u64[1] == UINT64_MAX / 2);
}

static void test_avg_floats(void **state)
{
    float f[] = {3.0f, -1.0f};
    double g[] = {1.0, -7.0};
    uint16_t h[] = {0x3c00, 0x0001};  /* 1.0, 2^-24 */
    uint16_t bf[] = {0x3f80, 0x4040}; /* 1.0, 3.0 */

    (void)state;
    hccl_reduce(f, f, f, 2, hcclFloat32, hcclAvg); /* in place, dst == a == b */
    hccl_reduce_div(f, 2, hcclFloat32, 4);
    assert_true(f[0] == 1.5f && f[1] == -0.5f);
    hccl_reduce_div(g, 2, hcclFloat64, 2);
    assert_true(g[0] == 0.5 && g[1] == -3.5);
    hccl_reduce_div(h, 2, hcclFloat16, 2);
    assert_int_equal(h[0], 0x3800); /* 0.5 */
    assert_int_equal(h[1], 0x0000); /* 2^-25: a tie, to even zero */
    hccl_reduce_div(bf, 2, hcclBfloat16, 3);
    assert_int_equal(bf[0], 0x3eab); /* 1/3 rounded */
    assert_int_equal(bf[1], 0x3f80);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_reduce_int8),
        cmocka_unit_test(test_reduce_uint8),
        cmocka_unit_test(test_reduce_int32),
        cmocka_unit_test(test_reduce_uint32),
        cmocka_unit_test(test_reduce_int64),
        cmocka_unit_test(test_reduce_uint64),
        cmocka_unit_test(test_reduce_float16),
        cmocka_unit_test(test_reduce_bfloat16),
        cmocka_unit_test(test_reduce_float32),
        cmocka_unit_test(test_reduce_float64),
        cmocka_unit_test(test_int_wraps),
        cmocka_unit_test(test_int_wraps_random),
        cmocka_unit_test(test_avg_truncates),
        cmocka_unit_test(test_avg_floats),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
