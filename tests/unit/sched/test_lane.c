/*
 * The lane with every rank in this process, over each link with the window capability: every
 * test runs twice.
 *   shm: each rank's shm context is built by hand over an anonymous mapping that stands for its
 *        segment and that the others use as their peer's, so the lane's own code (slots, turns,
 *        rank-order reduction, queueing, failure) runs as between processes, driven round-robin;
 *   sim: the sim world's windows, driven only by their doorbells (a rank's lane runs when a
 *        peer published or raised a flag since it last ran), so a publication that forgets to
 *        ring leaves an operation unfinished and the test fails.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cmocka.h>

#include "algos/algos.h"
#include "links/shm/shm.h"
#include "reference.h"
#include "sched/lane.h"

#define MAXR 8

typedef struct {
    int n;
    hccl_link_env_t env[MAXR];
    shm_ctx_t ctx[MAXR];
    shm_conn_t conn[MAXR][MAXR];
    shm_conn_t *conns[MAXR][MAXR];
    int active[MAXR][MAXR];
    void *seg[MAXR];
    hccl_lane_t *lane[MAXR];
    char fatal[MAXR][512]; /* what on_fatal said, per rank */
    hccl_sim_world_t *sim; /* over sim: its windows, and wctx[r] is rank r's */
    const hccl_window_ops_t *win;
    void *wctx[MAXR];
} world_t;

static bool over_sim; /* which window the tests run over */

static void on_fatal(void *arg, hcclResult_t res, const char *msg)
{
    assert_int_equal(res, hcclInvalidUsage);
    snprintf(arg, 512, "%s", msg);
}

