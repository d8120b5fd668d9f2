/*
 * Collectives on host streams, with real communicators whose ranks are threads of this
 * process: each collective runs between a host function that produces its input and one that
 * checks its output, several rounds over the same buffers, so that a collective posted too
 * early or work let through before it completed shows as wrong data; a collective that fails
 * later (the peer aborted its communicator, the exec timeout) is reported by
 * hcclStreamSynchronize, skips what was queued after it and reaches the events and streams
 * that wait for it, as does an abort of the rank's own communicator in the middle of it; the
 * arguments are checked by the OnStream call itself.
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/comm.h" /* the count of work in flight: when a collective is in flight */
#include "hccl.h"

#define MAX_RANKS 4

typedef struct rank_ctx rank_ctx_t;
typedef void (*rank_body_t)(rank_ctx_t *ctx);

struct rank_ctx {
    hcclUniqueId id;
    int rank;
    int nranks;
    int exec_timeout_ms;
    hcclComm_t comm;
    rank_body_t body;
    /* shared by the ranks of one case */
    pthread_mutex_t *mtx;
    pthread_cond_t *cond;
    int *stage;
    char failure[512]; /* the first expectation that failed on this rank, "" if none */
};

/*
 * cmocka's assertions may only fail on the test's own thread, so the ranks' threads record
 * their first failed expectation and go on; run_ranks() fails the test with it after the join.
 */
static void expect_failed(rank_ctx_t *c, int line, const char *what, long long a, long long b)
{
    if (!c->failure[0])
        snprintf(c->failure, sizeof(c->failure),
                 "rank %d, line %d: %s (%lld vs %lld); last error: %s", c->rank, line, what, a, b,
                 hcclGetLastError(NULL));
}
#define EXPECT_EQ(c_x, a_x, b_x)                                                                   \
    do {                                                                                           \
        long long a_ = (long long)(a_x), b_ = (long long)(b_x);                                    \
        if (a_ != b_)                                                                              \
            expect_failed((c_x), __LINE__, #a_x " == " #b_x, a_, b_);                              \
    } while (0)
#define EXPECT_TRUE(c_x, cond_x) EXPECT_EQ(c_x, !!(cond_x), 1)

static void *rank_main(void *p)
{
    rank_ctx_t *c = p;
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;

    cfg.connectTimeoutMs = 60000;
    cfg.execTimeoutMs = c->exec_timeout_ms;
    if (hcclCommInitRankConfig(&c->comm, c->nranks, c->id, c->rank, &cfg) != hcclSuccess) {
        expect_failed(c, __LINE__, "hcclCommInitRankConfig", 0, 0);
        return NULL;
    }
    c->body(c);
    return NULL;
}

/* Runs body on n ranks (threads); rank 0 gets exec_timeout_ms (0: none). */
static void run_ranks(int n, rank_body_t body, int exec_timeout_ms)
{
    pthread_mutex_t mtx = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
    rank_ctx_t ctx[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    hcclUniqueId id;
    int stage = 0;

    assert_int_equal(hcclGetUniqueId(&id), hcclSuccess);
    for (int r = 0; r < n; r++) {
        ctx[r] = (rank_ctx_t){.id = id,
                              .rank = r,
                              .nranks = n,
                              .body = body,
                              .mtx = &mtx,
                              .cond = &cond,
                              .stage = &stage,
                              .exec_timeout_ms = r == 0 ? exec_timeout_ms : 0};
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &ctx[r]), 0);
    }
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++)
        if (ctx[r].failure[0])
            fail_msg("%s", ctx[r].failure);
}

static void stage_set(rank_ctx_t *c, int v)
{
    pthread_mutex_lock(c->mtx);
    *c->stage = v;
    pthread_cond_broadcast(c->cond);
    pthread_mutex_unlock(c->mtx);
}

static void stage_wait(rank_ctx_t *c, int v)
{
    pthread_mutex_lock(c->mtx);
    while (*c->stage < v)
        pthread_cond_wait(c->cond, c->mtx);
    pthread_mutex_unlock(c->mtx);
}

/* ---- collectives ordered between host functions ---- */

#define COUNT (64 * 1024) /* float32 per block: several pipeline chunks */
#define ROUNDS 3

enum { K_ALLREDUCE, K_BROADCAST, K_ALLGATHER, K_REDUCESCATTER, K_ALLTOALL, K_NUM };

