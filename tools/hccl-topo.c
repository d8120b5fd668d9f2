/*
 * hccl-topo: what a communicator sees. Hosts and their ranks, the link kind
 * between every pair of ranks, the latency and bandwidth of each link class
 * measured now, the tuner's cost model, and the algorithm it picks per
 * collective and size.
 *
 *   hccl-run -n 4 hccl-topo            a table, printed by rank 0
 *   hccl-run -n 4 hccl-topo --json     the HCCL_TOPO_DUMP document, plus the measured links
 *
 * Every rank must run it (it builds a communicator, as any program would);
 * any launcher hcclCommInitFromEnv understands works.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/comm.h"
#include "hccl.h"

#define LAT_WARMUP 50
#define LAT_ITERS 500
#define BW_BYTES (4u << 20)
#define BW_MSGS 8
#define BW_REPS 3

static const size_t table_sizes[] = {8, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20};
static const char *const table_size_names[] = {"8 B", "4 KiB", "64 KiB", "1 MiB", "16 MiB", "256 MiB"};
static const hccl_coll_t table_colls[] = {
    HCCL_COLL_ALLREDUCE, HCCL_COLL_BROADCAST, HCCL_COLL_REDUCE, HCCL_COLL_ALLGATHER,
    HCCL_COLL_REDUCESCATTER, HCCL_COLL_ALLTOALL,
};
#define NSIZES (sizeof(table_sizes) / sizeof(table_sizes[0]))
#define NCOLLS (sizeof(table_colls) / sizeof(table_colls[0]))

static double now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

#define CHECK(call)                                                                                    \
    do {                                                                                               \
        hcclResult_t r_ = (call);                                                                      \
        if (r_ != hcclSuccess) {                                                                       \
            fprintf(stderr, "hccl-topo: %s: %s: %s\n", #call, hcclGetErrorString(r_),                  \
                    hcclGetLastError(NULL));                                                           \
            return r_;                                                                                 \
        }                                                                                              \
    } while (0)

/* Half the mean round trip of 8-byte messages between a and b. */
static hcclResult_t pingpong(hcclComm_t comm, int me, int a, int b, double *lat_us)
{
    char msg[8] = {0};
    int peer = me == a ? b : a;
    double t0 = 0;

    for (int i = 0; i < LAT_WARMUP + LAT_ITERS; i++) {
        if (i == LAT_WARMUP)
            t0 = now_us();
        if (me == a) {
            CHECK(hcclSend(msg, sizeof(msg), hcclUint8, peer, comm));
            CHECK(hcclRecv(msg, sizeof(msg), hcclUint8, peer, comm));
        } else {
            CHECK(hcclRecv(msg, sizeof(msg), hcclUint8, peer, comm));
            CHECK(hcclSend(msg, sizeof(msg), hcclUint8, peer, comm));
        }
    }
    *lat_us = (now_us() - t0) / LAT_ITERS / 2;
    return hcclSuccess;
}

/* a streams BW_MSGS messages to b, which acknowledges the last; the best of BW_REPS. */
static hcclResult_t stream_bw(hcclComm_t comm, int me, int a, int b, char *buf, double *gbps)
{
    hcclRequest_t reqs[BW_MSGS];
    char ack[8] = {0};
    double best = 0;

    for (int rep = 0; rep < BW_REPS + 1; rep++) {
        double t0 = now_us();
        for (int i = 0; i < BW_MSGS; i++) {
            if (me == a)
                CHECK(hcclSendAsync(buf, BW_BYTES, hcclUint8, b, comm, &reqs[i]));
            else
                CHECK(hcclRecvAsync(buf, BW_BYTES, hcclUint8, a, comm, &reqs[i]));
        }
        CHECK(hcclWaitAll(BW_MSGS, reqs));
        if (me == a)
            CHECK(hcclRecv(ack, sizeof(ack), hcclUint8, b, comm));
        else
            CHECK(hcclSend(ack, sizeof(ack), hcclUint8, a, comm));
        double rate = (double)BW_BYTES * BW_MSGS / (now_us() - t0) / 1e3;
        if (rep > 0 && rate > best) /* the first round is a warm-up */
            best = rate;
    }
    *gbps = best;
    return hcclSuccess;
}

