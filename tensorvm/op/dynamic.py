"""Data movement and reductions whose axes, sizes or pads are run-time tensors (``dyn.*`` core ops).

``dyn.unsqueeze``, ``dyn.split``, ``dyn.pad``, ``dyn.reduce``, ``dyn.cumsum`` and ``dyn.nn.dropout`` are
the run-time-valued forms of ``expand_dims``, ``split``, ``nn.pad``, the reductions, ``cumsum`` and
``nn.dropout``: the value that decides the output shape (axes, split sizes, pads) is an integer tensor.
When it is a ``Constant`` the type relation gives the exact output type; otherwise the unknown dims are
``Any`` and the shape function, which reads that tensor and validates it (a ``ShapeError`` naming the bad
value), gives them at run time. Each compute then reads its output dims from the output arrays
(``output_dims``) and only the offsets it needs from the run-time tensor, like ``dyn.strided_slice``.

The number of axes (hence the output rank) must be static: a type has a static rank.
"""

from __future__ import annotations

import numpy as np

from .. import te
from ..errors import ExecutionError, ShapeError, TypeInferenceError
from ..ir.types import Any, TensorType, TupleType
from ..te import expr as E
from ..te.expr import INDEX_DTYPE, cast, const, eq, select
from ..te.tensor import compute, reduce_axis
from . import shape_logic as sl
from ._common import INT_DTYPES as _INT_DTYPES
from ._common import expect_tensor
from ._compute import acc_float, kernel_name, output_dims, product, reshape_to
from .registry import REQUIRED, AttrDef, OpPattern
from .transform import define, expect_int_tensor, fmt_shape, norm_axis, one_of, to_bool, to_int

__all__ = ["const_input", "int_values", "reduce_array", "unique_axes"]


def int_values(arr, op, what, err) -> tuple:
    """A 0-d or 1-d integer array's values (``err`` otherwise)."""
    arr = np.asarray(arr)
    if arr.ndim > 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise err(f"{op}: {what} must be a 0-d or 1-d integer tensor, got {arr.dtype} of shape {arr.shape}")
    return tuple(int(v) for v in arr.reshape(-1))


def _vector_length(op, ty, what):
    t = expect_int_tensor(op, ty, what)
    if t.ndim > 1:
        raise TypeInferenceError(f"{op}: {what} must be 0-d or 1-d, got {fmt_shape(t.shape)}")
    if t.ndim == 0:
        return 1
    return t.shape[0] if isinstance(t.shape[0], int) else None


def const_input(consts, i):
    """Argument ``i``'s constant value given to a type relation, or None."""
    return None if consts is None or i >= len(consts) else consts[i]


def unique_axes(op, axes, ndim, err) -> tuple:
    """``axes`` normalized to [0, ndim); out-of-range or repeated ones are ``err``."""
    out = []
    for a in axes:
        a2 = norm_axis(op, a, ndim, err)
        if a2 in out:
            raise err(f"{op}: axis {a} is repeated in {axes}")
        out.append(a2)
    return tuple(out)


def _vector_reads(t, op: str, what: str) -> list:
    """The elements of a 0-d or 1-d int tensor of static length, as index expressions."""
    if t.ndim == 0:
        return [cast(t[()], INDEX_DTYPE)]
    n = t.shape[0]
    if not isinstance(n, E.Const):
        raise TypeInferenceError(f"{op}: the length of {what} must be static, got {n}")
    return [cast(t[(const(j),)], INDEX_DTYPE) for j in range(n.value)]


def _norm_read(a, ndim: int):
    return select(a < 0, a + ndim, a)


def _pick(values, index):
    """``values[index]`` for a run-time index (a chain of selects; the shape function checked the range)."""
    out = values[-1]
    for j in range(len(values) - 2, -1, -1):
        out = select(eq(index, j), values[j], out)
    return out


# ---------------------------------------------------------------------------------------------------
# dyn.unsqueeze


def _unsqueeze_dims(op, shape, axes, err):
    ndim = len(shape) + len(axes)
    axes = unique_axes(op, axes, ndim, err)
    out, rest = [], iter(shape)
    for i in range(ndim):
        out.append(1 if i in axes else next(rest))
    return tuple(out)


def _axes_count(op, axes: sl.DataArg, err) -> int:
    """The number of axes of a 0-d or 1-d integer ``axes`` read in C: static (a C loop over a run-time
    number of them is not traced)."""
    if len(axes.shape) > 1 or axes.dtype not in _INT_DTYPES:
        raise err(f"{op}: axes must be a 0-d or 1-d integer tensor, got {axes.dtype} of shape {axes.shape}")
    n = axes.shape[0] if axes.shape else 1
    if not sl.const_int(n):
        sl.untraceable("reads a number of axes that is not static")
    return n


