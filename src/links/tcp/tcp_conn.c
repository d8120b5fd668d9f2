/*
 * tcp connection set-up: the higher rank connects to the lower one and
 * presents the communicator id and secret; the lower one checks both
 * (in constant time) before trusting the socket. Blocking with a deadline,
 * in the initialising thread, before the reactor runs.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "links/tcp/tcp.h"

const char *hccl_tcp_hello_check(const tcp_hello_t *h, uint64_t comm_id, const uint8_t *secret, int rank,
                                 int nranks)
{
    /* The secret is compared whatever else is wrong, so that timing tells nothing about it. */
    bool secret_ok = hccl_secret_equal(h->secret, secret, HCCL_SECRET_BYTES);

    if (h->magic != TCP_HELLO_MAGIC || h->version != HCCL_WIRE_VERSION)
        return "not an hccl tcp hello of this version";
    if (h->comm_id != comm_id || !secret_ok)
        return "wrong communicator or secret";
    if (h->peer != (uint32_t)rank)
        return "it wants another rank";
    if (h->rank >= (uint32_t)nranks || h->rank == (uint32_t)rank)
        return "its rank is out of range";
    return NULL;
}

const char *hccl_tcp_card_check(const tcp_card_t *card)
{
    if (card->family != AF_INET && card->family != AF_INET6)
        return "unknown address family";
    if (card->port == 0)
        return "no port";
    return NULL;
}

static void card_to_addr(const tcp_card_t *card, hccl_sockaddr_t *addr)
{
    memset(addr, 0, sizeof(*addr));
    if (card->family == AF_INET6) {
        addr->in6.sin6_family = AF_INET6;
        addr->in6.sin6_port = card->port;
        memcpy(&addr->in6.sin6_addr, card->addr, 16);
    } else {
        addr->in4.sin_family = AF_INET;
        addr->in4.sin_port = card->port;
        memcpy(&addr->in4.sin_addr, card->addr, 4);
    }
}

static hcclResult_t tcp_new_conn(tcp_ctx_t *ctx, int peer, int fd, const hccl_sockaddr_t *addr)
{
    tcp_conn_t *tc = hccl_calloc(1, sizeof(*tc));
    int one = 1;

    if (!tc)
        return HCCL_FAIL(hcclSystemError, "tcp: out of memory");
    tc->fd = fd;
    tc->ctx = ctx;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    hccl_socket_addr_str(addr, tc->peer_addr, sizeof(tc->peer_addr));
    ctx->conns[peer] = tc;
    HCCL_INFO(HCCL_SUB_LINK, "rank %d: tcp connection to rank %d (%s) is up", ctx->env->rank, peer,
              tc->peer_addr);
    return hcclSuccess;
}

static hcclResult_t tcp_connect_to(tcp_ctx_t *ctx, int peer, int64_t deadline_ms)
{
    hccl_link_env_t *env = ctx->env;
    hccl_sockaddr_t addr;
    tcp_hello_t hello = {.magic = TCP_HELLO_MAGIC, .version = HCCL_WIRE_VERSION,
                         .comm_id = env->comm_id, .rank = (uint32_t)env->rank, .peer = (uint32_t)peer};
    const tcp_card_t *card = (const tcp_card_t *)env->cards[peer].blob[HCCL_LINK_TCP];
    const char *why = hccl_tcp_card_check(card);
    uint32_t ack = 0;
    hcclResult_t res;
    char buf[64];
    int fd;

    if (why)
        return HCCL_FAIL(hcclRemoteError, "rank %d: tcp: rank %d's card is malformed: %s", env->rank, peer,
                         why);
    card_to_addr(card, &addr);
    memcpy(hello.secret, env->secret, sizeof(hello.secret));
    HCCL_CHECK(hccl_socket_connect_watch(&addr, deadline_ms, env->setup_watch_fd, &fd));
    HCCL_CHECK_GOTO(hccl_socket_send_all(fd, &hello, sizeof(hello), deadline_ms), res, err_close);
    res = hccl_socket_recv_all(fd, &ack, sizeof(ack), deadline_ms);
    if (res != hcclSuccess || ack != TCP_HELLO_MAGIC) {
        res = HCCL_FAIL(res == hcclTimeout ? hcclTimeout : hcclRemoteError,
                        "rank %d: tcp handshake with rank %d at %s failed: %s", env->rank, peer,
                        hccl_socket_addr_str(&addr, buf, sizeof(buf)),
                        res == hcclSuccess ? "refused" : hccl_error_last());
        goto err_close;
    }
    HCCL_CHECK_GOTO(tcp_new_conn(ctx, peer, fd, &addr), res, err_close);
    return hcclSuccess;

err_close:
    close(fd);
    return res;
}

