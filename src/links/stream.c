/* The framing engine of byte-stream links (see stream.h). */
#include <stdio.h>
#include <string.h>

#include "links/stream.h"

/*
 * The slower way of an offer that may be pulled is tried again after at least this many
 * offers and STREAM_PULL_PROBE_NS times the square of how much slower it was (at most
 * STREAM_PULL_PROBE_NS_MAX; see pull_max). A probe costs far more than its own time: while
 * pulling is much slower, even rare pulled messages slow the whole stream down markedly
 * (docs/performance.md).
 */
#define STREAM_PULL_PROBE 16
#define STREAM_PULL_PROBE_NS 5000000.0
#define STREAM_PULL_PROBE_NS_MAX 50000000.0
/* Transfers shorter than this are not timed: fixed costs would swamp the per-byte figure. */
#define STREAM_TIMED_MIN (32u << 10)
/* A sender's copy cost of this many ps per byte or more (1 MB/s) is not believed. */
#define STREAM_SENDER_PS_MAX 1000000u
/* Smaller messages are held at once: a copy of them costs less than another turn. */
#define STREAM_PARK_MIN (64u << 10)

void hccl_stream_init(hccl_stream_t *s, const hccl_stream_io_t *io, hccl_reactor_t *r, void *transport,
                      int rank, int peer, size_t rndv_threshold)
{
    memset(s, 0, sizeof(*s));
    s->io = io;
    s->reactor = r;
    s->transport = transport;
    s->rank = rank;
    s->peer = peer;
    s->rndv_threshold = io->rndv_read ? rndv_threshold : SIZE_MAX;
}

static hcclResult_t stream_protocol_error(hccl_stream_t *s, const char *what)
{
    return HCCL_FAIL(hcclRemoteError,
                     "rank %d: malformed frame from rank %d (%s: type %u, seq %llu, tag %u, len %llu); "
                     "closing the connection",
                     s->rank, s->peer, what, s->rx_hdr.type, (unsigned long long)s->rx_hdr.seq,
                     s->rx_hdr.tag, (unsigned long long)s->rx_hdr.len);
}

/* A transfer taken off a queue whose frame is bad: it fails with the connection. */
static hcclResult_t stream_fail_xfer(hccl_stream_t *s, hccl_xfer_t *x, hcclResult_t res)
{
    hccl_xfer_complete_later(s->reactor, x, res);
    return res;
}

static hcclResult_t stream_peer_gone(hccl_stream_t *s)
{
    return HCCL_FAIL(hcclRemoteError,
                     "rank %d: rank %d has destroyed its communicator but this rank still expects "
                     "data from it (did the ranks call different collectives?)", s->rank, s->peer);
}

static void frame_fill(const hccl_stream_t *s, hccl_frame_t *f, uint16_t type, uint64_t seq,
                       uint32_t tag, uint64_t len, uint64_t addr)
{
    memset(f, 0, sizeof(*f));
    f->magic = HCCL_WIRE_MAGIC;
    f->comm_id = s->comm_id;
    f->version = HCCL_WIRE_VERSION;
    f->type = type;
    f->seq = seq;
    f->tag = tag;
    f->len = len;
    f->addr = addr;
}

static hcclResult_t stream_queue_ctl(hccl_stream_t *s, uint16_t type, uint64_t seq, uint32_t tag)
{
    hccl_ctl_t *c = hccl_calloc(1, sizeof(*c));

    if (!c)
        return HCCL_FAIL(hcclSystemError, "rank %d: out of memory for a control frame", s->rank);
    frame_fill(s, &c->f, type, seq, tag, 0, 0);
    if (s->ctl_tail)
        s->ctl_tail->next = c;
    else
        s->ctl_head = c;
    s->ctl_tail = c;
    return hccl_stream_tx(s);
}

bool hccl_stream_tx_pending(const hccl_stream_t *s)
{
    return !s->failed && (s->tx_cur || s->tx_ctl || s->ctl_head || s->txq.head || s->pulled.head);
}

/* A moving average; a probe's sample (probe: the way not preferred) replaces it, so that one
 * probe is enough to see a change. */
static void stream_cost_sample(double *avg, int64_t ns, size_t len, bool probe)
{
    double v = (double)(ns > 0 ? ns : 1) / (double)len;

    *avg = *avg > 0 && !probe ? 0.75 * *avg + 0.25 * v : v;
}

/*
 * A way's time for len bytes (pulled or single-copy). Not taken if the copy went through wire
 * memory used for the first time (tx_wire_cold, rx_wire_cold): that costs a page fault per
 * page, several times the copy (docs/performance.md), which no later use pays; a probe that
 * did is tried again soon. A probe's time replaces the figure (stream_cost_sample).
 */
