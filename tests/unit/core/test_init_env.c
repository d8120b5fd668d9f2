/*
 * hcclCommInitFromEnv's choice of rendezvous when a PMIx launcher's variables are set, without
 * a launcher: an address given (HCCL_COMM_ID, torchrun's MASTER_ADDR) wins and PMIx is never
 * touched; without one the PMIx path is taken, and with no server to reach it fails at once,
 * naming PMIx_Init (a build without PMIx says what it lacks). tests/mp/pmix_test.sh and
 * slurm_test.sh run the PMIx path under real launchers.
 */
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/pmix.h"
#include "hccl.h"

static const char *const vars[] = {
    "HCCL_COMM_ID",     "RANK_ID",           "WORLD_SIZE",           "RANK",
    "MASTER_ADDR",      "MASTER_PORT",       "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",         "PMI_SIZE",          "SLURM_PROCID",         "SLURM_NTASKS",
    "PMIX_RANK",        "PMIX_NAMESPACE",    "PMIX_SERVER_URI4",     "PMIX_SERVER_URI3",
    "PMIX_SERVER_URI2", "PMIX_SERVER_URI21", "PMIX_SERVER_URI41",
};

static int setup(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        unsetenv(vars[i]);
    setenv("HCCL_CONNECT_TIMEOUT", "5", 1);
    /* What a PMIx launcher sets, without its server. */
    setenv("PMIX_RANK", "0", 1);
    setenv("PMIX_NAMESPACE", "hccl-test", 1);
    return 0;
}

/* A port nobody listens on now, as text. */
static void free_port(char *buf, size_t len)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    snprintf(buf, len, "%u", ntohs(sa.sin_port));
    close(fd);
}

static void expect_one_rank(void)
{
    hcclComm_t comm = NULL;
    int n = -1;

    if (hcclCommInitFromEnv(&comm) != hcclSuccess)
        print_error("%s\n", hcclGetLastError(NULL));
    assert_non_null(comm);
    assert_int_equal(hcclCommCount(comm, &n), hcclSuccess);
    assert_int_equal(n, 1);
    assert_int_equal(hcclCommDestroy(comm), hcclSuccess);
}

static void test_commid_wins(void **state)
{
    char port[16], addr[32];

    (void)state;
    free_port(port, sizeof(port));
    snprintf(addr, sizeof(addr), "127.0.0.1:%s", port);
    setenv("HCCL_COMM_ID", addr, 1);
    setenv("RANK_ID", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    expect_one_rank();
}

static void test_torchrun_wins(void **state)
{
    char port[16];

    (void)state;
    free_port(port, sizeof(port));
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port, 1);
    expect_one_rank();
}

/* Open MPI's variables and no address: the PMIx path, which fails at PMIx_Init here. */
static void test_no_address_takes_pmix(void **state)
{
    hcclComm_t comm = NULL;
    time_t t0 = time(NULL);
    hcclResult_t res;

    (void)state;
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
    res = hcclCommInitFromEnv(&comm);
    assert_null(comm);
    if (hccl_pmix_built()) {
        assert_int_equal(res, hcclSystemError);
        assert_non_null(strstr(hcclGetLastError(NULL), "PMIx_Init failed: "));
    } else {
        assert_int_equal(res, hcclInvalidUsage);
        assert_non_null(strstr(hcclGetLastError(NULL), "build hccl with PMIx"));
    }
    assert_true(time(NULL) - t0 < 5); /* at once, not at the connect timeout */
}

/* Only the PMIx variables: the same. */
static void test_pmix_alone(void **state)
{
    hcclComm_t comm = NULL;
    hcclResult_t res;

    (void)state;
    res = hcclCommInitFromEnv(&comm);
    assert_null(comm);
    assert_int_equal(res, hccl_pmix_built() ? hcclSystemError : hcclInvalidUsage);
    assert_non_null(
        strstr(hcclGetLastError(NULL), hccl_pmix_built() ? "PMIx_Init" : "PMIx launcher"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_commid_wins, setup),
        cmocka_unit_test_setup(test_torchrun_wins, setup),
        cmocka_unit_test_setup(test_no_address_takes_pmix, setup),
        cmocka_unit_test_setup(test_pmix_alone, setup),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
