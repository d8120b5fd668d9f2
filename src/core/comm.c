/* Communicators: validation, release, destruction, abort and queries. Creation: comm_init.c;
 * unique ids: comm_id.c; the failure path: comm_fail.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/comm_impl.h"
#include "core/fault.h"
#include "base/quarantine.h"
#include "core/wire.h"

hcclResult_t hccl_comm_check(const struct hcclComm *comm, const char *fn)
{
    if (!comm)
        return HCCL_FAIL(hcclInvalidArgument, "%s: comm is NULL", fn);
    if (comm->magic == HCCL_COMM_DEAD)
        return HCCL_FAIL(hcclInvalidUsage, "%s: comm was destroyed or aborted (use after destroy)",
                         fn);
    if (comm->magic != HCCL_COMM_MAGIC)
        return HCCL_FAIL(hcclInvalidUsage, "%s: comm is not a live communicator", fn);
    return hcclSuccess;
}

/* graceful: every collective finished; tell the peers so that our going is not a failure. */
void hccl_comm_free(struct hcclComm *comm, bool graceful)
{
    int64_t deadline = hccl_now_ms() + 5000;

    if (!comm)
        return;
    hccl_dump_unregister(comm);
    hccl_reactor_stop(comm->reactor);
    hccl_comm_apply_queued_fatal(
        comm); /* one still queued: before the links go, as it would have run */
    for (int id = 0; graceful && !comm->links_aborted && id < HCCL_LINK_MAX; id++)
        if (comm->link_ctx[id] && HCCL_LINK_HAS_OP(hccl_link_by_id(id), shutdown))
            hccl_link_by_id(id)->shutdown(comm->link_ctx[id], deadline);
    for (int id = 0; id < HCCL_LINK_MAX; id++)
        if (comm->link_ctx[id])
            hccl_link_by_id(id)->fini(comm->link_ctx[id]);
    hccl_exec_destroy(comm->exec);
    hccl_lane_destroy(comm->lane);
    hccl_plan_cache_destroy(comm->plans);
    hccl_comm_cause_fini(comm); /* its timer is freed by the reactor's last posts */
    hccl_timer_destroy(comm->exec_timer); /* so is this one */
    hccl_reactor_destroy(comm->reactor);
    hccl_comm_cause_free(comm);
    hccl_free(comm->conns);
    hccl_free(comm->link_of);
    hccl_free(comm->node_of);
    hccl_free(comm->p2p_send_seq);
    hccl_free(comm->p2p_recv_seq);
    hccl_free(comm->cards);
    hccl_fault_detach(comm);
    hccl_shrink_close(comm);
    pthread_mutex_destroy(&comm->mtx);
    comm->magic = HCCL_COMM_DEAD;
    hccl_quarantine_free(HCCL_QUARANTINE_COMM, comm, sizeof(*comm)); /* a stale handle reads DEAD */
}

/* ---- destruction ---- */

/* Destroy and abort wait for the reactor, so they cannot run on it. */
static hcclResult_t comm_check_not_in_loop(struct hcclComm *comm, const char *fn)
{
    if (hccl_reactor_in_loop(comm->reactor) ||
        (hccl_reactor_is_external(comm->reactor) && hccl_reactor_in_callback(comm->reactor)))
        return HCCL_FAIL(hcclInvalidUsage,
                         "%s: called from a callback of the loop that drives the "
                         "communicator; call it after the callback returns",
                         fn);
    return hcclSuccess;
}

HCCL_API hcclResult_t hcclCommDestroy(hcclComm_t comm)
{
    HCCL_CHECK(hccl_comm_check(comm, "hcclCommDestroy"));
    HCCL_CHECK(comm_check_not_in_loop(comm, "hcclCommDestroy"));
    hccl_reactor_wait_idle(comm->reactor);
    hccl_fault_point(comm, HCCL_FAULT_AT_DESTROY, UINT64_MAX);
    hccl_comm_free(comm, true);
    return hcclSuccess;
}

typedef struct {
    hccl_post_t post;
    struct hcclComm *comm;
} abort_item_t;

static void comm_on_abort(hccl_post_t *post)
{
    abort_item_t *item = (abort_item_t *)post;

    hccl_comm_cause_abort(item->comm);
    hccl_reactor_uncount(item->comm->reactor);
}

HCCL_API hcclResult_t hcclCommAbort(hcclComm_t comm)
{
    abort_item_t item;

    HCCL_CHECK(hccl_comm_check(comm, "hcclCommAbort"));
    HCCL_CHECK(comm_check_not_in_loop(comm, "hcclCommAbort"));
    item.comm = comm;
    item.post.fn = comm_on_abort;
    hccl_reactor_count(comm->reactor); /* the abort itself, so that the wait below covers it */
    hccl_reactor_post(comm->reactor, &item.post);
    hccl_reactor_wait_idle(comm->reactor);
    hccl_comm_free(comm, false);
    return hcclSuccess;
}

/* ---- queries ---- */

HCCL_API hcclResult_t hcclCommGetAsyncError(hcclComm_t comm, hcclResult_t *asyncError)
{
    HCCL_CHECK(hccl_comm_check(comm, "hcclCommGetAsyncError"));
    if (!asyncError)
        return HCCL_FAIL(hcclInvalidArgument, "hcclCommGetAsyncError: asyncError is NULL");
    if (hccl_reactor_is_external(comm->reactor))
        hccl_reactor_drive(comm->reactor, 0);
    *asyncError = atomic_load(&comm->async_error);
    if (*asyncError != hcclSuccess) {
        char msg[sizeof(comm->async_msg)];
        hccl_comm_error_text(comm, msg, sizeof(msg));
        hccl_error_put(msg);
    }
    return hcclSuccess;
}

HCCL_API hcclResult_t hcclCommCount(hcclComm_t comm, int *count)
{
    HCCL_CHECK(hccl_comm_check(comm, "hcclCommCount"));
    if (!count)
        return HCCL_FAIL(hcclInvalidArgument, "hcclCommCount: count is NULL");
    *count = comm->nranks;
    return hcclSuccess;
}

HCCL_API hcclResult_t hcclCommUserRank(hcclComm_t comm, int *rank)
{
    HCCL_CHECK(hccl_comm_check(comm, "hcclCommUserRank"));
    if (!rank)
        return HCCL_FAIL(hcclInvalidArgument, "hcclCommUserRank: rank is NULL");
    *rank = comm->rank;
    return hcclSuccess;
}

HCCL_API hcclResult_t hcclCommGetCompletionFd(hcclComm_t comm, int *fd)
{
    HCCL_CHECK(hccl_comm_check(comm, "hcclCommGetCompletionFd"));
    if (!fd)
        return HCCL_FAIL(hcclInvalidArgument, "hcclCommGetCompletionFd: fd is NULL");
    *fd = hccl_reactor_completion_fd(comm->reactor);
    return hcclSuccess;
}

HCCL_API hcclResult_t hcclCommProgress(hcclComm_t comm)
{
    HCCL_CHECK(hccl_comm_check(comm, "hcclCommProgress"));
    if (hccl_reactor_is_external(comm->reactor))
        hccl_reactor_drive(comm->reactor, 0);
    return hcclSuccess;
}
