/*
 * callback_chain: a pipeline of AllReduces, each posted from the completion
 * callback of the one before it.
 *
 *   hccl-run -n 4 ./callback_chain                  # 8 stages of 64 Ki int64
 *   hccl-run -n 2 ./callback_chain --stages 40 --count 1000000
 *
 * Stage k AllReduces (sum) the output of stage k - 1 into a buffer of its own,
 * so it can start only when that result exists. Nobody waits in between: the
 * callback set with hcclRequestSetCallback runs on the communicator's thread
 * as soon as stage k - 1 is done and posts stage k with hcclAllReduceAsync
 * (posting never blocks, which is all a callback may do). The main thread
 * sleeps on a condition variable until the last stage's callback signals it,
 * then reaps the handles with hcclWaitAll and checks every stage's output:
 * stage k holds n^k times the sum of the inputs.
 *
 * It also times the same chain driven the usual way (post, hcclWait, post...)
 * for comparison. Exit 1 on any failed stage or wrong element.
 */
#include <errno.h>
#include <pthread.h>
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

#define MAX_STAGES 64

typedef struct {
    hcclComm_t comm;
    size_t count;
    int stages;
    int64_t *in, *out[MAX_STAGES];  /* stage k reads out[k - 1] (stage 0: in), writes out[k] */
    hcclRequest_t reqs[MAX_STAGES]; /* written by whoever posts stage k, reaped at the end */
    pthread_mutex_t mtx;
    pthread_cond_t cond;
    int finished;       /* stages whose callback has run */
    hcclResult_t error; /* the first failure */
} chain_t;

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void on_stage_done(hcclRequest_t req, hcclResult_t result, void *arg);

/* Called by main for stage 0 and by stage k - 1's callback for stage k. */
static hcclResult_t post_stage(chain_t *c, int k)
{
    const int64_t *src = k == 0 ? c->in : c->out[k - 1];
    hcclResult_t res;

    res = hcclAllReduceAsync(src, c->out[k], c->count, hcclInt64, hcclSum, c->comm, &c->reqs[k]);
    if (res == hcclSuccess)
        res = hcclRequestSetCallback(c->reqs[k], on_stage_done, c);
    return res;
}

static void on_stage_done(hcclRequest_t req, hcclResult_t result, void *arg)
{
    chain_t *c = arg;
    int k;

    (void)req;
    pthread_mutex_lock(&c->mtx);
    k = c->finished++;
    if (result != hcclSuccess && c->error == hcclSuccess)
        c->error = result;
    pthread_mutex_unlock(&c->mtx);
    if (result == hcclSuccess && k + 1 < c->stages) {
        result = post_stage(c, k + 1); /* the next stage's input is ready now */
        if (result == hcclSuccess)
            return;
        pthread_mutex_lock(&c->mtx);
        c->error = result;
        pthread_mutex_unlock(&c->mtx);
    }
    /* The last stage, or the chain broke: wake main. */
    pthread_mutex_lock(&c->mtx);
    c->finished = c->stages;
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->mtx);
}

