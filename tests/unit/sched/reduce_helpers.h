/*
 * Helpers of the reduction kernels' tests (test_reduce, test_reduce_float): an independent
 * reference codec of fp16 and bf16.
 */
#ifndef HCCL_TEST_REDUCE_HELPERS_H
#define HCCL_TEST_REDUCE_HELPERS_H

#include <stdint.h>

#include "sched/sched.h"

/* Independent decoder of a small IEEE binary format (fp16, bf16) into double. */
double ref_decode(uint32_t bits, int mbits, int ebits);
/* An fp16 or bf16 pattern (dt) as a double, by ref_decode. */
double narrow_decode(uint16_t h, hcclDataType_t dt);
/* f rounded to nearest even into fp16 or bf16 (dt), by the independent encoder. */
uint16_t narrow_encode(float f, hcclDataType_t dt);

#endif
