/*
 * hccl-perf: collective bandwidth and latency, measured and reported the way
 * nccl-tests does, so that its tables read side by side with theirs.
 *
 *   hccl-run -n 4 hccl-perf -C allreduce -b 8 -e 64M -f 2
 *   mpirun -np 4 -x HCCL_COMM_ID=host:port hccl-perf -C all -b 1K -e 1M -f 4 --csv
 *
 * Any launcher that hcclCommInitFromEnv understands works (hccl-run, torchrun,
 * Open MPI, MPICH/Hydra, Slurm). Times are averaged over the ranks; algbw is
 * size / time and busbw scales it by what each rank's links must carry
 * (nccl-tests' factors), which makes figures comparable across rank counts.
 */
#include "perf_common.h"

/* ---- one collective call ---- */

typedef struct {
    size_t count;      /* elements the API call takes */
    size_t send_elems; /* elements each rank's send buffer holds */
    size_t recv_elems;
} shape_t;

static shape_t shape_of(int coll, size_t bytes, size_t es, int n)
{
    size_t total = bytes / es, per = total / (size_t)n;
    shape_t s = {total, total, total};

    switch (coll) {
    case C_ALLGATHER:
        s = (shape_t){per, per, per * (size_t)n};
        break;
    case C_REDUCESCATTER:
        s = (shape_t){per, per * (size_t)n, per};
        break;
    case C_ALLTOALL:
        s = (shape_t){per, per * (size_t)n, per * (size_t)n};
        break;
    default:
        break;
    }
    return s;
}

static double bus_factor(int coll, int n)
{
    switch (coll) {
    case C_ALLREDUCE:
        return 2.0 * (n - 1) / n;
    case C_ALLGATHER:
    case C_REDUCESCATTER:
    case C_ALLTOALL:
        return (double)(n - 1) / n;
    default:
        return 1.0;
    }
}

/* Where the call reads and writes for buffer set k; in place per the API's rules (docs/api.md). */
static void buffers(perf_t *p, int coll, int in_place, const shape_t *s, int k, void **sb,
                    void **rb)
{
    size_t es = p->o->dt->size;

    *sb = p->send[k];
    *rb = p->recv[k];
    if (!in_place)
        return;
    switch (coll) {
    case C_ALLGATHER:
        *sb = p->recv[k] + (size_t)p->rank * s->count * es;
        break;
    case C_REDUCESCATTER:
        *rb = p->send[k] + (size_t)p->rank * s->count * es;
        break;
    default:
        *rb = *sb = p->recv[k];
        break;
    }
}

static hcclResult_t post(perf_t *p, int coll, void *sb, void *rb, const shape_t *s,
                         hcclRequest_t *req)
{
    const opts_t *o = p->o;
    hcclDataType_t dt = o->dt->dtype;
    hcclComm_t c = p->comm;

    if (o->blocking) {
        *req = NULL;
        switch (coll) {
        case C_ALLREDUCE:
            return hcclAllReduce(sb, rb, s->count, dt, o->op, c);
        case C_BROADCAST:
            return hcclBroadcast(rb, s->count, dt, o->root, c);
        case C_REDUCE:
            return hcclReduce(sb, rb, s->count, dt, o->op, o->root, c);
        case C_ALLGATHER:
            return hcclAllGather(sb, rb, s->count, dt, c);
        case C_REDUCESCATTER:
            return hcclReduceScatter(sb, rb, s->count, dt, o->op, c);
        default:
            return hcclAlltoAll(sb, rb, s->count, dt, c);
        }
    }
    switch (coll) {
    case C_ALLREDUCE:
        return hcclAllReduceAsync(sb, rb, s->count, dt, o->op, c, req);
    case C_BROADCAST:
        return hcclBroadcastAsync(rb, s->count, dt, o->root, c, req);
    case C_REDUCE:
        return hcclReduceAsync(sb, rb, s->count, dt, o->op, o->root, c, req);
    case C_ALLGATHER:
        return hcclAllGatherAsync(sb, rb, s->count, dt, c, req);
    case C_REDUCESCATTER:
        return hcclReduceScatterAsync(sb, rb, s->count, dt, o->op, c, req);
    default:
        return hcclAlltoAllAsync(sb, rb, s->count, dt, c, req);
    }
}

