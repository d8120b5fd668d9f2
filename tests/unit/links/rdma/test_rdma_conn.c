/*
 * The rdma link's connections over the verbs model (rdma_harness.h) when they end other than
 * by a graceful shutdown of both sides: an abort with transfers in flight, a peer cut with
 * close(), a peer that goes away mid-transfer, a peer that closes after its goodbye, posts to a
 * failed connection; and connection requests that are not ours, during and after set-up.
 */
#include <arpa/inet.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rdma_harness.h"

#define ZMIN 8192

static char big_a[16384], big_b[16384];

static rdma_ctx_t *ctx_of(int r) { return ranks[r].ctx; }
static rdma_conn_t *conn_of(int r) { return ranks[r].conns[1 - r]->priv; }

static bool fatal0(void *arg) { (void)arg; return ranks[0].fatal > 0; }
static bool fatal1(void *arg) { (void)arg; return ranks[1].fatal > 0; }
static bool cts_at0(void *arg) { (void)arg; return conn_of(0)->cts_held != NULL; }

static void assert_has(const char *text, const char *part)
{
    if (!strstr(text, part))
        fail_msg("\"%s\" does not say \"%s\"", text, part);
}

/* Only rank 0 is left: fini it and check that everything was released. */
static void rank0_down(void)
{
    ops->fini(ranks[0].ctx);
    hccl_reactor_destroy(ranks[0].r);
    hccl_rdma_shim = &hccl_rdma_shim_real;
    assert_released();
}

static void rank1_gone(void)
{
    ops->fini(ranks[1].ctx);
    hccl_reactor_destroy(ranks[1].r);
}

/*
 * Abort with a staged receive, a zero-copy receive offered, a zero-copy send announced and one
 * about to be written: each completes with the abort's result; the peer hears the
 * disconnection. A second abort, a close and later posts change nothing and fail at once.
 */
static void test_abort_in_flight(void **state)
{
    static xf_t xf[6];
    static char small[100], c[16384], d[16384];
    xfs_t mine = {xf, 4};

    (void)state;
    world_up();
    set_zcopy_min(ZMIN);
    post(1, false, &xf[4], 3, c, sizeof(c));             /* rank 1 offers seq 3 */
    assert_true(drive_until(cts_at0, NULL, true));
    post(0, false, &xf[0], 1, small, sizeof(small));     /* staged receive */
    post(0, false, &xf[1], 2, big_a, sizeof(big_a));     /* zero-copy receive, offered */
    post(0, true, &xf[2], 4, big_b, sizeof(big_b));      /* announced, no clear-to-send */
    post(0, true, &xf[3], 3, d, sizeof(d));              /* written, not completed */
    hccl_reactor_enter(ranks[0].r);
    ops->abort(ranks[0].ctx, hcclAborted);
    ops->abort(ranks[0].ctx, hcclTimeout);
    ops->close(ranks[0].ctx, 1);
    hccl_reactor_leave(ranks[0].r);
    assert_true(drive_until(all_done, &mine, false));
    for (int i = 0; i < 4; i++)
        assert_int_equal(xf[i].res, hcclAborted);
    assert_int_equal(ranks[0].fatal, 0); /* an abort is the caller's, not a fault to report */
    /* Posts to the aborted connection fail at once. */
    post(0, true, &xf[5], 9, small, sizeof(small));
    post(0, false, &xf[0], 9, small, sizeof(small));
    post(0, true, &xf[1], 9, big_a, sizeof(big_a));
    assert_true(drive_until(all_done, &mine, false));
    assert_true(xf[5].ndone == 1 && xf[5].res != hcclSuccess);
    assert_true(xf[0].res != hcclSuccess && xf[1].res != hcclSuccess);
    assert_true(drive_until(fatal1, NULL, true));
    assert_has(ranks[1].fatal_msg, "rank 0");
    world_down(false);
}