def _read_axes(op, axes: sl.DataArg, ndim: int, err) -> list:
    """The axes read in C, checked in [-ndim, ndim) and distinct, normalized (``Sym`` loads)."""
    read = [axes.item(j) for j in range(_axes_count(op, axes, err))]
    for a in read:
        sl.require(sl.dim_and(a >= -ndim, a < ndim), f"{op}: axis {a} is out of range for a tensor of rank {ndim}",
                   err)
    norm = [sl.dim_select(a < 0, a + ndim, a) for a in read]
    for j in range(len(norm)):
        for k in range(j + 1, len(norm)):
            sl.require(norm[j] != norm[k], f"{op}: axis {read[k]} is repeated in the axes", err)
    return norm


@sl.traceable
def _unsqueeze_logic(op, attrs, args, err):
    """Known axes place the new 1s directly; axes read in C (their number is static: it decides the rank)
    are checked (in range, distinct) and each output dim selects 1 or the input dim it receives."""
    shape, axes = tuple(args[0]), args[1]
    if axes.values is not None:
        return _unsqueeze_dims(op, shape, int_values(axes.values, op, "axes", err), err)
    ndim = len(shape) + _axes_count(op, axes, err)
    norm = _read_axes(op, axes, ndim, err)
    out = []
    for i in range(ndim):
        new, before = False, 0
        for a in norm:
            new = sl.dim_or(new, a == i)
            before = before + sl.dim_select(a < i, 1, 0)
        dim = 1  # (the input dim at position i - before: a select over the static input dims)
        for t in range(len(shape)):
            dim = sl.dim_select(i - before == t, shape[t], dim)
        out.append(sl.dim_select(new, 1, dim))
    return tuple(out)


def _unsqueeze_rel(types, attrs, consts=None):
    op = "dyn.unsqueeze"
    data = expect_tensor(op, types[0], "data")
    axes = const_input(consts, 1)
    if axes is not None:
        return TensorType(_unsqueeze_dims(op, data.shape, int_values(axes, op, "axes", TypeInferenceError),
                                          TypeInferenceError), data.dtype)
    n = _vector_length(op, types[1], "axes")
    if n is None:
        raise TypeInferenceError(f"{op}: the number of axes must be static (it decides the output rank)")
    return TensorType((Any(),) * (data.ndim + n), data.dtype)


def _unsqueeze_compute(attrs, inputs, out_type):
    """The data reshaped to the output dims (the shape function placed the new 1s)."""
    return [reshape_to("dyn.unsqueeze", inputs[0], output_dims("dyn.unsqueeze", out_type))]


define(
    "dyn.unsqueeze", 2, _unsqueeze_rel,
    lambda attrs, x, axes: np.asarray(x).reshape(_unsqueeze_dims("dyn.unsqueeze", np.shape(x), int_values(
        axes, "dyn.unsqueeze", "axes", ExecutionError), ShapeError)),
    OpPattern.OPAQUE,
    shape_logic=_unsqueeze_logic, data_dependent=(False, True), compute=_unsqueeze_compute,
    doc="expand_dims at several positions: insert size-1 dims at the output positions listed in the run-time "
        "1-d tensor ``axes`` (negative ones count from the output's end; a repeated axis is an error).",
)


# ---------------------------------------------------------------------------------------------------
# dyn.split


def _split_sizes(op, dim, split, num_outputs, err):
    """The parts' sizes along an axis of size ``dim`` (an int or a ``Sym``): ``split`` (known values) or,
    empty, near-equal parts of ceil(dim / num_outputs)."""
    if split:
        if len(split) != num_outputs:
            raise err(f"{op}: {len(split)} split sizes for {num_outputs} outputs")
        sl.require(all(s >= 0 for s in split) and sum(split) == dim,
                   f"{op}: split sizes {split} must be >= 0 and add up to the axis size {dim}", err)
        return tuple(split)
    chunk = (dim + (num_outputs - 1)) // num_outputs  # (ceil: dims are >= 0)
    return tuple(sl.dim_min(chunk, sl.dim_max(dim - i * chunk, 0)) for i in range(num_outputs))


