"""nn.mirror_pad, dyn.nn.pad, nn.dilate and nn.conv1d_transpose (Relay's signatures) against hand values
and loop oracles, on the kernel, the interpreter, target python and target c (no NumPy fallback)."""

from __future__ import annotations

import numpy as np
import pytest
from op_testing import check_op
from relay_runner import HEADER, check_everywhere

import tensorvm as tv
from tensorvm.errors import AttrError, ShapeError, TensorVMError, TypeInferenceError
from tensorvm.ir.types import Any, SymDim, TensorType
from tensorvm.op import get_op


def _data(shape, dtype="float32", seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-50, 50, shape).astype(dtype)


def _mirror_indices(size, before, after, mode):
    """The source index of each padded position, from the mirrored sequence written out."""
    forward = list(range(size))
    if mode == "SYMMETRIC":
        extended, start = forward[::-1] + forward + forward[::-1], size - before
    else:  # REFLECT: the edge element is not repeated
        extended, start = forward[:0:-1] + forward + forward[-2::-1], size - 1 - before
    return extended[start:start + before + size + after]


def mirror_oracle(x, pad_width, mode):
    index = [_mirror_indices(d, b, a, mode) for d, (b, a) in zip(x.shape, pad_width)]
    return x[np.ix_(*index)]


def test_mirror_pad_known_values():
    x = np.array([1, 2, 3], "int32")
    kernel = get_op("nn.mirror_pad").kernel
    assert kernel({"pad_width": [[2, 2]]}, x).tolist() == [2, 1, 1, 2, 3, 3, 2]
    assert kernel({"pad_width": [[2, 2]], "mode": "REFLECT"}, x).tolist() == [3, 2, 1, 2, 3, 2, 1]
    assert kernel({"pad_width": [[3, 0]]}, x).tolist() == [3, 2, 1, 1, 2, 3]


@pytest.mark.parametrize("mode", ["SYMMETRIC", "REFLECT"])
def test_mirror_pad(mode):
    x = _data((2, 3, 4), "int32")
    pads = [[0, 1], [2, 2], [1, 3]]
    expected = mirror_oracle(x, pads, mode)
    check_op("nn.mirror_pad", [x], {"pad_width": pads, "mode": mode}, expected)
    text = (f'def @main(%x: Tensor[(?, 3, ?), int32]) {{ nn.mirror_pad(%x, pad_width=[[0, 1], [2, 2], [1, 3]], '
            f'mode="{mode}") }}')
    check_everywhere(text, [x], expected)


def test_mirror_pad_errors():
    rel = get_op("nn.mirror_pad").type_rel
    with pytest.raises(TypeInferenceError, match="at most 2"):
        rel([TensorType((3,), "float32")], {"pad_width": [[3, 0]], "mode": "REFLECT"})
    with pytest.raises(TypeInferenceError, match="pairs"):
        rel([TensorType((3, 3), "float32")], {"pad_width": [[1, 0]]})
    assert rel([TensorType((SymDim("n"), Any()), "float32")], {"pad_width": [[0, 0], [1, 1]]}) == \
        TensorType((SymDim("n"), Any()), "float32")
    with pytest.raises(AttrError):
        get_op("nn.mirror_pad").normalize_attrs({"pad_width": [[1, 1]], "mode": "reflect"})
    # a run-time size too small for the padding: the shape function (interpreter) and the compute (target c)
    mod = tv.parse(HEADER + 'def @main(%x: Tensor[(?), float32]) { nn.mirror_pad(%x, pad_width=[[2, 0]], '
                            'mode="REFLECT") }')
    x = np.zeros(2, "float32")
    with pytest.raises(ShapeError, match="REFLECT"):
        tv.create_executor("debug", mod).evaluate()(x)
    with pytest.raises(TensorVMError, match="REFLECT"):
        tv.vm.VirtualMachine(tv.vm.compile(mod, target="c")).invoke("main", x)


