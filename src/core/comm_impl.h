/* What comm.c, comm_init.c, comm_id.c and comm_fail.c share and the rest of core does not. */
#ifndef HCCL_CORE_COMM_IMPL_H
#define HCCL_CORE_COMM_IMPL_H

#include "core/comm.h"

#define HCCL_ID_MAGIC 0x44494343u /* "CCID" */
#define HCCL_ID_VERSION 1

/*
 * A link failed. The communicator's error is set at once (hcclCommGetAsyncError, new calls),
 * but failing what is in flight goes behind the completions the link queued before it: a
 * receive that the peer's last frames completed advances its collective first, so that a
 * collective whose data all arrived before the peer went away still finishes.
 */
void hccl_comm_on_link_fatal(void *arg, hcclResult_t res, const char *msg);
/* graceful: every collective finished; tell the peers so that our going is not a failure. */
void hccl_comm_free(struct hcclComm *comm, bool graceful);
/* Validates an id passed by the user (magic and version). */
hcclResult_t hccl_comm_id_check(const hccl_id_t *id, const char *fn);
/* Parses up to max bytes of hex; returns the byte count, or -1 if the text is not hex. */
int hccl_hex_decode(const char *s, unsigned char *out, size_t max);

#endif /* HCCL_CORE_COMM_IMPL_H */
