/*
 * fp16 and bf16 reduction kernels that use the CPU's conversion
 * instructions: F16C for fp16, AVX-512 BF16 or plain AVX2 for bf16. Each
 * function carries its own target attribute, so the rest of the library
 * needs no special flags; reduce.c picks a kernel once, at run time.
 *
 * Results are bit-identical to the portable kernels of reduce.c for every
 * input, which the tests check over the whole 16-bit space:
 *  - Work goes in chunks of 16 elements. A chunk with a NaN in a or b is
 *    handed to the portable kernel: which NaN sum and prod return, and with
 *    what payload, is decided by the instructions the compiler chose for
 *    the portable loop, not by IEEE. A NaN made by the arithmetic itself
 *    (Inf - Inf, 0 * Inf) is the default NaN, which both encoders round the
 *    same way. The tail of fewer than 16 goes to the portable kernel too.
 *    Chunks start at multiples of 16 and the portable kernel's blocks at
 *    multiples of 256, so its vector body and scalar tail cover the same
 *    elements whether it runs whole or chunk by chunk.
 *  - max and min are vmaxps(x, y) and vminps(x, y): x > y ? x : y and
 *    x < y ? x : y, signed zeros included, as in the portable loops.
 *  - F16C converts fp16 subnormals exactly and rounds to nearest-even
 *    without consulting MXCSR; the portable encoder does the same under the
 *    default rounding mode, which the library assumes.
 *  - vcvtneps2bf16 treats fp32 subnormals as zero, where the portable
 *    encoder rounds them (0x007fffff gives 0x0080), so a vector with a
 *    subnormal result is rounded with integer operations instead.
 *  - The AVX2 bf16 encoder is the portable one in integer vector
 *    operations: add 0x7fff plus the lowest kept bit and truncate, NaN kept
 *    with its top payload and made quiet.
 */
#if defined(__x86_64__)

#include <cpuid.h>
#include <immintrin.h>
#include <string.h>

#include "sched/sched.h"

#define CHUNK 16

/* ---- CPU features ---- */

/* XCR0: the OS saves SSE, AVX and the three AVX-512 states (opmask, ZMM0-15 high, ZMM16-31). */
#define XCR0_AVX512_STATE 0xe6u

static bool cpu_has_avx512bf16(void)
{
    unsigned eax, ebx, ecx, edx;
    unsigned xcr0_lo, xcr0_hi;

    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_OSXSAVE))
        return false;
    /* xgetbv by hand: _xgetbv would need the xsave target on this function. */
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    (void)xcr0_hi;
    if ((xcr0_lo & XCR0_AVX512_STATE) != XCR0_AVX512_STATE)
        return false;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !(ebx & bit_AVX512F))
        return false;
    if (eax < 1) /* leaf 7's highest subleaf */
        return false;
    __cpuid_count(7, 1, eax, ebx, ecx, edx);
    return (eax & (1u << 5)) != 0; /* AVX512_BF16 */
}

/* CPUID by hand: clang before 16 does not know "f16c" in __builtin_cpu_supports. */
static bool cpu_has_f16c(void)
{
    unsigned eax, ebx, ecx, edx;

    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
}

static bool cpu_has(const char *isa)
{
    __builtin_cpu_init();
    if (strcmp(isa, "f16c") == 0)
        return __builtin_cpu_supports("avx") && cpu_has_f16c();
    if (strcmp(isa, "avx2") == 0)
        return __builtin_cpu_supports("avx2");
    if (strcmp(isa, "avx512bf16") == 0)
        return cpu_has_avx512bf16();
    return false;
}

/* ---- fp16: F16C + AVX ---- */

#define F16C __attribute__((target("f16c,avx")))

/* All ones in the lanes of 8 fp16 values that are NaN: exponent all ones, mantissa not zero. */
static inline F16C __m128i f16_nan_lanes(__m128i h)
{
    __m128i mag = _mm_and_si128(h, _mm_set1_epi16(0x7fff));

    return _mm_cmpgt_epi16(mag, _mm_set1_epi16(0x7c00));
}

