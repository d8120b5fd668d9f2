/* rdma: connection set-up through librdmacm (bounded by the connect deadline) and teardown. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "links/rdma/rdma.h"

/* Address and route resolution: each try at most this long, within the deadline. */
#define RDMA_RESOLVE_MS 2000

/* rdma_cm addresses are IPv4: RoCE v2 IPv4-mapped GIDs, IPoIB addresses (see rdma_dev.c). */
static void card_to_sockaddr(const rdma_card_t *card, hccl_sockaddr_t *sa)
{
    memset(sa, 0, sizeof(*sa));
    sa->in4.sin_family = AF_INET;
    sa->in4.sin_port = card->cm_port;
    memcpy(&sa->in4.sin_addr, card->addr, 4);
}

static const rdma_card_t *peer_card(rdma_ctx_t *ctx, int peer)
{
    return (const rdma_card_t *)ctx->env->cards[peer].blob[HCCL_LINK_RDMA];
}

/* Staging buffers of one connection, registered once. */
static hcclResult_t conn_alloc(rdma_ctx_t *ctx, int peer, rdma_conn_t **rc_p)
{
    rdma_conn_t *rc = hccl_calloc(1, sizeof(*rc));
    size_t buffsize = ctx->env->params->buffsize;
    hccl_sockaddr_t sa;
    char text[64];
    hcclResult_t res;

    if (!rc)
        return HCCL_FAIL(hcclSystemError, "rdma: out of memory");
    rc->ctx = ctx;
    rc->peer = peer;
    /* The credits split HCCL_BUFFSIZE; bigger transfers go zero-copy, so slots stay small. */
    rc->slot = buffsize / RDMA_CREDITS;
    if (rc->slot > (64u << 10))
        rc->slot = 64u << 10;
    if (rc->slot < 4096)
        rc->slot = 4096;
    card_to_sockaddr(peer_card(ctx, peer), &sa);
    snprintf(rc->peer_addr, sizeof(rc->peer_addr), "%s",
             hccl_socket_addr_str(&sa, text, sizeof(text)));
    *rc_p = rc; /* the caller's table owns it from here: destroy frees half-built ones */
    rc->rx_buf = hccl_aligned_alloc(4096, RDMA_NRECV * rc->slot);
    rc->tx_buf = hccl_aligned_alloc(4096, RDMA_NSEND * rc->slot);
    if (!rc->rx_buf || !rc->tx_buf)
        return HCCL_FAIL(hcclSystemError, "rdma: out of memory for staging to rank %d", peer);
    rc->rx_mr = ctx->v->reg_mr(ctx->pd, rc->rx_buf, RDMA_NRECV * rc->slot, IBV_ACCESS_LOCAL_WRITE);
    rc->tx_mr = ctx->v->reg_mr(ctx->pd, rc->tx_buf, RDMA_NSEND * rc->slot, IBV_ACCESS_LOCAL_WRITE);
    if (!rc->rx_mr || !rc->tx_mr) {
        res = HCCL_FAIL(hcclSystemError, "rdma: ibv_reg_mr of the staging to rank %d: %s", peer,
                        strerror(errno));
        return res;
    }
    for (int i = 0; i < RDMA_NSEND; i++)
        rc->tx_free[rc->ntx_free++] = RDMA_NSEND - 1 - i;
    rc->credits = RDMA_CREDITS;
    return hcclSuccess;
}

void hccl_rdma_conn_destroy(rdma_conn_t *rc)
{
    const hccl_rdma_shim_t *v;

    if (!rc)
        return;
    v = rc->ctx->v;
    hccl_framer_fail(&rc->framer, hcclAborted);
    if (rc->id && rc->id->qp)
        v->destroy_qp(rc->id); /* first: nothing lands in the buffers below any more */
    if (rc->rx_mr)
        v->dereg_mr(rc->rx_mr);
    if (rc->tx_mr)
        v->dereg_mr(rc->tx_mr);
    hccl_rdma_zcopy_stop(rc, hcclSuccess); /* drops what is left, completing nothing */
    if (rc->id)
        v->destroy_id(rc->id);
    hccl_free(rc->rx_buf);
    hccl_free(rc->tx_buf);
    hccl_framer_fini(&rc->framer);
    hccl_free(rc);
}

static hcclResult_t conn_create_qp(rdma_conn_t *rc)
{
    rdma_ctx_t *ctx = rc->ctx;
    struct ibv_qp_init_attr qa;

    memset(&qa, 0, sizeof(qa));
    qa.send_cq = ctx->cq;
    qa.recv_cq = ctx->cq;
    qa.qp_type = IBV_QPT_RC;
    qa.sq_sig_all = 1;
    qa.cap.max_send_wr = RDMA_NSEND + RDMA_CREDITS;
    qa.cap.max_recv_wr = RDMA_NRECV;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    if (ctx->v->create_qp(rc->id, ctx->pd, &qa) != 0)
        return HCCL_FAIL(hcclSystemError, "rank %d: rdma_create_qp for rank %d: %s", ctx->env->rank,
                         rc->peer, strerror(errno));
    /* Receives before the connection is up: the peer may send as soon as it is. */
    return hccl_rdma_conn_post_recvs(rc);
}

