/*
 * Requests completed by hand on a reactor: wait, test, wait-all, callbacks, errors on the
 * waiting thread, the completion fd, and a caller's event_base driving the reactor.
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
    atomic_int finished; /* set at the very end of the callback */
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

/* A callback that drops the handle's reference (as a stream's does): the completer still
 * holds its own until the request is done, and the last reference frees it (ASan sees a use
 * after free or a leak). */
static void cb_drop_handle(hcclRequest_t req, hcclResult_t result, void *arg)
{
    (void)result;
    hccl_request_release(req);
    atomic_fetch_add((atomic_int *)arg, 1);
}

static void test_request_callback_drops_handle(void **state)
{
    hccl_reactor_t *r = *state;
    atomic_int calls = 0;

    for (int i = 0; i < 64; i++) {
        hcclRequest_t req = new_request(r);
        assert_int_equal(hcclRequestSetCallback(req, cb_drop_handle, &calls), hcclSuccess);
        post_complete(r, req, i % 2 ? hcclSuccess : hcclRemoteError, "dropped in the callback");
    }
    reactor_barrier(r);
    assert_int_equal(atomic_load(&calls), 64);
}

typedef struct {
    hccl_reactor_t *r;
    atomic_bool returned;
} idle_wait_t;

static void *idle_waiter(void *arg)
{
    idle_wait_t *w = arg;

    hccl_reactor_wait_idle(w->r);
    atomic_store(&w->returned, true);
    return NULL;
}

static void uncount_on_reactor(void *arg)
{
    hccl_reactor_uncount(arg);
}

/* hccl_reactor_wait_idle returns once what was counted in is counted out, not before. */
static void test_reactor_wait_idle(void **state)
{
    hccl_reactor_t *r = *state;
    idle_wait_t w = {.r = r};
    pthread_t t;

    hccl_reactor_wait_idle(r); /* nothing counted: returns at once */
    assert_int_equal(hccl_reactor_pending(r), 0);
    hccl_reactor_count(r);
    hccl_reactor_count(r);
    assert_int_equal(hccl_reactor_pending(r), 2);
    assert_int_equal(pthread_create(&t, NULL, idle_waiter, &w), 0);
    run_on_reactor(r, uncount_on_reactor, r);
    assert_int_equal(hccl_reactor_pending(r), 1);
    assert_false(atomic_load(&w.returned)); /* one is still counted in */
    run_on_reactor(r, uncount_on_reactor, r);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(atomic_load(&w.returned));
    assert_int_equal(hccl_reactor_pending(r), 0);
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
        fail_msg(
            "external reactor: hccl_reactor_in_loop() after the loop returned: %s (want false); "
            "hcclWait from the thread that drove the loop before: %s (%s)",
            in_loop_after ? "true" : "false", hcclGetErrorString(wait_res), wait_err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_request_wait, req_setup, req_teardown),
        cmocka_unit_test_setup_teardown(test_request_test, req_setup, req_teardown),
        cmocka_unit_test(test_request_null),
        cmocka_unit_test_setup_teardown(test_request_error_on_waiting_thread, req_setup,
                                        req_teardown),
        cmocka_unit_test_setup_teardown(test_request_waitall, req_setup, req_teardown),
        cmocka_unit_test_setup_teardown(test_request_callback, req_setup, req_teardown),
        cmocka_unit_test_setup_teardown(test_request_callback_after_completion, req_setup,
                                        req_teardown),
        cmocka_unit_test_setup_teardown(test_request_wait_in_callback_refused, req_setup,
                                        req_teardown),
        cmocka_unit_test_setup_teardown(test_request_completion_fd, req_setup, req_teardown),
        cmocka_unit_test_setup_teardown(test_request_callback_drops_handle, req_setup,
                                        req_teardown),
        cmocka_unit_test_setup_teardown(test_reactor_wait_idle, req_setup, req_teardown),
        cmocka_unit_test(test_external_reactor_drive),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
