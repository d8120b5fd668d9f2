/*
 * Who runs the reactor: its progress thread (with bounded polling), a waiter that drives it
 * itself, a caller that starts a post on its own thread, or the caller's own loop.
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

/* The borrowed loop this thread runs inside hccl_reactor_drive right now. */
static _Thread_local HCCL_TLS_FAST const hccl_reactor_t *tl_driving;

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
        hccl_reactor_run_posts(r);
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

/*
 * A post started on its poster's thread (NULL: none): with nothing queued before it, it runs
 * at once, as the queue would run it; behind others it goes through the queue, so that one
 * poster's order holds. Under prog_mtx.
 */
static void reactor_run_first(hccl_reactor_t *r, hccl_post_t *post)
{
    if (!post)
        return;
    if (atomic_load(&r->post_head)) {
        hccl_reactor_post_push(r, post);
        hccl_reactor_run_posts(r);
        return;
    }
    post->next = NULL;
    post->fn(post);
}

/*
 * One look that leaves the polling flags set for the waiter that set them (orphaned): posts
 * made during it need no ring, since it runs them; one left after it wakes the progress
 * thread. Under prog_mtx, with orphan set.
 */
static void reactor_quiet_look(hccl_reactor_t *r, hccl_post_t *first)
{
    atomic_store(&r->orphan, false);
    reactor_run_first(r, first);
    reactor_poll_once(r);
    reactor_run_all_posts(r);
    atomic_store(&r->orphan, true);
    if (atomic_load(&r->post_head))
        hccl_reactor_wake(r);
}

/* Stops polling: clears the flags first, then runs first (NULL: none) and looks once more,
 * since a peer that saw them set did not ring. True if that look found work. Under prog_mtx. */
static bool reactor_stop_polling(hccl_reactor_t *r, hccl_post_t *first)
{
    reactor_set_polling(r, false);
    reactor_run_first(r, first);
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
    uint64_t settled;
    bool found, took_over;

    if (pthread_mutex_trylock(&r->prog_mtx) != 0)
        return false; /* a waiter drives: it clears the flags when it stops */
    if (atomic_load(&r->watch_armed) && atomic_load(&r->orphan)) {
        /* Calls come and are waited for quietly: one look, and the flags stay as they are. */
        reactor_quiet_look(r, NULL);
        pthread_mutex_unlock(&r->prog_mtx);
        return false;
    }
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
        if (atomic_load(&r->pending) == 0 &&
            (r->drivable || hccl_now_ns() - idle_since > r->spin_ns / 4))
            break;
        if (hccl_now_ns() - idle_since > r->spin_ns)
            break;
        /* Not spinning while the lock is free: a waiter that takes it over owns the flags and
         * settles them when it stops (hccl_reactor_help_until), as when this thread sleeps. */
        settled = r->flags_settled;
        r->thread_spinning = false;
        pthread_mutex_unlock(&r->prog_mtx);
        sched_yield();
        /* Someone took over: sleep until it is done rather than take turns with it. */
        took_over = pthread_mutex_trylock(&r->prog_mtx) != 0;
        if (took_over)
            pthread_mutex_lock(&r->prog_mtx);
        /* A waiter that drove meanwhile settled the flags: its decision stands. Clearing
         * them made every peer ring the next call's messages, and each ring woke this thread
         * into the same race. Anyone else (a post, a test's look) leaves them to us. */
        if (r->flags_settled != settled) {
            pthread_mutex_unlock(&r->prog_mtx);
            return false;
        }
        if (took_over)
            break;
        r->thread_spinning = true;
    }
    r->thread_spinning = false;
    found = reactor_stop_polling(r, NULL);
    pthread_mutex_unlock(&r->prog_mtx);
    return found;
}

/*
 * The watch fired: a whole period without a waiter driving while requests are pending means
 * their caller computes, so the spin that follows takes over (the flags are cleared and peers
 * ring from then on); a period without quiet posts or pending requests ends the watch. Else
 * it is armed again before the thread sleeps.
 */
