/*
 * The framing engine (the framer) over a real kernel socket pair (frame_pair.h): messages large
 * and small, in and out of order, zero-length, with mismatched lengths; malformed frames; a
 * framer failed with everything in flight; and the peer's BYE.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "frame_pair.h"

/* ---- tests ---- */

static void test_large_message(void **state)
{
    world_t *w = *state;
    const size_t len = 8u << 20;
    char *s0 = wbuf(w, len), *r1 = wbuf(w, len), *s1 = wbuf(w, len), *r0 = wbuf(w, len);
    xf_t *tx0, *rx1, *tx1, *rx0;

    fill(s0, len, 1);
    fill(s1, len, 2);
    memset(r0, 0, len);
    memset(r1, 0, len);
    /* 0 -> 1 with the receive posted first; 1 -> 0 held as unexpected, in both directions at once.
     */
    rx1 = xf(w, 3, 1, r1, len);
    assert_int_equal(post_recv(w, 1, rx1), hcclSuccess);
    tx0 = xf(w, 3, 1, s0, len);
    assert_false(hccl_is_failure(post_send(w, 0, tx0)));
    tx1 = xf(w, 3, 2, s1, len);
    assert_false(hccl_is_failure(post_send(w, 1, tx1)));
    /* The socket buffer is far smaller: the first write was partial. */
    assert_true(hccl_framer_tx_pending(&w->ep[0].s));
    assert_int_equal(tx0->ndone + tx1->ndone, 0);

    assert_true(pump(w, 3));
    assert_done_ok(tx0);
    assert_done_ok(rx1);
    assert_done_ok(tx1);
    assert_memory_equal(r1, s0, len);
    /* Held until its receive comes. */
    for (int i = 0; i < MAX_PUMPS && !w->ep[0].s.unexp_head; i++)
        pump_once(w);
    assert_non_null(w->ep[0].s.unexp_head);
    rx0 = xf(w, 3, 2, r0, len);
    assert_false(hccl_is_failure(post_recv(w, 0, rx0)));
    assert_int_equal(rx0->ndone, 0); /* completion from the loop, never inside post */
    assert_true(pump(w, 4));
    assert_done_ok(rx0);
    assert_memory_equal(r0, s1, len);
    assert_null(w->ep[0].s.unexp_head);
    assert_int_equal(w->ep[0].err, hcclSuccess);
    assert_int_equal(w->ep[1].err, hcclSuccess);
}

#define NSMALL 64

static void test_many_small_out_of_order(void **state)
{
    world_t *w = *state;
    xf_t *tx[NSMALL], *rx[NSMALL];
    char *sb[NSMALL], *rb[NSMALL];
    size_t len[NSMALL];

    for (int i = 0; i < NSMALL; i++) {
        len[i] = 1 + (size_t)(i * 37) % 300;
        sb[i] = wbuf(w, len[i]);
        rb[i] = wbuf(w, len[i]);
        fill(sb[i], len[i], 100 + (uint32_t)i);
        memset(rb[i], 0, len[i]);
        rx[i] = xf(w, 1000 + (uint64_t)(i / 8), (uint32_t)(i % 8), rb[i], len[i]);
    }
    /* Odd receives are posted first, in reverse order. */
    for (int i = NSMALL - 1; i >= 0; i--)
        if (i % 2)
            assert_int_equal(post_recv(w, 1, rx[i]), hcclSuccess);
    for (int i = 0; i < NSMALL; i++) {
        tx[i] = xf(w, 1000 + (uint64_t)(i / 8), (uint32_t)(i % 8), sb[i], len[i]);
        assert_false(hccl_is_failure(post_send(w, 0, tx[i])));
    }
    /* Every send and the posted half of the receives. */
    assert_true(pump(w, NSMALL + NSMALL / 2));
    pump_n(w, 3);
    for (int i = 0; i < NSMALL; i++) {
        assert_done_ok(tx[i]);
        assert_int_equal(rx[i]->ndone, i % 2);
    }
    /* The even ones were held; their receives come in a scrambled order. */
    for (int k = 0; k < NSMALL; k++) {
        int i = (k * 29) % NSMALL;
        if (i % 2 == 0)
            assert_false(hccl_is_failure(post_recv(w, 1, rx[i])));
    }
    assert_true(pump(w, 2 * NSMALL));
    for (int i = 0; i < NSMALL; i++) {
        assert_done_ok(rx[i]);
        assert_memory_equal(rb[i], sb[i], len[i]);
    }
    assert_null(w->ep[1].s.unexp_head);
    assert_null(w->ep[1].s.posted.head);
}

