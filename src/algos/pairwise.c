/*
 * Pairwise-exchange AlltoAll(v): n-1 rounds; in round k rank r sends its
 * block for rank (r+k)%n straight from SEND and receives the block of rank
 * (r-k)%n straight into RECV, so every round is a perfect matching and no
 * byte is staged. The own block is one local copy.
 *
 * Blocks are cut into chunk_bytes pieces, and piece c forms a lane: lane c of
 * round k starts once lane c of round k-1 has sent and received. A rank thus
 * has at most one block's worth of data in flight each way, yet a fast lane
 * moves on to the next peer without waiting for the slow ones (no global
 * round barrier). Deadlock-free: a step only waits on earlier rounds of its
 * own rank, and both ends of an exchange belong to the same round and lane.
 *
 * AlltoAll(v) buffers never overlap (docs/api.md), so sends and receives carry no
 * data hazard; the lane edges are the whole DAG.
 */
#include "algos/algos.h"

typedef struct {
    int rank;
    int n;
    size_t esz;
    size_t chunk_elems;
    const size_t *scounts; /* borrowed, [n] elements */
    const size_t *sdispls;
    const size_t *rcounts;
    const size_t *rdispls;
    uint32_t nlanes;       /* pieces of the largest block: lanes ever used */
    uint32_t *last_send;   /* owned, [nlanes]: latest send of the lane, UINT32_MAX if none */
    uint32_t *last_recv;   /* owned, [nlanes]: latest recv of the lane, UINT32_MAX if none */
} pairwise_t;

