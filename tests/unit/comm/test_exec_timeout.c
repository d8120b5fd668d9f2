/*
 * The exec timeout and abort, in one process: a request that cannot finish
 * ends with hcclTimeout on time; the broken communicator reports it through
 * hcclCommGetAsyncError; its peer learns of it as hcclRemoteError; both can
 * then be aborted and a new communicator created.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "hccl.h"

typedef struct {
    hcclUniqueId id;
    int rank;
    const char *links;
    pthread_mutex_t *mtx;
    pthread_cond_t *cond;
    int *stage;             /* 0: init, 1: rank 0 has timed out */
    hcclResult_t first;     /* rank 0: the timed-out AllReduce; rank 1: its late AllReduce */
    hcclResult_t async;
    double elapsed_s;
    char msg[512];
} rank_arg_t;

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
    hcclComm_t comm = NULL;
    float buf[256] = {0};
    double t0;

    cfg.connectTimeoutMs = 20000;
    if (a->rank == 0)
        cfg.execTimeoutMs = 300;
    if (hcclCommInitRankConfig(&comm, 2, a->id, a->rank, &cfg) != hcclSuccess) {
        a->first = hcclInternalError;
        return NULL;
    }
    if (a->rank == 1) {
        /* Post only after rank 0 gave up, so that rank 0's request cannot finish. */
        pthread_mutex_lock(a->mtx);
        while (*a->stage < 1)
            pthread_cond_wait(a->cond, a->mtx);
        pthread_mutex_unlock(a->mtx);
    }
    t0 = now_s();
    a->first = hcclAllReduce(buf, buf, 256, hcclFloat32, hcclSum, comm);
    a->elapsed_s = now_s() - t0;
    snprintf(a->msg, sizeof(a->msg), "%s", hcclGetLastError(comm));
    hcclCommGetAsyncError(comm, &a->async);
    if (a->rank == 0) {
        /* Abort closes the connections: that is how rank 1 learns. */
        assert_int_equal(hcclCommAbort(comm), hcclSuccess);
        pthread_mutex_lock(a->mtx);
        *a->stage = 1;
        pthread_cond_broadcast(a->cond);
        pthread_mutex_unlock(a->mtx);
    } else {
        assert_int_equal(hcclCommAbort(comm), hcclSuccess);
    }
    return NULL;
}

static void run_case(const char *links)
{
    pthread_mutex_t mtx = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
    int stage = 0;
    rank_arg_t a[2];
    pthread_t th[2];

    setenv("HCCL_LINKS", links, 1);
    assert_int_equal(hcclGetUniqueId(&a[0].id), hcclSuccess);
    for (int r = 0; r < 2; r++) {
        a[r] = (rank_arg_t){.id = a[0].id, .rank = r, .links = links, .mtx = &mtx, .cond = &cond,
                            .stage = &stage};
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &a[r]), 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    unsetenv("HCCL_LINKS");

    assert_int_equal(a[0].first, hcclTimeout);
    assert_true(a[0].elapsed_s >= 0.29 && a[0].elapsed_s < 10.0);
    assert_non_null(strstr(a[0].msg, "exec timeout"));
    assert_int_equal(a[0].async, hcclTimeout);
    assert_int_equal(a[1].first, hcclRemoteError);
    assert_true(a[1].elapsed_s < 10.0);
    assert_int_equal(a[1].async, hcclRemoteError);
    assert_non_null(strstr(a[1].msg, "rank 0"));
}

static void test_timeout_shm(void **state)
{
    (void)state;
    run_case("shm");
}

static void test_timeout_tcp(void **state)
{
    (void)state;
    run_case("tcp");
}

/* After all that, the same process can still build a working communicator. */
static void test_new_comm_after_abort(void **state)
{
    hcclUniqueId id;
    hcclComm_t comm;
    double x = 2.5;

    (void)state;
    assert_int_equal(hcclGetUniqueId(&id), hcclSuccess);
    assert_int_equal(hcclCommInitRank(&comm, 1, id, 0), hcclSuccess);
    assert_int_equal(hcclAllReduce(&x, &x, 1, hcclFloat64, hcclSum, comm), hcclSuccess);
    assert_true(x == 2.5);
    assert_int_equal(hcclCommDestroy(comm), hcclSuccess);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timeout_shm),
        cmocka_unit_test(test_timeout_tcp),
        cmocka_unit_test(test_new_comm_after_abort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
