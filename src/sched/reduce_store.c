/*
 * hccl_reduce_store: a reduction whose results bypass the cache, for results larger than it
 * that nothing reads soon (a Reduce root's, out of place: docs/performance.md).
 * Loads and streaming stores must interleave: reducing a tile in L1 and then streaming it out
 * is no faster than hccl_reduce, where one pass that does both is (docs/performance.md).
 * Only fp32 and fp64 sum (and avg, which sums) have such a pass; the other types and ops
 * reduce as hccl_reduce does.
 *
 * The bits are hccl_reduce's: an addition of two finite or infinite values has one IEEE
 * result, and a group of elements with a NaN among its inputs goes to hccl_reduce, whose
 * compiled loop decides which NaN comes out (where both are NaN, the compiler's operand order;
 * test_reduce_store checks payloads against the whole-buffer call).
 */
#include <string.h>

#include "sched/sched.h"

#if defined(__x86_64__)
#include <emmintrin.h>

/*
 * One 64-byte group at a time: four vectors of a and b, added and streamed, or, with a NaN
 * among them, reduced by hccl_reduce into t and streamed from there. SUF is the intrinsics'
 * suffix (ps, pd), V their vector type, L the elements per vector.
 */
#define DEFINE_STREAM_SUM(name, T, V, SUF, L, DT)                                                  \
    static size_t name(T *d, const T *a, const T *b, size_t n)                                     \
    {                                                                                              \
        size_t i = 0;                                                                              \
                                                                                                   \
        for (; i + 4 * (L) <= n; i += 4 * (L)) {                                                   \
            V x[4], y[4], nan = _mm_setzero_##SUF();                                               \
            for (int k = 0; k < 4; k++) {                                                          \
                x[k] = _mm_loadu_##SUF(a + i + k * (L));                                           \
                y[k] = _mm_loadu_##SUF(b + i + k * (L));                                           \
                nan = _mm_or_##SUF(nan, _mm_cmpunord_##SUF(x[k], y[k]));                           \
            }                                                                                      \
            if (_mm_movemask_##SUF(nan)) {                                                         \
                _Alignas(16) T t[4 * (L)];                                                         \
                hccl_reduce(t, a + i, b + i, 4 * (L), DT, hcclSum);                                \
                for (int k = 0; k < 4; k++)                                                        \
                    x[k] = _mm_load_##SUF(t + k * (L));                                            \
            } else {                                                                               \
                for (int k = 0; k < 4; k++)                                                        \
                    x[k] = _mm_add_##SUF(x[k], y[k]);                                              \
            }                                                                                      \
            for (int k = 0; k < 4; k++)                                                            \
                _mm_stream_##SUF(d + i + k * (L), x[k]);                                           \
        }                                                                                          \
        _mm_sfence();                                                                              \
        hccl_reduce(d + i, a + i, b + i, n - i, DT, hcclSum);                                      \
        return i * sizeof(T);                                                                      \
    }

DEFINE_STREAM_SUM(sum_f32, float, __m128, ps, 4, hcclFloat32)
DEFINE_STREAM_SUM(sum_f64, double, __m128d, pd, 2, hcclFloat64)

size_t hccl_reduce_store(void *dst, const void *a, const void *b, size_t count, hcclDataType_t dt,
                         hcclRedOp_t op)
{
    size_t esz = hccl_dtype_size(dt), head;
    bool summed = op == hcclSum || op == hcclAvg;

    /* Streaming stores need 16-byte aligned destinations, and fill a cache line only from its
     * start: the elements before the first 64-byte boundary go as usual. */
    if (!summed || (dt != hcclFloat32 && dt != hcclFloat64) || (uintptr_t)dst % esz != 0) {
        hccl_reduce(dst, a, b, count, dt, op);
        return 0;
    }
    head = ((64 - (uintptr_t)dst % 64) % 64) / esz;
    head = head < count ? head : count;
    hccl_reduce(dst, a, b, head, dt, op);
    count -= head;
    dst = (char *)dst + head * esz;
    a = (const char *)a + head * esz;
    b = (const char *)b + head * esz;
    if (dt == hcclFloat32)
        return sum_f32(dst, a, b, count);
    return sum_f64(dst, a, b, count);
}

#else

size_t hccl_reduce_store(void *dst, const void *a, const void *b, size_t count, hcclDataType_t dt,
                         hcclRedOp_t op)
{
    hccl_reduce(dst, a, b, count, dt, op);
    return 0;
}

#endif
