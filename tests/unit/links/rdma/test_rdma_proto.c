/*
 * The rdma link's protocol over the verbs model (rdma_harness.h) when the peer does not keep
 * it: malformed messages (short, unknown, wrong sizes, credits beyond the slots, a write for a
 * receive never offered), completions that belong to nothing, an error completion of a staged
 * send; and the zero-copy path's edge cases: a ready-to-send that waits for its receive (then
 * matches it, or not), a collective mismatch, a staged message for a zero-copy receive, every
 * clear-to-send id in use, and a registration kept while its request has a transfer in flight.
 */
#include <arpa/inet.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "algos/algos.h"
#include "fault_shim.h"
#include "rdma_harness.h"

#define ZMIN 8192
#define NZ (RDMA_ZRX_MAX + 2)

static char big_a[16384], big_b[16384];

static rdma_ctx_t *ctx_of(int r) { return ranks[r].ctx; }
static rdma_conn_t *conn_of(int r) { return ranks[r].conns[1 - r]->priv; }

static bool fatal0(void *arg) { (void)arg; return ranks[0].fatal > 0; }
static bool fatal1(void *arg) { (void)arg; return ranks[1].fatal > 0; }
static bool xf_done1(void *arg) { return ((xf_t *)arg)->ndone > 0; }
static bool cts_at0(void *arg) { (void)arg; return conn_of(0)->cts_held != NULL; }
static bool rts_at1(void *arg) { (void)arg; return conn_of(1)->rts_held != NULL; }

static void assert_has(const char *text, const char *part)
{
    if (!strstr(text, part))
        fail_msg("\"%s\" does not say \"%s\"", text, part);
}

/* Rank 0 breaks the protocol in one of several ways; rank 1 fails naming what was wrong. */
static void test_malformed(void **state)
{
    static xf_t xf[2];
    const char *says[] = {"unknown type", "clear-to-send of the wrong size",
                          "ready-to-send of the wrong size", "more credits than slots",
                          "short message", "a write for no offered receive"};
    char three[3] = "abc";
    struct iovec iov = {.iov_base = three, .iov_len = sizeof(three)};

    (void)state;
    for (int k = 0; k < 6; k++) {
        rdma_conn_t *rc;
        fault_reset();
        world_up();
        rc = conn_of(0);
        switch (k) {
        case 0: hccl_rdma_send_msg(rc, 99, NULL, 0, 0); break;
        case 1: hccl_rdma_send_msg(rc, RDMA_MSG_CTS, &iov, 1, sizeof(three)); break;
        case 2: hccl_rdma_send_msg(rc, RDMA_MSG_RTS, &iov, 1, sizeof(three)); break;
        case 3:
            rc->owed = RDMA_CREDITS + 1;
            hccl_rdma_send_msg(rc, RDMA_MSG_CREDIT, NULL, 0, 0);
            break;
        case 4:
            fault.truncate_next_send = 4;
            fault_on_rank(0);
            hccl_rdma_send_msg(rc, RDMA_MSG_CREDIT, NULL, 0, 0);
            break;
        default:
            /* A real zero-copy transfer whose write names another clear-to-send id. */
            set_zcopy_min(ZMIN);
            post(1, false, &xf[1], 1, big_b, sizeof(big_b));
            assert_true(drive_until(cts_at0, NULL, true));
            rc->cts_held->cts.id = 7;
            post(0, true, &xf[0], 1, big_a, sizeof(big_a));
            break;
        }
        assert_true(drive_until(fatal1, NULL, true));
        assert_has(ranks[1].fatal_msg, "malformed rdma message from rank 0");
        assert_has(ranks[1].fatal_msg, says[k]);
        if (k == 5) {
            assert_true(drive_until(xf_done1, &xf[1], true));
            assert_int_equal(xf[1].res, hcclRemoteError);
        }
        world_down(false);
    }
    fault_reset();
}

/* Completions that belong to no connection, or to no write, change nothing. */
static void test_stray_completions(void **state)
{
    struct ibv_wc wc;
    rdma_conn_t *rc;
    int sends_out, ntx_free;

    (void)state;
    world_up();
    rc = conn_of(0);
    sends_out = rc->sends_out;
    ntx_free = rc->ntx_free;
    memset(&wc, 0, sizeof(wc));
    hccl_reactor_enter(ranks[0].r);
    wc.wr_id = (uint64_t)0 << 16 | RDMA_WR_SEND << 8; /* rank 0 has no connection to itself */
    hccl_rdma_complete(ctx_of(0), &wc);
    wc.wr_id = (uint64_t)5 << 16 | RDMA_WR_SEND << 8; /* no such rank */
    hccl_rdma_complete(ctx_of(0), &wc);
    hccl_rdma_on_write_done(rc); /* no write in flight */
    hccl_reactor_leave(ranks[0].r);
    assert_int_equal(rc->sends_out, sends_out);
    assert_int_equal(rc->ntx_free, ntx_free);
    assert_int_equal(ranks[0].fatal, 0);
    world_down(true);
}

