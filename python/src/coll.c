/*
 * The collectives of hccl.Comm, blocking (comm.all_reduce) and non-blocking
 * (comm.all_reduce_async -> hccl.Request). Each method turns its Python arguments into a
 * call_t (buffers, counts, dtype, op, root or peer), checks what the C API cannot (the sizes
 * of Python buffers), then runs it with the GIL released.
 */
#include <stdlib.h>
#include <string.h>

#include "hcclpy.h"

typedef enum {
    COLL_ALLREDUCE,
    COLL_BROADCAST,
    COLL_REDUCE,
    COLL_ALLGATHER,
    COLL_REDUCESCATTER,
    COLL_ALLTOALL,
    COLL_ALLTOALLV,
    COLL_BARRIER,
    COLL_SEND,
    COLL_RECV,
} coll_t;

typedef struct {
    coll_t coll;
    const char *name;
    hccl_py_buf_t bufs[2]; /* [0] the send side, [1] the receive side, when distinct */
    int nbufs;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    hcclDataType_t dtype;
    hcclRedOp_t op;
    int root;       /* or the peer */
    size_t *v;      /* alltoallv: sendcounts, sdispls, recvcounts, rdispls (4 x nranks) */
    PyObject *vobj; /* owns v */
    PyObject *result;
} call_t;

static PyObject *invalid(const call_t *c, const char *fmt, ...)
{
    char msg[512];
    int n = snprintf(msg, sizeof(msg), "%s: ", c->name);
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
    va_end(ap);
    return hccl_py_raise(hcclInvalidArgument, msg);
}

static void call_release(call_t *c)
{
    for (int i = 0; i < c->nbufs; i++)
        hccl_py_buf_release(&c->bufs[i]);
    c->nbufs = 0;
    Py_CLEAR(c->vobj);
}

static int call_buf(call_t *c, PyObject *obj, bool writable, PyObject *dtype, const char *what)
{
    hccl_py_what_t who = {c->name, what};

    if (hccl_py_buf_get(obj, writable, dtype, &c->bufs[c->nbufs], &who) < 0)
        return -1;
    return c->nbufs++;
}

/* Bools reduce as uint8: any (sum, max), all (prod, min). */
static int call_op(call_t *c, PyObject *op, const hccl_py_buf_t *b)
{
    if (!op)
        c->op = hcclSum;
    else if (hccl_py_parse_op(op, &c->op) < 0)
        return -1;
    if (b->is_bool) {
        if (c->op == hcclAvg) {
            invalid(c, "avg of bools is not defined");
            return -1;
        }
        c->op = (c->op == hcclSum || c->op == hcclMax) ? hcclMax : hcclMin;
    }
    return 0;
}

static int check_rank(call_t *c, int r, int nranks, const char *what)
{
    if (r < 0 || r >= nranks) {
        invalid(c, "%s %d is not a rank of this communicator (0..%d)", what, r, nranks - 1);
        return -1;
    }
    return 0;
}

/* sendbuf [recvbuf]: the second side must match the first in dtype and in count * mult. */
static int call_pair(call_t *c, PyObject *send, PyObject *recv, PyObject *dtype, size_t smult,
                     size_t rmult)
{
    int s = -1, r = -1;

    if (send != Py_None && (s = call_buf(c, send, recv == Py_None, dtype, "sendbuf")) < 0)
        return -1;
    if (recv != Py_None && (r = call_buf(c, recv, true, dtype, "recvbuf")) < 0)
        return -1;
    if (s >= 0 && r >= 0) {
        const hccl_py_buf_t *sb = &c->bufs[s], *rb = &c->bufs[r];
        if (hccl_py_buf_same_type(sb, rb, c->name) < 0)
            return -1;
        if (sb->count * rmult != rb->count * smult) {
            invalid(c, "recvbuf holds %zu elements, expected %zu (sendbuf: %zu)", rb->count,
                    sb->count * rmult / smult, sb->count);
            return -1;
        }
    }
    return 0;
}

