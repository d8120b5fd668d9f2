/*
 * hcclCommDumpState and HCCL_DUMP_ON_SIGNAL: two ranks in this process, rank 0 posts an
 * AllReduce and rank 1 does not. The report of rank 0, taken while another thread is blocked
 * in hcclWait, is parsed: the collective, its sequence number, its algorithm, the steps
 * posted and waiting on rank 1 with their byte ranges, and the link to rank 1. The same
 * report through SIGUSR1. And hcclCommAbort from another thread wakes the blocked hcclWait
 * with hcclAborted.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "pair.h"

#define COUNT 1024 /* floats: 4096 bytes */

typedef struct {
    hcclRequest_t req;
    hcclResult_t res;
    char msg[512];
} waiter_t;

static void *wait_main(void *p)
{
    waiter_t *w = p;

    w->res = hcclWait(&w->req);
    snprintf(w->msg, sizeof(w->msg), "%s", hcclGetLastError(NULL));
    return NULL;
}

/* The report as a string in *text (the caller's: the stream writes it until fclose). */
static void dump_to_string(hcclComm_t comm, char **text)
{
    size_t len = 0;
    FILE *f;

    *text = NULL;
    f = open_memstream(text, &len);
    assert_non_null(f);
    assert_int_equal(hcclCommDumpState(comm, f), hcclSuccess);
    fclose(f);
    printf("%s", *text);
}

/* Checks rank 0's report of its AllReduce at seq 0, which waits on rank 1. */
static void check_report(const char *text, const char *link)
{
    char *copy = strdup(text), *save = NULL, algo[32] = "";
    unsigned seq = 99, left = 0, nsteps = 0, posted_lines = 0, posted_sum = 0, blocked_sum = 0;
    bool link_line = false, header = false;

    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        unsigned step, tag, posted, blocked;
        size_t begin, end;
        char dir[8], slot[8], peer_kw[8];
        int peer, waited;
        const char *l;

        if ((l = strstr(line, "request allreduce seq ")) &&
            sscanf(l + strlen("request allreduce seq "), "%u", &seq) == 1) {
            const char *a = strstr(l, "(1024 x float32, sum): algorithm ");
            assert_non_null(a);
            a += strlen("(1024 x float32, sum): algorithm ");
            assert_int_equal(
                sscanf(a, "%31[a-z0-9_], %u of %u steps not done", algo, &left, &nsteps), 3);
            header = true;
        }
        if (sscanf(line,
                   " step %u %7s %7s rank %d tag %u bytes %7[a-z][%zu, %zu): posted, waiting on "
                   "rank %d",
                   &step, dir, peer_kw, &peer, &tag, slot, &begin, &end, &waited) == 9) {
            assert_true(strcmp(dir, "send") == 0 || strcmp(dir, "recv") == 0);
            assert_int_equal(peer, 1);
            assert_int_equal(waited, 1);
            assert_true(end > begin);
            if (strcmp(slot, "scratch") != 0)
                assert_true(end <= COUNT * sizeof(float));
            posted_lines++;
        }
        if (sscanf(line, " summary: %u posted and waiting on peers, %u blocked", &posted,
                   &blocked) == 2) {
            posted_sum += posted;
            blocked_sum += blocked;
        }
        if (strstr(line, "link to rank 1 (") && strstr(line, link) && strstr(line, "last send") &&
            strstr(line, "last receive"))
            link_line = true;
    }
    free(copy);
    assert_true(header);
    assert_int_equal(seq, 0);
    assert_true(algo[0] != '\0');
    assert_true(nsteps > 0 && left > 0 && left <= nsteps);
    assert_true(posted_lines >= 1);
    assert_int_equal(posted_sum, posted_lines);
    (void)blocked_sum;
    assert_true(link_line);
    assert_non_null(strstr(text, "rank 0 of 2, 1 request outstanding"));
}

