/* The framer's rendezvous: single-copy reads of offered (RTS) messages, or pulling them
 * as DATA, whichever the receiver has timed faster. */
#include <string.h>

#include "links/frame_impl.h"

/* A moving average; a probe's sample (probe: the way not preferred) replaces it, so that one
 * probe is enough to see a change. */
static void framer_cost_sample(double *avg, int64_t ns, size_t len, bool probe)
{
    double v = (double)(ns > 0 ? ns : 1) / (double)len;

    *avg = *avg > 0 && !probe ? 0.75 * *avg + 0.25 * v : v;
}

/*
 * A way's time for len bytes (pulled or single-copy). Not taken if the copy went through wire
 * memory used for the first time (tx_wire_cold, rx_wire_cold): that costs a page fault per
 * page, several times the copy (docs/performance.md), which no later use pays; a probe that
 * did is tried again soon. A probe's time replaces the figure (framer_cost_sample).
 */
void framer_way_sample(hccl_framer_t *s, bool pulled, int64_t ns, size_t len, bool cold)
{
    double *fig = pulled ? &s->pull_ns_per_byte : &s->rndv_ns_per_byte;
    double other = pulled ? s->rndv_ns_per_byte : s->pull_ns_per_byte;
    bool probe = other > 0 && other < *fig;

    if (len < FRAMER_TIMED_MIN)
        return;
    if (cold) {
        if (probe)
            s->pull_probe_ns = 0;
        return;
    }
    framer_cost_sample(fig, ns, len, probe);
}

/* Whether to pull the message offered to x rather than read it single-copy. */
bool framer_choose_pull(hccl_framer_t *s, const hccl_xfer_t *x)
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
    ratio = pull ? s->rndv_ns_per_byte / s->pull_ns_per_byte
                 : s->pull_ns_per_byte / s->rndv_ns_per_byte;
    gap_ns = FRAMER_PULL_PROBE_NS * ratio * ratio;
    if (++s->pull_choices < FRAMER_PULL_PROBE)
        return pull;
    now = hccl_now_ns();
    if (now - s->pull_probe_ns <
        (gap_ns < FRAMER_PULL_PROBE_NS_MAX ? gap_ns : FRAMER_PULL_PROBE_NS_MAX))
        return pull;
    s->pull_choices = 0;
    s->pull_probe_ns = now;
    return !pull;
}

/* Asks for an offered message as DATA: x stays posted, its payload comes next. */
hcclResult_t framer_pull(hccl_framer_t *s, const hccl_frame_t *f, hccl_xfer_t *x)
{
    x->t0_ns = hccl_now_ns();
    hccl_xfer_queue_push(&s->posted, x);
    return framer_queue_ctl(s, HCCL_FRAME_PULL, f->seq, f->tag);
}

/* Hands an RTS message to the transport's single-copy read; falls back to DATA on refusal. */
hcclResult_t framer_rndv(hccl_framer_t *s, const hccl_frame_t *f, hccl_xfer_t *x)
{
    hcclResult_t res;
    int64_t t0 = hccl_now_ns();

    res = s->io->rndv_read ? s->io->rndv_read(s, f, x) : hcclUnsupported;

    if (res == hcclSuccess) {
        framer_way_sample(s, false, hccl_now_ns() - t0, x->len, false);
        x->moved = x->len;
        s->rx_rndv_bytes += x->len;
        if (s->activity)
            hccl_link_stamp(&s->activity->rx_ms);
        hccl_xfer_complete_later(s->reactor, x, hcclSuccess);
        return framer_queue_ctl(s, HCCL_FRAME_FIN, f->seq, f->tag);
    }
    if (res != hcclUnsupported)
        return framer_fail_xfer(s, x, res);
    /* Keep the receive posted: the payload comes again as DATA. */
    x->next = s->posted.head;
    s->posted.head = x;
    if (!s->posted.tail)
        s->posted.tail = x;
    return framer_queue_ctl(s, HCCL_FRAME_NACK, f->seq, f->tag);
}

/*
 * A receive posted after its RTS: read it from the loop (hccl_framer_rx), where it counts against
 * the receive budget, rather than inside the post, where a drive posting many receives would
 * read them all in one go.
 */
hcclResult_t framer_defer_rndv(hccl_framer_t *s, const hccl_frame_t *f, hccl_xfer_t *x)
{
    hccl_rndv_t *d;

    if (framer_choose_pull(s, x))
        return framer_pull(s, f, x);
    if (!s->io->kick)
        return framer_rndv(s, f, x);
    d = hccl_calloc(1, sizeof(*d));
    if (!d)
        return framer_fail_xfer(s, x,
                                HCCL_FAIL(hcclSystemError, "rank %d: out of memory", s->rank));
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
hcclResult_t framer_run_rndv(hccl_framer_t *s, size_t max_bytes, size_t *total_p)
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
        HCCL_CHECK(framer_rndv(s, &f, x));
        *total_p += s->rx_rndv_bytes;
    }
    return hcclSuccess;
}
