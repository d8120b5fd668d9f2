/*
 * Collectives on host streams: the arguments are checked when the call is made, so that a bad
 * one is returned to the caller instead of failing the stream later; the collective is posted
 * through its Async form when the stream's worker reaches it.
 */
#include <stdint.h>

#include "core/comm.h"
#include "reactor/hstream.h"

/*
 * The checks the Async form would make (the same cases, the same result codes), done up front:
 * once the stream reaches the collective, an argument error could no longer be returned, and
 * this rank would skip a collective its peers run.
 */
static hcclResult_t coll_check(const hccl_hstream_coll_t *c, bool has_op)
{
    const char *fn = c->fn;
    size_t esz, n, mult, bytes, total;
    bool in_place;

    HCCL_CHECK(hccl_comm_check(c->comm, fn));
    if ((unsigned)c->dtype >= hcclNumTypes)
        return HCCL_FAIL(hcclInvalidArgument, "%s: datatype %d is not a valid hcclDataType_t", fn,
                         (int)c->dtype);
    if (has_op && (unsigned)c->op >= hcclNumOps)
        return HCCL_FAIL(hcclInvalidArgument, "%s: op %d is not a valid hcclRedOp_t", fn,
                         (int)c->op);
    n = (size_t)c->comm->nranks;
    if (c->coll == HCCL_COLL_BROADCAST && (c->root < 0 || c->root >= c->comm->nranks))
        return HCCL_FAIL(hcclInvalidArgument, "%s: root %d is not in [0, %d)", fn, c->root,
                         c->comm->nranks);
    esz = hccl_dtype_size(c->dtype);
    /* Only the gathering and scattering forms hold nranks blocks of count. */
    mult = c->coll == HCCL_COLL_ALLREDUCE || c->coll == HCCL_COLL_BROADCAST ? 1 : n;
    if (c->count > SIZE_MAX / mult / esz)
        return HCCL_FAIL(hcclInvalidArgument, "%s: count %zu of %s overflows the address space", fn,
                         c->count, hccl_dtype_name(c->dtype));
    bytes = c->count * esz;
    total = bytes * mult;
    if (c->count > 0 && (!c->sendbuf || !c->recvbuf))
        return HCCL_FAIL(hcclInvalidArgument, "%s: %s is NULL with count %zu", fn,
                         c->coll == HCCL_COLL_BROADCAST ? "buf"
                         : c->sendbuf                   ? "recvbuf"
                                                        : "sendbuf",
                         c->count);
    switch (c->coll) {
    case HCCL_COLL_ALLREDUCE:
        if (c->sendbuf != c->recvbuf &&
            hccl_ranges_overlap(c->sendbuf, bytes, c->recvbuf, bytes))
            return HCCL_FAIL(hcclInvalidArgument, "%s: sendbuf and recvbuf overlap without being "
                                                  "equal (in-place needs sendbuf == recvbuf)", fn);
        break;
    case HCCL_COLL_ALLGATHER:
        in_place = c->sendbuf == (const char *)c->recvbuf + (size_t)c->comm->rank * bytes;
        if (!in_place && hccl_ranges_overlap(c->sendbuf, bytes, c->recvbuf, total))
            return HCCL_FAIL(hcclInvalidArgument, "%s: sendbuf overlaps recvbuf but is not "
                                                  "recvbuf + rank*sendcount (the in-place form)",
                             fn);
        break;
    case HCCL_COLL_REDUCESCATTER:
        in_place = c->recvbuf == (const char *)c->sendbuf + (size_t)c->comm->rank * bytes;
        if (!in_place && hccl_ranges_overlap(c->sendbuf, total, c->recvbuf, bytes))
            return HCCL_FAIL(hcclInvalidArgument, "%s: recvbuf overlaps sendbuf but is not "
                                                  "sendbuf + rank*recvcount (the in-place form)",
                             fn);
        break;
    case HCCL_COLL_ALLTOALL:
        if (hccl_ranges_overlap(c->sendbuf, total, c->recvbuf, total))
            return HCCL_FAIL(hcclInvalidArgument, "%s: sendbuf and recvbuf overlap (not allowed)",
                             fn);
        break;
    default:
        break;
    }
    return hcclSuccess;
}

