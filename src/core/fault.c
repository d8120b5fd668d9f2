/* HCCL_FAULT: parse the test-only fault list and fire it at the exact point it names. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/comm.h"
#include "base/cause.h"
#include "core/fault.h"

/* Points of the communicator's life are matched by seq only for at=idle. */
#define FAULT_NO_SEQ UINT64_MAX

static const char *const kind_names[] = {"kill", "close", "delay"};
static const char *const point_names[] = {"step", "init", "idle", "destroy", "shrink"};

/* Monotonic milliseconds with microseconds, the clock the fault tests compare against. */
static double fault_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static bool parse_num(const char *v, long max, long *out)
{
    char *end;
    long x;

    errno = 0;
    x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < 0 || x > max)
        return false;
    *out = x;
    return true;
}

/* One "key=value" of a fault; false (with why) when it does not fit. */
static bool parse_field(hccl_fault_t *f, const char *key, const char *val, const char **why)
{
    long x;

    if (strcmp(key, "at") == 0) {
        for (size_t i = 0; i < sizeof(point_names) / sizeof(point_names[0]); i++) {
            if (strcmp(val, point_names[i]) == 0) {
                f->at = (hccl_fault_point_t)i;
                return true;
            }
        }
        *why = "at must be step, init, idle, destroy or shrink";
        return false;
    }
    if (strcmp(key, "rank") != 0 && strcmp(key, "peer") != 0 && strcmp(key, "seq") != 0 &&
        strcmp(key, "step") != 0 && strcmp(key, "ms") != 0) {
        *why = "unknown key (rank, peer, seq, step, ms, at)";
        return false;
    }
    if (!parse_num(val, strcmp(key, "seq") == 0 ? 0x7fffffffffffffffL : 0x7fffffff, &x)) {
        *why = "the value is not a non-negative integer";
        return false;
    }
    if (strcmp(key, "rank") == 0)
        f->rank = (int)x;
    else if (strcmp(key, "peer") == 0)
        f->peer = (int)x;
    else if (strcmp(key, "seq") == 0)
        f->seq = x;
    else if (strcmp(key, "step") == 0)
        f->step = x;
    else
        f->ms = (int)x;
    return true;
}

/* "kind:key=val,key=val"; false (with why) when malformed. */
static bool parse_one(char *text, hccl_fault_t *f, const char **why)
{
    char *colon = strchr(text, ':'), *save = NULL;
    size_t k;

    memset(f, 0, sizeof(*f));
    f->rank = f->peer = f->ms = -1;
    f->seq = f->step = -1;
    f->fired_seq = FAULT_NO_SEQ;
    if (!colon) {
        *why = "expected kind:key=value,...";
        return false;
    }
    *colon = '\0';
    for (k = 0; k < sizeof(kind_names) / sizeof(kind_names[0]); k++)
        if (strcmp(text, kind_names[k]) == 0)
            break;
    if (k == sizeof(kind_names) / sizeof(kind_names[0])) {
        *why = "the kind must be kill, close or delay";
        return false;
    }
    f->kind = (hccl_fault_kind_t)k;
    for (char *kv = strtok_r(colon + 1, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            *why = "expected key=value";
            return false;
        }
        *eq = '\0';
        if (!parse_field(f, kv, eq + 1, why))
            return false;
    }
    if (f->rank < 0)
        *why = "rank= is required";
    else if (f->kind == HCCL_FAULT_CLOSE && f->peer < 0)
        *why = "close needs peer=";
    else if (f->kind == HCCL_FAULT_CLOSE && f->peer == f->rank)
        *why = "close: peer is the rank itself";
    else if (f->kind == HCCL_FAULT_CLOSE && f->at != HCCL_FAULT_AT_STEP)
        *why = "close fires at a step only (connections exist only while collectives can run)";
    else if (f->kind == HCCL_FAULT_DELAY && f->ms < 0)
        *why = "delay needs ms=";
    else if (f->at != HCCL_FAULT_AT_STEP && f->at != HCCL_FAULT_AT_IDLE && (f->seq >= 0 || f->step >= 0))
        *why = "seq and step apply to steps and at=idle only";
    else if (f->at == HCCL_FAULT_AT_IDLE && f->step >= 0)
        *why = "step does not apply to at=idle";
    else
        return true;
    return false;
}

void hccl_fault_parse(const char *spec, hccl_fault_set_t *set)
{
    char *copy, *save = NULL;

    memset(set, 0, sizeof(*set));
    if (!spec || !*spec)
        return;
    copy = strdup(spec);
    if (!copy) {
        HCCL_WARN("HCCL_FAULT: out of memory; ignored");
        return;
    }
    for (char *one = strtok_r(copy, ";", &save); one; one = strtok_r(NULL, ";", &save)) {
        char text[256];
        const char *why = NULL;
        hccl_fault_t f;

        snprintf(text, sizeof(text), "%s", one);
        if (set->n == HCCL_FAULT_MAX) {
            HCCL_WARN("HCCL_FAULT: more than %d faults; '%s' and what follows ignored",
                      HCCL_FAULT_MAX, text);
            break;
        }
        if (!parse_one(one, &f, &why)) {
            HCCL_WARN("HCCL_FAULT: '%s' ignored: %s", text, why);
            continue;
        }
        set->f[set->n++] = f;
    }
    free(copy);
}

