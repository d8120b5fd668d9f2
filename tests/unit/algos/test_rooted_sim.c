/*
 * Rooted collectives over the sim link: binomial-tree, chain and scatter+allgather
 * Broadcast, binomial-tree and chain Reduce, at 1-9, 16, 33 and 64 ranks, roots 0, n-1 and
 * one in the middle, counts from 0 to 300000 and several chunk sizes. Reduce is checked
 * for every dtype and op against a reference in double, in-place at the root, and with
 * non-root recvbuf either NULL or a sentinel that must survive; Broadcast checks that every
 * rank gets the root's bytes and the root's buffer is unchanged. Bytes sent per rank are
 * checked against each algorithm's formula.
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
    gen_fn_t gen;
} gen_t;

static const gen_t tree_bcast = {"tree broadcast", hccl_algo_tree_broadcast};
static const gen_t chain_bcast = {"chain broadcast", hccl_algo_chain_broadcast};
static const gen_t sag_bcast = {"scatter_allgather broadcast",
                                hccl_algo_scatter_allgather_broadcast};
static const gen_t tree_reduce = {"tree reduce", hccl_algo_tree_reduce};
static const gen_t chain_reduce = {"chain reduce", hccl_algo_chain_reduce};

static const int small_ranks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};
static const size_t chunk_sizes[] = {4096, 1u << 20, 100};

/* Roots 0, n-1 and one in the middle (fewer when n is small). */
static int roots_of(int n, int *roots)
{
    int k = 0;

    roots[k++] = 0;
    if (n > 1)
        roots[k++] = n - 1;
    if (n > 2)
        roots[k++] = n / 2;
    return k;
}

static int lowbit(int v)
{
    return v & -v;
}

/*
 * Two steps of one plan that touch overlapping memory, one of them writing, must be ordered
 * by the DAG (RAW, WAR, WAW): otherwise the result depends on timing the sim may never show.
 * Two transfers with the same peer, direction and tag would be matched by chance. SEND and
 * RECV count as one buffer: a plan serves in-place calls too.
 */
static void check_hazards(const char *name, const hccl_plan_t *p)
{
    plan_check_t c = {.name = name, .slots = PLAN_SLOTS_SAME, .max_steps = 6000,
                      .unique_tags = true};

    plan_check(p, &c);
}

/*
 * Builds every rank's plan and checks what holds for all of them: no empty transfer (empty
 * blocks and chunks produce no steps), no unordered hazard, and a Reduce plan touches RECV
 * only at the root.
 */
static void build_plans(const gen_t *g, int n, const hccl_coll_shape_t *shape, size_t chunk,
                        hccl_plan_t **plans)
{
    int lg = 0;

    while ((1 << lg) < n)
        lg++;
    for (int r = 0; r < n; r++) {
        hcclResult_t res = g->gen(r, n, shape, chunk, &plans[r]);
        if (res != hcclSuccess)
            fail_msg("%s n=%d root=%d count=%zu: rank %d plan failed: %d", g->name, n, shape->root,
                     shape->count, r, (int)res);
        for (uint32_t i = 0; i < plans[r]->nsteps; i++) {
            const hccl_step_t *s = &plans[r]->steps[i];
            bool xfer = s->kind == HCCL_STEP_SEND || s->kind == HCCL_STEP_RECV;
            if (xfer && s->bytes == 0)
                fail_msg("%s n=%d count=%zu: rank %d step %u moves 0 bytes", g->name, n,
                         shape->count, r, i);
            if (shape->coll == HCCL_COLL_REDUCE && r != shape->root &&
                (s->dst.slot == HCCL_SLOT_RECV ||
                 (s->kind != HCCL_STEP_RECV && s->src.slot == HCCL_SLOT_RECV) ||
                 (s->kind == HCCL_STEP_REDUCE && s->src2.slot == HCCL_SLOT_RECV)))
                fail_msg("%s n=%d: non-root rank %d step %u uses RECV", g->name, n, r, i);
        }
        /* At most 2^16 chunks (plus a tail per block), each a receive or reduce and a send per
         * child or a receive, reduce and send per child. */
        assert_true(plans[r]->nsteps <= ((1u << 16) + (uint32_t)n) * (2u + 2 * (uint32_t)lg));
        check_hazards(g->name, plans[r]);
    }
}

