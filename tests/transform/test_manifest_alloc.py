"""ManifestAlloc: the static and dynamic allocation forms, reshape views, tuple outputs; each lowered
module is run by the strict lowered-code evaluator and compared with the interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from lowered_eval import LoweredEvaluator, assert_same, check_lowered, interpret, memory_ops, parse

from tensorvm.errors import ShapeError
from tensorvm.ir.expr import Constant, GlobalVar, Tuple, Var
from tensorvm.op.memory import STORAGE_TYPE_VAR
from tensorvm.transform.manifest_alloc import ManifestAlloc, shape_func_inputs
from tensorvm.transform.pass_infra import Sequential
from tensorvm.transform.to_anf import flatten_lets
from tensorvm.transform.vm_pipeline import vm_passes


def lower_until(mod, last: str = "ManifestAlloc"):
    passes = []
    for p in vm_passes():
        passes.append(p)
        if p.name == last:
            break
    return Sequential(passes)(mod)


def names(block) -> list[str]:
    return [call.op.name for _, call in memory_ops(block)]


def run_both(before, lowered, *args):
    expected = interpret(before, *args)
    actual = LoweredEvaluator(lowered).run("main", *args)
    assert_same(actual, expected)
    return actual


SEED = """
def @main(%x: Tensor[(?, ?), float32], %y: Tensor[(1, 2), float32]) -> Tensor[(?, 2), float32] {
  add(%x, %y)
}"""


def test_seed_dynamic_add_gets_shape_function_then_allocation():
    before = parse(SEED)
    lowered = lower_until(before)
    body = lowered["main"].body
    assert names(body) == ["vm.shape_of", "memory.alloc_storage", "memory.alloc_tensor", "vm.shape_func",
                           "memory.alloc_storage", "memory.alloc_tensor", "vm.invoke_tvm_op"]
    ops = dict((call.op.name, (var, call)) for var, call in memory_ops(body))
    (in_shape_var, shape_of), (_, shape_func) = ops["vm.shape_of"], ops["vm.shape_func"]
    assert shape_of.args[0] is lowered["main"].params[0]
    ins, outs = shape_func.args[1], shape_func.args[2]
    assert shape_func.args[0] == GlobalVar("fused_add")
    assert ins.fields[0] is in_shape_var
    # %y's shape is static: a constant, no shape_of.
    assert isinstance(ins.fields[1], Constant) and ins.fields[1].data.tolist() == [1, 2]
    assert list(shape_func.attrs["is_input"]) == [0, 0]
    dyn_storage = [c for _, c in memory_ops(body) if c.op.name == "memory.alloc_storage"][1]
    assert dyn_storage.attrs["size_from_shape"] and dyn_storage.args[0] is outs.fields[0]
    tensor_var, tensor = [(v, c) for v, c in memory_ops(body) if c.op.name == "memory.alloc_tensor"][1]
    assert tensor.args[2] is outs.fields[0]  # AllocTensorReg on the computed shape
    assert flatten_lets(body)[1] is tensor_var
    assert STORAGE_TYPE_VAR in lowered.type_definitions
    check_lowered(lowered)
    rng = np.random.default_rng(0)
    run_both(before, lowered, rng.standard_normal((3, 2)).astype("float32"), np.ones((1, 2), "float32"))
    run_both(before, lowered, rng.standard_normal((4, 1)).astype("float32"), np.ones((1, 2), "float32"))


def test_seed_broadcast_mismatch_is_a_shape_error_naming_the_op():
    lowered = lower_until(parse(SEED))
    with pytest.raises(ShapeError, match="add"):
        LoweredEvaluator(lowered).run("main", np.ones((3, 3), "float32"), np.ones((1, 2), "float32"))


def test_static_output_gets_constant_sized_storage():
    before = parse("""
