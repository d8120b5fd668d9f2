/*
 * Communicator creation and bootstrap validation, in one process with one
 * thread per rank: successful rendezvous over tcp and shm at 1, 2, 4 and 5
 * ranks (with an AllReduce and a check that destroy gives back every file
 * descriptor and shared-memory segment), size mismatches, duplicate ranks, a
 * wrong secret, nobody at the address, hcclCommInitGroup, hcclCommInitFromEnv,
 * unique-id text, versions and error strings. Every wait is bounded by a
 * connect timeout of a few seconds, and a watchdog alarm ends a stuck test.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/comm.h"
#include "hccl.h"

#define MAX_RANKS 8
#define CONNECT_TIMEOUT_MS 2500
#define SLACK_MS 3000
#define AR_COUNT 4099
#define WATCHDOG_S 40
#define MAX_SEGS 64

/* ---- helpers ---- */

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A bounded pause that is not a sleep on a guess: poll() on no descriptor. */
static void pause_ms(int ms)
{
    poll(NULL, 0, ms);
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;

    if (!d)
        return -1;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the directory stream's own descriptor */
}

/* Waits (at most 5 s) for the fd count to come back to want; returns the last count. */
static int wait_fds(int want)
{
    int64_t end = now_ms() + 5000;
    int n = count_fds();

    while (n != want && now_ms() < end) {
        pause_ms(20);
        n = count_fds();
    }
    return n;
}

/* Names (without "/dev/shm/") of the hccl- segments this process maps now. */
static int our_segments(char names[][128], int max)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024];
    int n = 0;

    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        char *p = strstr(line, "/dev/shm/hccl-");
        char name[128];
        bool seen = false;

        if (!p)
            continue;
        p += strlen("/dev/shm/");
        snprintf(name, sizeof(name), "%s", p);
        name[strcspn(name, " \n")] = '\0';
        for (int i = 0; i < n; i++)
            seen = seen || strcmp(names[i], name) == 0;
        if (!seen && n < max)
            snprintf(names[n++], 128, "%s", name);
    }
    fclose(f);
    return n;
}

static bool shm_entry_exists(const char *name)
{
    char path[256];

    snprintf(path, sizeof(path), "/dev/shm/%.200s", name);
    return access(path, F_OK) == 0;
}

static int count_shm_hccl(void)
{
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    int n = 0;

    if (!d)
        return 0;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, "hccl-", 5) == 0)
            n++;
    closedir(d);
    return n;
}

/*
 * A TCP port on 127.0.0.1 that refuses connections until *fd_p is closed: bound, not
 * listening. Held, it cannot become another test's listener meanwhile, nor the local end the
 * kernel picks for one of our connect retries (which would connect the socket to itself).
 */
static int refusing_port(int *fd_p)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    *fd_p = fd;
    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        return -1;
    return ntohs(a.sin_port);
}

/* A TCP port on 127.0.0.1 that was free a moment ago (bound, then closed). */
static int free_port(void)
{
    int fd, port = refusing_port(&fd);

    if (fd >= 0)
        close(fd);
    return port;
}

/* True if text contains the decimal number n standing alone (not inside a longer number). */
static bool has_number(const char *text, long n)
{
    char want[32];
    size_t wl;

    snprintf(want, sizeof(want), "%ld", n);
    wl = strlen(want);
    for (const char *p = strstr(text, want); p; p = strstr(p + 1, want)) {
        bool left = p == text || !(p[-1] >= '0' && p[-1] <= '9');
        bool right = !(p[wl] >= '0' && p[wl] <= '9');
        if (left && right)
            return true;
    }
    return false;
}

/* Temporarily sets or unsets one variable; restore with env_restore. */
typedef struct {
    const char *name;
    char *saved; /* NULL: was unset */
} env_save_t;

static void env_save(env_save_t *s, const char *name)
{
    const char *v = getenv(name);

    s->name = name;
    s->saved = v ? strdup(v) : NULL;
}

static void env_restore(env_save_t *s)
{
    if (s->saved)
        setenv(s->name, s->saved, 1);
    else
        unsetenv(s->name);
    free(s->saved);
    s->saved = NULL;
}

