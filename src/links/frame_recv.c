/* The framer's receive side: posted receives, headers, payloads and the receive budget. */
#include <string.h>

#include "links/frame_impl.h"

/* Both sides name their collective: different ones at one sequence number is a usage error. */
static hcclResult_t framer_sig_mismatch(hccl_framer_t *s, uint64_t seq, uint32_t theirs,
                                        uint32_t ours)
{
    char a[96], b[96];

    hccl_sig_describe(theirs, a, sizeof(a));
    hccl_sig_describe(ours, b, sizeof(b));
    return HCCL_FAIL(hcclInvalidUsage,
                     "rank %d: collective mismatch at seq %llu: rank %d called %s, this rank %s "
                     "(every rank must call the same collectives in the same order)",
                     s->rank, (unsigned long long)seq, s->peer, a, b);
}

static bool sig_differs(uint32_t a, uint32_t b)
{
    return a && b && a != b;
}

/* Any receive of this sequence number whose collective differs from the frame's. */
static hcclResult_t framer_check_sig_posted(hccl_framer_t *s, const hccl_frame_t *f)
{
    for (hccl_xfer_t *x = s->posted.head; x; x = x->next)
        if (x->seq == f->seq && sig_differs(f->sig, x->sig))
            return framer_sig_mismatch(s, f->seq, f->sig, x->sig);
    return hcclSuccess;
}

static hcclResult_t framer_check_len(hccl_framer_t *s, const hccl_frame_t *f, const hccl_xfer_t *x)
{
    if (f->len == x->len)
        return hcclSuccess;
    return HCCL_FAIL(hcclInvalidUsage,
                     "rank %d: rank %d sent %llu bytes for seq %llu tag %u but %zu were expected "
                     "(do the ranks call the same collective with the same count and type?)",
                     s->rank, s->peer, (unsigned long long)f->len, (unsigned long long)f->seq,
                     f->tag, x->len);
}

hcclResult_t hccl_framer_post_recv(hccl_framer_t *s, hccl_xfer_t *x)
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
            return framer_fail_xfer(s, x, framer_sig_mismatch(s, x->seq, f.sig, x->sig));
        if (f.tag != x->tag)
            continue;
        framer_unexp_remove(s, prev, u);
        if (framer_check_len(s, &f, x) != hcclSuccess) {
            hccl_free(u->data);
            hccl_free(u);
            return framer_fail_xfer(s, x, hcclInvalidUsage);
        }
        if (f.type == HCCL_FRAME_RTS) {
            hccl_free(u);
            return framer_defer_rndv(s, &f, x);
        }
        framer_deliver(x, u->data);
        framer_unexp_free(s, u);
        s->rx_held -= x->len;
        x->moved = x->len;
        hccl_xfer_complete_later(s->reactor, x, hcclSuccess);
        framer_credit(s, x->len);
        return hcclSuccess;
    }
    if (s->peer_bye)
        return framer_fail_xfer(s, x, framer_peer_gone(s));
    hccl_xfer_queue_push(&s->posted, x);
    return hcclSuccess;
}

/* The peer finished every collective and closed: its EOF is no failure, but a wait on it is. */
static hcclResult_t framer_on_bye(hccl_framer_t *s)
{
    /* A goodbye that carries a result is a peer that failed first (hccl_framer_send_failure). */
    if (s->rx_hdr.tag != 0 && s->rx_hdr.tag < hcclNumResults)
        return HCCL_FAIL(hcclRemoteError,
                         "rank %d: rank %d failed first (%s) and closed its "
                         "connections; its error names the cause",
                         s->rank, s->peer, hcclGetErrorString((hcclResult_t)s->rx_hdr.tag));
    s->peer_bye = true;
    if (s->posted.head || s->await_fin.head)
        return framer_peer_gone(s);
    return hcclSuccess;
}

