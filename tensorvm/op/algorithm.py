"""Sorting and searching: argwhere, topk, sort, argsort, cumsum, cumprod, unique, searchsorted.

Sorting is stable: equal elements keep their order, in ascending and descending order alike, and
NaN counts as larger than every number. ``argwhere`` and ``unique`` have data-dependent output
shapes (their shape functions read the data); so does ``topk`` when ``k`` comes as a second,
run-time argument. ``unique`` returns exact-size outputs (not Relay's upper-bound buffers plus a
count): ``(values, indices, inverse_indices[, counts])``, where ``indices`` are the first
occurrences and ``values[inverse_indices]`` rebuilds the input.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import AttrError, ExecutionError, ShapeError, TypeInferenceError
from ..ir.types import Any, TensorType, TupleType, normalize_dtype
from ._common import (
    ALL_DTYPES,
    INT_DTYPES,
    check_kernel_dtype,
    expect_dtype,
    expect_scalar,
    expect_tensor,
    normalize_axis,
    one_of,
    register_checked,
    to_bool,
    to_dtype,
    to_int,
    to_int_dtype,
)
from ._library import axis_split, dtype_code, product, same_dims
from .registry import AttrDef, LibraryKernel, OpDef, OpPattern
from .shape_logic import Sym, count_nonzero, count_sorted_runs, dim_or, dim_select, is_sym, require, traceable

# ---- argwhere -------------------------------------------------------------------------------------


def _argwhere_rel(types, attrs, consts=None):
    condition = expect_tensor("argwhere", types[0], "condition")
    return TensorType((Any(), condition.ndim), "int32")


def _argwhere_arguments(attrs, inputs, outputs):
    (condition,), (out,) = inputs, outputs
    rank = len(condition.shape)
    return [condition, dtype_code(condition.dtype), rank, tuple(condition.shape), out.shape[0], out], []


@traceable
def _argwhere_logic(op, attrs, args, err):
    """One row per nonzero element: counted in one pass (``tv_shape_count_nonzero`` in C)."""
    (condition,) = args
    count = count_nonzero(condition)
    if is_sym(count):  # (the C count is -1 for a dtype it does not handle)
        require(count >= 0, f"argwhere: cannot count the nonzero elements of {condition.dtype} data", err)
    return (count, len(condition.shape))


# The shape function counts the nonzero elements (one cheap pass); the kernel writes their coordinates
# and checks that it found as many.
register_checked(OpDef(
    name="argwhere", num_inputs=1, type_rel=_argwhere_rel,
    kernel=lambda attrs, condition: np.argwhere(condition).astype("int32"), pattern=OpPattern.OPAQUE,
    shape_logic=_argwhere_logic, shape_func_data_dependent=True,
    library=LibraryKernel("tv_argwhere", "algorithm.c", _argwhere_arguments),
    doc="The coordinates (int32, one row each, row-major order) of the nonzero elements.",
))

# ---- stable sorting -------------------------------------------------------------------------------


def sorted_indices(data: np.ndarray, axis: int, ascending: bool) -> np.ndarray:
    """Indices that sort ``data`` along ``axis``, stably in either direction."""
    if ascending:
        return np.argsort(data, axis=axis, kind="stable")
    # Sort the reversed data ascending (stable), then reverse: equal elements keep their order.
    reversed_order = np.argsort(np.flip(data, axis), axis=axis, kind="stable")
    return data.shape[axis] - 1 - np.flip(reversed_order, axis)


def _sort_type(name: str, types) -> TensorType:
    data = expect_tensor(name, types[0], "data")
    if data.ndim == 0:
        raise TypeInferenceError(f"{name}: data must have rank >= 1, got a scalar")
    return data


def _kernel_axis(name: str, data: np.ndarray, axis: int) -> int:
    if data.ndim == 0:
        raise ShapeError(f"{name}: data must have rank >= 1, got a scalar")
    return normalize_axis(name, axis, data.ndim, ShapeError)


def _sort_rel(types, attrs, consts=None):
    data = _sort_type("sort", types)
    normalize_axis("sort", attrs.axis, data.ndim)
    return data


def _argsort_rel(types, attrs, consts=None):
    data = _sort_type("argsort", types)
    normalize_axis("argsort", attrs.axis, data.ndim)
    return TensorType(data.shape, attrs.dtype)


def _sort_kernel(attrs, data):
    axis = _kernel_axis("sort", data, attrs.axis)
    return np.take_along_axis(data, sorted_indices(data, axis, attrs.is_ascend), axis)


def _argsort_kernel(attrs, data):
    axis = _kernel_axis("argsort", data, attrs.axis)
    return sorted_indices(data, axis, attrs.is_ascend).astype(attrs.dtype)


@traceable
def _sort_logic(op, attrs, shapes, err):
    """sort and argsort: the data's shape (of rank >= 1, with ``axis`` in range)."""
    shape = tuple(shapes[0])
    if not shape:
        raise err(f"{op}: data must have rank >= 1, got a scalar")
    normalize_axis(op, attrs.axis, len(shape), err)
    return shape


