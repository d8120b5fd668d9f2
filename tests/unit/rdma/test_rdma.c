/*
 * The rdma link over a model of verbs and rdma_cm (verbs_model.c): two ranks in one process,
 * each with its own reactor driven by the test; set-up runs a thread per rank (it blocks until
 * both sides meet). The wire moves only when the test pumps it (or at once in auto mode), so a
 * sender that ignores its credits overruns the receiver's posted slots and the model counts it.
 * Every test ends with every verbs object released and no verbs rule broken.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "links/link.h"
#include "links/rdma/rdma.h"
#include "verbs_model.h"

#define MAX_STEPS 100000
#define NX 64

typedef struct {
    hccl_xfer_t x;      /* first: the callback casts back */
    int ndone;
    hcclResult_t res;
} xf_t;

typedef struct {
    hccl_reactor_t *r;
    hccl_link_env_t env;
    hccl_params_t params;
    void *ctx;
    hccl_conn_t *conns[2];
    hcclResult_t conn_res;
    int fatal;
    char fatal_msg[512];
} rank_t;

static hccl_card_t cards[2];
static rank_t ranks[2];
static const hccl_link_ops_t *ops = &hccl_link_rdma_ops;

static void on_fatal(void *arg, hcclResult_t res, const char *msg)
{
    rank_t *rk = arg;

    (void)res;
    if (!rk->fatal++)
        snprintf(rk->fatal_msg, sizeof(rk->fatal_msg), "%s", msg);
}

static void xf_done(hccl_xfer_t *x, hcclResult_t res)
{
    xf_t *f = (xf_t *)x;

    f->ndone++;
    f->res = res;
}

static hcclResult_t rank_init(int r)
{
    rank_t *rk = &ranks[r];

    memset(rk, 0, sizeof(*rk));
    if (hccl_reactor_create(NULL, r, &rk->r) != hcclSuccess)
        return hcclSystemError;
    rk->params.buffsize = 64u << 10; /* 4 KiB slots */
    rk->params.connect_timeout_ms = 10000;
    rk->env.rank = r;
    rk->env.nranks = 2;
    rk->env.comm_id = 0x1234;
    memset(rk->env.secret, 7, sizeof(rk->env.secret));
    rk->env.reactor = rk->r;
    rk->env.params = &rk->params;
    rk->env.cards = cards;
    rk->env.on_fatal = on_fatal;
    rk->env.fatal_arg = rk;
    memset(&cards[r], 0, sizeof(cards[r]));
    cards[r].rank = (uint32_t)r;
    return ops->init(&rk->env, cards[r].blob[HCCL_LINK_RDMA], &rk->ctx);
}

static int64_t connect_deadline_ms = 10000;

static void *connect_thread(void *arg)
{
    rank_t *rk = arg;
    int peer = 1 - rk->env.rank;

    if (rk->env.rank == 0)
        model_set_victim(true);
    rk->conn_res = ops->connect(rk->ctx, &peer, 1, hccl_now_ms() + connect_deadline_ms, rk->conns);
    model_set_victim(false);
    return NULL;
}

static void connect_both(void)
{
    pthread_t t[2];

    for (int r = 0; r < 2; r++)
        assert_int_equal(pthread_create(&t[r], NULL, connect_thread, &ranks[r]), 0);
    for (int r = 0; r < 2; r++)
        pthread_join(t[r], NULL);
}

static void world_up(void)
{
    model_reset(1, true);
    hccl_rdma_shim = &model_shim;
    for (int r = 0; r < 2; r++)
        assert_int_equal(rank_init(r), hcclSuccess);
    assert_true(ops->reaches(&cards[0], &cards[1]));
    connect_both();
    assert_int_equal(ranks[0].conn_res, hcclSuccess);
    assert_int_equal(ranks[1].conn_res, hcclSuccess);
}

static void assert_released(void)
{
    model_live_t l = model_live();

    assert_int_equal(l.contexts, 0);
    assert_int_equal(l.pds, 0);
    assert_int_equal(l.cqs, 0);
    assert_int_equal(l.comp_channels, 0);
    assert_int_equal(l.mrs, 0);
    assert_int_equal(l.qps, 0);
    assert_int_equal(l.ids, 0);
    assert_int_equal(l.cm_channels, 0);
    assert_int_equal(l.cm_events, 0);
    if (model_stats().violations)
        fail_msg("verbs rule broken: %s", model_violation_text());
}

