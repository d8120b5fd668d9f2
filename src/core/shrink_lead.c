/*
 * hcclCommShrink's leader: collects the survivors' hellos, checks that they agree, answers
 * with the new rank table (or everyone with the same error), and waits for every survivor to
 * confirm it before the links are set up.
 */
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/fault.h"
#include "core/shrink.h"

#define SHRINK_TICK_MS 50     /* how often the leader looks for survivors that exited */
#define FD_ANSWERED -2        /* a survivor's slot in fds once it got the error */
#define SHRINK_LINGER_MS 2000 /* a failed leader answers the survivors still coming this long */

/* ---- connections for a later shrink ---- */

struct hccl_shrink_early {
    int fd; /* owned */
    struct hccl_shrink_early *next;
};

static int early_count(const struct hcclComm *comm)
{
    int n = 0;

    for (const struct hccl_shrink_early *e = comm->shrink_early; e; e = e->next)
        n++;
    return n;
}

bool hccl_shrink_keep_early(const hccl_shrink_t *sh, int fd)
{
    struct hcclComm *p = sh->parent;
    uint8_t head[offsetof(hccl_shrink_hello_t, gen) + sizeof(uint32_t)];
    int64_t until = hccl_now_ms() + HCCL_SHRINK_HELLO_WAIT_MS;
    struct hccl_shrink_early *e, **tail;
    uint32_t magic, gen;
    uint64_t comm_id;
    ssize_t n;

    /* Peeked, not read: the hello stays whole for the shrink that takes it. The socket says
     * readable only once the whole head is there (SO_RCVLOWAT), so we wait on that. */
    int lowat = (int)sizeof(head);

    (void)setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof(lowat));
    while ((n = recv(fd, head, sizeof(head), MSG_PEEK | MSG_DONTWAIT)) != (ssize_t)sizeof(head)) {
        struct pollfd pf = {.fd = fd, .events = POLLIN | POLLRDHUP};
        int64_t left = until - hccl_now_ms();

        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ||
            left <= 0 || poll(&pf, 1, (int)left) < 0 ||
            (pf.revents & (POLLRDHUP | POLLHUP | POLLERR)))
            return false; /* closed, failed or late before a whole head */
    }
    lowat = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof(lowat));
    memcpy(&magic, head + offsetof(hccl_shrink_hello_t, magic), sizeof(magic));
    memcpy(&comm_id, head + offsetof(hccl_shrink_hello_t, comm_id), sizeof(comm_id));
    memcpy(&gen, head + offsetof(hccl_shrink_hello_t, gen), sizeof(gen));
    /* Only this communicator's survivors, at most one kept connection per rank: a stranger
     * cannot make us hold its sockets. */
    if (!hccl_secret_equal(head + offsetof(hccl_shrink_hello_t, secret), p->env.secret,
                           HCCL_SECRET_BYTES) ||
        magic != HCCL_SHRINK_HELLO_MAGIC || comm_id != p->env.comm_id || gen <= sh->gen ||
        early_count(p) >= p->nranks || !(e = hccl_calloc(1, sizeof(*e))))
        return false;
    e->fd = fd; /* the communicator owns it */
    for (tail = &p->shrink_early; *tail; tail = &(*tail)->next)
        ;
    *tail = e;
    return true;
}

int hccl_shrink_take_early(struct hcclComm *comm)
{
    struct hccl_shrink_early *e = comm->shrink_early;
    int fd;

    if (!e)
        return -1;
    comm->shrink_early = e->next;
    fd = e->fd;
    hccl_free(e);
    return fd;
}

/* Whether the process of rank's card has exited: only where it is ours to see (same host and
 * pid namespace); a zombie has exited too. */
