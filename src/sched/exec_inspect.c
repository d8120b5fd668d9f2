/* Read-only views of the executor's runs, for timeouts' messages and the state dump. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/exec_impl.h"

int hccl_exec_inflight(const hccl_exec_t *ex)
{
    return ex->inflight;
}

uint64_t hccl_exec_run_seq(const hccl_run_t *run)
{
    return run->seq;
}

bool hccl_exec_run_finishing(const hccl_run_t *run)
{
    return run->finishing;
}

/* Appends each peer of a send or receive step in one of the states wanted; returns how many. */
static int run_peers_in(const hccl_run_t *run, const bool want[], char *buf, size_t len)
{
    const hccl_plan_t *p = run->plan;
    size_t o = 0;
    int found = 0;
    char *seen = hccl_calloc((size_t)p->nranks, 1);

    buf[0] = '\0';
    for (uint32_t i = 0; i < p->nsteps && seen; i++) {
        const hccl_step_t *s = &p->steps[i];
        uint32_t left;
        if ((s->kind != HCCL_STEP_SEND && s->kind != HCCL_STEP_RECV) || seen[s->peer] ||
            !want[hccl_exec_run_step_state(run, i, &left)])
            continue;
        seen[s->peer] = 1;
        int w = snprintf(buf + o, len - o, "%s%d", o ? "," : "", s->peer);
        if (w < 0 || (size_t)w >= len - o)
            break;
        o += (size_t)w;
        found++;
    }
    hccl_free(seen);
    return found;
}

bool hccl_exec_run_pending_peers(const hccl_run_t *run, char *buf, size_t len)
{
    static const bool posted[HCCL_STEP_FAILED + 1] = {[HCCL_STEP_POSTED] = true};
    static const bool not_issued[HCCL_STEP_FAILED + 1] = {
        [HCCL_STEP_BLOCKED] = true, [HCCL_STEP_READY] = true};

    if (run_peers_in(run, posted, buf, len) > 0)
        return true;
    run_peers_in(run, not_issued, buf, len);
    return false;
}

/* ---- read-only views for diagnostics (the caller holds the progress lock) ---- */

const hccl_run_t *hccl_exec_first_run(const hccl_exec_t *ex)
{
    return ex->runs;
}

const hccl_run_t *hccl_exec_next_run(const hccl_run_t *run)
{
    return run->next;
}

const hccl_plan_t *hccl_exec_run_plan(const hccl_run_t *run)
{
    return run->plan;
}

void *hccl_exec_run_arg(const hccl_run_t *run)
{
    return run->cb_arg;
}

uint32_t hccl_exec_run_remaining(const hccl_run_t *run)
{
    return run->remaining;
}

hcclResult_t hccl_exec_run_result(const hccl_run_t *run)
{
    return run->res;
}

bool hccl_exec_run_failed(const hccl_run_t *run, const char **msg_p)
{
    *msg_p = run->failed ? run->msg : NULL;
    return run->failed;
}

hccl_step_state_t hccl_exec_run_step_state(const hccl_run_t *run, uint32_t step, uint32_t *left_p)
{
    const hccl_step_t *s = &run->plan->steps[step];

    *left_p = run->left[step];
    if (run->left[step] > 0)
        return HCCL_STEP_BLOCKED;
    /* The ready stack holds what was unblocked and not issued yet; xfers of those are still
     * zeroed, so it is looked at first. */
    for (uint32_t i = 0; i < run->nready; i++)
        if (run->ready[i] == step)
            return HCCL_STEP_READY;
    if (s->kind != HCCL_STEP_SEND && s->kind != HCCL_STEP_RECV)
        return HCCL_STEP_DONE; /* reductions and copies run as soon as they are issued */
    if (run->xfers[step].res == hcclInProgress)
        return HCCL_STEP_POSTED;
    return run->xfers[step].res == hcclSuccess ? HCCL_STEP_DONE : HCCL_STEP_FAILED;
}