def @main(%x: Tensor[(3, 5), float32]) {
  exp(%x)
}""")
    lowered = lower_until(before)
    body = lowered["main"].body
    assert names(body) == ["memory.alloc_storage", "memory.alloc_tensor", "vm.invoke_tvm_op"]
    (_, storage), (_, tensor), (_, invoke) = memory_ops(body)
    assert int(storage.args[0].data) == 3 * 5 * 4 and storage.attrs["dtype_hint"] == "float32"
    assert tensor.args[2].data.tolist() == [3, 5] and int(tensor.args[1].data) == 0
    assert isinstance(invoke.args[1], Tuple) and isinstance(invoke.args[2], Tuple)
    run_both(before, lowered, np.ones((3, 5), "float32"))


def test_data_dependent_shape_function_reads_data():
    before = parse("""
def @main(%x: Tensor[(?), float32]) {
  argwhere(greater(%x, 0f))
}""")
    lowered = lower_until(before)
    funcs = [c for _, c in memory_ops(lowered["main"].body) if c.op.name == "vm.shape_func"]
    flags = {c.args[0].name: list(c.attrs["is_input"]) for c in funcs}
    assert flags["fused_argwhere"] == [1]
    assert flags["fused_greater"] == [0]
    assert shape_func_inputs(lowered[GlobalVar("fused_argwhere")]) == (1,)
    result = run_both(before, lowered, np.array([1, -1, 2, 0, 3], "float32"))
    assert result.tolist() == [[0], [2], [4]]


def test_arange_from_data_is_data_dependent_per_input():
    before = parse("""
def @main(%n: float32) {
  arange(0f, %n, 1f)
}""")
    lowered = lower_until(before)
    (call,) = [c for _, c in memory_ops(lowered["main"].body) if c.op.name == "vm.shape_func"]
    assert list(call.attrs["is_input"]) == [1]  # the constant bounds stay inside the primitive
    run_both(before, lowered, np.array(4.5, "float32"))


def test_tuple_output_gets_one_allocation_per_field():
    before = parse("""
def @main(%x: Tensor[(4, 6), float32]) {
  %0 = split(%x, indices_or_sections=3, axis=1);
  (%0.0, %0.2)
}""")
    lowered = lower_until(before)
    body = lowered["main"].body
    seq = names(body)
    assert seq.count("memory.alloc_tensor") == 3 and seq.count("vm.invoke_tvm_op") == 1
    (_, invoke), = [(v, c) for v, c in memory_ops(body) if c.op.name == "vm.invoke_tvm_op"]
    assert len(invoke.args[2].fields) == 3
    run_both(before, lowered, np.arange(24, dtype="float32").reshape(4, 6))


def test_tuple_input_is_passed_whole():
    before = parse("""
def @main(%t: (Tensor[(?, 2), float32], Tensor[(?, 2), float32])) {
  concatenate(%t, axis=0)
}""")
    lowered = lower_until(before)
    (call,) = [c for _, c in memory_ops(lowered["main"].body) if c.op.name == "vm.shape_func"]
    assert list(call.attrs["is_input"]) == [0]
    shapes = call.args[1].fields[0]
    assert isinstance(shapes, Var)  # bound to the tuple of the fields' shapes
    a, b = np.ones((1, 2), "float32"), np.zeros((3, 2), "float32")
    run_both(before, lowered, (a, b))


def test_reshape_only_groups_become_views():
    before = parse("""
