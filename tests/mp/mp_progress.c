/*
 * An Async collective progresses while its caller neither waits for it nor tests it, run
 * through hccl-run. Rank 0 calls hcclAllReduceAsync on the world, tells rank 1 so on a second
 * communicator and blocks there in a receive from it; rank 1 then runs its own, blocking,
 * AllReduce on the world, which needs rank 0's part, and only then answers. Only rank 0's
 * progress thread can do that part: without it the job deadlocks (and hccl-run's timeout
 * fails it). Each round starts after Async calls waited for at once, the pattern in which
 * calls leave the progress thread asleep and the peers' doorbells quiet (the reactor's
 * watch), at sizes that take the lane and the plans.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "hccl.h"
#include "mp_check.h"

static int g_rank = -1;

/* Async calls waited for at once: the quiet pattern a round starts from. */
static void warm(float *buf, size_t count, hcclComm_t world)
{
    for (int i = 0; i < 50; i++) {
        hcclRequest_t req;
        CHECK(hcclAllReduceAsync(buf, buf, count, hcclFloat32, hcclMax, world, &req));
        CHECK(hcclWait(&req));
    }
}

static int round_check(const float *buf, size_t count, int n, int round)
{
    for (size_t i = 0; i < count; i++) {
        float want = (float)(n * (n - 1) / 2 + n * round);
        if (buf[i] != want) {
            fprintf(stderr, "rank %d: round %d: element %zu is %g, not %g\n", g_rank, round, i,
                    (double)buf[i], (double)want);
            return 1;
        }
    }
    return 0;
}

int main(void)
{
    static const size_t sizes[] = {2, 16384, 1 << 20}; /* floats: 8 B, 64 KiB, 4 MiB */
    hcclComm_t world, side;
    int n, bad = 0;

    setvbuf(stdout, NULL, _IOLBF, 0);
    CHECK(hcclCommInitFromEnv(&world));
    CHECK(hcclCommUserRank(world, &g_rank));
    CHECK(hcclCommCount(world, &n));
    if (n < 2) {
        fprintf(stderr, "mp_progress needs at least 2 ranks\n");
        return 1;
    }
    CHECK(hcclCommSplit(world, 0, g_rank, &side));
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t count = sizes[s];
        float *buf = malloc(count * sizeof(float));
        if (!buf) {
            fprintf(stderr, "rank %d: out of memory\n", g_rank);
            return 1;
        }
        for (int round = 0; round < 10; round++) {
            int token = round;
            warm(buf, count, world);
            for (size_t i = 0; i < count; i++)
                buf[i] = (float)(g_rank + round);
            if (g_rank == 0) {
                hcclRequest_t req;
                CHECK(hcclAllReduceAsync(buf, buf, count, hcclFloat32, hcclSum, world, &req));
                CHECK(hcclSend(&token, 1, hcclInt32, 1, side));
                CHECK(hcclRecv(&token, 1, hcclInt32, 1, side));
                CHECK(hcclWait(&req));
            } else {
                /* Rank 1 starts only once rank 0's call is made: its part cannot have been done
                 * on the way in. */
                if (g_rank == 1)
                    CHECK(hcclRecv(&token, 1, hcclInt32, 0, side));
                CHECK(hcclAllReduce(buf, buf, count, hcclFloat32, hcclSum, world));
                if (g_rank == 1)
                    CHECK(hcclSend(&token, 1, hcclInt32, 0, side));
            }
            bad |= round_check(buf, count, n, round);
        }
        free(buf);
        if (g_rank == 0)
            printf("%zu bytes: 10 rounds progressed without their caller\n", count * sizeof(float));
    }
    CHECK(hcclCommDestroy(side));
    CHECK(hcclCommDestroy(world));
    return bad;
}
