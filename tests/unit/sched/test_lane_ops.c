/*
 * The lane's other collectives, publication ahead of a predecessor, replacement and failure,
 * split operations' waits, mismatched calls and which calls it takes; over shm's window and
 * sim's (lane_world.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "algos/algos.h"
#include "lane_world.h"
#include "reference.h"

/*
 * Operations queued several at a time: the next one publishes while its predecessor waits for
 * parts or releases, into the slot of the one before, which a peer may still be gathering
 * from. Each kind of operation follows each other kind (a grouped AllReduce writes its group's
 * sum into its block; a block that only moves is read while its owner is a step ahead), ranks
 * arrive in a random order and poll in random turns, and every result is checked.
 */
enum { AH_K = 18, AH_C = 700 };
static int32_t ah_in[MAXR][AH_K][MAXR * AH_C], ah_out[MAXR][AH_K][MAXR * AH_C];

static uint32_t ah_rand(uint32_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    return *x;
}

static int ah_coll(int k)
{
    static const int colls[] = {HCCL_COLL_ALLREDUCE, HCCL_COLL_ALLGATHER, HCCL_COLL_ALLTOALL,
                                HCCL_COLL_BROADCAST, HCCL_COLL_REDUCESCATTER, HCCL_COLL_REDUCE};
    return colls[k % 6];
}

/* Elements per rank of operation k (per peer for AlltoAll, per share for ReduceScatter). */
static size_t ah_count(int k)
{
    int coll = ah_coll(k);

    return coll == HCCL_COLL_ALLTOALL ? 100 : coll == HCCL_COLL_REDUCESCATTER ? 150 : 600;
}

static int32_t ah_value(int k, int r, size_t i)
{
    return 100000 * k + 1000 * r + (int32_t)i;
}

static void ah_check(int n, int k, int r)
{
    int coll = ah_coll(k), root = k % n;
    size_t count = ah_count(k);
    const int32_t *out = coll == HCCL_COLL_BROADCAST ? ah_in[r][k] : ah_out[r][k];

    for (size_t i = 0; i < count; i++) {
        int64_t sum = 0;
        for (int q = 0; q < n; q++)
            sum += ah_value(k, q, coll == HCCL_COLL_REDUCESCATTER ? (size_t)r * count + i : i);
        switch (coll) {
        case HCCL_COLL_ALLREDUCE:
        case HCCL_COLL_REDUCESCATTER:
            assert_int_equal(out[i], sum);
            break;
        case HCCL_COLL_REDUCE:
            assert_int_equal(out[i], r == root ? sum : -1);
            break;
        case HCCL_COLL_BROADCAST:
            assert_int_equal(out[i], ah_value(k, root, i));
            break;
        case HCCL_COLL_ALLGATHER:
            for (int q = 0; q < n; q++)
                assert_int_equal(out[(size_t)q * count + i], ah_value(k, q, i));
            break;
        case HCCL_COLL_ALLTOALL:
            for (int q = 0; q < n; q++)
                assert_int_equal(out[(size_t)q * count + i], ah_value(k, q, (size_t)r * count + i));
            break;
        }
    }
}

