/*
 * hccl-run: starts N ranks of a program on this host with the environment
 * hcclCommInitFromEnv expects, and makes sure none of them outlives it.
 * For a job over several hosts, one hccl-run per host starts that host's
 * share of the ranks (--world-size, --rank-offset) and all of them meet at
 * one rendezvous (--comm-id).
 *
 * One thread, one poll loop. The signals we care about (SIGCHLD and the
 * ones we forward) stay blocked and are read from a signalfd, so child
 * exits, forwarded signals, deadlines and tagged output are all events of
 * the same loop: no handler races, no sleeps. All ranks share one process
 * group led by rank 0, so one kill(-pgid) reaches them and whatever they
 * forked; the launcher is a child subreaper, so orphaned grandchildren are
 * reparented to it and reaped here too.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RUN_KILL_DELAY_S    2.0         /* SIGTERM (or a forwarded signal) -> SIGKILL */
#define RUN_GIVE_UP_S       2.0         /* after SIGKILL, how long strays may linger */
#define RUN_DEFAULT_GRACE_S 3.0         /* a rank failed -> the others may exit on their own */
#define RUN_MAX_RANKS       65536
#define RUN_LINE_MAX        (32 * 1024) /* longer lines are split, each piece tagged */
#define RUN_TAG_MAX         16          /* "[65535]: " */
#define RUN_SECRET_BYTES    16
#define RUN_DUMP_WAIT_S     2.0         /* timeout -> how long the ranks' state reports may take */
/* The library's last line of a SIGUSR1 state report (src/core/dump.c). */
#define RUN_DUMP_END        "state dump: end of report"

enum run_phase {
    PHASE_RUNNING,     /* no rank has failed yet */
    PHASE_GRACE,       /* a rank failed; the others have until grace_at to exit */
    PHASE_DUMPING,     /* timed out; the ranks asked for their state have until dump_until */
    PHASE_TERMINATING, /* SIGTERM or a forwarded signal sent; SIGKILL at kill_at */
    PHASE_KILLED,      /* SIGKILL sent; only reaping is left */
};

struct run_stream {
    int fd;     /* read end of the rank's pipe, owned; -1 once closed */
    int out_fd; /* launcher's stdout or stderr, borrowed */
    size_t len; /* bytes in buf not yet written (no newline among them) */
    char *buf;  /* RUN_LINE_MAX bytes, owned */
    bool dump_done; /* a line ended a state report */
};

struct run_rank {
    pid_t pid;             /* 0 if never started */
    bool alive;            /* started and not reaped yet */
    bool dump_asked;       /* sent SIGUSR1 for a state report at the timeout */
    struct run_stream out; /* used with --tag-output only */
    struct run_stream err;
};

/* --bind: auto pins each rank to its own CPU when there are enough of them, as mpirun does:
 * ranks that wait by polling then never share a core with each other. */
enum { BIND_AUTO, BIND_CORE, BIND_NONE };

struct run_opts {
    int nranks;          /* ranks started here */
    int world_size;      /* ranks in the whole job; 0 until parsed: then nranks */
    int rank_offset;     /* global rank of our first rank */
    const char *comm_id; /* --comm-id, borrowed from argv; NULL: none */
    double timeout_s;    /* 0: none */
    int bind;            /* BIND_* */
    bool tag_output;
    char **argv; /* program and its arguments, borrowed from main's argv */
};

struct launcher {
    struct run_opts opts;
    struct run_rank *ranks; /* opts.nranks entries, owned */
    int alive;              /* ranks started and not reaped yet */
    pid_t pgid;             /* rank 0's pid; 0 before it is forked */
    int sfd;                /* signalfd, owned */
    sigset_t orig_mask;     /* restored in the children */
    struct sigaction orig_sigpipe;
    enum run_phase phase;
    double grace_s;
    double timeout_at; /* deadlines in CLOCK_MONOTONIC seconds; 0: unset */
    double grace_at;
    double kill_at;
    double give_up_at;
    double dump_until;
    int exit_code;   /* the first reason to fail wins */
    int fatal_sig;   /* a forwarded signal we then die of ourselves; 0: none */
    int nfds;        /* 1 + 2 * nranks */
    struct pollfd *pfds;        /* [0] the signalfd, then each rank's out and err; owned */
    struct run_stream **owner;  /* stream behind pfds[i], i >= 1; owned array */
};