/* Reads and checks one hello; a stranger is closed and logged, never trusted. */
static hcclResult_t tcp_accept_one(tcp_ctx_t *ctx, const bool *expect, int64_t deadline_ms,
                                   int *got_p)
{
    hccl_link_env_t *env = ctx->env;
    hccl_sockaddr_t addr;
    socklen_t alen = sizeof(addr);
    tcp_hello_t hello;
    const char *why;
    uint32_t ack = TCP_HELLO_MAGIC;
    int64_t hello_deadline = hccl_now_ms() + 5000;
    char buf[64];
    int fd = accept4(ctx->listen_fd, &addr.sa, &alen, SOCK_NONBLOCK | SOCK_CLOEXEC);

    *got_p = -1;
    if (fd < 0)
        return (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)
                   ? hcclSuccess
                   : HCCL_FAIL(hcclSystemError, "tcp: accept: %s", strerror(errno));
    hccl_socket_addr_str(&addr, buf, sizeof(buf));
    if (hccl_socket_recv_all(fd, &hello, sizeof(hello),
                             hello_deadline < deadline_ms ? hello_deadline : deadline_ms) != hcclSuccess)
        why = "no complete hello in time";
    else if (!(why = hccl_tcp_hello_check(&hello, env->comm_id, env->secret, env->rank, env->nranks)) &&
             (!expect[hello.rank] || ctx->conns[hello.rank]))
        why = "a rank that is not expected to connect here, or already did";
    if (why) {
        HCCL_WARN("rank %d: tcp: rejected a connection from %s: %s", env->rank, buf, why);
        close(fd);
        return hcclSuccess;
    }
    if (hccl_socket_send_all(fd, &ack, sizeof(ack), deadline_ms) != hcclSuccess) {
        close(fd);
        return hcclSuccess;
    }
    HCCL_CHECK(tcp_new_conn(ctx, (int)hello.rank, fd, &addr));
    *got_p = (int)hello.rank;
    return hcclSuccess;
}

hcclResult_t hccl_tcp_connect_all(tcp_ctx_t *ctx, const int *peers, int npeers, int64_t deadline_ms)
{
    hccl_link_env_t *env = ctx->env;
    bool *expect = hccl_calloc((size_t)env->nranks, sizeof(*expect));
    hcclResult_t res = hcclSuccess;
    int waiting = 0;

    if (!expect)
        return HCCL_FAIL(hcclSystemError, "tcp: out of memory");
    /* Connect down, then accept from above: by induction on the rank nobody waits in a cycle. */
    for (int i = 0; i < npeers; i++) {
        if (peers[i] < env->rank)
            HCCL_CHECK_GOTO(tcp_connect_to(ctx, peers[i], deadline_ms), res, out);
        else {
            expect[peers[i]] = true;
            waiting++;
        }
    }
    while (waiting > 0) {
        /* [1]: the rendezvous calling the set-up off (another rank failed). */
        struct pollfd p[2] = {{.fd = ctx->listen_fd, .events = POLLIN},
                              {.fd = env->setup_watch_fd, .events = POLLIN}};
        int64_t left = deadline_ms - hccl_now_ms();
        int got;

        if (left <= 0) {
            char missing[256] = "";
            size_t o = 0;
            for (int r = 0; r < env->nranks && o < sizeof(missing) - 12; r++)
                if (expect[r] && !ctx->conns[r])
                    o += (size_t)snprintf(missing + o, sizeof(missing) - o, "%s%d", o ? "," : "", r);
            res = HCCL_FAIL(hcclTimeout, "rank %d: tcp: ranks %s did not connect before the connect "
                                         "timeout", env->rank, missing);
            goto out;
        }
        if (poll(p, 2, left > 1000 ? 1000 : (int)left) <= 0)
            continue;
        if (p[1].revents) {
            res = hccl_link_setup_called_off(env, "tcp");
            goto out;
        }
        HCCL_CHECK_GOTO(tcp_accept_one(ctx, expect, deadline_ms, &got), res, out);
        if (got >= 0)
            waiting--;
    }
out:
    hccl_free(expect);
    return res;
}
