/*
 * Real communicators in this process through the public API: 1-rank and 2-rank AllReduce,
 * argument checks, the completion fd, a caller's event_base driving the communicator, and
 * several threads on one communicator.
 *
 * Every wait is on an event; the timeouts only bound a broken run.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>

#include "hccl.h"
#include "reactor/reactor.h"
#include "reactor_helpers.h"

/* ---- 4. communicators in this process ---- */

static hcclComm_t one_rank_comm(void)
{
    hcclUniqueId id;
    hcclComm_t comm = NULL;

    assert_int_equal(hcclGetUniqueId(&id), hcclSuccess);
    assert_int_equal(hcclCommInitRank(&comm, 1, id, 0), hcclSuccess);
    assert_non_null(comm);
    return comm;
}

static void test_comm_one_rank_allreduce(void **state)
{
    enum { N = 1031 };
    hcclComm_t comm = one_rank_comm();
    unsigned char *in = malloc(N * 8), *out = malloc(N * 8 + 1), *inplace = malloc(N * 8);
    hcclRequest_t req = NULL;
    int count = -1, rank = -1, fd = -1, done;
    uint64_t completions = 0;

    (void)state;
    assert_non_null(in);
    assert_non_null(out);
    assert_non_null(inplace);
    assert_int_equal(hcclCommCount(comm, &count), hcclSuccess);
    assert_int_equal(hcclCommUserRank(comm, &rank), hcclSuccess);
    assert_int_equal(count, 1);
    assert_int_equal(rank, 0);
    assert_int_equal(hcclCommGetCompletionFd(comm, &fd), hcclSuccess);
    assert_true(fd >= 0);
    assert_int_equal(hcclCommProgress(comm), hcclSuccess); /* own thread: a no-op */

    /* On one rank every reduction is a copy, out of place and in place. */
    for (int dt = 0; dt < hcclNumTypes; dt++)
        for (int op = 0; op < hcclNumOps; op++) {
            size_t bytes = N * dt_size[dt];
            fill(in, (hcclDataType_t)dt, N, (uint32_t)(dt * 16 + op));
            memset(out, 0xa5, N * 8 + 1);
            assert_int_equal(hcclAllReduce(in, out, N, (hcclDataType_t)dt, (hcclRedOp_t)op, comm),
                             hcclSuccess);
            if (memcmp(in, out, bytes) != 0)
                fail_msg("dtype %d op %d: out of place result differs from the input", dt, op);
            assert_int_equal(out[bytes], 0xa5); /* nothing written past the end */
            memcpy(inplace, in, bytes);
            assert_int_equal(
                hcclAllReduce(inplace, inplace, N, (hcclDataType_t)dt, (hcclRedOp_t)op, comm),
                hcclSuccess);
            if (memcmp(in, inplace, bytes) != 0)
                fail_msg("dtype %d op %d: in place result differs from the input", dt, op);
        }

    /* Every one of the 2 * hcclNumTypes * hcclNumOps completions is counted once. */
    assert_true(fd_collect(fd, &completions, 2 * hcclNumTypes * hcclNumOps));

    /* count 0 with NULL buffers completes its request. */
    assert_int_equal(hcclAllReduceAsync(NULL, NULL, 0, hcclFloat32, hcclSum, comm, &req),
                     hcclSuccess);
    assert_non_null(req);
    assert_int_equal(hcclWait(&req), hcclSuccess);
    assert_null(req);
    assert_int_equal(hcclAllReduce(NULL, NULL, 0, hcclInt8, hcclMax, comm), hcclSuccess);
    assert_true(fd_collect(fd, &completions, 2 * hcclNumTypes * hcclNumOps + 2));

    /* The completion fd becomes readable after an async AllReduce; then the request is done. */
    fill(in, hcclInt64, N, 77);
    assert_int_equal(hcclAllReduceAsync(in, out, N, hcclInt64, hcclSum, comm, &req), hcclSuccess);
    assert_true(fd_readable(fd, WAIT_MS));
    done = 0;
    assert_int_equal(hcclTest(&req, &done), hcclSuccess);
    assert_int_equal(done, 1);
    assert_null(req);
    assert_memory_equal(in, out, N * 8);
    assert_int_equal(fd_drain(fd), 1);
    assert_false(fd_readable(fd, 0));

    assert_int_equal(hcclCommDestroy(comm), hcclSuccess);
    free(in);
    free(out);
    free(inplace);
}