/* A world whose lanes split operations above flat_max bytes, in CPU groups group_of (or NULL). */
static world_t *world_new_groups(int n, size_t max_bytes, size_t flat_max, const int *group_of, bool always)
{
    world_t *w = calloc(1, sizeof(*w));

    assert_non_null(w);
    w->n = n;
    if (over_sim) {
        hccl_lane_limits_t limits = {max_bytes, flat_max, 0, max_bytes, SIZE_MAX, group_of, always, 1};
        assert_int_equal(hccl_sim_world_create(NULL, n, &w->sim), hcclSuccess);
        w->win = &hccl_sim_window_ops;
        for (int r = 0; r < n; r++) {
            assert_non_null(w->wctx[r] = hccl_sim_world_window(w->sim, r));
            assert_true(w->win->reaches_all(w->wctx[r], n));
            assert_false(w->win->reaches_all(w->wctx[r], n + 1));
            assert_int_equal(hccl_lane_create(w->win, w->wctx[r], r, n, &limits, on_fatal, &w->fatal[r],
                                              &w->lane[r]),
                             hcclSuccess);
            w->win->on_bell(w->wctx[r], hccl_lane_poll, w->lane[r]);
        }
        return w;
    }
    w->win = &hccl_shm_window_ops;
    /* Zero pages, touched only where used, as a fresh shm segment is. */
    for (int r = 0; r < n; r++) {
        w->seg[r] = mmap(NULL, SHM_RINGS_OFFSET, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        assert_true(w->seg[r] != MAP_FAILED);
    }
    for (int r = 0; r < n; r++) {
        shm_ctx_t *ctx = &w->ctx[r];
        w->wctx[r] = ctx;
        w->env[r].rank = r;
        w->env[r].nranks = n;
        ctx->env = &w->env[r];
        ctx->seg = w->seg[r];
        ctx->conns = w->conns[r];
        ctx->active = w->active[r];
        for (int p = 0; p < n; p++) {
            if (p == r)
                continue;
            w->conn[r][p].peer_seg = w->seg[p];
            w->conn[r][p].peer_bell = -1; /* nothing to ring: the test polls */
            w->conns[r][p] = &w->conn[r][p];
            ctx->active[ctx->nactive++] = p;
        }
        assert_true(hccl_shm_window_ops.reaches_all(ctx, n));
        /* Tries of the other way as soon as the operation counts allow. */
        hccl_lane_limits_t limits = {max_bytes, flat_max, 0, max_bytes, SIZE_MAX, group_of, always, 1};
        assert_int_equal(hccl_lane_create(&hccl_shm_window_ops, ctx, r, n, &limits, on_fatal, &w->fatal[r], &w->lane[r]), hcclSuccess);
    }
    return w;
}

static world_t *world_new_split(int n, size_t max_bytes, size_t flat_max)
{
    return world_new_groups(n, max_bytes, flat_max, NULL, false);
}

static world_t *world_new(int n, size_t max_bytes)
{
    return world_new_split(n, max_bytes, HCCL_LANE_FLAT_MAX);
}

static void world_free(world_t *w)
{
    for (int r = 0; r < w->n; r++) {
        hccl_lane_destroy(w->lane[r]);
        if (!w->sim)
            munmap(w->seg[r], SHM_RINGS_OFFSET);
    }
    hccl_sim_world_destroy(w->sim);
    free(w);
}

typedef struct {
    hccl_lane_op_t op;
    int done;
    hcclResult_t res;
    char msg[256];
} test_op_t;

static void on_done(hccl_lane_op_t *op, hcclResult_t res, const char *msg)
{
    test_op_t *t = op->arg;

    t->done++;
    t->res = res;
    snprintf(t->msg, sizeof(t->msg), "%s", msg ? msg : "");
}

static void op_init(test_op_t *t, int coll, const void *sbuf, void *rbuf, size_t count, hcclDataType_t dt,
                    hcclRedOp_t op)
{
    memset(t, 0, sizeof(*t));
    t->op.coll = coll;
    t->op.sendbuf = sbuf;
    t->op.recvbuf = rbuf;
    t->op.count = count;
    t->op.dtype = dt;
    t->op.op = op;
    t->op.done = on_done;
    t->op.arg = t;
}

/* Polls every rank's lane until nothing moves; returns the rounds that moved. */
static int drive(world_t *w)
{
    int rounds = 0;
    bool moved;

    do {
        moved = false;
        if (w->sim)
            moved = hccl_sim_world_ring(w->sim);
        for (int r = 0; !w->sim && r < w->n; r++)
            moved |= hccl_lane_poll(w->lane[r]);
        rounds += moved;
    } while (moved);
    return rounds;
}

static const hcclDataType_t dtypes[] = {hcclInt8, hcclUint8, hcclInt32, hcclUint32, hcclInt64,
                                        hcclUint64, hcclFloat16, hcclBfloat16, hcclFloat32, hcclFloat64};
static const hcclRedOp_t ops[] = {hcclSum, hcclProd, hcclMax, hcclMin, hcclAvg};

/* Every dtype and op, in place and not, on w's lanes (counts below the rank count leave some
 * shares empty): right, and the same bits on every rank (every rank reduces in one fixed
 * order). grouped: each rank's group sum was published (the grouped path ran). */
static void allreduce_every_type(world_t *w, bool grouped)
{
    static const int counts[] = {1, 7, 1000};
    int n = w->n;
    unsigned seed = 1;

    for (size_t di = 0; di < sizeof(dtypes) / sizeof(dtypes[0]); di++) {
        for (size_t oi = 0; oi < sizeof(ops) / sizeof(ops[0]); oi++) {
            for (size_t ci = 0; ci < 3; ci++, seed++) {
                hcclDataType_t dt = dtypes[di];
                size_t count = (size_t)counts[ci], esz = hccl_dtype_size(dt);
                bool in_place = seed & 1;
                void *sbuf[MAXR], *rbuf[MAXR];
                test_op_t t[MAXR];
                for (int r = 0; r < n; r++) {
                    sbuf[r] = malloc(count * esz);
                    rbuf[r] = in_place ? sbuf[r] : calloc(count, esz);
                    for (size_t i = 0; i < count; i++)
                        ref_store(sbuf[r], i, dt, ref_input(dt, ops[oi], r, i, seed));
                    op_init(&t[r], HCCL_COLL_ALLREDUCE, sbuf[r], rbuf[r], count, dt, ops[oi]);
                }
                /* Ranks arrive one by one: nobody finishes before the last block. */
                for (int r = 0; r < n; r++) {
                    hccl_lane_enqueue(w->lane[r], &t[r].op);
                    drive(w);
                    for (int q = 0; q <= r; q++)
                        assert_int_equal(t[q].done, r == n - 1);
                }
                for (int r = 0; r < n; r++) {
                    assert_int_equal(t[r].res, hcclSuccess);
                    assert_int_equal(t[r].op.grouped, grouped);
                    if (grouped)
                        assert_true(w->win->raised(w->wctx[0], r, HCCL_WINDOW_GPART, t[r].op.lseq));
                    if (memcmp(rbuf[r], rbuf[0], count * esz) != 0)
                        fail_msg("n=%d %s %s count %zu: rank %d's result differs from rank 0's", n,
                                 hccl_dtype_name(dt), hccl_op_name(ops[oi]), count, r);
                    for (size_t i = 0; i < count; i++) {
                        double got = ref_load(rbuf[r], i, dt), want = ref_reduce(dt, ops[oi], n, i, seed);
                        if (!ref_close(dt, got, want))
                            fail_msg("n=%d %s %s count %zu elem %zu: got %g want %g", n,
                                     hccl_dtype_name(dt), hccl_op_name(ops[oi]), count, i, got, want);
                    }
                }
                for (int r = 0; r < n; r++) {
                    if (!in_place)
                        free(rbuf[r]);
                    free(sbuf[r]);
                }
            }
        }
    }
}

/* Every dtype and op at several rank counts, flat and split. */
static void test_allreduce_every_type(void **state)
{
    const int ranks[] = {2, 3, 5, 8};

    (void)state;
    for (size_t ni = 0; ni < 2 * sizeof(ranks) / sizeof(ranks[0]); ni++) {
        world_t *w = world_new_split(ranks[ni / 2], HCCL_WINDOW_CAP, ni % 2 ? 0 : HCCL_LANE_FLAT_MAX);
        allreduce_every_type(w, false);
        world_free(w);
    }
}

/* Without group_always, rank 0 chooses per size class and every rank follows, whether it
 * publishes before rank 0 rewrote the class's word or after. A class run back to back is timed
 * and tried grouped; one whose operations never follow each other stays plain. */
static void test_allreduce_group_choice(void **state)
{
    enum { N = 4, OPS = 90, RUN = 50 };
    static const int group_of[N] = {0, 1, 0, 1};
    static const size_t counts[2] = {70000, 3000};
    world_t *w = world_new_groups(N, HCCL_WINDOW_CAP, 0, group_of, false);
    static float in[N][70000], out[N][70000];
    int seen = 0, tried = 0;

    (void)state;
    for (int k = 0; k < OPS; k++) {
        /* RUN operations of class A back to back, then A and B in turn */
        int cls = k < RUN ? 0 : k % 2;
        size_t count = counts[cls];
        test_op_t t[N];
        for (int r = 0; r < N; r++) {
            for (size_t i = 0; i < count; i++)
                in[r][i] = (float)((r + 1) * (int)(i % 97) + k);
            op_init(&t[r], HCCL_COLL_ALLREDUCE, in[r], out[r], count, hcclFloat32, hcclSum);
        }
        /* Rank 0 last (the others read the word it wrote at the class's last operation), or
         * first (they read the one it wrote publishing this one). */
        for (int i = 0; i < N; i++)
            hccl_lane_enqueue(w->lane[k % 2 ? i : N - 1 - i], &t[k % 2 ? i : N - 1 - i].op);
        drive(w);
        for (int r = 0; r < N; r++) {
            assert_int_equal(t[r].done, 1);
            assert_int_equal(t[r].res, hcclSuccess);
            assert_int_equal(t[r].op.grouped, t[0].op.grouped);
            for (size_t i = 0; i < count; i++)
                assert_true(out[r][i] == (float)(10 * (int)(i % 97) + 4 * k));
        }
        if (cls == 1) {
            assert_false(t[0].op.grouped);
            continue;
        }
        /* Class A: 32 plain (the first two warm up), then a try of six grouped (the first two
         * warm up). */
        if (seen < 38)
            assert_int_equal(t[0].op.grouped, seen >= 32);
        tried += t[0].op.grouped;
        seen++;
    }
    assert_true(tried >= 6);
    world_free(w);
}

/* A grouped operation says which ranks it waits for: the other CPU's sums, then its own
 * CPU's parts. */
static void test_grouped_waiting_for(void **state)
{
    enum { N = 4, C = 1000 };
    static const int group_of[N] = {0, 1, 0, 1};
    world_t *w = world_new_groups(N, HCCL_WINDOW_CAP, 0, group_of, true);
    static int32_t in[N][C], out[N][C];
    test_op_t t[N];
    char buf[64];

    (void)state;
    for (int r = 0; r < N; r++) {
        for (int i = 0; i < C; i++)
            in[r][i] = r * 1000 + i;
        op_init(&t[r], HCCL_COLL_ALLREDUCE, in[r], out[r], C, hcclInt32, hcclSum);
    }
    /* Each enqueue polls its own lane once: rank 3 comes last and sums its CPU's blocks; rank
     * 1's sum is not in until it is polled again. */
    hccl_lane_enqueue(w->lane[0], &t[0].op);
    hccl_lane_enqueue(w->lane[2], &t[2].op);
    assert_true(hccl_lane_waiting_for(w->lane[0], &t[0].op, buf, sizeof(buf)));
    assert_string_equal(buf, "1, 3");
    hccl_lane_enqueue(w->lane[1], &t[1].op);
    hccl_lane_enqueue(w->lane[3], &t[3].op);
    hccl_lane_poll(w->lane[0]);
    assert_true(t[0].op.grouped && t[0].op.part_done && !t[0].op.final_done);
    assert_true(hccl_lane_waiting_for(w->lane[0], &t[0].op, buf, sizeof(buf)));
    assert_string_equal(buf, "1");
    /* Rank 2 has not summed its share yet either: rank 0 then waits for its part. */
    hccl_lane_poll(w->lane[1]);
    hccl_lane_poll(w->lane[0]);
    assert_true(t[0].op.final_done && !t[0].done);
    assert_true(hccl_lane_waiting_for(w->lane[0], &t[0].op, buf, sizeof(buf)));
    assert_string_equal(buf, "2");
    drive(w);
    for (int r = 0; r < N; r++) {
        assert_int_equal(t[r].done, 1);
        for (int i = 0; i < C; i++)
            assert_int_equal(out[r][i], 6000 + 4 * i);
    }
    world_free(w);
}

/* A lane world's ranks and CPU groups, and whether split AllReduces run grouped on it. */
typedef struct {
    int n;
    int group_of[MAXR];
    bool grouped;
} layout_t;

/* Split AllReduce by CPU group: groups of unequal sizes, a rank alone in its group, more
 * groups than two, and groupings where nothing is grouped (one group; every rank alone). */
static void test_allreduce_grouped(void **state)
{
    static const layout_t cases[] = {
        {2, {0, 1}, false},
        {3, {0, 0, 0}, false},
        {3, {0, 1, 0}, true},
        {4, {1, 0, 1, 0}, true},
        {5, {0, 1, 2, 0, 1}, true},
        {8, {0, 1, 0, 1, 0, 1, 0, 1}, true},
        {8, {0, 0, 0, 0, 0, 1, 1, 2}, true},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        world_t *w = world_new_groups(cases[i].n, HCCL_WINDOW_CAP, 0, cases[i].group_of, true);
        allreduce_every_type(w, cases[i].grouped);
        world_free(w);
    }
}

/* Several operations queued at once on some ranks and one at a time on others: results come
 * out in order. */
static void test_queued_in_order(void **state)
{
    enum { N = 4, K = 9 };
    world_t *w = world_new(N, 64);
    int32_t in[N][K][4], out[N][K][4];
    test_op_t t[N][K];

    (void)state;
    for (int r = 0; r < N; r++)
        for (int k = 0; k < K; k++) {
            for (int i = 0; i < 4; i++)
                in[r][k][i] = 1000 * k + 10 * r + i;
            op_init(&t[r][k], k % 3 == 2 ? HCCL_COLL_BARRIER : HCCL_COLL_ALLREDUCE, in[r][k], out[r][k],
                    4, hcclInt32, hcclSum);
        }
    /* Rank 0 queues everything, then the others come one operation at a time. */
    for (int k = 0; k < K; k++)
        hccl_lane_enqueue(w->lane[0], &t[0][k].op);
    assert_false(hccl_lane_idle(w->lane[0]));
    for (int k = 0; k < K; k++) {
        for (int r = 1; r < N; r++)
            hccl_lane_enqueue(w->lane[r], &t[r][k].op);
        drive(w);
        for (int r = 0; r < N; r++)
            for (int j = 0; j < K; j++)
                assert_int_equal(t[r][j].done, j <= k);
    }
    for (int r = 0; r < N; r++) {
        assert_true(hccl_lane_idle(w->lane[r]));
        for (int k = 0; k < K; k++) {
            if (k % 3 == 2)
                continue;
            for (int i = 0; i < 4; i++)
                assert_int_equal(out[r][k][i], N * (1000 * k + i) + 10 * (N * (N - 1) / 2));
        }
    }
    world_free(w);
}

/*
 * Operations queued several at a time: the next one publishes while its predecessor waits for
 * parts or releases, into the slot of the one before, which a peer may still be gathering
 * from. Each kind of operation follows each other kind (a grouped AllReduce writes its group's
 * sum into its block; a block that only moves is read while its owner is a step ahead), ranks
 * arrive in a random order and poll in random turns, and every result is checked.
 */
enum { AH_K = 18, AH_C = 700 };
static int32_t ah_in[MAXR][AH_K][MAXR * AH_C], ah_out[MAXR][AH_K][MAXR * AH_C];

static uint32_t ah_rand(uint32_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    return *x;
}

static int ah_coll(int k)
{
    static const int colls[] = {HCCL_COLL_ALLREDUCE, HCCL_COLL_ALLGATHER, HCCL_COLL_ALLTOALL,
                                HCCL_COLL_BROADCAST, HCCL_COLL_REDUCESCATTER, HCCL_COLL_REDUCE};
    return colls[k % 6];
}

/* Elements per rank of operation k (per peer for AlltoAll, per share for ReduceScatter). */
static size_t ah_count(int k)
{
    int coll = ah_coll(k);

    return coll == HCCL_COLL_ALLTOALL ? 100 : coll == HCCL_COLL_REDUCESCATTER ? 150 : 600;
}

static int32_t ah_value(int k, int r, size_t i)
{
    return 100000 * k + 1000 * r + (int32_t)i;
}

static void ah_check(int n, int k, int r)
{
    int coll = ah_coll(k), root = k % n;
    size_t count = ah_count(k);
    const int32_t *out = coll == HCCL_COLL_BROADCAST ? ah_in[r][k] : ah_out[r][k];

    for (size_t i = 0; i < count; i++) {
        int64_t sum = 0;
        for (int q = 0; q < n; q++)
            sum += ah_value(k, q, coll == HCCL_COLL_REDUCESCATTER ? (size_t)r * count + i : i);
        switch (coll) {
        case HCCL_COLL_ALLREDUCE:
        case HCCL_COLL_REDUCESCATTER:
            assert_int_equal(out[i], sum);
            break;
        case HCCL_COLL_REDUCE:
            assert_int_equal(out[i], r == root ? sum : -1);
            break;
        case HCCL_COLL_BROADCAST:
            assert_int_equal(out[i], ah_value(k, root, i));
            break;
        case HCCL_COLL_ALLGATHER:
            for (int q = 0; q < n; q++)
                assert_int_equal(out[(size_t)q * count + i], ah_value(k, q, i));
            break;
        case HCCL_COLL_ALLTOALL:
            for (int q = 0; q < n; q++)
                assert_int_equal(out[(size_t)q * count + i], ah_value(k, q, (size_t)r * count + i));
            break;
        }
    }
}

static void publish_ahead_run(world_t *w, uint32_t seed, int *ahead)
{
    int n = w->n, queued[MAXR] = {0}, idle = 0;
    static test_op_t t[MAXR][AH_K];

    for (int r = 0; r < n; r++)
        for (int k = 0; k < AH_K; k++) {
            int coll = ah_coll(k);
            for (size_t i = 0; i < (size_t)MAXR * AH_C; i++) {
                ah_in[r][k][i] = ah_value(k, r, i);
                ah_out[r][k][i] = -1;
            }
            op_init(&t[r][k], coll, ah_in[r][k], coll == HCCL_COLL_BROADCAST ? ah_in[r][k] : ah_out[r][k],
                    ah_count(k), hcclInt32, hcclSum);
            t[r][k].op.root = k % n;
        }
    for (int k = 0; k < AH_K; k++) /* rank 0 queues everything at once */
        hccl_lane_enqueue(w->lane[0], &t[0][k].op);
    queued[0] = AH_K;
    for (int left = n * AH_K; left > 0;) {
        int r = (int)(ah_rand(&seed) % (uint32_t)n);
        bool moved = false;
        if (queued[r] < AH_K && ah_rand(&seed) % 3 == 0) {
            hccl_lane_enqueue(w->lane[r], &t[r][queued[r]++].op);
            moved = true;
        }
        for (uint32_t p = ah_rand(&seed) % 3; p > 0; p--)
            moved |= hccl_lane_poll(w->lane[r]);
        for (int k = 0; k + 1 < queued[r]; k++)
            *ahead += !t[r][k].done && t[r][k + 1].op.published;
        left = 0;
        for (int q = 0; q < n; q++)
            for (int k = 0; k < AH_K; k++)
                left += !t[q][k].done;
        idle = moved ? 0 : idle + 1;
        if (idle > 1000) { /* every rank had turns: something must have moved */
            bool all_queued = true;
            for (int q = 0; q < n; q++)
                all_queued &= queued[q] == AH_K;
            assert_false(all_queued && drive(w) == 0 && left > 0);
            idle = 0;
        }
    }
    for (int r = 0; r < n; r++)
        for (int k = 0; k < AH_K; k++) {
            assert_int_equal(t[r][k].res, hcclSuccess);
            ah_check(n, k, r);
        }
}

static void test_publish_ahead(void **state)
{
    static const layout_t cases[] = {
        {4, {0, 1, 0, 1}, true},
        {3, {0, 1, 0}, true},
        {4, {0}, false},
        {2, {0}, false},
    };

    (void)state;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        int ahead = 0;
        for (uint32_t seed = 1; seed <= 24; seed++) {
            /* Split above 1 KiB: the AllReduces and Reduces of 600 int32 go through the parts. */
            world_t *w = world_new_groups(cases[c].n, HCCL_WINDOW_CAP, 1024,
                                          cases[c].grouped ? cases[c].group_of : NULL, cases[c].grouped);
            publish_ahead_run(w, seed * 2654435761u, &ahead);
            world_free(w);
        }
        assert_true(ahead > 0);
    }
}

