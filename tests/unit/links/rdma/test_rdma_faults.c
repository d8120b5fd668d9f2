/*
 * The rdma link when verbs calls, allocations or the device fail (fault_shim.h in front of
 * the verbs model): at init, at set-up, and on the data path (posting a send, a receive, a
 * write, polling and arming the CQ, registering a buffer). Each failure fails what it must
 * (init, the connection, the transfers) with a message naming the call, and every verbs object
 * is released.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fault_shim.h"
#include "rdma_harness.h"

#define ZMIN 8192

static char big_a[16384], big_b[16384];

static rdma_ctx_t *ctx_of(int r) { return ranks[r].ctx; }
static rdma_conn_t *conn_of(int r) { return ranks[r].conns[1 - r]->priv; }
static rdma_card_t *card_of(int r) { return (rdma_card_t *)cards[r].blob[HCCL_LINK_RDMA]; }

static bool fatal0(void *arg) { (void)arg; return ranks[0].fatal > 0; }
static bool fatal1(void *arg) { (void)arg; return ranks[1].fatal > 0; }
static bool both_fatal(void *arg) { (void)arg; return ranks[0].fatal && ranks[1].fatal; }
static bool xf_done1(void *arg) { return ((xf_t *)arg)->ndone > 0; }
static bool cts_at0(void *arg) { (void)arg; return conn_of(0)->cts_held != NULL; }

static void assert_has(const char *text, const char *part)
{
    if (!strstr(text, part))
        fail_msg("\"%s\" does not say \"%s\"", text, part);
}

/* Rank 0 alone, initialised through the fault shim; returns init's result. */
static hcclResult_t init_faulty(void)
{
    hcclResult_t res;

    model_reset(1, true);
    hccl_rdma_shim = &fault_shim;
    res = rank_init(0);
    hccl_rdma_shim = &model_shim;
    return res;
}

static void down_one(hcclResult_t init_res)
{
    if (init_res == hcclSuccess)
        ops->fini(ranks[0].ctx);
    hccl_reactor_destroy(ranks[0].r);
    hccl_rdma_shim = &hccl_rdma_shim_real;
    assert_released();
    fault_reset();
}

/* Init fails cleanly when arming the CQ or a channel's fd fails; no usable address: inactive. */
static void test_init_faults(void **state)
{
    bool *sw[] = {&fault.req_notify_cq, &fault.bad_cm_fd, &fault.bad_comp_fd};
    const char *says[] = {"ibv_req_notify_cq", "event channel O_NONBLOCK",
                          "completion channel O_NONBLOCK"};
    hcclResult_t res;

    (void)state;
    for (int k = 0; k < 3; k++) {
        fault_reset();
        *sw[k] = true;
        res = init_faulty();
        assert_int_equal(res, hcclSystemError);
        assert_has(hccl_error_last(), says[k]);
        down_one(res);
    }
    /* The listener's address is on no device, or no GID can be read: rdma is unavailable. */
    for (int k = 0; k < 2; k++) {
        fault_reset();
        if (k == 0)
            fault.unbound_listener = true;
        else
            fault.query_gid = true;
        res = init_faulty();
        assert_int_equal(res, hcclSuccess);
        assert_false(card_of(0)->active);
        ops->shutdown(ranks[0].ctx, hccl_now_ms() + 1000); /* nothing to say goodbye to */
        {
            int peer = 1;
            assert_int_equal(ops->connect(ranks[0].ctx, &peer, 1, hccl_now_ms() + 1000, ranks[0].conns),
                             hcclUnsupported);
            assert_has(hccl_error_last(), "rdma has no active port");
        }
        down_one(res);
    }
}

/* ODP only where the provider says so; an old provider (no query_device_ex) means pinned. */
static void test_odp_probe(void **state)
{
    hcclResult_t res;

    (void)state;
    for (int k = 0; k < 2; k++) {
        fault_reset();
        fault.query_device_ex = k == 1;
        model_reset(1, true);
        model_set_odp(true);
        hccl_rdma_shim = &fault_shim;
        res = rank_init(0);
        hccl_rdma_shim = &model_shim;
        assert_int_equal(res, hcclSuccess);
        assert_true(card_of(0)->active);
        assert_int_equal(ctx_of(0)->odp, k == 0);
        down_one(res);
    }
}

