/*
 * Bad input, one table row per (entry point, bad argument): every public call of hccl.h
 * rejects NULL pointers, out-of-range ranks/roots/peers/dtypes/ops, counts whose byte size
 * overflows, a destroyed communicator and a request waited twice, with the result code of the
 * row and a hcclGetLastError text that names the bad argument.
 *
 * Adding an entry point: add its rows to ROWS below (call, the word its error text must
 * contain, the expected result, the expression). The fixture offers a live one-rank
 * communicator (c), a destroyed one (dead), a request already waited (stale) and buffers.
 *
 * Stale handles are recognised while the library still keeps them (the last
 * HCCL_QUARANTINE_SLOTS communicators and requests each thread destroyed or released,
 * poisoned); an older one is a dangling pointer like any other.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hccl.h"

#define HUGE (SIZE_MAX / 2) /* elements: their byte size overflows for any dtype of 4+ bytes */

typedef struct {
    hcclComm_t c;
    hcclComm_t dead;
    hcclRequest_t stale;      /* waited once already: a copy of the handle */
    hcclRequest_t req;
    hcclUniqueId id;
    hcclUniqueId junk_id;
    char idstr[HCCL_UNIQUE_ID_STRLEN];
    float buf[64];
    float buf2[64];
    size_t counts[1];
    size_t displs[1];
    hcclRequest_t reqs[2];
    hcclStream_t s, dead_s;
    hcclEvent_t e, dead_e;
    int i;
    hcclResult_t res;
} fx_t;

static void on_done(hcclRequest_t req, hcclResult_t res, void *arg)
{
    (void)req, (void)res, (void)arg;
}

static void on_work(void *arg)
{
    (void)arg;
}