static void stream_way_sample(hccl_stream_t *s, bool pulled, int64_t ns, size_t len, bool cold)
{
    double *fig = pulled ? &s->pull_ns_per_byte : &s->rndv_ns_per_byte;
    double other = pulled ? s->rndv_ns_per_byte : s->pull_ns_per_byte;
    bool probe = other > 0 && other < *fig;

    if (len < STREAM_TIMED_MIN)
        return;
    if (cold) {
        if (probe)
            s->pull_probe_ns = 0;
        return;
    }
    stream_cost_sample(fig, ns, len, probe);
}

/* Picks the next frame to write: control frames first, they unblock the peer. */
static void stream_tx_next(hccl_stream_t *s)
{
    if (s->ctl_head) {
        s->tx_ctl = s->ctl_head;
        s->ctl_head = s->ctl_head->next;
        if (!s->ctl_head)
            s->ctl_tail = NULL;
        s->tx_hdr = s->tx_ctl->f;
    } else {
        hccl_xfer_t *x = hccl_xfer_queue_pop(&s->pulled);
        /* A pulled message tells the receiver what our copies into the wire cost. */
        uint64_t addr = x ? (uint64_t)(s->tx_pull_ns_per_byte * 1000.0 + 0.5) : 0;
        bool rndv = false;
        /* Timed only where the receiver weighs it (no clock reads on other links' sends). */
        s->tx_timed = x != NULL && s->count_sender_copy;
        if (!x) {
            x = hccl_xfer_queue_pop(&s->txq);
            rndv = x->len >= s->rndv_threshold;
            addr = rndv ? (uint64_t)(uintptr_t)x->buf : 0;
        }
        s->tx_cur = x;
        frame_fill(s, &s->tx_hdr, rndv ? HCCL_FRAME_RTS : HCCL_FRAME_DATA, x->seq, x->tag, x->len,
                   addr);
        s->tx_hdr.sig = x->sig;
    }
    s->tx_hdr_done = 0;
    s->tx_payload_done = 0;
}

static void stream_tx_frame_done(hccl_stream_t *s)
{
    if (s->tx_ctl) {
        hccl_free(s->tx_ctl);
        s->tx_ctl = NULL;
        return;
    }
    if (s->tx_timed) {
        /* The last copy alone (pulls may be rare: probes), none through cold wire memory. */
        if (s->tx_cold)
            s->tx_pull_ns_per_byte = 0;
        else if (s->tx_cur->len >= STREAM_TIMED_MIN)
            s->tx_pull_ns_per_byte = (double)s->tx_pull_ns / (double)s->tx_cur->len;
        s->tx_pull_ns = 0;
        s->tx_cold = false;
        s->tx_timed = false;
    }
    if (s->tx_hdr.type == HCCL_FRAME_RTS) {
        hccl_xfer_queue_push(&s->await_fin, s->tx_cur);
    } else {
        s->tx_cur->moved = s->tx_cur->len;
        hccl_xfer_complete_later(s->reactor, s->tx_cur, hcclSuccess);
    }
    s->tx_cur = NULL;
}

static hcclResult_t stream_tx_frames(hccl_stream_t *s, bool *moved)
{
    while (!s->failed) {
        struct iovec iov[2];
        int n = 0;
        size_t payload;
        ssize_t w;

        if (!s->tx_cur && !s->tx_ctl) {
            if (!s->ctl_head && !s->txq.head && !s->pulled.head)
                return hcclSuccess;
            stream_tx_next(s);
        }
        payload = s->tx_hdr.type == HCCL_FRAME_DATA ? s->tx_cur->len : 0;
        if (s->tx_hdr_done < sizeof(s->tx_hdr)) {
            iov[n].iov_base = (char *)&s->tx_hdr + s->tx_hdr_done;
            iov[n++].iov_len = sizeof(s->tx_hdr) - s->tx_hdr_done;
        }
        if (s->tx_payload_done < payload) {
            iov[n].iov_base = (char *)s->tx_cur->buf + s->tx_payload_done;
            iov[n++].iov_len = payload - s->tx_payload_done;
        }
        if (n == 0) {
            stream_tx_frame_done(s);
            continue;
        }
        if (s->tx_timed) {
            int64_t t0 = hccl_now_ns();
            s->tx_cold |= s->tx_wire_cold;
            w = s->io->writev(s, iov, n);
            s->tx_pull_ns += hccl_now_ns() - t0;
        } else {
            w = s->io->writev(s, iov, n);
        }
        if (w < 0)
            return hcclRemoteError;
        if (w == 0)
            return hcclInProgress; /* the wire is full: the transport wakes us */
        *moved = true;
        size_t hdr_left = sizeof(s->tx_hdr) - s->tx_hdr_done;
        size_t used = (size_t)w < hdr_left ? (size_t)w : hdr_left;
        s->tx_hdr_done += used;
        s->tx_payload_done += (size_t)w - used;
    }
    return hcclRemoteError;
}

