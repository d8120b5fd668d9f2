/*
 * Blocks read single-copy from their owners' buffers instead of copied through the slots:
 * AlltoAll (and rank 0's choice between the two ways), and the shares of reductions; over
 * shm's window and sim's (lane_world.h).
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

#include "lane_world.h"
#include "reference.h"

static void on_fatal_any(void *arg, hcclResult_t res, const char *msg)
{
    snprintf(arg, 512, "%d %s", (int)res, msg);
}

/* A sandbox may refuse process_vm_readv even on ourselves: the lane never goes direct there
 * (its start-up probe fails), so there is nothing to test. */
static bool cma_refused(void)
{
    int word = 1, got = 0;
    struct iovec l = {&got, sizeof(got)}, r = {&word, sizeof(word)};

    return process_vm_readv(getpid(), &l, 1, &r, 1, 0) != (ssize_t)sizeof(got);
}

/* A world of n ranks that can each read every other's memory (all are this process), whose
 * lanes take limits (direct_min and reduce_direct_min: which blocks are read where their
 * owner left them); NULL where the sandbox refuses such reads. */
static world_t *direct_world(int n, const hccl_lane_limits_t *limits, int fds[2])
{
    world_t *w;

    if (cma_refused())
        return NULL;
    w = world_new(n, HCCL_WINDOW_CAP);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    for (int r = 0; !w->sim && r < w->n; r++) {
        atomic_store(&((shm_seg_hdr_t *)w->seg[r])->reads_all, 1);
        for (int p = 0; p < w->n; p++) {
            w->conn[r][p].pid = getpid();
            w->conn[r][p].out_fd = fds[0]; /* open and silent: the peer lives */
        }
    }
    for (int r = 0; r < w->n; r++) {
        hccl_lane_destroy(w->lane[r]);
        assert_int_equal(hccl_lane_create(w->win, w->wctx[r], r, w->n, limits, on_fatal_any,
                                          &w->fatal[r], &w->lane[r]),
                         hcclSuccess);
        if (w->sim)
            w->win->on_bell(w->wctx[r], hccl_lane_poll, w->lane[r]);
    }
    return w;
}

/* Ranks 0 and 1 start t first; rank 2 comes last, reads what it needs, and its block, read
 * single-copy, holds it until both released it; then all three finish. */
static void last_waits_for_release(world_t *w, test_op_t *t)
{
    char buf[64];

    hccl_lane_enqueue(w->lane[0], &t[0].op);
    hccl_lane_enqueue(w->lane[1], &t[1].op);
    drive(w);
    hccl_lane_enqueue(w->lane[2], &t[2].op);
    assert_true(t[2].op.direct);
    assert_int_equal(t[2].done, 0);
    assert_true(hccl_lane_waiting_for(w->lane[2], &t[2].op, buf, sizeof(buf)));
    assert_string_equal(buf, "0, 1");
    drive(w);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(t[r].done, 1);
        assert_int_equal(t[r].res, hcclSuccess);
    }
}

/* AlltoAll blocks read single-copy from their owners' buffers, next to one copied through its
 * slot (in place): right everywhere, and an owner finishes only once every reader released it. */
