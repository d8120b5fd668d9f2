/*
 * The framing engine shared by links whose wire is a byte stream (tcp
 * sockets, shm rings): frames carry (sequence number, tag, length) so that
 * transfers of different steps and collectives never mix, data that arrives
 * before its receive is held, and a malformed frame fails the connection.
 */
#ifndef HCCL_LINK_FRAME_H
#define HCCL_LINK_FRAME_H

#include <sys/uio.h>

#include "links/link.h"

#define HCCL_WIRE_MAGIC 0x4c434348u /* "HCCL" little-endian */
#define HCCL_WIRE_VERSION 2
/* Largest single message accepted from the wire (protects the unexpected-message allocation). */
#define HCCL_WIRE_MAX_LEN (1ull << 40)

enum {
    HCCL_FRAME_DATA = 1, /* len payload bytes follow; addr: see pull_max */
    HCCL_FRAME_RTS = 2,  /* single-copy offer: read len bytes at addr in the sender's memory */
    HCCL_FRAME_FIN = 3,  /* the receiver has read an RTS message; len: credit (eager_cap) */
    HCCL_FRAME_NACK = 4, /* the receiver cannot read it: send it as DATA; len: credit */
    HCCL_FRAME_BYE = 5,  /* the sender destroyed its communicator: its EOF is expected */
    HCCL_FRAME_PULL = 6, /* the receive of an RTS message is posted: send it as DATA; len: credit */
    HCCL_FRAME_ASK = 7,  /* DATA whose receiver answers CREDIT once it is in: see eager_cap */
    HCCL_FRAME_CAUSE = 8,  /* why the sender's communicator fails: a hccl_cause_t follows */
    HCCL_FRAME_CREDIT = 9, /* the answer to an ASK; len: credit */
};

typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint32_t tag;
    uint32_t sig;     /* the collective's signature (hccl_sig_make), 0 = none */
    uint64_t comm_id; /* the communicator: a frame of another one is rejected */
    uint64_t seq;
    uint64_t len;
    uint64_t addr;
} hccl_frame_t;

typedef struct hccl_framer hccl_framer_t;

typedef struct hccl_framer_io {
    /* Bytes read/written (> 0), 0 when it would block, < 0 on error (message recorded). */
    ssize_t (*read)(hccl_framer_t *s, void *buf, size_t len);
    ssize_t (*writev)(hccl_framer_t *s, const struct iovec *iov, int iovcnt);
    /* Single-copy read of an RTS message into x (optional). hcclUnsupported: fall back. */
    hcclResult_t (*rndv_read)(hccl_framer_t *s, const hccl_frame_t *f, hccl_xfer_t *x);
    /*
     * Asks for a hccl_framer_rx call soon, from the loop (optional): a receive posted after its
     * RTS arrived is then read there, within the receive budget, instead of inside the post.
     */
    void (*kick)(hccl_framer_t *s);
    /*
     * Optional pair: the next received bytes where they lie (contiguous; > 0 bytes, 0 when none
     * has arrived, < 0 on error, message recorded), then release of n of them. A receive with a
     * consume function then uses them in place instead of copying them out first.
     */
    ssize_t (*peek)(hccl_framer_t *s, const void **data);
    void (*advance)(hccl_framer_t *s, size_t n);
    /* The peer told why its communicator fails (a CAUSE frame, accepted). Optional. */
    void (*on_cause)(hccl_framer_t *s, const hccl_cause_t *c);
} hccl_framer_io_t;

typedef struct hccl_ctl {
    hccl_frame_t f;
    hccl_cause_t *cause; /* owned: a CAUSE frame's payload, else NULL */
    struct hccl_ctl *next;
} hccl_ctl_t;

/* First allocation for a message that arrives before its receive; then it grows x8. */
#define HCCL_FRAMER_HOLD_FIRST (64u << 10)
/*
 * Buffers of delivered held messages kept for the next ones (the largest, each at most
 * SPARE_MAX): a fresh one costs a page fault per 4 KiB, since large allocations are mapped
 * and unmapped again on free.
 */
#define HCCL_FRAMER_SPARES 4
#define HCCL_FRAMER_SPARE_MAX (1u << 20)

/*
 * Where a receive with a consume function stages what it cannot use in place: sized to stay in
 * a core's L2 cache next to the operands it is reduced with.
 */
#define HCCL_FRAMER_BOUNCE (256u << 10)

/* A receive whose RTS had arrived first: its single-copy read waits for hccl_framer_rx. */
typedef struct hccl_rndv {
    hccl_frame_t f;
    hccl_xfer_t *x;
    struct hccl_rndv *next;
} hccl_rndv_t;

typedef struct hccl_unexp {
    hccl_frame_t f;
    char *data; /* owned; DATA payload, NULL for RTS or while none has arrived */
    size_t cap; /* bytes allocated at data */
    struct hccl_unexp *next;
} hccl_unexp_t;