/* HCCL_IB_GID_INDEX picks the GID; one without an IPv4 address leaves the port unused. */
static void test_gid_index(void **state)
{
    hcclResult_t res;

    (void)state;
    fault_reset();
    for (int k = 0; k < 3; k++) {
        setenv("HCCL_IB_GID_INDEX", k == 0 ? "1" : k == 1 ? "0" : "9", 1);
        res = init_faulty();
        unsetenv("HCCL_IB_GID_INDEX");
        assert_int_equal(res, hcclSuccess);
        assert_int_equal(card_of(0)->active, k == 0);
        if (k == 0)
            assert_int_equal(card_of(0)->gid_index, 1);
        down_one(res);
    }
}

/*
 * InfiniBand: the address is the host's IPv4 interface address (IPoIB); such a port does not
 * reach a RoCE one, reaches another InfiniBand one, and carries data. Without a readable GID
 * the port is not used.
 */
static void test_infiniband(void **state)
{
    static xf_t xf[2];
    char a[100] = "over ib", b[100];
    hcclResult_t res;

    (void)state;
    fault_reset();
    model_reset(1, true);
    model_set_infiniband(true);
    hccl_rdma_shim = &model_shim;
    for (int r = 0; r < 2; r++)
        assert_int_equal(rank_init(r), hcclSuccess);
    assert_int_equal(card_of(0)->link_layer, IBV_LINK_LAYER_INFINIBAND);
    assert_int_equal(card_of(0)->gid_index, 0);
    card_of(1)->link_layer = IBV_LINK_LAYER_ETHERNET;
    assert_false(ops->reaches(&cards[0], &cards[1]));
    card_of(1)->link_layer = IBV_LINK_LAYER_INFINIBAND;
    assert_true(ops->reaches(&cards[0], &cards[1]));
    connect_both();
    assert_int_equal(ranks[0].conn_res, hcclSuccess);
    assert_int_equal(ranks[1].conn_res, hcclSuccess);
    post(1, false, &xf[1], 1, b, sizeof(b));
    post(0, true, &xf[0], 1, a, sizeof(a));
    assert_true(drive_until(both_done, xf, true));
    assert_string_equal(b, "over ib");
    world_down(true);

    fault.query_gid = true;
    model_reset(1, true);
    model_set_infiniband(true);
    hccl_rdma_shim = &fault_shim;
    res = rank_init(0);
    assert_int_equal(res, hcclSuccess);
    assert_false(card_of(0)->active);
    down_one(res);
}

static void test_alloc_failures(void **state)
{
    hcclResult_t res;
    void *ctx;
    int peer = 1;

    (void)state;
    fault_reset();
    model_reset(1, true);
    hccl_rdma_shim = &model_shim;
    assert_int_equal(rank_init(0), hcclSuccess);
    ops->fini(ranks[0].ctx);
    for (long n = 1; n <= 2; n++) { /* the context, then its table of connections */
        hccl_alloc_fail_at(n);
        res = ops->init(&ranks[0].env, cards[0].blob[HCCL_LINK_RDMA], &ctx);
        hccl_alloc_fail_at(0);
        assert_int_equal(res, hcclSystemError);
        assert_has(hccl_error_last(), "out of memory");
    }
    hccl_reactor_destroy(ranks[0].r);
    assert_released();
    /* A connection's state, then its two staging buffers. */
    for (long n = 1; n <= 3; n++) {
        assert_int_equal(rank_init(0), hcclSuccess);
        assert_int_equal(rank_init(1), hcclSuccess);
        hccl_alloc_fail_at(n);
        res = ops->connect(ranks[0].ctx, &peer, 1, hccl_now_ms() + 1000, ranks[0].conns);
        hccl_alloc_fail_at(0);
        assert_int_equal(res, hcclSystemError);
        assert_has(hccl_error_last(), "out of memory");
        for (int r = 0; r < 2; r++) {
            ops->fini(ranks[r].ctx);
            hccl_reactor_destroy(ranks[r].r);
        }
    }
    hccl_rdma_shim = &hccl_rdma_shim_real;
    assert_released();
}

