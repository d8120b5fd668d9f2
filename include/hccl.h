/*
 * hccl: collective communication over host memory.
 *
 * The one public header. C99, usable from C++. Every call returns an
 * hcclResult_t; none aborts, exits or prints to stdout. The detailed text of
 * this thread's last failure is returned by hcclGetLastError().
 *
 * Thread safety: every call is thread-safe. Within one communicator all ranks
 * must post collectives in the same order.
 *
 * This header is the reference. The rules that hold across calls are in
 * docs/api.md, how to use them in docs/user-guide.md.
 */
#ifndef HCCL_H
#define HCCL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(HCCL_BUILDING_LIBRARY) && defined(__GNUC__)
#define HCCL_API __attribute__((visibility("default")))
#else
#define HCCL_API
#endif

#define HCCL_MAJOR 0
#define HCCL_MINOR 1
#define HCCL_PATCH 0
#define HCCL_VERSION_CODE (HCCL_MAJOR * 10000 + HCCL_MINOR * 100 + HCCL_PATCH)

typedef enum {
    hcclSuccess = 0,
    hcclInvalidArgument = 1, /* null pointer, bad count/dtype/op/root/rank */
    hcclInvalidUsage = 2,    /* mismatched calls across ranks, use after destroy, bad config */
    hcclSystemError = 3,     /* an OS or libevent call failed */
    hcclRemoteError = 4,     /* a peer died, disconnected or reported an error */
    hcclTimeout = 5,         /* connect or execution timeout expired */
    hcclInProgress = 6,      /* the operation has not finished */
    hcclAborted = 7,         /* the communicator was aborted */
    hcclUnsupported = 8,     /* not available in this build or on this host */
    hcclInternalError = 9,
    hcclNumResults
} hcclResult_t;

typedef enum {
    hcclInt8,
    hcclUint8,
    hcclInt32,
    hcclUint32,
    hcclInt64,
    hcclUint64,
    hcclFloat16,
    hcclBfloat16,
    hcclFloat32,
    hcclFloat64,
    hcclNumTypes
} hcclDataType_t;

/* hcclAvg: sum then divide by nranks (integers: truncating division). */
typedef enum { hcclSum, hcclProd, hcclMax, hcclMin, hcclAvg, hcclNumOps } hcclRedOp_t;

#define HCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[HCCL_UNIQUE_ID_BYTES];
} hcclUniqueId;

typedef struct hcclComm *hcclComm_t;
typedef struct hcclRequest *hcclRequest_t;

struct event_base;

/*
 * Communicator configuration. Initialise with HCCL_CONFIG_INITIALIZER: an
 * unset field (NULL, or -1) takes its HCCL_* environment variable or default.
 */
typedef struct {
    size_t size;                  /* sizeof(hcclConfig_t), set by the initializer */
    struct event_base *eventBase; /* NULL: own progress thread; else the caller's loop drives */
    int connectTimeoutMs;         /* bootstrap and link set-up deadline; -1: HCCL_CONNECT_TIMEOUT or 120 s */
    int execTimeoutMs;            /* per request; 0 = none; -1: HCCL_EXEC_TIMEOUT or none */
    const char *algo;             /* HCCL_ALGO syntax; NULL: HCCL_ALGO or automatic */
} hcclConfig_t;

#define HCCL_CONFIG_INITIALIZER {sizeof(hcclConfig_t), NULL, -1, -1, NULL}

/* Versions and errors. */

/* *version = MAJOR*10000 + MINOR*100 + PATCH. hcclInvalidArgument if version is NULL. */
HCCL_API hcclResult_t hcclGetVersion(int *version);
/* A static description of result; never NULL. */
HCCL_API const char *hcclGetErrorString(hcclResult_t result);
/* The detailed text of this thread's last failure, "" if none. comm may be NULL. */
HCCL_API const char *hcclGetLastError(hcclComm_t comm);

/* Communicators. */

/*
 * Called once, on one process (usually rank 0's). Opens the rendezvous
 * listener in this process (on HCCL_SOCKET_IFNAME, else the first non-loopback
 * interface that is up) and writes its address plus a random secret into id.
 * The listener serves one communicator's rendezvous and then closes.
 */
HCCL_API hcclResult_t hcclGetUniqueId(hcclUniqueId *id);

