/*
 * Bootstrap: a rendezvous service (a thread of the process that called
 * hcclGetUniqueId, or of rank 0 under hcclCommInitGroup) collects every
 * rank's card, checks that the ranks agree (size, no duplicate, no gap),
 * and answers all of them with the full table, or with the same error.
 * Every connection must present the secret of the id before it is read.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/comm.h"
#include "core/wire.h"

#define BS_HELLO_WAIT_MS 5000
#define BS_ERROR_LINGER_MS 1000

typedef hccl_bs_hello_t bs_hello_t;
typedef hccl_bs_reply_t bs_reply_t;

typedef struct bs_root {
    hccl_id_t id;
    int listen_fd;
    int expected;              /* communicator size, 0 until the first rank says */
    int *fds;                  /* [expected] accepted rank connections, -1 if none */
    bs_hello_t *hellos;        /* [expected] */
    int joined;
    int served;                /* connections answered, valid or not */
    int max_claimed;           /* largest size any rank claimed */
    int64_t deadline_ms;       /* report missing ranks then, before the first rank gives up */
    hcclResult_t err;
    int64_t err_at_ms;         /* when err was set */
    char msg[HCCL_BS_MAX_MSG];
    /* Under services_mtx: */
    uint64_t service;          /* its number, for hccl_bootstrap_root_wait */
    pthread_t thread;
    bool ended;                /* root_main returns next: joining it does not wait */
    struct bs_root *next;
} bs_root_t;

/*
 * Every service thread is joinable, and the library joins each once it ended (at the next
 * start, or when a caller waits for services), so that none outlives its work unseen. A
 * service owns its bs_root_t until it ends; then whoever joins it frees it.
 */
static pthread_mutex_t services_mtx = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t services_cond = PTHREAD_COND_INITIALIZER;
static pthread_once_t services_once = PTHREAD_ONCE_INIT;
static bs_root_t *services;
/* A forked child has none of its parent's service threads: it keeps their records here, never
 * to join them. */
static bs_root_t *services_orphaned;
static uint64_t services_next = 1;

void hccl_id_to_addr(const hccl_id_t *id, hccl_sockaddr_t *addr)
{
    memset(addr, 0, sizeof(*addr));
    if (id->family == AF_INET6) {
        addr->in6.sin6_family = AF_INET6;
        addr->in6.sin6_port = id->port;
        memcpy(&addr->in6.sin6_addr, id->addr, 16);
    } else {
        addr->in4.sin_family = AF_INET;
        addr->in4.sin_port = id->port;
        memcpy(&addr->in4.sin_addr, id->addr, 4);
    }
}

void hccl_id_from_addr(hccl_id_t *id, const hccl_sockaddr_t *addr)
{
    id->family = addr->sa.sa_family;
    if (addr->sa.sa_family == AF_INET6) {
        id->port = addr->in6.sin6_port;
        memcpy(id->addr, &addr->in6.sin6_addr, 16);
    } else {
        id->port = addr->in4.sin_port;
        memcpy(id->addr, &addr->in4.sin_addr, 4);
    }
}

hcclResult_t hccl_bootstrap_root_listen(hccl_sockaddr_t *addr, int *fd_p)
{
    return hccl_socket_listen(addr, fd_p);
}

static void root_send_error(int fd, hcclResult_t status, const char *msg)
{
    size_t len = strnlen(msg, HCCL_BS_MAX_MSG);
    bs_reply_t rep = {.magic = HCCL_BS_REPLY_MAGIC, .status = status, .msg_len = (uint32_t)len};
    int64_t deadline = hccl_now_ms() + 2000;

    if (hccl_socket_send_all(fd, &rep, sizeof(rep), deadline) == hcclSuccess)
        hccl_socket_send_all(fd, msg, rep.msg_len, deadline);
}

/* The first error wins and goes to everyone who joined; later arrivals get it too. */
static void root_fail(bs_root_t *rt, hcclResult_t status, const char *msg)
{
    if (rt->err != hcclSuccess)
        return;
    rt->err = status;
    rt->err_at_ms = hccl_now_ms();
    snprintf(rt->msg, sizeof(rt->msg), "bootstrap: %s", msg);
    HCCL_WARN("%s", rt->msg);
    for (int r = 0; r < rt->expected; r++) {
        if (rt->fds[r] >= 0) {
            root_send_error(rt->fds[r], status, rt->msg);
            close(rt->fds[r]);
            rt->fds[r] = -1;
        }
    }
}

