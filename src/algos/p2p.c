/* Point to point as a plan: one send or one receive, so that it runs, fails and times out like any collective. */
#include "algos/algos.h"

hcclResult_t hccl_algo_p2p(int rank, int nranks, const hccl_coll_shape_t *shape, hccl_plan_t **plan_p)
{
    hcclResult_t res;
    hccl_plan_t *p = NULL;
    size_t bytes = shape->count * hccl_dtype_size(shape->dtype);
    bool is_send = shape->coll == HCCL_COLL_SEND;

    HCCL_CHECK(hccl_plan_create(rank, nranks, shape->dtype, hcclSum, is_send ? "send" : "recv", &p));
    if (is_send)
        HCCL_CHECK_GOTO(hccl_plan_send(p, shape->root, 0, hccl_bref(HCCL_SLOT_SEND, 0), bytes, NULL),
                        res, err);
    else
        HCCL_CHECK_GOTO(hccl_plan_recv(p, shape->root, 0, hccl_bref(HCCL_SLOT_RECV, 0), bytes, NULL),
                        res, err);
    HCCL_CHECK_GOTO(hccl_plan_finalize(p, is_send ? bytes : 0, is_send ? 0 : bytes), res, err);
    *plan_p = p;
    return hcclSuccess;

err:
    hccl_plan_release(p);
    return res;
}
