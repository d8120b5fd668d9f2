/*
 * The lane's AllReduce (flat, split and grouped, every dtype and op), the choice of the grouped
 * way, what an operation waits for, and operations queued in order; over shm's window and
 * sim's (lane_world.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cmocka.h>

#include "algos/algos.h"
#include "lane_world.h"
#include "reference.h"

/* Every dtype and op, in place and not, on w's lanes (counts below the rank count leave some
 * shares empty; the largest spans several of lane_reduce_all's tiles per share where elements
 * are 4 bytes or more): right, and the same bits on every rank (every rank reduces in one fixed
 * order). grouped: each rank's group sum was published (the grouped path ran). */
static void allreduce_every_type(world_t *w, bool grouped)
{
    static const int counts[] = {1, 7, 1000, 40001};
    int n = w->n;
    unsigned seed = 1;

    for (size_t di = 0; di < sizeof(lane_dtypes) / sizeof(lane_dtypes[0]); di++) {
        for (size_t oi = 0; oi < sizeof(lane_ops) / sizeof(lane_ops[0]); oi++) {
            for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++, seed++) {
                hcclDataType_t dt = lane_dtypes[di];
                size_t count = (size_t)counts[ci], esz = hccl_dtype_size(dt);
                bool in_place = ((seed >> 2) + ci) & 1; /* each count both ways */
                void *sbuf[MAXR], *rbuf[MAXR];
                test_op_t t[MAXR];
                for (int r = 0; r < n; r++) {
                    sbuf[r] = malloc(count * esz);
                    rbuf[r] = in_place ? sbuf[r] : calloc(count, esz);
                    for (size_t i = 0; i < count; i++)
                        ref_store(sbuf[r], i, dt, ref_input(dt, lane_ops[oi], r, i, seed));
                    op_init(&t[r], HCCL_COLL_ALLREDUCE, sbuf[r], rbuf[r], count, dt, lane_ops[oi]);
                }
                /* Ranks arrive one by one: nobody finishes before the last block. */
                for (int r = 0; r < n; r++) {
                    hccl_lane_enqueue(w->lane[r], &t[r].op);
                    drive(w);
                    for (int q = 0; q <= r; q++)
                        assert_int_equal(t[q].done, r == n - 1);
                }
                for (int r = 0; r < n; r++) {
                    assert_int_equal(t[r].res, hcclSuccess);
                    assert_int_equal(t[r].op.grouped, grouped);
                    if (grouped)
                        assert_true(w->win->raised(w->wctx[0], r, HCCL_WINDOW_GPART, t[r].op.lseq));
                    if (memcmp(rbuf[r], rbuf[0], count * esz) != 0)
                        fail_msg("n=%d %s %s count %zu: rank %d's result differs from rank 0's", n,
                                 hccl_dtype_name(dt), hccl_op_name(lane_ops[oi]), count, r);
                    for (size_t i = 0; r == 0 && i < count; i++) {
                        double got = ref_load(rbuf[r], i, dt), want = ref_reduce(dt, lane_ops[oi], n, i, seed);
                        if (!ref_close(dt, got, want))
                            fail_msg("n=%d %s %s count %zu elem %zu: got %g want %g", n,
                                     hccl_dtype_name(dt), hccl_op_name(lane_ops[oi]), count, i, got, want);
                    }
                }
                for (int r = 0; r < n; r++) {
                    if (!in_place)
                        free(rbuf[r]);
                    free(sbuf[r]);
                }
            }
        }
    }
}

/* Every dtype and op at several rank counts, flat and split. */
static void test_allreduce_every_type(void **state)
{
    const int ranks[] = {2, 3, 5, 8};

    (void)state;
    for (size_t ni = 0; ni < 2 * sizeof(ranks) / sizeof(ranks[0]); ni++) {
        world_t *w = world_new_split(ranks[ni / 2], HCCL_WINDOW_CAP, ni % 2 ? 0 : HCCL_LANE_FLAT_MAX);
        allreduce_every_type(w, false);
        world_free(w);
    }
}

