/*
 * The framer's offers of large messages over a real kernel socket pair (frame_pair.h): read
 * single-copy (RTS, then FIN; or NACK and a DATA resend) or pulled (PULL, then DATA), the choice
 * between the two by their measured costs, and a link without single copy that always pulls.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "frame_pair.h"

/* ---- tests ---- */

/* Single-copy offers (RTS, then FIN; or NACK and a DATA resend), and fail with an offer out. */
static void test_rndv(void **state)
{
    const size_t len = 100000;

    (void)state;
    for (int refuse = 0; refuse < 2; refuse++) {
        world_t *w = world_new(&io_rndv, 4096);
        char *sb = wbuf(w, len), *rb = wbuf(w, len), *sb2 = wbuf(w, len), *rb2 = wbuf(w, len);
        char tiny[8] = "tiny", tiny_r[8];
        xf_t *tx = xf(w, 2, 1, sb, len), *rx = xf(w, 2, 1, rb, len);
        xf_t *tx2 = xf(w, 2, 2, sb2, len), *rx2 = xf(w, 2, 2, rb2, len);
        xf_t *ts = xf(w, 2, 3, tiny, sizeof(tiny)), *tr = xf(w, 2, 3, tiny_r, sizeof(tiny_r));

        w->ep[1].rndv = refuse;
        fill(sb, len, 31);
        fill(sb2, len, 32);
        assert_int_equal(post_recv(w, 1, rx), hcclSuccess);
        assert_false(hccl_is_failure(post_send(w, 0, tx)));
        assert_false(hccl_is_failure(post_send(w, 0, ts))); /* below the threshold: DATA */
        assert_true(pump(w, 2));
        /* The offer completes only when the peer acknowledged it. */
        assert_true(pump_until_done(w, tx));
        assert_done_ok(tx);
        assert_true(pump_until_done(w, rx));
        assert_done_ok(rx);
        assert_memory_equal(rb, sb, len);
        assert_done_ok(ts);
        assert_int_equal(post_recv(w, 1, tr), hcclSuccess);
        assert_true(pump_until_done(w, tr));
        assert_done_ok(tr);
        assert_memory_equal(tiny_r, tiny, sizeof(tiny));
        /* An offer held as unexpected, then received (after a NACK: plain DATA, held). */
        assert_false(hccl_is_failure(post_send(w, 0, tx2)));
        pump_n(w, 5);
        if (!refuse)
            assert_int_equal(tx2->ndone, 0); /* waits for the FIN */
        assert_false(hccl_is_failure(post_recv(w, 1, rx2)));
        assert_true(pump_until_done(w, rx2));
        assert_true(pump_until_done(w, tx2));
        assert_done_ok(rx2);
        assert_done_ok(tx2);
        assert_memory_equal(rb2, sb2, len);
        assert_int_equal(w->ep[0].err, hcclSuccess);
        assert_int_equal(w->ep[1].err, hcclSuccess);
        world_free(w);
    }
    /* An offer waiting for its FIN is completed by fail, once. */
    {
        world_t *w = world_new(&io_rndv, 4096);
        char *sb = wbuf(w, len);
        xf_t *tx = xf(w, 3, 1, sb, len);
        assert_false(hccl_is_failure(post_send(w, 0, tx)));
        assert_non_null(w->ep[0].s.await_fin.head);
        drive_n(w, 3);
        assert_int_equal(tx->ndone, 0);
        hccl_framer_fail(&w->ep[0].s, hcclRemoteError);
        drive_n(w, 3);
        assert_int_equal(tx->ndone, 1);
        assert_int_equal(tx->res, hcclRemoteError);
        world_free(w);
    }
}

/* One offered message of len bytes through ep 0 -> 1, the receive posted first or after, and
 * marked read_direct or not. */
static void offer_one_as(world_t *w, uint64_t seq, uint32_t tag, size_t len, bool recv_first,
                         bool read_direct)
{
    char *sb = wbuf(w, len), *rb = wbuf(w, len);
    xf_t *tx = xf(w, seq, tag, sb, len), *rx = xf(w, seq, tag, rb, len);

    rx->x.read_direct = read_direct;
    fill(sb, len, (uint32_t)(seq * 100 + tag));
    if (recv_first)
        assert_int_equal(post_recv(w, 1, rx), hcclSuccess);
    assert_false(hccl_is_failure(post_send(w, 0, tx)));
    if (!recv_first) {
        pump_n(w, 5);
        assert_int_equal(tx->ndone, 0); /* held as an offer: nothing moves before the receive */
        assert_false(hccl_is_failure(post_recv(w, 1, rx)));
    }
    assert_true(pump_until_done(w, rx));
    assert_true(pump_until_done(w, tx));
    assert_done_ok(rx);
    assert_done_ok(tx);
    assert_memory_equal(rb, sb, len);
}