/* One iteration: inflight collectives posted together, then all waited for. */
static void iterate(perf_t *p, int coll, int in_place, const shape_t *s)
{
    hcclRequest_t reqs[PERF_MAX_INFLIGHT];
    int k;

    for (k = 0; k < p->o->inflight; k++) {
        void *sb, *rb;
        buffers(p, coll, in_place, s, k, &sb, &rb);
        CHECK(post(p, coll, sb, rb, s, &reqs[k]));
    }
    CHECK(hcclWaitAll(p->o->inflight, reqs));
}

/* Fills buffer set k with this rank's inputs for coll. */
static void fill(perf_t *p, int coll, int in_place, const shape_t *s, int k)
{
    hcclDataType_t dt = p->o->dt->dtype;
    void *sb, *rb;
    size_t i;

    buffers(p, coll, in_place, s, k, &sb, &rb);
    /* Out of place, what an earlier call left in the receive buffer must not pass the check. */
    if (!in_place && coll != C_BROADCAST)
        memset(rb, 0xa5, s->recv_elems * p->o->dt->size);
    switch (coll) {
    case C_ALLREDUCE:
    case C_REDUCE:
        for (i = 0; i < s->count; i++)
            put(sb, dt, i, input_value(p->o->op, p->n, p->rank, i));
        break;
    case C_REDUCESCATTER:
        for (i = 0; i < s->send_elems; i++)
            put(sb, dt, i, input_value(p->o->op, p->n, p->rank, i));
        break;
    case C_BROADCAST:
        for (i = 0; i < s->count; i++)
            put(rb, dt, i, p->rank == p->o->root ? moved_value(p->rank, 0, i) : 99.0);
        break;
    case C_ALLGATHER:
        for (i = 0; i < s->count; i++)
            put(sb, dt, i, moved_value(p->rank, 0, i));
        break;
    default:
        for (int b = 0; b < p->n; b++)
            for (i = 0; i < s->count; i++)
                put(sb, dt, (size_t)b * s->count + i, moved_value(p->rank, b, i));
        break;
    }
}

static long long check_result(perf_t *p, int coll, int in_place, const shape_t *s, int k,
                              const expect_t *e)
{
    hcclDataType_t dt = p->o->dt->dtype;
    size_t es = p->o->dt->size;
    long long wrong = 0;
    void *sb, *rb;
    size_t i;

    buffers(p, coll, in_place, s, k, &sb, &rb);
    switch (coll) {
    case C_ALLREDUCE:
        return count_wrong(rb, dt, s->count, 0, e);
    case C_REDUCE:
        return p->rank == p->o->root ? count_wrong(rb, dt, s->count, 0, e) : 0;
    case C_REDUCESCATTER:
        return count_wrong(rb, dt, s->count, (size_t)p->rank * s->count, e);
    case C_BROADCAST:
        for (i = 0; i < s->count; i++)
            wrong += get(rb, dt, i) != moved_value(p->o->root, 0, i);
        return wrong;
    case C_ALLGATHER:
        for (int b = 0; b < p->n; b++)
            for (i = 0; i < s->count; i++)
                wrong += get((char *)rb + (size_t)b * s->count * es, dt, i) != moved_value(b, 0, i);
        return wrong;
    default:
        for (int b = 0; b < p->n; b++)
            for (i = 0; i < s->count; i++)
                wrong += get((char *)rb + (size_t)b * s->count * es, dt, i) !=
                         moved_value(b, p->rank, i);
        return wrong;
    }
}