/* Without group_always, rank 0 chooses per size class and every rank follows, whether it
 * publishes before rank 0 rewrote the class's word or after. A class run back to back is timed
 * and tried grouped; one whose operations never follow each other stays plain. */
static void test_allreduce_group_choice(void **state)
{
    enum { N = 4, OPS = 90, RUN = 50 };
    static const int group_of[N] = {0, 1, 0, 1};
    static const size_t counts[2] = {70000, 3000};
    world_t *w = world_new_groups(N, HCCL_WINDOW_CAP, 0, group_of, false);
    static float in[N][70000], out[N][70000];
    int seen = 0, tried = 0;

    (void)state;
    for (int k = 0; k < OPS; k++) {
        /* RUN operations of class A back to back, then A and B in turn */
        int cls = k < RUN ? 0 : k % 2;
        size_t count = counts[cls];
        test_op_t t[N];
        for (int r = 0; r < N; r++) {
            for (size_t i = 0; i < count; i++)
                in[r][i] = (float)((r + 1) * (int)(i % 97) + k);
            op_init(&t[r], HCCL_COLL_ALLREDUCE, in[r], out[r], count, hcclFloat32, hcclSum);
        }
        run_all(w, t, k % 2);
        for (int r = 0; r < N; r++) {
            assert_int_equal(t[r].op.grouped, t[0].op.grouped);
            for (size_t i = 0; i < count; i++)
                assert_true(out[r][i] == (float)(10 * (int)(i % 97) + 4 * k));
        }
        if (cls == 1) {
            assert_false(t[0].op.grouped);
            continue;
        }
        /* Class A: 32 plain (the first two warm up), then a try of six grouped (the first two
         * warm up). */
        if (seen < 38)
            assert_int_equal(t[0].op.grouped, seen >= 32);
        tried += t[0].op.grouped;
        seen++;
    }
    assert_true(tried >= 6);
    world_free(w);
}

/* A grouped operation says which ranks it waits for: the other CPU's sums, then its own
 * CPU's parts. */
static void test_grouped_waiting_for(void **state)
{
    enum { N = 4, C = 1000 };
    static const int group_of[N] = {0, 1, 0, 1};
    world_t *w = world_new_groups(N, HCCL_WINDOW_CAP, 0, group_of, true);
    static int32_t in[N][C], out[N][C];
    test_op_t t[N];
    char buf[64];

    (void)state;
    for (int r = 0; r < N; r++) {
        for (int i = 0; i < C; i++)
            in[r][i] = r * 1000 + i;
        op_init(&t[r], HCCL_COLL_ALLREDUCE, in[r], out[r], C, hcclInt32, hcclSum);
    }
    /* Each enqueue polls its own lane once: rank 3 comes last and sums its CPU's blocks; rank
     * 1's sum is not in until it is polled again. */
    hccl_lane_enqueue(w->lane[0], &t[0].op);
    hccl_lane_enqueue(w->lane[2], &t[2].op);
    assert_true(hccl_lane_waiting_for(w->lane[0], &t[0].op, buf, sizeof(buf)));
    assert_string_equal(buf, "1, 3");
    hccl_lane_enqueue(w->lane[1], &t[1].op);
    hccl_lane_enqueue(w->lane[3], &t[3].op);
    hccl_lane_poll(w->lane[0]);
    assert_true(t[0].op.grouped && t[0].op.part_done && !t[0].op.final_done);
    assert_true(hccl_lane_waiting_for(w->lane[0], &t[0].op, buf, sizeof(buf)));
    assert_string_equal(buf, "1");
    /* Rank 2 has not summed its share yet either: rank 0 then waits for its part. */
    hccl_lane_poll(w->lane[1]);
    hccl_lane_poll(w->lane[0]);
    assert_true(t[0].op.final_done && !t[0].done);
    assert_true(hccl_lane_waiting_for(w->lane[0], &t[0].op, buf, sizeof(buf)));
    assert_string_equal(buf, "2");
    drive(w);
    for (int r = 0; r < N; r++) {
        assert_int_equal(t[r].done, 1);
        for (int i = 0; i < C; i++)
            assert_int_equal(out[r][i], 6000 + 4 * i);
    }
    world_free(w);
}

