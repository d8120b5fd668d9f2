/*
 * hcclCommSplit: ranks with the same color form a new communicator, ordered
 * by (key, old rank). Built from the parent's own collectives: an AllGather of
 * (color, key), then the lowest rank of each color opens a rendezvous and an
 * AllGather hands its id to the others.
 */
#include <string.h>

#include "core/comm.h"

typedef struct {
    int32_t color;
    int32_t key;
} split_entry_t;

HCCL_API hcclResult_t hcclCommSplit(hcclComm_t comm, int color, int key, hcclComm_t *newcomm)
{
    split_entry_t me = {color < 0 ? HCCL_SPLIT_NOCOLOR : color, key}, *all = NULL;
    hcclUniqueId *ids = NULL, mine;
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
    int n, leader = -1, size = 0, newrank = 0;
    hcclResult_t res, id_res;

    HCCL_CHECK(hccl_comm_check(comm, "hcclCommSplit"));
    if (!newcomm)
        return HCCL_FAIL(hcclInvalidArgument, "hcclCommSplit: newcomm is NULL");
    n = comm->nranks;
    all = hccl_calloc((size_t)n, sizeof(*all));
    ids = hccl_calloc((size_t)n, sizeof(*ids));
    if (!all || !ids) {
        res = HCCL_FAIL(hcclSystemError, "hcclCommSplit: out of memory");
        goto out;
    }
    HCCL_CHECK_GOTO(hcclAllGather(&me, all, sizeof(me), hcclUint8, comm), res, out);
    for (int r = 0; r < n && me.color >= 0; r++) {
        if (all[r].color != me.color)
            continue;
        if (leader < 0)
            leader = r;
        size++;
        /* Order by (key, old rank): count who comes before us. */
        if (all[r].key < me.key || (all[r].key == me.key && r < comm->rank))
            newrank++;
    }
    memset(&mine, 0, sizeof(mine));
    /* A leader that cannot open a rendezvous still joins the exchange (with an empty id, which
     * its group then rejects), so that nobody waits for it. */
    id_res = leader == comm->rank ? hcclGetUniqueId(&mine) : hcclSuccess;
    HCCL_CHECK_GOTO(hcclAllGather(&mine, ids, sizeof(mine), hcclUint8, comm), res, out);
    if (id_res != hcclSuccess) {
        res = id_res;
        goto out;
    }
    if (me.color < 0) {
        *newcomm = NULL;
        res = hcclSuccess;
        goto out;
    }
    cfg.connectTimeoutMs = comm->params.connect_timeout_ms;
    cfg.execTimeoutMs = comm->params.exec_timeout_ms;
    cfg.algo = comm->params.algo[0] ? comm->params.algo : NULL;
    cfg.eventBase = hccl_reactor_is_external(comm->reactor) ? hccl_reactor_base(comm->reactor) : NULL;
    res = hcclCommInitRankConfig(newcomm, size, ids[leader], newrank, &cfg);
out:
    hccl_free(all);
    hccl_free(ids);
    return res;
}