static void run_dump_case(const char *link, void (*check)(const char *text, const char *link))
{
    static float s0[COUNT], r0[COUNT], s1[COUNT], r1[COUNT];
    hcclComm_t comms[2] = {NULL, NULL};
    waiter_t w = {0};
    pthread_t th;
    char *text;

    for (int i = 0; i < COUNT; i++) {
        s0[i] = 1.0f;
        s1[i] = 2.0f;
    }
    assert_true(pair_create(link, comms));
    assert_int_equal(hcclAllReduceAsync(s0, r0, COUNT, hcclFloat32, hcclSum, comms[0], &w.req),
                     hcclSuccess);
    assert_true(pair_sync_reactor(comms[0], 0));
    assert_int_equal(pthread_create(&th, NULL, wait_main, &w), 0); /* blocked meanwhile */
    dump_to_string(comms[0], &text);
    check(text, link);
    free(text);
    /* Rank 1 joins in: the waiter's AllReduce ends, right. */
    assert_int_equal(hcclAllReduce(s1, r1, COUNT, hcclFloat32, hcclSum, comms[1]), hcclSuccess);
    pthread_join(th, NULL);
    assert_int_equal(w.res, hcclSuccess);
    assert_true(r0[0] == 3.0f && r0[COUNT - 1] == 3.0f && r1[7] == 3.0f);
    /* Its run is gone once hcclWait returned (the outstanding count follows a moment later). */
    dump_to_string(comms[0], &text);
    assert_null(strstr(text, "request allreduce"));
    free(text);
    assert_int_equal(hcclCommDestroy(comms[0]), hcclSuccess);
    assert_int_equal(hcclCommDestroy(comms[1]), hcclSuccess);
}

static void test_dump_shm(void **state)
{
    (void)state;
    run_dump_case("shm", check_report);
}

static void test_dump_tcp(void **state)
{
    (void)state;
    run_dump_case("tcp", check_report);
}

/* On the shm lane: the report names the AllReduce and the rank its block waits for. */
static void check_lane_report(const char *text, const char *link)
{
    (void)link;
    assert_non_null(strstr(text, "rank 0 of 2, 1 request outstanding"));
    assert_non_null(strstr(
        text, "  request allreduce seq 0 (1024 x float32, sum): shm lane, waiting on ranks 1\n"));
    assert_null(strstr(text, "without a plan in flight"));
}

static void test_dump_lane(void **state)
{
    (void)state;
    setenv("HCCL_LANE_MAX", "8192", 1);
    run_dump_case("shm", check_lane_report);
    setenv("HCCL_LANE_MAX", "0", 1);
}

static void test_dump_bad_args(void **state)
{
    hcclUniqueId id;
    hcclComm_t comm;
    char *text;

    (void)state;
    assert_int_equal(hcclCommDumpState(NULL, stdout), hcclInvalidArgument);
    assert_non_null(strstr(hcclGetLastError(NULL), "comm is NULL"));
    assert_int_equal(hcclGetUniqueId(&id), hcclSuccess);
    assert_int_equal(hcclCommInitRank(&comm, 1, id, 0), hcclSuccess);
    assert_int_equal(hcclCommDumpState(comm, NULL), hcclInvalidArgument);
    assert_non_null(strstr(hcclGetLastError(NULL), "out is NULL"));
    dump_to_string(comm, &text);
    assert_non_null(strstr(text, "rank 0 of 1, 0 requests outstanding"));
    free(text);
    assert_int_equal(hcclCommDestroy(comm), hcclSuccess);
}

/* Another thread's hcclCommAbort wakes a thread blocked in hcclWait, with hcclAborted. */
static void run_abort_case(const char *link)
{
    static float buf[COUNT];
    hcclComm_t comms[2] = {NULL, NULL};
    waiter_t w = {0};
    pthread_t th;

    assert_true(pair_create(link, comms));
    assert_int_equal(hcclAllReduceAsync(buf, buf, COUNT, hcclFloat32, hcclSum, comms[0], &w.req),
                     hcclSuccess);
    assert_true(pair_sync_reactor(comms[0], 0));
    assert_int_equal(pthread_create(&th, NULL, wait_main, &w), 0);
    assert_int_equal(hcclCommAbort(comms[0]), hcclSuccess);
    pthread_join(th, NULL);
    assert_int_equal(w.res, hcclAborted);
    assert_non_null(strstr(w.msg, "aborted"));
    assert_int_equal(hcclCommAbort(comms[1]), hcclSuccess);
}

static void test_abort_wakes_wait_shm(void **state)
{
    (void)state;
    run_abort_case("shm");
}

static void test_abort_wakes_wait_tcp(void **state)
{
    (void)state;
    run_abort_case("tcp");
}

/* Reads fd into buf until it holds the report's last line, for up to 20 s. */
static void read_until_end(int fd, char *buf, size_t cap)
{
    size_t len = 0;

    buf[0] = '\0';
    while (!strstr(buf, "state dump: end of report")) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        ssize_t n;
        assert_true(poll(&p, 1, 20000) == 1);
        n = read(fd, buf + len, cap - 1 - len);
        assert_true(n > 0);
        len += (size_t)n;
        buf[len] = '\0';
    }
}

/* The log goes to stderr: it is caught in a pipe between these two. */
typedef struct {
    int p[2];
    int saved;
} capture_t;

