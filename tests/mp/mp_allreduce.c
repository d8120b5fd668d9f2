/*
 * Multi-process AllReduce check, run through hccl-run at several rank counts
 * and links: sizes from 0 to 64 MiB, several dtypes and ops, in-place and
 * out-of-place, blocking and several requests in flight at once, and one size repeated
 * (the lane's timed choice between its plain and grouped ways).
 *
 *   mp_allreduce [--max-bytes N]      every rank exits 0 when all results are right
 *   mp_allreduce --kill-rank K        rank K dies by SIGKILL inside a large AllReduce;
 *                                     every other rank must get hcclRemoteError quickly
 *   mp_allreduce --kill-small K       the same between small blocking AllReduces (the shm lane)
 */
#include <math.h>
#include <stdbool.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hccl.h"
#include "mp_check.h"

static int g_rank = -1;

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* int32 values whose sum, max and min over ranks are easy to predict. */
static int32_t value(int rank, size_t i)
{
    return (int32_t)((i * 2654435761u) % 1000) - 500 + rank * 3;
}

static int check_int32(hcclComm_t comm, int rank, int n, size_t count, hcclRedOp_t op, int in_place)
{
    int32_t *sbuf = calloc(count + 1, sizeof(int32_t)), *rbuf = in_place ? sbuf : calloc(count + 1, 4);
    int bad = 0;

    for (size_t i = 0; i < count; i++)
        sbuf[i] = value(rank, i);
    CHECK(hcclAllReduce(sbuf, rbuf, count, hcclInt32, op, comm));
    for (size_t i = 0; i < count && bad < 3; i++) {
        int64_t want = 0;
        for (int r = 0; r < n; r++) {
            int32_t v = value(r, i);
            if (r == 0 || op == hcclSum || op == hcclAvg)
                want = (r == 0) ? v : want + v;
            else if (op == hcclMax)
                want = v > want ? v : want;
            else if (op == hcclMin)
                want = v < want ? v : want;
        }
        if (op == hcclAvg)
            want /= n;
        if (rbuf[i] != (int32_t)want) {
            fprintf(stderr, "rank %d: int32 %s count %zu%s: element %zu is %d, want %lld\n", rank,
                    op == hcclSum ? "sum" : op == hcclMax ? "max" : op == hcclMin ? "min" : "avg", count,
                    in_place ? " in-place" : "", i, rbuf[i], (long long)want);
            bad++;
        }
    }
    free(sbuf);
    if (!in_place)
        free(rbuf);
    return bad;
}

static int check_float(hcclComm_t comm, int rank, int n, size_t count, hcclDataType_t dt)
{
    size_t esz = dt == hcclFloat64 ? 8 : 4;
    char *sbuf = calloc(count + 1, esz), *rbuf = calloc(count + 1, esz);
    int bad = 0;

    for (size_t i = 0; i < count; i++) {
        double v = (double)(rank + 1) + (double)(i % 5);
        if (dt == hcclFloat64)
            ((double *)sbuf)[i] = v;
        else
            ((float *)sbuf)[i] = (float)v;
    }
    CHECK(hcclAllReduce(sbuf, rbuf, count, dt, hcclSum, comm));
    for (size_t i = 0; i < count && bad < 3; i++) {
        double want = (double)n * (n + 1) / 2 + (double)n * (double)(i % 5);
        double got = dt == hcclFloat64 ? ((double *)rbuf)[i] : ((float *)rbuf)[i];
        if (got != want) {
            fprintf(stderr, "rank %d: float sum count %zu: element %zu is %g, want %g\n", rank, count, i,
                    got, want);
            bad++;
        }
    }
    free(sbuf);
    free(rbuf);
    return bad;
}

/*
 * One split size back to back for at least 50 calls and 0.2 s, then two in turn, with new
 * values each time: where ranks are pinned to CPUs in groups (hccl-run's default binding with
 * more ranks than CPUs), rank 0 times the lane's plain way on the run and then tries the
 * grouped one (from the 32nd call once 50 ms have passed, for six), and every rank must
 * follow it. Rank 0 says when the run ends, so that every rank makes the same calls.
 */