def _lines(name: str, attrs, data, outputs, k) -> tuple[list, list]:
    """The leading arguments of ``tv_sort``/``tv_argsort``/``tv_topk`` (codegen/lib/algorithm.c) and the
    entry checks of the outputs' dims: the data's, ``k`` along the axis."""
    axis = attrs.axis % len(data.shape)
    outer, n, inner = axis_split(data.shape, axis)
    requires = [(k <= n, f"{name}: k must not exceed the size of axis {axis}")]
    for out in outputs:
        expected = data.shape[:axis] + (k,) + data.shape[axis + 1:]
        requires += same_dims(name, out.shape, expected, f"output {out.name}")
    return [data, dtype_code(data.dtype), outer, n, inner, k, attrs.is_ascend], requires


def _sort_arguments(attrs, inputs, outputs):
    (data,), (out,) = inputs, outputs
    args, requires = _lines("sort", attrs, data, outputs, data.shape[attrs.axis % len(data.shape)])
    return args + [out], requires


def _argsort_arguments(attrs, inputs, outputs):
    (data,), (out,) = inputs, outputs
    args, requires = _lines("argsort", attrs, data, outputs, data.shape[attrs.axis % len(data.shape)])
    return args + [out, dtype_code(out.dtype)], requires


def _index_dtype(value) -> str:
    """The dtype of returned indices: an integer, or a float as Relay allows (``argsort(x, dtype="float32")``)."""
    dtype = normalize_dtype(value)
    if np.dtype(dtype).kind not in "iuf":
        raise ValueError(f"expected an integer or float dtype, got {dtype}")
    return dtype


def _float_indices_legalize(attrs, args):
    """argsort/topk with float indices: the op with int64 indices, then a cast (the C kernels write integers)."""
    from ..ir.attrs import Attrs
    from ..ir.expr import Call, Op, Tuple, TupleGetItem

    name = "topk" if "ret_type" in attrs else "argsort"
    if np.dtype(attrs.dtype).kind != "f":
        return Call(Op(name), tuple(args), Attrs(attrs))
    call = Call(Op(name), tuple(args), Attrs({**attrs, "dtype": "int64"}))
    cast = lambda e: Call(Op("cast"), (e,), Attrs({"dtype": attrs.dtype}))  # noqa: E731
    if name == "argsort" or attrs.ret_type == "indices":
        return cast(call)
    if attrs.ret_type == "values":
        return call
    return Tuple((TupleGetItem(call, 0), cast(TupleGetItem(call, 1))))


SORT_ATTRS = (AttrDef("axis", -1, to_int), AttrDef("is_ascend", True, to_bool))
register_checked(OpDef(
    name="sort", num_inputs=1, type_rel=_sort_rel, kernel=_sort_kernel, pattern=OpPattern.OPAQUE,
    attrs=SORT_ATTRS, shape_logic=_sort_logic, doc="Stable sort along an axis.",
    library=LibraryKernel("tv_sort", "algorithm.c", _sort_arguments),
))
register_checked(OpDef(
    name="argsort", num_inputs=1, type_rel=_argsort_rel, kernel=_argsort_kernel, pattern=OpPattern.OPAQUE,
    attrs=SORT_ATTRS + (AttrDef("dtype", "int32", _index_dtype),), shape_logic=_sort_logic,
    legalize=_float_indices_legalize, doc="The indices of a stable sort along an axis.",
    library=LibraryKernel("tv_argsort", "algorithm.c", _argsort_arguments),
))

