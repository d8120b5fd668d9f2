/* Allocation through one place, so tests can make it fail on purpose. */
#include <stdlib.h>

#include "base/base.h"

static atomic_long fail_countdown;

void hccl_alloc_fail_at(long n)
{
    atomic_store(&fail_countdown, n);
}

static bool alloc_should_fail(void)
{
    long n = atomic_load_explicit(&fail_countdown, memory_order_relaxed);

    if (n <= 0)
        return false;
    return atomic_fetch_sub(&fail_countdown, 1) == 1;
}

void *hccl_calloc(size_t n, size_t size)
{
    return alloc_should_fail() ? NULL : calloc(n, size);
}

void *hccl_malloc(size_t size)
{
    return alloc_should_fail() ? NULL : malloc(size);
}

void *hccl_realloc(void *p, size_t size)
{
    return alloc_should_fail() ? NULL : realloc(p, size);
}

void *hccl_aligned_alloc(size_t align, size_t size)
{
    void *p;

    if (alloc_should_fail() || posix_memalign(&p, align, size) != 0)
        return NULL;
    return p;
}

void hccl_free(void *p)
{
    free(p);
}
