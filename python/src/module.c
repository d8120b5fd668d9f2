/*
 * hccl._hccl: the module, its exceptions (one per hcclResult_t), and the translation of
 * Python buffers, operation names and dtypes into what the C API takes.
 */
#include <string.h>

#include "hcclpy.h"

static PyObject *error_base;
static PyObject *error_classes[hcclNumResults];

static const struct {
    const char *name;
    const char *doc;
} error_names[hcclNumResults] = {
    [hcclInvalidArgument] = {"InvalidArgumentError",
                             "A bad argument: buffer, count, dtype, op, root or rank."},
    [hcclInvalidUsage] = {"InvalidUsageError",
                          "Misuse: mismatched collectives across ranks, use after destroy."},
    [hcclSystemError] = {"SystemCallError", "An OS, libevent or verbs call failed."},
    [hcclRemoteError] = {"RemoteError", "A peer died, disconnected or reported an error."},
    [hcclTimeout] = {"TimeoutError", "A connect or execution timeout expired."},
    [hcclInProgress] = {"InProgressError", "The operation has not finished."},
    [hcclAborted] = {"AbortedError", "The communicator was aborted."},
    [hcclUnsupported] = {"UnsupportedError", "Not available in this build or on this host."},
    [hcclInternalError] = {"InternalError", "An internal error of hccl."},
};

PyObject *hccl_py_error_for(hcclResult_t res)
{
    if ((int)res > 0 && res < hcclNumResults && error_classes[res])
        return error_classes[res];
    return error_base;
}

/* Raises the class of res with msg (or the code's own text when msg is empty); .code and
 * .message carry them. Returns NULL, for `return hccl_py_raise(...)`. */
PyObject *hccl_py_raise(hcclResult_t res, const char *msg)
{
    PyObject *cls = hccl_py_error_for(res);
    PyObject *text, *exc, *code;

    if (!msg || !*msg)
        msg = hcclGetErrorString(res);
    text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
    if (!text)
        return NULL;
    exc = PyObject_CallOneArg(cls, text);
    code = PyLong_FromLong((long)res);
    if (exc && code && PyObject_SetAttrString(exc, "code", code) == 0 &&
        PyObject_SetAttrString(exc, "message", text) == 0)
        PyErr_SetObject(cls, exc);
    Py_XDECREF(code);
    Py_XDECREF(exc);
    Py_DECREF(text);
    return NULL;
}

/* On the thread that saw res: hcclGetLastError is thread-local. */
PyObject *hccl_py_raise_last(hcclResult_t res, hcclComm_t comm)
{
    return hccl_py_raise(res, hcclGetLastError(comm));
}

/* fmt as PyUnicode_FromFormat takes it (%R, %S, %zu ...). */
static PyObject *raise_invalid(const char *fmt, ...)
{
    PyObject *text;
    va_list ap;

    va_start(ap, fmt);
    text = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (!text)
        return NULL;
    hccl_py_raise(hcclInvalidArgument, PyUnicode_AsUTF8(text));
    Py_DECREF(text);
    return NULL;
}

static const char *const op_names[hcclNumOps] = {"sum", "prod", "max", "min", "avg"};

int hccl_py_clear_value_error(void)
{
    if (!PyErr_Occurred())
        return 0;
    if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_ValueError) &&
        !PyErr_ExceptionMatches(PyExc_OverflowError) &&
        !PyErr_ExceptionMatches(PyExc_AttributeError))
        return -1;
    PyErr_Clear();
    return 0;
}

int hccl_py_parse_op(PyObject *obj, hcclRedOp_t *op_p)
{
    if (PyLong_Check(obj)) {
        long v = PyLong_AsLong(obj);
        if (v >= 0 && v < hcclNumOps) {
            *op_p = (hcclRedOp_t)v;
            return 0;
        }
    } else if (PyUnicode_Check(obj)) {
        const char *s = PyUnicode_AsUTF8(obj);
        if (!s)
            return -1;
        for (int i = 0; i < hcclNumOps; i++) {
            if (strcmp(s, op_names[i]) == 0) {
                *op_p = (hcclRedOp_t)i;
                return 0;
            }
        }
        if (strcmp(s, "product") == 0) {
            *op_p = hcclProd;
            return 0;
        }
    }
    if (hccl_py_clear_value_error() < 0)
        return -1;
    raise_invalid("op: expected one of \"sum\", \"prod\", \"max\", \"min\", \"avg\" (or "
                  "hccl.SUM ... hccl.AVG), got %R",
                  obj);
    return -1;
}

