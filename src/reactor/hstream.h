/*
 * Host streams and events, the CPU counterpart of CUDA/ACL streams:
 *   hstream.c        streams, their worker thread, the stream calls
 *   hstream_event.c  events and the points they record, the event calls
 *   hstream_coll.c   collectives placed on streams
 *   hstream_reg.c    the registry of live handles
 *
 * A stream is a FIFO of items run in order by its own worker. An event refers to a "point",
 * one per hcclEventRecord, that the stream's worker completes when it reaches the record.
 * Waits hold the point, not the event, so re-recording or destroying an event never changes
 * what an earlier wait waits for.
 */
#ifndef HCCL_HSTREAM_H
#define HCCL_HSTREAM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "base/base.h"

#define HCCL_HSTREAM_MAGIC 0x4d525453u /* "STRM" */
#define HCCL_HEVENT_MAGIC 0x544e5645u  /* "EVNT" */
#define HCCL_HSTREAM_ERRMSG_BYTES 1024

struct hcclComm;

/* The head of every handle kept in the registry. */
typedef struct hccl_handle {
    uint32_t magic;                 /* HCCL_HSTREAM_MAGIC or HCCL_HEVENT_MAGIC */
    atomic_int refs;                /* the user's handle + every call in progress + users inside */
} hccl_handle_t;

/* A collective queued on a stream, checked when it was queued and posted when its turn comes. */
typedef struct hccl_hstream_coll {
    const char *fn;           /* the public entry point, for messages (static string) */
    int coll;                 /* hccl_coll_t */
    const void *sendbuf;      /* borrowed, the user's until the collective completes */
    void *recvbuf;            /* borrowed, the same */
    size_t count;             /* as the Async form's count argument */
    hcclDataType_t dtype;
    hcclRedOp_t op;
    int root;                 /* Broadcast only, else -1 */
    struct hcclComm *comm;    /* borrowed: must outlive the collective */
} hccl_hstream_coll_t;

/* A point of a stream: done once everything queued before its record has finished. */
typedef struct hccl_hstream_point {
    atomic_int refs;                /* the event while it is its latest record, the record, waits */
    pthread_mutex_t mtx;
    pthread_cond_t cond;            /* done became true */
    bool done;                      /* under mtx */
    hcclResult_t res;               /* under mtx: the stream's error when the point was reached */
    char *msg;                      /* owned, under mtx: its text, NULL on success */
    const struct hcclStream *stream; /* compared only, never dereferenced: where it was recorded */
} hccl_hstream_point_t;

enum { HCCL_HSTREAM_FN, HCCL_HSTREAM_COLL, HCCL_HSTREAM_RECORD, HCCL_HSTREAM_WAIT };

typedef struct hccl_hstream_item {
    struct hccl_hstream_item *next;
    int kind;                       /* HCCL_HSTREAM_* */
    void (*fn)(void *arg);          /* FN */
    void *arg;
    hccl_hstream_coll_t coll;       /* COLL */
    hccl_hstream_point_t *point;    /* owned reference: RECORD completes it, WAIT waits for it */
} hccl_hstream_item_t;

struct hcclStream {
    hccl_handle_t h;
    pthread_t thread;
    pthread_mutex_t mtx;
    pthread_cond_t work_cond;       /* the worker: an item queued, its collective done, closing */
    pthread_cond_t idle_cond;       /* synchronizers: an item finished */
    hccl_hstream_item_t *head, *tail; /* owned: queued, not yet started */
    uint64_t queued;                /* items ever queued */
    uint64_t finished;              /* items ever finished (in order) */
    bool closing;                   /* destroy has drained it: nothing more is accepted */
    hcclResult_t error;             /* sticky: the first failure */
    char errmsg[HCCL_HSTREAM_ERRMSG_BYTES];
    /* the collective in flight (at most one: the worker waits for it) */
    bool coll_done;
    hcclResult_t coll_res;
    char coll_msg[HCCL_HSTREAM_ERRMSG_BYTES]; /* the request's failure text */
};

struct hcclEvent {
    hccl_handle_t h;
    pthread_mutex_t mtx;
    hccl_hstream_point_t *point;    /* owned reference, under mtx: the latest record, or NULL */
};

/* ---- registry (hstream_reg.c) ---- */

/* Makes h live. False (nothing changed) when out of memory. */
bool hccl_handle_register(hccl_handle_t *h);
/* Takes a reference on p if it is a live handle with that magic; NULL otherwise (p unread). */
hccl_handle_t *hccl_handle_get(void *p, uint32_t magic);
/* Makes p, a live handle with that magic, dead; the caller inherits the user's reference. */
bool hccl_handle_unregister(void *p, uint32_t magic);

/* ---- streams (hstream.c) ---- */

/* The live stream behind a user's handle, with a reference; an error naming fn otherwise. */
hcclResult_t hccl_hstream_get(hcclStream_t stream, const char *fn, struct hcclStream **s_p);
void hccl_hstream_release(struct hcclStream *s);
/* The stream whose worker is the calling thread, NULL elsewhere. */
struct hcclStream *hccl_hstream_current(void);
/* A zeroed item of that kind, or NULL with the error recorded. */
hccl_hstream_item_t *hccl_hstream_item_new(int kind, const char *fn);
/*
 * Under s->mtx: appends it, or fails without taking it (a stream being destroyed; with work,
 * also a failed stream, with its error).
 */
hcclResult_t hccl_hstream_push_locked(struct hcclStream *s, hccl_hstream_item_t *it, bool work,
                                      const char *fn);
/* The same for the user's handle: checks it, locks, pushes. */
hcclResult_t hccl_hstream_push(hcclStream_t stream, hccl_hstream_item_t *it, bool work,
                               const char *fn);
/*
 * Queues c on stream (the handle the user passed) after the argument checks of c have passed.
 * Fails with hcclInvalidArgument/hcclInvalidUsage for a bad stream, or with the stream's sticky
 * error.
 */
hcclResult_t hccl_hstream_enqueue_coll(hcclStream_t stream, const hccl_hstream_coll_t *c);

/* ---- points (hstream_event.c) ---- */

void hccl_hstream_point_release(hccl_hstream_point_t *pt);
/* Worker: the point is reached; res and msg are the stream's error then. */
void hccl_hstream_point_complete(hccl_hstream_point_t *pt, hcclResult_t res, const char *msg);
/* Waits for pt; its result, with the text copied into msg. */
hcclResult_t hccl_hstream_point_wait(hccl_hstream_point_t *pt, char *msg, size_t len);

/* ---- collectives (hstream_coll.c) ---- */

/* Stream worker: posts c through its Async form. */
hcclResult_t hccl_hstream_coll_post(const hccl_hstream_coll_t *c, hcclRequest_t *req_p);

#endif /* HCCL_HSTREAM_H */
