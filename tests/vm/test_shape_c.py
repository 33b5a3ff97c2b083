"""C shape functions on target "c" (tensorvm/vm/shape_c.py): the VM calls them for ``vm.shape_func``,
they agree with the interpreter, report the same errors, fall back to Python visibly, and the
data-dependent ones count without redoing the kernels' work."""

from __future__ import annotations

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.errors import ShapeError
from tensorvm.op import get_op

build = pytest.importorskip("tensorvm.codegen.build")
if not build.have_compiler():  # pragma: no cover - the CI machine has one
    pytest.skip("no C compiler", allow_module_level=True)


def _shape_funcs(exe) -> dict:
    """Shape function name -> its kernel object (with ``c_function`` when it is C)."""
    return {p.name: k for p, k in zip(exe.primitives, exe.kernels) if p.kind == "shape_func"}


def _shapes(value):
    if isinstance(value, (tuple, list)):
        return [_shapes(v) for v in value]
    return np.asarray(value).shape


BROADCAST_SUM = """
def @main(%x: Tensor[(?, 3), float32], %y: Tensor[(?, 1), float32]) {
  sum(exp(add(%x, %y)), axis=[1])
}
"""


def test_target_c_calls_c_shape_functions_that_agree_with_the_interpreter():
    mod = tv.parse(BROADCAST_SUM)
    exe = tv.vm.compile(mod, target="c")
    library = exe.stats()["kernel_library"]
    assert library["c_shape_funcs"] and not library["python_shape_funcs"]
    (shape_func,) = _shape_funcs(exe).values()
    vm, ref = tv.vm.VirtualMachine(exe), tv.create_executor("debug", mod).evaluate()
    rng = np.random.default_rng(0)
    for rows_x, rows_y in [(4, 4), (4, 1), (1, 6), (0, 1)]:
        x, y = rng.random((rows_x, 3), "float32"), rng.random((rows_y, 1), "float32")
        np.testing.assert_allclose(np.asarray(vm.run(x, y)), np.asarray(ref(x, y)), rtol=1e-6)
    assert "int32_t tvs" in exe.kernel_source(next(iter(_shape_funcs(exe))))
    assert shape_func.c_function.deferrals == 0


def test_a_shape_error_from_c_has_the_python_message():
    exe_c = tv.vm.compile(tv.parse(BROADCAST_SUM), target="c")
    exe_py = tv.vm.compile(tv.parse(BROADCAST_SUM), target="python")
    x, y = np.ones((4, 3), "float32"), np.ones((5, 1), "float32")
    messages = []
    for exe in (exe_c, exe_py):
        with pytest.raises(ShapeError, match=r"add: cannot broadcast shapes \(4, 3\) and \(5, 1\)") as info:
            tv.vm.VirtualMachine(exe).run(x, y)
        messages.append(str(info.value).split(" [in VM")[0])
    assert messages[0] == messages[1]


@pytest.mark.parametrize("traced", [True, False])
def test_a_primitive_whose_logic_does_not_trace_keeps_python_visibly(traced, monkeypatch):
    """image.resize (ONNX Resize: scales or sizes read at run time) has a C shape function; an op whose
    logic does not trace (here the same op with its flag cleared) keeps the Python one, listed in stats."""
    if not traced:
        monkeypatch.setattr(get_op("image.resize"), "shape_logic_traceable", False)
    mod = tv.parse("""
def @main(%x: Tensor[(1, 1, ?, ?), float32], %roi: Tensor[(8), float32], %sc: Tensor[(4), float32],
          %si: Tensor[(0), int64]) {
  image.resize(%x, %roi, %sc, %si)
}""")
    exe = tv.vm.compile(mod, target="c")
    library = exe.stats()["kernel_library"]
    if traced:
        assert not library["python_shape_funcs"], library
    else:
        assert library["python_shape_funcs"], library
        assert all("image.resize" in why for why in library["python_shape_funcs"].values())
    x = np.arange(4, dtype="float32").reshape(1, 1, 2, 2)
    out = np.asarray(tv.vm.VirtualMachine(exe).run(x, np.zeros(8, "float32"), np.array([1, 1, 1.5, 2], "float32"),
                                                   np.zeros(0, "int64")))
    assert out.shape == (1, 1, 3, 4)


