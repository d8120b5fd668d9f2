/* Collective entry points: argument checks on the caller's thread, planning on the reactor. */
#include <stdio.h>
#include <string.h>

#include "core/comm.h"
#include "core/fault.h"

void hccl_coll_finish(struct hcclComm *comm, struct hcclRequest *req, hcclResult_t res,
                        const char *msg)
{
    uint64_t seq = req->seq;

    hccl_timer_destroy(req->timer);
    req->timer = NULL;
    req->run = NULL;
    hccl_request_complete(req, res, msg); /* req may be gone after this */
    if (comm->faults) {
        /* Before the count drops: once it is zero, a destroy may free comm. */
        pthread_mutex_lock(&comm->mtx);
        bool idle = comm->outstanding == 1;
        pthread_mutex_unlock(&comm->mtx);
        if (idle)
            hccl_fault_point(comm, HCCL_FAULT_AT_IDLE, seq);
    }
    pthread_mutex_lock(&comm->mtx);
    comm->outstanding--;
    pthread_cond_broadcast(&comm->cond);
    pthread_mutex_unlock(&comm->mtx);
}

uint32_t hccl_sig_make(int coll, int dtype, int op, int root, uint64_t count)
{
    uint32_t h = 2166136261u;

    for (int i = 0; i < 8; i++)
        h = (h ^ (uint32_t)((count >> (8 * i)) & 0xff)) * 16777619u;
    /* the kind + 1 keeps it non-zero; the count only as a 12-bit hash */
    return ((uint32_t)(coll + 1) & 0xf) << 28 | ((uint32_t)dtype & 0xf) << 24 | ((uint32_t)op & 0x7) << 21 |
           ((uint32_t)(root + 1) & 0x1ff) << 12 | (h & 0xfff);
}

void hccl_sig_describe(uint32_t sig, char *buf, size_t len)
{
    hccl_coll_t coll = (hccl_coll_t)((sig >> 28) - 1);
    const char *dt = hccl_dtype_name((hcclDataType_t)((sig >> 24) & 0xf));
    const char *op = hccl_op_name((hcclRedOp_t)((sig >> 21) & 0x7));
    int root = (int)((sig >> 12) & 0x1ff) - 1;

    if (coll == HCCL_COLL_BROADCAST)
        snprintf(buf, len, "broadcast(%s, root %d)", dt, root);
    else if (coll == HCCL_COLL_REDUCE)
        snprintf(buf, len, "reduce(%s, %s, root %d)", dt, op, root);
    else if (coll == HCCL_COLL_ALLREDUCE || coll == HCCL_COLL_REDUCESCATTER)
        snprintf(buf, len, "%s(%s, %s)", hccl_coll_name(coll), dt, op);
    else if (coll == HCCL_COLL_BARRIER)
        snprintf(buf, len, "barrier()");
    else
        snprintf(buf, len, "%s(%s)", hccl_coll_name(coll), dt);
    if (strlen(buf) + 24 < len)
        snprintf(buf + strlen(buf), len - strlen(buf), " [count hash %03x]", sig & 0xfff);
}

