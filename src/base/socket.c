/* Socket helpers for bootstrap and link set-up (blocking with deadlines, off the reactor). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "base/base.h"

socklen_t hccl_socket_addr_len(const hccl_sockaddr_t *addr)
{
    return addr->sa.sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

const char *hccl_socket_addr_str(const hccl_sockaddr_t *addr, char *buf, size_t len)
{
    char host[INET6_ADDRSTRLEN] = "?";

    if (addr->sa.sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &addr->in6.sin6_addr, host, sizeof(host));
        snprintf(buf, len, "[%s]:%u", host, ntohs(addr->in6.sin6_port));
    } else {
        inet_ntop(AF_INET, &addr->in4.sin_addr, host, sizeof(host));
        snprintf(buf, len, "%s:%u", host, ntohs(addr->in4.sin_port));
    }
    return buf;
}

/* Interfaces named ifname or starting with it ("" = any); loopback only when asked for or last. */
hcclResult_t hccl_socket_pick_addr(const char *ifname, hccl_sockaddr_t *addr)
{
    struct ifaddrs *list, *lo = NULL, *pick = NULL;
    bool want = ifname && *ifname;
    bool exact = want && ifname[0] == '=';
    const char *name = exact ? ifname + 1 : ifname;

    if (getifaddrs(&list) != 0)
        return HCCL_FAIL(hcclSystemError, "getifaddrs: %s", strerror(errno));
    for (struct ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next) {
        if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != AF_INET || !(ifa->ifa_flags & IFF_UP))
            continue;
        if (want) {
            bool match = exact ? strcmp(ifa->ifa_name, name) == 0
                               : strncmp(ifa->ifa_name, name, strlen(name)) == 0;
            if (match && !pick)
                pick = ifa;
        } else if (ifa->ifa_flags & IFF_LOOPBACK) {
            if (!lo)
                lo = ifa;
        } else if (!pick) {
            pick = ifa;
        }
    }
    if (!pick)
        pick = want ? NULL : lo;
    if (!pick) {
        freeifaddrs(list);
        return HCCL_FAIL(hcclInvalidUsage, "no IPv4 interface that is up matches HCCL_SOCKET_IFNAME=%s",
                         want ? ifname : "(any)");
    }
    memset(addr, 0, sizeof(*addr));
    memcpy(&addr->in4, pick->ifa_addr, sizeof(struct sockaddr_in));
    addr->in4.sin_port = 0;
    HCCL_INFO(HCCL_SUB_INIT, "using interface %s", pick->ifa_name);
    freeifaddrs(list);
    return hcclSuccess;
}

hcclResult_t hccl_socket_parse_addr(const char *text, hccl_sockaddr_t *addr)
{
    char host[256];
    const char *colon, *port_s;
    struct addrinfo hints, *res = NULL;
    size_t hlen;
    char *end;
    long port;
    int rc;

    if (!text || !*text)
        return HCCL_FAIL(hcclInvalidArgument, "empty address (want host:port)");
    if (text[0] == '[') {
        const char *close_br = strchr(text, ']');
        if (!close_br || close_br[1] != ':')
            return HCCL_FAIL(hcclInvalidArgument, "address '%s' is not [ipv6]:port", text);
        hlen = (size_t)(close_br - text - 1);
        if (hlen >= sizeof(host))
            return HCCL_FAIL(hcclInvalidArgument, "address '%s' is too long", text);
        memcpy(host, text + 1, hlen);
        port_s = close_br + 2;
    } else {
        colon = strrchr(text, ':');
        if (!colon)
            return HCCL_FAIL(hcclInvalidArgument, "address '%s' has no port (want host:port)", text);
        hlen = (size_t)(colon - text);
        if (hlen >= sizeof(host))
            return HCCL_FAIL(hcclInvalidArgument, "address '%s' is too long", text);
        memcpy(host, text, hlen);
        port_s = colon + 1;
    }
    host[hlen] = '\0';
    errno = 0;
    port = strtol(port_s, &end, 10);
    if (errno || *end || port <= 0 || port > 65535)
        return HCCL_FAIL(hcclInvalidArgument, "address '%s': bad port '%s'", text, port_s);
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res)
        return HCCL_FAIL(hcclInvalidArgument, "address '%s': cannot resolve '%s': %s", text, host,
                         gai_strerror(rc));
    memset(addr, 0, sizeof(*addr));
    memcpy(addr, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (addr->sa.sa_family == AF_INET6)
        addr->in6.sin6_port = htons((uint16_t)port);
    else
        addr->in4.sin_port = htons((uint16_t)port);
    return hcclSuccess;
}

