/* tcp: ranks on other hosts, non-blocking sockets in the reactor. */
#ifndef HCCL_LINK_TCP_H
#define HCCL_LINK_TCP_H

#include <event2/event.h>

#include "links/stream.h"

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
    struct event *ev_read;
    struct event *ev_write;
    bool write_armed;
    hccl_stream_t stream;
    char peer_addr[64];
} tcp_conn_t;

typedef struct tcp_ctx {
    hccl_link_env_t *env;   /* borrowed */
    int listen_fd;
    hccl_sockaddr_t addr;
    tcp_conn_t **conns;     /* [nranks], owned */
} tcp_ctx_t;

hcclResult_t hccl_tcp_connect_all(tcp_ctx_t *ctx, const int *peers, int npeers, int64_t deadline_ms);
void hccl_tcp_conn_close(tcp_conn_t *tc);

#endif
