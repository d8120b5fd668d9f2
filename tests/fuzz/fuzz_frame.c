/*
 * The framing engine of the tcp and shm links (links/frame*.c) fed arbitrary bytes as a peer's
 * wire. Input: a small prologue chooses the receives and sends posted around the read and how
 * the bytes are cut; the rest is the wire. Whatever arrives, no transfer may be overrun, and
 * once the connection is failed every transfer must have completed exactly once (a transfer
 * lost on some path is a hang in the library).
 */
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_common.h"
#include "links/frame.h"
#include "reactor/reactor.h"

#define MAX_XFERS 8
#define MAX_LEN 4096

typedef struct {
    hccl_xfer_t x;
    int ndone;
} fx_t;

typedef struct {
    fuzz_in_t in;
    unsigned chunk;      /* read at most this many bytes per call (0: all) */
    bool refuse_rndv;
} wire_t;

static hccl_reactor_t *reactor;

static ssize_t io_read(hccl_framer_t *s, void *buf, size_t len)
{
    wire_t *w = s->transport;
    size_t n = len < w->in.left ? len : w->in.left;

    if (w->chunk && n > w->chunk)
        n = w->chunk;
    memcpy(buf, w->in.p, n);
    w->in.p += n;
    w->in.left -= n;
    return (ssize_t)n;
}

static ssize_t io_writev(hccl_framer_t *s, const struct iovec *iov, int iovcnt)
{
    size_t n = 0;

    (void)s;
    for (int i = 0; i < iovcnt; i++)
        n += iov[i].iov_len;
    return (ssize_t)n;
}

/* The address in an RTS frame is the peer's word: it is never dereferenced here either. */
static hcclResult_t io_rndv_read(hccl_framer_t *s, const hccl_frame_t *f, hccl_xfer_t *x)
{
    wire_t *w = s->transport;

    (void)f;
    if (w->refuse_rndv)
        return hcclUnsupported;
    memset(x->buf, 0xab, x->len);
    return hcclSuccess;
}

static const hccl_framer_io_t io_plain = {.read = io_read, .writev = io_writev};
static const hccl_framer_io_t io_rndv = {.read = io_read, .writev = io_writev, .rndv_read = io_rndv_read};

static void on_done(hccl_xfer_t *x, hcclResult_t res)
{
    (void)res;
    ((fx_t *)x)->ndone++;
}

static void fx_init(fx_t *f, fuzz_in_t *in)
{
    size_t len = (size_t)(fuzz_byte(in) | fuzz_byte(in) << 8) % (MAX_LEN + 1);

    memset(f, 0, sizeof(*f));
    f->x.seq = fuzz_byte(in);
    f->x.tag = fuzz_byte(in);
    f->x.len = len;
    f->x.buf = malloc(len ? len : 1); /* exact size: an overrun is caught */
    memset(f->x.buf, 0, len ? len : 1);
    f->x.done = on_done;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fx_t fx[MAX_XFERS];
    int nfx = 0;
    hccl_framer_t s;
    wire_t w = {.in = {data, size}};
    uint8_t flags, npre, npost, nsend;
    hcclResult_t res = hcclSuccess;

    if (!reactor) {
        fuzz_quiet();
        if (hccl_reactor_create(NULL, -1, &reactor) != hcclSuccess)
            abort();
    }
    flags = fuzz_byte(&w.in);
    npre = fuzz_byte(&w.in) % 4;
    npost = fuzz_byte(&w.in) % 3;
    nsend = fuzz_byte(&w.in) % 2;
    w.chunk = (flags >> 2) & 7 ? 1u << (((flags >> 2) & 7) - 1) : 0;
    w.refuse_rndv = flags & 2;
    hccl_framer_init(&s, flags & 1 ? &io_rndv : &io_plain, reactor, &w, 0, 1, 16);
    s.comm_id = FUZZ_COMM_ID;

    for (int i = 0; i < nsend; i++) {
        fx_init(&fx[nfx], &w.in);
        res = hccl_framer_post_send(&s, &fx[nfx++].x);
        if (hccl_is_failure(res))
            hccl_framer_fail(&s, res);
    }
    for (int i = 0; i < npre; i++) {
        fx_init(&fx[nfx], &w.in);
        res = hccl_framer_post_recv(&s, &fx[nfx++].x);
        if (hccl_is_failure(res))
            hccl_framer_fail(&s, res);
    }
    /* The post-read receives are described before the wire so that the wire runs to the end. */
    fx_t *late = &fx[nfx];
    for (int i = 0; i < npost; i++)
        fx_init(&fx[nfx++], &w.in);
    while (!s.failed && w.in.left > 0) {
        size_t before = w.in.left;
        res = hccl_framer_rx(&s, 1u << 16);
        if (!hccl_is_failure(res))
            res = hccl_framer_tx(&s);
        if (hccl_is_failure(res))
            hccl_framer_fail(&s, res);
        else if (w.in.left == before)
            break;
    }
    for (int i = 0; i < npost; i++) {
        res = hccl_framer_post_recv(&s, &late[i].x);
        if (hccl_is_failure(res))
            hccl_framer_fail(&s, res);
    }
    (void)hccl_framer_closed_cleanly(&s);
    hccl_framer_fail(&s, hcclAborted);
    hccl_framer_fini(&s);
    for (int i = 0; i < 4; i++)
        hccl_reactor_drive(reactor, 0);
    for (int i = 0; i < nfx; i++) {
        if (fx[i].ndone != 1) {
            fprintf(stderr, "transfer %d (seq %llu tag %u len %zu) completed %d times\n", i,
                    (unsigned long long)fx[i].x.seq, fx[i].x.tag, fx[i].x.len, fx[i].ndone);
            abort();
        }
        free(fx[i].x.buf);
    }
    return 0;
}
