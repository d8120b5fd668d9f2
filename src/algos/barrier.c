/*
 * Dissemination Barrier (Hensgen, Finkel, Manber): ceil(log2 n) rounds; in
 * round k rank r signals (r + 2^k) % n and waits for (r - 2^k) % n. Every
 * message is zero bytes, so it works on any n, not only powers of two.
 *
 * Why it synchronises: by induction, once r has received the signals of
 * rounds 0..k it has heard, directly or through forwarded signals, from
 * ranks r-1 ... r-(2^(k+1)-1). That holds only if a signal is sent after
 * every earlier signal was received, hence each send depends on all the
 * receives of the rounds before it, not just the last one (the receives
 * themselves are posted at once and may complete in any order). After the
 * last round r has heard from all n-1 others, so no rank's plan completes
 * before every rank has started its own.
 */
#include "algos/algos.h"

/* Enough for n up to 2^32: rounds are bits of the rank distance. */
#define BARRIER_MAX_ROUNDS 32

hcclResult_t hccl_algo_dissemination_barrier(int rank, int nranks, const hccl_coll_shape_t *shape,
                                             size_t chunk_bytes, hccl_plan_t **plan_p)
{
    hcclResult_t res;
    hccl_plan_t *p = NULL;
    uint32_t recvs[BARRIER_MAX_ROUNDS], sid;
    int k;

    (void)chunk_bytes;
    HCCL_CHECK(hccl_plan_create(rank, nranks, shape->dtype, shape->op, "dissemination", &p));
    /* Zero bytes at offset 0 fit any slot, even an empty one: no buffer is ever touched. */
    for (k = 0; k < BARRIER_MAX_ROUNDS && ((size_t)1 << k) < (size_t)nranks; k++) {
        int dist = (int)((size_t)1 << k); /* < nranks */
        int to = (rank + dist) % nranks, from = (rank - dist + nranks) % nranks;

        /* A pair meets in one round at most (2^k < n are distinct), so the round is the tag. */
        HCCL_CHECK_GOTO(hccl_plan_send(p, to, (uint32_t)k, hccl_bref(HCCL_SLOT_SEND, 0), 0, &sid),
                        res, err);
        HCCL_CHECK_GOTO(hccl_plan_recv(p, from, (uint32_t)k, hccl_bref(HCCL_SLOT_RECV, 0), 0,
                                       &recvs[k]), res, err);
        for (int j = 0; j < k; j++)
            HCCL_CHECK_GOTO(hccl_plan_dep(p, recvs[j], sid), res, err);
    }
    HCCL_CHECK_GOTO(hccl_plan_finalize(p, 0, 0), res, err);
    *plan_p = p;
    return hcclSuccess;

err:
    hccl_plan_release(p);
    return res;
}
