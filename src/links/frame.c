/* The framing engine of byte-stream links (frame.h): set-up, checks, failure and close. */
#include <string.h>

#include "links/frame_impl.h"

void hccl_framer_init(hccl_framer_t *s, const hccl_framer_io_t *io, hccl_reactor_t *r,
                      void *transport, int rank, int peer, size_t rndv_threshold)
{
    memset(s, 0, sizeof(*s));
    s->io = io;
    s->reactor = r;
    s->transport = transport;
    s->rank = rank;
    s->peer = peer;
    s->rndv_threshold = io->rndv_read ? rndv_threshold : SIZE_MAX;
}

hcclResult_t framer_protocol_error(hccl_framer_t *s, const char *what)
{
    return HCCL_FAIL(
        hcclRemoteError,
        "rank %d: malformed frame from rank %d (%s: type %u, seq %llu, tag %u, len %llu); "
        "closing the connection",
        s->rank, s->peer, what, s->rx_hdr.type, (unsigned long long)s->rx_hdr.seq, s->rx_hdr.tag,
        (unsigned long long)s->rx_hdr.len);
}

/* A transfer taken off a queue whose frame is bad: it fails with the connection. */
hcclResult_t framer_fail_xfer(hccl_framer_t *s, hccl_xfer_t *x, hcclResult_t res)
{
    hccl_xfer_complete_later(s->reactor, x, res);
    return res;
}

hcclResult_t framer_peer_gone(hccl_framer_t *s)
{
    return HCCL_FAIL(hcclRemoteError,
                     "rank %d: rank %d has destroyed its communicator but this rank still expects "
                     "data from it (did the ranks call different collectives?)",
                     s->rank, s->peer);
}

char *hccl_framer_bounce(hccl_framer_t *s)
{
    if (!s->bounce) {
        /* Page-aligned: the kernel copies page by page, and single-copy reads into it
         * (shm_io_rndv_read) are much slower into a buffer off a page (docs/performance.md). */
        s->bounce = hccl_aligned_alloc(4096, HCCL_FRAMER_BOUNCE);
        if (!s->bounce)
            HCCL_FAIL(hcclSystemError, "rank %d: out of memory for a receive buffer", s->rank);
    }
    return s->bounce;
}

void hccl_framer_fini(hccl_framer_t *s)
{
    hccl_free(s->bounce);
    s->bounce = NULL;
    framer_free_spares(s);
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
    case HCCL_FRAME_ASK:
        return f->len > HCCL_WIRE_MAX_LEN ? "length too large" : NULL;
    case HCCL_FRAME_FIN:
    case HCCL_FRAME_NACK:
    case HCCL_FRAME_PULL:
    case HCCL_FRAME_CREDIT:
        /* len: the credit the answer carries (frame.h, eager_cap) */
        return f->len > HCCL_WIRE_MAX_LEN || f->addr != 0 ? "answer with an address or a bad credit"
                                                          : NULL;
    case HCCL_FRAME_BYE:
        return f->len != 0 || f->addr != 0 ? "control frame with a length" : NULL;
    case HCCL_FRAME_CAUSE:
        return f->len != sizeof(hccl_cause_t) || f->addr != 0 ? "cause frame of the wrong length"
                                                              : NULL;
    default:
        return "unknown type";
    }
}

static void fail_queue(hccl_framer_t *s, hccl_xfer_queue_t *q, hcclResult_t res)
{
    hccl_xfer_t *x;

    while ((x = hccl_xfer_queue_pop(q)))
        hccl_xfer_complete_later(s->reactor, x, res);
}

bool hccl_framer_closed_cleanly(const hccl_framer_t *s)
{
    return s->peer_bye && !s->failed && !s->posted.head && !s->await_fin.head && !s->rx_xfer &&
           !s->rx_parked && !s->rndv_head && !hccl_framer_tx_pending(s);
}

hcclResult_t hccl_framer_send_bye(hccl_framer_t *s)
{
    if (s->failed || s->bye_sent)
        return hcclSuccess;
    s->bye_sent = true;
    return framer_queue_ctl(s, HCCL_FRAME_BYE, 0, 0);
}

void hccl_framer_fail(hccl_framer_t *s, hcclResult_t res)
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
    if (s->tx_ctl)
        hccl_free(s->tx_ctl->cause);
    hccl_free(s->tx_ctl);
    s->tx_ctl = NULL;
    while (s->ctl_head) {
        hccl_ctl_t *c = s->ctl_head;
        s->ctl_head = c->next;
        hccl_free(c->cause);
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
    framer_free_spares(s); /* a failed framer holds nothing again */
}
