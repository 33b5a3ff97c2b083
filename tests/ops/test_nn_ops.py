"""nn.* ops (tensorvm/op/nn.py): kernels against slow but obviously right loop oracles on tiny shapes,
type relations and shape functions against the kernels' results, Any/SymDim flow, and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from op_testing import arrays_of, check_op, elementwise, shapes

from tensorvm.errors import AttrError, ShapeError, TypeInferenceError
from tensorvm.ir.types import Any, SymDim, TensorType, TupleType
from tensorvm.op import OpPattern, get_op

SETTINGS = settings(max_examples=25, deadline=None)
ANY = Any()
N, H = SymDim("n"), SymDim("h")
TOL = {"rtol": 1e-9, "atol": 1e-9}  # float64 kernels against float64 oracles


def rel(name, types, consts=None, **attrs):
    opdef = get_op(name)
    return opdef.type_rel(types, opdef.normalize_attrs(attrs), consts)


def tt(*shape, dtype="float32"):
    return TensorType(shape, dtype)


def f64(data, shape, low=-3, high=3):
    return data.draw(arrays_of("float64", shape, low, high))


def test_patterns():
    expected = {
        "nn.dense": OpPattern.OUT_ELEMWISE_FUSABLE, "nn.batch_matmul": OpPattern.OUT_ELEMWISE_FUSABLE,
        "nn.matmul": OpPattern.OUT_ELEMWISE_FUSABLE, "nn.conv2d": OpPattern.OUT_ELEMWISE_FUSABLE,
        "nn.conv2d_transpose": OpPattern.OUT_ELEMWISE_FUSABLE, "nn.max_pool2d": OpPattern.OUT_ELEMWISE_FUSABLE,
        "nn.bias_add": OpPattern.BROADCAST, "nn.relu": OpPattern.ELEMWISE, "nn.softmax": OpPattern.OPAQUE,
        "nn.pad": OpPattern.INJECTIVE, "nn.batch_flatten": OpPattern.INJECTIVE, "nn.batch_norm": OpPattern.OPAQUE,
        "nn.dropout": OpPattern.OPAQUE,
    }
    for name, pattern in expected.items():
        assert get_op(name).pattern == pattern, name
        assert not get_op(name).is_data_dependent, name


# ---- dense, matmul, batch_matmul ----------------------------------------------------------------------


def dot_oracle(a, b):
    """(..., K) x (K, N) by explicit multiply-and-sum (no matmul)."""
    return (a[..., :, None] * b).sum(axis=-2)


@SETTINGS
@given(shapes(1, 3, 0, 3), st.integers(0, 3), st.data())
def test_dense(data_shape, units, data):
    x = f64(data, data_shape)
    w = f64(data, (units, data_shape[-1]))
    check_op("nn.dense", [x, w], {}, dot_oracle(x, w.T), **TOL)
    check_op("nn.dense", [x, w], {"units": units} if units else {}, dot_oracle(x, w.T), **TOL)


def test_dense_int8_out_dtype_and_types():
    x = np.array([[100, -100, 7]], "int8")
    w = np.array([[100, 100, 1], [2, -3, 4]], "int8")
    expected = np.array([[7, 528]], "int32")  # accumulates in int32, no int8 wraparound
    check_op("nn.dense", [x, w], {"out_dtype": "int32"}, expected)
    assert rel("nn.dense", [tt(N, ANY, 4), tt(5, 4)]) == tt(N, ANY, 5)
    assert rel("nn.dense", [tt(N, 4), tt(ANY, ANY)], units=7) == tt(N, 7)
    with pytest.raises(TypeInferenceError, match="last dim"):
        rel("nn.dense", [tt(2, 4), tt(5, 3)])
    with pytest.raises(TypeInferenceError, match="units"):
        rel("nn.dense", [tt(2, 4), tt(5, 4)], units=6)
    with pytest.raises(TypeInferenceError, match="dtype"):
        rel("nn.dense", [tt(2, 4), tt(5, 4, dtype="float64")])
    with pytest.raises(ShapeError, match="last dim"):
        get_op("nn.dense").shape_func({}, [(2, 4), (5, 3)])
    with pytest.raises(ShapeError):
        get_op("nn.dense").kernel({}, np.zeros((2, 4)), np.zeros((5, 3)))
    for bad in [{"units": 0}, {"out_dtype": "float8"}, {"units": 2.5}]:
        with pytest.raises(AttrError):
            get_op("nn.dense").normalize_attrs(bad)


@SETTINGS
@given(st.integers(1, 3), st.integers(0, 3), st.integers(0, 3), st.integers(0, 3), st.data())
def test_batch_matmul(batch, m, k, n, data):
    ta, tb = data.draw(st.booleans()), data.draw(st.booleans())
    bx, by = data.draw(st.sampled_from([(batch, batch), (1, batch), (batch, 1)]))
    x = f64(data, (bx, k, m) if ta else (bx, m, k))
    y = f64(data, (by, n, k) if tb else (by, k, n))
    xa = np.swapaxes(x, 1, 2) if ta else x
    yb = np.swapaxes(y, 1, 2) if tb else y
    expected = np.stack([dot_oracle(xa[min(i, bx - 1)], yb[min(i, by - 1)]) for i in range(max(bx, by))])
    check_op("nn.batch_matmul", [x, y], {"transpose_a": ta, "transpose_b": tb}, expected, **TOL)


def test_batch_matmul_types():
    assert rel("nn.batch_matmul", [tt(N, 3, 4), tt(1, 5, 4)]) == tt(N, 3, 5)
    assert rel("nn.batch_matmul", [tt(ANY, 3, 4), tt(2, 4, 5)], transpose_b=False) == tt(2, 3, 5)
    with pytest.raises(TypeInferenceError, match="reduction"):
        rel("nn.batch_matmul", [tt(2, 3, 4), tt(2, 5, 3)])
    with pytest.raises(TypeInferenceError, match="batch"):
        rel("nn.batch_matmul", [tt(2, 3, 4), tt(3, 5, 4)])
    with pytest.raises(TypeInferenceError, match="rank 3"):
        rel("nn.batch_matmul", [tt(3, 4), tt(3, 5, 4)])
    with pytest.raises(ShapeError, match="batch"):
        get_op("nn.batch_matmul").shape_func(get_op("nn.batch_matmul").normalize_attrs({}), [(2, 3, 4), (3, 5, 4)])


@SETTINGS
@given(shapes(1, 3, 0, 3), st.integers(0, 3), st.data())
def test_matmul(a_shape, n, data):
    ta, tb = data.draw(st.booleans()), data.draw(st.booleans())
    assume(len(a_shape) >= 2 or not ta)
    a = f64(data, a_shape)
    k = a_shape[-2] if ta else a_shape[-1]
    b = f64(data, (n, k) if tb else (k, n))
    expected = dot_oracle(np.swapaxes(a, -1, -2) if ta else a, b.T if tb else b)
    check_op("nn.matmul", [a, b], {"transpose_a": ta, "transpose_b": tb}, expected, **TOL)
    with pytest.raises(TypeInferenceError, match="tensor_b"):
        rel("nn.matmul", [tt(2, 3), tt(1, 3, 4)])


# ---- bias_add and activations ------------------------------------------------------------------------------


@SETTINGS
@given(shapes(1, 4, 0, 3), st.data())
def test_bias_add_and_prelu(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    ax = axis % len(shape)
    x = f64(data, shape)
    vec = f64(data, (shape[ax],))
    along = vec.reshape((-1,) + (1,) * (len(shape) - ax - 1))
    check_op("nn.bias_add", [x, vec], {"axis": axis}, elementwise(lambda a, b: a + b, x, along, dtype="float64"))
    check_op("nn.prelu", [x, vec], {"axis": axis},
             elementwise(lambda a, b: a if a > 0 else a * b, x, along, dtype="float64"))


def test_bias_add_errors():
    with pytest.raises(TypeInferenceError, match="length of bias"):
        rel("nn.bias_add", [tt(2, 3), tt(2)])
    with pytest.raises(TypeInferenceError, match="rank 1"):
        rel("nn.bias_add", [tt(2, 3), tt(1, 3)])
    with pytest.raises(TypeInferenceError, match="out of range"):
        rel("nn.bias_add", [tt(2, 3), tt(3)], axis=2)
    assert rel("nn.bias_add", [tt(N, ANY), tt(3)]) == tt(N, 3)
    assert rel("nn.bias_add", [tt(N, H), tt(ANY)]) == tt(N, H)
    with pytest.raises(ShapeError):
        get_op("nn.bias_add").kernel({}, np.zeros((2, 3)), np.zeros(2))


@SETTINGS
@given(shapes(0, 3, 0, 3), st.sampled_from(["float16", "float32", "float64"]), st.data())
def test_activations(shape, dtype, data):
    x = data.draw(arrays_of(dtype, shape, -4, 4))
    alpha = data.draw(st.floats(0, 1))
    tol = {"rtol": 2e-3, "atol": 2e-3} if dtype == "float16" else {"rtol": 1e-6, "atol": 1e-6}
    check_op("nn.relu", [x], {}, elementwise(lambda v: max(v, 0.0), x, dtype=dtype))
    a = float(np.asarray(alpha, dtype))
    check_op("nn.leaky_relu", [x], {"alpha": alpha}, elementwise(lambda v: v if v > 0 else v * a, x, dtype=dtype),
             **tol)
    check_op("nn.gelu", [x], {}, elementwise(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))), x, dtype=dtype),
             **tol)
    tanh_gelu = elementwise(lambda v: 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))), x,
                            dtype=dtype)
    check_op("nn.gelu", [x], {"approximate": "tanh"}, tanh_gelu, **tol)
    check_op("nn.relu", [x.astype("int32")], {}, elementwise(lambda v: max(v, 0), x.astype("int32"), dtype="int32"))


def test_activation_types_and_attrs():
    assert rel("nn.relu", [tt(N, ANY)]) == tt(N, ANY)
    with pytest.raises(TypeInferenceError, match="floating"):
        rel("nn.gelu", [tt(3, dtype="int32")])
    with pytest.raises(AttrError):
        get_op("nn.gelu").normalize_attrs({"approximate": "fast"})
    with pytest.raises(AttrError):
        get_op("nn.leaky_relu").normalize_attrs({"alpha": "big"})


def softmax_rows(x, axis, log):
    out = np.empty_like(x)
    moved_in, moved_out = np.moveaxis(x, axis, -1), np.moveaxis(out, axis, -1)
    for idx in np.ndindex(moved_in.shape[:-1]):
        row = [float(v) for v in moved_in[idx]]
        if not row:
            continue
        top = max(row)
        total = math.fsum(math.exp(v - top) for v in row)
        moved_out[idx] = [v - top - math.log(total) if log else math.exp(v - top) / total for v in row]
    return out


@SETTINGS
@given(shapes(1, 3, 0, 4), st.data())
def test_softmax_and_log_softmax(shape, data):
    x = data.draw(arrays_of("float64", shape, -30, 30))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    check_op("nn.softmax", [x], {"axis": axis}, softmax_rows(x, axis, False), rtol=1e-12, atol=1e-15)
    check_op("nn.log_softmax", [x], {"axis": axis}, softmax_rows(x, axis, True), rtol=1e-12, atol=1e-12)
    x32 = x.astype("float32")
    check_op("nn.softmax", [x32], {"axis": axis}, softmax_rows(x32, axis, False), rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeInferenceError, match="out of range"):
        rel("nn.softmax", [tt(*shape)], axis=len(shape))


# ---- normalizations ---------------------------------------------------------------------------------------


def normalize_groups(x, group_of, eps):
    """Normalize x over the elements that share ``group_of(index)``, with statistics computed in Python."""
    groups = {}
    for idx in np.ndindex(x.shape):
        groups.setdefault(group_of(idx), []).append(float(x[idx]))
    stats = {}
    for key, values in groups.items():
        mean = math.fsum(values) / len(values)
        stats[key] = (mean, math.fsum((v - mean) ** 2 for v in values) / len(values))
    out = np.empty_like(x)
    for idx in np.ndindex(x.shape):
        mean, var = stats[group_of(idx)]
        out[idx] = (x[idx] - mean) / math.sqrt(var + eps)
    return out


def channel_affine(y, axis, gamma, beta, center=True, scale=True):
    shape = (-1,) + (1,) * (y.ndim - axis - 1)
    if scale:
        y = y * gamma.reshape(shape)
    if center:
        y = y + beta.reshape(shape)
    return y


@SETTINGS
@given(shapes(1, 3, 1, 3), st.data())
def test_layer_norm_and_rms_norm(shape, data):
    x = f64(data, shape)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    ax = axis % len(shape)
    gamma, beta = f64(data, (shape[ax],)), f64(data, (shape[ax],))
    center, scale = data.draw(st.booleans()), data.draw(st.booleans())
    eps = 1e-3
    norm = normalize_groups(x, lambda idx: idx[:ax] + idx[ax + 1:], eps)
    check_op("nn.layer_norm", [x, gamma, beta], {"axis": axis, "epsilon": eps, "center": center, "scale": scale},
             channel_affine(norm, ax, gamma, beta, center, scale), **TOL)
    rms = np.empty_like(x)
    for idx in np.ndindex(shape):
        row = x[idx[:ax] + (slice(None),) + idx[ax + 1:]]
        rms[idx] = x[idx] / math.sqrt(math.fsum(float(v) ** 2 for v in row) / len(row) + eps) * gamma[idx[ax]]
    check_op("nn.rms_norm", [x, gamma], {"axis": axis, "epsilon": eps}, rms, **TOL)


@SETTINGS
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), shapes(0, 2, 1, 3), st.data())
def test_instance_group_batch_norm(batch, groups, per_group, spatial, data):
    channels = groups * per_group
    x = f64(data, (batch, channels) + spatial)
    gamma, beta = f64(data, (channels,)), f64(data, (channels,))
    eps = 1e-2
    inst = normalize_groups(x, lambda idx: idx[:2], eps)
    check_op("nn.instance_norm", [x, gamma, beta], {"epsilon": eps}, channel_affine(inst, 1, gamma, beta), **TOL)
    grouped = normalize_groups(x, lambda idx: (idx[0], idx[1] // per_group), eps)
    check_op("nn.group_norm", [x, gamma, beta], {"num_groups": groups, "epsilon": eps},
             channel_affine(grouped, 1, gamma, beta), **TOL)
    mean, var = f64(data, (channels,)), f64(data, (channels,), 0, 3)
    expected = np.empty_like(x)
    for idx in np.ndindex(x.shape):
        c = idx[1]
        expected[idx] = (x[idx] - mean[c]) / math.sqrt(var[c] + eps) * gamma[c] + beta[c]
    out = check_op("nn.batch_norm", [x, gamma, beta, mean, var], {"epsilon": eps}, (expected, mean, var), **TOL)
    assert isinstance(out, tuple) and len(out) == 3


def test_norm_types_and_errors():
    out = rel("nn.batch_norm", [tt(N, 3, H, H)] + [tt(ANY)] * 4)
    assert out == TupleType((tt(N, 3, H, H), tt(3), tt(3)))
    assert rel("nn.layer_norm", [tt(N, ANY), tt(8), tt(8)]) == tt(N, 8)  # gamma fixes the axis dim
    assert rel("nn.batch_norm", [tt(N, ANY)] + [tt(ANY), tt(4), tt(ANY), tt(ANY)]).fields[2] == tt(4)
    with pytest.raises(TypeInferenceError, match="divisible"):
        rel("nn.group_norm", [tt(2, 6, 4), tt(6), tt(6)], num_groups=4)
    with pytest.raises(TypeInferenceError, match="length of moving_var"):
        rel("nn.batch_norm", [tt(2, 3), tt(3), tt(3), tt(3), tt(4)])
    with pytest.raises(TypeInferenceError, match="floating"):
        rel("nn.layer_norm", [tt(2, 3, dtype="int32"), tt(3, dtype="int32"), tt(3, dtype="int32")])
    with pytest.raises(TypeInferenceError, match="batch axis"):
        rel("nn.instance_norm", [tt(2, 3), tt(2), tt(2)], axis=0)
    with pytest.raises(AttrError, match="num_groups"):
        get_op("nn.group_norm").normalize_attrs({})
    with pytest.raises(ShapeError):
        get_op("nn.batch_norm").kernel({}, np.zeros((2, 3)), *[np.zeros(2)] * 4)


# ---- convolution ------------------------------------------------------------------------------------------


def conv2d_oracle(x, w, strides, padding, dilation, groups):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = strides, dilation, padding
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, oh, ow))
    per_group = o // groups
    for b, oc, i, j in np.ndindex(out.shape):
        g = oc // per_group
        total = 0.0
        for ic, a, e in np.ndindex(cg, kh, kw):
            y, z = i * sh - pt + a * dh, j * sw - pl + e * dw
            if 0 <= y < h and 0 <= z < wd:
                total += x[b, g * cg + ic, y, z] * w[oc, ic, a, e]
        out[b, oc, i, j] = total
    return out


@st.composite
def conv_cases(draw):
    groups = draw(st.integers(1, 2))
    in_per_group, out_per_group = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    h, w = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    strides = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = tuple(draw(st.integers(0, 2)) for _ in range(4))
    assume(h + padding[0] + padding[2] >= dilation[0] * (kh - 1) + 1)
    assume(w + padding[1] + padding[3] >= dilation[1] * (kw - 1) + 1)
    batch = draw(st.integers(1, 2))
    x = draw(arrays_of("float64", (batch, groups * in_per_group, h, w), -2, 2))
    weight = draw(arrays_of("float64", (groups * out_per_group, in_per_group, kh, kw), -2, 2))
    return x, weight, {"strides": strides, "padding": padding, "dilation": dilation, "groups": groups}


@SETTINGS
@given(conv_cases())
def test_conv2d(case):
    x, w, attrs = case
    expected = conv2d_oracle(x, w, attrs["strides"], attrs["padding"], attrs["dilation"], attrs["groups"])
    check_op("nn.conv2d", [x, w], attrs, expected, **TOL)
    # NHWC data with HWIO weights computes the same convolution
    nhwc = check_op("nn.conv2d", [x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0)],
                    dict(attrs, data_layout="NHWC", kernel_layout="HWIO"), expected.transpose(0, 2, 3, 1), **TOL)
    assert nhwc.flags.c_contiguous


def test_conv2d_depthwise_float32_and_int8():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 4, 5, 5)).astype("float32")
    w = rng.standard_normal((8, 1, 3, 3)).astype("float32")  # depthwise, channel multiplier 2
    expected = conv2d_oracle(x.astype("float64"), w.astype("float64"), (1, 1), (1, 1, 1, 1), (1, 1), 4)
    check_op("nn.conv2d", [x, w], {"groups": 4, "padding": [1, 1], "channels": 8, "kernel_size": 3},
             expected.astype("float32"), rtol=1e-5, atol=1e-5)
    xi = rng.integers(-128, 128, (1, 2, 3, 3)).astype("int8")
    wi = rng.integers(-128, 128, (2, 2, 2, 2)).astype("int8")
    expected = conv2d_oracle(xi.astype("float64"), wi.astype("float64"), (1, 1), (0,) * 4, (1, 1), 1)
    check_op("nn.conv2d", [xi, wi], {"out_dtype": "int32"}, expected.astype("int32"))


def test_conv2d_types():
    w = tt(16, 3, 3, 3)
    assert rel("nn.conv2d", [tt(N, 3, 32, 32), w], padding=1) == tt(N, 16, 32, 32)
    assert rel("nn.conv2d", [tt(N, 3, ANY, H), w], padding=1, strides=2) == tt(N, 16, ANY, ANY)
    assert rel("nn.conv2d", [tt(N, 3, H, 7), tt(8, 3, 1, 1)]) == tt(N, 8, H, 7)  # 1x1 keeps symbols
    assert rel("nn.conv2d", [tt(1, ANY, 8, 8), tt(ANY, ANY, ANY, ANY)], channels=4, kernel_size=3).shape == (1, 4, 6, 6)
    assert rel("nn.conv2d", [tt(1, 8, 8, 3), tt(3, 3, 3, 5)], data_layout="NHWC", kernel_layout="HWIO") == \
        tt(1, 6, 6, 5)
    assert rel("nn.conv2d", [tt(1, 3, 8, 8), w], out_layout="NHWC", out_dtype="float64") == \
        tt(1, 6, 6, 16, dtype="float64")
    for data, weight, attrs, match in [
        (tt(1, 4, 8, 8), w, {}, "channels"),
        (tt(1, 3, 2, 2), w, {}, "larger than the padded input"),
        (tt(1, 3, 8, 8), w, {"channels": 8}, "channels attribute"),
        (tt(1, 3, 8, 8), w, {"kernel_size": 5}, "kernel_size"),
        (tt(1, 6, 8, 8), tt(5, 3, 3, 3), {"groups": 2}, "divisible"),
        (tt(3, 8, 8), w, {}, "rank 4"),
        (tt(1, 3, 8, 8), tt(16, 3, 3, 3, dtype="float16"), {}, "dtype"),
    ]:
        with pytest.raises(TypeInferenceError, match=match):
            rel("nn.conv2d", [data, weight], **attrs)
    with pytest.raises(ShapeError, match="channels"):
        get_op("nn.conv2d").shape_func(get_op("nn.conv2d").normalize_attrs({}), [(1, 4, 8, 8), (16, 3, 3, 3)])
    with pytest.raises(ShapeError):
        get_op("nn.conv2d").kernel({}, np.zeros((1, 3, 2, 2)), np.zeros((16, 3, 3, 3)))
    for bad in [{"padding": (1, 2, 3)}, {"strides": 0}, {"strides": (1, 2, 3)}, {"groups": 0},
                {"data_layout": "NCWH2"}, {"kernel_layout": "OIHWX"}, {"padding": -1}, {"dilation": "1"}]:
        with pytest.raises(AttrError):
            get_op("nn.conv2d").normalize_attrs(bad)
    attrs = get_op("nn.conv2d").normalize_attrs({"padding": 1, "strides": 2})
    assert attrs.padding == (1, 1, 1, 1) and attrs.strides == (2, 2)
    assert get_op("nn.conv2d").normalize_attrs({"padding": (1, 2)}).padding == (1, 2, 1, 2)


def conv2d_transpose_oracle(x, w, strides, padding, output_padding, dilation, groups):
    """The definition: every input pixel scatters its kernel-weighted copy into the output."""
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = strides, dilation, padding
    oh = (h - 1) * sh - pt - pb + dh * (kh - 1) + output_padding[0] + 1
    ow = (wd - 1) * sw - pl - pr + dw * (kw - 1) + output_padding[1] + 1
    out = np.zeros((n, og * groups, oh, ow))
    in_per_group = c // groups
    for b, ic, i, j in np.ndindex(x.shape):
        g = ic // in_per_group
        for oc, a, e in np.ndindex(og, kh, kw):
            y, z = i * sh - pt + a * dh, j * sw - pl + e * dw
            if 0 <= y < oh and 0 <= z < ow:
                out[b, g * og + oc, y, z] += x[b, ic, i, j] * w[ic, oc, a, e]
    return out


@SETTINGS
@given(st.data())
def test_conv2d_transpose(data):
    groups = data.draw(st.integers(1, 2))
    ipg, opg = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
    kh, kw = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    h, w = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    strides = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)))
    dilation = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)))
    padding = tuple(data.draw(st.integers(0, 2)) for _ in range(4))
    output_padding = tuple(data.draw(st.integers(0, max(s, d) - 1)) for s, d in zip(strides, dilation, strict=True))
    assume((h - 1) * strides[0] - padding[0] - padding[2] + dilation[0] * (kh - 1) + output_padding[0] >= 0)
    assume((w - 1) * strides[1] - padding[1] - padding[3] + dilation[1] * (kw - 1) + output_padding[1] >= 0)
    x = data.draw(arrays_of("float64", (data.draw(st.integers(1, 2)), groups * ipg, h, w), -2, 2))
    weight = data.draw(arrays_of("float64", (groups * ipg, opg, kh, kw), -2, 2))
    attrs = {"strides": strides, "padding": padding, "output_padding": output_padding, "dilation": dilation,
             "groups": groups}
    expected = conv2d_transpose_oracle(x, weight, strides, padding, output_padding, dilation, groups)
    check_op("nn.conv2d_transpose", [x, weight], attrs, expected, **TOL)


def test_conv2d_transpose_types():
    assert rel("nn.conv2d_transpose", [tt(N, 4, 8, 8), tt(4, 2, 4, 4)], strides=2, padding=1) == tt(N, 2, 16, 16)
    assert rel("nn.conv2d_transpose", [tt(N, 4, H, 8), tt(4, 3, 1, 1)], groups=2) == tt(N, 6, H, 8)
    assert rel("nn.conv2d_transpose", [tt(1, 4, ANY, 8), tt(4, 2, 3, 3)]).shape == (1, 2, ANY, 10)
    with pytest.raises(TypeInferenceError, match="in-channels"):
        rel("nn.conv2d_transpose", [tt(1, 4, 8, 8), tt(3, 2, 3, 3)])
    with pytest.raises(AttrError, match="output_padding"):
        rel("nn.conv2d_transpose", [tt(1, 4, 8, 8), tt(4, 2, 3, 3)], strides=2, output_padding=2)


# ---- pooling -------------------------------------------------------------------------------------------


def pool_oracle(x, kind, pool, strides, dilation, padding, ceil_mode, count_include_pad=False):
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (dh, dw), (pt, pl, pb, pr) = pool, strides, dilation, padding

    def size(d, k, pad, s, dl):
        return (d + pad - dl * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1

    out = np.zeros((n, c, size(h, kh, pt + pb, sh, dh), size(w, kw, pl + pr, sw, dw)), dtype=x.dtype)
    for b, ch, i, j in np.ndindex(out.shape):
        values, count = [], 0
        for a, e in np.ndindex(kh, kw):
            y, z = i * sh - pt + a * dh, j * sw - pl + e * dw
            inside = 0 <= y < h and 0 <= z < w
            if inside:
                values.append(float(x[b, ch, y, z]))
            count += (-pt <= y < h + pb and -pl <= z < w + pr) if count_include_pad else inside
        if kind == "max":
            out[b, ch, i, j] = max(values) if values else -np.inf
        else:
            out[b, ch, i, j] = math.fsum(values) / max(count, 1)
    return out


@SETTINGS
@given(st.data())
def test_max_and_avg_pool2d(data):
    kh, kw = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    h, w = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 6))
    strides = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)))
    dilation = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)))
    padding = tuple(data.draw(st.integers(0, 1)) for _ in range(4))
    ceil_mode = data.draw(st.booleans())
    assume(h + padding[0] + padding[2] >= dilation[0] * (kh - 1) + 1)
    assume(w + padding[1] + padding[3] >= dilation[1] * (kw - 1) + 1)
    x = data.draw(arrays_of("float64", (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)), h, w), -5, 5))
    attrs = {"pool_size": (kh, kw), "strides": strides, "dilation": dilation, "padding": padding,
             "ceil_mode": ceil_mode}
    expected = pool_oracle(x, "max", (kh, kw), strides, dilation, padding, ceil_mode)
    check_op("nn.max_pool2d", [x], attrs, expected)
    check_op("nn.max_pool2d", [x.transpose(0, 2, 3, 1)], dict(attrs, layout="NHWC"), expected.transpose(0, 2, 3, 1))
    for include in (False, True):
        expected = pool_oracle(x, "avg", (kh, kw), strides, dilation, padding, ceil_mode, include)
        check_op("nn.avg_pool2d", [x], dict(attrs, count_include_pad=include), expected, **TOL)


def test_pool_int_and_types():
    x = np.arange(16, dtype="int32").reshape(1, 1, 4, 4) - 8
    expected = pool_oracle(x.astype("float64"), "max", (2, 2), (2, 2), (1, 1), (1, 1, 1, 1), False)
    check_op("nn.max_pool2d", [x], {"pool_size": 2, "strides": 2, "padding": 1}, expected.astype("int32"))
    avg = pool_oracle(x.astype("float64"), "avg", (3, 3), (1, 1), (1, 1), (0,) * 4, False)
    check_op("nn.avg_pool2d", [x], {"pool_size": 3}, np.trunc(avg).astype("int32"))
    assert rel("nn.max_pool2d", [tt(N, 3, H, 8)], pool_size=2, strides=2) == tt(N, 3, ANY, 4)
    assert rel("nn.avg_pool2d", [tt(N, 3, H, 8)]) == tt(N, 3, H, 8)
    assert rel("nn.max_pool2d", [tt(1, 8, 7, 3)], pool_size=2, strides=2, layout="NHWC", ceil_mode=True) == \
        tt(1, 4, 4, 3)
    with pytest.raises(TypeInferenceError, match="larger"):
        rel("nn.max_pool2d", [tt(1, 1, 2, 2)], pool_size=3)
    with pytest.raises(ShapeError, match="larger"):
        get_op("nn.max_pool2d").shape_func(get_op("nn.max_pool2d").normalize_attrs({"pool_size": 3}), [(1, 1, 2, 2)])
    with pytest.raises(AttrError):
        get_op("nn.max_pool2d").normalize_attrs({"pool_size": 0})


@SETTINGS
@given(shapes(4, 4, 1, 4), st.data())
def test_global_and_adaptive_pools(shape, data):
    x = f64(data, shape)
    n, c, h, w = shape
    means = np.array([[[[math.fsum(x[b, ch].ravel()) / (h * w)]] for ch in range(c)] for b in range(n)])
    maxes = np.array([[[[max(x[b, ch].ravel())]] for ch in range(c)] for b in range(n)])
    check_op("nn.global_avg_pool2d", [x], {}, means, **TOL)
    check_op("nn.global_max_pool2d", [x], {}, maxes)
    check_op("nn.global_avg_pool2d", [x.transpose(0, 2, 3, 1)], {"layout": "NHWC"}, means.transpose(0, 2, 3, 1), **TOL)
    oh, ow = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 5))
    avg, mx = np.zeros((n, c, oh, ow)), np.zeros((n, c, oh, ow))
    for b, ch, i, j in np.ndindex(avg.shape):
        window = x[b, ch, (i * h) // oh: math.ceil((i + 1) * h / oh), (j * w) // ow: math.ceil((j + 1) * w / ow)]
        avg[b, ch, i, j] = math.fsum(window.ravel()) / window.size
        mx[b, ch, i, j] = max(window.ravel())
    check_op("nn.adaptive_avg_pool2d", [x], {"output_size": (oh, ow)}, avg, **TOL)
    check_op("nn.adaptive_max_pool2d", [x], {"output_size": (oh, ow)}, mx)
    check_op("nn.adaptive_max_pool2d", [x], {}, x)  # output_size None keeps the size
    assert rel("nn.global_max_pool2d", [tt(N, 3, ANY, H)]) == tt(N, 3, 1, 1)
    assert rel("nn.adaptive_avg_pool2d", [tt(N, 3, ANY, H)], output_size=7) == tt(N, 3, 7, 7)


# ---- pad, batch_flatten, dropout, lrn, depth_to_space, space_to_depth ----------------------------------------


def pad_source_index(i, before, size, mode):
    """The input index that output index ``i`` reads (None: the pad value)."""
    k = i - before
    if 0 <= k < size:
        return k
    if mode == "constant":
        return None
    if mode == "edge":
        return min(max(k, 0), size - 1)
    period = 2 * (size - 1)  # reflect without repeating the edge
    k = abs(k) % period if period else 0
    return period - k if k >= size else k


@SETTINGS
@given(shapes(0, 3, 1, 4), st.sampled_from(["constant", "edge", "reflect"]), st.data())
def test_pad(shape, mode, data):
    x = data.draw(arrays_of("int16", shape))
    limit = (lambda d: d - 1) if mode == "reflect" else (lambda d: 3)
    widths = [(data.draw(st.integers(0, limit(d))), data.draw(st.integers(0, limit(d)))) for d in shape]
    value = data.draw(st.integers(-5, 5))
    out_shape = tuple(d + a + b for d, (a, b) in zip(shape, widths, strict=True))
    out = np.empty(out_shape, "int16")
    for idx in np.ndindex(out_shape):
        src = [pad_source_index(i, a, d, mode) for i, (a, _), d in zip(idx, widths, shape, strict=True)]
        out[idx] = value if None in src else x[tuple(src)]
    attrs = {"pad_width": widths, "pad_mode": mode}
    if mode == "constant":
        check_op("nn.pad", [x, np.array(value, "float32")], attrs, out)
        if value == 0:
            check_op("nn.pad", [x], attrs, out)
    else:
        check_op("nn.pad", [x], attrs, out)


def test_pad_errors():
    with pytest.raises(TypeInferenceError, match="pairs"):
        rel("nn.pad", [tt(2, 3)], pad_width=((1, 1),))
    with pytest.raises(TypeInferenceError, match="scalar"):
        rel("nn.pad", [tt(2, 3), tt(1)], pad_width=((1, 1), (0, 0)))
    with pytest.raises(TypeInferenceError, match="reflect"):
        rel("nn.pad", [tt(2, 3)], pad_width=((2, 0), (0, 0)), pad_mode="reflect")
    assert rel("nn.pad", [tt(N, ANY)], pad_width=((1, 1), (0, 2))) == tt(ANY, ANY)
    assert rel("nn.pad", [tt(N, 3)], pad_width=((0, 0), (0, 2))) == tt(N, 5)
    with pytest.raises(ShapeError, match="reflect"):
        get_op("nn.pad").shape_func({"pad_width": ((3, 0),), "pad_mode": "reflect"}, [(3,)])
    for bad in [{"pad_width": ((-1, 0),)}, {"pad_width": ((1,),)}, {"pad_width": 3},
                {"pad_width": ((0, 0),), "pad_mode": "wrap"}]:
        with pytest.raises(AttrError):
            get_op("nn.pad").normalize_attrs(bad)


@SETTINGS
@given(shapes(1, 4, 0, 3), st.data())
def test_batch_flatten_and_dropout(shape, data):
    x = data.draw(arrays_of("float32", shape))
    rest = int(np.prod(shape[1:]))
    flat = np.empty((shape[0], rest), "float32")
    for idx in np.ndindex(shape):
        flat[idx[0], np.ravel_multi_index(idx[1:], shape[1:]) if len(shape) > 1 else 0] = x[idx]
    check_op("nn.batch_flatten", [x], {}, flat)
    check_op("nn.dropout", [x], {"rate": 0.3}, (x, np.ones(shape, "float32")))
    assert rel("nn.batch_flatten", [tt(N, 3, 4)]) == tt(N, 12)
    assert rel("nn.batch_flatten", [tt(2, H, 1)]) == tt(2, H)
    assert rel("nn.batch_flatten", [tt(2, H, 3)]) == tt(2, ANY)
    assert rel("nn.dropout", [tt(N, 3)]) == TupleType((tt(N, 3), tt(N, 3)))


@SETTINGS
@given(shapes(2, 4, 1, 4), st.integers(1, 5), st.data())
def test_lrn(shape, size, data):
    x = f64(data, shape)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    ax = axis % len(shape)
    bias, alpha, beta = 1.5, 0.3, 0.75
    out = np.empty_like(x)
    for idx in np.ndindex(shape):
        lo = idx[ax] - size // 2
        window = [x[idx[:ax] + (k,) + idx[ax + 1:]] for k in range(max(lo, 0), min(lo + size, shape[ax]))]
        out[idx] = x[idx] / (bias + alpha / size * math.fsum(float(v) ** 2 for v in window)) ** beta
    check_op("nn.lrn", [x], {"size": size, "axis": axis, "bias": bias, "alpha": alpha, "beta": beta}, out, **TOL)


@SETTINGS
@given(st.integers(1, 2), st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.data())
def test_depth_to_space_and_back(n, c, h, w, block, data):
    x = data.draw(arrays_of("int32", (n, c * block * block, h, w), -100, 100))
    out_shape = (n, c, h * block, w * block)
    dcr = np.empty(out_shape, "int32")
    crd = np.empty(out_shape, "int32")
    for b, ch, i, j in np.ndindex(out_shape):
        offset = (i % block) * block + j % block
        dcr[b, ch, i, j] = x[b, offset * c + ch, i // block, j // block]
        crd[b, ch, i, j] = x[b, ch * block * block + offset, i // block, j // block]
    check_op("nn.depth_to_space", [x], {"block_size": block}, dcr)
    check_op("nn.depth_to_space", [x], {"block_size": block, "mode": "CRD"}, crd)
    check_op("nn.space_to_depth", [dcr], {"block_size": block}, x)
    check_op("nn.depth_to_space", [x.transpose(0, 2, 3, 1)], {"block_size": block, "layout": "NHWC"},
             dcr.transpose(0, 2, 3, 1))


def test_depth_space_types():
    assert rel("nn.depth_to_space", [tt(N, 8, H, 3)], block_size=2) == tt(N, 2, ANY, 6)
    assert rel("nn.space_to_depth", [tt(N, 2, ANY, 6)], block_size=2) == tt(N, 8, ANY, 3)
    with pytest.raises(TypeInferenceError, match="divisible"):
        rel("nn.depth_to_space", [tt(1, 6, 2, 2)], block_size=2)
    with pytest.raises(TypeInferenceError, match="divisible"):
        rel("nn.space_to_depth", [tt(1, 1, 3, 2)], block_size=2)
    with pytest.raises(AttrError):
        get_op("nn.depth_to_space").normalize_attrs({"block_size": 2, "mode": "XYZ"})


def test_non_tensor_arguments():
    with pytest.raises(TypeInferenceError, match="tensor"):
        rel("nn.conv2d", [TupleType(()), tt(1, 1, 1, 1)])
    with pytest.raises(TypeInferenceError, match="tensor"):
        rel("nn.dropout", [TupleType(())])
    with pytest.raises(TypeInferenceError, match="tensor"):
        rel("nn.batch_norm", [tt(2, 3), tt(3), tt(3), tt(3), TupleType(())])
