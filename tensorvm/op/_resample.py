"""The sampling arithmetic of the resampling ops (image.resize2d, nn.upsampling, image.grid_sample in
op/image.py; ONNX's image.resize in op/onnx_ops.py): source coordinates, rounding, interpolation taps
and weights.

It is written once, over a small math namespace: ``NP`` evaluates it on NumPy index arrays (the
reference kernels), ``TE`` on tensor expressions (the computes that target c compiles). Both run in
float64, so a kernel and its compute agree to the rounding of the C compiler's contractions.

Relay's source coordinates only depend on integers and are computed as one quotient of integers (e.g.
half_pixel's ``(x + 0.5) * in / out - 0.5`` as ``((2x + 1) * in - out) / (2 * out)``), so the rounding
of nearest-neighbour sampling and the floor of the interpolating methods decide exactly where a
coordinate lies on an integer or a half (TVM adds 1e-5 before its floor for the same purpose). ONNX's
coordinates use its float ``scale`` (given, or out / in), as its reference does.
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..te import expr as E
from ..te import intrin as M
from ..te.expr import cast, const
from .transform import is_int_dtype

__all__ = ["F64", "NP", "TE", "Spec", "resize_coordinate", "nearest_index", "axis_taps", "sample", "finish", "clamp",
           "cubic_weights"]

F64 = "float64"


class NP:
    """The math of the sampling code on NumPy arrays."""

    where = staticmethod(np.where)
    floor = staticmethod(np.floor)
    ceil = staticmethod(np.ceil)
    rint = staticmethod(np.rint)
    minimum = staticmethod(np.minimum)
    maximum = staticmethod(np.maximum)
    logical_or = staticmethod(np.logical_or)
    logical_and = staticmethod(np.logical_and)
    abs = staticmethod(np.abs)
    fmod = staticmethod(np.fmod)
    eq = staticmethod(np.equal)
    ne = staticmethod(np.not_equal)

    @staticmethod
    def to_float(v):
        return np.asarray(v, dtype=np.float64)

    @staticmethod
    def to_int(v):
        return np.asarray(v).astype(np.int64)


class TE:
    """The same math on tensor expressions."""

    where = staticmethod(E.select)
    floor = staticmethod(M.floor)
    ceil = staticmethod(M.ceil)
    rint = staticmethod(M.round)
    minimum = staticmethod(E.minimum)
    maximum = staticmethod(E.maximum)
    logical_or = staticmethod(E.logical_or)
    logical_and = staticmethod(E.logical_and)
    abs = staticmethod(M.abs)
    fmod = staticmethod(E.truncmod)
    eq = staticmethod(E.eq)
    ne = staticmethod(E.ne)

    @staticmethod
    def to_float(v):
        return const(float(v), F64) if isinstance(v, (int, float)) else cast(v, F64)

    @staticmethod
    def to_int(v):
        return cast(v, "int64")


def resize_coordinate(m, mode: str, x, in_size, out_size, roi_start=0.0, roi_end=1.0, scale=None):
    """The source coordinate of output position ``x`` along an axis resized from ``in_size`` to
    ``out_size`` (``x`` and the sizes are integers: ints, index arrays or index expressions); with
    ``scale``, ONNX's float formulas (modes half_pixel_symmetric and the others of Resize)."""
    if scale is not None:
        return _onnx_coordinate(m, mode, x, in_size, out_size, scale, roi_start, roi_end)
    f = m.to_float
    wide = out_size > 1
    if mode == "half_pixel":
        return f((2 * x + 1) * in_size - out_size) / f(2 * out_size)
    if mode == "pytorch_half_pixel":
        return m.where(wide, f((2 * x + 1) * in_size - out_size) / f(2 * m.maximum(out_size, 1)), 0.0)
    if mode == "align_corners":
        return m.where(wide, f(x * (in_size - 1)) / f(m.maximum(out_size - 1, 1)), 0.0)
    if mode == "asymmetric":
        return f(x * in_size) / f(m.maximum(out_size, 1))
    if mode == "tf_half_pixel_for_nn":
        return f((2 * x + 1) * in_size) / f(2 * m.maximum(out_size, 1))
    if mode == "tf_crop_and_resize":
        span = f(in_size - 1)
        spread = roi_start * span + f(x) * (roi_end - roi_start) * span / f(m.maximum(out_size - 1, 1))
        return m.where(wide, spread, 0.5 * (roi_start + roi_end) * span)
    raise ShapeError(f"resize: unknown coordinate_transformation_mode {mode!r}")


