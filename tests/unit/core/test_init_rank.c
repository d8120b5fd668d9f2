/*
 * hcclCommInitRankConfig's rendezvous, in one process with one thread per rank: success over
 * tcp and shm at 1, 2, 4 and 5 ranks (with an AllReduce and a check that destroy gives back
 * every file descriptor and shared-memory segment), size mismatches, duplicate ranks, a wrong
 * secret and nobody at the address. Every wait is bounded by a connect timeout of a few
 * seconds, and a watchdog alarm ends a stuck test.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "bootstrap_helpers.h"
#include "core/comm.h"
#include "hccl.h"

#define CONNECT_TIMEOUT_MS 2500
#define MAX_SEGS 64

/* ---- helpers ---- */

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

/* ---- one thread per rank ---- */

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
        print_error("HCCL_LINKS=%s, %d ranks: %d descriptors before, %d after\n", links, n,
                    fds_before, fds_after);
    assert_int_equal(fds_after, fds_before);
    /*
     * The /dev/shm count: other test processes on this machine create (and
     * some leave) hccl- segments of their own meanwhile, so a difference is
     * only reported; this process's segments were checked by name above.
     */
    shm_after = count_shm_hccl();
    if (shm_after != shm_before)
        print_message("note: /dev/shm hccl- entries %d before, %d after (other processes)\n",
                      shm_before, shm_after);
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
    if (!strstr(msg, "nobody answered") || !first ||
        strstr(first + 1, "cannot reach the rendezvous"))
        print_error("garbled timeout message: \"%s\"\n", msg);
    assert_non_null(first);
    assert_null(strstr(first + 1, "cannot reach the rendezvous"));
    assert_non_null(strstr(msg, "nobody answered"));
    close(held);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        /* Success first: the fd counts are exact while no failed rendezvous lingers. */
        cmocka_unit_test_setup_teardown(test_init_tcp, setup_watchdog, teardown_watchdog),
        cmocka_unit_test_setup_teardown(test_init_shm, setup_watchdog, teardown_watchdog),
        cmocka_unit_test_setup_teardown(test_size_mismatch, setup_watchdog, teardown_watchdog),
        cmocka_unit_test_setup_teardown(test_duplicate_rank, setup_watchdog, teardown_watchdog),
        cmocka_unit_test_setup_teardown(test_wrong_secret_root_timeout_first, setup_watchdog,
                                        teardown_watchdog),
        cmocka_unit_test_setup_teardown(test_wrong_secret_config_timeout, setup_watchdog,
                                        teardown_watchdog),
        cmocka_unit_test_setup_teardown(test_nobody_listening, setup_watchdog, teardown_watchdog),
        cmocka_unit_test_setup_teardown(test_nobody_listening_message, setup_watchdog,
                                        teardown_watchdog),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
