/*
 * hccl-perf: collective bandwidth and latency, measured and reported the way
 * nccl-tests does, so that its tables read side by side with theirs.
 *
 *   hccl-run -n 4 hccl-perf -C allreduce -b 8 -e 64M -f 2
 *   mpirun -np 4 -x HCCL_COMM_ID=host:port hccl-perf -C all -b 1K -e 1M -f 4 --csv
 *
 * Any launcher that hcclCommInitFromEnv understands works (hccl-run, torchrun,
 * Open MPI, MPICH/Hydra, Slurm). Times are averaged over the ranks; algbw is
 * size / time and busbw scales it by what each rank's links must carry
 * (nccl-tests' factors), which makes figures comparable across rank counts.
 */
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hccl.h"

#define PERF_MAX_SIZES 256
#define PERF_MAX_INFLIGHT 64

enum perf_coll { C_ALLREDUCE, C_BROADCAST, C_REDUCE, C_ALLGATHER, C_REDUCESCATTER, C_ALLTOALL, C_NCOLL };

static const char *const coll_names[C_NCOLL] = {"allreduce", "broadcast", "reduce",
                                                 "allgather", "reducescatter", "alltoall"};

typedef struct {
    const char *name; /* as nccl-tests prints it */
    const char *alias;
    hcclDataType_t dtype;
    size_t size;
} dtype_info_t;

static const dtype_info_t dtypes[] = {
    {"int8", "char", hcclInt8, 1},          {"uint8", "uchar", hcclUint8, 1},
    {"int32", "int", hcclInt32, 4},         {"uint32", "uint", hcclUint32, 4},
    {"int64", "long", hcclInt64, 8},        {"uint64", "ulong", hcclUint64, 8},
    {"half", "float16", hcclFloat16, 2},    {"bfloat16", "bf16", hcclBfloat16, 2},
    {"float", "float32", hcclFloat32, 4},   {"double", "float64", hcclFloat64, 8},
};

static const char *const op_names[] = {"sum", "prod", "max", "min", "avg"};

typedef struct {
    int colls[C_NCOLL], ncolls;
    size_t min_bytes, max_bytes, step_bytes;
    size_t list[PERF_MAX_SIZES]; /* -s: these sizes instead of -b/-e/-f */
    int nlist;
    double factor;
    int iters, warmup, check, blocking, inflight, root;
    double time_budget; /* seconds per size and placement; 0: use iters */
    const dtype_info_t *dt;
    hcclRedOp_t op;
    const char *algo;
    int csv, json;
    int placements; /* bit 0 out-of-place, bit 1 in-place */
} opts_t;

typedef struct {
    hcclComm_t comm;
    int rank, n;
    const opts_t *o;
    char *send[PERF_MAX_INFLIGHT], *recv[PERF_MAX_INFLIGHT];
    size_t cap; /* bytes of each buffer */
    double bw_sum;
    int bw_rows;
    long long wrong_total;
    int json_rows;
} perf_t;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        hcclResult_t r_ = (call);                                                                  \
        if (r_ != hcclSuccess) {                                                                   \
            fprintf(stderr, "hccl-perf: %s failed: %s: %s\n", #call, hcclGetErrorString(r_),     \
                    hcclGetLastError(NULL));                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    double v = strtod(s, &end);

    switch (*end) {
    case 'G': case 'g': v *= 1024; /* fall through */
    case 'M': case 'm': v *= 1024; /* fall through */
    case 'K': case 'k': v *= 1024; end++; break;
    default: break;
    }
    if (end == s || (*end && strcmp(end, "B") != 0 && strcmp(end, "b") != 0) || v < 0)
        return -1;
    *out = (size_t)v;
    return 0;
}

/* ---- element access: every dtype through double (the test values are small integers) ---- */

static uint16_t to_half(float f)
{
    union { float f; uint32_t u; } x = {f};
    uint32_t sign = (x.u >> 16) & 0x8000u, mant = x.u & 0x7fffffu;
    int exp = (int)((x.u >> 23) & 0xff) - 127 + 15;

    if (f == 0.0f)
        return (uint16_t)sign;
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0)
        return (uint16_t)sign; /* the tool's values never get this small */
    /* round to nearest even on the 13 dropped bits */
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13), rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)h;
}

