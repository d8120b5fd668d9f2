/*
 * hcclCommShrink across processes, started by hccl-run:
 *   mp_shrink --kill R [--kill2 Q] [--die-in-shrink D] [--disagree]
 * Rank R dies by SIGKILL between small AllReduces; the survivors must see it
 * (a failed AllReduce and hcclCommGetAsyncError, both hcclRemoteError), shrink
 * without it and check AllReduce, Broadcast and AllGather on the new
 * communicator. --kill2 Q: then the rank of parent rank Q dies too, and the
 * survivors shrink the shrunk communicator. --die-in-shrink D: the environment
 * has HCCL_FAULT=kill:rank=D,at=shrink, so rank D dies inside the first shrink:
 * the others must fail with hcclRemoteError naming it, and shrink again
 * without it. --disagree: the last survivor also excludes the first one; every
 * survivor must get hcclInvalidUsage naming both lists. Each survivor prints
 * "survivor ok" at the end; the rank 0 of the last communicator prints the
 * shrink times (the slowest survivor's, from the call to its return), which
 * bench/shrink.sh collects.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hccl.h"

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "rank %d: ", g_rank);                                                      \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        return 1;                                                                                  \
    } while (0)
#define CHECK(call_x)                                                                              \
    do {                                                                                           \
        hcclResult_t r_ = (call_x);                                                                \
        if (r_ != hcclSuccess)                                                                     \
            FAIL("%s: %s: %s", #call_x, hcclGetErrorString(r_), hcclGetLastError(NULL));           \
    } while (0)

static int g_rank = -1;

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Small AllReduces until one fails; victim dies before its iteration 20. */
static int until_failure(hcclComm_t comm, bool victim)
{
    hcclResult_t res = hcclSuccess, async = hcclSuccess;

    for (int i = 0; res == hcclSuccess; i++) {
        int32_t v = 1;
        if (victim && i == 20) {
            fflush(stdout);
            raise(SIGKILL);
        }
        res = hcclAllReduce(&v, &v, 1, hcclInt32, hcclSum, comm);
        if (i > 100000)
            FAIL("no failure after %d AllReduces", i);
    }
    if (res != hcclRemoteError)
        FAIL("the AllReduce failed with %s, not hcclRemoteError: %s", hcclGetErrorString(res),
             hcclGetLastError(NULL));
    CHECK(hcclCommGetAsyncError(comm, &async));
    if (async != hcclRemoteError)
        FAIL("hcclCommGetAsyncError gave %s", hcclGetErrorString(async));
    return 0;
}

/* AllReduce, Broadcast and AllGather of what each rank knows (its parent rank). */
static int check_collectives(hcclComm_t c, int world_rank, const int *world_of)
{
    int n, me;
    int64_t sum = world_rank, want = 0, b;
    int32_t *all;

    CHECK(hcclCommCount(c, &n));
    CHECK(hcclCommUserRank(c, &me));
    for (int r = 0; r < n; r++)
        want += world_of[r];
    CHECK(hcclAllReduce(&sum, &sum, 1, hcclInt64, hcclSum, c));
    if (sum != want)
        FAIL("AllReduce gave %lld, want %lld", (long long)sum, (long long)want);
    for (int root = 0; root<n; root += n - 1> 0 ? n - 1 : 1) {
        b = me == root ? 1000 + world_rank : -1;
        CHECK(hcclBroadcast(&b, 1, hcclInt64, root, c));
        if (b != 1000 + world_of[root])
            FAIL("Broadcast from %d gave %lld", root, (long long)b);
    }
    all = calloc((size_t)n, sizeof(*all));
    int32_t mine = world_rank;
    CHECK(hcclAllGather(&mine, all, 1, hcclInt32, c));
    for (int r = 0; r < n; r++)
        if (all[r] != world_of[r])
            FAIL("AllGather block %d is %d, want %d", r, all[r], world_of[r]);
    free(all);
    return 0;
}

/* The world ranks left after excluding list from the members of a communicator. */
static int survivors(int *members, int n, const int *list, int nlist)
{
    int m = 0;

    for (int r = 0; r < n; r++) {
        bool out = false;
        for (int i = 0; i < nlist; i++)
            out |= list[i] == r;
        if (!out)
            members[m++] = members[r];
    }
    return m;
}

