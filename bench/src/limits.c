/*
 * limits.c - what this machine allows, to put the collectives' busbw next to:
 *
 *   memcpy  one thread copying a private buffer of SIZE bytes to another
 *           (the rate of any copy-in/copy-out shared-memory transport)
 *   cma     process_vm_readv of SIZE bytes out of another process (the
 *           single-copy path hccl and Open MPI take for large messages)
 *   tcp     one TCP stream over 127.0.0.1 between two processes, written
 *           SIZE bytes at a time (the TCP transports' ceiling)
 *   xcore   SIZE bytes (at most 512 KiB) copied into shared memory by a
 *           process on CPU 0 and out of it by one on CPU 1, in turns: what a
 *           copy-in/copy-out transport gets across two cores. On a VM it
 *           varies by 3-4x from minute to minute (with where the host runs
 *           the two virtual CPUs), so it tells which kind of minute a run had.
 *
 * Usage: limits SIZE[,SIZE...]     (K/M/G suffixes)
 * Prints CSV rows "limit,size,gbps" (GB/s = 1e9 bytes/s): per size the best
 * of 3 rounds, each round repeating the transfer for >= 0.1 s.  Best-of
 * because the question is what the hardware can do, not what it usually does.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 3
#define MIN_ROUND_S 0.1

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
    perror(what);
    exit(1);
}

static char *alloc(size_t n)
{
    char *p;
    if (posix_memalign((void **)&p, 4096, n))
        die("posix_memalign");
    memset(p, 1, n); /* fault the pages in before any timing */
    return p;
}

/* Round = repeat f(size) until MIN_ROUND_S passed; returns the best rate. */
static double best_rate(size_t size, void (*f)(size_t))
{
    double best = 0;
    for (int r = 0; r < ROUNDS; r++) {
        long n = 0;
        double t0 = now_s(), t;
        do {
            f(size);
            n++;
        } while ((t = now_s() - t0) < MIN_ROUND_S);
        double rate = (double)size * n / t / 1e9;
        best = rate > best ? rate : best;
    }
    return best;
}

static char *src, *dst;
static pid_t peer_pid;

static void do_memcpy(size_t size)
{
    memcpy(dst, src, size);
    __asm__ volatile("" ::: "memory"); /* the copy must happen every time */
}

static void do_cma(size_t size)
{
    /* src is the child's copy of the buffer (same address after fork). */
    for (size_t done = 0; done < size;) {
        struct iovec l = {dst + done, size - done}, r = {src + done, size - done};
        ssize_t got = process_vm_readv(peer_pid, &l, 1, &r, 1, 0);
        if (got <= 0)
            die("process_vm_readv (needs ptrace permission: same user, yama ptrace_scope 0 or root)");
        done += (size_t)got;
    }
}

static int sock;

static void do_tcp(size_t size)
{
    for (size_t done = 0; done < size;) {
        ssize_t w = write(sock, src + done, size - done);
        if (w <= 0)
            die("write");
        done += (size_t)w;
    }
}

/* TCP: the child reads everything and answers one byte when the parent
 * sends the end mark (shutdown of its writing side), so that the time covers
 * the data's arrival, not just the copy into the socket buffer. */
static double tcp_rate(size_t size)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 1) ||
        getsockname(lfd, (struct sockaddr *)&sa, &sl))
        die("tcp listen");
    double best = 0;
    for (int r = 0; r < ROUNDS; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            int s = socket(AF_INET, SOCK_STREAM, 0);
            static char buf[1 << 20];
            if (connect(s, (struct sockaddr *)&sa, sizeof sa))
                die("connect");
            while (read(s, buf, sizeof buf) > 0)
                ;
            if (write(s, "k", 1) != 1)
                die("ack");
            _exit(0);
        }
        sock = accept(lfd, NULL, NULL);
        if (sock < 0)
            die("accept");
        setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        long n = 0;
        double t0 = now_s(), t;
        do {
            do_tcp(size);
            n++;
        } while (now_s() - t0 < MIN_ROUND_S);
        char ack;
        shutdown(sock, SHUT_WR);
        if (read(sock, &ack, 1) != 1)
            die("read ack");
        t = now_s() - t0;
        close(sock);
        waitpid(pid, NULL, 0);
        double rate = (double)size * n / t / 1e9;
        best = rate > best ? rate : best;
    }
    close(lfd);
    return best;
}

static void pin(int cpu)
{
    cpu_set_t set;

    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof(set), &set); /* best effort */
}

/* xcore: turn 2k+1 is the writer's copy in, 2k+2 the reader's copy out; -1 stops the reader. */
static double xcore_rate(size_t size)
{
    size_t n = size < (512u << 10) ? size : (512u << 10);
    char *shared = mmap(NULL, n + 64, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    _Atomic long *turn;
    double best = 0;
    cpu_set_t was;
    pid_t pid;

    if (shared == MAP_FAILED)
        die("mmap");
    if (sched_getaffinity(0, sizeof(was), &was) != 0)
        die("sched_getaffinity");
    turn = (_Atomic long *)(shared + n);
    atomic_store(turn, 0);
    pid = fork();
    if (pid == 0) {
        pin(1);
        for (long k = 0;; k++) {
            long t;
            while ((t = atomic_load(turn)) != 2 * k + 1 && t != -1)
                ;
            if (t == -1)
                _exit(0);
            memcpy(dst, shared, n);
            atomic_store(turn, 2 * k + 2);
        }
    }
    pin(0);
    long k = 0;
    for (int r = 0; r < ROUNDS; r++) {
        long m = 0;
        double t0 = now_s(), t;
        do {
            memcpy(shared, src, n);
            atomic_store(turn, 2 * k + 1);
            while (atomic_load(turn) != 2 * k + 2)
                ;
            k++;
            m++;
        } while ((t = now_s() - t0) < MIN_ROUND_S);
        double rate = 2.0 * (double)n * m / t / 1e9; /* two copies per turn */
        best = rate > best ? rate : best;
    }
    atomic_store(turn, -1);
    waitpid(pid, NULL, 0);
    munmap(shared, n + 64);
    sched_setaffinity(0, sizeof(was), &was);
    return best;
}

static size_t parse_bytes(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1024;
    if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
    if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
    return (size_t)v;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: limits SIZE[,SIZE...]\n");
        return 2;
    }
    printf("limit,size,gbps\n");
    char *save = NULL;
    for (char *t = strtok_r(argv[1], ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        size_t size = parse_bytes(t);
        if (!size)
            continue;
        src = alloc(size);
        dst = alloc(size);
        printf("memcpy,%zu,%.3f\n", size, best_rate(size, do_memcpy));
        fflush(stdout);

        int ready[2];
        if (pipe(ready))
            die("pipe");
        peer_pid = fork();
        if (peer_pid == 0) { /* holds its copy of src until killed */
            close(ready[0]);
            memset(src, 2, size); /* its own pages, not shared copy-on-write ones */
            if (write(ready[1], "r", 1) != 1)
                _exit(1);
            pause();
            _exit(0);
        }
        char c;
        close(ready[1]);
        if (read(ready[0], &c, 1) != 1)
            die("child");
        close(ready[0]);
        printf("cma,%zu,%.3f\n", size, best_rate(size, do_cma));
        kill(peer_pid, SIGKILL);
        waitpid(peer_pid, NULL, 0);

        printf("tcp,%zu,%.3f\n", size, tcp_rate(size));
        if (sysconf(_SC_NPROCESSORS_ONLN) >= 2)
            printf("xcore,%zu,%.3f\n", size, xcore_rate(size));
        fflush(stdout);
        free(src);
        free(dst);
    }
    return 0;
}