/* X(entry point, word the error names, expected result, expression) */
#define ROWS(X)                                                                                       \
    X("hcclGetVersion", "version", hcclInvalidArgument, hcclGetVersion(NULL))                         \
    X("hcclGetUniqueId", "id", hcclInvalidArgument, hcclGetUniqueId(NULL))                            \
    X("hcclUniqueIdToString", "id", hcclInvalidArgument,                                             \
      hcclUniqueIdToString(NULL, f->idstr, sizeof(f->idstr)))                                         \
    X("hcclUniqueIdToString", "buf", hcclInvalidArgument,                                            \
      hcclUniqueIdToString(&f->id, NULL, sizeof(f->idstr)))                                           \
    X("hcclUniqueIdToString", "buffer", hcclInvalidArgument, hcclUniqueIdToString(&f->id, f->idstr, 16)) \
    X("hcclUniqueIdFromString", "id", hcclInvalidArgument, hcclUniqueIdFromString(NULL, f->idstr))   \
    X("hcclUniqueIdFromString", "str", hcclInvalidArgument, hcclUniqueIdFromString(&f->id, NULL))    \
    X("hcclUniqueIdFromString", "str", hcclInvalidArgument, hcclUniqueIdFromString(&f->id, "12zz"))  \
    X("hcclCommInitRank", "comm", hcclInvalidArgument, hcclCommInitRank(NULL, 1, f->id, 0))           \
    X("hcclCommInitRank", "nranks", hcclInvalidArgument, hcclCommInitRank(&f->c, 0, f->id, 0))        \
    X("hcclCommInitRank", "rank", hcclInvalidArgument, hcclCommInitRank(&f->c, 2, f->id, 2))          \
    X("hcclCommInitRank", "rank", hcclInvalidArgument, hcclCommInitRank(&f->c, 2, f->id, -1))         \
    X("hcclCommInitRank", "unique id", hcclInvalidArgument, hcclCommInitRank(&f->c, 1, f->junk_id, 0)) \
    X("hcclCommInitRankConfig", "hcclConfig_t.size", hcclInvalidUsage,                               \
      hcclCommInitRankConfig(&f->c, 1, f->id, 0, &(hcclConfig_t){.size = 0}))                        \
    X("hcclCommInitGroup", "comm", hcclInvalidArgument, hcclCommInitGroup(NULL, 1, "127.0.0.1:1", 0)) \
    X("hcclCommInitGroup", "commId", hcclInvalidArgument, hcclCommInitGroup(&f->c, 1, NULL, 0))      \
    X("hcclCommInitGroup", "commId", hcclInvalidArgument, hcclCommInitGroup(&f->c, 1, "noport", 0))  \
    X("hcclCommInitGroup", "commSize", hcclInvalidArgument, hcclCommInitGroup(&f->c, 0, "127.0.0.1:1", 0)) \
    X("hcclCommInitGroup", "rankId", hcclInvalidArgument, hcclCommInitGroup(&f->c, 2, "127.0.0.1:1", 2)) \
    X("hcclCommInitFromEnv", "comm", hcclInvalidArgument, hcclCommInitFromEnv(NULL))                   \
    X("hcclCommSplit", "comm", hcclInvalidArgument, hcclCommSplit(NULL, 0, 0, &f->c))                 \
    X("hcclCommSplit", "comm", hcclInvalidUsage, hcclCommSplit(f->dead, 0, 0, &f->c))                 \
    X("hcclCommSplit", "newcomm", hcclInvalidArgument, hcclCommSplit(f->c, 0, 0, NULL))               \
    X("hcclCommDestroy", "comm", hcclInvalidArgument, hcclCommDestroy(NULL))                          \
    X("hcclCommDestroy", "comm", hcclInvalidUsage, hcclCommDestroy(f->dead))                          \
    X("hcclCommAbort", "comm", hcclInvalidArgument, hcclCommAbort(NULL))                              \
    X("hcclCommAbort", "comm", hcclInvalidUsage, hcclCommAbort(f->dead))                              \
    X("hcclCommGetAsyncError", "comm", hcclInvalidArgument, hcclCommGetAsyncError(NULL, &f->res))     \
    X("hcclCommGetAsyncError", "comm", hcclInvalidUsage, hcclCommGetAsyncError(f->dead, &f->res))     \
    X("hcclCommGetAsyncError", "asyncError", hcclInvalidArgument, hcclCommGetAsyncError(f->c, NULL))  \
    X("hcclCommCount", "comm", hcclInvalidArgument, hcclCommCount(NULL, &f->i))                       \
    X("hcclCommCount", "comm", hcclInvalidUsage, hcclCommCount(f->dead, &f->i))                       \
    X("hcclCommCount", "count", hcclInvalidArgument, hcclCommCount(f->c, NULL))                       \
    X("hcclCommUserRank", "comm", hcclInvalidArgument, hcclCommUserRank(NULL, &f->i))                 \
    X("hcclCommUserRank", "comm", hcclInvalidUsage, hcclCommUserRank(f->dead, &f->i))                 \
    X("hcclCommUserRank", "rank", hcclInvalidArgument, hcclCommUserRank(f->c, NULL))                  \
    X("hcclCommGetCompletionFd", "comm", hcclInvalidArgument, hcclCommGetCompletionFd(NULL, &f->i))   \
    X("hcclCommGetCompletionFd", "comm", hcclInvalidUsage, hcclCommGetCompletionFd(f->dead, &f->i))   \
    X("hcclCommGetCompletionFd", "fd", hcclInvalidArgument, hcclCommGetCompletionFd(f->c, NULL))      \
    X("hcclCommProgress", "comm", hcclInvalidArgument, hcclCommProgress(NULL))                        \
    X("hcclCommProgress", "comm", hcclInvalidUsage, hcclCommProgress(f->dead))                        \
    X("hcclCommDumpState", "comm", hcclInvalidArgument, hcclCommDumpState(NULL, stderr))              \
    X("hcclCommDumpState", "comm", hcclInvalidUsage, hcclCommDumpState(f->dead, stderr))              \
    X("hcclCommDumpState", "out", hcclInvalidArgument, hcclCommDumpState(f->c, NULL))                 \
    /* AllReduce */                                                                                   \
    X("hcclAllReduceAsync", "comm", hcclInvalidArgument,                                             \
      hcclAllReduceAsync(f->buf, f->buf2, 4, hcclFloat32, hcclSum, NULL, &f->req))                    \
    X("hcclAllReduceAsync", "comm", hcclInvalidUsage,                                                \
      hcclAllReduceAsync(f->buf, f->buf2, 4, hcclFloat32, hcclSum, f->dead, &f->req))                 \
    X("hcclAllReduceAsync", "req", hcclInvalidArgument,                                              \
      hcclAllReduceAsync(f->buf, f->buf2, 4, hcclFloat32, hcclSum, f->c, NULL))                       \
    X("hcclAllReduceAsync", "sendbuf", hcclInvalidArgument,                                          \
      hcclAllReduceAsync(NULL, f->buf2, 4, hcclFloat32, hcclSum, f->c, &f->req))                      \
    X("hcclAllReduceAsync", "recvbuf", hcclInvalidArgument,                                          \
      hcclAllReduceAsync(f->buf, NULL, 4, hcclFloat32, hcclSum, f->c, &f->req))                       \
    X("hcclAllReduceAsync", "datatype", hcclInvalidArgument,                                         \
      hcclAllReduceAsync(f->buf, f->buf2, 4, (hcclDataType_t)99, hcclSum, f->c, &f->req))             \
    X("hcclAllReduceAsync", "op", hcclInvalidArgument,                                               \
      hcclAllReduceAsync(f->buf, f->buf2, 4, hcclFloat32, (hcclRedOp_t)-1, f->c, &f->req))            \
    X("hcclAllReduceAsync", "count", hcclInvalidArgument,                                            \
      hcclAllReduceAsync(f->buf, f->buf2, HUGE, hcclFloat32, hcclSum, f->c, &f->req))                 \
    X("hcclAllReduce", "comm", hcclInvalidArgument,                                                  \
      hcclAllReduce(f->buf, f->buf2, 4, hcclFloat32, hcclSum, NULL))                                  \
    X("hcclAllReduce", "op", hcclInvalidArgument,                                                    \
      hcclAllReduce(f->buf, f->buf2, 4, hcclFloat32, hcclNumOps, f->c))                               \
    /* Broadcast */                                                                                   \
    X("hcclBroadcastAsync", "comm", hcclInvalidUsage,                                                \
      hcclBroadcastAsync(f->buf, 4, hcclFloat32, 0, f->dead, &f->req))                                \
    X("hcclBroadcastAsync", "buf", hcclInvalidArgument,                                              \
      hcclBroadcastAsync(NULL, 4, hcclFloat32, 0, f->c, &f->req))                                     \
    X("hcclBroadcastAsync", "root", hcclInvalidArgument,                                             \
      hcclBroadcastAsync(f->buf, 4, hcclFloat32, 1, f->c, &f->req))                                   \
    X("hcclBroadcastAsync", "root", hcclInvalidArgument,                                             \
      hcclBroadcastAsync(f->buf, 4, hcclFloat32, -1, f->c, &f->req))                                  \
    X("hcclBroadcastAsync", "datatype", hcclInvalidArgument,                                         \
      hcclBroadcastAsync(f->buf, 4, hcclNumTypes, 0, f->c, &f->req))                                  \
    X("hcclBroadcastAsync", "count", hcclInvalidArgument,                                            \
      hcclBroadcastAsync(f->buf, HUGE, hcclFloat64, 0, f->c, &f->req))                                \
    X("hcclBroadcastAsync", "req", hcclInvalidArgument,                                              \
      hcclBroadcastAsync(f->buf, 4, hcclFloat32, 0, f->c, NULL))                                      \
    X("hcclBroadcast", "root", hcclInvalidArgument, hcclBroadcast(f->buf, 4, hcclFloat32, 5, f->c))  \
    /* Reduce */                                                                                      \
    X("hcclReduceAsync", "comm", hcclInvalidArgument,                                                \
      hcclReduceAsync(f->buf, f->buf2, 4, hcclFloat32, hcclSum, 0, NULL, &f->req))                    \
    X("hcclReduceAsync", "sendbuf", hcclInvalidArgument,                                             \
      hcclReduceAsync(NULL, f->buf2, 4, hcclFloat32, hcclSum, 0, f->c, &f->req))                      \
    X("hcclReduceAsync", "recvbuf", hcclInvalidArgument,                                             \
      hcclReduceAsync(f->buf, NULL, 4, hcclFloat32, hcclSum, 0, f->c, &f->req))                       \
    X("hcclReduceAsync", "root", hcclInvalidArgument,                                                \
      hcclReduceAsync(f->buf, f->buf2, 4, hcclFloat32, hcclSum, 1, f->c, &f->req))                    \
    X("hcclReduceAsync", "op", hcclInvalidArgument,                                                  \
      hcclReduceAsync(f->buf, f->buf2, 4, hcclFloat32, (hcclRedOp_t)77, 0, f->c, &f->req))            \
    X("hcclReduceAsync", "datatype", hcclInvalidArgument,                                            \
      hcclReduceAsync(f->buf, f->buf2, 4, (hcclDataType_t)-3, hcclSum, 0, f->c, &f->req))             \
    X("hcclReduceAsync", "count", hcclInvalidArgument,                                               \
      hcclReduceAsync(f->buf, f->buf2, HUGE, hcclInt32, hcclSum, 0, f->c, &f->req))                   \
    X("hcclReduce", "comm", hcclInvalidUsage,                                                        \
      hcclReduce(f->buf, f->buf2, 4, hcclFloat32, hcclSum, 0, f->dead))                               \
    /* AllGather */                                                                                   \
    X("hcclAllGatherAsync", "comm", hcclInvalidUsage,                                                \
      hcclAllGatherAsync(f->buf, f->buf2, 4, hcclFloat32, f->dead, &f->req))                          \
    X("hcclAllGatherAsync", "sendbuf", hcclInvalidArgument,                                          \
      hcclAllGatherAsync(NULL, f->buf2, 4, hcclFloat32, f->c, &f->req))                               \
    X("hcclAllGatherAsync", "recvbuf", hcclInvalidArgument,                                          \
      hcclAllGatherAsync(f->buf, NULL, 4, hcclFloat32, f->c, &f->req))                                \
    X("hcclAllGatherAsync", "datatype", hcclInvalidArgument,                                         \
      hcclAllGatherAsync(f->buf, f->buf2, 4, (hcclDataType_t)10, f->c, &f->req))                      \
    X("hcclAllGatherAsync", "count", hcclInvalidArgument,                                            \
      hcclAllGatherAsync(f->buf, f->buf2, HUGE, hcclUint32, f->c, &f->req))                           \
    X("hcclAllGatherAsync", "req", hcclInvalidArgument,                                              \
      hcclAllGatherAsync(f->buf, f->buf2, 4, hcclFloat32, f->c, NULL))                                \
    X("hcclAllGather", "comm", hcclInvalidArgument, hcclAllGather(f->buf, f->buf2, 4, hcclFloat32, NULL)) \
    /* ReduceScatter */                                                                               \
    X("hcclReduceScatterAsync", "comm", hcclInvalidUsage,                                            \
      hcclReduceScatterAsync(f->buf, f->buf2, 4, hcclFloat32, hcclSum, f->dead, &f->req))             \
    X("hcclReduceScatterAsync", "sendbuf", hcclInvalidArgument,                                      \
      hcclReduceScatterAsync(NULL, f->buf2, 4, hcclFloat32, hcclSum, f->c, &f->req))                  \
    X("hcclReduceScatterAsync", "recvbuf", hcclInvalidArgument,                                      \
      hcclReduceScatterAsync(f->buf, NULL, 4, hcclFloat32, hcclSum, f->c, &f->req))                   \
    X("hcclReduceScatterAsync", "op", hcclInvalidArgument,                                           \
      hcclReduceScatterAsync(f->buf, f->buf2, 4, hcclFloat32, (hcclRedOp_t)5, f->c, &f->req))         \
    X("hcclReduceScatterAsync", "datatype", hcclInvalidArgument,                                     \
      hcclReduceScatterAsync(f->buf, f->buf2, 4, (hcclDataType_t)11, hcclSum, f->c, &f->req))         \
    X("hcclReduceScatterAsync", "count", hcclInvalidArgument,                                        \
      hcclReduceScatterAsync(f->buf, f->buf2, HUGE, hcclFloat64, hcclSum, f->c, &f->req))             \
    X("hcclReduceScatter", "op", hcclInvalidArgument,                                                \
      hcclReduceScatter(f->buf, f->buf2, 4, hcclFloat32, hcclNumOps, f->c))                           \
    /* AlltoAll */                                                                                    \
    X("hcclAlltoAllAsync", "comm", hcclInvalidUsage,                                                 \
      hcclAlltoAllAsync(f->buf, f->buf2, 4, hcclFloat32, f->dead, &f->req))                           \
    X("hcclAlltoAllAsync", "sendbuf", hcclInvalidArgument,                                           \
      hcclAlltoAllAsync(NULL, f->buf2, 4, hcclFloat32, f->c, &f->req))                                \
    X("hcclAlltoAllAsync", "recvbuf", hcclInvalidArgument,                                           \
      hcclAlltoAllAsync(f->buf, NULL, 4, hcclFloat32, f->c, &f->req))                                 \
    X("hcclAlltoAllAsync", "datatype", hcclInvalidArgument,                                          \
      hcclAlltoAllAsync(f->buf, f->buf2, 4, (hcclDataType_t)42, f->c, &f->req))                       \
    X("hcclAlltoAllAsync", "count", hcclInvalidArgument,                                             \
      hcclAlltoAllAsync(f->buf, f->buf2, HUGE, hcclInt64, f->c, &f->req))                             \
    X("hcclAlltoAll", "comm", hcclInvalidArgument, hcclAlltoAll(f->buf, f->buf2, 4, hcclFloat32, NULL)) \
    /* AlltoAllv */                                                                                   \
    X("hcclAlltoAllvAsync", "comm", hcclInvalidUsage,                                                \
      hcclAlltoAllvAsync(f->buf, f->counts, f->displs, f->buf2, f->counts, f->displs, hcclFloat32,   \
                         f->dead, &f->req))                                                           \
    X("hcclAlltoAllvAsync", "array", hcclInvalidArgument,                                            \
      hcclAlltoAllvAsync(f->buf, NULL, f->displs, f->buf2, f->counts, f->displs, hcclFloat32, f->c,  \
                         &f->req))                                                                    \
    X("hcclAlltoAllvAsync", "array", hcclInvalidArgument,                                            \
      hcclAlltoAllvAsync(f->buf, f->counts, f->displs, f->buf2, f->counts, NULL, hcclFloat32, f->c,  \
                         &f->req))                                                                    \
    X("hcclAlltoAllvAsync", "sendbuf", hcclInvalidArgument,                                          \
      hcclAlltoAllvAsync(NULL, f->counts, f->displs, f->buf2, f->counts, f->displs, hcclFloat32,     \
                         f->c, &f->req))                                                              \
    X("hcclAlltoAllvAsync", "datatype", hcclInvalidArgument,                                         \
      hcclAlltoAllvAsync(f->buf, f->counts, f->displs, f->buf2, f->counts, f->displs,                \
                         (hcclDataType_t)12, f->c, &f->req))                                          \
    X("hcclAlltoAllvAsync", "req", hcclInvalidArgument,                                              \
      hcclAlltoAllvAsync(f->buf, f->counts, f->displs, f->buf2, f->counts, f->displs, hcclFloat32,   \
                         f->c, NULL))                                                                 \
    X("hcclAlltoAllv", "comm", hcclInvalidArgument,                                                  \
      hcclAlltoAllv(f->buf, f->counts, f->displs, f->buf2, f->counts, f->displs, hcclFloat32, NULL)) \
    /* Barrier */                                                                                     \
    X("hcclBarrierAsync", "comm", hcclInvalidArgument, hcclBarrierAsync(NULL, &f->req))               \
    X("hcclBarrierAsync", "comm", hcclInvalidUsage, hcclBarrierAsync(f->dead, &f->req))               \
    X("hcclBarrierAsync", "req", hcclInvalidArgument, hcclBarrierAsync(f->c, NULL))                   \
    X("hcclBarrier", "comm", hcclInvalidUsage, hcclBarrier(f->dead))                                  \
    /* Send / Recv */                                                                                 \
    X("hcclSendAsync", "comm", hcclInvalidUsage, hcclSendAsync(f->buf, 4, hcclFloat32, 0, f->dead, &f->req)) \
    X("hcclSendAsync", "buf", hcclInvalidArgument, hcclSendAsync(NULL, 4, hcclFloat32, 0, f->c, &f->req)) \
    X("hcclSendAsync", "peer", hcclInvalidArgument, hcclSendAsync(f->buf, 4, hcclFloat32, 1, f->c, &f->req)) \
    X("hcclSendAsync", "peer", hcclInvalidArgument, hcclSendAsync(f->buf, 4, hcclFloat32, -2, f->c, &f->req)) \
    X("hcclSendAsync", "datatype", hcclInvalidArgument,                                              \
      hcclSendAsync(f->buf, 4, (hcclDataType_t)99, 0, f->c, &f->req))                                 \
    X("hcclSendAsync", "count", hcclInvalidArgument, hcclSendAsync(f->buf, HUGE, hcclFloat32, 0, f->c, &f->req)) \
    X("hcclSendAsync", "req", hcclInvalidArgument, hcclSendAsync(f->buf, 4, hcclFloat32, 0, f->c, NULL)) \
    X("hcclSend", "peer", hcclInvalidArgument, hcclSend(f->buf, 4, hcclFloat32, 3, f->c))             \
    X("hcclRecvAsync", "comm", hcclInvalidArgument, hcclRecvAsync(f->buf, 4, hcclFloat32, 0, NULL, &f->req)) \
    X("hcclRecvAsync", "buf", hcclInvalidArgument, hcclRecvAsync(NULL, 4, hcclFloat32, 0, f->c, &f->req)) \
    X("hcclRecvAsync", "peer", hcclInvalidArgument, hcclRecvAsync(f->buf, 4, hcclFloat32, 1, f->c, &f->req)) \
    X("hcclRecvAsync", "datatype", hcclInvalidArgument,                                              \
      hcclRecvAsync(f->buf, 4, (hcclDataType_t)-1, 0, f->c, &f->req))                                 \
    X("hcclRecvAsync", "count", hcclInvalidArgument, hcclRecvAsync(f->buf, HUGE, hcclFloat32, 0, f->c, &f->req)) \
    X("hcclRecv", "comm", hcclInvalidUsage, hcclRecv(f->buf, 4, hcclFloat32, 0, f->dead))             \
    /* Requests */                                                                                    \
    X("hcclWait", "req", hcclInvalidArgument, hcclWait(NULL))                                         \
    X("hcclWait", "req", hcclInvalidUsage, hcclWait(&f->stale))                                       \
    X("hcclTest", "req", hcclInvalidArgument, hcclTest(NULL, &f->i))                                  \
    X("hcclTest", "done", hcclInvalidArgument, hcclTest(&f->stale, NULL))                             \
    X("hcclTest", "req", hcclInvalidUsage, hcclTest(&f->stale, &f->i))                                \
    X("hcclWaitAll", "n", hcclInvalidArgument, hcclWaitAll(-1, f->reqs))                              \
    X("hcclWaitAll", "reqs", hcclInvalidArgument, hcclWaitAll(2, NULL))                               \
    X("hcclWaitAll", "req", hcclInvalidUsage, (f->reqs[1] = f->stale, hcclWaitAll(2, f->reqs)))       \
    X("hcclRequestSetCallback", "req", hcclInvalidArgument, hcclRequestSetCallback(NULL, on_done, NULL)) \
    X("hcclRequestSetCallback", "req", hcclInvalidUsage, hcclRequestSetCallback(f->stale, on_done, NULL)) \
    /* Host streams and events */                                                                    \
    X("hcclStreamCreate", "stream", hcclInvalidArgument, hcclStreamCreate(NULL))                      \
    X("hcclStreamDestroy", "stream", hcclInvalidArgument, hcclStreamDestroy(NULL))                    \
    X("hcclStreamDestroy", "stream", hcclInvalidUsage, hcclStreamDestroy(f->dead_s))                  \
    X("hcclStreamEnqueue", "stream", hcclInvalidArgument, hcclStreamEnqueue(NULL, on_work, NULL))     \
    X("hcclStreamEnqueue", "stream", hcclInvalidUsage, hcclStreamEnqueue(f->dead_s, on_work, NULL))   \
    X("hcclStreamEnqueue", "fn", hcclInvalidArgument, hcclStreamEnqueue(f->s, NULL, NULL))            \
    X("hcclStreamSynchronize", "stream", hcclInvalidArgument, hcclStreamSynchronize(NULL))            \
    X("hcclStreamSynchronize", "stream", hcclInvalidUsage, hcclStreamSynchronize(f->dead_s))          \
    X("hcclStreamWaitEvent", "stream", hcclInvalidArgument, hcclStreamWaitEvent(NULL, f->e))          \
    X("hcclStreamWaitEvent", "event", hcclInvalidArgument, hcclStreamWaitEvent(f->s, NULL))           \
    X("hcclStreamWaitEvent", "event", hcclInvalidUsage, hcclStreamWaitEvent(f->s, f->dead_e))         \
    X("hcclEventCreate", "event", hcclInvalidArgument, hcclEventCreate(NULL))                         \
    X("hcclEventDestroy", "event", hcclInvalidArgument, hcclEventDestroy(NULL))                       \
    X("hcclEventDestroy", "event", hcclInvalidUsage, hcclEventDestroy(f->dead_e))                     \
    X("hcclEventRecord", "event", hcclInvalidArgument, hcclEventRecord(NULL, f->s))                   \
    X("hcclEventRecord", "stream", hcclInvalidArgument, hcclEventRecord(f->e, NULL))                  \
    X("hcclEventRecord", "stream", hcclInvalidUsage, hcclEventRecord(f->e, f->dead_s))                \
    X("hcclEventQuery", "event", hcclInvalidArgument, hcclEventQuery(NULL))                           \
    X("hcclEventQuery", "event", hcclInvalidUsage, hcclEventQuery(f->dead_e))                         \
    X("hcclEventSynchronize", "event", hcclInvalidArgument, hcclEventSynchronize(NULL))               \
    X("hcclEventSynchronize", "event", hcclInvalidUsage, hcclEventSynchronize(f->dead_e))             \
    X("hcclAllReduceOnStream", "stream", hcclInvalidArgument,                                        \
      hcclAllReduceOnStream(f->buf, f->buf2, 4, hcclFloat32, hcclSum, f->c, NULL))                    \
    X("hcclAllReduceOnStream", "comm", hcclInvalidArgument,                                          \
      hcclAllReduceOnStream(f->buf, f->buf2, 4, hcclFloat32, hcclSum, NULL, f->s))                    \
    X("hcclAllReduceOnStream", "comm", hcclInvalidUsage,                                             \
      hcclAllReduceOnStream(f->buf, f->buf2, 4, hcclFloat32, hcclSum, f->dead, f->s))                 \
    X("hcclAllReduceOnStream", "datatype", hcclInvalidArgument,                                      \
      hcclAllReduceOnStream(f->buf, f->buf2, 4, (hcclDataType_t)99, hcclSum, f->c, f->s))             \
    X("hcclAllReduceOnStream", "op", hcclInvalidArgument,                                            \
      hcclAllReduceOnStream(f->buf, f->buf2, 4, hcclFloat32, hcclNumOps, f->c, f->s))                 \
    X("hcclAllReduceOnStream", "count", hcclInvalidArgument,                                         \
      hcclAllReduceOnStream(f->buf, f->buf2, HUGE, hcclFloat32, hcclSum, f->c, f->s))                 \
    X("hcclAllReduceOnStream", "sendbuf", hcclInvalidArgument,                                       \
      hcclAllReduceOnStream(NULL, f->buf2, 4, hcclFloat32, hcclSum, f->c, f->s))                      \
    X("hcclBroadcastOnStream", "root", hcclInvalidArgument,                                          \
      hcclBroadcastOnStream(f->buf, 4, hcclFloat32, 1, f->c, f->s))                                   \
    X("hcclBroadcastOnStream", "stream", hcclInvalidUsage,                                           \
      hcclBroadcastOnStream(f->buf, 4, hcclFloat32, 0, f->c, f->dead_s))                              \
    X("hcclAllGatherOnStream", "recvbuf", hcclInvalidArgument,                                       \
      hcclAllGatherOnStream(f->buf, NULL, 4, hcclFloat32, f->c, f->s))                                \
    X("hcclReduceScatterOnStream", "op", hcclInvalidArgument,                                        \
      hcclReduceScatterOnStream(f->buf, f->buf2, 4, hcclFloat32, (hcclRedOp_t)-1, f->c, f->s))        \
    X("hcclAlltoAllOnStream", "datatype", hcclInvalidArgument,                                       \
      hcclAlltoAllOnStream(f->buf, f->buf2, 4, hcclNumTypes, f->c, f->s))