static hcclResult_t root_alloc(bs_root_t *rt, int n)
{
    rt->expected = n;
    rt->fds = hccl_malloc((size_t)n * sizeof(*rt->fds));
    rt->hellos = hccl_calloc((size_t)n, sizeof(*rt->hellos));
    if (!rt->fds || !rt->hellos)
        return HCCL_FAIL(hcclSystemError, "bootstrap: out of memory for %d ranks", n);
    for (int r = 0; r < n; r++)
        rt->fds[r] = -1;
    return hcclSuccess;
}

/*
 * The ranks' connect timeouts may be shorter than ours: name the missing ranks a little before
 * the first waiting rank gives up, so that every rank hears why.
 */
static void root_note_wait(bs_root_t *rt, int32_t wait_ms)
{
    int64_t margin, d;

    if (wait_ms <= 0)
        return;
    margin = wait_ms / 10 < 200 ? 200 : wait_ms / 10 > 2000 ? 2000 : wait_ms / 10;
    d = hccl_now_ms() + (wait_ms > margin ? wait_ms - margin : wait_ms / 2);
    if (d < rt->deadline_ms)
        rt->deadline_ms = d;
}

/* Checks one hello (already accepted by hccl_bs_hello_check); takes the connection. */
static void root_on_hello(bs_root_t *rt, int fd, const bs_hello_t *h)
{
    char msg[HCCL_BS_MAX_MSG - 16];

    rt->served++;
    if (h->nranks > rt->max_claimed)
        rt->max_claimed = h->nranks;
    if (rt->err == hcclSuccess && h->status != hcclSuccess) {
        char why[sizeof(h->errmsg) + 1];
        snprintf(why, sizeof(why), "%.*s", (int)sizeof(h->errmsg), h->errmsg);
        snprintf(msg, sizeof(msg), "root cause at rank %d: rank %d could not start: %s", h->rank,
                 h->rank, why);
        root_fail(rt, h->status > hcclSuccess && h->status < hcclNumResults ? (hcclResult_t)h->status
                                                                            : hcclRemoteError, msg);
    }
    if (rt->err == hcclSuccess && rt->expected == 0) {
        if (root_alloc(rt, h->nranks) != hcclSuccess)
            root_fail(rt, hcclSystemError, "out of memory");
    }
    if (rt->err == hcclSuccess && h->nranks != rt->expected) {
        char others[200] = "";
        size_t o = 0;
        for (int r = 0; r < rt->expected && o < sizeof(others) - 12; r++)
            if (rt->fds[r] >= 0)
                o += (size_t)snprintf(others + o, sizeof(others) - o, "%s%d", o ? "," : "", r);
        if (o)
            snprintf(msg, sizeof(msg), "ranks disagree on the communicator size: rank %d says %d, "
                     "ranks %s say %d", h->rank, h->nranks, others, rt->expected);
        else
            snprintf(msg, sizeof(msg), "ranks disagree on the communicator size: rank %d says %d, "
                     "rank 0 created the rendezvous for %d", h->rank, h->nranks, rt->expected);
        root_fail(rt, hcclInvalidUsage, msg);
    }
    if (rt->err == hcclSuccess && (h->rank < 0 || h->rank >= rt->expected)) {
        snprintf(msg, sizeof(msg), "rank %d is out of range for a communicator of %d ranks", h->rank,
                 rt->expected);
        root_fail(rt, hcclInvalidUsage, msg);
    }
    for (int r = 0; rt->err == hcclSuccess && h->status == hcclSuccess && r < rt->expected; r++) {
        char diff[HCCL_BS_MAX_MSG - 200];
        if (rt->fds[r] < 0)
            continue;
        if (hccl_config_diff(rt->hellos[r].config, r, h->config, h->rank, diff, sizeof(diff)) > 0) {
            snprintf(msg, sizeof(msg), "settings differ between ranks (they shape every collective "
                     "and must be the same on all ranks; HCCL_ALGO includes hcclConfig_t.algo): %s", diff);
            root_fail(rt, hcclInvalidUsage, msg);
        }
        break; /* one joined rank is enough to compare with */
    }
    if (rt->err == hcclSuccess && rt->fds[h->rank] >= 0) {
        snprintf(msg, sizeof(msg), "rank %d joined twice (pids %u and %u): duplicate rank",
                 h->rank, rt->hellos[h->rank].card.pid, h->card.pid);
        root_fail(rt, hcclInvalidUsage, msg);
    }
    if (rt->err != hcclSuccess) {
        root_send_error(fd, rt->err, rt->msg);
        close(fd);
        return;
    }
    rt->fds[h->rank] = fd;
    rt->hellos[h->rank] = *h;
    rt->joined++;
    root_note_wait(rt, h->wait_ms);
}

