/* Helpers of the reactor's unit tests (test_reactor, test_requests, test_reactor_comm). */
#ifndef HCCL_TEST_REACTOR_HELPERS_H
#define HCCL_TEST_REACTOR_HELPERS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hccl.h"
#include "reactor/reactor.h"

#define WAIT_MS 30000    /* bound on any wait; never reached when things work */
#define CONNECT_MS 20000 /* connect timeout of the communicators made here */
#define ERRLEN 512

/* A counter guarded by a mutex, with a condition variable on CLOCK_MONOTONIC. */
typedef struct {
    pthread_mutex_t mtx;
    pthread_cond_t cond;
    int count;
} counter_t;

int64_t mono_ms(void);
void counter_init(counter_t *c);
void counter_destroy(counter_t *c);
void counter_add(counter_t *c, int n);
bool counter_wait(counter_t *c, int n, int timeout_ms);
bool fd_readable(int fd, int timeout_ms);
uint64_t fd_drain(int fd);
bool fd_collect(int fd, uint64_t *total, uint64_t want);
void worker_fail(char *err, int line, const char *what);
void run_on_reactor(hccl_reactor_t *r, void (*fn)(void *), void *arg);
void reactor_barrier(hccl_reactor_t *r);
hccl_reactor_t *own_reactor(void);
void post_complete(hccl_reactor_t *r, hcclRequest_t req, hcclResult_t res, const char *msg);
hcclRequest_t new_request(hccl_reactor_t *r);
/* Element sizes by hcclDataType_t; n elements of dt from seed, the same on every call. */
extern const size_t dt_size[hcclNumTypes];
void fill(void *buf, hcclDataType_t dt, size_t n, uint32_t seed);

/* Failures inside worker threads are recorded (first one wins) and asserted on the main thread. */
#define TCHECK(err_x, cond_x)                                                                      \
    do {                                                                                           \
        if (!(cond_x)) {                                                                           \
            worker_fail((err_x), __LINE__, #cond_x);                                               \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

#endif
