/* shm: the ring I/O the framer runs on (peek, read, write), the doorbell, and the single-copy
 * read of an offered message. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "links/shm/shm.h"

/* process_vm_readv per call: bounded so one huge message does not hold the reactor for long. */
#define SHM_CMA_PIECE (64u << 20)

static char *ring_data(shm_ring_hdr_t *r)
{
    return (char *)r + SHM_RING_HDR_BYTES;
}

void hccl_shm_ring_bell(int fd)
{
    uint64_t one = 1;

    if (fd >= 0 && write(fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        HCCL_WARN("shm: write(doorbell): %s", strerror(errno));
}

bool hccl_shm_ring_used(uint64_t head, uint64_t tail, size_t size, size_t *used)
{
    uint64_t n = head - tail;

    if (n > size)
        return false;
    *used = (size_t)n;
    return true;
}

/* The peer can write every counter of the ring in its own mapping: believe none of them. */
static ssize_t shm_ring_corrupt(hccl_framer_t *s, const char *which, uint64_t head, uint64_t tail)
{
    shm_conn_t *sc = s->transport;

    hccl_error_set(hcclRemoteError,
                   "rank %d: shm: the %s ring shared with rank %d is corrupt "
                   "(head %llu, tail %llu, size %zu); closing the connection",
                   s->rank, which, s->peer, (unsigned long long)head, (unsigned long long)tail,
                   sc->ctx->ring_used);
    return -1;
}

/* The consumer has taken n bytes: the producer may reuse them. */
static void shm_ring_release(shm_conn_t *sc, shm_ring_hdr_t *r, uint64_t tail, size_t n)
{
    if (sc->framer.rx_wire_cold && tail + n >= sc->ctx->ring_used)
        sc->framer.rx_wire_cold = false;
    atomic_store_explicit(&r->tail, tail + n, memory_order_seq_cst);
    /* Pairs with the producer's flag-then-recheck: one of us sees the other. */
    if (atomic_load_explicit(&r->producer_waiting, memory_order_seq_cst) &&
        atomic_exchange(&r->producer_waiting, 0))
        hccl_shm_ring_bell(sc->peer_bell);
}

static ssize_t shm_io_peek(hccl_framer_t *s, const void **data)
{
    shm_conn_t *sc = s->transport;
    shm_ring_hdr_t *r = sc->rx_ring;
    size_t size = sc->ctx->ring_used;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    size_t avail, at = (size_t)(tail % size);

    if (!hccl_shm_ring_used(head, tail, size, &avail))
        return shm_ring_corrupt(s, "receive", head, tail);
    *data = ring_data(r) + at;
    return (ssize_t)(avail < size - at ? avail : size - at);
}

static void shm_io_advance(hccl_framer_t *s, size_t n)
{
    shm_conn_t *sc = s->transport;
    shm_ring_hdr_t *r = sc->rx_ring;

    shm_ring_release(sc, r, atomic_load_explicit(&r->tail, memory_order_relaxed), n);
}

static ssize_t shm_io_read(hccl_framer_t *s, void *buf, size_t len)
{
    shm_conn_t *sc = s->transport;
    shm_ring_hdr_t *r = sc->rx_ring;
    size_t size = sc->ctx->ring_used;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    size_t avail, n, at = (size_t)(tail % size), first;

    if (!hccl_shm_ring_used(head, tail, size, &avail))
        return shm_ring_corrupt(s, "receive", head, tail);
    n = len < avail ? len : avail;
    first = n < size - at ? n : size - at;
    if (n == 0)
        return 0;
    memcpy(buf, ring_data(r) + at, first);
    memcpy((char *)buf + first, ring_data(r), n - first);
    shm_ring_release(sc, r, tail, n);
    return (ssize_t)n;
}

static ssize_t shm_io_writev(hccl_framer_t *s, const struct iovec *iov, int iovcnt)
{
    shm_conn_t *sc = s->transport;
    shm_ring_hdr_t *r = sc->tx_ring;
    size_t size = sc->ctx->ring_used;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint64_t tail = sc->tx_tail_seen;
    size_t used, space, want = 0, done = 0;

    for (int i = 0; i < iovcnt; i++)
        want += iov[i].iov_len;
    if (!hccl_shm_ring_used(head, tail, size, &used) || size - used < want) {
        tail = atomic_load_explicit(&r->tail, memory_order_acquire);
        sc->tx_tail_seen = tail;
        if (!hccl_shm_ring_used(head, tail, size, &used))
            return shm_ring_corrupt(s, "send", head, tail);
    }
    space = size - used;
    if (space == 0) {
        atomic_store_explicit(&r->producer_waiting, 1, memory_order_seq_cst);
        tail = atomic_load_explicit(&r->tail, memory_order_seq_cst);
        sc->tx_tail_seen = tail;
        if (!hccl_shm_ring_used(head, tail, size, &used))
            return shm_ring_corrupt(s, "send", head, tail);
        space = size - used;
        if (space == 0)
            return 0; /* the consumer rings us when it frees space */
    }
    for (int i = 0; i < iovcnt && done < space; i++) {
        const char *src = iov[i].iov_base;
        size_t left = iov[i].iov_len < space - done ? iov[i].iov_len : space - done;
        while (left > 0) {
            size_t at = (size_t)((head + done) % size);
            size_t n = left < size - at ? left : size - at;
            memcpy(ring_data(r) + at, src, n);
            src += n;
            left -= n;
            done += n;
        }
    }
    atomic_store_explicit(&r->head, head + done, memory_order_release);
    if (s->tx_wire_cold && head + done >= size)
        s->tx_wire_cold = false;
    /* Pairs with the receiver's flag-clear-then-look (shm_set_polling, then shm_poll). */
    atomic_thread_fence(memory_order_seq_cst);
    if (!atomic_load_explicit(&((shm_seg_hdr_t *)sc->peer_seg)->polling, memory_order_relaxed))
        hccl_shm_ring_bell(sc->peer_bell);
    return (ssize_t)done;
}

bool hccl_shm_peer_left(const shm_conn_t *sc)
{
    struct pollfd p = {.fd = sc->out_fd, .events = POLLIN | POLLRDHUP};

    return sc->out_fd < 0 || poll(&p, 1, 0) != 0;
}

static hcclResult_t shm_io_rndv_read(hccl_framer_t *s, const hccl_frame_t *f, hccl_xfer_t *x)
{
    shm_conn_t *sc = s->transport;
    size_t done = 0, unit = hccl_xfer_unit(x);
    /* A receive that consumes reads cache-sized pieces into the bounce and uses each at once. */
    char *bounce = x->consume ? hccl_framer_bounce(s) : NULL;
    size_t piece = x->consume ? HCCL_FRAMER_BOUNCE - HCCL_FRAMER_BOUNCE % unit : SHM_CMA_PIECE;

    if (x->consume && !bounce)
        return hcclSystemError;
    while (done < x->len) {
        size_t n = x->len - done < piece ? x->len - done : piece;
        struct iovec local = {bounce ? bounce : (char *)x->buf + done, n};
        struct iovec remote = {(void *)(uintptr_t)(f->addr + done), n};
        ssize_t got = process_vm_readv(sc->pid, &local, 1, &remote, 1, 0);
        if (got > 0 && bounce && (size_t)got % unit == 0) {
            x->consume(x, done, bounce, (size_t)got);
            done += (size_t)got;
            continue;
        }
        if (got > 0 && !bounce) {
            done += (size_t)got;
            continue;
        }
        if (got < 0 && (errno == EPERM || errno == ENOSYS || errno == EACCES) && done == 0) {
            HCCL_INFO(HCCL_SUB_LINK,
                      "rank %d: shm: single-copy read from rank %d refused (%s); "
                      "using the rings",
                      s->rank, s->peer, strerror(errno));
            s->rndv_threshold = SIZE_MAX;
            return hcclUnsupported;
        }
        return HCCL_FAIL(hcclRemoteError,
                         "rank %d: shm: single-copy read of %zu bytes from rank %d "
                         "(pid %d) failed: %s",
                         s->rank, x->len, s->peer, (int)sc->pid,
                         got < 0 ? strerror(errno) : "short read");
    }
    /* A sender that aborted may reuse its buffer: if it closed its side before our read
     * ended, what we read is not its message. */
    if (hccl_shm_peer_left(sc))
        return HCCL_FAIL(hcclRemoteError,
                         "rank %d: shm: rank %d (pid %d) went away during a "
                         "single-copy read",
                         s->rank, s->peer, (int)sc->pid);
    return hcclSuccess;
}

static void shm_io_kick(hccl_framer_t *s)
{
    static const struct timeval now = {0, 0};
    shm_conn_t *sc = s->transport;

    /* A thread that polls finds the read (shm_poll looks at rndv_head): a timer added from
     * it would wake the progress thread through libevent's notification, only to contend
     * for the reactor with it (futex calls and a wake-up per read: docs/performance.md). */
    if (hccl_reactor_polled(sc->ctx->env->reactor))
        return;
    if (sc->ctx->more_ev)
        evtimer_add(sc->ctx->more_ev, &now);
}

static void shm_io_on_cause(hccl_framer_t *s, const hccl_cause_t *c)
{
    shm_conn_t *sc = s->transport;
    hccl_link_env_t *env = sc->ctx->env;

    if (env->on_cause)
        env->on_cause(env->fatal_arg, c);
}

const hccl_framer_io_t hccl_shm_io = {
    .on_cause = shm_io_on_cause,
    .read = shm_io_read,
    .writev = shm_io_writev,
    .rndv_read = shm_io_rndv_read,
    .kick = shm_io_kick,
    .peek = shm_io_peek,
    .advance = shm_io_advance,
};