/*
 * hcclGetUniqueId whose rendezvous service gives up after secs (it reads
 * HCCL_CONNECT_TIMEOUT, having no config): bounds the service's life in the
 * failure tests, where it would otherwise wait for missing ranks for 120 s.
 */
static hcclResult_t get_id_bounded(hcclUniqueId *id, int secs)
{
    env_save_t s;
    char v[16];
    hcclResult_t res;

    env_save(&s, "HCCL_CONNECT_TIMEOUT");
    snprintf(v, sizeof(v), "%d", secs);
    setenv("HCCL_CONNECT_TIMEOUT", v, 1);
    res = hcclGetUniqueId(id);
    env_restore(&s);
    return res;
}

/* ---- one thread per rank ---- */

enum { INIT_RANK, INIT_GROUP };

typedef struct {
    /* in */
    int how;
    int rank;
    int nranks;               /* what this rank claims */
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
    size_t ar_bad;            /* wrong elements */
    int count, user_rank;
    hcclResult_t destroy_res;
    int nsegs;                /* hccl- segments mapped while the communicator was alive */
    char segs[16][128];
} rank_arg_t;

static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    hcclComm_t comm = NULL;
    int64_t t0 = now_ms();

    if (a->how == INIT_RANK) {
        hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
        cfg.connectTimeoutMs = a->timeout_ms;
        a->res = hcclCommInitRankConfig(&comm, a->nranks, a->id, a->rank, &cfg);
    } else {
        a->res = hcclCommInitGroup(&comm, (uint32_t)a->nranks, a->commId, (uint32_t)a->rank);
    }
    a->elapsed_ms = now_ms() - t0;
    snprintf(a->err, sizeof(a->err), "%s", hcclGetLastError(NULL));
    if (a->res != hcclSuccess)
        return NULL;

    hcclCommCount(comm, &a->count);
    hcclCommUserRank(comm, &a->user_rank);
    a->nsegs = our_segments(a->segs, 16);
    if (a->allreduce) {
        float *send = malloc(AR_COUNT * sizeof(float));
        float *recv = malloc(AR_COUNT * sizeof(float));
        float n = (float)a->nranks;

        for (size_t i = 0; i < AR_COUNT; i++) {
            send[i] = (float)(a->rank + 1) * (float)(i % 13 + 1);
            recv[i] = -1.0f;
        }
        a->ar_res = hcclAllReduce(send, recv, AR_COUNT, hcclFloat32, hcclSum, comm);
        if (a->ar_res != hcclSuccess)
            snprintf(a->ar_err, sizeof(a->ar_err), "%s", hcclGetLastError(comm));
        for (size_t i = 0; i < AR_COUNT; i++)
            if (recv[i] != n * (n + 1) / 2 * (float)(i % 13 + 1))
                a->ar_bad++;
        free(send);
        free(recv);
    }
    a->destroy_res = hcclCommDestroy(comm);
    return NULL;
}

static void run_ranks(rank_arg_t *args, int n)
{
    pthread_t th[MAX_RANKS];

    for (int i = 0; i < n; i++)
        assert_int_equal(pthread_create(&th[i], NULL, rank_main, &args[i]), 0);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
}

static void fill_rank_args(rank_arg_t *args, int n, const hcclUniqueId *id)
{
    memset(args, 0, (size_t)n * sizeof(*args));
    for (int r = 0; r < n; r++) {
        args[r].how = INIT_RANK;
        args[r].rank = r;
        args[r].nranks = n;
        args[r].id = *id;
        args[r].timeout_ms = CONNECT_TIMEOUT_MS;
        args[r].res = hcclInternalError;
    }
}

static void fill_group_args(rank_arg_t *args, int n, const char *commId)
{
    memset(args, 0, (size_t)n * sizeof(*args));
    for (int r = 0; r < n; r++) {
        args[r].how = INIT_GROUP;
        args[r].rank = r;
        args[r].nranks = n;
        args[r].commId = commId;
        args[r].res = hcclInternalError;
    }
}

