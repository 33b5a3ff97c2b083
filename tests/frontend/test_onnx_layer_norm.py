"""ONNX LayerNormalization: one ``nn.layer_norm`` when only the normalized output is read, the step by
step form when the graph reads the mean or the inverse deviation too. Oracle: ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import tensorvm as tv  # noqa: E402
from tensorvm.frontend import from_onnx  # noqa: E402
from tensorvm.ir.analysis import post_order  # noqa: E402
from tensorvm.ir.expr import Call, Op  # noqa: E402

WIDTH = 24


def _model(outputs: int, bias: bool, axis: int = -1):
    rng = np.random.default_rng(outputs + 2 * bias)
    inits = [numpy_helper.from_array(rng.standard_normal(WIDTH).astype(np.float32), "scale")]
    inputs = ["X", "scale"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(WIDTH).astype(np.float32), "bias"))
        inputs.append("bias")
    names = ["Y", "Mean", "InvStd"][:outputs]
    node = helper.make_node("LayerNormalization", inputs, names, axis=axis, epsilon=1e-3)
    graph = helper.make_graph([node], "ln", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 3, WIDTH])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _ops(mod) -> set:
    return {n.op.name for fn in mod.functions.values() for n in post_order(fn.body)
            if isinstance(n, Call) and isinstance(n.op, Op)}


@pytest.mark.parametrize("target", ["python", "c"])
@pytest.mark.parametrize("outputs,bias", [(1, True), (1, False), (3, True)])
def test_layer_normalization_matches_onnxruntime(outputs, bias, target):
    model = _model(outputs, bias)
    mod, params = from_onnx(model, shape={"X": [None, 3, WIDTH]})
    assert ("nn.layer_norm" in _ops(mod)) == (outputs == 1)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target=target, params=params))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for rows in (1, 7):
        x = np.random.default_rng(rows).standard_normal((rows, 3, WIDTH)).astype(np.float32)
        want = session.run(None, {"X": x})
        got = vm.invoke("main", x)
        got = [got] if outputs == 1 else list(got)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-4, atol=1e-5)


def test_normalizing_over_several_axes_keeps_the_step_by_step_form():
    model = _model(1, True, axis=1)
    model.graph.node[0].attribute[0].i = 1  # axis 1: over the last two dims
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones((3, WIDTH), np.float32), "scale"))
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.zeros((3, WIDTH), np.float32), "bias"))
    mod, _ = from_onnx(model, shape={"X": [None, 3, WIDTH]})
    assert "nn.layer_norm" not in _ops(mod)
