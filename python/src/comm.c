/*
 * hccl.Comm: a communicator. Creation, the queries, split/shrink, destroy/abort, and the
 * completion fd; the collectives are in coll.c. The GIL is released around every call that
 * may wait (init, the collectives, destroy). A call in flight with the GIL released counts
 * as a user, and destroy waits for the users before it frees the C communicator.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hcclpy.h"

int hccl_py_comm_enter(hccl_py_comm_t *c, const char *fn)
{
    if (!c->comm) {
        char msg[160];
        snprintf(msg, sizeof(msg), "%s: the communicator was destroyed or aborted", fn);
        hccl_py_raise(hcclInvalidUsage, msg);
        return -1;
    }
    atomic_fetch_add(&c->users, 1);
    return 0;
}

void hccl_py_comm_leave(hccl_py_comm_t *c)
{
    /* The last user wakes a destroy that waits; both sides' accesses are sequentially
     * consistent, so either the destroy sees no users or this sees it closing. */
    if (atomic_fetch_sub(&c->users, 1) == 1 && atomic_load(&c->closing)) {
        pthread_mutex_lock(&c->mtx);
        pthread_cond_broadcast(&c->idle);
        pthread_mutex_unlock(&c->mtx);
    }
}

static hccl_py_comm_t *comm_alloc(PyTypeObject *type)
{
    hccl_py_comm_t *c = (hccl_py_comm_t *)type->tp_alloc(type, 0);

    if (!c)
        return NULL;
    c->comm = NULL;
    atomic_init(&c->users, 0);
    atomic_init(&c->closing, false);
    c->aio = NULL;
    c->weakrefs = NULL;
    pthread_mutex_init(&c->mtx, NULL);
    pthread_cond_init(&c->idle, NULL);
    return c;
}

/* The communicator is made: keep its rank and size. */
static PyObject *comm_ready(hccl_py_comm_t *c, hcclComm_t comm)
{
    c->comm = comm;
    if (hcclCommUserRank(comm, &c->rank) != hcclSuccess ||
        hcclCommCount(comm, &c->nranks) != hcclSuccess) {
        hccl_py_raise_last(hcclInternalError, comm);
        Py_DECREF(c);
        return NULL;
    }
    return (PyObject *)c;
}

/* The end of a communicator's creation, whichever way: c is freed when it failed. */
static PyObject *comm_made(hccl_py_comm_t *c, hcclComm_t comm, hcclResult_t res, const char *msg)
{
    if (res != hcclSuccess) {
        Py_DECREF(c);
        return hccl_py_raise(res, msg);
    }
    return comm_ready(c, comm);
}

static int seconds_to_ms(PyObject *obj, int *ms_p, const char *what)
{
    double s;

    if (!obj || obj == Py_None)
        return 0; /* unset: the HCCL_* variable or the default */
    s = PyFloat_AsDouble(obj);
    if (s == -1.0 && PyErr_Occurred())
        return -1;
    if (!(s >= 0) || s * 1000.0 > 2147483647.0) {
        char msg[128];
        snprintf(msg, sizeof(msg), "%s: expected seconds in [0, 2147483], got %g", what, s);
        hccl_py_raise(hcclInvalidArgument, msg);
        return -1;
    }
    *ms_p = (int)(s * 1000.0 + 0.5);
    return 0;
}

