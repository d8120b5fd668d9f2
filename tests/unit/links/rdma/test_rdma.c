/*
 * The rdma link over a model of verbs and rdma_cm (rdma_harness.h): device choice, set-up and
 * teardown, the staged path with its credits (a sender that ignores them overruns the
 * receiver's posted slots and the model counts it), completions in batches, error completions,
 * every set-up call failing in turn, CQ events acknowledged in batches, and the staging slot
 * bounds. Every test ends with every verbs object released and no verbs rule broken. The
 * zero-copy path is in test_rdma_zcopy.c; failures in test_rdma_faults.c, test_rdma_conn.c and
 * test_rdma_proto.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rdma_harness.h"

#define NX 64

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
    set_zcopy_min(8192);
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

/* Every verbs call of rank 0's set-up fails in turn: each run fails cleanly and releases all. */
static void test_fail_each_call(void **state)
{
    int n;

    (void)state;
    /* A peer whose set-up failed never calls: its partner waits out the deadline. */
    connect_deadline_ms = 150;
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

/* Many CQ events: they are acknowledged in batches, never left to pile up. */
static void test_ack_batches(void **state)
{
    static xf_t xf[2];
    char a[64] = "a", b[64];

    (void)state;
    world_up();
    for (int i = 0; i < 2 * RDMA_ACK_BATCH; i++) {
        post(1, false, &xf[1], (uint64_t)i, b, sizeof(b));
        post(0, true, &xf[0], (uint64_t)i, a, sizeof(a));
        assert_true(drive_until(both_done, xf, true));
        assert_int_equal(xf[1].res, hcclSuccess);
    }
    assert_true(model_stats().cq_events >= 2 * RDMA_ACK_BATCH);
    for (int r = 0; r < 2; r++)
        assert_true(((rdma_ctx_t *)ranks[r].ctx)->unacked < RDMA_ACK_BATCH);
    world_down(true);
}

/* HCCL_BUFFSIZE sets the staging slots within [4 KiB, 64 KiB]; messages span slots. */
static void test_slot_bounds(void **state)
{
    static char a[70000], b[70000];
    static xf_t xf[2];
    size_t sizes[] = {16u << 20, 1024};
    size_t want[] = {64u << 10, 4096};

    (void)state;
    for (int k = 0; k < 2; k++) {
        model_reset(1, true);
        hccl_rdma_shim = &model_shim;
        for (int r = 0; r < 2; r++) {
            assert_int_equal(rank_init(r), hcclSuccess);
            ranks[r].params.buffsize = sizes[k];
        }
        connect_both();
        assert_int_equal(ranks[0].conn_res, hcclSuccess);
        assert_int_equal(((rdma_conn_t *)ranks[0].conns[1]->priv)->slot, want[k]);
        for (size_t j = 0; j < sizeof(a); j++)
            a[j] = (char)(j * 13 + (size_t)k);
        memset(b, 0, sizeof(b));
        post(1, false, &xf[1], 1, b, sizeof(b));
        post(0, true, &xf[0], 1, a, sizeof(a));
        assert_true(drive_until(both_done, xf, true));
        assert_int_equal(xf[1].res, hcclSuccess);
        assert_memory_equal(a, b, sizeof(a));
        world_down(true);
    }
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
        cmocka_unit_test(test_fail_each_call),
        cmocka_unit_test(test_ack_batches),
        cmocka_unit_test(test_slot_bounds),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