static void expect_invalid(hcclResult_t res, const char *needle)
{
    assert_int_equal(res, hcclInvalidArgument);
    if (!strstr(hcclGetLastError(NULL), needle))
        fail_msg("last error \"%s\" does not mention \"%s\"", hcclGetLastError(NULL), needle);
}

static void test_comm_bad_arguments(void **state)
{
    hcclComm_t comm = one_rank_comm();
    int32_t buf[64] = {0}, out[64];
    hcclRequest_t req = NULL;
    int x;

    (void)state;
    expect_invalid(hcclAllReduceAsync(buf, out, 64, hcclInt32, hcclSum, NULL, &req),
                   "comm is NULL");
    expect_invalid(hcclAllReduce(buf, out, 64, hcclInt32, hcclSum, NULL), "comm is NULL");
    expect_invalid(hcclAllReduceAsync(buf, out, 64, hcclInt32, hcclSum, comm, NULL), "req is NULL");
    expect_invalid(hcclAllReduceAsync(buf, out, 64, hcclNumTypes, hcclSum, comm, &req), "datatype");
    expect_invalid(hcclAllReduceAsync(buf, out, 64, (hcclDataType_t)-1, hcclSum, comm, &req),
                   "datatype");
    expect_invalid(hcclAllReduceAsync(buf, out, 64, hcclInt32, hcclNumOps, comm, &req), "op");
    expect_invalid(hcclAllReduceAsync(buf, out, 64, hcclInt32, hcclNumOps, comm, &req),
                   "hcclRedOp_t");
    expect_invalid(hcclAllReduceAsync(NULL, out, 64, hcclInt32, hcclSum, comm, &req),
                   "sendbuf is NULL");
    expect_invalid(hcclAllReduceAsync(buf, NULL, 64, hcclInt32, hcclSum, comm, &req),
                   "recvbuf is NULL");
    expect_invalid(hcclAllReduceAsync(buf, buf + 1, 32, hcclInt32, hcclSum, comm, &req), "overlap");
    expect_invalid(hcclAllReduceAsync(buf + 8, buf, 32, hcclInt32, hcclSum, comm, &req), "overlap");
    expect_invalid(hcclAllReduceAsync(buf, out, SIZE_MAX / 2, hcclInt32, hcclSum, comm, &req),
                   "overflow");
    assert_null(req);
    expect_invalid(hcclCommCount(NULL, &x), "comm is NULL");
    expect_invalid(hcclCommCount(comm, NULL), "count is NULL");
    expect_invalid(hcclCommUserRank(comm, NULL), "rank is NULL");
    expect_invalid(hcclCommGetCompletionFd(comm, NULL), "fd is NULL");
    expect_invalid(hcclCommProgress(NULL), "comm is NULL");

    /* Adjacent but disjoint halves are fine, and the communicator still works. */
    for (int i = 0; i < 64; i++)
        buf[i] = i * 3 - 7;
    assert_int_equal(hcclAllReduce(buf, buf + 32, 32, hcclInt32, hcclSum, comm), hcclSuccess);
    assert_memory_equal(buf, buf + 32, 32 * sizeof(int32_t));
    assert_int_equal(hcclCommDestroy(comm), hcclSuccess);
}

