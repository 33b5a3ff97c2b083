"""The ONNX importer on hand-built graphs: dynamic dims, shape arithmetic, control flow, data-dependent ops,
parameters and errors. The oracle is ONNX's reference evaluator; every module runs on the VM and on the
interpreter."""

from __future__ import annotations

import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import tensorvm as tv  # noqa: E402
from tensorvm.errors import FormatError, UnsupportedError  # noqa: E402
from tensorvm.frontend import from_onnx  # noqa: E402
from tensorvm.ir.expr import Call  # noqa: E402
from tensorvm.ir.functor import ExprVisitor  # noqa: E402
from tensorvm.ir.types import Any, SymDim, TensorType  # noqa: E402
from tensorvm.vm import bytecode as bc  # noqa: E402

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def make_model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(initializers).items()])
    # IR version 9: what both the reference evaluator and ONNX Runtime read.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def reference(model, *args, oracle="reference"):
    """The outputs by ONNX's reference evaluator (or ONNX Runtime, for what the evaluator lacks)."""
    names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    feeds = dict(zip(names, args, strict=True))
    if oracle == "ort":
        ort = pytest.importorskip("onnxruntime")
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, feeds)
    return ReferenceEvaluator(model).run(None, feeds)


def _as_list(value):
    return [v.numpy() for v in value] if isinstance(value, tuple) else [value.numpy()]


def run_everywhere(model, *args, oracle="reference", **import_kwargs):
    """Import, then run on the VM and the interpreter; both must agree with the oracle."""
    mod, params = from_onnx(model, **import_kwargs)
    expected = reference(model, *args, oracle=oracle)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="python", params=params))
    results = {"vm": _as_list(vm.invoke("main", *args))}
    bound = [params[p.name_hint] for p in mod["main"].params[len(args):]]
    results["interpreter"] = _as_list(tv.create_executor("debug", mod).evaluate()(*args, *bound))
    for where, outs in results.items():
        assert len(outs) == len(expected), where
        for got, want in zip(outs, expected, strict=True):
            assert got.dtype == want.dtype, where
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=where)
    return mod


def ops_of(mod) -> set:
    found = set()

    class Collect(ExprVisitor):
        def visit_call(self, call):
            if hasattr(call.op, "name") and not isinstance(call.op, Call):
                found.add(call.op.name)
            super().visit_call(call)

    for _, fn in mod.functions.items():
        Collect().visit(fn)
    return found


# ---- signatures ------------------------------------------------------------------------------------------


def test_dim_params_become_symbolic_and_unknown_dims_any():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F32, ["batch", None, 4])],
                       [("y", F32, None)])
    mod, params = from_onnx(model)
    (x,) = mod["main"].params
    assert x.type_annotation == TensorType((SymDim("batch"), Any(), 4), "float32")
    assert params == {}


def test_shape_argument_overrides_the_model():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F32, ["batch", None, 4])],
                       [("y", F32, None)])
    mod, _ = from_onnx(model, shape={"x": [2, "seq", None]})
    assert mod["main"].params[0].type_annotation == TensorType((2, SymDim("seq"), Any()), "float32")
    with pytest.raises(TypeError, match="unknown inputs"):
        from_onnx(model, shape={"nope": [1]})


