/*
 * common.h - what the peer benchmarks (mpi_perf.c, gloo_perf.cc) share with
 * each other and, by convention, with tools/hccl-perf: the command line,
 * the size list, the busbw factors, the data pattern and the CSV row.
 *
 * Conventions are nccl-tests' (so the rows line up with hccl-perf's):
 *   size   allreduce/broadcast/reduce: the buffer; allgather: the gathered
 *          output; reducescatter: the input; alltoall: one rank's send
 *          buffer; rounded down to whole floats per rank (a size that
 *          leaves a rank no float is skipped; hccl-perf prints it as 0 B).
 *   algbw  size / time, busbw = algbw * factor:
 *          allreduce 2(n-1)/n; allgather, reducescatter, alltoall (n-1)/n;
 *          broadcast, reduce 1.
 *   time   per call: each rank times its loop of back-to-back calls, the
 *          mean over ranks is reported (as nccl-tests and hccl-perf do).
 *   iters  one checked call first (slower than -G s: reported alone, and the
 *          larger sizes of that collective skipped), warm-up calls (see
 *          warmups()), then with -T runs of 1, 2, 4, ... calls until one
 *          lasts a 16th of T (sized_enough()), whose rate on the slowest rank
 *          gives the count of timed calls that fills T seconds (at least 2),
 *          as hccl-perf sizes them; else -n.
 */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { ALLREDUCE, BROADCAST, REDUCE, ALLGATHER, REDUCESCATTER, ALLTOALL, NCOLL };

static const char *const coll_name[NCOLL] = {"allreduce", "broadcast",     "reduce",
                                             "allgather", "reducescatter", "alltoall"};

/* Options: the subset of hccl-perf's flags that the peers need, same letters. */
struct opts {
    int coll[NCOLL], ncoll; /* -C allreduce,broadcast,... or all        */
    size_t minb, maxb;      /* -b, -e (K/M/G suffixes)                   */
    double factor;          /* -f                                        */
    int iters, warm;        /* -n, -w                                    */
    int check;              /* -c 0|1                                    */
    int root;               /* -r (broadcast, reduce)                    */
    double budget;          /* -T seconds of timed calls per size, 0: -n */
    double guard;           /* -G: a first call slower than this ends the
                               collective's sweep (peers only: oversubscribed
                               peers can need seconds per call)          */
    int csv;                /* --csv                                     */
    int blocking;           /* -z 1 blocking calls (default); 0: the
                               non-blocking form + wait (MPI_I*, where the
                               library has one)                          */
};

static size_t parse_bytes(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024.0; break;
    case 'm': case 'M': v *= 1024.0 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    }
    return v > 0 ? (size_t)v : 0;
}

static int coll_from_name(const char *s)
{
    for (int i = 0; i < NCOLL; i++)
        if (strcmp(s, coll_name[i]) == 0)
            return i;
    return -1;
}

