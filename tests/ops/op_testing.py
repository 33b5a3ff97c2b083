"""Shared helpers for operator tests (importable as ``op_testing`` from any test in ``tests/ops``).

* strategies: ``shapes``, ``broadcast_shapes``, ``arrays_of`` (per-dtype element ranges), ``DTYPE_GROUPS``;
* ``check_op(name, inputs, attrs, expected)``: runs the kernel and checks, against the same inputs,
  that (1) the result matches ``expected`` (an oracle computed independently by the test), (2) the
  type relation given the static input types predicts the result's type exactly, (3) the shape
  function predicts the result's shapes, and (4) with dims of the input types replaced by ``Any``
  or symbols the relation still gives the right structure, rank and dtype and never contradicts a
  concrete dim;
* oracle helpers: ``elementwise`` (apply a Python function per element, with broadcasting),
  ``wrap_int`` (two's-complement wrap of Python ints to a dtype), ``rows_over_axes``.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tensorvm.ir.types import Any, SymDim, TensorType, TupleType
from tensorvm.op import get_op

FLOATS = ("float16", "float32", "float64")
SIGNED = ("int8", "int16", "int32", "int64")
UNSIGNED = ("uint8", "uint16", "uint32", "uint64")
INTS = SIGNED + UNSIGNED
NUMERIC = INTS + FLOATS
ALL = ("bool",) + NUMERIC
DTYPE_GROUPS = {"float": FLOATS, "int": INTS, "signed": SIGNED, "numeric": NUMERIC, "bool": ("bool",), "all": ALL}

# Tolerances for transcendental kernels compared with a double-precision oracle.
RTOL = {"float16": 2e-3, "float32": 2e-6, "float64": 1e-12}
ATOL = {"float16": 2e-3, "float32": 1e-6, "float64": 1e-12}


# ---- strategies -----------------------------------------------------------------------------------


def shapes(min_dims: int = 0, max_dims: int = 4, min_side: int = 0, max_side: int = 4):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def broadcast_shapes(num_shapes: int = 2, max_dims: int = 3, min_side: int = 0, max_side: int = 4):
    """Tuples of mutually broadcastable shapes (including 0-d, size-1 and size-0 dims)."""
    return hnp.mutually_broadcastable_shapes(
        num_shapes=num_shapes, min_dims=0, max_dims=max_dims, min_side=min_side, max_side=max_side,
    ).map(lambda result: result.input_shapes)


def elements(dtype: str, low: float | None = None, high: float | None = None, special: bool = False):
    """Elements of ``dtype``: the whole integer range (or ``[low, high]``), floats in ``[low, high]``
    (default ``[-10, 10]``); ``special`` adds NaN and infinities for floats."""
    kind = np.dtype(dtype).kind
    if kind == "b":
        return st.booleans()
    if kind in "iu":
        info = np.iinfo(dtype)
        lo = info.min if low is None else max(info.min, math.ceil(low))
        hi = info.max if high is None else min(info.max, math.floor(high))
        return st.integers(lo, hi)
    width = np.dtype(dtype).itemsize * 8
    lo = _representable(-10.0 if low is None else low, dtype, +1)
    hi = _representable(10.0 if high is None else high, dtype, -1)
    finite = st.floats(lo, hi, width=width, allow_nan=False, allow_infinity=False)
    if special:
        return st.one_of(finite, st.sampled_from([math.nan, math.inf, -math.inf]))
    return finite


def _representable(bound: float, dtype: str, inward: int) -> float:
    """The nearest value of ``dtype`` to ``bound`` that lies inside the interval (``inward`` = +1 for a
    lower bound, -1 for an upper one); hypothesis wants bounds exact in the element width."""
    value = np.asarray(bound).astype(dtype)
    if (inward > 0 and value < bound) or (inward < 0 and value > bound):
        value = np.nextafter(value, np.asarray(inward * np.inf, dtype))
    return float(value)


def arrays_of(dtype: str, shape, low=None, high=None, special: bool = False, values=None):
    return hnp.arrays(np.dtype(dtype), shape, elements=values if values is not None else elements(dtype, low, high, special))


# ---- oracle helpers -------------------------------------------------------------------------------


def wrap_int(value: int, dtype: str):
    """Reduce a Python int to ``dtype`` with two's-complement wraparound (what C does)."""
    bits = np.dtype(dtype).itemsize * 8
    value %= 1 << bits
    if np.dtype(dtype).kind == "i" and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def to_python(value):
    """A NumPy scalar as an exact Python bool/int/float."""
    return value.item() if isinstance(value, np.generic) else value