def _read_split_sizes(op, dim, sizes: sl.DataArg, num_outputs, err):
    """The parts' sizes from ``sizes`` read in C: none (near-equal parts) or one per output, each >= 0 and
    adding up to ``dim``; a C conditional picks (its loads only run for a non-empty ``sizes``)."""
    n = sizes.shape[0] if sizes.shape else 1
    sl.require(sl.dim_or(n == 0, n == num_outputs), f"{op}: the number of split sizes must be 0 or {num_outputs}",
               err)
    read = [sizes.item(i) for i in range(num_outputs)]
    valid = sum(read[1:], read[0]) == dim
    for r in read:
        valid = sl.dim_and(valid, r >= 0)
    sl.require(sl.dim_or(n == 0, valid), f"{op}: split sizes must be >= 0 and add up to the axis size {dim}", err)
    return tuple(sl.dim_select(n == 0, c, r) for c, r in zip(_split_sizes(op, dim, (), num_outputs, err), read))


def _split_rel(types, attrs, consts=None):
    op = "dyn.split"
    data = expect_tensor(op, types[0], "data")
    expect_int_tensor(op, types[1], "sizes")
    axis = norm_axis(op, attrs.axis, data.ndim)
    split = const_input(consts, 1)
    dim = data.shape[axis]
    if split is not None and isinstance(dim, int):
        sizes = _split_sizes(op, dim, int_values(split, op, "sizes", TypeInferenceError), attrs.num_outputs,
                             TypeInferenceError)
    else:
        sizes = [Any()] * attrs.num_outputs
    return TupleType(tuple(TensorType(data.shape[:axis] + (s,) + data.shape[axis + 1:], data.dtype)
                           for s in sizes))


@sl.traceable
def _split_logic(op, attrs, args, err):
    shape, sizes = tuple(args[0]), args[1]
    axis = norm_axis(op, attrs.axis, len(shape), err)
    if sizes.values is not None:
        parts = _split_sizes(op, shape[axis], int_values(sizes.values, op, "sizes", err), attrs.num_outputs, err)
    else:
        if len(sizes.shape) > 1 or sizes.dtype not in _INT_DTYPES:
            raise err(f"{op}: sizes must be a 0-d or 1-d integer tensor, got {sizes.dtype} of shape {sizes.shape}")
        parts = _read_split_sizes(op, shape[axis], sizes, attrs.num_outputs, err)
    return [shape[:axis] + (s,) + shape[axis + 1:] for s in parts]


def _split_kernel(attrs, x, split):
    shapes = _split_logic("dyn.split", attrs, [np.shape(x), sl.DataArg.of_array(split)], ShapeError)
    axis = attrs.axis % x.ndim
    bounds = np.cumsum([0] + [s[axis] for s in shapes])
    return tuple(np.take(x, np.arange(bounds[i], bounds[i + 1]), axis=axis) for i in range(len(shapes)))


def _split_compute(attrs, inputs, out_type):
    """Part k starts where the parts before it end: their sizes are the output arrays' dims, which the
    shape function computed (and checked) from ``sizes``; the compute does not read ``sizes``."""
    x = inputs[0]
    axis = norm_axis("dyn.split", attrs.axis, x.ndim)
    outs, start = [], const(0)
    for k, field in enumerate(out_type.fields):
        d = field.shape[axis]
        size = const(d) if isinstance(d, int) else E.var(f"dyn_split_part{k}_size")
        shape = x.shape[:axis] + (size,) + x.shape[axis + 1:]
        outs.append(compute(shape, lambda *i, s=start: x[i[:axis] + (i[axis] + s,) + i[axis + 1:]], f"dyn_split{k}"))
        start = start + size
    return outs


define(
    "dyn.split", 2, _split_rel, _split_kernel, OpPattern.OPAQUE,
    attrs=(AttrDef("axis", 0, to_int), AttrDef("num_outputs", REQUIRED, lambda v: max(1, to_int(v)))),
    shape_logic=_split_logic, data_dependent=(False, True), compute=_split_compute,
    doc="split into ``num_outputs`` consecutive parts along ``axis`` of the sizes in the run-time 1-d tensor "
        "``sizes`` (empty: near-equal parts of ceil(dim / num_outputs), the last ones smaller).",
)


# ---------------------------------------------------------------------------------------------------
# dyn.pad: pads (begins..., ends...) over listed axes; negative pads crop


_PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad_shape(op, shape, pads, err):
    ndim = len(shape)
    if len(pads) != 2 * ndim:
        raise err(f"{op}: pads must have 2 x rank = {2 * ndim} values, got {len(pads)}")
    out = []
    for i, d in enumerate(shape):
        if isinstance(d, int):
            # (cropping comes first, so the crops alone must fit in the dim, whatever the other side pads)
            if d + min(pads[i], 0) + min(pads[i + ndim], 0) < 0:
                raise err(f"{op}: pads {pads} crop more than the {d} elements of axis {i}")
            out.append(d + pads[i] + pads[i + ndim])
        else:
            out.append(d if pads[i] == pads[i + ndim] == 0 else Any())
    return tuple(out)


def _full_pads(op, ndim, pads, axes, err):
    """Pads over ``axes`` (begins then ends) expanded to every axis; empty axes means all."""
    if not axes:
        return pads
    axes = unique_axes(op, axes, ndim, err)
    if len(pads) != 2 * len(axes):
        raise err(f"{op}: pads must have 2 x {len(axes)} values for axes {axes}, got {len(pads)}")
    full = [0] * (2 * ndim)
    for j, a in enumerate(axes):
        full[a], full[a + ndim] = pads[j], pads[j + len(axes)]
    return tuple(full)


def _pad_rel(types, attrs, consts=None):
    op = "dyn.pad"
    data = expect_tensor(op, types[0], "data")
    expect_int_tensor(op, types[1], "pads")
    expect_int_tensor(op, types[3], "axes")
    value = expect_tensor(op, types[2], "pad_value")
    if value.dtype != data.dtype or value.ndim != 0:
        raise TypeInferenceError(f"{op}: pad_value must be a scalar of the data's dtype {data.dtype}, got "
                                 f"{fmt_shape(value.shape)} {value.dtype}")
    pads, axes = const_input(consts, 1), const_input(consts, 3)
    if pads is not None and axes is not None:
        full = _full_pads(op, data.ndim, int_values(pads, op, "pads", TypeInferenceError),
                          int_values(axes, op, "axes", TypeInferenceError), TypeInferenceError)
        return TensorType(_folded_shape(attrs, data.shape, full, TypeInferenceError), data.dtype)
    n_pads, n_axes = _vector_length(op, types[1], "pads"), _vector_length(op, types[3], "axes")
    if n_pads is not None and n_axes is not None and n_pads != 2 * (n_axes or data.ndim):
        raise TypeInferenceError(f"{op}: pads must have 2 x {n_axes or data.ndim} values for "
                                 f"{n_axes or 'all'} axes, got {n_pads}")
    return TensorType((Any(),) * data.ndim, data.dtype)


def _folded_shape(attrs, shape, full, err):
    """The output shape; edge, reflect and wrap need an element left (after cropping) on a padded axis."""
    op = "dyn.pad"
    out = _pad_shape(op, shape, full, err)
    n = len(shape)
    for d, p, q in zip(shape, full[:n], full[n:], strict=True):
        if attrs.mode != "constant" and isinstance(d, int) and max(p, q) > 0 and d + min(p, 0) + min(q, 0) <= 0:
            raise err(f"{op}: cannot pad an axis with no elements (after cropping) in {attrs.mode} mode; "
                      f"shape {shape}, pads {full}")
    return out


def _checked_pads(attrs, shape, pads, axes):
    op = "dyn.pad"
    pads, axes = int_values(pads, op, "pads", ShapeError), int_values(axes, op, "axes", ShapeError)
    full = _full_pads(op, len(shape), pads, axes, ShapeError)
    return full, _folded_shape(attrs, shape, full, ShapeError)


def _pad_values(op, data: sl.DataArg, what, err) -> tuple:
    """The values of a 0-d or 1-d integer ``data``: numbers when known, else ``Sym`` loads (a static number)."""
    if data.values is not None:
        return int_values(data.values, op, what, err)
    if len(data.shape) > 1 or data.dtype not in _INT_DTYPES:
        raise err(f"{op}: {what} must be a 0-d or 1-d integer tensor, got {data.dtype} of shape {data.shape}")
    return tuple(data.item(j) for j in range(_axes_count(op, data, err)))


