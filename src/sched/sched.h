/*
 * Plans, the executor that runs them, the plan cache, and the reduction
 * kernels.
 *
 * A plan is a DAG of steps (send, recv, reduce, copy) with "may start only
 * after" edges. Buffers are named as slot + byte offset, so one plan serves
 * every call of the same shape; a run binds the slots to real pointers.
 */
#ifndef HCCL_SCHED_H
#define HCCL_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

struct hccl_reactor;
struct hccl_conn;

/* ---- reduction kernels (reduce.c) ---- */

/*
 * dst[i] = a[i] op b[i] for count elements; dst may alias a or b. hcclAvg
 * reduces as hcclSum (see hccl_reduce_div). fp16/bf16 are computed in fp32
 * and rounded to nearest-even; integers wrap.
 */
void hccl_reduce(void *dst, const void *a, const void *b, size_t count, hcclDataType_t dt,
                 hcclRedOp_t op);
/* hccl_reduce (the same bits; see reduce_store.c for NaN payloads) with the results stored past
 * the cache, as hccl_store_copy does, where the type and op have such a pass (fp32/fp64 sum and
 * avg); returns the bytes so stored. */
size_t hccl_reduce_store(void *dst, const void *a, const void *b, size_t count, hcclDataType_t dt,
                         hcclRedOp_t op);
/* buf[i] /= n: the last step of hcclAvg (integers truncate). */
void hccl_reduce_div(void *buf, size_t count, hcclDataType_t dt, int n);
float hccl_half_to_float(uint16_t h);
uint16_t hccl_float_to_half(float f);
float hccl_bf16_to_float(uint16_t h);
uint16_t hccl_float_to_bf16(float f);

/*
 * fp16/bf16 kernels for the CPU's conversion instructions (reduce_x86.c),
 * chosen once at the first hccl_reduce; HCCL_REDUCE_ISA=portable keeps the
 * portable ones. Every kernel gives the portable kernel's bits for every
 * input. Internal, and for tests.
 */
typedef void (*hccl_reduce_fn_t)(void *dst, const void *a, const void *b, size_t count);
/* hccl_reduce with the portable kernels, whatever the CPU. */
void hccl_reduce_portable(void *dst, const void *a, const void *b, size_t count,
                          hcclDataType_t dt, hcclRedOp_t op);
/* The paths hccl_reduce uses, fp16's then bf16's: "f16c+avx512bf16", "f16c+avx2", "portable". */
const char *hccl_reduce_isa(void);
/*
 * One path's kernel ("f16c" for fp16; "avx512bf16" or "avx2" for bf16), or
 * NULL where this build or CPU lacks it.
 */
hccl_reduce_fn_t hccl_reduce_isa_kernel(const char *isa, hcclDataType_t dt, hcclRedOp_t op);

/* ---- plans (plan.c) ---- */

typedef enum {
    HCCL_STEP_SEND,
    HCCL_STEP_RECV,
    HCCL_STEP_REDUCE, /* dst = src op src2 */
    HCCL_STEP_COPY,   /* dst = src; a no-op when they are the same memory */
} hccl_step_kind_t;

typedef enum { HCCL_SLOT_SEND, HCCL_SLOT_RECV, HCCL_SLOT_SCRATCH, HCCL_NUM_SLOTS } hccl_slot_t;

typedef struct {
    uint32_t slot;   /* hccl_slot_t */
    size_t off;      /* bytes from the slot's base */
} hccl_bref_t;

#define HCCL_STEP_FINAL_DIV 1u /* reduce or copy: divide the result by nranks (hcclAvg) */
#define HCCL_STEP_FORWARDED 2u /* recv: a send of the plan reads what it wrote (set by finalize) */
/* send: a step of the plan writes what it reads, SEND and RECV apart / in place (finalize) */
#define HCCL_STEP_SRC_WRITTEN 4u
#define HCCL_STEP_SRC_WRITTEN_IN_PLACE 8u

typedef struct hccl_step {
    uint8_t kind;          /* hccl_step_kind_t */
    uint8_t flags;         /* HCCL_STEP_* */
    int32_t peer;          /* send/recv */
    uint32_t tag;          /* send/recv: the sender's and receiver's steps agree on it */
    hccl_bref_t dst;       /* recv, reduce, copy */
    hccl_bref_t src;       /* send, reduce, copy */
    hccl_bref_t src2;      /* reduce */
    size_t bytes;
    uint32_t ndeps;        /* predecessors */
    uint32_t succ_first;   /* index into plan->succ */
    uint32_t nsucc;
} hccl_step_t;

typedef struct hccl_plan {
    hccl_step_t *steps;    /* owned */
    uint32_t nsteps;
    uint32_t cap;
    uint32_t *edges;       /* owned, pairs (before, after) while building */
    uint32_t nedges;
    uint32_t edge_cap;
    uint32_t *succ;        /* owned, successor lists after finalize */
    size_t scratch_bytes;
    int nranks;
    int rank;
    hcclDataType_t dtype;
    hcclRedOp_t op;
    const char *algo;      /* static name of the generator */
    size_t send_bytes;     /* the send and receive buffers' sizes, set by finalize */
    size_t recv_bytes;
    uint32_t nsends;       /* send steps, set by finalize */
    uint32_t nreduces;     /* reduce steps, set by finalize */
    bool final;
    atomic_int refs;
} hccl_plan_t;

