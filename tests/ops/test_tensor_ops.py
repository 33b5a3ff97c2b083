"""Elementwise, broadcasting, comparison, logic, bitwise, where, clip and cast ops (tensorvm/op/tensor.py).

Oracles are Python scalar arithmetic applied per element (``op_testing.elementwise``), with C
wraparound for integers, so they are independent of the NumPy kernels they check.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from op_testing import (
    ALL,
    ATOL,
    FLOATS,
    INTS,
    NUMERIC,
    RTOL,
    arrays_of,
    broadcast_shapes,
    check_op,
    elementwise,
    run_kernel,
    shapes,
)

from tensorvm.errors import AttrError, ExecutionError, ShapeError, TypeInferenceError
from tensorvm.ir.expr import Var
from tensorvm.ir.types import Any, SymDim, TensorType, TupleType
from tensorvm.op import get_op, make_call
from tensorvm.op.registry import OpPattern

SETTINGS = settings(max_examples=25, deadline=None)


# ---- oracles --------------------------------------------------------------------------------------


def trunc_div(a, b):
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


def trunc_mod(a, b):
    return a - trunc_div(a, b) * b


def int_power(a, b):
    if b >= 0:
        return a**b
    return int(Fraction(1, a ** -b))  # int() of a Fraction truncates toward zero


def float_power(a, b):
    if a == 0 and b < 0:  # IEEE pow: a pole, signed for odd integer exponents
        odd = b.is_integer() and int(b) % 2 == 1
        return math.copysign(math.inf, a) if odd else math.inf
    try:
        return math.pow(a, b)
    except ValueError:  # a negative base to a fractional power
        return math.nan
    except OverflowError:
        return math.inf


def float_mod(a, b):
    return math.fmod(a, b)


def float_floor_mod(a, b):
    return a % b


def float_floor_divide(a, b):
    return a // b


# name -> (dtypes, int oracle, float oracle, nonzero divisor needed)
ARITHMETIC = {
    "add": (NUMERIC, lambda a, b: a + b, lambda a, b: a + b, False),
    "subtract": (NUMERIC, lambda a, b: a - b, lambda a, b: a - b, False),
    "multiply": (NUMERIC, lambda a, b: a * b, lambda a, b: a * b, False),
    "divide": (NUMERIC, trunc_div, lambda a, b: a / b, True),
    "floor_divide": (NUMERIC, lambda a, b: a // b, float_floor_divide, True),
    "mod": (NUMERIC, trunc_mod, float_mod, True),
    "floor_mod": (NUMERIC, lambda a, b: a % b, float_floor_mod, True),
    "maximum": (ALL, max, max, False),
    "minimum": (ALL, min, min, False),
}

COMPARISONS = {
    "equal": lambda a, b: a == b, "not_equal": lambda a, b: a != b, "less": lambda a, b: a < b,
    "less_equal": lambda a, b: a <= b, "greater": lambda a, b: a > b, "greater_equal": lambda a, b: a >= b,
}

LOGICAL = {
    "logical_and": lambda a, b: a and b, "logical_or": lambda a, b: a or b, "logical_xor": lambda a, b: a != b,
}

BITWISE = {"bitwise_and": lambda a, b: a & b, "bitwise_or": lambda a, b: a | b, "bitwise_xor": lambda a, b: a ^ b}


def _exact_floats(dtype):
    """Multiples of 1/4 in [-8, 8]: every quotient, remainder and product is exact in any float dtype."""
    return st.integers(-32, 32).map(lambda n: n / 4)


# ---- binary arithmetic ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ARITHMETIC))
@SETTINGS
@given(data=st.data())
def test_binary_arithmetic_matches_python(name, data):
    dtypes, int_oracle, float_oracle, nonzero = ARITHMETIC[name]
    dtype = data.draw(st.sampled_from(dtypes), "dtype")
    shape_a, shape_b = data.draw(broadcast_shapes(), "shapes")
    kind = np.dtype(dtype).kind
    values = _exact_floats(dtype) if kind == "f" else None
    a = data.draw(arrays_of(dtype, shape_a, values=values), "a")
    divisor_values = values
    if nonzero:
        base = values if kind == "f" else st.integers(*_int_range(dtype))
        divisor_values = base.filter(lambda v: v != 0)
    b = data.draw(arrays_of(dtype, shape_b, values=divisor_values), "b")
    oracle = float_oracle if kind == "f" else int_oracle
    expected = elementwise(oracle, a, b, dtype=dtype)
    check_op(name, [a, b], expected=expected)


def _int_range(dtype):
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


@SETTINGS
@given(data=st.data())
def test_power_matches_python(data):
    dtype = data.draw(st.sampled_from(NUMERIC), "dtype")
    shape_a, shape_b = data.draw(broadcast_shapes(), "shapes")
    if np.dtype(dtype).kind == "f":
        a = data.draw(arrays_of(dtype, shape_a, -4, 4), "a")
        b = data.draw(arrays_of(dtype, shape_b, -3, 3), "b")
        expected = elementwise(float_power, a, b, dtype=dtype)
        check_op("power", [a, b], expected=expected, rtol=RTOL[dtype] * 4, atol=ATOL[dtype])
    else:
        low = -5 if np.dtype(dtype).kind == "i" else 0
        a = data.draw(arrays_of(dtype, shape_a, values=st.integers(low, 20).filter(lambda v: v != 0)), "a")
        b = data.draw(arrays_of(dtype, shape_b, values=st.integers(-3 if low else 0, 40)), "b")
        check_op("power", [a, b], expected=elementwise(int_power, a, b, dtype=dtype))


def test_integer_division_family_truncates_or_floors_by_hand():
    a = np.array([7, -7, 7, -7, 6], "int32")
    b = np.array([2, 2, -2, -2, 3], "int32")
    assert run_kernel("divide", [a, b]).tolist() == [3, -3, -3, 3, 2]
    assert run_kernel("mod", [a, b]).tolist() == [1, -1, 1, -1, 0]
    assert run_kernel("floor_divide", [a, b]).tolist() == [3, -4, -4, 3, 2]
    assert run_kernel("floor_mod", [a, b]).tolist() == [1, 1, -1, -1, 0]
    # float mod keeps the dividend's sign, floor_mod the divisor's
    assert run_kernel("mod", [np.float32([-7.5]), np.float32([2])]).tolist() == [-1.5]
    assert run_kernel("floor_mod", [np.float32([-7.5]), np.float32([2])]).tolist() == [0.5]


def test_integer_division_by_zero_is_a_clear_error_and_float_division_is_ieee():
    for name in ("divide", "floor_divide", "mod", "floor_mod"):
        with pytest.raises(ExecutionError, match=f"{name}: integer division by zero"):
            run_kernel(name, [np.array([1, 2], "int32"), np.array([1, 0], "int32")])
        # an empty result divides nothing
        assert run_kernel(name, [np.zeros((0,), "int32"), np.zeros((1,), "int32")]).shape == (0,)
    with pytest.raises(ExecutionError, match="zero raised to a negative power"):
        run_kernel("power", [np.array([0], "int32"), np.array([-1], "int32")])
    quotient = run_kernel("divide", [np.float32([1, -1, 0]), np.float32([0, 0, 0])])
    assert quotient[0] == np.inf and quotient[1] == -np.inf and np.isnan(quotient[2])


def test_integer_arithmetic_wraps_like_c():
    big = np.array([2**31 - 1], "int32")
    assert run_kernel("add", [big, np.array([1], "int32")]).tolist() == [-(2**31)]
    assert run_kernel("multiply", [np.array([200], "uint8"), np.array([2], "uint8")]).tolist() == [144]
    assert run_kernel("divide", [np.array([-(2**31)], "int32"), np.array([-1], "int32")]).dtype == np.int32


def test_maximum_minimum_propagate_nan():
    out = run_kernel("maximum", [np.float32([np.nan, 1]), np.float32([0, np.nan])])
    assert np.isnan(out).all()
    out = run_kernel("minimum", [np.float32([np.nan, 1]), np.float32([0, np.nan])])
    assert np.isnan(out).all()


# ---- comparisons, logic, bits ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(COMPARISONS))
@SETTINGS
@given(data=st.data())
def test_comparisons_give_bool(name, data):
    dtype = data.draw(st.sampled_from(ALL), "dtype")
    shape_a, shape_b = data.draw(broadcast_shapes(), "shapes")
    # A small value range makes equal elements common.
    low, high = (-2, 2) if dtype != "bool" else (None, None)
    a = data.draw(arrays_of(dtype, shape_a, low, high), "a")
    b = data.draw(arrays_of(dtype, shape_b, low, high), "b")
    check_op(name, [a, b], expected=elementwise(COMPARISONS[name], a, b, dtype="bool"))


def test_comparisons_with_nan_are_false_except_not_equal():
    nan, one = np.float64([np.nan]), np.float64([1.0])
    for name in COMPARISONS:
        assert run_kernel(name, [nan, one]).tolist() == [name == "not_equal"]


@pytest.mark.parametrize("name", sorted(LOGICAL) + sorted(BITWISE))
@SETTINGS
@given(data=st.data())
def test_logical_and_bitwise(name, data):
    dtypes = ("bool",) if name in LOGICAL else ("bool",) + INTS
    dtype = data.draw(st.sampled_from(dtypes), "dtype")
    shape_a, shape_b = data.draw(broadcast_shapes(), "shapes")
    a = data.draw(arrays_of(dtype, shape_a), "a")
    b = data.draw(arrays_of(dtype, shape_b), "b")
    fn = LOGICAL.get(name) or BITWISE[name]
    expected = elementwise(fn, a, b, dtype=dtype)
    check_op(name, [a, b], expected=expected)


@pytest.mark.parametrize("name", ["left_shift", "right_shift"])
@SETTINGS
@given(data=st.data())
def test_shifts(name, data):
    dtype = data.draw(st.sampled_from(INTS), "dtype")
    shape_a, shape_b = data.draw(broadcast_shapes(), "shapes")
    bits = np.dtype(dtype).itemsize * 8
    a = data.draw(arrays_of(dtype, shape_a), "a")
    b = data.draw(arrays_of(dtype, shape_b, values=st.integers(0, bits - 1)), "b")
    fn = (lambda x, s: x << s) if name == "left_shift" else (lambda x, s: x >> s)
    check_op(name, [a, b], expected=elementwise(fn, a, b, dtype=dtype))


# ---- unary ----------------------------------------------------------------------------------------


def _sigmoid(x):
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


# name -> (low, high, Python oracle) for float-only ops
TRANSCENDENTAL = {
    "exp": (-10, 10, math.exp),
    "log": (0.01, 100, math.log),
    "log2": (0.01, 100, math.log2),
    "log10": (0.01, 100, math.log10),
    "log1p": (-0.99, 100, math.log1p),
    "asin": (-1, 1, math.asin),
    "acos": (-1, 1, math.acos),
    "atan": (-50, 50, math.atan),
    "sinh": (-10, 10, math.sinh),
    "cosh": (-10, 10, math.cosh),
    "asinh": (-50, 50, math.asinh),
    "acosh": (1, 100, math.acosh),
    "atanh": (-0.99, 0.99, math.atanh),
    "sqrt": (0, 100, math.sqrt),
    "rsqrt": (0.01, 100, lambda x: 1 / math.sqrt(x)),
    "tanh": (-10, 10, math.tanh),
    "sigmoid": (-30, 30, _sigmoid),
    "erf": (-4, 4, math.erf),
    "sin": (-10, 10, math.sin),
    "cos": (-10, 10, math.cos),
    "tan": (-1.5, 1.5, math.tan),
}


@pytest.mark.parametrize("name", sorted(TRANSCENDENTAL))
@SETTINGS
@given(data=st.data())
def test_float_unary_matches_math(name, data):
    low, high, fn = TRANSCENDENTAL[name]
    dtype = data.draw(st.sampled_from(FLOATS), "dtype")
    x = data.draw(arrays_of(dtype, shapes(), low, high), "x")
    check_op(name, [x], expected=elementwise(fn, x, dtype=dtype), rtol=RTOL[dtype], atol=ATOL[dtype])


def _sign(x):
    return (x > 0) - (x < 0)


# name -> Python oracle for ops on every numeric dtype
NUMERIC_UNARY = {
    "negative": lambda x: -x,
    "abs": abs,
    "sign": _sign,
    "floor": math.floor,
    "ceil": math.ceil,
    "round": round,  # Python rounds half to even
    "trunc": math.trunc,
}


@pytest.mark.parametrize("name", sorted(NUMERIC_UNARY))
@SETTINGS
@given(data=st.data())
def test_numeric_unary_matches_python(name, data):
    dtype = data.draw(st.sampled_from(NUMERIC), "dtype")
    values = st.integers(-40, 40).map(lambda n: n / 4) if np.dtype(dtype).kind == "f" else None  # halves tie
    x = data.draw(arrays_of(dtype, shapes(), values=values), "x")
    check_op(name, [x], expected=elementwise(NUMERIC_UNARY[name], x, dtype=dtype))


def test_round_is_half_to_even_and_unary_handles_specials():
    x = np.float32([0.5, 1.5, 2.5, -0.5, -2.5])
    assert run_kernel("round", [x]).tolist() == [0, 2, 2, -0, -2]
    assert run_kernel("sigmoid", [np.float32([-1000, 1000])]).tolist() == [0, 1]
    assert np.isnan(run_kernel("log", [np.float32([-1])]))[0]
    assert run_kernel("rsqrt", [np.float64([0])]).tolist() == [np.inf]
    assert run_kernel("erf", [np.float16([np.inf, -np.inf])]).tolist() == [1, -1]


@pytest.mark.parametrize("name, fn", [("isnan", math.isnan), ("isinf", math.isinf), ("isfinite", math.isfinite)])
@SETTINGS
@given(data=st.data())
def test_float_classification(name, fn, data):
    dtype = data.draw(st.sampled_from(NUMERIC), "dtype")
    x = data.draw(arrays_of(dtype, shapes(), special=True), "x")
    check_op(name, [x], expected=elementwise(lambda v: fn(float(v)), x, dtype="bool"))


@SETTINGS
@given(data=st.data())
def test_logical_not_and_bitwise_not(data):
    x = data.draw(arrays_of("bool", shapes()), "x")
    check_op("logical_not", [x], expected=elementwise(lambda v: not v, x, dtype="bool"))
    dtype = data.draw(st.sampled_from(("bool",) + INTS), "dtype")
    y = data.draw(arrays_of(dtype, shapes()), "y")
    fn = (lambda v: not v) if dtype == "bool" else (lambda v: ~v)
    check_op("bitwise_not", [y], expected=elementwise(fn, y, dtype=dtype))


# ---- where, clip, cast ----------------------------------------------------------------------------


@SETTINGS
@given(data=st.data())
def test_where_broadcasts_three_ways(data):
    shape_c, shape_x, shape_y = data.draw(broadcast_shapes(3), "shapes")
    dtype = data.draw(st.sampled_from(ALL), "dtype")
    cond_dtype = data.draw(st.sampled_from(("bool", "int32", "float32")), "condition dtype")
    cond = data.draw(arrays_of(cond_dtype, shape_c, -1, 1), "condition")
    x = data.draw(arrays_of(dtype, shape_x), "x")
    y = data.draw(arrays_of(dtype, shape_y), "y")
    expected = elementwise(lambda c, a, b: a if c else b, cond, x, y, dtype=dtype)
    check_op("where", [cond, x, y], expected=expected)


@SETTINGS
@given(data=st.data())
def test_clip_matches_clamp_then_cast(data):
    dtype = data.draw(st.sampled_from(NUMERIC), "dtype")
    x = data.draw(arrays_of(dtype, shapes()), "x")
    a_min = data.draw(st.floats(-200, 200), "a_min")
    a_max = data.draw(st.floats(a_min, 300), "a_max")

    if np.dtype(dtype).kind == "f":  # the bounds are rounded to the dtype first, as in TVM
        with np.errstate(over="ignore"):
            lo, hi = (float(np.asarray(v).astype(dtype)) for v in (a_min, a_max))

        def clamp(v):
            return min(max(float(v), lo), hi)
    else:  # clamp exactly, truncate as a C conversion does; bounds beyond the dtype saturate
        info = np.iinfo(dtype)

        def clamp(v):
            return min(max(math.trunc(min(max(v, a_min), a_max)), int(info.min)), int(info.max))

    attrs = {"a_min": a_min, "a_max": a_max}
    check_op("clip", [x], attrs, expected=elementwise(clamp, x, dtype=dtype))


def test_clip_saturates_integer_bounds_and_rejects_inverted_bounds():
    x = np.array([0, 100, 255], "uint8")
    assert run_kernel("clip", [x], {"a_min": -1e9, "a_max": 1e9}).tolist() == [0, 100, 255]
    assert run_kernel("clip", [x], {"a_min": 10.7, "a_max": 99.9}).tolist() == [10, 99, 99]
    with pytest.raises(AttrError, match="a_min .* must not exceed a_max"):
        run_kernel("clip", [x], {"a_min": 3, "a_max": 1})
    with pytest.raises(AttrError, match="a_min"):
        get_op("clip").type_rel([TensorType((3,), "uint8")], {"a_min": 3, "a_max": 1})
    with pytest.raises(AttrError, match="missing required attribute 'a_max'"):
        get_op("clip").normalize_attrs({"a_min": 0})


def _python_cast(value, dtype):
    kind = np.dtype(dtype).kind
    if kind == "b":
        return bool(value)
    if kind in "iu":
        return math.trunc(value)
    return float(value)


@SETTINGS
@given(data=st.data())
def test_cast_and_cast_like(data):
    source = data.draw(st.sampled_from(ALL), "source dtype")
    target = data.draw(st.sampled_from(ALL), "target dtype")
    # values representable in every dtype (0..100), so the conversion is defined in C
    low, high = (None, None) if source == "bool" else (0, 100)
    x = data.draw(arrays_of(source, shapes(), low, high), "x")
    expected = elementwise(lambda v: _python_cast(v, target), x, dtype=target)
    check_op("cast", [x], {"dtype": target}, expected=expected)
    like = np.zeros((2,), target)
    check_op("cast_like", [x, like], expected=expected)


@SETTINGS
@given(data=st.data())
def test_reinterpret_reads_the_same_bytes_as_another_dtype_of_the_width(data):
    source = data.draw(st.sampled_from(NUMERIC), "source dtype")
    width = np.dtype(source).itemsize
    target = data.draw(st.sampled_from([d for d in NUMERIC if np.dtype(d).itemsize == width]), "target dtype")
    x = data.draw(arrays_of(source, shapes()), "x")
    raw = x.tobytes()  # (the oracle: the bytes themselves, read back as the target)
    expected = np.frombuffer(raw, dtype=target).reshape(x.shape) if x.size else np.zeros(x.shape, target)
    got = check_op("reinterpret", [x], {"dtype": target})
    assert got.tobytes() == expected.tobytes()


def test_reinterpret_refuses_other_widths_and_non_bool_to_bool():
    with pytest.raises(TypeInferenceError, match="the widths must be equal"):
        get_op("reinterpret").type_rel([TensorType((3,), "float32")], {"dtype": "int64"})
    with pytest.raises(TypeInferenceError, match="as bool"):
        get_op("reinterpret").type_rel([TensorType((3,), "uint8")], {"dtype": "bool"})
    assert get_op("reinterpret").type_rel([TensorType((3,), "bool")], {"dtype": "uint8"}) == TensorType((3,), "uint8")


# ---- broadcasting, dtype rules, Any -----------------------------------------------------------------

BINARY_OPS = sorted(ARITHMETIC) + ["power"] + sorted(COMPARISONS) + sorted(LOGICAL) + sorted(BITWISE) + [
    "left_shift", "right_shift"]


def _dtype_for(name):
    if name in LOGICAL:
        return "bool"
    if name in BITWISE or name in ("left_shift", "right_shift"):
        return "int32"
    return "float32"


@pytest.mark.parametrize("name", BINARY_OPS)
def test_broadcast_mismatch_is_a_type_error_statically_and_a_shape_error_at_run_time(name):
    opdef = get_op(name)
    dtype = _dtype_for(name)
    with pytest.raises(TypeInferenceError, match=f"{name}: cannot broadcast dimensions 4 and 3"):
        opdef.type_rel([TensorType((2, 4), dtype), TensorType((3,), dtype)], {})
    with pytest.raises(ShapeError, match=r"cannot broadcast shapes \(2, 4\) and \(3,\)"):
        opdef.shape_func({}, [(2, 4), (3,)])
    with pytest.raises(ShapeError, match="cannot broadcast"):
        opdef.kernel({}, np.ones((2, 4), dtype), np.ones((3,), dtype))


@pytest.mark.parametrize("name", BINARY_OPS)
def test_binary_ops_reject_mixed_dtypes(name):
    dtype = _dtype_for(name)
    other = "int64" if dtype != "int64" else "int32"
    with pytest.raises(TypeInferenceError, match="one dtype"):
        get_op(name).type_rel([TensorType((2,), dtype), TensorType((2,), other)], {})
    with pytest.raises(ExecutionError, match="one dtype"):
        run_kernel(name, [np.ones((2,), dtype), np.ones((2,), other)])


def test_any_and_symbolic_dims_flow_through_broadcast():
    rel = get_op("add").type_rel
    assert rel([TensorType((Any(), Any()), "float32"), TensorType((1, 8), "float32")], {}) == TensorType(
        (Any(), 8), "float32")
    n = SymDim("n")
    assert rel([TensorType((n, 1)), TensorType((4,))], {}) == TensorType((n, 4))
    assert rel([TensorType((n, 3)), TensorType((n, 3))], {}) == TensorType((n, 3))
    assert rel([TensorType((n,)), TensorType((SymDim("m"),))], {}).shape == (Any(),)
    assert get_op("less").type_rel([TensorType((Any(),), "int8"), TensorType((), "int8")], {}) == TensorType(
        (Any(),), "bool")
    where = get_op("where").type_rel([TensorType((Any(), 1), "bool"), TensorType((5,)), TensorType(())], {})
    assert where == TensorType((Any(), 5))


@pytest.mark.parametrize("name, dtype, expected", [
    ("exp", "int32", "a float dtype"), ("sqrt", "bool", "a float dtype"),
    ("add", "bool", "a numeric"), ("logical_and", "int32", "bool"), ("bitwise_or", "float32", "an integer or bool"),
    ("left_shift", "bool", "an integer dtype"), ("negative", "bool", "a numeric"),
])
def test_dtype_rules_are_enforced_with_a_clear_message(name, dtype, expected):
    opdef = get_op(name)
    types = [TensorType((2,), dtype)] * (opdef.num_inputs)
    with pytest.raises(TypeInferenceError, match=f"{name}: .*must have {expected}.*got {dtype}"):
        opdef.type_rel(types, {})
    with pytest.raises(ExecutionError, match=f"{name}: operand must have {expected}"):
        run_kernel(name, [np.ones((2,), dtype)] * opdef.num_inputs)


def test_non_tensor_arguments_and_bad_attrs_are_rejected():
    with pytest.raises(TypeInferenceError, match="add: expected a tensor argument 0"):
        get_op("add").type_rel([TupleType(()), TensorType(())], {})
    with pytest.raises(TypeInferenceError, match="expected 2 argument"):
        get_op("add").type_rel([TensorType(())], {})
    with pytest.raises(AttrError, match="unknown attribute"):
        get_op("add").normalize_attrs({"axis": 1})
    with pytest.raises(AttrError, match="dtype"):
        get_op("cast").normalize_attrs({"dtype": "complex64"})
    with pytest.raises(AttrError, match="a_min"):
        make_call("clip", Var("x", TensorType((2,))), a_min="low", a_max=1.0)


def test_patterns():
    assert get_op("add").pattern == OpPattern.BROADCAST
    assert get_op("where").pattern == OpPattern.BROADCAST
    for name in list(TRANSCENDENTAL) + list(NUMERIC_UNARY) + ["clip", "cast", "cast_like", "isnan"]:
        assert get_op(name).pattern == OpPattern.ELEMWISE, name


def test_zero_dim_results_are_arrays_of_the_right_dtype():
    for name, args in [("add", [np.int8(3), np.int8(4)]), ("exp", [np.float16(1)]), ("less", [np.int64(1)] * 2)]:
        out = run_kernel(name, [np.asarray(a) for a in args])
        assert isinstance(out, np.ndarray) and out.shape == ()
    assert run_kernel("exp", [np.asarray(np.float16(1))]).dtype == np.float16

