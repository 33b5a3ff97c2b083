"""The VM's Python interface: executors, stateful calls, argument checks, instrumentation, profiling,
benchmarking, recovery after errors, memory statistics and storage coalescing."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.errors import ExecutionError, ShapeError, UnsupportedError
from tensorvm.prelude import make_list
from tensorvm.runtime.ndarray import NDArray
from tensorvm.runtime.object import RefValue
from tensorvm.vm import SKIP_RUN, VirtualMachine
from tensorvm.vm.profiler import ProfileReport

MODES = ["bytecode", "compiled"]

DYNAMIC_ADD = """
def @main(%x: Tensor[(?, ?), float32], %y: Tensor[(1, 2), float32]) {
  add(%x, %y)
}
"""

TWO_OUTPUTS = """
def @main(%x: Tensor[(n, 3), float32], %v: Tensor[(n), float32], %k: float32) {
  (multiply(%x, %k), add(%v, %k))
}
"""

SUM_UP = """
def @main(%i: int32) -> int32 { @sum_up(%i) }
def @sum_up(%i1: int32) -> int32 {
  %0 = equal(%i1, 0);
  if (%0) { %i1 } else { %1 = subtract(%i1, 1); %2 = @sum_up(%1); add(%2, %i1) }
}
"""

MLP4 = """
def @main(%x: Tensor[(8, 32), float32], %w1: Tensor[(64, 32), float32], %w2: Tensor[(64, 64), float32],
          %w3: Tensor[(64, 64), float32], %w4: Tensor[(10, 64), float32]) {
  %0 = nn.relu(nn.dense(%x, %w1));
  %1 = nn.relu(nn.dense(%0, %w2));
  %2 = nn.relu(nn.dense(%1, %w3));
  nn.dense(%2, %w4)
}
"""


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


@pytest.fixture(params=MODES)
def mode(request):
    return request.param


def vm_for(text, mode="bytecode", **kwargs):
    return VirtualMachine(tv.vm.compile(tv.parse(text), exec_mode=mode), **kwargs)


def test_create_executor_vm_works_like_debug():
    mod = tv.parse(TWO_OUTPUTS)
    x, v = rand(4, 3), rand(4, seed=1)
    debug = tv.create_executor("debug", mod).evaluate()(x, v, 2.0)
    vm = tv.create_executor("vm", mod).evaluate()(x, v, 2.0)
    assert isinstance(vm, tuple) and all(isinstance(t, NDArray) for t in vm)
    for a, b in zip(vm, debug):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
    # params bind parameters as constants
    bound = tv.create_executor("vm", mod, params={"x": x}).evaluate()(v, np.float32(3.0))
    np.testing.assert_allclose(bound[0].numpy(), x * 3, rtol=1e-6)


def test_stateful_interface_and_input_index(mode):
    vm = vm_for(TWO_OUTPUTS, mode)
    x, v = rand(2, 3), rand(2, seed=1)
    vm.set_input("main", x, k=np.float32(0.5), v=v)
    vm.invoke_stateful("main")
    outputs = vm.get_outputs()
    assert len(outputs) == 2 == vm.get_num_outputs()
    np.testing.assert_allclose(outputs[0].numpy(), x * 0.5, rtol=1e-6)
    np.testing.assert_allclose(vm.get_output(1).numpy(), v + 0.5, rtol=1e-6)
    # invoke with no arguments uses the stored inputs
    np.testing.assert_allclose(vm.invoke("main")[1].numpy(), v + 0.5, rtol=1e-6)
    assert [vm.get_input_index(n) for n in ("x", "v", "k", "nope")] == [0, 1, 2, -1]
    single = vm_for(DYNAMIC_ADD, mode)
    single.set_input("main", rand(3, 2), rand(1, 2))
    single.invoke_stateful("main")
    assert len(single.get_outputs()) == 1 and single.get_outputs()[0].shape == (3, 2)
    with pytest.raises(ExecutionError, match="set_input"):
        vm_for(DYNAMIC_ADD, mode).invoke_stateful("main")


def test_argument_errors_name_the_parameter(mode):
    vm = vm_for(TWO_OUTPUTS, mode)
    x, v = rand(4, 3), rand(4)
    with pytest.raises(ExecutionError, match="parameter 'x': expected dtype float32, got float64"):
        vm.invoke("main", x.astype("float64"), v, 1.0)
    with pytest.raises(ShapeError, match="parameter 'x': dimension 1 must be 3"):
        vm.invoke("main", rand(4, 2), v, 1.0)
    with pytest.raises(ShapeError, match="parameter 'v'.*symbolic dimension n, bound to 4"):
        vm.invoke("main", x, rand(5), 1.0)
    with pytest.raises(ShapeError, match="parameter 'k': expected rank 0"):
        vm.invoke("main", x, v, np.ones(2, "float32"))
    with pytest.raises(ExecutionError, match="no function 'nope'"):
        vm.invoke("nope")
    # Python numbers take the parameter's dtype; a float where an int is expected does not
    assert vm.invoke("main", x, v, 2)[0].dtype == "float32"
    ints = vm_for(SUM_UP, mode)
    with pytest.raises(ExecutionError, match="parameter 'i': expected int32"):
        ints.invoke("main", 2.5)


def test_results_stay_valid_while_the_vm_runs_again(mode):
    vm = vm_for(DYNAMIC_ADD, mode)
    y = rand(1, 2)
    first = vm.invoke("main", np.zeros((3, 2), "float32"), y)
    kept = first.numpy().copy()
    for i in range(5):
        vm.invoke("main", np.full((3, 2), i, "float32"), y)
    np.testing.assert_array_equal(first.numpy(), kept)  # its storage was not handed out again
    del first
    assert vm.memory_stats()["bytes_live"] == 0


def test_vm_is_usable_after_a_failed_call(mode):
    vm = vm_for(DYNAMIC_ADD, mode)
    with pytest.raises(ShapeError, match=r"add.*pc \d+"):
        vm.invoke("main", rand(3, 5), rand(1, 2))
    out = vm.invoke("main", rand(3, 2), rand(1, 2, seed=1))
    np.testing.assert_allclose(out.numpy(), rand(3, 2) + rand(1, 2, seed=1), rtol=1e-6)
    del out
    assert vm.memory_stats()["bytes_live"] == 0  # nothing leaked from the failed call


def test_fatal_from_an_incomplete_match_names_the_function(mode):
    vm = vm_for("""
