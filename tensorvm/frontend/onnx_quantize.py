"""Converters of ONNX's linear quantization ops, written as the float and integer ops they are defined by:
QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger, ConvInteger, QLinearMatMul and
QLinearConv (the QDQ and the operator-oriented forms that ONNX Runtime's quantization tools write).

Quantizing divides by the scale, rounds half to even and saturates to the integer type's range; integer
products subtract the zero points and accumulate in int32; the QLinear ops requantize the int32 sum
with ``a_scale * b_scale / y_scale`` in float32. Scales and zero points are scalars, 1-D along an axis
(per channel) where the op allows, or blocks along an axis (opset 21's ``block_size``). The 2- and 4-bit
and float8 types are refused by the importer's dtype check."""

from __future__ import annotations

import numpy as np

from ..errors import TypeInferenceError, UnsupportedError
from .onnx_context import converter
from .onnx_nn import conv_1, matmul_1

_RANGES = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
           "int32": (-(2**31), 2**31 - 1)}


def _along(ctx, param, rank: int, axis: int, op: str, block: tuple | None = None):
    """A scale or zero point broadcast against a tensor of ``rank``: a scalar (or one element) as is, a
    1-D one along ``axis``; with ``block`` = (block_size, the tensor's length along axis), one of the
    tensor's rank whose entry i along axis serves the elements i * block_size ... (i + 1) * block_size - 1
    there (blocked quantization): repeated block_size times along axis, cut to the length."""
    ndim = ctx.ndim(param)
    if ndim == 0 and block is None:
        return param
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank:
        raise TypeInferenceError(f"{op}: axis {axis} is out of range for a rank-{rank} input")
    if block is not None:
        size, length = block
        if ndim != rank:
            raise TypeInferenceError(f"{op}: blocked quantization needs a scale of the input's rank {rank}, got {ndim}")
        if not isinstance(length, int):
            raise UnsupportedError(f"{op}: blocked quantization along an axis of unknown length is not supported")
        repeated = ctx.call("repeat", param, repeats=int(size), axis=axis)
        return ctx.call("strided_slice", repeated, begin=(0,), end=(length,), axes=(axis,))
    if ndim != 1:
        raise TypeInferenceError(f"{op}: a {ndim}-D scale or zero point needs block_size")
    shape = [1] * rank
    shape[axis] = -1
    return ctx.call("reshape", param, newshape=tuple(shape))


def _integer(ctx, dtype: str, op: str):
    if dtype not in _RANGES:
        raise UnsupportedError(f"{op}: quantized type {dtype} is not supported (int8, uint8, int16, uint16, int32)")
    return _RANGES[dtype]


def _quantize(ctx, x, scale, zero, dtype: str, op: str):
    """saturate(round_half_even(x / scale) + zero) as ``dtype`` (x, scale float32; zero of ``dtype``; no
    scale: x is in the quantized units already)."""
    low, high = _integer(ctx, dtype, op)
    f = ctx.dtype(x)
    q = ctx.call("round", x if scale is None else ctx.call("divide", x, ctx.cast(scale, f)))
    if zero is not None:
        q = ctx.call("add", q, ctx.cast(zero, f))
    q = ctx.call("clip", q, a_min=float(low), a_max=float(high))
    return ctx.cast(q, dtype)


def _dequantize(ctx, x, scale, zero):
    f = ctx.dtype(scale)
    value = ctx.cast(x, f) if zero is None else ctx.call("subtract", ctx.cast(x, f), ctx.cast(zero, f))
    return ctx.call("multiply", value, scale)


def _block(ctx, x, axis: int, block_size, op: str) -> tuple | None:
    """(block_size, x's length along axis) when the op is blocked, else None."""
    if not block_size:
        return None
    if block_size < 0:
        raise TypeInferenceError(f"{op}: block_size must be positive, got {block_size}")
    return int(block_size), ctx.shape(x)[axis]


@converter("QuantizeLinear", 10)
def quantize_linear_10(ctx, x, y_scale, y_zero_point=None, *, axis=1, saturate=1, block_size=0,
                       output_dtype=0, precision=0):
    if output_dtype:
        from .onnx_context import onnx_dtype

        dtype = onnx_dtype(output_dtype, "QuantizeLinear output_dtype")
    else:
        dtype = ctx.dtype(y_zero_point) if y_zero_point is not None else "uint8"
    rank, block = ctx.ndim(x), _block(ctx, x, axis, block_size, "QuantizeLinear")
    scale = _along(ctx, y_scale, rank, axis, "QuantizeLinear", block)
    zero = _along(ctx, y_zero_point, rank, axis, "QuantizeLinear", block) if y_zero_point is not None else None
    return _quantize(ctx, x, scale, zero, dtype, "QuantizeLinear")


