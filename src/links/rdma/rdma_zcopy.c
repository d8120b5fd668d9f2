/*
 * rdma: the zero-copy path. The receiver of a large transfer registers its buffer and sends a
 * clear-to-send (address, key, length); the sender writes the buffer there by RDMA WRITE, the
 * last piece with an immediate that completes the receive. A sender that has no clear-to-send
 * yet announces its transfer (ready-to-send), so that a receiver which posted the same
 * (seq, tag) as a staged receive, with a length below the threshold, fails at once; a staged
 * message that arrives for a zero-copy receive fails likewise. Each side picks the path by its
 * own length, so a different path means different lengths: a usage error naming both.
 */
#include <arpa/inet.h>
#include <string.h>

#include "links/rdma/rdma.h"

static hcclResult_t mismatch(rdma_conn_t *rc, const hccl_xfer_t *x, uint32_t peer_sig,
                             uint64_t peer_len, bool peer_sends)
{
    int me = rc->ctx->env->rank;
    char a[96], b[96];

    if (peer_sig && x->sig && peer_sig != x->sig) {
        hccl_sig_describe(peer_sig, a, sizeof(a));
        hccl_sig_describe(x->sig, b, sizeof(b));
        return HCCL_FAIL(hcclInvalidUsage,
                         "rank %d: collective mismatch at seq %llu: rank %d called %s, this rank %s "
                         "(every rank must call the same collectives in the same order)", me,
                         (unsigned long long)x->seq, rc->peer, a, b);
    }
    if (peer_sends)
        return HCCL_FAIL(hcclInvalidUsage,
                         "rank %d: rank %d sent %llu bytes for seq %llu tag %u but %zu were "
                         "expected (do the ranks call the same collective with the same count and "
                         "type?)", me, rc->peer, (unsigned long long)peer_len,
                         (unsigned long long)x->seq, x->tag, x->len);
    return HCCL_FAIL(hcclInvalidUsage,
                     "rank %d: rank %d expects %llu bytes for seq %llu tag %u but %zu are sent (do "
                     "the ranks call the same collective with the same count and type?)", me,
                     rc->peer, (unsigned long long)peer_len, (unsigned long long)x->seq, x->tag,
                     x->len);
}

static bool agrees(const hccl_xfer_t *x, uint32_t peer_sig, uint64_t peer_len)
{
    return peer_len == x->len && !(peer_sig && x->sig && peer_sig != x->sig);
}

/* A staged message from the peer for (seq, tag), whole or still arriving, or NULL. */
static const hccl_frame_t *staged_arrival(const rdma_conn_t *rc, uint64_t seq, uint32_t tag)
{
    const hccl_unexp_t *cur = rc->framer.rx_unexp;

    if (cur && cur->f.seq == seq && cur->f.tag == tag)
        return &cur->f;
    for (const hccl_unexp_t *u = rc->framer.unexp_head; u; u = u->next)
        if (u->f.seq == seq && u->f.tag == tag)
            return &u->f;
    return NULL;
}

static hcclResult_t check_no_staged(rdma_conn_t *rc, const hccl_xfer_t *x)
{
    const hccl_frame_t *f = staged_arrival(rc, x->seq, x->tag);

    return f ? mismatch(rc, x, f->sig, f->len, true) : hcclSuccess;
}

/* Zero-copy receives whose sender sent a staged message instead. */
static hcclResult_t check_arrivals(rdma_conn_t *rc)
{
    if (!rc->framer.unexp_head && !rc->framer.rx_unexp)
        return hcclSuccess;
    for (hccl_xfer_t *x = rc->zcts_wait.head; x; x = x->next)
        HCCL_CHECK(check_no_staged(rc, x));
    for (int id = 0; id < RDMA_ZRX_MAX && rc->nzrx > 0; id++)
        if (rc->zrx[id])
            HCCL_CHECK(check_no_staged(rc, rc->zrx[id]));
    return hcclSuccess;
}

static rdma_rts_held_t *rts_take(rdma_conn_t *rc, uint64_t seq, uint32_t tag)
{
    for (rdma_rts_held_t **pp = &rc->rts_held; *pp; pp = &(*pp)->next) {
        rdma_rts_held_t *h = *pp;
        if (h->rts.seq == seq && h->rts.tag == tag) {
            *pp = h->next;
            return h;
        }
    }
    return NULL;
}