def @first(%l: List[int32]) -> int32 { match? (%l) { Cons(%h, _) => %h, } }
def @main(%l: List[int32]) -> int32 { @first(%l) }
""", mode)
    assert vm.invoke("main", make_list([np.int32(7)])).numpy() == 7
    with pytest.raises(ExecutionError, match="Fatal.*'first' at pc"):
        vm.invoke("main", make_list([]))


def test_instrument_sees_kernels_and_shape_functions_and_can_skip(mode):
    vm = vm_for(DYNAMIC_ADD, mode)
    seen = []

    def record(name, before_run, ret_value, *args):
        seen.append((name, before_run, [a.shape for a in args]))

    vm.set_instrument(record)
    vm.invoke("main", rand(3, 2), rand(1, 2))
    names = [name for name, before, _ in seen if before]
    assert names == ["shape_func_fused_add", "fused_add"]
    assert seen[-1] == ("fused_add", False, [(3, 2), (1, 2), (3, 2)])

    def fill_instead(name, before_run, ret_value, *args):
        if name == "fused_add" and before_run:
            args[-1].numpy()[...] = 42.0
            return SKIP_RUN
    vm.set_instrument(fill_instead)
    assert np.all(vm.invoke("main", rand(2, 2), rand(1, 2)).numpy() == 42.0)
    vm.set_instrument(None)
    np.testing.assert_allclose(vm.invoke("main", rand(2, 2), rand(1, 2)).numpy(), rand(2, 2) + rand(1, 2),
                               rtol=1e-6)


def test_profile_reports_kernels_and_vm_ops(mode):
    vm = vm_for(DYNAMIC_ADD, mode)
    report = vm.profile("main", rand(5, 2), rand(1, 2))
    names = set(report.names)
    assert {"fused_add", "shape_func_fused_add", "VM::AllocStorage", "VM::AllocTensorReg", "VM::ShapeOf"} <= names
    add = report.row("fused_add")
    assert add.calls == 1 and add.total_us > 0 and add.kind == "kernel"
    assert add.arg_shapes == ("float32[5, 2], float32[1, 2], float32[5, 2]",)
    assert sum(r.share_pct for r in report.rows) <= 100.0 + 1e-6
    table = str(report)
    assert "fused_add" in table and "Total" in table and "Argument Shapes" in table
    csv_lines = report.csv().splitlines()
    assert csv_lines[0].startswith("name,kind,calls,total_us") and len(csv_lines) == len(report.rows) + 1
    data = json.loads(report.json())
    assert data["configuration"]["Executor"] == "VM" and len(data["rows"]) == len(report.rows)
    assert ProfileReport.from_json(report.json()).rows == report.rows
    np.testing.assert_allclose(report.result.numpy(), rand(5, 2) + rand(1, 2), rtol=1e-6)
    # profiling leaves the plain program in place
    assert vm.invoke("main", rand(2, 2), rand(1, 2)).shape == (2, 2)


def test_profile_of_a_loaded_executable_counts_recursive_calls():
    exe = tv.vm.load_executable(tv.vm.compile(tv.parse(SUM_UP)).save_bytes())
    report = VirtualMachine(exe).profile("main", 5)
    assert report.row("fused_equal").calls == 6 and report.row("fused_add").calls == 5
    assert report.result.numpy() == 15


def test_benchmark_statistics(mode):
    vm = vm_for(DYNAMIC_ADD, mode)
    result = vm.benchmark("main", rand(4, 2), rand(1, 2), number=3, repeat=4)
    assert len(result.results) == 4
    assert 0 < result.min <= result.median <= result.max and result.min <= result.mean <= result.max
    assert "median" in str(result)


def test_benchmark_rejects_a_count_below_one(mode):
    vm = vm_for(DYNAMIC_ADD, mode)
    for counts in ({"number": 0}, {"repeat": -1}, {"number": 1.5}):
        with pytest.raises(ExecutionError, match="benchmark: expected number .* and repeat .* to be positive "
                                                 "integers, got number="):
            vm.benchmark("main", rand(4, 2), rand(1, 2), **counts)


def test_get_output_out_of_range_names_the_index_and_the_count(mode):
    vm = vm_for(TWO_OUTPUTS, mode)
    vm.invoke_stateful("main", rand(2, 3), rand(2, seed=1), np.float32(1))
    for index in (2, 3, -1):  # (no negative index: as the graph executor's get_output)
        with pytest.raises(ExecutionError, match=rf"output index {index} is out of range; .* gave 2 output\(s\)"):
            vm.get_output(index)
    np.testing.assert_allclose(vm.get_output(np.int64(1)).numpy(), vm.get_outputs()[1].numpy())


def test_with_exec_mode_rejects_an_unknown_mode_as_compile_does():
    exe = tv.vm.compile(tv.parse(DYNAMIC_ADD), exec_mode="bytecode")
    with pytest.raises(UnsupportedError, match="unknown exec_mode 'bogus'; expected one of"):
        exe.with_exec_mode("bogus")
    assert exe.with_exec_mode("compiled").exec_mode == "compiled"


def test_static_mlp_storage_is_coalesced():
    mod = tv.parse(MLP4)
    args = [rand(8, 32), rand(64, 32, seed=1), rand(64, 64, seed=2), rand(64, 64, seed=3), rand(10, 64, seed=4)]
    stats = {}
    for plan in (True, False):
        vm = VirtualMachine(tv.vm.compile(mod, memory_plan=plan), allocator="naive")
        out = vm.invoke("main", *args)
        stats[plan] = vm.memory_stats()
        expected = args[0]
        for w in args[1:-1]:
            expected = np.maximum(expected @ w.T, 0)
        np.testing.assert_allclose(out.numpy(), expected @ args[-1].T, rtol=1e-4, atol=1e-4)
    # three (8, 64) float32 intermediates share one arena (two of them at the same offset), plus the output
    assert stats[True]["num_allocations"] == 2 and stats[False]["num_allocations"] == 4
    assert stats[True]["peak_bytes"] == 2 * 8 * 64 * 4 + 8 * 10 * 4
    assert stats[True]["peak_bytes"] < stats[False]["peak_bytes"]


def test_pooled_allocator_frees_blocks_of_the_heaps_sizes_and_caches_the_rest(mode):
    """Results of 256 KB up to 32 MB go back to the C library's heap when dropped (nothing of them stays
    reserved and nothing is reused from a class cache); small ones stay cached and are reused."""
    vm = vm_for(DYNAMIC_ADD, mode)
    y = rand(1, 2, seed=1)
    for rows in (40000, 36000, 40000):  # 320,000 and 288,000 bytes
        x = rand(rows, 2, seed=rows)
        out = vm.invoke("main", x, y)
        np.testing.assert_allclose(out.numpy(), x + y, rtol=1e-6)
        del out
    stats = vm.memory_stats()
    assert stats["bytes_live"] == 0 and stats["bytes_reserved"] == 0 and stats["reuse_hits"] == 0
    for seed in (2, 3):
        x = rand(16, 2, seed=seed)
        np.testing.assert_allclose(vm.invoke("main", x, y).numpy(), x + y, rtol=1e-6)
    stats = vm.memory_stats()
    assert stats["reuse_hits"] == 1 and stats["bytes_reserved"] == 128


def test_python_pool_frees_blocks_of_the_heaps_sizes():
    """The same rule on the pool's Python path (no compiled helper attached)."""
    from tensorvm.runtime.memory import PooledAllocator

    pool = PooledAllocator()
    for nbytes in (300_000, 1 << 25, 1000, 1000, 300_000, 1 << 25):
        storage = pool.alloc(nbytes)
        assert storage.nbytes == nbytes
        del storage
    stats = pool.stats()  # the 32 MB block (above the heap's sizes) and the 1 KB one are cached and reused
    assert stats["reuse_hits"] == 2 and stats["bytes_live"] == 0
    assert stats["bytes_reserved"] == (1 << 25) + 1024