/* An error completion of a staged send names the send and the status. */
static void test_send_error_completion(void **state)
{
    static xf_t xf[2];
    char a[100] = "a", b[100];

    (void)state;
    world_up();
    post(1, false, &xf[1], 1, b, sizeof(b));
    model_inject_error(IBV_WC_REM_ACCESS_ERR);
    post(0, true, &xf[0], 1, a, sizeof(a));
    assert_true(drive_until(fatal0, NULL, true));
    assert_has(ranks[0].fatal_msg, "send to rank 1");
    assert_has(ranks[0].fatal_msg, ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR));
    /* Progress on the failed connection does nothing. */
    hccl_rdma_conn_progress(conn_of(0));
    assert_int_equal(ranks[0].fatal, 1);
    world_down(false);
}

/*
 * A ready-to-send arrives before its receive: then a staged receive of the same (seq, tag), or
 * a zero-copy one of another length, fails naming both lengths; a matching one succeeds; one
 * never posted is dropped at teardown.
 */
static void test_rts_before_recv(void **state)
{
    static xf_t xf[2];
    char small[100];

    (void)state;
    for (int k = 0; k < 4; k++) {
        world_up();
        set_zcopy_min(ZMIN);
        memset(big_a, 'r', sizeof(big_a));
        post(0, true, &xf[0], 1, big_a, sizeof(big_a));
        assert_true(drive_until(rts_at1, NULL, true));
        if (k == 0)
            post(1, false, &xf[1], 1, small, sizeof(small));
        else if (k == 1)
            post(1, false, &xf[1], 1, big_b, sizeof(big_b) / 2 + ZMIN / 2);
        else if (k == 2)
            post(1, false, &xf[1], 1, big_b, sizeof(big_b));
        if (k < 2) {
            assert_true(drive_until(xf_done1, &xf[1], true));
            assert_int_equal(xf[1].res, hcclInvalidUsage);
            assert_true(drive_until(fatal1, NULL, true));
            assert_has(ranks[1].fatal_msg, "rank 0 sent 16384 bytes for seq 1 tag 1");
        } else if (k == 2) {
            assert_true(drive_until(both_done, xf, true));
            assert_int_equal(xf[1].res, hcclSuccess);
            assert_memory_equal(big_a, big_b, sizeof(big_a));
        }
        world_down(k >= 2);
    }
}

/* Zero-copy on both sides, but for different collectives: the mismatch names both. */
static void test_collective_mismatch(void **state)
{
    static xf_t xf[2];

    (void)state;
    world_up();
    set_zcopy_min(ZMIN);
    post_sig = hccl_sig_make(HCCL_COLL_ALLREDUCE, hcclFloat32, hcclSum, -1, 4096);
    post(1, false, &xf[1], 1, big_b, sizeof(big_b));
    assert_true(drive_until(cts_at0, NULL, true));
    post_sig = hccl_sig_make(HCCL_COLL_BROADCAST, hcclFloat32, hcclSum, 0, 4096);
    post(0, true, &xf[0], 1, big_a, sizeof(big_a));
    post_sig = 0;
    assert_true(drive_until(fatal0, NULL, true));
    assert_int_equal(xf[0].res, hcclInvalidUsage);
    assert_has(ranks[0].fatal_msg, "collective mismatch at seq 1");
    world_down(false);
}

static bool unexp_at1(void *arg) { (void)arg; return conn_of(1)->framer.unexp_head != NULL; }

/*
 * A staged message for a (seq, tag) that this side receives zero-copy: found when the receive
 * is posted, and when it arrives while the receive waits for a credit to offer itself.
 */
static void test_staged_for_zcopy(void **state)
{
    static xf_t xf[2], fill[RDMA_CREDITS];
    static char small[RDMA_CREDITS][100];

    (void)state;
    world_up();
    set_zcopy_min(ZMIN);
    post(0, true, &xf[0], 2, small[0], sizeof(small[0]));
    assert_true(drive_until(unexp_at1, NULL, true));
    post(1, false, &xf[1], 2, big_b, sizeof(big_b));
    assert_true(drive_until(xf_done1, &xf[1], true));
    assert_int_equal(xf[1].res, hcclInvalidUsage);
    assert_has(ranks[1].fatal_msg, "rank 0 sent 100 bytes for seq 2 tag 1 but 16384");
    world_down(false);

    world_up();
    set_zcopy_min(ZMIN);
    for (int i = 0; i < RDMA_CREDITS; i++) /* rank 0 does not run: rank 1 spends its credits */
        post(1, true, &fill[i], (uint64_t)(100 + i), small[i], sizeof(small[i]));
    assert_int_equal(conn_of(1)->credits, 0);
    post(1, false, &xf[1], 50, big_b, sizeof(big_b)); /* waits for a credit to offer itself */
    post(0, true, &xf[0], 50, small[0], sizeof(small[0]));
    for (int i = 0; i < 1000 && !xf[1].ndone; i++) {
        model_pump();
        hccl_reactor_drive(ranks[1].r, 0);
    }
    assert_int_equal(xf[1].res, hcclInvalidUsage);
    assert_has(ranks[1].fatal_msg, "rank 0 sent 100 bytes for seq 50 tag 1");
    world_down(false);
}