static size_t div_up(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

static uint32_t npieces(const pairwise_t *g, size_t count)
{
    return (uint32_t)div_up(count, g->chunk_elems);
}

/* Lane c of this round may start once the lane's previous exchange is done, both ways. */
static hcclResult_t lane_after_prev(hccl_plan_t *p, const pairwise_t *g, uint32_t c, uint32_t id)
{
    if (g->last_send[c] != UINT32_MAX)
        HCCL_CHECK(hccl_plan_dep(p, g->last_send[c], id));
    if (g->last_recv[c] != UINT32_MAX)
        HCCL_CHECK(hccl_plan_dep(p, g->last_recv[c], id));
    return hcclSuccess;
}

/*
 * The tag of a piece is its index: the pair (sender, receiver) meets in one round only, so
 * the index alone is unique per direction. A zero count makes no step on either side.
 */
static hcclResult_t pairwise_round(hccl_plan_t *p, pairwise_t *g, int k)
{
    int to = (g->rank + k) % g->n, from = (g->rank - k + g->n) % g->n;
    uint32_t ns = npieces(g, g->scounts[to]), nr = npieces(g, g->rcounts[from]);
    uint32_t nmax = ns > nr ? ns : nr;

    for (uint32_t c = 0; c < nmax; c++) {
        uint32_t sid = UINT32_MAX, rid = UINT32_MAX;
        size_t first, len;

        if (c < ns) {
            hccl_algo_block(g->scounts[to], (int)ns, (int)c, &first, &len);
            HCCL_CHECK(hccl_plan_send(p, to, c,
                                      hccl_bref(HCCL_SLOT_SEND, (g->sdispls[to] + first) * g->esz),
                                      len * g->esz, &sid));
            HCCL_CHECK(lane_after_prev(p, g, c, sid));
        }
        if (c < nr) {
            hccl_algo_block(g->rcounts[from], (int)nr, (int)c, &first, &len);
            HCCL_CHECK(hccl_plan_recv(p, from, c,
                                      hccl_bref(HCCL_SLOT_RECV,
                                                (g->rdispls[from] + first) * g->esz),
                                      len * g->esz, &rid));
            HCCL_CHECK(lane_after_prev(p, g, c, rid));
        }
        /* A lane idle in this round keeps its older steps as the ones to wait for. */
        if (sid != UINT32_MAX || rid != UINT32_MAX) {
            g->last_send[c] = sid;
            g->last_recv[c] = rid;
        }
    }
    return hcclSuccess;
}

/* Slot sizes the plan touches: the furthest element any non-empty block reaches. */
static size_t extent(const size_t *counts, const size_t *displs, int n, size_t esz)
{
    size_t end = 0;

    for (int j = 0; j < n; j++)
        if (counts[j] && displs[j] + counts[j] > end)
            end = displs[j] + counts[j];
    return end * esz;
}

static hcclResult_t pairwise_build(int rank, int nranks, const hccl_coll_shape_t *shape,
                                   size_t chunk_bytes, const size_t *v, hccl_plan_t **plan_p)
{
    hcclResult_t res;
    hccl_plan_t *p = NULL;
    size_t esz = hccl_dtype_size(shape->dtype), maxcount = 0;
    pairwise_t g = {.rank = rank, .n = nranks, .esz = esz, .scounts = v,
                    .sdispls = v + nranks, .rcounts = v + 2 * nranks, .rdispls = v + 3 * nranks};

    /* The own block: both counts are local, so a mismatch is caught here, not on a wire. */
    if (g.scounts[rank] != g.rcounts[rank])
        return HCCL_FAIL(hcclInvalidUsage, "rank %d: alltoallv sends %zu elements to itself but "
                         "expects %zu", rank, g.scounts[rank], g.rcounts[rank]);
    HCCL_CHECK(hccl_plan_create(rank, nranks, shape->dtype, shape->op, "pairwise", &p));
    if (g.scounts[rank])
        HCCL_CHECK_GOTO(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, g.rdispls[rank] * esz),
                                       hccl_bref(HCCL_SLOT_SEND, g.sdispls[rank] * esz),
                                       g.scounts[rank] * esz, NULL), res, err_release);
    g.chunk_elems = chunk_bytes / esz ? chunk_bytes / esz : 1;
    for (int j = 0; j < nranks; j++) {
        if (j == rank)
            continue;
        maxcount = g.scounts[j] > maxcount ? g.scounts[j] : maxcount;
        maxcount = g.rcounts[j] > maxcount ? g.rcounts[j] : maxcount;
    }
    g.nlanes = npieces(&g, maxcount);
    if (g.nlanes) {
        g.last_send = hccl_malloc(g.nlanes * sizeof(*g.last_send));
        g.last_recv = hccl_malloc(g.nlanes * sizeof(*g.last_recv));
        if (!g.last_send || !g.last_recv) {
            res = HCCL_FAIL(hcclSystemError, "pairwise: out of memory for %u lanes", g.nlanes);
            goto err_free;
        }
        for (uint32_t c = 0; c < g.nlanes; c++)
            g.last_send[c] = g.last_recv[c] = UINT32_MAX;
        for (int k = 1; k < nranks; k++)
            HCCL_CHECK_GOTO(pairwise_round(p, &g, k), res, err_free);
    }
    hccl_free(g.last_send);
    hccl_free(g.last_recv);
    HCCL_CHECK_GOTO(hccl_plan_finalize(p, extent(g.scounts, g.sdispls, nranks, esz),
                                       extent(g.rcounts, g.rdispls, nranks, esz)),
                    res, err_release);
    *plan_p = p;
    return hcclSuccess;

err_free:
    hccl_free(g.last_send);
    hccl_free(g.last_recv);
err_release:
    hccl_plan_release(p);
    return res;
}

/* AlltoAll is AlltoAllv with count elements per peer at displacement j*count. */
hcclResult_t hccl_algo_pairwise_alltoall(int rank, int nranks, const hccl_coll_shape_t *shape,
                                         size_t chunk_bytes, hccl_plan_t **plan_p)
{
    hcclResult_t res;
    size_t *v = hccl_malloc(4 * (size_t)nranks * sizeof(*v));

    if (!v)
        return HCCL_FAIL(hcclSystemError, "pairwise: out of memory for %d ranks", nranks);
    for (int j = 0; j < nranks; j++) {
        v[j] = v[2 * nranks + j] = shape->count;
        v[nranks + j] = v[3 * nranks + j] = (size_t)j * shape->count;
    }
    res = pairwise_build(rank, nranks, shape, chunk_bytes, v, plan_p);
    hccl_free(v);
    return res;
}

hcclResult_t hccl_algo_pairwise_alltoallv(int rank, int nranks, const hccl_coll_shape_t *shape,
                                          size_t chunk_bytes, hccl_plan_t **plan_p)
{
    if (!shape->v)
        return HCCL_FAIL(hcclInternalError, "pairwise: alltoallv shape without counts");
    return pairwise_build(rank, nranks, shape, chunk_bytes, shape->v, plan_p);
}