def test_model_from_path_and_bad_files(tmp_path):
    model = make_model([helper.make_node("Neg", ["x"], ["y"])], [("x", F32, [3])], [("y", F32, None)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    mod, _ = from_onnx(str(path))
    assert "negative" in ops_of(mod)
    with pytest.raises(FormatError, match="no such file"):
        from_onnx(str(tmp_path / "missing.onnx"))
    (tmp_path / "junk.onnx").write_bytes(b"\x00\x01 not protobuf \xff" * 3)
    with pytest.raises(FormatError):
        from_onnx(str(tmp_path / "junk.onnx"))


def test_unsupported_ops_are_listed_in_one_error_with_node_names():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("StringNormalizer", ["a"], ["b"], name="strings_node"),
             helper.make_node("Hamming", ["b"], ["c"], name="h1"),
             helper.make_node("CustomThing", ["c"], ["y"], name="custom", domain="com.example")]
    model = make_model(nodes, [("x", F32, [3, 3])], [("y", F32, None)])
    with pytest.raises(UnsupportedError) as info:
        from_onnx(model)
    message = str(info.value)
    assert "3 unsupported" in message
    for part in ("StringNormalizer", "'strings_node'", "Hamming", "'h1'", "com.example.CustomThing", "'custom'"):
        assert part in message
    assert "Relu" not in message


# ---- shape arithmetic -------------------------------------------------------------------------------------


def _reshape_by_own_shape_nodes():
    """y = Reshape(x, Concat(Shape(x)[0], Shape(x)[1] * 2, -1)) - the export idiom for view()."""
    return [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["d0"], axis=0),
        helper.make_node("Gather", ["s", "one"], ["d1"], axis=0),
        helper.make_node("Mul", ["d1", "two"], ["d1x2"]),
        helper.make_node("Unsqueeze", ["d0", "axes0"], ["u0"]),
        helper.make_node("Unsqueeze", ["d1x2", "axes0"], ["u1"]),
        helper.make_node("Concat", ["u0", "u1", "minus1"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["x", "newshape"], ["y"]),
    ]


_SHAPE_CONSTS = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "two": np.array(2, np.int64),
                 "axes0": np.array([0], np.int64), "minus1": np.array([-1], np.int64)}


def test_shape_arithmetic_folds_when_dims_are_static():
    model = make_model(_reshape_by_own_shape_nodes(), [("x", F32, [2, 3, 4])], [("y", F32, None)], _SHAPE_CONSTS)
    x = np.arange(24, dtype="float32").reshape(2, 3, 4)
    mod = run_everywhere(model, x)
    assert ops_of(mod) == {"reshape"}  # no shape_of/take/concatenate left


@pytest.mark.parametrize("batch", [1, 3])
def test_shape_arithmetic_with_dynamic_dims(batch):
    model = make_model(_reshape_by_own_shape_nodes(), [("x", F32, ["batch", "n", 4])], [("y", F32, None)],
                       _SHAPE_CONSTS)
    x = np.random.default_rng(batch).standard_normal((batch, 5, 4)).astype("float32")
    mod = run_everywhere(model, x)
    assert "shape_of" in ops_of(mod)


def test_reshape_copying_dynamic_dims_becomes_a_static_reshape():
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "b0", "b2"], ["head"]),
             helper.make_node("Concat", ["head", "split"], ["newshape"], axis=0),
             helper.make_node("Reshape", ["x", "newshape"], ["y"])]
    consts = {"b0": np.array([0], np.int64), "b2": np.array([2], np.int64), "split": np.array([2, 3], np.int64)}
    model = make_model(nodes, [("x", F32, ["batch", "seq", 6])], [("y", F32, None)], consts)
    mod = run_everywhere(model, np.ones((2, 7, 6), "float32"))
    assert ops_of(mod) == {"reshape"}
    assert mod["main"].body.checked_type == TensorType((SymDim("batch"), SymDim("seq"), 2, 3), "float32")


def test_constant_of_shape_expand_and_range_with_run_time_sizes():
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["ones"],
                              value=numpy_helper.from_array(np.array([1.5], np.float32))),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=F32),
             helper.make_node("Unsqueeze", ["rf", "axes1"], ["col"]),
             helper.make_node("Expand", ["col", "s"], ["e"]),
             helper.make_node("Add", ["e", "ones"], ["y"])]
    consts = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "axes1": np.array([1], np.int64)}
    model = make_model(nodes, [("x", F32, ["n", "m"])], [("y", F32, None)], consts)
    for shape in [(1, 4), (5, 2)]:
        run_everywhere(model, np.zeros(shape, "float32"))


# ---- control flow -----------------------------------------------------------------------------------------


def _branch(name, node_op, out):
    return helper.make_graph([helper.make_node(node_op, ["x"], [out])], name, [],
                             [helper.make_tensor_value_info(out, F32, None)])


