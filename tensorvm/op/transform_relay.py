"""Relay's data-movement operators that the core ``transform`` module lacks: ``adv_index`` (NumPy's
advanced indexing by a tuple of index tensors), ``contrib_reverse_reshape`` (also registered as
``reverse_reshape``), ``sparse_to_dense`` and ``dyn.sparse_to_dense`` (the output shape as a tensor).
"""

from __future__ import annotations

import numpy as np

from ..errors import ExecutionError, ShapeError, TypeInferenceError
from ..ir.types import Any, TensorType, TupleType
from ..te import expr as E
from ..te.expr import INDEX_DTYPE, cast, const, select
from ..te.tensor import compute, reduce_axis
from ..te.tensor import max as te_max
from ._common import INT_DTYPES, broadcast_logic, expect_tensor
from ._compute import broadcast_read, broadcast_shape, output_dims, reshape_to
from .registry import REQUIRED, AttrDef, OpPattern
from .shape_logic import DataArg, Sym, require, traceable
from .transform import (
    _te_reshape_dims,
    define,
    define_shaped,
    expect_int_tensor,
    fmt_shape,
    int_tuple,
    reshape_dims,
)

__all__: list[str] = []


# ---------------------------------------------------------------------------------------------------
# adv_index((data, index0, index1, ...))


def _adv_index_logic(op, shapes, err):
    data, indices = shapes[0], shapes[1:]
    if not indices:
        raise err(f"{op}: expected data and at least one index tensor")
    if len(indices) > len(data):
        raise err(f"{op}: {len(indices)} index tensors for data of rank {len(data)}")
    return tuple(broadcast_logic(op, None, list(indices), err)) + tuple(data[len(indices):])


def _adv_index_rel(types, attrs, consts=None):
    op = "adv_index"
    if not isinstance(types[0], TupleType) or not types[0].fields:
        raise TypeInferenceError(f"{op}: expected a tuple (data, index tensors...), got {types[0]}")
    data = expect_tensor(op, types[0].fields[0], "data")
    indices = [expect_int_tensor(op, t, f"index {i}") for i, t in enumerate(types[0].fields[1:])]
    return TensorType(_adv_index_logic(op, [data.shape] + [t.shape for t in indices], TypeInferenceError), data.dtype)


def _adv_index_kernel(attrs, arrays):
    data, *indices = (np.asarray(a) for a in arrays)
    _adv_index_logic("adv_index", [data.shape] + [i.shape for i in indices], ShapeError)
    for axis, index in enumerate(indices):
        bad = (index < -data.shape[axis]) | (index >= data.shape[axis])
        if bad.any():
            raise ExecutionError(f"adv_index: index {index[bad].flat[0]} is out of range for axis {axis} of size "
                                 f"{data.shape[axis]}")
    return data[tuple(indices)]


def _adv_index_compute(attrs, inputs, out_type):
    data, *indices = inputs[0]
    shape, requires = broadcast_shape("adv_index", *(t.shape for t in indices))
    k = len(shape)

    def f(*i):
        position = tuple(E.index_check(cast(broadcast_read(t, i[:k], shape), INDEX_DTYPE), data.shape[axis])
                         for axis, t in enumerate(indices))
        return data[position + tuple(i[k:])]

    return [compute(shape + tuple(data.shape[len(indices):]), f, "adv_index", requires)]


define(
    "adv_index", 1, _adv_index_rel, _adv_index_kernel, OpPattern.INJECTIVE,
    shape_logic=traceable(lambda op, attrs, args, err: _adv_index_logic(op, list(args[0]), err)),
    compute=_adv_index_compute,
    doc="data[index0, index1, ...] with NumPy's advanced indexing: the index tensors broadcast together and "
        "index the leading axes (negative indices count from the end).",
)


# ---------------------------------------------------------------------------------------------------
# contrib_reverse_reshape


@traceable
def _reverse_reshape_logic(op, attrs, shapes, err):
    return reshape_dims(op, tuple(shapes[0])[::-1], attrs.newshape[::-1], False, err)[::-1]


def _reverse_reshape_compute(attrs, inputs, out_type):
    x = inputs[0]
    shape, requires = _te_reshape_dims("contrib_reverse_reshape", tuple(x.shape)[::-1], attrs.newshape[::-1], False)
    return [reshape_to("contrib_reverse_reshape", x, shape[::-1], requires)]