static const struct {
    const char *name;
    hcclDataType_t dtype;
    size_t size;
} dtype_names[] = {
    {"int8", hcclInt8, 1},       {"uint8", hcclUint8, 1},       {"int32", hcclInt32, 4},
    {"uint32", hcclUint32, 4},   {"int64", hcclInt64, 8},       {"uint64", hcclUint64, 8},
    {"float16", hcclFloat16, 2}, {"bfloat16", hcclBfloat16, 2}, {"float32", hcclFloat32, 4},
    {"float64", hcclFloat64, 8}, {"half", hcclFloat16, 2},      {"float", hcclFloat32, 4},
    {"double", hcclFloat64, 8},  {"int", hcclInt32, 4},         {"long", hcclInt64, 8},
};

static size_t dtype_size(hcclDataType_t dtype)
{
    for (size_t i = 0; i < sizeof(dtype_names) / sizeof(dtype_names[0]); i++)
        if (dtype_names[i].dtype == dtype)
            return dtype_names[i].size;
    return 0;
}

/* Names the dtype of the text s ("float32", "torch.bfloat16", numpy's str of a dtype). */
static bool dtype_from_name(const char *s, hcclDataType_t *dtype_p)
{
    if (strncmp(s, "torch.", 6) == 0)
        s += 6;
    for (size_t i = 0; i < sizeof(dtype_names) / sizeof(dtype_names[0]); i++) {
        if (strcmp(s, dtype_names[i].name) == 0) {
            *dtype_p = dtype_names[i].dtype;
            return true;
        }
    }
    return false;
}

int hccl_py_parse_dtype(PyObject *obj, hcclDataType_t *dtype_p)
{
    PyObject *str;
    bool ok = false;

    if (PyLong_Check(obj)) {
        long v = PyLong_AsLong(obj);
        if (v >= 0 && v < hcclNumTypes) {
            *dtype_p = (hcclDataType_t)v;
            return 0;
        }
    } else if ((str = PyObject_Str(obj)) != NULL) {
        const char *s = PyUnicode_AsUTF8(str);
        ok = s && dtype_from_name(s, dtype_p);
        Py_DECREF(str);
        if (ok)
            return 0;
    }
    if (hccl_py_clear_value_error() < 0)
        return -1;
    raise_invalid("dtype: expected one of int8, uint8, int32, uint32, int64, uint64, float16, "
                  "bfloat16, float32, float64; got %R",
                  obj);
    return -1;
}

/* The element type of a buffer-protocol format ("f", "<i", "=q", ...). */
static bool dtype_from_format(const char *fmt, size_t itemsize, hcclDataType_t *dtype_p,
                              bool *is_bool_p)
{
    *is_bool_p = false;
    if (!fmt)
        fmt = "B";
    if (*fmt == '@' || *fmt == '=' || *fmt == '<')
        fmt++;
    if (fmt[0] == '\0' || fmt[1] != '\0')
        return false;
    switch (fmt[0]) {
    case 'b':
        *dtype_p = hcclInt8;
        return true;
    case 'B':
    case 'c':
        *dtype_p = hcclUint8;
        return true;
    case '?':
        *dtype_p = hcclUint8;
        *is_bool_p = true;
        return itemsize == 1;
    case 'e':
        *dtype_p = hcclFloat16;
        return true;
    case 'f':
        *dtype_p = hcclFloat32;
        return true;
    case 'd':
        *dtype_p = hcclFloat64;
        return true;
    case 'i':
    case 'l':
    case 'q':
    case 'n':
        if (itemsize != 4 && itemsize != 8)
            return false;
        *dtype_p = itemsize == 4 ? hcclInt32 : hcclInt64;
        return true;
    case 'I':
    case 'L':
    case 'Q':
    case 'N':
        if (itemsize != 4 && itemsize != 8)
            return false;
        *dtype_p = itemsize == 4 ? hcclUint32 : hcclUint64;
        return true;
    default:
        return false;
    }
}

