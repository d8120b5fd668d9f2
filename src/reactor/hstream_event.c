/*
 * Events: each hcclEventRecord queues a new point on the stream and makes it the event's; the
 * stream's worker completes the point when it gets there, with the stream's error at that
 * moment. Query, synchronize and waits look at the point the event had when they were called.
 */
#include <stdio.h>
#include <string.h>

#include "reactor/hstream.h"

/* ---- points ---- */

void hccl_hstream_point_release(hccl_hstream_point_t *pt)
{
    if (pt && atomic_fetch_sub(&pt->refs, 1) == 1) {
        pthread_cond_destroy(&pt->cond);
        pthread_mutex_destroy(&pt->mtx);
        hccl_free(pt->msg);
        hccl_free(pt);
    }
}

void hccl_hstream_point_complete(hccl_hstream_point_t *pt, hcclResult_t res, const char *msg)
{
    pthread_mutex_lock(&pt->mtx);
    pt->res = res;
    if (res != hcclSuccess)
        pt->msg = strdup(msg); /* NULL if out of memory: the result still travels */
    pt->done = true;
    pthread_cond_broadcast(&pt->cond);
    pthread_mutex_unlock(&pt->mtx);
}

hcclResult_t hccl_hstream_point_wait(hccl_hstream_point_t *pt, char *msg, size_t len)
{
    hcclResult_t res;

    pthread_mutex_lock(&pt->mtx);
    while (!pt->done)
        pthread_cond_wait(&pt->cond, &pt->mtx);
    res = pt->res;
    snprintf(msg, len, "%s", pt->msg ? pt->msg : hcclGetErrorString(res));
    pthread_mutex_unlock(&pt->mtx);
    return res;
}

static bool point_is_done(hccl_hstream_point_t *pt)
{
    bool done;

    pthread_mutex_lock(&pt->mtx);
    done = pt->done;
    pthread_mutex_unlock(&pt->mtx);
    return done;
}

/* ---- events ---- */

static void event_release(struct hcclEvent *e)
{
    if (atomic_fetch_sub(&e->h.refs, 1) == 1) {
        hccl_hstream_point_release(e->point);
        pthread_mutex_destroy(&e->mtx);
        e->h.magic = 0;
        hccl_free(e);
    }
}

static hcclResult_t event_get(hcclEvent_t event, const char *fn, struct hcclEvent **e_p)
{
    if (!event)
        return HCCL_FAIL(hcclInvalidArgument, "%s: event is NULL", fn);
    if (!hccl_handle_get(event, HCCL_HEVENT_MAGIC))
        return HCCL_FAIL(hcclInvalidUsage, "%s: event %p is not a live event (destroyed?)", fn,
                         (void *)event);
    *e_p = event;
    return hcclSuccess;
}

/* The latest point of event with a reference, or NULL if it was never recorded. */
static hcclResult_t event_point(hcclEvent_t event, const char *fn, hccl_hstream_point_t **pt_p)
{
    struct hcclEvent *e = NULL;

    HCCL_CHECK(event_get(event, fn, &e));
    pthread_mutex_lock(&e->mtx);
    *pt_p = e->point;
    if (e->point)
        atomic_fetch_add(&e->point->refs, 1);
    pthread_mutex_unlock(&e->mtx);
    event_release(e);
    return hcclSuccess;
}

/* The result of a point that is done, with the failure's text for this thread. */
static hcclResult_t event_result(hccl_hstream_point_t *pt, const char *fn)
{
    char msg[HCCL_HSTREAM_ERRMSG_BYTES];
    hcclResult_t res = hccl_hstream_point_wait(pt, msg, sizeof(msg));

    if (res != hcclSuccess) /* logged once, by the stream that failed */
        hccl_error_set_quiet(res, "%s: the work the event captured failed: %s", fn, msg);
    return res;
}

HCCL_API hcclResult_t hcclEventCreate(hcclEvent_t *event)
{
    struct hcclEvent *e = NULL;

    if (!event)
        return HCCL_FAIL(hcclInvalidArgument, "hcclEventCreate: event is NULL");
    e = hccl_calloc(1, sizeof(*e));
    if (!e)
        return HCCL_FAIL(hcclSystemError, "hcclEventCreate: out of memory");
    e->h.magic = HCCL_HEVENT_MAGIC;
    atomic_init(&e->h.refs, 1);
    pthread_mutex_init(&e->mtx, NULL);
    if (!hccl_handle_register(&e->h)) {
        event_release(e);
        return HCCL_FAIL(hcclSystemError, "hcclEventCreate: out of memory for the registry");
    }
    *event = e;
    return hcclSuccess;
}