/*
 * A receive posted while its message is partly in: cut the wire after part of the header,
 * exactly after the header, and inside the payload. The payload must reach the receive.
 */
static void test_recv_posted_midway(void **state)
{
    const size_t len = 64u << 10;
    const size_t cuts[] = {20, FRAME, FRAME + 10, FRAME + len - 1};

    (void)state;
    for (size_t c = 0; c < sizeof(cuts) / sizeof(cuts[0]); c++) {
        world_t *w = world_new(&io_plain, SIZE_MAX);
        char *sbuf = wbuf(w, len), *rbuf = wbuf(w, len);
        xf_t *tx = xf(w, 9, 4, sbuf, len), *rx = xf(w, 9, 4, rbuf, len);
        xf_t *tx2, *rx2;
        char small[16] = "after", small_r[16];

        fill(sbuf, len, 7 + (uint32_t)c);
        memset(rbuf, 0, len);
        w->ep[0].wbudget = cuts[c];
        assert_false(hccl_is_failure(post_send(w, 0, tx)));
        assert_int_equal(w->ep[0].wbudget, 0);
        assert_int_equal(hccl_framer_rx(&w->ep[1].s, SIZE_MAX), hcclSuccess);
        if (cuts[c] < FRAME) {
            assert_int_equal(w->ep[1].s.rx_hdr_got, cuts[c]);
        } else {
            assert_true(w->ep[1].s.rx_in_payload);
            assert_non_null(w->ep[1].s.rx_unexp); /* held: no receive yet */
            assert_null(w->ep[1].s.rx_xfer);
        }
        assert_int_equal(post_recv(w, 1, rx), hcclSuccess);
        drive_n(w, 3);
        assert_int_equal(rx->ndone, 0);
        /* A later message on the same connection still arrives after it. */
        tx2 = xf(w, 9, 5, small, sizeof(small));
        rx2 = xf(w, 9, 5, small_r, sizeof(small_r));
        assert_int_equal(post_recv(w, 1, rx2), hcclSuccess);
        assert_false(hccl_is_failure(post_send(w, 0, tx2)));
        w->ep[0].wbudget = SIZE_MAX;
        assert_true(pump(w, 4));
        assert_done_ok(tx);
        assert_done_ok(rx);
        assert_memory_equal(rbuf, sbuf, len);
        assert_done_ok(rx2);
        assert_memory_equal(small_r, small, sizeof(small));
        assert_null(w->ep[1].s.unexp_head);
        world_free(w);
    }
}

static void test_zero_length(void **state)
{
    world_t *w = *state;
    char m_s[10] = "123456789", m_r[10];
    xf_t *z1s = xf(w, 1, 0, NULL, 0), *z1r = xf(w, 1, 0, NULL, 0);
    xf_t *z2s = xf(w, 1, 1, m_s, 0), *z2r = xf(w, 1, 1, m_r, 0);
    xf_t *ms = xf(w, 1, 2, m_s, sizeof(m_s)), *mr = xf(w, 1, 2, m_r, sizeof(m_r));
    xf_t *z3s = xf(w, 1, 3, NULL, 0), *z3r = xf(w, 1, 3, NULL, 0);
    xf_t *z4s = xf(w, 2, 0, NULL, 0), *z4r = xf(w, 2, 0, NULL, 0);

    /* Receive first. */
    assert_int_equal(post_recv(w, 1, z1r), hcclSuccess);
    assert_false(hccl_is_failure(post_send(w, 0, z1s)));
    assert_int_equal(z1s->ndone, 0); /* written at once, reported later */
    /* Unexpected zero-length messages around a non-empty one. */
    assert_false(hccl_is_failure(post_send(w, 0, z2s)));
    assert_false(hccl_is_failure(post_send(w, 0, ms)));
    assert_false(hccl_is_failure(post_send(w, 0, z3s)));
    /* The other direction too. */
    assert_int_equal(post_recv(w, 0, z4r), hcclSuccess);
    assert_false(hccl_is_failure(post_send(w, 1, z4s)));
    assert_true(pump(w, 7));
    pump_n(w, 3);
    assert_done_ok(z1s);
    assert_done_ok(z1r);
    assert_done_ok(z2s);
    assert_done_ok(ms);
    assert_done_ok(z3s);
    assert_done_ok(z4s);
    assert_done_ok(z4r);
    assert_int_equal(z2r->ndone + mr->ndone + z3r->ndone, 0);
    assert_int_equal(post_recv(w, 1, z3r), hcclSuccess);
    assert_int_equal(post_recv(w, 1, mr), hcclSuccess);
    assert_int_equal(post_recv(w, 1, z2r), hcclSuccess);
    assert_int_equal(z2r->ndone + mr->ndone + z3r->ndone, 0);
    assert_true(pump(w, 10));
    assert_done_ok(z2r);
    assert_done_ok(mr);
    assert_done_ok(z3r);
    assert_memory_equal(m_r, m_s, sizeof(m_s));
    assert_null(w->ep[1].s.unexp_head);
}

