/* The executor's state, shared by exec.c, exec_policy.c and exec_inspect.c only. */
#ifndef HCCL_SCHED_EXEC_IMPL_H
#define HCCL_SCHED_EXEC_IMPL_H

#include "links/link.h"
#include "reactor/reactor.h"
#include "sched/sched.h"

struct hccl_exec {
    hccl_reactor_t *reactor; /* borrowed */
    int rank;
    int nranks;
    hccl_conn_t **conns; /* borrowed, [nranks] */
    hccl_run_t *runs;    /* in flight, doubly linked */
    int inflight;
    hccl_run_t *pool; /* finished runs kept for reuse, linked by next */
    int npool;
    /*
     * One scratch larger than EXEC_KEEP_SCRATCH, kept for the next run that needs as much:
     * reallocating it each time cost every call a page fault per 4 KiB, a large share of a
     * big collective's time (docs/performance.md). Sized by the largest need so far; freed
     * with the executor.
     */
    void *big;
    size_t big_cap;
    bool big_busy;                   /* a run in flight uses it */
    bool recv_reduce;                /* see hccl_exec_set_recv_reduce */
    size_t store_min;                /* see hccl_exec_set_store_min */
    uint64_t nfused;                 /* receives whose payload was reduced as it arrived */
    uint64_t bytes_reduced_stored;   /* reduction results stored past the cache */
    hccl_exec_step_hook_t step_hook; /* NULL unless faults are injected */
    void *step_hook_arg;
};

/*
 * Runs are recycled with their arrays and scratch, so that a collective whose plan is cached
 * allocates nothing. A pooled run keeps scratch up to EXEC_KEEP_SCRATCH; a larger need takes
 * the executor's one big scratch (hccl_exec.big), so that what stays resident is one large
 * buffer, not one per pooled run.
 */
#define EXEC_POOL_RUNS 8
#define EXEC_KEEP_SCRATCH (8u << 20)

struct hccl_run {
    hccl_exec_t *ex;
    hccl_plan_t *plan; /* retained */
    uint64_t seq;
    uint32_t sig; /* stamped on every transfer */
    char *base[HCCL_NUM_SLOTS];
    void *scratch; /* owned */
    size_t scratch_cap;
    bool uses_big;      /* its scratch is the executor's big one, not scratch */
    uint32_t steps_cap; /* capacity of left, ready and xfers */
    uint32_t *left;     /* owned: unfinished predecessors per step */
    uint32_t *ready;    /* owned: stack of steps ready to issue */
    uint32_t nready;
    hccl_xfer_t *xfers; /* owned: one per step, used by sends and receives */
    uint32_t remaining; /* steps not completed */
    uint32_t posted;    /* transfers handed to links and not yet back */
    bool driving;
    bool store;       /* results stored past the cache (hccl_exec_set_store_min) */
    bool store_reduced; /* so are its final reductions' results (a Reduce root's: run_reduce) */
    bool read_direct; /* receives read single-copy (hccl_exec_reads_direct) */
    unsigned rewritten_flag; /* sends with it are xfer.rewritten (hccl_exec_rewritten_flag) */
    bool failed;
    bool finishing;
    hcclResult_t res;
    char msg[512];
    hccl_run_done_cb_t cb;
    void *cb_arg;
    hccl_post_t done_post;
    hccl_run_t *prev;
    hccl_run_t *next;
};

/*
 * The reduce that receive step s may do as its payload arrives, or UINT32_MAX: it is s's only
 * successor (so nothing else reads what s would have stored), and one of its operands is
 * exactly what s receives while the other does not touch it. Whether it does is decided when
 * the first bytes arrive (run_consume).
 */
uint32_t hccl_exec_fusable_reduce(const hccl_run_t *run, const hccl_step_t *s,
                                  const hccl_conn_t *c);
/* The bytes a run touches: in place the send buffer is part of the receive buffer. */
size_t hccl_exec_footprint(const hccl_plan_t *p, const void *sendbuf, const void *recvbuf);
/* Whether a run's receives (but those sent on) read offered messages single-copy instead of
 * the link's timed choice: where this rank sends as it receives (exec_policy.c). */
bool hccl_exec_reads_direct(const hccl_plan_t *plan, const void *sendbuf, const void *recvbuf);
/* The step flag that marks a run's sends xfer.rewritten, or 0 (exec_policy.c). */
unsigned hccl_exec_rewritten_flag(const hccl_plan_t *plan, const void *sendbuf,
                                  const void *recvbuf);

static inline bool bref_eq(hccl_bref_t a, hccl_bref_t b)
{
    return a.slot == b.slot && a.off == b.off;
}

/* Whether step s ends an hcclAvg: it divides its result, in place, once it is written. */
static inline bool step_divides(const hccl_plan_t *p, const hccl_step_t *s)
{
    return (s->flags & HCCL_STEP_FINAL_DIV) && p->op == hcclAvg;
}

/* Whether step s writes its result past the cache: not the last step of hcclAvg, which reads
 * its result back at once to divide it. */
static inline bool run_stores(const hccl_run_t *run, const hccl_step_t *s)
{
    return run->store && !step_divides(run->plan, s);
}

#endif /* HCCL_SCHED_EXEC_IMPL_H */
