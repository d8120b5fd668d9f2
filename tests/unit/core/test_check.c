/*
 * HCCL_CHECK=1: every collective's signature is compared across ranks first;
 * a planted mismatch fails every rank with hcclInvalidUsage naming both calls,
 * instead of hanging or mixing data, and matching calls still work.
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

typedef struct {
    hcclUniqueId id;
    int rank;
    hcclResult_t ok_res;       /* a matching AllReduce */
    hcclResult_t mismatch_res; /* rank 2 calls Broadcast where the others call AllReduce */
    hcclResult_t after_res;    /* the communicator still works afterwards */
    char msg[512];
    int sum;
} check_arg_t;

static void *check_rank(void *p)
{
    check_arg_t *a = p;
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
    hcclComm_t comm;
    int buf[16] = {0};

    cfg.connectTimeoutMs = 20000;
    if (hcclCommInitRankConfig(&comm, N, a->id, a->rank, &cfg) != hcclSuccess) {
        a->ok_res = hcclInternalError;
        return NULL;
    }
    a->sum = a->rank;
    a->ok_res = hcclAllReduce(&a->sum, &a->sum, 1, hcclInt32, hcclSum, comm);
    if (a->rank == 2)
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
    pthread_t th[N];
    hcclUniqueId id;

    (void)state;
    assert_int_equal(hcclGetUniqueId(&id), hcclSuccess);
    for (int r = 0; r < N; r++) {
        memset(&a[r], 0, sizeof(a[r]));
        a[r].id = id;
        a[r].rank = r;
        assert_int_equal(pthread_create(&th[r], NULL, check_rank, &a[r]), 0);
    }
    for (int r = 0; r < N; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < N; r++) {
        assert_int_equal(a[r].ok_res, hcclSuccess);
        assert_int_equal(a[r].sum, 0 + 1 + 2);
        assert_int_equal(a[r].mismatch_res, hcclInvalidUsage);
        assert_non_null(strstr(a[r].msg, "allreduce(count 16, int32, sum)"));
        assert_non_null(strstr(a[r].msg, "rank 2 called broadcast(count 16, int32, root 0)"));
        assert_int_equal(a[r].after_res, hcclSuccess);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_planted_mismatch)};

    setenv("HCCL_CHECK", "1", 1); /* read when each communicator is created */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