static PyObject *torch_tensor_type(void)
{
    PyObject *mods = PyImport_GetModuleDict();
    PyObject *torch = mods ? PyDict_GetItemString(mods, "torch") : NULL;

    /* Only where torch is imported already: a tensor cannot exist otherwise. */
    return torch ? PyObject_GetAttrString(torch, "Tensor") : NULL;
}

static int call_bool(PyObject *obj, const char *method)
{
    PyObject *r = PyObject_CallMethod(obj, method, NULL);
    int v;

    if (!r)
        return -1;
    v = PyObject_IsTrue(r);
    Py_DECREF(r);
    return v;
}

static long long attr_ll(PyObject *obj, const char *name, bool call)
{
    PyObject *r = call ? PyObject_CallMethod(obj, name, NULL) : PyObject_GetAttrString(obj, name);
    long long v;

    if (!r)
        return -1;
    v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return v;
}

/* A CPU torch tensor, through its data pointer (torch has no buffer protocol, and numpy has
 * no bfloat16). The tensor stays referenced in buf->owner. */
static int buf_from_tensor(PyObject *t, hccl_py_buf_t *b, const hccl_py_what_t *what)
{
    PyObject *dev = NULL, *devtype = NULL, *dt = NULL;
    int sparse, contig, rc = -1;
    long long ptr, numel, esize;

    {
        PyObject *a = PyObject_GetAttrString(t, "is_sparse");
        sparse = a ? PyObject_IsTrue(a) : -1;
        Py_XDECREF(a);
    }
    if (sparse != 0) {
        if (sparse > 0)
            raise_invalid("%s: %s: a sparse tensor; only dense CPU tensors are supported", what->fn,
                          what->arg);
        return -1;
    }
    dev = PyObject_GetAttrString(t, "device");
    devtype = dev ? PyObject_GetAttrString(dev, "type") : NULL;
    if (!devtype)
        goto out;
    if (!PyUnicode_Check(devtype) || PyUnicode_CompareWithASCIIString(devtype, "cpu") != 0) {
        raise_invalid("%s: %s: a tensor on device %S; hccl moves host memory (CPU tensors only)",
                      what->fn, what->arg, dev);
        goto out;
    }
    if ((contig = call_bool(t, "is_contiguous")) <= 0) {
        if (contig == 0)
            raise_invalid("%s: %s: the tensor is not contiguous (call .contiguous())", what->fn,
                          what->arg);
        goto out;
    }
    dt = PyObject_GetAttrString(t, "dtype");
    if (!dt)
        goto out;
    {
        PyObject *s = PyObject_Str(dt);
        const char *name = s ? PyUnicode_AsUTF8(s) : NULL;
        bool ok = false;
        if (name && strcmp(name, "torch.bool") == 0) {
            b->dtype = hcclUint8;
            b->is_bool = ok = true;
        } else if (name) {
            ok = dtype_from_name(name, &b->dtype);
        }
        if (name && !ok)
            raise_invalid(
                "%s: %s: tensors of %s are not supported (int8, uint8, int32, int64, bool, "
                "float16, bfloat16, float32, float64 are)",
                what->fn, what->arg, name);
        Py_XDECREF(s);
        if (!ok)
            goto out;
    }
    ptr = attr_ll(t, "data_ptr", true);
    numel = attr_ll(t, "numel", true);
    esize = attr_ll(t, "element_size", true);
    if (PyErr_Occurred())
        goto out;
    b->ptr = (void *)(uintptr_t)ptr;
    b->count = (size_t)numel;
    b->itemsize = (size_t)esize;
    b->has_dtype = true;
    Py_INCREF(t);
    b->owner = t;
    rc = 0;
out:
    Py_XDECREF(dt);
    Py_XDECREF(devtype);
    Py_XDECREF(dev);
    return rc;
}

