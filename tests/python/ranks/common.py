"""What the rank scripts share: dtypes, inputs and NumPy references."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (name, numpy dtype of the storage, dtype= to pass or None)
DTYPES = [
    ("int8", np.int8, None), ("uint8", np.uint8, None), ("int32", np.int32, None),
    ("uint32", np.uint32, None), ("int64", np.int64, None), ("uint64", np.uint64, None),
    ("float16", np.float16, None), ("float32", np.float32, None), ("float64", np.float64, None),
    ("bfloat16", np.uint16, "bfloat16"), ("bool", np.bool_, None),
]
OPS = ["sum", "prod", "max", "min", "avg"]


def values(rank, n, op, dtype_name):
    """Small exact values: their sums, products and averages fit every dtype."""
    i = np.arange(n)
    if dtype_name == "bool":
        return ((i + rank) % 3 == 0)
    if op == "prod":
        return 1 + ((i + rank) % 2)
    return 1 + ((i * 7 + rank * 3) % 5)


def to_storage(v, name, store):
    if name == "bfloat16":
        return (np.asarray(v, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.asarray(v).astype(store)


def from_storage(a, name):
    if name == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a


def reduce_ref(arrays, op, name):
    a = np.stack([np.asarray(x, np.float64) for x in arrays])
    if name == "bool":
        return (a.max(0) if op in ("sum", "max") else a.min(0)).astype(bool)
    if op == "sum":
        return a.sum(0)
    if op == "prod":
        return a.prod(0)
    if op == "max":
        return a.max(0)
    if op == "min":
        return a.min(0)
    s = a.sum(0) / len(arrays)
    return np.trunc(s) if name not in ("float16", "float32", "float64", "bfloat16") else s


def check(got, want, what):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-2, atol=0):
        bad = np.flatnonzero(~np.isclose(got.ravel(), want.ravel(), rtol=1e-2, atol=0))
        raise AssertionError("%s: %d elements differ, first at %s: got %s want %s"
                             % (what, len(bad), bad[:1], got.ravel()[bad[:1]], want.ravel()[bad[:1]]))