static hcclResult_t call_post(call_t *c, hcclComm_t comm, hcclRequest_t *req)
{
    switch (c->coll) {
    case COLL_ALLREDUCE:
        return hcclAllReduceAsync(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op, comm, req);
    case COLL_BROADCAST:
        return hcclBroadcastAsync(c->recvbuf, c->count, c->dtype, c->root, comm, req);
    case COLL_REDUCE:
        return hcclReduceAsync(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op, c->root, comm,
                               req);
    case COLL_ALLGATHER:
        return hcclAllGatherAsync(c->sendbuf, c->recvbuf, c->count, c->dtype, comm, req);
    case COLL_REDUCESCATTER:
        return hcclReduceScatterAsync(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op, comm, req);
    case COLL_ALLTOALL:
        return hcclAlltoAllAsync(c->sendbuf, c->recvbuf, c->count, c->dtype, comm, req);
    case COLL_ALLTOALLV: {
        int n;
        hcclCommCount(comm, &n);
        return hcclAlltoAllvAsync(c->sendbuf, c->v, c->v + n, c->recvbuf, c->v + 2 * n,
                                  c->v + 3 * n, c->dtype, comm, req);
    }
    case COLL_BARRIER:
        return hcclBarrierAsync(comm, req);
    case COLL_SEND:
        return hcclSendAsync(c->sendbuf, c->count, c->dtype, c->root, comm, req);
    case COLL_RECV:
        return hcclRecvAsync(c->recvbuf, c->count, c->dtype, c->root, comm, req);
    }
    return hcclInternalError;
}

/* The blocking forms: the library may run a small collective on the caller's thread. */
static hcclResult_t call_run(call_t *c, hcclComm_t comm)
{
    hcclRequest_t req = NULL;
    hcclResult_t res;

    switch (c->coll) {
    case COLL_ALLREDUCE:
        return hcclAllReduce(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op, comm);
    case COLL_BROADCAST:
        return hcclBroadcast(c->recvbuf, c->count, c->dtype, c->root, comm);
    case COLL_REDUCE:
        return hcclReduce(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op, c->root, comm);
    case COLL_BARRIER:
        return hcclBarrier(comm);
    default:
        res = call_post(c, comm, &req);
        return res == hcclSuccess ? hcclWait(&req) : res;
    }
}

