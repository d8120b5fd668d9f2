/*
 * primitives: the five collectives every framework uses, each result checked.
 *
 *   hccl-run -n 4 ./primitives              # counts 1, 1027 and 262144 elements
 *   hccl-run -n 3 ./primitives 5 1000000    # counts of your choice
 *
 * AllReduce (int32 sum, float32 max), Broadcast (from the last rank), AllGather,
 * ReduceScatter (float32 sum) and AlltoAll (int64). Every rank fills its
 * inputs with values that encode who sent what, so that the expected output is
 * known exactly; any wrong element is printed and the program exits 1. Rank 0
 * prints one line per collective and count with the time of the call.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hccl.h"

static int g_rank = -1;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        hcclResult_t r_ = (call);                                                                  \
        if (r_ != hcclSuccess) {                                                                   \
            fprintf(stderr, "rank %d: %s failed: %s: %s\n", g_rank, #call, hcclGetErrorString(r_), \
                    hcclGetLastError(NULL));                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);

    if (!p) {
        fprintf(stderr, "rank %d: out of memory (%zu bytes)\n", g_rank, bytes);
        exit(1);
    }
    return p;
}

/* Counts wrong elements, printing the first few. */
static int g_bad;

static void expect_i64(const char *what, size_t i, int64_t got, int64_t want)
{
    if (got == want)
        return;
    if (g_bad++ < 5)
        fprintf(stderr, "rank %d: %s: element %zu is %" PRId64 ", want %" PRId64 "\n", g_rank, what,
                i, got, want);
}

static void report(const char *what, size_t count, double t0, int bad_before)
{
    if (g_rank == 0)
        printf("%-14s %9zu elements  %9.1f us  %s\n", what, count, now_us() - t0,
               g_bad == bad_before ? "ok" : "WRONG");
}

static void check_allreduce(hcclComm_t comm, int n, size_t count)
{
    int32_t *in = xmalloc(count * sizeof(*in)), *out = xmalloc(count * sizeof(*out));
    float *f = xmalloc(count * sizeof(*f));
    hcclRequest_t req;
    int bad = g_bad;
    double t0;

    for (size_t i = 0; i < count; i++) {
        in[i] = g_rank * 1000 + (int32_t)(i % 13);
        f[i] = (float)((g_rank + (int)(i % 64)) % n); /* the max over ranks is n - 1 */
    }
    t0 = now_us();
    /* The non-blocking form: post, do other work, wait. */
    CHECK(hcclAllReduceAsync(in, out, count, hcclInt32, hcclSum, comm, &req));
    CHECK(hcclWait(&req));
    for (size_t i = 0; i < count; i++)
        expect_i64("allreduce sum", i, out[i], 1000LL * n * (n - 1) / 2 + (int64_t)n * (i % 13));
    report("allreduce sum", count, t0, bad);

    bad = g_bad;
    t0 = now_us();
    CHECK(hcclAllReduce(f, f, count, hcclFloat32, hcclMax, comm)); /* in place */
    for (size_t i = 0; i < count; i++)
        expect_i64("allreduce max", i, (int64_t)f[i], n - 1);
    report("allreduce max", count, t0, bad);
    free(in);
    free(out);
    free(f);
}

static void check_broadcast(hcclComm_t comm, int n, size_t count)
{
    int32_t *buf = xmalloc(count * sizeof(*buf));
    int root = n - 1, bad = g_bad;
    double t0;

    for (size_t i = 0; i < count; i++)
        buf[i] = g_rank == root ? (int32_t)(i * 3 + 7) : -1;
    t0 = now_us();
    CHECK(hcclBroadcast(buf, count, hcclInt32, root, comm));
    for (size_t i = 0; i < count; i++)
        expect_i64("broadcast", i, buf[i], (int64_t)i * 3 + 7);
    report("broadcast", count, t0, bad);
    free(buf);
}

static int64_t tag(int src, int dst, size_t i)
{
    return (int64_t)src * 1000000000000LL + (int64_t)dst * 1000000LL + (int64_t)(i % 1000000);
}

