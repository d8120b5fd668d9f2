/* hcclCommInitFromEnv: rank, size and rendezvous from the environment of the usual launchers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/comm.h"

/* A whole, non-negative decimal integer from the environment, or -1. */
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
    char addr[300];

    hccl_log_init();
    if (!comm)
        return HCCL_FAIL(hcclInvalidArgument, "hcclCommInitFromEnv: comm is NULL");
    for (size_t i = 0; i < sizeof(sources) / sizeof(sources[0]); i++) {
        long rank = env_int(sources[i][0]), size = env_int(sources[i][1]);
        if (rank == -1 || size == -1 || (i == 0 && !commid))
            continue;
        if (rank < 0 || size < 1 || rank >= size)
            return HCCL_FAIL(hcclInvalidUsage, "hcclCommInitFromEnv: %s=%s and %s=%s are not a valid "
                                               "rank and size", sources[i][0], getenv(sources[i][0]),
                             sources[i][1], getenv(sources[i][1]));
        if (commid && *commid) {
            snprintf(addr, sizeof(addr), "%s", commid);
        } else if (getenv("MASTER_ADDR") && getenv("MASTER_PORT")) {
            snprintf(addr, sizeof(addr), "%s:%s", getenv("MASTER_ADDR"), getenv("MASTER_PORT"));
        } else {
            return HCCL_FAIL(hcclInvalidUsage, "hcclCommInitFromEnv: %s gives rank %ld of %ld but no "
                                               "rendezvous: set HCCL_COMM_ID=host:port (or "
                                               "MASTER_ADDR and MASTER_PORT)", sources[i][2], rank, size);
        }
        HCCL_INFO(HCCL_SUB_INIT, "rank %ld of %ld from the %s environment, rendezvous %s", rank, size,
                  sources[i][2], addr);
        return hcclCommInitGroup(comm, (uint32_t)size, addr, (uint32_t)rank);
    }
    return HCCL_FAIL(hcclInvalidUsage, "hcclCommInitFromEnv: no launcher environment found (HCCL_COMM_ID "
                                       "+ RANK_ID + WORLD_SIZE, torchrun, Open MPI, MPICH or Slurm)");
}
