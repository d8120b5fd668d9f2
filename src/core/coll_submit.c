/* Submission of a checked call: its request, its posting, and its start on the reactor thread. */
#include <stdio.h>
#include <string.h>

#include "core/coll.h"
#include "core/fault.h"

/* Takes req off the exec timeout's list (reactor thread). */
static void coll_untime(struct hcclComm *comm, struct hcclRequest *req)
{
    if (!req->deadline_ms)
        return;
    *(req->timed_prev ? &req->timed_prev->timed_next : &comm->timed_head) = req->timed_next;
    *(req->timed_next ? &req->timed_next->timed_prev : &comm->timed_tail) = req->timed_prev;
    req->timed_prev = req->timed_next = NULL;
    req->deadline_ms = 0;
}

void hccl_coll_finish(struct hcclComm *comm, struct hcclRequest *req, hcclResult_t res,
                      const char *msg)
{
    uint64_t seq = req->seq;
    char text[1024];

    coll_untime(comm, req);
    req->run = NULL;
    /* A failure reports the communicator's root cause, once it has settled (comm_cause.c). */
    if (res != hcclSuccess) {
        snprintf(text, sizeof(text), "%s", msg ? msg : "");
        if (hccl_comm_cause_hold(comm, req, &res, text, sizeof(text)))
            return;
        msg = text;
    }
    hccl_request_complete(req, res, msg); /* req may be gone after this */
    if (comm->faults) {
        /* Before the count drops: once it is zero, a destroy may go on. */
        if (hccl_reactor_pending(comm->reactor) == 1)
            hccl_fault_point(comm, HCCL_FAULT_AT_IDLE, seq);
    }
    /* Last: what this touches of comm stays valid once the count is zero, since destroy takes
     * the progress lock that this reactor work holds (hccl_reactor_stop) before it frees. */
    hccl_reactor_uncount(comm->reactor);
}

void hccl_request_describe(const struct hcclRequest *req, bool detail, char *buf, size_t len)
{
    hccl_coll_t coll = (hccl_coll_t)req->coll;
    bool p2p = coll == HCCL_COLL_SEND || coll == HCCL_COLL_RECV;
    size_t o;

    if (p2p)
        snprintf(buf, len, "%s #%llu %s rank %d", hccl_coll_name(coll),
                 (unsigned long long)(req->seq & ~HCCL_P2P_SEQ_BIT),
                 coll == HCCL_COLL_SEND ? "to" : "from", req->root);
    else
        snprintf(buf, len, "%s seq %llu", hccl_coll_name(coll), (unsigned long long)req->seq);
    if (!detail)
        return;
    o = strlen(buf);
    o += (size_t)snprintf(buf + o, len - o, " (%zu x %s", req->count,
                          hccl_dtype_name((hcclDataType_t)req->dtype));
    if (o < len && (coll == HCCL_COLL_ALLREDUCE || coll == HCCL_COLL_REDUCE ||
                    coll == HCCL_COLL_REDUCESCATTER))
        o += (size_t)snprintf(buf + o, len - o, ", %s", hccl_op_name((hcclRedOp_t)req->op));
    if (o < len && (coll == HCCL_COLL_BROADCAST || coll == HCCL_COLL_REDUCE))
        o += (size_t)snprintf(buf + o, len - o, ", root %d", req->root);
    if (o < len)
        snprintf(buf + o, len - o, ")");
}

static void coll_on_run_done(hccl_run_t *run, hcclResult_t res, const char *msg, void *arg)
{
    struct hcclRequest *req = arg;
    struct hcclComm *comm = req->owner;
    char text[768];

    char what[96];

    (void)run;
    if (res == hcclSuccess) {
        hccl_coll_finish(comm, req, res, NULL);
        return;
    }
    hccl_request_describe(req, false, what, sizeof(what));
    snprintf(text, sizeof(text), "%s (%zu x %s): %s", what, req->count, hccl_dtype_name(req->dtype),
             msg ? msg : "");
    hccl_coll_finish(comm, req, res, text);
}