static bool rank_exited(const struct hcclComm *parent, int r)
{
    const hccl_card_t *me = &parent->cards[parent->rank], *c = &parent->cards[r];
    char path[64], buf[512], *close_paren;
    FILE *f;
    size_t n;

    if (!me->pid_ns || me->pid_ns != c->pid_ns || strcmp(me->host, c->host) != 0)
        return false;
    snprintf(path, sizeof(path), "/proc/%u/stat", c->pid);
    f = fopen(path, "re");
    if (!f)
        return errno == ENOENT;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    close_paren = strrchr(buf, ')');
    return close_paren && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X');
}

/* ---- the leader ---- */

/* The cause of a failed attempt, for the survivors that come after it ended. */
static void shrink_record(struct hcclComm *p, hcclResult_t res, const char *msg)
{
    p->shrink_failure_res = res;
    snprintf(p->shrink_failure, sizeof(p->shrink_failure), "%.*s",
             (int)sizeof(p->shrink_failure) - 1, msg);
}

void hccl_shrink_send_error(int fd, hcclResult_t status, const char *msg)
{
    size_t len = strlen(msg); /* msg ends in a NUL; the reply carries at most HCCL_BS_MAX_MSG */

    if (len > HCCL_BS_MAX_MSG)
        len = HCCL_BS_MAX_MSG;
    hccl_bs_reply_t rep = {
        .magic = HCCL_BS_REPLY_MAGIC, .status = status, .msg_len = (uint32_t)len};
    int64_t deadline = hccl_now_ms() + 1000;

    if (hccl_socket_send_all(fd, &rep, sizeof(rep), deadline) == hcclSuccess)
        hccl_socket_send_all(fd, msg, len, deadline);
}

/*
 * Reads one connection's hello and list. Returns false for a connection to drop unanswered
 * (no complete hello: one that a survivor of an earlier attempt left behind; or a stranger).
 */
bool hccl_shrink_read_hello(const hccl_shrink_t *sh, int fd, hccl_shrink_hello_t *h, int **list_p)
{
    struct hcclComm *p = sh->parent;
    int64_t deadline = hccl_now_ms() + HCCL_SHRINK_HELLO_WAIT_MS;
    const char *why;
    int32_t *raw;
    int *list;

    if (hccl_socket_recv_all(fd, h, sizeof(*h), deadline) != hcclSuccess)
        return false;
    why = hccl_shrink_hello_check(h, p->env.comm_id, p->env.secret, p->nranks);
    if (why) {
        HCCL_WARN("rank %d: hcclCommShrink: rejected a control connection: %s", p->rank, why);
        return false;
    }
    raw = hccl_calloc((size_t)h->nexclude + 1, sizeof(*raw));
    list = hccl_calloc((size_t)h->nexclude + 1, sizeof(*list));
    if (!raw || !list ||
        hccl_socket_recv_all(fd, raw, (size_t)h->nexclude * sizeof(*raw), deadline) !=
            hcclSuccess ||
        !hccl_shrink_list_valid(raw, h->nexclude, p->nranks)) {
        HCCL_WARN("rank %d: hcclCommShrink: rank %d's exclude list is missing or malformed",
                  p->rank, h->rank);
        hccl_free(raw);
        hccl_free(list);
        return false;
    }
    for (int i = 0; i < h->nexclude; i++)
        list[i] = raw[i];
    hccl_free(raw);
    *list_p = list;
    return true;
}

/*
 * One survivor's hello against ours: hcclSuccess when it is taken (its card goes to cards),
 * hcclInProgress when it is answered apart (an earlier attempt's) or dropped, else the
 * error that ends this attempt, with its text in msg.
 */