def test_the_heaps_sizes_are_the_same_in_python_the_helper_and_the_native_runtime():
    import re
    from pathlib import Path

    from tensorvm.runtime.memory import HEAP_BLOCKS

    native = Path(tv.__file__).parent / "vm" / "native"
    header = (native / "tv_runtime.h").read_text()
    bounds = [int(re.search(rf"#define TV_POOL_HEAP_{end} \(\(int64_t\)1 << (\d+)\)", header).group(1))
              for end in ("MIN", "MAX")]
    helper = re.search(r"heap_block\(Py_ssize_t size\) \{ return size >= \(\(Py_ssize_t\)1 << (\d+)\) && "
                       r"size < \(\(Py_ssize_t\)1 << (\d+)\)", (native / "fastcall.c").read_text())
    assert (1 << bounds[0], 1 << bounds[1]) == (HEAP_BLOCKS.start, HEAP_BLOCKS.stop)
    assert [int(g) for g in helper.groups()] == bounds


def test_pooled_allocator_reuses_blocks_across_calls(mode):
    vm = vm_for(DYNAMIC_ADD, mode)
    vm.invoke("main", rand(16, 2), rand(1, 2))
    first = vm.memory_stats()["num_allocations"]
    assert first >= 1 and vm.memory_stats()["reuse_hits"] == 0
    for _ in range(4):
        vm.invoke("main", rand(16, 2), rand(1, 2))
    stats = vm.memory_stats()  # after the first call, every block comes from the pool
    assert stats["num_allocations"] == 5 * first and stats["reuse_hits"] == 4 * first and stats["bytes_live"] == 0
    naive = vm_for(DYNAMIC_ADD, mode, allocator="naive")
    naive.invoke("main", rand(16, 2), rand(1, 2))
    assert naive.memory_stats()["reuse_hits"] == 0 and naive.memory_stats()["bytes_reserved"] == 0


