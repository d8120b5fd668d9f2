#include <math.h>
#include <stdint.h>

#include "reference.h"

bool ref_is_int(hcclDataType_t dt)
{
    return dt <= hcclUint64;
}

bool ref_is_signed(hcclDataType_t dt)
{
    return dt == hcclInt8 || dt == hcclInt32 || dt == hcclInt64;
}

static unsigned bits_of(hcclDataType_t dt)
{
    return (unsigned)hccl_dtype_size(dt) * 8;
}

double ref_input(hcclDataType_t dt, hcclRedOp_t op, int r, size_t i, unsigned seed)
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
        if (ref_is_int(dt))
            v = (double)(h % 3) + (ref_is_signed(dt) ? -1 : 1);
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

void ref_store(void *buf, size_t i, hcclDataType_t dt, double v)
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

double ref_load(const void *buf, size_t i, hcclDataType_t dt)
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

/* Integer reference: arithmetic modulo 2^bits, then read back with the type's sign. */
static double int_wrap(uint64_t v, hcclDataType_t dt)
{
    unsigned b = bits_of(dt);
    uint64_t m = b == 64 ? v : v & ((1ull << b) - 1);
    if (ref_is_signed(dt) && b < 64 && (m >> (b - 1)))
        return (double)(int64_t)(m | ~((1ull << b) - 1));
    return ref_is_signed(dt) ? (double)(int64_t)m : (double)m;
}

double ref_reduce(hcclDataType_t dt, hcclRedOp_t op, int n, size_t i, unsigned seed)
{
    double acc = ref_input(dt, op, 0, i, seed);

    if (ref_is_int(dt)) {
        uint64_t u = (uint64_t)(int64_t)acc;
        for (int r = 1; r < n; r++) {
            double v = ref_input(dt, op, r, i, seed);
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
            acc = ref_is_signed(dt) ? (double)((int64_t)acc / n)
                                    : (double)((uint64_t)acc / (uint64_t)n);
        return acc;
    }
    for (int r = 1; r < n; r++) {
        double v = ref_input(dt, op, r, i, seed);
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

double ref_tolerance(hcclDataType_t dt, double ref)
{
    double rel = dt == hcclFloat16    ? 1e-3
                 : dt == hcclBfloat16 ? 8e-3
                 : dt == hcclFloat32  ? 1e-6
                                      : 1e-12;
    return fabs(ref) * rel + rel;
}

bool ref_close(hcclDataType_t dt, double got, double want)
{
    return ref_is_int(dt) ? got == want : fabs(got - want) <= ref_tolerance(dt, want);
}