/* close() cuts a peer: its transfers fail, the fatal report names the peer and the cause. */
static void test_close_peer(void **state)
{
    static xf_t xf[2];
    char b[100];

    (void)state;
    world_up();
    post(0, false, &xf[0], 1, b, sizeof(b));
    hccl_reactor_enter(ranks[0].r);
    ops->close(ranks[0].ctx, 1);
    ops->close(ranks[0].ctx, 1);
    ops->close(ranks[0].ctx, 0); /* no connection to itself */
    hccl_reactor_leave(ranks[0].r);
    assert_true(drive_until(fatal1, NULL, true));
    assert_int_equal(xf[0].ndone, 1);
    assert_int_equal(xf[0].res, hcclRemoteError);
    assert_int_equal(ranks[0].fatal, 1);
    assert_has(ranks[0].fatal_msg, "rank 1");
    assert_has(ranks[0].fatal_msg, "HCCL_FAULT close");
    hccl_rdma_conn_fail(conn_of(0), hcclRemoteError); /* a failure is reported once */
    assert_int_equal(ranks[0].fatal, 1);
    world_down(false);
}

/* The peer's process goes (its ids destroyed, no goodbye) while a receive waits. */
static void test_peer_vanishes(void **state)
{
    static xf_t xf;
    char b[100];

    (void)state;
    world_up();
    post(0, false, &xf, 1, b, sizeof(b));
    rank1_gone();
    assert_true(drive_until(fatal0, NULL, false));
    assert_int_equal(xf.ndone, 1);
    assert_int_equal(xf.res, hcclRemoteError);
    assert_has(ranks[0].fatal_msg, "rank 1");
    assert_has(ranks[0].fatal_msg, "was disconnected");
    rank0_down();
}

static bool bye_seen(void *arg)
{
    (void)arg;
    return hccl_framer_closed_cleanly(&conn_of(0)->framer);
}

static bool cm_quiet0(void *arg)
{
    struct pollfd p = {.fd = ctx_of(0)->cm_ch->fd, .events = POLLIN};

    (void)arg;
    return poll(&p, 1, 0) == 0;
}

/* The peer says goodbye, then goes: a clean close, no fault reported. */
static void test_peer_closes_cleanly(void **state)
{
    (void)state;
    world_up();
    model_auto_pump(true);
    ops->shutdown(ranks[1].ctx, hccl_now_ms() + 5000);
    assert_true(drive_until(bye_seen, NULL, false));
    rank1_gone();
    assert_true(drive_until(cm_quiet0, NULL, false));
    assert_int_equal(ranks[0].fatal, 0);
    rank0_down();
}

/* A connector from outside the communicator, driven by hand through the model. */
typedef struct {
    struct rdma_event_channel *ch;
    struct rdma_cm_id *id;
    struct ibv_comp_channel *comp;
    struct ibv_cq *cq;
    struct ibv_pd *pd;
} stray_t;

static void stray_connect(stray_t *s, int to, const rdma_hello_t *hello)
{
    const rdma_card_t *c = (const rdma_card_t *)cards[to].blob[HCCL_LINK_RDMA];
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = c->cm_port};
    struct rdma_conn_param p = {.private_data = hello, .private_data_len = sizeof(*hello)};
    struct ibv_qp_init_attr qa;

    memcpy(&dst.sin_addr, c->addr, 4);
    s->ch = model_shim.create_event_channel();
    assert_int_equal(model_shim.create_id(s->ch, &s->id, NULL, RDMA_PS_TCP), 0);
    assert_int_equal(model_shim.resolve_addr(s->id, NULL, (struct sockaddr *)&dst, 1000), 0);
    s->comp = model_shim.create_comp_channel(s->id->verbs);
    s->cq = model_shim.create_cq(s->id->verbs, 64, NULL, s->comp, 0);
    s->pd = model_shim.alloc_pd(s->id->verbs);
    memset(&qa, 0, sizeof(qa));
    qa.send_cq = qa.recv_cq = s->cq;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 8;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    assert_int_equal(model_shim.create_qp(s->id, s->pd, &qa), 0);
    assert_int_equal(model_shim.connect(s->id, &p), 0);
}

/* The stray's next event after address resolution (-1: none). */
static int stray_event(stray_t *s)
{
    struct rdma_cm_event *ev;
    int type;

    do {
        if (model_shim.get_cm_event(s->ch, &ev) != 0)
            return -1;
        type = ev->event;
        model_shim.ack_cm_event(ev);
    } while (type == RDMA_CM_EVENT_ADDR_RESOLVED);
    return type;
}