def test_adt_arguments_built_in_python(mode):
    mod = tv.parse("""
def @main(%l: List[float32]) -> float32 { @sum(%l) }
def @sum(%l: List[float32]) -> float32 { match (%l) { Cons(%h, %t) => add(%h, @sum(%t)), Nil => 0f, } }
""")
    vm = VirtualMachine(tv.vm.compile(mod, exec_mode=mode))
    cons, nil = mod.constructor("Cons"), mod.constructor("Nil")
    lst = cons(np.float32(1.5), cons(np.float32(2.0), nil()))
    assert vm.invoke("main", lst).numpy() == np.float32(3.5)


def test_deep_non_tail_recursion(mode):
    vm = vm_for(SUM_UP, mode)
    n = 5000
    assert vm.invoke("main", n).numpy() == n * (n + 1) // 2


@pytest.mark.parametrize("mode", ["bytecode", "compiled"])
def test_a_recursion_whose_frames_hold_too_many_registers_is_a_clear_error(mode, monkeypatch):
    """The registers all frames of a call hold are bounded, not only their count: with a bound of 60,000
    registers (``@sum_up`` has about 20), 1,500 nested calls run and 30,000 are an error."""
    import gc

    from tensorvm.vm import vm as vm_module

    monkeypatch.setattr(vm_module, "MAX_STACK_REGISTERS", 60_000)
    vm = vm_for(SUM_UP, mode)
    assert vm.invoke("main", 1500).numpy() == 1500 * 1501 // 2
    with pytest.raises(ExecutionError, match="registers|recursion deeper than 2"):
        vm.invoke("main", 30_000)
    assert vm.invoke("main", 100).numpy() == 5050 and gc.isenabled()


def test_a_recursion_that_never_ends_is_an_error_within_2_gb(tmp_path):
    """A recursion that never ends (what a mutated file made of ``@sum_up``: the loader fuzzer) meets the
    VM's limits before the memory runs out, in a process of 2 GB of address space: a clear error, not a
    crash while the error is built (every exec mode)."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    script = tmp_path / "never_ends.py"
    script.write_text(textwrap.dedent(f"""
        import resource
        import tensorvm as tv
        from tensorvm.errors import ExecutionError
        modes = (("python", "bytecode"), ("python", "compiled"), ("c", "native"))
        exes = [tv.vm.compile(tv.parse({SUM_UP!r}), target=target, exec_mode=mode) for target, mode in modes]
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # (after the C compiler's run)
        for exe in exes:
            vm = tv.vm.VirtualMachine(exe)
            try:
                vm.invoke("main", -1)
                raise AssertionError("no error")
            except ExecutionError as err:
                assert any(w in str(err) for w in ("stack overflow", "recursion deeper", "recursion too deep")), err
            assert int(vm.invoke("main", 10).numpy()) == 55
        print("ok")
    """))
    env = dict(os.environ, PYTHONPATH=str(Path(tv.__file__).resolve().parents[1]))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


@pytest.mark.parametrize("mode", ["bytecode", "native"])
def test_a_python_tuple_is_not_a_tensor_argument(mode):
    """A tuple given for a tensor parameter is an ExecutionError in the VM, as in the interpreter (the VM had
    made it a tensor); a list still is one."""
    mod = tv.parse("def @main(%x: Tensor[(?), float32]) { %x * 2f }")
    runs = {"vm": VirtualMachine(tv.vm.compile(mod, target="c", exec_mode=mode))["main"],
            "interpreter": tv.create_executor("debug", mod).evaluate()}
    for where, run in runs.items():
        with pytest.raises(ExecutionError, match="tuple"):
            run((1.0, 2.0))
        np.testing.assert_array_equal(run([1.0, 2.0]).numpy(), np.array([2, 4], np.float32), err_msg=where)


def test_an_executable_without_kernels_saves_with_embed_library(tmp_path):
    """``embed_library=True`` on an executable that has no kernel library (no kernels, bytecode): nothing to
    embed, the file is written and runs after loading (it was refused with an empty reason)."""
    mod = tv.parse("def @main(%x: int32) -> Option[int32] { Some(%x) }")
    path = tmp_path / "some.tvx"
    tv.vm.compile(mod, target="c", exec_mode="bytecode").save(str(path), embed_library=True)
    got = VirtualMachine(tv.vm.load_executable(str(path)))["main"](np.int32(3))
    assert got.constructor == "Some" and int(got.fields[0].numpy()) == 3


def test_compile_options_and_python_view():
    mod = tv.parse(DYNAMIC_ADD)
    with pytest.raises(UnsupportedError, match="unknown target 'cuda'"):
        tv.vm.compile(mod, target="cuda")
    with pytest.raises(UnsupportedError, match="unknown exec_mode 'jit'"):
        tv.vm.compile(mod, exec_mode="jit")
    exe = tv.vm.compile(mod, exec_mode="compiled")
    source = exe.as_python()
    assert "def f0(r0, r1):  # main(x, y)" in source and "shape_func_fused_add" in source
    assert exe.exec_mode == "compiled"
    assert tv.vm.load_executable(exe.save_bytes()).exec_mode == "compiled"


def test_adt_arguments_are_checked_against_their_declared_types(mode):
    # the interpreter is the oracle for what is accepted and how it is converted
    text = """
