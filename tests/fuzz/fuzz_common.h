/* Shared by the libFuzzer targets: quiet logs, a byte reader over the input. */
#ifndef HCCL_FUZZ_COMMON_H
#define HCCL_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/base.h"

/* The communicator id and secret every seed frame carries (see make_seeds.c). */
#define FUZZ_COMM_ID 0x1122334455667788ull
#define FUZZ_SECRET_BYTE 0x5a

typedef struct {
    const uint8_t *p;
    size_t left;
} fuzz_in_t;

static inline uint8_t fuzz_byte(fuzz_in_t *in)
{
    uint8_t b = 0;

    if (in->left) {
        b = *in->p++;
        in->left--;
    }
    return b;
}

/* Errors are the expected outcome of most inputs: logging them would only slow the search. */
static inline void fuzz_quiet(void)
{
    hccl_log_init();
    hccl_log_level = HCCL_LOG_NONE;
}

static inline void fuzz_secret(uint8_t *s)
{
    memset(s, FUZZ_SECRET_BYTE, 32);
}

#endif
