/*
 * The lane's memory: two slots in each rank's own segment (shm.h). A rank writes only its
 * own slots and reads its peers' through the mappings the rings already use, so a block
 * crosses cores once per reader and no ring, frame or sequence matching is involved.
 */
#include <stdatomic.h>

#include "links/shm/shm.h"

static shm_lane_slot_t *lane_slot(shm_ctx_t *ctx, int rank, uint64_t lseq)
{
    char *seg = rank == ctx->env->rank ? ctx->seg : ctx->conns[rank]->peer_seg;

    return (shm_lane_slot_t *)(seg + SHM_SEG_HDR_BYTES) + (lseq & 1);
}

bool hccl_shm_lane_reaches_all(void *shm_ctx, int nranks)
{
    shm_ctx_t *ctx = shm_ctx;

    return ctx && ctx->seg && ctx->nactive == nranks - 1;
}

void *hccl_shm_lane_block(void *shm_ctx, int rank, uint64_t lseq)
{
    return lane_slot(shm_ctx, rank, lseq)->data;
}

/* After a publication: peers that do not poll are rung. */
static void lane_ring_sleepers(shm_ctx_t *ctx)
{
    /* Pairs with a reader's flag-clear-then-look, as a ring write does. */
    atomic_thread_fence(memory_order_seq_cst);
    for (int i = 0; i < ctx->nactive; i++) {
        shm_conn_t *sc = ctx->conns[ctx->active[i]];
        if (!atomic_load_explicit(&((shm_seg_hdr_t *)sc->peer_seg)->polling, memory_order_relaxed))
            hccl_shm_ring_bell(sc->peer_bell);
    }
}

void hccl_shm_lane_publish(void *shm_ctx, uint64_t lseq, uint64_t coll_seq, uint32_t sig)
{
    shm_ctx_t *ctx = shm_ctx;
    shm_lane_slot_t *slot = lane_slot(ctx, ctx->env->rank, lseq);

    slot->coll_seq = coll_seq;
    slot->sig = sig;
    atomic_store_explicit(&slot->seq, lseq + 1, memory_order_release);
    lane_ring_sleepers(ctx);
}

void *hccl_shm_lane_part(void *shm_ctx, int rank, uint64_t lseq)
{
    return lane_slot(shm_ctx, rank, lseq)->part;
}

void hccl_shm_lane_publish_part(void *shm_ctx, uint64_t lseq)
{
    shm_ctx_t *ctx = shm_ctx;

    atomic_store_explicit(&lane_slot(ctx, ctx->env->rank, lseq)->part_seq, lseq + 1, memory_order_release);
    lane_ring_sleepers(ctx);
}

bool hccl_shm_lane_part_published(void *shm_ctx, int rank, uint64_t lseq)
{
    return atomic_load_explicit(&lane_slot(shm_ctx, rank, lseq)->part_seq, memory_order_acquire) == lseq + 1;
}

bool hccl_shm_lane_published(void *shm_ctx, int rank, uint64_t lseq, uint64_t *coll_seq, uint32_t *sig)
{
    shm_lane_slot_t *slot = lane_slot(shm_ctx, rank, lseq);

    /* A peer is never two operations ahead: it waits for our block of the one in between. */
    if (atomic_load_explicit(&slot->seq, memory_order_acquire) != lseq + 1)
        return false;
    *coll_seq = slot->coll_seq;
    *sig = slot->sig;
    return true;
}

bool hccl_shm_lane_plan_sent(void *shm_ctx, int rank, uint64_t coll_seq, uint32_t *sig)
{
    shm_ctx_t *ctx = shm_ctx;

    return hccl_stream_holds(&ctx->conns[rank]->stream, coll_seq, sig);
}

void hccl_shm_lane_on_bell(void *shm_ctx, bool (*fn)(void *arg), void *arg)
{
    shm_ctx_t *ctx = shm_ctx;

    ctx->bell_hook = fn;
    ctx->bell_hook_arg = arg;
}