static void release_plans(int n, hccl_plan_t **plans)
{
    for (int r = 0; r < n; r++)
        hccl_plan_release(plans[r]);
}

enum { IN_PLACE = 1, NULL_NONROOT = 2 };
#define SENTINEL 0xA5

static void check_reduce(const gen_t *g, int n, int root, size_t count, hcclDataType_t dt,
                         hcclRedOp_t op, size_t chunk, unsigned flags)
{
    size_t esz = hccl_dtype_size(dt), bytes = count * esz;
    unsigned seed = (unsigned)(count * 31 + (size_t)dt * 7 + (size_t)op + (size_t)root * 131);
    hccl_coll_shape_t shape = {HCCL_COLL_REDUCE, count, dt, op, root, NULL};
    hccl_plan_t *plans[64] = {0};
    void *send[64], *recv[64], *orig[64];
    unsigned char *sentinel = malloc(bytes + 1);
    sim_result_t out;
    hcclResult_t res;

    memset(sentinel, SENTINEL, bytes + 1);
    build_plans(g, n, &shape, chunk, plans);
    for (int r = 0; r < n; r++) {
        send[r] = malloc(bytes + 1);
        orig[r] = malloc(bytes + 1);
        for (size_t i = 0; i < count; i++)
            ref_store(send[r], i, dt, ref_input(dt, op, r, i, seed));
        memcpy(orig[r], send[r], bytes);
        if (r == root && (flags & IN_PLACE))
            recv[r] = send[r];
        else if (r != root && (flags & NULL_NONROOT))
            recv[r] = NULL;
        else
            recv[r] = memcpy(malloc(bytes + 1), sentinel, bytes + 1);
    }
    res = sim_run_plans(n, plans, send, recv, &out);
    if (res != hcclSuccess)
        fail_msg("%s n=%d root=%d count=%zu %s %s chunk=%zu flags=%u: result %d", g->name, n, root,
                 count, hccl_dtype_name(dt), hccl_op_name(op), chunk, flags, (int)res);
    for (size_t i = 0; i < count; i++) {
        double want = ref_reduce(dt, op, n, i, seed), got = ref_load(recv[root], i, dt);
        bool ok = ref_close(dt, got, want);
        if (!ok)
            fail_msg("%s n=%d root=%d count=%zu %s %s chunk=%zu flags=%u: element %zu is %.17g, "
                     "want %.17g", g->name, n, root, count, hccl_dtype_name(dt), hccl_op_name(op),
                     chunk, flags, i, got, want);
    }
    for (int r = 0; r < n; r++) {
        if (r != root && recv[r] && memcmp(recv[r], sentinel, bytes + 1) != 0)
            fail_msg("%s n=%d root=%d: non-root rank %d recvbuf was written", g->name, n, root, r);
        if ((r != root || !(flags & IN_PLACE)) && memcmp(send[r], orig[r], bytes) != 0)
            fail_msg("%s n=%d root=%d: rank %d sendbuf was written", g->name, n, root, r);
        /* Tree and chain alike: every rank but the root sends the buffer once. */
        assert_int_equal(out.bytes_sent[r], r == root ? 0 : bytes);
    }
    for (int r = 0; r < n; r++) {
        if (recv[r] != send[r])
            free(recv[r]);
        free(send[r]);
        free(orig[r]);
    }
    free(sentinel);
    release_plans(n, plans);
}

/* Bytes of the blocks the scatter leaves at virtual rank w > 0: [w, w + lowbit(w)). */
static uint64_t sag_range_bytes(int n, size_t count, size_t esz, int w)
{
    size_t first, len, total = 0;

    for (int b = w; b < n && b < w + lowbit(w); b++) {
        hccl_algo_block(count, n, b, &first, &len);
        total += len;
    }
    return total * esz;
}

