/*
 * The end of the link set-up through the rendezvous (bootstrap_setup.c), in one process: the
 * rendezvous' side serves socketpairs, one thread per rank ends its set-up. Every rank must
 * get the same verdict: success when all set up; else the first failure, word for word, as a
 * peer found gone, a rank's own error, a connection that ends without an outcome, a malformed
 * outcome or a rank that never finishes. A rank still setting up sees its connection become
 * readable once the verdict is a failure (what the links watch).
 */
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/comm.h"
#include "core/wire.h"

#define NRANKS 4
#define SERVE_MS 5000

typedef struct {
    int fds[NRANKS];      /* the rendezvous' ends */
    int rank_fd[NRANKS];  /* the ranks' ends */
    int serve_ms;         /* the rendezvous' deadline, from its start */
    pthread_t server;
} setup_t;

typedef struct {
    int fd;
    int rank;
    hcclResult_t status;
    int origin;
    const char *why;
    hcclResult_t res;
    char text[1024];
} rank_end_t;

static rank_end_t end_ok(int rank)
{
    return (rank_end_t){.rank = rank, .status = hcclSuccess, .origin = rank};
}

static rank_end_t end_failed(int rank, hcclResult_t status, int origin, const char *why)
{
    return (rank_end_t){.rank = rank, .status = status, .origin = origin, .why = why};
}

static void *serve_main(void *arg)
{
    setup_t *s = arg;

    hccl_bootstrap_setup_serve(s->fds, NRANKS, hccl_now_ms() + s->serve_ms);
    return NULL;
}

static void *rank_main(void *arg)
{
    rank_end_t *e = arg;

    if (e->status != hcclSuccess)
        hccl_error_put(e->why);
    e->res = hccl_bootstrap_setup_done(&e->fd, e->rank, NRANKS, e->status, e->origin,
                                       hccl_now_ms() + SERVE_MS);
    snprintf(e->text, sizeof(e->text), "%s", e->res == hcclSuccess ? "" : hccl_error_last());
    return NULL;
}

/* Starts the rendezvous' side; ends[0..n) become ranks 0..n-1 that all set up their links. */
static void setup_start(setup_t *s, int serve_ms, rank_end_t *ends, int n)
{
    for (int r = 0; r < n; r++)
        ends[r] = end_ok(r);
    s->serve_ms = serve_ms;
    for (int r = 0; r < NRANKS; r++) {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        s->fds[r] = sv[0];
        s->rank_fd[r] = sv[1];
    }
    assert_int_equal(pthread_create(&s->server, NULL, serve_main, s), 0);
}

/* Runs the ranks in ends[0..n) (the others are played by the test) and waits for the server. */
static void run_ranks(setup_t *s, rank_end_t *ends, int n)
{
    pthread_t th[NRANKS];

    for (int i = 0; i < n; i++) {
        ends[i].fd = s->rank_fd[ends[i].rank];
        s->rank_fd[ends[i].rank] = -1;
        assert_int_equal(pthread_create(&th[i], NULL, rank_main, &ends[i]), 0);
    }
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    /* The verdict is out: the ends the test played go, as the rendezvous waits for them. */
    for (int r = 0; r < NRANKS; r++)
        if (s->rank_fd[r] >= 0)
            close(s->rank_fd[r]);
    pthread_join(s->server, NULL);
}

/* Every rank's text from "root cause at" on is the same, and contains want. */
static void assert_same_story(const rank_end_t *ends, int n, hcclResult_t code, const char *want)
{
    const char *first = strstr(ends[0].text, "root cause at");

    assert_non_null(first);
    for (int i = 0; i < n; i++) {
        const char *root = strstr(ends[i].text, "root cause at");
        assert_int_equal(ends[i].res, code);
        assert_non_null(root);
        assert_string_equal(root, first);
        assert_non_null(strstr(root, want));
    }
}

static void test_all_succeed(void **state)
{
    setup_t s;
    rank_end_t ends[NRANKS];

    (void)state;
    setup_start(&s, SERVE_MS, ends, NRANKS);
    run_ranks(&s, ends, NRANKS);
    for (int r = 0; r < NRANKS; r++) {
        assert_int_equal(ends[r].res, hcclSuccess);
        assert_int_equal(ends[r].fd, -1);
    }
}

/* Rank 1 found rank 3 gone; rank 3's connection ends later: both read as rank 3 gone. */
static void test_peer_found_gone(void **state)
{
    setup_t s;
    rank_end_t ends[] = {end_ok(0), end_ok(2),
                         end_failed(1, hcclRemoteError, 3, "rank 1: shm: rank 3 went away")};

    (void)state;
    setup_start(&s, SERVE_MS, ends, 0);
    run_ranks(&s, ends, 3);
    assert_same_story(ends, 3, hcclRemoteError, "root cause at rank 3: rank 3 went away");
}

