"""FoldConstant, SimplifyExpr, DeadCodeElimination, EtaExpand and BindParams."""

from __future__ import annotations

import numpy as np
import pytest
from lowered_eval import assert_same, interpret, parse

import tensorvm as tv
from tensorvm.errors import TypeInferenceError
from tensorvm.ir.expr import Call, Constant, Constructor, Function, Let, Op
from tensorvm.runtime.object import ADT
from tensorvm.transform.bind_params import BindParams
from tensorvm.transform.dead_code import DeadCodeElimination
from tensorvm.transform.eta_expand import EtaExpand
from tensorvm.transform.fold_constant import FoldConstant
from tensorvm.transform.infer_type import InferType
from tensorvm.transform.simplify_expr import SimplifyExpr
from tensorvm.transform.to_anf import post_order_iter


def ops_in(mod, name="main") -> list[str]:
    return [n.op.name for n in post_order_iter(mod[name].body) if isinstance(n, Call) and isinstance(n.op, Op)]


# --- FoldConstant ------------------------------------------------------------------------------
def test_constant_subexpressions_fold_with_the_kernels():
    before = parse("""
def @main(%x: Tensor[(2), float32]) {
  %0 = add(1f, 2f);
  %1 = multiply(meta[relay.Constant][0], %0);
  add(%x, %1)
}""".replace("meta[relay.Constant][0]", "(1f, 2f).1"))
    after = FoldConstant()(InferType()(before))
    assert ops_in(after) == ["add"]
    consts = [n for n in post_order_iter(after["main"].body) if isinstance(n, Constant)]
    assert len(consts) == 1 and consts[0].data.dtype == np.float32 and float(consts[0].data) == 6.0
    x = np.array([1.0, 2.0], "float32")
    assert_same(interpret(after, x), x + 6)


def test_folding_keeps_dtypes_tuples_and_lets():
    before = parse("""
def @main(%x: Tensor[(3), int32]) {
  let %c = arange(0f, 3f, 1f);
  let %s = split(cast(%c, dtype="int32"), indices_or_sections=3);
  add(%x, %s.1)
}""")
    after = FoldConstant()(InferType()(before))
    assert ops_in(after) == ["add"]
    assert not any(isinstance(n, Let) for n in post_order_iter(after["main"].body))
    x = np.array([10, 20, 30], "int32")
    assert_same(interpret(after, x), x + 1)


def test_large_results_and_failing_kernels_are_left_for_run_time():
    before = parse("""
def @main(%x: int32) {
  %0 = zeros(shape=[1024, 1024], dtype="float32");
  %1 = divide(1, 0);
  (sum(%0), add(%x, %1))
}""")
    after = FoldConstant()(InferType()(before))
    assert "zeros" in ops_in(after) and "divide" in ops_in(after)


def test_shape_of_a_static_value_and_constant_conditions_fold():
    before = parse("""
def @main(%x: Tensor[(2, 3), float32], %y: Tensor[(?, 3), float32]) {
  %0 = shape_of(%x);
  %1 = shape_of(%y);
  if (equal(take(%0, 0), 2)) { (%0, %1) } else { (%1, %0) }
}""")
    after = FoldConstant()(InferType()(before))
    assert ops_in(after).count("shape_of") == 1  # only the dynamic one
    assert not any(n.__class__.__name__ == "If" for n in post_order_iter(after["main"].body))
    y = np.ones((4, 3), "float32")
    assert_same(interpret(after, np.ones((2, 3), "float32"), y), interpret(before, np.ones((2, 3), "float32"), y))


# --- SimplifyExpr -------------------------------------------------------------------------------
def test_no_op_shape_changes_and_casts_disappear():
    before = parse("""
def @main(%x: Tensor[(2, 3), float32]) {
  %0 = reshape(%x, newshape=[2, 3]);
  %1 = cast(%0, dtype="float32");
  %2 = transpose(%1, axes=[0, 1]);
  %3 = reshape(%2, newshape=[3, 2]);
  %4 = reshape(%3, newshape=[6]);
  exp(%4)
}""")
    after = SimplifyExpr()(InferType()(before))
    assert ops_in(after) == ["reshape", "exp"]
    x = np.arange(6, dtype="float32").reshape(2, 3)
    assert_same(interpret(after, x), np.exp(x.reshape(6)))


