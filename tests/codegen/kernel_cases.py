"""Helpers for the code-generation tests: op cases, random shapes and values, IR primitive functions.

A ``Case`` is one operator with fixed attributes, a shape sampler ``sample(rng) -> [shape per input]``
and the dtypes to try. For each dtype it yields two kernels: *static* (the types carry the shapes of one
fixed sample) and *dynamic* (every dim is ``?`` except the axes listed in ``static``). Kernels are
checked against the operator's NumPy kernel, which is the independent oracle here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tensorvm.ir.attrs import Attrs
from tensorvm.ir.expr import Call, Function, Op, Var
from tensorvm.ir.types import Any, TensorType, TupleType
from tensorvm.op import get_op

TOLERANCE = {"float16": (2e-2, 2e-2), "float32": (2e-5, 2e-5), "float64": (1e-10, 1e-10)}


@dataclass
class Case:
    op: str
    sample: object  # rng -> list of shapes (one per input; a list of shapes for a tuple input)
    dtypes: tuple = ("float32",)  # each: one dtype for all inputs, or a tuple with one per input
    attrs: dict = field(default_factory=dict)
    static: tuple = ()  # per input: the axes kept static in the dynamic kernel ("all" keeps every axis)
    values: object = None  # (rng, shape, dtype, input_index) -> array
    tuple_input: bool = False  # the op takes one tuple of tensors
    label: str = ""
    dynamic: bool = True

    def name(self, dtype, dynamic: bool) -> str:
        tag = self.label or "_".join(f"{k}{_short(v)}" for k, v in sorted(self.attrs.items()))
        dt = dtype if isinstance(dtype, str) else "_".join(dtype)
        base = f"k_{self.op.replace('.', '_')}_{tag}_{dt}_{'dyn' if dynamic else 'static'}"
        return "".join(c if c.isalnum() or c == "_" else "_" for c in base)[:120]


def _short(value) -> str:
    return str(value).replace(" ", "").replace("(", "").replace(")", "").replace(",", "x").replace("-", "m")


def dtypes_for(dtype, count: int) -> tuple:
    return (dtype,) * count if isinstance(dtype, str) else tuple(dtype)


def default_values(rng, shape, dtype: str):
    kind = np.dtype(dtype).kind
    if kind == "b":
        return rng.random(shape) < 0.5
    if kind == "f":
        return (rng.standard_normal(shape) * 3).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def make_inputs(case: Case, rng, shapes, dtype) -> list:
    flat_shapes = shapes[0] if case.tuple_input else shapes
    dtypes = dtypes_for(dtype, len(flat_shapes))
    arrays = []
    for index, (shape, dt) in enumerate(zip(flat_shapes, dtypes)):
        if case.values is not None:
            value = case.values(rng, tuple(shape), dt, index)
            arrays.append(value if value is not None else default_values(rng, tuple(shape), dt))
        else:
            arrays.append(default_values(rng, tuple(shape), dt))
    return [np.array(a, dtype=dt, order="C") for a, dt in zip(arrays, dtypes)]  # keeps 0-d arrays 0-d


def _type(shape, dtype, static_axes, dynamic: bool) -> TensorType:
    if not dynamic or static_axes == "all":
        return TensorType(tuple(shape), dtype)
    return TensorType(tuple(d if axis in static_axes else Any() for axis, d in enumerate(shape)), dtype)


def primitive(case: Case, shapes, dtype, dynamic: bool) -> Function:
    """``fn (params) { op(params) }`` with the case's attributes (a tuple param for tuple-input ops)."""
    flat_shapes = shapes[0] if case.tuple_input else shapes
    dtypes = dtypes_for(dtype, len(flat_shapes))
    types = [_type(s, dt, case.static[i] if i < len(case.static) else (), dynamic)
             for i, (s, dt) in enumerate(zip(flat_shapes, dtypes))]
    if case.tuple_input:
        param = Var("data", TupleType(tuple(types)))
        args = (param,)
        params = [param]
    else:
        params = [Var(f"p{i}", t) for i, t in enumerate(types)]
        args = tuple(params)
    return Function(params, Call(Op(case.op), args, Attrs(case.attrs)), attrs={"Primitive": 1})


# ops whose outputs are sums of products of their inputs (their error bound scales with the terms)
SUMS_OF_PRODUCTS = {"nn.conv2d", "nn.conv2d_packed", "nn.conv2d_transpose", "nn.dense", "nn.dense_packed",
                    "nn.matmul", "nn.batch_matmul", "onnx.matmul"}


