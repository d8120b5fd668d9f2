/*
 * Communicators whose rendezvous is a "host:port" comm id, in one process with one thread per
 * rank: hcclCommInitGroup's success (with an AllReduce), a rank out of range, a duplicate rank
 * and a size mismatch; hcclCommInitFromEnv with HCCL_COMM_ID, RANK_ID and WORLD_SIZE, with no
 * variable at all, and with torchrun's variables but no address. Every wait is bounded by a
 * connect timeout of a few seconds, and a watchdog alarm ends a stuck test.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "bootstrap_helpers.h"
#include "hccl.h"

/* ---- helpers ---- */

/* A TCP port on 127.0.0.1 that was free a moment ago (bound, then closed). */
static int free_port(void)
{
    int fd, port = refusing_port(&fd);

    if (fd >= 0)
        close(fd);
    return port;
}

/* ---- one thread per rank ---- */

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

/* ---- 8: hcclCommInitFromEnv ---- */

static const char *const launcher_vars[] = {
    "HCCL_COMM_ID",
    "RANK_ID",
    "WORLD_SIZE",
    "RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "HCCL_COMM_SECRET",
    "HCCL_CONNECT_TIMEOUT",
    "LOCAL_RANK",
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

int main(void)
{
    const struct CMUnitTest tests[] = {
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