static void root_answer_all(bs_root_t *rt)
{
    bs_reply_t rep = {.magic = HCCL_BS_REPLY_MAGIC, .status = hcclSuccess, .nranks = (uint32_t)rt->expected};
    hccl_card_t *cards = hccl_malloc((size_t)rt->expected * sizeof(*cards));
    int64_t deadline = hccl_now_ms() + 10000;

    if (!cards || hccl_random_bytes(&rep.comm_id, sizeof(rep.comm_id)) != hcclSuccess ||
        hccl_random_bytes(rep.secret, sizeof(rep.secret)) != hcclSuccess) {
        hccl_free(cards);
        root_fail(rt, hcclSystemError, "cannot build the answer");
        return;
    }
    for (int r = 0; r < rt->expected; r++)
        cards[r] = rt->hellos[r].card;
    for (int r = 0; r < rt->expected; r++) {
        if (hccl_socket_send_all(rt->fds[r], &rep, sizeof(rep), deadline) != hcclSuccess ||
            hccl_socket_send_all(rt->fds[r], cards, (size_t)rt->expected * sizeof(*cards), deadline) !=
                hcclSuccess)
            HCCL_WARN("bootstrap: could not send the rank table to rank %d", r);
    }
    hccl_free(cards);
}

static void root_timeout(bs_root_t *rt)
{
    char msg[400];
    size_t o = 0;

    int first = -1;

    for (int r = 0; r < rt->expected && first < 0; r++)
        if (rt->fds[r] < 0)
            first = r;
    /* The first missing rank is the origin, the same for every rank that hears it. */
    o += (size_t)snprintf(msg, sizeof(msg),
                          "root cause at rank %d: %d of %d ranks joined before the connect "
                          "timeout; missing ranks:",
                          first, rt->joined, rt->expected);
    for (int r = 0; r < rt->expected && o < sizeof(msg) - 16; r++)
        if (rt->fds[r] < 0)
            o += (size_t)snprintf(msg + o, sizeof(msg) - o, " %d", r);
    root_fail(rt, hcclTimeout, rt->expected ? msg : "no rank joined before the connect timeout");
}

