/*
 * hccl-perf's common part, as nccl-tests' common.cu: options, the test data and its
 * checking, and the report. hccl-perf.c has the collective calls and the timing loop.
 */
#ifndef HCCL_PERF_COMMON_H
#define HCCL_PERF_COMMON_H

#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hccl.h"

#define PERF_MAX_SIZES 256
#define PERF_MAX_INFLIGHT 64

enum perf_coll {
    C_ALLREDUCE,
    C_BROADCAST,
    C_REDUCE,
    C_ALLGATHER,
    C_REDUCESCATTER,
    C_ALLTOALL,
    C_NCOLL
};

extern const char *const coll_names[C_NCOLL];

typedef struct {
    const char *name; /* as nccl-tests prints it */
    const char *alias;
    hcclDataType_t dtype;
    size_t size;
} dtype_info_t;

extern const dtype_info_t dtypes[10];
extern const char *const op_names[5];

typedef struct {
    int colls[C_NCOLL], ncolls;
    size_t min_bytes, max_bytes, step_bytes;
    size_t list[PERF_MAX_SIZES]; /* -s: these sizes instead of -b/-e/-f */
    int nlist;
    double factor;
    int iters, warmup, check, blocking, inflight, root;
    double time_budget; /* seconds per size and placement; 0: use iters */
    const dtype_info_t *dt;
    hcclRedOp_t op;
    const char *algo;
    int csv, json;
    int placements; /* bit 0 out-of-place, bit 1 in-place */
} opts_t;

typedef struct {
    hcclComm_t comm;
    int rank, n;
    const opts_t *o;
    char *send[PERF_MAX_INFLIGHT], *recv[PERF_MAX_INFLIGHT];
    size_t cap; /* bytes of each buffer */
    double bw_sum;
    int bw_rows;
    long long wrong_total;
    int json_rows;
} perf_t;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        hcclResult_t r_ = (call);                                                                  \
        if (r_ != hcclSuccess) {                                                                   \
            fprintf(stderr, "hccl-perf: %s failed: %s: %s\n", #call, hcclGetErrorString(r_),       \
                    hcclGetLastError(NULL));                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* The expected values repeat with period lcm(3, 5, n), which divides 15 n. */
typedef struct {
    double *v;
    size_t period;
} expect_t;

typedef struct {
    double time_us, algbw, busbw;
    long long wrong;
} result_t;

/* Monotonic seconds. */
double now_s(void);
/* Element i of buf, every dtype through double (the test values are small integers). */
void put(void *buf, hcclDataType_t dt, size_t i, double v);
double get(const void *buf, hcclDataType_t dt, size_t i);
/*
 * Rank r's input element at global index i. Small integers, so that every
 * reduction over up to ~40 ranks is exact in every dtype; the product has one
 * factor 2 per element, so it is 2 whatever the rank count.
 */
double input_value(hcclRedOp_t op, int n, int r, size_t i);
/* Data-movement collectives: the value of element k of block b sent by rank r. */
double moved_value(int r, int b, size_t k);
/* Elements of buf (global indices first..) that differ from the expected reduction. */
long long count_wrong(const void *buf, hcclDataType_t dt, size_t count, size_t first,
                      const expect_t *e);
/* The expected reduction of every element, for o's op and dtype over n ranks (-1: no memory). */
int expect_init(expect_t *e, const opts_t *o, int n);
/* Sum (or max) of one double over the ranks. */
double across(perf_t *p, double v, hcclRedOp_t op);
/* The report: a table header (none for --csv or --json), then one row per size and placement. */
void print_header(const perf_t *p, int coll);
/* Whether coll has a root; whether it reduces. */
int rooted(int coll);
int reducing(int coll);
void emit_row(perf_t *p, int coll, int in_place, size_t bytes, size_t count, const result_t *r);
/* The command line into o (exits on -h); -1 with a message on a bad one. */
int parse_opts(int argc, char **argv, opts_t *o);

#endif /* HCCL_PERF_COMMON_H */
