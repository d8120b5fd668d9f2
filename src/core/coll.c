/* Collective entry points: argument checks on the caller's thread, planning on the reactor. */
#include <stdio.h>
#include <string.h>

#include "core/comm.h"

static void coll_finish(struct hcclComm *comm, struct hcclRequest *req, hcclResult_t res,
                        const char *msg)
{
    hccl_request_complete(req, res, msg); /* req may be gone after this */
    pthread_mutex_lock(&comm->mtx);
    comm->outstanding--;
    pthread_cond_broadcast(&comm->cond);
    pthread_mutex_unlock(&comm->mtx);
}

static void coll_on_run_done(hccl_run_t *run, hcclResult_t res, const char *msg, void *arg)
{
    struct hcclRequest *req = arg;
    struct hcclComm *comm = req->owner;
    char text[768];

    (void)run;
    hccl_timer_destroy(req->timer);
    req->timer = NULL;
    req->run = NULL;
    if (res != hcclSuccess)
        snprintf(text, sizeof(text), "%s (seq %llu, %zu x %s): %s", hccl_coll_name(req->coll),
                 (unsigned long long)req->seq, req->count, hccl_dtype_name(req->dtype), msg ? msg : "");
    coll_finish(comm, req, res, res == hcclSuccess ? NULL : text);
}

static void coll_on_timeout(void *arg)
{
    struct hcclRequest *req = arg;
    struct hcclComm *comm = req->owner;
    char msg[512], peers[256] = "";

    if (req->run)
        hccl_exec_run_pending_peers(req->run, peers, sizeof(peers));
    snprintf(msg, sizeof(msg), "rank %d: %s seq %llu did not finish within the exec timeout of %d ms; "
             "still waiting on ranks %s", comm->rank, hccl_coll_name(req->coll),
             (unsigned long long)req->seq, comm->params.exec_timeout_ms, peers[0] ? peers : "(none)");
    HCCL_WARN("%s", msg);
    hccl_comm_fail(comm, hcclTimeout, msg);
}

/* Reactor thread: plan the request (cached by shape) and start it. */
static void coll_on_post(hccl_post_t *post)
{
    struct hcclRequest *req = (struct hcclRequest *)((char *)post - offsetof(struct hcclRequest, post));
    struct hcclComm *comm = req->owner;
    hccl_coll_shape_t shape = {(hccl_coll_t)req->coll, req->count, (hcclDataType_t)req->dtype,
                               (hcclRedOp_t)req->op, req->root, NULL};
    hccl_algo_t algo;
    hccl_plan_key_t key;
    hccl_plan_t *plan;
    hccl_timer_t *timer = NULL;
    hcclResult_t res, err = atomic_load(&comm->async_error);

    if (err != hcclSuccess) {
        char msg[512];
        hccl_comm_error_text(comm, msg, sizeof(msg));
        coll_finish(comm, req, err, msg);
        return;
    }
    if (req->count == 0) {
        coll_finish(comm, req, hcclSuccess, NULL);
        return;
    }
    algo = hccl_tuner_pick(&comm->tuner, &shape, comm->nranks);
    memset(&key, 0, sizeof(key));
    key = (hccl_plan_key_t){req->coll, algo, req->count, req->dtype, req->op, req->root};
    plan = hccl_plan_cache_get(comm->plans, &key);
    if (!plan) {
        res = hccl_algo_build(&comm->tuner, algo, comm->rank, comm->nranks, &shape, &plan);
        if (res != hcclSuccess) {
            coll_finish(comm, req, res, hccl_error_last());
            return;
        }
        HCCL_INFO(HCCL_SUB_ALGO, "rank %d: %s of %zu x %s on %d ranks: %s, %u steps", comm->rank,
                  hccl_coll_name(shape.coll), shape.count, hccl_dtype_name(shape.dtype), comm->nranks,
                  hccl_algo_name(algo), plan->nsteps);
        hccl_plan_cache_put(comm->plans, &key, plan);
    }
    if (comm->params.exec_timeout_ms > 0) {
        res = hccl_timer_create(comm->reactor, coll_on_timeout, req, &timer);
        if (res != hcclSuccess) {
            hccl_plan_release(plan);
            coll_finish(comm, req, res, hccl_error_last());
            return;
        }
        hccl_timer_arm(timer, comm->params.exec_timeout_ms);
    }
    req->timer = timer;
    res = hccl_exec_start(comm->exec, plan, req->seq, req->sendbuf, req->recvbuf, coll_on_run_done, req,
                          (hccl_run_t **)&req->run);
    hccl_plan_release(plan);
    if (res != hcclSuccess) {
        hccl_timer_destroy(timer);
        req->timer = NULL;
        coll_finish(comm, req, res, hccl_error_last());
    }
}

