/*
 * AllGather (ring, recursive doubling, Bruck) and ReduceScatter (ring, recursive halving)
 * generators over the sim link at 1-9, 16, 33 and 64 ranks, in place and out of place:
 * AllGather byte for byte, ReduceScatter for every dtype and op against a reference computed in
 * double. Every plan is also checked statically: tags unique per peer and direction, and every
 * two steps that touch the same bytes (one writing) ordered by the plan's edges, with the slots
 * aliased the way an in-place call binds them.
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
    hccl_coll_t coll;
    gen_fn_t fn;
    bool chunked;
} gen_t;

static const gen_t ag_ring = {"ring allgather", HCCL_COLL_ALLGATHER, hccl_algo_ring_allgather, 1};
static const gen_t ag_recdbl = {"recdbl allgather", HCCL_COLL_ALLGATHER,
                                hccl_algo_recdbl_allgather, 0};
static const gen_t ag_bruck = {"bruck allgather", HCCL_COLL_ALLGATHER, hccl_algo_bruck_allgather,
                               0};
static const gen_t rs_ring = {"ring reducescatter", HCCL_COLL_REDUCESCATTER,
                              hccl_algo_ring_reducescatter, 1};
static const gen_t rs_rechalv = {"rechalv reducescatter", HCCL_COLL_REDUCESCATTER,
                                 hccl_algo_rechalv_reducescatter, 0};

static const int rank_counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33, 64};
#define NRANK_COUNTS (sizeof(rank_counts) / sizeof(rank_counts[0]))

/* ---- static plan checks ---- */

/* In place, SEND sits inside RECV (AllGather) or RECV inside SEND (ReduceScatter) at the
 * rank's block, exactly as the caller's pointers alias. */
static void check_plan(const gen_t *g, const hccl_plan_t *p, size_t bsz, bool in_place)
{
    plan_check_t c = {.name = g->name,
                      .slots = !in_place                         ? PLAN_SLOTS_APART
                               : g->coll == HCCL_COLL_ALLGATHER ? PLAN_SLOTS_SEND_IN_RECV
                                                                 : PLAN_SLOTS_RECV_IN_SEND,
                      .inner_off = (size_t)p->rank * bsz,
                      .max_steps = 1500, /* the pairwise check is quadratic */
                      .unique_tags = true,
                      .self_copy_noop = true};

    plan_check(p, &c);
}

/* Builds and checks every rank's plan, then runs them. */
static hcclResult_t run_gen(const gen_t *g, int n, const hccl_coll_shape_t *shape, size_t chunk,
                            bool in_place, void **send, void **recv, sim_result_t *out)
{
    hccl_plan_t *plans[64] = {0};
    size_t bsz = shape->count * hccl_dtype_size(shape->dtype);
    hcclResult_t res;

    for (int r = 0; r < n; r++) {
        assert_int_equal(g->fn(r, n, shape, chunk, &plans[r]), hcclSuccess);
        if (bsz == 0)
            assert_int_equal(plans[r]->nsteps, 0); /* empty blocks: nothing on either side */
        check_plan(g, plans[r], bsz, in_place);
    }
    res = sim_run_plans(n, plans, send, recv, out);
    for (int r = 0; r < n; r++)
        hccl_plan_release(plans[r]);
    return res;
}

/* Bytes rank r sends: (n-1) blocks everywhere, but a folded even rank of recursive halving
 * hands all n blocks to its partner. */
static uint64_t want_bytes(const gen_t *g, int n, int r, size_t bsz)
{
    int pof2 = 1;

    while (pof2 * 2 <= n)
        pof2 *= 2;
    if (g == &rs_rechalv && r < 2 * (n - pof2) && r % 2 == 0)
        return (uint64_t)n * bsz;
    return (uint64_t)(n - 1) * bsz;
}

/* ---- AllGather ---- */

static uint8_t pattern(int r, size_t j, unsigned seed)
{
    unsigned h = ((unsigned)r * 2654435761u) ^ ((unsigned)j * 40503u) ^ seed;
    h ^= h >> 11;
    return (uint8_t)(h * 0x9e3779b1u >> 24);
}

