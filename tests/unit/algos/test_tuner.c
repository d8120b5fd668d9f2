/*
 * The tuner's pick of the lane (HCCL_ALGO_LANE) against the plans' algorithms: by the lane's own
 * limits, where HCCL_ALGO names it or another algorithm, without a lane, and for what the lane
 * never runs. The lane is one over the sim window (links/link.h), as a communicator's would be.
 * And the plans' pick where ranks wait for turns on shared CPUs over shm: rings lose there.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "algos/algos.h"
#include "links/link.h"
#include "sched/lane.h"

enum { N = 4, LANE_MAX = 4096, ROOTED_MIN = 1024, ROOTED_MAX = 65536 };

typedef struct {
    hccl_sim_world_t *sim;
    hccl_lane_t *lane;
} lane_fixture_t;

static void on_fatal(void *arg, hcclResult_t res, const char *msg)
{
    (void)arg;
    fail_msg("unexpected lane failure %d: %s", (int)res, msg);
}

/* The fixture's lane limits, with AllReduces above pieces_above in pieces (SIZE_MAX: none). */
static hccl_lane_limits_t fixture_limits(size_t pieces_above)
{
    return (hccl_lane_limits_t){.max_bytes = LANE_MAX,
                                .flat_max = HCCL_LANE_FLAT_MAX,
                                .rooted_min = ROOTED_MIN,
                                .rooted_max = ROOTED_MAX,
                                .direct_min = SIZE_MAX,
                                .reduce_direct_min = SIZE_MAX,
                                .pieces_above = pieces_above};
}

static int setup(void **state)
{
    static lane_fixture_t f;
    hccl_lane_limits_t limits = fixture_limits(SIZE_MAX);

    assert_int_equal(hccl_sim_world_create(NULL, N, &f.sim), hcclSuccess);
    assert_int_equal(hccl_lane_create(&hccl_sim_window_ops, hccl_sim_world_window(f.sim, 0), 0, N,
                                      &limits, on_fatal, NULL, &f.lane),
                     hcclSuccess);
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    lane_fixture_t *f = *state;

    hccl_lane_destroy(f->lane);
    hccl_sim_world_destroy(f->sim);
    return 0;
}

static hccl_algo_t pick(const hccl_tuner_t *t, hccl_coll_t coll, size_t count, hcclDataType_t dt)
{
    hccl_coll_shape_t shape = {coll, count, dt, hcclSum, 0, NULL};
    hccl_algo_t algo = hccl_tuner_pick(t, &shape, N);

    /* The question every call asks first has the same answer. */
    assert_int_equal(hccl_tuner_picks_lane(t, &shape, N), algo == HCCL_ALGO_LANE);
    return algo;
}

/* Unforced: the lane within its limits, a plan's algorithm outside them. */
static void test_auto(void **state)
{
    lane_fixture_t *f = *state;
    hccl_tuner_t t;

    hccl_tuner_init(&t, NULL, 4u << 20);
    t.lane = f->lane;
    assert_int_equal(pick(&t, HCCL_COLL_ALLREDUCE, 2, hcclFloat32), HCCL_ALGO_LANE);
    assert_int_equal(pick(&t, HCCL_COLL_ALLREDUCE, LANE_MAX / 4, hcclFloat32), HCCL_ALGO_LANE);
    assert_int_not_equal(pick(&t, HCCL_COLL_ALLREDUCE, LANE_MAX / 4 + 1, hcclFloat32),
                         HCCL_ALGO_LANE);
    assert_int_not_equal(pick(&t, HCCL_COLL_ALLREDUCE, 0, hcclFloat32), HCCL_ALGO_LANE);
    /* Rooted calls below rooted_min keep to plans; the per-rank block counts for AllGather. */
    assert_int_not_equal(pick(&t, HCCL_COLL_BROADCAST, ROOTED_MIN - 1, hcclUint8), HCCL_ALGO_LANE);
    assert_int_equal(pick(&t, HCCL_COLL_REDUCE, ROOTED_MIN, hcclUint8), HCCL_ALGO_LANE);
    assert_int_equal(pick(&t, HCCL_COLL_ALLGATHER, LANE_MAX, hcclUint8), HCCL_ALGO_LANE);
    assert_int_not_equal(pick(&t, HCCL_COLL_REDUCESCATTER, LANE_MAX, hcclUint8), HCCL_ALGO_LANE);
    assert_int_equal(pick(&t, HCCL_COLL_BARRIER, 0, hcclUint8), HCCL_ALGO_LANE);
    assert_int_equal(pick(&t, HCCL_COLL_ALLTOALLV, 8, hcclUint8), HCCL_ALGO_PAIRWISE);
    /* No lane (several hosts, HCCL_LANE_MAX=0): never the lane. */
    t.lane = NULL;
    assert_int_not_equal(pick(&t, HCCL_COLL_ALLREDUCE, 2, hcclFloat32), HCCL_ALGO_LANE);
    assert_int_equal(pick(&t, HCCL_COLL_BARRIER, 0, hcclUint8), HCCL_ALGO_DISSEMINATION);
}

