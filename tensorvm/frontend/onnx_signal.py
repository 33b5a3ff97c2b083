"""Converters of ONNX's signal ops: DFT and STFT, as products with cosine and sine matrices.

A transform of length n over an axis of L samples is ``re @ C + im @ S`` (and the like) with C[t, k] =
cos(2 pi k t / n), S[t, k] = sin(2 pi k t / n) for the samples t < min(L, n) (the rows past n are zero:
truncation; samples past L are zeros: padding). The angles come from ``(k t) mod n`` in int64, the
matrices and the products are float64 (the reference computes in double precision), the result is cast
back to the input's type. O(L n) per transform: exact and simple, not an FFT. With constant lengths the
matrices fold into constants at import; run-time lengths (and a run-time DFT axis: one branch per axis)
build them at run time. DFT: forward, inverse, one-sided forward (n // 2 + 1
bins) and one-sided inverse (a real signal of length n from n // 2 + 1 bins, as NumPy's irfft: the middle
bins count twice, the imaginary parts of the first and, for even n, the last bin are ignored)."""

from __future__ import annotations

import numpy as np

from ..errors import TypeInferenceError, UnsupportedError
from .onnx_context import converter
from .onnx_shape import _int64, _scalar, run_time_axis

F64 = "float64"


def _int_scalar(ctx, value):
    """A scalar int64 operand: a Python int as a constant, a tensor of one element reshaped."""
    if isinstance(value, int):
        return ctx.constant(np.array(value, np.int64))
    return _int64(ctx, _scalar(ctx, value))


def _known(ctx, value):
    """A scalar operand's value when it is a constant, else None."""
    if isinstance(value, int):
        return value
    known = ctx.scalar_value(value)
    return None if known is None else int(known)


def _basis(ctx, rows, cols, n, irfft: bool):
    """(C, S), float64 matrices of ``rows`` x ``cols`` (ints or int64 scalar expressions): entry (r, q) is
    cos / sin of 2 pi ((r q) mod n) / n. Forward and inverse transforms: r a sample (rows r >= n zero),
    q a bin. ``irfft``: r an input bin, weighted 1 (the first, and the last of an even n), 2 (the others)
    or 0 (past n // 2), q a sample, all divided by n."""
    r = ctx.call("expand_dims", ctx.indices(_int_scalar(ctx, rows)), axis=1)
    q = ctx.call("expand_dims", ctx.indices(cols), axis=0)
    turns = ctx.cast(ctx.call("floor_mod", ctx.call("multiply", r, q), n), F64)
    angle = ctx.call("divide", ctx.call("multiply", turns, ctx.constant(np.array(2 * np.pi))), ctx.cast(n, F64))
    c, s = ctx.call("cos", angle), ctx.call("sin", angle)
    two = ctx.constant(np.array(2, np.int64))
    if irfft:
        half = ctx.call("floor_divide", n, two)
        even = ctx.call("equal", ctx.call("floor_mod", n, two), ctx.constant(np.array(0, np.int64)))
        single = ctx.call("logical_or", ctx.call("equal", r, ctx.constant(np.array(0, np.int64))),
                          ctx.call("logical_and", even, ctx.call("equal", r, half)))
        weight = ctx.call("where", single, ctx.constant(np.array(1.0)), ctx.constant(np.array(2.0)))
        weight = ctx.call("where", ctx.call("greater", r, half), ctx.constant(np.array(0.0)), weight)
        weight = ctx.call("divide", weight, ctx.cast(n, F64))
    else:
        weight = ctx.cast(ctx.call("less", r, n), F64)
    return ctx.call("multiply", c, weight), ctx.call("multiply", s, weight)


def _parts(ctx, x, op: str):
    """x (..., 1 or 2) as its real and imaginary parts (rank one less; None for a real signal), float64."""
    last = ctx.ndim(x) - 1
    channels = ctx.shape(x)[last]
    if channels not in (1, 2):
        raise TypeInferenceError(f"{op}: the last axis holds 1 (real) or 2 (complex) values, got {channels}")
    wide = ctx.cast(x, F64)
    re = ctx.call("squeeze", ctx.call("strided_slice", wide, begin=(0,), end=(1,), axes=(last,)), axis=(last,))
    if channels == 1:
        return re, None
    im = ctx.call("squeeze", ctx.call("strided_slice", wide, begin=(1,), end=(2,), axes=(last,)), axis=(last,))
    return re, im