typedef struct {
    int rank, n;
    int kind; /* K_*: what produce/check do next */
    int round;
    float *send; /* n * COUNT */
    float *recv; /* n * COUNT */
    long bad;    /* elements found wrong */
    int checked; /* check_fn calls */
} coll_state_t;

/* The value rank r contributes at element i of round k: small integers, exact in float32. */
static float val(int r, int k, size_t i)
{
    return (float)((r + 1) * (k + 2) + (int)(i % 13));
}

static void produce_fn(void *arg)
{
    coll_state_t *st = arg;

    for (size_t i = 0; i < (size_t)st->n * COUNT; i++) {
        st->send[i] = val(st->rank, st->round, i);
        st->recv[i] = -1.0f;
    }
}

static float expect(const coll_state_t *st, size_t i)
{
    float sum = 0;

    switch (st->kind) {
    case K_ALLREDUCE: /* in place, COUNT elements */
        for (int r = 0; r < st->n; r++)
            sum += val(r, st->round, i);
        return sum;
    case K_BROADCAST: /* from rank 1, in place in send */
        return val(1, st->round, i);
    case K_ALLGATHER: /* block r of recv is rank r's first block */
        return val((int)(i / COUNT), st->round, i % COUNT);
    case K_REDUCESCATTER: /* block `rank` of everyone's send, summed */
        for (int r = 0; r < st->n; r++)
            sum += val(r, st->round, (size_t)st->rank * COUNT + i);
        return sum;
    default: /* alltoall: block r of recv is block `rank` of rank r's send */
        return val((int)(i / COUNT), st->round, (size_t)st->rank * COUNT + i % COUNT);
    }
}

static void check_fn(void *arg)
{
    coll_state_t *st = arg;
    size_t n = st->kind == K_ALLREDUCE || st->kind == K_BROADCAST || st->kind == K_REDUCESCATTER
                   ? COUNT
                   : (size_t)st->n * COUNT;
    const float *out = st->kind == K_ALLREDUCE || st->kind == K_BROADCAST ? st->send : st->recv;

    for (size_t i = 0; i < n; i++)
        if (out[i] != expect(st, i))
            st->bad++;
    st->checked++;
    if (++st->round == ROUNDS) {
        st->round = 0;
        st->kind++;
    }
}

static void body_ordered(rank_ctx_t *c)
{
    coll_state_t st = {.rank = c->rank, .n = c->nranks};
    hcclStream_t s;
    hcclComm_t comm = c->comm;

    st.send = calloc((size_t)c->nranks * COUNT, sizeof(float));
    st.recv = calloc((size_t)c->nranks * COUNT, sizeof(float));
    if (!st.send || !st.recv) {
        expect_failed(c, __LINE__, "out of memory", 0, 0);
        return;
    }
    EXPECT_EQ(c, hcclStreamCreate(&s), hcclSuccess);
    /* Everything is queued before any of it runs; the buffers are reused every round. */
    for (int k = 0; k < K_NUM; k++) {
        for (int round = 0; round < ROUNDS; round++) {
            EXPECT_EQ(c, hcclStreamEnqueue(s, produce_fn, &st), hcclSuccess);
            switch (k) {
            case K_ALLREDUCE:
                EXPECT_EQ(
                    c,
                    hcclAllReduceOnStream(st.send, st.send, COUNT, hcclFloat32, hcclSum, comm, s),
                    hcclSuccess);
                break;
            case K_BROADCAST:
                EXPECT_EQ(c, hcclBroadcastOnStream(st.send, COUNT, hcclFloat32, 1, comm, s),
                          hcclSuccess);
                break;
            case K_ALLGATHER:
                EXPECT_EQ(c, hcclAllGatherOnStream(st.send, st.recv, COUNT, hcclFloat32, comm, s),
                          hcclSuccess);
                break;
            case K_REDUCESCATTER:
                EXPECT_EQ(c,
                          hcclReduceScatterOnStream(st.send, st.recv, COUNT, hcclFloat32, hcclSum,
                                                    comm, s),
                          hcclSuccess);
                break;
            default:
                EXPECT_EQ(c, hcclAlltoAllOnStream(st.send, st.recv, COUNT, hcclFloat32, comm, s),
                          hcclSuccess);
                break;
            }
            EXPECT_EQ(c, hcclStreamEnqueue(s, check_fn, &st), hcclSuccess);
        }
    }
    EXPECT_EQ(c, hcclStreamSynchronize(s), hcclSuccess);
    EXPECT_EQ(c, st.checked, K_NUM * ROUNDS);
    EXPECT_EQ(c, st.bad, 0);
    EXPECT_EQ(c, hcclStreamDestroy(s), hcclSuccess);
    EXPECT_EQ(c, hcclCommDestroy(comm), hcclSuccess);
    free(st.send);
    free(st.recv);
}