/* What a timeout reports, a driver handing its operation over, and failure. */
static void test_wait_replace_fail(void **state)
{
    world_t *w = world_new(3, 64);
    int32_t a = 1, b = 2, c = 3, ra = 0, rb = 0, rc = 0;
    test_op_t t0, t0b, copy_holder, t1, t2;
    hccl_lane_op_t *copy = malloc(sizeof(*copy));
    char buf[128];

    (void)state;
    op_init(&t0, HCCL_COLL_ALLREDUCE, &a, &ra, 1, hcclInt32, hcclSum);
    op_init(&t0b, HCCL_COLL_BARRIER, NULL, NULL, 0, hcclUint8, hcclSum);
    hccl_lane_enqueue(w->lane[0], &t0.op);
    hccl_lane_enqueue(w->lane[0], &t0b.op);
    assert_true(hccl_lane_waiting_for(w->lane[0], &t0.op, buf, sizeof(buf)));
    assert_string_equal(buf, "1, 2");
    assert_true(hccl_lane_waiting_for(w->lane[0], &t0b.op, buf, sizeof(buf)));
    assert_string_equal(buf, "");
    op_init(&t2, HCCL_COLL_ALLREDUCE, &c, &rc, 1, hcclInt32, hcclSum);
    hccl_lane_enqueue(w->lane[2], &t2.op);
    drive(w);
    assert_true(hccl_lane_waiting_for(w->lane[0], &t0.op, buf, sizeof(buf)));
    assert_string_equal(buf, "1");
    assert_false(hccl_lane_waiting_for(w->lane[1], &t0.op, buf, sizeof(buf)));

    /* Rank 0's first operation changes hands: the copy is what completes. */
    op_init(&copy_holder, 0, NULL, NULL, 0, hcclUint8, hcclSum);
    hccl_lane_replace(w->lane[0], &t0.op, copy);
    copy->arg = &copy_holder;
    op_init(&t1, HCCL_COLL_ALLREDUCE, &b, &rb, 1, hcclInt32, hcclSum);
    hccl_lane_enqueue(w->lane[1], &t1.op);
    drive(w);
    assert_int_equal(t0.done, 0);
    assert_int_equal(copy_holder.done, 1);
    assert_int_equal(ra, 6);
    assert_int_equal(rb, 6);
    assert_int_equal(rc, 6);
    free(copy);

    /* The barrier waits for the others; failure ends it and refuses what comes later. */
    assert_int_equal(t0b.done, 0);
    hccl_lane_fail_all(w->lane[0], hcclRemoteError, "rank 2 died");
    assert_int_equal(t0b.done, 1);
    assert_int_equal(t0b.res, hcclRemoteError);
    assert_string_equal(t0b.msg, "rank 2 died");
    assert_true(hccl_lane_idle(w->lane[0]));
    op_init(&t0, HCCL_COLL_BARRIER, NULL, NULL, 0, hcclUint8, hcclSum);
    hccl_lane_enqueue(w->lane[0], &t0.op);
    assert_int_equal(t0.done, 1);
    assert_int_equal(t0.res, hcclRemoteError);
    world_free(w);
}