/* HCCL_ALGO=lane: up to the lane's reach whatever its limits say; beyond, or without a lane,
 * the tuner's choice among the plans. */
static void test_forced_lane(void **state)
{
    lane_fixture_t *f = *state;
    hccl_tuner_t t;

    hccl_tuner_init(&t, "lane", 4u << 20);
    assert_int_equal(t.forced[HCCL_COLL_ALLREDUCE], HCCL_ALGO_LANE);
    assert_int_equal(t.forced[HCCL_COLL_ALLTOALLV], HCCL_ALGO_AUTO);
    t.lane = f->lane;
    assert_int_equal(pick(&t, HCCL_COLL_ALLREDUCE, ROOTED_MAX / 4, hcclFloat32), HCCL_ALGO_LANE);
    assert_int_equal(pick(&t, HCCL_COLL_BROADCAST, 1, hcclUint8), HCCL_ALGO_LANE);
    assert_int_not_equal(pick(&t, HCCL_COLL_ALLREDUCE, ROOTED_MAX / 4 + 1, hcclFloat32),
                         HCCL_ALGO_LANE);
    assert_int_not_equal(pick(&t, HCCL_COLL_ALLREDUCE, 0, hcclFloat32), HCCL_ALGO_LANE);
    assert_int_equal(pick(&t, HCCL_COLL_BARRIER, 0, hcclUint8), HCCL_ALGO_LANE);
    t.lane = NULL;
    assert_int_not_equal(pick(&t, HCCL_COLL_ALLREDUCE, 2, hcclFloat32), HCCL_ALGO_LANE);
    assert_int_equal(pick(&t, HCCL_COLL_BARRIER, 0, hcclUint8), HCCL_ALGO_DISSEMINATION);
}

/* A lane that takes AllReduces above pieces_above in pieces: unforced, those and the ones within
 * its limits, not the ones between; forced, every AllReduce; other collectives as before. */
static void test_pieces(void **state)
{
    lane_fixture_t *f = *state;
    hccl_lane_limits_t limits = fixture_limits(2 * LANE_MAX);
    hccl_lane_t *lane;
    hccl_tuner_t t;

    assert_int_equal(hccl_lane_create(&hccl_sim_window_ops, hccl_sim_world_window(f->sim, 0), 0, N,
                                      &limits, on_fatal, NULL, &lane),
                     hcclSuccess);
    hccl_tuner_init(&t, NULL, 4u << 20);
    t.lane = lane;
    assert_int_equal(pick(&t, HCCL_COLL_ALLREDUCE, LANE_MAX / 4, hcclFloat32), HCCL_ALGO_LANE);
    assert_int_not_equal(pick(&t, HCCL_COLL_ALLREDUCE, LANE_MAX / 2, hcclFloat32), HCCL_ALGO_LANE);
    assert_int_equal(pick(&t, HCCL_COLL_ALLREDUCE, LANE_MAX / 2 + 1, hcclFloat32), HCCL_ALGO_LANE);
    assert_int_not_equal(pick(&t, HCCL_COLL_ALLGATHER, 4 * LANE_MAX, hcclUint8), HCCL_ALGO_LANE);
    hccl_tuner_init(&t, "lane", 4u << 20);
    t.lane = lane;
    assert_int_equal(pick(&t, HCCL_COLL_ALLREDUCE, ROOTED_MAX / 4 + 1, hcclFloat32),
                     HCCL_ALGO_LANE);
    assert_int_not_equal(pick(&t, HCCL_COLL_ALLGATHER, ROOTED_MAX + 1, hcclUint8), HCCL_ALGO_LANE);
    hccl_lane_destroy(lane);
}

