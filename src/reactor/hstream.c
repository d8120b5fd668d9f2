/*
 * Streams: a FIFO of items and the worker thread that runs them in order. A collective is
 * posted through its Async form and the worker sleeps on the stream's condition variable until
 * the request's completion callback wakes it. The first failure is sticky: what is queued after
 * it is skipped (records still complete their points, carrying the error), and new work is
 * refused with it.
 */
#include <stdio.h>
#include <string.h>

#include "reactor/hstream.h"
#include "reactor/reactor.h"

/* The stream whose worker is the calling thread, NULL elsewhere. */
static _Thread_local HCCL_TLS_FAST struct hcclStream *tl_worker;

struct hcclStream *hccl_hstream_current(void)
{
    return tl_worker;
}

static void stream_free(struct hcclStream *s)
{
    while (s->head) {
        hccl_hstream_item_t *it = s->head;
        s->head = it->next;
        hccl_hstream_point_release(it->point);
        hccl_free(it);
    }
    pthread_cond_destroy(&s->idle_cond);
    pthread_cond_destroy(&s->work_cond);
    pthread_mutex_destroy(&s->mtx);
    s->h.magic = 0;
    hccl_free(s);
}

void hccl_hstream_release(struct hcclStream *s)
{
    if (atomic_fetch_sub(&s->h.refs, 1) == 1)
        stream_free(s);
}

hcclResult_t hccl_hstream_get(hcclStream_t stream, const char *fn, struct hcclStream **s_p)
{
    if (!stream)
        return HCCL_FAIL(hcclInvalidArgument, "%s: stream is NULL", fn);
    if (stream == tl_worker) {
        /* Its own worker runs, so it is alive, even while being destroyed: what it queues
         * then is drained too. */
        atomic_fetch_add(&tl_worker->h.refs, 1);
    } else if (!hccl_handle_get(stream, HCCL_HSTREAM_MAGIC)) {
        return HCCL_FAIL(hcclInvalidUsage, "%s: stream %p is not a live stream (destroyed?)", fn,
                         (void *)stream);
    }
    *s_p = stream;
    return hcclSuccess;
}

hccl_hstream_item_t *hccl_hstream_item_new(int kind, const char *fn)
{
    hccl_hstream_item_t *it = hccl_calloc(1, sizeof(*it));

    if (!it)
        HCCL_FAIL(hcclSystemError, "%s: out of memory for a stream item", fn);
    else
        it->kind = kind;
    return it;
}

hcclResult_t hccl_hstream_push_locked(struct hcclStream *s, hccl_hstream_item_t *it, bool work,
                                      const char *fn)
{
    if (s->closing)
        return HCCL_FAIL(hcclInvalidUsage, "%s: stream %p is being destroyed", fn, (void *)s);
    if (work && s->error != hcclSuccess) /* logged once, when it happened */
        return hccl_error_set_quiet(s->error, "%s: stream %p has failed: %s", fn, (void *)s,
                                    s->errmsg);
    it->next = NULL;
    if (s->tail)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    s->queued++;
    pthread_cond_signal(&s->work_cond);
    return hcclSuccess;
}

hcclResult_t hccl_hstream_push(hcclStream_t stream, hccl_hstream_item_t *it, bool work,
                               const char *fn)
{
    struct hcclStream *s = NULL;
    hcclResult_t res;

    HCCL_CHECK(hccl_hstream_get(stream, fn, &s));
    pthread_mutex_lock(&s->mtx);
    res = hccl_hstream_push_locked(s, it, work, fn);
    pthread_mutex_unlock(&s->mtx);
    hccl_hstream_release(s);
    return res;
}

/* ---- the worker ---- */

