/*
 * The framing engine (the framer) over a real kernel socket pair, shared by its tests: two
 * hccl_framer_t on the ends of socketpair(AF_UNIX, SOCK_STREAM), our own byte I/O (with a
 * write budget to cut frames at exact bytes), one reactor for the deferred completions, and
 * a pump that behaves like the tcp link's event handlers. Everything is bounded by iteration
 * counts; nothing sleeps.
 */
#ifndef HCCL_TEST_FRAME_PAIR_H
#define HCCL_TEST_FRAME_PAIR_H

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "links/frame.h"
#include "links/link.h"
#include "reactor/reactor.h"

#define MAX_PUMPS 200000 /* pump iterations before a test gives up */
#define POOL 256         /* transfers per test */
#define FRAME sizeof(hccl_frame_t)

/* ---- one end of the pair ---- */

typedef struct {
    hccl_framer_t s;
    int fd;
    size_t wbudget;   /* bytes writev may still write (SIZE_MAX: unlimited) */
    size_t rx_budget; /* max_bytes per hccl_framer_rx */
    int rndv;         /* rndv_read: 0 copies from the sender's memory, 1 refuses */
    int rndv_reads;   /* single-copy reads done */
    size_t peek_max;  /* peek shows at most this many bytes (odd: units split at its edge) */
    size_t peek_skew; /* peek shows them this many bytes past an aligned address */
    _Alignas(16) char peeked[4096 + 16]; /* what peek last showed, still in the socket */
    bool closed;                         /* the caller stopped driving this end */
    bool graceful;    /* rx failed after the peer's BYE: taken as a clean close */
    hcclResult_t err; /* first failure seen by the pump */
} ep_t;

typedef struct world world_t;

typedef struct {
    hccl_xfer_t x; /* first: the callback casts back */
    world_t *w;
    int ndone;
    hcclResult_t res;
} xf_t;

struct world {
    hccl_reactor_t *r;
    ep_t ep[2];
    int ncompleted;
    xf_t pool[POOL];
    int nxf;
    void *bufs[POOL];
    int nbufs;
    /* what consume_copy was handed */
    char *cbuf;
    size_t cnext; /* the offset the next piece must start at */
    int cpieces;
    bool cbad; /* a piece out of order or not of whole units */
};

static inline ssize_t io_read(hccl_framer_t *s, void *buf, size_t len)
{
    ep_t *e = s->transport;
    ssize_t n = recv(e->fd, buf, len, MSG_DONTWAIT);

    if (n > 0)
        return n;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    hccl_error_set_quiet(hcclRemoteError, "test: rank %d: read from rank %d: %s", s->rank, s->peer,
                         n == 0 ? "EOF" : strerror(errno));
    return -1;
}

