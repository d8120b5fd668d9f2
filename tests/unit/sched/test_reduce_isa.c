/*
 * The fp16/bf16 kernels on the CPU's conversion instructions against the
 * portable kernels, bit for bit: the path hccl_reduce picked and every other
 * path this CPU has, every op, odd counts, aliasing, random bit patterns over
 * the whole 16-bit space (NaN, Inf, subnormals, signed zeros) and every
 * pattern against a list of special values.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched.h"

enum { ALIAS_NONE, ALIAS_A, ALIAS_B, NUM_ALIAS };

static const size_t counts[] = {0, 1, 7, 15, 16, 17, 1000003};
static const char *const isas[] = {"f16c", "avx512bf16", "avx2"};
static const hcclDataType_t dtypes[] = {hcclFloat16, hcclBfloat16};

typedef struct {
    const char *name;
    hccl_reduce_fn_t fn; /* NULL: hccl_reduce, the path it picked */
} kernel_t;

static uint64_t rng_next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);

    assert_non_null(p);
    return p;
}

/* The kernels to check for dt: hccl_reduce's pick and each path this CPU has. */
static size_t kernels_for(hcclDataType_t dt, hcclRedOp_t op, kernel_t *k)
{
    size_t n = 0;

    k[n++] = (kernel_t){"selected", NULL};
    for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
        hccl_reduce_fn_t fn = hccl_reduce_isa_kernel(isas[i], dt, op);
        if (fn)
            k[n++] = (kernel_t){isas[i], fn};
    }
    return n;
}

/*
 * Runs one kernel on copies of a and b with the given aliasing and compares
 * the result with the portable kernel's, bit for bit.
 */
static void check_one(const kernel_t *k, hcclDataType_t dt, hcclRedOp_t op, const uint16_t *a,
                      const uint16_t *b, size_t n, int alias)
{
    size_t bytes = n * sizeof(uint16_t);
    uint16_t *ra = xmalloc(bytes), *rb = xmalloc(bytes), *rd = xmalloc(bytes);
    uint16_t *ka = xmalloc(bytes), *kb = xmalloc(bytes), *kd = xmalloc(bytes);
    uint16_t *rdst = alias == ALIAS_A ? ra : alias == ALIAS_B ? rb : rd;
    uint16_t *kdst = alias == ALIAS_A ? ka : alias == ALIAS_B ? kb : kd;

    memcpy(ra, a, bytes);
    memcpy(rb, b, bytes);
    memcpy(ka, a, bytes);
    memcpy(kb, b, bytes);
    memset(rd, 0x5a, bytes);
    memset(kd, 0x5a, bytes);
    hccl_reduce_portable(rdst, ra, rb, n, dt, op);
    if (k->fn)
        k->fn(kdst, ka, kb, n);
    else
        hccl_reduce(kdst, ka, kb, n, dt, op);
    for (size_t i = 0; i < n; i++) {
        if (kdst[i] != rdst[i] || ka[i] != ra[i] || kb[i] != rb[i] || kd[i] != rd[i])
            fail_msg("%s %s %s n=%zu alias=%d [%zu]: a=0x%04x b=0x%04x -> 0x%04x, portable 0x%04x",
                     k->name, hccl_dtype_name(dt), hccl_op_name(op), n, alias, i, a[i], b[i],
                     kdst[i], rdst[i]);
    }
    free(ra), free(rb), free(rd), free(ka), free(kb), free(kd);
}

static void check_all(hcclDataType_t dt, const uint16_t *a, const uint16_t *b, size_t n,
                      int alias)
{
    for (int op = 0; op < hcclNumOps; op++) {
        kernel_t k[1 + sizeof(isas) / sizeof(isas[0])];
        size_t nk = kernels_for(dt, (hcclRedOp_t)op, k);

        for (size_t i = 0; i < nk; i++)
            check_one(&k[i], dt, (hcclRedOp_t)op, a, b, n, alias);
    }
}

static void test_report_isa(void **state)
{
    bool any = false;
    const char *env = getenv("HCCL_REDUCE_ISA");

    (void)state;
    printf("hccl_reduce fp16/bf16 path: %s\n", hccl_reduce_isa());
    for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
        for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
            if (hccl_reduce_isa_kernel(isas[i], dtypes[d], hcclSum)) {
                printf("checking %s %s against the portable kernels\n", isas[i],
                       hccl_dtype_name(dtypes[d]));
                any = true;
            }
        }
    }
    if (!any)
        printf("this CPU has neither F16C nor AVX2: checking the portable path only\n");
    if (env && strcmp(env, "portable") == 0)
        assert_string_equal(hccl_reduce_isa(), "portable");
    assert_null(hccl_reduce_isa_kernel("no-such-isa", hcclFloat16, hcclSum));
    assert_null(hccl_reduce_isa_kernel("f16c", hcclFloat32, hcclSum));
}

