/*
 * Hierarchical (two-level) AllReduce, Broadcast and AllGather for communicators
 * that span several hosts with several ranks each: inside a host over shm,
 * between hosts over the network among one leader per host, so that only the
 * leaders' traffic crosses the network. Built by placing the one-level plans of
 * the other generators (tree, chain, ring, recursive doubling) inside one plan:
 *
 *   AllReduce: reduce to the host's leader -> AllReduce among leaders -> broadcast from it
 *   Broadcast: broadcast among leaders (the root leads its host) -> broadcast in each host
 *   AllGather: gather the host's blocks at its leader -> ring among leaders, a host's
 *              blocks per step -> broadcast of the whole result in each host
 *
 * node_of gives every rank's host index; a host's ranks need not be contiguous
 * in rank order.
 */
#include "algos/algos.h"

/* Tag spaces of the phases: the one-level plans number their tags from 0. */
#define HIER_TAG_INTRA_UP (1u << 28)
#define HIER_TAG_INTER (2u << 28)
#define HIER_TAG_INTRA_DOWN (3u << 28)

typedef struct {
    int *local;      /* ranks of my host, in rank order */
    int nlocal;
    int my_local;    /* my index among them */
    int *leaders;    /* one rank per host, in order of the hosts' first rank */
    int nleaders;
    int my_leader;   /* my index among the leaders, or -1 */
    int lead_local;  /* my host's leader's index in local */
    int root_leader; /* the index among the leaders of the one leading the root's host */
    uint32_t *sinks; /* steps the next phase waits for */
    uint32_t nsinks;
} hier_t;

static void hier_free(hier_t *h)
{
    hccl_free(h->local);
    hccl_free(h->leaders);
    hccl_free(h->sinks);
}

/* The host's leader is lead_root when it lives there, else the host's first rank. */
static hcclResult_t hier_groups(hier_t *h, int rank, int n, const int *node_of, int lead_root)
{
    h->local = hccl_calloc((size_t)n, sizeof(int));
    h->leaders = hccl_calloc((size_t)n, sizeof(int));
    h->sinks = hccl_calloc((size_t)n * 4 + 16, sizeof(uint32_t));
    if (!h->local || !h->leaders || !h->sinks)
        return HCCL_FAIL(hcclSystemError, "hier: out of memory");
    h->my_leader = -1;
    for (int r = 0; r < n; r++) {
        bool first_of_host = true;
        if (node_of[r] == node_of[rank]) {
            if (r == rank)
                h->my_local = h->nlocal;
            h->local[h->nlocal++] = r;
        }
        for (int q = 0; q < r && first_of_host; q++)
            first_of_host = node_of[q] != node_of[r];
        if (first_of_host) {
            int lead = lead_root >= 0 && node_of[lead_root] == node_of[r] ? lead_root : r;
            if (lead == rank)
                h->my_leader = h->nleaders;
            if (lead == lead_root)
                h->root_leader = h->nleaders;
            h->leaders[h->nleaders++] = lead;
        }
    }
    for (int i = 0; i < h->nlocal; i++)
        for (int j = 0; j < h->nleaders; j++)
            if (h->local[i] == h->leaders[j])
                h->lead_local = i;
    return hcclSuccess;
}

/* Builds sub (already finalized), embeds it, and makes its last steps the next phase's wait. */
static hcclResult_t hier_phase(hier_t *h, hccl_plan_t *p, hccl_plan_t *sub, const int *peers,
                               hccl_bref_t send_at, hccl_bref_t recv_at, size_t *scratch_end,
                               uint32_t tag_base)
{
    hccl_plan_embed_t e = {.peer_map = peers, .tag_base = tag_base, .after = h->sinks,
                           .nafter = h->nsinks};
    uint32_t first;
    hcclResult_t res;

    e.slot_map[HCCL_SLOT_SEND] = send_at;
    e.slot_map[HCCL_SLOT_RECV] = recv_at;
    e.slot_map[HCCL_SLOT_SCRATCH] = hccl_bref(HCCL_SLOT_SCRATCH, *scratch_end);
    res = hccl_plan_embed(p, sub, &e, &first);
    if (res == hcclSuccess) {
        *scratch_end += sub->scratch_bytes;
        /* nsucc of the embedded steps is only known after finalize: use the sub-plan's. */
        uint32_t n = 0;
        uint32_t *s = hccl_realloc(h->sinks, ((size_t)sub->nsteps + 1) * sizeof(*s));
        if (!s) {
            res = HCCL_FAIL(hcclSystemError, "hier: out of memory");
        } else {
            h->sinks = s;
            for (uint32_t i = 0; i < sub->nsteps; i++)
                if (sub->steps[i].nsucc == 0)
                    s[n++] = first + i;
            if (sub->nsteps)
                h->nsinks = n;
        }
    }
    hccl_plan_release(sub);
    return res;
}

