/*
 * A communicator's root cause (docs/api.md, "Failures").
 *
 * The first failure a rank sees, or hears of from a peer, is not reported at once: the rank
 * sends its view to every peer (the links' cause frames) and settles for a short quiet window
 * in which the views of the others arrive and merge in the one order every rank applies
 * (cause.h). Each change is sent on again, so every rank ends with the same cause, and the
 * ranks that time out pool which ranks had joined the collective. Only then does the
 * communicator fail: its requests, hcclCommGetAsyncError and every later call carry the
 * cause's code and text, and the goodbyes of its links carry the cause on. A failure a rank
 * sees after it heard of a cause (a peer closing, a transfer cut short) is its echo, not news.
 */
#include <stdio.h>
#include <string.h>

#include "base/cause.h"
#include "core/comm.h"

/*
 * How long a rank waits after the last change of its view before it fails: a few round trips
 * between ranks that share a loaded CPU, short against any exec timeout worth setting.
 */
#define HCCL_CAUSE_SETTLE_MS 50

struct hccl_cause_state {
    hccl_cause_t cause; /* merged so far; kind NONE: none */
    /* The first request that failed on its own while the communicator stayed sound (a
     * mismatch every rank saw, say): what an abort passes on if nothing else failed. */
    hccl_cause_t noted;
    bool final;                /* settled: the communicator has failed with it */
    bool aborting;             /* hcclCommAbort: this rank's requests end hcclAborted */
    bool closed;               /* being freed: causes still queued are dropped */
    hccl_timer_t *timer;       /* the settle window */
    struct hcclRequest **held; /* failed requests waiting for the settled cause */
    int nheld, capheld;
};

typedef struct {
    hccl_post_t post;
    struct hcclComm *comm;
    hccl_cause_t cause;
} cause_post_t;

static void cause_publish(struct hcclComm *comm)
{
    hccl_cause_state_t *cs = comm->cause_state;

    pthread_mutex_lock(&comm->mtx);
    hccl_cause_render(&cs->cause, comm->async_msg, sizeof(comm->async_msg));
    atomic_store(&comm->async_error, (hcclResult_t)cs->cause.code);
    pthread_mutex_unlock(&comm->mtx);
}

static void cause_release_held(struct hcclComm *comm)
{
    hccl_cause_state_t *cs = comm->cause_state;

    while (cs->nheld > 0) {
        struct hcclRequest *req = cs->held[--cs->nheld];
        hccl_coll_finish(comm, req, cs->aborting ? hcclAborted : (hcclResult_t)cs->cause.code,
                         NULL);
    }
}

static void cause_finalize(struct hcclComm *comm)
{
    hccl_cause_state_t *cs = comm->cause_state;

    if (cs->final)
        return;
    cs->final = true;
    cs->cause.flags |= HCCL_CAUSE_FINAL;
    hccl_timer_destroy(cs->timer);
    cs->timer = NULL;
    cause_publish(comm);
    HCCL_WARN("rank %d: the communicator fails: %s", comm->rank, comm->async_msg);
    hccl_comm_fail_now(comm, (hcclResult_t)cs->cause.code, comm->async_msg);
    cause_release_held(comm);
}

static void cause_on_settled(void *arg)
{
    cause_finalize(arg);
}

/* A timeout's pool: this rank had joined the collective if it posted it. */
static bool cause_contribute(struct hcclComm *comm, hccl_cause_t *c)
{
    if (c->kind != HCCL_CAUSE_TIMEOUT || atomic_load(&comm->next_seq) <= c->seq)
        return false;
    return hccl_cause_see(c, comm->rank);
}