def _onnx_coordinate(m, mode, x, in_size, out_size, scale, roi_start, roi_end):
    """ONNX Resize's source coordinate, from ``scale`` (float) and the unrounded output length ``scale * in_size``
    (the spec's, for align_corners too: ONNX's own tests of 4 columns scaled by 0.6 divide by 1.4).
    ``pytorch_align_corners`` divides by the output's own length less one, as PyTorch computes
    ``F.interpolate(scale_factor=s, align_corners=True)`` (2 rows from 5 at 0.5: by 1) and ONNX Runtime every
    align_corners; tf_crop_and_resize divides by it too (ONNX Runtime; ONNX's tests agree)."""
    f = m.to_float
    i, n = f(x), f(in_size)
    length = scale * n
    if mode == "half_pixel":
        return (i + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = n / 2.0 * (1.0 - f(out_size) / length)
        return offset + (i + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return m.where(length > 1.0, (i + 0.5) / scale - 0.5, 0.0)
    if mode == "asymmetric":
        return i / scale
    if mode == "align_corners":
        single = m.eq(length, 1.0)
        return m.where(single, 0.0, i * (n - 1.0) / m.where(single, 1.0, length - 1.0))
    single = m.eq(f(out_size), 1.0)
    below = m.where(single, 1.0, f(out_size) - 1.0)  # the divisor where the output is longer than 1
    if mode == "pytorch_align_corners":
        return m.where(single, 0.0, i * (n - 1.0) / below)
    if mode == "tf_crop_and_resize":
        span = m.where(single, (roi_end - roi_start) * (n - 1.0) / 2.0, i * (roi_end - roi_start) * (n - 1.0) / below)
        return span + roi_start * (n - 1.0)
    raise ShapeError(f"image.resize: unknown coordinate_transformation_mode {mode!r}")


def nearest_index(m, rounding: str, c):
    """The integral position (a float) nearest-neighbour sampling reads for the coordinate ``c``."""
    if rounding in ("floor", "ceil"):
        return m.floor(c) if rounding == "floor" else m.ceil(c)
    nearest = m.rint(c)  # half to even
    if rounding == "round":
        return nearest
    tie = m.eq(c - m.floor(c), 0.5)
    return m.where(tie, m.floor(c) if rounding == "round_prefer_floor" else m.ceil(c), nearest)


def cubic_weights(t, alpha):
    """Keys' cubic convolution weights of the taps at -1, 0, 1, 2 for the fraction ``t``."""
    t2, t3 = t * t, t * t * t
    return [alpha * (t3 - 2 * t2 + t),
            (alpha + 2) * t3 - (alpha + 3) * t2 + 1,
            -(alpha + 2) * t3 + (2 * alpha + 3) * t2 - alpha * t,
            alpha * (t2 - t3)]


def clamp(m, i, size):
    return m.minimum(m.maximum(i, 0), size - 1)


def axis_taps(m, spec, c, size):
    """(clamped input positions, weights) that one axis reads around the source coordinate ``c``."""
    base_f = m.floor(c)
    t, base = c - base_f, m.to_int(base_f)
    if spec.method == "linear":
        return [clamp(m, base, size), clamp(m, base + 1, size)], [1.0 - t, t]
    weights = cubic_weights(t, spec.cubic_alpha)
    if spec.cubic_exclude:  # taps outside the input get weight 0, the others are renormalized
        weights = [m.where(m.logical_or(base + (k - 1) < 0, base + (k - 1) >= size), 0.0, w)
                   for k, w in enumerate(weights)]
        total = weights[0] + weights[1] + weights[2] + weights[3]
        weights = [w / total for w in weights]
    return [clamp(m, base + (k - 1), size) for k in range(4)], weights


def sample(m, spec, read, coords, sizes):
    """The value at the source coordinates ``coords`` (one per spatial axis): the nearest element, or
    the separable linear/cubic interpolation in float64 (the last axis innermost).

    ``read(*positions)`` reads the input at integer positions already clamped into range."""
    if spec.method == "nearest_neighbor":
        return read(*(clamp(m, m.to_int(nearest_index(m, spec.rounding, c)), n) for c, n in zip(coords, sizes)))
    taps = [axis_taps(m, spec, c, n) for c, n in zip(coords, sizes)]

    def along(axis, prefix):
        if axis == len(taps):
            return m.to_float(read(*prefix))
        positions, weights = taps[axis]
        values = [along(axis + 1, prefix + (p,)) for p in positions]
        if spec.method == "linear":
            return values[0] * weights[0] + values[1] * weights[1]
        total = values[0] * weights[0]
        for v, w in zip(values[1:], weights[1:]):
            total = total + v * w
        return total

    return along(0, ())


def finish(m, spec, value, coords, sizes, dtype: str):
    """Extrapolation (tf_crop_and_resize) and the conversion to the output dtype (integers round)."""
    if spec.method != "nearest_neighbor" and is_int_dtype(dtype):
        info = np.iinfo(dtype)
        value = m.minimum(m.maximum(m.rint(value), float(info.min)), float(info.max))
    if spec.mode == "tf_crop_and_resize" and coords:
        outside = None
        for c, n in zip(coords, sizes):
            out_c = m.logical_or(c < 0, c > m.to_float(n - 1))
            outside = out_c if outside is None else m.logical_or(outside, out_c)
        value = m.where(outside, m.to_float(spec.extrapolation_value), m.to_float(value))
    return value


class Spec:
    """The sampling parameters of one resize (from the attributes of resize2d or upsampling)."""

    def __init__(self, method, mode, rounding="", cubic_alpha=-0.5, cubic_exclude=0, extrapolation_value=0.0):
        self.method = {"bilinear": "linear", "trilinear": "linear", "bicubic": "cubic"}.get(method, method)
        self.mode = mode
        # Relay's default rounding: round for align_corners, else floor
        self.rounding = rounding or ("round" if mode == "align_corners" else "floor")
        self.cubic_alpha, self.cubic_exclude, self.extrapolation_value = cubic_alpha, cubic_exclude, extrapolation_value
