"""Trailing axes of an elementwise stage collapsed into one vector loop (``lower._collapse_rows``): the
squeeze-excite multiply ``(N, C, H, W) * (N, C, 1, 1)`` runs one loop over ``H*W`` per ``(n, c)``. The
loop IR and C show which axes collapsed (and which must not: a read that broadcasts over only part of
the tail, a transposed or sliced read, another use of an axis); compiled programs match the reference
interpreter for static, dynamic and odd shapes, with NaN and inf in the data."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tensorvm as tv
from tensorvm import te
from tensorvm.codegen.c_emit import emit_kernel
from tensorvm.codegen.loop_ir import PARALLEL, VECTORIZED, For, walk_stmts
from tensorvm.codegen.lower import lower
from tensorvm.te.expr import Const


def _loops(func, kind=None):
    return [s for s in walk_stmts(func.body) if isinstance(s, For) and (kind is None or s.kind == kind)]


def _vector_extents(func):
    return [s.extent.value if isinstance(s.extent, Const) else s.extent for s in _loops(func, VECTORIZED)]


def _multiply(x_shape, y_shape, index):
    """x * y over x's shape, y read at ``index(n, c, h, w)``."""
    x = te.placeholder(x_shape, "float32", "x")
    y = te.placeholder(y_shape, "float32", "y")
    out = te.compute(x_shape, lambda n, c, h, w: x[n, c, h, w] * y[index(n, c, h, w)], "mul")
    return lower("mul", [x, y], [out])


# ---- which axes collapse ------------------------------------------------------------------------------


def test_squeeze_excite_multiply_runs_one_loop_over_h_times_w():
    func = _multiply((8, 96, 14, 14), (8, 96, 1, 1), lambda n, c, h, w: (n, c, 0, 0))
    assert _vector_extents(func) == [196]
    parallel = _loops(func, PARALLEL)
    assert len(parallel) == 1 and parallel[0].extent.value == 8 * 96  # the (n, c) pairs split over threads
    source = emit_kernel(func).source
    assert re.search(r"#pragma omp simd\n\s*for \(int64_t h_w = 0; h_w < INT64_C\(196\); \+\+h_w\)", source)
    assert "((((n * INT64_C(96)) + c) * INT64_C(196)) + h_w)" in source  # both reads and the store: one run


@pytest.mark.parametrize("y_shape, index, extent", [
    ((8, 96, 14, 1), lambda n, c, h, w: (n, c, h, 0), 14),     # y varies along h only: rows stay rows
    ((1, 96, 1, 14), lambda n, c, h, w: (0, c, 0, w), 14),     # y varies along w only
    ((1, 1, 14, 14), lambda n, c, h, w: (0, 0, h, w), 196),    # a mask over (h, w): h and w, not c
    ((96, 1, 1), lambda n, c, h, w: (c, 0, 0), 196),           # a per-channel bias in NCHW
    ((8, 96, 14, 14), lambda n, c, h, w: (n, c, w, h), 14),    # transposed: not one run
    ((8, 96, 16, 16), lambda n, c, h, w: (n, c, h, w), 14),    # a window of a bigger array: rows apart
])
def test_only_axes_that_are_one_run_in_every_read_collapse(y_shape, index, extent):
    func = _multiply((8, 96, 14, 14), y_shape, index)
    assert _vector_extents(func) == [extent]


def test_other_uses_of_an_axis_keep_the_rows():
    x = te.placeholder((8, 96, 14, 14), "float32", "x")
    padded = te.compute(x.shape, lambda n, c, h, w: x[n, c, h, w] * te.if_then_else(h < 3, 1.0, 0.0), "mask")
    assert _vector_extents(lower("mask", [x], [padded])) == [14]
    ramp = te.compute(x.shape, lambda n, c, h, w: x[n, c, h, w] + te.cast(w, "float32"), "ramp")
    assert _vector_extents(lower("ramp", [x], [ramp])) == [14]


def test_a_parallel_loop_keeps_enough_iterations():
    """(1, 32, 112, 112): collapsing (h, w) would leave 32 iterations to split; the rows (112) are long."""
    func = _multiply((1, 32, 112, 112), (1, 32, 1, 1), lambda n, c, h, w: (n, c, 0, 0))
    assert _vector_extents(func) == [112]
    assert [s.extent.value for s in _loops(func, PARALLEL)] == [32 * 112]


def test_dynamic_dims_collapse_to_a_product():
    n, h, w = te.var("n"), te.var("h"), te.var("w")
    func = _multiply((n, 96, h, w), (n, 96, 1, 1), lambda a, c, y, x: (a, c, 0, 0))
    (extent,) = _vector_extents(func)
    assert repr(extent) == "(h * w)"
    parallel = _loops(func, PARALLEL)
    assert len(parallel) == 1 and parallel[0].parallel_if is not None  # fork only when worth it


def test_a_shared_row_loop_collapses_everything_inside_it():
    """(x - mean) * g inside the batch loop of a per-image mean: one vector loop over c*h*w."""
    x = te.placeholder((4, 8, 6, 5), "float32", "x")
    g = te.placeholder((8, 6, 5), "float32", "g")
    r = [te.reduce_axis(e, f"r{i}") for i, e in enumerate((8, 6, 5))]
    total = te.compute((4,), lambda n: te.sum(x[n, r[0], r[1], r[2]], axis=r), "total")
    out = te.compute(x.shape, lambda n, c, h, w: (x[n, c, h, w] - total[n] / 240.0) * g[c, h, w], "out")
    func = lower("centre", [x, g], [out])
    assert 240 in _vector_extents(func)


