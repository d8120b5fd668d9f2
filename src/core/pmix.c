/*
 * The PMIx bootstrap: under Open MPI's mpirun, PRRTE's prterun or Slurm's srun --mpi=pmix the
 * launcher's PMIx server already exchanges keys between the ranks of a job, so rank 0's unique
 * id travels through it and nobody has to pick a rendezvous address.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "core/pmix.h"

bool hccl_pmix_launched(void)
{
    const char *rank = getenv("PMIX_RANK"), *nspace = getenv("PMIX_NAMESPACE");

    return rank && *rank && nspace && *nspace;
}

#ifndef HCCL_WITH_PMIX

bool hccl_pmix_built(void)
{
    return false;
}

hcclResult_t hccl_pmix_comm_init(hcclComm_t *comm_p)
{
    (void)comm_p;
    return HCCL_FAIL(hcclUnsupported, "hcclCommInitFromEnv: this build has no PMIx (libpmix-dev)");
}

hcclResult_t hccl_pmix_rank_size(int *rank_p, int *size_p)
{
    (void)rank_p, (void)size_p;
    return HCCL_FAIL(hcclUnsupported, "hcclCommInitFromEnv: this build has no PMIx (libpmix-dev)");
}

#else

#include <errno.h>
#include <pthread.h>
#include <time.h>

#include <pmix.h>

/*
 * Fences match across processes by their order alone, so one exchange runs at a time in this
 * process, and each uses a key of its own: the server keeps what an earlier one put.
 */
static pthread_mutex_t pmix_mtx = PTHREAD_MUTEX_INITIALIZER;
static unsigned pmix_rounds;

/*
 * A fence in flight. A waiter whose deadline passes leaves it on the abandoned list, and
 * the callback, which may still come (or never, if PMIx drops it at finalize), frees it.
 * The procs and info stay valid until then, as PMIx_Fence_nb requires.
 */
typedef struct fence {
    pmix_proc_t all;
    pmix_info_t info[2];
    bool done;
    bool abandoned;
    pmix_status_t status;
    struct fence *next; /* on the abandoned list */
} fence_t;

static pthread_mutex_t fence_mtx = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fence_cond;
static pthread_once_t fence_once = PTHREAD_ONCE_INIT;
static fence_t *fences_abandoned;

bool hccl_pmix_built(void)
{
    return true;
}

static void fence_cond_init(void)
{
    pthread_condattr_t attr;

    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&fence_cond, &attr);
    pthread_condattr_destroy(&attr);
}

/* Runs on PMIx's progress thread. */
static void fence_on_done(pmix_status_t status, void *cbdata)
{
    fence_t *f = cbdata;

    pthread_mutex_lock(&fence_mtx);
    if (f->abandoned) {
        for (fence_t **p = &fences_abandoned; *p; p = &(*p)->next)
            if (*p == f) {
                *p = f->next;
                break;
            }
        hccl_free(f);
    } else {
        f->status = status;
        f->done = true;
        pthread_cond_broadcast(&fence_cond);
    }
    pthread_mutex_unlock(&fence_mtx);
}

/*
 * PMIx_Fence blocks without bound, so the fence is the non-blocking one waited on with the
 * connect timeout; PMIX_TIMEOUT asks the server to give up too. PMIX_COLLECT_DATA makes the
 * PMIx_Get that follows local.
 */
