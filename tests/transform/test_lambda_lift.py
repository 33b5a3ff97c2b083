"""LambdaLift: closure conversion, recursion through let-bound functions, primitive globals."""

from __future__ import annotations

import numpy as np
from lowered_eval import assert_same, interpret, parse

import tensorvm as tv
from tensorvm.ir.expr import Call, Function, GlobalVar, Let
from tensorvm.transform.fuse_ops import FuseOps
from tensorvm.transform.infer_type import InferType
from tensorvm.transform.lambda_lift import LambdaLift
from tensorvm.transform.to_anf import ToANormalForm, flatten_lets, post_order_iter


def lift(mod):
    mod = InferType()(mod)
    mod = ToANormalForm()(FuseOps()(mod))
    return LambdaLift()(InferType()(mod))


def nested_functions(mod) -> list:
    out = []
    for fn in mod.functions.values():
        body = fn.body.body if fn.attrs.get("Closure") else fn.body
        out += [n for n in post_order_iter(body) if isinstance(n, Function)]
    return out


def test_closure_with_captures_becomes_a_closure_global():
    before = parse("""
def @main(%x: Tensor[(2), float32], %k: float32) {
  let %f = fn (%y: Tensor[(2), float32]) { add(multiply(%y, %k), %x) };
  %f(%x)
}""")
    after = lift(before)
    assert nested_functions(after) == []
    closures = [(gv, fn) for gv, fn in after.functions.items() if fn.attrs.get("Closure")]
    assert len(closures) == 1
    gv, fn = closures[0]
    assert [p.name_hint for p in fn.params] == ["k", "x"] or [p.name_hint for p in fn.params] == ["x", "k"]
    assert isinstance(fn.body, Function) and [p.name_hint for p in fn.body.params] == ["y"]
    bindings, _ = flatten_lets(after["main"].body)
    alloc = bindings[0][1]
    assert isinstance(alloc, Call) and alloc.op == gv and len(alloc.args) == 2  # AllocClosure site
    x, k = np.array([1.0, 2.0], "float32"), np.array(3.0, "float32")
    assert_same(interpret(after, x, k), interpret(before, x, k))
    tv.transform.InferType()(after)  # the lifted module still type-checks


def test_function_without_captures_becomes_a_plain_global_called_directly():
    before = parse("""
def @main(%x: int32) {
  let %double = fn (%y: int32) { add(%y, %y) };
  %double(%double(%x))
}""")
    after = lift(before)
    assert nested_functions(after) == []
    lifted = after[GlobalVar("main_double")]
    assert not lifted.attrs.get("Closure")
    calls = [n for n in post_order_iter(after["main"].body) if isinstance(n, Call) and isinstance(n.op, GlobalVar)]
    assert [c.op.name for c in calls] == ["main_double", "main_double"]
    assert_same(interpret(after, np.array(3, "int32")), np.array(12, "int32"))


def test_recursive_closure_refers_to_itself_through_a_fresh_closure():
    before = parse("""
def @main(%n: int32, %step: int32) {
  let %loop = fn (%i: int32, %acc: int32) -> int32 {
    if (equal(%i, 0)) { %acc } else { %loop(subtract(%i, 1), add(%acc, %step)) }
  };
  %loop(%n, 0)
}""")
    after = lift(before)
    assert nested_functions(after) == []
    (gv, fn), = [(g, f) for g, f in after.functions.items() if f.attrs.get("Closure")]
    inner_bindings, _ = flatten_lets(fn.body.body)
    self_var, self_alloc = inner_bindings[0]
    assert isinstance(self_alloc, Call) and self_alloc.op == gv and self_var.name_hint == "loop"
    assert_same(interpret(after, np.array(5, "int32"), np.array(3, "int32")), np.array(15, "int32"))


