/*
 * shm set-up: the receive segment (0600, random name, unlinked as soon as
 * every local peer has mapped it), and the doorbell hand-over over abstract
 * unix sockets, which stay open afterwards: a peer that dies closes them,
 * and that EOF is how a dead process is noticed (it never rings again).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "links/shm/shm.h"

bool hccl_shm_hello_ok(const shm_hello_t *h, uint64_t comm_id, const uint8_t *secret, int nranks)
{
    /* Every field is compared, whatever the first ones say: no early exit on the secret. */
    bool ok = hccl_secret_equal(h->secret, secret, HCCL_SECRET_BYTES);

    ok &= h->magic == SHM_HELLO_MAGIC;
    ok &= h->comm_id == comm_id;
    ok &= h->rank < (uint32_t)nranks;
    return ok;
}

size_t hccl_shm_slot_bytes(size_t ring_bytes)
{
    return SHM_RING_HDR_BYTES + ring_bytes;
}

static hcclResult_t random_name(const char *prefix, char *out, size_t len)
{
    uint8_t rnd[12];
    int o;

    HCCL_CHECK(hccl_random_bytes(rnd, sizeof(rnd)));
    o = snprintf(out, len, "%s", prefix);
    for (size_t i = 0; i < sizeof(rnd) && (size_t)o + 2 < len; i++)
        o += snprintf(out + o, len - (size_t)o, "%02x", rnd[i]);
    return hcclSuccess;
}