/* Two ranks of one communicator, each in a thread of this process. */
typedef struct {
    hcclUniqueId id;
    bool external;     /* each rank drives its own event_base */
    counter_t gate;    /* rank 0 saw its request unfinished */
    int r0_first_done; /* rank 0's hcclTest *done before rank 1 posted */
    struct {
        char err[ERRLEN];
        int phases; /* external: phases that completed correctly */
    } rank[2];
    int nranks;
} duo_t;

typedef struct {
    duo_t *d;
    int rank;
} duo_arg_t;

enum { DUO_N = 100003 };

/* Rank r's element i; the sum over ranks 0..n-1 is exact in every type used. */
static int32_t duo_i32(int r, size_t i)
{
    return (int32_t)(i % 1000003u) * (r + 1) - 17 * r;
}

static bool duo_check_i32(const int32_t *out, int nranks, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int64_t want = 0;
        for (int r = 0; r < nranks; r++)
            want += duo_i32(r, i);
        if (out[i] != (int32_t)want)
            return false;
    }
    return true;
}

static void *duo_own_thread_main(void *arg)
{
    duo_arg_t *a = arg;
    duo_t *d = a->d;
    char *err = d->rank[a->rank].err;
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
    hcclComm_t comm = NULL;
    hcclRequest_t req = NULL;
    int32_t *in = malloc(DUO_N * sizeof(int32_t)), *out = malloc(DUO_N * sizeof(int32_t));
    double fin[257], fout[257];
    int64_t lin[17], lout[17];
    int done = -1, count = -1, rank = -1;
    bool gated = false;

    TCHECK(err, in && out);
    cfg.connectTimeoutMs = CONNECT_MS;
    TCHECK(err, hcclCommInitRankConfig(&comm, 2, d->id, a->rank, &cfg) == hcclSuccess);
    TCHECK(err, hcclCommCount(comm, &count) == hcclSuccess && count == 2);
    TCHECK(err, hcclCommUserRank(comm, &rank) == hcclSuccess && rank == a->rank);
    for (size_t i = 0; i < DUO_N; i++)
        in[i] = duo_i32(a->rank, i);
    if (a->rank == 0) {
        TCHECK(err,
               hcclAllReduceAsync(in, out, DUO_N, hcclInt32, hcclSum, comm, &req) == hcclSuccess);
        hcclRequest_t same = req;
        /* Rank 1 has not posted: this cannot be finished. */
        TCHECK(err, hcclTest(&req, &done) == hcclSuccess);
        d->r0_first_done = done;
        TCHECK(err, req == same);
        counter_add(&d->gate, 1);
        gated = true;
    } else {
        TCHECK(err, counter_wait(&d->gate, 1, WAIT_MS));
        TCHECK(err,
               hcclAllReduceAsync(in, out, DUO_N, hcclInt32, hcclSum, comm, &req) == hcclSuccess);
    }
    TCHECK(err, hcclWait(&req) == hcclSuccess);
    TCHECK(err, req == NULL);
    TCHECK(err, duo_check_i32(out, 2, DUO_N));

    /* More shapes, both ranks posting freely; in place for the doubles. */
    for (int i = 0; i < 257; i++)
        fin[i] = fout[i] = (double)(i * (a->rank + 1)) / 4.0;
    for (int i = 0; i < 17; i++)
        lin[i] = (int64_t)i * (a->rank ? 1000000007LL : -3);
    TCHECK(err, hcclAllReduce(fout, fout, 257, hcclFloat64, hcclSum, comm) == hcclSuccess);
    TCHECK(err, hcclAllReduce(lin, lout, 17, hcclInt64, hcclMax, comm) == hcclSuccess);
    for (int i = 0; i < 257; i++)
        TCHECK(err, fout[i] == (double)(i * 3) / 4.0);
    for (int i = 0; i < 17; i++)
        TCHECK(err, lout[i] == (int64_t)i * 1000000007LL);
    (void)fin;
out:
    if (a->rank == 0 && !gated)
        counter_add(&d->gate, 1); /* never leave rank 1 waiting */
    if (req) {
        /* Only after a failure above; let it finish so that nothing leaks. */
        (void)hcclWait(&req);
    }
    if (comm && hcclCommDestroy(comm) != hcclSuccess)
        worker_fail(err, __LINE__, "hcclCommDestroy");
    free(in);
    free(out);
    return NULL;
}