hcclResult_t hccl_plan_create(int rank, int nranks, hcclDataType_t dt, hcclRedOp_t op,
                              const char *algo, hccl_plan_t **plan_p);
void hccl_plan_retain(hccl_plan_t *plan);
void hccl_plan_release(hccl_plan_t *plan);
/* Builders return the new step's index in *id_p. */
hcclResult_t hccl_plan_send(hccl_plan_t *p, int peer, uint32_t tag, hccl_bref_t src, size_t bytes,
                            uint32_t *id_p);
hcclResult_t hccl_plan_recv(hccl_plan_t *p, int peer, uint32_t tag, hccl_bref_t dst, size_t bytes,
                            uint32_t *id_p);
hcclResult_t hccl_plan_reduce(hccl_plan_t *p, hccl_bref_t dst, hccl_bref_t a, hccl_bref_t b,
                              size_t bytes, unsigned flags, uint32_t *id_p);
hcclResult_t hccl_plan_copy(hccl_plan_t *p, hccl_bref_t dst, hccl_bref_t src, size_t bytes,
                            uint32_t *id_p);
/* A copy that also applies HCCL_STEP_* flags (e.g. the final division of hcclAvg). */
hcclResult_t hccl_plan_copy_flags(hccl_plan_t *p, hccl_bref_t dst, hccl_bref_t src, size_t bytes,
                                  unsigned flags, uint32_t *id_p);

/* How a finalized sub-plan is placed inside a bigger one (hierarchical algorithms). */
typedef struct {
    const int *peer_map;                  /* sub-plan rank -> rank of the bigger plan */
    hccl_bref_t slot_map[HCCL_NUM_SLOTS]; /* where each sub-plan slot starts in the bigger plan */
    uint32_t tag_base;                    /* added to every send/receive tag */
    const uint32_t *after;                /* steps every root of the sub-plan waits for */
    uint32_t nafter;
} hccl_plan_embed_t;

/*
 * Copies sub's steps and edges into p, remapped by e; HCCL_STEP_FINAL_DIV flags are dropped
 * (the bigger plan divides once, itself). The new steps are [*first_p, *first_p + sub->nsteps).
 */
hcclResult_t hccl_plan_embed(hccl_plan_t *p, const hccl_plan_t *sub, const hccl_plan_embed_t *e,
                             uint32_t *first_p);
/* after may start only once before has completed. */
hcclResult_t hccl_plan_dep(hccl_plan_t *p, uint32_t before, uint32_t after);
/* Builds the successor lists, checks the plan (ranges against slot sizes, acyclic), and sets
 * send_bytes, recv_bytes, nsends, nreduces and the HCCL_STEP_FORWARDED marks. */
hcclResult_t hccl_plan_finalize(hccl_plan_t *p, size_t send_bytes, size_t recv_bytes);
static inline hccl_bref_t hccl_bref(hccl_slot_t slot, size_t off)
{
    hccl_bref_t b = {(uint32_t)slot, off};
    return b;
}

/* ---- plan cache (plan_cache.c) ---- */

typedef struct hccl_plan_key {
    int coll;
    int algo;
    size_t count;
    int dtype;
    int op;
    int root;
} hccl_plan_key_t;

typedef struct hccl_plan_cache hccl_plan_cache_t;
hcclResult_t hccl_plan_cache_create(unsigned capacity, hccl_plan_cache_t **c_p);
void hccl_plan_cache_destroy(hccl_plan_cache_t *c);
/* A retained plan for key, or NULL. */
hccl_plan_t *hccl_plan_cache_get(hccl_plan_cache_t *c, const hccl_plan_key_t *key);
/* Stores (and retains) plan under key, evicting the least recently used entry. */
hcclResult_t hccl_plan_cache_put(hccl_plan_cache_t *c, const hccl_plan_key_t *key,
                                 hccl_plan_t *plan);

/* ---- executor (exec.c) ---- */

typedef struct hccl_exec hccl_exec_t;
typedef struct hccl_run hccl_run_t;
/* Called on the reactor thread, once, when a run ends. msg: failure text or NULL. */
typedef void (*hccl_run_done_cb_t)(hccl_run_t *run, hcclResult_t res, const char *msg, void *arg);

/*
 * conns[peer] is the connection to each peer (borrowed; NULL for self).
 * The executor never blocks: sends and receives go to the links, reductions
 * and copies run inline on the reactor thread.
 */
hcclResult_t hccl_exec_create(struct hccl_reactor *r, int rank, int nranks, struct hccl_conn **conns,
                              hccl_exec_t **ex_p);