hcclResult_t hccl_socket_listen(hccl_sockaddr_t *addr, int *fd_p)
{
    hcclResult_t res;
    socklen_t len = hccl_socket_addr_len(addr);
    int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    char buf[64];

    if (fd < 0)
        return HCCL_FAIL(hcclSystemError, "socket(): %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, &addr->sa, len) != 0 || listen(fd, SOMAXCONN) != 0) {
        res = HCCL_FAIL(hcclSystemError, "bind/listen on %s: %s",
                        hccl_socket_addr_str(addr, buf, sizeof(buf)), strerror(errno));
        goto err_close_fd;
    }
    if (getsockname(fd, &addr->sa, &len) != 0) {
        res = HCCL_FAIL(hcclSystemError, "getsockname: %s", strerror(errno));
        goto err_close_fd;
    }
    *fd_p = fd;
    return hcclSuccess;

err_close_fd:
    close(fd);
    return res;
}

static int wait_fd(int fd, short events, int64_t deadline_ms)
{
    struct pollfd p = {.fd = fd, .events = events};

    for (;;) {
        int64_t left = deadline_ms - hccl_now_ms();
        int rc;
        if (left <= 0)
            return 0;
        rc = poll(&p, 1, left > 1000 ? 1000 : (int)left);
        if (rc > 0)
            return 1;
        if (rc < 0 && errno != EINTR)
            return -1;
    }
}

/* Waits ms (bounded by deadline_ms) for watch_fd to become readable: whether it did. poll
 * ignores a -1 and just sleeps. */
static bool watch_wait(int watch_fd, int ms, int64_t deadline_ms)
{
    struct pollfd p = {.fd = watch_fd, .events = POLLIN};
    int64_t left = deadline_ms - hccl_now_ms();

    if (left < ms)
        ms = left > 0 ? (int)left : 0;
    return poll(&p, 1, ms) > 0;
}

bool hccl_socket_connected_to_itself(int fd)
{
    hccl_sockaddr_t me, peer;
    socklen_t ml = sizeof(me), pl = sizeof(peer);

    if (getsockname(fd, &me.sa, &ml) != 0 || getpeername(fd, &peer.sa, &pl) != 0 ||
        me.sa.sa_family != peer.sa.sa_family)
        return false;
    if (me.sa.sa_family == AF_INET)
        return me.in4.sin_port == peer.in4.sin_port &&
               me.in4.sin_addr.s_addr == peer.in4.sin_addr.s_addr;
    if (me.sa.sa_family == AF_INET6)
        return me.in6.sin6_port == peer.in6.sin6_port &&
               memcmp(&me.in6.sin6_addr, &peer.in6.sin6_addr, sizeof(me.in6.sin6_addr)) == 0;
    return false;
}

/*
 * Connects, retrying while nobody listens yet (the peer may start later), until deadline.
 * Where nobody listens on a port of the ephemeral range, one of the retries may get that very
 * port for its own end, and TCP's simultaneous open connects the socket to itself: that is
 * taken as refused, not as the peer.
 */
