/*
 * A Broadcast root that runs ahead of its receivers (bench/runahead.sh, ctest mp_runahead):
 *
 *   mp_runahead --count N --bytes B --lag-ms MS
 *
 * Rank 0 broadcasts N messages of B bytes, one blocking call after the other, while the other
 * ranks wait MS ms before they call their first: what the library holds for them meanwhile
 * shows in their RSS. Every message is checked. Each rank prints one line:
 *   root: N broadcasts of B bytes, K of them done before the receivers began
 *   rank R: N broadcasts of B bytes checked; RSS after init A KiB, before the first call
 *           H KiB, peak P KiB
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hccl.h"

static long status_kib(const char *field)
{
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    FILE *f = fopen("/proc/self/status", "r");

    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, field, n) && line[n] == ':')
            v = atol(line + n + 1);
    fclose(f);
    return v;
}

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

int main(int argc, char **argv)
{
    long count = 1000, lag_ms = 1000;
    size_t bytes = 1024;
    int rank, nranks;
    hcclComm_t comm;
    unsigned char *buf;

    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--count"))
            count = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--bytes"))
            bytes = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--lag-ms"))
            lag_ms = atol(argv[i + 1]);
    }
    if (hcclCommInitFromEnv(&comm) != hcclSuccess) {
        fprintf(stderr, "init: %s\n", hcclGetLastError(NULL));
        return 1;
    }
    hcclCommUserRank(comm, &rank);
    hcclCommCount(comm, &nranks);
    buf = malloc(bytes ? bytes : 1);
    if (!buf || hcclBarrier(comm) != hcclSuccess)
        return 1;
    if (rank == 0) {
        double start = now_ms();
        long before = 0;

        for (long i = 0; i < count; i++) {
            memset(buf, (int)(i & 0xff), bytes);
            if (hcclBroadcast(buf, bytes, hcclUint8, 0, comm) != hcclSuccess) {
                fprintf(stderr, "root: broadcast %ld: %s\n", i, hcclGetLastError(comm));
                return 1;
            }
            if (now_ms() - start < (double)lag_ms)
                before = i + 1;
        }
        printf("root: %ld broadcasts of %zu bytes, %ld of them done before the receivers began\n",
               count, bytes, before);
    } else {
        long base = status_kib("VmRSS"), held;
        struct timespec lag = {lag_ms / 1000, (lag_ms % 1000) * 1000000L};

        nanosleep(&lag, NULL);
        held = status_kib("VmRSS");
        for (long i = 0; i < count; i++) {
            if (hcclBroadcast(buf, bytes, hcclUint8, 0, comm) != hcclSuccess) {
                fprintf(stderr, "rank %d: broadcast %ld: %s\n", rank, i, hcclGetLastError(comm));
                return 1;
            }
            for (size_t j = 0; j < bytes; j++)
                if (buf[j] != (unsigned char)(i & 0xff)) {
                    fprintf(stderr, "rank %d: broadcast %ld: byte %zu is %u\n", rank, i, j, buf[j]);
                    return 1;
                }
        }
        printf("rank %d: %ld broadcasts of %zu bytes checked; RSS after init %ld KiB, before the "
               "first call %ld KiB, peak %ld KiB\n",
               rank, count, bytes, base, held, status_kib("VmHWM"));
    }
    free(buf);
    return hcclCommDestroy(comm) == hcclSuccess ? 0 : 1;
}
