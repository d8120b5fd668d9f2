/*
 * hcclCommInitFromEnv under a PMIx launcher (tests/mp/pmix_test.sh runs it under mpirun):
 *
 *   mp_pmix multi N        N communicators formed one after another and used together while
 *                          the program holds PMIx itself (as an MPI program would), then two
 *                          more after it let go; mpirun fails a process that leaves PMIx
 *                          without finalizing it, so its exit status checks the balance
 *   mp_pmix absent FIFO    the last rank never calls hcclCommInitFromEnv: the others must get
 *                          hcclTimeout within the connect timeout, then open FIFO to let it go
 *   mp_pmix time           prints the slowest rank's hcclCommInitFromEnv time, on rank 0
 *
 * Every rank prints one "rank R: ... ok" line when its checks pass, and exits 0.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <pmix.h>

#include "hccl.h"
#include "mp_check.h"

static int g_rank = -1;

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int env_rank(void)
{
    const char *r = getenv("PMIX_RANK");

    return r ? atoi(r) : -1;
}

static int run_multi(int ncomms)
{
    hcclComm_t comms[8];
    pmix_proc_t me;
    int n = 0;

    if (ncomms < 1 || ncomms > 8)
        return 2;
    /* Hold PMIx ourselves, as an MPI program does: the library must not close it under us. */
    if (PMIx_Init(&me, NULL, 0) != PMIX_SUCCESS) {
        fprintf(stderr, "rank %d: PMIx_Init failed\n", env_rank());
        return 1;
    }
    for (int c = 0; c < ncomms; c++) {
        CHECK(hcclCommInitFromEnv(&comms[c]));
        CHECK(hcclCommUserRank(comms[c], &g_rank));
        CHECK(hcclCommCount(comms[c], &n));
        if (g_rank != (int)me.rank) {
            fprintf(stderr, "rank %d: PMIx says rank %u\n", g_rank, me.rank);
            return 1;
        }
    }
    for (int c = 0; c < ncomms; c++) {
        int64_t v = g_rank + c, want = (int64_t)n * (n - 1) / 2 + (int64_t)n * c;
        CHECK(hcclAllReduce(&v, &v, 1, hcclInt64, hcclSum, comms[c]));
        if (v != want) {
            fprintf(stderr, "rank %d: communicator %d sums to %lld, want %lld\n", g_rank, c,
                    (long long)v, (long long)want);
            return 1;
        }
    }
    for (int c = 0; c < ncomms; c++)
        CHECK(hcclCommDestroy(comms[c]));
    /* The program lets go of PMIx; the library's own reference keeps it for the next ones. */
    PMIx_Finalize(NULL, 0);
    for (int c = 0; c < 2; c++)
        CHECK(hcclCommInitFromEnv(&comms[c]));
    for (int c = 0; c < 2; c++) {
        CHECK(hcclBarrier(comms[c]));
        CHECK(hcclCommDestroy(comms[c]));
    }
    printf("rank %d: %d communicators of %d ranks from PMIx ok\n", g_rank, ncomms + 2, n);
    return 0;
}

static int run_absent(const char *fifo)
{
    const char *size = getenv("OMPI_COMM_WORLD_SIZE");
    int n = size ? atoi(size) : 0, got = 0;
    hcclComm_t comm;
    hcclResult_t res;
    pmix_proc_t me;
    double t0 = now_ms();
    char c = 1;
    int fd;

    g_rank = env_rank();
    if (g_rank == n - 1) {
        /* In PMIx (the launcher takes a process that never connects for a crash), but never in
         * the fence; released once every other rank has written its byte to the fifo. Opened
         * for writing too, so that it is never without a reader between two writers: a writer
         * that found it so would die of SIGPIPE. */
        if (PMIx_Init(&me, NULL, 0) != PMIX_SUCCESS)
            return 1;
        fd = open(fifo, O_RDWR);
        while (fd >= 0 && got < n - 1 && read(fd, &c, 1) == 1)
            got++;
        if (fd >= 0)
            close(fd);
        PMIx_Finalize(NULL, 0);
        printf("rank %d: stayed away ok\n", g_rank);
        return 0;
    }
    res = hcclCommInitFromEnv(&comm);
    if (res == hcclTimeout)
        printf("rank %d: hcclTimeout after %.1f s ok: %s\n", g_rank, (now_ms() - t0) / 1e3,
               hcclGetLastError(NULL));
    else
        fprintf(stderr, "rank %d: hcclCommInitFromEnv gave %s (%s), want hcclTimeout\n", g_rank,
                hcclGetErrorString(res), hcclGetLastError(NULL));
    fflush(stdout);
    fd = open(fifo, O_WRONLY); /* let the absent rank go, whatever happened */
    if (fd >= 0) {
        if (write(fd, &c, 1) != 1)
            perror("write");
        close(fd);
    }
    if (res == hcclSuccess)
        hcclCommAbort(comm);
    return res == hcclTimeout ? 0 : 1;
}

static int run_time(void)
{
    hcclComm_t comm;
    double t0 = now_ms(), ms;
    int n;

    CHECK(hcclCommInitFromEnv(&comm));
    ms = now_ms() - t0;
    CHECK(hcclCommUserRank(comm, &g_rank));
    CHECK(hcclCommCount(comm, &n));
    CHECK(hcclAllReduce(&ms, &ms, 1, hcclFloat64, hcclMax, comm));
    CHECK(hcclCommDestroy(comm));
    if (g_rank == 0)
        printf("init of %d ranks: %.1f ms (slowest rank)\n", n, ms);
    printf("rank %d: time ok\n", g_rank);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "multi"))
        return run_multi(atoi(argv[2]));
    if (argc == 3 && !strcmp(argv[1], "absent"))
        return run_absent(argv[2]);
    if (argc == 2 && !strcmp(argv[1], "time"))
        return run_time();
    fprintf(stderr, "usage: mp_pmix multi N | absent FIFO | time\n");
    return 2;
}