/*
 * Every rank sends to the next and receives from the one before, all at once: what each link
 * carries while every rank works, as in a ring algorithm's step, which is what the tuner's
 * per-link figure models. The slowest rank's rate, the best of BW_REPS.
 */
static hcclResult_t ring_bw(hcclComm_t comm, int me, int n, char *buf, double *gbps)
{
    hcclRequest_t reqs[2 * BW_MSGS];
    double best = 0;

    for (int rep = 0; rep < BW_REPS + 1; rep++) {
        CHECK(hcclBarrier(comm));
        double t0 = now_us(), rate;
        for (int i = 0; i < BW_MSGS; i++) {
            CHECK(hcclRecvAsync(buf + BW_BYTES, BW_BYTES, hcclUint8, (me + n - 1) % n, comm,
                                &reqs[2 * i]));
            CHECK(hcclSendAsync(buf, BW_BYTES, hcclUint8, (me + 1) % n, comm, &reqs[2 * i + 1]));
        }
        CHECK(hcclWaitAll(2 * BW_MSGS, reqs));
        rate = (double)BW_BYTES * BW_MSGS / (now_us() - t0) / 1e3;
        CHECK(hcclAllReduce(&rate, &rate, 1, hcclFloat64, hcclMin, comm));
        if (rep > 0 && rate > best) /* the first round is a warm-up */
            best = rate;
    }
    *gbps = best;
    return hcclSuccess;
}

/*
 * Measures each link class in use on the first pair of ranks it joins; the other ranks wait in
 * the AllReduce that brings the figures to everyone.
 */
static hcclResult_t measure_links(hcclComm_t comm, hccl_topo_linkperf_t *perf, int *nperf,
                                  double *ring_gbps)
{
    const struct hcclComm *c = comm;
    double fig[HCCL_LINK_MAX][2] = {{0}};
    int pair[HCCL_LINK_MAX][2];
    char *buf = calloc(2, BW_BYTES);

    if (!buf)
        return hcclSystemError;
    for (int k = 0; k < HCCL_LINK_MAX; k++) {
        pair[k][0] = pair[k][1] = -1;
        for (int i = 0; i < c->nranks && pair[k][0] < 0; i++)
            for (int j = i + 1; j < c->nranks && pair[k][0] < 0; j++)
                if (hccl_topo_pick_link(&c->cards[i], &c->cards[j]) == k) {
                    pair[k][0] = i;
                    pair[k][1] = j;
                }
        if (c->rank != pair[k][0] && c->rank != pair[k][1])
            continue;
        hcclResult_t r = pingpong(comm, c->rank, pair[k][0], pair[k][1], &fig[k][0]);
        if (r == hcclSuccess)
            r = stream_bw(comm, c->rank, pair[k][0], pair[k][1], buf, &fig[k][1]);
        if (r != hcclSuccess) {
            free(buf);
            return r;
        }
        if (c->rank != pair[k][0])
            fig[k][0] = fig[k][1] = 0; /* the sender's clock speaks for the pair */
    }
    hcclResult_t r = hcclAllReduce(fig, fig, 2 * HCCL_LINK_MAX, hcclFloat64, hcclMax, comm);
    if (r == hcclSuccess)
        r = ring_bw(comm, c->rank, c->nranks, buf, ring_gbps);
    free(buf);
    CHECK(r);
    *nperf = 0;
    for (int k = 0; k < HCCL_LINK_MAX; k++)
        if (pair[k][0] >= 0)
            perf[(*nperf)++] = (hccl_topo_linkperf_t){k, pair[k][0], pair[k][1], fig[k][0], fig[k][1]};
    return hcclSuccess;
}

/* Hosts numbered in the order of their first rank. */
static int host_index(const struct hcclComm *c, int r)
{
    int idx = 0;

    for (int q = 0; q < c->node_of[r]; q++)
        idx += c->node_of[q] == q;
    return idx;
}