static void offer_one(world_t *w, uint64_t seq, uint32_t tag, size_t len, bool recv_first)
{
    offer_one_as(w, seq, tag, len, recv_first, false);
}

/* With the receiver's costs set to pull_ns and rndv_ns: how many of n offers it read single-copy.
 */
static int single_copies_of(world_t *w, double pull_ns, double rndv_ns, uint64_t seq, uint32_t n,
                            size_t len)
{
    int before = w->ep[1].rndv_reads;

    w->ep[1].s.pull_ns_per_byte = pull_ns;
    w->ep[1].s.rndv_ns_per_byte = rndv_ns;
    for (uint32_t t = 0; t < n; t++)
        offer_one(w, seq, t, len, t % 2 == 0);
    return w->ep[1].rndv_reads - before;
}

/*
 * Offers up to pull_max are pulled (PULL, then DATA) or read single-copy, whichever the
 * receiver measured faster; the other is tried after STREAM_PULL_PROBE offers at the soonest,
 * and the slower it was, the longer after the last try (up to a second), and what a try
 * measures replaces that way's figure. Larger ones are always read single-copy.
 */
static void test_rndv_pull(void **state)
{
    const size_t len = 100000;
    world_t *w = world_new(&io_rndv, 4096);
    hccl_framer_t *rs = &w->ep[1].s;

    (void)state;
    rs->pull_max = len;
    /* Nothing measured: pulled first, then read single-copy, each timed. */
    offer_one(w, 4, 1, len, true);
    assert_int_equal(w->ep[1].rndv_reads, 0);
    assert_true(rs->pull_ns_per_byte > 0);
    offer_one(w, 4, 2, len, false);
    assert_int_equal(w->ep[1].rndv_reads, 1);
    assert_true(rs->rndv_ns_per_byte > 0);
    /* Single copy measured far slower: the 16th offer tries it. */
    assert_int_equal(single_copies_of(w, 1e-9, 1e9, 5, 16, len), 1);
    /* Pulling measured far slower: read single-copy; the last try is taken to be a minute
     * ahead, so that no try is due however slowly a loaded machine runs these 16 offers. */
    rs->pull_probe_ns += 60 * (int64_t)1000000000;
    assert_int_equal(single_copies_of(w, 1e9, 1e-9, 6, 16, len), 16);
    /* Two minutes later, the next is pulled, and its time is the figure now. */
    rs->pull_probe_ns -= 120 * (int64_t)1000000000;
    assert_int_equal(single_copies_of(w, 1e9, 1e-9, 7, 1, len), 0);
    assert_true(rs->pull_ns_per_byte < 1e6);
    /* A message pulled through wire memory used for the first time is not timed. */
    rs->pull_ns_per_byte = 5.0;
    rs->rndv_ns_per_byte = 1e9;
    rs->rx_wire_cold = true;
    offer_one(w, 8, 0, len, true);
    assert_true(rs->pull_ns_per_byte == 5.0);
    rs->rx_wire_cold = false;
    offer_one(w, 8, 1, len, true);
    assert_true(rs->pull_ns_per_byte != 5.0);
    /* Above pull_max: single copy, however fast pulling was. */
    assert_int_equal(single_copies_of(w, 1e-9, 1e9, 9, 1, 2 * len), 1);
    /* Marked read_direct: single copy however fast pulling was, and not counted among the
     * offers between tries of the other way. */
    {
        int reads = w->ep[1].rndv_reads;
        unsigned choices = rs->pull_choices;
        for (uint32_t t = 0; t < 4; t++) {
            rs->pull_ns_per_byte = 1e-9;
            rs->rndv_ns_per_byte = 1e9;
            offer_one_as(w, 10, t, len, t % 2 == 0, true);
        }
        assert_int_equal(w->ep[1].rndv_reads - reads, 4);
        assert_int_equal(rs->pull_choices, choices);
    }
    assert_null(w->ep[0].s.await_fin.head);
    assert_null(w->ep[0].s.pulled.head);
    assert_int_equal(w->ep[0].err, hcclSuccess);
    assert_int_equal(w->ep[1].err, hcclSuccess);
    world_free(w);
}