static float from_half(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    union { uint32_t u; float f; } x;

    if (exp == 0) {
        float v = ldexpf((float)mant, -24);
        return sign ? -v : v;
    }
    x.u = sign | (exp == 31 ? 0xff : exp - 15 + 127) << 23 | mant << 13;
    return x.f;
}

static uint16_t to_bf16(float f)
{
    union { float f; uint32_t u; } x = {f};
    return (uint16_t)((x.u + 0x7fffu + ((x.u >> 16) & 1u)) >> 16);
}

static float from_bf16(uint16_t b)
{
    union { uint32_t u; float f; } x = {(uint32_t)b << 16};
    return x.f;
}

static void put(void *buf, hcclDataType_t dt, size_t i, double v)
{
    switch (dt) {
    case hcclInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case hcclUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case hcclInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case hcclUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case hcclInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case hcclUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case hcclFloat16: ((uint16_t *)buf)[i] = to_half((float)v); break;
    case hcclBfloat16: ((uint16_t *)buf)[i] = to_bf16((float)v); break;
    case hcclFloat32: ((float *)buf)[i] = (float)v; break;
    default: ((double *)buf)[i] = v; break;
    }
}

static double get(const void *buf, hcclDataType_t dt, size_t i)
{
    switch (dt) {
    case hcclInt8: return ((const int8_t *)buf)[i];
    case hcclUint8: return ((const uint8_t *)buf)[i];
    case hcclInt32: return ((const int32_t *)buf)[i];
    case hcclUint32: return ((const uint32_t *)buf)[i];
    case hcclInt64: return (double)((const int64_t *)buf)[i];
    case hcclUint64: return (double)((const uint64_t *)buf)[i];
    case hcclFloat16: return from_half(((const uint16_t *)buf)[i]);
    case hcclBfloat16: return from_bf16(((const uint16_t *)buf)[i]);
    case hcclFloat32: return ((const float *)buf)[i];
    default: return ((const double *)buf)[i];
    }
}

static int is_integer(hcclDataType_t dt)
{
    return dt != hcclFloat16 && dt != hcclBfloat16 && dt != hcclFloat32 && dt != hcclFloat64;
}

/*
 * Rank r's input element at global index i. Small integers, so that every
 * reduction over up to ~40 ranks is exact in every dtype; the product has one
 * factor 2 per element, so it is 2 whatever the rank count.
 */
static double input_value(hcclRedOp_t op, int n, int r, size_t i)
{
    switch (op) {
    case hcclProd: return (r + i) % (size_t)n == 0 ? 2.0 : 1.0;
    case hcclMax:
    case hcclMin: return (double)((r + i) % 5);
    default: return (double)(1 + (r + i) % 3);
    }
}

static double reduced_value(hcclRedOp_t op, hcclDataType_t dt, int n, size_t i)
{
    double acc = input_value(op, n, 0, i);

    for (int r = 1; r < n; r++) {
        double v = input_value(op, n, r, i);
        switch (op) {
        case hcclProd: acc *= v; break;
        case hcclMax: acc = v > acc ? v : acc; break;
        case hcclMin: acc = v < acc ? v : acc; break;
        default: acc += v; break;
        }
    }
    if (op == hcclAvg)
        acc = is_integer(dt) ? floor(acc / n) : acc / n;
    return acc;
}

/* The expected values repeat with period lcm(3, 5, n), which divides 15 n. */
typedef struct {
    double *v;
    size_t period;
} expect_t;

static int expect_init(expect_t *e, const opts_t *o, int n)
{
    e->period = 15u * (size_t)n;
    e->v = malloc(e->period * sizeof(double));
    if (!e->v)
        return -1;
    for (size_t i = 0; i < e->period; i++)
        e->v[i] = reduced_value(o->op, o->dt->dtype, n, i);
    return 0;
}

static long long count_wrong(const void *buf, hcclDataType_t dt, size_t count, size_t first,
                             const expect_t *e)
{
    double tol = dt == hcclFloat16 ? 1e-3 : dt == hcclBfloat16 ? 1e-2 : dt == hcclFloat32 ? 1e-6 : 1e-12;
    long long wrong = 0;

    for (size_t i = 0; i < count; i++) {
        double want = e->v[(first + i) % e->period], got = get(buf, dt, i);
        if (!(fabs(got - want) <= tol * fabs(want)))
            wrong++;
    }
    return wrong;
}