static void run_duo(duo_t *d, int nranks, void *(*fn)(void *))
{
    pthread_t th[2];
    duo_arg_t args[2];

    d->nranks = nranks;
    counter_init(&d->gate);
    assert_int_equal(hcclGetUniqueId(&d->id), hcclSuccess);
    for (int r = 0; r < nranks; r++) {
        args[r] = (duo_arg_t){d, r};
        assert_int_equal(pthread_create(&th[r], NULL, fn, &args[r]), 0);
    }
    for (int r = 0; r < nranks; r++)
        pthread_join(th[r], NULL);
    counter_destroy(&d->gate);
}

static void test_comm_two_ranks_threads(void **state)
{
    duo_t *d = calloc(1, sizeof(*d)), copy;

    (void)state;
    assert_non_null(d);
    d->r0_first_done = -1;
    run_duo(d, 2, duo_own_thread_main);
    memcpy(&copy, d, sizeof(copy));
    free(d);
    for (int r = 0; r < 2; r++)
        if (copy.rank[r].err[0])
            fail_msg("rank %d: %s", r, copy.rank[r].err);
    assert_int_equal(copy.r0_first_done, 0);
}

/* ---- 5. a caller's event_base ---- */

/*
 * Drives until the completion fd is readable, by fn; then hcclTest must report
 * done at once. Returns false on timeout.
 */
typedef enum { DRIVE_EVENT_LOOP, DRIVE_PROGRESS } drive_how_t;

static bool drive_until_fd(struct event_base *base, hcclComm_t comm, int fd, drive_how_t how)
{
    int64_t deadline = mono_ms() + WAIT_MS;

    while (!fd_readable(fd, 0)) {
        if (mono_ms() > deadline)
            return false;
        if (how == DRIVE_EVENT_LOOP) {
            if (event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK) < 0)
                return false;
        } else if (hcclCommProgress(comm) != hcclSuccess) {
            return false;
        }
        sched_yield();
    }
    return true;
}