void hccl_reactor_on_watch(evutil_socket_t fd, short what, void *arg)
{
    hccl_reactor_t *r = arg;

    (void)fd, (void)what;
    if (pthread_mutex_trylock(&r->prog_mtx) != 0)
        return; /* a waiter drives now */
    if (atomic_load(&r->pending) > 0 ? r->drives == r->drives_at_watch : r->quiet_posts == 0) {
        atomic_store(&r->watch_armed, false);
        atomic_store(&r->watch_wanted, false);
    }
    r->quiet_posts = 0;
    r->drives_at_watch = r->drives;
    pthread_mutex_unlock(&r->prog_mtx);
}

/* Before the progress thread sleeps: the watch runs while it is wanted, from its first
 * arming on; the timer keeps its deadline when other events wake the thread first. */
static void reactor_arm_watch(hccl_reactor_t *r)
{
    struct timeval tv;

    if (!r->watch_ev || r->watch_ns <= 0 || !atomic_load(&r->watch_wanted) ||
        evtimer_pending(r->watch_ev, NULL))
        return;
    tv.tv_sec = (time_t)(r->watch_ns / 1000000000);
    tv.tv_usec = (suseconds_t)(r->watch_ns % 1000000000 / 1000);
    if (evtimer_add(r->watch_ev, &tv) != 0 || atomic_load(&r->watch_armed))
        return;
    /* Only this thread arms and disarms the watch, so the lock is taken only to arm it anew: a
     * waiter usually holds it while its call runs, and waiting for it here cost a futex sleep
     * and wake-up per period. */
    pthread_mutex_lock(&r->prog_mtx);
    atomic_store(&r->watch_armed, true);
    r->quiet_posts = 0;
    r->drives_at_watch = r->drives;
    pthread_mutex_unlock(&r->prog_mtx);
}

void *hccl_reactor_thread_main(void *arg)
{
    hccl_reactor_t *r = arg;

    hccl_log_set_rank(r->rank);
    hccl_tl_running = r;
    while (!atomic_load(&r->stopping)) {
        reactor_arm_watch(r);
        if (event_base_loop(r->base, EVLOOP_ONCE) < 0) {
            HCCL_WARN("reactor: event_base_loop failed; progress thread stops");
            break;
        }
        while (r->spin_ns > 0 && !atomic_load(&r->stopping) && reactor_spin(r))
            ;
    }
    hccl_reactor_enter(r);
    atomic_store(&r->orphan, false);
    reactor_stop_polling(r, NULL);
    hccl_reactor_run_posts(r);
    hccl_reactor_leave(r);
    return NULL;
}

/* How long a driving waiter polls without a system call before it yields between polls. */
#define HELP_RELAX_NS 5000

