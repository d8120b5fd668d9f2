/* Communicators' creation: bootstrap, links, the lane, and the init phases in order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/comm_impl.h"
#include "core/fault.h"
#include "base/quarantine.h"
#include "core/wire.h"

#define HCCL_PLAN_CACHE_SIZE 64

static hcclResult_t comm_open_links(struct hcclComm *comm, hccl_card_t *card)
{
    for (int id = 0; id < HCCL_LINK_MAX; id++) {
        const hccl_link_ops_t *ops = hccl_link_by_id(id);
        if (!ops || !hccl_link_allowed(comm->params.links, ops->name))
            continue;
        if (ops->init(&comm->env, card->blob[id], &comm->link_ctx[id]) != hcclSuccess) {
            HCCL_WARN("rank %d: link %s is unavailable: %s", comm->rank, ops->name,
                      hccl_error_last());
            comm->link_ctx[id] = NULL;
            continue;
        }
        card->links |= 1u << id;
    }
    if (card->links == 0 && comm->nranks > 1)
        return HCCL_FAIL(hcclInvalidUsage, "rank %d: no link is available (HCCL_LINKS=%s)",
                         comm->rank, comm->params.links[0] ? comm->params.links : "(all)");
    return hcclSuccess;
}

static hcclResult_t comm_connect_links(struct hcclComm *comm, int64_t deadline_ms)
{
    int *peers = hccl_malloc((size_t)comm->nranks * sizeof(*peers));
    int count[HCCL_LINK_MAX] = {0};
    hcclResult_t res = hcclSuccess;

    if (!peers)
        return HCCL_FAIL(hcclSystemError, "comm: out of memory");
    for (int r = 0; r < comm->nranks; r++) {
        comm->link_of[r] =
            r == comm->rank ? -1 : hccl_topo_pick_link(&comm->cards[comm->rank], &comm->cards[r]);
        if (r != comm->rank && comm->link_of[r] < 0) {
            res = HCCL_FAIL(hcclInvalidUsage,
                            "rank %d: no common link with rank %d (host %s vs %s; "
                            "check HCCL_LINKS)",
                            comm->rank, r, comm->cards[comm->rank].host, comm->cards[r].host);
            goto out;
        }
        if (r != comm->rank)
            count[comm->link_of[r]]++;
    }
    for (int id = 0; id < HCCL_LINK_MAX && res == hcclSuccess; id++) {
        int n = 0;
        if (!count[id])
            continue;
        for (int r = 0; r < comm->nranks; r++)
            if (comm->link_of[r] == id)
                peers[n++] = r;
        res = hccl_link_by_id(id)->connect(comm->link_ctx[id], peers, n, deadline_ms, comm->conns);
        if (res == hcclSuccess)
            HCCL_INFO(HCCL_SUB_INIT | HCCL_SUB_LINK, "rank %d: %s to %d peers", comm->rank,
                      hccl_link_by_id(id)->name, n);
    }
out:
    hccl_free(peers);
    return res;
}

/*
 * An AlltoAll block copied through a lane slot crosses memory twice, where one read from the
 * sender's buffer (single-copy, a syscall that pins pages) crosses it once. The copy wins while
 * the ranks' buffers and slots (about four times the block each) stay in a last-level cache of
 * 32 MiB (what LANE_DIRECT_SPAN assumes), beyond it the read; where copies between the cores
 * are slow, the read wins at smaller sizes too, which rank 0 finds by timing both
 * (direct_choice_min). AllGather and Broadcast, whose copy crosses memory n + 1 times against
 * the read's n - 1, are still slower with the read where copies between the cores are fast
 * (docs/performance.md).
 */
#define LANE_DIRECT_SPAN (8u << 20) /* the blocks of every rank together */
/* A reduction's block copied into its slot costs its owner a pass over it that single-copy
 * reads save (each rank reads its share of every block); the copy still wins while the
 * buffers stay in the cache, the reads once the ranks' blocks together pass 32 MiB
 * (docs/performance.md). */
#define LANE_REDUCE_DIRECT_SPAN (32u << 20)

/*
 * Where ranks share CPUs, an AllReduce above the lane's block runs faster as lane rounds of
 * one block each than as a plan once the ranks' buffers together pass about 128 MiB: the
 * plan's passes then miss the cache, where a round's stay in it (docs/performance.md).
 */
#define LANE_PIECES_SPAN ((size_t)128 << 20)