/* The common end of the generators: size the scratch, finalize, hand the plan over. */
static hcclResult_t hier_finish(hier_t *h, hccl_plan_t *p, size_t scratch, size_t send_bytes,
                                size_t recv_bytes, hccl_plan_t **plan_p)
{
    hcclResult_t res;

    p->scratch_bytes = scratch;
    res = hccl_plan_finalize(p, send_bytes, recv_bytes);
    hier_free(h);
    if (res != hcclSuccess) {
        hccl_plan_release(p);
        return res;
    }
    *plan_p = p;
    return hcclSuccess;
}

hcclResult_t hccl_algo_hier_allreduce(int rank, int nranks, const hccl_coll_shape_t *shape,
                                      const int *node_of, size_t chunk_bytes, hccl_plan_t **plan_p)
{
    size_t bytes = shape->count * hccl_dtype_size(shape->dtype), scratch = 0;
    hccl_bref_t send = hccl_bref(HCCL_SLOT_SEND, 0), recv = hccl_bref(HCCL_SLOT_RECV, 0);
    hcclRedOp_t op = shape->op == hcclAvg ? hcclSum : shape->op;
    hccl_coll_shape_t sub_shape = *shape;
    hier_t h = {0};
    hccl_plan_t *p = NULL, *sub;
    hcclResult_t res;
    uint32_t id;

    if (!node_of)
        return HCCL_FAIL(hcclInternalError, "hier: no topology");
    HCCL_CHECK_GOTO(hier_groups(&h, rank, nranks, node_of, -1), res, err);
    HCCL_CHECK_GOTO(hccl_plan_create(rank, nranks, shape->dtype, shape->op, "hier", &p), res, err);
    sub_shape.op = op;
    /* 1. Reduce to the host's leader (its local index 0). */
    if (h.nlocal > 1) {
        sub_shape.coll = HCCL_COLL_REDUCE;
        sub_shape.root = 0;
        HCCL_CHECK_GOTO(hccl_algo_tree_reduce(h.my_local, h.nlocal, &sub_shape, chunk_bytes, &sub), res, err);
        HCCL_CHECK_GOTO(hier_phase(&h, p, sub, h.local, send, recv, &scratch, HIER_TAG_INTRA_UP), res, err);
    } else {
        HCCL_CHECK_GOTO(hccl_plan_copy(p, recv, send, bytes, &id), res, err);
        h.sinks[0] = id;
        h.nsinks = 1;
    }
    /* 2. AllReduce among the leaders, in place in the receive buffer. */
    if (h.my_leader >= 0 && h.nleaders > 1) {
        sub_shape.coll = HCCL_COLL_ALLREDUCE;
        sub_shape.root = -1;
        res = bytes > (64u << 10)
                  ? hccl_algo_ring_allreduce(h.my_leader, h.nleaders, &sub_shape, chunk_bytes, &sub)
                  : hccl_algo_recdbl_allreduce(h.my_leader, h.nleaders, &sub_shape, &sub);
        HCCL_CHECK_GOTO(res, res, err);
        HCCL_CHECK_GOTO(hier_phase(&h, p, sub, h.leaders, recv, recv, &scratch, HIER_TAG_INTER), res, err);
    }
    if (h.my_leader >= 0 && shape->op == hcclAvg) {
        /* The one division of hcclAvg, by the whole communicator's size. */
        HCCL_CHECK_GOTO(hccl_plan_copy_flags(p, recv, recv, bytes, HCCL_STEP_FINAL_DIV, &id), res, err);
        for (uint32_t i = 0; i < h.nsinks; i++)
            HCCL_CHECK_GOTO(hccl_plan_dep(p, h.sinks[i], id), res, err);
        h.sinks[0] = id;
        h.nsinks = 1;
    }
    /* 3. Broadcast from the leader. On the others it waits for their sends of step 1: in place,
     * the broadcast overwrites the buffer those sends read. */
    if (h.nlocal > 1) {
        sub_shape.coll = HCCL_COLL_BROADCAST;
        sub_shape.root = 0;
        HCCL_CHECK_GOTO(hccl_algo_tree_broadcast(h.my_local, h.nlocal, &sub_shape, chunk_bytes, &sub), res, err);
        HCCL_CHECK_GOTO(hier_phase(&h, p, sub, h.local, recv, recv, &scratch, HIER_TAG_INTRA_DOWN), res, err);
    }
    return hier_finish(&h, p, scratch, bytes, bytes, plan_p);

err:
    hier_free(&h);
    hccl_plan_release(p);
    return res;
}