static int check_repeated(hcclComm_t comm, int rank, int n)
{
    static const size_t counts[2] = {20003, 3001}; /* above the lane's flat limit, two size classes */
    int32_t *sbuf = calloc(20003, sizeof(int32_t)), *rbuf = calloc(20003, sizeof(int32_t));
    int bad = 0, run = 1, tail = 0;
    double t0 = now_s();

    for (int k = 0; tail < 30; k++) {
        size_t count = counts[run ? 0 : k % 2];
        tail += !run;
        for (size_t i = 0; i < count; i++)
            sbuf[i] = value(rank, i) + k;
        CHECK(hcclAllReduce(sbuf, rbuf, count, hcclInt32, hcclSum, comm));
        for (size_t i = 0; i < count && bad < 3; i++) {
            int64_t want = (int64_t)n * k;
            for (int r = 0; r < n; r++)
                want += value(r, i);
            if (rbuf[i] != (int32_t)want) {
                fprintf(stderr, "rank %d: repeated int32 sum %d (count %zu): element %zu is %d, want %lld\n", rank,
                        k, count, i, rbuf[i], (long long)want);
                bad++;
            }
        }
        if (run) {
            int more = k + 1 < 50 || now_s() - t0 < 0.2;
            CHECK(hcclBroadcast(&more, 1, hcclInt32, 0, comm));
            run = more;
        }
    }
    free(sbuf);
    free(rbuf);
    return bad;
}

/* Several requests in flight at once, waited in reverse order. */
static int check_inflight(hcclComm_t comm, int rank, int n)
{
    enum { K = 6 };
    hcclRequest_t reqs[K];
    float *bufs[K];
    int bad = 0;

    for (int k = 0; k < K; k++) {
        size_t count = 1000 + (size_t)k * 50000;
        bufs[k] = malloc(count * sizeof(float));
        for (size_t i = 0; i < count; i++)
            bufs[k][i] = (float)(rank + k);
        CHECK(hcclAllReduceAsync(bufs[k], bufs[k], count, hcclFloat32, hcclSum, comm, &reqs[k]));
    }
    for (int k = K - 1; k >= 0; k--)
        CHECK(hcclWait(&reqs[k]));
    for (int k = 0; k < K; k++) {
        float want = (float)(n * (n - 1) / 2 + n * k);
        if (bufs[k][0] != want || bufs[k][1000 + (size_t)k * 50000 - 1] != want)
            bad++;
        free(bufs[k]);
    }
    if (bad)
        fprintf(stderr, "rank %d: %d of the in-flight requests are wrong\n", rank, bad);
    return bad;
}

/* Small AllReduces and Barriers queued behind each other and behind large ones, then blocking
 * ones: the lane and the plans each keep the call order. */
static int check_mixed(hcclComm_t comm, int rank, int n)
{
    enum { K = 9, BIG = 300000 };
    hcclRequest_t reqs[K];
    int32_t small[K][3], v = rank;
    float *big[K] = {0};
    int bad = 0;

    for (int k = 0; k < K; k++) {
        if (k % 3 == 1) {
            big[k] = malloc(BIG * sizeof(float));
            for (size_t i = 0; i < BIG; i++)
                big[k][i] = (float)(rank + k);
            CHECK(hcclAllReduceAsync(big[k], big[k], BIG, hcclFloat32, hcclSum, comm, &reqs[k]));
        } else if (k == 5) {
            CHECK(hcclBarrierAsync(comm, &reqs[k]));
        } else {
            for (int i = 0; i < 3; i++)
                small[k][i] = rank * 100 + k * 10 + i;
            CHECK(hcclAllReduceAsync(small[k], small[k], 3, hcclInt32, hcclSum, comm, &reqs[k]));
        }
    }
    CHECK(hcclAllReduce(&v, &v, 1, hcclInt32, hcclSum, comm)); /* behind the queued ones */
    CHECK(hcclBarrier(comm));
    for (int k = 0; k < K; k++)
        CHECK(hcclWait(&reqs[k]));
    bad += v != n * (n - 1) / 2;
    for (int k = 0; k < K; k++) {
        if (big[k]) {
            float want = (float)(n * (n - 1) / 2 + n * k);
            bad += big[k][0] != want || big[k][BIG - 1] != want;
            free(big[k]);
        } else if (k != 5) {
            for (int i = 0; i < 3; i++)
                bad += small[k][i] != 100 * (n * (n - 1) / 2) + n * (k * 10 + i);
        }
    }
    if (bad)
        fprintf(stderr, "rank %d: %d wrong results among small and large collectives in flight\n", rank, bad);
    return bad;
}

