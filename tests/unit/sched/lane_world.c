/* The lane's test worlds (lane_world.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "lane_world.h"

bool lane_over_sim;
size_t lane_world_pieces_above = SIZE_MAX;

void lane_world_on_fatal(void *arg, hcclResult_t res, const char *msg)
{
    assert_int_equal(res, hcclInvalidUsage);
    snprintf(arg, 512, "%s", msg);
}

/* A world whose lanes split operations above flat_max bytes, in CPU groups group_of (or NULL). */
world_t *world_new_groups(int n, size_t max_bytes, size_t flat_max, const int *group_of,
                          bool always)
{
    world_t *w = calloc(1, sizeof(*w));
    /* Tries of the other way as soon as the operation counts allow (choice_ns 1). */
    hccl_lane_limits_t limits = {.max_bytes = max_bytes,
                                 .flat_max = flat_max,
                                 .rooted_max = max_bytes,
                                 .direct_min = SIZE_MAX,
                                 .reduce_direct_min = SIZE_MAX,
                                 .group_of = group_of,
                                 .group_always = always,
                                 .choice_ns = 1,
                                 .pieces_above = lane_world_pieces_above};

    assert_non_null(w);
    w->n = n;
    if (lane_over_sim) {
        assert_int_equal(hccl_sim_world_create(NULL, n, &w->sim), hcclSuccess);
        w->win = &hccl_sim_window_ops;
        for (int r = 0; r < n; r++) {
            assert_non_null(w->wctx[r] = hccl_sim_world_window(w->sim, r));
            assert_true(w->win->reaches_all(w->wctx[r], n));
            assert_false(w->win->reaches_all(w->wctx[r], n + 1));
            assert_int_equal(hccl_lane_create(w->win, w->wctx[r], r, n, &limits,
                                              lane_world_on_fatal, &w->fatal[r], &w->lane[r]),
                             hcclSuccess);
            w->win->on_bell(w->wctx[r], hccl_lane_poll, w->lane[r]);
        }
        return w;
    }
    w->win = &hccl_shm_window_ops;
    /* Zero pages, touched only where used, as a fresh shm segment is. */
    for (int r = 0; r < n; r++) {
        w->seg[r] = mmap(NULL, SHM_RINGS_OFFSET, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        assert_true(w->seg[r] != MAP_FAILED);
    }
    for (int r = 0; r < n; r++) {
        shm_ctx_t *ctx = &w->ctx[r];
        w->wctx[r] = ctx;
        w->env[r].rank = r;
        w->env[r].nranks = n;
        ctx->env = &w->env[r];
        ctx->seg = w->seg[r];
        ctx->conns = w->conns[r];
        ctx->active = w->active[r];
        for (int p = 0; p < n; p++) {
            if (p == r)
                continue;
            w->conn[r][p].peer_seg = w->seg[p];
            w->conn[r][p].peer_bell = -1; /* nothing to ring: the test polls */
            w->conns[r][p] = &w->conn[r][p];
            ctx->active[ctx->nactive++] = p;
        }
        assert_true(hccl_shm_window_ops.reaches_all(ctx, n));
        assert_int_equal(hccl_lane_create(&hccl_shm_window_ops, ctx, r, n, &limits,
                                          lane_world_on_fatal, &w->fatal[r], &w->lane[r]),
                         hcclSuccess);
    }
    return w;
}

world_t *world_new_split(int n, size_t max_bytes, size_t flat_max)
{
    return world_new_groups(n, max_bytes, flat_max, NULL, false);
}

world_t *world_new(int n, size_t max_bytes)
{
    return world_new_split(n, max_bytes, HCCL_LANE_FLAT_MAX);
}

void world_free(world_t *w)
{
    for (int r = 0; r < w->n; r++) {
        hccl_lane_destroy(w->lane[r]);
        if (!w->sim)
            munmap(w->seg[r], SHM_RINGS_OFFSET);
    }
    hccl_sim_world_destroy(w->sim);
    free(w);
}

static void on_done(hccl_lane_op_t *op, hcclResult_t res, const char *msg)
{
    test_op_t *t = op->arg;

    t->done++;
    t->res = res;
    snprintf(t->msg, sizeof(t->msg), "%s", msg ? msg : "");
}

void op_init(test_op_t *t, int coll, const void *sbuf, void *rbuf, size_t count, hcclDataType_t dt,
             hcclRedOp_t op)
{
    memset(t, 0, sizeof(*t));
    t->op.coll = coll;
    t->op.sendbuf = sbuf;
    t->op.recvbuf = rbuf;
    t->op.count = count;
    t->op.dtype = dt;
    t->op.op = op;
    t->op.done = on_done;
    t->op.arg = t;
}

void run_all(world_t *w, test_op_t *t, bool rank0_first)
{
    for (int i = 0; i < w->n; i++) {
        int r = rank0_first ? i : w->n - 1 - i;
        hccl_lane_enqueue(w->lane[r], &t[r].op);
    }
    drive(w);
    for (int r = 0; r < w->n; r++) {
        assert_int_equal(t[r].done, 1);
        assert_int_equal(t[r].res, hcclSuccess);
    }
}

/* Runs the lanes until nothing moves (over shm every rank's in turn, over sim those a
 * doorbell rang); returns the rounds that moved. */
int drive(world_t *w)
{
    int rounds = 0;
    bool moved;

    do {
        moved = false;
        if (w->sim) /* by doorbells alone */
            moved = hccl_sim_world_ring(w->sim);
        else
            for (int r = 0; r < w->n; r++)
                moved |= hccl_lane_poll(w->lane[r]);
        rounds += moved;
    } while (moved);
    return rounds;
}

const hcclDataType_t lane_dtypes[] = {hcclInt8,    hcclUint8,  hcclInt32,   hcclUint32,
                                      hcclInt64,   hcclUint64, hcclFloat16, hcclBfloat16,
                                      hcclFloat32, hcclFloat64};
const hcclRedOp_t lane_ops[] = {hcclSum, hcclProd, hcclMax, hcclMin, hcclAvg};
