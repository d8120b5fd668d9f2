/*
 * Binomial-tree AllReduce: a reduce to rank 0, then a broadcast from it, both over the tree
 * of tree.c (the parent of v > 0 is v - lowbit(v), its children v + m for the powers of two
 * m below lowbit(v), below n for the root). The buffer is cut into chunks and every chunk is
 * its own reduce-then-broadcast, so the root starts broadcasting chunk c as soon as it has
 * reduced it while later chunks are still coming up: the two phases pipeline.
 *
 * Every rank sums in its RECV (the output everywhere): own data op first child into it, then
 * the next children in a fixed order, chained by edges so the result never depends on which
 * child came first. Children's data arrives in one SCRATCH region at the chunk's offset; the
 * next child's receive waits for the reduce that read the previous one. Nothing is received
 * straight into RECV during the reduce, since in place it still holds our own data. Reduce
 * tags are the chunk number, broadcast tags nch + chunk.
 *
 * Per rank: a non-root sends the buffer up once, and every rank sends it once to each child.
 */
#include "algos/algos.h"

/* However small the chunks asked for, a plan keeps at most this many (steps and tags stay
 * bounded); larger buffers get larger chunks. */
#define TREE_AR_MAX_CHUNKS (1u << 16)

static size_t div_up(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

static int lowbit(int v)
{
    return v & -v;
}

/*
 * One chunk at [off, off + len) bytes. up: the reduce tag; down: the broadcast tag. The
 * broadcast receive overwrites what the up-send reads (the sum, or in place a leaf's own
 * data), so it waits for that send.
 */
static hcclResult_t tree_ar_chunk(hccl_plan_t *p, int v, int n, int span, size_t off, size_t len,
                                  uint32_t up, uint32_t down)
{
    hccl_bref_t own = hccl_bref(HCCL_SLOT_SEND, off), acc = hccl_bref(HCCL_SLOT_RECV, off);
    hccl_bref_t in = hccl_bref(HCCL_SLOT_SCRATCH, off);
    uint32_t last = UINT32_MAX, rid, did, sid;

    for (int m = 1; m < span && v + m < n; m <<= 1) {
        bool final = v == 0 && (2 * m >= span || v + 2 * m >= n);

        HCCL_CHECK(hccl_plan_recv(p, v + m, up, in, len, &rid));
        if (last != UINT32_MAX) /* the previous child's data is still being read */
            HCCL_CHECK(hccl_plan_dep(p, last, rid));
        HCCL_CHECK(hccl_plan_reduce(p, acc, last == UINT32_MAX ? own : acc, in, len,
                                    final ? HCCL_STEP_FINAL_DIV : 0, &did));
        HCCL_CHECK(hccl_plan_dep(p, rid, did));
        if (last != UINT32_MAX)
            HCCL_CHECK(hccl_plan_dep(p, last, did));
        last = did;
    }
    if (v > 0) {
        int parent = v - lowbit(v);

        /* A leaf passes its own data up untouched. */
        HCCL_CHECK(hccl_plan_send(p, parent, up, last == UINT32_MAX ? own : acc, len, &sid));
        if (last != UINT32_MAX)
            HCCL_CHECK(hccl_plan_dep(p, last, sid));
        HCCL_CHECK(hccl_plan_recv(p, parent, down, acc, len, &rid));
        HCCL_CHECK(hccl_plan_dep(p, sid, rid));
        last = rid;
    }
    /* The largest subtree first: it has the longest way still to go. */
    for (int m = span / 2; m >= 1; m /= 2) {
        if (v + m >= n)
            continue;
        HCCL_CHECK(hccl_plan_send(p, v + m, down, acc, len, &sid));
        HCCL_CHECK(hccl_plan_dep(p, last, sid));
    }
    return hcclSuccess;
}

hcclResult_t hccl_algo_tree_allreduce(int rank, int nranks, const hccl_coll_shape_t *shape,
                                      size_t chunk_bytes, hccl_plan_t **plan_p)
{
    hcclResult_t res;
    hccl_plan_t *p = NULL;
    size_t esz = hccl_dtype_size(shape->dtype), count = shape->count, bytes = count * esz;
    size_t chunk_elems = chunk_bytes / esz ? chunk_bytes / esz : 1;
    uint32_t nch;
    int span = 1;

    if (chunk_elems < div_up(count, TREE_AR_MAX_CHUNKS))
        chunk_elems = div_up(count, TREE_AR_MAX_CHUNKS);
    nch = (uint32_t)div_up(count, chunk_elems);
    if (rank > 0)
        span = lowbit(rank);
    else
        while (span < nranks)
            span <<= 1;
    HCCL_CHECK(hccl_plan_create(rank, nranks, shape->dtype, shape->op, "tree", &p));
    if (bytes == 0)
        goto finalize;
    if (nranks == 1) {
        HCCL_CHECK_GOTO(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, 0),
                                       hccl_bref(HCCL_SLOT_SEND, 0), bytes, NULL), res, err);
        goto finalize;
    }
    if (rank + 1 < nranks && span > 1)
        p->scratch_bytes = bytes; /* only ranks with children receive partial sums */
    for (uint32_t c = 0; c < nch; c++) {
        size_t first = (size_t)c * chunk_elems;
        size_t len = count - first < chunk_elems ? count - first : chunk_elems;

        HCCL_CHECK_GOTO(tree_ar_chunk(p, rank, nranks, span, first * esz, len * esz, c, nch + c),
                        res, err);
    }
finalize:
    HCCL_CHECK_GOTO(hccl_plan_finalize(p, bytes, bytes), res, err);
    *plan_p = p;
    return hcclSuccess;

err:
    hccl_plan_release(p);
    return res;
}