def @main(%l: List[Tensor[(n), float64]], %x: Tensor[(n), float64]) -> Tensor[(n), float64] {
  match (%l) { Cons(%h, _) => add(%h, %x), Nil => %x, }
}
"""
    vm = vm_for(text, mode)
    debug = tv.create_executor("debug", tv.parse(text)).evaluate()
    x = np.arange(3.0)
    for good in (make_list([[1, 2, 3]]), make_list([np.ones(3), np.zeros(3)]), make_list([])):
        got, want = vm.invoke("main", good, x), debug(good, x)
        assert got.dtype == want.dtype == "float64"
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    with pytest.raises(ExecutionError, match=r"parameter 'l'\.Cons\[0\] expects Tensor\[\(n\), float64\]"):
        vm.invoke("main", make_list([np.ones(3, "float32")]), x)
    with pytest.raises(ShapeError, match=r"parameter 'x'.*n"):  # n bound by the list's element
        vm.invoke("main", make_list([np.ones(2)]), x)
    with pytest.raises(ShapeError, match=r"parameter 'l'\.Cons\[1\]\.Cons\[0\] .* of rank 1"):
        vm.invoke("main", make_list([np.ones(3), 1.5]), x)
    with pytest.raises(ExecutionError, match="parameter 'l' expects a value of type List, got a Some value"):
        vm.invoke("main", tv.prelude.make_some(np.ones(3)), x)
    with pytest.raises(ExecutionError, match="parameter 'l'.*got a Python int"):
        vm.invoke("main", 3, x)


def test_adt_inside_a_tuple_argument_is_checked(mode):
    vm = vm_for("def @main(%t: (int32, Option[float64])) -> float64 { match (%t.1) { Some(%v) => %v, None => 0f64, } }",
                mode)
    assert vm.invoke("main", (1, tv.prelude.make_some(2.5))).numpy() == np.float64(2.5)
    with pytest.raises(ExecutionError, match=r"parameter 't'.*Some\[0\] expects float64"):
        vm.invoke("main", (1, tv.prelude.make_some(np.float32(2.5))))


CLOSURES = """
def @make(%k: int32) -> fn (int32) -> int32 { fn (%x: int32) -> int32 { add(%x, %k) } }
def @apply(%f: fn (int32) -> int32, %y: int32) -> int32 { %f(%y) }
def @apply_first(%fs: List[fn (int32) -> int32]) -> int32 { match (%fs) { Cons(%f, _) => %f(1), Nil => 0, } }
def @main(%k: int32) -> int32 { @apply(@make(%k), 1) }
"""


def test_closures_are_accepted_only_by_their_executable(mode):
    exe = tv.vm.compile(tv.parse(CLOSURES), exec_mode=mode)
    vm = VirtualMachine(exe)
    closure = vm.invoke("make", 5)
    assert vm.invoke("apply", closure, 3).numpy() == 8
    assert vm.invoke("apply_first", make_list([closure])).numpy() == 6
    # another VM of the same executable, or of it in the other exec mode, shares the function table
    assert VirtualMachine(exe).invoke("apply", closure, 4).numpy() == 9
    other_mode = "compiled" if mode == "bytecode" else "bytecode"
    assert VirtualMachine(exe.with_exec_mode(other_mode)).invoke("apply", closure, 4).numpy() == 9
    # the same text compiled again, a loaded copy, and a different program are other executables
    for foreign_exe in (tv.vm.compile(tv.parse(CLOSURES), exec_mode=mode), tv.vm.load_executable(exe.save_bytes())):
        foreign = VirtualMachine(foreign_exe)
        with pytest.raises(ExecutionError, match="parameter 'f': .*made by another executable"):
            foreign.invoke("apply", closure, 3)
        with pytest.raises(ExecutionError, match="parameter 'fs': .*made by another executable"):
            foreign.invoke("apply_first", make_list([closure]))
    with pytest.raises(ExecutionError, match="parameter 'f': expected a VM closure"):
        vm.invoke("apply", lambda x: x, 3)


def test_large_models_return_freed_memory_after_compiling(monkeypatch):
    """``compile`` counts a model's constant bytes (bound params and literals) and trims the C heap on
    entry and exit only for a large model (a trim collects garbage, too slow for every small compile)."""
    from tensorvm.runtime import memory
    from tensorvm.vm import compiler

    text = """