static size_t lane_direct_min(const struct hcclComm *comm, size_t span)
{
    size_t fits = span / (size_t)comm->nranks;

    return fits > comm->params.cma_threshold ? fits : comm->params.cma_threshold;
}

/*
 * The lane's CPU groups: where every rank is pinned to one CPU, the ranks of each CPU, CPUs in
 * ascending order (the same on every rank: from the cards). *group_of stays NULL otherwise.
 * Where the cores share a cache only at times, a split AllReduce is bound by what crosses
 * between the CPUs in the minutes when they do not, and grouping sends one partial sum per
 * CPU across instead of every rank's block (docs/performance.md).
 */
static hcclResult_t lane_cpu_groups(const struct hcclComm *comm, int **group_of)
{
    int n = comm->nranks, groups = 0;
    int *g;

    for (int r = 0; r < n; r++)
        if (comm->cards[r].pinned_cpu == 0)
            return hcclSuccess;
    g = hccl_calloc((size_t)n, sizeof(int));
    if (!g)
        return HCCL_FAIL(hcclSystemError, "lane: out of memory for %d ranks", n);
    for (int r = 0; r < n; r++)
        g[r] = -1;
    /* Group k is the k-th smallest CPU. */
    for (uint32_t last = 0;;) {
        uint32_t next = UINT32_MAX;
        for (int r = 0; r < n; r++)
            if (comm->cards[r].pinned_cpu > last && comm->cards[r].pinned_cpu < next)
                next = comm->cards[r].pinned_cpu;
        if (next == UINT32_MAX)
            break;
        for (int r = 0; r < n; r++)
            if (comm->cards[r].pinned_cpu == next)
                g[r] = groups;
        groups++;
        last = next;
    }
    *group_of = g;
    return hcclSuccess;
}

/* The window of the link that carries every connection, where it has one and reaches
 * every rank (the same answer on every rank); else NULL. */
static const hccl_window_ops_t *comm_window(struct hcclComm *comm, void **ctx_p)
{
    int id = comm->nranks > 1 ? comm->link_of[comm->rank == 0 ? 1 : 0] : -1;
    const hccl_link_ops_t *ops = id >= 0 ? hccl_link_by_id(id) : NULL;
    const hccl_window_ops_t *win = ops ? hccl_link_window(ops) : NULL;

    for (int r = 0; win && r < comm->nranks; r++)
        if (r != comm->rank && comm->link_of[r] != id)
            return NULL;
    if (!win || !comm->link_ctx[id] || !win->reaches_all(comm->link_ctx[id], comm->nranks))
        return NULL;
    *ctx_p = comm->link_ctx[id];
    return win;
}

/* Each window warns where the memory its rounds may touch could run out. */
static void comm_check_room(struct hcclComm *comm)
{
    void *lane_ctx = NULL;

    if (comm->lane)
        comm_window(comm, &lane_ctx);
    for (int id = 0; id < HCCL_LINK_MAX; id++) {
        const hccl_window_ops_t *win =
            comm->link_ctx[id] ? hccl_link_window(hccl_link_by_id(id)) : NULL;
        if (win)
            win->check_room(comm->link_ctx[id],
                            comm->link_ctx[id] == lane_ctx ? hccl_lane_reach(comm->lane) : 0);
    }
}

/*
 * The lane, where one link's window reaches every rank (the same answer on every rank, like
 * the settings that decide it, which the rendezvous compared). Under HCCL_CHECK a call takes
 * it once its signatures compared equal (coll_check.c).
 */