static void *duo_external_main(void *arg)
{
    enum { N = 4099 };
    duo_arg_t *a = arg;
    duo_t *d = a->d;
    char *err = d->rank[a->rank].err;
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
    struct event_base *base = event_base_new();
    hcclComm_t comm = NULL;
    hcclRequest_t req = NULL;
    int32_t in[N], out[N];
    int fd = -1, done;
    hcclResult_t res;

    TCHECK(err, base != NULL);
    cfg.eventBase = base;
    cfg.connectTimeoutMs = CONNECT_MS;
    TCHECK(err, hcclCommInitRankConfig(&comm, d->nranks, d->id, a->rank, &cfg) == hcclSuccess);
    TCHECK(err, hcclCommGetCompletionFd(comm, &fd) == hcclSuccess);
    for (size_t i = 0; i < N; i++)
        in[i] = duo_i32(a->rank, i);

    /* Phase 1: only the caller's event_base_loop makes progress. */
    (void)fd_drain(fd);
    memset(out, 0, sizeof(out));
    TCHECK(err, hcclAllReduceAsync(in, out, N, hcclInt32, hcclSum, comm, &req) == hcclSuccess);
    TCHECK(err, drive_until_fd(base, comm, fd, DRIVE_EVENT_LOOP));
    done = 0;
    TCHECK(err, hcclTest(&req, &done) == hcclSuccess);
    TCHECK(err, done == 1 && req == NULL);
    TCHECK(err, duo_check_i32(out, d->nranks, N));
    d->rank[a->rank].phases++;

    /* Phase 2: hcclWait drives the loop itself (on the thread that ran it in phase 1). */
    (void)fd_drain(fd);
    memset(out, 0, sizeof(out));
    TCHECK(err, hcclAllReduceAsync(in, out, N, hcclInt32, hcclSum, comm, &req) == hcclSuccess);
    res = hcclWait(&req);
    if (res != hcclSuccess) {
        worker_fail(err, __LINE__,
                    "hcclWait(&req) == hcclSuccess on an external-loop communicator");
        /* Finish the request by driving the loop, so that the other rank and cleanup go on. */
        TCHECK(err, drive_until_fd(base, comm, fd, DRIVE_EVENT_LOOP));
        done = 0;
        TCHECK(err, hcclTest(&req, &done) == hcclSuccess && done == 1);
    }
    TCHECK(err, req == NULL);
    TCHECK(err, duo_check_i32(out, d->nranks, N));
    if (res == hcclSuccess)
        d->rank[a->rank].phases++;

    /* Phase 3: hcclCommProgress drives it. */
    (void)fd_drain(fd);
    memset(out, 0, sizeof(out));
    TCHECK(err, hcclAllReduceAsync(in, out, N, hcclInt32, hcclSum, comm, &req) == hcclSuccess);
    TCHECK(err, drive_until_fd(base, comm, fd, DRIVE_PROGRESS));
    done = 0;
    TCHECK(err, hcclTest(&req, &done) == hcclSuccess);
    TCHECK(err, done == 1 && req == NULL);
    TCHECK(err, duo_check_i32(out, d->nranks, N));
    d->rank[a->rank].phases++;

    /*
     * Phase 4: the blocking form, twice in a row. Skipped when hcclWait failed
     * in phase 2: hcclAllReduce would fail the same way and lose its request.
     */
    TCHECK(err, res == hcclSuccess);
    memset(out, 0, sizeof(out));
    TCHECK(err, hcclAllReduce(in, out, N, hcclInt32, hcclSum, comm) == hcclSuccess);
    TCHECK(err, duo_check_i32(out, d->nranks, N));
    memset(out, 0, sizeof(out));
    TCHECK(err, hcclAllReduce(in, out, N, hcclInt32, hcclSum, comm) == hcclSuccess);
    TCHECK(err, duo_check_i32(out, d->nranks, N));
    d->rank[a->rank].phases++;
out:
    if (req && comm) {
        /* Only after a failure: finish it by driving, bounded. */
        done = 0;
        for (int64_t dl = mono_ms() + WAIT_MS; !done && mono_ms() < dl;) {
            event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
            if (hcclTest(&req, &done) != hcclSuccess)
                break;
            sched_yield();
        }
    }
    /* The communicator goes before its event_base. */
    if (comm && hcclCommDestroy(comm) != hcclSuccess)
        worker_fail(err, __LINE__, "hcclCommDestroy");
    if (base)
        event_base_free(base);
    return NULL;
}

static void run_external(int nranks)
{
    duo_t *d = calloc(1, sizeof(*d));
    char msg[2 * ERRLEN + 128] = "";
    int phases[2] = {0, 0};

    assert_non_null(d);
    run_duo(d, nranks, duo_external_main);
    for (int r = nranks - 1; r >= 0; r--) {
        phases[r] = d->rank[r].phases;
        if (d->rank[r].err[0])
            snprintf(msg, sizeof(msg),
                     "%d-rank external event_base, rank %d (%d of 4 phases passed): %s", nranks, r,
                     d->rank[r].phases, d->rank[r].err);
    }
    free(d);
    if (msg[0])
        fail_msg("%s", msg);
    for (int r = 0; r < nranks; r++)
        assert_int_equal(phases[r], 4);
}

static void test_external_base_one_rank(void **state)
{
    (void)state;
    run_external(1);
}

static void test_external_base_two_ranks(void **state)
{
    (void)state;
    run_external(2);
}

/* ---- 6. several threads on one communicator ---- */

enum { MT_THREADS = 4, MT_REQS = 200, MT_MAX = 97 };