static int check_stages(const chain_t *c, int n)
{
    int64_t scale = 1;

    for (int k = 0; k < c->stages; k++) {
        scale *= k == 0 ? 1 : n;
        for (size_t i = 0; i < c->count; i++) {
            int64_t want = scale * ((int64_t)n * (n + 1) / 2 + (int64_t)n * (int64_t)(i % 5));
            if (c->out[k][i] != want) {
                fprintf(stderr, "rank %d: stage %d element %zu is %lld, want %lld\n", g_rank, k, i,
                        (long long)c->out[k][i], (long long)want);
                return 1;
            }
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    chain_t c = {.count = 65536, .stages = 8, .error = hcclSuccess};
    double t0, chained_ms, waited_ms;
    int n, bad = 0, max_stages = 1;
    struct timespec deadline;

    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--stages"))
            c.stages = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--count"))
            c.count = (size_t)atol(argv[i + 1]);
        else
            break;
    }
    CHECK(hcclCommInitFromEnv(&c.comm));
    CHECK(hcclCommUserRank(c.comm, &g_rank));
    CHECK(hcclCommCount(c.comm, &n));
    /* Stage k holds up to n^k * (n(n+1)/2 + 4n): keep it inside int64. */
    for (double top = (double)n * (n + 1) / 2 + 4.0 * n; top * n < 9e18 && max_stages < MAX_STAGES;
         top *= n)
        max_stages++;
    if (argc % 2 == 0 || c.stages < 1 || c.stages > max_stages || c.count < 1) {
        fprintf(stderr, "usage: %s [--stages 1..%d (at %d ranks)] [--count N]\n", argv[0],
                max_stages, n);
        return 2;
    }
    c.in = malloc(c.count * sizeof(int64_t));
    for (int k = 0; k < c.stages; k++)
        c.out[k] = calloc(c.count, sizeof(int64_t));
    for (int k = 0; k < c.stages; k++)
        if (!c.in || !c.out[k])
            return fprintf(stderr, "out of memory\n"), 1;
    for (size_t i = 0; i < c.count; i++)
        c.in[i] = g_rank + 1 + (int64_t)(i % 5);
    pthread_mutex_init(&c.mtx, NULL);
    pthread_cond_init(&c.cond, NULL);

    CHECK(hcclBarrier(c.comm));
    t0 = now_ms();
    CHECK(post_stage(&c, 0));
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 60; /* a chain that stalls is reported, never waited for forever */
    pthread_mutex_lock(&c.mtx);
    while (c.finished < c.stages)
        if (pthread_cond_timedwait(&c.cond, &c.mtx, &deadline) == ETIMEDOUT)
            break;
    pthread_mutex_unlock(&c.mtx);
    chained_ms = now_ms() - t0;
    if (c.finished < c.stages) {
        fprintf(stderr, "rank %d: the chain stalled after %d of %d stages\n", g_rank, c.finished,
                c.stages);
        return 1;
    }
    /* Every posted stage is done; hcclWaitAll hands the handles back (and the first error). */
    if (hcclWaitAll(c.stages, c.reqs) != hcclSuccess || c.error != hcclSuccess) {
        fprintf(stderr, "rank %d: a stage failed: %s: %s\n", g_rank,
                hcclGetErrorString(c.error != hcclSuccess ? c.error : hcclInternalError),
                hcclGetLastError(NULL));
        return 1;
    }
    bad = check_stages(&c, n);

    /* The same chain with the caller in the middle: post, wait, post, wait... */
    for (int k = 0; k < c.stages; k++)
        memset(c.out[k], 0, c.count * sizeof(int64_t));
    CHECK(hcclBarrier(c.comm));
    t0 = now_ms();
    for (int k = 0; k < c.stages; k++) {
        CHECK(hcclAllReduceAsync(k == 0 ? c.in : c.out[k - 1], c.out[k], c.count, hcclInt64,
                                 hcclSum, c.comm, &c.reqs[k]));
        CHECK(hcclWait(&c.reqs[k]));
    }
    waited_ms = now_ms() - t0;
    bad |= check_stages(&c, n);

    CHECK(hcclAllReduce(&bad, &bad, 1, hcclInt32, hcclMax, c.comm));
    CHECK(hcclCommDestroy(c.comm));
    if (g_rank == 0)
        printf("callback_chain: %d ranks, %d stages of %zu int64: chained in callbacks %.2f ms, "
               "post+wait from main %.2f ms; %s\n",
               n, c.stages, c.count, chained_ms, waited_ms,
               bad ? "FAILED" : "every stage checked on every rank");
    for (int k = 0; k < c.stages; k++)
        free(c.out[k]);
    free(c.in);
    pthread_mutex_destroy(&c.mtx);
    pthread_cond_destroy(&c.cond);
    return bad;
}
