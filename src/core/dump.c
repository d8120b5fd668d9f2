/*
 * Diagnostics: hcclCommDumpState (what every request in flight waits for), and
 * HCCL_DUMP_ON_SIGNAL, which writes that report for every live communicator to the log
 * when the process gets SIGUSR1.
 *
 * The report is read under the reactor's progress lock, the one every event callback and
 * a driving waiter take, so nothing moves while it is read; nobody has to answer, since
 * the thread that should answer may be the one that is stuck. The lock is waited for a
 * bounded time only: if its holder is stuck, the requests are not walked (their memory
 * may be changing) and the report says so.
 */
#include <errno.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"

#define DUMP_LOCK_WAIT_MS 1000
#define DUMP_LOCK_SLICE_MS 10
#define DUMP_MAX_STEPS 64     /* unfinished steps listed per request; the rest are counted */
#define DUMP_MAX_PREDS 4      /* unfinished predecessors named per blocked step */

static const char *const slot_names[HCCL_NUM_SLOTS] = {"send", "recv", "scratch"};

static void put_range(FILE *f, hccl_bref_t b, size_t bytes)
{
    fprintf(f, "%s[%zu, %zu)", b.slot < HCCL_NUM_SLOTS ? slot_names[b.slot] : "?", b.off,
            b.off + bytes);
}

/* Names up to DUMP_MAX_PREDS predecessors of step that are not done. */
static void put_blockers(FILE *f, const hccl_run_t *run, const hccl_plan_t *p, uint32_t step)
{
    int named = 0;

    for (uint32_t i = 0; i < p->nsteps && named < DUMP_MAX_PREDS; i++) {
        const hccl_step_t *s = &p->steps[i];
        uint32_t left;
        for (uint32_t k = 0; k < s->nsucc; k++) {
            if (p->succ[s->succ_first + k] != step ||
                hccl_exec_run_step_state(run, i, &left) == HCCL_STEP_DONE)
                continue;
            fprintf(f, "%s%u", named++ ? ", " : "", i);
            break;
        }
    }
}

static void put_step(FILE *f, const hccl_run_t *run, const hccl_plan_t *p, uint32_t i,
                     hccl_step_state_t st, uint32_t left)
{
    const hccl_step_t *s = &p->steps[i];

    fprintf(f, "    step %u ", i);
    switch (s->kind) {
    case HCCL_STEP_SEND:
        fprintf(f, "send to rank %d tag %u bytes ", s->peer, s->tag);
        put_range(f, s->src, s->bytes);
        break;
    case HCCL_STEP_RECV:
        fprintf(f, "recv from rank %d tag %u bytes ", s->peer, s->tag);
        put_range(f, s->dst, s->bytes);
        break;
    case HCCL_STEP_REDUCE:
        fputs("reduce bytes ", f);
        put_range(f, s->dst, s->bytes);
        fputs(" = ", f);
        put_range(f, s->src, s->bytes);
        fputs(" + ", f);
        put_range(f, s->src2, s->bytes);
        break;
    default:
        fputs("copy bytes ", f);
        put_range(f, s->dst, s->bytes);
        fputs(" = ", f);
        put_range(f, s->src, s->bytes);
        break;
    }
    switch (st) {
    case HCCL_STEP_POSTED:
        fprintf(f, ": posted, waiting on rank %d\n", s->peer);
        break;
    case HCCL_STEP_READY:
        fputs(": ready, not issued yet\n", f);
        break;
    case HCCL_STEP_FAILED:
        fputs(": failed\n", f);
        break;
    default:
        fprintf(f, ": blocked on %u earlier step%s (", left, left == 1 ? "" : "s");
        put_blockers(f, run, p, i);
        fputs(")\n", f);
        break;
    }
}

static void put_run(FILE *f, const struct hcclComm *comm, const hccl_run_t *run)
{
    const struct hcclRequest *req = hccl_exec_run_arg(run);
    const hccl_plan_t *p = hccl_exec_run_plan(run);
    uint32_t listed = 0, posted = 0, blocked = 0, more = 0;
    bool check = false;
    const char *why;
    char what[160];

    (void)comm;
    for (uint32_t i = 0; i < p->nsteps && !check; i++)
        check = (p->steps[i].kind == HCCL_STEP_SEND || p->steps[i].kind == HCCL_STEP_RECV) &&
                (p->steps[i].tag & HCCL_CHECK_TAG_BIT);
    hccl_request_describe(req, true, what, sizeof(what));
    fprintf(f, "  request %s", what);
    fprintf(f, ": algorithm %s%s, %u of %u steps not done", p->algo ? p->algo : "?",
            check ? " (HCCL_CHECK signature exchange before it)" : "",
            hccl_exec_run_remaining(run), p->nsteps);
    if (hccl_exec_run_failed(run, &why))
        fprintf(f, "; failed, ending: %s", why);
    fputc('\n', f);
    for (uint32_t i = 0; i < p->nsteps; i++) {
        uint32_t left;
        hccl_step_state_t st = hccl_exec_run_step_state(run, i, &left);
        if (st == HCCL_STEP_DONE)
            continue;
        posted += st == HCCL_STEP_POSTED;
        blocked += st == HCCL_STEP_BLOCKED;
        if (listed++ < DUMP_MAX_STEPS)
            put_step(f, run, p, i, st, left);
        else
            more++;
    }
    if (more)
        fprintf(f, "    ... %u more steps not done\n", more);
    fprintf(f, "    summary: %u posted and waiting on peers, %u blocked on earlier steps\n", posted,
            blocked);
}

