"""exec_mode="native" (docs/native_mode.md): VM functions compiled to C, one C entry point per call.

Oracle: the interpreter (``tv.create_executor("debug", mod)``) and NumPy; errors are compared with the
bytecode VM's exception types on the same program.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.codegen.build import have_compiler
from tensorvm.errors import ExecutionError, ShapeError, UnsupportedError
from tensorvm.runtime.ndarray import NDArray
from tensorvm.runtime.object import ADT, RefValue
from tensorvm.vm import VirtualMachine, load_executable
from tensorvm.vm import bytecode as bc
from tensorvm.vm.executable import Executable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from programs import PROGRAMS  # noqa: E402

pytestmark = pytest.mark.skipif(not have_compiler(), reason="native mode compiles C (no C compiler here)")

_CACHE: dict = {}


def native(text: str) -> Executable:
    if text not in _CACHE:
        _CACHE[text] = tv.vm.compile(tv.parse(text), target="c", exec_mode="native")
    return _CACHE[text]


def oracle(text: str, *args):
    return tv.create_executor("debug", tv.parse(text)).evaluate()(*args)


def plain(value):
    """A user value as plain NumPy / tuples / (constructor, fields), for comparing."""
    if isinstance(value, NDArray):
        return value.numpy()
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, ADT):
        return (value.constructor, tuple(plain(f) for f in value.fields))
    return value


def assert_same(got, want, rtol=1e-5, atol=1e-6):
    got, want = plain(got), plain(want)
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), (got, want)
        for a, b in zip(got, want):
            assert_same(a, b, rtol, atol)
        return
    if isinstance(want, str) or want is None:
        assert got == want
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


MLP = """
def @main(%x: Tensor[(2, 8), float32], %w1: Tensor[(16, 8), float32], %b1: Tensor[(16), float32],
          %w2: Tensor[(4, 16), float32]) {
  %0 = nn.relu(nn.bias_add(nn.dense(%x, %w1), %b1));
  nn.softmax(nn.dense(%0, %w2))
}
"""

DYN = """
def @main(%x: Tensor[(?, 6), float32], %w: Tensor[(5, 6), float32]) {
  nn.relu(nn.dense(%x, %w))
}
"""

IF = """
def @main(%c: bool, %x: Tensor[(?), float32]) {
  if (%c) { add(%x, %x) } else { multiply(%x, %x) }
}
"""

LOOP = """
def @loop(%i: int32, %acc: int32) -> int32 {
  if (equal(%i, 0)) { %acc } else { @loop(subtract(%i, 1), add(%acc, %i)) }
}
def @main(%n: int32) -> int32 { @loop(%n, 0) }
"""

SUM_UP = """
def @sum_up(%i: int64) -> int64 {
  if (equal(%i, 0i64)) { %i } else { add(@sum_up(subtract(%i, 1i64)), %i) }
}
def @main(%n: int64) -> int64 { @sum_up(%n) }
"""

LIST = """
def @main(%x: float32, %y: float32, %z: float32) {
  let %xs = Cons(%x, Cons(%y, Cons(%z, Nil)));
  let %ys = @map(fn (%v: float32) -> float32 { multiply(%v, 2f) }, %xs);
  (@foldl(fn (%a: float32, %v: float32) -> float32 { add(%a, %v) }, 0f, %ys), %ys)
}
"""

CLOSURE = """
def @main(%x: Tensor[(?), float32], %k: float32) {
  let %scale = fn (%t: Tensor[(?), float32]) { multiply(%t, %k) };
  let %twice = fn (%f: fn (Tensor[(?), float32]) -> Tensor[(?), float32], %t: Tensor[(?), float32]) { %f(%f(%t)) };
  (%twice(%scale, %x), %scale)
}
"""

MISMATCH = """
def @main(%x: Tensor[(?), float32], %y: Tensor[(?), float32]) { add(%x, %y) }
"""

DIVIDE = """
def @main(%x: Tensor[(?), int32], %y: Tensor[(?), int32]) { floor_divide(%x, %y) }
"""


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def test_static_mlp_matches_the_interpreter():
    args = (f32(2, 8), f32(16, 8, seed=1), f32(16, seed=2), f32(4, 16, seed=3))
    vm = VirtualMachine(native(MLP))
    assert vm.exec_stats()["exec_mode"] == "native"
    assert_same(vm.run(*args), oracle(MLP, *args))
    library = native(MLP).stats()["kernel_library"]
    assert library["native_source_bytes"] > 0 and not library["numpy_fallbacks"]


def test_dynamic_batch_several_shapes_and_earlier_results_unchanged():
    vm = VirtualMachine(native(DYN))
    w = f32(5, 6, seed=9)
    kept = []
    for round_ in range(3):  # first calls, then repeated calls reusing pooled memory
        for batch in (1, 7, 3, 0, 12):
            x = f32(batch, 6, seed=batch + 10 * round_)
            result = vm.run(x, w)
            assert_same(result, oracle(DYN, x, w))
            kept.append((result, np.maximum(x @ w.T, 0)))
    for result, want in kept:  # later calls did not write into earlier results
        np.testing.assert_allclose(result.numpy(), want, rtol=1e-5, atol=1e-6)


def test_results_are_numpy_arrays_over_the_c_storage_and_memory_comes_back():
    vm = VirtualMachine(native(DYN))
    w = f32(5, 6, seed=1)
    result = vm.run(f32(4, 6), w).numpy()
    assert type(result.base).__name__ == "StorageRef"  # no copy: the array views the C storage
    assert vm.memory_stats()["bytes_live"] == result.nbytes
    del result
    assert vm.memory_stats()["bytes_live"] == 0
    vm.run(f32(4, 6), w)
    stats = vm.memory_stats()
    assert stats["reuse_hits"] > 0 and stats["num_allocations"] >= stats["num_frees"] > 0


CHAIN = """
def @main(%x: Tensor[(?, 256), float32], %w: Tensor[(256, 256), float32]) {
  %0 = nn.dense(%x, %w);
  %1 = nn.dense(%0, %w);
  %2 = nn.dense(%1, %w);
  %3 = nn.dense(%2, %w);
  %4 = nn.dense(%3, %w);
  sum(%4, axis=[1])
}
"""


def test_an_intermediate_is_freed_when_killed_though_its_shape_was_taken():
    """Each product's output shape comes from a shape function reading its input's shape: holding that
    shape must not keep the input's memory (a chain of five products keeps at most two intermediates live
    at once, not all five, and the answer is right)."""
    vm = VirtualMachine(native(CHAIN))
    x, w = f32(8, 256), (f32(256, 256, seed=1) / 16)
    vm.run(x, w)
    vm.reset_memory_stats()
    got = vm.run(x, w).numpy()
    np.testing.assert_allclose(got, (x @ w.T @ w.T @ w.T @ w.T @ w.T).sum(axis=1), rtol=1e-4, atol=1e-4)
    one = 8 * 256 * 4
    assert vm.memory_stats()["peak_bytes"] < 3 * one


WIDENING = """
def @main(%x: Tensor[(?, 64), float32], %a: Tensor[(160, 64), float32], %b: Tensor[(224, 160), float32],
          %c: Tensor[(288, 224), float32]) {
  %0 = nn.dense(%x, %a);
  %1 = nn.dense(%0, %b);
  %2 = nn.dense(%1, %c);
  sum(%2, axis=[1])
}
"""


def test_large_blocks_go_back_to_the_heap_and_small_ones_stay_cached():
    """Intermediates of 256 KB up to 32 MB (three sizes here, each its own size class, at two batch sizes)
    are given back to the allocator when freed, so that the next request of any size reuses the heap's
    memory: after the calls none of them is held, where a cache of size classes would hold a block of each
    (2.4 MB); the small results' blocks stay cached and are reused. (No arena: the pool's rule alone.)"""
    vm = VirtualMachine(native(WIDENING), specialize=False)
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal(s).astype(np.float32) / 8 for s in ((160, 64), (224, 160), (288, 224)))
    for rows in (512, 448, 512, 448):
        x = rng.standard_normal((rows, 64)).astype(np.float32)
        got = vm.run(x, a, b, c).numpy()
        np.testing.assert_allclose(got, (x @ a.T @ b.T @ c.T).sum(axis=1), rtol=1e-4, atol=1e-3)
        del got
    stats = vm.memory_stats()
    assert stats["bytes_live"] == 0 and stats["reuse_hits"] >= 2
    assert stats["peak_bytes"] >= 512 * (224 + 288) * 4  # two intermediates were live at once
    assert stats["bytes_reserved"] == stats["bytes_cached"] <= 2 * 512 * 4 + 128


def test_large_results_kept_by_the_caller_are_not_reused():
    """Results of the heap's sizes that the caller still holds keep their memory while later calls allocate
    and free blocks of the same and other sizes."""
    vm = VirtualMachine(native(WIDENING.replace("  %2 = nn.dense(%1, %c);\n  sum(%2, axis=[1])", "  nn.dense(%1, %c)")))
    rng = np.random.default_rng(4)
    a, b, c = (rng.standard_normal(s).astype(np.float32) / 8 for s in ((160, 64), (224, 160), (288, 224)))
    kept = []
    for rows in (512, 448, 512, 640, 448):
        x = rng.standard_normal((rows, 64)).astype(np.float32)
        kept.append((vm.run(x, a, b, c).numpy(), x @ a.T @ b.T @ c.T))
    for got, want in kept:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_if():
    vm = VirtualMachine(native(IF))
    x = f32(5)
    for c in (True, False):
        assert_same(vm.run(np.array(c), x), oracle(IF, np.array(c), x))


def test_tail_recursive_loop_of_100000_steps_runs_in_constant_stack():
    n = np.array(100_000, "int32")
    result = VirtualMachine(native(LOOP)).run(n)
    want = np.array(100_000 * 100_001 // 2, "int64").astype("int32")  # int32 adds wrap, as in the kernels
    assert result.numpy() == want


MUTUAL = """
def @ping(%n: int32, %acc: int32) -> int32 { if (%n == 0) { %acc } else { @pong(%n - 1, %acc + 1) } }
def @pong(%n: int32, %acc: int32) -> int32 { if (%n == 0) { %acc * 2 } else { @ping(%n - 1, %acc) } }
def @main(%n: int32) -> int32 { @ping(%n, 0) }
"""

CONTINUATION = """
def @main(%n: int32) -> int32 {
  let %step = fn (%k: fn (int32) -> int32, %i: int32) -> int32 { if (%i == 0) { 7 } else { %k(%i - 1) } };
  let %loop = fn (%i: int32) -> int32 { %step(%loop, %i) };
  %loop(%n)
}
"""


@pytest.mark.parametrize("n", [300_001, 300_000])
def test_tail_calls_between_functions_and_through_closures_run_in_constant_stack(n):
    """Tail calls of other functions (a loop written as mutual recursion) and of closures (a loop through a
    continuation), 300,000 steps and more than the depth limit: each call is made by the frame below
    (tv_native.c's trampoline), as the bytecode VM reuses frames; they had been nested C calls and stopped
    at 100,000 with the depth error. Against the bytecode VM and Python arithmetic; the VM runs again."""
    arg = np.array(n, "int32")
    want = n // 2 if n % 2 == 0 else n + 1  # (each ping adds 1; ending in pong doubles)
    for text, expected in ((MUTUAL, want), (CONTINUATION, 7)):
        vm = VirtualMachine(native(text))
        bytecode = VirtualMachine(tv.vm.compile(tv.parse(text), target="c", exec_mode="bytecode"))
        assert int(vm.run(arg).numpy()) == expected == int(bytecode.run(arg).numpy())
        assert int(vm.run(np.array(5, "int32")).numpy()) == int(bytecode.run(np.array(5, "int32")).numpy())


def test_tail_loop_matches_the_interpreter():
    n = np.array(300, "int32")
    assert_same(VirtualMachine(native(LOOP)).run(n), oracle(LOOP, n))


def test_non_tail_recursion():
    n = np.array(2000, "int64")
    assert_same(VirtualMachine(native(SUM_UP)).run(n), oracle(SUM_UP, n))


def test_recursion_depth_limit_is_a_clear_error(monkeypatch):
    from tensorvm.vm import native_mode

    monkeypatch.setattr(native_mode, "MAX_DEPTH", 50)
    vm = VirtualMachine(native(SUM_UP))
    assert int(vm.run(np.array(40, "int64")).numpy()) == 820
    with pytest.raises(ExecutionError, match="recursion deeper than 50"):
        vm.run(np.array(60, "int64"))
    assert int(vm.run(np.array(10, "int64")).numpy()) == 55  # the VM is fine afterwards


def test_recursion_past_the_thread_s_c_stack_runs_on_a_deep_stack():
    """50,000 nested calls do not fit a small thread stack: the call runs again on a large one."""
    import threading

    outcome = {}

    def run():
        try:
            outcome["value"] = VirtualMachine(native(SUM_UP)).run(np.array(50_000, "int64")).numpy()
        except Exception as err:  # noqa: BLE001 - reported below
            outcome["error"] = err

    previous = threading.stack_size(2 << 20)
    try:
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
    finally:
        threading.stack_size(previous)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["value"] == 50_000 * 50_001 // 2


def test_recursion_past_the_depth_limit_is_an_error_not_a_crash():
    with pytest.raises(ExecutionError, match="recursion deeper than 100000"):
        VirtualMachine(native(SUM_UP)).run(np.array(5_000_000, "int64"))


def test_adt_list_map_fold_via_match():
    args = tuple(np.array(v, "float32") for v in (1.5, -2.0, 4.0))
    vm = VirtualMachine(native(LIST))
    got = vm.run(*args)
    assert_same(got, oracle(LIST, *args))
    assert_same(vm.run(*args), got)  # again: pooled memory, same answer


def test_closures_in_and_out():
    x, k = f32(6), np.array(3.0, "float32")
    vm = VirtualMachine(native(CLOSURE))
    result, scale = vm.run(x, k)
    np.testing.assert_allclose(result.numpy(), plain(oracle(CLOSURE, x, k)[0]), rtol=1e-6)
    assert not isinstance(scale, (NDArray, tuple))  # a closure came back


def test_kernel_shape_error_is_the_bytecode_vm_s_exception():
    x, y = f32(3), f32(4)
    bytecode = tv.vm.compile(tv.parse(MISMATCH), target="c")
    with pytest.raises(ShapeError) as expected:
        VirtualMachine(bytecode).run(x, y)
    with pytest.raises(ShapeError) as got:
        VirtualMachine(native(MISMATCH)).run(x, y)
    assert type(got.value) is type(expected.value)
    assert "'main' at pc" in str(got.value)  # names the VM function and the op


def test_integer_division_by_zero_is_an_execution_error_like_the_bytecode_vm():
    x, y = np.array([4, 5], "int32"), np.array([2, 0], "int32")
    with pytest.raises(ExecutionError) as expected:
        VirtualMachine(tv.vm.compile(tv.parse(DIVIDE), target="c")).run(x, y)
    with pytest.raises(ExecutionError, match="division by zero") as got:
        VirtualMachine(native(DIVIDE)).run(x, y)
    assert type(got.value) is type(expected.value)
    assert_same(VirtualMachine(native(DIVIDE)).run(x, np.array([2, 3], "int32")), np.array([2, 1], "int32"))


def test_save_and_load_run_natively():
    loaded = load_executable(native(DYN).save_bytes())
    assert loaded.exec_mode == "native"
    vm = VirtualMachine(loaded)
    x, w = f32(3, 6), f32(5, 6, seed=4)
    assert vm.exec_stats()["exec_mode"] == "native"
    assert_same(vm.run(x, w), oracle(DYN, x, w))


def test_native_needs_target_c():
    with pytest.raises(UnsupportedError, match="target 'c'"):
        tv.vm.compile(tv.parse(DYN), target="python", exec_mode="native")


def test_device_copy_is_a_new_tensor_with_the_same_bytes():
    """DeviceCopy (host to host): a copy into a new tensor of the pool in native mode, an alias in the
    bytecode VM; the values are the same."""
    fn = bc.VMFunction("main", ("x",), (bc.DeviceCopy(0, 0, 0, 1), bc.Ret(1)), 2)
    exe = Executable([fn], exec_mode="native", target="c")
    vm = VirtualMachine(exe)
    for x in (np.arange(6, dtype="float32").reshape(2, 3), np.array([True, False]), np.zeros((0, 4), "int64")):
        got = vm.run(x).numpy()
        assert got.dtype == x.dtype and got.shape == x.shape
        np.testing.assert_array_equal(got, x)
        np.testing.assert_array_equal(got, VirtualMachine(exe.with_exec_mode("bytecode")).run(x).numpy())
        assert x.size == 0 or not np.shares_memory(got, x)
    assert vm.memory_stats()["num_allocations"] >= 2


def test_device_copy_of_a_tuple_shares_its_fields_as_the_bytecode_vm_does():
    fn = bc.VMFunction("main", ("x",), (bc.AllocADT(0, (0, 0), 1), bc.DeviceCopy(1, 0, 0, 2), bc.Ret(2)), 3)
    exe = Executable([fn], exec_mode="native", target="c")
    x = np.arange(3, dtype="int32")
    got = VirtualMachine(exe).run(x)
    want = VirtualMachine(exe.with_exec_mode("bytecode")).run(x)
    assert isinstance(got, tuple) and len(got) == 2
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def _kernel_calls(report) -> dict:
    return {r.name: r.calls for r in report.rows if r.kind == "kernel"}


@pytest.mark.parametrize("text, args", [
    (DYN, lambda: (f32(3, 6), f32(5, 6, seed=4))),
    (LOOP, lambda: (np.array(30, "int32"),)),
    (LIST, lambda: (np.float32(1), np.float32(2), np.float32(3))),
], ids=["dynamic", "loop", "adt"])
def test_profile_counts_every_kernel_and_shape_function_call_as_the_bytecode_vm_does(text, args):
    exe = native(text)
    report = VirtualMachine(exe).profile("main", *args())
    reference = VirtualMachine(exe.with_exec_mode("bytecode")).profile("main", *args())
    assert report.exec_mode == "native"
    assert _kernel_calls(report) == _kernel_calls(reference) and report.rows
    assert all(r.kind == "kernel" and r.total_us >= 0 for r in report.rows)
    assert report.kernel_us <= report.total_us
    assert_same(report.result, oracle(text, *args()))
    assert "fused" in str(report) and report.json()


def test_profile_of_a_call_run_again_on_a_deep_stack_counts_that_run_once():
    """A call reaching the end of its thread's C stack runs again on a large stack (``call_native``): the
    profile counts the run that finished, on the thread that ran it."""
    import threading

    n, outcome = 30_000, {}

    def run():
        try:
            outcome["report"] = VirtualMachine(native(SUM_UP)).profile("main", np.array(n, "int64"), warmup=0)
        except Exception as err:  # noqa: BLE001 - reported below
            outcome["error"] = err

    previous = threading.stack_size(2 << 20)
    try:
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
    finally:
        threading.stack_size(previous)
    assert "error" not in outcome, outcome.get("error")
    report = outcome["report"]
    assert int(report.result.numpy()) == n * (n + 1) // 2
    calls = _kernel_calls(report)
    assert calls == _kernel_calls(VirtualMachine(native(SUM_UP).with_exec_mode("bytecode")).profile(
        "main", np.array(n, "int64"), warmup=0))
    assert max(calls.values()) == n + 1  # (the base-case test runs once more than the recursion)


def test_profile_counts_only_its_own_thread_s_calls():
    """Another VM running the same library on another thread meanwhile is not in the profile."""
    import threading

    exe, n = native(LOOP), np.array(200, "int32")
    want = _kernel_calls(VirtualMachine(exe.with_exec_mode("bytecode")).profile("main", n, warmup=0))
    stop, running, other_calls = threading.Event(), threading.Event(), []

    def busy():
        vm = VirtualMachine(exe)
        while not stop.is_set():
            vm.run(n)
            other_calls.append(1)
            running.set()
    worker = threading.Thread(target=busy)
    worker.start()
    try:
        vm = VirtualMachine(exe)
        assert running.wait(120)  # (the other VM is calling before the profiles start, even on a loaded machine)
        before = len(other_calls)
        reports = []
        while len(reports) < 20 or (len(other_calls) == before and worker.is_alive() and len(reports) < 10**5):
            # (and the other VM calls while they run)
            reports.append(vm.profile("main", n, warmup=0))
    finally:
        stop.set()
        worker.join()
    assert len(other_calls) > before
    assert all(_kernel_calls(r) == want for r in reports)


def test_instrument_sees_the_calls_the_bytecode_vm_shows_and_can_skip_them():
    exe = native(DYN)
    x, w = f32(3, 6), f32(5, 6, seed=4)

    def record(into):
        def fn(name, before, ret, *args):
            into.append((name, before, [(str(a.dtype), tuple(a.shape)) for a in args]))
        return fn
    seen, want = [], []
    vm, reference = VirtualMachine(exe), VirtualMachine(exe.with_exec_mode("bytecode"))
    vm.set_instrument(record(seen))
    reference.set_instrument(record(want))
    assert_same(vm.run(x, w), oracle(DYN, x, w))
    reference.run(x, w)
    assert seen == want and seen
    assert vm.exec_stats()["instrumented_runs_in"] == "dispatch loop"
    from tensorvm.vm import SKIP_RUN

    def skip_dense(into):
        def fn(name, before, ret, *args):
            into.append((name, before))
            return SKIP_RUN if before and name.startswith("fused_nn_dense") else None
        return fn
    skipped, skipped_reference = [], []
    vm.set_instrument(skip_dense(skipped))
    reference.set_instrument(skip_dense(skipped_reference))
    vm.run(x, w)  # (the skipped kernel leaves its output as allocated: only the calls are compared)
    reference.run(x, w)
    assert skipped == skipped_reference
    assert ("fused_nn_dense_nn_relu", True) in skipped and ("fused_nn_dense_nn_relu", False) not in skipped
    vm.set_instrument(None)  # back to the C functions
    before = vm.memory_stats()["num_allocations"]
    assert_same(vm.run(x, w), oracle(DYN, x, w))
    assert vm.memory_stats()["num_allocations"] > before


@pytest.mark.parametrize("text", [DYN, LIST, CLOSURE, SUM_UP], ids=["dynamic", "adt", "closure", "recursion"])
def test_generated_c_is_warning_free(tmp_path, text):
    """The generated translation unit (runtime, wrappers, functions) under -Wall -Wextra -Werror."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    source = tmp_path / "native.c"
    source.write_text(native(text).c_library.native.source)
    result = subprocess.run([cc, "-std=gnu11", "-O2", "-fPIC", "-Wall", "-Wextra", "-Werror", "-c", str(source), "-o",
                             str(tmp_path / "native.o")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[:4000]


def test_allocator_limit_is_kept_like_the_vm_s_pool():
    from tensorvm.runtime.memory import make_allocator

    x, w = f32(64, 6), f32(5, 6, seed=2)
    for exe in (tv.vm.compile(tv.parse(DYN), target="c"), native(DYN)):
        with pytest.raises(ExecutionError, match="(?i)out of memory|could not allocate"):
            VirtualMachine(exe, allocator=make_allocator("pooled", limit_bytes=256)).run(x, w)
    vm = VirtualMachine(native(DYN), allocator=make_allocator("pooled", limit_bytes=1 << 20))
    for _ in range(3):
        assert_same(vm.run(x, w), oracle(DYN, x, w))
    assert vm.memory_stats()["bytes_reserved"] <= 1 << 20


def test_a_result_viewing_a_constant_is_read_only():
    c = np.array([1.0, 2.0, 3.0], "float32")
    mod = tv.parse("""
def @main(%x: Tensor[(3), float32], %c: Tensor[(3), float32]) { (add(%x, %c), %c) }
""")
    exe = tv.vm.compile(mod, target="c", exec_mode="native", params={"c": c})
    total, constant = VirtualMachine(exe).run(f32(3))
    np.testing.assert_array_equal(constant.numpy(), c)
    assert not constant.numpy().flags.writeable


def test_names_reach_the_generated_c_only_in_comments_that_cannot_end_early():
    """Function and parameter names of an (unvalidated, in-memory) executable appear in the C as comments,
    escaped so that none ends the comment or the line: a hostile name changes nothing the C does."""
    exe = tv.vm.compile(tv.parse(MISMATCH), target="c")
    main = exe.functions[0]
    hostile = 'm*/ int evil(void) { return 1; } /*\n#error injected\n'
    exe.functions[0] = type(main)(hostile, (hostile, "y"), main.instructions, main.register_file_size,
                                  main.param_types, main.ret_type)
    exe = exe.with_exec_mode("native")
    x = f32(4)
    result = VirtualMachine(exe).invoke(hostile, x, x)
    np.testing.assert_array_equal(result.numpy(), x + x)
    source = exe.c_library.native.source
    assert "int evil(void)" in source  # (as comment text)
    assert "\n#error injected" not in source and "*/ int evil" not in source


def test_errors_release_everything_the_call_held(monkeypatch):
    """After a failed call (a kernel error, the depth limit deep in a recursion) no storage stays live."""
    from tensorvm.vm import native_mode

    vm = VirtualMachine(native(MISMATCH))
    with pytest.raises(ShapeError):
        vm.run(f32(3), f32(4))
    assert vm.memory_stats()["bytes_live"] == 0
    monkeypatch.setattr(native_mode, "MAX_DEPTH", 30)
    vm = VirtualMachine(native(SUM_UP))
    with pytest.raises(ExecutionError, match="recursion deeper than 30"):
        vm.run(np.array(100, "int64"))
    stats = vm.memory_stats()
    assert stats["bytes_live"] == 0 and stats["num_allocations"] == stats["num_frees"] > 0


APPLY = """
def @make(%k: float32) -> fn (Tensor[(?), float32]) -> Tensor[(?), float32] {
  fn (%t: Tensor[(?), float32]) -> Tensor[(?), float32] { multiply(%t, %k) }
}
def @apply(%f: fn (Tensor[(?), float32]) -> Tensor[(?), float32], %x: Tensor[(?), float32]) -> Tensor[(?), float32] {
  %f(%x)
}
def @main(%x: Tensor[(?), float32]) -> Tensor[(?), float32] { @apply(@make(2f), %x) }
"""


def test_a_closure_returned_by_one_call_is_passed_to_the_next():
    vm = VirtualMachine(native(APPLY))
    scale = vm.invoke("make", np.array(3.0, "float32"))
    x = f32(5)
    np.testing.assert_allclose(vm.invoke("apply", scale, x).numpy(), x * 3, rtol=1e-6)
    np.testing.assert_allclose(VirtualMachine(native(APPLY)).invoke("apply", scale, x).numpy(), x * 3, rtol=1e-6)
    assert_same(vm.run(x), oracle(APPLY, x))


# --- arguments checked and converted in C (Runtime.invoke; bridge.c) ------------------------------------
TREE = """
type Tree {
  Leaf(Tensor[(1, 4), float32]),
  Node(Tree, Tree, Tensor[(1, 4), float32]),
}
def @sum(%t: Tree) -> Tensor[(1, 4), float32] {
  match (%t) { Leaf(%x) => %x, Node(%l, %r, %x) => add(add(@sum(%l), @sum(%r)), %x), }
}
def @main(%t: Tree, %s: float32) -> (Tensor[(1, 4), float32], Tree) { (multiply(@sum(%t), %s), %t) }
"""

LIST_SUM = """
def @total(%l: List[Tensor[(n), float32]], %acc: Tensor[(n), float32]) -> Tensor[(n), float32] {
  match (%l) { Cons(%h, %t) => @total(%t, add(%acc, %h)), Nil => %acc, }
}
def @main(%l: List[Tensor[(n), float32]], %x: Tensor[(n), float32], %p: (Tensor[(2), int32], float32))
    -> (Tensor[(n), float32], List[Tensor[(n), float32]], int32) {
  (multiply(@total(%l, %x), %p.1), %l, sum(%p.0))
}
"""


def tree_of(mod, depth: int, seed: int = 0, left_deep: bool = False):
    """A full binary tree of the given depth (or a left-deep chain), built with the module's constructors."""
    rng = np.random.default_rng(seed)
    leaf, node = mod.constructor("Leaf"), mod.constructor("Node")
    if left_deep:
        tree = leaf.value(rng.standard_normal((1, 4)).astype("float32"))
        for _ in range(depth):
            tree = node.value(tree, leaf.value(np.ones((1, 4), "float32")), np.full((1, 4), 0.5, "float32"))
        return tree
    if depth == 0:
        return leaf.value(rng.standard_normal((1, 4)).astype("float32"))
    return node.value(tree_of(mod, depth - 1, seed + 1), tree_of(mod, depth - 1, seed + 2),
                      rng.standard_normal((1, 4)).astype("float32"))


def no_python_conversion(vm, monkeypatch):
    def refuse(*args):
        raise AssertionError("the arguments went through the Python conversion")

    monkeypatch.setattr(vm, "_convert_inputs", refuse)


def test_adt_arguments_take_the_c_path_and_match_the_interpreter(monkeypatch):
    mod = tv.parse(TREE)
    vm = VirtualMachine(native(TREE))
    no_python_conversion(vm, monkeypatch)
    for depth in (0, 1, 4):
        tree, s = tree_of(mod, depth, seed=depth), np.array(2.0, "float32")
        got = vm.run(tree, s)
        assert_same(got, oracle(TREE, tree, s))
        assert_same(vm.run(tree, s), got)  # repeated: the same answer from pooled memory


def test_symbolic_dims_new_shapes_and_tuples_in_c(monkeypatch):
    vm = VirtualMachine(native(LIST_SUM))
    no_python_conversion(vm, monkeypatch)
    for n in (3, 7, 3, 1):  # new shapes, then one seen before
        xs = [np.full(n, i, "float32") for i in range(4)]
        args = (tv.prelude.make_list(xs), np.arange(n, dtype="float32"),
                (np.array([1, 2], "int32"), np.array(0.5, "float32")))
        got = vm.run(*args)
        assert_same(got, oracle(LIST_SUM, *args))


def _bad_tree_arguments(mod):
    leaf, node = mod.constructor("Leaf"), mod.constructor("Node")
    good = np.ones((1, 4), "float32")
    leaf_tag, node_tag = leaf.value(good).tag, node.value(leaf.value(good), leaf.value(good), good).tag
    return {
        "dtype inside the ADT": leaf.value(np.ones((1, 4))),
        "static dim": node.value(leaf.value(good), leaf.value(np.ones((1, 5), "float32")), good),
        "rank": leaf.value(np.ones(4, "float32")),
        "field count": ADT(node_tag, (leaf.value(good), good), constructor="Node"),
        "tag of its name": ADT(leaf_tag + 7, (good,), constructor="Leaf"),
        "unknown tag": ADT(99, (good,)),
        "constructor of another type": tv.prelude.make_some(good),
        "a tuple for the ADT": (good,),
        "a tensor for the ADT": good,
        "a Python object": object(),
        "a tuple inside": node.value(leaf.value(good), (good,), good),
    }


@pytest.mark.parametrize("case", sorted(_bad_tree_arguments(tv.parse(TREE))))
def test_argument_errors_are_the_bytecode_vm_s(case):
    _assert_the_bytecode_vm_s_argument_error(TREE, _bad_tree_arguments(tv.parse(TREE))[case], np.array(2.0, "float32"))


def _assert_the_bytecode_vm_s_argument_error(text: str, *args):
    """Native mode refuses ``args`` with the bytecode VM's exception: the same class and message."""
    with pytest.raises(Exception) as expected:  # noqa: PT011 - the bytecode VM's exception is the oracle
        VirtualMachine(native(text).with_exec_mode("bytecode")).run(*args)
    assert isinstance(expected.value, (ExecutionError, ShapeError))
    with pytest.raises(type(expected.value)) as got:
        VirtualMachine(native(text)).run(*args)
    assert type(got.value) is type(expected.value) and str(got.value) == str(expected.value)


def test_symbolic_dim_and_tuple_errors_are_the_bytecode_vm_s():
    ones = np.ones(3, "float32")
    pair = (np.array([1, 2], "int32"), np.array(0.5, "float32"))
    cases = [
        (tv.prelude.make_list([ones, np.ones(4, "float32")]), ones, pair),  # n differs inside the list
        (tv.prelude.make_list([ones]), np.ones(4, "float32"), pair),        # n differs between arguments
        (tv.prelude.make_list([ones]), ones, (np.array([1, 2, 3], "int32"), np.array(0.5, "float32"))),
        (tv.prelude.make_list([ones]), ones, (np.array([1, 2], "int64"), np.array(0.5, "float32"))),
        (tv.prelude.make_list([ones]), ones, pair[:1]),
        (tv.prelude.make_list([ones]), ones, ADT(1, pair)),
    ]
    for args in cases:
        _assert_the_bytecode_vm_s_argument_error(LIST_SUM, *args)


def test_values_only_python_converts_still_convert():
    # forms the C checks decline (nested lists, Python numbers, non-contiguous arrays, NDArrays) take the
    # Python conversion and give the interpreter's answer
    mod = tv.parse(TREE)
    leaf, node = mod.constructor("Leaf"), mod.constructor("Node")
    strided = np.arange(8, dtype="float32").reshape(1, 8)[:, ::2]
    tree = node.value(leaf.value([[1, 2, 3, 4]]), leaf.value(strided), NDArray(np.ones((1, 4), "float32")))
    want = oracle(TREE, tree, 3.0)
    assert_same(VirtualMachine(native(TREE)).run(tree, 3.0), want)
    ones = np.ones(3, "float32")
    args = (tv.prelude.make_list([ones]), ones, [np.array([1, 2], "int32"), 0.5])  # a list for the tuple
    assert_same(VirtualMachine(native(LIST_SUM)).run(*args), oracle(LIST_SUM, *args))


def test_deep_adts_in_and_out_without_recursion_error():
    # a list of 10,000 elements and a tree 10,000 deep go into C and come back (no RecursionError, no crash)
    n = 10_000
    xs = [np.full(2, i % 7, "float32") for i in range(n)]
    args = (tv.prelude.make_list(xs), np.zeros(2, "float32"), (np.array([1, 2], "int32"), np.array(1.0, "float32")))
    total, back, _ = VirtualMachine(native(LIST_SUM)).run(*args)
    np.testing.assert_allclose(total.numpy(), np.sum(xs, axis=0))
    got = tv.prelude.to_python_list(back)
    assert len(got) == n and all(np.array_equal(g.numpy(), x) for g, x in zip(got, xs))

    mod = tv.parse(TREE)
    tree = tree_of(mod, n, left_deep=True)
    total, back = VirtualMachine(native(TREE)).run(tree, np.array(1.0, "float32"))
    want = tree
    while want.constructor == "Node":
        want = want.fields[0]
    np.testing.assert_allclose(total.numpy(), want.fields[0] + n * 1.5, rtol=1e-5)
    depth = 0
    while back.constructor == "Node":
        back, depth = back.fields[0], depth + 1
    assert depth == n


def test_deep_arguments_on_a_small_thread_stack_run_on_a_deep_stack():
    import threading

    n = 10_000
    args = (tv.prelude.make_list([np.ones(2, "float32")] * n), np.zeros(2, "float32"),
            (np.array([1, 2], "int32"), np.array(1.0, "float32")))
    vm = VirtualMachine(native(LIST_SUM))
    out: list = []
    old = threading.stack_size(2 << 20)  # 2 MiB: the conversions come near its end
    try:
        worker = threading.Thread(target=lambda: out.append(vm.run(*args)))
        worker.start()
        worker.join()
    finally:
        threading.stack_size(old)
    np.testing.assert_allclose(out[0][0].numpy(), np.full(2, n, "float32"))
    assert len(tv.prelude.to_python_list(out[0][1])) == n


# --- the GIL is released during the C call ---------------------------------------------------------------
COUNT = """
def @main(%n: int64) -> float32 { @loop(%n, 0f) }
def @loop(%i: int64, %acc: float32) -> float32 {
  if (equal(%i, 0i64)) { %acc } else { @loop(subtract(%i, 1i64), add(%acc, 1f)) }
}
"""


def test_the_gil_is_released_during_a_call_and_results_freed_meanwhile_come_back_after_it():
    import threading

    vm = VirtualMachine(native(COUNT))
    kept = [vm.run(np.array(3, "int64")) for _ in range(50)]  # results viewing the VM's pool
    vm.reset_memory_stats()
    n = 2_000_000  # a call long enough for this thread to run beside it
    out: list = []
    worker = threading.Thread(target=lambda: out.append(vm.run(np.array(n, "int64"))))
    seen_busy = False
    worker.start()
    while worker.is_alive() and not seen_busy:
        try:
            vm._native_rt.reset_stats()  # refused only while a call runs: this thread ran during it
        except RuntimeError:
            seen_busy = True
            kept.clear()  # their storages go back to the pool after the call, not during it
    worker.join()
    assert seen_busy
    assert out.pop().numpy() == np.float32(n)
    stats = vm.memory_stats()  # (with every result dropped)
    assert stats["bytes_live"] == 0 and stats["num_frees"] >= 50


def test_two_vms_of_one_executable_run_in_parallel_threads():
    import threading

    exe = native(TREE)
    mod = tv.parse(TREE)
    trees = [tree_of(mod, 6, seed=k) for k in range(2)]
    want = [plain(oracle(TREE, t, np.array(1.5, "float32"))) for t in trees]
    errors: list = []

    def work(k):
        vm = VirtualMachine(exe)
        try:
            for _ in range(30):
                assert_same(vm.run(trees[k], np.array(1.5, "float32")), want[k])
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_shape_of_read_only_by_shape_functions_allocates_nothing():
    # a ShapeOf whose register only a C shape function reads is the tensor itself (its dims are the shape):
    # a straight-line call allocates one storage per AllocStorage instruction and no more (without its arena,
    # which would place the intermediate's)
    text = "def @main(%x: Tensor[(?, 3), float32], %y: Tensor[(?, 3), float32]) { multiply(add(%x, %y), %y) }"
    exe = tv.vm.compile(tv.parse(text), target="c", exec_mode="native", opt_level=0)
    main = exe.function("main")
    assert any(isinstance(ins, bc.ShapeOf) for ins in main.instructions)
    storages = sum(isinstance(ins, bc.AllocStorage) for ins in main.instructions)
    vm = VirtualMachine(exe, specialize=False)
    for rows in (2, 5, 2):
        x, y = f32(rows, 3, seed=rows), f32(rows, 3, seed=rows + 1)
        vm.reset_memory_stats()
        got = vm.run(x, y)
        assert vm.memory_stats()["num_allocations"] == storages
        np.testing.assert_allclose(got.numpy(), (x + y) * y, rtol=1e-6)


def test_time_calls_calls_c_functions_by_address_and_reports_their_errors():
    # the benchmarks' floor (kernels called from C): a C function of integer words, its return code checked
    import ctypes
    import ctypes.util

    from tensorvm.vm.native_mode import bridge_module

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    labs = ctypes.cast(libc.labs, ctypes.c_void_p).value
    time_calls = bridge_module().time_calls
    assert time_calls((labs, labs), ((0,), (0,)), 3) >= 0.0
    with pytest.raises(RuntimeError, match="call 1 returned an error"):
        time_calls((labs, labs), ((0,), (-7,)), 1)
    with pytest.raises(ValueError, match="one words tuple per address"):
        time_calls((labs,), (), 1)
    with pytest.raises(ValueError, match="at most 8 words"):
        time_calls((labs,), (tuple(range(9)),), 1)


def test_native_program_is_its_own_unit_at_native_flags(tmp_path, monkeypatch):
    """The native program compiles as a translation unit of its own at ``NATIVE_FLAGS`` (-O3 on a GRU's
    1,350-line main function took 28 s of a 31 s cold compile), the kernels at the toolchain's flags, and
    the result still matches the interpreter."""
    from tensorvm.codegen import build
    from tensorvm.codegen.module import NATIVE_FLAGS

    monkeypatch.setenv("TENSORVM_CACHE_DIR", str(tmp_path))
    units, run = [], build._run_compiler

    def recording(command, src):
        if "-c" in command:  # (a unit, not the link)
            units.append((command, Path(src).read_text()))
        return run(command, src)

    monkeypatch.setattr(build, "_run_compiler", recording)
    exe = tv.vm.compile(tv.parse(DYN), target="c", exec_mode="native")
    x, w = f32(3, 6), f32(5, 6, seed=2)
    assert_same(VirtualMachine(exe).run(x, w), oracle(DYN, x, w))
    program = [command for command, text in units if "tvn_invoke" in text]
    kernels = [command for command, text in units if "tvn_invoke" not in text and "PyInit_" not in text]
    assert len(program) == 1 and program[0][program[0].index("-c") - len(NATIVE_FLAGS):program[0].index("-c")] \
        == list(NATIVE_FLAGS)
    assert kernels and not any(set(NATIVE_FLAGS) & set(command) for command in kernels)


# --- reference cells ----------------------------------------------------------------------------------
def test_the_reference_cell_tag_is_the_same_in_python_and_c():
    header = (Path(tv.__file__).parent / "vm" / "native" / "tv_runtime.h").read_text()
    assert "#define TV_REF_TAG (((int64_t)((1 << 30) - 1)) << 24)" in header
    assert bc.REF_TAG == ((1 << 30) - 1) << 24 and bc.REF_WRITE_TAG == bc.REF_TAG + 1


CELL_LOOP = next(p for p in PROGRAMS if p.name == "reference_cell_written_in_a_loop").text


def test_a_cell_written_by_closures_in_a_loop_runs_natively_and_again():
    """Cells in native mode: written by a closure a recursive closure calls, freed with the call (the pool's
    live bytes back to zero), the same on the first call and after many, and after save/load."""
    exe = native(CELL_LOOP)
    x = np.array([1.0, -2.0, 0.5], np.float32)
    for vm in (VirtualMachine(exe), VirtualMachine(load_executable(exe.save_bytes()))):
        assert vm.exec_stats()["exec_mode"] == "native"
        for n in (0, 3, 50, 3):
            np.testing.assert_allclose(vm.run(x, np.int32(n)).numpy(), x * (1 + n * (n - 1) / 2), rtol=1e-6)
        assert vm.memory_stats()["bytes_live"] == 0


def test_a_reference_crossing_between_python_and_native_code_is_refused():
    """A cell copied into Python (or from it) would not share its writes: ``main`` taking or returning one is
    refused when compiled (``exec_mode="auto"`` then keeps the bytecode loop, which hands the cell itself
    over), and a cell inside a closure returned to Python is an ExecutionError at the call."""
    returns = tv.parse("def @main(%x: int32) -> ref(int32) { let %r = ref(%x); let %_ = ref_write(%r, add(%x, 1)); %r }")
    with pytest.raises(UnsupportedError, match="main takes or returns a reference"):
        tv.vm.compile(returns, target="c", exec_mode="native")
    auto = tv.vm.compile(returns, target="c")
    assert auto.exec_mode == "bytecode"
    cell = VirtualMachine(auto).run(np.int32(4))
    assert int(np.asarray(cell.value)) == 5 and repr(cell) == f"RefValue({cell.value!r})"
    captures = tv.parse("def @main(%x: int32) -> fn () -> int32 { let %r = ref(%x); "
                        "fn () -> int32 { let %_ = ref_write(%r, add(ref_read(%r), 1)); ref_read(%r) } }")
    with pytest.raises(ExecutionError, match="reference cannot be handed to Python"):
        VirtualMachine(native_exe := tv.vm.compile(captures, target="c", exec_mode="native")).run(np.int32(4))
    assert native_exe.exec_mode == "native"


def test_a_reference_in_the_signature_of_another_global_is_refused_at_its_call():
    """A global other than ``main`` may take or return a cell (main uses it inside the program, where cells are
    native); calling it from Python in native mode is an ExecutionError, returned bare, in a tuple or in an ADT,
    and passed in (the bytecode loop hands the cell itself over and shares its writes)."""
    mod = tv.parse("""
def @mk(%x: Tensor[(?), float32]) -> (ref(Tensor[(?), float32]), Option[ref(Tensor[(?), float32])]) {
  let %r = ref(%x); (%r, Some(%r))
}
def @dbl(%r: ref(Tensor[(?), float32])) -> Tensor[(?), float32] { let %_ = ref_write(%r, ref_read(%r) * 2f); ref_read(%r) }
def @main(%x: Tensor[(?), float32]) -> Tensor[(?), float32] { @dbl(@mk(%x).0) }
""")
    x = np.arange(3, dtype=np.float32)
    vm = VirtualMachine(tv.vm.compile(mod, target="c", exec_mode="native"))
    np.testing.assert_array_equal(vm.run(x).numpy(), 2 * x)
    with pytest.raises(ExecutionError, match="reference cannot be handed to Python"):
        vm["mk"](x)
    with pytest.raises(ExecutionError, match="reference cannot be passed from Python"):
        vm["dbl"](RefValue(x.copy()))
    bytecode = VirtualMachine(tv.vm.compile(mod, target="c", exec_mode="bytecode"))
    cell, some = bytecode["mk"](x)
    assert some.fields[0] is cell
    np.testing.assert_array_equal(bytecode["dbl"](cell).numpy(), 2 * x)
    np.testing.assert_array_equal(np.asarray(cell.value), 2 * x)  # (the program's write, seen by the caller)

