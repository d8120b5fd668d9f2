/*
 * The rdma link's zero-copy path over the verbs model (rdma_harness.h): writes into the
 * receiver's registered buffer in both posting orders; the registration cache (hits within one
 * request, none across requests with pinned MRs, hits across requests with on-demand paging,
 * a bound on what it keeps); a buffer freed and allocated again at the same address never
 * receives data through a stale MR (the model sees a write through one, and a negative control
 * shows that it does); lengths on both sides of the threshold fail at once, naming both.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rdma_harness.h"

#define ZMIN 8192
#define LEN (64u << 10)
#define STAGING_MRS 4 /* each side: the receive and the send staging */

static char *src, *dst;

static int setup(void **state)
{
    (void)state;
    src = malloc(LEN);
    dst = malloc(LEN);
    return src && dst ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    free(src);
    free(dst);
    return 0;
}

static void fill(char *p, size_t len, int salt)
{
    for (size_t j = 0; j < len; j++)
        p[j] = (char)(j * 7 + (size_t)salt);
}

/* One zero-copy transfer from rank from's s to the other rank's d, checked. */
static void transfer_from(int from, uint64_t seq, uint32_t tag, char *s, char *d, size_t len,
                          bool recv_first)
{
    static xf_t xf[2];
    int to = 1 - from;

    fill(s, len, (int)(seq * 31 + tag));
    memset(d, 0, len);
    if (recv_first) {
        post_tag(to, false, &xf[to], seq, tag, d, len);
        post_tag(from, true, &xf[from], seq, tag, s, len);
    } else {
        post_tag(from, true, &xf[from], seq, tag, s, len);
        post_tag(to, false, &xf[to], seq, tag, d, len);
    }
    assert_true(drive_until(both_done, xf, true));
    assert_int_equal(xf[0].res, hcclSuccess);
    assert_int_equal(xf[1].res, hcclSuccess);
    assert_int_equal(xf[to].x.moved, len);
    assert_memory_equal(s, d, len);
}

static void transfer(uint64_t seq, uint32_t tag, char *s, char *d, size_t len, bool recv_first)
{
    transfer_from(0, seq, tag, s, d, len, recv_first);
}

static rdma_ctx_t *ctx_of(int r)
{
    return ranks[r].ctx;
}

static void assert_regs(int r, uint64_t misses, uint64_t hits)
{
    assert_int_equal(ctx_of(r)->reg_misses, misses);
    assert_int_equal(ctx_of(r)->reg_hits, hits);
}

/* Both posting orders (the clear-to-send first, or the ready-to-send first), data intact. */
static void test_zero_copy(void **state)
{
    model_stats_t st;

    (void)state;
    world_up();
    set_zcopy_min(ZMIN);
    for (int i = 0; i < 4; i++)
        transfer((uint64_t)i, 1, src, dst, LEN - (size_t)i * 4096, i % 2 == 0);
    st = model_stats();
    assert_int_equal(st.writes_imm, 4);
    assert_int_equal(st.rnr, 0);
    assert_true(model_cqs_quiet());
    world_down(true);
}

/* One request moving the same buffers several times (and a part of them): registered once. */
static void test_reg_hits_within_request(void **state)
{
    (void)state;
    world_up();
    set_zcopy_min(ZMIN);
    for (uint32_t tag = 1; tag <= 4; tag++)
        transfer(7, tag, src, dst, LEN, tag % 2 == 0);
    transfer(7, 5, src + 4096, dst + 4096, LEN - 4096, true);
    assert_regs(0, 1, 4);
    assert_regs(1, 1, 4);
    assert_int_equal(model_live().mrs, STAGING_MRS + 2);
    assert_int_equal(model_stats().reg_mr_odp, 0);
    world_down(true);
}

/* Pinned MRs: a later request registers the same address again; the old MRs are released. */
static void test_reg_miss_across_requests(void **state)
{
    (void)state;
    world_up();
    set_zcopy_min(ZMIN);
    for (uint64_t seq = 1; seq <= 3; seq++)
        transfer(seq, 1, src, dst, LEN, seq != 2);
    assert_regs(0, 3, 0);
    assert_regs(1, 3, 0);
    assert_int_equal(model_live().mrs, STAGING_MRS + 2);
    world_down(true);
}