# ---- topk -----------------------------------------------------------------------------------------


def _topk_k(attrs, args_count: int, k_value, error: type):
    """k from the attribute or from the run-time argument; k < 1 means the whole axis (Relay)."""
    if args_count == 2:
        if attrs.k is not None:
            raise AttrError("topk: k is given both as an attribute and as an argument")
        if k_value is None:
            return None
        k_value = np.asarray(k_value)
        if k_value.ndim != 0 or k_value.dtype.kind not in "iu":
            raise error(f"topk: the k argument must be an integer scalar, got {k_value.dtype} {k_value.shape}")
        return int(k_value)
    return 1 if attrs.k is None else attrs.k


def _topk_types(data: TensorType, axis: int, k, attrs):
    dim = data.shape[axis]
    if k is None:
        dim = Any()
    elif k >= 1:
        if isinstance(dim, int) and k > dim:
            raise TypeInferenceError(f"topk: k={k} exceeds the size {dim} of axis {axis}")
        dim = k
    shape = data.shape[:axis] + (dim,) + data.shape[axis + 1:]
    values, indices = TensorType(shape, data.dtype), TensorType(shape, attrs.dtype)
    return {"both": TupleType((values, indices)), "values": values, "indices": indices}[attrs.ret_type]


def _topk_rel(types, attrs, consts=None):
    if len(types) not in (1, 2):
        raise TypeInferenceError(f"topk: expected 1 or 2 arguments (data[, k]), got {len(types)}")
    data = _sort_type("topk", types)
    axis = normalize_axis("topk", attrs.axis, data.ndim)
    if len(types) == 2:
        k_type = expect_scalar("topk", types[1], "k")
        expect_dtype("topk", k_type, INT_DTYPES, "k")
    k_const = consts[1] if consts is not None and len(types) == 2 and len(consts) > 1 else None
    k = _topk_k(attrs, len(types), k_const, TypeInferenceError)
    return _topk_types(data, axis, k, attrs)


def _topk_extent(shape: tuple, axis: int, k: int) -> int:
    if k < 1:
        return shape[axis]
    if k > shape[axis]:
        raise ShapeError(f"topk: k={k} exceeds the size {shape[axis]} of axis {axis} in shape {shape}")
    return k


@traceable
def _topk_logic(op, attrs, args, err):
    """The extent along the axis is k (k < 1: the whole axis); a run-time k is read from its tensor."""
    if len(args) not in (1, 2):
        raise err(f"topk: expected 1 or 2 arguments (data[, k]), got {len(args)}")
    shape = tuple(args[0])
    if not shape:
        raise err("topk: data must have rank >= 1, got a scalar")
    axis = normalize_axis("topk", attrs.axis, len(shape), err)
    if len(args) == 2:
        if attrs.k is not None:
            raise AttrError("topk: k is given both as an attribute and as an argument")
        k_arg = args[1]
        if len(k_arg.shape) != 0 or k_arg.dtype not in INT_DTYPES:
            raise err(f"topk: the k argument must be an integer scalar, got {k_arg.dtype} {k_arg.shape}")
        k = k_arg.item()
    else:
        k = 1 if attrs.k is None else attrs.k
    dim = shape[axis]
    require(dim_or(k < 1, k <= dim), f"topk: k={k} exceeds the size {dim} of axis {axis} in shape {shape}", err)
    out = shape[:axis] + (dim_select(k < 1, dim, k),) + shape[axis + 1:]
    return [out, out] if attrs.ret_type == "both" else out


def _topk_kernel(attrs, data, k=None):
    axis = _kernel_axis("topk", data, attrs.axis)
    k = _topk_k(attrs, 1 if k is None else 2, k, ShapeError)
    extent = _topk_extent(data.shape, axis, k)
    indices = np.take(sorted_indices(data, axis, attrs.is_ascend), np.arange(extent), axis=axis)
    values = np.take_along_axis(data, indices, axis)
    indices = indices.astype(attrs.dtype)
    return {"both": (values, indices), "values": values, "indices": indices}[attrs.ret_type]