static void print_table(const struct hcclComm *c, const hccl_topo_linkperf_t *perf, int nperf,
                        double ring_gbps)
{
    int nhosts = 0;
    const hccl_cost_t *m = &c->tuner.model;

    for (int r = 0; r < c->nranks; r++)
        nhosts = host_index(c, r) + 1 > nhosts ? host_index(c, r) + 1 : nhosts;
    printf("hccl-topo: %d rank%s on %d host%s\n\n", c->nranks, c->nranks == 1 ? "" : "s", nhosts,
           nhosts == 1 ? "" : "s");
    for (int h = 0; h < nhosts; h++) {
        int n = 0, first = -1;
        for (int r = 0; r < c->nranks; r++)
            if (host_index(c, r) == h) {
                first = first < 0 ? r : first;
                n++;
            }
        printf("host %d  %s  %d rank%s:", h, c->cards[first].host, n, n == 1 ? "" : "s");
        for (int r = 0; r < c->nranks; r++)
            if (host_index(c, r) == h)
                printf(" %d", r);
        printf("\n");
    }

    printf("\nlink from rank (row) to rank (column)\n     ");
    for (int q = 0; q < c->nranks; q++)
        printf(" %5d", q);
    printf("\n");
    for (int r = 0; r < c->nranks; r++) {
        printf("%5d", r);
        for (int q = 0; q < c->nranks; q++) {
            int id = q == r ? -1 : hccl_topo_pick_link(&c->cards[r], &c->cards[q]);
            printf(" %5s", q == r ? "-" : id < 0 ? "none" : hccl_link_by_id(id)->name);
        }
        printf("\n");
    }

    if (nperf > 0) {
        printf("\nlink classes, measured now (8 B ping-pong latency, %u MiB stream bandwidth)\n",
               BW_BYTES >> 20);
        for (int i = 0; i < nperf; i++)
            printf("  %-4s ranks %d-%d  latency %8.2f us  bandwidth %7.2f GB/s\n",
                   hccl_link_by_id(perf[i].link)->name, perf[i].a, perf[i].b, perf[i].latency_us,
                   perf[i].bandwidth_gbps);
        printf("  every rank sending to the next at once (as in a ring's step): "
               "%.2f GB/s per link\n",
               ring_gbps);
    }

    printf("\ntuner model (%s class, %s): alpha %.2f us, %.2f GB/s per link, reduction %.2f GB/s\n",
           c->tuner.cls == HCCL_COST_TCP ? "tcp" : "shm",
           c->model_measured ? "measured at start-up" : c->params.cost_model[0] ? "HCCL_COST_MODEL" : "defaults",
           m->alpha_us, 1.0 / m->beta_us_per_byte / 1000.0, 1.0 / m->gamma_us_per_byte / 1000.0);
    printf("\nalgorithm picked per collective and message size\n%-14s", "");
    for (size_t s = 0; s < NSIZES; s++)
        printf(" %12s", table_size_names[s]);
    printf("\n");
    for (size_t i = 0; i < NCOLLS; i++) {
        printf("%-14s", hccl_coll_name(table_colls[i]));
        for (size_t s = 0; s < NSIZES; s++)
            printf(" %12s", hccl_algo_name(hccl_topo_pick(c, table_colls[i], table_sizes[s])));
        printf("\n");
    }
}

static void usage(FILE *f)
{
    fprintf(f, "usage: hccl-run -n N hccl-topo [--json] [--no-measure]\n"
               "  --json        print the HCCL_TOPO_DUMP document with the measured link classes\n"
               "  --no-measure  skip the ping-pong between ranks\n");
}

int main(int argc, char **argv)
{
    bool json = false, measure = true;
    hccl_topo_linkperf_t perf[HCCL_LINK_MAX];
    int nperf = 0;
    double ring_gbps = 0;
    hcclComm_t comm;
    hcclResult_t r;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "--no-measure")) {
            measure = false;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "hccl-topo: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    r = hcclCommInitFromEnv(&comm);
    if (r != hcclSuccess) {
        fprintf(stderr, "hccl-topo: hcclCommInitFromEnv: %s: %s\n", hcclGetErrorString(r),
                hcclGetLastError(NULL));
        return 1;
    }
    if (measure && comm->nranks > 1)
        r = measure_links(comm, perf, &nperf, &ring_gbps);
    if (r == hcclSuccess && comm->rank == 0) {
        if (json)
            hccl_topo_write_json(comm, stdout, perf, nperf);
        else
            print_table(comm, perf, nperf, ring_gbps);
        fflush(stdout);
    }
    if (r != hcclSuccess) {
        fprintf(stderr, "hccl-topo: rank %d: measuring the links failed: %s\n", comm->rank,
                hcclGetLastError(comm));
        hcclCommAbort(comm);
        return 1;
    }
    r = hcclCommDestroy(comm);
    return r == hcclSuccess ? 0 : 1;
}
