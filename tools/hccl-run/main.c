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
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hccl-run.h"

#define RUN_KILL_DELAY_S    2.0         /* SIGTERM (or a forwarded signal) -> SIGKILL */
#define RUN_GIVE_UP_S       2.0         /* after SIGKILL, how long strays may linger */

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
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
