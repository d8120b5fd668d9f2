/* Collective entry points: argument checks on the caller's thread, planning on the reactor. */
#include <stdio.h>
#include <string.h>

#include "core/coll.h"
#include "core/fault.h"

bool hccl_ranges_overlap(const void *a, size_t alen, const void *b, size_t blen)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;

    return alen && blen && x < y + blen && y < x + alen;
}

static hcclResult_t check_common(struct hcclComm *comm, const char *fn, hcclRequest_t *req_p,
                                 hcclDataType_t dt, const hcclRedOp_t *op)
{
    HCCL_CHECK(hccl_comm_check(comm, fn));
    if (!req_p)
        return HCCL_FAIL(hcclInvalidArgument, "%s: req is NULL", fn);
    if ((unsigned)dt >= hcclNumTypes)
        return HCCL_FAIL(hcclInvalidArgument, "%s: datatype %d is not a valid hcclDataType_t", fn,
                         (int)dt);
    if (op && (unsigned)*op >= hcclNumOps)
        return HCCL_FAIL(hcclInvalidArgument, "%s: op %d is not a valid hcclRedOp_t", fn, (int)*op);
    return hcclSuccess;
}

/* count * mult elements of dt in bytes, or an error naming the overflow. */
static hcclResult_t check_bytes(const char *fn, size_t count, size_t mult, hcclDataType_t dt,
                                size_t *bytes_p)
{
    size_t esz = hccl_dtype_size(dt);

    if (mult && count > SIZE_MAX / mult / esz)
        return HCCL_FAIL(hcclInvalidArgument, "%s: count %zu of %s overflows the address space", fn,
                         count, hccl_dtype_name(dt));
    *bytes_p = count * mult * esz;
    return hcclSuccess;
}

static hcclResult_t check_rank(struct hcclComm *comm, const char *fn, const char *what, int r)
{
    if (r < 0 || r >= comm->nranks)
        return HCCL_FAIL(hcclInvalidArgument, "%s: %s %d is not in [0, %d)", fn, what, r,
                         comm->nranks);
    return hcclSuccess;
}

/* The blocking forms: Async + Wait (no request: the call ran on this thread, and is done). */
static hcclResult_t coll_block(hcclResult_t posted, hcclRequest_t *req)
{
    return posted != hcclSuccess || !*req ? posted : hcclWait(req);
}

static hcclResult_t check_blocking(struct hcclComm *comm, const char *fn)
{
    HCCL_CHECK(hccl_comm_check(comm, fn));
    if (hccl_reactor_in_loop(comm->reactor))
        return HCCL_FAIL(hcclInvalidUsage,
                         "%s: the blocking form was called from a callback of the "
                         "communicator; it would never finish",
                         fn);
    return hcclSuccess;
}

/* ---- entry points ---- */

static hcclResult_t coll_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                                   hcclDataType_t datatype, hcclRedOp_t op, hcclComm_t comm,
                                   hcclRequest_t *req_p, bool blocking)
{
    static const char fn[] = "hcclAllReduceAsync";
    hccl_coll_call_t c = {HCCL_COLL_ALLREDUCE, sendbuf, recvbuf, count, datatype, op, -1, NULL};
    size_t bytes = 0;

    HCCL_CHECK(check_common(comm, fn, req_p, datatype, &op));
    HCCL_CHECK(check_bytes(fn, count, 1, datatype, &bytes));
    if (count > 0 && (!sendbuf || !recvbuf))
        return HCCL_FAIL(hcclInvalidArgument, "%s: %s is NULL with count %zu", fn,
                         sendbuf ? "recvbuf" : "sendbuf", count);
    if (sendbuf != recvbuf && hccl_ranges_overlap(sendbuf, bytes, recvbuf, bytes))
        return HCCL_FAIL(hcclInvalidArgument,
                         "%s: sendbuf and recvbuf overlap without being equal "
                         "(in-place needs sendbuf == recvbuf)",
                         fn);
    return hccl_coll_submit(comm, fn, &c, blocking, req_p);
}

HCCL_API hcclResult_t hcclAllReduceAsync(const void *sendbuf, void *recvbuf, size_t count,
                                         hcclDataType_t datatype, hcclRedOp_t op, hcclComm_t comm,
                                         hcclRequest_t *req_p)
{
    return coll_allreduce(sendbuf, recvbuf, count, datatype, op, comm, req_p, false);
}