def @main(%x: Tensor[(4, 8), float32], %w: Tensor[(16, 8), float32]) {
  add(nn.dense(%x, %w), meta_bias)
}""".replace("meta_bias", 'ones(shape=[16], dtype="float32")')
    mod = tv.parse(text)
    w = np.ones((16, 8), "float32")
    assert compiler._constant_bytes(mod, {"w": w}) == w.nbytes  # ones(...) is still a call here
    folded = tv.transform.FoldConstant()(tv.transform.InferType()(mod))
    assert compiler._constant_bytes(folded, {"w": w}) == w.nbytes + 16 * 4
    calls = []
    monkeypatch.setattr(memory, "return_free_memory", lambda: calls.append(1))
    x = np.ones((4, 8), "float32")
    for limit, expected in ((1 << 30, []), (w.nbytes, [1, 1])):
        calls.clear()
        monkeypatch.setattr(memory, "LARGE_MODEL_BYTES", limit)
        vm = tv.vm.VirtualMachine(tv.vm.compile(mod, params={"w": w}))
        np.testing.assert_allclose(vm.invoke("main", x).numpy(), x @ w.T + 1)
        assert calls == expected
    monkeypatch.undo()
    memory.return_free_memory()  # the real one runs (a no-op where the C library has no malloc_trim)


# ---- the Relay VM's invoke_stateful(name, *args), set_one_input, invoke_with_outputs ---------------

def test_invoke_stateful_with_arguments_sets_the_inputs_then_runs(mode):
    vm = vm_for(TWO_OUTPUTS, mode)
    x, v = rand(2, 3), rand(2, seed=1)
    vm.invoke_stateful("main", x, v, k=np.float32(2))
    np.testing.assert_allclose(vm.get_output(0).numpy(), x * 2, rtol=1e-6)
    np.testing.assert_allclose(vm.get_output(1).numpy(), v + 2, rtol=1e-6)
    # the inputs stay set, as set_input leaves them
    vm.invoke_stateful("main")
    np.testing.assert_allclose(vm.get_output(1).numpy(), v + 2, rtol=1e-6)
    np.testing.assert_allclose(vm.invoke("main")[0].numpy(), x * 2, rtol=1e-6)
    with pytest.raises(ShapeError, match="parameter 'v'.*symbolic dimension n"):
        vm.invoke_stateful("main", x, rand(3), np.float32(1))


def test_set_one_input_by_index_and_by_name_keeps_the_others(mode):
    vm = vm_for(TWO_OUTPUTS, mode)
    x, v = rand(2, 3), rand(2, seed=1)
    vm.set_one_input("main", 0, x)
    with pytest.raises(ExecutionError, match="input\\(s\\) v, k not set"):
        vm.invoke("main")
    vm.set_one_input("main", "v", v)
    vm.set_one_input("main", k=np.float32(3))
    out = vm.invoke("main")
    np.testing.assert_allclose(out[0].numpy(), x * 3, rtol=1e-6)
    np.testing.assert_allclose(out[1].numpy(), v + 3, rtol=1e-6)
    # replacing one input after set_input keeps the other two
    vm.set_input("main", x, v, np.float32(1))
    vm.set_one_input("main", 2, np.float32(-1))
    vm.invoke_stateful("main")
    np.testing.assert_allclose(vm.get_output(0).numpy(), -x, rtol=1e-6)
    np.testing.assert_allclose(vm.get_output(1).numpy(), v - 1, rtol=1e-6)
    # the inputs are checked together when they run: n is 2 for x, 5 for the new v
    vm.set_one_input("main", "v", rand(5))
    with pytest.raises(ShapeError, match="symbolic dimension n"):
        vm.invoke("main")
    vm.set_one_input("main", "v", v)  # fixed: runs again
    np.testing.assert_allclose(vm.invoke("main")[1].numpy(), v - 1, rtol=1e-6)


def test_set_one_input_errors(mode):
    vm = vm_for(TWO_OUTPUTS, mode)
    with pytest.raises(ExecutionError, match="parameter 'x': expected dtype float32, got float64"):
        vm.set_one_input("main", 0, rand(2, 3).astype("float64"))  # checked when set
    with pytest.raises(ExecutionError, match="no parameter 'w'"):
        vm.set_one_input("main", "w", rand(2))
    with pytest.raises(ExecutionError, match=r"an index in \[0, 3\) but got 3"):
        vm.set_one_input("main", 3, rand(2))
    with pytest.raises(ExecutionError, match="expected one index or parameter name and one value"):
        vm.set_one_input("main", rand(2))
    with pytest.raises(ExecutionError, match="expected one index or parameter name and one value"):
        vm.set_one_input("main", x=rand(2, 3), v=rand(2))


def test_set_one_input_of_adt_and_tuple_parameters(mode):
    text = """
    def @main(%l: List[Tensor[(n), float32]], %x: Tensor[(n), float32], %t: (Tensor[(n), float32], int32)) {
      match %l { Cons(%h, _) => %h + %x * %t.0, Nil => %x }
    }
    """
    mod = tv.parse(text)
    vm = VirtualMachine(tv.vm.compile(mod, exec_mode=mode))
    cons, nil = mod.constructor("Cons"), mod.constructor("Nil")
    h, x, t = rand(3), rand(3, seed=1), rand(3, seed=2)
    vm.set_one_input("main", "t", (t, np.int32(0)))
    vm.set_one_input("main", 0, cons(h, nil()))
    vm.set_one_input("main", "x", x)
    np.testing.assert_allclose(vm.invoke("main").numpy(), h + x * t, rtol=1e-6)
    vm.set_one_input("main", "l", nil())
    np.testing.assert_allclose(vm.invoke("main").numpy(), x)


def test_invoke_with_outputs_writes_into_the_callers_arrays(mode):
    vm = vm_for(TWO_OUTPUTS, mode)
    x, v = rand(2, 3), rand(2, seed=1)
    out0, out1 = np.full((2, 3), np.nan, "float32"), NDArray(np.full(2, np.nan, "float32"))
    assert vm.invoke_with_outputs("main", {"x": x, "v": v, "k": np.float32(4)}, [out0, out1]) is None
    np.testing.assert_allclose(out0, x * 4, rtol=1e-6)
    np.testing.assert_allclose(out1.numpy(), v + 4, rtol=1e-6)
    # no input_args: the inputs set before (here by the previous call)
    out0[...] = 0
    vm.invoke_with_outputs("main", None, [out0, out1])
    np.testing.assert_allclose(out0, x * 4, rtol=1e-6)
    # a single result, inputs by position; a non-contiguous output array is written in place
    single = vm_for(DYNAMIC_ADD, mode)
    a, b = rand(3, 2), rand(1, 2, seed=1)
    big = np.zeros((2, 3), "float32")
    single.invoke_with_outputs("main", [a, b], [big.T])
    np.testing.assert_allclose(big.T, a + b, rtol=1e-6)


def test_invoke_with_outputs_mismatches_are_clear_errors_and_write_nothing(mode):
    vm = vm_for(TWO_OUTPUTS, mode)
    x, v = rand(2, 3), rand(2, seed=1)
    vm.set_input("main", x, v, np.float32(1))
    good0, good1 = np.zeros((2, 3), "float32"), np.zeros(2, "float32")
    cases = [
        ([good0, np.zeros(2, "float64")], "output 1 of main is a float32 tensor of shape \\(2,\\), but the array "
                                          "given for it is a float64 tensor of shape \\(2,\\)"),
        ([good0, np.zeros(3, "float32")], "output 1 .* shape \\(2,\\), but the array given for it is a float32 "
                                          "tensor of shape \\(3,\\)"),
        ([good0, np.zeros((1, 2), "float32")], "output 1 .* shape \\(1, 2\\)"),  # no broadcasting either
        ([good0], "main has 2 result\\(s\\) but 1 output array\\(s\\) were given"),
        ([good0, [0.0, 0.0]], "output 1 must be a NumPy array or NDArray, got list"),
    ]
    for outputs, message in cases:
        with pytest.raises(ExecutionError, match=message):
            vm.invoke_with_outputs("main", None, outputs)
        assert not good0.any()  # nothing written
    readonly = np.zeros(2, "float32")
    readonly.flags.writeable = False
    with pytest.raises(ExecutionError, match="output 1 is a read-only array"):
        vm.invoke_with_outputs("main", None, [good0, readonly])
    with pytest.raises(ExecutionError, match="has no parameter 'w'"):
        vm.invoke_with_outputs("main", {"w": x}, [good0, good1])
    with pytest.raises(ExecutionError, match="missing argument\\(s\\) for k"):
        vm.invoke_with_outputs("main", {"x": x, "v": v}, [good0, good1])
    adt = vm_for("def @main(%x: float32) { (Nil, %x) }", mode)
    with pytest.raises(ExecutionError, match="result 0 of main is ADT Nil, not a tensor"):
        adt.invoke_with_outputs("main", [np.float32(1)], [np.zeros((), "float32"), np.zeros((), "float32")])
    vm.invoke_with_outputs("main", None, [good0, good1])  # still usable
    np.testing.assert_allclose(good1, v + 1, rtol=1e-6)


def test_invoke_with_outputs_aliasing_an_input(mode):
    # the result returns an input as is and the caller's output arrays are those inputs, crosswise:
    # writing one output first must not change the other result
    vm = vm_for("""
    def @main(%x: Tensor[(4), float32], %y: Tensor[(4), float32]) { (%y, %x, %x + %y) }
    """, mode)
    x0, y0 = rand(4), rand(4, seed=1)
    x, y, s = x0.copy(), y0.copy(), np.zeros(4, "float32")
    vm.invoke_with_outputs("main", {"x": x, "y": y}, [x, y, s])  # x <- y, y <- x, s <- x + y
    np.testing.assert_array_equal(x, y0)
    np.testing.assert_array_equal(y, x0)
    np.testing.assert_allclose(s, x0 + y0, rtol=1e-6)
    # an elementwise kernel writing into its own input
    inc = vm_for("def @main(%x: Tensor[(4), float32]) { %x * 2f + 1f }", mode)
    z = x0.copy()
    inc.invoke_with_outputs("main", [z], [z])
    np.testing.assert_allclose(z, x0 * 2 + 1, rtol=1e-6)


def test_invoke_with_outputs_from_threads_keeps_calls_apart(mode):
    import threading

    vm = vm_for(TWO_OUTPUTS, mode)
    errors = []

    def work(seed):
        try:
            for i in range(20):
                x, v = rand(3, 3, seed=seed + i), rand(3, seed=seed + i + 1)
                o0, o1 = np.empty((3, 3), "float32"), np.empty(3, "float32")
                vm.invoke_with_outputs("main", {"x": x, "v": v, "k": np.float32(seed)}, [o0, o1])
                np.testing.assert_allclose(o0, x * seed, rtol=1e-6)
                np.testing.assert_allclose(o1, v + seed, rtol=1e-6)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in (1, 100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.parametrize("target", ["python", "c"])
def test_a_cell_inside_an_adt_passes_to_the_bytecode_vm_itself(target):
    """A cell inside an ADT argument is the caller's own, as a bare one is: the program's write shows in it."""
    mod = tv.parse("""
