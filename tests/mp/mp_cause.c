/*
 * One fault, and what every rank reports about it (tests/mp/cause_test.sh), under hccl-run:
 *
 *   mp_cause --case kill|late|mismatch|absent|fault --victim V [--late-ms MS]
 *
 *   kill      the victim kills itself before its second AllReduce
 *   late      the victim calls its second AllReduce MS ms late (HCCL_EXEC_TIMEOUT set by the
 *             script); it stays and reports too
 *   mismatch  with HCCL_CHECK=1, the victim calls Broadcast where the others call AllReduce;
 *             every rank aborts the moment it sees its error
 *   absent    the victim never joins
 *   fault     every rank runs the same calls; HCCL_FAULT (set by the script) kills the victim
 *             at a point of the communicator's life or cuts one of its links; a rank whose
 *             init fails reports that
 *
 * "MARK rank=R what=kill|post|init t=MS" lines give the moments the fault starts from.
 * Each reporting rank prints one line: "CAUSE rank=R res=CODE async=CODE text=TEXT", TEXT
 * being hcclGetLastError from its "root cause at" on; the script checks that they agree.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hccl.h"

#define COUNT 4096
#define NCOLL 4

static const char *res_name(hcclResult_t r)
{
    static const char *const names[] = {
        "hcclSuccess",     "hcclInvalidArgument", "hcclInvalidUsage", "hcclSystemError",
        "hcclRemoteError", "hcclTimeout",         "hcclInProgress",   "hcclAborted",
        "hcclUnsupported", "hcclInternalError"};

    return (unsigned)r < sizeof(names) / sizeof(names[0]) ? names[r] : "unknown";
}

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The moment a fault starts, as this rank sees it (bench/fault_matrix.sh times errors from it). */
static void mark(int rank, const char *what)
{
    printf("MARK rank=%d what=%s t=%.3f\n", rank, what, now_ms());
    fflush(stdout);
}

static void report(int rank, hcclResult_t res, hcclResult_t async, double t, const char *msg)
{
    const char *root = strstr(msg, "root cause at");

    printf("CAUSE rank=%d res=%s async=%s t=%.3f text=%s\n", rank, res_name(res), res_name(async),
           t, root ? root : msg);
    printf("FULL rank=%d %s\n", rank, msg);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    const char *kase = "";
    int victim = -1, late_ms = 3000, rank, n;
    static float buf[COUNT];
    hcclResult_t res = hcclSuccess, async = hcclSuccess;
    hcclComm_t comm = NULL;
    char msg[1024];

    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--case"))
            kase = argv[i + 1];
        else if (!strcmp(argv[i], "--victim"))
            victim = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--late-ms"))
            late_ms = atoi(argv[i + 1]);
    }
    rank = getenv("RANK_ID") ? atoi(getenv("RANK_ID")) : -1;
    n = getenv("WORLD_SIZE") ? atoi(getenv("WORLD_SIZE")) : 0;
    if (rank < 0 || victim < 0 || victim >= n) {
        fprintf(stderr, "usage: mp_cause --case C --victim V (under hccl-run)\n");
        return 2;
    }
    if (!strcmp(kase, "absent")) {
        if (rank == victim)
            return 0;
        mark(rank, "init");
        res = hcclCommInitFromEnv(&comm);
        snprintf(msg, sizeof(msg), "%s", hcclGetLastError(NULL));
        report(rank, res, hcclSuccess, now_ms(), msg);
        if (res == hcclSuccess)
            hcclCommDestroy(comm);
        return res == hcclSuccess;
    }
    res = hcclCommInitFromEnv(&comm);
    if (res != hcclSuccess && !strcmp(kase, "fault")) {
        snprintf(msg, sizeof(msg), "%s", hcclGetLastError(NULL));
        report(rank, res, hcclSuccess, now_ms(), msg);
        return 0;
    }
    if (res != hcclSuccess) {
        fprintf(stderr, "rank %d: init: %s\n", rank, hcclGetLastError(NULL));
        return 1;
    }
    for (int it = 0; it < NCOLL && res == hcclSuccess; it++) {
        hcclRequest_t req;
        for (int i = 0; i < COUNT; i++)
            buf[i] = (float)(rank + i % 3);
        if (it == 1 && rank == victim) {
            if (!strcmp(kase, "kill")) {
                mark(rank, "kill");
                raise(SIGKILL);
            }
            if (!strcmp(kase, "late"))
                nanosleep(&(struct timespec){late_ms / 1000, (late_ms % 1000) * 1000000L}, NULL);
        }
        if (it == 1)
            mark(rank, "post");
        if (it == 1 && rank == victim && !strcmp(kase, "mismatch"))
            res = hcclBroadcastAsync(buf, COUNT, hcclFloat32, 0, comm, &req);
        else
            res = hcclAllReduceAsync(buf, buf, COUNT, hcclFloat32, hcclSum, comm, &req);
        if (res == hcclSuccess)
            res = hcclWait(&req);
    }
    snprintf(msg, sizeof(msg), "%s", hcclGetLastError(comm));
    if (res == hcclSuccess) {
        fprintf(stderr, "rank %d: every collective succeeded despite the fault\n", rank);
        hcclCommDestroy(comm);
        return 1;
    }
    if (!strcmp(kase, "mismatch")) {
        double t = now_ms();
        /* At once, as a user who sees an error does: the peers must still hear the cause. */
        hcclCommAbort(comm);
        report(rank, res, hcclSuccess, t, msg);
        return 0;
    }
    double t = now_ms();
    if (hcclCommGetAsyncError(comm, &async) != hcclSuccess)
        async = hcclInternalError;
    report(rank, res, async, t, msg);
    hcclCommAbort(comm);
    return 0;
}
