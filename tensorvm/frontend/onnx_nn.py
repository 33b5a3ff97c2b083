"""Converters of ONNX neural-network ops: matrix products, normalizations, softmax, convolution, pooling,
resizing, reductions and arg-reductions."""

from __future__ import annotations

import math

import numpy as np

from ..errors import TypeInferenceError, UnsupportedError
from ..op.onnx_ops import explicit_pads, window_count
from .onnx_context import UNROLL_LIMIT, check_unrolled, converter
from .onnx_elementwise import scalar_like
from .onnx_shape import reshape_to, slice_10

# ---- matrix products --------------------------------------------------------------------------------


@converter("MatMul", 1)
def matmul_1(ctx, A, B):
    a_nd, b_nd = ctx.ndim(A), ctx.ndim(B)
    if b_nd == 2 and a_nd >= 2:
        return ctx.call("nn.matmul", A, B)
    if a_nd == 3 and b_nd == 3:
        return ctx.call("nn.batch_matmul", A, B, transpose_b=False)
    return ctx.call("onnx.matmul", A, B)


@converter("Gemm", 1)
def gemm_1(ctx, A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):
    if transA:
        A = ctx.call("transpose", A, axes=(1, 0))
    weight = B if transB else ctx.call("transpose", B, axes=(1, 0))
    out = ctx.call("nn.dense", A, weight)
    if alpha != 1.0:
        out = ctx.call("multiply", out, scalar_like(ctx, out, alpha))
    if C is not None and beta != 0:
        if beta != 1.0:
            C = ctx.call("multiply", C, scalar_like(ctx, C, beta))
        out = ctx.call("add", out, C)
    return out


@converter("Einsum", 12)
def einsum_12(ctx, *Inputs, equation):
    return ctx.call("einsum", ctx.tuple(Inputs), equation=equation)


# ---- softmax ---------------------------------------------------------------------------------------------


def _coerced_2d(ctx, x, axis, op_name):
    """Opset < 13 softmax: flatten to 2-d at ``axis``, normalize the rows, restore the shape."""
    ndim = ctx.ndim(x)
    axis = axis + ndim if axis < 0 else axis
    if axis == ndim - 1:
        return ctx.call(op_name, x, axis=-1)
    from .onnx_shape import flatten_1

    flat = flatten_1(ctx, x, axis=axis)
    out = ctx.call(op_name, flat, axis=-1)
    return reshape_to(ctx, out, ctx.shape_of(x))


@converter("Softmax", 1)
def softmax_1(ctx, input, *, axis=1):  # noqa: A002
    return _coerced_2d(ctx, input, axis, "nn.softmax")


@converter("Softmax", 13)
def softmax_13(ctx, input, *, axis=-1):  # noqa: A002
    return ctx.call("nn.softmax", input, axis=axis)


@converter("LogSoftmax", 1)
def log_softmax_1(ctx, input, *, axis=1):  # noqa: A002
    return _coerced_2d(ctx, input, axis, "nn.log_softmax")


@converter("LogSoftmax", 13)
def log_softmax_13(ctx, input, *, axis=-1):  # noqa: A002
    return ctx.call("nn.log_softmax", input, axis=axis)


def _hardmax(ctx, x, axis):
    index = ctx.call("argmax", x, axis=(axis,), keepdims=True)
    depth = ctx.shape(x)[axis]
    if not isinstance(depth, int):
        raise UnsupportedError("Hardmax needs a static size along its axis")
    hot = ctx.call("one_hot", ctx.call("squeeze", index, axis=(axis,)), scalar_like(ctx, x, 1),
                   scalar_like(ctx, x, 0), depth=depth, axis=axis)
    return hot


@converter("Hardmax", 13)
def hardmax_13(ctx, input, *, axis=-1):  # noqa: A002
    return _hardmax(ctx, input, axis % ctx.ndim(input))


# ---- normalizations ----------------------------------------------------------------------------------


def _stash(ctx, x, stash_type):
    """The dtype the statistics are computed in (stash_type 1: float32 for lower-precision inputs)."""
    dtype = ctx.dtype(x)
    return "float32" if stash_type == 1 and dtype == "float16" else dtype


