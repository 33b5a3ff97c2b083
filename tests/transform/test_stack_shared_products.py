"""StackSharedProducts: few-row products of one constant weight in one scope become one product whose rows
are split back; products in different branches, dependent products, dynamic rows, too many rows and
functions written with ``let`` are left apart. Results against the interpreter on the program as written
(and NumPy), on every exec mode of target c and on target python."""

from __future__ import annotations

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.ir.analysis import post_order
from tensorvm.ir.expr import Call, Op
from tensorvm.transform.bind_params import BindParams
from tensorvm.transform.fold_constant import FoldConstant
from tensorvm.transform.infer_type import InferType
from tensorvm.transform.stack_shared_products import MAX_ROWS, StackSharedProducts

rng = np.random.default_rng(0)
W = rng.standard_normal((4, 4)).astype(np.float32)
V = rng.standard_normal((4, 4)).astype(np.float32)


def _dense_rows(mod) -> list:
    """The row counts of the products left in ``main``'s body."""
    return sorted(node.checked_type.shape[0] for node in post_order(mod["main"].body)
                  if isinstance(node, Call) and isinstance(node.op, Op) and node.op.name == "nn.dense")


SIBLINGS = """
def @main(%a: Tensor[(1, 4), float32], %b: Tensor[(2, 4), float32], %c: Tensor[(1, 4), float32],
          %w: Tensor[(4, 4), float32], %v: Tensor[(4, 4), float32]) {
  %0 = nn.dense(%a, %w);
  %1 = nn.dense(%b, %w);
  %2 = nn.dense(%c, %v);
  %3 = sigmoid(nn.dense(%0, %w));
  (add(%0, %2), %1, %3)
}
"""

BRANCHES = """
def @main(%a: Tensor[(1, 4), float32], %b: Tensor[(1, 4), float32], %p: bool, %w: Tensor[(4, 4), float32]) {
  if (%p) { nn.dense(%a, %w) } else { nn.dense(%b, %w) }
}
"""

WITH_LET = """
def @main(%a: Tensor[(1, 4), float32], %b: Tensor[(1, 4), float32], %w: Tensor[(4, 4), float32]) {
  let %x = nn.dense(%a, %w);
  let %y = nn.dense(%b, %w);
  add(%x, %y)
}
"""


def _args(text):
    shapes = {"a": (1, 4), "b": (2, 4) if "(2, 4)" in text else (1, 4), "c": (1, 4)}
    names = [n for n in ("a", "b", "c") if f"%{n}:" in text]
    args = [rng.standard_normal(shapes[n]).astype(np.float32) for n in names]
    return args + ([np.array(True)] if "%p" in text else [])


@pytest.mark.parametrize("text, stacked", [(SIBLINGS, True), (BRANCHES, False), (WITH_LET, False)])
def test_results_match_the_interpreter_on_every_executor(text, stacked):
    mod = tv.parse(text)
    args = _args(text)
    want = tv.create_executor("debug", mod).evaluate()(*args, W, V) if "%v" in text else \
        tv.create_executor("debug", mod).evaluate()(*args, W)
    params = {"w": W, "v": V} if "%v" in text else {"w": W}
    for target, modes in (("c", ("bytecode", "native")), ("python", ("bytecode",))):
        for mode in modes:
            exe = tv.vm.compile(mod, target=target, params=params, exec_mode=mode)
            got = tv.vm.VirtualMachine(exe).run(*args)
            for g, w in zip(got if isinstance(got, (tuple, list)) else [got],
                            want if isinstance(want, (tuple, list)) else [want], strict=True):
                np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"{target} {mode}")
    if text == SIBLINGS:  # (the oracle for the rewrite itself: NumPy)
        a, b, c = args
        np.testing.assert_allclose(got[1].numpy(), b @ W.T, rtol=1e-5)


def test_what_is_stacked_and_what_is_not():
    def rows_after(text, params):
        mod = BindParams(params)(tv.parse(text)) if params else tv.parse(text)
        return _dense_rows(InferType()(StackSharedProducts()(InferType()(FoldConstant()(InferType()(mod))))))

    # a (1 row) and b (2 rows) read w: one product of 3 rows; the product of %0 depends on it; c reads v
    assert rows_after(SIBLINGS, {"w": W, "v": V}) == [1, 1, 3]
    assert rows_after(BRANCHES, {"w": W}) == [1, 1]  # (each branch keeps its own)
    assert rows_after(WITH_LET, {"w": W}) == [1, 1]  # (let: left as written)
    many = f"""
def @main(%a: Tensor[({MAX_ROWS}, 4), float32], %b: Tensor[(1, 4), float32], %w: Tensor[(4, 4), float32]) {{
  (nn.dense(%a, %w), nn.dense(%b, %w))
}}
"""
    assert rows_after(many, {"w": W}) == [1, MAX_ROWS]  # (more rows than MAX_ROWS // 2: not a few)
    assert rows_after(SIBLINGS, {}) == [1, 1, 1, 2]  # (weights given at run time: no constant, left apart)
