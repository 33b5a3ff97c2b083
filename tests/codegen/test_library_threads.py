"""The parallel loops of the shared kernel libraries' hand-written functions on tensorvm's pool
(``tv_lib_run`` in tv_lib.h, ``tv_team_run``): sort, argsort and topk (algorithm.c), the running sums and
the im2col convolution (tv_gemm.h) at 1, 2 and 3 threads, on lines above the parallel threshold (an odd
count: chunks of unequal size), below it and on empty inputs; a call above the threshold is a pool job at
2 and 3 threads; no OpenMP parallel region is left in the library sources but the static AOT model's.
Oracle: NumPy (stable sorts, cumsum, the convolution op's NumPy kernel). roi_align's cases at several
threads are in tests/ops/test_vision_ops.py."""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

from tensorvm import op
from tensorvm.codegen import host
from tensorvm.codegen.build import have_compiler
from tensorvm.codegen.c_emit import LIBRARY_DIR, PRELUDE, library_text
from tensorvm.codegen.fused import build_fused_module
from tensorvm.ir.attrs import Attrs
from tensorvm.ir.expr import Call, Function, Op, Var
from tensorvm.ir.types import Any, TensorType
from tensorvm.op.registry import get_op

pytestmark = pytest.mark.skipif(not have_compiler(), reason="needs a C compiler")

K = 5  # topk's k (a small k of a long line: the one-pass selection; k of half a line: the partition)


def _prim(name, params, attrs):
    call = Call(Op(name), tuple(params), Attrs(get_op(name).normalize_attrs(attrs)))
    return Function(params, call, attrs={"Primitive": 1})


def _dynamic(dtype, rank=2):
    return Var("x", TensorType((Any(),) * rank, dtype))


@pytest.fixture(scope="module")
def library():
    prims = {
        "sort_desc": _prim("sort", [_dynamic("float32")], {"axis": 1, "is_ascend": False}),
        "argsort_axis0": _prim("argsort", [_dynamic("int32")], {"axis": 0, "is_ascend": True, "dtype": "int32"}),
        "topk_select": _prim("topk", [_dynamic("float32")], {"k": K, "axis": 1, "ret_type": "both"}),
        "topk_half": _prim("topk", [_dynamic("int32")], {"k": 64, "axis": 1, "ret_type": "both",
                                                          "is_ascend": True}),
        "cumsum": _prim("cumsum", [_dynamic("float64")], {"axis": 1}),
    }
    module, kernels = build_fused_module(prims)
    stats = module.library._cdll.tv_team_stats
    stats.argtypes, stats.restype = [ctypes.c_void_p], ctypes.c_int32
    return kernels, stats


def _jobs(stats) -> int:
    out = np.zeros(4, np.int64)
    stats(out.ctypes.data)
    return int(out[0])


def _big_lines(n: int) -> int:
    """An odd number of lines of n elements, twice the library's parallel threshold in all."""
    lines = 2 * host.kernel_rules().sort_parallel_elements // n + 1
    return lines | 1


def _stable_order(x, axis, ascending):
    """The positions a stable sort gives (equal keys by position), in either direction."""
    return np.argsort(x if ascending else -x, axis=axis, kind="stable")


def _shapes(n):
    return [(_big_lines(n), n), (3, n), (0, n), (4, 0)]


@pytest.mark.parametrize("count", [1, 2, 3])
def test_sorts_match_numpy_at_any_thread_count(library, threads, count):
    kernels, stats = library
    threads(count)
    rng = np.random.default_rng(count)
    for shape in _shapes(131):
        x = rng.integers(-20, 20, shape).astype("float32")  # (many ties: the stable order matters)
        out = np.empty_like(x)
        before = _jobs(stats)
        kernels["sort_desc"](x, out)
        np.testing.assert_array_equal(out, np.take_along_axis(x, _stable_order(x, 1, False), 1), err_msg=str(shape))
        big = shape == _shapes(131)[0]
        assert (_jobs(stats) > before) == (count > 1 and big), (count, shape)  # a pool job when parallel
        xt = np.ascontiguousarray(x.T.astype("int32"))
        order = np.empty(xt.shape, "int32")
        kernels["argsort_axis0"](xt, order)  # (lines along the inner axis)
        np.testing.assert_array_equal(order, _stable_order(xt, 0, True), err_msg=str(shape))


@pytest.mark.parametrize("count", [1, 2, 3])
def test_topk_matches_numpy_at_any_thread_count(library, threads, count):
    kernels, _ = library
    threads(count)
    rng = np.random.default_rng(10 + count)
    for name, dtype, k, ascending in (("topk_select", "float32", K, False), ("topk_half", "int32", 64, True)):
        for shape in _shapes(129):
            if shape[1] < k:
                continue
            x = rng.integers(-50, 50, shape).astype(dtype)
            values, indices = np.empty((shape[0], k), dtype), np.empty((shape[0], k), "int32")
            kernels[name](x, values, indices)
            order = _stable_order(x, 1, ascending)[:, :k]
            np.testing.assert_array_equal(indices, order, err_msg=f"{name} {shape}")
            np.testing.assert_array_equal(values, np.take_along_axis(x, order, 1), err_msg=f"{name} {shape}")


