"""Converters of ONNX shape and data-movement ops.

Where the shape-deciding input (a new shape, axes, pads, repeats, slice bounds) is known at import
time the static op is used (``reshape``, ``squeeze``, ``strided_slice``, ...); otherwise the
run-time version (``dyn.reshape``, ``dyn.strided_slice``, ...) whose shape function reads the value. Small
integer tensors built by ``Shape``/``Gather``/``Concat``/``Unsqueeze``/``Slice``/``Cast`` keep their
element-wise tracking (``ctx.shape_entries``) so export-style shape arithmetic folds away.
"""

from __future__ import annotations

import numpy as np

from ..errors import ModelImportError, TypeInferenceError, UnsupportedError
from .onnx_context import DimOf, converter

INT64_MAX = np.iinfo(np.int64).max


def _entries_1d(ctx, x):
    """The tracked elements of a 1-d (or 0-d) int tensor, else None."""
    if ctx.ndim(x) > 1:
        return None
    return ctx.shape_entries(x)


def _track(ctx, node, entries):
    return node if entries is None else ctx.with_entries(node, entries)


def _int64(ctx, x):
    return ctx.cast(x, "int64")


# A run-time shape operand has one element per dim of the result; NumPy allows at most 64 dims.
MAX_RANK = 64


def _run_time_shape(ctx, shape, op: str):
    """A run-time shape operand as int64, its static length checked first (the type relation builds a
    dim per element: a declared length of 2**31 would take the importer's memory)."""
    dims = ctx.shape(shape)
    if len(dims) == 1 and isinstance(dims[0], int) and dims[0] > MAX_RANK:
        raise ModelImportError(f"{op}: expected a shape input of at most {MAX_RANK} elements, got one of {dims[0]}")
    return _int64(ctx, shape)


def _empty_i64(ctx):
    return ctx.constant(np.zeros((0,), np.int64))


# ---- Shape, Size ------------------------------------------------------------------------------------


@converter("Shape", 1)
def shape_1(ctx, data):
    return ctx.shape_of(data)


@converter("Shape", 15)
def shape_15(ctx, data, *, start=0, end=None):
    ndim = ctx.ndim(data)
    begin = min(max(start + ndim if start < 0 else start, 0), ndim)
    stop = ndim if end is None else min(max(end + ndim if end < 0 else end, 0), ndim)
    full = ctx.shape_of(data)
    if begin == 0 and stop == ndim:
        return full
    entries = ctx.shape_entries(full)
    sliced = ctx.call("strided_slice", full, begin=(begin,), end=(max(stop, begin),), strides=(1,))
    return _track(ctx, sliced, entries[begin:max(stop, begin)] if entries is not None else None)


@converter("Size", 1)
def size_1(ctx, data):
    shape = ctx.shape(data)
    if all(isinstance(d, int) for d in shape):
        return ctx.constant(np.array(int(np.prod(shape, dtype=np.int64)), np.int64))
    return ctx.call("ndarray_size", data, dtype="int64")


# ---- Reshape, Flatten, Squeeze, Unsqueeze, Transpose ---------------------------------------------


def reshape_to(ctx, data, shape, allowzero=False):
    """Reshape ``data`` to the ONNX shape tensor ``shape`` (0 copies a dim unless allowzero, -1 infers)."""
    entries = _entries_1d(ctx, shape)
    if entries is not None:
        newshape = []
        for i, e in enumerate(entries):
            if isinstance(e, int):
                if e == 0 and not allowzero and i >= ctx.ndim(data):
                    raise TypeInferenceError(f"Reshape: 0 at position {i} copies a dim the input (rank "
                                             f"{ctx.ndim(data)}) does not have")
                newshape.append(e)
            elif isinstance(e, DimOf) and e.tensor is data and e.axis == i and not allowzero:
                newshape.append(0)
            else:
                newshape.append(None)
        unknown = newshape.count(None)
        if unknown == 1 and -1 not in newshape:
            newshape[newshape.index(None)] = -1
            unknown = 0
        if unknown == 0:
            return ctx.call("reshape", data, newshape=tuple(newshape), allowzero=bool(allowzero))
    return ctx.call("dyn.reshape", data, _run_time_shape(ctx, shape, "Reshape"), allowzero=bool(allowzero))


@converter("Reshape", 1)
def reshape_1(ctx, data, *, shape=None, consumed_inputs=None):
    if shape is None:
        raise UnsupportedError("Reshape-1 needs the shape attribute")
    return reshape_to(ctx, data, ctx.constant(np.array(shape, np.int64)))


@converter("Reshape", 5)
def reshape_5(ctx, data, shape, *, allowzero=0):
    return reshape_to(ctx, data, shape, allowzero)