static hcclResult_t coll_enqueue(const hccl_hstream_coll_t *c, bool has_op, hcclStream_t stream)
{
    if (!stream)
        return HCCL_FAIL(hcclInvalidArgument, "%s: stream is NULL", c->fn);
    HCCL_CHECK(coll_check(c, has_op));
    return hccl_hstream_enqueue_coll(stream, c);
}

hcclResult_t hccl_hstream_coll_post(const hccl_hstream_coll_t *c, hcclRequest_t *req_p)
{
    switch (c->coll) {
    case HCCL_COLL_ALLREDUCE:
        return hcclAllReduceAsync(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op, c->comm,
                                  req_p);
    case HCCL_COLL_BROADCAST:
        return hcclBroadcastAsync(c->recvbuf, c->count, c->dtype, c->root, c->comm, req_p);
    case HCCL_COLL_ALLGATHER:
        return hcclAllGatherAsync(c->sendbuf, c->recvbuf, c->count, c->dtype, c->comm, req_p);
    case HCCL_COLL_REDUCESCATTER:
        return hcclReduceScatterAsync(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op, c->comm,
                                      req_p);
    case HCCL_COLL_ALLTOALL:
        return hcclAlltoAllAsync(c->sendbuf, c->recvbuf, c->count, c->dtype, c->comm, req_p);
    default:
        return HCCL_FAIL(hcclInternalError, "%s: collective %d cannot be placed on a stream",
                         c->fn, c->coll);
    }
}

HCCL_API hcclResult_t hcclAllReduceOnStream(const void *sendbuf, void *recvbuf, size_t count,
                                            hcclDataType_t datatype, hcclRedOp_t op,
                                            hcclComm_t comm, hcclStream_t stream)
{
    hccl_hstream_coll_t c = {"hcclAllReduceOnStream", HCCL_COLL_ALLREDUCE, sendbuf, recvbuf,
                             count, datatype, op, -1, comm};

    return coll_enqueue(&c, true, stream);
}

HCCL_API hcclResult_t hcclBroadcastOnStream(void *buf, size_t count, hcclDataType_t datatype,
                                            int root, hcclComm_t comm, hcclStream_t stream)
{
    hccl_hstream_coll_t c = {"hcclBroadcastOnStream", HCCL_COLL_BROADCAST, buf, buf, count,
                             datatype, hcclSum, root, comm};

    return coll_enqueue(&c, false, stream);
}

HCCL_API hcclResult_t hcclAllGatherOnStream(const void *sendbuf, void *recvbuf, size_t sendcount,
                                            hcclDataType_t datatype, hcclComm_t comm,
                                            hcclStream_t stream)
{
    hccl_hstream_coll_t c = {"hcclAllGatherOnStream", HCCL_COLL_ALLGATHER, sendbuf, recvbuf,
                             sendcount, datatype, hcclSum, -1, comm};

    return coll_enqueue(&c, false, stream);
}

HCCL_API hcclResult_t hcclReduceScatterOnStream(const void *sendbuf, void *recvbuf,
                                                size_t recvcount, hcclDataType_t datatype,
                                                hcclRedOp_t op, hcclComm_t comm,
                                                hcclStream_t stream)
{
    hccl_hstream_coll_t c = {"hcclReduceScatterOnStream", HCCL_COLL_REDUCESCATTER, sendbuf,
                             recvbuf, recvcount, datatype, op, -1, comm};

    return coll_enqueue(&c, true, stream);
}

HCCL_API hcclResult_t hcclAlltoAllOnStream(const void *sendbuf, void *recvbuf, size_t count,
                                           hcclDataType_t datatype, hcclComm_t comm,
                                           hcclStream_t stream)
{
    hccl_hstream_coll_t c = {"hcclAlltoAllOnStream", HCCL_COLL_ALLTOALL, sendbuf, recvbuf, count,
                             datatype, hcclSum, -1, comm};

    return coll_enqueue(&c, false, stream);
}
