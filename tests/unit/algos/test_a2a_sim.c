/*
 * AlltoAll (pairwise, Bruck), AlltoAllv (pairwise) and Barrier (dissemination)
 * over the sim link, whose sends complete only when the receive is posted, so
 * a plan that needs buffering deadlocks here. Data is checked byte for byte
 * (the collectives only move bytes), bytes on the wire against each
 * algorithm's formula, and the Barrier against early completion.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reactor/reactor_impl.h"
#include "plan_check.h"
#include "sim_run.h"

typedef hcclResult_t (*gen_fn_t)(int rank, int nranks, const hccl_coll_shape_t *shape,
                                 size_t chunk_bytes, hccl_plan_t **plan_p);

static const int rank_counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33, 64};
static const hcclDataType_t dtypes[] = {hcclInt8, hcclFloat16, hcclFloat32, hcclFloat64};
#define NELEMS(a_x) (sizeof(a_x) / sizeof((a_x)[0]))
#define GUARD 0xA5
#define SLACK 16 /* guard bytes after every recvbuf */

/* Byte j of the data rank s sends to rank d. */
static uint8_t pat(int s, int d, size_t j)
{
    uint32_t h = (uint32_t)s * 2654435761u ^ (uint32_t)d * 40503u ^ (uint32_t)j * 2246822519u;
    h ^= h >> 15;
    return (uint8_t)(h ^ (h >> 8) ^ (j >> 16));
}

static int ceil_log2(int n)
{
    int k = 0;
    while ((1 << k) < n)
        k++;
    return k;
}

/* Bruck sends, in round k, every block whose index in [0, n) has bit k set. */
static uint64_t bruck_blocks_sent(int n)
{
    uint64_t m = 0;
    for (int k = 0; (1 << k) < n; k++)
        for (int i = 0; i < n; i++)
            m += (i >> k) & 1;
    return m;
}

static uint32_t count_steps(const hccl_plan_t *p, hccl_step_kind_t kind)
{
    uint32_t c = 0;
    for (uint32_t i = 0; i < p->nsteps; i++)
        c += p->steps[i].kind == kind;
    return c;
}

/*
 * Every pair of steps that touch overlapping bytes, at least one of them writing, must be
 * ordered by the DAG: the executor may run unordered steps in any order, and a link may
 * report completions in any order, even when the sim link happens not to.
 */
static void check_hazards(const hccl_plan_t *p)
{
    plan_check_t c = {.name = p->algo, .slots = PLAN_SLOTS_APART};

    plan_check(p, &c);
}