@converter("Flatten", 1)
def flatten_1(ctx, input, *, axis=1):  # noqa: A002
    x = input
    ndim = ctx.ndim(x)
    axis = axis + ndim if axis < 0 else axis
    if not 0 <= axis <= ndim:
        raise TypeInferenceError(f"Flatten: axis {axis} is out of range for rank {ndim}")
    # The output dims are the products of the leading and of the trailing dims. A -1 stands for one of them
    # only when the other is a known nonzero product: with zero elements -1 is undetermined.
    shape = ctx.shape(x)
    lead, trail = (int(np.prod(dims, dtype=np.int64)) if all(isinstance(d, int) for d in dims) else None
                   for dims in (shape[:axis], shape[axis:]))
    if lead is not None and trail is not None:
        return ctx.call("reshape", x, newshape=(lead, trail), allowzero=True)
    if trail:
        return ctx.call("reshape", x, newshape=(-1, trail))
    if lead:
        return ctx.call("reshape", x, newshape=(lead, -1))
    dims = ctx.shape_of(x)
    products = [ctx.call("prod", ctx.call("strided_slice", dims, begin=(begin,), end=(end,)), axis=(0,), keepdims=True)
                for begin, end in ((0, axis), (axis, ndim))]
    # (allowzero: a product 0 is a dim, not a copy of the input's)
    return ctx.call("dyn.reshape", x, ctx.call("concatenate", ctx.tuple(products), axis=0), allowzero=True)


def squeeze_axes(ctx, data, axes):
    if axes is None:
        shape = ctx.shape(data)
        if not all(isinstance(d, int) for d in shape):
            raise UnsupportedError("Squeeze without axes needs a static input shape")
        axes = [i for i, d in enumerate(shape) if d == 1]
    ndim = ctx.ndim(data)
    axes = sorted({a + ndim if a < 0 else a for a in axes})
    if not axes:
        return data
    out = ctx.call("squeeze", data, axis=tuple(axes))
    entries = _entries_1d(ctx, data)
    if entries is not None and ndim == 1:
        out = _track(ctx, out, entries)
    return out


@converter("Squeeze", 1)
def squeeze_1(ctx, data, *, axes=None):
    return squeeze_axes(ctx, data, axes)


@converter("Squeeze", 13)
def squeeze_13(ctx, data, axes=None):
    if axes is None:
        return squeeze_axes(ctx, data, None)
    values = ctx.int_list(axes)
    if values is not None:
        return squeeze_axes(ctx, data, values)
    return ctx.call("dyn.squeeze", data, _int64(ctx, axes))


def unsqueeze_axes(ctx, data, axes):
    out_ndim = ctx.ndim(data) + len(axes)
    axes = sorted(a + out_ndim if a < 0 else a for a in axes)
    if len(set(axes)) != len(axes) or any(not 0 <= a < out_ndim for a in axes):
        raise TypeInferenceError(f"Unsqueeze: invalid axes {axes} for output rank {out_ndim}")
    entries = _entries_1d(ctx, data) if ctx.ndim(data) == 0 else None
    out = data
    for a in axes:
        out = ctx.call("expand_dims", out, axis=a)
    return _track(ctx, out, entries)


@converter("Unsqueeze", 1)
def unsqueeze_1(ctx, data, *, axes):
    return unsqueeze_axes(ctx, data, axes)


@converter("Unsqueeze", 13)
def unsqueeze_13(ctx, data, axes):
    values = ctx.int_list(axes)
    if values is not None:
        return unsqueeze_axes(ctx, data, values)
    _require_static_count(ctx, axes, "Unsqueeze", "axes")
    return ctx.call("dyn.unsqueeze", data, _int64(ctx, axes))


def _require_static_count(ctx, value, op_type: str, what: str, why: str = "it decides the output rank"):
    """A run-time 1-d input whose length decides the output rank must have a static length (a type has a
    static rank); so must one whose elements the compute reads one by one."""
    if ctx.ndim(value) > 1 or (ctx.ndim(value) == 1 and not isinstance(ctx.shape(value)[0], int)):
        raise UnsupportedError(f"{op_type}: the run-time input '{what}' must be a 1-d tensor whose length is known "
                               f"at import ({why}), got {ctx.tensor_type(value)!r}")


@converter("Transpose", 1)
def transpose_1(ctx, data, *, perm=None):
    return ctx.call("transpose", data, axes=tuple(perm) if perm is not None else None)


# ---- Concat, Split, Slice, Gather --------------------------------------------------------------------


@converter("Concat", 1)
def concat_1(ctx, *inputs, axis=1):
    return concat_4(ctx, *inputs, axis=axis)


@converter("Concat", 4)
def concat_4(ctx, *inputs, axis):
    if not inputs:
        raise TypeInferenceError("Concat needs at least one input")
    ndim = ctx.ndim(inputs[0])
    tracked = None
    if ndim == 1:
        parts = [_entries_1d(ctx, x) for x in inputs]
        if all(p is not None for p in parts):
            tracked = [e for p in parts for e in p]
    # Empty pieces of a shape vector (e.g. Shape()[0:0]) add nothing.
    nonempty = [x for x in inputs if not (ctx.ndim(x) == 1 and ctx.shape(x)[0] == 0)] or list(inputs[:1])
    out = nonempty[0] if len(nonempty) == 1 else ctx.call("concatenate", ctx.tuple(nonempty), axis=axis)
    return _track(ctx, out, tracked)


