/*
 * overlap_training: data-parallel SGD on a small MLP, the gradient AllReduce of
 * each layer overlapped with the backward pass of the layers before it.
 *
 *   hccl-run -n 2 ./overlap_training                         # a short run, checked
 *   hccl-run -n 4 ./overlap_training --iters 30 --width 768  # a longer one, to measure
 *
 *   hccl-run -n 4 ./overlap_training --compute device        # compute on an "accelerator"
 *
 * Options: --iters N (timed iterations per mode, at most 1000, default 4), --layers L (4),
 * --width W (neurons per layer, 384), --batch B (per rank, 8), --lr X (0.003),
 * --compute cpu|device (cpu).
 *
 * Every rank holds the same model (same seed) and trains on its own synthetic
 * data. The backward pass produces the gradients last layer first; as soon as
 * one layer's gradient is ready it is AllReduced (hcclAvg) with
 * hcclAllReduceAsync while the next layer's gradient is computed, and the SGD
 * step waits for all of them (hcclWaitAll). The same iterations are timed three
 * ways: (a) with overlap, (b) waiting right after each post, (c) compute alone
 * (no communication). The fraction of communication hidden is
 * ((b) - (a)) / ((b) - (c)), from the medians of each iteration's differences:
 * 1 when the AllReduces cost nothing beyond the compute, 0 when overlapping
 * gained nothing. The first layer's gradient comes last and has no compute
 * left to hide under, so with L layers of equal size at most about (L - 1) / L
 * can be hidden (75% at the default 4). Host-memory collectives need
 * CPU cycles too (copies and reductions), so with --compute cpu the fraction
 * depends on idle cores: with more ranks than cores the communication competes
 * with compute.
 *
 * --compute device models the frameworks this serves, where compute runs on an
 * accelerator and the host's CPU is free meanwhile: each piece of compute (the
 * forward pass, each layer's backward, the update) takes the time the CPU took for it
 * (measured first, the median of a few untimed steps) on the device's own clock,
 * and the CPU sleeps until each layer's gradient is due. As on an accelerator,
 * the device goes on to the next layer while the CPU posts the AllReduce, and
 * stalls only where a serial step waits for it. The numbers are still computed,
 * untimed, outside the timelines (once every rank has left its own), so the checks
 * below hold in both modes.
 *
 * Checks: the loss goes down, and at the end every rank's weights are
 * bit-identical (a hash of them AllGathered and compared). Exit 1 otherwise.
 */
#include <math.h>
#include <stdint.h>
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

#define MAX_LAYERS 16

typedef enum { MODE_OVERLAP, MODE_SERIAL, MODE_COMPUTE } train_mode_t;

/* How long each piece of compute takes (--compute device waits this long instead). */
typedef struct {
    double fwd_ms;
    double bwd_ms[MAX_LAYERS]; /* layer l's gradient and the delta it hands to layer l - 1 */
    double update_ms;          /* the SGD update of every layer */
} compute_times_t;

typedef struct {
    int layers, width, batch;
    float lr;
    float *w[MAX_LAYERS];       /* layer l: width x width, row o holds the weights into neuron o */
    float *grad[MAX_LAYERS];    /* the gradient bucket of layer l, AllReduced in place */
    float *act[MAX_LAYERS + 1]; /* act[0] the input, act[l + 1] = relu(z[l]) (the last: z) */
    float *z[MAX_LAYERS];       /* pre-activations, batch x width */
    float *delta, *delta_prev;  /* d loss / d z of the layer being back-propagated */
    float *target;              /* batch x width */
} mlp_t;

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static float *alloc_floats(size_t n)
{
    float *p = calloc(n, sizeof(float));

    if (!p) {
        fprintf(stderr, "rank %d: out of memory\n", g_rank);
        exit(1);
    }
    return p;
}

