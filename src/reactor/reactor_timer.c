/*
 * Timers on the reactor's event_base.
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

struct hccl_timer {
    struct event *ev;
    hccl_timer_cb_t cb;
    void *arg;
    hccl_reactor_t *r; /* borrowed */
    bool cancelled;    /* under prog_mtx: a firing that waited for the lock does nothing */
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