/* Uniformly random 16-bit patterns, every count and aliasing. */
static void test_random_patterns(void **state)
{
    uint64_t seed = 0x15a15a;
    size_t max = counts[sizeof(counts) / sizeof(counts[0]) - 1];
    uint16_t *a = xmalloc(max * sizeof(uint16_t));
    uint16_t *b = xmalloc(max * sizeof(uint16_t));

    (void)state;
    for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            for (int alias = 0; alias < NUM_ALIAS; alias++) {
                for (size_t i = 0; i < counts[c]; i++) {
                    uint64_t r = rng_next(&seed);
                    a[i] = (uint16_t)r;
                    b[i] = (uint16_t)(r >> 16);
                }
                check_all(dtypes[d], a, b, counts[c], alias);
            }
        }
    }
    free(a);
    free(b);
}

/*
 * Random finite values only, so the vector code (not the NaN fallback) runs
 * on whole chunks; small exponents so sums and products land among the
 * subnormals, where vcvtneps2bf16 differs from the portable encoder.
 */
static void test_finite_patterns(void **state)
{
    uint64_t seed = 0xf1417e;
    size_t n = 1 << 16;
    uint16_t *a = xmalloc(n * sizeof(uint16_t));
    uint16_t *b = xmalloc(n * sizeof(uint16_t));

    (void)state;
    for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
        uint16_t exp_mask = dtypes[d] == hcclFloat16 ? 0x7c00 : 0x7f80;
        uint16_t high_exp = (uint16_t)(exp_mask & ~((exp_mask & (0u - exp_mask)) * 3u));

        for (int tiny = 0; tiny < 2; tiny++) {
            for (size_t i = 0; i < n; i++) {
                uint64_t r = rng_next(&seed);
                uint16_t x = (uint16_t)r, y = (uint16_t)(r >> 16);

                if (tiny) { /* exponent field 0..3 */
                    x &= (uint16_t)~high_exp;
                    y &= (uint16_t)~high_exp;
                }
                if ((x & exp_mask) == exp_mask)
                    x &= (uint16_t)~0x4000; /* not Inf/NaN */
                if ((y & exp_mask) == exp_mask)
                    y &= (uint16_t)~0x4000;
                a[i] = x;
                b[i] = y;
            }
            check_all(dtypes[d], a, b, n, ALIAS_NONE);
        }
    }
    free(a);
    free(b);
}

/* Every bit pattern against each special value, both ways round. */
static void test_specials(void **state)
{
    static const uint16_t f16_specials[] = {
        0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x83ff, 0x0400, 0x8400, 0x3c00, 0xbc00,
        0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7c01, 0xfc01, 0x7e00, 0xfe00, 0x7fff, 0xffff,
        0x7d55, 0x3555, 0x0200, 0x1400, 0x7800, 0x5bff, 0xe000,
    };
    static const uint16_t bf16_specials[] = {
        0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x807f, 0x0080, 0x8080, 0x3f80, 0xbf80,
        0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7f81, 0xff81, 0x7fc0, 0xffc0, 0x7fff, 0xffff,
        0x7fa5, 0x0040, 0x00ff, 0x0100, 0x3f00, 0x1f80, 0x6000, 0x0081,
    };
    size_t n = 1 << 16;
    uint16_t *a = xmalloc(n * sizeof(uint16_t));
    uint16_t *b = xmalloc(n * sizeof(uint16_t));

    (void)state;
    for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
        const uint16_t *sp = dtypes[d] == hcclFloat16 ? f16_specials : bf16_specials;
        size_t nsp = dtypes[d] == hcclFloat16 ? sizeof(f16_specials) / sizeof(f16_specials[0])
                                              : sizeof(bf16_specials) / sizeof(bf16_specials[0]);

        for (size_t s = 0; s < nsp; s++) {
            for (size_t i = 0; i < n; i++) {
                a[i] = (uint16_t)i;
                b[i] = sp[s];
            }
            check_all(dtypes[d], a, b, n, ALIAS_NONE);
            check_all(dtypes[d], b, a, n, ALIAS_NONE);
        }
    }
    free(a);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_report_isa),
        cmocka_unit_test(test_random_patterns),
        cmocka_unit_test(test_finite_patterns),
        cmocka_unit_test(test_specials),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