int hccl_py_buf_get(PyObject *obj, bool writable, PyObject *dtype, hccl_py_buf_t *b,
                    const hccl_py_what_t *what)
{
    memset(b, 0, sizeof(*b));
    if (!PyObject_CheckBuffer(obj)) {
        PyObject *tensor = torch_tensor_type();
        int is_tensor = tensor ? PyObject_IsInstance(obj, tensor) : 0;
        Py_XDECREF(tensor);
        if (hccl_py_clear_value_error() < 0)
            return -1;
        if (is_tensor > 0) {
            if (buf_from_tensor(obj, b, what) < 0)
                return -1;
        } else {
            PyErr_Format(
                PyExc_TypeError,
                "%s: %s: expected a C-contiguous buffer (numpy array, bytearray, memoryview, "
                "CPU tensor), got %.200s",
                what->fn, what->arg, Py_TYPE(obj)->tp_name);
            return -1;
        }
    } else {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(obj, &b->view, flags) < 0) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            raise_invalid("%s: %s: not a %sC-contiguous buffer (%S)", what->fn, what->arg,
                          writable ? "writable " : "", value ? value : Py_None);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            b->view.obj = NULL;
            return -1;
        }
        b->ptr = b->view.buf;
        b->itemsize = b->view.itemsize > 0 ? (size_t)b->view.itemsize : 1;
        if (!dtype_from_format(b->view.format, b->itemsize, &b->dtype, &b->is_bool) &&
            (!dtype || dtype == Py_None)) {
            raise_invalid(
                "%s: %s: buffer format \"%s\" is not a dtype hccl has (int8, uint8, int32, "
                "uint32, int64, uint64, float16, float32, float64; bfloat16 via dtype=)",
                what->fn, what->arg, b->view.format ? b->view.format : "B");
            hccl_py_buf_release(b);
            return -1;
        }
        b->count = (size_t)b->view.len / b->itemsize;
        b->has_dtype = true;
    }
    if (dtype && dtype != Py_None) {
        /* Reinterpret the bytes, e.g. a uint16 array or bytearray holding bfloat16. */
        hcclDataType_t dt;
        size_t bytes = b->count * b->itemsize, size;
        if (hccl_py_parse_dtype(dtype, &dt) < 0) {
            hccl_py_buf_release(b);
            return -1;
        }
        size = dtype_size(dt);
        if (bytes % size != 0) {
            raise_invalid("%s: %s: %zu bytes is not a whole number of %zu-byte elements", what->fn,
                          what->arg, bytes, size);
            hccl_py_buf_release(b);
            return -1;
        }
        b->dtype = dt;
        b->itemsize = size;
        b->count = bytes / size;
        b->is_bool = false;
    }
    return 0;
}

void hccl_py_buf_release(hccl_py_buf_t *b)
{
    if (b->view.obj)
        PyBuffer_Release(&b->view);
    b->view.obj = NULL;
    Py_CLEAR(b->owner);
    b->ptr = NULL;
}

int hccl_py_buf_same_type(const hccl_py_buf_t *a, const hccl_py_buf_t *b, const char *what)
{
    if (a->dtype != b->dtype || a->is_bool != b->is_bool) {
        raise_invalid("%s: sendbuf and recvbuf have different dtypes", what);
        return -1;
    }
    return 0;
}

/* ---- module functions ---- */

static PyObject *py_get_unique_id(PyObject *self, PyObject *noargs)
{
    hcclUniqueId id;
    hcclResult_t res;

    (void)self;
    (void)noargs;
    Py_BEGIN_ALLOW_THREADS res = hcclGetUniqueId(&id);
    Py_END_ALLOW_THREADS if (res != hcclSuccess) return hccl_py_raise_last(res, NULL);
    return PyBytes_FromStringAndSize(id.internal, sizeof(id.internal));
}

static PyObject *py_unique_id_to_string(PyObject *self, PyObject *arg)
{
    hcclUniqueId id;
    char text[HCCL_UNIQUE_ID_STRLEN];
    hcclResult_t res;

    (void)self;
    if (!PyBytes_Check(arg) || PyBytes_GET_SIZE(arg) != HCCL_UNIQUE_ID_BYTES)
        return raise_invalid("unique_id_to_string: expected the %d bytes of get_unique_id()",
                             HCCL_UNIQUE_ID_BYTES);
    memcpy(id.internal, PyBytes_AS_STRING(arg), sizeof(id.internal));
    if ((res = hcclUniqueIdToString(&id, text, sizeof(text))) != hcclSuccess)
        return hccl_py_raise_last(res, NULL);
    return PyUnicode_FromString(text);
}

static PyObject *py_unique_id_from_string(PyObject *self, PyObject *arg)
{
    hcclUniqueId id;
    const char *text;
    hcclResult_t res;

    (void)self;
    if (!PyUnicode_Check(arg))
        return raise_invalid("unique_id_from_string: expected a str");
    if (!(text = PyUnicode_AsUTF8(arg)))
        return NULL;
    if ((res = hcclUniqueIdFromString(&id, text)) != hcclSuccess)
        return hccl_py_raise_last(res, NULL);
    return PyBytes_FromStringAndSize(id.internal, sizeof(id.internal));
}

