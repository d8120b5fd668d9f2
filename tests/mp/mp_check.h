/* The multi-process tests' check of an hccl call: on failure, which rank, which call and why,
 * then exit(1). The test defines int g_rank (-1 until it knows its rank). */
#ifndef HCCL_MP_CHECK_H
#define HCCL_MP_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "hccl.h"

#define CHECK(call)                                                                                \
    do {                                                                                           \
        hcclResult_t r_ = (call);                                                                  \
        if (r_ != hcclSuccess) {                                                                   \
            fprintf(stderr, "rank %d: %s failed: %s (%s)\n", g_rank, #call,                        \
                    hcclGetErrorString(r_), hcclGetLastError(NULL));                               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#endif /* HCCL_MP_CHECK_H */