def test_dynamic_reshape_is_kept():
    before = parse("""
def @main(%x: Tensor[(?, 3), float32]) {
  reshape(%x, newshape=[-1, 3])
}""")
    after = SimplifyExpr()(InferType()(before))
    assert ops_in(after) == ["reshape"]


# --- DeadCodeElimination ------------------------------------------------------------------------
def test_dead_pure_bindings_go_and_effects_stay():
    before = parse("""
def @f(%a: int32) -> int32 { %a }
def @main(%x: int32) {
  let %dead = add(%x, 1);
  let %dead2 = multiply(%dead, 2);
  let %r = ref(%x);
  let %w = ref_write(%r, 5);
  let %call = @f(%x);
  ref_read(%r)
}""")
    after = DeadCodeElimination()(before)
    bound = [n.var.name_hint for n in post_order_iter(after["main"].body) if isinstance(n, Let)]
    assert sorted(bound) == ["call", "r", "w"]
    assert_same(interpret(after, np.array(1, "int32")), np.array(5, "int32"))


# --- EtaExpand ----------------------------------------------------------------------------------
def test_constructors_and_ops_used_as_values_become_functions():
    before = parse("""
def @main(%l: List[Tensor[(2), float32]]) {
  %0 = @map(Some, %l);
  %1 = @map(negative, %l);
  (%0, %1)
}""")
    after = InferType()(EtaExpand()(before))
    nodes = post_order_iter(after["main"].body)
    callees = {id(n.op) for n in nodes if isinstance(n, Call)}
    for node in nodes:
        if isinstance(node, (Constructor, Op)) and id(node) not in callees:
            assert isinstance(node, Constructor) and not node.inputs, f"{node} is used as a value"
    lambdas = [n for n in post_order_iter(after["main"].body) if isinstance(n, Function)]
    assert len(lambdas) == 2
    cons, nil = after.constructor("Cons"), after.constructor("Nil")
    a, b = np.array([1.0, 2.0], "float32"), np.array([3.0, 4.0], "float32")
    lst = cons(a, cons(b, ADT(nil.tag, (), constructor="Nil")))  # Nil() with no args builds an IR call
    assert_same(interpret(after, lst), interpret(before, lst))


# --- BindParams ---------------------------------------------------------------------------------
def test_bound_parameters_become_constants_and_fold():
    before = parse("""
def @main(%x: Tensor[(2, 3), float32], %w: Tensor[(4, 3), float32], %b: Tensor[(4), float32]) {
  %0 = multiply(%b, 2f);
  add(nn.dense(%x, %w), %0)
}""")
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((4, 3)).astype("float32"), rng.standard_normal(4).astype("float32")
    bound = BindParams({"w": w, "b": tv.nd.array(b)})(before)
    assert [p.name_hint for p in bound["main"].params] == ["x"]
    folded = FoldConstant()(InferType()(bound))
    assert ops_in(folded) == ["nn.dense", "add"]
    x = rng.standard_normal((2, 3)).astype("float32")
    assert_same(interpret(folded, x), interpret(before, x, w, b), rtol=1e-5)


def test_binding_errors_name_the_parameter():
    before = parse("def @main(%x: Tensor[(2, 3), float32]) { %x }")
    with pytest.raises(TypeInferenceError, match="%x"):
        BindParams({"x": np.ones((3, 3), "float32")})(before)
    with pytest.raises(TypeInferenceError, match="%x"):
        BindParams({"x": np.ones((2, 3), "int32")})(before)
    with pytest.raises(TypeInferenceError, match="nope"):
        BindParams({"nope": np.ones(1)})(before)


def test_passes_return_new_modules():
    before = InferType()(parse("""
def @main(%x: Tensor[(2), float32]) {
  let %d = add(1f, 1f);
  exp(cast(%x, dtype="float32"))
}"""))
    text = str(before)
    for p in (FoldConstant(), SimplifyExpr(), DeadCodeElimination(), EtaExpand()):
        p(before)
    assert str(before) == text




def test_dead_code_keeps_a_closure_called_through_a_call_result():
    # ``%curried(1f)(2f)``: the callee of the outer call is itself a call that uses %curried.
    mod = tv.parse("""
def @main() -> float32 {
  let %curried = fn (%y: float32) { fn (%x: float32) { add(%x, %y) } };
  %curried(1f)(2f)
}""")
    out = tv.transform.DeadCodeElimination()(tv.transform.InferType()(mod))
    assert "let %curried" in str(out)
    assert float(tv.create_executor("debug", out).evaluate()().numpy()) == 3.0