/*
 * What each algorithm sends from rank r (virtual rank v). Tree: the buffer to each child.
 * Chain: the buffer, except at the tail. Scatter+allgather: its children's subtree ranges,
 * then in the ring everything its successor did not get from the scatter.
 */
static uint64_t bcast_bytes(const gen_t *g, int n, int root, size_t count, size_t esz, int r)
{
    int v = (r - root + n) % n, span = 1;
    uint64_t bytes = (uint64_t)count * esz, sent = 0;

    if (n == 1)
        return 0;
    if (g == &chain_bcast)
        return v == n - 1 ? 0 : bytes;
    if (v > 0)
        span = lowbit(v);
    else
        while (span < n)
            span <<= 1;
    for (int m = 1; m < span && v + m < n; m <<= 1)
        sent += g == &tree_bcast ? bytes : sag_range_bytes(n, count, esz, v + m);
    if (g == &sag_bcast && v + 1 < n)
        sent += bytes - sag_range_bytes(n, count, esz, v + 1);
    return sent;
}

static void check_broadcast(const gen_t *g, int n, int root, size_t count, hcclDataType_t dt,
                            size_t chunk)
{
    size_t esz = hccl_dtype_size(dt), bytes = count * esz;
    unsigned seed = (unsigned)(count * 17 + (size_t)dt * 3 + (size_t)root);
    hccl_coll_shape_t shape = {HCCL_COLL_BROADCAST, count, dt, hcclSum, root, NULL};
    hccl_plan_t *plans[64] = {0};
    void *buf[64];
    unsigned char *want = malloc(bytes + 1);
    sim_result_t out;
    uint64_t total = 0;
    hcclResult_t res;

    build_plans(g, n, &shape, chunk, plans);
    for (int r = 0; r < n; r++) {
        buf[r] = malloc(bytes + 1);
        if (r == root)
            for (size_t i = 0; i < count; i++)
                ref_store(buf[r], i, dt, ref_input(dt, hcclSum, r, i, seed));
        else
            memset(buf[r], 0x5A, bytes + 1);
    }
    memcpy(want, buf[root], bytes);
    /* The API passes the one buffer as both sendbuf and recvbuf. */
    res = sim_run_plans(n, plans, buf, buf, &out);
    if (res != hcclSuccess)
        fail_msg("%s n=%d root=%d count=%zu %s chunk=%zu: result %d", g->name, n, root, count,
                 hccl_dtype_name(dt), chunk, (int)res);
    for (int r = 0; r < n; r++) {
        if (memcmp(buf[r], want, bytes) != 0)
            fail_msg("%s n=%d root=%d count=%zu %s chunk=%zu: rank %d has the wrong data%s",
                     g->name, n, root, count, hccl_dtype_name(dt), chunk, r,
                     r == root ? " (the root's buffer changed)" : "");
        if (out.bytes_sent[r] != bcast_bytes(g, n, root, count, esz, r))
            fail_msg("%s n=%d root=%d count=%zu: rank %d sent %llu bytes, want %llu", g->name, n,
                     root, count, r, (unsigned long long)out.bytes_sent[r],
                     (unsigned long long)bcast_bytes(g, n, root, count, esz, r));
        total += out.bytes_sent[r];
    }
    /* Every algorithm here delivers the buffer to each non-root rank exactly once. */
    assert_int_equal(total, (uint64_t)(n - 1) * bytes);
    for (int r = 0; r < n; r++)
        free(buf[r]);
    free(want);
    release_plans(n, plans);
}

/*
 * Reduce at 1-9 and 16 ranks: every dtype x op at every count and root. The variant (in-place
 * at the root, NULL non-root recvbuf) and the chunk size rotate with the rank count, so each
 * pair meets all of them.
 */