static void world_down(bool graceful)
{
    model_auto_pump(true);
    for (int r = 0; r < 2 && graceful; r++)
        ops->shutdown(ranks[r].ctx, hccl_now_ms() + 5000);
    for (int r = 0; r < 2; r++) {
        ops->fini(ranks[r].ctx);
        hccl_reactor_destroy(ranks[r].r);
    }
    hccl_rdma_shim = &hccl_rdma_shim_real;
    assert_released();
}

/* Moves the wire and runs both reactors until done() or the step bound. */
static bool drive_until(bool (*done)(void *), void *arg, bool drive1)
{
    for (int i = 0; i < MAX_STEPS; i++) {
        model_pump();
        hccl_reactor_drive(ranks[0].r, 0);
        if (drive1)
            hccl_reactor_drive(ranks[1].r, 0);
        if (done(arg))
            return true;
    }
    return false;
}

typedef struct { xf_t *xf; int n; } xfs_t;

static bool all_done(void *arg)
{
    xfs_t *s = arg;

    for (int i = 0; i < s->n; i++)
        if (!s->xf[i].ndone)
            return false;
    return true;
}

static bool never(void *arg)
{
    (void)arg;
    return false;
}

static void post(int r, bool send, xf_t *f, uint64_t seq, void *buf, size_t len)
{
    memset(f, 0, sizeof(*f));
    f->x.seq = seq;
    f->x.tag = 1;
    f->x.peer = 1 - r;
    f->x.buf = buf;
    f->x.len = len;
    f->x.done = xf_done;
    hccl_reactor_enter(ranks[r].r);
    if (send)
        assert_int_equal(ops->post_send(ranks[r].conns[1 - r], &f->x), hcclSuccess);
    else
        assert_int_equal(ops->post_recv(ranks[r].conns[1 - r], &f->x), hcclSuccess);
    hccl_reactor_leave(ranks[r].r);
}

static void test_hca_filter(void **state)
{
    (void)state;
    assert_true(hccl_rdma_hca_allowed(NULL, "mlx5_0", 1));
    assert_true(hccl_rdma_hca_allowed("mlx5_0:1,mlx5_1", "mlx5_0", 1));
    assert_false(hccl_rdma_hca_allowed("mlx5_0:1,mlx5_1", "mlx5_0", 2));
    assert_true(hccl_rdma_hca_allowed("mlx5_0:1,mlx5_1", "mlx5_1", 2));
    assert_true(hccl_rdma_hca_allowed("mlx5", "mlx5_3", 1));      /* a prefix */
    assert_false(hccl_rdma_hca_allowed("=mlx5", "mlx5_3", 1));    /* exact names */
    assert_true(hccl_rdma_hca_allowed("=mlx5_3", "mlx5_3", 1));
    assert_false(hccl_rdma_hca_allowed("^mlx5_0", "mlx5_0", 1));  /* excluded */
    assert_true(hccl_rdma_hca_allowed("^mlx5_0", "rxe0", 1));
    assert_false(hccl_rdma_hca_allowed("^=mlx5", "mlx5", 1));
    assert_true(hccl_rdma_hca_allowed("^=mlx5", "mlx5_0", 1));
}

/* No device, a port down, or a device excluded: the card says so, init still succeeds. */
static void test_unavailable(void **state)
{
    (void)state;
    for (int k = 0; k < 3; k++) {
        model_reset(k == 0 ? 0 : 1, k != 1);
        hccl_rdma_shim = &model_shim;
        if (k == 2)
            setenv("HCCL_IB_HCA", "^rxe0", 1);
        assert_int_equal(rank_init(0), hcclSuccess);
        unsetenv("HCCL_IB_HCA");
        assert_false(((rdma_card_t *)cards[0].blob[HCCL_LINK_RDMA])->active);
        assert_false(ops->reaches(&cards[0], &cards[0]));
        ops->fini(ranks[0].ctx);
        hccl_reactor_destroy(ranks[0].r);
        hccl_rdma_shim = &hccl_rdma_shim_real;
        assert_released();
    }
}