def _transform(ctx, x, axis: int, n, inverse: bool, onesided: bool, op: str):
    """The DFT of x along ``axis`` (not the last) of length ``n`` (an int or an int64 scalar), as ONNX lays
    it out: (..., bins, ..., 2) or, for a one-sided inverse, (..., n, ..., 1)."""
    rank = ctx.ndim(x)
    axis = axis % rank
    if axis == rank - 1:
        raise TypeInferenceError(f"{op}: the axis cannot be the last one (it holds the real and imaginary parts)")
    length = ctx.shape(x)[axis]
    if not isinstance(length, int):
        length = ctx.dim_value(x, axis)
    if isinstance(n, int) and n <= 0:
        raise TypeInferenceError(f"{op}: dft_length must be positive, got {n}")
    n = _int_scalar(ctx, n)
    re, im = _parts(ctx, x, op)
    order = [d for d in range(rank - 1) if d != axis] + [axis]  # (the signal axis last, for the products)
    back = [order.index(d) for d in range(rank - 1)]
    re = ctx.call("transpose", re, axes=tuple(order))
    im = ctx.call("transpose", im, axes=tuple(order)) if im is not None else None
    if inverse and onesided:  # irfft: bins in, n real samples out
        c, s = _basis(ctx, length, n, n, irfft=True)
        out = ctx.call("nn.matmul", re, c)
        if im is not None:
            out = ctx.call("subtract", out, ctx.call("nn.matmul", im, s))
        outs = [out]
    else:
        bins = ctx.call("add", ctx.call("floor_divide", n, ctx.constant(np.array(2, np.int64))),
                        ctx.constant(np.array(1, np.int64))) if onesided else n
        c, s = _basis(ctx, length, bins, n, irfft=False)
        if inverse:  # e^{+i...} / n: the forward formulas with S negated
            scale = ctx.cast(n, F64)
            c, s = ctx.call("divide", c, scale), ctx.call("divide", ctx.call("negative", s), scale)
        re_out = ctx.call("nn.matmul", re, c)
        im_out = ctx.call("negative", ctx.call("nn.matmul", re, s))
        if im is not None:
            re_out = ctx.call("add", re_out, ctx.call("nn.matmul", im, s))
            im_out = ctx.call("add", im_out, ctx.call("nn.matmul", im, c))
        outs = [re_out, im_out]
    outs = [ctx.call("expand_dims", ctx.call("transpose", o, axes=tuple(back)), axis=rank - 1) for o in outs]
    joined = outs[0] if len(outs) == 1 else ctx.call("concatenate", ctx.tuple(outs), axis=rank - 1)
    return ctx.cast(joined, ctx.dtype(x))


def _dft(ctx, x, axis, dft_length, inverse: bool, onesided: bool):
    """DFT over a constant axis, or one branch per possible axis when it is a run-time value."""
    rank = ctx.ndim(x)
    known = _known(ctx, axis)
    if known is not None:
        return _transform(ctx, x, known, _length(ctx, x, known, dft_length, inverse, onesided), inverse, onesided,
                          "DFT")
    branches = {}
    for a in range(rank - 1):  # (an axis whose transform cannot be built, e.g. of length 0, has none)
        try:
            branches[a] = _transform(ctx, x, a, _length(ctx, x, a, dft_length, inverse, onesided), inverse,
                                     onesided, "DFT")
        except TypeInferenceError:
            continue
    if not branches:
        raise TypeInferenceError(f"DFT: no axis of the input {ctx.shape(x)} can be transformed")
    valid = sorted(branches)
    # the run-time axis -> its branch's position, len(valid) for an axis without one: the second take
    # then fails with an index error at run time rather than transforming another axis
    slots = np.full(rank, len(valid), np.int64)
    slots[valid] = np.arange(len(valid))
    slot = ctx.call("take", ctx.constant(slots), run_time_axis(ctx, axis, rank), axis=0, mode="fast")
    chosen = ctx.call("take", ctx.constant(np.array(valid, np.int64)), slot, axis=0, mode="fast")
    out = branches[valid[-1]]
    for a in reversed(valid[:-1]):
        out = ctx.if_(ctx.call("equal", chosen, ctx.constant(np.array(a, np.int64))), branches[a], out)
    return out


def _length(ctx, x, axis: int, dft_length, inverse: bool, onesided: bool):
    """dft_length (an int or an int64 scalar expression), else from the signal axis's static length."""
    if dft_length is not None:
        known = _known(ctx, dft_length)
        return known if known is not None else _int_scalar(ctx, dft_length)
    length = ctx.shape(x)[axis % ctx.ndim(x)]
    if not isinstance(length, int):
        length = ctx.dim_value(x, axis % ctx.ndim(x))
        if inverse and onesided:
            return ctx.call("multiply", ctx.call("subtract", length, ctx.constant(np.array(1, np.int64))),
                            ctx.constant(np.array(2, np.int64)))
        return length
    return 2 * (length - 1) if inverse and onesided else length


@converter("DFT", 17)
def dft_17(ctx, input, dft_length=None, *, axis=1, inverse=0, onesided=0):  # noqa: A002
    return _dft(ctx, input, int(axis), dft_length, bool(inverse), bool(onesided))


@converter("DFT", 20)
def dft_20(ctx, input, dft_length=None, axis=None, *, inverse=0, onesided=0):  # noqa: A002
    return _dft(ctx, input, -2 if axis is None else axis, dft_length, bool(inverse), bool(onesided))


