"""Converters of ONNX elementwise ops: arithmetic, activations, comparisons and logic, casts, constants.

Before opset 7 binary ops broadcast only with ``broadcast=1`` (the second operand aligned at
``axis``); from opset 7 on they broadcast like NumPy, which is what tensorvm's ops do.
"""

from __future__ import annotations

import numpy as np

from ..errors import TypeInferenceError, UnsupportedError
from .onnx_context import ONNX_DTYPES, converter, onnx_dtype

# ---- helpers ---------------------------------------------------------------------------------------


def scalar_like(ctx, x, value):
    """A 0-d constant of x's dtype."""
    return ctx.constant(np.array(value, dtype=ctx.dtype(x)))


def _same_dtype(ctx, name, *xs):
    dtypes = {ctx.dtype(x) for x in xs}
    if len(dtypes) > 1:
        raise TypeInferenceError(f"{name}: inputs must have one dtype, got {', '.join(ctx.dtype(x) for x in xs)}")


def _legacy_broadcast(ctx, A, B, broadcast, axis):
    """Opset < 7: B broadcasts to A only with broadcast=1, aligned at ``axis`` (default: the trailing dims)."""
    if not broadcast:
        return B
    a_ndim, b_ndim = ctx.ndim(A), ctx.ndim(B)
    if axis is None or b_ndim == 0:
        return B
    axis = axis % a_ndim if a_ndim else 0
    trailing = a_ndim - axis - b_ndim
    if trailing > 0:
        B = ctx.call("expand_dims", B, axis=b_ndim, num_newaxis=trailing)
    return B


def _binary(op_name):
    def legacy(ctx, A, B, *, broadcast=0, axis=None, consumed_inputs=None):
        _same_dtype(ctx, op_name, A, B)
        return ctx.call(op_name, A, _legacy_broadcast(ctx, A, B, broadcast, axis))

    def modern(ctx, A, B):
        _same_dtype(ctx, op_name, A, B)
        return ctx.call(op_name, A, B)

    return legacy, modern


add_1, add_7 = _binary("add")
converter("Add", 1)(add_1)
converter("Add", 7)(add_7)
sub_1, sub_7 = _binary("subtract")
converter("Sub", 1)(sub_1)
converter("Sub", 7)(sub_7)
mul_1, mul_7 = _binary("multiply")
converter("Mul", 1)(mul_1)
converter("Mul", 7)(mul_7)
div_1, div_7 = _binary("divide")
converter("Div", 1)(div_1)
converter("Div", 7)(div_7)


@converter("Pow", 1)
def pow_1(ctx, X, Y, *, broadcast=0, axis=None):
    return pow_7(ctx, X, _legacy_broadcast(ctx, X, Y, broadcast, axis))


@converter("Pow", 7)
def pow_7(ctx, X, Y):
    # From opset 12 the exponent may have another dtype; the result has the base's. The power is taken in
    # the operands' common dtype (the reference's np.power(x, y).astype(x.dtype)): an integer base to a
    # float exponent is computed in float, not with the exponent truncated to an integer.
    base = ctx.dtype(X)
    common = np.result_type(base, ctx.dtype(Y)).name
    if common == base:
        return ctx.call("power", X, ctx.cast(Y, base))
    return ctx.cast(ctx.call("power", ctx.cast(X, common), ctx.cast(Y, common)), base)


def _unary(op_type, op_name, *versions):
    def convert(ctx, X, *, consumed_inputs=None):
        return ctx.call(op_name, X)

    convert.__name__ = f"{op_type.lower()}_{versions[0]}"
    converter(op_type, *versions)(convert)
    return convert


for _op_type, _op_name in [
    ("Neg", "negative"), ("Abs", "abs"), ("Sqrt", "sqrt"), ("Exp", "exp"), ("Log", "log"), ("Erf", "erf"),
    ("Tanh", "tanh"), ("Sigmoid", "sigmoid"), ("Relu", "nn.relu"), ("Floor", "floor"), ("Ceil", "ceil"),
    ("Round", "round"), ("Sign", "sign"), ("Sin", "sin"), ("Cos", "cos"), ("Tan", "tan"), ("Asin", "asin"),
    ("Acos", "acos"), ("Atan", "atan"), ("Sinh", "sinh"), ("Cosh", "cosh"), ("Asinh", "asinh"), ("Acosh", "acosh"),
    ("Atanh", "atanh"), ("Not", "logical_not"), ("IsNaN", "isnan"), ("BitwiseNot", "bitwise_not"),
]:
    _unary(_op_type, _op_name, 1)


