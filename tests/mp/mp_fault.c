/*
 * One cell of the fault matrix (tests/mp/fault_test.sh), run through hccl-run with HCCL_FAULT
 * set by the script:
 *
 *   mp_fault --case init|idle|mid|destroy|close|delay|absent --victim V --dir D
 *
 * Every rank runs AllReduces (seq 0..) until one fails; a survivor checks the result code,
 * hcclCommGetAsyncError and the error text (its rank, a peer, the collective and its sequence
 * number), aborts, then the ranks other than the victim build a new communicator among
 * themselves (a fresh unique id handed over in D) and run an AllReduce on it. Each rank prints
 * one "FAULTRESULT" line with the time of its error (monotonic ms; the script subtracts the
 * fault's time, which the library logs as "HCCL_FAULT: ... (t=... ms)").
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <time.h>
#include <unistd.h>

#include "hccl.h"

#define NCOLL 6
#define COUNT (64u << 10) /* int32 elements: 256 KiB, enough steps to aim at */

static int g_rank = -1;

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static const char *res_name(hcclResult_t r)
{
    static const char *const names[] = {"hcclSuccess", "hcclInvalidArgument", "hcclInvalidUsage",
                                        "hcclSystemError", "hcclRemoteError", "hcclTimeout",
                                        "hcclInProgress", "hcclAborted", "hcclUnsupported",
                                        "hcclInternalError"};

    return (unsigned)r < sizeof(names) / sizeof(names[0]) ? names[r] : "unknown";
}

static int fail(const char *what, const char *detail)
{
    printf("rank %d: FAIL: %s%s%s\n", g_rank, what, detail ? ": " : "", detail ? detail : "");
    fflush(stdout);
    return 1;
}

/* Waits (on inotify, bounded) until path exists in dir. */
static int wait_for_file(const char *dir, const char *path, int timeout_ms)
{
    double deadline = now_ms() + timeout_ms;
    int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK), rc = -1;
    char buf[4096];

    if (fd < 0 || inotify_add_watch(fd, dir, IN_MOVED_TO | IN_CLOSE_WRITE) < 0)
        goto out;
    while (access(path, F_OK) != 0) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        double left = deadline - now_ms();
        if (left <= 0)
            goto out;
        if (poll(&p, 1, (int)left + 1) > 0)
            while (read(fd, buf, sizeof(buf)) > 0)
                ;
    }
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    return rc;
}

