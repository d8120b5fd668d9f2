/*
 * Links move bytes between two ranks. Each transport is one const vtable;
 * a link knows transfers (sequence number, tag, buffer), never collectives.
 */
#ifndef HCCL_LINK_H
#define HCCL_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "base/cause.h"
#include "reactor/reactor.h"

enum {
    HCCL_LINK_SHM = 0,
    HCCL_LINK_TCP = 1,
    HCCL_LINK_SIM = 2,
    HCCL_LINK_RDMA = 3, /* a card slot in every build; registered only with HCCL_WITH_RDMA */
    HCCL_LINK_MAX = 4
};

#define HCCL_SECRET_BYTES 32
#define HCCL_CARD_BLOB_BYTES 112
#define HCCL_HOST_ID_BYTES 96
#define HCCL_CARD_CTL_BYTES 24

/*
 * What each rank publishes at bootstrap. Fixed-width fields: it travels as
 * bytes between processes of the same build.
 */
typedef struct hccl_card {
    uint32_t rank;
    uint32_t pid;
    uint32_t links;                                   /* bit per HCCL_LINK_* offered */
    uint32_t pinned_cpu;                              /* 1 + the one CPU it may run on; 0: several */
    uint32_t cpus;                                    /* how many CPUs it may run on */
    uint32_t reserved;                                /* zero */
    uint64_t config_hash;                             /* settings that shape plans: must agree */
    uint64_t pid_ns;                                  /* inode of its pid namespace, 0: unknown */
    uint8_t ctl[HCCL_CARD_CTL_BYTES];                 /* its control listener (core/shrink.h) */
    char host[HCCL_HOST_ID_BYTES];                    /* host identity, NUL-terminated */
    uint8_t blob[HCCL_LINK_MAX][HCCL_CARD_BLOB_BYTES]; /* per link: its listen address etc. */
} hccl_card_t;

/* What a link gets from the communicator (borrowed for the link's lifetime). */
typedef struct hccl_link_env {
    int rank;
    int nranks;
    uint64_t comm_id;
    uint8_t secret[HCCL_SECRET_BYTES];
    hccl_reactor_t *reactor;
    const hccl_params_t *params;
    const hccl_card_t *cards;       /* [nranks], valid from connect() on */
    /* A connection broke: the communicator fails every request and aborts the links. */
    void (*on_fatal)(void *arg, hcclResult_t res, const char *msg);
    void *fatal_arg;
    /*
     * Optional, reactor thread: a root cause heard on a connection (a peer's cause frame), or a
     * peer that went away without a goodbye (a LOST cause). Called before on_fatal.
     */
    void (*on_cause)(void *arg, const hccl_cause_t *c);
    /* Borrowed: the communicator's root cause, sent in the goodbyes of abort (kind NONE: none). */
    const hccl_cause_t *cause;
    /* During connect() only: readable once the rendezvous has called the set-up off (another
     * rank failed), and connect() then fails at once instead of waiting for that rank; -1:
     * nothing to watch. */
    int setup_watch_fd;
    /* Set by connect() when it fails because a peer's process ended: that peer; else -1. */
    int setup_gone;
} hccl_link_env_t;

typedef struct hccl_xfer hccl_xfer_t;
typedef void (*hccl_xfer_cb_t)(hccl_xfer_t *x, hcclResult_t res);

