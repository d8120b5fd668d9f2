/*
 * Recursive-doubling AllReduce for small messages: log2(p) exchanges of the
 * whole buffer. With n not a power of two, the first 2*rem ranks fold in
 * pairs (the even one hands its data to the odd one and waits for the
 * result), so p = 2^floor(log2 n) ranks do the doubling.
 */
#include "algos/algos.h"

enum { TAG_FOLD = 0, TAG_UNFOLD = 1, TAG_ROUND0 = 2 };

/* The real rank of doubling participant v. */
static int real_rank(int v, int rem)
{
    return v < rem ? 2 * v + 1 : v + rem;
}

hcclResult_t hccl_algo_recdbl_allreduce(int rank, int nranks, const hccl_coll_shape_t *shape,
                                        hccl_plan_t **plan_p)
{
    hcclResult_t res;
    hccl_plan_t *p = NULL;
    size_t bytes = shape->count * hccl_dtype_size(shape->dtype);
    hccl_bref_t send = hccl_bref(HCCL_SLOT_SEND, 0), recv = hccl_bref(HCCL_SLOT_RECV, 0);
    hccl_bref_t scratch = hccl_bref(HCCL_SLOT_SCRATCH, 0);
    int pof2 = 1, rem, v;
    uint32_t last = UINT32_MAX, id, rid, sid, prev_reduce = UINT32_MAX;

    while (pof2 * 2 <= nranks)
        pof2 *= 2;
    rem = nranks - pof2;
    HCCL_CHECK(hccl_plan_create(rank, nranks, shape->dtype, shape->op, "recdbl", &p));
    p->scratch_bytes = nranks > 1 ? bytes : 0;

    if (rank < 2 * rem && rank % 2 == 0) {
        /* Folded out: give our data to rank+1, get the result back. */
        HCCL_CHECK_GOTO(hccl_plan_send(p, rank + 1, TAG_FOLD, send, bytes, &sid), res, err);
        HCCL_CHECK_GOTO(hccl_plan_recv(p, rank + 1, TAG_UNFOLD, recv, bytes, &rid), res, err);
        HCCL_CHECK_GOTO(hccl_plan_dep(p, sid, rid), res, err); /* in-place: send before overwrite */
        goto finalize;
    }
    if (rank < 2 * rem) {
        HCCL_CHECK_GOTO(hccl_plan_recv(p, rank - 1, TAG_FOLD, scratch, bytes, &rid), res, err);
        HCCL_CHECK_GOTO(hccl_plan_reduce(p, recv, scratch, send, bytes, 0, &last), res, err);
        HCCL_CHECK_GOTO(hccl_plan_dep(p, rid, last), res, err);
        prev_reduce = last; /* it reads scratch: round 0 may not receive into it before */
        v = rank / 2;
    } else if (pof2 == 1) {
        HCCL_CHECK_GOTO(hccl_plan_copy(p, recv, send, bytes, &last), res, err);
        v = rank - rem;
    } else {
        /* Round 0 sends SEND and sums into RECV: no copy first, and out of place nothing this
         * rank writes is what the peer reads (exec_policy.c, hccl_exec_rewritten_flag). */
        v = rank - rem;
    }
    for (int k = 0; (1 << k) < pof2; k++) {
        int peer = real_rank(v ^ (1 << k), rem);
        uint32_t tag = TAG_ROUND0 + (uint32_t)k;
        bool final = (2 << k) >= pof2;
        hccl_bref_t mine = last == UINT32_MAX ? send : recv;

        HCCL_CHECK_GOTO(hccl_plan_send(p, peer, tag, mine, bytes, &sid), res, err);
        HCCL_CHECK_GOTO(hccl_plan_recv(p, peer, tag, scratch, bytes, &rid), res, err);
        HCCL_CHECK_GOTO(
            hccl_plan_reduce(p, recv, mine, scratch, bytes, final ? HCCL_STEP_FINAL_DIV : 0, &id),
            res, err);
        if (last != UINT32_MAX)
            HCCL_CHECK_GOTO(hccl_plan_dep(p, last, sid), res, err);
        HCCL_CHECK_GOTO(hccl_plan_dep(p, rid, id), res, err);
        HCCL_CHECK_GOTO(hccl_plan_dep(p, sid, id), res, err); /* the send reads what we overwrite */
        if (prev_reduce != UINT32_MAX)
            HCCL_CHECK_GOTO(hccl_plan_dep(p, prev_reduce, rid), res, err); /* scratch is free again */
        prev_reduce = last = id;
    }
    if (rank < 2 * rem)
        HCCL_CHECK_GOTO(hccl_plan_send(p, rank - 1, TAG_UNFOLD, recv, bytes, &sid), res, err);
    if (rank < 2 * rem)
        HCCL_CHECK_GOTO(hccl_plan_dep(p, last, sid), res, err);

finalize:
    HCCL_CHECK_GOTO(hccl_plan_finalize(p, bytes, bytes), res, err);
    *plan_p = p;
    return hcclSuccess;

err:
    hccl_plan_release(p);
    return res;
}
