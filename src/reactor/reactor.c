/*
 * The reactor: an event_base, the thread (or caller's loop) that runs it,
 * and a multi-producer post queue with an eventfd to wake it.
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
static _Thread_local HCCL_TLS_FAST const hccl_reactor_t *tl_running;
/* The borrowed loop this thread runs inside hccl_reactor_drive right now. */
static _Thread_local HCCL_TLS_FAST const hccl_reactor_t *tl_driving;

static void evthread_init(void)
{
    /* The user's event_base may be driven from another thread than ours. */
    evthread_rc = evthread_use_pthreads();
}

/* Pushes post onto the queue; returns the head it found (NULL: the queue was empty). */
static hccl_post_t *post_push(hccl_reactor_t *r, hccl_post_t *post)
{
    hccl_post_t *head = atomic_load(&r->post_head);

    do {
        post->next = head;
    } while (!atomic_compare_exchange_weak(&r->post_head, &head, post));
    return head;
}

static void reactor_run_posts(hccl_reactor_t *r)
{
    hccl_post_t *list = atomic_exchange(&r->post_head, NULL);
    hccl_post_t *rev = NULL;
    const hccl_reactor_t *outer = tl_running;

    /* The stack holds the newest first; run them in posting order. */
    while (list) {
        hccl_post_t *next = list->next;
        list->next = rev;
        rev = list;
        list = next;
    }
    tl_running = r;
    while (rev) {
        hccl_post_t *next = rev->next;
        rev->next = NULL;
        rev->fn(rev);
        rev = next;
    }
    tl_running = outer;
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
    reactor_run_posts(r);
    hccl_reactor_leave(r);
}

void hccl_reactor_enter(hccl_reactor_t *r)
{
    pthread_mutex_lock(&r->prog_mtx);
}

void hccl_reactor_leave(hccl_reactor_t *r)
{
    pthread_mutex_unlock(&r->prog_mtx);
}

bool hccl_reactor_enter_timed(hccl_reactor_t *r, int timeout_ms)
{
    struct timespec ts;

    /* The lock is recursive: a caller already inside the reactor's work gets it at once. */
    hccl_abs_deadline(&ts, timeout_ms);
    return pthread_mutex_timedlock(&r->prog_mtx, &ts) == 0;
}

static void reactor_set_polling(hccl_reactor_t *r, bool on)
{
    atomic_store(&r->polling, on);
    for (int i = 0; i < r->npollers; i++)
        if (r->pollers[i].set_polling)
            r->pollers[i].set_polling(r->pollers[i].arg, on);
}

/*
 * The posts, including those they post (a completion posts the run's end, which posts the
 * request's): a bounded number of passes, so that a chain of them does not cost a round of
 * the pollers (a socket look is a system call) per link. True if any ran. Under prog_mtx.
 */
static bool reactor_run_all_posts(hccl_reactor_t *r)
{
    bool moved = false;

    for (int pass = 0; pass < 4 && atomic_load(&r->post_head); pass++) {
        reactor_run_posts(r);
        moved = true;
    }
    return moved;
}

static bool reactor_run_pollers(hccl_reactor_t *r)
{
    bool moved = false;

    for (int i = 0; i < r->npollers; i++)
        moved |= r->pollers[i].poll(r->pollers[i].arg);
    return moved;
}

/* Posts and pollers; true if anything moved. Under prog_mtx. */
static bool reactor_poll_once(hccl_reactor_t *r)
{
    bool moved = reactor_run_all_posts(r);

    return reactor_run_pollers(r) || moved;
}

/* Stops polling: clears the flags first, then looks once more, since a peer that saw them
 * set did not ring. True if that look found work. Under prog_mtx. */
static bool reactor_stop_polling(hccl_reactor_t *r)
{
    reactor_set_polling(r, false);
    return reactor_poll_once(r);
}

/*
 * The progress thread, after an event: spins until spin_ns pass without progress; true if
 * the last look found work. Sockets and timers are looked at every few rounds (an
 * epoll_wait of 0). Each idle round lets go of prog_mtx and yields, so that ranks sharing a
 * core with us still run and a waiter may take over; when one does, this thread sleeps.
 */
