/*
 * sim: every rank in one process. A send completes only when the matching
 * receive is posted (no buffering at all), so a plan that would need the
 * wire to hold data for it deadlocks here instead of passing by luck.
 * It has the window capability too (link.h), over memory of this process.
 */
#include <string.h>
#include <sys/mman.h>

#include "links/link.h"

typedef struct sim_rank {
    hccl_xfer_queue_t *sends_to; /* [nranks]: sends from this rank waiting for peer's recv */
    hccl_xfer_queue_t *recvs_from; /* [nranks]: recvs posted by this rank, unmatched */
    hccl_conn_t **conns;         /* [nranks] */
    uint64_t bytes_sent;
    uint64_t bytes_stored;       /* received by receives that asked for stores past the cache */
    uint64_t bytes_read_direct;  /* received by receives marked read_direct */
} sim_rank_t;

/* A rank's window: two slots of a block and a part, as shm's, in memory of this process. */
typedef struct {
    uint64_t seq;              /* 1 + the round whose block is published; 0: none */
    uint64_t label_seq;
    uint32_t sig;
    const void *addr;          /* non-NULL: the block is there, read in place (direct) */
    uint64_t flag[2];          /* HCCL_WINDOW_PART, _GPART: 1 + the round raised */
    unsigned char *data;       /* HCCL_WINDOW_CAP bytes */
    unsigned char *part;       /* HCCL_WINDOW_PART_CAP bytes */
} sim_slot_t;

typedef struct {
    hccl_sim_world_t *w;
    int rank;
    sim_slot_t slot[2];
    bool (*bell)(void *arg);   /* on_bell's hook, and whether a peer published since it ran */
    void *bell_arg;
    bool rung;
} sim_window_t;