static hcclResult_t pmix_fence(const pmix_proc_t *me, int rank, int timeout_ms)
{
    fence_t *f = hccl_calloc(1, sizeof(*f));
    bool collect = true;
    int secs = (timeout_ms + 999) / 1000;
    struct timespec until;
    pmix_status_t rc;
    hcclResult_t res = hcclSuccess;

    if (!f)
        return HCCL_FAIL(hcclSystemError, "rank %d: pmix: out of memory", rank);
    pthread_once(&fence_once, fence_cond_init);
    PMIX_PROC_LOAD(&f->all, me->nspace, PMIX_RANK_WILDCARD);
    PMIX_INFO_LOAD(&f->info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    PMIX_INFO_LOAD(&f->info[1], PMIX_TIMEOUT, &secs, PMIX_INT);
    rc = PMIx_Fence_nb(&f->all, 1, f->info, 2, fence_on_done, f);
    if (rc == PMIX_OPERATION_SUCCEEDED) { /* done at once; the callback will not run */
        hccl_free(f);
        return hcclSuccess;
    }
    if (rc != PMIX_SUCCESS) {
        hccl_free(f);
        return HCCL_FAIL(hcclSystemError, "rank %d: PMIx_Fence_nb failed: %s", rank,
                         PMIx_Error_string(rc));
    }
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&fence_mtx);
    while (!f->done && pthread_cond_timedwait(&fence_cond, &fence_mtx, &until) != ETIMEDOUT)
        ;
    if (!f->done) {
        f->abandoned = true;
        f->next = fences_abandoned;
        fences_abandoned = f;
        res = HCCL_FAIL(hcclTimeout,
                        "rank %d: the PMIx fence of namespace %s did not complete within "
                        "the connect timeout of %d ms (a rank of the job did not call "
                        "hcclCommInitFromEnv)",
                        rank, me->nspace, timeout_ms);
    } else {
        if (f->status == PMIX_ERR_TIMEOUT)
            res = HCCL_FAIL(hcclTimeout,
                            "rank %d: the PMIx fence of namespace %s timed out after %d s "
                            "(PMIx_Fence_nb: %s)",
                            rank, me->nspace, secs, PMIx_Error_string(f->status));
        else if (f->status != PMIX_SUCCESS)
            res = HCCL_FAIL(hcclSystemError, "rank %d: PMIx_Fence_nb failed: %s", rank,
                            PMIx_Error_string(f->status));
        hccl_free(f);
    }
    pthread_mutex_unlock(&fence_mtx);
    return res;
}

/* PMIx_Get of a value that may be absent: NULL then, and no error. */
static pmix_value_t *pmix_get_optional(const pmix_proc_t *proc, const char *key)
{
    pmix_value_t *val = NULL;

    return PMIx_Get(proc, key, NULL, 0, &val) == PMIX_SUCCESS ? val : NULL;
}

/* The job's size; the caller holds pmix_mtx and PMIx is initialised. */
static hcclResult_t pmix_job_size(const pmix_proc_t *me, int *size_p)
{
    pmix_proc_t all;
    pmix_value_t *val = NULL;
    pmix_status_t rc;
    long size;

    PMIX_PROC_LOAD(&all, me->nspace, PMIX_RANK_WILDCARD);
    rc = PMIx_Get(&all, PMIX_JOB_SIZE, NULL, 0, &val);
    if (rc != PMIX_SUCCESS)
        return HCCL_FAIL(hcclSystemError, "rank %u: PMIx_Get(%s) failed: %s", me->rank,
                         PMIX_JOB_SIZE, PMIx_Error_string(rc));
    switch (val->type) {
    case PMIX_UINT32:
        size = (long)val->data.uint32;
        break;
    case PMIX_INT:
        size = val->data.integer;
        break;
    case PMIX_UINT16:
        size = val->data.uint16;
        break;
    default:
        size = -1;
        break;
    }
    PMIX_VALUE_RELEASE(val);
    if (size < 1 || size > (1l << 20) || me->rank >= (pmix_rank_t)size)
        return HCCL_FAIL(hcclInvalidUsage,
                         "rank %u: PMIx gives job size %ld, not a size for this rank", me->rank,
                         size);
    *size_p = (int)size;
    return hcclSuccess;
}

