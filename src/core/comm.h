/* The communicator, and the bootstrap and topology steps that build it. */
#ifndef HCCL_COMM_H
#define HCCL_COMM_H

#include "algos/algos.h"
#include "base/base.h"
#include "links/link.h"
#include "reactor/reactor.h"
#include "sched/lane.h"
#include "sched/sched.h"

#define HCCL_COMM_MAGIC 0x4d4d4f43u /* "COMM" */
#define HCCL_COMM_DEAD 0x44414544u  /* "DEAD": destroyed, kept in quarantine (quarantine.h) */
/* Point-to-point sequence numbers live apart from the collectives': only two ranks count them. */
#define HCCL_P2P_SEQ_BIT (1ull << 63)
/* HCCL_CHECK's signature exchange tags its transfers with this bit, beside the collective's own. */
#define HCCL_CHECK_TAG_BIT 0x80000000u

/* What the unique id carries: where the rendezvous listens, and its secret. */
typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t family;
    uint16_t port;             /* network order */
    uint16_t reserved;
    uint8_t addr[16];
    uint8_t secret[HCCL_SECRET_BYTES];
} hccl_id_t;

/* Result of the rendezvous: who is in the communicator. */
typedef struct {
    uint64_t comm_id;
    uint8_t secret[HCCL_SECRET_BYTES]; /* for every data connection */
    hccl_card_t *cards;                /* owned, [nranks] */
    /* The connection to the rendezvous, kept through the link set-up (-1: none, as for a
     * communicator made from another's connections): see hccl_bootstrap_setup_done. */
    int setup_fd;
} hccl_bootstrap_result_t;

/*
 * Starts the rendezvous service (a thread) for nranks (0: taken from the first rank); its
 * number goes to *service_p if not NULL. The library joins every service's thread once it
 * ended: at the next start, or in hccl_bootstrap_root_wait / hccl_bootstrap_quiesce.
 */
hcclResult_t hccl_bootstrap_root_start(const hccl_id_t *id, int nranks, int timeout_ms, int *listen_fd,
                                       uint64_t *service_p);
/* Returns once service has ended (it ends by the connect timeout) and its thread is joined. */
void hccl_bootstrap_root_wait(uint64_t service);
/* Waits until no rendezvous service of this process runs, and joins them; false at deadline_ms. */
bool hccl_bootstrap_quiesce(int64_t deadline_ms);
/* Opens the listener of hcclGetUniqueId / rank 0 of hcclCommInitGroup at addr (port 0: any). */
hcclResult_t hccl_bootstrap_root_listen(hccl_sockaddr_t *addr, int *fd_p);
/* Joins: sends our card, receives everyone's, within the deadline. */
hcclResult_t hccl_bootstrap_join(const hccl_id_t *id, int rank, int nranks, const hccl_card_t *card,
                                 const char *config, int64_t deadline_ms, hccl_bootstrap_result_t *out);
/*
 * The link set-up's end, on every rank: tells the rendezvous this rank's outcome (status; a
 * failure's origin: this rank, or a peer it found gone) and returns the verdict, the same on
 * every rank: hcclSuccess, or the first failure of any rank, its root cause set as the error.
 * Closes *fd_p. Without a connection (*fd_p < 0), returns status.
 */
hcclResult_t hccl_bootstrap_setup_done(int *fd_p, int rank, int nranks, hcclResult_t status,
                                       int origin, int64_t deadline_ms);
/* The rendezvous' side: collects the outcomes of the n ranks on fds (taken: closed after) until
 * every rank has set up its links, one has failed or gone, or deadline_ms; answers all. */
void hccl_bootstrap_setup_serve(int *fds, int n, int64_t deadline_ms);
/* Tells the rendezvous that this rank failed before it could join, so that every rank hears why. */
void hccl_bootstrap_report(const hccl_id_t *id, int rank, int nranks, hcclResult_t status,
                           const char *why, int64_t deadline_ms);
