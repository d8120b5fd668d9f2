/*
 * The executor's failures through a tiny fake link: a post the link refuses, and fail_all waiting
 * for the link to give back what it holds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "links/link.h"
#include "plan_helpers.h"
#include "reactor/reactor.h"
#include "sched/sched.h"

typedef struct {
    hccl_conn_t conn;
    hccl_reactor_t *r;
    bool refuse_send;
    int nsend;
    int nrecv;
    hccl_xfer_t *held[8]; /* posted and not given back */
    int nheld;
} fake_conn_t;

static hcclResult_t fake_post_send(hccl_conn_t *c, hccl_xfer_t *x)
{
    fake_conn_t *f = c->priv;

    f->nsend++;
    if (f->refuse_send)
        return hccl_error_set(hcclRemoteError, "fake link: post_send to rank %d refused", c->peer);
    assert_true(f->nheld < 8);
    f->held[f->nheld++] = x;
    return hcclSuccess;
}

static hcclResult_t fake_post_recv(hccl_conn_t *c, hccl_xfer_t *x)
{
    fake_conn_t *f = c->priv;

    f->nrecv++;
    assert_true(f->nheld < 8);
    f->held[f->nheld++] = x;
    return hcclSuccess;
}

static const hccl_link_ops_t fake_ops = {
    .size = sizeof(hccl_link_ops_t),
    .name = "fake",
    .id = HCCL_LINK_SIM,
    .post_send = fake_post_send,
    .post_recv = fake_post_recv,
};

static void fake_init(fake_conn_t *f, hccl_reactor_t *r, int peer)
{
    memset(f, 0, sizeof(*f));
    f->conn.ops = &fake_ops;
    f->conn.peer = peer;
    f->conn.priv = f;
    f->r = r;
}

/* Gives back every held transfer with res (from the loop, as a link must). */
static void fake_give_back(fake_conn_t *f, hcclResult_t res)
{
    for (int i = 0; i < f->nheld; i++)
        hccl_xfer_complete_later(f->r, f->held[i], res);
    f->nheld = 0;
}

static void test_exec_post_failure(void **state)
{
    hccl_reactor_t *r = NULL;
    hccl_exec_t *ex = NULL;
    fake_conn_t fake;
    hccl_conn_t *conns[2];
    hccl_plan_t *p = new_plan(0, 2);
    char in[32], out[32];
    uint32_t cp, sd;
    done_t d;

    (void)state;
    memset(&d, 0, sizeof(d));
    memset(in, 7, sizeof(in));
    assert_int_equal(hccl_reactor_create(NULL, -1, &r), hcclSuccess);
    fake_init(&fake, r, 1);
    fake.refuse_send = true;
    conns[0] = NULL;
    conns[1] = &fake.conn;
    assert_int_equal(hccl_exec_create(r, 0, 2, conns, &ex), hcclSuccess);
    assert_int_equal(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0), hccl_bref(HCCL_SLOT_SEND, 0),
                                    sizeof(in), &cp),
                     hcclSuccess);
    assert_int_equal(hccl_plan_send(p, 1, 3, hccl_bref(HCCL_SLOT_SEND, 0), sizeof(in), &sd),
                     hcclSuccess);
    assert_int_equal(hccl_plan_dep(p, cp, sd), hcclSuccess);
    assert_int_equal(hccl_plan_finalize(p, sizeof(in), sizeof(out)), hcclSuccess);

    assert_int_equal(hccl_exec_start(ex, p, 42, in, out, on_done, &d, NULL), hcclSuccess);
    assert_int_equal(fake.nsend, 1); /* issued inside start */
    assert_int_equal(d.ndone, 0);    /* but reported only from the loop */
    assert_int_equal(hccl_exec_inflight(ex), 1);
    assert_true(drive_until(r, &d.ndone, 1));
    assert_int_equal(d.res, hcclRemoteError);
    assert_non_null(strstr(d.msg, "refused"));
    assert_int_equal(d.seq, 42);
    assert_int_equal(hccl_exec_inflight(ex), 0);
    drive_some(r, 3);
    assert_int_equal(d.ndone, 1);

    /*
     * A failing post after another transfer is already with the link: the run ends only once
     * the link gave that one back, with the first error.
     */
    hccl_plan_t *p2 = new_plan(0, 2);
    done_t d2;
    memset(&d2, 0, sizeof(d2));
    assert_int_equal(hccl_plan_recv(p2, 1, 1, hccl_bref(HCCL_SLOT_RECV, 0), 8, NULL), hcclSuccess);
    assert_int_equal(hccl_plan_send(p2, 1, 2, hccl_bref(HCCL_SLOT_SEND, 0), 8, NULL), hcclSuccess);
    assert_int_equal(hccl_plan_finalize(p2, sizeof(in), sizeof(out)), hcclSuccess);
    fake.nsend = fake.nrecv = 0;
    assert_int_equal(hccl_exec_start(ex, p2, 43, in, out, on_done, &d2, NULL), hcclSuccess);
    assert_int_equal(fake.nrecv, 1);
    assert_int_equal(fake.nsend, 1);
    assert_int_equal(fake.nheld, 1);
    drive_some(r, 10);
    assert_int_equal(d2.ndone, 0);
    assert_int_equal(hccl_exec_inflight(ex), 1);
    fake_give_back(&fake, hcclAborted);
    assert_true(drive_until(r, &d2.ndone, 1));
    assert_int_equal(d2.res, hcclRemoteError);
    assert_non_null(strstr(d2.msg, "refused"));
    assert_int_equal(hccl_exec_inflight(ex), 0);

    hccl_plan_release(p);
    hccl_plan_release(p2);
    hccl_exec_destroy(ex);
    hccl_reactor_destroy(r);
}