static void conn_param(rdma_ctx_t *ctx, struct rdma_conn_param *p, rdma_hello_t *hello)
{
    memset(hello, 0, sizeof(*hello));
    hello->magic = RDMA_HELLO_MAGIC;
    hello->rank = (uint32_t)ctx->env->rank;
    hello->comm_id = ctx->env->comm_id;
    memcpy(hello->secret, ctx->env->secret, sizeof(hello->secret));
    memset(p, 0, sizeof(*p));
    p->private_data = hello;
    p->private_data_len = sizeof(*hello);
    p->retry_count = 7;
    p->rnr_retry_count = 7; /* credit returns take no credit: a late repost is retried, not lost */
}

/* A connection request: from a peer of this communicator that we wait for, or refused. */
static hcclResult_t on_connect_request(rdma_ctx_t *ctx, struct rdma_cm_event *ev, bool *refused)
{
    const rdma_hello_t *h = ev->param.conn.private_data;
    struct rdma_conn_param p;
    rdma_hello_t hello;
    rdma_conn_t *rc;

    *refused = true;
    if (!h || ev->param.conn.private_data_len < sizeof(*h) || h->magic != RDMA_HELLO_MAGIC ||
        h->comm_id != ctx->env->comm_id ||
        memcmp(h->secret, ctx->env->secret, sizeof(h->secret)) != 0 ||
        h->rank >= (uint32_t)ctx->env->nranks || (int)h->rank >= ctx->env->rank) {
        HCCL_WARN("rank %d: rdma: refused a connection request that is not of this communicator",
                  ctx->env->rank);
        ctx->v->reject(ev->id, NULL, 0);
        return hcclSuccess;
    }
    rc = ctx->conns[h->rank];
    if (!rc || rc->id) {
        HCCL_WARN("rank %d: rdma: refused an unexpected connection request from rank %u",
                  ctx->env->rank, h->rank);
        ctx->v->reject(ev->id, NULL, 0);
        return hcclSuccess;
    }
    *refused = false;
    rc->id = ev->id; /* rc owns the id from here */
    rc->id->context = rc;
    HCCL_CHECK(conn_create_qp(rc));
    conn_param(ctx, &p, &hello);
    if (ctx->v->accept(rc->id, &p) != 0)
        return HCCL_FAIL(hcclSystemError, "rank %d: rdma_accept from rank %d: %s", ctx->env->rank,
                         rc->peer, strerror(errno));
    return hcclSuccess;
}

static hcclResult_t on_setup_event(rdma_ctx_t *ctx, struct rdma_cm_event *ev, int *established)
{
    rdma_conn_t *rc = ev->id ? ev->id->context : NULL;
    struct rdma_conn_param p;
    rdma_hello_t hello;

    switch (ev->event) {
    case RDMA_CM_EVENT_CONNECT_REQUEST: {
        bool refused;
        hcclResult_t res = on_connect_request(ctx, ev, &refused);
        if (refused)
            ctx->v->destroy_id(ev->id); /* after the ack: the caller acks first */
        return res;
    }
    case RDMA_CM_EVENT_ADDR_RESOLVED:
        if (ctx->v->resolve_route(rc->id, RDMA_RESOLVE_MS) != 0)
            return HCCL_FAIL(hcclSystemError, "rank %d: rdma_resolve_route to rank %d (%s): %s",
                             ctx->env->rank, rc->peer, rc->peer_addr, strerror(errno));
        return hcclSuccess;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
        HCCL_CHECK(conn_create_qp(rc));
        conn_param(ctx, &p, &hello);
        if (ctx->v->connect(rc->id, &p) != 0)
            return HCCL_FAIL(hcclSystemError, "rank %d: rdma_connect to rank %d (%s): %s",
                             ctx->env->rank, rc->peer, rc->peer_addr, strerror(errno));
        return hcclSuccess;
    case RDMA_CM_EVENT_ESTABLISHED:
        if (rc && !rc->established) {
            rc->established = true;
            (*established)++;
            HCCL_INFO(HCCL_SUB_LINK | HCCL_SUB_INIT, "rank %d: rdma to rank %d (%s) on %s:%u, qp 0x%x",
                      ctx->env->rank, rc->peer, rc->peer_addr, ctx->card.dev, ctx->card.port_num,
                      rc->id->qp ? rc->id->qp->qp_num : 0);
        }
        return hcclSuccess;
    default:
        return HCCL_FAIL(hcclRemoteError, "rank %d: rdma connection to rank %d (%s) failed: %s (%d)",
                         ctx->env->rank, rc ? rc->peer : -1, rc ? rc->peer_addr : "?",
                         rdma_event_str(ev->event), ev->status);
    }
}