/* Ranks that called different collectives are told, on every rank that can see it. */
static void test_mismatch(void **state)
{
    world_t *w = world_new(2, 64);
    int32_t a[5] = {0}, b[5] = {0};
    test_op_t t0, t1;
    hccl_unexp_t held = {0};
    hccl_xfer_t sent;

    (void)state;
    op_init(&t0, HCCL_COLL_ALLREDUCE, a, a, 4, hcclInt32, hcclSum);
    op_init(&t1, HCCL_COLL_ALLREDUCE, b, b, 5, hcclInt32, hcclSum);
    hccl_lane_enqueue(w->lane[0], &t0.op);
    hccl_lane_enqueue(w->lane[1], &t1.op);
    drive(w);
    assert_int_equal(t0.done + t1.done, 0);
    for (int r = 0; r < 2; r++)
        assert_non_null(strstr(w->fatal[r], "collective mismatch"));
    assert_non_null(strstr(w->fatal[0], "collective mismatch at seq 0: rank 1 called allreduce(int32, sum)"));
    hccl_lane_fail_all(w->lane[0], hcclInvalidUsage, w->fatal[0]);
    hccl_lane_fail_all(w->lane[1], hcclInvalidUsage, w->fatal[1]);
    assert_int_equal(t0.res, hcclInvalidUsage);
    assert_int_equal(t1.res, hcclInvalidUsage);
    world_free(w);

    /* Rank 0 ran the call as a plan (it sent a message of that seq); rank 1 is on the lane. */
    w = world_new(2, 64);
    held.f.seq = 7;
    held.f.sig = hccl_sig_make(HCCL_COLL_ALLREDUCE, hcclInt32, hcclSum, -1, 100000);
    if (w->sim) { /* a send that waits for rank 1's receive */
        hccl_conn_t *c = hccl_sim_world_conns(w->sim, 0)[1];
        sent = (hccl_xfer_t){.seq = 7, .sig = held.f.sig, .peer = 1};
        assert_int_equal(c->ops->post_send(c, &sent), hcclSuccess);
    } else {
        w->conn[1][0].framer.unexp_head = &held;
    }
    op_init(&t1, HCCL_COLL_BARRIER, NULL, NULL, 0, hcclUint8, hcclSum);
    t1.op.seq = 7;
    hccl_lane_enqueue(w->lane[1], &t1.op);
    drive(w);
    assert_int_equal(t1.done, 0);
    assert_non_null(strstr(w->fatal[1], "collective mismatch at seq 7: rank 0 called allreduce"));
    assert_non_null(strstr(w->fatal[1], "(it sent a message of it), this rank barrier()"));
    w->conn[1][0].framer.unexp_head = NULL;
    world_free(w);
}

