/* rdma: the link vtable and the data path (staging slots with credits, zero-copy writes). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "links/rdma/rdma.h"

_Static_assert(sizeof(rdma_card_t) <= HCCL_CARD_BLOB_BYTES, "rdma card too large");

#define HDR sizeof(rdma_msg_t)

static uint64_t wr_id(const rdma_conn_t *rc, int kind, int slot)
{
    return (uint64_t)rc->peer << 16 | (uint64_t)kind << 8 | (uint64_t)slot;
}

static int post_recv_slot(rdma_conn_t *rc, int slot)
{
    struct ibv_sge sge = {.addr = (uintptr_t)(rc->rx_buf + (size_t)slot * rc->slot),
                          .length = (uint32_t)rc->slot,
                          .lkey = rc->rx_mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = wr_id(rc, RDMA_WR_RECV, slot), .sg_list = &sge, .num_sge = 1};
    struct ibv_recv_wr *bad;

    return rc->ctx->v->post_recv(rc->id->qp, &wr, &bad);
}

hcclResult_t hccl_rdma_conn_post_recvs(rdma_conn_t *rc)
{
    for (int i = 0; i < RDMA_NRECV; i++) {
        int ret = post_recv_slot(rc, i);
        if (ret != 0)
            return HCCL_FAIL(hcclSystemError, "rank %d: rdma ibv_post_recv for rank %d: %s",
                             rc->ctx->env->rank, rc->peer, strerror(ret));
    }
    return hcclSuccess;
}

/* A slot is free again: the peer may fill it (the credit goes back with our next message). */
static hcclResult_t repost(rdma_conn_t *rc, int slot, bool owe)
{
    int ret = post_recv_slot(rc, slot);

    if (ret != 0)
        return HCCL_FAIL(hcclSystemError, "rank %d: rdma ibv_post_recv for rank %d: %s",
                         rc->ctx->env->rank, rc->peer, strerror(ret));
    if (owe)
        rc->owed++;
    return hcclSuccess;
}