hcclResult_t hccl_rdma_connect_all(rdma_ctx_t *ctx, const int *peers, int npeers, int64_t deadline_ms)
{
    hccl_link_env_t *env = ctx->env;
    int established = 0;

    for (int i = 0; i < npeers; i++) {
        int peer = peers[i];
        rdma_conn_t *rc;
        hccl_sockaddr_t src, dst;
        HCCL_CHECK(conn_alloc(ctx, peer, &ctx->conns[peer]));
        rc = ctx->conns[peer];
        if (peer < env->rank)
            continue; /* the lower rank of a pair connects */
        if (ctx->v->create_id(ctx->cm_ch, &rc->id, rc, RDMA_PS_TCP) != 0)
            return HCCL_FAIL(hcclSystemError, "rank %d: rdma_create_id: %s", env->rank, strerror(errno));
        card_to_sockaddr(&ctx->card, &src);
        src.in4.sin_port = 0;
        card_to_sockaddr(peer_card(ctx, peer), &dst);
        if (ctx->v->resolve_addr(rc->id, &src.sa, &dst.sa, RDMA_RESOLVE_MS) != 0)
            return HCCL_FAIL(hcclSystemError, "rank %d: rdma_resolve_addr to rank %d (%s): %s",
                             env->rank, peer, rc->peer_addr, strerror(errno));
    }
    while (established < npeers) {
        /* [1]: the rendezvous calling the set-up off (another rank failed). */
        struct pollfd pfd[2] = {{.fd = ctx->cm_ch->fd, .events = POLLIN},
                                {.fd = env->setup_watch_fd, .events = POLLIN}};
        struct rdma_cm_event *ev;
        int64_t left = deadline_ms - hccl_now_ms();
        if (left <= 0)
            return HCCL_FAIL(hcclTimeout, "rank %d: rdma: %d of %d connections set up by the connect "
                             "deadline (HCCL_CONNECT_TIMEOUT)", env->rank, established, npeers);
        if (poll(pfd, 2, (int)(left < 1000 ? left : 1000)) < 0 && errno != EINTR)
            return HCCL_FAIL(hcclSystemError, "rank %d: rdma: poll: %s", env->rank, strerror(errno));
        if (pfd[1].revents)
            return hccl_link_setup_called_off(env, "rdma");
        while (ctx->v->get_cm_event(ctx->cm_ch, &ev) == 0) {
            struct rdma_cm_event copy = *ev;
            hcclResult_t res;
            /* The request's private data lives in the event: handle it before the ack. */
            res = copy.event == RDMA_CM_EVENT_CONNECT_REQUEST ? on_setup_event(ctx, ev, &established)
                                                             : hcclSuccess;
            ctx->v->ack_cm_event(ev);
            if (copy.event != RDMA_CM_EVENT_CONNECT_REQUEST)
                res = on_setup_event(ctx, &copy, &established);
            if (res != hcclSuccess)
                return res;
        }
    }
    return hcclSuccess;
}

/* After set-up: a disconnection is a clean close after the peer's goodbye, else a failure. */
void hccl_rdma_on_cm_event(evutil_socket_t fd, short what, void *arg)
{
    rdma_ctx_t *ctx = arg;
    struct rdma_cm_event *ev;

    (void)fd, (void)what;
    hccl_reactor_enter(ctx->env->reactor);
    while (ctx->v->get_cm_event(ctx->cm_ch, &ev) == 0) {
        enum rdma_cm_event_type type = ev->event;
        struct rdma_cm_id *id = ev->id;
        rdma_conn_t *rc = type == RDMA_CM_EVENT_CONNECT_REQUEST ? NULL : id->context;
        if (type == RDMA_CM_EVENT_CONNECT_REQUEST)
            ctx->v->reject(id, NULL, 0); /* every peer is connected already */
        ctx->v->ack_cm_event(ev);
        if (type == RDMA_CM_EVENT_CONNECT_REQUEST) {
            ctx->v->destroy_id(id);
            continue;
        }
        if (!rc || rc->failed || (type != RDMA_CM_EVENT_DISCONNECTED &&
                                  type != RDMA_CM_EVENT_DEVICE_REMOVAL))
            continue;
        if (hccl_framer_closed_cleanly(&rc->framer)) {
            HCCL_INFO(HCCL_SUB_LINK, "rank %d: rank %d closed its rdma connection", ctx->env->rank,
                      rc->peer);
            continue;
        }
        hccl_error_set_quiet(hcclRemoteError, "rank %d: rdma connection to rank %d (%s) %s",
                             ctx->env->rank, rc->peer, rc->peer_addr,
                             type == RDMA_CM_EVENT_DISCONNECTED
                                 ? "was disconnected (the peer died or closed)"
                                 : "lost its device");
        hccl_rdma_conn_fail(rc, hcclRemoteError);
    }
    hccl_reactor_leave(ctx->env->reactor);
}