static socklen_t uds_addr(const char *name, struct sockaddr_un *sun)
{
    size_t n = strlen(name);

    memset(sun, 0, sizeof(*sun));
    sun->sun_family = AF_UNIX;
    memcpy(sun->sun_path + 1, name, n); /* abstract: leading NUL, nothing on disk */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

hcclResult_t hccl_shm_setup(shm_ctx_t *ctx, void *blob)
{
    hccl_link_env_t *env = ctx->env;
    shm_card_t *card = blob;
    struct sockaddr_un sun;
    char uds_name[SHM_NAME_BYTES];
    int fd;

    ctx->ring_bytes = env->params->buffsize;
    /* Read before the cards are exchanged, so before any rank of this host populates its
     * rings (they need every card to connect): every rank sees the same room. */
    ctx->room_known = hccl_shm_room(&ctx->room);
    ctx->seg_bytes = SHM_RINGS_OFFSET + (size_t)env->nranks * hccl_shm_slot_bytes(ctx->ring_bytes);
    hccl_shm_reclaim_stale();
    HCCL_CHECK(hccl_shm_seg_name(ctx->seg_name, sizeof(ctx->seg_name)));
    fd = shm_open(ctx->seg_name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return HCCL_FAIL(hcclSystemError, "shm: shm_open(%s): %s", ctx->seg_name, strerror(errno));
    ctx->seg_linked = true;
    /* Sparse: only the rings of real peers are ever touched. */
    if (ftruncate(fd, (off_t)ctx->seg_bytes) != 0) {
        close(fd);
        return HCCL_FAIL(hcclSystemError, "shm: ftruncate(%s, %zu): %s", ctx->seg_name, ctx->seg_bytes,
                         strerror(errno));
    }
    ctx->seg = mmap(NULL, ctx->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (ctx->seg == MAP_FAILED) {
        ctx->seg = NULL;
        return HCCL_FAIL(hcclSystemError, "shm: mmap(%s): %s", ctx->seg_name, strerror(errno));
    }
    ctx->bell_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ctx->bell_fd < 0)
        return HCCL_FAIL(hcclSystemError, "shm: eventfd: %s", strerror(errno));
    HCCL_CHECK(random_name("hccl-", uds_name, sizeof(uds_name)));
    ctx->uds_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (ctx->uds_fd < 0)
        return HCCL_FAIL(hcclSystemError, "shm: socket(AF_UNIX): %s", strerror(errno));
    if (bind(ctx->uds_fd, (struct sockaddr *)&sun, uds_addr(uds_name, &sun)) != 0 ||
        listen(ctx->uds_fd, SOMAXCONN) != 0)
        return HCCL_FAIL(hcclSystemError, "shm: bind/listen(@%s): %s", uds_name, strerror(errno));
    memset(card, 0, sizeof(*card));
    snprintf(card->seg, sizeof(card->seg), "%s", ctx->seg_name);
    snprintf(card->uds, sizeof(card->uds), "%s", uds_name);
    card->ring_bytes = ctx->ring_bytes;
    card->seg_addr = (uint64_t)(uintptr_t)ctx->seg;
    return hcclSuccess;
}

/* Names as shm_setup makes them: a prefix, then hex; nothing else reaches shm_open or connect. */
static bool name_ok(const char *name, size_t len, const char *prefix)
{
    size_t n = strnlen(name, len), p = strlen(prefix);

    if (n == len || n <= p || strncmp(name, prefix, p) != 0)
        return false;
    for (size_t i = p; i < n; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
            return false;
    return true;
}

const char *hccl_shm_card_check(const shm_card_t *card, size_t ring_bytes)
{
    if (!name_ok(card->seg, sizeof(card->seg), "/hccl-"))
        return "its segment name is malformed";
    if (!name_ok(card->uds, sizeof(card->uds), "hccl-"))
        return "its doorbell socket name is malformed";
    if (card->ring_bytes != ring_bytes)
        return "its rings have another size (HCCL_BUFFSIZE must be the same on every rank)";
    return NULL;
}

static hcclResult_t shm_map_peer(shm_ctx_t *ctx, shm_conn_t *sc, const shm_card_t *card)
{
    int me = ctx->env->rank;
    size_t want;
    const char *why = hccl_shm_card_check(card, card->ring_bytes);
    struct stat st;
    int fd;

    if (why)
        return HCCL_FAIL(hcclRemoteError, "rank %d: shm: rank %d's card is malformed: %s", me,
                         sc->conn.peer, why);

    /* Both ends do ring arithmetic with their own size: they must be the same. */
    if (card->ring_bytes != ctx->ring_bytes)
        return HCCL_FAIL(hcclInvalidUsage, "rank %d: shm: rank %d uses rings of %llu bytes, this rank "
                                           "%zu (HCCL_BUFFSIZE must be the same on every rank)", me,
                         sc->conn.peer, (unsigned long long)card->ring_bytes, ctx->ring_bytes);
    want = SHM_RINGS_OFFSET + (size_t)ctx->env->nranks * hccl_shm_slot_bytes(ctx->ring_bytes);
    fd = shm_open(card->seg, O_RDWR | O_CLOEXEC, 0);

    /* The name lives until every local peer has mapped it: gone now, its owner has given up. */
    if (fd < 0 && errno == ENOENT)
        return HCCL_FAIL(hcclRemoteError, "rank %d: shm: rank %d's segment %s is gone: that rank "
                                          "exited or its link set-up failed", me, sc->conn.peer,
                         card->seg);
    if (fd < 0)
        return HCCL_FAIL(hcclSystemError, "rank %d: shm: cannot open rank %d's segment %s: %s", me,
                         sc->conn.peer, card->seg, strerror(errno));
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != want) {
        close(fd);
        return HCCL_FAIL(hcclRemoteError, "rank %d: shm: rank %d's segment %s has the wrong size", me,
                         sc->conn.peer, card->seg);
    }
    sc->peer_seg = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (sc->peer_seg == MAP_FAILED) {
        sc->peer_seg = NULL;
        return HCCL_FAIL(hcclSystemError, "rank %d: shm: mmap of rank %d's segment: %s", me,
                         sc->conn.peer, strerror(errno));
    }
    sc->peer_seg_bytes = want;
    sc->tx_ring = (shm_ring_hdr_t *)((char *)sc->peer_seg + SHM_RINGS_OFFSET +
                                     (size_t)me * hccl_shm_slot_bytes(card->ring_bytes));
    sc->rx_ring = (shm_ring_hdr_t *)((char *)ctx->seg + SHM_RINGS_OFFSET +
                                     (size_t)sc->conn.peer * hccl_shm_slot_bytes(ctx->ring_bytes));
    return hcclSuccess;
}

/* Hands our doorbell to the peer, with the communicator's id and secret. */
static hcclResult_t shm_send_bell(shm_ctx_t *ctx, shm_conn_t *sc, const shm_card_t *card,
                                  int64_t deadline_ms)
{
    hccl_link_env_t *env = ctx->env;
    shm_hello_t hello = {.magic = SHM_HELLO_MAGIC, .rank = (uint32_t)env->rank, .comm_id = env->comm_id};
    struct sockaddr_un sun;
    struct iovec iov = {&hello, sizeof(hello)};
    char cbuf[CMSG_SPACE(sizeof(int))] = {0};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                         .msg_controllen = sizeof(cbuf)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    struct pollfd p;

    memcpy(hello.secret, env->secret, sizeof(hello.secret));
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &ctx->bell_fd, sizeof(int));
    sc->out_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sc->out_fd < 0)
        return HCCL_FAIL(hcclSystemError, "shm: socket(AF_UNIX): %s", strerror(errno));
    if (connect(sc->out_fd, (struct sockaddr *)&sun, uds_addr(card->uds, &sun)) != 0) {
        /* Its listener was up before it joined the rendezvous: refused means it has ended. */
        if (errno == ECONNREFUSED)
            env->setup_gone = sc->conn.peer;
        return HCCL_FAIL(hcclRemoteError, "rank %d: shm: connect to rank %d (@%s): %s", env->rank,
                         sc->conn.peer, card->uds, strerror(errno));
    }
    p.fd = sc->out_fd;
    p.events = POLLOUT;
    if (poll(&p, 1, (int)(deadline_ms > hccl_now_ms() ? deadline_ms - hccl_now_ms() : 0)) != 1 ||
        sendmsg(sc->out_fd, &msg, MSG_NOSIGNAL) != (ssize_t)sizeof(hello))
        return HCCL_FAIL(hcclRemoteError, "rank %d: shm: sending the doorbell to rank %d: %s",
                         env->rank, sc->conn.peer, strerror(errno));
    return hcclSuccess;
}