def _topk_arguments(attrs, inputs, outputs):
    # k is the outputs' extent along the axis: the attribute, or the run-time k the shape function read
    data = inputs[0]
    args, requires = _lines("topk", attrs, data, outputs, outputs[0].shape[attrs.axis % len(data.shape)])
    if attrs.ret_type == "both":
        return [*args, outputs[0], outputs[1], dtype_code(outputs[1].dtype)], requires
    if attrs.ret_type == "values":
        return [*args, outputs[0]], requires
    return [*args, outputs[0], dtype_code(outputs[0].dtype)], requires


def _topk_function(attrs) -> str:
    return {"both": "tv_topk", "values": "tv_sort", "indices": "tv_argsort"}[attrs.ret_type]


register_checked(OpDef(
    name="topk", num_inputs=-1, type_rel=_topk_rel, kernel=_topk_kernel, pattern=OpPattern.OPAQUE,
    attrs=(
        AttrDef("k", None, to_int, "how many (k < 1: all); or pass k as a second, scalar argument"),
        AttrDef("axis", -1, to_int),
        AttrDef("ret_type", "both", one_of("both", "values", "indices")),
        AttrDef("is_ascend", False, to_bool),
        AttrDef("dtype", "int32", _index_dtype),
    ),
    shape_logic=_topk_logic, shape_func_data_dependent=(False, True), legalize=_float_indices_legalize,
    library=LibraryKernel(_topk_function, "algorithm.c", _topk_arguments),
    doc="topk(data[, k]): the k largest (or smallest) elements along an axis and/or their indices.",
))

# ---- cumsum, cumprod ------------------------------------------------------------------------------


def _scan(name: str, ufunc, identity):
    def out_dtype(attrs, data_dtype: str) -> str:
        dtype = attrs.dtype or data_dtype
        if dtype == "bool":
            raise AttrError(f"{name}: cannot accumulate in bool; pass dtype=\"int32\" or another numeric dtype")
        return dtype

    def out_shape(shape: tuple, axis, error):
        if axis is None:  # Relay flattens the input first
            if any(is_sym(d) for d in shape):
                return (math.prod(shape, start=1),)
            return (math.prod(shape) if all(isinstance(d, (int, np.integer)) for d in shape) else Any(),)
        normalize_axes_scan(name, axis, len(shape), error)
        return tuple(shape)

    @traceable
    def logic(op, attrs, shapes, err):
        return out_shape(tuple(shapes[0]), attrs.axis, err)

    def rel(types, attrs, consts=None):
        data = expect_tensor(name, types[0], "data")
        return TensorType(out_shape(data.shape, attrs.axis, TypeInferenceError), out_dtype(attrs, data.dtype))

    def kernel(attrs, data):
        dtype = out_dtype(attrs, data.dtype.name)
        out_shape(data.shape, attrs.axis, ShapeError)
        if attrs.axis is None:
            data, axis = data.reshape(-1), 0
        else:
            axis = attrs.axis % data.ndim
        with np.errstate(all="ignore"):
            result = ufunc.accumulate(data.astype(dtype, copy=False), axis=axis, dtype=dtype)
        if attrs.exclusive and result.shape[axis]:
            # Shift by one along the axis; the first element becomes the identity.
            shifted = np.empty_like(result)
            head = [slice(None)] * result.ndim
            head[axis] = slice(0, 1)
            shifted[tuple(head)] = identity
            head[axis] = slice(1, None)
            tail = [slice(None)] * result.ndim
            tail[axis] = slice(0, -1)
            shifted[tuple(head)] = result[tuple(tail)]
            result = shifted
        return result

    def arguments(attrs, inputs, outputs):
        (data,), (out,) = inputs, outputs
        if attrs.axis is None:
            outer, n, inner = 1, product(data.shape), 1
            requires = same_dims(name, out.shape, (n,), "the output's")
        else:
            outer, n, inner = axis_split(data.shape, attrs.axis % len(data.shape))
            requires = same_dims(name, out.shape, data.shape, "the output's")
        return [data, dtype_code(data.dtype), out, dtype_code(out.dtype), outer, n, inner, ufunc is np.multiply,
                attrs.exclusive], requires

    register_checked(OpDef(
        name=name, num_inputs=1, type_rel=rel, kernel=kernel, pattern=OpPattern.OPAQUE,
        library=LibraryKernel("tv_scan", "algorithm.c", arguments),
        attrs=(
            AttrDef("axis", None, to_int, "None: over the flattened input"),
            AttrDef("dtype", None, to_dtype, "default: the input's dtype"),
            AttrDef("exclusive", False, to_bool, "leave out each element itself"),
        ),
        shape_logic=logic,
        doc=f"Running {name[3:]} along an axis (inclusive unless exclusive).",
    ))


