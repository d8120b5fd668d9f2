/* Helpers of the reactor's unit tests (reactor_helpers.h). */
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

int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void counter_init(counter_t *c)
{
    pthread_condattr_t attr;

    pthread_mutex_init(&c->mtx, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cond, &attr);
    pthread_condattr_destroy(&attr);
    c->count = 0;
}

void counter_destroy(counter_t *c)
{
    pthread_mutex_destroy(&c->mtx);
    pthread_cond_destroy(&c->cond);
}

void counter_add(counter_t *c, int n)
{
    pthread_mutex_lock(&c->mtx);
    c->count += n;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mtx);
}

/* Waits until the count reaches n; false if timeout_ms passes first. */
bool counter_wait(counter_t *c, int n, int timeout_ms)
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
bool fd_readable(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};

    return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

/* Reads the eventfd counter (0 if it is zero). */
uint64_t fd_drain(int fd)
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
bool fd_collect(int fd, uint64_t *total, uint64_t want)
{
    while (*total < want) {
        if (!fd_readable(fd, WAIT_MS))
            return false;
        *total += fd_drain(fd);
    }
    return *total == want && !fd_readable(fd, 0);
}

/* Records a worker thread's first failure in err (TCHECK, reactor_helpers.h). */
void worker_fail(char *err, int line, const char *what)
{
    if (!err[0])
        snprintf(err, ERRLEN, "line %d: %s (last error: \"%s\")", line, what,
                 hcclGetLastError(NULL));
}

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

void run_on_reactor(hccl_reactor_t *r, void (*fn)(void *), void *arg)
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
void reactor_barrier(hccl_reactor_t *r)
{
    run_on_reactor(r, NULL, NULL);
}

hccl_reactor_t *own_reactor(void)
{
    hccl_reactor_t *r = NULL;

    assert_int_equal(hccl_reactor_create(NULL, 0, &r), hcclSuccess);
    assert_non_null(r);
    assert_false(hccl_reactor_is_external(r));
    assert_int_equal(hccl_reactor_start(r), hcclSuccess);
    return r;
}

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
void post_complete(hccl_reactor_t *r, hcclRequest_t req, hcclResult_t res, const char *msg)
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

hcclRequest_t new_request(hccl_reactor_t *r)
{
    hcclRequest_t req = NULL;

    assert_int_equal(hccl_request_create(r, 0, &req), hcclSuccess);
    assert_non_null(req);
    return req;
}

const size_t dt_size[hcclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};

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
void fill(void *buf, hcclDataType_t dt, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t h = mix((uint32_t)i * 2654435761U ^ seed), g = mix(h + 1);
        switch (dt) {
        case hcclInt8:
            ((int8_t *)buf)[i] = (int8_t)h;
            break;
        case hcclUint8:
            ((uint8_t *)buf)[i] = (uint8_t)h;
            break;
        case hcclInt32:
            ((int32_t *)buf)[i] = (int32_t)h;
            break;
        case hcclUint32:
            ((uint32_t *)buf)[i] = h;
            break;
        case hcclInt64:
            ((int64_t *)buf)[i] = (int64_t)((uint64_t)h << 32 | g);
            break;
        case hcclUint64:
            ((uint64_t *)buf)[i] = (uint64_t)g << 32 | h;
            break;
        case hcclFloat16:
            ((uint16_t *)buf)[i] = (uint16_t)((h & 0x8000u) | (1u + h % 29u) << 10 | (g & 0x3ffu));
            break;
        case hcclBfloat16:
            ((uint16_t *)buf)[i] = (uint16_t)((h & 0x8000u) | (1u + h % 250u) << 7 | (g & 0x7fu));
            break;
        case hcclFloat32:
            ((float *)buf)[i] = (float)((int)(h % 20001u) - 10000) / 16.0f;
            break;
        case hcclFloat64:
            ((double *)buf)[i] = (double)((int64_t)(h % 2000001u) - 1000000) / 64.0;
            break;
        default:
            break;
        }
    }
}