#define HCCL_UNIQUE_ID_STRLEN 257 /* hex text + NUL */
/* Hex text of id into buf; len < HCCL_UNIQUE_ID_STRLEN is hcclInvalidArgument. */
HCCL_API hcclResult_t hcclUniqueIdToString(const hcclUniqueId *id, char *buf, size_t len);
/* Parses text written by hcclUniqueIdToString; anything else is hcclInvalidArgument. */
HCCL_API hcclResult_t hcclUniqueIdFromString(hcclUniqueId *id, const char *str);

/*
 * Collective over nranks processes: blocks until every rank has joined and
 * every link is up, or fails within the connect timeout. A size mismatch, a
 * duplicate or out-of-range rank is hcclInvalidUsage on every rank, naming
 * the ranks; a rank that never arrives is hcclTimeout, naming it.
 */
HCCL_API hcclResult_t hcclCommInitRank(hcclComm_t *comm, int nranks, hcclUniqueId id, int rank);
/* As hcclCommInitRank; config (may be NULL) overrides the environment. */
HCCL_API hcclResult_t hcclCommInitRankConfig(hcclComm_t *comm, int nranks, hcclUniqueId id,
                                             int rank, const hcclConfig_t *config);
/*
 * Launcher-style init: commId is "host:port" (the value of HCCL_COMM_ID);
 * rank 0 listens there, the others connect. If HCCL_COMM_SECRET (hex) is set
 * it must be the same on every rank and guards the rendezvous.
 */
HCCL_API hcclResult_t hcclCommInitGroup(hcclComm_t *comm, uint32_t commSize, const char *commId,
                                        uint32_t rankId);
/*
 * Reads rank, size and rendezvous from the launcher's environment, first
 * match wins: HCCL_COMM_ID+RANK_ID+WORLD_SIZE; torchrun (RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT); Open MPI (OMPI_COMM_WORLD_RANK/SIZE); MPICH/Hydra
 * (PMI_RANK/PMI_SIZE); Slurm (SLURM_PROCID/SLURM_NTASKS). The rendezvous is
 * HCCL_COMM_ID or MASTER_ADDR:MASTER_PORT.
 */
HCCL_API hcclResult_t hcclCommInitFromEnv(hcclComm_t *comm);

#define HCCL_SPLIT_NOCOLOR -1
/*
 * Collective over comm: ranks passing the same color form a new communicator,
 * ordered by (key, rank in comm); the new one takes comm's settings. A rank
 * passing HCCL_SPLIT_NOCOLOR (any color < 0) gets *newcomm = NULL.
 */
HCCL_API hcclResult_t hcclCommSplit(hcclComm_t comm, int color, int key, hcclComm_t *newcomm);

/*
 * Called by every rank of comm that is not in excludeRanks[excludeCount] (the dead or unwanted
 * ranks), also after comm has failed: builds *newcomm of the remaining ranks, renumbered
 * densely in their old order, through comm's rank table, without the excluded ranks and
 * without a new rendezvous (the lowest remaining rank leads it). config NULL: comm's settings.
 * Blocks until the new communicator is up, at most the connect timeout.
 * Results: hcclInvalidArgument (a rank out of range or listed twice, NULL newcomm),
 * hcclInvalidUsage (this rank excludes itself; the remaining ranks disagree on the list,
 * named in hcclGetLastError), hcclRemoteError (a remaining rank died meanwhile: call it again,
 * excluding that rank too), hcclTimeout (a remaining rank did not call it in time).
 * comm stays to be destroyed or aborted. Not concurrently with another hcclCommShrink of comm.
 */
HCCL_API hcclResult_t hcclCommShrink(hcclComm_t comm, const int *excludeRanks, int excludeCount,
                                     const hcclConfig_t *config, hcclComm_t *newcomm);

/* Waits for this rank's outstanding requests, then frees comm. */
HCCL_API hcclResult_t hcclCommDestroy(hcclComm_t comm);
/* Completes every outstanding request with hcclAborted, then frees comm. */
HCCL_API hcclResult_t hcclCommAbort(hcclComm_t comm);
/* hcclSuccess, or the error (hcclRemoteError, hcclTimeout, ...) that broke comm. */
HCCL_API hcclResult_t hcclCommGetAsyncError(hcclComm_t comm, hcclResult_t *asyncError);
HCCL_API hcclResult_t hcclCommCount(hcclComm_t comm, int *count);
HCCL_API hcclResult_t hcclCommUserRank(hcclComm_t comm, int *rank);