/* xorshift64*: a fixed sequence per seed, the same on every machine. */
static float rnd(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (float)((*s * 2685821657736338717ull) >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
}

static void mlp_init_weights(mlp_t *m)
{
    uint64_t seed = 42; /* the same on every rank: data parallelism starts from one model */
    float scale = sqrtf(6.0f / (float)m->width); /* uniform He: variance 2 / width */

    for (int l = 0; l < m->layers; l++)
        for (size_t i = 0; i < (size_t)m->width * m->width; i++)
            m->w[l][i] = rnd(&seed) * scale;
}

/* This rank's next batch: inputs in [-1, 1], the target a fixed function of them. */
static void next_batch(mlp_t *m, uint64_t *seed)
{
    int w = m->width;

    for (int b = 0; b < m->batch; b++)
        for (int i = 0; i < w; i++)
            m->act[0][b * w + i] = rnd(seed);
    for (int b = 0; b < m->batch; b++)
        for (int i = 0; i < w; i++)
            m->target[b * w + i] = 0.5f * m->act[0][b * w + (w - 1 - i)];
}

/* Returns this rank's loss on the batch. */
static float forward(mlp_t *m)
{
    int w = m->width;
    float loss = 0;

    for (int l = 0; l < m->layers; l++) {
        for (int b = 0; b < m->batch; b++) {
            const float *in = m->act[l] + (size_t)b * w;
            for (int o = 0; o < w; o++) {
                const float *row = m->w[l] + (size_t)o * w;
                float s = 0;
                for (int i = 0; i < w; i++)
                    s += row[i] * in[i];
                m->z[l][b * w + o] = s;
                m->act[l + 1][b * w + o] = l == m->layers - 1 ? s : (s > 0 ? s : 0);
            }
        }
    }
    for (int b = 0; b < m->batch; b++)
        for (int o = 0; o < w; o++) {
            float d = m->act[m->layers][b * w + o] - m->target[b * w + o];
            loss += 0.5f * d * d / (float)m->batch;
            m->delta[b * w + o] = d / (float)m->batch;
        }
    return loss;
}

/* The CPU sleeps until the device's clock reaches due_ms (CLOCK_MONOTONIC, as now_ms). */
static void sleep_until(double due_ms)
{
    struct timespec ts;

    ts.tv_sec = (time_t)(due_ms / 1e3);
    ts.tv_nsec = (long)((due_ms - (double)ts.tv_sec * 1e3) * 1e6);
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0)
        ;
}

/*
 * Backward from the last layer: each layer's gradient is handed to comm as soon as it exists.
 * bwd_ms, if not NULL, gets each layer's compute time.
 */
static void backward(mlp_t *m, train_mode_t mode, hcclComm_t comm, hcclRequest_t *reqs,
                     double *bwd_ms)
{
    int w = m->width;

    for (int l = m->layers - 1; l >= 0; l--) {
        float *g = m->grad[l];
        double t0 = now_ms();

        memset(g, 0, (size_t)w * w * sizeof(float));
        for (int b = 0; b < m->batch; b++) {
            const float *d = m->delta + (size_t)b * w, *a = m->act[l] + (size_t)b * w;
            for (int o = 0; o < w; o++) {
                float *row = g + (size_t)o * w;
                for (int i = 0; i < w; i++)
                    row[i] += d[o] * a[i];
            }
        }
        reqs[l] = NULL;
        if (l == 0 && bwd_ms)
            bwd_ms[l] = now_ms() - t0;
        if (mode != MODE_COMPUTE) {
            CHECK(hcclAllReduceAsync(g, g, (size_t)w * w, hcclFloat32, hcclAvg, comm, &reqs[l]));
            if (mode == MODE_SERIAL)
                CHECK(hcclWait(&reqs[l]));
        }
        if (l == 0)
            break;
        /* delta of layer l - 1 = (delta W_l) masked by relu'(z_{l-1}); W_l is not yet updated. */
        memset(m->delta_prev, 0, (size_t)m->batch * w * sizeof(float));
        for (int b = 0; b < m->batch; b++) {
            const float *d = m->delta + (size_t)b * w;
            float *dp = m->delta_prev + (size_t)b * w;
            for (int o = 0; o < w; o++) {
                const float *row = m->w[l] + (size_t)o * w;
                for (int i = 0; i < w; i++)
                    dp[i] += d[o] * row[i];
            }
            for (int i = 0; i < w; i++)
                if (m->z[l - 1][b * w + i] <= 0)
                    dp[i] = 0;
        }
        float *t = m->delta;
        m->delta = m->delta_prev;
        m->delta_prev = t;
        if (bwd_ms)
            bwd_ms[l] = now_ms() - t0;
    }
}

/* One step's timeline on an accelerator: the numbers are already in m (computed untimed).
 * due is when the device finishes what it was given; each layer's gradient is posted when
 * it is due, while the device goes on with the next layer, unless the step is serial. */