/* Receives one peer's doorbell; a stranger is closed and logged, never trusted. */
static hcclResult_t shm_accept_bell(shm_ctx_t *ctx, int64_t deadline_ms, int *got_p)
{
    hccl_link_env_t *env = ctx->env;
    shm_hello_t hello;
    struct iovec iov = {&hello, sizeof(hello)};
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                         .msg_controllen = sizeof(cbuf)};
    struct cmsghdr *cm;
    int bell = -1;
    ssize_t n;
    int fd = accept4(ctx->uds_fd, NULL, NULL, SOCK_CLOEXEC);

    *got_p = -1;
    if (fd < 0)
        return errno == EAGAIN || errno == EINTR ? hcclSuccess
                                                 : HCCL_FAIL(hcclSystemError, "shm: accept: %s",
                                                             strerror(errno));
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int64_t left = deadline_ms - hccl_now_ms();
    n = poll(&p, 1, left > 5000 ? 5000 : (int)(left > 0 ? left : 0)) == 1
            ? recvmsg(fd, &msg, MSG_CMSG_CLOEXEC)
            : -1;
    cm = n == (ssize_t)sizeof(hello) ? CMSG_FIRSTHDR(&msg) : NULL;
    if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
        cm->cmsg_len == CMSG_LEN(sizeof(int)))
        memcpy(&bell, CMSG_DATA(cm), sizeof(int));
    if (bell < 0 || !hccl_shm_hello_ok(&hello, env->comm_id, env->secret, env->nranks) ||
        !ctx->conns[hello.rank] || ctx->conns[hello.rank]->peer_bell >= 0) {
        HCCL_WARN("rank %d: shm: rejected a doorbell connection without a valid hello for this "
                  "communicator", env->rank);
        if (bell >= 0)
            close(bell);
        close(fd);
        return hcclSuccess;
    }
    ctx->conns[hello.rank]->peer_bell = bell;
    ctx->conns[hello.rank]->in_fd = fd;
    *got_p = (int)hello.rank;
    return hcclSuccess;
}

/* The local peers whose doorbell has not come, as "1,3". */
static void shm_missing(const shm_ctx_t *ctx, char *buf, size_t len)
{
    size_t o = 0;

    buf[0] = '\0';
    for (int i = 0; i < ctx->nactive && o + 12 < len; i++)
        if (ctx->conns[ctx->active[i]]->peer_bell < 0)
            o += (size_t)snprintf(buf + o, len - o, "%s%d", o ? "," : "", ctx->active[i]);
}

static hcclResult_t shm_fail_missing(const shm_ctx_t *ctx, hcclResult_t res, int gone)
{
    char missing[256];

    if (gone >= 0) {
        ctx->env->setup_gone = gone;
        return HCCL_FAIL(res, "rank %d: shm: rank %d (pid %d) went away during link set-up (its "
                              "process exited or its initialisation failed)", ctx->env->rank, gone,
                         (int)ctx->conns[gone]->pid);
    }
    shm_missing(ctx, missing, sizeof(missing));
    return HCCL_FAIL(res, "rank %d: shm: ranks %s did not hand over their doorbell before the "
                          "connect timeout", ctx->env->rank, missing);
}

