/*
 * Two-level AllReduce, Broadcast and AllGather over the sim link, with the
 * ranks spread over "hosts" in several layouts (even, uneven, interleaved, one
 * host, one rank per host): results against a reference in double (AllGather
 * byte for byte), and only the hosts' leaders send across hosts. AllGather's
 * plans are also checked statically (hazards ordered with the slots aliased as
 * an in-place call binds them, unique tags) and its bytes counted per pair of
 * ranks against the formula in hier.c.
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

#include "plan_check.h"
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

/* ---- AllGather ---- */

static const layout_t ag_layouts[] = {
    {1, {0}},
    {2, {0, 1}},                                            /* every rank its own host */
    {2, {0, 0}},
    {3, {0, 0, 1}},
    {4, {0, 0, 1, 1}},
    {4, {0, 1, 0, 1}},                                      /* interleaved */
    {5, {0, 1, 1, 0, 1}},                                   /* uneven and interleaved */
    {5, {0, 1, 2, 3, 4}},
    {6, {0, 0, 1, 1, 2, 2}},
    {6, {0, 1, 1, 1, 2, 2}},                                /* a host with one rank */
    {7, {0, 0, 0, 0, 0, 0, 0}},                             /* one host */
    {7, {0, 1, 2, 0, 1, 2, 0}},
    {8, {0, 1, 0, 1, 0, 1, 0, 1}},
    {8, {3, 3, 1, 1, 1, 0, 2, 2}},                          /* host indices not in rank order */
    {9, {2, 2, 2, 0, 0, 0, 1, 1, 1}},
    {9, {0, 1, 2, 0, 1, 2, 0, 1, 2}},
    {16, {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}},
    {16, {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}},
    {16, {0, 0, 1, 1, 1, 1, 1, 1, 2, 3, 3, 3, 0, 0, 2, 2}}, /* runs of several lengths */
};

static uint8_t pattern(int r, size_t j, unsigned seed)
{
    unsigned h = ((unsigned)r * 2654435761u) ^ ((unsigned)j * 40503u) ^ seed;
    h ^= h >> 11;
    return (uint8_t)(h * 0x9e3779b1u >> 24);
}

/* A host's first rank leads it; the leaders form a ring in the order of their ranks. */
static int leader_of(const layout_t *l, int r)
{
    int q = 0;

    while (l->node_of[q] != l->node_of[r])
        q++;
    return q;
}

static int host_size(const layout_t *l, int r)
{
    int size = 0;

    for (int q = 0; q < l->n; q++)
        size += l->node_of[q] == l->node_of[r];
    return size;
}

/* The leader after leader r in the ring, r itself when there is one host. */
static int next_leader(const layout_t *l, int r)
{
    for (int k = 1; k <= l->n; k++) {
        int q = (r + k) % l->n;
        if (leader_of(l, q) == q)
            return q;
    }
    return r;
}

/*
 * Bytes per pair, from the plans (and, per rank, as the sim link counted them): leader r
 * sends the next leader every block but that host's, n - L(next) blocks, and nothing else
 * crosses hosts; inside host h the ranks send (L_h - 1) blocks up and (L_h - 1) n-block
 * results down, whether the broadcast is a tree or a chain.
 */
