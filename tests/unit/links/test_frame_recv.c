/*
 * The framer's receive paths over a real kernel socket pair (frame_pair.h): a message parked
 * unread until its receive comes (park_unmatched), a receive that consumes its payload in whole
 * units, and a receive that stores past the cache.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "frame_pair.h"

/* ---- tests ---- */

/* Reads on ep 1 (ep 0 writing) without running the reactor, until its next header is parked. */
static void read_until_parked(world_t *w)
{
    for (int i = 0; i < MAX_PUMPS && !w->ep[1].s.rx_parked; i++) {
        ep_step(&w->ep[0]);
        assert_false(hccl_is_failure(hccl_framer_rx(&w->ep[1].s, 1u << 20)));
    }
    assert_true(w->ep[1].s.rx_parked);
}

/*
 * park_unmatched: a message that arrives before its receive while completions are queued stays
 * unread; posted meanwhile, it lands in place. Once the queue ran without posting it, it is
 * held, and its buffer is kept for the next held message.
 */
static void test_park_unmatched(void **state)
{
    const size_t len = 100000;
    world_t *w = world_new(&io_plain, SIZE_MAX);
    char *sb[4], *rb[4];
    xf_t *tx[4], *rx[4];

    (void)state;
    w->ep[1].s.park_unmatched = true;
    for (uint32_t t = 0; t < 4; t++) {
        sb[t] = wbuf(w, len);
        rb[t] = wbuf(w, len);
        fill(sb[t], len, 70 + t);
        tx[t] = xf(w, 9, t, sb[t], len);
        rx[t] = xf(w, 9, t, rb[t], len);
    }
    /* 1 follows 0, whose completion is still queued: parked; its receive comes, in place. */
    assert_int_equal(post_recv(w, 1, rx[0]), hcclSuccess);
    assert_false(hccl_is_failure(post_send(w, 0, tx[0])));
    assert_false(hccl_is_failure(post_send(w, 0, tx[1])));
    read_until_parked(w);
    assert_int_equal(rx[0]->x.moved, len);
    assert_int_equal(rx[0]->ndone, 0);
    assert_null(w->ep[1].s.unexp_head);
    assert_null(w->ep[1].s.rx_unexp);
    assert_false(hccl_is_failure(post_recv(w, 1, rx[1])));
    assert_true(pump_until_done(w, rx[1]));
    assert_done_ok(rx[0]);
    assert_done_ok(rx[1]);
    assert_memory_equal(rb[1], sb[1], len);
    assert_null(w->ep[1].s.unexp_head);
    for (int i = 0; i < HCCL_FRAMER_SPARES; i++)
        assert_int_equal(w->ep[1].s.spare_cap[i], 0);
    /* 3 parked behind 2, then the queue runs without its receive: held, delivered later. */
    assert_int_equal(post_recv(w, 1, rx[2]), hcclSuccess);
    assert_false(hccl_is_failure(post_send(w, 0, tx[2])));
    assert_false(hccl_is_failure(post_send(w, 0, tx[3])));
    read_until_parked(w);
    drive_n(w, 3);
    assert_done_ok(rx[2]);
    for (int i = 0; i < MAX_PUMPS && !w->ep[1].s.unexp_head; i++)
        pump_once(w);
    assert_non_null(w->ep[1].s.unexp_head);
    assert_false(w->ep[1].s.rx_parked);
    assert_false(hccl_is_failure(post_recv(w, 1, rx[3])));
    assert_true(pump_until_done(w, rx[3]));
    assert_done_ok(rx[3]);
    assert_memory_equal(rb[3], sb[3], len);
    assert_int_equal(w->ep[1].s.spare_cap[0] + w->ep[1].s.spare_cap[1] + w->ep[1].s.spare_cap[2] +
                         w->ep[1].s.spare_cap[3],
                     len); /* the held buffer, kept */
    assert_int_equal(w->ep[0].err, hcclSuccess);
    assert_int_equal(w->ep[1].err, hcclSuccess);
    world_free(w);
}

static void consume_copy(hccl_xfer_t *x, size_t off, const void *data, size_t len)
{
    world_t *w = ((xf_t *)x)->w;

    if (off != w->cnext || len == 0 || len % x->unit != 0)
        w->cbad = true;
    memcpy(w->cbuf + off, data, len);
    w->cnext = off + len;
    w->cpieces++;
}

static xf_t *xf_consume(world_t *w, uint64_t seq, uint32_t tag, size_t len, size_t unit)
{
    xf_t *m = xf(w, seq, tag, NULL, len);

    m->x.consume = consume_copy;
    m->x.unit = unit;
    w->cbuf = wbuf(w, len);
    w->cnext = 0;
    w->cpieces = 0;
    w->cbad = false;
    return m;
}

/*
 * A receive with a consume function gets its payload in order, in whole units: read through the
 * bounce (frames cut at odd bytes), in place where the transport can show it (units split at
 * the edge of what it shows go through the bounce), from a held message, and single-copy.
 */