@pytest.mark.parametrize("flag", [True, False])
def test_if_with_branches_reading_outer_values(flag):
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=_branch("then", "Exp", "t"),
                              else_branch=_branch("else", "Neg", "e"))]
    model = make_model(nodes, [("x", F32, ["n"])], [("y", F32, None)], {"zero": np.array(0, np.float32)})
    x = np.linspace(0.1, 1, 4, dtype="float32") * (1 if flag else -1)
    mod = run_everywhere(model, x)
    assert "If" not in str(mod)  # converted, not kept


def _loop_body():
    """Body of a loop: acc = acc * 2 + x (x from the outer graph); also emits acc as a scan output."""
    nodes = [helper.make_node("Mul", ["acc_in", "two"], ["doubled"]),
             helper.make_node("Add", ["doubled", "x"], ["acc_out"]),
             helper.make_node("Identity", ["cond_in"], ["cond_out"]),
             helper.make_node("Identity", ["acc_out"], ["scan_out"])]
    return helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", BOOL, []),
         helper.make_tensor_value_info("acc_in", F32, None)],
        [helper.make_tensor_value_info("cond_out", BOOL, []), helper.make_tensor_value_info("acc_out", F32, None),
         helper.make_tensor_value_info("scan_out", F32, None)],
        [numpy_helper.from_array(np.array(2, np.float32), "two")])


@pytest.mark.parametrize("trips", [0, 1, 7])
def test_loop_with_run_time_trip_count_becomes_recursion(trips):
    node = helper.make_node("Loop", ["M", "", "init"], ["final", "history"], body=_loop_body())
    model = make_model([node], [("M", I64, []), ("init", F32, [3]), ("x", F32, [3])],
                       [("final", F32, None), ("history", F32, None)], opset=17)
    # reorder: the graph inputs are M, init, x
    args = (np.array(trips, np.int64), np.ones(3, "float32"), np.array([0.5, -1, 2], "float32"))
    if trips == 0:
        mod, _ = from_onnx(model)
        out = tv.vm.VirtualMachine(tv.vm.compile(mod, target="python")).invoke("main", *args)
        np.testing.assert_array_equal(out[0].numpy(), args[1])
        assert out[1].numpy().shape[0] == 0
        return
    mod = run_everywhere(model, *args, oracle="ort")
    loops = [gv for gv in mod.functions if gv.name.startswith("loop")]
    assert len(loops) == 1  # the body became one recursive global function
    assert f"@{loops[0].name}(" in str(mod[loops[0]].body)
    # the scan output: a list of slices, stacked after the loop by a fill whose update runs in place
    assert {gv.name for gv in mod.functions} == {"main", loops[0].name, "scan_fill", "scan_stack"}
    exe = tv.vm.compile(mod, target="c")
    fill = next(f for f in exe.functions if f.name == "scan_fill")
    assert any(isinstance(ins, bc.InvokePacked) and set(ins.outputs) & set(ins.inputs) for ins in fill.instructions)


def test_long_loop_runs_in_constant_stack_on_the_vm():
    node = helper.make_node("Loop", ["M", "", "init"], ["final", "history"], body=_loop_body())
    model = make_model([node], [("M", I64, []), ("init", F32, [1]), ("x", F32, [1])],
                       [("final", F32, None), ("history", F32, None)])
    mod, _ = from_onnx(model)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="python"))
    final, history = vm.invoke("main", np.array(3000, np.int64), np.zeros(1, "float32"), np.zeros(1, "float32"))
    assert history.numpy().shape == (3000, 1)
    assert final.numpy().tolist() == [0.0]


