"""ONNX LSTM / GRU / RNN imported as IR loops (``tensorvm/frontend/onnx_recurrent.py``).

Each op gets one model holding a node per variant (directions, layouts, optional inputs, peepholes,
clip, custom activations, input_forget, linear_before_reset, sequence_lens). The sequence dim is
dynamic: one executable per target ("python" and "c") runs two sequence lengths. The oracles are
ONNX Runtime and the NumPy reference ops (``nn.lstm`` / ``nn.gru`` / ``nn.rnn`` kernels). The
imported modules must hold loops, not the opaque ops, and build ``Y`` only when the graph reads it.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import tensorvm as tv  # noqa: E402
from tensorvm.errors import TensorVMError, TypeInferenceError, UnsupportedError  # noqa: E402
from tensorvm.frontend import from_onnx  # noqa: E402
from tensorvm.ir.analysis import post_order  # noqa: E402
from tensorvm.ir.expr import Call, Op  # noqa: E402
from tensorvm.op import get_op  # noqa: E402
from tensorvm.vm import bytecode as bc  # noqa: E402

BATCH, INPUT, HIDDEN = 3, 4, 5
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
OPAQUE = {"LSTM": "nn.lstm", "GRU": "nn.gru", "RNN": "nn.rnn"}
ATOL = 2e-5

# One node per variant. Keys besides ONNX attributes: bias, initial (initial_h/_c), peephole, lens
# (sequence_lens, a graph input), outputs (which outputs exist; "unread" = named but read by nothing).
CASES = {
    "LSTM": [
        dict(),
        dict(bias=True),
        dict(bias=True, initial=True, direction="reverse"),
        dict(bias=True, initial=True, peephole=True, direction="bidirectional"),
        dict(bias=True, initial=True, layout=1),
        dict(bias=True, layout=1, direction="bidirectional"),
        dict(bias=True, peephole=True, clip=0.6),
        dict(bias=True, initial=True, clip=0.4),
        dict(bias=True, input_forget=1),
        dict(bias=True, activations=["HardSigmoid", "Softsign", "Softplus"], activation_alpha=[0.3],
             activation_beta=[0.4]),
        dict(bias=True, lens=True, initial=True, direction="bidirectional"),
        dict(bias=True, lens=True, direction="reverse", layout=1),
        dict(bias=True, outputs=("", "Y_h", "Y_c")),
        dict(bias=True, direction="reverse", outputs=("unread", "Y_h", "")),
        # alpha / beta go in order to the functions that take them, not by position
        dict(bias=True, activations=["Sigmoid", "LeakyRelu", "Tanh", "HardSigmoid", "Tanh", "ScaledTanh"],
             activation_alpha=[0.1, 0.3, 0.8], activation_beta=[0.4, 0.7], direction="bidirectional"),
    ],
    "GRU": [
        dict(),
        dict(bias=True, initial=True),
        dict(bias=True, linear_before_reset=1),
        dict(bias=True, initial=True, linear_before_reset=1, direction="bidirectional"),
        dict(linear_before_reset=1, clip=0.3, direction="reverse"),
        dict(bias=True, direction="reverse", layout=1),
        dict(bias=True, clip=0.5, direction="bidirectional", activations=["HardSigmoid", "Elu", "HardSigmoid",
             "LeakyRelu"], activation_alpha=[0.25, 0.3, 0.15, 0.05], activation_beta=[0.6]),
        dict(bias=True, lens=True, direction="bidirectional", linear_before_reset=1),
        dict(bias=True, lens=True, initial=True, layout=1),
        dict(outputs=("", "Y_h")),
        dict(bias=True, activations=["Sigmoid", "Affine"], activation_alpha=[0.5], activation_beta=[0.2]),
    ],
    "RNN": [
        dict(),
        dict(bias=True, initial=True),
        dict(bias=True, direction="reverse"),
        dict(bias=True, initial=True, direction="bidirectional", layout=1),
        dict(bias=True, initial=True, activations=["Relu"]),
        dict(bias=True, activations=["Affine"], activation_alpha=[0.7], activation_beta=[0.1], clip=2.0),
        dict(bias=True, activations=["ScaledTanh", "ThresholdedRelu"], activation_alpha=[1.2, 0.1],
             activation_beta=[0.8], direction="bidirectional"),
        dict(bias=True, lens=True, direction="reverse"),
        dict(bias=True, outputs=("", "Y_h")),
        dict(bias=True, activations=["Tanh", "LeakyRelu"], activation_alpha=[0.3], direction="bidirectional"),
    ],
}
_LAYER_KEYS = ("bias", "initial", "peephole", "lens", "outputs")


def _num_directions(case):
    return 2 if case.get("direction") == "bidirectional" else 1


def _node_arrays(op, index, case, rng):
    """The initializers of node ``index`` (weights, biases, initial states, peepholes)."""
    gates, nd = GATES[op], _num_directions(case)
    arrays = {"W": rng.uniform(-0.6, 0.6, (nd, gates * HIDDEN, INPUT)),
              "R": rng.uniform(-0.6, 0.6, (nd, gates * HIDDEN, HIDDEN))}
    if case.get("bias"):
        arrays["B"] = rng.uniform(-0.5, 0.5, (nd, 2 * gates * HIDDEN))
    if case.get("initial"):
        shape = (BATCH, nd, HIDDEN) if case.get("layout") else (nd, BATCH, HIDDEN)
        arrays["initial_h"] = rng.uniform(-1, 1, shape)
        if op == "LSTM":
            arrays["initial_c"] = rng.uniform(-1, 1, shape)
    if case.get("peephole"):
        arrays["P"] = rng.uniform(-0.5, 0.5, (nd, 3 * HIDDEN))
    return {f"n{index}_{k}": v.astype(np.float32) for k, v in arrays.items()}


def _input_names(op, index, case, arrays):
    slots = ["X", "W", "R", "B", "sequence_lens", "initial_h"] + (["initial_c", "P"] if op == "LSTM" else [])
    names = []
    for slot in slots:
        if slot == "X":
            names.append("X_batch_major" if case.get("layout") else "X")
        elif slot == "sequence_lens":
            names.append("lens" if case.get("lens") else "")
        else:
            key = f"n{index}_{slot}"
            names.append(key if key in arrays else "")
    while not names[-1]:
        names.pop()
    return names


@functools.cache
def recurrent_model(op, for_ort=False):
    """``(model, [(index, case, node outputs read by the graph)])``: every variant of ``op`` as one graph.

    ``for_ort=True`` gives the same function for ONNX Runtime, which lacks ``layout=1``: such nodes
    become ``layout=0`` nodes between Transposes."""
    rng = np.random.default_rng(sum(map(ord, op)))
    nodes = [helper.make_node("Transpose", ["X"], ["X_batch_major"], perm=[1, 0, 2])]
    initializers, outputs, cases = {}, [], []
    for index, case in enumerate(CASES[op]):
        arrays = _node_arrays(op, index, case, rng)
        default = ("Y", "Y_h", "Y_c") if op == "LSTM" else ("Y", "Y_h")
        wanted = case.get("outputs", default)
        names = [f"n{index}_{w}" if w else "" for w in wanted]
        attrs = {k: v for k, v in case.items() if k not in _LAYER_KEYS}
        inputs = _input_names(op, index, case, arrays)
        read = [n for w, n in zip(wanted, names, strict=True) if w and w != "unread"]
        transposes = []
        if for_ort and case.get("layout"):
            attrs["layout"] = 0
            inputs[0] = "X"
            arrays = {k: np.swapaxes(v, 0, 1) if "initial" in k else v for k, v in arrays.items()}
            for k, name in enumerate(names):
                if name in read:
                    perm = [2, 0, 1, 3] if k == 0 else [1, 0, 2]
                    transposes.append(helper.make_node("Transpose", [name + "_l0"], [name], perm=perm))
                    names[k] = name + "_l0"
        initializers.update(arrays)
        nodes.append(helper.make_node(op, inputs, names, hidden_size=HIDDEN, name=f"{op}_{index}", **attrs))
        nodes += transposes
        outputs += read
        cases.append((index, case, read))
    graph = helper.make_graph(
        nodes, op,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["seq", BATCH, INPUT]),
         helper.make_tensor_value_info("lens", TensorProto.INT32, [BATCH])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(v, k) for k, v in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8), cases


@functools.cache
def imported(op):
    model, _ = recurrent_model(op)
    mod, params = from_onnx(model, shape={"X": [None, BATCH, INPUT]})
    return mod, params


@functools.cache
def compiled(op, target):
    mod, params = imported(op)
    return tv.vm.VirtualMachine(tv.vm.compile(mod, target=target, params=params))


def _inputs(seq, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((seq, BATCH, INPUT)).astype(np.float32)
    lens = rng.integers(1, seq + 1, BATCH).astype(np.int32)
    lens[0] = seq  # one full-length entry
    return x, lens


def _ort(op, x, lens):
    """The graph outputs by ONNX Runtime."""
    model, _ = recurrent_model(op, for_ort=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    return dict(zip(names, session.run(None, {"X": x, "lens": lens}), strict=True))


def _reference(op, index, case, x, lens):
    """The outputs of node ``index`` by the NumPy reference op (its kernel, called directly)."""
    model, _ = recurrent_model(op)
    prefix = f"n{index}_"
    arrays = {t.name[len(prefix):]: numpy_helper.to_array(t) for t in model.graph.initializer
              if t.name.startswith(prefix)}
    empty = np.zeros((0,), np.float32)
    args = [np.swapaxes(x, 0, 1) if case.get("layout") else x, arrays["W"], arrays["R"], arrays.get("B", empty),
            lens if case.get("lens") else np.zeros((0,), np.int32), arrays.get("initial_h", empty)]
    if op == "LSTM":
        args += [arrays.get("initial_c", empty), arrays.get("P", empty)]
    opdef = get_op(OPAQUE[op])
    attrs = {k: tuple(v) if isinstance(v, list) else v for k, v in case.items() if k not in _LAYER_KEYS}
    return [np.asarray(o) for o in opdef.kernel(opdef.normalize_attrs({"hidden_size": HIDDEN, **attrs}), *args)]


def _outputs_by_name(op, result):
    model, _ = recurrent_model(op)
    values = result if isinstance(result, tuple) else (result,)
    return {o.name: v.numpy() for o, v in zip(model.graph.output, values, strict=True)}


def _ops_in(mod):
    names = set()
    for _, fn in mod.functions.items():
        for node in post_order(fn):
            if isinstance(node, Call) and isinstance(node.op, Op):
                names.add(node.op.name)
    return names


# ---- tests ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", sorted(CASES))
def test_imported_as_a_loop_without_the_opaque_op(op):
    mod, _ = imported(op)
    ops = _ops_in(mod)
    assert OPAQUE[op] not in ops
    assert "nn.dense" in ops
    loops = [fn for gv, fn in mod.functions.items() if gv.name != "main"]
    # one step function per direction of every node; those of nodes whose Y is read also carry Y
    assert len(loops) == sum(_num_directions(c) for c in CASES[op])
    _, cases = recurrent_model(op)
    num_states = 2 if op == "LSTM" else 1
    carrying_y = sum(_num_directions(case) for index, case, read in cases if f"n{index}_Y" in read)
    assert sum(len(fn.ret_type.fields) == num_states + 1 for fn in loops) == carrying_y
    assert mod["main"].params[0].type_annotation.shape[0] == tv.Any()


@pytest.mark.parametrize("target", ["python", "c"])
@pytest.mark.parametrize("op", sorted(CASES))
def test_matches_onnxruntime_and_the_reference_op_for_two_lengths(op, target):
    _, cases = recurrent_model(op)
    vm = compiled(op, target)
    for seq in (2, 7):
        x, lens = _inputs(seq, seed=seq)
        got = _outputs_by_name(op, vm.invoke("main", x, lens))
        want = _ort(op, x, lens)
        assert got.keys() == want.keys()
        for name, value in want.items():
            assert got[name].shape == value.shape, name
            np.testing.assert_allclose(got[name], value, atol=ATOL, rtol=1e-4, err_msg=f"{op} {name} seq={seq}")
        if target == "python":  # the reference op too (it does not depend on the target)
            for index, case, read in cases:
                ref = _reference(op, index, case, x, lens)
                default = ("Y", "Y_h", "Y_c") if op == "LSTM" else ("Y", "Y_h")
                for k, which in enumerate(case.get("outputs", default)):
                    name = f"n{index}_{which}"
                    if name in read:
                        np.testing.assert_allclose(got[name], ref[k], atol=ATOL, rtol=1e-4, err_msg=name)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 9), st.integers(0, 2**31 - 1))
def test_lstm_any_length_and_sequence_lens_match_onnxruntime(seq, seed):
    vm = compiled("LSTM", "python")
    x, lens = _inputs(seq, seed)
    got = _outputs_by_name("LSTM", vm.invoke("main", x, lens))
    for name, value in _ort("LSTM", x, lens).items():
        np.testing.assert_allclose(got[name], value, atol=ATOL, rtol=1e-4, err_msg=name)


def test_a_sequence_length_above_seq_counts_as_seq():
    vm = compiled("LSTM", "python")
    x, lens = _inputs(5, seed=11)
    clamped = _outputs_by_name("LSTM", vm.invoke("main", x, lens))
    over = _outputs_by_name("LSTM", vm.invoke("main", x, np.where(lens == 5, 9, lens).astype(np.int32)))
    for name, value in clamped.items():
        np.testing.assert_array_equal(over[name], value, err_msg=name)


def _single_node_model(op="LSTM", outputs=("Y", "Y_h", "Y_c"), graph_outputs=None, x_shape=("seq", BATCH, INPUT),
                       w_shape=None, **attrs):
    gates, nd = GATES[op], 2 if attrs.get("direction") == "bidirectional" else 1
    rng = np.random.default_rng(7)
    w = rng.uniform(-0.5, 0.5, (nd, gates * HIDDEN, INPUT)).astype(np.float32)
    r = rng.uniform(-0.5, 0.5, (nd, gates * HIDDEN, HIDDEN)).astype(np.float32)
    graph_outputs = [o for o in outputs if o] if graph_outputs is None else graph_outputs
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x_shape))]
    inits = [numpy_helper.from_array(r, "R")]
    if w_shape is None:
        inits.append(numpy_helper.from_array(w, "W"))
    else:  # W as a graph input of the given (possibly symbolic) shape
        inputs.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, list(w_shape)))
    graph = helper.make_graph(
        [helper.make_node(op, ["X", "W", "R"], list(outputs), hidden_size=HIDDEN, **attrs)], "g", inputs,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in graph_outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8), w


def test_y_is_built_only_when_the_graph_reads_it():
    unread, _ = _single_node_model(outputs=("Y", "Y_h", "Y_c"), graph_outputs=["Y_h"])
    omitted, _ = _single_node_model(outputs=("", "Y_h", "Y_c"))
    read, _ = _single_node_model(outputs=("Y", "Y_h", "Y_c"), graph_outputs=["Y"])
    for model, builds_y in ((unread, False), (omitted, False), (read, True)):
        mod, _ = from_onnx(model, shape={"X": [None, BATCH, INPUT]})
        ops = _ops_in(mod)
        assert "nn.lstm" not in ops
        assert ("scatter_nd" in ops) == builds_y
        (loop,) = [fn for gv, fn in mod.functions.items() if gv.name != "main"]
        assert len(loop.ret_type.fields) == (3 if builds_y else 2)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_the_step_writes_its_row_of_y_in_place(op):
    # Regression (issue 18): Y grew by a concatenate per step (quadratic in the sequence length). Now
    # each step writes row t of a buffer the loop owns: in the lowered step, a kernel whose output is
    # the Y parameter itself, and no concatenate.
    model, _ = _single_node_model(op=op, outputs=("Y", "Y_h"), x_shape=("seq", "batch", INPUT),
                                  direction="bidirectional")
    mod, _ = from_onnx(model)
    steps = _step_functions(mod)
    assert len(steps) == 2
    for fn in steps:
        names = {node.op.name for node in post_order(fn.body) if isinstance(node, Call) and isinstance(node.op, Op)}
        assert "scatter_nd" in names and "concatenate" not in names
    exe = tv.vm.compile(mod, target="c")
    for fn in exe.functions:
        if fn.name == "main":
            continue
        y = fn.params.index("acc")
        writes = [ins for ins in fn.instructions if isinstance(ins, bc.InvokePacked) and y in ins.outputs]
        assert len(writes) == 1 and writes[0].inputs[0] == y
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    vm = tv.vm.VirtualMachine(exe)
    for seq, batch in ((1, 2), (7, 3)):
        x = np.random.default_rng(seq).standard_normal((seq, batch, INPUT)).astype(np.float32)
        for _ in range(2):  # a second call sees no state of the first
            for g, want in zip(vm.invoke("main", x), session.run(None, {"X": x}), strict=True):
                np.testing.assert_allclose(g.numpy(), want, atol=ATOL, rtol=1e-4)


def test_dynamic_batch_and_weights_as_parameters():
    model, _ = _single_node_model(op="GRU", outputs=("Y", "Y_h"), x_shape=("seq", "batch", INPUT),
                                  direction="bidirectional", linear_before_reset=1)
    mod, params = from_onnx(model, freeze_params=False)
    assert params and "nn.gru" not in _ops_in(mod)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="python", params=params))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seq, batch in ((3, 1), (6, 4)):
        x = np.random.default_rng(seq).standard_normal((seq, batch, INPUT)).astype(np.float32)
        got = vm.invoke("main", x)
        for g, want in zip(got, session.run(None, {"X": x}), strict=True):
            np.testing.assert_allclose(g.numpy(), want, atol=ATOL, rtol=1e-4)


def _step_functions(mod):
    return [fn for gv, fn in mod.functions.items() if gv.name != "main"]


def _takes(fn):
    return [node for node in post_order(fn.body) if isinstance(node, Call) and isinstance(node.op, Op)
            and node.op.name == "take"]


def test_the_step_reads_its_row_without_a_per_element_index_check_and_names_the_batch():
    # Regression (issue 18): a "fast" take is an index check per element in C, and unrelated "?" batch
    # dims make every operand a broadcast read; either kept the fused gate kernel from vectorizing.
    model, _ = _single_node_model(op="GRU", outputs=("Y", "Y_h"), x_shape=("seq", "batch", INPUT),
                                  direction="bidirectional", linear_before_reset=1)
    mod, _ = from_onnx(model)
    for fn in _step_functions(mod):
        (take,) = _takes(fn)
        assert take.attrs["mode"] == "clip"
        proj, h, acc = fn.params[2:5]
        batch = h.type_annotation.shape[0]
        assert isinstance(batch, tv.ir.types.SymDim)
        assert proj.type_annotation.shape[1] == batch and acc.type_annotation.shape[1] == batch
        assert h.type_annotation.shape[1] == HIDDEN


@pytest.mark.parametrize("target", ["python", "c"])
def test_dynamic_batch_with_initial_state_matches_onnxruntime_and_a_wrong_batch_is_an_error(target):
    rng = np.random.default_rng(3)
    w = rng.uniform(-0.5, 0.5, (1, 3 * HIDDEN, INPUT)).astype(np.float32)
    r = rng.uniform(-0.5, 0.5, (1, 3 * HIDDEN, HIDDEN)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("GRU", ["X", "W", "R", "", "", "H0"], ["Y", "Y_h"], hidden_size=HIDDEN)], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["seq", "batch", INPUT]),
         helper.make_tensor_value_info("H0", TensorProto.FLOAT, [1, "batch0", HIDDEN])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h")],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    mod, params = from_onnx(model)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target=target, params=params))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seq, batch in ((4, 2), (9, 5)):
        x = rng.standard_normal((seq, batch, INPUT)).astype(np.float32)
        h0 = rng.standard_normal((1, batch, HIDDEN)).astype(np.float32)
        for g, want in zip(vm.invoke("main", x, h0), session.run(None, {"X": x, "H0": h0}), strict=True):
            np.testing.assert_allclose(g.numpy(), want, atol=ATOL, rtol=1e-4)
    x = rng.standard_normal((4, 3, INPUT)).astype(np.float32)
    with pytest.raises(TensorVMError):
        vm.invoke("main", x, rng.standard_normal((1, 2, HIDDEN)).astype(np.float32))


def test_unknown_number_of_directions_falls_back_to_the_opaque_op():
    model, w = _single_node_model(w_shape=["dirs", GATES["LSTM"] * HIDDEN, INPUT])
    mod, _ = from_onnx(model)
    assert "nn.lstm" in _ops_in(mod)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="python"))
    x = np.random.default_rng(1).standard_normal((4, BATCH, INPUT)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for g, want in zip(vm.invoke("main", x, w), session.run(None, {"X": x, "W": w}), strict=True):
        np.testing.assert_allclose(g.numpy(), want, atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("attrs, error, match", [
    (dict(activations=["Sigmoid", "Tanh", "Swish"]), UnsupportedError, "unknown activation 'swish'"),
    (dict(activations=["Sigmoid", "Tanh"]), TypeInferenceError, "takes 3 activations, got 2"),
    (dict(direction="bidirectional"), TypeInferenceError, "W has 1 direction"),
])
def test_bad_attributes_are_clear_errors(attrs, error, match):
    model, _ = _single_node_model(**{k: v for k, v in attrs.items() if k != "direction"})
    if "direction" in attrs:
        model.graph.node[0].attribute.append(helper.make_attribute("direction", attrs["direction"]))
    with pytest.raises(error, match=match):
        from_onnx(model)


def _cell_ops(fn):
    return [node.op.name for node in post_order(fn.body) if isinstance(node, Call) and isinstance(node.op, Op)
            and node.op.name in ("nn.lstm_cell", "nn.gru_cell")]


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_steps_with_the_default_activations_use_the_cell_op(op):
    # nn.lstm_cell / nn.gru_cell (op/recurrent.py) replace the step's add, split and gate math where the
    # layer has the default activations, no peepholes, no input_forget and (GRU) linear_before_reset=1.
    mod, _ = imported(op)
    _, cases = recurrent_model(op)
    steps = iter(_step_functions(mod))
    for index, case, _read in cases:
        for d in range(_num_directions(case)):
            fn = next(steps)
            cell = ("activations" not in case and not case.get("peephole") and not case.get("input_forget")
                    and (op == "LSTM" or case.get("linear_before_reset")))
            assert _cell_ops(fn) == ([f"nn.{op.lower()}_cell"] if cell else []), (index, case, d)
            if cell:
                names = {node.op.name for node in post_order(fn.body) if isinstance(node, Call)
                         and isinstance(node.op, Op)}
                assert "split" not in names and "sigmoid" not in names


@pytest.mark.parametrize("exec_mode", ["bytecode", "native"])
@pytest.mark.parametrize("op, attrs", [("LSTM", {}), ("LSTM", dict(direction="bidirectional")),
                                       ("GRU", dict(linear_before_reset=1, direction="bidirectional"))])
def test_cell_steps_match_the_interpreter_after_save_and_load(op, attrs, exec_mode):
    # Two stacked layers (the second reads the first's Y), batch 1 and 3, sequence lengths 1 and 6.
    gates, nd = GATES[op], 2 if attrs.get("direction") == "bidirectional" else 1
    rng = np.random.default_rng(5)
    nodes, inits, x_name = [], [], "X"
    for layer, width in enumerate((INPUT, nd * HIDDEN)):
        names = [f"W{layer}", f"R{layer}", f"B{layer}"]
        for name, shape in zip(names, ((nd, gates * HIDDEN, width), (nd, gates * HIDDEN, HIDDEN),
                                       (nd, 2 * gates * HIDDEN)), strict=True):
            inits.append(numpy_helper.from_array(rng.uniform(-0.6, 0.6, shape).astype(np.float32), name))
        outs = [f"Y{layer}", f"H{layer}"]
        nodes.append(helper.make_node(op, [x_name] + names, outs, hidden_size=HIDDEN, **attrs))
        nodes.append(helper.make_node("Transpose", [f"Y{layer}"], [f"T{layer}"], perm=[0, 2, 1, 3]))
        nodes.append(helper.make_node("Reshape", [f"T{layer}", "flat"], [f"F{layer}"]))
        x_name = f"F{layer}"
    inits.append(numpy_helper.from_array(np.array([0, 0, -1], np.int64), "flat"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                                         ["seq", "batch", INPUT])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("F1", "H1")],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    mod, params = from_onnx(model)
    assert _cell_ops(_step_functions(mod)[0])
    exe = tv.vm.compile(mod, target="c", params=params, exec_mode=exec_mode)
    vm = tv.vm.VirtualMachine(tv.vm.load_executable(exe.save_bytes()))
    interpreter = tv.create_executor("debug", mod).evaluate()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seq, batch in ((1, 1), (6, 1), (1, 3), (6, 3)):
        x = rng.standard_normal((seq, batch, INPUT)).astype(np.float32)
        want = [np.asarray(v.numpy()) for v in interpreter(x, **(params or {}))]
        for g, w, o in zip(vm.invoke("main", x), want, session.run(None, {"X": x}), strict=True):
            np.testing.assert_allclose(g.numpy(), w, atol=ATOL, rtol=1e-4)
            np.testing.assert_allclose(g.numpy(), o, atol=ATOL, rtol=1e-4)