static void publish_ahead_run(world_t *w, uint32_t seed, int *ahead)
{
    int n = w->n, queued[MAXR] = {0}, idle = 0;
    static test_op_t t[MAXR][AH_K];

    for (int r = 0; r < n; r++)
        for (int k = 0; k < AH_K; k++) {
            int coll = ah_coll(k);
            for (size_t i = 0; i < (size_t)MAXR * AH_C; i++) {
                ah_in[r][k][i] = ah_value(k, r, i);
                ah_out[r][k][i] = -1;
            }
            op_init(&t[r][k], coll, ah_in[r][k], coll == HCCL_COLL_BROADCAST ? ah_in[r][k] : ah_out[r][k],
                    ah_count(k), hcclInt32, hcclSum);
            t[r][k].op.root = k % n;
        }
    for (int k = 0; k < AH_K; k++) /* rank 0 queues everything at once */
        hccl_lane_enqueue(w->lane[0], &t[0][k].op);
    queued[0] = AH_K;
    for (int left = n * AH_K; left > 0;) {
        int r = (int)(ah_rand(&seed) % (uint32_t)n);
        bool moved = false;
        if (queued[r] < AH_K && ah_rand(&seed) % 3 == 0) {
            hccl_lane_enqueue(w->lane[r], &t[r][queued[r]++].op);
            moved = true;
        }
        for (uint32_t p = ah_rand(&seed) % 3; p > 0; p--)
            moved |= hccl_lane_poll(w->lane[r]);
        for (int k = 0; k + 1 < queued[r]; k++)
            *ahead += !t[r][k].done && t[r][k + 1].op.published;
        left = 0;
        for (int q = 0; q < n; q++)
            for (int k = 0; k < AH_K; k++)
                left += !t[q][k].done;
        idle = moved ? 0 : idle + 1;
        if (idle > 1000) { /* every rank had turns: something must have moved */
            bool all_queued = true;
            for (int q = 0; q < n; q++)
                all_queued &= queued[q] == AH_K;
            assert_false(all_queued && drive(w) == 0 && left > 0);
            idle = 0;
        }
    }
    for (int r = 0; r < n; r++)
        for (int k = 0; k < AH_K; k++) {
            assert_int_equal(t[r][k].res, hcclSuccess);
            ah_check(n, k, r);
        }
}

static void test_publish_ahead(void **state)
{
    static const layout_t cases[] = {
        {4, {0, 1, 0, 1}, true},
        {3, {0, 1, 0}, true},
        {4, {0}, false},
        {2, {0}, false},
    };

    (void)state;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        int ahead = 0;
        for (uint32_t seed = 1; seed <= 24; seed++) {
            /* Split above 1 KiB: the AllReduces and Reduces of 600 int32 go through the parts. */
            world_t *w = world_new_groups(cases[c].n, HCCL_WINDOW_CAP, 1024,
                                          cases[c].grouped ? cases[c].group_of : NULL, cases[c].grouped);
            publish_ahead_run(w, seed * 2654435761u, &ahead);
            world_free(w);
        }
        assert_true(ahead > 0);
    }
}

/* What a timeout reports, a driver handing its operation over, and failure. */
static void test_wait_replace_fail(void **state)
{
    world_t *w = world_new(3, 64);
    int32_t a = 1, b = 2, c = 3, ra = 0, rb = 0, rc = 0;
    test_op_t t0, t0b, copy_holder, t1, t2;
    hccl_lane_op_t *copy = malloc(sizeof(*copy));
    char buf[128];

    (void)state;
    op_init(&t0, HCCL_COLL_ALLREDUCE, &a, &ra, 1, hcclInt32, hcclSum);
    op_init(&t0b, HCCL_COLL_BARRIER, NULL, NULL, 0, hcclUint8, hcclSum);
    hccl_lane_enqueue(w->lane[0], &t0.op);
    hccl_lane_enqueue(w->lane[0], &t0b.op);
    assert_true(hccl_lane_waiting_for(w->lane[0], &t0.op, buf, sizeof(buf)));
    assert_string_equal(buf, "1, 2");
    assert_true(hccl_lane_waiting_for(w->lane[0], &t0b.op, buf, sizeof(buf)));
    assert_string_equal(buf, "");
    op_init(&t2, HCCL_COLL_ALLREDUCE, &c, &rc, 1, hcclInt32, hcclSum);
    hccl_lane_enqueue(w->lane[2], &t2.op);
    drive(w);
    assert_true(hccl_lane_waiting_for(w->lane[0], &t0.op, buf, sizeof(buf)));
    assert_string_equal(buf, "1");
    assert_false(hccl_lane_waiting_for(w->lane[1], &t0.op, buf, sizeof(buf)));

    /* Rank 0's first operation changes hands: the copy is what completes. */
    op_init(&copy_holder, 0, NULL, NULL, 0, hcclUint8, hcclSum);
    hccl_lane_replace(w->lane[0], &t0.op, copy);
    copy->arg = &copy_holder;
    op_init(&t1, HCCL_COLL_ALLREDUCE, &b, &rb, 1, hcclInt32, hcclSum);
    hccl_lane_enqueue(w->lane[1], &t1.op);
    drive(w);
    assert_int_equal(t0.done, 0);
    assert_int_equal(copy_holder.done, 1);
    assert_int_equal(ra, 6);
    assert_int_equal(rb, 6);
    assert_int_equal(rc, 6);
    free(copy);

    /* The barrier waits for the others; failure ends it and refuses what comes later. */
    assert_int_equal(t0b.done, 0);
    hccl_lane_fail_all(w->lane[0], hcclRemoteError, "rank 2 died");
    assert_int_equal(t0b.done, 1);
    assert_int_equal(t0b.res, hcclRemoteError);
    assert_string_equal(t0b.msg, "rank 2 died");
    assert_true(hccl_lane_idle(w->lane[0]));
    op_init(&t0, HCCL_COLL_BARRIER, NULL, NULL, 0, hcclUint8, hcclSum);
    hccl_lane_enqueue(w->lane[0], &t0.op);
    assert_int_equal(t0.done, 1);
    assert_int_equal(t0.res, hcclRemoteError);
    world_free(w);
}