hcclResult_t hccl_stream_tx(hccl_stream_t *s)
{
    bool moved = false;
    hcclResult_t res = stream_tx_frames(s, &moved);

    /* Once per call, not per write: the clock is read off the per-frame path. */
    if (moved && s->activity)
        hccl_link_stamp(&s->activity->tx_ms);
    return res;
}

hcclResult_t hccl_stream_post_send(hccl_stream_t *s, hccl_xfer_t *x)
{
    if (s->failed) {
        hccl_xfer_complete_later(s->reactor, x, s->fail_res);
        return hcclSuccess;
    }
    if (s->peer_bye)
        return stream_fail_xfer(s, x, stream_peer_gone(s));
    hccl_xfer_queue_push(&s->txq, x);
    return hccl_stream_tx(s);
}

/* A held message is done with: its buffer is kept for the next ones, in place of a smaller one. */
static void stream_unexp_free(hccl_stream_t *s, hccl_unexp_t *u)
{
    int min = 0;

    for (int i = 1; i < HCCL_STREAM_SPARES; i++)
        if (s->spare_cap[i] < s->spare_cap[min])
            min = i;
    if (u->data && u->cap <= HCCL_STREAM_SPARE_MAX && u->cap > s->spare_cap[min]) {
        hccl_free(s->spare[min]);
        s->spare[min] = u->data;
        s->spare_cap[min] = u->cap;
    } else {
        hccl_free(u->data);
    }
    hccl_free(u);
}

static void unexp_remove(hccl_stream_t *s, hccl_unexp_t *prev, hccl_unexp_t *u)
{
    if (prev)
        prev->next = u->next;
    else
        s->unexp_head = u->next;
    if (s->unexp_tail == u)
        s->unexp_tail = prev;
}

/* Both sides name their collective: different ones at one sequence number is a usage error. */
static hcclResult_t stream_sig_mismatch(hccl_stream_t *s, uint64_t seq, uint32_t theirs, uint32_t ours)
{
    char a[96], b[96];

    hccl_sig_describe(theirs, a, sizeof(a));
    hccl_sig_describe(ours, b, sizeof(b));
    return HCCL_FAIL(hcclInvalidUsage,
                     "rank %d: collective mismatch at seq %llu: rank %d called %s, this rank %s "
                     "(every rank must call the same collectives in the same order)", s->rank,
                     (unsigned long long)seq, s->peer, a, b);
}

static bool sig_differs(uint32_t a, uint32_t b)
{
    return a && b && a != b;
}

/* Any receive of this sequence number whose collective differs from the frame's. */
static hcclResult_t stream_check_sig_posted(hccl_stream_t *s, const hccl_frame_t *f)
{
    for (hccl_xfer_t *x = s->posted.head; x; x = x->next)
        if (x->seq == f->seq && sig_differs(f->sig, x->sig))
            return stream_sig_mismatch(s, f->seq, f->sig, x->sig);
    return hcclSuccess;
}

static hcclResult_t stream_check_len(hccl_stream_t *s, const hccl_frame_t *f, const hccl_xfer_t *x)
{
    if (f->len == x->len)
        return hcclSuccess;
    return HCCL_FAIL(hcclInvalidUsage,
                     "rank %d: rank %d sent %llu bytes for seq %llu tag %u but %zu were expected "
                     "(do the ranks call the same collective with the same count and type?)",
                     s->rank, s->peer, (unsigned long long)f->len, (unsigned long long)f->seq, f->tag,
                     x->len);
}

/* Whether to pull the message offered to x rather than read it single-copy. */
static bool stream_choose_pull(hccl_stream_t *s, const hccl_xfer_t *x)
{
    size_t len = x->len;
    double ratio, gap_ns;
    int64_t now;
    bool pull;

    if (len > s->pull_max || len == 0 || (x->read_direct && s->io->rndv_read))
        return false;
    if (!s->io->rndv_read)
        return true; /* the offer is a request to send: pulling is the only way */
    /* Each way once first, to have both figures. */
    if (s->pull_ns_per_byte == 0 || s->rndv_ns_per_byte == 0)
        return s->pull_ns_per_byte == 0;
    pull = s->pull_ns_per_byte <= s->rndv_ns_per_byte;
    ratio = pull ? s->rndv_ns_per_byte / s->pull_ns_per_byte : s->pull_ns_per_byte / s->rndv_ns_per_byte;
    gap_ns = STREAM_PULL_PROBE_NS * ratio * ratio;
    if (++s->pull_choices < STREAM_PULL_PROBE)
        return pull;
    now = hccl_now_ns();
    if (now - s->pull_probe_ns < (gap_ns < STREAM_PULL_PROBE_NS_MAX ? gap_ns : STREAM_PULL_PROBE_NS_MAX))
        return pull;
    s->pull_choices = 0;
    s->pull_probe_ns = now;
    return !pull;
}