/*
 * Non-blocking collectives return once the operation is queued; the buffers
 * belong to the library until *req completes. The blocking forms are the
 * Async form followed by hcclWait. count == 0 is a valid no-op (buffers may
 * be NULL) that still completes its request.
 */

/* sendbuf == recvbuf is in-place. */
HCCL_API hcclResult_t hcclAllReduceAsync(const void *sendbuf, void *recvbuf, size_t count,
                                         hcclDataType_t datatype, hcclRedOp_t op,
                                         hcclComm_t comm, hcclRequest_t *req);
HCCL_API hcclResult_t hcclAllReduce(const void *sendbuf, void *recvbuf, size_t count,
                                    hcclDataType_t datatype, hcclRedOp_t op, hcclComm_t comm);

/*
 * Layouts follow NCCL. Broadcast: buf on every rank, the root's is sent.
 * Reduce: recvbuf is written on the root only (NULL allowed elsewhere).
 * AllGather: recvbuf holds nranks*sendcount elements in rank order; in-place
 * is sendbuf == recvbuf + rank*sendcount. ReduceScatter: sendbuf holds
 * nranks*recvcount and rank i gets block i; in-place is
 * recvbuf == sendbuf + rank*recvcount. AlltoAll: block j of sendbuf goes to
 * rank j, block i of recvbuf comes from rank i; the buffers must not overlap.
 * AlltoAllv: counts and displacements in elements, per peer.
 */
HCCL_API hcclResult_t hcclBroadcastAsync(void *buf, size_t count, hcclDataType_t datatype, int root,
                                         hcclComm_t comm, hcclRequest_t *req);
HCCL_API hcclResult_t hcclBroadcast(void *buf, size_t count, hcclDataType_t datatype, int root,
                                    hcclComm_t comm);
HCCL_API hcclResult_t hcclReduceAsync(const void *sendbuf, void *recvbuf, size_t count,
                                      hcclDataType_t datatype, hcclRedOp_t op, int root,
                                      hcclComm_t comm, hcclRequest_t *req);
HCCL_API hcclResult_t hcclReduce(const void *sendbuf, void *recvbuf, size_t count,
                                 hcclDataType_t datatype, hcclRedOp_t op, int root, hcclComm_t comm);
HCCL_API hcclResult_t hcclAllGatherAsync(const void *sendbuf, void *recvbuf, size_t sendcount,
                                         hcclDataType_t datatype, hcclComm_t comm,
                                         hcclRequest_t *req);
HCCL_API hcclResult_t hcclAllGather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                    hcclDataType_t datatype, hcclComm_t comm);
HCCL_API hcclResult_t hcclReduceScatterAsync(const void *sendbuf, void *recvbuf, size_t recvcount,
                                             hcclDataType_t datatype, hcclRedOp_t op,
                                             hcclComm_t comm, hcclRequest_t *req);
HCCL_API hcclResult_t hcclReduceScatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                        hcclDataType_t datatype, hcclRedOp_t op, hcclComm_t comm);
HCCL_API hcclResult_t hcclAlltoAllAsync(const void *sendbuf, void *recvbuf, size_t count,
                                        hcclDataType_t datatype, hcclComm_t comm,
                                        hcclRequest_t *req);
HCCL_API hcclResult_t hcclAlltoAll(const void *sendbuf, void *recvbuf, size_t count,
                                   hcclDataType_t datatype, hcclComm_t comm);
HCCL_API hcclResult_t hcclAlltoAllvAsync(const void *sendbuf, const size_t *sendcounts,
                                         const size_t *sdispls, void *recvbuf,
                                         const size_t *recvcounts, const size_t *rdispls,
                                         hcclDataType_t datatype, hcclComm_t comm,
                                         hcclRequest_t *req);
HCCL_API hcclResult_t hcclAlltoAllv(const void *sendbuf, const size_t *sendcounts,
                                    const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                    const size_t *rdispls, hcclDataType_t datatype, hcclComm_t comm);
