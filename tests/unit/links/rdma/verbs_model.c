/*
 * The verbs model (see verbs_model.h): its state and controls, the devices, and the shim table.
 * The objects live in model_res.c, the queue pairs and the wire in model_qp.c, rdma_cm in
 * model_cm.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model_internal.h"

#define MAX_FREES 64 /* ranges freed by a test */

pthread_mutex_t model_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ibv_device devs[2];
static struct ibv_device *dev_list[3];
static int ndevs;
static bool port_up;
static bool infiniband;
struct ibv_context model_cm_ctx;
m_comp_t model_comps[MAXO];
m_cq_t model_cqs[MAXO];
m_mr_t model_mrs[MAXO * 4];
m_pd_t model_pds[MAXO];
m_qp_t model_qps[MAXO];
m_cmch_t model_cmchs[MAXO];
m_id_t model_ids[MAXO * 2];
model_live_t model_nlive;
model_stats_t model_st;
enum ibv_wc_status model_inject = IBV_WC_SUCCESS;
bool model_auto;
bool model_odp;
static char violation[256];
static int fail_at, calls;
static __thread bool victim;
uint64_t model_clock;
static struct { uintptr_t lo, hi; uint64_t at; } frees[MAX_FREES];
static int nfrees;

void model_violate(const char *what)
{
    model_st.violations++;
    if (!violation[0])
        snprintf(violation, sizeof(violation), "%s", what);
}

bool model_fail_now(void)
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
        if (model_comps[i].live)
            close(model_comps[i].ch.fd);
    for (int i = 0; i < MAXO; i++)
        if (model_cmchs[i].live)
            close(model_cmchs[i].ch.fd);
    memset(model_comps, 0, sizeof(model_comps));
    memset(model_cqs, 0, sizeof(model_cqs));
    memset(model_mrs, 0, sizeof(model_mrs));
    memset(model_pds, 0, sizeof(model_pds));
    memset(model_qps, 0, sizeof(model_qps));
    memset(model_cmchs, 0, sizeof(model_cmchs));
    memset(model_ids, 0, sizeof(model_ids));
    memset(&model_nlive, 0, sizeof(model_nlive));
    memset(&model_st, 0, sizeof(model_st));
    model_odp = false;
    nfrees = 0;
    violation[0] = '\0';
    model_inject = IBV_WC_SUCCESS;
    model_auto = false;
    fail_at = calls = 0;
    ndevs = ndevices;
    port_up = port_active;
    infiniband = false;
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
void model_auto_pump(bool on) { LOCK(); model_auto = on; UNLOCK(); }
void model_inject_error(enum ibv_wc_status status) { LOCK(); model_inject = status; UNLOCK(); }
model_live_t model_live(void) { LOCK(); model_live_t l = model_nlive; UNLOCK(); return l; }
model_stats_t model_stats(void) { LOCK(); model_stats_t s = model_st; UNLOCK(); return s; }
const char *model_violation_text(void) { return violation; }

void model_clear_violations(void)
{
    LOCK();
    model_st.violations = 0;
    violation[0] = '\0';
    UNLOCK();
}

bool model_cqs_quiet(void)
{
    bool ok = true;

    LOCK();
    for (int i = 0; i < MAXO; i++)
        if ((model_cqs[i].live && (!model_cqs[i].armed || model_cqs[i].count)) ||
            (model_comps[i].live && model_comps[i].pending))
            ok = false;
    UNLOCK();
    return ok;
}

void model_set_odp(bool on) { LOCK(); model_odp = on; UNLOCK(); }
void model_set_infiniband(bool on) { LOCK(); infiniband = on; UNLOCK(); }

void model_free_range(void *addr, size_t len)
{
    LOCK();
    if (nfrees == MAX_FREES) {
        model_violate("model: too many freed ranges");
    } else {
        frees[nfrees].lo = (uintptr_t)addr;
        frees[nfrees].hi = (uintptr_t)addr + len;
        frees[nfrees].at = ++model_clock;
        nfrees++;
    }
    UNLOCK();
}

bool model_mr_stale(const m_mr_t *m, uintptr_t addr, size_t len)
{
    if (m->access & IBV_ACCESS_ON_DEMAND)
        return false; /* the device follows the page tables */
    for (int i = 0; i < nfrees; i++)
        if (frees[i].at > m->gen && addr < frees[i].hi && frees[i].lo < addr + len)
            return true;
    return false;
}

/* ---- devices ---- */

static struct ibv_device **m_get_device_list(int *num)
{
    LOCK();
    bool f = model_fail_now();
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
    if (model_fail_now()) {
        UNLOCK();
        return NULL;
    }
    c = calloc(1, sizeof(*c));
    c->device = d;
    model_nlive.contexts++;
    UNLOCK();
    return c;
}

static int m_close_device(struct ibv_context *c)
{
    LOCK();
    model_nlive.contexts--;
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

static int m_query_device_ex(struct ibv_context *c, const struct ibv_query_device_ex_input *in,
                             struct ibv_device_attr_ex *a)
{
    (void)in;
    memset(a, 0, sizeof(*a));
    m_query_device(c, &a->orig_attr);
    LOCK();
    if (model_odp) {
        a->odp_caps.general_caps = IBV_ODP_SUPPORT;
        a->odp_caps.per_transport_caps.rc_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
                                                     IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ;
    }
    UNLOCK();
    return 0;
}

static const char *m_wc_status_str(enum ibv_wc_status s)
{
    return ibv_wc_status_str(s); /* a pure table lookup: the real one */
}

static int m_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a)
{
    (void)c;
    memset(a, 0, sizeof(*a));
    if (port != 1)
        return EINVAL;
    a->state = port_up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
    a->link_layer = infiniband ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
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

const hccl_rdma_shim_t model_shim = {
    .get_device_list = m_get_device_list,
    .free_device_list = m_free_device_list,
    .get_device_name = m_get_device_name,
    .open_device = m_open_device,
    .close_device = m_close_device,
    .query_device = m_query_device,
    .query_device_ex = m_query_device_ex,
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