static const char usage_text[] =
    "usage: hccl-run -n N [--world-size W [--rank-offset K]] [--comm-id HOST:PORT]\n"
    "                [--timeout S] [--tag-output] [--] PROGRAM [ARGS...]\n"
    "Starts N ranks of PROGRAM on this host.\n"
    "  -n N               number of ranks started here (1 or more)\n"
    "  --world-size W     ranks in the whole job, over all hosts (default N)\n"
    "  --rank-offset K    global rank of the first rank started here (default 0;\n"
    "                     needs --world-size); K + N must not exceed W\n"
    "  --comm-id H:P      rendezvous address, set as HCCL_COMM_ID; rank 0's host\n"
    "                     must own H\n"
    "  --timeout S        stop all ranks after S seconds (fractions allowed); exit 124\n"
    "  --tag-output       prefix each line of output with \"[rank]: \" (global rank)\n"
    "  --bind auto|core|none  pin rank i to the i-th CPU this launcher may use (auto:\n"
    "                     only when there is one for every rank; the default)\n"
    "  -h, --help         show this text\n"
    "Rank i started here gets RANK_ID=RANK=K+i, LOCAL_RANK=i, WORLD_SIZE=W and\n"
    "LOCAL_WORLD_SIZE=N. Unless set already (or by --comm-id), HCCL_COMM_ID is\n"
    "127.0.0.1 and a free port, and then HCCL_SOCKET_IFNAME defaults to lo; with\n"
    "HCCL_COMM_ID given explicitly, HCCL_SOCKET_IFNAME is left alone (the\n"
    "library then picks the first non-loopback interface that is up; set it to\n"
    "the interface the hosts share). HCCL_COMM_SECRET, unless set, is random;\n"
    "a job over several hosts (W > N) needs --comm-id or HCCL_COMM_ID, and the\n"
    "same HCCL_COMM_SECRET set on every host (without one, the rendezvous is\n"
    "not authenticated). One hccl-run per host, for example:\n"
    "  host a: hccl-run -n 2 --world-size 4 --comm-id a:29500 ./prog\n"
    "  host b: hccl-run -n 2 --world-size 4 --rank-offset 2 --comm-id a:29500 ./prog\n"
    "When a rank fails, the others get HCCL_RUN_GRACE_S seconds (default 3) to\n"
    "exit before they are terminated. SIGINT, SIGTERM and SIGHUP are forwarded.\n"
    "At the timeout, ranks that catch SIGUSR1 (hccl does when HCCL_DUMP_ON_SIGNAL=1,\n"
    "which is set unless given) are first sent it and write what each of their\n"
    "requests waits for; they get up to 2 s for it.\n"
    "Exit status: 0 if every rank exited 0, 124 on timeout, 128+n after a\n"
    "forwarded signal n, 2 on bad usage, 1 otherwise.\n";

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bool parse_seconds(const char *s, bool allow_zero, double *out_p)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v < 0 || (v == 0 && !allow_zero))
        return false;
    *out_p = v;
    return true;
}

/* A whole decimal number in [min, max]. */
static bool parse_int(const char *s, long min, long max, int *out_p)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < min || v > max)
        return false;
    *out_p = (int)v;
    return true;
}

/* HOST:PORT or [V6HOST]:PORT; only the shape is checked, the library resolves it. */
static bool comm_id_is_valid(const char *s)
{
    const char *colon = strrchr(s, ':');
    int port;

    return colon != NULL && colon != s && parse_int(colon + 1, 1, 65535, &port);
}

