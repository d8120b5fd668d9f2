/*
 * The data of mp_soak: what each rank contributes to a collective and what it must get back,
 * in every dtype. Values are small integers (0..3; 1..2 for products, from at most 6 ranks),
 * so that sums, products, minima and maxima are exact in every dtype, float16 and bfloat16
 * included, and every rank can compute any rank's contribution from (rank, collective, index).
 */
#ifndef HCCL_TESTS_SOAK_DATA_H
#define HCCL_TESTS_SOAK_DATA_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "hccl.h"

typedef enum {
    SOAK_ALLREDUCE,
    SOAK_BROADCAST,
    SOAK_REDUCE,
    SOAK_ALLGATHER,
    SOAK_REDUCESCATTER,
    SOAK_ALLTOALL,
    SOAK_BARRIER,
    SOAK_NCOLLS
} soak_coll_t;

static inline const char *soak_coll_name(soak_coll_t c)
{
    static const char *const names[] = {"allreduce",     "broadcast", "reduce", "allgather",
                                        "reducescatter", "alltoall",  "barrier"};
    return (unsigned)c < SOAK_NCOLLS ? names[c] : "?";
}

static inline const char *soak_result_name(hcclResult_t res)
{
    static const char *const names[] = {
        "hcclSuccess",     "hcclInvalidArgument", "hcclInvalidUsage", "hcclSystemError",
        "hcclRemoteError", "hcclTimeout",         "hcclInProgress",   "hcclAborted",
        "hcclUnsupported", "hcclInternalError",
    };
    return (unsigned)res < sizeof(names) / sizeof(names[0]) ? names[res] : "unknown";
}

static inline size_t soak_dtype_size(hcclDataType_t dt)
{
    switch (dt) {
    case hcclInt8:
    case hcclUint8:
        return 1;
    case hcclFloat16:
    case hcclBfloat16:
        return 2;
    case hcclInt32:
    case hcclUint32:
    case hcclFloat32:
        return 4;
    default:
        return 8;
    }
}

static inline const char *soak_dtype_name(hcclDataType_t dt)
{
    static const char *const names[] = {"int8",   "uint8",   "int32",    "uint32",  "int64",
                                        "uint64", "float16", "bfloat16", "float32", "float64"};
    return (unsigned)dt < hcclNumTypes ? names[dt] : "?";
}

/* Rank r's element i of collective id. */
static inline double soak_value(int rank, long id, size_t i, hcclRedOp_t op)
{
    uint64_t h = (uint64_t)rank * 3u + (uint64_t)id * 7u + (uint64_t)(i % 97u) * 13u;

    if (op == hcclProd)
        return rank < 6 && ((h >> 1) & 1) ? 2.0 : 1.0;
    return (double)(h % 4u);
}

static inline uint16_t soak_half_bits(double v)
{
    int e;
    double m;

    if (v == 0)
        return 0;
    m = frexp(v, &e); /* v = m * 2^e, m in [0.5, 1) */
    return (uint16_t)(((e - 1 + 15) << 10) | (uint16_t)((m * 2 - 1) * 1024 + 0.5));
}

static inline double soak_half_value(uint16_t b)
{
    int e = (b >> 10) & 0x1f, m = b & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? INFINITY : ldexp(1024 + m, e - 25);

    return b & 0x8000 ? -v : v;
}

static inline void *soak_at(const void *buf, size_t i, hcclDataType_t dt)
{
    return (char *)(uintptr_t)buf + i * soak_dtype_size(dt);
}

