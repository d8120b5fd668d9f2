/*
 * AllReduce algorithms over the sim link at 1-9 and 16 ranks: every dtype and
 * op, in-place and out-of-place, counts that do and do not divide by the rank
 * count, against a reference computed in double (integers exactly, with wrap).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reference.h"
#include "sim_run.h"

static const int rank_counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};

static void check_allreduce(hccl_algo_t algo, int n, size_t count, hcclDataType_t dt,
                            hcclRedOp_t op, bool in_place)
{
    size_t esz = hccl_dtype_size(dt);
    void *send[64], *recv[64];
    unsigned seed = (unsigned)(count * 31 + (size_t)dt * 7 + (size_t)op);
    hccl_coll_shape_t shape = {HCCL_COLL_ALLREDUCE, count, dt, op, 0, NULL};
    sim_result_t out;
    hcclResult_t res;

    for (int r = 0; r < n; r++) {
        send[r] = malloc(count * esz + 1);
        recv[r] = in_place ? send[r] : malloc(count * esz + 1);
        for (size_t i = 0; i < count; i++)
            ref_store(send[r], i, dt, ref_input(dt, op, r, i, seed));
    }
    res = sim_run_allreduce(algo, n, &shape, send, recv, &out);
    if (res != hcclSuccess)
        fail_msg("%s n=%d count=%zu %s %s %s: result %d", hccl_algo_name(algo), n, count,
                 hccl_dtype_name(dt), hccl_op_name(op), in_place ? "in-place" : "out-of-place",
                 (int)res);
    for (int r = 0; r < n; r++) {
        for (size_t i = 0; i < count; i++) {
            double want = ref_reduce(dt, op, n, i, seed), got = ref_load(recv[r], i, dt);
            bool ok = ref_close(dt, got, want);
            if (!ok)
                fail_msg("%s n=%d count=%zu %s %s %s: rank %d element %zu is %.17g, want %.17g",
                         hccl_algo_name(algo), n, count, hccl_dtype_name(dt), hccl_op_name(op),
                         in_place ? "in-place" : "out-of-place", r, i, got, want);
        }
    }
    /* Ring: every block but one crosses each link twice, so 2(n-1)/n of the buffer per rank. */
    if (algo == HCCL_ALGO_RING && n > 1) {
        for (int r = 0; r < n; r++) {
            size_t f, l1, l2;
            hccl_algo_block(count, n, (r + 1) % n, &f, &l1);
            hccl_algo_block(count, n, (r + 2) % n, &f, &l2);
            assert_int_equal(out.bytes_sent[r], (2 * count - l1 - l2) * esz);
        }
    }
    for (int r = 0; r < n; r++) {
        free(send[r]);
        if (!in_place)
            free(recv[r]);
    }
}

static void run_matrix(hccl_algo_t algo)
{
    for (size_t k = 0; k < sizeof(rank_counts) / sizeof(rank_counts[0]); k++) {
        int n = rank_counts[k];
        /* Fixed ones, plus two drawn from a seeded generator (printed on failure with the rest). */
        unsigned seed = 12345u + (unsigned)n;
        size_t counts[] = {1, (size_t)n - 1, 13, 1031, (size_t)n * 600 + 3, 0, 0};
        for (int j = 5; j < 7; j++) {
            seed = seed * 1103515245u + 12345u;
            counts[j] = 1 + (seed >> 8) % 5000;
        }
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            if (counts[c] == 0)
                continue;
            for (int dt = 0; dt < hcclNumTypes; dt++)
                for (int op = 0; op < hcclNumOps; op++)
                    for (int ip = 0; ip < 2; ip++)
                        check_allreduce(algo, n, counts[c], (hcclDataType_t)dt, (hcclRedOp_t)op,
                                        ip);
        }
    }
}

/* 33 and 64 ranks: fewer counts, dtypes and ops, so that the run stays short. */
static void run_many_ranks(hccl_algo_t algo)
{
    static const int big[] = {33, 64};
    static const hcclDataType_t dts[] = {hcclInt32, hcclFloat16, hcclFloat64};
    static const hcclRedOp_t ops[] = {hcclSum, hcclMax, hcclAvg};

    for (size_t k = 0; k < sizeof(big) / sizeof(big[0]); k++) {
        int n = big[k];
        size_t counts[] = {1, (size_t)n - 1, (size_t)n + 2, 1031};
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++)
                for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++)
                    check_allreduce(algo, n, counts[c], dts[d], ops[o], (c + o) % 2 == 0);
    }
}