def _pad_oracle(x, pads, mode, value):
    if mode == "constant":
        out = np.full(tuple(d + b + a for d, (b, a) in zip(x.shape, pads)), value, x.dtype)
        out[tuple(slice(b, b + d) for d, (b, _) in zip(x.shape, pads))] = x
        return out
    if mode == "edge":
        index = [[min(max(i - b, 0), d - 1) for i in range(b + d + a)] for d, (b, a) in zip(x.shape, pads)]
        return x[np.ix_(*index)]
    return mirror_oracle(x, pads, "REFLECT")


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_dyn_pad(mode):
    x = _data((2, 3, 4), seed=1)
    text = (f'def @main(%x: Tensor[(2, ?, 4), float32], %p: Tensor[(3, 2), int64], %v: float32) {{ '
            f'dyn.nn.pad(%x, %p, %v, pad_mode="{mode}") }}')
    for pads in ([[0, 1], [2, 0], [1, 1]], [[1, 0], [0, 0], [3, 2]]):
        expected = _pad_oracle(x, pads, mode, np.float32(7.5))
        check_everywhere(text, [x, np.array(pads, "int64"), np.float32(7.5)], expected)
    check_op("dyn.nn.pad", [x, np.array(pads, "int32"), np.float32(7.5)], {"pad_mode": mode}, expected,
             consts=True)


def test_dyn_pad_types_and_errors():
    rel = get_op("dyn.nn.pad").type_rel
    data, value = TensorType((2, Any()), "float32"), TensorType((), "float32")
    assert rel([data, TensorType((2, 2), "int64"), value], {}) == TensorType((Any(), Any()), "float32")
    with pytest.raises(TypeInferenceError, match="rows"):
        rel([data, TensorType((3, 2), "int64"), value], {})
    with pytest.raises(TypeInferenceError, match="scalar"):
        rel([data, TensorType((2, 2), "int64"), TensorType((1,), "float32")], {})
    with pytest.raises(ShapeError, match="non-negative"):
        get_op("dyn.nn.pad").kernel({}, np.zeros((2, 2), "float32"), np.array([[0, -1], [0, 0]]), np.float32(0))
    with pytest.raises(ShapeError, match="reflect"):
        get_op("dyn.nn.pad").kernel({"pad_mode": "reflect"}, np.zeros((2, 2), "float32"),
                                    np.array([[0, 2], [0, 0]]), np.float32(0))


def test_dilate():
    kernel = get_op("nn.dilate").kernel
    assert kernel({"strides": [2]}, np.array([1, 2, 3], "int32")).tolist() == [1, 0, 2, 0, 3]
    x = _data((2, 3, 4), "int32", seed=2)
    expected = np.full((2, 5, 10), -3, "int32")
    for index in np.ndindex(x.shape):
        expected[index[0], index[1] * 2, index[2] * 3] = x[index]
    check_op("nn.dilate", [x], {"strides": [1, 2, 3], "dilation_value": -3.0}, expected)
    text = 'def @main(%x: Tensor[(?, 3, ?), int32]) { nn.dilate(%x, strides=[1, 2, 3], dilation_value=-3f) }'
    check_everywhere(text, [x], expected)
    check_everywhere(text, [np.zeros((2, 3, 0), "int32")], np.zeros((2, 5, 0), "int32"))
    with pytest.raises(TypeInferenceError, match="strides"):
        get_op("nn.dilate").type_rel([TensorType((2, 3), "float32")], {"strides": [2]})


def conv1d_transpose_oracle(x, w, stride=1, padding=(0, 0), dilation=1, output_padding=0, groups=1):
    """Scatter x[n, c, i] * w[c, o, k] to position i * stride + k * dilation, then crop the padding."""
    n, c, width = x.shape
    _, og, kw = w.shape
    full = np.zeros((n, og * groups, (width - 1) * stride + dilation * (kw - 1) + 1 + output_padding))
    per_group = c // groups
    for ci in range(c):
        g = ci // per_group
        for i in range(width):
            for k in range(kw):
                full[:, g * og:(g + 1) * og, i * stride + k * dilation] += np.outer(x[:, ci, i], w[ci, :, k])
    size = full.shape[2] - padding[0] - padding[1]
    return full[:, :, padding[0]:padding[0] + size].astype(x.dtype)


@pytest.mark.parametrize("stride, padding, dilation, output_padding, groups", [
    (1, (0, 0), 1, 0, 1), (2, (1, 0), 1, 1, 1), (3, (2, 1), 2, 1, 2), (1, (1, 1), 3, 0, 4),
])
def test_conv1d_transpose(stride, padding, dilation, output_padding, groups):
    x, w = _data((2, 4, 5), seed=3), _data((4, 3, 3), seed=4)
    expected = conv1d_transpose_oracle(x, w, stride, padding, dilation, output_padding, groups)
    attrs = {"strides": [stride], "padding": list(padding), "dilation": [dilation],
             "output_padding": [output_padding], "groups": groups, "channels": 3 * groups, "kernel_size": [3]}
    check_op("nn.conv1d_transpose", [x, w], attrs, expected, rtol=1e-5, atol=1e-5)
    text = (f"def @main(%x: Tensor[(?, 4, ?), float32], %w: Tensor[(4, 3, 3), float32]) {{ "
            f"(nn.conv1d_transpose(%x, %w, strides=[{stride}], padding=[{padding[0]}, {padding[1]}], "
            f"dilation=[{dilation}], output_padding=[{output_padding}], groups={groups}), "
            f'nn.conv1d_transpose(%x, %w, strides=[{stride}], padding=[{padding[0]}, {padding[1]}], '
            f'dilation=[{dilation}], output_padding=[{output_padding}], groups={groups}, out_layout="NWC")) }}')
    check_everywhere(text, [x, w], (expected, expected.transpose(0, 2, 1)), rtol=1e-5, atol=1e-5)


