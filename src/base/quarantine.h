/*
 * Freed handles stay readable for a while: hcclCommDestroy and the last release of a request
 * poison the handle's magic and hand the memory here instead of to free(), so that a stale
 * handle passed back to the API (use after destroy, a request waited twice) is recognised by
 * its magic instead of being read after free. Each kind keeps its last HCCL_QUARANTINE_SLOTS
 * handles; older ones are freed for real.
 */
#ifndef HCCL_QUARANTINE_H
#define HCCL_QUARANTINE_H

#define HCCL_QUARANTINE_SLOTS 256

enum { HCCL_QUARANTINE_COMM, HCCL_QUARANTINE_REQUEST, HCCL_QUARANTINE_KINDS };

#include <stddef.h>

/*
 * Any thread. p (from hccl_malloc/calloc, NULL accepted; size bytes, every handle of a kind the
 * same size, its magic a uint32_t first) is freed later.
 */
void hccl_quarantine_free(int kind, void *p, size_t size);

#endif /* HCCL_QUARANTINE_H */
