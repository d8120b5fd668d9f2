/* rdma: the link vtable; the staged path is in rdma_stage.c, the zero-copy path in rdma_zcopy.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "links/rdma/rdma.h"

_Static_assert(sizeof(rdma_card_t) <= HCCL_CARD_BLOB_BYTES, "rdma card too large");

/* Fails every transfer of the connection and stops its queue pair; resources stay for fini. */
static void conn_stop(rdma_conn_t *rc, hcclResult_t res)
{
    if (rc->failed)
        return;
    rc->failed = true;
    hccl_framer_fail(&rc->framer, res);
    hccl_rdma_zcopy_stop(rc, res);
    if (rc->id && rc->established && !rc->disconnected) {
        rc->disconnected = true;
        rc->ctx->v->disconnect(rc->id); /* the peer sees it; our queue pair flushes */
    }
}

void hccl_rdma_conn_fail(rdma_conn_t *rc, hcclResult_t res)
{
    hccl_link_env_t *env = rc->ctx->env;
    char msg[512];

    if (rc->failed)
        return;
    snprintf(msg, sizeof(msg), "%s", hccl_error_last());
    conn_stop(rc, res);
    env->on_fatal(env->fatal_arg, res, msg);
}

static hcclResult_t rdma_link_post_send(hccl_conn_t *c, hccl_xfer_t *x)
{
    rdma_conn_t *rc = c->priv;
    hcclResult_t res;

    if (rc->failed || x->len < rc->ctx->zcopy_min)
        res = hccl_framer_post_send(&rc->framer, x);
    else
        res = hccl_rdma_zcopy_post_send(rc, x);
    if (hccl_is_failure(res))
        hccl_rdma_conn_fail(rc, res);
    else
        hccl_rdma_conn_progress(rc);
    return hcclSuccess;
}

static hcclResult_t rdma_link_post_recv(hccl_conn_t *c, hccl_xfer_t *x)
{
    rdma_conn_t *rc = c->priv;
    hcclResult_t res;

    if (rc->failed) {
        res = hccl_framer_post_recv(&rc->framer, x); /* fails it */
    } else if (x->len < rc->ctx->zcopy_min) {
        res = hccl_rdma_zcopy_check_staged_recv(rc, x);
        if (hccl_is_failure(res))
            hccl_xfer_complete_later(rc->ctx->env->reactor, x, res);
        else
            res = hccl_framer_post_recv(&rc->framer, x);
    } else {
        res = hccl_rdma_zcopy_post_recv(rc, x);
    }
    if (hccl_is_failure(res))
        hccl_rdma_conn_fail(rc, res);
    else
        hccl_rdma_conn_progress(rc); /* the framer may have queued a control frame */
    return hcclSuccess;
}

static void ctx_free(rdma_ctx_t *ctx)
{
    for (int r = 0; ctx->conns && r < ctx->env->nranks; r++)
        hccl_rdma_conn_destroy(ctx->conns[r]);
    if (ctx->ev_cm)
        event_free(ctx->ev_cm);
    hccl_rdma_ctx_close(ctx);
    if (ctx->listen_id)
        ctx->v->destroy_id(ctx->listen_id);
    if (ctx->cm_ch)
        ctx->v->destroy_event_channel(ctx->cm_ch);
    hccl_free(ctx->conns);
    hccl_free(ctx);
}

