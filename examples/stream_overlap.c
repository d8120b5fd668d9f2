/*
 * stream_overlap: the compute-stream / comm-stream / event pattern of the HCCL guides, on the
 * host.
 *
 *   hccl-run -n 4 ./stream_overlap            # 8 steps of 1 MiB float32
 *   hccl-run -n 2 ./stream_overlap 16 4M      # steps, bytes per step (K, M suffixes)
 *   hccl-run -n 4 ./stream_overlap --compute device   # the kernel on an "accelerator"
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
 *
 * Each step's production includes a kernel: with --compute cpu (the default) passes over the
 * buffer on the CPU; with --compute device a wait as long as that kernel took on this rank
 * (measured first, the ranks taking the longest), as when the kernel runs on an accelerator
 * and the host's CPU is free meanwhile. The steps also run with compute alone and with
 * communication alone, and rank 0 prints how much of the communication the overlap hid.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hccl.h"

#define KERNEL_PASSES 24 /* the CPU kernel's passes over a step's buffer */

#define CHECK(call)                                                                                \
    do {                                                                                           \
        hcclResult_t r_ = (call);                                                                  \
        if (r_ != hcclSuccess) {                                                                   \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, hcclGetErrorString(r_),                 \
                    hcclGetLastError(NULL));                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* What a host function on a stream works on: one step of one buffer. */
typedef struct {
    float *buf;
    size_t count;
    int step;
    int rank;
    int nranks;
    long *wrong;     /* the compute stream's count of wrong elements (only its worker writes it) */
    double kernel_s; /* > 0: the kernel is a wait this long (--compute device) */
    int kernel;      /* 0: no kernel (communication alone) */
} step_t;

static volatile float kernel_sink; /* keeps the CPU kernel from being optimized away */

/* The step's kernel: passes over the buffer on the CPU, or a wait on the "device". */
static void kernel(const step_t *s)
{
    float acc = 0;

    if (!s->kernel)
        return;
    if (s->kernel_s > 0) {
        struct timespec ts = {(time_t)s->kernel_s,
                              (long)((s->kernel_s - (double)(time_t)s->kernel_s) * 1e9)};
        nanosleep(&ts, NULL);
        return;
    }
    for (int p = 0; p < KERNEL_PASSES; p++)
        for (size_t i = 0; i < s->count; i++)
            acc = acc * 0.999f + s->buf[i];
    kernel_sink = acc;
}

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
    kernel(s);
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

/* Streams, events and buffers of one run. */
typedef struct {
    hcclComm_t comm;
    hcclStream_t compute, comms;
    hcclEvent_t produced[2], reduced[2];
    float *buf[2];
    step_t *steps;
    size_t count;
    int nsteps, rank, nranks;
    double kernel_s;
    long wrong;
} run_t;

/* One pass over the steps, with the kernel (kernel), the AllReduces (comm), or both
 * overlapped; returns the time from the first enqueue to both streams synchronized. */
static double run_steps(run_t *r, int with_kernel, int with_comm)
{
    double t0;

    CHECK(hcclBarrier(r->comm));
    t0 = now_s();
    for (int k = 0; k <= r->nsteps; k++) {
        if (k < r->nsteps) {
            step_t *s = &r->steps[k];
            int b = k % 2;
            *s = (step_t){r->buf[b], r->count,  k,           r->rank,
                          r->nranks, &r->wrong, r->kernel_s, with_kernel};
            /* The buffer was last consumed at step k-2, earlier on this same stream. */
            CHECK(hcclStreamEnqueue(r->compute, produce, s));
            CHECK(hcclEventRecord(r->produced[b], r->compute));
            if (with_comm) {
                CHECK(hcclStreamWaitEvent(r->comms, r->produced[b]));
                CHECK(hcclAllReduceOnStream(r->buf[b], r->buf[b], r->count, hcclFloat32, hcclSum,
                                            r->comm, r->comms));
                CHECK(hcclEventRecord(r->reduced[b], r->comms));
            }
        }
        if (k > 0 && with_comm) {
            /* Step k-1's result, consumed after step k was produced: the overlap. */
            CHECK(hcclStreamWaitEvent(r->compute, r->reduced[(k - 1) % 2]));
            CHECK(hcclStreamEnqueue(r->compute, consume, &r->steps[k - 1]));
        }
    }
    CHECK(hcclStreamSynchronize(r->compute));
    CHECK(hcclStreamSynchronize(r->comms));
    return now_s() - t0;
}

/* The slowest rank's figure: the one the job runs at. */
static double slowest(hcclComm_t comm, double v)
{
    double m;

    CHECK(hcclAllReduce(&v, &m, 1, hcclFloat64, hcclMax, comm));
    return m;
}

int main(int argc, char **argv)
{
    int nsteps = 8, npos = 0, device = 0;
    size_t bytes = (size_t)1 << 20;
    run_t run = {0};
    run_t *r = &run;
    long wrong_all = 0;
    double t_both, t_kernel, t_comm, hidden;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--compute") && i + 1 < argc) {
            device = !strcmp(argv[++i], "device");
            if (!device && strcmp(argv[i], "cpu")) {
                fprintf(stderr, "--compute takes cpu or device\n");
                return 2;
            }
        } else if (npos == 0) {
            nsteps = atoi(argv[i]);
            npos++;
        } else {
            bytes = parse_size(argv[i]);
        }
    }
    if (nsteps < 1 || bytes < sizeof(float)) {
        fprintf(stderr, "usage: %s [steps >= 1] [bytes per step >= 4] [--compute cpu|device]\n",
                argv[0]);
        return 2;
    }
    r->nsteps = nsteps;
    r->count = bytes / sizeof(float);
    CHECK(hcclCommInitFromEnv(&r->comm));
    CHECK(hcclCommUserRank(r->comm, &r->rank));
    CHECK(hcclCommCount(r->comm, &r->nranks));
    r->buf[0] = malloc(r->count * sizeof(float));
    r->buf[1] = malloc(r->count * sizeof(float));
    r->steps = calloc((size_t)nsteps, sizeof(*r->steps));
    if (!r->buf[0] || !r->buf[1] || !r->steps) {
        fprintf(stderr, "rank %d: out of memory\n", r->rank);
        return 1;
    }
    CHECK(hcclStreamCreate(&r->compute));
    CHECK(hcclStreamCreate(&r->comms));
    for (int b = 0; b < 2; b++) {
        CHECK(hcclEventCreate(&r->produced[b]));
        CHECK(hcclEventCreate(&r->reduced[b]));
    }

    /* The CPU kernel's time per step; on the "device" every rank waits the longest rank's. */
    t_kernel = run_steps(r, 1, 0);
    if (device)
        r->kernel_s = slowest(r->comm, t_kernel / nsteps);
    t_kernel = slowest(r->comm, run_steps(r, 1, 0));
    t_comm = slowest(r->comm, run_steps(r, 0, 1));
    t_both = slowest(r->comm, run_steps(r, 1, 1));
    hidden = (t_kernel + t_comm - t_both) / t_comm;
    hidden = hidden < 0 ? 0 : hidden > 1 ? 1 : hidden;

    /* Every rank's verdict, agreed. */
    CHECK(hcclAllReduce(&r->wrong, &wrong_all, 1, hcclInt64, hcclSum, r->comm));
    if (r->rank == 0)
        printf("stream_overlap: %d ranks, %d steps of %zu B float32 AllReduce on a comm stream "
               "overlapping a compute stream (compute on the %s), %.3f s: %s (%ld wrong "
               "elements); compute alone %.3f s, communication alone %.3f s: %.0f%% of the "
               "communication hidden\n",
               r->nranks, nsteps, r->count * sizeof(float), device ? "device" : "cpu", t_both,
               wrong_all == 0 ? "all results correct" : "WRONG RESULTS", wrong_all, t_kernel,
               t_comm, 100 * hidden);
    if (r->wrong)
        fprintf(stderr, "rank %d: %ld wrong elements\n", r->rank, r->wrong);

    for (int b = 0; b < 2; b++) {
        CHECK(hcclEventDestroy(r->produced[b]));
        CHECK(hcclEventDestroy(r->reduced[b]));
    }
    CHECK(hcclStreamDestroy(r->comms));
    CHECK(hcclStreamDestroy(r->compute));
    CHECK(hcclCommDestroy(r->comm));
    free(r->steps);
    free(r->buf[0]);
    free(r->buf[1]);
    return wrong_all == 0 ? 0 : 1;
}