/* Returns NULL or an error text for the caller to print on rank 0. */
static const char *parse_opts(int argc, char **argv, struct opts *o)
{
    static const struct option lo[] = {{"csv", no_argument, NULL, 'S'}, {NULL, 0, NULL, 0}};
    const char *colls = "all";
    int c;
    memset(o, 0, sizeof *o);
    o->minb = 8, o->maxb = 256u << 20, o->factor = 2, o->iters = 20, o->warm = 5, o->check = 1, o->guard = 5;
    o->blocking = 1;
    while ((c = getopt_long(argc, argv, "C:b:e:f:n:w:c:d:o:r:T:G:z:", lo, NULL)) != -1) {
        switch (c) {
        case 'C': colls = optarg; break;
        case 'b': o->minb = parse_bytes(optarg); break;
        case 'e': o->maxb = parse_bytes(optarg); break;
        case 'f': o->factor = atof(optarg); break;
        case 'n': o->iters = atoi(optarg); break;
        case 'w': o->warm = atoi(optarg); break;
        case 'c': o->check = atoi(optarg); break;
        case 'd': if (strcmp(optarg, "float32") && strcmp(optarg, "float")) return "only -d float32"; break;
        case 'o': if (strcmp(optarg, "sum")) return "only -o sum"; break;
        case 'r': o->root = atoi(optarg); break;
        case 'T': o->budget = atof(optarg); break;
        case 'G': o->guard = atof(optarg); break;
        case 'S': o->csv = 1; break;
        case 'z': o->blocking = atoi(optarg) != 0; break;
        default: return "usage: -C colls -b min -e max -f factor -n iters -w warm -c 0|1 "
                        "-r root -T secs -G secs -z 0|1 --csv";
        }
    }
    if (o->minb < 1 || o->maxb < o->minb || o->factor <= 1 || o->iters < 1 || o->warm < 0)
        return "bad -b/-e/-f/-n/-w";
    char buf[256];
    snprintf(buf, sizeof buf, "%s", strcmp(colls, "all") ? colls : "allreduce,broadcast,reduce,"
                                                                   "allgather,reducescatter,alltoall");
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int k = coll_from_name(t);
        if (k < 0)
            return "unknown collective";
        if (o->ncoll == NCOLL)
            return "too many collectives";
        o->coll[o->ncoll++] = k;
    }
    return NULL;
}

static double busbw_factor(int coll, int n)
{
    switch (coll) {
    case ALLREDUCE: return 2.0 * (n - 1) / n;
    case ALLGATHER: case REDUCESCATTER: case ALLTOALL: return (double)(n - 1) / n;
    default: return 1.0;
    }
}

/* Elements per rank block ("chunk", the count the API call takes) for a
 * requested size: the whole buffer for allreduce/broadcast/reduce, size/4/n
 * for the others, rounded down as hccl-perf does; 0 (size skipped) when a
 * rank would get no element. */
static size_t chunk_elems(int coll, size_t bytes, int n)
{
    size_t e = bytes / sizeof(float);
    return coll == ALLREDUCE || coll == BROADCAST || coll == REDUCE ? e : e / (size_t)n;
}
/* Per-rank send and receive element counts for a chunk. */
static void buf_elems(int coll, size_t chunk, int n, size_t *se, size_t *re)
{
    switch (coll) {
    case ALLGATHER: *se = chunk, *re = chunk * n; break;
    case REDUCESCATTER: *se = chunk * n, *re = chunk; break;
    case ALLTOALL: *se = *re = chunk * n; break;
    default: *se = *re = chunk; break; /* allreduce, broadcast, reduce */
    }
}

/* The value rank r contributes at global index i: small integers, so sums
 * over ranks are exact in float32 whatever the order; depends on rank and
 * index so that misplaced blocks show. */
static inline float val(int r, size_t i) { return (float)((i * 7u + (size_t)r * 13u) % 61u + 1u + (unsigned)r); }
static inline float sum_val(int n, size_t i)
{
    float s = 0;
    for (int r = 0; r < n; r++)
        s += val(r, i);
    return s;
}

/* Fill the send buffer (the receive buffer for broadcast's root) and put a
 * sentinel in the receive buffer. */
static void fill(int coll, int me, int n, int root, size_t chunk, float *s, float *r)
{
    size_t se, re, i;
    buf_elems(coll, chunk, n, &se, &re);
    for (i = 0; i < re; i++)
        r[i] = -1.0f;
    for (i = 0; i < se; i++)
        s[i] = val(me, coll == ALLGATHER ? (size_t)me * chunk + i : i);
    if (coll == BROADCAST && me == root)
        for (i = 0; i < re; i++)
            r[i] = val(root, i);
}

/* Count wrong output elements.  Sums go through a 61-entry table: val()
 * repeats with period 61 in i. */