# ---- compiled programs against the interpreter ------------------------------------------------------


def _program(x_dims, y_dims, body):
    return tv.parse(f'''#[version = "0.0.5"]
def @main(%x: Tensor[({x_dims}), float32], %y: Tensor[({y_dims}), float32]) {{ {body} }}''')


HARD_SIGMOID_MULTIPLY = "multiply(%x, divide(clip(add(%y, 3f), a_min=0f, a_max=6f), 6f))"


def _specials(shape, rng):
    data = rng.standard_normal(shape).astype(np.float32)
    flat = data.reshape(-1)
    if flat.size >= 8:
        flat[flat.size // 5] = np.nan
        flat[flat.size // 2] = np.inf
        flat[-1] = -np.inf
    return data


def _run(mod, shapes, seed, kernel_threads, expect_extent=None):
    exe = tv.vm.compile(mod, target="c")
    source = "".join(exe.kernel_source(p.name) for p in exe.primitives if "shape_func" not in p.name)
    if expect_extent is not None:
        extents = re.findall(r"#pragma omp simd\n\s*for \(int64_t \w+ = 0; \w+ < ([^;]+);", source)
        assert expect_extent in extents, extents
    vm = tv.vm.VirtualMachine(exe)
    reference = tv.create_executor("debug", mod).evaluate()
    rng = np.random.default_rng(seed)
    for threads in (1, 2):
        kernel_threads(threads)
        for x_shape, y_shape in shapes:
            x, y = _specials(x_shape, rng), _specials(y_shape, rng)
            got = vm.invoke("main", x, y).numpy()
            with np.errstate(invalid="ignore"):
                want = reference(x, y).numpy()
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            finite = np.isfinite(want)
            np.testing.assert_array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
            np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("x_shape, y_shape, extent", [
    ((8, 96, 14, 14), (8, 96, 1, 1), "INT64_C(196)"),
    ((4, 96, 15, 13), (4, 96, 1, 1), "INT64_C(195)"),    # not a multiple of any vector width
    ((3, 5, 7, 9), (3, 5, 1, 1), "INT64_C(63)"),          # small: a serial kernel
    ((2, 80, 7, 9), (2, 80, 7, 1), "INT64_C(9)"),         # y along h only: no collapse
    ((2, 80, 7, 9), (1, 80, 1, 9), "INT64_C(9)"),         # y along w only: no collapse
    ((2, 80, 7, 9), (1, 1, 7, 9), "INT64_C(63)"),         # a mask over (h, w)
    ((2, 80, 7, 9), (80, 1, 1), "INT64_C(63)"),           # a bias per channel
])
def test_static_broadcasts_match_the_interpreter(x_shape, y_shape, extent, kernel_threads):
    mod = _program(", ".join(map(str, x_shape)), ", ".join(map(str, y_shape)), HARD_SIGMOID_MULTIPLY)
    _run(mod, [(x_shape, y_shape)], sum(x_shape), kernel_threads, extent)


@pytest.mark.parametrize("x_dims, y_dims", [("?, 96, ?, ?", "?, 96, 1, 1"), ("n, 96, h, w", "n, 96, 1, 1")])
def test_dynamic_broadcasts_match_the_interpreter(x_dims, y_dims, kernel_threads):
    mod = _program(x_dims, y_dims, HARD_SIGMOID_MULTIPLY)
    shapes = [((b, 96, h, w), (b, 96, 1, 1)) for b, h, w in ((1, 7, 7), (3, 14, 14), (2, 5, 3), (8, 1, 1),
                                                               (1, 0, 4))]
    _run(mod, shapes, 7, kernel_threads, "(p0_d2 * p0_d3)" if "?" in x_dims else "(h * w)")


def test_nan_propagates_through_a_collapsed_maximum(kernel_threads):
    """np.maximum keeps a NaN from either side, the broadcast side included."""
    mod = _program("8, 96, 7, 7", "8, 96, 1, 1", "maximum(%x, %y)")
    _run(mod, [((8, 96, 7, 7), (8, 96, 1, 1))], 3, kernel_threads, "INT64_C(49)")
    mod = _program("8, 96, 7, 7", "8, 96, 1, 1", "minimum(%y, %x)")
    _run(mod, [((8, 96, 7, 7), (8, 96, 1, 1))], 4, kernel_threads, "INT64_C(49)")


def test_a_broadcast_decided_at_run_time_keeps_the_rows(kernel_threads):
    """Both operands (?, 96, ?, ?): either may broadcast over h or w at run time (a ``select`` in its
    index), so no axis collapses, and every combination still computes right."""
    mod = _program("?, 96, ?, ?", "?, 96, ?, ?", HARD_SIGMOID_MULTIPLY)
    exe = tv.vm.compile(mod, target="c")
    source = "".join(exe.kernel_source(p.name) for p in exe.primitives if "shape_func" not in p.name)
    loops = re.findall(r"#pragma omp simd\n\s*for \(int64_t (\w+) = 0;", source)
    assert loops and all(re.fullmatch(r"i3(_\d+)?", v) for v in loops), loops  # (collapsed: i2_i3)
    shapes = [((2, 96, 7, 5), (2, 96, 1, 1)), ((2, 96, 7, 5), (2, 96, 7, 5)), ((1, 96, 1, 5), (3, 96, 7, 1)),
              ((2, 96, 7, 1), (1, 96, 1, 5))]
    _run(mod, shapes, 11, kernel_threads)
