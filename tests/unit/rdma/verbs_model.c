/* The verbs model (see verbs_model.h). One lock: connection set-up runs a thread per rank. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "verbs_model.h"

#define MAXO 64     /* objects of each kind */
#define QDEPTH 256  /* work requests per queue */

typedef struct { struct ibv_comp_channel ch; int pending; bool live; } m_comp_t;
typedef struct {
    struct ibv_cq cq;
    struct ibv_wc wc[1024];
    int head, count;
    bool armed, live;
    int unacked, qps;
} m_cq_t;
typedef struct { struct ibv_mr mr; int access; bool live; } m_mr_t;
typedef struct { struct ibv_pd pd; int mrs, qps; bool live; } m_pd_t;

typedef struct {
    uint64_t wr_id;
    int opcode;
    uintptr_t addr;
    uint32_t len, lkey, rkey, imm;
    uint64_t raddr;
} m_wr_t;

typedef struct m_qp {
    struct ibv_qp qp;
    bool live, error;
    struct m_qp *peer;
    m_pd_t *pd;
    m_cq_t *cq;
    m_wr_t sq[QDEPTH];
    int sq_head, sq_count, sq_out, max_send;
    m_wr_t rq[QDEPTH];
    int rq_head, rq_count, max_recv;
} m_qp_t;

typedef struct m_ev { struct rdma_cm_event ev; uint8_t data[64]; struct m_ev *next; } m_ev_t;
typedef struct { struct rdma_event_channel ch; m_ev_t *head; bool live; int ids; } m_cmch_t;
typedef struct m_id {
    struct rdma_cm_id id;
    bool live, listening, disconnected;
    int port, dst_port;
    struct m_id *connector; /* acceptor side: who asked */
    struct m_id *peer;
} m_id_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct ibv_device devs[2];
static struct ibv_device *dev_list[3];
static int ndevs;
static bool port_up;
static struct ibv_context cm_ctx; /* librdmacm's own device context */
static m_comp_t comps[MAXO];
static m_cq_t cqs[MAXO];
static m_mr_t mrs[MAXO * 4];
static m_pd_t pds[MAXO];
static m_qp_t qps[MAXO];
static m_cmch_t cmchs[MAXO];
static m_id_t ids[MAXO * 2];
static model_live_t live;
static model_stats_t stats;
static char violation[256];
static int next_key = 0x100, next_qpn = 0x10, next_port = 5000;
static enum ibv_wc_status inject = IBV_WC_SUCCESS;
static bool auto_pump;
static int fail_at, calls;
static __thread bool victim;

#define LOCK() pthread_mutex_lock(&mu)
#define UNLOCK() pthread_mutex_unlock(&mu)

static void violate(const char *what)
{
    stats.violations++;
    if (!violation[0])
        snprintf(violation, sizeof(violation), "%s", what);
}

/* Failure injection: true when this call must fail. */
static bool fail_now(void)
{
    if (!victim)
        return false;
    calls++;
    return fail_at && calls == fail_at;
}

void model_reset(int ndevices, bool port_active)
{
    LOCK();
    for (int i = 0; i < MAXO; i++)
        if (comps[i].live)
            close(comps[i].ch.fd);
    for (int i = 0; i < MAXO; i++)
        if (cmchs[i].live)
            close(cmchs[i].ch.fd);
    memset(comps, 0, sizeof(comps));
    memset(cqs, 0, sizeof(cqs));
    memset(mrs, 0, sizeof(mrs));
    memset(pds, 0, sizeof(pds));
    memset(qps, 0, sizeof(qps));
    memset(cmchs, 0, sizeof(cmchs));
    memset(ids, 0, sizeof(ids));
    memset(&live, 0, sizeof(live));
    memset(&stats, 0, sizeof(stats));
    violation[0] = '\0';
    inject = IBV_WC_SUCCESS;
    auto_pump = false;
    fail_at = calls = 0;
    ndevs = ndevices;
    port_up = port_active;
    memset(devs, 0, sizeof(devs));
    for (int i = 0; i < ndevs; i++) {
        snprintf(devs[i].name, sizeof(devs[i].name), "rxe%d", i);
        dev_list[i] = &devs[i];
    }
    dev_list[ndevs] = NULL;
    UNLOCK();
}

