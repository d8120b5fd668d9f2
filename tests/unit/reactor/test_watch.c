/*
 * The reactor's watch (reactor_impl.h): a post that finds the polling flags left set by a
 * waiter leaves them set while the progress thread watches, so does a waiter that stops with
 * calls still in flight, and the progress thread still finishes what they started when their
 * caller never comes back to wait or test; a waiter that gives up clears them.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <cmocka.h>

#include "reactor/reactor_impl.h"

/* A link stand-in: its input is "arrived" (no doorbell: the flags were set); a look at it
 * takes the input and says so on a condition the test waits on. */
typedef struct {
    atomic_int arrived;
    atomic_int taken;
    pthread_t taken_on;
    pthread_mutex_t mtx;
    pthread_cond_t cond;
} fake_link_t;

static bool fake_poll(void *arg)
{
    fake_link_t *l = arg;

    if (!atomic_load(&l->arrived) || atomic_load(&l->taken))
        return false;
    pthread_mutex_lock(&l->mtx);
    l->taken_on = pthread_self();
    atomic_store(&l->taken, 1);
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->mtx);
    return true;
}

static bool done_at_once(void *arg)
{
    (void)arg;
    return true;
}

static void count_run(hccl_post_t *post)
{
    (void)post;
}

/* Waits up to 10 s for the link's input to be taken: an event, with a hard bound. */
static bool wait_taken(fake_link_t *l)
{
    struct timespec ts;
    bool taken;

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    pthread_mutex_lock(&l->mtx);
    while (!atomic_load(&l->taken))
        if (pthread_cond_timedwait(&l->cond, &l->mtx, &ts) != 0)
            break;
    taken = atomic_load(&l->taken);
    pthread_mutex_unlock(&l->mtx);
    return taken;
}

/* Waits, yielding, up to 10 s for the progress thread to arm its watch; returns holding the
 * reactor's work, so that the watch cannot fire (and end or take over) until it is let go. */
static bool enter_armed(hccl_reactor_t *r)
{
    struct timespec t0, t;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        hccl_reactor_enter(r);
        if (atomic_load(&r->watch_armed))
            return true;
        hccl_reactor_leave(r);
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 10)
            return false;
        sched_yield();
    }
}

/*
 * Starts a reactor polling l, and has its progress thread arm the watch: a waiter that
 * finished with nothing in flight leaves the flags set; the next post clears them (nobody
 * watches yet) and has the progress thread arm its watch. Returns holding the reactor's work
 * with the watch armed (enter_armed).
 */
static hccl_reactor_t *start_watched(fake_link_t *l, hccl_post_t *first)
{
    hccl_reactor_t *r = NULL;

    assert_int_equal(hccl_reactor_create(NULL, 0, &r), hcclSuccess);
    /* A watch of 4 x 20 ms: armed, it ends after a period without quiet posts, so a test
     * must see it armed within one; 4 x 50 us was missed once on a loaded machine (ASan). */
    hccl_reactor_set_spin(r, 20000000);
    hccl_reactor_set_cores_shared(r, false);
    hccl_reactor_set_drivable(r, true);
    assert_int_equal(hccl_reactor_add_poller(r, &(hccl_poller_t){fake_poll, NULL, l}),
                     hcclSuccess);
    assert_int_equal(hccl_reactor_start(r), hcclSuccess);
    assert_true(hccl_reactor_help_until(r, &(hccl_help_t){done_at_once, NULL, NULL}));
    assert_true(atomic_load(&r->orphan));
    hccl_reactor_post_and_start(r, first);
    assert_false(atomic_load(&r->orphan));
    assert_true(enter_armed(r));
    return r;
}

/* A call's request, counted in flight as its communicator counts it (hccl_comm_post): the
 * watch and a stopping waiter decide by that count. */
static struct hcclRequest *call_request(hccl_reactor_t *r)
{
    struct hcclRequest *req = NULL;

    assert_int_equal(hccl_request_create(r, 0, &req), hcclSuccess);
    hccl_reactor_count(r);
    return req;
}

/* The call ends as its communicator ends it (hccl_coll_finish). */
static void call_finish(hccl_reactor_t *r, struct hcclRequest *req)
{
    hccl_request_complete(req, hcclSuccess, NULL);
    hccl_reactor_uncount(r);
    hccl_request_release(req);
}

/*
 * The flags left set (no peer would ring) and the work let go: the call's input arrives while
 * its caller computes, and the progress thread takes it. Then the request ends, and r.
 */
