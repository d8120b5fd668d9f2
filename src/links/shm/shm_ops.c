/* shm: the link vtable, doorbell and liveness events (the ring I/O is in shm_io.c). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "links/shm/shm.h"

/* Bytes taken from one ring per doorbell before the other peers get a turn. */
#define SHM_RX_BUDGET (4u << 20)

static void shm_conn_fail(shm_conn_t *sc, hcclResult_t res)
{
    hccl_link_env_t *env = sc->ctx->env;
    char msg[512];

    if (sc->framer.failed)
        return;
    snprintf(msg, sizeof(msg), "%s", hccl_error_last());
    hccl_framer_fail(&sc->framer, res);
    hccl_shm_conn_close(sc);
    env->on_fatal(env->fatal_arg, res, msg);
}

static void shm_progress_conn(shm_conn_t *sc, bool *more)
{
    hcclResult_t res;

    if (sc->framer.failed)
        return;
    res = hccl_framer_rx(&sc->framer, SHM_RX_BUDGET);
    if (res == hcclInProgress)
        *more = true;
    if (!hccl_is_failure(res))
        res = hccl_framer_tx(&sc->framer);
    if (hccl_is_failure(res))
        shm_conn_fail(sc, res);
}

/* Every ring, up to its budget; what is left waits for the loop's next turn. */
static void shm_progress_all(shm_ctx_t *ctx)
{
    static const struct timeval now = {0, 0};
    bool more = false;

    hccl_reactor_enter(ctx->env->reactor);
    for (int i = 0; i < ctx->nactive; i++) {
        shm_conn_t *sc = ctx->conns[ctx->active[i]];
        shm_progress_conn(sc, &more);
    }
    if (ctx->bell_hook)
        ctx->bell_hook(ctx->bell_hook_arg);
    /* A zero timeout, not event_active: libevent runs events activated during its callbacks in
     * the same turn, before it looks at timers, so a long message would keep a caller's loop
     * from its own timers until the message ends. */
    if (more && ctx->more_ev)
        evtimer_add(ctx->more_ev, &now);
    hccl_reactor_leave(ctx->env->reactor);
}

static void shm_on_bell(evutil_socket_t fd, short what, void *arg)
{
    uint64_t v;

    (void)what;
    if (read(fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        HCCL_WARN("shm: read(doorbell): %s", strerror(errno));
    shm_progress_all(arg);
}

static void shm_on_more(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    shm_progress_all(arg);
}

/* The reactor's poller: the rings that hold data, without reading the doorbell. */
static bool shm_poll(void *arg)
{
    shm_ctx_t *ctx = arg;
    bool moved = false, more = false;

    for (int i = 0; i < ctx->nactive; i++) {
        shm_conn_t *sc = ctx->conns[ctx->active[i]];
        shm_ring_hdr_t *r = sc->rx_ring;
        uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
        if (!sc->framer.failed && (atomic_load_explicit(&r->head, memory_order_acquire) != tail ||
                                   sc->framer.rndv_head)) {
            shm_progress_conn(sc, &more);
            /* Progress is what was consumed: a stalled ring must not keep the thread spinning. */
            moved |= atomic_load_explicit(&r->tail, memory_order_relaxed) != tail;
        }
    }
    return moved;
}

static void shm_set_polling(void *arg, bool on)
{
    shm_ctx_t *ctx = arg;
    _Atomic uint32_t *flag = &((shm_seg_hdr_t *)ctx->seg)->polling;

    /* Peers read the flag on every publication: rewriting an unchanged one would take its
     * line away from them each time. The fence keeps the store-then-look order of a change
     * (see hccl_shm_ring_bell) for a flag already set as well. */
    if (atomic_load_explicit(flag, memory_order_relaxed) != (uint32_t)on)
        atomic_store_explicit(flag, on, memory_order_seq_cst);
    else
        atomic_thread_fence(memory_order_seq_cst);
}

static void shm_peer_gone(shm_conn_t *sc);

static void shm_on_peer_gone(evutil_socket_t fd, short what, void *arg)
{
    shm_conn_t *sc = arg;
    hccl_reactor_t *r = sc->ctx->env->reactor;
    char c;
    ssize_t n;

    (void)fd, (void)what;
    hccl_reactor_enter(r);
    /* Closed while this callback waited for the lock: the fd may be another file by now. */
    n = sc->out_fd < 0 ? 0 : recv(sc->out_fd, &c, 1, MSG_DONTWAIT);
    if (sc->out_fd >= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR)))
        shm_peer_gone(sc);
    hccl_reactor_leave(r);
}

