"""Ops computed by named C library calls (``OpDef.library``, ``tensorvm/codegen/lib``) against their
NumPy kernels: every case is compiled with ``?`` dims (and with static dims for a few dtypes) into one
library for the module; then whole programs on target c against target python, including the run-time
errors."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorvm as tv
from tensorvm.codegen.c_emit import LIBRARY_DIR, RUNTIME_ERRORS
from tensorvm.codegen.fused import build_fused_module
from tensorvm.errors import ExecutionError, ShapeError
from tensorvm.ir.attrs import Attrs
from tensorvm.ir.expr import Call, Function, Op, Var
from tensorvm.ir.types import Any, TensorType
from tensorvm.op import get_op
from tensorvm.op._library import DTYPE_CODES
from tensorvm.vm import VirtualMachine

ALL = DTYPE_CODES
NUMBERS = ALL[1:]
LIBRARY_OPS = ("sort", "argsort", "topk", "cumsum", "cumprod", "searchsorted", "scatter_elements", "scatter_nd",
               "argwhere", "sorted_unique")


def _values(rng, shape, dtype, low=-3, high=4, nans=True):
    """Small values (many ties), NaN and infinities among floats."""
    values = rng.integers(low, high, size=shape)
    if dtype == "bool":
        return (values > 0).astype(dtype)
    if np.dtype(dtype).kind == "u":
        values = np.abs(values)
    out = values.astype(dtype)
    if np.dtype(dtype).kind == "f" and nans and out.size > 2:
        out.flat[rng.integers(0, out.size, 2)] = [np.nan, np.inf]
    return out


def _cases():
    rng = np.random.default_rng(17)
    cases = []

    def add(op, arrays, attrs, static=()):
        """``static``: (input, axis) dims kept static in the dynamic copy (the type needs them)."""
        cases.append((op, [np.ascontiguousarray(a) for a in arrays], attrs, static))

    for dtype in ALL:
        for j, (shape, axis) in enumerate((((37,), 0), ((3, 21), 1), ((4, 5, 3), 1), ((0, 4), 1), ((3, 0), -1))):
            x = _values(rng, shape, dtype)
            ascending = j % 2 == 0  # (each op in both directions, over the shapes)
            add("sort", [x], {"axis": axis, "is_ascend": ascending})
            add("argsort", [x], {"axis": axis, "is_ascend": not ascending, "dtype": "int64" if ascending else "int32"})
        x = _values(rng, (5, 19), dtype)
        add("topk", [x], {"k": 4, "axis": 1})
        add("topk", [x], {"k": 2, "axis": 0, "is_ascend": True, "ret_type": "values"})
        add("topk", [x], {"k": 0, "axis": -1, "ret_type": "indices", "dtype": "int64"})
        x = _values(rng, (70, 3), dtype)  # (a small k of a long axis: selected in one pass, not sorted)
        add("topk", [x], {"k": 4, "axis": 0})
        add("topk", [x], {"k": 3, "axis": 0, "is_ascend": True, "ret_type": "indices"})
        add("argwhere", [_values(rng, (4, 3, 5), dtype)], {})
        add("argwhere", [_values(rng, (6,), dtype)], {})
        add("argwhere", [_values(rng, (), dtype)], {})
        add("argwhere", [_values(rng, (2, 0), dtype)], {})
        seq = np.sort(_values(rng, (30,), dtype, nans=False))
        add("searchsorted", [seq, _values(rng, (3, 4), dtype)], {"right": dtype == "bool"})
        seq2 = np.sort(_values(rng, (2, 3, 9), dtype), axis=-1)  # (NaN sorts last, as the kernel expects)
        add("searchsorted", [seq2, _values(rng, (2, 3, 5), dtype)], {"right": True, "dtype": "int64"})
        add("searchsorted", [seq2, _values(rng, (2, 3, 5), dtype)], {})
        data = _values(rng, (4, 6), dtype)
        for axis, reduction in ((0, "update"), (1, "add"), (0, "mul"), (1, "mean"), (0, "min"), (1, "max")):
            shape = (3, 6) if axis == 0 else (4, 4)
            indices = rng.integers(-data.shape[axis], data.shape[axis], size=shape).astype("int32")
            add("scatter_elements", [data, indices, _values(rng, shape, dtype)], {"axis": axis, "reduction": reduction})
        data3 = _values(rng, (4, 5, 2), dtype)
        for mode in ("update", "add", "mul", "min", "max"):
            indices = rng.integers(-4, 4, size=(1, 6)).astype("int64")
            indices[0, 3] = indices[0, 1]  # a repeated index: each update applies
            add("scatter_nd", [data3, indices, _values(rng, (6, 5, 2), dtype)], {"mode": mode}, static=((1, 0),))
        indices = np.stack([rng.integers(0, 4, 7), rng.integers(-5, 5, 7)]).astype("int16")
        add("scatter_nd", [data3, indices, _values(rng, (7, 2), dtype)], {"mode": "add"}, static=((1, 0),))
    for dtype in ("float32", "int8"):  # enough lines to be sorted by the kernels' threads
        x = _values(rng, (300, 120), dtype)
        add("argsort", [x], {"axis": 1, "is_ascend": dtype == "int8"})
        add("topk", [x], {"k": 5, "axis": 0, "is_ascend": dtype == "int8"})
    for dtype in NUMBERS:
        x = _values(rng, (3, 7), dtype)
        add("cumsum", [x], {"axis": 1})
        add("cumsum", [x], {"exclusive": True})
        add("cumprod", [x], {"axis": 0, "exclusive": True})
        add("cumprod", [_values(rng, (0, 3), dtype)], {"axis": 1})
    x = _values(rng, (4, 9), "int32", -100, 100)
    add("cumsum", [x], {"axis": 1, "dtype": "int8"})  # (wraps)
    add("cumprod", [x], {"axis": 0, "dtype": "int16"})
    add("cumsum", [_values(rng, (5, 2), "bool")], {"axis": 0, "dtype": "int32"})
    add("cumsum", [_values(rng, (5, 2), "float32")], {"dtype": "float64", "exclusive": True})
    add("cumsum", [_values(rng, (6,), "float16")], {"axis": 0, "dtype": "uint8"})
    return cases


CASES = _cases()


def _primitive(op, arrays, attrs, dynamic: bool, static) -> Function:
    params = [Var(f"p{i}", TensorType(tuple(Any() if dynamic and (i, axis) not in static else d
                                              for axis, d in enumerate(a.shape)), a.dtype.name))
              for i, a in enumerate(arrays)]
    return Function(params, Call(Op(op), tuple(params), Attrs(attrs)), attrs={"Primitive": 1})


# The kernel is one call either way; a static copy (other entry checks, constant arguments) only for these.
STATIC_COPY = ("float32", "int64", "bool")


def _variants(arrays) -> tuple:
    return (0, 1) if arrays[0].dtype.name in STATIC_COPY else (1,)


@pytest.fixture(scope="module")
def kernels():
    prims = {f"case{i}_{dynamic}": _primitive(op, arrays, attrs, bool(dynamic), static)
             for i, (op, arrays, attrs, static) in enumerate(CASES) for dynamic in _variants(arrays)}
    return build_fused_module(prims)[1]


def _reference(op, attrs, arrays) -> list:
    result = get_op(op).kernel(Attrs(attrs), *arrays)
    return [np.asarray(r) for r in (result if isinstance(result, tuple) else (result,))]


@pytest.mark.parametrize("index", range(len(CASES)),
                         ids=[f"{op}-{a[0].dtype}-{a[0].shape}-{i}" for i, (op, a, _, _) in enumerate(CASES)])
def test_library_kernel_matches_numpy_kernel(kernels, index):
    op, arrays, attrs, _ = CASES[index]
    with np.errstate(all="ignore"):
        expected = _reference(op, attrs, arrays)
    for dynamic in _variants(arrays):
        outputs = [np.empty(e.shape, e.dtype) for e in expected]
        kernels[f"case{index}_{dynamic}"](*arrays, *outputs)
        for out, ref in zip(outputs, expected):
            np.testing.assert_array_equal(out, ref, err_msg=f"{op} {attrs} dynamic={dynamic}")


def test_every_library_op_is_covered():
    assert {op for op, *_ in CASES} | {"sorted_unique"} == set(LIBRARY_OPS)
    assert all(get_op(op).library is not None for op in LIBRARY_OPS)


def test_sort_is_stable_in_both_directions(kernels):
    """Equal keys keep their order (ascending and descending); NaN is the largest value."""
    x = np.array([2, 1, 2, np.nan, 1, 2, np.nan, -np.inf] * 5, "float32")
    prims = {f"s{asc}": _primitive("argsort", [x], {"is_ascend": bool(asc)}, True, ()) for asc in (0, 1)}
    built = build_fused_module(prims)[1]
    for asc in (0, 1):
        out = np.empty(x.shape, "int32")
        built[f"s{asc}"](x, out)
        keys = x if asc else -x  # (descending: -NaN is still NaN, last in the stable ascending order...)
        expected = np.argsort(keys, kind="stable")
        if not asc:  # ... but descending puts NaN first: move the NaN positions to the front, in order
            nan = np.isnan(x[expected])
            expected = np.concatenate([expected[nan], expected[~nan]])
        np.testing.assert_array_equal(out, expected)


def test_output_sizes_that_disagree_with_the_data_are_errors(kernels):
    x = np.array([[0, 1], [2, 0]], "int32")  # two nonzero elements
    index = next(i for i, (op, a, _, _) in enumerate(CASES) if op == "argwhere" and a[0].shape == (4, 3, 5))
    built = build_fused_module({"w": _primitive("argwhere", [x], {}, True, ())})[1]
    for rows in (1, 3):
        with pytest.raises(ExecutionError, match="output's size does not match"):
            built["w"](x, np.empty((rows, 2), "int32"))
    with pytest.raises(ShapeError):  # a static output dim that does not fit: the entry check
        arrays = CASES[index][1]
        kernels[f"case{index}_1"](*arrays, np.empty((1, 2), "int32"))


def test_topk_k_larger_than_the_axis_is_an_entry_error():
    x = np.zeros((2, 3), "float32")
    built = build_fused_module({"t": _primitive("topk", [x], {"k": 0, "axis": 1}, True, ())})[1]
    with pytest.raises(ShapeError, match="topk: k must not exceed"):
        built["t"](x, np.empty((2, 4), "float32"), np.empty((2, 4), "int32"))


# ---- whole programs on target c -------------------------------------------------------------------

PROGRAM = """
def @main(%x: Tensor[(?), float32], %k: Tensor[(), int64], %m: Tensor[(?, 3), int32], %i: Tensor[(?, 3), int64],
          %u: Tensor[(?, 3), int32], %seq: Tensor[(?), float32]) {
  %0 = unique(%x, return_counts=True);
  %1 = unique(%x, is_sorted=False);
  %2 = topk(%x, %k, axis=0, is_ascend=True);
  %3 = argwhere(%m);
  %4 = cumsum(%m, axis=0, exclusive=True);
  %5 = cumprod(%x);
  %6 = sort(%m, axis=0, is_ascend=False);
  %7 = argsort(%x);
  %8 = scatter_elements(%m, %i, %u, axis=0, reduction="add");
  %9 = searchsorted(%seq, %x, right=True);
  %10 = scatter_nd(%m, expand_dims(take(%i, 0, axis=1), axis=0), %u, mode="max");
  (%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10)
}
"""


def _arguments(rng, n: int, rows: int, k: int, bad_index: bool = False):
    x = rng.integers(-3, 4, n).astype("float32")
    if n > 3:
        x[[1, 3]] = np.nan
    m = rng.integers(-2, 3, (rows, 3)).astype("int32")
    i = rng.integers(-rows, rows, (rows, 3)).astype("int64") if rows else np.zeros((0, 3), "int64")
    if bad_index:
        i[0, 0] = rows
    u = rng.integers(-5, 5, (rows, 3)).astype("int32")
    seq = np.sort(rng.integers(-3, 4, 6).astype("float32"))
    return x, np.array(k, "int64"), m, i, u, seq


def _flatten(value) -> list:
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in _flatten(v)]
    return [value.numpy() if hasattr(value, "numpy") else np.asarray(value)]


@pytest.fixture(scope="module")
def executables():
    mod = tv.parse(PROGRAM)
    return {target: tv.vm.compile(mod, target=target) for target in ("python", "c")}


def test_program_of_library_ops_has_no_numpy_fallbacks(executables):
    library = executables["c"].stats()["kernel_library"]
    assert library["numpy_fallbacks"] == {}
    assert sum("sorted_unique" in name for name in library["c_kernels"]) == 2  # (unique, legalized)


@pytest.mark.parametrize("n, rows, k", [(9, 4, 3), (0, 0, 0), (1, 1, 1), (40, 7, 40), (5, 2, -1)])
def test_program_on_target_c_matches_target_python_and_the_interpreter(executables, n, rows, k):
    args = _arguments(np.random.default_rng(n), n, rows, k)
    results = {target: _flatten(VirtualMachine(exe).invoke("main", *args)) for target, exe in executables.items()}
    interpreted = _flatten(tv.create_executor("debug", tv.parse(PROGRAM)).evaluate()(*args))
    for c, py, ref in zip(results["c"], results["python"], interpreted, strict=True):
        assert c.dtype == ref.dtype
        np.testing.assert_array_equal(c, py)
        np.testing.assert_array_equal(c, ref)


def test_out_of_range_scatter_index_raises_on_both_targets(executables):
    args = _arguments(np.random.default_rng(1), 5, 3, 2, bad_index=True)
    for exe in executables.values():
        with pytest.raises(ExecutionError):
            VirtualMachine(exe).invoke("main", *args)


def test_scatter_nd_index_out_of_range_raises_on_both_targets():
    mod = tv.parse("""
