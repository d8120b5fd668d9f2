/* Delayed frees of API handles, per thread (see quarantine.h). */
#include <pthread.h>
#include <string.h>

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

/* Blocks out of the quarantine kept for reuse, per kind: a request per call in flight. */
#define QUARANTINE_SPARES 16

typedef struct {
    void *p;
    size_t size;
} held_t;

/* A thread's handles: a ring of the last SLOTS it released, and spares that left it. */
typedef struct {
    held_t ring[HCCL_QUARANTINE_KINDS][HCCL_QUARANTINE_SLOTS];
    unsigned next[HCCL_QUARANTINE_KINDS];
    held_t spare[HCCL_QUARANTINE_KINDS][QUARANTINE_SPARES];
    int nspare[HCCL_QUARANTINE_KINDS];
} quarantine_t;

static pthread_key_t key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static _Thread_local HCCL_TLS_FAST quarantine_t *tl_quarantine;

/* A thread that exits frees what it held: its stale handles dangle from then on. */
static void quarantine_thread_exit(void *arg)
{
    quarantine_t *q = arg;

    for (int k = 0; k < HCCL_QUARANTINE_KINDS; k++) {
        for (int i = 0; i < HCCL_QUARANTINE_SLOTS; i++) {
            QUARANTINE_UNPOISON(q->ring[k][i].p, q->ring[k][i].size);
            hccl_free(q->ring[k][i].p);
        }
        for (int i = 0; i < q->nspare[k]; i++)
            hccl_free(q->spare[k][i].p);
    }
    hccl_free(q);
    tl_quarantine = NULL; /* a release in a later destructor starts a new one */
}

static void quarantine_make_key(void)
{
    (void)pthread_key_create(&key, quarantine_thread_exit);
}

static quarantine_t *quarantine_mine(void)
{
    quarantine_t *q = tl_quarantine;

    if (q)
        return q;
    pthread_once(&key_once, quarantine_make_key);
    q = hccl_calloc(1, sizeof(*q));
    if (q && pthread_setspecific(key, q) != 0) {
        hccl_free(q);
        q = NULL;
    }
    tl_quarantine = q;
    return q;
}

void hccl_quarantine_free(int kind, void *p, size_t size)
{
    quarantine_t *q;
    held_t old;

    if (!p)
        return;
    q = quarantine_mine();
    if (!q) {
        hccl_free(p); /* no memory for the ring: a stale handle goes undetected */
        return;
    }
    /* Under AddressSanitizer everything but the magic is poisoned, so that a use after free of
     * the rest inside the library is still caught. */
    QUARANTINE_POISON((char *)p + sizeof(uint32_t), size - sizeof(uint32_t));
    old = q->ring[kind][q->next[kind]];
    q->ring[kind][q->next[kind]] = (held_t){p, size};
    q->next[kind] = (q->next[kind] + 1) % HCCL_QUARANTINE_SLOTS;
    if (!old.p)
        return;
    QUARANTINE_UNPOISON(old.p, old.size);
    if (q->nspare[kind] < QUARANTINE_SPARES)
        q->spare[kind][q->nspare[kind]++] = old;
    else
        hccl_free(old.p);
}

void *hccl_quarantine_reuse(int kind, size_t size)
{
    quarantine_t *q = tl_quarantine;

    if (!q || q->nspare[kind] == 0 || q->spare[kind][q->nspare[kind] - 1].size != size)
        return NULL;
    void *p = q->spare[kind][--q->nspare[kind]].p;
    memset(p, 0, size);
    return p;
}
