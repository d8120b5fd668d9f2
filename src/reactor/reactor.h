/*
 * The reactor: one libevent event_base per communicator, driven either by the
 * communicator's own progress thread or by the caller's loop; a post queue
 * that any thread may push to; timers; and requests (wait, test, callback,
 * completion fd).
 */
#ifndef HCCL_REACTOR_H
#define HCCL_REACTOR_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"

struct event_base;
struct event;

typedef struct hccl_reactor hccl_reactor_t;

/* An item of the post queue; embedded in what is posted. fn runs on the reactor. */
typedef struct hccl_post {
    struct hccl_post *next;
    void (*fn)(struct hccl_post *post);
} hccl_post_t;

/*
 * external NULL: a private event_base run by a progress thread started with
 * hccl_reactor_start(). Otherwise events go into the caller's base (borrowed).
 */
hcclResult_t hccl_reactor_create(struct event_base *external, int rank, hccl_reactor_t **r_p);
/* Stops the progress thread, runs what is still posted, frees. Accepts NULL. */
void hccl_reactor_destroy(hccl_reactor_t *r);
hcclResult_t hccl_reactor_start(hccl_reactor_t *r);
/* Joins the progress thread (if any); the reactor stays usable from the caller's thread. */
void hccl_reactor_stop(hccl_reactor_t *r);
struct event_base *hccl_reactor_base(hccl_reactor_t *r);
bool hccl_reactor_is_external(const hccl_reactor_t *r);

/* Any thread: queues post->fn to run on the reactor and wakes it. */
void hccl_reactor_post(hccl_reactor_t *r, hccl_post_t *post);
/* Posts queued and not run yet (a hint: another thread may push one at any time). */
bool hccl_reactor_posts_pending(hccl_reactor_t *r);
/* With its work held: a thread polls the links now (a waiter driving, or the progress thread
 * spinning), and runs the pollers again before it stops polling. */
bool hccl_reactor_polled(const hccl_reactor_t *r);
/* True while the calling thread runs this reactor's work (its thread, or a callback of it). */
bool hccl_reactor_in_loop(const hccl_reactor_t *r);

/*
 * Runs the loop once from the calling thread (external reactors, or to
 * make progress while no thread does): at most timeout_ms of waiting,
 * 0 = do not wait. Returns false when another thread is driving it.
 */
bool hccl_reactor_drive(hccl_reactor_t *r, int timeout_ms);
/* True inside a callback of the caller's event_base loop on this thread (external reactors). */
bool hccl_reactor_in_callback(hccl_reactor_t *r);

/*
 * Something the progress thread checks while it spins: poll() makes whatever progress is
 * ready without blocking and says whether there was any; set_polling() tells the other side
 * (e.g. a peer process) whether it must ring a doorbell to be noticed. Registered before
 * hccl_reactor_start.
 */
#define HCCL_REACTOR_MAX_POLLERS 4
typedef struct {
    bool (*poll)(void *arg);
    void (*set_polling)(void *arg, bool on);
    void *arg;
} hccl_poller_t;
hcclResult_t hccl_reactor_add_poller(hccl_reactor_t *r, const hccl_poller_t *p);
/* Every event callback brackets its work with these: a waiter may be running the reactor. */
void hccl_reactor_enter(hccl_reactor_t *r);
void hccl_reactor_leave(hccl_reactor_t *r);
/* hccl_reactor_enter giving up after timeout_ms (diagnostics: a stuck holder must not hang it). */
bool hccl_reactor_enter_timed(hccl_reactor_t *r, int timeout_ms);
/* The pollers reach every link: a thread that waits may run the reactor's work itself. */
void hccl_reactor_set_drivable(hccl_reactor_t *r, bool drivable);
/* More ranks on this host than cores to run them (the default): a driving waiter yields the
 * core while it waits, instead of spinning on it. */
void hccl_reactor_set_cores_shared(hccl_reactor_t *r, bool shared);
/*
 * Called by a thread waiting for *state to become done: when the reactor is drivable and
 * free, runs its posts and pollers on this thread until that happens or spin_ns pass without
 * progress. False when it could not (then the caller just waits).
 */
bool hccl_reactor_help(hccl_reactor_t *r, const int *state, int done);
/* The same for any condition: done(arg) after each look at the posts and pollers; give_up(arg),
 * if set, when the spin bound passes first. Both run with the reactor's work held. */
typedef struct {
    bool (*done)(void *arg);
    void (*give_up)(void *arg);
    void *arg;
} hccl_help_t;
bool hccl_reactor_help_until(hccl_reactor_t *r, const hccl_help_t *h);
/* One look at the posts and pollers on this thread when nobody else is running them (a
 * caller testing a request); the polling flags stay as they are. */
