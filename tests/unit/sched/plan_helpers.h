/*
 * Helpers of the plan and executor tests (test_plan_build, test_plan_exec, test_plan_fail,
 * test_plan_cache).
 */
#ifndef HCCL_TEST_PLAN_HELPERS_H
#define HCCL_TEST_PLAN_HELPERS_H

#include <stdbool.h>
#include <stdint.h>

#include "reactor/reactor.h"
#include "sched/sched.h"

/* Bound on reactor passes in a test: far more than any test needs, never a sleep. */
#define MAX_DRIVES 10000

typedef struct {
    int ndone;
    hcclResult_t res;
    uint64_t seq;
    char msg[512];
} done_t;

/* The executor's done callback: counts in arg (a done_t) and keeps the result, seq and message. */
void on_done(hccl_run_t *run, hcclResult_t res, const char *msg, void *arg);
/* Drives r until *counter reaches target (true) or the bound is reached (false). */
bool drive_until(hccl_reactor_t *r, const int *counter, int target);
/* Drives r n passes. */
void drive_some(hccl_reactor_t *r, int n);
/* An empty plan of rank (of nranks) over float32 and hcclSum. */
hccl_plan_t *new_plan(int rank, int nranks);

#endif
