/* The verbs model (verbs_model.h): queue pairs and the wire between them. */
#include <errno.h>
#include <string.h>

#include "model_internal.h"

static int next_qpn = 0x10;

static void complete_wr(m_qp_t *q, const m_wr_t *w, enum ibv_wc_status st, int opcode, uint32_t len)
{
    struct ibv_wc wc;

    memset(&wc, 0, sizeof(wc));
    wc.wr_id = w->wr_id;
    wc.status = st;
    wc.opcode = opcode;
    wc.byte_len = len;
    wc.qp_num = q->qp.qp_num;
    model_cq_push(q->cq, &wc);
}

/* The QP enters the error state: every outstanding work request is flushed. */
void model_qp_error(m_qp_t *q)
{
    if (!q || q->error)
        return;
    q->error = true;
    while (q->sq_count) {
        complete_wr(q, &q->sq[q->sq_head], IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, 0);
        q->sq_head = (q->sq_head + 1) % QDEPTH;
        q->sq_count--;
        q->sq_out--;
    }
    while (q->rq_count) {
        complete_wr(q, &q->rq[q->rq_head], IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0);
        q->rq_head = (q->rq_head + 1) % QDEPTH;
        q->rq_count--;
    }
}

int m_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    m_qp_t *q = (m_qp_t *)qp;

    LOCK();
    for (; wr; wr = wr->next) {
        m_wr_t w = {.wr_id = wr->wr_id, .addr = wr->sg_list[0].addr, .len = wr->sg_list[0].length,
                    .lkey = wr->sg_list[0].lkey};
        if (model_fail_now() || q->rq_count >= q->max_recv ||
            !model_mr_check(q->pd, w.lkey, w.addr, w.len, IBV_ACCESS_LOCAL_WRITE)) {
            if (q->rq_count >= q->max_recv)
                model_violate("ibv_post_recv beyond max_recv_wr");
            *bad = wr;
            UNLOCK();
            return q->rq_count >= q->max_recv ? ENOMEM : EINVAL;
        }
        if (q->error) {
            complete_wr(q, &w, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0);
            continue;
        }
        q->rq[(q->rq_head + q->rq_count) % QDEPTH] = w;
        q->rq_count++;
    }
    if (model_auto)
        model_pump_locked();
    UNLOCK();
    return 0;
}

int m_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    m_qp_t *q = (m_qp_t *)qp;

    LOCK();
    for (; wr; wr = wr->next) {
        m_wr_t w = {.wr_id = wr->wr_id, .opcode = wr->opcode, .addr = wr->sg_list[0].addr,
                    .len = wr->sg_list[0].length, .lkey = wr->sg_list[0].lkey,
                    .rkey = wr->wr.rdma.rkey, .raddr = wr->wr.rdma.remote_addr, .imm = wr->imm_data};
        if (q->sq_out >= q->max_send) {
            model_violate("ibv_post_send beyond max_send_wr");
            *bad = wr;
            UNLOCK();
            return ENOMEM;
        }
        if (model_fail_now() || !q->peer || !model_mr_check(q->pd, w.lkey, w.addr, w.len, 0)) {
            *bad = wr;
            UNLOCK();
            return EINVAL;
        }
        q->sq_out++;
        if (q->error) {
            complete_wr(q, &w, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, 0);
            q->sq_out--;
            continue;
        }
        q->sq[(q->sq_head + q->sq_count) % QDEPTH] = w;
        q->sq_count++;
    }
    if (model_auto)
        model_pump_locked();
    UNLOCK();
    return 0;
}

