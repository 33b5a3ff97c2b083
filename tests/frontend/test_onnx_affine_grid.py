"""AffineGrid then GridSample (a spatial transformer) against ONNX Runtime: the grid's size from the
input's Shape, so one executable serves several batch sizes and images; 2-D, with and without
align_corners (bytecode and native)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_cases import onnx_model, tensorvm_runs

ort = pytest.importorskip("onnxruntime")
VI = helper.make_tensor_value_info


@pytest.mark.parametrize("align_corners", [0, 1])
def test_spatial_transformer_matches_onnx_runtime(align_corners):
    rng = np.random.default_rng(align_corners)
    nodes = [helper.make_node("Shape", ["x"], ["size"]),
             helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align_corners),
             helper.make_node("GridSample", ["x", "grid"], ["y"], align_corners=align_corners)]
    model = onnx_model(nodes, [VI("x", TensorProto.FLOAT, ["n", 3, "h", "w"]), VI("theta", TensorProto.FLOAT, ["n", 2, 3])],
                       [VI("y", TensorProto.FLOAT, ["n", 3, "h", "w"]), VI("grid", TensorProto.FLOAT, ["n", "h", "w", 2])],
                       opset=20, ir_version=9)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for mode, run in tensorvm_runs(model):
        for n, h, w in ((1, 5, 7), (2, 8, 8)):
            x = rng.standard_normal((n, 3, h, w)).astype(np.float32)
            theta = (np.eye(2, 3)[None] + 0.2 * rng.standard_normal((n, 2, 3))).astype(np.float32)
            want = session.run(None, {"x": x, "theta": theta})
            for got, expected in zip(run(x, theta), want, strict=True):
                np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=mode)
