/* The verbs model (verbs_model.h): protection domains, memory regions, channels, CQs. */
#include <errno.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "model_internal.h"

static int next_key = 0x100;

struct ibv_pd *m_alloc_pd(struct ibv_context *c)
{
    int i;

    LOCK();
    if (c != &model_cm_ctx)
        model_violate("PD on a context that is not the connection's");
    FIND_FREE(model_pds, MAXO, i);
    if (model_fail_now() || i == MAXO) {
        UNLOCK();
        errno = ENOMEM;
        return NULL;
    }
    memset(&model_pds[i], 0, sizeof(model_pds[i]));
    model_pds[i].live = true;
    model_pds[i].pd.context = c;
    model_nlive.pds++;
    UNLOCK();
    return &model_pds[i].pd;
}

int m_dealloc_pd(struct ibv_pd *pd)
{
    m_pd_t *p = (m_pd_t *)pd;

    LOCK();
    if (p->mrs || p->qps) {
        model_violate("ibv_dealloc_pd with MRs or QPs alive");
        UNLOCK();
        return EBUSY;
    }
    p->live = false;
    model_nlive.pds--;
    UNLOCK();
    return 0;
}

struct ibv_comp_channel *m_create_comp_channel(struct ibv_context *c)
{
    int i;

    LOCK();
    FIND_FREE(model_comps, MAXO, i);
    if (model_fail_now() || i == MAXO) {
        UNLOCK();
        errno = EMFILE;
        return NULL;
    }
    memset(&model_comps[i], 0, sizeof(model_comps[i]));
    model_comps[i].live = true;
    model_comps[i].ch.context = c;
    model_comps[i].ch.fd = eventfd(0, EFD_CLOEXEC);
    model_nlive.comp_channels++;
    UNLOCK();
    return &model_comps[i].ch;
}

int m_destroy_comp_channel(struct ibv_comp_channel *ch)
{
    m_comp_t *m = (m_comp_t *)ch;

    LOCK();
    for (int i = 0; i < MAXO; i++)
        if (model_cqs[i].live && model_cqs[i].cq.channel == ch) {
            model_violate("ibv_destroy_comp_channel with a CQ on it");
            UNLOCK();
            return EBUSY;
        }
    close(ch->fd);
    m->live = false;
    model_nlive.comp_channels--;
    UNLOCK();
    return 0;
}

struct ibv_cq *m_create_cq(struct ibv_context *c, int cqe, void *ctx, struct ibv_comp_channel *ch,
                                  int vector)
{
    int i;

    (void)vector;
    LOCK();
    FIND_FREE(model_cqs, MAXO, i);
    if (model_fail_now() || i == MAXO || cqe > 1024) {
        UNLOCK();
        errno = ENOMEM;
        return NULL;
    }
    memset(&model_cqs[i], 0, sizeof(model_cqs[i]));
    model_cqs[i].live = true;
    model_cqs[i].cq.context = c;
    model_cqs[i].cq.channel = ch;
    model_cqs[i].cq.cq_context = ctx;
    model_cqs[i].cq.cqe = cqe;
    model_nlive.cqs++;
    UNLOCK();
    return &model_cqs[i].cq;
}

int m_destroy_cq(struct ibv_cq *cq)
{
    m_cq_t *m = (m_cq_t *)cq;

    LOCK();
    if (m->unacked) {
        model_violate("ibv_destroy_cq with unacknowledged events (it would wait forever)");
        UNLOCK();
        return EBUSY;
    }
    if (m->qps) {
        model_violate("ibv_destroy_cq with QPs on it");
        UNLOCK();
        return EBUSY;
    }
    m->live = false;
    model_nlive.cqs--;
    UNLOCK();
    return 0;
}

