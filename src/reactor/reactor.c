/*
 * The reactor: an event_base, its life, and a multi-producer post queue with an eventfd
 * to wake it. Who runs it: reactor_drive.c; timers: reactor_timer.c.
 */
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "reactor/reactor_impl.h"

static pthread_once_t evthread_once = PTHREAD_ONCE_INIT;
static int evthread_rc;
/* The reactor whose work this thread is running right now (progress thread, or a caller
 * driving a borrowed loop), so that a blocking call from a callback can be refused. */
_Thread_local HCCL_TLS_FAST const hccl_reactor_t *hccl_tl_running;

static void evthread_init(void)
{
    /* The user's event_base may be driven from another thread than ours. */
    evthread_rc = evthread_use_pthreads();
}

void hccl_reactor_run_posts(hccl_reactor_t *r)
{
    hccl_post_t *list = atomic_exchange(&r->post_head, NULL);
    hccl_post_t *rev = NULL;
    const hccl_reactor_t *outer = hccl_tl_running;

    /* The stack holds the newest first; run them in posting order. */
    while (list) {
        hccl_post_t *next = list->next;
        list->next = rev;
        rev = list;
        list = next;
    }
    hccl_tl_running = r;
    while (rev) {
        hccl_post_t *next = rev->next;
        rev->next = NULL;
        rev->fn(rev);
        rev = next;
    }
    hccl_tl_running = outer;
}