def test_conv1d_transpose_layouts_and_types():
    x, w = _data((1, 6, 2), seed=5), _data((2, 3, 4), seed=6)  # NWC data, IOW weight
    expected = conv1d_transpose_oracle(x.transpose(0, 2, 1), w, 2).transpose(0, 2, 1)
    check_op("nn.conv1d_transpose", [x, w], {"strides": [2], "data_layout": "NWC"}, expected, rtol=1e-5, atol=1e-5)
    rel = get_op("nn.conv1d_transpose").type_rel
    n = SymDim("n")
    assert rel([TensorType((n, 4, Any()), "float32"), TensorType((4, 2, 3), "float32")], {}) == \
        TensorType((n, 2, Any()), "float32")
    assert rel([TensorType((n, 4, 5), "float32"), TensorType((4, 2, 3), "float32")], {"strides": [2], "padding": [1]}) \
        == TensorType((n, 2, 9), "float32")
    with pytest.raises(TypeInferenceError, match="in-channels"):
        rel([TensorType((1, 5, 5), "float32"), TensorType((4, 2, 3), "float32")], {})
    with pytest.raises(AttrError, match="conv1d_transpose"):
        rel([TensorType((1, 4, 5), "float32"), TensorType((4, 2, 3), "float32")], {"output_padding": [1]})
    with pytest.raises(TypeInferenceError, match="rank 3"):
        rel([TensorType((1, 4, 5, 1), "float32"), TensorType((4, 2, 3), "float32")], {})


def test_the_relay_ops_print_and_parse_back():
    text = HEADER + """def @main(%x: Tensor[(1, 2, 3, 4), float32], %w: Tensor[(2, 3, 2), float32], %t: Tensor[(1, 2, 3), float32],
          %y: Tensor[(1, 2, 4), float32], %p: Tensor[(4, 2), int64], %s: Tensor[(2), int64]) {
  %0 = image.resize2d(%x, size=[5, 2], roi=[0.1f, 0f, 1f, 1f], method="cubic", cubic_alpha=-0.75f);
  %1 = nn.mirror_pad(%x, pad_width=[[0, 0], [0, 0], [1, 1], [2, 2]], mode="REFLECT");
  %2 = nn.conv1d_transpose(%y, %w, strides=[2], padding=[1, 0], output_padding=[1]);
  %3 = image.grid_sample(%x, image.affine_grid(%t, target_shape=[3, 3]), padding_mode="border", align_corners=False);
  %4 = nn.upsampling(%x, scale_h=2f, scale_w=2f, method="bilinear", align_corners=True);
  %5 = dyn.nn.pad(%x, %p, 0f, pad_mode="edge");
  %6 = dyn.image.resize2d(%x, %s, zeros(shape=[4], dtype="float32"), layout="NCHW");
  (%0, %1, %2, %3, %4, nn.dilate(%x, strides=[1, 1, 2, 2]), contrib_reverse_reshape(%x, newshape=[-1, 0]), %5, %6)
}"""
    mod = tv.transform.InferType()(tv.parse(text))
    again = tv.transform.InferType()(tv.parse(mod.astext()))
    assert again.astext() == mod.astext()
    assert "Tensor[(1, 2, 5, 2), float32]" in mod.astext()


def test_dyn_pad_fused_with_its_neighbours():
    x = _data((1, 2, 3, 4), seed=9)
    pads = np.array([[0, 0], [0, 1], [1, 1], [2, 0]], "int64")
    text = ("def @main(%x: Tensor[(1, 2, 3, 4), float32], %p: Tensor[(4, 2), int64]) { "
            "add(dyn.nn.pad(nn.relu(%x), %p, 1f), 2f) }")
    check_everywhere(text, [x, pads], _pad_oracle(np.maximum(x, 0), pads.tolist(), "constant", np.float32(1)) + 2)
