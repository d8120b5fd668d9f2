/*
 * Programs for the hang report and clean-up tests, run under hccl-run:
 *   mp_dump hang        every rank but the last posts an AllReduce after a first one that all
 *                       ran; the last posts a receive from rank 0 instead, which never sends.
 *                       Nobody finishes: hccl-run's timeout must collect every rank's report.
 *   mp_dump init-crash  rank 0 kills itself with SIGKILL as soon as its shm segment exists
 *                       (inside hcclCommInitFromEnv, which waits for rank 1); rank 1 never
 *                       joins and waits to be ended.
 *   mp_dump mid-crash   rank 0 kills itself with SIGKILL after a first AllReduce.
 *   mp_dump ok          one AllReduce, checked, and a clean destroy.
 * Every rank prints "rank R pid P" first, so that a test can find what a dead rank left.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "hccl.h"

#define COUNT 4096

static void die(const char *what, hcclComm_t comm)
{
    fprintf(stderr, "mp_dump: %s failed: %s\n", what, hcclGetLastError(comm));
    exit(1);
}

/* Our segments are "hccl-" + 8 hex digits (pid namespace) + our pid in 8 hex digits + more. */
static int is_my_segment(const char *name, const char *pid_hex)
{
    return strncmp(name, "hccl-", 5) == 0 && strlen(name) >= 21 && strncmp(name + 13, pid_hex, 8) == 0;
}

/* Waits (inotify, no polling) for our shm segment to appear, then dies by SIGKILL. */
static void *kill_when_segment_exists(void *arg)
{
    char pid_hex[16], buf[4096] __attribute__((aligned(8)));
    int fd = inotify_init1(IN_CLOEXEC);
    DIR *d;
    struct dirent *e;

    (void)arg;
    snprintf(pid_hex, sizeof(pid_hex), "%08x", (unsigned)getpid());
    if (fd < 0 || inotify_add_watch(fd, "/dev/shm", IN_CREATE) < 0) {
        perror("mp_dump: inotify");
        exit(1);
    }
    /* Watch first, then look: a segment made in between is seen by one or the other. */
    if ((d = opendir("/dev/shm"))) {
        while ((e = readdir(d)))
            if (is_my_segment(e->d_name, pid_hex))
                kill(getpid(), SIGKILL);
        closedir(d);
    }
    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            perror("mp_dump: read(inotify)");
            exit(1);
        }
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            if (ev->len && is_my_segment(ev->name, pid_hex))
                kill(getpid(), SIGKILL);
            p += sizeof(*ev) + ev->len;
        }
    }
    return NULL;
}

static void allreduce_checked(hcclComm_t comm, int rank, int nranks)
{
    static float buf[COUNT];

    for (int i = 0; i < COUNT; i++)
        buf[i] = (float)(rank + 1);
    if (hcclAllReduce(buf, buf, COUNT, hcclFloat32, hcclSum, comm) != hcclSuccess)
        die("hcclAllReduce", comm);
    for (int i = 0; i < COUNT; i++) {
        if (buf[i] != (float)(nranks * (nranks + 1) / 2)) {
            fprintf(stderr, "mp_dump: rank %d: wrong sum %g at %d\n", rank, buf[i], i);
            exit(1);
        }
    }
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "hang";
    const char *rank_env = getenv("RANK_ID");
    int rank = rank_env ? atoi(rank_env) : 0, nranks = 0;
    hcclComm_t comm = NULL;
    static float buf[COUNT];
    hcclRequest_t req;
    pthread_t th;

    printf("rank %d pid %d\n", rank, (int)getpid());
    fflush(stdout);
    if (strcmp(mode, "init-crash") == 0) {
        if (rank != 0)
            for (;;)
                pause(); /* never joins: rank 0 stays inside init until it dies */
        if (pthread_create(&th, NULL, kill_when_segment_exists, NULL) != 0)
            return 1;
    }
    if (hcclCommInitFromEnv(&comm) != hcclSuccess)
        die("hcclCommInitFromEnv", NULL);
    if (hcclCommCount(comm, &nranks) != hcclSuccess)
        die("hcclCommCount", comm);
    allreduce_checked(comm, rank, nranks);
    if (strcmp(mode, "mid-crash") == 0 && rank == 0)
        kill(getpid(), SIGKILL);
    if (strcmp(mode, "hang") == 0) {
        if (rank == nranks - 1) {
            if (hcclRecvAsync(buf, COUNT, hcclFloat32, 0, comm, &req) != hcclSuccess)
                die("hcclRecvAsync", comm);
        } else if (hcclAllReduceAsync(buf, buf, COUNT, hcclFloat32, hcclSum, comm, &req) !=
                   hcclSuccess) {
            die("hcclAllReduceAsync", comm);
        }
        printf("rank %d posted its last call\n", rank);
        fflush(stdout);
        hcclWait(&req); /* never returns: hccl-run's timeout ends us */
        fprintf(stderr, "mp_dump: rank %d: the hung call returned\n", rank);
        return 1;
    }
    if (hcclCommDestroy(comm) != hcclSuccess)
        die("hcclCommDestroy", NULL);
    printf("rank %d ok\n", rank);
    return 0;
}