@sl.traceable
def _pad_logic(op, attrs, args, err):
    """Pads and axes known or read in C (a static number of each): the axes checked (in range, distinct),
    each axis's begin and end a select over the axes naming it, then _folded_shape's checks as requires."""
    shape, ndim = tuple(args[0]), len(args[0])
    pads = _pad_values(op, args[1], "pads", err)
    if args[3].values is not None:
        axes = unique_axes(op, int_values(args[3].values, op, "axes", err), ndim, err)
    else:
        axes = _read_axes(op, args[3], ndim, err)
    if axes:
        if len(pads) != 2 * len(axes):
            raise err(f"{op}: pads must have 2 x {len(axes)} values for axes {axes}, got {len(pads)}")
        full = [0] * (2 * ndim)
        for i in range(ndim):
            for j, a in enumerate(axes):
                full[i] = sl.dim_select(a == i, pads[j], full[i])
                full[i + ndim] = sl.dim_select(a == i, pads[j + len(axes)], full[i + ndim])
        pads = tuple(full)
    if len(pads) != 2 * ndim:
        raise err(f"{op}: pads must have 2 x rank = {2 * ndim} values, got {len(pads)}")
    out = []
    for i, d in enumerate(shape):
        out.append(d + pads[i] + pads[i + ndim])
        sl.require(d + sl.dim_min(pads[i], 0) + sl.dim_min(pads[i + ndim], 0) >= 0,
                   f"{op}: pads {pads} crop more than the {d} elements of axis {i}", err)
    if attrs.mode != "constant":
        for i, d in enumerate(shape):
            p, q = pads[i], pads[i + ndim]
            kept = d + sl.dim_min(p, 0) + sl.dim_min(q, 0)
            sl.require(sl.dim_or(sl.dim_max(p, q) <= 0, kept > 0),
                       f"{op}: cannot pad an axis with no elements (after cropping) in {attrs.mode} mode; "
                       f"shape {shape}, pads {pads}", err)
    return tuple(out)


def _pad_kernel(attrs, x, pads, value, axes):
    x = np.asarray(x)
    pads, _ = _checked_pads(attrs, x.shape, pads, axes)
    ndim = x.ndim
    # Crop first (negative pads), then pad (positive ones).
    x = x[tuple(slice(max(-pads[i], 0), x.shape[i] - max(-pads[i + ndim], 0)) for i in range(ndim))]
    widths = [(max(pads[i], 0), max(pads[i + ndim], 0)) for i in range(ndim)]
    if attrs.mode == "constant":
        return np.pad(x, widths, mode="constant", constant_values=np.asarray(value).reshape(()).item())
    return np.pad(x, widths, mode=attrs.mode)


def _pad_compute(attrs, inputs, out_type):
    """Output position o of an axis reads input position o - begin (begin read from ``pads``, negative
    when cropping); the kept input range [lo, hi) is what cropping leaves, and edge, reflect and wrap
    fold positions outside it back into it."""
    op = "dyn.pad"
    x, pads, value, axes = inputs
    ndim = x.ndim
    out = output_dims(op, out_type)
    axis_values = [_norm_read(a, ndim) for a in _vector_reads(axes, op, "axes")]
    if not axis_values and not isinstance(pads.shape[0], E.Const):  # (the shape function checked 2 x rank)
        pad_values = [cast(pads[(const(j),)], INDEX_DTYPE) for j in range(ndim)]
    else:
        pad_values = _vector_reads(pads, op, "pads")
    if axis_values:
        begins = [E.const(0, INDEX_DTYPE)] * ndim
        for j, a in enumerate(axis_values):
            begins = [select(eq(a, i), pad_values[j], b) for i, b in enumerate(begins)]
    else:
        begins = pad_values[:ndim]
    fill = value[()]

    def f(*i):
        index, inside = [], []
        for o, d, o_dim, begin in zip(i, x.shape, out, begins, strict=True):
            k = o - begin
            lo = E.maximum(-begin, 0)
            hi = d - E.maximum(begin + d - o_dim, 0)  # the end pad is o_dim - d - begin
            if attrs.mode == "constant":
                inside += [k >= 0, k < d]
                index.append(k)
            elif attrs.mode == "edge":
                index.append(E.minimum(E.maximum(k, lo), hi - 1))
            elif attrs.mode == "wrap":
                index.append(lo + E.floormod(k - lo, hi - lo))
            else:  # reflect: period 2 (n - 1) over the kept range (n = 1: its one element)
                n = hi - lo
                period = E.maximum(2 * (n - 1), 1)
                m = E.floormod(k - lo, period)
                index.append(lo + select(m < n, m, 2 * (n - 1) - m))
        return select(E.all_of(*inside), x[tuple(index)], fill) if inside else x[tuple(index)]

    return [compute(out, f, "dyn_pad")]


