/*
 * event_loop: a communicator that lives in the caller's libevent loop.
 *
 *   hccl-run -n 2 ./event_loop                     # 4 steps of a 64 MiB AllReduce
 *   hccl-run -n 4 ./event_loop --steps 20 --mib 64 # a longer run, to measure
 *
 * A server-style program owns one event_base. It serves a 1 ms timer (the
 * stand-in for the server's real work: sockets, timeouts) and, in the same
 * loop, runs collectives: the communicator is created with
 * hcclConfig_t.eventBase = base, so it has no thread of its own and advances
 * only while the loop runs. Each step posts a 64 MiB AllReduce and a 1 KiB
 * AllReduce; their completion callbacks (hcclRequestSetCallback, run by the
 * loop) post the next step, and the last one ends the loop. No thread blocks.
 *
 * What it measures: how late the 1 ms timer fires (max and 99th percentile)
 * while the AllReduces run, against the same timer with the loop idle. That is
 * the latency the communicator adds to everything else the loop serves; the
 * library bounds the work it does per event so that it stays small.
 *
 * The communicator with its own thread (from hcclCommInitFromEnv) carries the
 * unique id of the loop's communicator to every rank, and the verdicts back.
 * Exit 1 on any failed callback or wrong element.
 */
#include <event2/event.h>
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

#define MAX_STEPS 1000
#define MAX_TICKS 200000
#define SMALL_COUNT 256 /* float32: 1 KiB */

typedef struct {
    struct event_base *base;
    struct event *tick;
    hcclComm_t comm;
    int n, steps;
    size_t count;       /* elements of the large AllReduce */
    float *send, *recv; /* the large AllReduce */
    float small_send[SMALL_COUNT], small_recv[SMALL_COUNT];
    hcclRequest_t reqs[2 * MAX_STEPS]; /* every handle, reaped after the loop */
    int posted, step, pending;         /* requests posted; current step; its callbacks still due */
    int failed;
    /* The timer: when it should fire next, and how late each tick was. */
    double due_us;
    int idle_ticks; /* ticks measured before the first post */
    double *idle_late, *busy_late;
    double *busy_cpu; /* the loop thread's CPU time between two busy ticks */
    double last_cpu_us;
    int nidle, nbusy;
    int busy;                /* collectives in flight */
    double start_us, end_us; /* first post, last completion */
} loop_state_t;

static double now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static double thread_cpu_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static void post_step(loop_state_t *st);

static void on_done(hcclRequest_t req, hcclResult_t result, void *arg)
{
    loop_state_t *st = arg;

    (void)req; /* the handle is reaped with hcclWaitAll once the loop has ended */
    if (result != hcclSuccess) {
        fprintf(stderr, "rank %d: step %d: AllReduce failed: %s\n", g_rank, st->step,
                hcclGetErrorString(result));
        st->failed = 1;
        event_base_loopbreak(st->base);
        return;
    }
    if (--st->pending > 0)
        return;
    if (++st->step < st->steps) {
        post_step(st);
        return;
    }
    st->busy = 0;
    st->end_us = now_us();
    event_del(st->tick);
    event_base_loopbreak(st->base); /* every step done */
}

static void post_one(loop_state_t *st, const float *send, float *recv, size_t count)
{
    hcclRequest_t *req = &st->reqs[st->posted++];

    CHECK(hcclAllReduceAsync(send, recv, count, hcclFloat32, hcclSum, st->comm, req));
    CHECK(hcclRequestSetCallback(*req, on_done, st));
}