static bool reactor_spin(hccl_reactor_t *r)
{
    int64_t idle_since = hccl_now_ns();
    bool found;

    if (pthread_mutex_trylock(&r->prog_mtx) != 0)
        return false; /* a waiter drives: it clears the flags when it stops */
    r->thread_spinning = true;
    atomic_store(&r->orphan, false);
    reactor_set_polling(r, true);
    for (unsigned round = 0; !atomic_load(&r->stopping); round++) {
        bool moved = reactor_poll_once(r);
        if ((round & 7) == 7)
            event_base_loop(r->base, EVLOOP_NONBLOCK);
        if (moved) {
            idle_since = hccl_now_ns();
            continue;
        }
        /* Nothing in flight: linger only as long as a next post would be cheap to catch, and
         * not at all where a waiter drives its own calls. */
        if (atomic_load(&r->pending) == 0 && (r->drivable || hccl_now_ns() - idle_since > r->spin_ns / 4))
            break;
        if (hccl_now_ns() - idle_since > r->spin_ns)
            break;
        pthread_mutex_unlock(&r->prog_mtx);
        sched_yield();
        if (pthread_mutex_trylock(&r->prog_mtx) != 0) {
            /* A waiter took over: sleep until it is done rather than take turns with it. */
            pthread_mutex_lock(&r->prog_mtx);
            break;
        }
    }
    r->thread_spinning = false;
    found = reactor_stop_polling(r);
    pthread_mutex_unlock(&r->prog_mtx);
    return found;
}

static void *reactor_thread_main(void *arg)
{
    hccl_reactor_t *r = arg;

    hccl_log_set_rank(r->rank);
    tl_running = r;
    while (!atomic_load(&r->stopping)) {
        if (event_base_loop(r->base, EVLOOP_ONCE) < 0) {
            HCCL_WARN("reactor: event_base_loop failed; progress thread stops");
            break;
        }
        while (r->spin_ns > 0 && !atomic_load(&r->stopping) && reactor_spin(r))
            ;
    }
    hccl_reactor_enter(r);
    atomic_store(&r->orphan, false);
    reactor_stop_polling(r);
    reactor_run_posts(r);
    hccl_reactor_leave(r);
    return NULL;
}

/* How long a driving waiter polls without a system call before it yields between polls. */
#define HELP_RELAX_NS 5000

bool hccl_reactor_help_until(hccl_reactor_t *r, const hccl_help_t *h)
{
    const hccl_reactor_t *outer = tl_running;
    int64_t idle_since;
    bool relax;

    if (!r->drivable || r->spin_ns <= 0 || pthread_mutex_trylock(&r->prog_mtx) != 0)
        return false;
    if (!r->drivable) {
        /* Stopped meanwhile: the pollers' links may be gone. */
        pthread_mutex_unlock(&r->prog_mtx);
        return false;
    }
    tl_running = r; /* what it runs is the reactor's work: a blocking call from it is refused */
    atomic_store(&r->orphan, false);
    reactor_set_polling(r, true);
    idle_since = 0; /* set after the first idle rounds */
    relax = !r->cores_shared;
    for (unsigned idle = 0;;) {
        /* What the posts finish is looked at before the links are: a call that they complete
         * returns without another look at the sockets. */
        bool moved = reactor_run_all_posts(r);
        if (moved && h->done(h->arg))
            break;
        moved = reactor_run_pollers(r) || moved;
        if (h->done(h->arg))
            break;
        if (moved) {
            idle = 0;
            relax = !r->cores_shared;
            continue;
        }
        /* The clock is read once per 8 idle rounds, not on every step that moves. */
        if ((++idle & 7) == 0) {
            int64_t now = hccl_now_ns();
            if (idle == 8) {
                idle_since = now;
            } else if (now - idle_since > r->wait_spin_ns) {
                if (h->give_up)
                    h->give_up(h->arg);
                break;
            }
            relax = relax && now - idle_since < HELP_RELAX_NS;
        }
        /* Where ranks share cores, yielding is what lets the rank we wait for run. Otherwise a
         * short wait (a small message's answer) is caught without a system call; a longer one
         * backs off, since polling the rings without pause slows the peer writing them. */
        if (relax)
            hccl_cpu_relax();
        else
            sched_yield();
    }
    /* A spinning progress thread still polls and clears the flags itself when it stops. With
     * nothing left in flight, the flags stay set for the caller's next call (see orphan). */
    if (!r->thread_spinning) {
        if (atomic_load(&r->pending) == 0) {
            atomic_store(&r->orphan, true);
            /* A post that saw the flags set before they were orphaned did not ring. */
            if (atomic_load(&r->post_head)) {
                atomic_store(&r->orphan, false);
                reactor_stop_polling(r);
            }
        } else {
            reactor_stop_polling(r);
        }
    }
    tl_running = outer;
    pthread_mutex_unlock(&r->prog_mtx);
    return true;
}

typedef struct {
    const int *state;
    int done;
} help_state_t;

