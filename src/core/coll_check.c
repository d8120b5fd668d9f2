/* HCCL_CHECK: every rank's signature of the call gathered and compared first; then the
 * call starts on the lane or its plan, in the order the calls were posted. */
#include <stdio.h>
#include <string.h>

#include "core/coll.h"
#include "core/fault.h"

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
        snprintf(buf, len, "broadcast(count %llu, %s, root %d)", (unsigned long long)g->count, dt,
                 g->root);
    else if (c == HCCL_COLL_REDUCE)
        snprintf(buf, len, "reduce(count %llu, %s, %s, root %d)", (unsigned long long)g->count, dt,
                 hccl_op_name((hcclRedOp_t)g->op), g->root);
    else if (c == HCCL_COLL_ALLREDUCE || c == HCCL_COLL_REDUCESCATTER)
        snprintf(buf, len, "%s(count %llu, %s, %s)", hccl_coll_name(c),
                 (unsigned long long)g->count, dt, hccl_op_name((hcclRedOp_t)g->op));
    else if (c == HCCL_COLL_BARRIER)
        snprintf(buf, len, "barrier()");
    else
        snprintf(buf, len, "%s(count %llu, %s)", hccl_coll_name(c), (unsigned long long)g->count,
                 dt);
}

/*
 * Checked requests start in the order they were posted, whatever order their checks end in:
 * the lane runs operations in the order each rank enqueued them, which must be the same on
 * every rank.
 */
static void checking_remove(struct hcclComm *comm, struct hcclRequest *req)
{
    struct hcclRequest **at = &comm->checking_head, *prev = NULL;

    while (*at && *at != req) {
        prev = *at;
        at = &(*at)->next_checking;
    }
    if (!*at)
        return;
    *at = req->next_checking;
    if (comm->checking_tail == req)
        comm->checking_tail = prev;
    req->next_checking = NULL;
}

static void checking_start_passed(struct hcclComm *comm)
{
    struct hcclRequest *req;

    while ((req = comm->checking_head) && req->check_passed) {
        checking_remove(comm, req);
        if (hccl_coll_lane_takes(comm, req->coll, req->count, (hcclDataType_t)req->dtype))
            hccl_coll_lane_start(comm, req);
        else
            hccl_coll_start(comm, req);
    }
}

static void coll_on_check_done(hccl_run_t *run, hcclResult_t res, const char *msg, void *arg)
{
    struct hcclRequest *req = arg;
    struct hcclComm *comm = req->owner;
    const coll_sig_t *table = (const coll_sig_t *)req->check + 1;
    char text[768], full[1024], a[160], b[160];

    (void)run;
    req->run = NULL;
    if (res != hcclSuccess) {
        snprintf(text, sizeof(text), "%s (seq %llu, signature check): %s",
                 hccl_coll_name(req->coll), (unsigned long long)req->seq, msg ? msg : "");
        checking_remove(comm, req);
        hccl_coll_finish(comm, req, res, text);
        checking_start_passed(comm);
        return;
    }
    for (int r = 1; r < comm->nranks; r++) {
        if (memcmp(&table[r], &table[0], sizeof(table[0])) == 0)
            continue;
        sig_describe(&table[0], a, sizeof(a));
        sig_describe(&table[r], b, sizeof(b));
        snprintf(text, sizeof(text),
                 "collective mismatch at seq %llu (HCCL_CHECK): rank 0 called %s, "
                 "rank %d called %s",
                 (unsigned long long)req->seq, a, r, b);
        HCCL_WARN("rank %d: %s", comm->rank, text);
        /* Every rank compares the same table: rank 0's call is the reference, so it is the
         * origin everywhere, and an abort passes the mismatch on to ranks still comparing. */
        hccl_comm_cause_note(comm, hcclInvalidUsage, 0, text, full, sizeof(full));
        checking_remove(comm, req);
        hccl_coll_finish(comm, req, hcclInvalidUsage, full);
        checking_start_passed(comm);
        return;
    }
    req->check_passed = true;
    checking_start_passed(comm);
}

static hcclResult_t check_plan(struct hcclComm *comm, hccl_plan_t **plan_p)
{
    hccl_coll_shape_t shape = {
        HCCL_COLL_ALLGATHER, sizeof(coll_sig_t), hcclUint8, hcclSum, -1, NULL};
    hccl_plan_key_t key = {HCCL_COLL_ALLGATHER, HCCL_NUM_ALGOS, sizeof(coll_sig_t),
                           hcclUint8,           hcclSum,        -2};
    hccl_plan_t *plan = hccl_plan_cache_get(comm->plans, &key);

    if (!plan) {
        /* A plan even where the lane would take a call of this size: its messages are tagged. */
        hccl_algo_t algo = hccl_tuner_pick_plan(&comm->tuner, &shape, comm->nranks);
        HCCL_CHECK(hccl_algo_build(&comm->tuner, algo, comm->rank, comm->nranks, &shape, &plan));
        for (uint32_t i = 0; i < plan->nsteps; i++)
            if (plan->steps[i].kind == HCCL_STEP_SEND || plan->steps[i].kind == HCCL_STEP_RECV)
                plan->steps[i].tag |= HCCL_CHECK_TAG_BIT;
        hccl_plan_cache_put(comm->plans, &key, plan);
    }
    *plan_p = plan;
    return hcclSuccess;
}

void hccl_coll_start_checked(struct hcclComm *comm, struct hcclRequest *req)
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
    *(comm->checking_tail ? &comm->checking_tail->next_checking : &comm->checking_head) = req;
    comm->checking_tail = req;
    res = check_plan(comm, &plan);
    if (res == hcclSuccess) {
        res = hccl_exec_start(comm->exec, plan, req->seq, sig, sig + 1, coll_on_check_done, req,
                              (hccl_run_t **)&req->run);
        hccl_plan_release(plan);
    }
    if (res != hcclSuccess) {
        checking_remove(comm, req);
        hccl_coll_finish(comm, req, res, hccl_error_last());
        checking_start_passed(comm);
    }
}
