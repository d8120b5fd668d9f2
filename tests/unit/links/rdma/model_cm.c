/* The verbs model (verbs_model.h): rdma_cm ids, events and connections. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/base.h"
#include "model_internal.h"

/* Broadcast (under the model lock) whenever an event is queued on any channel. */
static pthread_cond_t cm_queued_cond = PTHREAD_COND_INITIALIZER;

static int next_port = 5000;

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
        model_violate("eventfd write");
    pthread_cond_broadcast(&cm_queued_cond);
}

struct rdma_event_channel *m_create_event_channel(void)
{
    int i;

    LOCK();
    FIND_FREE(model_cmchs, MAXO, i);
    if (model_fail_now() || i == MAXO) {
        UNLOCK();
        errno = EMFILE;
        return NULL;
    }
    memset(&model_cmchs[i], 0, sizeof(model_cmchs[i]));
    model_cmchs[i].live = true;
    model_cmchs[i].ch.fd = eventfd(0, EFD_CLOEXEC);
    model_nlive.cm_channels++;
    UNLOCK();
    return &model_cmchs[i].ch;
}

void m_destroy_event_channel(struct rdma_event_channel *ch)
{
    m_cmch_t *m = (m_cmch_t *)ch;

    LOCK();
    if (m->ids)
        model_violate("rdma_destroy_event_channel with ids on it");
    while (m->head) {
        m_ev_t *e = m->head;
        m->head = e->next;
        free(e);
    }
    close(ch->fd);
    m->live = false;
    model_nlive.cm_channels--;
    UNLOCK();
}

static m_id_t *id_new(struct rdma_event_channel *ch, void *ctx)
{
    int i;

    FIND_FREE(model_ids, MAXO * 2, i);
    if (i == MAXO * 2)
        return NULL;
    memset(&model_ids[i], 0, sizeof(model_ids[i]));
    model_ids[i].live = true;
    model_ids[i].id.channel = ch;
    model_ids[i].id.context = ctx;
    model_ids[i].id.ps = RDMA_PS_TCP;
    ((m_cmch_t *)ch)->ids++;
    model_nlive.ids++;
    return &model_ids[i];
}

int m_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id_p, void *ctx,
                       enum rdma_port_space ps)
{
    m_id_t *id;

    (void)ps;
    LOCK();
    id = model_fail_now() ? NULL : id_new(ch, ctx);
    UNLOCK();
    if (!id) {
        errno = ENOMEM;
        return -1;
    }
    *id_p = &id->id;
    return 0;
}

int m_destroy_id(struct rdma_cm_id *cid)
{
    m_id_t *id = (m_id_t *)cid;

    LOCK();
    if (cid->qp)
        model_violate("rdma_destroy_id with its QP alive");
    if (id->peer && !id->disconnected) {
        id->disconnected = id->peer->disconnected = true; /* a DREQ goes out */
        if (id->peer->live)
            cm_queue(id->peer, RDMA_CM_EVENT_DISCONNECTED, NULL, NULL, 0);
    }
    if (id->peer)
        id->peer->peer = NULL;
    for (int i = 0; i < MAXO * 2; i++)
        if (model_ids[i].connector == id)
            model_ids[i].connector = NULL;
    id->live = false;
    ((m_cmch_t *)cid->channel)->ids--;
    model_nlive.ids--;
    UNLOCK();
    return 0;
}

int m_bind_addr(struct rdma_cm_id *cid, struct sockaddr *addr)
{
    m_id_t *id = (m_id_t *)cid;

    (void)addr;
    LOCK();
    if (model_fail_now()) {
        UNLOCK();
        errno = EADDRNOTAVAIL;
        return -1;
    }
    id->port = next_port++;
    cid->verbs = &model_cm_ctx;
    cid->port_num = 1;
    UNLOCK();
    return 0;
}

int m_listen(struct rdma_cm_id *cid, int backlog)
{
    (void)backlog;
    LOCK();
    ((m_id_t *)cid)->listening = true;
    UNLOCK();
    return 0;
}

uint16_t m_get_src_port(struct rdma_cm_id *cid)
{
    return htons((uint16_t)((m_id_t *)cid)->port);
}

