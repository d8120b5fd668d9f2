/*
 * Static checks of one rank's plan: the steps form a DAG, every two steps that touch the same
 * bytes (one of them writing) are ordered by its edges, and, optionally, transfers with the
 * same peer and direction have distinct tags. Failures go through cmocka (fail_msg).
 */
#ifndef HCCL_TEST_PLAN_CHECK_H
#define HCCL_TEST_PLAN_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sched/sched.h"

/* How the call binds the slots: which of them are the same memory. SCRATCH is always apart. */
typedef enum {
    PLAN_SLOTS_APART,        /* SEND and RECV are separate buffers */
    PLAN_SLOTS_SAME,         /* SEND and RECV are one buffer (in-place AllReduce, rooted) */
    PLAN_SLOTS_SEND_IN_RECV, /* SEND starts inner_off bytes into RECV (in-place AllGather) */
    PLAN_SLOTS_RECV_IN_SEND, /* RECV starts inner_off bytes into SEND (in-place ReduceScatter) */
} plan_slots_t;

typedef struct {
    const char *name;     /* the generator, for messages */
    plan_slots_t slots;
    size_t inner_off;     /* for PLAN_SLOTS_*_IN_* */
    uint32_t max_steps;   /* plans with more steps are not checked (quadratic); 0: no limit */
    bool unique_tags;     /* no two sends (or receives) with the same peer and tag */
    bool nonempty_steps;  /* every step moves or reduces at least one byte */
    bool self_copy_noop;  /* a copy onto itself touches nothing */
    uint32_t pipeline_nch; /* > 0: tree AllReduce chunks (reduce tag c, broadcast tag nch + c);
                              no broadcast of chunk c may wait on a transfer of a later chunk */
} plan_check_t;

void plan_check(const hccl_plan_t *p, const plan_check_t *c);

#endif