bool hccl_reactor_help_until(hccl_reactor_t *r, const hccl_help_t *h)
{
    const hccl_reactor_t *outer = hccl_tl_running;
    int64_t idle_since;
    bool relax, gave_up = false;

    if (!r->drivable || r->spin_ns <= 0 || pthread_mutex_trylock(&r->prog_mtx) != 0)
        return false;
    if (!r->drivable) {
        /* Stopped meanwhile: the pollers' links may be gone. */
        pthread_mutex_unlock(&r->prog_mtx);
        return false;
    }
    hccl_tl_running =
        r; /* what it runs is the reactor's work: a blocking call from it is refused */
    r->drives++;
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
                gave_up = true;
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
     * nothing left in flight, the flags stay set for the caller's next call (see orphan); so
     * they do with requests left in flight while the watch is armed: their wait usually comes
     * next (several Async calls, then a wait for each), and the watch takes them over if it
     * does not. Clearing them there had every peer ring and woke the progress thread into a
     * race with that wait: two context switches per call, twice the time, 2 in flight. A
     * waiter that gave up is about to sleep, though: the progress thread takes over at once,
     * with peers ringing; left set, the flags had it take only a quiet look, and the requests
     * waited for the watch's next period (without the watch, for ever). */
    if (!r->thread_spinning) {
        r->flags_settled++;
        if (!gave_up && (atomic_load(&r->pending) == 0 || atomic_load(&r->watch_armed))) {
            atomic_store(&r->orphan, true);
            /* A post that saw the flags set before they were orphaned did not ring. */
            if (atomic_load(&r->post_head)) {
                atomic_store(&r->orphan, false);
                reactor_stop_polling(r, NULL);
            }
        } else {
            reactor_stop_polling(r, NULL);
        }
    }
    hccl_tl_running = outer;
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

void hccl_reactor_look(hccl_reactor_t *r)
{
    const hccl_reactor_t *outer = hccl_tl_running;

    if (outer == r || !r->drivable || r->spin_ns <= 0 || pthread_mutex_trylock(&r->prog_mtx) != 0)
        return;
    if (r->drivable) {
        hccl_tl_running = r;
        r->drives++;
        if (atomic_load(&r->orphan))
            reactor_quiet_look(r, NULL);
        else
            reactor_poll_once(r);
        hccl_tl_running = outer;
    }
    pthread_mutex_unlock(&r->prog_mtx);
}

void hccl_reactor_post_then_help(hccl_reactor_t *r, hccl_post_t *post)
{
    hccl_post_t *head = hccl_reactor_post_push(r, post);

    /*
     * No ring when the caller's hccl_reactor_help will find the post: it runs unless the lock
     * is held, and whoever holds it looks at the queue before it lets go (the progress thread
     * spins after every event; a waiter's last look, or the spinning thread's).
     */
    if (head == NULL && !atomic_load(&r->polling) && !(r->drivable && r->spin_ns > 0))
        hccl_reactor_wake(r);
}

/* An Async call found the flags left set by a waiter: the progress thread arms its watch
 * before it sleeps again, woken once for it where it sleeps now. */
static void reactor_want_watch(hccl_reactor_t *r)
{
    if (r->watch_ev && !atomic_exchange(&r->watch_wanted, true))
        hccl_reactor_wake(r);
}

void hccl_reactor_post_and_start(hccl_reactor_t *r, hccl_post_t *post)
{
    const hccl_reactor_t *outer = hccl_tl_running;
    bool quiet = atomic_load(&r->orphan) && atomic_load(&r->watch_armed);

    /*
     * Nobody runs the reactor's work now: start it on this thread, so that its first sends go
     * out at once instead of after the progress thread's wake-up. What it then waits for
     * wakes the progress thread as any message does (the flags are cleared first), unless
     * the watch is armed. Where ranks share cores only then: a wake-up per call there makes
     * more context switches per collective, not fewer.
     */
    if (outer != r && r->drivable && (!r->cores_shared || quiet) && hccl_reactor_idle(r) &&
        pthread_mutex_trylock(&r->prog_mtx) == 0) {
        quiet = atomic_load(&r->orphan) && atomic_load(&r->watch_armed);
        if (r->drivable && hccl_reactor_idle(r) && (!r->cores_shared || quiet)) {
            hccl_tl_running = r;
            if (quiet) {
                /* The watch takes over if nobody drives: the flags stay set, and peers did
                 * not ring while they were, so one look at the rings too. */
                r->quiet_posts++;
                reactor_quiet_look(r, post);
            } else if (atomic_load(&r->orphan)) {
                reactor_want_watch(r);
                atomic_store(&r->orphan, false);
                reactor_stop_polling(r, post);
            } else {
                reactor_run_first(r, post);
            }
            hccl_tl_running = outer;
            pthread_mutex_unlock(&r->prog_mtx);
            return;
        }
        pthread_mutex_unlock(&r->prog_mtx);
    }
    if (atomic_load(&r->orphan))
        reactor_want_watch(r);
    hccl_reactor_post(r, post);
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