@converter("DequantizeLinear", 10)
def dequantize_linear_10(ctx, x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0):
    _integer(ctx, ctx.dtype(x), "DequantizeLinear")
    rank, block = ctx.ndim(x), _block(ctx, x, axis, block_size, "DequantizeLinear")
    scale = _along(ctx, x_scale, rank, axis, "DequantizeLinear", block)
    zero = _along(ctx, x_zero_point, rank, axis, "DequantizeLinear", block) if x_zero_point is not None else None
    return _dequantize(ctx, x, scale, zero)


@converter("DynamicQuantizeLinear", 11)
def dynamic_quantize_linear_11(ctx, x):
    """uint8 over [min(x, 0), max(x, 0)]: scale = (high - low) / 255, zero = saturate(round(-low / scale));
    an all-zero x (a range of 0) quantizes to zeros with scale 1 and zero point 0, as ONNX Runtime does
    (the formula's scale 0 would make the zero point NaN)."""
    f = ctx.dtype(x)
    zero_f = ctx.constant(np.array(0, f))
    low = ctx.call("minimum", ctx.call("min", x), zero_f)
    high = ctx.call("maximum", ctx.call("max", x), zero_f)
    scale = ctx.call("divide", ctx.call("subtract", high, low), ctx.constant(np.array(255, f)))
    safe = ctx.divisor(scale)
    zero = ctx.call("clip", ctx.call("round", ctx.call("divide", ctx.call("negative", low), safe)), a_min=0.0, a_max=255.0)
    y = ctx.call("clip", ctx.call("add", ctx.call("round", ctx.call("divide", x, safe)), zero), a_min=0.0, a_max=255.0)
    return ctx.cast(y, "uint8"), safe, ctx.cast(zero, "uint8")


def _centered(ctx, x, zero, axis: int | None = None):
    """x - zero in int32 (a 1-D ``zero`` along x's ``axis``)."""
    value = ctx.cast(x, "int32")
    if zero is None:
        return value
    if axis is not None and ctx.ndim(zero) == 1:
        zero = _along(ctx, zero, ctx.ndim(x), axis, "zero point")
    return ctx.call("subtract", value, ctx.cast(zero, "int32"))


def _requantize(ctx, acc, scale, y_scale, y_zero_point, op: str):
    """The int32 sum ``acc``, in units of ``scale`` (the inputs' scales multiplied), as y's quantized type:
    acc times scale / y_scale in float32, rounded and saturated around y_zero_point."""
    f = ctx.dtype(scale)
    real = ctx.call("multiply", ctx.cast(acc, f), ctx.call("divide", scale, ctx.cast(y_scale, f)))
    return _quantize(ctx, real, None, y_zero_point, ctx.dtype(y_zero_point), op)


def _integer_matmul(ctx, A, B, a_zero_point, b_zero_point, op: str):
    for t in (A, B):
        _integer(ctx, ctx.dtype(t), op)
    return matmul_1(ctx, _centered(ctx, A, a_zero_point, -2), _centered(ctx, B, b_zero_point, -1))


@converter("MatMulInteger", 10)
def matmul_integer_10(ctx, A, B, a_zero_point=None, b_zero_point=None):
    return _integer_matmul(ctx, A, B, a_zero_point, b_zero_point, "MatMulInteger")


@converter("QLinearMatMul", 10)
def qlinear_matmul_10(ctx, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    acc = _integer_matmul(ctx, a, b, a_zero_point, b_zero_point, "QLinearMatMul")
    scale = ctx.call("multiply", _along(ctx, a_scale, ctx.ndim(a), -2, "QLinearMatMul"),
                     _along(ctx, b_scale, ctx.ndim(b), -1, "QLinearMatMul"))
    return _requantize(ctx, acc, scale, y_scale, y_zero_point, "QLinearMatMul")


def _integer_conv(ctx, x, w, x_zero_point, w_zero_point, attrs, op: str):
    _integer(ctx, ctx.dtype(x), op)
    _integer(ctx, ctx.dtype(w), op)
    return conv_1(ctx, _centered(ctx, x, x_zero_point), _centered(ctx, w, w_zero_point, 0), **attrs)


@converter("ConvInteger", 10)
def conv_integer_10(ctx, x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET", dilations=None, group=1,
                    kernel_shape=None, pads=None, strides=None):
    attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
                 strides=strides)
    return _integer_conv(ctx, x, w, x_zero_point, w_zero_point, attrs, "ConvInteger")


@converter("QLinearConv", 10)
def qlinear_conv_10(ctx, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None, *,
                    auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
                 strides=strides)
    acc = _integer_conv(ctx, x, w, x_zero_point, w_zero_point, attrs, "QLinearConv")
    if B is not None:  # int32, quantized with x_scale * w_scale and zero point 0
        acc = ctx.call("add", acc, _along(ctx, ctx.cast(B, "int32"), ctx.ndim(acc), 1, "QLinearConv"))
    scale = ctx.call("multiply", x_scale, _along(ctx, w_scale, ctx.ndim(acc), 1, "QLinearConv"))
    return _requantize(ctx, acc, scale, y_scale, y_zero_point, "QLinearConv")
