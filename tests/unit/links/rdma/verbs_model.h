/*
 * A model of verbs and rdma_cm semantics behind the rdma link's shim, for tests without
 * hardware: RC queue pairs with send and receive queues, a wire that moves posted work only
 * when the test pumps it, completion queues that raise a channel event only when armed and
 * only for completions that arrive after arming, memory regions whose keys are checked on every
 * access, RDMA WRITE with immediate consuming a posted receive, receiver-not-ready counted,
 * injectable error completions, and counts of every live object. Memory: a test may declare a
 * range freed and allocated again (model_free_range); a pinned MR registered before that still
 * holds the old pages, so data moved through it is a rule broken (and a write through it does
 * not reach the buffer), while an on-demand (ODP) MR follows the page tables.
 */
#ifndef HCCL_TEST_VERBS_MODEL_H
#define HCCL_TEST_VERBS_MODEL_H

#include <stdbool.h>
#include <stddef.h>

#include "links/rdma/rdma_shim.h"

typedef struct {
    int contexts, pds, cqs, comp_channels, mrs, qps, ids, cm_channels, cm_events;
} model_live_t;

typedef struct {
    int rnr;            /* a message arrived with no receive posted: the sender overran */
    int violations;     /* a verbs rule broken (see model_violation_text) */
    int cq_events;      /* channel events raised */
    int empty_polls;    /* ibv_poll_cq calls that found nothing */
    int polls;
    int writes_imm;     /* RDMA WRITE with immediate delivered */
    int sends;          /* SENDs delivered */
    int reg_mr;         /* ibv_reg_mr calls that succeeded */
    int reg_mr_odp;     /* of which with IBV_ACCESS_ON_DEMAND */
    int dereg_mr;
    int max_recv_backlog; /* most completed receives waiting in one CQ */
} model_stats_t;

extern const hccl_rdma_shim_t model_shim;

/* Forgets every object (all must be gone) and configures the device. */
void model_reset(int ndevices, bool port_active);
/* The device reports on-demand paging for RC (off after model_reset). */
void model_set_odp(bool on);
/* The port's link layer is InfiniBand (RoCE after model_reset). */
void model_set_infiniband(bool on);
/* The test freed [addr, addr + len) and allocated it again: pinned MRs over it are stale. */
void model_free_range(void *addr, size_t len);
/* Moves every posted work request across the wire; returns how many moved. */
int model_pump(void);
/* On: posted work moves at once (as on an idle wire). */
void model_auto_pump(bool on);
/* The next send work request posted (on any QP) completes with status; its QP fails. */
void model_inject_error(enum ibv_wc_status status);
/* Fails the n-th shim call made by a thread marked as the victim (0: never). */
void model_fail_at(int n);
void model_set_victim(bool victim);
int model_calls(void);
model_live_t model_live(void);
model_stats_t model_stats(void);
const char *model_violation_text(void);
/* For a test that breaks a rule on purpose, once it has checked that the model saw it. */
void model_clear_violations(void);
/* Events queued on an rdma_cm event channel and not taken yet. */
int model_cm_queued(struct rdma_event_channel *ch);
/* Waits until ch holds at least n events (true), or timeout_ms passed (false). */
bool model_cm_wait_queued(struct rdma_event_channel *ch, int n, int timeout_ms);
/* Every CQ is armed and empty: nothing can land unseen. */
bool model_cqs_quiet(void);

#endif
