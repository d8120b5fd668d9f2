/* Topology: which ranks share a host, and which link joins each pair. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/comm.h"

int hccl_cpus_available(int *only_cpu)
{
    cpu_set_t set;
    long n;

    *only_cpu = -1;
    /* The process's affinity mask is what a cpuset or a launcher's binding leaves it. */
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        int count = CPU_COUNT(&set);
        for (int c = 0; count == 1 && c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &set))
                *only_cpu = c;
        return count;
    }
    n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Whether rank r shares a CPU with another rank of its host, as its card says. */
static bool card_cores_shared(const struct hcclComm *comm, int r)
{
    const hccl_card_t *c = &comm->cards[r];
    int local = 0, same_cpu = 0;

    for (int q = 0; q < comm->nranks; q++) {
        if (comm->node_of[q] != comm->node_of[r])
            continue;
        local++;
        same_cpu += c->pinned_cpu && comm->cards[q].pinned_cpu == c->pinned_cpu;
    }
    return c->pinned_cpu ? same_cpu > 1 : local > (int)c->cpus;
}

bool hccl_topo_cores_shared(const struct hcclComm *comm)
{
    return card_cores_shared(comm, comm->rank);
}

/* Whether a rank of host node (-1: of any host) shares a CPU, as its card says. */
static bool node_cores_shared(const struct hcclComm *comm, int node)
{
    for (int r = 0; r < comm->nranks; r++)
        if ((node < 0 || comm->node_of[r] == node) && card_cores_shared(comm, r))
            return true;
    return false;
}

bool hccl_topo_any_cores_shared(const struct hcclComm *comm)
{
    return node_cores_shared(comm, -1);
}

bool hccl_topo_host_cores_shared(const struct hcclComm *comm)
{
    return node_cores_shared(comm, comm->node_of[comm->rank]);
}

static void read_first_line(const char *path, char *out, size_t len)
{
    FILE *f = fopen(path, "r");

    out[0] = '\0';
    if (!f)
        return;
    if (fgets(out, (int)len, f))
        out[strcspn(out, "\n")] = '\0';
    fclose(f);
}

size_t hccl_topo_llc_bytes(void)
{
    size_t best = 0;

    for (int i = 0; i < 16; i++) {
        char path[96], text[32], *end;
        unsigned long long v;

        snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        read_first_line(path, text, sizeof(text));
        v = strtoull(text, &end, 10);
        if (end == text)
            continue;
        if (*end == 'K')
            v <<= 10;
        else if (*end == 'M')
            v <<= 20;
        if (v > best)
            best = (size_t)v;
    }
    return best;
}

/* Per thread: the PMIx bootstrap sets it only around the communicator it forms. */
static _Thread_local const char *launcher_host;

void hccl_topo_set_launcher_host(const char *name)
{
    launcher_host = name;
}

/*
 * Two ranks are on one host when they share the hostname (under PMIx, the launcher's node
 * name), the kernel boot and the network namespace: ranks in separate namespaces are treated
 * as separate hosts, which is how tests build several hosts on one machine.
 */
void hccl_topo_host_id(const hccl_params_t *p, char *out, size_t len)
{
    char host[64] = "", boot[40] = "", netns[40] = "";
    ssize_t n;

    if (p->host_id[0]) {
        snprintf(out, len, "%s", p->host_id);
        return;
    }
    if (launcher_host)
        snprintf(host, sizeof(host), "%s", launcher_host);
    else
        gethostname(host, sizeof(host) - 1);
    read_first_line("/proc/sys/kernel/random/boot_id", boot, sizeof(boot));
    n = readlink("/proc/self/ns/net", netns, sizeof(netns) - 1);
    netns[n > 0 ? n : 0] = '\0';
    snprintf(out, len, "%.40s/%.8s/%.28s", host, boot, netns);
}

