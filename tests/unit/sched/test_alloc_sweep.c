/*
 * Allocation sweeps: every allocation of a plan build and of a run's start is
 * made to fail in turn (hccl_alloc_fail_at n = 1, 2, ... until the call
 * succeeds); each failure must come back as hcclSystemError with nothing
 * leaked (the sanitizer build checks that) and nothing half-built left behind.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "algos/algos.h"
#include "reactor/reactor.h"

static const int hosts[6] = {0, 0, 1, 1, 2, 2};

/* Builds algo's plan for rank 1 of 6 under every failure point; returns the steps of the plan. */
static uint32_t sweep_build(hccl_coll_t coll, hccl_algo_t algo, size_t count)
{
    hccl_coll_shape_t shape = {coll, count, hcclFloat32, hcclAvg, 0, NULL};
    hccl_tuner_t t;
    hccl_plan_t *plan = NULL;
    int failures = 0;

    hccl_tuner_init(&t, NULL, 4u << 20);
    t.chunk_bytes = 4096;
    hccl_tuner_set_topology(&t, hosts, 6);
    for (long k = 1;; k++) {
        hcclResult_t res;
        hccl_alloc_fail_at(k);
        res = hccl_algo_build(&t, algo, 1, 6, &shape, &plan);
        hccl_alloc_fail_at(0);
        if (res == hcclSuccess)
            break;
        assert_int_equal(res, hcclSystemError);
        failures++;
        assert_true(k < 100000);
    }
    assert_true(failures > 0); /* the sweep really hit allocations */
    uint32_t n = plan->nsteps;
    hccl_plan_release(plan);
    return n;
}

static void test_build_sweeps(void **state)
{
    (void)state;
    assert_true(sweep_build(HCCL_COLL_ALLREDUCE, HCCL_ALGO_RING, 20000) > 0);
    assert_true(sweep_build(HCCL_COLL_ALLREDUCE, HCCL_ALGO_RABENSEIFNER, 20000) > 0);
    assert_true(sweep_build(HCCL_COLL_ALLREDUCE, HCCL_ALGO_HIER, 20000) > 0);
    assert_true(sweep_build(HCCL_COLL_REDUCE, HCCL_ALGO_TREE, 20000) > 0);
    assert_true(sweep_build(HCCL_COLL_BROADCAST, HCCL_ALGO_SCATTER_ALLGATHER, 20000) > 0);
    assert_true(sweep_build(HCCL_COLL_ALLGATHER, HCCL_ALGO_BRUCK, 100) > 0);
    assert_true(sweep_build(HCCL_COLL_ALLTOALL, HCCL_ALGO_BRUCK, 100) > 0);
}

typedef struct {
    int done;
    hcclResult_t res;
} done_t;

static void on_done(hccl_run_t *run, hcclResult_t res, const char *msg, void *arg)
{
    done_t *d = arg;

    (void)run, (void)msg;
    d->done++;
    d->res = res;
}

/* A run's start fails cleanly at every allocation, and then runs to the end once it can. */
static void test_exec_start_sweep(void **state)
{
    hccl_coll_shape_t shape = {HCCL_COLL_ALLREDUCE, 1000, hcclFloat32, hcclSum, -1, NULL};
    hccl_reactor_t *r;
    hccl_exec_t *ex;
    hccl_plan_t *plan;
    float buf[1000];
    done_t d = {0};
    int failures = 0;

    (void)state;
    memset(buf, 0, sizeof(buf));
    assert_int_equal(hccl_reactor_create(NULL, 0, &r), hcclSuccess);
    assert_int_equal(hccl_exec_create(r, 0, 1, NULL, &ex), hcclSuccess);
    assert_int_equal(hccl_algo_ring_allreduce(0, 1, &shape, 4096, &plan), hcclSuccess);
    for (long k = 1;; k++) {
        hcclResult_t res;
        hccl_alloc_fail_at(k);
        res = hccl_exec_start(ex, plan, 1, buf, buf, on_done, &d, NULL);
        hccl_alloc_fail_at(0);
        if (res == hcclSuccess)
            break;
        assert_int_equal(res, hcclSystemError);
        assert_int_equal(hccl_exec_inflight(ex), 0);
        failures++;
    }
    assert_true(failures > 0);
    while (!d.done)
        assert_true(hccl_reactor_drive(r, 1000));
    assert_int_equal(d.done, 1);
    assert_int_equal(d.res, hcclSuccess);
    hccl_plan_release(plan);
    hccl_exec_destroy(ex);
    hccl_reactor_destroy(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_build_sweeps),
        cmocka_unit_test(test_exec_start_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