static PyObject *call_finish(call_t *c, hccl_py_comm_t *self, bool async)
{
    hcclResult_t res;
    char msg[1024];

    if (hccl_py_comm_enter(self, c->name) < 0) {
        call_release(c);
        return NULL;
    }
    /* Read with the GIL held: a destroy on another thread clears it (then waits for us). */
    hcclComm_t comm = self->comm;

    if (!async) {
        Py_BEGIN_ALLOW_THREADS res = call_run(c, comm);
        if (res != hcclSuccess)
            snprintf(msg, sizeof(msg), "%s", hcclGetLastError(NULL));
        Py_END_ALLOW_THREADS hccl_py_comm_leave(self);
        call_release(c);
        if (res != hcclSuccess)
            return hccl_py_raise(res, msg);
        if (!c->result)
            Py_RETURN_NONE;
        Py_INCREF(c->result);
        return c->result;
    }

    hccl_py_request_t *r = hccl_py_request_new(self);
    if (!r) {
        hccl_py_comm_leave(self);
        call_release(c);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS res = call_post(c, comm, &r->req);
    if (res != hcclSuccess)
        snprintf(msg, sizeof(msg), "%s", hcclGetLastError(NULL));
    Py_END_ALLOW_THREADS hccl_py_comm_leave(self);
    if (res != hcclSuccess) {
        r->done = true; /* nothing was posted */
        call_release(c);
        Py_DECREF(r);
        return hccl_py_raise(res, msg);
    }
    /* The request owns the buffers now, until it is finished. */
    memcpy(r->bufs, c->bufs, sizeof(c->bufs));
    r->nbufs = c->nbufs;
    c->nbufs = 0;
    r->extra = c->vobj;
    c->vobj = NULL;
    Py_XINCREF(c->result);
    r->result = c->result;
    return (PyObject *)r;
}

/* ---- argument parsing, one function per collective ---- */

/* The buffers of a reduction: recv None means in place in send; then the op. */
static int call_reduction(call_t *c, PyObject *send, PyObject *recv, PyObject *op, PyObject *dtype)
{
    if (recv == Py_None) { /* in place */
        if (call_buf(c, send, true, dtype, "buf") < 0)
            return -1;
        c->result = send;
        c->recvbuf = c->bufs[0].ptr;
    } else {
        if (call_pair(c, send, recv, dtype, 1, 1) < 0)
            return -1;
        c->result = recv;
        c->recvbuf = c->bufs[1].ptr;
    }
    c->sendbuf = c->bufs[0].ptr;
    c->count = c->bufs[0].count;
    c->dtype = c->bufs[0].dtype;
    return call_op(c, op, &c->bufs[0]);
}

static PyObject *all_reduce(hccl_py_comm_t *self, PyObject *args, PyObject *kw, bool async)
{
    static char *kwlist[] = {"sendbuf", "recvbuf", "op", "dtype", NULL};
    PyObject *send, *recv = Py_None, *op = NULL, *dtype = NULL;
    call_t c = {.coll = COLL_ALLREDUCE, .name = async ? "all_reduce_async" : "all_reduce"};

    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO$O", kwlist, &send, &recv, &op, &dtype))
        return NULL;
    if (call_reduction(&c, send, recv, op, dtype) < 0)
        goto fail;
    return call_finish(&c, self, async);
fail:
    call_release(&c);
    return NULL;
}

static PyObject *broadcast(hccl_py_comm_t *self, PyObject *args, PyObject *kw, bool async)
{
    static char *kwlist[] = {"buf", "root", "dtype", NULL};
    PyObject *buf, *dtype = NULL;
    call_t c = {.coll = COLL_BROADCAST, .name = async ? "broadcast_async" : "broadcast"};

    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|i$O", kwlist, &buf, &c.root, &dtype))
        return NULL;
    if (check_rank(&c, c.root, self->nranks, "root") < 0 ||
        call_buf(&c, buf, true, dtype, "buf") < 0)
        goto fail;
    c.recvbuf = c.bufs[0].ptr;
    c.count = c.bufs[0].count;
    c.dtype = c.bufs[0].dtype;
    c.result = buf;
    return call_finish(&c, self, async);
fail:
    call_release(&c);
    return NULL;
}

static PyObject *reduce(hccl_py_comm_t *self, PyObject *args, PyObject *kw, bool async)
{
    static char *kwlist[] = {"sendbuf", "recvbuf", "op", "root", "dtype", NULL};
    PyObject *send, *recv = Py_None, *op = NULL, *dtype = NULL;
    call_t c = {.coll = COLL_REDUCE, .name = async ? "reduce_async" : "reduce"};

    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOi$O", kwlist, &send, &recv, &op, &c.root,
                                     &dtype))
        return NULL;
    if (check_rank(&c, c.root, self->nranks, "root") < 0)
        goto fail;
    if (call_reduction(&c, send, recv, op, dtype) < 0)
        goto fail;
    return call_finish(&c, self, async);
fail:
    call_release(&c);
    return NULL;
}