void hccl_request_describe(const struct hcclRequest *req, bool detail, char *buf, size_t len)
{
    hccl_coll_t coll = (hccl_coll_t)req->coll;
    bool p2p = coll == HCCL_COLL_SEND || coll == HCCL_COLL_RECV;
    size_t o;

    if (p2p)
        snprintf(buf, len, "%s #%llu %s rank %d", hccl_coll_name(coll),
                 (unsigned long long)(req->seq & ~HCCL_P2P_SEQ_BIT), coll == HCCL_COLL_SEND ? "to" : "from",
                 req->root);
    else
        snprintf(buf, len, "%s seq %llu", hccl_coll_name(coll), (unsigned long long)req->seq);
    if (!detail)
        return;
    o = strlen(buf);
    o += (size_t)snprintf(buf + o, len - o, " (%zu x %s", req->count, hccl_dtype_name((hcclDataType_t)req->dtype));
    if (o < len && (coll == HCCL_COLL_ALLREDUCE || coll == HCCL_COLL_REDUCE || coll == HCCL_COLL_REDUCESCATTER))
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
    if (req->lane_op && comm->lane && hccl_lane_waiting_for(comm->lane, req->lane_op, peers, sizeof(peers))) {
        hccl_request_describe(req, false, what, sizeof(what));
        snprintf(msg, sizeof(msg), "rank %d: %s did not finish within the exec timeout of %d ms; %s%s%s",
                 comm->rank, what, comm->params.exec_timeout_ms,
                 peers[0] ? "still waiting on ranks " : "it had not started (queued behind earlier ", peers,
                 peers[0] ? " (shm lane)" : "shm lane operations)");
        HCCL_WARN("%s", msg);
        hccl_comm_fail(comm, hcclTimeout, msg);
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
    snprintf(msg, sizeof(msg), "rank %d: %s did not finish within the exec timeout of %d ms; %s%s%s",
             comm->rank, what, comm->params.exec_timeout_ms, waiting, peers,
             !posted && peers[0] ? " are blocked on earlier steps" : "");
    HCCL_WARN("%s", msg);
    hccl_comm_fail(comm, hcclTimeout, msg);
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
        snprintf(msg, sizeof(msg), "rank %d: send to itself of %zu bytes met a receive of %zu bytes",
                 comm->rank, send->count * esz,
                 recv->count * hccl_dtype_size((hcclDataType_t)recv->dtype));
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
    snprintf(msg, sizeof(msg), "rank %d: %s could not start: %s", comm->rank, what, hccl_error_last());
    hccl_coll_finish(comm, req, res, msg);
    hccl_comm_fail(comm, res, msg);
}

/* Reactor thread: plan the request (cached by shape) and start it. */
static void coll_start(struct hcclComm *comm, struct hcclRequest *req)
{
    hccl_coll_shape_t shape = {(hccl_coll_t)req->coll, req->count, (hcclDataType_t)req->dtype,
                               (hcclRedOp_t)req->op, req->root, req->v};
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
    key = (hccl_plan_key_t){req->coll, p2p ? HCCL_ALGO_AUTO : comm->tuner.forced[req->coll], req->count,
                            req->dtype, req->op, req->root};
    if (cacheable)
        plan = hccl_plan_cache_get(comm->plans, &key);
    if (!plan) {
        algo = p2p ? HCCL_ALGO_AUTO : hccl_tuner_pick(&comm->tuner, &shape, comm->nranks);
        res = hccl_algo_build(&comm->tuner, algo, comm->rank, comm->nranks, &shape, &plan);
        if (res != hcclSuccess) {
            coll_fail_posted(comm, req, res);
            return;
        }
        HCCL_INFO(HCCL_SUB_ALGO, "rank %d: %s of %zu x %s on %d ranks: %s, %u steps", comm->rank,
                  hccl_coll_name(shape.coll), shape.count, hccl_dtype_name(shape.dtype), comm->nranks,
                  p2p ? "p2p" : hccl_algo_name(algo), plan->nsteps);
        if (cacheable)
            hccl_plan_cache_put(comm->plans, &key, plan);
    }
    res = hccl_exec_start_sig(comm->exec, plan, req->seq,
                              p2p ? 0
                                  : hccl_sig_make(req->coll, req->dtype, req->op, req->root,
                                                  req->coll == HCCL_COLL_ALLTOALLV ? 0 : req->count),
                              req->sendbuf, req->recvbuf, coll_on_run_done, req,
                              (hccl_run_t **)&req->run);
    hccl_plan_release(plan);
    if (res != hcclSuccess)
        coll_fail_posted(comm, req, res);
}

/* ---- HCCL_CHECK: every rank's signature of the call, gathered and compared first ---- */

typedef struct {
    uint32_t coll;
    uint32_t dtype;
    uint32_t op;
    int32_t root;
    uint64_t count;
    uint64_t seq;
} coll_sig_t;

static void sig_describe(const coll_sig_t *g, char *buf, size_t len)
{
    hccl_coll_t c = (hccl_coll_t)g->coll;
    const char *dt = hccl_dtype_name((hcclDataType_t)g->dtype);

    if (c == HCCL_COLL_BROADCAST)
        snprintf(buf, len, "broadcast(count %llu, %s, root %d)", (unsigned long long)g->count, dt, g->root);
    else if (c == HCCL_COLL_REDUCE)
        snprintf(buf, len, "reduce(count %llu, %s, %s, root %d)", (unsigned long long)g->count, dt,
                 hccl_op_name((hcclRedOp_t)g->op), g->root);
    else if (c == HCCL_COLL_ALLREDUCE || c == HCCL_COLL_REDUCESCATTER)
        snprintf(buf, len, "%s(count %llu, %s, %s)", hccl_coll_name(c), (unsigned long long)g->count,
                 dt, hccl_op_name((hcclRedOp_t)g->op));
    else if (c == HCCL_COLL_BARRIER)
        snprintf(buf, len, "barrier()");
    else
        snprintf(buf, len, "%s(count %llu, %s)", hccl_coll_name(c), (unsigned long long)g->count, dt);
}

static void coll_on_check_done(hccl_run_t *run, hcclResult_t res, const char *msg, void *arg)
{
    struct hcclRequest *req = arg;
    struct hcclComm *comm = req->owner;
    const coll_sig_t *table = (const coll_sig_t *)req->check + 1;
    char text[768], a[160], b[160];

    (void)run;
    req->run = NULL;
    if (res != hcclSuccess) {
        snprintf(text, sizeof(text), "%s (seq %llu, signature check): %s", hccl_coll_name(req->coll),
                 (unsigned long long)req->seq, msg ? msg : "");
        hccl_coll_finish(comm, req, res, text);
        return;
    }
    for (int r = 1; r < comm->nranks; r++) {
        if (memcmp(&table[r], &table[0], sizeof(table[0])) == 0)
            continue;
        sig_describe(&table[0], a, sizeof(a));
        sig_describe(&table[r], b, sizeof(b));
        snprintf(text, sizeof(text), "collective mismatch at seq %llu (HCCL_CHECK): rank 0 called %s, "
                 "rank %d called %s", (unsigned long long)req->seq, a, r, b);
        HCCL_WARN("rank %d: %s", comm->rank, text);
        hccl_coll_finish(comm, req, hcclInvalidUsage, text);
        return;
    }
    coll_start(comm, req);
}

static hcclResult_t check_plan(struct hcclComm *comm, hccl_plan_t **plan_p)
{
    hccl_coll_shape_t shape = {HCCL_COLL_ALLGATHER, sizeof(coll_sig_t), hcclUint8, hcclSum, -1, NULL};
    hccl_plan_key_t key = {HCCL_COLL_ALLGATHER, HCCL_NUM_ALGOS, sizeof(coll_sig_t), hcclUint8, hcclSum, -2};
    hccl_plan_t *plan = hccl_plan_cache_get(comm->plans, &key);

    if (!plan) {
        hccl_algo_t algo = hccl_tuner_pick(&comm->tuner, &shape, comm->nranks);
        HCCL_CHECK(hccl_algo_build(&comm->tuner, algo, comm->rank, comm->nranks, &shape, &plan));
        for (uint32_t i = 0; i < plan->nsteps; i++)
            if (plan->steps[i].kind == HCCL_STEP_SEND || plan->steps[i].kind == HCCL_STEP_RECV)
                plan->steps[i].tag |= HCCL_CHECK_TAG_BIT;
        hccl_plan_cache_put(comm->plans, &key, plan);
    }
    *plan_p = plan;
    return hcclSuccess;
}

static void coll_start_checked(struct hcclComm *comm, struct hcclRequest *req)
{
    coll_sig_t *sig = hccl_calloc((size_t)comm->nranks + 1, sizeof(*sig));
    hccl_plan_t *plan = NULL;
    hcclResult_t res;

    if (!sig) {
        hccl_coll_finish(comm, req, HCCL_FAIL(hcclSystemError, "out of memory for HCCL_CHECK"),
                          hccl_error_last());
        return;
    }
    sig->coll = (uint32_t)req->coll;
    sig->dtype = (uint32_t)req->dtype;
    sig->op = (uint32_t)req->op;
    sig->root = req->root;
    sig->count = req->coll == HCCL_COLL_ALLTOALLV ? 0 : req->count; /* v counts differ by design */
    sig->seq = req->seq;
    req->check = sig;
    res = check_plan(comm, &plan);
    if (res == hcclSuccess) {
        res = hccl_exec_start(comm->exec, plan, req->seq, sig, sig + 1, coll_on_check_done, req,
                              (hccl_run_t **)&req->run);
        hccl_plan_release(plan);
    }
    if (res != hcclSuccess)
        hccl_coll_finish(comm, req, res, hccl_error_last());
}

hcclResult_t hccl_coll_arm_timeout(struct hcclComm *comm, struct hcclRequest *req)
{
    hccl_timer_t *timer = NULL;

    if (comm->params.exec_timeout_ms <= 0)
        return hcclSuccess;
    HCCL_CHECK(hccl_timer_create(comm->reactor, coll_on_timeout, req, &timer));
    hccl_timer_arm(timer, comm->params.exec_timeout_ms);
    req->timer = timer;
    return hcclSuccess;
}

/* Reactor thread: a request just posted. */
static void coll_on_post(hccl_post_t *post)
{
    struct hcclRequest *req = (struct hcclRequest *)((char *)post - offsetof(struct hcclRequest, post));
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
    if (hccl_coll_lane_takes(comm, req->coll, req->count, (hcclDataType_t)req->dtype)) {
        hccl_coll_lane_start(comm, req);
        return;
    }
    if (comm->params.check && !p2p)
        coll_start_checked(comm, req);
    else
        coll_start(comm, req);
}

/* Set by a blocking entry point around its Async call: the request is waited for at once. */
static _Thread_local HCCL_TLS_FAST bool tl_blocking_call;
/* Set by coll_submit when it ran a blocking call on the lane itself: no request to wait for. */
static _Thread_local HCCL_TLS_FAST bool tl_ran_inline;

hcclResult_t hccl_comm_post(struct hcclComm *comm, struct hcclRequest *req)
{
    req->owner = comm;
    if (req->coll == HCCL_COLL_SEND && req->count > 0)
        req->seq = HCCL_P2P_SEQ_BIT | atomic_fetch_add(&comm->p2p_send_seq[req->root], 1);
    else if (req->coll == HCCL_COLL_RECV && req->count > 0)
        req->seq = HCCL_P2P_SEQ_BIT | atomic_fetch_add(&comm->p2p_recv_seq[req->root], 1);
    else if (req->coll != HCCL_COLL_SEND && req->coll != HCCL_COLL_RECV)
        req->seq = atomic_fetch_add(&comm->next_seq, 1);
    req->post.fn = coll_on_post;
    pthread_mutex_lock(&comm->mtx);
    comm->outstanding++;
    pthread_mutex_unlock(&comm->mtx);
    if (tl_blocking_call)
        hccl_reactor_post_then_help(comm->reactor, &req->post);
    else
        hccl_reactor_post_and_start(comm->reactor, &req->post);
    tl_blocking_call = false;
    return hcclSuccess;
}

/* ---- argument checks shared by the entry points ---- */

typedef struct {
    hccl_coll_t coll;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    hcclDataType_t dtype;
    hcclRedOp_t op;
    int root;
    size_t *v; /* owned until handed to the request */
} coll_call_t;

bool hccl_ranges_overlap(const void *a, size_t alen, const void *b, size_t blen)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;

    return alen && blen && x < y + blen && y < x + alen;
}