/* Data-movement collectives: the value of element k of block b sent by rank r. */
static double moved_value(int r, int b, size_t k)
{
    return (double)(((size_t)r * 7 + (size_t)b * 3 + k) % 11);
}

/* ---- one collective call ---- */

typedef struct {
    size_t count;      /* elements the API call takes */
    size_t send_elems; /* elements each rank's send buffer holds */
    size_t recv_elems;
} shape_t;

static shape_t shape_of(int coll, size_t bytes, size_t es, int n)
{
    size_t total = bytes / es, per = total / (size_t)n;
    shape_t s = {total, total, total};

    switch (coll) {
    case C_ALLGATHER: s = (shape_t){per, per, per * (size_t)n}; break;
    case C_REDUCESCATTER: s = (shape_t){per, per * (size_t)n, per}; break;
    case C_ALLTOALL: s = (shape_t){per, per * (size_t)n, per * (size_t)n}; break;
    default: break;
    }
    return s;
}

static double bus_factor(int coll, int n)
{
    switch (coll) {
    case C_ALLREDUCE: return 2.0 * (n - 1) / n;
    case C_ALLGATHER:
    case C_REDUCESCATTER:
    case C_ALLTOALL: return (double)(n - 1) / n;
    default: return 1.0;
    }
}

/* Where the call reads and writes for buffer set k; in place per the API's rules (docs/api.md). */
static void buffers(perf_t *p, int coll, int in_place, const shape_t *s, int k, void **sb, void **rb)
{
    size_t es = p->o->dt->size;

    *sb = p->send[k];
    *rb = p->recv[k];
    if (!in_place)
        return;
    switch (coll) {
    case C_ALLGATHER: *sb = p->recv[k] + (size_t)p->rank * s->count * es; break;
    case C_REDUCESCATTER: *rb = p->send[k] + (size_t)p->rank * s->count * es; break;
    default: *rb = *sb = p->recv[k]; break;
    }
}

static hcclResult_t post(perf_t *p, int coll, void *sb, void *rb, const shape_t *s, hcclRequest_t *req)
{
    const opts_t *o = p->o;
    hcclDataType_t dt = o->dt->dtype;
    hcclComm_t c = p->comm;

    if (o->blocking) {
        *req = NULL;
        switch (coll) {
        case C_ALLREDUCE: return hcclAllReduce(sb, rb, s->count, dt, o->op, c);
        case C_BROADCAST: return hcclBroadcast(rb, s->count, dt, o->root, c);
        case C_REDUCE: return hcclReduce(sb, rb, s->count, dt, o->op, o->root, c);
        case C_ALLGATHER: return hcclAllGather(sb, rb, s->count, dt, c);
        case C_REDUCESCATTER: return hcclReduceScatter(sb, rb, s->count, dt, o->op, c);
        default: return hcclAlltoAll(sb, rb, s->count, dt, c);
        }
    }
    switch (coll) {
    case C_ALLREDUCE: return hcclAllReduceAsync(sb, rb, s->count, dt, o->op, c, req);
    case C_BROADCAST: return hcclBroadcastAsync(rb, s->count, dt, o->root, c, req);
    case C_REDUCE: return hcclReduceAsync(sb, rb, s->count, dt, o->op, o->root, c, req);
    case C_ALLGATHER: return hcclAllGatherAsync(sb, rb, s->count, dt, c, req);
    case C_REDUCESCATTER: return hcclReduceScatterAsync(sb, rb, s->count, dt, o->op, c, req);
    default: return hcclAlltoAllAsync(sb, rb, s->count, dt, c, req);
    }
}

/* One iteration: inflight collectives posted together, then all waited for. */
static void iterate(perf_t *p, int coll, int in_place, const shape_t *s)
{
    hcclRequest_t reqs[PERF_MAX_INFLIGHT];
    int k;

    for (k = 0; k < p->o->inflight; k++) {
        void *sb, *rb;
        buffers(p, coll, in_place, s, k, &sb, &rb);
        CHECK(post(p, coll, sb, rb, s, &reqs[k]));
    }
    CHECK(hcclWaitAll(p->o->inflight, reqs));
}