void hccl_id_to_addr(const hccl_id_t *id, hccl_sockaddr_t *addr);
void hccl_id_from_addr(hccl_id_t *id, const hccl_sockaddr_t *addr);

/* topo.c: our host identity (HCCL_HOST_ID, else hostname + boot id + network namespace). */
void hccl_topo_host_id(const hccl_params_t *p, char *out, size_t len);
/* The launcher's name for this host (PMIx), used instead of the hostname by the communicators
 * this thread forms until it is set back to NULL; the caller keeps name alive meanwhile. */
void hccl_topo_set_launcher_host(const char *name);
/* The largest cache sysfs lists for CPU 0, in bytes (0: none listed). Not sysconf: on virtual
 * machines the CPU may report a size far from the real cache's. */
size_t hccl_topo_llc_bytes(void);
/* The number of CPUs this process may run on; *only_cpu: that CPU if it is one, else -1. */
int hccl_cpus_available(int *only_cpu);
/* The link id used between rank and peer, or -1. */
int hccl_topo_pick_link(const hccl_card_t *me, const hccl_card_t *peer);
/* The slowest link class between any two ranks: what the tuner's model describes. */
hccl_cost_class_t hccl_topo_cost_class(const hccl_card_t *cards, int nranks);
struct hcclComm;
/* Whether this rank shares a CPU with another rank of its host (from the cards). */
bool hccl_topo_cores_shared(const struct hcclComm *comm);
/* Whether any rank of this host shares a CPU, from the cards: the same answer on every rank
 * of the host (with 3 ranks pinned to 2 CPUs, the one alone on its CPU says yes too). */
bool hccl_topo_host_cores_shared(const struct hcclComm *comm);
/* Whether any rank of the communicator shares a CPU: the same answer on every rank. */
bool hccl_topo_any_cores_shared(const struct hcclComm *comm);
/* Logs the tuner's picks at INFO (rank 0) and writes HCCL_TOPO_DUMP as JSON. */
void hccl_topo_report(const struct hcclComm *comm);
/* The tuner's pick for coll at bytes on this communicator. */
hccl_algo_t hccl_topo_pick(const struct hcclComm *comm, hccl_coll_t coll, size_t bytes);
/* One link class as hccl-topo measures it: a ping-pong between ranks a and b. */
typedef struct {
    int link; /* HCCL_LINK_* */
    int a, b;
    double latency_us;     /* one way, 8 bytes */
    double bandwidth_gbps; /* one direction, large messages */
} hccl_topo_linkperf_t;
/* The HCCL_TOPO_DUMP document; perf (nperf entries, may be 0) adds the measured link classes. */
void hccl_topo_write_json(const struct hcclComm *comm, FILE *f, const hccl_topo_linkperf_t *perf, int nperf);
/* Measures the tuner's constants with a few AllReduces (calibrate.c); every rank must call it. */
hcclResult_t hccl_comm_calibrate(struct hcclComm *comm);

