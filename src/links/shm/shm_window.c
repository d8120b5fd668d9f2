/*
 * The shm window (link.h, the window capability): two slots in each rank's own segment
 * (shm.h). A rank writes only its own slots and reads its peers' through the mappings the rings
 * already use, so a block crosses cores once per reader and no ring, frame or sequence matching
 * is involved.
 */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/uio.h>

#include "links/shm/shm.h"

static shm_window_slot_t *window_slot(shm_ctx_t *ctx, int rank, uint64_t round)
{
    char *seg = rank == ctx->env->rank ? ctx->seg : ctx->conns[rank]->peer_seg;

    return (shm_window_slot_t *)(seg + SHM_SEG_HDR_BYTES) + (round & 1);
}

static bool window_reaches_all(void *shm_ctx, int nranks)
{
    shm_ctx_t *ctx = shm_ctx;

    return ctx && ctx->seg && ctx->nactive == nranks - 1;
}

static void *window_block(void *shm_ctx, int rank, uint64_t round)
{
    return window_slot(shm_ctx, rank, round)->data;
}

void hccl_shm_window_probe(shm_ctx_t *ctx)
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
            HCCL_INFO(HCCL_SUB_LINK,
                      "rank %d: shm: cannot read rank %d's memory (%s): window blocks are "
                      "copied",
                      env->rank, ctx->active[i], strerror(errno));
            return;
        }
    }
    atomic_store_explicit(&((shm_seg_hdr_t *)ctx->seg)->reads_all, 1, memory_order_release);
}

static bool window_direct_ok(void *shm_ctx)
{
    shm_ctx_t *ctx = shm_ctx;

    if (ctx->window_direct)
        return true;
    if (!atomic_load_explicit(&((shm_seg_hdr_t *)ctx->seg)->reads_all, memory_order_acquire))
        return false;
    for (int i = 0; i < ctx->nactive; i++)
        if (!atomic_load_explicit(
                &((shm_seg_hdr_t *)ctx->conns[ctx->active[i]]->peer_seg)->reads_all,
                memory_order_acquire))
            return false;
    ctx->window_direct = true;
    return true;
}

static bool window_is_direct(void *shm_ctx, int rank, uint64_t round)
{
    return window_slot(shm_ctx, rank, round)->addr != 0;
}

static hcclResult_t window_read(void *shm_ctx, int rank, uint64_t round, size_t off, void *dst,
                                size_t len)
{
    shm_ctx_t *ctx = shm_ctx;
    shm_window_slot_t *slot = window_slot(ctx, rank, round);
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
            return HCCL_FAIL(hcclRemoteError,
                             "rank %d: shm: single-copy read of %zu bytes of rank %d's "
                             "window block (pid %d) failed: %s",
                             ctx->env->rank, len, rank, (int)sc->pid,
                             got < 0 ? strerror(errno) : "short read");
        done += (size_t)got;
    }
    /* A peer that died may have had its memory reused: what we read is not its block. */
    if (hccl_shm_peer_left(sc))
        return HCCL_FAIL(hcclRemoteError,
                         "rank %d: shm: rank %d (pid %d) went away during a single-copy "
                         "read of its window block",
                         ctx->env->rank, rank, (int)sc->pid);
    return hcclSuccess;
}

/* After a publication: peers that do not poll are rung. */
static void window_ring_sleepers(shm_ctx_t *ctx)
{
    /* Pairs with a reader's flag-clear-then-look, as a ring write does. */
    atomic_thread_fence(memory_order_seq_cst);
    for (int i = 0; i < ctx->nactive; i++) {
        shm_conn_t *sc = ctx->conns[ctx->active[i]];
        if (!atomic_load_explicit(&((shm_seg_hdr_t *)sc->peer_seg)->polling, memory_order_relaxed))
            hccl_shm_ring_bell(sc->peer_bell);
    }
}

static void window_publish(void *shm_ctx, uint64_t round, uint64_t seq, uint32_t sig,
                           const void *direct)
{
    shm_ctx_t *ctx = shm_ctx;
    shm_window_slot_t *slot = window_slot(ctx, ctx->env->rank, round);

    slot->label_seq = seq;
    slot->sig = sig;
    slot->addr = (uint64_t)(uintptr_t)direct;
    atomic_store_explicit(&slot->seq, round + 1, memory_order_release);
    window_ring_sleepers(ctx);
}

static bool window_published(void *shm_ctx, int rank, uint64_t round, uint64_t *seq, uint32_t *sig)
{
    shm_window_slot_t *slot = window_slot(shm_ctx, rank, round);

    /* A peer is never two rounds ahead: it waits for our block of the one in between (a peer
     * publishes the next one only after our block of its current one is in). */
    if (atomic_load_explicit(&slot->seq, memory_order_acquire) != round + 1)
        return false;
    *seq = slot->label_seq;
    *sig = slot->sig;
    return true;
}

static void *window_part(void *shm_ctx, int rank, uint64_t round)
{
    return window_slot(shm_ctx, rank, round)->part;
}

/* A slot's flags: set to 1 + round by the owner, seen by peers. */
static _Atomic uint64_t *window_flag(shm_window_slot_t *slot, int flag)
{
    return flag == HCCL_WINDOW_PART ? &slot->part_seq : &slot->gpart_seq;
}

static void window_raise(void *shm_ctx, int flag, uint64_t round)
{
    shm_ctx_t *ctx = shm_ctx;

    atomic_store_explicit(window_flag(window_slot(ctx, ctx->env->rank, round), flag), round + 1,
                          memory_order_release);
    window_ring_sleepers(ctx);
}

static bool window_raised(void *shm_ctx, int rank, int flag, uint64_t round)
{
    return atomic_load_explicit(window_flag(window_slot(shm_ctx, rank, round), flag),
                                memory_order_acquire) == round + 1;
}

static shm_seg_hdr_t *rank0_hdr(shm_ctx_t *ctx)
{
    return (shm_seg_hdr_t *)(ctx->env->rank == 0 ? ctx->seg : ctx->conns[0]->peer_seg);
}

static uint64_t window_word(void *shm_ctx, int idx)
{
    return atomic_load_explicit(&rank0_hdr(shm_ctx)->words[idx], memory_order_relaxed);
}

/* Ordered before rank 0's next publication (a release), after which peers read it. */
static void window_set_word(void *shm_ctx, int idx, uint64_t word)
{
    atomic_store_explicit(&rank0_hdr(shm_ctx)->words[idx], word, memory_order_relaxed);
}

static bool window_holds(void *shm_ctx, int rank, uint64_t seq, uint32_t *sig)
{
    shm_ctx_t *ctx = shm_ctx;

    return hccl_framer_holds(&ctx->conns[rank]->framer, seq, sig);
}

static void window_on_bell(void *shm_ctx, bool (*fn)(void *arg), void *arg)
{
    shm_ctx_t *ctx = shm_ctx;

    ctx->bell_hook = fn;
    ctx->bell_hook_arg = arg;
}

const hccl_window_ops_t hccl_shm_window_ops = {
    .reaches_all = window_reaches_all,
    .block = window_block,
    .publish = window_publish,
    .published = window_published,
    .direct_ok = window_direct_ok,
    .is_direct = window_is_direct,
    .read = window_read,
    .part = window_part,
    .raise = window_raise,
    .raised = window_raised,
    .word = window_word,
    .set_word = window_set_word,
    .holds = window_holds,
    .on_bell = window_on_bell,
    .check_room = hccl_shm_check_room,
};