static void test_setup_teardown(void **state)
{
    rdma_card_t *c;

    (void)state;
    world_up();
    c = (rdma_card_t *)cards[0].blob[HCCL_LINK_RDMA];
    assert_true(c->active);
    assert_string_equal(c->dev, "rxe0");
    assert_int_equal(c->gid_index, 1); /* the IPv4-mapped GID */
    assert_int_equal(model_live().qps, 2);
    assert_int_equal(model_live().ids, 4); /* two listeners, two connections */
    assert_non_null(ranks[0].conns[1]);
    assert_non_null(ranks[1].conns[0]);
    world_down(true);
    assert_int_equal(ranks[0].fatal + ranks[1].fatal, 0);
}

/*
 * 60 messages while the receiver does not run: the sender must stop at its credits (the
 * model counts a message that finds no posted receive). Then the receiver runs and all arrive.
 */
static void test_credits(void **state)
{
    static xf_t xf[2][60];
    static char src[60][3000], dst[60][3000];
    xfs_t all = {&xf[0][0], 120};
    model_stats_t st;

    (void)state;
    world_up();
    for (int i = 0; i < 60; i++) {
        memset(src[i], 'a' + i % 26, sizeof(src[i]));
        post(0, true, &xf[0][i], (uint64_t)i, src[i], sizeof(src[i]));
    }
    drive_until(never, NULL, false);
    st = model_stats();
    assert_int_equal(st.rnr, 0);
    assert_true(st.sends <= RDMA_CREDITS);
    assert_true(st.sends > 0);
    for (int i = 0; i < 60; i++)
        post(1, false, &xf[1][i], (uint64_t)i, dst[i], sizeof(dst[i]));
    assert_true(drive_until(all_done, &all, true));
    for (int i = 0; i < 60; i++) {
        assert_int_equal(xf[0][i].res, hcclSuccess);
        assert_int_equal(xf[1][i].res, hcclSuccess);
        assert_memory_equal(src[i], dst[i], sizeof(src[i]));
    }
    st = model_stats();
    assert_int_equal(st.rnr, 0);
    /* Idle again: armed and drained, and no polling beyond what the events explain. */
    assert_true(model_cqs_quiet());
    assert_true(st.empty_polls <= st.cq_events + 4);
    world_down(true);
}

/* Receives in flight both ways at once, many per CQ event: completions come in batches. */
static void test_cq_batches(void **state)
{
    static xf_t xf[4][NX];
    static char buf[4][NX][512];
    xfs_t all = {&xf[0][0], 4 * NX};
    model_stats_t st;

    (void)state;
    world_up();
    for (int i = 0; i < NX; i++) {
        for (int j = 0; j < 512; j++)
            buf[0][i][j] = (char)(i + j), buf[2][i][j] = (char)(i * 3 + j);
        post(1, false, &xf[1][i], (uint64_t)i, buf[1][i], 512);
        post(0, false, &xf[3][i], (uint64_t)i, buf[3][i], 512);
        post(0, true, &xf[0][i], (uint64_t)i, buf[0][i], 512);
        post(1, true, &xf[2][i], (uint64_t)i, buf[2][i], 512);
    }
    assert_true(drive_until(all_done, &all, true));
    for (int i = 0; i < NX; i++) {
        assert_memory_equal(buf[0][i], buf[1][i], 512);
        assert_memory_equal(buf[2][i], buf[3][i], 512);
    }
    st = model_stats();
    assert_int_equal(st.rnr, 0);
    assert_true(st.max_recv_backlog > 1); /* the model did hand out batches */
    assert_true(model_cqs_quiet());
    assert_true(st.empty_polls <= st.cq_events + 4);
    world_down(true);
}

static bool both_done(void *arg)
{
    xf_t *f = arg;

    return f[0].ndone && f[1].ndone;
}

static bool cts_arrived(void *arg)
{
    (void)arg;
    return model_stats().sends >= 1;
}

/*
 * An error completion fails the transfer with the peer and the status named, on both sides. A
 * small send completes once staged (like a socket write), so the write of a zero-copy transfer
 * is the one that fails here.
 */
static void test_error_completion(void **state)
{
    static xf_t xf[2];
    static char a[16384], b[16384];

    (void)state;
    world_up();
    ((rdma_ctx_t *)ranks[0].ctx)->zcopy_min = ((rdma_ctx_t *)ranks[1].ctx)->zcopy_min = 8192;
    post(1, false, &xf[1], 5, b, sizeof(b));
    assert_true(drive_until(cts_arrived, NULL, true));
    model_inject_error(IBV_WC_RETRY_EXC_ERR);
    post(0, true, &xf[0], 5, a, sizeof(a));
    assert_true(drive_until(both_done, xf, true));
    assert_int_equal(xf[0].res, hcclRemoteError);
    assert_int_equal(xf[1].res, hcclRemoteError);
    assert_int_equal(ranks[0].fatal, 1);
    assert_non_null(strstr(ranks[0].fatal_msg, "rank 1"));
    assert_non_null(strstr(ranks[0].fatal_msg, ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR)));
    assert_int_equal(ranks[1].fatal, 1);
    assert_non_null(strstr(ranks[1].fatal_msg, "rank 0"));
    world_down(false);
}

