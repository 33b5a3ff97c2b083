"""Native mode's arena (docs/native_mode.md, "Arena"): a straight-line function's intermediates placed in one
block that its calls reuse, where their spans do not overlap.

Oracle: NumPy for the values; the pool's counters for what was allocated (a storage the arena places is
not a pool allocation); later calls must not change results already returned.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.codegen.build import have_compiler
from tensorvm.runtime.memory import make_allocator
from tensorvm.vm import VirtualMachine, native_emit
from tensorvm.vm import bytecode as bc

pytestmark = pytest.mark.skipif(not have_compiler(), reason="native mode compiles C (no C compiler here)")

# four products whose intermediates are each live across one more product: the arena places them
CHAIN = """
def @main(%x: Tensor[(?, 32), float32], %w: Tensor[(32, 32), float32]) {
  %0 = nn.dense(%x, %w);
  %1 = nn.relu(nn.dense(%0, %w));
  %2 = add(nn.dense(%1, %w), %0);
  %3 = nn.dense(%2, %w);
  sum(%3, axis=[1])
}
"""


def want(x, w):
    h0 = x @ w.T
    h1 = np.maximum(h0 @ w.T, 0)
    return ((h1 @ w.T + h0) @ w.T).sum(axis=1)


def inputs(rows, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, 32)).astype(np.float32), (rng.standard_normal((32, 32)) / 6).astype(np.float32)


def storages(exe) -> int:
    return sum(isinstance(ins, bc.AllocStorage) for ins in exe.function("main").instructions)


def test_a_straight_line_call_allocates_only_its_result_once_the_arena_is_placed():
    exe = tv.vm.compile(tv.parse(CHAIN), target="c", exec_mode="native")
    assert storages(exe) >= 4
    vm = VirtualMachine(exe)
    kept = []
    for rows in (8, 8, 3, 8, 16, 16, 3, 0, 16):
        x, w = inputs(rows, rows)
        vm.reset_memory_stats()
        got = vm.run(x, w).numpy()
        allocated = vm.memory_stats()["num_allocations"]
        kept.append((got, want(x, w), rows, allocated))
    for got, expected, rows, _ in kept:  # later calls did not write into earlier results
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=f"rows {rows}")
    # the first call takes pool blocks, as does a call larger than any before for the slots it outgrows (the
    # arena is placed for the larger sizes after it); every other call allocates its result alone
    counts = [a for *_, a in kept]
    assert counts[0] == storages(exe) and counts[4] > 1
    assert counts[1:4] + counts[5:] == [1] * 7


def test_arena_bytes_are_reserved_not_live_and_released_on_request():
    vm = VirtualMachine(tv.vm.compile(tv.parse(CHAIN), target="c", exec_mode="native"))
    x, w = inputs(64, 1)
    for _ in range(3):
        np.testing.assert_allclose(vm.run(x, w).numpy(), want(x, w), rtol=1e-4, atol=1e-4)
    stats = vm.memory_stats()
    # two intermediates of 64 x 32 floats are live at once (the residual keeps %0 across two products)
    assert stats["bytes_live"] == 0
    assert stats["bytes_arena"] == stats["bytes_reserved"] - stats["bytes_cached"] >= 2 * 64 * 32 * 4
    assert vm._native_rt.release_cached() > 0
    assert vm.memory_stats()["bytes_reserved"] == vm.memory_stats()["bytes_arena"] == 0
    np.testing.assert_allclose(vm.run(x, w).numpy(), want(x, w), rtol=1e-4, atol=1e-4)


def test_without_specializing_no_arena_is_placed():
    exe = tv.vm.compile(tv.parse(CHAIN), target="c", exec_mode="native")
    vm = VirtualMachine(exe, specialize=False)
    x, w = inputs(8, 2)
    for _ in range(3):
        vm.reset_memory_stats()
        np.testing.assert_allclose(vm.run(x, w).numpy(), want(x, w), rtol=1e-4, atol=1e-4)
        assert vm.memory_stats()["num_allocations"] == storages(exe)


def test_no_arena_under_an_allocator_limit():
    """A limit bounds the pool's blocks; an arena placed for small shapes could leave a larger shape's
    blocks no room under it while views of the arena are in use, so a limited VM places none: a larger
    shape runs where the pool alone has room."""
    exe = tv.vm.compile(tv.parse(CHAIN), target="c", exec_mode="native")
    limit = 3 * 256 * 32 * 4 + 4096  # three 32 KB intermediates live at once, and the small blocks
    vm = VirtualMachine(exe, allocator=make_allocator("pooled", limit_bytes=limit))
    for rows in (64, 64, 256, 64, 256):
        x, w = inputs(rows, rows)
        vm.reset_memory_stats()
        np.testing.assert_allclose(vm.run(x, w).numpy(), want(x, w), rtol=1e-4, atol=1e-4)
        assert vm.memory_stats()["num_allocations"] == storages(exe)
        assert vm.memory_stats()["bytes_reserved"] <= limit and vm.memory_stats()["bytes_arena"] == 0


def test_a_view_that_reaches_the_caller_detaches_the_arena_and_keeps_its_bytes(monkeypatch):
    """The analysis never makes a returned storage an arena slot; if it did, the call's end would find the
    view still alive: the arena becomes the result's (freed with it), later calls take pool blocks, and no
    result already returned changes. Forced here by making every storage a slot whose span is the whole
    function (so the placement itself is sound)."""
    def every_storage(fn):
        last = len(fn.instructions) - 1
        return tuple((pc, 0, last) for pc, ins in enumerate(fn.instructions) if isinstance(ins, bc.AllocStorage))

    monkeypatch.setattr(native_emit, "arena_slots", every_storage)
    exe = tv.vm.compile(tv.parse(CHAIN), target="c", exec_mode="native")
    monkeypatch.undo()
    vm = VirtualMachine(exe)
    x, w = inputs(16, 4)
    first = vm.run(x, w).numpy()  # pool blocks; the arena is placed after it
    reserved = vm.memory_stats()["bytes_reserved"]
    second = vm.run(x, w).numpy()  # the result is a view of the arena: detached at the call's end
    kept = [vm.run(*inputs(16, seed)).numpy() for seed in (5, 6, 7)]
    for got in (first, second):
        np.testing.assert_allclose(got, want(x, w), rtol=1e-4, atol=1e-4)
    for got, seed in zip(kept, (5, 6, 7)):
        np.testing.assert_allclose(got, want(*inputs(16, seed)), rtol=1e-4, atol=1e-4)
    with_detached = vm.memory_stats()["bytes_reserved"]
    assert vm.memory_stats()["bytes_arena"] > 0  # (the detached block, until its view goes)
    del second
    assert vm.memory_stats()["bytes_reserved"] < with_detached  # the detached block went with its view
    assert vm.memory_stats()["bytes_reserved"] <= reserved
    assert vm.memory_stats()["bytes_arena"] == 0  # (and the arena that replaced it places nothing)



# control flow: a branch whose arms allocate their own intermediates, a loop (a self tail call) allocating
# each step's, and a non-tail recursion (the inner calls find the arena in use and take pool blocks)
BRANCHES = """
def @main(%c: bool, %x: Tensor[(?, 32), float32], %w: Tensor[(32, 32), float32]) {
  %0 = nn.dense(%x, %w);
  if (%c) {
    %1 = nn.relu(nn.dense(%0, %w));
    sum(add(nn.dense(%1, %w), %0), axis=[1])
  } else {
    %2 = tanh(nn.dense(%0, %w));
    sum(multiply(nn.dense(%2, %w), %0), axis=[1])
  }
}
"""

LOOP = """
def @main(%n: int32, %x: Tensor[(?, 32), float32], %w: Tensor[(32, 32), float32]) {
  let %step = fn (%i: int32, %h: Tensor[(?, 32), float32]) -> Tensor[(?, 32), float32] {
    if (less(%i, %n)) {
      %0 = nn.dense(%h, %w);
      %1 = tanh(add(nn.dense(%0, %w), %h));
      %step(add(%i, 1), %1)
    } else {
      %h
    }
  };
  %step(0, %x)
}
"""

RECURSION = """
def @deep(%n: int32, %x: Tensor[(?, 32), float32], %w: Tensor[(32, 32), float32]) -> Tensor[(?, 32), float32] {
  %0 = nn.dense(%x, %w);
  %1 = tanh(nn.dense(%0, %w));
  if (less(%n, 1)) { %1 } else { add(@deep(subtract(%n, 1), %1, %w), %0) }
}
def @main(%n: int32, %x: Tensor[(?, 32), float32], %w: Tensor[(32, 32), float32]) { @deep(%n, %x, %w) }
"""


def _branches(c, x, w):
    h0 = x @ w.T
    if c:
        return ((np.maximum(h0 @ w.T, 0) @ w.T) + h0).sum(axis=1)
    return ((np.tanh(h0 @ w.T) @ w.T) * h0).sum(axis=1)


def _loop(n, x, w):
    h = x
    for _ in range(n):
        h = np.tanh((h @ w.T) @ w.T + h)
    return h


def _recursion(n, x, w):
    h0 = x @ w.T
    h1 = np.tanh(h0 @ w.T)
    return h1 if n < 1 else _recursion(n - 1, h1, w) + h0


@pytest.mark.parametrize("text, oracle, calls", [
    (BRANCHES, _branches, [(True, 8), (False, 8), (True, 3), (False, 16), (True, 16), (False, 3)]),
    (LOOP, _loop, [(3, 8), (5, 8), (0, 4), (4, 16), (2, 16), (6, 3)]),
    (RECURSION, _recursion, [(2, 8), (4, 8), (0, 5), (3, 16), (1, 16)]),
])
def test_functions_with_control_flow_keep_arenas_and_match_numpy(text, oracle, calls):
    exe = tv.vm.compile(tv.parse(text), target="c", exec_mode="native")
    plain = VirtualMachine(exe, specialize=False)
    vm = VirtualMachine(exe)
    kept = []
    for first, rows in calls:
        x, w = inputs(rows, rows)
        first = np.bool_(first) if isinstance(first, bool) else np.int32(first)
        plain.reset_memory_stats()
        vm.reset_memory_stats()
        want_ = plain.run(first, x, w).numpy()
        got = vm.run(first, x, w).numpy()
        np.testing.assert_allclose(want_, oracle(first, x, w), rtol=1e-4, atol=1e-4)
        kept.append((got, oracle(first, x, w), vm.memory_stats()["num_allocations"],
                     plain.memory_stats()["num_allocations"]))
    for got, expected, *_ in kept:  # later calls did not write into earlier results
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    # once placed, the arenas spare the pool most of the call's intermediates
    assert sum(a for _, _, a, _ in kept[1:]) < sum(b for _, _, _, b in kept[1:])


def test_slots_follow_where_a_storage_s_values_go():
    """``arena_slots`` on hand-written bytecode: a storage whose tensors only kernels read is a slot over the
    instructions that touch them; one whose tensor a read ADT, a return or a call takes is not; a tuple of a
    kernel's outputs that nothing reads (as the compiler leaves after a multi-output kernel) keeps its
    storage a slot; a backward jump leaves the function none."""
    from tensorvm.vm.arena_slots import arena_slots

    def function(*code):
        return bc.VMFunction("f", ("x",), tuple(code), 16)

    kernel = bc.InvokePacked(0, 2, 1, (0, 4))  # (x) -> $4
    base = (bc.LoadConsti(1, 64), bc.LoadConsti(2, 0), bc.AllocStorage(1, 64, "float32", 3),
            bc.AllocTensor(3, 2, (4, 4), "float32", 4), kernel)
    second = (bc.AllocStorage(1, 64, "float32", 5), bc.AllocTensor(5, 2, (4, 4), "float32", 6),
              bc.InvokePacked(0, 2, 1, (4, 6)))
    assert arena_slots(function(*base, *second, bc.Ret(6))) == ((2, 3, 7),)
    assert arena_slots(function(*base, *second, bc.AllocADT(0, (4, 6), 7), bc.Ret(6))) == ((2, 3, 8),)
    assert arena_slots(function(*base, *second, bc.AllocADT(0, (4, 6), 7), bc.Ret(7))) == ()
    assert arena_slots(function(*base, bc.Invoke(0, (4,), 7), bc.Ret(7))) == ()
    assert arena_slots(function(*base, *second, bc.Goto(-3), bc.Ret(6))) == ()