static void put_links(FILE *f, const struct hcclComm *comm)
{
    int64_t now = hccl_link_clock_ms();

    for (int r = 0; r < comm->nranks; r++) {
        const hccl_conn_t *c = comm->conns ? comm->conns[r] : NULL;
        const hccl_link_ops_t *ops = comm->link_of && comm->link_of[r] >= 0
                                         ? hccl_link_by_id(comm->link_of[r]) : NULL;
        int64_t at[2];
        if (r == comm->rank || !c)
            continue;
        at[0] = atomic_load_explicit(&((hccl_conn_t *)c)->activity.tx_ms, memory_order_relaxed);
        at[1] = atomic_load_explicit(&((hccl_conn_t *)c)->activity.rx_ms, memory_order_relaxed);
        fprintf(f, "  link to rank %d (%s):", r, ops ? ops->name : "?");
        for (int k = 0; k < 2; k++) {
            fprintf(f, " last %s ", k ? "receive" : "send");
            if (at[k])
                fprintf(f, "%.1f s ago%s", (double)(now - at[k]) / 1000.0, k ? "" : ",");
            else
                fprintf(f, "never%s", k ? "" : ",");
        }
        fputc('\n', f);
    }
}

/* The lane's queue (sched/lane.h); returns how many operations it holds. */
static int put_lane(FILE *f, struct hcclComm *comm)
{
    int n = 0;
    char peers[256];

    if (!comm->lane)
        return 0;
    for (const hccl_lane_op_t *op = hccl_lane_first(comm->lane); op; op = op->next, n++) {
        fprintf(f, "  request %s seq %llu (%zu x %s", hccl_coll_name((hccl_coll_t)op->coll),
                (unsigned long long)op->seq, op->call_count, hccl_dtype_name(op->dtype));
        if (op->coll == HCCL_COLL_ALLREDUCE)
            fprintf(f, ", %s", hccl_op_name(op->op));
        hccl_lane_waiting_for(comm->lane, op, peers, sizeof(peers));
        if (peers[0])
            fprintf(f, "): shm lane, waiting on ranks %s\n", peers);
        else
            fprintf(f, "): shm lane, queued behind the operations above\n");
    }
    return n;
}

/*
 * The communicator whose destroy or abort waits for the SIGUSR1 report to let go of it: the
 * report stops waiting for its progress lock, so that teardown proceeds at once. Only its:
 * a cancel that outlived its teardown by a moment must not cut short the wait for the next
 * communicator's lock. dump_cancel_all is set while the dumper itself stops.
 */
static _Atomic(const struct hcclComm *) dump_cancel_for;
static atomic_bool dump_cancel_all;

static bool dump_cancelled(const struct hcclComm *comm)
{
    return atomic_load(&dump_cancel_all) || atomic_load(&dump_cancel_for) == comm;
}

/* The progress lock, waited for in short slices so that a cancel is seen within one. */
static bool dump_enter(struct hcclComm *comm)
{
    for (int waited = 0; waited < DUMP_LOCK_WAIT_MS && !dump_cancelled(comm);
         waited += DUMP_LOCK_SLICE_MS)
        if (hccl_reactor_enter_timed(comm->reactor, DUMP_LOCK_SLICE_MS))
            return true;
    return false;
}

