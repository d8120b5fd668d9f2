/* tcp: the link vtable, the socket events and the framer's I/O over a socket. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "links/tcp/tcp.h"

/* Bytes read per readable event before giving the other connections a turn. */
#define TCP_RX_BUDGET (4u << 20)
#define TCP_READAHEAD (16u << 10)

static ssize_t tcp_io_read(hccl_framer_t *s, void *buf, size_t len)
{
    tcp_conn_t *tc = s->transport;
    ssize_t n;

    if (tc->ra_pos == tc->ra_len && !tc->ra_drained) {
        /* Large reads go straight to their buffer; small ones through the read-ahead. */
        bool direct = len >= TCP_READAHEAD;
        size_t want = direct ? len : TCP_READAHEAD;
        n = recv(tc->fd, direct ? buf : tc->ra, want, 0);
        if (n > 0) {
            tc->ra_drained = (size_t)n < want;
            if (direct)
                return n;
            tc->ra_pos = 0;
            tc->ra_len = (size_t)n;
        }
    } else {
        n = 1;
    }
    if (tc->ra_pos < tc->ra_len) {
        size_t k = tc->ra_len - tc->ra_pos < len ? tc->ra_len - tc->ra_pos : len;
        memcpy(buf, tc->ra + tc->ra_pos, k);
        tc->ra_pos += k;
        return (ssize_t)k;
    }
    if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR)))
        return 0;
    s->wire_broken = true;
    hccl_error_set_quiet(hcclRemoteError, "rank %d: tcp connection to rank %d (%s) %s", s->rank,
                         s->peer, tc->peer_addr,
                         n == 0 ? "closed by the peer (it died or disconnected)" : strerror(errno));
    return -1;
}

static ssize_t tcp_io_writev(hccl_framer_t *s, const struct iovec *iov, int iovcnt)
{
    tcp_conn_t *tc = s->transport;
    struct msghdr msg = {.msg_iov = (struct iovec *)(uintptr_t)iov, .msg_iovlen = (size_t)iovcnt};
    ssize_t n = sendmsg(tc->fd, &msg, MSG_NOSIGNAL);

    if (n >= 0)
        return n;
    if (errno == EAGAIN || errno == EINTR)
        return 0;
    s->wire_broken = true;
    hccl_error_set_quiet(hcclRemoteError, "rank %d: tcp send to rank %d (%s) failed: %s", s->rank,
                         s->peer, tc->peer_addr, strerror(errno));
    return -1;
}

static void tcp_io_on_cause(hccl_framer_t *s, const hccl_cause_t *c)
{
    tcp_conn_t *tc = s->transport;
    hccl_link_env_t *env = tc->ctx->env;

    if (env->on_cause)
        env->on_cause(env->fatal_arg, c);
}

static const hccl_framer_io_t tcp_io = {
    .read = tcp_io_read,
    .writev = tcp_io_writev,
    .on_cause = tcp_io_on_cause,
};

/* The connection is broken: fail its transfers here, and the communicator everywhere. */
static void tcp_conn_fail(tcp_conn_t *tc, hcclResult_t res)
{
    hccl_link_env_t *env = tc->ctx->env;
    char msg[512];

    if (tc->framer.failed)
        return;
    snprintf(msg, sizeof(msg), "%s", hccl_error_last());
    /* Its process died or the cable was cut: the peer is the origin, whoever sees it. */
    if (tc->framer.wire_broken && !tc->framer.peer_caused && env->on_cause) {
        hccl_cause_t c;
        hccl_cause_lost(&c, tc->framer.peer, env->rank, env->nranks);
        env->on_cause(env->fatal_arg, &c);
    }
    hccl_framer_fail(&tc->framer, res);
    hccl_tcp_conn_close(tc);
    env->on_fatal(env->fatal_arg, res, msg);
}

static void tcp_on_readable(tcp_conn_t *tc);
static void tcp_on_writable(tcp_conn_t *tc);

/* Another pass over the connections with bytes read ahead: by the poller, else by the loop. */
static void tcp_come_back(tcp_ctx_t *ctx)
{
    static const struct timeval now = {0, 0};

    ctx->more = true;
    /* A zero timeout, not event_active: libevent runs an event activated by its own callback
     * in the same turn, and this one may have to wait for the posts of that turn. */
    if (!ctx->polling)
        evtimer_add(ctx->ev_more, &now);
}