static void device_timeline(mlp_t *m, train_mode_t mode, hcclComm_t comm, hcclRequest_t *reqs,
                            const compute_times_t *ct)
{
    double due = now_ms() + ct->fwd_ms;

    for (int l = m->layers - 1; l >= 0; l--) {
        due += ct->bwd_ms[l];
        sleep_until(due);
        reqs[l] = NULL;
        if (mode != MODE_COMPUTE) {
            double posted = now_ms();
            CHECK(hcclAllReduceAsync(m->grad[l], m->grad[l], (size_t)m->width * m->width,
                                     hcclFloat32, hcclAvg, comm, &reqs[l]));
            if (mode == MODE_SERIAL) {
                CHECK(hcclWait(&reqs[l]));
                /* The device stalls for the AllReduce's time, not for how late the CPU woke
                 * to post it (that would count in serial steps only). */
                due += now_ms() - posted;
            }
        }
    }
}

/* The SGD update of every layer from its averaged gradient. */
static void sgd_update(mlp_t *m, float lr)
{
    for (int l = 0; l < m->layers; l++)
        for (size_t i = 0; i < (size_t)m->width * m->width; i++)
            m->w[l][i] -= lr * m->grad[l][i];
}

/*
 * One step; *ms_p gets its time from a barrier that starts every rank together to the end of
 * the update. With ct (--compute device) the numbers are computed outside the timed stretch
 * and the timeline waits instead, the update included; without, it computes. The CPU work
 * that stands in for the device's is done only once every rank has left its timed stretch
 * (the barrier at the end): on an accelerator it would not take the cores from a rank still
 * finishing its last AllReduce, and done early by a rank that finished first, it did (the
 * rest of that rank's step, a hundred milliseconds of CPU at 16 layers, on cores shared by
 * ranks still waiting).
 */
static void train_step(mlp_t *m, train_mode_t mode, hcclComm_t comm, uint64_t *seed,
                       const compute_times_t *ct, double *ms_p)
{
    hcclRequest_t reqs[MAX_LAYERS];
    /* Compute alone keeps the cost of the update but not its effect (w - 0 * g == w), so that
     * the ranks' models stay identical while the modes take turns. */
    float lr = mode == MODE_COMPUTE ? 0.0f : m->lr;
    double t0;

    next_batch(m, seed);
    if (ct) {
        forward(m);
        backward(m, MODE_COMPUTE, comm, reqs, NULL);
    }
    CHECK(hcclBarrier(comm));
    t0 = now_ms();
    if (ct) {
        device_timeline(m, mode, comm, reqs, ct);
    } else {
        forward(m);
        backward(m, mode, comm, reqs, NULL);
    }
    CHECK(hcclWaitAll(m->layers, reqs)); /* the optimizer needs every averaged gradient */
    if (!ct) {
        sgd_update(m, lr);
        *ms_p = now_ms() - t0;
        return;
    }
    sleep_until(now_ms() + ct->update_ms);
    *ms_p = now_ms() - t0;
    CHECK(hcclBarrier(comm));
    sgd_update(m, lr);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define MAX_ITERS 1000

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return v[n / 2];
}

/* The three modes take turns, iteration by iteration, so that a change in the machine's load
 * touches all three alike. ms_p[mode] is the median time of an iteration in that mode;
 * exposed_p and saved_p are the medians of the per-iteration differences serial - compute and
 * serial - overlapped, which cancel what the three steps of one iteration share (a slow
 * minute, a rank late to the barrier) where a difference of medians would not. */
static void time_modes(mlp_t *m, hcclComm_t comm, int iters, uint64_t *seed,
                       const compute_times_t *ct, double ms_p[3], double *exposed_p,
                       double *saved_p)
{
    static double t[3][MAX_ITERS], exposed[MAX_ITERS], saved[MAX_ITERS];
    double warm_ms;

    /* warm-up: plans built, pages touched */
    train_step(m, MODE_SERIAL, comm, seed, ct, &warm_ms);
    for (int it = 0; it < iters; it++) {
        for (int mode = 0; mode < 3; mode++)
            train_step(m, (train_mode_t)mode, comm, seed, ct, &t[mode][it]);
        exposed[it] = t[MODE_SERIAL][it] - t[MODE_COMPUTE][it];
        saved[it] = t[MODE_SERIAL][it] - t[MODE_OVERLAP][it];
    }
    for (int mode = 0; mode < 3; mode++)
        ms_p[mode] = median(t[mode], iters);
    *exposed_p = median(exposed, iters);
    *saved_p = median(saved, iters);
}