void model_fail_at(int n) { LOCK(); fail_at = n; calls = 0; UNLOCK(); }
void model_set_victim(bool v) { victim = v; }
int model_calls(void) { return calls; }
void model_auto_pump(bool on) { LOCK(); auto_pump = on; UNLOCK(); }
void model_inject_error(enum ibv_wc_status status) { LOCK(); inject = status; UNLOCK(); }
model_live_t model_live(void) { LOCK(); model_live_t l = live; UNLOCK(); return l; }
model_stats_t model_stats(void) { LOCK(); model_stats_t s = stats; UNLOCK(); return s; }
const char *model_violation_text(void) { return violation; }

bool model_cqs_quiet(void)
{
    bool ok = true;

    LOCK();
    for (int i = 0; i < MAXO; i++)
        if ((cqs[i].live && (!cqs[i].armed || cqs[i].count)) || (comps[i].live && comps[i].pending))
            ok = false;
    UNLOCK();
    return ok;
}

/* ---- devices ---- */

static struct ibv_device **m_get_device_list(int *num)
{
    LOCK();
    bool f = fail_now();
    UNLOCK();
    if (f) {
        errno = ENOMEM;
        return NULL;
    }
    *num = ndevs;
    return dev_list;
}
static void m_free_device_list(struct ibv_device **l) { (void)l; }
static const char *m_get_device_name(struct ibv_device *d) { return d->name; }

static struct ibv_context *m_open_device(struct ibv_device *d)
{
    struct ibv_context *c;

    LOCK();
    if (fail_now()) {
        UNLOCK();
        return NULL;
    }
    c = calloc(1, sizeof(*c));
    c->device = d;
    live.contexts++;
    UNLOCK();
    return c;
}

static int m_close_device(struct ibv_context *c)
{
    LOCK();
    live.contexts--;
    UNLOCK();
    free(c);
    return 0;
}

static int m_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
    (void)c;
    memset(a, 0, sizeof(*a));
    a->phys_port_cnt = 1;
    return 0;
}

static int m_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a)
{
    (void)c;
    memset(a, 0, sizeof(*a));
    if (port != 1)
        return EINVAL;
    a->state = port_up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
    a->link_layer = IBV_LINK_LAYER_ETHERNET;
    a->gid_tbl_len = 4;
    return 0;
}

/* GID 0 link-local IPv6, GID 1 ::ffff:127.0.0.1 (RoCE v2 of an IPv4 address). */
static int m_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid)
{
    (void)c, (void)port;
    memset(gid, 0, sizeof(*gid));
    if (index == 0) {
        gid->raw[0] = 0xfe, gid->raw[1] = 0x80, gid->raw[15] = 1;
    } else if (index == 1) {
        gid->raw[10] = gid->raw[11] = 0xff;
        gid->raw[12] = 127, gid->raw[15] = 1;
    } else if (index > 3) {
        return EINVAL;
    }
    return 0;
}

/* ---- resources ---- */

#define FIND_FREE(arr_x, n_x, i_x)                                                       \
    for (i_x = 0; i_x < (n_x) && (arr_x)[i_x].live; i_x++) {                           \
    }

static struct ibv_pd *m_alloc_pd(struct ibv_context *c)
{
    int i;

    LOCK();
    if (c != &cm_ctx)
        violate("PD on a context that is not the connection's");
    FIND_FREE(pds, MAXO, i);
    if (fail_now() || i == MAXO) {
        UNLOCK();
        errno = ENOMEM;
        return NULL;
    }
    memset(&pds[i], 0, sizeof(pds[i]));
    pds[i].live = true;
    pds[i].pd.context = c;
    live.pds++;
    UNLOCK();
    return &pds[i].pd;
}