/* Broadcast, Reduce (flat and split), AllGather, ReduceScatter and AlltoAll, in place and not. */
static void test_other_collectives(void **state)
{
    enum { C = 600 }; /* int32 per rank: 2400 B, split above a flat limit of 1 KiB */
    (void)state;
    for (int n = 2; n <= 5; n += 3) {
        world_t *w = world_new_split(n, HCCL_WINDOW_CAP, 1024);
        static int32_t in[5][5 * C], out[5][5 * C];
        test_op_t t[5];
        static const int colls[] = {HCCL_COLL_BROADCAST, HCCL_COLL_REDUCE, HCCL_COLL_ALLGATHER,
                                    HCCL_COLL_REDUCESCATTER, HCCL_COLL_ALLTOALL};
        for (size_t ci = 0; ci < sizeof(colls) / sizeof(colls[0]); ci++) {
            for (size_t count = 1; count <= C; count += C - 1) {
                int coll = colls[ci], root = n - 1;
                for (int r = 0; r < n; r++) {
                    for (int i = 0; i < 5 * C; i++) {
                        in[r][i] = 1000 * r + i;
                        out[r][i] = -1;
                    }
                    /* Broadcast works in place: the root's buffer is both. */
                    op_init(&t[r], coll, in[r], coll == HCCL_COLL_BROADCAST ? in[r] : out[r], count, hcclInt32,
                            hcclSum);
                    t[r].op.root = root;
                }
                for (int r = n - 1; r >= 0; r--)
                    hccl_lane_enqueue(w->lane[r], &t[r].op);
                drive(w);
                for (int r = 0; r < n; r++) {
                    assert_int_equal(t[r].done, 1);
                    for (size_t i = 0; i < count; i++) {
                        int64_t sum_i = 0;
                        for (int q = 0; q < n; q++)
                            sum_i += 1000 * q + (int64_t)i;
                        switch (coll) {
                        case HCCL_COLL_BROADCAST:
                            assert_int_equal(in[r][i], 1000 * root + (int)i);
                            break;
                        case HCCL_COLL_REDUCE:
                            assert_int_equal(out[r][i], r == root ? sum_i : -1);
                            break;
                        case HCCL_COLL_ALLGATHER:
                            for (int q = 0; q < n; q++)
                                assert_int_equal(out[r][(size_t)q * count + i], 1000 * q + (int)i);
                            break;
                        case HCCL_COLL_REDUCESCATTER: {
                            int64_t want = 0;
                            for (int q = 0; q < n; q++)
                                want += 1000 * q + (int64_t)((size_t)r * count + i);
                            assert_int_equal(out[r][i], want);
                            break;
                        }
                        case HCCL_COLL_ALLTOALL:
                            for (int q = 0; q < n; q++)
                                assert_int_equal(out[r][(size_t)q * count + i],
                                                 1000 * q + (int)((size_t)r * count + i));
                            break;
                        }
                    }
                }
            }
        }
        world_free(w);
    }
}