for _name in ("contrib_reverse_reshape", "reverse_reshape"):
    define_shaped(
        _name, 1, _reverse_reshape_logic, lambda attrs, shape, x: x.reshape(shape), OpPattern.INJECTIVE,
        # -4 is not accepted: its two values would be read in the wrong order
        attrs=(AttrDef("newshape", REQUIRED, int_tuple(-3)),), compute=_reverse_reshape_compute,
        doc="reshape with the special values 0, -1, -2, -3 read from right to left (e.g. (10, 5, 4) with "
            "newshape (-1, 0) gives (50, 4)).",
    )


# ---------------------------------------------------------------------------------------------------
# sparse_to_dense(sparse_indices, sparse_values, default_value, output_shape=...) and
# dyn.sparse_to_dense(sparse_indices, output_shape, sparse_values, default_value)


def _sparse_logic(op, indices, values, default, out_shape, err):
    if len(indices) > 2:
        raise err(f"{op}: sparse_indices must have rank 0, 1 or 2, got {fmt_shape(indices)}")
    if len(default):
        raise err(f"{op}: default_value must be a scalar, got shape {fmt_shape(default)}")
    if len(values) > 1:
        raise err(f"{op}: sparse_values must be a scalar or 1-D, got {fmt_shape(values)}")
    count = indices[0] if len(indices) else 1
    if len(values) == 1:
        _same_count(op, values[0], count, err)
    rank = indices[1] if len(indices) == 2 else 1
    if isinstance(rank, (int, Sym)):  # (a known or traced dim)
        require(rank == len(out_shape), f"{op}: sparse_indices give {rank} coordinates per value for an output of "
                                        f"rank {len(out_shape)}", err)
    return tuple(out_shape)


def _same_count(op, a, b, err):
    if isinstance(a, (int, Sym)) and isinstance(b, (int, Sym)):
        require(a == b, f"{op}: {a} sparse values for {b} sparse indices", err)


def _check_sparse_types(op, indices, values, default):
    expect_int_tensor(op, indices, "sparse_indices")
    if values.dtype != default.dtype:
        raise TypeInferenceError(f"{op}: default_value must have sparse_values' dtype {values.dtype}, got "
                                 f"{default.dtype}")


def _sparse_kernel(op, out_shape, indices, values, default):
    out = np.full(out_shape, default, dtype=values.dtype)
    coords = indices.reshape(-1, 1) if indices.ndim < 2 else indices
    if coords.shape[0] == 0:
        return out
    values = np.broadcast_to(values, (coords.shape[0],))
    for axis, size in enumerate(out_shape):
        bad = (coords[:, axis] < -size) | (coords[:, axis] >= size)
        if bad.any():
            raise ExecutionError(f"{op}: index {coords[bad, axis][0]} is out of range for output dim {axis} of "
                                 f"size {size}")
    flat = np.ravel_multi_index(tuple(np.mod(coords[:, a], s) for a, s in enumerate(out_shape)), out_shape)
    # a repeated index keeps its last value
    _, first_of_reversed = np.unique(flat[::-1], return_index=True)
    last = len(flat) - 1 - first_of_reversed
    out.reshape(-1)[flat[last]] = values[last]
    return out


def _sparse_compute(op, indices, values, default, shape, dtype):
    """Each output position takes the value of the last sparse index equal to it, else default_value."""
    count = indices.shape[0] if indices.ndim else const(1)
    r = reduce_axis(count, "i")

    def coordinate(i, axis):
        if indices.ndim == 0:
            return indices[()]
        return indices[(i,) if indices.ndim == 1 else (i, const(axis))]

    def last_match(*p):
        match = E.all_of(*(E.eq(E.index_check(cast(coordinate(r.var, a), INDEX_DTYPE), shape[a]), p[a])
                           for a in range(len(shape))))
        return te_max(r.var, [r], where=match)

    found = compute(shape, last_match, f"{op.replace('.', '_')}_find")

    def f(*p):
        i = found[p]
        value = values[()] if values.ndim == 0 else values[(E.maximum(i, 0),)]
        return select(i >= 0, cast(value, dtype), cast(default[()], dtype))

    return compute(shape, f, op.replace(".", "_"), _count_requires(op, indices, values))


def _count_requires(op, indices, values):
    if values.ndim == 0 or indices.ndim == 0:
        return []
    return [(E.eq(values.shape[0], indices.shape[0]), f"{op}: the numbers of sparse values and indices differ")]