/* Ranks that called different collectives are told, on every rank that can see it. */
static void test_mismatch(void **state)
{
    world_t *w = world_new(2, 64);
    int32_t a[5] = {0}, b[5] = {0};
    test_op_t t0, t1;
    hccl_unexp_t held = {0};
    hccl_xfer_t sent;

    (void)state;
    op_init(&t0, HCCL_COLL_ALLREDUCE, a, a, 4, hcclInt32, hcclSum);
    op_init(&t1, HCCL_COLL_ALLREDUCE, b, b, 5, hcclInt32, hcclSum);
    hccl_lane_enqueue(w->lane[0], &t0.op);
    hccl_lane_enqueue(w->lane[1], &t1.op);
    drive(w);
    assert_int_equal(t0.done + t1.done, 0);
    for (int r = 0; r < 2; r++)
        assert_non_null(strstr(w->fatal[r], "collective mismatch"));
    assert_non_null(strstr(w->fatal[0], "collective mismatch at seq 0: rank 1 called allreduce(int32, sum)"));
    hccl_lane_fail_all(w->lane[0], hcclInvalidUsage, w->fatal[0]);
    hccl_lane_fail_all(w->lane[1], hcclInvalidUsage, w->fatal[1]);
    assert_int_equal(t0.res, hcclInvalidUsage);
    assert_int_equal(t1.res, hcclInvalidUsage);
    world_free(w);

    /* Rank 0 ran the call as a plan (it sent a message of that seq); rank 1 is on the lane. */
    w = world_new(2, 64);
    held.f.seq = 7;
    held.f.sig = hccl_sig_make(HCCL_COLL_ALLREDUCE, hcclInt32, hcclSum, -1, 100000);
    if (w->sim) { /* a send that waits for rank 1's receive */
        hccl_conn_t *c = hccl_sim_world_conns(w->sim, 0)[1];
        sent = (hccl_xfer_t){.seq = 7, .sig = held.f.sig, .peer = 1};
        assert_int_equal(c->ops->post_send(c, &sent), hcclSuccess);
    } else {
        w->conn[1][0].framer.unexp_head = &held;
    }
    op_init(&t1, HCCL_COLL_BARRIER, NULL, NULL, 0, hcclUint8, hcclSum);
    t1.op.seq = 7;
    hccl_lane_enqueue(w->lane[1], &t1.op);
    drive(w);
    assert_int_equal(t1.done, 0);
    assert_non_null(strstr(w->fatal[1], "collective mismatch at seq 7: rank 0 called allreduce"));
    assert_non_null(strstr(w->fatal[1], "(it sent a message of it), this rank barrier()"));
    w->conn[1][0].framer.unexp_head = NULL;
    world_free(w);
}