static PyObject *comm_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"nranks",       "unique_id", "rank", "connect_timeout",
                             "exec_timeout", "algo",      NULL};
    int nranks, rank;
    PyObject *uid, *connect = NULL, *exec = NULL;
    const char *algo = NULL;
    hcclConfig_t config = HCCL_CONFIG_INITIALIZER;
    hcclUniqueId id;
    hcclComm_t comm = NULL;
    hcclResult_t res;
    hccl_py_comm_t *c;
    PyThreadState *ts;
    char msg[1024];

    if (!PyArg_ParseTupleAndKeywords(args, kw, "iOi|$OOz:Comm", kwlist, &nranks, &uid, &rank,
                                     &connect, &exec, &algo))
        return NULL;
    if (PyBytes_Check(uid) && PyBytes_GET_SIZE(uid) == HCCL_UNIQUE_ID_BYTES) {
        memcpy(id.internal, PyBytes_AS_STRING(uid), sizeof(id.internal));
    } else if (PyUnicode_Check(uid)) {
        const char *text = PyUnicode_AsUTF8(uid);
        if (!text)
            return NULL;
        if ((res = hcclUniqueIdFromString(&id, text)) != hcclSuccess)
            return hccl_py_raise_last(res, NULL);
    } else {
        return hccl_py_raise(hcclInvalidArgument,
                             "Comm: unique_id must be the 128 bytes of hccl.get_unique_id() or "
                             "their hex text (hccl.unique_id_to_string)");
    }
    if (seconds_to_ms(connect, &config.connectTimeoutMs, "connect_timeout") < 0 ||
        seconds_to_ms(exec, &config.execTimeoutMs, "exec_timeout") < 0)
        return NULL;
    config.algo = algo;
    if (!(c = comm_alloc(type)))
        return NULL;
    ts = PyEval_SaveThread();
    res = hcclCommInitRankConfig(&comm, nranks, id, rank, &config);
    if (res != hcclSuccess)
        snprintf(msg, sizeof(msg), "%s", hcclGetLastError(NULL));
    PyEval_RestoreThread(ts);
    return comm_made(c, comm, res, msg);
}

static PyObject *comm_from_env(PyTypeObject *type, PyObject *noargs)
{
    hcclComm_t comm = NULL;
    hcclResult_t res;
    hccl_py_comm_t *c;
    PyThreadState *ts;
    char msg[1024];

    (void)noargs;
    if (!(c = comm_alloc(type)))
        return NULL;
    ts = PyEval_SaveThread();
    res = hcclCommInitFromEnv(&comm);
    if (res != hcclSuccess)
        snprintf(msg, sizeof(msg), "%s", hcclGetLastError(NULL));
    PyEval_RestoreThread(ts);
    return comm_made(c, comm, res, msg);
}

/* hccl.aio's dispatchers of this communicator: detach before the C side goes, flush after. */
static void comm_notify_aio(hccl_py_comm_t *c, const char *method)
{
    PyObject *vals, *r;

    if (!c->aio || !PyDict_Check(c->aio) || PyDict_Size(c->aio) == 0)
        return;
    if (!(vals = PyDict_Values(c->aio))) {
        PyErr_WriteUnraisable((PyObject *)c);
        return;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(vals); i++) {
        r = PyObject_CallMethod(PyList_GET_ITEM(vals, i), method, NULL);
        if (!r)
            PyErr_WriteUnraisable((PyObject *)c);
        Py_XDECREF(r);
    }
    Py_DECREF(vals);
}

/* Ends the communicator: abort completes what is in flight with hcclAborted (and unblocks the
 * threads in it), destroy waits for it. */
static int comm_end(hccl_py_comm_t *c, bool abort)
{
    hcclComm_t comm = c->comm;
    hcclResult_t res;
    char msg[1024];

    if (!comm)
        return 0;
    comm_notify_aio(c, "detach");
    c->comm = NULL;
    Py_BEGIN_ALLOW_THREADS if (abort)
    {
        res = hcclCommAbort(comm);
    }
    else
    {
        atomic_store(&c->closing, true);
        pthread_mutex_lock(&c->mtx);
        while (atomic_load(&c->users) > 0)
            pthread_cond_wait(&c->idle, &c->mtx);
        pthread_mutex_unlock(&c->mtx);
        res = hcclCommDestroy(comm);
    }
    if (res != hcclSuccess)
        snprintf(msg, sizeof(msg), "%s", hcclGetLastError(NULL));
    Py_END_ALLOW_THREADS comm_notify_aio(c, "flush");
    if (res != hcclSuccess) {
        hccl_py_raise(res, msg);
        return -1;
    }
    return 0;
}

