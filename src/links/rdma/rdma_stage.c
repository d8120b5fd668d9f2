/*
 * rdma: the staged path. Messages go by SEND into the peer's registered staging slots; each
 * data message takes a credit (a slot the peer has posted for us) and credits come back with
 * the peer's messages, or alone once half of them are owed. The framing engine runs on
 * top, as over a socket. Completions of every work request are dispatched here.
 */
#include <arpa/inet.h>
#include <string.h>

#include "links/rdma/rdma.h"

#define HDR sizeof(rdma_msg_t)

uint64_t hccl_rdma_wr_id(const rdma_conn_t *rc, int kind, int slot)
{
    return (uint64_t)rc->peer << 16 | (uint64_t)kind << 8 | (uint64_t)slot;
}

static int post_recv_slot(rdma_conn_t *rc, int slot)
{
    struct ibv_sge sge = {.addr = (uintptr_t)(rc->rx_buf + (size_t)slot * rc->slot),
                          .length = (uint32_t)rc->slot,
                          .lkey = rc->rx_mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = hccl_rdma_wr_id(rc, RDMA_WR_RECV, slot), .sg_list = &sge,
                             .num_sge = 1};
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
hcclResult_t hccl_rdma_repost(rdma_conn_t *rc, int slot, bool owe)
{
    int ret = post_recv_slot(rc, slot);

    if (ret != 0)
        return HCCL_FAIL(hcclSystemError, "rank %d: rdma ibv_post_recv for rank %d: %s",
                         rc->ctx->env->rank, rc->peer, strerror(ret));
    if (owe)
        rc->owed++;
    return hcclSuccess;
}

/* Data messages take a credit, credit returns do not. */
int hccl_rdma_send_msg(rdma_conn_t *rc, uint16_t type, const struct iovec *iov, int iovcnt,
                       size_t max)
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
    wr.wr_id = hccl_rdma_wr_id(rc, RDMA_WR_SEND, slot);
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

/* A credit, and a slot beyond the one kept for credit returns. */
bool hccl_rdma_can_send_data(const rdma_conn_t *rc)
{
    return !rc->failed && rc->credits > 0 && rc->ntx_free > 1 &&
           rc->sends_out < RDMA_NSEND + RDMA_CREDITS - 1;
}

static ssize_t rdma_io_writev(hccl_framer_t *s, const struct iovec *iov, int iovcnt)
{
    rdma_conn_t *rc = s->transport;

    if (!hccl_rdma_can_send_data(rc))
        return 0; /* a completion or a credit return wakes the framer */
    return hccl_rdma_send_msg(rc, RDMA_MSG_STREAM, iov, iovcnt, rc->slot - HDR);
}

static ssize_t rdma_io_read(hccl_framer_t *s, void *buf, size_t len)
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
            if (hccl_rdma_repost(rc, slot, true) != hcclSuccess)
                return -1;
        }
    }
    return (ssize_t)got;
}

static const hccl_framer_io_t rdma_io = {
    .read = rdma_io_read,
    .writev = rdma_io_writev,
};

void hccl_rdma_conn_init_framer(rdma_conn_t *rc)
{
    hccl_link_env_t *env = rc->ctx->env;

    hccl_framer_init(&rc->framer, &rdma_io, env->reactor, rc, env->rank, rc->peer, SIZE_MAX);
    rc->framer.comm_id = env->comm_id;
    rc->framer.nranks = env->nranks;
    rc->framer.activity = &rc->conn.activity;
}

hcclResult_t hccl_rdma_protocol_error(rdma_conn_t *rc, const char *what)
{
    return HCCL_FAIL(hcclRemoteError, "rank %d: malformed rdma message from rank %d (%s): %s",
                     rc->ctx->env->rank, rc->peer, rc->peer_addr, what);
}

static hcclResult_t on_recv(rdma_conn_t *rc, const struct ibv_wc *wc, int slot)
{
    const rdma_msg_t *m = (const rdma_msg_t *)(rc->rx_buf + (size_t)slot * rc->slot);
    const char *body = (const char *)m + HDR;

    if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        HCCL_CHECK(hccl_rdma_on_write_imm(rc, ntohl(wc->imm_data)));
        return hccl_rdma_repost(rc, slot, true);
    }
    if (wc->byte_len < HDR || m->len > wc->byte_len - HDR)
        return hccl_rdma_protocol_error(rc, "short message");
    rc->credits += m->credits;
    if (rc->credits > RDMA_CREDITS)
        return hccl_rdma_protocol_error(rc, "more credits than slots");
    switch (m->type) {
    case RDMA_MSG_STREAM: {
        int at = (rc->rx_head + rc->rx_count) % RDMA_NRECV;
        rc->rx_ready[at] = slot;
        rc->rx_ready_len[at] = m->len;
        rc->rx_count++;
        return hcclSuccess; /* reposted once the framer has read it */
    }
    case RDMA_MSG_CTS: {
        rdma_cts_t cts;
        if (m->len != sizeof(cts))
            return hccl_rdma_protocol_error(rc, "clear-to-send of the wrong size");
        memcpy(&cts, body, sizeof(cts));
        HCCL_CHECK(hccl_rdma_on_cts(rc, &cts));
        return hccl_rdma_repost(rc, slot, true);
    }
    case RDMA_MSG_RTS: {
        rdma_rts_t rts;
        if (m->len != sizeof(rts))
            return hccl_rdma_protocol_error(rc, "ready-to-send of the wrong size");
        memcpy(&rts, body, sizeof(rts));
        HCCL_CHECK(hccl_rdma_on_rts(rc, &rts));
        return hccl_rdma_repost(rc, slot, true);
    }
    case RDMA_MSG_CREDIT:
        return hccl_rdma_repost(rc, slot, false);
    default:
        return hccl_rdma_protocol_error(rc, "unknown type");
    }
}

void hccl_rdma_conn_progress(rdma_conn_t *rc)
{
    hcclResult_t res = hcclSuccess;

    if (rc->failed)
        return;
    if (rc->rx_count > 0)
        res = hccl_framer_rx(&rc->framer, SIZE_MAX);
    if (!hccl_is_failure(res))
        res = hccl_rdma_zcopy_progress(rc);
    if (!hccl_is_failure(res))
        res = hccl_framer_tx(&rc->framer);
    if (!hccl_is_failure(res) && rc->owed >= RDMA_CREDITS / 2 && rc->ntx_free > 0 &&
        hccl_rdma_send_msg(rc, RDMA_MSG_CREDIT, NULL, 0, 0) < 0)
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
    if (kind == RDMA_WR_RECV)
        res = on_recv(rc, wc, slot);
    else if (kind == RDMA_WR_WRITE_LAST)
        hccl_rdma_on_write_done(rc);
    if (hccl_is_failure(res))
        hccl_rdma_conn_fail(rc, res);
    else
        hccl_rdma_conn_progress(rc);
}