HCCL_API hcclResult_t hcclAllReduce(const void *sendbuf, void *recvbuf, size_t count,
                                    hcclDataType_t datatype, hcclRedOp_t op, hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclAllReduce"));
    return coll_block(coll_allreduce(sendbuf, recvbuf, count, datatype, op, comm, &req, true),
                      &req);
}

static hcclResult_t coll_broadcast(void *buf, size_t count, hcclDataType_t datatype, int root,
                                   hcclComm_t comm, hcclRequest_t *req_p, bool blocking)
{
    static const char fn[] = "hcclBroadcastAsync";
    hccl_coll_call_t c = {HCCL_COLL_BROADCAST, buf, buf, count, datatype, hcclSum, root, NULL};
    size_t bytes = 0;

    HCCL_CHECK(check_common(comm, fn, req_p, datatype, NULL));
    HCCL_CHECK(check_rank(comm, fn, "root", root));
    HCCL_CHECK(check_bytes(fn, count, 1, datatype, &bytes));
    if (count > 0 && !buf)
        return HCCL_FAIL(hcclInvalidArgument, "%s: buf is NULL with count %zu", fn, count);
    return hccl_coll_submit(comm, fn, &c, blocking, req_p);
}

HCCL_API hcclResult_t hcclBroadcastAsync(void *buf, size_t count, hcclDataType_t datatype, int root,
                                         hcclComm_t comm, hcclRequest_t *req_p)
{
    return coll_broadcast(buf, count, datatype, root, comm, req_p, false);
}

HCCL_API hcclResult_t hcclBroadcast(void *buf, size_t count, hcclDataType_t datatype, int root,
                                    hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclBroadcast"));
    return coll_block(coll_broadcast(buf, count, datatype, root, comm, &req, true), &req);
}

static hcclResult_t coll_reduce(const void *sendbuf, void *recvbuf, size_t count,
                                hcclDataType_t datatype, hcclRedOp_t op, int root, hcclComm_t comm,
                                hcclRequest_t *req_p, bool blocking)
{
    static const char fn[] = "hcclReduceAsync";
    hccl_coll_call_t c = {HCCL_COLL_REDUCE, sendbuf, recvbuf, count, datatype, op, root, NULL};
    size_t bytes = 0;

    HCCL_CHECK(check_common(comm, fn, req_p, datatype, &op));
    HCCL_CHECK(check_rank(comm, fn, "root", root));
    HCCL_CHECK(check_bytes(fn, count, 1, datatype, &bytes));
    if (count > 0 && !sendbuf)
        return HCCL_FAIL(hcclInvalidArgument, "%s: sendbuf is NULL with count %zu", fn, count);
    if (count > 0 && comm->rank == root && !recvbuf)
        return HCCL_FAIL(hcclInvalidArgument, "%s: recvbuf is NULL on the root", fn);
    if (comm->rank != root)
        c.recvbuf = NULL; /* never touched elsewhere */
    else if (sendbuf != recvbuf && hccl_ranges_overlap(sendbuf, bytes, recvbuf, bytes))
        return HCCL_FAIL(hcclInvalidArgument, "%s: sendbuf and recvbuf overlap without being equal",
                         fn);
    return hccl_coll_submit(comm, fn, &c, blocking, req_p);
}

HCCL_API hcclResult_t hcclReduceAsync(const void *sendbuf, void *recvbuf, size_t count,
                                      hcclDataType_t datatype, hcclRedOp_t op, int root,
                                      hcclComm_t comm, hcclRequest_t *req_p)
{
    return coll_reduce(sendbuf, recvbuf, count, datatype, op, root, comm, req_p, false);
}

HCCL_API hcclResult_t hcclReduce(const void *sendbuf, void *recvbuf, size_t count,
                                 hcclDataType_t datatype, hcclRedOp_t op, int root, hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclReduce"));
    return coll_block(coll_reduce(sendbuf, recvbuf, count, datatype, op, root, comm, &req, true),
                      &req);
}