static void check_allgather(const gen_t *g, int n, size_t count, hcclDataType_t dt, bool in_place,
                            size_t chunk)
{
    size_t esz = hccl_dtype_size(dt), bsz = count * esz;
    unsigned seed = (unsigned)(count * 131 + (size_t)n * 17 + (size_t)dt);
    hccl_coll_shape_t shape = {HCCL_COLL_ALLGATHER, count, dt, hcclSum, 0, NULL};
    void *send[64], *recv[64];
    sim_result_t out;
    hcclResult_t res;

    for (int r = 0; r < n; r++) {
        recv[r] = malloc((size_t)n * bsz + 1);
        memset(recv[r], 0xa5, (size_t)n * bsz);
        send[r] = in_place ? (char *)recv[r] + (size_t)r * bsz : malloc(bsz + 1);
        for (size_t j = 0; j < bsz; j++)
            ((uint8_t *)send[r])[j] = pattern(r, j, seed);
    }
    res = run_gen(g, n, &shape, chunk, in_place, send, recv, &out);
    if (res != hcclSuccess)
        fail_msg("%s n=%d count=%zu %s %s chunk=%zu: result %d", g->name, n, count,
                 hccl_dtype_name(dt), in_place ? "in-place" : "out-of-place", chunk, (int)res);
    for (int r = 0; r < n; r++) {
        for (int b = 0; b < n; b++)
            for (size_t j = 0; j < bsz; j++)
                if (((uint8_t *)recv[r])[(size_t)b * bsz + j] != pattern(b, j, seed))
                    fail_msg("%s n=%d count=%zu %s %s chunk=%zu: rank %d block %d byte %zu wrong",
                             g->name, n, count, hccl_dtype_name(dt),
                             in_place ? "in-place" : "out-of-place", chunk, r, b, j);
        assert_int_equal(out.bytes_sent[r], want_bytes(g, n, r, bsz));
    }
    for (int r = 0; r < n; r++) {
        if (!in_place)
            free(send[r]);
        free(recv[r]);
    }
}

/* ---- ReduceScatter ---- */

static void check_reducescatter(const gen_t *g, int n, size_t count, hcclDataType_t dt,
                                hcclRedOp_t op, bool in_place, size_t chunk)
{
    size_t esz = hccl_dtype_size(dt), bsz = count * esz, total = (size_t)n * count;
    unsigned seed = (unsigned)(count * 31 + (size_t)dt * 7 + (size_t)op + (size_t)n * 1009);
    hccl_coll_shape_t shape = {HCCL_COLL_REDUCESCATTER, count, dt, op, 0, NULL};
    void *send[64], *recv[64];
    sim_result_t out;
    hcclResult_t res;

    for (int r = 0; r < n; r++) {
        send[r] = malloc(total * esz + 1);
        recv[r] = in_place ? (char *)send[r] + (size_t)r * bsz : malloc(bsz + 1);
        for (size_t i = 0; i < total; i++)
            ref_store(send[r], i, dt, ref_input(dt, op, r, i, seed));
    }
    res = run_gen(g, n, &shape, chunk, in_place, send, recv, &out);
    if (res != hcclSuccess)
        fail_msg("%s n=%d count=%zu %s %s %s chunk=%zu: result %d", g->name, n, count,
                 hccl_dtype_name(dt), hccl_op_name(op), in_place ? "in-place" : "out-of-place",
                 chunk, (int)res);
    for (int r = 0; r < n; r++) {
        for (size_t i = 0; i < count; i++) {
            double want = ref_reduce(dt, op, n, (size_t)r * count + i, seed);
            double got = ref_load(recv[r], i, dt);
            bool ok = ref_close(dt, got, want);
            if (!ok)
                fail_msg("%s n=%d count=%zu %s %s %s chunk=%zu: rank %d element %zu is %.17g, "
                         "want %.17g", g->name, n, count, hccl_dtype_name(dt), hccl_op_name(op),
                         in_place ? "in-place" : "out-of-place", chunk, r, i, got, want);
        }
        assert_int_equal(out.bytes_sent[r], want_bytes(g, n, r, bsz));
    }
    for (int r = 0; r < n; r++) {
        if (!in_place)
            free(recv[r]);
        free(send[r]);
    }
}

/* ---- matrices ---- */

/* Counts per rank count: 0, 1, a prime, one that n does not divide, and one over 4 KiB in
 * most types (several 4 KiB chunks); fewer and smaller at 33 and 64 ranks. */
static size_t counts_for(int n, size_t *counts)
{
    if (n > 16) {
        counts[0] = 0, counts[1] = 1, counts[2] = 7, counts[3] = 67;
        return 4;
    }
    counts[0] = 0, counts[1] = 1, counts[2] = 13, counts[3] = (size_t)n * 37 + 1,
    counts[4] = 1031;
    return 5;
}

