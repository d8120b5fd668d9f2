/*
 * The plan builder and finalize: successor lists and dependency counts, receives a send reads
 * again, many steps, and the plans finalize rejects (cycles, references out of range, writes to
 * the send buffer).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "plan_helpers.h"
#include "sched/exec_impl.h"
#include "sched/sched.h"

static bool has_succ(const hccl_plan_t *p, uint32_t from, uint32_t to)
{
    const hccl_step_t *s = &p->steps[from];

    for (uint32_t k = 0; k < s->nsucc; k++)
        if (p->succ[s->succ_first + k] == to)
            return true;
    return false;
}

static void test_finalize_successors(void **state)
{
    hccl_plan_t *p = new_plan(0, 2);
    uint32_t id[5];

    (void)state;
    assert_int_equal(
        hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0), hccl_bref(HCCL_SLOT_SEND, 0), 16, &id[0]),
        hcclSuccess);
    assert_int_equal(hccl_plan_send(p, 1, 7, hccl_bref(HCCL_SLOT_SEND, 0), 16, &id[1]),
                     hcclSuccess);
    assert_int_equal(hccl_plan_recv(p, 1, 7, hccl_bref(HCCL_SLOT_SCRATCH, 0), 16, &id[2]),
                     hcclSuccess);
    assert_int_equal(hccl_plan_reduce(p, hccl_bref(HCCL_SLOT_RECV, 0), hccl_bref(HCCL_SLOT_RECV, 0),
                                      hccl_bref(HCCL_SLOT_SCRATCH, 0), 16, HCCL_STEP_FINAL_DIV,
                                      &id[3]),
                     hcclSuccess);
    assert_int_equal(
        hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 16), hccl_bref(HCCL_SLOT_RECV, 0), 16, &id[4]),
        hcclSuccess);
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
    assert_int_not_equal(
        hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0), hccl_bref(HCCL_SLOT_SEND, 0), 4, NULL),
        hcclSuccess);
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
        assert_int_equal(hccl_plan_recv(p, 1, i, hccl_bref(HCCL_SLOT_RECV, 16 * i), 16, &r[i]),
                         hcclSuccess);
    assert_int_equal(hccl_plan_recv(p, 1, 4, hccl_bref(HCCL_SLOT_SCRATCH, 0), 16, &r[4]),
                     hcclSuccess);
    assert_int_equal(hccl_plan_recv(p, 1, 5, hccl_bref(HCCL_SLOT_SCRATCH, 16), 16, &r[5]),
                     hcclSuccess);
    /* Sent on: RECV 20..24 (inside the second), SCRATCH 15..17 (the edges of both), and SEND
     * 0..64, which is the caller's input whatever the offsets. */
    assert_int_equal(hccl_plan_send(p, 2, 0, hccl_bref(HCCL_SLOT_RECV, 20), 4, &sid), hcclSuccess);
    assert_int_equal(hccl_plan_send(p, 2, 1, hccl_bref(HCCL_SLOT_SCRATCH, 15), 2, &sid),
                     hcclSuccess);
    assert_int_equal(hccl_plan_send(p, 2, 2, hccl_bref(HCCL_SLOT_SEND, 0), 64, &sid), hcclSuccess);
    /* RECV 40..48: inside the third, ending where the fourth begins. */
    assert_int_equal(hccl_plan_send(p, 2, 3, hccl_bref(HCCL_SLOT_RECV, 40), 8, &sid), hcclSuccess);
    /* RECV 100..116 lies inside a long send (64..128) that starts before a short one (70..72)
     * which ends before it: the search must remember the furthest end. */
    assert_int_equal(hccl_plan_recv(p, 1, 6, hccl_bref(HCCL_SLOT_RECV, 100), 16, &r[6]),
                     hcclSuccess);
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

/*
 * finalize marks the sends whose bytes a step writes: SEND and RECV apart, and in place, where
 * SEND is RECV's block rank (one block per rank) or all of RECV (the same size), and a copy from
 * SEND to the same bytes writes nothing. The executor marks by the first out of place, by the
 * second in place, and by neither from 1 MiB.
 */