/* The options that take a value, as "--opt V" or "--opt=V" (and "-nV"). */
static const char *const value_opts[] = {
    "-n", "--timeout", "--bind", "--world-size", "--rank-offset", "--comm-id",
};

/* Splits argv[*i] into option name and value; NULL if it is none of value_opts. */
static const char *split_value_opt(int argc, char **argv, int *i, const char **val_p)
{
    const char *a = argv[*i];

    for (size_t k = 0; k < sizeof(value_opts) / sizeof(value_opts[0]); k++) {
        const char *name = value_opts[k];
        size_t len = strlen(name);

        if (strcmp(a, name) == 0) {
            *val_p = *i + 1 < argc ? argv[++*i] : NULL;
            return name;
        }
        if (strncmp(a, name, len) == 0 && a[len] == '=' && name[1] == '-') {
            *val_p = a + len + 1;
            return name;
        }
    }
    if (strncmp(a, "-n", 2) == 0) {
        *val_p = a + 2; /* -n4 */
        return "-n";
    }
    return NULL;
}

/* Stores one option's value; false (message printed) if it is not valid. */
static bool set_value_opt(struct run_opts *o, const char *name, const char *val)
{
    if (strcmp(name, "-n") == 0) {
        if (parse_int(val, 1, RUN_MAX_RANKS, &o->nranks))
            return true;
        fprintf(stderr, "hccl-run: -n wants a rank count from 1 to %d, not '%s'\n", RUN_MAX_RANKS,
                val);
    } else if (strcmp(name, "--world-size") == 0) {
        if (parse_int(val, 1, RUN_MAX_RANKS, &o->world_size))
            return true;
        fprintf(stderr, "hccl-run: --world-size wants a rank count from 1 to %d, not '%s'\n",
                RUN_MAX_RANKS, val);
    } else if (strcmp(name, "--rank-offset") == 0) {
        if (parse_int(val, 0, RUN_MAX_RANKS - 1, &o->rank_offset))
            return true;
        fprintf(stderr, "hccl-run: --rank-offset wants a rank from 0 to %d, not '%s'\n",
                RUN_MAX_RANKS - 1, val);
    } else if (strcmp(name, "--bind") == 0) {
        o->bind = strcmp(val, "core") == 0 ? BIND_CORE : strcmp(val, "none") == 0 ? BIND_NONE
                  : strcmp(val, "auto") == 0 ? BIND_AUTO : -1;
        if (o->bind >= 0)
            return true;
        fprintf(stderr, "hccl-run: --bind wants auto, core or none, not '%s'\n", val);
    } else if (strcmp(name, "--comm-id") == 0) {
        o->comm_id = val;
        if (comm_id_is_valid(val))
            return true;
        fprintf(stderr, "hccl-run: --comm-id wants HOST:PORT, not '%s'\n", val);
    } else {
        if (parse_seconds(val, false, &o->timeout_s))
            return true;
        fprintf(stderr, "hccl-run: --timeout wants a positive number of seconds, not '%s'\n",
                val);
    }
    return false;
}

/* The options together; false (message printed) if they do not fit. */
static bool check_opts(struct run_opts *o, bool have_offset)
{
    if (o->nranks == 0) {
        fputs("hccl-run: -n N is required\n", stderr);
        return false;
    }
    if (have_offset && o->world_size == 0) {
        fputs("hccl-run: --rank-offset needs --world-size\n", stderr);
        return false;
    }
    if (o->world_size == 0)
        o->world_size = o->nranks;
    if ((long)o->rank_offset + o->nranks > o->world_size) {
        fprintf(stderr, "hccl-run: ranks %d to %d do not fit in a world of %d\n", o->rank_offset,
                o->rank_offset + o->nranks - 1, o->world_size);
        return false;
    }
    /* The other launchers could never find a port we make up. */
    if (o->world_size > o->nranks && o->comm_id == NULL && getenv("HCCL_COMM_ID") == NULL) {
        fputs("hccl-run: a job over several launchers (--world-size larger than -n) needs\n"
              "  --comm-id HOST:PORT or HCCL_COMM_ID, the same for all of them\n",
              stderr);
        return false;
    }
    return true;
}