/* Reactor thread. local: seen here, not heard from a peer. */
static void cause_raise(struct hcclComm *comm, const hccl_cause_t *c, bool local)
{
    hccl_cause_state_t *cs = comm->cause_state;
    bool changed;

    if (cs->final)
        return;
    /* Once a cause is known, a connection that breaks or a peer that reports a remote error
     * is its consequence. */
    if (local && cs->cause.kind != HCCL_CAUSE_NONE &&
        (c->kind == HCCL_CAUSE_LOST || c->code == hcclRemoteError) &&
        !(c->kind == HCCL_CAUSE_LOST && cs->cause.kind == HCCL_CAUSE_LOST &&
          c->origin == cs->cause.origin))
        return;
    if (c->flags & HCCL_CAUSE_FINAL) {
        hccl_cause_adopt_final(&cs->cause, c);
        /* A peer has settled and gone: its view is the one the others end with too. */
        cs->cause.flags &= ~HCCL_CAUSE_FINAL;
        cause_finalize(comm);
        return;
    }
    changed = hccl_cause_merge(&cs->cause, c);
    changed |= cause_contribute(comm, &cs->cause);
    if (!changed)
        return;
    cause_publish(comm);
    for (int id = 0; id < HCCL_LINK_MAX; id++) {
        const hccl_link_ops_t *ops = hccl_link_by_id(id);
        if (comm->link_ctx[id] && !comm->links_aborted && HCCL_LINK_HAS_OP(ops, notify))
            ops->notify(comm->link_ctx[id], &cs->cause);
    }
    if (!cs->timer &&
        hccl_timer_create(comm->reactor, cause_on_settled, comm, &cs->timer) != hcclSuccess) {
        cause_finalize(comm); /* no window without a timer: fail at once */
        return;
    }
    hccl_timer_arm(cs->timer, HCCL_CAUSE_SETTLE_MS);
}

static void cause_on_post(hccl_post_t *post)
{
    cause_post_t *p = (cause_post_t *)post;

    if (p->comm->cause_state->closed) {
        hccl_free(p); /* the reactor's last posts, with the links gone */
        return;
    }
    /* A LOST seen by this rank alone was built here; anything else came from a peer. */
    hccl_cause_t mine;
    hccl_cause_lost(&mine, p->cause.origin, p->comm->rank, p->comm->nranks);
    cause_raise(p->comm, &p->cause,
                p->cause.kind == HCCL_CAUSE_LOST &&
                    !memcmp(p->cause.seen, mine.seen, sizeof(mine.seen)));
    hccl_free(p);
}

/* Link callback (reactor thread, inside the link's processing): applied from the post queue,
 * behind the completions the link queued first; the code is visible at once. */
static void cause_on_link(void *arg, const hccl_cause_t *c)
{
    struct hcclComm *comm = arg;
    cause_post_t *p = hccl_malloc(sizeof(*p));

    pthread_mutex_lock(&comm->mtx);
    if (atomic_load(&comm->async_error) == hcclSuccess) {
        hccl_cause_render(c, comm->async_msg, sizeof(comm->async_msg));
        atomic_store(&comm->async_error, (hcclResult_t)c->code);
    }
    pthread_mutex_unlock(&comm->mtx);
    if (!p)
        return; /* the link's on_fatal that follows still fails the communicator */
    p->comm = comm;
    p->cause = *c;
    p->post.fn = cause_on_post;
    hccl_reactor_post(comm->reactor, &p->post);
}

hcclResult_t hccl_comm_cause_init(struct hcclComm *comm)
{
    comm->cause_state = hccl_calloc(1, sizeof(*comm->cause_state));
    if (!comm->cause_state)
        return HCCL_FAIL(hcclSystemError, "comm: out of memory");
    comm->env.on_cause = cause_on_link;
    comm->env.cause = &comm->cause_state->cause;
    return hcclSuccess;
}

void hccl_comm_cause_fini(struct hcclComm *comm)
{
    hccl_cause_state_t *cs = comm->cause_state;

    if (!cs)
        return;
    cs->closed = true;
    hccl_timer_destroy(cs->timer);
    cs->timer = NULL;
}

void hccl_comm_cause_free(struct hcclComm *comm)
{
    hccl_cause_state_t *cs = comm->cause_state;

    if (!cs)
        return;
    hccl_free(cs->held);
    hccl_free(cs);
    comm->cause_state = NULL;
}

void hccl_comm_fail(struct hcclComm *comm, hcclResult_t res, const char *msg)
{
    hccl_cause_state_t *cs = comm->cause_state;
    hccl_cause_t c;

    if (!cs || cs->final) {
        char text[sizeof(comm->async_msg)];
        hccl_comm_error_text(comm, text, sizeof(text));
        hccl_comm_fail_now(comm, cs ? (hcclResult_t)cs->cause.code : res, cs ? text : msg);
        return;
    }
    hccl_cause_text(&c, res, comm->rank, comm->nranks, msg);
    cause_raise(comm, &c, true);
}