def @main(%d: Tensor[(?, 2), float32], %i: Tensor[(1, ?), int32], %u: Tensor[(?, 2), float32]) {
  scatter_nd(%d, %i, %u)
}""")
    d, u = np.zeros((3, 2), "float32"), np.ones((2, 2), "float32")
    for target in ("python", "c"):
        vm = VirtualMachine(tv.vm.compile(mod, target=target))
        np.testing.assert_array_equal(vm.invoke("main", d, np.array([[-1, 0]], "int32"), u).numpy(),
                                      [[1, 1], [0, 0], [1, 1]])
        for bad in (3, -4):
            with pytest.raises(ExecutionError):
                vm.invoke("main", d, np.array([[0, bad]], "int32"), u)


def test_unique_sorts_once():
    """The VM runs unique as argsort (the one sort) and sorted_unique (a counting shape function and
    an O(n) kernel); the unique op's own shape function and kernel are not called."""
    mod = tv.parse("def @main(%x: Tensor[(?), int32]) { unique(%x) }")
    exe = tv.vm.compile(mod, target="c")
    names = exe.stats()["kernel_library"]["c_kernels"]
    assert any("argsort" in n for n in names) and any("sorted_unique" in n for n in names)
    assert not any(re.search(r"(?<!sorted_)unique", n) for n in names)


