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

#define TCP_HELLO_MAGIC 0x4f4c4548u /* "HELO" */

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
    uint32_t ack = 0;
    hcclResult_t res;
    char buf[64];
    int fd;

    card_to_addr((const tcp_card_t *)env->cards[peer].blob[HCCL_LINK_TCP], &addr);
    memcpy(hello.secret, env->secret, sizeof(hello.secret));
    HCCL_CHECK(hccl_socket_connect_retry(&addr, deadline_ms, &fd));
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
                             hello_deadline < deadline_ms ? hello_deadline : deadline_ms) != hcclSuccess ||
        hello.magic != TCP_HELLO_MAGIC || hello.version != HCCL_WIRE_VERSION ||
        hello.comm_id != env->comm_id || !hccl_secret_equal(hello.secret, env->secret, HCCL_SECRET_BYTES) ||
        hello.peer != (uint32_t)env->rank || hello.rank >= (uint32_t)env->nranks ||
        !expect[hello.rank] || ctx->conns[hello.rank]) {
        HCCL_WARN("rank %d: tcp: rejected a connection from %s: no valid hello for this "
                  "communicator (wrong secret, id or rank)", env->rank, buf);
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
        struct pollfd p = {.fd = ctx->listen_fd, .events = POLLIN};
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
        if (poll(&p, 1, left > 1000 ? 1000 : (int)left) <= 0)
            continue;
        HCCL_CHECK_GOTO(tcp_accept_one(ctx, expect, deadline_ms, &got), res, out);
        if (got >= 0)
            waiting--;
    }
out:
    hccl_free(expect);
    return res;
}
