/* Requests: the non-blocking handle, its completion, and the public wait/test calls. */
#include <errno.h>
#include <sched.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/quarantine.h"
#include "reactor/reactor_impl.h"

#define HCCL_REQUEST_MAGIC 0x52514343u /* "CCQR" */
#define HCCL_REQUEST_DEAD 0xdeadbeefu

/* The room after a request starts at this alignment. */
#define REQUEST_BYTES ((sizeof(struct hcclRequest) + 15) & ~(size_t)15)

hcclResult_t hccl_request_create(hccl_reactor_t *r, size_t ext_bytes, struct hcclRequest **req_p)
{
    size_t bytes = REQUEST_BYTES + ext_bytes;
    struct hcclRequest *req = hccl_quarantine_reuse(HCCL_QUARANTINE_REQUEST, bytes);

    if (!req)
        req = hccl_calloc(1, bytes);
    if (!req)
        return HCCL_FAIL(hcclSystemError, "request: out of memory");
    req->magic = HCCL_REQUEST_MAGIC;
    req->ext_bytes = ext_bytes;
    req->ext = ext_bytes ? (char *)req + REQUEST_BYTES : NULL;
    atomic_init(&req->refs, 1); /* the user's handle (and a completer's, for a callback) */
    req->reactor = r;
    hccl_reactor_retain(r); /* the wait state must outlive the communicator for this handle */
    req->state = HCCL_REQ_PENDING;
    *req_p = req;
    return hcclSuccess;
}

/*
 * References are taken only before the request is done (a completer's, around the callback),
 * so a count of one read by the holder of a done request's handle is its own: no
 * read-modify-write on a request's common way out.
 */
void hccl_request_release(struct hcclRequest *req)
{
    if (!req)
        return;
    if (atomic_load_explicit(&req->refs, memory_order_acquire) == 1 ||
        atomic_fetch_sub(&req->refs, 1) == 1) {
        hccl_reactor_t *r = req->reactor;
        req->magic = HCCL_REQUEST_DEAD;
        hccl_free(req->errmsg);
        hccl_free(req->v);
        hccl_free(req->check);
        /* a stale handle reads DEAD */
        hccl_quarantine_free(HCCL_QUARANTINE_REQUEST, req, REQUEST_BYTES + req->ext_bytes);
        hccl_reactor_release(r);
    }
}

bool hccl_request_is_done(struct hcclRequest *req)
{
    /* DONE is stored last, with release, after the result and the callback. */
    return __atomic_load_n(&req->state, __ATOMIC_ACQUIRE) == HCCL_REQ_DONE;
}

void hccl_request_complete(struct hcclRequest *req, hcclResult_t res, const char *errmsg)
{
    hccl_reactor_t *r = req->reactor;
    int fd = r->completion_fd;
    hccl_request_cb_t cb;
    uint64_t one = 1;

    pthread_mutex_lock(&r->done_mtx);
    __atomic_store_n(&req->state, HCCL_REQ_COMPLETING, __ATOMIC_RELAXED); /* spinners read it */
    req->result = res;
    if (res != hcclSuccess && errmsg)
        req->errmsg = strdup(errmsg);
    /* The callback has returned before any waiter learns the request is done. Without one the
     * lock is held until DONE, so hcclRequestSetCallback either comes first (and it runs here)
     * or sees DONE (and runs it itself); a request takes only one. */
    cb = req->cb;
    if (cb) {
        /* The callback may drop the handle's reference (a stream's does): ours keeps req. */
        atomic_fetch_add(&req->refs, 1);
        pthread_mutex_unlock(&r->done_mtx);
        cb(req, res, req->cb_arg);
        pthread_mutex_lock(&r->done_mtx);
    }
    /* Decided with DONE, under the lock that hccl_reactor_completion_fd takes: a request seen
     * done before the caller asked for the fd is never counted on it afterwards. */
    bool count = atomic_load(&r->completion_fd_used);
    __atomic_store_n(&req->state, HCCL_REQ_DONE, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&r->done_cond);
    pthread_mutex_unlock(&r->done_mtx);
    /* Without a callback req may be gone now: its waiter saw DONE and finished it. */
    if (count && write(fd, &one, sizeof(one)) < 0)
        HCCL_WARN("request: write(completion fd): %s", strerror(errno));
    if (cb)
        hccl_request_release(req);
}

static hcclResult_t request_check(const struct hcclRequest *req, const char *fn)
{
    if (req->magic != HCCL_REQUEST_MAGIC)
        return HCCL_FAIL(hcclInvalidUsage, "%s: req is not a live request (already waited or "
                                           "tested to completion, or not from hccl)", fn);
    return hcclSuccess;
}

/* Hands the result to the caller's thread and drops the user's reference. */
static hcclResult_t request_finish(hcclRequest_t *req_p)
{
    struct hcclRequest *req = *req_p;
    hcclResult_t res = req->result;

    if (res != hcclSuccess)
        hccl_error_put(req->errmsg ? req->errmsg : hcclGetErrorString(res));
    *req_p = NULL;
    hccl_request_release(req);
    return res;
}

/*
 * The request is about to finish: watching it is cheaper than a futex sleep and wake-up.
 * Where the reactor allows it (every link pollable), this thread runs the reactor's work
 * itself instead of handing it to the progress thread and back; that drive returns only once
 * the request is done or nothing moved for longer than the spin, so no clock is read here
 * unless another thread drives. Yields, so that on a full machine the thread we wait for
 * gets to run.
 */
