/*
 * Floating-point special values: NaN and Inf through the reduction kernels, and the fp16/bf16
 * conversions (known values, all 65536 bit patterns, and rounding of floats sampled over all
 * 2^32 patterns against an independent encoder).
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

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static bool half_is_nan(uint16_t h)
{
    return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu);
}

static bool bf16_is_nan(uint16_t h)
{
    return (h & 0x7f80u) == 0x7f80u && (h & 0x007fu);
}

/* ---- NaN and Inf through the kernels ---- */

static void test_nan_semantics(void **state)
{
    float a[] = {NAN, 1.0f, INFINITY, -0.0f}, b[] = {1.0f, NAN, -INFINITY, 0.0f}, d[4];
    uint16_t ha[] = {0x7e00, 0x3c00, 0x7c00}, hb[] = {0x3c00, 0x7e00, 0xfc00}, hd[3];
    uint16_t ba[] = {0x7fc0, 0x3f80, 0x7f80, 0x7f7f}, bb[] = {0x3f80, 0x7fc1, 0xff80, 0x7f7f},
             bd[4];

    (void)state;
    /* max/min are `a > b ? a : b`: a NaN in either operand yields b's element. */
    hccl_reduce(d, a, b, 4, hcclFloat32, hcclMax);
    assert_true(d[0] == 1.0f);
    assert_true(isnan(d[1]));
    assert_true(d[2] == INFINITY);
    assert_true(d[3] == 0.0f && !signbit(d[3])); /* equal: b */
    hccl_reduce(d, a, b, 4, hcclFloat32, hcclMin);
    assert_true(d[0] == 1.0f);
    assert_true(isnan(d[1]));
    assert_true(d[2] == -INFINITY);
    hccl_reduce(d, a, b, 3, hcclFloat32, hcclSum);
    assert_true(isnan(d[0]) && isnan(d[1]) && isnan(d[2]));

    hccl_reduce(hd, ha, hb, 3, hcclFloat16, hcclMax);
    assert_int_equal(hd[0], 0x3c00);
    assert_true(half_is_nan(hd[1]));
    assert_int_equal(hd[2], 0x7c00);
    hccl_reduce(hd, ha, hb, 3, hcclFloat16, hcclSum);
    assert_true(half_is_nan(hd[0]) && half_is_nan(hd[1]) && half_is_nan(hd[2]));

    hccl_reduce(bd, ba, bb, 4, hcclBfloat16, hcclSum);
    assert_true(bf16_is_nan(bd[0]) && bf16_is_nan(bd[1]) && bf16_is_nan(bd[2]));
    assert_int_equal(bd[3], 0x7f80); /* max + max overflows to Inf */
    hccl_reduce(bd, ba, bb, 2, hcclBfloat16, hcclMin);
    assert_int_equal(bd[0], 0x3f80);
    assert_true(bf16_is_nan(bd[1]));
}

/* ---- conversions ---- */

static void test_half_values(void **state)
{
    static const struct {
        float f;
        uint16_t h;
    } cases[] = {
        {1.0f, 0x3c00},       {-2.0f, 0xc000},       {0.0f, 0x0000},       {-0.0f, 0x8000},
        {65504.0f, 0x7bff},   {65519.0f, 0x7bff},    {65520.0f, 0x7c00},   {-65520.0f, 0xfc00},
        {1e10f, 0x7c00},      {INFINITY, 0x7c00},    {-INFINITY, 0xfc00},  {0x1p-24f, 0x0001},
        {0x1p-25f, 0x0000},   {0x1.8p-25f, 0x0001},  {0x3p-25f, 0x0002},   {0x5p-25f, 0x0002},
        {0x3ffp-24f, 0x03ff}, {0x1p-14f, 0x0400},    {0x7ffp-25f, 0x0400}, {1e-10f, 0x0000},
        {-1e-10f, 0x8000},    {2049.0f, 0x6800},     {2050.0f, 0x6801},    {2051.0f, 0x6802},
        {2053.0f, 0x6802},    {2048.5f, 0x6800},     {0.1f, 0x2e66},       {0x1.002p0f, 0x3c00},
        {0x1.006p0f, 0x3c02}, {0x1.0021p0f, 0x3c01},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint16_t got = hccl_float_to_half(cases[i].f);

        if (got != cases[i].h)
            fail_msg("float_to_half(%a) = 0x%04x, want 0x%04x", (double)cases[i].f, got,
                     cases[i].h);
    }
    assert_true(hccl_half_to_float(0x3c00) == 1.0f);
    assert_true(hccl_half_to_float(0x7bff) == 65504.0f);
    assert_true(hccl_half_to_float(0x0001) == 0x1p-24f);
    assert_true(hccl_half_to_float(0x03ff) == 0x3ffp-24f);
    assert_true(hccl_half_to_float(0x0400) == 0x1p-14f);
    assert_true(hccl_half_to_float(0xfc00) == -INFINITY);
    assert_true(signbit(hccl_half_to_float(0x8000)) && hccl_half_to_float(0x8000) == 0.0f);
    assert_true(isnan(hccl_half_to_float(0x7e00)));
    assert_true(isnan(hccl_half_to_float(0x7c01)));
    assert_true(half_is_nan(hccl_float_to_half(NAN)));
    assert_true(half_is_nan(hccl_float_to_half(u2f(0x7f800001)))); /* payload below fp16's */
    assert_true(half_is_nan(hccl_float_to_half(u2f(0xffc00000))));
}