/* Returns 0 to run, 1 after --help, 2 on bad usage (message already printed). */
static int parse_args(int argc, char **argv, struct run_opts *o)
{
    bool have_offset = false;
    int i;

    for (i = 1; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        const char *name;

        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage_text, stdout);
            return 1;
        }
        if (strcmp(a, "--tag-output") == 0) {
            o->tag_output = true;
            continue;
        }
        name = split_value_opt(argc, argv, &i, &val);
        if (name == NULL) {
            fprintf(stderr, "hccl-run: unknown option %s\n", a);
            goto bad;
        }
        if (val == NULL) {
            fprintf(stderr, "hccl-run: %s needs a value\n", name);
            goto bad;
        }
        if (!set_value_opt(o, name, val))
            goto bad;
        if (strcmp(name, "--rank-offset") == 0)
            have_offset = true;
    }
    if (!check_opts(o, have_offset))
        goto bad;
    if (i >= argc) {
        fputs("hccl-run: no program given\n", stderr);
        goto bad;
    }
    o->argv = &argv[i];
    return 0;

bad:
    fputs(usage_text, stderr);
    return 2;
}

/*
 * If the launcher was started with 0, 1 or 2 closed, a pipe could land on
 * one of them and the child's dup2 onto it would be a no-op that keeps
 * O_CLOEXEC; fill the holes first.
 */
static void ensure_std_fds(void)
{
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) < 0)
            return;
    }
}

/*
 * Binding port 0 and closing again leaves a small window in which another
 * process may take the port before rank 0 listens on it; rank 0 then fails
 * loudly, which is acceptable for a local launcher.
 */
static int pick_free_port(int *port_p)
{
    struct sockaddr_in sa = {
        .sin_family = AF_INET,
        .sin_port = 0,
        .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
    };
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int ret = -1;

    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0) {
        *port_p = ntohs(sa.sin_port);
        ret = 0;
    }
    int saved = errno;
    close(fd);
    errno = saved;
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
static int setup_env(const struct launcher *l)
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
        fprintf(stderr, "hccl-run: HCCL_COMM_SECRET is not set: the rendezvous at %s is not "
                "authenticated\n", getenv("HCCL_COMM_ID"));
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
static int setup_signals(struct launcher *l)
{
    struct sigaction ign = { .sa_handler = SIG_IGN };
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

/*
 * Ranks are indexed locally (0..nranks-1) throughout; what the ranks and the
 * user see (environment, tags, messages) is the rank in the whole job.
 */
static int global_rank(const struct launcher *l, int local)
{
    return l->opts.rank_offset + local;
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
        fprintf(stderr, "hccl-run: rank %d: setpgid: %s\n", global_rank(l, rank),
                strerror(errno));
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

static int stream_open(struct run_stream *s, int out_fd, int *write_end_p)
{
    int p[2];

    s->buf = malloc(RUN_LINE_MAX);
    if (s->buf == NULL || pipe2(p, O_CLOEXEC) != 0)
        return -1;
    /* Non-blocking so the final drain stops at "nothing more" instead of waiting. */
    if (fcntl(p[0], F_SETFL, O_NONBLOCK) != 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    s->fd = p[0];
    s->out_fd = out_fd;
    *write_end_p = p[1];
    return 0;
}

static int spawn_rank(struct launcher *l, int rank)
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

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);

        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            struct pollfd pfd = { .fd = fd, .events = POLLOUT };
            poll(&pfd, 1, -1); /* our stdout was left non-blocking by someone */
            continue;
        }
        if (w < 0)
            return; /* EPIPE and the like: nobody reads, drop the output */
        p += w;
        n -= (size_t)w;
    }
}

