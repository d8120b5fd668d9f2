/*
 * What hccl-run's ranks start with: the environment they share, the signal
 * set-up the supervision loop relies on, and per rank a fork, its own
 * environment, its CPU and the exec.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hccl-run.h"

#define RUN_SECRET_BYTES 16

/*
 * If the launcher was started with 0, 1 or 2 closed, a pipe could land on
 * one of them and the child's dup2 onto it would be a no-op that keeps
 * O_CLOEXEC; fill the holes first.
 */
void ensure_std_fds(void)
{
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) < 0)
            return;
    }
}

/* The kernel's ephemeral range: ports it hands to bind(port 0) and to outgoing connections. */
static int ephemeral_low(void)
{
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    int low = 32768, high;

    if (f) {
        if (fscanf(f, "%d %d", &low, &high) != 2)
            low = 32768;
        fclose(f);
    }
    return low;
}

static bool port_free(int port)
{
    struct sockaddr_in sa = {
        .sin_family = AF_INET,
        .sin_port = htons((uint16_t)port),
        .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
    };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    bool ok;

    if (fd < 0)
        return false;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    close(fd);
    return ok;
}

/*
 * A port below the kernel's ephemeral range: between this test and rank 0's listen, the port
 * is closed, and a port from the ephemeral range could meanwhile be handed to any socket of
 * the job's own ranks or of any other process (an outgoing connection, a listener on port 0).
 * Below the range only a program that names the port itself can take it.
 */
static int pick_free_port(int *port_p)
{
    int low = ephemeral_low(), span;
    unsigned seed = (unsigned)getpid();

    if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != (ssize_t)sizeof(seed))
        seed = (unsigned)getpid();

    span = low > 20000 ? low - 10000 : 0;
    for (int i = 0; span > 0 && i < 256; i++) {
        int port = 10000 + (int)(rand_r(&seed) % (unsigned)span);
        if (port_free(port)) {
            *port_p = port;
            return 0;
        }
    }
    /* No room below the range (or all taken): any port the kernel has free. */
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ret = -1;

    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0) {
        *port_p = ntohs(sa.sin_port);
        ret = 0;
    }
    close(fd);
    return ret;
}

static int make_secret(char hex[2 * RUN_SECRET_BYTES + 1])
{
    unsigned char raw[RUN_SECRET_BYTES];
    size_t got = 0;

    while (got < sizeof(raw)) {
        ssize_t n = getrandom(raw + got, sizeof(raw) - got, 0);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof(raw); i++)
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

/* What every rank shares goes into our own environment before the forks. */
int setup_env(const struct launcher *l)
{
    const struct run_opts *o = &l->opts;
    char buf[64];
    int port;

    if (o->comm_id != NULL && setenv("HCCL_COMM_ID", o->comm_id, 1) != 0)
        goto err_setenv;
    if (getenv("HCCL_COMM_ID") == NULL) {
        if (pick_free_port(&port) != 0) {
            fprintf(stderr, "hccl-run: cannot pick a rendezvous port on 127.0.0.1: %s\n",
                    strerror(errno));
            return -1;
        }
        snprintf(buf, sizeof(buf), "127.0.0.1:%d", port);
        if (setenv("HCCL_COMM_ID", buf, 1) != 0)
            goto err_setenv;
        /* Our own loopback rendezvous: the ranks only ever talk over loopback. */
        if (setenv("HCCL_SOCKET_IFNAME", "lo", 0) != 0)
            goto err_setenv;
    }
    /* Only we would know a secret we make up: fine for our ranks, not for other hosts'. */
    if (getenv("HCCL_COMM_SECRET") == NULL && o->world_size == o->nranks) {
        if (make_secret(buf) != 0) {
            fprintf(stderr, "hccl-run: getrandom: %s\n", strerror(errno));
            return -1;
        }
        if (setenv("HCCL_COMM_SECRET", buf, 1) != 0)
            goto err_setenv;
    } else if (getenv("HCCL_COMM_SECRET") == NULL) {
        fprintf(stderr,
                "hccl-run: HCCL_COMM_SECRET is not set: the rendezvous at %s is not "
                "authenticated\n",
                getenv("HCCL_COMM_ID"));
    }
    /* A rank that hangs can then say why when the timeout comes (unless the user set it to 0). */
    if (setenv("HCCL_DUMP_ON_SIGNAL", "1", 0) != 0)
        goto err_setenv;
    snprintf(buf, sizeof(buf), "%d", o->world_size);
    if (setenv("WORLD_SIZE", buf, 1) != 0)
        goto err_setenv;
    snprintf(buf, sizeof(buf), "%d", o->nranks);
    if (setenv("LOCAL_WORLD_SIZE", buf, 1) != 0)
        goto err_setenv;
    return 0;

err_setenv:
    fprintf(stderr, "hccl-run: setenv: %s\n", strerror(errno));
    return -1;
}

/*
 * Blocked before the first fork, so that an early SIGCHLD or Ctrl-C waits in
 * the signalfd instead of being lost or killing the launcher alone. SIGPIPE
 * is ignored so a closed stdout costs us tagged output, not the children.
 */
int setup_signals(struct launcher *l)
{
    struct sigaction ign = {.sa_handler = SIG_IGN};
    sigset_t set;

    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    if (sigprocmask(SIG_BLOCK, &set, &l->orig_mask) != 0)
        goto err;
    l->sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (l->sfd < 0)
        goto err;
    if (sigaction(SIGPIPE, &ign, &l->orig_sigpipe) != 0)
        goto err;
    /* Orphaned grandchildren come back to us, so we can wait for them. */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        goto err;
    return 0;

err:
    fprintf(stderr, "hccl-run: signal setup: %s\n", strerror(errno));
    return -1;
}

/* Pins the calling child to the rank-th CPU of the launcher's own set (modulo its size). */
static void bind_rank(const struct launcher *l, int rank)
{
    cpu_set_t allowed, one;
    int count, k = 0;

    if (l->opts.bind == BIND_NONE || sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
        return;
    count = CPU_COUNT(&allowed);
    if (count == 0 || (l->opts.bind == BIND_AUTO && l->opts.nranks > count))
        return;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &allowed) || k++ != rank % count)
            continue;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        if (sched_setaffinity(0, sizeof(one), &one) != 0)
            fprintf(stderr, "hccl-run: rank %d: cannot bind to CPU %d: %s\n", global_rank(l, rank),
                    cpu, strerror(errno));
        return;
    }
}

