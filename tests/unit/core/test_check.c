/*
 * HCCL_CHECK=1: every collective's signature is compared across ranks first;
 * a planted mismatch fails every rank with hcclInvalidUsage naming both calls,
 * instead of hanging or mixing data, and matching calls still work. Many calls
 * in flight at once, of the lane's and of plans, start in the order they were
 * posted whatever order their checks end in, and give the right results.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hccl.h"

#define N 3

/* What every rank's thread is given first. */
typedef struct {
    hcclUniqueId id;
    int rank;
} rank_arg_t;

/* Runs fn on N threads, one per rank, each with its element of args (stride bytes apart, each
 * starting with a rank_arg_t), and joins them. */
static void run_ranks(void *(*fn)(void *), void *args, size_t stride)
{
    pthread_t th[N];
    hcclUniqueId id;

    assert_int_equal(hcclGetUniqueId(&id), hcclSuccess);
    for (int r = 0; r < N; r++) {
        rank_arg_t *a = (rank_arg_t *)((char *)args + (size_t)r * stride);
        memset(a, 0, stride);
        a->id = id;
        a->rank = r;
        assert_int_equal(pthread_create(&th[r], NULL, fn, a), 0);
    }
    for (int r = 0; r < N; r++)
        pthread_join(th[r], NULL);
}

typedef struct {
    rank_arg_t who;
    hcclResult_t ok_res;       /* a matching AllReduce */
    hcclResult_t mismatch_res; /* rank 2 calls Broadcast where the others call AllReduce */
    hcclResult_t after_res;    /* the communicator still works afterwards */
    char msg[512];
    int sum;
} check_arg_t;

static void *check_rank(void *p)
{
    check_arg_t *a = p;
    int rank = a->who.rank;
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
    hcclComm_t comm;
    int buf[16] = {0};

    cfg.connectTimeoutMs = 20000;
    if (hcclCommInitRankConfig(&comm, N, a->who.id, rank, &cfg) != hcclSuccess) {
        a->ok_res = hcclInternalError;
        return NULL;
    }
    a->sum = rank;
    a->ok_res = hcclAllReduce(&a->sum, &a->sum, 1, hcclInt32, hcclSum, comm);
    if (rank == 2)
        a->mismatch_res = hcclBroadcast(buf, 16, hcclInt32, 0, comm);
    else
        a->mismatch_res = hcclAllReduce(buf, buf, 16, hcclInt32, hcclSum, comm);
    snprintf(a->msg, sizeof(a->msg), "%s", hcclGetLastError(comm));
    a->after_res = hcclBarrier(comm);
    hcclCommDestroy(comm);
    return NULL;
}

static void test_planted_mismatch(void **state)
{
    check_arg_t a[N];

    (void)state;
    run_ranks(check_rank, a, sizeof(a[0]));
    for (int r = 0; r < N; r++) {
        assert_int_equal(a[r].ok_res, hcclSuccess);
        assert_int_equal(a[r].sum, 0 + 1 + 2);
        assert_int_equal(a[r].mismatch_res, hcclInvalidUsage);
        assert_non_null(strstr(a[r].msg, "allreduce(count 16, int32, sum)"));
        assert_non_null(strstr(a[r].msg, "rank 2 called broadcast(count 16, int32, root 0)"));
        assert_int_equal(a[r].after_res, hcclSuccess);
    }
}

#define INFLIGHT 18

typedef struct {
    rank_arg_t who;
    hcclResult_t res;
    int bad; /* the first call whose result was wrong, -1: none */
} inflight_arg_t;

/* Small AllReduces and Broadcasts (the lane's, where the communicator has one) between
 * AlltoAllvs (always a plan), all posted before any is waited for. */
static void *inflight_rank(void *p)
{
    inflight_arg_t *a = p;
    int rank = a->who.rank;
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
    hcclRequest_t reqs[INFLIGHT];
    int buf[INFLIGHT][N], out[INFLIGHT][N];
    size_t counts[N], displs[N];
    hcclComm_t comm;

    a->bad = -1;
    cfg.connectTimeoutMs = 20000;
    a->res = hcclCommInitRankConfig(&comm, N, a->who.id, rank, &cfg);
    if (a->res != hcclSuccess)
        return NULL;
    for (int r = 0; r < N; r++) {
        counts[r] = 1;
        displs[r] = (size_t)r;
    }
    for (int i = 0; i < INFLIGHT && a->res == hcclSuccess; i++) {
        for (int r = 0; r < N; r++)
            buf[i][r] = 100 * i + 10 * rank + r;
        if (i % 3 == 0)
            a->res = hcclAllReduceAsync(buf[i], buf[i], N, hcclInt32, hcclSum, comm, &reqs[i]);
        else if (i % 3 == 1)
            a->res = hcclBroadcastAsync(buf[i], N, hcclInt32, i % N, comm, &reqs[i]);
        else
            a->res = hcclAlltoAllvAsync(buf[i], counts, displs, out[i], counts, displs, hcclInt32,
                                        comm, &reqs[i]);
    }
    if (a->res == hcclSuccess)
        a->res = hcclWaitAll(INFLIGHT, reqs);
    for (int i = 0; i < INFLIGHT && a->res == hcclSuccess && a->bad < 0; i++)
        for (int r = 0; r < N; r++) {
            int want = i % 3 == 0   ? 300 * i + 10 * (0 + 1 + 2) + 3 * r
                       : i % 3 == 1 ? 100 * i + 10 * (i % N) + r
                                    : 100 * i + 10 * r + rank;
            if ((i % 3 == 2 ? out[i][r] : buf[i][r]) != want)
                a->bad = i;
        }
    hcclCommDestroy(comm);
    return NULL;
}

static void test_inflight_in_order(void **state)
{
    inflight_arg_t a[N];

    (void)state;
    run_ranks(inflight_rank, a, sizeof(a[0]));
    for (int r = 0; r < N; r++) {
        assert_int_equal(a[r].res, hcclSuccess);
        assert_int_equal(a[r].bad, -1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_planted_mismatch),
                                       cmocka_unit_test(test_inflight_in_order)};

    setenv("HCCL_CHECK", "1", 1); /* read when each communicator is created */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