/* A survivor's report: the error and how long it took to come. */
static int survivor_report(hcclComm_t comm, int rank, hcclResult_t res, double t0)
{
    printf("rank %d: %s after %.3f s: %s\n", rank, hcclGetErrorString(res), now_s() - t0,
           hcclGetLastError(NULL));
    if (res != hcclRemoteError)
        return 1;
    hcclCommGetAsyncError(comm, &res);
    if (res != hcclRemoteError)
        return 1;
    CHECK(hcclCommAbort(comm));
    printf("rank %d: survivor ok\n", rank);
    return 0;
}

/* The victim dies between small blocking AllReduces; the others are inside one or enter one. */
static int run_kill_small(hcclComm_t comm, int rank, int n, int victim)
{
    hcclResult_t res = hcclSuccess;
    double t0 = now_s();

    for (int i = 0; res == hcclSuccess; i++) {
        int32_t v = rank;
        if (rank == victim && i == 500)
            raise(SIGKILL);
        res = hcclAllReduce(&v, &v, 1, hcclInt32, hcclSum, comm);
        if (res == hcclSuccess && v != n * (n - 1) / 2) {
            fprintf(stderr, "rank %d: AllReduce %d gave %d\n", rank, i, (int)v);
            return 1;
        }
    }
    return survivor_report(comm, rank, res, t0);
}

static int run_kill(hcclComm_t comm, int rank, int victim)
{
    size_t count = 16u << 20; /* 64 MiB of float32 */
    float *buf = calloc(count, sizeof(float));
    hcclRequest_t req;
    hcclResult_t res;
    double t0;

    CHECK(hcclAllReduce(buf, buf, 1024, hcclFloat32, hcclSum, comm)); /* everyone is connected */
    t0 = now_s();
    /* A slow survivor may post after the victim died: then the post itself reports it. */
    res = hcclAllReduceAsync(buf, buf, count, hcclFloat32, hcclSum, comm, &req);
    if (rank == victim) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL); /* let the transfer start: the point is to die in the middle */
        raise(SIGKILL);
    }
    if (res == hcclSuccess)
        res = hcclWait(&req);
    if (res == hcclSuccess) {
        /* The victim may have finished its part before dying; the next one cannot succeed. */
        res = hcclAllReduce(buf, buf, count, hcclFloat32, hcclSum, comm);
    }
    free(buf);
    return survivor_report(comm, rank, res, t0);
}

int main(int argc, char **argv)
{
    size_t max_bytes = 64u << 20;
    int victim = -1, n, bad = 0;
    bool small = false;
    hcclComm_t comm;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc)
            max_bytes = strtoull(argv[++i], NULL, 0);
        else if ((!strcmp(argv[i], "--kill-rank") || !strcmp(argv[i], "--kill-small")) && i + 1 < argc) {
            small = !strcmp(argv[i], "--kill-small");
            victim = atoi(argv[++i]);
        }
    }
    CHECK(hcclCommInitFromEnv(&comm));
    CHECK(hcclCommUserRank(comm, &g_rank));
    CHECK(hcclCommCount(comm, &n));
    if (victim >= 0)
        return small ? run_kill_small(comm, g_rank, n, victim) : run_kill(comm, g_rank, victim);

    CHECK(hcclAllReduce(NULL, NULL, 0, hcclFloat32, hcclSum, comm)); /* count 0 */
    for (size_t bytes = 4; bytes <= max_bytes; bytes *= 8) {
        size_t count = bytes / 4 + (bytes > 4 ? 3 : 0); /* not a multiple of the rank count */
        bad += check_int32(comm, g_rank, n, count, hcclSum, 0);
        bad += check_int32(comm, g_rank, n, count, hcclSum, 1);
        if (bytes <= (1u << 20)) {
            bad += check_int32(comm, g_rank, n, count, hcclMax, 0);
            bad += check_int32(comm, g_rank, n, count, hcclMin, 1);
            bad += check_int32(comm, g_rank, n, count, hcclAvg, 0);
            bad += check_float(comm, g_rank, n, count, hcclFloat64);
        }
        bad += check_float(comm, g_rank, n, count, hcclFloat32);
    }
    bad += check_float(comm, g_rank, n, max_bytes / 4, hcclFloat32);
    bad += check_inflight(comm, g_rank, n);
    bad += check_mixed(comm, g_rank, n);
    bad += check_repeated(comm, g_rank, n);
    CHECK(hcclCommDestroy(comm));
    printf("rank %d: %s\n", g_rank, bad ? "FAILED" : "all checks passed");
    return bad ? 1 : 0;
}