static hcclResult_t comm_open_lane(struct hcclComm *comm)
{
    void *wctx = NULL;
    const hccl_window_ops_t *win = comm_window(comm, &wctx);
    bool shared = hccl_topo_host_cores_shared(comm);
    size_t max = comm->params.lane_max;
    hccl_lane_limits_t limits = {.max_bytes = max,
                                 .flat_max = HCCL_LANE_FLAT_MAX,
                                 .rooted_min = shared ? 1024 : 0,
                                 .rooted_max = max,
                                 .direct_min = SIZE_MAX,
                                 .reduce_direct_min = SIZE_MAX,
                                 .pieces_above = SIZE_MAX};
    int *group_of = NULL;
    hcclResult_t res;

    /* Where each rank has a core of its own, the plans' rings win from 16 KiB (each lane slot
     * is rewritten while the peer still caches it), except for Broadcast and Reduce up to
     * 32 KiB (see hccl_lane_limits_t); where ranks share cores, the lane wins up to its largest
     * block, 16 MiB, since a plan waits for each rank's turn on a core at every step, where
     * the lane needs each rank to run about three times (docs/performance.md). */
    if (max == SIZE_MAX) {
        limits.max_bytes = shared ? HCCL_WINDOW_CAP : 8192;
        limits.rooted_max = shared ? HCCL_WINDOW_CAP : 32768;
        /* Larger AllReduces too, in pieces of that block, past LANE_PIECES_SPAN. */
        if (shared) {
            size_t span = LANE_PIECES_SPAN / (size_t)comm->nranks;
            limits.pieces_above = span > HCCL_WINDOW_CAP ? span : HCCL_WINDOW_CAP;
        }
    }
    limits.direct_min = lane_direct_min(comm, LANE_DIRECT_SPAN);
    limits.reduce_direct_min = lane_direct_min(comm, LANE_REDUCE_DIRECT_SPAN);
    /* Either way from the single-copy line on, as rank 0 times them (lane_choice.c). */
    limits.direct_choice_min = comm->params.cma_threshold ? comm->params.cma_threshold : 1;
    if (limits.max_bytes == 0 || !win)
        return hcclSuccess;
    if (shared)
        HCCL_CHECK(lane_cpu_groups(comm, &group_of));
    limits.group_of = group_of;
    res = hccl_lane_create(win, wctx, comm->rank, comm->nranks, &limits, comm->env.on_fatal,
                           comm->env.fatal_arg, &comm->lane);
    hccl_free(group_of);
    HCCL_CHECK(res);
    comm->tuner.lane = comm->lane;
    HCCL_CHECK(
        hccl_reactor_add_poller(comm->reactor, &(hccl_poller_t){hccl_lane_poll, NULL, comm->lane}));
    win->on_bell(wctx, hccl_lane_poll, comm->lane);
    HCCL_INFO(HCCL_SUB_INIT,
              "rank %d: collectives of up to %zu B take the lane (AllReduce and Reduce split "
              "above %d B; Broadcast and Reduce from %zu to %zu B), and every Barrier; CPU groups "
              "for split "
              "AllReduces: %d",
              comm->rank,
              limits.max_bytes < HCCL_WINDOW_CAP ? limits.max_bytes : (size_t)HCCL_WINDOW_CAP,
              HCCL_LANE_FLAT_MAX, limits.rooted_min,
              limits.rooted_max < HCCL_WINDOW_CAP ? limits.rooted_max : (size_t)HCCL_WINDOW_CAP,
              hccl_lane_groups(comm->lane));
    return hcclSuccess;
}

/*
 * Collectives whose buffers, over all the ranks of this host, exceed the last-level cache
 * store their results past it (hccl_exec_set_store_min): there a plain store first reads the
 * line it writes from memory, so streamed stores win, over shm and tcp alike; where the
 * buffers fit in the cache, they lose (docs/performance.md).
 */
static void comm_set_store_min(struct hcclComm *comm)
{
    size_t llc = hccl_topo_llc_bytes(), min = comm->params.store_min;
    int local = 0;

    for (int r = 0; r < comm->nranks; r++)
        local += comm->node_of[r] == comm->node_of[comm->rank];
    if (min == SIZE_MAX)
        min = llc / (size_t)local; /* 0 where sysfs lists no cache: never */
    hccl_exec_set_store_min(comm->exec, min);
    if (min)
        HCCL_INFO(HCCL_SUB_INIT,
                  "rank %d: plans over %zu B of buffers store results past the cache "
                  "(%zu B, %d ranks on this host)",
                  comm->rank, min, llc, local);
}

/* FNV-1a of the settings every rank must share (the rendezvous compares their text). */
static uint64_t config_hash(const char *text)
{
    uint64_t h = 1469598103934665603ull;

    for (size_t i = 0; text[i]; i++)
        h = (h ^ (unsigned char)text[i]) * 1099511628211ull;
    return h;
}

