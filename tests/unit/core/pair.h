/*
 * Two ranks of one communicator in this process (a thread each for the blocking init), over
 * the link named, for the diagnostics tests.
 */
#ifndef HCCL_TEST_PAIR_H
#define HCCL_TEST_PAIR_H

#include <pthread.h>
#include <stdlib.h>

#include "hccl.h"

typedef struct {
    hcclUniqueId id;
    int rank;
    hcclComm_t comm;
    hcclResult_t res;
} pair_init_t;

static void *pair_init_rank(void *p)
{
    pair_init_t *a = p;
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;

    cfg.connectTimeoutMs = 30000;
    a->res = hcclCommInitRankConfig(&a->comm, 2, a->id, a->rank, &cfg);
    return NULL;
}

/* comms[r] is rank r's communicator; false if any step failed. */
static inline bool pair_create(const char *links, hcclComm_t comms[2])
{
    pair_init_t a[2];
    pthread_t th[2];
    bool ok = true;

    setenv("HCCL_LINKS", links, 1);
    if (hcclGetUniqueId(&a[0].id) != hcclSuccess) {
        unsetenv("HCCL_LINKS");
        return false;
    }
    for (int r = 0; r < 2; r++) {
        a[r].id = a[0].id;
        a[r].rank = r;
        a[r].comm = NULL;
        if (pthread_create(&th[r], NULL, pair_init_rank, &a[r]) != 0)
            return false;
    }
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
        ok &= a[r].res == hcclSuccess;
        comms[r] = a[r].comm;
    }
    unsetenv("HCCL_LINKS");
    return ok;
}

/*
 * Returns once comm's reactor has handled every call posted on comm before: a send to itself
 * and its receive complete on the reactor, after the posts queued ahead of them.
 */
static inline bool pair_sync_reactor(hcclComm_t comm, int rank)
{
    int x = 1, y = 0;
    hcclRequest_t reqs[2];

    if (hcclSendAsync(&x, 1, hcclInt32, rank, comm, &reqs[0]) != hcclSuccess ||
        hcclRecvAsync(&y, 1, hcclInt32, rank, comm, &reqs[1]) != hcclSuccess)
        return false;
    return hcclWaitAll(2, reqs) == hcclSuccess && y == 1;
}

#endif /* HCCL_TEST_PAIR_H */
