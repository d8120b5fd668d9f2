/*
 * The end of a communicator's link set-up, through the rendezvous (docs/api.md, "Failures").
 *
 * Between the rank table and the first collective, the ranks connect to each other; a rank
 * that dies or fails there would leave the others to find out one by one, each naming the
 * peer it last waited on (and a peer that gave up is not the cause). So every rank keeps its
 * connection to the rendezvous through the set-up and ends it with its outcome; the
 * rendezvous answers every rank with one verdict: success once all have set up, else the
 * first failure it learns of, as a root cause every rank reports word for word. A rank whose
 * connection ends without an outcome has gone. The verdict also calls off the set-up of the
 * ranks still waiting on a peer (the links watch the connection), so nobody waits for the
 * connect timeout for a rank that is gone.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/comm.h"
#include "core/wire.h"

/* How long a rank that failed waits for the verdict: the rendezvous answers on its outcome. */
#define SETUP_VERDICT_WAIT_MS 2000

typedef struct {
    hcclResult_t status;
    int origin;
    char text[HCCL_BS_MAX_MSG];
} setup_verdict_t;

static void setup_gone_text(int origin, char *buf, size_t len)
{
    snprintf(buf, len,
             "root cause at rank %d: rank %d went away during link set-up (its process "
             "ended or its connections were cut)",
             origin, origin);
}

static void verdict_gone(setup_verdict_t *v, int origin)
{
    if (v->status != hcclSuccess)
        return;
    v->status = hcclRemoteError;
    v->origin = origin;
    setup_gone_text(origin, v->text, sizeof(v->text));
}

static void verdict_failed(setup_verdict_t *v, int origin, hcclResult_t status, const char *why)
{
    if (v->status != hcclSuccess)
        return;
    v->status = status;
    v->origin = origin;
    snprintf(v->text, sizeof(v->text), "root cause at rank %d: rank %d could not set up its links: %.900s",
             origin, origin, why);
}

/* Reads rank r's outcome from fd into v (or that r is done); false when r is finished with. */
static bool serve_one(int fd, int r, int n, setup_verdict_t *v, bool *done)
{
    hccl_bs_setup_t m;
    char text[HCCL_BS_MAX_MSG + 1];
    int64_t deadline = hccl_now_ms() + SETUP_VERDICT_WAIT_MS;
    const char *why;

    if (hccl_socket_recv_all(fd, &m, sizeof(m), deadline) != hcclSuccess) {
        verdict_gone(v, r);
        return false;
    }
    why = hccl_bs_setup_check(&m, n);
    if (!why && hccl_socket_recv_all(fd, text, m.msg_len, deadline) != hcclSuccess)
        why = "a text cut short";
    if (why) {
        char msg[128];
        snprintf(msg, sizeof(msg), "its set-up outcome carried %s", why);
        verdict_failed(v, r, hcclRemoteError, msg);
        return false;
    }
    text[m.msg_len] = '\0';
    if (m.status == hcclSuccess) {
        *done = true;
        return true;
    }
    /* A peer found gone is the origin, in the words its own end would get: the verdict reads
     * the same whichever of the two the rendezvous hears first. */
    if (m.origin != r)
        verdict_gone(v, m.origin);
    else
        verdict_failed(v, r, (hcclResult_t)m.status, text);
    return true;
}

/* The poll set of the ranks whose connection is open (and, with done, not yet set up). */
static int setup_pollset(const int *fds, int n, const bool *done, struct pollfd *p, int *who)
{
    int np = 0;

    for (int r = 0; r < n; r++) {
        if (fds[r] < 0 || (done && done[r]))
            continue;
        who[np] = r;
        p[np++] = (struct pollfd){.fd = fds[r], .events = POLLIN};
    }
    return np;
}

/*
 * Closes fds once each rank has closed its end (bounded): a socket closed with unread bytes
 * (an outcome sent as the verdict crossed it) resets the connection, and a reset can cost
 * the rank the verdict it has not read yet.
 */
static void serve_drain(int *fds, int n, struct pollfd *p, int *who)
{
    int64_t deadline = hccl_now_ms() + SETUP_VERDICT_WAIT_MS;
    int open = 0;

    for (int r = 0; r < n; r++)
        open += fds[r] >= 0;
    while (p && who && open > 0 && hccl_now_ms() < deadline) {
        int np = setup_pollset(fds, n, NULL, p, who);
        if (poll(p, (nfds_t)np, 100) <= 0)
            continue;
        for (int i = 0; i < np; i++) {
            int r = who[i];
            char sink[256];
            ssize_t got;
            if (!p[i].revents)
                continue;
            got = recv(fds[r], sink, sizeof(sink), MSG_DONTWAIT);
            if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
                close(fds[r]);
                fds[r] = -1;
                open--;
            }
        }
    }
    for (int r = 0; r < n; r++)
        if (fds[r] >= 0)
            close(fds[r]);
}

