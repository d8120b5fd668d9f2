/*
 * hcclCommShrink: the survivors of a communicator build one without the excluded ranks.
 *
 * Every communicator of more than one rank keeps a control listener open from its creation
 * to its end, and its address is in every rank's card. To shrink, the survivors (the ranks
 * not excluded) open the new communicator's links as any creation does, and instead of a
 * rendezvous through an id, each sends its card and its exclude list to the lowest survivor
 * (the leader) at the control address of the parent's rank table. The leader checks that
 * everyone excludes the same ranks and answers with the new rank table, or with the same
 * error for all; the links then connect as at any creation. Nothing depends on the excluded
 * ranks, the bootstrap root included, and no new address has to be handed around.
 *
 * The pure parts (argument checks, renumbering, the agreement check, the hello's decoder)
 * are here so that they can be unit-tested.
 */
#ifndef HCCL_SHRINK_H
#define HCCL_SHRINK_H

#include "core/comm.h"
#include "core/wire.h"

#define HCCL_SHRINK_HELLO_MAGIC 0x4b524853u /* "SHRK" */
#define HCCL_SHRINK_VERSION 1

/* A survivor's hello to the leader; nexclude int32 ranks, ascending, follow it. */
typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t reserved;
    uint8_t secret[HCCL_SECRET_BYTES]; /* the parent's */
    uint64_t comm_id;                  /* the parent's */
    uint32_t gen;   /* hcclCommShrink calls this rank made on the parent before */
    int32_t rank;   /* in the parent */
    int32_t nranks; /* the parent's size */
    int32_t status; /* not hcclSuccess: it failed before joining; errmsg says why */
    int32_t nexclude;
    int32_t reserved2;
    char errmsg[HCCL_BS_ERRMSG_BYTES];
    char config[HCCL_CONFIG_TEXT_BYTES]; /* the new communicator's settings that must agree */
    hccl_card_t card;                    /* for the new communicator: rank is the new rank */
} hccl_shrink_hello_t;

/*
 * Checks the arguments of rank's hcclCommShrink on a communicator of nranks and writes the
 * list, sorted, into sorted[count]: hcclInvalidArgument for a NULL list, a negative count or
 * a rank out of range or listed twice; hcclInvalidUsage when rank excludes itself. Set.
 */
hcclResult_t hccl_shrink_list_check(int nranks, int rank, const int *list, int count, int *sorted);
/* new_of[r]: the new rank of old rank r (-1: excluded), in the old order; returns the new size. */
int hccl_shrink_renumber(int nranks, const int *sorted, int count, int *new_of);
/* "1,3" (or "none") into buf, shortened with "..." where it does not fit. */
void hccl_shrink_list_text(const int *list, int count, char *buf, size_t len);
/*
 * The leader's check of a survivor's list against its own: 0 when they agree, else
 * hcclInvalidUsage with the difference in why ("rank 0 excludes 3, rank 2 excludes 1,3"; a
 * rank that calls although the leader excludes it is named as such). Not set.
 */
hcclResult_t hccl_shrink_agree(int leader, const int *mine, int nmine, int rank, const int *theirs,
                               int ntheirs, char *why, size_t len);
/*
 * A hello as read from a connection, list its nexclude entries: NULL if it may be used (its
 * strings are then terminated), else why not. Wrong magic, secret, version or communicator;
 * a rank or size out of range; an unknown status; a list unsorted, repeated or out of range.
 */
const char *hccl_shrink_hello_check(hccl_shrink_hello_t *h, uint64_t comm_id, const uint8_t *secret,
                                    int nranks);
/* Whether list (nexclude entries) is ascending, without repeats, inside [0, nranks). */
bool hccl_shrink_list_valid(const int32_t *list, int nexclude, int nranks);

/* ---- between shrink.c (the call, a follower) and shrink_lead.c (the leader) ---- */

#define HCCL_SHRINK_HELLO_WAIT_MS 5000 /* a survivor sends its hello right after connecting */
#define HCCL_SHRINK_ACK 0x4b434153u    /* "SACK": a survivor has the new rank table */

typedef struct {
    struct hcclComm *parent; /* borrowed */
    int *excl;               /* owned, [nexcl], ascending */
    int nexcl;
    int *new_of;  /* owned, [parent->nranks]: new rank, -1: excluded */
    int size;     /* of the new communicator */
    int leader;   /* parent rank of the lowest survivor */
    uint32_t gen; /* this call's number among the parent's shrinks */
    bool joined;  /* a follower's hello went to the leader */
} hccl_shrink_t;

/* Reads one connection's hello and list (*list_p: owned by the caller). false: a connection to
 * drop unanswered (no complete hello: one left behind by an earlier attempt; or a stranger). */
bool hccl_shrink_read_hello(const hccl_shrink_t *sh, int fd, hccl_shrink_hello_t *h, int **list_p);
/* Answers a survivor with an error (a reply of the bootstrap's form). */
void hccl_shrink_send_error(int fd, hcclResult_t status, const char *msg);
/* Sends our hello (card and config NULL: a failure, why says which). */
hcclResult_t hccl_shrink_send_hello(hccl_shrink_t *sh, int fd, const hccl_card_t *card,
                                    const char *config, hcclResult_t status, const char *why,
                                    int64_t deadline_ms);
/* The leader's side of the exchange: out gets the new rank table. */
hcclResult_t hccl_shrink_lead(hccl_shrink_t *sh, const hccl_card_t *card, const char *config,
                              int64_t deadline_ms, hccl_bootstrap_result_t *out);
/*
 * A connection whose hello is for a later shrink of comm than sh's (a survivor that learnt of
 * this attempt's failure first and called again): kept, unread, for that shrink (true), else
 * false. Connections kept go to the next leader's collection, and are closed with comm.
 */
bool hccl_shrink_keep_early(const hccl_shrink_t *sh, int fd);
/* One kept connection (-1: none). */
int hccl_shrink_take_early(struct hcclComm *comm);

#endif /* HCCL_SHRINK_H */