/* Completes on a rank once every rank has entered it. */
HCCL_API hcclResult_t hcclBarrierAsync(hcclComm_t comm, hcclRequest_t *req);
HCCL_API hcclResult_t hcclBarrier(hcclComm_t comm);
/*
 * Point to point: not collective. Sends and receives between a pair match
 * in posting order; the counts must agree. Send/Recv to oneself completes
 * locally.
 */
HCCL_API hcclResult_t hcclSendAsync(const void *buf, size_t count, hcclDataType_t datatype, int peer,
                                    hcclComm_t comm, hcclRequest_t *req);
HCCL_API hcclResult_t hcclSend(const void *buf, size_t count, hcclDataType_t datatype, int peer,
                               hcclComm_t comm);
HCCL_API hcclResult_t hcclRecvAsync(void *buf, size_t count, hcclDataType_t datatype, int peer,
                                    hcclComm_t comm, hcclRequest_t *req);
HCCL_API hcclResult_t hcclRecv(void *buf, size_t count, hcclDataType_t datatype, int peer,
                               hcclComm_t comm);

/* Requests. */

/* Blocks until *req completes; returns its result and sets *req = NULL. NULL *req: success. */
HCCL_API hcclResult_t hcclWait(hcclRequest_t *req);
/*
 * Never blocks. Unfinished: hcclSuccess with *done = 0 and *req unchanged.
 * Finished: *done = 1, *req = NULL, and the operation's result.
 */
HCCL_API hcclResult_t hcclTest(hcclRequest_t *req, int *done);
/* Waits for all n (NULL entries skipped); the first error wins; all are set to NULL. */
HCCL_API hcclResult_t hcclWaitAll(int n, hcclRequest_t *reqs);
/*
 * fn runs once when req completes, on the thread running the communicator's
 * progress at that moment: its progress thread, or a thread of the caller's
 * that drives it (one waiting in hcclWait or a blocking call, one whose Async
 * call found it idle, or the loop given as eventBase; docs/user-guide.md,
 * Callbacks). If req has already completed, fn runs at once on the caller's
 * thread. fn has returned before hcclWait/hcclTest report req done. It must
 * not block. One callback per request.
 */
HCCL_API hcclResult_t hcclRequestSetCallback(hcclRequest_t req,
                                             void (*fn)(hcclRequest_t req, hcclResult_t result,
                                                        void *arg),
                                             void *arg);
/*
 * A descriptor that becomes readable when any request of comm completes. It
 * is a counter (eventfd): each completion adds one, and it stays readable
 * until the caller reads its 8 bytes. Owned by comm: do not close it.
 */
HCCL_API hcclResult_t hcclCommGetCompletionFd(hcclComm_t comm, int *fd);
/* Advances a communicator driven by the caller's event loop without blocking; no-op otherwise. */
HCCL_API hcclResult_t hcclCommProgress(hcclComm_t comm);

/*
 * Diagnostics: writes to out, for every request in flight on comm, its collective, sequence
 * number and algorithm, the plan steps not done yet (kind, peer, byte range as slot[begin, end),
 * and whether each is posted and waiting on its peer, ready, or blocked on earlier steps), and
 * for each peer link how long ago bytes were last sent and received. Safe to call from any
 * thread while collectives are blocked: it never waits for the progress thread to answer, and
 * waits at most about a second for its lock (then says the state was not listed).
 * hcclInvalidArgument when comm or out is NULL; hcclSystemError if writing out fails.
 * With HCCL_DUMP_ON_SIGNAL=1, SIGUSR1 writes this report for every live communicator to the
 * log (stderr or HCCL_DEBUG_FILE).
 */
HCCL_API hcclResult_t hcclCommDumpState(hcclComm_t comm, FILE *out);

/*
 * Host streams: the CPU counterpart of a cudaStream_t / aclrtStream. A stream
 * is an ordered queue with its own worker thread; what is queued on it runs
 * there one item after the other. A collective placed on a stream is posted
 * when everything queued before it has finished, and what is queued after it
 * waits for its completion (the worker sleeps meanwhile). Events mark a point
 * of a stream, so that another stream or the host can wait for it.
 *
 * Errors: a bad argument is returned by the call itself. A collective that
 * fails later (a peer's error, the exec timeout, an abort) puts the stream in
 * a sticky error state: hcclStreamSynchronize (and hcclStreamDestroy) return
 * that error with hcclGetLastError naming the collective; the host functions
 * and collectives queued after it are skipped, never run on bad data, and
 * later hcclStreamEnqueue / ...OnStream calls return the error at once. An
 * event recorded after the failure completes carrying the error, and a stream
 * that waits for such an event takes the error too. A failed stream stays
 * failed: destroy it and create another.
 *
 * The communicator and the buffers of a collective on a stream are borrowed
 * until it has completed: synchronize the stream before destroying them. A
 * communicator driven by the caller's event loop (hcclConfig_t.eventBase)
 * completes a collective on a stream only while that loop runs.
 * Every call is thread-safe. Calls that would wait for the calling stream
 * worker itself (synchronizing or destroying its own stream from a function
 * running on it) return hcclInvalidUsage.
 */
