/*
 * Host streams and events without a communicator: host functions run in order on one worker
 * thread; hcclStreamSynchronize waits for what was queued before it; events order work across
 * streams (and a wait keeps the point it captured when the event is re-recorded or destroyed);
 * hcclEventQuery/Synchronize; destroy drains queued work; bad handles and calls that would wait
 * for themselves; every allocation failing in turn.
 *
 * Nothing here sleeps: a gate (a function that blocks its stream until the test opens it) holds
 * work back, so that "not yet" is a fact, not a race.
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

#include "base/base.h"
#include "hccl.h"

/* ---- a gate: a stream function that blocks until the test opens it ---- */

typedef struct {
    pthread_mutex_t mtx;
    pthread_cond_t cond;
    int open;
    int entered;
} gate_t;

static void gate_init(gate_t *g)
{
    pthread_mutex_init(&g->mtx, NULL);
    pthread_cond_init(&g->cond, NULL);
    g->open = g->entered = 0;
}

static void gate_fn(void *arg)
{
    gate_t *g = arg;

    pthread_mutex_lock(&g->mtx);
    g->entered = 1;
    pthread_cond_broadcast(&g->cond);
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

static int gate_is_open(gate_t *g)
{
    int open;

    pthread_mutex_lock(&g->mtx);
    open = g->open;
    pthread_mutex_unlock(&g->mtx);
    return open;
}

static void gate_fini(gate_t *g)
{
    pthread_cond_destroy(&g->cond);
    pthread_mutex_destroy(&g->mtx);
}

/* ---- ordering ---- */

#define NFN 2000

typedef struct {
    int order[NFN];
    int n;
    pthread_t thread[NFN];
} trace_t;

typedef struct {
    trace_t *t;
    int i;
} step_t;

static void trace_fn(void *arg)
{
    step_t *s = arg;

    s->t->thread[s->t->n] = pthread_self();
    s->t->order[s->t->n++] = s->i;
}

static void test_fn_order(void **state)
{
    static trace_t t;
    static step_t steps[NFN];
    hcclStream_t s;

    (void)state;
    memset(&t, 0, sizeof(t));
    assert_int_equal(hcclStreamCreate(&s), hcclSuccess);
    for (int i = 0; i < NFN; i++) {
        steps[i] = (step_t){&t, i};
        assert_int_equal(hcclStreamEnqueue(s, trace_fn, &steps[i]), hcclSuccess);
    }
    assert_int_equal(hcclStreamSynchronize(s), hcclSuccess);
    assert_int_equal(t.n, NFN); /* synchronize waited for every one */
    for (int i = 0; i < NFN; i++) {
        assert_int_equal(t.order[i], i);
        assert_true(pthread_equal(t.thread[i], t.thread[0])); /* one worker */
    }
    assert_false(pthread_equal(t.thread[0], pthread_self()));
    assert_int_equal(hcclStreamDestroy(s), hcclSuccess);
}

/* ---- events across streams ---- */

typedef struct {
    gate_t *gate;
    int x;             /* written by stream A after its gate */
    int seen;          /* what stream B read */
    int gate_was_open; /* whether B's function ran after the gate opened */
} cross_t;

static void produce_fn(void *arg)
{
    ((cross_t *)arg)->x = 42;
}

static void consume_fn(void *arg)
{
    cross_t *c = arg;

    c->gate_was_open = gate_is_open(c->gate);
    c->seen = c->x;
}

static void test_cross_stream_event(void **state)
{
    hcclStream_t a, b, other;
    hcclEvent_t ev, done_b;
    gate_t gate;
    cross_t c = {.gate = &gate};

    (void)state;
    gate_init(&gate);
    assert_int_equal(hcclStreamCreate(&a), hcclSuccess);
    assert_int_equal(hcclStreamCreate(&b), hcclSuccess);
    assert_int_equal(hcclStreamCreate(&other), hcclSuccess);
    assert_int_equal(hcclEventCreate(&ev), hcclSuccess);
    assert_int_equal(hcclEventCreate(&done_b), hcclSuccess);

    assert_int_equal(hcclStreamEnqueue(a, gate_fn, &gate), hcclSuccess);
    assert_int_equal(hcclStreamEnqueue(a, produce_fn, &c), hcclSuccess);
    assert_int_equal(hcclEventRecord(ev, a), hcclSuccess);
    assert_int_equal(hcclStreamWaitEvent(b, ev), hcclSuccess);
    assert_int_equal(hcclStreamEnqueue(b, consume_fn, &c), hcclSuccess);
    assert_int_equal(hcclEventRecord(done_b, b), hcclSuccess);

    /* The wait keeps the point it captured: moving the event to an idle stream, then destroying
     * it, must not release B. */
    assert_int_equal(hcclEventRecord(ev, other), hcclSuccess);
    assert_int_equal(hcclEventSynchronize(ev), hcclSuccess);
    assert_int_equal(hcclEventDestroy(ev), hcclSuccess);
    assert_int_equal(hcclEventQuery(done_b), hcclInProgress);

    gate_open(&gate);
    assert_int_equal(hcclEventSynchronize(done_b), hcclSuccess);
    assert_int_equal(hcclEventQuery(done_b), hcclSuccess);
    assert_int_equal(c.gate_was_open, 1);
    assert_int_equal(c.seen, 42);

    assert_int_equal(hcclEventDestroy(done_b), hcclSuccess);
    assert_int_equal(hcclStreamDestroy(a), hcclSuccess);
    assert_int_equal(hcclStreamDestroy(b), hcclSuccess);
    assert_int_equal(hcclStreamDestroy(other), hcclSuccess);
    gate_fini(&gate);
}

/* ---- EventQuery / EventSynchronize / StreamSynchronize ---- */

typedef struct {
    hcclStream_t s;
    hcclResult_t res;
    int *counter;
    int counter_at_return; /* what synchronize let this thread see */
    gate_t *started;
} sync_arg_t;

static void *sync_thread(void *p)
{
    sync_arg_t *a = p;

    gate_open(a->started);
    a->res = hcclStreamSynchronize(a->s);
    a->counter_at_return = *a->counter;
    return NULL;
}

static void count_fn(void *arg)
{
    (*(int *)arg)++;
}

static void test_event_query_sync(void **state)
{
    hcclStream_t s;
    hcclEvent_t ev, never;
    gate_t gate, started;
    int counter = 0;
    sync_arg_t sa;
    pthread_t th;

    (void)state;
    gate_init(&gate);
    assert_int_equal(hcclStreamCreate(&s), hcclSuccess);
    assert_int_equal(hcclEventCreate(&ev), hcclSuccess);
    assert_int_equal(hcclEventCreate(&never), hcclSuccess);
    /* Never recorded: complete, as cudaEventQuery; waiting on it is a no-op. */
    assert_int_equal(hcclEventQuery(never), hcclSuccess);
    assert_int_equal(hcclEventSynchronize(never), hcclSuccess);
    assert_int_equal(hcclStreamWaitEvent(s, never), hcclSuccess);

    assert_int_equal(hcclStreamEnqueue(s, gate_fn, &gate), hcclSuccess);
    assert_int_equal(hcclStreamEnqueue(s, count_fn, &counter), hcclSuccess);
    assert_int_equal(hcclEventRecord(ev, s), hcclSuccess);
    gate_init(&started);
    sa = (sync_arg_t){s, hcclInternalError, &counter, -1, &started};
    assert_int_equal(pthread_create(&th, NULL, sync_thread, &sa), 0);
    assert_int_equal(hcclEventQuery(ev), hcclInProgress);
    gate_fn(&started); /* the synchronizing thread is on its way in before the gate opens */
    gate_open(&gate);
    assert_int_equal(hcclEventSynchronize(ev), hcclSuccess);
    assert_int_equal(counter, 1); /* the event's work is done when it is */
    assert_int_equal(hcclEventQuery(ev), hcclSuccess);
    pthread_join(th, NULL);
    assert_int_equal(sa.res, hcclSuccess);
    assert_int_equal(sa.counter_at_return, 1);
    gate_fini(&started);

    /* Re-recorded: the event refers to the new point, behind a new gate. */
    pthread_mutex_lock(&gate.mtx);
    gate.open = 0;
    pthread_mutex_unlock(&gate.mtx);
    assert_int_equal(hcclStreamEnqueue(s, gate_fn, &gate), hcclSuccess);
    assert_int_equal(hcclStreamEnqueue(s, count_fn, &counter), hcclSuccess);
    assert_int_equal(hcclEventRecord(ev, s), hcclSuccess);
    assert_int_equal(hcclEventQuery(ev), hcclInProgress);
    gate_open(&gate);
    assert_int_equal(hcclEventSynchronize(ev), hcclSuccess);
    assert_int_equal(counter, 2);

    assert_int_equal(hcclEventDestroy(ev), hcclSuccess);
    assert_int_equal(hcclEventDestroy(never), hcclSuccess);
    assert_int_equal(hcclStreamDestroy(s), hcclSuccess);
    gate_fini(&gate);
}

/* ---- destroy while busy ---- */

typedef struct {
    hcclStream_t s;
    int counter;
    hcclResult_t nested;
} busy_t;

static void requeue_fn(void *arg)
{
    busy_t *b = arg;

    /* Queued by the stream itself while it is being destroyed: still run. */
    b->nested = hcclStreamEnqueue(b->s, count_fn, &b->counter);
}

static void *destroy_thread(void *p)
{
    busy_t *b = p;

    return (void *)(intptr_t)hcclStreamDestroy(b->s);
}

static void test_destroy_drains(void **state)
{
    busy_t b = {0};
    hcclEvent_t never;
    gate_t gate;
    pthread_t th;
    void *ret;

    (void)state;
    gate_init(&gate);
    assert_int_equal(hcclStreamCreate(&b.s), hcclSuccess);
    assert_int_equal(hcclStreamEnqueue(b.s, gate_fn, &gate), hcclSuccess);
    for (int i = 0; i < 100; i++)
        assert_int_equal(hcclStreamEnqueue(b.s, count_fn, &b.counter), hcclSuccess);
    assert_int_equal(hcclStreamEnqueue(b.s, requeue_fn, &b), hcclSuccess);
    /* Destroy blocks on the closed gate, in another thread; the gate is open only once the
     * stream's worker is in it, so destroy really meets queued work. */
    pthread_mutex_lock(&gate.mtx);
    while (!gate.entered)
        pthread_cond_wait(&gate.cond, &gate.mtx);
    pthread_mutex_unlock(&gate.mtx);
    assert_int_equal(pthread_create(&th, NULL, destroy_thread, &b), 0);
    /* Destroy has begun once the handle is refused (a wait for a never-recorded event only
     * checks the stream); the gate is still closed then. */
    assert_int_equal(hcclEventCreate(&never), hcclSuccess);
    while (hcclStreamWaitEvent(b.s, never) == hcclSuccess)
        sched_yield();
    assert_int_equal(gate_is_open(&gate), 0);
    gate_open(&gate);
    pthread_join(th, &ret);
    assert_int_equal((int)(intptr_t)ret, hcclSuccess);
    assert_int_equal(b.nested, hcclSuccess);
    assert_int_equal(b.counter, 101);
    /* The handle is gone: refused, not read. */
    assert_int_equal(hcclStreamEnqueue(b.s, count_fn, &b.counter), hcclInvalidUsage);
    assert_non_null(strstr(hcclGetLastError(NULL), "not a live stream"));
    assert_int_equal(hcclStreamSynchronize(b.s), hcclInvalidUsage);
    assert_int_equal(hcclStreamDestroy(b.s), hcclInvalidUsage);
    assert_int_equal(hcclEventDestroy(never), hcclSuccess);
    gate_fini(&gate);
}

/* ---- bad input ---- */

typedef struct {
    hcclStream_t s;
    hcclEvent_t later;
    hcclResult_t sync, destroy, ev_sync;
} self_t;

static void self_fn(void *arg)
{
    self_t *t = arg;

    t->sync = hcclStreamSynchronize(t->s);
    t->destroy = hcclStreamDestroy(t->s);
    t->ev_sync = hcclEventSynchronize(t->later);
}

static void nop_fn(void *arg)
{
    (void)arg;
}

static void test_bad_input(void **state)
{
    hcclStream_t s, dead_s;
    hcclEvent_t ev, dead_e;
    gate_t gate;
    self_t t;

    (void)state;
    assert_int_equal(hcclStreamCreate(NULL), hcclInvalidArgument);
    assert_int_equal(hcclEventCreate(NULL), hcclInvalidArgument);
    assert_int_equal(hcclStreamDestroy(NULL), hcclInvalidArgument);
    assert_int_equal(hcclEventDestroy(NULL), hcclInvalidArgument);
    assert_int_equal(hcclStreamSynchronize(NULL), hcclInvalidArgument);
    assert_non_null(strstr(hcclGetLastError(NULL), "hcclStreamSynchronize: stream is NULL"));
    assert_int_equal(hcclStreamEnqueue(NULL, nop_fn, NULL), hcclInvalidArgument);
    assert_int_equal(hcclEventQuery(NULL), hcclInvalidArgument);
    assert_int_equal(hcclEventSynchronize(NULL), hcclInvalidArgument);

    assert_int_equal(hcclStreamCreate(&s), hcclSuccess);
    assert_int_equal(hcclEventCreate(&ev), hcclSuccess);
    assert_int_equal(hcclStreamEnqueue(s, NULL, NULL), hcclInvalidArgument);
    assert_non_null(strstr(hcclGetLastError(NULL), "fn is NULL"));
    assert_int_equal(hcclEventRecord(NULL, s), hcclInvalidArgument);
    assert_int_equal(hcclEventRecord(ev, NULL), hcclInvalidArgument);
    assert_int_equal(hcclStreamWaitEvent(NULL, ev), hcclInvalidArgument);
    assert_int_equal(hcclStreamWaitEvent(s, NULL), hcclInvalidArgument);
    /* A handle of the other kind is not taken for one. */
    assert_int_equal(hcclStreamSynchronize((hcclStream_t)(void *)ev), hcclInvalidUsage);
    assert_int_equal(hcclEventQuery((hcclEvent_t)(void *)s), hcclInvalidUsage);

    /* Destroyed handles. */
    assert_int_equal(hcclStreamCreate(&dead_s), hcclSuccess);
    assert_int_equal(hcclEventCreate(&dead_e), hcclSuccess);
    assert_int_equal(hcclStreamDestroy(dead_s), hcclSuccess);
    assert_int_equal(hcclEventDestroy(dead_e), hcclSuccess);
    assert_int_equal(hcclEventRecord(ev, dead_s), hcclInvalidUsage);
    assert_int_equal(hcclEventRecord(dead_e, s), hcclInvalidUsage);
    assert_non_null(strstr(hcclGetLastError(NULL), "not a live event"));
    assert_int_equal(hcclStreamWaitEvent(s, dead_e), hcclInvalidUsage);
    assert_int_equal(hcclEventSynchronize(dead_e), hcclInvalidUsage);
    assert_int_equal(hcclEventDestroy(dead_e), hcclInvalidUsage);

    /* Calls that would wait for the calling worker itself. */
    t = (self_t){.s = s};
    gate_init(&gate);
    assert_int_equal(hcclEventCreate(&t.later), hcclSuccess);
    assert_int_equal(hcclStreamEnqueue(s, gate_fn, &gate), hcclSuccess);
    assert_int_equal(hcclStreamEnqueue(s, self_fn, &t), hcclSuccess);
    assert_int_equal(hcclEventRecord(t.later, s), hcclSuccess); /* after self_fn, surely */
    gate_open(&gate);
    assert_int_equal(hcclStreamSynchronize(s), hcclSuccess);
    assert_int_equal(t.sync, hcclInvalidUsage);
    assert_int_equal(t.destroy, hcclInvalidUsage);
    assert_int_equal(t.ev_sync, hcclInvalidUsage);
    assert_int_equal(hcclEventQuery(t.later), hcclSuccess);

    assert_int_equal(hcclEventDestroy(t.later), hcclSuccess);
    assert_int_equal(hcclEventDestroy(ev), hcclSuccess);
    assert_int_equal(hcclStreamDestroy(s), hcclSuccess);
    gate_fini(&gate);
}

/* ---- allocation failures ---- */

/* A scenario touching every allocation of the module; fails cleanly at any of them. */
static hcclResult_t scenario(int *counter)
{
    hcclStream_t a = NULL, b = NULL;
    hcclEvent_t ev = NULL;
    hcclResult_t res;

    HCCL_CHECK_GOTO(hcclStreamCreate(&a), res, out);
    HCCL_CHECK_GOTO(hcclStreamCreate(&b), res, out);
    HCCL_CHECK_GOTO(hcclEventCreate(&ev), res, out);
    HCCL_CHECK_GOTO(hcclStreamEnqueue(a, count_fn, counter), res, out);
    HCCL_CHECK_GOTO(hcclEventRecord(ev, a), res, out);
    HCCL_CHECK_GOTO(hcclStreamWaitEvent(b, ev), res, out);
    HCCL_CHECK_GOTO(hcclStreamEnqueue(b, count_fn, counter), res, out);
    HCCL_CHECK_GOTO(hcclStreamSynchronize(b), res, out);
out:
    if (ev)
        hcclEventDestroy(ev);
    if (b)
        hcclStreamDestroy(b);
    if (a)
        hcclStreamDestroy(a);
    return res;
}

static void test_alloc_sweep(void **state)
{
    int failures = 0;

    (void)state;
    for (long k = 1;; k++) {
        int counter = 0;
        hcclResult_t res;
        hccl_alloc_fail_at(k);
        res = scenario(&counter);
        hccl_alloc_fail_at(0);
        if (res == hcclSuccess) {
            assert_int_equal(counter, 2);
            break;
        }
        assert_int_equal(res, hcclSystemError);
        failures++;
        assert_true(k < 1000);
    }
    assert_true(failures >= 6); /* two streams, an event, two items, a record's point and item */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fn_order),
        cmocka_unit_test(test_cross_stream_event),
        cmocka_unit_test(test_event_query_sync),
        cmocka_unit_test(test_destroy_drains),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_alloc_sweep),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