define(
    "dyn.pad", 4, _pad_rel, _pad_kernel, OpPattern.OPAQUE,
    attrs=(AttrDef("mode", "constant", one_of(*_PAD_MODES)),),
    shape_logic=_pad_logic, data_dependent=(False, True, False, True), compute=_pad_compute,
    doc="dyn.pad(data, pads, pad_value, axes): pads = (begins..., ends...) of the axes in the run-time 1-d "
        "tensor ``axes`` (empty: every axis), all run-time; a negative pad removes elements; mode constant, "
        "reflect, edge or wrap (NumPy's pad modes). ``nn.pad`` / ``dyn.nn.pad`` are the non-negative, "
        "every-axis forms.",
)


# ---------------------------------------------------------------------------------------------------
# dyn.reduce: sum, mean, max, min, prod over run-time axes

_REDUCERS = ("sum", "mean", "max", "min", "prod")


def _reduce_axes(op, ndim, axes, empty_is_all, err):
    if not axes:
        return tuple(range(ndim)) if empty_is_all else ()
    return tuple(sorted(unique_axes(op, axes, ndim, err)))


def _reduced(shape, axes):
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def _reduce_rel(types, attrs, consts=None):
    op = "dyn.reduce"
    data = expect_tensor(op, types[0], "data")
    if attrs.mode in ("sum", "mean", "prod") and data.dtype == "bool":
        raise TypeInferenceError(f"{op}: mode {attrs.mode} of bool data; cast it first")
    axes = const_input(consts, 1)
    if axes is not None:
        axes = _reduce_axes(op, data.ndim, int_values(axes, op, "axes", TypeInferenceError), attrs.empty_is_all,
                            TypeInferenceError)
        return TensorType(_reduced(data.shape, axes), data.dtype)
    _vector_length(op, types[1], "axes")
    return TensorType((Any(),) * data.ndim, data.dtype)


