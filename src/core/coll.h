/* The collectives' path inside core: entry points (coll.c), submission (coll_submit.c), HCCL_CHECK
 * (coll_check.c). */
#ifndef HCCL_CORE_COLL_H
#define HCCL_CORE_COLL_H

#include "core/comm.h"

/* One checked call of an entry point, as coll_submit turns it into a request. */
typedef struct {
    hccl_coll_t coll;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    hcclDataType_t dtype;
    hcclRedOp_t op;
    int root;
    size_t *v; /* owned until handed to the request */
} hccl_coll_call_t;

/*
 * Makes c a request and posts it (blocking: the caller waits for it at once, and helps the
 * reactor; a blocking call the lane takes may run on this thread instead, and then *req_p is
 * NULL). On failure c->v is freed.
 */
hcclResult_t hccl_coll_submit(struct hcclComm *comm, const char *fn, hccl_coll_call_t *c,
                              bool blocking, hcclRequest_t *req_p);
/* Reactor thread: plan the request (cached by shape) and start it. */
void hccl_coll_start(struct hcclComm *comm, struct hcclRequest *req);
/* Reactor thread: HCCL_CHECK's signature exchange first, then the lane or hccl_coll_start, in
 * the order the requests were posted. */
void hccl_coll_start_checked(struct hcclComm *comm, struct hcclRequest *req);

#endif /* HCCL_CORE_COLL_H */
