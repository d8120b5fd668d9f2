/*
 * The shm link's rings: every counter of a ring lives in memory the peer can write. The input
 * is the receive ring's head and tail and its bytes, then the send ring's head and tail; the
 * framing engine reads frames out of the one and writes a message into the other. Whatever the
 * counters say, nothing outside a ring may be touched.
 */
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_common.h"
#include "links/shm/shm.h"
#include "reactor/reactor.h"

#define RING 512

typedef struct {
    hccl_xfer_t x;
    int ndone;
} fx_t;

static void on_done(hccl_xfer_t *x, hcclResult_t res)
{
    (void)res;
    ((fx_t *)x)->ndone++;
}

static uint64_t take_u64(fuzz_in_t *in)
{
    uint64_t v = 0;

    for (int i = 0; i < 8; i++)
        v |= (uint64_t)fuzz_byte(in) << (8 * i);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static hccl_reactor_t *reactor;
    static hccl_link_env_t env;
    fuzz_in_t in = {data, size};
    shm_ctx_t ctx;
    shm_conn_t sc;
    char *rx = aligned_alloc(64, SHM_RING_HDR_BYTES + RING);
    char *tx = aligned_alloc(64, SHM_RING_HDR_BYTES + RING);
    shm_seg_hdr_t *peer_seg = aligned_alloc(64, SHM_SEG_HDR_BYTES);
    shm_ring_hdr_t *rxh = (shm_ring_hdr_t *)rx, *txh = (shm_ring_hdr_t *)tx;
    fx_t fx[2];
    char rbuf[64], sbuf[200];

    if (!reactor) {
        fuzz_quiet();
        if (hccl_reactor_create(NULL, -1, &reactor) != hcclSuccess)
            abort();
        env.reactor = reactor;
        env.nranks = 2;
    }
    memset(rx, 0, SHM_RING_HDR_BYTES + RING);
    memset(tx, 0, SHM_RING_HDR_BYTES + RING);
    memset(peer_seg, 0, SHM_SEG_HDR_BYTES);
    atomic_store(&peer_seg->polling, 1); /* no doorbell to ring */
    atomic_store(&rxh->head, take_u64(&in));
    atomic_store(&rxh->tail, take_u64(&in));
    atomic_store(&txh->head, take_u64(&in));
    atomic_store(&txh->tail, take_u64(&in));
    memcpy(rx + SHM_RING_HDR_BYTES, in.p, in.left < RING ? in.left : RING);

    memset(&ctx, 0, sizeof(ctx));
    ctx.env = &env;
    ctx.ring_bytes = RING;
    ctx.ring_used = RING;
    memset(&sc, 0, sizeof(sc));
    sc.ctx = &ctx;
    sc.rx_ring = rxh;
    sc.tx_ring = txh;
    sc.peer_seg = peer_seg;
    sc.peer_bell = sc.out_fd = sc.in_fd = -1;
    sc.pid = 0; /* single-copy reads fail: the offered address is the peer's word */
    hccl_framer_init(&sc.framer, &hccl_shm_io, reactor, &sc, 0, 1, SIZE_MAX);
    sc.framer.comm_id = FUZZ_COMM_ID;

    memset(fx, 0, sizeof(fx));
    fx[0].x = (hccl_xfer_t){.seq = 1, .tag = 1, .buf = rbuf, .len = sizeof(rbuf), .done = on_done};
    fx[1].x = (hccl_xfer_t){.seq = 1, .tag = 2, .buf = sbuf, .len = sizeof(sbuf), .done = on_done};
    memset(sbuf, 7, sizeof(sbuf));
    if (hccl_is_failure(hccl_framer_post_recv(&sc.framer, &fx[0].x)))
        hccl_framer_fail(&sc.framer, hcclRemoteError);
    if (hccl_is_failure(hccl_framer_post_send(&sc.framer, &fx[1].x)))
        hccl_framer_fail(&sc.framer, hcclRemoteError);
    for (int i = 0; i < 4 && !sc.framer.failed; i++) {
        hcclResult_t res = hccl_framer_rx(&sc.framer, 1u << 16);
        if (!hccl_is_failure(res))
            res = hccl_framer_tx(&sc.framer);
        if (hccl_is_failure(res))
            hccl_framer_fail(&sc.framer, res);
    }
    hccl_framer_fail(&sc.framer, hcclAborted);
    for (int i = 0; i < 4; i++)
        hccl_reactor_drive(reactor, 0);
    for (int i = 0; i < 2; i++)
        if (fx[i].ndone != 1)
            abort();
    free(rx);
    free(tx);
    free(peer_seg);
    return 0;
}