typedef struct {
    const char *call;
    const char *names;
    hcclResult_t want;
} row_t;

#define ROW_ENTRY(call_, names_, want_, ...) {call_, names_, want_},
static const row_t rows[] = {ROWS(ROW_ENTRY)};
#define NROWS ((int)(sizeof(rows) / sizeof(rows[0])))

#define ROW_CASE(call_, names_, want_, ...)                                                            \
    if (i == n++)                                                                                      \
        return (__VA_ARGS__);
static hcclResult_t run_row(fx_t *f, int i)
{
    int n = 0;

    ROWS(ROW_CASE)
    return hcclInternalError;
}

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));
    hcclUniqueId id2;
    hcclRequest_t r;

    assert_non_null(f);
    assert_int_equal(hcclGetUniqueId(&f->id), hcclSuccess);
    assert_int_equal(hcclCommInitRank(&f->c, 1, f->id, 0), hcclSuccess);
    assert_int_equal(hcclGetUniqueId(&id2), hcclSuccess);
    assert_int_equal(hcclCommInitRank(&f->dead, 1, id2, 0), hcclSuccess);
    assert_int_equal(hcclCommDestroy(f->dead), hcclSuccess);
    assert_int_equal(hcclAllReduceAsync(f->buf, f->buf, 4, hcclFloat32, hcclSum, f->c, &r), hcclSuccess);
    f->stale = r;
    assert_int_equal(hcclWait(&r), hcclSuccess);
    memset(f->junk_id.internal, 0x33, sizeof(f->junk_id.internal));
    assert_int_equal(hcclUniqueIdToString(&f->id, f->idstr, sizeof(f->idstr)), hcclSuccess);
    f->counts[0] = 4;
    assert_int_equal(hcclStreamCreate(&f->s), hcclSuccess);
    assert_int_equal(hcclStreamCreate(&f->dead_s), hcclSuccess);
    assert_int_equal(hcclStreamDestroy(f->dead_s), hcclSuccess);
    assert_int_equal(hcclEventCreate(&f->e), hcclSuccess);
    assert_int_equal(hcclEventCreate(&f->dead_e), hcclSuccess);
    assert_int_equal(hcclEventDestroy(f->dead_e), hcclSuccess);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;

    assert_int_equal(hcclStreamSynchronize(f->s), hcclSuccess);
    assert_int_equal(hcclStreamDestroy(f->s), hcclSuccess);
    assert_int_equal(hcclEventDestroy(f->e), hcclSuccess);
    assert_int_equal(hcclCommDestroy(f->c), hcclSuccess);
    free(f);
    return 0;
}