static void finish_on_thread(hccl_reactor_t *r, fake_link_t *l, struct hcclRequest *req)
{
    assert_true(atomic_load(&r->orphan));
    assert_true(atomic_load(&r->polling));
    hccl_reactor_leave(r);
    atomic_store(&l->arrived, 1);
    assert_true(wait_taken(l));
    assert_false(pthread_equal(l->taken_on, pthread_self()));
    call_finish(r, req);
    hccl_reactor_destroy(r);
}

static void test_watch_takes_over(void **state)
{
    hccl_reactor_t *r;
    fake_link_t l = {.mtx = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    hccl_post_t first = {.fn = count_run}, second = {.fn = count_run};
    struct hcclRequest *req;

    (void)state;
    r = start_watched(&l, &first);

    /* Again, now watched (the work is ours, recursively, so the watch cannot fire meanwhile):
     * the post leaves the flags set, so a peer would not ring. */
    assert_true(hccl_reactor_help_until(r, &(hccl_help_t){done_at_once, NULL, NULL}));
    req = call_request(r); /* the call's request */
    hccl_reactor_post_and_start(r, &second);
    finish_on_thread(r, &l, req);
}

/*
 * Several calls in flight, the first waited for: the waiter stops with the others still in
 * flight and, the watch armed, leaves the flags set (their wait usually comes next); when it
 * does not come, the progress thread still takes the input that arrives for them.
 */
static void test_watch_after_wait_with_calls_in_flight(void **state)
{
    hccl_reactor_t *r;
    fake_link_t l = {.mtx = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    hccl_post_t first = {.fn = count_run};
    struct hcclRequest *req;

    (void)state;
    r = start_watched(&l, &first);
    req = call_request(r); /* still in flight */
    assert_true(hccl_reactor_help_until(r, &(hccl_help_t){done_at_once, NULL, NULL}));
    finish_on_thread(r, &l, req);
}

static bool never_done(void *arg)
{
    (void)arg;
    return false;
}

static void note_give_up(void *arg)
{
    atomic_store((atomic_int *)arg, 1);
}

/*
 * A waiter that gives up (nothing moved for its wait spin) is about to sleep: even with the
 * watch armed it clears the flags, so that peers ring and the progress thread it wakes drives
 * at once; left set, that thread took one quiet look and the call waited for the watch.
 */
static void test_watch_waiter_gives_up(void **state)
{
    hccl_reactor_t *r;
    fake_link_t l = {.mtx = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    hccl_post_t first = {.fn = count_run};
    struct hcclRequest *req;
    atomic_int gave_up = 0;

    (void)state;
    r = start_watched(&l, &first);
    req = call_request(r); /* the call waited for */
    assert_true(hccl_reactor_help_until(r, &(hccl_help_t){never_done, note_give_up, &gave_up}));
    assert_true(atomic_load(&gave_up));
    assert_true(atomic_load(&r->watch_armed));
    assert_false(atomic_load(&r->orphan));
    assert_false(atomic_load(&r->polling));
    hccl_reactor_leave(r);
    atomic_store(&l.arrived, 1);
    hccl_reactor_wake(r); /* as the waiter does before it sleeps (request.c) */
    assert_true(wait_taken(&l));
    assert_false(pthread_equal(l.taken_on, pthread_self()));
    call_finish(r, req);
    hccl_reactor_destroy(r);
}

/* With no Async calls, the watch is never armed: a waiter's calls cost the thread nothing. */
static void test_watch_idle_without_async(void **state)
{
    hccl_reactor_t *r = NULL;

    (void)state;
    assert_int_equal(hccl_reactor_create(NULL, 0, &r), hcclSuccess);
    hccl_reactor_set_spin(r, 50000);
    hccl_reactor_set_cores_shared(r, false);
    hccl_reactor_set_drivable(r, true);
    assert_int_equal(hccl_reactor_start(r), hcclSuccess);
    for (int i = 0; i < 100; i++)
        assert_true(hccl_reactor_help_until(r, &(hccl_help_t){done_at_once, NULL, NULL}));
    assert_false(atomic_load(&r->watch_wanted));
    assert_false(atomic_load(&r->watch_armed));
    hccl_reactor_destroy(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_watch_takes_over),
        cmocka_unit_test(test_watch_after_wait_with_calls_in_flight),
        cmocka_unit_test(test_watch_waiter_gives_up),
        cmocka_unit_test(test_watch_idle_without_async),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
