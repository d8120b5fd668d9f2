/*
 * The Rabenseifner and binomial-tree AllReduce generators over the sim link at 1-9, 16, 33
 * and 64 ranks (and once at every rank count up to 64), in place and out of place, against a
 * reference computed in double: every dtype and op up to 16 ranks, a few at 33 and 64. Each
 * rank's bytes sent are checked against the algorithm's formula, and every plan statically:
 * tags unique per peer and direction, every two steps that touch the same bytes (one writing)
 * ordered by the plan's edges with the slots aliased as an in-place call binds them, and, for
 * the tree, no broadcast of chunk c waiting on a later chunk (the phases pipeline).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "plan_check.h"
#include "reference.h"
#include "sim_run.h"

typedef hcclResult_t (*gen_fn_t)(int rank, int nranks, const hccl_coll_shape_t *shape,
                                 size_t chunk_bytes, hccl_plan_t **plan_p);
typedef struct {
    const char *name;
    gen_fn_t fn;
    bool chunked;
} gen_t;

static const gen_t gen_rab = {"rabenseifner", hccl_algo_rabenseifner_allreduce, 0};
static const gen_t gen_tree = {"tree", hccl_algo_tree_allreduce, 1};

static const int rank_counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33, 64};
#define NRANK_COUNTS (sizeof(rank_counts) / sizeof(rank_counts[0]))

/* ---- static plan checks ---- */

/* nch > 0: the tree's chunk count (reduce tag c, broadcast tag nch + c). In place, SEND and
 * RECV are the same memory. */
static void check_plan(const gen_t *g, const hccl_plan_t *p, bool in_place, uint32_t nch)
{
    plan_check_t c = {.name = g->name,
                      .slots = in_place ? PLAN_SLOTS_SAME : PLAN_SLOTS_APART,
                      .max_steps = 1500, /* the pairwise check is quadratic */
                      .unique_tags = true,
                      .nonempty_steps = true, /* no empty transfers or reduces */
                      .self_copy_noop = true,
                      .pipeline_nch = nch};

    plan_check(p, &c);
}

/* ---- expected bytes ---- */

static int pof2_of(int n)
{
    int p = 1;

    while (p * 2 <= n)
        p *= 2;
    return p;
}

/* Elements in blocks [b, b + m) of p blocks over count. */
static size_t blocks_len(size_t count, int p, int b, int m)
{
    size_t f0, f1, len;

    hccl_algo_block(count, p, b, &f0, &len);
    hccl_algo_block(count, p, b + m, &f1, &len);
    return f1 - f0;
}

/*
 * Rabenseifner: a participant v sends every block but its own in the reduce-scatter and, in
 * the all-gather, its group of 1, 2, ..., p/2 blocks; a folded pair sends the buffer once
 * more each (the even rank only that).
 */
static uint64_t rab_bytes(int n, int r, size_t count, size_t esz)
{
    int p = pof2_of(n), rem = n - p, v = r < 2 * rem ? r / 2 : r - rem;
    uint64_t elems = 0;

    if (n == 1)
        return 0;
    if (r < 2 * rem && r % 2 == 0)
        return count * esz;
    elems = count - blocks_len(count, p, v, 1);
    for (int m = 1; m < p; m *= 2)
        elems += blocks_len(count, p, v & ~(m - 1), m);
    if (r < 2 * rem)
        elems += count;
    return elems * esz;
}

/* Tree: the buffer once up (not the root) and once to each child. */
static uint64_t tree_bytes(int n, int r, size_t count, size_t esz)
{
    int span = r > 0 ? (r & -r) : 2 * n, kids = 0;

    for (int m = 1; m < span && r + m < n; m *= 2)
        kids++;
    return (uint64_t)((r > 0) + kids) * count * esz;
}

/* The tree's chunk count, as the generator cuts the buffer. */
static uint32_t tree_nch(size_t count, size_t esz, size_t chunk)
{
    size_t ce = chunk / esz ? chunk / esz : 1, min = (count + 65535) / 65536;

    if (ce < min)
        ce = min;
    return (uint32_t)((count + ce - 1) / ce);
}