static void expect_success(const rank_arg_t *args, int n)
{
    for (int r = 0; r < n; r++) {
        if (args[r].res != hcclSuccess || args[r].ar_res != hcclSuccess)
            print_error("rank %d of %d: init %d (%s), allreduce %d (%s)\n", r, n, args[r].res,
                        args[r].err, args[r].ar_res, args[r].ar_err);
        assert_int_equal(args[r].res, hcclSuccess);
        assert_int_equal(args[r].count, args[r].nranks);
        assert_int_equal(args[r].user_rank, args[r].rank);
        assert_int_equal(args[r].ar_res, hcclSuccess);
        assert_int_equal(args[r].ar_bad, 0);
        assert_int_equal(args[r].destroy_res, hcclSuccess);
    }
}

/* ---- fixtures ---- */

static int setup_watchdog(void **state)
{
    (void)state;
    alarm(WATCHDOG_S); /* a hung test kills the process rather than the CTest budget */
    return 0;
}

static int teardown_watchdog(void **state)
{
    (void)state;
    alarm(0);
    return 0;
}

/* ---- 1 and 10: success, AllReduce, and nothing left behind ---- */

static void run_success(const char *links, int n)
{
    env_save_t s;
    hcclUniqueId id;
    rank_arg_t args[MAX_RANKS];
    char segs[MAX_SEGS][128];
    int fds_before, shm_before, fds_after, shm_after, nsegs = 0, left = 0;
    bool shm = strcmp(links, "shm") == 0;

    env_save(&s, "HCCL_LINKS");
    setenv("HCCL_LINKS", links, 1);
    fds_before = count_fds();
    shm_before = count_shm_hccl();
    assert_true(fds_before > 0);

    assert_int_equal(hcclGetUniqueId(&id), hcclSuccess);
    fill_rank_args(args, n, &id);
    for (int r = 0; r < n; r++)
        args[r].allreduce = true;
    run_ranks(args, n);
    env_restore(&s);
    expect_success(args, n);

    /*
     * The segments seen mapped while the communicators were alive (each rank
     * maps its own): one per rank over shm, none over tcp. After destroy none
     * is mapped or left in /dev/shm.
     */
    for (int r = 0; r < n; r++)
        for (int i = 0; i < args[r].nsegs; i++) {
            bool seen = false;
            for (int j = 0; j < nsegs; j++)
                seen = seen || strcmp(segs[j], args[r].segs[i]) == 0;
            if (!seen && nsegs < MAX_SEGS)
                snprintf(segs[nsegs++], sizeof(segs[0]), "%s", args[r].segs[i]);
        }
    if (shm)
        assert_true(nsegs >= n);
    else
        assert_int_equal(nsegs, 0);
    for (int i = 0; i < nsegs; i++)
        if (shm_entry_exists(segs[i])) {
            print_error("HCCL_LINKS=%s, %d ranks: /dev/shm/%s left behind\n", links, n, segs[i]);
            left++;
        }
    assert_int_equal(left, 0);
    assert_int_equal(our_segments(segs, MAX_SEGS), 0);

    /* The rendezvous service closes its listener right after answering: wait for it. */
    fds_after = wait_fds(fds_before);
    if (fds_after != fds_before)
        print_error("HCCL_LINKS=%s, %d ranks: %d descriptors before, %d after\n", links, n, fds_before,
                    fds_after);
    assert_int_equal(fds_after, fds_before);
    /*
     * The /dev/shm count: other test processes on this machine create (and
     * some leave) hccl- segments of their own meanwhile, so a difference is
     * only reported; this process's segments were checked by name above.
     */
    shm_after = count_shm_hccl();
    if (shm_after != shm_before)
        print_message("note: /dev/shm hccl- entries %d before, %d after (other processes)\n", shm_before,
                      shm_after);
}

static void test_init_tcp(void **state)
{
    static const int sizes[] = {1, 2, 4, 5};

    (void)state;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        run_success("tcp", sizes[i]);
    assert_null(getenv("HCCL_LINKS"));
}

static void test_init_shm(void **state)
{
    static const int sizes[] = {1, 2, 4, 5};

    (void)state;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        run_success("shm", sizes[i]);
    assert_null(getenv("HCCL_LINKS"));
}

/* ---- 2: size mismatch ---- */