static void capture_start(capture_t *c)
{
    assert_int_equal(pipe(c->p), 0);
    fflush(stderr);
    c->saved = dup(2);
    assert_true(c->saved >= 0);
    assert_true(dup2(c->p[1], 2) == 2);
}

static void capture_stop(capture_t *c)
{
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    close(c->p[0]);
    close(c->p[1]);
}

/* HCCL_DUMP_ON_SIGNAL=1: SIGUSR1 logs every live communicator's report; the handler goes with
 * the last communicator. */
static void test_dump_on_signal(void **state)
{
    static float buf[COUNT], buf1[COUNT];
    static char out[1 << 16];
    hcclComm_t comms[2] = {NULL, NULL};
    struct sigaction sa;
    waiter_t w = {0};
    capture_t cap;

    (void)state;
    setenv("HCCL_DUMP_ON_SIGNAL", "1", 1);
    assert_true(pair_create("shm", comms));
    assert_int_equal(sigaction(SIGUSR1, NULL, &sa), 0);
    assert_true(sa.sa_handler != SIG_DFL);
    assert_int_equal(hcclAllReduceAsync(buf, buf, COUNT, hcclFloat32, hcclSum, comms[0], &w.req),
                     hcclSuccess);
    assert_true(pair_sync_reactor(comms[0], 0));

    capture_start(&cap);
    assert_int_equal(raise(SIGUSR1), 0);
    read_until_end(cap.p[0], out, sizeof(out));
    capture_stop(&cap);
    printf("%s", out);
    assert_non_null(strstr(out, "state dump on SIGUSR1: 2 communicators"));
    assert_non_null(strstr(out, "request allreduce seq 0 (1024 x float32, sum)"));
    assert_non_null(strstr(out, "posted, waiting on rank 1"));
    assert_non_null(strstr(out, "rank 1 of 2, 0 requests outstanding"));
    assert_non_null(strstr(out, "state dump: end of report (2 communicators)"));

    assert_int_equal(hcclAllReduce(buf1, buf1, COUNT, hcclFloat32, hcclSum, comms[1]), hcclSuccess);
    assert_int_equal(hcclWait(&w.req), hcclSuccess);
    assert_int_equal(hcclCommDestroy(comms[0]), hcclSuccess);
    assert_int_equal(sigaction(SIGUSR1, NULL, &sa), 0);
    assert_true(sa.sa_handler != SIG_DFL); /* rank 1's communicator is still alive */
    assert_int_equal(hcclCommDestroy(comms[1]), hcclSuccess);
    assert_int_equal(sigaction(SIGUSR1, NULL, &sa), 0);
    assert_true(sa.sa_handler == SIG_DFL);
    unsetenv("HCCL_DUMP_ON_SIGNAL");
}

typedef struct {
    pthread_mutex_t mtx;
    pthread_cond_t cond;
    bool entered, release;
} gate_t;

/* A callback that holds its reactor (its progress lock) until released: a stuck callback. */
static void gate_cb(hcclRequest_t req, hcclResult_t res, void *arg)
{
    gate_t *g = arg;

    (void)req, (void)res;
    pthread_mutex_lock(&g->mtx);
    g->entered = true;
    pthread_cond_broadcast(&g->cond);
    while (!g->release)
        pthread_cond_wait(&g->cond, &g->mtx);
    pthread_mutex_unlock(&g->mtx);
}

/* An AllReduce of the pair whose callback holds rank 0's reactor until gate_open(g). */
static void hold_reactor(hcclComm_t pair[2], gate_t *g, hcclRequest_t *req)
{
    static float buf[COUNT], buf1[COUNT];

    assert_int_equal(hcclAllReduceAsync(buf, buf, COUNT, hcclFloat32, hcclSum, pair[0], req),
                     hcclSuccess);
    assert_int_equal(hcclRequestSetCallback(*req, gate_cb, g), hcclSuccess);
    assert_int_equal(hcclAllReduce(buf1, buf1, COUNT, hcclFloat32, hcclSum, pair[1]), hcclSuccess);
    pthread_mutex_lock(&g->mtx);
    while (!g->entered)
        pthread_cond_wait(&g->cond, &g->mtx);
    pthread_mutex_unlock(&g->mtx);
}

/* Lets the callback return. */
static void gate_open(gate_t *g)
{
    pthread_mutex_lock(&g->mtx);
    g->release = true;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->mtx);
}

/* Reads what fd holds now, without waiting, after len bytes already in buf. */
static size_t read_available(int fd, char *buf, size_t len, size_t cap)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};

    while (len + 1 < cap && poll(&p, 1, 0) == 1) {
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    return len;
}

static int count_of(const char *text, const char *what)
{
    int n = 0;

    for (const char *at = text; (at = strstr(at, what)) != NULL; at += strlen(what))
        n++;
    return n;
}