/* Fills buffer set k with this rank's inputs for coll. */
static void fill(perf_t *p, int coll, int in_place, const shape_t *s, int k)
{
    hcclDataType_t dt = p->o->dt->dtype;
    void *sb, *rb;
    size_t i;

    buffers(p, coll, in_place, s, k, &sb, &rb);
    /* Out of place, what an earlier call left in the receive buffer must not pass the check. */
    if (!in_place && coll != C_BROADCAST)
        memset(rb, 0xa5, s->recv_elems * p->o->dt->size);
    switch (coll) {
    case C_ALLREDUCE:
    case C_REDUCE:
        for (i = 0; i < s->count; i++)
            put(sb, dt, i, input_value(p->o->op, p->n, p->rank, i));
        break;
    case C_REDUCESCATTER:
        for (i = 0; i < s->send_elems; i++)
            put(sb, dt, i, input_value(p->o->op, p->n, p->rank, i));
        break;
    case C_BROADCAST:
        for (i = 0; i < s->count; i++)
            put(rb, dt, i, p->rank == p->o->root ? moved_value(p->rank, 0, i) : 99.0);
        break;
    case C_ALLGATHER:
        for (i = 0; i < s->count; i++)
            put(sb, dt, i, moved_value(p->rank, 0, i));
        break;
    default:
        for (int b = 0; b < p->n; b++)
            for (i = 0; i < s->count; i++)
                put(sb, dt, (size_t)b * s->count + i, moved_value(p->rank, b, i));
        break;
    }
}

static long long check_result(perf_t *p, int coll, int in_place, const shape_t *s, int k,
                              const expect_t *e)
{
    hcclDataType_t dt = p->o->dt->dtype;
    size_t es = p->o->dt->size;
    long long wrong = 0;
    void *sb, *rb;
    size_t i;

    buffers(p, coll, in_place, s, k, &sb, &rb);
    switch (coll) {
    case C_ALLREDUCE: return count_wrong(rb, dt, s->count, 0, e);
    case C_REDUCE: return p->rank == p->o->root ? count_wrong(rb, dt, s->count, 0, e) : 0;
    case C_REDUCESCATTER: return count_wrong(rb, dt, s->count, (size_t)p->rank * s->count, e);
    case C_BROADCAST:
        for (i = 0; i < s->count; i++)
            wrong += get(rb, dt, i) != moved_value(p->o->root, 0, i);
        return wrong;
    case C_ALLGATHER:
        for (int b = 0; b < p->n; b++)
            for (i = 0; i < s->count; i++)
                wrong += get((char *)rb + (size_t)b * s->count * es, dt, i) != moved_value(b, 0, i);
        return wrong;
    default:
        for (int b = 0; b < p->n; b++)
            for (i = 0; i < s->count; i++)
                wrong += get((char *)rb + (size_t)b * s->count * es, dt, i) != moved_value(b, p->rank, i);
        return wrong;
    }
}

/* Sum (or max) of one double over the ranks. */
static double across(perf_t *p, double v, hcclRedOp_t op)
{
    CHECK(hcclAllReduce(&v, &v, 1, hcclFloat64, op, p->comm));
    return v;
}

typedef struct {
    double time_us, algbw, busbw;
    long long wrong;
} result_t;

