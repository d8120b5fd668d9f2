/*
 * mpi_perf.c - the collectives of hccl-perf through MPI (built once against
 * Open MPI and once against MPICH), float32 sum, same flags and CSV rows as
 * hccl-perf (see common.h).
 *
 *   mpirun -np 4 mpi_perf.ompi -C all -b 8 -e 256M -f 4 -w 5 -n 200 -T 0.05 --csv
 *
 * Per collective and size: fill the buffers, one call that is checked
 * (and timed: -G), -w warm-up calls, with -T the sizing runs (common.h),
 * a barrier, the timed calls, a second check.  The algo column says "default": the
 * MPI picks its algorithm itself (Open MPI's coll/tuned, MPICH's CVARs).
 * -z 0 times the non-blocking forms (MPI_Iallreduce & co.) each followed by
 * MPI_Wait, the counterpart of hccl-perf's Async + hcclWait.
 */
#include <mpi.h>
#include <unistd.h>

#include "common.h"

static int me, np, blocking = 1;

/* The non-blocking form of run's call, then MPI_Wait. */
static void run_nb(int coll, const float *s, float *r, int c, int root)
{
    MPI_Request q = MPI_REQUEST_NULL;
    switch (coll) {
    case ALLREDUCE: MPI_Iallreduce(s, r, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q); break;
    case BROADCAST: MPI_Ibcast(r, c, MPI_FLOAT, root, MPI_COMM_WORLD, &q); break;
    case REDUCE: MPI_Ireduce(s, r, c, MPI_FLOAT, MPI_SUM, root, MPI_COMM_WORLD, &q); break;
    case ALLGATHER: MPI_Iallgather(s, c, MPI_FLOAT, r, c, MPI_FLOAT, MPI_COMM_WORLD, &q); break;
    case REDUCESCATTER: MPI_Ireduce_scatter_block(s, r, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q); break;
    case ALLTOALL: MPI_Ialltoall(s, c, MPI_FLOAT, r, c, MPI_FLOAT, MPI_COMM_WORLD, &q); break;
    }
    MPI_Wait(&q, MPI_STATUS_IGNORE);
}

static void run(int coll, const float *s, float *r, size_t chunk, int root)
{
    int c = (int)chunk;
    if (!blocking) {
        run_nb(coll, s, r, c, root);
        return;
    }
    switch (coll) {
    case ALLREDUCE: MPI_Allreduce(s, r, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case BROADCAST: MPI_Bcast(r, c, MPI_FLOAT, root, MPI_COMM_WORLD); break;
    case REDUCE: MPI_Reduce(s, r, c, MPI_FLOAT, MPI_SUM, root, MPI_COMM_WORLD); break;
    case ALLGATHER: MPI_Allgather(s, c, MPI_FLOAT, r, c, MPI_FLOAT, MPI_COMM_WORLD); break;
    case REDUCESCATTER: MPI_Reduce_scatter_block(s, r, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case ALLTOALL: MPI_Alltoall(s, c, MPI_FLOAT, r, c, MPI_FLOAT, MPI_COMM_WORLD); break;
    }
}

static double over_ranks(double v, MPI_Op op)
{
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, op, MPI_COMM_WORLD);
    return v;
}

int main(int argc, char **argv)
{
    struct opts o;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    const char *err = parse_opts(argc, argv, &o);
    if (err || o.root < 0 || o.root >= np) {
        if (me == 0)
            fprintf(stderr, "mpi_perf: %s\n", err ? err : "bad -r");
        MPI_Finalize();
        return 2;
    }
    blocking = o.blocking;

    /* One pair of buffers for the largest case, touched once so that page
     * faults stay out of the timings. */
    size_t max_se = 1, max_re = 1, se, re;
    for (int k = 0; k < o.ncoll; k++) {
        buf_elems(o.coll[k], chunk_elems(o.coll[k], o.maxb, np), np, &se, &re);
        max_se = se > max_se ? se : max_se;
        max_re = re > max_re ? re : max_re;
    }
    float *s = NULL, *r = NULL;
    if (posix_memalign((void **)&s, 4096, max_se * sizeof(float)) ||
        posix_memalign((void **)&r, 4096, max_re * sizeof(float)))
        MPI_Abort(MPI_COMM_WORLD, 1);
    memset(s, 0, max_se * sizeof(float));
    memset(r, 0, max_re * sizeof(float));

    if (me == 0) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len;
        MPI_Get_library_version(lib, &len);
        lib[strcspn(lib, "\n")] = 0;
        fprintf(stderr, "# mpi_perf nranks=%d library: %s\n", np, lib);
        print_header(&o);
    }

    for (int k = 0; k < o.ncoll; k++) {
        int coll = o.coll[k];
        size_t last = 0;
        for (double b = (double)o.minb; b <= (double)o.maxb * 1.0001; b *= o.factor) {
            size_t chunk = chunk_elems(coll, (size_t)b, np);
            if (chunk == 0 || chunk == last)
                continue; /* no float per rank, or the size just measured */
            last = chunk;
            fill(coll, me, np, o.root, chunk, s, r);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = now_s();
            run(coll, s, r, chunk, o.root);
            double first = over_ranks(now_s() - t0, MPI_MAX), t_us = first * 1e6;
            long bad = o.check ? check(coll, me, np, o.root, chunk, r) : 0, wrong = 0;
            int slow = first > o.guard;
            if (!slow) {
                int warm = warmups(&o, first);
                double est = first;
                for (int i = 0; i < warm; i++)
                    run(coll, s, r, chunk, o.root);
                for (int n = 1; o.budget > 0; n *= 2) {
                    MPI_Barrier(MPI_COMM_WORLD);
                    t0 = now_s();
                    for (int i = 0; i < n; i++)
                        run(coll, s, r, chunk, o.root);
                    double spent = over_ranks(now_s() - t0, MPI_MAX);
                    if (sized_enough(&o, spent, n)) {
                        est = spent / n;
                        break;
                    }
                }
                int iters = timed_iters(&o, est);
                MPI_Barrier(MPI_COMM_WORLD);
                t0 = now_s();
                for (int i = 0; i < iters; i++)
                    run(coll, s, r, chunk, o.root);
                t_us = over_ranks((now_s() - t0) / iters, MPI_SUM) / np * 1e6;
                if (o.check)
                    bad += check(coll, me, np, o.root, chunk, r);
            }
            MPI_Reduce(&bad, &wrong, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
            if (me == 0) {
                print_row(&o, coll, chunk, np, t_us, wrong, "default");
                if (slow)
                    fprintf(stderr, "# %s: one call took %.1f s (> -G %.1f): larger sizes skipped\n",
                            coll_name[coll], first, o.guard);
            }
            if (slow)
                break;
        }
    }
    free(s);
    free(r);
    /* MPICH 4.0.2 over UCX's TCP transport (mpich-tcp) often hangs in
     * MPI_Finalize here: some ranks wait in the PMI barrier while others spin
     * on UCX endpoints that never close. Everything is measured and printed
     * by now, so with MPI_PERF_NO_FINALIZE=1 the ranks leave after a barrier
     * (Hydra may then kill the last ones: compare.sh accepts that exit
     * status when rank 0 said "all rows written"). */
    if (getenv("MPI_PERF_NO_FINALIZE") && atoi(getenv("MPI_PERF_NO_FINALIZE"))) {
        fflush(stdout);
        if (me == 0)
            fprintf(stderr, "# mpi_perf: all rows written\n");
        MPI_Barrier(MPI_COMM_WORLD);
        _exit(0);
    }
    MPI_Finalize();
    return 0;
}
