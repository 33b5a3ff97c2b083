"""MaxRoiPool (``frontend/onnx_detection.py``) against ONNX Runtime: RoIs of several sizes (smaller than a
bin, reaching past the image, on both images of a batch), scales that round halves, a run-time number of
RoIs (bytecode and native), and a bin of -inf values. ONNX has no node test or reference for it."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx_cases import onnx_model, tensorvm_runs

VI = helper.make_tensor_value_info
F = TensorProto.FLOAT


@pytest.mark.parametrize("pooled, scale", [((2, 2), 1.0), ((3, 2), 0.5), ((7, 7), 0.25)])
def test_max_roi_pool_matches_onnx_runtime(pooled, scale):
    model = onnx_model([helper.make_node("MaxRoiPool", ["x", "rois"], ["y"], pooled_shape=pooled,
                                        spatial_scale=scale)],
                       [VI("x", F, [2, 3, 9, 11]), VI("rois", F, ["R", 5])], [VI("y", F, ["R", 3, *pooled])])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(pooled[0])
    x = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    x[1, 2, 3:5, 4:6] = -np.inf  # (a bin of -inf values pools to -inf, not to the empty bin's 0)
    lowest = np.finfo(np.float32).min
    boxes = [[0, 0, 0, 10, 8], [1, 2, 3, 5, 4], [1, 4, 2, 4, 2], [0, 6, 5, 30, 25], [1, 1.5, 2.5, 9.5, 7.5],
             [0, 10, 8, 10, 8], [1, 7, 6, 11, 12]]
    for mode, run in tensorvm_runs(model):
        for count in (1, 4, 7):
            rois = np.array(boxes[:count], np.float32) / np.array([1, scale, scale, scale, scale], np.float32)
            want = session.run(None, {"x": x, "rois": rois})[0]
            # ONNX Runtime starts its maximum at the lowest finite float: a bin of -inf values gives that;
            # tensorvm gives their maximum, -inf
            want = np.where(want == lowest, -np.inf, want).astype(np.float32)
            got = run(x, rois)[0]
            assert got.shape == want.shape, mode
            np.testing.assert_array_equal(got, want, err_msg=f"{mode} {count}")