static result_t measure(perf_t *p, int coll, int in_place, size_t bytes, const expect_t *e)
{
    const opts_t *o = p->o;
    shape_t s = shape_of(coll, bytes, o->dt->size, p->n);
    size_t real_bytes = (coll == C_ALLGATHER || coll == C_REDUCESCATTER || coll == C_ALLTOALL
                             ? s.count * (size_t)p->n
                             : s.count) * o->dt->size;
    result_t r;
    int iters = o->iters;
    double t0;

    memset(&r, 0, sizeof(r));
    for (int k = 0; k < o->inflight; k++)
        fill(p, coll, in_place, &s, k);
    for (int w = 0; w < o->warmup; w++)
        iterate(p, coll, in_place, &s);
    if (o->time_budget > 0) {
        /* Every rank must run the same number of iterations: size them on the slowest. */
        CHECK(hcclBarrier(p->comm));
        t0 = now_s();
        iterate(p, coll, in_place, &s);
        double one = across(p, now_s() - t0, hcclMax);
        iters = (int)(o->time_budget / (one > 1e-9 ? one : 1e-9));
        iters = iters < 2 ? 2 : iters > 100000 ? 100000 : iters;
    }
    CHECK(hcclBarrier(p->comm));
    t0 = now_s();
    for (int it = 0; it < iters; it++)
        iterate(p, coll, in_place, &s);
    r.time_us = across(p, now_s() - t0, hcclSum) / p->n / iters / o->inflight * 1e6;
    if (o->check) {
        /* In place, the timed iterations reduced the results again: start over for the check. */
        for (int k = 0; k < o->inflight; k++)
            fill(p, coll, in_place, &s, k);
        iterate(p, coll, in_place, &s);
        for (int k = 0; k < o->inflight; k++)
            r.wrong += check_result(p, coll, in_place, &s, k, e);
        r.wrong = (long long)across(p, (double)r.wrong, hcclSum);
    }
    r.algbw = r.time_us > 0 ? (double)real_bytes / r.time_us / 1e3 : 0;
    r.busbw = r.algbw * bus_factor(coll, p->n);
    return r;
}

/* ---- output ---- */