/*
 * A zero-length message whose header is the last byte rx may read this time (max_bytes
 * reached) and the last byte on the wire: a link that calls rx again only when the socket is
 * readable never calls it again, so the message must be dispatched now.
 */
static void test_zero_length_at_rx_budget(void **state)
{
    world_t *w = *state;
    xf_t *zs = xf(w, 4, 4, NULL, 0), *zr = xf(w, 4, 4, NULL, 0);
    xf_t *us = xf(w, 4, 5, NULL, 0), *ur = xf(w, 4, 5, NULL, 0);

    assert_int_equal(post_recv(w, 1, zr), hcclSuccess);
    assert_false(hccl_is_failure(post_send(w, 0, zs)));
    assert_false(hccl_is_failure(hccl_framer_rx(&w->ep[1].s, FRAME)));
    drive_n(w, 5);
    assert_int_equal(zs->ndone, 1);
    assert_int_equal(zr->ndone, 1); /* dispatched now: no more bytes will call rx again */
    assert_int_equal(zr->res, hcclSuccess);

    /* The same with the message held as unexpected. */
    assert_false(hccl_is_failure(post_send(w, 0, us)));
    assert_false(hccl_is_failure(hccl_framer_rx(&w->ep[1].s, FRAME)));
    assert_int_equal(post_recv(w, 1, ur), hcclSuccess);
    drive_n(w, 5);
    assert_int_equal(ur->ndone, 1);
    assert_int_equal(ur->res, hcclSuccess);
}

enum { MM_RECV_FIRST, MM_RECV_MIDWAY, MM_RECV_AFTER, MM_SHORT };

static void test_length_mismatch(void **state)
{
    const size_t guard = 64;

    (void)state;
    for (int v = MM_RECV_FIRST; v <= MM_SHORT; v++) {
        world_t *w = world_new(&io_plain, SIZE_MAX);
        size_t want = v == MM_SHORT ? 200 : 100, sent = v == MM_SHORT ? 100 : 200;
        unsigned char *sbuf = wbuf(w, sent), *rbuf = wbuf(w, want + guard);
        xf_t *tx = xf(w, 11, 1, sbuf, sent), *rx = xf(w, 11, 1, rbuf, want);

        memset(sbuf, 0x11, sent);
        memset(rbuf, 0xA5, want + guard);
        if (v == MM_RECV_FIRST || v == MM_SHORT)
            assert_int_equal(post_recv(w, 1, rx), hcclSuccess);
        if (v == MM_RECV_MIDWAY)
            w->ep[0].wbudget = FRAME + 50;
        assert_false(hccl_is_failure(post_send(w, 0, tx)));
        if (v == MM_RECV_MIDWAY) {
            assert_int_equal(hccl_framer_rx(&w->ep[1].s, SIZE_MAX), hcclSuccess);
            assert_true(w->ep[1].s.rx_in_payload);
            assert_int_equal(post_recv(w, 1, rx), hcclSuccess);
            w->ep[0].wbudget = SIZE_MAX;
        }
        if (v == MM_RECV_AFTER) {
            assert_true(pump_until_done(w, tx));
            pump_n(w, 2);
            assert_non_null(w->ep[1].s.unexp_head);
            assert_true(hccl_is_failure(post_recv(w, 1, rx)));
            assert_int_equal(rx->ndone, 0); /* never inside post */
        }
        assert_true(pump_until_done(w, rx));
        pump_n(w, 5);
        assert_int_equal(rx->ndone, 1);
        assert_int_equal(rx->res, hcclInvalidUsage);
        for (size_t i = want; i < want + guard; i++)
            assert_int_equal(rbuf[i], 0xA5);
        if (v != MM_RECV_AFTER)
            assert_int_equal(w->ep[1].err, hcclInvalidUsage); /* the receiving end reports it */
        world_free(w);
    }
}