static void test_size_mismatch(void **state)
{
    hcclUniqueId id;
    rank_arg_t args[2];

    (void)state;
    assert_int_equal(get_id_bounded(&id, 5), hcclSuccess);
    fill_rank_args(args, 2, &id);
    args[1].nranks = 3;
    run_ranks(args, 2);
    for (int r = 0; r < 2; r++) {
        print_message("rank %d: %s\n", r, args[r].err);
        assert_int_equal(args[r].res, hcclInvalidUsage);
        assert_true(args[r].elapsed_ms < CONNECT_TIMEOUT_MS);
        assert_true(has_number(args[r].err, 2));
        assert_true(has_number(args[r].err, 3));
        /* Whichever rank came second is named with its size. */
        assert_true(strstr(args[r].err, "rank 1 says 3") || strstr(args[r].err, "rank 0 says 2"));
    }
}

/* ---- 3: duplicate rank ---- */

static void test_duplicate_rank(void **state)
{
    hcclUniqueId id;
    rank_arg_t args[2];

    (void)state;
    assert_int_equal(get_id_bounded(&id, 5), hcclSuccess);
    fill_rank_args(args, 2, &id);
    args[1].rank = 0;
    run_ranks(args, 2);
    for (int r = 0; r < 2; r++) {
        print_message("thread %d: %s\n", r, args[r].err);
        assert_int_equal(args[r].res, hcclInvalidUsage);
        assert_true(args[r].elapsed_ms < CONNECT_TIMEOUT_MS);
        assert_non_null(strstr(args[r].err, "rank 0"));
        assert_true(strstr(args[r].err, "twice") || strstr(args[r].err, "duplicate"));
    }
}

/* ---- 4: wrong secret ---- */

static void wrong_secret(const hcclUniqueId *id, rank_arg_t args[2])
{
    fill_rank_args(args, 2, id);
    args[1].id.internal[offsetof(hccl_id_t, secret) + 5] ^= 0x5a;
    run_ranks(args, 2);
    for (int r = 0; r < 2; r++)
        print_message("rank %d: %d %s\n", r, args[r].res, args[r].err);
    assert_int_not_equal(args[1].res, hcclSuccess);
    assert_true(args[1].elapsed_ms < CONNECT_TIMEOUT_MS + SLACK_MS);
    assert_int_equal(args[0].res, hcclTimeout);
    assert_true(args[0].elapsed_ms < CONNECT_TIMEOUT_MS + SLACK_MS);
}

/* The rendezvous gives up before rank 0 does: it tells rank 0 who is missing. */
static void test_wrong_secret_root_timeout_first(void **state)
{
    hcclUniqueId id;
    rank_arg_t args[2];

    (void)state;
    assert_int_equal(get_id_bounded(&id, 1), hcclSuccess);
    wrong_secret(&id, args);
    assert_non_null(strstr(args[0].err, "missing"));
    assert_true(has_number(strstr(args[0].err, "missing"), 1));
}

/*
 * As the contract asks with only the config set: rank 0's connect timeout
 * (config) is a few seconds, the service's is the default, and rank 0's
 * hcclTimeout must still name the missing rank 1.
 */
static void test_wrong_secret_config_timeout(void **state)
{
    hcclUniqueId id;
    rank_arg_t args[2];

    (void)state;
    assert_int_equal(hcclGetUniqueId(&id), hcclSuccess);
    wrong_secret(&id, args);
    if (!strstr(args[0].err, "missing ranks: 1"))
        print_error("rank 0's timeout does not name the missing rank 1: \"%s\"\n", args[0].err);
    assert_non_null(strstr(args[0].err, "missing"));
    assert_true(has_number(strstr(args[0].err, "missing"), 1));
}

/* ---- 5: nobody at the address ---- */