def test_run_time_strides_are_read_by_the_c_shape_function():
    """dyn.strided_slice's begin/end/strides are data loads in C (each dim a select over its stride's
    sign); a zero stride is the precise error of the Python shape function."""
    mod = tv.parse("""
def @main(%x: Tensor[(?, ?), float32], %b: Tensor[(2), int64], %e: Tensor[(2), int64], %s: Tensor[(2), int64]) {
  dyn.strided_slice(%x, %b, %e, %s)
}""")
    exe = tv.vm.compile(mod, target="c")
    library = exe.stats()["kernel_library"]
    assert library["c_shape_funcs"] and not library["python_shape_funcs"], library
    vm = tv.vm.VirtualMachine(exe)
    x = np.arange(12, dtype="float32").reshape(3, 4)
    big = np.iinfo("int64").max
    for b, e, s in (([0, 3], [2, 0], [1, -1]), ([-1, -big - 1], [-big - 1, big], [-2, 3]), ([5, 1], [-9, 9], [-1, 2])):
        b, e, s = (np.array(v, "int64") for v in (b, e, s))
        np.testing.assert_array_equal(np.asarray(vm.run(x, b, e, s)),
                                      x[slice(b[0], e[0], s[0]), slice(b[1], e[1], s[1])])
    with pytest.raises(ShapeError, match="nonzero"):
        vm.run(x, np.array([0, 0], "int64"), np.array([2, 2], "int64"), np.array([1, 0], "int64"))


def test_run_time_reps_are_read_by_the_c_shape_function():
    """dyn.tile's reps are data loads in its C shape function (no Python shape function), and a negative
    rep is the precise error of the Python one."""
    mod = tv.parse("""
def @main(%x: Tensor[(?, ?), float32], %reps: Tensor[(2), int64]) {
  dyn.tile(%x, %reps)
}""")
    exe = tv.vm.compile(mod, target="c")
    library = exe.stats()["kernel_library"]
    assert library["c_shape_funcs"] and not library["python_shape_funcs"], library
    vm = tv.vm.VirtualMachine(exe)
    x, reps = np.arange(6, dtype="float32").reshape(2, 3), np.array([2, 1], "int64")
    np.testing.assert_array_equal(np.asarray(vm.run(x, reps)), np.tile(x, (2, 1)))
    with pytest.raises(ShapeError, match="reps"):
        vm.run(x, np.array([-1, 1], "int64"))


DATA_DEPENDENT = """
def @main(%x: Tensor[(?), float32], %k: Tensor[(), int32], %a: Tensor[(), int64], %b: Tensor[(), int64],
          %s: Tensor[(), float32]) {
  (argwhere(%x), unique(%x), topk(%x, %k, ret_type="values"), arange(%a, %b, %a, dtype="int64"),
   arange(%s, cast(%b, dtype="float32"), %s))
}
"""


def test_data_dependent_shape_functions_are_c_and_count_without_sorting():
    mod = tv.parse(DATA_DEPENDENT)
    exe = tv.vm.compile(mod, target="c")
    library = exe.stats()["kernel_library"]
    assert not library["python_shape_funcs"], library["python_shape_funcs"]
    sources = {name: exe.kernel_source(name) for name in _shape_funcs(exe)}
    assert any("tv_shape_count_nonzero" in text for text in sources.values())
    unique_source = next(text for text in sources.values() if "sorted_unique" in text)
    assert "tv_shape_count_sorted_runs" in unique_source and "sort(" not in unique_source.replace("_sorted_", "")
    # each data pass runs once per call, even where the logic uses its count for several outputs
    assert unique_source.count("tv_shape_count_sorted_runs(") == 1
    vm, ref = tv.vm.VirtualMachine(exe), tv.create_executor("debug", mod).evaluate()
    x = np.array([3, 0, 1, 3, np.nan, 0, np.nan], "float32")
    for k, a, b, s in [(3, 2, 9, 0.5), (0, 3, -4, -1.5), (7, 1, 1, 2.0)]:
        args = (x, np.array(k, "int32"), np.array(a), np.array(b), np.array(s, "float32"))
        got, want = vm.run(*args), ref(*args)
        assert _shapes(got) == _shapes(want)
    for bad, match in [((9, 2, 9, 0.5), "topk: k=9 exceeds"), ((1, 0, 9, 0.5), "arange: step must not be zero"),
                       ((1, 2, 9, 0.0), "arange: step must not be zero")]:
        k, a, b, s = bad
        with pytest.raises(ShapeError, match=match):
            vm.run(x, np.array(k, "int32"), np.array(a), np.array(b), np.array(s, "float32"))