/* ---- one run ---- */

static void check_allreduce(const gen_t *g, int n, size_t count, hcclDataType_t dt,
                            hcclRedOp_t op, bool in_place, size_t chunk)
{
    size_t esz = hccl_dtype_size(dt), bytes = count * esz;
    unsigned seed = (unsigned)(count * 31 + (size_t)dt * 7 + (size_t)op + (size_t)n * 1009);
    hccl_coll_shape_t shape = {HCCL_COLL_ALLREDUCE, count, dt, op, 0, NULL};
    hccl_plan_t *plans[64] = {0};
    void *send[64], *recv[64];
    uint64_t total = 0;
    sim_result_t out;
    hcclResult_t res;

    for (int r = 0; r < n; r++) {
        send[r] = malloc(bytes + 1);
        recv[r] = in_place ? send[r] : malloc(bytes + 1);
        for (size_t i = 0; i < count; i++)
            ref_store(send[r], i, dt, ref_input(dt, op, r, i, seed));
        if (!in_place)
            memset(recv[r], 0x5a, bytes);
    }
    for (int r = 0; r < n; r++) {
        assert_int_equal(g->fn(r, n, &shape, chunk, &plans[r]), hcclSuccess);
        if (bytes == 0)
            assert_int_equal(plans[r]->nsteps, 0);
        /* Plans differ across ops only in the divide flag: one op's plans stand for all. */
        if (op == hcclSum || n > 16)
            check_plan(g, plans[r], in_place, g == &gen_tree ? tree_nch(count, esz, chunk) : 0);
    }
    res = sim_run_plans(n, plans, send, recv, &out);
    for (int r = 0; r < n; r++)
        hccl_plan_release(plans[r]);
    if (res != hcclSuccess)
        fail_msg("%s n=%d count=%zu %s %s %s chunk=%zu: result %d", g->name, n, count,
                 hccl_dtype_name(dt), hccl_op_name(op), in_place ? "in-place" : "out-of-place",
                 chunk, (int)res);
    for (int r = 0; r < n; r++) {
        uint64_t want_b = g == &gen_rab ? rab_bytes(n, r, count, esz) : tree_bytes(n, r, count, esz);
        for (size_t i = 0; i < count; i++) {
            double want = ref_reduce(dt, op, n, i, seed), got = ref_load(recv[r], i, dt);
            bool ok = ref_close(dt, got, want);
            if (!ok)
                fail_msg("%s n=%d count=%zu %s %s %s chunk=%zu: rank %d element %zu is %.17g, "
                         "want %.17g", g->name, n, count, hccl_dtype_name(dt), hccl_op_name(op),
                         in_place ? "in-place" : "out-of-place", chunk, r, i, got, want);
        }
        if (out.bytes_sent[r] != want_b)
            fail_msg("%s n=%d count=%zu %s: rank %d sent %llu bytes, want %llu", g->name, n, count,
                     hccl_dtype_name(dt), r, (unsigned long long)out.bytes_sent[r],
                     (unsigned long long)want_b);
        total += out.bytes_sent[r];
    }
    /* Rabenseifner on a power of two: 2(n-1)/n of the buffer per rank where n divides count,
     * 2(n-1) buffers over all ranks always; a fold costs a buffer each way per pair. */
    if (g == &gen_rab && n > 1) {
        int p = pof2_of(n);
        assert_int_equal(total, (uint64_t)(2 * (p - 1) + 2 * (n - p)) * bytes);
        if (p == n && count % (size_t)n == 0)
            for (int r = 0; r < n; r++)
                assert_int_equal(out.bytes_sent[r], 2 * (uint64_t)(n - 1) * bytes / (uint64_t)n);
    }
    for (int r = 0; r < n; r++) {
        free(send[r]);
        if (!in_place)
            free(recv[r]);
    }
}

/* ---- matrices ---- */

/* Counts per rank count: 0, 1, a prime, one that n does not divide, one n divides, and one
 * over 4 KiB in most types; fewer and smaller at 33 and 64 ranks. */
