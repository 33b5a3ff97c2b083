"""MaxPool (with its indices) then MaxUnpool, as segmentation models (SegNet) use them, against ONNX Runtime:
without output_shape, and with output_shape giving back an odd-sized image, over a dynamic batch."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_cases import onnx_model, tensorvm_runs

ort = pytest.importorskip("onnxruntime")
VI = helper.make_tensor_value_info


@pytest.mark.parametrize("side, with_shape", [(8, False), (7, True)])
def test_pool_then_unpool_matches_onnx_runtime(side, with_shape):
    rng = np.random.default_rng(side)
    pooled = side // 2
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Relu", ["p"], ["r"]),
             helper.make_node("MaxUnpool", ["r", "i"] + (["shape"] if with_shape else []), ["y"],
                              kernel_shape=[2, 2], strides=[2, 2])]
    out = side if with_shape else 2 * pooled
    inputs = [VI("x", TensorProto.FLOAT, ["n", 3, side, side])]
    if with_shape:
        nodes.insert(0, helper.make_node("Shape", ["x"], ["shape"]))
    model = onnx_model(nodes, inputs, [VI("y", TensorProto.FLOAT, ["n", 3, out, out])])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for mode, run in tensorvm_runs(model):
        for n in (1, 3):
            x = rng.standard_normal((n, 3, side, side)).astype(np.float32)
            np.testing.assert_array_equal(run(x)[0], session.run(None, {"x": x})[0], err_msg=mode)