/* The connections with bytes read ahead; true if there were any. */
static bool tcp_read_ahead(tcp_ctx_t *ctx)
{
    bool any = false;

    if (!ctx->more)
        return false;
    ctx->more = false;
    for (int r = 0; r < ctx->env->nranks; r++) {
        tcp_conn_t *tc = ctx->conns[r];
        if (tc && tc->fd >= 0 && tc->ra_pos < tc->ra_len) {
            tcp_on_readable(tc);
            any = true;
        }
    }
    return any;
}

static void tcp_on_more(evutil_socket_t fd, short what, void *arg)
{
    tcp_ctx_t *ctx = arg;
    hccl_reactor_t *r = ctx->env->reactor;

    (void)fd, (void)what;
    hccl_reactor_enter(r);
    tcp_read_ahead(ctx);
    hccl_reactor_leave(r);
}

/* What the epoll sets watch on tc's socket. */
static uint32_t tcp_interest(const tcp_conn_t *tc)
{
    return EPOLLIN | (tc->write_armed ? EPOLLOUT : 0u);
}

static int tcp_epoll_ctl_raw(tcp_conn_t *tc, int epfd, int op, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = tc};

    return epoll_ctl(epfd, op, tc->fd, &ev);
}

/* epoll_ctl on one of our sets; a failure fails the connection (an unwatched socket hangs). */
static bool tcp_epoll_ctl(tcp_conn_t *tc, int epfd, int op, uint32_t events)
{
    if (tcp_epoll_ctl_raw(tc, epfd, op, events) == 0)
        return true;
    hccl_error_set_quiet(hcclSystemError, "rank %d: tcp connection to rank %d (%s): epoll_ctl: %s",
                         tc->ctx->env->rank, tc->conn.peer, tc->peer_addr, strerror(errno));
    tcp_conn_fail(tc, hcclSystemError);
    return false;
}

/* What the set the progress thread sleeps on watches: everything, or only the peer's end. */
static void tcp_sleep_set_watch(tcp_conn_t *tc, bool full)
{
    if (tc->fd < 0 || full == tc->sleep_full)
        return;
    if (tcp_epoll_ctl(tc, tc->ctx->sleep_epfd, EPOLL_CTL_MOD, full ? tcp_interest(tc) : EPOLLRDHUP))
        tc->sleep_full = full;
}

static void tcp_update_write_interest(tcp_conn_t *tc)
{
    bool want = hccl_framer_tx_pending(&tc->framer);

    if (tc->fd < 0 || want == tc->write_armed)
        return;
    tc->write_armed = want;
    if (!tcp_epoll_ctl(tc, tc->ctx->poll_epfd, EPOLL_CTL_MOD, tcp_interest(tc)))
        return;
    if (tc->sleep_full)
        tcp_epoll_ctl(tc, tc->ctx->sleep_epfd, EPOLL_CTL_MOD, tcp_interest(tc));
}

#define TCP_EVENTS_PER_LOOK 64