hcclResult_t hccl_rdma_zcopy_check_staged_recv(rdma_conn_t *rc, const hccl_xfer_t *x)
{
    rdma_rts_held_t *h = rts_take(rc, x->seq, x->tag);
    hcclResult_t res;

    if (!h)
        return hcclSuccess;
    res = mismatch(rc, x, h->rts.sig, h->rts.len, true);
    hccl_free(h);
    return res;
}

hcclResult_t hccl_rdma_zcopy_post_recv(rdma_conn_t *rc, hccl_xfer_t *x)
{
    rdma_rts_held_t *h = rts_take(rc, x->seq, x->tag);
    hcclResult_t res = hcclSuccess;

    if (h && !agrees(x, h->rts.sig, h->rts.len))
        res = mismatch(rc, x, h->rts.sig, h->rts.len, true);
    else if (!h)
        res = check_no_staged(rc, x);
    hccl_free(h);
    if (hccl_is_failure(res)) {
        hccl_xfer_complete_later(rc->ctx->env->reactor, x, res);
        return res;
    }
    hccl_xfer_queue_push(&rc->zcts_wait, x);
    return hcclSuccess;
}

hcclResult_t hccl_rdma_zcopy_post_send(rdma_conn_t *rc, hccl_xfer_t *x)
{
    for (rdma_zsend_t *h = rc->cts_held; h; h = h->next)
        if (!h->x && h->cts.seq == x->seq && h->cts.tag == x->tag) {
            h->x = x; /* the receiver is ready: no announcement needed */
            return hcclSuccess;
        }
    hccl_xfer_queue_push(&rc->zrts_wait, x);
    return hcclSuccess;
}

/* Ready-to-sends for large sends that have no clear-to-send, as credits allow. */
static hcclResult_t zcopy_announce(rdma_conn_t *rc)
{
    while (rc->zrts_wait.head && hccl_rdma_can_send_data(rc)) {
        hccl_xfer_t *x = rc->zrts_wait.head;
        rdma_rts_t rts = {.seq = x->seq, .tag = x->tag, .sig = x->sig, .len = x->len};
        struct iovec iov = {.iov_base = &rts, .iov_len = sizeof(rts)};
        if (hccl_rdma_send_msg(rc, RDMA_MSG_RTS, &iov, 1, sizeof(rts)) < 0)
            return hcclRemoteError;
        hccl_xfer_queue_pop(&rc->zrts_wait);
        hccl_xfer_queue_push(&rc->zsend_wait, x);
    }
    return hcclSuccess;
}

/* Clear-to-sends for large receives, as credits allow. */
static hcclResult_t zcopy_offer(rdma_conn_t *rc)
{
    while (rc->zcts_wait.head && hccl_rdma_can_send_data(rc)) {
        hccl_xfer_t *x = rc->zcts_wait.head;
        rdma_cts_t cts;
        struct iovec iov = {.iov_base = &cts, .iov_len = sizeof(cts)};
        rdma_reg_t *reg;
        int id = 0;
        while (id < RDMA_ZRX_MAX && rc->zrx[id])
            id++;
        if (id == RDMA_ZRX_MAX)
            return hcclSuccess; /* a finished receive frees an id */
        HCCL_CHECK(hccl_rdma_reg_get(rc->ctx, x, false, &reg));
        memset(&cts, 0, sizeof(cts));
        cts.seq = x->seq;
        cts.tag = x->tag;
        cts.sig = x->sig;
        cts.len = x->len;
        cts.addr = (uintptr_t)x->buf;
        cts.rkey = reg->mr->rkey;
        cts.id = (uint32_t)id;
        if (hccl_rdma_send_msg(rc, RDMA_MSG_CTS, &iov, 1, sizeof(cts)) < 0) {
            hccl_rdma_reg_put(rc->ctx, reg);
            return hcclRemoteError;
        }
        hccl_xfer_queue_pop(&rc->zcts_wait);
        rc->zrx[id] = x;
        rc->zrx_reg[id] = reg;
        rc->nzrx++;
    }
    return hcclSuccess;
}

