/*
 * The registry of live stream and event handles: an open-addressing set of pointers under one
 * lock. A handle is looked up here before it is read, so a destroyed one is refused instead of
 * read after free, and the lookup takes a reference under the same lock, so that a concurrent
 * destroy cannot free the object between the lookup and its use.
 */
#include "reactor/hstream.h"

#define REG_TOMBSTONE ((void *)1)

static pthread_mutex_t reg_mtx = PTHREAD_MUTEX_INITIALIZER;
static void **reg_slots;            /* owned, NULL while no handle is live */
static size_t reg_cap;              /* slots, a power of two */
static size_t reg_used;             /* slots live or tombstones: probing ends at an empty one */
static size_t reg_live;             /* live handles */

static size_t reg_find(const void *p)
{
    size_t i = (size_t)(((uintptr_t)p >> 4) * 0x9e3779b97f4a7c15ull) & (reg_cap - 1);

    while (reg_slots[i] && reg_slots[i] != p)
        i = (i + 1) & (reg_cap - 1);
    return i;
}

/* Rebuilds the table without tombstones, big enough for one more handle at half load. */
static bool reg_grow(void)
{
    size_t cap = 16, old_cap = reg_cap;
    void **old = reg_slots, **slots;

    while ((reg_live + 1) * 2 > cap)
        cap *= 2;
    slots = hccl_calloc(cap, sizeof(*slots));
    if (!slots)
        return false;
    reg_slots = slots;
    reg_cap = cap;
    reg_used = reg_live;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i] && old[i] != REG_TOMBSTONE)
            reg_slots[reg_find(old[i])] = old[i];
    hccl_free(old);
    return true;
}

bool hccl_handle_register(hccl_handle_t *h)
{
    bool ok = true;

    pthread_mutex_lock(&reg_mtx);
    if ((reg_used + 1) * 4 > reg_cap * 3)
        ok = reg_grow();
    if (ok) {
        reg_slots[reg_find(h)] = h;
        reg_used++;
        reg_live++;
    }
    pthread_mutex_unlock(&reg_mtx);
    return ok;
}

/* Under reg_mtx: the slot of p if it is live with that magic, else -1 (p is not read then). */
static long reg_lookup_locked(void *p, uint32_t magic)
{
    size_t i;

    if (!reg_slots || !reg_slots[i = reg_find(p)] || ((hccl_handle_t *)p)->magic != magic)
        return -1;
    return (long)i;
}

hccl_handle_t *hccl_handle_get(void *p, uint32_t magic)
{
    hccl_handle_t *h = NULL;

    pthread_mutex_lock(&reg_mtx);
    if (reg_lookup_locked(p, magic) >= 0) {
        h = p;
        atomic_fetch_add(&h->refs, 1);
    }
    pthread_mutex_unlock(&reg_mtx);
    return h;
}

bool hccl_handle_unregister(void *p, uint32_t magic)
{
    long i;

    pthread_mutex_lock(&reg_mtx);
    i = reg_lookup_locked(p, magic);
    if (i >= 0) {
        reg_slots[i] = REG_TOMBSTONE;
        if (--reg_live == 0) { /* nothing left: nothing held for the leak checker to see */
            hccl_free(reg_slots);
            reg_slots = NULL;
            reg_cap = reg_used = 0;
        }
    }
    pthread_mutex_unlock(&reg_mtx);
    return i >= 0;
}
