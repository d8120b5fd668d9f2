/*
 * The executor's policies: which receives reduce their payload as it arrives, which results
 * bypass the cache, which receives read single-copy.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/exec_impl.h"

void hccl_exec_set_store_min(hccl_exec_t *ex, size_t bytes)
{
    ex->store_min = bytes;
}

void hccl_exec_set_recv_reduce(hccl_exec_t *ex, bool on)
{
    ex->recv_reduce = on;
}

uint64_t hccl_exec_fused_recvs(const hccl_exec_t *ex)
{
    return ex->nfused;
}

uint64_t hccl_exec_bytes_reduced_stored(const hccl_exec_t *ex)
{
    return ex->bytes_reduced_stored;
}

static bool bref_overlap(hccl_bref_t a, hccl_bref_t b, size_t bytes)
{
    return a.slot == b.slot && a.off < b.off + bytes && b.off < a.off + bytes;
}

/*
 * The reduce that receive step s may do as its payload arrives, or UINT32_MAX: it is s's only
 * successor (so nothing else reads what s would have stored), and one of its operands is
 * exactly what s receives while the other does not touch it. Whether it does is decided when
 * the first bytes arrive (run_consume).
 */
uint32_t hccl_exec_fusable_reduce(const hccl_run_t *run, const hccl_step_t *s, const hccl_conn_t *c)
{
    const hccl_plan_t *p = run->plan;
    const hccl_step_t *r;
    uint32_t rid;

    if (!run->ex->recv_reduce || s->kind != HCCL_STEP_RECV || s->nsucc != 1 || s->bytes == 0 ||
        !hccl_conn_consumes(c))
        return UINT32_MAX;
    rid = p->succ[s->succ_first];
    r = &p->steps[rid];
    if (r->kind != HCCL_STEP_REDUCE || r->bytes != s->bytes)
        return UINT32_MAX;
    if (bref_eq(r->src2, s->dst) && !bref_overlap(r->src, s->dst, s->bytes))
        return rid;
    if (bref_eq(r->src, s->dst) && !bref_overlap(r->src2, s->dst, s->bytes))
        return rid;
    return UINT32_MAX;
}

/* In place: the send buffer is part of the receive buffer (the API's in-place forms). */
static bool exec_in_place(const hccl_plan_t *p, const void *sendbuf, const void *recvbuf)
{
    uintptr_t s = (uintptr_t)sendbuf, r = (uintptr_t)recvbuf;

    return recvbuf && s >= r && s + p->send_bytes <= r + p->recv_bytes;
}

/* The bytes a run touches: in place the send buffer is counted once. */
size_t hccl_exec_footprint(const hccl_plan_t *p, const void *sendbuf, const void *recvbuf)
{
    return (exec_in_place(p, sendbuf, recvbuf) ? 0 : p->send_bytes) + p->recv_bytes +
           p->scratch_bytes;
}

/* In place, reading single-copy lost below this (see hccl_exec_reads_direct). */
#define READ_DIRECT_IN_PLACE_MIN (1u << 20)

/*
 * Whether a run's receives read offered messages single-copy rather than pull them through
 * the wire: where this rank sends as it receives (an exchange). A pull is two copies, one on
 * each CPU, and the link times it by the slower of the two (frame_rndv.c), as if the sender's
 * CPU had nothing else to do; in an exchange both CPUs are busy with the other direction, so
 * the pull costs both copies. Reading single-copy there measured 1.2-1.8x faster at 2 ranks
 * from 128 KiB out of place (AllReduce, AllGather, AlltoAll, ReduceScatter), and 1.3x in place
 * from 1 MiB, but 1.1-1.35x slower in place below it, where the timed choice stays; the same
 * at 4 and 8 ranks (docs/performance.md). A rank that only receives (Broadcast, a Reduce's
 * root at 2 ranks) keeps the timed choice: there the sender's CPU is free.
 */
bool hccl_exec_reads_direct(const hccl_plan_t *plan, const void *sendbuf, const void *recvbuf)
{
    return plan->nsends > 0 && (!exec_in_place(plan, sendbuf, recvbuf) ||
                                plan->recv_bytes >= READ_DIRECT_IN_PLACE_MIN);
}

/*
 * The step flag that marks a run's sends xfer.rewritten (0: none), below the same line: those
 * whose bytes the run writes (HCCL_STEP_SRC_WRITTEN, in place _IN_PLACE), which the next call
 * with these buffers writes again too. A peer that reads them single-copy takes their lines
 * from this CPU's cache, and writing them then takes each line back, which cost more than the
 * copy the read saves below the line (docs/performance.md, *Pull or single-copy read*). What
 * only the caller writes (the send buffer out of place, this rank's block of an in-place
 * AllGather) stays offered.
 */
unsigned hccl_exec_rewritten_flag(const hccl_plan_t *plan, const void *sendbuf, const void *recvbuf)
{
    if (plan->recv_bytes >= READ_DIRECT_IN_PLACE_MIN)
        return 0;
    return exec_in_place(plan, sendbuf, recvbuf) ? HCCL_STEP_SRC_WRITTEN_IN_PLACE
                                                 : HCCL_STEP_SRC_WRITTEN;
}