def _sparse_rel(types, attrs, consts=None):
    op = "sparse_to_dense"
    indices, values, default = (expect_tensor(op, t, n) for t, n in zip(types, ("sparse_indices", "sparse_values",
                                                                             "default_value"), strict=True))
    _check_sparse_types(op, indices, values, default)
    return TensorType(_sparse_logic(op, indices.shape, values.shape, default.shape, attrs.output_shape,
                                    TypeInferenceError), values.dtype)


define(
    "sparse_to_dense", 3, _sparse_rel,
    lambda attrs, i, v, d: _sparse_kernel("sparse_to_dense", _sparse_logic(
        "sparse_to_dense", np.shape(i), np.shape(v), np.shape(d), attrs.output_shape, ShapeError),
        np.asarray(i), np.asarray(v), np.asarray(d)),
    OpPattern.OPAQUE,
    attrs=(AttrDef("output_shape", REQUIRED, int_tuple(0)),),
    shape_logic=traceable(lambda op, attrs, shapes, err: _sparse_logic(op, *shapes, attrs.output_shape, err)),
    compute=lambda attrs, inputs, out_type: [_sparse_compute("sparse_to_dense", *inputs, tuple(
        const(d) for d in attrs.output_shape), out_type.dtype)],
    doc="A dense tensor of output_shape holding default_value, with sparse_values (one per index, or one "
        "scalar for all) at sparse_indices ((N, rank), (N,) or a scalar index); a repeated index keeps its "
        "last value.",
)


def _dyn_output_shape(op, value, err) -> tuple:
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or (arr < 0).any():
        raise err(f"{op}: output_shape must be a 1-D tensor of non-negative integers, got {arr.tolist()!r}")
    return tuple(int(v) for v in arr)


def _dyn_sparse_rel(types, attrs, consts=None):
    op = "dyn.sparse_to_dense"
    indices, shape_t, values, default = (expect_tensor(op, t, n) for t, n in zip(
        types, ("sparse_indices", "output_shape", "sparse_values", "default_value"), strict=True))
    _check_sparse_types(op, indices, values, default)
    expect_int_tensor(op, shape_t, "output_shape")
    if consts is not None and consts[1] is not None:
        out = _dyn_output_shape(op, consts[1], TypeInferenceError)
    elif shape_t.ndim == 1 and isinstance(shape_t.shape[0], int):
        out = (Any(),) * shape_t.shape[0]
    else:
        raise TypeInferenceError(f"{op}: output_shape must be a 1-D tensor of static length, got "
                                 f"{fmt_shape(shape_t.shape)}")
    return TensorType(_sparse_logic(op, indices.shape, values.shape, default.shape, out, TypeInferenceError),
                      values.dtype)


@traceable
def _dyn_sparse_logic(op, attrs, args, err):
    """sparse_to_dense's logic with output_shape known, or read in C (a static length, each dim >= 0)."""
    out_shape = args[1]
    if out_shape.values is not None:
        out = _dyn_output_shape(op, out_shape.values, err)
    else:
        if len(out_shape.shape) != 1 or out_shape.dtype not in INT_DTYPES:
            raise err(f"{op}: output_shape must be a 1-D integer tensor, got {out_shape.dtype} of shape "
                      f"{fmt_shape(out_shape.shape)}")
        out = out_shape.int_values()
        for d in out:
            require(d >= 0, f"{op}: output_shape must be a 1-D tensor of non-negative integers", err)
    return _sparse_logic(op, tuple(args[0]), tuple(args[2]), tuple(args[3]), out, err)


define(
    "dyn.sparse_to_dense", 4, _dyn_sparse_rel,
    lambda attrs, i, s, v, d: _sparse_kernel("dyn.sparse_to_dense", _dyn_sparse_logic(
        "dyn.sparse_to_dense", attrs, [np.shape(i), DataArg.of_array(s), np.shape(v), np.shape(d)], ShapeError),
        np.asarray(i), np.asarray(v), np.asarray(d)),
    OpPattern.OPAQUE, shape_logic=_dyn_sparse_logic, data_dependent=(False, True, False, False),
    compute=lambda attrs, inputs, out_type: [_sparse_compute(
        "dyn.sparse_to_dense", inputs[0], inputs[2], inputs[3], output_dims("dyn.sparse_to_dense", out_type),
        out_type.dtype)],
    doc="sparse_to_dense with output_shape given as a run-time 1-D integer tensor.",
)