static void test_collectives_ordered_3(void **state)
{
    (void)state;
    run_ranks(3, body_ordered, 0);
}

/* ---- a collective that fails later ---- */

static void flag_fn(void *arg)
{
    (*(int *)arg)++;
}

/* Holds its stream back until the test has queued everything: the failure cannot come early. */
typedef struct {
    pthread_mutex_t mtx;
    pthread_cond_t cond;
    int open;
} gate_t;

static void gate_fn(void *arg)
{
    gate_t *g = arg;

    pthread_mutex_lock(&g->mtx);
    while (!g->open)
        pthread_cond_wait(&g->cond, &g->mtx);
    pthread_mutex_unlock(&g->mtx);
}

static void gate_open(gate_t *g)
{
    pthread_mutex_lock(&g->mtx);
    g->open = 1;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->mtx);
}

/* Rank 0's side: the AllReduce cannot finish; what follows is checked. */
static void fail_side(rank_ctx_t *c, hcclResult_t want, const char *why)
{
    gate_t gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    hcclStream_t s, s2;
    hcclEvent_t ev;
    float buf[256] = {0};
    int before = 0, after = 0, after2 = 0;

    EXPECT_EQ(c, hcclStreamCreate(&s), hcclSuccess);
    EXPECT_EQ(c, hcclStreamCreate(&s2), hcclSuccess);
    EXPECT_EQ(c, hcclEventCreate(&ev), hcclSuccess);
    EXPECT_EQ(c, hcclStreamEnqueue(s, gate_fn, &gate), hcclSuccess);
    EXPECT_EQ(c, hcclStreamEnqueue(s, flag_fn, &before), hcclSuccess);
    EXPECT_EQ(c, hcclAllReduceOnStream(buf, buf, 256, hcclFloat32, hcclSum, c->comm, s),
              hcclSuccess);
    EXPECT_EQ(c, hcclStreamEnqueue(s, flag_fn, &after), hcclSuccess);
    EXPECT_EQ(c, hcclEventRecord(ev, s), hcclSuccess);
    EXPECT_EQ(c, hcclStreamWaitEvent(s2, ev), hcclSuccess);
    EXPECT_EQ(c, hcclStreamEnqueue(s2, flag_fn, &after2), hcclSuccess);
    gate_open(&gate);
    stage_set(c, 1); /* the peer may go now */

    EXPECT_EQ(c, hcclStreamSynchronize(s), want);
    EXPECT_TRUE(c, strstr(hcclGetLastError(c->comm), "hcclAllReduceOnStream"));
    EXPECT_TRUE(c, strstr(hcclGetLastError(c->comm), why));
    EXPECT_EQ(c, before, 1);
    EXPECT_EQ(c, after, 0); /* skipped, not run on bad data */
    /* The event recorded after the failure carries it, and so does the stream waiting on it. */
    EXPECT_EQ(c, hcclEventSynchronize(ev), want);
    EXPECT_EQ(c, hcclEventQuery(ev), want);
    EXPECT_EQ(c, hcclStreamSynchronize(s2), want);
    EXPECT_TRUE(c, strstr(hcclGetLastError(c->comm), "hcclAllReduceOnStream"));
    EXPECT_EQ(c, after2, 0);
    /* Sticky: reported again, and new work is refused at once. */
    EXPECT_EQ(c, hcclStreamSynchronize(s), want);
    EXPECT_EQ(c, hcclStreamEnqueue(s, flag_fn, &after), want);
    EXPECT_EQ(c, hcclAllReduceOnStream(buf, buf, 256, hcclFloat32, hcclSum, c->comm, s), want);
    EXPECT_EQ(c, after, 0);

    EXPECT_EQ(c, hcclCommAbort(c->comm), hcclSuccess);
    EXPECT_EQ(c, hcclEventDestroy(ev), hcclSuccess);
    EXPECT_EQ(c, hcclStreamDestroy(s), want); /* freed all the same */
    EXPECT_EQ(c, hcclStreamDestroy(s2), want);
}

