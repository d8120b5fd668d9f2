/*
 * Plans, the executor and the plan cache: the builder and finalize (successor
 * lists, dependency counts, rejected cycles and ranges), runs over the sim link
 * (bytes, several runs in flight), failures through a tiny fake link, and the
 * LRU cache with its reference counts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "links/link.h"
#include "reactor/reactor.h"
#include "sched/sched.h"
#include "sim_run.h"

/* Bound on reactor passes in a test: far more than any test needs, never a sleep. */
#define MAX_DRIVES 10000

/* ---- helpers ---- */

typedef struct {
    int ndone;
    hcclResult_t res;
    uint64_t seq;
    char msg[512];
} done_t;

static void on_done(hccl_run_t *run, hcclResult_t res, const char *msg, void *arg)
{
    done_t *d = arg;

    d->ndone++;
    d->res = res;
    d->seq = hccl_exec_run_seq(run);
    snprintf(d->msg, sizeof(d->msg), "%s", msg ? msg : "");
}

/* Drives r until *counter reaches target (true) or the bound is reached (false). */
static bool drive_until(hccl_reactor_t *r, const int *counter, int target)
{
    for (int i = 0; i < MAX_DRIVES && *counter < target; i++)
        hccl_reactor_drive(r, 0);
    return *counter >= target;
}

static void drive_some(hccl_reactor_t *r, int n)
{
    for (int i = 0; i < n; i++)
        hccl_reactor_drive(r, 0);
}

static bool has_succ(const hccl_plan_t *p, uint32_t from, uint32_t to)
{
    const hccl_step_t *s = &p->steps[from];

    for (uint32_t k = 0; k < s->nsucc; k++)
        if (p->succ[s->succ_first + k] == to)
            return true;
    return false;
}

static hccl_plan_t *new_plan(int rank, int nranks)
{
    hccl_plan_t *p = NULL;

    assert_int_equal(hccl_plan_create(rank, nranks, hcclFloat32, hcclSum, "test", &p), hcclSuccess);
    assert_non_null(p);
    return p;
}

/* ---- the builder and finalize ---- */

static void test_finalize_successors(void **state)
{
    hccl_plan_t *p = new_plan(0, 2);
    uint32_t id[5];

    (void)state;
    assert_int_equal(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0), hccl_bref(HCCL_SLOT_SEND, 0), 16,
                                    &id[0]), hcclSuccess);
    assert_int_equal(hccl_plan_send(p, 1, 7, hccl_bref(HCCL_SLOT_SEND, 0), 16, &id[1]), hcclSuccess);
    assert_int_equal(hccl_plan_recv(p, 1, 7, hccl_bref(HCCL_SLOT_SCRATCH, 0), 16, &id[2]), hcclSuccess);
    assert_int_equal(hccl_plan_reduce(p, hccl_bref(HCCL_SLOT_RECV, 0), hccl_bref(HCCL_SLOT_RECV, 0),
                                      hccl_bref(HCCL_SLOT_SCRATCH, 0), 16, HCCL_STEP_FINAL_DIV, &id[3]),
                     hcclSuccess);
    assert_int_equal(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 16), hccl_bref(HCCL_SLOT_RECV, 0), 16,
                                    &id[4]), hcclSuccess);
    for (uint32_t i = 0; i < 5; i++)
        assert_int_equal(id[i], i);
    p->scratch_bytes = 16;
    /* 0 -> {1, 2, 3}, 1 -> 4, 2 -> 3, 3 -> 4 */
    assert_int_equal(hccl_plan_dep(p, 0, 1), hcclSuccess);
    assert_int_equal(hccl_plan_dep(p, 0, 2), hcclSuccess);
    assert_int_equal(hccl_plan_dep(p, 2, 3), hcclSuccess);
    assert_int_equal(hccl_plan_dep(p, 0, 3), hcclSuccess);
    assert_int_equal(hccl_plan_dep(p, 1, 4), hcclSuccess);
    assert_int_equal(hccl_plan_dep(p, 3, 4), hcclSuccess);
    /* Bad edges are refused while building. */
    assert_int_not_equal(hccl_plan_dep(p, 2, 2), hcclSuccess);
    assert_int_not_equal(hccl_plan_dep(p, 0, 5), hcclSuccess);
    assert_int_not_equal(hccl_plan_dep(p, 9, 0), hcclSuccess);

    assert_int_equal(hccl_plan_finalize(p, 16, 32), hcclSuccess);
    assert_true(p->final);
    assert_int_equal(p->nsteps, 5);

    static const uint32_t ndeps[5] = {0, 1, 1, 2, 2};
    static const uint32_t nsucc[5] = {3, 1, 1, 1, 0};
    for (uint32_t i = 0; i < 5; i++) {
        assert_int_equal(p->steps[i].ndeps, ndeps[i]);
        assert_int_equal(p->steps[i].nsucc, nsucc[i]);
    }
    assert_true(has_succ(p, 0, 1) && has_succ(p, 0, 2) && has_succ(p, 0, 3));
    assert_true(has_succ(p, 1, 4));
    assert_true(has_succ(p, 2, 3));
    assert_true(has_succ(p, 3, 4));
    assert_false(has_succ(p, 2, 4));
    /* The lists tile p->succ without overlap. */
    uint32_t total = 0;
    for (uint32_t i = 0; i < 5; i++) {
        assert_int_equal(p->steps[i].succ_first, total);
        total += p->steps[i].nsucc;
    }
    assert_int_equal(total, 6);
    /* Step fields are kept. */
    assert_int_equal(p->steps[1].kind, HCCL_STEP_SEND);
    assert_int_equal(p->steps[1].peer, 1);
    assert_int_equal(p->steps[1].tag, 7);
    assert_int_equal(p->steps[3].kind, HCCL_STEP_REDUCE);
    assert_int_equal(p->steps[3].flags, HCCL_STEP_FINAL_DIV);
    /* Nothing is added after finalize. */
    assert_int_not_equal(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0), hccl_bref(HCCL_SLOT_SEND, 0),
                                        4, NULL), hcclSuccess);
    assert_int_equal(p->nsteps, 5);
    hccl_plan_release(p);
}

/*
 * finalize marks the receives a send reads again (same slot, overlapping bytes; never through
 * SEND), records the buffer sizes and counts the sends.
 */