static void check_ag_bytes(const layout_t *l, hccl_plan_t **plans, const sim_result_t *out,
                           size_t bsz)
{
    uint64_t intra[16] = {0}, cross_total = 0;
    int nhosts = 0;

    for (int r = 0; r < l->n; r++) {
        uint64_t pair[16] = {0}, sent = 0;
        const hccl_plan_t *p = plans[r];

        nhosts += leader_of(l, r) == r;
        for (uint32_t i = 0; i < p->nsteps; i++)
            if (p->steps[i].kind == HCCL_STEP_SEND) {
                pair[p->steps[i].peer] += p->steps[i].bytes;
                sent += p->steps[i].bytes;
            }
        assert_int_equal(out->bytes_sent[r], sent);
        for (int q = 0; q < l->n; q++) {
            uint64_t want = 0;
            if (l->node_of[q] == l->node_of[r]) {
                intra[leader_of(l, r)] += pair[q];
                continue;
            }
            if (leader_of(l, r) == r && q == next_leader(l, r))
                want = (uint64_t)(l->n - host_size(l, q)) * bsz;
            if (pair[q] != want)
                fail_msg("hier allgather n=%d: rank %d sent rank %d (another host) %llu bytes, "
                         "want %llu", l->n, r, q, (unsigned long long)pair[q],
                         (unsigned long long)want);
            cross_total += pair[q];
        }
    }
    assert_int_equal(cross_total, (uint64_t)(nhosts - 1) * (uint64_t)l->n * bsz);
    for (int r = 0; r < l->n; r++)
        if (leader_of(l, r) == r) {
            uint64_t size = (uint64_t)host_size(l, r);
            assert_int_equal(intra[r], (size - 1) * ((uint64_t)l->n + 1) * bsz);
        }
}

static void run_allgather(const layout_t *l, size_t count, hcclDataType_t dt, bool in_place)
{
    hccl_tuner_t t = tuner_for(l);
    hccl_coll_shape_t shape = {HCCL_COLL_ALLGATHER, count, dt, hcclSum, -1, NULL};
    size_t bsz = count * hccl_dtype_size(dt), total = (size_t)l->n * bsz;
    unsigned seed = (unsigned)(count * 131 + (size_t)l->n * 17 + (size_t)dt);
    hccl_plan_t *plans[16] = {0};
    void *send[16], *recv[16];
    sim_result_t out;
    hcclResult_t res;

    for (int r = 0; r < l->n; r++) {
        plan_check_t c = {.name = "hier allgather",
                          .slots = in_place ? PLAN_SLOTS_SEND_IN_RECV : PLAN_SLOTS_APART,
                          .inner_off = (size_t)r * bsz,
                          .max_steps = 1500, /* the pairwise check is quadratic */
                          .unique_tags = true,
                          .self_copy_noop = true};

        assert_int_equal(hccl_algo_build(&t, HCCL_ALGO_HIER, r, l->n, &shape, &plans[r]),
                         hcclSuccess);
        if (bsz == 0)
            assert_int_equal(plans[r]->nsteps, 0); /* empty blocks: nothing on any rank */
        plan_check(plans[r], &c);
        check_cross_host(l, r, plans[r], -1);
        recv[r] = malloc(total + 1);
        memset(recv[r], 0xa5, total);
        send[r] = in_place ? (char *)recv[r] + (size_t)r * bsz : malloc(bsz + 1);
        for (size_t j = 0; j < bsz; j++)
            ((uint8_t *)send[r])[j] = pattern(r, j, seed);
    }
    res = sim_run_plans(l->n, plans, send, recv, &out);
    if (res != hcclSuccess)
        fail_msg("hier allgather n=%d count=%zu %s %s: result %d", l->n, count, hccl_dtype_name(dt),
                 in_place ? "in place" : "out of place", (int)res);
    for (int r = 0; r < l->n; r++)
        for (int b = 0; b < l->n; b++)
            for (size_t j = 0; j < bsz; j++)
                if (((uint8_t *)recv[r])[(size_t)b * bsz + j] != pattern(b, j, seed))
                    fail_msg("hier allgather n=%d count=%zu %s %s: rank %d block %d byte %zu wrong",
                             l->n, count, hccl_dtype_name(dt),
                             in_place ? "in place" : "out of place", r, b, j);
    check_ag_bytes(l, plans, &out, bsz);
    for (int r = 0; r < l->n; r++) {
        hccl_plan_release(plans[r]);
        if (!in_place)
            free(send[r]);
        free(recv[r]);
    }
}