@pytest.mark.parametrize("count", [1, 2, 3])
def test_cumsum_matches_numpy_at_any_thread_count(library, threads, count):
    kernels, _ = library
    threads(count)
    rng = np.random.default_rng(20 + count)
    for shape in _shapes(77):
        x = rng.standard_normal(shape)
        out = np.empty_like(x)
        kernels["cumsum"](x, out)
        np.testing.assert_allclose(out, np.cumsum(x, axis=1), rtol=1e-12, atol=1e-12)


# im2col (the fallback convolution: float64, strided, dilated, odd sizes), above and below the parallel
# threshold (rows C*KH*KW of OH*OW elements each), and an empty batch.
CONVS = [
    ((2, 7, 61, 53), (5, 7, 3, 5), dict(padding=[1, 2, 0, 1], strides=[1, 2], dilation=[2, 1])),
    ((1, 3, 9, 7), (4, 3, 3, 3), dict(padding=[1, 1, 1, 1])),
]


@pytest.mark.parametrize("count", [1, 2, 3])
@pytest.mark.parametrize("data_shape,weight_shape,attrs", CONVS)
def test_im2col_convolution_matches_numpy_at_any_thread_count(threads, count, data_shape, weight_shape, attrs,
                                                              monkeypatch):
    from tensorvm.codegen import blas

    if not blas.available():
        pytest.skip("no host BLAS callable from C: the convolution is not a library call")
    monkeypatch.setenv("TENSORVM_BLAS", "c")
    x = Var("x", TensorType((Any(),) + data_shape[1:], "float64"))
    w = Var("w", TensorType(weight_shape, "float64"))
    call = op.nn.conv2d(x, w, **attrs)
    module, kernels = build_fused_module({"k": Function([x, w], call, attrs={"Primitive": 1})})
    assert "tv_conv2d_f64(" in module.source  # (the im2col form: float64 never takes the vector kernels)
    threads(count)
    conv = get_op("nn.conv2d")
    rng = np.random.default_rng(count)
    for batch in (data_shape[0], 0):
        data = rng.standard_normal((batch,) + data_shape[1:])
        weight = rng.standard_normal(weight_shape)
        want = conv.kernel(conv.normalize_attrs(call.attrs), data, weight)
        got = np.full(want.shape, np.nan)
        kernels["k"](data, weight, got)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_big_convolution_is_above_the_parallel_threshold():
    """(So that the first case above does run im2col in chunks on the pool.)"""
    (_, c, h, w), (_, _, kh, kw), attrs = CONVS[0]
    (pt, pl, pb, pr), (sh, sw), (dh, dw) = attrs["padding"], attrs["strides"], attrs["dilation"]
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (w + pl + pr - (kw - 1) * dw - 1) // sw + 1
    assert c * kh * kw * oh * ow >= host.kernel_rules().parallel_elements


# The static AOT model's loop over a library function's chunks (tv_lib_run when the unit has no pool) and
# its softmax and mean over rows (tv_kernel.h; shared libraries call tv_gemm.h's team forms on the pool
# instead) are the only OpenMP parallel regions left in the hand-written C.
STATIC_AOT_REGIONS = {"tv_lib.h": 1, "tv_kernel.h": 2}


def test_no_openmp_parallel_region_but_the_static_aot_ones():
    found = {}
    sources = [*LIBRARY_DIR.glob("*.[ch]"), *(LIBRARY_DIR.parent.parent / "vm" / "native").glob("*.[ch]")]
    assert len(sources) > 10
    for path in sources:
        count = len(re.findall(r"omp\s+parallel", path.read_text()))
        if count:
            found[path.name] = count
    assert found == STATIC_AOT_REGIONS
    lib = (LIBRARY_DIR / "tv_lib.h").read_text()
    static_branch = lib[lib.index("#ifdef TV_GEMM_H"):]
    assert static_branch.index("#else") < static_branch.index("omp parallel") < static_branch.index("#endif")


@pytest.mark.parametrize("openmp", [(), ("-fopenmp",)], ids=["serial", "openmp"])
def test_static_aot_unit_with_every_library_file_compiles_warning_free(tmp_path, openmp):
    """The static AOT model's text (its prelude, then the library files its kernels call: tv_lib_run's
    OpenMP or serial form, no pool), as applications build it."""
    import shutil
    import subprocess

    from tensorvm.aot.build import _static_prelude

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    text = _static_prelude(PRELUDE) + library_text(sorted(p.name for p in LIBRARY_DIR.glob("*.c")))
    assert "TV_TEAM_H" not in text and "tv_lib_run" in text  # (no pool in the unit)
    source = tmp_path / "unit.c"
    source.write_text(text)
    result = subprocess.run([cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", *openmp, "-c", str(source),
                             "-o", str(tmp_path / "unit.o")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[:4000]


@pytest.mark.parametrize("openmp", [(), ("-fopenmp",)], ids=["serial", "openmp"])
@pytest.mark.parametrize("header", ["tv_lib.h", "tv_shape.h"])
def test_library_header_compiles_without_the_prelude(tmp_path, header, openmp):
    """The C shape functions are a unit of their own (tv_shape.h, which includes tv_lib.h) built with the
    kernels' flags but no prelude (regression: tv_lib_run's thread budget called the prelude's tv_threads,
    undeclared there with OpenMP)."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    result = subprocess.run([cc, "-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", *openmp, "-x", "c", "-c",
                             str(LIBRARY_DIR / header), "-o", str(tmp_path / "unit.o")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[:4000]