/* Split AllReduce by CPU group: groups of unequal sizes, a rank alone in its group, more
 * groups than two, and groupings where nothing is grouped (one group; every rank alone). */
static void test_allreduce_grouped(void **state)
{
    static const layout_t cases[] = {
        {2, {0, 1}, false},
        {3, {0, 0, 0}, false},
        {3, {0, 1, 0}, true},
        {4, {1, 0, 1, 0}, true},
        {5, {0, 1, 2, 0, 1}, true},
        {8, {0, 1, 0, 1, 0, 1, 0, 1}, true},
        {8, {0, 0, 0, 0, 0, 1, 1, 2}, true},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        world_t *w = world_new_groups(cases[i].n, HCCL_WINDOW_CAP, 0, cases[i].group_of, true);
        allreduce_every_type(w, cases[i].grouped);
        world_free(w);
    }
}

/*
 * AllReduces above the largest block run as rounds of pieces of it (split and flat pieces,
 * the last one short), in place and not, with a small AllReduce queued behind on every rank
 * while ranks arrive one by one: right, the same bits everywhere, the small one's round right
 * after the pieces', and the call's own buffers and count back in the op when it is done.
 */
static void test_allreduce_pieces(void **state)
{
    static const hcclDataType_t dts[] = {hcclFloat32, hcclInt8, hcclBfloat16, hcclFloat64};
    const size_t block = 4096;
    unsigned seed = 7;

    (void)state;
    for (int n = 2; n <= 5; n += 3) {
        for (int split = 0; split < 2; split++) {
            lane_world_pieces_above = block;
            world_t *w = world_new_split(n, block, split ? 1024 : HCCL_LANE_FLAT_MAX);
            uint64_t next_round = 0; /* rounds are counted from 0 on a new world */
            lane_world_pieces_above = SIZE_MAX;
            for (size_t di = 0; di < sizeof(dts) / sizeof(dts[0]); di++) {
                hcclDataType_t dt = dts[di];
                size_t esz = hccl_dtype_size(dt), piece = block / esz;
                const size_t counts[] = {piece, piece + 1, 3 * piece + 5};
                for (size_t ci = 0; ci < 3; ci++, seed++) {
                    size_t count = counts[ci], rounds = (count + piece - 1) / piece;
                    hcclRedOp_t op = lane_ops[seed % 5];
                    bool in_place = (seed + di) & 1;
                    void *sbuf[MAXR], *rbuf[MAXR];
                    int32_t small_in[MAXR][3], small_out[MAXR][3];
                    test_op_t t[MAXR], small[MAXR];
                    for (int r = 0; r < n; r++) {
                        sbuf[r] = malloc(count * esz);
                        rbuf[r] = in_place ? sbuf[r] : calloc(count, esz);
                        for (size_t i = 0; i < count; i++)
                            ref_store(sbuf[r], i, dt, ref_input(dt, op, r, i, seed));
                        for (int i = 0; i < 3; i++)
                            small_in[r][i] = 100 * r + i;
                        op_init(&t[r], HCCL_COLL_ALLREDUCE, sbuf[r], rbuf[r], count, dt, op);
                        op_init(&small[r], HCCL_COLL_ALLREDUCE, small_in[r], small_out[r], 3,
                                hcclInt32, hcclSum);
                    }
                    for (int r = 0; r < n; r++) {
                        hccl_lane_enqueue(w->lane[r], &t[r].op);
                        hccl_lane_enqueue(w->lane[r], &small[r].op);
                        drive(w);
                        for (int q = 0; q <= r; q++)
                            assert_int_equal(t[q].done + small[q].done, r == n - 1 ? 2 : 0);
                    }
                    for (int r = 0; r < n; r++) {
                        assert_int_equal(t[r].res, hcclSuccess);
                        assert_int_equal(small[r].res, hcclSuccess);
                        assert_int_equal(small[r].op.lseq, t[r].op.lseq + 1);
                        assert_true(t[r].op.sendbuf == sbuf[r] && t[r].op.recvbuf == rbuf[r]);
                        assert_int_equal(t[r].op.count, count);
                        for (int i = 0; i < 3; i++)
                            assert_int_equal(small_out[r][i], 100 * n * (n - 1) / 2 + n * i);
                        if (memcmp(rbuf[r], rbuf[0], count * esz) != 0)
                            fail_msg("n=%d %s count %zu: rank %d's result differs from rank 0's", n,
                                     hccl_dtype_name(dt), count, r);
                    }
                    /* The pieces took one round each, the small one the next. */
                    assert_int_equal(t[0].op.lseq, next_round + rounds - 1);
                    next_round += rounds + 1;
                    for (size_t i = 0; i < count; i++) {
                        double got = ref_load(rbuf[0], i, dt),
                               want = ref_reduce(dt, op, n, i, seed);
                        if (!ref_close(dt, got, want))
                            fail_msg("n=%d %s %s count %zu elem %zu: got %g want %g", n,
                                     hccl_dtype_name(dt), hccl_op_name(op), count, i, got, want);
                    }
                    for (int r = 0; r < n; r++) {
                        if (!in_place)
                            free(rbuf[r]);
                        free(sbuf[r]);
                    }
                }
            }
            world_free(w);
        }
    }
}