/* Writes one raw frame (or its first cut bytes) into end 0's socket. */
static void raw_frame(world_t *w, uint32_t magic, uint16_t version, uint16_t type, uint64_t seq,
                      uint32_t tag, uint64_t len, size_t from, size_t to)
{
    hccl_frame_t f;

    memset(&f, 0, sizeof(f));
    f.magic = magic;
    f.version = version;
    f.type = type;
    f.seq = seq;
    f.tag = tag;
    f.len = len;
    assert_int_equal(send(w->ep[0].fd, (char *)&f + from, to - from, MSG_NOSIGNAL),
                     (ssize_t)(to - from));
}

static void test_malformed_frames(void **state)
{
    struct {
        uint32_t magic;
        uint16_t version;
        uint16_t type;
        uint64_t len;
    } bad[] = {
        {0xdeadbeefu, HCCL_WIRE_VERSION, HCCL_FRAME_DATA, 4},
        {HCCL_WIRE_MAGIC, HCCL_WIRE_VERSION + 1, HCCL_FRAME_DATA, 4},
        {HCCL_WIRE_MAGIC, HCCL_WIRE_VERSION, 0, 0},
        {HCCL_WIRE_MAGIC, HCCL_WIRE_VERSION, 6, 0},
        {HCCL_WIRE_MAGIC, HCCL_WIRE_VERSION, 0xffff, 0},
        {HCCL_WIRE_MAGIC, HCCL_WIRE_VERSION, HCCL_FRAME_DATA, HCCL_WIRE_MAX_LEN + 1},
        {HCCL_WIRE_MAGIC, HCCL_WIRE_VERSION, HCCL_FRAME_RTS, UINT64_MAX},
        {HCCL_WIRE_MAGIC, HCCL_WIRE_VERSION, HCCL_FRAME_FIN, 0},  /* for nothing offered */
        {HCCL_WIRE_MAGIC, HCCL_WIRE_VERSION, HCCL_FRAME_NACK, 0}, /* likewise */
    };

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        world_t *w = world_new(&io_plain, SIZE_MAX);
        char buf[4];
        xf_t *rx = xf(w, 5, 5, buf, sizeof(buf));
        hcclResult_t res;

        /* A receive is waiting for the message that the bad frame pretends to be. */
        assert_int_equal(post_recv(w, 1, rx), hcclSuccess);
        /* Half a header is no error yet. */
        raw_frame(w, bad[i].magic, bad[i].version, bad[i].type, 5, 5, bad[i].len, 0, 10);
        assert_int_equal(hccl_framer_rx(&w->ep[1].s, SIZE_MAX), hcclSuccess);
        raw_frame(w, bad[i].magic, bad[i].version, bad[i].type, 5, 5, bad[i].len, 10, FRAME);
        res = hccl_framer_rx(&w->ep[1].s, SIZE_MAX);
        assert_true(hccl_is_failure(res));
        assert_non_null(strstr(hccl_error_last(), "malformed"));
        /* The caller fails the connection: the waiting receive ends once, with that error. */
        ep_failed(&w->ep[1], res, true);
        assert_true(w->ep[1].s.failed);
        drive_n(w, 5);
        assert_int_equal(rx->ndone, 1);
        assert_int_equal(rx->res, res);
        world_free(w);
    }
}

