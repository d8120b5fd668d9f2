/* The framer's transmit side: control frames first, then messages (DATA or RTS). */
#include <string.h>

#include "links/frame_impl.h"

void framer_fill(const hccl_framer_t *s, hccl_frame_t *f, uint16_t type, uint64_t seq, uint32_t tag,
                 uint64_t len, uint64_t addr)
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

hcclResult_t framer_queue_ctl(hccl_framer_t *s, uint16_t type, uint64_t seq, uint32_t tag)
{
    hccl_ctl_t *c = hccl_calloc(1, sizeof(*c));
    uint64_t credit = 0;

    if (!c)
        return HCCL_FAIL(hcclSystemError, "rank %d: out of memory for a control frame", s->rank);
    if (type == HCCL_FRAME_FIN || type == HCCL_FRAME_PULL || type == HCCL_FRAME_NACK ||
        type == HCCL_FRAME_CREDIT) {
        /* An answer, which the sender reads before its send completes or it closes: it carries
         * what was delivered since the last one (frame.h, eager_cap). */
        credit = s->rx_uncredited;
        s->rx_uncredited = 0;
    }
    framer_fill(s, &c->f, type, seq, tag, credit, 0);
    if (s->ctl_tail)
        s->ctl_tail->next = c;
    else
        s->ctl_head = c;
    s->ctl_tail = c;
    return hccl_framer_tx(s);
}

bool framer_offers_taken(const hccl_framer_t *s)
{
    return s->io->rndv_read != NULL || s->pull_max > 0;
}

void framer_credit(hccl_framer_t *s, size_t len)
{
    if (s->eager_cap && framer_offers_taken(s))
        s->rx_uncredited += len;
}

hcclResult_t framer_on_credit(hccl_framer_t *s, uint64_t len)
{
    if (len > s->tx_uncredited)
        return HCCL_FAIL(hcclRemoteError,
                         "rank %d: rank %d credited %llu bytes back but only %llu were "
                         "outstanding; closing the connection",
                         s->rank, s->peer, (unsigned long long)len,
                         (unsigned long long)s->tx_uncredited);
    s->tx_uncredited -= len;
    return hcclSuccess;
}

/* A message that would take the DATA bytes the receiver has not delivered past the cap. */
static bool framer_over_cap(const hccl_framer_t *s, size_t len)
{
    return s->eager_cap && len && s->tx_uncredited + len > s->eager_cap && framer_offers_taken(s);
}

bool hccl_framer_tx_pending(const hccl_framer_t *s)
{
    return !s->failed && (s->tx_cur || s->tx_ctl || s->ctl_head || s->txq.head || s->pulled.head);
}

/* Picks the next frame to write: control frames first, they unblock the peer. */
static void framer_tx_next(hccl_framer_t *s)
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
            rndv = (x->len >= s->rndv_threshold && !(x->rewritten && s->io->rndv_read)) ||
                   framer_over_cap(s, x->len);
            addr = rndv ? (uint64_t)(uintptr_t)x->buf : 0;
        }
        uint16_t type = rndv ? HCCL_FRAME_RTS : HCCL_FRAME_DATA;
        if (!rndv && s->eager_cap && framer_offers_taken(s)) {
            s->tx_uncredited += x->len;
            /* Credit asked for ahead of the cap (frame.h, eager_cap). */
            if (!s->tx_asking && x->len && s->tx_uncredited > s->eager_cap / 2) {
                s->tx_asking = true;
                type = HCCL_FRAME_ASK;
            }
        }
        s->tx_cur = x;
        framer_fill(s, &s->tx_hdr, type, x->seq, x->tag, x->len, addr);
        s->tx_hdr.sig = x->sig;
    }
    s->tx_hdr_done = 0;
    s->tx_payload_done = 0;
}

static void framer_tx_frame_done(hccl_framer_t *s)
{
    if (s->tx_ctl) {
        hccl_free(s->tx_ctl->cause);
        hccl_free(s->tx_ctl);
        s->tx_ctl = NULL;
        return;
    }
    if (s->tx_timed) {
        /* The last copy alone (pulls may be rare: probes), none through cold wire memory. */
        if (s->tx_cold)
            s->tx_pull_ns_per_byte = 0;
        else if (s->tx_cur->len >= FRAMER_TIMED_MIN)
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

static hcclResult_t framer_tx_frames(hccl_framer_t *s, bool *moved)
{
    while (!s->failed) {
        struct iovec iov[2];
        int n = 0;
        size_t payload;
        ssize_t w;

        if (!s->tx_cur && !s->tx_ctl) {
            if (!s->ctl_head && !s->txq.head && !s->pulled.head)
                return hcclSuccess;
            framer_tx_next(s);
        }
        payload = s->tx_hdr.type == HCCL_FRAME_DATA || s->tx_hdr.type == HCCL_FRAME_ASK
                      ? s->tx_cur->len
                      : 0;
        if (s->tx_ctl && s->tx_ctl->cause)
            payload = sizeof(*s->tx_ctl->cause);
        if (s->tx_hdr_done < sizeof(s->tx_hdr)) {
            iov[n].iov_base = (char *)&s->tx_hdr + s->tx_hdr_done;
            iov[n++].iov_len = sizeof(s->tx_hdr) - s->tx_hdr_done;
        }
        if (s->tx_payload_done < payload) {
            iov[n].iov_base = (s->tx_ctl ? (char *)s->tx_ctl->cause : (char *)s->tx_cur->buf) +
                              s->tx_payload_done;
            iov[n++].iov_len = payload - s->tx_payload_done;
        }
        if (n == 0) {
            framer_tx_frame_done(s);
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

hcclResult_t hccl_framer_tx(hccl_framer_t *s)
{
    bool moved = false;
    hcclResult_t res = framer_tx_frames(s, &moved);

    /* Once per call, not per write: the clock is read off the per-frame path. */
    if (moved && s->activity)
        hccl_link_stamp(&s->activity->tx_ms);
    return res;
}

hcclResult_t hccl_framer_post_send(hccl_framer_t *s, hccl_xfer_t *x)
{
    if (s->failed) {
        hccl_xfer_complete_later(s->reactor, x, s->fail_res);
        return hcclSuccess;
    }
    if (s->peer_bye)
        return framer_fail_xfer(s, x, framer_peer_gone(s));
    hccl_xfer_queue_push(&s->txq, x);
    return hccl_framer_tx(s);
}
