"""Generated parallel loops on tensorvm's pool (``c_emit._Emitter.team_loop``): the loop body outlined into
a chunk function that reads its captures from a context struct, run through ``tv_team_run``. Elementwise,
reducing, fused and dynamic kernels against NumPy at 1, 2 and 3 threads (extents of zero, of fewer
iterations than threads, and large); a kernel called from a pool worker (its own loop then runs serially,
no deadlock); no OpenMP parallel pragma left in the kernels. Oracle: NumPy."""

from __future__ import annotations

import ctypes
import re
import threading

import numpy as np
import pytest

from tensorvm import te
from tensorvm.codegen.build import build_library, have_compiler
from tensorvm.codegen.c_emit import EmitOptions, emit_kernel, emit_library
from tensorvm.codegen.loop_ir import PARALLEL, For, walk_stmts
from tensorvm.codegen.lower import lower
from tensorvm.codegen.module import build_module

pytestmark = pytest.mark.skipif(not have_compiler(), reason="needs a C compiler")

WIDTH = 257  # (odd: vector loops with a tail)


def _funcs():
    n = te.var("n")
    x = te.placeholder((n, WIDTH), "float32", "x")
    y = te.placeholder((n, WIDTH), "float32", "y")
    scale = te.compute((n, WIDTH), lambda i, j: x[i, j] * 2.0 + y[i, j], "axpy")
    r = te.reduce_axis(WIDTH, "r")
    rowsum = te.compute((n,), lambda i: te.sum(x[i, r.var] * y[i, r.var], r), "rowdot")
    # a fused chain: a row maximum, then exp(x - max) over the row, then its normalisation
    k = te.reduce_axis(WIDTH, "k")
    peak = te.compute((n,), lambda i: te.max(x[i, k.var], axis=k), "peak")
    e = te.compute((n, WIDTH), lambda i, j: te.exp(x[i, j] - peak[i]), "e")
    s = te.reduce_axis(WIDTH, "s")
    total = te.compute((n,), lambda i: te.sum(e[i, s.var], s), "total")
    soft = te.compute((n, WIDTH), lambda i, j: e[i, j] / total[i], "soft")
    # fully dynamic extents (rows and columns), integer arithmetic
    m, w = te.var("m"), te.var("w")
    a = te.placeholder((m, w), "int32", "a")
    shifted = te.compute((m, w), lambda i, j: a[i, j] * 3 - i + j, "shifted")
    return [lower("axpy", [x, y], [scale]), lower("rowdot", [x, y], [rowsum]), lower("soft", [x], [soft]),
            lower("shifted", [a], [shifted])]


@pytest.fixture(scope="module")
def kernels():
    funcs = _funcs()
    for func in funcs:  # (each has a parallel loop for the pool to run)
        assert any(isinstance(s, For) and s.kind == PARALLEL for s in walk_stmts(func.body)), func.name
    return build_module(funcs)




@pytest.mark.parametrize("count", [1, 2, 3])
@pytest.mark.parametrize("rows", [0, 1, 2, 3, 700])
def test_parallel_kernels_match_numpy(kernels, threads, count, rows):
    threads(count)
    rng = np.random.default_rng(rows * 10 + count)
    x = rng.standard_normal((rows, WIDTH)).astype(np.float32)
    y = rng.standard_normal((rows, WIDTH)).astype(np.float32)
    out = np.full((rows, WIDTH), np.nan, np.float32)
    kernels["axpy"](x, y, out)
    np.testing.assert_allclose(out, x * 2 + y, rtol=1e-6)
    dot = np.full(rows, np.nan, np.float32)
    kernels["rowdot"](x, y, dot)
    np.testing.assert_allclose(dot, (x.astype(np.float64) * y).sum(1), rtol=1e-4, atol=1e-4)
    soft = np.full((rows, WIDTH), np.nan, np.float32)
    kernels["soft"](x, soft)
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True)) if rows else x
    np.testing.assert_allclose(soft, e / e.sum(1, keepdims=True) if rows else x, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("count", [1, 2, 3])
@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (1, 1), (2, 70000), (40000, 3), (3, 3)])
def test_dynamic_extents_match_numpy(kernels, threads, count, shape):
    threads(count)
    a = np.random.default_rng(count).integers(-1000, 1000, shape).astype(np.int32)
    out = np.full(shape, -7, np.int64)  # (the index terms make it int64)
    kernels["shifted"](a, out)
    i, j = np.indices(shape)
    np.testing.assert_array_equal(out, a.astype(np.int64) * 3 - i + j)


def test_big_loop_is_one_pool_job_of_several_chunks(threads):
    """At 2 threads a loop above the parallel threshold is one tv_team job split into chunks (the stats
    count them), with the result right; at 1 thread it runs on the caller without a job."""
    func = _funcs()[0]
    library = build_library(emit_library([emit_kernel(func)]))
    stats = library._cdll.tv_team_stats
    stats.argtypes, stats.restype = [ctypes.c_void_p], ctypes.c_int32
    kernel = library.function("axpy", 3, 3)
    rows = 2000
    x = np.random.default_rng(0).standard_normal((rows, WIDTH)).astype(np.float32)
    out = np.empty_like(x)

    def run() -> np.ndarray:
        before = np.zeros(4, np.int64)
        after = np.zeros(4, np.int64)
        stats(before.ctypes.data)
        assert kernel(x.ctypes.data, x.ctypes.data, out.ctypes.data, rows, rows, rows) == 0
        stats(after.ctypes.data)
        np.testing.assert_allclose(out, x * 3, rtol=1e-6)
        return after - before

    threads(2)
    delta = run()
    assert delta[0] == 1 and delta[1] + delta[2] >= 2  # one job; its chunks ran on the caller or a worker
    threads(1)
    assert run()[0] == 0