/* Sends one staged message; data messages take a credit, credit returns do not. */
static int send_msg(rdma_conn_t *rc, uint16_t type, const struct iovec *iov, int iovcnt, size_t max)
{
    int slot = rc->tx_free[--rc->ntx_free];
    char *p = rc->tx_buf + (size_t)slot * rc->slot;
    rdma_msg_t *m = (rdma_msg_t *)p;
    size_t len = 0;
    struct ibv_sge sge;
    struct ibv_send_wr wr, *bad;
    int ret;

    for (int i = 0; i < iovcnt && len < max; i++) {
        size_t n = iov[i].iov_len < max - len ? iov[i].iov_len : max - len;
        memcpy(p + HDR + len, iov[i].iov_base, n);
        len += n;
    }
    memset(m, 0, sizeof(*m));
    m->type = type;
    m->credits = rc->owed;
    m->len = (uint32_t)len;
    sge.addr = (uintptr_t)p;
    sge.length = (uint32_t)(HDR + len);
    sge.lkey = rc->tx_mr->lkey;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = wr_id(rc, RDMA_WR_SEND, slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ret = rc->ctx->v->post_send(rc->id->qp, &wr, &bad);
    if (ret != 0) {
        rc->tx_free[rc->ntx_free++] = slot;
        hccl_error_set_quiet(hcclRemoteError, "rank %d: rdma ibv_post_send to rank %d (%s): %s",
                             rc->ctx->env->rank, rc->peer, rc->peer_addr, strerror(ret));
        return -1;
    }
    rc->owed = 0;
    rc->sends_out++;
    if (type != RDMA_MSG_CREDIT)
        rc->credits--;
    return (int)len;
}

/* A data message may go: a credit, and a slot beyond the one kept for credit returns. */
static bool can_send_data(const rdma_conn_t *rc)
{
    return !rc->failed && rc->credits > 0 && rc->ntx_free > 1 &&
           rc->sends_out < RDMA_NSEND + RDMA_CREDITS - 1;
}

static ssize_t rdma_io_writev(hccl_stream_t *s, const struct iovec *iov, int iovcnt)
{
    rdma_conn_t *rc = s->transport;

    if (!can_send_data(rc))
        return 0; /* a completion or a credit return wakes the stream */
    return send_msg(rc, RDMA_MSG_STREAM, iov, iovcnt, rc->slot - HDR);
}

static ssize_t rdma_io_read(hccl_stream_t *s, void *buf, size_t len)
{
    rdma_conn_t *rc = s->transport;
    size_t got = 0;

    while (got < len && rc->rx_count > 0) {
        int slot = rc->rx_ready[rc->rx_head];
        const char *p = rc->rx_buf + (size_t)slot * rc->slot + HDR;
        size_t left = rc->rx_ready_len[rc->rx_head] - rc->rx_off;
        size_t n = left < len - got ? left : len - got;
        memcpy((char *)buf + got, p + rc->rx_off, n);
        got += n;
        rc->rx_off += n;
        if (rc->rx_off == rc->rx_ready_len[rc->rx_head]) {
            rc->rx_off = 0;
            rc->rx_head = (rc->rx_head + 1) % RDMA_NRECV;
            rc->rx_count--;
            if (repost(rc, slot, true) != hcclSuccess)
                return -1;
        }
    }
    return (ssize_t)got;
}

static const hccl_stream_io_t rdma_io = {
    .read = rdma_io_read,
    .writev = rdma_io_writev,
};

void hccl_rdma_conn_init_stream(rdma_conn_t *rc)
{
    hccl_link_env_t *env = rc->ctx->env;

    hccl_stream_init(&rc->stream, &rdma_io, env->reactor, rc, env->rank, rc->peer, SIZE_MAX);
    rc->stream.comm_id = env->comm_id;
    rc->stream.activity = &rc->conn.activity;
}

static void fail_queue(rdma_conn_t *rc, hccl_xfer_queue_t *q, hcclResult_t res)
{
    hccl_xfer_t *x;

    while ((x = hccl_xfer_queue_pop(q)))
        hccl_xfer_complete_later(rc->ctx->env->reactor, x, res);
}

static rdma_reg_t *reg_find(rdma_ctx_t *ctx, void *buf, size_t len)
{
    for (int i = 0; i < RDMA_REG_CACHE; i++)
        if (ctx->regs[i].mr && ctx->regs[i].addr == buf && ctx->regs[i].len == len &&
            ctx->regs[i].inflight > 0)
            return &ctx->regs[i];
    return NULL;
}

/* Fails every transfer of the connection and stops its queue pair; resources stay for fini. */
static void conn_stop(rdma_conn_t *rc, hcclResult_t res)
{
    hccl_reactor_t *r = rc->ctx->env->reactor;
    hccl_xfer_t *x;

    if (rc->failed)
        return;
    rc->failed = true;
    hccl_stream_fail(&rc->stream, res);
    fail_queue(rc, &rc->zsend_wait, res);
    fail_queue(rc, &rc->zcts_wait, res);
    while ((x = hccl_xfer_queue_pop(&rc->zsend_out))) {
        hccl_rdma_reg_put(reg_find(rc->ctx, x->buf, x->len));
        hccl_xfer_complete_later(r, x, res);
    }
    while (rc->cts_held) {
        rdma_cts_held_t *h = rc->cts_held;
        rc->cts_held = h->next;
        if (h->x)
            hccl_xfer_complete_later(r, h->x, res);
        hccl_free(h);
    }
    for (int i = 0; i < RDMA_ZRX_MAX; i++) {
        if (rc->zrx[i])
            hccl_xfer_complete_later(r, rc->zrx[i], res);
        hccl_rdma_reg_put(rc->zrx_reg[i]);
        rc->zrx[i] = NULL;
        rc->zrx_reg[i] = NULL;
    }
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

/* Clear-to-sends for large receives, as credits allow. */
static hcclResult_t zcopy_offer(rdma_conn_t *rc)
{
    while (rc->zcts_wait.head && can_send_data(rc)) {
        hccl_xfer_t *x = rc->zcts_wait.head;
        rdma_cts_t cts;
        struct iovec iov = {.iov_base = &cts, .iov_len = sizeof(cts)};
        rdma_reg_t *reg;
        int id = 0;
        while (id < RDMA_ZRX_MAX && rc->zrx[id])
            id++;
        if (id == RDMA_ZRX_MAX)
            return hcclSuccess; /* a finished receive frees an id */
        HCCL_CHECK(hccl_rdma_reg_get(rc->ctx, x->buf, x->len, &reg));
        memset(&cts, 0, sizeof(cts));
        cts.seq = x->seq;
        cts.tag = x->tag;
        cts.sig = x->sig;
        cts.len = x->len;
        cts.addr = (uintptr_t)x->buf;
        cts.rkey = reg->mr->rkey;
        cts.id = (uint32_t)id;
        if (send_msg(rc, RDMA_MSG_CTS, &iov, 1, sizeof(cts)) < 0) {
            hccl_rdma_reg_put(reg);
            return hcclRemoteError;
        }
        hccl_xfer_queue_pop(&rc->zcts_wait);
        rc->zrx[id] = x;
        rc->zrx_reg[id] = reg;
    }
    return hcclSuccess;
}

static hcclResult_t zcopy_mismatch(rdma_conn_t *rc, const rdma_cts_t *c, const hccl_xfer_t *x)
{
    char a[96], b[96];

    if (c->sig && x->sig && c->sig != x->sig) {
        hccl_sig_describe(c->sig, a, sizeof(a));
        hccl_sig_describe(x->sig, b, sizeof(b));
        return HCCL_FAIL(hcclInvalidUsage, "rank %d: collective mismatch at seq %llu: rank %d called "
                         "%s, this rank %s", rc->ctx->env->rank, (unsigned long long)x->seq, rc->peer,
                         a, b);
    }
    return HCCL_FAIL(hcclInvalidUsage, "rank %d: rank %d expects %llu bytes for seq %llu tag %u but "
                     "%zu are sent (do the ranks call the same collective with the same count and "
                     "type?)", rc->ctx->env->rank, rc->peer, (unsigned long long)c->len,
                     (unsigned long long)x->seq, x->tag, x->len);
}

/* Writes matched large sends into the receivers' buffers, as credits allow. */
static hcclResult_t zcopy_write(rdma_conn_t *rc)
{
    rdma_cts_held_t **pp = &rc->cts_held;

    while (*pp) {
        rdma_cts_held_t *h = *pp;
        hccl_xfer_t *x = h->x;
        rdma_reg_t *reg;
        size_t off = 0;
        int pieces = (int)(((x ? x->len : 0) + RDMA_WRITE_MAX - 1) / RDMA_WRITE_MAX);
        if (!x) {
            pp = &h->next;
            continue;
        }
        if (!can_send_data(rc) || rc->sends_out + pieces > RDMA_NSEND + RDMA_CREDITS - 1)
            return hcclSuccess;
        if (h->cts.len != x->len || (h->cts.sig && x->sig && h->cts.sig != x->sig))
            return zcopy_mismatch(rc, &h->cts, x);
        HCCL_CHECK(hccl_rdma_reg_get(rc->ctx, x->buf, x->len, &reg));
        while (off < x->len) {
            size_t n = x->len - off < RDMA_WRITE_MAX ? x->len - off : RDMA_WRITE_MAX;
            bool last = off + n == x->len;
            struct ibv_sge sge = {.addr = (uintptr_t)x->buf + off, .length = (uint32_t)n,
                                  .lkey = reg->mr->lkey};
            struct ibv_send_wr wr, *bad;
            int ret;
            memset(&wr, 0, sizeof(wr));
            wr.wr_id = wr_id(rc, last ? RDMA_WR_WRITE_LAST : RDMA_WR_WRITE, 0);
            wr.sg_list = &sge;
            wr.num_sge = 1;
            wr.opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
            wr.send_flags = IBV_SEND_SIGNALED;
            wr.imm_data = htonl(h->cts.id);
            wr.wr.rdma.remote_addr = h->cts.addr + off;
            wr.wr.rdma.rkey = h->cts.rkey;
            ret = rc->ctx->v->post_send(rc->id->qp, &wr, &bad);
            if (ret != 0) {
                hccl_rdma_reg_put(reg);
                return HCCL_FAIL(hcclRemoteError, "rank %d: rdma write to rank %d (%s): %s",
                                 rc->ctx->env->rank, rc->peer, rc->peer_addr, strerror(ret));
            }
            rc->sends_out++;
            off += n;
        }
        rc->credits--; /* the immediate consumes one of the peer's receives */
        *pp = h->next;
        hccl_free(h);
        hccl_xfer_queue_push(&rc->zsend_out, x);
    }
    return hcclSuccess;
}

/* A clear-to-send from the peer: pair it with its send, or keep it until the send is posted. */
static hcclResult_t on_cts(rdma_conn_t *rc, const rdma_cts_t *cts)
{
    rdma_cts_held_t *h = hccl_calloc(1, sizeof(*h)), **tail = &rc->cts_held;

    if (!h)
        return HCCL_FAIL(hcclSystemError, "rdma: out of memory");
    h->cts = *cts;
    h->x = hccl_xfer_queue_take(&rc->zsend_wait, cts->seq, cts->tag);
    while (*tail)
        tail = &(*tail)->next;
    *tail = h;
    return hcclSuccess;
}

static hcclResult_t conn_protocol_error(rdma_conn_t *rc, const char *what)
{
    return HCCL_FAIL(hcclRemoteError, "rank %d: malformed rdma message from rank %d (%s): %s",
                     rc->ctx->env->rank, rc->peer, rc->peer_addr, what);
}

static hcclResult_t on_recv(rdma_conn_t *rc, const struct ibv_wc *wc, int slot)
{
    const rdma_msg_t *m = (const rdma_msg_t *)(rc->rx_buf + (size_t)slot * rc->slot);

    if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        uint32_t id = ntohl(wc->imm_data);
        hccl_xfer_t *x = id < RDMA_ZRX_MAX ? rc->zrx[id] : NULL;
        if (!x)
            return conn_protocol_error(rc, "a write for no offered receive");
        rc->zrx[id] = NULL;
        hccl_rdma_reg_put(rc->zrx_reg[id]);
        rc->zrx_reg[id] = NULL;
        x->moved = x->len;
        hccl_link_stamp(&rc->conn.activity.rx_ms);
        hccl_xfer_complete_later(rc->ctx->env->reactor, x, hcclSuccess);
        return repost(rc, slot, true);
    }
    if (wc->byte_len < HDR || m->len > wc->byte_len - HDR)
        return conn_protocol_error(rc, "short message");
    rc->credits += m->credits;
    if (rc->credits > RDMA_CREDITS)
        return conn_protocol_error(rc, "more credits than slots");
    switch (m->type) {
    case RDMA_MSG_STREAM: {
        int at = (rc->rx_head + rc->rx_count) % RDMA_NRECV;
        rc->rx_ready[at] = slot;
        rc->rx_ready_len[at] = m->len;
        rc->rx_count++;
        return hcclSuccess; /* reposted once the stream has read it */
    }
    case RDMA_MSG_CTS: {
        rdma_cts_t cts;
        if (m->len != sizeof(cts))
            return conn_protocol_error(rc, "clear-to-send of the wrong size");
        memcpy(&cts, (const char *)m + HDR, sizeof(cts));
        HCCL_CHECK(on_cts(rc, &cts));
        return repost(rc, slot, true);
    }
    case RDMA_MSG_CREDIT:
        return repost(rc, slot, false);
    default:
        return conn_protocol_error(rc, "unknown type");
    }
}

/* Everything that may move after a completion or a post. */
static void conn_progress(rdma_conn_t *rc)
{
    hcclResult_t res = hcclSuccess;

    if (rc->failed)
        return;
    if (rc->rx_count > 0)
        res = hccl_stream_rx(&rc->stream, SIZE_MAX);
    if (!hccl_is_failure(res))
        res = zcopy_offer(rc);
    if (!hccl_is_failure(res))
        res = zcopy_write(rc);
    if (!hccl_is_failure(res))
        res = hccl_stream_tx(&rc->stream);
    if (!hccl_is_failure(res) && rc->owed >= RDMA_CREDITS / 2 && rc->ntx_free > 0 &&
        send_msg(rc, RDMA_MSG_CREDIT, NULL, 0, 0) < 0)
        res = hcclRemoteError;
    if (hccl_is_failure(res))
        hccl_rdma_conn_fail(rc, res);
}

static const char *wr_kind(int kind)
{
    switch (kind) {
    case RDMA_WR_RECV: return "receive from";
    case RDMA_WR_SEND: return "send to";
    default: return "write to";
    }
}

void hccl_rdma_complete(rdma_ctx_t *ctx, const struct ibv_wc *wc)
{
    int peer = (int)(wc->wr_id >> 16), kind = (int)(wc->wr_id >> 8) & 0xff;
    int slot = (int)(wc->wr_id & 0xff);
    rdma_conn_t *rc = peer < ctx->env->nranks ? ctx->conns[peer] : NULL;
    hcclResult_t res = hcclSuccess;
    hccl_xfer_t *x;

    if (!rc)
        return;
    if (kind != RDMA_WR_RECV)
        rc->sends_out--;
    if (kind == RDMA_WR_SEND)
        rc->tx_free[rc->ntx_free++] = slot;
    if (rc->failed)
        return; /* flushed after the failure was reported */
    if (wc->status != IBV_WC_SUCCESS) {
        hccl_error_set_quiet(hcclRemoteError, "rank %d: rdma %s rank %d (%s) failed: %s (status %d, "
                             "vendor error 0x%x, qp 0x%x)", ctx->env->rank, wr_kind(kind), peer,
                             rc->peer_addr, ctx->v->wc_status_str(wc->status), (int)wc->status,
                             wc->vendor_err, wc->qp_num);
        hccl_rdma_conn_fail(rc, hcclRemoteError);
        return;
    }
    switch (kind) {
    case RDMA_WR_RECV:
        res = on_recv(rc, wc, slot);
        break;
    case RDMA_WR_WRITE_LAST:
        x = hccl_xfer_queue_pop(&rc->zsend_out); /* completions come in posting order */
        if (x) {
            hccl_rdma_reg_put(reg_find(ctx, x->buf, x->len));
            x->moved = x->len;
            hccl_link_stamp(&rc->conn.activity.tx_ms);
            hccl_xfer_complete_later(ctx->env->reactor, x, hcclSuccess);
        }
        break;
    default:
        break;
    }
    if (hccl_is_failure(res))
        hccl_rdma_conn_fail(rc, res);
    else
        conn_progress(rc);
}

static hcclResult_t rdma_link_post_send(hccl_conn_t *c, hccl_xfer_t *x)
{
    rdma_conn_t *rc = c->priv;
    rdma_cts_held_t *h;

    if (rc->failed || x->len < rc->ctx->zcopy_min) {
        hcclResult_t res = hccl_stream_post_send(&rc->stream, x);
        if (hccl_is_failure(res))
            hccl_rdma_conn_fail(rc, res);
        return hcclSuccess;
    }
    for (h = rc->cts_held; h; h = h->next)
        if (!h->x && h->cts.seq == x->seq && h->cts.tag == x->tag)
            break;
    if (h)
        h->x = x;
    else
        hccl_xfer_queue_push(&rc->zsend_wait, x);
    conn_progress(rc);
    return hcclSuccess;
}

static hcclResult_t rdma_link_post_recv(hccl_conn_t *c, hccl_xfer_t *x)
{
    rdma_conn_t *rc = c->priv;

    if (rc->failed || x->len < rc->ctx->zcopy_min) {
        hcclResult_t res = hccl_stream_post_recv(&rc->stream, x);
        if (hccl_is_failure(res))
            hccl_rdma_conn_fail(rc, res);
        else
            conn_progress(rc); /* the stream may have queued a control frame */
        return hcclSuccess;
    }
    hccl_xfer_queue_push(&rc->zcts_wait, x);
    conn_progress(rc);
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
    if (sa.sa.sa_family == AF_INET6)
        memcpy(ctx->card.addr, &sa.in6.sin6_addr, 16);
    else
        memcpy(ctx->card.addr, &sa.in4.sin_addr, 4);
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
        hccl_rdma_conn_init_stream(rc);
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
        if (rc && !rc->failed && (hccl_stream_tx_pending(&rc->stream) || rc->sends_out > 0))
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
            hccl_stream_send_bye(&rc->stream);
            conn_progress(rc);
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
