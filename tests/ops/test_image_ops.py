"""image.resize2d, nn.upsampling(3d) and their dyn forms (Relay's signatures) against a loop oracle with exact
(Fraction) source coordinates and Keys' cubic kernel written from its definition; on the kernel, the
interpreter, target python and target c (no NumPy fallback)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from op_testing import check_op
from relay_runner import check_everywhere, run_everywhere

import tensorvm as tv
from tensorvm.errors import AttrError, ShapeError, TypeInferenceError
from tensorvm.ir.types import Any, SymDim, TensorType
from tensorvm.op import get_op

MODES = ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel", "tf_half_pixel_for_nn",
         "tf_crop_and_resize")


def _coordinate(mode, i, size_in, size_out, start, end):
    if mode == "tf_crop_and_resize":
        if size_out > 1:
            return start * (size_in - 1) + i * (end - start) * (size_in - 1) / (size_out - 1)
        return 0.5 * (start + end) * (size_in - 1)
    i, n, m = Fraction(i), Fraction(size_in), Fraction(size_out)
    half = Fraction(1, 2)
    if mode == "half_pixel" or (mode == "pytorch_half_pixel" and size_out > 1):
        return (i + half) * n / m - half
    if mode == "pytorch_half_pixel":
        return Fraction(0)
    if mode == "align_corners":
        return i * (n - 1) / (m - 1) if size_out > 1 else Fraction(0)
    if mode == "asymmetric":
        return i * n / m
    return (i + half) * n / m  # tf_half_pixel_for_nn


def _nearest(c, rounding):
    c = Fraction(c)
    if rounding == "round":
        return round(c)  # Python rounds a Fraction half to even
    if rounding == "round_prefer_floor":
        return math.ceil(c - Fraction(1, 2))
    if rounding == "round_prefer_ceil":
        return math.floor(c + Fraction(1, 2))
    return math.floor(c) if rounding == "floor" else math.ceil(c)


def _keys(d, a):
    d = abs(d)
    if d <= 1:
        return (a + 2) * d**3 - (a + 3) * d**2 + 1
    if d < 2:
        return a * d**3 - 5 * a * d**2 + 8 * a * d - 4 * a
    return 0.0


def _taps(c, size, method, alpha, exclude):
    """(input positions, weights) of one axis."""
    base = math.floor(c)
    t = float(c - base)
    if method == "linear":
        return [base, base + 1], [1 - t, t]
    positions = [base + k for k in (-1, 0, 1, 2)]
    weights = [_keys(t - k, alpha) for k in (-1, 0, 1, 2)]
    if exclude:
        weights = [w if 0 <= p < size else 0.0 for p, w in zip(positions, weights)]
        weights = [w / sum(weights) for w in weights]
    return positions, weights


def resize_oracle(x, size, method="linear", mode="half_pixel", rounding="", alpha=-0.5, exclude=0, roi=None,
                  extrapolation=0.0, channels_last=False, out_dtype=None):
    """Plain loops over the output positions of 2 or 3 spatial axes (channels first or last)."""
    d = x.ndim - 2
    roi = roi or (0.0,) * (2 * d)
    xc = np.moveaxis(x, -1, 1) if channels_last else x
    rounding = rounding or ("round" if mode == "align_corners" else "floor")  # Relay's default
    in_sizes = xc.shape[2:]
    out = np.zeros(xc.shape[:2] + tuple(size))
    for position in itertools.product(*(range(n) for n in size)):
        coords = [_coordinate(mode, i, n, m, roi[k], roi[k + d])
                  for k, (i, n, m) in enumerate(zip(position, in_sizes, size))]
        where = (slice(None), slice(None)) + position
        if mode == "tf_crop_and_resize" and not all(0 <= c <= n - 1 for c, n in zip(coords, in_sizes)):
            out[where] = extrapolation
        elif method == "nearest_neighbor":
            out[where] = xc[(slice(None), slice(None)) + tuple(
                min(max(_nearest(c, rounding), 0), n - 1) for c, n in zip(coords, in_sizes))]
        else:
            taps = [list(zip(*_taps(c, n, method, alpha, exclude))) for c, n in zip(coords, in_sizes)]
            for combo in itertools.product(*taps):
                weight = math.prod(w for _, w in combo)
                index = tuple(min(max(p, 0), n - 1) for (p, _), n in zip(combo, in_sizes))
                out[where] += weight * xc[(slice(None), slice(None)) + index].astype(np.float64)
    dtype = np.dtype(out_dtype or x.dtype)
    if dtype.kind in "iu" and method != "nearest_neighbor":
        out = np.clip(np.rint(out), np.iinfo(dtype).min, np.iinfo(dtype).max)
    out = out.astype(dtype)
    return np.moveaxis(out, 1, -1) if channels_last else out


def resize2d_oracle(x, size, method="linear", mode="half_pixel", rounding="", alpha=-0.5, exclude=0,
                    roi=(0.0, 0.0, 0.0, 0.0), extrapolation=0.0, layout="NCHW", out_dtype=None):
    return resize_oracle(x, size, method, mode, rounding, alpha, exclude, roi, extrapolation, layout == "NHWC",
                         out_dtype)


def _data(shape, dtype="float32", seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, 200, shape).astype(dtype)


def test_known_values():
    row = np.array([[[[0.0, 1.0]]]], "float32")
    cases = [
        (dict(method="linear", coordinate_transformation_mode="align_corners"), (1, 3), [0.0, 0.5, 1.0]),
        (dict(method="nearest_neighbor", coordinate_transformation_mode="asymmetric"), (1, 4), [0, 0, 1, 1]),
        (dict(method="linear", coordinate_transformation_mode="half_pixel"), (1, 4), [0, 0.25, 0.75, 1]),
        # asymmetric 2 -> 3: coordinates 0, 2/3, 4/3; floor by default, half to even with round
        (dict(method="nearest_neighbor", coordinate_transformation_mode="asymmetric"), (1, 3), [0, 0, 1]),
        (dict(method="nearest_neighbor", coordinate_transformation_mode="asymmetric", rounding_method="round"), (1, 3),
         [0, 1, 1]),
        # align_corners 2 -> 4: coordinates 0, 1/3, 2/3, 1 round by default
        (dict(method="nearest_neighbor", coordinate_transformation_mode="align_corners"), (1, 4), [0, 0, 1, 1]),
    ]
    for attrs, size, expected in cases:
        out = get_op("image.resize2d").kernel({"size": size, **attrs}, row)
        np.testing.assert_array_equal(out.reshape(-1), np.array(expected, "float32"))


def test_rounding_ties():
    # asymmetric 2 -> 4 on width 3... 3 -> 2: coordinates 0 and 1.5 (a tie)
    x = np.array([[[[10, 20, 30]]]], "int32")
    for rounding, expected in [("round", [10, 30]), ("round_prefer_floor", [10, 20]),
                               ("round_prefer_ceil", [10, 30]), ("floor", [10, 20]), ("ceil", [10, 30])]:
        out = get_op("image.resize2d").kernel({"size": (1, 2), "method": "nearest_neighbor",
                                               "coordinate_transformation_mode": "asymmetric",
                                               "rounding_method": rounding}, x)
        assert out.reshape(-1).tolist() == expected, rounding


CASES = [(method, mode) for method in ("nearest_neighbor", "linear", "cubic") for mode in MODES]


@pytest.mark.parametrize("method, mode", CASES)
def test_kernel_and_types_match_the_oracle(method, mode):
    x = _data((2, 3, 5, 4))
    attrs = {"size": (7, 3), "method": method, "coordinate_transformation_mode": mode,
             "roi": (0.1, -0.2, 0.8, 1.3), "extrapolation_value": -2.0}
    expected = resize2d_oracle(x, (7, 3), method, mode, roi=attrs["roi"], extrapolation=-2.0)
    check_op("image.resize2d", [x], attrs, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_every_method_and_mode_on_every_executor(layout):
    """One program holding every (method, mode) pair, with ? dims: compiled once per target."""
    shape = (2, 3, 5, 4) if layout == "NCHW" else (2, 5, 4, 3)
    x = _data(shape, seed=1)
    roi = (0.1, -0.2, 0.8, 1.3)
    calls, expected = [], []
    for method, mode in CASES:
        for size in ((7, 3), (1, 1)):
            extra = ', rounding_method="round_prefer_ceil"' if method == "nearest_neighbor" and size[0] == 1 else ""
            extra += ", cubic_exclude=1" if method == "cubic" and size[0] == 1 else ""
            rounding = "round_prefer_ceil" if extra.startswith(", rounding") else ""
            calls.append(f'image.resize2d(%x, size=[{size[0]}, {size[1]}], roi=[0.1f, -0.2f, 0.8f, 1.3f], '
                         f'layout="{layout}", method="{method}", coordinate_transformation_mode="{mode}", '
                         f'cubic_alpha=-0.75f, extrapolation_value=-2f{extra})')
            expected.append(resize2d_oracle(x, size, method, mode, rounding, -0.75, int("exclude" in extra), roi,
                                            -2.0, layout))
    dims = "?, 3, ?, ?" if layout == "NCHW" else "?, ?, ?, 3"
    text = f"def @main(%x: Tensor[({dims}), float32]) {{ ({', '.join(calls)}) }}"
    check_everywhere(text, [x], tuple(expected), rtol=1e-5, atol=1e-5)


def test_integer_data_and_out_dtype():
    x = _data((1, 2, 3, 5), "uint8")
    text = ('def @main(%x: Tensor[(1, 2, 3, 5), uint8]) { (image.resize2d(%x, size=[4, 8], method="cubic"), '
            'image.resize2d(%x, size=[4, 8], out_dtype="float32"), '
            'image.resize2d(%x, size=[6, 2], method="nearest_neighbor", rounding_method="floor")) }')
    expected = (resize2d_oracle(x, (4, 8), "cubic"), resize2d_oracle(x, (4, 8), out_dtype="float32"),
                resize2d_oracle(x, (6, 2), "nearest_neighbor", rounding="floor"))
    check_everywhere(text, [x], expected)


def test_types_static_any_symbolic():
    rel = get_op("image.resize2d").type_rel
    n = SymDim("n")
    out = rel([TensorType((n, 3, Any(), 4), "float32")], {"size": (5, 6)})
    assert out == TensorType((n, 3, 5, 6), "float32")
    out = rel([TensorType((n, Any(), Any(), 8), "float16")], {"size": (5, 6), "layout": "NHWC",
                                                               "out_dtype": "float32"})
    assert out == TensorType((n, 5, 6, 8), "float32")
    with pytest.raises(TypeInferenceError, match="rank 4"):
        rel([TensorType((3, 4, 4), "float32")], {"size": (5, 6)})
    with pytest.raises(TypeInferenceError, match="empty"):
        rel([TensorType((1, 1, 0, 4), "float32")], {"size": (5, 6)})
    with pytest.raises(AttrError):
        get_op("image.resize2d").normalize_attrs({"size": (5, 6), "method": "bilinear"})
    with pytest.raises(AttrError):
        get_op("image.resize2d").normalize_attrs({"size": (5, 6), "roi": (0.0, 1.0)})


def test_empty_input_with_unknown_dims_is_a_run_time_error():
    text = "def @main(%x: Tensor[(1, 1, ?, ?), float32]) { image.resize2d(%x, size=[2, 2]) }"
    mod = tv.parse('#[version = "0.0.5"]\n' + text)
    x = np.zeros((1, 1, 0, 3), "float32")
    with pytest.raises(ShapeError):
        tv.create_executor("debug", mod).evaluate()(x)
    exe = tv.vm.compile(mod, target="c")
    with pytest.raises(tv.errors.TensorVMError, match="empty"):
        tv.vm.VirtualMachine(exe).invoke("main", x)


def test_dyn_resize2d():
    x = _data((2, 5, 4, 3), seed=2)
    roi = np.array([0.2, 0.1, 0.9, 0.7], "float32")
    text = ('def @main(%x: Tensor[(2, ?, ?, 3), float32], %size: Tensor[(2), int64], %roi: Tensor[(4), float32]) '
            '{ (dyn.image.resize2d(%x, %size, %roi, layout="NHWC", method="cubic", '
            'coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=9f), '
            'dyn.image.resize2d(%x, %size, %roi, layout="NHWC", method="nearest_neighbor", '
            'coordinate_transformation_mode="asymmetric")) }')
    for size in ((6, 2), (3, 9)):
        expected = (resize2d_oracle(x, size, "cubic", "tf_crop_and_resize", roi=tuple(float(v) for v in roi),
                                    extrapolation=9.0, layout="NHWC"),
                    resize2d_oracle(x, size, "nearest_neighbor", "asymmetric", layout="NHWC"))
        check_everywhere(text, [x, np.array(size, "int64"), roi], expected, rtol=1e-5, atol=1e-5)


def test_dyn_resize2d_shape_function_checks_the_roi_the_kernel_reads():
    """The kernel reads 4 roi values; the shape function used to accept a roi of 3 (a dynamic roi length
    passes typing)."""
    from tensorvm.op import get_op

    op = get_op("dyn.image.resize2d")
    attrs = op.normalize_attrs({})
    x, size, roi = np.zeros((1, 1, 2, 2), "float32"), np.array([3, 4], "int64"), np.zeros(3, "float32")
    with pytest.raises(ShapeError, match="roi"):
        op.kernel(attrs, x, size, roi)
    with pytest.raises(ShapeError, match="roi"):
        op.shape_func(attrs, [x.shape, size, roi.shape])
    assert [tuple(s) for s in op.shape_func(attrs, [x.shape, size, (4,)])] == [(1, 1, 3, 4)]


def test_dyn_resize2d_types_and_errors():
    rel = get_op("dyn.image.resize2d").type_rel
    data = TensorType((1, 3, Any(), 4), "float32")
    size_t, roi_t = TensorType((2,), "int32"), TensorType((4,), "float32")
    assert rel([data, size_t, roi_t], {}) == TensorType((1, 3, Any(), Any()), "float32")
    assert rel([data, size_t, roi_t], {}, [None, np.array([5, 6], "int32"), None]) == \
        TensorType((1, 3, 5, 6), "float32")
    with pytest.raises(TypeInferenceError, match="length of size"):
        rel([data, TensorType((3,), "int32"), roi_t], {})
    with pytest.raises(TypeInferenceError, match="float"):
        rel([data, size_t, TensorType((4,), "int32")], {})
    check_op("dyn.image.resize2d", [_data((1, 2, 3, 3)), np.array([4, 2], "int32"), np.zeros(4, "float32")],
             {"method": "linear"}, resize2d_oracle(_data((1, 2, 3, 3)), (4, 2)), rtol=1e-5, atol=1e-6,
             consts=True)
    with pytest.raises(ShapeError, match="non-negative"):
        get_op("dyn.image.resize2d").kernel({}, _data((1, 1, 2, 2)), np.array([-1, 2]), np.zeros(4, "float32"))


def test_relay_text_default_attrs_run():
    # the attributes as TVM prints them
    text = ('def @main(%x: Tensor[(1, 1, 2, 2), float32]) { image.resize2d(%x, size=[3, 3], roi=[0f, 0f, 0f, 0f], '
            'layout="NCHW", method="linear", coordinate_transformation_mode="align_corners", rounding_method="", '
            'cubic_alpha=-0.5f, cubic_exclude=0, extrapolation_value=0f, out_dtype="") }')
    x = np.array([[[[0, 2], [4, 6]]]], "float32")
    expected = np.array([[[[0, 1, 2], [2, 3, 4], [4, 5, 6]]]], "float32")
    for result in run_everywhere(text, x).values():
        np.testing.assert_allclose(result, expected, atol=1e-6)


def test_upsampling_known_values():
    x = np.array([[[[1.0, 2.0]]]], "float32")
    up = get_op("nn.upsampling").kernel
    np.testing.assert_array_equal(up({"scale_w": 2.0}, x).reshape(-1), [1, 1, 2, 2])  # floor: PyTorch's nearest
    # round(2 * 1.5) = 3 columns at source 0, 0.5, 1
    np.testing.assert_array_equal(up({"scale_w": 1.5, "method": "bilinear", "align_corners": True}, x).reshape(-1),
                                  [1, 1.5, 2])
    # nearest with align_corners rounds half to even: source 0.5 reads column 0
    np.testing.assert_array_equal(up({"scale_w": 1.5, "align_corners": True}, x).reshape(-1), [1, 1, 2])
    out = up({"scale_w": 2.5, "method": "bilinear", "align_corners": True}, x).reshape(-1)  # 5 columns
    np.testing.assert_allclose(out, [1, 1.25, 1.5, 1.75, 2])


@pytest.mark.parametrize("method, align", [("nearest_neighbor", False), ("bilinear", False), ("bilinear", True),
                                           ("bicubic", True)])
def test_upsampling_everywhere(method, align):
    x = _data((2, 3, 4, 5), seed=3)
    sizes = (round(4 * 2.0), round(5 * 1.5))  # 8, 8 (7.5 rounds half to even)
    mode = "align_corners" if align else "asymmetric"
    expected = resize_oracle(x, sizes, method.replace("bi", ""), mode)
    attrs = f'method="{method}", align_corners={"True" if align else "False"}'
    text = (f"def @main(%x: Tensor[(?, 3, ?, 5), float32], %sh: float32, %sw: float64) {{ "
            f"(nn.upsampling(%x, scale_h=2f, scale_w=1.5f, {attrs}), dyn.nn.upsampling(%x, %sh, %sw, {attrs})) }}")
    check_everywhere(text, [x, np.float32(2.0), np.float64(1.5)], (expected, expected), rtol=1e-5, atol=1e-5)
    check_op("nn.upsampling", [x], {"scale_h": 2.0, "scale_w": 1.5, "method": method, "align_corners": align},
             expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method, mode", [("nearest_neighbor", "asymmetric"), ("trilinear", "half_pixel"),
                                          ("trilinear", "align_corners")])
def test_upsampling3d_everywhere(method, mode):
    x = _data((1, 3, 2, 3, 4), seed=4)
    expected = resize_oracle(x, (4, 6, 2), method.replace("tri", ""), mode)
    attrs = f'method="{method}", coordinate_transformation_mode="{mode}"'
    text = (f"def @main(%x: Tensor[(1, ?, 2, ?, 4), float32], %s: float32) {{ "
            f"(nn.upsampling3d(%x, scale_d=2f, scale_h=2f, scale_w=0.5f, {attrs}), "
            f"dyn.nn.upsampling3d(%x, %s, %s, 0.5f, {attrs})) }}")
    check_everywhere(text, [x, np.float32(2.0)], (expected, expected), rtol=1e-5, atol=1e-5)
    channels_last = np.moveaxis(x, 1, -1).copy()
    check_op("nn.upsampling3d", [channels_last], {"scale_d": 2.0, "scale_h": 2.0, "scale_w": 0.5, "method": method,
                                                  "coordinate_transformation_mode": mode, "layout": "NDHWC"},
             np.moveaxis(expected, 1, -1), rtol=1e-5, atol=1e-5)


def test_upsampling_types():
    rel = get_op("nn.upsampling").type_rel
    n = SymDim("n")
    assert rel([TensorType((n, 3, Any(), 5), "float32")], {"scale_h": 2.0, "scale_w": 1.5}) == \
        TensorType((n, 3, Any(), 8), "float32")
    assert rel([TensorType((n, 3, n, 5), "float32")], {"scale_h": 1.0, "scale_w": 1.0}) == \
        TensorType((n, 3, n, 5), "float32")
    with pytest.raises(AttrError):
        get_op("nn.upsampling").normalize_attrs({"scale_h": 0.0})
    dyn_rel = get_op("dyn.nn.upsampling").type_rel
    scalar = TensorType((), "float32")
    assert dyn_rel([TensorType((2, 3, 4, 5), "float32"), scalar, scalar], {}) == \
        TensorType((2, 3, Any(), Any()), "float32")
    assert dyn_rel([TensorType((2, 3, 4, 5), "float32"), scalar, scalar], {},
                   [None, np.float32(2), np.float32(0.5)]) == TensorType((2, 3, 8, 2), "float32")
    with pytest.raises(TypeInferenceError, match="scalar"):
        dyn_rel([TensorType((2, 3, 4, 5), "float32"), TensorType((1,), "float32"), scalar], {})
    with pytest.raises(ShapeError, match="positive"):
        get_op("dyn.nn.upsampling").kernel({}, _data((1, 1, 2, 2)), np.float32(-1), np.float32(1))


# --- image.affine_grid, image.grid_sample -----------------------------------------------------------


def affine_grid_oracle(theta, height, width):
    out = np.zeros((theta.shape[0], 2, height, width))
    ys = np.linspace(-1, 1, height) if height > 1 else [-1.0]
    xs = np.linspace(-1, 1, width) if width > 1 else [-1.0]
    for n in range(theta.shape[0]):
        for i, y in enumerate(ys):
            for j, x in enumerate(xs):
                out[n, :, i, j] = theta[n].astype(np.float64) @ np.array([x, y, 1.0])
    return out.astype(theta.dtype)


def _fold(c, size, align):
    """Mirror ``c`` into the input, one fold at a time (PyTorch's reflection padding), then clip."""
    low, high = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
    if high <= low:
        return 0.0
    while c < low or c > high:
        c = 2 * low - c if c < low else 2 * high - c
    return min(max(c, 0.0), size - 1.0)


def _pad(c, size, padding, align):
    if padding == "border":
        return min(max(c, 0.0), size - 1.0)
    return _fold(c, size, align) if padding == "reflection" else c


def grid_sample_oracle(x, grid, method="bilinear", padding="zeros", align=True):
    d = x.ndim - 2
    sizes = x.shape[2:]
    out = np.zeros((grid.shape[0], x.shape[1]) + grid.shape[2:])

    def value(n, positions):
        if all(0 <= p < s for p, s in zip(positions, sizes)):
            return x[(n, slice(None)) + tuple(positions)].astype(np.float64)
        return 0.0

    for n in range(grid.shape[0]):
        for position in np.ndindex(grid.shape[2:]):
            g = [float(grid[(n, d - 1 - k) + position]) for k in range(d)]  # per axis D, H, W
            c = [(v + 1) * (s - 1) / 2 if align else ((v + 1) * s - 1) / 2 for v, s in zip(g, sizes)]
            where = (n, slice(None)) + position
            if method == "bicubic":
                taps = []
                for ck, s in zip(c, sizes):
                    base = math.floor(ck)
                    taps.append([(int(_pad(base + k, s, padding, align)), _keys(ck - base - k, -0.75))
                                 for k in (-1, 0, 1, 2)])
                out[where] = sum(wy * wx * value(n, (py, px)) for py, wy in taps[0] for px, wx in taps[1])
                continue
            c = [_pad(ck, s, padding, align) for ck, s in zip(c, sizes)]
            if method == "nearest":
                out[where] = value(n, [round(ck) for ck in c])
            else:
                corners = itertools.product(*[[(math.floor(ck), 1 - (ck - math.floor(ck))),
                                               (math.floor(ck) + 1, ck - math.floor(ck))] for ck in c])
                out[where] = sum(math.prod(w for _, w in corner) * value(n, [p for p, _ in corner])
                                 for corner in corners)
    return out.astype(x.dtype)


def test_affine_grid():
    theta = np.array([[[1, 0, 0], [0, 1, 0]], [[0.5, -0.25, 0.1], [0.3, 2, -1]]], "float32")
    expected = affine_grid_oracle(theta, 3, 4)
    np.testing.assert_allclose(expected[0, 0, 0], [-1, -1 / 3, 1 / 3, 1], rtol=1e-6)  # identity: x across
    check_op("image.affine_grid", [theta], {"target_shape": (3, 4)}, expected, rtol=1e-6, atol=1e-6)
    text = "def @main(%t: Tensor[(?, 2, 3), float32]) { image.affine_grid(%t, target_shape=[3, 4]) }"
    check_everywhere(text, [theta], expected)
    with pytest.raises(TypeInferenceError, match="dim 2"):
        get_op("image.affine_grid").type_rel([TensorType((1, 2, 2), "float32")], {"target_shape": (3, 4)})


@pytest.mark.parametrize("method", ["nearest", "bilinear", "bicubic"])
def test_grid_sample_identity_grid_returns_the_input(method):
    x = _data((2, 3, 4, 5), seed=5)
    theta = np.tile(np.array([[1, 0, 0], [0, 1, 0]], "float32"), (2, 1, 1))
    text = (f"def @main(%x: Tensor[(?, 3, 4, 5), float32], %t: Tensor[(?, 2, 3), float32]) {{ "
            f'image.grid_sample(%x, image.affine_grid(%t, target_shape=[4, 5]), method="{method}") }}')
    check_everywhere(text, [x, theta], x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ["nearest", "bilinear", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample_2d(method, padding):
    x = _data((2, 3, 4, 5), seed=6)
    grid = (np.random.default_rng(7).random((2, 2, 3, 6)) * 3.2 - 1.6).astype("float32")  # inside and out
    grid[0, :, 0, :2] = [[-1, 1], [1, -1]]  # the corners exactly
    both = []
    for align in (True, False):
        both.append(grid_sample_oracle(x, grid, method, padding, align))
        check_op("image.grid_sample", [x, grid], {"method": method, "padding_mode": padding, "align_corners": align},
                 both[-1], rtol=1e-5, atol=1e-5)
    text = (f"def @main(%x: Tensor[(?, 3, ?, ?), float32], %g: Tensor[(?, 2, ?, ?), float32]) {{ "
            f'(image.grid_sample(%x, %g, method="{method}", padding_mode="{padding}"), '
            f'image.grid_sample(%x, %g, method="{method}", padding_mode="{padding}", align_corners=False)) }}')
    check_everywhere(text, [x, grid], tuple(both), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ["nearest", "bilinear"])
def test_grid_sample_3d(method):
    x = _data((1, 2, 3, 4, 5), seed=8)
    grid = (np.random.default_rng(9).random((1, 3, 2, 3, 4)) * 2.4 - 1.2).astype("float32")
    expected = grid_sample_oracle(x, grid, method, "border", False)
    text = (f"def @main(%x: Tensor[(1, 2, ?, 4, 5), float32], %g: Tensor[(1, 3, 2, 3, ?), float32]) {{ "
            f'image.grid_sample(%x, %g, method="{method}", layout="NCDHW", padding_mode="border", '
            f"align_corners=False) }}")
    check_everywhere(text, [x, grid], expected, rtol=1e-5, atol=1e-5)


def test_grid_sample_types():
    rel = get_op("image.grid_sample").type_rel
    n = SymDim("n")
    assert rel([TensorType((n, 3, Any(), 5), "float32"), TensorType((Any(), 2, 7, 8), "float32")], {}) == \
        TensorType((n, 3, 7, 8), "float32")
    with pytest.raises(TypeInferenceError, match="coordinates"):
        rel([TensorType((1, 3, 4, 5), "float32"), TensorType((1, 3, 7, 8), "float32")], {})
    with pytest.raises(TypeInferenceError, match="2-D only"):
        rel([TensorType((1, 3, 4, 5, 6), "float32"), TensorType((1, 3, 1, 2, 3), "float32")],
            {"layout": "NCDHW", "method": "bicubic"})
    with pytest.raises(TypeInferenceError, match="float"):
        rel([TensorType((1, 3, 4, 5), "int32"), TensorType((1, 2, 7, 8), "int32")], {})


# --- ONNX's image.resize: its compute, on the sampling code above ------------------------------------

ONNX_RESIZE = ("def @main(%x: Tensor[(?, 2, ?, 5), float32], %roi: Tensor[(8), float32], %sc: Tensor[({ns}), float32], "
               "%si: Tensor[({nz}), int64]) {{ image.resize(%x, %roi, %sc, %si, mode=\"{mode}\", "
               "coordinate_transformation_mode=\"{ctm}\", nearest_mode=\"round_prefer_ceil\", exclude_outside={ex}, "
               "extrapolation_value=-3f) }}")


@pytest.mark.parametrize("mode, ctm, ex", [
    ("nearest", "half_pixel", 0), ("nearest", "tf_crop_and_resize", 0), ("linear", "half_pixel_symmetric", 0),
    ("linear", "align_corners", 0), ("cubic", "pytorch_half_pixel", 1), ("cubic", "tf_crop_and_resize", 0),
    ("cubic", "asymmetric", 0),
])
def test_onnx_resize_on_target_c(mode, ctm, ex):
    """target c (the compute) agrees with the kernel (checked by the ONNX backend tests) for scales and sizes,
    every axis resized (the batch and channels by scale 1, the skipped axes of the kernel)."""
    x = _data((2, 2, 4, 5), seed=10)
    roi = np.array([0, 0, 0.1, 0.2, 1, 1, 0.9, 1.1], "float32")
    for scales, sizes in ((np.array([1, 1, 1.7, 0.6], "float32"), np.zeros(0, "int64")),
                          (np.zeros(0, "float32"), np.array([2, 3, 7, 3], "int64"))):
        text = ONNX_RESIZE.format(ns=len(scales), nz=len(sizes), mode=mode, ctm=ctm, ex=ex)
        expected = get_op("image.resize").kernel(
            {"mode": mode, "coordinate_transformation_mode": ctm, "nearest_mode": "round_prefer_ceil",
             "exclude_outside": bool(ex), "extrapolation_value": -3.0}, x, roi, scales, sizes)
        check_everywhere(text, [x, roi, scales, sizes], expected, rtol=1e-5, atol=1e-5)


def test_onnx_resize_linear_matches_the_loop_oracle():
    x = _data((1, 2, 4, 5), seed=11)
    out = get_op("image.resize").kernel({"mode": "linear"}, x, np.zeros(0, "float32"), np.zeros(0, "float32"),
                                        np.array([1, 2, 7, 3], "int64"))
    np.testing.assert_allclose(out, resize_oracle(x, (7, 3)), rtol=1e-5, atol=1e-6)


def test_onnx_resize_pytorch_half_pixel_to_one_element_samples_coordinate_0():
    # regression: the kernel sampled at -0.5 (ONNX: "length_resized > 1 ? ... : 0"); cubic showed it
    x = np.array([[[[1.0, 5.0, 2.0, 8.0]]]], "float32")
    out = get_op("image.resize").kernel({"mode": "cubic", "coordinate_transformation_mode": "pytorch_half_pixel"},
                                        x, np.zeros(0, "float32"), np.zeros(0, "float32"),
                                        np.array([1, 1, 1, 1], "int64"))
    assert out.reshape(-1).tolist() == [1.0]


def test_onnx_resize_with_antialias_falls_back_to_numpy():
    text = ONNX_RESIZE.format(ns=4, nz=0, mode="linear", ctm="half_pixel", ex=0).replace(
        "extrapolation_value=-3f", "antialias=True")
    x, roi = _data((1, 2, 4, 5), seed=12), np.zeros(8, "float32")
    scales = np.array([1, 1, 0.5, 0.5], "float32")
    expected = get_op("image.resize").kernel({"mode": "linear", "antialias": True}, x, roi, scales,
                                             np.zeros(0, "int64"))
    check_everywhere(text, [x, roi, scales, np.zeros(0, "int64")], expected, fallbacks_allowed=True)


@pytest.mark.parametrize("method, mode", [("nearest_neighbor", "asymmetric"), ("cubic", "half_pixel"),
                                          ("linear", "tf_crop_and_resize")])
def test_resize1d_and_resize3d(method, mode):
    x1, x3 = _data((2, 3, 5), seed=13), _data((1, 2, 3, 4, 5), seed=14)
    roi1, roi3 = (0.1, 0.8), (0.0, 0.2, -0.1, 1.0, 0.9, 1.2)
    common = f'method="{method}", coordinate_transformation_mode="{mode}", extrapolation_value=4f'
    text = (f"def @main(%a: Tensor[(?, 3, 5), float32], %b: Tensor[(1, ?, 3, 4, 5), float32]) {{ ("
            f"image.resize1d(%a, size=[7], roi=[0.1f, 0.8f], {common}), "
            f'image.resize1d(%a, size=[2], roi=[0.1f, 0.8f], layout="NWC", {common}), '
            f"image.resize3d(%b, size=[2, 6, 3], roi=[0f, 0.2f, -0.1f, 1f, 0.9f, 1.2f], {common})) }}")
    expected = (resize_oracle(x1, (7,), method, mode, roi=roi1, extrapolation=4.0),
                # NWC reads the same array as 3 positions of 5 channels
                resize_oracle(x1, (2,), method, mode, roi=roi1, extrapolation=4.0, channels_last=True),
                resize_oracle(x3, (2, 6, 3), method, mode, roi=roi3, extrapolation=4.0))
    check_everywhere(text, [x1, x3], expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(AttrError):
        get_op("image.resize3d").normalize_attrs({"size": (2, 2)})


@pytest.mark.parametrize("method", ["bilinear", "nearest_neighbor"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_crop_and_resize(method, layout):
    x = _data((2, 3, 4, 5), seed=15)
    boxes = np.array([[0, 0, 1, 1], [0.2, -0.1, 0.9, 1.3], [0.5, 0.5, 0.5, 0.5]], "float32")
    indices = np.array([1, 0, 1], "int32")
    crops = [resize_oracle(x[k:k + 1], (3, 4), method.replace("bilinear", "linear"), "tf_crop_and_resize", "round",
                           roi=tuple(float(v) for v in box), extrapolation=-9.0)
             for box, k in zip(boxes, indices)]
    expected = np.concatenate(crops)
    # the whole image to its own size is the image
    whole = get_op("image.crop_and_resize").kernel({"crop_size": (4, 5)}, x, boxes[:1], indices[:1])
    np.testing.assert_allclose(whole[0], x[1], rtol=1e-6)
    data = x if layout == "NCHW" else x.transpose(0, 2, 3, 1).copy()
    want = expected if layout == "NCHW" else expected.transpose(0, 2, 3, 1)
    dims = "?, 3, 4, 5" if layout == "NCHW" else "?, 4, 5, 3"
    text = (f"def @main(%x: Tensor[({dims}), float32], %b: Tensor[(?, 4), float32], %i: Tensor[(?), int32]) {{ "
            f'image.crop_and_resize(%x, %b, %i, crop_size=[3, 4], layout="{layout}", method="{method}", '
            f"extrapolation_value=-9f) }}")
    check_everywhere(text, [data, boxes, indices], want, rtol=1e-5, atol=1e-5)
    check_op("image.crop_and_resize", [data, boxes, indices], {"crop_size": (3, 4), "layout": layout,
                                                               "method": method, "extrapolation_value": -9.0},
             want, rtol=1e-5, atol=1e-5)


def test_crop_and_resize_errors():
    rel = get_op("image.crop_and_resize").type_rel
    with pytest.raises(TypeInferenceError, match="numbers of boxes"):
        rel([TensorType((1, 3, 4, 5), "float32"), TensorType((2, 4), "float32"), TensorType((3,), "int32")],
            {"crop_size": (2, 2)})
    mod = tv.parse('#[version = "0.0.5"]\ndef @main(%x: Tensor[(1, 1, 2, 2), float32], %b: Tensor[(1, 4), float32], '
                   '%i: Tensor[(1), int32]) { image.crop_and_resize(%x, %b, %i, crop_size=[2, 2]) }')
    args = (np.zeros((1, 1, 2, 2), "float32"), np.zeros((1, 4), "float32"), np.array([1], "int32"))
    with pytest.raises(tv.errors.ExecutionError, match="out of range"):
        tv.create_executor("debug", mod).evaluate()(*args)
    with pytest.raises(tv.errors.TensorVMError, match="range"):
        tv.vm.VirtualMachine(tv.vm.compile(mod, target="c")).invoke("main", *args)
