/* The link registry and what every link shares: transfer queues and deferred completion. */
#include <string.h>
#include <strings.h>
#include <time.h>

#include "links/link.h"

int64_t hccl_link_clock_ms(void)
{
    struct timespec ts;

    /* The coarse clock is read without a system call and costs a few ns: it runs per I/O. */
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const hccl_link_ops_t *hccl_link_by_id(int id)
{
    switch (id) {
    case HCCL_LINK_SHM: return &hccl_link_shm_ops;
    case HCCL_LINK_TCP: return &hccl_link_tcp_ops;
#ifdef HCCL_WITH_RDMA
    case HCCL_LINK_RDMA: return &hccl_link_rdma_ops;
#endif
    default: return NULL;
    }
}

hcclResult_t hccl_link_setup_called_off(const hccl_link_env_t *env, const char *link)
{
    return HCCL_FAIL(hcclRemoteError, "rank %d: %s: link set-up called off", env->rank, link);
}

bool hccl_link_allowed(const char *links, const char *name)
{
    size_t n = strlen(name);

    if (!links || !*links)
        return true;
    for (const char *p = links; *p;) {
        const char *end = p + strcspn(p, ", ");
        if ((size_t)(end - p) == n && strncasecmp(p, name, n) == 0)
            return true;
        p = *end ? end + 1 : end;
    }
    return false;
}

static void xfer_on_complete(hccl_post_t *post)
{
    hccl_xfer_t *x = (hccl_xfer_t *)((char *)post - offsetof(hccl_xfer_t, post));

    x->done(x, x->res);
}

void hccl_xfer_complete_later(hccl_reactor_t *r, hccl_xfer_t *x, hcclResult_t res)
{
    x->res = res;
    x->post.fn = xfer_on_complete;
    hccl_reactor_post(r, &x->post);
}

void hccl_xfer_queue_push(hccl_xfer_queue_t *q, hccl_xfer_t *x)
{
    x->next = NULL;
    if (q->tail)
        q->tail->next = x;
    else
        q->head = x;
    q->tail = x;
}

hccl_xfer_t *hccl_xfer_queue_pop(hccl_xfer_queue_t *q)
{
    hccl_xfer_t *x = q->head;

    if (x) {
        q->head = x->next;
        if (!q->head)
            q->tail = NULL;
        x->next = NULL;
    }
    return x;
}

hccl_xfer_t *hccl_xfer_queue_take(hccl_xfer_queue_t *q, uint64_t seq, uint32_t tag)
{
    hccl_xfer_t *prev = NULL;

    for (hccl_xfer_t *x = q->head; x; prev = x, x = x->next) {
        if (x->seq != seq || x->tag != tag)
            continue;
        if (prev)
            prev->next = x->next;
        else
            q->head = x->next;
        if (q->tail == x)
            q->tail = prev;
        x->next = NULL;
        return x;
    }
    return NULL;
}