int hccl_topo_pick_link(const hccl_card_t *me, const hccl_card_t *peer)
{
    static const int preference[] = {HCCL_LINK_SHM, HCCL_LINK_RDMA, HCCL_LINK_TCP};

    for (size_t i = 0; i < sizeof(preference) / sizeof(preference[0]); i++) {
        int id = preference[i];
        const hccl_link_ops_t *ops = hccl_link_by_id(id);
        if (ops && (me->links & (1u << id)) && (peer->links & (1u << id)) && ops->reaches(me, peer))
            return id;
    }
    return -1;
}

hccl_cost_class_t hccl_topo_cost_class(const hccl_card_t *cards, int nranks)
{
    for (int i = 0; i < nranks; i++)
        for (int j = i + 1; j < nranks; j++)
            if (hccl_topo_pick_link(&cards[i], &cards[j]) != HCCL_LINK_SHM) /* rdma: tcp costs */
                return HCCL_COST_TCP;
    return HCCL_COST_SHM;
}

static const size_t report_sizes[] = {8, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20};

/* The collectives whose pick depends on size (AlltoAllv and Barrier have one algorithm). */
static const hccl_coll_t report_colls[] = {
    HCCL_COLL_ALLREDUCE, HCCL_COLL_BROADCAST, HCCL_COLL_REDUCE, HCCL_COLL_ALLGATHER,
    HCCL_COLL_REDUCESCATTER, HCCL_COLL_ALLTOALL,
};

hccl_algo_t hccl_topo_pick(const struct hcclComm *comm, hccl_coll_t coll, size_t bytes)
{
    hccl_coll_shape_t shape = {coll, bytes, hcclUint8, hcclSum, 0, NULL};

    return hccl_tuner_pick(&comm->tuner, &shape, comm->nranks);
}

