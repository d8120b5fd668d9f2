/*
 * non_pow2: AllReduce on rank counts that are not powers of two, with element
 * counts no rank count divides; nothing needs padding.
 *
 *   hccl-run -n 8 ./non_pow2            # 8 ranks, then the first 6 of them
 *   hccl-run -n 6 ./non_pow2 --iters 50 # 6 ranks, then 4
 *
 * The program AllReduces (float32 sum) counts of 7, 65537 and 1000003 elements
 * (primes) over all n ranks, then over a communicator of the first n - 2 ranks
 * split from it, and prints the time per call (median) for each. Every result
 * is checked. The algorithms split a buffer into blocks of count / n elements
 * with the remainder spread one element at a time, and handle rank counts that
 * are not powers of two with a fold step, so the caller passes any count on
 * any number of ranks.
 *
 * Which algorithm the tuner picks is printed from the topology dump
 * (HCCL_TOPO_DUMP, which the program points at a temporary file unless it is
 * set): the AllReduce algorithm per message size in bytes. For the pick of each
 * call, run with HCCL_DEBUG=INFO HCCL_DEBUG_SUBSYS=ALGO.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Rank 0 of a communicator writes the dump when it is created: print its AllReduce picks. */
static void print_allreduce_picks(const char *path, int n)
{
    char line[1024];
    FILE *f;

    if (g_rank != 0 || !path || strstr(path, "%r"))
        return;
    f = fopen(path, "r");
    if (!f) {
        printf("  (no topology dump at %s)\n", path);
        return;
    }
    while (fgets(line, sizeof(line), f)) {
        char *p = strstr(line, "\"allreduce\":");
        if (p) {
            printf("  %d ranks, AllReduce algorithm by message bytes: %s", n,
                   p + strlen("\"allreduce\": "));
            break;
        }
    }
    fclose(f);
}

/* Returns the number of wrong elements. */
static int run(hcclComm_t comm, const char *label, int iters)
{
    static const size_t counts[] = {7, 65537, 1000003};
    int n, rank, bad = 0;

    CHECK(hcclCommCount(comm, &n));
    CHECK(hcclCommUserRank(comm, &rank));
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        size_t count = counts[c];
        float *send = malloc(count * sizeof(float)), *recv = malloc(count * sizeof(float));
        double *t = malloc((size_t)iters * sizeof(double));

        if (!send || !recv || !t) {
            fprintf(stderr, "rank %d: out of memory\n", g_rank);
            exit(1);
        }
        for (size_t i = 0; i < count; i++)
            send[i] = (float)(rank + 1) + (float)(i % 7);
        CHECK(hcclAllReduce(send, recv, count, hcclFloat32, hcclSum, comm)); /* warm-up */
        for (int it = 0; it < iters; it++) {
            double t0;
            memset(recv, 0, count * sizeof(float));
            CHECK(hcclBarrier(comm));
            t0 = now_us();
            CHECK(hcclAllReduce(send, recv, count, hcclFloat32, hcclSum, comm));
            t[it] = now_us() - t0;
        }
        for (size_t i = 0; i < count; i++) {
            float want = (float)(n * (n + 1) / 2) + (float)n * (float)(i % 7);
            if (recv[i] != want && bad++ < 3)
                fprintf(stderr, "rank %d: %s: count %zu: element %zu is %g, want %g\n", g_rank,
                        label, count, i, (double)recv[i], (double)want);
        }
        qsort(t, (size_t)iters, sizeof(double), cmp_double);
        if (rank == 0)
            printf("  %d ranks: %8zu elements (%zu per rank, remainder %zu) %10.1f us/call  %s\n",
                   n, count, count / (size_t)n, count % (size_t)n, t[iters / 2],
                   bad ? "WRONG" : "ok");
        free(send);
        free(recv);
        free(t);
    }
    return bad;
}

int main(int argc, char **argv)
{
    char dump[256];
    const char *path = getenv("HCCL_TOPO_DUMP");
    int n, iters = 5, bad = 0, own_dump = 0;
    hcclComm_t world, sub = NULL;

    if (argc == 3 && !strcmp(argv[1], "--iters"))
        iters = atoi(argv[2]);
    if ((argc != 1 && argc != 3) || iters < 1) {
        fprintf(stderr, "usage: %s [--iters N]\n", argv[0]);
        return 2;
    }
    if (!path || !*path) {
        snprintf(dump, sizeof(dump), "%s/hccl_non_pow2.%d.json",
                 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
        setenv("HCCL_TOPO_DUMP", dump, 1); /* only rank 0 writes it (no %r in the name) */
        path = dump;
        own_dump = 1;
    }
    CHECK(hcclCommInitFromEnv(&world));
    CHECK(hcclCommUserRank(world, &g_rank));
    CHECK(hcclCommCount(world, &n));
    if (g_rank == 0)
        printf("non_pow2: float32 sum, counts no rank count divides\n");
    print_allreduce_picks(path, n);
    bad += run(world, "all ranks", iters);

    /* The first n - 2 ranks on their own; the others sit this one out. */
    if (n >= 4) {
        CHECK(hcclCommSplit(world, g_rank < n - 2 ? 0 : HCCL_SPLIT_NOCOLOR, g_rank, &sub));
        if (sub) {
            print_allreduce_picks(path, n - 2);
            bad += run(sub, "first n - 2 ranks", iters);
            CHECK(hcclCommDestroy(sub));
        }
    }
    CHECK(hcclAllReduce(&bad, &bad, 1, hcclInt32, hcclSum, world));
    CHECK(hcclCommDestroy(world));
    if (own_dump && g_rank == 0)
        unlink(dump);
    if (g_rank == 0)
        printf("non_pow2: %s\n", bad ? "FAILED" : "all results checked on every rank");
    return bad ? 1 : 0;
}
