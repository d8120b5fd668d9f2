/* The PMIx bootstrap of hcclCommInitFromEnv (pmix.c; stubs when built without PMIx). */
#ifndef HCCL_PMIX_H
#define HCCL_PMIX_H

#include <stdbool.h>

#include "base/base.h"

/* Whether a PMIx launcher started this process (PMIX_RANK and PMIX_NAMESPACE are set). */
bool hccl_pmix_launched(void);
/* Whether this build can talk to a PMIx server. */
bool hccl_pmix_built(void);

/*
 * Forms a communicator of the whole PMIx job: rank and size from PMIx, rank 0's unique id
 * through PMIx_Put + PMIx_Commit, a fence (bounded by the connect timeout) and PMIx_Get, then
 * hcclCommInitRank. Every rank of the job must call it, in the same order as its other
 * PMIx-formed communicators. PMIx is initialised at the first call and finalised when the
 * library unloads or the process exits.
 */
hcclResult_t hccl_pmix_comm_init(hcclComm_t *comm_p);

/* Only this process's rank and the job's size, from PMIx. */
hcclResult_t hccl_pmix_rank_size(int *rank_p, int *size_p);

#endif