static void test_fail_completes_everything_once(void **state)
{
    world_t *w = *state;
    const size_t big = 1u << 20;
    char *s1b = wbuf(w, big), *rs1b = wbuf(w, big), small[64], small_r[64], ub[50] = "u";
    xf_t *s1 = xf(w, 1, 1, s1b, big), *s2 = xf(w, 1, 2, small, 10), *s3 = xf(w, 1, 3, NULL, 0);
    xf_t *r1 = xf(w, 9, 9, small_r, sizeof(small_r));
    xf_t *u1 = xf(w, 7, 7, ub, sizeof(ub));
    xf_t *rs1 = xf(w, 1, 1, rs1b, big), *r2 = xf(w, 8, 8, small_r, 8);
    xf_t *late_s, *late_r;
    xf_t *a_side[] = {s1, s2, s3, r1}, *b_side[] = {rs1, r2};

    memset(small, 1, sizeof(small));
    assert_int_equal(post_recv(w, 1, rs1), hcclSuccess);
    w->ep[0].wbudget = FRAME + 1000;
    assert_false(hccl_is_failure(post_send(w, 0, s1)));               /* partly written */
    assert_false(hccl_is_failure(post_send(w, 0, s2)));               /* queued */
    assert_false(hccl_is_failure(post_send(w, 0, s3)));               /* queued */
    assert_int_equal(post_recv(w, 0, r1), hcclSuccess);               /* never sent */
    assert_false(hccl_is_failure(hccl_framer_send_bye(&w->ep[0].s))); /* a control frame queued */
    assert_false(hccl_is_failure(post_send(w, 1, u1)));               /* arrives, never received */
    assert_false(hccl_is_failure(hccl_framer_rx(&w->ep[0].s, SIZE_MAX)));
    assert_non_null(w->ep[0].s.unexp_head);
    assert_false(hccl_is_failure(hccl_framer_rx(&w->ep[1].s, SIZE_MAX)));
    assert_ptr_equal(w->ep[1].s.rx_xfer, &rs1->x);      /* being filled */
    assert_int_equal(post_recv(w, 1, r2), hcclSuccess); /* never sent */
    drive_n(w, 5);
    assert_done_ok(u1);
    assert_int_equal(w->ncompleted, 1);

    hccl_framer_fail(&w->ep[0].s, hcclAborted);
    hccl_framer_fail(&w->ep[1].s, hcclAborted);
    hccl_framer_fail(&w->ep[0].s, hcclRemoteError); /* idempotent */
    drive_n(w, 5);
    for (size_t i = 0; i < sizeof(a_side) / sizeof(a_side[0]); i++) {
        assert_int_equal(a_side[i]->ndone, 1);
        assert_int_equal(a_side[i]->res, hcclAborted);
    }
    for (size_t i = 0; i < sizeof(b_side) / sizeof(b_side[0]); i++) {
        assert_int_equal(b_side[i]->ndone, 1);
        assert_int_equal(b_side[i]->res, hcclAborted);
    }
    assert_int_equal(u1->ndone, 1);
    assert_int_equal(w->ncompleted, 7);
    assert_null(w->ep[0].s.unexp_head);
    assert_null(w->ep[0].s.ctl_head);
    assert_false(hccl_framer_tx_pending(&w->ep[0].s));
    assert_true(hccl_is_failure(hccl_framer_rx(&w->ep[1].s, SIZE_MAX)));
    assert_true(hccl_is_failure(hccl_framer_tx(&w->ep[0].s)));

    /* Posting on a failed framer completes at once, from the loop, with the same result. */
    late_s = xf(w, 20, 0, small, 4);
    late_r = xf(w, 20, 0, small_r, 4);
    assert_false(hccl_is_failure(post_send(w, 0, late_s)));
    assert_false(hccl_is_failure(post_recv(w, 1, late_r)));
    assert_int_equal(late_s->ndone + late_r->ndone, 0);
    drive_n(w, 5);
    assert_int_equal(late_s->ndone, 1);
    assert_int_equal(late_s->res, hcclAborted);
    assert_int_equal(late_r->ndone, 1);
    assert_int_equal(late_r->res, hcclAborted);
    assert_int_equal(w->ncompleted, 9);
}