/* On-demand paging: the MR follows the page tables, so every later request hits. */
static void test_reg_hits_across_requests_odp(void **state)
{
    (void)state;
    world_up_with(true);
    set_zcopy_min(ZMIN);
    assert_true(ctx_of(0)->odp && ctx_of(1)->odp);
    for (uint64_t seq = 1; seq <= 3; seq++)
        transfer(seq, 1, src, dst, LEN, seq != 2);
    assert_regs(0, 1, 2);
    assert_regs(1, 1, 2);
    assert_int_equal(model_stats().reg_mr_odp, 2);
    assert_int_equal(model_live().mrs, STAGING_MRS + 2);
    world_down(true);
}

/*
 * Between two requests both buffers are freed and allocated again at the same address with the
 * same length. The model breaks a rule (and drops the data) if anything moves through an MR
 * registered before the free; with and without ODP the second request's data arrives.
 */
static void test_freed_and_reused(void **state)
{
    (void)state;
    for (int odp = 0; odp < 2; odp++) {
        world_up_with(odp);
        set_zcopy_min(ZMIN);
        transfer(1, 1, src, dst, LEN, true);
        model_free_range(src, LEN);
        model_free_range(dst, LEN);
        transfer(2, 1, src, dst, LEN, true);
        model_free_range(dst, LEN);
        transfer(3, 1, src, dst, LEN, false);
        assert_int_equal(ctx_of(1)->reg_misses, odp ? 1 : 3);
        world_down(true); /* fails on a stale MR */
    }
}

/*
 * The negative control: a buffer freed inside a request (which the API forbids) while the
 * cache keeps its MR; the model must see the write land in freed memory.
 */
static void test_model_sees_stale_mr(void **state)
{
    static xf_t xf[2];

    (void)state;
    world_up();
    set_zcopy_min(ZMIN);
    transfer(5, 1, src, dst, LEN, true);
    model_free_range(dst, LEN);
    fill(src, LEN, 99);
    memset(dst, 0, LEN);
    post_tag(1, false, &xf[1], 5, 2, dst, LEN);
    post_tag(0, true, &xf[0], 5, 2, src, LEN);
    assert_true(drive_until(both_done, xf, true));
    assert_int_equal(ctx_of(1)->reg_hits, 1);
    assert_true(model_stats().violations > 0);
    assert_non_null(strstr(model_violation_text(), "freed memory"));
    assert_true(memcmp(src, dst, LEN) != 0); /* the data went to the old pages */
    model_clear_violations();
    world_down(true);
}

/*
 * What makes one request: a collective's transfers (same sequence number and signature) share
 * a registration both ways; point-to-point sends and receives count their sequence numbers
 * apart, so a receive with the same number as an earlier send is another request, and its
 * buffer may have been freed and allocated again in between.
 */
static void test_reg_request_key(void **state)
{
    static char other[LEN];

    (void)state;
    world_up();
    set_zcopy_min(ZMIN);
    post_sig = hccl_sig_make(0, 7, 0, -1, LEN);
    transfer_from(0, 6, 1, src, dst, LEN, true);
    transfer_from(1, 6, 2, other, src, LEN, false);
    assert_regs(0, 1, 1);   /* src sent from, then received into: one registration */
    post_sig = 0;
    transfer_from(0, 8, 1, src, dst, LEN, true);
    model_free_range(src, LEN);
    transfer_from(1, 8, 1, other, src, LEN, true);
    assert_regs(0, 3, 1);
    world_down(true); /* fails on a stale MR */
}

