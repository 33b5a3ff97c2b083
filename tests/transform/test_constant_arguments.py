"""ConstantArguments: calls passing constants for loop-invariant parameters call specialized copies."""

from __future__ import annotations

import numpy as np
import pytest
from lowered_eval import assert_same, interpret, parse

import tensorvm as tv
from tensorvm.ir.expr import Call, Constant, GlobalVar
from tensorvm.ir.structural import structural_equal
from tensorvm.op.nn import packed_lanes
from tensorvm.transform.bind_params import BindParams
from tensorvm.transform.constant_arguments import ConstantArguments
from tensorvm.transform.infer_type import InferType
from tensorvm.transform.to_anf import post_order_iter

# a recurrent loop: main binds %w and starts @step, which recurses with %w unchanged
_LOOP = """
def @main(%x: Tensor[(?, 4), float32], %w: Tensor[(4, 4), float32], %b: Tensor[(4), float32]) {
  @step(0, take(shape_of(%x, dtype="int32"), 0), %x, zeros(shape=[1, 4], dtype="float32"), %w, %b)
}

def @step(%t: int32, %n: int32, %x: Tensor[(?, 4), float32], %h: Tensor[(1, 4), float32],
          %w: Tensor[(4, 4), float32], %b: Tensor[(4), float32]) -> Tensor[(1, 4), float32] {
  if (less(%t, %n)) {
    %next = tanh(add(add(nn.dense(%h, %w), %b), take(%x, %t, axis=0)));
    @step(add(%t, 1), %n, %x, %next, %w, %b)
  } else {
    %h
  }
}
"""


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((4, 4)).astype("float32"), "b": rng.standard_normal(4).astype("float32")}


def _oracle(x, w, b):
    h = np.zeros((1, 4))
    for row in x.astype(np.float64):
        h = np.tanh(h @ w.T + b + row)
    return h


def _constants_in(fn) -> list:
    return [n for n in post_order_iter(fn.body) if isinstance(n, Constant) and n.data.ndim > 0]


def _calls_of(mod, callee: str) -> list:
    return [n for fn in mod.functions.values() for n in post_order_iter(fn.body)
            if isinstance(n, Call) and isinstance(n.op, GlobalVar) and n.op.name == callee]


def test_loop_weights_become_constants_of_a_copy_of_the_loop():
    weights = _weights()
    before = InferType()(BindParams(weights)(parse(_LOOP)))
    after = InferType()(ConstantArguments()(before))
    step = after["step_const0"]
    assert [p.name_hint for p in step.params] == ["t", "n", "x", "h"]  # %w and %b are gone ...
    assert sorted(c.data.shape for c in _constants_in(step)) == [(4,), (4, 4)]  # ... replaced by the constants
    assert all(len(c.args) == 4 for c in _calls_of(after, "step_const0"))  # main's call and the recursion
    assert _calls_of(after, "step") == _calls_of(before, "step")[1:]  # only the original's own recursion
    assert structural_equal(after["step"], before["step"])  # unchanged for callers from outside
    for length in (0, 1, 5):
        x = np.random.default_rng(length).standard_normal((length, 4)).astype("float32")
        want = _oracle(x, weights["w"], weights["b"])
        assert_same(interpret(after, x), interpret(before, x))
        np.testing.assert_allclose(interpret(after, x), want, rtol=1e-5, atol=1e-6)


def test_the_constant_flows_through_a_chain_of_callees():
    mod = parse("""
def @main(%x: Tensor[(3), float32], %c: Tensor[(3), float32]) { @outer(%x, %c) }
def @outer(%x: Tensor[(3), float32], %c: Tensor[(3), float32]) { @inner(multiply(%x, 2f), %c) }
def @inner(%y: Tensor[(3), float32], %c: Tensor[(3), float32]) { add(%y, %c) }
""")
    c = np.float32([1, 2, 3])
    before = InferType()(BindParams({"c": c})(mod))
    after = InferType()(ConstantArguments()(before))
    assert [len(after[name].params) for name in ("main", "outer_const0", "inner_const0")] == [1, 1, 1]
    assert [len(after[name].params) for name in ("outer", "inner")] == [2, 2]
    x = np.float32([4, 5, 6])
    assert_same(interpret(after, x), x * 2 + c)


