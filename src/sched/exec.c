/*
 * The executor: counts each step's unfinished predecessors, issues a step
 * when the count reaches zero, and advances on link completions. Several
 * runs may be in flight at once; nothing here blocks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/exec_impl.h"

hcclResult_t hccl_exec_create(hccl_reactor_t *r, int rank, int nranks, hccl_conn_t **conns,
                              hccl_exec_t **ex_p)
{
    hccl_exec_t *ex = hccl_calloc(1, sizeof(*ex));

    if (!ex)
        return HCCL_FAIL(hcclSystemError, "executor: out of memory");
    ex->reactor = r;
    ex->rank = rank;
    ex->nranks = nranks;
    ex->conns = conns;
    ex->recv_reduce = true;
    *ex_p = ex;
    return hcclSuccess;
}

static void run_release_memory(hccl_run_t *run)
{
    hccl_free(run->scratch);
    hccl_free(run->left);
    hccl_free(run->ready);
    hccl_free(run->xfers);
    hccl_free(run);
}

void hccl_exec_destroy(hccl_exec_t *ex)
{
    if (!ex)
        return;
    while (ex->pool) {
        hccl_run_t *run = ex->pool;
        ex->pool = run->next;
        run_release_memory(run);
    }
    hccl_free(ex->big);
    hccl_free(ex);
}

void hccl_exec_set_step_hook(hccl_exec_t *ex, hccl_exec_step_hook_t hook, void *arg)
{
    ex->step_hook = hook;
    ex->step_hook_arg = arg;
}

static void run_free(hccl_run_t *run)
{
    hccl_exec_t *ex = run->ex;

    hccl_plan_release(run->plan);
    run->plan = NULL;
    if (run->uses_big) {
        run->uses_big = false;
        ex->big_busy = false;
    }
    if (ex->npool == EXEC_POOL_RUNS) {
        run_release_memory(run);
        return;
    }
    if (run->scratch_cap > EXEC_KEEP_SCRATCH) {
        hccl_free(run->scratch);
        run->scratch = NULL;
        run->scratch_cap = 0;
    }
    run->next = ex->pool;
    ex->pool = run;
    ex->npool++;
}

/* A run with room for n steps and scratch bytes: recycled when one is free. */
static hccl_run_t *run_get(hccl_exec_t *ex, uint32_t n, size_t scratch)
{
    hccl_run_t *run = ex->pool, keep;

    if (run) {
        ex->pool = run->next;
        ex->npool--;
    } else {
        run = hccl_calloc(1, sizeof(*run));
        if (!run)
            return NULL;
    }
    /* The arrays and scratch carry over; every other field starts from zero. */
    keep = *run;
    memset(run, 0, sizeof(*run));
    run->left = keep.left;
    run->ready = keep.ready;
    run->xfers = keep.xfers;
    run->steps_cap = keep.steps_cap;
    run->scratch = keep.scratch;
    run->scratch_cap = keep.scratch_cap;
    run->ex = ex;
    if (scratch > EXEC_KEEP_SCRATCH && !ex->big_busy) {
        if (ex->big_cap < scratch) {
            /* Scratch is page-aligned, as the bounce (frame.c): single-copy reads land in it. */
            hccl_free(ex->big);
            ex->big = hccl_aligned_alloc(4096, scratch);
            ex->big_cap = ex->big ? scratch : 0;
        }
        if (ex->big) {
            ex->big_busy = true;
            run->uses_big = true;
            scratch = 0; /* nothing more of its own */
        }
    }
    if (run->steps_cap < n + 1 || !run->left) {
        hccl_free(run->left);
        hccl_free(run->ready);
        hccl_free(run->xfers);
        run->left = hccl_malloc(((size_t)n + 1) * sizeof(*run->left));
        run->ready = hccl_malloc(((size_t)n + 1) * sizeof(*run->ready));
        run->xfers = hccl_malloc(((size_t)n + 1) * sizeof(*run->xfers));
        run->steps_cap = n + 1;
    }
    if (scratch > run->scratch_cap) {
        hccl_free(run->scratch);
        run->scratch = hccl_aligned_alloc(4096, scratch);
        run->scratch_cap = run->scratch ? scratch : 0;
    }
    if (!run->left || !run->ready || !run->xfers || (scratch && !run->scratch)) {
        if (run->uses_big)
            ex->big_busy = false;
        run_release_memory(run);
        return NULL;
    }
    memset(run->xfers, 0, ((size_t)n + 1) * sizeof(*run->xfers));
    return run;
}