def @mk(%x: Tensor[(?), float32]) -> Option[ref(Tensor[(?), float32])] { Some(ref(%x)) }
def @dbl(%o: Option[ref(Tensor[(?), float32])]) -> Tensor[(?), float32] {
  match (%o) { Some(%r) => { let %_ = ref_write(%r, ref_read(%r) * 2f); ref_read(%r) }, None => { zeros(shape=[0], dtype="float32") } }
}
def @main(%x: Tensor[(?), float32]) -> Tensor[(?), float32] { @dbl(@mk(%x)) }
""")
    x = np.arange(3, dtype=np.float32)
    vm = VirtualMachine(tv.vm.compile(mod, target=target, exec_mode="bytecode"))
    made = vm["mk"](x)
    np.testing.assert_array_equal(vm["dbl"](made).numpy(), 2 * x)
    np.testing.assert_array_equal(np.asarray(made.fields[0].value), 2 * x)
    own = mod.constructor("Some")(RefValue(x.copy()))
    np.testing.assert_array_equal(vm["dbl"](own).numpy(), 2 * x)
    np.testing.assert_array_equal(np.asarray(own.fields[0].value), 2 * x)


def test_compiled_mode_runs_a_match_of_many_arms_and_a_long_else_if_chain():
    """Python refuses 100 levels of indentation: compiled mode's nested ifs give way to its flat state machine."""
    arms = " ".join(f"C{k} => {{ {k} }}," for k in range(120))
    ctors = ", ".join(f"C{k}" for k in range(120))
    mod = tv.parse(f"type Big {{ {ctors} }}\ndef @f(%b: Big) -> int32 {{ match (%b) {{ {arms} }} }}\n"
                   f"def @main(%i: int32) -> int32 {{ "
                   + "".join(f"if (%i == {k}) {{ @f(C{k}) }} else " for k in range(120)) + "{ -1 } }")
    vm = VirtualMachine(tv.vm.compile(mod, target="python", exec_mode="compiled"))
    for i in (0, 7, 119, 500):
        assert int(vm.run(np.int32(i)).numpy()) == (i if i < 120 else -1)