void hccl_comm_fail_timeout(struct hcclComm *comm, const struct hcclRequest *req, const char *msg)
{
    char what[96];
    hccl_cause_t c;

    /* Point-to-point numbers are counted by two ranks only: nothing to pool. */
    if (req->seq & HCCL_P2P_SEQ_BIT) {
        hccl_comm_fail(comm, hcclTimeout, msg);
        return;
    }
    if (!comm->cause_state || comm->cause_state->final) {
        hccl_comm_fail(comm, hcclTimeout, msg);
        return;
    }
    hccl_request_describe(req, false, what, sizeof(what));
    hccl_cause_timeout(&c, req->seq, what, comm->params.exec_timeout_ms, comm->rank, comm->nranks);
    cause_raise(comm, &c, true);
}

void hccl_comm_cause_note(struct hcclComm *comm, hcclResult_t res, int origin, const char *text,
                          char *buf, size_t len)
{
    hccl_cause_state_t *cs = comm->cause_state;
    hccl_cause_t c;

    hccl_cause_text(&c, res, origin, comm->nranks, text);
    hccl_cause_render(&c, buf, len);
    if (cs && cs->noted.kind == HCCL_CAUSE_NONE)
        cs->noted = c;
}

void hccl_comm_cause_abort(struct hcclComm *comm)
{
    hccl_cause_state_t *cs = comm->cause_state;
    char msg[sizeof(comm->async_msg) + 96];

    cs->aborting = true;
    if (cs->cause.kind == HCCL_CAUSE_NONE && cs->noted.kind != HCCL_CAUSE_NONE)
        cs->cause = cs->noted;
    if (cs->cause.kind == HCCL_CAUSE_NONE) {
        char text[96];
        snprintf(text, sizeof(text), "rank %d aborted its communicator (no failure before)",
                 comm->rank);
        hccl_cause_text(&cs->cause, hcclRemoteError, comm->rank, comm->nranks, text);
    }
    if (!cs->final) {
        /* No window: the user wants out now; the peers settle with what was sent. */
        cs->final = true;
        cs->cause.flags |= HCCL_CAUSE_FINAL;
        hccl_timer_destroy(cs->timer);
        cs->timer = NULL;
        cause_publish(comm);
    }
    snprintf(msg, sizeof(msg), "rank %d: the communicator was aborted; %s", comm->rank,
             comm->async_msg);
    hccl_comm_fail_now(comm, hcclAborted, msg);
    cause_release_held(comm);
}

bool hccl_comm_cause_hold(struct hcclComm *comm, struct hcclRequest *req, hcclResult_t *res_p,
                          char *buf, size_t len)
{
    hccl_cause_state_t *cs = comm->cause_state;
    char what[96];

    if (!cs || *res_p == hcclSuccess)
        return false;
    if (cs->final) {
        hccl_request_describe(req, false, what, sizeof(what));
        pthread_mutex_lock(&comm->mtx);
        snprintf(buf, len, "rank %d: %s: %s%s", comm->rank, what,
                 cs->aborting ? "the communicator was aborted; " : "", comm->async_msg);
        pthread_mutex_unlock(&comm->mtx);
        /* After hcclCommAbort every request of this rank ends hcclAborted, also one whose post
         * ran after the abort's and found the communicator's error (the peers' code). */
        *res_p = cs->aborting ? hcclAborted : (hcclResult_t)cs->cause.code;
        return false;
    }
    /* A request that failed on its own while the communicator is sound ends now (its rank may
     * go on); it is noted for an abort to pass on. With the communicator's error set, a cause
     * is on its way through the post queue: the request waits for it. */
    if (cs->cause.kind == HCCL_CAUSE_NONE && atomic_load(&comm->async_error) == hcclSuccess) {
        if (cs->noted.kind == HCCL_CAUSE_NONE)
            hccl_cause_text(&cs->noted, *res_p, comm->rank, comm->nranks,
                            buf[0] ? buf : hcclGetErrorString(*res_p));
        return false;
    }
    if (cs->nheld == cs->capheld) {
        int cap = cs->capheld ? 2 * cs->capheld : 8;
        struct hcclRequest **p = hccl_realloc(cs->held, (size_t)cap * sizeof(*p));
        if (!p)
            return false; /* completes now, with its own error */
        cs->held = p;
        cs->capheld = cap;
    }
    cs->held[cs->nheld++] = req;
    return true;
}