/* all_gather(sendbuf, recvbuf): sendbuf None gathers in place from recvbuf's own block. */
static PyObject *all_gather(hccl_py_comm_t *self, PyObject *args, PyObject *kw, bool async)
{
    static char *kwlist[] = {"sendbuf", "recvbuf", "dtype", NULL};
    PyObject *send, *recv, *dtype = NULL;
    call_t c = {.coll = COLL_ALLGATHER, .name = async ? "all_gather_async" : "all_gather"};
    size_t n = (size_t)self->nranks;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$O", kwlist, &send, &recv, &dtype))
        return NULL;
    if (recv == Py_None) {
        invalid(&c, "recvbuf is required");
        goto fail;
    }
    if (call_pair(&c, send, recv, dtype, 1, n) < 0)
        goto fail;
    {
        hccl_py_buf_t *rb = &c.bufs[c.nbufs - 1];
        if (send == Py_None) {
            if (rb->count % n != 0) {
                invalid(&c, "recvbuf's %zu elements are not %zu equal blocks", rb->count, n);
                goto fail;
            }
            c.count = rb->count / n;
            c.sendbuf = (char *)rb->ptr + (size_t)self->rank * c.count * rb->itemsize;
        } else {
            c.count = c.bufs[0].count;
            c.sendbuf = c.bufs[0].ptr;
        }
        c.recvbuf = rb->ptr;
        c.dtype = rb->dtype;
    }
    c.result = recv;
    return call_finish(&c, self, async);
fail:
    call_release(&c);
    return NULL;
}

/* reduce_scatter(sendbuf, recvbuf): recvbuf None reduces in place into sendbuf's own block. */
static PyObject *reduce_scatter(hccl_py_comm_t *self, PyObject *args, PyObject *kw, bool async)
{
    static char *kwlist[] = {"sendbuf", "recvbuf", "op", "dtype", NULL};
    PyObject *send, *recv = Py_None, *op = NULL, *dtype = NULL;
    call_t c = {.coll = COLL_REDUCESCATTER,
                .name = async ? "reduce_scatter_async" : "reduce_scatter"};
    size_t n = (size_t)self->nranks;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO$O", kwlist, &send, &recv, &op, &dtype))
        return NULL;
    if (send == Py_None) {
        invalid(&c, "sendbuf is required");
        goto fail;
    }
    if (recv == Py_None) {
        if (call_buf(&c, send, true, dtype, "sendbuf") < 0)
            goto fail;
    } else if (call_pair(&c, send, recv, dtype, n, 1) < 0) {
        goto fail;
    }
    if (c.bufs[0].count % n != 0) {
        invalid(&c, "sendbuf's %zu elements are not %zu equal blocks", c.bufs[0].count, n);
        goto fail;
    }
    c.count = c.bufs[0].count / n;
    c.sendbuf = c.bufs[0].ptr;
    c.recvbuf = recv == Py_None
                    ? (char *)c.bufs[0].ptr + (size_t)self->rank * c.count * c.bufs[0].itemsize
                    : c.bufs[1].ptr;
    c.dtype = c.bufs[0].dtype;
    if (call_op(&c, op, &c.bufs[0]) < 0)
        goto fail;
    c.result = recv == Py_None ? send : recv;
    return call_finish(&c, self, async);
fail:
    call_release(&c);
    return NULL;
}

static PyObject *all_to_all(hccl_py_comm_t *self, PyObject *args, PyObject *kw, bool async)
{
    static char *kwlist[] = {"sendbuf", "recvbuf", "dtype", NULL};
    PyObject *send, *recv, *dtype = NULL;
    call_t c = {.coll = COLL_ALLTOALL, .name = async ? "all_to_all_async" : "all_to_all"};
    size_t n = (size_t)self->nranks;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$O", kwlist, &send, &recv, &dtype))
        return NULL;
    if (send == Py_None || recv == Py_None) {
        invalid(&c, "sendbuf and recvbuf are required (and must not overlap)");
        goto fail;
    }
    if (call_pair(&c, send, recv, dtype, 1, 1) < 0)
        goto fail;
    if (c.bufs[0].count % n != 0) {
        invalid(&c, "sendbuf's %zu elements are not %zu equal blocks", c.bufs[0].count, n);
        goto fail;
    }
    c.count = c.bufs[0].count / n;
    c.sendbuf = c.bufs[0].ptr;
    c.recvbuf = c.bufs[1].ptr;
    c.dtype = c.bufs[0].dtype;
    c.result = recv;
    return call_finish(&c, self, async);
fail:
    call_release(&c);
    return NULL;
}