/* One send or receive, owned by its poster until done() runs. */
struct hccl_xfer {
    uint64_t seq;           /* collective sequence number */
    uint32_t tag;           /* step tag; sender and receiver agree */
    uint32_t sig;           /* the collective's signature, 0 = not checked */
    int peer;
    void *buf;              /* borrowed user or scratch memory */
    size_t len;             /* bytes */
    hccl_xfer_cb_t done;    /* runs once, on the reactor thread, never inside post_* */
    void *arg;
    /*
     * Receives only, optional (links with recv_consume): instead of writing buf, the link hands
     * the payload to consume in order, in pieces of whole units (unit divides len), as it
     * arrives, so that it is used (reduced) while in cache rather than stored and read again.
     */
    void (*consume)(hccl_xfer_t *x, size_t off, const void *data, size_t len);
    size_t unit;
    /* Receives: a result larger than the cache. Links whose copy out of their wire is their
     * own (the shm ring, sim) write buf with stores that bypass the cache (hccl_store_copy);
     * the kernel's copies (tcp, single-copy reads) and held messages do as before. */
    bool store;
    /* Receives: an offered message is read single-copy, not pulled through the wire, whatever
     * the link's timing of the two ways says (frame.h, pull_max). */
    bool read_direct;
    /* Sends: the sender writes buf again soon (a result, scratch, what the next call writes):
     * links with a single-copy read send it through their wire instead of offering it, as the
     * peer's read would take the lines from this CPU's cache just before they are written
     * back (docs/performance.md). Messages the flow control holds back are offered still. */
    bool rewritten;
    /* link-private */
    hccl_xfer_t *next;
    size_t moved;           /* bytes moved when done (checked by the link tests) */
    hcclResult_t res;
    hccl_post_t post;       /* deferred completion */
    int64_t t0_ns;          /* when a transfer the link times started (0: not timed) */
};

/*
 * When bytes last moved on a connection, in hccl_link_clock_ms() milliseconds (0: never).
 * Written by whoever runs the reactor, read by diagnostics from any thread.
 */
typedef struct {
    _Atomic int64_t tx_ms;
    _Atomic int64_t rx_ms;
} hccl_link_activity_t;

/* A cheap monotonic clock (coarse: a few ms) for the activity stamps. */
int64_t hccl_link_clock_ms(void);
static inline void hccl_link_stamp(_Atomic int64_t *at_x)
{
    atomic_store_explicit(at_x, hccl_link_clock_ms(), memory_order_relaxed);
}

typedef struct hccl_conn {
    const struct hccl_link_ops *ops;
    void *ctx;              /* borrowed: the link's per-communicator context */
    int peer;
    void *priv;             /* owned by the link */
    hccl_link_activity_t activity;
} hccl_conn_t;

typedef struct hccl_link_ops {
    size_t size;
    const char *name;
    int id;                 /* HCCL_LINK_* */
    /* Before the card exchange: open listeners/segments, describe them in blob. */
    hcclResult_t (*init)(hccl_link_env_t *env, void *blob, void **ctx_p);
    /* Whether this link can join me and peer (shm: same host). */
    bool (*reaches)(const hccl_card_t *me, const hccl_card_t *peer);
    /*
     * Blocking set-up with the peers listed (every one of them must call too),
     * by deadline_ms; fills conns[peer] for each. Events are registered in the
     * reactor before it returns.
     */
    hcclResult_t (*connect)(void *ctx, const int *peers, int npeers, int64_t deadline_ms,
                            hccl_conn_t **conns);
    /* Every rank has connected (optional). */
    void (*ready)(void *ctx);
    /* Reactor thread. Never blocks; completion comes later through x->done. */
    hcclResult_t (*post_send)(hccl_conn_t *c, hccl_xfer_t *x);
    hcclResult_t (*post_recv)(hccl_conn_t *c, hccl_xfer_t *x);
    /* Reactor thread: fails every pending transfer with res and closes connections. */
    void (*abort)(void *ctx, hcclResult_t res);
    /*
     * Graceful close, with the reactor stopped and nothing in flight: tells every peer
     * that we are done (so that our EOF is not taken for a death) and flushes, by deadline_ms.
     */
    void (*shutdown)(void *ctx, int64_t deadline_ms);
    /* Frees everything (the reactor is no longer running). */
    void (*fini)(void *ctx);
    /*
     * Reactor thread (fault injection): closes the connection to peer at once, as a cut cable
     * would. Its transfers fail with hcclRemoteError and the communicator is told (on_fatal);
     * the peer sees the connection end. Optional.
     */
    void (*close)(void *ctx, int peer);
    /* Receives may carry a consume function (see hccl_xfer_t). */
    bool recv_consume;
    /* Reactor thread: sends c to every connected peer, keeping the connections open. Optional. */
    void (*notify)(void *ctx, const hccl_cause_t *c);
    uint32_t caps;          /* HCCL_LINK_CAP_* */
    const struct hccl_window_ops *window; /* with HCCL_LINK_CAP_WINDOW (see below) */
} hccl_link_ops_t;