static void shm_peer_gone(shm_conn_t *sc)
{
    /* What it wrote before going is still in our ring: its goodbye may be there. */
    if (!sc->framer.failed && !hccl_is_failure(hccl_framer_rx(&sc->framer, SIZE_MAX)) &&
        hccl_framer_closed_cleanly(&sc->framer)) {
        HCCL_INFO(HCCL_SUB_LINK, "rank %d: rank %d closed its shm connection", sc->ctx->env->rank,
                  sc->conn.peer);
        hccl_shm_conn_close(sc);
        return;
    }
    hccl_error_set_quiet(hcclRemoteError,
                         "rank %d: shm peer rank %d (pid %d) is gone: its process "
                         "exited or it closed the communicator",
                         sc->ctx->env->rank, sc->conn.peer, (int)sc->pid);
    /* Gone without a word of why: the peer is the origin, whoever sees it. */
    if (!sc->framer.failed && !sc->framer.peer_caused && sc->ctx->env->on_cause) {
        hccl_cause_t c;
        hccl_cause_lost(&c, sc->conn.peer, sc->ctx->env->rank, sc->ctx->env->nranks);
        sc->ctx->env->on_cause(sc->ctx->env->fatal_arg, &c);
    }
    shm_conn_fail(sc, hcclRemoteError);
}

static hcclResult_t shm_init(hccl_link_env_t *env, void *blob, void **ctx_p)
{
    shm_ctx_t *ctx = hccl_calloc(1, sizeof(*ctx));
    hcclResult_t res;

    if (!ctx)
        return HCCL_FAIL(hcclSystemError, "shm: out of memory");
    ctx->env = env;
    ctx->uds_fd = ctx->bell_fd = -1;
    ctx->conns = hccl_calloc((size_t)env->nranks, sizeof(*ctx->conns));
    ctx->active = hccl_calloc((size_t)env->nranks, sizeof(*ctx->active));
    if (!ctx->conns || !ctx->active) {
        res = HCCL_FAIL(hcclSystemError, "shm: out of memory");
        goto err_teardown;
    }
    HCCL_CHECK_GOTO(hccl_shm_setup(ctx, blob), res, err_teardown);
    *ctx_p = ctx;
    return hcclSuccess;

err_teardown:
    hccl_shm_teardown(ctx);
    hccl_free(ctx->conns);
    hccl_free(ctx->active);
    hccl_free(ctx);
    return res;
}

static bool shm_reaches(const hccl_card_t *me, const hccl_card_t *peer)
{
    return strcmp(me->host, peer->host) == 0;
}

static void shm_allow_single_copy(void)
{
    /* Under Yama ptrace_scope 1 a sibling may not read our memory unless we allow it. */
#ifdef PR_SET_PTRACER
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    int scope = 0;

    if (!f)
        return;
    if (fscanf(f, "%d", &scope) == 1 && scope == 1)
        prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    fclose(f);
#endif
}

/* Where every rank of the host has a CPU of its own, the part of each ring in use. */
#define SHM_RING_WINDOW (2u << 20)

/* Whether every rank of this host is pinned to a CPU of its own (from the cards). */
static bool shm_cpus_own(const shm_ctx_t *ctx)
{
    const hccl_link_env_t *env = ctx->env;
    const hccl_card_t *me = &env->cards[env->rank];

    for (int a = 0; a < env->nranks; a++) {
        const hccl_card_t *ca = &env->cards[a];
        if (strcmp(ca->host, me->host) != 0)
            continue;
        if (ca->pinned_cpu == 0)
            return false;
        for (int b = a + 1; b < env->nranks; b++)
            if (env->cards[b].pinned_cpu == ca->pinned_cpu &&
                strcmp(env->cards[b].host, me->host) == 0)
                return false;
    }
    return true;
}

/*
 * Where every rank of this host is pinned to a CPU of its own, each receiver drains its rings
 * as they fill, and a 2 MiB ring keeps the copies through it in cache, which pays for all but
 * the largest messages; where ranks may share a CPU, the whole ring holds what a receiver off
 * its CPU has not read yet (docs/performance.md). Every rank of the host computes the same
 * from the cards, as both ends of a ring must.
 */
