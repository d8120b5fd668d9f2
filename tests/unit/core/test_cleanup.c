/*
 * Nothing is left behind: communicators over shm and tcp, destroyed or aborted (with a
 * request in flight), cycle after cycle, leave this process with as many file descriptors,
 * threads and /dev/shm segments of its own as before (HCCL_DUMP_ON_SIGNAL on, so its thread
 * and handler come and go too). And a segment whose creator died before unlinking it is
 * reclaimed by the next shm set-up, while a live process's is not.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/comm.h"
#include "links/shm/shm.h"
#include "pair.h"

#define COUNT 1024

static int count_dir(const char *path, const char *prefix)
{
    DIR *d = opendir(path);
    struct dirent *e;
    int n = 0;

    assert_non_null(d);
    while ((e = readdir(d)))
        n += e->d_name[0] != '.' && (!prefix || strncmp(e->d_name, prefix, strlen(prefix)) == 0);
    closedir(d);
    return n;
}

typedef struct {
    int fds;
    int tasks;
    int segments;
} usage_t;

static usage_t usage_now(void)
{
    char mine[48];
    struct stat st;
    usage_t u;

    /* Our segments: "hccl-", our pid namespace and our pid (see links/shm/shm_seg.c). */
    assert_int_equal(stat("/proc/self/ns/pid", &st), 0);
    snprintf(mine, sizeof(mine), "hccl-%08x%08x", (unsigned)(uint32_t)st.st_ino, (unsigned)getpid());
    u.fds = count_dir("/proc/self/fd", NULL) - 1; /* less opendir's own */
    u.tasks = count_dir("/proc/self/task", NULL);
    u.segments = count_dir("/dev/shm", mine);
    return u;
}

/*
 * The rendezvous service of hcclGetUniqueId is a thread that ends on its own right after it
 * answered the ranks: the library joins it once it ended, which we wait for (bounded) before
 * counting.
 */
static void expect_usage(usage_t base, int cycle)
{
    usage_t u;

    assert_true(hccl_bootstrap_quiesce(hccl_now_ms() + 10000));
    u = usage_now();
    printf("cycle %d: %d fds, %d threads, %d segments (before: %d, %d, %d)\n", cycle, u.fds,
           u.tasks, u.segments, base.fds, base.tasks, base.segments);
    assert_int_equal(u.fds, base.fds);
    assert_int_equal(u.tasks, base.tasks);
    assert_int_equal(u.segments, base.segments);
}

/* One pair: a checked AllReduce, then destroy; or one left in flight on rank 0, then abort. */
static void pair_cycle(const char *link, bool abort_it)
{
    static float a[COUNT], b[COUNT];
    hcclComm_t comms[2] = {NULL, NULL};
    hcclRequest_t reqs[2];
    struct sigaction sa;

    assert_true(pair_create(link, comms));
    assert_int_equal(sigaction(SIGUSR1, NULL, &sa), 0);
    assert_true(sa.sa_handler != SIG_DFL);
    for (int i = 0; i < COUNT; i++)
        a[i] = b[i] = 1.0f;
    assert_int_equal(hcclAllReduceAsync(a, a, COUNT, hcclFloat32, hcclSum, comms[0], &reqs[0]), hcclSuccess);
    if (abort_it) {
        assert_true(pair_sync_reactor(comms[0], 0));
        assert_int_equal(hcclCommAbort(comms[0]), hcclSuccess);
        assert_int_equal(hcclWait(&reqs[0]), hcclAborted);
        assert_int_equal(hcclCommAbort(comms[1]), hcclSuccess);
        return;
    }
    assert_int_equal(hcclAllReduceAsync(b, b, COUNT, hcclFloat32, hcclSum, comms[1], &reqs[1]), hcclSuccess);
    assert_int_equal(hcclWaitAll(2, reqs), hcclSuccess);
    assert_true(a[0] == 2.0f && b[COUNT - 1] == 2.0f);
    assert_int_equal(hcclCommDestroy(comms[0]), hcclSuccess);
    assert_int_equal(hcclCommDestroy(comms[1]), hcclSuccess);
}

static void test_no_leaks(void **state)
{
    struct sigaction sa;
    usage_t base;

    (void)state;
    setenv("HCCL_DUMP_ON_SIGNAL", "1", 1);
    /* A first round sets up what lives as long as the process (the log, libevent's locks). */
    pair_cycle("shm", false);
    base = usage_now();
    expect_usage(base, 0);
    for (int cycle = 1; cycle <= 3; cycle++) {
        pair_cycle("shm", false);
        pair_cycle("shm", true);
        pair_cycle("tcp", false);
        pair_cycle("tcp", true);
        expect_usage(base, cycle);
        assert_int_equal(sigaction(SIGUSR1, NULL, &sa), 0);
        assert_true(sa.sa_handler == SIG_DFL);
    }
    unsetenv("HCCL_DUMP_ON_SIGNAL");
}

static bool segment_exists(const char *name)
{
    char path[96];
    struct stat st;

    snprintf(path, sizeof(path), "/dev/shm%s", name);
    return stat(path, &st) == 0;
}

/* A segment whose creator is gone is removed by the next shm set-up; a live one is not. */
static void test_stale_segment_reclaimed(void **state)
{
    char dead_name[64], live_name[64];
    int pipefd[2], status, fd;
    pid_t child;

    (void)state;
    assert_int_equal(pipe(pipefd), 0);
    child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        /* Made and never unlinked, as by a rank killed inside hcclCommInitRank. */
        char name[64];
        close(pipefd[0]);
        if (hccl_shm_seg_name(name, sizeof(name)) != hcclSuccess)
            _exit(1);
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0 || write(pipefd[1], name, sizeof(name)) != (ssize_t)sizeof(name))
            _exit(1);
        _exit(0);
    }
    close(pipefd[1]);
    assert_int_equal(read(pipefd[0], dead_name, sizeof(dead_name)), (ssize_t)sizeof(dead_name));
    close(pipefd[0]);
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    assert_int_equal(hccl_shm_seg_name(live_name, sizeof(live_name)), hcclSuccess);
    fd = shm_open(live_name, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    close(fd);
    /* Another test's shm set-up, run beside this one (ctest -j), may reclaim it first: what
     * counts is that it is gone after ours, not which of us removed it. */
    hccl_shm_reclaim_stale();
    assert_false(segment_exists(dead_name));
    assert_true(segment_exists(live_name)); /* ours: we are alive */
    shm_unlink(live_name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_leaks),
        cmocka_unit_test(test_stale_segment_reclaimed),
    };

    setenv("HCCL_CALIBRATE", "0", 1);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