/* join NULL: through the rendezvous of id; else id is NULL. */
static hcclResult_t comm_init(hcclComm_t *comm_p, int nranks, const hccl_id_t *id, int rank,
                              const hcclConfig_t *config, const hccl_comm_join_t *join)
{
    struct hcclComm *comm = hccl_calloc(1, sizeof(*comm));
    hccl_bootstrap_result_t bs = {0};
    char cfg_text[HCCL_CONFIG_TEXT_BYTES];
    hccl_card_t card;
    hcclResult_t res;
    int64_t deadline = 0;

    if (!comm)
        return HCCL_FAIL(hcclSystemError, "comm: out of memory");
    comm->magic = HCCL_COMM_MAGIC;
    comm->ctl_fd = -1;
    comm->rank = rank;
    comm->nranks = nranks;
    atomic_init(&comm->async_error, hcclSuccess);
    pthread_mutex_init(&comm->mtx, NULL);
    hccl_log_set_rank(rank);
    memset(&card, 0, sizeof(card));
    bs.setup_fd = -1;
    HCCL_CHECK_GOTO(hccl_params_load(&comm->params, config), res, err_report);
    hccl_fault_attach(comm);
    deadline = hccl_now_ms() + comm->params.connect_timeout_ms;
    hccl_config_describe(&comm->params, cfg_text, sizeof(cfg_text));
    card.config_hash = config_hash(cfg_text);
    HCCL_CHECK_GOTO(
        hccl_reactor_create(config && config->size >= offsetof(hcclConfig_t, eventBase) +
                                                          sizeof(config->eventBase)
                                ? config->eventBase
                                : NULL,
                            rank, &comm->reactor),
        res, err_report);
    hccl_reactor_set_spin(comm->reactor, (int64_t)comm->params.spin_us * 1000);
    comm->env.rank = rank;
    comm->env.nranks = nranks;
    comm->env.reactor = comm->reactor;
    comm->env.params = &comm->params;
    comm->env.on_fatal = hccl_comm_on_link_fatal;
    comm->env.setup_watch_fd = -1;
    comm->env.setup_gone = -1;
    comm->env.fatal_arg = comm;
    HCCL_CHECK_GOTO(hccl_comm_cause_init(comm), res, err_report);
    comm->conns = hccl_calloc((size_t)nranks, sizeof(*comm->conns));
    comm->link_of = hccl_calloc((size_t)nranks, sizeof(*comm->link_of));
    comm->p2p_send_seq = hccl_calloc((size_t)nranks, sizeof(*comm->p2p_send_seq));
    comm->p2p_recv_seq = hccl_calloc((size_t)nranks, sizeof(*comm->p2p_recv_seq));
    if (!comm->conns || !comm->link_of || !comm->p2p_send_seq || !comm->p2p_recv_seq) {
        res = HCCL_FAIL(hcclSystemError, "comm: out of memory for %d ranks", nranks);
        goto err_report;
    }

    card.rank = (uint32_t)rank;
    card.pid = (uint32_t)getpid();
    {
        int only_cpu;
        card.cpus = (uint32_t)hccl_cpus_available(&only_cpu);
        card.pinned_cpu = only_cpu >= 0 ? (uint32_t)only_cpu + 1 : 0;
    }
    hccl_topo_host_id(&comm->params, card.host, sizeof(card.host));
    HCCL_CHECK_GOTO(comm_open_links(comm, &card), res, err_report);
    hccl_shrink_listen(comm, &card);
    HCCL_CHECK_GOTO(join ? join->join(join->arg, &card, cfg_text, deadline, &bs)
                         : hccl_bootstrap_join(id, rank, nranks, &card, cfg_text, deadline, &bs),
                    res, err_free);
    if (join)
        bs.setup_fd = -1; /* a join through another communicator's connections has none */
    comm->cards = bs.cards;
    comm->env.cards = bs.cards;
    comm->env.comm_id = bs.comm_id;
    memcpy(comm->env.secret, bs.secret, sizeof(bs.secret));
    comm->env.setup_watch_fd = bs.setup_fd;
    hccl_fault_point(comm, HCCL_FAULT_AT_INIT, UINT64_MAX);
    HCCL_CHECK_GOTO(comm_connect_links(comm, deadline), res, err_free);

    HCCL_CHECK_GOTO(hccl_exec_create(comm->reactor, rank, nranks, comm->conns, &comm->exec), res,
                    err_free);
    hccl_exec_set_recv_reduce(comm->exec, comm->params.recv_reduce);
    HCCL_CHECK_GOTO(hccl_plan_cache_create(HCCL_PLAN_CACHE_SIZE, &comm->plans), res, err_free);
    hccl_tuner_init(&comm->tuner, comm->params.algo, comm->params.buffsize);
    hccl_tuner_set_model(&comm->tuner, hccl_topo_cost_class(comm->cards, nranks),
                         comm->params.cost_model);
    comm->node_of = hccl_calloc((size_t)nranks, sizeof(*comm->node_of));
    if (!comm->node_of) {
        res = HCCL_FAIL(hcclSystemError, "comm: out of memory for %d ranks", nranks);
        goto err_free;
    }
    for (int r = 0, q; r < nranks; r++) {
        for (q = 0; q < r && strcmp(comm->cards[q].host, comm->cards[r].host) != 0; q++)
            ;
        comm->node_of[r] = q;
    }
    hccl_tuner_set_topology(&comm->tuner, comm->node_of, nranks);
    comm->tuner.model.cpus_shared = hccl_topo_any_cores_shared(comm); /* kept by the calibration */
    comm->tuner.model.rings_wait_turns =
        comm->tuner.model.cpus_shared && comm->tuner.cls == HCCL_COST_SHM;
    comm_set_store_min(comm);
    hccl_reactor_set_cores_shared(comm->reactor, hccl_topo_cores_shared(comm));
    {
        /* shm and tcp register pollers; rdma's completions reach only the progress thread. */
        bool pollable = true;
        for (int r = 0; r < nranks; r++) {
            pollable &=
                r == rank || comm->link_of[r] == HCCL_LINK_SHM || comm->link_of[r] == HCCL_LINK_TCP;
        }
        hccl_reactor_set_drivable(comm->reactor, pollable);
        if (nranks > 1)
            HCCL_CHECK_GOTO(comm_open_lane(comm), res, err_free);
        comm_check_room(comm);
    }
    hccl_fault_enable_steps(comm);
    comm->env.setup_watch_fd = -1;
    HCCL_CHECK_GOTO(hccl_bootstrap_setup_done(&bs.setup_fd, rank, nranks, hcclSuccess, rank, deadline),
                    res, err_free);
    HCCL_CHECK_GOTO(hccl_reactor_start(comm->reactor), res, err_free);
    if (hccl_reactor_is_external(comm->reactor) && hccl_reactor_in_callback(comm->reactor) &&
        comm->params.calibrate && !comm->params.cost_model[0] && nranks > 1) {
        res = HCCL_FAIL(hcclInvalidUsage,
                        "communicator start-up called from a callback of the loop "
                        "given as eventBase: it runs collectives to measure the "
                        "links (set HCCL_COST_MODEL or HCCL_CALIBRATE=0 to skip them)");
        goto err_free;
    }
    HCCL_CHECK_GOTO(join && join->tune ? join->tune(join->arg, comm) : hccl_comm_calibrate(comm),
                    res, err_free);
    hccl_topo_report(comm);
    HCCL_INFO(HCCL_SUB_INIT, "rank %d of %d ready (communicator %016llx, host %s)", rank, nranks,
              (unsigned long long)bs.comm_id, card.host);
    hccl_dump_register(comm);
    *comm_p = comm;
    hccl_fault_point(comm, HCCL_FAULT_AT_IDLE, UINT64_MAX);
    return hcclSuccess;

err_report : {
    char why[512];
    snprintf(why, sizeof(why), "%s", hccl_error_last());
    if (join)
        join->report(join->arg, res, why);
    else
        hccl_bootstrap_report(id, rank, nranks, res, why, hccl_now_ms() + 10000);
    hccl_error_put(why); /* the report's own failures are not the caller's error */
}
err_free:
    /* A failure of the link set-up: every rank hears it, and reports the first one anywhere.
     * A join has no such verdict (whatever its result left in bs). */
    if (!join && bs.setup_fd >= 0)
        res = hccl_bootstrap_setup_done(&bs.setup_fd, rank, nranks, res,
                                        comm->env.setup_gone >= 0 ? comm->env.setup_gone : rank,
                                        deadline);
    hccl_comm_free(comm, false);
    return res;
}

