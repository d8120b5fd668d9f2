/* Helpers of the plan and executor tests (plan_helpers.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "plan_helpers.h"

void on_done(hccl_run_t *run, hcclResult_t res, const char *msg, void *arg)
{
    done_t *d = arg;

    d->ndone++;
    d->res = res;
    d->seq = hccl_exec_run_seq(run);
    snprintf(d->msg, sizeof(d->msg), "%s", msg ? msg : "");
}

bool drive_until(hccl_reactor_t *r, const int *counter, int target)
{
    for (int i = 0; i < MAX_DRIVES && *counter < target; i++)
        hccl_reactor_drive(r, 0);
    return *counter >= target;
}

void drive_some(hccl_reactor_t *r, int n)
{
    for (int i = 0; i < n; i++)
        hccl_reactor_drive(r, 0);
}

hccl_plan_t *new_plan(int rank, int nranks)
{
    hccl_plan_t *p = NULL;

    assert_int_equal(hccl_plan_create(rank, nranks, hcclFloat32, hcclSum, "test", &p), hcclSuccess);
    assert_non_null(p);
    return p;
}