static void stream_fail(struct hcclStream *s, hcclResult_t res, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Worker: records the stream's first failure; what is queued after it is skipped. */
static void stream_fail(struct hcclStream *s, hcclResult_t res, const char *fmt, ...)
{
    char text[HCCL_HSTREAM_ERRMSG_BYTES];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    HCCL_WARN("stream %p: %s; later work on the stream is skipped", (void *)s, text);
    pthread_mutex_lock(&s->mtx);
    if (s->error == hcclSuccess) {
        s->error = res;
        snprintf(s->errmsg, sizeof(s->errmsg), "%s", text);
    }
    pthread_mutex_unlock(&s->mtx);
}

/*
 * Reactor thread (or the worker itself, when the request had completed already): wakes the
 * worker. The request's text is set before the callback runs, and the reactor keeps its own
 * reference until the callback has returned, so dropping the stream's here frees nothing
 * under it.
 */
static void stream_on_coll_done(hcclRequest_t req, hcclResult_t res, void *arg)
{
    struct hcclStream *s = arg;

    pthread_mutex_lock(&s->mtx);
    s->coll_res = res;
    if (res != hcclSuccess)
        snprintf(s->coll_msg, sizeof(s->coll_msg), "%s",
                 req->errmsg ? req->errmsg : hcclGetErrorString(res));
    s->coll_done = true;
    pthread_cond_signal(&s->work_cond);
    pthread_mutex_unlock(&s->mtx);
    hccl_request_release(req);
}

/* Posts the collective and sleeps until its completion callback wakes the worker. */
static void stream_run_coll(struct hcclStream *s, const hccl_hstream_coll_t *c)
{
    hcclRequest_t req = NULL;
    hcclResult_t res = hccl_hstream_coll_post(c, &req);

    if (res != hcclSuccess) {
        stream_fail(s, res, "%s (%zu x %s) could not start: %s", c->fn, c->count,
                    hccl_dtype_name(c->dtype), hccl_error_last());
        return;
    }
    pthread_mutex_lock(&s->mtx);
    s->coll_done = false;
    pthread_mutex_unlock(&s->mtx);
    res = hcclRequestSetCallback(req, stream_on_coll_done, s);
    if (res != hcclSuccess) {
        /* Cannot happen for a request just made; it is never left unwaited all the same. */
        stream_fail(s, res, "%s: %s", c->fn, hccl_error_last());
        hcclWait(&req);
        return;
    }
    pthread_mutex_lock(&s->mtx);
    while (!s->coll_done)
        pthread_cond_wait(&s->work_cond, &s->mtx);
    res = s->coll_res;
    pthread_mutex_unlock(&s->mtx);
    if (res != hcclSuccess)
        stream_fail(s, res, "%s (%zu x %s) failed: %s", c->fn, c->count,
                    hccl_dtype_name(c->dtype), s->coll_msg);
}

static void stream_run(struct hcclStream *s, hccl_hstream_item_t *it)
{
    char msg[HCCL_HSTREAM_ERRMSG_BYTES];
    hcclResult_t err;

    pthread_mutex_lock(&s->mtx);
    err = s->error;
    snprintf(msg, sizeof(msg), "%s", s->errmsg);
    pthread_mutex_unlock(&s->mtx);
    switch (it->kind) {
    case HCCL_HSTREAM_FN:
        if (err == hcclSuccess)
            it->fn(it->arg);
        break;
    case HCCL_HSTREAM_COLL:
        if (err == hcclSuccess)
            stream_run_coll(s, &it->coll);
        break;
    case HCCL_HSTREAM_RECORD:
        /* Even on a failed stream: whoever waits for the point must learn of the failure. */
        hccl_hstream_point_complete(it->point, err, msg);
        break;
    case HCCL_HSTREAM_WAIT:
        if (err != hcclSuccess)
            break;
        err = hccl_hstream_point_wait(it->point, msg, sizeof(msg));
        if (err != hcclSuccess)
            stream_fail(s, err, "waited for an event whose work failed: %s", msg);
        break;
    }
    hccl_hstream_point_release(it->point);
    hccl_free(it);
}

static void *stream_main(void *arg)
{
    struct hcclStream *s = arg;

    tl_worker = s;
    pthread_mutex_lock(&s->mtx);
    for (;;) {
        hccl_hstream_item_t *it;
        while (!s->head && !s->closing)
            pthread_cond_wait(&s->work_cond, &s->mtx);
        if (!s->head)
            break;
        it = s->head;
        s->head = it->next;
        if (!s->head)
            s->tail = NULL;
        pthread_mutex_unlock(&s->mtx);
        stream_run(s, it);
        pthread_mutex_lock(&s->mtx);
        s->finished++;
        pthread_cond_broadcast(&s->idle_cond);
    }
    pthread_mutex_unlock(&s->mtx);
    return NULL;
}

/* ---- public calls ---- */

HCCL_API hcclResult_t hcclStreamCreate(hcclStream_t *stream)
{
    struct hcclStream *s = NULL;
    hcclResult_t res;
    int rc;

    if (!stream)
        return HCCL_FAIL(hcclInvalidArgument, "hcclStreamCreate: stream is NULL");
    s = hccl_calloc(1, sizeof(*s));
    if (!s)
        return HCCL_FAIL(hcclSystemError, "hcclStreamCreate: out of memory");
    s->h.magic = HCCL_HSTREAM_MAGIC;
    atomic_init(&s->h.refs, 1);
    pthread_mutex_init(&s->mtx, NULL);
    pthread_cond_init(&s->work_cond, NULL);
    pthread_cond_init(&s->idle_cond, NULL);
    rc = pthread_create(&s->thread, NULL, stream_main, s);
    if (rc != 0) {
        res = HCCL_FAIL(hcclSystemError, "hcclStreamCreate: pthread_create: %s", strerror(rc));
        goto err_free;
    }
    if (!hccl_handle_register(&s->h)) {
        res = HCCL_FAIL(hcclSystemError, "hcclStreamCreate: out of memory for the registry");
        goto err_stop_thread;
    }
    HCCL_INFO(HCCL_SUB_REACTOR, "stream %p created", (void *)s);
    *stream = s;
    return hcclSuccess;

err_stop_thread:
    pthread_mutex_lock(&s->mtx);
    s->closing = true;
    pthread_cond_signal(&s->work_cond);
    pthread_mutex_unlock(&s->mtx);
    pthread_join(s->thread, NULL);
err_free:
    stream_free(s);
    return res;
}

HCCL_API hcclResult_t hcclStreamDestroy(hcclStream_t stream)
{
    static const char fn[] = "hcclStreamDestroy";
    struct hcclStream *s = stream;
    hcclResult_t res;

    if (!stream)
        return HCCL_FAIL(hcclInvalidArgument, "%s: stream is NULL", fn);
    if (stream == tl_worker)
        return HCCL_FAIL(hcclInvalidUsage, "%s: called from a function running on the stream "
                                           "itself; it would wait for itself", fn);
    if (!hccl_handle_unregister(stream, HCCL_HSTREAM_MAGIC))
        return HCCL_FAIL(hcclInvalidUsage, "%s: stream %p is not a live stream (destroyed?)", fn,
                         (void *)stream);
    /* The user's reference is ours now. Drain, including what the stream's own functions
     * queue meanwhile; other threads are refused from here on. */
    pthread_mutex_lock(&s->mtx);
    while (s->finished < s->queued)
        pthread_cond_wait(&s->idle_cond, &s->mtx);
    s->closing = true;
    pthread_cond_signal(&s->work_cond);
    res = s->error;
    if (res != hcclSuccess)
        hccl_error_put(s->errmsg);
    pthread_mutex_unlock(&s->mtx);
    pthread_join(s->thread, NULL);
    HCCL_INFO(HCCL_SUB_REACTOR, "stream %p destroyed", (void *)s);
    hccl_hstream_release(s);
    return res;
}

HCCL_API hcclResult_t hcclStreamEnqueue(hcclStream_t stream, void (*fn)(void *arg), void *arg)
{
    hccl_hstream_item_t *it;
    hcclResult_t res;

    if (!fn)
        return HCCL_FAIL(hcclInvalidArgument, "hcclStreamEnqueue: fn is NULL");
    it = hccl_hstream_item_new(HCCL_HSTREAM_FN, "hcclStreamEnqueue");
    if (!it)
        return hcclSystemError;
    it->fn = fn;
    it->arg = arg;
    res = hccl_hstream_push(stream, it, true, "hcclStreamEnqueue");
    if (res != hcclSuccess)
        hccl_free(it);
    return res;
}

hcclResult_t hccl_hstream_enqueue_coll(hcclStream_t stream, const hccl_hstream_coll_t *c)
{
    hccl_hstream_item_t *it = hccl_hstream_item_new(HCCL_HSTREAM_COLL, c->fn);
    hcclResult_t res;

    if (!it)
        return hcclSystemError;
    it->coll = *c;
    res = hccl_hstream_push(stream, it, true, c->fn);
    if (res != hcclSuccess)
        hccl_free(it);
    return res;
}

HCCL_API hcclResult_t hcclStreamSynchronize(hcclStream_t stream)
{
    struct hcclStream *s = NULL;
    hcclResult_t res;
    uint64_t target;

    HCCL_CHECK(hccl_hstream_get(stream, "hcclStreamSynchronize", &s));
    if (s == tl_worker) {
        hccl_hstream_release(s);
        return HCCL_FAIL(hcclInvalidUsage, "hcclStreamSynchronize: called from a function "
                                           "running on the stream itself; it would wait for "
                                           "itself");
    }
    pthread_mutex_lock(&s->mtx);
    target = s->queued;
    while (s->finished < target)
        pthread_cond_wait(&s->idle_cond, &s->mtx);
    res = s->error;
    if (res != hcclSuccess)
        hccl_error_put(s->errmsg); /* logged once, when it happened */
    pthread_mutex_unlock(&s->mtx);
    hccl_hstream_release(s);
    return res;
}