/* ---- creation ---- */

HCCL_API hcclResult_t hcclCommInitRankConfig(hcclComm_t *comm, int nranks, hcclUniqueId uid,
                                             int rank, const hcclConfig_t *config)
{
    hccl_id_t id;

    hccl_log_init();
    if (!comm)
        return HCCL_FAIL(hcclInvalidArgument, "hcclCommInitRank: comm is NULL");
    if (nranks < 1)
        return HCCL_FAIL(hcclInvalidArgument, "hcclCommInitRank: nranks is %d (must be >= 1)",
                         nranks);
    if (rank < 0 || rank >= nranks)
        return HCCL_FAIL(hcclInvalidArgument, "hcclCommInitRank: rank %d is not in [0, %d)", rank,
                         nranks);
    if (config && (config->size < sizeof(size_t) || config->size > (1u << 16)))
        return HCCL_FAIL(hcclInvalidUsage,
                         "hcclCommInitRankConfig: hcclConfig_t.size is %zu: initialise "
                         "config with HCCL_CONFIG_INITIALIZER",
                         config->size);
    memcpy(&id, uid.internal, sizeof(id));
    HCCL_CHECK(hccl_comm_id_check(&id, "hcclCommInitRank"));
    return comm_init(comm, nranks, &id, rank, config, NULL);
}

