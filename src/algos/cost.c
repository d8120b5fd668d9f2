/*
 * The alpha-beta-gamma cost model the tuner minimises: alpha is the cost of
 * one message (us), beta of one byte on the wire, gamma of one byte reduced.
 * Each formula is the critical path of the algorithm as generated here
 * (pipelined ones in chunks), so the pick follows the plans, not a textbook.
 */
#include <math.h>

#include "algos/algos.h"

static const hccl_cost_t default_models[] = {
    /* shm: an eventfd wake-up per message dominates alpha: the default is one on a busy host
     * (docs/performance.md). */
    [HCCL_COST_SHM] = {.alpha_us = 30.0, .beta_us_per_byte = 1.0 / 2500.0, .gamma_us_per_byte = 1.0 / 5000.0},
    /* tcp: a syscall pair and a wake-up per message, a loopback or NIC stream per byte. */
    [HCCL_COST_TCP] = {.alpha_us = 50.0, .beta_us_per_byte = 1.0 / 1200.0, .gamma_us_per_byte = 1.0 / 5000.0},
};

hccl_cost_t hccl_cost_default(hccl_cost_class_t cls)
{
    return default_models[cls];
}

static double log2_ceil(int n)
{
    int k = 0;

    while ((1 << k) < n)
        k++;
    return k;
}

static double log2_floor(int n)
{
    int k = 0;

    while ((2 << k) <= n)
        k++;
    return k;
}

/* The chunks a pipelined algorithm cuts m bytes into. */
static double chunks(double m, size_t chunk)
{
    double k = chunk ? ceil(m / (double)chunk) : 1;

    return k < 1 ? 1 : k;
}

/* A binomial tree: the root sends every chunk to each of its ceil(log2 n) children in turn,
 * so it is the bottleneck: k * lg stages of one chunk. */
static double tree(const hccl_cost_t *c, double lg, double m, size_t chunk, double per_byte)
{
    double k = chunks(m, chunk);

    return k * lg * (c->alpha_us + m / k * per_byte);
}

/*
 * Messages and bytes of a pipeline of depth d over m bytes cut into chunks. Where ranks take
 * turns on shared CPUs, a rank's turn costs more than a hop, and calls made back to back
 * overlap down the chain (depth_hidden): what sets the pace is one receive and one send per
 * chunk, as in a pipeline of depth 1, where a tree's root sends each chunk lg n times. Timed
 * with ranks sharing CPUs, Broadcast and Reduce by chain mostly beat the tree the depths
 * chose (docs/performance.md).
 */
static double pipeline(const hccl_cost_t *c, double depth, bool depth_hidden, double m,
                       size_t chunk, double per_byte)
{
    double k = chunks(m, chunk);

    if (depth_hidden)
        depth = 1;
    return (depth + k - 1) * (c->alpha_us + m / k * per_byte);
}

/*
 * Where ranks take turns on shared CPUs over shm, a ring's n - 1 steps each wait for the next
 * rank's turn, which its pipeline of chunks does not hide: at 4 and 8 ranks on 2 cores,
 * 64 MiB, the rings of AllGather, ReduceScatter and AllReduce took 1.15-1.4x the time of the
 * recursive algorithms that move the same bytes in log2 n steps (docs/performance.md). Their
 * bytes are priced that much higher there. Over tcp, where the sockets' buffers let a ring's
 * sender run ahead, a 16 MiB ReduceScatter at 4 ranks was faster by ring.
 */
#define RING_SHARED_BYTE_COST 1.3