/* Broadcast, Reduce (flat and split), AllGather, ReduceScatter and AlltoAll, in place and not. */
static void test_other_collectives(void **state)
{
    enum { C = 600 }; /* int32 per rank: 2400 B, split above a flat limit of 1 KiB */
    (void)state;
    for (int n = 2; n <= 5; n += 3) {
        world_t *w = world_new_split(n, HCCL_WINDOW_CAP, 1024);
        static int32_t in[5][5 * C], out[5][5 * C];
        test_op_t t[5];
        static const int colls[] = {HCCL_COLL_BROADCAST, HCCL_COLL_REDUCE, HCCL_COLL_ALLGATHER,
                                    HCCL_COLL_REDUCESCATTER, HCCL_COLL_ALLTOALL};
        for (size_t ci = 0; ci < sizeof(colls) / sizeof(colls[0]); ci++) {
            for (size_t count = 1; count <= C; count += C - 1) {
                int coll = colls[ci], root = n - 1;
                for (int r = 0; r < n; r++) {
                    for (int i = 0; i < 5 * C; i++) {
                        in[r][i] = 1000 * r + i;
                        out[r][i] = -1;
                    }
                    /* Broadcast works in place: the root's buffer is both. */
                    op_init(&t[r], coll, in[r], coll == HCCL_COLL_BROADCAST ? in[r] : out[r], count, hcclInt32,
                            hcclSum);
                    t[r].op.root = root;
                }
                for (int r = n - 1; r >= 0; r--)
                    hccl_lane_enqueue(w->lane[r], &t[r].op);
                drive(w);
                for (int r = 0; r < n; r++) {
                    assert_int_equal(t[r].done, 1);
                    for (size_t i = 0; i < count; i++) {
                        int64_t sum_i = 0;
                        for (int q = 0; q < n; q++)
                            sum_i += 1000 * q + (int64_t)i;
                        switch (coll) {
                        case HCCL_COLL_BROADCAST:
                            assert_int_equal(in[r][i], 1000 * root + (int)i);
                            break;
                        case HCCL_COLL_REDUCE:
                            assert_int_equal(out[r][i], r == root ? sum_i : -1);
                            break;
                        case HCCL_COLL_ALLGATHER:
                            for (int q = 0; q < n; q++)
                                assert_int_equal(out[r][(size_t)q * count + i], 1000 * q + (int)i);
                            break;
                        case HCCL_COLL_REDUCESCATTER: {
                            int64_t want = 0;
                            for (int q = 0; q < n; q++)
                                want += 1000 * q + (int64_t)((size_t)r * count + i);
                            assert_int_equal(out[r][i], want);
                            break;
                        }
                        case HCCL_COLL_ALLTOALL:
                            for (int q = 0; q < n; q++)
                                assert_int_equal(out[r][(size_t)q * count + i],
                                                 1000 * q + (int)((size_t)r * count + i));
                            break;
                        }
                    }
                }
            }
        }
        world_free(w);
    }
}

/* A split operation waits for every block, then for every part, and says which. */
static void test_split_waits(void **state)
{
    world_t *w = world_new_split(3, HCCL_WINDOW_CAP, 0);
    int32_t in[3][5], out[3][5];
    test_op_t t[3];
    char buf[64];

    (void)state;
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < 5; i++)
            in[r][i] = 10 * r + i;
        op_init(&t[r], HCCL_COLL_ALLREDUCE, in[r], out[r], 5, hcclInt32, hcclSum);
    }
    hccl_lane_enqueue(w->lane[0], &t[0].op);
    hccl_lane_enqueue(w->lane[1], &t[1].op);
    assert_true(hccl_lane_waiting_for(w->lane[1], &t[1].op, buf, sizeof(buf)));
    assert_string_equal(buf, "2");
    hccl_lane_enqueue(w->lane[2], &t[2].op); /* all blocks in: rank 2 publishes its part */
    assert_true(hccl_lane_waiting_for(w->lane[2], &t[2].op, buf, sizeof(buf)));
    assert_string_equal(buf, "0, 1");
    assert_true(hccl_lane_poll(w->lane[1]));
    assert_true(hccl_lane_waiting_for(w->lane[1], &t[1].op, buf, sizeof(buf)));
    assert_string_equal(buf, "0");
    drive(w);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(t[r].done, 1);
        for (int i = 0; i < 5; i++)
            assert_int_equal(out[r][i], 30 + 3 * i);
    }
    world_free(w);
}