static size_t shm_ring_window(const shm_ctx_t *ctx, bool cpus_own)
{
    if (!cpus_own)
        return ctx->ring_bytes;
    return ctx->ring_bytes < SHM_RING_WINDOW ? ctx->ring_bytes : SHM_RING_WINDOW;
}

static hcclResult_t shm_connect(void *vctx, const int *peers, int npeers, int64_t deadline_ms,
                                hccl_conn_t **conns)
{
    shm_ctx_t *ctx = vctx;
    hccl_link_env_t *env = ctx->env;
    struct event_base *base = hccl_reactor_base(env->reactor);
    bool cpus_own;

    shm_allow_single_copy();
    cpus_own = shm_cpus_own(ctx);
    ctx->ring_used = shm_ring_window(ctx, cpus_own);
    HCCL_CHECK(hccl_shm_connect_all(ctx, peers, npeers, deadline_ms));
    hccl_shm_window_probe(ctx);
    ctx->bell_ev = event_new(base, ctx->bell_fd, EV_READ | EV_PERSIST, shm_on_bell, ctx);
    ctx->more_ev = evtimer_new(base, shm_on_more, ctx);
    if (!ctx->bell_ev || !ctx->more_ev || event_add(ctx->bell_ev, NULL) != 0)
        return HCCL_FAIL(hcclSystemError, "shm: cannot register the doorbell");
    HCCL_CHECK(
        hccl_reactor_add_poller(env->reactor, &(hccl_poller_t){shm_poll, shm_set_polling, ctx}));
    for (int i = 0; i < npeers; i++) {
        shm_conn_t *sc = ctx->conns[peers[i]];
        sc->conn.ops = &hccl_link_shm_ops;
        sc->conn.ctx = ctx;
        sc->conn.priv = sc;
        hccl_framer_init(&sc->framer, &hccl_shm_io, env->reactor, sc, env->rank, peers[i],
                         env->params->cma_threshold);
        sc->framer.comm_id = env->comm_id;
        sc->framer.nranks = env->nranks;
        sc->framer.pull_max = env->params->shm_pull_max;
        sc->framer.eager_cap = env->params->buffsize; /* held data per peer: frame.h */
        sc->framer.tx_wire_cold = sc->framer.rx_wire_cold = true;
        /* Where ranks share CPUs, a sender's copy timed includes its turns off the CPU. */
        sc->framer.count_sender_copy = cpus_own;
        sc->framer.activity = &sc->conn.activity;
        sc->live_ev = event_new(base, sc->out_fd, EV_READ | EV_PERSIST, shm_on_peer_gone, sc);
        if (!sc->live_ev || event_add(sc->live_ev, NULL) != 0)
            return HCCL_FAIL(hcclSystemError, "shm: cannot watch rank %d", peers[i]);
        conns[peers[i]] = &sc->conn;
        HCCL_INFO(HCCL_SUB_LINK,
                  "rank %d: shm link to rank %d (pid %d) is up, ring %zu B, "
                  "single-copy from %zu B (pulled up to %zu B)",
                  env->rank, peers[i], (int)sc->pid, ctx->ring_used, env->params->cma_threshold,
                  env->params->shm_pull_max);
    }
    return hcclSuccess;
}

static hcclResult_t shm_post_send(hccl_conn_t *c, hccl_xfer_t *x)
{
    shm_conn_t *sc = c->priv;
    hcclResult_t res = hccl_framer_post_send(&sc->framer, x);

    if (hccl_is_failure(res))
        shm_conn_fail(sc, res);
    return hcclSuccess;
}

static hcclResult_t shm_post_recv(hccl_conn_t *c, hccl_xfer_t *x)
{
    shm_conn_t *sc = c->priv;
    hcclResult_t res = hccl_framer_post_recv(&sc->framer, x);

    if (hccl_is_failure(res))
        shm_conn_fail(sc, res); /* x was failed by the framer */
    return hcclSuccess;
}

static void shm_abort(void *vctx, hcclResult_t res)
{
    shm_ctx_t *ctx = vctx;

    for (int i = 0; i < ctx->nactive; i++) {
        shm_conn_t *sc = ctx->conns[ctx->active[i]];
        hccl_framer_send_failure(&sc->framer, res, ctx->env->cause);
        hccl_framer_fail(&sc->framer, res);
        hccl_shm_conn_close(sc); /* closing our sockets tells the peers */
    }
}