static int m_dealloc_pd(struct ibv_pd *pd)
{
    m_pd_t *p = (m_pd_t *)pd;

    LOCK();
    if (p->mrs || p->qps) {
        violate("ibv_dealloc_pd with MRs or QPs alive");
        UNLOCK();
        return EBUSY;
    }
    p->live = false;
    live.pds--;
    UNLOCK();
    return 0;
}

static struct ibv_comp_channel *m_create_comp_channel(struct ibv_context *c)
{
    int i;

    LOCK();
    FIND_FREE(comps, MAXO, i);
    if (fail_now() || i == MAXO) {
        UNLOCK();
        errno = EMFILE;
        return NULL;
    }
    memset(&comps[i], 0, sizeof(comps[i]));
    comps[i].live = true;
    comps[i].ch.context = c;
    comps[i].ch.fd = eventfd(0, EFD_CLOEXEC);
    live.comp_channels++;
    UNLOCK();
    return &comps[i].ch;
}

static int m_destroy_comp_channel(struct ibv_comp_channel *ch)
{
    m_comp_t *m = (m_comp_t *)ch;

    LOCK();
    for (int i = 0; i < MAXO; i++)
        if (cqs[i].live && cqs[i].cq.channel == ch) {
            violate("ibv_destroy_comp_channel with a CQ on it");
            UNLOCK();
            return EBUSY;
        }
    close(ch->fd);
    m->live = false;
    live.comp_channels--;
    UNLOCK();
    return 0;
}

static struct ibv_cq *m_create_cq(struct ibv_context *c, int cqe, void *ctx, struct ibv_comp_channel *ch,
                                  int vector)
{
    int i;

    (void)vector;
    LOCK();
    FIND_FREE(cqs, MAXO, i);
    if (fail_now() || i == MAXO || cqe > 1024) {
        UNLOCK();
        errno = ENOMEM;
        return NULL;
    }
    memset(&cqs[i], 0, sizeof(cqs[i]));
    cqs[i].live = true;
    cqs[i].cq.context = c;
    cqs[i].cq.channel = ch;
    cqs[i].cq.cq_context = ctx;
    cqs[i].cq.cqe = cqe;
    live.cqs++;
    UNLOCK();
    return &cqs[i].cq;
}

static int m_destroy_cq(struct ibv_cq *cq)
{
    m_cq_t *m = (m_cq_t *)cq;

    LOCK();
    if (m->unacked) {
        violate("ibv_destroy_cq with unacknowledged events (it would wait forever)");
        UNLOCK();
        return EBUSY;
    }
    if (m->qps) {
        violate("ibv_destroy_cq with QPs on it");
        UNLOCK();
        return EBUSY;
    }
    m->live = false;
    live.cqs--;
    UNLOCK();
    return 0;
}

static struct ibv_mr *m_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    int i;

    LOCK();
    FIND_FREE(mrs, MAXO * 4, i);
    if (fail_now() || i == MAXO * 4) {
        UNLOCK();
        errno = ENOMEM;
        return NULL;
    }
    memset(&mrs[i], 0, sizeof(mrs[i]));
    mrs[i].live = true;
    mrs[i].mr.pd = pd;
    mrs[i].mr.addr = addr;
    mrs[i].mr.length = len;
    mrs[i].mr.lkey = mrs[i].mr.rkey = (uint32_t)next_key++;
    mrs[i].access = access;
    ((m_pd_t *)pd)->mrs++;
    live.mrs++;
    stats.reg_mr++;
    UNLOCK();
    return &mrs[i].mr;
}

static int m_dereg_mr(struct ibv_mr *mr)
{
    m_mr_t *m = (m_mr_t *)mr;

    LOCK();
    m->live = false;
    ((m_pd_t *)mr->pd)->mrs--;
    live.mrs--;
    stats.dereg_mr++;
    UNLOCK();
    return 0;
}

