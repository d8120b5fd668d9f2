/* The reactor's state, shared by reactor*.c and request.c only. */
#ifndef HCCL_REACTOR_IMPL_H
#define HCCL_REACTOR_IMPL_H

#include <event2/event.h>

#include "reactor/reactor.h"

struct hccl_reactor {
    struct event_base *base;       /* owned when owns_base */
    bool owns_base;
    int rank;                      /* for the progress thread's log prefix */
    pthread_t thread;
    bool thread_started;
    atomic_bool stopping;
    int wake_fd;                   /* eventfd rung by posters */
    struct event *wake_ev;
    _Atomic(hccl_post_t *) post_head; /* Treiber stack, newest first */
    pthread_mutex_t drive_mtx;     /* held while a waiter drives an external loop */
    bool dead;                     /* under drive_mtx: the base is gone, nobody may drive */
    int64_t foreign_until_ms;      /* under drive_mtx: the loop runs in another thread; retry then */
    atomic_int refs;               /* the owner + every live request: the wait state outlives
                                      the communicator while a user still holds a request */
    pthread_mutex_t done_mtx;      /* request state transitions */
    pthread_cond_t done_cond;
    int completion_fd;             /* eventfd counter of completed requests */
    atomic_bool completion_fd_used; /* written only once someone asked for it: a syscall less */
    /* Polling: after any event the progress thread keeps checking the post queue and the
     * pollers for spin_ns without progress before it sleeps in epoll, because a sleep and
     * wake-up costs far more than a small collective. */
    int64_t spin_ns;
    int64_t wait_spin_ns;          /* a driving waiter's bound: it has nothing else to do */
    bool cores_shared;             /* more ranks on this host than cores: waiters yield */
    atomic_bool polling;           /* the progress thread is spinning: posters need not ring */
    atomic_int pending;            /* work the owner counted in and not yet out: its
                                      requests in flight (hccl_reactor_count) */
    atomic_int idle_waiters;       /* threads in hccl_reactor_wait_idle (done_cond) */
    hccl_poller_t pollers[HCCL_REACTOR_MAX_POLLERS];
    int npollers;
    /* Whoever runs the reactor's work holds prog_mtx (recursive: the progress thread's spin
     * runs libevent callbacks that take it again): the progress thread, a libevent callback,
     * or a waiter that drives the communicator itself (hccl_reactor_help). */
    pthread_mutex_t prog_mtx;
    atomic_bool drivable;          /* every link can be polled: a waiter may drive */
    bool thread_spinning;          /* under prog_mtx: the progress thread is in its spin and
                                      clears the polling flags when it stops */
    uint64_t flags_settled;        /* under prog_mtx: how many times a waiter that stopped
                                      driving decided the flags (hccl_reactor_help_until) */
    /* A waiter that finished with nothing else in flight (or with the watch armed) leaves the
     * polling flags set, so that peers do not ring for what only a next call can use; that
     * call either drives itself or posts, and a post rings while the flags are orphaned. */
    atomic_bool orphan;            /* flags set, nobody polling */
    /* The watch: while it is armed, a post under orphaned flags leaves them set, so that an
     * Async call followed by its wait costs no doorbell on the peers and no wake-up here. The
     * progress thread then wakes every watch period and takes over the requests that nobody
     * drove for a whole period (an Async call whose caller computes instead of waiting);
     * after a period without such posts it stops watching. */
    struct event *watch_ev;        /* the progress thread's timer (owned base only) */
    int64_t watch_ns;              /* its period: HCCL_WATCH_PERIODS spins */
    atomic_bool watch_wanted;      /* a post found the flags orphaned and no watch armed */
    atomic_bool watch_armed;       /* changed under prog_mtx and only by the progress thread
                                      (which so reads it without the lock): set with the timer
                                      pending; posts may then leave the flags set */
    uint64_t quiet_posts;          /* under prog_mtx: posts that left them set, this period */
    uint64_t drives;               /* under prog_mtx: waiters that drove, ever */
    uint64_t drives_at_watch;      /* the progress thread's: drives when the watch last fired */
};

/* The reactor whose work this thread is running right now (reactor.c). */
extern _Thread_local HCCL_TLS_FAST const hccl_reactor_t *hccl_tl_running;

/* The watch period, in spin periods: long enough that its wake-ups cost a few percent of a
 * core, short enough that an Async call left alone still starts soon (docs/design.md). */
#define HCCL_WATCH_PERIODS 4

/* The watch timer's callback (reactor_drive.c). */
void hccl_reactor_on_watch(evutil_socket_t fd, short what, void *arg);

/* Runs the posts queued now, in posting order. */
void hccl_reactor_run_posts(hccl_reactor_t *r);
/* The progress thread (reactor_drive.c). */
void *hccl_reactor_thread_main(void *arg);

/* Pushes post onto the queue; returns the head it found (NULL: the queue was empty). */
static inline hccl_post_t *hccl_reactor_post_push(hccl_reactor_t *r, hccl_post_t *post)
{
    hccl_post_t *head = atomic_load(&r->post_head);

    do {
        post->next = head;
    } while (!atomic_compare_exchange_weak(&r->post_head, &head, post));
    return head;
}

/* Nobody polls: the progress thread sleeps, or a waiter left the flags set (orphan). */
static inline bool hccl_reactor_idle(const hccl_reactor_t *r)
{
    return !atomic_load(&r->polling) || atomic_load(&r->orphan);
}

void hccl_reactor_wake(hccl_reactor_t *r);
void hccl_reactor_retain(hccl_reactor_t *r);
void hccl_reactor_release(hccl_reactor_t *r);

#endif /* HCCL_REACTOR_IMPL_H */
