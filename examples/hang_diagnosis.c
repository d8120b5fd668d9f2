/*
 * hang_diagnosis: what the classic "my job hangs" failures look like, and that
 * each ends in an error return instead of a hang.
 *
 *   HCCL_CHECK=1 hccl-run -n 4 ./hang_diagnosis mismatch    # hcclInvalidUsage on every rank
 *   hccl-run -n 4 ./hang_diagnosis mismatch                 # see below
 *   HCCL_CHECK=1 hccl-run -n 4 ./hang_diagnosis collective  # hcclInvalidUsage on every rank
 *   hccl-run -n 4 ./hang_diagnosis skip                     # hcclTimeout (exec timeout)
 *   hccl-run -n 4 ./hang_diagnosis missing                  # hcclTimeout (connect timeout)
 *   hccl-run -n 4 ./hang_diagnosis dead                     # hcclRemoteError; hccl-run exits 1
 *
 * mismatch    Rank 0 calls AllReduce with 1024 elements, the others with 2048.
 * collective  Rank 0 calls Broadcast, the others AllReduce.
 *             With HCCL_CHECK=1 the ranks compare every collective's signature
 *             before running it, and every rank gets hcclInvalidUsage naming
 *             both calls. Without it, each message still carries its
 *             collective's signature: a rank that receives a mismatched one
 *             fails with hcclInvalidUsage naming both calls, and failing closes
 *             its links, so its peers fail at once with hcclRemoteError ("peer
 *             ... is gone"). A Broadcast's root only sends, so without
 *             HCCL_CHECK it returns hcclSuccess: collective expects
 *             HCCL_CHECK=1.
 * skip        Rank 0 skips an AllReduce the others call. They wait for it until
 *             the exec timeout, which fails the call with hcclTimeout naming
 *             the ranks still waited on (rank 0); as above, the first rank to
 *             fail closes its links and its peers may get hcclRemoteError.
 *             Before that, a third of the way into the timeout, each waiting
 *             rank prints hcclCommDumpState: the steps not done and the peer
 *             each one waits on.
 * missing     The last rank never calls init. The others get hcclTimeout from
 *             hcclCommInitFromEnv after the connect timeout, naming it.
 * dead        The last rank dies by SIGKILL in the middle of a 64 MiB
 *             AllReduce, once every rank has posted it (a barrier on the
 *             second communicator says so). Every survivor gets hcclRemoteError naming it,
 *             hcclCommGetAsyncError reports it, and hcclCommAbort frees the
 *             communicator. hccl-run then exits non-zero, naming the victim.
 *
 * The scenarios run on a communicator made for them, with an exec timeout
 * (HCCL_EXEC_TIMEOUT seconds, default 5, passed as hcclConfig_t.execTimeoutMs);
 * a second one without a timeout (from hcclCommInitFromEnv) lets the ranks
 * compare their outcomes afterwards. HCCL_DEBUG defaults to INFO here, so the
 * log shows the set-up and the failure as it happens; for missing,
 * HCCL_CONNECT_TIMEOUT defaults to 5 s. Each rank prints the failing call with
 * hcclGetErrorString and hcclGetLastError. Exit 0 when every rank ended with an
 * expected error and at least one with the scenario's own code (all of them
 * with HCCL_CHECK=1, but for skip); exit 1 on a success, another code, or a hang (the
 * launcher's --timeout).
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hccl.h"

static int g_rank = -1;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        hcclResult_t r_ = (call);                                                                  \
        if (r_ != hcclSuccess) {                                                                   \
            fprintf(stderr, "rank %d: %s failed: %s: %s\n", g_rank, #call, hcclGetErrorString(r_), \
                    hcclGetLastError(NULL));                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef enum { OUTCOME_OWN, OUTCOME_PEER, OUTCOME_WRONG } outcome_t;

/*
 * Prints what the call returned. OUTCOME_OWN: the scenario's own code (this rank saw the
 * fault); OUTCOME_PEER: hcclRemoteError because a peer failed first and closed its links
 * (allowed only where peer_ok); OUTCOME_WRONG: anything else, success included.
 */
static outcome_t verdict(const char *call, hcclResult_t got, hcclResult_t want, bool peer_ok,
                         double t0)
{
    printf("rank %d: %s returned %s after %.1f s: %s\n", g_rank, call, hcclGetErrorString(got),
           now_s() - t0, got == hcclSuccess ? "" : hcclGetLastError(NULL));
    if (got == want) {
        printf("rank %d: diagnosis ok: %s as expected\n", g_rank, hcclGetErrorString(want));
        return OUTCOME_OWN;
    }
    if (got == hcclRemoteError && peer_ok) {
        printf("rank %d: diagnosis ok: a peer failed with it first and closed the communicator\n",
               g_rank);
        return OUTCOME_PEER;
    }
    printf("rank %d: UNEXPECTED: wanted %s\n", g_rank, hcclGetErrorString(want));
    return OUTCOME_WRONG;
}