static void test_exec_fail_all_waits_for_link(void **state)
{
    hccl_reactor_t *r = NULL;
    hccl_exec_t *ex = NULL;
    fake_conn_t fake;
    hccl_conn_t *conns[2];
    hccl_plan_t *p = new_plan(0, 2);
    char in[16] = {0}, out[16];
    hccl_run_t *run = NULL;
    char peers[32];
    done_t d, dlocal;

    (void)state;
    memset(&d, 0, sizeof(d));
    memset(&dlocal, 0, sizeof(dlocal));
    assert_int_equal(hccl_reactor_create(NULL, -1, &r), hcclSuccess);
    fake_init(&fake, r, 1);
    conns[0] = NULL;
    conns[1] = &fake.conn;
    assert_int_equal(hccl_exec_create(r, 0, 2, conns, &ex), hcclSuccess);
    assert_int_equal(hccl_plan_recv(p, 1, 9, hccl_bref(HCCL_SLOT_RECV, 0), sizeof(out), NULL),
                     hcclSuccess);
    assert_int_equal(hccl_plan_finalize(p, sizeof(in), sizeof(out)), hcclSuccess);
    assert_int_equal(hccl_exec_start(ex, p, 77, in, out, on_done, &d, &run), hcclSuccess);
    assert_non_null(run);
    assert_int_equal(hccl_exec_run_seq(run), 77);
    assert_int_equal(fake.nheld, 1);
    drive_some(r, 10);
    assert_int_equal(d.ndone, 0);
    hccl_exec_run_pending_peers(run, peers, sizeof(peers));
    assert_string_equal(peers, "1");

    hccl_exec_fail_all(ex, hcclTimeout, "test: gave up waiting");
    drive_some(r, 10);
    /* The receive is still with the link: the run must not end (nor free its transfer) yet. */
    assert_int_equal(d.ndone, 0);
    assert_int_equal(hccl_exec_inflight(ex), 1);

    fake_give_back(&fake, hcclAborted);
    assert_true(drive_until(r, &d.ndone, 1));
    assert_int_equal(d.res, hcclTimeout);
    assert_string_equal(d.msg, "test: gave up waiting");
    assert_int_equal(hccl_exec_inflight(ex), 0);
    drive_some(r, 3);
    assert_int_equal(d.ndone, 1);

    /* fail_all with nothing in flight is a no-op. */
    hccl_exec_fail_all(ex, hcclTimeout, "nothing");
    assert_int_equal(hccl_exec_inflight(ex), 0);

    hccl_plan_release(p);
    hccl_exec_destroy(ex);
    hccl_reactor_destroy(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exec_post_failure),
        cmocka_unit_test(test_exec_fail_all_waits_for_link),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
