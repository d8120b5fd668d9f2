/* tcp: ranks on other hosts, non-blocking sockets in the reactor. */
#ifndef HCCL_LINK_TCP_H
#define HCCL_LINK_TCP_H

#include <event2/event.h>

#include "links/frame.h"

/* What a rank publishes in its card. */
typedef struct {
    uint16_t family;
    uint16_t port;          /* network order */
    uint8_t addr[16];
} tcp_card_t;

/* The handshake a connecting rank sends, and the answer. */
typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t reserved;
    uint64_t comm_id;
    uint8_t secret[HCCL_SECRET_BYTES];
    uint32_t rank;
    uint32_t peer;          /* the rank it wants to reach */
} tcp_hello_t;

#define TCP_HELLO_MAGIC 0x4f4c4548u /* "HELO" */

/* A hello read from an accepted socket: NULL if it may be trusted, else why not. */
const char *hccl_tcp_hello_check(const tcp_hello_t *h, uint64_t comm_id, const uint8_t *secret, int rank,
                                 int nranks);
/* A peer's card from the rank table: NULL if usable, else why not. */
const char *hccl_tcp_card_check(const tcp_card_t *card);

typedef struct tcp_conn {
    hccl_conn_t conn;       /* conn.priv points back here */
    struct tcp_ctx *ctx;    /* borrowed */
    int fd;
    bool write_armed;       /* the framer has bytes to send: watch for room */
    bool sleep_full;        /* sleep_epfd watches all its events, not only the peer's end */
    /*
     * Read-ahead: a short read (a frame header) takes whatever the socket holds, up to
     * TCP_READAHEAD bytes, so that a small message costs one recv, not three (header, payload,
     * and the one that finds the socket empty: a recv shorter than asked says that already).
     */
    char *ra;               /* owned, TCP_READAHEAD bytes */
    size_t ra_pos, ra_len;  /* unread bytes are ra[ra_pos, ra_len) */
    bool ra_drained;        /* the last recv found the socket empty: this pass reads no more */
    hccl_framer_t framer;
    char peer_addr[64];
} tcp_conn_t;

/*
 * The sockets are watched through two epoll sets of our own. The reactor's loop sleeps on
 * sleep_epfd (one event in libevent); a thread that polls (a waiter driving its collective, or
 * the spinning progress thread) reads poll_epfd without waiting. Meanwhile sleep_epfd watches
 * only for a peer's end (EPOLLRDHUP, errors), so that a frame the poller picks up itself does
 * not also wake the sleeping progress thread, while a peer that dies is still noticed at once,
 * even when nobody polls. Doing that through libevent would wake the loop on every change.
 */
typedef struct tcp_ctx {
    hccl_link_env_t *env;   /* borrowed */
    int listen_fd;
    hccl_sockaddr_t addr;
    tcp_conn_t **conns;     /* [nranks], owned */
    int sleep_epfd;
    int poll_epfd;
    struct event *ev_sleep;
    struct event *ev_more;  /* a pass ended with bytes read ahead: the next one runs soon */
    bool more;              /* the same, for the thread that polls */
    bool polling;
} tcp_ctx_t;

hcclResult_t hccl_tcp_connect_all(tcp_ctx_t *ctx, const int *peers, int npeers, int64_t deadline_ms);
void hccl_tcp_conn_close(tcp_conn_t *tc);

#endif