void hccl_reactor_look(hccl_reactor_t *r);
/* Posts without waking the progress thread when the caller is about to help (a blocking call). */
void hccl_reactor_post_then_help(hccl_reactor_t *r, hccl_post_t *post);
/* Posts, and runs the post queue on the calling thread when nobody else is running it (and
 * ranks do not share cores). While the progress thread watches (reactor_impl.h), a post that
 * finds the polling flags left set by a waiter leaves them so. */
void hccl_reactor_post_and_start(hccl_reactor_t *r, hccl_post_t *post);
/* How long the progress thread and waiters spin without progress before they sleep (0: never). */
void hccl_reactor_set_spin(hccl_reactor_t *r, int64_t spin_ns);
int64_t hccl_reactor_spin_ns(const hccl_reactor_t *r);

/* Timers (reactor thread only). */
typedef void (*hccl_timer_cb_t)(void *arg);
typedef struct hccl_timer hccl_timer_t;
hcclResult_t hccl_timer_create(hccl_reactor_t *r, hccl_timer_cb_t cb, void *arg,
                               hccl_timer_t **t_p);
void hccl_timer_arm(hccl_timer_t *t, int64_t ms);
void hccl_timer_cancel(hccl_timer_t *t);
void hccl_timer_destroy(hccl_timer_t *t);

/* Completion notification shared by the requests of one reactor. */
int hccl_reactor_completion_fd(hccl_reactor_t *r);

/*
 * Work in flight, as the owner counts it (a request from its posting until after its
 * completion, or anything else a destroy must wait for): the reactor's own decisions read it
 * (whether to keep watching, whether a waiter leaves the polling flags set), and
 * hccl_reactor_wait_idle waits for it to reach zero. Any thread.
 */
void hccl_reactor_count(hccl_reactor_t *r);
void hccl_reactor_uncount(hccl_reactor_t *r);
int hccl_reactor_pending(const hccl_reactor_t *r);
/* Until nothing is counted in: driving a borrowed loop while nobody else does. Not from the
 * reactor's own work. */
void hccl_reactor_wait_idle(hccl_reactor_t *r);

/* ---- requests (request.c) ---- */

typedef void (*hccl_request_cb_t)(struct hcclRequest *req, hcclResult_t result, void *arg);

enum { HCCL_REQ_PENDING = 0, HCCL_REQ_COMPLETING = 1, HCCL_REQ_DONE = 2 };

struct hcclRequest {
    uint32_t magic;
    atomic_int refs;                /* the user's handle + a completer's around the callback */
    int state;                      /* HCCL_REQ_*, written under the reactor's done lock;
                                       DONE last, with release, so it may be read without it */
    hcclResult_t result;
    char *errmsg;                   /* owned; the failure text, NULL on success */
    hccl_reactor_t *reactor;        /* borrowed */
    hccl_request_cb_t cb;
    void *cb_arg;
    hccl_post_t post;               /* queue link while posted */
    void *owner;                    /* borrowed: what runs the request (the communicator) */
    struct hcclRequest *timed_prev; /* the communicator's requests under the exec timeout */
    struct hcclRequest *timed_next;
    void *run;                      /* borrowed: the executor's run while it is in flight */
    void *lane_op;                  /* owned by the lane while queued there (sched/lane.h) */
    uint64_t seq;                   /* collective sequence number */
    int64_t deadline_ms;            /* the exec timeout's, 0: not under it */
    /* the call */
    int coll;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    int dtype;
    int op;
    int root;                       /* Broadcast/Reduce root, Send/Recv peer */
    size_t *v;                      /* owned: AlltoAllv's counts and displacements (4 x nranks) */
    void *check;                    /* owned: HCCL_CHECK's signature table while it is compared */
    struct hcclRequest *next_checking; /* the communicator's requests being checked, in order */
    bool check_passed;              /* every rank called the same: it starts in its turn */
    struct hcclRequest *next_self;  /* the communicator's queue of sends/receives to itself */
    size_t ext_bytes;               /* the room after the request, for its runner's state */
    void *ext;                      /* there (NULL: none), freed with the request */
};

/* A request with ext_bytes of room after it for what runs it (one allocation, not two). */
hcclResult_t hccl_request_create(hccl_reactor_t *r, size_t ext_bytes, struct hcclRequest **req_p);
/* Drops one reference; frees at zero. */
void hccl_request_release(struct hcclRequest *req);
/*
 * Reactor side: records res (and the text, copied), runs the callback, then
 * marks done, wakes waiters and bumps the completion fd. Without a callback it
 * does not touch req once it is done (its waiter may free it then). The owner,
 * which counted the request in, counts it out after this.
 */
void hccl_request_complete(struct hcclRequest *req, hcclResult_t res, const char *errmsg);
bool hccl_request_is_done(struct hcclRequest *req);

#endif /* HCCL_REACTOR_H */
