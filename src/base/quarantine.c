/* Delayed frees of API handles (see quarantine.h). */
#include <stdatomic.h>

#include "base/base.h"
#include "base/quarantine.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define QUARANTINE_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define QUARANTINE_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define QUARANTINE_POISON(p, n) ((void)(p), (void)(n))
#define QUARANTINE_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

static _Atomic(void *) slots[HCCL_QUARANTINE_KINDS][HCCL_QUARANTINE_SLOTS];
static atomic_uint next_slot[HCCL_QUARANTINE_KINDS];

void hccl_quarantine_free(int kind, void *p, size_t size)
{
    unsigned i;
    void *old;

    if (!p)
        return;
    /* Under AddressSanitizer everything but the magic is poisoned, so that a use after free of
     * the rest inside the library is still caught. */
    QUARANTINE_POISON((char *)p + sizeof(uint32_t), size - sizeof(uint32_t));
    i = atomic_fetch_add_explicit(&next_slot[kind], 1, memory_order_relaxed) % HCCL_QUARANTINE_SLOTS;
    old = atomic_exchange_explicit(&slots[kind][i], p, memory_order_acq_rel);
    if (old)
        QUARANTINE_UNPOISON(old, size);
    hccl_free(old);
}