struct hccl_framer {
    const hccl_framer_io_t *io;
    hccl_reactor_t *reactor;        /* borrowed */
    hccl_link_activity_t *activity; /* borrowed: stamped when bytes move; NULL = not kept */
    void *transport;                /* borrowed: the link's connection */
    int rank;
    int peer;
    int nranks;            /* of the communicator: a peer's cause is checked against it */
    bool wire_broken;      /* the transport's read or write failed (EOF, reset) */
    uint64_t comm_id;      /* stamped on every frame and checked on arrival */
    size_t rndv_threshold; /* sends of at least this go RTS; SIZE_MAX = never */
    /*
     * An RTS message of at most this many bytes whose receive is posted may be pulled through
     * the wire (PULL, then DATA) instead of read single-copy: the sender's copy into the wire
     * runs on its own core, in parallel with the receiver's use of it. Which is faster depends
     * on where the two processes run (pulling wins where the cores share a cache and loses
     * where they do not, and that can change while a job runs: docs/performance.md): the receiver
     * times both ways (ns per byte, moving averages) and takes the faster, trying the other
     * now and then (the more rarely, the slower it was: frame_rndv.c) so that a change is seen;
     * such a probe's time replaces the other way's figure. 0 = never pull.
     * A pulled message is timed from its first byte (waiting for its turn is not its cost),
     * or by the sender's copy into the wire if that was slower: the two copies run at once,
     * but the first byte does not show the sender's where the wire publishes a frame once it
     * is written (a ring). The sender times its copies of pulled messages and sends the last
     * one's figure (ps per byte) in the next pulled DATA frame's addr, and the receiver uses it;
     * both only if count_sender_copy (a link with single copy, whose ranks each have a CPU of their
     * own: where they share one, the time includes turns off the CPU).
     */
    size_t pull_max;
    double pull_ns_per_byte; /* 0: not measured yet */
    double rndv_ns_per_byte;
    bool tx_timed;                  /* tx_cur answers a PULL and count_sender_copy: writes timed */
    int64_t tx_pull_ns;             /* spent writing tx_cur so far */
    bool tx_cold;                   /* those writes went through cold wire memory */
    double tx_pull_ns_per_byte;     /* our last copy of a pulled message into the wire */
    uint64_t rx_sender_ps_per_byte; /* the sender's figure, from rx_xfer's frame */
    bool rx_cold;                   /* the wire was cold at rx_xfer's first byte */
    /* Set by a transport whose wire is memory touched as it is first used (a ring): until
     * every byte of it has been written (tx) or read (rx) once, copies through it also fault
     * pages in, and are not timed. */
    bool tx_wire_cold;
    bool rx_wire_cold;
    bool count_sender_copy; /* see pull_max */
    unsigned pull_choices;  /* offers since the last probe of the slower way */
    int64_t pull_probe_ns;  /* when that was */
    /*
     * A transport whose unread bytes announce themselves again (a socket, level-triggered)
     * may leave a message that arrived before its receive where it is, rather than hold it,
     * while completions are still queued in the reactor: one of them usually posts that
     * receive, and the payload then lands in place instead of in a heap copy.
     */
    bool park_unmatched;
    bool rx_parked; /* rx_hdr read, its receive not posted yet, payload unread */
    /*
     * Flow control (0: none): the DATA bytes a sender has written and the receiver has not
     * credited back stay within eager_cap; a message that would pass it goes as an offer (RTS)
     * instead, whose send completes only once its receive is posted. The receiver credits what
     * it delivered to posted receives in the answers to offers (FIN, PULL, NACK: their len),
     * which the sender reads before its send completes: no frame of its own that a peer could
     * leave unread when it closes (a socket closed with unread bytes is reset, and the reset
     * can drop what the other side had not read yet). Past half the cap, one DATA message at a
     * time goes as ASK, which the receiver answers with a CREDIT once it is in: the credit
     * returns without holding any data back, where waiting for the cap holds the offered
     * message for a round trip although the receiver has long delivered the rest. A sender
     * reads the answer to its ASK before it closes a socket (tcp_shutdown). So what a receiver
     * holds for receives not posted yet stays under eager_cap bytes of payload per peer, however
     * far a sender runs ahead, and no plan can deadlock on it: every plan already runs on the sim
     * link, where a send completes only at its receive. A peer that sends past the cap anyway is
     * failed. Offers need a link that takes them (single copy or pulling); elsewhere there is no
     * cap.
     */
    size_t eager_cap;
    uint64_t tx_uncredited; /* DATA bytes written and not credited back yet */
    bool tx_asking;         /* an ASK is written and its CREDIT not read yet */
    uint64_t rx_held;       /* DATA bytes held for receives not posted yet */
    uint64_t rx_uncredited; /* DATA bytes delivered and not credited to the sender yet */
    bool failed;
    hcclResult_t fail_res;
    bool bye_sent;    /* we are closing gracefully */
    bool peer_bye;    /* the peer is closing gracefully */
    bool peer_caused; /* the peer sent a cause: its EOF is its failure, not a death */
    bool rx_in_cause; /* the payload being read is a CAUSE frame's, into rx_cause */
    hccl_cause_t rx_cause;
    /* transmit */
    hccl_xfer_queue_t txq; /* sends not yet fully written; head in progress */
    hccl_ctl_t *ctl_head;  /* control frames, sent before the next message */
    hccl_ctl_t *ctl_tail;
    hccl_ctl_t *tx_ctl;  /* control frame being written */
    hccl_xfer_t *tx_cur; /* send being written */
    hccl_frame_t tx_hdr;
    size_t tx_hdr_done;
    size_t tx_payload_done;
    hccl_xfer_queue_t await_fin; /* RTS sent, waiting for FIN/NACK/PULL */
    hccl_xfer_queue_t pulled;    /* RTS sent and pulled: their DATA goes out before new sends */
    /* receive */
    hccl_frame_t rx_hdr;
    size_t rx_hdr_got;
    bool rx_in_payload;
    char *rx_dst;
    size_t rx_left;
    hccl_xfer_t *rx_xfer; /* the receive being filled, or NULL */
    char *bounce;         /* owned, HCCL_FRAMER_BOUNCE bytes once a consume receive needs it */
    size_t rx_carry;      /* bytes of rx_xfer read into bounce and not consumed yet */
    char *spare[HCCL_FRAMER_SPARES]; /* owned: held messages' buffers, for the next ones */
    size_t spare_cap[HCCL_FRAMER_SPARES];
    size_t rx_rndv_bytes;     /* single-copy bytes read since last counted against the rx budget */
    hccl_unexp_t *rx_unexp;   /* the unexpected message being filled, or NULL */
    hccl_xfer_queue_t posted; /* receives without a message yet */
    hccl_unexp_t *unexp_head; /* messages without a receive yet, in arrival order */
    hccl_unexp_t *unexp_tail;
    hccl_rndv_t *rndv_head; /* reads to do at the next hccl_framer_rx, in posting order */
    hccl_rndv_t *rndv_tail;
};

