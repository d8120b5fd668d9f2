/*
 * Communicator lifecycle in one process: the exec timeout (a request that
 * cannot finish ends with hcclTimeout on time, the late peer hears the same
 * root cause, both can be aborted and a new communicator created);
 * requests waited after their communicator was aborted or destroyed;
 * destroy refused from a callback; ranks whose settings differ.
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
    /* The root cause, not the last hop: rank 1 itself was late, and hears it. */
    assert_int_equal(a[1].first, hcclTimeout);
    assert_true(a[1].elapsed_s < 10.0);
    assert_int_equal(a[1].async, hcclTimeout);
    assert_non_null(strstr(a[1].msg, "root cause at rank 1: rank 1 did not take part in allreduce"));
    assert_non_null(strstr(a[0].msg, "root cause at rank 1: rank 1 did not take part in allreduce"));
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

/* The handle outlives the communicator: waiting on it afterwards is safe and gives the result. */
static void test_wait_after_destroy(void **state)
{
    hcclUniqueId id;
    hcclComm_t comm;
    hcclRequest_t req;
    int x = 7;

    (void)state;
    assert_int_equal(hcclGetUniqueId(&id), hcclSuccess);
    assert_int_equal(hcclCommInitRank(&comm, 1, id, 0), hcclSuccess);
    assert_int_equal(hcclAllReduceAsync(&x, &x, 1, hcclInt32, hcclSum, comm, &req), hcclSuccess);
    assert_int_equal(hcclCommDestroy(comm), hcclSuccess); /* waits for the request */
    assert_int_equal(hcclWait(&req), hcclSuccess);
    assert_null(req);
    assert_int_equal(x, 7);
}

/*
 * Two ranks on two threads, where rank 1 waits at a point until rank 0 says it may go on
 * (pair_go / pair_wait): each test's rank argument starts with this.
 */
typedef struct pair_rank {
    hcclUniqueId id;
    int rank;
    hcclResult_t res;
    pthread_mutex_t *mtx;
    pthread_cond_t *cond;
    int *go;
} pair_rank_t;

static void pair_go(pair_rank_t *a)
{
    pthread_mutex_lock(a->mtx);
    *a->go = 1;
    pthread_cond_broadcast(a->cond);
    pthread_mutex_unlock(a->mtx);
}

static void pair_wait(pair_rank_t *a)
{
    pthread_mutex_lock(a->mtx);
    while (!*a->go)
        pthread_cond_wait(a->cond, a->mtx);
    pthread_mutex_unlock(a->mtx);
}

