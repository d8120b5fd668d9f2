/*
 * The workload of bench/soak.sh (and of the short soak in ctest): random collectives, sizes,
 * dtypes, ops, roots, blocking or several in flight, on the world communicator and on split
 * ones, every result checked element by element.
 *
 *   mp_soak --seed S --iters N [--fault] [--split-every K] [--shrink-out R]
 *
 * Every rank draws the same choices from the same seed; each rank's data is a function of
 * (rank, collective, element), so each rank computes what it must receive on its own. Small
 * integer values keep every dtype and op exact (avg within the rounding of its division).
 * With --fault the script injected an HCCL_FAULT: a call may then fail, after which the rank
 * aborts its communicator and ends; with --shrink-out R (the script killed rank R) the others
 * first shrink it out (hcclCommShrink) and run more collectives on the new communicator. The
 * last line of each rank is its verdict:
 *   SOAK rank R ok|error|wrong colls C faultless|CODE fds A B threads A B rss_kib A B
 *        shrink none|ok|FAILED
 * (A before the communicator was made, B after it was destroyed) followed by the message of
 * the first error. The exit status is 0 unless a result was wrong or an error came without
 * --fault.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hccl.h"
#include "soak_data.h"

#define SOAK_MAX_BYTES (1u << 20) /* per buffer: sizes are drawn log-uniformly up to this */
#define SOAK_MAX_INFLIGHT 4

struct soak {
    uint64_t rng;
    long colls; /* the next collective's id, which seeds its data: the same on every rank */
    long ran;   /* collectives this rank finished */
    long wrong;
    hcclResult_t err;
    char msg[512];
    int fault;
};

static uint64_t draw(struct soak *s)
{
    s->rng ^= s->rng << 13;
    s->rng ^= s->rng >> 7;
    s->rng ^= s->rng << 17;
    return s->rng;
}

static int draw_below(struct soak *s, int n)
{
    return (int)(draw(s) % (uint64_t)n);
}