/*
 * Waits up to ms for a doorbell hand-over on the listener (*got_p = 0) while watching our
 * connections to the peers not yet in: one that ends means that peer is gone, and waiting for
 * it until the deadline would only delay the error.
 */
static hcclResult_t shm_wait_bells(shm_ctx_t *ctx, int ms, int *got_p)
{
    struct pollfd *p = hccl_calloc((size_t)ctx->nactive + 2, sizeof(*p));
    int *who = hccl_calloc((size_t)ctx->nactive + 2, sizeof(*who));
    hcclResult_t res = hcclSuccess;
    int np = 2;

    *got_p = -1;
    if (!p || !who) {
        res = HCCL_FAIL(hcclSystemError, "shm: out of memory");
        goto out;
    }
    p[0] = (struct pollfd){.fd = ctx->uds_fd, .events = POLLIN};
    /* [1]: the rendezvous calling the set-up off (another rank failed). */
    p[1] = (struct pollfd){.fd = ctx->env->setup_watch_fd, .events = POLLIN};
    for (int i = 0; i < ctx->nactive; i++) {
        shm_conn_t *sc = ctx->conns[ctx->active[i]];
        if (sc->peer_bell >= 0 || sc->out_fd < 0)
            continue;
        who[np] = ctx->active[i];
        p[np++] = (struct pollfd){.fd = sc->out_fd, .events = POLLIN | POLLRDHUP};
    }
    if (poll(p, (nfds_t)np, ms) <= 0)
        goto out;
    if (p[1].revents) {
        res = hccl_link_setup_called_off(ctx->env, "shm");
        goto out;
    }
    for (int i = 2; i < np; i++) {
        if (p[i].revents) {
            res = shm_fail_missing(ctx, hcclRemoteError, who[i]);
            goto out;
        }
    }
    if (p[0].revents)
        *got_p = 0;
out:
    hccl_free(p);
    hccl_free(who);
    return res;
}

/*
 * The rings' pages are faulted in at set-up rather than by the first calls that pass through
 * them: a ring's first pass takes a page fault per 4 KiB on each side, which doubled the time
 * of a first 4 MiB AllReduce and skewed the start-up calibration (docs/performance.md).
 * Populating (not writing) leaves what a peer already wrote alone. Only where /dev/shm has room
 * for every local rank's rings: otherwise they stay sparse, as the warning of check_room says,
 * and small calls still run. Without MADV_POPULATE_WRITE (Linux before 5.14) the faults stay.
 */
static void shm_populate_rings(shm_ctx_t *ctx)
{
#ifdef MADV_POPULATE_WRITE
    size_t bytes = SHM_RING_HDR_BYTES + ctx->ring_used;
    size_t per_rank = SHM_RINGS_OFFSET + (size_t)ctx->nactive * hccl_shm_slot_bytes(ctx->ring_used);
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);

    if (ctx->nactive == 0)
        return;
    if (!ctx->room_known || ctx->room < per_rank * (size_t)(ctx->nactive + 1)) {
        HCCL_INFO(HCCL_SUB_LINK,
                  "rank %d: shm: rings left sparse: /dev/shm had %zu KiB free, the host's rings "
                  "take %zu KiB",
                  ctx->env->rank, ctx->room_known ? ctx->room >> 10 : 0,
                  per_rank * (size_t)(ctx->nactive + 1) >> 10);
        return;
    }
    for (int i = 0; i < ctx->nactive; i++) {
        shm_conn_t *sc = ctx->conns[ctx->active[i]];
        uintptr_t ring[2] = {(uintptr_t)sc->tx_ring, (uintptr_t)sc->rx_ring};
        for (int k = 0; k < 2; k++) {
            uintptr_t start = ring[k] & ~(page - 1);
            /* Best effort: a page left out is faulted in when first used, as without this. */
            if (madvise((void *)start, ring[k] + bytes - start, MADV_POPULATE_WRITE) != 0) {
                HCCL_INFO(HCCL_SUB_LINK,
                          "rank %d: shm: the ring shared with rank %d not populated: %s",
                          ctx->env->rank, ctx->active[i], strerror(errno));
                return;
            }
        }
    }
    HCCL_INFO(HCCL_SUB_LINK, "rank %d: shm: %d rings of %zu KiB populated", ctx->env->rank,
              2 * ctx->nactive, ctx->ring_used >> 10);