/*
 * PMIx is initialised once, at the first exchange, and finalised when the library unloads or
 * the process exits: one PMIx_Init, one PMIx_Finalize, however many communicators. Closing it
 * after each exchange would re-initialise it for the next, and PMIx 4.2 loses the job's data
 * then (no host names, fences that end in PARTIAL SUCCESS). A program that holds PMIx itself
 * (MPI_Init) keeps its own reference: PMIx counts them.
 */
static bool pmix_open;
static pmix_proc_t pmix_me;

/* The caller holds pmix_mtx. */
static hcclResult_t pmix_init(pmix_proc_t *me)
{
    pmix_status_t rc;

    if (!pmix_open) {
        rc = PMIx_Init(&pmix_me, NULL, 0);
        if (rc != PMIX_SUCCESS)
            return HCCL_FAIL(hcclSystemError,
                             "PMIx_Init failed: %s (PMIX_NAMESPACE=%s PMIX_RANK=%s)",
                             PMIx_Error_string(rc), getenv("PMIX_NAMESPACE"), getenv("PMIX_RANK"));
        pmix_open = true;
    }
    *me = pmix_me;
    return hcclSuccess;
}

__attribute__((destructor)) static void pmix_fini(void)
{
    pmix_status_t rc;

    pthread_mutex_lock(&pmix_mtx);
    if (pmix_open) {
        pmix_open = false;
        rc = PMIx_Finalize(NULL, 0);
        if (rc != PMIX_SUCCESS)
            HCCL_WARN("PMIx_Finalize failed: %s", PMIx_Error_string(rc));
    }
    pthread_mutex_unlock(&pmix_mtx);
}

hcclResult_t hccl_pmix_rank_size(int *rank_p, int *size_p)
{
    pmix_proc_t me;
    hcclResult_t res;
    int size;

    pthread_mutex_lock(&pmix_mtx);
    res = pmix_init(&me);
    if (res == hcclSuccess)
        res = pmix_job_size(&me, &size);
    pthread_mutex_unlock(&pmix_mtx);
    if (res != hcclSuccess)
        return res;
    *rank_p = (int)me.rank;
    *size_p = size;
    return hcclSuccess;
}

/*
 * Rank 0 publishes the hex text of its unique id, or "!" and why it could not make one, so
 * that the others fail with its reason instead of a timeout.
 */
static hcclResult_t pmix_publish(const char *key, hcclUniqueId *uid)
{
    char text[HCCL_UNIQUE_ID_STRLEN + 512];
    hcclResult_t res;
    pmix_value_t val;
    pmix_status_t rc;

    res = hcclGetUniqueId(uid);
    if (res == hcclSuccess)
        res = hcclUniqueIdToString(uid, text, sizeof(text));
    if (res != hcclSuccess)
        snprintf(text, sizeof(text), "!%s", hccl_error_last());
    val.type = PMIX_STRING;
    val.data.string = text;
    rc = PMIx_Put(PMIX_GLOBAL, key, &val);
    if (rc != PMIX_SUCCESS)
        return HCCL_FAIL(hcclSystemError, "rank 0: PMIx_Put(%s) failed: %s", key,
                         PMIx_Error_string(rc));
    rc = PMIx_Commit();
    if (rc != PMIX_SUCCESS)
        return HCCL_FAIL(hcclSystemError, "rank 0: PMIx_Commit failed: %s", PMIx_Error_string(rc));
    return res;
}

