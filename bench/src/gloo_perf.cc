// gloo_perf.cc - the collectives of hccl-perf through Gloo (Debian's
// libgloo, TCP transport on 127.0.0.1), float32 sum, same flags, method and
// CSV rows as mpi_perf.c (see common.h).
//
// One process per rank, started by compare.sh with GLOO_RANK, GLOO_SIZE and
// GLOO_STORE (a fresh directory for the FileStore rendezvous) set.
//
// Algorithms (the algo column): the UnboundBuffer API that PyTorch's Gloo
// backend uses - allreduce (ring, its default), broadcast, reduce, allgather,
// alltoall.  Gloo has no such reduce-scatter, so reducescatter is the legacy
// ReduceScatterHalvingDoubling class, which works in place: it is checked
// after its first call only (the timed calls keep reducing the same buffer).
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <memory>

#include "common.h"

static std::shared_ptr<gloo::Context> ctx;
static int me, np;
static uint32_t tag;

static void barrier()
{
    gloo::BarrierOptions o(ctx);
    o.setTag(++tag);
    gloo::barrier(o);
}

using ReduceFn = void (*)(void *, const void *, const void *, size_t);
static const ReduceFn dmax = &gloo::max<double>, dsum = &gloo::sum<double>, fsum = &gloo::sum<float>;

static double over_ranks(double v, ReduceFn fn)
{
    gloo::AllreduceOptions o(ctx);
    o.setOutput(&v, 1);
    o.setReduceFunction(fn);
    o.setTag(++tag);
    gloo::allreduce(o);
    return v;
}

// One call of collective `coll`; rs is the prepared reduce-scatter (in place on s).
static void run(int coll, float *s, float *r, size_t chunk, int root, gloo::Algorithm *rs)
{
    switch (coll) {
    case ALLREDUCE: {
        gloo::AllreduceOptions o(ctx);
        o.setInput(s, chunk);
        o.setOutput(r, chunk);
        o.setReduceFunction(fsum);
        o.setTag(++tag);
        gloo::allreduce(o);
        break;
    }
    case BROADCAST: {
        gloo::BroadcastOptions o(ctx);
        o.setOutput(r, chunk);
        o.setRoot(root);
        o.setTag(++tag);
        gloo::broadcast(o);
        break;
    }
    case REDUCE: {
        gloo::ReduceOptions o(ctx);
        o.setInput(s, chunk);
        o.setOutput(r, chunk);
        o.setRoot(root);
        o.setReduceFunction(fsum);
        o.setTag(++tag);
        gloo::reduce(o);
        break;
    }
    case ALLGATHER: {
        gloo::AllgatherOptions o(ctx);
        o.setInput(s, chunk);
        o.setOutput(r, chunk * np);
        o.setTag(++tag);
        gloo::allgather(o);
        break;
    }
    case ALLTOALL: {
        gloo::AlltoallOptions o(ctx);
        o.setInput(s, chunk * np);
        o.setOutput(r, chunk * np);
        o.setTag(++tag);
        gloo::alltoall(o);
        break;
    }
    case REDUCESCATTER: rs->run(); break;
    }
}

