/* rdma: picking the device, its PD / CQ / completion channel, completions. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "links/rdma/rdma.h"

/* One entry of an HCCL_IB_HCA list ("mlx5_0" or "mlx5_0:1"), compared with dev:port. */
static bool hca_entry_matches(const char *e, size_t n, const char *dev, int port, bool exact)
{
    const char *colon = memchr(e, ':', n);
    size_t name_len = colon ? (size_t)(colon - e) : n;

    if (colon && atoi(colon + 1) != port)
        return false;
    if (exact)
        return name_len == strlen(dev) && strncmp(e, dev, name_len) == 0;
    return strncmp(e, dev, name_len) == 0; /* NCCL: a prefix selects every device it starts */
}

bool hccl_rdma_hca_allowed(const char *spec, const char *dev, int port)
{
    bool exclude = false, exact = false, any = false;

    if (!spec || !*spec)
        return true;
    if (*spec == '^')
        exclude = true, spec++;
    if (*spec == '=')
        exact = true, spec++;
    for (const char *p = spec; *p;) {
        size_t n = strcspn(p, ",");
        if (n && hca_entry_matches(p, n, dev, port, exact))
            any = true;
        p += n;
        if (*p)
            p++;
    }
    return exclude ? !any : any;
}

static bool gid_is_v4_mapped(const union ibv_gid *g)
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

    return memcmp(g->raw, prefix, sizeof(prefix)) == 0;
}

/* The GID of dev:port to use (HCCL_IB_GID_INDEX, else the first IPv4-mapped one), or -1. */
static int pick_gid(rdma_ctx_t *ctx, struct ibv_context *vctx, int port, int table_len,
                    union ibv_gid *gid)
{
    long want = hccl_param_env_long("HCCL_IB_GID_INDEX", -1);

    if (want >= 0)
        return ctx->v->query_gid(vctx, (uint8_t)port, (int)want, gid) == 0 ? (int)want : -1;
    for (int i = 0; i < table_len && i < 16; i++)
        if (ctx->v->query_gid(vctx, (uint8_t)port, i, gid) == 0 && gid_is_v4_mapped(gid))
            return i;
    return -1;
}

/* Fills the card from one active port, with the IP address that rdma_cm binds to. */
static bool try_port(rdma_ctx_t *ctx, struct ibv_context *vctx, const char *name, int port,
                     hccl_sockaddr_t *addr)
{
    struct ibv_port_attr pa;
    union ibv_gid gid;
    int gi;

    memset(&pa, 0, sizeof(pa));
    if (ctx->v->query_port(vctx, (uint8_t)port, &pa) != 0 || pa.state != IBV_PORT_ACTIVE)
        return false;
    memset(addr, 0, sizeof(*addr));
    if (pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
        gi = pick_gid(ctx, vctx, port, pa.gid_tbl_len, &gid);
        if (gi < 0 || !gid_is_v4_mapped(&gid))
            return false; /* rdma_cm needs an IPv4 address on the port */
        addr->in4.sin_family = AF_INET;
        memcpy(&addr->in4.sin_addr, gid.raw + 12, 4);
    } else {
        /* InfiniBand: the IPoIB address of HCCL_SOCKET_IFNAME. */
        gi = 0;
        if (ctx->v->query_gid(vctx, (uint8_t)port, 0, &gid) != 0 ||
            hccl_socket_pick_addr(ctx->env->params->ifname, addr) != hcclSuccess)
            return false;
    }
    ctx->card.active = 1;
    ctx->card.port_num = (uint8_t)port;
    ctx->card.link_layer = pa.link_layer;
    ctx->card.gid_index = (int8_t)gi;
    memcpy(ctx->card.gid, gid.raw, sizeof(ctx->card.gid));
    snprintf(ctx->card.dev, sizeof(ctx->card.dev), "%s", name);
    return true;
}

hcclResult_t hccl_rdma_pick_device(rdma_ctx_t *ctx, hccl_sockaddr_t *addr_p)
{
    const char *spec = getenv("HCCL_IB_HCA");
    int n = 0;
    struct ibv_device **list = ctx->v->get_device_list(&n);
    bool found = false;

    for (int i = 0; list && i < n && !found; i++) {
        const char *name = ctx->v->get_device_name(list[i]);
        struct ibv_context *vctx = ctx->v->open_device(list[i]);
        struct ibv_device_attr da;
        if (!vctx)
            continue;
        memset(&da, 0, sizeof(da));
        if (ctx->v->query_device(vctx, &da) == 0)
            for (int port = 1; port <= da.phys_port_cnt && !found; port++)
                found = hccl_rdma_hca_allowed(spec, name, port) &&
                        try_port(ctx, vctx, name, port, addr_p);
        ctx->v->close_device(vctx);
    }
    if (list)
        ctx->v->free_device_list(list);
    if (!found)
        return hccl_error_set_quiet(hcclUnsupported, "rdma: no active RDMA port%s%s%s",
                                    n ? "" : " (no RDMA device)", spec ? " allowed by HCCL_IB_HCA=" : "",
                                    spec ? spec : "");
    return hcclSuccess;
}

/*
 * On-demand paging for RC: the device reads a send's (or write's) source and is written into
 * through MRs that follow the page tables, so a buffer freed and allocated again is seen as it
 * is now. Explicit ODP (one MR per buffer), not implicit: an MR of the whole address space
 * would let a peer write anywhere in this process.
 */
