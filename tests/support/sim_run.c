#include <string.h>

#include "reactor/reactor_impl.h"
#include "sim_run.h"

typedef struct {
    int done;
    hcclResult_t res;
} run_state_t;

static void on_done(hccl_run_t *run, hcclResult_t res, const char *msg, void *arg)
{
    run_state_t *st = arg;

    (void)run, (void)msg;
    st->done = 1;
    st->res = res;
}

static size_t store_min;

void sim_run_set_store_min(size_t bytes)
{
    store_min = bytes;
}

hcclResult_t sim_run_plans(int n, hccl_plan_t **plans, void **sendbufs, void **recvbufs,
                           sim_result_t *out)
{
    hccl_reactor_t *r = NULL;
    hccl_sim_world_t *w = NULL;
    hccl_exec_t *ex[64] = {0};
    run_state_t st[64];
    hcclResult_t res = hcclSuccess;
    int ndone = 0;

    if (n > 64)
        return hcclInvalidArgument;
    memset(st, 0, sizeof(st));
    if (hccl_reactor_create(NULL, -1, &r) || hccl_sim_world_create(r, n, &w))
        return hcclSystemError;
    for (int i = 0; i < n && res == hcclSuccess; i++) {
        res = hccl_exec_create(r, i, n, hccl_sim_world_conns(w, i), &ex[i]);
        if (res == hcclSuccess)
            hccl_exec_set_store_min(ex[i], store_min);
    }
    for (int i = 0; i < n && res == hcclSuccess; i++)
        res = hccl_exec_start(ex[i], plans[i], 7, sendbufs[i], recvbufs[i], on_done, &st[i], NULL);
    /* The sim link completes everything through the post queue: once it is empty and runs
     * are still unfinished, the plans deadlocked. */
    while (res == hcclSuccess) {
        hccl_reactor_drive(r, 0);
        ndone = 0;
        for (int i = 0; i < n; i++)
            ndone += st[i].done;
        if (ndone == n || atomic_load(&r->post_head) == NULL)
            break;
    }
    for (int i = 0; i < n; i++) {
        if (out) {
            out->res[i] = st[i].done ? st[i].res : hcclInProgress;
            out->bytes_sent[i] = hccl_sim_bytes_sent(w, i);
            out->bytes_stored[i] = hccl_sim_bytes_stored(w, i);
            out->bytes_read_direct[i] = hccl_sim_bytes_read_direct(w, i);
            out->nreduces[i] = plans[i]->nreduces;
            out->bytes_reduced_stored[i] = ex[i] ? hccl_exec_bytes_reduced_stored(ex[i]) : 0;
        }
        if (res == hcclSuccess && (!st[i].done || st[i].res != hcclSuccess))
            res = st[i].done ? st[i].res : hcclInProgress;
    }
    /* After a deadlock the stuck runs still reference the sim world: their executors are left
     * (the test fails anyway), rather than freed under them. */
    for (int i = 0; i < n; i++)
        if (ex[i] && hccl_exec_inflight(ex[i]) == 0)
            hccl_exec_destroy(ex[i]);
    hccl_sim_world_destroy(w);
    hccl_reactor_destroy(r);
    return res;
}

hcclResult_t sim_run_allreduce(hccl_algo_t algo, int n, const hccl_coll_shape_t *shape,
                               void **sendbufs, void **recvbufs, sim_result_t *out)
{
    hccl_plan_t *plans[64] = {0};
    hccl_tuner_t t;
    hcclResult_t res = hcclSuccess;

    if (n > 64)
        return hcclInvalidArgument;
    hccl_tuner_init(&t, NULL, 4u << 20);
    t.chunk_bytes = 4096; /* small chunks: exercise pipelining on small buffers */
    for (int i = 0; i < n && res == hcclSuccess; i++)
        res = hccl_algo_build(&t, algo, i, n, shape, &plans[i]);
    if (res == hcclSuccess)
        res = sim_run_plans(n, plans, sendbufs, recvbufs, out);
    for (int i = 0; i < n; i++)
        hccl_plan_release(plans[i]);
    return res;
}