def normalize_axes_scan(name: str, axis: int, ndim: int, error: type):
    if ndim == 0 or not -ndim <= axis < ndim:
        raise error(f"{name}: axis {axis} is out of range for rank {ndim}")


_scan("cumsum", np.add, 0)
_scan("cumprod", np.multiply, 1)

# ---- unique ---------------------------------------------------------------------------------------


def _unique_type(name: str, data: TensorType, attrs) -> TupleType:
    if data.ndim != 1:
        raise TypeInferenceError(f"{name}: data must be 1-D, got rank {data.ndim}")
    count = TensorType((Any(),), "int32")
    fields = [TensorType((Any(),), data.dtype), count, TensorType(data.shape, "int32")]
    return TupleType(fields + [count] if attrs.return_counts else fields)


def _unique_rel(types, attrs, consts=None):
    return _unique_type("unique", expect_tensor("unique", types[0], "data"), attrs)


def _unique_shape_func(attrs, args):
    data = np.asarray(args[0])
    if data.ndim != 1:
        raise ShapeError(f"unique: data must be 1-D, got shape {data.shape}")
    n = len(np.unique(data))
    return [(n,), (n,), data.shape] + ([(n,)] if attrs.return_counts else [])


def _unique_kernel(attrs, data):
    if data.ndim != 1:
        raise ShapeError(f"unique: data must be 1-D, got shape {data.shape}")
    _, first, inverse, counts = np.unique(data, return_index=True, return_inverse=True, return_counts=True)
    return _unique_outputs(attrs, data, first, counts, inverse.reshape(-1))


def _unique_outputs(attrs, data, first, counts, inverse) -> tuple:
    """unique's results from the groups of equal values in ascending order: each one's first position
    and size, and each element's group."""
    if not attrs.is_sorted:
        # Order of first appearance: renumber the groups by where they first occur.
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        first, counts, inverse = first[order], counts[order], rank[inverse]
    outputs = (data[first], first.astype("int32"), inverse.astype("int32"))
    return outputs + (counts.astype("int32"),) if attrs.return_counts else outputs


def _unique_legalize(attrs, args):
    """unique(x) -> sorted_unique(x, argsort(x)): the sort runs once, as a kernel of its own; the shape
    function of ``sorted_unique`` then counts the groups in one pass and its kernel fills the outputs."""
    from ..ir.attrs import Attrs
    from ..ir.expr import Call, Op

    order = Call(Op("argsort"), (args[0],), Attrs({"axis": 0, "dtype": "int64"}))
    return Call(Op("sorted_unique"), (args[0], order), Attrs(attrs))


UNIQUE_ATTRS = (AttrDef("is_sorted", True, to_bool, "ascending values; else in order of first appearance"),
                AttrDef("return_counts", False, to_bool))
register_checked(OpDef(
    name="unique", num_inputs=1, type_rel=_unique_rel, kernel=_unique_kernel, pattern=OpPattern.OPAQUE,
    attrs=UNIQUE_ATTRS, shape_func=_unique_shape_func, shape_func_data_dependent=True, legalize=_unique_legalize,
    doc="unique(data): (values, first indices, inverse indices[, counts]) of a 1-D tensor.",
))


