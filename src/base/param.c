/* The HCCL_* parameters: one table, read once per communicator; config beats env beats default. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"

extern char **environ;

/*
 * Every variable the library (and hccl-run) knows, so that a misspelt one gets a warning: its
 * default as docs/env.md shows it ("none": unset and unused, "auto": worked out at start) and
 * one line of doc. tests/docs/check_env_doc.c holds docs/env.md to this table and these
 * defaults to what hccl_params_load does.
 */
static const hccl_param_info_t params[] = {
    {"HCCL_DEBUG", "WARN", "log level: NONE, WARN, INFO or TRACE"},
    {"HCCL_DEBUG_SUBSYS", "ALL", "INFO/TRACE subsystems: INIT, LINK, SCHED, ALGO, REACTOR, ALL"},
    {"HCCL_DEBUG_FILE", "stderr", "log file; %h host, %p pid, %r rank"},
    {"HCCL_COMM_ID", "none", "rendezvous host:port for hcclCommInitGroup/InitFromEnv"},
    {"HCCL_COMM_SECRET", "none", "hex secret guarding the hcclCommInitGroup rendezvous"},
    {"HCCL_CONNECT_TIMEOUT", "120", "seconds for the rendezvous and link set-up"},
    {"HCCL_EXEC_TIMEOUT", "0", "seconds a request may take; 0: no limit"},
    {"HCCL_ALGO", "auto", "algorithm, or per collective: allreduce=ring;broadcast=tree"},
    {"HCCL_BUFFSIZE", "4194304",
     "bytes of shm ring per peer (at least 4096, whole pages); also the most data a peer may "
     "leave held for receives not posted yet"},
    {"HCCL_LINKS", "all", "link kinds allowed: shm, tcp, rdma"},
    {"HCCL_SOCKET_IFNAME", "auto", "interface or prefix for tcp; =name: exact"},
    {"HCCL_NSOCKS", "1", "tcp sockets per peer (only 1 is supported)"},
    {"HCCL_TOPO_DUMP", "none", "file for the topology and the tuner's picks as JSON; %r rank"},
    {"HCCL_RANK_TABLE", "none", "not supported by this version: warns"},
    {"HCCL_CHECK", "0", "1: compare every collective's signature across ranks first"},
    {"HCCL_DUMP_ON_SIGNAL", "0", "1: SIGUSR1 logs the state of every communicator"},
    {"HCCL_FAULT", "none", "test-only fault injection (kill, close, delay)"},
    {"HCCL_HOST_ID", "auto", "host identity override"},
    {"HCCL_CMA_THRESHOLD", "65536", "shm messages from this many bytes are offered single-copy"},
    {"HCCL_RUN_GRACE_S", "3", "hccl-run: seconds the other ranks get after one fails"},
    {"HCCL_REDUCE_ISA", "auto", "fp16/bf16 reduction kernels: auto or portable"},
    {"HCCL_RECV_REDUCE", "1", "1: reduce a received chunk as it arrives"},
    {"HCCL_SHM_PULL_MAX", "1048576", "offered shm messages up to this may go through the ring"},
    {"HCCL_LANE_MAX", "auto", "one-host collectives with blocks up to this take the shm lane"},
    {"HCCL_COST_MODEL", "auto", "tuner constants alpha_us,GB/s,reduce_GB/s"},
    {"HCCL_SPIN_US", "50", "microseconds to poll without progress before sleeping"},
    {"HCCL_CALIBRATE", "1", "1: time the links at start to set the tuner's constants"},
    {"HCCL_TCP_OFFER_MIN", "262144", "tcp messages from this many bytes wait for the receiver"},
    {"HCCL_IB_HCA", "all", "rdma devices and ports to use, NCCL syntax"},
    {"HCCL_IB_GID_INDEX", "auto", "rdma GID index"},
    {"HCCL_STORE_MIN", "auto", "buffers over this many bytes get streaming stores; 0: never"},
};

size_t hccl_param_count(void)
{
    return sizeof(params) / sizeof(params[0]);
}

const hccl_param_info_t *hccl_param_at(size_t i)
{
    return i < hccl_param_count() ? &params[i] : NULL;
}

/* Names of the API that this version does not act on yet: setting one warns instead of
 * silently doing nothing. */
static const char *const unsupported_vars[] = {
    "HCCL_RANK_TABLE",
};

