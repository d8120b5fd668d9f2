/*
 * The reactor and the request API.
 *
 * Reactor level: the multi-producer post queue (exactly once, on the reactor
 * thread, in each poster's order), timers (fire once, cancel, re-arm) and
 * requests completed by hand (wait, test, wait-all, callbacks, errors, the
 * completion fd). Public level, with real communicators in this process:
 * 1-rank and 2-rank AllReduce, argument checks, the completion fd, a caller's
 * event_base driving the communicator, and several threads on one
 * communicator.
 *
 * Every wait is on an event (condition variable, poll on a descriptor, the
 * request itself); the timeouts only bound a broken run.
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

#define WAIT_MS 30000     /* bound on any wait; never reached when things work */
#define CONNECT_MS 20000  /* connect timeout of the communicators made here */
#define ERRLEN 512

/* ---- helpers ---- */

static int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A counter guarded by a mutex, with a condition variable on CLOCK_MONOTONIC. */
typedef struct {
    pthread_mutex_t mtx;
    pthread_cond_t cond;
    int count;
} counter_t;

static void counter_init(counter_t *c)
{
    pthread_condattr_t attr;

    pthread_mutex_init(&c->mtx, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cond, &attr);
    pthread_condattr_destroy(&attr);
    c->count = 0;
}

static void counter_destroy(counter_t *c)
{
    pthread_mutex_destroy(&c->mtx);
    pthread_cond_destroy(&c->cond);
}

static void counter_add(counter_t *c, int n)
{
    pthread_mutex_lock(&c->mtx);
    c->count += n;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mtx);
}

/* Waits until the count reaches n; false if timeout_ms passes first. */
static bool counter_wait(counter_t *c, int n, int timeout_ms)
{
    struct timespec ts;
    bool ok = true;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->mtx);
    while (c->count < n && ok)
        ok = pthread_cond_timedwait(&c->cond, &c->mtx, &ts) != ETIMEDOUT || c->count >= n;
    ok = c->count >= n;
    pthread_mutex_unlock(&c->mtx);
    return ok;
}

/* Is fd readable right now? */
static bool fd_readable(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};

    return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

/* Reads the eventfd counter (0 if it is zero). */
static uint64_t fd_drain(int fd)
{
    uint64_t v = 0;

    if (read(fd, &v, sizeof(v)) != (ssize_t)sizeof(v))
        return 0;
    return v;
}

/*
 * Reads the counter until it has added up to want since *total was 0; false
 * if it stalls below (or goes past) want. The reactor bumps the counter just
 * after it marks a request done, so a waiter may return before the bump.
 */
static bool fd_collect(int fd, uint64_t *total, uint64_t want)
{
    while (*total < want) {
        if (!fd_readable(fd, WAIT_MS))
            return false;
        *total += fd_drain(fd);
    }
    return *total == want && !fd_readable(fd, 0);
}

/* Failures inside worker threads are recorded (first one wins) and asserted on the main thread. */
static void worker_fail(char *err, int line, const char *what)
{
    if (!err[0])
        snprintf(err, ERRLEN, "line %d: %s (last error: \"%s\")", line, what, hcclGetLastError(NULL));
}