static void test_ring(void **state)
{
    (void)state;
    run_matrix(HCCL_ALGO_RING);
    run_many_ranks(HCCL_ALGO_RING);
}

static void test_recdbl(void **state)
{
    (void)state;
    run_matrix(HCCL_ALGO_RECDBL);
    run_many_ranks(HCCL_ALGO_RECDBL);
}

/* Recursive doubling sends log2(p) whole buffers; folded ranks one more each way. */
static void test_recdbl_bytes(void **state)
{
    (void)state;
    for (int n = 2; n <= 16; n++) {
        size_t count = 100;
        float *send[64], *recv[64];
        hccl_coll_shape_t shape = {HCCL_COLL_ALLREDUCE, count, hcclFloat32, hcclSum, 0, NULL};
        sim_result_t out;
        int pof2 = 1, logp = 0;
        while (pof2 * 2 <= n) {
            pof2 *= 2;
            logp++;
        }
        for (int r = 0; r < n; r++) {
            send[r] = calloc(count, sizeof(float));
            recv[r] = calloc(count, sizeof(float));
        }
        assert_int_equal(sim_run_allreduce(HCCL_ALGO_RECDBL, n, &shape, (void **)send,
                                           (void **)recv, &out), hcclSuccess);
        for (int r = 0; r < n; r++) {
            bool folded = r < 2 * (n - pof2);
            uint64_t rounds = folded ? (r % 2 == 0 ? 1 : (uint64_t)logp + 1) : (uint64_t)logp;
            uint64_t want = count * sizeof(float) * rounds;
            assert_int_equal(out.bytes_sent[r], want);
            free(send[r]);
            free(recv[r]);
        }
    }
}

/* Large buffer, many chunks: pipelining with the 4 KiB chunks of the harness. */
static void test_ring_large(void **state)
{
    (void)state;
    check_allreduce(HCCL_ALGO_RING, 5, (1u << 20) + 7, hcclFloat32, hcclSum, false);
    check_allreduce(HCCL_ALGO_RING, 8, (1u << 20), hcclInt32, hcclSum, true);
}

/* Over store_min, a plan that reduces still stores as usual (streaming measured slower there):
 * none of its receives streams (a rank whose plan only sends its block and receives the result,
 * as a folded rank of recdbl, may), and the results are the same bits as under it. */
static void check_store_same(hccl_algo_t algo, int n, size_t count, hcclDataType_t dt, hcclRedOp_t op,
                             bool in_place)
{
    size_t esz = hccl_dtype_size(dt);
    void *send[64], *recv[64], *want[64];
    hccl_coll_shape_t shape = {HCCL_COLL_ALLREDUCE, count, dt, op, 0, NULL};
    sim_result_t out;

    for (int pass = 0; pass < 2; pass++) {
        for (int r = 0; r < n; r++) {
            send[r] = malloc(count * esz + 16);
            recv[r] = in_place ? send[r] : malloc(count * esz + 16);
            for (size_t i = 0; i < count; i++)
                ref_store(send[r], i, dt, ref_input(dt, op, r, i, 99));
        }
        sim_run_set_store_min(pass == 0 ? 0 : 1);
        assert_int_equal(sim_run_allreduce(algo, n, &shape, send, recv, &out), hcclSuccess);
        int reducing = 0;
        for (int r = 0; r < n; r++)
            reducing += out.nreduces[r] > 0;
        assert_true(reducing > 0);
        for (int r = 0; r < n; r++) {
            if (out.nreduces[r] > 0 && out.bytes_stored[r] != 0)
                fail_msg("%s n=%d count=%zu: rank %d streamed %llu bytes in a plan that reduces",
                         hccl_algo_name(algo), n, count, r, (unsigned long long)out.bytes_stored[r]);
            if (pass == 0) {
                want[r] = recv[r];
            } else {
                if (memcmp(recv[r], want[r], count * esz) != 0)
                    fail_msg("%s n=%d count=%zu %s %s %s: rank %d differs when stored past the cache",
                             hccl_algo_name(algo), n, count, hccl_dtype_name(dt), hccl_op_name(op),
                             in_place ? "in-place" : "out-of-place", r);
                free(want[r]);
                free(recv[r]);
            }
            if (!in_place)
                free(send[r]);
        }
    }
    sim_run_set_store_min(0);
}

