/* The first tuner: latency-bound sizes get recursive doubling, the rest the pipelined ring. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "algos/algos.h"

static const char *const coll_names[HCCL_NUM_COLLS] = {
    "allreduce", "broadcast", "reduce", "allgather", "reducescatter", "alltoall", "alltoallv",
    "barrier",
};
static const char *const algo_names[HCCL_NUM_ALGOS] = {
    "auto", "ring", "recdbl", "tree", "chain", "scatter_allgather", "bruck", "rechalv",
    "pairwise", "dissemination",
};

const char *hccl_coll_name(hccl_coll_t coll)
{
    return (unsigned)coll < HCCL_NUM_COLLS ? coll_names[coll] : "unknown";
}

const char *hccl_algo_name(hccl_algo_t algo)
{
    return (unsigned)algo < HCCL_NUM_ALGOS ? algo_names[algo] : "unknown";
}

static hccl_algo_t algo_parse(const char *s)
{
    for (int a = 0; a < HCCL_NUM_ALGOS; a++)
        if (strcasecmp(s, algo_names[a]) == 0)
            return (hccl_algo_t)a;
    if (strcasecmp(s, "recursive_doubling") == 0 || strcasecmp(s, "rd") == 0)
        return HCCL_ALGO_RECDBL;
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
    t->small_bytes = 64 << 10;
    t->chunk_bytes = buffsize / 8 >= 4096 ? buffsize / 8 : 4096;
    if (!spec || !*spec)
        return;
    snprintf(buf, sizeof(buf), "%s", spec);
    for (char *tok = strtok_r(buf, ";,", &save); tok; tok = strtok_r(NULL, ";,", &save)) {
        char *eq = strchr(tok, '=');
        const char *aname = eq ? eq + 1 : tok;
        char name[64];
        hccl_algo_t a;
        int coll = -1;

        snprintf(name, sizeof(name), "%s", aname);
        trim(name);
        a = algo_parse(name);
        if (eq) {
            *eq = '\0';
            trim(tok);
            for (int c = 0; c < HCCL_NUM_COLLS; c++)
                if (strcasecmp(tok, coll_names[c]) == 0)
                    coll = c;
            if (coll < 0) {
                HCCL_WARN("HCCL_ALGO: unknown collective '%s' ignored (known: allreduce)", tok);
                continue;
            }
        }
        if (a == HCCL_NUM_ALGOS) {
            HCCL_WARN("HCCL_ALGO: unknown algorithm '%s' ignored (known: ring, recdbl)", name);
            continue;
        }
        for (int c = 0; c < HCCL_NUM_COLLS; c++)
            if (coll < 0 || coll == c)
                t->forced[c] = a;
    }
}

hccl_algo_t hccl_tuner_pick(const hccl_tuner_t *t, const hccl_coll_shape_t *shape, int nranks)
{
    size_t bytes = shape->count * hccl_dtype_size(shape->dtype);

    (void)nranks;
    if (t->forced[shape->coll] != HCCL_ALGO_AUTO)
        return t->forced[shape->coll];
    return bytes <= t->small_bytes ? HCCL_ALGO_RECDBL : HCCL_ALGO_RING;
}

hcclResult_t hccl_algo_build(const hccl_tuner_t *t, hccl_algo_t algo, int rank, int nranks,
                             const hccl_coll_shape_t *shape, hccl_plan_t **plan_p)
{
    switch (algo) {
    case HCCL_ALGO_RING:
        return hccl_algo_ring_allreduce(rank, nranks, shape, t->chunk_bytes, plan_p);
    case HCCL_ALGO_RECDBL:
        return hccl_algo_recdbl_allreduce(rank, nranks, shape, plan_p);
    default:
        return HCCL_FAIL(hcclInternalError, "no generator for algorithm %d", (int)algo);
    }
}