static void test_finalize_forwarded(void **state)
{
    hccl_plan_t *p = new_plan(0, 3);
    uint32_t r[7], sid;

    (void)state;
    /* Received into RECV 0..16, 16..32, 32..48, 48..64; SCRATCH 0..16 and 16..32. */
    for (uint32_t i = 0; i < 4; i++)
        assert_int_equal(hccl_plan_recv(p, 1, i, hccl_bref(HCCL_SLOT_RECV, 16 * i), 16, &r[i]), hcclSuccess);
    assert_int_equal(hccl_plan_recv(p, 1, 4, hccl_bref(HCCL_SLOT_SCRATCH, 0), 16, &r[4]), hcclSuccess);
    assert_int_equal(hccl_plan_recv(p, 1, 5, hccl_bref(HCCL_SLOT_SCRATCH, 16), 16, &r[5]), hcclSuccess);
    /* Sent on: RECV 20..24 (inside the second), SCRATCH 15..17 (the edges of both), and SEND
     * 0..64, which is the caller's input whatever the offsets. */
    assert_int_equal(hccl_plan_send(p, 2, 0, hccl_bref(HCCL_SLOT_RECV, 20), 4, &sid), hcclSuccess);
    assert_int_equal(hccl_plan_send(p, 2, 1, hccl_bref(HCCL_SLOT_SCRATCH, 15), 2, &sid), hcclSuccess);
    assert_int_equal(hccl_plan_send(p, 2, 2, hccl_bref(HCCL_SLOT_SEND, 0), 64, &sid), hcclSuccess);
    /* RECV 40..48: inside the third, ending where the fourth begins. */
    assert_int_equal(hccl_plan_send(p, 2, 3, hccl_bref(HCCL_SLOT_RECV, 40), 8, &sid), hcclSuccess);
    /* RECV 100..116 lies inside a long send (64..128) that starts before a short one (70..72)
     * which ends before it: the search must remember the furthest end. */
    assert_int_equal(hccl_plan_recv(p, 1, 6, hccl_bref(HCCL_SLOT_RECV, 100), 16, &r[6]), hcclSuccess);
    assert_int_equal(hccl_plan_send(p, 2, 4, hccl_bref(HCCL_SLOT_RECV, 64), 64, &sid), hcclSuccess);
    assert_int_equal(hccl_plan_send(p, 2, 5, hccl_bref(HCCL_SLOT_RECV, 70), 2, &sid), hcclSuccess);
    p->scratch_bytes = 32;
    assert_int_equal(hccl_plan_finalize(p, 64, 128), hcclSuccess);
    assert_int_equal(p->send_bytes, 64);
    assert_int_equal(p->recv_bytes, 128);
    assert_int_equal(p->nsends, 6);
    assert_false(p->steps[r[0]].flags & HCCL_STEP_FORWARDED);
    assert_true(p->steps[r[1]].flags & HCCL_STEP_FORWARDED);
    assert_true(p->steps[r[2]].flags & HCCL_STEP_FORWARDED);
    assert_false(p->steps[r[3]].flags & HCCL_STEP_FORWARDED);
    assert_true(p->steps[r[4]].flags & HCCL_STEP_FORWARDED);
    assert_true(p->steps[r[5]].flags & HCCL_STEP_FORWARDED);
    assert_true(p->steps[r[6]].flags & HCCL_STEP_FORWARDED);
    hccl_plan_release(p);
}

static void test_finalize_many_steps(void **state)
{
    /* A chain longer than the initial capacities (64 steps, 128 edges) grows them. */
    hccl_plan_t *p = new_plan(0, 1);
    const uint32_t n = 300;

    (void)state;
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0), hccl_bref(HCCL_SLOT_SEND, 0),
                                        8, NULL), hcclSuccess);
    for (uint32_t i = 0; i + 1 < n; i++)
        assert_int_equal(hccl_plan_dep(p, i, i + 1), hcclSuccess);
    assert_int_equal(hccl_plan_finalize(p, 8, 8), hcclSuccess);
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(p->steps[i].ndeps, i ? 1 : 0);
        assert_int_equal(p->steps[i].nsucc, i + 1 < n ? 1 : 0);
        if (i + 1 < n)
            assert_true(has_succ(p, i, i + 1));
    }
    hccl_plan_release(p);
}

static void test_finalize_rejects_cycle(void **state)
{
    (void)state;
    /* A cycle through every step (nothing is ready) and one behind a valid root. */
    for (int variant = 0; variant < 2; variant++) {
        hccl_plan_t *p = new_plan(0, 1);
        for (int i = 0; i < 4; i++)
            assert_int_equal(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0),
                                            hccl_bref(HCCL_SLOT_SEND, 0), 8, NULL), hcclSuccess);
        if (variant == 0) {
            assert_int_equal(hccl_plan_dep(p, 0, 1), hcclSuccess);
            assert_int_equal(hccl_plan_dep(p, 1, 2), hcclSuccess);
            assert_int_equal(hccl_plan_dep(p, 2, 3), hcclSuccess);
            assert_int_equal(hccl_plan_dep(p, 3, 0), hcclSuccess);
        } else {
            assert_int_equal(hccl_plan_dep(p, 0, 1), hcclSuccess);
            assert_int_equal(hccl_plan_dep(p, 1, 2), hcclSuccess);
            assert_int_equal(hccl_plan_dep(p, 2, 3), hcclSuccess);
            assert_int_equal(hccl_plan_dep(p, 3, 1), hcclSuccess);
        }
        assert_int_equal(hccl_plan_finalize(p, 8, 8), hcclInternalError);
        assert_non_null(strstr(hccl_error_last(), "cycle"));
        hccl_plan_release(p);
    }
}

typedef enum { B_SEND, B_RECV, B_COPY, B_REDUCE } build_kind_t;