@converter("STFT", 17)
def stft_17(ctx, signal, frame_step, window=None, frame_length=None, *, onesided=1):
    """Frames of frame_length samples every frame_step (gathered), times the window, each transformed:
    (batch, frames, bins, 2)."""
    length = ctx.shape(signal)[1]
    if not isinstance(length, int):
        raise UnsupportedError("STFT: the signal must have a static length")
    if frame_length is not None:
        size = _int_scalar(ctx, frame_length)
    elif window is not None:
        size = ctx.dim_value(window, 0)
    else:
        raise UnsupportedError("STFT: needs frame_length or a window")
    step = _int_scalar(ctx, frame_step)
    frames = ctx.call("add", ctx.call("floor_divide", ctx.call("subtract", ctx.constant(np.array(length, np.int64)),
                                                                size), step), ctx.constant(np.array(1, np.int64)))
    starts = ctx.call("multiply", ctx.call("expand_dims", ctx.indices(frames), axis=1), step)
    index = ctx.call("add", starts, ctx.call("expand_dims", ctx.indices(size), axis=0))
    framed = ctx.call("take", signal, index, axis=1)  # (batch, frames, size, 1 or 2)
    if window is not None:
        shaped = ctx.call("reshape", ctx.cast(window, ctx.dtype(signal)), newshape=(1, 1, -1, 1))
        framed = ctx.call("multiply", framed, shaped)
    known = _known(ctx, size)
    return _transform(ctx, framed, 2, known if known is not None else size, False, bool(onesided), "STFT")


@converter("MelWeightMatrix", 17)
def mel_weight_matrix_17(ctx, num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, *,
                         output_datatype=1):
    """(dft_length // 2 + 1, num_mel_bins) triangular filters between num_mel_bins + 2 edges spaced evenly
    on the mel scale (2595 log10(1 + f / 700)), each edge rounded down to a spectrogram bin as ONNX's
    reference does ((dft_length + 1) f // sample_rate): filter i rises from edge i to edge i + 1 and falls
    to edge i + 2 (exclusive); any of the inputs may be run-time values."""
    from .onnx_context import onnx_dtype

    dtype = onnx_dtype(output_datatype, "MelWeightMatrix output_datatype")
    mels, n, rate = (_int_scalar(ctx, v) for v in (num_mel_bins, dft_length, sample_rate))
    edge_type = ctx.dtype(lower_edge_hertz)

    def const(value, of=F64):
        return ctx.constant(np.array(value, of))

    def to_mel(hertz):  # (in the edges' type, as the reference)
        ratio = ctx.call("divide", _scalar(ctx, hertz), const(700, edge_type))
        return ctx.call("divide", ctx.call("multiply", const(2595, edge_type), ctx.call("log1p", ratio)),
                        const(np.log(10), edge_type))

    low, high = to_mel(lower_edge_hertz), to_mel(upper_edge_hertz)
    count = ctx.call("add", mels, ctx.constant(np.array(2, np.int64)))
    step = ctx.call("divide", ctx.call("subtract", high, low), ctx.cast(count, edge_type))
    mel = ctx.call("add", ctx.call("multiply", ctx.cast(ctx.indices(count), F64), ctx.cast(step, F64)), ctx.cast(low, F64))
    hertz = ctx.call("multiply", const(700),
                     ctx.call("subtract", ctx.call("exp", ctx.call("multiply", ctx.call("divide", mel, const(2595)),
                                                                  const(np.log(10)))), const(1)))
    scaled = ctx.call("multiply", ctx.cast(ctx.call("add", n, ctx.constant(np.array(1, np.int64))), F64), hertz)
    edges = ctx.call("floor", ctx.call("divide", scaled, ctx.cast(rate, F64)))  # (float64, whole numbers)
    i = ctx.indices(mels)

    def edge(offset):  # edge i + offset per column, as a (1, mels) row
        index = ctx.call("add", i, ctx.constant(np.array(offset, np.int64)))
        return ctx.call("expand_dims", ctx.call("take", edges, index, axis=0, mode="fast"), axis=0)

    left, centre, right = edge(0), edge(1), edge(2)
    bins = ctx.call("add", ctx.call("floor_divide", n, ctx.constant(np.array(2, np.int64))), ctx.constant(np.array(1, np.int64)))
    j = ctx.call("expand_dims", ctx.cast(ctx.indices(bins), F64), axis=1)  # (bins, 1)
    zero = const(0.0)
    rise_width = ctx.call("subtract", centre, left)
    rise = ctx.call("divide", ctx.call("subtract", j, left), ctx.divisor(rise_width))
    rise = ctx.call("where", ctx.call("equal", rise_width, zero),
                    ctx.cast(ctx.call("equal", j, centre), F64), rise)
    rising = ctx.call("logical_and", ctx.call("greater_equal", j, left), ctx.call("less_equal", j, centre))
    fall_width = ctx.call("subtract", right, centre)
    fall = ctx.call("divide", ctx.call("subtract", right, j), ctx.divisor(fall_width))
    falling = ctx.call("logical_and", ctx.call("greater_equal", j, centre), ctx.call("less", j, right))
    out = ctx.call("where", falling, fall, ctx.call("where", rising, rise, zero))
    return ctx.cast(out, dtype)