def elementwise(fn, *arrays, dtype: str):
    """Apply the Python function ``fn`` to each broadcast tuple of elements; integer results wrap."""
    broadcast = np.broadcast_arrays(*arrays)
    shape = broadcast[0].shape if broadcast else ()
    out = []
    for index in np.ndindex(shape):
        value = fn(*(to_python(a[index]) for a in broadcast))
        if np.dtype(dtype).kind in "iu":
            value = wrap_int(int(value), dtype)
        out.append(value)
    with np.errstate(all="ignore"):
        return np.array(out, dtype=np.float64 if np.dtype(dtype).kind == "f" else object).astype(dtype).reshape(shape)


def rows_over_axes(x: np.ndarray, axes) -> tuple[list, tuple]:
    """For a reduction over ``axes``: the list of rows (Python lists of the reduced elements, in
    row-major order within the reduced axes) and the shape of the kept axes."""
    kept = [i for i in range(x.ndim) if i not in axes]
    kept_shape = tuple(x.shape[i] for i in kept)
    rows = []
    for kept_index in np.ndindex(kept_shape):
        row = []
        for reduced_index in np.ndindex(tuple(x.shape[i] for i in axes)):
            full = [0] * x.ndim
            for axis, i in zip(kept, kept_index, strict=True):
                full[axis] = i
            for axis, i in zip(axes, reduced_index, strict=True):
                full[axis] = i
            row.append(to_python(x[tuple(full)]))
        rows.append(row)
    return rows, kept_shape


# ---- the common checks ----------------------------------------------------------------------------


def static_type(value) -> TensorType | TupleType:
    if isinstance(value, tuple):
        return TupleType(tuple(static_type(v) for v in value))
    value = np.asarray(value)
    return TensorType(value.shape, value.dtype.name)


def flat_shapes(value) -> list[tuple]:
    if isinstance(value, tuple):
        return [s for v in value for s in flat_shapes(v)]
    return [np.asarray(value).shape]


def shape_func_args(opdef, inputs) -> list:
    args = []
    for i, value in enumerate(inputs):
        if opdef.input_needs_data(i):
            args.append(np.asarray(value))
        else:
            args.append(np.asarray(value).shape)
    return args


def run_kernel(name: str, inputs, attrs=None):
    return get_op(name).kernel(attrs or {}, *inputs)


def assert_matches(actual, expected, rtol: float = 0.0, atol: float = 0.0):
    """Exact dtype and shape; values equal (NaN equals NaN), within tolerance for floats."""
    if isinstance(expected, tuple):
        assert isinstance(actual, tuple) and len(actual) == len(expected), (actual, expected)
        for a, e in zip(actual, expected, strict=True):
            assert_matches(a, e, rtol, atol)
        return
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    if actual.dtype.kind == "f" and (rtol or atol):
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol,
                                   equal_nan=True)
    else:
        np.testing.assert_array_equal(actual, expected)


def relaxed(ty, positions, make_dim):
    """``ty`` with the dims at ``positions`` (indices into the flattened dims) replaced by ``make_dim(k)``."""
    counter = [0]

    def walk(t):
        if isinstance(t, TupleType):
            return TupleType(tuple(walk(f) for f in t.fields))
        dims = []
        for d in t.shape:
            dims.append(make_dim(counter[0]) if counter[0] in positions else d)
            counter[0] += 1
        return TensorType(tuple(dims), t.dtype)

    return walk(ty)


