/*
 * The tuner: which generator builds each collective, by size and rank count,
 * unless HCCL_ALGO (or hcclConfig_t.algo) forces one.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "algos/algos.h"

static const char *const algo_names[HCCL_NUM_ALGOS] = {
    "auto", "ring", "recdbl", "tree", "chain", "scatter_allgather", "bruck", "rechalv",
    "pairwise", "dissemination", "hier", "rabenseifner", "lane",
};

/* The algorithms each collective has, as a bit set over hccl_algo_t. */
#define A(x) (1u << HCCL_ALGO_##x)
static const unsigned coll_algos[HCCL_NUM_COLLS] = {
    [HCCL_COLL_ALLREDUCE] = A(RING) | A(RECDBL) | A(RABENSEIFNER) | A(TREE) | A(HIER) | A(LANE),
    [HCCL_COLL_BROADCAST] = A(TREE) | A(CHAIN) | A(SCATTER_ALLGATHER) | A(HIER) | A(LANE),
    [HCCL_COLL_REDUCE] = A(TREE) | A(CHAIN) | A(LANE),
    [HCCL_COLL_ALLGATHER] = A(RING) | A(RECDBL) | A(BRUCK) | A(HIER) | A(LANE),
    [HCCL_COLL_REDUCESCATTER] = A(RING) | A(RECHALV) | A(LANE),
    [HCCL_COLL_ALLTOALL] = A(PAIRWISE) | A(BRUCK) | A(LANE),
    [HCCL_COLL_ALLTOALLV] = A(PAIRWISE),
    [HCCL_COLL_BARRIER] = A(DISSEMINATION) | A(LANE),
};
#undef A

const char *hccl_algo_name(hccl_algo_t algo)
{
    return (unsigned)algo < HCCL_NUM_ALGOS ? algo_names[algo] : "unknown";
}

bool hccl_algo_applies(hccl_coll_t coll, hccl_algo_t algo)
{
    return (unsigned)coll < HCCL_NUM_COLLS && (unsigned)algo < HCCL_NUM_ALGOS &&
           (coll_algos[coll] & (1u << algo));
}

static hccl_algo_t algo_parse(const char *s)
{
    for (int a = 0; a < HCCL_NUM_ALGOS; a++)
        if (strcasecmp(s, algo_names[a]) == 0)
            return (hccl_algo_t)a;
    if (strcasecmp(s, "recursive_doubling") == 0 || strcasecmp(s, "rd") == 0)
        return HCCL_ALGO_RECDBL;
    if (strcasecmp(s, "vandegeijn") == 0 || strcasecmp(s, "scatter_ring") == 0)
        return HCCL_ALGO_SCATTER_ALLGATHER;
    return HCCL_NUM_ALGOS;
}

static void trim(char *s)
{
    size_t n = strlen(s);
    char *b = s;

    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
    while (*b == ' ' || *b == '\t')
        b++;
    memmove(s, b, strlen(b) + 1);
}

void hccl_tuner_init(hccl_tuner_t *t, const char *spec, size_t buffsize)
{
    char buf[HCCL_ALGO_STRLEN];
    char *save = NULL;

    memset(t, 0, sizeof(*t));
    t->model = hccl_cost_default(HCCL_COST_SHM);
    t->chunk_bytes = buffsize / 8 >= 4096 ? buffsize / 8 : 4096;
    if (!spec || !*spec)
        return;
    snprintf(buf, sizeof(buf), "%s", spec);
    for (char *tok = strtok_r(buf, ";,", &save); tok; tok = strtok_r(NULL, ";,", &save)) {
        char *eq = strchr(tok, '=');
        char name[64];
        hccl_algo_t a;
        int coll = -1;

        snprintf(name, sizeof(name), "%s", eq ? eq + 1 : tok);
        trim(name);
        a = algo_parse(name);
        if (eq) {
            *eq = '\0';
            trim(tok);
            for (int c = 0; c < HCCL_NUM_COLLS; c++)
                if (strcasecmp(tok, hccl_coll_name((hccl_coll_t)c)) == 0)
                    coll = c;
            if (coll < 0 || !coll_algos[coll]) {
                HCCL_WARN("HCCL_ALGO: unknown collective '%s' ignored", tok);
                continue;
            }
        }
        if (a == HCCL_NUM_ALGOS || a == HCCL_ALGO_AUTO) {
            HCCL_WARN("HCCL_ALGO: unknown algorithm '%s' ignored", name);
            continue;
        }
        if (coll >= 0 && !hccl_algo_applies((hccl_coll_t)coll, a)) {
            HCCL_WARN("HCCL_ALGO: %s has no algorithm '%s'; ignored", hccl_coll_name((hccl_coll_t)coll), name);
            continue;
        }
        /* A bare name applies to every collective that has such an algorithm. */
        for (int c = 0; c < HCCL_NUM_COLLS; c++)
            if ((coll < 0 || coll == c) && hccl_algo_applies((hccl_coll_t)c, a))
                t->forced[c] = a;
    }
}

