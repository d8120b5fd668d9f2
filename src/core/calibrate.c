/*
 * The tuner's constants, measured once when a communicator starts: a few
 * small and one mid-sized AllReduce through the communicator's own links give
 * alpha (per message) and beta (per byte moved), a local reduction gives
 * gamma (per byte reduced). Every rank then takes the slowest rank's figures,
 * so that all of them pick the same algorithms. HCCL_COST_MODEL skips this
 * and sets the constants instead; so does HCCL_CALIBRATE=0 (the defaults of
 * the link class then apply).
 */
#include <math.h>
#include <string.h>
#include <time.h>

#include "core/comm.h"
#include "sched/sched.h"

#define CAL_SMALL_REPS 7
#define CAL_BIG_BYTES (256u << 10)
#define CAL_BIG_REPS 3

static double now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* The fastest of reps runs of one AllReduce of bytes with algo: the least disturbed. */
static hcclResult_t time_allreduce(struct hcclComm *comm, hccl_algo_t algo, float *buf, size_t bytes,
                                   int reps, double *best_us)
{
    hccl_algo_t saved = comm->tuner.forced[HCCL_COLL_ALLREDUCE];
    hcclResult_t res = hcclSuccess;

    comm->tuner.forced[HCCL_COLL_ALLREDUCE] = algo;
    *best_us = INFINITY;
    for (int i = 0; i <= reps && res == hcclSuccess; i++) {
        double t0 = now_us();
        res = hcclAllReduce(buf, buf, bytes / sizeof(float), hcclFloat32, hcclMax, comm);
        if (i > 0) /* the first builds the plan and warms the links */
            *best_us = fmin(*best_us, now_us() - t0);
    }
    comm->tuner.forced[HCCL_COLL_ALLREDUCE] = saved;
    return res;
}

static double reduce_us_per_byte(float *a, float *b, size_t bytes)
{
    double best = INFINITY;

    for (int i = 0; i < 3; i++) {
        double t0 = now_us();
        hccl_reduce(a, a, b, bytes / sizeof(float), hcclFloat32, hcclSum);
        best = fmin(best, now_us() - t0);
    }
    return best / (double)bytes;
}

/* The coefficient of each constant in the model's estimate (the estimate is linear in them). */
static void coefficients(const struct hcclComm *comm, hccl_algo_t algo, size_t bytes, double k[3])
{
    static const hccl_cost_t unit[3] = {
        {1, 0, 0, false, false}, {0, 1, 0, false, false}, {0, 0, 1, false, false}};

    for (int i = 0; i < 3; i++)
        k[i] = hccl_cost_estimate(&unit[i], HCCL_COLL_ALLREDUCE, algo, bytes, comm->nranks,
                                  comm->tuner.chunk_bytes);
}

static double clamp(double v, double lo, double hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

hcclResult_t hccl_comm_calibrate(struct hcclComm *comm)
{
    hccl_cost_t m = comm->tuner.model;
    double small_us, big_us, k[3], agreed[3];
    float *buf;
    hcclResult_t res;

    if (comm->nranks < 2 || comm->params.cost_model[0] || !comm->params.calibrate)
        return hcclSuccess;
    buf = hccl_calloc(2, CAL_BIG_BYTES);
    if (!buf)
        return HCCL_FAIL(hcclSystemError, "calibration: out of memory");
    res = time_allreduce(comm, HCCL_ALGO_RECDBL, buf, 8, CAL_SMALL_REPS, &small_us);
    if (res == hcclSuccess)
        res = time_allreduce(comm, HCCL_ALGO_RING, buf, CAL_BIG_BYTES, CAL_BIG_REPS, &big_us);
    if (res == hcclSuccess) {
        agreed[0] = small_us;
        agreed[1] = big_us;
        agreed[2] = reduce_us_per_byte(buf, buf + CAL_BIG_BYTES / sizeof(float), CAL_BIG_BYTES);
        res = hcclAllReduce(agreed, agreed, 3, hcclFloat64, hcclMax, comm);
    }
    hccl_free(buf);
    if (res != hcclSuccess)
        return res;
    /* Bounds keep one disturbed measurement from making the model absurd. */
    m.gamma_us_per_byte = clamp(agreed[2], 1.0 / 100000, 1.0 / 100);
    coefficients(comm, HCCL_ALGO_RECDBL, 8, k);
    m.alpha_us = clamp(agreed[0] / k[0], 0.05, 1000);
    coefficients(comm, HCCL_ALGO_RING, CAL_BIG_BYTES, k);
    m.beta_us_per_byte =
        clamp((agreed[1] - m.alpha_us * k[0] - m.gamma_us_per_byte * k[2]) / k[1], 1.0 / 100000, 1.0 / 50);
    comm->tuner.model = m;
    comm->model_measured = true;
    HCCL_INFO(HCCL_SUB_ALGO, "rank %d: measured %s model: alpha %.2f us, %.2f GB/s on the wire, "
              "%.2f GB/s reduced (8 B AllReduce %.1f us, %u KiB %.1f us)", comm->rank,
              comm->tuner.cls == HCCL_COST_TCP ? "tcp" : "shm", m.alpha_us,
              1e-3 / m.beta_us_per_byte, 1e-3 / m.gamma_us_per_byte, agreed[0], CAL_BIG_BYTES >> 10,
              agreed[1]);
    return hcclSuccess;
}
