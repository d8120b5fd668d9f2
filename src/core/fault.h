/*
 * HCCL_FAULT: test-only fault injection, so that failure tests are deterministic.
 *
 *   kill:rank=R[,seq=S][,step=T]      SIGKILL when rank R issues step T of collective S
 *   kill:rank=R,at=init|idle|destroy|shrink  ... or at a point of the communicator's life
 *   close:rank=R,peer=P[,seq=S][,step=T]  rank R closes its link to P, as a cut cable would
 *   delay:rank=R,ms=M[,seq=S][,step=T]    rank R stalls M ms before issuing the step
 *   several faults separated by ';'
 *
 * S is the communicator's collective sequence number (0 for its first collective, counting
 * the start-up calibration's), the one error messages print; T is the step's index in the
 * plan. A fault fires at the first point that matches it, once; a delay without seq fires
 * once per collective. Malformed faults are warned about and ignored. A set HCCL_FAULT keeps
 * collectives off the lane unless HCCL_LANE_MAX is set too; there a lane operation has one
 * step, 0, its publication.
 */
#ifndef HCCL_FAULT_H
#define HCCL_FAULT_H

#include <stdbool.h>
#include <stdint.h>

#define HCCL_FAULT_MAX 8

typedef enum { HCCL_FAULT_KILL, HCCL_FAULT_CLOSE, HCCL_FAULT_DELAY } hccl_fault_kind_t;

/* Where a fault fires: when a step is issued, or at a point of the communicator's life. */
typedef enum {
    HCCL_FAULT_AT_STEP,
    HCCL_FAULT_AT_INIT,    /* after the bootstrap, before the links are set up */
    HCCL_FAULT_AT_IDLE,    /* nothing in flight: after init, or after collective seq finished */
    HCCL_FAULT_AT_DESTROY, /* inside hcclCommDestroy, before the peers are told goodbye */
    HCCL_FAULT_AT_SHRINK,  /* inside hcclCommShrink, once this rank has joined the exchange */
} hccl_fault_point_t;

typedef struct hccl_fault {
    hccl_fault_kind_t kind;
    hccl_fault_point_t at;
    int rank;
    int peer;              /* close: the link to cut */
    int64_t seq;           /* -1: any */
    int64_t step;          /* -1: any */
    int ms;                /* delay */
    bool fired;
    uint64_t fired_seq;    /* delay without seq: the last collective it stalled */
} hccl_fault_t;

typedef struct hccl_fault_set {
    int n;
    hccl_fault_t f[HCCL_FAULT_MAX];
} hccl_fault_set_t;

/* Parses spec into set (faults for every rank); WARNs about and skips malformed ones. */
void hccl_fault_parse(const char *spec, hccl_fault_set_t *set);

struct hcclComm;
/*
 * Reads HCCL_FAULT for comm (its rank) once, at creation; comm->faults stays NULL when
 * nothing applies to this rank, which is all the hot path looks at.
 */
void hccl_fault_attach(struct hcclComm *comm);
/* Once comm->exec and the lane exist: hooks the step faults into the executor and the lane
 * (nothing when there are none). */
void hccl_fault_enable_steps(struct hcclComm *comm);
void hccl_fault_detach(struct hcclComm *comm);
/* A point of comm's life was reached (seq: the collective that just finished, for idle). */
void hccl_fault_point(struct hcclComm *comm, hccl_fault_point_t at, uint64_t seq);

#endif /* HCCL_FAULT_H */