/* Finalizes a one-step plan (send 64, recv 128, scratch 32 bytes) and returns the result. */
static hcclResult_t finalize_one(build_kind_t kind, int peer, hccl_bref_t dst, hccl_bref_t src,
                                 hccl_bref_t src2, size_t bytes)
{
    hccl_plan_t *p = new_plan(0, 2);
    hcclResult_t res;

    p->scratch_bytes = 32;
    switch (kind) {
    case B_SEND: res = hccl_plan_send(p, peer, 0, src, bytes, NULL); break;
    case B_RECV: res = hccl_plan_recv(p, peer, 0, dst, bytes, NULL); break;
    case B_COPY: res = hccl_plan_copy(p, dst, src, bytes, NULL); break;
    default: res = hccl_plan_reduce(p, dst, src, src2, bytes, 0, NULL); break;
    }
    assert_int_equal(res, hcclSuccess);
    res = hccl_plan_finalize(p, 64, 128);
    hccl_plan_release(p);
    return res;
}

static void test_finalize_rejects_ranges(void **state)
{
    const hccl_bref_t s0 = hccl_bref(HCCL_SLOT_SEND, 0);
    const hccl_bref_t r0 = hccl_bref(HCCL_SLOT_RECV, 0);
    const hccl_bref_t k0 = hccl_bref(HCCL_SLOT_SCRATCH, 0);

    (void)state;
    /* Exactly filling a slot is fine. */
    assert_int_equal(finalize_one(B_SEND, 1, r0, hccl_bref(HCCL_SLOT_SEND, 32), s0, 32), hcclSuccess);
    assert_int_equal(finalize_one(B_RECV, 1, hccl_bref(HCCL_SLOT_RECV, 100), s0, s0, 28), hcclSuccess);
    assert_int_equal(finalize_one(B_COPY, -1, hccl_bref(HCCL_SLOT_SCRATCH, 16), s0, s0, 16),
                     hcclSuccess);
    assert_int_equal(finalize_one(B_REDUCE, -1, r0, s0, hccl_bref(HCCL_SLOT_SCRATCH, 0), 32),
                     hcclSuccess);
    assert_int_equal(finalize_one(B_RECV, 1, hccl_bref(HCCL_SLOT_RECV, 128), s0, s0, 0), hcclSuccess);

    /* offset + bytes beyond the slot, per kind and per operand. */
    assert_int_equal(finalize_one(B_SEND, 1, r0, hccl_bref(HCCL_SLOT_SEND, 33), s0, 32),
                     hcclInternalError);
    assert_int_equal(finalize_one(B_SEND, 1, r0, s0, s0, 65), hcclInternalError);
    assert_int_equal(finalize_one(B_RECV, 1, hccl_bref(HCCL_SLOT_RECV, 101), s0, s0, 28),
                     hcclInternalError);
    assert_int_equal(finalize_one(B_COPY, -1, hccl_bref(HCCL_SLOT_SCRATCH, 17), s0, s0, 16),
                     hcclInternalError);
    assert_int_equal(finalize_one(B_COPY, -1, r0, hccl_bref(HCCL_SLOT_SEND, 60), s0, 8),
                     hcclInternalError);
    assert_int_equal(finalize_one(B_REDUCE, -1, r0, s0, hccl_bref(HCCL_SLOT_SCRATCH, 1), 32),
                     hcclInternalError);
    assert_int_equal(finalize_one(B_REDUCE, -1, r0, hccl_bref(HCCL_SLOT_SEND, 40), k0, 32),
                     hcclInternalError);
    assert_int_equal(finalize_one(B_REDUCE, -1, hccl_bref(HCCL_SLOT_RECV, 120), s0, k0, 16),
                     hcclInternalError);
    /* An offset past the end even with nothing to move; sizes that would wrap around. */
    assert_int_equal(finalize_one(B_RECV, 1, hccl_bref(HCCL_SLOT_RECV, 129), s0, s0, 0),
                     hcclInternalError);
    assert_int_equal(finalize_one(B_SEND, 1, r0, hccl_bref(HCCL_SLOT_SEND, 8), s0, SIZE_MAX - 4),
                     hcclInternalError);
    assert_int_equal(finalize_one(B_SEND, 1, r0, hccl_bref(HCCL_SLOT_SEND, SIZE_MAX - 4), s0, 8),
                     hcclInternalError);
    /* A plan without scratch cannot use it. */
    {
        hccl_plan_t *p = new_plan(0, 2);
        assert_int_equal(hccl_plan_recv(p, 1, 0, k0, 4, NULL), hcclSuccess);
        assert_int_equal(hccl_plan_finalize(p, 64, 64), hcclInternalError);
        hccl_plan_release(p);
    }
    /* No such slot; peers out of range. */
    assert_int_equal(finalize_one(B_COPY, -1, r0, hccl_bref((hccl_slot_t)HCCL_NUM_SLOTS, 0), s0, 4),
                     hcclInternalError);
    assert_int_equal(finalize_one(B_SEND, 2, r0, s0, s0, 4), hcclInternalError);
    assert_int_equal(finalize_one(B_RECV, -1, r0, s0, s0, 4), hcclInternalError);
}

static void test_finalize_rejects_writes_to_send(void **state)
{
    const hccl_bref_t s0 = hccl_bref(HCCL_SLOT_SEND, 0);
    const hccl_bref_t r0 = hccl_bref(HCCL_SLOT_RECV, 0);

    (void)state;
    assert_int_equal(finalize_one(B_RECV, 1, s0, s0, s0, 16), hcclInternalError);
    assert_int_equal(finalize_one(B_COPY, -1, s0, r0, r0, 16), hcclInternalError);
    assert_int_equal(finalize_one(B_REDUCE, -1, s0, r0, r0, 16), hcclInternalError);
    /* Reading it is fine. */
    assert_int_equal(finalize_one(B_COPY, -1, r0, s0, s0, 16), hcclSuccess);
}

/* ---- the executor over the sim link ---- */

typedef struct {
    hccl_reactor_t *r;
    hccl_sim_world_t *w;
    hccl_exec_t *ex[2];
} sim2_t;

static void sim2_init(sim2_t *s)
{
    memset(s, 0, sizeof(*s));
    assert_int_equal(hccl_reactor_create(NULL, -1, &s->r), hcclSuccess);
    assert_int_equal(hccl_sim_world_create(s->r, 2, &s->w), hcclSuccess);
    for (int i = 0; i < 2; i++)
        assert_int_equal(hccl_exec_create(s->r, i, 2, hccl_sim_world_conns(s->w, i), &s->ex[i]),
                         hcclSuccess);
}