/* Runs in the loop (a callback) or before it: posts never block. */
static void post_step(loop_state_t *st)
{
    if (st->posted == 0)
        st->start_us = now_us();
    st->busy = 1;
    st->pending = 2;
    post_one(st, st->send, st->recv, st->count);
    post_one(st, st->small_send, st->small_recv, SMALL_COUNT);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    loop_state_t *st = arg;
    struct timeval one_ms = {0, 1000};
    double now = now_us(), late = now - st->due_us, cpu = thread_cpu_us();

    (void)fd, (void)what;
    if (st->busy && st->nbusy < MAX_TICKS) {
        st->busy_cpu[st->nbusy] = cpu - st->last_cpu_us;
        st->busy_late[st->nbusy++] = late;
    } else if (!st->busy && st->posted == 0)
        st->idle_late[st->nidle++] = late;
    st->due_us = now + 1000;
    st->last_cpu_us = cpu;
    evtimer_add(st->tick, &one_ms);
    if (st->posted == 0 && st->nidle == st->idle_ticks)
        post_step(st); /* the idle baseline is measured: start the collectives */
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void summary(const char *what, double *v, int n, double *p99_p, double *max_p)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    *p99_p = n ? v[(n * 99) / 100] : 0;
    *max_p = n ? v[n - 1] : 0;
    if (g_rank == 0)
        printf("  timer lateness %-28s %6d ticks  p50 %7.1f us  p99 %7.1f us  max %7.1f us\n", what,
               n, n ? v[n / 2] : 0, *p99_p, *max_p);
}