static void reduce_matrix(const gen_t *g)
{
    for (size_t j = 0; j < sizeof(small_ranks) / sizeof(small_ranks[0]); j++) {
        int n = small_ranks[j], roots[3], nroots = roots_of(n, roots);
        size_t counts[] = {0, 1, 1009, (size_t)n * 37 + 1};
        for (int ri = 0; ri < nroots; ri++)
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
                for (int dt = 0; dt < hcclNumTypes; dt++)
                    for (int op = 0; op < hcclNumOps; op++)
                        check_reduce(g, n, roots[ri], counts[c], (hcclDataType_t)dt,
                                     (hcclRedOp_t)op, chunk_sizes[(j + c + (size_t)op) % 3],
                                     (unsigned)(j + c + (size_t)ri + (size_t)dt + (size_t)op) % 4);
    }
}

/* 33 and 64 ranks: small counts and a handful of dtype/op pairs, every variant. */
static void reduce_many_ranks(const gen_t *g)
{
    static const int big[] = {33, 64};
    static const struct { hcclDataType_t dt; hcclRedOp_t op; } pairs[] = {
        {hcclFloat32, hcclSum}, {hcclInt32, hcclAvg}, {hcclFloat16, hcclMax},
        {hcclBfloat16, hcclMin}, {hcclInt8, hcclProd}, {hcclFloat64, hcclAvg},
        {hcclUint64, hcclSum},
    };
    unsigned k = 0;

    for (int j = 0; j < 2; j++) {
        int n = big[j], roots[3], nroots = roots_of(n, roots);
        size_t counts[] = {0, 1, (size_t)n - 1, 97, 300};
        for (int ri = 0; ri < nroots; ri++)
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
                for (size_t pi = 0; pi < sizeof(pairs) / sizeof(pairs[0]); pi++, k++)
                    check_reduce(g, n, roots[ri], counts[c], pairs[pi].dt, pairs[pi].op,
                                 chunk_sizes[k % 3], k % 4);
    }
}

/* Large buffers, many chunks: pipelining, both in-place and not at the root. */
static void reduce_large(const gen_t *g)
{
    check_reduce(g, 3, 1, 300000, hcclFloat32, hcclSum, 4096, 0);
    check_reduce(g, 8, 5, 300000, hcclInt32, hcclAvg, 4096, IN_PLACE | NULL_NONROOT);
    check_reduce(g, 7, 0, 300000, hcclFloat64, hcclMax, 1u << 20, IN_PLACE);
    check_reduce(g, 16, 15, 300001, hcclBfloat16, hcclSum, 1u << 20, NULL_NONROOT);
}

static void bcast_matrix(const gen_t *g)
{
    static const hcclDataType_t dts[] = {hcclInt8, hcclFloat16, hcclInt32, hcclFloat64};
    static const int ranks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33, 64};
    unsigned k = 0;

    for (size_t j = 0; j < sizeof(ranks) / sizeof(ranks[0]); j++) {
        int n = ranks[j], roots[3], nroots = roots_of(n, roots);
        size_t counts[] = {0, 1, 5, (size_t)n - 1, (size_t)n * 37 + 1, n > 16 ? 300 : 1009};
        for (int ri = 0; ri < nroots; ri++)
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
                for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++, k++)
                    check_broadcast(g, n, roots[ri], counts[c], dts[d], chunk_sizes[k % 3]);
    }
    check_broadcast(g, 5, 2, 300000, hcclFloat32, 4096);
    check_broadcast(g, 8, 7, 300000, hcclInt8, 4096);
    check_broadcast(g, 16, 0, 300001, hcclFloat64, 1u << 20);
    check_broadcast(g, 64, 33, 30011, hcclInt32, 4096);
}

static void test_tree_broadcast(void **state)
{
    (void)state;
    bcast_matrix(&tree_bcast);
}

static void test_chain_broadcast(void **state)
{
    (void)state;
    bcast_matrix(&chain_bcast);
}

static void test_scatter_allgather_broadcast(void **state)
{
    (void)state;
    bcast_matrix(&sag_bcast);
}

static void test_tree_reduce(void **state)
{
    (void)state;
    reduce_matrix(&tree_reduce);
    reduce_many_ranks(&tree_reduce);
    reduce_large(&tree_reduce);
}

static void test_chain_reduce(void **state)
{
    (void)state;
    reduce_matrix(&chain_reduce);
    reduce_many_ranks(&chain_reduce);
    reduce_large(&chain_reduce);
}

