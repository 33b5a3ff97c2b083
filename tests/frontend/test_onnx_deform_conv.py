"""DeformConv (``frontend/onnx_nn.py``) against ONNX's reference evaluator: fractional offsets (some moving
taps off the image), strides, pads, dilations, groups, offset groups, a mask and a bias, with a run-time
batch (bytecode and native); with zero offsets and no mask it is the plain convolution (against NumPy)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnx_cases import onnx_model, tensorvm_runs

VI = helper.make_tensor_value_info
F = TensorProto.FLOAT


def _model(c, h, w, oc, k, group, offset_group, strides, pads, dilations, with_mask, with_bias):
    oh = (h + pads[0] + pads[2] - (k[0] - 1) * dilations[0] - 1) // strides[0] + 1
    ow = (w + pads[1] + pads[3] - (k[1] - 1) * dilations[1] - 1) // strides[1] + 1
    taps = k[0] * k[1]
    inputs = [VI("x", F, ["N", c, h, w]), VI("w", F, [oc, c // group, *k]),
              VI("offset", F, ["N", offset_group * taps * 2, oh, ow])]
    names = ["x", "w", "offset", "b" if with_bias else "", "mask" if with_mask else ""]
    inputs += [VI("b", F, [oc])] if with_bias else []
    inputs += [VI("mask", F, ["N", offset_group * taps, oh, ow])] if with_mask else []
    while not names[-1]:
        names.pop()
    node = helper.make_node("DeformConv", names, ["y"], group=group, offset_group=offset_group, strides=strides,
                            pads=pads, dilations=dilations, kernel_shape=k)
    return onnx_model([node], inputs, [VI("y", F, ["N", oc, oh, ow])], opset=22, ir_version=10), (oh, ow)


@pytest.mark.parametrize("c, oc, k, group, offset_group, strides, pads, dilations, with_mask, with_bias", [
    (2, 3, (3, 3), 1, 1, [1, 1], [1, 1, 1, 1], [1, 1], False, True),
    (4, 4, (2, 3), 2, 2, [2, 1], [0, 1, 1, 0], [1, 2], True, False),
    (4, 2, (3, 2), 1, 4, [1, 2], [1, 0, 0, 1], [2, 1], True, True),
])
def test_deform_conv_matches_the_reference(c, oc, k, group, offset_group, strides, pads, dilations, with_mask,
                                           with_bias):
    h, w = 6, 5
    model, (oh, ow) = _model(c, h, w, oc, k, group, offset_group, strides, pads, dilations, with_mask, with_bias)
    reference = ReferenceEvaluator(model)
    rng = np.random.default_rng(c + oc)
    taps = k[0] * k[1]
    weight = rng.standard_normal((oc, c // group, *k)).astype(np.float32)
    for mode, run in tensorvm_runs(model):
        for batch in (1, 2):
            feeds = {"x": rng.standard_normal((batch, c, h, w)).astype(np.float32), "w": weight,
                     "offset": (2.5 * rng.standard_normal((batch, offset_group * taps * 2, oh, ow))).astype(np.float32)}
            if with_bias:
                feeds["b"] = rng.standard_normal(oc).astype(np.float32)
            if with_mask:
                feeds["mask"] = rng.uniform(0, 1, (batch, offset_group * taps, oh, ow)).astype(np.float32)
            want = reference.run(None, feeds)[0]
            got = run(*feeds.values())[0]
            assert got.shape == want.shape, mode
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=mode)


def test_zero_offsets_give_the_plain_convolution():
    model, (oh, ow) = _model(3, 5, 5, 2, (3, 3), 1, 1, [1, 1], [1, 1, 1, 1], [1, 1], False, False)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 3, 5, 5)).astype(np.float32)
    weight = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((1, 2, 5, 5))
    for i in range(5):
        for j in range(5):
            want[0, :, i, j] = np.einsum("ochw,chw->o", weight, padded[0, :, i:i + 3, j:j + 3])
    for mode, run in tensorvm_runs(model):
        got = run(x, weight, np.zeros((1, 18, oh, ow), np.float32))[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=mode)