enum { HCCL_LINK_CAP_WINDOW = 1u << 0 };

#define HCCL_LINK_HAS_OP(ops_x, op_x)                                                    \
    ((ops_x)->size >= offsetof(hccl_link_ops_t, op_x) + sizeof((ops_x)->op_x) &&         \
     (ops_x)->op_x != NULL)

/* The unit a consuming receive's pieces come in: x->unit, or bytes where it does not divide len. */
static inline size_t hccl_xfer_unit(const hccl_xfer_t *x)
{
    return x->unit && x->len % x->unit == 0 ? x->unit : 1;
}

/* Whether c's link takes receives with a consume function. */
static inline bool hccl_conn_consumes(const hccl_conn_t *c)
{
    return c->ops->size >= offsetof(hccl_link_ops_t, recv_consume) + sizeof(bool) &&
           c->ops->recv_consume;
}

/* The registry in preference order, filtered by HCCL_LINKS ("" = all). */
const hccl_link_ops_t *hccl_link_by_id(int id);
bool hccl_link_allowed(const char *links, const char *name);
/* connect()'s answer when the rendezvous has called the link set-up off (env->setup_watch_fd
 * became readable: another rank failed). Every link polls that fd beside its own; poll
 * ignores it while it is -1. */
hcclResult_t hccl_link_setup_called_off(const hccl_link_env_t *env, const char *link);

/* Completes x with res from the loop (never on the caller's stack). */
void hccl_xfer_complete_later(hccl_reactor_t *r, hccl_xfer_t *x, hcclResult_t res);

/* FIFO of transfers. */
typedef struct {
    hccl_xfer_t *head;
    hccl_xfer_t *tail;
} hccl_xfer_queue_t;
void hccl_xfer_queue_push(hccl_xfer_queue_t *q, hccl_xfer_t *x);
hccl_xfer_t *hccl_xfer_queue_pop(hccl_xfer_queue_t *q);
/* Removes and returns the first transfer with (seq, tag), or NULL. */
hccl_xfer_t *hccl_xfer_queue_take(hccl_xfer_queue_t *q, uint64_t seq, uint32_t tag);

extern const hccl_link_ops_t hccl_link_shm_ops;
extern const hccl_link_ops_t hccl_link_tcp_ops;
#ifdef HCCL_WITH_RDMA
extern const hccl_link_ops_t hccl_link_rdma_ops;
#endif

/*
 * ---- the window capability (HCCL_LINK_CAP_WINDOW): memory every rank of a group that the link
 * reaches in full can read in place. In each round every rank publishes one block in its window,
 * and maybe a part and flags, that every other rank reads where it lies: no transfer, no
 * matching. Rounds take turns in two slots, so a rank may publish round k only once it has
 * finished k - 1 (read every block and part of it): then everyone has read what k - 2 left in
 * the slot it reuses. A block carries the sequence number and signature of the transfer it
 * stands for, so readers can tell that two ranks called different things. Reactor thread (or
 * whoever drives it).
 */
/* The largest block: two slots of it and of a part per rank are reserved, and touched only as
 * far as rounds reach. */
#define HCCL_WINDOW_CAP (16u << 20)
#define HCCL_WINDOW_PART_CAP (HCCL_WINDOW_CAP / 2 + 64) /* the largest part */
#define HCCL_WINDOW_WORDS 32 /* words that rank 0 writes and every rank reads */
enum { HCCL_WINDOW_PART = 0, HCCL_WINDOW_GPART = 1 }; /* a slot's flags besides its block's */

