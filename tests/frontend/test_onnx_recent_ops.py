"""Recent ONNX ops written with core ops (Swish, SwiGLU, CumProd, the Hann/Hamming/Blackman windows,
CenterCropPad, TensorScatter) against ONNX's reference evaluator, on one executable over several
shapes and run-time values (bytecode and native); ONNX's node tests check them too."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnx_cases import onnx_model, tensorvm_runs

import tensorvm as tv
from tensorvm.errors import ExecutionError
from tensorvm.prelude import make_none, make_some

VI = helper.make_tensor_value_info
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _check(node, inputs, outputs, feeds_list, opset=28):
    model = onnx_model([node], inputs, outputs, opset=opset, ir_version=11)
    reference = ReferenceEvaluator(model)
    for mode, run in tensorvm_runs(model):
        for feeds in feeds_list:
            want = reference.run(None, feeds)[0]
            got = run(*feeds.values())[0]
            assert got.dtype == want.dtype and got.shape == want.shape, mode
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=mode)


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_updates_a_kv_cache(mode):
    rng = np.random.default_rng(0)
    node = helper.make_node("TensorScatter", ["past", "update", "at"], ["present"], mode=mode, axis=2)
    dims = ["b", 2, 8, 3]
    feeds = []
    for batch, steps in ((2, 3), (3, 1), (1, 5)):
        at = rng.integers(0, 8 - steps + 1, batch) if mode == "linear" else rng.integers(0, 8, batch)
        feeds.append({"past": rng.standard_normal((batch, 2, 8, 3)).astype(np.float32),
                      "update": rng.standard_normal((batch, 2, steps, 3)).astype(np.float32),
                      "at": at.astype(np.int64)})
    _check(node, [VI("past", F, dims), VI("update", F, ["b", 2, "s", 3]), VI("at", I64, ["b"])],
           [VI("present", F, dims)], feeds)


def test_center_crop_pad_with_a_run_time_target():
    rng = np.random.default_rng(1)
    node = helper.make_node("CenterCropPad", ["x", "shape"], ["y"], axes=[1, 2])
    feeds = [{"x": rng.standard_normal((2, h, w)).astype(np.float32), "shape": np.array(t, np.int64)}
             for h, w, t in ((5, 6, (3, 9)), (4, 4, (4, 1)), (7, 2, (8, 2)))]
    _check(node, [VI("x", F, [2, "h", "w"]), VI("shape", I64, [2])], [VI("y", F, [2, "a", "b"])], feeds)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_of_run_time_sizes(op, periodic):
    node = helper.make_node(op, ["n"], ["w"], periodic=periodic)
    _check(node, [VI("n", I64, [])], [VI("w", F, ["m"])], [{"n": np.array(k, np.int64)} for k in (1, 2, 10, 33)])


def test_cumprod_over_a_run_time_axis_and_swiglu():
    rng = np.random.default_rng(2)
    node = helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=1, reverse=1)
    feeds = [{"x": rng.uniform(0.5, 1.5, (3, 4)).astype(np.float32), "axis": np.array(a, np.int64)} for a in (0, 1, -1)]
    _check(node, [VI("x", F, ["n", 4]), VI("axis", I64, [])], [VI("y", F, ["n", 4])], feeds)
    node = helper.make_node("SwiGLU", ["a", "b"], ["y"], alpha=1.702)
    feeds = [{"a": rng.standard_normal((n, 6)).astype(np.float32), "b": rng.standard_normal((n, 6)).astype(np.float32)}
             for n in (1, 4)]
    _check(node, [VI("a", F, ["n", 6]), VI("b", F, ["n", 6])], [VI("y", F, ["n", 6])], feeds)


def test_optionals_of_tensors_and_of_omitted_inputs():
    # a present optional is its tensor (has an element, gets it back); an omitted input has none
    nodes = [helper.make_node("Optional", ["x"], ["o"]),
             helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("OptionalGetElement", ["o"], ["got"]),
             helper.make_node("OptionalHasElement", [], ["none"]),
             helper.make_node("Add", ["got", "got"], ["twice"]),
             helper.make_node("Where", ["has", "twice", "x"], ["y"])]
    model = onnx_model(nodes, [VI("x", F, ["n"])], [VI("y", F, ["n"]), VI("none", TensorProto.BOOL, [])], opset=18)
    x = np.arange(4, dtype=np.float32) - 1.5
    for mode, run in tensorvm_runs(model):
        y, none = run(x)
        np.testing.assert_array_equal(y, 2 * x, err_msg=mode)  # (has an element, and it is x)
        assert none.dtype == np.bool_ and none.shape == () and not none, mode


@pytest.mark.parametrize("n", [1, 2, 3, 6])
def test_det_of_batches_with_pivoting_and_singular_matrices(n):
    rng = np.random.default_rng(n)
    node = helper.make_node("Det", ["x"], ["d"])
    model = onnx_model([node], [VI("x", F, ["b", 3, n, n])], [VI("d", F, ["b", 3])], opset=13)
    x = rng.standard_normal((2, 3, n, n)).astype(np.float32)
    x[0, 0, 0, 0] = 0  # (a zero first pivot: a row swap)
    if n > 1:
        x[1, 2, 1] = 2 * x[1, 2, 0]  # (a singular matrix)
    want = np.linalg.det(x.astype(np.float64))
    for mode, run in tensorvm_runs(model):
        got = run(x)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=mode)


@pytest.mark.parametrize("op, axis", [("CumProd", 2), ("CumProd", -3), ("DFT", 3), ("DFT", -4)])
def test_a_run_time_axis_out_of_range_is_an_error_not_wrapped(op, axis):
    # (rank 2 for CumProd, rank 3 for DFT: a wrapped axis would compute along another axis)
    if op == "CumProd":
        model = onnx_model([helper.make_node(op, ["x", "axis"], ["y"])], [VI("x", F, [2, 3]), VI("axis", I64, [])],
                           [VI("y", F, [2, 3])], opset=26, ir_version=11)
        x = np.ones((2, 3), np.float32)
    else:
        model = onnx_model([helper.make_node(op, ["x", "", "axis"], ["y"])], [VI("x", F, [2, 4, 1]), VI("axis", I64, [])],
                           [VI("y", F, ["d0", "d1", 2])], opset=20, ir_version=11)
        x = np.ones((2, 4, 1), np.float32)
    for mode, run in tensorvm_runs(model):
        with pytest.raises(ExecutionError, match="out of range"):
            run(x, np.array(axis, np.int64))
        assert run(x, np.array(1, np.int64))[0].shape[0] == 2, mode  # (a valid axis still runs)


def test_optionals_that_may_be_empty_at_run_time_are_options():
    """An optional graph input (a prelude Option: pass make_some(x) or make_none()) and an If choosing
    between Optional(x) and an empty Optional: OptionalHasElement is decided at run time, and
    OptionalGetElement of an empty one is an error."""
    opt_in = helper.make_tensor_type_proto(F, ["n"])
    empty = helper.make_node("Optional", [], ["none_opt"], type=opt_in)
    then_branch = helper.make_graph([helper.make_node("Optional", ["x"], ["o1"])], "then", [],
                                    [helper.make_value_info("o1", helper.make_optional_type_proto(opt_in))])
    else_branch = helper.make_graph([empty], "else", [],
                                    [helper.make_value_info("none_opt", helper.make_optional_type_proto(opt_in))])
    nodes = [helper.make_node("If", ["c"], ["chosen"], then_branch=then_branch, else_branch=else_branch),
             helper.make_node("OptionalHasElement", ["chosen"], ["has_chosen"]),
             helper.make_node("OptionalHasElement", ["maybe"], ["has_given"]),
             helper.make_node("OptionalGetElement", ["maybe"], ["given"])]
    model = onnx_model(nodes, [VI("c", TensorProto.BOOL, []), VI("x", F, ["n"]),
                               helper.make_value_info("maybe", helper.make_optional_type_proto(opt_in))],
                       [VI("has_chosen", TensorProto.BOOL, []), VI("has_given", TensorProto.BOOL, []),
                        VI("given", F, ["n"])], opset=18)
    mod, params = tv.frontend.from_onnx(model)
    x = np.arange(3, dtype=np.float32)
    for mode in ("bytecode", "native"):
        vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params, exec_mode=mode))
        for cond in (True, False):
            has_chosen, has_given, given = vm.invoke("main", np.array(cond), x, make_some(x + 1))
            assert bool(has_chosen.numpy()) is cond and bool(has_given.numpy()), mode
            np.testing.assert_array_equal(given.numpy(), x + 1)
        with pytest.raises(ExecutionError, match="no match"):  # (the element of an empty optional)
            vm.invoke("main", np.array(True), x, make_none())