def test_sorted_unique_rejects_an_order_that_does_not_sort():
    x = np.array([3, 1, 2], "int32")
    built = build_fused_module({"u": _primitive("sorted_unique", [x, np.zeros(3, "int64")], {}, True, ())})[1]
    outputs = [np.empty(3, "int32"), np.empty(3, "int32"), np.empty(3, "int32")]
    for order in ([0, 1, 2], [1, 2, 5]):
        with pytest.raises(ExecutionError):
            built["u"](x, np.array(order, "int64"), *outputs)
        with pytest.raises(ExecutionError):
            get_op("sorted_unique").kernel(Attrs({}), x, np.array(order, "int64"))


# ---- the C side agrees with the Python side --------------------------------------------------------


def test_header_dtype_codes_and_error_codes_match_python():
    header = (LIBRARY_DIR / "tv_lib.h").read_text()
    enum = re.search(r"enum \{([^}]*)\}", header).group(1)
    names = [n.strip() for n in enum.split(",")]
    assert names == [f"TV_DTYPE_{d.upper()}" for d in DTYPE_CODES]
    codes = {int(code): name for name, code in re.findall(r"#define TV_ERROR_(\w+) (\d+)", header)}
    assert set(codes) <= set(RUNTIME_ERRORS)


def test_aot_links_the_library_functions():
    """The AOT flow includes the library files its kernels call (static, as its kernels)."""
    import tensorvm.aot as aot

    mod = tv.parse("""
def @main(%x: Tensor[(4, 6), float32], %i: Tensor[(2, 6), int32], %u: Tensor[(2, 6), float32]) {
  (sort(%x, axis=1, is_ascend=False), cumsum(%x, axis=0), scatter_elements(%x, %i, %u, reduction="add"),
   topk(%x, k=2))
}""")
    rng = np.random.default_rng(3)
    args = (rng.standard_normal((4, 6)).astype("float32"), rng.integers(-4, 4, (2, 6)).astype("int32"),
            rng.standard_normal((2, 6)).astype("float32"))
    result = _flatten(aot.build(mod, name="lib").load()(*args))
    expected = _flatten(tv.create_executor("debug", mod).evaluate()(*args))
    for out, ref in zip(result, expected, strict=True):
        np.testing.assert_array_equal(out, ref)