static void test_finalize_rewritten(void **state)
{
    hccl_plan_t *p = new_plan(1, 3);
    uint32_t s[3], id;
    char buf[48];

    (void)state;
    /* A block per rank (16 bytes), rank 1's at RECV 16..32. */
    assert_int_equal(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 16), hccl_bref(HCCL_SLOT_SEND, 0),
                                    16, &id), hcclSuccess);
    assert_int_equal(hccl_plan_send(p, 2, 0, hccl_bref(HCCL_SLOT_SEND, 0), 16, &s[0]), hcclSuccess);
    assert_int_equal(hccl_plan_recv(p, 0, 1, hccl_bref(HCCL_SLOT_RECV, 0), 16, &id), hcclSuccess);
    assert_int_equal(hccl_plan_send(p, 2, 1, hccl_bref(HCCL_SLOT_RECV, 4), 8, &s[1]), hcclSuccess);
    assert_int_equal(hccl_plan_send(p, 2, 2, hccl_bref(HCCL_SLOT_RECV, 32), 16, &s[2]),
                     hcclSuccess);
    assert_int_equal(hccl_plan_finalize(p, 16, 48), hcclSuccess);
    assert_int_equal(p->steps[s[0]].flags & (HCCL_STEP_SRC_WRITTEN | HCCL_STEP_SRC_WRITTEN_IN_PLACE),
                     0);
    assert_true(p->steps[s[1]].flags & HCCL_STEP_SRC_WRITTEN);
    assert_true(p->steps[s[1]].flags & HCCL_STEP_SRC_WRITTEN_IN_PLACE);
    /* No step writes RECV 32..48 (rank 2's block). */
    assert_int_equal(p->steps[s[2]].flags & (HCCL_STEP_SRC_WRITTEN | HCCL_STEP_SRC_WRITTEN_IN_PLACE),
                     0);
    assert_int_equal(hccl_exec_rewritten_flag(p, buf, buf + 16), HCCL_STEP_SRC_WRITTEN);
    assert_int_equal(hccl_exec_rewritten_flag(p, buf + 16, buf), HCCL_STEP_SRC_WRITTEN_IN_PLACE);
    hccl_plan_release(p);

    /* The same sizes: in place SEND is RECV, and the reduce writes what the send reads. */
    p = new_plan(0, 2);
    assert_int_equal(hccl_plan_send(p, 1, 0, hccl_bref(HCCL_SLOT_SEND, 0), 32, &s[0]), hcclSuccess);
    assert_int_equal(hccl_plan_recv(p, 1, 0, hccl_bref(HCCL_SLOT_SCRATCH, 0), 32, &id),
                     hcclSuccess);
    assert_int_equal(hccl_plan_reduce(p, hccl_bref(HCCL_SLOT_RECV, 0), hccl_bref(HCCL_SLOT_SEND, 0),
                                      hccl_bref(HCCL_SLOT_SCRATCH, 0), 32, 0, &id),
                     hcclSuccess);
    p->scratch_bytes = 32;
    assert_int_equal(hccl_plan_finalize(p, 32, 32), hcclSuccess);
    assert_false(p->steps[s[0]].flags & HCCL_STEP_SRC_WRITTEN);
    assert_true(p->steps[s[0]].flags & HCCL_STEP_SRC_WRITTEN_IN_PLACE);
    hccl_plan_release(p);

    /* From 1 MiB no send is marked. */
    p = new_plan(0, 2);
    assert_int_equal(hccl_plan_send(p, 1, 0, hccl_bref(HCCL_SLOT_RECV, 0), 1u << 20, &s[0]),
                     hcclSuccess);
    assert_int_equal(hccl_plan_recv(p, 1, 0, hccl_bref(HCCL_SLOT_RECV, 0), 1u << 20, &id),
                     hcclSuccess);
    assert_int_equal(hccl_plan_dep(p, s[0], id), hcclSuccess);
    assert_int_equal(hccl_plan_finalize(p, 1u << 20, 1u << 20), hcclSuccess);
    assert_true(p->steps[s[0]].flags & HCCL_STEP_SRC_WRITTEN);
    assert_int_equal(hccl_exec_rewritten_flag(p, buf, buf + 16), 0);
    hccl_plan_release(p);
}

static void test_finalize_many_steps(void **state)
{
    /* A chain longer than the initial capacities (64 steps, 128 edges) grows them. */
    hccl_plan_t *p = new_plan(0, 1);
    const uint32_t n = 300;

    (void)state;
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(
            hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0), hccl_bref(HCCL_SLOT_SEND, 0), 8, NULL),
            hcclSuccess);
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
                                            hccl_bref(HCCL_SLOT_SEND, 0), 8, NULL),
                             hcclSuccess);
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
    case B_SEND:
        res = hccl_plan_send(p, peer, 0, src, bytes, NULL);
        break;
    case B_RECV:
        res = hccl_plan_recv(p, peer, 0, dst, bytes, NULL);
        break;
    case B_COPY:
        res = hccl_plan_copy(p, dst, src, bytes, NULL);
        break;
    default:
        res = hccl_plan_reduce(p, dst, src, src2, bytes, 0, NULL);
        break;
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
    assert_int_equal(finalize_one(B_SEND, 1, r0, hccl_bref(HCCL_SLOT_SEND, 32), s0, 32),
                     hcclSuccess);
    assert_int_equal(finalize_one(B_RECV, 1, hccl_bref(HCCL_SLOT_RECV, 100), s0, s0, 28),
                     hcclSuccess);
    assert_int_equal(finalize_one(B_COPY, -1, hccl_bref(HCCL_SLOT_SCRATCH, 16), s0, s0, 16),
                     hcclSuccess);
    assert_int_equal(finalize_one(B_REDUCE, -1, r0, s0, hccl_bref(HCCL_SLOT_SCRATCH, 0), 32),
                     hcclSuccess);
    assert_int_equal(finalize_one(B_RECV, 1, hccl_bref(HCCL_SLOT_RECV, 128), s0, s0, 0),
                     hcclSuccess);

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_finalize_successors),
        cmocka_unit_test(test_finalize_many_steps),
        cmocka_unit_test(test_finalize_forwarded),
        cmocka_unit_test(test_finalize_rewritten),
        cmocka_unit_test(test_finalize_rejects_cycle),
        cmocka_unit_test(test_finalize_rejects_ranges),
        cmocka_unit_test(test_finalize_rejects_writes_to_send),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