static void test_nobody_listening(void **state)
{
    hcclUniqueId id;
    hccl_id_t raw;
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
    hcclComm_t comm = NULL;
    hcclResult_t res;
    int held, port = refusing_port(&held);
    int64_t t0, elapsed;
    char want[32];

    (void)state;
    assert_true(port > 0);
    assert_int_equal(get_id_bounded(&id, 1), hcclSuccess);
    memcpy(&raw, id.internal, sizeof(raw));
    raw.family = AF_INET;
    raw.port = htons((uint16_t)port);
    memset(raw.addr, 0, sizeof(raw.addr));
    raw.addr[0] = 127;
    raw.addr[3] = 1;
    memcpy(id.internal, &raw, sizeof(raw));

    cfg.connectTimeoutMs = 1500;
    t0 = now_ms();
    res = hcclCommInitRankConfig(&comm, 1, id, 0, &cfg);
    elapsed = now_ms() - t0;
    print_message("after %lld ms: %s\n", (long long)elapsed, hcclGetLastError(NULL));
    assert_int_equal(res, hcclTimeout);
    assert_null(comm);
    assert_true(elapsed >= cfg.connectTimeoutMs - 100);
    assert_true(elapsed < cfg.connectTimeoutMs + SLACK_MS);
    snprintf(want, sizeof(want), "127.0.0.1:%d", port);
    assert_non_null(strstr(hcclGetLastError(NULL), want));
    assert_non_null(strstr(hcclGetLastError(NULL), "rank 0"));
    close(held);
}

/*
 * The text of that timeout keeps the cause found below it (the socket layer's
 * "nobody answered ... (Connection refused)"), once, not a garbled copy of
 * itself.
 */
static void test_nobody_listening_message(void **state)
{
    hcclUniqueId id;
    hccl_id_t raw;
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
    hcclComm_t comm = NULL;
    const char *msg, *first;
    int held, port = refusing_port(&held);

    (void)state;
    assert_true(port > 0);
    assert_int_equal(get_id_bounded(&id, 1), hcclSuccess);
    memcpy(&raw, id.internal, sizeof(raw));
    raw.family = AF_INET;
    raw.port = htons((uint16_t)port);
    memset(raw.addr, 0, sizeof(raw.addr));
    raw.addr[0] = 127;
    raw.addr[3] = 1;
    memcpy(id.internal, &raw, sizeof(raw));
    cfg.connectTimeoutMs = 300;
    assert_int_equal(hcclCommInitRankConfig(&comm, 1, id, 0, &cfg), hcclTimeout);
    msg = hcclGetLastError(NULL);
    first = strstr(msg, "cannot reach the rendezvous");
    if (!strstr(msg, "nobody answered") || !first || strstr(first + 1, "cannot reach the rendezvous"))
        print_error("garbled timeout message: \"%s\"\n", msg);
    assert_non_null(first);
    assert_null(strstr(first + 1, "cannot reach the rendezvous"));
    assert_non_null(strstr(msg, "nobody answered"));
    close(held);
}

/* ---- 6: hcclCommInitGroup ---- */

static env_save_t group_timeout;

static int setup_group(void **state)
{
    env_save(&group_timeout, "HCCL_CONNECT_TIMEOUT");
    setenv("HCCL_CONNECT_TIMEOUT", "3", 1);
    return setup_watchdog(state);
}

static int teardown_group(void **state)
{
    env_restore(&group_timeout);
    return teardown_watchdog(state);
}

static void make_comm_id(char *buf, size_t len)
{
    int port = free_port();

    assert_true(port > 0);
    snprintf(buf, len, "127.0.0.1:%d", port);
}

static void test_group_success(void **state)
{
    rank_arg_t args[3];
    char commId[64];

    (void)state;
    make_comm_id(commId, sizeof(commId));
    fill_group_args(args, 3, commId);
    for (int r = 0; r < 3; r++)
        args[r].allreduce = true;
    run_ranks(args, 3);
    expect_success(args, 3);
}

static void test_group_out_of_range(void **state)
{
    rank_arg_t args[3];
    char commId[64];

    (void)state;
    make_comm_id(commId, sizeof(commId));
    fill_group_args(args, 3, commId);
    args[2].rank = 5;
    run_ranks(args, 3);
    for (int r = 0; r < 3; r++)
        print_message("thread %d (rank %d): %d %s\n", r, args[r].rank, args[r].res, args[r].err);
    assert_int_equal(args[2].res, hcclInvalidArgument);
    assert_true(has_number(args[2].err, 5));
    /* Ranks 0 and 1 wait for rank 2, which never comes. */
    for (int r = 0; r < 2; r++) {
        assert_int_equal(args[r].res, hcclTimeout);
        assert_true(args[r].elapsed_ms < 3000 + SLACK_MS);
    }
}