static void test_reduce_plans_store_plainly(void **state)
{
    static const hccl_algo_t algos[] = {HCCL_ALGO_RING, HCCL_ALGO_RECDBL, HCCL_ALGO_RABENSEIFNER,
                                        HCCL_ALGO_TREE};
    static const int ns[] = {2, 3, 4, 5, 8};
    static const hcclDataType_t dts[] = {hcclFloat32, hcclFloat64, hcclInt32, hcclBfloat16};
    static const hcclRedOp_t ops[] = {hcclSum, hcclAvg, hcclMax};

    (void)state;
    for (size_t a = 0; a < sizeof(algos) / sizeof(algos[0]); a++)
        for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++)
            for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++)
                for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
                    size_t count = 20011 + (size_t)k;
                    check_store_same(algos[a], ns[k], count, dts[d], ops[o], (d + o) % 2 == 0);
                }
    /* And against the reference. */
    sim_run_set_store_min(1);
    check_allreduce(HCCL_ALGO_RING, 3, 100003, hcclFloat32, hcclSum, false);
    check_allreduce(HCCL_ALGO_RECDBL, 4, 100003, hcclFloat64, hcclAvg, true);
    sim_run_set_store_min(0);
}

/* Runs shape on n ranks (recv of n * count elements, in place if asked) with store_min; out. */
static void run_stored(hccl_algo_t algo, int n, hccl_coll_shape_t shape, size_t recv_count, bool in_place,
                       size_t store_min, sim_result_t *out)
{
    size_t esz = hccl_dtype_size(shape.dtype);
    void *send[8], *recv[8];

    for (int r = 0; r < n; r++) {
        recv[r] = calloc(recv_count, esz);
        size_t send_count = shape.coll == HCCL_COLL_ALLTOALL ? recv_count : shape.count;
        send[r] = in_place ? (char *)recv[r] + (shape.coll == HCCL_COLL_ALLGATHER ? r * shape.count * esz : 0)
                           : calloc(send_count, esz);
    }
    sim_run_set_store_min(store_min);
    assert_int_equal(sim_run_allreduce(algo, n, &shape, send, recv, out), hcclSuccess);
    sim_run_set_store_min(0);
    for (int r = 0; r < n; r++) {
        if (!in_place)
            free(send[r]);
        free(recv[r]);
    }
}

/* Every one of n per-rank counts is want. */
static void assert_each(const uint64_t *counts, int n, uint64_t want)
{
    for (int r = 0; r < n; r++)
        assert_int_equal(counts[r], want);
}

/*
 * Which receives stream: those whose bytes are final (AllGather at 2 ranks, the last step of its
 * ring at 3), not in a plan that reduces (not even the all-gather half of a 2-rank ring
 * AllReduce), not those sent on (the first step at 3 ranks), not where a rank only receives
 * (Broadcast), not under the threshold, where the send buffer in place is counted once.
 */