/* The MR of pd with key covering [addr, addr + len) and access, or NULL. */
static m_mr_t *mr_check(const m_pd_t *pd, uint32_t key, uintptr_t addr, size_t len, int access)
{
    for (int i = 0; i < MAXO * 4; i++) {
        m_mr_t *m = &mrs[i];
        uintptr_t lo = (uintptr_t)m->mr.addr;
        if (m->live && m->mr.lkey == key && (const m_pd_t *)m->mr.pd == pd && addr >= lo &&
            addr + len <= lo + m->mr.length && (m->access & access) == access)
            return m;
    }
    return NULL;
}

/* ---- completions ---- */

static void cq_push(m_cq_t *cq, const struct ibv_wc *wc)
{
    if (cq->count == 1024) {
        violate("CQ overrun");
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
        stats.cq_events++;
        if (write(ch->ch.fd, &one, sizeof(one)) != sizeof(one))
            violate("eventfd write");
    }
}

static int m_req_notify_cq(struct ibv_cq *cq, int solicited)
{
    (void)solicited;
    LOCK();
    ((m_cq_t *)cq)->armed = true;
    UNLOCK();
    return 0;
}

static int m_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq_p, void **ctx_p)
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
        violate("eventfd read");
    for (int i = 0; i < MAXO; i++)
        if (cqs[i].live && cqs[i].cq.channel == ch && !cqs[i].armed) {
            cqs[i].unacked++;
            *cq_p = &cqs[i].cq;
            *ctx_p = cqs[i].cq.cq_context;
            break;
        }
    UNLOCK();
    return 0;
}

static void m_ack_cq_events(struct ibv_cq *cq, unsigned int n)
{
    m_cq_t *m = (m_cq_t *)cq;

    LOCK();
    if ((int)n > m->unacked)
        violate("ibv_ack_cq_events of more events than were got");
    m->unacked -= (int)n;
    UNLOCK();
}

static int m_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    m_cq_t *m = (m_cq_t *)cq;
    int got = 0;

    LOCK();
    stats.polls++;
    if (m->count > stats.max_recv_backlog)
        stats.max_recv_backlog = m->count;
    while (got < n && m->count) {
        wc[got++] = m->wc[m->head];
        m->head = (m->head + 1) % 1024;
        m->count--;
    }
    if (!got)
        stats.empty_polls++;
    UNLOCK();
    return got;
}

static const char *m_wc_status_str(enum ibv_wc_status s)
{
    return ibv_wc_status_str(s); /* a pure table lookup: the real one */
}

/* ---- queue pairs ---- */

static int pump_locked(void);

static void complete_wr(m_qp_t *q, const m_wr_t *w, enum ibv_wc_status st, int opcode, uint32_t len)
{
    struct ibv_wc wc;

    memset(&wc, 0, sizeof(wc));
    wc.wr_id = w->wr_id;
    wc.status = st;
    wc.opcode = opcode;
    wc.byte_len = len;
    wc.qp_num = q->qp.qp_num;
    cq_push(q->cq, &wc);
}

/* The QP enters the error state: every outstanding work request is flushed. */
static void qp_error(m_qp_t *q)
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