def test_scan_cumulative_sum_with_reverse_input():
    body = helper.make_graph(
        [helper.make_node("Add", ["state_in", "row"], ["state_out"]),
         helper.make_node("Identity", ["state_out"], ["scan_out"])], "scan_body",
        [helper.make_tensor_value_info("state_in", F32, [2]), helper.make_tensor_value_info("row", F32, [2])],
        [helper.make_tensor_value_info("state_out", F32, [2]), helper.make_tensor_value_info("scan_out", F32, [2])])
    node = helper.make_node("Scan", ["init", "xs"], ["final", "partial"], body=body, num_scan_inputs=1,
                            scan_input_directions=[1])
    model = make_model([node], [("init", F32, [2]), ("xs", F32, ["n", 2])],
                       [("final", F32, None), ("partial", F32, None)])
    xs = np.arange(10, dtype="float32").reshape(5, 2)
    run_everywhere(model, np.zeros(2, "float32"), xs, oracle="ort")


@pytest.mark.parametrize("with_lengths", [False, True])
def test_scan_of_opset_8_over_a_run_time_batch(with_lengths):
    """Opset 8's Scan: a batch axis first on the states and scan inputs (a run-time batch here), two states,
    two scan inputs (one read in reverse), a value of the graph the body reads, and optionally
    ``sequence_lens`` (each entry runs its own number of steps; its outputs past them are zeros), against
    ONNX Runtime on the VM (target python, and each exec mode of target c) and the interpreter."""
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("Add", ["sum_in", "a"], ["sum_out"]),
         helper.make_node("Mul", ["b", "scale"], ["scaled"]),
         helper.make_node("Max", ["peak_in", "scaled"], ["peak_out"]),
         helper.make_node("Sub", ["sum_out", "scaled"], ["diff"])], "scan_body",
        [vi("sum_in", F32, [3]), vi("peak_in", F32, [3]), vi("a", F32, [3]), vi("b", F32, [3])],
        [vi("sum_out", F32, [3]), vi("peak_out", F32, [3]), vi("diff", F32, [3])])
    names = (["lens"] if with_lengths else [""]) + ["s0", "p0", "xa", "xb"]
    node = helper.make_node("Scan", names, ["sum", "peak", "diffs"], body=body, num_scan_inputs=2,
                            directions=[0, 1])
    inputs = ([("lens", I64, ["batch"])] if with_lengths else []) + [
        ("s0", F32, ["batch", 3]), ("p0", F32, ["batch", 3]), ("xa", F32, ["batch", "seq", 3]),
        ("xb", F32, ["batch", "seq", 3])]
    model = make_model([node], inputs, [("sum", F32, None), ("peak", F32, None), ("diffs", F32, None)],
                       {"scale": np.array([1.0, -2.0, 0.5], np.float32)}, opset=8)
    rng = np.random.default_rng(3)
    mod = None
    for batch, seq in ((2, 4), (3, 1)):
        args = [rng.standard_normal(shape).astype(np.float32) for shape in
                ((batch, 3), (batch, 3), (batch, seq, 3), (batch, seq, 3))]
        if with_lengths:
            args.insert(0, np.array([seq, 1, max(seq - 2, 1)][:batch], np.int64))
        mod = run_everywhere(model, *args, oracle="ort")
        expected = reference(model, *args, oracle="ort")
        for mode in ("bytecode", "native"):
            vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", exec_mode=mode))
            for got, want in zip(_as_list(vm.invoke("main", *args)), expected, strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=mode)
    if with_lengths:
        vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c"))
        args = [np.zeros((1, 3), np.float32)] * 2 + [np.zeros((1, 2, 3), np.float32)] * 2
        for bad in (3, 0):
            with pytest.raises(tv.errors.TensorVMError):
                vm.invoke("main", np.array([bad], np.int64), *args)


# ---- data-dependent ops ----------------------------------------------------------------------------------------