/* Large transfers are written into the receiver's registered buffer; the cache keeps them. */
static void test_zero_copy(void **state)
{
    static xf_t xf[2];
    enum { LEN = 64 << 10 };
    char *src = malloc(LEN), *arena = malloc(2 * LEN);
    rdma_ctx_t *c0, *c1;
    model_stats_t st;

    (void)state;
    world_up();
    c0 = ranks[0].ctx;
    c1 = ranks[1].ctx;
    c0->zcopy_min = c1->zcopy_min = 8192;
    for (int round = 0; round < 4; round++) {
        size_t len = round == 3 ? 2 * LEN - 4096 : LEN;
        /* The last round: a new sender buffer, and a receiver range that overlaps the old
         * registration with another length (the buffer was freed and its range reused). */
        char *s = round == 3 ? malloc(len) : src;
        for (size_t j = 0; j < len; j++)
            s[j] = (char)(j * 7 + (size_t)round);
        memset(arena, 0, 2 * LEN);
        if (round % 2 == 0) { /* clear-to-send before the send, then after it */
            post(1, false, &xf[1], (uint64_t)round, arena, len);
            post(0, true, &xf[0], (uint64_t)round, s, len);
        } else {
            post(0, true, &xf[0], (uint64_t)round, s, len);
            post(1, false, &xf[1], (uint64_t)round, arena, len);
        }
        assert_true(drive_until(both_done, xf, true));
        assert_int_equal(xf[0].res, hcclSuccess);
        assert_int_equal(xf[1].res, hcclSuccess);
        assert_int_equal(xf[1].x.moved, len);
        assert_memory_equal(s, arena, len);
        if (round == 3)
            free(s);
    }
    st = model_stats();
    assert_int_equal(st.writes_imm, 4);
    assert_int_equal(st.rnr, 0);
    assert_int_equal(c0->reg_misses, 2);  /* src, then the last round's buffer */
    assert_int_equal(c0->reg_hits, 2);
    assert_int_equal(c1->reg_misses, 2);  /* arena, then arena with another length */
    assert_int_equal(c1->reg_hits, 2);
    assert_true(model_cqs_quiet());
    world_down(true);
    free(src);
    free(arena);
}

/* Every verbs call of rank 0's set-up fails in turn: each run fails cleanly and releases all. */
static void test_fail_each_call(void **state)
{
    int n;

    (void)state;
    connect_deadline_ms = 300;
    for (n = 1; n < 200; n++) {
        hcclResult_t r0;
        model_reset(1, true);
        hccl_rdma_shim = &model_shim;
        model_fail_at(n);
        model_set_victim(true);
        r0 = rank_init(0);
        model_set_victim(false);
        assert_int_equal(rank_init(1), hcclSuccess);
        if (r0 == hcclSuccess && ((rdma_card_t *)cards[0].blob[HCCL_LINK_RDMA])->active)
            connect_both();
        else
            ranks[0].conn_res = hcclUnsupported;
        if (r0 == hcclSuccess)
            ops->fini(ranks[0].ctx);
        ops->fini(ranks[1].ctx);
        hccl_reactor_destroy(ranks[0].r);
        hccl_reactor_destroy(ranks[1].r);
        hccl_rdma_shim = &hccl_rdma_shim_real;
        assert_released();
        if (model_calls() < n)
            break; /* nothing failed: every call has had its turn */
    }
    assert_true(n > 10);
    assert_true(n < 200);
    connect_deadline_ms = 10000;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hca_filter),
        cmocka_unit_test(test_unavailable),
        cmocka_unit_test(test_setup_teardown),
        cmocka_unit_test(test_credits),
        cmocka_unit_test(test_cq_batches),
        cmocka_unit_test(test_error_completion),
        cmocka_unit_test(test_zero_copy),
        cmocka_unit_test(test_fail_each_call),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