static void coll_on_timeout(void *arg)
{
    struct hcclRequest *req = arg;
    struct hcclComm *comm = req->owner;
    char msg[512], peers[256] = "", what[96];
    const char *failed_msg, *waiting;
    bool posted = false;

    if (req->run && hccl_exec_run_finishing(req->run))
        return; /* it ended just now; its completion is queued */
    if (hccl_comm_apply_queued_fatal(comm))
        return; /* a link failed before the timer fired: that is the cause */
    if (!req->run && atomic_load(&comm->async_error) != hcclSuccess)
        return; /* the communicator failed first: that is the error it gets */
    if (req->run && hccl_exec_run_failed(req->run, &failed_msg)) {
        /* It failed, but transfers it posted to healthy links may never come back: failing the
         * communicator aborts the links and ends it, with its first cause. */
        hccl_comm_fail(comm, hccl_exec_run_result(req->run), failed_msg);
        return;
    }
    if (req->lane_op && comm->lane &&
        hccl_lane_waiting_for(comm->lane, req->lane_op, peers, sizeof(peers))) {
        hccl_request_describe(req, false, what, sizeof(what));
        snprintf(
            msg, sizeof(msg), "rank %d: %s did not finish within the exec timeout of %d ms; %s%s%s",
            comm->rank, what, comm->params.exec_timeout_ms,
            peers[0] ? "still waiting on ranks " : "it had not started (queued behind earlier ",
            peers, peers[0] ? " (shm lane)" : "shm lane operations)");
        HCCL_WARN("%s", msg);
        hccl_comm_fail_timeout(comm, req, msg);
        return;
    }
    if (req->run)
        posted = hccl_exec_run_pending_peers(req->run, peers, sizeof(peers));
    hccl_request_describe(req, false, what, sizeof(what));
    if (posted)
        waiting = "still waiting on ranks ";
    else if (peers[0])
        waiting = "no transfer in flight; its steps with ranks ";
    else if (req->coll == HCCL_COLL_SEND || req->coll == HCCL_COLL_RECV)
        waiting = "still waiting on its matching call (none posted yet)";
    else
        waiting = "it had not started (queued behind earlier collectives)";
    snprintf(msg, sizeof(msg),
             "rank %d: %s did not finish within the exec timeout of %d ms; %s%s%s", comm->rank,
             what, comm->params.exec_timeout_ms, waiting, peers,
             !posted && peers[0] ? " are blocked on earlier steps" : "");
    HCCL_WARN("%s", msg);
    hccl_comm_fail_timeout(comm, req, msg);
}

void hccl_comm_fail_self_p2p(struct hcclComm *comm, hcclResult_t res, const char *msg)
{
    struct hcclRequest **queues[2] = {&comm->self_sends, &comm->self_recvs};

    for (int q = 0; q < 2; q++) {
        while (*queues[q]) {
            struct hcclRequest *req = *queues[q];
            *queues[q] = req->next_self;
            hccl_coll_finish(comm, req, res, msg);
        }
    }
}

/* Reactor thread: a send to ourselves meets the receive from ourselves, in posting order. */
static void coll_self_p2p(struct hcclComm *comm, struct hcclRequest *req)
{
    bool is_send = req->coll == HCCL_COLL_SEND;
    struct hcclRequest **mine = is_send ? &comm->self_sends : &comm->self_recvs;
    struct hcclRequest **other = is_send ? &comm->self_recvs : &comm->self_sends;
    struct hcclRequest *match = *other, *send, *recv;
    size_t esz;

    if (!match) {
        while (*mine)
            mine = &(*mine)->next_self;
        req->next_self = NULL;
        *mine = req;
        return;
    }
    *other = match->next_self;
    send = is_send ? req : match;
    recv = is_send ? match : req;
    esz = hccl_dtype_size((hcclDataType_t)send->dtype);
    if (send->count * esz != recv->count * hccl_dtype_size((hcclDataType_t)recv->dtype)) {
        char msg[256];
        snprintf(msg, sizeof(msg),
                 "rank %d: send to itself of %zu bytes met a receive of %zu bytes", comm->rank,
                 send->count * esz, recv->count * hccl_dtype_size((hcclDataType_t)recv->dtype));
        HCCL_WARN("%s", msg);
        hccl_coll_finish(comm, send, hcclInvalidUsage, msg);
        hccl_coll_finish(comm, recv, hcclInvalidUsage, msg);
        return;
    }
    memcpy(recv->recvbuf, send->sendbuf, send->count * esz);
    hccl_coll_finish(comm, send, hcclSuccess, NULL);
    hccl_coll_finish(comm, recv, hcclSuccess, NULL);
}

/*
 * A collective that was posted but cannot run here: its peers would wait for it forever, and
 * this rank's sequence numbers would no longer match theirs. The communicator fails, which
 * tells them.
 */
static void coll_fail_posted(struct hcclComm *comm, struct hcclRequest *req, hcclResult_t res)
{
    char msg[768], what[96];

    hccl_request_describe(req, false, what, sizeof(what));
    snprintf(msg, sizeof(msg), "rank %d: %s could not start: %s", comm->rank, what,
             hccl_error_last());
    hccl_coll_finish(comm, req, res, msg);
    hccl_comm_fail(comm, res, msg);
}