/* One-byte chunks of a large buffer: the generators grow the chunks to bound the plan. */
static void test_chunk_cap(void **state)
{
    (void)state;
    check_broadcast(&tree_bcast, 4, 1, 300000, hcclInt8, 1);
    check_broadcast(&chain_bcast, 4, 1, 300000, hcclInt8, 1);
    check_broadcast(&sag_bcast, 4, 1, 300000, hcclInt8, 1);
    check_reduce(&tree_reduce, 4, 1, 300000, hcclInt8, hcclSum, 1, IN_PLACE);
    check_reduce(&chain_reduce, 4, 1, 300000, hcclInt8, hcclMax, 1, NULL_NONROOT);
}

/* count 0 accepts NULL buffers everywhere: the plans are empty. */
static void test_count0_null_buffers(void **state)
{
    const gen_t *gens[] = {&tree_bcast, &chain_bcast, &sag_bcast, &tree_reduce, &chain_reduce};
    (void)state;

    for (size_t gi = 0; gi < sizeof(gens) / sizeof(gens[0]); gi++) {
        for (int n = 1; n <= 9; n++) {
            hccl_coll_shape_t shape = {gi < 3 ? HCCL_COLL_BROADCAST : HCCL_COLL_REDUCE, 0,
                                       hcclFloat32, hcclSum, n / 2, NULL};
            hccl_plan_t *plans[64] = {0};
            void *none[64] = {0};
            build_plans(gens[gi], n, &shape, 4096, plans);
            for (int r = 0; r < n; r++)
                assert_int_equal(plans[r]->nsteps, 0);
            assert_int_equal(sim_run_plans(n, plans, none, none, NULL), hcclSuccess);
            release_plans(n, plans);
        }
    }
}

/*
 * Where ranks share CPUs the tuner prices a chain by one rank's turn, not by its depth: chain
 * at every size from 3 ranks, where the depths chose the tree for small buffers and
 * scatter+allgather for mid-sized ones; 2 ranks (one message either way) keep the tree.
 */
static void test_tuner_cpus_shared(void **state)
{
    static const size_t sizes[] = {1024, 16384, 262144, 1u << 20, 64u << 20};
    hccl_coll_shape_t shape = {HCCL_COLL_BROADCAST, 0, hcclInt8, hcclSum, 0, NULL};
    hccl_tuner_t t;
    (void)state;

    hccl_tuner_init(&t, NULL, 4u << 20);
    hccl_tuner_set_model(&t, HCCL_COST_TCP, "8,4,15");
    shape.count = 1024;
    assert_int_equal(hccl_tuner_pick(&t, &shape, 4), HCCL_ALGO_TREE);
    shape.count = 262144;
    assert_int_equal(hccl_tuner_pick(&t, &shape, 4), HCCL_ALGO_SCATTER_ALLGATHER);
    shape.coll = HCCL_COLL_REDUCE;
    shape.count = 16384;
    assert_int_equal(hccl_tuner_pick(&t, &shape, 4), HCCL_ALGO_TREE);

    t.model.cpus_shared = true;
    for (int coll = 0; coll < 2; coll++) {
        shape.coll = coll ? HCCL_COLL_REDUCE : HCCL_COLL_BROADCAST;
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
            shape.count = sizes[i];
            for (int n = 3; n <= 8; n++)
                assert_int_equal(hccl_tuner_pick(&t, &shape, n), HCCL_ALGO_CHAIN);
            assert_int_equal(hccl_tuner_pick(&t, &shape, 2), HCCL_ALGO_TREE);
        }
    }
}

/* One Reduce over the sim link with store_min (root's recvbuf in place if asked); the root's
 * result is copied to *result (malloc'd). */