HCCL_API hcclResult_t hcclEventDestroy(hcclEvent_t event)
{
    if (!event)
        return HCCL_FAIL(hcclInvalidArgument, "hcclEventDestroy: event is NULL");
    if (!hccl_handle_unregister(event, HCCL_HEVENT_MAGIC))
        return HCCL_FAIL(hcclInvalidUsage, "hcclEventDestroy: event %p is not a live event "
                                           "(destroyed?)", (void *)event);
    event_release(event); /* the user's reference; waits hold their points, not the event */
    return hcclSuccess;
}

HCCL_API hcclResult_t hcclEventRecord(hcclEvent_t event, hcclStream_t stream)
{
    static const char fn[] = "hcclEventRecord";
    struct hcclStream *s = NULL;
    struct hcclEvent *e = NULL;
    hccl_hstream_point_t *pt, *old = NULL;
    hccl_hstream_item_t *it;
    hcclResult_t res;

    HCCL_CHECK(event_get(event, fn, &e));
    HCCL_CHECK_GOTO(hccl_hstream_get(stream, fn, &s), res, err_release_event);
    it = hccl_hstream_item_new(HCCL_HSTREAM_RECORD, fn);
    if (!it) {
        res = hcclSystemError;
        goto err_release_stream;
    }
    pt = hccl_calloc(1, sizeof(*pt));
    if (!pt) {
        res = HCCL_FAIL(hcclSystemError, "%s: out of memory", fn);
        goto err_free_item;
    }
    atomic_init(&pt->refs, 2); /* the event's and the record's */
    pthread_mutex_init(&pt->mtx, NULL);
    pthread_cond_init(&pt->cond, NULL);
    pt->stream = s;
    it->point = pt;
    /* The point becomes the event's under the stream's lock, together with its queueing: of
     * two records racing on one event, the one that wins the event's lock last stays. */
    pthread_mutex_lock(&s->mtx);
    res = hccl_hstream_push_locked(s, it, false, fn);
    if (res == hcclSuccess) {
        pthread_mutex_lock(&e->mtx);
        old = e->point;
        e->point = pt;
        pthread_mutex_unlock(&e->mtx);
    }
    pthread_mutex_unlock(&s->mtx);
    if (res != hcclSuccess)
        goto err_free_point;
    hccl_hstream_point_release(old);
    hccl_hstream_release(s);
    event_release(e);
    return hcclSuccess;

err_free_point:
    atomic_store(&pt->refs, 1);
    hccl_hstream_point_release(pt);
err_free_item:
    hccl_free(it);
err_release_stream:
    hccl_hstream_release(s);
err_release_event:
    event_release(e);
    return res;
}

HCCL_API hcclResult_t hcclEventQuery(hcclEvent_t event)
{
    hccl_hstream_point_t *pt;
    hcclResult_t res;

    HCCL_CHECK(event_point(event, "hcclEventQuery", &pt));
    if (!pt)
        return hcclSuccess; /* never recorded, as cudaEventQuery */
    res = point_is_done(pt) ? event_result(pt, "hcclEventQuery") : hcclInProgress;
    hccl_hstream_point_release(pt);
    return res;
}

HCCL_API hcclResult_t hcclEventSynchronize(hcclEvent_t event)
{
    static const char fn[] = "hcclEventSynchronize";
    hccl_hstream_point_t *pt;
    hcclResult_t res;

    HCCL_CHECK(event_point(event, fn, &pt));
    if (!pt)
        return hcclSuccess;
    /* The point is queued after the function running now on this worker: it would never come. */
    if (pt->stream == hccl_hstream_current() && !point_is_done(pt)) {
        hccl_hstream_point_release(pt);
        return HCCL_FAIL(hcclInvalidUsage, "%s: called from a function running on the stream "
                                           "the event was recorded on, before the record; it "
                                           "would wait for itself", fn);
    }
    res = event_result(pt, fn);
    hccl_hstream_point_release(pt);
    return res;
}

HCCL_API hcclResult_t hcclStreamWaitEvent(hcclStream_t stream, hcclEvent_t event)
{
    static const char fn[] = "hcclStreamWaitEvent";
    hccl_hstream_point_t *pt;
    hccl_hstream_item_t *it;
    struct hcclStream *s = NULL;
    hcclResult_t res;

    if (!stream)
        return HCCL_FAIL(hcclInvalidArgument, "%s: stream is NULL", fn);
    HCCL_CHECK(event_point(event, fn, &pt));
    if (!pt) {
        /* Never recorded: nothing to wait for (as cudaStreamWaitEvent); the stream is checked. */
        HCCL_CHECK(hccl_hstream_get(stream, fn, &s));
        hccl_hstream_release(s);
        return hcclSuccess;
    }
    it = hccl_hstream_item_new(HCCL_HSTREAM_WAIT, fn);
    if (!it) {
        hccl_hstream_point_release(pt);
        return hcclSystemError;
    }
    it->point = pt; /* the item owns our reference */
    res = hccl_hstream_push(stream, it, false, fn);
    if (res != hcclSuccess) {
        hccl_hstream_point_release(pt);
        hccl_free(it);
    }
    return res;
}
