"""Col2Im (``frontend/onnx_nn.py``) against ONNX Runtime and ONNX's reference evaluator: the gather map of
constant image and block shapes and the scatter-add of run-time ones, over strides, pads and dilations in
1-3 dims, with a run-time batch (bytecode and native). (ONNX Runtime 1.32's 1-D Col2Im misplaces every
channel after the first, so 1-D is checked against the reference alone.)"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnx_cases import onnx_model, tensorvm_runs

VI = helper.make_tensor_value_info
F, I64 = TensorProto.FLOAT, TensorProto.INT64

CASES = [  # image, block, strides, pads, dilations
    ([5, 5], [2, 2], None, None, None),
    ([6, 7], [3, 2], [2, 1], [1, 0, 1, 2], [1, 2]),
    ([9], [3], [2], [1, 1], [2]),
    ([3, 4, 5], [2, 2, 3], [1, 2, 1], [0, 1, 1, 1, 0, 0], None),
]


def _positions(image, block, strides, pads, dilations):
    dims = len(image)
    strides, dilations, pads = strides or [1] * dims, dilations or [1] * dims, pads or [0] * (2 * dims)
    return int(np.prod([(image[d] + pads[d] + pads[d + dims] - dilations[d] * (block[d] - 1) - 1) // strides[d] + 1
                        for d in range(dims)]))


@pytest.mark.parametrize("constant_shapes", [True, False])
@pytest.mark.parametrize("image, block, strides, pads, dilations", CASES)
def test_col2im_sums_blocks_back_like_onnx_runtime(image, block, strides, pads, dilations, constant_shapes):
    dims, channels = len(image), 2
    attrs = {k: v for k, v in (("strides", strides), ("pads", pads), ("dilations", dilations)) if v}
    kernel, positions = int(np.prod(block)), _positions(image, block, strides, pads, dilations)
    shapes = [helper.make_tensor("image", I64, [dims], image), helper.make_tensor("block", I64, [dims], block)]
    inputs = [VI("x", F, ["N", channels * kernel, positions])]
    if not constant_shapes:
        inputs += [VI("image", I64, [dims]), VI("block", I64, [dims])]
    out_dims = ["N", channels, *image] if constant_shapes else ["N", channels] + [f"d{i}" for i in range(dims)]
    model = onnx_model([helper.make_node("Col2Im", ["x", "image", "block"], ["y"], **attrs)], inputs,
                       [VI("y", F, out_dims)], inits=shapes if constant_shapes else (), opset=18)
    oracles = [ReferenceEvaluator(model)]
    if dims > 1:
        oracles.append(ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]))
    rng = np.random.default_rng(len(image))
    for mode, run in tensorvm_runs(model):
        for batch in (1, 3):
            x = rng.standard_normal((batch, channels * kernel, positions)).astype(np.float32)
            feeds = {"x": x} if constant_shapes else {"x": x, "image": np.array(image), "block": np.array(block)}
            got = run(*feeds.values())[0]
            for oracle in oracles:
                want = oracle.run(None, feeds)[0]
                assert got.shape == want.shape, mode
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{mode} {type(oracle).__name__}")