/*
 * One write per line, prefix included, so lines never interleave mid-line.
 * The stream functions take the rank to tag with: the global one.
 */
static void stream_emit(const struct run_stream *s, int rank, const char *line, size_t n,
                        bool add_newline)
{
    char out[RUN_TAG_MAX + RUN_LINE_MAX + 1];
    int k = snprintf(out, RUN_TAG_MAX, "[%d]: ", rank);
    size_t len = (size_t)k;

    memcpy(out + len, line, n);
    len += n;
    if (add_newline)
        out[len++] = '\n';
    write_all(s->out_fd, out, len);
}

static void stream_emit_lines(struct run_stream *s, int rank)
{
    size_t start = 0;
    char *nl;

    while ((nl = memchr(s->buf + start, '\n', s->len - start)) != NULL) {
        size_t end = (size_t)(nl - s->buf) + 1;

        if (memmem(s->buf + start, end - start, RUN_DUMP_END, strlen(RUN_DUMP_END)) != NULL)
            s->dump_done = true;
        stream_emit(s, rank, s->buf + start, end - start, false);
        start = end;
    }
    if (start == 0 && s->len == RUN_LINE_MAX) {
        stream_emit(s, rank, s->buf, s->len, true); /* an overlong line, split */
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
}

static void stream_close(struct run_stream *s, int rank)
{
    if (s->len > 0)
        stream_emit(s, rank, s->buf, s->len, true); /* last line had no newline */
    s->len = 0;
    close(s->fd);
    s->fd = -1;
}

/*
 * Reads once, or until the pipe is empty with drain set (the writer is known
 * dead). One read per wake-up otherwise, so one chatty rank cannot starve
 * the loop.
 */
static void stream_read(struct run_stream *s, int rank, bool drain)
{
    while (s->fd >= 0) {
        ssize_t n = read(s->fd, s->buf + s->len, RUN_LINE_MAX - s->len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0) {
            stream_close(s, rank);
            return;
        }
        s->len += (size_t)n;
        stream_emit_lines(s, rank);
        if (!drain)
            return;
    }
}

static void drain_rank(struct launcher *l, int rank)
{
    if (!l->opts.tag_output)
        return;
    stream_read(&l->ranks[rank].out, global_rank(l, rank), true);
    stream_read(&l->ranks[rank].err, global_rank(l, rank), true);
}

/* Alive ranks as "0,3", malloc'd; NULL if out of memory. */
static char *alive_list(const struct launcher *l)
{
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    const char *sep = "";

    if (f == NULL)
        return NULL;
    for (int i = 0; i < l->opts.nranks; i++) {
        if (l->ranks[i].alive) {
            fprintf(f, "%s%d", sep, global_rank(l, i));
            sep = ",";
        }
    }
    fclose(f);
    return text;
}

static void begin_terminate(struct launcher *l, int sig)
{
    kill(-l->pgid, sig);
    l->phase = PHASE_TERMINATING;
    l->kill_at = now_s() + RUN_KILL_DELAY_S;
}

static void kill_all(struct launcher *l)
{
    kill(-l->pgid, SIGKILL);
    l->phase = PHASE_KILLED;
    l->give_up_at = now_s() + RUN_GIVE_UP_S;
}

static void set_exit_code(struct launcher *l, int code)
{
    if (l->exit_code == 0)
        l->exit_code = code;
}

/*
 * Exits we caused ourselves (terminating phases) are not reported: they
 * would bury the one that matters.
 */
static void rank_exited(struct launcher *l, int rank, int status)
{
    struct run_rank *r = &l->ranks[rank];
    bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;

    r->alive = false;
    l->alive--;
    drain_rank(l, rank); /* its last words go out before the verdict */
    if (!failed || l->phase >= PHASE_TERMINATING)
        return;
    if (WIFEXITED(status))
        fprintf(stderr, "hccl-run: rank %d (pid %d) exited with status %d\n",
                global_rank(l, rank), (int)r->pid, WEXITSTATUS(status));
    else
        fprintf(stderr, "hccl-run: rank %d (pid %d) killed by signal %d (%s)\n",
                global_rank(l, rank), (int)r->pid, WTERMSIG(status), strsignal(WTERMSIG(status)));
    set_exit_code(l, 1);
    if (l->phase == PHASE_RUNNING) {
        l->phase = PHASE_GRACE;
        l->grace_at = now_s() + l->grace_s;
    }
}

/* SIGCHLD is coalesced, so reap everything that is ready on every wake-up. */
static void reap(struct launcher *l)
{
    int status;
    pid_t pid;

    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < l->opts.nranks; i++) {
            if (l->ranks[i].alive && l->ranks[i].pid == pid) {
                rank_exited(l, i, status);
                break;
            }
        }
        /* Anything else was an orphaned grandchild: reaped, nothing to say. */
    }
}