static bool help_state_done(void *arg)
{
    const help_state_t *w = arg;

    return __atomic_load_n(w->state, __ATOMIC_ACQUIRE) == w->done;
}

bool hccl_reactor_help(hccl_reactor_t *r, const int *state, int done)
{
    help_state_t w = {state, done};

    if (__atomic_load_n(state, __ATOMIC_ACQUIRE) == done)
        return true;
    return hccl_reactor_help_until(r, &(hccl_help_t){help_state_done, NULL, &w});
}

void hccl_reactor_post_then_help(hccl_reactor_t *r, hccl_post_t *post)
{
    hccl_post_t *head = post_push(r, post);

    /*
     * No ring when the caller's hccl_reactor_help will find the post: it runs unless the lock
     * is held, and whoever holds it looks at the queue before it lets go (the progress thread
     * spins after every event; a waiter's last look, or the spinning thread's).
     */
    if (head == NULL && !atomic_load(&r->polling) && !(r->drivable && r->spin_ns > 0))
        hccl_reactor_wake(r);
}

/* Nobody polls: the progress thread sleeps, or a waiter left the flags set (orphan). */
static bool reactor_idle(const hccl_reactor_t *r)
{
    return !atomic_load(&r->polling) || atomic_load(&r->orphan);
}

void hccl_reactor_post_and_start(hccl_reactor_t *r, hccl_post_t *post)
{
    const hccl_reactor_t *outer = tl_running;

    /*
     * Nobody runs the reactor's work now: start it on this thread, so that its first sends go
     * out at once instead of after the progress thread's wake-up. What it then waits for
     * wakes the progress thread as any message does: the flags are cleared first. Not where
     * ranks share cores: there it makes more context switches per collective, not fewer.
     */
    if (outer != r && r->drivable && !r->cores_shared && reactor_idle(r) &&
        pthread_mutex_trylock(&r->prog_mtx) == 0) {
        if (r->drivable && reactor_idle(r)) {
            post_push(r, post);
            tl_running = r;
            if (atomic_load(&r->orphan)) {
                /* Peers did not ring while the flags were set: one look at the rings too. */
                atomic_store(&r->orphan, false);
                reactor_stop_polling(r);
            } else {
                reactor_run_posts(r);
            }
            tl_running = outer;
            pthread_mutex_unlock(&r->prog_mtx);
            return;
        }
        pthread_mutex_unlock(&r->prog_mtx);
    }
    hccl_reactor_post(r, post);
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
    rc = pthread_create(&r->thread, NULL, reactor_thread_main, r);
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
    reactor_run_posts(r);
    hccl_reactor_leave(r);
    pthread_mutex_lock(&r->drive_mtx);
    r->dead = true;
    pthread_mutex_unlock(&r->drive_mtx);
    if (r->wake_ev)
        event_free(r->wake_ev);
    r->wake_ev = NULL;
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
    return !reactor_idle(r);
}

bool hccl_reactor_posts_pending(hccl_reactor_t *r)
{
    return atomic_load_explicit(&r->post_head, memory_order_relaxed) != NULL;
}

void hccl_reactor_post(hccl_reactor_t *r, hccl_post_t *post)
{
    hccl_post_t *head = post_push(r, post);

    /* Only the push onto an empty queue rings (the reactor drains it all at once), and only
     * when the progress thread sleeps: a spinning one finds the post by itself. Both sides
     * use sequentially consistent accesses, so one of them sees the other. */
    if (head == NULL && (!atomic_load(&r->polling) || atomic_load(&r->orphan)))
        hccl_reactor_wake(r);
}

bool hccl_reactor_in_loop(const hccl_reactor_t *r)
{
    return tl_running == r;
}

static void reactor_noop(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;
}

bool hccl_reactor_in_callback(hccl_reactor_t *r)
{
    bool in_cb = false;
    int rc;

    if (!hccl_reactor_is_external(r))
        return false;
    if (tl_driving == r)
        return true;
    if (pthread_mutex_trylock(&r->drive_mtx) != 0)
        return false; /* another thread is driving it */
    if (!r->dead) {
        /* A free loop just makes progress; a running one refuses. Only then is the running event
         * safe to ask for: it is non-NULL exactly when that loop runs on this thread, i.e. we are
         * inside one of its callbacks. */
        tl_driving = r;
        rc = event_base_loop(r->base, EVLOOP_NONBLOCK);
        tl_driving = NULL;
        in_cb = rc < 0 && event_base_get_running_event(r->base) != NULL;
    }
    pthread_mutex_unlock(&r->drive_mtx);
    return in_cb;
}