/* The CPU's time for each piece of compute: medians of 5 steps that compute alone (lr 0, so
 * the model does not change). The ranks agree on the largest, so that every rank's device is
 * as fast as the slowest rank's CPU and the ranks wait for no one but the network. */
static void measure_compute(mlp_t *m, hcclComm_t comm, uint64_t *seed, compute_times_t *ct)
{
    enum { N = 5 };
    double t[MAX_LAYERS + 2][N]; /* each layer's backward, the forward, the update */
    hcclRequest_t reqs[MAX_LAYERS];

    for (int k = 0; k < N; k++) {
        double t0 = now_ms();
        next_batch(m, seed);
        forward(m);
        t[MAX_LAYERS][k] = now_ms() - t0;
        double bwd[MAX_LAYERS];
        backward(m, MODE_COMPUTE, comm, reqs, bwd);
        for (int l = 0; l < m->layers; l++)
            t[l][k] = bwd[l];
        t0 = now_ms();
        sgd_update(m, 0.0f);
        t[MAX_LAYERS + 1][k] = now_ms() - t0;
    }
    qsort(t[MAX_LAYERS], N, sizeof(double), cmp_double);
    ct->fwd_ms = t[MAX_LAYERS][N / 2];
    qsort(t[MAX_LAYERS + 1], N, sizeof(double), cmp_double);
    ct->update_ms = t[MAX_LAYERS + 1][N / 2];
    for (int l = 0; l < m->layers; l++) {
        qsort(t[l], N, sizeof(double), cmp_double);
        ct->bwd_ms[l] = t[l][N / 2];
    }
    CHECK(hcclAllReduce(ct, ct, sizeof(*ct) / sizeof(double), hcclFloat64, hcclMax, comm));
}

static uint64_t weights_hash(const mlp_t *m)
{
    uint64_t h = 1469598103934665603ull;

    for (int l = 0; l < m->layers; l++) {
        const unsigned char *p = (const unsigned char *)m->w[l];
        for (size_t i = 0; i < (size_t)m->width * m->width * sizeof(float); i++)
            h = (h ^ p[i]) * 1099511628211ull;
    }
    return h;
}

