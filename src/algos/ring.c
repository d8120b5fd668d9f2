/*
 * Ring AllReduce: a reduce-scatter then an all-gather around the ring
 * r -> r+1. Each block is cut into chunks so that large buffers pipeline:
 * chunk c of the next step starts as soon as chunk c of this one is done. Received chunks
 * wait for their reduce in a few chunk-sized scratch slots (hccl_slots_t).
 */
#include <string.h>

#include "algos/algos.h"

void hccl_algo_block(size_t count, int n, int b, size_t *first, size_t *len)
{
    size_t base = count / (size_t)n, rem = count % (size_t)n, ub = (size_t)b;

    *first = ub * base + (ub < rem ? ub : rem);
    *len = base + (ub < rem ? 1 : 0);
}

static int mod(int a, int n)
{
    return ((a % n) + n) % n;
}

static size_t div_up(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

typedef struct {
    int rank;
    int n;
    size_t count;
    size_t esz;
    size_t chunk_elems;
    uint32_t nch_max;  /* chunks of the largest block: the tag stride */
    uint32_t *red;     /* [block][chunk] last step that produced the chunk */
    uint32_t *rs_send; /* [block][chunk] reduce-scatter send of the chunk, or UINT32_MAX */
    hccl_slots_t slots; /* received chunks wait there for their reduce */
} ring_t;

static uint32_t nchunks(const ring_t *g, size_t len)
{
    return len ? (uint32_t)div_up(len, g->chunk_elems) : 0;
}

/* Elements [*off, *off + *len) of chunk c of block b. */
static void chunk_range(const ring_t *g, int b, uint32_t c, size_t *off, size_t *len)
{
    size_t bfirst, blen, cfirst;

    hccl_algo_block(g->count, g->n, b, &bfirst, &blen);
    hccl_algo_block(blen, (int)nchunks(g, blen), (int)c, &cfirst, len);
    *off = bfirst + cfirst;
}

static uint32_t block_chunks(const ring_t *g, int b)
{
    size_t first, len;

    hccl_algo_block(g->count, g->n, b, &first, &len);
    return nchunks(g, len);
}

static uint32_t *at(const ring_t *g, uint32_t *arr, int b, uint32_t c)
{
    return &arr[(size_t)b * g->nch_max + c];
}

static hcclResult_t ring_reduce_scatter(ring_t *g, hccl_plan_t *p)
{
    int next = mod(g->rank + 1, g->n), prev = mod(g->rank - 1, g->n);

    for (int s = 0; s < g->n - 1; s++) {
        int sb = mod(g->rank - s, g->n), rb = mod(g->rank - s - 1, g->n);
        uint32_t tag0 = (uint32_t)s * g->nch_max;

        for (uint32_t c = 0; c < block_chunks(g, sb); c++) {
            size_t off, len;
            uint32_t id;
            chunk_range(g, sb, c, &off, &len);
            HCCL_CHECK(hccl_plan_send(p, next, tag0 + c,
                                      hccl_bref(s == 0 ? HCCL_SLOT_SEND : HCCL_SLOT_RECV, off * g->esz),
                                      len * g->esz, &id));
            if (s > 0)
                HCCL_CHECK(hccl_plan_dep(p, *at(g, g->red, sb, c), id));
            *at(g, g->rs_send, sb, c) = id;
        }
        for (uint32_t c = 0; c < block_chunks(g, rb); c++) {
            size_t off, len;
            uint32_t rid, did;
            hccl_bref_t tmp;
            uint32_t slot = hccl_slots_take(&g->slots, &tmp);
            chunk_range(g, rb, c, &off, &len);
            HCCL_CHECK(hccl_plan_recv(p, prev, tag0 + c, tmp, len * g->esz, &rid));
            HCCL_CHECK(hccl_slots_fill(&g->slots, p, slot, rid));
            HCCL_CHECK(hccl_plan_reduce(p, hccl_bref(HCCL_SLOT_RECV, off * g->esz),
                                        hccl_bref(HCCL_SLOT_SEND, off * g->esz), tmp, len * g->esz,
                                        s == g->n - 2 ? HCCL_STEP_FINAL_DIV : 0, &did));
            HCCL_CHECK(hccl_plan_dep(p, rid, did));
            hccl_slots_done(&g->slots, slot, did);
            *at(g, g->red, rb, c) = did;
        }
    }
    return hcclSuccess;
}

static hcclResult_t ring_all_gather(ring_t *g, hccl_plan_t *p)
{
    int next = mod(g->rank + 1, g->n), prev = mod(g->rank - 1, g->n);

    for (int s = 0; s < g->n - 1; s++) {
        int sb = mod(g->rank + 1 - s, g->n), rb = mod(g->rank - s, g->n);
        uint32_t tag0 = (uint32_t)(g->n - 1 + s) * g->nch_max;

        for (uint32_t c = 0; c < block_chunks(g, sb); c++) {
            size_t off, len;
            uint32_t id;
            chunk_range(g, sb, c, &off, &len);
            HCCL_CHECK(hccl_plan_send(p, next, tag0 + c, hccl_bref(HCCL_SLOT_RECV, off * g->esz),
                                      len * g->esz, &id));
            /* The chunk is final: reduced at the end of the reduce-scatter, or just received. */
            HCCL_CHECK(hccl_plan_dep(p, *at(g, g->red, sb, c), id));
        }
        for (uint32_t c = 0; c < block_chunks(g, rb); c++) {
            size_t off, len;
            uint32_t id;
            chunk_range(g, rb, c, &off, &len);
            HCCL_CHECK(hccl_plan_recv(p, prev, tag0 + c, hccl_bref(HCCL_SLOT_RECV, off * g->esz),
                                      len * g->esz, &id));
            /* Do not overwrite the partial sum the reduce-scatter is still sending from it. */
            HCCL_CHECK(hccl_plan_dep(p, *at(g, g->rs_send, rb, c), id));
            *at(g, g->red, rb, c) = id;
        }
    }
    return hcclSuccess;
}

hcclResult_t hccl_algo_ring_allreduce(int rank, int nranks, const hccl_coll_shape_t *shape,
                                      size_t chunk_bytes, hccl_plan_t **plan_p)
{
    hcclResult_t res;
    hccl_plan_t *p = NULL;
    size_t esz = hccl_dtype_size(shape->dtype), bytes = shape->count * esz;
    size_t first, maxlen;
    ring_t g = {.rank = rank, .n = nranks, .count = shape->count, .esz = esz};

    HCCL_CHECK(hccl_plan_create(rank, nranks, shape->dtype, shape->op, "ring", &p));
    if (nranks == 1) {
        HCCL_CHECK_GOTO(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0), hccl_bref(HCCL_SLOT_SEND, 0),
                                       bytes, NULL), res, err_release);
        goto finalize;
    }
    g.chunk_elems = chunk_bytes / esz ? chunk_bytes / esz : 1;
    hccl_algo_block(shape->count, nranks, 0, &first, &maxlen);
    g.nch_max = nchunks(&g, maxlen) ? nchunks(&g, maxlen) : 1;
    g.red = hccl_calloc((size_t)nranks * g.nch_max, sizeof(*g.red));
    g.rs_send = hccl_calloc((size_t)nranks * g.nch_max, sizeof(*g.rs_send));
    if (!g.red || !g.rs_send) {
        res = HCCL_FAIL(hcclSystemError, "ring: out of memory");
        goto err_free;
    }
    hccl_slots_init(&g.slots, 0, (maxlen < g.chunk_elems ? maxlen : g.chunk_elems) * esz);
    p->scratch_bytes = HCCL_SLOTS * g.slots.bytes;
    HCCL_CHECK_GOTO(ring_reduce_scatter(&g, p), res, err_free);
    HCCL_CHECK_GOTO(ring_all_gather(&g, p), res, err_free);
    hccl_free(g.red);
    hccl_free(g.rs_send);
finalize:
    HCCL_CHECK_GOTO(hccl_plan_finalize(p, bytes, bytes), res, err_release);
    *plan_p = p;
    return hcclSuccess;

err_free:
    hccl_free(g.red);
    hccl_free(g.rs_send);
err_release:
    hccl_plan_release(p);
    return res;
}