hcclResult_t hccl_algo_hier_broadcast(int rank, int nranks, const hccl_coll_shape_t *shape,
                                      const int *node_of, size_t chunk_bytes, hccl_plan_t **plan_p)
{
    size_t bytes = shape->count * hccl_dtype_size(shape->dtype), scratch = 0;
    hccl_bref_t recv = hccl_bref(HCCL_SLOT_RECV, 0);
    hccl_coll_shape_t sub_shape = *shape;
    hier_t h = {0};
    hccl_plan_t *p = NULL, *sub;
    hcclResult_t res;

    if (!node_of)
        return HCCL_FAIL(hcclInternalError, "hier: no topology");
    HCCL_CHECK_GOTO(hier_groups(&h, rank, nranks, node_of, shape->root), res, err);
    HCCL_CHECK_GOTO(hccl_plan_create(rank, nranks, shape->dtype, shape->op, "hier", &p), res, err);
    /* 1. Among the leaders, from the root (the leader of its host). */
    if (h.my_leader >= 0 && h.nleaders > 1) {
        sub_shape.root = h.root_leader;
        HCCL_CHECK_GOTO(hccl_algo_tree_broadcast(h.my_leader, h.nleaders, &sub_shape, chunk_bytes, &sub),
                        res, err);
        HCCL_CHECK_GOTO(hier_phase(&h, p, sub, h.leaders, recv, recv, &scratch, HIER_TAG_INTER), res, err);
    }
    /* 2. Inside each host, from its leader. */
    if (h.nlocal > 1) {
        sub_shape.root = h.lead_local;
        HCCL_CHECK_GOTO(hccl_algo_tree_broadcast(h.my_local, h.nlocal, &sub_shape, chunk_bytes, &sub), res, err);
        HCCL_CHECK_GOTO(hier_phase(&h, p, sub, h.local, recv, recv, &scratch, HIER_TAG_INTRA_DOWN), res, err);
    }
    return hier_finish(&h, p, scratch, bytes, bytes, plan_p);

err:
    hier_free(&h);
    hccl_plan_release(p);
    return res;
}

/* The next run of consecutive ranks of host, at or after rank from: [*a_p, *e_p). */
static bool host_run(const int *node_of, int n, int host, int from, int *a_p, int *e_p)
{
    int a = from, e;

    while (a < n && node_of[a] != host)
        a++;
    if (a == n)
        return false;
    for (e = a; e < n && node_of[e] == host; e++)
        ;
    *a_p = a;
    *e_p = e;
    return true;
}

/*
 * Leader i of H sends to leader i+1 and receives from leader i-1. Step s forwards the blocks
 * of host i-s (its own at s = 0) and receives those of host i-s-1, one transfer per run of
 * consecutive ranks of that host, tagged with the run's first rank: a run crosses each pair
 * of leaders once, and both ends cut a host into the same runs. avail[b] is the step after
 * which block b is in RECV; receives wait for nothing (they write blocks nobody else touches).
 */
static hcclResult_t ring_among_leaders(hier_t *h, hccl_plan_t *p, const int *node_of, int n,
                                       size_t bsz, uint32_t *avail)
{
    int nl = h->nleaders, i = h->my_leader;
    int next = h->leaders[(i + 1) % nl], prev = h->leaders[(i + nl - 1) % nl];

    for (int s = 0; s < nl - 1; s++) {
        int send_host = node_of[h->leaders[(i - s + nl) % nl]];
        int recv_host = node_of[h->leaders[(i - s - 1 + 2 * nl) % nl]];
        int a, e;

        for (int r = 0; host_run(node_of, n, send_host, r, &a, &e); r = e) {
            uint32_t sid, last = UINT32_MAX;
            HCCL_CHECK(hccl_plan_send(p, next, HIER_TAG_INTER + (uint32_t)a,
                                      hccl_bref(HCCL_SLOT_RECV, (size_t)a * bsz),
                                      (size_t)(e - a) * bsz, &sid));
            /* A run received whole has one step for all its blocks: one edge is enough. */
            for (int b = a; b < e; b++) {
                if (avail[b] == last)
                    continue;
                last = avail[b];
                HCCL_CHECK(hccl_plan_dep(p, last, sid));
            }
        }
        for (int r = 0; host_run(node_of, n, recv_host, r, &a, &e); r = e) {
            uint32_t rid;
            HCCL_CHECK(hccl_plan_recv(p, prev, HIER_TAG_INTER + (uint32_t)a,
                                      hccl_bref(HCCL_SLOT_RECV, (size_t)a * bsz),
                                      (size_t)(e - a) * bsz, &rid));
            for (int b = a; b < e; b++)
                avail[b] = rid;
            h->sinks[h->nsinks++] = rid;
        }
    }
    return hcclSuccess;
}

