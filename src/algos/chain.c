/*
 * Pipelined chain Broadcast and Reduce. Broadcast runs root -> root+1 -> ... -> root-1;
 * Reduce runs root+1 -> root+2 -> ... -> root, so the result ends at the root. The buffer
 * is cut into chunks and each link of the chain forwards chunk c as soon as it has it:
 * every rank sends the buffer once, and for many chunks the time approaches one buffer
 * over one link whatever the number of ranks (latency grows with n, bandwidth does not).
 */
#include "algos/algos.h"

/* However small the chunks asked for, a plan keeps at most this many (steps and tags stay
 * bounded); larger buffers get larger chunks. */
#define CHAIN_MAX_CHUNKS (1u << 16)

typedef struct {
    int prev;           /* the rank before us in the chain */
    int next;           /* the rank after us */
    int pos;            /* 0 for the first rank of the chain, n - 1 for the last */
    size_t count;
    size_t esz;
    size_t chunk_elems;
    uint32_t nch;       /* chunks of the buffer; the tag of chunk c is c */
} chain_t;

static size_t div_up(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

/* first: the rank at the head of the chain. */
static void chain_init(chain_t *g, int rank, int nranks, int first, const hccl_coll_shape_t *shape,
                       size_t chunk_bytes)
{
    g->prev = (rank - 1 + nranks) % nranks;
    g->next = (rank + 1) % nranks;
    g->pos = (rank - first + nranks) % nranks;
    g->count = shape->count;
    g->esz = hccl_dtype_size(shape->dtype);
    g->chunk_elems = chunk_bytes / g->esz ? chunk_bytes / g->esz : 1;
    if (g->chunk_elems < div_up(g->count, CHAIN_MAX_CHUNKS))
        g->chunk_elems = div_up(g->count, CHAIN_MAX_CHUNKS);
    g->nch = (uint32_t)div_up(g->count, g->chunk_elems);
}

/* Byte offset and length of chunk c. */
static void chunk_range(const chain_t *g, uint32_t c, size_t *off, size_t *bytes)
{
    size_t first = (size_t)c * g->chunk_elems;
    size_t len = g->count - first < g->chunk_elems ? g->count - first : g->chunk_elems;

    *off = first * g->esz;
    *bytes = len * g->esz;
}

/*
 * Each chunk is received once into the one buffer and forwarded after it arrived; no
 * region is written twice, so there is no hazard to order. Receives have no predecessors:
 * a send waiting on its receiver never waits on anything the sender still has to do.
 */
hcclResult_t hccl_algo_chain_broadcast(int rank, int nranks, const hccl_coll_shape_t *shape,
                                       size_t chunk_bytes, hccl_plan_t **plan_p)
{
    hcclResult_t res;
    hccl_plan_t *p = NULL;
    chain_t g;
    size_t bytes = shape->count * hccl_dtype_size(shape->dtype);

    chain_init(&g, rank, nranks, shape->root, shape, chunk_bytes);
    HCCL_CHECK(hccl_plan_create(rank, nranks, shape->dtype, shape->op, "chain", &p));
    for (uint32_t c = 0; c < g.nch; c++) {
        size_t off, len;
        uint32_t rid = UINT32_MAX, sid;

        chunk_range(&g, c, &off, &len);
        if (g.pos > 0)
            HCCL_CHECK_GOTO(hccl_plan_recv(p, g.prev, c, hccl_bref(HCCL_SLOT_RECV, off), len, &rid),
                            res, err);
        if (g.pos == nranks - 1)
            continue;
        HCCL_CHECK_GOTO(hccl_plan_send(p, g.next, c, hccl_bref(HCCL_SLOT_RECV, off), len, &sid),
                        res, err);
        if (rid != UINT32_MAX)
            HCCL_CHECK_GOTO(hccl_plan_dep(p, rid, sid), res, err);
    }
    HCCL_CHECK_GOTO(hccl_plan_finalize(p, bytes, bytes), res, err);
    *plan_p = p;
    return hcclSuccess;

err:
    hccl_plan_release(p);
    return res;
}

/*
 * The head sends its own data; every later rank receives the partial result of the ranks
 * before it into scratch, combines it with its own (partial op own, the same order
 * everywhere) and passes it on. A middle rank reduces in place in scratch, since its RECV
 * buffer may not exist; each scratch chunk is written by one receive, then one reduce, then
 * read by one send, so no region is reused. The root writes the last reduce to RECV and
 * divides there once for hcclAvg; it reads its own SEND chunk in the same step, so
 * sendbuf == recvbuf needs nothing more.
 */
hcclResult_t hccl_algo_chain_reduce(int rank, int nranks, const hccl_coll_shape_t *shape,
                                    size_t chunk_bytes, hccl_plan_t **plan_p)
{
    hcclResult_t res;
    hccl_plan_t *p = NULL;
    chain_t g;
    size_t bytes = shape->count * hccl_dtype_size(shape->dtype);
    bool is_root = rank == shape->root;
    hccl_slots_t slots;

    chain_init(&g, rank, nranks, (shape->root + 1) % nranks, shape, chunk_bytes);
    HCCL_CHECK(hccl_plan_create(rank, nranks, shape->dtype, shape->op, "chain", &p));
    if (nranks == 1) {
        if (bytes)
            HCCL_CHECK_GOTO(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0),
                                           hccl_bref(HCCL_SLOT_SEND, 0), bytes, NULL), res, err);
        goto finalize;
    }
    {
        size_t first, most;
        chunk_range(&g, 0, &first, &most);
        hccl_slots_init(&slots, 0, most);
        p->scratch_bytes = g.pos > 0 ? HCCL_SLOTS * most : 0;
    }
    for (uint32_t c = 0; c < g.nch; c++) {
        size_t off, len;
        uint32_t rid, did, sid, k;
        hccl_bref_t own, part;

        chunk_range(&g, c, &off, &len);
        own = hccl_bref(HCCL_SLOT_SEND, off);
        if (g.pos == 0) {
            HCCL_CHECK_GOTO(hccl_plan_send(p, g.next, c, own, len, NULL), res, err);
            continue;
        }
        k = hccl_slots_take(&slots, &part);
        HCCL_CHECK_GOTO(hccl_plan_recv(p, g.prev, c, part, len, &rid), res, err);
        HCCL_CHECK_GOTO(hccl_slots_fill(&slots, p, k, rid), res, err);
        HCCL_CHECK_GOTO(hccl_plan_reduce(p, is_root ? hccl_bref(HCCL_SLOT_RECV, off) : part,
                                         part, own, len, is_root ? HCCL_STEP_FINAL_DIV : 0,
                                         &did), res, err);
        HCCL_CHECK_GOTO(hccl_plan_dep(p, rid, did), res, err);
        if (is_root) {
            hccl_slots_done(&slots, k, did);
            continue;
        }
        HCCL_CHECK_GOTO(hccl_plan_send(p, g.next, c, part, len, &sid), res, err);
        HCCL_CHECK_GOTO(hccl_plan_dep(p, did, sid), res, err);
        hccl_slots_done(&slots, k, sid);
    }
finalize:
    /* Only the root has a RECV buffer: a plan that touched it elsewhere fails this check. */
    HCCL_CHECK_GOTO(hccl_plan_finalize(p, bytes, is_root ? bytes : 0), res, err);
    *plan_p = p;
    return hcclSuccess;

err:
    hccl_plan_release(p);
    return res;
}