static void test_group_duplicate(void **state)
{
    rank_arg_t args[3];
    char commId[64];

    (void)state;
    make_comm_id(commId, sizeof(commId));
    fill_group_args(args, 3, commId);
    args[2].rank = 1;
    run_ranks(args, 3);
    for (int r = 0; r < 3; r++) {
        print_message("thread %d (rank %d): %d %s\n", r, args[r].rank, args[r].res, args[r].err);
        assert_int_equal(args[r].res, hcclInvalidUsage);
        assert_true(args[r].elapsed_ms < 3000);
        assert_non_null(strstr(args[r].err, "rank 1"));
        assert_true(strstr(args[r].err, "twice") || strstr(args[r].err, "duplicate"));
    }
}

static void test_group_size_mismatch(void **state)
{
    rank_arg_t args[2];
    char commId[64];

    (void)state;
    make_comm_id(commId, sizeof(commId));
    fill_group_args(args, 2, commId);
    args[1].nranks = 3;
    run_ranks(args, 2);
    for (int r = 0; r < 2; r++) {
        print_message("rank %d: %d %s\n", r, args[r].res, args[r].err);
        assert_int_equal(args[r].res, hcclInvalidUsage);
        assert_true(args[r].elapsed_ms < 3000);
        assert_true(has_number(args[r].err, 2));
        assert_true(has_number(args[r].err, 3));
    }
}

/* ---- 7: unique id text ---- */

static void test_unique_id_string(void **state)
{
    hcclUniqueId id, back, bad;
    hccl_id_t raw;
    char text[HCCL_UNIQUE_ID_STRLEN], text2[HCCL_UNIQUE_ID_STRLEN], mod[HCCL_UNIQUE_ID_STRLEN + 2];

    (void)state;
    assert_int_equal(get_id_bounded(&id, 1), hcclSuccess);
    assert_int_equal(hcclUniqueIdToString(&id, text, sizeof(text)), hcclSuccess);
    assert_int_equal(strlen(text), HCCL_UNIQUE_ID_STRLEN - 1);
    assert_int_equal(strspn(text, "0123456789abcdef"), HCCL_UNIQUE_ID_STRLEN - 1);
    memset(&back, 0xee, sizeof(back));
    assert_int_equal(hcclUniqueIdFromString(&back, text), hcclSuccess);
    assert_memory_equal(&back, &id, sizeof(id));
    assert_int_equal(hcclUniqueIdToString(&back, text2, sizeof(text2)), hcclSuccess);
    assert_string_equal(text, text2);

    /* A short buffer, NULLs. */
    assert_int_equal(hcclUniqueIdToString(&id, text2, 256), hcclInvalidArgument);
    assert_true(strlen(hcclGetLastError(NULL)) > 0);
    assert_int_equal(hcclUniqueIdToString(NULL, text2, sizeof(text2)), hcclInvalidArgument);
    assert_int_equal(hcclUniqueIdToString(&id, NULL, sizeof(text2)), hcclInvalidArgument);
    assert_int_equal(hcclUniqueIdFromString(NULL, text), hcclInvalidArgument);
    assert_int_equal(hcclUniqueIdFromString(&back, NULL), hcclInvalidArgument);

    /* Not hex; upper case is hex. */
    memcpy(mod, text, sizeof(text));
    mod[40] = 'g';
    assert_int_equal(hcclUniqueIdFromString(&back, mod), hcclInvalidArgument);
    memcpy(mod, text, sizeof(text));
    mod[41] = ' ';
    assert_int_equal(hcclUniqueIdFromString(&back, mod), hcclInvalidArgument);
    /* Wrong lengths. */
    memcpy(mod, text, sizeof(text));
    mod[HCCL_UNIQUE_ID_STRLEN - 2] = '\0';
    assert_int_equal(hcclUniqueIdFromString(&back, mod), hcclInvalidArgument);
    mod[HCCL_UNIQUE_ID_STRLEN - 3] = '\0';
    assert_int_equal(hcclUniqueIdFromString(&back, mod), hcclInvalidArgument);
    memcpy(mod, text, sizeof(text));
    mod[HCCL_UNIQUE_ID_STRLEN - 1] = '0';
    mod[HCCL_UNIQUE_ID_STRLEN] = '0';
    mod[HCCL_UNIQUE_ID_STRLEN + 1] = '\0';
    assert_int_equal(hcclUniqueIdFromString(&back, mod), hcclInvalidArgument);
    assert_int_equal(hcclUniqueIdFromString(&back, ""), hcclInvalidArgument);
    /* Right length, valid hex, wrong magic. */
    bad = id;
    memcpy(&raw, bad.internal, sizeof(raw));
    raw.magic ^= 0x01000000u;
    memcpy(bad.internal, &raw, sizeof(raw));
    assert_int_equal(hcclUniqueIdToString(&bad, mod, sizeof(mod)), hcclSuccess);
    memset(&back, 0, sizeof(back));
    assert_int_equal(hcclUniqueIdFromString(&back, mod), hcclInvalidArgument);
    assert_true(strlen(hcclGetLastError(NULL)) > 0);
    /* An all-zero id is not one either. */
    memset(&bad, 0, sizeof(bad));
    assert_int_equal(hcclUniqueIdToString(&bad, mod, sizeof(mod)), hcclSuccess);
    assert_int_equal(hcclUniqueIdFromString(&back, mod), hcclInvalidArgument);
}