def test_get_outputs_are_kept_per_function():
    """As in the Relax VM, each function's invoke_stateful keeps its own outputs: get_outputs("main") after
    running "other" is still main's; no name gives the last run's; an unknown name or one never run is an error."""
    mod = tv.parse("def @main(%x: Tensor[(2), float32]) { (%x, %x + 1f) }\n"
                   "def @other(%y: Tensor[(3), float32]) { %y * 10f }")
    vm = VirtualMachine(tv.vm.compile(mod, target="python"))
    with pytest.raises(ExecutionError, match="call invoke_stateful"):
        vm.get_outputs()
    vm.invoke_stateful("main", np.ones(2, np.float32))
    with pytest.raises(ExecutionError, match=r"no outputs of other: call invoke_stateful\('other'\) first"):
        vm.get_outputs("other")
    vm.invoke_stateful("other", np.ones(3, np.float32))
    assert [o.numpy().tolist() for o in vm.get_outputs("main")] == [[1.0, 1.0], [2.0, 2.0]]
    assert [o.numpy().tolist() for o in vm.get_outputs()] == [[10.0, 10.0, 10.0]]
    assert vm.get_num_outputs("main") == 2 and vm.get_output(1, "main").numpy().tolist() == [2.0, 2.0]
    with pytest.raises(ExecutionError, match="no function 'nope'"):
        vm.get_outputs("nope")


@pytest.mark.parametrize("target, mode", [("c", "bytecode"), ("c", "native"), ("python", "compiled")])
def test_invoke_closure_calls_a_returned_closure_with_its_captured_values(target, mode):
    """vm.invoke_closure (the Relax VM's) runs a closure the program returned on new arguments, against the
    interpreter's closure; a wrong argument count is an ExecutionError naming what the closure takes."""
    mod = tv.parse("def @main(%a: float32, %v: Tensor[(?), float32]) { fn (%b: float32, %c: Tensor[(?), float32]) "
                   "{ %a * %b + %c + %v } }")
    a, v, c = np.float32(3), np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    expected = tv.create_executor("debug", mod).evaluate()(a, v)(np.float32(2), c).numpy()
    vm = VirtualMachine(tv.vm.compile(mod, target=target, exec_mode=mode))
    closure = vm.run(a, v)
    for _ in range(2):
        np.testing.assert_array_equal(vm.invoke_closure(closure, np.float32(2), c).numpy(), expected)
    with pytest.raises(ExecutionError, match="takes 2 argument"):
        vm.invoke_closure(closure, np.float32(2))
