/*
 * hccl.Request: one non-blocking operation. It keeps the operation's buffers (their exports,
 * or the tensors) until the library is done with them; wait() releases the GIL; test() never
 * blocks. One thread at a time finishes the C request (the lock), and the failure text is
 * taken on that thread, where hcclGetLastError has it.
 */
#include <stdlib.h>
#include <string.h>

#include "hcclpy.h"

hccl_py_request_t *hccl_py_request_new(hccl_py_comm_t *comm)
{
    hccl_py_request_t *r = PyObject_New(hccl_py_request_t, &hccl_py_request_type);

    if (!r)
        return NULL;
    r->req = NULL;
    r->comm = comm;
    Py_XINCREF(comm);
    memset(r->bufs, 0, sizeof(r->bufs));
    r->nbufs = 0;
    r->extra = NULL;
    r->result = NULL;
    r->done = false;
    r->status = hcclSuccess;
    r->errmsg = NULL;
    r->lock = PyThread_allocate_lock();
    if (!r->lock) {
        Py_DECREF(r);
        PyErr_NoMemory();
        return NULL;
    }
    return r;
}

/* With the lock held and req just finished with res: keep the result and its text. */
static void request_record(hccl_py_request_t *r, hcclResult_t res)
{
    r->status = res;
    if (res != hcclSuccess) {
        const char *msg = hcclGetLastError(NULL);
        r->errmsg = strdup(msg && *msg ? msg : hcclGetErrorString(res));
    }
    r->done = true;
}

/* With the GIL: the library no longer reads or writes the buffers. */
static void request_release_buffers(hccl_py_request_t *r)
{
    for (int i = 0; i < r->nbufs; i++)
        hccl_py_buf_release(&r->bufs[i]);
    r->nbufs = 0;
    Py_CLEAR(r->extra);
}

static PyObject *request_outcome(hccl_py_request_t *r)
{
    request_release_buffers(r);
    if (r->status != hcclSuccess)
        return hccl_py_raise(r->status, r->errmsg);
    Py_INCREF(r->result ? r->result : Py_None);
    return r->result ? r->result : Py_None;
}

int hccl_py_request_wait(hccl_py_request_t *r)
{
    if (!r->done) {
        Py_BEGIN_ALLOW_THREADS PyThread_acquire_lock(r->lock, WAIT_LOCK);
        if (!r->done && r->req) {
            hcclResult_t res = hcclWait(&r->req);
            request_record(r, res);
        }
        PyThread_release_lock(r->lock);
        Py_END_ALLOW_THREADS
    }
    return 0;
}

static PyObject *request_wait(hccl_py_request_t *r, PyObject *noargs)
{
    (void)noargs;
    hccl_py_request_wait(r);
    return request_outcome(r);
}

static PyObject *request_test(hccl_py_request_t *r, PyObject *noargs)
{
    (void)noargs;
    if (!r->done) {
        int done = 0;
        /* Another thread waits on it: not done yet, as far as this call can tell. */
        if (!PyThread_acquire_lock(r->lock, NOWAIT_LOCK))
            Py_RETURN_FALSE;
        if (!r->done && r->req) {
            hcclResult_t res = hcclTest(&r->req, &done);
            if (done || res != hcclSuccess)
                request_record(r, res);
        }
        PyThread_release_lock(r->lock);
        if (!r->done)
            Py_RETURN_FALSE;
    }
    PyObject *out = request_outcome(r);
    if (!out)
        return NULL;
    Py_DECREF(out);
    Py_RETURN_TRUE;
}

/* `await req` (hccl.aio does the waiting on the running loop). */
static PyObject *request_await(hccl_py_request_t *r)
{
    PyObject *aio = PyImport_ImportModule("hccl.aio");
    PyObject *fut, *it;

    if (!aio)
        return NULL;
    fut = PyObject_CallMethod(aio, "wait", "O", (PyObject *)r);
    Py_DECREF(aio);
    if (!fut)
        return NULL;
    it = PyObject_CallMethod(fut, "__await__", NULL);
    Py_DECREF(fut);
    return it;
}

static PyObject *request_get_done(hccl_py_request_t *r, void *closure)
{
    (void)closure;
    return PyBool_FromLong(r->done);
}

static PyObject *request_get_comm(hccl_py_request_t *r, void *closure)
{
    (void)closure;
    PyObject *c = r->comm ? (PyObject *)r->comm : Py_None;
    Py_INCREF(c);
    return c;
}

static void request_dealloc(hccl_py_request_t *r)
{
    /* The library may still write into the buffers: an unfinished request is waited for. */
    if (r->lock) {
        hccl_py_request_wait(r);
        PyThread_free_lock(r->lock);
    }
    request_release_buffers(r);
    Py_CLEAR(r->result);
    Py_CLEAR(r->comm);
    free(r->errmsg);
    PyObject_Free(r);
}

static PyMethodDef request_methods[] = {
    {"wait", (PyCFunction)request_wait, METH_NOARGS,
     "wait() -> the received buffer or None; blocks (GIL released); raises hccl.Error on "
     "failure."},
    {"test", (PyCFunction)request_test, METH_NOARGS,
     "test() -> bool; never blocks; raises hccl.Error if the operation failed."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef request_getset[] = {
    {"done", (getter)request_get_done, NULL, "finished (and seen finished by wait or test)", NULL},
    {"comm", (getter)request_get_comm, NULL, "the communicator", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyAsyncMethods request_async = {
    .am_await = (unaryfunc)request_await,
};

PyTypeObject hccl_py_request_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hccl.Request",
    .tp_basicsize = sizeof(hccl_py_request_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A non-blocking hccl operation: wait(), test(), or await it (hccl.aio).",
    .tp_dealloc = (destructor)request_dealloc,
    .tp_methods = request_methods,
    .tp_getset = request_getset,
    .tp_as_async = &request_async,
};