static inline void soak_set(void *buf, size_t i, hcclDataType_t dt, double v)
{
    void *p = soak_at(buf, i, dt);
    float f = (float)v;
    uint32_t fb;
    uint16_t hb;

    switch (dt) {
    case hcclInt8:
        *(int8_t *)p = (int8_t)v;
        break;
    case hcclUint8:
        *(uint8_t *)p = (uint8_t)v;
        break;
    case hcclInt32:
        *(int32_t *)p = (int32_t)v;
        break;
    case hcclUint32:
        *(uint32_t *)p = (uint32_t)v;
        break;
    case hcclInt64:
        *(int64_t *)p = (int64_t)v;
        break;
    case hcclUint64:
        *(uint64_t *)p = (uint64_t)v;
        break;
    case hcclFloat16:
        hb = soak_half_bits(v);
        memcpy(p, &hb, 2);
        break;
    case hcclBfloat16:
        memcpy(&fb, &f, 4);
        hb = (uint16_t)(fb >> 16);
        memcpy(p, &hb, 2);
        break;
    case hcclFloat32:
        memcpy(p, &f, 4);
        break;
    default:
        memcpy(p, &v, 8);
        break;
    }
}

static inline double soak_get(const void *buf, size_t i, hcclDataType_t dt)
{
    const void *p = soak_at(buf, i, dt);
    uint32_t fb;
    uint16_t hb;
    float f;
    double d;

    switch (dt) {
    case hcclInt8:
        return *(const int8_t *)p;
    case hcclUint8:
        return *(const uint8_t *)p;
    case hcclInt32:
        return *(const int32_t *)p;
    case hcclUint32:
        return *(const uint32_t *)p;
    case hcclInt64:
        return (double)*(const int64_t *)p;
    case hcclUint64:
        return (double)*(const uint64_t *)p;
    case hcclFloat16:
        memcpy(&hb, p, 2);
        return soak_half_value(hb);
    case hcclBfloat16:
        memcpy(&hb, p, 2);
        fb = (uint32_t)hb << 16;
        memcpy(&f, &fb, 4);
        return f;
    case hcclFloat32:
        memcpy(&f, p, 4);
        return f;
    default:
        memcpy(&d, p, 8);
        return d;
    }
}

static inline void soak_fill(void *buf, size_t n, hcclDataType_t dt, hcclRedOp_t op, int rank,
                             long id)
{
    for (size_t i = 0; i < n; i++)
        soak_set(buf, i, dt, soak_value(rank, id, i, op));
}

static inline int soak_is_float(hcclDataType_t dt)
{
    return dt == hcclFloat16 || dt == hcclBfloat16 || dt == hcclFloat32 || dt == hcclFloat64;
}

/* Whether got is want: exact, except an average of floats, within its dtype's rounding. */
static inline int soak_equal(double got, double want, hcclDataType_t dt, hcclRedOp_t op)
{
    double tol;

    if (op != hcclAvg || !soak_is_float(dt))
        return got == want;
    tol = dt == hcclFloat64 ? 1e-12 : dt == hcclFloat32 ? 1e-6 : 1e-2;
    return fabs(got - want) <= tol * fabs(want) + tol;
}

/* The first of n elements of buf (elements off.. of the whole) that is not the reduction of
 * every rank's contribution, or -1. */
static inline long soak_check_reduced(const void *buf, size_t n, size_t off, hcclDataType_t dt,
                                      hcclRedOp_t op, int nranks, long id)
{
    for (size_t i = 0; i < n; i++) {
        double want = soak_value(0, id, off + i, op);

        for (int r = 1; r < nranks; r++) {
            double v = soak_value(r, id, off + i, op);

            switch (op) {
            case hcclProd:
                want *= v;
                break;
            case hcclMax:
                want = v > want ? v : want;
                break;
            case hcclMin:
                want = v < want ? v : want;
                break;
            default:
                want += v;
                break;
            }
        }
        if (op == hcclAvg)
            want = soak_is_float(dt) ? want / nranks : floor(want / nranks);
        if (!soak_equal(soak_get(buf, i, dt), want, dt, op))
            return (long)i;
    }
    return -1;
}

/* The first of n elements of buf that is not rank src's elements off.., or -1. */
static inline long soak_check_from(const void *buf, size_t n, size_t off, hcclDataType_t dt,
                                   hcclRedOp_t op, int src, long id)
{
    for (size_t i = 0; i < n; i++)
        if (soak_get(buf, i, dt) != soak_value(src, id, off + i, op))
            return (long)i;
    return -1;
}

#endif
