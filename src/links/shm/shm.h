/*
 * shm: ranks on one host. Each rank owns a segment holding one ring per
 * sender; a sender writes frames into its ring in the receiver's segment and
 * rings the receiver's eventfd doorbell. Large messages go single-copy: the
 * receiver reads the sender's buffer with process_vm_readv.
 */
#ifndef HCCL_LINK_SHM_H
#define HCCL_LINK_SHM_H

#include <event2/event.h>
#include <sys/types.h>

#include "links/frame.h"

#define SHM_NAME_BYTES 40

typedef struct {
    char seg[SHM_NAME_BYTES];  /* shm_open name of the rank's receive segment */
    char uds[SHM_NAME_BYTES];  /* abstract unix socket name for the doorbell hand-over */
    uint64_t ring_bytes;
    uint64_t seg_addr;         /* where the segment is mapped in its owner: a single-copy probe */
} shm_card_t;

#define SHM_HELLO_MAGIC 0x4c4c4542u /* "BELL" */

/* What a peer sends with its doorbell. */
typedef struct {
    uint32_t magic;
    uint32_t rank;
    uint64_t comm_id;
    uint8_t secret[HCCL_SECRET_BYTES];
} shm_hello_t;

/* One single-producer single-consumer byte ring. */
typedef struct {
    _Alignas(64) _Atomic uint64_t head;          /* bytes written, producer-owned */
    _Alignas(64) _Atomic uint64_t tail;          /* bytes consumed, consumer-owned */
    _Alignas(64) _Atomic uint32_t producer_waiting; /* the producer found the ring full */
} shm_ring_hdr_t;

#define SHM_RING_HDR_BYTES 256
#define SHM_SEG_HDR_BYTES 4096

/* The head of a rank's receive segment. */
typedef struct {
    _Alignas(64) _Atomic uint32_t polling; /* its progress thread spins: senders need not ring */
    _Alignas(64) _Atomic uint32_t reads_all; /* its owner can read every local peer's memory */
    /* rank 0's window words (hccl_window_ops_t.word) */
    _Alignas(64) _Atomic uint64_t words[HCCL_WINDOW_WORDS];
} shm_seg_hdr_t;

/*
 * The window (shm_window.c): two slots after the segment's head, used in turn by rounds.
 * The owner writes its block and then seq; the round shares the block's first cache line, so
 * that a reader of a small block waits on one line only. part holds what the owner publishes
 * by its PART flag (part_seq); GPART (gpart_seq) is a flag without memory of its own.
 */
typedef struct {
    _Alignas(64) _Atomic uint64_t seq; /* 1 + the round whose block data holds; 0: none */
    uint64_t label_seq;                /* its label: the transfer's sequence number and */
    uint32_t sig;                      /* signature, which every reader compares with its own */
    uint32_t reserved;
    uint64_t addr;                     /* nonzero: the block is at this address in the owner,
                                        * read single-copy, and data is unused */
    unsigned char data[HCCL_WINDOW_CAP];
    _Alignas(64) _Atomic uint64_t part_seq;
    _Alignas(64) _Atomic uint64_t gpart_seq;
    _Alignas(64) unsigned char part[HCCL_WINDOW_PART_CAP];
} shm_window_slot_t;

#define SHM_WINDOW_AREA_BYTES ((2 * sizeof(shm_window_slot_t) + 4095) & ~(size_t)4095)
/* Where the rings start in a segment. */
#define SHM_RINGS_OFFSET (SHM_SEG_HDR_BYTES + SHM_WINDOW_AREA_BYTES)

typedef struct shm_conn {
    hccl_conn_t conn;          /* conn.priv points back here */
    struct shm_ctx *ctx;       /* borrowed */
    void *peer_seg;            /* owned mapping of the peer's segment */
    size_t peer_seg_bytes;
    shm_ring_hdr_t *tx_ring;   /* in the peer's segment, our slot */
    shm_ring_hdr_t *rx_ring;   /* in our segment, the peer's slot */
    uint64_t tx_tail_seen;     /* tx_ring's tail when last read: re-read only when short of room,
                                * so that its cache line does not cross cores on every message */
    int peer_bell;             /* owned: the peer's doorbell eventfd */
    int out_fd;                /* owned: our connection to the peer (EOF = it died) */
    int in_fd;                 /* owned: the peer's connection to us */
    struct event *live_ev;
    pid_t pid;
    hccl_framer_t framer;
} shm_conn_t;

typedef struct shm_ctx {
    hccl_link_env_t *env;      /* borrowed */
    char seg_name[SHM_NAME_BYTES];
    bool seg_linked;           /* the name still exists in /dev/shm */
    void *seg;                 /* owned mapping */
    size_t seg_bytes;
    size_t ring_bytes;         /* capacity of each ring (HCCL_BUFFSIZE) */
    size_t ring_used;          /* bytes of it in use: see shm_ring_window */
    size_t room;               /* /dev/shm's free bytes at set-up, before any rank's rings */
    bool room_known;
    int uds_fd;                /* listener, closed once every peer is in */
    int bell_fd;               /* our doorbell */
    struct event *bell_ev;
    struct event *more_ev;     /* zero timeout: the rings' budget ran out, continue next turn */
    shm_conn_t **conns;        /* [nranks], owned */
    int *active;               /* ranks with a connection */
    int nactive;
    bool (*bell_hook)(void *arg); /* runs after the rings at each doorbell (the window's reader) */
    bool window_direct;        /* every local rank reads every other's memory (seen once) */
    void *bell_hook_arg;
} shm_ctx_t;

size_t hccl_shm_slot_bytes(size_t ring_bytes);
/* Rings a doorbell eventfd (fd < 0: closed, nothing to ring). */
void hccl_shm_ring_bell(int fd);
/* Bytes held by a ring of size bytes whose counters read head and tail; false if impossible. */
bool hccl_shm_ring_used(uint64_t head, uint64_t tail, size_t size, size_t *used);
/* A peer's card from the rank table: NULL if usable, else why not. */
const char *hccl_shm_card_check(const shm_card_t *card, size_t ring_bytes);
/* A doorbell hello from a local process: true only with this communicator's id and secret. */
bool hccl_shm_hello_ok(const shm_hello_t *h, uint64_t comm_id, const uint8_t *secret, int nranks);
/* A new segment name that says who made it (shm_seg.c). */
hcclResult_t hccl_shm_seg_name(char *out, size_t len);
/* The bytes /dev/shm has free (*room_p); false where that cannot be read. */
bool hccl_shm_room(size_t *room_p);
/* Unlinks the segments our user's dead processes left in /dev/shm; returns how many. */
int hccl_shm_reclaim_stale(void);
hcclResult_t hccl_shm_setup(shm_ctx_t *ctx, void *blob);
/* After connecting: whether this rank can read each peer's memory single-copy (shm_window.c). */
void hccl_shm_window_probe(shm_ctx_t *ctx);
extern const hccl_window_ops_t hccl_shm_window_ops;
/* hccl_window_ops_t.check_room (shm_ops.c). */
void hccl_shm_check_room(void *shm_ctx, size_t reach);
hcclResult_t hccl_shm_connect_all(shm_ctx_t *ctx, const int *peers, int npeers, int64_t deadline_ms);
void hccl_shm_conn_close(shm_conn_t *sc);
/* Whether the peer has closed its side (it died or aborted): memory just read single-copy from
 * it may have been reused, and is not what it offered (shm_ops.c). */
bool hccl_shm_peer_left(const shm_conn_t *sc);
void hccl_shm_teardown(shm_ctx_t *ctx);
extern const hccl_framer_io_t hccl_shm_io;

#endif