/* ---- 8: hcclCommInitFromEnv ---- */

static const char *const launcher_vars[] = {
    "HCCL_COMM_ID", "RANK_ID",   "WORLD_SIZE",   "RANK",     "MASTER_ADDR",          "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",      "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
    "SLURM_NTASKS", "HCCL_COMM_SECRET", "HCCL_CONNECT_TIMEOUT", "LOCAL_RANK",
};
#define N_LAUNCHER_VARS (sizeof(launcher_vars) / sizeof(launcher_vars[0]))
static env_save_t launcher_saved[N_LAUNCHER_VARS];

static int setup_env(void **state)
{
    for (size_t i = 0; i < N_LAUNCHER_VARS; i++) {
        env_save(&launcher_saved[i], launcher_vars[i]);
        unsetenv(launcher_vars[i]);
    }
    setenv("HCCL_CONNECT_TIMEOUT", "3", 1);
    return setup_watchdog(state);
}

static int teardown_env(void **state)
{
    for (size_t i = 0; i < N_LAUNCHER_VARS; i++)
        env_restore(&launcher_saved[i]);
    return teardown_watchdog(state);
}

static void test_from_env_hccl_vars(void **state)
{
    hcclComm_t comm = NULL;
    char commId[64];
    float x[4] = {1, 2, 3, 4};
    int n = -1, r = -1;

    (void)state;
    make_comm_id(commId, sizeof(commId));
    setenv("HCCL_COMM_ID", commId, 1);
    setenv("RANK_ID", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    if (hcclCommInitFromEnv(&comm) != hcclSuccess)
        print_error("%s\n", hcclGetLastError(NULL));
    assert_non_null(comm);
    assert_int_equal(hcclCommCount(comm, &n), hcclSuccess);
    assert_int_equal(hcclCommUserRank(comm, &r), hcclSuccess);
    assert_int_equal(n, 1);
    assert_int_equal(r, 0);
    assert_int_equal(hcclAllReduce(x, x, 4, hcclFloat32, hcclSum, comm), hcclSuccess);
    assert_true(x[0] == 1 && x[3] == 4);
    assert_int_equal(hcclCommDestroy(comm), hcclSuccess);
}

static void test_from_env_nothing(void **state)
{
    hcclComm_t comm = NULL;

    (void)state;
    assert_int_equal(hcclCommInitFromEnv(&comm), hcclInvalidUsage);
    assert_null(comm);
    assert_non_null(strstr(hcclGetLastError(NULL), "HCCL_COMM_ID"));
    assert_int_equal(hcclCommInitFromEnv(NULL), hcclInvalidArgument);
}

static void test_from_env_torchrun_no_addr(void **state)
{
    hcclComm_t comm = NULL;

    (void)state;
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    assert_int_equal(hcclCommInitFromEnv(&comm), hcclInvalidUsage);
    assert_null(comm);
    print_message("%s\n", hcclGetLastError(NULL));
    assert_true(strstr(hcclGetLastError(NULL), "HCCL_COMM_ID") ||
                strstr(hcclGetLastError(NULL), "MASTER_ADDR"));
    /* MASTER_ADDR alone is not a rendezvous either. */
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    assert_int_equal(hcclCommInitFromEnv(&comm), hcclInvalidUsage);
    assert_null(comm);
}

/* ---- 9: versions and error strings ---- */

static void *fresh_thread(void *p)
{
    const char *e = hcclGetLastError(NULL);

    *(bool *)p = e != NULL && e[0] == '\0';
    return NULL;
}

static void test_version_and_errors(void **state)
{
    int v = -1;
    pthread_t th;
    bool fresh_empty = false;

    (void)state;
    assert_int_equal(hcclGetVersion(&v), hcclSuccess);
    assert_int_equal(v, HCCL_MAJOR * 10000 + HCCL_MINOR * 100 + HCCL_PATCH);
    assert_int_equal(v, HCCL_VERSION_CODE);
    assert_int_equal(hcclGetVersion(NULL), hcclInvalidArgument);
    assert_true(strlen(hcclGetLastError(NULL)) > 0);

    for (int a = 0; a < hcclNumResults; a++) {
        const char *sa = hcclGetErrorString((hcclResult_t)a);
        assert_non_null(sa);
        assert_true(strlen(sa) > 0);
        for (int b = 0; b < a; b++)
            assert_string_not_equal(sa, hcclGetErrorString((hcclResult_t)b));
    }
    assert_non_null(hcclGetErrorString(hcclNumResults));
    assert_non_null(hcclGetErrorString((hcclResult_t)-1));
    assert_non_null(hcclGetErrorString((hcclResult_t)12345));

    assert_int_equal(pthread_create(&th, NULL, fresh_thread, &fresh_empty), 0);
    pthread_join(th, NULL);
    assert_true(fresh_empty);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        /* Success first: the fd counts are exact while no failed rendezvous lingers. */
        cmocka_unit_test_setup_teardown(test_init_tcp, setup_watchdog, teardown_watchdog),
        cmocka_unit_test_setup_teardown(test_init_shm, setup_watchdog, teardown_watchdog),
        cmocka_unit_test_setup_teardown(test_version_and_errors, setup_watchdog, teardown_watchdog),
        cmocka_unit_test_setup_teardown(test_unique_id_string, setup_watchdog, teardown_watchdog),
        cmocka_unit_test_setup_teardown(test_size_mismatch, setup_watchdog, teardown_watchdog),
        cmocka_unit_test_setup_teardown(test_duplicate_rank, setup_watchdog, teardown_watchdog),
        cmocka_unit_test_setup_teardown(test_wrong_secret_root_timeout_first, setup_watchdog,
                                        teardown_watchdog),
        cmocka_unit_test_setup_teardown(test_wrong_secret_config_timeout, setup_watchdog,
                                        teardown_watchdog),
        cmocka_unit_test_setup_teardown(test_nobody_listening, setup_watchdog, teardown_watchdog),
        cmocka_unit_test_setup_teardown(test_nobody_listening_message, setup_watchdog,
                                        teardown_watchdog),
        cmocka_unit_test_setup_teardown(test_group_success, setup_group, teardown_group),
        cmocka_unit_test_setup_teardown(test_group_out_of_range, setup_group, teardown_group),
        cmocka_unit_test_setup_teardown(test_group_duplicate, setup_group, teardown_group),
        cmocka_unit_test_setup_teardown(test_group_size_mismatch, setup_group, teardown_group),
        cmocka_unit_test_setup_teardown(test_from_env_hccl_vars, setup_env, teardown_env),
        cmocka_unit_test_setup_teardown(test_from_env_nothing, setup_env, teardown_env),
        cmocka_unit_test_setup_teardown(test_from_env_torchrun_no_addr, setup_env, teardown_env),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
