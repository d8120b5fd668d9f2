/*
 * Elastic data-parallel training: a rank dies mid-way and the others go on without it.
 *
 *   hccl-run -n 4 elastic_training --steps 40 --kill-rank 2 --kill-step 20
 *
 * Every step each rank computes a gradient and AllReduces it; the sum updates weights that
 * every rank holds. At step --kill-step, rank --kill-rank dies (SIGKILL, as an OOM killer or
 * a lost node would). The survivors' AllReduce fails with hcclRemoteError; they shrink the
 * communicator past the dead rank (hcclCommShrink: no new rendezvous, the bootstrap root may
 * be the dead one), abort the old one and go on from the step they agree on. Who died comes
 * from --kill-rank here; in a real job it comes from the job's agent (torchrun's, Slurm's).
 *
 * Survivors need not fail at the same step: a rank whose AllReduce had all its data before
 * the death finishes that step and fails at the next. No rank can be more than one step
 * ahead (a step needs every rank's data), so each keeps the weights from before its last
 * update; on the new communicator they take the earliest failed step, and those that had
 * finished it undo it.
 *
 * The gradients are whole numbers, so the sums are exact: at the end every survivor checks
 * its weights against the ones it computes alone, knowing who took part in which step, and
 * rank 0 prints a PASS line (exit status 0 on every survivor; the launcher still reports the
 * killed rank).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hccl.h"

#define CHECK(call_x)                                                                              \
    do {                                                                                           \
        hcclResult_t r_ = (call_x);                                                                \
        if (r_ != hcclSuccess) {                                                                   \
            fprintf(stderr, "elastic_training: %s failed: %s: %s\n", #call_x,                      \
                    hcclGetErrorString(r_), hcclGetLastError(NULL));                               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Rank r's gradient at step s: whole numbers, so that any order of summing gives the same. */
static void gradient(double *g, size_t dim, int r, int s)
{
    for (size_t i = 0; i < dim; i++)
        g[i] = (double)((r + 1) * (int)((i + (size_t)s) % 5 + 1));
}

int main(int argc, char **argv)
{
    int steps = 40, kill_rank = -1, kill_step = -1, world_rank, world_size, size;
    size_t dim = 4096;
    hcclComm_t comm;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kill-rank") && i + 1 < argc)
            kill_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kill-step") && i + 1 < argc)
            kill_step = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dim") && i + 1 < argc)
            dim = (size_t)strtoul(argv[++i], NULL, 0);
        else {
            fprintf(
                stderr,
                "usage: elastic_training [--steps N] [--kill-rank R --kill-step S] [--dim D]\n");
            return 2;
        }
    }
    if (kill_step < 0)
        kill_step = steps / 2;
    CHECK(hcclCommInitFromEnv(&comm));
    CHECK(hcclCommUserRank(comm, &world_rank));
    CHECK(hcclCommCount(comm, &world_size));
    if (kill_rank >= world_size || (kill_rank >= 0 && world_size < 2)) {
        fprintf(stderr,
                "elastic_training: --kill-rank %d needs at least 2 ranks and a rank below %d\n",
                kill_rank, world_size);
        return 2;
    }
    size = world_size;

    double *w = calloc(dim, sizeof(double)), *w_prev = calloc(dim, sizeof(double));
    double *g = calloc(dim, sizeof(double)), *ref = calloc(dim, sizeof(double));
    int failed_step = -1;
    double shrink_ms = 0;

    if (!w || !w_prev || !g || !ref)
        return 1;
    for (int s = 0; s < steps; s++) {
        gradient(g, dim, world_rank, s);
        if (world_rank == kill_rank && s == kill_step) {
            printf("rank %d: dies at step %d\n", world_rank, s);
            fflush(stdout);
            raise(SIGKILL);
        }
        hcclResult_t res = hcclAllReduce(g, g, dim, hcclFloat64, hcclSum, comm);
        if (res != hcclSuccess) {
            hcclResult_t async = hcclSuccess;
            hcclComm_t shrunk;
            double t0 = now_ms();
            /* The failure reaches every survivor: the call that failed, and the communicator. */
            CHECK(hcclCommGetAsyncError(comm, &async));
            printf("rank %d: step %d failed: %s (communicator: %s): %s\n", world_rank, s,
                   hcclGetErrorString(res), hcclGetErrorString(async), hcclGetLastError(NULL));
            if (res != hcclRemoteError || kill_rank < 0 || failed_step >= 0) {
                fprintf(stderr,
                        "elastic_training: rank %d: not the failure this example recovers from\n",
                        world_rank);
                return 1;
            }
            /* Survivors name the dead by their rank in comm (here still the world's). */
            CHECK(hcclCommShrink(comm, &kill_rank, 1, NULL, &shrunk));
            shrink_ms = now_ms() - t0;
            CHECK(hcclCommAbort(comm));
            comm = shrunk;
            CHECK(hcclCommCount(comm, &size));
            /* Where to go on from: the earliest step that failed on a survivor. */
            failed_step = s;
            CHECK(hcclAllReduce(&failed_step, &failed_step, 1, hcclInt32, hcclMin, comm));
            if (failed_step < s)
                memcpy(w, w_prev, dim * sizeof(double)); /* undo the step the others redo */
            s = failed_step - 1;
            continue;
        }
        memcpy(w_prev, w, dim * sizeof(double));
        for (size_t i = 0; i < dim; i++)
            w[i] += g[i];
    }

    /* The reference: every rank's gradients while it was alive, summed alone. */
    for (int s = 0; s < steps; s++) {
        for (int r = 0; r < world_size; r++) {
            if (r == kill_rank && failed_step >= 0 && s >= failed_step)
                continue;
            gradient(g, dim, r, s);
            for (size_t i = 0; i < dim; i++)
                ref[i] += g[i];
        }
    }
    long bad = 0;
    for (size_t i = 0; i < dim; i++)
        bad += w[i] != ref[i];
    /* Every survivor must agree: the worst count over the communicator. */
    CHECK(hcclAllReduce(&bad, &bad, 1, hcclInt64, hcclMax, comm));
    int rank;
    CHECK(hcclCommUserRank(comm, &rank));
    if (rank == 0) {
        if (failed_step >= 0)
            printf("elastic_training: rank %d died at step %d; %d -> %d ranks, shrunk in %.1f ms; "
                   "went on from step %d; %d steps\n",
                   kill_rank, kill_step, world_size, size, shrink_ms, failed_step, steps);
        else
            printf("elastic_training: %d ranks, no failure; %d steps\n", size, steps);
        printf("elastic_training: %s: weights of %zu doubles %s the reference on all %d ranks\n",
               bad ? "FAIL" : "PASS", dim, bad ? "differ from" : "match", size);
    }
    CHECK(hcclCommDestroy(comm));
    free(w);
    free(w_prev);
    free(g);
    free(ref);
    return bad ? 1 : 0;
}