/* The acceptor's rdma_accept fails: it fails, and the connector hears a rejection. */
static void test_accept_fails(void **state)
{
    (void)state;
    fault_reset();
    model_reset(1, true);
    hccl_rdma_shim = &model_shim;
    for (int r = 0; r < 2; r++)
        assert_int_equal(rank_init(r), hcclSuccess);
    fault.accept = true;
    fault_on_rank(1);
    connect_both();
    assert_int_equal(ranks[1].conn_res, hcclSystemError);
    assert_has(ranks[1].conn_msg, "rdma_accept from rank 0");
    assert_int_equal(ranks[0].conn_res, hcclRemoteError);
    assert_has(ranks[0].conn_msg, "rank 1");
    assert_has(ranks[0].conn_msg, rdma_event_str(RDMA_CM_EVENT_REJECTED));
    for (int r = 0; r < 2; r++) {
        ops->fini(ranks[r].ctx);
        hccl_reactor_destroy(ranks[r].r);
    }
    hccl_rdma_shim = &hccl_rdma_shim_real;
    assert_released();
    fault_reset();
}

/* The reactor refuses the completion channel's fd: connect fails, nothing leaks. */
static void test_reactor_refuses(void **state)
{
    int fd, bad;

    (void)state;
    model_reset(1, true);
    hccl_rdma_shim = &model_shim;
    for (int r = 0; r < 2; r++)
        assert_int_equal(rank_init(r), hcclSuccess);
    bad = dup(0);
    close(bad); /* a number that is no open fd (set-up opens none) */
    fd = ctx_of(0)->comp_ch->fd;
    ctx_of(0)->comp_ch->fd = bad;
    connect_both();
    ctx_of(0)->comp_ch->fd = fd;
    assert_int_equal(ranks[0].conn_res, hcclSystemError);
    assert_has(ranks[0].conn_msg, "cannot register the channels");
    assert_int_equal(ranks[1].conn_res, hcclSuccess);
    world_down(false);
}

/* A failed post: the transfer and the connection fail, the peer hears the disconnection. */
static void check_failed(int r, xf_t *f, hcclResult_t res, const char *says)
{
    assert_true(drive_until(xf_done1, f, true));
    assert_int_equal(f->res, res);
    assert_true(drive_until(both_fatal, NULL, true));
    assert_int_equal(ranks[r].fatal, 1);
    assert_has(ranks[r].fatal_msg, says);
    assert_has(ranks[r].fatal_msg, r ? "rank 0" : "rank 1");
    assert_has(ranks[1 - r].fatal_msg, r ? "from rank 1" : "from rank 0"); /* flushed */
    world_down(false);
    fault_reset();
}

/* ibv_post_send fails for a staged message, a ready-to-send, a clear-to-send, a write. */
static void test_post_send_fails(void **state)
{
    static xf_t xf[2];
    char small[100] = "x";

    (void)state;
    fault_reset();
    world_up();
    fault.post_send_opcode = -2;
    fault_on_rank(0);
    post(0, true, &xf[0], 1, small, sizeof(small));
    check_failed(0, &xf[0], hcclRemoteError, "ibv_post_send to rank 1");

    world_up(); /* the ready-to-send of a zero-copy send */
    set_zcopy_min(ZMIN);
    fault.post_send_opcode = -2;
    fault_on_rank(0);
    post(0, true, &xf[0], 1, big_a, sizeof(big_a));
    check_failed(0, &xf[0], hcclRemoteError, "ibv_post_send to rank 1");

    world_up(); /* the clear-to-send of a zero-copy receive */
    set_zcopy_min(ZMIN);
    fault.post_send_opcode = -2;
    fault_on_rank(1);
    post(1, false, &xf[1], 1, big_b, sizeof(big_b));
    check_failed(1, &xf[1], hcclRemoteError, "ibv_post_send to rank 0");

    world_up(); /* the write */
    set_zcopy_min(ZMIN);
    post(1, false, &xf[1], 1, big_b, sizeof(big_b));
    assert_true(drive_until(cts_at0, NULL, true));
    fault.post_send_opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    fault_on_rank(0);
    post(0, true, &xf[0], 1, big_a, sizeof(big_a));
    check_failed(0, &xf[0], hcclRemoteError, "rdma write to rank 1");
}

/* The receiver cannot return credits: its connection fails, naming the call. */
static void test_credit_return_fails(void **state)
{
    static xf_t xf[2][RDMA_CREDITS];
    static char buf[2][RDMA_CREDITS][64];

    (void)state;
    fault_reset();
    world_up();
    fault.post_send_opcode = -2;
    fault_on_rank(1); /* rank 1 sends nothing but the credit return */
    for (int i = 0; i < RDMA_CREDITS; i++) {
        post(1, false, &xf[1][i], (uint64_t)i, buf[1][i], 64);
        post(0, true, &xf[0][i], (uint64_t)i, buf[0][i], 64);
    }
    assert_true(drive_until(both_fatal, NULL, true));
    assert_has(ranks[1].fatal_msg, "ibv_post_send to rank 0");
    assert_has(ranks[0].fatal_msg, "from rank 1");
    world_down(false);
    fault_reset();
}

