/* hcclCommInitFromEnv: rank, size and rendezvous from the environment of the usual launchers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "core/pmix.h"

/* A whole, non-negative decimal integer from the environment, -1 when unset, -2 when malformed. */
static long env_int(const char *name)
{
    const char *v = getenv(name);
    char *end;
    long x;

    if (!v || !*v)
        return -1;
    errno = 0;
    x = strtol(v, &end, 10);
    return errno || *end || x < 0 ? -2 : x;
}

static bool env_set(const char *name)
{
    const char *v = getenv(name);

    return v && *v;
}

HCCL_API hcclResult_t hcclCommInitFromEnv(hcclComm_t *comm)
{
    static const char *const sources[][3] = {
        {"RANK_ID", "WORLD_SIZE", "HCCL_COMM_ID"},
        {"RANK", "WORLD_SIZE", "torchrun"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"},
        {"PMI_RANK", "PMI_SIZE", "MPICH/Hydra"},
        {"SLURM_PROCID", "SLURM_NTASKS", "Slurm"},
    };
    const char *commid = getenv("HCCL_COMM_ID");
    bool have_commid = commid && *commid;
    bool have_master = env_set("MASTER_ADDR") && env_set("MASTER_PORT");
    char addr[300];
    int prank, psize;

    hccl_log_init();
    if (!comm)
        return HCCL_FAIL(hcclInvalidArgument, "hcclCommInitFromEnv: comm is NULL");
    /*
     * Under a PMIx launcher the rendezvous goes through its server, unless an address is given:
     * HCCL_COMM_ID, or torchrun's MASTER_ADDR with its RANK (torchrun's workers share the PMIx
     * identity of the agent a launcher started, so PMIx cannot tell them apart).
     */
    if (hccl_pmix_launched() && hccl_pmix_built() && !have_commid &&
        !(have_master && env_int("RANK") >= 0 && env_int("WORLD_SIZE") >= 1))
        return hccl_pmix_comm_init(comm);
    for (size_t i = 0; i < sizeof(sources) / sizeof(sources[0]); i++) {
        long rank = env_int(sources[i][0]), size = env_int(sources[i][1]);
        if (rank == -1 || size == -1 || (i == 0 && !commid))
            continue;
        if (rank < 0 || size < 1 || rank >= size)
            return HCCL_FAIL(hcclInvalidUsage,
                             "hcclCommInitFromEnv: %s=%s and %s=%s are not a valid "
                             "rank and size",
                             sources[i][0], getenv(sources[i][0]), sources[i][1],
                             getenv(sources[i][1]));
        if (have_commid) {
            snprintf(addr, sizeof(addr), "%s", commid);
        } else if (have_master) {
            snprintf(addr, sizeof(addr), "%s:%s", getenv("MASTER_ADDR"), getenv("MASTER_PORT"));
        } else {
            return HCCL_FAIL(hcclInvalidUsage,
                             "hcclCommInitFromEnv: %s gives rank %ld of %ld but no "
                             "rendezvous: set HCCL_COMM_ID=host:port (or "
                             "MASTER_ADDR and MASTER_PORT)%s",
                             sources[i][2], rank, size,
                             hccl_pmix_launched() ? ", or build hccl with PMIx (libpmix-dev)" : "");
        }
        HCCL_INFO(HCCL_SUB_INIT, "rank %ld of %ld from the %s environment, rendezvous %s", rank,
                  size, sources[i][2], addr);
        return hcclCommInitGroup(comm, (uint32_t)size, addr, (uint32_t)rank);
    }
    /* A PMIx launcher that sets no rank variable of its own (prterun) with HCCL_COMM_ID given. */
    if (hccl_pmix_launched() && hccl_pmix_built() && have_commid) {
        HCCL_CHECK(hccl_pmix_rank_size(&prank, &psize));
        HCCL_INFO(HCCL_SUB_INIT, "rank %d of %d from PMIx, rendezvous %s", prank, psize, commid);
        return hcclCommInitGroup(comm, (uint32_t)psize, commid, (uint32_t)prank);
    }
    if (hccl_pmix_launched())
        return HCCL_FAIL(hcclInvalidUsage,
                         "hcclCommInitFromEnv: a PMIx launcher started this process, but "
                         "this build has no PMIx: set HCCL_COMM_ID=host:port, or build "
                         "hccl with PMIx (libpmix-dev)");
    return HCCL_FAIL(hcclInvalidUsage,
                     "hcclCommInitFromEnv: no launcher environment found (HCCL_COMM_ID "
                     "+ RANK_ID + WORLD_SIZE, torchrun, Open MPI, MPICH, Slurm or a "
                     "PMIx launcher)");
}
