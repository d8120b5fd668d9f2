/*
 * The lane's memory: two slots in each rank's own segment (shm.h). A rank writes only its
 * own slots and reads its peers' through the mappings the rings already use, so a block
 * crosses cores once per reader and no ring, frame or sequence matching is involved.
 */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/uio.h>

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

void hccl_shm_lane_probe(shm_ctx_t *ctx)
{
    hccl_link_env_t *env = ctx->env;

    if (env->params->cma_threshold == SIZE_MAX)
        return;
    for (int i = 0; i < ctx->nactive; i++) {
        shm_conn_t *sc = ctx->conns[ctx->active[i]];
        const shm_card_t *card = (const shm_card_t *)env->cards[ctx->active[i]].blob[HCCL_LINK_SHM];
        uint64_t word;
        struct iovec local = {&word, sizeof(word)};
        struct iovec remote = {(void *)(uintptr_t)card->seg_addr, sizeof(word)};
        if (process_vm_readv(sc->pid, &local, 1, &remote, 1, 0) != (ssize_t)sizeof(word)) {
            HCCL_INFO(HCCL_SUB_LINK, "rank %d: shm: cannot read rank %d's memory (%s): lane blocks are "
                      "copied", env->rank, ctx->active[i], strerror(errno));
            return;
        }
    }
    atomic_store_explicit(&((shm_seg_hdr_t *)ctx->seg)->reads_all, 1, memory_order_release);
}

bool hccl_shm_lane_direct_ok(void *shm_ctx)
{
    shm_ctx_t *ctx = shm_ctx;

    if (ctx->lane_direct)
        return true;
    if (!atomic_load_explicit(&((shm_seg_hdr_t *)ctx->seg)->reads_all, memory_order_acquire))
        return false;
    for (int i = 0; i < ctx->nactive; i++)
        if (!atomic_load_explicit(&((shm_seg_hdr_t *)ctx->conns[ctx->active[i]]->peer_seg)->reads_all,
                                  memory_order_acquire))
            return false;
    ctx->lane_direct = true;
    return true;
}

bool hccl_shm_lane_is_direct(void *shm_ctx, int rank, uint64_t lseq)
{
    return lane_slot(shm_ctx, rank, lseq)->addr != 0;
}

