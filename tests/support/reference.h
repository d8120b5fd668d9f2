/*
 * Reference values for the sim tests: input values exact in every dtype, store and load of
 * every dtype through double, the reduction of all ranks' inputs computed in double (integers
 * exactly, modulo 2^bits), and the tolerance a float result is held to.
 */
#ifndef HCCL_TEST_REFERENCE_H
#define HCCL_TEST_REFERENCE_H

#include <stdbool.h>
#include <stddef.h>

#include "sched/sched.h"

bool ref_is_int(hcclDataType_t dt);
bool ref_is_signed(hcclDataType_t dt);

/* Input value of element i at rank r, small enough to be exact in every float type. */
double ref_input(hcclDataType_t dt, hcclRedOp_t op, int r, size_t i, unsigned seed);

/* Element i of buf as dtype dt. */
void ref_store(void *buf, size_t i, hcclDataType_t dt, double v);
double ref_load(const void *buf, size_t i, hcclDataType_t dt);

/* op over ref_input(dt, op, r, i, seed) for r in [0, n), as dtype dt computes it. */
double ref_reduce(hcclDataType_t dt, hcclRedOp_t op, int n, size_t i, unsigned seed);

/* How far a float result may be from ref. */
double ref_tolerance(hcclDataType_t dt, double ref);

/* got == want for integers, within ref_tolerance for floats. */
bool ref_close(hcclDataType_t dt, double got, double want);

#endif
