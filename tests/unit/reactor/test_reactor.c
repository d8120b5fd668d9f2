/*
 * The reactor: the multi-producer post queue (exactly once, on the reactor thread, in each
 * poster's order), starting posts on the poster's thread, waiters that drive the reactor,
 * and timers (fire once, cancel, re-arm). Requests are in test_requests.c, communicators
 * in test_reactor_comm.c.
 *
 * Every wait is on an event (condition variable, poll on a descriptor, the request itself);
 * the timeouts only bound a broken run.
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

/* ---- 1. the post queue ---- */

enum { PQ_THREADS = 4, PQ_ITEMS = 20000 };

typedef struct pq_ctx pq_ctx_t;

typedef struct {
    hccl_post_t post; /* first */
    pq_ctx_t *ctx;
    int thread;
    int idx;
} pq_item_t;

struct pq_ctx {
    hccl_reactor_t *r;
    pthread_barrier_t start;
    pq_item_t *items;     /* [PQ_THREADS * PQ_ITEMS] */
    unsigned char *runs;  /* per item, reactor thread only */
    int next[PQ_THREADS]; /* next index expected per poster, reactor thread only */
    int total;            /* reactor thread only */
    int off_loop;
    int out_of_order;
    bool poster_in_loop[PQ_THREADS];
    counter_t done;
};

typedef struct {
    pq_ctx_t *ctx;
    int thread;
} pq_poster_t;

static void pq_run(hccl_post_t *post)
{
    pq_item_t *it = (pq_item_t *)post;
    pq_ctx_t *c = it->ctx;

    if (!hccl_reactor_in_loop(c->r))
        c->off_loop++;
    if (it->idx != c->next[it->thread])
        c->out_of_order++;
    c->next[it->thread] = it->idx + 1;
    c->runs[(size_t)it->thread * PQ_ITEMS + (size_t)it->idx]++;
    if (++c->total == PQ_THREADS * PQ_ITEMS)
        counter_add(&c->done, 1);
}

static void *pq_poster_main(void *arg)
{
    pq_poster_t *p = arg;
    pq_ctx_t *c = p->ctx;

    pthread_barrier_wait(&c->start);
    p->ctx->poster_in_loop[p->thread] = hccl_reactor_in_loop(c->r);
    for (int i = 0; i < PQ_ITEMS; i++)
        hccl_reactor_post(c->r, &c->items[(size_t)p->thread * PQ_ITEMS + (size_t)i].post);
    return NULL;
}

static void test_post_queue_many_threads(void **state)
{
    pq_ctx_t *c = calloc(1, sizeof(*c));
    pthread_t th[PQ_THREADS];
    pq_poster_t posters[PQ_THREADS];
    bool ok;

    (void)state;
    assert_non_null(c);
    c->items = calloc((size_t)PQ_THREADS * PQ_ITEMS, sizeof(*c->items));
    c->runs = calloc((size_t)PQ_THREADS * PQ_ITEMS, 1);
    assert_non_null(c->items);
    assert_non_null(c->runs);
    for (int t = 0; t < PQ_THREADS; t++)
        for (int i = 0; i < PQ_ITEMS; i++) {
            pq_item_t *it = &c->items[(size_t)t * PQ_ITEMS + (size_t)i];
            it->post.fn = pq_run;
            it->ctx = c;
            it->thread = t;
            it->idx = i;
        }
    counter_init(&c->done);
    pthread_barrier_init(&c->start, NULL, PQ_THREADS);
    c->r = own_reactor();
    assert_false(hccl_reactor_in_loop(c->r));
    for (int t = 0; t < PQ_THREADS; t++) {
        posters[t] = (pq_poster_t){c, t};
        assert_int_equal(pthread_create(&th[t], NULL, pq_poster_main, &posters[t]), 0);
    }
    for (int t = 0; t < PQ_THREADS; t++)
        pthread_join(th[t], NULL);
    ok = counter_wait(&c->done, 1, WAIT_MS);
    /* The reactor is idle now; destroying it joins its thread, and nothing may run again. */
    hccl_reactor_destroy(c->r);
    assert_true(ok);
    assert_int_equal(c->total, PQ_THREADS * PQ_ITEMS);
    assert_int_equal(c->off_loop, 0);
    assert_int_equal(c->out_of_order, 0);
    for (int t = 0; t < PQ_THREADS; t++) {
        assert_false(c->poster_in_loop[t]);
        assert_int_equal(c->next[t], PQ_ITEMS);
    }
    for (size_t i = 0; i < (size_t)PQ_THREADS * PQ_ITEMS; i++)
        if (c->runs[i] != 1)
            fail_msg("item %zu of thread %zu ran %d times", i % PQ_ITEMS, i / PQ_ITEMS, c->runs[i]);
    pthread_barrier_destroy(&c->start);
    counter_destroy(&c->done);
    free(c->runs);
    free(c->items);
    free(c);
}

/* ---- 2. timers ---- */