/* A split operation waits for every block, then for every part, and says which. */
static void test_split_waits(void **state)
{
    world_t *w = world_new_split(3, HCCL_WINDOW_CAP, 0);
    int32_t in[3][5], out[3][5];
    test_op_t t[3];
    char buf[64];

    (void)state;
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < 5; i++)
            in[r][i] = 10 * r + i;
        op_init(&t[r], HCCL_COLL_ALLREDUCE, in[r], out[r], 5, hcclInt32, hcclSum);
    }
    hccl_lane_enqueue(w->lane[0], &t[0].op);
    hccl_lane_enqueue(w->lane[1], &t[1].op);
    assert_true(hccl_lane_waiting_for(w->lane[1], &t[1].op, buf, sizeof(buf)));
    assert_string_equal(buf, "2");
    hccl_lane_enqueue(w->lane[2], &t[2].op); /* all blocks in: rank 2 publishes its part */
    assert_true(hccl_lane_waiting_for(w->lane[2], &t[2].op, buf, sizeof(buf)));
    assert_string_equal(buf, "0, 1");
    assert_true(hccl_lane_poll(w->lane[1]));
    assert_true(hccl_lane_waiting_for(w->lane[1], &t[1].op, buf, sizeof(buf)));
    assert_string_equal(buf, "0");
    drive(w);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(t[r].done, 1);
        for (int i = 0; i < 5; i++)
            assert_int_equal(out[r][i], 30 + 3 * i);
    }
    world_free(w);
}