struct ibv_mr *m_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    int i;

    LOCK();
    if ((access & IBV_ACCESS_ON_DEMAND) && !model_odp) {
        model_violate("ibv_reg_mr with IBV_ACCESS_ON_DEMAND on a device without ODP");
        UNLOCK();
        errno = EINVAL;
        return NULL;
    }
    FIND_FREE(model_mrs, MAXO * 4, i);
    if (model_fail_now() || i == MAXO * 4) {
        UNLOCK();
        errno = ENOMEM;
        return NULL;
    }
    memset(&model_mrs[i], 0, sizeof(model_mrs[i]));
    model_mrs[i].live = true;
    model_mrs[i].mr.pd = pd;
    model_mrs[i].mr.addr = addr;
    model_mrs[i].mr.length = len;
    model_mrs[i].mr.lkey = model_mrs[i].mr.rkey = (uint32_t)next_key++;
    model_mrs[i].access = access;
    model_mrs[i].gen = model_clock;
    ((m_pd_t *)pd)->mrs++;
    model_nlive.mrs++;
    model_st.reg_mr++;
    if (access & IBV_ACCESS_ON_DEMAND)
        model_st.reg_mr_odp++;
    UNLOCK();
    return &model_mrs[i].mr;
}

int m_dereg_mr(struct ibv_mr *mr)
{
    m_mr_t *m = (m_mr_t *)mr;

    LOCK();
    m->live = false;
    ((m_pd_t *)mr->pd)->mrs--;
    model_nlive.mrs--;
    model_st.dereg_mr++;
    UNLOCK();
    return 0;
}

m_mr_t *model_mr_check(const m_pd_t *pd, uint32_t key, uintptr_t addr, size_t len, int access)
{
    for (int i = 0; i < MAXO * 4; i++) {
        m_mr_t *m = &model_mrs[i];
        uintptr_t lo = (uintptr_t)m->mr.addr;
        if (m->live && m->mr.lkey == key && (const m_pd_t *)m->mr.pd == pd && addr >= lo &&
            addr + len <= lo + m->mr.length && (m->access & access) == access)
            return m;
    }
    return NULL;
}

void model_cq_push(m_cq_t *cq, const struct ibv_wc *wc)
{
    if (cq->count == 1024) {
        model_violate("CQ overrun");
        return;
    }
    cq->wc[(cq->head + cq->count) % 1024] = *wc;
    cq->count++;
    if (cq->armed) {
        /* An event only for a completion after arming, and one per arming. */
        m_comp_t *ch = (m_comp_t *)cq->cq.channel;
        uint64_t one = 1;
        cq->armed = false;
        ch->pending++;
        model_st.cq_events++;
        if (write(ch->ch.fd, &one, sizeof(one)) != sizeof(one))
            model_violate("eventfd write");
    }
}

int m_req_notify_cq(struct ibv_cq *cq, int solicited)
{
    (void)solicited;
    LOCK();
    ((m_cq_t *)cq)->armed = true;
    UNLOCK();
    return 0;
}

int m_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq_p, void **ctx_p)
{
    m_comp_t *m = (m_comp_t *)ch;
    uint64_t v;

    LOCK();
    if (m->pending == 0) {
        UNLOCK();
        errno = EAGAIN;
        return -1;
    }
    if (--m->pending == 0 && read(ch->fd, &v, sizeof(v)) != sizeof(v))
        model_violate("eventfd read");
    for (int i = 0; i < MAXO; i++)
        if (model_cqs[i].live && model_cqs[i].cq.channel == ch && !model_cqs[i].armed) {
            model_cqs[i].unacked++;
            *cq_p = &model_cqs[i].cq;
            *ctx_p = model_cqs[i].cq.cq_context;
            break;
        }
    UNLOCK();
    return 0;
}

void m_ack_cq_events(struct ibv_cq *cq, unsigned int n)
{
    m_cq_t *m = (m_cq_t *)cq;

    LOCK();
    if ((int)n > m->unacked)
        model_violate("ibv_ack_cq_events of more events than were got");
    m->unacked -= (int)n;
    UNLOCK();
}

int m_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    m_cq_t *m = (m_cq_t *)cq;
    int got = 0;

    LOCK();
    model_st.polls++;
    if (m->count > model_st.max_recv_backlog)
        model_st.max_recv_backlog = m->count;
    while (got < n && m->count) {
        wc[got++] = m->wc[m->head];
        m->head = (m->head + 1) % 1024;
        m->count--;
    }
    if (!got)
        model_st.empty_polls++;
    UNLOCK();
    return got;
}