int main(int argc, char **argv)
{
    static loop_state_t st;
    hcclConfig_t config = HCCL_CONFIG_INITIALIZER;
    char text[HCCL_UNIQUE_ID_STRLEN] = "";
    struct timeval one_ms = {0, 1000};
    hcclComm_t world;
    hcclUniqueId id;
    double mib = 64, elapsed, p99, max;
    int bad = 0;

    st.steps = 4;
    st.idle_ticks = 100;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--steps"))
            st.steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--mib"))
            mib = atof(argv[i + 1]);
        else
            break;
    }
    if (argc % 2 == 0 || st.steps < 1 || st.steps > MAX_STEPS || mib <= 0) {
        fprintf(stderr, "usage: %s [--steps 1..%d] [--mib MIB]\n", argv[0], MAX_STEPS);
        return 2;
    }
    CHECK(hcclCommInitFromEnv(&world));
    CHECK(hcclCommUserRank(world, &g_rank));
    CHECK(hcclCommCount(world, &st.n));

    /* The loop's communicator: same ranks, created with the caller's event_base. */
    /* A 1 ms timer needs the precise timer: without it epoll_wait's millisecond timeout is
     * rounded and the kernel's timer slack alone makes it fire milliseconds late. */
    struct event_config *ev_config = event_config_new();
    if (ev_config)
        event_config_set_flag(ev_config, EVENT_BASE_FLAG_PRECISE_TIMER);
    st.base = ev_config ? event_base_new_with_config(ev_config) : NULL;
    if (ev_config)
        event_config_free(ev_config);
    if (!st.base) {
        fprintf(stderr, "rank %d: event_base_new failed\n", g_rank);
        return 1;
    }
    if (g_rank == 0) {
        CHECK(hcclGetUniqueId(&id));
        CHECK(hcclUniqueIdToString(&id, text, sizeof(text)));
    }
    CHECK(hcclBroadcast(text, sizeof(text), hcclUint8, 0, world));
    CHECK(hcclUniqueIdFromString(&id, text));
    config.eventBase = st.base;
    CHECK(hcclCommInitRankConfig(&st.comm, st.n, id, g_rank, &config));

    st.count = (size_t)(mib * (1 << 20)) / sizeof(float);
    st.send = malloc(st.count * sizeof(float));
    st.recv = calloc(st.count, sizeof(float));
    st.idle_late = calloc(MAX_TICKS, sizeof(double));
    st.busy_late = calloc(MAX_TICKS, sizeof(double));
    st.busy_cpu = calloc(MAX_TICKS, sizeof(double));
    if (!st.send || !st.recv || !st.idle_late || !st.busy_late || !st.busy_cpu) {
        fprintf(stderr, "rank %d: out of memory\n", g_rank);
        return 1;
    }
    for (size_t i = 0; i < st.count; i++)
        st.send[i] = (float)(g_rank + 1) + (float)(i % 7);
    for (int i = 0; i < SMALL_COUNT; i++)
        st.small_send[i] = (float)(g_rank * i);

    st.tick = evtimer_new(st.base, on_tick, &st);
    st.due_us = now_us() + 1000;
    evtimer_add(st.tick, &one_ms);
    event_base_dispatch(st.base); /* returns when the last step's callback breaks it */
    elapsed = (st.end_us - st.start_us) / 1e6;

    /* Every request is done by now; hcclWaitAll only hands the handles back. */
    if (hcclWaitAll(st.posted, st.reqs) != hcclSuccess) {
        fprintf(stderr, "rank %d: %s\n", g_rank, hcclGetLastError(NULL));
        st.failed = 1;
    }
    if (!st.failed && st.step != st.steps) {
        fprintf(stderr, "rank %d: the loop ended after %d of %d steps\n", g_rank, st.step,
                st.steps);
        st.failed = 1;
    }
    for (size_t i = 0; i < st.count && !st.failed; i++)
        if (st.recv[i] != (float)(st.n * (st.n + 1) / 2) + (float)st.n * (float)(i % 7) &&
            bad++ < 3)
            fprintf(stderr, "rank %d: element %zu is %g\n", g_rank, i, (double)st.recv[i]);
    for (int i = 0; i < SMALL_COUNT && !st.failed; i++)
        if (st.small_recv[i] != (float)(st.n * (st.n - 1) / 2 * i) && bad++ < 3)
            fprintf(stderr, "rank %d: small element %d is %g\n", g_rank, i,
                    (double)st.small_recv[i]);
    st.failed |= bad > 0;
    CHECK(hcclCommDestroy(st.comm)); /* outside the loop: it drives what is left itself */
    event_free(st.tick);
    event_base_free(st.base);

    if (g_rank == 0)
        printf("event_loop: %d ranks, %d steps of a %.0f MiB + a 1 KiB AllReduce in %.3f s "
               "(%.2f GB/s algbw), a 1 ms timer in the same libevent loop\n",
               st.n, st.steps, mib, elapsed,
               (double)st.count * sizeof(float) * st.steps / elapsed / 1e9);
    summary("idle loop (baseline)", st.idle_late, st.nidle, &p99, &max);
    summary("while AllReduces ran", st.busy_late, st.nbusy, &p99, &max);
    /* Lateness is the loop's own work between ticks (the library's callbacks run here) plus
     * the time the thread waited for a core; the thread's CPU time tells them apart. */
    double cpu_p99, cpu_max;
    qsort(st.busy_cpu, (size_t)st.nbusy, sizeof(double), cmp_double);
    cpu_p99 = st.nbusy ? st.busy_cpu[(st.nbusy * 99) / 100] : 0;
    cpu_max = st.nbusy ? st.busy_cpu[st.nbusy - 1] : 0;
    if (g_rank == 0)
        printf("  loop thread CPU time between two ticks while busy: p99 %.1f us, max %.1f us "
               "(the rest of the lateness is waiting for a core)\n",
               cpu_p99, cpu_max);
    /* The slowest rank's figures, and whether any rank failed. */
    double worst[3] = {p99, max, (double)st.failed};
    CHECK(hcclAllReduce(worst, worst, 3, hcclFloat64, hcclMax, world));
    CHECK(hcclCommDestroy(world));
    if (g_rank == 0)
        printf("event_loop: worst rank while busy: p99 %.1f us, max %.1f us; %s\n", worst[0],
               worst[1], worst[2] > 0 ? "FAILED" : "all results checked on every rank");
    free(st.send);
    free(st.recv);
    free(st.idle_late);
    free(st.busy_late);
    free(st.busy_cpu);
    return worst[2] > 0 ? 1 : st.failed;
}