hcclResult_t hccl_comm_create(struct hcclComm **comm_p, int nranks, int rank,
                              const hcclConfig_t *config, const hccl_comm_join_t *join)
{
    return comm_init(comm_p, nranks, NULL, rank, config, join);
}

HCCL_API hcclResult_t hcclCommInitRank(hcclComm_t *comm, int nranks, hcclUniqueId id, int rank)
{
    return hcclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

HCCL_API hcclResult_t hcclCommInitGroup(hcclComm_t *comm, uint32_t commSize, const char *commId,
                                        uint32_t rankId)
{
    const char *secret = getenv("HCCL_COMM_SECRET");
    hccl_sockaddr_t addr;
    hccl_params_t p;
    hccl_id_t id;
    uint64_t root;
    bool have_root = false;
    hcclResult_t res;
    int fd;

    hccl_log_init();
    if (!comm || !commId)
        return HCCL_FAIL(hcclInvalidArgument, "hcclCommInitGroup: %s is NULL",
                         comm ? "commId" : "comm");
    if (commSize < 1 || commSize > (1u << 20))
        return HCCL_FAIL(hcclInvalidArgument, "hcclCommInitGroup: commSize %u is out of range",
                         commSize);
    if (rankId >= commSize)
        return HCCL_FAIL(hcclInvalidArgument, "hcclCommInitGroup: rankId %u is not in [0, %u)",
                         rankId, commSize);
    if (hccl_socket_parse_addr(commId, &addr) != hcclSuccess) {
        char why[400];
        snprintf(why, sizeof(why), "%s", hccl_error_last());
        return HCCL_FAIL(hcclInvalidArgument, "hcclCommInitGroup: commId: %s", why);
    }
    memset(&id, 0, sizeof(id));
    id.magic = HCCL_ID_MAGIC;
    id.version = HCCL_ID_VERSION;
    hccl_id_from_addr(&id, &addr);
    if (secret && *secret && hccl_hex_decode(secret, id.secret, sizeof(id.secret)) < 0)
        return HCCL_FAIL(hcclInvalidArgument, "HCCL_COMM_SECRET is not hex of at most %d bytes",
                         HCCL_SECRET_BYTES);
    if (!secret || !*secret)
        HCCL_INFO(HCCL_SUB_INIT,
                  "HCCL_COMM_SECRET is not set: the rendezvous at %s is not "
                  "authenticated",
                  commId);
    if (rankId == 0) {
        HCCL_CHECK(hccl_params_load(&p, NULL));
        /* If another rank 0 holds the address, join it: the service reports the duplicate. */
        if (hccl_bootstrap_root_listen(&addr, &fd) == hcclSuccess) {
            if (hccl_bootstrap_root_start(&id, (int)commSize, p.connect_timeout_ms, &fd, &root) !=
                hcclSuccess) {
                close(fd);
                return hcclSystemError;
            }
            have_root = true;
        }
    }
    res = comm_init(comm, (int)commSize, &id, (int)rankId, NULL, NULL);
    if (have_root) {
        /* The service lives in this process: on failure, stay until it has told every rank why
         * (bounded by the connect timeout), or they would wait for a rendezvous that vanished. */
        if (res != hcclSuccess) {
            char msg[1024];
            snprintf(msg, sizeof(msg), "%s", hccl_error_last());
            hccl_bootstrap_root_wait(root);
            hccl_error_put(msg);
        }
    }
    return res;
}