static void run_on_finished(hccl_post_t *post)
{
    hccl_run_t *run = (hccl_run_t *)((char *)post - offsetof(hccl_run_t, done_post));
    hccl_exec_t *ex = run->ex;

    if (run->prev)
        run->prev->next = run->next;
    else
        ex->runs = run->next;
    if (run->next)
        run->next->prev = run->prev;
    ex->inflight--;
    run->cb(run, run->res, run->failed ? run->msg : NULL, run->cb_arg);
    run_free(run);
}

/* A run ends once every step is done, or it failed and the links gave back every transfer. */
static void run_maybe_finish(hccl_run_t *run)
{
    if (run->finishing || run->driving)
        return;
    if ((run->failed && run->posted == 0) || (!run->failed && run->remaining == 0)) {
        run->finishing = true;
        run->done_post.fn = run_on_finished;
        hccl_reactor_post(run->ex->reactor, &run->done_post);
    }
}

static void run_fail(hccl_run_t *run, hcclResult_t res, const char *msg)
{
    if (run->failed)
        return;
    run->failed = true;
    run->res = res;
    snprintf(run->msg, sizeof(run->msg), "%s", msg ? msg : hcclGetErrorString(res));
}

static void run_step_done(hccl_run_t *run, uint32_t id)
{
    const hccl_plan_t *p = run->plan;
    const hccl_step_t *s = &p->steps[id];

    run->remaining--;
    for (uint32_t k = 0; k < s->nsucc; k++) {
        uint32_t n = p->succ[s->succ_first + k];
        if (--run->left[n] == 0)
            run->ready[run->nready++] = n;
    }
}

static void *run_ptr(const hccl_run_t *run, hccl_bref_t b)
{
    return run->base[b.slot] + b.off;
}

static void run_on_xfer_done(hccl_xfer_t *x, hcclResult_t res);
static void run_drive(hccl_run_t *run);

/* Whether n bytes at p and at q do not overlap (in place, SEND and RECV are one buffer: the
 * memory is compared, not the slots). */
static bool mem_apart(const void *p, const void *q, size_t n)
{
    uintptr_t x = (uintptr_t)p, y = (uintptr_t)q;

    return x + n <= y || y + n <= x;
}

/*
 * Reduce step s's elements into dst. Streamed only where run->store_reduced, where s writes a
 * final result (HCCL_STEP_FINAL_DIV: no later step reads it) and dst is neither operand: an
 * accumulation read back by the next step, or in place (torch's AllReduce), streamed
 * reductions measured slower; out of place at a Reduce root faster (docs/performance.md).
 */
static void run_reduce(const hccl_run_t *run, const hccl_step_t *s, void *dst, const void *a,
                       const void *b, size_t count)
{
    if (run->store_reduced && (s->flags & HCCL_STEP_FINAL_DIV)) {
        size_t bytes = count * hccl_dtype_size(run->plan->dtype);
        if (mem_apart(dst, a, bytes) && mem_apart(dst, b, bytes)) {
            run->ex->bytes_reduced_stored +=
                hccl_reduce_store(dst, a, b, count, run->plan->dtype, run->plan->op);
            return;
        }
    }
    hccl_reduce(dst, a, b, count, run->plan->dtype, run->plan->op);
}

/* A reduce step has no transfer: its xfer's unit records what its receive did with the data. */
enum { FUSE_NONE, FUSE_REDUCED, FUSE_STORED };

/*
 * A consuming receive's payload, piece by piece, in order. If its reduce waits on nothing else
 * when the first piece comes (what it reads and writes is final), each piece is reduced at once:
 * dst = the other operand op data, and the reduce step has nothing left to do. Otherwise the
 * payload is stored where the receive would have put it, and the reduce runs as planned.
 */