static void fault_fire(struct hcclComm *comm, hccl_fault_t *f, const char *where)
{
    f->fired = true;
    switch (f->kind) {
    case HCCL_FAULT_KILL:
        HCCL_WARN("HCCL_FAULT: rank %d kills itself %s (t=%.3f ms)", comm->rank, where, fault_now_ms());
        raise(SIGKILL);
        break;
    case HCCL_FAULT_DELAY: {
        struct timespec ts = {f->ms / 1000, (long)(f->ms % 1000) * 1000000L};
        HCCL_WARN("HCCL_FAULT: rank %d stalls %d ms %s (t=%.3f ms)", comm->rank, f->ms, where,
                  fault_now_ms());
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
        break;
    }
    case HCCL_FAULT_CLOSE: {
        int id = f->peer < comm->nranks ? comm->link_of[f->peer] : -1;
        const hccl_link_ops_t *ops = id >= 0 ? hccl_link_by_id(id) : NULL;
        if (!ops || !comm->link_ctx[id] || !HCCL_LINK_HAS_OP(ops, close)) {
            HCCL_WARN("HCCL_FAULT: rank %d has no link to rank %d that can be closed", comm->rank,
                      f->peer);
            break;
        }
        HCCL_WARN("HCCL_FAULT: rank %d closes its %s link to rank %d %s (t=%.3f ms)", comm->rank,
                  ops->name, f->peer, where, fault_now_ms());
        /* A cut cable leaves no rank knowing it cut anything: the peer sees this rank go
         * without a goodbye, and so does this rank's cause, which every rank can then agree
         * on even where the cut link was the only path between the two (2 ranks). */
        if (comm->env.on_cause) {
            hccl_cause_t c;
            hccl_cause_lost(&c, comm->rank, f->peer, comm->nranks);
            comm->env.on_cause(comm->env.fatal_arg, &c);
        }
        ops->close(comm->link_ctx[id], f->peer);
        break;
    }
    }
}

/* The executor's step hook: runs on the reactor thread before a step is issued. */
static void fault_on_step(void *arg, uint64_t seq, uint32_t step)
{
    struct hcclComm *comm = arg;
    hccl_fault_set_t *set = comm->faults;
    char where[96];

    for (int i = 0; i < set->n; i++) {
        hccl_fault_t *f = &set->f[i];
        if (f->at != HCCL_FAULT_AT_STEP || (f->seq >= 0 && (uint64_t)f->seq != seq) ||
            (f->step >= 0 && (uint64_t)f->step != step))
            continue;
        if ((f->kind == HCCL_FAULT_DELAY && f->seq < 0) ? f->fired_seq == seq : f->fired)
            continue;
        f->fired_seq = seq;
        if (seq & HCCL_P2P_SEQ_BIT)
            snprintf(where, sizeof(where), "issuing step %u of point-to-point #%llu", step,
                     (unsigned long long)(seq & ~HCCL_P2P_SEQ_BIT));
        else
            snprintf(where, sizeof(where), "issuing step %u of seq %llu", step, (unsigned long long)seq);
        fault_fire(comm, f, where);
    }
}

void hccl_fault_point(struct hcclComm *comm, hccl_fault_point_t at, uint64_t seq)
{
    hccl_fault_set_t *set = comm->faults;
    char where[96];

    if (!set)
        return;
    for (int i = 0; i < set->n; i++) {
        hccl_fault_t *f = &set->f[i];
        if (f->at != at || f->fired)
            continue;
        if (at == HCCL_FAULT_AT_IDLE &&
            (f->seq >= 0 ? seq == FAULT_NO_SEQ || (seq & HCCL_P2P_SEQ_BIT) || seq < (uint64_t)f->seq
                         : seq != FAULT_NO_SEQ))
            continue;
        if (at == HCCL_FAULT_AT_IDLE && seq != FAULT_NO_SEQ)
            snprintf(where, sizeof(where), "while idle after seq %llu", (unsigned long long)seq);
        else
            snprintf(where, sizeof(where), "at %s", at == HCCL_FAULT_AT_IDLE ? "idle after init"
                                                   : point_names[at]);
        fault_fire(comm, f, where);
    }
}

void hccl_fault_attach(struct hcclComm *comm)
{
    hccl_fault_set_t set;
    int mine = 0;

    hccl_fault_parse(getenv("HCCL_FAULT"), &set);
    for (int i = 0; i < set.n; i++) {
        if (set.f[i].rank == comm->rank)
            set.f[mine++] = set.f[i];
        else if (set.f[i].rank >= comm->nranks)
            HCCL_WARN("HCCL_FAULT: rank %d is not in a communicator of %d ranks; ignored",
                      set.f[i].rank, comm->nranks);
    }
    set.n = mine;
    if (mine == 0)
        return;
    comm->faults = hccl_malloc(sizeof(*comm->faults));
    if (!comm->faults) {
        HCCL_WARN("HCCL_FAULT: out of memory; ignored");
        return;
    }
    *comm->faults = set;
    HCCL_WARN("HCCL_FAULT: rank %d has %d fault(s) armed (test-only)", comm->rank, mine);
}

void hccl_fault_enable_steps(struct hcclComm *comm)
{
    for (int i = 0; comm->faults && i < comm->faults->n; i++) {
        if (comm->faults->f[i].at == HCCL_FAULT_AT_STEP) {
            hccl_exec_set_step_hook(comm->exec, fault_on_step, comm);
            /* A lane operation's one step is its publication (step 0). */
            if (comm->lane)
                hccl_lane_set_step_hook(comm->lane, fault_on_step, comm);
            return;
        }
    }
}

void hccl_fault_detach(struct hcclComm *comm)
{
    hccl_free(comm->faults);
    comm->faults = NULL;
}