double hccl_cost_estimate(const hccl_cost_t *c, hccl_coll_t coll, hccl_algo_t algo, size_t bytes,
                          int n, size_t chunk)
{
    double m = (double)bytes, a = c->alpha_us, b = c->beta_us_per_byte, g = c->gamma_us_per_byte;
    double rb = c->rings_wait_turns ? RING_SHARED_BYTE_COST * b : b; /* a ring's byte */
    double p = pow(2.0, log2_floor(n)), fold = p < n ? 2 * (a + m * b) : 0;
    double lg = log2_ceil(n), nn = n;

    if (n <= 1)
        return 0;
    switch (coll) {
    case HCCL_COLL_ALLREDUCE:
        if (algo == HCCL_ALGO_RING)
            return 2 * (nn - 1) * a + 2 * (nn - 1) / nn * m * rb + (nn - 1) / nn * m * g;
        if (algo == HCCL_ALGO_RECDBL)
            return log2_floor(n) * (a + m * b + m * g) + fold;
        if (algo == HCCL_ALGO_RABENSEIFNER)
            return 2 * log2_floor(n) * a + 2 * (p - 1) / p * m * b + (p - 1) / p * m * g + fold;
        if (algo == HCCL_ALGO_TREE) /* reduce up, then broadcast down, chunk by chunk */
            return tree(c, lg, m, chunk, b + g) + tree(c, lg, m, chunk, b);
        break;
    case HCCL_COLL_BROADCAST:
        if (algo == HCCL_ALGO_TREE)
            return tree(c, lg, m, chunk, b);
        if (algo == HCCL_ALGO_CHAIN)
            return pipeline(c, nn - 1, c->cpus_shared, m, chunk, b);
        /* At 2 ranks both of its phases only move the root's halves to the other rank, one
         * after the other: the tree's pipeline does the same in one stream, several times
         * faster (docs/performance.md). */
        if (algo == HCCL_ALGO_SCATTER_ALLGATHER)
            return n == 2 ? INFINITY : lg * a + (nn - 1) / nn * m * b + (nn - 1) * (a + m / nn * b);
        break;
    case HCCL_COLL_REDUCE:
        if (algo == HCCL_ALGO_TREE)
            return tree(c, lg, m, chunk, b + g);
        /* Over shm with shared CPUs (where rings wait for turns too) a Reduce's chain did not
         * hide its depth: at 8-256 B the tree took 0.63-0.85x its time at 4 and 8 ranks
         * (bench/pick_sweep.sh); its many chunks still win from the lane's largest up. */
        if (algo == HCCL_ALGO_CHAIN)
            return pipeline(c, nn - 1, c->cpus_shared && !c->rings_wait_turns, m, chunk, b + g);
        break;
    case HCCL_COLL_ALLGATHER: /* m = one rank's block; the result is n blocks */
        if (algo == HCCL_ALGO_RING)
            return (nn - 1) * (a + m * rb);
        /* recdbl builds Bruck's plan when n is not a power of two; Bruck collects in scratch and
         * rotates the result into place: two more passes over it. */
        if (algo == HCCL_ALGO_BRUCK || (algo == HCCL_ALGO_RECDBL && p < n))
            return lg * a + (nn - 1) * m * b + 2 * nn * m * g;
        if (algo == HCCL_ALGO_RECDBL)
            return lg * a + (nn - 1) * m * b;
        break;
    case HCCL_COLL_REDUCESCATTER: /* m = one rank's block */
        if (algo == HCCL_ALGO_RING)
            return (nn - 1) * (a + m * (rb + g));
        if (algo == HCCL_ALGO_RECHALV) /* whole halves at a time, in a scratch of the full input */
            return log2_floor(n) * a + (nn - 1) * m * (b + g) + nn * m * g +
                   (p < n ? 2 * (a + nn * m * b) : 0);
        break;
    case HCCL_COLL_ALLTOALL: /* m = one block */
        if (algo == HCCL_ALGO_PAIRWISE)
            return (nn - 1) * (a + m * b);
        if (algo == HCCL_ALGO_BRUCK) /* half the blocks per round, plus packing copies */
            return lg * (a + nn / 2 * m * b) + 2 * nn * m * g;
        break;
    case HCCL_COLL_ALLTOALLV:
    case HCCL_COLL_BARRIER:
        return lg * a;
    default:
        break;
    }
    return INFINITY;
}
