/*
 * What the framer's files (frame*.c) share and the links do not use: its tuning constants
 * and the functions one part of it calls in another.
 */
#ifndef HCCL_LINK_FRAME_IMPL_H
#define HCCL_LINK_FRAME_IMPL_H

#include "links/frame.h"

/*
 * The slower way of an offer that may be pulled is tried again after at least this many
 * offers and FRAMER_PULL_PROBE_NS times the square of how much slower it was (at most
 * FRAMER_PULL_PROBE_NS_MAX; see pull_max). A probe costs far more than its own time: while
 * pulling is much slower, even rare pulled messages slow the whole connection down markedly
 * (docs/performance.md).
 */
#define FRAMER_PULL_PROBE 16
#define FRAMER_PULL_PROBE_NS 5000000.0
#define FRAMER_PULL_PROBE_NS_MAX 50000000.0
/* Transfers shorter than this are not timed: fixed costs would swamp the per-byte figure. */
#define FRAMER_TIMED_MIN (32u << 10)
/* A sender's copy cost of this many ps per byte or more (1 MB/s) is not believed. */
#define FRAMER_SENDER_PS_MAX 1000000u
/* Smaller messages are held at once: a copy of them costs less than another turn. */
#define FRAMER_PARK_MIN (64u << 10)

hcclResult_t framer_protocol_error(hccl_framer_t *s, const char *what);
hcclResult_t framer_fail_xfer(hccl_framer_t *s, hccl_xfer_t *x, hcclResult_t res);
hcclResult_t framer_peer_gone(hccl_framer_t *s);
void framer_fill(const hccl_framer_t *s, hccl_frame_t *f, uint16_t type, uint64_t seq, uint32_t tag,
                 uint64_t len, uint64_t addr);
hcclResult_t framer_queue_ctl(hccl_framer_t *s, uint16_t type, uint64_t seq, uint32_t tag);
/* Whether the peer takes offers (RTS), and so whether eager_cap applies on this link. */
bool framer_offers_taken(const hccl_framer_t *s);
/* len DATA bytes reached their receive: credited back in the next answer to an offer. */
void framer_credit(hccl_framer_t *s, size_t len);
/* An answer to our offer credited len bytes back. */
hcclResult_t framer_on_credit(hccl_framer_t *s, uint64_t len);
void framer_way_sample(hccl_framer_t *s, bool pulled, int64_t ns, size_t len, bool cold);
bool framer_choose_pull(hccl_framer_t *s, const hccl_xfer_t *x);
hcclResult_t framer_pull(hccl_framer_t *s, const hccl_frame_t *f, hccl_xfer_t *x);
hcclResult_t framer_rndv(hccl_framer_t *s, const hccl_frame_t *f, hccl_xfer_t *x);
hcclResult_t framer_defer_rndv(hccl_framer_t *s, const hccl_frame_t *f, hccl_xfer_t *x);
hcclResult_t framer_run_rndv(hccl_framer_t *s, size_t max_bytes, size_t *total_p);
void framer_unexp_free(hccl_framer_t *s, hccl_unexp_t *u);
void framer_unexp_remove(hccl_framer_t *s, hccl_unexp_t *prev, hccl_unexp_t *u);
void framer_deliver(hccl_xfer_t *x, const char *data);
hcclResult_t framer_hold(hccl_framer_t *s, bool with_payload);
hcclResult_t framer_unexp_room(hccl_framer_t *s);
void framer_free_spares(hccl_framer_t *s);
/* frame_cause.c: a CAUSE frame's header arrived (its payload is read next) / its payload did. */
void framer_expect_cause(hccl_framer_t *s);
hcclResult_t framer_on_cause(hccl_framer_t *s);

#endif /* HCCL_LINK_FRAME_IMPL_H */