static hcclResult_t check_common(struct hcclComm *comm, const char *fn, hcclRequest_t *req_p,
                                 hcclDataType_t dt, const hcclRedOp_t *op)
{
    HCCL_CHECK(hccl_comm_check(comm, fn));
    if (!req_p)
        return HCCL_FAIL(hcclInvalidArgument, "%s: req is NULL", fn);
    if ((unsigned)dt >= hcclNumTypes)
        return HCCL_FAIL(hcclInvalidArgument, "%s: datatype %d is not a valid hcclDataType_t", fn, (int)dt);
    if (op && (unsigned)*op >= hcclNumOps)
        return HCCL_FAIL(hcclInvalidArgument, "%s: op %d is not a valid hcclRedOp_t", fn, (int)*op);
    return hcclSuccess;
}

/* count * mult elements of dt in bytes, or an error naming the overflow. */
static hcclResult_t check_bytes(const char *fn, size_t count, size_t mult, hcclDataType_t dt, size_t *bytes_p)
{
    size_t esz = hccl_dtype_size(dt);

    if (mult && count > SIZE_MAX / mult / esz)
        return HCCL_FAIL(hcclInvalidArgument, "%s: count %zu of %s overflows the address space", fn,
                         count, hccl_dtype_name(dt));
    *bytes_p = count * mult * esz;
    return hcclSuccess;
}

