/*
 * sim: every rank in one process. A send completes only when the matching
 * receive is posted (no buffering at all), so a plan that would need the
 * wire to hold data for it deadlocks here instead of passing by luck.
 */
#include <string.h>

#include "links/link.h"

typedef struct sim_rank {
    hccl_xfer_queue_t *sends_to; /* [nranks]: sends from this rank waiting for peer's recv */
    hccl_xfer_queue_t *recvs_from; /* [nranks]: recvs posted by this rank, unmatched */
    hccl_conn_t **conns;         /* [nranks] */
    uint64_t bytes_sent;
    uint64_t bytes_stored;       /* received by receives that asked for stores past the cache */
    uint64_t bytes_read_direct;  /* received by receives marked read_direct */
} sim_rank_t;

struct hccl_sim_world {
    hccl_reactor_t *reactor;
    int nranks;
    sim_rank_t *ranks;
};

static const hccl_link_ops_t sim_ops;

/* Bytes per piece handed to a consuming receive: small, so that tests cross piece edges. */
#define SIM_CONSUME_PIECE 4096u

typedef struct {
    hccl_sim_world_t *w;
    int rank;
} sim_conn_t;

static void sim_match(hccl_sim_world_t *w, hccl_xfer_t *s, hccl_xfer_t *r, int from)
{
    hcclResult_t res = hcclSuccess;

    if (s->len != r->len) {
        res = HCCL_FAIL(hcclInvalidUsage, "sim: rank %d sent %zu bytes to rank %d, which expected "
                                          "%zu (seq %llu tag %u)", from, s->len, s->peer, r->len,
                        (unsigned long long)s->seq, s->tag);
    } else if (s->len && r->consume) {
        /* In pieces, as a real link hands them over: whole units, several per message. */
        size_t unit = hccl_xfer_unit(r);
        size_t piece = SIM_CONSUME_PIECE - SIM_CONSUME_PIECE % unit;
        for (size_t off = 0; off < s->len; off += piece)
            r->consume(r, off, (const char *)s->buf + off,
                       s->len - off < piece ? s->len - off : piece);
        w->ranks[from].bytes_sent += s->len;
    } else if (s->len) {
        if (r->read_direct)
            w->ranks[s->peer].bytes_read_direct += s->len;
        if (r->store) {
            hccl_store_copy(r->buf, s->buf, s->len);
            w->ranks[s->peer].bytes_stored += s->len;
        } else {
            memcpy(r->buf, s->buf, s->len);
        }
        w->ranks[from].bytes_sent += s->len;
    }
    s->moved = r->moved = s->len;
    hccl_xfer_complete_later(w->reactor, s, res);
    hccl_xfer_complete_later(w->reactor, r, res);
}

static hcclResult_t sim_post_send(hccl_conn_t *c, hccl_xfer_t *x)
{
    sim_conn_t *sc = c->priv;
    hccl_sim_world_t *w = sc->w;
    hccl_xfer_t *r = hccl_xfer_queue_take(&w->ranks[c->peer].recvs_from[sc->rank], x->seq, x->tag);

    if (r)
        sim_match(w, x, r, sc->rank);
    else
        hccl_xfer_queue_push(&w->ranks[sc->rank].sends_to[c->peer], x);
    return hcclSuccess;
}

static hcclResult_t sim_post_recv(hccl_conn_t *c, hccl_xfer_t *x)
{
    sim_conn_t *sc = c->priv;
    hccl_sim_world_t *w = sc->w;
    hccl_xfer_t *s = hccl_xfer_queue_take(&w->ranks[c->peer].sends_to[sc->rank], x->seq, x->tag);

    if (s)
        sim_match(w, s, x, c->peer);
    else
        hccl_xfer_queue_push(&w->ranks[sc->rank].recvs_from[c->peer], x);
    return hcclSuccess;
}

static const hccl_link_ops_t sim_ops = {
    .size = sizeof(hccl_link_ops_t),
    .name = "sim",
    .id = HCCL_LINK_SIM,
    .post_send = sim_post_send,
    .post_recv = sim_post_recv,
    .recv_consume = true,
};

hcclResult_t hccl_sim_world_create(hccl_reactor_t *r, int nranks, hccl_sim_world_t **w_p)
{
    hccl_sim_world_t *w = hccl_calloc(1, sizeof(*w));

    if (!w)
        return HCCL_FAIL(hcclSystemError, "sim: out of memory");
    w->reactor = r;
    w->nranks = nranks;
    w->ranks = hccl_calloc((size_t)nranks, sizeof(*w->ranks));
    if (!w->ranks)
        goto err_oom;
    for (int i = 0; i < nranks; i++) {
        sim_rank_t *sr = &w->ranks[i];
        sr->sends_to = hccl_calloc((size_t)nranks, sizeof(*sr->sends_to));
        sr->recvs_from = hccl_calloc((size_t)nranks, sizeof(*sr->recvs_from));
        sr->conns = hccl_calloc((size_t)nranks, sizeof(*sr->conns));
        if (!sr->sends_to || !sr->recvs_from || !sr->conns)
            goto err_oom;
        for (int j = 0; j < nranks; j++) {
            hccl_conn_t *c;
            sim_conn_t *sc;
            if (j == i)
                continue;
            c = hccl_calloc(1, sizeof(*c));
            sc = hccl_calloc(1, sizeof(*sc));
            if (!c || !sc) {
                hccl_free(c);
                hccl_free(sc);
                goto err_oom;
            }
            sc->w = w;
            sc->rank = i;
            c->ops = &sim_ops;
            c->peer = j;
            c->priv = sc;
            sr->conns[j] = c;
        }
    }
    *w_p = w;
    return hcclSuccess;

err_oom:
    hccl_sim_world_destroy(w);
    return HCCL_FAIL(hcclSystemError, "sim: out of memory for %d ranks", nranks);
}

void hccl_sim_world_destroy(hccl_sim_world_t *w)
{
    if (!w)
        return;
    for (int i = 0; w->ranks && i < w->nranks; i++) {
        sim_rank_t *sr = &w->ranks[i];
        for (int j = 0; sr->conns && j < w->nranks; j++) {
            if (sr->conns[j]) {
                hccl_free(sr->conns[j]->priv);
                hccl_free(sr->conns[j]);
            }
        }
        hccl_free(sr->sends_to);
        hccl_free(sr->recvs_from);
        hccl_free(sr->conns);
    }
    hccl_free(w->ranks);
    hccl_free(w);
}

hccl_conn_t **hccl_sim_world_conns(hccl_sim_world_t *w, int rank)
{
    return w->ranks[rank].conns;
}

uint64_t hccl_sim_bytes_sent(const hccl_sim_world_t *w, int rank)
{
    return w->ranks[rank].bytes_sent;
}

uint64_t hccl_sim_bytes_stored(const hccl_sim_world_t *w, int rank)
{
    return w->ranks[rank].bytes_stored;
}

uint64_t hccl_sim_bytes_read_direct(const hccl_sim_world_t *w, int rank)
{
    return w->ranks[rank].bytes_read_direct;
}