static PyObject *comm_destroy(hccl_py_comm_t *c, PyObject *noargs)
{
    (void)noargs;
    if (comm_end(c, false) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *comm_abort(hccl_py_comm_t *c, PyObject *noargs)
{
    (void)noargs;
    if (comm_end(c, true) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *comm_enter_ctx(hccl_py_comm_t *c, PyObject *noargs)
{
    (void)noargs;
    Py_INCREF(c);
    return (PyObject *)c;
}

/* Leaving a `with` block by an exception aborts: peers may be gone, or never post what this
 * rank's requests wait for. */
static PyObject *comm_exit_ctx(hccl_py_comm_t *c, PyObject *args)
{
    PyObject *exc_type = PyTuple_Size(args) > 0 ? PyTuple_GetItem(args, 0) : Py_None;

    if (comm_end(c, exc_type != Py_None) < 0)
        return NULL;
    Py_RETURN_FALSE;
}

static PyObject *comm_split(hccl_py_comm_t *c, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"color", "key", NULL};
    int color, key = -1;
    hcclComm_t comm, newcomm = NULL;
    hcclResult_t res;
    hccl_py_comm_t *nc;
    char msg[1024];

    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|i:split", kwlist, &color, &key))
        return NULL;
    if (key == -1)
        key = c->rank;
    if (hccl_py_comm_enter(c, "split") < 0)
        return NULL;
    comm = c->comm; /* with the GIL: a destroy on another thread clears it, then waits for us */
    Py_BEGIN_ALLOW_THREADS res = hcclCommSplit(comm, color, key, &newcomm);
    if (res != hcclSuccess)
        snprintf(msg, sizeof(msg), "%s", hcclGetLastError(NULL));
    Py_END_ALLOW_THREADS hccl_py_comm_leave(c);
    if (res != hcclSuccess)
        return hccl_py_raise(res, msg);
    if (!newcomm)
        Py_RETURN_NONE;
    if (!(nc = comm_alloc(Py_TYPE(c)))) {
        hcclCommDestroy(newcomm);
        return NULL;
    }
    return comm_ready(nc, newcomm);
}

static PyObject *comm_async_error(hccl_py_comm_t *c, PyObject *noargs)
{
    hcclResult_t err = hcclSuccess, res;

    (void)noargs;
    if (hccl_py_comm_enter(c, "async_error") < 0)
        return NULL;
    res = hcclCommGetAsyncError(c->comm, &err);
    hccl_py_comm_leave(c);
    if (res != hcclSuccess)
        return hccl_py_raise_last(res, NULL);
    if (err == hcclSuccess)
        Py_RETURN_NONE;
    /* The error as an object, not raised: the caller decides. */
    {
        PyObject *type, *value, *tb;
        hccl_py_raise_last(err, NULL);
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        Py_XDECREF(type);
        Py_XDECREF(tb);
        return value;
    }
}

static PyObject *comm_completion_fd(hccl_py_comm_t *c, PyObject *noargs)
{
    int fd = -1;
    hcclResult_t res;

    (void)noargs;
    if (hccl_py_comm_enter(c, "completion_fd") < 0)
        return NULL;
    res = hcclCommGetCompletionFd(c->comm, &fd);
    hccl_py_comm_leave(c);
    if (res != hcclSuccess)
        return hccl_py_raise_last(res, NULL);
    return PyLong_FromLong(fd);
}

static PyObject *comm_dump_state(hccl_py_comm_t *c, PyObject *noargs)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f;
    hcclComm_t comm;
    hcclResult_t res;
    PyObject *out;

    (void)noargs;
    if (hccl_py_comm_enter(c, "dump_state") < 0)
        return NULL;
    if (!(f = open_memstream(&text, &len))) {
        hccl_py_comm_leave(c);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    comm = c->comm; /* with the GIL, as in split */
    Py_BEGIN_ALLOW_THREADS res = hcclCommDumpState(comm, f);
    Py_END_ALLOW_THREADS fclose(f);
    hccl_py_comm_leave(c);
    if (res != hcclSuccess) {
        free(text);
        return hccl_py_raise_last(res, NULL);
    }
    out = PyUnicode_DecodeUTF8(text ? text : "", (Py_ssize_t)len, "replace");
    free(text);
    return out;
}

static void comm_dealloc(hccl_py_comm_t *c)
{
    if (c->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)c);
    if (c->comm && comm_end(c, false) < 0)
        PyErr_WriteUnraisable((PyObject *)c);
    Py_CLEAR(c->aio);
    pthread_cond_destroy(&c->idle);
    pthread_mutex_destroy(&c->mtx);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *comm_repr(hccl_py_comm_t *c)
{
    return PyUnicode_FromFormat("<hccl.Comm rank %d of %d%s>", c->rank, c->nranks,
                                c->comm ? "" : ", destroyed");
}

static PyObject *comm_get_aio(hccl_py_comm_t *c, void *closure)
{
    (void)closure;
    if (!c->aio && !(c->aio = PyDict_New()))
        return NULL;
    Py_INCREF(c->aio);
    return c->aio;
}

static PyObject *comm_get_rank(hccl_py_comm_t *c, void *closure)
{
    (void)closure;
    return PyLong_FromLong(c->rank);
}

static PyObject *comm_get_nranks(hccl_py_comm_t *c, void *closure)
{
    (void)closure;
    return PyLong_FromLong(c->nranks);
}

static PyObject *comm_get_closed(hccl_py_comm_t *c, void *closure)
{
    (void)closure;
    return PyBool_FromLong(c->comm == NULL);
}

extern PyMethodDef hccl_py_coll_methods[];

static PyMethodDef comm_methods[] = {
    {"from_env", (PyCFunction)comm_from_env, METH_NOARGS | METH_CLASS,
     "Comm.from_env(): rank, size and rendezvous from hccl-run, torchrun, mpirun or srun."},
    {"destroy", (PyCFunction)comm_destroy, METH_NOARGS,
     "Waits for this rank's outstanding requests, then frees the communicator."},
    {"abort", (PyCFunction)comm_abort, METH_NOARGS,
     "Completes every outstanding request with hccl.AbortedError, then frees."},
    {"__enter__", (PyCFunction)comm_enter_ctx, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)comm_exit_ctx, METH_VARARGS, NULL},
    {"split", (PyCFunction)(void (*)(void))comm_split, METH_VARARGS | METH_KEYWORDS,
     "split(color, key=rank) -> Comm or None (color < 0); collective."},
    {"async_error", (PyCFunction)comm_async_error, METH_NOARGS,
     "None, or the hccl.Error the communicator failed with (not raised)."},
    {"completion_fd", (PyCFunction)comm_completion_fd, METH_NOARGS,
     "A file descriptor that becomes readable when a request completes (eventfd counter)."},
    {"dump_state", (PyCFunction)comm_dump_state, METH_NOARGS,
     "What every request in flight waits for, as text."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef comm_getset[] = {
    {"rank", (getter)comm_get_rank, NULL, "this process's rank", NULL},
    {"nranks", (getter)comm_get_nranks, NULL, "the number of ranks", NULL},
    {"size", (getter)comm_get_nranks, NULL, "the number of ranks", NULL},
    {"closed", (getter)comm_get_closed, NULL, "destroyed or aborted", NULL},
    {"_aio", (getter)comm_get_aio, NULL, "hccl.aio's dispatchers, by event loop", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject hccl_py_comm_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hccl.Comm",
    .tp_basicsize = sizeof(hccl_py_comm_t),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Comm(nranks, unique_id, rank, *, connect_timeout=None, exec_timeout=None, "
              "algo=None): a communicator (timeouts in seconds). Comm.from_env() under a "
              "launcher.",
    .tp_new = comm_new,
    .tp_dealloc = (destructor)comm_dealloc,
    .tp_repr = (reprfunc)comm_repr,
    .tp_weaklistoffset = offsetof(hccl_py_comm_t, weakrefs),
    .tp_getset = comm_getset,
};

int hccl_py_coll_init(void)
{
    /* The collectives of coll.c and the methods above, as one table. */
    static PyMethodDef all[64];
    int n = 0;

    for (PyMethodDef *m = comm_methods; m->ml_name; m++)
        all[n++] = *m;
    for (PyMethodDef *m = hccl_py_coll_methods; m->ml_name && n < 63; m++)
        all[n++] = *m;
    all[n] = (PyMethodDef){NULL, NULL, 0, NULL};
    hccl_py_comm_type.tp_methods = all;
    return 0;
}