static void test_bf16_values(void **state)
{
    static const struct {
        uint32_t f;
        uint16_t h;
    } cases[] = {
        {0x3f800000, 0x3f80}, /* 1.0 */
        {0x3f808000, 0x3f80}, /* tie, to even below */
        {0x3f818000, 0x3f82}, /* tie, to even above */
        {0x3f808001, 0x3f81}, {0x3f807fff, 0x3f80},
        {0xbf808000, 0xbf80}, {0x7f7fffff, 0x7f80}, /* FLT_MAX rounds to Inf */
        {0x7f7f7fff, 0x7f7f}, {0x7f800000, 0x7f80},
        {0xff800000, 0xff80}, {0x00000001, 0x0000}, /* subnormals round like normals */
        {0x00008000, 0x0000}, {0x00018000, 0x0002},
        {0x007fffff, 0x0080}, {0x80000000, 0x8000},
    };
    static const uint32_t nans[] = {0x7f800001, 0x7fc00000, 0xffc00000,
                                    0x7fffffff, 0xff800001, 0x7f80ffff};

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint16_t got = hccl_float_to_bf16(u2f(cases[i].f));

        if (got != cases[i].h)
            fail_msg("float_to_bf16(0x%08x) = 0x%04x, want 0x%04x", cases[i].f, got, cases[i].h);
    }
    for (size_t i = 0; i < sizeof(nans) / sizeof(nans[0]); i++) {
        uint16_t got = hccl_float_to_bf16(u2f(nans[i]));

        if (!bf16_is_nan(got) || (got >> 15) != (nans[i] >> 31))
            fail_msg("float_to_bf16(0x%08x) = 0x%04x, not a NaN of the same sign", nans[i], got);
    }
    assert_true(hccl_bf16_to_float(0x3f80) == 1.0f);
    assert_true(hccl_bf16_to_float(0xc040) == -3.0f);
    assert_true(isnan(hccl_bf16_to_float(0x7fc0)));
}

/* All 65536 patterns: exact value, and narrow -> float -> narrow is the identity (NaN: NaN). */
static void test_roundtrip_exhaustive(void **state)
{
    (void)state;
    for (uint32_t i = 0; i < 0x10000; i++) {
        uint16_t h = (uint16_t)i;
        float f = hccl_half_to_float(h);
        double want = ref_decode(h, 10, 5);
        uint16_t back = hccl_float_to_half(f);

        if (isnan(want)) {
            if (!isnan(f) || !half_is_nan(back) || (back & 0x8000) != (h & 0x8000))
                fail_msg("fp16 NaN 0x%04x -> %a -> 0x%04x", h, (double)f, back);
            if ((h & 0x0200) && back != h) /* a quiet NaN keeps its payload */
                fail_msg("fp16 quiet NaN 0x%04x -> 0x%04x", h, back);
        } else if ((double)f != want || !signbit(f) != !signbit(want) || back != h) {
            fail_msg("fp16 0x%04x -> %a (want %a) -> 0x%04x", h, (double)f, want, back);
        }

        f = hccl_bf16_to_float(h);
        want = ref_decode(h, 7, 8);
        back = hccl_float_to_bf16(f);
        if (isnan(want)) {
            if (!isnan(f) || !bf16_is_nan(back) || (back & 0x8000) != (h & 0x8000))
                fail_msg("bf16 NaN 0x%04x -> %a -> 0x%04x", h, (double)f, back);
            if ((h & 0x0040) && back != h)
                fail_msg("bf16 quiet NaN 0x%04x -> 0x%04x", h, back);
        } else if ((double)f != want || !signbit(f) != !signbit(want) || back != h) {
            fail_msg("bf16 0x%04x -> %a (want %a) -> 0x%04x", h, (double)f, want, back);
        }
    }
}

/* Rounding of about a million floats spread over all 2^32 patterns, against the reference. */
static void test_round_sampled(void **state)
{
    (void)state;
    for (uint64_t u = 0; u <= UINT32_MAX; u += 4093) {
        float f = u2f((uint32_t)u);
        uint16_t h = hccl_float_to_half(f);
        uint16_t b = hccl_float_to_bf16(f);

        if (isnan(f)) {
            assert_true(half_is_nan(h) && bf16_is_nan(b));
            continue;
        }
        if (h != narrow_encode(f, hcclFloat16))
            fail_msg("float_to_half(%a) = 0x%04x, want 0x%04x", (double)f, h,
                     narrow_encode(f, hcclFloat16));
        if (b != narrow_encode(f, hcclBfloat16))
            fail_msg("float_to_bf16(%a) = 0x%04x, want 0x%04x", (double)f, b,
                     narrow_encode(f, hcclBfloat16));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nan_semantics), cmocka_unit_test(test_half_values),
        cmocka_unit_test(test_bf16_values),   cmocka_unit_test(test_roundtrip_exhaustive),
        cmocka_unit_test(test_round_sampled),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