static void expand_rank(const char *pat, int rank, char *out, size_t len)
{
    size_t o = 0;

    for (const char *p = pat; *p && o + 1 < len; p++) {
        if (p[0] == '%' && p[1] == 'r') {
            int w = snprintf(out + o, len - o, "%d", rank);
            o += w > 0 && (size_t)w < len - o ? (size_t)w : 0;
            p++;
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
}

/* A JSON string: host ids come from the user (HCCL_HOST_ID) and may hold anything. */
static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

void hccl_topo_write_json(const struct hcclComm *comm, FILE *f, const hccl_topo_linkperf_t *perf, int nperf)
{
    const hccl_cost_t *m = &comm->tuner.model;
    bool first_host = true;

    fprintf(f, "{\n  \"nranks\": %d,\n  \"rank\": %d,\n  \"hosts\": [", comm->nranks, comm->rank);
    for (int r = 0; r < comm->nranks; r++) {
        bool seen = false;
        for (int q = 0; q < r && !seen; q++)
            seen = strcmp(comm->cards[q].host, comm->cards[r].host) == 0;
        if (seen)
            continue;
        fprintf(f, "%s\n    {\"host\": ", first_host ? "" : ",");
        json_str(f, comm->cards[r].host);
        fprintf(f, ", \"ranks\": [");
        for (int q = r, n = 0; q < comm->nranks; q++)
            if (strcmp(comm->cards[q].host, comm->cards[r].host) == 0)
                fprintf(f, "%s%d", n++ ? ", " : "", q);
        fprintf(f, "]}");
        first_host = false;
    }
    fprintf(f, "\n  ],\n  \"links\": {");
    for (int r = 0; r < comm->nranks; r++) {
        int id = r == comm->rank ? -1 : comm->link_of[r];
        fprintf(f, "%s\"%d\": \"%s\"", r ? ", " : "", r, id < 0 ? "self" : hccl_link_by_id(id)->name);
    }
    /* Every pair, not only ours: what each rank uses to reach each other one. */
    fprintf(f, "},\n  \"link_matrix\": [");
    for (int r = 0; r < comm->nranks; r++) {
        fprintf(f, "%s\n    [", r ? "," : "");
        for (int q = 0; q < comm->nranks; q++) {
            int id = q == r ? -1 : hccl_topo_pick_link(&comm->cards[r], &comm->cards[q]);
            fprintf(f, "%s\"%s\"", q ? ", " : "",
                    q == r ? "self" : id < 0 ? "none" : hccl_link_by_id(id)->name);
        }
        fprintf(f, "]");
    }
    fprintf(f, "\n  ],\n");
    if (nperf > 0) {
        fprintf(f, "  \"link_classes\": [");
        for (int i = 0; i < nperf; i++)
            fprintf(f, "%s\n    {\"link\": \"%s\", \"ranks\": [%d, %d], \"latency_us\": %.3f, "
                       "\"bandwidth_GBps\": %.3f}",
                    i ? "," : "", hccl_link_by_id(perf[i].link)->name, perf[i].a, perf[i].b,
                    perf[i].latency_us, perf[i].bandwidth_gbps);
        fprintf(f, "\n  ],\n");
    }
    fprintf(f, "  \"cost_model\": {\"class\": \"%s\", \"source\": \"%s\", \"alpha_us\": %.3f, "
               "\"bandwidth_GBps\": %.3f, \"reduce_GBps\": %.3f, \"cpus_shared\": %s},\n  \"chunk_bytes\": %zu,\n"
               "  \"algorithms\": {",
            comm->tuner.cls == HCCL_COST_TCP ? "tcp" : "shm",
            comm->model_measured ? "measured" : comm->params.cost_model[0] ? "HCCL_COST_MODEL" : "default",
            m->alpha_us,
            1.0 / m->beta_us_per_byte / 1000.0, 1.0 / m->gamma_us_per_byte / 1000.0,
            m->cpus_shared ? "true" : "false", comm->tuner.chunk_bytes);
    for (size_t c = 0; c < sizeof(report_colls) / sizeof(report_colls[0]); c++) {
        fprintf(f, "%s\n    \"%s\": {", c ? "," : "", hccl_coll_name(report_colls[c]));
        for (size_t s = 0; s < sizeof(report_sizes) / sizeof(report_sizes[0]); s++)
            fprintf(f, "%s\"%zu\": \"%s\"", s ? ", " : "", report_sizes[s],
                    hccl_algo_name(hccl_topo_pick(comm, report_colls[c], report_sizes[s])));
        fprintf(f, "}");
    }
    fprintf(f, "\n  }\n}\n");
}

void hccl_topo_report(const struct hcclComm *comm)
{
    char path[300];
    FILE *f;

    if (comm->rank == 0 && HCCL_LOG_ENABLED(HCCL_LOG_INFO, HCCL_SUB_ALGO)) {
        for (size_t c = 0; c < sizeof(report_colls) / sizeof(report_colls[0]); c++)
            HCCL_INFO(HCCL_SUB_ALGO, "tuner (%s model, %d ranks): %s 8 B %s, 64 KiB %s, 1 MiB %s, 64 MiB %s",
                      comm->tuner.cls == HCCL_COST_TCP ? "tcp" : "shm", comm->nranks,
                      hccl_coll_name(report_colls[c]), hccl_algo_name(hccl_topo_pick(comm, report_colls[c], 8)),
                      hccl_algo_name(hccl_topo_pick(comm, report_colls[c], 64 << 10)),
                      hccl_algo_name(hccl_topo_pick(comm, report_colls[c], 1 << 20)),
                      hccl_algo_name(hccl_topo_pick(comm, report_colls[c], 64 << 20)));
    }
    if (!comm->params.topo_dump[0])
        return;
    /* One file per rank when the path says so (%r), else rank 0 writes it. */
    if (!strstr(comm->params.topo_dump, "%r") && comm->rank != 0)
        return;
    expand_rank(comm->params.topo_dump, comm->rank, path, sizeof(path));
    f = fopen(path, "w");
    if (!f) {
        HCCL_WARN("HCCL_TOPO_DUMP: cannot write %s: %s", path, strerror(errno));
        return;
    }
    hccl_topo_write_json(comm, f, NULL, 0);
    fclose(f);
    HCCL_INFO(HCCL_SUB_INIT, "topology written to %s", path);
}