/* Handles what one of the sets reports, without waiting; true if it reported anything. */
static bool tcp_look(int epfd)
{
    struct epoll_event evs[TCP_EVENTS_PER_LOOK];
    int n = epoll_wait(epfd, evs, TCP_EVENTS_PER_LOOK, 0);

    for (int i = 0; i < n; i++) {
        tcp_conn_t *tc = evs[i].data.ptr;
        /* A connection closed by an earlier event of this batch keeps its struct until fini. */
        if (tc->fd >= 0 && (evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
            tcp_on_readable(tc);
        if (tc->fd >= 0 && (evs[i].events & EPOLLOUT))
            tcp_on_writable(tc);
    }
    return n > 0;
}

static void tcp_on_sleep_set(evutil_socket_t fd, short what, void *arg)
{
    tcp_ctx_t *ctx = arg;
    hccl_reactor_t *r = ctx->env->reactor;

    (void)fd, (void)what;
    hccl_reactor_enter(r);
    tcp_look(ctx->sleep_epfd);
    hccl_reactor_leave(r);
}

/* The reactor's poller: under its lock, on the thread that drives it. */
static bool tcp_poll(void *arg)
{
    tcp_ctx_t *ctx = arg;
    bool moved = tcp_read_ahead(ctx);

    return tcp_look(ctx->poll_epfd) || moved;
}

static void tcp_set_polling(void *arg, bool on)
{
    tcp_ctx_t *ctx = arg;

    /* What came while nobody polled goes first, before the poller's thread runs new posts: a
     * peer's end (its failure frame) must fail the communicator before a late call can match
     * the message the peer sent ahead of it. */
    if (on)
        tcp_look(ctx->sleep_epfd);
    ctx->polling = on;
    for (int r = 0; r < ctx->env->nranks; r++)
        if (ctx->conns[r])
            tcp_sleep_set_watch(ctx->conns[r], !on);
    if (!on && ctx->more)
        tcp_come_back(ctx); /* the poller left bytes read ahead: the loop takes over */
}

static void tcp_on_readable(tcp_conn_t *tc)
{
    hcclResult_t res;

    tc->ra_drained = false;
    res = hccl_framer_rx(&tc->framer, TCP_RX_BUDGET);
    if (hccl_is_failure(res) && hccl_framer_closed_cleanly(&tc->framer)) {
        /* The peer said goodbye first: its EOF ends the connection, not the communicator. */
        HCCL_INFO(HCCL_SUB_LINK, "rank %d: rank %d closed its tcp connection", tc->ctx->env->rank,
                  tc->conn.peer);
        hccl_tcp_conn_close(tc);
        return;
    }
    if (hccl_is_failure(res)) {
        tcp_conn_fail(tc, res);
        return;
    }
    tcp_update_write_interest(tc); /* receiving may have queued control frames */
    /* The pass stopped (budget, a parked message) with bytes read ahead: the socket may not
     * say readable again for them. */
    if (tc->ra_pos < tc->ra_len)
        tcp_come_back(tc->ctx);
}

static void tcp_on_writable(tcp_conn_t *tc)
{
    hcclResult_t res;

    res = hccl_framer_tx(&tc->framer);
    if (hccl_is_failure(res)) {
        tcp_conn_fail(tc, res);
        return;
    }
    tcp_update_write_interest(tc);
}

void hccl_tcp_conn_close(tcp_conn_t *tc)
{
    tc->ra_pos = tc->ra_len = 0;
    /* close() takes the socket out of both epoll sets (no other descriptor of it exists). */
    tc->write_armed = false;
    tc->sleep_full = false;
    if (tc->fd >= 0)
        close(tc->fd);
    tc->fd = -1;
}

static hcclResult_t tcp_init(hccl_link_env_t *env, void *blob, void **ctx_p)
{
    tcp_ctx_t *ctx = hccl_calloc(1, sizeof(*ctx));
    tcp_card_t *card = blob;
    hcclResult_t res;

    if (!ctx)
        return HCCL_FAIL(hcclSystemError, "tcp: out of memory");
    ctx->env = env;
    ctx->listen_fd = -1;
    ctx->sleep_epfd = ctx->poll_epfd = -1;
    ctx->conns = hccl_calloc((size_t)env->nranks, sizeof(*ctx->conns));
    if (!ctx->conns) {
        res = HCCL_FAIL(hcclSystemError, "tcp: out of memory");
        goto err_free;
    }
    HCCL_CHECK_GOTO(hccl_socket_pick_addr(env->params->ifname, &ctx->addr), res, err_free);
    HCCL_CHECK_GOTO(hccl_socket_listen(&ctx->addr, &ctx->listen_fd), res, err_free);
    memset(card, 0, sizeof(*card));
    card->family = ctx->addr.sa.sa_family;
    if (card->family == AF_INET6) {
        card->port = ctx->addr.in6.sin6_port;
        memcpy(card->addr, &ctx->addr.in6.sin6_addr, 16);
    } else {
        card->port = ctx->addr.in4.sin_port;
        memcpy(card->addr, &ctx->addr.in4.sin_addr, 4);
    }
    *ctx_p = ctx;
    return hcclSuccess;

err_free:
    hccl_free(ctx->conns);
    hccl_free(ctx);
    return res;
}

static bool tcp_reaches(const hccl_card_t *me, const hccl_card_t *peer)
{
    (void)me, (void)peer;
    return true;
}

static hcclResult_t tcp_connect(void *vctx, const int *peers, int npeers, int64_t deadline_ms,
                                hccl_conn_t **conns)
{
    tcp_ctx_t *ctx = vctx;
    hccl_link_env_t *env = ctx->env;
    struct event_base *base = hccl_reactor_base(env->reactor);

    HCCL_CHECK(hccl_tcp_connect_all(ctx, peers, npeers, deadline_ms));
    if (npeers == 0)
        return hcclSuccess;
    ctx->sleep_epfd = epoll_create1(EPOLL_CLOEXEC);
    ctx->poll_epfd = epoll_create1(EPOLL_CLOEXEC);
    if (ctx->sleep_epfd < 0 || ctx->poll_epfd < 0)
        return HCCL_FAIL(hcclSystemError, "tcp: epoll_create1: %s", strerror(errno));
    for (int i = 0; i < npeers; i++) {
        tcp_conn_t *tc = ctx->conns[peers[i]];
        tc->conn.ops = &hccl_link_tcp_ops;
        tc->conn.ctx = ctx;
        tc->conn.peer = peers[i];
        tc->conn.priv = tc;
        hccl_framer_init(&tc->framer, &tcp_io, env->reactor, tc, env->rank, peers[i], SIZE_MAX);
        tc->framer.nranks = env->nranks;
        tc->framer.comm_id = env->comm_id;
        tc->framer.activity = &tc->conn.activity;
        tc->framer.park_unmatched = true; /* level-triggered epoll: the socket stays readable */
        tc->framer.eager_cap = env->params->buffsize; /* held data per peer: frame.h */
        /* Large messages are offered (RTS) and sent when the receiver asks (PULL): they land in
         * the receive's buffer instead of a heap copy when the sender runs ahead. */
        tc->framer.rndv_threshold = env->params->tcp_offer_min;
        tc->framer.pull_max = SIZE_MAX;
        tc->ra = hccl_malloc(TCP_READAHEAD);
        if (!tc->ra)
            return HCCL_FAIL(hcclSystemError, "tcp: out of memory");
        if (tcp_epoll_ctl_raw(tc, ctx->poll_epfd, EPOLL_CTL_ADD, tcp_interest(tc)) != 0 ||
            tcp_epoll_ctl_raw(tc, ctx->sleep_epfd, EPOLL_CTL_ADD, tcp_interest(tc)) != 0)
            return HCCL_FAIL(hcclSystemError, "tcp: epoll_ctl for the socket to rank %d: %s", peers[i],
                             strerror(errno));
        tc->sleep_full = true;
        conns[peers[i]] = &tc->conn;
    }
    ctx->ev_sleep = event_new(base, ctx->sleep_epfd, EV_READ | EV_PERSIST, tcp_on_sleep_set, ctx);
    ctx->ev_more = evtimer_new(base, tcp_on_more, ctx);
    if (!ctx->ev_sleep || !ctx->ev_more || event_add(ctx->ev_sleep, NULL) != 0)
        return HCCL_FAIL(hcclSystemError, "tcp: cannot register the sockets in the reactor");
    /* A waiter may then read the sockets itself (see tcp_ctx_t). */
    HCCL_CHECK(hccl_reactor_add_poller(env->reactor, &(hccl_poller_t){tcp_poll, tcp_set_polling, ctx}));
    /* Every expected peer is in: nobody else may connect. */
    close(ctx->listen_fd);
    ctx->listen_fd = -1;
    return hcclSuccess;
}

static hcclResult_t tcp_post_send(hccl_conn_t *c, hccl_xfer_t *x)
{
    tcp_conn_t *tc = c->priv;
    hcclResult_t res = hccl_framer_post_send(&tc->framer, x);

    if (hccl_is_failure(res)) {
        tcp_conn_fail(tc, res);
        return hcclSuccess; /* x was failed with the connection */
    }
    tcp_update_write_interest(tc);
    return hcclSuccess;
}

static hcclResult_t tcp_post_recv(hccl_conn_t *c, hccl_xfer_t *x)
{
    tcp_conn_t *tc = c->priv;
    hcclResult_t res = hccl_framer_post_recv(&tc->framer, x);

    if (hccl_is_failure(res)) {
        tcp_conn_fail(tc, res);
        return hcclSuccess; /* x was failed by the framer */
    }
    tcp_update_write_interest(tc);
    return hcclSuccess;
}

static void tcp_abort(void *vctx, hcclResult_t res)
{
    tcp_ctx_t *ctx = vctx;

    for (int r = 0; r < ctx->env->nranks; r++) {
        tcp_conn_t *tc = ctx->conns[r];
        if (!tc)
            continue;
        if (tc->fd >= 0)
            hccl_framer_send_failure(&tc->framer, res, ctx->env->cause);
        hccl_framer_fail(&tc->framer, res);
        hccl_tcp_conn_close(tc);
    }
}

static void tcp_notify(void *vctx, const hccl_cause_t *c)
{
    tcp_ctx_t *ctx = vctx;

    for (int r = 0; r < ctx->env->nranks; r++) {
        tcp_conn_t *tc = ctx->conns[r];
        hcclResult_t res;
        if (!tc || tc->fd < 0 || tc->framer.failed)
            continue;
        res = hccl_framer_send_cause(&tc->framer, c);
        if (hccl_is_failure(res))
            tcp_conn_fail(tc, res);
        else
            tcp_update_write_interest(tc);
    }
}

static void tcp_close_peer(void *vctx, int peer)
{
    tcp_ctx_t *ctx = vctx;
    tcp_conn_t *tc = ctx->conns[peer];

    if (!tc || tc->fd < 0 || tc->framer.failed)
        return;
    hccl_error_set_quiet(hcclRemoteError, "rank %d: tcp connection to rank %d (%s) was cut "
                         "(HCCL_FAULT close)", ctx->env->rank, peer, tc->peer_addr);
    tcp_conn_fail(tc, hcclRemoteError);
}

static void tcp_shutdown(void *vctx, int64_t deadline_ms)
{
    tcp_ctx_t *ctx = vctx;

    for (int r = 0; r < ctx->env->nranks; r++) {
        tcp_conn_t *tc = ctx->conns[r];
        if (!tc || tc->fd < 0 || tc->framer.failed)
            continue;
        hccl_framer_send_bye(&tc->framer);
        /* Bounded: a peer that stopped reading must not hold our destroy. */
        while (hccl_framer_tx(&tc->framer) == hcclInProgress) {
            struct pollfd p = {.fd = tc->fd, .events = POLLOUT};
            int64_t left = deadline_ms - hccl_now_ms();
            if (left <= 0 || poll(&p, 1, (int)left) <= 0)
                break;
        }
        /* The answer to our ASK is read before we close: a socket closed with unread bytes
         * is reset, which can drop what the peer has not read yet (frame.h, eager_cap). */
        while (tc->framer.tx_asking && !tc->framer.failed && !tc->framer.peer_bye) {
            struct pollfd p = {.fd = tc->fd, .events = POLLIN};
            int64_t left = deadline_ms - hccl_now_ms();
            if (left <= 0 || poll(&p, 1, (int)left) <= 0 ||
                hccl_is_failure(hccl_framer_rx(&tc->framer, TCP_RX_BUDGET)))
                break;
        }
    }
}

static void tcp_fini(void *vctx)
{
    tcp_ctx_t *ctx = vctx;

    if (!ctx)
        return;
    for (int r = 0; ctx->conns && r < ctx->env->nranks; r++) {
        tcp_conn_t *tc = ctx->conns[r];
        if (!tc)
            continue;
        hccl_framer_fail(&tc->framer, hcclAborted);
        hccl_tcp_conn_close(tc);
        hccl_framer_fini(&tc->framer);
        hccl_free(tc->ra);
        hccl_free(tc);
    }
    if (ctx->ev_sleep)
        event_free(ctx->ev_sleep);
    if (ctx->ev_more)
        event_free(ctx->ev_more);
    if (ctx->sleep_epfd >= 0)
        close(ctx->sleep_epfd);
    if (ctx->poll_epfd >= 0)
        close(ctx->poll_epfd);
    if (ctx->listen_fd >= 0)
        close(ctx->listen_fd);
    hccl_free(ctx->conns);
    hccl_free(ctx);
}

const hccl_link_ops_t hccl_link_tcp_ops = {
    .size = sizeof(hccl_link_ops_t),
    .name = "tcp",
    .id = HCCL_LINK_TCP,
    .init = tcp_init,
    .reaches = tcp_reaches,
    .connect = tcp_connect,
    .post_send = tcp_post_send,
    .post_recv = tcp_post_recv,
    .abort = tcp_abort,
    .shutdown = tcp_shutdown,
    .fini = tcp_fini,
    .close = tcp_close_peer,
    .recv_consume = true,
    .notify = tcp_notify,
};