/* Asks for an offered message as DATA: x stays posted, its payload comes next. */
static hcclResult_t stream_pull(hccl_stream_t *s, const hccl_frame_t *f, hccl_xfer_t *x)
{
    x->t0_ns = hccl_now_ns();
    hccl_xfer_queue_push(&s->posted, x);
    return stream_queue_ctl(s, HCCL_FRAME_PULL, f->seq, f->tag);
}

/* Hands an RTS message to the transport's single-copy read; falls back to DATA on refusal. */
static hcclResult_t stream_rndv(hccl_stream_t *s, const hccl_frame_t *f, hccl_xfer_t *x)
{
    hcclResult_t res;
    int64_t t0 = hccl_now_ns();

    res = s->io->rndv_read ? s->io->rndv_read(s, f, x) : hcclUnsupported;

    if (res == hcclSuccess) {
        stream_way_sample(s, false, hccl_now_ns() - t0, x->len, false);
        x->moved = x->len;
        s->rx_rndv_bytes += x->len;
        if (s->activity)
            hccl_link_stamp(&s->activity->rx_ms);
        hccl_xfer_complete_later(s->reactor, x, hcclSuccess);
        return stream_queue_ctl(s, HCCL_FRAME_FIN, f->seq, f->tag);
    }
    if (res != hcclUnsupported)
        return stream_fail_xfer(s, x, res);
    /* Keep the receive posted: the payload comes again as DATA. */
    x->next = s->posted.head;
    s->posted.head = x;
    if (!s->posted.tail)
        s->posted.tail = x;
    return stream_queue_ctl(s, HCCL_FRAME_NACK, f->seq, f->tag);
}

/*
 * A receive posted after its RTS: read it from the loop (hccl_stream_rx), where it counts against
 * the receive budget, rather than inside the post, where a drive posting many receives would
 * read them all in one go.
 */
static hcclResult_t stream_defer_rndv(hccl_stream_t *s, const hccl_frame_t *f, hccl_xfer_t *x)
{
    hccl_rndv_t *d;

    if (stream_choose_pull(s, x))
        return stream_pull(s, f, x);
    if (!s->io->kick)
        return stream_rndv(s, f, x);
    d = hccl_calloc(1, sizeof(*d));
    if (!d)
        return stream_fail_xfer(s, x, HCCL_FAIL(hcclSystemError, "rank %d: out of memory", s->rank));
    d->f = *f;
    d->x = x;
    if (s->rndv_tail)
        s->rndv_tail->next = d;
    else
        s->rndv_head = d;
    s->rndv_tail = d;
    s->io->kick(s);
    return hcclSuccess;
}

/* The deferred single-copy reads, while the budget lasts; returns the bytes read. */
static hcclResult_t stream_run_rndv(hccl_stream_t *s, size_t max_bytes, size_t *total_p)
{
    while (s->rndv_head && !s->failed && *total_p < max_bytes) {
        hccl_rndv_t *d = s->rndv_head;
        s->rndv_head = d->next;
        if (!s->rndv_head)
            s->rndv_tail = NULL;
        hccl_frame_t f = d->f;
        hccl_xfer_t *x = d->x;
        hccl_free(d);
        s->rx_rndv_bytes = 0;
        HCCL_CHECK(stream_rndv(s, &f, x));
        *total_p += s->rx_rndv_bytes;
    }
    return hcclSuccess;
}

/* A held message's payload, all in memory, to its receive. */
static void stream_deliver(hccl_xfer_t *x, const char *data)
{
    if (!x->len)
        return;
    if (x->consume)
        x->consume(x, 0, data, x->len);
    else
        memcpy(x->buf, data, x->len);
}

char *hccl_stream_bounce(hccl_stream_t *s)
{
    if (!s->bounce) {
        /* Page-aligned: the kernel copies page by page, and single-copy reads into it
         * (shm_io_rndv_read) are much slower into a buffer off a page (docs/performance.md). */
        s->bounce = hccl_aligned_alloc(4096, HCCL_STREAM_BOUNCE);
        if (!s->bounce)
            HCCL_FAIL(hcclSystemError, "rank %d: out of memory for a receive buffer", s->rank);
    }
    return s->bounce;
}

static void stream_free_spares(hccl_stream_t *s)
{
    for (int i = 0; i < HCCL_STREAM_SPARES; i++) {
        hccl_free(s->spare[i]);
        s->spare[i] = NULL;
        s->spare_cap[i] = 0;
    }
}

void hccl_stream_fini(hccl_stream_t *s)
{
    hccl_free(s->bounce);
    s->bounce = NULL;
    stream_free_spares(s);
}