static void test_takes(void **state)
{
    world_t *w = world_new(2, 100);
    hccl_lane_limits_t limits;

    (void)state;
    assert_false(hccl_lane_takes(NULL, HCCL_COLL_BARRIER, 0));
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_BARRIER, 0));
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLREDUCE, 100));
    assert_false(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLREDUCE, 101));
    assert_false(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLREDUCE, 0));
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_BROADCAST, 8));
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_REDUCE, 8));
    assert_int_equal(hccl_lane_call_bytes(HCCL_COLL_ALLGATHER, 5, hcclInt32, 3), 20);
    assert_int_equal(hccl_lane_call_bytes(HCCL_COLL_REDUCESCATTER, 5, hcclInt32, 3), 60);
    assert_int_equal(hccl_lane_call_bytes(HCCL_COLL_ALLTOALL, 5, hcclInt64, 3), 120);
    assert_int_equal(hccl_lane_call_bytes(HCCL_COLL_ALLTOALL, SIZE_MAX / 4, hcclInt64, 3), SIZE_MAX);
    assert_int_equal(hccl_lane_call_bytes(HCCL_COLL_ALLTOALLV, 5, hcclInt32, 3), SIZE_MAX);
    assert_false(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLTOALLV, SIZE_MAX));
    /* Where ranks share CPUs, small rooted calls keep to plans. */
    limits = (hccl_lane_limits_t){.max_bytes = 4096,
                                  .flat_max = 2048,
                                  .rooted_min = 1024,
                                  .rooted_max = 8192,
                                  .direct_min = SIZE_MAX,
                                  .reduce_direct_min = SIZE_MAX,
                                  .pieces_above = SIZE_MAX};
    hccl_lane_destroy(w->lane[0]);
    assert_int_equal(hccl_lane_create(w->win, w->wctx[0], 0, 2, &limits, lane_world_on_fatal,
                                      &w->fatal[0], &w->lane[0]),
                     hcclSuccess);
    assert_false(hccl_lane_takes(w->lane[0], HCCL_COLL_BROADCAST, 1023));
    assert_false(hccl_lane_takes(w->lane[0], HCCL_COLL_REDUCE, 512));
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_REDUCE, 1024));
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_BROADCAST, 8192));
    assert_false(hccl_lane_takes(w->lane[0], HCCL_COLL_BROADCAST, 8193));
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLGATHER, 512));
    assert_false(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLGATHER, 4097));
    assert_false(hccl_lane_in_pieces(w->lane[0], HCCL_COLL_ALLREDUCE));
    /* AllReduces above pieces_above come back, in pieces; others between the two do not. */
    limits.pieces_above = 8192;
    hccl_lane_destroy(w->lane[0]);
    assert_int_equal(hccl_lane_create(w->win, w->wctx[0], 0, 2, &limits, lane_world_on_fatal,
                                      &w->fatal[0], &w->lane[0]),
                     hcclSuccess);
    assert_true(hccl_lane_in_pieces(w->lane[0], HCCL_COLL_ALLREDUCE));
    assert_false(hccl_lane_in_pieces(w->lane[0], HCCL_COLL_ALLGATHER));
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLREDUCE, 4096));
    assert_false(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLREDUCE, 8192));
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLREDUCE, 8193));
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLREDUCE, SIZE_MAX - 1));
    assert_false(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLGATHER, 8193));
    world_free(w);
    w = world_new(2, SIZE_MAX);
    assert_true(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLREDUCE, HCCL_WINDOW_CAP));
    assert_false(hccl_lane_takes(w->lane[0], HCCL_COLL_ALLREDUCE, HCCL_WINDOW_CAP + 1));
    world_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_publish_ahead), cmocka_unit_test(test_wait_replace_fail),
        cmocka_unit_test(test_mismatch),      cmocka_unit_test(test_other_collectives),
        cmocka_unit_test(test_split_waits),   cmocka_unit_test(test_takes),
    };
    int failed;

    lane_over_sim = false;
    failed = cmocka_run_group_tests_name("lane over the shm window", tests, NULL, NULL);
    lane_over_sim = true;
    return failed + cmocka_run_group_tests_name("lane over the sim window", tests, NULL, NULL);
}
