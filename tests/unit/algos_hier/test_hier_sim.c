/*
 * Two-level AllReduce and Broadcast over the sim link, with the ranks spread
 * over "hosts" in several layouts (even, uneven, interleaved): results against
 * a reference in double, and only the hosts' leaders send across hosts.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reference.h"
#include "sim_run.h"

typedef struct {
    int n;
    int node_of[16];
} layout_t;

static const layout_t layouts[] = {
    {4, {0, 0, 1, 1}},
    {6, {0, 0, 1, 1, 2, 2}},
    {6, {0, 0, 0, 1, 1, 1}},
    {6, {0, 1, 1, 1, 2, 2}},          /* a host with one rank */
    {8, {0, 1, 0, 1, 0, 1, 0, 1}},    /* interleaved */
    {7, {0, 0, 0, 0, 0, 0, 0}},       /* one host: reduce + broadcast inside it */
    {9, {2, 2, 2, 0, 0, 0, 1, 1, 1}}, /* host indices not in rank order */
};

static double input(int r, size_t i)
{
    return (double)((int)((i * 31u + (unsigned)r * 17u) % 13u) - 6);
}

static hccl_tuner_t tuner_for(const layout_t *l)
{
    hccl_tuner_t t;

    hccl_tuner_init(&t, NULL, 4u << 20);
    t.chunk_bytes = 4096;
    hccl_tuner_set_topology(&t, l->node_of, l->n);
    return t;
}

/* Every send of a plan goes to the same host unless the sender leads its host. */
static void check_cross_host(const layout_t *l, int rank, const hccl_plan_t *p, int root)
{
    int leader = -1;

    for (int r = 0; r < l->n && leader < 0; r++)
        if (l->node_of[r] == l->node_of[rank])
            leader = r;
    if (root >= 0 && l->node_of[root] == l->node_of[rank])
        leader = root;
    for (uint32_t i = 0; i < p->nsteps; i++) {
        const hccl_step_t *s = &p->steps[i];
        if (s->kind == HCCL_STEP_SEND && l->node_of[s->peer] != l->node_of[rank] && rank != leader)
            fail_msg("rank %d (not its host's leader %d) sends to rank %d on another host", rank, leader,
                     s->peer);
    }
}

static void run_allreduce(const layout_t *l, size_t count, hcclDataType_t dt, hcclRedOp_t op, bool in_place)
{
    hccl_tuner_t t = tuner_for(l);
    hccl_coll_shape_t shape = {HCCL_COLL_ALLREDUCE, count, dt, op, -1, NULL};
    hccl_plan_t *plans[16] = {0};
    void *send[16], *recv[16];
    size_t esz = hccl_dtype_size(dt);

    for (int r = 0; r < l->n; r++) {
        assert_int_equal(hccl_algo_build(&t, HCCL_ALGO_HIER, r, l->n, &shape, &plans[r]), hcclSuccess);
        check_cross_host(l, r, plans[r], -1);
        send[r] = calloc(count + 1, esz);
        recv[r] = in_place ? send[r] : calloc(count + 1, esz);
        for (size_t i = 0; i < count; i++)
            ref_store(send[r], i, dt, input(r, i));
    }
    assert_int_equal(sim_run_plans(l->n, plans, send, recv, NULL), hcclSuccess);
    for (int r = 0; r < l->n; r++) {
        for (size_t i = 0; i < count; i++) {
            double want = input(0, i), got;
            for (int q = 1; q < l->n; q++) {
                double v = input(q, i);
                want = op == hcclMax ? fmax(want, v) : op == hcclMin ? fmin(want, v) : want + v;
            }
            if (op == hcclAvg)
                want = dt == hcclFloat32 ? want / l->n : (double)((int64_t)want / l->n);
            got = ref_load(recv[r], i, dt);
            if (fabs(got - want) > 1e-4)
                fail_msg("hier allreduce n=%d count=%zu op %d: rank %d [%zu] = %g, want %g", l->n, count,
                         (int)op, r, i, got, want);
        }
        hccl_plan_release(plans[r]);
        free(send[r]);
        if (!in_place)
            free(recv[r]);
    }
}

static void run_broadcast(const layout_t *l, size_t count, int root)
{
    hccl_tuner_t t = tuner_for(l);
    hccl_coll_shape_t shape = {HCCL_COLL_BROADCAST, count, hcclInt32, hcclSum, root, NULL};
    hccl_plan_t *plans[16] = {0};
    void *buf[16];

    for (int r = 0; r < l->n; r++) {
        assert_int_equal(hccl_algo_build(&t, HCCL_ALGO_HIER, r, l->n, &shape, &plans[r]), hcclSuccess);
        check_cross_host(l, r, plans[r], root);
        buf[r] = calloc(count + 1, sizeof(int32_t));
        for (size_t i = 0; i < count; i++)
            ((int32_t *)buf[r])[i] = r == root ? (int32_t)input(root, i) : -99;
    }
    assert_int_equal(sim_run_plans(l->n, plans, buf, buf, NULL), hcclSuccess);
    for (int r = 0; r < l->n; r++) {
        for (size_t i = 0; i < count; i++)
            if (((int32_t *)buf[r])[i] != (int32_t)input(root, i))
                fail_msg("hier broadcast n=%d root %d: rank %d [%zu] wrong", l->n, root, r, i);
        hccl_plan_release(plans[r]);
        free(buf[r]);
    }
}

static void test_allreduce(void **state)
{
    static const size_t counts[] = {0, 1, 13, 1031, 70001};
    static const hcclRedOp_t ops[] = {hcclSum, hcclMax, hcclMin, hcclAvg};

    (void)state;
    for (size_t k = 0; k < sizeof(layouts) / sizeof(layouts[0]); k++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++)
                for (int ip = 0; ip < 2; ip++) {
                    run_allreduce(&layouts[k], counts[c], hcclFloat32, ops[o], ip);
                    run_allreduce(&layouts[k], counts[c], hcclInt32, ops[o], ip);
                }
}

static void test_broadcast(void **state)
{
    static const size_t counts[] = {0, 1, 1031, 70001};

    (void)state;
    for (size_t k = 0; k < sizeof(layouts) / sizeof(layouts[0]); k++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            for (int root = 0; root < layouts[k].n; root += 2)
                run_broadcast(&layouts[k], counts[c], root);
}

/* The tuner takes the two-level algorithms only when every host has several ranks. */
static void test_tuner(void **state)
{
    hccl_coll_shape_t ar = {HCCL_COLL_ALLREDUCE, 1 << 20, hcclFloat32, hcclSum, -1, NULL};
    hccl_tuner_t t;

    (void)state;
    t = tuner_for(&layouts[1]);
    assert_int_equal(hccl_tuner_pick(&t, &ar, 6), HCCL_ALGO_HIER);
    t = tuner_for(&layouts[3]);
    assert_int_not_equal(hccl_tuner_pick(&t, &ar, 6), HCCL_ALGO_HIER);
    t = tuner_for(&layouts[5]);
    assert_int_not_equal(hccl_tuner_pick(&t, &ar, 7), HCCL_ALGO_HIER);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_tuner),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