/* The whole report of one communicator, into f (a memory stream: out is written unlocked). */
static void dump_comm(struct hcclComm *comm, FILE *f)
{
    hcclResult_t err = atomic_load(&comm->async_error);
    int outstanding, runs = 0;
    bool locked;

    outstanding = hccl_reactor_pending(comm->reactor);
    fprintf(f, "hccl state: comm %016llx rank %d of %d, %d request%s outstanding\n",
            (unsigned long long)comm->env.comm_id, comm->rank, comm->nranks, outstanding,
            outstanding == 1 ? "" : "s");
    if (err != hcclSuccess) {
        char msg[sizeof(comm->async_msg)];
        hccl_comm_error_text(comm, msg, sizeof(msg));
        fprintf(f, "  failed (%s): %s\n", hcclGetErrorString(err), msg);
    }
    locked = dump_enter(comm);
    if (locked) {
        for (const hccl_run_t *run = hccl_exec_first_run(comm->exec); run;
             run = hccl_exec_next_run(run), runs++)
            put_run(f, comm, run);
        for (const struct hcclRequest *q = comm->self_sends; q; q = q->next_self)
            fprintf(f, "  request send #%llu to rank %d (itself): waiting for its receive\n",
                    (unsigned long long)(q->seq & ~HCCL_P2P_SEQ_BIT), comm->rank);
        for (const struct hcclRequest *q = comm->self_recvs; q; q = q->next_self)
            fprintf(f, "  request recv #%llu from rank %d (itself): waiting for its send\n",
                    (unsigned long long)(q->seq & ~HCCL_P2P_SEQ_BIT), comm->rank);
        runs += put_lane(f, comm);
        hccl_reactor_leave(comm->reactor);
        if (outstanding > runs)
            fprintf(f, "  %d request%s outstanding without a plan in flight (queued for the "
                       "reactor, completing, or a send/receive to itself listed above)\n",
                    outstanding - runs, outstanding - runs == 1 ? "" : "s");
    } else {
        fprintf(f, "  state may be inconsistent: the progress lock was held for over %d ms (a "
                   "callback or the progress thread is stuck, or very busy); requests not "
                   "listed\n", DUMP_LOCK_WAIT_MS);
    }
    put_links(f, comm);
}

HCCL_API hcclResult_t hcclCommDumpState(hcclComm_t comm, FILE *out)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f;

    HCCL_CHECK(hccl_comm_check(comm, "hcclCommDumpState"));
    if (!out)
        return HCCL_FAIL(hcclInvalidArgument, "hcclCommDumpState: out is NULL");
    f = open_memstream(&text, &len);
    if (!f)
        return HCCL_FAIL(hcclSystemError, "hcclCommDumpState: open_memstream: %s", strerror(errno));
    dump_comm(comm, f);
    if (fclose(f) != 0) {
        free(text);
        return HCCL_FAIL(hcclSystemError, "hcclCommDumpState: out of memory for the report");
    }
    if (fwrite(text, 1, len, out) != len || fflush(out) != 0) {
        free(text);
        return HCCL_FAIL(hcclSystemError, "hcclCommDumpState: writing the report: %s",
                         strerror(errno));
    }
    free(text);
    return hcclSuccess;
}

/* ---- HCCL_DUMP_ON_SIGNAL ---- */

/*
 * life_mtx orders registration against the dumper thread's start and stop (it is joined
 * under it); reg_mtx guards the list and is what the dumper holds while it reports, so
 * that a communicator is never freed under it.
 */
static pthread_mutex_t life_mtx = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t reg_mtx = PTHREAD_MUTEX_INITIALIZER;
static struct hcclComm **reg;        /* live communicators, owned array */
static int nreg;
static int capreg;
static int nwant;                    /* of them, those with HCCL_DUMP_ON_SIGNAL set */
static sem_t dump_sem;               /* posted by the signal handler */
static atomic_bool dump_stop;
static bool dumper_running;          /* under life_mtx */
static pthread_t dumper;
static struct sigaction old_usr1;
/* The communicator the report reads now (under reg_mtx); its end is signalled on dumped. */
static struct hcclComm *dumping;
static pthread_cond_t dumped = PTHREAD_COND_INITIALIZER;
/* The report's next index into reg (under reg_mtx). reg keeps registration order, and a
 * removal before it moves it back: a communicator torn down while the lock is let go during a
 * report makes the report skip no other. */
static int dump_next;

static void dump_on_sigusr1(int sig)
{
    int saved = errno;

    (void)sig;
    sem_post(&dump_sem); /* async-signal-safe: the thread does the work */
    errno = saved;
}

/* Each line of text as one log line, so that lines of several threads never mix. */
static void log_lines(char *text)
{
    char *save = NULL;

    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        HCCL_WARN("%s", line);
}

static void *dumper_main(void *arg)
{
    (void)arg;
    hccl_log_set_rank(-1);
    for (;;) {
        if (sem_wait(&dump_sem) != 0)
            continue; /* EINTR */
        if (atomic_load(&dump_stop))
            break;
        pthread_mutex_lock(&reg_mtx);
        HCCL_WARN("state dump on SIGUSR1: %d communicator%s", nreg, nreg == 1 ? "" : "s");
        /* reg_mtx is let go while a communicator is read, so that registering and tearing
         * down never wait for a report: a teardown of the one being read cancels its wait. */
        for (dump_next = 0; dump_next < nreg && !atomic_load(&dump_stop);) {
            struct hcclComm *comm = reg[dump_next++];
            char *text = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&text, &len);
            int rank = comm->rank;
            if (!f)
                continue;
            dumping = comm;
            pthread_mutex_unlock(&reg_mtx);
            dump_comm(dumping, f);
            pthread_mutex_lock(&reg_mtx);
            dumping = NULL;
            pthread_cond_broadcast(&dumped);
            if (fclose(f) == 0) {
                hccl_log_set_rank(rank);
                log_lines(text);
            }
            free(text);
        }
        hccl_log_set_rank(-1);
        /* hccl-run waits for this line to know that this rank's report is complete. */
        HCCL_WARN("state dump: end of report (%d communicator%s)", nreg, nreg == 1 ? "" : "s");
        pthread_mutex_unlock(&reg_mtx);
    }
    return NULL;
}