/* Loads every input of a chunk before storing, so dst may be a or b. */
#define F16C_KERNEL(op_x, rop_x, vop_x)                                                    \
    static F16C void f16c_##op_x(void *dst, const void *av, const void *bv, size_t n)      \
    {                                                                                      \
        uint16_t *d = dst;                                                                 \
        const uint16_t *a = av;                                                            \
        const uint16_t *b = bv;                                                            \
        size_t i = 0;                                                                      \
                                                                                           \
        for (; n - i >= CHUNK; i += CHUNK) {                                               \
            __m128i a0 = _mm_loadu_si128((const __m128i *)(a + i));                        \
            __m128i a1 = _mm_loadu_si128((const __m128i *)(a + i + 8));                    \
            __m128i b0 = _mm_loadu_si128((const __m128i *)(b + i));                        \
            __m128i b1 = _mm_loadu_si128((const __m128i *)(b + i + 8));                    \
            __m128i nan = _mm_or_si128(_mm_or_si128(f16_nan_lanes(a0), f16_nan_lanes(a1)), \
                                       _mm_or_si128(f16_nan_lanes(b0), f16_nan_lanes(b1))); \
            __m256 r0, r1;                                                                 \
                                                                                           \
            if (_mm_movemask_epi8(nan) != 0) {                                             \
                hccl_reduce_portable(d + i, a + i, b + i, CHUNK, hcclFloat16, rop_x);      \
                continue;                                                                  \
            }                                                                              \
            r0 = vop_x(_mm256_cvtph_ps(a0), _mm256_cvtph_ps(b0));                          \
            r1 = vop_x(_mm256_cvtph_ps(a1), _mm256_cvtph_ps(b1));                          \
            _mm_storeu_si128((__m128i *)(d + i),                                           \
                             _mm256_cvtps_ph(r0, _MM_FROUND_TO_NEAREST_INT));              \
            _mm_storeu_si128((__m128i *)(d + i + 8),                                       \
                             _mm256_cvtps_ph(r1, _MM_FROUND_TO_NEAREST_INT));              \
        }                                                                                  \
        if (i < n)                                                                         \
            hccl_reduce_portable(d + i, a + i, b + i, n - i, hcclFloat16, rop_x);          \
    }

F16C_KERNEL(sum, hcclSum, _mm256_add_ps)
F16C_KERNEL(prod, hcclProd, _mm256_mul_ps)
F16C_KERNEL(max, hcclMax, _mm256_max_ps)
F16C_KERNEL(min, hcclMin, _mm256_min_ps)

/* ---- bf16: AVX-512 BF16 ---- */

#define BF16_512 __attribute__((target("avx512f,avx512bf16")))

/* The portable encoder on 16 fp32 values, as 32-bit lanes holding the bf16 bits. */
static inline BF16_512 __m512i bf16_round_512(__m512i u)
{
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rne = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
    __mmask16 is_nan = _mm512_cmpgt_epi32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));

    return _mm512_mask_blend_epi32(is_nan, rne, nan);
}

#define BF16_512_KERNEL(op_x, rop_x, vop_x)                                                \
    static BF16_512 void bf16_512_##op_x(void *dst, const void *av, const void *bv,        \
                                         size_t n)                                         \
    {                                                                                      \
        uint16_t *d = dst;                                                                 \
        const uint16_t *a = av;                                                            \
        const uint16_t *b = bv;                                                            \
        const __m512i mag = _mm512_set1_epi32(0x7fffffff);                                 \
        const __m512i inf = _mm512_set1_epi32(0x7f800000);                                 \
        size_t i = 0;                                                                      \
                                                                                           \
        for (; n - i >= CHUNK; i += CHUNK) {                                               \
            __m512i ua = _mm512_slli_epi32(                                                \
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(a + i))), 16);  \
            __m512i ub = _mm512_slli_epi32(                                                \
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(b + i))), 16);  \
            __m512i r;                                                                     \
            __m256i out;                                                                   \
            __mmask16 sub;                                                                 \
                                                                                           \
            if (_mm512_cmpgt_epi32_mask(_mm512_and_si512(ua, mag), inf) |                  \
                _mm512_cmpgt_epi32_mask(_mm512_and_si512(ub, mag), inf)) {                 \
                hccl_reduce_portable(d + i, a + i, b + i, CHUNK, hcclBfloat16, rop_x);     \
                continue;                                                                  \
            }                                                                              \
            r = _mm512_castps_si512(                                                       \
                vop_x(_mm512_castsi512_ps(ua), _mm512_castsi512_ps(ub)));                  \
            /* Exponent zero, mantissa not: a subnormal that vcvtneps2bf16 would zero. */  \
            sub = _mm512_testn_epi32_mask(r, inf) &                                        \
                  _mm512_test_epi32_mask(r, _mm512_set1_epi32(0x007fffff));                \
            if (sub)                                                                       \
                out = _mm512_cvtepi32_epi16(bf16_round_512(r));                            \
            else                                                                           \
                out = (__m256i)_mm512_cvtneps_pbh(_mm512_castsi512_ps(r));                 \
            _mm256_storeu_si256((__m256i *)(d + i), out);                                  \
        }                                                                                  \
        if (i < n)                                                                         \
            hccl_reduce_portable(d + i, a + i, b + i, n - i, hcclBfloat16, rop_x);         \
    }

BF16_512_KERNEL(sum, hcclSum, _mm512_add_ps)
BF16_512_KERNEL(prod, hcclProd, _mm512_mul_ps)
BF16_512_KERNEL(max, hcclMax, _mm512_max_ps)
BF16_512_KERNEL(min, hcclMin, _mm512_min_ps)