static PyObject *py_get_version(PyObject *self, PyObject *noargs)
{
    int v = 0;
    hcclResult_t res = hcclGetVersion(&v);

    (void)self;
    (void)noargs;
    if (res != hcclSuccess)
        return hccl_py_raise_last(res, NULL);
    return PyLong_FromLong(v);
}

static PyObject *py_error_string(PyObject *self, PyObject *arg)
{
    long code = PyLong_AsLong(arg);

    (void)self;
    if (code == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(hcclGetErrorString((hcclResult_t)code));
}

static PyMethodDef module_methods[] = {
    {"get_unique_id", py_get_unique_id, METH_NOARGS,
     "get_unique_id() -> bytes: a new rendezvous id; call on one rank, pass to all."},
    {"unique_id_to_string", py_unique_id_to_string, METH_O, "The id as hex text."},
    {"unique_id_from_string", py_unique_id_from_string, METH_O, "The id from its hex text."},
    {"get_version", py_get_version, METH_NOARGS, "MAJOR*10000 + MINOR*100 + PATCH."},
    {"error_string", py_error_string, METH_O, "The static description of a result code."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "hccl._hccl",
    "hccl's C API for Python (see the hccl package).",
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

static int add_errors(PyObject *m)
{
    error_base = PyErr_NewExceptionWithDoc(
        "hccl.Error",
        "A failed hccl call: .code is the hcclResult_t, .message the text of "
        "hcclGetLastError on the thread that saw it.",
        NULL, NULL);
    if (!error_base || PyModule_AddObjectRef(m, "Error", error_base) < 0)
        return -1;
    for (int i = 1; i < hcclNumResults; i++) {
        PyObject *extra = i == hcclInvalidArgument ? PyExc_ValueError
                          : i == hcclTimeout       ? PyExc_TimeoutError
                                                   : NULL;
        PyObject *bases = extra ? PyTuple_Pack(2, error_base, extra) : PyTuple_Pack(1, error_base);
        char qual[64];
        if (!bases)
            return -1;
        snprintf(qual, sizeof(qual), "hccl.%s", error_names[i].name);
        error_classes[i] = PyErr_NewExceptionWithDoc(qual, error_names[i].doc, bases, NULL);
        Py_DECREF(bases);
        if (!error_classes[i] ||
            PyModule_AddObjectRef(m, error_names[i].name, error_classes[i]) < 0)
            return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__hccl(void);
PyMODINIT_FUNC PyInit__hccl(void)
{
    static const char *const type_names[hcclNumTypes] = {"INT8",    "UINT8",  "INT32",   "UINT32",
                                                         "INT64",   "UINT64", "FLOAT16", "BFLOAT16",
                                                         "FLOAT32", "FLOAT64"};
    PyObject *m;

    if (hccl_py_coll_init() < 0 || PyType_Ready(&hccl_py_comm_type) < 0 ||
        PyType_Ready(&hccl_py_request_type) < 0)
        return NULL;
    if (!(m = PyModule_Create(&module_def)))
        return NULL;
    if (add_errors(m) < 0 || PyModule_AddObjectRef(m, "Comm", (PyObject *)&hccl_py_comm_type) < 0 ||
        PyModule_AddObjectRef(m, "Request", (PyObject *)&hccl_py_request_type) < 0)
        goto fail;
    for (int i = 0; i < hcclNumOps; i++) {
        char name[8];
        for (int j = 0; j < 7 && op_names[i][j]; j++)
            name[j] = (char)(op_names[i][j] - 'a' + 'A'), name[j + 1] = '\0';
        if (PyModule_AddIntConstant(m, name, i) < 0)
            goto fail;
    }
    for (int i = 0; i < hcclNumTypes; i++)
        if (PyModule_AddIntConstant(m, type_names[i], i) < 0)
            goto fail;
    if (PyModule_AddIntConstant(m, "UNIQUE_ID_BYTES", HCCL_UNIQUE_ID_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "SPLIT_NOCOLOR", HCCL_SPLIT_NOCOLOR) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
