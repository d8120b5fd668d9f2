/*
 * hccl_reduce_store: a reduction whose results bypass the cache, for results larger than it.
 * Loads and streaming stores must interleave: reducing a tile in L1 and then streaming it out
 * was no faster than hccl_reduce (fp32 sum, one thread, 16 MiB: 10.4 against 10.3 GB/s), where
 * one pass is 1.2-1.4x (16 MiB: 12.3-14.1 against 9.6-10.7; 64 MiB: 8.9-9.7 against 7.4-8.0).
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

static void sum_f32(float *d, const float *a, const float *b, size_t n)
{
    size_t i = 0;

    for (; i + 16 <= n; i += 16) {
        __m128 x0 = _mm_loadu_ps(a + i), x1 = _mm_loadu_ps(a + i + 4);
        __m128 x2 = _mm_loadu_ps(a + i + 8), x3 = _mm_loadu_ps(a + i + 12);
        __m128 y0 = _mm_loadu_ps(b + i), y1 = _mm_loadu_ps(b + i + 4);
        __m128 y2 = _mm_loadu_ps(b + i + 8), y3 = _mm_loadu_ps(b + i + 12);
        __m128 nan = _mm_or_ps(_mm_or_ps(_mm_cmpunord_ps(x0, y0), _mm_cmpunord_ps(x1, y1)),
                               _mm_or_ps(_mm_cmpunord_ps(x2, y2), _mm_cmpunord_ps(x3, y3)));

        if (_mm_movemask_ps(nan)) {
            _Alignas(16) float t[16];
            hccl_reduce(t, a + i, b + i, 16, hcclFloat32, hcclSum);
            x0 = _mm_load_ps(t), x1 = _mm_load_ps(t + 4);
            x2 = _mm_load_ps(t + 8), x3 = _mm_load_ps(t + 12);
        } else {
            x0 = _mm_add_ps(x0, y0), x1 = _mm_add_ps(x1, y1);
            x2 = _mm_add_ps(x2, y2), x3 = _mm_add_ps(x3, y3);
        }
        _mm_stream_ps(d + i, x0);
        _mm_stream_ps(d + i + 4, x1);
        _mm_stream_ps(d + i + 8, x2);
        _mm_stream_ps(d + i + 12, x3);
    }
    _mm_sfence();
    hccl_reduce(d + i, a + i, b + i, n - i, hcclFloat32, hcclSum);
}

static void sum_f64(double *d, const double *a, const double *b, size_t n)
{
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {
        __m128d x0 = _mm_loadu_pd(a + i), x1 = _mm_loadu_pd(a + i + 2);
        __m128d x2 = _mm_loadu_pd(a + i + 4), x3 = _mm_loadu_pd(a + i + 6);
        __m128d y0 = _mm_loadu_pd(b + i), y1 = _mm_loadu_pd(b + i + 2);
        __m128d y2 = _mm_loadu_pd(b + i + 4), y3 = _mm_loadu_pd(b + i + 6);
        __m128d nan = _mm_or_pd(_mm_or_pd(_mm_cmpunord_pd(x0, y0), _mm_cmpunord_pd(x1, y1)),
                                _mm_or_pd(_mm_cmpunord_pd(x2, y2), _mm_cmpunord_pd(x3, y3)));

        if (_mm_movemask_pd(nan)) {
            _Alignas(16) double t[8];
            hccl_reduce(t, a + i, b + i, 8, hcclFloat64, hcclSum);
            x0 = _mm_load_pd(t), x1 = _mm_load_pd(t + 2);
            x2 = _mm_load_pd(t + 4), x3 = _mm_load_pd(t + 6);
        } else {
            x0 = _mm_add_pd(x0, y0), x1 = _mm_add_pd(x1, y1);
            x2 = _mm_add_pd(x2, y2), x3 = _mm_add_pd(x3, y3);
        }
        _mm_stream_pd(d + i, x0);
        _mm_stream_pd(d + i + 2, x1);
        _mm_stream_pd(d + i + 4, x2);
        _mm_stream_pd(d + i + 6, x3);
    }
    _mm_sfence();
    hccl_reduce(d + i, a + i, b + i, n - i, hcclFloat64, hcclSum);
}

void hccl_reduce_store(void *dst, const void *a, const void *b, size_t count, hcclDataType_t dt,
                       hcclRedOp_t op)
{
    size_t esz = hccl_dtype_size(dt), head;
    bool summed = op == hcclSum || op == hcclAvg;

    /* Streaming stores need 16-byte aligned destinations: the elements before go as usual. */
    if (!summed || (dt != hcclFloat32 && dt != hcclFloat64) || (uintptr_t)dst % esz != 0) {
        hccl_reduce(dst, a, b, count, dt, op);
        return;
    }
    head = ((16 - (uintptr_t)dst % 16) % 16) / esz;
    head = head < count ? head : count;
    hccl_reduce(dst, a, b, head, dt, op);
    count -= head;
    dst = (char *)dst + head * esz;
    a = (const char *)a + head * esz;
    b = (const char *)b + head * esz;
    if (dt == hcclFloat32)
        sum_f32(dst, a, b, count);
    else
        sum_f64(dst, a, b, count);
}

#else

void hccl_reduce_store(void *dst, const void *a, const void *b, size_t count, hcclDataType_t dt,
                       hcclRedOp_t op)
{
    hccl_reduce(dst, a, b, count, dt, op);
}

#endif
