"""exec_mode="native" (docs/native_mode.md): VM functions compiled to C, one C entry point per call.

Oracle: the interpreter (``tv.create_executor("debug", mod)``) and NumPy; errors are compared with the
bytecode VM's exception types on the same program.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.codegen.build import have_compiler
from tensorvm.errors import ExecutionError, ShapeError, UnsupportedError
from tensorvm.runtime.ndarray import NDArray
from tensorvm.runtime.object import ADT
from tensorvm.vm import VirtualMachine, load_executable
from tensorvm.vm import bytecode as bc
from tensorvm.vm.executable import Executable

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


def test_an_instruction_it_cannot_translate_is_refused_when_compiled():
    fn = bc.VMFunction("main", ("x",), (bc.DeviceCopy(0, 0, 0, 1), bc.Ret(1)), 2)
    exe = Executable([fn], exec_mode="native", target="c")
    with pytest.raises(UnsupportedError, match="DeviceCopy"):
        exe.kernels  # noqa: B018
    with pytest.raises(UnsupportedError, match="DeviceCopy"):
        VirtualMachine(exe)


def test_instrument_hooks_are_refused_not_ignored():
    vm = VirtualMachine(native(DYN))
    with pytest.raises(UnsupportedError, match="instrument"):
        vm.set_instrument(lambda *a: None)


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