int main(int argc, char **argv)
{
    int kill = -1, kill2 = -1, die = -1, n, members[64], nm;
    bool disagree = false;
    hcclComm_t comm, sub = NULL, sub2 = NULL;
    double t_shrink, t_shrink2 = 0;
    hcclResult_t res;

    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kill") && i + 1 < argc)
            kill = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kill2") && i + 1 < argc)
            kill2 = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--die-in-shrink") && i + 1 < argc)
            die = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--disagree"))
            disagree = true;
    }
    CHECK(hcclCommInitFromEnv(&comm));
    CHECK(hcclCommUserRank(comm, &g_rank));
    CHECK(hcclCommCount(comm, &n));
    if (kill < 0 || kill >= n || n > 64)
        FAIL("usage: mp_shrink --kill R (R < %d <= 64)", n);
    for (int r = 0; r < n; r++)
        members[r] = r;
    if (until_failure(comm, g_rank == kill))
        return 1;

    int excl[2] = {kill, -1}, nexcl = 1;
    if (disagree) {
        int first = kill == 0 ? 1 : 0, last = kill == n - 1 ? n - 2 : n - 1;
        int mine[2] = {kill < first ? kill : first, kill < first ? first : kill};
        res =
            hcclCommShrink(comm, g_rank == last ? mine : excl, g_rank == last ? 2 : 1, NULL, &sub);
        if (res != hcclInvalidUsage || !strstr(hcclGetLastError(NULL), "disagree"))
            FAIL("a disagreeing shrink gave %s: %s", hcclGetErrorString(res),
                 hcclGetLastError(NULL));
        printf("rank %d: disagreement reported: %s\n", g_rank, hcclGetLastError(NULL));
        CHECK(hcclCommAbort(comm));
        printf("rank %d: survivor ok\n", g_rank);
        return 0;
    }
    t_shrink = now_ms();
    res = hcclCommShrink(comm, excl, nexcl, NULL, &sub);
    if (die >= 0) {
        char want[32];
        snprintf(want, sizeof(want), "rank %d", die);
        if (res != hcclRemoteError || !strstr(hcclGetLastError(NULL), want))
            FAIL("a shrink during which rank %d died gave %s: %s", die, hcclGetErrorString(res),
                 hcclGetLastError(NULL));
        printf("rank %d: shrink failed as it should: %s\n", g_rank, hcclGetLastError(NULL));
        excl[nexcl++] = die;
        t_shrink = now_ms();
        res = hcclCommShrink(comm, excl, nexcl, NULL, &sub);
    }
    t_shrink = now_ms() - t_shrink;
    CHECK(res);
    nm = survivors(members, n, excl, nexcl);
    if (check_collectives(sub, g_rank, members))
        return 1;
    /* The slowest survivor's time. */
    CHECK(hcclAllReduce(&t_shrink, &t_shrink, 1, hcclFloat64, hcclMax, sub));
    if (kill2 >= 0) {
        int me, q = -1;
        CHECK(hcclCommUserRank(sub, &me));
        for (int r = 0; r < nm; r++)
            if (members[r] == kill2)
                q = r;
        if (q < 0)
            FAIL("--kill2 %d is not a survivor", kill2);
        if (until_failure(sub, me == q))
            return 1;
        t_shrink2 = now_ms();
        CHECK(hcclCommShrink(sub, &q, 1, NULL, &sub2));
        t_shrink2 = now_ms() - t_shrink2;
        nm = survivors(members, nm, &q, 1);
        if (check_collectives(sub2, g_rank, members))
            return 1;
        CHECK(hcclAllReduce(&t_shrink2, &t_shrink2, 1, hcclFloat64, hcclMax, sub2));
    }
    {
        int me;
        CHECK(hcclCommUserRank(sub2 ? sub2 : sub, &me));
        if (me == 0 && sub2)
            printf("shrink: %d -> %d ranks in %.1f ms, then to %d in %.1f ms\n", n, n - nexcl,
                   t_shrink, nm, t_shrink2);
        else if (me == 0)
            printf("shrink: %d -> %d ranks in %.1f ms\n", n, nm, t_shrink);
    }
    if (sub2) {
        CHECK(hcclCommDestroy(sub2));
        CHECK(hcclCommAbort(sub)); /* failed: rank kill2 died */
    } else {
        CHECK(hcclCommDestroy(sub));
    }
    CHECK(hcclCommAbort(comm));
    printf("rank %d: survivor ok\n", g_rank);
    return 0;
}