static void sim2_fini(sim2_t *s)
{
    for (int i = 0; i < 2; i++)
        hccl_exec_destroy(s->ex[i]);
    hccl_sim_world_destroy(s->w);
    hccl_reactor_destroy(s->r);
}

#define AVG_COUNT 10000 /* chunks of 10000 bytes: the sim link consumes 4096 at a time */
#define AVG_CHUNKS 4

/*
 * rank r of 2, hcclAvg over float32 in AVG_CHUNKS chunks:
 * copy(recv <- send), send(send) / recv(scratch), reduce(recv = recv + scratch, FINAL_DIV).
 */
static hccl_plan_t *build_avg_plan(int rank)
{
    const size_t bytes = AVG_COUNT * sizeof(float);
    const size_t chunk = bytes / AVG_CHUNKS;
    hccl_plan_t *p = NULL;

    assert_int_equal(hccl_plan_create(rank, 2, hcclFloat32, hcclAvg, "test-avg", &p), hcclSuccess);
    p->scratch_bytes = bytes;
    for (uint32_t c = 0; c < AVG_CHUNKS; c++) {
        size_t off = c * chunk;
        uint32_t cp, sd, rv, rd;
        assert_int_equal(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, off),
                                        hccl_bref(HCCL_SLOT_SEND, off), chunk, &cp), hcclSuccess);
        assert_int_equal(hccl_plan_send(p, 1 - rank, 100 + c, hccl_bref(HCCL_SLOT_SEND, off), chunk,
                                        &sd), hcclSuccess);
        assert_int_equal(hccl_plan_recv(p, 1 - rank, 100 + c, hccl_bref(HCCL_SLOT_SCRATCH, off),
                                        chunk, &rv), hcclSuccess);
        assert_int_equal(hccl_plan_reduce(p, hccl_bref(HCCL_SLOT_RECV, off),
                                          hccl_bref(HCCL_SLOT_RECV, off),
                                          hccl_bref(HCCL_SLOT_SCRATCH, off), chunk,
                                          HCCL_STEP_FINAL_DIV, &rd), hcclSuccess);
        assert_int_equal(hccl_plan_dep(p, cp, rd), hcclSuccess);
        assert_int_equal(hccl_plan_dep(p, rv, rd), hcclSuccess);
    }
    assert_int_equal(hccl_plan_finalize(p, bytes, bytes), hcclSuccess);
    return p;
}

static float avg_input(int rank, int i, int run)
{
    /* Integers, so that the average is exact: 2i and 4i + 2 average to 3i + 1. */
    return rank == 0 ? (float)(2 * i + run) : (float)(4 * i + 2 + run);
}

/*
 * Twice: receives fused with their reduce where the plan allows it (the default), and stored in
 * scratch then reduced (hccl_exec_set_recv_reduce off). Both give the exact average.
 */
static void exec_avg_two_ranks(bool fused)
{
    sim2_t s;
    hccl_plan_t *plan[2];
    float *sendbuf[2], *recvbuf[2];
    done_t d[2];
    int ndone = 0;

    sim2_init(&s);
    for (int r = 0; r < 2; r++)
        hccl_exec_set_recv_reduce(s.ex[r], fused);
    memset(d, 0, sizeof(d));
    for (int r = 0; r < 2; r++) {
        plan[r] = build_avg_plan(r);
        sendbuf[r] = malloc(AVG_COUNT * sizeof(float));
        recvbuf[r] = malloc(AVG_COUNT * sizeof(float));
        assert_non_null(sendbuf[r]);
        assert_non_null(recvbuf[r]);
        for (int i = 0; i < AVG_COUNT; i++) {
            sendbuf[r][i] = avg_input(r, i, 0);
            recvbuf[r][i] = -12345.0f;
        }
    }
    for (int r = 0; r < 2; r++) {
        assert_int_equal(hccl_exec_start(s.ex[r], plan[r], 5, sendbuf[r], recvbuf[r], on_done, &d[r],
                                         NULL), hcclSuccess);
        assert_int_equal(d[r].ndone, 0); /* never from inside start */
        assert_int_equal(hccl_exec_inflight(s.ex[r]), 1);
    }
    for (int i = 0; i < MAX_DRIVES && d[0].ndone + d[1].ndone < 2; i++)
        hccl_reactor_drive(s.r, 0);
    ndone = d[0].ndone + d[1].ndone;
    assert_int_equal(ndone, 2);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(d[r].ndone, 1);
        assert_int_equal(d[r].res, hcclSuccess);
        assert_int_equal(d[r].seq, 5);
        assert_int_equal(hccl_exec_inflight(s.ex[r]), 0);
        for (int i = 0; i < AVG_COUNT; i++) {
            assert_true(recvbuf[r][i] == (float)(3 * i + 1));
            assert_true(sendbuf[r][i] == avg_input(r, i, 0)); /* the send buffer is only read */
        }
        assert_int_equal(hccl_sim_bytes_sent(s.w, r), AVG_COUNT * sizeof(float));
        /* A receive fuses once its reduce waits on nothing else: the copies run first. */
        if (fused)
            assert_true(hccl_exec_fused_recvs(s.ex[r]) > 0);
        else
            assert_int_equal(hccl_exec_fused_recvs(s.ex[r]), 0);
    }
    drive_some(s.r, 3);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(d[r].ndone, 1);
        hccl_plan_release(plan[r]);
        free(sendbuf[r]);
        free(recvbuf[r]);
    }
    sim2_fini(&s);
}

static void test_exec_avg_two_ranks(void **state)
{
    (void)state;
    exec_avg_two_ranks(true);
    exec_avg_two_ranks(false);
}

#define NRUNS 4