/* Reposting a slot fails after a staged message was read, and after a clear-to-send. */
static void test_post_recv_fails(void **state)
{
    static xf_t xf[2];
    char a[100] = "a", b[100];

    (void)state;
    fault_reset();
    world_up();
    fault.post_recv = true;
    fault_on_rank(1);
    post(1, false, &xf[1], 1, b, sizeof(b));
    post(0, true, &xf[0], 1, a, sizeof(a));
    assert_true(drive_until(both_fatal, NULL, true));
    assert_has(ranks[1].fatal_msg, "ibv_post_recv for rank 0");
    world_down(false);

    fault_reset();
    world_up();
    set_zcopy_min(ZMIN);
    fault.post_recv = true;
    fault_on_rank(0);
    post(1, false, &xf[1], 1, big_b, sizeof(big_b)); /* its clear-to-send lands at rank 0 */
    check_failed(0, &xf[1], hcclRemoteError, "ibv_post_recv for rank 1");
}

/* Polling or re-arming the CQ fails: the device is reported failed, naming the call. */
static void test_cq_faults(void **state)
{
    static xf_t xf[2];
    char a[100] = "a", b[100];

    (void)state;
    for (int k = 0; k < 2; k++) {
        fault_reset();
        world_up();
        if (k == 0)
            fault.poll_cq = true;
        else
            fault.req_notify_cq = true;
        fault_on_rank(1);
        post(1, false, &xf[1], 1, b, sizeof(b));
        post(0, true, &xf[0], 1, a, sizeof(a));
        assert_true(drive_until(fatal1, NULL, true));
        assert_has(ranks[1].fatal_msg, k == 0 ? "ibv_poll_cq on rxe0" : "ibv_req_notify_cq on rxe0");
        assert_int_equal(xf[1].ndone, 0); /* nothing was read */
        world_down(false);
    }
    fault_reset();
}

/* Registering a receive buffer fails, or memory for the records of the zero-copy path is short. */
static void test_zcopy_resource_faults(void **state)
{
    static xf_t xf[2];

    (void)state;
    fault_reset();
    world_up(); /* ibv_reg_mr of the receive buffer */
    set_zcopy_min(ZMIN);
    fault.reg_mr = true;
    fault_on_rank(1);
    post(1, false, &xf[1], 1, big_b, sizeof(big_b));
    check_failed(1, &xf[1], hcclSystemError, "ibv_reg_mr(16384 bytes) on rxe0 for rank 0");

    world_up(); /* the registration's record */
    set_zcopy_min(ZMIN);
    hccl_alloc_fail_at(1);
    post(1, false, &xf[1], 1, big_b, sizeof(big_b));
    hccl_alloc_fail_at(0);
    check_failed(1, &xf[1], hcclSystemError, "out of memory");

    world_up(); /* the record of an arriving clear-to-send */
    set_zcopy_min(ZMIN);
    post(1, false, &xf[1], 1, big_b, sizeof(big_b));
    model_pump();
    hccl_alloc_fail_at(1);
    drive_until(fatal0, NULL, false);
    hccl_alloc_fail_at(0);
    check_failed(0, &xf[1], hcclRemoteError, "out of memory");

    world_up(); /* the record of an arriving ready-to-send */
    set_zcopy_min(ZMIN);
    post(0, true, &xf[0], 1, big_a, sizeof(big_a));
    model_pump();
    hccl_alloc_fail_at(1);
    for (int i = 0; i < 100 && !ranks[1].fatal; i++)
        hccl_reactor_drive(ranks[1].r, 0);
    hccl_alloc_fail_at(0);
    check_failed(1, &xf[0], hcclRemoteError, "out of memory");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_faults),
        cmocka_unit_test(test_odp_probe),
        cmocka_unit_test(test_gid_index),
        cmocka_unit_test(test_infiniband),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_accept_fails),
        cmocka_unit_test(test_reactor_refuses),
        cmocka_unit_test(test_post_send_fails),
        cmocka_unit_test(test_credit_return_fails),
        cmocka_unit_test(test_post_recv_fails),
        cmocka_unit_test(test_cq_faults),
        cmocka_unit_test(test_zcopy_resource_faults),
    };

    fault_reset();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