hcclResult_t hccl_shm_lane_read(void *shm_ctx, int rank, uint64_t lseq, size_t off, void *dst, size_t len)
{
    shm_ctx_t *ctx = shm_ctx;
    shm_lane_slot_t *slot = lane_slot(ctx, rank, lseq);
    shm_conn_t *sc = ctx->conns[rank];
    size_t done = 0;

    if (!slot->addr) {
        memcpy(dst, slot->data + off, len);
        return hcclSuccess;
    }
    while (done < len) {
        struct iovec local = {(char *)dst + done, len - done};
        struct iovec remote = {(void *)(uintptr_t)(slot->addr + off + done), len - done};
        ssize_t got = process_vm_readv(sc->pid, &local, 1, &remote, 1, 0);
        if (got <= 0)
            return HCCL_FAIL(hcclRemoteError, "rank %d: shm: single-copy read of %zu bytes of rank %d's "
                                              "lane block (pid %d) failed: %s", ctx->env->rank, len, rank,
                             (int)sc->pid, got < 0 ? strerror(errno) : "short read");
        done += (size_t)got;
    }
    /* A peer that died may have had its memory reused: what we read is not its block. */
    if (hccl_shm_peer_left(sc))
        return HCCL_FAIL(hcclRemoteError, "rank %d: shm: rank %d (pid %d) went away during a single-copy "
                                          "read of its lane block", ctx->env->rank, rank, (int)sc->pid);
    return hcclSuccess;
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

void hccl_shm_lane_publish(void *shm_ctx, uint64_t lseq, uint64_t coll_seq, uint32_t sig, const void *direct)
{
    shm_ctx_t *ctx = shm_ctx;
    shm_lane_slot_t *slot = lane_slot(ctx, ctx->env->rank, lseq);

    slot->coll_seq = coll_seq;
    slot->sig = sig;
    slot->addr = (uint64_t)(uintptr_t)direct;
    atomic_store_explicit(&slot->seq, lseq + 1, memory_order_release);
    lane_ring_sleepers(ctx);
}

void *hccl_shm_lane_part(void *shm_ctx, int rank, uint64_t lseq)
{
    return lane_slot(shm_ctx, rank, lseq)->part;
}

/* A slot's part flags (part_seq, gpart_seq): set to 1 + lseq by the owner, seen by peers. */
static void lane_flag_publish(shm_ctx_t *ctx, _Atomic uint64_t *flag, uint64_t lseq)
{
    atomic_store_explicit(flag, lseq + 1, memory_order_release);
    lane_ring_sleepers(ctx);
}

static bool lane_flag_is(_Atomic uint64_t *flag, uint64_t lseq)
{
    return atomic_load_explicit(flag, memory_order_acquire) == lseq + 1;
}

void hccl_shm_lane_publish_part(void *shm_ctx, uint64_t lseq)
{
    shm_ctx_t *ctx = shm_ctx;

    lane_flag_publish(ctx, &lane_slot(ctx, ctx->env->rank, lseq)->part_seq, lseq);
}

bool hccl_shm_lane_part_published(void *shm_ctx, int rank, uint64_t lseq)
{
    return lane_flag_is(&lane_slot(shm_ctx, rank, lseq)->part_seq, lseq);
}

static shm_seg_hdr_t *rank0_hdr(shm_ctx_t *ctx)
{
    return (shm_seg_hdr_t *)(ctx->env->rank == 0 ? ctx->seg : ctx->conns[0]->peer_seg);
}

uint64_t hccl_shm_lane_mode(void *shm_ctx, int cls)
{
    return atomic_load_explicit(&rank0_hdr(shm_ctx)->lane_mode[cls], memory_order_relaxed);
}

/* Ordered before rank 0's next publication (a release), after which peers read it. */
void hccl_shm_lane_set_mode(void *shm_ctx, int cls, uint64_t word)
{
    atomic_store_explicit(&rank0_hdr(shm_ctx)->lane_mode[cls], word, memory_order_relaxed);
}

void hccl_shm_lane_publish_gpart(void *shm_ctx, uint64_t lseq)
{
    shm_ctx_t *ctx = shm_ctx;

    lane_flag_publish(ctx, &lane_slot(ctx, ctx->env->rank, lseq)->gpart_seq, lseq);
}

bool hccl_shm_lane_gpart_published(void *shm_ctx, int rank, uint64_t lseq)
{
    return lane_flag_is(&lane_slot(shm_ctx, rank, lseq)->gpart_seq, lseq);
}

bool hccl_shm_lane_published(void *shm_ctx, int rank, uint64_t lseq, uint64_t *coll_seq, uint32_t *sig)
{
    shm_lane_slot_t *slot = lane_slot(shm_ctx, rank, lseq);

    /* A peer is never two operations ahead: it waits for our block of the one in between
     * (a peer publishes the next one only after our block of its current one is in). */
    if (atomic_load_explicit(&slot->seq, memory_order_acquire) != lseq + 1)
        return false;
    *coll_seq = slot->coll_seq;
    *sig = slot->sig;
    return true;
}

bool hccl_shm_lane_plan_sent(void *shm_ctx, int rank, uint64_t coll_seq, uint32_t *sig)
{
    shm_ctx_t *ctx = shm_ctx;

    return hccl_framer_holds(&ctx->conns[rank]->framer, coll_seq, sig);
}

void hccl_shm_lane_on_bell(void *shm_ctx, bool (*fn)(void *arg), void *arg)
{
    shm_ctx_t *ctx = shm_ctx;

    ctx->bell_hook = fn;
    ctx->bell_hook_arg = arg;
}