static bool odp_usable(rdma_ctx_t *ctx, struct ibv_context *vctx)
{
    const uint32_t need = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_WRITE;
    struct ibv_device_attr_ex a;

    memset(&a, 0, sizeof(a));
    if (ctx->v->query_device_ex(vctx, NULL, &a) != 0)
        return false; /* an old provider: no ODP */
    return (a.odp_caps.general_caps & IBV_ODP_SUPPORT) &&
           (a.odp_caps.per_transport_caps.rc_odp_caps & need) == need;
}

hcclResult_t hccl_rdma_ctx_open(rdma_ctx_t *ctx)
{
    struct ibv_context *vctx = ctx->listen_id->verbs;
    int cqe = ctx->env->nranks * (RDMA_NRECV + RDMA_NSEND + 8);
    int flags;

    if (!vctx)
        return hccl_error_set_quiet(hcclUnsupported, "rdma: the address of %s is on no RDMA device",
                                    ctx->card.dev);
    ctx->odp = odp_usable(ctx, vctx);
    HCCL_INFO(HCCL_SUB_INIT | HCCL_SUB_LINK, "rank %d: rdma on %s: user buffers registered %s",
              ctx->env->rank, ctx->card.dev,
              ctx->odp ? "on demand (ODP), cached across collectives"
                       : "pinned, cached within one collective");
    ctx->pd = ctx->v->alloc_pd(vctx);
    if (!ctx->pd)
        return HCCL_FAIL(hcclSystemError, "rdma: ibv_alloc_pd on %s: %s", ctx->card.dev, strerror(errno));
    ctx->comp_ch = ctx->v->create_comp_channel(vctx);
    if (!ctx->comp_ch)
        return HCCL_FAIL(hcclSystemError, "rdma: ibv_create_comp_channel: %s", strerror(errno));
    flags = fcntl(ctx->comp_ch->fd, F_GETFL);
    if (flags < 0 || fcntl(ctx->comp_ch->fd, F_SETFL, flags | O_NONBLOCK) != 0)
        return HCCL_FAIL(hcclSystemError, "rdma: completion channel O_NONBLOCK: %s", strerror(errno));
    ctx->cq = ctx->v->create_cq(vctx, cqe, ctx, ctx->comp_ch, 0);
    if (!ctx->cq)
        return HCCL_FAIL(hcclSystemError, "rdma: ibv_create_cq(%d): %s", cqe, strerror(errno));
    if (ctx->v->req_notify_cq(ctx->cq, 0) != 0)
        return HCCL_FAIL(hcclSystemError, "rdma: ibv_req_notify_cq: %s", strerror(errno));
    return hcclSuccess;
}

/* Frees what hccl_rdma_ctx_open made; every connection's QP and MRs are gone already. */
void hccl_rdma_ctx_close(rdma_ctx_t *ctx)
{
    hccl_rdma_reg_clear(ctx);
    if (ctx->ev_cq)
        event_free(ctx->ev_cq);
    ctx->ev_cq = NULL;
    if (ctx->cq) {
        if (ctx->unacked)
            ctx->v->ack_cq_events(ctx->cq, ctx->unacked); /* ibv_destroy_cq waits for these */
        ctx->unacked = 0;
        ctx->v->destroy_cq(ctx->cq);
        ctx->cq = NULL;
    }
    if (ctx->comp_ch)
        ctx->v->destroy_comp_channel(ctx->comp_ch);
    ctx->comp_ch = NULL;
    if (ctx->pd)
        ctx->v->dealloc_pd(ctx->pd);
    ctx->pd = NULL;
}

static void rdma_fail_device(rdma_ctx_t *ctx, const char *call)
{
    hccl_link_env_t *env = ctx->env;
    char msg[256];

    snprintf(msg, sizeof(msg), "rank %d: rdma %s on %s failed: %s", env->rank, call, ctx->card.dev,
             strerror(errno));
    hccl_error_set_quiet(hcclSystemError, "%s", msg);
    env->on_fatal(env->fatal_arg, hcclSystemError, msg);
}

void hccl_rdma_drain_cq(rdma_ctx_t *ctx)
{
    struct ibv_wc wc[RDMA_POLL_BATCH];
    int n;

    do {
        n = ctx->v->poll_cq(ctx->cq, RDMA_POLL_BATCH, wc);
        for (int i = 0; i < n; i++)
            hccl_rdma_complete(ctx, &wc[i]);
    } while (n == RDMA_POLL_BATCH);
    if (n < 0)
        rdma_fail_device(ctx, "ibv_poll_cq");
}

/* Re-arm, then drain: a completion that lands after the drain raises a new event. */
void hccl_rdma_on_cq_event(evutil_socket_t fd, short what, void *arg)
{
    rdma_ctx_t *ctx = arg;
    struct ibv_cq *cq;
    void *cq_ctx;

    (void)fd, (void)what;
    hccl_reactor_enter(ctx->env->reactor);
    while (ctx->v->get_cq_event(ctx->comp_ch, &cq, &cq_ctx) == 0)
        ctx->unacked++;
    if (ctx->unacked >= RDMA_ACK_BATCH) {
        ctx->v->ack_cq_events(ctx->cq, ctx->unacked);
        ctx->unacked = 0;
    }
    if (ctx->v->req_notify_cq(ctx->cq, 0) != 0)
        rdma_fail_device(ctx, "ibv_req_notify_cq");
    else
        hccl_rdma_drain_cq(ctx);
    hccl_reactor_leave(ctx->env->reactor);
}
