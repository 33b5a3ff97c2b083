"""The ONNX importer's convolutions and pools: 2-d cases that ``nn.conv2d`` / ``nn.max_pool2d`` /
``nn.avg_pool2d`` compute become those ops (the code generator's tuned kernels), the rest
``nn.conv_nd`` / ``nn.pool_nd``; either way the model runs on target c without NumPy fallbacks and
matches ONNX's reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from test_onnx_core_lowering import check_lowered  # noqa: E402
from test_onnx_importer import make_model, ops_of, reference  # noqa: E402

import tensorvm as tv  # noqa: E402
from tensorvm.frontend import from_onnx  # noqa: E402

F32 = TensorProto.FLOAT


def _run_on_c(model, *args):
    mod, params = from_onnx(model)
    exe = tv.vm.compile(mod, target="c", params=params)
    assert exe.stats()["kernel_library"]["numpy_fallbacks"] == {}
    out = tv.vm.VirtualMachine(exe).invoke("main", *args).numpy()
    np.testing.assert_allclose(out, reference(model, *args)[0], rtol=1e-5, atol=1e-5)
    return ops_of(mod)


@pytest.mark.parametrize("op_type,attrs,shape,expected", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, [1, 3, 9, 9], "nn.max_pool2d"),
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}, [1, 3, 9, 8],
     "nn.max_pool2d"),
    ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, [1, 3, 9, 7], "nn.max_pool2d"),
    # ONNX drops a ceil-mode window that would start in the end padding; Relay's formula does not
    ("MaxPool", {"kernel_shape": [2, 2], "strides": [3, 3], "pads": [0, 0, 1, 1], "ceil_mode": 1}, [1, 3, 5, 5],
     "nn.pool_nd"),
    ("MaxPool", {"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER"}, [1, 3, "h", 6], "nn.pool_nd"),
    ("MaxPool", {"kernel_shape": [3], "strides": [2]}, [1, 3, 9], "nn.pool_nd"),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
     [1, 3, 9, 9], "nn.avg_pool2d"),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [1, 2], "pads": [1, 0, 1, 2]}, [1, 2, "h", "w"],
     "nn.avg_pool2d"),
    ("LpPool", {"kernel_shape": [2, 2], "p": 3}, [1, 2, 5, 5], "nn.pool_nd"),
])
def test_pools(op_type, attrs, shape, expected):
    model = make_model([helper.make_node(op_type, ["x"], ["y"], **attrs)], [("x", F32, shape)],
                       [("y", F32, None)], opset=18)
    x = np.random.default_rng(0).standard_normal([5 if isinstance(d, str) else d for d in shape]).astype("float32")
    assert expected in _run_on_c(model, x)


@pytest.mark.parametrize("attrs,shape,weight,expected", [
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, [1, 2, 7, 6], [4, 2, 3, 3], "nn.conv2d"),
    ({"auto_pad": "SAME_LOWER", "group": 2}, [1, 4, 5, "w"], [4, 2, 2, 3], "nn.conv_nd"),
    ({"pads": [1, 0, 2, 1], "dilations": [1, 2]}, [1, 2, 6, 7], [3, 2, 3, 2], "nn.conv2d"),
    ({"pads": [1, 2], "strides": [2]}, [2, 2, 9], [3, 2, 3], "nn.conv_nd"),
    ({"pads": [1, 0, 0, 0, 1, 1]}, [1, 2, 4, 3, 5], [2, 2, 2, 2, 3], "nn.conv_nd"),
])
def test_convolutions(attrs, shape, weight, expected):
    rng = np.random.default_rng(1)
    w = rng.standard_normal(weight).astype("float32")
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], **attrs)], [("x", F32, shape)],
                       [("y", F32, None)], initializers={"w": w})
    x = rng.standard_normal([5 if isinstance(d, str) else d for d in shape]).astype("float32")
    assert expected in _run_on_c(model, x)


@pytest.mark.parametrize("attrs,width", [
    ({"strides": [1, 3], "auto_pad": "SAME_UPPER"}, 3),  # the SAME width 9 > the full 8: a zero in front
    ({"strides": [1, 4], "auto_pad": "SAME_LOWER"}, 3),
    ({"strides": [2, 3], "auto_pad": "SAME_UPPER"}, "w"),
    ({"strides": [2, 3], "output_shape": [5, 10]}, 3),  # beyond the full 4 x 8: zeros at the end
    ({"strides": [1, 3], "output_shape": [5, 11], "auto_pad": "SAME_LOWER"}, 3),
])
def test_conv_transpose_output_beyond_the_full_result(attrs, width):
    """ConvTranspose whose output is larger than the full transposed convolution (a negative total
    padding): the full result with zeros around it, on every executor, as ONNX's reference evaluator
    computes it (ONNX Runtime's SAME output is shorter here, against the spec's input x stride)."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((2, 3, 2, 2)).astype("float32")
    model = make_model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], **attrs)], [("x", F32, [1, 2, 2, width])],
                       [("y", F32, None)], initializers={"w": w})
    check_lowered(model, rng.standard_normal((1, 2, 2, 3)).astype("float32"), ops=("nn.conv_transpose_nd",),
                  rtol=1e-5, atol=1e-6)