/* The ranks other than the victim form a new communicator and check one AllReduce on it. */
static int rebuild(int rank, int n, int victim, const char *dir)
{
    int newn = n - 1, newrank = rank < victim ? rank : rank - 1;
    char path[PATH_MAX], tmp[PATH_MAX + 8], text[HCCL_UNIQUE_ID_STRLEN];
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
    hcclUniqueId id;
    hcclComm_t comm;
    hcclResult_t res;
    int32_t v = rank + 1, want = 0;

    unsetenv("HCCL_FAULT"); /* the fault was for the first communicator */
    snprintf(path, sizeof(path), "%s/id", dir);
    if (newrank == 0) {
        FILE *f;
        if (hcclGetUniqueId(&id) != hcclSuccess || hcclUniqueIdToString(&id, text, sizeof(text)))
            return fail("hcclGetUniqueId", hcclGetLastError(NULL));
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        f = fopen(tmp, "w");
        if (!f || fputs(text, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0)
            return fail("writing the new id", strerror(errno));
    } else {
        FILE *f;
        if (wait_for_file(dir, path, 60000) != 0)
            return fail("no new unique id appeared", path);
        f = fopen(path, "r");
        if (!f || !fgets(text, sizeof(text), f) || hcclUniqueIdFromString(&id, text) != hcclSuccess)
            return fail("reading the new id", hcclGetLastError(NULL));
        fclose(f);
    }
    cfg.connectTimeoutMs = 60000;
    res = hcclCommInitRankConfig(&comm, newn, id, newrank, &cfg);
    if (res != hcclSuccess)
        return fail("the new communicator", hcclGetLastError(NULL));
    res = hcclAllReduce(&v, &v, 1, hcclInt32, hcclSum, comm);
    for (int r = 0; r < n; r++)
        want += r == victim ? 0 : r + 1;
    if (res != hcclSuccess || v != want)
        return fail("AllReduce on the new communicator", hcclGetLastError(comm));
    if (hcclCommDestroy(comm) != hcclSuccess)
        return fail("hcclCommDestroy of the new communicator", hcclGetLastError(NULL));
    return 0;
}

/*
 * Does msg name another rank (the root cause's origin, or the peer this rank lost) and, when a
 * collective failed, it and its seq? Every rank reports the root cause: a timeout says the
 * exec timeout and which ranks had joined.
 */
static int check_text(const char *msg, int rank, int n, bool coll, hcclResult_t res)
{
    bool peer = false;

    /* "rank 2", "ranks 1,3", "missing ranks: 3": any rank listed other than this one. */
    for (const char *p = strstr(msg, "rank"); p && !peer; p = strstr(p + 1, "rank")) {
        char *end;
        p += 4;
        p += strspn(p, "s: ");
        for (long r = strtol(p, &end, 10); end != p; r = strtol(p, &end, 10)) {
            peer |= r != rank && r >= 0 && r < n;
            p = end + strspn(end, ", ");
        }
    }
    if (!peer)
        return fail("the error does not name a peer", msg);
    if (coll && (!strstr(msg, "allreduce") || !strstr(msg, "seq ")))
        return fail("the error does not name the collective and its sequence number", msg);
    if (res == hcclTimeout && coll && !strstr(msg, "within the exec timeout"))
        return fail("the timeout does not say so", msg);
    if (coll && !strstr(msg, "root cause at rank"))
        return fail("the error does not give the root cause", msg);
    return 0;
}

int main(int argc, char **argv)
{
    const char *kase = "", *dir = "/tmp";
    int victim = -1, rank, n, at = -1;
    static int32_t buf[COUNT];
    hcclResult_t res, async = hcclSuccess;
    hcclComm_t comm = NULL;
    char msg[1024] = "";
    double t_err;
    bool coll;

    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--case"))
            kase = argv[i + 1];
        else if (!strcmp(argv[i], "--victim"))
            victim = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir"))
            dir = argv[i + 1];
    }
    rank = g_rank = getenv("RANK_ID") ? atoi(getenv("RANK_ID")) : -1;
    n = getenv("WORLD_SIZE") ? atoi(getenv("WORLD_SIZE")) : 0;
    if (victim < 0 || victim >= n || rank < 0)
        return fail("usage: mp_fault --case C --victim V --dir D (under hccl-run)", NULL);
    coll = strcmp(kase, "init") != 0 && strcmp(kase, "absent") != 0;
    if (!strcmp(kase, "absent") && rank == victim) {
        printf("rank %d: FAULTRESULT case=absent: this rank stays away (t=%.3f ms)\n", rank, now_ms());
        return 0; /* never joins */
    }
    res = hcclCommInitFromEnv(&comm);
    if (!coll) {
        t_err = now_ms();
        snprintf(msg, sizeof(msg), "%s", hcclGetLastError(NULL));
        if (res == hcclSuccess)
            return fail("the communicator was created although a rank is missing", NULL);
    } else {
        if (res != hcclSuccess)
            return fail("hcclCommInitFromEnv", hcclGetLastError(NULL));
        for (at = 0; at < NCOLL; at++) {
            for (size_t i = 0; i < COUNT; i++)
                buf[i] = (int32_t)(rank + 1 + i % 7);
            /* The victim's own last act: it dies inside destroy, the others wait on it. */
            if (!strcmp(kase, "destroy") && rank == victim && at == 2) {
                hcclCommDestroy(comm);
                return fail("the victim survived its hcclCommDestroy", NULL);
            }
            res = hcclAllReduce(buf, buf, COUNT, hcclInt32, hcclSum, comm);
            if (res != hcclSuccess)
                break;
            for (size_t i = 0; i < COUNT; i++)
                if (buf[i] != (int32_t)(n * (n + 1) / 2 + n * (int)(i % 7)))
                    return fail("wrong AllReduce result before the fault", NULL);
        }
        t_err = now_ms();
        snprintf(msg, sizeof(msg), "%s", hcclGetLastError(comm));
        if (res == hcclSuccess)
            return fail("every collective succeeded despite the fault", NULL);
        if (hcclCommGetAsyncError(comm, &async) != hcclSuccess || async == hcclSuccess)
            return fail("hcclCommGetAsyncError reports no error", res_name(async));
        if (hcclCommAbort(comm) != hcclSuccess)
            return fail("hcclCommAbort", hcclGetLastError(NULL));
    }
    printf("rank %d: FAULTRESULT case=%s res=%s async=%s failed_at=%d t_err=%.3f msg=%s\n", rank,
           kase, res_name(res), res_name(async), at, t_err, msg);
    fflush(stdout);
    /* Every rank tells the same story: the victim of a cut link or a stall may read the root
     * cause at itself (where the fault was), naming no other rank. */
    if (check_text(msg, rank == victim ? -1 : rank, n, coll, res))
        return 1;
    if (rank == victim)
        return 0; /* close and delay: the rank that caused it fails too, and stays out */
    if (rebuild(rank, n, victim, dir))
        return 1;
    printf("rank %d: survivor ok\n", rank);
    return 0;
}
