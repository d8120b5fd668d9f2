/*
 * The executor over the sim link: two ranks' runs give the right bytes (receives fused with their
 * reduce or not), several runs in flight, the big scratch kept between runs, and empty or
 * local-only plans completing through the callback.
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
#include "reactor/reactor.h"
#include "sched/sched.h"
#include "sim_run.h"

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
                                        hccl_bref(HCCL_SLOT_SEND, off), chunk, &cp),
                         hcclSuccess);
        assert_int_equal(
            hccl_plan_send(p, 1 - rank, 100 + c, hccl_bref(HCCL_SLOT_SEND, off), chunk, &sd),
            hcclSuccess);
        assert_int_equal(
            hccl_plan_recv(p, 1 - rank, 100 + c, hccl_bref(HCCL_SLOT_SCRATCH, off), chunk, &rv),
            hcclSuccess);
        assert_int_equal(
            hccl_plan_reduce(p, hccl_bref(HCCL_SLOT_RECV, off), hccl_bref(HCCL_SLOT_RECV, off),
                             hccl_bref(HCCL_SLOT_SCRATCH, off), chunk, HCCL_STEP_FINAL_DIV, &rd),
            hcclSuccess);
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
        assert_int_equal(
            hccl_exec_start(s.ex[r], plan[r], 5, sendbuf[r], recvbuf[r], on_done, &d[r], NULL),
            hcclSuccess);
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
                                         recvbuf[0][k], on_done, &d[0][k], NULL),
                         hcclSuccess);
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
                                         recvbuf[1][k], on_done, &d[1][k], NULL),
                         hcclSuccess);
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

/* rank r of 2: copy(scratch <- send), then send(scratch) / recv(recv): RECV gets the peer's SEND.
 */
static hccl_plan_t *build_via_scratch_plan(int rank)
{
    hccl_plan_t *p = new_plan(rank, 2);
    uint32_t cp, sd;

    p->scratch_bytes = BIG_SCRATCH;
    assert_int_equal(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_SCRATCH, 0),
                                    hccl_bref(HCCL_SLOT_SEND, 0), BIG_SCRATCH, &cp),
                     hcclSuccess);
    assert_int_equal(
        hccl_plan_send(p, 1 - rank, 1, hccl_bref(HCCL_SLOT_SCRATCH, 0), BIG_SCRATCH, &sd),
        hcclSuccess);
    assert_int_equal(hccl_plan_dep(p, cp, sd), hcclSuccess);
    assert_int_equal(
        hccl_plan_recv(p, 1 - rank, 1, hccl_bref(HCCL_SLOT_RECV, 0), BIG_SCRATCH, NULL),
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
                                             recvbuf[r][k], on_done, &d[r][k], NULL),
                             hcclSuccess);
    for (int k = 0; k < 2; k++)
        for (int r = 0; r < 2; r++)
            assert_true(drive_until(s.r, &d[r][k].ndone, 1));
    /* Run 2 finds the big scratch free and allocates nothing at all. */
    for (int r = 0; r < 2; r++) {
        hccl_alloc_fail_at(1);
        assert_int_equal(hccl_exec_start(s.ex[r], plan[r], 22, sendbuf[r][2], recvbuf[r][2],
                                         on_done, &d[r][2], NULL),
                         hcclSuccess);
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
    assert_int_equal(hccl_plan_copy(local, hccl_bref(HCCL_SLOT_RECV, 0),
                                    hccl_bref(HCCL_SLOT_SEND, 0), sizeof(in), NULL),
                     hcclSuccess);
    assert_int_equal(hccl_plan_finalize(local, sizeof(in), sizeof(out)), hcclSuccess);
    assert_int_equal(hccl_exec_start(s.ex[0], empty, 1, NULL, NULL, on_done, &d[0], NULL),
                     hcclSuccess);
    assert_int_equal(hccl_exec_start(s.ex[0], local, 2, in, out, on_done, &d[1], NULL),
                     hcclSuccess);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exec_avg_two_ranks),
        cmocka_unit_test(test_exec_runs_in_flight),
        cmocka_unit_test(test_exec_big_scratch),
        cmocka_unit_test(test_exec_local_only),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