static int count_cts(const rdma_conn_t *rc)
{
    int n = 0;

    for (const rdma_zsend_t *h = rc->cts_held; h; h = h->next)
        n++;
    return n;
}

static bool all_ids_offered(void *arg) { (void)arg; return count_cts(conn_of(0)) == RDMA_ZRX_MAX; }

/*
 * More zero-copy receives than clear-to-send ids: the rest wait for an id, and ready-to-sends
 * for them find them waiting; all arrive intact.
 */
static void test_zrx_ids_exhausted(void **state)
{
    static xf_t xf[2][NZ];
    static char sbuf[NZ][ZMIN], rbuf[NZ][ZMIN];
    xfs_t all = {&xf[0][0], 2 * NZ};

    (void)state;
    world_up();
    set_zcopy_min(ZMIN);
    for (int i = 0; i < NZ; i++) {
        memset(sbuf[i], 'A' + i % 26, ZMIN);
        post(1, false, &xf[1][i], (uint64_t)i, rbuf[i], ZMIN);
    }
    assert_true(drive_until(all_ids_offered, NULL, true));
    assert_int_equal(conn_of(1)->nzrx, RDMA_ZRX_MAX);
    assert_non_null(conn_of(1)->zcts_wait.head);
    for (int i = NZ - 1; i >= 0; i--) /* the unoffered ones first: they are announced */
        post(0, true, &xf[0][i], (uint64_t)i, sbuf[i], ZMIN);
    assert_true(drive_until(all_done, &all, true));
    for (int i = 0; i < NZ; i++) {
        assert_int_equal(xf[1][i].res, hcclSuccess);
        assert_memory_equal(sbuf[i], rbuf[i], ZMIN);
    }
    assert_int_equal(model_stats().rnr, 0);
    world_down(true);
}

static bool offers_both(void *arg)
{
    (void)arg;
    return conn_of(0)->cts_held && conn_of(1)->cts_held;
}

/*
 * Pinned registrations of one collective stay while any transfer of it is in flight here, even
 * when a transfer of the next collective comes: the request may still use them.
 */
static void test_reg_kept_while_request_busy(void **state)
{
    static xf_t xf[6]; /* rank 1: recv 5, send 5, send 6; rank 0: recv 5, send 5, recv 6 */
    static char b[6][ZMIN];
    xfs_t all = {xf, 6};
    int nregs;

    (void)state;
    world_up();
    set_zcopy_min(ZMIN);
    post_sig = hccl_sig_make(HCCL_COLL_ALLREDUCE, hcclFloat32, hcclSum, -1, 4096);
    for (int i = 0; i < 6; i++)
        memset(b[i], '0' + i, ZMIN);
    post(1, false, &xf[0], 5, b[0], ZMIN);
    post(0, false, &xf[3], 5, b[3], ZMIN);
    assert_true(drive_until(offers_both, NULL, true));
    post(1, true, &xf[1], 5, b[1], ZMIN);
    assert_true(drive_until(xf_done1, &xf[3], false)); /* rank 0's receive is done */
    post(0, true, &xf[4], 5, b[4], ZMIN);              /* its write is in flight */
    assert_int_equal(xf[4].ndone, 0);
    nregs = ctx_of(0)->nregs;
    post_sig = hccl_sig_make(HCCL_COLL_ALLREDUCE, hcclFloat32, hcclSum, -1, 8192);
    post(0, false, &xf[5], 6, b[5], ZMIN);             /* the next collective registers */
    assert_int_equal(ctx_of(0)->nregs, nregs + 1);     /* and keeps the receive's */
    post(1, true, &xf[2], 6, b[2], ZMIN);
    post_sig = 0;
    assert_true(drive_until(all_done, &all, true));
    for (int i = 0; i < 6; i++)
        assert_int_equal(xf[i].res, hcclSuccess);
    assert_memory_equal(b[3], b[1], ZMIN);
    assert_memory_equal(b[0], b[4], ZMIN);
    assert_memory_equal(b[5], b[2], ZMIN);
    world_down(true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_stray_completions),
        cmocka_unit_test(test_send_error_completion),
        cmocka_unit_test(test_rts_before_recv),
        cmocka_unit_test(test_collective_mismatch),
        cmocka_unit_test(test_staged_for_zcopy),
        cmocka_unit_test(test_zrx_ids_exhausted),
        cmocka_unit_test(test_reg_kept_while_request_busy),
    };

    fault_reset();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