static int m_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    m_qp_t *q = (m_qp_t *)qp;

    LOCK();
    for (; wr; wr = wr->next) {
        m_wr_t w = {.wr_id = wr->wr_id, .addr = wr->sg_list[0].addr, .len = wr->sg_list[0].length,
                    .lkey = wr->sg_list[0].lkey};
        if (fail_now() || q->rq_count >= q->max_recv ||
            !mr_check(q->pd, w.lkey, w.addr, w.len, IBV_ACCESS_LOCAL_WRITE)) {
            if (q->rq_count >= q->max_recv)
                violate("ibv_post_recv beyond max_recv_wr");
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
    if (auto_pump)
        pump_locked();
    UNLOCK();
    return 0;
}

static int m_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    m_qp_t *q = (m_qp_t *)qp;

    LOCK();
    for (; wr; wr = wr->next) {
        m_wr_t w = {.wr_id = wr->wr_id, .opcode = wr->opcode, .addr = wr->sg_list[0].addr,
                    .len = wr->sg_list[0].length, .lkey = wr->sg_list[0].lkey,
                    .rkey = wr->wr.rdma.rkey, .raddr = wr->wr.rdma.remote_addr, .imm = wr->imm_data};
        if (q->sq_out >= q->max_send) {
            violate("ibv_post_send beyond max_send_wr");
            *bad = wr;
            UNLOCK();
            return ENOMEM;
        }
        if (fail_now() || !q->peer || !mr_check(q->pd, w.lkey, w.addr, w.len, 0)) {
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
    if (auto_pump)
        pump_locked();
    UNLOCK();
    return 0;
}

/* Delivers the head of q's send queue; false when the receiver has no receive posted. */
static bool deliver(m_qp_t *q)
{
    m_wr_t w = q->sq[q->sq_head];
    m_qp_t *p = q->peer;
    bool needs_recv = w.opcode == IBV_WR_SEND || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    enum ibv_wc_status st = IBV_WC_SUCCESS;
    m_wr_t r = {0};

    if (inject != IBV_WC_SUCCESS) {
        st = inject;
        inject = IBV_WC_SUCCESS;
    } else if (!p || p->error) {
        st = IBV_WC_RETRY_EXC_ERR;
    } else if (needs_recv && p->rq_count == 0) {
        stats.rnr++; /* RNR NAK: retried forever (rnr_retry 7), but the sender overran us */
        return false;
    }
    if (st == IBV_WC_SUCCESS && (w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) &&
        !mr_check(p->pd, w.rkey, w.raddr, w.len, IBV_ACCESS_REMOTE_WRITE))
        st = IBV_WC_REM_ACCESS_ERR;
    if (st == IBV_WC_SUCCESS && w.opcode == IBV_WR_SEND && p->rq[p->rq_head].len < w.len)
        st = IBV_WC_REM_INV_REQ_ERR;
    q->sq_head = (q->sq_head + 1) % QDEPTH;
    q->sq_count--;
    q->sq_out--;
    if (st != IBV_WC_SUCCESS) {
        complete_wr(q, &w, st, w.opcode == IBV_WR_SEND ? IBV_WC_SEND : IBV_WC_RDMA_WRITE, 0);
        qp_error(q);
        return true;
    }
    if (w.opcode == IBV_WR_SEND)
        memcpy((void *)p->rq[p->rq_head].addr, (void *)w.addr, w.len);
    else
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
            stats.sends++;
        } else {
            wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
            wc.wc_flags = IBV_WC_WITH_IMM;
            wc.imm_data = w.imm;
            stats.writes_imm++;
        }
        cq_push(p->cq, &wc);
    }
    return true;
}

static int pump_locked(void)
{
    int moved = 0;

    for (int i = 0; i < MAXO; i++)
        while (qps[i].live && qps[i].sq_count && deliver(&qps[i]))
            moved++;
    return moved;
}

int model_pump(void)
{
    LOCK();
    int moved = pump_locked();
    UNLOCK();
    return moved;
}

/* ---- rdma_cm ---- */

static void cm_queue(m_id_t *id, enum rdma_cm_event_type type, m_id_t *listen, const void *data,
                     uint8_t len)
{
    m_cmch_t *ch = (m_cmch_t *)id->id.channel;
    m_ev_t *e = calloc(1, sizeof(*e)), **tail = &ch->head;
    uint64_t one = 1;

    e->ev.event = type;
    e->ev.id = &id->id;
    e->ev.listen_id = listen ? &listen->id : NULL;
    if (len) {
        memcpy(e->data, data, len);
        e->ev.param.conn.private_data = e->data;
        e->ev.param.conn.private_data_len = len;
    }
    while (*tail)
        tail = &(*tail)->next;
    *tail = e;
    if (write(ch->ch.fd, &one, sizeof(one)) != sizeof(one))
        violate("eventfd write");
}