def test_nonzero_compress_unique_topk():
    nodes = [helper.make_node("Greater", ["x", "zero"], ["mask"]),
             helper.make_node("NonZero", ["mask"], ["where"]),
             helper.make_node("Compress", ["x", "mask"], ["kept"]),
             helper.make_node("Unique", ["r"], ["u", "first", "inverse", "counts"], sorted=1),
             helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=-1)]
    model = make_model(nodes, [("x", F32, ["n"]), ("r", I64, ["m"]), ("k", I64, [1])],
                       [(n, t, None) for n, t in [("where", I64), ("kept", F32), ("u", I64), ("first", I64),
                                                  ("inverse", I64), ("counts", I64), ("values", F32),
                                                  ("indices", I64)]],
                       {"zero": np.array(0, np.float32)})
    x = np.array([0.5, -1, 2, 0, 3, -2], "float32")
    run_everywhere(model, x, np.array([3, 1, 3, 2, 1, 1], np.int64), np.array([2], np.int64))


def test_non_max_suppression():
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "score_min"], ["selected"])
    model = make_model([node], [("boxes", F32, [1, "b", 4]), ("scores", F32, [1, 1, "b"])],
                       [("selected", I64, None)],
                       {"max_out": np.array([3], np.int64), "iou": np.array([0.5], np.float32),
                        "score_min": np.array([0.1], np.float32)})
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, -0.1, 1, 0.9], [0, 10, 1, 11], [0, 10.1, 1, 11.1],
                       [0, 100, 1, 101]]], "float32")
    scores = np.array([[[0.9, 0.75, 0.6, 0.95, 0.5, 0.05]]], "float32")
    run_everywhere(model, boxes, scores)