static void test_alltoall_direct(void **state)
{
    enum { N = 3, C = 5000 };
    static int32_t in[N][N * C], out[N][N * C];
    test_op_t t[N];
    int fds[2];
    world_t *w = direct_world(N,
                              &(hccl_lane_limits_t){.max_bytes = HCCL_WINDOW_CAP,
                                                    .flat_max = HCCL_LANE_FLAT_MAX,
                                                    .rooted_max = HCCL_WINDOW_CAP,
                                                    .direct_min = 4096,
                                                    .reduce_direct_min = SIZE_MAX,
                                                    .pieces_above = SIZE_MAX},
                              fds);

    (void)state;
    if (!w)
        skip();
    for (int r = 0; r < N; r++) {
        for (int i = 0; i < N * C; i++) {
            in[r][i] = 100000 * r + i;
            out[r][i] = -1;
        }
        op_init(&t[r], HCCL_COLL_ALLTOALL, in[r], r == 1 ? in[r] : out[r], C, hcclInt32, hcclSum);
    }
    last_waits_for_release(w, t);
    assert_true(t[0].op.direct);
    assert_false(t[1].op.direct); /* in place: peers would read what it overwrites */
    for (int r = 0; r < N; r++) {
        const int32_t *got = r == 1 ? in[r] : out[r];
        for (int q = 0; q < N; q++)
            for (int i = 0; i < C; i++)
                assert_int_equal(got[q * C + i], 100000 * q + r * C + i);
    }
    /* Below direct_min, and a block whose address cannot be read: the reader's lane stops and
     * says whose block it was. */
    for (int r = 0; r < N; r++)
        op_init(&t[r], HCCL_COLL_ALLTOALL, in[r], out[r], 100, hcclInt32, hcclSum);
    hccl_lane_enqueue(w->lane[0], &t[0].op);
    assert_false(t[0].op.direct);
    drive(w);
    hccl_lane_enqueue(w->lane[1], &t[1].op);
    hccl_lane_enqueue(w->lane[2], &t[2].op);
    drive(w);
    for (int r = 0; r < N; r++)
        assert_int_equal(t[r].done, 1);
    for (int r = 0; r < N; r++)
        op_init(&t[r], HCCL_COLL_ALLTOALL, in[r], out[r], C, hcclInt32, hcclSum);
    if (w->sim) { /* a read that fails is shm's alone */
        for (int r = 0; r < N; r++)
            hccl_lane_enqueue(w->lane[r], &t[r].op);
        drive(w);
        for (int r = 0; r < N; r++)
            assert_int_equal(t[r].done, 1);
        goto out;
    }
    hccl_lane_enqueue(w->lane[0], &t[0].op);
    ((shm_window_slot_t *)((char *)w->seg[0] + SHM_SEG_HDR_BYTES) + (t[0].op.lseq & 1))->addr =
        4096;
    hccl_lane_enqueue(w->lane[2], &t[2].op); /* reads rank 0's block first */
    assert_int_equal(t[2].done, 0);
    assert_non_null(strstr(w->fatal[2], "rank 0's window block"));
    assert_int_equal(atoi(w->fatal[2]), hcclRemoteError);
    hccl_lane_fail_all(w->lane[2], hcclRemoteError, "stopped");
    assert_int_equal(t[2].res, hcclRemoteError);
out:
    close(fds[0]);
    close(fds[1]);
    world_free(w);
}

/*
 * Where AlltoAll blocks may go either way (direct_choice_min), rank 0 times the way direct_min
 * says and tries the other after 32 operations of a size class, and every rank follows,
 * whether it publishes before rank 0 rewrote the class's word or after: blocks below
 * direct_min are copied for 32 operations, then read single-copy for a try of six (the first
 * two warm up); right either way.
 */
static void test_alltoall_choice(void **state)
{
    enum { N = 3, C = 6000, OPS = 45 }; /* blocks of 72,000 bytes: the class from 64 KiB */
    static int32_t in[N][N * C], out[N][N * C];
    int fds[2], tried = 0;
    world_t *w = direct_world(N,
                              &(hccl_lane_limits_t){.max_bytes = HCCL_WINDOW_CAP,
                                                    .flat_max = HCCL_LANE_FLAT_MAX,
                                                    .rooted_max = HCCL_WINDOW_CAP,
                                                    .direct_min = SIZE_MAX,
                                                    .reduce_direct_min = SIZE_MAX,
                                                    .choice_ns = 1,
                                                    .pieces_above = SIZE_MAX,
                                                    .direct_choice_min = 4096},
                              fds);

    (void)state;
    if (!w)
        skip();
    for (int k = 0; k < OPS; k++) {
        test_op_t t[N];
        for (int r = 0; r < N; r++) {
            for (int i = 0; i < N * C; i++) {
                in[r][i] = 100000 * r + i + k;
                out[r][i] = -1;
            }
            op_init(&t[r], HCCL_COLL_ALLTOALL, in[r], out[r], C, hcclInt32, hcclSum);
        }
        run_all(w, t, k % 2);
        for (int r = 0; r < N; r++) {
            assert_int_equal(t[r].op.direct, t[0].op.direct);
            for (int q = 0; q < N; q++)
                for (int i = 0; i < C; i += 7)
                    assert_int_equal(out[r][q * C + i], 100000 * q + r * C + i + k);
        }
        if (k < 38)
            assert_int_equal(t[0].op.direct, k >= 32);
        tried += t[0].op.direct;
    }
    assert_true(tried >= 6);
    close(fds[0]);
    close(fds[1]);
    world_free(w);
}

