/*
 * The workload of tests/mp/chaos_test.sh: AllReduces of checked float32 data, one after the
 * other, while the script cuts a link, kills a rank or slows a link under it.
 *
 *   mp_chaos --ready FIFO [--bytes B] [--iters N] [--expect RESULT[,RESULT...]]
 *
 * After two AllReduces every rank writes "RANK PID" to FIFO (the script's cue to strike) and
 * goes on. With --iters N it stops after N more and prints "rank R: completed N"; without, it
 * runs until a call fails and prints "rank R: error NAME at EPOCH_S: MESSAGE" (the wall-clock
 * time, which the script compares with the moment it struck). The result must be one of
 * --expect (default hcclRemoteError), hcclCommGetAsyncError must report it, and
 * hcclCommAbort must succeed: then the rank exits 0.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hccl.h"

static int g_rank = -1;

static double epoch_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *result_name(hcclResult_t res)
{
    static const char *const names[] = {
        "hcclSuccess",   "hcclInvalidArgument", "hcclInvalidUsage", "hcclSystemError",
        "hcclRemoteError", "hcclTimeout",       "hcclInProgress",   "hcclAborted",
        "hcclUnsupported", "hcclInternalError",
    };

    return (unsigned)res < sizeof(names) / sizeof(names[0]) ? names[res] : "unknown";
}

static int expected(const char *list, hcclResult_t res)
{
    const char *name = result_name(res);
    size_t len = strlen(name);

    for (const char *p = list; (p = strstr(p, name)) != NULL; p += len)
        if ((p == list || p[-1] == ',') && (p[len] == '\0' || p[len] == ','))
            return 1;
    return 0;
}

/* One AllReduce; every element must come back as the sum of the ranks' contributions. */
static hcclResult_t checked_allreduce(hcclComm_t comm, float *buf, size_t count, int n, int iter)
{
    hcclResult_t res;
    float want = 0;

    for (int r = 0; r < n; r++)
        want += (float)(r + iter % 7);
    for (size_t i = 0; i < count; i++)
        buf[i] = (float)(g_rank + iter % 7);
    res = hcclAllReduce(buf, buf, count, hcclFloat32, hcclSum, comm);
    if (res != hcclSuccess)
        return res;
    for (size_t i = 0; i < count; i++)
        if (buf[i] != want) {
            fprintf(stderr, "rank %d: iteration %d: element %zu is %g, want %g\n", g_rank, iter, i,
                    (double)buf[i], (double)want);
            exit(1);
        }
    return hcclSuccess;
}

int main(int argc, char **argv)
{
    const char *ready = NULL, *expect = "hcclRemoteError";
    size_t bytes = 4u << 20;
    long iters = -1;
    hcclComm_t comm;
    hcclResult_t res, async;
    int n, iter;
    float *buf;

    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--ready"))
            ready = argv[i + 1];
        else if (!strcmp(argv[i], "--bytes"))
            bytes = strtoull(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--iters"))
            iters = strtol(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--expect"))
            expect = argv[i + 1];
    }
    if (!ready) {
        fprintf(stderr, "usage: mp_chaos --ready FIFO [--bytes B] [--iters N] [--expect RESULTS]\n");
        return 2;
    }
    res = hcclCommInitFromEnv(&comm);
    if (res != hcclSuccess) {
        fprintf(stderr, "init: %s: %s\n", hcclGetErrorString(res), hcclGetLastError(NULL));
        return 1;
    }
    hcclCommUserRank(comm, &g_rank);
    hcclCommCount(comm, &n);
    buf = malloc(bytes);
    if (!buf)
        return 1;

    for (iter = 0; iter < 2; iter++)
        if ((res = checked_allreduce(comm, buf, bytes / 4, n, iter)) != hcclSuccess) {
            fprintf(stderr, "rank %d: warm-up failed: %s\n", g_rank, hcclGetLastError(NULL));
            return 1;
        }
    int fd = open(ready, O_WRONLY);
    if (fd < 0 || dprintf(fd, "%d %d\n", g_rank, (int)getpid()) < 0) {
        perror(ready);
        return 1;
    }
    close(fd);

    for (; iters < 0 || iter < iters + 2; iter++)
        if ((res = checked_allreduce(comm, buf, bytes / 4, n, iter)) != hcclSuccess)
            break;
    free(buf);
    if (res == hcclSuccess) {
        printf("rank %d: completed %ld\n", g_rank, iters);
        return hcclCommDestroy(comm) == hcclSuccess ? 0 : 1;
    }
    printf("rank %d: error %s at %.3f: %s\n", g_rank, result_name(res), epoch_s(),
           hcclGetLastError(NULL));
    fflush(stdout);
    if (!expected(expect, res)) {
        printf("rank %d: unexpected result %s (want %s)\n", g_rank, result_name(res), expect);
        return 1;
    }
    if (hcclCommGetAsyncError(comm, &async) != hcclSuccess || async == hcclSuccess) {
        printf("rank %d: hcclCommGetAsyncError does not report the failure\n", g_rank);
        return 1;
    }
    if (hcclCommAbort(comm) != hcclSuccess) {
        printf("rank %d: hcclCommAbort failed: %s\n", g_rank, hcclGetLastError(NULL));
        return 1;
    }
    printf("rank %d: aborted cleanly\n", g_rank);
    return 0;
}