static void test_every_row(void **state)
{
    fx_t *f = *state;
    int failed = 0;

    for (int i = 0; i < NROWS; i++) {
        hcclComm_t live = f->c;
        hcclResult_t res;
        const char *msg;

        f->req = NULL;
        f->reqs[0] = f->reqs[1] = NULL;
        res = run_row(f, i);
        msg = hcclGetLastError(NULL);
        if (res != rows[i].want || !msg[0] || !strstr(msg, rows[i].names) ||
            (rows[i].call && !strstr(msg, rows[i].call) && strncmp(rows[i].call, "hcclWaitAll", 11))) {
            print_error("row %d %s(bad %s): got %s (%d), want %s; text: '%s'\n", i, rows[i].call,
                        rows[i].names, hcclGetErrorString(res), (int)res, hcclGetErrorString(rows[i].want),
                        msg);
            failed++;
        }
        f->c = live; /* a row may not replace the live communicator */
    }
    print_message("%d rows, %d failed\n", NROWS, failed);
    assert_int_equal(failed, 0);
}

/* A request waited twice through two copies of its handle: the second is told, not UB. */
static void test_request_waited_twice(void **state)
{
    fx_t *f = *state;
    hcclRequest_t r, copy;
    int done = 0;

    assert_int_equal(hcclAllReduceAsync(f->buf, f->buf2, 4, hcclFloat32, hcclSum, f->c, &r), hcclSuccess);
    copy = r;
    assert_int_equal(hcclWait(&r), hcclSuccess);
    assert_null(r);
    assert_int_equal(hcclWait(&copy), hcclInvalidUsage);
    assert_non_null(strstr(hcclGetLastError(NULL), "already waited"));
    assert_int_equal(hcclTest(&copy, &done), hcclInvalidUsage);
    /* The null request of MPI: waiting on it again is fine. */
    assert_int_equal(hcclWait(&r), hcclSuccess);
}

/* Codes out of range still have a string. */
static void test_error_strings(void **state)
{
    (void)state;
    assert_non_null(hcclGetErrorString((hcclResult_t)-1));
    assert_non_null(hcclGetErrorString(hcclNumResults));
    assert_non_null(hcclGetLastError(NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_every_row, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_waited_twice, setup, teardown),
        cmocka_unit_test(test_error_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