static void stray_close(stray_t *s)
{
    model_shim.destroy_qp(s->id);
    model_shim.destroy_id(s->id);
    model_shim.destroy_cq(s->cq);
    model_shim.destroy_comp_channel(s->comp);
    model_shim.dealloc_pd(s->pd);
    model_shim.destroy_event_channel(s->ch);
}

static void hello_of(rdma_hello_t *h, int rank, uint64_t comm_id)
{
    memset(h, 0, sizeof(*h));
    h->magic = RDMA_HELLO_MAGIC;
    h->rank = (uint32_t)rank;
    h->comm_id = comm_id;
    memset(h->secret, 7, sizeof(h->secret)); /* the harness's secret */
}

static bool stray_answered(void *arg)
{
    (void)arg;
    return model_live().cm_events == 0 && cm_quiet0(NULL);
}

/* A request of another communicator during set-up, and any request after it, is refused. */
static void test_foreign_requests(void **state)
{
    static xf_t xf[2];
    char a[100] = "hello", b[100];
    rdma_hello_t other, ours;
    stray_t s1, s2;

    (void)state;
    model_reset(1, true);
    hccl_rdma_shim = &model_shim;
    for (int r = 0; r < 2; r++)
        assert_int_equal(rank_init(r), hcclSuccess);
    hello_of(&other, 0, 0x9999);
    stray_connect(&s1, 1, &other); /* waits at rank 1's listener */
    connect_both();
    assert_int_equal(ranks[0].conn_res, hcclSuccess);
    assert_int_equal(ranks[1].conn_res, hcclSuccess);
    assert_int_equal(stray_event(&s1), RDMA_CM_EVENT_REJECTED);
    /* After set-up even a request of this communicator is refused. */
    hello_of(&ours, 1, 0x1234);
    stray_connect(&s2, 0, &ours);
    assert_true(drive_until(stray_answered, NULL, false));
    assert_int_equal(stray_event(&s2), RDMA_CM_EVENT_REJECTED);
    /* The link still works. */
    post(1, false, &xf[1], 1, b, sizeof(b));
    post(0, true, &xf[0], 1, a, sizeof(a));
    assert_true(drive_until(both_done, xf, true));
    assert_int_equal(xf[1].res, hcclSuccess);
    assert_string_equal(b, "hello");
    assert_int_equal(ranks[0].fatal + ranks[1].fatal, 0);
    stray_close(&s1);
    stray_close(&s2);
    world_down(true);
}

/*
 * Someone with the communicator's secret claims rank 0 before rank 0 does: rank 1 takes it,
 * then refuses rank 0's own request as unexpected, and rank 0's set-up fails naming the refusal.
 */
static void test_duplicate_request(void **state)
{
    rdma_hello_t ours;
    pthread_t t[2];
    stray_t s;

    (void)state;
    model_reset(1, true);
    hccl_rdma_shim = &model_shim;
    for (int r = 0; r < 2; r++)
        assert_int_equal(rank_init(r), hcclSuccess);
    hello_of(&ours, 0, 0x1234);
    stray_connect(&s, 1, &ours);
    /* Rank 0's own request waits behind the stray's before rank 1 looks at either. */
    connect_start(0, &t[0]);
    assert_true(model_cm_wait_queued(ctx_of(1)->cm_ch, 2, 100000));
    assert_int_equal(model_cm_queued(ctx_of(1)->cm_ch), 2);
    connect_start(1, &t[1]);
    for (int r = 0; r < 2; r++)
        pthread_join(t[r], NULL);
    assert_int_equal(ranks[1].conn_res, hcclSuccess);
    assert_int_equal(ranks[0].conn_res, hcclRemoteError);
    assert_has(ranks[0].conn_msg, "rank 1");
    assert_has(ranks[0].conn_msg, rdma_event_str(RDMA_CM_EVENT_REJECTED));
    assert_int_equal(stray_event(&s), RDMA_CM_EVENT_ESTABLISHED);
    rank1_gone();
    assert_int_equal(stray_event(&s), RDMA_CM_EVENT_DISCONNECTED);
    stray_close(&s);
    rank0_down();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_abort_in_flight),
        cmocka_unit_test(test_close_peer),
        cmocka_unit_test(test_peer_vanishes),
        cmocka_unit_test(test_peer_closes_cleanly),
        cmocka_unit_test(test_foreign_requests),
        cmocka_unit_test(test_duplicate_request),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
