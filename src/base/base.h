/* The base layer: errors, logging, allocation, parameters, sockets, time, dtype helpers,
 * collective kinds and signatures; everything else builds on it. */
#ifndef HCCL_BASE_H
#define HCCL_BASE_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>

#include "hccl.h"

/* ---- logging (log.c) ---- */

enum { HCCL_LOG_NONE = 0, HCCL_LOG_WARN = 1, HCCL_LOG_INFO = 2, HCCL_LOG_TRACE = 3 };
enum {
    HCCL_SUB_INIT = 1u << 0,
    HCCL_SUB_LINK = 1u << 1,
    HCCL_SUB_SCHED = 1u << 2,
    HCCL_SUB_ALGO = 1u << 3,
    HCCL_SUB_REACTOR = 1u << 4,
    HCCL_SUB_ALL = 0x1f,
};

extern int hccl_log_level;
extern unsigned hccl_log_subsys;

void hccl_log_init(void);
/* The rank printed in this thread's log prefix (-1: none). */
void hccl_log_set_rank(int rank);
void hccl_log_write(int level, unsigned sub, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * A small thread-local read on every call: the initial-exec model reads it at a fixed offset
 * instead of through __tls_get_addr (the few bytes come from the static TLS surplus that glibc
 * keeps for libraries loaded with dlopen).
 */
#define HCCL_TLS_FAST __attribute__((tls_model("initial-exec")))

#define HCCL_WARN(...) hccl_log_write(HCCL_LOG_WARN, HCCL_SUB_ALL, __VA_ARGS__)
#define HCCL_LOG_ENABLED(lvl_x, sub_x)                                                   \
    (hccl_log_level >= (lvl_x) && (hccl_log_subsys & (sub_x)))
#define HCCL_INFO(sub_x, ...)                                                            \
    do {                                                                                 \
        if (HCCL_LOG_ENABLED(HCCL_LOG_INFO, sub_x))                                      \
            hccl_log_write(HCCL_LOG_INFO, sub_x, __VA_ARGS__);                           \
    } while (0)
#define HCCL_TRACE(sub_x, ...)                                                           \
    do {                                                                                 \
        if (HCCL_LOG_ENABLED(HCCL_LOG_TRACE, sub_x))                                     \
            hccl_log_write(HCCL_LOG_TRACE, sub_x, __VA_ARGS__);                          \
    } while (0)

/* ---- errors (error.c) ---- */

/*
 * Records the text as this thread's last error, logs it at WARN and returns
 * res. Used where an error is detected; callers only propagate.
 */
hcclResult_t hccl_error_set(hcclResult_t res, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Same, but logs at INFO: for errors that are expected on some paths. */
hcclResult_t hccl_error_set_quiet(hcclResult_t res, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* This thread's last error text ("" if none). */
const char *hccl_error_last(void);
/* Copies text into this thread's slot (hcclWait handing over a request's error). */
void hccl_error_put(const char *text);

#define HCCL_FAIL(res_x, ...) hccl_error_set((res_x), __VA_ARGS__)

/* A spin-wait hint: the core's sibling thread and the memory system get the pipeline. */
static inline void hccl_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    atomic_signal_fence(memory_order_seq_cst);
#endif
}

static inline bool hccl_is_failure(hcclResult_t res)
{
    return res != hcclSuccess && res != hcclInProgress;
}

#define HCCL_CHECK(call_x)                                                               \
    do {                                                                                 \
        hcclResult_t res_x_ = (call_x);                                                  \
        if (hccl_is_failure(res_x_)) {                                                   \
            HCCL_TRACE(HCCL_SUB_ALL, "%s:%d -> %d", __FILE__, __LINE__, (int)res_x_);    \
            return res_x_;                                                               \
        }                                                                                \
    } while (0)
#define HCCL_CHECK_GOTO(call_x, res_x, label_x)                                          \
    do {                                                                                 \
        (res_x) = (call_x);                                                              \
        if (hccl_is_failure(res_x)) {                                                    \
            HCCL_TRACE(HCCL_SUB_ALL, "%s:%d -> %d", __FILE__, __LINE__, (int)(res_x));   \
            goto label_x;                                                                \
        }                                                                                \
    } while (0)

/* ---- allocation (alloc.c) ---- */

void *hccl_calloc(size_t n, size_t size);
void *hccl_malloc(size_t size);
void *hccl_realloc(void *p, size_t size);
/* align: a power of two, a multiple of sizeof(void *); freed with hccl_free. */
void *hccl_aligned_alloc(size_t align, size_t size);
void hccl_free(void *p);
/* Tests: make the n-th allocation from now fail (0: never). */
void hccl_alloc_fail_at(long n);

/* ---- stores (store.c) ---- */

/* memcpy of non-overlapping memory with stores that bypass the cache (where the CPU has them):
 * for results larger than the last-level cache. */
void hccl_store_copy(void *dst, const void *src, size_t n);

/* ---- time ---- */

/* Monotonic milliseconds. */
int64_t hccl_now_ms(void);
/* CLOCK_MONOTONIC in ns, for timing short spans. */
int64_t hccl_now_ns(void);
/* *ts = CLOCK_REALTIME now + ms: the absolute deadline pthread's timed waits take. */
void hccl_abs_deadline(struct timespec *ts, int64_t ms);

/* ---- data types, ops and collective kinds (dtype.c) ---- */

size_t hccl_dtype_size(hcclDataType_t dt);
const char *hccl_dtype_name(hcclDataType_t dt);
const char *hccl_op_name(hcclRedOp_t op);

typedef enum {
    HCCL_COLL_ALLREDUCE = 0,
    HCCL_COLL_BROADCAST,
    HCCL_COLL_REDUCE,
    HCCL_COLL_ALLGATHER,
    HCCL_COLL_REDUCESCATTER,
    HCCL_COLL_ALLTOALL,
    HCCL_COLL_ALLTOALLV,
    HCCL_COLL_BARRIER,
    HCCL_COLL_SEND,          /* point to point: root is the peer */
    HCCL_COLL_RECV,
    HCCL_NUM_COLLS
} hccl_coll_t;

const char *hccl_coll_name(hccl_coll_t coll);

/* ---- collective signatures (sig.c) ---- */

/*
 * 32 bits that name a collective call (kind, dtype, op, root, a hash of the count); every
 * frame of it carries them, so that ranks running different collectives at the same sequence
 * number are told so instead of waiting for each other. 0 = not checked.
 */
uint32_t hccl_sig_make(int coll, int dtype, int op, int root, uint64_t count);
/* "allreduce(float32, sum)" and friends, for messages. */
void hccl_sig_describe(uint32_t sig, char *buf, size_t len);

/* ---- parameters (param.c) ---- */

#define HCCL_ALGO_STRLEN 256
#define HCCL_NAME_STRLEN 64

typedef struct hccl_params {
    int connect_timeout_ms;          /* bootstrap and link set-up */
    int exec_timeout_ms;             /* per request, 0 = none */
    char algo[HCCL_ALGO_STRLEN];     /* HCCL_ALGO syntax, "" = automatic */
    size_t buffsize;                 /* bytes of staging per peer link */
    char links[HCCL_NAME_STRLEN];    /* allowed link names, "" = all */
    char ifname[HCCL_NAME_STRLEN];   /* interface or prefix, "" = auto */
    int nsocks;                      /* TCP sockets per peer (1 today) */
    size_t cma_threshold;            /* shm: messages of at least this many bytes go single-copy */
    size_t shm_pull_max;             /* shm: offers up to this are pulled through the ring */
    size_t tcp_offer_min;            /* tcp: messages of at least this wait for a PULL */
    bool recv_reduce;                /* a receive feeding a reduce reduces as it arrives */
    size_t store_min;                /* HCCL_STORE_MIN: see hccl_exec_set_store_min; SIZE_MAX:
                                      * from the last-level cache */
    size_t lane_max;                 /* HCCL_LANE_MAX: AllReduces up to this take the shm lane;
                                        SIZE_MAX: chosen by the communicator */
    char host_id[HCCL_NAME_STRLEN];  /* HCCL_HOST_ID override of host identity, "" = detect */
    int check;                       /* HCCL_CHECK: compare every collective's signature first */
    int calibrate;                   /* HCCL_CALIBRATE: measure the tuner's constants at start */
    int spin_us;                     /* HCCL_SPIN_US: poll this long without progress, then sleep */
    char cost_model[HCCL_NAME_STRLEN]; /* HCCL_COST_MODEL "alpha_us,GB/s,reduce_GB/s", "" = default */
    char topo_dump[256];             /* HCCL_TOPO_DUMP path, "" = none */
    int dump_on_signal;              /* HCCL_DUMP_ON_SIGNAL: SIGUSR1 logs hcclCommDumpState */
} hccl_params_t;

/* Reads the environment once per process (warning about unknown HCCL_* names), then config. */
hcclResult_t hccl_params_load(hccl_params_t *p, const hcclConfig_t *config);
/* Parses a positive/zero integer environment value; returns def (and warns) when malformed. */
long hccl_param_env_long(const char *name, long def);
/* One HCCL_* variable: its default as docs/env.md shows it, and one line of doc. */
typedef struct {
    const char *name;
    const char *def;
    const char *doc;
} hccl_param_info_t;
/* The table of every known HCCL_* variable, for the docs check; NULL past the end. */
size_t hccl_param_count(void);
const hccl_param_info_t *hccl_param_at(size_t i);

/* ---- sockets (socket.c) ---- */

typedef union {
    struct sockaddr sa;
    struct sockaddr_in in4;
    struct sockaddr_in6 in6;
    struct sockaddr_storage ss;
} hccl_sockaddr_t;

/* The address to listen on: HCCL_SOCKET_IFNAME (or prefix), else the first up non-loopback
 * interface, else loopback. Port 0. */
hcclResult_t hccl_socket_pick_addr(const char *ifname, hccl_sockaddr_t *addr);
/* Parses "host:port" (IPv4, [IPv6] or a name). */
hcclResult_t hccl_socket_parse_addr(const char *text, hccl_sockaddr_t *addr);
/* "a.b.c.d:port" into buf. */
const char *hccl_socket_addr_str(const hccl_sockaddr_t *addr, char *buf, size_t len);
socklen_t hccl_socket_addr_len(const hccl_sockaddr_t *addr);
/* A non-blocking, close-on-exec listening socket; addr's port is filled in. */
hcclResult_t hccl_socket_listen(hccl_sockaddr_t *addr, int *fd_p);
/* Whether the connected socket fd is connected to itself (its local address is its peer's). */
bool hccl_socket_connected_to_itself(int fd);
/* Blocking helpers with a deadline (hccl_now_ms() based); used only off the reactor. */
hcclResult_t hccl_socket_connect_retry(const hccl_sockaddr_t *addr, int64_t deadline_ms,
                                       int *fd_p);
/* The same, given up (hcclRemoteError) as soon as watch_fd (>= 0) becomes readable. */
hcclResult_t hccl_socket_connect_watch(const hccl_sockaddr_t *addr, int64_t deadline_ms,
                                       int watch_fd, int *fd_p);
hcclResult_t hccl_socket_send_all(int fd, const void *buf, size_t len, int64_t deadline_ms);
hcclResult_t hccl_socket_recv_all(int fd, void *buf, size_t len, int64_t deadline_ms);
/* Constant-time comparison of secrets. */
bool hccl_secret_equal(const uint8_t *a, const uint8_t *b, size_t len);
/* Fills buf with random bytes from the kernel. */
hcclResult_t hccl_random_bytes(void *buf, size_t len);

#endif /* HCCL_BASE_H */