static result_t measure(perf_t *p, int coll, int in_place, size_t bytes, const expect_t *e)
{
    const opts_t *o = p->o;
    shape_t s = shape_of(coll, bytes, o->dt->size, p->n);
    size_t real_bytes = (coll == C_ALLGATHER || coll == C_REDUCESCATTER || coll == C_ALLTOALL
                             ? s.count * (size_t)p->n
                             : s.count) *
                        o->dt->size;
    result_t r;
    int iters = o->iters;
    double t0;

    memset(&r, 0, sizeof(r));
    for (int k = 0; k < o->inflight; k++)
        fill(p, coll, in_place, &s, k);
    for (int w = 0; w < o->warmup; w++)
        iterate(p, coll, in_place, &s);
    if (o->time_budget > 0) {
        /* Every rank must run the same number of iterations: size them on the slowest, over
         * runs that double until one lasts a 16th of the budget. One iteration is too short a
         * sample where ranks share cores: whether a rank was descheduled in it sets the count. */
        double spent;
        int n = 1;
        for (;;) {
            CHECK(hcclBarrier(p->comm));
            t0 = now_s();
            for (int it = 0; it < n; it++)
                iterate(p, coll, in_place, &s);
            spent = across(p, now_s() - t0, hcclMax);
            if (spent >= o->time_budget / 16 || n >= 100000)
                break;
            n *= 2;
        }
        double one = spent / n;
        iters = (int)(o->time_budget / (one > 1e-9 ? one : 1e-9));
        iters = iters < 2 ? 2 : iters > 100000 ? 100000 : iters;
    }
    CHECK(hcclBarrier(p->comm));
    t0 = now_s();
    for (int it = 0; it < iters; it++)
        iterate(p, coll, in_place, &s);
    r.time_us = across(p, now_s() - t0, hcclSum) / p->n / iters / o->inflight * 1e6;
    if (o->check) {
        /* In place, the timed iterations reduced the results again: start over for the check. */
        for (int k = 0; k < o->inflight; k++)
            fill(p, coll, in_place, &s, k);
        iterate(p, coll, in_place, &s);
        for (int k = 0; k < o->inflight; k++)
            r.wrong += check_result(p, coll, in_place, &s, k, e);
        r.wrong = (long long)across(p, (double)r.wrong, hcclSum);
    }
    r.algbw = r.time_us > 0 ? (double)real_bytes / r.time_us / 1e3 : 0;
    r.busbw = r.algbw * bus_factor(coll, p->n);
    return r;
}

static void run_coll(perf_t *p, int coll)
{
    const opts_t *o = p->o;
    size_t es = o->dt->size;
    expect_t e;

    if (expect_init(&e, o, p->n) != 0) {
        fprintf(stderr, "hccl-perf: out of memory\n");
        exit(1);
    }
    if (p->rank == 0)
        print_header(p, coll);
    for (size_t bytes = o->nlist ? o->list[0] : o->min_bytes, next = 1;
         o->nlist ? next <= (size_t)o->nlist : bytes <= o->max_bytes;) {
        shape_t s = shape_of(coll, bytes, es, p->n);
        size_t shown = (coll == C_ALLGATHER || coll == C_REDUCESCATTER || coll == C_ALLTOALL
                            ? s.count * (size_t)p->n
                            : s.count) *
                       es;
        /* Broadcast has one buffer in this API: it is always in place. */
        int want_oop = (o->placements & 1) && coll != C_BROADCAST;
        int want_ip = ((o->placements & 2) && coll != C_ALLTOALL) || coll == C_BROADCAST;
        result_t res[2];

        memset(res, 0, sizeof(res));

        if (want_oop)
            res[0] = measure(p, coll, 0, bytes, &e);
        if (want_ip)
            res[1] = measure(p, coll, 1, bytes, &e);
        if (p->rank == 0) {
            if (!o->csv && !o->json) {
                printf("  %10zu %12zu %8s %6s %5d ", shown, s.count, o->dt->name,
                       reducing(coll) ? op_names[o->op] : "none", rooted(coll) ? o->root : -1);
                for (int ip = 0; ip < 2; ip++) {
                    if ((ip ? want_ip : want_oop) == 0)
                        printf(" %9s %7s %7s %6s  ", "-", "-", "-", "-");
                    else if (o->check)
                        printf(" %9.2f %7.3f %7.3f %6lld  ", res[ip].time_us, res[ip].algbw,
                               res[ip].busbw, res[ip].wrong);
                    else
                        printf(" %9.2f %7.3f %7.3f %6s  ", res[ip].time_us, res[ip].algbw,
                               res[ip].busbw, "N/A");
                }
                printf("\n");
                fflush(stdout);
            }
            for (int ip = 0; ip < 2; ip++)
                if (ip ? want_ip : want_oop)
                    emit_row(p, coll, ip, shown, s.count, &res[ip]);
        }
        for (int ip = 0; ip < 2; ip++)
            if (ip ? want_ip : want_oop) {
                p->bw_sum += res[ip].busbw;
                p->bw_rows++;
                p->wrong_total += res[ip].wrong;
            }
        if (o->nlist) {
            if (next < (size_t)o->nlist)
                bytes = o->list[next];
            next++;
        } else if (o->step_bytes)
            bytes += o->step_bytes;
        else if ((double)bytes * o->factor <= (double)bytes)
            break;
        else
            bytes = (size_t)((double)bytes * o->factor);
    }
    free(e.v);
}