/* A plan's algorithm named for one collective: that one never takes the lane, the rest may. */
static void test_forced_other(void **state)
{
    lane_fixture_t *f = *state;
    hccl_tuner_t t;

    hccl_tuner_init(&t, "allreduce=ring;broadcast=lane", 4u << 20);
    t.lane = f->lane;
    assert_int_equal(pick(&t, HCCL_COLL_ALLREDUCE, 2, hcclFloat32), HCCL_ALGO_RING);
    assert_int_equal(pick(&t, HCCL_COLL_BROADCAST, 1, hcclUint8), HCCL_ALGO_LANE);
    assert_int_equal(pick(&t, HCCL_COLL_ALLGATHER, 2, hcclUint8), HCCL_ALGO_LANE);
}

/* The lane has no plan: asking for one is an internal error, not some other plan. */
static void test_no_plan(void **state)
{
    hccl_tuner_t t;
    hccl_coll_shape_t shape = {HCCL_COLL_ALLREDUCE, 4, hcclFloat32, hcclSum, 0, NULL};
    hccl_plan_t *plan = NULL;

    (void)state;
    hccl_tuner_init(&t, NULL, 4u << 20);
    assert_string_equal(hccl_algo_name(HCCL_ALGO_LANE), "lane");
    assert_true(hccl_algo_applies(HCCL_COLL_ALLREDUCE, HCCL_ALGO_LANE));
    assert_false(hccl_algo_applies(HCCL_COLL_ALLTOALLV, HCCL_ALGO_LANE));
    assert_int_equal(hccl_algo_build(&t, HCCL_ALGO_LANE, 0, N, &shape, &plan), hcclInternalError);
    assert_null(plan);
}

/* Rings' bytes cost more where they wait for turns (cost.c): a large ReduceScatter goes by
 * recursive halving there, by ring where they do not; the lane's pick is not the question. */
static void test_rings_wait_turns(void **state)
{
    hccl_tuner_t t;
    hccl_coll_shape_t shape = {HCCL_COLL_REDUCESCATTER, 16u << 20, hcclFloat32, hcclSum, 0, NULL};

    (void)state;
    hccl_tuner_init(&t, NULL, 4u << 20);
    hccl_tuner_set_model(&t, HCCL_COST_SHM, "2,2,28");
    t.model.cpus_shared = true;
    assert_int_equal(hccl_tuner_pick_plan(&t, &shape, 4), HCCL_ALGO_RING);
    t.model.rings_wait_turns = true;
    assert_int_equal(hccl_tuner_pick_plan(&t, &shape, 4), HCCL_ALGO_RECHALV);
    assert_int_equal(hccl_tuner_pick_plan(&t, &shape, 8), HCCL_ALGO_RECHALV);
}

/* Over shm with shared CPUs a small Reduce goes by tree (the chain's depth shows there), a
 * large one still by chain (its chunks pipeline); with the tcp model both go by chain. */
static void test_reduce_chain_depth(void **state)
{
    hccl_tuner_t t;
    hccl_coll_shape_t shape = {HCCL_COLL_REDUCE, 64, hcclFloat32, hcclSum, 0, NULL};

    (void)state;
    hccl_tuner_init(&t, NULL, 4u << 20);
    hccl_tuner_set_model(&t, HCCL_COST_SHM, "2,2,28");
    t.model.cpus_shared = true;
    t.model.rings_wait_turns = true;
    for (int n = 3; n <= 8; n++) {
        shape.count = 64;
        assert_int_equal(hccl_tuner_pick_plan(&t, &shape, n), HCCL_ALGO_TREE);
        shape.count = 16u << 20;
        assert_int_equal(hccl_tuner_pick_plan(&t, &shape, n), HCCL_ALGO_CHAIN);
    }
    t.model.rings_wait_turns = false;
    shape.count = 64;
    assert_int_equal(hccl_tuner_pick_plan(&t, &shape, 4), HCCL_ALGO_CHAIN);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto),
        cmocka_unit_test(test_forced_lane),
        cmocka_unit_test(test_forced_other),
        cmocka_unit_test(test_pieces),
        cmocka_unit_test(test_no_plan),
        cmocka_unit_test(test_rings_wait_turns),
        cmocka_unit_test(test_reduce_chain_depth),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