def @main(%x: Tensor[(2, 6), float32], %y: Tensor[(?, 6), float32]) {
  %0 = exp(%x);
  %1 = reshape(%0, newshape=[3, 4]);
  %2 = exp(%y);
  %3 = reshape(%2, newshape=[-1, 3, 2]);
  (%0, %1, %2, %3)
}""")
    lowered = lower_until(before)
    views = [c for _, c in memory_ops(lowered["main"].body) if c.op.name == "vm.reshape_tensor"]
    assert len(views) == 2
    static_view, dynamic_view = views
    assert isinstance(static_view.args[1], Constant) and static_view.args[1].data.tolist() == [3, 4]
    assert isinstance(dynamic_view.args[1], Var)  # computed by the reshape's shape function
    kernels = {c.args[0].name for _, c in memory_ops(lowered["main"].body) if c.op.name == "vm.invoke_tvm_op"}
    assert not any("reshape" in k for k in kernels)
    run_both(before, lowered, np.ones((2, 6), "float32"), np.arange(12, dtype="float32").reshape(2, 6))


def test_reverse_reshape_groups_become_views_too():
    """reverse_reshape only reinterprets the shape as reshape does (TVM's reshape-only set holds it): a view, no
    kernel, static and with a run-time dim."""
    before = parse("""
def @main(%x: Tensor[(2, 8, 4), float32], %y: Tensor[(?, 8, 4), float32]) {
  %0 = exp(%x);
  %1 = reverse_reshape(%0, newshape=[-1, 4, 0]);
  %2 = exp(%y);
  %3 = contrib_reverse_reshape(%2, newshape=[-1, 4, 0]);
  (%0, %1, %2, %3)
}""")
    lowered = lower_until(before)
    views = [c for _, c in memory_ops(lowered["main"].body) if c.op.name == "vm.reshape_tensor"]
    assert len(views) == 2 and views[0].args[1].data.tolist() == [4, 4, 4]
    kernels = {c.args[0].name for _, c in memory_ops(lowered["main"].body) if c.op.name == "vm.invoke_tvm_op"}
    assert not any("reshape" in k for k in kernels)
    run_both(before, lowered, np.ones((2, 8, 4), "float32"), np.arange(96, dtype="float32").reshape(3, 8, 4))


def test_a_shape_of_group_becomes_the_shape_of_instruction():
    before = parse("""
def @main(%x: Tensor[(?, 3), float32]) {
  %0 = shape_of(%x, dtype="int64");
  %1 = shape_of(%x, dtype="int32");
  (%0, add(%0, 1i64), %1)
}""")
    lowered = lower_until(before)
    ops = memory_ops(lowered["main"].body)
    kernels = {c.args[0].name for _, c in ops if c.op.name == "vm.invoke_tvm_op"}
    assert sum(c.op.name == "vm.shape_of" and c.args[0].name_hint == "x" for _, c in ops) >= 1
    assert sum("shape_of" in k for k in kernels) == 1  # the int32 one stays a kernel (ShapeOf gives int64)
    run_both(before, lowered, np.ones((5, 3), "float32"))


def test_control_flow_and_calls_keep_their_structure():
    before = parse("""
def @f(%a: Tensor[(?), float32]) { negative(%a) }
def @main(%c: bool, %x: Tensor[(?), float32]) {
  if (%c) { @f(exp(%x)) } else { %x }
}""")
    lowered = lower_until(before)
    check_lowered(lowered)
    for c in (True, False):
        run_both(before, lowered, np.array(c), np.array([0.0, 1.0], "float32"))


def test_requires_lifted_primitives():
    before = parse("def @main(%x: Tensor[(2), float32]) { exp(%x) }")
    from tensorvm.errors import UnsupportedError
    from tensorvm.transform.fuse_ops import FuseOps
    from tensorvm.transform.infer_type import InferType
    from tensorvm.transform.to_anf import ToANormalForm

    unlifted = InferType()(ToANormalForm()(FuseOps()(InferType()(before))))
    with pytest.raises(UnsupportedError, match="LambdaLift"):
        ManifestAlloc()(unlifted)


def test_reshape_by_a_runtime_shape_is_a_view_sized_by_the_data_dependent_shape_function():
    before = parse("""
def @main(%x: Tensor[(?), float32], %s: Tensor[(2), int64]) {
  %0 = exp(%x);
  (%0, dyn.reshape(%0, %s))
}""")
    lowered = lower_until(before)
    ops = memory_ops(lowered["main"].body)
    (shape_func,) = [c for _, c in ops if c.op.name == "vm.shape_func" and c.args[0].name.endswith("reshape")]
    assert list(shape_func.attrs["is_input"]) == [0, 1]
    (view,) = [c for _, c in ops if c.op.name == "vm.reshape_tensor"]
    assert view.args[1] is shape_func.args[2].fields[0]
    result = run_both(before, lowered, np.arange(6, dtype="float32"), np.array([3, 2], "int64"))
    assert np.shares_memory(result[0], result[1])
