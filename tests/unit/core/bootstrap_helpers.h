/*
 * Helpers of the bootstrap's unit tests (test_init_rank, test_init_group, test_unique_id_version):
 * clocks, ports, environment variables, the hccl- segments this process maps, one thread per rank
 * for the blocking inits, and the watchdog fixtures.
 */
#ifndef HCCL_TEST_BOOTSTRAP_HELPERS_H
#define HCCL_TEST_BOOTSTRAP_HELPERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hccl.h"

#define MAX_RANKS 8
#define SLACK_MS 3000

int64_t now_ms(void);

/* Names (without "/dev/shm/") of the hccl- segments this process maps now. */
int our_segments(char names[][128], int max);

/*
 * A TCP port on 127.0.0.1 that refuses connections until *fd_p is closed: bound, not
 * listening. Held, it cannot become another test's listener meanwhile, nor the local end the
 * kernel picks for one of our connect retries (which would connect the socket to itself).
 */
int refusing_port(int *fd_p);

/* True if text contains the decimal number n standing alone (not inside a longer number). */
bool has_number(const char *text, long n);

/* Temporarily sets or unsets one variable; restore with env_restore. */
typedef struct {
    const char *name;
    char *saved; /* NULL: was unset */
} env_save_t;

void env_save(env_save_t *s, const char *name);
void env_restore(env_save_t *s);

/*
 * hcclGetUniqueId whose rendezvous service gives up after secs (it reads
 * HCCL_CONNECT_TIMEOUT, having no config): bounds the service's life in the
 * failure tests, where it would otherwise wait for missing ranks for 120 s.
 */
hcclResult_t get_id_bounded(hcclUniqueId *id, int secs);

/* One thread per rank. */

enum { INIT_RANK, INIT_GROUP };

typedef struct {
    /* in */
    int how;
    int rank;
    int nranks; /* what this rank claims */
    hcclUniqueId id;
    const char *commId;
    int timeout_ms;
    bool allreduce;
    /* out */
    hcclResult_t res;
    char err[1024];
    int64_t elapsed_ms;
    hcclResult_t ar_res;
    char ar_err[1024];
    size_t ar_bad; /* wrong elements */
    int count, user_rank;
    hcclResult_t destroy_res;
    int nsegs; /* hccl- segments mapped while the communicator was alive */
    char segs[16][128];
} rank_arg_t;

/* Runs n ranks, a thread each, to the end: init, an AllReduce if asked, destroy. */
void run_ranks(rank_arg_t *args, int n);
void expect_success(const rank_arg_t *args, int n);

/* Fixtures: a watchdog alarm ends a stuck test. */
int setup_watchdog(void **state);
int teardown_watchdog(void **state);

#endif