static hcclResult_t take_hello(const hccl_shrink_t *sh, int fd, const char *config,
                               hccl_card_t *cards, int *fds, char *msg, size_t len)
{
    struct hcclComm *p = sh->parent;
    hccl_shrink_hello_t h;
    int *list = NULL, nr;
    hcclResult_t res = hcclInProgress;
    char diff[512];

    if (hccl_shrink_keep_early(sh, fd)) {
        snprintf(msg, len,
                 "hcclCommShrink: a survivor gave this attempt up and called hcclCommShrink "
                 "again: call it again too");
        return hcclRemoteError;
    }
    if (!hccl_shrink_read_hello(sh, fd, &h, &list))
        goto drop;
    if (h.gen < sh->gen) {
        /* A survivor late for a failed attempt: it gets that attempt's cause. */
        if (p->shrink_failure[0])
            hccl_shrink_send_error(fd, p->shrink_failure_res, p->shrink_failure);
        else
            hccl_shrink_send_error(fd, hcclRemoteError,
                                   "hcclCommShrink: this attempt's leader had already given it up; "
                                   "call hcclCommShrink again");
        goto drop;
    }
    if (h.status != hcclSuccess) {
        snprintf(msg, len, "hcclCommShrink: rank %d failed before it could join: %s", h.rank,
                 h.errmsg);
        res = (hcclResult_t)h.status;
    } else if (hccl_shrink_agree(p->rank, sh->excl, sh->nexcl, h.rank, list, h.nexclude, msg,
                                 len) != hcclSuccess) {
        res = hcclInvalidUsage;
    } else if (hccl_config_diff(config, p->rank, h.config, h.rank, diff, sizeof(diff)) > 0) {
        snprintf(msg, len, "hcclCommShrink: the survivors' settings differ: %s", diff);
        res = hcclInvalidUsage;
    } else if (fds[nr = sh->new_of[h.rank]] >= 0 || h.card.rank != (uint32_t)nr) {
        HCCL_WARN("rank %d: hcclCommShrink: rank %d joined twice or with another rank's card",
                  p->rank, h.rank);
        goto drop;
    } else {
        cards[nr] = h.card;
        fds[nr] = fd; /* answered with everyone's */
        hccl_free(list);
        return hcclSuccess;
    }
    if (sh->new_of[h.rank] >= 0 && fds[sh->new_of[h.rank]] < 0)
        fds[sh->new_of[h.rank]] = FD_ANSWERED;
    hccl_shrink_send_error(fd, res, msg);
drop:
    close(fd);
    hccl_free(list);
    return res;
}

/* The survivors still missing, as "1,3". */
static void missing_text(const hccl_shrink_t *sh, const int *fds, char *buf, size_t len)
{
    size_t o = 0;

    buf[0] = '\0';
    for (int r = 0; r < sh->parent->nranks && o + 12 < len; r++)
        if (r != sh->parent->rank && sh->new_of[r] >= 0 && fds[sh->new_of[r]] == -1)
            o += (size_t)snprintf(buf + o, len - o, "%s%d", o ? "," : "", r);
}

/* Input from survivor i (a new rank) after its hello: the failure it reports, or its end. */
static hcclResult_t lead_on_input(const hccl_shrink_t *sh, int *fds, int i, char *msg, size_t len,
                                  int *gone_p)
{
    struct hcclComm *p = sh->parent;
    hccl_shrink_hello_t h;
    int *list = NULL;

    if (hccl_shrink_read_hello(sh, fds[i], &h, &list) && h.status != hcclSuccess &&
        h.gen == sh->gen && sh->new_of[h.rank] == i) {
        hccl_free(list);
        snprintf(msg, len, "%s", h.errmsg);
        return (hcclResult_t)h.status;
    }
    hccl_free(list);
    for (int r = 0; r < p->nranks; r++)
        if (sh->new_of[r] == i)
            *gone_p = r;
    snprintf(msg, len,
             "hcclCommShrink: rank %d went away during the shrink (its connection to rank %d, "
             "which leads it, ended)",
             *gone_p, p->rank);
    close(fds[i]);
    fds[i] = -1;
    return hcclRemoteError;
}