/* Chunk sizes only matter for the chunked generators, and only once a block exceeds 4 KiB. */
static size_t chunks_for(const gen_t *g, size_t bsz, size_t *chunks)
{
    chunks[0] = 4096;
    chunks[1] = 1u << 20;
    return g->chunked && bsz > 4096 ? 2 : 1;
}

static void allgather_matrix(const gen_t *g)
{
    static const hcclDataType_t dts[] = {hcclInt8, hcclFloat16, hcclFloat32, hcclFloat64};

    for (size_t k = 0; k < NRANK_COUNTS; k++) {
        int n = rank_counts[k];
        size_t counts[5], nc = counts_for(n, counts);
        for (size_t c = 0; c < nc; c++)
            for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
                size_t chunks[2], nch = chunks_for(g, counts[c] * hccl_dtype_size(dts[d]), chunks);
                for (size_t ch = 0; ch < nch; ch++)
                    for (int ip = 0; ip < 2; ip++)
                        check_allgather(g, n, counts[c], dts[d], ip, chunks[ch]);
            }
    }
    /* Large blocks: many 4 KiB chunks in flight at once, or a few 1 MiB ones. */
    check_allgather(g, 3, (1u << 18) + 3, hcclFloat32, false, 4096);
    check_allgather(g, 8, (1u << 18), hcclInt8, true, 4096);
    check_allgather(g, 5, (1u << 19) + 1, hcclFloat64, true, 1u << 20);
}

static void reducescatter_matrix(const gen_t *g)
{
    for (size_t k = 0; k < NRANK_COUNTS; k++) {
        int n = rank_counts[k];
        size_t counts[5], nc = counts_for(n, counts);
        for (size_t c = 0; c < nc; c++)
            for (int dt = 0; dt < hcclNumTypes; dt++) {
                size_t chunks[2];
                size_t nch = chunks_for(g, counts[c] * hccl_dtype_size((hcclDataType_t)dt), chunks);
                for (int op = 0; op < hcclNumOps; op++)
                    for (size_t ch = 0; ch < nch; ch++)
                        for (int ip = 0; ip < 2; ip++)
                            check_reducescatter(g, n, counts[c], (hcclDataType_t)dt,
                                                (hcclRedOp_t)op, ip, chunks[ch]);
            }
    }
    check_reducescatter(g, 3, (1u << 17) + 3, hcclFloat32, hcclSum, false, 4096);
    check_reducescatter(g, 8, (1u << 16), hcclInt32, hcclAvg, true, 4096);
    check_reducescatter(g, 5, (1u << 18) + 1, hcclBfloat16, hcclMax, true, 1u << 20);
}

/* Every rank count up to 64 once: each fold and Bruck shape, deadlock-free and hazard-free. */
static void all_rank_counts(const gen_t *g)
{
    for (int n = 1; n <= 64; n++)
        for (int ip = 0; ip < 2; ip++) {
            if (g->coll == HCCL_COLL_ALLGATHER)
                check_allgather(g, n, 3, hcclInt32, ip, 4);
            else
                check_reducescatter(g, n, 3, hcclInt32, hcclSum, ip, 4);
        }
}

#define GEN_TESTS(id, gen, matrix)                                                              \
    static void test_##id(void **state)                                                        \
    {                                                                                           \
        (void)state;                                                                            \
        matrix(&gen);                                                                           \
    }                                                                                           \
    static void test_##id##_all_ranks(void **state)                                            \
    {                                                                                           \
        (void)state;                                                                            \
        all_rank_counts(&gen);                                                                  \
    }

GEN_TESTS(ring_allgather, ag_ring, allgather_matrix)
GEN_TESTS(recdbl_allgather, ag_recdbl, allgather_matrix)
GEN_TESTS(bruck_allgather, ag_bruck, allgather_matrix)
GEN_TESTS(ring_reducescatter, rs_ring, reducescatter_matrix)
GEN_TESTS(rechalv_reducescatter, rs_rechalv, reducescatter_matrix)

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_allgather),
        cmocka_unit_test(test_ring_allgather_all_ranks),
        cmocka_unit_test(test_recdbl_allgather),
        cmocka_unit_test(test_recdbl_allgather_all_ranks),
        cmocka_unit_test(test_bruck_allgather),
        cmocka_unit_test(test_bruck_allgather_all_ranks),
        cmocka_unit_test(test_ring_reducescatter),
        cmocka_unit_test(test_ring_reducescatter_all_ranks),
        cmocka_unit_test(test_rechalv_reducescatter),
        cmocka_unit_test(test_rechalv_reducescatter_all_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