def _split_static(ctx, x, axis, sizes):
    bounds = np.cumsum(sizes)[:-1]
    parts = ctx.call("split", x, indices_or_sections=tuple(int(b) for b in bounds), axis=axis)
    return [ctx.get_item(parts, i) for i in range(len(sizes))]


def split_sizes(ctx, x, axis, split, num_outputs):
    """Split ``x`` along ``axis`` into the given sizes (or ``num_outputs`` near-equal parts)."""
    dim = ctx.shape(x)[axis]
    if split is None and isinstance(dim, int):
        chunk = -(-dim // num_outputs)
        split = [min(chunk, max(dim - i * chunk, 0)) for i in range(num_outputs)]
    if split is not None:
        if isinstance(dim, int) and (sum(split) != dim or min(split) < 0):
            raise ModelImportError(f"Split: expected split sizes >= 0 adding up to the axis size {dim}, got {split}")
        if not isinstance(dim, int):  # (dyn.split checks at run time that they add up; its parts keep the sizes)
            parts = ctx.call("dyn.split", x, ctx.constant(np.array(split, np.int64)), axis=axis, num_outputs=len(split))
            return [ctx.get_item(parts, i) for i in range(len(split))]
        if len(split) == 1:
            return [ctx.call("copy", x)]
        return _split_static(ctx, x, axis, split)
    if num_outputs == 1:
        return [ctx.call("copy", x)]
    parts = ctx.call("dyn.split", x, _empty_i64(ctx), axis=axis, num_outputs=num_outputs)
    return [ctx.get_item(parts, i) for i in range(num_outputs)]


@converter("Split", 1)
def split_1(ctx, input, split=None, *, axis=0):  # noqa: A002
    sizes = ctx.require_ints(split, "Split: split") if split is not None else None
    return split_2(ctx, input, axis=axis, split=sizes)


@converter("Split", 2)
def split_2(ctx, input, *, axis=0, split=None):  # noqa: A002
    axis = axis % ctx.ndim(input)
    return split_sizes(ctx, input, axis, list(split) if split else None, ctx.num_outputs)


@converter("Split", 13)
def split_13(ctx, input, split=None, *, axis=0, num_outputs=None):  # noqa: A002
    axis = axis % ctx.ndim(input)
    if num_outputs is not None and num_outputs != ctx.num_outputs:
        raise ModelImportError(f"Split: expected num_outputs to be the node's {ctx.num_outputs} outputs, got "
                               f"{num_outputs}")
    count = ctx.num_outputs
    if split is None:
        return split_sizes(ctx, input, axis, None, count)
    sizes = ctx.int_list(split)
    if sizes is not None:
        return split_sizes(ctx, input, axis, sizes, count)
    parts = ctx.call("dyn.split", input, _int64(ctx, split), axis=axis, num_outputs=count)
    return [ctx.get_item(parts, i) for i in range(count)]


def slice_static(ctx, data, starts, ends, axes, steps):
    ndim = ctx.ndim(data)
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = list(steps) if steps is not None else [1] * len(starts)
    axes = [a + ndim if a < 0 else a for a in axes]
    clamp = lambda v: int(max(min(v, INT64_MAX), -INT64_MAX))  # noqa: E731
    entries = _entries_1d(ctx, data) if ndim == 1 else None
    out = ctx.call("strided_slice", data, begin=tuple(clamp(s) for s in starts), end=tuple(clamp(e) for e in ends),
                   strides=tuple(steps), axes=tuple(axes))
    if entries is not None and axes == [0]:
        entries = entries[slice(starts[0], ends[0], steps[0])]
        return _track(ctx, out, entries)
    return out


@converter("Slice", 1)
def slice_1(ctx, data, *, starts, ends, axes=None):
    return slice_static(ctx, data, starts, ends, axes, None)


@converter("Slice", 10)
def slice_10(ctx, data, starts, ends, axes=None, steps=None):
    known = [ctx.int_list(v) if v is not None else None for v in (starts, ends, axes, steps)]
    if known[0] is not None and known[1] is not None and (axes is None or known[2] is not None) and (
            steps is None or known[3] is not None):
        return slice_static(ctx, data, *known)
    ndim = ctx.ndim(data)
    starts, ends = _int64(ctx, starts), _int64(ctx, ends)
    count = ctx.shape(starts)[0]
    if steps is None:
        if not isinstance(count, int):
            raise UnsupportedError("Slice: run-time starts of unknown length need steps or axes of known length")
        steps = ctx.constant(np.ones(count, np.int64))
    steps = _int64(ctx, steps)
    if axes is None:
        return ctx.call("dyn.strided_slice", data, starts, ends, steps)
    if known[2] is not None:
        return ctx.call("dyn.strided_slice", data, starts, ends, steps,
                        axes=tuple(a + ndim if a < 0 else a for a in known[2]))
    # Run-time axes: scatter starts/ends/steps into full-rank vectors through a one-hot of the axes
    # (the axes ONNX leaves out keep 0 : INT64_MAX : 1).
    axes = _int64(ctx, axes)
    axes = ctx.call("where", ctx.call("less", axes, ctx.constant(np.array(0, np.int64))),
                    ctx.call("add", axes, ctx.constant(np.array(ndim, np.int64))), axes)
    on_off = ctx.constant(np.array(1, np.int64)), ctx.constant(np.array(0, np.int64))
    hot = ctx.call("one_hot", axes, *on_off, depth=ndim, axis=-1, dtype="int64")
    sliced = ctx.call("greater", ctx.call("sum", hot, axis=(0,)), on_off[1])

    def full(values, default):
        picked = ctx.call("sum", ctx.call("multiply", hot, ctx.call("expand_dims", values, axis=1)), axis=(0,))
        return ctx.call("where", sliced, picked, ctx.constant(np.array(default, np.int64)))

    return ctx.call("dyn.strided_slice", data, full(starts, 0), full(ends, INT64_MAX), full(steps, 1))


@converter("Gather", 1)
def gather_1(ctx, data, indices, *, axis=0):
    ndim = ctx.ndim(data)
    axis = axis + ndim if axis < 0 else axis
    idx_values = ctx.value(indices)
    size = ctx.shape(data)[axis] if 0 <= axis < ndim else None
    if isinstance(size, int) and idx_values is not None and idx_values.size:
        low, high = int(idx_values.min()), int(idx_values.max())
        if low < -size or high >= size:  # (ONNX leaves them undefined; the kernel raises at run time)
            raise ModelImportError(f"Gather: expected indices in [{-size}, {size - 1}] (axis {axis} has size "
                                   f"{size}), got {low if low < -size else high}")
    entries = _entries_1d(ctx, data) if ndim == 1 else None
    if entries is not None and idx_values is not None and idx_values.ndim <= 1:
        picked = [entries[int(i)] for i in idx_values.reshape(-1)]
        out = ctx.call("take", data, indices, axis=0, mode="fast")
        return _track(ctx, out, picked)
    return ctx.call("take", data, indices, axis=axis, mode="fast")


@converter("GatherElements", 11)
def gather_elements_11(ctx, data, indices, *, axis=0):
    return ctx.call("gather", data, indices, axis=axis)


def _indices_first(ctx, indices):
    """ONNX puts the index tuple last (..., M); tensorvm's gather_nd/scatter_nd want it first (M, ...)."""
    ndim = ctx.ndim(indices)
    return ctx.call("transpose", indices, axes=(ndim - 1,) + tuple(range(ndim - 1)))


@converter("GatherND", 11)
def gather_nd_11(ctx, data, indices, *, batch_dims=0):
    data_shape = ctx.shape(data)
    idx = _int64(ctx, indices)
    if batch_dims:
        # Negative indices and batch dims: make indices explicit over the batch dims, then plain gather_nd.
        return ctx.call("gather_nd", data, _indices_first(ctx, idx), batch_dims=batch_dims)
    depth = ctx.shape(indices)[-1]
    if isinstance(depth, int) and all(isinstance(d, int) for d in data_shape[:depth]):
        dims = ctx.constant(np.array(data_shape[:depth], np.int64))
        idx = ctx.call("where", ctx.call("less", idx, ctx.constant(np.array(0, np.int64))),
                       ctx.call("add", idx, dims), idx)
    return ctx.call("gather_nd", data, _indices_first(ctx, idx))


_REDUCTION = {"none": "update", "add": "add", "mul": "mul", "max": "max", "min": "min"}


@converter("Scatter", 9)
def scatter_9(ctx, data, indices, updates, *, axis=0):
    return ctx.call("scatter_elements", data, indices, updates, axis=axis)


@converter("ScatterElements", 11)
def scatter_elements_11(ctx, data, indices, updates, *, axis=0, reduction="none"):
    if reduction not in _REDUCTION:
        raise UnsupportedError(f"ScatterElements: reduction {reduction!r}")
    return ctx.call("scatter_elements", data, indices, updates, axis=axis, reduction=_REDUCTION[reduction])


@converter("ScatterND", 11)
def scatter_nd_11(ctx, data, indices, updates, *, reduction="none"):
    if reduction not in _REDUCTION:
        raise UnsupportedError(f"ScatterND: reduction {reduction!r}")
    return ctx.call("scatter_nd", data, _indices_first(ctx, indices), updates, mode=_REDUCTION[reduction])


# ---- Expand, Tile, Pad, Range, ConstantOfShape, OneHot ----------------------------------------------


@converter("Expand", 8)
def expand_8(ctx, input, shape):  # noqa: A002
    x = input
    entries = _entries_1d(ctx, shape)
    x_shape = ctx.shape(x)
    if entries is not None and all(isinstance(e, int) for e in entries):
        ndim = max(len(entries), len(x_shape))
        target = [1] * (ndim - len(entries)) + list(entries)
        padded = [1] * (ndim - len(x_shape)) + list(x_shape)
        out = []
        for t, d in zip(target, padded, strict=True):
            if t == 1:
                out.append(d)
            elif d == 1 or d == t or not isinstance(d, int):
                out.append(t)
            else:
                raise TypeInferenceError(f"Expand: cannot broadcast {tuple(x_shape)} to {tuple(entries)}")
        if all(isinstance(d, int) for d in out):
            return ctx.call("broadcast_to", x, shape=tuple(out))
    # Bidirectional broadcasting with a run-time shape: a where() over a mask of the target shape.
    mask = ctx.call("dyn.broadcast_to", ctx.constant(np.array(True)), _run_time_shape(ctx, shape, "Expand"))
    return ctx.call("where", mask, x, x)


@converter("Tile", 6)
def tile_6(ctx, input, repeats):  # noqa: A002
    reps = ctx.int_list(repeats)
    if reps is not None:
        return ctx.call("tile", input, reps=tuple(reps))
    return ctx.call("dyn.tile", input, _run_time_shape(ctx, repeats, "Tile"))


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def pad_static(ctx, data, pads, mode, value):
    ndim = ctx.ndim(data)
    if mode not in _PAD_MODES:
        raise UnsupportedError(f"Pad: mode {mode!r}")
    if len(pads) != 2 * ndim:
        raise TypeInferenceError(f"Pad: pads has {len(pads)} values for rank {ndim}")
    if mode in ("constant", "edge", "reflect") and min(pads) >= 0:
        width = tuple((pads[i], pads[i + ndim]) for i in range(ndim))
        if mode == "constant":
            return ctx.call("nn.pad", data, value, pad_width=width, pad_mode="constant")
        return ctx.call("nn.pad", data, pad_width=width, pad_mode=mode)
    return ctx.call("dyn.pad", data, ctx.constant(np.array(pads, np.int64)), value, _empty_i64(ctx), mode=mode)


@converter("Pad", 2)
def pad_2(ctx, data, *, pads, mode="constant", value=0.0):
    return pad_static(ctx, data, list(pads), mode, ctx.constant(np.array(value, dtype=ctx.dtype(data))))


@converter("Pad", 1)
def pad_1(ctx, data, *, paddings, mode="constant", value=0.0):
    return pad_2(ctx, data, pads=paddings, mode=mode, value=value)


@converter("Pad", 11)
def pad_11(ctx, data, pads, constant_value=None, axes=None, *, mode="constant"):
    ndim = ctx.ndim(data)
    value = ctx.cast(constant_value, ctx.dtype(data)) if constant_value is not None else \
        ctx.constant(np.array(0, dtype=ctx.dtype(data)))
    if ctx.ndim(value) != 0:
        value = ctx.call("reshape", value, newshape=())
    pad_values = ctx.int_list(pads)
    axis_values = ctx.int_list(axes) if axes is not None else None
    if axes is not None and pad_values is not None and axis_values is not None:
        axis_values = [a + ndim if a < 0 else a for a in axis_values]
        k = len(axis_values)
        full = [0] * (2 * ndim)
        for j, a in enumerate(axis_values):
            full[a], full[a + ndim] = pad_values[j], pad_values[j + k]
        pad_values = full
    elif axes is not None:
        pad_values = None
    if pad_values is not None:
        return pad_static(ctx, data, pad_values, mode, value)
    if mode not in _PAD_MODES:
        raise UnsupportedError(f"Pad: mode {mode!r}")
    if axes is not None:
        _require_static_count(ctx, axes, "Pad", "axes", "dyn.pad reads it element by element")
        _require_static_count(ctx, pads, "Pad", "pads", "dyn.pad reads it element by element")
    axes = _int64(ctx, axes) if axes is not None else _empty_i64(ctx)
    return ctx.call("dyn.pad", data, _int64(ctx, pads), value, axes, mode=mode)


@converter("Range", 11)
def range_11(ctx, start, limit, delta):
    dtype = ctx.dtype(start)
    return ctx.call("arange", *(ctx.cast(_scalar(ctx, v), dtype) for v in (start, limit, delta)), dtype=dtype)


def _scalar(ctx, x):
    return x if ctx.ndim(x) == 0 else ctx.call("reshape", x, newshape=())


@converter("ConstantOfShape", 9)
def constant_of_shape_9(ctx, input, *, value=None):  # noqa: A002
    fill = np.zeros((), np.float32) if value is None else np.asarray(value).reshape(())
    entries = _entries_1d(ctx, input)
    if entries is not None and all(isinstance(e, int) for e in entries) and int(np.prod(entries)) <= (1 << 20):
        return ctx.constant(np.full(entries, fill, dtype=fill.dtype))
    return ctx.call("dyn.broadcast_to", ctx.constant(fill), _run_time_shape(ctx, input, "ConstantOfShape"))


@converter("OneHot", 9)
def one_hot_9(ctx, indices, depth, values, *, axis=-1):
    if ctx.shape(values) != (2,):
        raise TypeInferenceError(f"OneHot: values must be [off_value, on_value], got shape {ctx.shape(values)}")
    off, on = (ctx.call("take", values, ctx.constant(np.array(i, np.int64)), axis=0) for i in (0, 1))
    depth_value = ctx.scalar_value(depth)
    if depth_value is not None:
        if int(depth_value) < 1:
            raise TypeInferenceError(f"OneHot: depth must be >= 1, got {depth_value}")
        depth = ctx.constant(np.array(int(depth_value), np.int64))
    else:
        depth = _int64(ctx, _scalar(ctx, depth))
    # ONNX counts negative indices from depth (and accepts non-integer ones, truncated).
    index = _int64(ctx, indices)
    index = ctx.call("where", ctx.call("less", index, ctx.constant(np.array(0, np.int64))),
                     ctx.call("add", index, depth), index)
    if depth_value is not None:
        return ctx.call("one_hot", index, on, off, depth=int(depth_value), axis=axis)
    return ctx.call("dyn.one_hot", index, on, off, depth, axis=axis)


def run_time_index(ctx, index, count, extra: int = 0):
    """A run-time index (an integer scalar) valid in [-count, count + extra), a negative one counting back
    from ``count`` (an int, or a run-time int64 scalar), as its place in [0, count + extra). One out of that
    range fails at run time with an index error, not wrapped around: a lookup in the ``count + extra``
    places, a place still negative sent past their end."""
    i64 = np.int64
    count = ctx.constant(np.array(count, i64)) if isinstance(count, int) else count
    places = ctx.call("add", count, ctx.constant(np.array(extra, i64))) if extra else count
    zero = ctx.constant(np.array(0, i64))
    index = _int64(ctx, _scalar(ctx, index))
    place = ctx.call("where", ctx.call("less", index, zero), ctx.call("add", index, count), index)
    place = ctx.call("where", ctx.call("less", place, zero), places, place)
    return ctx.call("take", ctx.indices(places), place, axis=0, mode="fast")


def run_time_axis(ctx, axis, rank: int):
    """A run-time axis (an int64 scalar in [-rank, rank)) as 0 .. rank - 1 (``run_time_index``)."""
    return run_time_index(ctx, axis, rank)


def _cumulative(ctx, op: str, x, axis, exclusive, reverse):
    """``op`` (cumsum, cumprod) along a constant axis, reversed before and after for ``reverse``."""
    name = {"cumsum": "CumSum", "cumprod": "CumProd"}[op]
    axis_value = ctx.scalar_value(axis)
    if axis_value is None and op == "cumsum":
        return ctx.call("dyn.cumsum", x, _int64(ctx, _scalar(ctx, axis)), exclusive=bool(exclusive),
                        reverse=bool(reverse))
    if axis_value is None:  # one branch per axis, chosen at run time (the rank is known)
        ndim = ctx.ndim(x)
        chosen = run_time_axis(ctx, axis, ndim)
        out = _cumulative(ctx, op, x, ctx.constant(np.array(ndim - 1, np.int64)), exclusive, reverse)
        for a in range(ndim - 2, -1, -1):
            taken = ctx.call("equal", chosen, ctx.constant(np.array(a, np.int64)))
            out = ctx.if_(taken, _cumulative(ctx, op, x, ctx.constant(np.array(a, np.int64)), exclusive, reverse), out)
        return out
    ndim = ctx.ndim(x)
    axis_value = int(axis_value)
    if not -ndim <= axis_value < ndim:
        raise TypeInferenceError(f"{name}: axis {axis_value} is out of range for rank {ndim}")
    axis_value %= ndim
    data = ctx.call("reverse", x, axis=axis_value) if reverse else x
    out = ctx.call(op, data, axis=axis_value, exclusive=bool(exclusive))
    return ctx.call("reverse", out, axis=axis_value) if reverse else out


@converter("CumSum", 11)
def cumsum_11(ctx, x, axis, *, exclusive=0, reverse=0):
    return _cumulative(ctx, "cumsum", x, axis, exclusive, reverse)


@converter("CumProd", 26)
def cumprod_26(ctx, x, axis, *, exclusive=0, reverse=0):
    return _cumulative(ctx, "cumprod", x, axis, exclusive, reverse)


@converter("Trilu", 14)
def trilu_14(ctx, input, k=None, *, upper=1):  # noqa: A002
    k = _int64(ctx, k) if k is not None else ctx.constant(np.array(0, np.int64))
    return ctx.call("trilu", input, k, upper=bool(upper))


@converter("DepthToSpace", 1)
def depth_to_space_1(ctx, input, *, blocksize, mode="DCR"):  # noqa: A002
    return ctx.call("nn.depth_to_space", input, block_size=blocksize, mode=mode)


@converter("SpaceToDepth", 1)
def space_to_depth_1(ctx, input, *, blocksize, mode="DCR"):  # noqa: A002
    if mode == "DCR":
        return ctx.call("nn.space_to_depth", input, block_size=blocksize)
    n, c, h, w = ctx.shape(input)
    if not all(isinstance(d, int) for d in (c, h, w)):
        raise UnsupportedError("SpaceToDepth in CRD mode needs static C, H and W")
    b = blocksize
    x = ctx.call("reshape", input, newshape=(-1, c, h // b, b, w // b, b))
    x = ctx.call("transpose", x, axes=(0, 1, 3, 5, 2, 4))
    return ctx.call("reshape", x, newshape=(-1, c * b * b, h // b, w // b))


@converter("EyeLike", 9)
def eye_like_9(ctx, input, *, dtype=None, k=0):  # noqa: A002
    from .onnx_context import onnx_dtype

    shape = ctx.shape(input)
    if not all(isinstance(d, int) for d in shape):
        raise UnsupportedError("EyeLike needs a static input shape")
    out_dtype = onnx_dtype(dtype, "EyeLike") if dtype is not None else ctx.dtype(input)
    return ctx.constant(np.eye(shape[0], shape[1], k=k, dtype=out_dtype))


__all__ = ["reshape_to", "reversed_within", "run_time_axis", "run_time_index", "split_sizes", "slice_static", "squeeze_axes", "unsqueeze_axes"]


def reversed_within(ctx, steps, lengths):
    """The index that reverses each sequence within its length: ``lengths - 1 - t`` for the steps t below
    the length, else t (``steps`` and ``lengths``, int64, broadcast against each other)."""
    last = ctx.call("subtract", lengths, ctx.constant(np.array(1, np.int64)))
    return ctx.call("where", ctx.call("less", steps, lengths), ctx.call("subtract", last, steps), steps)


@converter("ReverseSequence", 10)
def reverse_sequence_10(ctx, input, sequence_lens, *, batch_axis=1, time_axis=0):  # noqa: A002
    """Each batch entry's first sequence_lens[b] steps along time_axis reversed, the rest kept: a gather
    along time_axis at ``reversed_within``'s index."""
    if {batch_axis, time_axis} != {0, 1}:
        raise TypeInferenceError(f"ReverseSequence: batch_axis and time_axis must be 0 and 1, got {batch_axis} and {time_axis}")
    steps = ctx.indices(ctx.dim_value(input, time_axis))
    lengths = _int64(ctx, sequence_lens)
    # (time, batch) grids: steps down the time axis, lengths across the batch axis
    t = ctx.call("expand_dims", steps, axis=1 - time_axis)
    index = reversed_within(ctx, t, ctx.call("expand_dims", lengths, axis=time_axis))
    rank = ctx.ndim(input)
    if rank > 2:
        index = ctx.call("expand_dims", index, axis=2, num_newaxis=rank - 2)
    index = ctx.call("broadcast_to_like", index, input)
    return ctx.call("gather", input, index, axis=time_axis)


def _window(ctx, op: str, size, periodic: int, output_datatype: int, terms: tuple):
    """sum_k terms[k] cos(2 pi k n / N) over n = 0 .. size - 1, N = size (periodic) or size - 1, computed in
    float64 as ONNX's reference does, then cast to ``output_datatype``."""
    from .onnx_context import onnx_dtype

    dtype = onnx_dtype(output_datatype, f"{op} output_datatype")
    f64 = "float64"
    size = _int64(ctx, _scalar(ctx, size))
    count, n = ctx.cast(size, f64), ctx.cast(ctx.indices(size), f64)
    span = count if periodic else ctx.call("subtract", count, ctx.constant(np.array(1, f64)))
    phase = ctx.call("divide", ctx.call("multiply", n, ctx.constant(np.array(2 * np.pi, f64))), span)
    out = ctx.call("full_like", n, ctx.constant(np.array(terms[0], f64)))
    for k, weight in enumerate(terms[1:], start=1):
        wave = ctx.call("cos", ctx.call("multiply", phase, ctx.constant(np.array(float(k), f64))))
        out = ctx.call("add", out, ctx.call("multiply", wave, ctx.constant(np.array(weight, f64))))
    return ctx.cast(out, dtype)


@converter("HannWindow", 17)
def hann_window_17(ctx, size, *, output_datatype=1, periodic=1):
    return _window(ctx, "HannWindow", size, periodic, output_datatype, (0.5, -0.5))


@converter("HammingWindow", 17)
def hamming_window_17(ctx, size, *, output_datatype=1, periodic=1):
    return _window(ctx, "HammingWindow", size, periodic, output_datatype, (25 / 46, -(1 - 25 / 46)))


@converter("BlackmanWindow", 17)
def blackman_window_17(ctx, size, *, output_datatype=1, periodic=1):
    return _window(ctx, "BlackmanWindow", size, periodic, output_datatype, (0.42, -0.5, 0.08))


@converter("CenterCropPad", 18)
def center_crop_pad_18(ctx, input_data, shape, *, axes=None):
    """Each listed axis cropped to the centre (the extra element on the right) or zero padded around it
    (the extra element on the right). Constant sizes over static lengths become static slices and pads;
    otherwise the bounds are computed at run time."""
    sizes = ctx.int_list(shape)
    ndim = ctx.ndim(input_data)
    axes = [a % ndim for a in (axes if axes is not None else range(ndim))]
    if sizes is None or not all(isinstance(ctx.shape(input_data)[a], int) for a in axes):
        return _center_crop_pad_at_run_time(ctx, input_data, shape, axes)
    if len(axes) != len(sizes):
        raise TypeInferenceError(f"CenterCropPad: {len(sizes)} sizes for {len(axes)} axes")
    out = input_data
    for axis, target in zip(axes, sizes):
        length = ctx.shape(out)[axis]  # (static: checked above, and only other axes changed since)
        if target < length:
            begin = (length - target) // 2
            out = ctx.call("strided_slice", out, begin=(begin,), end=(begin + target,), axes=(axis,))
        elif target > length:
            before = (target - length) // 2
            width = [(0, 0)] * ndim
            width[axis] = (before, target - length - before)
            out = ctx.call("nn.pad", out, ctx.constant(np.array(0, ctx.dtype(out))), pad_width=tuple(width))
    return out if out is not input_data else ctx.call("copy", input_data)


def _center_crop_pad_at_run_time(ctx, data, shape, axes: list):
    """CenterCropPad with a run-time target or input length: a Slice then a Pad of run-time bounds."""
    i64 = "int64"
    axes_const = ctx.constant(np.array(axes, i64))
    lengths = ctx.call("take", ctx.shape_of(data, i64), axes_const, axis=0)
    target = _int64(ctx, shape)
    zero, two = ctx.constant(np.array(0, i64)), ctx.constant(np.array(2, i64))
    begin = ctx.call("floor_divide", ctx.call("maximum", ctx.call("subtract", lengths, target), zero), two)
    end = ctx.call("add", begin, ctx.call("minimum", lengths, target))
    cropped = slice_10(ctx, data, begin, end, axes_const)
    total = ctx.call("maximum", ctx.call("subtract", target, lengths), zero)
    before = ctx.call("floor_divide", total, two)
    pads = ctx.call("concatenate", ctx.tuple([before, ctx.call("subtract", total, before)]), axis=0)
    return pad_11(ctx, cropped, pads, None, axes_const)


@converter("TensorScatter", 24)
def tensor_scatter_24(ctx, past_cache, update, write_indices=None, *, mode="linear", axis=-2):
    """present = past_cache with update's entries along ``axis`` written from each batch row's write index
    (modulo the cache's length in ``circular`` mode): a scatter_elements whose indices are
    write_indices[b] + s along axis. Linear writes past the cache's end are an index error."""
    if mode not in ("linear", "circular"):
        raise UnsupportedError(f"TensorScatter: mode {mode!r}")
    ndim = ctx.ndim(past_cache)
    axis %= ndim
    if axis == 0:
        raise TypeInferenceError("TensorScatter: axis 0 is the batch axis")
    steps = ctx.call("reshape", ctx.indices(ctx.dim_value(update, axis)),
                     newshape=tuple(-1 if i == axis else 1 for i in range(ndim)))
    if write_indices is not None:
        starts = ctx.call("reshape", _int64(ctx, write_indices), newshape=(-1,) + (1,) * (ndim - 1))
        steps = ctx.call("add", steps, starts)
    if mode == "circular":
        steps = ctx.call("floor_mod", steps, ctx.dim_value(past_cache, axis))
    index = ctx.call("broadcast_to_like", steps, update)
    return ctx.call("scatter_elements", past_cache, index, update, axis=axis, reduction="update")


@converter("MaxUnpool", 9)
def max_unpool_9(ctx, X, I, output_shape=None, *, kernel_shape, pads=None, strides=None):  # noqa: E741
    """X's values written at I's flat indices (over the whole tensor, as MaxPool's Indices) into zeros of
    ``output_shape`` when given, else of the shape MaxPool's attributes give back, ``(x - 1) stride - pads
    + kernel`` per spatial axis. With ``output_shape`` the indices address that tensor, as in ONNX Runtime
    and PyTorch (ONNX's reference writes them into the inferred shape and pads it to output_shape)."""
    rank, spatial = ctx.ndim(X), len(kernel_shape)
    if rank != spatial + 2:
        raise TypeInferenceError(f"MaxUnpool: {spatial} kernel dims for a rank-{rank} input")
    if output_shape is not None:
        shape = _run_time_shape(ctx, output_shape, "MaxUnpool")
    else:
        strides = list(strides or [1] * spatial)
        pads = list(pads or [0] * (2 * spatial))
        entries = [d if isinstance(d, int) else DimOf(X, a, d) for a, d in enumerate(ctx.shape(X)[:2])]
        for d in range(spatial):
            size = ctx.shape(X)[d + 2]
            if not isinstance(size, int):
                raise UnsupportedError("MaxUnpool: without output_shape the input's spatial dims must be static")
            entries.append((size - 1) * strides[d] - (pads[d] + pads[spatial + d]) + kernel_shape[d])
        shape = ctx.shape_vector(entries)
    zeros = ctx.call("dyn.broadcast_to", ctx.constant(np.zeros((), ctx.dtype(X))), shape)
    flat = ctx.call("reshape", zeros, newshape=(-1,))
    index = ctx.call("reshape", ctx.cast(I, "int64"), newshape=(-1,))
    values = ctx.call("reshape", X, newshape=(-1,))
    return ctx.call("dyn.reshape", ctx.call("scatter_elements", flat, index, values, axis=0, reduction="update"), shape)
