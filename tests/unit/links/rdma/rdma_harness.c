/* The two-rank harness of the rdma tests (see rdma_harness.h). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rdma_harness.h"

#define MAX_STEPS 100000

hccl_card_t cards[2];
rank_t ranks[2];
const hccl_link_ops_t *ops = &hccl_link_rdma_ops;
int64_t connect_deadline_ms = 10000;
uint32_t post_sig;

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

hcclResult_t rank_init(int r)
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
    rk->env.setup_watch_fd = -1; /* no rendezvous to call the set-up off */
    rk->env.setup_gone = -1;
    memset(&cards[r], 0, sizeof(cards[r]));
    cards[r].rank = (uint32_t)r;
    return ops->init(&rk->env, cards[r].blob[HCCL_LINK_RDMA], &rk->ctx);
}

static void *connect_thread(void *arg)
{
    rank_t *rk = arg;
    int peer = 1 - rk->env.rank;

    if (rk->env.rank == 0)
        model_set_victim(true);
    rk->conn_res = ops->connect(rk->ctx, &peer, 1, hccl_now_ms() + connect_deadline_ms, rk->conns);
    if (rk->conn_res != hcclSuccess)
        snprintf(rk->conn_msg, sizeof(rk->conn_msg), "%s", hccl_error_last());
    model_set_victim(false);
    return NULL;
}

void connect_start(int r, pthread_t *t)
{
    assert_int_equal(pthread_create(t, NULL, connect_thread, &ranks[r]), 0);
}

void connect_both(void)
{
    pthread_t t[2];

    for (int r = 0; r < 2; r++)
        connect_start(r, &t[r]);
    for (int r = 0; r < 2; r++)
        pthread_join(t[r], NULL);
}

void world_up_with(bool odp)
{
    post_sig = 0;
    model_reset(1, true);
    model_set_odp(odp);
    hccl_rdma_shim = &model_shim;
    for (int r = 0; r < 2; r++)
        assert_int_equal(rank_init(r), hcclSuccess);
    assert_true(ops->reaches(&cards[0], &cards[1]));
    connect_both();
    assert_int_equal(ranks[0].conn_res, hcclSuccess);
    assert_int_equal(ranks[1].conn_res, hcclSuccess);
}

void world_up(void)
{
    world_up_with(false);
}

void assert_released(void)
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

void world_down(bool graceful)
{
    model_auto_pump(true);
    model_pump(); /* work posted before auto mode moves too */
    for (int r = 0; r < 2 && graceful; r++)
        ops->shutdown(ranks[r].ctx, hccl_now_ms() + 5000);
    for (int r = 0; r < 2; r++) {
        ops->fini(ranks[r].ctx);
        hccl_reactor_destroy(ranks[r].r);
    }
    hccl_rdma_shim = &hccl_rdma_shim_real;
    assert_released();
}

bool drive_until(bool (*done)(void *), void *arg, bool drive1)
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

bool all_done(void *arg)
{
    xfs_t *s = arg;

    for (int i = 0; i < s->n; i++)
        if (!s->xf[i].ndone)
            return false;
    return true;
}

bool both_done(void *arg)
{
    xf_t *f = arg;

    return f[0].ndone && f[1].ndone;
}

bool never(void *arg)
{
    (void)arg;
    return false;
}

void post_tag(int r, bool send, xf_t *f, uint64_t seq, uint32_t tag, void *buf, size_t len)
{
    memset(f, 0, sizeof(*f));
    f->x.seq = seq;
    f->x.tag = tag;
    f->x.sig = post_sig;
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

void post(int r, bool send, xf_t *f, uint64_t seq, void *buf, size_t len)
{
    post_tag(r, send, f, seq, 1, buf, len);
}

void set_zcopy_min(size_t min)
{
    for (int r = 0; r < 2; r++)
        ((rdma_ctx_t *)ranks[r].ctx)->zcopy_min = min;
}