def reduce_array(x: np.ndarray, axes: tuple, keepdims: bool, mode: str) -> np.ndarray:
    """A reduction of ``x`` over ``axes`` (an empty one gives the identity: -inf/+inf for max/min)."""
    dtype = x.dtype
    if not axes:
        return x.copy()
    kw = dict(axis=axes, keepdims=keepdims)
    if mode in ("max", "min"):
        if np.issubdtype(dtype, np.floating):
            init = -np.inf if mode == "max" else np.inf
        elif dtype == np.bool_:
            init = mode == "min"
        else:
            init = np.iinfo(dtype).min if mode == "max" else np.iinfo(dtype).max
        out = (np.max if mode == "max" else np.min)(x, initial=init, **kw)
    elif mode == "sum":
        out = np.sum(x, dtype=dtype, **kw)
    elif mode == "prod":
        out = np.prod(x, dtype=dtype, **kw)
    else:
        total = np.sum(x, dtype=dtype, **kw)
        count = int(np.prod([x.shape[a] for a in axes]))
        if np.issubdtype(dtype, np.floating):
            with np.errstate(invalid="ignore", divide="ignore"):
                out = total / dtype.type(count)
        else:
            out = np.sign(total) * (np.abs(total) // max(1, count))  # rounded toward 0, as mean is
    return np.asarray(out).astype(dtype)


def _reduce_kernel(attrs, x, axes):
    x = np.asarray(x)
    axes = _reduce_axes("dyn.reduce", x.ndim, int_values(axes, "dyn.reduce", "axes", ShapeError), attrs.empty_is_all,
                        ShapeError)
    return reduce_array(x, axes, True, attrs.mode)


@sl.traceable
def _dyn_reduce_logic(op, attrs, args, err):
    """The data's shape with the reduced axes as 1s: known axes directly; axes read in C (a static number)
    checked and each dim a select (1 where some axis names it)."""
    shape, axes = tuple(args[0]), args[1]
    if axes.values is not None:
        return _reduced(shape, _reduce_axes(op, len(shape), int_values(axes.values, op, "axes", err),
                                            attrs.empty_is_all, err))
    norm = _read_axes(op, axes, len(shape), err)
    if not norm:
        return _reduced(shape, _reduce_axes(op, len(shape), (), attrs.empty_is_all, err))
    out = []
    for i, d in enumerate(shape):
        named = False
        for a in norm:
            named = sl.dim_or(named, a == i)
        out.append(sl.dim_select(named, 1, d))
    return tuple(out)


def _reduce_compute(attrs, inputs, out_type):
    """Every input dim is a reduce axis whose extent is the dim where it is reduced and 1 where it is
    kept. The output dims say which is which (a reduced dim is 1; a kept dim of 1 reduces over its one
    element either way), so ``axes`` is not read (a loop extent cannot read data)."""
    op = "dyn.reduce"
    x = inputs[0]
    keep = output_dims(op, out_type)
    reduced = [eq(o, 1) for o in keep]
    extents = [select(r, d, const(1, INDEX_DTYPE)) for r, d in zip(reduced, x.shape, strict=True)]
    rs = [reduce_axis(n, f"r{i}") for i, n in enumerate(extents)]
    dtype = x.dtype
    acc = "uint8" if dtype == "bool" else dtype  # (max/min identities 0 and 255: False and True)
    mode = "sum" if attrs.mode == "mean" else attrs.mode
    reducer = {"sum": te.sum, "prod": te.prod, "max": te.max, "min": te.min}[mode]

    def f(*i):
        value = x[tuple(o + r.var for o, r in zip(i, rs, strict=True))]
        return reducer(cast(value, acc) if acc != dtype else value, rs)

    name = kernel_name(op)
    total = compute(keep, f, name)
    result = total
    if attrs.mode == "mean":
        count = product(extents)
        if dtype.startswith("float"):
            af = acc_float(dtype)
            result = compute(keep, lambda *i: cast(cast(total[i], af) / cast(count, af), dtype), f"{name}_mean")
        else:
            result = compute(keep, lambda *i: E.truncdiv(total[i], cast(E.maximum(count, 1), dtype)), f"{name}_mean")
    elif acc != dtype:
        result = compute(keep, lambda *i: E.ne(total[i], 0), f"{name}_bool")
    return [result]


define(
    "dyn.reduce", 2, _reduce_rel, _reduce_kernel, OpPattern.OPAQUE,
    attrs=(AttrDef("mode", REQUIRED, one_of(*_REDUCERS)),
           AttrDef("empty_is_all", True, to_bool, "empty axes reduce every axis; else none (a copy)")),
    shape_logic=_dyn_reduce_logic, data_dependent=(False, True), compute=_reduce_compute,
    doc="dyn.reduce(data, axes): sum, mean, max, min or prod (``mode``) over the axes in the run-time 1-d "
        "tensor ``axes``, keeping them as dims of 1 (``dyn.squeeze`` with the same axes drops them); an "
        "empty reduction gives the identity (max: the dtype's lowest, -inf for floats); max/min of bool "
        "data are any/all.",
)


# ---------------------------------------------------------------------------------------------------
# dyn.cumsum: a running sum along a run-time axis


def _axis_value(axis, ndim, op, err) -> int:
    axis = np.asarray(axis)
    if axis.size != 1 or not np.issubdtype(axis.dtype, np.integer):
        raise err(f"{op}: axis must be one integer, got {axis.dtype} of shape {axis.shape}")
    return norm_axis(op, int(axis.reshape(()).item()), ndim, err)


def _cumsum_kernel(attrs, x, axis):
    x = np.asarray(x)
    axis = _axis_value(axis, x.ndim, "dyn.cumsum", ShapeError)
    data = np.flip(x, axis) if attrs.reverse else x
    out = np.cumsum(data, axis=axis, dtype=x.dtype)
    if attrs.exclusive:
        out = out - data
    return np.flip(out, axis) if attrs.reverse else out


def _cumsum_rel(types, attrs, consts=None):
    x = expect_tensor("dyn.cumsum", types[0], "data")
    if x.ndim == 0 or x.dtype == "bool":
        raise TypeInferenceError(f"dyn.cumsum: data must be a numeric tensor of rank >= 1, got {x!r}")
    _one_element("dyn.cumsum", types[1], "axis")
    expect_int_tensor("dyn.cumsum", types[1], "axis")
    return x


def _one_element(op, ty, what):
    """A scalar operand: 0-d, or 1-d of static length 1 (the compute reads its element unchecked)."""
    t = expect_tensor(op, ty, what)
    if not (t.ndim == 0 or t.ndim == 1 and t.shape[0] == 1):
        raise TypeInferenceError(f"{op}: {what} must be a scalar (or one element), got {t!r}")
    return t


@sl.traceable
def _cumsum_logic(op, attrs, args, err):
    """The data's shape, once the run-time axis is checked to be in range."""
    shape, axis = tuple(args[0]), args[1]
    if axis.values is not None:
        _axis_value(axis.values, len(shape), op, err)
        return shape
    if axis.size() != 1 or axis.dtype not in _INT_DTYPES:
        raise err(f"{op}: axis must be one integer, got {axis.dtype} of shape {axis.shape}")
    a, ndim = axis.item(0), len(shape)
    sl.require(sl.dim_and(a >= -ndim, a < ndim), f"{op}: axis {a} is out of range for a tensor of rank {ndim}", err)
    return shape


def _cumsum_compute(attrs, inputs, out_type):
    """Each output element sums the line along the run-time axis up to itself (a reduction per element:
    quadratic in the axis length; the constant-axis form lowers to ``cumsum``'s linear library scan)."""
    x, axis = inputs
    ndim = x.ndim
    a = _norm_read(_vector_reads(axis, "dyn.cumsum", "axis")[0], ndim)
    longest = x.shape[0]
    for d in x.shape[1:]:
        longest = E.maximum(longest, d)
    r = reduce_axis(longest, "r")  # (a loop extent cannot read data: the axis's length bounds it in where=)

    def f(*i):
        at = _pick(list(i), a)
        # (clamped: the load stays inside the axis even where where= leaves the element out)
        index = tuple(select(eq(a, j), E.minimum(r.var, d - 1), i[j]) for j, d in enumerate(x.shape))
        if attrs.reverse:
            keep = E.logical_and(r.var > at if attrs.exclusive else r.var >= at, r.var < _pick(list(x.shape), a))
        else:
            keep = r.var < at if attrs.exclusive else r.var <= at
        return te.sum(x[index], r, where=keep)

    # (the output shape is the input's: no shape function need run, so the kernel checks the axis)
    requires = [(E.logical_and(a >= 0, a < ndim), f"dyn.cumsum: axis is out of range for a tensor of rank {ndim}")]
    return [compute(x.shape, f, "dyn_cumsum", requires)]


define(
    "dyn.cumsum", 2, _cumsum_rel, _cumsum_kernel, OpPattern.OPAQUE,
    attrs=(AttrDef("exclusive", False, to_bool), AttrDef("reverse", False, to_bool)),
    shape_logic=_cumsum_logic, data_dependent=(False, True), compute=_cumsum_compute,
    doc="dyn.cumsum(data, axis): cumsum along the axis given by a run-time integer scalar (or 1-element "
        "tensor), in the data's dtype; exclusive leaves out each element itself, reverse runs from the end.",
)


# ---------------------------------------------------------------------------------------------------
# dyn.nn.dropout: nn.dropout whose rate and training flag are run-time scalars


def _dropout_training(rate, training) -> bool:
    return bool(np.asarray(training).reshape(-1)[0]) and float(np.asarray(rate).reshape(-1)[0]) != 0.0


def _dropout_kernel(attrs, x, rate, training):
    if _dropout_training(rate, training):
        raise ExecutionError("dyn.nn.dropout: training-mode dropout with a nonzero rate draws random masks, "
                             "which tensorvm does not implement")
    x = np.asarray(x)
    return x.copy(), np.ones(x.shape, dtype=bool)


def _dropout_rel(types, attrs, consts=None):
    op = "dyn.nn.dropout"
    data = expect_tensor(op, types[0], "data")
    _one_element(op, types[1], "rate")
    if _one_element(op, types[2], "training").dtype != "bool":
        raise TypeInferenceError(f"{op}: training must be bool, got {types[2]!r}")
    return TupleType((data, TensorType(data.shape, "bool")))


def _dropout_compute(attrs, inputs, out_type):
    """The identity and a mask of ones; training with a nonzero rate fails the kernel's entry check."""
    x, rate, training = inputs
    first = (lambda t: t[()]) if rate.ndim == 0 else (lambda t: t[(const(0),)])
    first_flag = (lambda t: t[()]) if training.ndim == 0 else (lambda t: t[(const(0),)])
    deterministic = E.logical_or(E.logical_not(first_flag(training)), eq(first(rate), const(0, rate.dtype)))
    message = "dyn.nn.dropout: training-mode dropout with a nonzero rate draws random masks, which tensorvm " \
              "does not implement"
    out = compute(x.shape, lambda *i: x[i], "dyn_dropout", [(deterministic, message)])
    return [out, compute(x.shape, lambda *i: const(True, "bool"), "dyn_dropout_mask")]


define(
    "dyn.nn.dropout", 3, _dropout_rel, _dropout_kernel, OpPattern.OPAQUE,
    shape_logic=sl.traceable(lambda op, attrs, shapes, err: [tuple(shapes[0]), tuple(shapes[0])]),
    compute=_dropout_compute,
    doc="dyn.nn.dropout(data, rate, training) -> (output, bool mask): nn.dropout with the rate and the "
        "training flag run-time scalars; the identity and a mask of ones unless training with a nonzero "
        "rate, which draws random masks and is an error (tensorvm does not implement it).",
)