struct hcclComm {
    uint32_t magic;
    int rank;
    int nranks;
    hccl_params_t params;
    hccl_link_env_t env;
    hccl_reactor_t *reactor;         /* owned */
    void *link_ctx[HCCL_LINK_MAX];   /* owned, per link kind */
    hccl_conn_t **conns;             /* [nranks], borrowed from the links */
    int *link_of;                    /* [nranks]: HCCL_LINK_* used for each peer, -1 self */
    int *node_of;                    /* [nranks]: host index of every rank (first rank's index) */
    hccl_card_t *cards;              /* owned, [nranks] */
    hccl_exec_t *exec;               /* owned */
    hccl_lane_t *lane;               /* owned; NULL where small collectives take plans too */
    hccl_plan_cache_t *plans;        /* owned; reactor thread only */
    hccl_tuner_t tuner;
    bool model_measured;             /* the tuner's constants come from hccl_comm_calibrate */
    atomic_ullong next_seq;
    atomic_ullong *p2p_send_seq;     /* owned, [nranks]: point-to-point sends posted per peer */
    atomic_ullong *p2p_recv_seq;     /* owned, [nranks]: receives posted per peer */
    struct hcclRequest *self_sends;  /* reactor thread: sends to ourselves not yet matched */
    struct hcclRequest *self_recvs;
    /* Reactor thread: the requests under the exec timeout, oldest first, and the one timer
     * that serves them all (coll_submit.c, hccl_coll_arm_timeout). */
    struct hcclRequest *timed_head, *timed_tail;
    /* HCCL_CHECK: requests being checked, in posting order (reactor thread; coll_check.c) */
    struct hcclRequest *checking_head, *checking_tail;
    hccl_timer_t *exec_timer;        /* owned; NULL until the first timed request */
    bool exec_timer_armed;
    /* failure state, written on the reactor thread */
    _Atomic hcclResult_t async_error;
    char async_msg[512];             /* under mtx */
    bool links_aborted;
    /* A link's fatal error, applied from the post queue (comm.c: comm_on_link_fatal). */
    hccl_post_t fatal_post;
    atomic_int fatal_state; /* none, queued, applied (comm.c) */
    hcclResult_t fatal_res;
    char fatal_msg[512];
    struct hccl_fault_set *faults;   /* owned; HCCL_FAULT for this rank, NULL: none (fault.h) */
    int ctl_fd;                      /* owned: control listener for hcclCommShrink, -1: none */
    atomic_uint shrink_gen;          /* hcclCommShrink calls on this communicator so far */
    struct hccl_shrink_early *shrink_early; /* owned: connections for a later shrink (shrink.h) */
    hcclResult_t shrink_failure_res;        /* the last failed shrink this rank led, and why */
    char shrink_failure[512];
    struct hccl_cause_state *cause_state; /* owned; reactor thread (comm_cause.c) */
    pthread_mutex_t mtx;                  /* async_msg */
};

/*
 * How a communicator being created gets its rank table: from the rendezvous of an id, or
 * another way (hcclCommShrink: from the survivors of a parent, shrink.c).
 */
typedef struct hccl_comm_join {
    /* Sends our card (config: the settings that must agree) and fills out, by deadline_ms. */
    hcclResult_t (*join)(void *arg, const hccl_card_t *card, const char *config,
                         int64_t deadline_ms, hccl_bootstrap_result_t *out);
    /* This rank failed before it joined (why: the text): tell the others. */
    void (*report)(void *arg, hcclResult_t status, const char *why);
    /* The links are up: sets the tuner's constants of comm (in place of the calibration). */
    hcclResult_t (*tune)(void *arg, struct hcclComm *comm);
    void *arg;
} hccl_comm_join_t;
/* Creates a communicator whose rank table comes through join (comm_init.c). */
hcclResult_t hccl_comm_create(struct hcclComm **comm_p, int nranks, int rank,
                              const hcclConfig_t *config, const hccl_comm_join_t *join);
/* shrink.c: opens comm's control listener and writes its address into card (none: a WARN). */
void hccl_shrink_listen(struct hcclComm *comm, hccl_card_t *card);
/* shrink.c: closes it. */
void hccl_shrink_close(struct hcclComm *comm);

/*
 * Reactor thread: the communicator is broken. Its root cause settles with the peers first
 * (comm_cause.c), then hccl_comm_fail_now fails everything in flight and tells the peers.
 */
void hccl_comm_fail(struct hcclComm *comm, hcclResult_t res, const char *msg);
void hccl_comm_fail_now(struct hcclComm *comm, hcclResult_t res, const char *msg);
/* comm_cause.c: the root cause's state, set up with the links' callbacks (env.on_cause). */
typedef struct hccl_cause_state hccl_cause_state_t;
hcclResult_t hccl_comm_cause_init(struct hcclComm *comm);
/* Before the reactor is destroyed (causes still queued are dropped), then after it. */
void hccl_comm_cause_fini(struct hcclComm *comm);
void hccl_comm_cause_free(struct hcclComm *comm);
/* Reactor thread: req passed the exec timeout (msg: what this rank saw). */
void hccl_comm_fail_timeout(struct hcclComm *comm, const struct hcclRequest *req, const char *msg);
/*
 * Reactor thread: a failure every rank sees alike without the communicator failing (an
 * HCCL_CHECK mismatch): its text as every rank reports it into buf, noted for an abort.
 */