/* Runs in the forked child: never returns. */
__attribute__((noreturn)) static void child_exec(const struct launcher *l, int rank, int out_fd,
                                                 int err_fd)
{
    char buf[16];
    int err;

    /* Also done by the parent; whichever runs first wins the race to exec. */
    if (setpgid(0, rank == 0 ? 0 : l->pgid) != 0) {
        fprintf(stderr, "hccl-run: rank %d: setpgid: %s\n", global_rank(l, rank), strerror(errno));
        _exit(127);
    }
    if (out_fd >= 0 && (dup2(out_fd, STDOUT_FILENO) < 0 || dup2(err_fd, STDERR_FILENO) < 0))
        _exit(127);
    sigaction(SIGPIPE, &l->orig_sigpipe, NULL);
    sigprocmask(SIG_SETMASK, &l->orig_mask, NULL);
    /* The launcher is single-threaded, so setenv after fork is safe. */
    snprintf(buf, sizeof(buf), "%d", global_rank(l, rank));
    if (setenv("RANK_ID", buf, 1) != 0 || setenv("RANK", buf, 1) != 0)
        _exit(127);
    snprintf(buf, sizeof(buf), "%d", rank);
    if (setenv("LOCAL_RANK", buf, 1) != 0)
        _exit(127);
    bind_rank(l, rank);
    execvp(l->opts.argv[0], l->opts.argv);
    err = errno;
    fprintf(stderr, "hccl-run: cannot execute %s: %s\n", l->opts.argv[0], strerror(err));
    _exit(127);
}

int spawn_rank(struct launcher *l, int rank)
{
    struct run_rank *r = &l->ranks[rank];
    int out_w = -1, err_w = -1;
    pid_t pid;

    if (l->opts.tag_output && (stream_open(&r->out, STDOUT_FILENO, &out_w) != 0 ||
                               stream_open(&r->err, STDERR_FILENO, &err_w) != 0)) {
        fprintf(stderr, "hccl-run: cannot start rank %d: pipe: %s\n", global_rank(l, rank),
                strerror(errno));
        goto err_close_pipes;
    }
    pid = fork();
    if (pid < 0) {
        fprintf(stderr, "hccl-run: cannot start rank %d: fork: %s\n", global_rank(l, rank),
                strerror(errno));
        goto err_close_pipes;
    }
    if (pid == 0)
        child_exec(l, rank, out_w, err_w);
    if (rank == 0)
        l->pgid = pid;
    /* Fails harmlessly (EACCES) if the child already did it and exec'd. */
    setpgid(pid, l->pgid);
    r->pid = pid;
    r->alive = true;
    l->alive++;
    if (out_w >= 0)
        close(out_w); /* the child holds the write ends now; EOF comes when it is gone */
    if (err_w >= 0)
        close(err_w);
    return 0;

err_close_pipes:
    if (out_w >= 0)
        close(out_w);
    if (err_w >= 0)
        close(err_w);
    return -1;
}