@converter("Reciprocal", 1)
def reciprocal_1(ctx, X, *, consumed_inputs=None):
    return ctx.call("divide", scalar_like(ctx, X, 1), X)


@converter("LeakyRelu", 1)
def leaky_relu_1(ctx, X, *, alpha=0.01, consumed_inputs=None):
    return ctx.call("nn.leaky_relu", X, alpha=float(alpha))


@converter("Elu", 1)
def elu_1(ctx, X, *, alpha=1.0, consumed_inputs=None):
    zero = scalar_like(ctx, X, 0)
    negative = ctx.call("multiply", scalar_like(ctx, X, alpha),
                        ctx.call("subtract", ctx.call("exp", X), scalar_like(ctx, X, 1)))
    return ctx.call("where", ctx.call("greater", X, zero), X, negative)


@converter("Selu", 1)
def selu_1(ctx, X, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875, consumed_inputs=None):
    return ctx.call("multiply", scalar_like(ctx, X, gamma), elu_1(ctx, X, alpha=alpha))


@converter("Celu", 12)
def celu_12(ctx, X, *, alpha=1.0):
    scaled = ctx.call("divide", X, scalar_like(ctx, X, alpha))
    return elu_1(ctx, X, alpha=alpha) if alpha == 1.0 else ctx.call(
        "add", ctx.call("maximum", X, scalar_like(ctx, X, 0)),
        ctx.call("minimum", scalar_like(ctx, X, 0),
                 ctx.call("multiply", scalar_like(ctx, X, alpha),
                          ctx.call("subtract", ctx.call("exp", scaled), scalar_like(ctx, X, 1)))))


@converter("ThresholdedRelu", 10)
def thresholded_relu_10(ctx, X, *, alpha=1.0):
    return ctx.call("where", ctx.call("greater", X, scalar_like(ctx, X, alpha)), X, scalar_like(ctx, X, 0))


@converter("Shrink", 9)
def shrink_9(ctx, input, *, bias=0.0, lambd=0.5):  # noqa: A002 - the ONNX input's name
    x = input
    lower = ctx.call("less", x, scalar_like(ctx, x, -lambd))
    upper = ctx.call("greater", x, scalar_like(ctx, x, lambd))
    zero = scalar_like(ctx, x, 0)
    return ctx.call("where", lower, ctx.call("add", x, scalar_like(ctx, x, bias)),
                    ctx.call("where", upper, ctx.call("subtract", x, scalar_like(ctx, x, bias)), zero))


@converter("Softsign", 1)
def softsign_1(ctx, input):  # noqa: A002
    return ctx.call("divide", input, ctx.call("add", ctx.call("abs", input), scalar_like(ctx, input, 1)))