static void test_consume(void **state)
{
    const size_t len = 3u * HCCL_FRAMER_BOUNCE + 1000; /* several bounces, not a whole number */
    /* Through the bounce; in place; in place but misaligned (through the bounce); single-copy. */
    const hccl_framer_io_t *ios[] = {&io_plain, &io_peekable, &io_peekable, &io_rndv};

    (void)state;
    for (int k = 0; k < 4; k++) {
        world_t *w = world_new(ios[k], k == 3 ? 4096 : SIZE_MAX);
        char *sb = wbuf(w, len), *sb2 = wbuf(w, 40);
        xf_t *tx = xf(w, 5, 1, sb, len), *rx;
        xf_t *tx2 = xf(w, 5, 2, sb2, 40), *rx2;

        w->ep[1].peek_max = 10; /* 4-byte units: 8 in place, then 2 + 2 through the bounce */
        w->ep[1].peek_skew = k == 2 ? 2 : 0;
        fill(sb, len, 51 + (uint32_t)k);
        fill(sb2, 40, 61);
        rx = xf_consume(w, 5, 1, len, 4);
        assert_int_equal(post_recv(w, 1, rx), hcclSuccess);
        w->ep[0].wbudget = 4099; /* the first frame ends mid-unit */
        assert_false(hccl_is_failure(post_send(w, 0, tx)));
        for (int i = 0; i < MAX_PUMPS && rx->ndone == 0; i++) {
            pump_once(w);
            w->ep[0].wbudget = k == 1 || k == 2 ? 7 : 65537; /* odd cuts */
        }
        assert_done_ok(rx);
        assert_true(pump_until_done(w, tx));
        assert_done_ok(tx);
        assert_false(w->cbad);
        assert_int_equal(w->cnext, len);
        assert_true(w->cpieces > (k == 3 ? 0 : 3));
        assert_memory_equal(w->cbuf, sb, len);
        /* Single-copy reads land in the bounce: a page-aligned one (the kernel copied 3.7x
         * slower into one 16 bytes off a page, as malloc gives). */
        assert_int_equal((uintptr_t)hccl_framer_bounce(&w->ep[1].s) % 4096, 0);
        /* Held first, then consumed whole when its receive is posted. */
        w->ep[0].wbudget = SIZE_MAX;
        assert_false(hccl_is_failure(post_send(w, 0, tx2)));
        pump_n(w, 5);
        assert_non_null(w->ep[1].s.unexp_head);
        rx2 = xf_consume(w, 5, 2, 40, 8);
        assert_false(hccl_is_failure(post_recv(w, 1, rx2)));
        drive_n(w, 3);
        assert_done_ok(rx2);
        assert_false(w->cbad);
        assert_int_equal(w->cpieces, 1);
        assert_memory_equal(w->cbuf, sb2, 40);
        assert_int_equal(w->ep[0].err, hcclSuccess);
        assert_int_equal(w->ep[1].err, hcclSuccess);
        hccl_framer_fini(&w->ep[1].s);
        world_free(w);
    }
}

/*
 * A receive that asks for stores past the cache gets the same bytes: copied by us from where the
 * transport shows them (pieces of up to 3001 bytes from a misaligned address, so that streamed
 * bodies, heads and tails all occur, into a misaligned buffer), or read by the transport where
 * it cannot, and from a held message.
 */
static void test_store_receive(void **state)
{
    const size_t len = 3u * HCCL_FRAMER_BOUNCE + 1000;
    const hccl_framer_io_t *ios[] = {&io_plain, &io_peekable};

    (void)state;
    for (int k = 0; k < 2; k++) {
        world_t *w = world_new(ios[k], SIZE_MAX);
        char *sb = wbuf(w, len), *rb = (char *)wbuf(w, len + 16) + 5, *sb2 = wbuf(w, 300),
             *rb2 = wbuf(w, 300);
        xf_t *tx = xf(w, 5, 1, sb, len), *rx = xf(w, 5, 1, rb, len);
        xf_t *tx2 = xf(w, 5, 2, sb2, 300), *rx2 = xf(w, 5, 2, rb2, 300);

        w->ep[1].peek_max = 3001;
        w->ep[1].peek_skew = 3;
        fill(sb, len, 71 + (uint32_t)k);
        fill(sb2, 300, 81);
        rx->x.store = rx2->x.store = true;
        assert_int_equal(post_recv(w, 1, rx), hcclSuccess);
        w->ep[0].wbudget = 4099;
        assert_false(hccl_is_failure(post_send(w, 0, tx)));
        for (int i = 0; i < MAX_PUMPS && rx->ndone == 0; i++) {
            pump_once(w);
            w->ep[0].wbudget = 7 + (size_t)i * 997 % 5000;
        }
        assert_done_ok(rx);
        assert_true(pump_until_done(w, tx));
        assert_memory_equal(rb, sb, len);
        w->ep[0].wbudget = SIZE_MAX;
        assert_false(hccl_is_failure(post_send(w, 0, tx2)));
        pump_n(w, 5);
        assert_non_null(w->ep[1].s.unexp_head);
        assert_false(hccl_is_failure(post_recv(w, 1, rx2)));
        assert_true(pump_until_done(w, rx2));
        assert_done_ok(rx2);
        assert_memory_equal(rb2, sb2, 300);
        assert_int_equal(w->ep[0].err, hcclSuccess);
        assert_int_equal(w->ep[1].err, hcclSuccess);
        world_free(w);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_park_unmatched),
        cmocka_unit_test(test_consume),
        cmocka_unit_test(test_store_receive),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