static void *root_main(void *arg)
{
    bs_root_t *rt = arg;

    hccl_log_set_rank(-1);
    for (;;) {
        struct pollfd p = {.fd = rt->listen_fd, .events = POLLIN};
        int64_t left = rt->deadline_ms - hccl_now_ms();
        hccl_sockaddr_t peer;
        socklen_t plen = sizeof(peer);
        bs_hello_t h;
        const char *why = NULL;
        char buf[64];
        int fd;

        if (rt->err == hcclSuccess && rt->expected > 0 && rt->joined == rt->expected) {
            int32_t wait_ms = 0;
            root_answer_all(rt);
            /* The ranks' link set-up, bounded by the longest connect timeout any rank has. */
            for (int r = 0; r < rt->expected; r++)
                if (rt->hellos[r].wait_ms > wait_ms)
                    wait_ms = rt->hellos[r].wait_ms;
            if (rt->err == hcclSuccess)
                hccl_bootstrap_setup_serve(rt->fds, rt->expected, hccl_now_ms() + wait_ms);
            break;
        }
        /* After an error, stay until everyone who could come has been told: every rank that any
         * rank claimed, but not long for the ranks only a disagreeing size would add. */
        if (rt->err != hcclSuccess &&
            (rt->served >= rt->max_claimed ||
             (rt->expected > 0 && rt->served >= rt->expected &&
              hccl_now_ms() >= rt->err_at_ms + BS_ERROR_LINGER_MS)))
            break;
        if (left <= 0) {
            if (rt->err == hcclSuccess)
                root_timeout(rt);
            break;
        }
        if (poll(&p, 1, left > 200 ? 200 : (int)left) <= 0)
            continue;
        fd = accept4(rt->listen_fd, &peer.sa, &plen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        hccl_socket_addr_str(&peer, buf, sizeof(buf));
        if (hccl_socket_recv_all(fd, &h, sizeof(h), hccl_now_ms() + BS_HELLO_WAIT_MS) != hcclSuccess)
            why = "no complete hello before the hello timeout";
        else
            why = hccl_bs_hello_check(&h, rt->id.secret);
        if (why) {
            HCCL_WARN("bootstrap: rejected a connection from %s: %s", buf, why);
            close(fd);
            continue;
        }
        root_on_hello(rt, fd, &h);
    }
    for (int r = 0; r < rt->expected; r++)
        if (rt->fds[r] >= 0)
            close(rt->fds[r]);
    close(rt->listen_fd);
    hccl_free(rt->fds);
    hccl_free(rt->hellos);
    pthread_mutex_lock(&services_mtx);
    rt->ended = true;
    pthread_cond_broadcast(&services_cond);
    pthread_mutex_unlock(&services_mtx);
    return NULL;
}

static void services_lock_for_fork(void)
{
    pthread_mutex_lock(&services_mtx);
}

static void services_unlock_after_fork(void)
{
    pthread_mutex_unlock(&services_mtx);
}

static void services_orphan_in_child(void)
{
    while (services) {
        bs_root_t *rt = services;
        services = rt->next;
        rt->next = services_orphaned;
        services_orphaned = rt;
    }
    pthread_mutex_unlock(&services_mtx);
}

static void services_init(void)
{
    pthread_atfork(services_lock_for_fork, services_unlock_after_fork, services_orphan_in_child);
}

/* Under services_mtx: joins and frees the services that ended. */
static void services_reap(void)
{
    for (bs_root_t **pp = &services; *pp;) {
        bs_root_t *rt = *pp;
        if (!rt->ended) {
            pp = &rt->next;
            continue;
        }
        *pp = rt->next;
        pthread_join(rt->thread, NULL);
        hccl_free(rt);
    }
}

void hccl_bootstrap_root_wait(uint64_t service)
{
    pthread_mutex_lock(&services_mtx);
    for (;;) {
        bs_root_t *rt = services;
        while (rt && rt->service != service)
            rt = rt->next;
        if (!rt || rt->ended) /* not listed: already joined */
            break;
        pthread_cond_wait(&services_cond, &services_mtx);
    }
    services_reap();
    pthread_mutex_unlock(&services_mtx);
}

bool hccl_bootstrap_quiesce(int64_t deadline_ms)
{
    bool running;

    pthread_mutex_lock(&services_mtx);
    for (;;) {
        int64_t left = deadline_ms - hccl_now_ms();
        struct timespec ts;

        services_reap();
        running = services != NULL;
        if (!running || left <= 0)
            break;
        hccl_abs_deadline(&ts, left);
        pthread_cond_timedwait(&services_cond, &services_mtx, &ts);
    }
    pthread_mutex_unlock(&services_mtx);
    return !running;
}

hcclResult_t hccl_bootstrap_root_start(const hccl_id_t *id, int nranks, int timeout_ms, int *listen_fd,
                                       uint64_t *service_p)
{
    bs_root_t *rt;
    int rc;

    pthread_once(&services_once, services_init);
    pthread_mutex_lock(&services_mtx);
    services_reap();
    pthread_mutex_unlock(&services_mtx);
    rt = hccl_calloc(1, sizeof(*rt));
    if (!rt)
        return HCCL_FAIL(hcclSystemError, "bootstrap: out of memory");
    rt->id = *id;
    rt->listen_fd = *listen_fd;
    rt->deadline_ms = hccl_now_ms() + timeout_ms;
    if (nranks > 0 && root_alloc(rt, nranks) != hcclSuccess) {
        hccl_free(rt->fds);
        hccl_free(rt->hellos);
        hccl_free(rt);
        return hcclSystemError;
    }
    rt->max_claimed = nranks;
    /* Listed before it runs, so that it is never joined unlisted; it cannot end before the
     * lock is let go, since it marks its end under it. */
    pthread_mutex_lock(&services_mtx);
    rc = pthread_create(&rt->thread, NULL, root_main, rt);
    if (rc != 0) {
        pthread_mutex_unlock(&services_mtx);
        hccl_free(rt->fds);
        hccl_free(rt->hellos);
        hccl_free(rt);
        return HCCL_FAIL(hcclSystemError, "bootstrap: pthread_create: %s", strerror(rc));
    }
    rt->service = services_next++;
    rt->next = services;
    services = rt;
    if (service_p)
        *service_p = rt->service;
    pthread_mutex_unlock(&services_mtx);
    *listen_fd = -1; /* the service owns it now */
    return hcclSuccess;
}

void hccl_bootstrap_report(const hccl_id_t *id, int rank, int nranks, hcclResult_t status,
                           const char *why, int64_t deadline_ms)
{
    hccl_sockaddr_t addr;
    bs_hello_t h = {.magic = HCCL_BS_HELLO_MAGIC, .version = HCCL_BS_VERSION, .rank = rank,
                    .nranks = nranks, .status = status};
    int fd;

    snprintf(h.errmsg, sizeof(h.errmsg), "%s", why);
    h.card.rank = (uint32_t)rank;
    memcpy(h.secret, id->secret, sizeof(h.secret));
    hccl_id_to_addr(id, &addr);
    if (hccl_socket_connect_retry(&addr, deadline_ms, &fd) != hcclSuccess)
        return;
    hccl_socket_send_all(fd, &h, sizeof(h), deadline_ms);
    close(fd);
}

hcclResult_t hccl_bootstrap_join(const hccl_id_t *id, int rank, int nranks, const hccl_card_t *card,
                                 const char *config, int64_t deadline_ms, hccl_bootstrap_result_t *out)
{
    hccl_sockaddr_t addr;
    int64_t wait = deadline_ms - hccl_now_ms();
    bs_hello_t h = {.magic = HCCL_BS_HELLO_MAGIC, .version = HCCL_BS_VERSION, .rank = rank,
                    .nranks = nranks, .wait_ms = (int32_t)(wait > INT32_MAX ? INT32_MAX : wait),
                    .card = *card};
    bs_reply_t rep;
    hcclResult_t res;
    char where[64];
    int fd;

    memcpy(h.secret, id->secret, sizeof(h.secret));
    snprintf(h.config, sizeof(h.config), "%s", config);
    hccl_id_to_addr(id, &addr);
    hccl_socket_addr_str(&addr, where, sizeof(where));
    res = hccl_socket_connect_retry(&addr, deadline_ms, &fd);
    if (res != hcclSuccess)
        return HCCL_FAIL(res, "rank %d: cannot reach the rendezvous at %s: %s", rank, where,
                         hccl_error_last());
    HCCL_CHECK_GOTO(hccl_socket_send_all(fd, &h, sizeof(h), deadline_ms), res, err_close);
    res = hccl_socket_recv_all(fd, &rep, sizeof(rep), deadline_ms);
    if (res != hcclSuccess) {
        res = HCCL_FAIL(res == hcclTimeout ? hcclTimeout : hcclRemoteError,
                        "rank %d: no answer from the rendezvous at %s before the connect timeout "
                        "(%s; wrong secret, or other ranks missing)", rank, where, hccl_error_last());
        goto err_close;
    }
    HCCL_CHECK_GOTO(hccl_bs_reply_check(&rep, rank, nranks), res, err_close);
    if (rep.status != hcclSuccess) {
        char msg[HCCL_BS_MAX_MSG + 1] = "";
        /* The verdict stands even when its text does not arrive: say that it is missing. */
        if (hccl_socket_recv_all(fd, msg, rep.msg_len, deadline_ms) == hcclSuccess)
            msg[rep.msg_len] = '\0'; /* msg_len <= HCCL_BS_MAX_MSG: hccl_bs_reply_check */
        else
            snprintf(msg, sizeof(msg), "the rendezvous failed the communicator (its reason did "
                                       "not arrive)");
        res = HCCL_FAIL((hcclResult_t)rep.status, "rank %d: %s", rank, msg);
        goto err_close;
    }
    out->cards = hccl_malloc((size_t)nranks * sizeof(*out->cards));
    if (!out->cards) {
        res = HCCL_FAIL(hcclSystemError, "bootstrap: out of memory");
        goto err_close;
    }
    res = hccl_socket_recv_all(fd, out->cards, (size_t)nranks * sizeof(*out->cards), deadline_ms);
    if (res != hcclSuccess) {
        res = HCCL_FAIL(res, "rank %d: the rank table from %s was cut short", rank, where);
        hccl_free(out->cards);
        out->cards = NULL;
        goto err_close;
    }
    res = hccl_bs_cards_check(out->cards, nranks, rank);
    if (res != hcclSuccess) {
        hccl_free(out->cards);
        out->cards = NULL;
        goto err_close;
    }
    out->comm_id = rep.comm_id;
    memcpy(out->secret, rep.secret, sizeof(out->secret));
    out->setup_fd = fd; /* until the link set-up's end: hccl_bootstrap_setup_done */
    return hcclSuccess;

err_close:
    close(fd);
    return res;
}