enum { DN = 3, DSHARE = 70000 }; /* a share spans two single-copy tiles of int32 */

/* Fills rank r's sendbuf of count elements of dt (ref_input of op and seed). */
static void *direct_input(int r, size_t count, hcclDataType_t dt, hcclRedOp_t op, unsigned seed)
{
    void *buf = malloc(count * hccl_dtype_size(dt));

    assert_non_null(buf);
    for (size_t i = 0; i < count; i++)
        ref_store(buf, i, dt, ref_input(dt, op, r, i, seed));
    return buf;
}

/* got[i - first] for i in [first, first + n) is the reduction of every rank's input i. */
static void direct_check(const void *got, size_t first, size_t n, hcclDataType_t dt, hcclRedOp_t op,
                         unsigned seed, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double g = ref_load(got, i, dt), want = ref_reduce(dt, op, DN, first + i, seed);
        if (!ref_close(dt, g, want))
            fail_msg("%s %s %s elem %zu: got %g want %g", what, hccl_dtype_name(dt),
                     hccl_op_name(op), first + i, g, want);
    }
}

/*
 * Split AllReduces (in place on rank 1, in two pieces), a split Reduce and ReduceScatters (in
 * place on rank 1, which is then copied through its slot) whose blocks are read single-copy:
 * right, the same bits on every rank, and an owner that gathers nothing finishes only once
 * every reader released its block; a call below reduce_direct_min is copied; a block whose
 * address cannot be read stops the reader's lane, which says whose block it was.
 */
