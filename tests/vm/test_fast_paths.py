"""The VM's fast paths give the same answers and errors as the plain ones: shapes kept as tuples (decode-time
shape plan), the compiled helper (native storages, tensor views and kernel calls), the native pooled
allocator's statistics, and memoized shape functions."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.errors import ExecutionError, ShapeError
from tensorvm.runtime.memory import NaiveAllocator, PooledAllocator, alloc_tensor
from tensorvm.vm import VirtualMachine
from tensorvm.vm import bytecode as bc
from tensorvm.vm.executable import Executable, PrimitiveInfo
from tensorvm.vm.fastcall import fastcall_module
from tensorvm.vm.shape_plan import shape_plan
from tensorvm.vm.vm import tuple_forms

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from programs import PROGRAMS  # noqa: E402

NATIVE = fastcall_module()
needs_native = pytest.mark.skipif(NATIVE is None, reason="the compiled helper cannot be built here")
MODES = ["bytecode", "compiled"]

CHAIN = """
def @main(%x: Tensor[(?, 3), float32], %y: Tensor[(1, 3), float32]) {
  %0 = add(%x, %y);
  %1 = multiply(%0, %y);
  %2 = concatenate((%1, %x), axis=0);
  reshape(%2, newshape=[-1])
}
"""


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def _chain_expected(x, y):
    return np.concatenate([(x + y) * y, x]).reshape(-1)


# --- shapes as tuples ------------------------------------------------------------------------------
def test_every_shape_function_of_a_dynamic_chain_runs_on_tuples():
    exe = tv.vm.compile(tv.parse(CHAIN))
    fn = exe.function("main")
    plan = shape_plan(fn, tuple_forms(exe.kernels, exe.primitives), exe.constants)
    calls = [pc for pc, ins in enumerate(fn.instructions)
             if isinstance(ins, bc.InvokePacked) and exe.primitives[ins.packed_index].kind == "shape_func"]
    assert calls and set(calls) == plan.tuple_calls
    # the int64 buffers the bytecode preallocates for the shape functions' results are skipped
    dropped = [fn.instructions[pc] for pc in plan.dropped]
    assert dropped and all(isinstance(ins, (bc.AllocTensor, bc.AllocStorage)) for ins in dropped)
    assert all(ins.dtype == "int64" for ins in dropped if isinstance(ins, bc.AllocTensor))
    for mode in MODES:
        vm = VirtualMachine(exe.with_exec_mode(mode))
        for rows in (1, 4, 0):
            x, y = _rand(rows, 3), _rand(1, 3, seed=1)
            np.testing.assert_allclose(vm.invoke("main", x, y).numpy(), _chain_expected(x, y), rtol=1e-6)


def _shape_as_data_exe(mode):
    """``ShapeOf`` whose result is also handed to a kernel as data: it must stay an int64 tensor."""
    def double(shape, out):
        np.multiply(shape, 2, out=out)
    code = (bc.ShapeOf(0, 1), bc.LoadConst(0, 2), bc.AllocStorage(2, 64, "int64", 3), bc.LoadConst(1, 4),
            bc.AllocTensor(3, 4, (2,), "int64", 5), bc.InvokePacked(0, 2, 1, (1, 5)), bc.Ret(5))
    fn = bc.VMFunction("main", ("x",), code, 6, (tv.TensorType((tv.Any(), 2), "float32"),))
    return Executable([fn], [np.array(16, "int64"), np.array(0, "int64")],
                      [PrimitiveInfo("double", num_inputs=1, num_outputs=1)], exec_mode=mode,
                      kernel_overrides=[double])


@pytest.mark.parametrize("mode", MODES)
def test_a_shape_used_as_data_stays_a_tensor(mode):
    exe = _shape_as_data_exe(mode)
    assert shape_plan(exe.functions[0], [None], exe.constants).tuple_regs == set()
    out = VirtualMachine(exe).invoke("main", np.zeros((5, 2), "float32"))
    np.testing.assert_array_equal(out.numpy(), [10, 4])


def test_memoized_shape_functions_still_report_every_bad_shape():
    exe = tv.vm.compile(tv.parse(CHAIN))
    vm = VirtualMachine(exe)
    np.testing.assert_allclose(vm.invoke("main", _rand(2, 3), _rand(1, 3)).numpy(),
                               _chain_expected(_rand(2, 3), _rand(1, 3)), rtol=1e-6)
    for _ in range(2):  # errors are never cached
        with pytest.raises(ShapeError, match="dimension 1 must be 3"):
            vm.invoke("main", _rand(2, 4), _rand(1, 3))
    form = next(k.tuple_form for k in exe.kernels if hasattr(k, "tuple_form"))
    assert form((2, 3), (1, 3)) is form((2, 3), (1, 3))  # the same cached result
    with pytest.raises(ShapeError):
        form((2, 3), (4, 3))


# --- native and pure-Python paths agree -------------------------------------------------------------
_AGREE = [p for p in PROGRAMS if not p.error and p.name in {
    "dynamic_broadcast_chain", "dynamic_concatenate_split", "dynamic_reshape_transpose", "tensor_while_loop",
    "grow_by_concatenate", "list_map_foldl", "tree_tmap_size", "tuple_out_static", "static_mlp",
    "closure_captures_variables", "arange_from_shape"}]


@needs_native
@pytest.mark.parametrize("allocator", ["pooled", "naive"])
@pytest.mark.parametrize("program", _AGREE, ids=[p.name for p in _AGREE])
def test_native_and_pure_python_paths_agree(program, allocator):
    exe = tv.vm.compile(program.parse())
    args = program.args_fn()
    results, stats = {}, {}
    for native in (True, False):
        vm = VirtualMachine(exe, allocator=allocator, native=native)
        results[native] = vm.invoke(program.entry, *args)
        vm.reset_memory_stats()
        results[native] = vm.invoke(program.entry, *args)
        stats[native] = vm.memory_stats()
    assert _flat(results[True]) == _flat(results[False])
    # the same allocations, frees and peak: the native guards release exactly when Storage.__del__ would
    for key in ("num_allocations", "num_frees", "reuse_hits", "peak_bytes", "bytes_live"):
        assert stats[True][key] == stats[False][key], key


def _flat(value) -> list:
    """A comparable rendering of a VM result (tensors by dtype, shape and bytes)."""
    if isinstance(value, tuple):
        return ["(", *[x for v in value for x in _flat(v)], ")"]
    if isinstance(value, tv.ADT):
        return [value.constructor, *[x for v in value.fields for x in _flat(v)]]
    if isinstance(value, tv.NDArray):
        array = value.numpy()
        return [(array.dtype.name, array.shape, array.tobytes())]
    return [type(value).__name__]


@needs_native
@pytest.mark.parametrize("kind", [PooledAllocator, NaiveAllocator])
def test_native_storage_lives_as_long_as_its_tensors(kind):
    pool = kind()
    pool.attach_native(NATIVE)
    storage = pool.alloc(64, 64, "float32")
    assert type(storage) is np.ndarray and storage.size == 64
    a = NATIVE.view((4,), np.dtype("float32"), storage, 0)
    b = alloc_tensor(storage, 16, (2, 2), "float32")
    a[...] = 1.0
    b[...] = 2.0
    del storage
    assert pool.stats()["bytes_live"] == 64
    view_of_view = b.reshape(4)[1:]
    del a, b
    assert pool.stats()["bytes_live"] == 64 and np.all(view_of_view == 2.0)
    del view_of_view
    assert pool.stats()["bytes_live"] == 0 and pool.stats()["num_frees"] == 1
    if kind is PooledAllocator:
        again = pool.alloc(40, 64, "float32")
        assert pool.stats()["reuse_hits"] == 1 and again.size == 40


@needs_native
def test_native_pool_takes_odd_requests_the_python_way():
    pool = PooledAllocator()
    pool.attach_native(NATIVE)
    assert pool.alloc(np.int64(100)).size == 100  # not a Python int: converted by the Python path
    assert pool.alloc(10, 128).ctypes.data % 128 == 0  # larger alignment: a fresh block
    with pytest.raises(ExecutionError, match="negative size"):
        pool.alloc(-1)
    with pytest.raises(ExecutionError, match="integer byte count"):
        pool.alloc("many")
    stats = pool.stats()
    assert stats["num_allocations"] == 2 and stats["bytes_live"] == 0


@needs_native
def test_native_views_are_bounds_checked_like_numpy():
    storage = np.zeros(32, np.uint8)
    f32 = np.dtype("float32")
    view = NATIVE.view((2, 2), f32, storage, 16)
    view[...] = 7
    assert view.base is storage and storage[16:].view(f32).tolist() == [7] * 4
    with pytest.raises((TypeError, ValueError)):
        NATIVE.view((8,), f32, storage, 4)  # 36 bytes needed
    assert NATIVE.view((-1,), f32, storage, 0).shape == np.ndarray((-1,), f32, storage, 0).shape  # NumPy's rule
    read_only = np.zeros(16, np.uint8)
    read_only.setflags(write=False)
    assert not NATIVE.view((4,), f32, read_only, 0).flags.writeable
    assert NATIVE.view([2], f32, storage, 0).shape == (2,)  # a list shape goes through NumPy itself


# --- the fast kernel caller (target "c") --------------------------------------------------------------
def _c_add_exe():
    from tensorvm.codegen.build import CompilerError

    try:
        return tv.vm.compile(tv.parse("""