typedef struct hccl_window_ops {
    /* Whether this context's window reaches every other rank of nranks. */
    bool (*reaches_all)(void *ctx, int nranks);
    /* rank's block of round: where we write ours, or read a peer's once published. */
    void *(*block)(void *ctx, int rank, uint64_t round);
    /* Publishes our block of round, labelled with (seq, sig); peers that sleep are rung.
     * direct: the block is not in the slot but at this address of ours, which peers read
     * single-copy (only where direct_ok) and release by our PART flag. */
    void (*publish)(void *ctx, uint64_t round, uint64_t seq, uint32_t sig, const void *direct);
    /* Whether rank has published its block of round; if so, its label. */
    bool (*published)(void *ctx, int rank, uint64_t round, uint64_t *seq, uint32_t *sig);
    /* Whether every rank has found that it can read every other's memory single-copy. */
    bool (*direct_ok)(void *ctx);
    /* Whether rank's published block of round is read single-copy from its memory. */
    bool (*is_direct)(void *ctx, int rank, uint64_t round);
    /* Copies len bytes at off of rank's published block of round to dst, wherever it is. */
    hcclResult_t (*read)(void *ctx, int rank, uint64_t round, size_t off, void *dst, size_t len);
    /* rank's part of round (up to HCCL_WINDOW_PART_CAP bytes). */
    void *(*part)(void *ctx, int rank, uint64_t round);
    /* Raises our flag (HCCL_WINDOW_PART or _GPART) of round; peers that sleep are rung. */
    void (*raise)(void *ctx, int flag, uint64_t round);
    bool (*raised)(void *ctx, int rank, int flag, uint64_t round);
    /* Rank 0's words: set_word is ordered before rank 0's next publication. */
    uint64_t (*word)(void *ctx, int idx);
    void (*set_word)(void *ctx, int idx, uint64_t word);
    /* Whether a message of transfer seq from rank has arrived (it was sent as a transfer, not
     * through the window); if so, its signature. */
    bool (*holds)(void *ctx, int rank, uint64_t seq, uint32_t *sig);
    /* fn(arg) runs on the reactor whenever a peer may have published (after a doorbell). */
    void (*on_bell)(void *ctx, bool (*fn)(void *arg), void *arg);
    /* Memory the window may take where it is reserved but not yet touched: where the host could
     * run out of it at reach bytes per block (0: no rounds), warns, with the figures. */
    void (*check_room)(void *ctx, size_t reach);
} hccl_window_ops_t;

/* ops' window, where it has the capability; else NULL. */
static inline const hccl_window_ops_t *hccl_link_window(const hccl_link_ops_t *ops)
{
    return ops->size >= offsetof(hccl_link_ops_t, window) + sizeof(ops->window) &&
                   (ops->caps & HCCL_LINK_CAP_WINDOW)
               ? ops->window
               : NULL;
}

/* ---- sim: every rank in one process, for unit tests ---- */
typedef struct hccl_sim_world hccl_sim_world_t;
hcclResult_t hccl_sim_world_create(hccl_reactor_t *r, int nranks, hccl_sim_world_t **w_p);
void hccl_sim_world_destroy(hccl_sim_world_t *w);
/* conns[peer] for rank (NULL at rank itself); owned by the world. */
hccl_conn_t **hccl_sim_world_conns(hccl_sim_world_t *w, int rank);
/* Bytes rank has sent so far. */
uint64_t hccl_sim_bytes_sent(const hccl_sim_world_t *w, int rank);
/* Bytes rank has received so far into receives with xfer.store (copied with hccl_store_copy). */
uint64_t hccl_sim_bytes_stored(const hccl_sim_world_t *w, int rank);
/* Bytes rank has received so far into receives with xfer.read_direct. */
uint64_t hccl_sim_bytes_read_direct(const hccl_sim_world_t *w, int rank);
/* rank's window context (for hccl_sim_window_ops), owned by the world; NULL without memory. */
extern const hccl_window_ops_t hccl_sim_window_ops;
void *hccl_sim_world_window(hccl_sim_world_t *w, int rank);
/* Runs the on_bell hook of every rank that a publication or flag rang since its hook last
 * ran (sim has no doorbells: whoever drives the world rings); true if any hook moved. */
bool hccl_sim_world_ring(hccl_sim_world_t *w);

#endif /* HCCL_LINK_H */