/*
 * A pulled message's cost counts the sender's copy into the wire: the sender times its copies
 * of pulled messages and sends the figure in the DATA frame, which a receiver that could read
 * single-copy adds to what it timed itself (where it counts the sender's copy: ranks on CPUs
 * of their own); one that could not (tcp) ignores it.
 */
static void test_pull_counts_sender_copy(void **state)
{
    const size_t len = 100000;
    world_t *w = world_new(&io_rndv, 4096);
    hccl_framer_t *ss = &w->ep[0].s, *rs = &w->ep[1].s;

    (void)state;
    rs->pull_max = len;
    rs->count_sender_copy = ss->count_sender_copy = true;
    offer_one(w, 4, 1, len, true); /* nothing measured: pulled */
    assert_int_equal(w->ep[1].rndv_reads, 0);
    assert_true(ss->tx_pull_ns_per_byte > 0); /* the sender timed its copy */
    /* A copy into wire memory used for the first time gives no figure. */
    ss->tx_wire_cold = true;
    rs->pull_ns_per_byte = 0;
    offer_one(w, 4, 3, len, true);
    assert_true(ss->tx_pull_ns_per_byte == 0);
    ss->tx_wire_cold = false;
    /* The sender says its copies cost 2 ns per byte; the receiver is made to pull again. */
    ss->tx_pull_ns_per_byte = 2.0;
    rs->pull_ns_per_byte = 0;
    rs->rndv_ns_per_byte = 1e9;
    offer_one(w, 4, 2, len, true);
    assert_int_equal(w->ep[1].rndv_reads, 0);
    assert_int_equal(rs->rx_sender_ps_per_byte, 2000);
    assert_true(rs->pull_ns_per_byte >= 2.0);
    assert_int_equal(w->ep[0].err, hcclSuccess);
    assert_int_equal(w->ep[1].err, hcclSuccess);
    world_free(w);

    w = world_new(&io_plain, SIZE_MAX);
    for (int i = 0; i < 2; i++) {
        w->ep[i].s.rndv_threshold = 4096;
        w->ep[i].s.pull_max = SIZE_MAX;
    }
    w->ep[0].s.tx_pull_ns_per_byte = 2.0;
    w->ep[1].s.count_sender_copy = true;
    offer_one(w, 5, 1, len, true);
    assert_int_equal(w->ep[1].s.rx_sender_ps_per_byte, 0);
    assert_int_equal(w->ep[0].err, hcclSuccess);
    assert_int_equal(w->ep[1].err, hcclSuccess);
    world_free(w);
}

/*
 * A link without single copy (tcp) that offers large messages: the receiver always asks for
 * them (PULL), and they land in the receive's buffer, posted before or after the offer.
 */
static void test_offer_pulled_without_single_copy(void **state)
{
    const size_t len = 100000;
    world_t *w = world_new(&io_plain, SIZE_MAX);

    (void)state;
    for (int i = 0; i < 2; i++) {
        w->ep[i].s.rndv_threshold = 4096;
        w->ep[i].s.pull_max = SIZE_MAX;
    }
    for (uint32_t t = 0; t < 6; t++)
        offer_one(w, 8, t, len, t % 2 == 0);
    assert_int_equal(w->ep[1].rndv_reads, 0);
    assert_null(w->ep[1].s.unexp_head);
    for (int i = 0; i < HCCL_FRAMER_SPARES; i++)
        assert_int_equal(w->ep[1].s.spare_cap[i], 0); /* no payload was ever held */
    assert_null(w->ep[0].s.await_fin.head);
    assert_null(w->ep[0].s.pulled.head);
    assert_int_equal(w->ep[0].err, hcclSuccess);
    assert_int_equal(w->ep[1].err, hcclSuccess);
    world_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rndv),
        cmocka_unit_test(test_rndv_pull),
        cmocka_unit_test(test_pull_counts_sender_copy),
        cmocka_unit_test(test_offer_pulled_without_single_copy),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
