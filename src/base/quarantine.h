/*
 * Freed handles stay readable for a while: hcclCommDestroy and the last release of a request
 * poison the handle's magic and hand the memory here instead of to free(), so that a stale
 * handle passed back to the API (use after destroy, a request waited twice) is recognised by
 * its magic instead of being read after free. Each thread keeps the last
 * HCCL_QUARANTINE_SLOTS handles of each kind it released; an older one is freed for real, or
 * kept as a spare that hccl_quarantine_reuse hands out again (a request per call would
 * otherwise cost a malloc and a free).
 */
#ifndef HCCL_QUARANTINE_H
#define HCCL_QUARANTINE_H

#define HCCL_QUARANTINE_SLOTS 256

enum { HCCL_QUARANTINE_COMM, HCCL_QUARANTINE_REQUEST, HCCL_QUARANTINE_KINDS };

#include <stddef.h>

/* Any thread. p (from hccl_malloc/calloc, NULL accepted; size bytes, its magic a uint32_t
 * first) is freed later. */
void hccl_quarantine_free(int kind, void *p, size_t size);
/* A zeroed block of size bytes of this kind that left this thread's quarantine, to be used in
 * place of hccl_calloc (and freed like it); NULL if there is none of that size. */
void *hccl_quarantine_reuse(int kind, size_t size);

#endif /* HCCL_QUARANTINE_H */
