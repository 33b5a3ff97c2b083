"""Reductions (tensorvm/op/reduce.py) against Python oracles applied to each reduced row."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from op_testing import (
    ALL,
    FLOATS,
    NUMERIC,
    arrays_of,
    check_op,
    rows_over_axes,
    run_kernel,
    shapes,
    wrap_int,
)

from tensorvm.errors import AttrError, ExecutionError, ShapeError, TypeInferenceError
from tensorvm.ir.types import Any, SymDim, TensorType
from tensorvm.op import get_op
from tensorvm.op.registry import OpPattern

SETTINGS = settings(max_examples=25, deadline=None)


def reduced_axes(ndim, axis, exclude):
    """Which axes a reduction removes, restated from Relay's rule."""
    if axis is None:
        return tuple(range(ndim))
    listed = sorted(a % ndim for a in axis)
    return tuple(i for i in range(ndim) if i not in listed) if exclude else tuple(listed)


def oracle(x, axes, keepdims, row_fn, dtype):
    """Apply ``row_fn`` to each reduced row; integers wrap to ``dtype``."""
    rows, kept_shape = rows_over_axes(x, axes)
    values = []
    for row in rows:
        value = row_fn(row)
        if np.dtype(dtype).kind in "iu":
            value = wrap_int(int(value), dtype)
        values.append(value)
    out = np.array(values, dtype=object).astype(dtype).reshape(kept_shape)
    if keepdims:
        out = out.reshape(tuple(1 if i in axes else d for i, d in enumerate(x.shape)))
    return out


@st.composite
def reduce_attrs(draw, ndim):
    """axis (None, an int, or a list of distinct axes, possibly negative or empty), keepdims, exclude."""
    choice = draw(st.sampled_from(["none", "int", "list"])) if ndim else "none"
    if choice == "none":
        axis = None
    else:
        chosen = draw(st.lists(st.integers(0, ndim - 1), unique=True, min_size=1 if choice == "int" else 0,
                               max_size=1 if choice == "int" else ndim))
        axis = [a - ndim if draw(st.booleans()) else a for a in chosen]
        if choice == "int":
            axis = axis[0]
    attrs = {"axis": axis, "keepdims": draw(st.booleans()), "exclude": draw(st.booleans())}
    return {k: v for k, v in attrs.items() if draw(st.booleans()) or k == "axis"}


def _axes_list(axis):
    return None if axis is None else ([axis] if isinstance(axis, int) else list(axis))


def _exact_values(dtype, name):
    """Values whose sums, means and products are exact in every dtype for shapes up to 4^4."""
    kind = np.dtype(dtype).kind
    if name == "prod":  # powers of two (and 0): float products stay exact, integer ones just wrap
        if kind == "f":
            return st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0])
        return st.sampled_from([0, 1, 2] if kind == "u" else [-1, 0, 1, 2])
    if kind == "f":
        return st.integers(-8, 8).map(float) if dtype == "float16" else st.integers(-16, 16).map(lambda n: n / 4)
    if kind == "b":
        return st.booleans()
    return None


def _fsum(row):
    return math.fsum(row)


def _int_mean(row):
    return int(Fraction(sum(row), len(row)))


def _argmax_first(row, select_max=True):
    best = max(row) if select_max else min(row)
    return row.index(best)


def _argmax_last(row, select_max=True):
    best = max(row) if select_max else min(row)
    return len(row) - 1 - row[::-1].index(best)


def _logsumexp(row):
    if not row:
        return -math.inf
    shift = max(row)
    return shift + math.log(math.fsum(math.exp(v - shift) for v in row))