static int count_dir(const char *path)
{
    DIR *d = opendir(path);
    int n = 0;

    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static long rss_kib(void)
{
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");

    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

/* One planned collective: what it is and its buffers. */
struct op {
    soak_coll_t coll;
    hcclDataType_t dt;
    hcclRedOp_t redop;
    size_t count; /* as the API takes it: per rank for allgather/reducescatter/alltoall */
    int root;
    int in_place;
    long id; /* seeds the data */
    void *in, *out;
    size_t in_elems, out_elems;
    hcclRequest_t req;
};

static void plan_op(struct soak *s, struct op *o, int nranks)
{
    static const hcclDataType_t dts[] = {hcclInt8,    hcclUint8,  hcclInt32,   hcclUint32,
                                         hcclInt64,   hcclUint64, hcclFloat16, hcclBfloat16,
                                         hcclFloat32, hcclFloat64};
    size_t esz, max_elems;
    int shift;

    memset(o, 0, sizeof(*o));
    o->coll = (soak_coll_t)draw_below(s, SOAK_NCOLLS);
    o->dt = dts[draw_below(s, (int)(sizeof(dts) / sizeof(dts[0])))];
    o->redop = (hcclRedOp_t)draw_below(s, hcclNumOps);
    o->root = draw_below(s, nranks);
    o->in_place = draw_below(s, 4) == 0;
    o->id = s->colls++;
    esz = soak_dtype_size(o->dt);
    max_elems = SOAK_MAX_BYTES / esz / (size_t)nranks;
    shift = draw_below(s, 21);
    o->count = draw_below(s, 16) == 0 ? 0 : ((size_t)1 << shift) + (draw(s) % ((size_t)1 << shift));
    if (o->count > max_elems)
        o->count = max_elems;
}

static int alloc_op(struct op *o, int nranks)
{
    size_t esz = soak_dtype_size(o->dt), n = (size_t)nranks;

    switch (o->coll) {
    case SOAK_ALLGATHER:
        o->in_elems = o->count;
        o->out_elems = o->count * n;
        break;
    case SOAK_REDUCESCATTER:
        o->in_elems = o->count * n;
        o->out_elems = o->count;
        break;
    case SOAK_ALLTOALL:
        o->in_elems = o->out_elems = o->count * n;
        break;
    default:
        o->in_elems = o->out_elems = o->count;
    }
    o->in = malloc(o->in_elems * esz + 1);
    o->out = malloc(o->out_elems * esz + 1);
    return o->in && o->out ? 0 : -1;
}

static void free_op(struct op *o)
{
    free(o->in);
    free(o->out);
    o->in = o->out = NULL;
}

/* Issues o as an Async call (the request in o->req). */
static hcclResult_t issue(struct op *o, hcclComm_t comm, int rank, int nranks)
{
    void *out =
        o->in_place && (o->coll == SOAK_ALLREDUCE || o->coll == SOAK_REDUCE) ? o->in : o->out;

    soak_fill(o->in, o->in_elems, o->dt, o->redop, rank, o->id);
    memset(o->out, 0xa5, o->out_elems * soak_dtype_size(o->dt));
    switch (o->coll) {
    case SOAK_ALLREDUCE:
        return hcclAllReduceAsync(o->in, out, o->count, o->dt, o->redop, comm, &o->req);
    case SOAK_BROADCAST:
        return hcclBroadcastAsync(o->in, o->count, o->dt, o->root, comm, &o->req);
    case SOAK_REDUCE:
        return hcclReduceAsync(o->in, out, o->count, o->dt, o->redop, o->root, comm, &o->req);
    case SOAK_ALLGATHER:
        return hcclAllGatherAsync(o->in, o->out, o->count, o->dt, comm, &o->req);
    case SOAK_REDUCESCATTER:
        return hcclReduceScatterAsync(o->in, o->out, o->count, o->dt, o->redop, comm, &o->req);
    case SOAK_ALLTOALL:
        return hcclAlltoAllAsync(o->in, o->out, o->count, o->dt, comm, &o->req);
    case SOAK_BARRIER:
        return hcclBarrierAsync(comm, &o->req);
    default:
        (void)nranks;
        return hcclInvalidArgument;
    }
}

/* The element index of the first wrong element, or -1. */
static long check(const struct op *o, int rank, int nranks)
{
    const void *got =
        o->in_place && (o->coll == SOAK_ALLREDUCE || o->coll == SOAK_REDUCE) ? o->in : o->out;
    size_t n = (size_t)nranks;

    switch (o->coll) {
    case SOAK_ALLREDUCE:
        return soak_check_reduced(got, o->count, 0, o->dt, o->redop, nranks, o->id);
    case SOAK_REDUCE:
        return rank == o->root
                   ? soak_check_reduced(got, o->count, 0, o->dt, o->redop, nranks, o->id)
                   : -1;
    case SOAK_BROADCAST:
        return soak_check_from(o->in, o->count, 0, o->dt, o->redop, o->root, o->id);
    case SOAK_ALLGATHER:
        for (size_t r = 0; r < n; r++) {
            long bad = soak_check_from(soak_at(got, r * o->count, o->dt), o->count, 0, o->dt,
                                       o->redop, (int)r, o->id);
            if (bad >= 0)
                return (long)(r * o->count) + bad;
        }
        return -1;
    case SOAK_REDUCESCATTER:
        return soak_check_reduced(got, o->count, (size_t)rank * o->count, o->dt, o->redop, nranks,
                                  o->id);
    case SOAK_ALLTOALL:
        for (size_t r = 0; r < n; r++) {
            long bad = soak_check_from(soak_at(got, r * o->count, o->dt), o->count,
                                       (size_t)rank * o->count, o->dt, o->redop, (int)r, o->id);
            if (bad >= 0)
                return (long)(r * o->count) + bad;
        }
        return -1;
    default:
        return -1;
    }
}

/* A batch of 1..SOAK_MAX_INFLIGHT collectives in flight together, then each waited and checked.
 * Returns 0, or -1 after an error (recorded in s). */
static int run_batch(struct soak *s, hcclComm_t comm, int rank, int nranks, const char *where)
{
    struct op ops[SOAK_MAX_INFLIGHT];
    int n = 1 + (draw_below(s, 3) == 0 ? draw_below(s, SOAK_MAX_INFLIGHT) : 0), issued = 0, rc = 0;
    hcclResult_t res = hcclSuccess;

    for (int i = 0; i < n; i++) {
        plan_op(s, &ops[i], nranks);
        if (alloc_op(&ops[i], nranks) != 0) {
            fprintf(stderr, "rank %d: out of memory\n", rank);
            exit(2);
        }
    }
    for (; issued < n && res == hcclSuccess; issued++)
        res = issue(&ops[issued], comm, rank, nranks);
    if (res != hcclSuccess)
        issued--;
    for (int i = 0; i < issued; i++) {
        hcclResult_t w = hcclWait(&ops[i].req);
        long bad;

        if (w != hcclSuccess) {
            if (res == hcclSuccess)
                res = w;
            continue;
        }
        s->ran++;
        bad = check(&ops[i], rank, nranks);
        if (bad >= 0) {
            s->wrong++;
            printf("SOAK rank %d WRONG %s %s of %zu x %s op %d root %d%s (collective %ld): element "
                   "%ld\n",
                   rank, where, soak_coll_name(ops[i].coll), ops[i].count,
                   soak_dtype_name(ops[i].dt), (int)ops[i].redop, ops[i].root,
                   ops[i].in_place ? " in place" : "", ops[i].id, bad);
        }
    }
    if (res != hcclSuccess) {
        s->err = res;
        snprintf(s->msg, sizeof(s->msg), "%s: %s", where, hcclGetLastError(comm));
        rc = -1;
    }
    for (int i = 0; i < n; i++)
        free_op(&ops[i]);
    return rc;
}

/* A point-to-point ring: every rank sends to the next and receives from the previous. */
static int run_ring(struct soak *s, hcclComm_t comm, int rank, int nranks)
{
    size_t count = (size_t)draw_below(s, 1 << 16);
    long id = s->colls++;
    int8_t *out = malloc(count + 1), *in = malloc(count + 1);
    hcclRequest_t reqs[2];
    hcclResult_t res;
    int rc = 0;

    if (!out || !in)
        exit(2);
    soak_fill(out, count, hcclInt8, hcclSum, rank, id);
    res = hcclRecvAsync(in, count, hcclInt8, (rank + nranks - 1) % nranks, comm, &reqs[0]);
    if (res == hcclSuccess) {
        res = hcclSendAsync(out, count, hcclInt8, (rank + 1) % nranks, comm, &reqs[1]);
        if (res == hcclSuccess)
            res = hcclWaitAll(2, reqs);
        else
            (void)hcclWait(&reqs[0]);
    }
    if (res != hcclSuccess) {
        s->err = res;
        snprintf(s->msg, sizeof(s->msg), "send/recv: %s", hcclGetLastError(comm));
        rc = -1;
    } else if (s->ran++, soak_check_from(in, count, 0, hcclInt8, hcclSum,
                                         (rank + nranks - 1) % nranks, id) >= 0) {
        s->wrong++;
        printf("SOAK rank %d WRONG send/recv of %zu bytes (collective %ld)\n", rank, count, id);
    }
    free(out);
    free(in);
    return rc;
}

/* A few collectives on a communicator split by parity (same seed stream on every rank). */
static int run_split(struct soak *s, hcclComm_t comm, int rank, int nranks)
{
    hcclComm_t sub = NULL;
    hcclResult_t res = hcclCommSplit(comm, rank % 2, rank, &sub);
    int subrank = rank / 2, subn = (nranks - rank % 2 + 1) / 2, rc = 0;
    struct soak branch;

    if (res != hcclSuccess) {
        s->err = res;
        snprintf(s->msg, sizeof(s->msg), "split: %s", hcclGetLastError(comm));
        return -1;
    }
    /* Each half draws from its own stream, so both halves stay in step among themselves. */
    branch = *s;
    branch.rng = s->rng ^ (0x9e3779b97f4a7c15ull * (uint64_t)(rank % 2 + 1));
    for (int i = 0; i < 3 && rc == 0; i++)
        rc = run_batch(&branch, sub, subrank, subn, "split");
    /* The halves ran different numbers of collectives: ids go on from a common point. */
    s->colls += 1000;
    s->ran = branch.ran;
    s->wrong = branch.wrong;
    if (rc != 0) {
        s->err = branch.err;
        memcpy(s->msg, branch.msg, sizeof(s->msg));
        (void)hcclCommAbort(sub);
        return -1;
    }
    res = hcclCommDestroy(sub);
    if (res != hcclSuccess) {
        s->err = res;
        snprintf(s->msg, sizeof(s->msg), "destroying the split communicator failed");
        return -1;
    }
    return 0;
}

/* After rank out died: the survivors shrink it out and go on with collectives on the new
 * communicator, from a point every survivor agrees on (they failed at different ones). */
static int run_shrunk(struct soak *s, hcclComm_t comm, int out, long iters)
{
    hcclComm_t nc = NULL;
    hcclResult_t res = hcclCommShrink(comm, &out, 1, NULL, &nc);
    struct soak after = *s;
    int rank, nranks, rc = 0;

    if (res != hcclSuccess) {
        fprintf(stderr, "SOAK shrink failed: %s: %s\n", soak_result_name(res),
                hcclGetLastError(comm));
        return -1;
    }
    hcclCommUserRank(nc, &rank);
    hcclCommCount(nc, &nranks);
    after.rng = 0x2545f4914f6cdd1dull ^ (uint64_t)iters;
    after.colls = 1000000;
    after.err = hcclSuccess;
    for (long it = 0; it < 10 && rc == 0; it++)
        rc = run_batch(&after, nc, rank, nranks, "shrunk");
    s->ran = after.ran;
    s->wrong = after.wrong;
    if (rc != 0) {
        fprintf(stderr, "SOAK after the shrink: %s\n", after.msg);
        (void)hcclCommAbort(nc);
        return -1;
    }
    return hcclCommDestroy(nc) == hcclSuccess ? 0 : -1;
}

int main(int argc, char **argv)
{
    struct soak s = {.rng = 1};
    long iters = 100, split_every = 25;
    int rank = -1, nranks = 0, rc = 0, fds0, thr0, fds1, thr1, shrink_out = -1;
    const char *shrink = "none";
    long rss0, rss1;
    hcclComm_t comm = NULL;
    hcclResult_t res;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            s.rng = strtoull(argv[++i], NULL, 0) | 1;
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atol(argv[++i]);
        else if (!strcmp(argv[i], "--split-every") && i + 1 < argc)
            split_every = atol(argv[++i]);
        else if (!strcmp(argv[i], "--fault"))
            s.fault = 1;
        else if (!strcmp(argv[i], "--shrink-out") && i + 1 < argc)
            shrink_out = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: mp_soak --seed S --iters N [--fault] [--split-every K] "
                            "[--shrink-out R]\n");
            return 2;
        }
    }
    fds0 = count_dir("/proc/self/fd");
    thr0 = count_dir("/proc/self/task");
    rss0 = rss_kib();
    res = hcclCommInitFromEnv(&comm);
    if (res != hcclSuccess) {
        s.err = res;
        snprintf(s.msg, sizeof(s.msg), "init: %s", hcclGetLastError(NULL));
        comm = NULL;
    } else {
        hcclCommUserRank(comm, &rank);
        hcclCommCount(comm, &nranks);
        /* The fault is the world communicator's: split and shrunk ones, which read the variable
         * again when they are made, must not fire it at whoever has that rank there. */
        unsetenv("HCCL_FAULT");
        for (long it = 0; it < iters; it++) {
            int r;

            if (split_every > 0 && nranks >= 4 && it % split_every == split_every - 1)
                r = run_split(&s, comm, rank, nranks);
            else if (draw_below(&s, 8) == 0)
                r = run_ring(&s, comm, rank, nranks);
            else
                r = run_batch(&s, comm, rank, nranks, "world");
            if (r != 0)
                break;
        }
        if (s.err != hcclSuccess) {
            hcclResult_t async = hcclSuccess;

            (void)hcclCommGetAsyncError(comm, &async);
            if (shrink_out >= 0 && shrink_out != rank)
                shrink = run_shrunk(&s, comm, shrink_out, iters) == 0 ? "ok" : "FAILED";
            (void)hcclCommAbort(comm);
        } else if (hcclCommDestroy(comm) != hcclSuccess) {
            s.err = hcclInternalError;
            snprintf(s.msg, sizeof(s.msg), "destroy failed");
        }
    }
    /* After a failure, a bootstrap root (rank 0, or a split's first rank) keeps its listener to
     * tell late ranks the cause, up to the connect timeout when a rank that was to come died:
     * what is left is counted once that may have passed (the soak sets a short one). */
    for (int i = 0; i < 240; i++) {
        struct timespec tick = {0, 50 * 1000 * 1000};

        fds1 = count_dir("/proc/self/fd");
        thr1 = count_dir("/proc/self/task");
        if ((fds1 == fds0 && thr1 == thr0) || s.err == hcclSuccess)
            break;
        nanosleep(&tick, NULL);
    }
    rss1 = rss_kib();
    if (rank < 0) {
        const char *env = getenv("RANK");
        rank = env ? atoi(env) : -1;
    }
    printf("SOAK rank %d %s colls %ld %s fds %d %d threads %d %d rss_kib %ld %ld shrink %s%s%s\n",
           rank,
           s.wrong                ? "wrong"
           : s.err != hcclSuccess ? "error"
                                  : "ok",
           s.ran, s.err != hcclSuccess ? soak_result_name(s.err) : "faultless", fds0, fds1, thr0,
           thr1, rss0, rss1, shrink, s.err != hcclSuccess ? " :: " : "",
           s.err != hcclSuccess ? s.msg : "");
    fflush(stdout);
    if (s.wrong || (s.err != hcclSuccess && !s.fault) || !strcmp(shrink, "FAILED"))
        rc = 1;
    return rc;
}