static void test_store_which_receives(void **state)
{
    const size_t c = 3000, esz = sizeof(float);
    hccl_coll_shape_t ag = {HCCL_COLL_ALLGATHER, c, hcclFloat32, hcclSum, 0, NULL};
    hccl_coll_shape_t ar = {HCCL_COLL_ALLREDUCE, 2 * c, hcclFloat32, hcclSum, 0, NULL};
    hccl_coll_shape_t bc = {HCCL_COLL_BROADCAST, c, hcclFloat32, hcclSum, 0, NULL};
    sim_result_t out;

    (void)state;
    run_stored(HCCL_ALGO_RING, 2, ag, 2 * c, false, 1, &out);
    assert_each(out.bytes_stored, 2, c * esz);
    run_stored(HCCL_ALGO_RING, 3, ag, 3 * c, false, 1, &out);
    assert_each(out.bytes_stored, 3, c * esz); /* of the two blocks received, the last */
    run_stored(HCCL_ALGO_RING, 2, ar, 2 * c, false, 1, &out);
    assert_each(out.bytes_stored, 2, 0); /* none: the plan reduces */
    run_stored(HCCL_ALGO_TREE, 2, bc, c, false, 1, &out);
    assert_int_equal(out.bytes_stored[0] + out.bytes_stored[1], 0);
    /* Over the threshold only with the send buffer counted: out of place, not in place. */
    run_stored(HCCL_ALGO_RING, 2, ag, 2 * c, false, 2 * c * esz, &out);
    assert_int_equal(out.bytes_stored[0], c * esz);
    run_stored(HCCL_ALGO_RING, 2, ag, 2 * c, true, 2 * c * esz, &out);
    assert_int_equal(out.bytes_stored[0] + out.bytes_stored[1], 0);
    run_stored(HCCL_ALGO_RING, 2, ag, 2 * c, false, 0, &out);
    assert_int_equal(out.bytes_stored[0] + out.bytes_stored[1], 0);
}

/*
 * Which receives read offers single-copy (read_direct): where the rank sends as it receives
 * (AllGather, AlltoAll, AllReduce, its reducing receives included), out of place at any size,
 * in place from 1 MiB, but not the blocks sent on (the first step of a 3-rank ring), nor where
 * a rank only receives (Broadcast).
 */
static void test_read_direct_which_receives(void **state)
{
    const size_t c = 3000, esz = sizeof(float);
    hccl_coll_shape_t ag = {HCCL_COLL_ALLGATHER, c, hcclFloat32, hcclSum, 0, NULL};
    hccl_coll_shape_t a2a = {HCCL_COLL_ALLTOALL, c, hcclFloat32, hcclSum, 0, NULL};
    hccl_coll_shape_t ar = {HCCL_COLL_ALLREDUCE, 2 * c, hcclFloat32, hcclSum, 0, NULL};
    hccl_coll_shape_t bc = {HCCL_COLL_BROADCAST, c, hcclFloat32, hcclSum, 0, NULL};
    const size_t big = (1u << 20) / 2 / sizeof(float); /* a 1 MiB AllReduce's half */
    hccl_coll_shape_t ar_mib = {HCCL_COLL_ALLREDUCE, 2 * big, hcclFloat32, hcclSum, 0, NULL};
    sim_result_t out;

    (void)state;
    run_stored(HCCL_ALGO_RING, 2, ag, 2 * c, false, 0, &out);
    assert_each(out.bytes_read_direct, 2, c * esz);
    run_stored(HCCL_ALGO_RING, 3, ag, 3 * c, false, 0, &out);
    assert_each(out.bytes_read_direct, 3, c * esz); /* the last of two blocks */
    run_stored(HCCL_ALGO_PAIRWISE, 2, a2a, 2 * c, false, 0, &out);
    assert_each(out.bytes_read_direct, 2, c * esz);
    run_stored(HCCL_ALGO_RING, 2, ar, 2 * c, false, 0, &out);
    assert_each(out.bytes_read_direct, 2, 2 * c * esz); /* the half reduced, then the other */
    /* In place, below 1 MiB: the link's timed choice. */
    run_stored(HCCL_ALGO_RING, 2, ar, 2 * c, true, 0, &out);
    assert_each(out.bytes_read_direct, 2, 0);
    run_stored(HCCL_ALGO_RING, 2, ar_mib, 2 * big, true, 0, &out);
    assert_each(out.bytes_read_direct, 2, 2 * big * esz);
    run_stored(HCCL_ALGO_TREE, 2, bc, c, false, 0, &out);
    assert_each(out.bytes_read_direct, 2, 0);
}

static int reset_store_min(void **state)
{
    (void)state;
    sim_run_set_store_min(0);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring),
        cmocka_unit_test(test_recdbl),
        cmocka_unit_test(test_recdbl_bytes),
        cmocka_unit_test(test_ring_large),
        cmocka_unit_test_teardown(test_reduce_plans_store_plainly, reset_store_min),
        cmocka_unit_test_teardown(test_store_which_receives, reset_store_min),
        cmocka_unit_test_teardown(test_read_direct_which_receives, reset_store_min),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