static void test_allgather(void **state)
{
    /* 0, 1, primes, and one of several chunks per block (and many of the n-block result). */
    static const size_t counts[] = {0, 1, 13, 1031};
    static const hcclDataType_t dts[] = {hcclInt8, hcclFloat16, hcclInt32, hcclFloat64};

    (void)state;
    for (size_t k = 0; k < sizeof(ag_layouts) / sizeof(ag_layouts[0]); k++)
        for (int ip = 0; ip < 2; ip++) {
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
                for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++)
                    run_allgather(&ag_layouts[k], counts[c], dts[d], ip);
            run_allgather(&ag_layouts[k], 70001, hcclFloat32, ip);
        }
}

/* Every allocation of the build fails in turn, on a leader and on another rank: each failure
 * is hcclSystemError (and leaks nothing: the sanitizer build checks). */
static void test_allgather_alloc_sweep(void **state)
{
    const layout_t *l = &ag_layouts[15]; /* interleaved: a run per block */
    hccl_tuner_t t = tuner_for(l);
    hccl_coll_shape_t shape = {HCCL_COLL_ALLGATHER, 3000, hcclFloat32, hcclSum, -1, NULL};

    (void)state;
    for (int r = 0; r < 4; r += 3) { /* rank 0 leads host 0, rank 3 is in it */
        int failures = 0;
        hccl_plan_t *plan = NULL;
        for (long k = 1;; k++) {
            hcclResult_t res;
            hccl_alloc_fail_at(k);
            res = hccl_algo_build(&t, HCCL_ALGO_HIER, r, l->n, &shape, &plan);
            hccl_alloc_fail_at(0);
            if (res == hcclSuccess)
                break;
            assert_int_equal(res, hcclSystemError);
            failures++;
            assert_true(k < 100000);
        }
        assert_true(failures > 0);
        hccl_plan_release(plan);
    }
}

/* The tuner takes the two-level algorithms only when every host has several ranks. */
static void test_tuner(void **state)
{
    hccl_coll_shape_t ar = {HCCL_COLL_ALLREDUCE, 1 << 20, hcclFloat32, hcclSum, -1, NULL};
    hccl_coll_shape_t ag = {HCCL_COLL_ALLGATHER, 1, hcclFloat32, hcclSum, -1, NULL};
    hccl_tuner_t t;

    (void)state;
    t = tuner_for(&layouts[1]);
    assert_int_equal(hccl_tuner_pick(&t, &ar, 6), HCCL_ALGO_HIER);
    assert_int_equal(hccl_tuner_pick(&t, &ag, 6), HCCL_ALGO_HIER);
    ag.count = 1 << 20;
    assert_int_equal(hccl_tuner_pick(&t, &ag, 6), HCCL_ALGO_HIER);
    t = tuner_for(&layouts[4]); /* interleaved hosts too */
    assert_int_equal(hccl_tuner_pick(&t, &ag, 8), HCCL_ALGO_HIER);
    t = tuner_for(&layouts[3]);
    assert_int_not_equal(hccl_tuner_pick(&t, &ar, 6), HCCL_ALGO_HIER);
    assert_int_not_equal(hccl_tuner_pick(&t, &ag, 6), HCCL_ALGO_HIER);
    t = tuner_for(&layouts[5]);
    assert_int_not_equal(hccl_tuner_pick(&t, &ar, 7), HCCL_ALGO_HIER);
    assert_int_not_equal(hccl_tuner_pick(&t, &ag, 7), HCCL_ALGO_HIER);
    /* HCCL_ALGO can ask for it by name. */
    hccl_tuner_init(&t, "allgather=hier", 4u << 20);
    assert_int_equal(t.forced[HCCL_COLL_ALLGATHER], HCCL_ALGO_HIER);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_allgather),
        cmocka_unit_test(test_allgather_alloc_sweep),
        cmocka_unit_test(test_tuner),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