hcclResult_t hccl_stream_post_recv(hccl_stream_t *s, hccl_xfer_t *x)
{
    hccl_unexp_t *prev = NULL;

    if (s->failed) {
        hccl_xfer_complete_later(s->reactor, x, s->fail_res);
        return hcclSuccess;
    }
    /* One pass, ending at the match: a sender that runs ahead (a Broadcast root) can leave
     * thousands held, and the match is usually among the first. Every frame of a collective
     * carries its signature, so the first of x's seq met tells a mismatch. */
    for (hccl_unexp_t *u = s->unexp_head; u; prev = u, u = u->next) {
        hccl_frame_t f = u->f;
        if (f.seq != x->seq)
            continue;
        if (sig_differs(f.sig, x->sig))
            return stream_fail_xfer(s, x, stream_sig_mismatch(s, x->seq, f.sig, x->sig));
        if (f.tag != x->tag)
            continue;
        unexp_remove(s, prev, u);
        if (stream_check_len(s, &f, x) != hcclSuccess) {
            hccl_free(u->data);
            hccl_free(u);
            return stream_fail_xfer(s, x, hcclInvalidUsage);
        }
        if (f.type == HCCL_FRAME_RTS) {
            hccl_free(u);
            return stream_defer_rndv(s, &f, x);
        }
        stream_deliver(x, u->data);
        stream_unexp_free(s, u);
        x->moved = x->len;
        hccl_xfer_complete_later(s->reactor, x, hcclSuccess);
        return hcclSuccess;
    }
    if (s->peer_bye)
        return stream_fail_xfer(s, x, stream_peer_gone(s));
    hccl_xfer_queue_push(&s->posted, x);
    return hcclSuccess;
}

static hcclResult_t stream_hold(hccl_stream_t *s, bool with_payload)
{
    hccl_unexp_t *u = hccl_calloc(1, sizeof(*u));

    if (!u)
        return HCCL_FAIL(hcclSystemError, "rank %d: out of memory holding a message", s->rank);
    u->f = s->rx_hdr;
    if (with_payload) {
        /* The buffer grows as the payload arrives (stream_unexp_room): a header alone, whatever
         * length it claims, costs at most a first chunk. */
        s->rx_unexp = u;
        s->rx_dst = NULL;
        s->rx_left = s->rx_hdr.len;
        s->rx_in_payload = true;
        return hcclSuccess;
    }
    if (s->unexp_tail)
        s->unexp_tail->next = u;
    else
        s->unexp_head = u;
    s->unexp_tail = u;
    return hcclSuccess;
}

/* Room for the next bytes of the unexpected payload being read: grows x8, up to its length. */
static hcclResult_t stream_unexp_room(hccl_stream_t *s)
{
    hccl_unexp_t *u = s->rx_unexp;
    size_t got = (size_t)u->f.len - s->rx_left;

    if (got == 0 && !u->data) {
        int max = 0;
        for (int i = 1; i < HCCL_STREAM_SPARES; i++)
            if (s->spare_cap[i] > s->spare_cap[max])
                max = i;
        u->data = s->spare[max];
        u->cap = s->spare_cap[max];
        s->spare[max] = NULL;
        s->spare_cap[max] = 0;
    }
    if (got == u->cap) {
        /* x8: a 4 MiB chunk costs two reallocs, and what is held stays within 8x what the
         * peer has really sent. */
        size_t cap = u->cap ? u->cap * 8 : HCCL_STREAM_HOLD_FIRST;
        char *p;
        if (cap > u->f.len)
            cap = (size_t)u->f.len;
        p = hccl_realloc(u->data, cap);
        if (!p)
            return HCCL_FAIL(hcclSystemError, "rank %d: out of memory holding %llu bytes from rank %d",
                             s->rank, (unsigned long long)u->f.len, s->peer);
        u->data = p;
        u->cap = cap;
    }
    s->rx_dst = u->data + got;
    return hcclSuccess;
}

/* The peer finished every collective and closed: its EOF is no failure, but a wait on it is. */
static hcclResult_t stream_on_bye(hccl_stream_t *s)
{
    /* A goodbye that carries a result is a peer that failed first (hccl_stream_send_failure). */
    if (s->rx_hdr.tag != 0 && s->rx_hdr.tag < hcclNumResults)
        return HCCL_FAIL(hcclRemoteError, "rank %d: rank %d failed first (%s) and closed its "
                                          "connections; its error names the cause",
                         s->rank, s->peer, hcclGetErrorString((hcclResult_t)s->rx_hdr.tag));
    s->peer_bye = true;
    if (s->posted.head || s->await_fin.head)
        return stream_peer_gone(s);
    return hcclSuccess;
}

const char *hccl_frame_check(const hccl_frame_t *f, uint64_t comm_id, bool rndv_allowed)
{
    if (f->magic != HCCL_WIRE_MAGIC || f->version != HCCL_WIRE_VERSION)
        return "bad magic or version";
    if (f->comm_id != comm_id)
        return "frame of another communicator";
    switch (f->type) {
    case HCCL_FRAME_RTS:
        if (!rndv_allowed)
            return "single-copy offer on a link without single copy";
        /* fall through */
    case HCCL_FRAME_DATA:
        return f->len > HCCL_WIRE_MAX_LEN ? "length too large" : NULL;
    case HCCL_FRAME_FIN:
    case HCCL_FRAME_NACK:
    case HCCL_FRAME_PULL:
    case HCCL_FRAME_BYE:
        return f->len != 0 || f->addr != 0 ? "control frame with a length" : NULL;
    default:
        return "unknown type";
    }
}