def @main(%x: Tensor[(?, 4), float32], %y: Tensor[(?, 4), float32]) { add(%x, %y) }"""), target="c")
    except CompilerError:
        pytest.skip("no C compiler")


@needs_native
def test_fast_kernel_calls_fall_back_to_the_checked_call_for_clear_errors():
    exe = _c_add_exe()
    kernel = exe.kernels[[p.kind for p in exe.primitives].index("kernel")]
    assert type(kernel).__name__ == "Caller"
    x, y, out = _rand(3, 4), _rand(3, 4, seed=1), np.empty((3, 4), "float32")
    kernel(x, y, out)
    np.testing.assert_array_equal(out, x + y)
    with pytest.raises(ExecutionError, match="dtype"):
        kernel(x.astype("float64"), y, out)
    with pytest.raises(ShapeError, match="dim 1 must be 4"):
        kernel(_rand(3, 5), y, out)
    with pytest.raises(ExecutionError, match="contiguous"):
        kernel(np.asfortranarray(_rand(4, 4))[:3], y, out)
    frozen = np.empty((3, 4), "float32")
    frozen.setflags(write=False)
    with pytest.raises(ExecutionError, match="read-only"):
        kernel(x, y, frozen)
    with pytest.raises(ShapeError):  # the kernel's own entry check: rows 3 and 2 do not broadcast
        kernel(x, _rand(2, 4), out)
    with pytest.raises(ExecutionError):
        kernel(x, y)
    np.testing.assert_array_equal(out, x + y)  # nothing above wrote a wrong result


@needs_native
def test_only_the_kernels_the_vm_calls_from_python_get_wrappers(monkeypatch):
    """The VM calls plain kernels through the fast caller: their library has no CPython wrappers for them
    (``kernel_c._wrapped``), while a kernel with a BLAS variant, which its dispatcher calls from Python,
    keeps its wrapper; both compute what NumPy does."""
    monkeypatch.setenv("TENSORVM_BLAS", "numpy")  # (a BLAS variant for the dense kernel)
    exe = tv.vm.compile(tv.parse("""