static void run_consume(hccl_xfer_t *x, size_t off, const void *data, size_t len)
{
    hccl_run_t *run = x->arg;
    const hccl_plan_t *p = run->plan;
    const hccl_step_t *s = &p->steps[x - run->xfers];
    uint32_t rid = p->succ[s->succ_first];
    const hccl_step_t *r = &p->steps[rid];
    hccl_bref_t other = bref_eq(r->src, s->dst) ? r->src2 : r->src;
    size_t *mode = &run->xfers[rid].unit;

    if (off == 0)
        *mode = run->left[rid] == 1 ? FUSE_REDUCED : FUSE_STORED;
    /* Stored for the reduce that reads it next: plain stores. */
    if (*mode == FUSE_STORED) {
        memcpy((char *)x->buf + off, data, len);
        return;
    }
    run_reduce(run, r, (char *)run_ptr(run, r->dst) + off, (const char *)run_ptr(run, other) + off,
               data, len / x->unit);
}

static hcclResult_t run_issue_xfer(hccl_run_t *run, uint32_t id, const hccl_step_t *s)
{
    hccl_exec_t *ex = run->ex;
    hccl_xfer_t *x = &run->xfers[id];
    hccl_conn_t *c = ex->conns[s->peer];
    bool is_send = s->kind == HCCL_STEP_SEND;
    hcclResult_t res;

    if (!c)
        return HCCL_FAIL(hcclInternalError, "rank %d: no connection to rank %d", ex->rank, s->peer);
    memset(x, 0, sizeof(*x));
    x->seq = run->seq;
    x->sig = run->sig;
    x->tag = s->tag;
    x->peer = s->peer;
    x->buf = is_send ? run_ptr(run, s->src) : run_ptr(run, s->dst);
    x->len = s->bytes;
    x->done = run_on_xfer_done;
    x->arg = run;
    x->res = hcclInProgress;
    /* Not where the data is sent on (read again soon), nor where this rank only receives: its
     * copies then run beside the sender's, and streamed they are slower. Copies stream even
     * where their result is sent on: keeping those plain gains nothing (docs/performance.md). */
    x->store = !is_send && run->store && !(s->flags & HCCL_STEP_FORWARDED) && run->plan->nsends > 0;
    if (is_send) {
        x->rewritten = (s->flags & run->rewritten_flag) != 0;
    } else {
        uint32_t rid = hccl_exec_fusable_reduce(run, s, c);
        x->read_direct = run->read_direct && !(s->flags & HCCL_STEP_FORWARDED);
        if (rid != UINT32_MAX) {
            x->consume = run_consume;
            x->unit = hccl_dtype_size(run->plan->dtype);
        }
    }
    run->posted++;
    res = is_send ? c->ops->post_send(c, x) : c->ops->post_recv(c, x);
    if (hccl_is_failure(res)) {
        run->posted--;
        x->res = res;
    }
    return res;
}

static void run_issue(hccl_run_t *run, uint32_t id)
{
    const hccl_plan_t *p = run->plan;
    const hccl_step_t *s = &p->steps[id];
    size_t esz = hccl_dtype_size(p->dtype);
    hcclResult_t res;

    if (run->ex->step_hook) {
        run->ex->step_hook(run->ex->step_hook_arg, run->seq, id);
        if (run->failed)
            return; /* the hook broke a link: the step is never issued */
    }
    switch (s->kind) {
    case HCCL_STEP_SEND:
    case HCCL_STEP_RECV:
        res = run_issue_xfer(run, id, s);
        if (hccl_is_failure(res))
            run_fail(run, res, hccl_error_last());
        return;
    case HCCL_STEP_COPY: {
        void *dst = run_ptr(run, s->dst);
        const void *src = run_ptr(run, s->src);
        if (dst != src && s->bytes) {
            if (run_stores(run, s) && mem_apart(dst, src, s->bytes))
                hccl_store_copy(dst, src, s->bytes);
            else
                memmove(dst, src, s->bytes);
        }
        if (step_divides(p, s))
            hccl_reduce_div(dst, s->bytes / esz, p->dtype, p->nranks);
        break;
    }
    case HCCL_STEP_REDUCE: {
        void *dst = run_ptr(run, s->dst);
        if (run->xfers[id].unit == FUSE_REDUCED)
            run->ex->nfused++; /* its receive reduced the payload as it came */
        else
            run_reduce(run, s, dst, run_ptr(run, s->src), run_ptr(run, s->src2), s->bytes / esz);
        if (step_divides(p, s))
            hccl_reduce_div(dst, s->bytes / esz, p->dtype, p->nranks);
        break;
    }
    }
    run_step_done(run, id);
}