static hcclResult_t stream_on_header(hccl_stream_t *s)
{
    const hccl_frame_t *f = &s->rx_hdr;
    const char *why = hccl_frame_check(f, s->comm_id, s->io->rndv_read != NULL || s->pull_max > 0);
    hccl_xfer_t *x;

    if (why)
        return stream_protocol_error(s, why);
    switch (f->type) {
    case HCCL_FRAME_DATA:
    case HCCL_FRAME_RTS:
        HCCL_CHECK(stream_check_sig_posted(s, f));
        x = hccl_xfer_queue_take(&s->posted, f->seq, f->tag);
        if (!x && f->type == HCCL_FRAME_DATA && s->park_unmatched && f->len >= STREAM_PARK_MIN &&
            hccl_reactor_posts_pending(s->reactor)) {
            s->rx_parked = true;
            return hcclSuccess;
        }
        if (!x)
            return stream_hold(s, f->type == HCCL_FRAME_DATA);
        if (stream_check_len(s, f, x) != hcclSuccess)
            return stream_fail_xfer(s, x, hcclInvalidUsage);
        if (f->type == HCCL_FRAME_RTS)
            return stream_choose_pull(s, x) ? stream_pull(s, f, x) : stream_rndv(s, f, x);
        /* A pulled message is timed from its first byte: waiting for its turn is not its cost. */
        if (x->t0_ns) {
            x->t0_ns = hccl_now_ns();
            s->rx_cold = s->rx_wire_cold;
            /* The sender's copy, which the first byte does not show: see pull_max. */
            s->rx_sender_ps_per_byte =
                s->count_sender_copy && s->io->rndv_read && f->addr < STREAM_SENDER_PS_MAX ? f->addr : 0;
        }
        s->rx_xfer = x;
        s->rx_dst = x->buf;
        s->rx_left = x->len;
        s->rx_carry = 0;
        s->rx_in_payload = true;
        return hcclSuccess;
    case HCCL_FRAME_BYE:
        return stream_on_bye(s);
    case HCCL_FRAME_FIN:
    case HCCL_FRAME_NACK:
    case HCCL_FRAME_PULL:
        x = hccl_xfer_queue_take(&s->await_fin, f->seq, f->tag);
        if (!x)
            return stream_protocol_error(s, "acknowledges no offered message");
        if (f->type == HCCL_FRAME_PULL) {
            hccl_xfer_queue_push(&s->pulled, x);
            return hccl_stream_tx(s);
        }
        if (f->type == HCCL_FRAME_FIN) {
            x->moved = x->len;
            hccl_xfer_complete_later(s->reactor, x, hcclSuccess);
            return hcclSuccess;
        }
        /* The peer cannot read our memory: never offer again, resend as DATA first. */
        s->rndv_threshold = SIZE_MAX;
        x->next = s->txq.head;
        s->txq.head = x;
        if (!s->txq.tail)
            s->txq.tail = x;
        return hccl_stream_tx(s);
    default:
        return stream_protocol_error(s, "unknown type"); /* not reached: checked above */
    }
}

static hcclResult_t stream_on_payload_done(hccl_stream_t *s)
{
    s->rx_in_payload = false;
    if (s->rx_xfer) {
        if (s->rx_xfer->t0_ns) {
            /* The two copies overlap (on two CPUs): the slower one is what pulling costs. */
            int64_t mine = hccl_now_ns() - s->rx_xfer->t0_ns;
            int64_t theirs = (int64_t)(s->rx_sender_ps_per_byte * s->rx_xfer->len / 1000);
            stream_way_sample(s, true, mine > theirs ? mine : theirs, s->rx_xfer->len,
                              s->rx_cold || s->rx_wire_cold);
        }
        s->rx_xfer->moved = s->rx_xfer->len;
        hccl_xfer_complete_later(s->reactor, s->rx_xfer, hcclSuccess);
        s->rx_xfer = NULL;
        return hcclSuccess;
    } else {
        hccl_unexp_t *u = s->rx_unexp;
        /* Its receive may have been posted while the payload was still arriving. */
        hccl_xfer_t *x = hccl_xfer_queue_take(&s->posted, u->f.seq, u->f.tag);
        s->rx_unexp = NULL;
        if (x) {
            hcclResult_t res = stream_check_len(s, &u->f, x);
            if (res == hcclSuccess)
                stream_deliver(x, u->data);
            x->moved = x->len;
            hccl_xfer_complete_later(s->reactor, x, res);
            stream_unexp_free(s, u);
            return res;
        }
        if (s->unexp_tail)
            s->unexp_tail->next = u;
        else
            s->unexp_head = u;
        s->unexp_tail = u;
    }
    return hcclSuccess;
}