def test_saved_executable_rebuilds_its_library_kernels(executables):
    """Loading regenerates the C from the primitives' text (or, when the kernel cache holds the library
    built from exactly the file's C, binds that one): the library calls come back, no fallback."""
    from tensorvm.vm import load_executable

    loaded = load_executable(executables["c"].save_bytes())
    library = loaded.stats()["kernel_library"]
    assert library["numpy_fallbacks"] == {}
    if library["origin"] == "compiled":
        assert library["saved_source_matches"] is True, library
    else:  # (nothing regenerated to compare: the manifest's hash of the file's C chose the library)
        assert library["origin"] == "kernel cache" and "prebuilt" in library["load_reason"], library
    args = _arguments(np.random.default_rng(5), 12, 5, 4)
    for a, b in zip(_flatten(VirtualMachine(loaded).invoke("main", *args)),
                    _flatten(VirtualMachine(executables["python"]).invoke("main", *args)), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("flags", [(), ("-U__FLT16_MAX__",)], ids=["float16", "no-float16"])
def test_library_files_compile_warning_free_as_c11(tmp_path, flags):
    """What AOT applications build with (-std=c11 -Wall -Werror); also for a compiler without
    _Float16."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    for source in sorted(LIBRARY_DIR.glob("*.c")):
        subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", *flags, "-c", str(source),
                        "-o", str(tmp_path / "lib.o")], check=True, capture_output=True)


def test_constant_arguments_are_kernel_inputs():
    """A constant argument inside the primitive (topk's k, a constant sorted sequence) reaches the C
    function as an extra kernel input."""
    mod = tv.parse("""
def @main(%x: Tensor[(?), float32]) { (topk(%x, 3i64), searchsorted(arange(0f, 5f, 0.5f), %x, right=True)) }""")
    x = np.array([3, 1, 4, 1, 5, 9, 2, 6, 0.5], "float32")
    exe = tv.vm.compile(mod, target="c")
    assert exe.stats()["kernel_library"]["numpy_fallbacks"] == {}
    (values, indices), positions = VirtualMachine(exe).invoke("main", x)
    np.testing.assert_array_equal(values.numpy(), [9, 6, 5])
    np.testing.assert_array_equal(indices.numpy(), [5, 7, 4])
    np.testing.assert_array_equal(positions.numpy(), np.searchsorted(np.arange(0, 5, 0.5), x, side="right"))


def test_scatter_into_an_empty_axis_is_an_error_like_numpy():
    data, indices, updates = np.zeros((0, 3), "float32"), np.zeros((1, 3), "int32"), np.ones((1, 3), "float32")
    built = build_fused_module({"s": _primitive("scatter_elements", [data, indices, updates], {}, True, ())})[1]
    with pytest.raises(ExecutionError, match="index is out of range"):
        built["s"](data, indices, updates, np.empty((0, 3), "float32"))
    with pytest.raises(ExecutionError, match="size 0"):
        get_op("scatter_elements").kernel(Attrs({}), data, indices, updates)


# ---- shape-generic kernels over drawn shapes ---------------------------------------------------------

FUZZ = {  # name: (op, input dtypes, ranks, attrs); every dim ? (one kernel serves every drawn shape)
    "sort0": ("sort", ("float32",), (2,), {"axis": 0}),
    "sort1_desc": ("sort", ("int8",), (2,), {"axis": 1, "is_ascend": False}),
    "argsort_desc": ("argsort", ("float64",), (3,), {"axis": 1, "is_ascend": False, "dtype": "int64"}),
    "topk_k": ("topk", ("float32", "int64"), (2, 0), {"axis": 1}),
    "topk_k_asc": ("topk", ("uint16", "int32"), (2, 0), {"axis": 0, "is_ascend": True, "ret_type": "indices"}),
    "cumsum": ("cumsum", ("int32",), (2,), {"axis": 1, "exclusive": True, "dtype": "int16"}),
    "cumprod": ("cumprod", ("float32",), (3,), {"axis": -1}),
    "argwhere": ("argwhere", ("float32",), (2,), {}),
    "scatter": ("scatter_elements", ("float32", "int64", "float32"), (2, 2, 2), {"axis": 1, "reduction": "add"}),
    "unique": ("sorted_unique", ("float32", "int64"), (1, 1), {"is_sorted": False, "return_counts": True}),
    "searchsorted": ("searchsorted", ("int16", "int16"), (2, 2), {"right": True}),
}


@pytest.fixture(scope="module")
def fuzz_kernels():
    prims = {}
    for name, (op, dtypes, ranks, attrs) in FUZZ.items():
        params = [Var(f"p{i}", TensorType((Any(),) * rank, dtype)) for i, (dtype, rank) in enumerate(zip(dtypes, ranks))]
        prims[name] = Function(params, Call(Op(op), tuple(params), Attrs(attrs)), attrs={"Primitive": 1})
    return build_fused_module(prims)[1]


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(FUZZ)), seed=st.integers(0, 2**32 - 1),
       dims=st.lists(st.integers(0, 40), min_size=3, max_size=3))
def test_library_kernels_on_drawn_shapes(fuzz_kernels, name, seed, dims):
    op, dtypes, ranks, attrs = FUZZ[name]
    rng = np.random.default_rng(seed)
    shape = tuple(dims[:ranks[0]])
    data = _values(rng, shape, dtypes[0])
    if op == "topk":
        axis = attrs["axis"]
        arrays = [data, np.array(rng.integers(-1, shape[axis] + 1), dtypes[1])]  # (k < 1: the whole axis)
    elif op == "scatter_elements":
        if shape[1] == 0:
            shape = (shape[0], 1)
            data = _values(rng, shape, dtypes[0])
        index_shape = (rng.integers(0, shape[0] + 1), rng.integers(0, 6))
        arrays = [data, rng.integers(-shape[1], shape[1], index_shape).astype(dtypes[1]),
                  _values(rng, index_shape, dtypes[2])]
    elif op == "sorted_unique":
        arrays = [data, np.argsort(data, kind="stable")]
    elif op == "searchsorted":
        arrays = [np.sort(data, axis=-1), _values(rng, (shape[0], dims[2]), dtypes[1])]
    else:
        arrays = [data]
    expected = _reference(op, attrs, arrays)
    outputs = [np.empty(e.shape, e.dtype) for e in expected]
    fuzz_kernels[name](*arrays, *outputs)
    for out, ref in zip(outputs, expected, strict=True):
        np.testing.assert_array_equal(out, ref)


# ---- topk's partial selection (k of at most half the axis: quickselect, then a sort of the k best) -----

SELECTION = {  # name: (dtype, axis, attrs); k is a run-time argument (dynamic k), every dim ?
    "f32_desc": ("float32", 1, {"axis": 1}),
    "f32_asc_axis0": ("float32", 0, {"axis": 0, "is_ascend": True}),
    "f64_values": ("float64", 1, {"axis": -1, "ret_type": "values"}),
    "i8_indices": ("int8", 1, {"axis": 1, "ret_type": "indices", "dtype": "int64"}),
    "u16_asc": ("uint16", 0, {"axis": 0, "is_ascend": True}),
}


@pytest.fixture(scope="module")
def selection_kernels():
    prims = {}
    for name, (dtype, _, attrs) in SELECTION.items():
        params = [Var("x", TensorType((Any(), Any()), dtype)), Var("k", TensorType((), "int64"))]
        prims[name] = Function(params, Call(Op("topk"), tuple(params), Attrs(attrs)), attrs={"Primitive": 1})
    return build_fused_module(prims)[1]


def _lines_of(kind: str, rng, n: int) -> np.ndarray:
    """One line of n keys: few distinct values (ties), distinct, sorted, reversed, all equal, organ pipe."""
    if kind == "ties":
        return rng.integers(0, 5, n)
    if kind == "distinct":
        return rng.permutation(n)
    if kind == "sorted":
        return np.arange(n)
    if kind == "reversed":
        return np.arange(n)[::-1]
    if kind == "equal":
        return np.zeros(n, int)
    return np.concatenate([np.arange(n // 2), np.arange(n - n // 2)[::-1]])  # organ pipe


@pytest.mark.parametrize("kind", ["ties", "distinct", "sorted", "reversed", "equal", "pipe"])
@pytest.mark.parametrize("name", sorted(SELECTION))
def test_topk_selection_matches_the_stable_sort(selection_kernels, name, kind):
    """Lines long enough for the partition (k from 1 to the whole axis, around half of it), ties in
    the order of the stable sort, NaN and infinities among floats, against the NumPy kernel."""
    dtype, axis, attrs = SELECTION[name]
    rng = np.random.default_rng([ord(c) for c in name + kind])
    for n in (17, 33, 200, 1000):
        lines = np.stack([_lines_of(kind, rng, n) for _ in range(3)])
        data = lines if axis == 1 else lines.T
        data = (data if np.dtype(dtype).kind != "i" else data % 100 - 50).astype(dtype)
        if np.dtype(dtype).kind == "f" and kind == "ties":
            data.flat[rng.integers(0, data.size, 4)] = [np.nan, np.inf, -np.inf, np.nan]
        data = np.ascontiguousarray(data)
        for k in sorted({1, 2, 5, n // 4, n // 2 - 1, n // 2, n // 2 + 1, n - 1, n}):
            arrays = [data, np.array(k, "int64")]
            expected = _reference("topk", attrs, arrays)
            outputs = [np.empty(e.shape, e.dtype) for e in expected]
            selection_kernels[name](*arrays, *outputs)
            for out, ref in zip(outputs, expected, strict=True):
                np.testing.assert_array_equal(out, ref, err_msg=f"{name} {kind} n={n} k={k}")
