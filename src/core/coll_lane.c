/*
 * Collectives on the shm lane (sched/lane.h): requests queued there by the reactor, and
 * blocking calls that run their lane operation on the caller's thread, without a request,
 * while nothing else is queued on the lane.
 */
#include <stdio.h>
#include <string.h>

#include "core/comm.h"

static void lane_describe(const hccl_lane_op_t *op, char *buf, size_t len)
{
    struct hcclRequest as_req = {.coll = op->coll, .seq = op->seq, .count = op->count,
                                 .dtype = op->dtype, .op = op->op, .root = op->root};

    if (op->coll == HCCL_COLL_BARRIER)
        snprintf(buf, len, "barrier seq %llu", (unsigned long long)op->seq);
    else
        hccl_request_describe(&as_req, true, buf, len);
}

static void lane_request_done(hccl_lane_op_t *op, hcclResult_t res, const char *msg)
{
    struct hcclRequest *req = op->arg;
    struct hcclComm *comm = req->owner;
    char text[768], what[160];

    req->lane_op = NULL;
    if (res != hcclSuccess) {
        lane_describe(op, what, sizeof(what));
        snprintf(text, sizeof(text), "%s: %s", what, msg ? msg : "");
    }
    hccl_coll_finish(comm, req, res, res == hcclSuccess ? NULL : text);
}

static void lane_op_from_request(hccl_lane_op_t *op, struct hcclRequest *req)
{
    memset(op, 0, sizeof(*op));
    op->coll = req->coll;
    op->sendbuf = req->sendbuf;
    op->recvbuf = req->recvbuf;
    op->count = req->count;
    op->dtype = (hcclDataType_t)req->dtype;
    op->op = (hcclRedOp_t)req->op;
    op->root = req->root;
    op->seq = req->seq;
}

bool hccl_coll_lane_takes(const struct hcclComm *comm, int coll, size_t count, hcclDataType_t dtype)
{
    hccl_coll_shape_t shape = {(hccl_coll_t)coll, count, dtype, hcclSum, 0, NULL};

    /* The tuner's pick, like any algorithm's (HCCL_ALGO may name the lane or another). */
    return comm->lane && hccl_tuner_picks_lane(&comm->tuner, &shape, comm->nranks);
}

void hccl_coll_lane_start(struct hcclComm *comm, struct hcclRequest *req)
{
    hccl_lane_op_t *op = req->ext; /* made with room for it (hccl_coll_submit) */

    lane_op_from_request(op, req);
    op->done = lane_request_done;
    op->arg = req;
    req->lane_op = op;
    hccl_lane_enqueue(comm->lane, op);
}

/* ---- a blocking call on the caller's thread ---- */

enum { CALL_NEW, CALL_RUNNING, CALL_DECLINED, CALL_DONE, CALL_PARKED };

typedef struct {
    struct hcclComm *comm;
    hccl_lane_op_t op;
    int state;
    hcclResult_t res;
    char msg[768];
    struct hcclRequest *req; /* CALL_PARKED: what the rest is waited for through */
} lane_call_t;

static void lane_call_done(hccl_lane_op_t *op, hcclResult_t res, const char *msg)
{
    lane_call_t *c = op->arg;
    char what[160];

    c->res = res;
    if (res != hcclSuccess) {
        lane_describe(op, what, sizeof(what));
        snprintf(c->msg, sizeof(c->msg), "%s: %s", what, msg ? msg : "");
    }
    c->state = CALL_DONE;
}

/* With the reactor's work held, after its posts ran: start when the lane is ours alone. */
static bool lane_call_step(void *arg)
{
    lane_call_t *c = arg;

    if (c->state == CALL_NEW) {
        if (!hccl_lane_idle(c->comm->lane) || atomic_load(&c->comm->async_error) != hcclSuccess) {
            c->state = CALL_DECLINED;
            return true;
        }
        c->op.seq = atomic_fetch_add(&c->comm->next_seq, 1);
        c->state = CALL_RUNNING;
        hccl_lane_enqueue(c->comm->lane, &c->op);
    }
    return c->state != CALL_RUNNING;
}

/* The peers are slow: the rest goes through a request, so that this thread may sleep and the
 * exec timeout and failures reach it as they reach any request. */
static void lane_call_park(void *arg)
{
    lane_call_t *c = arg;
    struct hcclComm *comm = c->comm;
    struct hcclRequest *req;
    hccl_lane_op_t *copy;

    if (c->state != CALL_RUNNING)
        return;
    if (hccl_request_create(comm->reactor, sizeof(*copy), &req) != hcclSuccess)
        return; /* the caller drives on */
    copy = req->ext;
    req->owner = comm;
    req->coll = c->op.coll;
    req->sendbuf = c->op.call_sendbuf;
    req->recvbuf = c->op.call_recvbuf;
    req->count = c->op.call_count;
    req->dtype = c->op.dtype;
    req->op = c->op.op;
    req->root = c->op.root;
    req->seq = c->op.seq;
    hccl_reactor_count(comm->reactor);
    hccl_lane_replace(comm->lane, &c->op, copy);
    copy->done = lane_request_done;
    copy->arg = req;
    req->lane_op = copy;
    if (hccl_coll_arm_timeout(comm, req) != hcclSuccess)
        HCCL_WARN("rank %d: %s; the lane operation goes on without the exec timeout", comm->rank,
                  hccl_error_last());
    c->req = req;
    c->state = CALL_PARKED;
}

bool hccl_coll_lane_blocking(struct hcclComm *comm, int coll, const void *sendbuf, void *recvbuf,
                             size_t count, hcclDataType_t dtype, hcclRedOp_t op, int root,
                             hcclResult_t *res_p)
{
    lane_call_t c = {.comm = comm, .state = CALL_NEW};
    hccl_help_t help = {lane_call_step, lane_call_park, &c};

    /* Fault injection counts on requests, HCCL_CHECK compares a request's signature first; a
     * loop of the caller's own drives what it borrowed. */
    if (comm->faults || comm->params.check || hccl_reactor_is_external(comm->reactor))
        return false;
    c.op.coll = coll;
    c.op.sendbuf = sendbuf;
    c.op.recvbuf = recvbuf;
    c.op.count = count;
    c.op.dtype = dtype;
    c.op.op = op;
    c.op.root = root;
    c.op.done = lane_call_done;
    c.op.arg = &c;
    for (;;) {
        bool drove = hccl_reactor_help_until(comm->reactor, &help);
        if (c.state == CALL_NEW || c.state == CALL_DECLINED)
            return false;
        if (c.state == CALL_DONE)
            break;
        if (c.state == CALL_PARKED) {
            *res_p = hcclWait(&c.req);
            return true;
        }
        /* Still ours and on the lane (parking found no memory): drive on, or let whoever
         * holds the reactor finish it. */
        if (!drove)
            sched_yield();
    }
    *res_p = c.res == hcclSuccess ? hcclSuccess : HCCL_FAIL(c.res, "%s", c.msg);
    return true;
}