typedef struct hcclStream *hcclStream_t;
typedef struct hcclEvent *hcclEvent_t;

/* Creates a stream and its worker thread. hcclSystemError if the thread cannot be started. */
HCCL_API hcclResult_t hcclStreamCreate(hcclStream_t *stream);
/*
 * Waits until everything queued on stream (including what its functions queue meanwhile) has
 * run, then stops the worker and frees the stream, whatever the result: hcclSuccess, or the
 * stream's sticky error. A destroyed handle is hcclInvalidUsage afterwards.
 */
HCCL_API hcclResult_t hcclStreamDestroy(hcclStream_t stream);
/* Queues fn(arg) to run on the stream's worker after what is queued already; fn non-NULL. */
HCCL_API hcclResult_t hcclStreamEnqueue(hcclStream_t stream, void (*fn)(void *arg), void *arg);
/* Blocks until everything queued on stream before the call has finished; the sticky error. */
HCCL_API hcclResult_t hcclStreamSynchronize(hcclStream_t stream);
/*
 * What is queued on stream after this call waits until the work captured by event's latest
 * hcclEventRecord has finished (on whichever stream it was recorded); the worker sleeps. An event
 * never recorded makes this a no-op. Re-recording or destroying event afterwards does not change
 * what this wait waits for.
 */
HCCL_API hcclResult_t hcclStreamWaitEvent(hcclStream_t stream, hcclEvent_t event);

HCCL_API hcclResult_t hcclEventCreate(hcclEvent_t *event);
/* Frees the handle; waits already queued on streams stay valid. */
HCCL_API hcclResult_t hcclEventDestroy(hcclEvent_t event);
/* Captures "everything queued on stream so far"; recording again moves it to the new point. */
HCCL_API hcclResult_t hcclEventRecord(hcclEvent_t event, hcclStream_t stream);
/*
 * hcclSuccess when the captured work has finished (or the event was never recorded),
 * hcclInProgress while it has not; the stream's error if that work failed. Never blocks.
 */
HCCL_API hcclResult_t hcclEventQuery(hcclEvent_t event);
/* Blocks until the captured work has finished; its result as hcclEventQuery. */
HCCL_API hcclResult_t hcclEventSynchronize(hcclEvent_t event);

/*
 * Collectives on a stream: the arguments of the Async forms, checked by the call itself, with
 * stream in place of req. The collective is posted on comm when the stream reaches it, so every
 * rank must reach its collectives on comm in the same order, as with the Async forms.
 */
HCCL_API hcclResult_t hcclAllReduceOnStream(const void *sendbuf, void *recvbuf, size_t count,
                                            hcclDataType_t datatype, hcclRedOp_t op,
                                            hcclComm_t comm, hcclStream_t stream);
HCCL_API hcclResult_t hcclBroadcastOnStream(void *buf, size_t count, hcclDataType_t datatype,
                                            int root, hcclComm_t comm, hcclStream_t stream);
HCCL_API hcclResult_t hcclAllGatherOnStream(const void *sendbuf, void *recvbuf, size_t sendcount,
                                            hcclDataType_t datatype, hcclComm_t comm,
                                            hcclStream_t stream);
HCCL_API hcclResult_t hcclReduceScatterOnStream(const void *sendbuf, void *recvbuf,
                                                size_t recvcount, hcclDataType_t datatype,
                                                hcclRedOp_t op, hcclComm_t comm,
                                                hcclStream_t stream);
HCCL_API hcclResult_t hcclAlltoAllOnStream(const void *sendbuf, void *recvbuf, size_t count,
                                           hcclDataType_t datatype, hcclComm_t comm,
                                           hcclStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* HCCL_H */