bool hccl_reactor_drive(hccl_reactor_t *r, int timeout_ms)
{
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    int rc;

    if (pthread_mutex_trylock(&r->drive_mtx) != 0)
        return false;
    if (r->dead || hccl_now_ms() < r->foreign_until_ms) {
        pthread_mutex_unlock(&r->drive_mtx);
        return false;
    }
    tl_driving = r;
    if (timeout_ms <= 0) {
        rc = event_base_loop(r->base, EVLOOP_NONBLOCK);
    } else {
        /* Bound the wait with a one-shot no-op timer; loopexit would also end the user's loop. */
        event_base_once(r->base, -1, EV_TIMEOUT, reactor_noop, NULL, &tv);
        rc = event_base_loop(r->base, EVLOOP_ONCE);
    }
    tl_driving = NULL;
    /* The caller's loop runs in another thread and progresses us: do not ask libevent again
     * for a while (it warns on every refused re-entry). */
    r->foreign_until_ms = rc < 0 ? hccl_now_ms() + 1000 : 0;
    pthread_mutex_unlock(&r->drive_mtx);
    return rc >= 0;
}

int hccl_reactor_completion_fd(hccl_reactor_t *r)
{
    pthread_mutex_lock(&r->done_mtx); /* against a request becoming DONE (hccl_request_complete) */
    atomic_store(&r->completion_fd_used, true);
    pthread_mutex_unlock(&r->done_mtx);
    return r->completion_fd;
}

hcclResult_t hccl_reactor_add_poller(hccl_reactor_t *r, const hccl_poller_t *p)
{
    if (r->npollers == HCCL_REACTOR_MAX_POLLERS)
        return HCCL_FAIL(hcclInternalError, "reactor: more than %d pollers", HCCL_REACTOR_MAX_POLLERS);
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

/* ---- timers ---- */

struct hccl_timer {
    struct event *ev;
    hccl_timer_cb_t cb;
    void *arg;
    hccl_reactor_t *r;   /* borrowed */
    bool cancelled;      /* under prog_mtx: a firing that waited for the lock does nothing */
    hccl_post_t free_post;
};

static void timer_on_fire(evutil_socket_t fd, short what, void *arg)
{
    hccl_timer_t *t = arg;

    (void)fd, (void)what;
    hccl_reactor_enter(t->r);
    if (!t->cancelled)
        t->cb(t->arg);
    hccl_reactor_leave(t->r);
}

hcclResult_t hccl_timer_create(hccl_reactor_t *r, hccl_timer_cb_t cb, void *arg, hccl_timer_t **t_p)
{
    hccl_timer_t *t = hccl_calloc(1, sizeof(*t));

    if (!t)
        return HCCL_FAIL(hcclSystemError, "timer: out of memory");
    t->cb = cb;
    t->arg = arg;
    t->r = r;
    t->ev = evtimer_new(r->base, timer_on_fire, t);
    if (!t->ev) {
        hccl_free(t);
        return HCCL_FAIL(hcclSystemError, "timer: evtimer_new failed");
    }
    *t_p = t;
    return hcclSuccess;
}

void hccl_timer_arm(hccl_timer_t *t, int64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};

    t->cancelled = false;
    /* Inside a callback libevent counts from the time its loop woke, which a long turn or a
     * descheduled thread leaves far behind: the timer would fire early. */
    event_base_update_cache_time(event_get_base(t->ev));
    evtimer_add(t->ev, &tv);
}

/*
 * Never waits for a firing in progress (libevent's event_del would, and that firing may be
 * waiting for the lock our caller holds): the firing finds the timer cancelled instead.
 */
void hccl_timer_cancel(hccl_timer_t *t)
{
    if (!t)
        return;
    t->cancelled = true;
    event_del_noblock(t->ev);
}

static void timer_on_finalized(struct event *ev, void *arg)
{
    (void)ev;
    hccl_free(arg);
}

/* The event goes through libevent's finalizer: a firing still in progress on the loop's
 * thread ends before the memory does, and nobody waits for it. */
static void timer_on_free(hccl_post_t *post)
{
    hccl_timer_t *t = (hccl_timer_t *)((char *)post - offsetof(hccl_timer_t, free_post));

    event_free_finalize(0, t->ev, timer_on_finalized);
}

/* Cancelled now, freed from the loop: the timer may be the one whose callback is running. */
void hccl_timer_destroy(hccl_timer_t *t)
{
    if (!t)
        return;
    hccl_timer_cancel(t);
    t->free_post.fn = timer_on_free;
    hccl_reactor_post(t->r, &t->free_post);
}