/* Rank 1 aborts its communicator without posting: rank 0 learns it as a remote error. */
static void body_peer_aborts(rank_ctx_t *c)
{
    if (c->rank == 1) {
        stage_wait(c, 1); /* rank 0 has queued its work (and is done with init) */
        EXPECT_EQ(c, hcclCommAbort(c->comm), hcclSuccess);
        return;
    }
    fail_side(c, hcclRemoteError, "rank 1");
}

static void test_peer_abort_reaches_stream(void **state)
{
    (void)state;
    run_ranks(2, body_peer_aborts, 0);
}

/* Rank 1 stays away until rank 0's AllReduce has timed out. */
static void body_timeout(rank_ctx_t *c)
{
    if (c->rank == 1) {
        stage_wait(c, 2);
        EXPECT_EQ(c, hcclCommAbort(c->comm), hcclSuccess);
        return;
    }
    fail_side(c, hcclTimeout, "exec timeout");
    stage_set(c, 2);
}

static void test_exec_timeout_reaches_stream(void **state)
{
    (void)state;
    run_ranks(2, body_timeout, 300);
}

/* Rank 0 aborts its own communicator while the AllReduce on its stream is in flight. */
static void body_self_abort(rank_ctx_t *c)
{
    hcclStream_t s;
    float buf[256] = {0};
    int before = 0, after = 0, posted = 0;
    unsigned long long seq0;

    if (c->rank == 1) {
        stage_wait(c, 1);
        EXPECT_EQ(c, hcclCommAbort(c->comm), hcclSuccess);
        return;
    }
    seq0 = atomic_load(&c->comm->next_seq);

    EXPECT_EQ(c, hcclStreamCreate(&s), hcclSuccess);
    EXPECT_EQ(c, hcclStreamEnqueue(s, flag_fn, &before), hcclSuccess);
    EXPECT_EQ(c, hcclAllReduceOnStream(buf, buf, 256, hcclFloat32, hcclSum, c->comm, s),
              hcclSuccess);
    EXPECT_EQ(c, hcclStreamEnqueue(s, flag_fn, &after), hcclSuccess);
    /* In flight once it has its sequence number and the communicator counts it (rank 1 never
     * posts, so it stays there). */
    while (!posted) {
        posted = atomic_load(&c->comm->next_seq) > seq0 &&
                 hccl_reactor_pending(c->comm->reactor) > 0;
        if (!posted)
            sched_yield();
    }
    EXPECT_EQ(c, hcclCommAbort(c->comm), hcclSuccess);
    EXPECT_EQ(c, hcclStreamSynchronize(s), hcclAborted);
    EXPECT_TRUE(c, strstr(hcclGetLastError(NULL), "hcclAllReduceOnStream (256 x float32) failed"));
    EXPECT_TRUE(c, strstr(hcclGetLastError(NULL), "aborted"));
    EXPECT_EQ(c, before, 1);
    EXPECT_EQ(c, after, 0);
    EXPECT_EQ(c, hcclStreamDestroy(s), hcclAborted);
    stage_set(c, 1);
}

static void test_own_abort_reaches_stream(void **state)
{
    (void)state;
    run_ranks(2, body_self_abort, 0);
}

/* ---- one rank: every collective's result, and the argument checks ---- */

