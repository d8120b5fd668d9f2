/*
 * The framer's flow control (frame.h, eager_cap): a sender far ahead of its receiver leaves at
 * most the cap of payload held there, the rest waits as offers until the receives are posted;
 * every message still arrives intact; a peer that ignores the cap is failed, naming it.
 */
#include "frame_pair.h"

#define CAP (16u << 10)
#define MSG 1024u
#define NMSG 100

static void set_cap(world_t *w, size_t cap)
{
    for (int i = 0; i < 2; i++)
        w->ep[i].s.eager_cap = cap;
}

/* The largest payload ep 1 holds while ep 0 sends NMSG messages nobody has asked for yet. */
static size_t run_ahead(world_t *w, xf_t **tx, xf_t **rx, char *src, char *dst)
{
    size_t peak = 0;

    for (int i = 0; i < NMSG; i++) {
        fill(src + (size_t)i * MSG, MSG, (uint32_t)i);
        tx[i] = xf(w, (uint64_t)i, 0, src + (size_t)i * MSG, MSG);
        rx[i] = xf(w, (uint64_t)i, 0, dst + (size_t)i * MSG, MSG);
        assert_false(hccl_is_failure(post_send(w, 0, tx[i])));
    }
    for (int n = 0; n < 2000; n++) {
        pump_once(w);
        if (w->ep[1].s.rx_held > peak)
            peak = w->ep[1].s.rx_held;
    }
    return peak;
}

static void post_all_and_check(world_t *w, xf_t **tx, xf_t **rx, const char *src, const char *dst)
{
    for (int i = 0; i < NMSG; i++)
        assert_false(hccl_is_failure(post_recv(w, 1, rx[i])));
    assert_true(pump(w, 2 * NMSG));
    pump_n(w, 50); /* the last answers, which carry credit */
    for (int i = 0; i < NMSG; i++) {
        assert_done_ok(tx[i]);
        assert_done_ok(rx[i]);
    }
    assert_memory_equal(src, dst, (size_t)NMSG * MSG);
    assert_int_equal(w->ep[1].s.rx_held, 0);
    assert_null(w->ep[1].s.unexp_head);
    /* What the sender still counts is exactly what the receiver has not credited yet. */
    assert_int_equal(w->ep[0].s.tx_uncredited, w->ep[1].s.rx_uncredited);
    assert_int_equal(w->ep[0].err, hcclSuccess);
    assert_int_equal(w->ep[1].err, hcclSuccess);
}

/* Single copy (shm-like): past the cap the messages are offered, and read once posted. */
static void test_cap_single_copy(void **state)
{
    world_t *w = world_new(&io_rndv, 64u << 10);
    xf_t *tx[NMSG], *rx[NMSG];
    char *src = wbuf(w, (size_t)NMSG * MSG), *dst = wbuf(w, (size_t)NMSG * MSG);
    size_t peak;
    int sent = 0;

    (void)state;
    set_cap(w, CAP);
    peak = run_ahead(w, tx, rx, src, dst);
    assert_true(peak > 0);
    assert_true(peak <= CAP);
    /* The sends written as DATA are done; the offered ones wait for their receives. */
    for (int i = 0; i < NMSG; i++)
        sent += tx[i]->ndone;
    assert_int_equal((size_t)sent * MSG, peak);
    assert_non_null(w->ep[0].s.await_fin.head);
    post_all_and_check(w, tx, rx, src, dst);
    assert_true(w->ep[1].rndv_reads >= NMSG - (int)(CAP / MSG));
    world_free(w);
}

/* Offers only pulled (tcp-like): the offered messages come as DATA once asked for. */
static void test_cap_pulled(void **state)
{
    world_t *w = world_new(&io_plain, SIZE_MAX);
    xf_t *tx[NMSG], *rx[NMSG];
    char *src = wbuf(w, (size_t)NMSG * MSG), *dst = wbuf(w, (size_t)NMSG * MSG);

    (void)state;
    for (int i = 0; i < 2; i++) {
        w->ep[i].s.rndv_threshold = 1u << 20;
        w->ep[i].s.pull_max = SIZE_MAX;
    }
    set_cap(w, CAP);
    assert_true(run_ahead(w, tx, rx, src, dst) <= CAP);
    post_all_and_check(w, tx, rx, src, dst);
    assert_int_equal(w->ep[1].rndv_reads, 0);
    world_free(w);
}

/* Receives posted first: all is delivered at once, and a message past half the cap asks for
 * credit, whose answer comes back before the cap is reached: nothing is ever offered. */