static hcclResult_t check_rank(struct hcclComm *comm, const char *fn, const char *what, int r)
{
    if (r < 0 || r >= comm->nranks)
        return HCCL_FAIL(hcclInvalidArgument, "%s: %s %d is not in [0, %d)", fn, what, r, comm->nranks);
    return hcclSuccess;
}

static hcclResult_t coll_submit(struct hcclComm *comm, const char *fn, coll_call_t *c,
                                hcclRequest_t *req_p)
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
    if (tl_blocking_call && hccl_coll_lane_takes(comm, c->coll, c->count, c->dtype)) {
        hcclResult_t res;
        if (hccl_coll_lane_blocking(comm, c->coll, c->sendbuf, c->recvbuf, c->count, c->dtype, c->op,
                                    c->root, &res)) {
            tl_ran_inline = true;
            *req_p = NULL;
            return res;
        }
    }
    if (hccl_request_create(comm->reactor, &req) != hcclSuccess) {
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
    hccl_comm_post(comm, req);
    *req_p = req;
    return hcclSuccess;
}

/* The blocking forms: Async + Wait. */
static hcclResult_t coll_block(hcclResult_t posted, hcclRequest_t *req)
{
    bool ran = tl_ran_inline;

    tl_blocking_call = false;
    tl_ran_inline = false;
    return posted != hcclSuccess || ran ? posted : hcclWait(req);
}