void hccl_tuner_set_model(hccl_tuner_t *t, hccl_cost_class_t cls, const char *spec)
{
    double alpha, bw, redbw;

    t->cls = cls;
    t->model = hccl_cost_default(cls);
    if (!spec || !*spec)
        return;
    if (sscanf(spec, "%lf,%lf,%lf", &alpha, &bw, &redbw) != 3 || alpha < 0 || bw <= 0 || redbw <= 0) {
        HCCL_WARN("HCCL_COST_MODEL=%s is not 'alpha_us,GB/s,reduce_GB/s'; using the defaults", spec);
        return;
    }
    t->model.alpha_us = alpha;
    t->model.beta_us_per_byte = 1.0 / (bw * 1000.0);
    t->model.gamma_us_per_byte = 1.0 / (redbw * 1000.0);
}

void hccl_tuner_set_topology(hccl_tuner_t *t, const int *node_of, int nranks)
{
    int nodes = 0, smallest = nranks;

    t->node_of = node_of;
    t->multi_level = false;
    if (!node_of)
        return;
    for (int r = 0; r < nranks; r++) {
        bool first = true;
        int size = 0;
        for (int q = 0; q < r && first; q++)
            first = node_of[q] != node_of[r];
        if (!first)
            continue;
        nodes++;
        for (int q = r; q < nranks; q++)
            size += node_of[q] == node_of[r];
        smallest = size < smallest ? size : smallest;
    }
    t->multi_level = nodes > 1 && smallest > 1;
}

/* By the lane's own limits, or up to its reach where it is named. */
bool hccl_tuner_picks_lane(const hccl_tuner_t *t, const hccl_coll_shape_t *shape, int nranks)
{
    size_t bytes;

    if (!t->lane || !hccl_algo_applies(shape->coll, HCCL_ALGO_LANE))
        return false;
    bytes = hccl_lane_call_bytes(shape->coll, shape->count, shape->dtype, nranks);
    if (t->forced[shape->coll] == HCCL_ALGO_LANE)
        return (bytes <= hccl_lane_reach(t->lane) || hccl_lane_in_pieces(t->lane, shape->coll)) &&
               (bytes > 0 || shape->coll == HCCL_COLL_BARRIER);
    return t->forced[shape->coll] == HCCL_ALGO_AUTO && hccl_lane_takes(t->lane, shape->coll, bytes);
}

/* The lane where it takes the call; else the plan's algorithm. */
hccl_algo_t hccl_tuner_pick(const hccl_tuner_t *t, const hccl_coll_shape_t *shape, int nranks)
{
    if ((unsigned)shape->coll < HCCL_NUM_COLLS && hccl_tuner_picks_lane(t, shape, nranks))
        return HCCL_ALGO_LANE;
    return hccl_tuner_pick_plan(t, shape, nranks);
}

/* The forced plan algorithm, or the cheapest under the model (ties go to the earlier one). A
 * forced lane is as AUTO here. */
hccl_algo_t hccl_tuner_pick_plan(const hccl_tuner_t *t, const hccl_coll_shape_t *shape, int nranks)
{
    size_t bytes = shape->count * hccl_dtype_size(shape->dtype);
    hccl_algo_t best = HCCL_ALGO_AUTO;
    double best_cost = INFINITY;

    if ((unsigned)shape->coll >= HCCL_NUM_COLLS)
        return HCCL_ALGO_AUTO;
    if (t->forced[shape->coll] != HCCL_ALGO_AUTO && t->forced[shape->coll] != HCCL_ALGO_LANE)
        return t->forced[shape->coll];
    /* Several hosts with several ranks each: only the leaders' traffic should cross the network. */
    if (t->multi_level && hccl_algo_applies(shape->coll, HCCL_ALGO_HIER))
        return HCCL_ALGO_HIER;
    for (int a = 1; a < HCCL_NUM_ALGOS; a++) {
        double cost;
        if (a == HCCL_ALGO_HIER || a == HCCL_ALGO_LANE ||
            !hccl_algo_applies(shape->coll, (hccl_algo_t)a))
            continue;
        cost = hccl_cost_estimate(&t->model, shape->coll, (hccl_algo_t)a, bytes, nranks, t->chunk_bytes);
        if (best == HCCL_ALGO_AUTO || cost < best_cost) {
            best = (hccl_algo_t)a;
            best_cost = cost;
        }
    }
    return best;
}