/*
 * The next payload bytes of a receive with a consume function, into *got_p (0: none yet). They
 * are used where they lie when the transport allows it and they are aligned; else, and for a
 * unit split at the end of what is readable in place (a ring's wrap), they go through the
 * bounce buffer.
 */
static hcclResult_t stream_rx_consume(hccl_stream_t *s, size_t *got_p)
{
    hccl_xfer_t *x = s->rx_xfer;
    size_t unit = hccl_xfer_unit(x), whole, want;
    ssize_t n;

    *got_p = 0;
    if (s->io->peek && s->rx_carry == 0) {
        const void *data;
        n = s->io->peek(s, &data);
        if (n < 0)
            return hcclRemoteError;
        if (n == 0)
            return hcclSuccess;
        whole = (size_t)n < s->rx_left ? (size_t)n : s->rx_left;
        whole -= whole % unit;
        /* The consumer reads whole units as their type: only where they are aligned. */
        if (whole > 0 && (uintptr_t)data % unit == 0) {
            x->consume(x, x->len - s->rx_left, data, whole);
            s->io->advance(s, whole);
            s->rx_left -= whole;
            *got_p = whole;
            return hcclSuccess;
        }
    }
    if (!hccl_stream_bounce(s))
        return hcclSystemError;
    want = s->rx_left - s->rx_carry;
    if (want > HCCL_STREAM_BOUNCE - s->rx_carry)
        want = HCCL_STREAM_BOUNCE - s->rx_carry;
    n = s->io->read(s, s->bounce + s->rx_carry, want);
    if (n <= 0)
        return n < 0 ? hcclRemoteError : hcclSuccess;
    s->rx_carry += (size_t)n;
    whole = s->rx_carry - s->rx_carry % unit;
    if (whole > 0) {
        x->consume(x, x->len - s->rx_left, s->bounce, whole);
        s->rx_left -= whole;
        s->rx_carry -= whole;
        memmove(s->bounce, s->bounce + whole, s->rx_carry);
    }
    *got_p = (size_t)n;
    return hcclSuccess;
}

/* Up to want payload bytes into rx_dst: copied by the transport, or by us with stores that
 * bypass the cache where the receive asks for them and the bytes can be seen in place. */
static ssize_t stream_rx_read(hccl_stream_t *s, size_t want)
{
    const void *data;
    ssize_t n;

    if (!s->rx_xfer || !s->rx_xfer->store || !s->io->peek || s->rx_unexp)
        return s->io->read(s, s->rx_dst, want);
    n = s->io->peek(s, &data);
    if (n <= 0)
        return n;
    if ((size_t)n > want)
        n = (ssize_t)want;
    hccl_store_copy(s->rx_dst, data, (size_t)n);
    s->io->advance(s, (size_t)n);
    return n;
}

static hcclResult_t stream_rx_budget(hccl_stream_t *s, size_t max_bytes, size_t *total_p)
{
    size_t total = 0;
    hcclResult_t res = stream_run_rndv(s, max_bytes, &total);

    *total_p = total;
    if (res != hcclSuccess)
        return res;
    if (s->rndv_head && !s->failed)
        return hcclInProgress;

    /* A zero-length payload finishes without reading: do it even when the budget is spent. */
    while (!s->failed && (total < max_bytes || (s->rx_in_payload && s->rx_left == 0))) {
        ssize_t n;

        if (s->rx_in_payload) {
            if (s->rx_left == 0) {
                HCCL_CHECK(stream_on_payload_done(s));
                continue;
            }
            if (s->rx_xfer && s->rx_xfer->consume) {
                size_t got = 0;
                HCCL_CHECK(stream_rx_consume(s, &got));
                if (got == 0)
                    return hcclSuccess;
                total += got;
                *total_p = total;
                continue;
            }
            size_t want = s->rx_left;
            if (s->rx_unexp) {
                HCCL_CHECK(stream_unexp_room(s));
                if (want > s->rx_unexp->cap - ((size_t)s->rx_unexp->f.len - s->rx_left))
                    want = s->rx_unexp->cap - ((size_t)s->rx_unexp->f.len - s->rx_left);
            }
            n = stream_rx_read(s, want);
            if (n <= 0)
                return n < 0 ? hcclRemoteError : hcclSuccess;
            s->rx_dst += n;
            s->rx_left -= (size_t)n;
            total += (size_t)n;
            *total_p = total;
            if (s->rx_left == 0)
                HCCL_CHECK(stream_on_payload_done(s));
            continue;
        }
        if (s->rx_parked) {
            /* The queued completions run first; then the receive is posted, or never will be
             * before this message is out of the way: it is held. */
            if (hccl_reactor_posts_pending(s->reactor))
                return hcclInProgress;
            s->rx_parked = false;
            HCCL_CHECK(stream_on_header(s));
            continue;
        }
        n = s->io->read(s, (char *)&s->rx_hdr + s->rx_hdr_got, sizeof(s->rx_hdr) - s->rx_hdr_got);
        if (n <= 0)
            return n < 0 ? hcclRemoteError : hcclSuccess;
        s->rx_hdr_got += (size_t)n;
        total += (size_t)n;
        *total_p = total;
        if (s->rx_hdr_got == sizeof(s->rx_hdr)) {
            s->rx_hdr_got = 0;
            s->rx_rndv_bytes = 0;
            HCCL_CHECK(stream_on_header(s));
            /* A single-copy read moves its whole message inside the header's handling: it
             * counts, or one call could read every offered message and hold the loop for ms. */
            total += s->rx_rndv_bytes;
            *total_p = total;
        }
    }
    return s->failed ? s->fail_res : hcclInProgress;
}