static hcclResult_t check_blocking(struct hcclComm *comm, const char *fn)
{
    HCCL_CHECK(hccl_comm_check(comm, fn));
    if (hccl_reactor_in_loop(comm->reactor))
        return HCCL_FAIL(hcclInvalidUsage, "%s: the blocking form was called from a callback of the "
                                           "communicator; it would never finish", fn);
    tl_blocking_call = true;
    return hcclSuccess;
}

/* ---- entry points ---- */

HCCL_API hcclResult_t hcclAllReduceAsync(const void *sendbuf, void *recvbuf, size_t count,
                                         hcclDataType_t datatype, hcclRedOp_t op, hcclComm_t comm,
                                         hcclRequest_t *req_p)
{
    static const char fn[] = "hcclAllReduceAsync";
    coll_call_t c = {HCCL_COLL_ALLREDUCE, sendbuf, recvbuf, count, datatype, op, -1, NULL};
    size_t bytes = 0;

    HCCL_CHECK(check_common(comm, fn, req_p, datatype, &op));
    HCCL_CHECK(check_bytes(fn, count, 1, datatype, &bytes));
    if (count > 0 && (!sendbuf || !recvbuf))
        return HCCL_FAIL(hcclInvalidArgument, "%s: %s is NULL with count %zu", fn,
                         sendbuf ? "recvbuf" : "sendbuf", count);
    if (sendbuf != recvbuf && hccl_ranges_overlap(sendbuf, bytes, recvbuf, bytes))
        return HCCL_FAIL(hcclInvalidArgument, "%s: sendbuf and recvbuf overlap without being equal "
                                              "(in-place needs sendbuf == recvbuf)", fn);
    return coll_submit(comm, fn, &c, req_p);
}

HCCL_API hcclResult_t hcclAllReduce(const void *sendbuf, void *recvbuf, size_t count,
                                    hcclDataType_t datatype, hcclRedOp_t op, hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclAllReduce"));
    return coll_block(hcclAllReduceAsync(sendbuf, recvbuf, count, datatype, op, comm, &req), &req);
}

HCCL_API hcclResult_t hcclBroadcastAsync(void *buf, size_t count, hcclDataType_t datatype, int root,
                                         hcclComm_t comm, hcclRequest_t *req_p)
{
    static const char fn[] = "hcclBroadcastAsync";
    coll_call_t c = {HCCL_COLL_BROADCAST, buf, buf, count, datatype, hcclSum, root, NULL};
    size_t bytes = 0;

    HCCL_CHECK(check_common(comm, fn, req_p, datatype, NULL));
    HCCL_CHECK(check_rank(comm, fn, "root", root));
    HCCL_CHECK(check_bytes(fn, count, 1, datatype, &bytes));
    if (count > 0 && !buf)
        return HCCL_FAIL(hcclInvalidArgument, "%s: buf is NULL with count %zu", fn, count);
    return coll_submit(comm, fn, &c, req_p);
}

HCCL_API hcclResult_t hcclBroadcast(void *buf, size_t count, hcclDataType_t datatype, int root,
                                    hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclBroadcast"));
    return coll_block(hcclBroadcastAsync(buf, count, datatype, root, comm, &req), &req);
}

