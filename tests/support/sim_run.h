/* Runs one plan per rank over the sim link and waits for all of them. */
#ifndef HCCL_TEST_SIM_RUN_H
#define HCCL_TEST_SIM_RUN_H

#include "algos/algos.h"
#include "links/link.h"
#include "reactor/reactor.h"
#include "sched/sched.h"

typedef struct {
    hcclResult_t res[64];
    uint64_t bytes_sent[64];
    uint64_t bytes_stored[64]; /* hccl_sim_bytes_stored */
    uint64_t bytes_read_direct[64]; /* hccl_sim_bytes_read_direct */
    uint32_t nreduces[64];          /* reduce steps of each rank's plan */
    uint64_t bytes_reduced_stored[64]; /* hccl_exec_bytes_reduced_stored */
} sim_result_t;

/*
 * Builds algo's plan for shape on each of n ranks, runs them with sendbufs[r] and recvbufs[r],
 * and returns hcclSuccess when every run succeeded.
 */
hcclResult_t sim_run_allreduce(hccl_algo_t algo, int n, const hccl_coll_shape_t *shape,
                               void **sendbufs, void **recvbufs, sim_result_t *out);

/* Executors that sim_run_plans makes from now on store results past the cache in runs of plans
 * over bytes (hccl_exec_set_store_min; 0, the default: never). */
void sim_run_set_store_min(size_t bytes);

/*
 * Runs prebuilt plans (plans[r] for rank r, not released) over the sim link with the given
 * buffers; out (may be NULL) gets each rank's result and bytes sent. hcclInProgress means the
 * plans deadlocked (the sim link holds nothing: every send waits for its receive).
 */
hcclResult_t sim_run_plans(int n, hccl_plan_t **plans, void **sendbufs, void **recvbufs,
                           sim_result_t *out);

#endif