void hccl_bootstrap_setup_serve(int *fds, int n, int64_t deadline_ms)
{
    struct pollfd *p = hccl_calloc((size_t)n, sizeof(*p));
    int *who = hccl_calloc((size_t)n, sizeof(*who));
    bool *done = hccl_calloc((size_t)n, sizeof(*done));
    setup_verdict_t v = {.status = hcclSuccess};
    int left = n;

    if (!p || !who || !done)
        verdict_failed(&v, 0, hcclSystemError, "the rendezvous ran out of memory");
    while (v.status == hcclSuccess && left > 0) {
        int64_t ms = deadline_ms - hccl_now_ms();
        int np;

        if (ms <= 0) {
            int late = 0;
            while (late < n && done[late])
                late++;
            verdict_failed(&v, late, hcclTimeout, "it did not finish before the connect timeout");
            break;
        }
        np = setup_pollset(fds, n, done, p, who);
        if (poll(p, (nfds_t)np, ms > 1000 ? 1000 : (int)ms) <= 0)
            continue;
        for (int i = 0; i < np && v.status == hcclSuccess; i++) {
            int r = who[i];
            if (!p[i].revents)
                continue;
            if (!serve_one(fds[r], r, n, &v, &done[r])) {
                close(fds[r]);
                fds[r] = -1;
            } else if (done[r]) {
                left--;
            }
        }
    }
    if (v.status != hcclSuccess)
        HCCL_WARN("bootstrap: %s", v.text);
    for (int r = 0; r < n; r++) {
        hccl_bs_setup_t m = {.magic = HCCL_BS_SETUP_MAGIC, .status = v.status,
                             .origin = v.status == hcclSuccess ? r : v.origin,
                             .msg_len = v.status == hcclSuccess ? 0 : (uint32_t)strlen(v.text)};
        int64_t deadline = hccl_now_ms() + SETUP_VERDICT_WAIT_MS;
        if (fds[r] < 0)
            continue;
        if (hccl_socket_send_all(fds[r], &m, sizeof(m), deadline) == hcclSuccess && m.msg_len)
            hccl_socket_send_all(fds[r], v.text, m.msg_len, deadline);
        shutdown(fds[r], SHUT_WR);
    }
    serve_drain(fds, n, p, who);
    hccl_free(p);
    hccl_free(who);
    hccl_free(done);
}

hcclResult_t hccl_bootstrap_setup_done(int *fd_p, int rank, int nranks, hcclResult_t status,
                                       int origin, int64_t deadline_ms)
{
    char own[HCCL_BS_MAX_MSG], text[HCCL_BS_MAX_MSG + 1];
    hccl_bs_setup_t m = {.magic = HCCL_BS_SETUP_MAGIC, .status = status, .origin = origin};
    int fd = *fd_p;
    hcclResult_t res;

    if (fd < 0)
        return status;
    *fd_p = -1;
    snprintf(own, sizeof(own), "%s", status == hcclSuccess ? "" : hccl_error_last());
    m.msg_len = (uint32_t)strlen(own);
    /* A failure is answered at once; success waits for every rank, as long as they may take. */
    if (status != hcclSuccess || deadline_ms < hccl_now_ms() + SETUP_VERDICT_WAIT_MS)
        deadline_ms = hccl_now_ms() + SETUP_VERDICT_WAIT_MS;
    /* Where the verdict is already in (it called our set-up off), the rendezvous has closed. */
    if (poll(&(struct pollfd){.fd = fd, .events = POLLIN}, 1, 0) == 0 &&
        hccl_socket_send_all(fd, &m, sizeof(m), deadline_ms) == hcclSuccess)
        hccl_socket_send_all(fd, own, m.msg_len, deadline_ms);
    res = hccl_socket_recv_all(fd, &m, sizeof(m), deadline_ms);
    if (res == hcclSuccess && hccl_bs_setup_check(&m, nranks))
        res = hcclRemoteError;
    if (res == hcclSuccess && hccl_socket_recv_all(fd, text, m.msg_len, deadline_ms) != hcclSuccess)
        res = hcclRemoteError;
    close(fd);
    if (res == hcclSuccess) {
        text[m.msg_len] = '\0';
        if (m.status == hcclSuccess && status != hcclSuccess)
            hccl_error_put(own); /* our outcome was lost on the way: our own failure stands */
        if (m.status == hcclSuccess)
            return status;
        return HCCL_FAIL((hcclResult_t)m.status, "rank %d: %s", rank, text);
    }
    /* No verdict: the rendezvous' process is gone. A gone peer still reads the same anywhere. */
    if (status != hcclSuccess && origin != rank) {
        setup_gone_text(origin, text, sizeof(text));
        return HCCL_FAIL(status, "rank %d: %s", rank, text);
    }
    if (status != hcclSuccess)
        return HCCL_FAIL(status, "%s (the rendezvous went away before it could say whether another "
                                 "rank failed first)", own);
    return HCCL_FAIL(hcclRemoteError,
                     "rank %d: the rendezvous went away before every rank had set up its links "
                     "(the process that serves it ended)",
                     rank);
}
