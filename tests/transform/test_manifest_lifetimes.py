"""ManifestLifetimes: kills after last uses of dynamic values, inside branches when that is where the
last use is, never after a tail call; the strict evaluator fails on any use after a kill."""

from __future__ import annotations

import numpy as np
from lowered_eval import LoweredEvaluator, assert_same, check_lowered, interpret, parse

from tensorvm.ir.expr import Call, GlobalVar, If, Op
from tensorvm.transform.to_anf import flatten_lets
from tensorvm.transform.vm_pipeline import lower_for_vm


def killed_vars(block) -> list:
    bindings, _ = flatten_lets(block)
    return [v.args[0] for _, v in bindings if isinstance(v, Call) and isinstance(v.op, Op) and v.op.name == "memory.kill"]


def killed(block) -> list[str]:
    return [v.name_hint for v in killed_vars(block)]


def bound_by(block, op_name: str) -> list:
    bindings, _ = flatten_lets(block)
    return [var for var, v in bindings if isinstance(v, Call) and isinstance(v.op, Op) and v.op.name == op_name]


def kill_positions_are_after_last_use(block) -> None:
    """Independent check: nothing after a kill mentions the killed variable."""
    bindings, tail = flatten_lets(block)
    for k, (_, value) in enumerate(bindings):
        if isinstance(value, Call) and isinstance(value.op, Op) and value.op.name == "memory.kill":
            var = value.args[0]
            rest = bindings[k + 1:]
            assert all(var not in _mentions(v) for _, v in rest) and var not in _mentions(tail), \
                f"%{var.name_hint} is used after its kill"


def _mentions(expr) -> set:
    from tensorvm.transform.to_anf import post_order_iter

    return set(post_order_iter(expr))


def test_dynamic_intermediates_are_killed_after_their_last_use():
    before = parse("""
def @main(%x: Tensor[(?, 4), float32]) {
  %0 = exp(%x);
  %1 = negative(%0);
  %2 = add(%1, %0);
  sum(%2, axis=[1])
}""")
    lowered = lower_for_vm(before, opt_level=0)
    check_lowered(lowered)
    body = lowered["main"].body
    kill_positions_are_after_last_use(body)
    kills = killed_vars(body)
    tensors, storages = bound_by(body, "memory.alloc_tensor"), bound_by(body, "memory.alloc_storage")
    result = flatten_lets(body)[1]
    # The parameter, every dynamic intermediate and its storage; never the result or its storage.
    assert lowered["main"].params[0] in kills
    dynamic = [t for t in tensors if not t.checked_type.is_static]
    assert len(dynamic) == 4 and result in dynamic
    assert all(t in kills for t in dynamic if t is not result) and result not in kills
    dynamic_storages = [s for s in storages if any(s is k for k in kills)]
    assert len(dynamic_storages) == 3
    x = np.arange(8, dtype="float32").reshape(2, 4) / 8
    assert_same(LoweredEvaluator(lowered).run("main", x), interpret(before, x))


def test_static_values_are_not_killed():
    before = parse("""
def @main(%x: Tensor[(2, 4), float32]) {
  negative(exp(%x))
}""")
    lowered = lower_for_vm(before, opt_level=0)
    assert killed(lowered["main"].body) == []


def test_kill_moves_into_branches_of_the_final_if():
    before = parse("""
def @main(%x: Tensor[(?), float32]) {
  %0 = exp(%x);
  %1 = sum(%0);
  if (greater(%1, 3f)) { negative(%0) } else { %x }
}""")
    lowered = lower_for_vm(before, opt_level=0)
    check_lowered(lowered)
    bindings, tail = flatten_lets(lowered["main"].body)
    assert isinstance(tail, If)
    exp_out = [v for v in bound_by(lowered["main"].body, "memory.alloc_tensor") if not v.checked_type.is_static][0]
    # exp's result is dead at the start of the else branch, and after negative in the then branch.
    else_bindings, _ = flatten_lets(tail.false_branch)
    assert exp_out in killed_vars(tail.false_branch)
    assert any(v.op.name == "memory.kill" and v.args[0] is exp_out for _, v in else_bindings[:3])
    assert exp_out in killed_vars(tail.true_branch)
    assert exp_out not in killed_vars(lowered["main"].body)
    kill_positions_are_after_last_use(tail.true_branch)
    kill_positions_are_after_last_use(tail.false_branch)
    for x in (np.array([0.5, 1.5], "float32"), np.array([-5.0], "float32")):
        assert_same(LoweredEvaluator(lowered).run("main", x), interpret(before, x))


def test_tail_calls_stay_tail_calls():
    before = parse("""
def @grow(%acc: Tensor[(?, 2), float32], %i: int32) -> Tensor[(?, 2), float32] {
  if (equal(%i, 0)) {
    %acc
  } else {
    @grow(concatenate((%acc, %acc), axis=0), subtract(%i, 1))
  }
}
def @main(%x: Tensor[(1, 2), float32], %n: int32) {
  @grow(%x, %n)
}""")
    lowered = lower_for_vm(before)
    check_lowered(lowered)
    _, tail = flatten_lets(lowered[GlobalVar("grow")].body)
    else_bindings, else_tail = flatten_lets(tail.false_branch)
    last_var, last_value = else_bindings[-1]
    assert else_tail is last_var and isinstance(last_value, Call) and last_value.op == GlobalVar("grow")
    assert "acc" in killed(tail.false_branch)  # killed once its last kernel use is done, before the call
    x = np.array([[1.0, 2.0]], "float32")
    result = LoweredEvaluator(lowered).run("main", x, np.array(3, "int32"))
    assert_same(result, np.tile(x, (8, 1)))


def test_storage_of_an_escaping_tensor_is_not_killed():
    before = parse("""
def @main(%x: Tensor[(?), float32]) {
  %0 = exp(%x);
  (%0, negative(%0))
}""")
    lowered = lower_for_vm(before, opt_level=0)
    names = killed(lowered["main"].body)
    assert not any(n.startswith("storage") for n in names)
    x = np.array([1.0, 2.0], "float32")
    assert_same(LoweredEvaluator(lowered).run("main", x), interpret(before, x))
