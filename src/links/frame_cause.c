/*
 * The framer's part in carrying a failure's root cause (base/cause.h): CAUSE frames, sent while
 * the connection stays open so that the peers can settle on one cause, and the failure goodbye
 * that carries it when a communicator closes its connections.
 */
#include <string.h>

#include "links/frame_impl.h"

void framer_expect_cause(hccl_framer_t *s)
{
    s->rx_in_cause = true;
    s->rx_dst = (char *)&s->rx_cause;
    s->rx_left = sizeof(s->rx_cause);
    s->rx_in_payload = true;
}

/* Checked like any bytes from the wire, then passed up. */
hcclResult_t framer_on_cause(hccl_framer_t *s)
{
    const char *why;

    s->rx_in_cause = false;
    if (!hccl_cause_accept(&s->rx_cause, s->nranks, &why))
        return framer_protocol_error(s, why);
    s->peer_caused = true;
    if (s->io->on_cause)
        s->io->on_cause(s, &s->rx_cause);
    return hcclSuccess;
}

hcclResult_t hccl_framer_send_cause(hccl_framer_t *s, const hccl_cause_t *c)
{
    hccl_ctl_t *ctl;

    if (s->failed || s->bye_sent)
        return hcclSuccess;
    ctl = hccl_calloc(1, sizeof(*ctl));
    if (ctl)
        ctl->cause = hccl_malloc(sizeof(*ctl->cause));
    if (!ctl || !ctl->cause) {
        hccl_free(ctl);
        return HCCL_FAIL(hcclSystemError, "rank %d: out of memory for a cause frame", s->rank);
    }
    *ctl->cause = *c;
    framer_fill(s, &ctl->f, HCCL_FRAME_CAUSE, 0, 0, sizeof(*c), 0);
    if (s->ctl_tail)
        s->ctl_tail->next = ctl;
    else
        s->ctl_head = ctl;
    s->ctl_tail = ctl;
    return hccl_framer_tx(s);
}

void hccl_framer_send_failure(hccl_framer_t *s, hcclResult_t res, const hccl_cause_t *c)
{
    hccl_frame_t f[2];
    hccl_cause_t copy;
    struct iovec iov[3] = {{&f[0], sizeof(f[0])}, {&copy, sizeof(copy)}, {&f[1], sizeof(f[1])}};

    /* Only between frames: a goodbye inside a half-written frame would be read as its bytes. */
    if (s->failed || s->tx_cur || s->tx_ctl || res == hcclSuccess)
        return;
    framer_fill(s, &f[1], HCCL_FRAME_BYE, 0, (uint32_t)res, 0, 0);
    if (!c || c->kind == HCCL_CAUSE_NONE) {
        (void)s->io->writev(s, &iov[2], 1); /* best effort: a short write ends as closing does */
        return;
    }
    /* The cause, then the goodbye that says our EOF follows: one write, so that a peer never
     * sees the goodbye without the cause. */
    copy = *c;
    framer_fill(s, &f[0], HCCL_FRAME_CAUSE, 0, 0, sizeof(copy), 0);
    (void)s->io->writev(s, iov, 3);
}