#define HCCL_DEFAULT_CONNECT_TIMEOUT_S 120
#define HCCL_DEFAULT_BUFFSIZE (4u << 20)
#define HCCL_DEFAULT_CMA_THRESHOLD (64u << 10)
/* Up to here an offered message whose receive is posted may go through the ring instead of a
 * single-copy read; the receiver times both and takes the faster (see hccl_framer_t.pull_max). */
#define HCCL_DEFAULT_SHM_PULL_MAX (1u << 20)
/* From here a tcp message waits for its receiver to ask for it: a sender that runs ahead
 * would otherwise have it copied into the heap and again into place (a Broadcast's root). */
#define HCCL_DEFAULT_TCP_OFFER_MIN (256u << 10)
/* AllReduces up to HCCL_LANE_MAX take the shm lane (sched/lane.h); -1: the communicator's choice. */
#define HCCL_DEFAULT_LANE_MAX (-1)
/* Polling first for about twice what a sleep and wake-up through an fd costs
 * (docs/performance.md) bounds the loss to a factor of two whatever the gap. */
#define HCCL_DEFAULT_SPIN_US 50

int64_t hccl_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t hccl_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void hccl_abs_deadline(struct timespec *ts, int64_t ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += (time_t)(ms / 1000);
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Number of single-character edits between a and b (for the closest known name). */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    size_t row[64];

    if (lb >= sizeof(row) / sizeof(row[0]))
        return SIZE_MAX;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (row[j] + 1 < best)
                best = row[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static void warn_unknown_vars(void)
{
    for (char **e = environ; e && *e; e++) {
        char name[128];
        const char *eq = strchr(*e, '=');
        size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
        bool known = false;
        const char *closest = NULL;
        size_t best = SIZE_MAX;

        if (strncmp(*e, "HCCL_", 5) != 0 || n >= sizeof(name))
            continue;
        memcpy(name, *e, n);
        name[n] = '\0';
        for (size_t i = 0; i < hccl_param_count(); i++) {
            size_t d = edit_distance(name, params[i].name);
            if (d == 0)
                known = true;
            if (d < best) {
                best = d;
                closest = params[i].name;
            }
        }
        if (!known)
            HCCL_WARN("unknown environment variable %s ignored (did you mean %s?)", name, closest);
        for (size_t i = 0; i < sizeof(unsupported_vars) / sizeof(unsupported_vars[0]); i++)
            if (strcmp(name, unsupported_vars[i]) == 0)
                HCCL_WARN("%s is not supported by this version of hccl; ignored", name);
    }
}

long hccl_param_env_long(const char *name, long def)
{
    const char *v = getenv(name);
    char *end;
    long x;

    if (!v || !*v)
        return def;
    errno = 0;
    x = strtol(v, &end, 10);
    if (errno != 0 || *end != '\0' || x < 0) {
        HCCL_WARN("%s=%s is not a non-negative integer; using %ld", name, v, def);
        return def;
    }
    return x;
}

static void env_string(const char *name, char *dst, size_t len)
{
    const char *v = getenv(name);

    if (!v)
        return;
    if (strlen(v) >= len) {
        HCCL_WARN("%s is longer than %zu characters; ignored", name, len - 1);
        return;
    }
    snprintf(dst, len, "%s", v);
}

static pthread_once_t env_once = PTHREAD_ONCE_INIT;

hcclResult_t hccl_params_load(hccl_params_t *p, const hcclConfig_t *config)
{
    long s;

    hccl_log_init();
    pthread_once(&env_once, warn_unknown_vars);
    memset(p, 0, sizeof(*p));
    s = hccl_param_env_long("HCCL_CONNECT_TIMEOUT", HCCL_DEFAULT_CONNECT_TIMEOUT_S);
    p->connect_timeout_ms = s > INT_MAX / 1000 ? INT_MAX : (int)(s * 1000);
    s = hccl_param_env_long("HCCL_EXEC_TIMEOUT", 0);
    p->exec_timeout_ms = s > INT_MAX / 1000 ? INT_MAX : (int)(s * 1000);
    p->buffsize = (size_t)hccl_param_env_long("HCCL_BUFFSIZE", HCCL_DEFAULT_BUFFSIZE);
    if (p->buffsize < 4096) {
        HCCL_WARN("HCCL_BUFFSIZE=%zu is below 4096 bytes; using 4096", p->buffsize);
        p->buffsize = 4096;
    }
    /* Whole pages: the shm rings that follow each other in a segment stay aligned. */
    p->buffsize = (p->buffsize + 4095) & ~(size_t)4095;
    p->nsocks = (int)hccl_param_env_long("HCCL_NSOCKS", 1);
    if (p->nsocks != 1) {
        HCCL_WARN("HCCL_NSOCKS=%d: this version uses one socket per peer", p->nsocks);
        p->nsocks = 1;
    }
    p->check = hccl_param_env_long("HCCL_CHECK", 0) != 0;
    p->calibrate = hccl_param_env_long("HCCL_CALIBRATE", 1) != 0;
    p->spin_us = (int)hccl_param_env_long("HCCL_SPIN_US", HCCL_DEFAULT_SPIN_US);
    p->dump_on_signal = hccl_param_env_long("HCCL_DUMP_ON_SIGNAL", 0) != 0;
    p->cma_threshold = (size_t)hccl_param_env_long("HCCL_CMA_THRESHOLD", HCCL_DEFAULT_CMA_THRESHOLD);
    p->recv_reduce = hccl_param_env_long("HCCL_RECV_REDUCE", 1) != 0;
    p->shm_pull_max = (size_t)hccl_param_env_long("HCCL_SHM_PULL_MAX", HCCL_DEFAULT_SHM_PULL_MAX);
    p->tcp_offer_min = (size_t)hccl_param_env_long("HCCL_TCP_OFFER_MIN", HCCL_DEFAULT_TCP_OFFER_MIN);
    if (p->tcp_offer_min == 0)
        p->tcp_offer_min = SIZE_MAX; /* 0: every message is sent at once */
    /* unset: from the cache size (comm.c); 0: never */
    p->store_min = getenv("HCCL_STORE_MIN") ? (size_t)hccl_param_env_long("HCCL_STORE_MIN", 0) : SIZE_MAX;
    p->lane_max = getenv("HCCL_LANE_MAX") ? (size_t)hccl_param_env_long("HCCL_LANE_MAX", 0)
                                          : (size_t)HCCL_DEFAULT_LANE_MAX;
    /* HCCL_FAULT aims at plan steps: with faults to inject, collectives take plans unless the
     * lane is asked for by name. */
    if (getenv("HCCL_FAULT") && getenv("HCCL_FAULT")[0] && !getenv("HCCL_LANE_MAX"))
        p->lane_max = 0;
    env_string("HCCL_ALGO", p->algo, sizeof(p->algo));
    env_string("HCCL_LINKS", p->links, sizeof(p->links));
    env_string("HCCL_SOCKET_IFNAME", p->ifname, sizeof(p->ifname));
    env_string("HCCL_HOST_ID", p->host_id, sizeof(p->host_id));
    env_string("HCCL_COST_MODEL", p->cost_model, sizeof(p->cost_model));
    env_string("HCCL_TOPO_DUMP", p->topo_dump, sizeof(p->topo_dump));

    if (config) {
        if (config->size < sizeof(size_t) || config->size > (1u << 16))
            return HCCL_FAIL(hcclInvalidUsage,
                             "hcclConfig_t.size is %zu: initialise it with HCCL_CONFIG_INITIALIZER",
                             config->size);
        if (config->size >= offsetof(hcclConfig_t, connectTimeoutMs) + sizeof(int) &&
            config->connectTimeoutMs >= 0)
            p->connect_timeout_ms = config->connectTimeoutMs;
        if (config->size >= offsetof(hcclConfig_t, execTimeoutMs) + sizeof(int) &&
            config->execTimeoutMs >= 0)
            p->exec_timeout_ms = config->execTimeoutMs;
        if (config->size >= offsetof(hcclConfig_t, algo) + sizeof(char *) && config->algo) {
            if (strlen(config->algo) >= sizeof(p->algo))
                return HCCL_FAIL(hcclInvalidArgument, "hcclConfig_t.algo is too long");
            snprintf(p->algo, sizeof(p->algo), "%s", config->algo);
        }
    }
    HCCL_INFO(HCCL_SUB_INIT,
              "params: connect timeout %d ms, exec timeout %d ms, algo '%s', buffsize %zu B, "
              "links '%s', ifname '%s', cma threshold %zu B, shm pull max %zu B, tcp offer min %zd B, "
              "recv reduce %d, lane max %zd B, store min %zd B",
              p->connect_timeout_ms, p->exec_timeout_ms, p->algo, p->buffsize, p->links, p->ifname,
              p->cma_threshold, p->shm_pull_max, (ssize_t)p->tcp_offer_min, (int)p->recv_reduce,
              (ssize_t)p->lane_max, (ssize_t)p->store_min);
    return hcclSuccess;
}