static void print_header(const perf_t *p, int coll)
{
    const opts_t *o = p->o;

    if (o->csv || o->json)
        return;
    printf("#\n# %s: %d ranks, %s %s, %s, %d in flight, %s\n", coll_names[coll], p->n, o->dt->name,
           op_names[o->op], o->blocking ? "blocking calls" : "async + wait",
           o->inflight, o->algo ? o->algo : "algorithm chosen by the tuner");
    if (o->time_budget > 0)
        printf("# iterations: %.2f s per size, warm-up %d\n", o->time_budget, o->warmup);
    else
        printf("# iterations: %d, warm-up %d\n", o->iters, o->warmup);
    printf("#\n# %10s %12s %8s %6s %5s  %-32s   %-32s\n", "", "", "", "", "", "out-of-place",
           "in-place");
    printf("# %10s %12s %8s %6s %5s  %9s %7s %7s %6s   %9s %7s %7s %6s\n", "size", "count", "type",
           "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    printf("# %10s %12s %8s %6s %5s  %9s %7s %7s %6s   %9s %7s %7s %6s\n", "(B)", "(elements)", "", "",
           "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

static int rooted(int coll)
{
    return coll == C_BROADCAST || coll == C_REDUCE;
}

static int reducing(int coll)
{
    return coll == C_ALLREDUCE || coll == C_REDUCE || coll == C_REDUCESCATTER;
}

static void emit_row(perf_t *p, int coll, int in_place, size_t bytes, size_t count, const result_t *r)
{
    const opts_t *o = p->o;
    const char *redop = reducing(coll) ? op_names[o->op] : "none";
    int root = rooted(coll) ? o->root : -1;

    if (o->csv) {
        printf("%s,%zu,%zu,%s,%s,%d,%s,%.3f,%.4f,%.4f,%lld,%d,%s\n", coll_names[coll], bytes, count,
               o->dt->name, redop, root, in_place ? "ip" : "oop", r->time_us, r->algbw, r->busbw,
               o->check ? r->wrong : -1LL, p->n, o->algo ? o->algo : "auto");
    } else if (o->json) {
        printf("%s\n  {\"collective\": \"%s\", \"size\": %zu, \"count\": %zu, \"type\": \"%s\", "
               "\"redop\": \"%s\", \"root\": %d, \"placement\": \"%s\", \"time_us\": %.3f, "
               "\"algbw\": %.4f, \"busbw\": %.4f, \"wrong\": %lld, \"nranks\": %d, \"algo\": \"%s\"}",
               p->json_rows++ ? "," : "", coll_names[coll], bytes, count, o->dt->name, redop, root,
               in_place ? "ip" : "oop", r->time_us, r->algbw, r->busbw, o->check ? r->wrong : -1LL,
               p->n, o->algo ? o->algo : "auto");
    }
}

static void run_coll(perf_t *p, int coll)
{
    const opts_t *o = p->o;
    size_t es = o->dt->size;
    expect_t e;

    if (expect_init(&e, o, p->n) != 0) {
        fprintf(stderr, "hccl-perf: out of memory\n");
        exit(1);
    }
    if (p->rank == 0)
        print_header(p, coll);
    for (size_t bytes = o->nlist ? o->list[0] : o->min_bytes, next = 1;
         o->nlist ? next <= (size_t)o->nlist : bytes <= o->max_bytes;) {
        shape_t s = shape_of(coll, bytes, es, p->n);
        size_t shown = (coll == C_ALLGATHER || coll == C_REDUCESCATTER || coll == C_ALLTOALL
                            ? s.count * (size_t)p->n
                            : s.count) * es;
        /* Broadcast has one buffer in this API: it is always in place. */
        int want_oop = (o->placements & 1) && coll != C_BROADCAST;
        int want_ip = ((o->placements & 2) && coll != C_ALLTOALL) || coll == C_BROADCAST;
        result_t res[2];

        memset(res, 0, sizeof(res));

        if (want_oop)
            res[0] = measure(p, coll, 0, bytes, &e);
        if (want_ip)
            res[1] = measure(p, coll, 1, bytes, &e);
        if (p->rank == 0) {
            if (!o->csv && !o->json) {
                printf("  %10zu %12zu %8s %6s %5d ", shown, s.count, o->dt->name,
                       reducing(coll) ? op_names[o->op] : "none", rooted(coll) ? o->root : -1);
                for (int ip = 0; ip < 2; ip++) {
                    if ((ip ? want_ip : want_oop) == 0)
                        printf(" %9s %7s %7s %6s  ", "-", "-", "-", "-");
                    else if (o->check)
                        printf(" %9.2f %7.3f %7.3f %6lld  ", res[ip].time_us, res[ip].algbw,
                               res[ip].busbw, res[ip].wrong);
                    else
                        printf(" %9.2f %7.3f %7.3f %6s  ", res[ip].time_us, res[ip].algbw,
                               res[ip].busbw, "N/A");
                }
                printf("\n");
                fflush(stdout);
            }
            for (int ip = 0; ip < 2; ip++)
                if (ip ? want_ip : want_oop)
                    emit_row(p, coll, ip, shown, s.count, &res[ip]);
        }
        for (int ip = 0; ip < 2; ip++)
            if (ip ? want_ip : want_oop) {
                p->bw_sum += res[ip].busbw;
                p->bw_rows++;
                p->wrong_total += res[ip].wrong;
            }
        if (o->nlist) {
            if (next < (size_t)o->nlist)
                bytes = o->list[next];
            next++;
        } else if (o->step_bytes)
            bytes += o->step_bytes;
        else if ((double)bytes * o->factor <= (double)bytes)
            break;
        else
            bytes = (size_t)((double)bytes * o->factor);
    }
    free(e.v);
}

/* ---- options ---- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: hccl-perf [options]   (run it under hccl-run, mpirun, torchrun or srun)\n"
            "  -C, --coll NAME       allreduce|broadcast|reduce|allgather|reducescatter|alltoall|all\n"
            "                        (default allreduce)\n"
            "  -b, --minbytes SIZE   smallest size (default 8; K, M, G suffixes)\n"
            "  -e, --maxbytes SIZE   largest size (default 32M)\n"
            "  -f, --stepfactor F    multiply the size by F each step (default 2)\n"
            "  -i, --stepbytes SIZE  or add SIZE each step\n"
            "  -s, --sizes LIST      or exactly these sizes, e.g. 8,64K,1M,64M\n"
            "  -n, --iters N         timed iterations per size (default 20)\n"
            "  -w, --warmup_iters N  untimed iterations first (default 5)\n"
            "  -T, --time S          instead of -n: about S seconds of timed iterations per size\n"
            "  -c, --check 0|1       check the results (default 1)\n"
            "  -d, --datatype T      int8 uint8 int32 uint32 int64 uint64 half bfloat16 float double\n"
            "                        (default float)\n"
            "  -o, --op OP           sum prod max min avg (default sum)\n"
            "  -r, --root R          root of broadcast and reduce (default 0)\n"
            "  -a, --algo A          force an algorithm (HCCL_ALGO syntax, e.g. ring or allreduce=tree)\n"
            "  -z, --blocking 0|1    1: blocking calls; 0: async then wait (default 0)\n"
            "  -N, --inflight N      collectives posted together before waiting (default 1, at most %d),\n"
            "                        each on its own buffers; with -z 1 they run one after another\n"
            "  -p, --placement P     oop, ip or both (default both)\n"
            "      --csv             machine-readable rows instead of the table\n"
            "      --json            a JSON array instead of the table\n"
            "  -h, --help\n"
            "size is in bytes as in nccl-tests: the whole buffer for allreduce, broadcast and reduce,\n"
            "the gathered output for allgather, the input for reducescatter, each rank's send buffer\n"
            "for alltoall. busbw = algbw x 2(n-1)/n (allreduce), (n-1)/n (allgather, reducescatter,\n"
            "alltoall), 1 (broadcast, reduce).\n",
            PERF_MAX_INFLIGHT);
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);

    if (end == s || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

static int lookup(const char *s, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

static int parse_opts(int argc, char **argv, opts_t *o)
{
    static const struct option longs[] = {
        {"coll", 1, 0, 'C'},     {"minbytes", 1, 0, 'b'}, {"maxbytes", 1, 0, 'e'},
        {"stepfactor", 1, 0, 'f'}, {"stepbytes", 1, 0, 'i'}, {"iters", 1, 0, 'n'},
        {"warmup_iters", 1, 0, 'w'}, {"time", 1, 0, 'T'}, {"check", 1, 0, 'c'},
        {"datatype", 1, 0, 'd'}, {"op", 1, 0, 'o'},        {"root", 1, 0, 'r'},
        {"algo", 1, 0, 'a'},     {"blocking", 1, 0, 'z'}, {"inflight", 1, 0, 'N'},
        {"placement", 1, 0, 'p'}, {"csv", 0, 0, 1},       {"json", 0, 0, 2},
        {"sizes", 1, 0, 's'},
        {"help", 0, 0, 'h'},     {0, 0, 0, 0}};
    int c, idx;
    char *end;

    *o = (opts_t){.colls = {C_ALLREDUCE}, .ncolls = 1, .min_bytes = 8, .max_bytes = 32u << 20,
                  .factor = 2, .iters = 20, .warmup = 5, .check = 1, .inflight = 1,
                  .dt = &dtypes[8], .op = hcclSum, .placements = 3};
    while ((c = getopt_long(argc, argv, "C:b:e:f:i:n:w:T:c:d:o:r:a:z:N:p:s:h", longs, &idx)) != -1) {
        int bad = 0;
        switch (c) {
        case 'C':
            if (strcmp(optarg, "all") == 0) {
                for (int k = 0; k < C_NCOLL; k++)
                    o->colls[k] = k;
                o->ncolls = C_NCOLL;
            } else {
                o->colls[0] = lookup(optarg, coll_names, C_NCOLL);
                o->ncolls = 1;
                bad = o->colls[0] < 0;
            }
            break;
        case 'b': bad = parse_size(optarg, &o->min_bytes); break;
        case 'e': bad = parse_size(optarg, &o->max_bytes); break;
        case 'f':
            o->factor = strtod(optarg, &end);
            bad = *end || !(o->factor > 1);
            break;
        case 'i': bad = parse_size(optarg, &o->step_bytes) || o->step_bytes == 0; break;
        case 's': {
            char buf[1024], *save = NULL;
            snprintf(buf, sizeof(buf), "%s", optarg);
            o->nlist = 0;
            for (char *t = strtok_r(buf, ",", &save); t && !bad; t = strtok_r(NULL, ",", &save)) {
                bad = o->nlist == PERF_MAX_SIZES || parse_size(t, &o->list[o->nlist]);
                o->nlist++;
            }
            bad |= o->nlist == 0;
            break;
        }
        case 'n': bad = parse_int(optarg, 1, 100000000, &o->iters); break;
        case 'w': bad = parse_int(optarg, 0, 100000000, &o->warmup); break;
        case 'T':
            o->time_budget = strtod(optarg, &end);
            bad = *end || !(o->time_budget > 0);
            break;
        case 'c': bad = parse_int(optarg, 0, 1, &o->check); break;
        case 'd':
            o->dt = NULL;
            for (size_t k = 0; k < sizeof(dtypes) / sizeof(dtypes[0]); k++)
                if (strcmp(optarg, dtypes[k].name) == 0 || strcmp(optarg, dtypes[k].alias) == 0)
                    o->dt = &dtypes[k];
            bad = o->dt == NULL;
            break;
        case 'o':
            idx = lookup(optarg, op_names, 5);
            bad = idx < 0;
            o->op = (hcclRedOp_t)idx;
            break;
        case 'r': bad = parse_int(optarg, 0, 1 << 30, &o->root); break;
        case 'a': o->algo = optarg; break;
        case 'z': bad = parse_int(optarg, 0, 1, &o->blocking); break;
        case 'N': bad = parse_int(optarg, 1, PERF_MAX_INFLIGHT, &o->inflight); break;
        case 'p':
            o->placements = strcmp(optarg, "oop") == 0 ? 1 : strcmp(optarg, "ip") == 0 ? 2
                            : strcmp(optarg, "both") == 0 ? 3 : 0;
            bad = o->placements == 0;
            break;
        case 1: o->csv = 1; break;
        case 2: o->json = 1; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
        if (bad) {
            fprintf(stderr, "hccl-perf: bad value '%s' for -%c\n", optarg, c);
            return -1;
        }
    }
    if (optind < argc || (!o->nlist && o->min_bytes > o->max_bytes)) {
        fprintf(stderr, "hccl-perf: %s\n", optind < argc ? "unexpected argument" : "-b is above -e");
        return -1;
    }
    if (o->csv && o->json) {
        fprintf(stderr, "hccl-perf: --csv and --json exclude each other\n");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    opts_t o;
    perf_t p = {.o = &o};
    int version;

    if (parse_opts(argc, argv, &o) != 0)
        return 2;
    /* hcclCommInitFromEnv reads HCCL_ALGO; -a overrides whatever the environment held. */
    if (o.algo)
        setenv("HCCL_ALGO", o.algo, 1);
    CHECK(hcclCommInitFromEnv(&p.comm));
    CHECK(hcclCommUserRank(p.comm, &p.rank));
    CHECK(hcclCommCount(p.comm, &p.n));
    CHECK(hcclGetVersion(&version));
    if (o.root >= p.n) {
        if (p.rank == 0)
            fprintf(stderr, "hccl-perf: root %d is not a rank of %d\n", o.root, p.n);
        hcclCommDestroy(p.comm);
        return 2;
    }
    /* One capacity for every collective: the largest buffer any of them uses at max_bytes. */
    for (int i = 0; i < o.nlist; i++)
        o.max_bytes = i == 0 || o.list[i] > o.max_bytes ? o.list[i] : o.max_bytes;
    p.cap = o.max_bytes ? o.max_bytes : 1;
    for (int k = 0; k < o.inflight; k++) {
        if (posix_memalign((void **)&p.send[k], 4096, p.cap) != 0 ||
            posix_memalign((void **)&p.recv[k], 4096, p.cap) != 0) {
            fprintf(stderr, "hccl-perf: rank %d: cannot allocate 2 x %d x %zu bytes\n", p.rank,
                    o.inflight, p.cap);
            return 1;
        }
        /* Fault the pages in now, not inside the first timed size. */
        memset(p.send[k], 0, p.cap);
        memset(p.recv[k], 0, p.cap);
    }
    if (p.rank == 0 && !o.csv && !o.json)
        printf("# hccl-perf, hccl %d.%d.%d, %d ranks\n", version / 10000, version / 100 % 100,
               version % 100, p.n);
    if (p.rank == 0 && o.csv)
        printf("collective,size,count,type,redop,root,placement,time_us,algbw,busbw,wrong,nranks,algo\n");
    if (p.rank == 0 && o.json)
        printf("[");
    for (int i = 0; i < o.ncolls; i++)
        run_coll(&p, o.colls[i]);
    if (p.rank == 0 && o.json)
        printf("\n]\n");
    if (p.rank == 0 && !o.csv && !o.json) {
        printf("# Out of bounds values : %lld %s\n", o.check ? p.wrong_total : 0LL,
               !o.check ? "(not checked)" : p.wrong_total ? "WRONG" : "OK");
        printf("# Avg bus bandwidth    : %g\n#\n", p.bw_rows ? p.bw_sum / p.bw_rows : 0.0);
    }
    CHECK(hcclCommDestroy(p.comm));
    for (int k = 0; k < o.inflight; k++) {
        free(p.send[k]);
        free(p.recv[k]);
    }
    return p.wrong_total ? 1 : 0;
}