/* Runs fn as ranks 0 and 1 (r0, r1: each rank's argument, a pair_rank_t first) of one id. */
static void run_pair(void *(*fn)(void *), pair_rank_t *r0, pair_rank_t *r1)
{
    pthread_mutex_t mtx = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
    pair_rank_t *a[2] = {r0, r1};
    pthread_t th[2];
    int go = 0;

    assert_int_equal(hcclGetUniqueId(&r0->id), hcclSuccess);
    for (int r = 0; r < 2; r++) {
        a[r]->id = r0->id;
        a[r]->rank = r;
        a[r]->mtx = &mtx;
        a[r]->cond = &cond;
        a[r]->go = &go;
        assert_int_equal(pthread_create(&th[r], NULL, fn, a[r]), 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
}

/* Rank 0 aborts with a request outstanding; then rank 1 calls on. */
static void *abort_rank(void *p)
{
    pair_rank_t *a = p;
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
    hcclComm_t comm;
    hcclRequest_t req;
    float buf[64] = {0};

    cfg.connectTimeoutMs = 20000;
    a->res = hcclCommInitRankConfig(&comm, 2, a->id, a->rank, &cfg);
    if (a->res != hcclSuccess)
        return NULL;
    if (a->rank == 0) {
        /* Rank 1 has not posted: the request is outstanding when we abort. */
        a->res = hcclAllReduceAsync(buf, buf, 64, hcclFloat32, hcclSum, comm, &req);
        if (a->res == hcclSuccess && hcclCommAbort(comm) == hcclSuccess)
            a->res = hcclWait(&req);
        pair_go(a);
    } else {
        pair_wait(a);
        /* The peer is gone: refused at once, or failed when its EOF is read. The first may also
         * succeed: rank 0 sent its part before it aborted, and ours fit in its ring. The second
         * cannot. */
        for (int i = 0; i < 2 && a->res == hcclSuccess; i++) {
            a->res = hcclAllReduceAsync(buf, buf, 64, hcclFloat32, hcclSum, comm, &req);
            if (a->res == hcclSuccess)
                a->res = hcclWait(&req);
        }
        hcclCommAbort(comm);
    }
    return NULL;
}

static void test_wait_after_abort(void **state)
{
    pair_rank_t a[2];

    (void)state;
    memset(a, 0, sizeof(a));
    run_pair(abort_rank, &a[0], &a[1]);
    assert_int_equal(a[0].res, hcclAborted);
    assert_int_equal(a[1].res, hcclRemoteError);
}

typedef struct {
    pair_rank_t pair; /* first: run_pair's argument */
    hcclComm_t comm;
    hcclResult_t destroy_res;
    int ran;
} cb_rank_t;

static void destroy_from_callback(hcclRequest_t req, hcclResult_t result, void *p)
{
    cb_rank_t *c = p;

    (void)req, (void)result;
    c->destroy_res = hcclCommDestroy(c->comm);
    c->ran = 1;
}

/*
 * Rank 1 posts its AllReduce only once rank 0 has set its request's callback, so the request
 * is pending then and the callback runs where the communicator progresses (a callback set on
 * a request already done runs on the caller's thread, where destroy is allowed).
 */
static void *cb_rank(void *p)
{
    cb_rank_t *c = p;
    pair_rank_t *a = &c->pair;
    hcclRequest_t req;
    int x = 1;

    a->res = hcclCommInitRank(&c->comm, 2, a->id, a->rank);
    if (a->res != hcclSuccess) {
        pair_go(a); /* nobody waits for a rank that could not start */
        return NULL;
    }
    if (a->rank == 0) {
        a->res = hcclAllReduceAsync(&x, &x, 1, hcclInt32, hcclSum, c->comm, &req);
        if (a->res == hcclSuccess)
            a->res = hcclRequestSetCallback(req, destroy_from_callback, c);
        pair_go(a);
        if (a->res == hcclSuccess)
            a->res = hcclWait(&req);
    } else {
        pair_wait(a);
        a->res = hcclAllReduce(&x, &x, 1, hcclInt32, hcclSum, c->comm);
    }
    if (a->res == hcclSuccess)
        a->res = hcclCommDestroy(c->comm);
    return NULL;
}

static void test_destroy_from_callback_refused(void **state)
{
    cb_rank_t c[2];

    (void)state;
    memset(c, 0, sizeof(c));
    run_pair(cb_rank, &c[0].pair, &c[1].pair);
    assert_int_equal(c[0].pair.res, hcclSuccess);
    assert_int_equal(c[1].pair.res, hcclSuccess);
    assert_int_equal(c[0].ran, 1);
    assert_int_equal(c[0].destroy_res, hcclInvalidUsage);
}

typedef struct {
    hcclUniqueId id;
    int rank;
    const char *algo;
    hcclResult_t res;
    char msg[512];
} algo_arg_t;

static void *algo_rank(void *p)
{
    algo_arg_t *a = p;
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
    hcclComm_t comm;

    cfg.connectTimeoutMs = 20000;
    cfg.algo = a->algo;
    a->res = hcclCommInitRankConfig(&comm, 2, a->id, a->rank, &cfg);
    snprintf(a->msg, sizeof(a->msg), "%s", hcclGetLastError(NULL));
    if (a->res == hcclSuccess)
        hcclCommDestroy(comm);
    return NULL;
}

/* Settings that shape the plans must agree, or every rank hears why at init. */
static void test_algo_mismatch(void **state)
{
    algo_arg_t a[2] = {{.rank = 0, .algo = "ring"}, {.rank = 1, .algo = NULL}};
    pthread_t th[2];

    (void)state;
    assert_int_equal(hcclGetUniqueId(&a[0].id), hcclSuccess);
    a[1].id = a[0].id;
    for (int r = 0; r < 2; r++)
        assert_int_equal(pthread_create(&th[r], NULL, algo_rank, &a[r]), 0);
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(a[r].res, hcclInvalidUsage);
        assert_non_null(strstr(a[r].msg, "HCCL_ALGO"));
    }
}

typedef struct {
    hcclUniqueId id;
    int rank;
    int variant;
    hcclResult_t res;
    char msg[512];
} mismatch_arg_t;

static void *mismatch_rank(void *p)
{
    mismatch_arg_t *a = p;
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
    hcclComm_t comm;
    int buf[4096] = {0};

    cfg.connectTimeoutMs = 20000;
    a->res = hcclCommInitRankConfig(&comm, 2, a->id, a->rank, &cfg);
    if (a->res != hcclSuccess)
        return NULL;
    if (a->variant == 0) /* AllReduce against Broadcast */
        a->res = a->rank == 0 ? hcclAllReduce(buf, buf, 4096, hcclInt32, hcclSum, comm)
                              : hcclBroadcast(buf, 4096, hcclInt32, 0, comm);
    else /* AllReduce against Barrier (zero-byte messages still carry the signature) */
        a->res = a->rank == 0 ? hcclAllReduce(buf, buf, 4096, hcclInt32, hcclSum, comm) : hcclBarrier(comm);
    snprintf(a->msg, sizeof(a->msg), "%s", hcclGetLastError(comm));
    hcclCommAbort(comm);
    return NULL;
}

/*
 * Without HCCL_CHECK, ranks calling different collectives are told as soon as a message of one
 * meets the other (a call that sends nothing, e.g. Reduce to different roots, needs HCCL_CHECK
 * or the exec timeout).
 */
static void test_mismatch_detected(void **state)
{
    (void)state;
    for (int variant = 0; variant < 2; variant++) {
        mismatch_arg_t a[2];
        pthread_t th[2];
        hcclUniqueId id;
        int named = 0;

        assert_int_equal(hcclGetUniqueId(&id), hcclSuccess);
        for (int r = 0; r < 2; r++) {
            a[r] = (mismatch_arg_t){.id = id, .rank = r, .variant = variant};
            assert_int_equal(pthread_create(&th[r], NULL, mismatch_rank, &a[r]), 0);
        }
        for (int r = 0; r < 2; r++)
            pthread_join(th[r], NULL);
        for (int r = 0; r < 2; r++) {
            assert_true(a[r].res == hcclInvalidUsage || a[r].res == hcclRemoteError);
            if (a[r].res == hcclInvalidUsage && strstr(a[r].msg, "collective mismatch"))
                named++;
        }
        assert_true(named >= 1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timeout_shm),
        cmocka_unit_test(test_timeout_tcp),
        cmocka_unit_test(test_new_comm_after_abort),
        cmocka_unit_test(test_wait_after_destroy),
        cmocka_unit_test(test_wait_after_abort),
        cmocka_unit_test(test_destroy_from_callback_refused),
        cmocka_unit_test(test_algo_mismatch),
        cmocka_unit_test(test_mismatch_detected),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