/* Reactor thread: plan the request (cached by shape) and start it. */
void hccl_coll_start(struct hcclComm *comm, struct hcclRequest *req)
{
    hccl_coll_shape_t shape = {(hccl_coll_t)req->coll, req->count, (hcclDataType_t)req->dtype,
                               (hcclRedOp_t)req->op,   req->root,  req->v};
    bool p2p = req->coll == HCCL_COLL_SEND || req->coll == HCCL_COLL_RECV;
    bool cacheable = req->coll != HCCL_COLL_ALLTOALLV;
    hccl_algo_t algo;
    hccl_plan_key_t key;
    hccl_plan_t *plan = NULL;
    hcclResult_t res;

    if (req->count == 0 && req->coll != HCCL_COLL_BARRIER) {
        hccl_coll_finish(comm, req, hcclSuccess, NULL);
        return;
    }
    if (p2p && req->root == comm->rank) {
        coll_self_p2p(comm, req);
        return;
    }
    /* Keyed by what decides the pick (a forced algorithm, or the tuner's AUTO), so that a hit
     * skips the tuner's cost evaluation too. */
    memset(&key, 0, sizeof(key));
    key = (hccl_plan_key_t){req->coll,  p2p ? HCCL_ALGO_AUTO : comm->tuner.forced[req->coll],
                            req->count, req->dtype,
                            req->op,    req->root};
    if (cacheable)
        plan = hccl_plan_cache_get(comm->plans, &key);
    if (!plan) {
        algo = p2p ? HCCL_ALGO_AUTO : hccl_tuner_pick(&comm->tuner, &shape, comm->nranks);
        res = hccl_algo_build(&comm->tuner, algo, comm->rank, comm->nranks, &shape, &plan);
        if (res != hcclSuccess) {
            coll_fail_posted(comm, req, res);
            return;
        }
        HCCL_INFO(HCCL_SUB_ALGO, "rank %d: %s of %zu x %s (%s) on %d ranks: %s, %u steps",
                  comm->rank, hccl_coll_name(shape.coll), shape.count, hccl_dtype_name(shape.dtype),
                  hccl_op_name(shape.op), comm->nranks, p2p ? "p2p" : hccl_algo_name(algo),
                  plan->nsteps);
        if (cacheable)
            hccl_plan_cache_put(comm->plans, &key, plan);
    }
    res = hccl_exec_start_sig(
        comm->exec, plan, req->seq,
        p2p ? 0
            : hccl_sig_make(req->coll, req->dtype, req->op, req->root,
                            req->coll == HCCL_COLL_ALLTOALLV ? 0 : req->count),
        req->sendbuf, req->recvbuf, coll_on_run_done, req, (hccl_run_t **)&req->run);
    hccl_plan_release(plan);
    if (res != hcclSuccess)
        coll_fail_posted(comm, req, res);
}

/* The exec timer fired: every request past its deadline times out, oldest first; the timer
 * goes again for the oldest left. Reactor thread. */
static void coll_on_exec_timer(void *arg)
{
    struct hcclComm *comm = arg;
    int64_t now = hccl_now_ms();

    comm->exec_timer_armed = false;
    while (comm->timed_head && comm->timed_head->deadline_ms <= now) {
        struct hcclRequest *req = comm->timed_head;
        coll_untime(comm, req); /* its timeout fires once, as a timer of its own would */
        coll_on_timeout(req);   /* may finish others: they leave the list themselves */
    }
    if (comm->timed_head) {
        hccl_timer_arm(comm->exec_timer, comm->timed_head->deadline_ms - now);
        comm->exec_timer_armed = true;
    }
}

/*
 * Every request of a communicator has the same exec timeout, so their deadlines come in the
 * order they are armed: the oldest unfinished request expires first, and a timer armed for an
 * earlier one is never late for a later one. So one timer serves them all, armed only when
 * it is not already; a request that finishes just leaves the list. (A timer per request cost
 * two wake-ups of the progress thread per collective: arming one from another thread, and
 * freeing it.) Reactor thread.
 */
hcclResult_t hccl_coll_arm_timeout(struct hcclComm *comm, struct hcclRequest *req)
{
    if (comm->params.exec_timeout_ms <= 0)
        return hcclSuccess;
    if (!comm->exec_timer)
        HCCL_CHECK(hccl_timer_create(comm->reactor, coll_on_exec_timer, comm, &comm->exec_timer));
    req->deadline_ms = hccl_now_ms() + comm->params.exec_timeout_ms;
    req->timed_prev = comm->timed_tail;
    req->timed_next = NULL;
    *(comm->timed_tail ? &comm->timed_tail->timed_next : &comm->timed_head) = req;
    comm->timed_tail = req;
    if (!comm->exec_timer_armed) {
        hccl_timer_arm(comm->exec_timer, comm->params.exec_timeout_ms);
        comm->exec_timer_armed = true;
    }
    return hcclSuccess;
}