/*
 * Bytes across hosts: leader i sends every block but those of the host after it, so each
 * host receives exactly the n - L_h blocks it lacks, (H - 1) * n blocks in all, the least
 * any AllGather can move between H hosts; inside host h, (L_h - 1) blocks go up and
 * (L_h - 1) copies of the n-block result come down.
 */
hcclResult_t hccl_algo_hier_allgather(int rank, int nranks, const hccl_coll_shape_t *shape,
                                      const int *node_of, size_t chunk_bytes, hccl_plan_t **plan_p)
{
    size_t bsz = shape->count * hccl_dtype_size(shape->dtype), scratch = 0;
    size_t total = (size_t)nranks * bsz;
    hccl_bref_t recv = hccl_bref(HCCL_SLOT_RECV, 0), send = hccl_bref(HCCL_SLOT_SEND, 0);
    hccl_coll_shape_t sub_shape = *shape;
    hier_t h = {0};
    hccl_plan_t *p = NULL, *sub;
    uint32_t *avail = NULL, id;
    hcclResult_t res;

    if (!node_of)
        return HCCL_FAIL(hcclInternalError, "hier: no topology");
    HCCL_CHECK_GOTO(hier_groups(&h, rank, nranks, node_of, -1), res, err);
    HCCL_CHECK_GOTO(hccl_plan_create(rank, nranks, shape->dtype, shape->op, "hier", &p), res, err);
    if (bsz == 0) /* every block empty: nothing to move on any rank */
        return hier_finish(&h, p, 0, 0, 0, plan_p);
    /* 1. The host's blocks to its leader, each straight into its place in the leader's RECV. */
    if (h.my_leader < 0) {
        HCCL_CHECK_GOTO(hccl_plan_send(p, h.local[h.lead_local], HIER_TAG_INTRA_UP, send, bsz, &id),
                        res, err);
        h.sinks[h.nsinks++] = id;
    } else {
        avail = hccl_calloc((size_t)nranks, sizeof(*avail));
        if (!avail) {
            res = HCCL_FAIL(hcclSystemError, "hier: out of memory");
            goto err;
        }
        for (int b = 0; b < nranks; b++)
            avail[b] = UINT32_MAX; /* a dependency on a block not yet here fails the build */
        /* In place SEND is RECV's block rank and the copy a no-op. */
        HCCL_CHECK_GOTO(hccl_plan_copy(p, hccl_bref(HCCL_SLOT_RECV, (size_t)rank * bsz), send, bsz,
                                       &avail[rank]), res, err);
        h.sinks[h.nsinks++] = avail[rank];
        for (int q = 0; q < h.nlocal; q++) {
            if (h.local[q] == rank)
                continue;
            HCCL_CHECK_GOTO(hccl_plan_recv(p, h.local[q], HIER_TAG_INTRA_UP,
                                           hccl_bref(HCCL_SLOT_RECV, (size_t)h.local[q] * bsz), bsz,
                                           &avail[h.local[q]]), res, err);
            h.sinks[h.nsinks++] = avail[h.local[q]];
        }
        /* 2. The hosts' blocks around the ring of leaders. */
        HCCL_CHECK_GOTO(ring_among_leaders(&h, p, node_of, nranks, bsz, avail), res, err);
    }
    /* 3. The whole result from the leader to its host, tree or chain, whichever the shm model
     * finds faster. On the others it waits for their send of step 1: in place, the broadcast
     * overwrites the block that send reads. */
    if (h.nlocal > 1) {
        hccl_cost_t shm = hccl_cost_default(HCCL_COST_SHM);
        bool chain = hccl_cost_estimate(&shm, HCCL_COLL_BROADCAST, HCCL_ALGO_CHAIN, total, h.nlocal,
                                        chunk_bytes) <
                     hccl_cost_estimate(&shm, HCCL_COLL_BROADCAST, HCCL_ALGO_TREE, total, h.nlocal,
                                        chunk_bytes);

        sub_shape.coll = HCCL_COLL_BROADCAST;
        sub_shape.count = (size_t)nranks * shape->count;
        sub_shape.root = h.lead_local;
        res = chain ? hccl_algo_chain_broadcast(h.my_local, h.nlocal, &sub_shape, chunk_bytes, &sub)
                    : hccl_algo_tree_broadcast(h.my_local, h.nlocal, &sub_shape, chunk_bytes, &sub);
        HCCL_CHECK_GOTO(res, res, err);
        HCCL_CHECK_GOTO(hier_phase(&h, p, sub, h.local, recv, recv, &scratch, HIER_TAG_INTRA_DOWN),
                        res, err);
    }
    hccl_free(avail);
    return hier_finish(&h, p, scratch, bsz, total, plan_p);

err:
    hccl_free(avail);
    hier_free(&h);
    hccl_plan_release(p);
    return res;
}