static hcclResult_t framer_on_header(hccl_framer_t *s)
{
    const hccl_frame_t *f = &s->rx_hdr;
    const char *why = hccl_frame_check(f, s->comm_id, s->io->rndv_read != NULL || s->pull_max > 0);
    hccl_xfer_t *x;

    if (why)
        return framer_protocol_error(s, why);
    switch (f->type) {
    case HCCL_FRAME_DATA:
    case HCCL_FRAME_ASK:
    case HCCL_FRAME_RTS:
        HCCL_CHECK(framer_check_sig_posted(s, f));
        x = hccl_xfer_queue_take(&s->posted, f->seq, f->tag);
        if (!x && f->type != HCCL_FRAME_RTS && s->park_unmatched && f->len >= FRAMER_PARK_MIN &&
            hccl_reactor_posts_pending(s->reactor)) {
            s->rx_parked = true;
            return hcclSuccess;
        }
        if (!x)
            return framer_hold(s, f->type != HCCL_FRAME_RTS);
        if (framer_check_len(s, f, x) != hcclSuccess)
            return framer_fail_xfer(s, x, hcclInvalidUsage);
        if (f->type == HCCL_FRAME_RTS)
            return framer_choose_pull(s, x) ? framer_pull(s, f, x) : framer_rndv(s, f, x);
        /* A pulled message is timed from its first byte: waiting for its turn is not its cost. */
        if (x->t0_ns) {
            x->t0_ns = hccl_now_ns();
            s->rx_cold = s->rx_wire_cold;
            /* The sender's copy, which the first byte does not show: see pull_max. */
            s->rx_sender_ps_per_byte =
                s->count_sender_copy && s->io->rndv_read && f->addr < FRAMER_SENDER_PS_MAX ? f->addr
                                                                                           : 0;
        }
        s->rx_xfer = x;
        s->rx_dst = x->buf;
        s->rx_left = x->len;
        s->rx_carry = 0;
        s->rx_in_payload = true;
        return hcclSuccess;
    case HCCL_FRAME_BYE:
        return framer_on_bye(s);
    case HCCL_FRAME_CREDIT:
        if (!s->tx_asking)
            return framer_protocol_error(s, "credit that was not asked for");
        s->tx_asking = false;
        return framer_on_credit(s, f->len);
    case HCCL_FRAME_CAUSE:
        framer_expect_cause(s);
        return hcclSuccess;
    case HCCL_FRAME_FIN:
    case HCCL_FRAME_NACK:
    case HCCL_FRAME_PULL:
        HCCL_CHECK(framer_on_credit(s, f->len));
        x = hccl_xfer_queue_take(&s->await_fin, f->seq, f->tag);
        if (!x)
            return framer_protocol_error(s, "acknowledges no offered message");
        if (f->type == HCCL_FRAME_PULL) {
            hccl_xfer_queue_push(&s->pulled, x);
            return hccl_framer_tx(s);
        }
        if (f->type == HCCL_FRAME_FIN) {
            x->moved = x->len;
            hccl_xfer_complete_later(s->reactor, x, hcclSuccess);
            return hcclSuccess;
        }
        /* The peer cannot read our memory: never offer it a large message again, and send this
         * one as DATA now (its receive is posted: as if pulled). */
        s->rndv_threshold = SIZE_MAX;
        hccl_xfer_queue_push(&s->pulled, x);
        return hccl_framer_tx(s);
    default:
        return framer_protocol_error(s, "unknown type"); /* not reached: checked above */
    }
}

static hcclResult_t framer_payload_in(hccl_framer_t *s);

/* The payload of the frame in rx_hdr is in; an ASK is answered with the credit of what was
 * delivered by then (frame.h, eager_cap). */
static hcclResult_t framer_on_payload_done(hccl_framer_t *s)
{
    bool ask = !s->rx_in_cause && s->rx_hdr.type == HCCL_FRAME_ASK;
    hcclResult_t res = framer_payload_in(s);

    return res == hcclSuccess && ask ? framer_queue_ctl(s, HCCL_FRAME_CREDIT, 0, 0) : res;
}