/*
 * The peer's BYE: what it sent before still arrives; a receive posted afterwards fails with
 * hcclRemoteError; its EOF then fails rx with peer_bye set, which the caller takes as a close.
 */
static void test_bye_then_recv_fails(void **state)
{
    world_t *w = *state;
    char m[32] = "before bye", m_r[32];
    xf_t *ms = xf(w, 1, 1, m, sizeof(m)), *mr = xf(w, 1, 1, m_r, sizeof(m_r));
    xf_t *late = xf(w, 2, 2, m_r, 4), *late_s = xf(w, 2, 3, m, 4);

    assert_false(hccl_is_failure(post_send(w, 0, ms)));
    assert_false(hccl_is_failure(hccl_framer_send_bye(&w->ep[0].s)));
    assert_false(hccl_is_failure(hccl_framer_send_bye(&w->ep[0].s))); /* once */
    assert_true(w->ep[0].s.bye_sent);
    {
        /* On the wire: the message and exactly one BYE frame. */
        char probe[4 * FRAME + 64];
        assert_int_equal(recv(w->ep[1].fd, probe, sizeof(probe), MSG_PEEK | MSG_DONTWAIT),
                         (ssize_t)(2 * FRAME + sizeof(m)));
    }
    assert_true(pump(w, 1));
    pump_n(w, 3);
    assert_true(w->ep[1].s.peer_bye);
    assert_false(w->ep[1].closed);
    assert_false(w->ep[1].s.failed);
    /* Sent before the goodbye: delivered. */
    assert_false(hccl_is_failure(post_recv(w, 1, mr)));
    drive_n(w, 3);
    assert_done_ok(mr);
    assert_memory_equal(m_r, m, sizeof(m));
    /* Nothing more can come. */
    assert_int_equal(post_recv(w, 1, late), hcclRemoteError);
    assert_int_equal(late->ndone, 0);
    drive_n(w, 3);
    assert_int_equal(late->ndone, 1);
    assert_int_equal(late->res, hcclRemoteError);
    assert_true(hccl_is_failure(post_send(w, 1, late_s)));
    drive_n(w, 3);
    assert_int_equal(late_s->ndone, 1);
    assert_int_equal(late_s->res, hcclRemoteError);
    /* The peer closes: EOF after BYE. */
    close(w->ep[0].fd);
    w->ep[0].fd = -1;
    w->ep[0].closed = true;
    pump_n(w, 3);
    assert_true(w->ep[1].closed);
    assert_true(w->ep[1].graceful);
    assert_true(hccl_is_failure(w->ep[1].err));
    assert_false(w->ep[1].s.failed);
    assert_true(w->ep[1].s.peer_bye);
}

/*
 * A receive already posted when the BYE arrives waits on a rank that will never send: it must
 * fail with hcclRemoteError. rx reports the failure, but with peer_bye set, so a caller that
 * takes rx failures after BYE as a clean close (the tcp link) never fails the framer.
 */
static void test_bye_fails_posted_recv(void **state)
{
    world_t *w = *state;
    char buf[16];
    xf_t *rx = xf(w, 5, 5, buf, sizeof(buf));

    assert_int_equal(post_recv(w, 1, rx), hcclSuccess);
    assert_false(hccl_is_failure(hccl_framer_send_bye(&w->ep[0].s)));
    pump_n(w, 20);
    assert_true(w->ep[1].s.peer_bye);
    assert_int_equal(w->ep[1].err, hcclRemoteError); /* rx did say it */
    assert_int_equal(rx->ndone, 1);                  /* and the receive ends with it */
    assert_int_equal(rx->res, hcclRemoteError);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_large_message, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_small_out_of_order, setup, teardown),
        cmocka_unit_test(test_recv_posted_midway),
        cmocka_unit_test_setup_teardown(test_zero_length, setup, teardown),
        cmocka_unit_test_setup_teardown(test_zero_length_at_rx_budget, setup, teardown),
        cmocka_unit_test(test_length_mismatch),
        cmocka_unit_test(test_malformed_frames),
        cmocka_unit_test_setup_teardown(test_fail_completes_everything_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bye_then_recv_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bye_fails_posted_recv, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
