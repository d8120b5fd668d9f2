/*
 * Writes the seed corpus of every fuzz target into DIR/<target>/ (default tests/fuzz/corpus):
 * small valid messages built with the library's own structures and describers, and a few
 * near-valid ones (wrong secret, other communicator, wrong length, corrupt ring counters).
 * Usage: fuzz_make_seeds [DIR]
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "core/wire.h"
#include "fuzz_common.h"
#include "links/shm/shm.h"
#include "links/frame.h"
#include "links/tcp/tcp.h"

#define RING 512 /* fuzz_shm_ring.c's ring */

static const char *root = "tests/fuzz/corpus";

typedef struct {
    uint8_t b[8192];
    size_t n;
} buf_t;

static void put(buf_t *b, const void *p, size_t n)
{
    if (b->n + n > sizeof(b->b))
        abort();
    memcpy(b->b + b->n, p, n);
    b->n += n;
}

static void put8(buf_t *b, uint8_t v)
{
    put(b, &v, 1);
}

static void write_seed(const char *target, const char *name, const buf_t *b)
{
    char path[512];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", root, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/%s/%s", root, target, name);
    f = fopen(path, "wb");
    if (!f || fwrite(b->b, 1, b->n, f) != b->n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static hccl_frame_t frame(uint16_t type, uint64_t seq, uint32_t tag, uint64_t len)
{
    hccl_frame_t f;

    memset(&f, 0, sizeof(f));
    f.magic = HCCL_WIRE_MAGIC;
    f.version = HCCL_WIRE_VERSION;
    f.type = type;
    f.seq = seq;
    f.tag = tag;
    f.len = len;
    f.comm_id = FUZZ_COMM_ID;
    return f;
}

/* fuzz_frame's prologue: flags, receives before, receives after, sends, then their shapes. */
static void prologue(buf_t *b, uint8_t flags, uint8_t npre, uint8_t npost, uint8_t nsend,
                     const uint16_t (*shape)[3])
{
    put8(b, flags);
    put8(b, npre);
    put8(b, npost);
    put8(b, nsend);
    for (int i = 0; i < npre + npost + nsend; i++) {
        put8(b, (uint8_t)(shape[i][0] & 0xff));
        put8(b, (uint8_t)(shape[i][0] >> 8));
        put8(b, (uint8_t)shape[i][1]);
        put8(b, (uint8_t)shape[i][2]);
    }
}

static void data_frame(buf_t *b, uint64_t seq, uint32_t tag, size_t len)
{
    hccl_frame_t f = frame(HCCL_FRAME_DATA, seq, tag, len);

    put(b, &f, sizeof(f));
    for (size_t i = 0; i < len; i++)
        put8(b, (uint8_t)i);
}

static void seeds_frame(void)
{
    static const uint16_t one[][3] = {{16, 1, 1}};
    static const uint16_t two[][3] = {{16, 1, 1}, {0, 1, 2}};
    static const uint16_t send_rndv[][3] = {{32, 2, 5}, {24, 2, 6}};
    buf_t b = {0};
    hccl_frame_t f;

    prologue(&b, 0, 1, 0, 0, one); /* expected DATA */
    data_frame(&b, 1, 1, 16);
    write_seed("frame", "data_expected", &b);

    b.n = 0; /* two messages before their receives, one of zero bytes, cut in 1-byte reads */
    prologue(&b, 1 << 2, 0, 2, 0, two);
    data_frame(&b, 1, 1, 16);
    data_frame(&b, 1, 2, 0);
    write_seed("frame", "data_unexpected_bytewise", &b);

    b.n = 0; /* our RTS acknowledged by FIN; the peer's RTS read single-copy */
    prologue(&b, 1, 1, 0, 1, send_rndv);
    f = frame(HCCL_FRAME_FIN, 2, 5, 0);
    put(&b, &f, sizeof(f));
    f = frame(HCCL_FRAME_RTS, 2, 6, 24);
    f.addr = 0x1000;
    put(&b, &f, sizeof(f));
    write_seed("frame", "rndv_fin", &b);

    b.n = 0; /* the single-copy read refused: NACK, then DATA */
    prologue(&b, 1 | 2, 1, 0, 1, send_rndv);
    f = frame(HCCL_FRAME_NACK, 2, 5, 0);
    put(&b, &f, sizeof(f));
    f = frame(HCCL_FRAME_RTS, 2, 6, 24);
    put(&b, &f, sizeof(f));
    data_frame(&b, 2, 6, 24);
    write_seed("frame", "rndv_nack", &b);

    b.n = 0;
    prologue(&b, 0, 0, 0, 0, one);
    f = frame(HCCL_FRAME_BYE, 0, 0, 0);
    put(&b, &f, sizeof(f));
    write_seed("frame", "bye", &b);

    b.n = 0; /* near-valid: another communicator, then a wrong length */
    prologue(&b, 0, 1, 0, 0, one);
    f = frame(HCCL_FRAME_DATA, 1, 1, 16);
    f.comm_id ^= 1;
    put(&b, &f, sizeof(f));
    write_seed("frame", "foreign_comm", &b);
    b.n = 0;
    prologue(&b, 0, 1, 0, 0, one);
    data_frame(&b, 1, 1, 17);
    write_seed("frame", "wrong_length", &b);
    b.n = 0; /* a header that claims a huge unexpected message */
    prologue(&b, 0, 0, 1, 0, one);
    f = frame(HCCL_FRAME_DATA, 9, 9, HCCL_WIRE_MAX_LEN);
    put(&b, &f, sizeof(f));
    write_seed("frame", "huge_claim", &b);
}

static void ring_seed(const char *name, uint64_t tail, uint64_t head_extra, uint64_t tx_head,
                      uint64_t tx_tail)
{
    buf_t b = {0}, msg = {0};
    uint8_t ring[RING] = {0};
    uint64_t head = tail + head_extra;

    data_frame(&msg, 1, 1, 64);
    for (size_t i = 0; i < msg.n; i++)
        ring[(tail + i) % RING] = msg.b[i];
    put(&b, &head, 8);
    put(&b, &tail, 8);
    put(&b, &tx_head, 8);
    put(&b, &tx_tail, 8);
    put(&b, ring, sizeof(ring));
    write_seed("shm_ring", name, &b);
}

static void seeds_shm_ring(void)
{
    ring_seed("message", 0, 48 + 64, 0, 0);
    ring_seed("message_wrapped", 5 * RING - 30, 48 + 64, 300, 100);
    ring_seed("tx_full", 0, 48 + 64, RING, 0);
    ring_seed("corrupt_head", 0, 4 * RING, 0, 0);
    ring_seed("corrupt_tx_tail", 0, 48 + 64, 10, 20);
}

static void hello_base(hccl_bs_hello_t *h, int rank, int nranks)
{
    hccl_params_t p;

    memset(h, 0, sizeof(*h));
    memset(&p, 0, sizeof(p));
    h->magic = HCCL_BS_HELLO_MAGIC;
    h->version = HCCL_BS_VERSION;
    fuzz_secret(h->secret);
    h->rank = rank;
    h->nranks = nranks;
    h->wait_ms = 60000;
    h->card.rank = (uint32_t)rank;
    snprintf(h->card.host, sizeof(h->card.host), "host-a");
    p.buffsize = 4u << 20;
    p.calibrate = 1;
    snprintf(p.algo, sizeof(p.algo), "allreduce=ring;broadcast=tree");
    hccl_config_describe(&p, h->config, sizeof(h->config));
}

static void seeds_bs_hello(void)
{
    hccl_bs_hello_t h;
    buf_t b = {0};

    hello_base(&h, 1, 4);
    put(&b, &h, sizeof(h));
    write_seed("bs_hello", "valid", &b);
    hello_base(&h, 2, 4);
    h.status = hcclSystemError;
    snprintf(h.errmsg, sizeof(h.errmsg), "rank 2: shm: out of memory");
    b.n = 0;
    put(&b, &h, sizeof(h));
    write_seed("bs_hello", "rank_failed", &b);
    hello_base(&h, 1, 4);
    h.secret[7] ^= 1;
    b.n = 0;
    put(&b, &h, sizeof(h));
    write_seed("bs_hello", "wrong_secret", &b);
}

static void card_base(hccl_card_t *c, int r)
{
    tcp_card_t *t = (tcp_card_t *)c->blob[HCCL_LINK_TCP];
    shm_card_t *s = (shm_card_t *)c->blob[HCCL_LINK_SHM];

    memset(c, 0, sizeof(*c));
    c->rank = (uint32_t)r;
    c->pid = 1000 + (uint32_t)r;
    c->links = 3;
    snprintf(c->host, sizeof(c->host), "host-a");
    t->family = 2; /* AF_INET */
    t->port = (uint16_t)(40000 + r);
    t->addr[0] = 127;
    t->addr[3] = 1;
    snprintf(s->seg, sizeof(s->seg), "/hccl-0123456789abcdef0123%02x", r);
    snprintf(s->uds, sizeof(s->uds), "hccl-fedcba98765432100123%02x", r);
    s->ring_bytes = 4u << 20;
}

static void seeds_bs_reply(void)
{
    hccl_bs_reply_t rep;
    hccl_card_t c;
    buf_t b = {0};
    const char *msg = "bootstrap: settings differ between ranks: HCCL_ALGO: rank 0 'ring', rank 1 'tree'";

    put8(&b, 2); /* nranks - 1 */
    put8(&b, 1); /* rank */
    memset(&rep, 0, sizeof(rep));
    rep.magic = HCCL_BS_REPLY_MAGIC;
    rep.nranks = 3;
    rep.comm_id = FUZZ_COMM_ID;
    fuzz_secret(rep.secret);
    put(&b, &rep, sizeof(rep));
    for (int r = 0; r < 3; r++) {
        card_base(&c, r);
        put(&b, &c, sizeof(c));
    }
    write_seed("bs_reply", "table", &b);
    b.n = 0;
    put8(&b, 1);
    put8(&b, 0);
    rep.status = hcclInvalidUsage;
    rep.nranks = 0;
    rep.msg_len = (uint32_t)strlen(msg);
    put(&b, &rep, sizeof(rep));
    put(&b, msg, strlen(msg));
    write_seed("bs_reply", "error", &b);
    {
        hccl_bs_setup_t m = {.magic = HCCL_BS_SETUP_MAGIC, .status = hcclRemoteError, .origin = 2};
        const char *why = "root cause at rank 2: rank 2 went away during link set-up";
        b.n = 0;
        put8(&b, 2);
        put8(&b, 0);
        m.msg_len = (uint32_t)strlen(why);
        put(&b, &m, sizeof(m));
        put(&b, why, strlen(why));
        write_seed("bs_reply", "setup_verdict", &b);
    }
}

static void seeds_link_hello(void)
{
    tcp_hello_t t;
    shm_hello_t s;
    buf_t b = {0};

    memset(&t, 0, sizeof(t));
    t.magic = TCP_HELLO_MAGIC;
    t.version = HCCL_WIRE_VERSION;
    t.comm_id = FUZZ_COMM_ID;
    fuzz_secret(t.secret);
    t.rank = 3;
    t.peer = 1;
    put8(&b, 2); /* 4 ranks */
    put8(&b, 1); /* we are rank 1 */
    put(&b, &t, sizeof(t));
    write_seed("link_hello", "tcp", &b);
    memset(&s, 0, sizeof(s));
    s.magic = SHM_HELLO_MAGIC;
    s.rank = 2;
    s.comm_id = FUZZ_COMM_ID;
    fuzz_secret(s.secret);
    b.n = 0;
    put8(&b, 2);
    put8(&b, 1);
    put(&b, &s, sizeof(s));
    write_seed("link_hello", "shm", &b);
}

static void seeds_config(void)
{
    hccl_params_t p;
    char a[HCCL_CONFIG_TEXT_BYTES], c[HCCL_CONFIG_TEXT_BYTES];
    buf_t b = {0};

    memset(&p, 0, sizeof(p));
    p.buffsize = 4u << 20;
    p.calibrate = 1;
    hccl_config_describe(&p, a, sizeof(a));
    snprintf(p.algo, sizeof(p.algo), "ring");
    p.check = 1;
    hccl_config_describe(&p, c, sizeof(c));
    put(&b, a, strlen(a) + 1);
    put(&b, c, strlen(c));
    write_seed("config", "algo_check", &b);
    b.n = 0;
    put(&b, a, strlen(a) + 1);
    put(&b, a, strlen(a));
    write_seed("config", "same", &b);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        root = argv[1];
    if (mkdir(root, 0755) != 0 && errno != EEXIST) {
        perror(root);
        return 1;
    }
    seeds_frame();
    seeds_shm_ring();
    seeds_bs_hello();
    seeds_bs_reply();
    seeds_link_hello();
    seeds_config();
    return 0;
}