static void run_reduce_stored(const gen_t *g, int n, int root, size_t count, hcclDataType_t dt,
                              hcclRedOp_t op, bool in_place, size_t store_min, void **result,
                              sim_result_t *out)
{
    size_t bytes = count * hccl_dtype_size(dt);
    hccl_coll_shape_t shape = {HCCL_COLL_REDUCE, count, dt, op, root, NULL};
    hccl_plan_t *plans[64] = {0};
    void *send[64], *recv[64];

    build_plans(g, n, &shape, 1u << 16, plans);
    for (int r = 0; r < n; r++) {
        send[r] = malloc(bytes);
        assert_non_null(send[r]);
        for (size_t i = 0; i < count; i++)
            ref_store(send[r], i, dt, ref_input(dt, op, r, i, 17));
        recv[r] = r == root && in_place ? send[r] : malloc(bytes);
        assert_non_null(recv[r]);
    }
    sim_run_set_store_min(store_min);
    assert_int_equal(sim_run_plans(n, plans, send, recv, out), hcclSuccess);
    sim_run_set_store_min(0);
    *result = malloc(bytes);
    assert_non_null(*result);
    memcpy(*result, recv[root], bytes);
    for (int r = 0; r < n; r++) {
        if (recv[r] != send[r])
            free(recv[r]);
        free(send[r]);
    }
    release_plans(n, plans);
}

/*
 * Over store_min the root of a Reduce, which sends nothing, streams its final reductions'
 * results (out of place, fp32/fp64 sum), with the same bits, and never more than the result;
 * no other rank does, nor the root in place or for hcclAvg (whose division reads the result
 * back). A tree root with two children or more ends with an accumulation into its own result
 * (in place): it streams nothing, nor the partial sum the next step reads back.
 */
static void test_reduce_root_streams(void **state)
{
    static const gen_t *gens[] = {&tree_reduce, &chain_reduce};
    static const int ns[] = {2, 3, 4, 8};
    static const struct {
        hcclDataType_t dt;
        hcclRedOp_t op;
        bool in_place, streams;
    } cases[] = {{hcclFloat32, hcclSum, false, true},  {hcclFloat64, hcclSum, false, true},
                 {hcclFloat32, hcclSum, true, false},  {hcclFloat32, hcclAvg, false, false},
                 {hcclFloat32, hcclMax, false, false}, {hcclInt32, hcclSum, false, false}};
    size_t count = 20011;

    (void)state;
    for (size_t g = 0; g < 2; g++)
        for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++)
            for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
                int n = ns[k], root = n / 2;
                void *plain, *streamed;
                sim_result_t out;
                run_reduce_stored(gens[g], n, root, count, cases[c].dt, cases[c].op,
                                  cases[c].in_place, 0, &plain, &out);
                for (int r = 0; r < n; r++)
                    assert_int_equal(out.bytes_reduced_stored[r], 0);
                run_reduce_stored(gens[g], n, root, count, cases[c].dt, cases[c].op,
                                  cases[c].in_place, 1, &streamed, &out);
                bool root_streams = cases[c].streams && (gens[g] == &chain_reduce || n == 2);
                for (int r = 0; r < n; r++)
                    if ((out.bytes_reduced_stored[r] > 0) != (root_streams && r == root) ||
                        out.bytes_reduced_stored[r] > count * hccl_dtype_size(cases[c].dt))
                        fail_msg("%s n=%d case %zu: rank %d stored %llu reduced bytes past the "
                                 "cache", gens[g]->name, n, c, r,
                                 (unsigned long long)out.bytes_reduced_stored[r]);
                if (memcmp(plain, streamed, count * hccl_dtype_size(cases[c].dt)) != 0)
                    fail_msg("%s n=%d case %zu: the streamed result differs", gens[g]->name, n, c);
                free(plain);
                free(streamed);
            }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tree_broadcast),
        cmocka_unit_test(test_chain_broadcast),
        cmocka_unit_test(test_scatter_allgather_broadcast),
        cmocka_unit_test(test_tree_reduce),
        cmocka_unit_test(test_chain_reduce),
        cmocka_unit_test(test_chunk_cap),
        cmocka_unit_test(test_count0_null_buffers),
        cmocka_unit_test(test_tuner_cpus_shared),
        cmocka_unit_test(test_reduce_root_streams),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