HCCL_API hcclResult_t hcclReduceAsync(const void *sendbuf, void *recvbuf, size_t count,
                                      hcclDataType_t datatype, hcclRedOp_t op, int root,
                                      hcclComm_t comm, hcclRequest_t *req_p)
{
    static const char fn[] = "hcclReduceAsync";
    coll_call_t c = {HCCL_COLL_REDUCE, sendbuf, recvbuf, count, datatype, op, root, NULL};
    size_t bytes = 0;

    HCCL_CHECK(check_common(comm, fn, req_p, datatype, &op));
    HCCL_CHECK(check_rank(comm, fn, "root", root));
    HCCL_CHECK(check_bytes(fn, count, 1, datatype, &bytes));
    if (count > 0 && !sendbuf)
        return HCCL_FAIL(hcclInvalidArgument, "%s: sendbuf is NULL with count %zu", fn, count);
    if (count > 0 && comm->rank == root && !recvbuf)
        return HCCL_FAIL(hcclInvalidArgument, "%s: recvbuf is NULL on the root", fn);
    if (comm->rank != root)
        c.recvbuf = NULL; /* never touched elsewhere */
    else if (sendbuf != recvbuf && hccl_ranges_overlap(sendbuf, bytes, recvbuf, bytes))
        return HCCL_FAIL(hcclInvalidArgument, "%s: sendbuf and recvbuf overlap without being equal", fn);
    return coll_submit(comm, fn, &c, req_p);
}

HCCL_API hcclResult_t hcclReduce(const void *sendbuf, void *recvbuf, size_t count,
                                 hcclDataType_t datatype, hcclRedOp_t op, int root, hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclReduce"));
    return coll_block(hcclReduceAsync(sendbuf, recvbuf, count, datatype, op, root, comm, &req), &req);
}

HCCL_API hcclResult_t hcclAllGatherAsync(const void *sendbuf, void *recvbuf, size_t sendcount,
                                         hcclDataType_t datatype, hcclComm_t comm,
                                         hcclRequest_t *req_p)
{
    static const char fn[] = "hcclAllGatherAsync";
    coll_call_t c = {HCCL_COLL_ALLGATHER, sendbuf, recvbuf, sendcount, datatype, hcclSum, -1, NULL};
    size_t bytes = 0, total = 0;

    HCCL_CHECK(check_common(comm, fn, req_p, datatype, NULL));
    HCCL_CHECK(check_bytes(fn, sendcount, 1, datatype, &bytes));
    HCCL_CHECK(check_bytes(fn, sendcount, (size_t)comm->nranks, datatype, &total));
    if (sendcount > 0 && (!sendbuf || !recvbuf))
        return HCCL_FAIL(hcclInvalidArgument, "%s: %s is NULL with count %zu", fn,
                         sendbuf ? "recvbuf" : "sendbuf", sendcount);
    if (sendbuf != (char *)recvbuf + (size_t)comm->rank * bytes &&
        hccl_ranges_overlap(sendbuf, bytes, recvbuf, total))
        return HCCL_FAIL(hcclInvalidArgument, "%s: sendbuf overlaps recvbuf but is not "
                                              "recvbuf + rank*sendcount (the in-place form)", fn);
    return coll_submit(comm, fn, &c, req_p);
}

HCCL_API hcclResult_t hcclAllGather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                    hcclDataType_t datatype, hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclAllGather"));
    return coll_block(hcclAllGatherAsync(sendbuf, recvbuf, sendcount, datatype, comm, &req), &req);
}

HCCL_API hcclResult_t hcclReduceScatterAsync(const void *sendbuf, void *recvbuf, size_t recvcount,
                                             hcclDataType_t datatype, hcclRedOp_t op,
                                             hcclComm_t comm, hcclRequest_t *req_p)
{
    static const char fn[] = "hcclReduceScatterAsync";
    coll_call_t c = {HCCL_COLL_REDUCESCATTER, sendbuf, recvbuf, recvcount, datatype, op, -1, NULL};
    size_t bytes = 0, total = 0;

    HCCL_CHECK(check_common(comm, fn, req_p, datatype, &op));
    HCCL_CHECK(check_bytes(fn, recvcount, 1, datatype, &bytes));
    HCCL_CHECK(check_bytes(fn, recvcount, (size_t)comm->nranks, datatype, &total));
    if (recvcount > 0 && (!sendbuf || !recvbuf))
        return HCCL_FAIL(hcclInvalidArgument, "%s: %s is NULL with count %zu", fn,
                         sendbuf ? "recvbuf" : "sendbuf", recvcount);
    if (recvbuf != (const char *)sendbuf + (size_t)comm->rank * bytes &&
        hccl_ranges_overlap(sendbuf, total, recvbuf, bytes))
        return HCCL_FAIL(hcclInvalidArgument, "%s: recvbuf overlaps sendbuf but is not "
                                              "sendbuf + rank*recvcount (the in-place form)", fn);
    return coll_submit(comm, fn, &c, req_p);
}

