/*
 * rdma: the registration cache of user buffers for zero-copy transfers.
 *
 * A buffer belongs to the library only until its request completes; then the caller may free
 * it, and a new buffer may come back at the same address. A pinned MR (no on-demand paging)
 * keeps the pages the range had when it was registered, so data written through it after such
 * a free lands in freed memory. Hence, without ODP, an entry serves only transfers of the
 * request that registered it (rdma_req_key_t), and once no transfer of that request is in
 * flight here and a transfer of another request comes, it is deregistered. With ODP the device
 * follows the page tables, so an entry serves any request. Either way at most RDMA_REG_CACHE
 * entries are kept while no transfer uses them (least recently used go first); entries in use
 * are never released.
 */
#include <errno.h>
#include <string.h>

#include "links/rdma/rdma.h"

static void reg_release(rdma_ctx_t *ctx, rdma_reg_t **link)
{
    rdma_reg_t *e = *link;

    *link = e->next;
    ctx->v->dereg_mr(e->mr);
    if (e->inflight == 0)
        ctx->nregs_idle--;
    ctx->nregs--;
    hccl_free(e);
}

static rdma_req_key_t req_key(const hccl_xfer_t *x, bool send)
{
    rdma_req_key_t k = {.seq = x->seq, .sig = x->sig, .peer = -1, .send = -1};

    if (!x->sig) {
        k.peer = x->peer;
        k.send = send;
    }
    return k;
}

static bool same_req(const rdma_req_key_t *a, const rdma_req_key_t *b)
{
    return a->seq == b->seq && a->sig == b->sig && a->peer == b->peer && a->send == b->send;
}

static bool req_in_flight(const rdma_ctx_t *ctx, const rdma_req_key_t *k)
{
    for (const rdma_reg_t *e = ctx->regs; e; e = e->next)
        if (e->inflight > 0 && same_req(&e->req, k))
            return true;
    return false;
}

/* Pinned entries of other requests that have nothing in flight here: their request is over. */
static void reg_retire(rdma_ctx_t *ctx, const rdma_req_key_t *k)
{
    rdma_reg_t **link = &ctx->regs;

    while (*link) {
        rdma_reg_t *e = *link;
        if (e->inflight == 0 && !same_req(&e->req, k) && !req_in_flight(ctx, &e->req))
            reg_release(ctx, link);
        else
            link = &e->next;
    }
}

/* Keeps at most RDMA_REG_CACHE idle entries. */
static void reg_bound(rdma_ctx_t *ctx)
{
    while (ctx->nregs_idle > RDMA_REG_CACHE) {
        rdma_reg_t **oldest = NULL;
        for (rdma_reg_t **link = &ctx->regs; *link; link = &(*link)->next)
            if ((*link)->inflight == 0 && (!oldest || (*link)->last_use < (*oldest)->last_use))
                oldest = link;
        reg_release(ctx, oldest);
    }
}

static rdma_reg_t *reg_find(rdma_ctx_t *ctx, const hccl_xfer_t *x, const rdma_req_key_t *k)
{
    uintptr_t lo = (uintptr_t)x->buf, hi = lo + x->len;

    for (rdma_reg_t *e = ctx->regs; e; e = e->next) {
        uintptr_t elo = (uintptr_t)e->addr;
        if (lo >= elo && hi <= elo + e->len && (ctx->odp || same_req(&e->req, k)))
            return e;
    }
    return NULL;
}

hcclResult_t hccl_rdma_reg_get(rdma_ctx_t *ctx, const hccl_xfer_t *x, bool send,
                               rdma_reg_t **reg_p)
{
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    rdma_req_key_t k = req_key(x, send);
    rdma_reg_t *e;

    if (!ctx->odp)
        reg_retire(ctx, &k);
    e = reg_find(ctx, x, &k);
    if (e) {
        if (e->inflight++ == 0)
            ctx->nregs_idle--;
        e->last_use = ++ctx->reg_clock;
        ctx->reg_hits++;
        *reg_p = e;
        return hcclSuccess;
    }
    e = hccl_calloc(1, sizeof(*e));
    if (!e)
        return HCCL_FAIL(hcclSystemError, "rank %d: rdma: out of memory registering a buffer for "
                         "rank %d", ctx->env->rank, x->peer);
    if (ctx->odp)
        access |= IBV_ACCESS_ON_DEMAND;
    e->mr = ctx->v->reg_mr(ctx->pd, x->buf, x->len, access);
    if (!e->mr) {
        int err = errno;
        hccl_free(e);
        return HCCL_FAIL(hcclSystemError, "rank %d: rdma: ibv_reg_mr(%zu bytes%s) on %s for rank "
                         "%d: %s", ctx->env->rank, x->len, ctx->odp ? ", on demand" : "",
                         ctx->card.dev, x->peer, strerror(err));
    }
    e->addr = x->buf;
    e->len = x->len;
    e->req = k;
    e->inflight = 1;
    e->last_use = ++ctx->reg_clock;
    e->next = ctx->regs;
    ctx->regs = e;
    ctx->nregs++;
    ctx->reg_misses++;
    *reg_p = e;
    return hcclSuccess;
}

void hccl_rdma_reg_put(rdma_ctx_t *ctx, rdma_reg_t *reg)
{
    if (!reg || reg->inflight == 0)
        return;
    if (--reg->inflight == 0) {
        ctx->nregs_idle++;
        reg_bound(ctx);
    }
}

void hccl_rdma_reg_clear(rdma_ctx_t *ctx)
{
    while (ctx->regs)
        reg_release(ctx, &ctx->regs);
}