static void test_exec_runs_in_flight(void **state)
{
    sim2_t s;
    hccl_plan_t *plan[2];
    float *sendbuf[2][NRUNS], *recvbuf[2][NRUNS];
    done_t d[2][NRUNS];

    (void)state;
    sim2_init(&s);
    memset(d, 0, sizeof(d));
    for (int r = 0; r < 2; r++) {
        plan[r] = build_avg_plan(r);
        for (int k = 0; k < NRUNS; k++) {
            sendbuf[r][k] = malloc(AVG_COUNT * sizeof(float));
            recvbuf[r][k] = calloc(AVG_COUNT, sizeof(float));
            assert_non_null(sendbuf[r][k]);
            assert_non_null(recvbuf[r][k]);
            for (int i = 0; i < AVG_COUNT; i++)
                sendbuf[r][k][i] = avg_input(r, i, 2 * k); /* average 3i + 1 + 2k */
        }
    }
    /* Rank 0 posts seq 10..13; every run shares the one plan. */
    for (int k = 0; k < NRUNS; k++)
        assert_int_equal(hccl_exec_start(s.ex[0], plan[0], 10 + (uint64_t)k, sendbuf[0][k],
                                         recvbuf[0][k], on_done, &d[0][k], NULL), hcclSuccess);
    assert_int_equal(hccl_exec_inflight(s.ex[0]), NRUNS);
    assert_int_equal(atomic_load(&plan[0]->refs), 1 + NRUNS);
    drive_some(s.r, 5);
    for (int k = 0; k < NRUNS; k++)
        assert_int_equal(d[0][k].ndone, 0); /* the sim link holds sends until a receive comes */

    /* Rank 1 posts in reverse order; the newest run completes alone first. */
    assert_int_equal(hccl_exec_start(s.ex[1], plan[1], 10 + NRUNS - 1, sendbuf[1][NRUNS - 1],
                                     recvbuf[1][NRUNS - 1], on_done, &d[1][NRUNS - 1], NULL),
                     hcclSuccess);
    assert_true(drive_until(s.r, &d[0][NRUNS - 1].ndone, 1));
    assert_true(drive_until(s.r, &d[1][NRUNS - 1].ndone, 1));
    assert_int_equal(hccl_exec_inflight(s.ex[0]), NRUNS - 1);
    assert_int_equal(hccl_exec_inflight(s.ex[1]), 0);
    for (int k = 0; k < NRUNS - 1; k++)
        assert_int_equal(d[0][k].ndone, 0);
    for (int k = NRUNS - 2; k >= 0; k--)
        assert_int_equal(hccl_exec_start(s.ex[1], plan[1], 10 + (uint64_t)k, sendbuf[1][k],
                                         recvbuf[1][k], on_done, &d[1][k], NULL), hcclSuccess);
    assert_int_equal(hccl_exec_inflight(s.ex[1]), NRUNS - 1);
    for (int k = 0; k < NRUNS; k++) {
        assert_true(drive_until(s.r, &d[0][k].ndone, 1));
        assert_true(drive_until(s.r, &d[1][k].ndone, 1));
    }
    drive_some(s.r, 3);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(hccl_exec_inflight(s.ex[r]), 0);
        for (int k = 0; k < NRUNS; k++) {
            assert_int_equal(d[r][k].ndone, 1);
            assert_int_equal(d[r][k].res, hcclSuccess);
            assert_int_equal(d[r][k].seq, 10 + (uint64_t)k);
            for (int i = 0; i < AVG_COUNT; i++)
                assert_true(recvbuf[r][k][i] == (float)(3 * i + 1 + 2 * k));
        }
    }
    assert_int_equal(atomic_load(&plan[0]->refs), 1);
    assert_int_equal(atomic_load(&plan[1]->refs), 1);
    for (int r = 0; r < 2; r++) {
        hccl_plan_release(plan[r]);
        for (int k = 0; k < NRUNS; k++) {
            free(sendbuf[r][k]);
            free(recvbuf[r][k]);
        }
    }
    sim2_fini(&s);
}

/* Above the scratch a pooled run keeps (8 MiB): the executor's one big scratch. */
#define BIG_SCRATCH ((size_t)9 << 20)

/* rank r of 2: copy(scratch <- send), then send(scratch) / recv(recv): RECV gets the peer's SEND. */
static hccl_plan_t *build_via_scratch_plan(int rank)
{
    hccl_plan_t *p = new_plan(rank, 2);
    uint32_t cp, sd;

    p->scratch_bytes = BIG_SCRATCH;
    assert_int_equal(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_SCRATCH, 0), hccl_bref(HCCL_SLOT_SEND, 0),
                                    BIG_SCRATCH, &cp), hcclSuccess);
    assert_int_equal(hccl_plan_send(p, 1 - rank, 1, hccl_bref(HCCL_SLOT_SCRATCH, 0), BIG_SCRATCH,
                                    &sd), hcclSuccess);
    assert_int_equal(hccl_plan_dep(p, cp, sd), hcclSuccess);
    assert_int_equal(hccl_plan_recv(p, 1 - rank, 1, hccl_bref(HCCL_SLOT_RECV, 0), BIG_SCRATCH, NULL),
                     hcclSuccess);
    assert_int_equal(hccl_plan_finalize(p, BIG_SCRATCH, BIG_SCRATCH), hcclSuccess);
    return p;
}

/*
 * A large scratch is kept for the next run (no allocation, so no page faults, the second
 * time), and two runs in flight at once never share it: the second gets one of its own.
 */
static void test_exec_big_scratch(void **state)
{
    sim2_t s;
    hccl_plan_t *plan[2];
    unsigned char *sendbuf[2][3], *recvbuf[2][3];
    done_t d[2][3];

    (void)state;
    sim2_init(&s);
    memset(d, 0, sizeof(d));
    for (int r = 0; r < 2; r++) {
        plan[r] = build_via_scratch_plan(r);
        for (int k = 0; k < 3; k++) {
            sendbuf[r][k] = malloc(BIG_SCRATCH);
            recvbuf[r][k] = calloc(1, BIG_SCRATCH);
            assert_non_null(sendbuf[r][k]);
            assert_non_null(recvbuf[r][k]);
            memset(sendbuf[r][k], 1 + r * 3 + k, BIG_SCRATCH);
        }
    }
    /* Runs 0 and 1 in flight together on rank 0, then on rank 1: rank 0's two sends wait in
     * scratch until rank 1 posts its receives. */
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 2; k++)
            assert_int_equal(hccl_exec_start(s.ex[r], plan[r], 20 + (uint64_t)k, sendbuf[r][k],
                                             recvbuf[r][k], on_done, &d[r][k], NULL), hcclSuccess);
    for (int k = 0; k < 2; k++)
        for (int r = 0; r < 2; r++)
            assert_true(drive_until(s.r, &d[r][k].ndone, 1));
    /* Run 2 finds the big scratch free and allocates nothing at all. */
    for (int r = 0; r < 2; r++) {
        hccl_alloc_fail_at(1);
        assert_int_equal(hccl_exec_start(s.ex[r], plan[r], 22, sendbuf[r][2], recvbuf[r][2], on_done,
                                         &d[r][2], NULL), hcclSuccess);
        hccl_alloc_fail_at(0);
    }
    for (int r = 0; r < 2; r++)
        assert_true(drive_until(s.r, &d[r][2].ndone, 1));
    drive_some(s.r, 3);
    for (int r = 0; r < 2; r++) {
        for (int k = 0; k < 3; k++) {
            unsigned char want = (unsigned char)(1 + (1 - r) * 3 + k);
            assert_int_equal(d[r][k].ndone, 1);
            assert_int_equal(d[r][k].res, hcclSuccess);
            assert_int_equal(recvbuf[r][k][0], want);
            assert_int_equal(recvbuf[r][k][BIG_SCRATCH / 2], want);
            assert_int_equal(recvbuf[r][k][BIG_SCRATCH - 1], want);
            free(sendbuf[r][k]);
            free(recvbuf[r][k]);
        }
        hccl_plan_release(plan[r]);
    }
    sim2_fini(&s);
}