static void reactor_on_wake(evutil_socket_t fd, short what, void *arg)
{
    hccl_reactor_t *r = arg;
    uint64_t v;

    (void)what;
    /* Read before running: a post that lands meanwhile rings again. */
    if (read(fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        HCCL_WARN("reactor: read(wake fd): %s", strerror(errno));
    hccl_reactor_enter(r);
    hccl_reactor_run_posts(r);
    hccl_reactor_leave(r);
}

hcclResult_t hccl_reactor_create(struct event_base *external, int rank, hccl_reactor_t **r_p)
{
    hcclResult_t res;
    hccl_reactor_t *r;

    pthread_once(&evthread_once, evthread_init);
    if (evthread_rc != 0)
        return HCCL_FAIL(hcclSystemError, "evthread_use_pthreads failed");
    r = hccl_calloc(1, sizeof(*r));
    if (!r)
        return HCCL_FAIL(hcclSystemError, "reactor: out of memory");
    r->wake_fd = -1;
    r->completion_fd = -1;
    r->rank = rank;
    r->cores_shared = true;
    atomic_init(&r->refs, 1);
    pthread_mutex_init(&r->done_mtx, NULL);
    pthread_cond_init(&r->done_cond, NULL);
    pthread_mutex_init(&r->drive_mtx, NULL);
    {
        pthread_mutexattr_t attr;
        pthread_mutexattr_init(&attr);
        pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
        pthread_mutex_init(&r->prog_mtx, &attr);
        pthread_mutexattr_destroy(&attr);
    }
    if (external) {
        r->base = external;
    } else {
        r->base = event_base_new();
        r->owns_base = true;
        if (!r->base) {
            res = HCCL_FAIL(hcclSystemError, "reactor: event_base_new failed");
            goto err_destroy;
        }
    }
    r->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    r->completion_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (r->wake_fd < 0 || r->completion_fd < 0) {
        res = HCCL_FAIL(hcclSystemError, "reactor: eventfd: %s", strerror(errno));
        goto err_destroy;
    }
    r->wake_ev = event_new(r->base, r->wake_fd, EV_READ | EV_PERSIST, reactor_on_wake, r);
    if (!r->wake_ev || event_add(r->wake_ev, NULL) != 0) {
        res = HCCL_FAIL(hcclSystemError, "reactor: cannot register the wake fd");
        goto err_destroy;
    }
    if (r->owns_base) {
        r->watch_ev = evtimer_new(r->base, hccl_reactor_on_watch, r);
        if (!r->watch_ev) {
            res = HCCL_FAIL(hcclSystemError, "reactor: cannot create the watch timer");
            goto err_destroy;
        }
    }
    *r_p = r;
    return hcclSuccess;

err_destroy:
    hccl_reactor_destroy(r);
    return res;
}

hcclResult_t hccl_reactor_start(hccl_reactor_t *r)
{
    int rc;

    if (!r->owns_base || r->thread_started)
        return hcclSuccess;
    rc = pthread_create(&r->thread, NULL, hccl_reactor_thread_main, r);
    if (rc != 0)
        return HCCL_FAIL(hcclSystemError, "reactor: pthread_create: %s", strerror(rc));
    r->thread_started = true;
    return hcclSuccess;
}

void hccl_reactor_stop(hccl_reactor_t *r)
{
    if (!r)
        return;
    /* A waiter of a request that outlives the communicator must not drive the pollers: the
     * links they reach are torn down next. */
    hccl_reactor_enter(r);
    r->drivable = false;
    hccl_reactor_leave(r);
    if (!r->thread_started)
        return;
    atomic_store(&r->stopping, true);
    hccl_reactor_wake(r);
    pthread_join(r->thread, NULL);
    r->thread_started = false;
}

void hccl_reactor_retain(hccl_reactor_t *r)
{
    atomic_fetch_add(&r->refs, 1);
}

void hccl_reactor_release(hccl_reactor_t *r)
{
    if (atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    if (r->wake_fd >= 0)
        close(r->wake_fd);
    pthread_mutex_destroy(&r->done_mtx);
    pthread_cond_destroy(&r->done_cond);
    pthread_mutex_destroy(&r->drive_mtx);
    pthread_mutex_destroy(&r->prog_mtx);
    hccl_free(r);
}

/*
 * Tears down the loop, its thread and its fds; the wait state (lock, condition) stays until
 * the last request handle is released, so that waiting on a finished request of a destroyed
 * communicator is still safe.
 */
void hccl_reactor_destroy(hccl_reactor_t *r)
{
    if (!r)
        return;
    hccl_reactor_stop(r);
    hccl_reactor_enter(r);
    hccl_reactor_run_posts(r);
    hccl_reactor_leave(r);
    pthread_mutex_lock(&r->drive_mtx);
    r->dead = true;
    pthread_mutex_unlock(&r->drive_mtx);
    if (r->wake_ev)
        event_free(r->wake_ev);
    r->wake_ev = NULL;
    if (r->watch_ev)
        event_free(r->watch_ev);
    r->watch_ev = NULL;
    if (r->owns_base && r->base)
        event_base_free(r->base);
    r->base = NULL;
    /* The wake fd stays open with the wait state: a waiter that wakes the loop as it gives up
     * spinning may do so after the communicator is gone (it is closed with the last request). */
    if (r->completion_fd >= 0)
        close(r->completion_fd);
    r->completion_fd = -1;
    hccl_reactor_release(r);
}

struct event_base *hccl_reactor_base(hccl_reactor_t *r)
{
    return r->base;
}

bool hccl_reactor_is_external(const hccl_reactor_t *r)
{
    return !r->owns_base;
}

void hccl_reactor_wake(hccl_reactor_t *r)
{
    uint64_t one = 1;

    if (write(r->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        HCCL_WARN("reactor: write(wake fd): %s", strerror(errno));
}

bool hccl_reactor_polled(const hccl_reactor_t *r)
{
    return !hccl_reactor_idle(r);
}

bool hccl_reactor_posts_pending(hccl_reactor_t *r)
{
    return atomic_load_explicit(&r->post_head, memory_order_relaxed) != NULL;
}

void hccl_reactor_post(hccl_reactor_t *r, hccl_post_t *post)
{
    hccl_post_t *head = hccl_reactor_post_push(r, post);

    /* Only the push onto an empty queue rings (the reactor drains it all at once), and only
     * when the progress thread sleeps: a spinning one finds the post by itself. Both sides
     * use sequentially consistent accesses, so one of them sees the other. */
    if (head == NULL && (!atomic_load(&r->polling) || atomic_load(&r->orphan)))
        hccl_reactor_wake(r);
}

bool hccl_reactor_in_loop(const hccl_reactor_t *r)
{
    return hccl_tl_running == r;
}

int hccl_reactor_completion_fd(hccl_reactor_t *r)
{
    pthread_mutex_lock(&r->done_mtx); /* against a request becoming DONE (hccl_request_complete) */
    atomic_store(&r->completion_fd_used, true);
    pthread_mutex_unlock(&r->done_mtx);
    return r->completion_fd;
}

void hccl_reactor_count(hccl_reactor_t *r)
{
    atomic_fetch_add(&r->pending, 1);
}

/*
 * Only a waiter for idle needs the lock and the signal: it counts itself in idle_waiters
 * before it looks at the count, we look at idle_waiters after our decrement (both
 * sequentially consistent), so one of us sees the other. (One count, not one here and one in
 * the owner: each is two atomic read-modify-writes on every request's way.)
 */
void hccl_reactor_uncount(hccl_reactor_t *r)
{
    if (atomic_fetch_sub(&r->pending, 1) != 1 || atomic_load(&r->idle_waiters) == 0)
        return;
    pthread_mutex_lock(&r->done_mtx);
    pthread_cond_broadcast(&r->done_cond);
    pthread_mutex_unlock(&r->done_mtx);
}

int hccl_reactor_pending(const hccl_reactor_t *r)
{
    return atomic_load(&r->pending);
}

void hccl_reactor_wait_idle(hccl_reactor_t *r)
{
    pthread_mutex_lock(&r->done_mtx);
    atomic_fetch_add(&r->idle_waiters, 1);
    while (atomic_load(&r->pending) > 0) {
        if (!r->owns_base) {
            pthread_mutex_unlock(&r->done_mtx);
            bool drove = hccl_reactor_drive(r, 100);
            pthread_mutex_lock(&r->done_mtx);
            if (!drove && atomic_load(&r->pending) > 0) {
                /* Another thread runs the caller's loop: its completions signal us; the bound
                 * has us drive the loop ourselves once that thread leaves it. */
                struct timespec ts;
                hccl_abs_deadline(&ts, 10);
                pthread_cond_timedwait(&r->done_cond, &r->done_mtx, &ts);
            }
        } else {
            pthread_cond_wait(&r->done_cond, &r->done_mtx);
        }
    }
    atomic_fetch_sub(&r->idle_waiters, 1);
    pthread_mutex_unlock(&r->done_mtx);
}

hcclResult_t hccl_reactor_add_poller(hccl_reactor_t *r, const hccl_poller_t *p)
{
    if (r->npollers == HCCL_REACTOR_MAX_POLLERS)
        return HCCL_FAIL(hcclInternalError, "reactor: more than %d pollers",
                         HCCL_REACTOR_MAX_POLLERS);
    r->pollers[r->npollers++] = *p;
    return hcclSuccess;
}

void hccl_reactor_set_spin(hccl_reactor_t *r, int64_t spin_ns)
{
    /* A borrowed loop is run by its owner: we cannot spin in it. */
    r->spin_ns = r->owns_base ? spin_ns : 0;
    /* A thread blocked in a wait has nothing else to do: it drives for longer before it sleeps,
     * since a sleep hands the work to the progress thread and costs a wake-up to come back. */
    r->wait_spin_ns = 20 * r->spin_ns;
    r->watch_ns = HCCL_WATCH_PERIODS * r->spin_ns;
}

void hccl_reactor_set_cores_shared(hccl_reactor_t *r, bool shared)
{
    r->cores_shared = shared;
}

void hccl_reactor_set_drivable(hccl_reactor_t *r, bool drivable)
{
    r->drivable = drivable && r->owns_base;
}

int64_t hccl_reactor_spin_ns(const hccl_reactor_t *r)
{
    return r->spin_ns;
}