/* Only meaningful once the group members we may signal are gone or reaped. */
static bool group_is_empty(const struct launcher *l)
{
    return kill(-l->pgid, 0) != 0 && errno == ESRCH;
}

static void handle_signals(struct launcher *l)
{
    struct signalfd_siginfo si;

    while (read(l->sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        int sig = (int)si.ssi_signo;

        if (sig == SIGCHLD)
            continue; /* reap() runs on every iteration anyway */
        /*
         * Forward as is, so the ranks may clean up; the SIGKILL clock starts
         * at the first one only. A repeat does not escalate: timeout(1) and
         * friends send the same signal twice within microseconds.
         */
        if (l->phase < PHASE_TERMINATING) {
            set_exit_code(l, 128 + sig);
            if (l->exit_code == 128 + sig)
                l->fatal_sig = sig;
            begin_terminate(l, sig);
        } else {
            kill(-l->pgid, sig);
        }
    }
}

static void timeout_terminate(struct launcher *l)
{
    char *list = alive_list(l);

    fprintf(stderr, "hccl-run: timeout after %g s; ranks still running: %s\n",
            l->opts.timeout_s, list != NULL ? list : "?");
    free(list);
    begin_terminate(l, SIGTERM);
}

/* Whether pid has a SIGUSR1 handler (SigCgt in /proc): the library's state dump, then. */
static bool catches_sigusr1(pid_t pid)
{
    char path[64], line[256];
    unsigned long long mask = 0;
    bool found = false;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    if (f == NULL)
        return false;
    while (!found && fgets(line, sizeof(line), f) != NULL)
        found = sscanf(line, "SigCgt: %llx", &mask) == 1;
    fclose(f);
    return found && (mask & (1ull << (SIGUSR1 - 1))) != 0;
}

/*
 * Before the ranks are ended, those that catch SIGUSR1 (HCCL_DUMP_ON_SIGNAL, which we set)
 * are asked for their state: the report of what each request waits for comes through their
 * stderr, and the loop waits for it (its last line, with --tag-output) or RUN_DUMP_WAIT_S.
 */
static void on_timeout(struct launcher *l)
{
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    const char *sep = "";
    int asked = 0;

    set_exit_code(l, 124);
    for (int i = 0; i < l->opts.nranks && f != NULL; i++) {
        struct run_rank *r = &l->ranks[i];

        if (!r->alive || !catches_sigusr1(r->pid) || kill(r->pid, SIGUSR1) != 0)
            continue;
        r->dump_asked = true;
        asked++;
        fprintf(f, "%s%d", sep, global_rank(l, i));
        sep = ",";
    }
    if (f != NULL)
        fclose(f);
    if (asked == 0) {
        free(text);
        timeout_terminate(l);
        return;
    }
    fprintf(stderr, "hccl-run: timeout after %g s; asking ranks %s for their state (SIGUSR1)\n",
            l->opts.timeout_s, text);
    free(text);
    l->phase = PHASE_DUMPING;
    l->dump_until = now_s() + RUN_DUMP_WAIT_S;
}

/* Every rank asked has reported (as far as we can see it) or is gone. */
static bool dumps_complete(const struct launcher *l)
{
    for (int i = 0; i < l->opts.nranks; i++) {
        const struct run_rank *r = &l->ranks[i];

        if (r->dump_asked && r->alive && !(l->opts.tag_output && r->err.dump_done))
            return false;
    }
    return true;
}

static void on_grace_over(struct launcher *l)
{
    char *list = alive_list(l);

    fprintf(stderr, "hccl-run: terminating ranks still running after %g s grace: %s\n",
            l->grace_s, list != NULL ? list : "?");
    free(list);
    begin_terminate(l, SIGTERM);
}

/*
 * Acts on the deadlines that have passed; returns false when the loop is
 * done: every rank reaped and nothing left in the group (or, after SIGKILL,
 * stray members we may not signal have had RUN_GIVE_UP_S).
 */
static bool advance(struct launcher *l)
{
    double now = now_s();

    if (l->alive == 0) {
        if (group_is_empty(l))
            return false;
        if (l->phase < PHASE_TERMINATING)
            begin_terminate(l, SIGTERM); /* ranks are done; their leftovers go */
    }
    if (l->phase < PHASE_DUMPING && l->timeout_at > 0 && now >= l->timeout_at)
        on_timeout(l);
    if (l->phase == PHASE_DUMPING && (now >= l->dump_until || dumps_complete(l)))
        timeout_terminate(l);
    if (l->phase == PHASE_GRACE && now >= l->grace_at)
        on_grace_over(l);
    if (l->phase == PHASE_TERMINATING && now >= l->kill_at)
        kill_all(l);
    if (l->phase == PHASE_KILLED && l->alive == 0 && now >= l->give_up_at) {
        fprintf(stderr, "hccl-run: processes remain in group %d after SIGKILL\n", (int)l->pgid);
        return false;
    }
    return true;
}

static int next_wait_ms(const struct launcher *l)
{
    double deadline = 0;
    double d;

    if (l->phase < PHASE_DUMPING)
        deadline = l->timeout_at;
    if (l->phase == PHASE_DUMPING)
        deadline = l->dump_until;
    if (l->phase == PHASE_GRACE && (deadline == 0 || l->grace_at < deadline))
        deadline = l->grace_at;
    if (l->phase == PHASE_TERMINATING)
        deadline = l->kill_at;
    if (l->phase == PHASE_KILLED && l->alive == 0)
        deadline = l->give_up_at;
    if (deadline == 0)
        return -1;
    d = (deadline - now_s()) * 1000.0 + 1.0; /* round up: never wake just before */
    if (d <= 0)
        return 0;
    return d > INT_MAX ? INT_MAX : (int)d;
}

static void run_loop(struct launcher *l)
{
    struct pollfd *pfds = l->pfds;

    for (;;) {
        reap(l);
        if (!advance(l))
            break;
        /* Closed streams have fd -1, which poll skips. */
        pfds[0] = (struct pollfd){ .fd = l->sfd, .events = POLLIN };
        for (int i = 1; i < l->nfds; i++)
            pfds[i] = (struct pollfd){ .fd = l->owner[i]->fd, .events = POLLIN };
        if (poll(pfds, (nfds_t)l->nfds, next_wait_ms(l)) < 0 && errno != EINTR) {
            fprintf(stderr, "hccl-run: poll: %s\n", strerror(errno));
            kill_all(l);
        }
        if (pfds[0].revents)
            handle_signals(l);
        for (int i = 1; i < l->nfds; i++) {
            if (pfds[i].fd >= 0 && pfds[i].revents)
                stream_read(l->owner[i], global_rank(l, (i - 1) / 2), false);
        }
    }
}

/* Everyone who could write has exited: take what is buffered and close. */
static void close_streams(struct launcher *l)
{
    for (int i = 0; i < l->opts.nranks && l->opts.tag_output; i++) {
        struct run_rank *r = &l->ranks[i];

        drain_rank(l, i);
        if (r->out.fd >= 0)
            stream_close(&r->out, global_rank(l, i));
        if (r->err.fd >= 0)
            stream_close(&r->err, global_rank(l, i));
    }
}

/* Everything the loop needs, allocated before the first fork. */
static int alloc_launcher(struct launcher *l)
{
    int n = l->opts.nranks;

    l->ranks = calloc((size_t)n, sizeof(*l->ranks));
    l->nfds = 1 + 2 * n;
    l->pfds = calloc((size_t)l->nfds, sizeof(*l->pfds));
    l->owner = calloc((size_t)l->nfds, sizeof(*l->owner));
    if (l->ranks == NULL || l->pfds == NULL || l->owner == NULL) {
        fprintf(stderr, "hccl-run: out of memory for %d ranks\n", n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        l->ranks[i].out.fd = -1;
        l->ranks[i].err.fd = -1;
        l->owner[1 + 2 * i] = &l->ranks[i].out;
        l->owner[2 + 2 * i] = &l->ranks[i].err;
    }
    return 0;
}

static void free_launcher(struct launcher *l)
{
    for (int i = 0; l->ranks != NULL && i < l->opts.nranks; i++) {
        free(l->ranks[i].out.buf);
        free(l->ranks[i].err.buf);
    }
    free(l->ranks);
    free(l->pfds);
    free(l->owner);
    if (l->sfd >= 0)
        close(l->sfd);
}

/*
 * After a forwarded SIGINT/SIGTERM/SIGHUP, die of the same signal so that a
 * calling shell sees it (and, for SIGINT, stops its script too).
 */
static void die_of(int sig)
{
    sigset_t set;

    signal(sig, SIG_DFL);
    sigemptyset(&set);
    sigaddset(&set, sig);
    raise(sig); /* pending while blocked, delivered by the unblock */
    sigprocmask(SIG_UNBLOCK, &set, NULL);
}

static double grace_from_env(void)
{
    const char *s = getenv("HCCL_RUN_GRACE_S");
    double v;

    if (s == NULL)
        return RUN_DEFAULT_GRACE_S;
    if (!parse_seconds(s, true, &v)) {
        fprintf(stderr, "hccl-run: ignoring HCCL_RUN_GRACE_S='%s', using %g s\n", s,
                RUN_DEFAULT_GRACE_S);
        return RUN_DEFAULT_GRACE_S;
    }
    return v;
}

int main(int argc, char **argv)
{
    struct launcher l = { .sfd = -1 };
    int rc = parse_args(argc, argv, &l.opts);

    if (rc != 0)
        return rc == 1 ? 0 : 2;
    ensure_std_fds();
    l.grace_s = grace_from_env();
    if (alloc_launcher(&l) != 0 || setup_env(&l) != 0 || setup_signals(&l) != 0) {
        free_launcher(&l);
        return 1;
    }
    if (l.opts.timeout_s > 0)
        l.timeout_at = now_s() + l.opts.timeout_s;
    for (int i = 0; i < l.opts.nranks; i++) {
        if (spawn_rank(&l, i) != 0) {
            set_exit_code(&l, 1);
            if (l.pgid != 0)
                begin_terminate(&l, SIGTERM); /* no half-started jobs */
            break;
        }
    }
    if (l.pgid != 0)
        run_loop(&l);
    close_streams(&l);
    free_launcher(&l);
    if (l.fatal_sig != 0)
        die_of(l.fatal_sig);
    return l.exit_code;
}