/* Several operations queued at once on some ranks and one at a time on others: results come
 * out in order. */
static void test_queued_in_order(void **state)
{
    enum { N = 4, K = 9 };
    world_t *w = world_new(N, 64);
    int32_t in[N][K][4], out[N][K][4];
    test_op_t t[N][K];

    (void)state;
    for (int r = 0; r < N; r++)
        for (int k = 0; k < K; k++) {
            for (int i = 0; i < 4; i++)
                in[r][k][i] = 1000 * k + 10 * r + i;
            op_init(&t[r][k], k % 3 == 2 ? HCCL_COLL_BARRIER : HCCL_COLL_ALLREDUCE, in[r][k], out[r][k],
                    4, hcclInt32, hcclSum);
        }
    /* Rank 0 queues everything, then the others come one operation at a time. */
    for (int k = 0; k < K; k++)
        hccl_lane_enqueue(w->lane[0], &t[0][k].op);
    assert_false(hccl_lane_idle(w->lane[0]));
    for (int k = 0; k < K; k++) {
        for (int r = 1; r < N; r++)
            hccl_lane_enqueue(w->lane[r], &t[r][k].op);
        drive(w);
        for (int r = 0; r < N; r++)
            for (int j = 0; j < K; j++)
                assert_int_equal(t[r][j].done, j <= k);
    }
    for (int r = 0; r < N; r++) {
        assert_true(hccl_lane_idle(w->lane[r]));
        for (int k = 0; k < K; k++) {
            if (k % 3 == 2)
                continue;
            for (int i = 0; i < 4; i++)
                assert_int_equal(out[r][k][i], N * (1000 * k + i) + 10 * (N * (N - 1) / 2));
        }
    }
    world_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce_every_type), cmocka_unit_test(test_allreduce_group_choice),
        cmocka_unit_test(test_grouped_waiting_for),  cmocka_unit_test(test_allreduce_grouped),
        cmocka_unit_test(test_queued_in_order),      cmocka_unit_test(test_allreduce_pieces),
    };
    int failed;

    lane_over_sim = false;
    failed = cmocka_run_group_tests_name("lane over the shm window", tests, NULL, NULL);
    lane_over_sim = true;
    return failed + cmocka_run_group_tests_name("lane over the sim window", tests, NULL, NULL);
}