static outcome_t run_mismatch(hcclComm_t comm, bool other_collective, bool checked)
{
    float buf[2048] = {0};
    hcclResult_t res;
    const char *call;
    double t0 = now_s();

    if (other_collective && g_rank == 0) {
        call = "hcclBroadcast(1024 x float32, root 0)";
        res = hcclBroadcast(buf, 1024, hcclFloat32, 0, comm);
        if (!checked)
            printf("rank %d: note: without HCCL_CHECK=1 nothing reaches a Broadcast's root to "
                   "compare its call with\n",
                   g_rank);
    } else if (g_rank == 0) {
        call = "hcclAllReduce(1024 x float32, sum)";
        res = hcclAllReduce(buf, buf, 1024, hcclFloat32, hcclSum, comm);
    } else {
        call = "hcclAllReduce(2048 x float32, sum)";
        res = hcclAllReduce(buf, buf, 2048, hcclFloat32, hcclSum, comm);
    }
    return verdict(call, res, hcclInvalidUsage, !checked, t0);
}

/*
 * Rank 0 skips an AllReduce. The others post it and watch it: one still unfinished after a
 * third of the exec timeout gets its state dumped (hcclCommDumpState: what each step waits
 * on), the way a framework's watchdog would, before the timeout fails it.
 */
static outcome_t run_skip(hcclComm_t comm, double exec_timeout_s)
{
    float buf[1024] = {0};
    double t0 = now_s();
    struct timespec ms = {0, 1000 * 1000};
    hcclRequest_t req;
    hcclResult_t res;
    int done = 0;

    if (g_rank == 0) {
        printf("rank %d: skipping the AllReduce the others call\n", g_rank);
        return OUTCOME_PEER; /* it sees nothing: it never calls */
    }
    CHECK(hcclAllReduceAsync(buf, buf, 1024, hcclFloat32, hcclSum, comm, &req));
    do {
        res = hcclTest(&req, &done);
    } while (!done && now_s() - t0 < exec_timeout_s / 3 && nanosleep(&ms, NULL) == 0);
    if (!done) {
        printf("rank %d: the AllReduce is not done after %.1f s; its state:\n", g_rank,
               now_s() - t0);
        CHECK(hcclCommDumpState(comm, stdout));
        res = hcclWait(&req);
    }
    return verdict("hcclAllReduce(1024 x float32, sum)", res, hcclTimeout, true, t0);
}

static int run_dead(hcclComm_t comm, hcclComm_t ctl, int n)
{
    size_t count = 16u << 20; /* 64 MiB of float32 */
    float *buf = calloc(count, sizeof(float));
    hcclResult_t res, barrier, async = hcclSuccess;
    hcclRequest_t req;
    double t0 = now_s();
    int failed;

    if (!buf)
        return fprintf(stderr, "out of memory\n"), 1;
    res = hcclAllReduceAsync(buf, buf, count, hcclFloat32, hcclSum, comm, &req);
    /* Once the barrier returns every rank has posted the AllReduce: its transfers are under
     * way. The victim may leave it first and die while the others are still in it, so theirs
     * may fail: what they report is the AllReduce's result. */
    barrier = hcclBarrier(ctl);
    if (g_rank == n - 1) {
        CHECK(barrier);
        printf("rank %d: dying by SIGKILL in the middle of the AllReduce\n", g_rank);
        raise(SIGKILL);
    }
    if (res == hcclSuccess)
        res = hcclWait(&req);
    if (res == hcclSuccess) /* the victim had done its part: the next call cannot succeed */
        res = hcclAllReduce(buf, buf, count, hcclFloat32, hcclSum, comm);
    failed = verdict("hcclWait(64 MiB AllReduce)", res, hcclRemoteError, false, t0) != OUTCOME_OWN;
    /* The communicator is broken for good: it says so, and hcclCommAbort still frees it. */
    CHECK(hcclCommGetAsyncError(comm, &async));
    printf("rank %d: hcclCommGetAsyncError: %s\n", g_rank, hcclGetErrorString(async));
    failed |= async != hcclRemoteError;
    CHECK(hcclCommAbort(comm)); /* before buf goes: peers may still be reading from it */
    free(buf);
    return failed;
}

static int run_missing(void)
{
    const char *r = getenv("RANK_ID") ? getenv("RANK_ID") : getenv("RANK");
    const char *w = getenv("WORLD_SIZE");
    hcclComm_t comm;
    hcclResult_t res;
    double t0 = now_s();

    /* The point is a rank that never calls init: only the launcher's variables say who we are. */
    if (!r || !w) {
        fprintf(stderr, "missing: run under a launcher (RANK_ID or RANK, and WORLD_SIZE)\n");
        return 1;
    }
    g_rank = atoi(r);
    if (g_rank == atoi(w) - 1) {
        printf("rank %d: not joining (the missing rank)\n", g_rank);
        return 0;
    }
    res = hcclCommInitFromEnv(&comm);
    if (res == hcclSuccess)
        CHECK(hcclCommDestroy(comm));
    return verdict("hcclCommInitFromEnv", res, hcclTimeout, false, t0) != OUTCOME_OWN;
}