def assert_compatible(relaxed_out, concrete_out, context: str):
    """The relation's output for relaxed inputs: same structure, rank and dtype; every static dim
    equals the concrete one."""
    if isinstance(concrete_out, TupleType):
        assert isinstance(relaxed_out, TupleType) and len(relaxed_out.fields) == len(concrete_out.fields), context
        for r, c in zip(relaxed_out.fields, concrete_out.fields, strict=True):
            assert_compatible(r, c, context)
        return
    assert isinstance(relaxed_out, TensorType), context
    assert relaxed_out.dtype == concrete_out.dtype, context
    assert relaxed_out.ndim == concrete_out.ndim, context
    for r, c in zip(relaxed_out.shape, concrete_out.shape, strict=True):
        assert not isinstance(r, int) or r == c, f"{context}: dim {r} contradicts {c}"


def check_relaxed_types(name: str, inputs, attrs, concrete_out, consts=None):
    """Replace input dims by ``Any`` (all at once, and one at a time) and by symbols; the relation must
    stay compatible with the concrete result."""
    opdef = get_op(name)
    types = [static_type(v) for v in inputs]
    total = [sum(len(s) for s in flat_shapes(v)) for v in inputs]
    variants = [("all Any", lambda k: Any(), None), ("all symbolic", lambda k: SymDim(f"d{k}"), None)]
    variants += [(f"Any at {k}", lambda k: Any(), {k}) for k in range(sum(total))]
    for label, make_dim, only in variants:
        relaxed_types, offset = [], 0
        for ty, n in zip(types, total, strict=True):
            positions = set(range(n)) if only is None else {k - offset for k in only if offset <= k < offset + n}
            relaxed_types.append(relaxed(ty, positions, make_dim))
            offset += n
        out = opdef.type_rel(relaxed_types, attrs, consts)
        context = f"{name} with {label}: {', '.join(_describe(t) for t in relaxed_types)}"
        assert_compatible(out, concrete_out, context)


def check_op(name: str, inputs, attrs=None, expected=None, rtol: float = 0.0, atol: float = 0.0,
             consts: bool = False, relax: bool = True, dynamic: bool = False):
    """Run the kernel of ``name`` and check it against ``expected``, the type relation, the shape
    function and relaxed (Any/symbolic) types. ``consts=True`` passes the inputs' values to the
    relation as constants. ``dynamic=True`` (an output shape that depends on the data) only asks the
    relation for a type compatible with the result. Returns the kernel's result."""
    opdef = get_op(name)
    attrs = attrs or {}
    inputs = [np.asarray(v) for v in inputs]
    result = opdef.kernel(attrs, *inputs)
    result = tuple(np.asarray(r) for r in result) if isinstance(result, tuple) else np.asarray(result)
    if expected is not None:
        assert_matches(result, expected, rtol, atol)
    const_values = list(inputs) if consts else None
    out_type = opdef.type_rel([static_type(v) for v in inputs], attrs, const_values)
    if dynamic:
        assert_compatible(out_type, static_type(result), f"{name}: relation gives {_describe(out_type)}")
        out_type = static_type(result)
    else:
        assert out_type == static_type(result), (
            f"{name}: relation gives {_describe(out_type)}, kernel gives {_describe(static_type(result))}")
    shapes = opdef.shape_func(attrs, shape_func_args(opdef, inputs))
    assert [tuple(s) for s in shapes] == flat_shapes(result), f"{name}: shape function {shapes} vs kernel"
    if relax:
        check_relaxed_types(name, inputs, attrs, out_type, const_values)
    return result


def _describe(ty) -> str:
    """A type as text without the printer (which another engineer owns and may be mid-edit)."""
    if isinstance(ty, TupleType):
        return "(" + ", ".join(_describe(f) for f in ty.fields) + ")"
    return f"Tensor[{tuple(ty.shape)}, {ty.dtype}]"