hcclResult_t hccl_socket_connect_watch(const hccl_sockaddr_t *addr, int64_t deadline_ms,
                                       int watch_fd, int *fd_p)
{
    char buf[64];
    int delay_ms = 1;
    int last_err = ETIMEDOUT;

    do {
        int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        int err = 0;
        socklen_t elen = sizeof(err);

        if (fd < 0)
            return HCCL_FAIL(hcclSystemError, "socket(): %s", strerror(errno));
        if (connect(fd, &addr->sa, hccl_socket_addr_len(addr)) == 0 ||
            (errno == EINPROGRESS && wait_fd(fd, POLLOUT, deadline_ms) == 1 &&
             getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 && err == 0)) {
            int one = 1;
            if (!hccl_socket_connected_to_itself(fd)) {
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                *fd_p = fd;
                return hcclSuccess;
            }
            err = ECONNREFUSED;
        }
        last_err = err ? err : errno;
        close(fd);
        if (last_err != ECONNREFUSED && last_err != EINPROGRESS && last_err != ETIMEDOUT &&
            last_err != ECONNRESET && last_err != EAGAIN)
            break;
        /* The listener is not there yet: back off, bounded, until the deadline. */
        if (watch_wait(watch_fd, delay_ms, deadline_ms))
            return HCCL_FAIL(hcclRemoteError, "connect to %s: called off",
                             hccl_socket_addr_str(addr, buf, sizeof(buf)));
        delay_ms = delay_ms < 100 ? delay_ms * 2 : 100;
    } while (hccl_now_ms() < deadline_ms);
    if (hccl_now_ms() >= deadline_ms)
        return HCCL_FAIL(hcclTimeout, "connect to %s: nobody answered before the connect timeout (%s)",
                         hccl_socket_addr_str(addr, buf, sizeof(buf)), strerror(last_err));
    return HCCL_FAIL(hcclSystemError, "connect to %s: %s", hccl_socket_addr_str(addr, buf, sizeof(buf)),
                     strerror(last_err));
}

hcclResult_t hccl_socket_connect_retry(const hccl_sockaddr_t *addr, int64_t deadline_ms, int *fd_p)
{
    return hccl_socket_connect_watch(addr, deadline_ms, -1, fd_p);
}

hcclResult_t hccl_socket_send_all(int fd, const void *buf, size_t len, int64_t deadline_ms)
{
    const char *p = buf;

    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            int w = wait_fd(fd, POLLOUT, deadline_ms);
            if (w == 0)
                return HCCL_FAIL(hcclTimeout, "send: timed out");
            if (w < 0)
                return HCCL_FAIL(hcclSystemError, "poll: %s", strerror(errno));
        } else {
            return HCCL_FAIL(hcclRemoteError, "send: %s", strerror(errno));
        }
    }
    return hcclSuccess;
}

hcclResult_t hccl_socket_recv_all(int fd, void *buf, size_t len, int64_t deadline_ms)
{
    char *p = buf;

    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n == 0) {
            return hccl_error_set_quiet(hcclRemoteError, "recv: connection closed by the peer");
        } else if (errno == EAGAIN || errno == EINTR) {
            int w = wait_fd(fd, POLLIN, deadline_ms);
            if (w == 0)
                return hccl_error_set_quiet(hcclTimeout, "recv: timed out");
            if (w < 0)
                return HCCL_FAIL(hcclSystemError, "poll: %s", strerror(errno));
        } else {
            return HCCL_FAIL(hcclRemoteError, "recv: %s", strerror(errno));
        }
    }
    return hcclSuccess;
}

bool hccl_secret_equal(const uint8_t *a, const uint8_t *b, size_t len)
{
    volatile uint8_t diff = 0;

    for (size_t i = 0; i < len; i++)
        diff |= a[i] ^ b[i];
    return diff == 0;
}

hcclResult_t hccl_random_bytes(void *buf, size_t len)
{
    char *p = buf;

    while (len > 0) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return HCCL_FAIL(hcclSystemError, "getrandom: %s", strerror(errno));
        }
        p += n;
        len -= (size_t)n;
    }
    return hcclSuccess;
}
