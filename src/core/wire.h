/*
 * What the bootstrap exchanges with other processes, and the pure decoders that check it: every
 * byte that comes from another process is untrusted until one of these has accepted it. Each
 * decoder takes bytes (already read into the struct) and returns whether they may be used,
 * with the reason when not; none of them touches a socket, so that they can be fuzzed.
 */
#ifndef HCCL_WIRE_H
#define HCCL_WIRE_H

#include "base/base.h"
#include "links/link.h"

#define HCCL_BS_HELLO_MAGIC 0x54534f42u /* "BOST" */
#define HCCL_BS_REPLY_MAGIC 0x59504552u /* "REPY" */
#define HCCL_BS_SETUP_MAGIC 0x50555453u /* "STUP" */
#define HCCL_BS_VERSION 3
#define HCCL_BS_MAX_RANKS (1 << 20)
#define HCCL_BS_ERRMSG_BYTES 256
/* "KEY=value\n" lines of every setting that must agree across ranks (hccl_config_describe). */
#define HCCL_CONFIG_TEXT_BYTES 768

/* A rank's hello to the rendezvous. */
typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t reserved;
    uint8_t secret[HCCL_SECRET_BYTES];
    int32_t rank;
    int32_t nranks;
    int32_t wait_ms;           /* how long this rank will wait for the answer */
    int32_t status;            /* not hcclSuccess: this rank failed before joining; errmsg says why */
    char errmsg[HCCL_BS_ERRMSG_BYTES];
    char config[HCCL_CONFIG_TEXT_BYTES];
    hccl_card_t card;
} hccl_bs_hello_t;

/* The rendezvous' answer; msg_len bytes of error text, or nranks cards, follow. */
typedef struct {
    uint32_t magic;
    int32_t status;            /* hcclResult_t */
    uint32_t nranks;
    uint32_t msg_len;
    uint64_t comm_id;
    uint8_t secret[HCCL_SECRET_BYTES];
} hccl_bs_reply_t;

#define HCCL_BS_MAX_MSG 1024

/*
 * After the rank table, on the same connection: each rank's outcome of its link set-up, then
 * the rendezvous' verdict, the same for every rank (bootstrap_setup.c); msg_len bytes of
 * text follow. The verdict's text is the root cause every rank reports.
 */
typedef struct {
    uint32_t magic;
    int32_t status;   /* hcclResult_t */
    int32_t origin;   /* where a failure started: the sender, or a peer it found gone */
    uint32_t msg_len; /* at most HCCL_BS_MAX_MSG */
} hccl_bs_setup_t;

/*
 * A hello as read from a connection: NULL if it may be used (its strings are then
 * NUL-terminated), else why not. Wrong secret, magic or version, a rank or size out of range,
 * an unknown status, a card that is not the rank's.
 */
const char *hccl_bs_hello_check(hccl_bs_hello_t *h, const uint8_t *secret);
/* The answer to the hello of rank of nranks: hcclSuccess, or the error it names (set). */
hcclResult_t hccl_bs_reply_check(const hccl_bs_reply_t *rep, int rank, int nranks);
/* A set-up outcome or verdict of a communicator of nranks: NULL if it may be used, else why. */
const char *hccl_bs_setup_check(const hccl_bs_setup_t *m, int nranks);
/* The rank table that follows a successful answer: every card in place, strings terminated. */
hcclResult_t hccl_bs_cards_check(hccl_card_t *cards, int nranks, int rank);

/* The settings that must agree across ranks, as "KEY=value\n" lines (the library version too). */
void hccl_config_describe(const hccl_params_t *p, char *out, size_t len);
/*
 * Compares two ranks' descriptions key by key: writes "KEY: rank ra 'x', rank rb 'y'; ..." for
 * each difference into out and returns how many there are (0: they agree).
 */
int hccl_config_diff(const char *a, int ra, const char *b, int rb, char *out, size_t len);

#endif /* HCCL_WIRE_H */