/* An empty plan and a local-only plan still complete through the callback, later. */
static void test_exec_local_only(void **state)
{
    sim2_t s;
    hccl_plan_t *empty = new_plan(0, 2), *local = new_plan(0, 2);
    int32_t in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8] = {0};
    done_t d[2];

    (void)state;
    memset(d, 0, sizeof(d));
    sim2_init(&s);
    assert_int_equal(hccl_plan_finalize(empty, 0, 0), hcclSuccess);
    assert_int_equal(hccl_plan_copy(local, hccl_bref(HCCL_SLOT_RECV, 0), hccl_bref(HCCL_SLOT_SEND, 0),
                                    sizeof(in), NULL), hcclSuccess);
    assert_int_equal(hccl_plan_finalize(local, sizeof(in), sizeof(out)), hcclSuccess);
    assert_int_equal(hccl_exec_start(s.ex[0], empty, 1, NULL, NULL, on_done, &d[0], NULL),
                     hcclSuccess);
    assert_int_equal(hccl_exec_start(s.ex[0], local, 2, in, out, on_done, &d[1], NULL), hcclSuccess);
    assert_int_equal(d[0].ndone + d[1].ndone, 0);
    assert_true(drive_until(s.r, &d[0].ndone, 1));
    assert_true(drive_until(s.r, &d[1].ndone, 1));
    assert_int_equal(d[0].res, hcclSuccess);
    assert_int_equal(d[1].res, hcclSuccess);
    assert_memory_equal(in, out, sizeof(in));
    assert_int_equal(hccl_exec_inflight(s.ex[0]), 0);
    hccl_plan_release(empty);
    hccl_plan_release(local);
    sim2_fini(&s);
}

/* ---- failures through a fake link ---- */

typedef struct {
    hccl_conn_t conn;
    hccl_reactor_t *r;
    bool refuse_send;
    int nsend;
    int nrecv;
    hccl_xfer_t *held[8];   /* posted and not given back */
    int nheld;
} fake_conn_t;

static hcclResult_t fake_post_send(hccl_conn_t *c, hccl_xfer_t *x)
{
    fake_conn_t *f = c->priv;

    f->nsend++;
    if (f->refuse_send)
        return hccl_error_set(hcclRemoteError, "fake link: post_send to rank %d refused", c->peer);
    assert_true(f->nheld < 8);
    f->held[f->nheld++] = x;
    return hcclSuccess;
}

static hcclResult_t fake_post_recv(hccl_conn_t *c, hccl_xfer_t *x)
{
    fake_conn_t *f = c->priv;

    f->nrecv++;
    assert_true(f->nheld < 8);
    f->held[f->nheld++] = x;
    return hcclSuccess;
}

static const hccl_link_ops_t fake_ops = {
    .size = sizeof(hccl_link_ops_t),
    .name = "fake",
    .id = HCCL_LINK_SIM,
    .post_send = fake_post_send,
    .post_recv = fake_post_recv,
};

static void fake_init(fake_conn_t *f, hccl_reactor_t *r, int peer)
{
    memset(f, 0, sizeof(*f));
    f->conn.ops = &fake_ops;
    f->conn.peer = peer;
    f->conn.priv = f;
    f->r = r;
}

/* Gives back every held transfer with res (from the loop, as a link must). */
static void fake_give_back(fake_conn_t *f, hcclResult_t res)
{
    for (int i = 0; i < f->nheld; i++)
        hccl_xfer_complete_later(f->r, f->held[i], res);
    f->nheld = 0;
}