/* The listener rdma_cm binds to the port's address, and the device's PD and CQ. */
static hcclResult_t open_device(rdma_ctx_t *ctx)
{
    hccl_sockaddr_t sa;
    int flags;

    HCCL_CHECK(hccl_rdma_pick_device(ctx, &sa));
    ctx->cm_ch = ctx->v->create_event_channel();
    if (!ctx->cm_ch)
        return HCCL_FAIL(hcclSystemError, "rdma: rdma_create_event_channel: %s", strerror(errno));
    flags = fcntl(ctx->cm_ch->fd, F_GETFL);
    if (flags < 0 || fcntl(ctx->cm_ch->fd, F_SETFL, flags | O_NONBLOCK) != 0)
        return HCCL_FAIL(hcclSystemError, "rdma: event channel O_NONBLOCK: %s", strerror(errno));
    if (ctx->v->create_id(ctx->cm_ch, &ctx->listen_id, NULL, RDMA_PS_TCP) != 0)
        return HCCL_FAIL(hcclSystemError, "rdma: rdma_create_id: %s", strerror(errno));
    if (ctx->v->bind_addr(ctx->listen_id, &sa.sa) != 0 ||
        ctx->v->listen(ctx->listen_id, ctx->env->nranks) != 0)
        return HCCL_FAIL(hcclSystemError, "rdma: rdma_bind_addr/rdma_listen on %s: %s", ctx->card.dev,
                         strerror(errno));
    ctx->card.family = sa.sa.sa_family;
    ctx->card.cm_port = ctx->v->get_src_port(ctx->listen_id);
    memcpy(ctx->card.addr, &sa.in4.sin_addr, 4); /* IPv4 only (hccl_rdma_pick_device) */
    return hccl_rdma_ctx_open(ctx);
}

static hcclResult_t rdma_link_init(hccl_link_env_t *env, void *blob, void **ctx_p)
{
    rdma_ctx_t *ctx = hccl_calloc(1, sizeof(*ctx));
    hcclResult_t res;

    if (!ctx)
        return HCCL_FAIL(hcclSystemError, "rdma: out of memory");
    ctx->env = env;
    ctx->v = hccl_rdma_shim;
    ctx->zcopy_min = RDMA_ZCOPY_MIN;
    ctx->conns = hccl_calloc((size_t)env->nranks, sizeof(*ctx->conns));
    if (!ctx->conns) {
        hccl_free(ctx);
        return HCCL_FAIL(hcclSystemError, "rdma: out of memory");
    }
    res = open_device(ctx);
    if (res == hcclUnsupported) {
        /* No usable port: the card says so and peers use another link; not worth a warning. */
        HCCL_INFO(HCCL_SUB_INIT | HCCL_SUB_LINK, "rank %d: rdma is unavailable: %s", env->rank,
                  hccl_error_last());
        hccl_rdma_ctx_close(ctx);
        if (ctx->listen_id)
            ctx->v->destroy_id(ctx->listen_id);
        if (ctx->cm_ch)
            ctx->v->destroy_event_channel(ctx->cm_ch);
        ctx->listen_id = NULL;
        ctx->cm_ch = NULL;
        memset(&ctx->card, 0, sizeof(ctx->card));
    } else if (res != hcclSuccess) {
        ctx_free(ctx);
        return res;
    } else {
        HCCL_INFO(HCCL_SUB_INIT | HCCL_SUB_LINK, "rank %d: rdma on %s port %u (%s, gid index %d), "
                  "rdma_cm port %u", env->rank, ctx->card.dev, ctx->card.port_num,
                  ctx->card.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
                  ctx->card.gid_index, ntohs(ctx->card.cm_port));
    }
    memcpy(blob, &ctx->card, sizeof(ctx->card));
    *ctx_p = ctx;
    return hcclSuccess;
}

static bool rdma_link_reaches(const hccl_card_t *me, const hccl_card_t *peer)
{
    const rdma_card_t *a = (const rdma_card_t *)me->blob[HCCL_LINK_RDMA];
    const rdma_card_t *b = (const rdma_card_t *)peer->blob[HCCL_LINK_RDMA];

    return a->active && b->active && a->link_layer == b->link_layer;
}