static hcclResult_t post_write(rdma_conn_t *rc, const rdma_zsend_t *h, const rdma_reg_t *reg,
                               size_t off, size_t n, bool last)
{
    const hccl_xfer_t *x = h->x;
    struct ibv_sge sge = {.addr = (uintptr_t)x->buf + off, .length = (uint32_t)n,
                          .lkey = reg->mr->lkey};
    struct ibv_send_wr wr, *bad;
    int ret;

    memset(&wr, 0, sizeof(wr));
    wr.wr_id = hccl_rdma_wr_id(rc, last ? RDMA_WR_WRITE_LAST : RDMA_WR_WRITE, 0);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(h->cts.id);
    wr.wr.rdma.remote_addr = h->cts.addr + off;
    wr.wr.rdma.rkey = h->cts.rkey;
    ret = rc->ctx->v->post_send(rc->id->qp, &wr, &bad);
    if (ret != 0)
        return HCCL_FAIL(hcclRemoteError, "rank %d: rdma write to rank %d (%s): %s",
                         rc->ctx->env->rank, rc->peer, rc->peer_addr, strerror(ret));
    rc->sends_out++;
    return hcclSuccess;
}

/* Writes matched large sends into the receivers' buffers, as credits allow. */
static hcclResult_t zcopy_write(rdma_conn_t *rc)
{
    rdma_zsend_t **pp = &rc->cts_held;

    while (*pp) {
        rdma_zsend_t *h = *pp;
        hccl_xfer_t *x = h->x;
        rdma_reg_t *reg;
        int pieces = (int)(((x ? x->len : 0) + RDMA_WRITE_MAX - 1) / RDMA_WRITE_MAX);
        if (!x) {
            pp = &h->next;
            continue;
        }
        if (!hccl_rdma_can_send_data(rc) || rc->sends_out + pieces > RDMA_NSEND + RDMA_CREDITS - 1)
            return hcclSuccess;
        if (!agrees(x, h->cts.sig, h->cts.len))
            return mismatch(rc, x, h->cts.sig, h->cts.len, false);
        HCCL_CHECK(hccl_rdma_reg_get(rc->ctx, x, true, &reg));
        for (size_t off = 0; off < x->len; off += RDMA_WRITE_MAX) {
            size_t n = x->len - off < RDMA_WRITE_MAX ? x->len - off : RDMA_WRITE_MAX;
            hcclResult_t res = post_write(rc, h, reg, off, n, off + n == x->len);
            if (res != hcclSuccess) {
                hccl_rdma_reg_put(rc->ctx, reg);
                return res;
            }
        }
        rc->credits--; /* the immediate consumes one of the peer's receives */
        *pp = h->next;
        h->next = NULL;
        h->reg = reg;
        if (rc->zsend_out_tail)
            rc->zsend_out_tail->next = h;
        else
            rc->zsend_out = h;
        rc->zsend_out_tail = h;
    }
    return hcclSuccess;
}

hcclResult_t hccl_rdma_zcopy_progress(rdma_conn_t *rc)
{
    HCCL_CHECK(check_arrivals(rc));
    HCCL_CHECK(zcopy_offer(rc));
    HCCL_CHECK(zcopy_announce(rc));
    return zcopy_write(rc);
}

/* A clear-to-send from the peer: pair it with its send, or keep it until the send is posted. */
hcclResult_t hccl_rdma_on_cts(rdma_conn_t *rc, const rdma_cts_t *cts)
{
    rdma_zsend_t *h = hccl_calloc(1, sizeof(*h)), **tail = &rc->cts_held;

    if (!h)
        return HCCL_FAIL(hcclSystemError, "rank %d: rdma: out of memory for a clear-to-send from "
                         "rank %d", rc->ctx->env->rank, rc->peer);
    h->cts = *cts;
    h->x = hccl_xfer_queue_take(&rc->zsend_wait, cts->seq, cts->tag);
    if (!h->x)
        h->x = hccl_xfer_queue_take(&rc->zrts_wait, cts->seq, cts->tag); /* announcing is moot */
    while (*tail)
        tail = &(*tail)->next;
    *tail = h;
    return hcclSuccess;
}

static hccl_xfer_t *zrecv_find(rdma_conn_t *rc, uint64_t seq, uint32_t tag)
{
    for (hccl_xfer_t *x = rc->zcts_wait.head; x; x = x->next)
        if (x->seq == seq && x->tag == tag)
            return x;
    for (int id = 0; id < RDMA_ZRX_MAX && rc->nzrx > 0; id++)
        if (rc->zrx[id] && rc->zrx[id]->seq == seq && rc->zrx[id]->tag == tag)
            return rc->zrx[id];
    return NULL;
}