static void test_exec_post_failure(void **state)
{
    hccl_reactor_t *r = NULL;
    hccl_exec_t *ex = NULL;
    fake_conn_t fake;
    hccl_conn_t *conns[2];
    hccl_plan_t *p = new_plan(0, 2);
    char in[32], out[32];
    uint32_t cp, sd;
    done_t d;

    (void)state;
    memset(&d, 0, sizeof(d));
    memset(in, 7, sizeof(in));
    assert_int_equal(hccl_reactor_create(NULL, -1, &r), hcclSuccess);
    fake_init(&fake, r, 1);
    fake.refuse_send = true;
    conns[0] = NULL;
    conns[1] = &fake.conn;
    assert_int_equal(hccl_exec_create(r, 0, 2, conns, &ex), hcclSuccess);
    assert_int_equal(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0), hccl_bref(HCCL_SLOT_SEND, 0),
                                    sizeof(in), &cp), hcclSuccess);
    assert_int_equal(hccl_plan_send(p, 1, 3, hccl_bref(HCCL_SLOT_SEND, 0), sizeof(in), &sd),
                     hcclSuccess);
    assert_int_equal(hccl_plan_dep(p, cp, sd), hcclSuccess);
    assert_int_equal(hccl_plan_finalize(p, sizeof(in), sizeof(out)), hcclSuccess);

    assert_int_equal(hccl_exec_start(ex, p, 42, in, out, on_done, &d, NULL), hcclSuccess);
    assert_int_equal(fake.nsend, 1); /* issued inside start */
    assert_int_equal(d.ndone, 0);     /* but reported only from the loop */
    assert_int_equal(hccl_exec_inflight(ex), 1);
    assert_true(drive_until(r, &d.ndone, 1));
    assert_int_equal(d.res, hcclRemoteError);
    assert_non_null(strstr(d.msg, "refused"));
    assert_int_equal(d.seq, 42);
    assert_int_equal(hccl_exec_inflight(ex), 0);
    drive_some(r, 3);
    assert_int_equal(d.ndone, 1);

    /*
     * A failing post after another transfer is already with the link: the run ends only once
     * the link gave that one back, with the first error.
     */
    hccl_plan_t *p2 = new_plan(0, 2);
    done_t d2;
    memset(&d2, 0, sizeof(d2));
    assert_int_equal(hccl_plan_recv(p2, 1, 1, hccl_bref(HCCL_SLOT_RECV, 0), 8, NULL), hcclSuccess);
    assert_int_equal(hccl_plan_send(p2, 1, 2, hccl_bref(HCCL_SLOT_SEND, 0), 8, NULL), hcclSuccess);
    assert_int_equal(hccl_plan_finalize(p2, sizeof(in), sizeof(out)), hcclSuccess);
    fake.nsend = fake.nrecv = 0;
    assert_int_equal(hccl_exec_start(ex, p2, 43, in, out, on_done, &d2, NULL), hcclSuccess);
    assert_int_equal(fake.nrecv, 1);
    assert_int_equal(fake.nsend, 1);
    assert_int_equal(fake.nheld, 1);
    drive_some(r, 10);
    assert_int_equal(d2.ndone, 0);
    assert_int_equal(hccl_exec_inflight(ex), 1);
    fake_give_back(&fake, hcclAborted);
    assert_true(drive_until(r, &d2.ndone, 1));
    assert_int_equal(d2.res, hcclRemoteError);
    assert_non_null(strstr(d2.msg, "refused"));
    assert_int_equal(hccl_exec_inflight(ex), 0);

    hccl_plan_release(p);
    hccl_plan_release(p2);
    hccl_exec_destroy(ex);
    hccl_reactor_destroy(r);
}

static void test_exec_fail_all_waits_for_link(void **state)
{
    hccl_reactor_t *r = NULL;
    hccl_exec_t *ex = NULL;
    fake_conn_t fake;
    hccl_conn_t *conns[2];
    hccl_plan_t *p = new_plan(0, 2);
    char in[16] = {0}, out[16];
    hccl_run_t *run = NULL;
    char peers[32];
    done_t d, dlocal;

    (void)state;
    memset(&d, 0, sizeof(d));
    memset(&dlocal, 0, sizeof(dlocal));
    assert_int_equal(hccl_reactor_create(NULL, -1, &r), hcclSuccess);
    fake_init(&fake, r, 1);
    conns[0] = NULL;
    conns[1] = &fake.conn;
    assert_int_equal(hccl_exec_create(r, 0, 2, conns, &ex), hcclSuccess);
    assert_int_equal(hccl_plan_recv(p, 1, 9, hccl_bref(HCCL_SLOT_RECV, 0), sizeof(out), NULL),
                     hcclSuccess);
    assert_int_equal(hccl_plan_finalize(p, sizeof(in), sizeof(out)), hcclSuccess);
    assert_int_equal(hccl_exec_start(ex, p, 77, in, out, on_done, &d, &run), hcclSuccess);
    assert_non_null(run);
    assert_int_equal(hccl_exec_run_seq(run), 77);
    assert_int_equal(fake.nheld, 1);
    drive_some(r, 10);
    assert_int_equal(d.ndone, 0);
    hccl_exec_run_pending_peers(run, peers, sizeof(peers));
    assert_string_equal(peers, "1");

    hccl_exec_fail_all(ex, hcclTimeout, "test: gave up waiting");
    drive_some(r, 10);
    /* The receive is still with the link: the run must not end (nor free its transfer) yet. */
    assert_int_equal(d.ndone, 0);
    assert_int_equal(hccl_exec_inflight(ex), 1);

    fake_give_back(&fake, hcclAborted);
    assert_true(drive_until(r, &d.ndone, 1));
    assert_int_equal(d.res, hcclTimeout);
    assert_string_equal(d.msg, "test: gave up waiting");
    assert_int_equal(hccl_exec_inflight(ex), 0);
    drive_some(r, 3);
    assert_int_equal(d.ndone, 1);

    /* fail_all with nothing in flight is a no-op. */
    hccl_exec_fail_all(ex, hcclTimeout, "nothing");
    assert_int_equal(hccl_exec_inflight(ex), 0);

    hccl_plan_release(p);
    hccl_exec_destroy(ex);
    hccl_reactor_destroy(r);
}

/* ---- the plan cache ---- */

static hccl_plan_key_t key_of(size_t count)
{
    hccl_plan_key_t k;

    memset(&k, 0, sizeof(k));
    k.coll = 1;
    k.algo = 2;
    k.count = count;
    k.dtype = hcclFloat32;
    k.op = hcclSum;
    k.root = -1;
    return k;
}

static hccl_plan_t *small_plan(void)
{
    hccl_plan_t *p = new_plan(0, 1);

    assert_int_equal(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0), hccl_bref(HCCL_SLOT_SEND, 0), 4,
                                    NULL), hcclSuccess);
    assert_int_equal(hccl_plan_finalize(p, 4, 4), hcclSuccess);
    return p;
}