static hcclResult_t rdma_link_connect(void *vctx, const int *peers, int npeers, int64_t deadline_ms,
                                 hccl_conn_t **conns)
{
    rdma_ctx_t *ctx = vctx;
    struct event_base *base = hccl_reactor_base(ctx->env->reactor);

    if (!ctx->card.active)
        return HCCL_FAIL(hcclUnsupported, "rank %d: rdma has no active port", ctx->env->rank);
    HCCL_CHECK(hccl_rdma_connect_all(ctx, peers, npeers, deadline_ms));
    ctx->ev_cq = event_new(base, ctx->comp_ch->fd, EV_READ | EV_PERSIST, hccl_rdma_on_cq_event, ctx);
    ctx->ev_cm = event_new(base, ctx->cm_ch->fd, EV_READ | EV_PERSIST, hccl_rdma_on_cm_event, ctx);
    if (!ctx->ev_cq || !ctx->ev_cm || event_add(ctx->ev_cq, NULL) != 0 || event_add(ctx->ev_cm, NULL) != 0)
        return HCCL_FAIL(hcclSystemError, "rdma: cannot register the channels in the reactor");
    for (int i = 0; i < npeers; i++) {
        rdma_conn_t *rc = ctx->conns[peers[i]];
        rc->conn.ops = &hccl_link_rdma_ops;
        rc->conn.ctx = ctx;
        rc->conn.peer = peers[i];
        rc->conn.priv = rc;
        hccl_rdma_conn_init_framer(rc);
        conns[peers[i]] = &rc->conn;
    }
    return hcclSuccess;
}

static void rdma_link_abort(void *vctx, hcclResult_t res)
{
    rdma_ctx_t *ctx = vctx;

    for (int r = 0; r < ctx->env->nranks; r++)
        if (ctx->conns[r])
            conn_stop(ctx->conns[r], res);
}

static void rdma_link_close_peer(void *vctx, int peer)
{
    rdma_ctx_t *ctx = vctx;
    rdma_conn_t *rc = ctx->conns[peer];

    if (!rc || rc->failed)
        return;
    hccl_error_set_quiet(hcclRemoteError, "rank %d: rdma connection to rank %d (%s) was cut "
                         "(HCCL_FAULT close)", ctx->env->rank, peer, rc->peer_addr);
    hccl_rdma_conn_fail(rc, hcclRemoteError);
}

static bool shutdown_pending(rdma_ctx_t *ctx)
{
    for (int r = 0; r < ctx->env->nranks; r++) {
        rdma_conn_t *rc = ctx->conns[r];
        if (rc && !rc->failed && (hccl_framer_tx_pending(&rc->framer) || rc->sends_out > 0))
            return true;
    }
    return false;
}

/* Says goodbye to every peer and waits (bounded) until the sends have completed. */
static void rdma_link_shutdown(void *vctx, int64_t deadline_ms)
{
    rdma_ctx_t *ctx = vctx;

    if (!ctx->cq)
        return;
    for (int r = 0; r < ctx->env->nranks; r++) {
        rdma_conn_t *rc = ctx->conns[r];
        if (rc && !rc->failed && rc->established) {
            hccl_framer_send_bye(&rc->framer);
            hccl_rdma_conn_progress(rc);
        }
    }
    while (shutdown_pending(ctx)) {
        struct pollfd p = {.fd = ctx->comp_ch->fd, .events = POLLIN};
        int64_t left = deadline_ms - hccl_now_ms();
        if (left <= 0 || poll(&p, 1, (int)left) <= 0)
            break;
        hccl_rdma_on_cq_event(ctx->comp_ch->fd, EV_READ, ctx);
    }
}

static void rdma_link_fini(void *vctx)
{
    if (vctx)
        ctx_free(vctx);
}

const hccl_link_ops_t hccl_link_rdma_ops = {
    .size = sizeof(hccl_link_ops_t),
    .name = "rdma",
    .id = HCCL_LINK_RDMA,
    .init = rdma_link_init,
    .reaches = rdma_link_reaches,
    .connect = rdma_link_connect,
    .post_send = rdma_link_post_send,
    .post_recv = rdma_link_post_recv,
    .abort = rdma_link_abort,
    .shutdown = rdma_link_shutdown,
    .fini = rdma_link_fini,
    .close = rdma_link_close_peer,
};