#define TCHECK(err_x, cond_x)                                \
    do {                                                     \
        if (!(cond_x)) {                                     \
            worker_fail((err_x), __LINE__, #cond_x);         \
            goto out;                                        \
        }                                                    \
    } while (0)

/* Runs fn(arg) on the reactor and waits until it has returned. */
typedef struct {
    hccl_post_t post; /* first */
    hccl_reactor_t *r;
    void (*fn)(void *arg);
    void *arg;
    bool in_loop;
    counter_t done;
} call_item_t;

static void call_item_run(hccl_post_t *post)
{
    call_item_t *it = (call_item_t *)post;

    it->in_loop = hccl_reactor_in_loop(it->r);
    if (it->fn)
        it->fn(it->arg);
    counter_add(&it->done, 1);
}

static void run_on_reactor(hccl_reactor_t *r, void (*fn)(void *), void *arg)
{
    call_item_t it = {.post.fn = call_item_run, .r = r, .fn = fn, .arg = arg};
    bool ok;

    counter_init(&it.done);
    hccl_reactor_post(r, &it.post);
    ok = counter_wait(&it.done, 1, WAIT_MS);
    counter_destroy(&it.done);
    assert_true(ok);
    assert_true(it.in_loop);
}

/* Everything posted before this has run (the post queue keeps one poster's order). */
static void reactor_barrier(hccl_reactor_t *r)
{
    run_on_reactor(r, NULL, NULL);
}

static hccl_reactor_t *own_reactor(void)
{
    hccl_reactor_t *r = NULL;

    assert_int_equal(hccl_reactor_create(NULL, 0, &r), hcclSuccess);
    assert_non_null(r);
    assert_false(hccl_reactor_is_external(r));
    assert_int_equal(hccl_reactor_start(r), hcclSuccess);
    return r;
}

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
    pq_item_t *items;            /* [PQ_THREADS * PQ_ITEMS] */
    unsigned char *runs;         /* per item, reactor thread only */
    int next[PQ_THREADS];        /* next index expected per poster, reactor thread only */
    int total;                   /* reactor thread only */
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
    counter_t fires;   /* total fires; its mutex guards the fields below */
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
    hccl_timer_arm(c->a, 10);  /* re-arming replaces the deadline */
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
    int order;       /* when it ran, counting from 1 */
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
    int left;        /* posts still to chain after this one */
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

/* ---- 3. requests completed by hand ---- */

typedef struct {
    hccl_post_t post; /* first */
    struct hcclRequest *req;
    hcclResult_t res;
    char msg[256];
    bool has_msg;
} complete_item_t;

static void complete_item_run(hccl_post_t *post)
{
    complete_item_t *it = (complete_item_t *)post;

    hccl_request_complete(it->req, it->res, it->has_msg ? it->msg : NULL);
    free(it);
}

/* Completes req on the reactor with res (and msg, may be NULL). */
static void post_complete(hccl_reactor_t *r, hcclRequest_t req, hcclResult_t res, const char *msg)
{
    complete_item_t *it = calloc(1, sizeof(*it));

    assert_non_null(it);
    it->post.fn = complete_item_run;
    it->req = req;
    it->res = res;
    if (msg) {
        snprintf(it->msg, sizeof(it->msg), "%s", msg);
        it->has_msg = true;
    }
    hccl_reactor_post(r, &it->post);
}

static hcclRequest_t new_request(hccl_reactor_t *r)
{
    hcclRequest_t req = NULL;

    assert_int_equal(hccl_request_create(r, 0, &req), hcclSuccess);
    assert_non_null(req);
    return req;
}

static int req_setup(void **state)
{
    hccl_reactor_t *r = NULL;

    if (hccl_reactor_create(NULL, 0, &r) != hcclSuccess || hccl_reactor_start(r) != hcclSuccess) {
        hccl_reactor_destroy(r);
        return -1;
    }
    *state = r;
    return 0;
}

static int req_teardown(void **state)
{
    hccl_reactor_destroy(*state);
    return 0;
}

static void test_request_wait(void **state)
{
    hccl_reactor_t *r = *state;
    hcclRequest_t req = new_request(r);

    /* Completed from the reactor while this thread blocks. */
    post_complete(r, req, hcclSuccess, NULL);
    assert_int_equal(hcclWait(&req), hcclSuccess);
    assert_null(req);

    req = new_request(r);
    post_complete(r, req, hcclRemoteError, "peer 3 went away at step 7");
    assert_int_equal(hcclWait(&req), hcclRemoteError);
    assert_null(req);
    assert_non_null(strstr(hcclGetLastError(NULL), "peer 3 went away at step 7"));

    /* A failure without text still leaves a non-empty message. */
    req = new_request(r);
    post_complete(r, req, hcclTimeout, NULL);
    assert_int_equal(hcclWait(&req), hcclTimeout);
    assert_null(req);
    assert_true(hcclGetLastError(NULL)[0] != '\0');
}

static void test_request_test(void **state)
{
    hccl_reactor_t *r = *state;
    hcclRequest_t req = new_request(r), same = req;
    int done = -1;

    /* Unfinished: success, *done = 0, handle unchanged, as often as asked. */
    for (int i = 0; i < 3; i++) {
        done = -1;
        assert_int_equal(hcclTest(&req, &done), hcclSuccess);
        assert_int_equal(done, 0);
        assert_ptr_equal(req, same);
    }
    post_complete(r, req, hcclSuccess, NULL);
    reactor_barrier(r);
    done = -1;
    assert_int_equal(hcclTest(&req, &done), hcclSuccess);
    assert_int_equal(done, 1);
    assert_null(req);

    /* A failed one: the result and its text, on this thread. */
    req = new_request(r);
    same = req;
    assert_int_equal(hcclTest(&req, &done), hcclSuccess);
    assert_int_equal(done, 0);
    assert_ptr_equal(req, same);
    post_complete(r, req, hcclInternalError, "deadline of plan 12 passed");
    reactor_barrier(r);
    done = -1;
    assert_int_equal(hcclTest(&req, &done), hcclInternalError);
    assert_int_equal(done, 1);
    assert_null(req);
    assert_non_null(strstr(hcclGetLastError(NULL), "deadline of plan 12 passed"));

    /* Bad arguments. */
    assert_int_equal(hcclTest(NULL, &done), hcclInvalidArgument);
    req = new_request(r);
    assert_int_equal(hcclTest(&req, NULL), hcclInvalidArgument);
    assert_non_null(req);
    post_complete(r, req, hcclSuccess, NULL);
    assert_int_equal(hcclWait(&req), hcclSuccess);
}

static void test_request_null(void **state)
{
    hcclRequest_t req = NULL;
    hcclRequest_t reqs[3] = {NULL, NULL, NULL};
    int done = -1;

    (void)state;
    assert_int_equal(hcclWait(&req), hcclSuccess);
    assert_null(req);
    assert_int_equal(hcclTest(&req, &done), hcclSuccess);
    assert_int_equal(done, 1);
    assert_null(req);
    assert_int_equal(hcclWaitAll(3, reqs), hcclSuccess);
    assert_int_equal(hcclWaitAll(0, NULL), hcclSuccess);
    assert_int_equal(hcclWait(NULL), hcclInvalidArgument);
    assert_non_null(strstr(hcclGetLastError(NULL), "hcclWait"));
    assert_int_equal(hcclWaitAll(-1, reqs), hcclInvalidArgument);
    assert_int_equal(hcclWaitAll(2, NULL), hcclInvalidArgument);
    assert_int_equal(hcclRequestSetCallback(NULL, NULL, NULL), hcclInvalidArgument);
}

/* The failure text reaches the thread that waits, not the reactor's. */
typedef struct {
    hcclRequest_t req;
    hcclResult_t res;
    char before[ERRLEN];
    char after[ERRLEN];
} waiter_t;

static void *waiter_main(void *arg)
{
    waiter_t *w = arg;

    snprintf(w->before, sizeof(w->before), "%s", hcclGetLastError(NULL));
    w->res = hcclWait(&w->req);
    snprintf(w->after, sizeof(w->after), "%s", hcclGetLastError(NULL));
    return NULL;
}

static void test_request_error_on_waiting_thread(void **state)
{
    hccl_reactor_t *r = *state;
    waiter_t w = {.res = hcclNumResults};
    pthread_t th;

    w.req = new_request(r);
    assert_int_equal(pthread_create(&th, NULL, waiter_main, &w), 0);
    post_complete(r, w.req, hcclRemoteError, "rank 5 closed link tcp/2 mid-transfer");
    pthread_join(th, NULL);
    assert_int_equal(w.res, hcclRemoteError);
    assert_null(w.req);
    assert_string_equal(w.before, "");
    assert_non_null(strstr(w.after, "rank 5 closed link tcp/2 mid-transfer"));
}

static void test_request_waitall(void **state)
{
    hccl_reactor_t *r = *state;
    hcclRequest_t reqs[6];

    reqs[0] = NULL;
    reqs[1] = new_request(r);
    reqs[2] = new_request(r);
    reqs[3] = NULL;
    reqs[4] = new_request(r);
    reqs[5] = new_request(r);
    /* Completed out of order; the first error in array order wins. */
    post_complete(r, reqs[5], hcclSuccess, NULL);
    post_complete(r, reqs[4], hcclTimeout, "the second failure");
    post_complete(r, reqs[1], hcclSuccess, NULL);
    post_complete(r, reqs[2], hcclRemoteError, "the first failure");
    assert_int_equal(hcclWaitAll(6, reqs), hcclRemoteError);
    for (int i = 0; i < 6; i++)
        assert_null(reqs[i]);
    assert_non_null(strstr(hcclGetLastError(NULL), "the first failure"));

    /* All successful. */
    for (int i = 0; i < 6; i++)
        reqs[i] = i % 2 ? new_request(r) : NULL;
    for (int i = 1; i < 6; i += 2)
        post_complete(r, reqs[i], hcclSuccess, NULL);
    assert_int_equal(hcclWaitAll(6, reqs), hcclSuccess);
    for (int i = 0; i < 6; i++)
        assert_null(reqs[i]);
}

typedef struct {
    hccl_reactor_t *r;
    atomic_int calls;
    atomic_int finished;       /* set at the very end of the callback */
    hcclResult_t result;
    hcclRequest_t seen_req;
    bool in_loop;
    pthread_t thread;
    volatile unsigned spin;
} cb_ctx_t;

static void cb_record(hcclRequest_t req, hcclResult_t result, void *arg)
{
    cb_ctx_t *c = arg;

    atomic_fetch_add(&c->calls, 1);
    c->result = result;
    c->seen_req = req;
    c->in_loop = hccl_reactor_in_loop(c->r);
    c->thread = pthread_self();
    /* Some work, so that a waiter released too early would see finished == 0. */
    for (int i = 0; i < 200; i++) {
        c->spin++;
        sched_yield();
    }
    atomic_store(&c->finished, 1);
}

static void test_request_callback(void **state)
{
    hccl_reactor_t *r = *state;
    cb_ctx_t c = {.r = r, .result = hcclNumResults};
    hcclRequest_t req = new_request(r), same = req;

    assert_int_equal(hcclRequestSetCallback(req, cb_record, &c), hcclSuccess);
    assert_int_equal(atomic_load(&c.calls), 0);
    /* A second callback is refused. */
    assert_int_equal(hcclRequestSetCallback(req, cb_record, &c), hcclInvalidUsage);
    post_complete(r, req, hcclRemoteError, "callback path");
    assert_int_equal(hcclWait(&req), hcclRemoteError);
    /* The callback had returned before hcclWait did. */
    assert_int_equal(atomic_load(&c.finished), 1);
    assert_int_equal(atomic_load(&c.calls), 1);
    assert_int_equal(c.result, hcclRemoteError);
    assert_ptr_equal(c.seen_req, same);
    assert_true(c.in_loop);
    assert_false(pthread_equal(c.thread, pthread_self()));
    reactor_barrier(r);
    assert_int_equal(atomic_load(&c.calls), 1);

    /* Same through hcclTest: done is reported only after the callback returned. */
    memset(&c, 0, sizeof(c));
    c.r = r;
    req = new_request(r);
    assert_int_equal(hcclRequestSetCallback(req, cb_record, &c), hcclSuccess);
    post_complete(r, req, hcclSuccess, NULL);
    for (int done = 0; !done;) {
        assert_int_equal(hcclTest(&req, &done), hcclSuccess);
        if (done)
            assert_int_equal(atomic_load(&c.finished), 1);
        else
            sched_yield();
    }
    assert_int_equal(atomic_load(&c.calls), 1);
    assert_true(c.in_loop);
}

static void test_request_callback_after_completion(void **state)
{
    hccl_reactor_t *r = *state;
    cb_ctx_t c = {.r = r, .result = hcclNumResults};
    hcclRequest_t req = new_request(r), same = req;

    post_complete(r, req, hcclTimeout, "already done");
    reactor_barrier(r);
    /* Runs at once, on this thread. */
    assert_int_equal(hcclRequestSetCallback(req, cb_record, &c), hcclSuccess);
    assert_int_equal(atomic_load(&c.calls), 1);
    assert_int_equal(atomic_load(&c.finished), 1);
    assert_int_equal(c.result, hcclTimeout);
    assert_ptr_equal(c.seen_req, same);
    assert_true(pthread_equal(c.thread, pthread_self()));
    assert_false(c.in_loop);
    assert_ptr_equal(req, same);
    assert_int_equal(hcclWait(&req), hcclTimeout);
    assert_null(req);
    assert_int_equal(atomic_load(&c.calls), 1);
}

/* Calling hcclWait from a callback (the reactor thread) on an unfinished request is refused. */
typedef struct {
    hcclRequest_t other;
    hcclResult_t res;
} cb_wait_ctx_t;

static void cb_wait_other(hcclRequest_t req, hcclResult_t result, void *arg)
{
    cb_wait_ctx_t *c = arg;

    (void)req, (void)result;
    c->res = hcclWait(&c->other);
}

static void test_request_wait_in_callback_refused(void **state)
{
    hccl_reactor_t *r = *state;
    cb_wait_ctx_t c = {.res = hcclNumResults};
    hcclRequest_t req = new_request(r);

    c.other = new_request(r);
    assert_int_equal(hcclRequestSetCallback(req, cb_wait_other, &c), hcclSuccess);
    post_complete(r, req, hcclSuccess, NULL);
    assert_int_equal(hcclWait(&req), hcclSuccess);
    assert_int_equal(c.res, hcclInvalidUsage);
    assert_non_null(c.other);
    post_complete(r, c.other, hcclSuccess, NULL);
    assert_int_equal(hcclWait(&c.other), hcclSuccess);
}

static void test_request_completion_fd(void **state)
{
    hccl_reactor_t *r = *state;
    int fd = hccl_reactor_completion_fd(r);
    enum { K = 5 };
    hcclRequest_t reqs[K];
    uint64_t v = 0;

    assert_true(fd >= 0);
    assert_false(fd_readable(fd, 0));
    for (int i = 0; i < K; i++)
        reqs[i] = new_request(r);
    for (int i = 0; i < K; i++)
        post_complete(r, reqs[i], i == 2 ? hcclRemoteError : hcclSuccess, NULL);
    /* Every completion, including its fd write, has run before the barrier item. */
    reactor_barrier(r);
    assert_true(fd_readable(fd, 0));
    assert_true(fd_readable(fd, 0)); /* stays readable until read */
    assert_int_equal(read(fd, &v, sizeof(v)), (ssize_t)sizeof(v));
    assert_int_equal(v, K);
    assert_false(fd_readable(fd, 0));
    assert_int_equal(hcclWaitAll(K, reqs), hcclRemoteError);
    /* Waiting does not touch the counter. */
    assert_false(fd_readable(fd, 0));

    /* One more, observed through poll rather than a barrier. */
    reqs[0] = new_request(r);
    post_complete(r, reqs[0], hcclSuccess, NULL);
    assert_true(fd_readable(fd, WAIT_MS));
    assert_int_equal(fd_drain(fd), 1);
    assert_false(fd_readable(fd, 0));
    assert_int_equal(hcclWait(&reqs[0]), hcclSuccess);
}

/* A caller-driven reactor: posts and completions run inside hccl_reactor_drive on this thread. */
typedef struct {
    hccl_reactor_t *r;
    int runs;
    bool in_loop;
} ext_item_ctx_t;

typedef struct {
    hccl_post_t post; /* first */
    ext_item_ctx_t *c;
} ext_item_t;

static void ext_item_run(hccl_post_t *post)
{
    ext_item_t *it = (ext_item_t *)post;

    it->c->runs++;
    it->c->in_loop = hccl_reactor_in_loop(it->c->r);
}

static void test_external_reactor_drive(void **state)
{
    struct event_base *base = event_base_new();
    ext_item_ctx_t c = {0};
    ext_item_t items[3];
    hcclRequest_t req;
    int64_t deadline;
    bool in_loop_after;
    hcclResult_t wait_res;
    char wait_err[ERRLEN];

    (void)state;
    assert_non_null(base);
    assert_int_equal(hccl_reactor_create(base, 0, &c.r), hcclSuccess);
    assert_true(hccl_reactor_is_external(c.r));
    assert_ptr_equal(hccl_reactor_base(c.r), base);
    assert_int_equal(hccl_reactor_start(c.r), hcclSuccess); /* no thread for a borrowed base */
    for (int i = 0; i < 3; i++) {
        items[i] = (ext_item_t){.post.fn = ext_item_run, .c = &c};
        hccl_reactor_post(c.r, &items[i].post);
    }
    assert_int_equal(c.runs, 0); /* nothing runs until someone drives */
    deadline = mono_ms() + WAIT_MS;
    while (c.runs < 3 && mono_ms() < deadline)
        assert_true(hccl_reactor_drive(c.r, 100));
    assert_int_equal(c.runs, 3);
    assert_true(c.in_loop);
    /* Back outside the loop, this thread is not the reactor thread any more. */
    in_loop_after = hccl_reactor_in_loop(c.r);

    /*
     * A request completed by a post, waited for by the thread that drove the
     * loop above: hcclWait must drive the loop itself.
     */
    req = new_request(c.r);
    post_complete(c.r, req, hcclSuccess, NULL);
    wait_res = hcclWait(&req);
    snprintf(wait_err, sizeof(wait_err), "%s", hcclGetLastError(NULL));
    /* If it refused, finish the request by driving, so that nothing leaks. */
    deadline = mono_ms() + WAIT_MS;
    for (int done = 0; req && !done && mono_ms() < deadline;) {
        hccl_reactor_drive(c.r, 100);
        if (hcclTest(&req, &done) != hcclSuccess)
            break;
    }
    assert_null(req);

    hccl_reactor_destroy(c.r);
    event_base_free(base);
    if (in_loop_after || wait_res != hcclSuccess)
        fail_msg("external reactor: hccl_reactor_in_loop() after the loop returned: %s (want false); "
                 "hcclWait from the thread that drove the loop before: %s (%s)",
                 in_loop_after ? "true" : "false", hcclGetErrorString(wait_res), wait_err);
}

/* ---- 4. communicators in this process ---- */

static const size_t dt_size[hcclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};

static uint32_t mix(uint32_t h)
{
    h ^= h >> 16;
    h *= 0x7feb352dU;
    h ^= h >> 15;
    h *= 0x846ca68bU;
    h ^= h >> 16;
    return h;
}

/* Finite values of every type (no NaN, infinity or subnormal). */
static void fill(void *buf, hcclDataType_t dt, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t h = mix((uint32_t)i * 2654435761U ^ seed), g = mix(h + 1);
        switch (dt) {
        case hcclInt8: ((int8_t *)buf)[i] = (int8_t)h; break;
        case hcclUint8: ((uint8_t *)buf)[i] = (uint8_t)h; break;
        case hcclInt32: ((int32_t *)buf)[i] = (int32_t)h; break;
        case hcclUint32: ((uint32_t *)buf)[i] = h; break;
        case hcclInt64: ((int64_t *)buf)[i] = (int64_t)((uint64_t)h << 32 | g); break;
        case hcclUint64: ((uint64_t *)buf)[i] = (uint64_t)g << 32 | h; break;
        case hcclFloat16:
            ((uint16_t *)buf)[i] = (uint16_t)((h & 0x8000u) | (1u + h % 29u) << 10 | (g & 0x3ffu));
            break;
        case hcclBfloat16:
            ((uint16_t *)buf)[i] = (uint16_t)((h & 0x8000u) | (1u + h % 250u) << 7 | (g & 0x7fu));
            break;
        case hcclFloat32: ((float *)buf)[i] = (float)((int)(h % 20001u) - 10000) / 16.0f; break;
        case hcclFloat64: ((double *)buf)[i] = (double)((int64_t)(h % 2000001u) - 1000000) / 64.0; break;
        default: break;
        }
    }
}

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
            assert_int_equal(hcclAllReduce(inplace, inplace, N, (hcclDataType_t)dt, (hcclRedOp_t)op,
                                           comm), hcclSuccess);
            if (memcmp(in, inplace, bytes) != 0)
                fail_msg("dtype %d op %d: in place result differs from the input", dt, op);
        }

    /* Every one of the 2 * hcclNumTypes * hcclNumOps completions is counted once. */
    assert_true(fd_collect(fd, &completions, 2 * hcclNumTypes * hcclNumOps));

    /* count 0 with NULL buffers completes its request. */
    assert_int_equal(hcclAllReduceAsync(NULL, NULL, 0, hcclFloat32, hcclSum, comm, &req), hcclSuccess);
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
    expect_invalid(hcclAllReduceAsync(buf, out, 64, hcclInt32, hcclSum, NULL, &req), "comm is NULL");
    expect_invalid(hcclAllReduce(buf, out, 64, hcclInt32, hcclSum, NULL), "comm is NULL");
    expect_invalid(hcclAllReduceAsync(buf, out, 64, hcclInt32, hcclSum, comm, NULL), "req is NULL");
    expect_invalid(hcclAllReduceAsync(buf, out, 64, hcclNumTypes, hcclSum, comm, &req), "datatype");
    expect_invalid(hcclAllReduceAsync(buf, out, 64, (hcclDataType_t)-1, hcclSum, comm, &req), "datatype");
    expect_invalid(hcclAllReduceAsync(buf, out, 64, hcclInt32, hcclNumOps, comm, &req), "op");
    expect_invalid(hcclAllReduceAsync(buf, out, 64, hcclInt32, hcclNumOps, comm, &req), "hcclRedOp_t");
    expect_invalid(hcclAllReduceAsync(NULL, out, 64, hcclInt32, hcclSum, comm, &req), "sendbuf is NULL");
    expect_invalid(hcclAllReduceAsync(buf, NULL, 64, hcclInt32, hcclSum, comm, &req), "recvbuf is NULL");
    expect_invalid(hcclAllReduceAsync(buf, buf + 1, 32, hcclInt32, hcclSum, comm, &req), "overlap");
    expect_invalid(hcclAllReduceAsync(buf + 8, buf, 32, hcclInt32, hcclSum, comm, &req), "overlap");
    expect_invalid(hcclAllReduceAsync(buf, out, SIZE_MAX / 2, hcclInt32, hcclSum, comm, &req), "overflow");
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
    bool external;           /* each rank drives its own event_base */
    counter_t gate;          /* rank 0 saw its request unfinished */
    int r0_first_done;       /* rank 0's hcclTest *done before rank 1 posted */
    struct {
        char err[ERRLEN];
        int phases;          /* external: phases that completed correctly */
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
        TCHECK(err, hcclAllReduceAsync(in, out, DUO_N, hcclInt32, hcclSum, comm, &req) == hcclSuccess);
        hcclRequest_t same = req;
        /* Rank 1 has not posted: this cannot be finished. */
        TCHECK(err, hcclTest(&req, &done) == hcclSuccess);
        d->r0_first_done = done;
        TCHECK(err, req == same);
        counter_add(&d->gate, 1);
        gated = true;
    } else {
        TCHECK(err, counter_wait(&d->gate, 1, WAIT_MS));
        TCHECK(err, hcclAllReduceAsync(in, out, DUO_N, hcclInt32, hcclSum, comm, &req) == hcclSuccess);
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
        worker_fail(err, __LINE__, "hcclWait(&req) == hcclSuccess on an external-loop communicator");
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
            snprintf(msg, sizeof(msg), "%d-rank external event_base, rank %d (%d of 4 phases passed): %s",
                     nranks, r, d->rank[r].phases, d->rank[r].err);
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
        cmocka_unit_test(test_post_queue_many_threads),
        cmocka_unit_test(test_post_and_start),
        cmocka_unit_test(test_timers),
        cmocka_unit_test_setup_teardown(test_request_wait, req_setup, req_teardown),
        cmocka_unit_test_setup_teardown(test_request_test, req_setup, req_teardown),
        cmocka_unit_test(test_request_null),
        cmocka_unit_test_setup_teardown(test_request_error_on_waiting_thread, req_setup, req_teardown),
        cmocka_unit_test_setup_teardown(test_request_waitall, req_setup, req_teardown),
        cmocka_unit_test_setup_teardown(test_request_callback, req_setup, req_teardown),
        cmocka_unit_test_setup_teardown(test_request_callback_after_completion, req_setup, req_teardown),
        cmocka_unit_test_setup_teardown(test_request_wait_in_callback_refused, req_setup, req_teardown),
        cmocka_unit_test_setup_teardown(test_request_completion_fd, req_setup, req_teardown),
        cmocka_unit_test(test_external_reactor_drive),
        cmocka_unit_test(test_comm_one_rank_allreduce),
        cmocka_unit_test(test_help_runs_posts_first),
        cmocka_unit_test(test_comm_bad_arguments),
        cmocka_unit_test(test_comm_two_ranks_threads),
        cmocka_unit_test(test_external_base_one_rank),
        cmocka_unit_test(test_external_base_two_ranks),
        cmocka_unit_test(test_comm_threads_one_comm),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