/* Takes every hello waiting on the control listener. */
static hcclResult_t lead_accept(const hccl_shrink_t *sh, const char *config, hccl_card_t *cards,
                                int *fds, char *msg, size_t len, int *waiting_p)
{
    hcclResult_t res = hcclSuccess;

    while (res == hcclSuccess && *waiting_p > 0) {
        int fd = accept4(sh->parent->ctl_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        hcclResult_t took;
        if (fd < 0)
            break; /* EAGAIN: none left */
        took = take_hello(sh, fd, config, cards, fds, msg, len);
        if (took == hcclSuccess)
            (*waiting_p)--;
        else if (took != hcclInProgress)
            res = took;
    }
    return res;
}

/* Reads whatever the joined survivors have sent, without waiting; pf and who have room for
 * every survivor. */
static hcclResult_t lead_pending_input(const hccl_shrink_t *sh, int *fds, struct pollfd *pf,
                                       int *who, char *msg, size_t len, int *gone_p)
{
    hcclResult_t res = hcclSuccess;
    int np = 0;

    for (int i = 0; i < sh->size; i++)
        if (fds[i] >= 0) {
            who[np] = i;
            pf[np++] = (struct pollfd){.fd = fds[i], .events = POLLIN | POLLRDHUP};
        }
    if (np == 0 || poll(pf, (nfds_t)np, 0) <= 0)
        return hcclSuccess;
    for (int i = 0; i < np && res == hcclSuccess; i++)
        if (pf[i].revents)
            res = lead_on_input(sh, fds, who[i], msg, len, gone_p);
    return res;
}

/*
 * Waits for every survivor's hello, or the first reason to give up: a survivor that goes away
 * (its connection ends, or its process is seen to have exited), a disagreement, the deadline.
 */
static hcclResult_t lead_collect(const hccl_shrink_t *sh, const char *config, int64_t deadline_ms,
                                 hccl_card_t *cards, int *fds, char *msg, size_t len, int *gone_p)
{
    struct hcclComm *p = sh->parent;
    struct pollfd *pf = hccl_calloc((size_t)sh->size + 1, sizeof(*pf));
    int *who = hccl_calloc((size_t)sh->size + 1, sizeof(*who));
    int waiting = sh->size - 1;
    hcclResult_t res = hcclSuccess;

    if (!pf || !who) {
        snprintf(msg, len, "hcclCommShrink: out of memory");
        res = hcclSystemError;
    }
    /* Connections kept from an earlier attempt come first, each once. */
    for (int kept = early_count(p), fd;
         res == hcclSuccess && kept > 0 && (fd = hccl_shrink_take_early(p)) >= 0; kept--) {
        hcclResult_t took = take_hello(sh, fd, config, cards, fds, msg, len);
        if (took == hcclSuccess)
            waiting--;
        else if (took != hcclInProgress)
            res = took;
    }
    while (res == hcclSuccess && waiting > 0) {
        int64_t left = deadline_ms - hccl_now_ms();
        int np = 1;

        if (left <= 0) {
            char missing[256];
            missing_text(sh, fds, missing, sizeof(missing));
            snprintf(msg, len,
                     "hcclCommShrink: ranks %s did not join rank %d's shrink within the connect "
                     "timeout of %d ms",
                     missing, p->rank, p->params.connect_timeout_ms);
            res = hcclTimeout;
            break;
        }
        pf[0] = (struct pollfd){.fd = p->ctl_fd, .events = POLLIN};
        for (int i = 0; i < sh->size; i++)
            if (fds[i] >= 0) {
                who[np] = i;
                pf[np++] = (struct pollfd){.fd = fds[i], .events = POLLIN | POLLRDHUP};
            }
        if (poll(pf, (nfds_t)np, left < SHRINK_TICK_MS ? (int)left : SHRINK_TICK_MS) < 0 &&
            errno != EINTR) {
            snprintf(msg, len, "hcclCommShrink: poll: %s", strerror(errno));
            res = hcclSystemError;
            break;
        }
        /* After its hello a survivor says something only to give up (it found that survivors
         * disagree); anything else is its end. */
        for (int i = 1; i < np && res == hcclSuccess; i++) {
            if (pf[i].revents)
                res = lead_on_input(sh, fds, who[i], msg, len, gone_p);
        }
        for (int r = 0; r < p->nranks && res == hcclSuccess; r++) {
            if (r != p->rank && sh->new_of[r] >= 0 && fds[sh->new_of[r]] == -1 &&
                rank_exited(p, r)) {
                /* What the survivors said before it went is its cause (a rank told that it
                 * disagrees leaves, and the survivor that told it may not even have been
                 * accepted yet): every pending hello and input first, then the exit. */
                res = lead_accept(sh, config, cards, fds, msg, len, &waiting);
                if (res == hcclSuccess)
                    res = lead_pending_input(sh, fds, pf, who, msg, len, gone_p);
                if (res != hcclSuccess)
                    break;
                snprintf(msg, len, "hcclCommShrink: rank %d (pid %u) exited during the shrink", r,
                         p->cards[r].pid);
                *gone_p = r;
                res = hcclRemoteError;
            }
        }
        if (res == hcclSuccess && (pf[0].revents & POLLIN))
            res = lead_accept(sh, config, cards, fds, msg, len, &waiting);
    }
    hccl_free(pf);
    hccl_free(who);
    return res;
}

/*
 * Answers, with the error, every survivor that joined, and those that come within a short
 * while (they call at about the same time, and would otherwise wait for the deadline); gone:
 * the rank known to have gone (-1: none). A hello is read before the answer: closing a socket
 * with input unread resets it, and the answer would be lost.
 */
static void lead_fail(const hccl_shrink_t *sh, int *fds, hcclResult_t res, const char *msg,
                      int gone, int64_t linger_ms)
{
    struct hcclComm *p = sh->parent;
    int64_t until = hccl_now_ms() + linger_ms;
    int left = 0, fd;

    for (int r = 0; r < p->nranks; r++) {
        int i = sh->new_of[r];
        if (r == p->rank || r == gone || i < 0)
            continue;
        if (fds[i] >= 0) {
            hccl_shrink_send_error(fds[i], res, msg);
            close(fds[i]);
            fds[i] = FD_ANSWERED;
        } else if (fds[i] != FD_ANSWERED) {
            left++;
        }
    }
    while (p->ctl_fd >= 0) {
        struct pollfd pf = {.fd = p->ctl_fd, .events = POLLIN};
        int64_t wait = left > 0 ? until - hccl_now_ms() : 0;
        hccl_shrink_hello_t h;
        int *list = NULL;
        if (poll(&pf, 1, wait > 0 ? (int)wait : 0) != 1)
            break;
        while ((fd = accept4(p->ctl_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
            if (hccl_shrink_keep_early(sh, fd))
                continue;
            if (hccl_shrink_read_hello(sh, fd, &h, &list)) {
                /* The gone rank's hello may still be in its connection: not one we wait for. */
                if (h.gen == sh->gen && h.rank != gone && sh->new_of[h.rank] >= 0 &&
                    fds[sh->new_of[h.rank]] != FD_ANSWERED) {
                    fds[sh->new_of[h.rank]] = FD_ANSWERED;
                    left--;
                }
                hccl_free(list);
                hccl_shrink_send_error(fd, res, msg);
            }
            close(fd);
        }
    }
}

/* Waits for every survivor's acknowledgement of the table. */
static hcclResult_t lead_confirm(const hccl_shrink_t *sh, int *fds, int64_t deadline_ms, char *msg,
                                 size_t len, int *gone_p)
{
    struct hcclComm *p = sh->parent;
    hcclResult_t res = hcclSuccess;

    for (int i = 1; i < sh->size && res == hcclSuccess; i++) {
        struct pollfd pf = {.fd = fds[i], .events = POLLIN | POLLRDHUP};
        int64_t left = deadline_ms - hccl_now_ms();
        uint32_t ack = 0;
        int got = poll(&pf, 1, left > 0 ? (int)left : 0);

        if (got == 1 &&
            recv(fds[i], &ack, sizeof(ack), MSG_WAITALL | MSG_PEEK) == (ssize_t)sizeof(ack) &&
            ack == HCCL_SHRINK_ACK) {
            recv(fds[i], &ack, sizeof(ack), MSG_WAITALL);
        } else if (got == 1) {
            res = lead_on_input(sh, fds, i, msg, len, gone_p);
        } else {
            for (int r = 0; r < p->nranks; r++)
                if (sh->new_of[r] == i)
                    snprintf(msg, len,
                             "hcclCommShrink: rank %d did not confirm the new rank table within "
                             "the connect timeout",
                             r);
            res = hcclTimeout;
        }
    }
    return res;
}

hcclResult_t hccl_shrink_lead(hccl_shrink_t *sh, const hccl_card_t *card, const char *config,
                              int64_t deadline_ms, hccl_bootstrap_result_t *out)
{
    struct hcclComm *p = sh->parent;
    hccl_card_t *cards = hccl_calloc((size_t)sh->size, sizeof(*cards));
    int *fds = hccl_malloc((size_t)sh->size * sizeof(*fds));
    hccl_bs_reply_t rep = {
        .magic = HCCL_BS_REPLY_MAGIC, .status = hcclSuccess, .nranks = (uint32_t)sh->size};
    char msg[HCCL_BS_MAX_MSG];
    hcclResult_t res;
    int gone = -1;

    if (!cards || !fds) {
        hccl_free(cards);
        hccl_free(fds);
        return HCCL_FAIL(hcclSystemError, "hcclCommShrink: out of memory for %d ranks", sh->size);
    }
    for (int i = 0; i < sh->size; i++)
        fds[i] = -1;
    cards[0] = *card;
    hccl_fault_point(p, HCCL_FAULT_AT_SHRINK, UINT64_MAX);
    if (sh->size > 1 && p->ctl_fd < 0) {
        snprintf(msg, sizeof(msg),
                 "hcclCommShrink: rank %d leads the shrink but has no control listener", p->rank);
        res = hcclSystemError;
    } else {
        res = lead_collect(sh, config, deadline_ms, cards, fds, msg, sizeof(msg), &gone);
    }
    if (res == hcclSuccess &&
        (hccl_random_bytes(&rep.comm_id, sizeof(rep.comm_id)) != hcclSuccess ||
         hccl_random_bytes(rep.secret, sizeof(rep.secret)) != hcclSuccess)) {
        snprintf(msg, sizeof(msg), "hcclCommShrink: %s", hccl_error_last());
        res = hcclSystemError;
    }
    if (res != hcclSuccess) {
        shrink_record(p, res, msg);
        lead_fail(sh, fds, res, msg, gone, res == hcclTimeout ? 0 : SHRINK_LINGER_MS);
        hccl_free(fds);
        hccl_free(cards);
        return HCCL_FAIL(res, "%s", msg);
    }
    /* Everyone gets the table, then confirms that it is still there, and only then may the
     * links be set up: a survivor that died after its hello fails the shrink here, with its
     * name, rather than at link set-up. */
    for (int i = 1; i < sh->size; i++)
        if (hccl_socket_send_all(fds[i], &rep, sizeof(rep), deadline_ms) == hcclSuccess)
            hccl_socket_send_all(fds[i], cards, (size_t)sh->size * sizeof(*cards), deadline_ms);
    res = lead_confirm(sh, fds, deadline_ms, msg, sizeof(msg), &gone);
    if (res != hcclSuccess) {
        shrink_record(p, res, msg);
        lead_fail(sh, fds, res, msg, gone, 0);
        hccl_free(fds);
        hccl_free(cards);
        return HCCL_FAIL(res, "%s", msg);
    }
    out->comm_id = rep.comm_id;
    memcpy(out->secret, rep.secret, sizeof(out->secret));
    rep.comm_id = 0;
    memset(rep.secret, 0, sizeof(rep.secret));
    for (int i = 1; i < sh->size; i++) {
        hccl_socket_send_all(fds[i], &rep, sizeof(rep), deadline_ms);
        close(fds[i]);
    }
    hccl_free(fds);
    out->cards = cards; /* the new communicator owns them */
    return hcclSuccess;
}