/* Reads fd into out (from empty) until what is in it n times. */
static size_t read_until_count(int fd, char *out, size_t cap, const char *what, int n)
{
    size_t len = 0;

    out[0] = '\0';
    while (count_of(out, what) < n) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        assert_true(poll(&pf, 1, 20000) == 1);
        len = read_available(fd, out, len, cap);
    }
    return len;
}

/*
 * A SIGUSR1 report stuck on one communicator (a callback holds its progress lock) never
 * stalls the teardown of another: hcclCommAbort of rank 1 returns while the report still
 * waits, well before it gives up on the lock (DUMP_LOCK_WAIT_MS, dump.c).
 */
static void test_teardown_during_dump(void **state)
{
    static char out[1 << 16];
    gate_t g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false};
    hcclComm_t comms[2] = {NULL, NULL};
    hcclRequest_t req;
    capture_t cap;
    size_t len;

    (void)state;
    setenv("HCCL_DUMP_ON_SIGNAL", "1", 1);
    assert_true(pair_create("shm", comms));
    hold_reactor(comms, &g, &req);

    capture_start(&cap);
    assert_int_equal(raise(SIGUSR1), 0);
    /* The report has started; rank 0's part waits for the lock the callback holds. */
    len = read_until_count(cap.p[0], out, sizeof(out), "state dump on SIGUSR1", 1);
    assert_int_equal(hcclCommAbort(comms[1]), hcclSuccess);
    len = read_available(cap.p[0], out, len, sizeof(out));
    assert_null(strstr(out, "state dump: end of report"));

    gate_open(&g);
    read_until_end(cap.p[0], out + len, sizeof(out) - len);
    capture_stop(&cap);
    printf("%s", out);
    assert_int_equal(hcclWait(&req), hcclSuccess);
    assert_int_equal(hcclCommAbort(comms[0]), hcclSuccess);
    unsetenv("HCCL_DUMP_ON_SIGNAL");
}

/*
 * A communicator torn down while the report waits on a later one makes the report skip no
 * other: three pairs registered in turn, the report stuck on the second pair's rank 0 while
 * one of the first pair's goes; the report still covers the five that live.
 */
static void test_teardown_skips_none(void **state)
{
    static char out[1 << 17];
    gate_t g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false};
    hcclComm_t a[2] = {NULL, NULL}, b[2] = {NULL, NULL}, c[2] = {NULL, NULL};
    hcclRequest_t req;
    capture_t cap;
    size_t len;

    (void)state;
    setenv("HCCL_DUMP_ON_SIGNAL", "1", 1);
    assert_true(pair_create("shm", a));
    assert_true(pair_create("shm", b));
    assert_true(pair_create("shm", c));
    hold_reactor(b, &g, &req);

    capture_start(&cap);
    assert_int_equal(raise(SIGUSR1), 0);
    /* The first pair is reported; then the report waits for b[0]'s lock. */
    len = read_until_count(cap.p[0], out, sizeof(out), "hccl state: comm", 2);
    assert_int_equal(hcclCommAbort(a[0]), hcclSuccess);
    gate_open(&g);
    read_until_end(cap.p[0], out + len, sizeof(out) - len);
    capture_stop(&cap);
    printf("%s", out);
    /* Both of the first pair went out before a[0] went; then every other. */
    assert_int_equal(count_of(out, "hccl state: comm"), 6);
    assert_non_null(strstr(out, "state dump: end of report (5 communicators)"));
    assert_int_equal(hcclWait(&req), hcclSuccess);
    assert_int_equal(hcclCommAbort(a[1]), hcclSuccess);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(hcclCommAbort(b[r]), hcclSuccess);
        assert_int_equal(hcclCommAbort(c[r]), hcclSuccess);
    }
    unsetenv("HCCL_DUMP_ON_SIGNAL");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dump_bad_args),
        cmocka_unit_test(test_dump_shm),
        cmocka_unit_test(test_dump_tcp),
        cmocka_unit_test(test_dump_lane),
        cmocka_unit_test(test_abort_wakes_wait_shm),
        cmocka_unit_test(test_abort_wakes_wait_tcp),
        cmocka_unit_test(test_dump_on_signal),
        cmocka_unit_test(test_teardown_during_dump),
        cmocka_unit_test(test_teardown_skips_none),
    };

    /* Calibration runs collectives at start: without it the first call is sequence 0. */
    setenv("HCCL_CALIBRATE", "0", 1);
    /* The plans' reports are the subject; test_dump_lane turns the lane on for itself. */
    setenv("HCCL_LANE_MAX", "0", 1);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