typedef struct {
    hccl_reactor_t *r;
    hccl_timer_t *a;
    hccl_timer_t *b;
    counter_t fires; /* total fires; its mutex guards the fields below */
    int fired_a;
    int fired_b;
    char order[16];
    int off_loop;
} tm_ctx_t;

static void tm_fire(tm_ctx_t *c, char which)
{
    bool in_loop = hccl_reactor_in_loop(c->r);

    pthread_mutex_lock(&c->fires.mtx);
    if (which == 'a')
        c->fired_a++;
    else
        c->fired_b++;
    if (c->fires.count < (int)sizeof(c->order) - 1)
        c->order[c->fires.count] = which;
    if (!in_loop)
        c->off_loop++;
    c->fires.count++;
    pthread_cond_broadcast(&c->fires.cond);
    pthread_mutex_unlock(&c->fires.mtx);
}

static void tm_on_a(void *arg)
{
    tm_fire(arg, 'a');
}

static void tm_on_b(void *arg)
{
    tm_fire(arg, 'b');
}

/* Steps, each run on the reactor thread (the timer API is reactor-thread only). */
static void tm_create(void *arg)
{
    tm_ctx_t *c = arg;

    if (hccl_timer_create(c->r, tm_on_a, c, &c->a) != hcclSuccess)
        c->a = NULL;
    if (hccl_timer_create(c->r, tm_on_b, c, &c->b) != hcclSuccess)
        c->b = NULL;
}

static void tm_arm_a_20(void *arg)
{
    hccl_timer_arm(((tm_ctx_t *)arg)->a, 20);
}

static void tm_arm_b_50(void *arg)
{
    hccl_timer_arm(((tm_ctx_t *)arg)->b, 50);
}

static void tm_arm_cancel_a_then_b(void *arg)
{
    tm_ctx_t *c = arg;

    hccl_timer_arm(c->a, 20);
    hccl_timer_cancel(c->a);
    hccl_timer_arm(c->b, 100); /* later than a's deadline: when b fires, a would have */
}

static void tm_rearm_sooner(void *arg)
{
    tm_ctx_t *c = arg;

    hccl_timer_arm(c->a, 5000);
    hccl_timer_arm(c->a, 10); /* re-arming replaces the deadline */
    hccl_timer_arm(c->b, 300);
}

static void tm_arm_a_0(void *arg)
{
    hccl_timer_arm(((tm_ctx_t *)arg)->a, 0);
}

static void tm_destroy(void *arg)
{
    tm_ctx_t *c = arg;

    hccl_timer_cancel(c->a); /* not pending: a no-op */
    hccl_timer_cancel(NULL);
    hccl_timer_destroy(c->a);
    hccl_timer_destroy(c->b);
    hccl_timer_destroy(NULL);
    c->a = c->b = NULL;
}

/* hccl_reactor_post_and_start: inline on the caller when nobody runs the reactor, else queued. */
typedef struct {
    hccl_post_t post;
    hccl_reactor_t *r;
    pthread_t ran_on;
    bool in_loop;
    int order; /* when it ran, counting from 1 */
    int *clock;
    hccl_post_t *nested; /* posted (and started) from inside this one */
} ps_item_t;

static void ps_run(hccl_post_t *post)
{
    ps_item_t *it = (ps_item_t *)post;

    it->ran_on = pthread_self();
    it->in_loop = hccl_reactor_in_loop(it->r);
    it->order = ++*it->clock;
    if (it->nested)
        hccl_reactor_post_and_start(it->r, it->nested);
}

static void test_post_and_start(void **state)
{
    hccl_reactor_t *r = NULL;
    int clock = 0;
    ps_item_t a = {.post.fn = ps_run, .clock = &clock}, b = a, c = a;

    (void)state;
    /* No progress thread: whatever is not run inline stays queued until the reactor is driven. */
    assert_int_equal(hccl_reactor_create(NULL, 0, &r), hcclSuccess);
    a.r = b.r = c.r = r;
    hccl_reactor_set_spin(r, 50000);
    hccl_reactor_set_cores_shared(r, false);

    /* Not drivable (a link that cannot be polled): queued. */
    hccl_reactor_set_drivable(r, false);
    hccl_reactor_post_and_start(r, &a.post);
    assert_int_equal(a.order, 0);
    assert_true(hccl_reactor_drive(r, 0));
    assert_int_equal(a.order, 1);

    /* Drivable and idle: run at once on this thread, inside the reactor's work; one started
     * from inside it is not run within it but queued (and the reactor woken for it). */
    hccl_reactor_set_drivable(r, true);
    b.nested = &c.post;
    hccl_reactor_post_and_start(r, &b.post);
    assert_int_equal(b.order, 2);
    assert_true(pthread_equal(b.ran_on, pthread_self()));
    assert_true(b.in_loop);
    assert_false(hccl_reactor_in_loop(r));
    assert_int_equal(c.order, 0);
    assert_true(hccl_reactor_drive(r, 0));
    assert_int_equal(c.order, 3);
    assert_true(c.in_loop);
    hccl_reactor_destroy(r);
}