/* ---- bf16: AVX2 ---- */

#define AVX2 __attribute__((target("avx2")))

/* All ones in the lanes of 8 bf16 values that are NaN. */
static inline AVX2 __m128i bf16_nan_lanes(__m128i h)
{
    __m128i mag = _mm_and_si128(h, _mm_set1_epi16(0x7fff));

    return _mm_cmpgt_epi16(mag, _mm_set1_epi16(0x7f80));
}

static inline AVX2 __m256 bf16_widen_256(__m128i h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The portable encoder on 8 fp32 values, as 32-bit lanes holding the bf16 bits. */
static inline AVX2 __m256i bf16_round_256(__m256 f)
{
    __m256i u = _mm256_castps_si256(f);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i rne = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
    __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                        _mm256_set1_epi32(0x7f800000));

    return _mm256_blendv_epi8(rne, nan, is_nan);
}

/* Lanes hold values up to 0xffff, so the unsigned-saturating pack is exact; it packs within
 * 128-bit halves, and the permute puts r0's eight before r1's. */
#define AVX2_BF16_KERNEL(op_x, rop_x, vop_x)                                               \
    static AVX2 void bf16_avx2_##op_x(void *dst, const void *av, const void *bv, size_t n) \
    {                                                                                      \
        uint16_t *d = dst;                                                                 \
        const uint16_t *a = av;                                                            \
        const uint16_t *b = bv;                                                            \
        size_t i = 0;                                                                      \
                                                                                           \
        for (; n - i >= CHUNK; i += CHUNK) {                                               \
            __m128i a0 = _mm_loadu_si128((const __m128i *)(a + i));                        \
            __m128i a1 = _mm_loadu_si128((const __m128i *)(a + i + 8));                    \
            __m128i b0 = _mm_loadu_si128((const __m128i *)(b + i));                        \
            __m128i b1 = _mm_loadu_si128((const __m128i *)(b + i + 8));                    \
            __m128i nan = _mm_or_si128(_mm_or_si128(bf16_nan_lanes(a0), bf16_nan_lanes(a1)), \
                                       _mm_or_si128(bf16_nan_lanes(b0), bf16_nan_lanes(b1))); \
            __m256i r0, r1;                                                                \
                                                                                           \
            if (_mm_movemask_epi8(nan) != 0) {                                             \
                hccl_reduce_portable(d + i, a + i, b + i, CHUNK, hcclBfloat16, rop_x);     \
                continue;                                                                  \
            }                                                                              \
            r0 = bf16_round_256(vop_x(bf16_widen_256(a0), bf16_widen_256(b0)));            \
            r1 = bf16_round_256(vop_x(bf16_widen_256(a1), bf16_widen_256(b1)));            \
            r0 = _mm256_permute4x64_epi64(_mm256_packus_epi32(r0, r1), 0xd8);              \
            _mm256_storeu_si256((__m256i *)(d + i), r0);                                   \
        }                                                                                  \
        if (i < n)                                                                         \
            hccl_reduce_portable(d + i, a + i, b + i, n - i, hcclBfloat16, rop_x);         \
    }

AVX2_BF16_KERNEL(sum, hcclSum, _mm256_add_ps)
AVX2_BF16_KERNEL(prod, hcclProd, _mm256_mul_ps)
AVX2_BF16_KERNEL(max, hcclMax, _mm256_max_ps)
AVX2_BF16_KERNEL(min, hcclMin, _mm256_min_ps)

/* ---- lookup ---- */

/* hcclAvg reduces as hcclSum. */
#define X86_ROW(name_x)                                                                    \
    {name_x##_sum, name_x##_prod, name_x##_max, name_x##_min, name_x##_sum}

static const struct {
    const char *isa;
    hcclDataType_t dt;
    hccl_reduce_fn_t fns[hcclNumOps];
} x86_kernels[] = {
    {"f16c", hcclFloat16, X86_ROW(f16c)},
    {"avx512bf16", hcclBfloat16, X86_ROW(bf16_512)},
    {"avx2", hcclBfloat16, X86_ROW(bf16_avx2)},
};

hccl_reduce_fn_t hccl_reduce_isa_kernel(const char *isa, hcclDataType_t dt, hcclRedOp_t op)
{
    if ((unsigned)op >= hcclNumOps)
        return NULL;
    for (size_t i = 0; i < sizeof(x86_kernels) / sizeof(x86_kernels[0]); i++) {
        if (x86_kernels[i].dt == dt && strcmp(x86_kernels[i].isa, isa) == 0)
            return cpu_has(isa) ? x86_kernels[i].fns[op] : NULL;
    }
    return NULL;
}

#endif /* __x86_64__ */