void hccl_comm_cause_note(struct hcclComm *comm, hcclResult_t res, int origin, const char *text,
                          char *buf, size_t len);
/* Reactor thread: hcclCommAbort; the peers hear the first cause, our requests get hcclAborted. */
void hccl_comm_cause_abort(struct hcclComm *comm);
/*
 * Reactor thread, for a request ending with *res_p (its text in buf): true when it waits for
 * the settled cause (the caller stops; it is finished again then); false when it ends now, with
 * *res_p and buf rewritten to the cause's once one has settled.
 */
bool hccl_comm_cause_hold(struct hcclComm *comm, struct hcclRequest *req, hcclResult_t *res_p,
                          char *buf, size_t len);
/* Reactor thread (or with the reactor stopped): applies a link failure still queued (true),
 * or does nothing (false). */
bool hccl_comm_apply_queued_fatal(struct hcclComm *comm);
/* A copy of the text of the failure that broke comm ("" if none). */
void hccl_comm_error_text(struct hcclComm *comm, char *buf, size_t len);
/* Reactor thread: fails the sends and receives to ourselves still waiting for their match. */
void hccl_comm_fail_self_p2p(struct hcclComm *comm, hcclResult_t res, const char *msg);
/* Validates a handle passed by the user. */
hcclResult_t hccl_comm_check(const struct hcclComm *comm, const char *fn);
/* Whether [a, a + alen) and [b, b + blen) share a byte (empty ranges share none). */
bool hccl_ranges_overlap(const void *a, size_t alen, const void *b, size_t blen);
/* Reactor thread: req ends with res (msg: its failure text); the communicator's count drops. */
void hccl_coll_finish(struct hcclComm *comm, struct hcclRequest *req, hcclResult_t res, const char *msg);
/* Reactor thread: the exec timeout's timer for req, where one is set. */
hcclResult_t hccl_coll_arm_timeout(struct hcclComm *comm, struct hcclRequest *req);
/* Whether the lane takes this call (the same answer on every rank: settings they share). */
bool hccl_coll_lane_takes(const struct hcclComm *comm, int coll, size_t count, hcclDataType_t dtype);
/* Reactor thread: req goes on the lane (coll_lane.c). */
void hccl_coll_lane_start(struct hcclComm *comm, struct hcclRequest *req);
/*
 * A blocking collective that the lane takes, run on the calling thread while the lane has
 * nothing else queued: true with its result in *res_p; false where the caller posts a request
 * instead (nothing was started).
 */
bool hccl_coll_lane_blocking(struct hcclComm *comm, int coll, const void *sendbuf, void *recvbuf,
                             size_t count, hcclDataType_t dtype, hcclRedOp_t op, int root,
                             hcclResult_t *res_p);
/* Queues req (filled in by the caller) on comm's reactor (blocking: the caller waits for it at
 * once and helps the reactor meanwhile). */
hcclResult_t hccl_comm_post(struct hcclComm *comm, struct hcclRequest *req, bool blocking);
/* "allreduce seq 12" or "send #3 to rank 5"; detail adds " (1024 x float32, sum)" and the like. */
void hccl_request_describe(const struct hcclRequest *req, bool detail, char *buf, size_t len);
/* dump.c: the live communicators that HCCL_DUMP_ON_SIGNAL reports on (SIGUSR1). */
void hccl_dump_register(struct hcclComm *comm);
/* Before comm is freed; waits for a report in progress. */
void hccl_dump_unregister(struct hcclComm *comm);

#endif /* HCCL_COMM_H */
