/* Delayed frees of API handles (see quarantine.h). */
#include <stdatomic.h>

#include "core/core.h"
#include "core/quarantine.h"

static _Atomic(void *) slots[HCCL_QUARANTINE_KINDS][HCCL_QUARANTINE_SLOTS];
static atomic_uint next_slot[HCCL_QUARANTINE_KINDS];

void hccl_quarantine_free(int kind, void *p)
{
    unsigned i;

    if (!p)
        return;
    i = atomic_fetch_add_explicit(&next_slot[kind], 1, memory_order_relaxed) % HCCL_QUARANTINE_SLOTS;
    hccl_free(atomic_exchange_explicit(&slots[kind][i], p, memory_order_acq_rel));
}
