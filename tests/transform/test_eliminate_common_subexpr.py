"""EliminateCommonSubexpr: repeated op calls computed once, never across branch scopes; every rewritten
module computes what the original does (the interpreter is the oracle)."""

from __future__ import annotations

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.ir.analysis import post_order
from tensorvm.ir.expr import Call, Op
from tensorvm.transform.eliminate_common_subexpr import EliminateCommonSubexpr
from tensorvm.transform.infer_type import InferType


def _calls(mod, name: str) -> int:
    return sum(1 for fn in mod.functions.values() for n in post_order(fn.body)
               if isinstance(n, Call) and isinstance(n.op, Op) and n.op.name == name)


def _run(mod, *args):
    return tv.create_executor("debug", mod).evaluate()(*args)


def _check(text: str, *args, **expected_counts):
    before = InferType()(tv.parse(text))
    after = EliminateCommonSubexpr()(before)
    for name, count in expected_counts.items():
        assert _calls(after, name) == count, name
    want, got = _run(before, *args), _run(after, *args)
    for w, g in zip(want if isinstance(want, (list, tuple)) else [want],
                    got if isinstance(got, (list, tuple)) else [got]):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    return after


X = np.arange(6, dtype="float32").reshape(2, 3)


def test_repeated_calls_in_graph_form_and_in_let_chains():
    _check("""
def @main(%x: Tensor[(2, 3), float32]) {
  %0 = add(%x, 1f);
  %1 = add(%x, 1f);
  let %a = multiply(%0, %1);
  let %b = multiply(%0, %1);
  (subtract(%a, %b), exp(%a), exp(%b))
}""", X, add=1, multiply=1, exp=1)


def test_constants_equal_by_value_and_projections():
    after = _check("""
def @main(%x: Tensor[(2, 3), float32]) {
  %0 = reshape(%x, newshape=[3, 2]);
  %1 = reshape(%x, newshape=[3, 2]);
  %2 = split(%x, indices_or_sections=3, axis=1);
  (add(%0, %1), %2.0, %2.0, add(%x, 2f), add(%x, 2f))
}""", X, reshape=1, add=2, split=1)
    assert after is not None


def test_different_attributes_or_arguments_stay_apart():
    _check("""
def @main(%x: Tensor[(2, 3), float32]) {
  (sum(%x, axis=[0]), sum(%x, axis=[1]), add(%x, 1f), add(%x, 2f))
}""", X, sum=2, add=2)


def test_a_branch_never_reuses_or_exports_a_value_of_another_scope():
    text = """
def @main(%x: Tensor[(2, 3), float32], %c: bool) {
  %0 = exp(%x);
  %1 = if (%c) {
    (exp(%x), log(%x))
  } else {
    (negative(%x), log(%x))
  };
  (%0, %1.0, %1.1, log(%x))
}"""
    after = _check(text, X + 1, np.array(True), exp=1)
    # the log of each branch and the one after the if stay three calls: none may move out of its scope
    assert _calls(after, "log") == 3
    _check(text, X + 1, np.array(False))


def test_functions_see_the_enclosing_scope():
    _check("""
def @main(%x: Tensor[(2, 3), float32]) {
  let %e = exp(%x);
  let %f = fn (%y: Tensor[(2, 3), float32]) { add(exp(%x), %y) };
  (%f(%e), %e)
}""", X, exp=1)


@pytest.mark.parametrize("target", ["python", "c"])
def test_through_the_vm(target):
    mod = tv.parse("""
def @main(%x: Tensor[(?, 3), float32]) {
  %0 = reshape(%x, newshape=[-1, 3, 1]);
  %1 = reshape(%x, newshape=[-1, 3, 1]);
  add(%0, %1)
}""")
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target=target))
    for rows in (1, 4):
        x = np.arange(3 * rows, dtype="float32").reshape(rows, 3)
        np.testing.assert_array_equal(vm.invoke("main", x).numpy(), (2 * x).reshape(rows, 3, 1))
