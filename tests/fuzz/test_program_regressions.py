"""Programs the differential fuzzer found failing, shrunk, as regression tests.

Each runs like a fuzzed program (``program_fuzz.run_case``): the interpreter is the oracle, every
executor is called three times on each of four shape sets (the last the first again), and every
result must equal the interpreter's and stay unchanged after later calls.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import program_fuzz as pf  # noqa: E402

VM = {name: build for name, build in pf.EXECUTORS.items() if name.startswith("vm-")}
VM_C = {name: build for name, build in pf.EXECUTORS.items() if name.startswith("vm-c-")}
ALL_C = {name: build for name, build in pf.EXECUTORS.items() if "-c" in name or name == "aot"}
STATIC = {name: build for name, build in pf.EXECUTORS.items() if name.startswith(("graph", "aot"))}

# (name, program text, executors); found by the fuzzer, shrunk (by Hypothesis, then by hand)
REGRESSIONS = [
    pytest.param(
        "shape_only_sum_and_shape_row",  # issue 16 defect 1: preset values of a specialized body overwritten
        """
def @main(%p1: Tensor[(?), float32]) {
  let %v2 = add(%p1, sum(cast(shape_of(%p1, dtype="int64"), dtype="float32")));
  let %v3 = expand_dims(cast(shape_of(%p1, dtype="int32"), dtype="float32"), axis=0);
  ((%v2, %v3), Cons(%v3, Nil))
}
""",
        VM, id="shape_only_sum_and_shape_row"),
    pytest.param(
        "shape_sum_after_reductions",
        """
def @main(%p1: Tensor[(1), float32], %p2: Tensor[(1, ?), float32], %p3: Tensor[(?), float32]) {
  let %v5 = max(%p1, axis=[0], keepdims=True);
  let %v6 = add(%p1, %v5);
  let %v11 = add(%v6, sum(cast(shape_of(%p2, dtype="int64"), dtype="float32")));
  (%v11, Cons(%v11, Nil))
}
""",
        VM, id="shape_sum_after_reductions"),
    pytest.param(
        "dense_by_its_own_shape",  # the repro of defect 1
        """
def @main(%x: Tensor[(?, 2), float32]) -> Tensor[(?, 1), float32] {
  %W = expand_dims(cast(shape_of(%x, dtype="int64"), dtype="float32"), axis=0);
  %e = nn.dense(%x, %W);
  add(%e, sum(cast(shape_of(%e, dtype="int64"), dtype="float32")))
}
""",
        VM, id="dense_by_its_own_shape"),
    pytest.param(
        "scalar_from_a_static_shape",  # campaign seed 1022, shrunk: AOT gave shape (1,) for a folded 0-d result
        """
def @main(%p1: Tensor[(1), float32]) {
  sum(cast(shape_of(%p1), dtype="float32"))
}
""",
        STATIC, id="scalar_from_a_static_shape"),
    pytest.param(
        "concatenate_a_field_twice",  # campaign seed 5005 (argwhere rows concatenated), shrunk by hand
        """
def @main(%a: Tensor[(?, 2), float32], %b: Tensor[(?, 2), float32]) {
  concatenate((%a, %b, %a), axis=0)
}
""",
        VM_C, id="concatenate_a_field_twice"),  # GCC 12.2 -O3 AVX2 miscompile; the toolchain probe
    pytest.param(
        "concatenate_a_static_tensor_with_itself",  # campaign seed 5011, shrunk by hand
        """
def @main(%p2: Tensor[(3, 2), float32]) {
  concatenate((%p2, %p2), axis=0)
}
""",
        ALL_C, id="concatenate_a_static_tensor_with_itself"),
    pytest.param(
        "option_from_a_folded_if",  # campaign seed 5017, shrunk by hand
        """
def @main(%p1: Tensor[(1, 1), float32]) {
  let %v12 = if (greater(sum(arange(0f, cast(take(shape_of(%p1), 0), dtype="float32"), 1f)), 0f)) {
    Some(%p1)
  } else {
    None
  };
  match (%v12) {
    Some(%o) => { nn.relu(%o) },
    None => { %p1 },
  }
}
""",
        {k: pf.EXECUTORS[k] for k in ("vm-python-bytecode", "vm-python-compiled", "vm-c-native")},
        id="option_from_a_folded_if"),  # FoldConstant's folded if keeps the if's type
]


@pytest.mark.parametrize("name, text, executors", REGRESSIONS)
def test_regression(name, text, executors):
    case = pf.case_from_text(text, seed=16)
    mismatches = pf.run_case(case, pf.Stats(), executors)
    assert not mismatches, pf.report(case, mismatches)
