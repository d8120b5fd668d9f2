/* Helpers of the bootstrap's unit tests (bootstrap_helpers.h). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "bootstrap_helpers.h"
#include "hccl.h"

#define AR_COUNT 4099
#define WATCHDOG_S 40

int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int our_segments(char names[][128], int max)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024];
    int n = 0;

    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        char *p = strstr(line, "/dev/shm/hccl-");
        char name[128];
        bool seen = false;

        if (!p)
            continue;
        p += strlen("/dev/shm/");
        snprintf(name, sizeof(name), "%s", p);
        name[strcspn(name, " \n")] = '\0';
        for (int i = 0; i < n; i++)
            seen = seen || strcmp(names[i], name) == 0;
        if (!seen && n < max)
            snprintf(names[n++], 128, "%s", name);
    }
    fclose(f);
    return n;
}

int refusing_port(int *fd_p)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    *fd_p = fd;
    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        return -1;
    return ntohs(a.sin_port);
}

bool has_number(const char *text, long n)
{
    char want[32];
    size_t wl;

    snprintf(want, sizeof(want), "%ld", n);
    wl = strlen(want);
    for (const char *p = strstr(text, want); p; p = strstr(p + 1, want)) {
        bool left = p == text || !(p[-1] >= '0' && p[-1] <= '9');
        bool right = !(p[wl] >= '0' && p[wl] <= '9');
        if (left && right)
            return true;
    }
    return false;
}

void env_save(env_save_t *s, const char *name)
{
    const char *v = getenv(name);

    s->name = name;
    s->saved = v ? strdup(v) : NULL;
}

void env_restore(env_save_t *s)
{
    if (s->saved)
        setenv(s->name, s->saved, 1);
    else
        unsetenv(s->name);
    free(s->saved);
    s->saved = NULL;
}

hcclResult_t get_id_bounded(hcclUniqueId *id, int secs)
{
    env_save_t s;
    char v[16];
    hcclResult_t res;

    env_save(&s, "HCCL_CONNECT_TIMEOUT");
    snprintf(v, sizeof(v), "%d", secs);
    setenv("HCCL_CONNECT_TIMEOUT", v, 1);
    res = hcclGetUniqueId(id);
    env_restore(&s);
    return res;
}

static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    hcclComm_t comm = NULL;
    int64_t t0 = now_ms();

    if (a->how == INIT_RANK) {
        hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
        cfg.connectTimeoutMs = a->timeout_ms;
        a->res = hcclCommInitRankConfig(&comm, a->nranks, a->id, a->rank, &cfg);
    } else {
        a->res = hcclCommInitGroup(&comm, (uint32_t)a->nranks, a->commId, (uint32_t)a->rank);
    }
    a->elapsed_ms = now_ms() - t0;
    snprintf(a->err, sizeof(a->err), "%s", hcclGetLastError(NULL));
    if (a->res != hcclSuccess)
        return NULL;

    hcclCommCount(comm, &a->count);
    hcclCommUserRank(comm, &a->user_rank);
    a->nsegs = our_segments(a->segs, 16);
    if (a->allreduce) {
        float *send = malloc(AR_COUNT * sizeof(float));
        float *recv = malloc(AR_COUNT * sizeof(float));
        float n = (float)a->nranks;

        for (size_t i = 0; i < AR_COUNT; i++) {
            send[i] = (float)(a->rank + 1) * (float)(i % 13 + 1);
            recv[i] = -1.0f;
        }
        a->ar_res = hcclAllReduce(send, recv, AR_COUNT, hcclFloat32, hcclSum, comm);
        if (a->ar_res != hcclSuccess)
            snprintf(a->ar_err, sizeof(a->ar_err), "%s", hcclGetLastError(comm));
        for (size_t i = 0; i < AR_COUNT; i++)
            if (recv[i] != n * (n + 1) / 2 * (float)(i % 13 + 1))
                a->ar_bad++;
        free(send);
        free(recv);
    }
    a->destroy_res = hcclCommDestroy(comm);
    return NULL;
}

void run_ranks(rank_arg_t *args, int n)
{
    pthread_t th[MAX_RANKS];

    for (int i = 0; i < n; i++)
        assert_int_equal(pthread_create(&th[i], NULL, rank_main, &args[i]), 0);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
}

void expect_success(const rank_arg_t *args, int n)
{
    for (int r = 0; r < n; r++) {
        if (args[r].res != hcclSuccess || args[r].ar_res != hcclSuccess)
            print_error("rank %d of %d: init %d (%s), allreduce %d (%s)\n", r, n, args[r].res,
                        args[r].err, args[r].ar_res, args[r].ar_err);
        assert_int_equal(args[r].res, hcclSuccess);
        assert_int_equal(args[r].count, args[r].nranks);
        assert_int_equal(args[r].user_rank, args[r].rank);
        assert_int_equal(args[r].ar_res, hcclSuccess);
        assert_int_equal(args[r].ar_bad, 0);
        assert_int_equal(args[r].destroy_res, hcclSuccess);
    }
}

/* ---- fixtures ---- */

int setup_watchdog(void **state)
{
    (void)state;
    alarm(WATCHDOG_S); /* a hung test kills the process rather than the CTest budget */
    return 0;
}

int teardown_watchdog(void **state)
{
    (void)state;
    alarm(0);
    return 0;
}
