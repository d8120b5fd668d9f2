/* Communicators' failure path: the first failure is recorded and spreads to every request. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/comm_impl.h"
#include "core/fault.h"
#include "base/quarantine.h"
#include "core/wire.h"

void hccl_comm_error_text(struct hcclComm *comm, char *buf, size_t len)
{
    pthread_mutex_lock(&comm->mtx);
    snprintf(buf, len, "%s", comm->async_msg);
    pthread_mutex_unlock(&comm->mtx);
}

/* Records the communicator's first failure; first (may be NULL) receives its text. */
static void comm_record_failure(struct hcclComm *comm, hcclResult_t res, const char *msg,
                                char *first, size_t len)
{
    pthread_mutex_lock(&comm->mtx);
    if (atomic_load(&comm->async_error) == hcclSuccess) {
        snprintf(comm->async_msg, sizeof(comm->async_msg), "%s",
                 msg ? msg : hcclGetErrorString(res));
        atomic_store(&comm->async_error, res);
    }
    if (first)
        snprintf(first, len, "%s", comm->async_msg);
    pthread_mutex_unlock(&comm->mtx);
}

void hccl_comm_fail_now(struct hcclComm *comm, hcclResult_t res, const char *msg)
{
    char first[sizeof(comm->async_msg)];

    comm_record_failure(comm, res, msg, first, sizeof(first));
    /* Runs first, so that they carry this message rather than their links' echoes of it. */
    if (comm->exec)
        hccl_exec_fail_all(comm->exec, res, first);
    if (comm->lane)
        hccl_lane_fail_all(comm->lane, res, first);
    hccl_comm_fail_self_p2p(comm, res, first);
    if (comm->links_aborted)
        return;
    comm->links_aborted = true;
    /* Closing every connection tells the peers, which fail in turn: nobody waits forever. */
    for (int id = 0; id < HCCL_LINK_MAX; id++)
        if (comm->link_ctx[id])
            hccl_link_by_id(id)->abort(comm->link_ctx[id], res);
}

enum { FATAL_NONE, FATAL_QUEUED, FATAL_APPLIED };

bool hccl_comm_apply_queued_fatal(struct hcclComm *comm)
{
    int queued = FATAL_QUEUED;

    if (!atomic_compare_exchange_strong(&comm->fatal_state, &queued, FATAL_APPLIED))
        return false;
    hccl_comm_fail(comm, comm->fatal_res, comm->fatal_msg);
    return true;
}

static void comm_on_fatal_post(hccl_post_t *post)
{
    hccl_comm_apply_queued_fatal(
        (struct hcclComm *)((char *)post - offsetof(struct hcclComm, fatal_post)));
}

/*
 * A link failed. The communicator's error is set at once (hcclCommGetAsyncError, new calls),
 * but failing what is in flight goes behind the completions the link queued before it: a
 * receive that the peer's last frames completed advances its collective first, so that a
 * collective whose data all arrived before the peer went away still finishes.
 */
void hccl_comm_on_link_fatal(void *arg, hcclResult_t res, const char *msg)
{
    struct hcclComm *comm = arg;
    bool queue = false;

    comm_record_failure(comm, res, msg, NULL, 0);
    if (atomic_load(&comm->fatal_state) == FATAL_APPLIED) {
        hccl_comm_fail(comm, res, msg); /* the first failure's message stays */
        return;
    }
    /* Under mtx the first cause is written before the state says it is queued: the reactor
     * may apply it as soon as it reads QUEUED. */
    pthread_mutex_lock(&comm->mtx);
    if (atomic_load(&comm->fatal_state) == FATAL_NONE) {
        comm->fatal_res = res;
        snprintf(comm->fatal_msg, sizeof(comm->fatal_msg), "%s",
                 msg ? msg : hcclGetErrorString(res));
        atomic_store(&comm->fatal_state, FATAL_QUEUED);
        queue = true;
    }
    pthread_mutex_unlock(&comm->mtx);
    if (queue) {
        comm->fatal_post.fn = comm_on_fatal_post;
        hccl_reactor_post(comm->reactor, &comm->fatal_post);
    }
}