void hccl_exec_destroy(hccl_exec_t *ex);
/*
 * Starts plan with the given buffers (scratch is allocated by the executor).
 * Steps without predecessors are issued before this returns; completion
 * (success or failure) is reported through cb, never from inside this call.
 */
hcclResult_t hccl_exec_start(hccl_exec_t *ex, hccl_plan_t *plan, uint64_t seq,
                             const void *sendbuf, void *recvbuf, hccl_run_done_cb_t cb, void *arg,
                             hccl_run_t **run_p);
/* The same, with the collective's signature stamped on every transfer (see hccl_sig_make). */
hcclResult_t hccl_exec_start_sig(hccl_exec_t *ex, hccl_plan_t *plan, uint64_t seq, uint32_t sig,
                                 const void *sendbuf, void *recvbuf, hccl_run_done_cb_t cb,
                                 void *arg, hccl_run_t **run_p);
/*
 * Called on the reactor thread just before each step is issued, with the run's sequence number
 * and the step's index (fault injection; NULL, the default, costs one branch per step).
 */
typedef void (*hccl_exec_step_hook_t)(void *arg, uint64_t seq, uint32_t step);
void hccl_exec_set_step_hook(hccl_exec_t *ex, hccl_exec_step_hook_t hook, void *arg);
/*
 * Whether a receive whose only successor reduces what it receives is handed to its link with a
 * consume function, so that the payload is reduced as it arrives, where the reduce waits on
 * nothing else by then, instead of being stored in scratch and read again (default on; links
 * without recv_consume never get one).
 */
void hccl_exec_set_recv_reduce(hccl_exec_t *ex, bool on);
/*
 * Runs of plans that only move data (no reduce) whose buffers (send, receive, scratch; the
 * send buffer not counted in place) exceed bytes write their results with stores that bypass
 * the cache (hccl_store_copy): what no longer fits in the cache is not read before it is
 * overwritten. So do their copies and the receives the link copies out of its wire itself
 * (xfer.store), except those a send of the plan reads again (HCCL_STEP_FORWARDED) and those of
 * a plan without sends. Plans that reduce store as usual: there streaming measured slower.
 * 0 (the default): never.
 */
void hccl_exec_set_store_min(hccl_exec_t *ex, size_t bytes);
/* How many receives were reduced that way so far (tests, diagnostics). */
uint64_t hccl_exec_fused_recvs(const hccl_exec_t *ex);
/* Bytes of reduction results this executor stored past the cache (a Reduce root's). */
uint64_t hccl_exec_bytes_reduced_stored(const hccl_exec_t *ex);
/* Ends every run in flight with res/msg (their link operations are the caller's to cancel). */
void hccl_exec_fail_all(hccl_exec_t *ex, hcclResult_t res, const char *msg);
/* Number of runs in flight. */
int hccl_exec_inflight(const hccl_exec_t *ex);
/*
 * Writes the peers a run still waits on ("1,3") into buf and returns true; when no transfer is
 * posted, writes those of its transfers not issued yet (blocked on earlier steps) and returns false.
 */
bool hccl_exec_run_pending_peers(const hccl_run_t *run, char *buf, size_t len);
uint64_t hccl_exec_run_seq(const hccl_run_t *run);
/* The run has ended (its completion is on its way): nothing can fail it any more. */
bool hccl_exec_run_finishing(const hccl_run_t *run);

/*
 * Diagnostics: read-only views of the runs in flight, for hcclCommDumpState. The caller holds
 * the reactor's progress lock (hccl_reactor_enter), so that nothing moves while it reads.
 */
typedef enum {
    HCCL_STEP_DONE,
    HCCL_STEP_BLOCKED,   /* waits for predecessors */
    HCCL_STEP_READY,     /* predecessors done, not issued yet */
    HCCL_STEP_POSTED,    /* a send or receive handed to its link, not back yet */
    HCCL_STEP_FAILED,    /* a send or receive that came back with an error */
} hccl_step_state_t;

/* The newest run in flight, then the older ones; NULL at the end. */
const hccl_run_t *hccl_exec_first_run(const hccl_exec_t *ex);
const hccl_run_t *hccl_exec_next_run(const hccl_run_t *run);
const hccl_plan_t *hccl_exec_run_plan(const hccl_run_t *run);
/* The arg given to hccl_exec_start (the request, for the communicator's runs). */
void *hccl_exec_run_arg(const hccl_run_t *run);
/* Steps not completed yet. */
uint32_t hccl_exec_run_remaining(const hccl_run_t *run);
/* Whether the run has failed (its text in msg_p); it ends once its transfers are back. */
bool hccl_exec_run_failed(const hccl_run_t *run, const char **msg_p);
/* The run's result so far (its first failure once it has failed). */
hcclResult_t hccl_exec_run_result(const hccl_run_t *run);
/* Where step stands; *left_p: its predecessors not done yet. */
hccl_step_state_t hccl_exec_run_step_state(const hccl_run_t *run, uint32_t step, uint32_t *left_p);

#endif /* HCCL_SCHED_H */