static void request_spin(struct hcclRequest *req)
{
    hccl_reactor_t *r = req->reactor;
    int64_t spin_ns = hccl_reactor_spin_ns(r), since = 0;

    if (spin_ns <= 0)
        return;
    for (unsigned round = 0;; round++) {
        bool drove = hccl_reactor_help(r, &req->state, HCCL_REQ_DONE), give_up = drove;
        if (__atomic_load_n(&req->state, __ATOMIC_ACQUIRE) == HCCL_REQ_DONE)
            return; /* not a wake-up for the progress thread: nothing is left for it */
        if (!drove && (round & 15) == 15) {
            int64_t now = hccl_now_ns();
            if (since == 0)
                since = now;
            give_up = now - since > spin_ns;
        }
        if (give_up) {
            /* About to sleep: make sure the progress thread is awake for what we posted. */
            hccl_reactor_wake(r);
            return;
        }
        sched_yield();
    }
}

static void request_block(struct hcclRequest *req)
{
    hccl_reactor_t *r = req->reactor;

    if (hccl_request_is_done(req))
        return; /* an Async call often finishes inline: no clock read, no look */
    if (!hccl_reactor_is_external(r))
        request_spin(req);
    if (hccl_request_is_done(req))
        return;
    pthread_mutex_lock(&r->done_mtx);
    while (req->state != HCCL_REQ_DONE) {
        struct timespec ts;
        /* A borrowed loop progresses only when someone runs it: we do, unless another
         * thread already is; then its completions wake us. */
        if (hccl_reactor_is_external(r)) {
            pthread_mutex_unlock(&r->done_mtx);
            bool drove = hccl_reactor_drive(r, 100);
            pthread_mutex_lock(&r->done_mtx);
            if (drove || req->state == HCCL_REQ_DONE)
                continue;
        }
        if (!hccl_reactor_is_external(r)) {
            pthread_cond_wait(&r->done_cond, &r->done_mtx);
            continue;
        }
        hccl_abs_deadline(&ts, 10);
        pthread_cond_timedwait(&r->done_cond, &r->done_mtx, &ts);
    }
    pthread_mutex_unlock(&r->done_mtx);
}

HCCL_API hcclResult_t hcclWait(hcclRequest_t *req_p)
{
    if (!req_p)
        return HCCL_FAIL(hcclInvalidArgument, "hcclWait: req is NULL");
    if (!*req_p)
        return hcclSuccess;
    HCCL_CHECK(request_check(*req_p, "hcclWait"));
    if (!hccl_request_is_done(*req_p) &&
        (hccl_reactor_in_loop((*req_p)->reactor) ||
         (hccl_reactor_is_external((*req_p)->reactor) && hccl_reactor_in_callback((*req_p)->reactor))))
        return HCCL_FAIL(hcclInvalidUsage, "hcclWait: called from a callback of the loop that "
                                           "drives the communicator, for an unfinished request; it "
                                           "would never finish");
    request_block(*req_p);
    return request_finish(req_p);
}

HCCL_API hcclResult_t hcclTest(hcclRequest_t *req_p, int *done)
{
    if (!req_p || !done)
        return HCCL_FAIL(hcclInvalidArgument, "hcclTest: %s is NULL", req_p ? "done" : "req");
    if (!*req_p) {
        *done = 1;
        return hcclSuccess;
    }
    HCCL_CHECK(request_check(*req_p, "hcclTest"));
    if (!hccl_request_is_done(*req_p)) {
        /* The tester drives: a borrowed loop through libevent, our own with one look. */
        if (hccl_reactor_is_external((*req_p)->reactor))
            hccl_reactor_drive((*req_p)->reactor, 0);
        else
            hccl_reactor_look((*req_p)->reactor);
    }
    if (!hccl_request_is_done(*req_p)) {
        *done = 0;
        return hcclSuccess;
    }
    *done = 1;
    return request_finish(req_p);
}

HCCL_API hcclResult_t hcclWaitAll(int n, hcclRequest_t *reqs)
{
    hcclResult_t first = hcclSuccess;
    char first_msg[1024];

    if (n < 0 || (n > 0 && !reqs))
        return HCCL_FAIL(hcclInvalidArgument, "hcclWaitAll: %s", n < 0 ? "n < 0" : "reqs is NULL");
    for (int i = 0; i < n; i++) {
        hcclResult_t res = hcclWait(&reqs[i]);
        if (res != hcclSuccess && first == hcclSuccess) {
            first = res;
            snprintf(first_msg, sizeof(first_msg), "%s", hccl_error_last());
        }
    }
    if (first != hcclSuccess) /* first_msg was written when first was set */
        hccl_error_put(first_msg);
    return first;
}

HCCL_API hcclResult_t hcclRequestSetCallback(hcclRequest_t req,
                                             void (*fn)(hcclRequest_t req, hcclResult_t result,
                                                        void *arg),
                                             void *arg)
{
    hccl_reactor_t *r;
    hcclResult_t res;

    if (!req)
        return HCCL_FAIL(hcclInvalidArgument, "hcclRequestSetCallback: req is NULL");
    HCCL_CHECK(request_check(req, "hcclRequestSetCallback"));
    r = req->reactor;
    pthread_mutex_lock(&r->done_mtx);
    if (req->cb) {
        pthread_mutex_unlock(&r->done_mtx);
        return HCCL_FAIL(hcclInvalidUsage, "hcclRequestSetCallback: the request already has a "
                                           "callback");
    }
    if (req->state != HCCL_REQ_DONE) {
        /* Pending: the reactor runs it before it marks the request done. */
        req->cb = fn;
        req->cb_arg = arg;
        pthread_mutex_unlock(&r->done_mtx);
        return hcclSuccess;
    }
    req->cb = fn;
    res = req->result;
    pthread_mutex_unlock(&r->done_mtx);
    if (fn)
        fn(req, res, arg);
    return hcclSuccess;
}