static void shm_notify(void *vctx, const hccl_cause_t *c)
{
    shm_ctx_t *ctx = vctx;

    for (int i = 0; i < ctx->nactive; i++) {
        shm_conn_t *sc = ctx->conns[ctx->active[i]];
        hcclResult_t res = hccl_framer_send_cause(&sc->framer, c); /* writing rings its bell */
        if (hccl_is_failure(res))
            shm_conn_fail(sc, res);
    }
}

static void shm_close_peer(void *vctx, int peer)
{
    shm_ctx_t *ctx = vctx;
    shm_conn_t *sc = ctx->conns[peer];

    if (!sc || sc->framer.failed)
        return;
    hccl_error_set_quiet(hcclRemoteError,
                         "rank %d: shm connection to rank %d (pid %d) was cut "
                         "(HCCL_FAULT close)",
                         ctx->env->rank, peer, (int)sc->pid);
    shm_conn_fail(sc, hcclRemoteError); /* closing our sockets is what the peer sees */
}

static void shm_shutdown(void *vctx, int64_t deadline_ms)
{
    shm_ctx_t *ctx = vctx;

    for (int i = 0; i < ctx->nactive; i++) {
        shm_conn_t *sc = ctx->conns[ctx->active[i]];
        if (sc->framer.failed || sc->peer_bell < 0)
            continue;
        hccl_framer_send_bye(&sc->framer);
        /* A full ring drains as the peer reads; it rings our doorbell when it does. */
        while (hccl_framer_tx(&sc->framer) == hcclInProgress) {
            struct pollfd p = {.fd = ctx->bell_fd, .events = POLLIN};
            int64_t left = deadline_ms - hccl_now_ms();
            uint64_t v;
            if (left <= 0 || poll(&p, 1, (int)(left < 100 ? left : 100)) < 0)
                break;
            if (read(ctx->bell_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                break;
        }
    }
}

static void shm_fini(void *vctx)
{
    shm_ctx_t *ctx = vctx;

    if (!ctx)
        return;
    for (int i = 0; i < ctx->nactive; i++)
        hccl_framer_fail(&ctx->conns[ctx->active[i]]->framer, hcclAborted);
    hccl_shm_teardown(ctx);
    hccl_free(ctx->conns);
    hccl_free(ctx->active);
    hccl_free(ctx);
}

const hccl_link_ops_t hccl_link_shm_ops = {
    .size = sizeof(hccl_link_ops_t),
    .name = "shm",
    .id = HCCL_LINK_SHM,
    .init = shm_init,
    .reaches = shm_reaches,
    .connect = shm_connect,
    .post_send = shm_post_send,
    .post_recv = shm_post_recv,
    .abort = shm_abort,
    .shutdown = shm_shutdown,
    .fini = shm_fini,
    .close = shm_close_peer,
    .recv_consume = true,
    .notify = shm_notify,
    .caps = HCCL_LINK_CAP_WINDOW,
    .window = &hccl_shm_window_ops,
};

void hccl_shm_check_room(void *shm_ctx, size_t reach)
{
    shm_ctx_t *ctx = shm_ctx;
    /* Two window slots, each a block and a part of at most half of one. */
    size_t window = 2 * (reach + reach / 2);
    size_t per_rank =
        SHM_SEG_HDR_BYTES + window + (size_t)ctx->nactive * hccl_shm_slot_bytes(ctx->ring_used);
    size_t need = per_rank * (size_t)(ctx->nactive + 1);

    for (int i = 0; i < ctx->nactive; i++)
        if (ctx->active[i] < ctx->env->rank)
            return; /* the host's lowest rank speaks for it */
    /* The room before any rank of this host populated its rings (shm_populate_rings). */
    if (ctx->nactive == 0 || !ctx->room_known || ctx->room >= need)
        return;
    HCCL_WARN(
        "rank %d: shm: /dev/shm has %zu MiB free, but the %d ranks of this host may come to "
        "use up to %zu MiB of it (per rank: %zu KiB of ring per local peer and %zu KiB of window "
        "slots); a rank that touches a page /dev/shm cannot supply dies of SIGBUS. Give "
        "/dev/shm more room (docker: --shm-size), or lower HCCL_BUFFSIZE and HCCL_LANE_MAX",
        ctx->env->rank, ctx->room >> 20, ctx->nactive + 1, need >> 20, ctx->ring_used >> 10,
        window >> 10);
}
