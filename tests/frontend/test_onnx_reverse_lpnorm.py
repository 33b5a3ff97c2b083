"""ReverseSequence and LpNormalization against ONNX Runtime on the same model and inputs, with dynamic
dims (one compiled executable, several shapes), both axis layouts, rank 3 inputs and zero norms."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_cases import onnx_model, tensorvm_runs

ort = pytest.importorskip("onnxruntime")
VI = helper.make_tensor_value_info


def _both(node, inputs, output, feeds_list):
    model = onnx_model([node], inputs, [output])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for mode, run in tensorvm_runs(model):
        for feeds in feeds_list:
            want = session.run(None, feeds)[0]
            np.testing.assert_allclose(run(*feeds.values())[0], want, rtol=1e-6, atol=1e-7, err_msg=mode)


@pytest.mark.parametrize("batch_axis", [0, 1])
def test_reverse_sequence_over_dynamic_lengths(batch_axis):
    rng = np.random.default_rng(0)
    time_axis = 1 - batch_axis
    dims = ["b", "t", 3] if batch_axis == 0 else ["t", "b", 3]
    node = helper.make_node("ReverseSequence", ["x", "lens"], ["y"], batch_axis=batch_axis, time_axis=time_axis)
    feeds = []
    for batch, steps in ((2, 5), (4, 3), (1, 1)):
        shape = (batch, steps, 3) if batch_axis == 0 else (steps, batch, 3)
        lens = rng.integers(1, steps + 1, batch).astype(np.int64)
        feeds.append({"x": rng.standard_normal(shape).astype(np.float32), "lens": lens})
    _both(node, [VI("x", TensorProto.FLOAT, dims), VI("lens", TensorProto.INT64, ["b"])],
          VI("y", TensorProto.FLOAT, dims), feeds)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [-1, 1])
def test_lp_normalization_with_a_zero_row(p, axis):
    rng = np.random.default_rng(1)
    node = helper.make_node("LpNormalization", ["x"], ["y"], axis=axis, p=p)
    feeds = []
    for n in (3, 1):
        x = rng.standard_normal((n, 4, 5)).astype(np.float32)
        x[0, :, 0] = 0  # (a zero vector along axis 1)
        x[0, 0, :] = 0  # (and along the last axis)
        feeds.append({"x": x})
    _both(node, [VI("x", TensorProto.FLOAT, ["n", 4, 5])], VI("y", TensorProto.FLOAT, ["n", 4, 5]), feeds)