/* Reads a sequence of nranks counts or displacements into out. */
static int read_sizes(call_t *c, PyObject *seq, size_t n, size_t *out, const char *what)
{
    PyObject *fast = PySequence_Fast(seq, "");

    if (!fast || (size_t)PySequence_Fast_GET_SIZE(fast) != n) {
        Py_XDECREF(fast);
        if (hccl_py_clear_value_error() < 0)
            return -1;
        invalid(c, "%s: expected a sequence of %zu non-negative integers", what, n);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        out[i] = PyLong_AsSize_t(PySequence_Fast_GET_ITEM(fast, (Py_ssize_t)i));
        if (out[i] == (size_t)-1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            if (hccl_py_clear_value_error() < 0)
                return -1;
            invalid(c, "%s[%zu]: expected a non-negative integer", what, i);
            return -1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

static int check_extents(call_t *c, const size_t *counts, const size_t *displs, size_t n,
                         size_t have, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (counts[i] > have || displs[i] > have - counts[i]) {
            invalid(c, "%s: block %zu (%zu elements at %zu) lies outside the buffer's %zu", what, i,
                    counts[i], displs[i], have);
            return -1;
        }
    }
    return 0;
}

static PyObject *all_to_allv(hccl_py_comm_t *self, PyObject *args, PyObject *kw, bool async)
{
    static char *kwlist[] = {"sendbuf",    "sendcounts", "sdispls", "recvbuf",
                             "recvcounts", "rdispls",    "dtype",   NULL};
    PyObject *send, *scounts, *sdispls, *recv, *rcounts, *rdispls, *dtype = NULL;
    call_t c = {.coll = COLL_ALLTOALLV, .name = async ? "all_to_allv_async" : "all_to_allv"};
    size_t n = (size_t)self->nranks;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOO|$O", kwlist, &send, &scounts, &sdispls,
                                     &recv, &rcounts, &rdispls, &dtype))
        return NULL;
    if (call_buf(&c, send, false, dtype, "sendbuf") < 0 ||
        call_buf(&c, recv, true, dtype, "recvbuf") < 0 ||
        hccl_py_buf_same_type(&c.bufs[0], &c.bufs[1], c.name) < 0)
        goto fail;
    if (!(c.vobj = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(4 * n * sizeof(size_t)))))
        goto fail;
    c.v = (size_t *)PyBytes_AS_STRING(c.vobj);
    if (read_sizes(&c, scounts, n, c.v, "sendcounts") < 0 ||
        read_sizes(&c, sdispls, n, c.v + n, "sdispls") < 0 ||
        read_sizes(&c, rcounts, n, c.v + 2 * n, "recvcounts") < 0 ||
        read_sizes(&c, rdispls, n, c.v + 3 * n, "rdispls") < 0 ||
        check_extents(&c, c.v, c.v + n, n, c.bufs[0].count, "sendbuf") < 0 ||
        check_extents(&c, c.v + 2 * n, c.v + 3 * n, n, c.bufs[1].count, "recvbuf") < 0)
        goto fail;
    c.sendbuf = c.bufs[0].ptr;
    c.recvbuf = c.bufs[1].ptr;
    c.dtype = c.bufs[0].dtype;
    c.result = recv;
    return call_finish(&c, self, async);
fail:
    call_release(&c);
    return NULL;
}

static PyObject *barrier(hccl_py_comm_t *self, PyObject *args, PyObject *kw, bool async)
{
    static char *kwlist[] = {NULL};
    call_t c = {.coll = COLL_BARRIER, .name = async ? "barrier_async" : "barrier"};

    if (!PyArg_ParseTupleAndKeywords(args, kw, "", kwlist))
        return NULL;
    return call_finish(&c, self, async);
}

