/*
 * allreduce_demo: an AllReduce across the ranks of a launcher, checked and timed.
 *
 *   hccl-run -n 4 ./allreduce_demo            # 1 MiB and 64 MiB of float32
 *   hccl-run -n 4 ./allreduce_demo 8K 16M     # sizes in bytes (K, M, G suffixes)
 *   HCCL_LINKS=tcp hccl-run -n 2 ./allreduce_demo
 *
 * Each rank joins with hcclCommInitFromEnv (the launcher sets HCCL_COMM_ID,
 * RANK_ID and WORLD_SIZE), posts the AllReduce with hcclAllReduceAsync, does
 * its own work while the library moves the data, then waits. Rank 0 prints
 * the time, the algorithm bandwidth (bytes / time) and the bus bandwidth
 * (algbw * 2(n-1)/n, what each link carried), as nccl-tests does.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hccl.h"

#define CHECK(call)                                                                      \
    do {                                                                                 \
        hcclResult_t r_ = (call);                                                        \
        if (r_ != hcclSuccess) {                                                         \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, hcclGetErrorString(r_),       \
                    hcclGetLastError(NULL));                                             \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);

    switch (*end) {
    case 'G': case 'g': v *= 1024;     /* fall through */
    case 'M': case 'm': v *= 1024;     /* fall through */
    case 'K': case 'k': v *= 1024; break;
    default: break;
    }
    return (size_t)v;
}

/* Rank r contributes r + 1 + (i % 7); the sum over n ranks is exact in float32. */
static float expected(int n, size_t i)
{
    return (float)(n * (n + 1) / 2) + (float)n * (float)(i % 7);
}

static int run_size(hcclComm_t comm, int rank, int n, size_t bytes)
{
    size_t count = bytes / sizeof(float);
    float *send = malloc(count * sizeof(float) + 1), *recv = malloc(count * sizeof(float) + 1);
    int iters = bytes >= (16u << 20) ? 5 : 20, bad = 0;
    double t0, elapsed;
    hcclRequest_t req;

    if (!send || !recv) {
        fprintf(stderr, "rank %d: out of memory for %zu bytes\n", rank, bytes);
        return 1;
    }
    for (size_t i = 0; i < count; i++)
        send[i] = (float)(rank + 1) + (float)(i % 7);
    CHECK(hcclAllReduce(send, recv, count, hcclFloat32, hcclSum, comm)); /* warm-up */
    t0 = now_s();
    for (int it = 0; it < iters; it++) {
        CHECK(hcclAllReduceAsync(send, recv, count, hcclFloat32, hcclSum, comm, &req));
        /* The caller's own work would go here: the communicator's thread moves the data. */
        CHECK(hcclWait(&req));
    }
    elapsed = (now_s() - t0) / iters;
    for (size_t i = 0; i < count; i++)
        if (fabsf(recv[i] - expected(n, i)) > 0) {
            if (bad++ < 3)
                fprintf(stderr, "rank %d: element %zu is %g, want %g\n", rank, i, (double)recv[i],
                        (double)expected(n, i));
        }
    if (rank == 0) {
        double algbw = (double)bytes / elapsed / 1e9;
        printf("%12zu B  %10.1f us  algbw %7.3f GB/s  busbw %7.3f GB/s  %s\n", bytes, elapsed * 1e6,
               algbw, algbw * 2.0 * (n - 1) / n, bad ? "WRONG" : "checked: ok");
    }
    free(send);
    free(recv);
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    static const char *const default_sizes[] = {"1M", "64M"};
    const char *const *sizes = default_sizes;
    int nsizes = 2, rank, n, failed = 0;
    hcclComm_t comm;

    if (argc > 1) {
        sizes = (const char *const *)(argv + 1);
        nsizes = argc - 1;
    }
    CHECK(hcclCommInitFromEnv(&comm));
    CHECK(hcclCommUserRank(comm, &rank));
    CHECK(hcclCommCount(comm, &n));
    if (rank == 0)
        printf("hccl AllReduce demo: %d ranks, float32 sum, links %s\n", n,
               getenv("HCCL_LINKS") ? getenv("HCCL_LINKS") : "auto (shm on one host)");
    for (int i = 0; i < nsizes; i++)
        failed |= run_size(comm, rank, n, parse_size(sizes[i]));
    CHECK(hcclCommDestroy(comm));
    if (rank == 0)
        printf("%s\n", failed ? "FAILED" : "all results checked");
    return failed;
}
