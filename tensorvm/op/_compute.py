"""Helpers of the operators' tensor-expression computes (each compute sits next to its op's definition).

A compute has the signature ``compute(attrs, inputs, out_type) -> list[Tensor]``: ``attrs`` are the op's
normalized attributes, ``inputs`` its arguments as te tensors (a tuple-typed argument is a tuple of
tensors) and ``out_type`` the call's inferred type (for the output dtype, and for the output dims of an op
whose output shape depends on data: ``output_dims``). The result lists one tensor per output (tuple
outputs flattened). Semantics follow each op's NumPy kernel, including its dtype rules (accumulation
in float32 for float16, integer wrap-around) and its run-time checks, expressed as ``requires``.

Shapes are te expressions over the input dims, so one compute serves static and dynamic shapes; where
a dim is only known at run time, broadcasting reads index ``select(dim == 1, 0, i)`` and the compute
requires the dims to be compatible.
"""

from __future__ import annotations

from ..errors import ShapeError, TypeInferenceError, UnsupportedError
from ..ir.types import TupleType
from ..te import expr as E
from ..te.expr import INDEX_DTYPE, Const, PrimExpr, cast, const, eq, product, select
from ..te.tensor import Tensor, compute

__all__ = [
    "same", "dim_text", "broadcast_shape", "broadcast_read", "broadcast_read_dim", "product", "require_equal",
    "kernel_name", "output_dtype", "acc_float", "axis_of", "unary_compute", "float_math", "ravel", "unravel",
    "reshape_index", "reshape_to", "output_dims", "broadcast_to_shape", "matmul_value", "with_requires",
    "layout_reader", "layout_compute", "static_dim",
]


# ---- dims and dtypes ------------------------------------------------------------------------------


def same(a, b) -> bool:
    return a == b


def dim_text(d) -> str:
    return repr(d)


def broadcast_shape(op: str, *shapes) -> tuple[tuple, list]:
    """NumPy broadcasting of te shapes: the output dims and the run-time requirements."""
    ndim = max((len(s) for s in shapes), default=0)
    out, requires = [], []
    for axis in range(ndim):
        dims = [s[axis - ndim + len(s)] for s in shapes if axis - ndim + len(s) >= 0]
        dims = [d for d in dims if not (isinstance(d, Const) and d.value == 1)]
        distinct = []
        for d in dims:
            if not any(same(d, x) for x in distinct):
                distinct.append(d)
        if not distinct:
            out.append(const(1))
            continue
        static = [d for d in distinct if isinstance(d, Const)]
        if len(static) > 1:
            raise ShapeError(f"{op}: cannot broadcast dims {', '.join(map(dim_text, static))}")
        if static:
            result = static[0]
        else:
            result = distinct[0]
            for d in distinct[1:]:
                result = select(eq(result, 1), d, result)
        for d in distinct:
            if not same(d, result):
                requires.append((E.logical_or(eq(d, 1), eq(d, result)),
                                 f"{op}: cannot broadcast dim {dim_text(d)} to {dim_text(result)} "
                                 f"(axis {axis - ndim})"))
        out.append(result)
    return tuple(out), requires


def broadcast_read(t: Tensor, out_index: tuple, out_shape: tuple | None = None) -> PrimExpr:
    """Read ``t`` at the position that broadcasts to ``out_index`` (dims aligned on the right)."""
    offset = len(out_index) - t.ndim
    index = []
    for axis, d in enumerate(t.shape):
        i = out_index[axis + offset]
        if isinstance(d, Const) and d.value == 1:
            index.append(const(0))
        elif isinstance(d, Const) or (out_shape is not None and same(d, out_shape[axis + offset])):
            index.append(i)
        else:
            index.append(select(eq(d, 1), 0, i))
    return t[tuple(index)]


def broadcast_read_dim(dim, index, out_dim):
    if isinstance(dim, Const) and dim.value == 1:
        return const(0)
    if isinstance(dim, Const) or same(dim, out_dim):
        return index
    return select(eq(dim, 1), 0, index)


def require_equal(op: str, a, b, what: str) -> list:
    return [] if same(a, b) else [(eq(a, b), f"{op}: {what} must match ({dim_text(a)} vs {dim_text(b)})")]


def kernel_name(op: str) -> str:
    return op.replace(".", "_")


def output_dtype(out_type, index: int = 0) -> str:
    if isinstance(out_type, TupleType):
        return out_type.fields[index].dtype
    return out_type.dtype


def acc_float(dtype: str) -> str:
    """The dtype float math runs in: float32 for float16 (like the NumPy kernels), else the dtype."""
    return "float32" if dtype == "float16" else dtype


def axis_of(op: str, axis: int, ndim: int) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise TypeInferenceError(f"{op}: axis {axis} is out of range for rank {ndim}")
    return axis % ndim if ndim else 0