static hcclResult_t pmix_fetch(const pmix_proc_t *me, const char *key, int timeout_ms,
                               hcclUniqueId *uid)
{
    pmix_proc_t root;
    pmix_info_t info;
    pmix_value_t *val = NULL;
    int secs = (timeout_ms + 999) / 1000;
    pmix_status_t rc;
    hcclResult_t res;

    PMIX_PROC_LOAD(&root, me->nspace, 0);
    PMIX_INFO_LOAD(&info, PMIX_TIMEOUT, &secs, PMIX_INT);
    rc = PMIx_Get(&root, key, &info, 1, &val);
    if (rc != PMIX_SUCCESS)
        return HCCL_FAIL(rc == PMIX_ERR_TIMEOUT ? hcclTimeout : hcclSystemError,
                         "rank %u: PMIx_Get(%s) of rank 0 failed: %s", me->rank, key,
                         PMIx_Error_string(rc));
    if (val->type != PMIX_STRING || !val->data.string)
        res = HCCL_FAIL(hcclInternalError,
                        "rank %u: PMIx_Get(%s) of rank 0 gave type %d, not a string", me->rank, key,
                        (int)val->type);
    else if (val->data.string[0] == '!')
        res = HCCL_FAIL(hcclRemoteError, "rank %u: rank 0 could not open the rendezvous: %s",
                        me->rank, val->data.string + 1);
    else
        res = hcclUniqueIdFromString(uid, val->data.string);
    PMIX_VALUE_RELEASE(val);
    return res;
}

hcclResult_t hccl_pmix_comm_init(hcclComm_t *comm_p)
{
    char key[64], host[HCCL_HOST_ID_BYTES] = "";
    hcclUniqueId uid;
    hccl_params_t p;
    pmix_proc_t me;
    pmix_value_t *val;
    int size, local_rank = -1;
    int64_t t0 = hccl_now_ms(), t_init;
    hcclResult_t res;

    HCCL_CHECK(hccl_params_load(&p, NULL));
    pthread_mutex_lock(&pmix_mtx);
    HCCL_CHECK_GOTO(pmix_init(&me), res, err_unlock);
    hccl_log_set_rank((int)me.rank);
    HCCL_CHECK_GOTO(pmix_job_size(&me, &size), res, err_unlock);
    t_init = hccl_now_ms();
    /* The launcher's node name is the host identity's first part, where PMIx knows it. */
    if ((val = pmix_get_optional(&me, PMIX_HOSTNAME))) {
        if (val->type == PMIX_STRING && val->data.string)
            snprintf(host, sizeof(host), "%s", val->data.string);
        PMIX_VALUE_RELEASE(val);
    }
    if ((val = pmix_get_optional(&me, PMIX_LOCAL_RANK))) {
        if (val->type == PMIX_UINT16)
            local_rank = val->data.uint16;
        PMIX_VALUE_RELEASE(val);
    }
    snprintf(key, sizeof(key), "hccl.uid.%u", pmix_rounds++);
    if (me.rank == 0)
        HCCL_CHECK_GOTO(pmix_publish(key, &uid), res, err_fence);
    HCCL_CHECK_GOTO(pmix_fence(&me, (int)me.rank, p.connect_timeout_ms), res, err_unlock);
    if (me.rank != 0)
        HCCL_CHECK_GOTO(pmix_fetch(&me, key, p.connect_timeout_ms, &uid), res, err_unlock);
    pthread_mutex_unlock(&pmix_mtx);
    HCCL_INFO(HCCL_SUB_INIT,
              "rank %u of %d from PMIx (namespace %s, host %s, local rank %d): PMIx_Init "
              "%lld ms, unique id exchanged in %lld ms",
              me.rank, size, me.nspace, host[0] ? host : "unknown", local_rank,
              (long long)(t_init - t0), (long long)(hccl_now_ms() - t_init));
    hccl_topo_set_launcher_host(host[0] ? host : NULL);
    res = hcclCommInitRank(comm_p, size, uid, (int)me.rank);
    hccl_topo_set_launcher_host(NULL);
    return res;

err_fence:
    /* Rank 0 could not publish: it still joins the fence so that the others are not held to the
     * connect timeout, and they find no key. */
    {
        char why[512];
        snprintf(why, sizeof(why), "%s", hccl_error_last());
        pmix_fence(&me, 0, p.connect_timeout_ms);
        hccl_error_put(why);
    }
err_unlock:
    pthread_mutex_unlock(&pmix_mtx);
    return res;
}

#endif