static PyObject *p2p(hccl_py_comm_t *self, PyObject *args, PyObject *kw, bool async, bool is_send)
{
    static char *kwlist[] = {"buf", "peer", "dtype", NULL};
    PyObject *buf, *dtype = NULL;
    call_t c = {.coll = is_send ? COLL_SEND : COLL_RECV,
                .name =
                    is_send ? (async ? "send_async" : "send") : (async ? "recv_async" : "recv")};

    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi|$O", kwlist, &buf, &c.root, &dtype))
        return NULL;
    if (check_rank(&c, c.root, self->nranks, "peer") < 0 ||
        call_buf(&c, buf, !is_send, dtype, "buf") < 0)
        goto fail;
    c.sendbuf = c.recvbuf = c.bufs[0].ptr;
    c.count = c.bufs[0].count;
    c.dtype = c.bufs[0].dtype;
    c.result = is_send ? NULL : buf;
    return call_finish(&c, self, async);
fail:
    call_release(&c);
    return NULL;
}

static PyObject *send(hccl_py_comm_t *s, PyObject *a, PyObject *k, bool async)
{
    return p2p(s, a, k, async, true);
}

static PyObject *recv(hccl_py_comm_t *s, PyObject *a, PyObject *k, bool async)
{
    return p2p(s, a, k, async, false);
}

#define HCCL_PY_PAIR(name_x)                                                                       \
    static PyObject *name_x##_blocking(hccl_py_comm_t *s, PyObject *a, PyObject *k)                \
    {                                                                                              \
        return name_x(s, a, k, false);                                                             \
    }                                                                                              \
    static PyObject *name_x##_async(hccl_py_comm_t *s, PyObject *a, PyObject *k)                   \
    {                                                                                              \
        return name_x(s, a, k, true);                                                              \
    }

HCCL_PY_PAIR(all_reduce)
HCCL_PY_PAIR(broadcast)
HCCL_PY_PAIR(reduce)
HCCL_PY_PAIR(all_gather)
HCCL_PY_PAIR(reduce_scatter)
HCCL_PY_PAIR(all_to_all)
HCCL_PY_PAIR(all_to_allv)
HCCL_PY_PAIR(barrier)
HCCL_PY_PAIR(send)
HCCL_PY_PAIR(recv)

#define HCCL_PY_METHODS(name_x, doc_x)                                                             \
    {#name_x, (PyCFunction)(void (*)(void))name_x##_blocking, METH_VARARGS | METH_KEYWORDS,        \
     doc_x},                                                                                       \
    {                                                                                              \
#name_x "_async", (PyCFunction)(void (*)(void))name_x##_async,                             \
            METH_VARARGS | METH_KEYWORDS, "The non-blocking form: returns an hccl.Request."        \
    }

PyMethodDef hccl_py_coll_methods[] = {
    HCCL_PY_METHODS(all_reduce, "all_reduce(sendbuf, recvbuf=None, op='sum', *, dtype=None): "
                                "recvbuf None reduces in place; returns the result buffer."),
    HCCL_PY_METHODS(broadcast, "broadcast(buf, root=0, *, dtype=None)"),
    HCCL_PY_METHODS(reduce, "reduce(sendbuf, recvbuf=None, op='sum', root=0, *, dtype=None)"),
    HCCL_PY_METHODS(all_gather, "all_gather(sendbuf, recvbuf, *, dtype=None): recvbuf holds "
                                "nranks blocks; sendbuf None: in place from recvbuf's block."),
    HCCL_PY_METHODS(reduce_scatter,
                    "reduce_scatter(sendbuf, recvbuf=None, op='sum', *, dtype=None): recvbuf "
                    "None: in place into sendbuf's block."),
    HCCL_PY_METHODS(all_to_all, "all_to_all(sendbuf, recvbuf, *, dtype=None): nranks blocks."),
    HCCL_PY_METHODS(all_to_allv, "all_to_allv(sendbuf, sendcounts, sdispls, recvbuf, "
                                 "recvcounts, rdispls, *, dtype=None): counts in elements."),
    HCCL_PY_METHODS(barrier, "barrier()"),
    HCCL_PY_METHODS(send, "send(buf, peer, *, dtype=None)"),
    HCCL_PY_METHODS(recv, "recv(buf, peer, *, dtype=None)"),
    {NULL, NULL, 0, NULL},
};