static void check_allgather(hcclComm_t comm, int n, size_t count)
{
    int64_t *in = xmalloc(count * sizeof(*in)), *out = xmalloc((size_t)n * count * sizeof(*out));
    int bad = g_bad;
    double t0;

    for (size_t i = 0; i < count; i++)
        in[i] = tag(g_rank, 0, i);
    t0 = now_us();
    CHECK(hcclAllGather(in, out, count, hcclInt64, comm));
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i++)
            expect_i64("allgather", (size_t)r * count + i, out[(size_t)r * count + i],
                       tag(r, 0, i));
    report("allgather", count, t0, bad);
    free(in);
    free(out);
}

static void check_reducescatter(hcclComm_t comm, int n, size_t count)
{
    float *in = xmalloc((size_t)n * count * sizeof(*in)), *out = xmalloc(count * sizeof(*out));
    int bad = g_bad;
    double t0;

    for (int b = 0; b < n; b++)
        for (size_t i = 0; i < count; i++)
            in[(size_t)b * count + i] = (float)(g_rank + b + (int)(i % 5));
    t0 = now_us();
    CHECK(hcclReduceScatter(in, out, count, hcclFloat32, hcclSum, comm));
    /* Block g_rank summed over ranks k: sum(k) + n * (g_rank + i % 5), exact in float32. */
    for (size_t i = 0; i < count; i++)
        expect_i64("reducescatter", i, (int64_t)out[i],
                   (int64_t)n * (n - 1) / 2 + (int64_t)n * (g_rank + (int64_t)(i % 5)));
    report("reducescatter", count, t0, bad);
    free(in);
    free(out);
}

static void check_alltoall(hcclComm_t comm, int n, size_t count)
{
    int64_t *in = xmalloc((size_t)n * count * sizeof(*in));
    int64_t *out = xmalloc((size_t)n * count * sizeof(*out));
    int bad = g_bad;
    double t0;

    for (int dst = 0; dst < n; dst++)
        for (size_t i = 0; i < count; i++)
            in[(size_t)dst * count + i] = tag(g_rank, dst, i);
    t0 = now_us();
    CHECK(hcclAlltoAll(in, out, count, hcclInt64, comm));
    for (int src = 0; src < n; src++)
        for (size_t i = 0; i < count; i++)
            expect_i64("alltoall", (size_t)src * count + i, out[(size_t)src * count + i],
                       tag(src, g_rank, i));
    report("alltoall", count, t0, bad);
    free(in);
    free(out);
}

int main(int argc, char **argv)
{
    size_t default_counts[] = {1, 1027, 262144}, counts[16];
    int ncounts = 0, n, failed;
    hcclComm_t comm;

    for (int i = 1; i < argc && ncounts < 16; i++) {
        char *end;
        counts[ncounts++] = (size_t)strtoull(argv[i], &end, 10);
        if (*end || !argv[i][0]) {
            fprintf(stderr, "usage: %s [COUNT...]  (element counts)\n", argv[0]);
            return 2;
        }
    }
    if (ncounts == 0) {
        memcpy(counts, default_counts, sizeof(default_counts));
        ncounts = 3;
    }
    CHECK(hcclCommInitFromEnv(&comm));
    CHECK(hcclCommUserRank(comm, &g_rank));
    CHECK(hcclCommCount(comm, &n));
    if (g_rank == 0)
        printf("primitives: %d ranks\n", n);
    for (int c = 0; c < ncounts; c++) {
        check_allreduce(comm, n, counts[c]);
        check_broadcast(comm, n, counts[c]);
        check_allgather(comm, n, counts[c]);
        check_reducescatter(comm, n, counts[c]);
        check_alltoall(comm, n, counts[c]);
    }
    /* Every rank's verdict, so that rank 0's summary speaks for all of them. */
    failed = g_bad > 0;
    CHECK(hcclAllReduce(&failed, &failed, 1, hcclInt32, hcclSum, comm));
    CHECK(hcclCommDestroy(comm));
    if (g_rank == 0)
        printf("primitives: %s\n", failed ? "FAILED" : "all results checked on every rank");
    return failed ? 1 : 0;
}