static void test_cache_hit_miss(void **state)
{
    hccl_plan_cache_t *c = NULL;
    hccl_plan_key_t k1 = key_of(100), k;
    hccl_plan_t *p = small_plan(), *got;

    (void)state;
    assert_int_equal(hccl_plan_cache_create(4, &c), hcclSuccess);
    assert_null(hccl_plan_cache_get(c, &k1));
    assert_int_equal(hccl_plan_cache_put(c, &k1, p), hcclSuccess);
    assert_int_equal(atomic_load(&p->refs), 2);
    got = hccl_plan_cache_get(c, &k1);
    assert_ptr_equal(got, p);
    assert_int_equal(atomic_load(&p->refs), 3);
    hccl_plan_release(got);
    /* Every field of the key counts. */
    k = k1; k.coll++;  assert_null(hccl_plan_cache_get(c, &k));
    k = k1; k.algo++;  assert_null(hccl_plan_cache_get(c, &k));
    k = k1; k.count++; assert_null(hccl_plan_cache_get(c, &k));
    k = k1; k.dtype++; assert_null(hccl_plan_cache_get(c, &k));
    k = k1; k.op++;    assert_null(hccl_plan_cache_get(c, &k));
    k = k1; k.root++;  assert_null(hccl_plan_cache_get(c, &k));
    assert_int_equal(atomic_load(&p->refs), 2);
    hccl_plan_release(p);
    hccl_plan_cache_destroy(c);
    hccl_plan_cache_destroy(NULL);
}

static void test_cache_lru_eviction(void **state)
{
    hccl_plan_cache_t *c = NULL;
    hccl_plan_key_t ka = key_of(1), kb = key_of(2), kc = key_of(3), kd = key_of(4);
    hccl_plan_t *pa = small_plan(), *pb = small_plan(), *pc = small_plan(), *pd = small_plan();
    hccl_plan_t *got;

    (void)state;
    assert_int_equal(hccl_plan_cache_create(2, &c), hcclSuccess);
    assert_int_equal(hccl_plan_cache_put(c, &ka, pa), hcclSuccess);
    assert_int_equal(hccl_plan_cache_put(c, &kb, pb), hcclSuccess);
    /* a is used after b: b is the least recently used. */
    got = hccl_plan_cache_get(c, &ka);
    assert_ptr_equal(got, pa);
    hccl_plan_release(got);
    assert_int_equal(hccl_plan_cache_put(c, &kc, pc), hcclSuccess);
    assert_null(hccl_plan_cache_get(c, &kb));
    assert_int_equal(atomic_load(&pb->refs), 1); /* the cache let go of b */
    got = hccl_plan_cache_get(c, &ka);
    assert_ptr_equal(got, pa);
    hccl_plan_release(got);
    got = hccl_plan_cache_get(c, &kc);
    assert_ptr_equal(got, pc);
    hccl_plan_release(got);
    /* Now a is the least recently used. */
    assert_int_equal(hccl_plan_cache_put(c, &kd, pd), hcclSuccess);
    assert_null(hccl_plan_cache_get(c, &ka));
    got = hccl_plan_cache_get(c, &kc);
    assert_ptr_equal(got, pc);
    hccl_plan_release(got);
    got = hccl_plan_cache_get(c, &kd);
    assert_ptr_equal(got, pd);
    hccl_plan_release(got);
    assert_int_equal(atomic_load(&pa->refs), 1);
    assert_int_equal(atomic_load(&pc->refs), 2);
    assert_int_equal(atomic_load(&pd->refs), 2);
    hccl_plan_release(pa);
    hccl_plan_release(pb);
    hccl_plan_release(pc);
    hccl_plan_release(pd);
    hccl_plan_cache_destroy(c); /* frees c and d */
}

static void test_cache_evicted_plan_stays_valid(void **state)
{
    hccl_plan_cache_t *c = NULL;
    hccl_plan_key_t ka = key_of(10), kb = key_of(20), kc = key_of(30);
    hccl_plan_t *p, *held;

    (void)state;
    assert_int_equal(hccl_plan_cache_create(2, &c), hcclSuccess);
    p = small_plan();
    assert_int_equal(hccl_plan_cache_put(c, &ka, p), hcclSuccess);
    hccl_plan_release(p); /* only the cache holds it now */
    held = hccl_plan_cache_get(c, &ka);
    assert_non_null(held);
    assert_int_equal(atomic_load(&held->refs), 2);
    p = small_plan();
    assert_int_equal(hccl_plan_cache_put(c, &kb, p), hcclSuccess);
    hccl_plan_release(p);
    p = small_plan();
    assert_int_equal(hccl_plan_cache_put(c, &kc, p), hcclSuccess); /* evicts a (the oldest) */
    hccl_plan_release(p);
    assert_null(hccl_plan_cache_get(c, &ka));
    /* The caller's reference keeps the plan alive: ASan reports any use after free here. */
    assert_int_equal(atomic_load(&held->refs), 1);
    assert_int_equal(held->nsteps, 1);
    assert_int_equal(held->steps[0].kind, HCCL_STEP_COPY);
    assert_true(held->final);

    /* It still runs. */
    {
        hccl_reactor_t *r = NULL;
        hccl_exec_t *ex = NULL;
        hccl_conn_t *conns[1] = {NULL};
        int32_t in = 0x1234567, out = 0;
        done_t d;
        memset(&d, 0, sizeof(d));
        assert_int_equal(hccl_reactor_create(NULL, -1, &r), hcclSuccess);
        assert_int_equal(hccl_exec_create(r, 0, 1, conns, &ex), hcclSuccess);
        assert_int_equal(hccl_exec_start(ex, held, 1, &in, &out, on_done, &d, NULL), hcclSuccess);
        hccl_plan_release(held); /* the run holds its own reference */
        assert_true(drive_until(r, &d.ndone, 1));
        assert_int_equal(d.res, hcclSuccess);
        assert_int_equal(out, in);
        hccl_exec_destroy(ex);
        hccl_reactor_destroy(r);
    }
    hccl_plan_cache_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_finalize_successors),
        cmocka_unit_test(test_finalize_many_steps),
        cmocka_unit_test(test_finalize_forwarded),
        cmocka_unit_test(test_finalize_rejects_cycle),
        cmocka_unit_test(test_finalize_rejects_ranges),
        cmocka_unit_test(test_finalize_rejects_writes_to_send),
        cmocka_unit_test(test_exec_avg_two_ranks),
        cmocka_unit_test(test_exec_runs_in_flight),
        cmocka_unit_test(test_exec_big_scratch),
        cmocka_unit_test(test_exec_local_only),
        cmocka_unit_test(test_exec_post_failure),
        cmocka_unit_test(test_exec_fail_all_waits_for_link),
        cmocka_unit_test(test_cache_hit_miss),
        cmocka_unit_test(test_cache_lru_eviction),
        cmocka_unit_test(test_cache_evicted_plan_stays_valid),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