/* The scenario's communicator: the same ranks, with an exec timeout. */
static hcclComm_t scenario_comm(hcclComm_t ctl, int n, double exec_timeout_s)
{
    hcclConfig_t config = HCCL_CONFIG_INITIALIZER;
    char text[HCCL_UNIQUE_ID_STRLEN] = "";
    hcclUniqueId id;
    hcclComm_t comm;

    if (g_rank == 0) {
        CHECK(hcclGetUniqueId(&id));
        CHECK(hcclUniqueIdToString(&id, text, sizeof(text)));
    }
    CHECK(hcclBroadcast(text, sizeof(text), hcclUint8, 0, ctl));
    CHECK(hcclUniqueIdFromString(&id, text));
    config.execTimeoutMs = (int)(exec_timeout_s * 1000);
    CHECK(hcclCommInitRankConfig(&comm, n, id, g_rank, &config));
    return comm;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "", *check = getenv("HCCL_CHECK");
    const char *exec_env = getenv("HCCL_EXEC_TIMEOUT");
    double exec_timeout_s = exec_env ? atof(exec_env) : 5;
    bool checked = check && !strcmp(check, "1");
    int32_t tally[3] = {0, 0, 0}; /* ranks per outcome_t */
    hcclComm_t ctl, comm;
    outcome_t outcome;
    float one = 1;
    int n, failed;

    if (strcmp(mode, "mismatch") && strcmp(mode, "collective") && strcmp(mode, "skip") &&
        strcmp(mode, "missing") && strcmp(mode, "dead")) {
        fprintf(stderr, "usage: %s mismatch|collective|skip|missing|dead\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* a killed job keeps every line printed so far */
    setenv("HCCL_DEBUG", "INFO", 0);
    if (!strcmp(mode, "missing")) {
        setenv("HCCL_CONNECT_TIMEOUT", "5", 0);
        return run_missing();
    }
    /* ctl must outlast the scenario: it gets no exec timeout (the scenario's comes by config). */
    unsetenv("HCCL_EXEC_TIMEOUT");
    CHECK(hcclCommInitFromEnv(&ctl));
    CHECK(hcclCommUserRank(ctl, &g_rank));
    CHECK(hcclCommCount(ctl, &n));
    if (n < 2 || exec_timeout_s <= 0) {
        fprintf(stderr, "%s needs at least 2 ranks and HCCL_EXEC_TIMEOUT > 0\n", mode);
        return 2;
    }
    comm = scenario_comm(ctl, n, exec_timeout_s);
    CHECK(hcclAllReduce(&one, &one, 1, hcclFloat32, hcclSum, comm)); /* everyone is connected */
    /* Nobody starts the scenario before everyone has finished that: a failure fails every
     * request in flight, and this one is not what the scenario is about. */
    CHECK(hcclBarrier(ctl));
    printf("rank %d: connected; now the %s scenario (exec timeout %.1f s, HCCL_CHECK %s)\n", g_rank,
           mode, exec_timeout_s, checked ? "on" : "off");
    if (!strcmp(mode, "dead")) {
        failed = run_dead(comm, ctl, n);
        CHECK(hcclCommAbort(ctl)); /* the victim was in ctl too */
        return failed;
    }
    if (!strcmp(mode, "skip"))
        outcome = run_skip(comm, exec_timeout_s);
    else
        outcome = run_mismatch(comm, !strcmp(mode, "collective"), checked);
    tally[outcome] = 1;
    CHECK(hcclAllReduce(tally, tally, 3, hcclInt32, hcclSum, ctl));
    CHECK(hcclCommAbort(comm)); /* a failed communicator is not reusable */
    CHECK(hcclCommDestroy(ctl));
    /* Every rank ended with an error; at least one (with HCCL_CHECK: each) with its own. */
    failed = tally[OUTCOME_WRONG] > 0 || tally[OUTCOME_OWN] == 0 ||
             (checked && strcmp(mode, "skip") && tally[OUTCOME_OWN] != n);
    if (g_rank == 0)
        printf("hang_diagnosis %s: %d ranks saw the fault themselves, %d failed because a peer "
               "had (or skipped the call), %d unexpected: %s\n",
               mode, tally[OUTCOME_OWN], tally[OUTCOME_PEER], tally[OUTCOME_WRONG],
               failed ? "FAILED" : "ok");
    return failed;
}