@converter("Gelu", 20)
def gelu_20(ctx, X, *, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise UnsupportedError(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return ctx.call("nn.gelu", X, approximate=approximate)


@converter("HardSigmoid", 1)
def hard_sigmoid_1(ctx, X, *, alpha=0.2, beta=0.5, consumed_inputs=None):
    linear = ctx.call("add", ctx.call("multiply", X, scalar_like(ctx, X, alpha)), scalar_like(ctx, X, beta))
    return ctx.call("minimum", ctx.call("maximum", linear, scalar_like(ctx, X, 0)), scalar_like(ctx, X, 1))


@converter("HardSwish", 14)
def hard_swish_14(ctx, X):
    return ctx.call("multiply", X, hard_sigmoid_1(ctx, X, alpha=1 / 6, beta=0.5))


@converter("Softplus", 1)
def softplus_1(ctx, X):
    """log(1 + exp(x)) as max(x, 0) + log1p(exp(-|x|)): the same function, whose exp never overflows
    (float32's exp(x) is inf from x = 88.7 on, where softplus is x) and exact where it is tiny."""
    tail = ctx.call("exp", ctx.call("negative", ctx.call("abs", X)))
    return ctx.call("add", ctx.call("maximum", X, scalar_like(ctx, X, 0)), ctx.call("log1p", tail))


@converter("Mish", 18)
def mish_18(ctx, X):
    return ctx.call("multiply", X, ctx.call("tanh", softplus_1(ctx, X)))


@converter("BitShift", 11)
def bit_shift_11(ctx, X, Y, *, direction):
    if direction not in ("LEFT", "RIGHT"):
        raise UnsupportedError(f"BitShift: direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    return ctx.call("left_shift" if direction == "LEFT" else "right_shift", X, Y)


@converter("PRelu", 1)
def prelu_1(ctx, X, slope, *, consumed_inputs=None):
    if ctx.ndim(slope) == 1 and ctx.ndim(X) >= 2 and ctx.shape(slope)[0] != 1:
        # Opset < 7 style (and torch's): one slope per channel, the dim after the batch.
        slope_shape, x_shape = ctx.shape(slope), ctx.shape(X)
        if x_shape[-1] != slope_shape[0] or x_shape[1] == slope_shape[0]:
            slope = ctx.call("expand_dims", slope, axis=1, num_newaxis=ctx.ndim(X) - 2)
    return prelu_7(ctx, X, slope)


@converter("PRelu", 7)
def prelu_7(ctx, X, slope):
    zero = scalar_like(ctx, X, 0)
    return ctx.call("where", ctx.call("less", X, zero), ctx.call("multiply", X, slope), X)


def _bound(ctx, x, value):
    return scalar_like(ctx, x, value)


@converter("Clip", 1)
def clip_1(ctx, input, *, max=3.4028234663852886e38, min=-3.4028234663852886e38, consumed_inputs=None):  # noqa: A002
    out = ctx.call("maximum", input, _bound(ctx, input, min))
    return ctx.call("minimum", out, _bound(ctx, input, max))


@converter("Clip", 11)
def clip_11(ctx, input, min=None, max=None):  # noqa: A002
    out = input
    if min is not None:
        out = ctx.call("maximum", out, ctx.cast(min, ctx.dtype(input)))
    if max is not None:
        out = ctx.call("minimum", out, ctx.cast(max, ctx.dtype(input)))
    return out if out is not input else ctx.call("copy", input)


def _variadic(op_name):
    def convert(ctx, *data_0, consumed_inputs=None):
        if not data_0:
            raise TypeInferenceError("expected at least one input")
        _same_dtype(ctx, op_name, *data_0)
        out = data_0[0]
        for x in data_0[1:]:
            out = ctx.call(op_name, out, x)
        return out if len(data_0) > 1 else ctx.call("copy", out)

    return convert


max_1 = converter("Max", 1)(_variadic("maximum"))
min_1 = converter("Min", 1)(_variadic("minimum"))
sum_1 = converter("Sum", 1)(_variadic("add"))


@converter("Mean", 1)
def mean_1(ctx, *data_0, consumed_inputs=None):
    total = sum_1(ctx, *data_0)
    return ctx.call("divide", total, scalar_like(ctx, total, len(data_0)))


@converter("Mod", 10)
def mod_10(ctx, A, B, *, fmod=0):
    _same_dtype(ctx, "Mod", A, B)
    # fmod=1: C's fmod (the sign of the dividend); fmod=0: Python's % (the sign of the divisor).
    return ctx.call("mod" if fmod else "floor_mod", A, B)


def _compare(op_name):
    def legacy(ctx, A, B, *, broadcast=0, axis=None):
        return ctx.call(op_name, A, _legacy_broadcast(ctx, A, B, broadcast, axis))

    def modern(ctx, A, B):
        _same_dtype(ctx, op_name, A, B)
        return ctx.call(op_name, A, B)

    return legacy, modern


for _op_type, _op_name in [("Equal", "equal"), ("Less", "less"), ("Greater", "greater"), ("And", "logical_and"),
                           ("Or", "logical_or"), ("Xor", "logical_xor")]:
    _legacy, _modern = _compare(_op_name)
    converter(_op_type, 1)(_legacy)
    converter(_op_type, 7)(_modern)
for _op_type, _op_name in [("LessOrEqual", "less_equal"), ("GreaterOrEqual", "greater_equal"),
                           ("BitwiseAnd", "bitwise_and"), ("BitwiseOr", "bitwise_or"),
                           ("BitwiseXor", "bitwise_xor")]:
    converter(_op_type, 1)(_compare(_op_name)[1])


@converter("Where", 9)
def where_9(ctx, condition, X, Y):
    return ctx.call("where", ctx.cast(condition, "bool"), X, Y)


@converter("IsInf", 10)
def is_inf_10(ctx, X, *, detect_negative=1, detect_positive=1):
    inf = ctx.call("isinf", X)
    zero = scalar_like(ctx, X, 0)
    if detect_negative and detect_positive:
        return inf
    if detect_positive:
        return ctx.call("logical_and", inf, ctx.call("greater", X, zero))
    if detect_negative:
        return ctx.call("logical_and", inf, ctx.call("less", X, zero))
    return ctx.call("logical_and", inf, ctx.call("not_equal", X, X))  # all False, in X's shape


# ---- casts, identity, constants -------------------------------------------------------------------


_CAST_NAMES = {"FLOAT": "float32", "DOUBLE": "float64", "INT32": "int32", "INT64": "int64", "BOOL": "bool",
               "FLOAT16": "float16", "INT8": "int8", "UINT8": "uint8", "INT16": "int16", "UINT16": "uint16",
               "UINT32": "uint32", "UINT64": "uint64"}


def _cast_target(to) -> str:
    if isinstance(to, str):  # opset 1 named the type
        if to.upper() not in _CAST_NAMES:
            raise UnsupportedError(f"Cast: target type {to!r} is not supported")
        return _CAST_NAMES[to.upper()]
    return onnx_dtype(to, "Cast: target type")


@converter("Cast", 1)
def cast_1(ctx, input, *, to, saturate=1, round_mode="up"):  # noqa: A002
    return ctx.call("cast", input, dtype=_cast_target(to))


@converter("CastLike", 15)
def cast_like_15(ctx, input, target_type, *, saturate=1, round_mode="up"):  # noqa: A002
    return ctx.call("cast", input, dtype=ctx.dtype(target_type))


@converter("BitCast", 26)
def bit_cast_26(ctx, input, *, to):  # noqa: A002
    """The same bits as dtype ``to`` (``reinterpret``: the widths must match; to bool only from bool)."""
    return ctx.call("reinterpret", input, dtype=onnx_dtype(to, "BitCast: to"))


@converter("Identity", 1)
def identity_1(ctx, input):  # noqa: A002
    return input


def _ones_mask(ctx, data):
    return ctx.cast(ctx.call("ones_like", data), "bool")


@converter("Dropout", 1)
def dropout_1(ctx, data, *, is_test=0, ratio=0.5, consumed_inputs=None, seed=None):
    return data, _ones_mask(ctx, data)


@converter("Dropout", 12)
def dropout_12(ctx, data, ratio=None, training_mode=None, *, seed=None):
    if training_mode is None or ctx.value(training_mode) is not None and not ctx.value(training_mode).any():
        return dropout_1(ctx, data)
    # Training mode (possibly decided at run time): only a zero ratio is deterministic; dyn.nn.dropout
    # raises an error otherwise.
    ratio = ratio if ratio is not None else ctx.constant(np.array(0.5, "float32"))
    ratio, training_mode = (v if ctx.ndim(v) == 0 else ctx.call("reshape", v, newshape=()) for v in (ratio, training_mode))
    out = ctx.call("dyn.nn.dropout", data, ctx.cast(ratio, "float32"), ctx.cast(training_mode, "bool"))
    return ctx.get_item(out, 0), ctx.get_item(out, 1)


@converter("Constant", 1)
def constant_1(ctx, *, value=None, value_float=None, value_floats=None, value_int=None, value_ints=None,
               value_string=None, value_strings=None, sparse_value=None):
    if value is not None:
        if value.dtype.name not in ONNX_DTYPES.values():
            raise UnsupportedError(f"Constant: a {value.dtype} tensor is not supported")
        return ctx.constant(value)
    if value_float is not None:
        return ctx.constant(np.array(value_float, "float32"))
    if value_floats is not None:
        return ctx.constant(np.array(value_floats, "float32"))
    if value_int is not None:
        return ctx.constant(np.array(value_int, "int64"))
    if value_ints is not None:
        return ctx.constant(np.array(value_ints, "int64"))
    raise UnsupportedError("Constant: only tensor, float(s) and int(s) values are supported (not strings "
                           "or sparse tensors)")


def _swish(ctx, x, alpha):
    scaled = x if alpha == 1.0 else ctx.call("multiply", x, scalar_like(ctx, x, alpha))
    return ctx.call("multiply", x, ctx.call("sigmoid", scaled))


@converter("Swish", 24)
def swish_24(ctx, X, *, alpha=1.0):
    return _swish(ctx, X, float(alpha))


@converter("SwiGLU", 28)
def swiglu_28(ctx, A, B, *, alpha=1.0):
    if ctx.shape(A) != ctx.shape(B) and all(isinstance(d, int) for d in ctx.shape(A) + ctx.shape(B)):
        raise TypeInferenceError(f"SwiGLU: A and B must have one shape, got {ctx.shape(A)} and {ctx.shape(B)}")
    return ctx.call("multiply", _swish(ctx, A, float(alpha)), B)