static void test_reduce_direct(void **state)
{
    const size_t count = DN * DSHARE, piece = count / 2 + 1;
    void *sbuf[DN], *rbuf[DN];
    test_op_t t[DN];
    int fds[2];
    /* Blocks of a piece (4 bytes each) below reduce_direct_min, the call's above. */
    world_t *w = direct_world(DN,
                              &(hccl_lane_limits_t){.max_bytes = piece * 4,
                                                    .flat_max = HCCL_LANE_FLAT_MAX,
                                                    .rooted_max = piece * 4,
                                                    .direct_min = SIZE_MAX,
                                                    .reduce_direct_min = count * 4,
                                                    .pieces_above = piece * 4},
                              fds);

    (void)state;
    if (!w)
        skip();
    for (int k = 0; k < 2; k++) {
        hcclDataType_t dt = k ? hcclFloat32 : hcclInt32;
        hcclRedOp_t op = k ? hcclSum : hcclMax;
        for (int r = 0; r < DN; r++) {
            sbuf[r] = direct_input(r, count, dt, op, 10 + k);
            rbuf[r] = r == 1 ? sbuf[r] : calloc(count, 4);
            op_init(&t[r], HCCL_COLL_ALLREDUCE, sbuf[r], rbuf[r], count, dt, op);
            hccl_lane_enqueue(w->lane[r], &t[r].op);
        }
        drive(w);
        for (int r = 0; r < DN; r++) {
            assert_int_equal(t[r].done, 1);
            assert_int_equal(t[r].res, hcclSuccess);
            assert_true(t[r].op.direct); /* the last piece's */
            assert_memory_equal(rbuf[r], rbuf[0], count * 4);
        }
        assert_int_equal(t[0].op.lseq, 2 * k + 1); /* two pieces */
        direct_check(rbuf[0], 0, count, dt, op, 10 + k, "allreduce");
        for (int r = 0; r < DN; r++) {
            if (r != 1)
                free(rbuf[r]);
            free(sbuf[r]);
        }
    }
    /* A Reduce to rank 0: rank 2 comes last, reads its share, and waits for the others to
     * release its block; so does rank 1 (rank 0 gathers every part, which says as much). */
    for (int r = 0; r < DN; r++) {
        sbuf[r] = direct_input(r, count, hcclInt32, hcclSum, 20);
        rbuf[r] = calloc(count, 4);
        op_init(&t[r], HCCL_COLL_REDUCE, sbuf[r], rbuf[r], count, hcclInt32, hcclSum);
    }
    last_waits_for_release(w, t);
    direct_check(rbuf[0], 0, count, hcclInt32, hcclSum, 20, "reduce");
    /* ReduceScatter: each rank's result is its share of the call (DSHARE elements). */
    for (int r = 0; r < DN; r++) {
        op_init(&t[r], HCCL_COLL_REDUCESCATTER, sbuf[r],
                r == 1 ? (int32_t *)sbuf[r] + DSHARE : rbuf[r], DSHARE, hcclInt32, hcclSum);
        hccl_lane_enqueue(w->lane[r], &t[r].op);
    }
    drive(w);
    for (int r = 0; r < DN; r++) {
        assert_int_equal(t[r].done, 1);
        assert_int_equal(t[r].res, hcclSuccess);
        assert_int_equal(t[r].op.direct, r != 1);
        direct_check(t[r].op.recvbuf, (size_t)r * DSHARE, DSHARE, hcclInt32, hcclSum, 20,
                     "reducescatter");
    }
    /* A piece alone is below reduce_direct_min (new inputs: rank 1's share of its own
     * changed in place). */
    for (int r = 0; r < DN; r++) {
        free(sbuf[r]);
        sbuf[r] = direct_input(r, count, hcclInt32, hcclSum, 30);
        op_init(&t[r], HCCL_COLL_ALLREDUCE, sbuf[r], rbuf[r], piece, hcclInt32, hcclSum);
        hccl_lane_enqueue(w->lane[r], &t[r].op);
    }
    drive(w);
    for (int r = 0; r < DN; r++) {
        assert_int_equal(t[r].done, 1);
        assert_false(t[r].op.direct);
    }
    direct_check(rbuf[2], 0, piece, hcclInt32, hcclSum, 30, "allreduce below the line");
    if (!w->sim) { /* a read that fails is shm's alone */
        for (int r = 0; r < DN; r++)
            op_init(&t[r], HCCL_COLL_REDUCESCATTER, sbuf[r], rbuf[r], DSHARE, hcclInt32, hcclSum);
        hccl_lane_enqueue(w->lane[1], &t[1].op);
        hccl_lane_enqueue(w->lane[2], &t[2].op);
        ((shm_window_slot_t *)((char *)w->seg[1] + SHM_SEG_HDR_BYTES) + (t[1].op.lseq & 1))->addr =
            4096;                                /* below any mapping */
        hccl_lane_enqueue(w->lane[0], &t[0].op); /* reads its share of rank 1's first */
        assert_int_equal(t[0].done, 0);
        assert_non_null(strstr(w->fatal[0], "rank 1's window block"));
        assert_int_equal(atoi(w->fatal[0]), hcclRemoteError);
        for (int r = 0; r < DN; r++)
            hccl_lane_fail_all(w->lane[r], hcclRemoteError, "stopped");
    }
    for (int r = 0; r < DN; r++) {
        free(sbuf[r]);
        free(rbuf[r]);
    }
    close(fds[0]);
    close(fds[1]);
    world_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alltoall_direct),
        cmocka_unit_test(test_alltoall_choice),
        cmocka_unit_test(test_reduce_direct),
    };
    int failed;

    lane_over_sim = false;
    failed = cmocka_run_group_tests_name("lane over the shm window", tests, NULL, NULL);
    lane_over_sim = true;
    return failed + cmocka_run_group_tests_name("lane over the sim window", tests, NULL, NULL);
}
