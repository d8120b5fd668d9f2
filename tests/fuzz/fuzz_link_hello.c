/*
 * What a data link's listener reads from a connecting process before trusting it: the tcp
 * hello (hccl_tcp_hello_check) and the shm doorbell hello (hccl_shm_hello_ok). An accepted
 * hello must carry the secret and name a valid rank.
 */
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_common.h"
#include "links/shm/shm.h"
#include "links/tcp/tcp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool quiet;
    fuzz_in_t in = {data, size};
    uint8_t secret[HCCL_SECRET_BYTES];
    int nranks = fuzz_byte(&in) % 16 + 2;
    int rank = fuzz_byte(&in) % nranks;
    tcp_hello_t th;
    shm_hello_t sh;

    if (!quiet) {
        fuzz_quiet();
        quiet = true;
    }
    fuzz_secret(secret);
    memset(&th, 0, sizeof(th));
    memcpy(&th, in.p, in.left < sizeof(th) ? in.left : sizeof(th));
    if (!hccl_tcp_hello_check(&th, FUZZ_COMM_ID, secret, rank, nranks) &&
        (memcmp(th.secret, secret, sizeof(secret)) != 0 || th.rank >= (uint32_t)nranks ||
         th.rank == (uint32_t)rank || th.comm_id != FUZZ_COMM_ID))
        abort();
    memset(&sh, 0, sizeof(sh));
    memcpy(&sh, in.p, in.left < sizeof(sh) ? in.left : sizeof(sh));
    if (hccl_shm_hello_ok(&sh, FUZZ_COMM_ID, secret, nranks) &&
        (memcmp(sh.secret, secret, sizeof(secret)) != 0 || sh.rank >= (uint32_t)nranks))
        abort();
    return 0;
}