int m_resolve_addr(struct rdma_cm_id *cid, struct sockaddr *src, struct sockaddr *dst, int ms)
{
    m_id_t *id = (m_id_t *)cid;

    (void)src, (void)ms;
    LOCK();
    if (model_fail_now()) {
        UNLOCK();
        errno = EHOSTUNREACH;
        return -1;
    }
    id->dst_port = ntohs(((struct sockaddr_in *)dst)->sin_port);
    cid->verbs = &model_cm_ctx;
    cid->port_num = 1;
    cm_queue(id, RDMA_CM_EVENT_ADDR_RESOLVED, NULL, NULL, 0);
    UNLOCK();
    return 0;
}

int m_resolve_route(struct rdma_cm_id *cid, int ms)
{
    (void)ms;
    LOCK();
    if (model_fail_now()) {
        UNLOCK();
        errno = EHOSTUNREACH;
        return -1;
    }
    cm_queue((m_id_t *)cid, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL, NULL, 0);
    UNLOCK();
    return 0;
}

int m_connect(struct rdma_cm_id *cid, struct rdma_conn_param *p)
{
    m_id_t *id = (m_id_t *)cid, *l = NULL, *n;

    LOCK();
    for (int i = 0; i < MAXO * 2; i++)
        if (model_ids[i].live && model_ids[i].listening && model_ids[i].port == id->dst_port)
            l = &model_ids[i];
    if (model_fail_now() || !cid->qp) {
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
    n->id.verbs = &model_cm_ctx;
    n->connector = id;
    cm_queue(n, RDMA_CM_EVENT_CONNECT_REQUEST, l, p->private_data, p->private_data_len);
    UNLOCK();
    return 0;
}

int m_accept(struct rdma_cm_id *cid, struct rdma_conn_param *p)
{
    m_id_t *id = (m_id_t *)cid, *c = id->connector;

    (void)p;
    LOCK();
    if (model_fail_now() || !cid->qp || !c || !c->id.qp) {
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

int m_reject(struct rdma_cm_id *cid, const void *data, uint8_t len)
{
    m_id_t *id = (m_id_t *)cid;

    (void)data, (void)len;
    LOCK();
    if (id->connector)
        cm_queue(id->connector, RDMA_CM_EVENT_REJECTED, NULL, NULL, 0);
    UNLOCK();
    return 0;
}

int m_disconnect(struct rdma_cm_id *cid)
{
    m_id_t *id = (m_id_t *)cid;

    LOCK();
    model_qp_error((m_qp_t *)cid->qp);
    if (id->peer && !id->disconnected) {
        id->disconnected = id->peer->disconnected = true;
        model_qp_error((m_qp_t *)id->peer->id.qp);
        cm_queue(id->peer, RDMA_CM_EVENT_DISCONNECTED, NULL, NULL, 0);
        cm_queue(id, RDMA_CM_EVENT_DISCONNECTED, NULL, NULL, 0);
    }
    UNLOCK();
    return 0;
}

int m_get_cm_event(struct rdma_event_channel *ch, struct rdma_cm_event **ev_p)
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
        model_violate("eventfd read");
    model_nlive.cm_events++;
    UNLOCK();
    *ev_p = &e->ev;
    return 0;
}

int m_ack_cm_event(struct rdma_cm_event *ev)
{
    LOCK();
    model_nlive.cm_events--;
    UNLOCK();
    free(ev); /* the first member of m_ev_t */
    return 0;
}


int model_cm_queued(struct rdma_event_channel *ch)
{
    int n = 0;

    LOCK();
    for (const m_ev_t *e = ((m_cmch_t *)ch)->head; e; e = e->next)
        n++;
    UNLOCK();
    return n;
}

bool model_cm_wait_queued(struct rdma_event_channel *ch, int n, int timeout_ms)
{
    struct timespec deadline;
    bool reached;

    hccl_abs_deadline(&deadline, timeout_ms);
    LOCK();
    for (;;) {
        int queued = 0;
        for (const m_ev_t *e = ((m_cmch_t *)ch)->head; e; e = e->next)
            queued++;
        reached = queued >= n;
        if (reached || pthread_cond_timedwait(&cm_queued_cond, &model_mu, &deadline) != 0)
            break;
    }
    UNLOCK();
    return reached;
}