static void on_fatal_any(void *arg, hcclResult_t res, const char *msg)
{
    snprintf(arg, 512, "%d %s", (int)res, msg);
}

/* Every rank of w can read every other's memory (all are this process), and AlltoAll blocks
 * of at least direct_min bytes are read where their owner left them. */
static void world_go_direct(world_t *w, size_t direct_min, int fds[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    for (int r = 0; !w->sim && r < w->n; r++) {
        atomic_store(&((shm_seg_hdr_t *)w->seg[r])->reads_all, 1);
        for (int p = 0; p < w->n; p++) {
            w->conn[r][p].pid = getpid();
            w->conn[r][p].out_fd = fds[0]; /* open and silent: the peer lives */
        }
    }
    for (int r = 0; r < w->n; r++) {
        hccl_lane_destroy(w->lane[r]);
        assert_int_equal(hccl_lane_create(w->win, w->wctx[r], r, w->n,
                                          &(hccl_lane_limits_t){HCCL_WINDOW_CAP, HCCL_LANE_FLAT_MAX, 0,
                                                                HCCL_WINDOW_CAP, direct_min, NULL, false, 0},
                                          on_fatal_any, &w->fatal[r], &w->lane[r]),
                         hcclSuccess);
        if (w->sim)
            w->win->on_bell(w->wctx[r], hccl_lane_poll, w->lane[r]);
    }
}

/* AlltoAll blocks read single-copy from their owners' buffers, next to one copied through its
 * slot (in place): right everywhere, and an owner finishes only once every reader released it. */
static void test_alltoall_direct(void **state)
{
    enum { N = 3, C = 5000 };
    world_t *w = world_new(N, HCCL_WINDOW_CAP);
    static int32_t in[N][N * C], out[N][N * C];
    test_op_t t[N];
    char buf[64];
    int fds[2];

    (void)state;
    {
        /* A sandbox that refuses process_vm_readv even on ourselves: the lane never goes
         * direct there (its start-up probe fails), so there is nothing to test. */
        int word = 1, got = 0;
        struct iovec l = {&got, sizeof(got)}, r = {&word, sizeof(word)};
        if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != (ssize_t)sizeof(got)) {
            world_free(w);
            skip();
        }
    }
    world_go_direct(w, 4096, fds);
    for (int r = 0; r < N; r++) {
        for (int i = 0; i < N * C; i++) {
            in[r][i] = 100000 * r + i;
            out[r][i] = -1;
        }
        op_init(&t[r], HCCL_COLL_ALLTOALL, in[r], r == 1 ? in[r] : out[r], C, hcclInt32, hcclSum);
    }
    hccl_lane_enqueue(w->lane[0], &t[0].op);
    hccl_lane_enqueue(w->lane[1], &t[1].op);
    drive(w);
    assert_true(t[0].op.direct);
    assert_false(t[1].op.direct); /* in place: peers would read what it overwrites */
    hccl_lane_enqueue(w->lane[2], &t[2].op);
    assert_true(t[2].op.direct);
    /* Rank 2 has read everything and released rank 0; its own block is still being read. */
    assert_int_equal(t[2].done, 0);
    assert_true(hccl_lane_waiting_for(w->lane[2], &t[2].op, buf, sizeof(buf)));
    assert_string_equal(buf, "0, 1");
    drive(w);
    for (int r = 0; r < N; r++) {
        const int32_t *got = r == 1 ? in[r] : out[r];
        assert_int_equal(t[r].done, 1);
        assert_int_equal(t[r].res, hcclSuccess);
        for (int q = 0; q < N; q++)
            for (int i = 0; i < C; i++)
                assert_int_equal(got[q * C + i], 100000 * q + r * C + i);
    }
    /* Below direct_min, and a block whose address cannot be read: the reader's lane stops and
     * says whose block it was. */
    for (int r = 0; r < N; r++)
        op_init(&t[r], HCCL_COLL_ALLTOALL, in[r], out[r], 100, hcclInt32, hcclSum);
    hccl_lane_enqueue(w->lane[0], &t[0].op);
    assert_false(t[0].op.direct);
    drive(w);
    hccl_lane_enqueue(w->lane[1], &t[1].op);
    hccl_lane_enqueue(w->lane[2], &t[2].op);
    drive(w);
    for (int r = 0; r < N; r++)
        assert_int_equal(t[r].done, 1);
    for (int r = 0; r < N; r++)
        op_init(&t[r], HCCL_COLL_ALLTOALL, in[r], out[r], C, hcclInt32, hcclSum);
    if (w->sim) { /* a read that fails is shm's alone */
        for (int r = 0; r < N; r++)
            hccl_lane_enqueue(w->lane[r], &t[r].op);
        drive(w);
        for (int r = 0; r < N; r++)
            assert_int_equal(t[r].done, 1);
        goto out;
    }
    hccl_lane_enqueue(w->lane[0], &t[0].op);
    ((shm_window_slot_t *)((char *)w->seg[0] + SHM_SEG_HDR_BYTES) + (t[0].op.lseq & 1))->addr = 4096;
    hccl_lane_enqueue(w->lane[2], &t[2].op); /* reads rank 0's block first */
    assert_int_equal(t[2].done, 0);
    assert_non_null(strstr(w->fatal[2], "rank 0's window block"));
    assert_int_equal(atoi(w->fatal[2]), hcclRemoteError);
    hccl_lane_fail_all(w->lane[2], hcclRemoteError, "stopped");
    assert_int_equal(t[2].res, hcclRemoteError);
out:
    close(fds[0]);
    close(fds[1]);
    world_free(w);
}