def test_calls_with_different_constants_get_different_copies_and_equal_ones_share():
    before = InferType()(parse("""
def @main(%x: Tensor[(2), float32]) {
  (@f(%x, meta_a), @f(%x, meta_b), @f(%x, meta_a2))
}
def @f(%x: Tensor[(2), float32], %c: Tensor[(2), float32]) { add(%x, %c) }""".replace(
        "meta_a2", "ones(shape=[2], dtype=\"float32\")").replace("meta_a", "ones(shape=[2], dtype=\"float32\")")
        .replace("meta_b", "zeros(shape=[2], dtype=\"float32\")")))
    from tensorvm.transform.fold_constant import FoldConstant

    before = FoldConstant()(before)
    after = InferType()(ConstantArguments()(before))
    assert sorted(gv.name for gv in after.functions) == ["f", "f_const0", "f_const1", "main"]
    x = np.float32([3, 4])
    got = interpret(after, x)
    assert_same(got, interpret(before, x))


@pytest.mark.parametrize("case", ["changed-in-the-loop", "polymorphic", "main"])
def test_parameters_that_are_not_invariant_stay(case):
    """A recursive call passing another value, a polymorphic function, and main's own parameters (no
    call passes them) are left alone."""
    texts = {
        "changed-in-the-loop": """
def @main(%x: Tensor[(2), float32]) { @f(3, %x, ones(shape=[2], dtype="float32")) }
def @f(%n: int32, %x: Tensor[(2), float32], %c: Tensor[(2), float32]) -> Tensor[(2), float32] {
  if (less(%n, 1)) { add(%x, %c) } else { @f(subtract(%n, 1), %x, multiply(%c, 2f)) }
}""",
        "polymorphic": """
def @main(%x: Tensor[(2), float32]) { @f(%x, ones(shape=[2], dtype="float32")) }
def @f[A](%x: A, %c: Tensor[(2), float32]) -> A { %x }""",
        "main": """
def @main(%x: Tensor[(2), float32], %c: Tensor[(2), float32]) { add(%x, %c) }""",
    }
    from tensorvm.transform.fold_constant import FoldConstant

    before = FoldConstant()(InferType()(parse(texts[case])))  # ones/zeros become constants
    after = ConstantArguments()(before)
    assert after is before


def test_recurrent_weights_are_packed_and_kept_once_by_the_vm():
    """End to end: the loop's product gets the pre-packed weight, and the executable holds that
    weight only in its packed form."""
    weights = _weights(1)
    mod = parse(_LOOP)
    exe = tv.vm.compile(mod, target="c", params=weights)
    shapes = [np.asarray(c).shape for c in exe.constants]
    assert (1, 4, packed_lanes()) in shapes and (4, 4) not in shapes
    vm = tv.vm.VirtualMachine(exe)
    for length in (1, 7):
        x = np.random.default_rng(10 + length).standard_normal((length, 4)).astype("float32")
        got = vm.invoke("main", x).numpy()
        np.testing.assert_allclose(got, _oracle(x, weights["w"], weights["b"]), rtol=1e-5, atol=1e-6)
    # the original loop still takes any weights from outside
    other = _weights(2)
    x = np.random.default_rng(3).standard_normal((4, 4)).astype("float32")
    got = vm.invoke("step", np.int32(0), np.int32(4), x, np.zeros((1, 4), "float32"), other["w"], other["b"])
    np.testing.assert_allclose(got.numpy(), _oracle(x, other["w"], other["b"]), rtol=1e-5, atol=1e-6)
