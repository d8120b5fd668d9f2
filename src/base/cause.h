/*
 * The root cause of a communicator's failure, as it travels between ranks (docs/api.md,
 * "Failures"): which rank it started at, its result code and what that rank saw. Links carry
 * it in their goodbyes and cause frames; every rank merges the causes it hears in one total
 * order, so that all of them settle on the same one and render the same text.
 * Plain data, the same layout on the wire: every copy from another process goes through
 * hccl_cause_accept before it is used.
 */
#ifndef HCCL_BASE_CAUSE_H
#define HCCL_BASE_CAUSE_H

#include "base/base.h"

#define HCCL_CAUSE_TEXT_BYTES 320
/* Ranks tracked in the "seen by" set; beyond it a rank counts but is not listed. */
#define HCCL_CAUSE_SET_RANKS 1024

enum {
    HCCL_CAUSE_NONE = 0,
    HCCL_CAUSE_TEXT = 1,    /* a failure the origin rank describes in text (a mismatch, an error) */
    HCCL_CAUSE_TIMEOUT = 2, /* a collective did not finish within the exec timeout */
    HCCL_CAUSE_LOST = 3,    /* the origin rank went away without a goodbye */
};

#define HCCL_CAUSE_FINAL 1u

typedef struct {
    int32_t kind;   /* HCCL_CAUSE_*; NONE: no cause */
    int32_t code;   /* the hcclResult_t every rank reports */
    int32_t origin; /* the rank where it started (TIMEOUT: the first rank that did not arrive) */
    int32_t nranks; /* of the communicator, for the sets */
    uint64_t seq;   /* TIMEOUT: the collective's sequence number */
    uint32_t timeout_ms; /* TIMEOUT: the exec timeout */
    uint32_t flags;      /* HCCL_CAUSE_FINAL: the sender has settled on it (its goodbye) */
    /* TIMEOUT: the ranks that had posted seq; LOST: the ranks that saw the origin go. */
    uint64_t seen[HCCL_CAUSE_SET_RANKS / 64];
    /* TEXT: what the origin saw; TIMEOUT: the collective ("allreduce seq 3"). NUL-terminated. */
    char text[HCCL_CAUSE_TEXT_BYTES];
} hccl_cause_t;

/* A cause of kind TEXT (or LOST: origin went away, seen by seer). */
void hccl_cause_text(hccl_cause_t *c, hcclResult_t code, int origin, int nranks, const char *text);
void hccl_cause_lost(hccl_cause_t *c, int origin, int seer, int nranks);
void hccl_cause_timeout(hccl_cause_t *c, uint64_t seq, const char *what, int timeout_ms, int seer,
                        int nranks);
/* Whether a copy from another process may be used; its text is made NUL-terminated. */
bool hccl_cause_accept(hccl_cause_t *c, int nranks, const char **why);
/*
 * Merges in into *cur by the total order every rank applies (a mismatch before a timeout
 * before another failure before a rank gone without a goodbye; then the lower sequence
 * number, then the lower origin rank; two sightings of the same cause pool their "seen by"
 * ranks). Returns whether *cur changed.
 */
bool hccl_cause_merge(hccl_cause_t *cur, const hccl_cause_t *in);
/* A peer's settled cause (its goodbye): taken as it is unless *cur goes before it, so that
 * the ranks still settling end with the very text the others reported. */
void hccl_cause_adopt_final(hccl_cause_t *cur, const hccl_cause_t *in);
/* Adds rank to the cause's "seen by" set; returns whether it was new. */
bool hccl_cause_see(hccl_cause_t *c, int rank);
bool hccl_cause_seen(const hccl_cause_t *c, int rank);
/* The text every rank reports: "root cause at rank 3: ..." (the same on every rank). */
void hccl_cause_render(const hccl_cause_t *c, char *buf, size_t len);

#endif /* HCCL_BASE_CAUSE_H */