/* More buffers in one request than the cache keeps: all move, and the idle ones are bounded. */
static void test_reg_cache_bound(void **state)
{
    enum { N = RDMA_REG_CACHE + 8, B = 16384 };
    static xf_t xf[2][N];
    static char sb[N][B], rb[N][B];
    xfs_t all[2] = {{xf[0], N}, {xf[1], N}};

    (void)state;
    world_up();
    set_zcopy_min(ZMIN);
    for (int i = 0; i < N; i++) {
        fill(sb[i], B, i);
        post_tag(1, false, &xf[1][i], 9, (uint32_t)i + 1, rb[i], B);
    }
    for (int i = 0; i < N; i++)
        post_tag(0, true, &xf[0][i], 9, (uint32_t)i + 1, sb[i], B);
    assert_true(drive_until(all_done, &all[0], true));
    assert_true(drive_until(all_done, &all[1], true));
    for (int i = 0; i < N; i++) {
        assert_int_equal(xf[0][i].res, hcclSuccess);
        assert_int_equal(xf[1][i].res, hcclSuccess);
        assert_memory_equal(sb[i], rb[i], B);
    }
    for (int r = 0; r < 2; r++) {
        assert_int_equal(ctx_of(r)->reg_misses, N);
        assert_true(ctx_of(r)->nregs_idle <= RDMA_REG_CACHE);
        assert_int_equal(ctx_of(r)->nregs, ctx_of(r)->nregs_idle);
    }
    assert_true(model_live().mrs <= STAGING_MRS + 2 * RDMA_REG_CACHE);
    world_down(true);
}

static bool mismatch_told(void *arg)
{
    xf_t *xf = arg;

    return xf[0].ndone && xf[1].ndone && ranks[0].fatal && ranks[1].fatal;
}

/*
 * A send of slen against a receive of rlen (one or both at least the threshold): a rank that
 * sees it (who, or either if -1) fails with hcclInvalidUsage naming the peer and both
 * lengths, the other learns of it from the broken connection; nobody waits for a timeout (the
 * drive is bounded by steps, not time).
 */
static void mismatch_case(size_t slen, size_t rlen, bool recv_first, int who)
{
    static xf_t xf[2];
    int told = -1;

    world_up();
    set_zcopy_min(ZMIN);
    if (recv_first) {
        post(1, false, &xf[1], 3, dst, rlen);
        post(0, true, &xf[0], 3, src, slen);
    } else {
        post(0, true, &xf[0], 3, src, slen);
        post(1, false, &xf[1], 3, dst, rlen);
    }
    assert_true(drive_until(mismatch_told, xf, true));
    assert_true(xf[1].res != hcclSuccess);
    for (int d = 0; d < 2; d++) {
        char peer_len[32], own_len[32];
        snprintf(peer_len, sizeof(peer_len), "%zu bytes", d == 1 ? slen : rlen);
        snprintf(own_len, sizeof(own_len), "but %zu ", d == 1 ? rlen : slen);
        if (xf[d].res == hcclInvalidUsage && strstr(ranks[d].fatal_msg, peer_len) &&
            strstr(ranks[d].fatal_msg, own_len) &&
            strstr(ranks[d].fatal_msg, d == 1 ? "rank 0 " : "rank 1 "))
            told = d;
    }
    if (told < 0 || (who >= 0 && told != who))
        fail_msg("%zu sent, %zu expected: rank 0: %s; rank 1: %s", slen, rlen, ranks[0].fatal_msg,
                 ranks[1].fatal_msg);
    world_down(false);
}

static void test_threshold_straddle(void **state)
{
    (void)state;
    /* A staged send against a zero-copy receive: its message arrives for a receive that
     * offered its buffer (posted before or after the message arrived). */
    mismatch_case(4096, 16384, true, 1);
    mismatch_case(4096, 16384, false, 1);
    /* A zero-copy send against a staged receive: the ready-to-send says so. */
    mismatch_case(16384, 4096, true, 1);
    mismatch_case(16384, 4096, false, 1);
    /* Both zero-copy, different lengths: the receiver sees the ready-to-send, or the sender
     * the clear-to-send, whichever is handled first. */
    mismatch_case(12288, 16384, false, -1);
    mismatch_case(12288, 16384, true, -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zero_copy),
        cmocka_unit_test(test_reg_hits_within_request),
        cmocka_unit_test(test_reg_miss_across_requests),
        cmocka_unit_test(test_reg_hits_across_requests_odp),
        cmocka_unit_test(test_freed_and_reused),
        cmocka_unit_test(test_model_sees_stale_mr),
        cmocka_unit_test(test_reg_request_key),
        cmocka_unit_test(test_reg_cache_bound),
        cmocka_unit_test(test_threshold_straddle),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