def test_dyn_reshape_runs_in_c_and_defers_minus_two_to_the_host():
    mod = tv.parse("""
def @main(%x: Tensor[(?, ?), float32], %s: Tensor[(2), int64]) {
  dyn.reshape(%x, %s)
}""")
    exe = tv.vm.compile(mod, target="c")
    assert not exe.stats()["kernel_library"]["python_shape_funcs"]
    (shape_func,) = _shape_funcs(exe).values()
    vm, ref = tv.vm.VirtualMachine(exe), tv.create_executor("debug", mod).evaluate()
    x = np.arange(12, dtype="float32").reshape(3, 4)
    for newshape in [(-1, 2), (0, -1), (6, 2)]:
        s = np.array(newshape, "int64")
        assert vm.run(x, s).shape == np.asarray(ref(x, s)).shape
    assert shape_func.c_function.deferrals == 0
    s = np.array([3, -2], "int64")  # -2 copies the remaining dims: (3, 4), still rank 2
    assert vm.run(x, s).shape == np.asarray(ref(x, s)).shape == (3, 4)
    assert shape_func.c_function.deferrals == 1  # the C function left the -2 to the Python shape function
    for newshape, error in [((-1, -1), "more than one -1"), ((5, -1), "not divisible"), ((5, 3), "cannot reshape")]:
        with pytest.raises(ShapeError, match=error):
            vm.run(x, np.array(newshape, "int64"))


def test_a_saved_executable_loads_with_its_c_shape_functions(tmp_path):
    exe = tv.vm.compile(tv.parse(BROADCAST_SUM), target="c")
    path = tmp_path / "model.tvx"
    exe.save(path)
    loaded = tv.vm.load_executable(path)
    assert loaded.stats()["kernel_library"]["c_shape_funcs"] == exe.stats()["kernel_library"]["c_shape_funcs"]
    x, y = np.ones((2, 3), "float32"), np.ones((1, 1), "float32")
    np.testing.assert_allclose(np.asarray(tv.vm.VirtualMachine(loaded).run(x, y)), np.full(2, 3 * np.exp(2.0), "float32"),
                               rtol=1e-6)


@pytest.mark.parametrize("text, request_", [
    # 3 + 2 x (2^63 - 1) wraps to 1; 3 x 6148914691236517206 wraps to 2
    ("def @main(%p: Tensor[(1, 2), int64], %x: Tensor[(?), float32]) { dyn.nn.pad(%x, %p, 0f) }",
     np.array([[2**63 - 1, 2**63 - 1]], "int64")),
    ("def @main(%r: Tensor[(1), int64], %x: Tensor[(?), float32]) { dyn.tile(%x, %r) }",
     np.array([6148914691236517206], "int64")),
])
@pytest.mark.parametrize("exec_mode", ["bytecode", "native"])
def test_a_shape_that_overflows_int64_is_an_error_not_a_wrapped_dim(text, request_, exec_mode):
    """A C shape function adds and multiplies dims with overflow checks: a request whose dims overflow
    int64 is a ShapeError, where the wrapped dims had passed every check and the kernel ran on a small,
    wrong shape. Oracle: Python's dims (exact integers) exceed int64."""
    exe = tv.vm.compile(tv.parse(text), target="c", exec_mode=exec_mode)
    with pytest.raises(ShapeError, match="overflows int64"):
        tv.vm.VirtualMachine(exe)["main"](request_, np.arange(1, 4, dtype="float32"))


@pytest.mark.parametrize("exec_mode", ["bytecode", "native"])
def test_a_tensor_whose_bytes_overflow_int64_is_the_same_shape_error_in_both_modes(exec_mode):
    """dyn.full of (2^32, 2^32) floats: its dims are fine, its 2^66 bytes are not. Both modes refuse the
    allocation with a ShapeError (bytecode had passed NumPy's ValueError on as an ExecutionError)."""
    exe = tv.vm.compile(tv.parse("def @main(%s: Tensor[(2), int64]) { dyn.full(1f, %s) }"), target="c",
                        exec_mode=exec_mode)
    with pytest.raises(ShapeError, match="alloc_storage: invalid byte count .*overflow int64"):
        tv.vm.VirtualMachine(exe)["main"](np.array([2**32, 2**32], "int64"))