/* Delivers the head of q's send queue; false when the receiver has no receive posted. */
static bool deliver(m_qp_t *q)
{
    m_wr_t w = q->sq[q->sq_head];
    m_qp_t *p = q->peer;
    bool write = w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    bool needs_recv = w.opcode == IBV_WR_SEND || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    enum ibv_wc_status st = IBV_WC_SUCCESS;
    const m_mr_t *lmr, *rmr;
    bool lands = true;
    m_wr_t r = {0};

    if (model_inject != IBV_WC_SUCCESS) {
        st = model_inject;
        model_inject = IBV_WC_SUCCESS;
    } else if (!p || p->error) {
        st = IBV_WC_RETRY_EXC_ERR;
    } else if (needs_recv && p->rq_count == 0) {
        model_st.rnr++; /* RNR NAK: retried forever (rnr_retry 7), but the sender overran us */
        return false;
    }
    if (st == IBV_WC_SUCCESS) {
        lmr = model_mr_check(q->pd, w.lkey, w.addr, w.len, 0);
        if (!lmr) {
            model_violate("an MR deregistered while a send or write from it was in flight");
            st = IBV_WC_LOC_PROT_ERR;
        } else if (model_mr_stale(lmr, w.addr, w.len)) {
            model_violate("a send or write read a freed buffer through a stale (pinned) MR");
        }
    }
    if (st == IBV_WC_SUCCESS && write) {
        rmr = model_mr_check(p->pd, w.rkey, w.raddr, w.len, IBV_ACCESS_REMOTE_WRITE);
        if (!rmr) {
            st = IBV_WC_REM_ACCESS_ERR;
        } else if (model_mr_stale(rmr, w.raddr, w.len)) {
            /* The pinned pages are the freed ones: the data lands there, not in the buffer. */
            model_violate("an RDMA write landed in freed memory through a stale (pinned) MR");
            lands = false;
        }
    }
    if (st == IBV_WC_SUCCESS && w.opcode == IBV_WR_SEND && p->rq[p->rq_head].len < w.len)
        st = IBV_WC_REM_INV_REQ_ERR;
    q->sq_head = (q->sq_head + 1) % QDEPTH;
    q->sq_count--;
    q->sq_out--;
    if (st != IBV_WC_SUCCESS) {
        complete_wr(q, &w, st, w.opcode == IBV_WR_SEND ? IBV_WC_SEND : IBV_WC_RDMA_WRITE, 0);
        model_qp_error(q);
        return true;
    }
    if (w.opcode == IBV_WR_SEND)
        memcpy((void *)p->rq[p->rq_head].addr, (void *)w.addr, w.len);
    else if (lands)
        memcpy((void *)(uintptr_t)w.raddr, (void *)w.addr, w.len);
    complete_wr(q, &w, IBV_WC_SUCCESS, w.opcode == IBV_WR_SEND ? IBV_WC_SEND : IBV_WC_RDMA_WRITE, w.len);
    if (needs_recv) {
        struct ibv_wc wc;
        r = p->rq[p->rq_head];
        p->rq_head = (p->rq_head + 1) % QDEPTH;
        p->rq_count--;
        memset(&wc, 0, sizeof(wc));
        wc.wr_id = r.wr_id;
        wc.byte_len = w.len;
        wc.qp_num = p->qp.qp_num;
        if (w.opcode == IBV_WR_SEND) {
            wc.opcode = IBV_WC_RECV;
            model_st.sends++;
        } else {
            wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
            wc.wc_flags = IBV_WC_WITH_IMM;
            wc.imm_data = w.imm;
            model_st.writes_imm++;
        }
        model_cq_push(p->cq, &wc);
    }
    return true;
}

int model_pump_locked(void)
{
    int moved = 0;

    for (int i = 0; i < MAXO; i++)
        while (model_qps[i].live && model_qps[i].sq_count && deliver(&model_qps[i]))
            moved++;
    return moved;
}

int model_pump(void)
{
    LOCK();
    int moved = model_pump_locked();
    UNLOCK();
    return moved;
}

int m_create_qp(struct rdma_cm_id *cid, struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
    int i;

    LOCK();
    FIND_FREE(model_qps, MAXO, i);
    if (pd->context != cid->verbs)
        model_violate("rdma_create_qp with a PD of another device context");
    if (model_fail_now() || i == MAXO || a->qp_type != IBV_QPT_RC || a->send_cq != a->recv_cq) {
        UNLOCK();
        errno = EINVAL;
        return -1;
    }
    memset(&model_qps[i], 0, sizeof(model_qps[i]));
    model_qps[i].live = true;
    model_qps[i].qp.qp_num = (uint32_t)next_qpn++;
    model_qps[i].qp.pd = pd;
    model_qps[i].qp.context = pd->context;
    model_qps[i].pd = (m_pd_t *)pd;
    model_qps[i].cq = (m_cq_t *)a->send_cq;
    model_qps[i].max_send = (int)a->cap.max_send_wr;
    model_qps[i].max_recv = (int)a->cap.max_recv_wr;
    model_qps[i].pd->qps++;
    model_qps[i].cq->qps++;
    cid->qp = &model_qps[i].qp;
    model_nlive.qps++;
    UNLOCK();
    return 0;
}

void m_destroy_qp(struct rdma_cm_id *cid)
{
    m_qp_t *q = (m_qp_t *)cid->qp;

    LOCK();
    if (q->peer)
        q->peer->peer = NULL;
    q->live = false;
    q->pd->qps--;
    q->cq->qps--;
    cid->qp = NULL;
    model_nlive.qps--;
    UNLOCK();
}

