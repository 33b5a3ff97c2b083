"""Tensor-expression computes of the operators, attached to the registry on import.

Each op has one function, named after it (``nn.dense`` -> ``nn_dense``; a trailing underscore where the
name is a Python builtin or a te helper: ``sum_``, ``cast_``), with the signature
``compute(attrs, inputs, out_type) -> list[Tensor]``: ``attrs`` are the op's normalized attributes,
``inputs`` its arguments as te tensors (a tuple-typed argument is a tuple of tensors) and ``out_type``
the call's inferred type (for the output dtype). The result lists one tensor per output (tuple
outputs flattened). Semantics follow each op's NumPy kernel, including its dtype rules (accumulation
in float32 for float16, integer wrap-around) and its run-time checks, expressed as ``requires``.

Shapes are te expressions over the input dims, so one compute serves static and dynamic shapes; where
a dim is only known at run time, broadcasting reads index ``select(dim == 1, 0, i)`` and the compute
requires the dims to be compatible.
"""

from __future__ import annotations

import builtins
import math

from ..errors import TypeInferenceError
from ..op._compute import (
    acc_float as _acc_float,
)
from ..op._compute import (
    axis_of as _norm_axis,
)
from ..op._compute import (
    broadcast_read,
    broadcast_read_dim,
    broadcast_shape,
    unary_compute,
)
from ..op._compute import (
    layout_compute as _layout_compute,
)
from ..op._compute import (
    layout_reader as _layout_reader,
)
from ..op._compute import (
    matmul_value as _matmul_value,
)
from ..op._compute import (
    output_dtype as _out_dtype,
)
from ..op._compute import (
    product as _prod,
)
from ..op._compute import (
    require_equal as _require_equal,
)
from ..op._compute import (
    reshape_to as _reshape_to,
)
from ..op._compute import (  # noqa: F401 - moving to the op files
    same as _same,
)
from ..op._compute import (
    static_dim as _static,
)
from ..op._compute import (
    with_requires as _with_requires,
)
from ..op.nn import PACKED_LANES
from ..op.registry import get_op, is_registered
from . import expr as E
from . import intrin as M
from .expr import INDEX_DTYPE, Const, PrimExpr, cast, const, dtype_kind, eq, select
from .tensor import Tensor, compute, reduce_axis
from .tensor import max as te_max
from .tensor import sum as te_sum

__all__ = ["COMPUTES", "broadcast_shape", "broadcast_read"]

COMPUTES: dict = {}


def _register(name: str):
    def decorate(fn):
        COMPUTES[name] = fn
        return fn

    return decorate


# ---- shape helpers --------------------------------------------------------------------------------


def _elementwise(name: str, fn):
    return _register(name)(unary_compute(name, fn))


# ---- elementwise ----------------------------------------------------------------------------------


nn_relu = _elementwise("nn.relu", lambda x, a: E.maximum(x, 0))
nn_leaky_relu = _elementwise("nn.leaky_relu", lambda x, a: select(x > 0, x, x * const(a.alpha, x.dtype)))


def _gelu(x, attrs):
    acc = _acc_float(x.dtype)
    v = cast(x, acc)
    if attrs.approximate == "tanh":
        inner = const(math.sqrt(2 / math.pi), acc) * (v + const(0.044715, acc) * v * v * v)
        y = const(0.5, acc) * v * (const(1.0, acc) + M.tanh(inner))
    else:
        y = const(0.5, acc) * v * (const(1.0, acc) + M.erf(v * const(1 / math.sqrt(2), acc)))
    return y


nn_gelu = _elementwise("nn.gelu", _gelu)


# ---- creation -------------------------------------------------------------------------------------


# ---- reductions -----------------------------------------------------------------------------------


# ---- data movement --------------------------------------------------------------------------------


@_register("nn.batch_flatten")
def nn_batch_flatten(attrs, inputs, out_type):
    x = inputs[0]
    return [_reshape_to("nn.batch_flatten", x, (x.shape[0], _prod(x.shape[1:])))]


# ---- nn: matrix products ----------------------------------------------------------------------------


@_register("nn.dense")
def nn_dense(attrs, inputs, out_type):
    x, w = inputs
    dtype = _out_dtype(out_type)
    k = reduce_axis(x.shape[-1], "k")
    requires = _require_equal("nn.dense", x.shape[-1], w.shape[1], "the data's last dim and the weight's dim 1")
    if attrs.units is not None:
        requires += _require_equal("nn.dense", w.shape[0], const(attrs.units), "units and the weight's dim 0")
    shape = tuple(x.shape[:-1]) + (w.shape[0],)
    return [compute(shape, lambda *i: te_sum(_matmul_value(x[tuple(i[:-1]) + (k.var,)], w[i[-1], k.var], k, dtype),
                                             k), "dense", requires)]