/*
 * The checks of a frame header read from the wire that need no state: NULL if it may be
 * dispatched, else why not (magic, version, communicator, type, length).
 */
const char *hccl_frame_check(const hccl_frame_t *f, uint64_t comm_id, bool rndv_allowed);

void hccl_framer_init(hccl_framer_t *s, const hccl_framer_io_t *io, hccl_reactor_t *r,
                      void *transport, int rank, int peer, size_t rndv_threshold);
/* Queues x; writes what it can now. Failure means the connection is broken. */
hcclResult_t hccl_framer_post_send(hccl_framer_t *s, hccl_xfer_t *x);
hcclResult_t hccl_framer_post_recv(hccl_framer_t *s, hccl_xfer_t *x);
/* Writes until done or the wire is full. */
hcclResult_t hccl_framer_tx(hccl_framer_t *s);
/* Reads and dispatches until nothing is left, or max_bytes were read. */
hcclResult_t hccl_framer_rx(hccl_framer_t *s, size_t max_bytes);
bool hccl_framer_tx_pending(const hccl_framer_t *s);
/* Whether a message of collective seq arrived with no receive for it (its signature in *sig). */
bool hccl_framer_holds(const hccl_framer_t *s, uint64_t seq, uint32_t *sig);
/* The peer said goodbye and nothing waits on it: its EOF is a clean close, not a failure. */
bool hccl_framer_closed_cleanly(const hccl_framer_t *s);
/* Queues the goodbye of a graceful close (then hccl_framer_tx flushes it). */
hcclResult_t hccl_framer_send_bye(hccl_framer_t *s);
/*
 * Before closing after a failure: tells the peer, in one non-blocking write between frames, that
 * this side failed with res and why (c, may be NULL: frame_cause.c), so that the peer reports
 * the root cause rather than a vanished process.
 */
void hccl_framer_send_failure(hccl_framer_t *s, hcclResult_t res, const hccl_cause_t *c);
/* Queues a CAUSE frame (the connection stays open: the peer may answer with its own). */
hcclResult_t hccl_framer_send_cause(hccl_framer_t *s, const hccl_cause_t *c);
/* Fails every transfer (completion deferred) and drops held messages. Idempotent. */
void hccl_framer_fail(hccl_framer_t *s, hcclResult_t res);
/* Frees what the framer owns beyond its queues (call after hccl_framer_fail or a clean close). */
void hccl_framer_fini(hccl_framer_t *s);
/* The framer's bounce buffer (allocated on first use), or NULL (message recorded). */
char *hccl_framer_bounce(hccl_framer_t *s);

#endif /* HCCL_LINK_FRAME_H */