static size_t counts_for(int n, size_t *counts)
{
    if (n > 16) {
        counts[0] = 0, counts[1] = 1, counts[2] = 7, counts[3] = (size_t)n + 2;
        return 4;
    }
    counts[0] = 0, counts[1] = 1, counts[2] = 13, counts[3] = (size_t)n * 37 + 1,
    counts[4] = (size_t)n * 8, counts[5] = 1031;
    return 6;
}

/* The tree's chunks: the harness's 4 KiB, and 64 bytes so that small buffers pipeline too. */
static size_t chunks_for(const gen_t *g, size_t *chunks)
{
    chunks[0] = 4096;
    chunks[1] = 64;
    return g->chunked ? 2 : 1;
}

static void matrix(const gen_t *g)
{
    static const hcclDataType_t big_dts[] = {hcclInt32, hcclFloat16, hcclFloat64};

    for (size_t k = 0; k < NRANK_COUNTS; k++) {
        int n = rank_counts[k];
        size_t counts[6], nc = counts_for(n, counts), chunks[2], nch = chunks_for(g, chunks);
        for (size_t c = 0; c < nc; c++)
            for (size_t ch = 0; ch < nch; ch++)
                for (int ip = 0; ip < 2; ip++) {
                    if (chunks[ch] < 4096 && counts[c] > 1000)
                        continue; /* 4 KiB chunks already cut it; hundreds more add nothing */
                    if (n > 16) { /* a few types and ops: the shapes matter here */
                        for (size_t d = 0; d < sizeof(big_dts) / sizeof(big_dts[0]); d++)
                            check_allreduce(g, n, counts[c], big_dts[d],
                                            d == 0 ? hcclSum : d == 1 ? hcclAvg : hcclMax, ip,
                                            chunks[ch]);
                        continue;
                    }
                    for (int dt = 0; dt < hcclNumTypes; dt++)
                        for (int op = 0; op < hcclNumOps; op++)
                            check_allreduce(g, n, counts[c], (hcclDataType_t)dt, (hcclRedOp_t)op,
                                            ip, chunks[ch]);
                }
    }
}

/* Every rank count up to 64 once: each fold and tree shape, deadlock-free and hazard-free. */
static void all_rank_counts(const gen_t *g)
{
    for (int n = 1; n <= 64; n++)
        for (int ip = 0; ip < 2; ip++) {
            check_allreduce(g, n, 3, hcclInt32, hcclSum, ip, 4);
            check_allreduce(g, n, 100, hcclFloat32, hcclAvg, ip, 64);
        }
}

static void test_rabenseifner(void **state)
{
    (void)state;
    matrix(&gen_rab);
}

static void test_rabenseifner_all_ranks(void **state)
{
    (void)state;
    all_rank_counts(&gen_rab);
}

static void test_rabenseifner_large(void **state)
{
    (void)state;
    check_allreduce(&gen_rab, 5, (1u << 18) + 7, hcclFloat32, hcclSum, false, 4096);
    check_allreduce(&gen_rab, 8, 1u << 18, hcclInt32, hcclAvg, true, 4096);
    check_allreduce(&gen_rab, 16, (1u << 17) + 1, hcclBfloat16, hcclMax, true, 4096);
}

static void test_tree(void **state)
{
    (void)state;
    matrix(&gen_tree);
}

static void test_tree_all_ranks(void **state)
{
    (void)state;
    all_rank_counts(&gen_tree);
}

/* Many chunks in flight, and a buffer so large for its chunk size that the chunk cap applies. */
static void test_tree_large(void **state)
{
    (void)state;
    check_allreduce(&gen_tree, 6, (1u << 18) + 3, hcclFloat32, hcclSum, false, 4096);
    check_allreduce(&gen_tree, 16, 1u << 17, hcclInt32, hcclAvg, true, 4096);
    check_allreduce(&gen_tree, 3, (1u << 17) + 5, hcclInt32, hcclSum, true, 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rabenseifner),
        cmocka_unit_test(test_rabenseifner_all_ranks),
        cmocka_unit_test(test_rabenseifner_large),
        cmocka_unit_test(test_tree),
        cmocka_unit_test(test_tree_all_ranks),
        cmocka_unit_test(test_tree_large),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
