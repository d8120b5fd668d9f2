/* The per-key comparison of two ranks' settings (hccl_config_diff) on arbitrary texts. */
#include <stdio.h>
#include <stdlib.h>

#include "core/wire.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char a[HCCL_CONFIG_TEXT_BYTES], b[HCCL_CONFIG_TEXT_BYTES], out[300];
    const uint8_t *split = memchr(data, 0, size);
    size_t na = split ? (size_t)(split - data) : size / 2;
    size_t nb = size - na - (split ? 1 : 0);
    int n;

    if (na >= sizeof(a))
        na = sizeof(a) - 1;
    if (nb >= sizeof(b))
        nb = sizeof(b) - 1;
    memcpy(a, data, na);
    a[na] = '\0';
    memcpy(b, data + size - nb, nb);
    b[nb] = '\0';
    n = hccl_config_diff(a, 0, b, 1, out, sizeof(out));
    if (strnlen(out, sizeof(out)) == sizeof(out) || (n == 0 && out[0]) || (n > 0 && !out[0]))
        abort();
    return 0;
}
