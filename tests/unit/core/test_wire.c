/*
 * The untrusted wire: strangers at the rendezvous are refused while the communicator still
 * forms; the data links' hellos need the secret; a frame of another communicator, a corrupt
 * shm ring or a header claiming a huge message fail or cost nothing, never overrun; settings
 * that differ between ranks fail init on every rank with a per-key diff.
 */
#include <arpa/inet.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/comm.h"
#include "core/wire.h"
#include "links/shm/shm.h"
#include "links/frame.h"
#include "links/tcp/tcp.h"

/* ---- settings that differ ---- */

static void test_config_diff_names_every_key(void **state)
{
    hccl_params_t a, b;
    char ta[HCCL_CONFIG_TEXT_BYTES], tb[HCCL_CONFIG_TEXT_BYTES], diff[1024];

    (void)state;
    memset(&a, 0, sizeof(a));
    a.buffsize = 4u << 20;
    a.calibrate = 1;
    b = a;
    snprintf(a.algo, sizeof(a.algo), "ring");
    snprintf(b.algo, sizeof(b.algo), "tree");
    b.buffsize = 1u << 20;
    snprintf(b.links, sizeof(b.links), "tcp");
    b.check = 1;
    b.calibrate = 0;
    snprintf(b.cost_model, sizeof(b.cost_model), "1,2,3");
    hccl_config_describe(&a, ta, sizeof(ta));
    hccl_config_describe(&b, tb, sizeof(tb));
    assert_int_equal(hccl_config_diff(ta, 0, ta, 3, diff, sizeof(diff)), 0);
    assert_string_equal(diff, "");
    assert_int_equal(hccl_config_diff(ta, 0, tb, 3, diff, sizeof(diff)), 6);
    assert_non_null(strstr(diff, "HCCL_ALGO: rank 0 'ring', rank 3 'tree'"));
    assert_non_null(strstr(diff, "HCCL_BUFFSIZE: rank 0 '4194304', rank 3 '1048576'"));
    assert_non_null(strstr(diff, "HCCL_LINKS: rank 0 '', rank 3 'tcp'"));
    assert_non_null(strstr(diff, "HCCL_CHECK: rank 0 '0', rank 3 '1'"));
    assert_non_null(strstr(diff, "HCCL_CALIBRATE"));
    assert_non_null(strstr(diff, "HCCL_COST_MODEL"));
    /* A key only one side knows (another version) is a difference too. */
    assert_int_equal(hccl_config_diff("A=1\n", 0, "A=1\nB=2\n", 1, diff, sizeof(diff)), 1);
    assert_non_null(strstr(diff, "B: rank 0 (not set: another version), rank 1 '2'"));
    /* Output is bounded, whatever comes in. */
    assert_true(hccl_config_diff(ta, 0, tb, 3, diff, 40) == 6 && strlen(diff) < 40);
}

typedef struct {
    hcclUniqueId id;
    int rank;
    const char *algo;
    hcclResult_t res;
    char msg[1024];
} init_arg_t;

static void *init_rank(void *p)
{
    init_arg_t *a = p;
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
    hcclComm_t comm;
    int x = a->rank + 1;

    cfg.connectTimeoutMs = 30000;
    cfg.algo = a->algo;
    a->res = hcclCommInitRankConfig(&comm, 2, a->id, a->rank, &cfg);
    snprintf(a->msg, sizeof(a->msg), "%s", hcclGetLastError(NULL));
    if (a->res == hcclSuccess) {
        a->res = hcclAllReduce(&x, &x, 1, hcclInt32, hcclSum, comm);
        if (a->res == hcclSuccess && x != 3)
            a->res = hcclInternalError;
        hcclCommDestroy(comm);
    }
    return NULL;
}