static hcclResult_t coll_allgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                   hcclDataType_t datatype, hcclComm_t comm, hcclRequest_t *req_p,
                                   bool blocking)
{
    static const char fn[] = "hcclAllGatherAsync";
    hccl_coll_call_t c = {
        HCCL_COLL_ALLGATHER, sendbuf, recvbuf, sendcount, datatype, hcclSum, -1, NULL};
    size_t bytes = 0, total = 0;

    HCCL_CHECK(check_common(comm, fn, req_p, datatype, NULL));
    HCCL_CHECK(check_bytes(fn, sendcount, 1, datatype, &bytes));
    HCCL_CHECK(check_bytes(fn, sendcount, (size_t)comm->nranks, datatype, &total));
    if (sendcount > 0 && (!sendbuf || !recvbuf))
        return HCCL_FAIL(hcclInvalidArgument, "%s: %s is NULL with count %zu", fn,
                         sendbuf ? "recvbuf" : "sendbuf", sendcount);
    if (sendbuf != (char *)recvbuf + (size_t)comm->rank * bytes &&
        hccl_ranges_overlap(sendbuf, bytes, recvbuf, total))
        return HCCL_FAIL(hcclInvalidArgument,
                         "%s: sendbuf overlaps recvbuf but is not "
                         "recvbuf + rank*sendcount (the in-place form)",
                         fn);
    return hccl_coll_submit(comm, fn, &c, blocking, req_p);
}

HCCL_API hcclResult_t hcclAllGatherAsync(const void *sendbuf, void *recvbuf, size_t sendcount,
                                         hcclDataType_t datatype, hcclComm_t comm,
                                         hcclRequest_t *req_p)
{
    return coll_allgather(sendbuf, recvbuf, sendcount, datatype, comm, req_p, false);
}

HCCL_API hcclResult_t hcclAllGather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                    hcclDataType_t datatype, hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclAllGather"));
    return coll_block(coll_allgather(sendbuf, recvbuf, sendcount, datatype, comm, &req, true),
                      &req);
}

static hcclResult_t coll_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                        hcclDataType_t datatype, hcclRedOp_t op, hcclComm_t comm,
                                        hcclRequest_t *req_p, bool blocking)
{
    static const char fn[] = "hcclReduceScatterAsync";
    hccl_coll_call_t c = {
        HCCL_COLL_REDUCESCATTER, sendbuf, recvbuf, recvcount, datatype, op, -1, NULL};
    size_t bytes = 0, total = 0;

    HCCL_CHECK(check_common(comm, fn, req_p, datatype, &op));
    HCCL_CHECK(check_bytes(fn, recvcount, 1, datatype, &bytes));
    HCCL_CHECK(check_bytes(fn, recvcount, (size_t)comm->nranks, datatype, &total));
    if (recvcount > 0 && (!sendbuf || !recvbuf))
        return HCCL_FAIL(hcclInvalidArgument, "%s: %s is NULL with count %zu", fn,
                         sendbuf ? "recvbuf" : "sendbuf", recvcount);
    if (recvbuf != (const char *)sendbuf + (size_t)comm->rank * bytes &&
        hccl_ranges_overlap(sendbuf, total, recvbuf, bytes))
        return HCCL_FAIL(hcclInvalidArgument,
                         "%s: recvbuf overlaps sendbuf but is not "
                         "sendbuf + rank*recvcount (the in-place form)",
                         fn);
    return hccl_coll_submit(comm, fn, &c, blocking, req_p);
}

HCCL_API hcclResult_t hcclReduceScatterAsync(const void *sendbuf, void *recvbuf, size_t recvcount,
                                             hcclDataType_t datatype, hcclRedOp_t op,
                                             hcclComm_t comm, hcclRequest_t *req_p)
{
    return coll_reduce_scatter(sendbuf, recvbuf, recvcount, datatype, op, comm, req_p, false);
}

HCCL_API hcclResult_t hcclReduceScatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                        hcclDataType_t datatype, hcclRedOp_t op, hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclReduceScatter"));
    return coll_block(
        coll_reduce_scatter(sendbuf, recvbuf, recvcount, datatype, op, comm, &req, true), &req);
}

static hcclResult_t coll_alltoall(const void *sendbuf, void *recvbuf, size_t count,
                                  hcclDataType_t datatype, hcclComm_t comm, hcclRequest_t *req_p,
                                  bool blocking)
{
    static const char fn[] = "hcclAlltoAllAsync";
    hccl_coll_call_t c = {HCCL_COLL_ALLTOALL, sendbuf, recvbuf, count, datatype, hcclSum, -1, NULL};
    size_t total = 0;

    HCCL_CHECK(check_common(comm, fn, req_p, datatype, NULL));
    HCCL_CHECK(check_bytes(fn, count, (size_t)comm->nranks, datatype, &total));
    if (count > 0 && (!sendbuf || !recvbuf))
        return HCCL_FAIL(hcclInvalidArgument, "%s: %s is NULL with count %zu", fn,
                         sendbuf ? "recvbuf" : "sendbuf", count);
    if (hccl_ranges_overlap(sendbuf, total, recvbuf, total))
        return HCCL_FAIL(hcclInvalidArgument, "%s: sendbuf and recvbuf overlap (not allowed)", fn);
    return hccl_coll_submit(comm, fn, &c, blocking, req_p);
}

