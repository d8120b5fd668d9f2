/* A small LRU of plans keyed by call shape: a hit allocates nothing. */
#include <string.h>

#include "sched/sched.h"

typedef struct {
    hccl_plan_key_t key;
    hccl_plan_t *plan;    /* retained by the cache */
    uint64_t last_use;
} cache_entry_t;

struct hccl_plan_cache {
    cache_entry_t *entries;
    unsigned cap;
    unsigned n;
    uint64_t clock;
};

hcclResult_t hccl_plan_cache_create(unsigned capacity, hccl_plan_cache_t **c_p)
{
    hccl_plan_cache_t *c = hccl_calloc(1, sizeof(*c));

    if (!c)
        return HCCL_FAIL(hcclSystemError, "plan cache: out of memory");
    c->cap = capacity ? capacity : 1;
    c->entries = hccl_calloc(c->cap, sizeof(*c->entries));
    if (!c->entries) {
        hccl_free(c);
        return HCCL_FAIL(hcclSystemError, "plan cache: out of memory");
    }
    *c_p = c;
    return hcclSuccess;
}

void hccl_plan_cache_destroy(hccl_plan_cache_t *c)
{
    if (!c)
        return;
    for (unsigned i = 0; i < c->n; i++)
        hccl_plan_release(c->entries[i].plan);
    hccl_free(c->entries);
    hccl_free(c);
}

static bool key_equal(const hccl_plan_key_t *a, const hccl_plan_key_t *b)
{
    return a->coll == b->coll && a->algo == b->algo && a->count == b->count &&
           a->dtype == b->dtype && a->op == b->op && a->root == b->root;
}

hccl_plan_t *hccl_plan_cache_get(hccl_plan_cache_t *c, const hccl_plan_key_t *key)
{
    /* A linear scan: the cache is small and the keys are compared field by field. */
    for (unsigned i = 0; i < c->n; i++) {
        if (key_equal(&c->entries[i].key, key)) {
            c->entries[i].last_use = ++c->clock;
            hccl_plan_retain(c->entries[i].plan);
            return c->entries[i].plan;
        }
    }
    return NULL;
}

hcclResult_t hccl_plan_cache_put(hccl_plan_cache_t *c, const hccl_plan_key_t *key,
                                 hccl_plan_t *plan)
{
    cache_entry_t *e;

    if (c->n < c->cap) {
        e = &c->entries[c->n++];
    } else {
        e = &c->entries[0];
        for (unsigned i = 1; i < c->n; i++)
            if (c->entries[i].last_use < e->last_use)
                e = &c->entries[i];
        hccl_plan_release(e->plan);
    }
    e->key = *key;
    e->plan = plan;
    e->last_use = ++c->clock;
    hccl_plan_retain(plan);
    return hcclSuccess;
}