static void run_pair(hcclUniqueId id, const char *algo0, const char *algo1, init_arg_t a[2])
{
    pthread_t th[2];

    for (int r = 0; r < 2; r++) {
        a[r] = (init_arg_t){.id = id, .rank = r, .algo = r ? algo1 : algo0};
        assert_int_equal(pthread_create(&th[r], NULL, init_rank, &a[r]), 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
}

static void test_config_mismatch_fails_every_rank(void **state)
{
    hcclUniqueId id;
    init_arg_t a[2];

    (void)state;
    assert_int_equal(hcclGetUniqueId(&id), hcclSuccess);
    run_pair(id, "ring", "tree", a);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(a[r].res, hcclInvalidUsage);
        if (!strstr(a[r].msg, "HCCL_ALGO: rank 0 'ring', rank 1 'tree'") &&
            !strstr(a[r].msg, "HCCL_ALGO: rank 1 'tree', rank 0 'ring'"))
            fail_msg("rank %d: %s", r, a[r].msg);
    }
}

/* ---- strangers at the rendezvous ---- */

static int connect_to(const hcclUniqueId *uid)
{
    hccl_id_t id;
    hccl_sockaddr_t addr;
    int fd;

    memcpy(&id, uid->internal, sizeof(id));
    hccl_id_to_addr(&id, &addr);
    assert_int_equal(hccl_socket_connect_retry(&addr, hccl_now_ms() + 10000, &fd), hcclSuccess);
    return fd;
}

/* The rendezvous closes a connection it refuses: EOF, within its hello timeout. */
static void expect_closed(int fd)
{
    char c;

    assert_int_equal(hccl_socket_recv_all(fd, &c, 1, hccl_now_ms() + 20000), hcclRemoteError);
    close(fd);
}

static void test_stranger_refused_comm_forms(void **state)
{
    hcclUniqueId id;
    hccl_id_t raw;
    hccl_bs_hello_t h;
    init_arg_t a[2];
    char junk[sizeof(h)];
    int fd;

    (void)state;
    assert_int_equal(hcclGetUniqueId(&id), hcclSuccess);
    memcpy(&raw, id.internal, sizeof(raw));
    /* A well-formed hello for rank 0 with a wrong secret. */
    memset(&h, 0, sizeof(h));
    h.magic = HCCL_BS_HELLO_MAGIC;
    h.version = HCCL_BS_VERSION;
    memcpy(h.secret, raw.secret, sizeof(h.secret));
    h.secret[0] ^= 1;
    h.nranks = 2;
    fd = connect_to(&id);
    assert_int_equal(hccl_socket_send_all(fd, &h, sizeof(h), hccl_now_ms() + 5000), hcclSuccess);
    expect_closed(fd);
    /* Bytes that are no hello at all. */
    memset(junk, 0xee, sizeof(junk));
    fd = connect_to(&id);
    assert_int_equal(hccl_socket_send_all(fd, junk, sizeof(junk), hccl_now_ms() + 5000), hcclSuccess);
    expect_closed(fd);
    /* The right secret with a rank out of range is refused too, before it could count. */
    h.secret[0] ^= 1;
    h.rank = 7;
    fd = connect_to(&id);
    assert_int_equal(hccl_socket_send_all(fd, &h, sizeof(h), hccl_now_ms() + 5000), hcclSuccess);
    expect_closed(fd);
    /* The real ranks still form the communicator and reduce. */
    run_pair(id, NULL, NULL, a);
    for (int r = 0; r < 2; r++)
        if (a[r].res != hcclSuccess)
            fail_msg("rank %d: %d %s", r, a[r].res, a[r].msg);
}

/* ---- data links' hellos ---- */

static void test_link_hellos_need_the_secret(void **state)
{
    uint8_t secret[HCCL_SECRET_BYTES];
    tcp_hello_t t = {.magic = TCP_HELLO_MAGIC, .version = HCCL_WIRE_VERSION, .comm_id = 42, .rank = 3,
                     .peer = 1};
    shm_hello_t s = {.magic = SHM_HELLO_MAGIC, .rank = 2, .comm_id = 42};

    (void)state;
    memset(secret, 7, sizeof(secret));
    memcpy(t.secret, secret, sizeof(secret));
    memcpy(s.secret, secret, sizeof(secret));
    assert_null(hccl_tcp_hello_check(&t, 42, secret, 1, 4));
    assert_true(hccl_shm_hello_ok(&s, 42, secret, 4));
    t.secret[HCCL_SECRET_BYTES - 1] ^= 0x80;
    s.secret[HCCL_SECRET_BYTES - 1] ^= 0x80;
    assert_string_equal(hccl_tcp_hello_check(&t, 42, secret, 1, 4), "wrong communicator or secret");
    assert_false(hccl_shm_hello_ok(&s, 42, secret, 4));
    t.secret[HCCL_SECRET_BYTES - 1] ^= 0x80;
    s.secret[HCCL_SECRET_BYTES - 1] ^= 0x80;
    assert_non_null(hccl_tcp_hello_check(&t, 43, secret, 1, 4)); /* another communicator */
    assert_false(hccl_shm_hello_ok(&s, 43, secret, 4));
    assert_non_null(hccl_tcp_hello_check(&t, 42, secret, 2, 4)); /* meant for another rank */
    assert_non_null(hccl_tcp_hello_check(&t, 42, secret, 1, 3)); /* rank 3 of 3 */
    assert_false(hccl_shm_hello_ok(&s, 42, secret, 2));
}

/* ---- frames and rings ---- */

typedef struct {
    const char *p;
    size_t left;
} mem_io_t;

static ssize_t mem_read(hccl_framer_t *s, void *buf, size_t len)
{
    mem_io_t *m = s->transport;
    size_t n = len < m->left ? len : m->left;

    memcpy(buf, m->p, n);
    m->p += n;
    m->left -= n;
    return (ssize_t)n;
}

static ssize_t mem_writev(hccl_framer_t *s, const struct iovec *iov, int iovcnt)
{
    (void)s, (void)iov, (void)iovcnt;
    return 0;
}

static const hccl_framer_io_t mem_io = {.read = mem_read, .writev = mem_writev};

typedef struct {
    hccl_xfer_t x;
    int ndone;
    hcclResult_t res;
} rx_t;

static void on_rx(hccl_xfer_t *x, hcclResult_t res)
{
    ((rx_t *)x)->ndone++;
    ((rx_t *)x)->res = res;
}

static void test_foreign_frame_fails_the_link(void **state)
{
    hccl_reactor_t *r;
    hccl_framer_t s;
    hccl_frame_t f = {.magic = HCCL_WIRE_MAGIC, .version = HCCL_WIRE_VERSION, .type = HCCL_FRAME_DATA,
                      .tag = 1, .comm_id = 99, .seq = 1, .len = 4};
    mem_io_t m = {(const char *)&f, sizeof(f)};
    char buf[4];
    rx_t rx = {.x = {.seq = 1, .tag = 1, .buf = buf, .len = 4, .done = on_rx}};
    hcclResult_t res;

    (void)state;
    assert_int_equal(hccl_reactor_create(NULL, -1, &r), hcclSuccess);
    hccl_framer_init(&s, &mem_io, r, &m, 0, 1, SIZE_MAX);
    s.comm_id = 98;
    assert_int_equal(hccl_framer_post_recv(&s, &rx.x), hcclSuccess);
    res = hccl_framer_rx(&s, SIZE_MAX);
    assert_int_equal(res, hcclRemoteError);
    assert_non_null(strstr(hccl_error_last(), "frame of another communicator"));
    assert_non_null(strstr(hccl_error_last(), "from rank 1"));
    hccl_framer_fail(&s, res);
    for (int i = 0; i < 5; i++)
        hccl_reactor_drive(r, 0);
    assert_int_equal(rx.ndone, 1);
    assert_int_equal(rx.res, hcclRemoteError);
    hccl_reactor_destroy(r);
}

/* A header alone, whatever length it claims, costs one first chunk: memory follows the bytes. */
static void test_huge_claim_costs_nothing(void **state)
{
    hccl_reactor_t *r;
    hccl_framer_t s;
    hccl_frame_t f = {.magic = HCCL_WIRE_MAGIC, .version = HCCL_WIRE_VERSION, .type = HCCL_FRAME_DATA,
                      .tag = 1, .comm_id = 5, .seq = 1, .len = HCCL_WIRE_MAX_LEN};
    mem_io_t m = {(const char *)&f, sizeof(f)};

    (void)state;
    assert_int_equal(hccl_reactor_create(NULL, -1, &r), hcclSuccess);
    hccl_framer_init(&s, &mem_io, r, &m, 0, 1, SIZE_MAX);
    s.comm_id = 5;
    assert_int_equal(hccl_framer_rx(&s, SIZE_MAX), hcclSuccess); /* waits for the payload */
    assert_non_null(s.rx_unexp);
    assert_true(s.rx_unexp->cap <= HCCL_FRAMER_HOLD_FIRST);
    hccl_framer_fail(&s, hcclAborted);
    hccl_reactor_destroy(r);
}

static void test_corrupt_shm_ring(void **state)
{
    size_t used;

    (void)state;
    assert_true(hccl_shm_ring_used(100, 100, 64, &used) && used == 0);
    assert_true(hccl_shm_ring_used(164, 100, 64, &used) && used == 64);
    assert_false(hccl_shm_ring_used(165, 100, 64, &used)); /* more than the ring holds */
    assert_false(hccl_shm_ring_used(99, 100, 64, &used));  /* consumer ahead of producer */
    assert_null(hccl_shm_card_check(&(shm_card_t){.seg = "/hccl-0a1b", .uds = "hccl-ff", .ring_bytes = 8}, 8));
    assert_non_null(hccl_shm_card_check(&(shm_card_t){.seg = "/../etc", .uds = "hccl-ff", .ring_bytes = 8}, 8));
    assert_non_null(hccl_shm_card_check(&(shm_card_t){.seg = "/hccl-0a", .uds = "x", .ring_bytes = 8}, 8));
}

/* A segment is the user's alone: mode 0600, a name with 64 random bits nobody can guess. */
static void test_shm_segment_private(void **state)
{
    hccl_params_t params;
    hccl_link_env_t env;
    shm_card_t card[2];
    void *ctx[2];
    char path[128];
    struct stat st;

    (void)state;
    assert_int_equal(hccl_params_load(&params, NULL), hcclSuccess);
    memset(&env, 0, sizeof(env));
    env.nranks = 2;
    env.params = &params;
    env.setup_watch_fd = -1;
    env.setup_gone = -1;
    for (int i = 0; i < 2; i++)
        assert_int_equal(hccl_link_shm_ops.init(&env, &card[i], &ctx[i]), hcclSuccess);
    snprintf(path, sizeof(path), "/dev/shm%s", card[0].seg);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(st.st_uid, geteuid());
    assert_null(hccl_shm_card_check(&card[0], card[0].ring_bytes));
    /* Two set-ups in one process share the pid: the random part differs. */
    assert_true(strlen(card[0].seg) == strlen(card[1].seg) && strlen(card[0].seg) >= 6 + 16);
    assert_true(strcmp(card[0].seg + strlen(card[0].seg) - 16, card[1].seg + strlen(card[1].seg) - 16) != 0);
    assert_true(strcmp(card[0].uds, card[1].uds) != 0);
    for (int i = 0; i < 2; i++)
        hccl_link_shm_ops.fini(ctx[i]);
    assert_int_not_equal(stat(path, &st), 0); /* unlinked by fini */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_diff_names_every_key),
        cmocka_unit_test(test_config_mismatch_fails_every_rank),
        cmocka_unit_test(test_stranger_refused_comm_forms),
        cmocka_unit_test(test_link_hellos_need_the_secret),
        cmocka_unit_test(test_foreign_frame_fails_the_link),
        cmocka_unit_test(test_huge_claim_costs_nothing),
        cmocka_unit_test(test_corrupt_shm_ring),
        cmocka_unit_test(test_shm_segment_private),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