hcclResult_t hccl_algo_build(const hccl_tuner_t *t, hccl_algo_t algo, int rank, int nranks,
                             const hccl_coll_shape_t *shape, hccl_plan_t **plan_p)
{
    size_t chunk = t->chunk_bytes;

    if (shape->coll == HCCL_COLL_SEND || shape->coll == HCCL_COLL_RECV)
        return hccl_algo_p2p(rank, nranks, shape, plan_p);
    if (algo == HCCL_ALGO_LANE)
        return HCCL_FAIL(hcclInternalError, "the lane runs %s without a plan",
                         hccl_coll_name(shape->coll));
    if (!hccl_algo_applies(shape->coll, algo))
        return HCCL_FAIL(hcclInternalError, "no %s generator for %s", hccl_algo_name(algo),
                         hccl_coll_name(shape->coll));
    if (algo == HCCL_ALGO_HIER && !t->node_of)
        return HCCL_FAIL(hcclInvalidUsage, "the hier algorithm needs ranks on several hosts");
    if (algo == HCCL_ALGO_HIER && shape->coll == HCCL_COLL_ALLREDUCE)
        return hccl_algo_hier_allreduce(rank, nranks, shape, t->node_of, chunk, plan_p);
    if (algo == HCCL_ALGO_HIER && shape->coll == HCCL_COLL_ALLGATHER)
        return hccl_algo_hier_allgather(rank, nranks, shape, t->node_of, chunk, plan_p);
    if (algo == HCCL_ALGO_HIER)
        return hccl_algo_hier_broadcast(rank, nranks, shape, t->node_of, chunk, plan_p);
    switch (shape->coll) {
    case HCCL_COLL_ALLREDUCE:
        if (algo == HCCL_ALGO_RING)
            return hccl_algo_ring_allreduce(rank, nranks, shape, chunk, plan_p);
        if (algo == HCCL_ALGO_RABENSEIFNER)
            return hccl_algo_rabenseifner_allreduce(rank, nranks, shape, chunk, plan_p);
        if (algo == HCCL_ALGO_TREE)
            return hccl_algo_tree_allreduce(rank, nranks, shape, chunk, plan_p);
        return hccl_algo_recdbl_allreduce(rank, nranks, shape, plan_p);
    case HCCL_COLL_BROADCAST:
        if (algo == HCCL_ALGO_TREE)
            return hccl_algo_tree_broadcast(rank, nranks, shape, chunk, plan_p);
        if (algo == HCCL_ALGO_CHAIN)
            return hccl_algo_chain_broadcast(rank, nranks, shape, chunk, plan_p);
        return hccl_algo_scatter_allgather_broadcast(rank, nranks, shape, chunk, plan_p);
    case HCCL_COLL_REDUCE:
        return algo == HCCL_ALGO_TREE ? hccl_algo_tree_reduce(rank, nranks, shape, chunk, plan_p)
                                      : hccl_algo_chain_reduce(rank, nranks, shape, chunk, plan_p);
    case HCCL_COLL_ALLGATHER:
        if (algo == HCCL_ALGO_RING)
            return hccl_algo_ring_allgather(rank, nranks, shape, chunk, plan_p);
        if (algo == HCCL_ALGO_RECDBL)
            return hccl_algo_recdbl_allgather(rank, nranks, shape, chunk, plan_p);
        return hccl_algo_bruck_allgather(rank, nranks, shape, chunk, plan_p);
    case HCCL_COLL_REDUCESCATTER:
        return algo == HCCL_ALGO_RING
                   ? hccl_algo_ring_reducescatter(rank, nranks, shape, chunk, plan_p)
                   : hccl_algo_rechalv_reducescatter(rank, nranks, shape, chunk, plan_p);
    case HCCL_COLL_ALLTOALL:
        return algo == HCCL_ALGO_PAIRWISE
                   ? hccl_algo_pairwise_alltoall(rank, nranks, shape, chunk, plan_p)
                   : hccl_algo_bruck_alltoall(rank, nranks, shape, chunk, plan_p);
    case HCCL_COLL_ALLTOALLV: return hccl_algo_pairwise_alltoallv(rank, nranks, shape, chunk, plan_p);
    case HCCL_COLL_BARRIER: return hccl_algo_dissemination_barrier(rank, nranks, shape, chunk, plan_p);
    default: return HCCL_FAIL(hcclInternalError, "no generator for collective %d", (int)shape->coll);
    }
}