static void test_takes(void **state)
{
    world_t *w = world_new(2, 100);

    (void)state;
    assert_false(hccl_lane_takes(NULL, HCCL_COLL_BARRIER, 0));
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_BARRIER, 0));
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLREDUCE, 100));
    assert_false(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLREDUCE, 101));
    assert_false(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLREDUCE, 0));
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_BROADCAST, 8));
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_REDUCE, 8));
    assert_int_equal(hccl_lane_call_bytes(HCCL_COLL_ALLGATHER, 5, hcclInt32, 3), 20);
    assert_int_equal(hccl_lane_call_bytes(HCCL_COLL_REDUCESCATTER, 5, hcclInt32, 3), 60);
    assert_int_equal(hccl_lane_call_bytes(HCCL_COLL_ALLTOALL, 5, hcclInt64, 3), 120);
    assert_int_equal(hccl_lane_call_bytes(HCCL_COLL_ALLTOALL, SIZE_MAX / 4, hcclInt64, 3), SIZE_MAX);
    assert_int_equal(hccl_lane_call_bytes(HCCL_COLL_ALLTOALLV, 5, hcclInt32, 3), SIZE_MAX);
    assert_false(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLTOALLV, SIZE_MAX));
    /* Where ranks share CPUs, small rooted calls keep to plans. */
    hccl_lane_destroy(w->lane[0]);
    assert_int_equal(hccl_lane_create(w->win, w->wctx[0], 0, 2, &(hccl_lane_limits_t){4096, 2048, 1024, 8192, SIZE_MAX, NULL, false, 0},
                                      on_fatal,
                                      &w->fatal[0], &w->lane[0]),
                     hcclSuccess);
    assert_false(hccl_lane_takes(w->lane[0], HCCL_COLL_BROADCAST, 1023));
    assert_false(hccl_lane_takes(w->lane[0], HCCL_COLL_REDUCE, 512));
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_REDUCE, 1024));
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_BROADCAST, 8192));
    assert_false(hccl_lane_takes(w->lane[0], HCCL_COLL_BROADCAST, 8193));
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLGATHER, 512));
    assert_false(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLGATHER, 4097));
    world_free(w);
    w = world_new(2, SIZE_MAX);
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLREDUCE, HCCL_WINDOW_CAP));
    assert_false(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLREDUCE, HCCL_WINDOW_CAP + 1));
    world_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce_every_type),
        cmocka_unit_test(test_allreduce_grouped),
        cmocka_unit_test(test_allreduce_group_choice),
        cmocka_unit_test(test_grouped_waiting_for),
        cmocka_unit_test(test_queued_in_order),
        cmocka_unit_test(test_publish_ahead),
        cmocka_unit_test(test_wait_replace_fail),
        cmocka_unit_test(test_other_collectives),
        cmocka_unit_test(test_split_waits),
        cmocka_unit_test(test_alltoall_direct),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_takes),
    };
    int failed = cmocka_run_group_tests_name("lane over the shm window", tests, NULL, NULL);

    over_sim = true;
    return failed + cmocka_run_group_tests_name("lane over the sim window", tests, NULL, NULL);
}