static void test_one_rank_and_bad_args(void **state)
{
    hcclUniqueId id;
    hcclComm_t comm;
    hcclStream_t s, dead;
    int a[4] = {1, 2, 3, 4}, b[4] = {0}, c[4] = {0}, d[8] = {0};

    (void)state;
    assert_int_equal(hcclGetUniqueId(&id), hcclSuccess);
    assert_int_equal(hcclCommInitRank(&comm, 1, id, 0), hcclSuccess);
    assert_int_equal(hcclStreamCreate(&s), hcclSuccess);
    assert_int_equal(hcclAllReduceOnStream(a, b, 4, hcclInt32, hcclSum, comm, s), hcclSuccess);
    assert_int_equal(hcclBroadcastOnStream(a, 4, hcclInt32, 0, comm, s), hcclSuccess);
    assert_int_equal(hcclAllGatherOnStream(a, c, 4, hcclInt32, comm, s), hcclSuccess);
    assert_int_equal(hcclReduceScatterOnStream(c, d, 4, hcclInt32, hcclMax, comm, s), hcclSuccess);
    assert_int_equal(hcclAlltoAllOnStream(d, d + 4, 4, hcclInt32, comm, s), hcclSuccess);
    assert_int_equal(hcclAllReduceOnStream(NULL, NULL, 0, hcclInt32, hcclSum, comm, s),
                     hcclSuccess); /* count 0: a no-op, NULL buffers allowed */
    assert_int_equal(hcclStreamSynchronize(s), hcclSuccess);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(b[i], i + 1);
        assert_int_equal(c[i], i + 1);
        assert_int_equal(d[i], i + 1);
        assert_int_equal(d[4 + i], i + 1);
    }

    /* Checked by the call itself: nothing is queued, the stream stays usable. */
    assert_int_equal(hcclAllReduceOnStream(a, b, 4, hcclNumTypes, hcclSum, comm, s),
                     hcclInvalidArgument);
    assert_non_null(strstr(hcclGetLastError(comm), "hcclAllReduceOnStream: datatype"));
    assert_int_equal(hcclAllReduceOnStream(a, b, 4, hcclInt32, hcclNumOps, comm, s),
                     hcclInvalidArgument);
    assert_int_equal(hcclReduceScatterOnStream(a, b, 1, hcclInt32, (hcclRedOp_t)-1, comm, s),
                     hcclInvalidArgument);
    assert_int_equal(hcclAllReduceOnStream(a, b, 4, hcclInt32, hcclSum, NULL, s),
                     hcclInvalidArgument);
    assert_non_null(strstr(hcclGetLastError(comm), "comm is NULL"));
    assert_int_equal(hcclAllReduceOnStream(a, b, 4, hcclInt32, hcclSum, comm, NULL),
                     hcclInvalidArgument);
    assert_non_null(strstr(hcclGetLastError(comm), "stream is NULL"));
    assert_int_equal(hcclAllReduceOnStream(NULL, b, 4, hcclInt32, hcclSum, comm, s),
                     hcclInvalidArgument);
    assert_int_equal(hcclAllReduceOnStream(a, a + 1, 2, hcclInt32, hcclSum, comm, s),
                     hcclInvalidArgument);
    assert_non_null(strstr(hcclGetLastError(comm), "overlap"));
    assert_int_equal(hcclBroadcastOnStream(a, 4, hcclInt32, 1, comm, s), hcclInvalidArgument);
    assert_non_null(strstr(hcclGetLastError(comm), "root 1"));
    assert_int_equal(hcclBroadcastOnStream(NULL, 4, hcclInt32, 0, comm, s), hcclInvalidArgument);
    assert_int_equal(hcclAllGatherOnStream(a, a + 1, 2, hcclInt32, comm, s), hcclInvalidArgument);
    /* in place */
    assert_int_equal(hcclAllGatherOnStream(a, a, 2, hcclInt32, comm, s), hcclSuccess);
    assert_int_equal(hcclReduceScatterOnStream(a, a + 1, 2, hcclInt32, hcclSum, comm, s),
                     hcclInvalidArgument);
    assert_int_equal(hcclAlltoAllOnStream(a, a + 2, 4, hcclInt32, comm, s), hcclInvalidArgument);
    assert_int_equal(hcclAlltoAllOnStream(a, NULL, 4, hcclInt32, comm, s), hcclInvalidArgument);
    assert_int_equal(hcclAllReduceOnStream(a, b, SIZE_MAX / 2, hcclInt32, hcclSum, comm, s),
                     hcclInvalidArgument);
    assert_int_equal(hcclStreamSynchronize(s), hcclSuccess);

    assert_int_equal(hcclStreamCreate(&dead), hcclSuccess);
    assert_int_equal(hcclStreamDestroy(dead), hcclSuccess);
    assert_int_equal(hcclAllReduceOnStream(a, b, 4, hcclInt32, hcclSum, comm, dead),
                     hcclInvalidUsage);
    assert_int_equal(hcclStreamDestroy(s), hcclSuccess);
    assert_int_equal(hcclCommDestroy(comm), hcclSuccess);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_rank_and_bad_args),
        cmocka_unit_test(test_collectives_ordered_3),
        cmocka_unit_test(test_peer_abort_reaches_stream),
        cmocka_unit_test(test_exec_timeout_reaches_stream),
        cmocka_unit_test(test_own_abort_reaches_stream),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