def @main(%x: Tensor[(?, 64), float32], %w: Tensor[(64, 64), float32]) { tanh(nn.dense(add(%x, %x), %w)) }"""),
                        target="c")
    kernels = exe.c_library.kernels
    assert type(kernels["fused_add"]).__name__ == "Caller"
    dispatch = kernels["fused_nn_dense_tanh"]
    assert type(dispatch).__name__ == "DispatchKernel"
    c_kernel = dispatch.kernel.kernel
    assert c_kernel.entry != c_kernel._call_through_ctypes  # (the wrapper)
    plain = tv.vm.compile(tv.parse("""
def @main(%x: Tensor[(?, 4), float32], %y: Tensor[(?, 4), float32]) { add(%x, %y) }"""), target="c")
    assert plain.c_library.python_module == ""  # (no kernel of it is called from Python: no wrapper module)
    for rows in (3, 300):
        x, w = _rand(rows, 64), _rand(64, 64, seed=2)
        np.testing.assert_allclose(VirtualMachine(exe).invoke("main", x, w).numpy(), np.tanh((x + x) @ w.T),
                                   rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(VirtualMachine(plain).invoke("main", _rand(2, 4), _rand(2, 4)).numpy(),
                                  _rand(2, 4) + _rand(2, 4))


@needs_native
def test_broadcast_errors_through_the_vm_on_target_c():
    exe = _c_add_exe()
    for mode in MODES:
        vm = VirtualMachine(exe.with_exec_mode(mode))
        with pytest.raises(ShapeError, match="pc"):
            vm.invoke("main", _rand(3, 4), _rand(2, 4))
        np.testing.assert_allclose(vm.invoke("main", _rand(1, 4), _rand(5, 4)).numpy(), _rand(1, 4) + _rand(5, 4))


@pytest.mark.parametrize("mode", MODES)
def test_a_tensor_that_does_not_fit_its_storage_fails_at_its_own_pc(mode):
    """The decoder fuses a static AllocTensor with the kernel call after it only when the tensor provably
    fits its storage; otherwise the AllocTensor runs alone and its error names its pc."""
    def add(a, b, out):
        np.add(a, b, out=out)
    code = (bc.LoadConst(0, 1), bc.AllocStorage(1, 64, "int64", 2), bc.LoadConst(1, 3),
            bc.AllocTensor(2, 3, (4,), "int64", 4), bc.InvokePacked(0, 3, 1, (0, 0, 4)), bc.Ret(4))
    fn = bc.VMFunction("main", ("x",), code, 5, (tv.TensorType((4,), "int64"),))
    exe = Executable([fn], [np.array(8, "int64"), np.array(0, "int64")],
                     [PrimitiveInfo("add", num_inputs=2, num_outputs=1)], exec_mode=mode, kernel_overrides=[add])
    with pytest.raises(ShapeError, match=r"alloc_tensor.*at pc 3"):
        VirtualMachine(exe).invoke("main", np.arange(4, dtype="int64"))


def test_memoized_shape_function_keys_a_shape_tensor_by_its_values():
    """A by-shape input that arrives as an int64 shape tensor (unhashable) is memoized by the shape it
    holds, like the same shape as a tuple; a different shape is computed again (it was computed on every
    call: two per GPT-2 decode step)."""
    from tensorvm.vm.kernel_abi import memoized_shape_func

    calls = []

    def compute(a, b):
        calls.append((a, b))
        return (tuple(int(d) for d in np.asarray(a).reshape(-1)[::-1]),)

    shape_func = memoized_shape_func(compute, (False, False), (2,), "test")
    first = shape_func(np.array([2, 3], "int64"), np.array([4], "int64"))
    assert first == ((3, 2),) and len(calls) == 1
    assert shape_func(np.array([2, 3], "int64"), np.array([4], "int64")) == first and len(calls) == 1
    assert shape_func((2, 3), (4,)) == first and len(calls) == 1  # the tuple form of the same shapes
    assert shape_func(np.array([5, 3], "int64"), np.array([4], "int64")) == ((3, 5),) and len(calls) == 2


_BACKGROUND_BUILD = """
import threading

import tensorvm as tv
from tensorvm.codegen import host
from tensorvm.vm import fastcall

started = []
start = threading.Thread.start


def recording_start(thread):
    started.append((thread.name, host._DETECTED[0] is not None))
    start(thread)


threading.Thread.start = recording_start
exe = tv.vm.compile(tv.parse("def @main(%x: Tensor[(?, 4), float32]) { add(%x, %x) }"), target="c")
print([s for s in started if s[0] == "tensorvm-fastcall-build"], fastcall.fastcall_module() is not None)
"""


@needs_native
def test_a_cold_compile_builds_the_fast_caller_in_the_background_after_measuring_the_host(tmp_path):
    """On an empty kernel cache ``tv.vm.compile(target="c")`` builds the fast caller on a thread of its own
    (while the module is lowered), started only once the host's timings are measured (a compiler on the other
    core would disturb them); the compile then uses it."""
    import os
    import subprocess

    done = subprocess.run([sys.executable, "-c", _BACKGROUND_BUILD], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TENSORVM_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[('tensorvm-fastcall-build',", "True)]", "True"]