/* Rank 2's connection ends without an outcome (its process died): every other rank hears it,
 * including those still setting up, whose connection becomes readable (the links' watch). */
static void test_connection_ends(void **state)
{
    setup_t s;
    rank_end_t ends[] = {end_failed(0, hcclRemoteError, 0, "rank 0: tcp: link set-up called off"),
                         end_ok(1), end_ok(3)};
    struct pollfd p;

    (void)state;
    setup_start(&s, SERVE_MS, ends, 0);
    close(s.rank_fd[2]);
    s.rank_fd[2] = -1;
    p = (struct pollfd){.fd = s.rank_fd[0], .events = POLLIN};
    assert_int_equal(poll(&p, 1, SERVE_MS), 1);
    run_ranks(&s, ends, 3);
    assert_same_story(ends, 3, hcclRemoteError, "root cause at rank 2: rank 2 went away during");
}

/* A rank's own failure is every rank's, with its code and its words. */
static void test_own_failure(void **state)
{
    setup_t s;
    rank_end_t ends[NRANKS];

    (void)state;
    setup_start(&s, SERVE_MS, ends, NRANKS);
    ends[1] = end_failed(1, hcclSystemError, 1, "rank 1: shm: out of room in /dev/shm");
    run_ranks(&s, ends, NRANKS);
    assert_same_story(ends, NRANKS, hcclSystemError,
                      "root cause at rank 1: rank 1 could not set up its links: rank 1: shm: out "
                      "of room in /dev/shm");
}

/* Bytes that are not an outcome fail the set-up, naming the rank they came from. */
static void test_malformed_outcome(void **state)
{
    setup_t s;
    rank_end_t ends[3];
    hccl_bs_setup_t m = {.magic = 0x12345678u};

    (void)state;
    setup_start(&s, SERVE_MS, ends, 0);
    assert_int_equal(write(s.rank_fd[0], &m, sizeof(m)), (ssize_t)sizeof(m));
    for (int r = 1; r < NRANKS; r++)
        ends[r - 1] = end_ok(r);
    run_ranks(&s, ends, 3);
    assert_same_story(ends, 3, hcclRemoteError, "root cause at rank 0: rank 0 could not set up "
                                                "its links: its set-up outcome carried a malformed "
                                                "header");
}

/* A rank that never finishes: at the rendezvous' deadline, a timeout that names it. */
static void test_rank_never_finishes(void **state)
{
    setup_t s;
    rank_end_t ends[3];

    (void)state;
    setup_start(&s, 300, ends, 3);
    run_ranks(&s, ends, 3);
    assert_same_story(ends, 3, hcclTimeout, "root cause at rank 3: rank 3 could not set up its "
                                            "links: it did not finish before the connect timeout");
}

/* The checks of what crosses the connection. */
static void test_outcome_check(void **state)
{
    hccl_bs_setup_t ok = {.magic = HCCL_BS_SETUP_MAGIC, .status = hcclRemoteError, .origin = 3,
                          .msg_len = HCCL_BS_MAX_MSG};
    hccl_bs_setup_t m;

    (void)state;
    assert_null(hccl_bs_setup_check(&ok, NRANKS));
    m = ok, m.magic++;
    assert_string_equal(hccl_bs_setup_check(&m, NRANKS), "a malformed header");
    m = ok, m.status = hcclInProgress;
    assert_string_equal(hccl_bs_setup_check(&m, NRANKS), "an unknown status");
    m = ok, m.status = hcclNumResults;
    assert_string_equal(hccl_bs_setup_check(&m, NRANKS), "an unknown status");
    m = ok, m.origin = NRANKS;
    assert_string_equal(hccl_bs_setup_check(&m, NRANKS), "an origin out of range");
    m = ok, m.origin = -1;
    assert_string_equal(hccl_bs_setup_check(&m, NRANKS), "an origin out of range");
    m = ok, m.msg_len = HCCL_BS_MAX_MSG + 1;
    assert_string_equal(hccl_bs_setup_check(&m, NRANKS), "a text longer than allowed");
}

/* Without a connection (a communicator made from another's), the outcome is the verdict. */
static void test_no_connection(void **state)
{
    int fd = -1;

    (void)state;
    assert_int_equal(hccl_bootstrap_setup_done(&fd, 0, 2, hcclSuccess, 0, hccl_now_ms()),
                     hcclSuccess);
    assert_int_equal(hccl_bootstrap_setup_done(&fd, 0, 2, hcclTimeout, 0, hccl_now_ms()),
                     hcclTimeout);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_succeed),       cmocka_unit_test(test_peer_found_gone),
        cmocka_unit_test(test_connection_ends),   cmocka_unit_test(test_own_failure),
        cmocka_unit_test(test_malformed_outcome), cmocka_unit_test(test_rank_never_finishes),
        cmocka_unit_test(test_outcome_check),     cmocka_unit_test(test_no_connection),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