static hcclResult_t framer_payload_in(hccl_framer_t *s)
{
    s->rx_in_payload = false;
    if (s->rx_in_cause)
        return framer_on_cause(s);
    if (s->rx_xfer) {
        if (s->rx_xfer->t0_ns) {
            /* The two copies overlap (on two CPUs): the slower one is what pulling costs. */
            int64_t mine = hccl_now_ns() - s->rx_xfer->t0_ns;
            int64_t theirs = (int64_t)(s->rx_sender_ps_per_byte * s->rx_xfer->len / 1000);
            framer_way_sample(s, true, mine > theirs ? mine : theirs, s->rx_xfer->len,
                              s->rx_cold || s->rx_wire_cold);
        }
        size_t len = s->rx_xfer->len;
        s->rx_xfer->moved = len;
        hccl_xfer_complete_later(s->reactor, s->rx_xfer, hcclSuccess);
        s->rx_xfer = NULL;
        framer_credit(s, len);
        return hcclSuccess;
    } else {
        hccl_unexp_t *u = s->rx_unexp;
        /* Its receive may have been posted while the payload was still arriving. */
        hccl_xfer_t *x = hccl_xfer_queue_take(&s->posted, u->f.seq, u->f.tag);
        s->rx_unexp = NULL;
        if (x) {
            hcclResult_t res = framer_check_len(s, &u->f, x);
            size_t len = (size_t)u->f.len;
            if (res == hcclSuccess)
                framer_deliver(x, u->data);
            x->moved = x->len;
            hccl_xfer_complete_later(s->reactor, x, res);
            framer_unexp_free(s, u);
            s->rx_held -= len;
            if (res == hcclSuccess)
                framer_credit(s, len);
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
static hcclResult_t framer_rx_consume(hccl_framer_t *s, size_t *got_p)
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
    if (!hccl_framer_bounce(s))
        return hcclSystemError;
    want = s->rx_left - s->rx_carry;
    if (want > HCCL_FRAMER_BOUNCE - s->rx_carry)
        want = HCCL_FRAMER_BOUNCE - s->rx_carry;
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
static ssize_t framer_rx_read(hccl_framer_t *s, size_t want)
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

static hcclResult_t framer_rx_budget(hccl_framer_t *s, size_t max_bytes, size_t *total_p)
{
    size_t total = 0;
    hcclResult_t res = framer_run_rndv(s, max_bytes, &total);

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
                HCCL_CHECK(framer_on_payload_done(s));
                continue;
            }
            if (s->rx_xfer && s->rx_xfer->consume) {
                size_t got = 0;
                HCCL_CHECK(framer_rx_consume(s, &got));
                if (got == 0)
                    return hcclSuccess;
                total += got;
                *total_p = total;
                continue;
            }
            size_t want = s->rx_left;
            if (s->rx_unexp) {
                HCCL_CHECK(framer_unexp_room(s));
                if (want > s->rx_unexp->cap - ((size_t)s->rx_unexp->f.len - s->rx_left))
                    want = s->rx_unexp->cap - ((size_t)s->rx_unexp->f.len - s->rx_left);
            }
            n = framer_rx_read(s, want);
            if (n <= 0)
                return n < 0 ? hcclRemoteError : hcclSuccess;
            s->rx_dst += n;
            s->rx_left -= (size_t)n;
            total += (size_t)n;
            *total_p = total;
            if (s->rx_left == 0)
                HCCL_CHECK(framer_on_payload_done(s));
            continue;
        }
        if (s->rx_parked) {
            /* The queued completions run first; then the receive is posted, or never will be
             * before this message is out of the way: it is held. */
            if (hccl_reactor_posts_pending(s->reactor))
                return hcclInProgress;
            s->rx_parked = false;
            HCCL_CHECK(framer_on_header(s));
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
            HCCL_CHECK(framer_on_header(s));
            /* A single-copy read moves its whole message inside the header's handling: it
             * counts, or one call could read every offered message and hold the loop for ms. */
            total += s->rx_rndv_bytes;
            *total_p = total;
        }
    }
    return s->failed ? s->fail_res : hcclInProgress;
}

hcclResult_t hccl_framer_rx(hccl_framer_t *s, size_t max_bytes)
{
    size_t total = 0;
    hcclResult_t res = framer_rx_budget(s, max_bytes, &total);

    /* Once per call, not per read: the clock is read off the per-frame path. */
    if (total && s->activity)
        hccl_link_stamp(&s->activity->rx_ms);
    return res;
}