/* Reactor thread: a request just posted. */
static void coll_on_post(hccl_post_t *post)
{
    struct hcclRequest *req =
        (struct hcclRequest *)((char *)post - offsetof(struct hcclRequest, post));
    struct hcclComm *comm = req->owner;
    bool p2p = req->coll == HCCL_COLL_SEND || req->coll == HCCL_COLL_RECV;
    hcclResult_t res, err = atomic_load(&comm->async_error);

    if (err != hcclSuccess) {
        char msg[512], text[768], what[96];
        hccl_comm_error_text(comm, msg, sizeof(msg));
        hccl_request_describe(req, false, what, sizeof(what));
        snprintf(text, sizeof(text), "%s (%zu x %s) not started: the communicator had failed: %s",
                 what, req->count, hccl_dtype_name(req->dtype), msg);
        hccl_coll_finish(comm, req, err, text);
        return;
    }
    res = hccl_coll_arm_timeout(comm, req);
    if (res != hcclSuccess) {
        hccl_coll_finish(comm, req, res, hccl_error_last());
        return;
    }
    if (comm->params.check && !p2p)
        hccl_coll_start_checked(comm, req); /* then the lane or a plan */
    else if (hccl_coll_lane_takes(comm, req->coll, req->count, (hcclDataType_t)req->dtype))
        hccl_coll_lane_start(comm, req);
    else
        hccl_coll_start(comm, req);
}

hcclResult_t hccl_comm_post(struct hcclComm *comm, struct hcclRequest *req, bool blocking)
{
    req->owner = comm;
    if (req->coll == HCCL_COLL_SEND && req->count > 0)
        req->seq = HCCL_P2P_SEQ_BIT | atomic_fetch_add(&comm->p2p_send_seq[req->root], 1);
    else if (req->coll == HCCL_COLL_RECV && req->count > 0)
        req->seq = HCCL_P2P_SEQ_BIT | atomic_fetch_add(&comm->p2p_recv_seq[req->root], 1);
    else if (req->coll != HCCL_COLL_SEND && req->coll != HCCL_COLL_RECV)
        req->seq = atomic_fetch_add(&comm->next_seq, 1);
    req->post.fn = coll_on_post;
    hccl_reactor_count(comm->reactor);
    if (blocking)
        hccl_reactor_post_then_help(comm->reactor, &req->post);
    else
        hccl_reactor_post_and_start(comm->reactor, &req->post);
    return hcclSuccess;
}

hcclResult_t hccl_coll_submit(struct hcclComm *comm, const char *fn, hccl_coll_call_t *c,
                              bool blocking, hcclRequest_t *req_p)
{
    struct hcclRequest *req;
    hcclResult_t err = atomic_load(&comm->async_error);

    if (err != hcclSuccess) {
        char msg[512];
        hccl_comm_error_text(comm, msg, sizeof(msg));
        hccl_free(c->v);
        if (c->coll == HCCL_COLL_SEND || c->coll == HCCL_COLL_RECV)
            return HCCL_FAIL(err, "%s: %s rank %d: the communicator has failed: %s", fn,
                             c->coll == HCCL_COLL_SEND ? "send to" : "recv from", c->root, msg);
        /* The sequence number the call would have had, as the peers count it. */
        return HCCL_FAIL(err, "%s: %s seq %llu not started: the communicator has failed: %s", fn,
                         hccl_coll_name(c->coll), (unsigned long long)atomic_load(&comm->next_seq),
                         msg);
    }
    if (blocking && hccl_coll_lane_takes(comm, c->coll, c->count, c->dtype)) {
        hcclResult_t res;
        if (hccl_coll_lane_blocking(comm, c->coll, c->sendbuf, c->recvbuf, c->count, c->dtype,
                                    c->op, c->root, &res)) {
            *req_p = NULL; /* nothing to wait for */
            return res;
        }
    }
    /* Room for a lane operation: the lane may take the call (hccl_coll_lane_start). */
    if (hccl_request_create(comm->reactor, comm->lane ? sizeof(hccl_lane_op_t) : 0, &req) !=
        hcclSuccess) {
        hccl_free(c->v);
        return hcclSystemError;
    }
    req->coll = c->coll;
    req->sendbuf = c->sendbuf;
    req->recvbuf = c->recvbuf;
    req->count = c->count;
    req->dtype = c->dtype;
    req->op = c->op;
    req->root = c->root;
    req->v = c->v; /* the request owns it now */
    hccl_comm_post(comm, req, blocking);
    *req_p = req;
    return hcclSuccess;
}
