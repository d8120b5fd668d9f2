/* The framer's held messages: those that arrive before their receive, and spare buffers. */
#include <string.h>

#include "links/frame_impl.h"

/* A held message is done with: its buffer is kept for the next ones, in place of a smaller one. */
void framer_unexp_free(hccl_framer_t *s, hccl_unexp_t *u)
{
    int min = 0;

    for (int i = 1; i < HCCL_FRAMER_SPARES; i++)
        if (s->spare_cap[i] < s->spare_cap[min])
            min = i;
    if (u->data && u->cap <= HCCL_FRAMER_SPARE_MAX && u->cap > s->spare_cap[min]) {
        hccl_free(s->spare[min]);
        s->spare[min] = u->data;
        s->spare_cap[min] = u->cap;
    } else {
        hccl_free(u->data);
    }
    hccl_free(u);
}

void framer_unexp_remove(hccl_framer_t *s, hccl_unexp_t *prev, hccl_unexp_t *u)
{
    if (prev)
        prev->next = u->next;
    else
        s->unexp_head = u->next;
    if (s->unexp_tail == u)
        s->unexp_tail = prev;
}

/* A held message's payload, all in memory, to its receive. */
void framer_deliver(hccl_xfer_t *x, const char *data)
{
    if (!x->len)
        return;
    if (x->consume)
        x->consume(x, 0, data, x->len);
    else
        memcpy(x->buf, data, x->len);
}

void framer_free_spares(hccl_framer_t *s)
{
    for (int i = 0; i < HCCL_FRAMER_SPARES; i++) {
        hccl_free(s->spare[i]);
        s->spare[i] = NULL;
        s->spare_cap[i] = 0;
    }
}

hcclResult_t framer_hold(hccl_framer_t *s, bool with_payload)
{
    hccl_unexp_t *u;

    if (with_payload) {
        /* A sender within the protocol never fails this: its DATA bytes not yet delivered,
         * these among them, stay within the cap (frame.h, eager_cap). */
        if (s->eager_cap && framer_offers_taken(s) && s->rx_held + s->rx_hdr.len > s->eager_cap)
            return HCCL_FAIL(hcclRemoteError,
                             "rank %d: rank %d sent %llu bytes that no receive has asked for "
                             "while %llu were held already, past the %zu bytes a peer may leave "
                             "held (HCCL_BUFFSIZE): it does not follow the flow control; closing "
                             "the connection",
                             s->rank, s->peer, (unsigned long long)s->rx_hdr.len,
                             (unsigned long long)s->rx_held, s->eager_cap);
        s->rx_held += s->rx_hdr.len;
    }
    u = hccl_calloc(1, sizeof(*u));
    if (!u)
        return HCCL_FAIL(hcclSystemError, "rank %d: out of memory holding a message", s->rank);
    u->f = s->rx_hdr;
    if (with_payload) {
        /* The buffer grows as the payload arrives (framer_unexp_room): a header alone, whatever
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
hcclResult_t framer_unexp_room(hccl_framer_t *s)
{
    hccl_unexp_t *u = s->rx_unexp;
    size_t got = (size_t)u->f.len - s->rx_left;

    if (got == 0 && !u->data) {
        int max = 0;
        for (int i = 1; i < HCCL_FRAMER_SPARES; i++)
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
        size_t cap = u->cap ? u->cap * 8 : HCCL_FRAMER_HOLD_FIRST;
        char *p;
        if (cap > u->f.len)
            cap = (size_t)u->f.len;
        p = hccl_realloc(u->data, cap);
        if (!p)
            return HCCL_FAIL(hcclSystemError,
                             "rank %d: out of memory holding %llu bytes from rank %d", s->rank,
                             (unsigned long long)u->f.len, s->peer);
        u->data = p;
        u->cap = cap;
    }
    s->rx_dst = u->data + got;
    return hcclSuccess;
}

bool hccl_framer_holds(const hccl_framer_t *s, uint64_t seq, uint32_t *sig)
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
