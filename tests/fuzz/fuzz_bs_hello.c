/*
 * The rendezvous' check of a rank's hello (hccl_bs_hello_check), then what the rendezvous does
 * with an accepted one: compare its settings with another rank's (hccl_config_diff).
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/wire.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char ref[HCCL_CONFIG_TEXT_BYTES];
    hccl_bs_hello_t h;
    uint8_t secret[HCCL_SECRET_BYTES];
    char diff[800];
    const char *why;

    if (!ref[0]) {
        hccl_params_t p;
        fuzz_quiet();
        memset(&p, 0, sizeof(p));
        p.buffsize = 4u << 20;
        p.calibrate = 1;
        hccl_config_describe(&p, ref, sizeof(ref));
    }
    fuzz_secret(secret);
    memset(&h, 0, sizeof(h));
    memcpy(&h, data, size < sizeof(h) ? size : sizeof(h));
    why = hccl_bs_hello_check(&h, secret);
    if (why)
        return 0;
    if (strnlen(h.errmsg, sizeof(h.errmsg)) == sizeof(h.errmsg) ||
        strnlen(h.config, sizeof(h.config)) == sizeof(h.config) ||
        h.rank < 0 || h.rank >= h.nranks)
        abort(); /* accepted but not safe to use */
    if (hccl_config_diff(ref, 0, h.config, h.rank, diff, sizeof(diff)) > 0 &&
        strnlen(diff, sizeof(diff)) == sizeof(diff))
        abort();
    return 0;
}