/* Issues every ready step; re-entry (a link completing inside post) only queues. */
static void run_drive(hccl_run_t *run)
{
    if (run->driving)
        return;
    run->driving = true;
    while (run->nready > 0 && !run->failed)
        run_issue(run, run->ready[--run->nready]);
    run->driving = false;
    run_maybe_finish(run);
}

static void run_on_xfer_done(hccl_xfer_t *x, hcclResult_t res)
{
    hccl_run_t *run = x->arg;
    uint32_t id = (uint32_t)(x - run->xfers);

    run->posted--;
    x->res = res;
    if (res != hcclSuccess) {
        char msg[512];
        const hccl_step_t *s = &run->plan->steps[id];
        snprintf(msg, sizeof(msg), "rank %d: %s rank %d (seq %llu, step %u, %zu bytes) failed: %s",
                 run->ex->rank, s->kind == HCCL_STEP_SEND ? "send to" : "recv from", s->peer,
                 (unsigned long long)run->seq, id, s->bytes,
                 hccl_error_last()[0] ? hccl_error_last() : hcclGetErrorString(res));
        run_fail(run, res, msg);
    } else if (!run->failed) {
        run_step_done(run, id);
    }
    run_drive(run);
}

hcclResult_t hccl_exec_start(hccl_exec_t *ex, hccl_plan_t *plan, uint64_t seq, const void *sendbuf,
                             void *recvbuf, hccl_run_done_cb_t cb, void *arg, hccl_run_t **run_p)
{
    return hccl_exec_start_sig(ex, plan, seq, 0, sendbuf, recvbuf, cb, arg, run_p);
}

hcclResult_t hccl_exec_start_sig(hccl_exec_t *ex, hccl_plan_t *plan, uint64_t seq, uint32_t sig,
                                 const void *sendbuf, void *recvbuf, hccl_run_done_cb_t cb,
                                 void *arg, hccl_run_t **run_p)
{
    uint32_t n = plan->nsteps;
    hccl_run_t *run = run_get(ex, n, plan->scratch_bytes);
    size_t footprint;
    bool past_cache;

    if (!run)
        return HCCL_FAIL(hcclSystemError,
                         "executor: out of memory for a run of %u steps "
                         "(%zu bytes scratch)",
                         n, plan->scratch_bytes);
    hccl_plan_retain(plan);
    run->plan = plan;
    run->seq = seq;
    run->sig = sig;
    footprint = hccl_exec_footprint(plan, sendbuf, recvbuf);
    /* A plan that reduces keeps its copies plain: streamed, they measured slower at most sizes
     * and rank counts. Its final reductions stream only at a rank that sends nothing (a Reduce
     * root), whose results nothing reads again, unless hcclAvg reads them back to divide
     * (run_reduce; docs/performance.md). */
    past_cache = ex->store_min && footprint > ex->store_min;
    run->store = past_cache && plan->nreduces == 0;
    run->store_reduced = past_cache && plan->nsends == 0 && plan->op != hcclAvg;
    run->read_direct = hccl_exec_reads_direct(plan, sendbuf, recvbuf);
    run->rewritten_flag = hccl_exec_rewritten_flag(plan, sendbuf, recvbuf);
    run->base[HCCL_SLOT_SEND] = (char *)(uintptr_t)sendbuf;
    run->base[HCCL_SLOT_RECV] = recvbuf;
    run->base[HCCL_SLOT_SCRATCH] = run->uses_big ? ex->big : run->scratch;
    run->remaining = n;
    run->cb = cb;
    run->cb_arg = arg;
    for (uint32_t i = n; i-- > 0;) {
        run->left[i] = plan->steps[i].ndeps;
        if (run->left[i] == 0)
            run->ready[run->nready++] = i;
    }
    run->next = ex->runs;
    if (ex->runs)
        ex->runs->prev = run;
    ex->runs = run;
    ex->inflight++;
    if (run_p)
        *run_p = run;
    run_drive(run);
    return hcclSuccess;
}

void hccl_exec_fail_all(hccl_exec_t *ex, hcclResult_t res, const char *msg)
{
    for (hccl_run_t *run = ex->runs; run; run = run->next) {
        if (run->finishing)
            continue; /* already decided, and posted: a later failure does not undo a success */
        run_fail(run, res, msg);
        run_maybe_finish(run);
    }
}