@_register("nn.dense_packed")
def nn_dense_packed(attrs, inputs, out_type):
    x, w = inputs
    dtype = _out_dtype(out_type)
    lanes = PACKED_LANES
    k = reduce_axis(x.shape[-1], "k")
    requires = _require_equal("nn.dense_packed", x.shape[-1], w.shape[1],
                              "the data's last dim and the packed weight's dim 1")
    requires += _require_equal("nn.dense_packed", w.shape[0], const(-(-attrs.units // lanes)),
                               f"ceil(units / {lanes}) and the packed weight's dim 0")
    requires += _require_equal("nn.dense_packed", w.shape[2], const(lanes), f"the packed weight's dim 2 and {lanes}")
    shape = tuple(x.shape[:-1]) + (const(attrs.units),)

    def f(*i):
        j = i[-1]
        weight = w[E.floordiv(j, lanes), k.var, E.floormod(j, lanes)]
        return te_sum(_matmul_value(x[tuple(i[:-1]) + (k.var,)], weight, k, dtype), k)

    return [compute(shape, f, "dense_packed", requires)]


@_register("nn.matmul")
def nn_matmul(attrs, inputs, out_type):
    a, b = inputs
    dtype = _out_dtype(out_type)
    if attrs.transpose_a:
        kdim, prefix = a.shape[-2], tuple(a.shape[:-2]) + (a.shape[-1],)
    else:
        kdim, prefix = a.shape[-1], tuple(a.shape[:-1])
    k2, n = (b.shape[1], b.shape[0]) if attrs.transpose_b else (b.shape[0], b.shape[1])
    requires = _require_equal("nn.matmul", kdim, k2, "the reduction dims of tensor_a and tensor_b")
    k = reduce_axis(kdim, "k")

    def f(*i):
        head, j = i[:-1], i[-1]
        a_index = tuple(head[:-1]) + (k.var, head[-1]) if attrs.transpose_a else tuple(head) + (k.var,)
        b_index = (j, k.var) if attrs.transpose_b else (k.var, j)
        return te_sum(_matmul_value(a[a_index], b[b_index], k, dtype), k)

    return [compute(prefix + (n,), f, "matmul", requires)]


@_register("nn.batch_matmul")
def nn_batch_matmul(attrs, inputs, out_type):
    x, y = inputs
    dtype = _out_dtype(out_type)
    bx, m, k1 = (x.shape[0], x.shape[2], x.shape[1]) if attrs.transpose_a else tuple(x.shape)
    by, n, k2 = tuple(y.shape) if attrs.transpose_b else (y.shape[0], y.shape[2], y.shape[1])
    (batch,), requires = broadcast_shape("nn.batch_matmul", (bx,), (by,))
    requires += _require_equal("nn.batch_matmul", k1, k2, "the reduction dims of x and y")
    k = reduce_axis(k1, "k")

    def f(bi, i, j):
        xb = broadcast_read_dim(x.shape[0], bi, batch)
        yb = broadcast_read_dim(y.shape[0], bi, batch)
        xv = x[xb, k.var, i] if attrs.transpose_a else x[xb, i, k.var]
        yv = y[yb, j, k.var] if attrs.transpose_b else y[yb, k.var, j]
        return te_sum(_matmul_value(xv, yv, k, dtype), k)

    return [compute((batch, m, n), f, "batch_matmul", requires)]


@_register("onnx.matmul")
def onnx_matmul(attrs, inputs, out_type):
    """NumPy's matmul: 1-d operands get a unit dim (dropped from the result), batch dims broadcast."""
    a, b = inputs
    dtype = _out_dtype(out_type)
    a_shape = (const(1),) + tuple(a.shape) if a.ndim == 1 else tuple(a.shape)
    b_shape = tuple(b.shape) + (const(1),) if b.ndim == 1 else tuple(b.shape)
    batch, requires = broadcast_shape("onnx.matmul", a_shape[:-2], b_shape[:-2])
    requires += _require_equal("onnx.matmul", a_shape[-1], b_shape[-2], "the inner dims")
    k = reduce_axis(a_shape[-1], "k")
    shape = tuple(batch) + ((a_shape[-2],) if a.ndim > 1 else ()) + ((b_shape[-1],) if b.ndim > 1 else ())

    def f(*i):
        nb = len(batch)
        bi, rest = i[:nb], list(i[nb:])
        m = rest.pop(0) if a.ndim > 1 else None
        n = rest.pop(0) if b.ndim > 1 else None

        def batch_index(t_shape):
            dims = t_shape[:-2]
            return tuple(broadcast_read_dim(d, bi[nb - len(dims) + axis], batch[nb - len(dims) + axis])
                         for axis, d in enumerate(dims))

        av = a[batch_index(a_shape) + (m, k.var)] if a.ndim > 1 else a[k.var]
        bv = b[batch_index(b_shape) + (k.var, n)] if b.ndim > 1 else b[k.var]
        return te_sum(_matmul_value(av, bv, k, dtype), k)

    return [compute(shape, f, "matmul", requires)]


@_register("trilu")
def trilu(attrs, inputs, out_type):
    """The upper (``j - i >= k``) or lower (``j - i <= k``) triangle of the last two dims."""
    x, k = inputs
    if x.ndim < 2:
        raise TypeInferenceError(f"trilu: the input must have rank >= 2, got rank {x.ndim}")
    if k.ndim == 0:
        diagonal = cast(k[()], INDEX_DTYPE)
    else:  # a 1-d k: its first value, 0 when empty
        diagonal = select(eq(k.shape[0], 0), const(0), cast(k[(const(0),) * k.ndim], INDEX_DTYPE))

    def f(*i):
        offset = i[-1] - i[-2]
        keep = offset >= diagonal if attrs.upper else offset <= diagonal
        return select(keep, x[i], const(0, x.dtype))

    return [compute(x.shape, f, "trilu")]


# ---- nn: per-channel and normalization -------------------------------------------------------------


@_register("nn.bias_add")
def nn_bias_add(attrs, inputs, out_type):
    x, b = inputs
    axis = _norm_axis("nn.bias_add", attrs.axis, x.ndim)
    requires = _require_equal("nn.bias_add", x.shape[axis], b.shape[0], "the data's channel dim and the bias")
    return [compute(x.shape, lambda *i: x[i] + b[i[axis]], "bias_add", requires)]


@_register("nn.prelu")
def nn_prelu(attrs, inputs, out_type):
    x, alpha = inputs
    axis = _norm_axis("nn.prelu", attrs.axis, x.ndim)
    requires = _require_equal("nn.prelu", x.shape[axis], alpha.shape[0], "the data's channel dim and alpha")
    return [compute(x.shape, lambda *i: select(x[i] > 0, x[i], x[i] * alpha[i[axis]]), "prelu", requires)]


def _softmax(attrs, x: Tensor, log: bool):
    axis = _norm_axis("nn.softmax", attrs.axis, x.ndim)
    acc = _acc_float(x.dtype)
    kept = tuple(d for a, d in enumerate(x.shape) if a != axis)

    def kept_of(i):
        return tuple(j for a, j in enumerate(i) if a != axis)

    def full(kept_index, r):
        index = list(kept_index)
        index.insert(axis, r)
        return tuple(index)

    r1 = reduce_axis(x.shape[axis], "r")
    peak = compute(kept, lambda *i: te_max(cast(x[full(i, r1.var)], acc), r1), "softmax_max")
    shifted = compute(x.shape, lambda *i: cast(x[i], acc) - peak[kept_of(i)], "softmax_shift")
    exps = compute(x.shape, lambda *i: M.exp(shifted[i]), "softmax_exp")
    r2 = reduce_axis(x.shape[axis], "s")
    total = compute(kept, lambda *i: te_sum(exps[full(i, r2.var)], r2), "softmax_sum")
    if log:
        return compute(x.shape, lambda *i: cast(shifted[i] - M.log(total[kept_of(i)]), x.dtype), "log_softmax")
    return compute(x.shape, lambda *i: cast(exps[i] / total[kept_of(i)], x.dtype), "softmax")


@_register("nn.softmax")
def nn_softmax(attrs, inputs, out_type):
    return [_softmax(attrs, inputs[0], log=False)]


@_register("nn.log_softmax")
def nn_log_softmax(attrs, inputs, out_type):
    return [_softmax(attrs, inputs[0], log=True)]


def _normalized(op: str, x: Tensor, axes: tuple, epsilon: float, prefix: str):
    """(x - mean) / sqrt(var + epsilon) over ``axes``, in the float accumulation dtype (a compute)."""
    acc = _acc_float(x.dtype)
    kept = tuple(d for a, d in enumerate(x.shape) if a not in axes)
    count = cast(_prod(x.shape[a] for a in axes), acc)

    def kept_of(i):
        return tuple(j for a, j in enumerate(i) if a not in axes)

    def full(kept_index, raxes):
        it, rit = iter(kept_index), iter(raxes)
        return tuple(next(rit).var if a in axes else next(it) for a in range(x.ndim))

    r1 = [reduce_axis(x.shape[a], f"r{a}") for a in axes]
    total = compute(kept, lambda *i: te_sum(cast(x[full(i, r1)], acc), r1), f"{prefix}_sum")
    mean_ = compute(kept, lambda *i: total[i] / count, f"{prefix}_mean")
    r2 = [reduce_axis(x.shape[a], f"v{a}") for a in axes]

    def squares(*i):
        d = cast(x[full(i, r2)], acc) - mean_[i]
        return te_sum(d * d, r2)

    sq = compute(kept, squares, f"{prefix}_sq")
    denom = compute(kept, lambda *i: M.sqrt(sq[i] / count + const(epsilon, acc)), f"{prefix}_denom")
    return compute(x.shape, lambda *i: (cast(x[i], acc) - mean_[kept_of(i)]) / denom[kept_of(i)], f"{prefix}_norm")


def _scale_shift(y: Tensor, attrs, axis: int, gamma: Tensor | None, beta: Tensor | None, dtype: str, name: str):
    def f(*i):
        v = y[i]
        if attrs.scale and gamma is not None:
            v = v * cast(gamma[i[axis]], v.dtype)
        if attrs.center and beta is not None:
            v = v + cast(beta[i[axis]], v.dtype)
        return cast(v, dtype)

    return compute(y.shape, f, name)


def _channel_requires(op: str, x: Tensor, axis: int, vectors) -> list:
    requires = []
    for vec in vectors:
        requires += _require_equal(op, x.shape[axis], vec.shape[0], "the channel dim and a per-channel vector")
    return requires


@_register("nn.layer_norm")
def nn_layer_norm(attrs, inputs, out_type):
    x, gamma, beta = inputs
    axis = _norm_axis("nn.layer_norm", attrs.axis, x.ndim)
    y = _normalized("nn.layer_norm", x, (axis,), attrs.epsilon, "ln")
    out = _scale_shift(y, attrs, axis, gamma, beta, x.dtype, "layer_norm")
    return [_with_requires(out, _channel_requires("nn.layer_norm", x, axis, (gamma, beta)))]


@_register("nn.instance_norm")
def nn_instance_norm(attrs, inputs, out_type):
    x, gamma, beta = inputs
    axis = _norm_axis("nn.instance_norm", attrs.axis, x.ndim)
    axes = tuple(a for a in range(1, x.ndim) if a != axis)
    y = _normalized("nn.instance_norm", x, axes, attrs.epsilon, "in")
    out = _scale_shift(y, attrs, axis, gamma, beta, x.dtype, "instance_norm")
    return [_with_requires(out, _channel_requires("nn.instance_norm", x, axis, (gamma, beta)))]


@_register("nn.group_norm")
def nn_group_norm(attrs, inputs, out_type):
    """Each sample normalized over groups of channels (and every other dim), then scaled per channel."""
    x, gamma, beta = inputs
    axis = _norm_axis("nn.group_norm", attrs.axis, x.ndim)
    if axis == 0:
        raise TypeInferenceError("nn.group_norm: the channel axis cannot be the batch axis 0")
    acc = _acc_float(x.dtype)
    groups, channels = attrs.num_groups, x.shape[axis]
    per_group = E.floordiv(channels, groups)
    others = [a for a in range(1, x.ndim) if a != axis]
    count = cast(per_group * _prod(x.shape[a] for a in others), acc)
    requires = [(eq(E.floormod(channels, groups), 0), "nn.group_norm: the number of channels must be divisible by "
                                                      "num_groups")]
    requires += _channel_requires("nn.group_norm", x, axis, (gamma, beta))

    def full(n, g, raxes):
        index = [n] + [None] * (x.ndim - 1)
        index[axis] = g * per_group + raxes[0].var
        for a, r in zip(others, raxes[1:]):
            index[a] = r.var
        return tuple(index)

    def raxes(tag):
        return [reduce_axis(per_group, f"{tag}c")] + [reduce_axis(x.shape[a], f"{tag}{a}") for a in others]

    r1, r2 = raxes("r"), raxes("v")
    kept = (x.shape[0], const(groups))
    total = compute(kept, lambda n, g: te_sum(cast(x[full(n, g, r1)], acc), r1), "gn_sum")
    mean_ = compute(kept, lambda n, g: total[n, g] / count, "gn_mean")

    def squares(n, g):
        d = cast(x[full(n, g, r2)], acc) - mean_[n, g]
        return te_sum(d * d, r2)

    sq = compute(kept, squares, "gn_sq")
    denom = compute(kept, lambda n, g: M.sqrt(sq[n, g] / count + const(attrs.epsilon, acc)), "gn_denom")

    def normalized(*i):
        g = E.floordiv(i[axis], per_group)
        return (cast(x[i], acc) - mean_[i[0], g]) / denom[i[0], g]

    y = compute(x.shape, normalized, "gn_norm")
    out = _scale_shift(y, attrs, axis, gamma, beta, x.dtype, "group_norm")
    return [_with_requires(out, requires)]


@_register("nn.lrn")
def nn_lrn(attrs, inputs, out_type):
    """x / (bias + alpha / size * sum of squares over the window [c - size//2, c - size//2 + size))^beta."""
    x = inputs[0]
    axis = _norm_axis("nn.lrn", attrs.axis, x.ndim)
    acc = _acc_float(x.dtype)
    channels, half = x.shape[axis], attrs.size // 2
    r = reduce_axis(attrs.size, "r")

    def window(*i):
        j = i[axis] - half + r.var
        index = list(i)
        index[axis] = E.minimum(E.maximum(j, 0), channels - 1)  # in range even where masked out
        v = cast(x[tuple(index)], acc)
        return te_sum(v * v, r, where=E.logical_and(j >= 0, j < channels))

    total = compute(x.shape, window, "lrn_sum")
    scale, bias, beta = (const(v, acc) for v in (attrs.alpha / attrs.size, attrs.bias, attrs.beta))
    return [compute(x.shape, lambda *i: cast(cast(x[i], acc) / E.power(bias + scale * total[i], beta), x.dtype),
                    "lrn")]


@_register("nn.rms_norm")
def nn_rms_norm(attrs, inputs, out_type):
    x, gamma = inputs
    axis = _norm_axis("nn.rms_norm", attrs.axis, x.ndim)
    acc = _acc_float(x.dtype)
    kept = tuple(d for a, d in enumerate(x.shape) if a != axis)
    r = reduce_axis(x.shape[axis], "r")

    def full(i, rv):
        index = list(i)
        index.insert(axis, rv)
        return tuple(index)

    sq = compute(kept, lambda *i: te_sum(cast(x[full(i, r.var)], acc) * cast(x[full(i, r.var)], acc), r), "rms_sq")
    count = cast(x.shape[axis], acc)
    denom = compute(kept, lambda *i: M.sqrt(sq[i] / count + const(attrs.epsilon, acc)), "rms_denom")
    requires = _channel_requires("nn.rms_norm", x, axis, (gamma,))

    def f(*i):
        kept_index = tuple(j for a, j in enumerate(i) if a != axis)
        return cast(cast(x[i], acc) / denom[kept_index] * cast(gamma[i[axis]], acc), x.dtype)

    return [compute(x.shape, f, "rms_norm", requires)]


@_register("nn.batch_norm")
def nn_batch_norm(attrs, inputs, out_type):
    x, gamma, beta, mean_, var_ = inputs
    axis = _norm_axis("nn.batch_norm", attrs.axis, x.ndim)
    acc = _acc_float(x.dtype)
    requires = _channel_requires("nn.batch_norm", x, axis, (gamma, beta, mean_, var_))

    def f(*i):
        c = i[axis]
        v = (cast(x[i], acc) - cast(mean_[c], acc)) / M.sqrt(cast(var_[c], acc) + const(attrs.epsilon, acc))
        if attrs.scale:
            v = v * cast(gamma[c], acc)
        if attrs.center:
            v = v + cast(beta[c], acc)
        return cast(v, x.dtype)

    out = compute(x.shape, f, "batch_norm", requires)
    mean_copy = compute(mean_.shape, lambda c: mean_[c], "batch_norm_mean")
    var_copy = compute(var_.shape, lambda c: var_[c], "batch_norm_var")
    return [out, mean_copy, var_copy]


# ---- nn: convolution, pooling, padding ------------------------------------------------------------


def _window_extent(dim, kernel: int, pad_total: int, stride: int, dilation: int, ceil_mode: bool):
    extent = dilation * (kernel - 1) + 1
    room = dim + pad_total - extent
    return E.floordiv(room + (stride - 1 if ceil_mode else 0), stride) + 1, room


def _padded(x: Tensor, layout: str, top: int, left: int, bottom, right, name: str, fill=0):
    """``x`` with ``fill`` around H and W (a compute of its own, so the code generator can materialize it
    instead of testing the border inside a convolution's or pool's innermost loop); ``bottom`` and
    ``right`` may be te expressions (a ceil-mode pool's room)."""
    if all(isinstance(p, int) and p == 0 or E.is_const(p, 0) for p in (top, left, bottom, right)):
        return x
    h_axis, w_axis = layout.index("H"), layout.index("W")
    height, width = x.shape[h_axis], x.shape[w_axis]
    shape = tuple(d + (top + bottom if a == h_axis else left + right if a == w_axis else 0)
                  for a, d in enumerate(x.shape))

    def f(*i):
        y, z = i[h_axis] - top, i[w_axis] - left
        index = tuple(y if a == h_axis else z if a == w_axis else j for a, j in enumerate(i))
        return select(E.all_of(y >= 0, y < height, z >= 0, z < width), x[index], const(fill, x.dtype))

    return compute(shape, f, name)


@_register("nn.conv2d")
def nn_conv2d(attrs, inputs, out_type):
    x, w = inputs
    dtype = _out_dtype(out_type)
    xd, _ = _layout_reader(x, attrs.data_layout, "NCHW")
    wd, w_read = _layout_reader(w, attrs.kernel_layout, "OIHW")
    g = attrs.groups
    pt, pl, pb, pr = attrs.padding
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    oh, room_h = _window_extent(xd["H"], _static(wd["H"], "kernel height"), pt + pb, sh, dh, False)
    ow, room_w = _window_extent(xd["W"], _static(wd["W"], "kernel width"), pl + pr, sw, dw, False)
    requires = _require_equal("nn.conv2d", xd["C"], wd["I"] * g, "the data's channels and weight in-channels x groups")
    requires += [(room_h >= 0, "nn.conv2d: the kernel is taller than the padded input"),
                 (room_w >= 0, "nn.conv2d: the kernel is wider than the padded input")]
    _, x_read = _layout_reader(_padded(x, attrs.data_layout, pt, pl, pb, pr, "conv2d_pad"), attrs.data_layout,
                               "NCHW")
    out_per_group = E.floordiv(wd["O"], g)
    ci = reduce_axis(wd["I"], "ci")
    kh = reduce_axis(wd["H"], "kh")
    kw = reduce_axis(wd["W"], "kw")

    def f(N, C, H, W):
        channel = E.floordiv(C, out_per_group) * wd["I"] + ci.var if g > 1 else ci.var
        value = cast(x_read(N=N, C=channel, H=H * sh + kh.var * dh, W=W * sw + kw.var * dw), dtype)
        return te_sum(value * cast(w_read(O=C, I=ci.var, H=kh.var, W=kw.var), dtype), [ci, kh, kw])

    out_layout = attrs.out_layout or attrs.data_layout
    shape = {"N": xd["N"], "C": wd["O"], "H": oh, "W": ow}
    return [_layout_compute(shape, out_layout, f, "conv2d", requires)]


@_register("nn.conv2d_transpose")
def nn_conv2d_transpose(attrs, inputs, out_type):
    x, w = inputs
    dtype = _out_dtype(out_type)
    xd, x_read = _layout_reader(x, attrs.data_layout, "NCHW")
    wd, w_read = _layout_reader(w, attrs.kernel_layout, "IOHW")
    g = attrs.groups
    pt, pl, pb, pr = attrs.padding
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    khs, kws = _static(wd["H"], "kernel height"), _static(wd["W"], "kernel width")
    oh = (xd["H"] - 1) * sh - (pt + pb) + dh * (khs - 1) + attrs.output_padding[0] + 1
    ow = (xd["W"] - 1) * sw - (pl + pr) + dw * (kws - 1) + attrs.output_padding[1] + 1
    in_per_group = E.floordiv(xd["C"], g)
    requires = _require_equal("nn.conv2d_transpose", xd["C"], wd["I"], "the data's and the weight's in-channels")
    ci = reduce_axis(in_per_group, "ci")
    kh, kw = reduce_axis(khs, "kh"), reduce_axis(kws, "kw")
    height, width = xd["H"], xd["W"]

    def f(N, C, H, W):
        group = E.floordiv(C, wd["O"]) if g > 1 else const(0)
        channel = group * in_per_group + ci.var
        ty = H + pt - kh.var * dh
        tz = W + pl - kw.var * dw
        y, z = E.floordiv(ty, sh), E.floordiv(tz, sw)
        hit = E.all_of(ty >= 0, tz >= 0, eq(E.floormod(ty, sh), 0), eq(E.floormod(tz, sw), 0), y < height, z < width)
        value = cast(x_read(N=N, C=channel, H=y, W=z), dtype) * cast(
            w_read(I=channel, O=E.floormod(C, wd["O"]) if g > 1 else C, H=kh.var, W=kw.var), dtype)
        return te_sum(value, [ci, kh, kw], where=hit)

    out_layout = attrs.out_layout or attrs.data_layout
    shape = {"N": xd["N"], "C": wd["O"] * g, "H": oh, "W": ow}
    return [_layout_compute(shape, out_layout, f, "conv2d_transpose", requires)]


def _pool(attrs, x: Tensor, kind: str):
    xd, _ = _layout_reader(x, attrs.layout, "NCHW")
    pt, pl, pb, pr = attrs.padding
    (kh_, kw_), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    oh, room_h = _window_extent(xd["H"], kh_, pt + pb, sh, dh, attrs.ceil_mode)
    ow, room_w = _window_extent(xd["W"], kw_, pl + pr, sw, dw, attrs.ceil_mode)
    requires = [(room_h >= 0, "pool: the window is taller than the padded input"),
                (room_w >= 0, "pool: the window is wider than the padded input")]
    kh, kw = reduce_axis(kh_, "kh"), reduce_axis(kw_, "kw")
    height, width = xd["H"], xd["W"]
    out_layout = attrs.out_layout or attrs.layout
    shape = {"N": xd["N"], "C": xd["C"], "H": oh, "W": ow}
    # The windows read the data padded with the pool's neutral value, including the room the last
    # ceil-mode window needs past the end padding: no border test in the window loop, which vectorizes.
    bottom, right = pb, pr
    if attrs.ceil_mode:
        bottom = E.maximum((oh - 1) * sh + dh * (kh_ - 1) + 1 - (height + pt), pb)
        right = E.maximum((ow - 1) * sw + dw * (kw_ - 1) + 1 - (width + pl), pr)
    fill = E.min_value(x.dtype) if kind == "max" else 0
    _, x_read = _layout_reader(_padded(x, attrs.layout, pt, pl, bottom, right, f"{kind}_pool2d_pad", fill),
                               attrs.layout, "NCHW")

    def window(N, C, H, W):
        return x_read(N=N, C=C, H=H * sh + kh.var * dh, W=W * sw + kw.var * dw)

    if kind == "max":
        return _layout_compute(shape, out_layout, lambda N, C, H, W: te_max(window(N, C, H, W), [kh, kw]),
                               "max_pool2d", requires)
    acc = _acc_float(x.dtype) if dtype_kind(x.dtype) == "f" else "float64"
    total = _layout_compute(shape, out_layout,
                            lambda N, C, H, W: te_sum(cast(window(N, C, H, W), acc), [kh, kw]),
                            "avg_pool2d_sum", requires)
    kh2, kw2 = reduce_axis(kh_, "ch"), reduce_axis(kw_, "cw")

    def count_fn(N, C, H, W):
        y, z = H * sh + kh2.var * dh - pt, W * sw + kw2.var * dw - pl
        if attrs.count_include_pad:
            counted = E.all_of(y < height + pb, z < width + pr)
        else:
            checks = [y >= 0] if pt else []
            checks += [y < height] if pb or attrs.ceil_mode else []
            checks += [z >= 0] if pl else []
            checks += [z < width] if pr or attrs.ceil_mode else []
            counted = E.all_of(*checks) if checks else None
        if counted is None:
            return te_sum(const(1.0, acc), [kh2, kw2])
        return te_sum(select(counted, const(1.0, acc), const(0.0, acc)), [kh2, kw2])

    count = _layout_compute(shape, out_layout, count_fn, "avg_pool2d_count")
    return compute(total.shape, lambda *i: cast(total[i] / E.maximum(count[i], const(1.0, acc)), x.dtype),
                   "avg_pool2d")


@_register("nn.max_pool2d")
def nn_max_pool2d(attrs, inputs, out_type):
    return [_pool(attrs, inputs[0], "max")]


@_register("nn.avg_pool2d")
def nn_avg_pool2d(attrs, inputs, out_type):
    return [_pool(attrs, inputs[0], "avg")]


def _global_pool(attrs, x: Tensor, kind: str):
    xd, x_read = _layout_reader(x, attrs.layout, "NCHW")
    kh, kw = reduce_axis(xd["H"], "kh"), reduce_axis(xd["W"], "kw")
    out_layout = attrs.out_layout or attrs.layout
    shape = {"N": xd["N"], "C": xd["C"], "H": const(1), "W": const(1)}
    if kind == "max":
        return _layout_compute(shape, out_layout, lambda N, C, H, W: te_max(x_read(N=N, C=C, H=kh.var, W=kw.var),
                                                                            [kh, kw]), "global_max_pool2d")
    acc = _acc_float(x.dtype) if dtype_kind(x.dtype) == "f" else "float64"
    total = _layout_compute(shape, out_layout, lambda N, C, H, W: te_sum(cast(x_read(N=N, C=C, H=kh.var, W=kw.var),
                                                                                acc), [kh, kw]), "global_pool_sum")
    count = E.maximum(cast(xd["H"] * xd["W"], acc), const(1.0, acc))
    return compute(total.shape, lambda *i: cast(total[i] / count, x.dtype), "global_avg_pool2d")


@_register("nn.global_max_pool2d")
def nn_global_max_pool2d(attrs, inputs, out_type):
    return [_global_pool(attrs, inputs[0], "max")]


@_register("nn.global_avg_pool2d")
def nn_global_avg_pool2d(attrs, inputs, out_type):
    return [_global_pool(attrs, inputs[0], "avg")]


def _adaptive_window(size, out, i):
    """Window ``i`` of ``out`` over ``size``: [floor(i*size/out), ceil((i+1)*size/out))."""
    start = E.floordiv(i * size, out)
    end = E.floordiv((i + 1) * size + out - 1, out)
    return start, end


def _adaptive_span(size, out) -> PrimExpr:
    """The longest window: exact when both are static, else the whole dim."""
    if isinstance(size, Const) and isinstance(out, Const) and out.value > 0:
        s, o = size.value, out.value
        return const(builtins.max(0, *[-(-(k + 1) * s // o) - (k * s // o) for k in range(o)]) if o else 0)
    return size


def _adaptive_pool(attrs, x: Tensor, kind: str):
    xd, x_read = _layout_reader(x, attrs.layout, "NCHW")
    if attrs.output_size is None:
        oh, ow = xd["H"], xd["W"]
    else:
        oh, ow = const(attrs.output_size[0]), const(attrs.output_size[1])
    out_layout = attrs.out_layout or attrs.layout
    shape = {"N": xd["N"], "C": xd["C"], "H": oh, "W": ow}
    rh, rw = reduce_axis(_adaptive_span(xd["H"], oh), "rh"), reduce_axis(_adaptive_span(xd["W"], ow), "rw")

    def window(H, W):
        hs, he = _adaptive_window(xd["H"], oh, H)
        ws, we = _adaptive_window(xd["W"], ow, W)
        y, z = hs + rh.var, ws + rw.var
        return y, z, E.all_of(y < he, z < we), (he - hs) * (we - ws)

    if kind == "max":
        def f(N, C, H, W):
            y, z, inside, _ = window(H, W)
            return te_max(x_read(N=N, C=C, H=y, W=z), [rh, rw], where=inside)

        return _layout_compute(shape, out_layout, f, "adaptive_max_pool2d")
    acc = _acc_float(x.dtype) if dtype_kind(x.dtype) == "f" else "float64"

    def total_fn(N, C, H, W):
        y, z, inside, _ = window(H, W)
        return te_sum(cast(x_read(N=N, C=C, H=y, W=z), acc), [rh, rw], where=inside)

    total = _layout_compute(shape, out_layout, total_fn, "adaptive_pool_sum")

    def finish(*i):
        letters = dict(zip(out_layout, i))
        _, _, _, count = window(letters["H"], letters["W"])
        return cast(total[i] / E.maximum(cast(count, acc), const(1.0, acc)), x.dtype)

    return compute(total.shape, finish, "adaptive_avg_pool2d")


@_register("nn.adaptive_max_pool2d")
def nn_adaptive_max_pool2d(attrs, inputs, out_type):
    return [_adaptive_pool(attrs, inputs[0], "max")]


@_register("nn.adaptive_avg_pool2d")
def nn_adaptive_avg_pool2d(attrs, inputs, out_type):
    return [_adaptive_pool(attrs, inputs[0], "avg")]


@_register("nn.pad")
def nn_pad(attrs, inputs, out_type):
    x = inputs[0]
    fill = cast(inputs[1][()], x.dtype) if len(inputs) > 1 else const(0, x.dtype)
    widths = attrs.pad_width
    if len(widths) != x.ndim:
        raise TypeInferenceError(f"nn.pad: pad_width has {len(widths)} pairs for rank {x.ndim}")
    shape = tuple(d + before + after for d, (before, after) in zip(x.shape, widths))
    requires = []
    mode = attrs.pad_mode
    for axis, (d, (before, after)) in enumerate(zip(x.shape, widths)):
        if mode == "reflect" and (before or after):
            requires.append((d > builtins.max(before, after), f"nn.pad: reflect padding of dim {axis} must be "
                                                              f"smaller than the dim"))
        if mode == "edge" and (before or after):
            requires.append((d > 0, f"nn.pad: edge padding of the empty dim {axis}"))

    def f(*i):
        index, inside = [], []
        for j, d, (before, _) in zip(i, x.shape, widths):
            k = j - before
            if mode == "constant":
                inside += [k >= 0, k < d] if before or _ else []
                index.append(k)
            elif mode == "edge":
                index.append(E.minimum(E.maximum(k, 0), d - 1))
            else:  # reflect without repeating the edge
                k = select(k < 0, -k, k)
                index.append(select(k >= d, 2 * (d - 1) - k, k))
        value = x[tuple(index)]
        return select(E.all_of(*inside), value, fill) if inside else value

    return [compute(shape, f, "pad", requires)]


@_register("nn.depth_to_space")
def nn_depth_to_space(attrs, inputs, out_type):
    x = inputs[0]
    xd, x_read = _layout_reader(x, attrs.layout, "NCHW")
    b = attrs.block_size
    channels = E.floordiv(xd["C"], b * b)
    requires = [(eq(E.floormod(xd["C"], b * b), 0), "nn.depth_to_space: channels must be divisible by block^2")]

    def f(N, C, H, W):
        b1, b2 = E.floormod(H, b), E.floormod(W, b)
        if attrs.mode == "DCR":
            channel = (b1 * b + b2) * channels + C
        else:
            channel = C * (b * b) + b1 * b + b2
        return x_read(N=N, C=channel, H=E.floordiv(H, b), W=E.floordiv(W, b))

    shape = {"N": xd["N"], "C": channels, "H": xd["H"] * b, "W": xd["W"] * b}
    return [_layout_compute(shape, attrs.layout, f, "depth_to_space", requires)]


@_register("nn.space_to_depth")
def nn_space_to_depth(attrs, inputs, out_type):
    x = inputs[0]
    xd, x_read = _layout_reader(x, attrs.layout, "NCHW")
    b = attrs.block_size
    c = xd["C"]
    requires = [(eq(E.floormod(xd["H"], b), 0), "nn.space_to_depth: height must be divisible by the block"),
                (eq(E.floormod(xd["W"], b), 0), "nn.space_to_depth: width must be divisible by the block")]

    def f(N, C, H, W):
        block = E.floordiv(C, c)
        return x_read(N=N, C=E.floormod(C, c), H=H * b + E.floordiv(block, b), W=W * b + E.floormod(block, b))

    shape = {"N": xd["N"], "C": c * (b * b), "H": E.floordiv(xd["H"], b), "W": E.floordiv(xd["W"], b)}
    return [_layout_compute(shape, attrs.layout, f, "space_to_depth", requires)]


# ---- registration ---------------------------------------------------------------------------------


def _attach():
    for name, fn in COMPUTES.items():
        if is_registered(name):
            get_op(name).compute = fn


_attach()