static long check(int coll, int me, int n, int root, size_t chunk, const float *r)
{
    size_t se, re, i;
    float tab[61];
    long bad = 0;
    buf_elems(coll, chunk, n, &se, &re);
    for (i = 0; i < 61; i++)
        tab[i] = sum_val(n, i);
    switch (coll) {
    case ALLREDUCE: for (i = 0; i < re; i++) bad += r[i] != tab[i % 61]; break;
    case REDUCE: if (me == root) for (i = 0; i < re; i++) bad += r[i] != tab[i % 61]; break;
    case REDUCESCATTER: for (i = 0; i < re; i++) bad += r[i] != tab[((size_t)me * chunk + i) % 61]; break;
    case BROADCAST: for (i = 0; i < re; i++) bad += r[i] != val(root, i); break;
    case ALLGATHER: for (i = 0; i < re; i++) bad += r[i] != val((int)(i / chunk), i); break;
    case ALLTOALL:
        for (i = 0; i < re; i++)
            bad += r[i] != val((int)(i / chunk), (size_t)me * chunk + i % chunk);
        break;
    }
    return bad;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Timed calls for a size: -n, or with -T as many calls of est_s seconds
 * (the slowest rank's) as fill T seconds, at least 2 (hccl-perf's rule). */
static int timed_iters(const struct opts *o, double est_s)
{
    if (o->budget <= 0)
        return o->iters;
    double want = o->budget / (est_s > 1e-9 ? est_s : 1e-9);
    return want < 2 ? 2 : want > 100000 ? 100000 : (int)want;
}

/* Warm-up calls after a first call of first_s seconds: -w, but with -T only
 * one when -w of them would take longer than T. */
static int warmups(const struct opts *o, double first_s)
{
    if (o->budget > 0 && o->warm > 1 && o->warm * first_s > o->budget)
        return 1;
    return o->warm;
}

/* With -T: a sizing run of n calls that took spent_s on the slowest rank is
 * long enough (a 16th of T; one call was too short a sample where ranks
 * share cores, as a rank descheduled in it cut the count tenfold). */
static int sized_enough(const struct opts *o, double spent_s, int n)
{
    return spent_s >= o->budget / 16 || n >= 100000;
}

#define CSV_HEADER "collective,size,count,type,redop,root,placement,time_us,algbw,busbw,wrong,nranks,algo\n"

static void print_row(const struct opts *o, int coll, size_t chunk, int n, double t_us, long wrong,
                      const char *algo)
{
    size_t se, re, bytes;
    buf_elems(coll, chunk, n, &se, &re);
    bytes = (coll == REDUCESCATTER || coll == ALLTOALL ? se : re) * sizeof(float);
    double algbw = (double)bytes / (t_us * 1e-6) / 1e9, busbw = algbw * busbw_factor(coll, n);
    int rooted = coll == BROADCAST || coll == REDUCE;
    const char *redop = coll == ALLREDUCE || coll == REDUCE || coll == REDUCESCATTER ? "sum" : "none";
    if (!o->check)
        wrong = -1; /* not checked, as hccl-perf says it */
    /* The peers measure one placement: out of place, except broadcast, which
     * has one buffer and is "ip" as in hccl-perf (the legacy Gloo
     * reduce-scatter works in place too, but stands in for the oop form). */
    if (o->csv)
        printf("%s,%zu,%zu,float,%s,%d,%s,%.3f,%.4f,%.4f,%ld,%d,%s\n", coll_name[coll], bytes, chunk, redop,
               rooted ? o->root : -1, coll == BROADCAST ? "ip" : "oop", t_us, algbw, busbw, wrong, n, algo);
    else
        printf("%-14s %12zu %11.2f %9.3f %9.3f %6ld  %s\n", coll_name[coll], bytes, t_us, algbw, busbw, wrong,
               algo);
    fflush(stdout);
}

static void print_header(const struct opts *o)
{
    if (o->csv)
        fputs(CSV_HEADER, stdout);
    else
        printf("%-14s %12s %11s %9s %9s %6s  %s\n", "# collective", "size(B)", "time(us)", "algbw", "busbw",
               "wrong", "algo");
}

#endif
