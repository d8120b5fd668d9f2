/*
 * Requests' memory comes back: a finished request stays in its releasing thread's quarantine
 * for HCCL_QUARANTINE_SLOTS releases (so that a stale copy of its handle is recognised), then
 * serves a later request instead of going back to malloc. Each case runs on a thread of its
 * own, whose quarantine starts empty and is freed when it exits (LeakSanitizer checks that).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "base/quarantine.h"
#include "reactor/reactor.h"

#define ROUNDS (2 * HCCL_QUARANTINE_SLOTS + 40)

static void run_on_thread(void *(*fn)(void *), void *arg)
{
    pthread_t t;

    assert_int_equal(pthread_create(&t, NULL, fn, arg), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
}

typedef struct {
    hccl_reactor_t *r;
    struct hcclRequest *seen[ROUNDS];
    hcclResult_t stale_res;
    char stale_msg[256]; /* the last error is per thread: taken on the one that saw it */
} rounds_t;

/* Each round: a request made, completed as the reactor would, and waited for. */
static void *request_rounds(void *arg)
{
    rounds_t *t = arg;
    hcclRequest_t stale = NULL;

    for (int i = 0; i < ROUNDS; i++) {
        hcclRequest_t req = NULL;
        if (hccl_request_create(t->r, 64, &req) != hcclSuccess)
            return NULL;
        t->seen[i] = req;
        hccl_request_complete(req, hcclSuccess, NULL);
        if (i == ROUNDS - HCCL_QUARANTINE_SLOTS / 2)
            stale = req; /* a copy of the handle, kept after its wait */
        if (hcclWait(&req) != hcclSuccess)
            return NULL;
    }
    t->stale_res = hcclWait(&stale);
    snprintf(t->stale_msg, sizeof(t->stale_msg), "%s", hcclGetLastError(NULL));
    return NULL;
}

static void test_requests_reused_after_the_quarantine(void **state)
{
    static rounds_t t;
    int reused = 0;

    (void)state;
    memset(&t, 0, sizeof(t));
    assert_int_equal(hccl_reactor_create(NULL, 0, &t.r), hcclSuccess);
    run_on_thread(request_rounds, &t);
    for (int i = 0; i < ROUNDS; i++) {
        assert_non_null(t.seen[i]);
        for (int j = 0; j < i; j++) {
            if (t.seen[j] != t.seen[i])
                continue;
            /* Never while a stale handle to it could still be told apart. */
            assert_true(i - j >= HCCL_QUARANTINE_SLOTS);
            reused++;
            break;
        }
    }
    /* Once a release evicts the first (the one after the quarantine is full), every request
     * is one that came back. */
    assert_int_equal(reused, ROUNDS - HCCL_QUARANTINE_SLOTS - 1);
    /* A handle waited for within the quarantine's depth is still refused, not waited again. */
    assert_int_equal(t.stale_res, hcclInvalidUsage);
    assert_non_null(strstr(t.stale_msg, "not a live request"));
    hccl_reactor_destroy(t.r);
}

typedef struct {
    void *first;
    void *before, *after, *other_size;
    unsigned char zero[96];
} blocks_t;

static void *block_rounds(void *arg)
{
    blocks_t *b = arg;

    for (int i = 0; i < HCCL_QUARANTINE_SLOTS; i++) {
        unsigned char *p = hccl_calloc(1, 96);
        if (!p)
            return NULL;
        memset(p, 0xa5, 96);
        if (i == 0)
            b->first = p;
        hccl_quarantine_free(HCCL_QUARANTINE_REQUEST, p, 96);
    }
    b->before = hccl_quarantine_reuse(HCCL_QUARANTINE_REQUEST, 96); /* all still held */
    hccl_quarantine_free(HCCL_QUARANTINE_REQUEST, hccl_calloc(1, 96), 96); /* evicts the first */
    b->other_size = hccl_quarantine_reuse(HCCL_QUARANTINE_REQUEST, 128);
    b->after = hccl_quarantine_reuse(HCCL_QUARANTINE_REQUEST, 96);
    if (b->after) {
        memcpy(b->zero, b->after, sizeof(b->zero));
        hccl_free(b->after);
    }
    return NULL;
}

static void test_blocks_come_back_oldest_first_zeroed(void **state)
{
    static blocks_t b;
    static const unsigned char zeros[96];

    (void)state;
    memset(&b, 0, sizeof(b));
    run_on_thread(block_rounds, &b);
    assert_null(b.before);
    assert_null(b.other_size);
    assert_ptr_equal(b.after, b.first);
    assert_memory_equal(b.zero, zeros, sizeof(zeros));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_requests_reused_after_the_quarantine),
        cmocka_unit_test(test_blocks_come_back_oldest_first_zeroed),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