static void test_cap_receiver_ahead(void **state)
{
    world_t *w = world_new(&io_rndv, 64u << 10);
    xf_t *tx[NMSG], *rx[NMSG];
    char *src = wbuf(w, (size_t)NMSG * MSG), *dst = wbuf(w, (size_t)NMSG * MSG);

    (void)state;
    set_cap(w, CAP);
    for (int i = 0; i < NMSG; i++) {
        fill(src + (size_t)i * MSG, MSG, (uint32_t)i);
        tx[i] = xf(w, (uint64_t)i, 0, src + (size_t)i * MSG, MSG);
        rx[i] = xf(w, (uint64_t)i, 0, dst + (size_t)i * MSG, MSG);
        assert_false(hccl_is_failure(post_recv(w, 1, rx[i])));
    }
    for (int i = 0; i < NMSG; i++) {
        assert_false(hccl_is_failure(post_send(w, 0, tx[i])));
        pump_n(w, 3);
    }
    assert_true(pump(w, 2 * NMSG));
    pump_n(w, 50);
    assert_memory_equal(src, dst, (size_t)NMSG * MSG);
    for (int i = 0; i < NMSG; i++)
        assert_done_ok(tx[i]);
    assert_int_equal(w->ep[1].rndv_reads, 0);
    assert_null(w->ep[0].s.await_fin.head);
    assert_false(w->ep[0].s.tx_asking);
    assert_int_equal(w->ep[0].s.tx_uncredited, w->ep[1].s.rx_uncredited);
    assert_true(w->ep[0].s.tx_uncredited <= CAP / 2);
    world_free(w);
}

/* A sender without the cap (another program on the wire) runs past it: the receiver fails. */
static void test_peer_ignoring_cap_fails(void **state)
{
    world_t *w = world_new(&io_rndv, 64u << 10);
    char *src = wbuf(w, (size_t)NMSG * MSG);
    xf_t *rx = xf(w, 999, 0, wbuf(w, MSG), MSG);

    (void)state;
    w->ep[1].s.eager_cap = CAP;
    assert_int_equal(post_recv(w, 1, rx), hcclSuccess);
    for (int i = 0; i < NMSG; i++)
        assert_false(
            hccl_is_failure(post_send(w, 0, xf(w, (uint64_t)i, 0, src + (size_t)i * MSG, MSG))));
    pump_n(w, 2000);
    assert_int_equal(w->ep[1].err, hcclRemoteError);
    assert_non_null(strstr(hccl_error_last(), "rank 0 sent"));
    assert_non_null(strstr(hccl_error_last(), "flow control"));
    assert_true(w->ep[1].s.rx_held <= CAP);
    assert_int_equal(rx->ndone, 1);
    assert_int_equal(rx->res, hcclRemoteError);
    world_free(w);
}

/* Credit for more than was ever sent is a broken peer too (credit rides on answers to offers). */
static void test_bogus_credit_fails(void **state)
{
    world_t *w = world_new(&io_rndv, 64u << 10);
    xf_t *tx = xf(w, 3, 4, wbuf(w, 2 * CAP), 2 * CAP);
    hccl_frame_t f;
    hcclResult_t res;

    (void)state;
    set_cap(w, CAP);
    /* Past the cap on its own: offered, and the offer waits for its answer. */
    assert_int_equal(post_send(w, 0, tx), hcclSuccess);
    assert_non_null(w->ep[0].s.await_fin.head);
    assert_int_equal(w->ep[0].s.tx_uncredited, 0);
    memset(&f, 0, sizeof(f));
    f.magic = HCCL_WIRE_MAGIC;
    f.version = HCCL_WIRE_VERSION;
    f.type = HCCL_FRAME_PULL;
    f.seq = 3;
    f.tag = 4;
    f.len = MSG;
    assert_int_equal(send(w->ep[1].fd, &f, sizeof(f), MSG_NOSIGNAL), (ssize_t)sizeof(f));
    res = hccl_framer_rx(&w->ep[0].s, SIZE_MAX);
    assert_int_equal(res, hcclRemoteError);
    assert_non_null(strstr(hccl_error_last(), "credited 1024 bytes back"));
    ep_failed(&w->ep[0], res, true);
    drive_n(w, 5);
    assert_int_equal(tx->ndone, 1);
    assert_int_equal(tx->res, hcclRemoteError);
    world_free(w);
}

/* Credit comes only when asked for (ASK): any other is a broken peer. */
static void test_unasked_credit_fails(void **state)
{
    world_t *w = world_new(&io_rndv, 64u << 10);
    hccl_frame_t f;
    hcclResult_t res;

    (void)state;
    set_cap(w, CAP);
    assert_false(w->ep[0].s.tx_asking);
    memset(&f, 0, sizeof(f));
    f.magic = HCCL_WIRE_MAGIC;
    f.version = HCCL_WIRE_VERSION;
    f.type = HCCL_FRAME_CREDIT;
    assert_int_equal(send(w->ep[1].fd, &f, sizeof(f), MSG_NOSIGNAL), (ssize_t)sizeof(f));
    res = hccl_framer_rx(&w->ep[0].s, SIZE_MAX);
    assert_true(hccl_is_failure(res));
    assert_non_null(strstr(hccl_error_last(), "credit that was not asked for"));
    ep_failed(&w->ep[0], res, true);
    world_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cap_single_copy),    cmocka_unit_test(test_cap_pulled),
        cmocka_unit_test(test_cap_receiver_ahead), cmocka_unit_test(test_peer_ignoring_cap_fails),
        cmocka_unit_test(test_bogus_credit_fails), cmocka_unit_test(test_unasked_credit_fails),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