@converter("LayerNormalization", 17)
def layer_normalization_17(ctx, X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    ndim = ctx.ndim(X)
    axis = axis + ndim if axis < 0 else axis
    axes = tuple(range(axis, ndim))
    dtype = ctx.dtype(X)
    used = ctx.outputs_used("LayerNormalization", [X, Scale, B])
    width = ctx.shape(Scale)[0] if ctx.ndim(Scale) == 1 else None
    if used is not None and not any(used[1:]) and axis == ndim - 1 and _stash(ctx, X, stash_type) == dtype \
            and isinstance(width, int) and (B is None or ctx.ndim(B) == 1):
        # Only the normalized output is read: one fused kernel instead of the five steps below.
        beta = B if B is not None else ctx.constant(np.zeros((width,), dtype))
        return ctx.call("nn.layer_norm", X, Scale, beta, axis=-1, epsilon=float(epsilon), center=B is not None)
    x = ctx.cast(X, _stash(ctx, X, stash_type))
    mean = ctx.call("mean", x, axis=axes, keepdims=True)
    centered = ctx.call("subtract", x, mean)
    var = ctx.call("mean", ctx.call("multiply", centered, centered), axis=axes, keepdims=True)
    inv_std = ctx.call("rsqrt", ctx.call("add", var, scalar_like(ctx, var, epsilon)))
    normalized = ctx.cast(ctx.call("multiply", centered, inv_std), dtype)
    y = ctx.call("multiply", normalized, Scale)
    if B is not None:
        y = ctx.call("add", y, B)
    return y, mean, inv_std


@converter("RMSNormalization", 23)
def rms_normalization_23(ctx, X, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    ndim = ctx.ndim(X)
    axis = axis + ndim if axis < 0 else axis
    axes = tuple(range(axis, ndim))
    dtype = ctx.dtype(X)
    x = ctx.cast(X, _stash(ctx, X, stash_type))
    mean_square = ctx.call("mean", ctx.call("multiply", x, x), axis=axes, keepdims=True)
    inv = ctx.call("rsqrt", ctx.call("add", mean_square, scalar_like(ctx, mean_square, epsilon)))
    return ctx.call("multiply", ctx.cast(ctx.call("multiply", x, inv), dtype), scale)


def _per_channel(ctx, v, ndim):
    """A (C,) vector shaped (C, 1, ..., 1) to broadcast over (N, C, spatial...)."""
    return ctx.call("expand_dims", v, axis=1, num_newaxis=ndim - 2) if ndim > 2 else v


@converter("BatchNormalization", 1)
def batch_normalization_1(ctx, X, scale, B, mean, var, *, epsilon=1e-5, momentum=0.9, spatial=1, is_test=0,
                          consumed_inputs=None):
    return batch_normalization_9(ctx, X, scale, B, mean, var, epsilon=epsilon, momentum=momentum)


@converter("BatchNormalization", 9)
def batch_normalization_9(ctx, X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
                          training_mode=0):
    if training_mode:
        return _batch_norm_training(ctx, X, scale, B, input_mean, input_var, epsilon, momentum)
    out = ctx.call("nn.batch_norm", X, scale, B, input_mean, input_var, axis=1, epsilon=float(epsilon))
    return ctx.get_item(out, 0)


@converter("BatchNormalization", 14)
def batch_normalization_14(ctx, X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
                           training_mode=0):
    return batch_normalization_9(ctx, X, scale, B, input_mean, input_var, epsilon=epsilon, momentum=momentum,
                                 training_mode=training_mode)


def _batch_norm_training(ctx, X, scale, B, input_mean, input_var, epsilon, momentum):
    ndim = ctx.ndim(X)
    axes = (0,) + tuple(range(2, ndim))
    mean = ctx.call("mean", X, axis=axes)
    var = ctx.call("variance", X, axis=axes)
    shaped = lambda v: _per_channel(ctx, v, ndim)  # noqa: E731
    inv = ctx.call("rsqrt", ctx.call("add", shaped(var), scalar_like(ctx, var, epsilon)))
    y = ctx.call("add", ctx.call("multiply", ctx.call("multiply", ctx.call("subtract", X, shaped(mean)), inv),
                                 shaped(scale)), shaped(B))
    m = scalar_like(ctx, mean, momentum)
    one_minus = scalar_like(ctx, mean, 1 - momentum)
    running_mean = ctx.call("add", ctx.call("multiply", input_mean, m), ctx.call("multiply", mean, one_minus))
    running_var = ctx.call("add", ctx.call("multiply", input_var, m), ctx.call("multiply", var, one_minus))
    return y, running_mean, running_var


@converter("InstanceNormalization", 1)
def instance_normalization_1(ctx, input, scale, B, *, epsilon=1e-5, consumed_inputs=None):  # noqa: A002
    return ctx.call("nn.instance_norm", input, scale, B, axis=1, epsilon=float(epsilon))


@converter("GroupNormalization", 18)
def group_normalization_18(ctx, X, scale, bias, *, epsilon=1e-5, num_groups, stash_type=1):
    channels = ctx.shape(X)[1]
    if ctx.shape(scale)[0] != channels:  # opset 18: one scale per group
        if not isinstance(channels, int):
            raise UnsupportedError("GroupNormalization-18 with per-group scale needs a static channel count")
        repeat = channels // num_groups
        scale = ctx.call("repeat", scale, repeats=repeat, axis=0)
        bias = ctx.call("repeat", bias, repeats=repeat, axis=0)
    return group_normalization_21(ctx, X, scale, bias, epsilon=epsilon, num_groups=num_groups,
                                  stash_type=stash_type)


@converter("GroupNormalization", 21)
def group_normalization_21(ctx, X, scale, bias, *, epsilon=1e-5, num_groups, stash_type=1):
    return ctx.call("nn.group_norm", X, scale, bias, num_groups=num_groups, axis=1, epsilon=float(epsilon))


@converter("LRN", 1)
def lrn_1(ctx, X, *, alpha=1e-4, beta=0.75, bias=1.0, size):
    return ctx.call("nn.lrn", X, size=size, axis=1, alpha=float(alpha), beta=float(beta), bias=float(bias))


@converter("MeanVarianceNormalization", 9)
def mean_variance_normalization_9(ctx, X, *, axes=(0, 2, 3)):
    mean = ctx.call("mean", X, axis=tuple(axes), keepdims=True)
    centered = ctx.call("subtract", X, mean)
    var = ctx.call("mean", ctx.call("multiply", centered, centered), axis=tuple(axes), keepdims=True)
    return ctx.call("divide", centered, ctx.call("add", ctx.call("sqrt", var), scalar_like(ctx, var, 1e-9)))


# ---- convolution and pooling ----------------------------------------------------------------------------


def _auto_pad(auto_pad) -> str:
    return auto_pad.decode() if isinstance(auto_pad, bytes) else (auto_pad or "NOTSET")


def _add_bias(ctx, out, B):
    if B is None:
        return out
    return ctx.call("add", out, _per_channel(ctx, B, ctx.ndim(out)))


@converter("Conv", 1)
def conv_1(ctx, X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
           strides=None):
    auto_pad = _auto_pad(auto_pad)
    spatial = ctx.ndim(X) - 2
    w_shape = ctx.shape(W)
    if kernel_shape is not None and tuple(kernel_shape) != tuple(w_shape[2:]):
        raise TypeInferenceError(f"Conv: kernel_shape {kernel_shape} does not match the weight {w_shape}")
    padding = explicit_pads(auto_pad, pads, ctx.shape(X)[2:], tuple(w_shape[2:]), tuple(strides or (1,) * spatial),
                            tuple(dilations or (1,) * spatial)) if spatial == 2 else None
    if padding is not None:  # nn.conv2d (its tuned kernels) once SAME's pads are known
        accumulate = getattr(ctx, "accumulate_dtype", None)
        extra = {"out_dtype": accumulate} if accumulate and accumulate != ctx.dtype(X) else {}
        out = ctx.call("nn.conv2d", X, W, strides=tuple(strides or (1, 1)), padding=padding,
                       dilation=tuple(dilations or (1, 1)), groups=group, **extra)
        out = ctx.cast(out, ctx.dtype(X))
    else:
        out = ctx.call("nn.conv_nd", X, W, strides=tuple(strides or ()), pads=tuple(pads or ()),
                       dilations=tuple(dilations or ()), auto_pad=auto_pad, group=group)
    return _add_bias(ctx, out, B)


@converter("ConvTranspose", 1)
def conv_transpose_1(ctx, X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                     output_padding=None, output_shape=None, pads=None, strides=None):
    out = ctx.call("nn.conv_transpose_nd", X, W, strides=tuple(strides or ()), pads=tuple(pads or ()),
                   dilations=tuple(dilations or ()), auto_pad=_auto_pad(auto_pad), group=group,
                   output_padding=tuple(output_padding or ()), output_shape=tuple(output_shape or ()))
    return _add_bias(ctx, out, B)


def _pool(ctx, X, mode, kernel_shape, auto_pad, pads, strides, dilations=None, ceil_mode=0,
          count_include_pad=0, p=2, return_indices=False):
    if not return_indices:
        out = _pool_2d(ctx, X, mode, tuple(kernel_shape), _auto_pad(auto_pad), pads, strides, dilations, ceil_mode,
                       count_include_pad)
        if out is not None:
            return out
    return ctx.call("nn.pool_nd", X, kernel_shape=tuple(kernel_shape), mode=mode, strides=tuple(strides or ()),
                    pads=tuple(pads or ()), dilations=tuple(dilations or ()), auto_pad=_auto_pad(auto_pad),
                    ceil_mode=bool(ceil_mode), count_include_pad=bool(count_include_pad), p=int(p),
                    return_indices=return_indices)


def _pool_2d(ctx, X, mode, kernel_shape, auto_pad, pads, strides, dilations, ceil_mode, count_include_pad):
    """nn.max_pool2d / nn.avg_pool2d (the pools the code generator tunes for) when they compute the ONNX
    pool: 2-d, pads known (explicit, or SAME over static dims) and, in ceil mode, static dims where ONNX's
    rule of dropping a last window that starts in the end padding does not apply. None otherwise."""
    if ctx.ndim(X) != 4 or len(kernel_shape) != 2 or mode not in ("max", "avg"):
        return None
    spatial = tuple(ctx.shape(X)[2:])
    strides, dilations = tuple(strides or (1, 1)), tuple(dilations or (1, 1))
    padding = explicit_pads(auto_pad, pads, spatial, kernel_shape, strides, dilations)
    if padding is None:
        return None
    if ceil_mode:
        if not all(isinstance(d, int) for d in spatial):
            return None
        for d, k, s, dl, begin, end in zip(spatial, kernel_shape, strides, dilations, padding[:2], padding[2:]):
            room = d + begin + end - (k - 1) * dl - 1
            if room < 0 or window_count(d, k, s, dl, begin, end, True) != (room + s - 1) // s + 1:
                return None
    extra = {"count_include_pad": bool(count_include_pad)} if mode == "avg" else {}
    return ctx.call(f"nn.{mode}_pool2d", X, pool_size=kernel_shape, strides=strides, dilation=dilations,
                    padding=padding, ceil_mode=bool(ceil_mode), **extra)


@converter("MaxPool", 1)
def max_pool_1(ctx, X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, pads=None,
               storage_order=0, strides=None):
    if ctx.num_outputs > 1:
        out = _pool(ctx, X, "max", kernel_shape, auto_pad, pads, strides, dilations, ceil_mode,
                    return_indices=True)
        indices = ctx.get_item(out, 1)
        if storage_order:  # column-major numbering of the spatial positions
            indices = _column_major_indices(ctx, X, indices)
        return ctx.get_item(out, 0), indices
    return _pool(ctx, X, "max", kernel_shape, auto_pad, pads, strides, dilations, ceil_mode)


def _column_major_indices(ctx, X, indices):
    shape = ctx.shape(X)
    if ctx.ndim(X) != 4 or not all(isinstance(d, int) for d in shape[2:]):
        raise UnsupportedError("MaxPool: storage_order=1 needs 2-d pooling with a static spatial size")
    h, w = shape[2:]
    i64 = lambda v: ctx.constant(np.array(v, np.int64))  # noqa: E731
    plane = ctx.call("floor_divide", indices, i64(h * w))
    within = ctx.call("floor_mod", indices, i64(h * w))
    row, col = ctx.call("floor_divide", within, i64(w)), ctx.call("floor_mod", within, i64(w))
    return ctx.call("add", ctx.call("multiply", plane, i64(h * w)), ctx.call("add", ctx.call("multiply", col, i64(h)),
                                                                              row))


@converter("AveragePool", 1)
def average_pool_1(ctx, X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None, kernel_shape,
                   pads=None, strides=None):
    return _pool(ctx, X, "avg", kernel_shape, auto_pad, pads, strides, dilations, ceil_mode, count_include_pad)


@converter("LpPool", 2)
def lp_pool_2(ctx, X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, p=2, pads=None,
              strides=None):
    return _pool(ctx, X, "lp", kernel_shape, auto_pad, pads, strides, dilations, ceil_mode, p=p)


@converter("GlobalAveragePool", 1)
def global_average_pool_1(ctx, X):
    return ctx.call("mean", X, axis=tuple(range(2, ctx.ndim(X))), keepdims=True)


@converter("GlobalMaxPool", 1)
def global_max_pool_1(ctx, X):
    return ctx.call("max", X, axis=tuple(range(2, ctx.ndim(X))), keepdims=True)


@converter("GlobalLpPool", 2)
def global_lp_pool_2(ctx, X, *, p=2):
    powered = ctx.call("power", ctx.call("abs", X), scalar_like(ctx, X, p))
    total = ctx.call("sum", powered, axis=tuple(range(2, ctx.ndim(X))), keepdims=True)
    return ctx.call("power", total, scalar_like(ctx, X, 1.0 / p))


# ---- Resize / Upsample -------------------------------------------------------------------------------------


def _resize(ctx, X, roi, scales, sizes, **attrs):
    empty_f = ctx.constant(np.zeros((0,), np.float32))
    empty_i = ctx.constant(np.zeros((0,), np.int64))
    roi = ctx.cast(roi, "float32") if roi is not None else empty_f
    scales = ctx.cast(scales, "float32") if scales is not None else empty_f
    sizes = ctx.cast(sizes, "int64") if sizes is not None else empty_i
    return ctx.call("image.resize", X, roi, scales, sizes, **attrs)


def _resize_mode(mode):
    mode = mode.lower()
    return {"bilinear": "linear", "trilinear": "linear", "bicubic": "cubic"}.get(mode, mode)


@converter("Resize", 10)
def resize_10(ctx, X, scales, *, mode="nearest"):
    return _resize(ctx, X, None, scales, None, mode=_resize_mode(mode), coordinate_transformation_mode="asymmetric",
                   nearest_mode="floor")


@converter("Upsample", 7)
def upsample_7(ctx, X, *, mode="nearest", scales):
    return _resize(ctx, X, None, ctx.constant(np.array(scales, np.float32)), None, mode=_resize_mode(mode),
                   coordinate_transformation_mode="asymmetric", nearest_mode="floor")


@converter("Upsample", 9)
def upsample_9(ctx, X, scales, *, mode="nearest"):
    return resize_10(ctx, X, scales, mode=mode)


_GRID_SAMPLE_MODES = {"bilinear": "bilinear", "linear": "bilinear", "nearest": "nearest", "bicubic": "bicubic",
                      "cubic": "bicubic"}  # (opset 16's names, then opset 20's)


@converter("GridSample", 16)
def grid_sample_16(ctx, X, grid, *, align_corners=0, mode="bilinear", padding_mode="zeros"):
    """ONNX's grid (N, H_out, W_out[, D_out], 2 or 3) is image.grid_sample's with the coordinates first:
    (N, 2 or 3, ...). The same sampling as PyTorch's grid_sample (nearest half to even, cubic a = -0.75)."""
    ndim = ctx.ndim(X)
    if mode not in _GRID_SAMPLE_MODES or ndim not in (4, 5):
        raise UnsupportedError(f"GridSample: expected mode bilinear/linear, nearest or bicubic/cubic on a 4-D or "
                               f"5-D input, got mode {mode!r} on a {ndim}-D input")
    coordinates_first = ctx.call("transpose", grid, axes=(0, ndim - 1, *range(1, ndim - 1)))
    return ctx.call("image.grid_sample", X, coordinates_first, method=_GRID_SAMPLE_MODES[mode],
                    layout="NCHW" if ndim == 4 else "NCDHW", padding_mode=padding_mode,
                    align_corners=bool(align_corners))


@converter("Resize", 11)
def resize_11(ctx, X, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
              coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
              extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
              nearest_mode="round_prefer_floor"):
    if scales is not None and ctx.shape(scales) == (0,):
        scales = None
    if sizes is not None and ctx.shape(sizes) == (0,):
        sizes = None
    if coordinate_transformation_mode == "align_corners" and ctx.importer.model.producer_name == "pytorch":
        # (PyTorch's exporter means PyTorch's align_corners: over the rounded output length, not the spec's unrounded)
        coordinate_transformation_mode = "pytorch_align_corners"
    return _resize(ctx, X, roi, scales, sizes, mode=_resize_mode(mode),
                   coordinate_transformation_mode=coordinate_transformation_mode, nearest_mode=nearest_mode,
                   cubic_coeff_a=float(cubic_coeff_a), exclude_outside=bool(exclude_outside),
                   extrapolation_value=float(extrapolation_value), antialias=bool(antialias),
                   keep_aspect_ratio_policy=keep_aspect_ratio_policy, axes=tuple(axes or ()))


# ---- reductions --------------------------------------------------------------------------------------------

_STATIC_REDUCE = {"sum": "sum", "mean": "mean", "max": "max", "min": "min", "prod": "prod"}


def reduce(ctx, data, mode, axes, keepdims, noop_with_empty_axes=0):
    """An ONNX reduction; ``axes`` is a list (known) or an expression (run-time)."""
    keepdims = bool(keepdims)
    ndim = ctx.ndim(data)
    if axes is not None and not isinstance(axes, list):
        known = ctx.int_list(axes)
        if known is None:
            count = ctx.shape(axes)[0] if ctx.ndim(axes) == 1 else 1
            if not keepdims and not (isinstance(count, int) and count > 0):
                raise UnsupportedError(f"Reduce ({mode}) with keepdims=0: the number of elements of the run-time "
                                       f"input 'axes' decides the output rank and must be known at import, got "
                                       f"{ctx.tensor_type(axes)!r}")
            return run_time_reduce(ctx, data, mode, ctx.cast(axes, "int64"), keepdims, not noop_with_empty_axes)
        axes = known
    if not axes:
        # noop_with_empty_axes reduces over no axes: the reduction's elementwise part still applies (abs, square,
        # log, ...), the input itself only for the plain reductions
        axes = [] if noop_with_empty_axes else list(range(ndim))
    axes = tuple(sorted(a + ndim if a < 0 else a for a in axes))
    shape = ctx.shape(data)
    empty = any(isinstance(shape[a], int) and shape[a] == 0 for a in axes)
    if not empty and ctx.dtype(data) == "bool" and mode in ("max", "min"):
        return ctx.call("any" if mode == "max" else "all", data, axis=axes, keepdims=keepdims)
    # (max and min have no value over nothing, where ONNX 18 gives -inf / +inf: a reduced dim that may be 0
    # at run time goes through dyn.reduce too)
    empty = empty or (mode in ("max", "min") and not all(isinstance(shape[a], int) for a in axes))
    if empty or ctx.dtype(data) == "bool":  # (dyn.reduce gives the identity of an empty reduction)
        return run_time_reduce(ctx, data, mode, ctx.constant(np.array(axes, np.int64)), keepdims, True)
    if mode in _STATIC_REDUCE:
        return ctx.call(_STATIC_REDUCE[mode], data, axis=axes, keepdims=keepdims)
    if mode == "log_sum_exp":
        return ctx.call("logsumexp", data, axis=axes, keepdims=keepdims)
    if mode == "l1":
        return ctx.call("sum", ctx.call("abs", data), axis=axes, keepdims=keepdims)
    if mode in ("l2", "sum_square"):
        total = ctx.call("sum", ctx.call("multiply", data, data), axis=axes, keepdims=keepdims)
        if mode == "sum_square":
            return total
        if ctx.dtype(data).startswith("float"):
            return ctx.call("sqrt", total)
        return ctx.cast(ctx.call("sqrt", ctx.cast(total, "float64")), ctx.dtype(data))
    if mode == "log_sum":
        return ctx.call("log", ctx.call("sum", data, axis=axes, keepdims=keepdims))
    raise UnsupportedError(f"reduction {mode}")


def run_time_reduce(ctx, data, mode, axes, keepdims, empty_is_all):
    """An ONNX reduction over the int64 tensor ``axes`` as core ``dyn.reduce`` calls (sum, mean, max, min,
    prod) and elementwise ops for the other modes."""
    out = _run_time_reduce_keepdims(ctx, data, mode, axes, empty_is_all)
    return out if keepdims else ctx.call("dyn.squeeze", out, axes)


def _run_time_reduce_keepdims(ctx, data, mode, axes, empty_is_all):
    def dyn(x, how):
        return ctx.call("dyn.reduce", x, axes, mode=how, empty_is_all=empty_is_all)

    if mode in _STATIC_REDUCE:
        return dyn(data, mode)
    if mode == "l1":
        return dyn(ctx.call("abs", data), "sum")
    if mode in ("l2", "sum_square"):
        total = dyn(ctx.call("multiply", data, data), "sum")
        if mode == "sum_square":
            return total
        if ctx.dtype(data).startswith("float"):
            return ctx.call("sqrt", total)
        return ctx.cast(ctx.call("sqrt", ctx.cast(total, "float64")), ctx.dtype(data))
    if mode == "log_sum":
        return ctx.call("log", dyn(data, "sum"))
    if mode == "log_sum_exp":  # shifted by the (finite) maximum, as logsumexp is
        peak = dyn(data, "max")
        peak = ctx.call("where", ctx.call("isfinite", peak), peak, ctx.call("zeros_like", peak))
        return ctx.call("add", ctx.call("log", dyn(ctx.call("exp", ctx.call("subtract", data, peak)), "sum")), peak)
    raise UnsupportedError(f"reduction {mode}")


def _register_reduce(op_type, mode, axes_input_version):
    def with_attr(ctx, data, *, axes=None, keepdims=1):
        return reduce(ctx, data, mode, list(axes) if axes is not None else None, keepdims)

    def with_input(ctx, data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        return reduce(ctx, data, mode, axes, keepdims, noop_with_empty_axes)

    with_attr.__name__ = f"{op_type.lower()}_1"
    with_input.__name__ = f"{op_type.lower()}_{axes_input_version}"
    converter(op_type, 1)(with_attr)
    converter(op_type, axes_input_version)(with_input)


_register_reduce("ReduceSum", "sum", 13)
for _op_type, _mode in [("ReduceMean", "mean"), ("ReduceMax", "max"), ("ReduceMin", "min"), ("ReduceProd", "prod"),
                        ("ReduceL1", "l1"), ("ReduceL2", "l2"), ("ReduceSumSquare", "sum_square"),
                        ("ReduceLogSum", "log_sum"), ("ReduceLogSumExp", "log_sum_exp")]:
    _register_reduce(_op_type, _mode, 18)


def _arg(op_name):
    def convert(ctx, data, *, axis=0, keepdims=1, select_last_index=0):
        out = ctx.call(op_name, data, axis=(axis,), keepdims=bool(keepdims), select_last_index=bool(select_last_index))
        return ctx.cast(out, "int64")

    return convert


converter("ArgMax", 1)(_arg("argmax"))
converter("ArgMin", 1)(_arg("argmin"))


@converter("LpNormalization", 1)
def lp_normalization_1(ctx, input, *, axis=-1, p=2):  # noqa: A002
    """input / its L1 or L2 norm along axis; a zero norm divides by 1 (zeros stay zeros, as ONNX Runtime
    gives)."""
    if p not in (1, 2):
        raise TypeInferenceError(f"LpNormalization: p must be 1 or 2, got {p}")
    axis = axis + ctx.ndim(input) if axis < 0 else axis
    if p == 1:
        norm = ctx.call("sum", ctx.call("abs", input), axis=(axis,), keepdims=True)
    else:
        norm = ctx.call("sqrt", ctx.call("sum", ctx.call("multiply", input, input), axis=(axis,), keepdims=True))
    return ctx.call("divide", input, ctx.divisor(norm))


def _nll(ctx, x, target, weight, reduction: str, ignore_index, op: str):
    """ONNX's negative log likelihood over x (N, C, d...) at target (N, d...), as its reference computes it:
    -x[n, target, d] times the target's weight (zero where target is ignore_index); ``mean`` divides the
    sum by the weights' sum (by the element count when there are neither weights nor an ignore_index
    other than -1, ignored elements counting as zeros there, as the reference does)."""
    if reduction not in ("none", "sum", "mean"):
        raise UnsupportedError(f"{op}: reduction {reduction!r}")
    if ctx.ndim(x) < 2:
        raise TypeInferenceError(f"{op}: the input needs a class axis (rank >= 2), got rank {ctx.ndim(x)}")
    dtype, i64 = ctx.dtype(x), "int64"
    target = ctx.cast(target, i64)
    ignored = None
    if ignore_index is not None:
        ignored = ctx.call("equal", target, ctx.constant(np.array(ignore_index, i64)))
        target = ctx.call("where", ignored, ctx.constant(np.array(0, i64)), target)  # (a safe index)
    picked = ctx.call("squeeze", ctx.call("gather", x, ctx.call("expand_dims", target, axis=1), axis=1), axis=(1,))
    loss = ctx.call("negative", picked)
    zero, one = ctx.constant(np.array(0, dtype)), ctx.constant(np.array(1, dtype))
    weights = None
    if weight is not None:
        weights = ctx.call("take", weight, target, axis=0, mode="clip")
    elif ignore_index != -1:
        weights = ctx.call("full_like", loss, one)
    if ignored is not None:
        loss = ctx.call("where", ignored, zero, loss)
        if weights is not None:
            weights = ctx.call("where", ignored, zero, weights)
    if weights is not None:
        loss = ctx.call("multiply", loss, weights)
    if reduction == "none":
        return loss
    total = ctx.call("sum", loss)
    if reduction == "sum":
        return total
    if weights is not None:
        return ctx.call("divide", total, ctx.call("sum", weights))
    return ctx.call("mean", loss)


@converter("NegativeLogLikelihoodLoss", 12)
def negative_log_likelihood_loss_12(ctx, input, target, weight=None, *, ignore_index=None, reduction="mean"):  # noqa: A002
    return _nll(ctx, input, target, weight, reduction, ignore_index, "NegativeLogLikelihoodLoss")


@converter("SoftmaxCrossEntropyLoss", 12)
def softmax_cross_entropy_loss_12(ctx, scores, labels, weights=None, *, ignore_index=None, reduction="mean"):
    log_prob = ctx.call("nn.log_softmax", scores, axis=1)
    loss = _nll(ctx, log_prob, labels, weights, reduction, ignore_index, "SoftmaxCrossEntropyLoss")
    return loss, log_prob


@converter("AffineGrid", 20)
def affine_grid_20(ctx, theta, size, *, align_corners=0):
    """The sampling grid of a spatial transformer: theta (N, 2, 3) or (N, 3, 4) times the homogeneous
    coordinates (x, y[, z], 1) of every output pixel, x along W, y along H, z along D, each in [-1, 1]
    (pixel centres, or the corners with ``align_corners``); (N, H, W, 2) or (N, D, H, W, 3). Computed in
    float64 and cast to theta's type, as ONNX's reference does; ``size`` may be known only at run time."""
    sizes = ctx.shape(size)
    if len(sizes) != 1 or sizes[0] not in (4, 5):
        raise TypeInferenceError(f"AffineGrid: size must hold 4 (2-D) or 5 (3-D) entries, got shape {sizes}")
    spatial = sizes[0] - 2
    f64, i64 = "float64", "int64"
    size = ctx.cast(size, i64)

    def entry(i):
        return ctx.call("take", size, ctx.constant(np.array(i, np.int64)), axis=0)

    dims = [entry(2 + i) for i in range(spatial)]  # (D,) H, W
    one = ctx.constant(np.array(1.0))

    def coords(count):  # -1 + (2 i + 1) / count, or -1 + 2 i / (count - 1)
        i = ctx.cast(ctx.indices(count), f64)
        n = ctx.cast(count, f64)
        if align_corners:
            return ctx.call("subtract", ctx.call("divide", ctx.call("multiply", i, ctx.constant(np.array(2.0))),
                                                 ctx.call("subtract", n, one)), one)
        twice = ctx.call("add", ctx.call("multiply", i, ctx.constant(np.array(2.0))), one)
        return ctx.call("subtract", ctx.call("divide", twice, n), one)

    shape = ctx.call("concatenate", ctx.tuple([ctx.call("expand_dims", d, axis=0) for d in dims]), axis=0)
    axes = []
    for position in reversed(range(spatial)):  # x (the last axis), y, z
        newshape = tuple(-1 if i == position else 1 for i in range(spatial))
        values = ctx.call("reshape", coords(dims[position]), newshape=newshape)
        axes.append(ctx.call("dyn.broadcast_to", values, shape))
    axes.append(ctx.call("dyn.broadcast_to", ctx.call("reshape", one, newshape=(1,) * spatial), shape))
    base = ctx.call("concatenate", ctx.tuple([ctx.call("expand_dims", a, axis=spatial) for a in axes]), axis=spatial)
    base = ctx.call("reshape", base, newshape=(1, -1, spatial + 1))  # (1, pixels, spatial + 1)
    grid = ctx.call("onnx.matmul", base, ctx.call("transpose", ctx.cast(theta, f64), axes=(0, 2, 1)))
    out_shape = ctx.call("concatenate", ctx.tuple([ctx.call("expand_dims", entry(0), axis=0), shape,
                                                  ctx.constant(np.array([spatial], np.int64))]), axis=0)
    return ctx.cast(ctx.call("dyn.reshape", grid, out_shape), ctx.dtype(theta))


@converter("Det", 11)
def det_11(ctx, X):
    """The determinant of each (n, n) matrix of X (..., n, n), by Gaussian elimination with partial pivoting
    written out for the static n: per column, the row of the largest magnitude swapped up (the sign
    flipped), the pivot multiplied in, the rows below eliminated. A zero pivot column gives 0."""
    shape = ctx.shape(X)
    if len(shape) < 2 or not isinstance(shape[-1], int) or shape[-1] != shape[-2]:
        raise UnsupportedError(f"Det: needs square matrices of a static size, got shape {shape}")
    n, rank, dtype = shape[-1], len(shape), ctx.dtype(X)
    check_unrolled("Det", n, "the matrix size (a step per column)")
    rows, cols = rank - 2, rank - 1

    def part(x, axis, begin, end):
        return ctx.call("strided_slice", x, begin=(begin,), end=(end,), axes=(axis,))

    def const(value):
        return ctx.constant(np.array(value, dtype))

    a = X
    det = None
    sign = None
    order = ctx.constant(np.arange(n, dtype=np.int64))
    for k in range(n):
        column = part(part(a, cols, k, k + 1), rows, k, n)  # (..., n - k, 1)
        offset = ctx.call("argmax", ctx.call("abs", column), axis=(rows,), keepdims=True)  # (..., 1, 1)
        pivot_row = ctx.call("add", ctx.cast(offset, "int64"), ctx.constant(np.array(k, np.int64)))
        # rows k and pivot_row swapped: a gather of the rows at the permuted order
        at_k = ctx.call("equal", order, ctx.constant(np.array(k, np.int64)))
        at_pivot = ctx.call("equal", ctx.call("reshape", order, newshape=(1,) * (rank - 2) + (n, 1)), pivot_row)
        permuted = ctx.call("where", ctx.call("reshape", at_k, newshape=(n, 1)), pivot_row,
                            ctx.call("where", at_pivot, ctx.constant(np.array(k, np.int64)),
                                     ctx.call("reshape", order, newshape=(n, 1))))  # (..., n, 1)
        a = ctx.call("gather", a, ctx.call("broadcast_to_like", permuted, a), axis=rows)
        swapped = ctx.call("not_equal", offset, ctx.call("zeros_like", offset))
        flip = ctx.call("where", swapped, const(-1), const(1))
        sign = flip if sign is None else ctx.call("multiply", sign, flip)
        pivot = part(part(a, rows, k, k + 1), cols, k, k + 1)  # (..., 1, 1)
        det = pivot if det is None else ctx.call("multiply", det, pivot)
        if k + 1 < n:
            factors = ctx.call("divide", part(part(a, rows, k + 1, n), cols, k, k + 1), ctx.divisor(pivot))
            below = ctx.call("subtract", part(a, rows, k + 1, n),
                             ctx.call("multiply", factors, part(a, rows, k, k + 1)))
            a = ctx.call("concatenate", ctx.tuple([part(a, rows, 0, k + 1), below]), axis=rows)
    return ctx.call("squeeze", ctx.call("multiply", det, sign), axis=(rows, cols))


@converter("Col2Im", 18)
def col2im_18(ctx, input, image_shape, block_shape, *, dilations=None, pads=None, strides=None):  # noqa: A002
    """Column blocks summed back into the image (PyTorch's fold): every output pixel gathers the entries
    of the blocks that cover it (a map computed at import from the constant image and block shapes;
    positions no block covers gather an appended zero) and sums them."""
    image = ctx.int_list(image_shape)
    block = ctx.int_list(block_shape)
    if image is None or block is None:
        return _col2im_at_run_time(ctx, input, image_shape, block_shape, dilations, pads, strides)
    dims = len(image)
    if len(block) != dims or ctx.ndim(input) != 3:
        raise TypeInferenceError(f"Col2Im: {dims} image dims, {len(block)} block dims, input of rank "
                                 f"{ctx.ndim(input)} (expected N x C*prod(block) x L)")
    dilations, strides = list(dilations or [1] * dims), list(strides or [1] * dims)
    pads = list(pads or [0] * (2 * dims))
    counts = [(image[d] + pads[d] + pads[d + dims] - dilations[d] * (block[d] - 1) - 1) // strides[d] + 1
              for d in range(dims)]
    kernel, blocks = math.prod(block), math.prod(counts)
    if kernel * blocks > UNROLL_LIMIT or math.prod(image) > UNROLL_LIMIT:  # (the map: computed at run time)
        return _col2im_at_run_time(ctx, input, image_shape, block_shape, dilations, pads, strides)
    width, length = ctx.shape(input)[1], ctx.shape(input)[2]
    if min(counts) < 1 or (isinstance(length, int) and length != blocks) \
            or (isinstance(width, int) and width % kernel):
        raise TypeInferenceError(f"Col2Im: input {ctx.shape(input)} does not hold the {kernel}-element blocks at "
                                 f"{counts} positions of an image {image}")
    # entry (k, l) (kernel offset k, block position l) lands on pixel sum_d x_d, x_d = l_d s_d - p_d + k_d r_d
    offsets = np.stack(np.meshgrid(*[np.arange(b) for b in block], indexing="ij"), -1).reshape(kernel, 1, dims)
    places = np.stack(np.meshgrid(*[np.arange(c) for c in counts], indexing="ij"), -1).reshape(1, blocks, dims)
    at = places * np.array(strides) - np.array(pads[:dims]) + offsets * np.array(dilations)
    inside = np.all((at >= 0) & (at < np.array(image)), axis=-1)
    pixel = np.ravel_multi_index(tuple(np.where(inside[..., None], at, 0).transpose(2, 0, 1)), image)
    pixels = math.prod(image)
    # each pixel's entries, in entry order: the entries inside sorted (stably) by pixel, the j-th of a pixel
    # in its row's column j; the columns a pixel does not fill gather the appended zero entry
    entries = np.flatnonzero(inside.reshape(-1))
    targets = pixel.reshape(-1)[entries]
    order = np.argsort(targets, kind="stable")
    entries, targets = entries[order], targets[order]
    counts = np.bincount(targets, minlength=pixels)
    column = np.arange(len(targets)) - (np.cumsum(counts) - counts)[targets]
    index = np.full((pixels, max(1, int(counts.max(initial=0)))), kernel * blocks, np.int64)  # (pixels, most)
    index[targets, column] = entries
    channels = ctx.call("reshape", input, newshape=(0, -1, kernel * blocks))  # (N, C, K * L)
    padded = ctx.call("nn.pad", channels, ctx.constant(np.array(0, ctx.dtype(input))), pad_width=((0, 0), (0, 0), (0, 1)))
    summed = ctx.call("sum", ctx.call("take", padded, ctx.constant(index), axis=2, mode="clip"), axis=(3,))
    return ctx.call("reshape", summed, newshape=(0, 0, *image))


def _col2im_at_run_time(ctx, data, image_shape, block_shape, dilations, pads, strides):
    """Col2Im with a run-time image or block shape: each entry's pixel computed at run time from the
    shapes, the entries added into zeros there (``scatter_elements`` with ``add``; entries outside the
    image go to one extra slot, dropped)."""
    i64 = "int64"
    dims = ctx.shape(image_shape)[0] if ctx.ndim(image_shape) == 1 else None
    if not isinstance(dims, int) or ctx.shape(block_shape) != (dims,) or ctx.ndim(data) != 3:
        raise TypeInferenceError("Col2Im: image_shape and block_shape must be 1-D of one static length, the input "
                                 "N x C*prod(block) x L")
    dilations, strides = list(dilations or [1] * dims), list(strides or [1] * dims)
    pads = list(pads or [0] * (2 * dims))
    image, block = ctx.cast(image_shape, i64), ctx.cast(block_shape, i64)

    def const(v):
        return ctx.constant(np.array(v, np.int64))

    def at(vec, d):
        return ctx.call("take", vec, const(d), axis=0)

    sizes = [at(image, d) for d in range(dims)]
    taps = [at(block, d) for d in range(dims)]
    counts = [ctx.call("add", ctx.call("floor_divide", ctx.call("subtract", ctx.call(
        "subtract", ctx.call("add", sizes[d], const(pads[d] + pads[d + dims])),
        ctx.call("multiply", const(dilations[d]), ctx.call("subtract", taps[d], const(1)))), const(1)),
        const(strides[d])), const(1)) for d in range(dims)]
    kernel = ctx.call("prod", block, axis=(0,))
    blocks = ctx.dim_value(data, 2)
    k = ctx.call("expand_dims", ctx.indices(kernel), axis=1)  # (K, 1)
    l = ctx.call("expand_dims", ctx.indices(blocks), axis=0)  # (1, L)  # noqa: E741
    pixel, inside, k_rest, l_rest, pixels = const(0), None, k, l, const(1)
    for d in range(dims - 1, -1, -1):  # the last dim varies fastest in k, l and the pixel index
        k_d, k_rest = ctx.call("floor_mod", k_rest, taps[d]), ctx.call("floor_divide", k_rest, taps[d])
        l_d, l_rest = ctx.call("floor_mod", l_rest, counts[d]), ctx.call("floor_divide", l_rest, counts[d])
        x_d = ctx.call("add", ctx.call("subtract", ctx.call("multiply", l_d, const(strides[d])), const(pads[d])),
                       ctx.call("multiply", k_d, const(dilations[d])))
        ok = ctx.call("logical_and", ctx.call("greater_equal", x_d, const(0)), ctx.call("less", x_d, sizes[d]))
        inside = ok if inside is None else ctx.call("logical_and", inside, ok)
        pixel = ctx.call("add", pixel, ctx.call("multiply", x_d, pixels))
        pixels = ctx.call("multiply", pixels, sizes[d])
    target = ctx.call("reshape", ctx.call("where", inside, pixel, pixels), newshape=(1, 1, -1))  # (1, 1, K * L)
    values = ctx.call("reshape", data, newshape=(0, -1, 0))  # (N, C * K, L)
    channels_vec = ctx.shape_vector([ctx.dim_value(data, 0), -1, ctx.call("multiply", kernel, blocks)])
    values = reshape_to(ctx, values, channels_vec)  # (N, C, K * L)
    index = ctx.call("add", target, ctx.call("zeros_like", ctx.cast(values, i64)))  # (one per entry)
    out_shape = ctx.shape_vector([ctx.dim_value(data, 0), ctx.dim_value(values, 1),
                                  ctx.call("add", pixels, const(1))])
    zeros = ctx.call("dyn.zeros", out_shape, dtype=ctx.dtype(data))
    summed = ctx.call("scatter_elements", zeros, index, values, axis=2, reduction="add")
    kept = slice_10(ctx, summed, ctx.constant(np.array([0], np.int64)), ctx.call("expand_dims", pixels, axis=0),
                    ctx.constant(np.array([2], np.int64)))
    return reshape_to(ctx, kept, ctx.shape_vector([ctx.dim_value(data, 0), ctx.dim_value(values, 1), *sizes]))


@converter("DeformConv", 19)
def deform_conv_19(ctx, X, W, offset, B=None, mask=None, *, dilations=None, group=1, kernel_shape=None,
                   offset_group=1, pads=None, strides=None):
    """2-D deformable convolution: each output pixel's kernel taps sample X bilinearly (zero outside the
    image) at their place moved by the offsets, times the mask, then a grouped product with the weights.
    The samples are four gathers (the corners) weighted per tap; the product one ``onnx.matmul`` of the
    (group, out/group, in/group * taps) weights with the (N, group, in/group * taps, pixels) samples."""
    if ctx.ndim(X) != 4:
        raise UnsupportedError(f"DeformConv: {ctx.ndim(X) - 2}-D input; tensorvm converts the 2-D one")
    _, channels, height, width = ctx.shape(X)
    out_channels, group_channels, kh, kw = ctx.shape(W)
    if not all(isinstance(d, int) for d in (channels, height, width, out_channels, kh, kw)):
        raise UnsupportedError("DeformConv: the input's channels and size and the weight's shape must be static")
    if kernel_shape is not None and tuple(kernel_shape) != (kh, kw):
        raise TypeInferenceError(f"DeformConv: kernel_shape {kernel_shape} does not match the weight {ctx.shape(W)}")
    if channels != group_channels * group or out_channels % group or channels % offset_group:
        raise TypeInferenceError(f"DeformConv: {channels} input channels, weight {ctx.shape(W)}, group {group}, "
                                 f"offset_group {offset_group}")
    sh, sw = strides or (1, 1)
    dh, dw = dilations or (1, 1)
    pt, pl, pb, pr = pads or (0, 0, 0, 0)
    oh = (height + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (width + pl + pr - (kw - 1) * dw - 1) // sw + 1
    taps, pixels, f = kh * kw, oh * ow, ctx.dtype(X)
    check_unrolled("DeformConv", taps * pixels, "the kernel's taps times the output's pixels")
    if any(isinstance(got, int) and got != want
           for got, want in zip(ctx.shape(offset)[1:], (offset_group * taps * 2, oh, ow), strict=True)):
        raise TypeInferenceError(f"DeformConv: offset {ctx.shape(offset)}, expected (N, {offset_group * taps * 2}, "
                                 f"{oh}, {ow})")
    # where each tap of each output pixel reads before the offsets: (taps, pixels)
    tap_y, tap_x = np.meshgrid(np.arange(kh) * dh, np.arange(kw) * dw, indexing="ij")
    out_y, out_x = np.meshgrid(np.arange(oh) * sh - pt, np.arange(ow) * sw - pl, indexing="ij")
    base_y = (tap_y.reshape(-1, 1) + out_y.reshape(1, -1)).astype(f)
    base_x = (tap_x.reshape(-1, 1) + out_x.reshape(1, -1)).astype(f)
    moves = ctx.call("reshape", offset, newshape=(0, offset_group, taps, 2, pixels))
    y = ctx.call("add", ctx.constant(base_y), ctx.call("take", moves, ctx.constant(np.array(0)), axis=3))
    x = ctx.call("add", ctx.constant(base_x), ctx.call("take", moves, ctx.constant(np.array(1)), axis=3))
    y0, x0 = ctx.call("floor", y), ctx.call("floor", x)
    fy, fx = ctx.call("subtract", y, y0), ctx.call("subtract", x, x0)
    one = ctx.constant(np.array(1, f))
    images = ctx.call("reshape", X, newshape=(0, offset_group, channels // offset_group, height * width))
    spread = ctx.constant(np.zeros((1, 1, channels // offset_group, 1), np.int64))  # (the channels' axis)
    sampled = None
    for dy, wy in ((0, ctx.call("subtract", one, fy)), (1, fy)):
        for dx, wx in ((0, ctx.call("subtract", one, fx)), (1, fx)):
            yy = ctx.call("add", y0, ctx.constant(np.array(dy, f)))
            xx = ctx.call("add", x0, ctx.constant(np.array(dx, f)))
            inside = ctx.call("logical_and", _within(ctx, yy, height), _within(ctx, xx, width))
            weight = ctx.call("where", inside, ctx.call("multiply", wy, wx), ctx.constant(np.array(0, f)))
            row = ctx.call("clip", ctx.cast(yy, "int64"), a_min=0, a_max=height - 1)
            col = ctx.call("clip", ctx.cast(xx, "int64"), a_min=0, a_max=width - 1)
            flat = ctx.call("add", ctx.call("multiply", row, ctx.constant(np.array(width, np.int64))), col)
            index = ctx.call("add", ctx.call("reshape", flat, newshape=(0, offset_group, 1, taps * pixels)), spread)
            corner = ctx.call("multiply", ctx.call("gather", images, index, axis=3),
                              ctx.call("reshape", weight, newshape=(0, offset_group, 1, taps * pixels)))
            sampled = corner if sampled is None else ctx.call("add", sampled, corner)
    if mask is not None:
        sampled = ctx.call("multiply", sampled, ctx.call("reshape", mask, newshape=(0, offset_group, 1, taps * pixels)))
    columns = ctx.call("reshape", sampled, newshape=(0, group, group_channels * taps, pixels))
    kernels = ctx.call("reshape", W, newshape=(group, out_channels // group, group_channels * taps))
    out = ctx.call("reshape", ctx.call("onnx.matmul", kernels, columns), newshape=(0, out_channels, oh, ow))
    return _add_bias(ctx, out, B)


def _within(ctx, v, size: int):
    """0 <= v < size, elementwise (v a float tensor of whole numbers)."""
    f = ctx.dtype(v)
    return ctx.call("logical_and", ctx.call("greater_equal", v, ctx.constant(np.array(0, f))),
                    ctx.call("less", v, ctx.constant(np.array(size, f))))