static struct rdma_event_channel *m_create_event_channel(void)
{
    int i;

    LOCK();
    FIND_FREE(cmchs, MAXO, i);
    if (fail_now() || i == MAXO) {
        UNLOCK();
        errno = EMFILE;
        return NULL;
    }
    memset(&cmchs[i], 0, sizeof(cmchs[i]));
    cmchs[i].live = true;
    cmchs[i].ch.fd = eventfd(0, EFD_CLOEXEC);
    live.cm_channels++;
    UNLOCK();
    return &cmchs[i].ch;
}

static void m_destroy_event_channel(struct rdma_event_channel *ch)
{
    m_cmch_t *m = (m_cmch_t *)ch;

    LOCK();
    if (m->ids)
        violate("rdma_destroy_event_channel with ids on it");
    while (m->head) {
        m_ev_t *e = m->head;
        m->head = e->next;
        free(e);
    }
    close(ch->fd);
    m->live = false;
    live.cm_channels--;
    UNLOCK();
}

static m_id_t *id_new(struct rdma_event_channel *ch, void *ctx)
{
    int i;

    FIND_FREE(ids, MAXO * 2, i);
    if (i == MAXO * 2)
        return NULL;
    memset(&ids[i], 0, sizeof(ids[i]));
    ids[i].live = true;
    ids[i].id.channel = ch;
    ids[i].id.context = ctx;
    ids[i].id.ps = RDMA_PS_TCP;
    ((m_cmch_t *)ch)->ids++;
    live.ids++;
    return &ids[i];
}

static int m_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id_p, void *ctx,
                       enum rdma_port_space ps)
{
    m_id_t *id;

    (void)ps;
    LOCK();
    id = fail_now() ? NULL : id_new(ch, ctx);
    UNLOCK();
    if (!id) {
        errno = ENOMEM;
        return -1;
    }
    *id_p = &id->id;
    return 0;
}

static int m_destroy_id(struct rdma_cm_id *cid)
{
    m_id_t *id = (m_id_t *)cid;

    LOCK();
    if (cid->qp)
        violate("rdma_destroy_id with its QP alive");
    if (id->peer && !id->disconnected) {
        id->disconnected = id->peer->disconnected = true; /* a DREQ goes out */
        if (id->peer->live)
            cm_queue(id->peer, RDMA_CM_EVENT_DISCONNECTED, NULL, NULL, 0);
    }
    if (id->peer)
        id->peer->peer = NULL;
    for (int i = 0; i < MAXO * 2; i++)
        if (ids[i].connector == id)
            ids[i].connector = NULL;
    id->live = false;
    ((m_cmch_t *)cid->channel)->ids--;
    live.ids--;
    UNLOCK();
    return 0;
}

static int m_bind_addr(struct rdma_cm_id *cid, struct sockaddr *addr)
{
    m_id_t *id = (m_id_t *)cid;

    (void)addr;
    LOCK();
    if (fail_now()) {
        UNLOCK();
        errno = EADDRNOTAVAIL;
        return -1;
    }
    id->port = next_port++;
    cid->verbs = &cm_ctx;
    cid->port_num = 1;
    UNLOCK();
    return 0;
}

static int m_listen(struct rdma_cm_id *cid, int backlog)
{
    (void)backlog;
    LOCK();
    ((m_id_t *)cid)->listening = true;
    UNLOCK();
    return 0;
}

static uint16_t m_get_src_port(struct rdma_cm_id *cid)
{
    return htons((uint16_t)((m_id_t *)cid)->port);
}