HCCL_API hcclResult_t hcclAlltoAllAsync(const void *sendbuf, void *recvbuf, size_t count,
                                        hcclDataType_t datatype, hcclComm_t comm,
                                        hcclRequest_t *req_p)
{
    return coll_alltoall(sendbuf, recvbuf, count, datatype, comm, req_p, false);
}

HCCL_API hcclResult_t hcclAlltoAll(const void *sendbuf, void *recvbuf, size_t count,
                                   hcclDataType_t datatype, hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclAlltoAll"));
    return coll_block(coll_alltoall(sendbuf, recvbuf, count, datatype, comm, &req, true), &req);
}

/* The span [lo, hi) in elements that counts/displs cover, or an error on overflow. */
static hcclResult_t v_span(const char *fn, const char *what, const size_t *counts,
                           const size_t *displs, int n, size_t *hi_p, size_t *total_p)
{
    size_t hi = 0, total = 0;

    for (int i = 0; i < n; i++) {
        if (counts[i] && displs[i] > SIZE_MAX - counts[i])
            return HCCL_FAIL(hcclInvalidArgument, "%s: %s %d overflows", fn, what, i);
        if (counts[i] && displs[i] + counts[i] > hi)
            hi = displs[i] + counts[i];
        total += counts[i];
    }
    *hi_p = hi;
    *total_p = total;
    return hcclSuccess;
}

static hcclResult_t coll_alltoallv(const void *sendbuf, const size_t *sendcounts,
                                   const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                   const size_t *rdispls, hcclDataType_t datatype, hcclComm_t comm,
                                   hcclRequest_t *req_p, bool blocking)
{
    static const char fn[] = "hcclAlltoAllvAsync";
    hccl_coll_call_t c = {HCCL_COLL_ALLTOALLV, sendbuf, recvbuf, 0, datatype, hcclSum, -1, NULL};
    size_t shi = 0, rhi = 0, stot = 0, rtot = 0, sbytes = 0, rbytes = 0, n;

    HCCL_CHECK(check_common(comm, fn, req_p, datatype, NULL));
    if (!sendcounts || !sdispls || !recvcounts || !rdispls)
        return HCCL_FAIL(hcclInvalidArgument, "%s: a count or displacement array is NULL", fn);
    n = (size_t)comm->nranks;
    HCCL_CHECK(v_span(fn, "send block", sendcounts, sdispls, comm->nranks, &shi, &stot));
    HCCL_CHECK(v_span(fn, "receive block", recvcounts, rdispls, comm->nranks, &rhi, &rtot));
    HCCL_CHECK(check_bytes(fn, shi, 1, datatype, &sbytes));
    HCCL_CHECK(check_bytes(fn, rhi, 1, datatype, &rbytes));
    if ((shi && !sendbuf) || (rhi && !recvbuf))
        return HCCL_FAIL(hcclInvalidArgument, "%s: %s is NULL with non-zero counts", fn,
                         shi && !sendbuf ? "sendbuf" : "recvbuf");
    if (hccl_ranges_overlap(sendbuf, sbytes, recvbuf, rbytes))
        return HCCL_FAIL(hcclInvalidArgument, "%s: sendbuf and recvbuf overlap (not allowed)", fn);
    if (sendcounts[comm->rank] != recvcounts[comm->rank])
        return HCCL_FAIL(hcclInvalidArgument,
                         "%s: this rank sends %zu elements to itself but "
                         "receives %zu from itself",
                         fn, sendcounts[comm->rank], recvcounts[comm->rank]);
    c.count = stot + rtot; /* only "is there anything at all" matters; the plan uses v */
    c.v = hccl_malloc(4 * n * sizeof(size_t));
    if (!c.v)
        return HCCL_FAIL(hcclSystemError, "%s: out of memory", fn);
    memcpy(c.v, sendcounts, n * sizeof(size_t));
    memcpy(c.v + n, sdispls, n * sizeof(size_t));
    memcpy(c.v + 2 * n, recvcounts, n * sizeof(size_t));
    memcpy(c.v + 3 * n, rdispls, n * sizeof(size_t));
    return hccl_coll_submit(comm, fn, &c, blocking, req_p);
}