hcclResult_t hccl_stream_rx(hccl_stream_t *s, size_t max_bytes)
{
    size_t total = 0;
    hcclResult_t res = stream_rx_budget(s, max_bytes, &total);

    /* Once per call, not per read: the clock is read off the per-frame path. */
    if (total && s->activity)
        hccl_link_stamp(&s->activity->rx_ms);
    return res;
}

static void fail_queue(hccl_stream_t *s, hccl_xfer_queue_t *q, hcclResult_t res)
{
    hccl_xfer_t *x;

    while ((x = hccl_xfer_queue_pop(q)))
        hccl_xfer_complete_later(s->reactor, x, res);
}

bool hccl_stream_holds(const hccl_stream_t *s, uint64_t seq, uint32_t *sig)
{
    if (s->rx_parked && s->rx_hdr.seq == seq) {
        *sig = s->rx_hdr.sig;
        return true;
    }
    for (const hccl_unexp_t *u = s->unexp_head; u; u = u->next)
        if (u->f.seq == seq) {
            *sig = u->f.sig;
            return true;
        }
    return false;
}

bool hccl_stream_closed_cleanly(const hccl_stream_t *s)
{
    return s->peer_bye && !s->failed && !s->posted.head && !s->await_fin.head && !s->rx_xfer &&
           !s->rx_parked &&
           !s->rndv_head &&
           !hccl_stream_tx_pending(s);
}

hcclResult_t hccl_stream_send_bye(hccl_stream_t *s)
{
    if (s->failed || s->bye_sent)
        return hcclSuccess;
    s->bye_sent = true;
    return stream_queue_ctl(s, HCCL_FRAME_BYE, 0, 0);
}

void hccl_stream_send_failure(hccl_stream_t *s, hcclResult_t res)
{
    hccl_frame_t f;
    struct iovec iov = {&f, sizeof(f)};

    /* Only between frames: a goodbye inside a half-written frame would be read as its bytes. */
    if (s->failed || s->tx_cur || s->tx_ctl || res == hcclSuccess)
        return;
    frame_fill(s, &f, HCCL_FRAME_BYE, 0, (uint32_t)res, 0, 0);
    (void)s->io->writev(s, &iov, 1); /* best effort: a short write ends as the closing does */
}

void hccl_stream_fail(hccl_stream_t *s, hcclResult_t res)
{
    if (s->failed)
        return;
    s->failed = true;
    s->fail_res = res;
    if (s->tx_cur)
        hccl_xfer_complete_later(s->reactor, s->tx_cur, res);
    s->tx_cur = NULL;
    s->tx_timed = false;
    if (s->rx_xfer)
        hccl_xfer_complete_later(s->reactor, s->rx_xfer, res);
    s->rx_xfer = NULL;
    fail_queue(s, &s->txq, res);
    fail_queue(s, &s->await_fin, res);
    fail_queue(s, &s->pulled, res);
    fail_queue(s, &s->posted, res);
    while (s->rndv_head) {
        hccl_rndv_t *d = s->rndv_head;
        s->rndv_head = d->next;
        hccl_xfer_complete_later(s->reactor, d->x, res);
        hccl_free(d);
    }
    s->rndv_tail = NULL;
    hccl_free(s->tx_ctl);
    s->tx_ctl = NULL;
    while (s->ctl_head) {
        hccl_ctl_t *c = s->ctl_head;
        s->ctl_head = c->next;
        hccl_free(c);
    }
    s->ctl_tail = NULL;
    if (s->rx_unexp) {
        hccl_free(s->rx_unexp->data);
        hccl_free(s->rx_unexp);
        s->rx_unexp = NULL;
    }
    while (s->unexp_head) {
        hccl_unexp_t *u = s->unexp_head;
        s->unexp_head = u->next;
        hccl_free(u->data);
        hccl_free(u);
    }
    s->unexp_tail = NULL;
    stream_free_spares(s); /* a failed stream holds nothing again */
}
