/* Helpers of the reduction kernels' tests (reduce_helpers.h). */
#include <math.h>
#include <stdint.h>

#include "reduce_helpers.h"

/* Mantissa and exponent bits of fp16 (10, 5) and bf16 (7, 8). */
static int narrow_mbits(hcclDataType_t dt)
{
    return dt == hcclFloat16 ? 10 : 7;
}

static int narrow_ebits(hcclDataType_t dt)
{
    return dt == hcclFloat16 ? 5 : 8;
}

double ref_decode(uint32_t bits, int mbits, int ebits)
{
    int bias = (1 << (ebits - 1)) - 1;
    uint32_t m = bits & ((1u << mbits) - 1);
    uint32_t e = (bits >> mbits) & ((1u << ebits) - 1);
    double v;

    if (e == (1u << ebits) - 1)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, 1 - bias - mbits);
    else
        v = ldexp(m + (1u << mbits), (int)e - bias - mbits);
    return (bits >> (mbits + ebits)) & 1 ? -v : v;
}

/* Independent round-to-nearest-even encoder (nearbyint at the right scale). */
static uint32_t ref_encode(double x, int mbits, int ebits)
{
    int bias = (1 << (ebits - 1)) - 1;
    uint32_t sign = signbit(x) ? 1u << (mbits + ebits) : 0;
    uint32_t inf = ((1u << ebits) - 1) << mbits;
    double ax = fabs(x);
    double q;
    int e;

    if (isnan(x))
        return sign | inf | (1u << (mbits - 1));
    if (isinf(x))
        return sign | inf;
    if (ax == 0)
        return sign;
    frexp(ax, &e);
    e -= 1; /* ax in [2^e, 2^(e+1)) */
    if (e < 1 - bias)
        e = 1 - bias; /* subnormal: the step stays 2^(1 - bias - mbits) */
    q = nearbyint(ldexp(ax, mbits - e));
    if (q >= ldexp(1, mbits + 1)) { /* rounded up to the next binade */
        q /= 2;
        e++;
    }
    if (e > bias)
        return sign | inf;
    if (q < ldexp(1, mbits))
        return sign | (uint32_t)q; /* subnormal */
    return sign | ((uint32_t)(e + bias) << mbits) | ((uint32_t)q - (1u << mbits));
}

double narrow_decode(uint16_t h, hcclDataType_t dt)
{
    return ref_decode(h, narrow_mbits(dt), narrow_ebits(dt));
}

uint16_t narrow_encode(float f, hcclDataType_t dt)
{
    return (uint16_t)ref_encode(f, narrow_mbits(dt), narrow_ebits(dt));
}
