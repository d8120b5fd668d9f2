/*
 * hcclCommShrink: the exchange between the survivors and their leader (see shrink.h), and
 * the call itself. Blocking with the connect timeout as deadline, on the calling thread; the
 * parent is only read (its rank table, id, secret and control listener), so that it may have
 * failed, and it stays to be destroyed or aborted.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fault.h"
#include "core/shrink.h"

#define SHRINK_HELLO_WAIT_MS 5000 /* a survivor sends its hello right after connecting */
#define SHRINK_TICK_MS 50         /* how often the leader looks for survivors that exited */
#define FD_ANSWERED -2            /* a survivor's slot in fds once it got the error */
#define SHRINK_LINGER_MS 2000     /* a failed leader answers the survivors still coming this long */

typedef struct {
    struct hcclComm *parent; /* borrowed */
    int *excl;               /* owned, [nexcl], ascending */
    int nexcl;
    int *new_of;  /* owned, [parent->nranks]: new rank, -1: excluded */
    int size;     /* of the new communicator */
    int leader;   /* parent rank of the lowest survivor */
    uint32_t gen; /* this call's number among the parent's shrinks */
    bool joined;  /* a follower's hello went to the leader */
} shrink_t;

/* ---- the control listener ---- */

static uint64_t pid_ns_inode(void)
{
    struct stat st;

    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static void ctl_encode(uint8_t *ctl, const hccl_sockaddr_t *addr)
{
    uint16_t family = addr->sa.sa_family;

    memset(ctl, 0, HCCL_CARD_CTL_BYTES);
    memcpy(ctl, &family, 2);
    if (family == AF_INET6) {
        memcpy(ctl + 2, &addr->in6.sin6_port, 2);
        memcpy(ctl + 4, &addr->in6.sin6_addr, 16);
    } else {
        memcpy(ctl + 2, &addr->in4.sin_port, 2);
        memcpy(ctl + 4, &addr->in4.sin_addr, 4);
    }
}

/* false: the card names no control listener. */
static bool ctl_decode(const uint8_t *ctl, hccl_sockaddr_t *addr)
{
    uint16_t family, port;

    memcpy(&family, ctl, 2);
    memcpy(&port, ctl + 2, 2);
    memset(addr, 0, sizeof(*addr));
    if (family == AF_INET6) {
        addr->in6.sin6_family = AF_INET6;
        addr->in6.sin6_port = port;
        memcpy(&addr->in6.sin6_addr, ctl + 4, 16);
    } else if (family == AF_INET) {
        addr->in4.sin_family = AF_INET;
        addr->in4.sin_port = port;
        memcpy(&addr->in4.sin_addr, ctl + 4, 4);
    } else {
        return false;
    }
    return port != 0;
}

void hccl_shrink_listen(struct hcclComm *comm, hccl_card_t *card)
{
    hccl_sockaddr_t addr;
    int fd;

    card->pid_ns = pid_ns_inode();
    if (comm->nranks < 2)
        return;
    if (hccl_socket_pick_addr(comm->params.ifname, &addr) != hcclSuccess ||
        hccl_socket_listen(&addr, &fd) != hcclSuccess) {
        HCCL_WARN("rank %d: no control listener (%s): hcclCommShrink cannot be led by this rank",
                  comm->rank, hccl_error_last());
        return;
    }
    comm->ctl_fd = fd; /* comm owns it */
    ctl_encode(card->ctl, &addr);
}

void hccl_shrink_close(struct hcclComm *comm)
{
    if (comm->ctl_fd >= 0)
        close(comm->ctl_fd);
    comm->ctl_fd = -1;
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

static void send_error(int fd, hcclResult_t status, const char *msg)
{
    size_t len = strnlen(msg, HCCL_BS_MAX_MSG);
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
static bool read_hello(const shrink_t *sh, int fd, hccl_shrink_hello_t *h, int **list_p)
{
    struct hcclComm *p = sh->parent;
    int64_t deadline = hccl_now_ms() + SHRINK_HELLO_WAIT_MS;
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
static hcclResult_t take_hello(const shrink_t *sh, int fd, const char *config, hccl_card_t *cards,
                               int *fds, char *msg, size_t len)
{
    struct hcclComm *p = sh->parent;
    hccl_shrink_hello_t h;
    int *list = NULL, nr;
    hcclResult_t res = hcclInProgress;
    char diff[512];

    if (!read_hello(sh, fd, &h, &list))
        goto drop;
    if (h.gen < sh->gen) {
        send_error(fd, hcclRemoteError,
                   "hcclCommShrink: this attempt's leader had already given it up "
                   "(an earlier failure); call hcclCommShrink again");
        goto drop;
    }
    if (h.gen > sh->gen) {
        snprintf(msg, len,
                 "hcclCommShrink: rank %d calls it for the %u. time on this communicator, rank %d "
                 "for the %u. time: every survivor must call it alike",
                 h.rank, h.gen + 1, p->rank, sh->gen + 1);
        res = hcclInvalidUsage;
    } else if (h.status != hcclSuccess) {
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
    send_error(fd, res, msg);
drop:
    close(fd);
    hccl_free(list);
    return res;
}

/* The survivors still missing, as "1,3". */
static void missing_text(const shrink_t *sh, const int *fds, char *buf, size_t len)
{
    size_t o = 0;

    buf[0] = '\0';
    for (int r = 0; r < sh->parent->nranks && o + 12 < len; r++)
        if (r != sh->parent->rank && sh->new_of[r] >= 0 && fds[sh->new_of[r]] == -1)
            o += (size_t)snprintf(buf + o, len - o, "%s%d", o ? "," : "", r);
}

/*
 * Waits for every survivor's hello, or the first reason to give up: a survivor that goes away
 * (its connection ends, or its process is seen to have exited), a disagreement, the deadline.
 */
static hcclResult_t lead_collect(const shrink_t *sh, const char *config, int64_t deadline_ms,
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
        /* A survivor says nothing after its hello until it is answered: input is its end. */
        for (int i = 1; i < np && res == hcclSuccess; i++) {
            if (!pf[i].revents)
                continue;
            for (int r = 0; r < p->nranks; r++)
                if (sh->new_of[r] == who[i])
                    *gone_p = r;
            snprintf(msg, len,
                     "hcclCommShrink: rank %d went away during the shrink (its connection to "
                     "rank %d, which leads it, ended)",
                     *gone_p, p->rank);
            close(fds[who[i]]);
            fds[who[i]] = -1;
            res = hcclRemoteError;
        }
        for (int r = 0; r < p->nranks && res == hcclSuccess; r++) {
            if (r != p->rank && sh->new_of[r] >= 0 && fds[sh->new_of[r]] == -1 &&
                rank_exited(p, r)) {
                snprintf(msg, len,
                         "hcclCommShrink: rank %d (pid %u) exited before it joined the shrink", r,
                         p->cards[r].pid);
                *gone_p = r;
                res = hcclRemoteError;
            }
        }
        while (res == hcclSuccess && waiting > 0 && (pf[0].revents & POLLIN)) {
            int fd = accept4(p->ctl_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            hcclResult_t took;
            if (fd < 0)
                break; /* EAGAIN: none left */
            took = take_hello(sh, fd, config, cards, fds, msg, len);
            if (took == hcclSuccess)
                waiting--;
            else if (took != hcclInProgress)
                res = took;
        }
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
static void lead_fail(const shrink_t *sh, int *fds, hcclResult_t res, const char *msg, int gone,
                      int64_t linger_ms)
{
    struct hcclComm *p = sh->parent;
    int64_t until = hccl_now_ms() + linger_ms;
    int left = 0, fd;

    for (int r = 0; r < p->nranks; r++) {
        int i = sh->new_of[r];
        if (r == p->rank || r == gone || i < 0)
            continue;
        if (fds[i] >= 0) {
            send_error(fds[i], res, msg);
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
            if (read_hello(sh, fd, &h, &list)) {
                if (h.gen == sh->gen && sh->new_of[h.rank] >= 0 &&
                    fds[sh->new_of[h.rank]] != FD_ANSWERED) {
                    fds[sh->new_of[h.rank]] = FD_ANSWERED;
                    left--;
                }
                hccl_free(list);
                send_error(fd, res, msg);
            }
            close(fd);
        }
    }
}

static hcclResult_t shrink_lead(shrink_t *sh, const hccl_card_t *card, const char *config,
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
        lead_fail(sh, fds, res, msg, gone, res == hcclTimeout ? 0 : SHRINK_LINGER_MS);
        hccl_free(fds);
        hccl_free(cards);
        return HCCL_FAIL(res, "%s", msg);
    }
    /* A survivor that cannot be answered now is gone: the others learn it at link set-up. */
    for (int i = 1; i < sh->size; i++) {
        if (hccl_socket_send_all(fds[i], &rep, sizeof(rep), deadline_ms) == hcclSuccess)
            hccl_socket_send_all(fds[i], cards, (size_t)sh->size * sizeof(*cards), deadline_ms);
        close(fds[i]);
    }
    hccl_free(fds);
    out->comm_id = rep.comm_id;
    memcpy(out->secret, rep.secret, sizeof(out->secret));
    out->cards = cards; /* the new communicator owns them */
    return hcclSuccess;
}

/* ---- a follower ---- */

/* One connection to the leader's control listener: refused means it has gone (it listens
 * from its creation on), so there is no retrying. */
static hcclResult_t connect_leader(const shrink_t *sh, int64_t deadline_ms, int *fd_p)
{
    struct hcclComm *p = sh->parent;
    hccl_sockaddr_t addr;
    char where[64];
    int err = 0, fd;
    socklen_t elen = sizeof(err);

    if (!ctl_decode(p->cards[sh->leader].ctl, &addr))
        return HCCL_FAIL(hcclRemoteError,
                         "hcclCommShrink: rank %d, which leads the shrink (the lowest "
                         "survivor), has no control listener",
                         sh->leader);
    hccl_socket_addr_str(&addr, where, sizeof(where));
    fd = socket(addr.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return HCCL_FAIL(hcclSystemError, "hcclCommShrink: socket(): %s", strerror(errno));
    if (connect(fd, &addr.sa, hccl_socket_addr_len(&addr)) != 0) {
        struct pollfd pw = {.fd = fd, .events = POLLOUT};
        int64_t left = deadline_ms - hccl_now_ms();
        if (errno != EINPROGRESS)
            err = errno;
        else if (poll(&pw, 1, left > 0 ? (int)left : 0) != 1)
            err = ETIMEDOUT;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0)
            err = errno;
    }
    if (err) {
        close(fd);
        return HCCL_FAIL(
            err == ETIMEDOUT ? hcclTimeout : hcclRemoteError,
            "hcclCommShrink: rank %d, which leads the shrink (the lowest survivor), cannot be "
            "reached at %s: %s (it has gone: exclude it too)",
            sh->leader, where, strerror(err));
    }
    *fd_p = fd;
    return hcclSuccess;
}

static hcclResult_t send_hello(shrink_t *sh, int fd, const hccl_card_t *card, const char *config,
                               hcclResult_t status, const char *why, int64_t deadline_ms)
{
    struct hcclComm *p = sh->parent;
    hccl_shrink_hello_t *h = hccl_calloc(1, sizeof(*h));
    int32_t *list = hccl_calloc((size_t)sh->nexcl + 1, sizeof(*list));
    hcclResult_t res;

    if (!h || !list) {
        hccl_free(h);
        hccl_free(list);
        return HCCL_FAIL(hcclSystemError, "hcclCommShrink: out of memory");
    }
    h->magic = HCCL_SHRINK_HELLO_MAGIC;
    h->version = HCCL_SHRINK_VERSION;
    memcpy(h->secret, p->env.secret, sizeof(h->secret));
    h->comm_id = p->env.comm_id;
    h->gen = sh->gen;
    h->rank = p->rank;
    h->nranks = p->nranks;
    h->status = status;
    h->nexclude = sh->nexcl;
    if (why)
        snprintf(h->errmsg, sizeof(h->errmsg), "%s", why);
    if (config)
        snprintf(h->config, sizeof(h->config), "%s", config);
    if (card)
        h->card = *card;
    for (int i = 0; i < sh->nexcl; i++)
        list[i] = sh->excl[i];
    res = hccl_socket_send_all(fd, h, sizeof(*h), deadline_ms);
    if (res == hcclSuccess)
        res = hccl_socket_send_all(fd, list, (size_t)sh->nexcl * sizeof(*list), deadline_ms);
    hccl_free(h);
    hccl_free(list);
    if (res != hcclSuccess)
        return HCCL_FAIL(hcclRemoteError,
                         "hcclCommShrink: rank %d, which leads the shrink, went away "
                         "before it read rank %d's hello",
                         sh->leader, p->rank);
    return hcclSuccess;
}

static hcclResult_t shrink_follow(shrink_t *sh, const hccl_card_t *card, const char *config,
                                  int64_t deadline_ms, hccl_bootstrap_result_t *out)
{
    struct hcclComm *p = sh->parent;
    int me = sh->new_of[p->rank], fd;
    hccl_bs_reply_t rep;
    hccl_card_t *cards = NULL;
    hcclResult_t res;

    HCCL_CHECK(connect_leader(sh, deadline_ms, &fd));
    HCCL_CHECK_GOTO(send_hello(sh, fd, card, config, hcclSuccess, NULL, deadline_ms), res,
                    out_close);
    sh->joined = true;
    hccl_fault_point(p, HCCL_FAULT_AT_SHRINK, UINT64_MAX);
    res = hccl_socket_recv_all(fd, &rep, sizeof(rep), deadline_ms);
    if (res != hcclSuccess) {
        res = HCCL_FAIL(res == hcclTimeout ? hcclTimeout : hcclRemoteError,
                        "hcclCommShrink: rank %d, which leads the shrink, %s", sh->leader,
                        res == hcclTimeout ? "did not answer within the connect timeout"
                                           : "went away before it answered");
        goto out_close;
    }
    HCCL_CHECK_GOTO(hccl_bs_reply_check(&rep, me, sh->size), res, out_close);
    if (rep.status != hcclSuccess) {
        char msg[HCCL_BS_MAX_MSG + 1] = "";
        if (hccl_socket_recv_all(fd, msg, rep.msg_len, deadline_ms) != hcclSuccess)
            snprintf(msg, sizeof(msg), "hcclCommShrink: rank %d, which leads the shrink, failed",
                     sh->leader);
        msg[rep.msg_len < HCCL_BS_MAX_MSG ? rep.msg_len : HCCL_BS_MAX_MSG] = '\0';
        res = HCCL_FAIL((hcclResult_t)rep.status, "%s", msg);
        goto out_close;
    }
    cards = hccl_calloc((size_t)sh->size, sizeof(*cards));
    if (!cards) {
        res = HCCL_FAIL(hcclSystemError, "hcclCommShrink: out of memory for %d ranks", sh->size);
        goto out_close;
    }
    res = hccl_socket_recv_all(fd, cards, (size_t)sh->size * sizeof(*cards), deadline_ms);
    if (res != hcclSuccess) {
        res = HCCL_FAIL(hcclRemoteError,
                        "hcclCommShrink: rank %d, which leads the shrink, went away while "
                        "it sent the rank table",
                        sh->leader);
        goto out_free;
    }
    HCCL_CHECK_GOTO(hccl_bs_cards_check(cards, sh->size, me), res, out_free);
    out->comm_id = rep.comm_id;
    memcpy(out->secret, rep.secret, sizeof(out->secret));
    out->cards = cards; /* the new communicator owns them */
    close(fd);
    return hcclSuccess;

out_free:
    hccl_free(cards);
out_close:
    close(fd);
    return res;
}

/* ---- the join that hccl_comm_create calls ---- */

static hcclResult_t shrink_join(void *arg, const hccl_card_t *card, const char *config,
                                int64_t deadline_ms, hccl_bootstrap_result_t *out)
{
    shrink_t *sh = arg;

    memset(out, 0, sizeof(*out));
    if (sh->size == 1) {
        out->cards = hccl_calloc(1, sizeof(*out->cards));
        if (!out->cards)
            return HCCL_FAIL(hcclSystemError, "hcclCommShrink: out of memory");
        out->cards[0] = *card;
        return hccl_random_bytes(&out->comm_id, sizeof(out->comm_id));
    }
    if (sh->parent->rank == sh->leader)
        return shrink_lead(sh, card, config, deadline_ms, out);
    return shrink_follow(sh, card, config, deadline_ms, out);
}

/* This rank failed before it joined: the leader tells everyone (those that come within a
 * short while: the survivors are calling at about the same time); a follower tells the leader. */
static void shrink_report(void *arg, hcclResult_t status, const char *why)
{
    shrink_t *sh = arg;
    struct hcclComm *p = sh->parent;
    int64_t deadline = hccl_now_ms() + SHRINK_HELLO_WAIT_MS;
    char msg[HCCL_BS_MAX_MSG];
    int fd;

    if (sh->size == 1 || sh->joined)
        return;
    if (p->rank != sh->leader) {
        if (connect_leader(sh, deadline, &fd) == hcclSuccess) {
            send_hello(sh, fd, NULL, NULL, status, why, deadline);
            close(fd);
        }
        return;
    }
    snprintf(msg, sizeof(msg), "hcclCommShrink: rank %d, which leads the shrink, failed: %s",
             p->rank, why);
    for (int answered = 0; answered < sh->size - 1 && p->ctl_fd >= 0;) {
        struct pollfd pf = {.fd = p->ctl_fd, .events = POLLIN};
        int64_t left = deadline - hccl_now_ms();
        if (left <= 0 || poll(&pf, 1, (int)left) != 1)
            break;
        while ((fd = accept4(p->ctl_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
            hccl_shrink_hello_t h;
            int *list = NULL;
            if (read_hello(sh, fd, &h, &list)) {
                hccl_free(list);
                send_error(fd, status, msg);
                answered++;
            }
            close(fd);
        }
    }
}

/* The parent's links are the new communicator's too, so its measured constants hold: every
 * survivor has the same (the parent agreed on them), and no collective is spent on them. */
static hcclResult_t shrink_tune(void *arg, struct hcclComm *comm)
{
    shrink_t *sh = arg;
    const struct hcclComm *p = sh->parent;

    if (!p->model_measured || p->tuner.cls != comm->tuner.cls || comm->params.cost_model[0] ||
        !comm->params.calibrate)
        return hccl_comm_calibrate(comm);
    comm->tuner.model.alpha_us = p->tuner.model.alpha_us;
    comm->tuner.model.beta_us_per_byte = p->tuner.model.beta_us_per_byte;
    comm->tuner.model.gamma_us_per_byte = p->tuner.model.gamma_us_per_byte;
    comm->model_measured = true;
    return hcclSuccess;
}

HCCL_API hcclResult_t hcclCommShrink(hcclComm_t comm, const int *excludeRanks, int excludeCount,
                                     const hcclConfig_t *config, hcclComm_t *newcomm)
{
    shrink_t sh = {0};
    hcclConfig_t cfg = HCCL_CONFIG_INITIALIZER;
    hccl_comm_join_t join = {shrink_join, shrink_report, shrink_tune, &sh};
    int64_t t0 = hccl_now_ns();
    hcclComm_t nc = NULL;
    hcclResult_t res;
    char list[128];

    HCCL_CHECK(hccl_comm_check(comm, "hcclCommShrink"));
    if (!newcomm)
        return HCCL_FAIL(hcclInvalidArgument, "hcclCommShrink: newcomm is NULL");
    if (config && (config->size < sizeof(size_t) || config->size > (1u << 16)))
        return HCCL_FAIL(hcclInvalidUsage,
                         "hcclCommShrink: hcclConfig_t.size is %zu: initialise config "
                         "with HCCL_CONFIG_INITIALIZER",
                         config->size);
    sh.parent = comm;
    sh.excl = hccl_calloc((size_t)comm->nranks, sizeof(*sh.excl));
    sh.new_of = hccl_calloc((size_t)comm->nranks, sizeof(*sh.new_of));
    if (!sh.excl || !sh.new_of) {
        res = HCCL_FAIL(hcclSystemError, "hcclCommShrink: out of memory");
        goto out;
    }
    HCCL_CHECK_GOTO(
        hccl_shrink_list_check(comm->nranks, comm->rank, excludeRanks, excludeCount, sh.excl), res,
        out);
    sh.nexcl = excludeCount;
    sh.size = hccl_shrink_renumber(comm->nranks, sh.excl, sh.nexcl, sh.new_of);
    for (sh.leader = 0; sh.new_of[sh.leader] != 0; sh.leader++)
        ;
    sh.gen = atomic_fetch_add(&comm->shrink_gen, 1);
    if (!config) {
        cfg.connectTimeoutMs = comm->params.connect_timeout_ms;
        cfg.execTimeoutMs = comm->params.exec_timeout_ms;
        cfg.algo = comm->params.algo[0] ? comm->params.algo : NULL;
        cfg.eventBase =
            hccl_reactor_is_external(comm->reactor) ? hccl_reactor_base(comm->reactor) : NULL;
        config = &cfg;
    }
    res = hccl_comm_create(&nc, sh.size, sh.new_of[comm->rank], config, &join);
    if (res == hcclSuccess) {
        hccl_shrink_list_text(sh.excl, sh.nexcl, list, sizeof(list));
        HCCL_INFO(HCCL_SUB_INIT,
                  "rank %d: shrank %d ranks to %d (excluded %s) in %.1f ms; now rank %d",
                  comm->rank, comm->nranks, sh.size, list, (double)(hccl_now_ns() - t0) / 1e6,
                  sh.new_of[comm->rank]);
        *newcomm = nc;
    }
out:
    hccl_free(sh.excl);
    hccl_free(sh.new_of);
    return res;
}