/* Under life_mtx. A handler the application installed itself is left alone. */
static void dumper_start(void)
{
    struct sigaction sa, cur;
    sigset_t all, old;
    int rc;

    static bool warned, sem_ready;

    if (sigaction(SIGUSR1, NULL, &cur) != 0 || cur.sa_handler != SIG_DFL ||
        (cur.sa_flags & SA_SIGINFO)) {
        if (!warned)
            HCCL_WARN("HCCL_DUMP_ON_SIGNAL: SIGUSR1 already has a handler in this process; it is "
                      "left alone and no state dump is installed");
        warned = true;
        return;
    }
    /* Made once and never destroyed: a handler still running on another thread when the last
     * communicator went may post to it late. Such a stale post is drained here. */
    if (!sem_ready)
        sem_init(&dump_sem, 0, 0);
    sem_ready = true;
    while (sem_trywait(&dump_sem) == 0)
        ;
    atomic_store(&dump_stop, false);
    /* The thread takes no signal: the handler runs on whichever other thread the kernel picks. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&dumper, NULL, dumper_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        HCCL_WARN("HCCL_DUMP_ON_SIGNAL: cannot start the dump thread: %s", strerror(rc));
        return;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = dump_on_sigusr1;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, &old_usr1);
    dumper_running = true;
}

/* Under life_mtx: the handler goes first, so that nothing posts to a thread that is gone. */
static void dumper_stop(void)
{
    struct sigaction cur;

    /* Put the old handler back only if ours is still there: the application may have
     * installed its own since. */
    if (sigaction(SIGUSR1, NULL, &cur) == 0 && cur.sa_handler == dump_on_sigusr1)
        sigaction(SIGUSR1, &old_usr1, NULL);
    atomic_store(&dump_stop, true);
    atomic_store(&dump_cancel_all, true); /* a report waiting for a progress lock ends now */
    sem_post(&dump_sem);
    pthread_join(dumper, NULL);
    atomic_store(&dump_cancel_all, false);
    dumper_running = false;
}

void hccl_dump_register(struct hcclComm *comm)
{
    pthread_mutex_lock(&life_mtx);
    pthread_mutex_lock(&reg_mtx);
    if (nreg == capreg) {
        int cap = capreg ? 2 * capreg : 8;
        struct hcclComm **p = hccl_realloc(reg, (size_t)cap * sizeof(*p));
        if (!p) {
            pthread_mutex_unlock(&reg_mtx);
            pthread_mutex_unlock(&life_mtx);
            HCCL_WARN("rank %d: out of memory: this communicator is left out of state dumps",
                      comm->rank);
            return;
        }
        reg = p;
        capreg = cap;
    }
    reg[nreg++] = comm;
    nwant += comm->params.dump_on_signal != 0;
    pthread_mutex_unlock(&reg_mtx);
    if (nwant > 0 && !dumper_running && comm->params.dump_on_signal)
        dumper_start();
    pthread_mutex_unlock(&life_mtx);
}

void hccl_dump_unregister(struct hcclComm *comm)
{
    bool found = false;

    pthread_mutex_lock(&life_mtx);
    pthread_mutex_lock(&reg_mtx);
    /* A report reading comm lets go within a lock slice (dump_enter) and a short walk. */
    while (dumping == comm) {
        atomic_store(&dump_cancel_for, comm);
        pthread_cond_wait(&dumped, &reg_mtx);
    }
    atomic_store(&dump_cancel_for, NULL);
    for (int i = 0; i < nreg && !found; i++) {
        if (reg[i] != comm)
            continue;
        memmove(&reg[i], &reg[i + 1], (size_t)(nreg - i - 1) * sizeof(*reg));
        nreg--;
        if (i < dump_next)
            dump_next--;
        nwant -= comm->params.dump_on_signal != 0;
        found = true;
    }
    if (nreg == 0) {
        hccl_free(reg);
        reg = NULL;
        capreg = 0;
    }
    pthread_mutex_unlock(&reg_mtx);
    if (found && nwant == 0 && dumper_running)
        dumper_stop();
    pthread_mutex_unlock(&life_mtx);
}
