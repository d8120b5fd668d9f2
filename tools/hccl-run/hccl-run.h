/*
 * hccl-run's parts and what each file offers the others:
 *   opts.c    the command line and HCCL_RUN_GRACE_S: parsing, validation, help text
 *   spawn.c   what the ranks start with: shared environment, signal set-up, fork, CPU binding
 *   output.c  each rank's stdout and stderr under --tag-output: read, tag, write out, drain
 *   main.c    the supervision loop: reaping, deadlines, timeout state reports, signals, main
 */
#ifndef HCCL_RUN_H
#define HCCL_RUN_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct pollfd;

/* At the timeout: how long the ranks' state reports may take (seconds; the help text says it). */
#define RUN_DUMP_WAIT_S 2
#define RUN_STR_(x) #x
#define RUN_STR(x) RUN_STR_(x)

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
    char *buf;  /* one line's worth (RUN_LINE_MAX, output.c), owned */
    bool dump_done; /* a line ended a state report */
};

struct run_rank {
    pid_t pid;             /* 0 if never started */
    bool alive;            /* started and not reaped yet */
    bool dump_asked;       /* sent SIGUSR1 for a state report at the timeout */
    struct run_stream out; /* used with --tag-output only */
    struct run_stream err;
};

/* --bind: core (the default) pins rank i to the launcher's (i mod count)-th CPU: with a CPU
 * per rank, ranks that wait by polling never share a core; with more ranks, each core gets
 * its even share for good, which runs small collectives at least as fast as unbound ranks
 * (docs/performance.md). auto pins only with a CPU per rank. */
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

/*
 * Ranks are indexed locally (0..nranks-1) throughout; what the ranks and the
 * user see (environment, tags, messages) is the rank in the whole job.
 */
static inline int global_rank(const struct launcher *l, int local)
{
    return l->opts.rank_offset + local;
}

/* opts.c */
/* Returns 0 to run, 1 after --help, 2 on bad usage (message already printed). */
int parse_args(int argc, char **argv, struct run_opts *o);
/* Seconds the other ranks get once one has failed; a bad value is reported and ignored. */
double grace_from_env(void);

/* spawn.c; the int ones return 0, or -1 with the reason printed */
/* Opens /dev/null on whichever of fds 0, 1 and 2 is closed. */
void ensure_std_fds(void);
/* Before the forks: what every rank shares goes into our own environment. */
int setup_env(const struct launcher *l);
/* Before the forks: blocks the signals the loop reads from l->sfd, ignores SIGPIPE. */
int setup_signals(struct launcher *l);
/* Forks rank (local index) into l->pgid, with its pipes under --tag-output. */
int spawn_rank(struct launcher *l, int rank);

/* output.c; the stream functions take the rank to tag with: the global one */
/* Allocates s's line buffer and a pipe; the caller hands *write_end_p to the child. */
int stream_open(struct run_stream *s, int out_fd, int *write_end_p);
/* Reads once, or until the pipe is empty with drain; closes s at EOF. */
void stream_read(struct run_stream *s, int rank, bool drain);
/* Writes out what a rank (local index) that has exited left in its pipes. */
void drain_rank(struct launcher *l, int rank);
/* After the loop: drains and closes every stream still open. */
void close_streams(struct launcher *l);

#endif
