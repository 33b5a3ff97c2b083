"""Native mode frees cycles through reference cells (docs/native_mode.md, "Values in C"): a closure stored in
the cell it captures (recursion through a reference, the usual way to tie a knot without a global) is
garbage once the call that made it is over, though each holds the other.

Oracle: NumPy for the values; the pool's counters for what is still held (``bytes_live``: the tensors the
cycle captured) and the number of listed cells (``cells``); the bytecode VM, whose cycles Python's collector
frees, for the same program.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.codegen.build import have_compiler
from tensorvm.vm import VirtualMachine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from programs import PROGRAMS  # noqa: E402

pytestmark = pytest.mark.skipif(not have_compiler(), reason="native mode compiles C (no C compiler here)")

# %r holds %f, which captures %r and %y: a cycle holding a tensor of the pool
KNOT = next(p for p in PROGRAMS if p.name == "reference_cell_holding_the_closure_that_reads_it").text

# a tail loop that ties a new knot on every step: the cells listed during one call pass TV_CELLS_FIRST, so the
# collector also runs inside the call
LOOP = KNOT.replace("@main", "@knot") + """
def @loop(%i: int32, %n: int32, %x: Tensor[(?), float32], %acc: Tensor[(?), float32]) -> Tensor[(?), float32] {
  if (less(%i, %n)) {
    @loop(add(%i, 1), %n, %x, add(%acc, @knot(%x, 1)))
  } else { %acc }
}
def @main(%x: Tensor[(?), float32], %n: int32) -> Tensor[(?), float32] {
  @loop(0, %n, %x, zeros_like(%x))
}
"""


def native(text):
    return VirtualMachine(tv.vm.compile(tv.parse(text), target="c", exec_mode="native"))


def test_a_cycle_through_a_cell_is_freed_after_each_call():
    vm = native(KNOT)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1000).astype(np.float32)
    first = vm.invoke("main", x, np.int32(2)).numpy()
    np.testing.assert_allclose(first, 2 * x * 3, rtol=1e-6)
    del first
    gc.collect()
    baseline = vm.memory_stats()["bytes_live"]
    kept = []
    for i in range(40):
        k = i % 5
        got = vm.invoke("main", x, np.int32(k)).numpy()
        kept.append((got, k))
        assert vm.memory_stats()["cells"] == 0, "a cell of a finished call is still listed"
    for got, k in kept:  # (later calls did not change results already returned)
        np.testing.assert_allclose(got, 2 * x * (k + 1), rtol=1e-5)
    del kept, got
    gc.collect()
    # each leaked cycle would hold its 4000-byte %y: 40 calls, 160 KB
    assert vm.memory_stats()["bytes_live"] == baseline


def test_cycles_made_inside_one_long_call_are_freed_during_it():
    steps = 3000  # (past the 1024 cells that start a collection during a call)
    vm = native(LOOP)
    x = np.arange(64, dtype=np.float32)
    got = vm.invoke("main", x, np.int32(steps)).numpy()
    np.testing.assert_allclose(got, steps * 4 * x, rtol=1e-6)
    stats = vm.memory_stats()
    # without a collection during the call, all 3000 cycles' 256-byte tensors were live at its end
    assert stats["peak_bytes"] < 1024 * 256 + 64 * 1024, stats
    del got
    gc.collect()
    assert vm.memory_stats()["bytes_live"] == 0 and vm.memory_stats()["cells"] == 0


def test_native_and_bytecode_agree_on_the_knot():
    mod = tv.parse(KNOT)
    x = np.linspace(-1, 1, 17, dtype=np.float32)
    byte = VirtualMachine(tv.vm.compile(mod, target="c", exec_mode="bytecode"))
    nat = native(KNOT)
    for k in (0, 1, 4):
        np.testing.assert_array_equal(nat.invoke("main", x, np.int32(k)).numpy(),
                                      byte.invoke("main", x, np.int32(k)).numpy())