# name -> (dtypes, row oracle for ints, row oracle for floats, can reduce an empty axis)
REDUCTIONS = {
    "sum": (NUMERIC, sum, _fsum, True),
    "prod": (NUMERIC, math.prod, math.prod, True),
    "mean": (NUMERIC, _int_mean, lambda row: _fsum(row) / len(row), False),
    "max": (ALL, max, max, False),
    "min": (ALL, min, min, False),
    "all": (("bool",), all, all, True),
    "any": (("bool",), any, any, True),
    "logsumexp": (FLOATS, None, _logsumexp, True),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@SETTINGS
@given(data=st.data())
def test_reductions_match_python(name, data):
    dtypes, int_fn, float_fn, empty_ok = REDUCTIONS[name]
    dtype = data.draw(st.sampled_from(dtypes), "dtype")
    shape = data.draw(shapes(max_dims=4, min_side=0 if empty_ok else 1), "shape")
    x = data.draw(arrays_of(dtype, shape, values=_exact_values(dtype, name)), "x")
    attrs = data.draw(reduce_attrs(len(shape)), "attrs")
    axes = reduced_axes(x.ndim, _axes_list(attrs["axis"]), attrs.get("exclude", False))
    row_fn = float_fn if np.dtype(dtype).kind == "f" else int_fn
    expected = oracle(x, axes, attrs.get("keepdims", False), row_fn, dtype)
    tolerance = {"rtol": 2e-3 if dtype == "float16" else 1e-6, "atol": 1e-6} if name == "logsumexp" else {}
    check_op(name, [x], attrs, expected=expected, **tolerance)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@SETTINGS
@given(data=st.data())
def test_arg_reductions_index_row_major_within_the_reduced_axes(name, data):
    dtype = data.draw(st.sampled_from(ALL), "dtype")
    shape = data.draw(shapes(max_dims=4, min_side=1), "shape")
    # few distinct values, so ties (and select_last_index) matter
    x = data.draw(arrays_of(dtype, shape, -2, 2), "x")
    attrs = data.draw(reduce_attrs(len(shape)), "attrs")
    last = data.draw(st.booleans(), "select_last_index")
    attrs["select_last_index"] = last
    axes = reduced_axes(x.ndim, _axes_list(attrs["axis"]), attrs.get("exclude", False))
    pick = _argmax_last if last else _argmax_first
    expected = oracle(x, axes, attrs.get("keepdims", False), lambda row: pick(row, name == "argmax"), "int32")
    check_op(name, [x], attrs, expected=expected)


@pytest.mark.parametrize("name", ["variance", "std"])
@SETTINGS
@given(data=st.data())
def test_variance_and_std_with_and_without_a_given_mean(name, data):
    dtype = data.draw(st.sampled_from(FLOATS), "dtype")
    shape = data.draw(shapes(max_dims=3, min_side=1), "shape")
    x = data.draw(arrays_of(dtype, shape, values=st.integers(-8, 8).map(float)), "x")
    attrs = data.draw(reduce_attrs(len(shape)), "attrs")
    unbiased = data.draw(st.booleans(), "unbiased")
    attrs["unbiased"] = unbiased
    axes = reduced_axes(x.ndim, _axes_list(attrs["axis"]), attrs.get("exclude", False))

    def moment(row, mean):
        divisor = len(row) - int(unbiased)
        total = math.fsum((v - mean) ** 2 for v in row)
        if divisor:
            value = total / divisor
        else:  # IEEE: 0 / 0 is NaN, x / 0 is infinite
            value = math.inf if total else math.nan
        return math.sqrt(value) if name == "std" else value

    keepdims = attrs.get("keepdims", False)
    tolerance = {"rtol": 2e-3 if dtype == "float16" else 1e-5, "atol": 1e-3 if dtype == "float16" else 1e-6}
    expected = oracle(x, axes, keepdims, lambda row: moment(row, _fsum(row) / len(row)), dtype)
    with np.errstate(all="ignore"):
        check_op(name, [x], attrs, expected=expected, **tolerance)
    # With the mean given explicitly (here zero, broadcast as a keepdims-shaped tensor): raw moments.
    zero_mean = np.zeros(tuple(1 if i in axes else d for i, d in enumerate(shape)), dtype)
    expected = oracle(x, axes, keepdims, lambda row: moment(row, 0.0), dtype)
    with np.errstate(all="ignore"):
        check_op(name, [x, zero_mean], attrs, expected=expected, **tolerance)


def test_variance_by_hand():
    x = np.float32([[1, 2, 3, 4], [2, 2, 2, 2]])
    assert run_kernel("variance", [x], {"axis": 1}).tolist() == [1.25, 0.0]
    assert run_kernel("variance", [x], {"axis": 1, "unbiased": True}).tolist() == pytest.approx([5 / 3, 0.0])
    std = run_kernel("std", [x], {"axis": [1], "keepdims": True})
    assert std.shape == (2, 1) and std.ravel().tolist() == pytest.approx([1.25**0.5, 0])
    mean = np.float32([[0], [1]])
    assert run_kernel("variance", [x, mean], {"axis": 1}).tolist() == [7.5, 1.0]


# ---- empty axes, identities, errors ---------------------------------------------------------------


def test_empty_reductions_use_the_identity_or_fail_clearly():
    empty = np.zeros((2, 0), "float32")
    assert run_kernel("sum", [empty], {"axis": 1}).tolist() == [0, 0]
    assert run_kernel("prod", [empty], {"axis": 1}).tolist() == [1, 1]
    assert run_kernel("logsumexp", [empty], {"axis": 1}).tolist() == [-np.inf, -np.inf]
    assert np.isnan(run_kernel("mean", [empty], {"axis": 1})).all()
    assert run_kernel("all", [np.zeros((0,), bool)]).item() is True
    assert run_kernel("any", [np.zeros((0,), bool)]).item() is False
    # reducing the non-empty axis of an empty tensor is fine even without an identity
    assert run_kernel("max", [empty], {"axis": 0}).shape == (0,)
    for name in ("max", "min", "argmax", "argmin"):
        with pytest.raises(ShapeError, match=f"{name}: cannot reduce an empty axis"):
            run_kernel(name, [empty], {"axis": 1})
        with pytest.raises(ShapeError, match="no identity"):
            get_op(name).shape_func({"axis": 1}, [(2, 0)])
        with pytest.raises(TypeInferenceError, match="no identity"):
            get_op(name).type_rel([TensorType((2, 0))], {"axis": [1]})
        # an unknown dim may be non-empty: no static error
        get_op(name).type_rel([TensorType((2, Any()))], {"axis": 1})
    with pytest.raises(ExecutionError, match="mean: cannot average an empty axis"):
        run_kernel("mean", [np.zeros((2, 0), "int32")], {"axis": 1})


def test_integer_reductions_keep_the_dtype_and_wrap():
    x = np.full((4,), 100, "int8")
    out = run_kernel("sum", [x])
    assert out.dtype == np.int8 and out.item() == wrap_int(400, "int8")
    assert run_kernel("mean", [np.int32([-3, -4])]).item() == -3  # truncated toward zero
    assert run_kernel("mean", [np.uint8([255, 255])]).item() == 255  # no overflow in the sum
    assert run_kernel("argmax", [np.float32([1, 3, 3])]).dtype == np.int32


def test_nan_handling():
    x = np.float32([1, np.nan, 3])
    assert np.isnan(run_kernel("max", [x])) and np.isnan(run_kernel("sum", [x]))
    assert run_kernel("argmax", [x]).item() == 1
    assert run_kernel("logsumexp", [np.float32([np.inf, 1])]).item() == np.inf


def test_relation_keeps_unknown_and_symbolic_dims():
    n = SymDim("n")
    data = TensorType((Any(), 3, n), "float32")
    assert get_op("sum").type_rel([data], {"axis": 0}) == TensorType((3, n), "float32")
    assert get_op("sum").type_rel([data], {"axis": [0], "keepdims": True}) == TensorType((1, 3, n), "float32")
    assert get_op("max").type_rel([data], {"axis": [1], "exclude": True}) == TensorType((3,), "float32")
    assert get_op("argmin").type_rel([data], {"axis": -1}) == TensorType((Any(), 3), "int32")
    assert get_op("mean").type_rel([data], {}) == TensorType((), "float32")
    assert get_op("variance").type_rel([data, TensorType((1, 3, 1))], {"axis": [0, 2]}) == TensorType((3,))


@pytest.mark.parametrize("name", sorted(REDUCTIONS) + ["argmax", "argmin", "variance", "std"])
def test_bad_axes_and_attrs(name):
    dtype = REDUCTIONS.get(name, (("float32",),))[0][-1]
    opdef = get_op(name)
    data = TensorType((2, 3), dtype)
    with pytest.raises(TypeInferenceError, match="axis 2 is out of range for rank 2"):
        opdef.type_rel([data], {"axis": 2})
    with pytest.raises(TypeInferenceError, match="given more than once"):
        opdef.type_rel([data], {"axis": [1, -1]})
    with pytest.raises(ShapeError, match="axis -3 is out of range"):
        opdef.shape_func({"axis": -3}, [(2, 3)])
    with pytest.raises(ShapeError, match="out of range"):
        opdef.kernel({"axis": 5}, np.ones((2, 3), dtype))
    with pytest.raises(AttrError, match="keepdims"):
        opdef.normalize_attrs({"keepdims": "yes"})
    with pytest.raises(AttrError, match="axis"):
        opdef.normalize_attrs({"axis": 1.5})
    with pytest.raises(AttrError, match="unknown attribute"):
        opdef.normalize_attrs({"axes": 1})
    assert opdef.pattern == OpPattern.COMM_REDUCE


@pytest.mark.parametrize("name, dtype", [("sum", "bool"), ("all", "float32"), ("logsumexp", "int32"),
                                         ("variance", "int32"), ("mean", "bool")])
def test_reduction_dtype_rules(name, dtype):
    with pytest.raises(TypeInferenceError, match=f"{name}: data must have"):
        get_op(name).type_rel([TensorType((2,), dtype)], {})
    with pytest.raises(ExecutionError, match=f"{name}: operand must have"):
        run_kernel(name, [np.ones((2,), dtype)])


def test_variance_argument_checks():
    rel = get_op("variance").type_rel
    with pytest.raises(TypeInferenceError, match="expected 1 or 2 arguments"):
        rel([TensorType((2,))] * 3, {})
    with pytest.raises(TypeInferenceError, match=r"mean of shape \(3,\) does not broadcast to data"):
        rel([TensorType((2, 4)), TensorType((3,))], {})
    with pytest.raises(TypeInferenceError, match="mean must have dtype float32"):
        rel([TensorType((2, 4)), TensorType((2, 1), "float64")], {})
    with pytest.raises(ShapeError, match="does not broadcast"):
        run_kernel("variance", [np.ones((2, 4), "float32"), np.ones((2, 3), "float32")])
    with pytest.raises(ShapeError, match="does not broadcast"):
        get_op("std").shape_func({}, [(2, 4), (5, 2, 4)])