hcclResult_t hccl_comm_post(struct hcclComm *comm, struct hcclRequest *req)
{
    req->owner = comm;
    req->seq = atomic_fetch_add(&comm->next_seq, 1);
    req->post.fn = coll_on_post;
    pthread_mutex_lock(&comm->mtx);
    comm->outstanding++;
    pthread_mutex_unlock(&comm->mtx);
    hccl_reactor_post(comm->reactor, &req->post);
    return hcclSuccess;
}

static bool ranges_overlap(const void *a, const void *b, size_t len)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;

    return x < y + len && y < x + len;
}

HCCL_API hcclResult_t hcclAllReduceAsync(const void *sendbuf, void *recvbuf, size_t count,
                                         hcclDataType_t datatype, hcclRedOp_t op, hcclComm_t comm,
                                         hcclRequest_t *req_p)
{
    struct hcclRequest *req;
    hcclResult_t err;
    size_t esz;

    HCCL_CHECK(hccl_comm_check(comm, "hcclAllReduceAsync"));
    if (!req_p)
        return HCCL_FAIL(hcclInvalidArgument, "hcclAllReduceAsync: req is NULL");
    if ((unsigned)datatype >= hcclNumTypes)
        return HCCL_FAIL(hcclInvalidArgument, "hcclAllReduceAsync: datatype %d is not a valid "
                                              "hcclDataType_t", (int)datatype);
    if ((unsigned)op >= hcclNumOps)
        return HCCL_FAIL(hcclInvalidArgument, "hcclAllReduceAsync: op %d is not a valid hcclRedOp_t",
                         (int)op);
    esz = hccl_dtype_size(datatype);
    if (count > SIZE_MAX / esz)
        return HCCL_FAIL(hcclInvalidArgument, "hcclAllReduceAsync: count %zu of %s overflows", count,
                         hccl_dtype_name(datatype));
    if (count > 0 && (!sendbuf || !recvbuf))
        return HCCL_FAIL(hcclInvalidArgument, "hcclAllReduceAsync: %s is NULL with count %zu",
                         sendbuf ? "recvbuf" : "sendbuf", count);
    if (count > 0 && sendbuf != recvbuf && ranges_overlap(sendbuf, recvbuf, count * esz))
        return HCCL_FAIL(hcclInvalidArgument, "hcclAllReduceAsync: sendbuf and recvbuf overlap without "
                                              "being equal (in-place needs sendbuf == recvbuf)");
    err = atomic_load(&comm->async_error);
    if (err != hcclSuccess) {
        char msg[512];
        hccl_comm_error_text(comm, msg, sizeof(msg));
        return HCCL_FAIL(err, "hcclAllReduceAsync: the communicator has failed: %s", msg);
    }
    HCCL_CHECK(hccl_request_create(comm->reactor, &req));
    req->coll = HCCL_COLL_ALLREDUCE;
    req->sendbuf = sendbuf;
    req->recvbuf = recvbuf;
    req->count = count;
    req->dtype = datatype;
    req->op = op;
    req->root = -1;
    hccl_comm_post(comm, req);
    *req_p = req;
    return hcclSuccess;
}

HCCL_API hcclResult_t hcclAllReduce(const void *sendbuf, void *recvbuf, size_t count,
                                    hcclDataType_t datatype, hcclRedOp_t op, hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(hccl_comm_check(comm, "hcclAllReduce"));
    if (hccl_reactor_in_loop(comm->reactor))
        return HCCL_FAIL(hcclInvalidUsage, "hcclAllReduce: the blocking form was called from a "
                                           "callback of the communicator; it would never finish");
    HCCL_CHECK(hcclAllReduceAsync(sendbuf, recvbuf, count, datatype, op, comm, &req));
    return hcclWait(&req);
}