#else
    (void)ctx;
#endif
}

hcclResult_t hccl_shm_connect_all(shm_ctx_t *ctx, const int *peers, int npeers, int64_t deadline_ms)
{
    hccl_link_env_t *env = ctx->env;
    int waiting = npeers;

    for (int i = 0; i < npeers; i++) {
        shm_conn_t *sc = hccl_calloc(1, sizeof(*sc));
        if (!sc)
            return HCCL_FAIL(hcclSystemError, "shm: out of memory");
        sc->ctx = ctx;
        sc->conn.peer = peers[i];
        sc->peer_bell = sc->out_fd = sc->in_fd = -1;
        sc->pid = (pid_t)env->cards[peers[i]].pid;
        ctx->conns[peers[i]] = sc;
        ctx->active[ctx->nactive++] = peers[i];
    }
    for (int i = 0; i < npeers; i++) {
        const shm_card_t *card = (const shm_card_t *)env->cards[peers[i]].blob[HCCL_LINK_SHM];
        HCCL_CHECK(shm_map_peer(ctx, ctx->conns[peers[i]], card));
        HCCL_CHECK(shm_send_bell(ctx, ctx->conns[peers[i]], card, deadline_ms));
    }
    while (waiting > 0) {
        int64_t left = deadline_ms - hccl_now_ms();
        int got;
        if (left <= 0)
            return shm_fail_missing(ctx, hcclTimeout, -1);
        HCCL_CHECK(shm_wait_bells(ctx, left > 1000 ? 1000 : (int)left, &got));
        if (got < 0)
            continue;
        HCCL_CHECK(shm_accept_bell(ctx, deadline_ms, &got));
        if (got >= 0)
            waiting--;
    }
    shm_populate_rings(ctx);
    /* Every local peer has mapped our segment (they map before they ring): drop the name. */
    shm_unlink(ctx->seg_name);
    ctx->seg_linked = false;
    close(ctx->uds_fd);
    ctx->uds_fd = -1;
    return hcclSuccess;
}

static void shm_live_finalized(struct event *ev, void *arg)
{
    (void)ev, (void)arg;
}

void hccl_shm_conn_close(shm_conn_t *sc)
{
    /* Maybe from a waiter driving the reactor while the liveness callback waits for the lock
     * it holds: libevent's finalizer frees the event once that callback is done, without
     * waiting here. The callback then finds the connection closed. */
    if (sc->live_ev)
        event_free_finalize(0, sc->live_ev, shm_live_finalized);
    sc->live_ev = NULL;
    if (sc->out_fd >= 0)
        close(sc->out_fd);
    if (sc->in_fd >= 0)
        close(sc->in_fd);
    if (sc->peer_bell >= 0)
        close(sc->peer_bell);
    sc->out_fd = sc->in_fd = sc->peer_bell = -1;
}

void hccl_shm_teardown(shm_ctx_t *ctx)
{
    for (int i = 0; i < ctx->nactive; i++) {
        shm_conn_t *sc = ctx->conns[ctx->active[i]];
        hccl_shm_conn_close(sc);
        if (sc->peer_seg)
            munmap(sc->peer_seg, sc->peer_seg_bytes);
        hccl_framer_fini(&sc->framer);
        hccl_free(sc);
        ctx->conns[ctx->active[i]] = NULL;
    }
    ctx->nactive = 0;
    if (ctx->bell_ev)
        event_free(ctx->bell_ev);
    ctx->bell_ev = NULL;
    if (ctx->more_ev)
        event_free(ctx->more_ev);
    ctx->more_ev = NULL;
    if (ctx->bell_fd >= 0)
        close(ctx->bell_fd);
    if (ctx->uds_fd >= 0)
        close(ctx->uds_fd);
    ctx->bell_fd = ctx->uds_fd = -1;
    if (ctx->seg_linked)
        shm_unlink(ctx->seg_name);
    ctx->seg_linked = false;
    if (ctx->seg)
        munmap(ctx->seg, ctx->seg_bytes);
    ctx->seg = NULL;
}