int main(int argc, char **argv)
{
    opts_t o;
    perf_t p = {.o = &o};
    int version;

    if (parse_opts(argc, argv, &o) != 0)
        return 2;
    /* hcclCommInitFromEnv reads HCCL_ALGO; -a overrides whatever the environment held. */
    if (o.algo)
        setenv("HCCL_ALGO", o.algo, 1);
    CHECK(hcclCommInitFromEnv(&p.comm));
    CHECK(hcclCommUserRank(p.comm, &p.rank));
    CHECK(hcclCommCount(p.comm, &p.n));
    CHECK(hcclGetVersion(&version));
    if (o.root >= p.n) {
        if (p.rank == 0)
            fprintf(stderr, "hccl-perf: root %d is not a rank of %d\n", o.root, p.n);
        hcclCommDestroy(p.comm);
        return 2;
    }
    /* One capacity for every collective: the largest buffer any of them uses at max_bytes. */
    for (int i = 0; i < o.nlist; i++)
        o.max_bytes = i == 0 || o.list[i] > o.max_bytes ? o.list[i] : o.max_bytes;
    p.cap = o.max_bytes ? o.max_bytes : 1;
    for (int k = 0; k < o.inflight; k++) {
        if (posix_memalign((void **)&p.send[k], 4096, p.cap) != 0 ||
            posix_memalign((void **)&p.recv[k], 4096, p.cap) != 0) {
            fprintf(stderr, "hccl-perf: rank %d: cannot allocate 2 x %d x %zu bytes\n", p.rank,
                    o.inflight, p.cap);
            return 1;
        }
        /* Fault the pages in now, not inside the first timed size. */
        memset(p.send[k], 0, p.cap);
        memset(p.recv[k], 0, p.cap);
    }
    if (p.rank == 0 && !o.csv && !o.json)
        printf("# hccl-perf, hccl %d.%d.%d, %d ranks\n", version / 10000, version / 100 % 100,
               version % 100, p.n);
    if (p.rank == 0 && o.csv)
        printf("collective,size,count,type,redop,root,placement,time_us,algbw,busbw,wrong,nranks,"
               "algo\n");
    if (p.rank == 0 && o.json)
        printf("[");
    for (int i = 0; i < o.ncolls; i++)
        run_coll(&p, o.colls[i]);
    if (p.rank == 0 && o.json)
        printf("\n]\n");
    if (p.rank == 0 && !o.csv && !o.json) {
        printf("# Out of bounds values : %lld %s\n", o.check ? p.wrong_total : 0LL,
               !o.check        ? "(not checked)"
               : p.wrong_total ? "WRONG"
                               : "OK");
        printf("# Avg bus bandwidth    : %g\n#\n", p.bw_rows ? p.bw_sum / p.bw_rows : 0.0);
    }
    CHECK(hcclCommDestroy(p.comm));
    for (int k = 0; k < o.inflight; k++) {
        free(p.send[k]);
        free(p.recv[k]);
    }
    return p.wrong_total ? 1 : 0;
}