def _sorted_unique_rel(types, attrs, consts=None):
    data = expect_tensor("sorted_unique", types[0], "data")
    order = expect_tensor("sorted_unique", types[1], "order")
    expect_dtype("sorted_unique", order, INT_DTYPES, "order")
    result = _unique_type("sorted_unique", data, attrs)  # (data is 1-D)
    length, n = (order.shape[0] if order.ndim == 1 else None), data.shape[0]
    if length is None or isinstance(length, int) and isinstance(n, int) and length != n:
        raise TypeInferenceError(f"sorted_unique: order must be 1-D with data's length, got {order!r} for {data!r}")
    return result


def _sorted_groups(data: np.ndarray, order: np.ndarray, error: type):
    """The sorted data and where its groups of equal values start (NaN equals NaN), checking that
    ``order`` is an ascending order of ``data`` (one pass)."""
    if data.ndim != 1 or order.shape != data.shape or order.dtype.kind not in "iu":
        raise error(f"sorted_unique: expected 1-D data and an integer order of its length, got {data.dtype} "
                    f"{data.shape} and {order.dtype} {order.shape}")
    if order.size and (order.min() < 0 or order.max() >= data.size):
        raise error(f"sorted_unique: order holds a position outside [0, {data.size})")
    ordered = data[order]
    same = ordered[1:] == ordered[:-1]
    if ordered.dtype.kind == "f":
        same |= np.isnan(ordered[1:]) & np.isnan(ordered[:-1])
    with np.errstate(invalid="ignore"):
        descending = ordered[1:] < ordered[:-1]
    if ordered.dtype.kind == "f":
        descending |= np.isnan(ordered[:-1]) & ~np.isnan(ordered[1:])
    if descending.any():
        raise error("sorted_unique: order does not sort data ascending")
    starts = np.ones(data.shape, bool)
    starts[1:] = ~same
    return starts


@traceable
def _sorted_unique_logic(op, attrs, args, err):
    """The number of groups of equal values, counted in one pass over the data in ``order`` (which is
    checked to sort it); ``tv_shape_count_sorted_runs`` in C. The sort itself is argsort's kernel."""
    data, order = args
    if len(data.shape) != 1 or len(order.shape) != 1 or order.dtype not in INT_DTYPES:
        raise err(f"sorted_unique: expected 1-D data and an integer order of its length, got {data.dtype} "
                  f"{data.shape} and {order.dtype} {order.shape}")
    require(order.shape[0] == data.shape[0], f"sorted_unique: expected 1-D data and an integer order of its "
                                             f"length, got {data.dtype} {data.shape} and {order.dtype} {order.shape}",
            err)
    if data.values is not None and order.values is not None:
        n = int(np.count_nonzero(_sorted_groups(data.values, order.values, err)))
    else:
        n = count_sorted_runs(data, order)
        require(n >= 0, "sorted_unique: order holds a position outside the data or does not sort it ascending", err)
    return [(n,), (n,), data.shape] + ([(n,)] if attrs.return_counts else [])


def _sorted_unique_kernel(attrs, data, order):
    starts = _sorted_groups(data, order, ExecutionError)
    first = order[starts].astype(np.int64)  # (a stable order: the first of a group comes first)
    counts = np.diff(np.append(np.flatnonzero(starts), data.size))
    inverse = np.empty(data.shape, np.int64)
    inverse[order] = np.cumsum(starts) - 1
    return _unique_outputs(attrs, data, first, counts, inverse)


def _sorted_unique_arguments(attrs, inputs, outputs):
    (data, order), values = inputs, outputs[0]
    n = data.shape[0]
    requires = same_dims("sorted_unique", order.shape, data.shape, "order's")
    requires += same_dims("sorted_unique", outputs[2].shape, data.shape, "inverse's")
    requires += [r for out in outputs[1::2] for r in same_dims("sorted_unique", out.shape, values.shape, out.name)]
    return [data, dtype_code(data.dtype), order, dtype_code(order.dtype), n, values.shape[0], not attrs.is_sorted,
            *outputs], requires