static int m_resolve_addr(struct rdma_cm_id *cid, struct sockaddr *src, struct sockaddr *dst, int ms)
{
    m_id_t *id = (m_id_t *)cid;

    (void)src, (void)ms;
    LOCK();
    if (fail_now()) {
        UNLOCK();
        errno = EHOSTUNREACH;
        return -1;
    }
    id->dst_port = ntohs(((struct sockaddr_in *)dst)->sin_port);
    cid->verbs = &cm_ctx;
    cid->port_num = 1;
    cm_queue(id, RDMA_CM_EVENT_ADDR_RESOLVED, NULL, NULL, 0);
    UNLOCK();
    return 0;
}

static int m_resolve_route(struct rdma_cm_id *cid, int ms)
{
    (void)ms;
    LOCK();
    if (fail_now()) {
        UNLOCK();
        errno = EHOSTUNREACH;
        return -1;
    }
    cm_queue((m_id_t *)cid, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL, NULL, 0);
    UNLOCK();
    return 0;
}

static int m_create_qp(struct rdma_cm_id *cid, struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
    int i;

    LOCK();
    FIND_FREE(qps, MAXO, i);
    if (pd->context != cid->verbs)
        violate("rdma_create_qp with a PD of another device context");
    if (fail_now() || i == MAXO || a->qp_type != IBV_QPT_RC || a->send_cq != a->recv_cq) {
        UNLOCK();
        errno = EINVAL;
        return -1;
    }
    memset(&qps[i], 0, sizeof(qps[i]));
    qps[i].live = true;
    qps[i].qp.qp_num = (uint32_t)next_qpn++;
    qps[i].qp.pd = pd;
    qps[i].qp.context = pd->context;
    qps[i].pd = (m_pd_t *)pd;
    qps[i].cq = (m_cq_t *)a->send_cq;
    qps[i].max_send = (int)a->cap.max_send_wr;
    qps[i].max_recv = (int)a->cap.max_recv_wr;
    qps[i].pd->qps++;
    qps[i].cq->qps++;
    cid->qp = &qps[i].qp;
    live.qps++;
    UNLOCK();
    return 0;
}

static void m_destroy_qp(struct rdma_cm_id *cid)
{
    m_qp_t *q = (m_qp_t *)cid->qp;

    LOCK();
    if (q->peer)
        q->peer->peer = NULL;
    q->live = false;
    q->pd->qps--;
    q->cq->qps--;
    cid->qp = NULL;
    live.qps--;
    UNLOCK();
}

static int m_connect(struct rdma_cm_id *cid, struct rdma_conn_param *p)
{
    m_id_t *id = (m_id_t *)cid, *l = NULL, *n;

    LOCK();
    for (int i = 0; i < MAXO * 2; i++)
        if (ids[i].live && ids[i].listening && ids[i].port == id->dst_port)
            l = &ids[i];
    if (fail_now() || !cid->qp) {
        UNLOCK();
        errno = EINVAL;
        return -1;
    }
    if (!l) {
        cm_queue(id, RDMA_CM_EVENT_UNREACHABLE, NULL, NULL, 0);
        UNLOCK();
        return 0;
    }
    n = id_new(l->id.channel, l->id.context);
    n->id.verbs = &cm_ctx;
    n->connector = id;
    cm_queue(n, RDMA_CM_EVENT_CONNECT_REQUEST, l, p->private_data, p->private_data_len);
    UNLOCK();
    return 0;
}

static int m_accept(struct rdma_cm_id *cid, struct rdma_conn_param *p)
{
    m_id_t *id = (m_id_t *)cid, *c = id->connector;

    (void)p;
    LOCK();
    if (fail_now() || !cid->qp || !c || !c->id.qp) {
        UNLOCK();
        errno = EINVAL;
        return -1;
    }
    id->peer = c;
    c->peer = id;
    ((m_qp_t *)cid->qp)->peer = (m_qp_t *)c->id.qp;
    ((m_qp_t *)c->id.qp)->peer = (m_qp_t *)cid->qp;
    cm_queue(c, RDMA_CM_EVENT_ESTABLISHED, NULL, NULL, 0);
    cm_queue(id, RDMA_CM_EVENT_ESTABLISHED, NULL, NULL, 0);
    UNLOCK();
    return 0;
}

