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
    int fd;

    while ((fd = hccl_shrink_take_early(comm)) >= 0)
        close(fd);
    if (comm->ctl_fd >= 0)
        close(comm->ctl_fd);
    comm->ctl_fd = -1;
}

/* ---- a follower ---- */

/* One connection to the leader's control listener: refused means it has gone (it listens
 * from its creation on), so there is no retrying. */
static hcclResult_t connect_leader(const hccl_shrink_t *sh, int64_t deadline_ms, int *fd_p)
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

hcclResult_t hccl_shrink_send_hello(hccl_shrink_t *sh, int fd, const hccl_card_t *card,
                                    const char *config, hcclResult_t status, const char *why,
                                    int64_t deadline_ms)
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

/*
 * A survivor that takes us for its leader excludes other ranks than we do: it gets the
 * disagreement, and so does our leader, which fails everyone alike with it.
 */
static void follow_answer_stray(hccl_shrink_t *sh, int lfd, int64_t deadline_ms)
{
    struct hcclComm *p = sh->parent;
    hccl_shrink_hello_t h;
    int *list = NULL, fd;
    char why[HCCL_BS_ERRMSG_BYTES];

    while ((fd = accept4(p->ctl_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
        if (hccl_shrink_keep_early(sh, fd))
            continue;
        if (hccl_shrink_read_hello(sh, fd, &h, &list)) {
            if (h.gen < sh->gen) {
                hccl_shrink_send_error(fd, hcclRemoteError,
                                       "hcclCommShrink: this attempt was given up; call it again");
            } else {
                if (hccl_shrink_agree(p->rank, sh->excl, sh->nexcl, h.rank, list, h.nexclude, why,
                                      sizeof(why)) == hcclSuccess)
                    snprintf(why, sizeof(why),
                             "hcclCommShrink: rank %d takes rank %d for its leader, which "
                             "rank %d is not",
                             h.rank, p->rank, p->rank);
                /* The leader first: the stray leaves once told, and its exit must not reach
                 * the leader before the cause does. */
                hccl_shrink_send_hello(sh, lfd, NULL, NULL, hcclInvalidUsage, why, deadline_ms);
                hccl_shrink_send_error(fd, hcclInvalidUsage, why);
            }
            hccl_free(list);
            list = NULL;
        }
        close(fd);
    }
}

/* The leader's next answer on fd: hcclSuccess with rep, or its error (set). */
static hcclResult_t follow_wait(hccl_shrink_t *sh, int fd, int64_t deadline_ms,
                                hccl_bs_reply_t *rep)
{
    struct hcclComm *p = sh->parent;
    char msg[HCCL_BS_MAX_MSG + 1] = "";

    for (;;) {
        struct pollfd pf[2] = {{.fd = fd, .events = POLLIN}, {.fd = p->ctl_fd, .events = POLLIN}};
        int64_t left = deadline_ms - hccl_now_ms();
        if (left <= 0)
            return HCCL_FAIL(hcclTimeout,
                             "hcclCommShrink: rank %d, which leads the shrink, did not answer "
                             "within the connect timeout",
                             sh->leader);
        if (poll(pf, p->ctl_fd >= 0 ? 2 : 1, (int)left) <= 0)
            continue;
        if (pf[1].revents & POLLIN)
            follow_answer_stray(sh, fd, deadline_ms);
        if (pf[0].revents)
            break;
    }
    if (hccl_socket_recv_all(fd, rep, sizeof(*rep), deadline_ms) != hcclSuccess)
        return HCCL_FAIL(hcclRemoteError,
                         "hcclCommShrink: rank %d, which leads the shrink, went away before "
                         "it answered",
                         sh->leader);
    HCCL_CHECK(hccl_bs_reply_check(rep, p->rank, sh->size));
    if (rep->status == hcclSuccess)
        return hcclSuccess;
    if (hccl_socket_recv_all(fd, msg, rep->msg_len, deadline_ms) != hcclSuccess)
        snprintf(msg, sizeof(msg), "hcclCommShrink: rank %d, which leads the shrink, failed",
                 sh->leader);
    msg[rep->msg_len < HCCL_BS_MAX_MSG ? rep->msg_len : HCCL_BS_MAX_MSG] = '\0';
    return HCCL_FAIL((hcclResult_t)rep->status, "%s", msg);
}

static hcclResult_t shrink_follow(hccl_shrink_t *sh, const hccl_card_t *card, const char *config,
                                  int64_t deadline_ms, hccl_bootstrap_result_t *out)
{
    int me = sh->new_of[sh->parent->rank], fd;
    uint32_t ack = HCCL_SHRINK_ACK;
    hccl_bs_reply_t rep, go;
    hccl_card_t *cards = NULL;
    hcclResult_t res;

    HCCL_CHECK(connect_leader(sh, deadline_ms, &fd));
    HCCL_CHECK_GOTO(hccl_shrink_send_hello(sh, fd, card, config, hcclSuccess, NULL, deadline_ms),
                    res, out_close);
    sh->joined = true;
    hccl_fault_point(sh->parent, HCCL_FAULT_AT_SHRINK, UINT64_MAX);
    HCCL_CHECK_GOTO(follow_wait(sh, fd, deadline_ms, &rep), res, out_close);
    cards = hccl_calloc((size_t)sh->size, sizeof(*cards));
    if (!cards) {
        res = HCCL_FAIL(hcclSystemError, "hcclCommShrink: out of memory for %d ranks", sh->size);
        goto out_close;
    }
    if (hccl_socket_recv_all(fd, cards, (size_t)sh->size * sizeof(*cards), deadline_ms) !=
            hcclSuccess ||
        hccl_socket_send_all(fd, &ack, sizeof(ack), deadline_ms) != hcclSuccess) {
        res = HCCL_FAIL(hcclRemoteError,
                        "hcclCommShrink: rank %d, which leads the shrink, went away while it "
                        "sent the rank table",
                        sh->leader);
        goto out_free;
    }
    HCCL_CHECK_GOTO(hccl_bs_cards_check(cards, sh->size, me), res, out_free);
    HCCL_CHECK_GOTO(follow_wait(sh, fd, deadline_ms, &go), res, out_free);
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
    hccl_shrink_t *sh = arg;

    memset(out, 0, sizeof(*out));
    out->setup_fd = -1; /* the shrink has no set-up verdict of the rendezvous' kind */
    if (sh->size == 1) {
        out->cards = hccl_calloc(1, sizeof(*out->cards));
        if (!out->cards)
            return HCCL_FAIL(hcclSystemError, "hcclCommShrink: out of memory");
        out->cards[0] = *card;
        return hccl_random_bytes(&out->comm_id, sizeof(out->comm_id));
    }
    if (sh->parent->rank == sh->leader)
        return hccl_shrink_lead(sh, card, config, deadline_ms, out);
    return shrink_follow(sh, card, config, deadline_ms, out);
}

/* This rank failed before it joined: the leader tells everyone (those that come within a
 * short while: the survivors are calling at about the same time); a follower tells the leader. */
static void shrink_report(void *arg, hcclResult_t status, const char *why)
{
    hccl_shrink_t *sh = arg;
    struct hcclComm *p = sh->parent;
    int64_t deadline = hccl_now_ms() + HCCL_SHRINK_HELLO_WAIT_MS;
    char msg[HCCL_BS_MAX_MSG];
    int fd;

    if (sh->size == 1 || sh->joined)
        return;
    if (p->rank != sh->leader) {
        if (connect_leader(sh, deadline, &fd) == hcclSuccess) {
            hccl_shrink_send_hello(sh, fd, NULL, NULL, status, why, deadline);
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
            if (hccl_shrink_keep_early(sh, fd))
                continue;
            int *list = NULL;
            if (hccl_shrink_read_hello(sh, fd, &h, &list)) {
                hccl_free(list);
                hccl_shrink_send_error(fd, status, msg);
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
    hccl_shrink_t *sh = arg;
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
    hccl_shrink_t sh = {0};
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
