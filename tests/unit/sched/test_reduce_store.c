/*
 * Stores past the cache: hccl_store_copy is memcpy and hccl_reduce_store is hccl_reduce, bit
 * for bit, whatever the alignment of each pointer, the length (the streamed body and the plain
 * head and tail), the values (NaN with payloads, infinities, signed zeros, subnormals), the
 * aliasing of dst with an operand, and for the types and ops that fall back.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/base.h"
#include "sched/sched.h"

static uint64_t rng_next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill_random(void *p, size_t n, uint64_t *seed)
{
    unsigned char *c = p;

    for (size_t i = 0; i < n; i++)
        c[i] = (unsigned char)rng_next(seed);
}

/* Special values sprinkled over a buffer of floats or doubles: one in 8 elements. */
static void sprinkle(void *p, size_t count, hcclDataType_t dt, uint64_t *seed)
{
    static const uint32_t f32[] = {0x7fc00000u, 0xffc00001u, 0x7fa00000u, 0x7f800000u, 0xff800000u,
                                   0x80000000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu};
    static const uint64_t f64[] = {
        0x7ff8000000000000ull, 0xfff8000000000001ull, 0x7ff4000000000000ull, 0x7ff0000000000000ull,
        0xfff0000000000000ull, 0x8000000000000000ull, 0x0000000000000001ull, 0x7fefffffffffffffull};

    for (size_t i = 0; i < count; i++) {
        uint64_t r = rng_next(seed);
        if (r % 8)
            continue;
        if (dt == hcclFloat32)
            memcpy((char *)p + i * 4, &f32[(r >> 8) % (sizeof(f32) / sizeof(f32[0]))], 4);
        else
            memcpy((char *)p + i * 8, &f64[(r >> 8) % (sizeof(f64) / sizeof(f64[0]))], 8);
    }
}

static void test_store_copy(void **state)
{
    static const size_t lens[] = {0, 1, 63, 64, 255, 256, 257, 1000, 4096, 65536 + 77};
    size_t cap = 65536 + 200;
    char *src = malloc(cap), *dst = malloc(cap), *want = malloc(cap);
    uint64_t seed = 1;

    (void)state;
    assert_non_null(src);
    assert_non_null(dst);
    assert_non_null(want);
    fill_random(src, cap, &seed);
    for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++)
        for (size_t so = 0; so < 17; so += 3)
            for (size_t doff = 0; doff < 17; doff += 5) {
                fill_random(dst, cap, &seed);
                memcpy(want, dst, cap);
                memcpy(want + doff, src + so, lens[l]);
                hccl_store_copy(dst + doff, src + so, lens[l]);
                if (memcmp(dst, want, cap) != 0)
                    fail_msg("store_copy of %zu bytes, src +%zu, dst +%zu differs from memcpy",
                             lens[l], so, doff);
            }
    free(src);
    free(dst);
    free(want);
}

/* One case: count elements at byte offsets (a, b, d) from 64-byte aligned buffers. */
static void check_reduce(hcclDataType_t dt, hcclRedOp_t op, size_t count, size_t aoff, size_t boff,
                         size_t doff, int alias, uint64_t *seed)
{
    size_t esz = hccl_dtype_size(dt), bytes = count * esz + 64;
    char *a = hccl_aligned_alloc(64, bytes), *b = hccl_aligned_alloc(64, bytes);
    char *d = hccl_aligned_alloc(64, bytes), *want = hccl_aligned_alloc(64, bytes);
    char *pa, *pb, *pd;
    size_t stored;
    bool streams = (dt == hcclFloat32 || dt == hcclFloat64) && (op == hcclSum || op == hcclAvg);

    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(d);
    assert_non_null(want);
    fill_random(a, bytes, seed);
    fill_random(b, bytes, seed);
    fill_random(d, bytes, seed);
    pa = a + aoff;
    pb = b + boff;
    if (dt == hcclFloat32 || dt == hcclFloat64) {
        sprinkle(pa, count, dt, seed);
        sprinkle(pb, count, dt, seed);
    }
    /* Aliased: dst is the operand itself, as in a reduction into the receive buffer. */
    pd = alias == 1 ? pa : alias == 2 ? pb : d + doff;
    hccl_reduce(want, pa, pb, count, dt, op);
    stored = hccl_reduce_store(pd, pa, pb, count, dt, op);
    /* Whole cache lines from the first 64-byte boundary of dst, for the types that stream;
     * nothing for the others. */
    assert_int_equal(stored % 64, 0);
    assert_true(stored <= count * esz);
    if (!streams)
        assert_int_equal(stored, 0);
    else if (count * esz >= 128 + 64)
        assert_true(stored >= count * esz - 128);
    if (memcmp(pd, want, count * esz) != 0) {
        size_t i = 0;
        while (memcmp(pd + i * esz, want + i * esz, esz) == 0)
            i++;
        fail_msg("reduce_store %s %s, %zu elements (a +%zu, b +%zu, dst +%zu, alias %d): element "
                 "%zu differs",
                 hccl_dtype_name(dt), hccl_op_name(op), count, aoff, boff, doff, alias, i);
    }
    hccl_free(a);
    hccl_free(b);
    hccl_free(d);
    hccl_free(want);
}

static void test_reduce_store_floats(void **state)
{
    static const size_t counts[] = {0, 1, 3, 15, 16, 17, 64, 1000, 4099};
    static const hcclDataType_t dts[] = {hcclFloat32, hcclFloat64};
    uint64_t seed = 2;

    (void)state;
    for (size_t t = 0; t < 2; t++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            for (size_t off = 0; off < 24; off += hccl_dtype_size(dts[t])) {
                check_reduce(dts[t], hcclSum, counts[c], off, (off * 3) % 24, (off * 5) % 24, 0,
                             &seed);
                check_reduce(dts[t], hcclAvg, counts[c], 0, off, off, 0, &seed);
                check_reduce(dts[t], hcclSum, counts[c], off, off, 0, 1, &seed);
                check_reduce(dts[t], hcclSum, counts[c], off, off, 0, 2, &seed);
            }
}

/* The types and ops that reduce as usual. */
static void test_reduce_store_fallbacks(void **state)
{
    uint64_t seed = 3;

    (void)state;
    for (int dt = 0; dt < hcclNumTypes; dt++)
        for (int op = 0; op < hcclNumOps; op++)
            check_reduce((hcclDataType_t)dt, (hcclRedOp_t)op, 777, 0, 0, 0, 0, &seed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_copy),
        cmocka_unit_test(test_reduce_store_floats),
        cmocka_unit_test(test_reduce_store_fallbacks),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