int main(int argc, char **argv)
{
    mlp_t m = {.layers = 4, .width = 384, .batch = 8, .lr = 0.003f};
    int iters = 4, n, failed = 0, identical = 1, device = 0;
    compute_times_t ct;
    double ms[3], t_overlap, t_serial, t_compute, exposed, saved;
    float loss0, loss1;
    uint64_t seed, hashes[1024], mine;
    hcclComm_t comm;

    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--iters"))
            iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--layers"))
            m.layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--width"))
            m.width = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch"))
            m.batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--lr"))
            m.lr = (float)atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--compute") && !strcmp(argv[i + 1], "cpu"))
            device = 0;
        else if (!strcmp(argv[i], "--compute") && !strcmp(argv[i + 1], "device"))
            device = 1;
        else
            break;
    }
    if (argc % 2 == 0 || iters < 1 || iters > MAX_ITERS || m.layers < 1 || m.layers > MAX_LAYERS ||
        m.width < 1 || m.batch < 1) {
        fprintf(stderr, "usage: %s [--iters N] [--layers 1..%d] [--width W] [--batch B] [--lr X] "
                "[--compute cpu|device]\n", argv[0], MAX_LAYERS);
        return 2;
    }
    CHECK(hcclCommInitFromEnv(&comm));
    CHECK(hcclCommUserRank(comm, &g_rank));
    CHECK(hcclCommCount(comm, &n));
    if (n > 1024) {
        fprintf(stderr, "at most 1024 ranks\n");
        return 2;
    }
    for (int l = 0; l < m.layers; l++) {
        m.w[l] = alloc_floats((size_t)m.width * m.width);
        m.grad[l] = alloc_floats((size_t)m.width * m.width);
        m.z[l] = alloc_floats((size_t)m.batch * m.width);
    }
    for (int l = 0; l <= m.layers; l++)
        m.act[l] = alloc_floats((size_t)m.batch * m.width);
    m.delta = alloc_floats((size_t)m.batch * m.width);
    m.delta_prev = alloc_floats((size_t)m.batch * m.width);
    m.target = alloc_floats((size_t)m.batch * m.width);
    seed = 0x9e3779b97f4a7c15ull * (uint64_t)(g_rank + 1); /* each rank its own data */

    mlp_init_weights(&m);
    if (device)
        measure_compute(&m, comm, &seed, &ct);
    /* The loss is checked on one held-out batch before and after training, so that it measures
     * what the model learnt rather than how hard one batch was. */
    uint64_t eval_seed = seed ^ 0x5851f42d4c957f2dull, s = eval_seed;
    next_batch(&m, &s);
    loss0 = forward(&m);
    time_modes(&m, comm, iters, &seed, device ? &ct : NULL, ms, &exposed, &saved);
    s = eval_seed;
    next_batch(&m, &s);
    loss1 = forward(&m);
    t_overlap = ms[MODE_OVERLAP];
    t_serial = ms[MODE_SERIAL];
    t_compute = ms[MODE_COMPUTE];

    /* One bucket's AllReduce alone, to compare with the compute per layer it must hide under. */
    double ar[5];
    for (int i = 0; i < 5; i++) {
        double t0;
        CHECK(hcclBarrier(comm));
        t0 = now_ms();
        CHECK(hcclAllReduce(m.grad[0], m.grad[0], (size_t)m.width * m.width, hcclFloat32, hcclAvg,
                            comm));
        ar[i] = now_ms() - t0;
    }
    qsort(ar, 5, sizeof(double), cmp_double);

    /* Average the loss over ranks, then check that it fell and that the models agree. */
    float losses[2] = {loss0, loss1};
    CHECK(hcclAllReduce(losses, losses, 2, hcclFloat32, hcclAvg, comm));
    mine = weights_hash(&m);
    CHECK(hcclAllGather(&mine, hashes, 1, hcclUint64, comm));
    for (int r = 0; r < n; r++)
        if (hashes[r] != hashes[0]) {
            fprintf(stderr, "rank %d: rank %d's weights hash to %016llx, rank 0's to %016llx\n",
                    g_rank, r, (unsigned long long)hashes[r], (unsigned long long)hashes[0]);
            identical = 0;
            failed = 1;
        }
    if (!(losses[1] < losses[0])) {
        fprintf(stderr, "rank %d: the loss did not fall: %g then %g\n", g_rank, (double)losses[0],
                (double)losses[1]);
        failed = 1;
    }
    if (g_rank == 0) {
        double mib = (double)m.layers * m.width * m.width * sizeof(float) / (1 << 20);
        printf("overlap_training: %d ranks, %d layers of %dx%d, batch %d per rank, %.2f MiB of "
               "gradients per step, %d timed iterations per mode (medians, modes interleaved), "
               "compute on the %s\n",
               n, m.layers, m.width, m.width, m.batch, mib, iters, device ? "device" : "cpu");
        printf("  (a) overlapped  %8.2f ms/iter\n", t_overlap);
        printf("  (b) serial      %8.2f ms/iter\n", t_serial);
        printf("  (c) compute     %8.2f ms/iter\n", t_compute);
        printf("  one layer: compute %.2f ms ((c) / layers), AllReduce of its %.0f KiB alone %.2f "
               "ms\n",
               t_compute / m.layers, (double)m.width * m.width * sizeof(float) / 1024, ar[2]);
        if (exposed > 0)
            printf("  communication hidden: %.0f%% ((b)-(a))/((b)-(c)), medians of the "
                   "iterations' differences; exposed without overlap %.2f ms\n",
                   100.0 * saved / exposed, exposed);
        else
            printf("  communication hidden: n/a (serial was not slower than compute alone)\n");
        printf("  loss %.5f -> %.5f; weights bit-identical on all %d ranks: %s\n",
               (double)losses[0], (double)losses[1], n, identical ? "yes" : "NO");
    }
    CHECK(hcclCommDestroy(comm));
    for (int l = 0; l < m.layers; l++) {
        free(m.w[l]);
        free(m.grad[l]);
        free(m.z[l]);
    }
    for (int l = 0; l <= m.layers; l++)
        free(m.act[l]);
    free(m.delta);
    free(m.delta_prev);
    free(m.target);
    return failed;
}
