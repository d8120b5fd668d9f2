/*
 * epoll_loop: the communicator's completion fd in a plain epoll loop, beside
 * another descriptor (a 1 ms timerfd standing in for the program's own work).
 *
 *   hccl-run -n 4 ./epoll_loop                 # 64 AllReduces, 4 in flight
 *   hccl-run -n 2 ./epoll_loop --total 1000 --window 8
 *
 * The communicator keeps its own progress thread; the program never blocks in
 * hccl. It adds hcclCommGetCompletionFd's descriptor to its epoll set. When
 * that fd is readable it reads the 8-byte counter (how many requests completed
 * since the last read), hcclTests the requests it holds, checks each finished
 * one's data and posts the next, keeping a window of requests in flight. The
 * same pattern works with poll(), libuv or asyncio.
 *
 * Checks: every result, and that the counter read from the fd adds up to
 * exactly the number of requests completed. Exit 1 otherwise.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "hccl.h"

static int g_rank = -1;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        hcclResult_t r_ = (call);                                                                  \
        if (r_ != hcclSuccess) {                                                                   \
            fprintf(stderr, "rank %d: %s failed: %s: %s\n", g_rank, #call, hcclGetErrorString(r_), \
                    hcclGetLastError(NULL));                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define MAX_WINDOW 64

typedef struct {
    hcclRequest_t req; /* NULL when the slot is free */
    int32_t *buf;
    size_t count;
    int serial; /* which request of the run this slot carries */
} slot_t;

/* Request k's size varies so that requests finish out of posting order now and then. */
static size_t count_of(int k)
{
    return (size_t)1 << (4 + (k * 5) % 14); /* 16 elements to 128 Ki elements */
}

static void post(hcclComm_t comm, slot_t *s, int serial)
{
    s->serial = serial;
    s->count = count_of(serial);
    for (size_t i = 0; i < s->count; i++)
        s->buf[i] = g_rank + serial + (int32_t)(i % 11);
    CHECK(hcclAllReduceAsync(s->buf, s->buf, s->count, hcclInt32, hcclSum, comm, &s->req));
}

static int check(const slot_t *s, int n)
{
    for (size_t i = 0; i < s->count; i++) {
        int32_t want = n * (n - 1) / 2 + n * (s->serial + (int32_t)(i % 11));
        if (s->buf[i] != want) {
            fprintf(stderr, "rank %d: request %d element %zu is %d, want %d\n", g_rank, s->serial,
                    i, s->buf[i], want);
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    int total = 64, window = 4, n, epfd, tfd, cfd, posted = 0, completed = 0, bad = 0;
    uint64_t counted = 0, ticks = 0, wakeups = 0;
    struct itimerspec every_ms = {{0, 1000000}, {0, 1000000}};
    struct epoll_event ev, events[2];
    slot_t slots[MAX_WINDOW];
    hcclComm_t comm;
    struct timespec t0, t1;

    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--total"))
            total = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--window"))
            window = atoi(argv[i + 1]);
        else
            break;
    }
    if (argc % 2 == 0 || total < 1 || window < 1 || window > MAX_WINDOW) {
        fprintf(stderr, "usage: %s [--total N] [--window 1..%d]\n", argv[0], MAX_WINDOW);
        return 2;
    }
    CHECK(hcclCommInitFromEnv(&comm));
    CHECK(hcclCommUserRank(comm, &g_rank));
    CHECK(hcclCommCount(comm, &n));
    CHECK(hcclCommGetCompletionFd(comm, &cfd)); /* owned by comm: never closed here */

    epfd = epoll_create1(EPOLL_CLOEXEC);
    tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (epfd < 0 || tfd < 0 || timerfd_settime(tfd, 0, &every_ms, NULL) != 0) {
        fprintf(stderr, "rank %d: epoll/timerfd: %s\n", g_rank, strerror(errno));
        return 1;
    }
    ev.events = EPOLLIN;
    ev.data.fd = cfd;
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, cfd, &ev) != 0)
        return perror("epoll_ctl"), 1;
    ev.data.fd = tfd;
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, tfd, &ev) != 0)
        return perror("epoll_ctl"), 1;

    for (int w = 0; w < window; w++) {
        slots[w].req = NULL;
        slots[w].buf = malloc(((size_t)1 << 17) * sizeof(int32_t)); /* the largest count */
        if (!slots[w].buf)
            return fprintf(stderr, "out of memory\n"), 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int w = 0; w < window && posted < total; w++)
        post(comm, &slots[w], posted++);

    while (completed < total) {
        int nev = epoll_wait(epfd, events, 2, 10000);
        if (nev < 0 && errno == EINTR)
            continue;
        if (nev <= 0) {
            fprintf(stderr, "rank %d: no completion for 10 s (%d of %d done)\n", g_rank, completed,
                    total);
            return 1;
        }
        for (int e = 0; e < nev; e++) {
            uint64_t v;
            if (events[e].data.fd == tfd) {
                if (read(tfd, &v, sizeof(v)) == sizeof(v))
                    ticks += v; /* the program's own periodic work would run here */
                continue;
            }
            /* The completion fd: take the count, then find which requests finished. */
            if (read(cfd, &v, sizeof(v)) == sizeof(v))
                counted += v;
            wakeups++;
            for (int w = 0; w < window; w++) {
                int done = 0;
                if (!slots[w].req)
                    continue;
                CHECK(hcclTest(&slots[w].req, &done)); /* never blocks */
                if (!done)
                    continue;
                completed++;
                bad |= check(&slots[w], n);
                if (posted < total)
                    post(comm, &slots[w], posted++);
            }
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    /* A request is marked done just before its count is added to the fd, so the last counts
     * may land after the loop saw the requests done: wait for them (bounded). */
    for (int waited_ms = 0; counted < (uint64_t)completed && waited_ms < 5000; waited_ms += 100) {
        int nev = epoll_wait(epfd, events, 2, 100);
        for (int e = 0; e < nev; e++) {
            uint64_t v;
            if (events[e].data.fd == cfd && read(cfd, &v, sizeof(v)) == sizeof(v))
                counted += v;
            else if (events[e].data.fd == tfd && read(tfd, &v, sizeof(v)) == sizeof(v))
                ticks += v;
        }
    }
    if (counted != (uint64_t)completed) {
        fprintf(stderr,
                "rank %d: the completion fd counted %llu completions, %d requests "
                "completed\n",
                g_rank, (unsigned long long)counted, completed);
        bad = 1;
    }
    CHECK(hcclAllReduce(&bad, &bad, 1, hcclInt32, hcclMax, comm));
    printf("rank %d: %d AllReduces (%d in flight) in %.1f ms, %llu completion-fd wake-ups, "
           "%llu timer ticks served meanwhile\n",
           g_rank, completed, window,
           (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6,
           (unsigned long long)wakeups, (unsigned long long)ticks);
    CHECK(hcclCommDestroy(comm));
    close(tfd);
    close(epfd);
    for (int w = 0; w < window; w++)
        free(slots[w].buf);
    if (g_rank == 0)
        printf("epoll_loop: %s\n", bad ? "FAILED"
                                       : "all results and completion counts checked "
                                         "on every rank");
    return bad;
}
