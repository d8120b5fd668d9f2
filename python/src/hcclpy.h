/*
 * The hccl Python extension (hccl._hccl): what its files share. It uses only the public
 * include/hccl.h and the CPython API; the package around it is python/hccl/.
 */
#ifndef HCCLPY_H
#define HCCLPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include <hccl.h>

/* A buffer taken from a Python object for one operation: the memory, its element type and
 * count, and the owner kept alive (and, for the buffer protocol, its export held) until the
 * operation is done. */
typedef struct {
    Py_buffer view;  /* view.obj != NULL: a buffer-protocol export to release */
    PyObject *owner; /* a torch tensor held by reference, else NULL */
    void *ptr;
    size_t count; /* elements */
    size_t itemsize;
    hcclDataType_t dtype;
    bool is_bool;   /* numpy/torch bool: reduced as uint8 with sum->max, prod->min */
    bool has_dtype; /* false: raw bytes ("B" from a bytearray) that a dtype= may reinterpret */
} hccl_py_buf_t;

typedef struct hccl_py_comm {
    PyObject_HEAD hcclComm_t comm; /* NULL once destroyed or aborted */
    int rank;
    int nranks;
    /* Calls in flight with the GIL released; destroy waits for them. Counted with the GIL held,
     * without a lock: the lock and condition are for a destroy that waits (closing). */
    atomic_int users;
    atomic_bool closing;
    pthread_mutex_t mtx;
    pthread_cond_t idle;
    PyObject *aio; /* hccl.aio's dispatchers of this communicator, a dict; or NULL */
    PyObject *weakrefs;
} hccl_py_comm_t;

typedef struct {
    PyObject_HEAD hcclRequest_t req; /* NULL once finished */
    PyThread_type_lock lock;         /* held by the one thread that waits or tests req */
    hccl_py_comm_t *comm;            /* a reference, for the error text and the lifetime */
    hccl_py_buf_t bufs[2];
    int nbufs;
    PyObject *extra;  /* anything else the operation reads (alltoallv counts) */
    PyObject *result; /* what wait() returns (the received buffer, or None) */
    bool done;
    hcclResult_t status;
    char *errmsg; /* the failure's text, taken on the thread that finished it */
} hccl_py_request_t;

extern PyTypeObject hccl_py_comm_type;
extern PyTypeObject hccl_py_request_type;

/* module.c: errors and buffers. */
PyObject *hccl_py_raise(hcclResult_t res, const char *msg);
PyObject *hccl_py_raise_last(hcclResult_t res, hcclComm_t comm);
PyObject *hccl_py_error_for(hcclResult_t res);
/*
 * After a conversion failed: an error of the value (TypeError, ValueError, OverflowError,
 * AttributeError) is cleared, for the caller to raise its own, clearer one (0); any other
 * (MemoryError, KeyboardInterrupt, ...) stays set, for the caller to return (-1).
 */
int hccl_py_clear_value_error(void);
int hccl_py_parse_op(PyObject *obj, hcclRedOp_t *op_p);
int hccl_py_parse_dtype(PyObject *obj, hcclDataType_t *dtype_p);
/* Who asked for a buffer, for error messages ("all_reduce: sendbuf: ..."): two strings
 * joined only when a message is written, since formatting them cost more per call than the
 * rest of the argument handling. */
typedef struct {
    const char *fn;
    const char *arg;
} hccl_py_what_t;

int hccl_py_buf_get(PyObject *obj, bool writable, PyObject *dtype, hccl_py_buf_t *buf,
                    const hccl_py_what_t *what);
void hccl_py_buf_release(hccl_py_buf_t *buf);
int hccl_py_buf_same_type(const hccl_py_buf_t *a, const hccl_py_buf_t *b, const char *what);

/* request.c */
hccl_py_request_t *hccl_py_request_new(hccl_py_comm_t *comm);
/* Finishes a request with the GIL released; 0 or -1 with the Python error set. */
int hccl_py_request_wait(hccl_py_request_t *r);

/* comm.c */
int hccl_py_comm_enter(hccl_py_comm_t *c, const char *fn);
void hccl_py_comm_leave(hccl_py_comm_t *c);
int hccl_py_coll_init(void);

#endif