/* hccl_reactor_help_until: a chain of posts that completes the wait (a completion posts the
 * run's end, which posts the request's) is run to its end before the pollers are looked at,
 * so the call returns without a look at the links (a socket look is a system call). */
typedef struct {
    hccl_post_t post;
    hccl_reactor_t *r;
    int left; /* posts still to chain after this one */
    int *done;
} chain_item_t;

static void chain_run(hccl_post_t *post)
{
    chain_item_t *it = (chain_item_t *)post;

    if (it->left == 0) {
        *it->done = 1;
        return;
    }
    it->left--;
    hccl_reactor_post(it->r, &it->post);
}

static bool poll_count(void *arg)
{
    ++*(int *)arg;
    return false;
}

static bool chain_done(void *arg)
{
    return *(int *)arg != 0;
}

static void test_help_runs_posts_first(void **state)
{
    hccl_reactor_t *r = NULL;
    int polls = 0, done = 0;
    chain_item_t it = {.post.fn = chain_run, .left = 3, .done = &done};

    (void)state;
    assert_int_equal(hccl_reactor_create(NULL, 0, &r), hcclSuccess);
    it.r = r;
    hccl_reactor_set_spin(r, 50000);
    hccl_reactor_set_cores_shared(r, false);
    hccl_reactor_set_drivable(r, true);
    assert_int_equal(hccl_reactor_add_poller(r, &(hccl_poller_t){poll_count, NULL, &polls}),
                     hcclSuccess);
    hccl_reactor_post(r, &it.post);
    assert_true(hccl_reactor_help_until(r, &(hccl_help_t){chain_done, NULL, &done}));
    assert_int_equal(done, 1);
    assert_int_equal(it.left, 0);
    assert_int_equal(polls, 0);
    /* With nothing posted, the pollers are what it looks at. */
    done = 0;
    it.left = 0;
    assert_true(hccl_reactor_help_until(r, &(hccl_help_t){chain_done, NULL, &done}));
    assert_int_equal(done, 0); /* it gave up after the spin bound */
    assert_true(polls > 0);
    hccl_reactor_destroy(r);
}

static void test_timers(void **state)
{
    tm_ctx_t c;

    (void)state;
    memset(&c, 0, sizeof(c));
    counter_init(&c.fires);
    c.r = own_reactor();
    run_on_reactor(c.r, tm_create, &c);
    assert_non_null(c.a);
    assert_non_null(c.b);

    /* Arm, fire once: the later timer b proves that a did not fire again. */
    run_on_reactor(c.r, tm_arm_a_20, &c);
    assert_true(counter_wait(&c.fires, 1, WAIT_MS));
    run_on_reactor(c.r, tm_arm_b_50, &c);
    assert_true(counter_wait(&c.fires, 2, WAIT_MS));
    pthread_mutex_lock(&c.fires.mtx);
    assert_int_equal(c.fired_a, 1);
    assert_int_equal(c.fired_b, 1);
    assert_string_equal(c.order, "ab");
    pthread_mutex_unlock(&c.fires.mtx);

    /* Cancel before firing: b's deadline is after a's, so when b fires a would have. */
    run_on_reactor(c.r, tm_arm_cancel_a_then_b, &c);
    assert_true(counter_wait(&c.fires, 3, WAIT_MS));
    pthread_mutex_lock(&c.fires.mtx);
    assert_int_equal(c.fired_a, 1);
    assert_int_equal(c.fired_b, 2);
    assert_string_equal(c.order, "abb");
    pthread_mutex_unlock(&c.fires.mtx);

    /* Re-arm a pending timer sooner: it fires once, before b (300 ms) and not at 5 s. */
    run_on_reactor(c.r, tm_rearm_sooner, &c);
    assert_true(counter_wait(&c.fires, 5, WAIT_MS));
    pthread_mutex_lock(&c.fires.mtx);
    assert_string_equal(c.order, "abbab");
    assert_int_equal(c.fired_a, 2);
    pthread_mutex_unlock(&c.fires.mtx);

    /* Re-arm after firing, with a zero delay. */
    run_on_reactor(c.r, tm_arm_a_0, &c);
    assert_true(counter_wait(&c.fires, 6, WAIT_MS));
    run_on_reactor(c.r, tm_arm_b_50, &c);
    assert_true(counter_wait(&c.fires, 7, WAIT_MS));
    pthread_mutex_lock(&c.fires.mtx);
    assert_string_equal(c.order, "abbabab");
    assert_int_equal(c.fired_a, 3);
    assert_int_equal(c.fired_b, 4);
    assert_int_equal(c.off_loop, 0);
    pthread_mutex_unlock(&c.fires.mtx);

    run_on_reactor(c.r, tm_destroy, &c);
    hccl_reactor_destroy(c.r);
    counter_destroy(&c.fires);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_post_queue_many_threads),
        cmocka_unit_test(test_post_and_start),
        cmocka_unit_test(test_timers),
        cmocka_unit_test(test_help_runs_posts_first),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
