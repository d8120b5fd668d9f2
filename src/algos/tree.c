/*
 * Binomial-tree Broadcast and Reduce. Ranks are renumbered v = (rank - root) mod n so that
 * the root is v = 0; the parent of v > 0 is v - lowbit(v), and its children are v + m for
 * the powers of two m below lowbit(v) (below n for the root). The buffer is cut into chunks
 * and every chunk is its own small tree operation, so a rank forwards chunk c while chunk
 * c + 1 is still arriving: the depth of the tree costs one chunk of latency per level,
 * not the whole buffer.
 */
#include "algos/algos.h"

/* However small the chunks asked for, a plan keeps at most this many (steps and tags stay
 * bounded); larger buffers get larger chunks. */
#define TREE_MAX_CHUNKS (1u << 16)

typedef struct {
    int n;
    int v;              /* this rank's virtual rank */
    int root;
    size_t count;
    size_t esz;
    size_t chunk_elems;
    uint32_t nch;       /* chunks of the buffer; also the tag space (tag = chunk) */
} tree_t;

static size_t div_up(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

static int lowbit(int v)
{
    return v & -v;
}

static void tree_init(tree_t *t, int rank, int nranks, const hccl_coll_shape_t *shape,
                      size_t chunk_bytes)
{
    t->n = nranks;
    t->root = shape->root;
    t->v = (rank - shape->root + nranks) % nranks;
    t->count = shape->count;
    t->esz = hccl_dtype_size(shape->dtype);
    t->chunk_elems = chunk_bytes / t->esz ? chunk_bytes / t->esz : 1;
    if (t->chunk_elems < div_up(t->count, TREE_MAX_CHUNKS))
        t->chunk_elems = div_up(t->count, TREE_MAX_CHUNKS);
    t->nch = (uint32_t)div_up(t->count, t->chunk_elems);
}

static int real_rank(const tree_t *t, int v)
{
    return (v + t->root) % t->n;
}

/* Children are v + m for m = 1, 2, 4, ... below this (and below n - v). */
static int child_span(const tree_t *t)
{
    int span = 1;

    if (t->v > 0)
        return lowbit(t->v);
    while (span < t->n)
        span <<= 1;
    return span;
}

/* Byte offset and length of chunk c. */
static void chunk_range(const tree_t *t, uint32_t c, size_t *off, size_t *bytes)
{
    size_t first = (size_t)c * t->chunk_elems;
    size_t len = t->count - first < t->chunk_elems ? t->count - first : t->chunk_elems;

    *off = first * t->esz;
    *bytes = len * t->esz;
}

/*
 * Every non-root rank receives each chunk once from its parent into the one buffer and
 * forwards it to its children; nothing is written twice, so the only edges are
 * "received before forwarded". Receives have no predecessors, so no rank can wait on a
 * peer that waits on it.
 */
hcclResult_t hccl_algo_tree_broadcast(int rank, int nranks, const hccl_coll_shape_t *shape,
                                      size_t chunk_bytes, hccl_plan_t **plan_p)
{
    hcclResult_t res;
    hccl_plan_t *p = NULL;
    tree_t t;
    size_t bytes = shape->count * hccl_dtype_size(shape->dtype);

    tree_init(&t, rank, nranks, shape, chunk_bytes);
    HCCL_CHECK(hccl_plan_create(rank, nranks, shape->dtype, shape->op, "tree", &p));
    for (uint32_t c = 0; c < t.nch; c++) {
        size_t off, len;
        uint32_t rid = UINT32_MAX, sid;
        hccl_bref_t buf;

        chunk_range(&t, c, &off, &len);
        buf = hccl_bref(HCCL_SLOT_RECV, off);
        if (t.v > 0)
            HCCL_CHECK_GOTO(hccl_plan_recv(p, real_rank(&t, t.v - lowbit(t.v)), c, buf, len, &rid),
                            res, err);
        /* The largest subtree first: it has the longest way still to go. */
        for (int m = child_span(&t) / 2; m >= 1; m /= 2) {
            if (t.v + m >= nranks)
                continue;
            HCCL_CHECK_GOTO(hccl_plan_send(p, real_rank(&t, t.v + m), c, buf, len, &sid), res, err);
            if (rid != UINT32_MAX)
                HCCL_CHECK_GOTO(hccl_plan_dep(p, rid, sid), res, err);
        }
    }
    HCCL_CHECK_GOTO(hccl_plan_finalize(p, bytes, bytes), res, err);
    *plan_p = p;
    return hcclSuccess;

err:
    hccl_plan_release(p);
    return res;
}

/*
 * Each rank combines, chunk by chunk, its own data with its children's partial results in
 * a fixed order (own, then children by increasing subtree size, as they also tend to
 * arrive) and passes the result up. The order is fixed by a chain of edges between the
 * reduce steps, so the result never depends on which child happened to be first.
 *
 * Where the partial result lives (acc): the root's RECV (it is the output; with
 * sendbuf == recvbuf the first reduce reads and writes the same elements, which is fine),
 * elsewhere a scratch slot, since a non-root's RECV may not exist. A child's data lands in
 * an "in" slot, free again once the reduce that read it is done. A non-root receives its
 * first child straight into acc (acc = own op acc), so a rank with one child needs only acc
 * slots. Slots are chunk-sized and used in turn (hccl_slots_t).
 */
hcclResult_t hccl_algo_tree_reduce(int rank, int nranks, const hccl_coll_shape_t *shape,
                                   size_t chunk_bytes, hccl_plan_t **plan_p)
{
    hcclResult_t res;
    hccl_plan_t *p = NULL;
    tree_t t;
    size_t bytes = shape->count * hccl_dtype_size(shape->dtype);
    int span, nkids = 0;
    bool is_root = rank == shape->root;
    hccl_slots_t acc_slots, in_slots;

    tree_init(&t, rank, nranks, shape, chunk_bytes);
    span = child_span(&t);
    for (int m = 1; m < span && t.v + m < nranks; m <<= 1)
        nkids++;
    HCCL_CHECK(hccl_plan_create(rank, nranks, shape->dtype, shape->op, "tree", &p));
    if (nranks == 1) {
        if (bytes)
            HCCL_CHECK_GOTO(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0),
                                           hccl_bref(HCCL_SLOT_SEND, 0), bytes, NULL), res, err);
        goto finalize;
    }
    {
        size_t first, most;
        chunk_range(&t, 0, &first, &most);
        /* Non-roots with children: acc slots, then in slots; the root: in slots only. */
        hccl_slots_init(&acc_slots, 0, most);
        hccl_slots_init(&in_slots, is_root ? 0 : HCCL_SLOTS * most, most);
        if (is_root)
            p->scratch_bytes = nkids > 0 ? HCCL_SLOTS * most : 0;
        else if (nkids > 0)
            p->scratch_bytes = (nkids > 1 ? 2 : 1) * HCCL_SLOTS * most;
    }
    for (uint32_t c = 0; c < t.nch; c++) {
        size_t off, len;
        uint32_t last = UINT32_MAX, rid, did, sid, acc_k = 0;
        hccl_bref_t acc = hccl_bref(HCCL_SLOT_RECV, 0);
        hccl_bref_t own;

        chunk_range(&t, c, &off, &len);
        if (is_root)
            acc.off = off;
        else if (nkids > 0)
            acc_k = hccl_slots_take(&acc_slots, &acc);
        own = hccl_bref(HCCL_SLOT_SEND, off);
        for (int m = 1; m < span && t.v + m < nranks; m <<= 1) {
            bool direct = !is_root && m == 1;
            bool final = is_root && (2 * m >= span || t.v + 2 * m >= nranks);
            hccl_bref_t in = acc;
            uint32_t in_k = 0;

            if (!direct)
                in_k = hccl_slots_take(&in_slots, &in);
            HCCL_CHECK_GOTO(hccl_plan_recv(p, real_rank(&t, t.v + m), c, in, len, &rid), res, err);
            HCCL_CHECK_GOTO(direct ? hccl_slots_fill(&acc_slots, p, acc_k, rid)
                                   : hccl_slots_fill(&in_slots, p, in_k, rid), res, err);
            HCCL_CHECK_GOTO(hccl_plan_reduce(p, acc, last == UINT32_MAX ? own : acc, in, len,
                                             final ? HCCL_STEP_FINAL_DIV : 0, &did), res, err);
            HCCL_CHECK_GOTO(hccl_plan_dep(p, rid, did), res, err);
            if (last != UINT32_MAX)
                HCCL_CHECK_GOTO(hccl_plan_dep(p, last, did), res, err);
            if (!direct)
                hccl_slots_done(&in_slots, in_k, did);
            last = did;
        }
        if (is_root)
            continue;
        /* A leaf passes its own data up untouched. */
        HCCL_CHECK_GOTO(hccl_plan_send(p, real_rank(&t, t.v - lowbit(t.v)), c,
                                       last == UINT32_MAX ? own : acc, len, &sid), res, err);
        if (last != UINT32_MAX) {
            HCCL_CHECK_GOTO(hccl_plan_dep(p, last, sid), res, err);
            hccl_slots_done(&acc_slots, acc_k, sid);
        }
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