HCCL_API hcclResult_t hcclReduceScatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                        hcclDataType_t datatype, hcclRedOp_t op, hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclReduceScatter"));
    return coll_block(hcclReduceScatterAsync(sendbuf, recvbuf, recvcount, datatype, op, comm, &req),
                      &req);
}

HCCL_API hcclResult_t hcclAlltoAllAsync(const void *sendbuf, void *recvbuf, size_t count,
                                        hcclDataType_t datatype, hcclComm_t comm,
                                        hcclRequest_t *req_p)
{
    static const char fn[] = "hcclAlltoAllAsync";
    coll_call_t c = {HCCL_COLL_ALLTOALL, sendbuf, recvbuf, count, datatype, hcclSum, -1, NULL};
    size_t total = 0;

    HCCL_CHECK(check_common(comm, fn, req_p, datatype, NULL));
    HCCL_CHECK(check_bytes(fn, count, (size_t)comm->nranks, datatype, &total));
    if (count > 0 && (!sendbuf || !recvbuf))
        return HCCL_FAIL(hcclInvalidArgument, "%s: %s is NULL with count %zu", fn,
                         sendbuf ? "recvbuf" : "sendbuf", count);
    if (hccl_ranges_overlap(sendbuf, total, recvbuf, total))
        return HCCL_FAIL(hcclInvalidArgument, "%s: sendbuf and recvbuf overlap (not allowed)", fn);
    return coll_submit(comm, fn, &c, req_p);
}

HCCL_API hcclResult_t hcclAlltoAll(const void *sendbuf, void *recvbuf, size_t count,
                                   hcclDataType_t datatype, hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclAlltoAll"));
    return coll_block(hcclAlltoAllAsync(sendbuf, recvbuf, count, datatype, comm, &req), &req);
}

/* The span [lo, hi) in elements that counts/displs cover, or an error on overflow. */
static hcclResult_t v_span(const char *fn, const char *what, const size_t *counts, const size_t *displs,
                           int n, size_t *hi_p, size_t *total_p)
{
    size_t hi = 0, total = 0;

    for (int i = 0; i < n; i++) {
        if (counts[i] && displs[i] > SIZE_MAX - counts[i])
            return HCCL_FAIL(hcclInvalidArgument, "%s: %s %d overflows", fn, what, i);
        if (counts[i] && displs[i] + counts[i] > hi)
            hi = displs[i] + counts[i];
        total += counts[i];
    }
    *hi_p = hi;
    *total_p = total;
    return hcclSuccess;
}

HCCL_API hcclResult_t hcclAlltoAllvAsync(const void *sendbuf, const size_t *sendcounts,
                                         const size_t *sdispls, void *recvbuf,
                                         const size_t *recvcounts, const size_t *rdispls,
                                         hcclDataType_t datatype, hcclComm_t comm,
                                         hcclRequest_t *req_p)
{
    static const char fn[] = "hcclAlltoAllvAsync";
    coll_call_t c = {HCCL_COLL_ALLTOALLV, sendbuf, recvbuf, 0, datatype, hcclSum, -1, NULL};
    size_t shi = 0, rhi = 0, stot = 0, rtot = 0, sbytes = 0, rbytes = 0, n;

    HCCL_CHECK(check_common(comm, fn, req_p, datatype, NULL));
    if (!sendcounts || !sdispls || !recvcounts || !rdispls)
        return HCCL_FAIL(hcclInvalidArgument, "%s: a count or displacement array is NULL", fn);
    n = (size_t)comm->nranks;
    HCCL_CHECK(v_span(fn, "send block", sendcounts, sdispls, comm->nranks, &shi, &stot));
    HCCL_CHECK(v_span(fn, "receive block", recvcounts, rdispls, comm->nranks, &rhi, &rtot));
    HCCL_CHECK(check_bytes(fn, shi, 1, datatype, &sbytes));
    HCCL_CHECK(check_bytes(fn, rhi, 1, datatype, &rbytes));
    if ((shi && !sendbuf) || (rhi && !recvbuf))
        return HCCL_FAIL(hcclInvalidArgument, "%s: %s is NULL with non-zero counts", fn,
                         shi && !sendbuf ? "sendbuf" : "recvbuf");
    if (hccl_ranges_overlap(sendbuf, sbytes, recvbuf, rbytes))
        return HCCL_FAIL(hcclInvalidArgument, "%s: sendbuf and recvbuf overlap (not allowed)", fn);
    if (sendcounts[comm->rank] != recvcounts[comm->rank])
        return HCCL_FAIL(hcclInvalidArgument, "%s: this rank sends %zu elements to itself but "
                                              "receives %zu from itself", fn, sendcounts[comm->rank],
                         recvcounts[comm->rank]);
    c.count = stot + rtot; /* only "is there anything at all" matters; the plan uses v */
    c.v = hccl_malloc(4 * n * sizeof(size_t));
    if (!c.v)
        return HCCL_FAIL(hcclSystemError, "%s: out of memory", fn);
    memcpy(c.v, sendcounts, n * sizeof(size_t));
    memcpy(c.v + n, sdispls, n * sizeof(size_t));
    memcpy(c.v + 2 * n, recvcounts, n * sizeof(size_t));
    memcpy(c.v + 3 * n, rdispls, n * sizeof(size_t));
    return coll_submit(comm, fn, &c, req_p);
}