static void check_alltoall(gen_fn_t gen, const char *name, int n, size_t count, hcclDataType_t dt,
                           size_t chunk)
{
    size_t esz = hccl_dtype_size(dt), b = count * esz, pc = chunk / esz ? chunk / esz * esz : esz;
    uint8_t *send[64], *recv[64];
    hccl_plan_t *plans[64] = {0};
    hccl_coll_shape_t shape = {HCCL_COLL_ALLTOALL, count, dt, hcclSum, 0, NULL};
    sim_result_t out;
    hcclResult_t res;

    for (int r = 0; r < n; r++) {
        send[r] = malloc((size_t)n * b + 1);
        recv[r] = malloc((size_t)n * b + SLACK);
        memset(recv[r], GUARD, (size_t)n * b + SLACK);
        for (int d = 0; d < n; d++)
            for (size_t j = 0; j < b; j++)
                send[r][(size_t)d * b + j] = pat(r, d, j);
        assert_int_equal(gen(r, n, &shape, chunk, &plans[r]), hcclSuccess);
        if (n <= 16 && count <= 61)
            check_hazards(plans[r]);
        if (count == 0)
            assert_int_equal(plans[r]->nsteps, 0); /* nothing to move: an empty plan */
        else if (gen == hccl_algo_bruck_alltoall)
            assert_int_equal(count_steps(plans[r], HCCL_STEP_SEND), ceil_log2(n));
        else /* pairwise: n-1 peers, each block cut into chunk-sized pieces */
            assert_int_equal(count_steps(plans[r], HCCL_STEP_SEND),
                             (size_t)(n - 1) * ((b + pc - 1) / pc));
    }
    res = sim_run_plans(n, plans, (void **)send, (void **)recv, &out);
    if (res != hcclSuccess)
        fail_msg("%s n=%d count=%zu %s chunk=%zu: result %d", name, n, count, hccl_dtype_name(dt),
                 chunk, (int)res);
    for (int r = 0; r < n; r++) {
        uint64_t want = gen == hccl_algo_bruck_alltoall ? bruck_blocks_sent(n) * b
                                                        : (uint64_t)(n - 1) * b;
        for (int s = 0; s < n; s++)
            for (size_t j = 0; j < b; j++)
                if (recv[r][(size_t)s * b + j] != pat(s, r, j))
                    fail_msg("%s n=%d count=%zu %s chunk=%zu: rank %d block %d byte %zu wrong",
                             name, n, count, hccl_dtype_name(dt), chunk, r, s, j);
        for (size_t j = 0; j < SLACK; j++)
            assert_int_equal(recv[r][(size_t)n * b + j], GUARD);
        if (out.bytes_sent[r] != want)
            fail_msg("%s n=%d count=%zu: rank %d sent %llu bytes, want %llu", name, n, count, r,
                     (unsigned long long)out.bytes_sent[r], (unsigned long long)want);
        hccl_plan_release(plans[r]);
        free(send[r]);
        free(recv[r]);
    }
}

static void alltoall_matrix(gen_fn_t gen, const char *name)
{
    for (size_t k = 0; k < NELEMS(rank_counts); k++) {
        int n = rank_counts[k];
        size_t small[] = {0, 1, 3}, full[] = {0, 1, 7, 61};
        size_t *counts = n > 16 ? small : full;
        size_t ncounts = n > 16 ? NELEMS(small) : NELEMS(full);

        for (size_t c = 0; c < ncounts; c++) {
            hcclDataType_t dt = dtypes[(c + k) % NELEMS(dtypes)];
            check_alltoall(gen, name, n, counts[c], dt, 4096);
            if (n <= 9)
                check_alltoall(gen, name, n, counts[c], dtypes[(c + k + 1) % NELEMS(dtypes)],
                               1u << 20);
        }
    }
}

static void test_pairwise_alltoall(void **state)
{
    (void)state;
    alltoall_matrix(hccl_algo_pairwise_alltoall, "pairwise");
}

static void test_bruck_alltoall(void **state)
{
    (void)state;
    alltoall_matrix(hccl_algo_bruck_alltoall, "bruck");
}

/* Blocks of many uneven pieces (lanes), pieces of one element, and a block over 1 MiB. */
static void test_alltoall_large(void **state)
{
    (void)state;
    check_alltoall(hccl_algo_pairwise_alltoall, "pairwise", 5, 7, hcclInt8, 1);
    check_alltoall(hccl_algo_pairwise_alltoall, "pairwise", 4, 13, hcclFloat64, 3);
    check_alltoall(hccl_algo_pairwise_alltoall, "pairwise", 2, 100003, hcclFloat32, 4096);
    check_alltoall(hccl_algo_pairwise_alltoall, "pairwise", 5, 100003, hcclFloat32, 4096);
    check_alltoall(hccl_algo_pairwise_alltoall, "pairwise", 8, 300007, hcclFloat32, 1u << 20);
    check_alltoall(hccl_algo_pairwise_alltoall, "pairwise", 7, 65536, hcclFloat16, 1u << 20);
    check_alltoall(hccl_algo_bruck_alltoall, "bruck", 3, 20011, hcclInt32, 4096);
    check_alltoall(hccl_algo_bruck_alltoall, "bruck", 7, 20011, hcclFloat64, 4096);
    check_alltoall(hccl_algo_bruck_alltoall, "bruck", 16, 4099, hcclBfloat16, 4096);
}