def magnitudes(case: Case, arrays) -> list | None:
    """For a sum-of-products op, the op over the inputs' absolute values: each output's sum of |terms|."""
    if case.op not in SUMS_OF_PRODUCTS or any(np.asarray(a).dtype.kind != "f" for a in arrays):
        return None
    return reference(case, [np.abs(a) for a in arrays])


def reference(case: Case, arrays) -> list:
    opdef = get_op(case.op)
    args = [tuple(arrays)] if case.tuple_input else arrays
    with np.errstate(all="ignore"):
        result = opdef.kernel(Attrs(case.attrs), *args)
    results = list(result) if isinstance(result, tuple) else [result]
    return [np.asarray(r) for r in results]


def check_close(out: np.ndarray, ref: np.ndarray, what: str, magnitude: np.ndarray | None = None):
    """``out`` equals ``ref`` within the dtype's tolerance; for a sum of products, ``magnitude`` (the same
    sum over the terms' absolute values) widens the absolute tolerance where the terms cancel: two
    summation orders may differ by a few roundings of the terms, not of the (near zero) sum."""
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != {ref.shape}"
    assert out.dtype == ref.dtype, f"{what}: dtype {out.dtype} != {ref.dtype}"
    if out.dtype.kind == "f":
        rtol, atol = TOLERANCE[out.dtype.name]
        if magnitude is not None:
            atol = atol + rtol * np.nan_to_num(magnitude.astype("float64"), nan=0.0)
            excess = np.abs(out.astype("float64") - ref.astype("float64")) - atol - rtol * np.abs(ref.astype("float64"))
            same_nan = np.isnan(out) == np.isnan(ref)
            assert same_nan.all() and not (np.nan_to_num(excess, nan=0.0) > 0).any(), (
                f"{what}: {int((excess > 0).sum())} elements beyond the tolerance, the worst by {np.nanmax(excess)}")
            return
        np.testing.assert_allclose(out.astype("float64"), ref.astype("float64"), rtol=rtol, atol=atol,
                                   equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(out, ref, err_msg=what)


# ---- shape samplers -------------------------------------------------------------------------------


def dims(rng, rank: int, low: int = 0, high: int = 5) -> tuple:
    return tuple(int(d) for d in rng.integers(low, high + 1, size=rank))


def unary(rank_low: int = 0, rank_high: int = 3, low: int = 0, high: int = 5):
    return lambda rng: [dims(rng, int(rng.integers(rank_low, rank_high + 1)), low, high)]


def fixed_rank(*ranks, low: int = 0, high: int = 5):
    return lambda rng: [dims(rng, r, low, high) for r in ranks]


def broadcast_pair(max_rank: int = 3, count: int = 2):
    """Shapes that broadcast together: a common shape, each input a suffix with some dims set to 1."""

    def sample(rng):
        full = dims(rng, int(rng.integers(0, max_rank + 1)), 0, 4)
        shapes = []
        for _ in range(count):
            keep = int(rng.integers(0, len(full) + 1))
            suffix = [1 if rng.random() < 0.3 else d for d in full[len(full) - keep:]]
            shapes.append(tuple(suffix))
        shapes[int(rng.integers(0, count))] = full  # one input has the full shape
        return shapes

    return sample


def same_shapes(count: int, rank_high: int = 3):
    def sample(rng):
        shape = dims(rng, int(rng.integers(0, rank_high + 1)))
        return [shape] * count

    return sample


def positive(rng, shape, dtype, index):
    return (rng.random(shape) * 5 + 0.05).astype(dtype)


def unit(rng, shape, dtype, index):
    """Inside (-1, 1): asin, acos and atanh's domain."""
    return (rng.random(shape) * 1.98 - 0.99).astype(dtype)


def above_one(rng, shape, dtype, index):
    """At least 1: acosh's domain."""
    return (rng.random(shape) * 20 + 1).astype(dtype)


def nonzero_divisor(rng, shape, dtype, index):
    if index == 1 and np.dtype(dtype).kind in "iu":
        values = default_values(rng, shape, dtype)
        return np.where(values == 0, 1, values).astype(dtype)
    return None


def small_ints(low: int, high: int):
    def values(rng, shape, dtype, index):
        if np.dtype(dtype).kind in "iu":
            return rng.integers(low, high + 1, size=shape).astype(dtype)
        return None

    return values


def with_nans(rng, shape, dtype, index):
    values = default_values(rng, shape, dtype)
    if np.dtype(dtype).kind == "f":
        values = np.where(rng.random(shape) < 0.15, np.nan, values).astype(dtype)
    return values


def halves(rng, shape, dtype, index):
    if np.dtype(dtype).kind == "f":
        return (rng.integers(-8, 9, size=shape) / 2).astype(dtype)
    return None