static inline ssize_t io_writev(hccl_framer_t *s, const struct iovec *iov, int iovcnt)
{
    ep_t *e = s->transport;
    struct iovec v[8];
    size_t left = e->wbudget;
    int n = 0;

    if (left == 0)
        return 0; /* "the wire is full" */
    for (int i = 0; i < iovcnt && n < 8 && left > 0; i++) {
        size_t l = iov[i].iov_len < left ? iov[i].iov_len : left;
        v[n].iov_base = iov[i].iov_base;
        v[n++].iov_len = l;
        left -= l;
    }
    struct msghdr msg = {.msg_iov = v, .msg_iovlen = (size_t)n};
    ssize_t w = sendmsg(e->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w >= 0) {
        if (e->wbudget != SIZE_MAX)
            e->wbudget -= (size_t)w;
        return w;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        return 0;
    hccl_error_set_quiet(hcclRemoteError, "test: rank %d: write to rank %d: %s", s->rank, s->peer,
                         strerror(errno));
    return -1;
}

/* Single copy within one process: the "sender's memory" is ours. */
static inline hcclResult_t io_rndv_read(hccl_framer_t *s, const hccl_frame_t *f, hccl_xfer_t *x)
{
    ep_t *e = s->transport;

    if (e->rndv)
        return hcclUnsupported;
    e->rndv_reads++;
    if (x->len && x->consume)
        x->consume(x, 0, (const void *)(uintptr_t)f->addr, x->len);
    else if (x->len)
        memcpy(x->buf, (const void *)(uintptr_t)f->addr, x->len);
    return hcclSuccess;
}

/* In place, as a ring would show it: a copy of what MSG_PEEK sees, released by advance. */
static inline ssize_t io_peek(hccl_framer_t *s, const void **data)
{
    ep_t *e = s->transport;
    size_t max = e->peek_max < sizeof(e->peeked) - 16 ? e->peek_max : sizeof(e->peeked) - 16;
    ssize_t n = recv(e->fd, e->peeked + e->peek_skew, max, MSG_PEEK | MSG_DONTWAIT);

    if (n > 0) {
        *data = e->peeked + e->peek_skew;
        return n;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    hccl_error_set_quiet(hcclRemoteError, "test: rank %d: peek: EOF", s->rank);
    return -1;
}

static inline void io_advance(hccl_framer_t *s, size_t n)
{
    ep_t *e = s->transport;
    char sink[4096];

    assert_true(n <= sizeof(sink));
    assert_int_equal(recv(e->fd, sink, n, MSG_DONTWAIT), (ssize_t)n);
}

static const hccl_framer_io_t __attribute__((unused))
io_plain = {.read = io_read, .writev = io_writev};
static const hccl_framer_io_t __attribute__((unused))
io_rndv = {.read = io_read, .writev = io_writev, .rndv_read = io_rndv_read};
static const hccl_framer_io_t __attribute__((unused))
io_peekable = {.read = io_read, .writev = io_writev, .peek = io_peek, .advance = io_advance};

static inline world_t *world_new(const hccl_framer_io_t *io, size_t rndv_threshold)
{
    world_t *w = calloc(1, sizeof(*w));
    int fds[2];

    assert_non_null(w);
    assert_int_equal(hccl_reactor_create(NULL, -1, &w->r), hcclSuccess);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
    for (int i = 0; i < 2; i++) {
        ep_t *e = &w->ep[i];
        e->fd = fds[i];
        e->wbudget = SIZE_MAX;
        e->rx_budget = 1u << 20;
        hccl_framer_init(&e->s, io, w->r, e, i, 1 - i, rndv_threshold);
    }
    return w;
}

static inline void world_free(world_t *w)
{
    for (int i = 0; i < 2; i++)
        hccl_framer_fail(&w->ep[i].s, hcclAborted);
    for (int i = 0; i < 10; i++)
        hccl_reactor_drive(w->r, 0);
    for (int i = 0; i < 2; i++)
        if (w->ep[i].fd >= 0)
            close(w->ep[i].fd);
    hccl_reactor_destroy(w->r); /* runs what is still posted: the pool is alive until here */
    for (int i = 0; i < 2; i++)
        hccl_framer_fini(&w->ep[i].s);
    for (int i = 0; i < w->nbufs; i++)
        free(w->bufs[i]);
    free(w);
}

static inline int setup(void **state)
{
    *state = world_new(&io_plain, SIZE_MAX);
    return 0;
}

static inline int teardown(void **state)
{
    world_free(*state);
    return 0;
}

static inline void *wbuf(world_t *w, size_t len)
{
    void *p = malloc(len ? len : 1);

    assert_non_null(p);
    assert_true(w->nbufs < POOL);
    w->bufs[w->nbufs++] = p;
    return p;
}

static inline void on_xfer(hccl_xfer_t *x, hcclResult_t res)
{
    xf_t *m = (xf_t *)x;

    m->ndone++;
    m->res = res;
    m->w->ncompleted++;
}

static inline xf_t *xf(world_t *w, uint64_t seq, uint32_t tag, void *buf, size_t len)
{
    xf_t *m;

    assert_true(w->nxf < POOL);
    m = &w->pool[w->nxf++];
    memset(m, 0, sizeof(*m));
    m->w = w;
    m->x.seq = seq;
    m->x.tag = tag;
    m->x.buf = buf;
    m->x.len = len;
    m->x.done = on_xfer;
    m->x.arg = w;
    m->res = hcclInProgress;
    return m;
}

static inline hcclResult_t post_send(world_t *w, int side, xf_t *m)
{
    m->x.peer = 1 - side;
    return hccl_framer_post_send(&w->ep[side].s, &m->x);
}

static inline hcclResult_t post_recv(world_t *w, int side, xf_t *m)
{
    m->x.peer = 1 - side;
    return hccl_framer_post_recv(&w->ep[side].s, &m->x);
}

/* What the tcp link does with a failure: a clean close after the peer's BYE, else fail all. */
static inline void ep_failed(ep_t *e, hcclResult_t res, bool on_rx)
{
    if (e->err == hcclSuccess)
        e->err = res;
    e->closed = true;
    if (on_rx && hccl_framer_closed_cleanly(&e->s)) {
        e->graceful = true;
        return;
    }
    hccl_framer_fail(&e->s, res);
}

static inline void ep_step(ep_t *e)
{
    hcclResult_t res;

    if (e->closed)
        return;
    res = hccl_framer_tx(&e->s);
    if (hccl_is_failure(res)) {
        ep_failed(e, res, false);
        return;
    }
    res = hccl_framer_rx(&e->s, e->rx_budget);
    if (hccl_is_failure(res))
        ep_failed(e, res, true);
}

static inline void pump_once(world_t *w)
{
    ep_step(&w->ep[0]);
    ep_step(&w->ep[1]);
    hccl_reactor_drive(w->r, 0);
}

/* Pumps until target completions in total, or the bound. */
static inline bool pump(world_t *w, int target)
{
    for (int i = 0; i < MAX_PUMPS && w->ncompleted < target; i++)
        pump_once(w);
    return w->ncompleted >= target;
}

static inline bool pump_until_done(world_t *w, const xf_t *m)
{
    for (int i = 0; i < MAX_PUMPS && m->ndone == 0; i++)
        pump_once(w);
    return m->ndone > 0;
}

static inline void pump_n(world_t *w, int n)
{
    for (int i = 0; i < n; i++)
        pump_once(w);
}

static inline void drive_n(world_t *w, int n)
{
    for (int i = 0; i < n; i++)
        hccl_reactor_drive(w->r, 0);
}

static inline void fill(void *buf, size_t len, uint32_t seed)
{
    uint32_t v = seed * 2654435761u + 12345u;
    unsigned char *p = buf;

    for (size_t i = 0; i < len; i++) {
        v ^= v << 13;
        v ^= v >> 17;
        v ^= v << 5;
        p[i] = (unsigned char)v;
    }
}

static inline void assert_done_ok(const xf_t *m)
{
    assert_int_equal(m->ndone, 1);
    assert_int_equal(m->res, hcclSuccess);
    assert_int_equal(m->x.moved, m->x.len);
}

#endif