int main(int argc, char **argv)
{
    struct opts o;
    const char *err = parse_opts(argc, argv, &o), *store = getenv("GLOO_STORE");
    me = atoi(getenv("GLOO_RANK") ? getenv("GLOO_RANK") : "0");
    np = atoi(getenv("GLOO_SIZE") ? getenv("GLOO_SIZE") : "1");
    if (err || !store || np < 1 || me < 0 || me >= np || o.root < 0 || o.root >= np) {
        fprintf(stderr, "gloo_perf: %s\n", err ? err : "need GLOO_RANK, GLOO_SIZE, GLOO_STORE and a valid -r");
        return 2;
    }
    try {
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        gloo::rendezvous::FileStore fs(store);
        auto c = std::make_shared<gloo::rendezvous::Context>(me, np);
        c->setTimeout(std::chrono::seconds(300));
        c->connectFullMesh(fs, dev);
        ctx = c;

        size_t max_se = 1, max_re = 1, se, re;
        for (int k = 0; k < o.ncoll; k++) {
            buf_elems(o.coll[k], chunk_elems(o.coll[k], o.maxb, np), np, &se, &re);
            max_se = se > max_se ? se : max_se;
            max_re = re > max_re ? re : max_re;
        }
        float *s = nullptr, *r = nullptr;
        if (posix_memalign((void **)&s, 4096, max_se * sizeof(float)) ||
            posix_memalign((void **)&r, 4096, max_re * sizeof(float)))
            throw std::runtime_error("out of memory");
        memset(s, 0, max_se * sizeof(float));
        memset(r, 0, max_re * sizeof(float));
        if (me == 0) {
            fprintf(stderr, "# gloo_perf nranks=%d gloo %d.%d.%d, tcp on 127.0.0.1\n", np, GLOO_VERSION_MAJOR,
                    GLOO_VERSION_MINOR, GLOO_VERSION_PATCH);
            print_header(&o);
        }

        for (int k = 0; k < o.ncoll; k++) {
            int coll = o.coll[k];
            const char *algo = coll == ALLREDUCE ? "ring" : coll == REDUCESCATTER ? "halving_doubling" : "default";
            size_t last = 0;
            for (double b = (double)o.minb; b <= (double)o.maxb * 1.0001; b *= o.factor) {
                size_t chunk = chunk_elems(coll, (size_t)b, np);
                if (chunk == 0 || chunk == last)
                    continue;
                last = chunk;
                std::unique_ptr<gloo::Algorithm> rs;
                if (coll == REDUCESCATTER)
                    rs.reset(new gloo::ReduceScatterHalvingDoubling<float>(ctx, std::vector<float *>{s},
                                                                           (int)(chunk * np),
                                                                           std::vector<int>(np, (int)chunk)));
                fill(coll, me, np, o.root, chunk, s, r);
                barrier();
                double t0 = now_s();
                run(coll, s, r, chunk, o.root, rs.get());
                double first = over_ranks(now_s() - t0, dmax), t_us = first * 1e6;
                // reduce-scatter leaves this rank's block at the start of s
                const float *out = coll == REDUCESCATTER ? s : r;
                long bad = o.check ? check(coll, me, np, o.root, chunk, out) : 0;
                bool slow = first > o.guard;
                if (!slow) {
                    int warm = warmups(&o, first);
                    double est = first;
                    for (int i = 0; i < warm; i++)
                        run(coll, s, r, chunk, o.root, rs.get());
                    for (int n = 1; o.budget > 0; n *= 2) {
                        barrier();
                        t0 = now_s();
                        for (int i = 0; i < n; i++)
                            run(coll, s, r, chunk, o.root, rs.get());
                        double spent = over_ranks(now_s() - t0, dmax);
                        if (sized_enough(&o, spent, n)) {
                            est = spent / n;
                            break;
                        }
                    }
                    int iters = timed_iters(&o, est);
                    barrier();
                    t0 = now_s();
                    for (int i = 0; i < iters; i++)
                        run(coll, s, r, chunk, o.root, rs.get());
                    t_us = over_ranks((now_s() - t0) / iters, dsum) / np * 1e6;
                    if (o.check && coll != REDUCESCATTER)
                        bad += check(coll, me, np, o.root, chunk, out);
                }
                // summed as a double: exact far beyond any count of elements here
                double wrong = over_ranks((double)bad, dsum);
                if (me == 0) {
                    print_row(&o, coll, chunk, np, t_us, (long)wrong, algo);
                    if (slow)
                        fprintf(stderr, "# %s: one call took %.1f s (> -G %.1f): larger sizes skipped\n",
                                coll_name[coll], first, o.guard);
                }
                if (slow)
                    break;
            }
        }
        barrier();
        free(s);
        free(r);
    } catch (const std::exception &e) {
        fprintf(stderr, "gloo_perf[%d]: %s\n", me, e.what());
        return 1;
    }
    return 0;
}