def test_detection_ops_run_on_target_c_without_numpy_fallbacks():
    # NonMaxSuppression (center boxes, score threshold omitted) lowers onto the all-class NMS and a slice;
    # RoiAlign becomes vision.onnx_roi_align: both C library calls.
    nms = helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou"], ["selected"],
                           center_point_box=1)
    roi = helper.make_node("RoiAlign", ["x", "rois", "batch"], ["pooled"], output_height=2, output_width=3,
                           sampling_ratio=2, spatial_scale=0.5, mode="max")
    model = make_model([nms, roi], [("boxes", F32, [2, "b", 4]), ("scores", F32, [2, 2, "b"]),
                                    ("x", F32, [2, 3, 8, 8]), ("rois", F32, ["r", 4]), ("batch", I64, ["r"])],
                       [("selected", I64, None), ("pooled", F32, None)],
                       {"max_out": np.array([2], np.int64), "iou": np.array([0.4], np.float32)})
    rng = np.random.default_rng(0)
    centers = rng.uniform(0, 10, (2, 7, 2))
    boxes = np.concatenate([centers, rng.uniform(1, 5, (2, 7, 2))], axis=2).astype("float32")
    scores = rng.uniform(0, 1, (2, 2, 7)).astype("float32")
    x = rng.standard_normal((2, 3, 8, 8)).astype("float32")
    rois = np.array([[0, 0, 9, 9], [2, 4, 15, 11], [1, 1, 3, 2]], "float32")
    args = (boxes, scores, x, rois, np.array([1, 0, 1], np.int64))
    mod = run_everywhere(model, *args)
    exe = tv.vm.compile(mod, target="c")
    assert exe.stats()["kernel_library"]["numpy_fallbacks"] == {}
    outs = _as_list(tv.vm.VirtualMachine(exe).invoke("main", *args))
    for got, want in zip(outs, reference(model, *args), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

# ---- parameters -----------------------------------------------------------------------------------------


def test_unfrozen_parameters_are_returned_and_bound_at_compile_time():
    w = np.random.default_rng(0).standard_normal((4, 3)).astype("float32")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Reshape", ["h", "shape"], ["y"])]
    model = make_model(nodes, [("x", F32, ["n", 4])], [("y", F32, None)],
                       {"w": w, "shape": np.array([-1], np.int64)})
    mod, params = from_onnx(model, freeze_params=False)
    assert set(params) == {"w", "shape"}
    np.testing.assert_array_equal(params["w"], w)
    assert [p.name_hint for p in mod["main"].params] == ["x", "w", "shape"]
    assert "reshape" in ops_of(mod)  # the shape parameter's value still decides the static reshape
    run_everywhere(model, np.ones((2, 4), "float32"), freeze_params=False)


def _sub_model(a: str, b: str):
    return make_model([helper.make_node("Sub", [a, b], ["y"])], [(a, F32, [2, 3]), (b, F32, [2, 3])],
                      [("y", F32, None)])


def test_inputs_that_sanitize_alike_get_distinct_names_and_both_bind(tmp_path):
    # "x.1" used to become "x_1" too: two parameters of one name, one of them unreachable by name
    model = _sub_model("x.1", "x_1")
    a, b = np.random.default_rng(0).standard_normal((2, 2, 3)).astype("float32")
    mod = run_everywhere(model, a, b, oracle="ort")
    assert [p.name_hint for p in mod["main"].params] == ["x_1_1", "x_1"]  # the valid name keeps its input
    names = tv.frontend.onnx_param_names(model)
    assert names == {"x.1": "x_1_1", "x_1": "x_1"}
    (want,) = reference(model, a, b, oracle="ort")
    exe = tv.vm.compile(mod, target="python")
    path = tmp_path / "m.tvx"
    exe.save(str(path))
    loaded = tv.vm.load_executable(str(path))
    assert [str(p) for p in loaded.get_function_params("main")] == ["x_1_1", "x_1"]
    vm = tv.vm.VirtualMachine(loaded)
    got = vm.run(**{names["x.1"]: a, names["x_1"]: b})
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    reparsed = tv.parse(str(mod))
    assert [p.name_hint for p in reparsed["main"].params] == ["x_1_1", "x_1"]


@pytest.mark.parametrize("freeze_params", [True, False])
def test_parameter_names_are_unique_valid_and_survive_printing(freeze_params):
    inputs = ["x.1", "x_1", "x:1", "1x", "v1x", "input/0", "a.b"]
    nodes = [helper.make_node("Add", [inputs[0], inputs[1]], ["s0"])]
    for i, name in enumerate([*inputs[2:], "w.1", "w_1"], start=1):
        nodes.append(helper.make_node("Add", [f"s{i - 1}", name], [f"s{i}"]))
    model = make_model(nodes, [(n, F32, [3]) for n in inputs], [(f"s{len(nodes) - 1}", F32, None)],
                       {"w.1": np.ones(3, "float32"), "w_1": np.full(3, 2, "float32")})
    mod, params = from_onnx(model, freeze_params=freeze_params, shape={"x_1": [3], "x_1_1": [3]})
    names = tv.frontend.onnx_param_names(model, freeze_params=freeze_params)
    hints = [p.name_hint for p in mod["main"].params]
    assert hints == list(names.values()) and len(set(hints)) == len(hints)
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", h) for h in hints)
    assert names["x_1"] == "x_1" and names["v1x"] == "v1x" and names["1x"] == "v1x_1"
    assert set(params) == (set() if freeze_params else {names["w.1"], names["w_1"]})
    assert [p.name_hint for p in tv.parse(str(mod))["main"].params] == hints  # printed as named
    args = [np.full(3, i, "float32") for i in range(len(inputs))]
    run_everywhere(model, *args, freeze_params=freeze_params)


# ---- broadcasting property -------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3), st.lists(st.booleans(), min_size=3, max_size=3),
       st.sampled_from(["Add", "Mul", "Max", "Sub"]))
def test_binary_broadcasting_matches_reference(dims, ones, op):
    a_shape = dims
    b_shape = [1 if flag else d for d, flag in zip(dims, ones, strict=False)][1:] or [1]
    model = make_model([helper.make_node(op, ["a", "b"], ["y"])],
                       [("a", F32, [None] * len(a_shape)), ("b", F32, list(b_shape))], [("y", F32, None)])
    rng = np.random.default_rng(len(dims))
    a = rng.standard_normal(a_shape).astype("float32")
    b = rng.standard_normal(b_shape).astype("float32")
    mod, _ = from_onnx(model)
    got = tv.create_executor("debug", mod).evaluate()(a, b).numpy()
    np.testing.assert_allclose(got, reference(model, a, b)[0], rtol=1e-6)