struct hccl_sim_world {
    hccl_reactor_t *reactor;
    int nranks;
    sim_rank_t *ranks;
    sim_window_t *windows;     /* [nranks], made by the first hccl_sim_world_window */
    unsigned char *window_mem; /* their slots: mapped, touched only as far as rounds reach */
    size_t window_bytes;
    uint64_t words[HCCL_WINDOW_WORDS];
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
        if (r->read_direct)
            w->ranks[s->peer].bytes_read_direct += s->len;
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
    if (w->window_mem)
        munmap(w->window_mem, w->window_bytes);
    hccl_free(w->windows);
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

/* ---- the window ---- */

static sim_slot_t *sim_slot(void *ctx, int rank, uint64_t round)
{
    sim_window_t *win = ctx;

    return &win->w->windows[rank].slot[round & 1];
}

static bool sim_window_reaches_all(void *ctx, int nranks)
{
    return ((sim_window_t *)ctx)->w->nranks == nranks;
}

static void *sim_window_block(void *ctx, int rank, uint64_t round)
{
    return sim_slot(ctx, rank, round)->data;
}

/* Every peer is rung: whoever drives the world runs their hooks (hccl_sim_world_ring). */
static void sim_window_ring(sim_window_t *win)
{
    for (int r = 0; r < win->w->nranks; r++)
        if (r != win->rank)
            win->w->windows[r].rung = true;
}

static void sim_window_publish(void *ctx, uint64_t round, uint64_t seq, uint32_t sig,
                               const void *direct)
{
    sim_window_t *win = ctx;
    sim_slot_t *slot = sim_slot(ctx, win->rank, round);

    slot->label_seq = seq;
    slot->sig = sig;
    slot->addr = direct;
    slot->seq = round + 1;
    sim_window_ring(win);
}

static bool sim_window_published(void *ctx, int rank, uint64_t round, uint64_t *seq, uint32_t *sig)
{
    sim_slot_t *slot = sim_slot(ctx, rank, round);

    if (slot->seq != round + 1)
        return false;
    *seq = slot->label_seq;
    *sig = slot->sig;
    return true;
}

/* One process: every rank reads every other's memory. */
static bool sim_window_direct_ok(void *ctx)
{
    (void)ctx;
    return true;
}

static bool sim_window_is_direct(void *ctx, int rank, uint64_t round)
{
    return sim_slot(ctx, rank, round)->addr != NULL;
}

static hcclResult_t sim_window_read(void *ctx, int rank, uint64_t round, size_t off, void *dst,
                                    size_t len)
{
    sim_slot_t *slot = sim_slot(ctx, rank, round);

    memcpy(dst, (const unsigned char *)(slot->addr ? slot->addr : slot->data) + off, len);
    return hcclSuccess;
}

static void *sim_window_part(void *ctx, int rank, uint64_t round)
{
    return sim_slot(ctx, rank, round)->part;
}

static void sim_window_raise(void *ctx, int flag, uint64_t round)
{
    sim_window_t *win = ctx;

    sim_slot(ctx, win->rank, round)->flag[flag] = round + 1;
    sim_window_ring(win);
}

static bool sim_window_raised(void *ctx, int rank, int flag, uint64_t round)
{
    return sim_slot(ctx, rank, round)->flag[flag] == round + 1;
}

static uint64_t sim_window_word(void *ctx, int idx)
{
    return ((sim_window_t *)ctx)->w->words[idx];
}

static void sim_window_set_word(void *ctx, int idx, uint64_t word)
{
    ((sim_window_t *)ctx)->w->words[idx] = word;
}

/* A send of seq from rank to us that no receive has taken yet: a message that arrived. */
static bool sim_window_holds(void *ctx, int rank, uint64_t seq, uint32_t *sig)
{
    sim_window_t *win = ctx;

    for (hccl_xfer_t *x = win->w->ranks[rank].sends_to[win->rank].head; x; x = x->next) {
        if (x->seq == seq) {
            *sig = x->sig;
            return true;
        }
    }
    return false;
}

static void sim_window_on_bell(void *ctx, bool (*fn)(void *arg), void *arg)
{
    sim_window_t *win = ctx;

    win->bell = fn;
    win->bell_arg = arg;
}

/* The slots are this process's memory, mapped without reserving it: nothing to warn of. */
static void sim_window_check_room(void *ctx, size_t reach)
{
    (void)ctx;
    (void)reach;
}

const hccl_window_ops_t hccl_sim_window_ops = {
    .reaches_all = sim_window_reaches_all,
    .block = sim_window_block,
    .publish = sim_window_publish,
    .published = sim_window_published,
    .direct_ok = sim_window_direct_ok,
    .is_direct = sim_window_is_direct,
    .read = sim_window_read,
    .part = sim_window_part,
    .raise = sim_window_raise,
    .raised = sim_window_raised,
    .word = sim_window_word,
    .set_word = sim_window_set_word,
    .holds = sim_window_holds,
    .on_bell = sim_window_on_bell,
    .check_room = sim_window_check_room,
};

void *hccl_sim_world_window(hccl_sim_world_t *w, int rank)
{
    size_t per_slot = (size_t)HCCL_WINDOW_CAP + HCCL_WINDOW_PART_CAP;

    if (!w->windows) {
        w->window_bytes = (size_t)w->nranks * 2 * per_slot;
        w->window_mem = mmap(NULL, w->window_bytes, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        w->windows = hccl_calloc((size_t)w->nranks, sizeof(*w->windows));
        if (w->window_mem == MAP_FAILED || !w->windows) {
            if (w->window_mem != MAP_FAILED)
                munmap(w->window_mem, w->window_bytes);
            w->window_mem = NULL;
            hccl_free(w->windows);
            w->windows = NULL;
            HCCL_FAIL(hcclSystemError, "sim: no memory for %d ranks' windows", w->nranks);
            return NULL;
        }
        for (int r = 0; r < w->nranks; r++) {
            w->windows[r].w = w;
            w->windows[r].rank = r;
            for (int k = 0; k < 2; k++) {
                unsigned char *at = w->window_mem + ((size_t)r * 2 + (size_t)k) * per_slot;
                w->windows[r].slot[k].data = at;
                w->windows[r].slot[k].part = at + HCCL_WINDOW_CAP;
            }
        }
    }
    return &w->windows[rank];
}

bool hccl_sim_world_ring(hccl_sim_world_t *w)
{
    bool moved = false;

    for (int r = 0; w->windows && r < w->nranks; r++) {
        sim_window_t *win = &w->windows[r];
        if (win->rung && win->bell) {
            win->rung = false;
            moved |= win->bell(win->bell_arg);
        }
    }
    return moved;
}