HCCL_API hcclResult_t hcclAlltoAllv(const void *sendbuf, const size_t *sendcounts,
                                    const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                    const size_t *rdispls, hcclDataType_t datatype, hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclAlltoAllv"));
    return coll_block(hcclAlltoAllvAsync(sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls,
                                         datatype, comm, &req),
                      &req);
}

HCCL_API hcclResult_t hcclBarrierAsync(hcclComm_t comm, hcclRequest_t *req_p)
{
    static const char fn[] = "hcclBarrierAsync";
    coll_call_t c = {HCCL_COLL_BARRIER, NULL, NULL, 0, hcclUint8, hcclSum, -1, NULL};

    HCCL_CHECK(check_common(comm, fn, req_p, hcclUint8, NULL));
    return coll_submit(comm, fn, &c, req_p);
}

HCCL_API hcclResult_t hcclBarrier(hcclComm_t comm)
{
    hcclRequest_t req = NULL;


    HCCL_CHECK(check_blocking(comm, "hcclBarrier"));
    return coll_block(hcclBarrierAsync(comm, &req), &req);
}

static hcclResult_t p2p_async(const char *fn, hccl_coll_t coll, const void *sbuf, void *rbuf,
                              size_t count, hcclDataType_t datatype, int peer, hcclComm_t comm,
                              hcclRequest_t *req_p)
{
    coll_call_t c = {coll, sbuf, rbuf, count, datatype, hcclSum, peer, NULL};
    size_t bytes = 0;

    HCCL_CHECK(check_common(comm, fn, req_p, datatype, NULL));
    HCCL_CHECK(check_rank(comm, fn, "peer", peer));
    HCCL_CHECK(check_bytes(fn, count, 1, datatype, &bytes));
    if (count > 0 && !(sbuf ? sbuf : rbuf))
        return HCCL_FAIL(hcclInvalidArgument, "%s: buf is NULL with count %zu", fn, count);
    return coll_submit(comm, fn, &c, req_p);
}

HCCL_API hcclResult_t hcclSendAsync(const void *buf, size_t count, hcclDataType_t datatype, int peer,
                                    hcclComm_t comm, hcclRequest_t *req_p)
{
    return p2p_async("hcclSendAsync", HCCL_COLL_SEND, buf, NULL, count, datatype, peer, comm, req_p);
}

HCCL_API hcclResult_t hcclRecvAsync(void *buf, size_t count, hcclDataType_t datatype, int peer,
                                    hcclComm_t comm, hcclRequest_t *req_p)
{
    return p2p_async("hcclRecvAsync", HCCL_COLL_RECV, NULL, buf, count, datatype, peer, comm, req_p);
}

HCCL_API hcclResult_t hcclSend(const void *buf, size_t count, hcclDataType_t datatype, int peer,
                               hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclSend"));
    return coll_block(hcclSendAsync(buf, count, datatype, peer, comm, &req), &req);
}

HCCL_API hcclResult_t hcclRecv(void *buf, size_t count, hcclDataType_t datatype, int peer,
                               hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclRecv"));
    return coll_block(hcclRecvAsync(buf, count, datatype, peer, comm, &req), &req);
}