def with_requires(t: Tensor, requires: list) -> Tensor:
    if not requires:
        return t
    return compute(t.shape, lambda *i: t[i], t.name, requires)


def static_dim(d, what: str) -> int:
    if not isinstance(d, Const):
        raise UnsupportedError(f"codegen: the {what} must be static, got {d!r}")
    return d.value


# ---- elementwise ------------------------------------------------------------------------------------


def unary_compute(name: str, fn):
    def compute_fn(attrs, inputs, out_type):
        (x,) = inputs[:1]
        dtype = output_dtype(out_type)
        return [compute(x.shape, lambda *i: cast(fn(x[i], attrs), dtype), kernel_name(name))]

    compute_fn.__name__ = kernel_name(name)
    return compute_fn


def float_math(fn):
    """Apply ``fn`` in float32 for float16 arguments, rounding once at the end (like NumPy's float16 loops)."""

    def apply(x, attrs):
        return fn(x, attrs) if x.dtype != "float16" else cast(fn(cast(x, "float32"), attrs), "float16")

    return apply


# ---- reshapes and broadcasts ---------------------------------------------------------------------


def ravel(index, shape) -> PrimExpr:
    flat = const(0)
    for i, d in zip(index, shape):
        flat = flat * d + i
    return flat


def unravel(flat, shape) -> list:
    out = []
    for axis in range(len(shape) - 1, -1, -1):
        if axis == 0:
            out.append(flat)
        else:
            out.append(E.floormod(flat, shape[axis]))
            flat = E.floordiv(flat, shape[axis])
    return list(reversed(out))


def reshape_index(out_index, out_shape, in_shape) -> tuple:
    """The input index of a row-major reshape; equal leading and trailing dims map directly."""
    out_index, out_shape, in_shape = list(out_index), list(out_shape), list(in_shape)
    head = 0
    while head < min(len(out_shape), len(in_shape)) and same(out_shape[head], in_shape[head]):
        head += 1
    tail = 0
    while tail < min(len(out_shape), len(in_shape)) - head and same(out_shape[-1 - tail], in_shape[-1 - tail]):
        tail += 1
    mid_out = out_index[head:len(out_index) - tail]
    mid_in_shape = in_shape[head:len(in_shape) - tail]
    middle = unravel(ravel(mid_out, out_shape[head:len(out_shape) - tail]), mid_in_shape) if mid_in_shape else []
    return tuple(out_index[:head] + middle + out_index[len(out_index) - tail:])


def reshape_to(op: str, x: Tensor, shape: tuple, requires=()) -> Tensor:
    shape = tuple(E.as_expr(d, INDEX_DTYPE) for d in shape)
    requires = list(requires)
    total_in, total_out = product(x.shape), product(shape)
    if not same(total_in, total_out):
        requires.append((eq(total_in, total_out), f"{op}: cannot reshape {list(x.shape)} to {list(shape)}"))
    return compute(shape, lambda *i: x[reshape_index(i, shape, x.shape)], kernel_name(op), requires)


def output_dims(op: str, out_type) -> tuple:
    """Output dims for an op whose output shape depends on data: symbols bound from the output array
    (which the caller allocated from the op's shape function)."""
    return tuple(E.var(f"{kernel_name(op)}_out{axis}") if not isinstance(d, int) else const(d)
                 for axis, d in enumerate(out_type.shape))


def broadcast_to_shape(op: str, x: Tensor, target: tuple) -> tuple:
    if x.ndim > len(target):
        raise TypeInferenceError(f"{op}: cannot broadcast rank {x.ndim} to rank {len(target)}")
    requires = []
    offset = len(target) - x.ndim
    for axis, d in enumerate(x.shape):
        t = target[axis + offset]
        if not same(d, t) and not (isinstance(d, Const) and d.value == 1):
            requires.append((E.logical_or(eq(d, 1), eq(d, t)), f"{op}: cannot broadcast dim {axis} to the target"))
    return compute(target, lambda *i: broadcast_read(x, i, target), kernel_name(op), requires)


# ---- products and layouts -------------------------------------------------------------------------


def matmul_value(a_read, b_read, k, out_dtype):
    return cast(a_read, out_dtype) * cast(b_read, out_dtype)


def layout_reader(t: Tensor, layout: str, canonical: str):
    """(dims by canonical letter, read(index by canonical letter))."""
    dims = {c: t.shape[layout.index(c)] for c in canonical}

    def read(**index):
        return t[tuple(index[c] for c in layout)]

    return dims, read


def layout_compute(shape_by_letter: dict, layout: str, fn, name: str, requires=()):
    shape = tuple(shape_by_letter[c] for c in layout)
    return compute(shape, lambda *i: fn(**dict(zip(layout, i))), name, requires)