def test_recursive_function_without_captures_calls_its_global():
    before = parse("""
def @main(%n: int32) {
  let %fact = fn (%i: int32) -> int32 {
    if (equal(%i, 0)) { 1 } else { multiply(%i, %fact(subtract(%i, 1))) }
  };
  %fact(%n)
}""")
    after = lift(before)
    lifted = after[GlobalVar("main_fact")]
    called = {n.op.name for n in post_order_iter(lifted.body) if isinstance(n, Call) and isinstance(n.op, GlobalVar)}
    assert "main_fact" in called
    assert_same(interpret(after, np.array(5, "int32")), np.array(120, "int32"))


def test_nested_closures_capture_transitively():
    before = parse("""
def @main(%a: int32, %b: int32) {
  let %outer = fn (%x: int32) {
    let %inner = fn (%y: int32) { add(add(%x, %y), %a) };
    %inner(%b)
  };
  %outer(1)
}""")
    after = lift(before)
    assert nested_functions(after) == []
    assert_same(interpret(after, np.array(10, "int32"), np.array(100, "int32")), np.array(111, "int32"))


def test_identical_primitives_share_one_global_and_names_are_unique():
    before = parse("""
def @main(%x: Tensor[(2), float32], %y: Tensor[(2), float32]) {
  %0 = add(%x, %y);
  (%0, add(%y, %0), sum(%0), sum(%0, axis=[0], keepdims=True))
}""")
    after = lift(before)
    prims = {gv.name: fn for gv, fn in after.functions.items() if fn.is_primitive}
    # add(x, y) and add(y, %0) are the same primitive; the two sums differ in their attributes.
    names = sorted(prims)
    assert "fused_add" in names
    sums = [n for n in names if "sum" in n]
    assert len(sums) == 2 and len(set(sums)) == 2
    add_calls = [n for n in post_order_iter(after["main"].body)
                 if isinstance(n, Call) and isinstance(n.op, GlobalVar) and n.op.name == "fused_add"]
    assert len(add_calls) == 2
    x, y = np.array([1.0, 2.0], "float32"), np.array([0.5, 0.25], "float32")
    assert_same(interpret(after, x, y), interpret(before, x, y))


def test_lifting_is_idempotent_on_lifted_modules():
    before = parse("""
def @main(%x: int32, %k: int32) {
  let %f = fn (%y: int32) { add(%y, %k) };
  %f(%x)
}""")
    once = lift(before)
    twice = LambdaLift()(InferType()(once))
    assert sorted(g.name for g in twice.functions) == sorted(g.name for g in once.functions)
    assert not any(isinstance(n, Let) and isinstance(n.value, Function)
                   for fn in twice.functions.values() for n in post_order_iter(fn.body))


def test_a_lifted_module_prints_back_and_compiles_for_the_vm():
    """A closure inside a polymorphic global lifts to a global declaring the type parameters its types name
    (its printed text had named A undeclared and did not parse), and the lifted module compiles for the VM
    (ToANormalForm keeps a closure global's form fn (captured) { fn (...) }, which the VM had then refused);
    results against the interpreter on the original."""
    for text in ("def @f[A](%x: A, %n: int32) -> A { let %g = fn (%k: int32) -> A { if (%k == 0) { %x } else "
                 "{ %g(%k - 1) } }; %g(%n) }\ndef @main(%x: float32, %i: int32) { (@f(%x, 3), @f(%i, 2)) }",
                 "def @f[A](%x: A) -> A { let %g = fn () -> A { %x }; %g() }\n"
                 "def @main(%x: float32, %i: int32) { (@f(%x), @f(%i)) }"):
        mod = InferType()(tv.parse(text))
        lifted = InferType()(LambdaLift()(mod))
        assert tv.structural_equal(tv.parse(str(lifted)), lifted)
        args = (np.float32(2), np.int32(3))
        expected = [v.numpy() for v in tv.create_executor("debug", mod).evaluate()(*args)]
        for target, mode in (("c", "native"), ("c", "bytecode"), ("python", "compiled")):
            got = tv.vm.VirtualMachine(tv.vm.compile(lifted, target=target, exec_mode=mode)).run(*args)
            assert [v.numpy() for v in got] == expected
