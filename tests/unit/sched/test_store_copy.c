/*
 * Stores past the cache: hccl_store_copy is memcpy, byte for byte, whatever the alignment of
 * each pointer and the length (the streamed body and the plain head and tail).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "base/base.h"

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
                    fail_msg("store_copy of %zu bytes, src +%zu, dst +%zu differs from memcpy", lens[l], so,
                             doff);
            }
    free(src);
    free(dst);
    free(want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_copy),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
