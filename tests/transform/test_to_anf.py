"""ToANormalForm and InlinePrimitives: binding structure, scoping of shared nodes, meaning kept."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from lowered_eval import assert_anf, assert_same, interpret, parse

import tensorvm as tv
from tensorvm.ir.expr import Call, Function, If, Let, Var
from tensorvm.ir.module import IRModule
from tensorvm.transform.fuse_ops import FuseOps
from tensorvm.transform.infer_type import InferType
from tensorvm.transform.inline_primitives import InlinePrimitives
from tensorvm.transform.to_anf import ToANormalForm, flatten_lets


def test_shared_node_is_bound_once():
    before = parse("""
def @main(%x: Tensor[(2), float32], %y: Tensor[(2), float32]) {
  %0 = add(%x, %y);
  multiply(%0, %0)
}""")
    after = ToANormalForm()(before)
    expected = parse("""
def @main(%x: Tensor[(2), float32], %y: Tensor[(2), float32]) {
  let %a = add(%x, %y);
  let %b = multiply(%a, %a);
  %b
}""")
    tv.assert_structural_equal(after["main"], expected["main"])


def test_node_used_in_one_branch_is_bound_inside_it():
    before = parse("""
def @main(%c: bool, %x: Tensor[(2), float32]) {
  %0 = exp(%x);
  %1 = negative(%x);
  if (%c) { add(%0, %1) } else { %1 }
}""")
    after = ToANormalForm()(before)
    bindings, tail = flatten_lets(after["main"].body)
    # negative is needed by both branches: bound before the if; exp only in the true branch.
    assert [v.op.name for _, v in bindings] == ["negative"]
    assert isinstance(tail, If)
    true_bindings, _ = flatten_lets(tail.true_branch)
    assert [v.op.name for _, v in true_bindings] == ["exp", "add"]
    assert_anf(after["main"].body)
    for c in (True, False):
        assert_same(interpret(after, np.array(c), np.ones(2, "float32")),
                    interpret(before, np.array(c), np.ones(2, "float32")))


def test_node_shared_with_a_closure_is_bound_outside_it():
    before = parse("""
def @main(%x: Tensor[(2), float32]) {
  %0 = exp(%x);
  let %f = fn (%y: Tensor[(2), float32]) { add(%y, %0) };
  (%f(%0), %f(%x))
}""")
    after = ToANormalForm()(before)
    bindings, _ = flatten_lets(after["main"].body)
    assert isinstance(bindings[0][1], Call) and bindings[0][1].op.name == "exp"
    fn = bindings[1][1]
    assert isinstance(fn, Function)
    fn_bindings, fn_tail = flatten_lets(fn.body)
    assert [v.op.name for _, v in fn_bindings] == ["add"] and isinstance(fn_tail, Var)
    assert_anf(after["main"].body)
    x = np.array([0.0, 1.0], "float32")
    assert_same(interpret(after, x), interpret(before, x))


def test_if_in_tail_position_stays_inline_and_nested_if_is_bound():
    before = parse("""
def @main(%c: bool, %x: Tensor[(2), float32]) {
  %0 = if (%c) { exp(%x) } else { %x };
  if (%c) { add(%0, %0) } else { negative(%0) }
}""")
    after = ToANormalForm()(before)
    bindings, tail = flatten_lets(after["main"].body)
    assert isinstance(bindings[-1][1], If) and isinstance(tail, If)
    assert_anf(after["main"].body)


def test_primitive_calls_keep_their_function_in_call_position():
    before = FuseOps()(InferType()(parse("""
def @main(%x: Tensor[(?), float32]) {
  %0 = exp(%x);
  add(%0, %0)
}""")))
    after = ToANormalForm()(before)
    bindings, tail = flatten_lets(after["main"].body)
    assert len(bindings) == 1 and isinstance(bindings[0][1].op, Function) and bindings[0][1].op.is_primitive
    assert_anf(after["main"].body)


def test_inline_primitives_moves_a_bound_primitive_into_its_calls():
    x = tv.ir.var("x", shape=(2,))
    p = tv.ir.var("p0", shape=(2,))
    prim = Function((p,), tv.op.exp(p), attrs={"Primitive": 1})
    f = Var("f")
    body = Let(f, prim, Call(f, (x,)))
    mod = IRModule.from_expr(Function((x,), body))
    after = InlinePrimitives()(mod)
    call = after["main"].body
    assert isinstance(call, Call) and call.op is prim
    xs = np.array([0.0, 1.0], "float32")
    assert_same(interpret(after, xs), np.exp(xs))


def test_long_chains_do_not_exhaust_the_stack():
    n = 3000
    text = "def @main(%x: Tensor[(2), float32]) {\n" + "".join(
        f"  %{i} = add({'%x' if i == 0 else f'%{i - 1}'}, 1f);\n" for i in range(n)) + f"  %{n - 1}\n}}"
    after = ToANormalForm()(parse(text))
    bindings, tail = flatten_lets(after["main"].body)
    assert len(bindings) == n and tail is bindings[-1][0]
    assert_same(interpret(after, np.zeros(2, "float32")), np.full(2, n, "float32"))


@st.composite
def scoped_program(draw):
    """Random graph-form programs with shared nodes used across if branches and closures."""
    names = ["%x"]
    lines = []
    for i in range(draw(st.integers(1, 7))):
        a, b = draw(st.sampled_from(names)), draw(st.sampled_from(names))
        kind = draw(st.sampled_from(["op", "op", "if", "closure"]))
        if kind == "op":
            expr = f"{draw(st.sampled_from(['add', 'multiply', 'subtract']))}({a}, {b})"
        elif kind == "if":
            expr = f"if (%c) {{ exp({a}) }} else {{ add({a}, {b}) }}"
        else:
            expr = f"(fn (%y: Tensor[(2), float32]) {{ add(%y, {a}) }})({b})"
        lines.append(f"%{i} = {expr};")
        names.append(f"%{i}")
    return ("def @main(%c: bool, %x: Tensor[(2), float32]) {\n  " + "\n  ".join(lines)
            + f"\n  ({names[-1]}, {draw(st.sampled_from(names))})\n}}")


@settings(max_examples=30, deadline=None)
@given(scoped_program(), st.booleans())
def test_random_programs_become_anf_with_the_same_meaning(text, cond):
    before = parse(text)
    after = ToANormalForm()(before)
    assert_anf(after["main"].body)
    x = np.array([0.25, -0.5], "float32")
    assert_same(interpret(after, np.array(cond), x), interpret(before, np.array(cond), x))