typedef struct {
    hcclComm_t comm;
    pthread_barrier_t *start;
    int t;
    char err[ERRLEN];
} mt_arg_t;

static size_t mt_count(int k)
{
    return (size_t)(k % 7) * 13 + 1 + (size_t)(k % 3); /* 1..MT_MAX */
}

static void *mt_main(void *arg)
{
    mt_arg_t *a = arg;
    int32_t *in = calloc((size_t)MT_REQS * MT_MAX, sizeof(int32_t));
    int32_t *out = calloc((size_t)MT_REQS * MT_MAX, sizeof(int32_t));
    hcclRequest_t *reqs = calloc(MT_REQS, sizeof(*reqs));
    int posted = 0;

    pthread_barrier_wait(a->start);
    TCHECK(a->err, in && out && reqs);
    for (int k = 0; k < MT_REQS; k++) {
        int32_t *src = in + (size_t)k * MT_MAX, *dst = out + (size_t)k * MT_MAX;
        for (size_t i = 0; i < mt_count(k); i++)
            src[i] = a->t * 1000000 + k * 1000 + (int32_t)i;
        /* Every fourth in place. */
        if (k % 4 == 3) {
            memcpy(dst, src, mt_count(k) * sizeof(int32_t));
            src = dst;
        }
        TCHECK(a->err, hcclAllReduceAsync(src, dst, mt_count(k), hcclInt32, hcclSum, a->comm,
                                          &reqs[k]) == hcclSuccess);
        posted++;
    }
out:
    if (reqs && hcclWaitAll(posted, reqs) != hcclSuccess)
        worker_fail(a->err, __LINE__, "hcclWaitAll");
    for (int k = 0; k < posted && !a->err[0]; k++) {
        if (reqs[k] != NULL)
            worker_fail(a->err, __LINE__, "reqs[k] == NULL after hcclWaitAll");
        for (size_t i = 0; i < mt_count(k); i++)
            if (out[(size_t)k * MT_MAX + i] != a->t * 1000000 + k * 1000 + (int32_t)i) {
                worker_fail(a->err, __LINE__, "AllReduce result");
                break;
            }
    }
    free(in);
    free(out);
    free(reqs);
    return NULL;
}

static void test_comm_threads_one_comm(void **state)
{
    hcclComm_t comm = one_rank_comm();
    pthread_barrier_t start;
    pthread_t th[MT_THREADS];
    mt_arg_t *args = calloc(MT_THREADS, sizeof(*args));
    int fd = -1;
    uint64_t completions;

    (void)state;
    assert_non_null(args);
    assert_int_equal(hcclCommGetCompletionFd(comm, &fd), hcclSuccess);
    (void)fd_drain(fd);
    pthread_barrier_init(&start, NULL, MT_THREADS);
    for (int t = 0; t < MT_THREADS; t++) {
        args[t] = (mt_arg_t){.comm = comm, .start = &start, .t = t};
        assert_int_equal(pthread_create(&th[t], NULL, mt_main, &args[t]), 0);
    }
    for (int t = 0; t < MT_THREADS; t++)
        pthread_join(th[t], NULL);
    pthread_barrier_destroy(&start);
    for (int t = 0; t < MT_THREADS; t++)
        if (args[t].err[0])
            fail_msg("thread %d: %s", t, args[t].err);
    /* Destroy waits for everything; then every completion has been counted once. */
    completions = fd_drain(fd);
    assert_int_equal(hcclCommDestroy(comm), hcclSuccess);
    assert_true(completions <= MT_THREADS * MT_REQS);
    free(args);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_comm_one_rank_allreduce),
        cmocka_unit_test(test_comm_bad_arguments),
        cmocka_unit_test(test_comm_two_ranks_threads),
        cmocka_unit_test(test_external_base_one_rank),
        cmocka_unit_test(test_external_base_two_ranks),
        cmocka_unit_test(test_comm_threads_one_comm),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
