"""``nn.lstm`` / ``nn.gru`` / ``nn.rnn``, the opaque layers the ONNX importer emits when W's number of
directions is unknown at import (W a graph input of shape (dirs, ...)), run on target c as one call of the
C library function ``tv_recurrent`` (``codegen/lib/recurrent.c``): no NumPy fallback, and the results
match the ops' NumPy kernels (float16, float32, float64) and ONNX Runtime, over every variant of
``test_onnx_recurrent_loop.CASES`` (directions, layouts, optional inputs, peepholes, clip, activations
with alpha/beta, input_forget, linear_before_reset, sequence_lens)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from test_onnx_recurrent_loop import BATCH, CASES, GATES, HIDDEN, INPUT, OPAQUE, _input_names, _node_arrays  # noqa: E402  # noqa: E402
from test_onnx_recurrent_loop import _ops_in as ops_in  # noqa: E402

import tensorvm as tv  # noqa: E402
from tensorvm.errors import ExecutionError, ShapeError  # noqa: E402
from tensorvm.frontend import from_onnx  # noqa: E402
from tensorvm.op import get_op  # noqa: E402

SEQ = 4
ONNX_TYPES = {"float16": TensorProto.FLOAT16, "float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE}
TOLERANCES = {"float16": dict(rtol=2e-3, atol=2e-3), "float32": dict(rtol=1e-5, atol=2e-6),
              "float64": dict(rtol=1e-12, atol=1e-13)}


def _model(op, index, dtype):
    """One node of ``CASES[op][index]`` with W a graph input whose first dim is unknown; its arrays."""
    case = CASES[op][index]
    arrays = {k: v.astype(dtype) for k, v in _node_arrays(op, index, case, np.random.default_rng(index)).items()}
    names = _input_names(op, index, case, arrays)
    names[0] = "X"
    w_name = names[1]
    wanted = [w if w != "unread" else "" for w in case.get("outputs", ("Y", "Y_h", "Y_c")[:3 if op == "LSTM" else 2])]
    outs = [f"o_{w}" if w else "" for w in wanted]
    attrs = {k: v for k, v in case.items() if k not in ("bias", "initial", "peephole", "lens", "outputs")}
    x_shape = [BATCH, "seq", INPUT] if case.get("layout") else ["seq", BATCH, INPUT]
    t = ONNX_TYPES[dtype]
    inputs = [helper.make_tensor_value_info("X", t, x_shape),
              helper.make_tensor_value_info(w_name, t, ["dirs", GATES[op] * HIDDEN, INPUT])]
    if case.get("lens"):
        inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [BATCH]))
    node = helper.make_node(op, names, outs, hidden_size=HIDDEN, **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(o, t, None) for o in outs if o],
                              [numpy_helper.from_array(v, k) for k, v in arrays.items() if k != w_name])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    return model, case, arrays, w_name, wanted


def _kernel_outputs(op, case, arrays, x, lens, wanted):
    """The NumPy kernel of the opaque op, called directly; the outputs the node names."""
    prefix = next(iter(arrays)).split("_")[0] + "_"
    get = {k[len(prefix):]: v for k, v in arrays.items()}
    empty = np.zeros((0,), x.dtype)
    args = [x, get["W"], get["R"], get.get("B", empty), lens if case.get("lens") else np.zeros((0,), np.int32),
            get.get("initial_h", empty)]
    if op == "LSTM":
        args += [get.get("initial_c", empty), get.get("P", empty)]
    opdef = get_op(OPAQUE[op])
    # (float attributes as the model stores them: float32)
    f32 = lambda v: float(np.float32(v)) if isinstance(v, float) else v  # noqa: E731
    attrs = {k: tuple(f32(e) for e in v) if isinstance(v, list) else f32(v) for k, v in case.items()
             if k not in ("bias", "initial", "peephole", "lens", "outputs")}
    outs = opdef.kernel(opdef.normalize_attrs({"hidden_size": HIDDEN, **attrs}), *args)
    return [o for o, w in zip(outs, wanted, strict=True) if w]


@pytest.mark.parametrize("op, index, dtype", [(op, i, dtype) for op in sorted(CASES) for i in range(len(CASES[op]))
                                              for dtype in (("float32", "float64") if i % 3 == 0 else ("float32",))
                                              + (("float16",) if i == 3 else ())])
def test_opaque_layer_runs_natively_on_target_c(op, index, dtype):
    model, case, arrays, w_name, wanted = _model(op, index, dtype)
    mod, params = from_onnx(model)
    assert OPAQUE[op] in ops_in(mod)
    exe = tv.vm.compile(mod, target="c", params=params)
    assert exe.stats()["kernel_library"]["numpy_fallbacks"] == {}
    vm = tv.vm.VirtualMachine(exe)
    rng = np.random.default_rng(100 + index)
    for seq in (SEQ, 1):
        x = rng.standard_normal((BATCH, seq, INPUT) if case.get("layout") else (seq, BATCH, INPUT)).astype(dtype)
        lens = rng.integers(1, seq + 1, BATCH).astype(np.int32)  # (a length 0: ONNX Runtime zeroes Y_h)
        feeds = [x, arrays[w_name]] + ([lens] if case.get("lens") else [])
        got = vm.invoke("main", *feeds)
        got = [g.numpy() for g in (got if isinstance(got, tuple) else (got,))]
        expected = _kernel_outputs(op, case, arrays, x, lens, wanted)
        for g, want in zip(got, expected, strict=True):
            assert g.dtype == want.dtype
            np.testing.assert_allclose(g.astype(np.float64), want.astype(np.float64), **TOLERANCES[dtype])
        if not case.get("layout") and dtype == "float32":  # (ONNX Runtime lacks layout=1)
            session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
            for g, want in zip(got, session.run(None, dict(zip(names, feeds, strict=True))), strict=True):
                np.testing.assert_allclose(g, want, rtol=1e-4, atol=2e-5)


def test_w_with_the_wrong_number_of_directions_is_a_shape_error():
    model, _, arrays, w_name, _ = _model("GRU", 3, "float32")  # bidirectional
    mod, params = from_onnx(model)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params))
    x = np.zeros((SEQ, BATCH, INPUT), np.float32)
    with pytest.raises(ShapeError, match="number of directions"):
        vm.invoke("main", x, arrays[w_name][:1])


def test_a_sequence_length_beyond_the_sequence_is_an_error():
    model, _, arrays, w_name, _ = _model("RNN", 7, "float32")  # lens, reverse
    mod, params = from_onnx(model)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params))
    x = np.zeros((SEQ, BATCH, INPUT), np.float32)
    with pytest.raises(ExecutionError, match="out of range"):
        vm.invoke("main", x, arrays[w_name], np.array([SEQ, SEQ + 1, 1], np.int32))