HCCL_API hcclResult_t hcclAlltoAllvAsync(const void *sendbuf, const size_t *sendcounts,
                                         const size_t *sdispls, void *recvbuf,
                                         const size_t *recvcounts, const size_t *rdispls,
                                         hcclDataType_t datatype, hcclComm_t comm,
                                         hcclRequest_t *req_p)
{
    return coll_alltoallv(sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, datatype,
                          comm, req_p, false);
}

HCCL_API hcclResult_t hcclAlltoAllv(const void *sendbuf, const size_t *sendcounts,
                                    const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                    const size_t *rdispls, hcclDataType_t datatype, hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclAlltoAllv"));
    return coll_block(coll_alltoallv(sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls,
                                     datatype, comm, &req, true),
                      &req);
}

static hcclResult_t coll_barrier(hcclComm_t comm, hcclRequest_t *req_p, bool blocking)
{
    static const char fn[] = "hcclBarrierAsync";
    hccl_coll_call_t c = {HCCL_COLL_BARRIER, NULL, NULL, 0, hcclUint8, hcclSum, -1, NULL};

    HCCL_CHECK(check_common(comm, fn, req_p, hcclUint8, NULL));
    return hccl_coll_submit(comm, fn, &c, blocking, req_p);
}

HCCL_API hcclResult_t hcclBarrierAsync(hcclComm_t comm, hcclRequest_t *req_p)
{
    return coll_barrier(comm, req_p, false);
}

HCCL_API hcclResult_t hcclBarrier(hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclBarrier"));
    return coll_block(coll_barrier(comm, &req, true), &req);
}

static hcclResult_t coll_p2p(const char *fn, hccl_coll_t coll, const void *sbuf, void *rbuf,
                             size_t count, hcclDataType_t datatype, int peer, hcclComm_t comm,
                             hcclRequest_t *req_p, bool blocking)
{
    hccl_coll_call_t c = {coll, sbuf, rbuf, count, datatype, hcclSum, peer, NULL};
    size_t bytes = 0;

    HCCL_CHECK(check_common(comm, fn, req_p, datatype, NULL));
    HCCL_CHECK(check_rank(comm, fn, "peer", peer));
    HCCL_CHECK(check_bytes(fn, count, 1, datatype, &bytes));
    if (count > 0 && !(sbuf ? sbuf : rbuf))
        return HCCL_FAIL(hcclInvalidArgument, "%s: buf is NULL with count %zu", fn, count);
    return hccl_coll_submit(comm, fn, &c, blocking, req_p);
}

HCCL_API hcclResult_t hcclSendAsync(const void *buf, size_t count, hcclDataType_t datatype,
                                    int peer, hcclComm_t comm, hcclRequest_t *req_p)
{
    return coll_p2p("hcclSendAsync", HCCL_COLL_SEND, buf, NULL, count, datatype, peer, comm, req_p,
                    false);
}

HCCL_API hcclResult_t hcclRecvAsync(void *buf, size_t count, hcclDataType_t datatype, int peer,
                                    hcclComm_t comm, hcclRequest_t *req_p)
{
    return coll_p2p("hcclRecvAsync", HCCL_COLL_RECV, NULL, buf, count, datatype, peer, comm, req_p,
                    false);
}

HCCL_API hcclResult_t hcclSend(const void *buf, size_t count, hcclDataType_t datatype, int peer,
                               hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclSend"));
    return coll_block(coll_p2p("hcclSendAsync", HCCL_COLL_SEND, buf, NULL, count, datatype, peer,
                               comm, &req, true),
                      &req);
}

HCCL_API hcclResult_t hcclRecv(void *buf, size_t count, hcclDataType_t datatype, int peer,
                               hcclComm_t comm)
{
    hcclRequest_t req = NULL;

    HCCL_CHECK(check_blocking(comm, "hcclRecv"));
    return coll_block(coll_p2p("hcclRecvAsync", HCCL_COLL_RECV, NULL, buf, count, datatype, peer,
                               comm, &req, true),
                      &req);
}