static int m_reject(struct rdma_cm_id *cid, const void *data, uint8_t len)
{
    m_id_t *id = (m_id_t *)cid;

    (void)data, (void)len;
    LOCK();
    if (id->connector)
        cm_queue(id->connector, RDMA_CM_EVENT_REJECTED, NULL, NULL, 0);
    UNLOCK();
    return 0;
}

static int m_disconnect(struct rdma_cm_id *cid)
{
    m_id_t *id = (m_id_t *)cid;

    LOCK();
    qp_error((m_qp_t *)cid->qp);
    if (id->peer && !id->disconnected) {
        id->disconnected = id->peer->disconnected = true;
        qp_error((m_qp_t *)id->peer->id.qp);
        cm_queue(id->peer, RDMA_CM_EVENT_DISCONNECTED, NULL, NULL, 0);
        cm_queue(id, RDMA_CM_EVENT_DISCONNECTED, NULL, NULL, 0);
    }
    UNLOCK();
    return 0;
}

static int m_get_cm_event(struct rdma_event_channel *ch, struct rdma_cm_event **ev_p)
{
    m_cmch_t *m = (m_cmch_t *)ch;
    m_ev_t *e;
    uint64_t v;

    LOCK();
    e = m->head;
    if (!e) {
        UNLOCK();
        errno = EAGAIN;
        return -1;
    }
    m->head = e->next;
    if (!m->head && read(ch->fd, &v, sizeof(v)) != sizeof(v))
        violate("eventfd read");
    live.cm_events++;
    UNLOCK();
    *ev_p = &e->ev;
    return 0;
}

static int m_ack_cm_event(struct rdma_cm_event *ev)
{
    LOCK();
    live.cm_events--;
    UNLOCK();
    free(ev); /* the first member of m_ev_t */
    return 0;
}

const hccl_rdma_shim_t model_shim = {
    .get_device_list = m_get_device_list,
    .free_device_list = m_free_device_list,
    .get_device_name = m_get_device_name,
    .open_device = m_open_device,
    .close_device = m_close_device,
    .query_device = m_query_device,
    .query_port = m_query_port,
    .query_gid = m_query_gid,
    .alloc_pd = m_alloc_pd,
    .dealloc_pd = m_dealloc_pd,
    .create_comp_channel = m_create_comp_channel,
    .destroy_comp_channel = m_destroy_comp_channel,
    .create_cq = m_create_cq,
    .destroy_cq = m_destroy_cq,
    .reg_mr = m_reg_mr,
    .dereg_mr = m_dereg_mr,
    .req_notify_cq = m_req_notify_cq,
    .get_cq_event = m_get_cq_event,
    .ack_cq_events = m_ack_cq_events,
    .poll_cq = m_poll_cq,
    .post_send = m_post_send,
    .post_recv = m_post_recv,
    .wc_status_str = m_wc_status_str,
    .create_event_channel = m_create_event_channel,
    .destroy_event_channel = m_destroy_event_channel,
    .create_id = m_create_id,
    .destroy_id = m_destroy_id,
    .bind_addr = m_bind_addr,
    .listen = m_listen,
    .get_src_port = m_get_src_port,
    .resolve_addr = m_resolve_addr,
    .resolve_route = m_resolve_route,
    .create_qp = m_create_qp,
    .destroy_qp = m_destroy_qp,
    .connect = m_connect,
    .accept = m_accept,
    .reject = m_reject,
    .disconnect = m_disconnect,
    .get_cm_event = m_get_cm_event,
    .ack_cm_event = m_ack_cm_event,
};
