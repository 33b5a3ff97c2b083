"""ONNX's linear quantization ops (``frontend/onnx_quantize.py``) against ONNX Runtime on the same model and
inputs: QuantizeLinear / DequantizeLinear per tensor and per channel, DynamicQuantizeLinear (with an
all-zero input), MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv; then whole models quantized by
ONNX Runtime's own tools (dynamic: an MLP; static QDQ: a small CNN), run by ONNX Runtime with its graph
optimizations off so that it computes the nodes as written. Integer outputs must be equal."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh
from onnx_cases import onnx_model

import tensorvm as tv
from tensorvm.errors import UnsupportedError

ort = pytest.importorskip("onnxruntime")
VI = helper.make_tensor_value_info


def _model(nodes, inputs, outputs, inits, opset=13):
    return onnx_model(nodes, inputs, outputs, inits, opset=opset)


def _peer(model, feeds: dict) -> list:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _ours(model, feeds: dict, kind: str) -> list:
    mod, params = tv.frontend.from_onnx(model)
    if kind == "debug":
        result = tv.create_executor("debug", mod=mod).evaluate()(*feeds.values(), **params)
    else:
        exe = tv.vm.compile(mod, target="c", params=params, exec_mode=kind)
        result = tv.vm.VirtualMachine(exe).invoke("main", *feeds.values())
    results = [result] if hasattr(result, "numpy") else list(result)
    return [np.asarray(r.numpy()) for r in results]


def _check(model, feeds: dict, float_atol: float = 1e-6) -> None:
    want = _peer(model, feeds)
    for kind in ("debug", "bytecode", "native"):
        got = _ours(model, feeds, kind)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape, kind
            if np.issubdtype(w.dtype, np.integer):
                np.testing.assert_array_equal(g, w, err_msg=kind)
            else:
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=float_atol, err_msg=kind)


def test_quantize_and_dequantize_per_tensor_and_per_channel():
    rng = np.random.default_rng(0)
    shape = ["n", 3, 8, 8]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
             helper.make_node("QuantizeLinear", ["x", "sc", "zc"], ["qc"], axis=1),
             helper.make_node("DequantizeLinear", ["qc", "sc", "zc"], ["yc"], axis=1),
             helper.make_node("QuantizeLinear", ["x", "s"], ["qu"])]  # (no zero point: uint8, 0)
    inits = [nh.from_array(np.array(0.05, np.float32), "s"), nh.from_array(np.array(7, np.int8), "z"),
             nh.from_array(np.array([0.02, 0.05, 0.1], np.float32), "sc"),
             nh.from_array(np.array([3, 128, 250], np.uint8), "zc")]
    outputs = [VI("q", TensorProto.INT8, shape), VI("y", TensorProto.FLOAT, shape), VI("qc", TensorProto.UINT8, shape),
               VI("yc", TensorProto.FLOAT, shape), VI("qu", TensorProto.UINT8, shape)]
    model = _model(nodes, [VI("x", TensorProto.FLOAT, shape)], outputs, inits)
    x = (rng.standard_normal((2, 3, 8, 8)) * 3).astype(np.float32)
    x[0, 0, 0, :4] = [0.025, 0.075, -0.025, 0.125]  # ties at the scale 0.05: rounded half to even
    _check(model, {"x": x})


@pytest.mark.parametrize("zeros", [False, True])
def test_dynamic_quantize_then_integer_product(zeros):
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["a"], ["aq", "as", "az"]),
             helper.make_node("MatMulInteger", ["aq", "W", "az", "wz"], ["acc"])]
    inits = [nh.from_array(rng.integers(-128, 128, (16, 5)).astype(np.int8), "W"),
             nh.from_array(np.array([1, -2, 0, 3, 5], np.int8), "wz")]  # (a zero point per column)
    outputs = [VI("aq", TensorProto.UINT8, ["m", 16]), VI("as", TensorProto.FLOAT, []),
               VI("az", TensorProto.UINT8, []), VI("acc", TensorProto.INT32, ["m", 5])]
    model = _model(nodes, [VI("a", TensorProto.FLOAT, ["m", 16])], outputs, inits)
    a = np.zeros((3, 16), np.float32) if zeros else (rng.standard_normal((4, 16)) * 2).astype(np.float32)
    _check(model, {"a": a})


def test_qlinear_matmul_of_a_batch():
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])]
    inits = [nh.from_array(np.array(0.03, np.float32), "as"), nh.from_array(np.array(120, np.uint8), "az"),
             nh.from_array(rng.integers(-128, 128, (16, 6)).astype(np.int8), "b"),
             nh.from_array(np.array(0.01, np.float32), "bs"), nh.from_array(np.array(0, np.int8), "bz"),
             nh.from_array(np.array(0.2, np.float32), "ys"), nh.from_array(np.array(100, np.uint8), "yz")]
    model = _model(nodes, [VI("a", TensorProto.UINT8, ["n", 3, 16])], [VI("y", TensorProto.UINT8, ["n", 3, 6])], inits)
    for n in (1, 2):
        _check(model, {"a": rng.integers(0, 256, (n, 3, 16)).astype(np.uint8)})


def test_integer_and_qlinear_convolutions_with_per_channel_weights():
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("ConvInteger", ["x", "w", "xz"], ["acc"], pads=[1, 1, 1, 1]),
             helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "B"], ["y"],
                              pads=[1, 1, 1, 1], strides=[2, 2])]
    inits = [nh.from_array(rng.integers(-127, 128, (6, 4, 3, 3)).astype(np.int8), "w"),
             nh.from_array(np.array(128, np.uint8), "xz"), nh.from_array(np.array(0.02, np.float32), "xs"),
             nh.from_array(np.linspace(0.001, 0.01, 6).astype(np.float32), "ws"),
             nh.from_array(np.zeros(6, np.int8), "wz"), nh.from_array(np.array(0.05, np.float32), "ys"),
             nh.from_array(np.array(10, np.uint8), "yz"),
             nh.from_array(rng.integers(-500, 500, 6).astype(np.int32), "B")]
    outputs = [VI("acc", TensorProto.INT32, ["n", 6, 9, 9]), VI("y", TensorProto.UINT8, ["n", 6, 5, 5])]
    model = _model(nodes, [VI("x", TensorProto.UINT8, ["n", 4, 9, 9])], outputs, inits)
    _check(model, {"x": rng.integers(0, 256, (2, 4, 9, 9)).astype(np.uint8)})


def test_blocked_dequantization_matches_numpy():
    # opset 21's block_size: scale[i, j] serves columns 2j and 2j + 1 of row i (the last block is short)
    q = np.array([[1, -2, 3, 4, -5], [6, 7, -8, 9, 10]], np.int8)
    scale = np.array([[0.5, 0.25, 2.0], [1.0, 0.125, 4.0]], np.float32)
    zero = np.array([[0, 1, -1], [2, 0, 3]], np.int8)
    nodes = [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1, block_size=2)]
    inits = [nh.from_array(scale, "s"), nh.from_array(zero, "z")]
    model = _model(nodes, [VI("q", TensorProto.INT8, [2, 5])], [VI("y", TensorProto.FLOAT, [2, 5])], inits, opset=21)
    cols = np.arange(5) // 2
    want = (q.astype(np.float32) - zero[:, cols]) * scale[:, cols]
    for kind in ("debug", "bytecode", "native"):
        np.testing.assert_array_equal(_ours(model, {"q": q}, kind)[0], want)


def test_a_four_bit_type_is_refused_by_name():
    nodes = [helper.make_node("DequantizeLinear", ["q", "s"], ["y"])]
    model = _model(nodes, [VI("q", TensorProto.INT4, [4])], [VI("y", TensorProto.FLOAT, [4])],
                   [nh.from_array(np.array(0.5, np.float32), "s")], opset=21)
    with pytest.raises(UnsupportedError, match="element type int4"):
        tv.frontend.from_onnx(model)


def _float_model(tmp_path, torch_free_layers: str):
    """A float model with random weights written as ONNX (no torch: the layers in onnx.helper)."""
    rng = np.random.default_rng(4)
    if torch_free_layers == "mlp":
        w1, w2 = rng.standard_normal((32, 64)).astype(np.float32) * 0.2, rng.standard_normal((64, 10)).astype(np.float32) * 0.2
        nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                 helper.make_node("MatMul", ["r", "w2"], ["y"])]
        inits = [nh.from_array(w1, "w1"), nh.from_array(w2, "w2")]
        inputs, outputs = [VI("x", TensorProto.FLOAT, ["n", 32])], [VI("y", TensorProto.FLOAT, ["n", 10])]
    else:
        w1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
        w2 = rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.2
        nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
                 helper.make_node("Relu", ["c1"], ["r1"]),
                 helper.make_node("Conv", ["r1", "w2"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])]
        inits = [nh.from_array(w1, "w1"), nh.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b1"),
                 nh.from_array(w2, "w2")]
        inputs, outputs = [VI("x", TensorProto.FLOAT, ["n", 3, 12, 12])], [VI("y", TensorProto.FLOAT, ["n", 4, 6, 6])]
    path = tmp_path / f"{torch_free_layers}.onnx"
    onnx.save(_model(nodes, inputs, outputs, inits), path)
    return path


def test_a_dynamically_quantized_mlp(tmp_path):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source = _float_model(tmp_path, "mlp")
    quantized = tmp_path / "mlp.int8.onnx"
    quantize_dynamic(str(source), str(quantized), weight_type=QuantType.QInt8)
    model = onnx.load(quantized)
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {node.op_type for node in model.graph.node}
    x = np.random.default_rng(5).standard_normal((3, 32)).astype(np.float32)
    _check(model, {"x": x}, float_atol=1e-5)


def test_a_statically_quantized_cnn_in_qdq_form(tmp_path):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    rng = np.random.default_rng(6)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x": rng.standard_normal((1, 3, 12, 12)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    source = _float_model(tmp_path, "cnn")
    quantized = tmp_path / "cnn.qdq.onnx"
    quantize_static(str(source), str(quantized), Reader(), quant_format=QuantFormat.QDQ, per_channel=True)
    model = onnx.load(quantized)
    assert {"QuantizeLinear", "DequantizeLinear"} <= {node.op_type for node in model.graph.node}
    x = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)
    _check(model, {"x": x}, float_atol=1e-5)
