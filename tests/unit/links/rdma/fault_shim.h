/*
 * A shim for fault tests: the verbs model (verbs_model.h) with chosen calls failing, put in
 * front of one rank (its ctx->v) or of init (hccl_rdma_shim). Each switch stays on until reset.
 */
#ifndef HCCL_TEST_FAULT_SHIM_H
#define HCCL_TEST_FAULT_SHIM_H

#include "verbs_model.h"

typedef struct {
    int post_send_opcode;   /* post_send of this opcode fails with EIO (-1: none, -2: any) */
    bool post_recv;         /* post_recv fails with EIO */
    bool poll_cq;           /* poll_cq returns -1 */
    bool req_notify_cq;     /* req_notify_cq fails */
    bool reg_mr;            /* reg_mr fails (ENOMEM) */
    bool accept;            /* accept fails (the model rejects the request first) */
    bool query_device_ex;   /* query_device_ex fails (an old provider) */
    bool query_gid;         /* query_gid fails for every index */
    bool unbound_listener;  /* the listener's address is on no device (verbs NULL) */
    bool bad_cm_fd;         /* the event channel's fd is invalid (fcntl fails) */
    bool bad_comp_fd;       /* the completion channel's fd is invalid */
    int truncate_next_send; /* the next post_send sends only this many bytes (0: off) */
} fault_t;

extern fault_t fault;
extern hccl_rdma_shim_t fault_shim; /* filled by fault_reset */

/* Every switch off (call first). */
void fault_reset(void);
/* Puts fault_shim in front of rank r (after its init). */
void fault_on_rank(int r);

#endif