/* ---- AlltoAllv ---- */

static unsigned lcg(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return *s >> 8;
}

/* Places n blocks of counts[] in a random order with random gaps; returns the extent. */
static size_t place(int n, const size_t *counts, size_t *displs, unsigned *seed)
{
    int order[64];
    size_t pos = lcg(seed) % 3;

    for (int i = 0; i < n; i++)
        order[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(lcg(seed) % (unsigned)(i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int i = 0; i < n; i++) {
        displs[order[i]] = pos;
        pos += counts[order[i]] + lcg(seed) % 4; /* a gap of 0-3 elements */
    }
    return pos;
}

static void check_alltoallv(int n, hcclDataType_t dt, size_t chunk, size_t maxcount, unsigned seed)
{
    size_t esz = hccl_dtype_size(dt);
    static size_t cnt[64][64]; /* elements rank s sends to rank d */
    size_t *v[64];             /* per rank, as shape->v: scounts, sdispls, rcounts, rdispls */
    size_t sext[64], rext[64];
    uint8_t *send[64], *recv[64], *mine;
    hccl_plan_t *plans[64] = {0};
    sim_result_t out;

    for (int s = 0; s < n; s++)
        for (int d = 0; d < n; d++)
            cnt[s][d] = lcg(&seed) % 3 == 0 ? 0 : lcg(&seed) % (maxcount + 1);
    for (int r = 0; r < n; r++) {
        hccl_coll_shape_t shape = {HCCL_COLL_ALLTOALLV, 0, dt, hcclSum, 0, NULL};
        uint32_t pieces = 0;
        size_t ce = chunk / esz ? chunk / esz : 1;

        v[r] = malloc(4 * (size_t)n * sizeof(size_t));
        shape.v = v[r];
        for (int j = 0; j < n; j++) {
            v[r][j] = cnt[r][j];
            v[r][2 * n + j] = cnt[j][r];
            pieces += j == r ? 0 : (uint32_t)((cnt[r][j] + ce - 1) / ce);
        }
        sext[r] = place(n, v[r], v[r] + n, &seed);
        rext[r] = place(n, v[r] + 2 * n, v[r] + 3 * n, &seed);
        send[r] = malloc(sext[r] * esz + 1);
        recv[r] = malloc(rext[r] * esz + SLACK);
        memset(send[r], 0x5A, sext[r] * esz + 1);
        memset(recv[r], GUARD, rext[r] * esz + SLACK);
        for (int d = 0; d < n; d++)
            for (size_t j = 0; j < cnt[r][d] * esz; j++)
                send[r][v[r][n + d] * esz + j] = pat(r, d, j);
        assert_int_equal(hccl_algo_pairwise_alltoallv(r, n, &shape, chunk, &plans[r]), hcclSuccess);
        /* Zero-length pairs make no steps: exactly the pieces of the non-empty sends. */
        assert_int_equal(count_steps(plans[r], HCCL_STEP_SEND), pieces);
        for (uint32_t i = 0; i < plans[r]->nsteps; i++)
            assert_true(plans[r]->steps[i].bytes > 0);
        if (n <= 16)
            check_hazards(plans[r]);
    }
    if (sim_run_plans(n, plans, (void **)send, (void **)recv, &out) != hcclSuccess)
        fail_msg("alltoallv n=%d %s chunk=%zu seed=%u failed", n, hccl_dtype_name(dt), chunk, seed);
    for (int r = 0; r < n; r++) {
        uint64_t want = 0;
        mine = calloc(rext[r] * esz + SLACK, 1);
        for (int s = 0; s < n; s++) {
            want += s == r ? 0 : cnt[r][s] * esz;
            for (size_t j = 0; j < cnt[s][r] * esz; j++) {
                size_t at = v[r][3 * n + s] * esz + j;
                mine[at] = 1;
                if (recv[r][at] != pat(s, r, j))
                    fail_msg("alltoallv n=%d seed=%u: rank %d from %d byte %zu wrong", n, seed, r,
                             s, j);
            }
        }
        for (size_t j = 0; j < rext[r] * esz + SLACK; j++)
            if (!mine[j] && recv[r][j] != GUARD)
                fail_msg("alltoallv n=%d seed=%u: rank %d gap byte %zu written", n, seed, r, j);
        assert_int_equal(out.bytes_sent[r], want);
        free(mine);
        hccl_plan_release(plans[r]);
        free(send[r]);
        free(recv[r]);
        free(v[r]);
    }
}

static void test_pairwise_alltoallv(void **state)
{
    (void)state;
    for (size_t k = 0; k < NELEMS(rank_counts); k++) {
        int n = rank_counts[k];
        for (unsigned t = 0; t < (n > 16 ? 1u : 3u); t++) {
            hcclDataType_t dt = dtypes[(k + t) % NELEMS(dtypes)];
            check_alltoallv(n, dt, 4096, n > 16 ? 9 : 40, 1000u * (unsigned)n + t);
            if (n <= 9)
                check_alltoallv(n, dt, 8, 40, 2000u * (unsigned)n + t); /* several pieces */
        }
    }
    check_alltoallv(4, hcclFloat32, 4096, 20000, 77);  /* uneven pieces of large blocks */
    check_alltoallv(5, hcclInt8, 1u << 20, 300000, 78);
}

/* Both counts of the own block are local: a mismatch fails at build time. */
static void test_alltoallv_mismatch(void **state)
{
    /* Rows: scounts, sdispls, rcounts, rdispls; rank 0 first expects 5 from itself, sends 3. */
    size_t v[4][2] = {{3, 4}, {0, 3}, {5, 2}, {0, 3}};
    size_t w[4][2] = {{2, 4}, {0, 2}, {2, 4}, {0, 2}};
    hccl_coll_shape_t shape = {HCCL_COLL_ALLTOALLV, 0, hcclFloat32, hcclSum, 0, &v[0][0]};
    hccl_plan_t *plans[2] = {0};
    float send[2][8] = {{0}}, recv[2][8];
    void *sb[2] = {send[0], send[1]}, *rb[2] = {recv[0], recv[1]};
    sim_result_t out;

    (void)state;
    assert_int_equal(hccl_algo_pairwise_alltoallv(0, 2, &shape, 4096, &plans[0]), hcclInvalidUsage);
    /* Rank 0 sends 4 elements to rank 1, which expects 2: the link's length check says so. */
    v[2][0] = 3;
    assert_int_equal(hccl_algo_pairwise_alltoallv(0, 2, &shape, 4096, &plans[0]), hcclSuccess);
    shape.v = &w[0][0];
    assert_int_equal(hccl_algo_pairwise_alltoallv(1, 2, &shape, 4096, &plans[1]), hcclSuccess);
    assert_int_equal(sim_run_plans(2, plans, sb, rb, &out), hcclInvalidUsage);
    hccl_plan_release(plans[0]);
    hccl_plan_release(plans[1]);
}

/* ---- Barrier ---- */

static void test_barrier_completes(void **state)
{
    hccl_coll_shape_t shape = {HCCL_COLL_BARRIER, 0, hcclFloat32, hcclSum, 0, NULL};
    char dummy[64][1];
    void *bufs[64];

    (void)state;
    for (size_t k = 0; k < NELEMS(rank_counts); k++) {
        int n = rank_counts[k];
        hccl_plan_t *plans[64] = {0};
        sim_result_t out;

        for (int r = 0; r < n; r++) {
            bufs[r] = n % 2 ? NULL : dummy[r]; /* a Barrier has no buffers: NULL is fine */
            assert_int_equal(hccl_algo_dissemination_barrier(r, n, &shape, 4096, &plans[r]),
                             hcclSuccess);
            /* ceil(log2 n) zero-byte messages each way, nothing else. */
            assert_int_equal(count_steps(plans[r], HCCL_STEP_SEND), ceil_log2(n));
            assert_int_equal(count_steps(plans[r], HCCL_STEP_RECV), ceil_log2(n));
            assert_int_equal(plans[r]->nsteps, 2 * ceil_log2(n));
            for (uint32_t i = 0; i < plans[r]->nsteps; i++)
                assert_int_equal(plans[r]->steps[i].bytes, 0);
        }
        assert_int_equal(sim_run_plans(n, plans, bufs, bufs, &out), hcclSuccess);
        for (int r = 0; r < n; r++) {
            assert_int_equal(out.res[r], hcclSuccess);
            assert_int_equal(out.bytes_sent[r], 0);
            hccl_plan_release(plans[r]);
        }
    }
}

typedef struct {
    int done;
    hcclResult_t res;
} bar_state_t;

static void on_bar_done(hccl_run_t *run, hcclResult_t res, const char *msg, void *arg)
{
    bar_state_t *st = arg;
    (void)run, (void)msg;
    st->done = 1;
    st->res = res;
}

/* Runs the reactor until the sim link has nothing left to complete; returns runs done. */
static int drive_until_idle(hccl_reactor_t *r, const bar_state_t *st, int n)
{
    int ndone = 0;
    do {
        hccl_reactor_drive(r, 0);
    } while (atomic_load(&r->post_head) != NULL);
    for (int i = 0; i < n; i++)
        ndone += st[i].done;
    return ndone;
}

/*
 * Ranks start one by one in the order first, first+1, ...; after each start but the last the
 * reactor runs until idle and no rank may have finished: a barrier completes nowhere before
 * every rank has entered it.
 */
static void check_barrier_sync(int n, int first)
{
    hccl_coll_shape_t shape = {HCCL_COLL_BARRIER, 0, hcclFloat32, hcclSum, 0, NULL};
    hccl_plan_t *plans[64] = {0};
    hccl_exec_t *ex[64] = {0};
    bar_state_t st[64];
    hccl_reactor_t *r = NULL;
    hccl_sim_world_t *w = NULL;
    char buf[1];

    memset(st, 0, sizeof(st));
    assert_int_equal(hccl_reactor_create(NULL, -1, &r), hcclSuccess);
    assert_int_equal(hccl_sim_world_create(r, n, &w), hcclSuccess);
    for (int i = 0; i < n; i++) {
        assert_int_equal(hccl_algo_dissemination_barrier(i, n, &shape, 0, &plans[i]), hcclSuccess);
        assert_int_equal(hccl_exec_create(r, i, n, hccl_sim_world_conns(w, i), &ex[i]),
                         hcclSuccess);
    }
    for (int k = 0; k < n; k++) {
        int i = (first + k) % n;
        assert_int_equal(hccl_exec_start(ex[i], plans[i], 11, buf, buf, on_bar_done, &st[i], NULL),
                         hcclSuccess);
        if (k < n - 1 && drive_until_idle(r, st, n) != 0)
            fail_msg("barrier n=%d: a rank finished with only %d of %d ranks started", n, k + 1, n);
    }
    assert_int_equal(drive_until_idle(r, st, n), n);
    for (int i = 0; i < n; i++) {
        assert_int_equal(st[i].res, hcclSuccess);
        hccl_exec_destroy(ex[i]);
        hccl_plan_release(plans[i]);
    }
    hccl_sim_world_destroy(w);
    hccl_reactor_destroy(r);
}

static void test_barrier_synchronises(void **state)
{
    (void)state;
    for (size_t k = 1; k < NELEMS(rank_counts); k++) {
        int n = rank_counts[k];
        check_barrier_sync(n, 0);
        check_barrier_sync(n, n / 2 + 1);
        check_barrier_sync(n, n - 1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pairwise_alltoall),
        cmocka_unit_test(test_bruck_alltoall),
        cmocka_unit_test(test_alltoall_large),
        cmocka_unit_test(test_pairwise_alltoallv),
        cmocka_unit_test(test_alltoallv_mismatch),
        cmocka_unit_test(test_barrier_completes),
        cmocka_unit_test(test_barrier_synchronises),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
