/*
 * stream_overlap: the compute-stream / comm-stream / event pattern of the HCCL guides, on the
 * host.
 *
 *   hccl-run -n 4 ./stream_overlap            # 8 steps of 1 MiB float32
 *   hccl-run -n 2 ./stream_overlap 16 4M      # steps, bytes per step (K, M suffixes)
 *
 * Each rank has two streams. For every step, the compute stream produces a buffer (a host
 * function standing in for a kernel) and records an event; the comm stream waits for that
 * event, AllReduces the buffer on the stream and records a second event; the compute stream
 * waits for the second event and consumes the result (checks it). Two buffers are used in turn,
 * and the compute stream produces step k+1 before it consumes step k, so the AllReduce of one
 * buffer overlaps the production of the other. The host thread only queues work, then
 * synchronizes once. Every rank checks every element; the ranks agree on the number of wrong
 * ones with a last AllReduce, and rank 0 prints a one-line summary. The exit status is non-zero
 * on any error or wrong result.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hccl.h"

#define CHECK(call)                                                                      \
    do {                                                                                 \
        hcclResult_t r_ = (call);                                                        \
        if (r_ != hcclSuccess) {                                                         \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, hcclGetErrorString(r_),       \
                    hcclGetLastError(NULL));                                             \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

/* What a host function on a stream works on: one step of one buffer. */
typedef struct {
    float *buf;
    size_t count;
    int step;
    int rank;
    int nranks;
    long *wrong; /* the compute stream's count of wrong elements (only its worker writes it) */
} step_t;

/* Rank r's input at step k: small integers, so the float32 sum is exact. */
static float input(int rank, int step, size_t i)
{
    return (float)((rank + 1) * (step + 1) + (int)(i % 7));
}

static void produce(void *arg)
{
    const step_t *s = arg;

    for (size_t i = 0; i < s->count; i++)
        s->buf[i] = input(s->rank, s->step, i);
}

static void consume(void *arg)
{
    const step_t *s = arg;
    float base = (float)((s->step + 1) * s->nranks * (s->nranks + 1) / 2);

    for (size_t i = 0; i < s->count; i++)
        if (s->buf[i] != base + (float)(s->nranks * (int)(i % 7)))
            (*s->wrong)++;
}

static size_t parse_size(const char *text)
{
    char *end;
    double v = strtod(text, &end);

    if (*end == 'M' || *end == 'm')
        v *= 1024 * 1024;
    else if (*end == 'K' || *end == 'k')
        v *= 1024;
    return (size_t)v;
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int nsteps = argc > 1 ? atoi(argv[1]) : 8;
    size_t bytes = argc > 2 ? parse_size(argv[2]) : (size_t)1 << 20;
    size_t count = bytes / sizeof(float);
    hcclComm_t comm;
    hcclStream_t compute, comms;
    hcclEvent_t produced[2], reduced[2];
    float *buf[2];
    step_t *steps;
    long wrong = 0, wrong_all = 0;
    int rank, nranks;
    double t0;

    if (nsteps < 1 || count < 1) {
        fprintf(stderr, "usage: %s [steps >= 1] [bytes per step >= 4]\n", argv[0]);
        return 2;
    }
    CHECK(hcclCommInitFromEnv(&comm));
    CHECK(hcclCommUserRank(comm, &rank));
    CHECK(hcclCommCount(comm, &nranks));
    buf[0] = malloc(count * sizeof(float));
    buf[1] = malloc(count * sizeof(float));
    steps = calloc((size_t)nsteps, sizeof(*steps));
    if (!buf[0] || !buf[1] || !steps) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        return 1;
    }
    CHECK(hcclStreamCreate(&compute));
    CHECK(hcclStreamCreate(&comms));
    for (int b = 0; b < 2; b++) {
        CHECK(hcclEventCreate(&produced[b]));
        CHECK(hcclEventCreate(&reduced[b]));
    }

    t0 = now_s();
    for (int k = 0; k <= nsteps; k++) {
        if (k < nsteps) {
            step_t *s = &steps[k];
            int b = k % 2;
            *s = (step_t){buf[b], count, k, rank, nranks, &wrong};
            /* The buffer was last consumed at step k-2, earlier on this same stream. */
            CHECK(hcclStreamEnqueue(compute, produce, s));
            CHECK(hcclEventRecord(produced[b], compute));
            CHECK(hcclStreamWaitEvent(comms, produced[b]));
            CHECK(hcclAllReduceOnStream(buf[b], buf[b], count, hcclFloat32, hcclSum, comm, comms));
            CHECK(hcclEventRecord(reduced[b], comms));
        }
        if (k > 0) {
            /* Step k-1's result, consumed after step k was produced: the overlap. */
            CHECK(hcclStreamWaitEvent(compute, reduced[(k - 1) % 2]));
            CHECK(hcclStreamEnqueue(compute, consume, &steps[k - 1]));
        }
    }
    CHECK(hcclStreamSynchronize(compute));
    CHECK(hcclStreamSynchronize(comms));

    /* Every rank's verdict, agreed. */
    CHECK(hcclAllReduce(&wrong, &wrong_all, 1, hcclInt64, hcclSum, comm));
    if (rank == 0)
        printf("stream_overlap: %d ranks, %d steps of %zu B float32 AllReduce on a comm stream "
               "overlapping a compute stream, %.3f s: %s (%ld wrong elements)\n",
               nranks, nsteps, count * sizeof(float), now_s() - t0,
               wrong_all == 0 ? "all results correct" : "WRONG RESULTS", wrong_all);
    if (wrong)
        fprintf(stderr, "rank %d: %ld wrong elements\n", rank, wrong);

    for (int b = 0; b < 2; b++) {
        CHECK(hcclEventDestroy(produced[b]));
        CHECK(hcclEventDestroy(reduced[b]));
    }
    CHECK(hcclStreamDestroy(comms));
    CHECK(hcclStreamDestroy(compute));
    CHECK(hcclCommDestroy(comm));
    free(steps);
    free(buf[0]);
    free(buf[1]);
    return wrong_all == 0 ? 0 : 1;
}