/* A ready-to-send: our receive must be zero-copy too (with the same length), or is to come. */
hcclResult_t hccl_rdma_on_rts(rdma_conn_t *rc, const rdma_rts_t *rts)
{
    hccl_xfer_t *x = zrecv_find(rc, rts->seq, rts->tag);
    rdma_rts_held_t *h;

    if (x && agrees(x, rts->sig, rts->len))
        return hcclSuccess;
    if (x)
        return mismatch(rc, x, rts->sig, rts->len, true);
    for (x = rc->framer.posted.head; x; x = x->next)
        if (x->seq == rts->seq && x->tag == rts->tag)
            return mismatch(rc, x, rts->sig, rts->len, true);
    h = hccl_calloc(1, sizeof(*h));
    if (!h)
        return HCCL_FAIL(hcclSystemError, "rank %d: rdma: out of memory for a ready-to-send from "
                         "rank %d", rc->ctx->env->rank, rc->peer);
    h->rts = *rts;
    h->next = rc->rts_held;
    rc->rts_held = h;
    return hcclSuccess;
}

hcclResult_t hccl_rdma_on_write_imm(rdma_conn_t *rc, uint32_t id)
{
    hccl_xfer_t *x = id < RDMA_ZRX_MAX ? rc->zrx[id] : NULL;

    if (!x)
        return hccl_rdma_protocol_error(rc, "a write for no offered receive");
    rc->zrx[id] = NULL;
    rc->nzrx--;
    hccl_rdma_reg_put(rc->ctx, rc->zrx_reg[id]);
    rc->zrx_reg[id] = NULL;
    x->moved = x->len;
    hccl_link_stamp(&rc->conn.activity.rx_ms);
    hccl_xfer_complete_later(rc->ctx->env->reactor, x, hcclSuccess);
    return hcclSuccess;
}

/* Completions come in posting order: the oldest write is the one done. */
void hccl_rdma_on_write_done(rdma_conn_t *rc)
{
    rdma_zsend_t *h = rc->zsend_out;

    if (!h)
        return;
    rc->zsend_out = h->next;
    if (!rc->zsend_out)
        rc->zsend_out_tail = NULL;
    hccl_rdma_reg_put(rc->ctx, h->reg);
    h->x->moved = h->x->len;
    hccl_link_stamp(&rc->conn.activity.tx_ms);
    hccl_xfer_complete_later(rc->ctx->env->reactor, h->x, hcclSuccess);
    hccl_free(h);
}

static void fail_queue(rdma_conn_t *rc, hccl_xfer_queue_t *q, hcclResult_t res)
{
    hccl_xfer_t *x;

    while ((x = hccl_xfer_queue_pop(q)))
        if (res != hcclSuccess)
            hccl_xfer_complete_later(rc->ctx->env->reactor, x, res);
}

static void free_zsends(rdma_conn_t *rc, rdma_zsend_t **list, hcclResult_t res)
{
    while (*list) {
        rdma_zsend_t *h = *list;
        *list = h->next;
        hccl_rdma_reg_put(rc->ctx, h->reg);
        if (h->x && res != hcclSuccess)
            hccl_xfer_complete_later(rc->ctx->env->reactor, h->x, res);
        hccl_free(h);
    }
}

void hccl_rdma_zcopy_stop(rdma_conn_t *rc, hcclResult_t res)
{
    fail_queue(rc, &rc->zrts_wait, res);
    fail_queue(rc, &rc->zsend_wait, res);
    fail_queue(rc, &rc->zcts_wait, res);
    free_zsends(rc, &rc->zsend_out, res);
    rc->zsend_out_tail = NULL;
    free_zsends(rc, &rc->cts_held, res);
    for (int i = 0; i < RDMA_ZRX_MAX; i++) {
        if (rc->zrx[i] && res != hcclSuccess)
            hccl_xfer_complete_later(rc->ctx->env->reactor, rc->zrx[i], res);
        hccl_rdma_reg_put(rc->ctx, rc->zrx_reg[i]);
        rc->zrx[i] = NULL;
        rc->zrx_reg[i] = NULL;
    }
    rc->nzrx = 0;
    while (rc->rts_held) {
        rdma_rts_held_t *h = rc->rts_held;
        rc->rts_held = h->next;
        hccl_free(h);
    }
}