register_checked(OpDef(
    name="sorted_unique", num_inputs=2, type_rel=_sorted_unique_rel, kernel=_sorted_unique_kernel,
    pattern=OpPattern.OPAQUE, attrs=UNIQUE_ATTRS, shape_logic=_sorted_unique_logic, shape_func_data_dependent=True,
    library=LibraryKernel(lambda attrs: "tv_unique_counts" if attrs.return_counts else "tv_unique", "algorithm.c",
                          _sorted_unique_arguments),
    doc="sorted_unique(data, order): unique's results given ``order``, the stable ascending order of data "
        "(argsort); what ``unique`` becomes for the VM (Legalize), so that the data is sorted once.",
))

# ---- searchsorted ---------------------------------------------------------------------------------


def _searchsorted_check(seq_shape: tuple, values_shape: tuple, error: type):
    if len(seq_shape) == 0:
        raise error("searchsorted: sorted_sequence must have rank >= 1, got a scalar")
    if len(seq_shape) == 1:
        return
    message = (f"searchsorted: a {len(seq_shape)}-D sorted_sequence {tuple(seq_shape)} needs values with the same "
               f"leading dimensions, got {tuple(values_shape)}")
    if len(values_shape) != len(seq_shape):
        raise error(message)
    for s, v in zip(seq_shape[:-1], values_shape[:-1], strict=True):
        if isinstance(s, (int, Sym)) and isinstance(v, (int, Sym)):  # (known or traced dims; unknown ones pass)
            require(s == v, message, error)


def _searchsorted_rel(types, attrs, consts=None):
    seq = expect_tensor("searchsorted", types[0], "sorted_sequence")
    values = expect_tensor("searchsorted", types[1], "values")
    expect_dtype("searchsorted", seq, ALL_DTYPES, "sorted_sequence")
    if seq.dtype != values.dtype:
        raise TypeInferenceError(
            f"searchsorted: sorted_sequence and values must have one dtype, got {seq.dtype} and {values.dtype}")
    _searchsorted_check(seq.shape, values.shape, TypeInferenceError)
    return TensorType(values.shape, attrs.dtype)


def _searchsorted_kernel(attrs, seq, values):
    check_kernel_dtype("searchsorted", (seq, values))
    _searchsorted_check(seq.shape, values.shape, ShapeError)
    side = "right" if attrs.right else "left"
    if seq.ndim == 1:
        return np.searchsorted(seq, values, side=side).astype(attrs.dtype)
    rows = math.prod(seq.shape[:-1])
    rows_seq = seq.reshape(rows, seq.shape[-1])
    rows_values = values.reshape(rows, values.shape[-1])
    out = np.empty(rows_values.shape, dtype=attrs.dtype)
    for i in range(rows_seq.shape[0]):
        out[i] = np.searchsorted(rows_seq[i], rows_values[i], side=side)
    return out.reshape(values.shape)


@traceable
def _searchsorted_logic(op, attrs, shapes, err):
    _searchsorted_check(tuple(shapes[0]), tuple(shapes[1]), err)
    return tuple(shapes[1])


def _searchsorted_arguments(attrs, inputs, outputs):
    (seq, values), (out,) = inputs, outputs
    requires = same_dims("searchsorted", out.shape, values.shape, "the output's")
    if len(seq.shape) == 1:  # one sequence for every value
        rows, n, m, seq_step = 1, seq.shape[0], product(values.shape), 0
    else:
        rows, n, m = product(seq.shape[:-1]), seq.shape[-1], values.shape[-1]
        seq_step = n
        requires += same_dims("searchsorted", values.shape[:-1], seq.shape[:-1], "values' leading")
    return [seq, values, dtype_code(seq.dtype), rows, n, m, seq_step, attrs.right, out, dtype_code(out.dtype)], \
        requires


register_checked(OpDef(
    name="searchsorted", num_inputs=2, type_rel=_searchsorted_rel, kernel=_searchsorted_kernel,
    pattern=OpPattern.OPAQUE,
    attrs=(AttrDef("right", False, to_bool, "return the last suitable index instead of the first"),
           AttrDef("dtype", "int32", to_int_dtype)),
    shape_logic=_searchsorted_logic,
    library=LibraryKernel("tv_searchsorted", "algorithm.c", _searchsorted_arguments),
    doc="searchsorted(sorted_sequence, values): insertion indices keeping each innermost row sorted.",
))