def test_threshold_counts_the_work_of_every_stage(threads):
    """A kernel of several stages over the same rows (a row maximum, exp, a row sum, the quotient) forks
    from the work of all its stages, not from that of its largest alone: rows whose single stage is
    below the parallel threshold but whose four stages are above it run as one pool job at 2 threads;
    at 1 to 3 threads the result matches NumPy."""
    from tensorvm.codegen.lower import parallel_work_threshold

    func = _funcs()[2]
    library = build_library(emit_library([emit_kernel(func)]))
    stats = library._cdll.tv_team_stats
    stats.argtypes, stats.restype = [ctypes.c_void_p], ctypes.c_int32
    kernel = library.function("soft", 2, 2)
    rows = parallel_work_threshold() // (2 * WIDTH)  # one stage: half the threshold; all four: twice it
    x = np.random.default_rng(1).standard_normal((rows, WIDTH)).astype(np.float32)
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    for count in (1, 2, 3):
        threads(count)
        before, after = np.zeros(4, np.int64), np.zeros(4, np.int64)
        out = np.full_like(x, np.nan)
        stats(before.ctypes.data)
        assert kernel(x.ctypes.data, out.ctypes.data, rows, rows) == 0
        stats(after.ctypes.data)
        np.testing.assert_allclose(out, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
        assert (after - before)[0] == (count > 1), count  # (one job from 2 threads; none at 1)


_NESTED = """
typedef struct { int64_t rows, parts; const float* x; float* out; int32_t rc[16]; } nest_job;
static void nest_chunk(void* ctx, int64_t i) {
  nest_job* j = (nest_job*)ctx;
  const int64_t n = j->rows / j->parts;  /* each chunk calls the kernel on its block of rows */
  j->rc[i] = axpy(j->x + i * n * %(width)d, j->x + i * n * %(width)d, j->out + i * n * %(width)d, n, n, n);
}
int32_t nested(int64_t rows, int64_t parts, const float* x, float* out) {
  nest_job j = {rows, parts, x, out, {0}};
  tv_team_run(parts, tv_team_threads(), nest_chunk, &j);
  int32_t rc = 0;
  for (int64_t i = 0; i < parts; ++i) rc |= j.rc[i];
  return rc;
}
"""


def test_kernel_called_from_a_pool_worker_does_not_deadlock(threads):
    """A kernel whose parallel loop is reached from a chunk of another tv_team job (on the caller or on a
    worker) runs that loop serially: it finishes, with the right result, at 2 and 3 threads."""
    func = _funcs()[0]
    source = emit_library([emit_kernel(func)]) + _NESTED % {"width": WIDTH}
    library = build_library(source)
    nested = library._cdll.nested
    nested.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    nested.restype = ctypes.c_int32
    rows, parts = 4000, 8  # (each block is above the parallel threshold on its own)
    x = np.random.default_rng(1).standard_normal((rows, WIDTH)).astype(np.float32)
    for count in (2, 3):
        threads(count)
        out = np.full_like(x, np.nan)
        result = []
        worker = threading.Thread(target=lambda out=out, result=result: result.append(
            nested(rows, parts, x.ctypes.data, out.ctypes.data)), daemon=True)
        worker.start()
        worker.join(timeout=120)
        assert not worker.is_alive(), f"a nested parallel loop did not finish at {count} threads"
        assert result == [0]
        np.testing.assert_allclose(out, x * 3, rtol=1e-6)


def test_no_openmp_parallel_pragma_in_team_kernels():
    """With the pool (the default) a kernel has no ``omp parallel`` pragma and one ``tv_team_run`` per
    parallel loop; with ``team=False`` (the static AOT flow) it has the pragma and no pool call."""
    for func in _funcs():
        source = emit_kernel(func).source
        assert "omp parallel" not in source and "omp_" not in source, func.name
        loops = sum(1 for s in walk_stmts(func.body) if isinstance(s, For) and s.kind == PARALLEL)
        assert len(re.findall(r"\btv_team_run\(", source)) == loops
        assert len(re.findall(rf"static void {func.name}_tvpar\d+\(", source)) == loops
        omp = emit_kernel(func, EmitOptions(team=False)).source
        assert "#pragma omp parallel for" in omp and "tv_team_run" not in omp



@pytest.mark.parametrize("log", [0, 1])
def test_shared_library_softmax_rows_on_the_pool(threads, log):
    """In a shared library ``tv_softmax_f32`` is the pool's row split (``tv_softmax_team_f32``): above the
    parallel threshold, at 1, 2 and 3 threads, rows fewer than the threads included, against NumPy."""
    source = emit_library([]) + ("int32_t softmax_rows(int64_t rows, int64_t n, const float* x, float* y, int64_t log)"
                                 " { return tv_softmax_f32(rows, n, x, y, log); }\n")
    assert "#define tv_softmax_f32 tv_softmax_team_f32" in source
    library = build_library(source)
    fn = library._cdll.softmax_rows
    fn.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = ctypes.c_int32
    for count in (1, 2, 3):
        threads(count)
        for rows, n in [(0, 5), (1, 70000), (2, 40000), (300, 1001)]:
            x = np.random.default_rng(rows + count).standard_normal((rows, n)).astype(np.float32) * 4
            y = np.full_like(x, np.nan)
            assert fn(rows, n, x.ctypes.data, y.ctypes.data, log) == 0
            shifted = x.astype(np.float64) - x.max(1, keepdims=True) if rows else x
            total = np.exp(shifted).sum(1, keepdims=True)
            expected = shifted - np.log(total) if log else np.exp(shifted) / total
            np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6, err_msg=f"{rows}x{n} at {count}")
