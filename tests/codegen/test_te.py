"""Tensor expressions: building, dtype rules, constant folding (against NumPy/Python arithmetic),
simplification, computes and reductions. No compiler needed."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorvm import te
from tensorvm.errors import ShapeError, TypeInferenceError
from tensorvm.te.expr import Binary, Const, Reduce, Select
from tensorvm.te.rewrite import substitute

INT64 = st.integers(-(2**40), 2**40)


def _value(expr):
    assert isinstance(expr, Const), f"expected a folded constant, got {expr!r}"
    return expr.value


@settings(max_examples=50, deadline=None)
@given(a=st.one_of(st.just(0), INT64), b=INT64.filter(lambda v: v != 0))
def test_integer_division_family_folds_like_python(a, b):
    assert _value(te.floordiv(a, b)) == a // b
    assert _value(te.floormod(a, b)) == a % b
    quotient = abs(a) // abs(b)
    assert _value(te.truncdiv(a, b)) == (-quotient if (a < 0) != (b < 0) else quotient)
    assert _value(te.truncmod(a, b)) == int(math.fmod(a, b))


@settings(max_examples=50, deadline=None)
@given(a=st.integers(-128, 127), b=st.integers(-128, 127), op=st.sampled_from(["add", "sub", "mul"]))
def test_narrow_integer_folding_wraps_like_numpy(a, b, op):
    x, y = te.const(a, "int8"), te.const(b, "int8")
    got = {"add": x + y, "sub": x - y, "mul": x * y}[op]
    with np.errstate(all="ignore"):
        expected = {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op](np.int8(a), np.int8(b))
    assert got.dtype == "int8" and _value(got) == int(expected)


@settings(max_examples=50, deadline=None)
@given(a=st.floats(-1e6, 1e6, width=32), b=st.floats(-1e6, 1e6, width=32))
def test_float32_folding_rounds_like_numpy(a, b):
    x, y = te.const(a, "float32"), te.const(b, "float32")
    assert _value(x * y) == float(np.float32(a) * np.float32(b))
    assert _value(x + y) == float(np.float32(a) + np.float32(b))
    if b != 0:
        assert _value(x / y) == float(np.float32(a) / np.float32(b))


def test_intrinsics_fold_like_numpy():
    assert _value(te.exp(te.const(1.0))) == float(np.exp(np.float32(1.0)))
    assert _value(te.round(te.const(2.5))) == 2.0  # half to even
    assert _value(te.round(te.const(-3.5))) == -4.0
    assert _value(te.sqrt(te.const(2.0, "float64"))) == math.sqrt(2.0)
    assert _value(te.isnan(te.const(math.nan))) is True
    assert _value(te.cast(te.const(3.9), "int32")) == 3
    assert _value(te.cast(te.const(300, "int32"), "uint8")) == 44
    assert _value(te.index_check(-2, 5)) == 3


def test_identities_simplify():
    n = te.var("n")
    assert (n + 0) is n and (n * 1) is n and (n - 0) is n
    assert _value(n * 0) == 0 and _value(n - n) == 0
    assert te.floordiv(n * 8, 4) == n * 2
    assert _value(te.floormod(n * 8, 4)) == 0
    assert ((n + 3) + 4) == n + 7
    assert te.select(te.const(True), n, n + 1) is n
    assert te.cast(n, "int64") is n
    assert te.minimum(n, n) is n
    assert _value(te.eq(n, n)) is True
    assert _value(te.logical_and(te.const(False), n > 2)) is False


def test_float_identities_that_are_not_exact_stay():
    x = te.var("x", "float32")
    assert isinstance(x * 0.0, Binary)  # NaN * 0 is NaN
    assert isinstance(x + 0.0, Binary)  # -0.0 + 0.0 is +0.0


def test_structural_equality_and_variable_identity():
    n, m = te.var("n"), te.var("n")
    assert n != m and (n + 1) == (n + 1) and hash(n + 1) == hash(n + 1)
    assert (n + 1) != (m + 1)


def test_dtype_rules():
    f32, f64 = te.var("a", "float32"), te.var("b", "float64")
    with pytest.raises(TypeInferenceError, match="float32 and float64"):
        _ = f32 + f64
    i32, i64 = te.var("i", "int32"), te.var("j", "int64")
    assert (i32 + i64).dtype == "int64"
    assert (f32 + 1).dtype == "float32"
    with pytest.raises(TypeInferenceError, match="true division"):
        _ = i64 / 2
    with pytest.raises(TypeInferenceError, match="non-integral"):
        _ = i64 + 1.5
    with pytest.raises(TypeInferenceError, match="bool"):
        te.logical_and(i64, i64)
    assert (i64 & 3).op == "bitand" and ((i64 > 1) & (i64 < 3)).op == "and"
    with pytest.raises(TypeError, match="truth value"):
        bool(i64 > 0)
    with pytest.raises(TypeInferenceError, match="unknown intrinsic"):
        te.expr.call("cotanh", f32)
    with pytest.raises(TypeInferenceError, match="not defined for int64"):
        te.exp(i64)


def test_substitute_resimplifies():
    i, n = te.var("i"), te.var("n")
    expr = te.floordiv(i * 4 + n, 4)
    assert _value(substitute(expr, {i: te.const(2), n: te.const(3)})) == 2
    cond = te.select(i < n, i, n)
    assert substitute(cond, {i: te.const(0), n: te.const(5)}) == te.const(0)


def test_compute_and_reductions():
    n = te.var("n")
    x = te.placeholder((n, 4), "float32", "x")
    y = te.compute((n, 4), lambda row, col: x[row, col] * 2.0, "y")
    assert [a.var.name for a in y.op.axes] == ["row", "col"] and y.dtype == "float32"
    k = te.reduce_axis(4, "k")
    s = te.compute((n,), lambda i: te.sum(x[i, k], axis=k), "s")
    assert isinstance(s.op.bodies[0], Reduce) and s.op.is_reduction
    idx, val = te.compute((n,), lambda i: te.argmax(x[i, k], axis=k), "am")
    assert idx.dtype == "int64" and val.dtype == "float32" and idx.op is val.op
    h = te.placeholder((n,), "float16", "h")
    assert te.sum(h[k], axis=k).acc_dtype == "float32"


def test_compute_errors():
    x = te.placeholder((3, 4), "float32", "x")
    k = te.reduce_axis(4)
    with pytest.raises(TypeInferenceError, match="whole body"):
        te.compute((3,), lambda i: te.sum(x[i, k], axis=k) * 2.0)
    with pytest.raises(TypeInferenceError, match="rank 2"):
        te.compute((3,), lambda i: x[i])
    with pytest.raises(ShapeError, match="never fits"):
        te.compute((3,), lambda i: x[i, 0], requires=[(te.const(1) > 2, "never fits")])
    with pytest.raises(TypeInferenceError, match="reduce_axis"):
        te.sum(x[0, 0], axis=te.var("i"))
    with pytest.raises(TypeInferenceError, match=">= 0"):
        te.placeholder((-1,))


def test_select_is_lazy_and_flips_negated_conditions():
    i = te.var("i")
    s = te.select(te.logical_not(i < 3), i, i + 1)
    assert isinstance(s, Select) and s.true_value == i + 1
