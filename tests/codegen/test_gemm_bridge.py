"""BLAS called from the generated C (``tv_gemm_*``, the "blas" variant of the matrix products).

The oracle is NumPy (float64 products of the same operands). Each case checks that the variant the
kernel's dispatch picks is the BLAS one when the product is big enough, so the bridge is what ran.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tensorvm import op
from tensorvm.codegen import blas, build, c_emit
from tensorvm.codegen.c_emit import prelude
from tensorvm.codegen.fused import build_fused_module, lower_primitive
from tensorvm.codegen.host import kernel_rules
from tensorvm.codegen.loop_ir import find_dispatch
from tensorvm.codegen.strategy import gemm_min_work
from tensorvm.ir.expr import Function, Let, Tuple, Var, const
from tensorvm.ir.types import Any, TensorType

pytestmark = pytest.mark.skipif(not blas.available(), reason="no host BLAS callable from C (NumPy's OpenBLAS)")

F32 = "float32"


def _fn(params, body):
    return Function(params, body, attrs={"Primitive": 1})


def _t(*shape, dtype=F32):
    return TensorType(tuple(Any() if d is None else d for d in shape), dtype)


def _rand(rng, shape, dtype=F32):
    return rng.standard_normal(shape).astype(dtype)


def _close(got, want, dtype=F32):
    tol = 1e-4 if dtype == F32 else 1e-10
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max(initial=0))))


@pytest.fixture(autouse=True)
def bridge_mode(monkeypatch):
    monkeypatch.setenv("TENSORVM_BLAS", "c")


def _build(prim):
    module, kernels = build_fused_module({"k": prim})
    return module, kernels["k"]


def _run(kernel, arrays, out_shapes, dtype=F32):
    outs = [np.empty(s, dtype) for s in out_shapes]
    kernel(*arrays, *outs)
    return outs


# ---- the products -------------------------------------------------------------------------------


def _dense(x_shape, n, k):
    x, w = Var("x", _t(*x_shape, k)), Var("w", _t(n, k))
    return _fn([x, w], op.nn.dense(x, w)), lambda a, b: a @ b.T


def _matmul(ta, tb):
    a, b = Var("a", _t(None, None)), Var("b", _t(None, None))
    prim = _fn([a, b], op.nn.matmul(a, b, transpose_a=ta, transpose_b=tb))
    return prim, lambda x, y: (x.T if ta else x) @ (y.T if tb else y)


def _batch_matmul(ta, tb):
    x, y = Var("x", _t(None, None, None)), Var("y", _t(None, None, None))
    prim = _fn([x, y], op.nn.batch_matmul(x, y, transpose_a=ta, transpose_b=tb))
    return prim, lambda a, b: (np.swapaxes(a, 1, 2) if ta else a) @ (np.swapaxes(b, 1, 2) if tb else b)


def _onnx_matmul(a_rank, b_rank, dtype=F32):
    a, b = Var("a", _t(*[None] * a_rank, dtype=dtype)), Var("b", _t(*[None] * b_rank, dtype=dtype))
    return _fn([a, b], op.onnx.matmul(a, b)), np.matmul


CASES = [
    # (name, prim and oracle, operand shapes, blas expected); a product expected to reach the library has at
    # least 2^15 multiply-adds, gemm_min_work on AVX-512 with two FMA pipes (2^14 on AVX2)
    ("dense", _dense((None,), 48, 40), [(33, 40), (48, 40)], True),
    ("dense-1-row (gemv)", _dense((None,), 600, 64), [(1, 64), (600, 64)], True),
    # B over TV_ONTHEFLY_B floats: host BLAS itself (below it the packed tiles, B packed on the fly)
    ("dense-wide-b (host BLAS)", _dense((None,), 330, 256), [(40, 256), (330, 256)], True),
    ("matmul-wide-b (host BLAS)", _matmul(False, False), [(21, 300), (300, 250)], True),
    ("dense-3d", _dense((None, None), 24, 32), [(3, 18, 32), (24, 32)], True),
    ("dense-tiny (generated code)", _dense((None,), 4, 4), [(2, 4), (4, 4)], False),
    ("matmul", _matmul(False, False), [(20, 30), (30, 60)], True),
    ("matmul-ta", _matmul(True, False), [(30, 20), (30, 60)], True),
    ("matmul-tb", _matmul(False, True), [(20, 30), (60, 30)], True),
    ("matmul-ta-tb", _matmul(True, True), [(30, 20), (60, 30)], True),
    # one column: BLAS's GEMV on op(A) (not panels of which one column is used), every transpose
    ("matmul-one-column", _matmul(False, False), [(300, 120), (120, 1)], True),
    ("matmul-one-column-ta", _matmul(True, False), [(120, 300), (120, 1)], True),
    ("matmul-one-column-tb", _matmul(False, True), [(300, 120), (1, 120)], True),
    ("matmul-one-column-ta-tb", _matmul(True, True), [(120, 300), (1, 120)], True),
    ("batch_matmul", _batch_matmul(False, True), [(5, 17, 32), (5, 24, 32)], True),
    ("batch_matmul-ta", _batch_matmul(True, False), [(3, 32, 17), (3, 32, 24)], True),
    ("batch_matmul-broadcast-x", _batch_matmul(False, True), [(1, 17, 32), (4, 24, 32)], True),
    ("batch_matmul-broadcast-y", _batch_matmul(False, False), [(4, 17, 32), (1, 32, 24)], True),
    ("onnx.matmul-4d", _onnx_matmul(4, 4), [(1, 3, 20, 32), (1, 3, 32, 20)], True),
    ("onnx.matmul-b-matrix", _onnx_matmul(3, 2), [(2, 20, 30), (30, 40)], True),
    ("onnx.matmul-a-matrix", _onnx_matmul(2, 3), [(20, 30), (3, 30, 40)], True),
    ("onnx.matmul-broadcast (generated code)", _onnx_matmul(3, 3), [(1, 20, 30), (3, 30, 40)], False),
    ("onnx.matmul-float64", _onnx_matmul(3, 3, "float64"), [(2, 20, 30), (2, 30, 40)], True),
]


def _attention_scores(dtype=F32):
    """Q K^T of attention with the heads split by transposes (FuseOps puts them in the product's group)."""
    q, k = Var("q", _t(None, None, None, 16, dtype=dtype)), Var("k", _t(None, None, None, 16, dtype=dtype))
    prim = _fn([q, k], op.onnx.matmul(op.transpose(q, axes=[0, 2, 1, 3]), op.transpose(k, axes=[0, 2, 3, 1])))
    return prim, lambda x, y: x.transpose(0, 2, 1, 3) @ y.transpose(0, 2, 3, 1)


def _attention_context():
    """P V with V's heads split by a transpose and the result's heads merged back by another."""
    p, v = Var("p", _t(None, None, None, None)), Var("v", _t(None, None, None, 16))
    product = op.onnx.matmul(p, op.transpose(v, axes=[0, 2, 1, 3]))
    prim = _fn([p, v], op.transpose(product, axes=[0, 2, 1, 3]))
    return prim, lambda x, y: (x @ y.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)


def _transposed_batch_matmul():
    """nn.batch_matmul with transpose_a over a transposed operand (and a reshape before it)."""
    x, y = Var("x", _t(None, None, None)), Var("y", _t(None, None))
    b = op.transpose(op.reshape(y, newshape=[-1, 24, 16]), axes=[0, 2, 1])
    prim = _fn([x, y], op.nn.batch_matmul(op.transpose(x, axes=[0, 2, 1]), b, transpose_a=True, transpose_b=True))
    return prim, lambda a, c: a @ c.reshape(-1, 24, 16)


def _transposed_matrix():
    a, b = Var("a", _t(None, None, None)), Var("b", _t(None, None, None))
    prim = _fn([a, b], op.onnx.matmul(a, op.transpose(b, axes=[0, 2, 1])))
    return prim, lambda x, y: x @ np.swapaxes(y, 1, 2)


def _reshaped_transpose():
    """A reshape of a transposed view (through an identity transpose): not a strided view of the input."""
    a, b = Var("a", _t(None, None, None)), Var("b", _t(None, None, None))
    view = op.reshape(op.transpose(op.transpose(b, axes=[0, 2, 1]), axes=[0, 1, 2]), newshape=[0, 0, -1])
    prim = _fn([a, b], op.onnx.matmul(a, view))
    return prim, lambda x, y: x @ np.swapaxes(y, 1, 2)


CASES += [
    # transposes read and written in place (tv_gemm_strided): batches of two dims, of one, and none
    ("strided-scores", _attention_scores(), [(2, 33, 3, 16), (2, 40, 3, 16)], True),
    ("strided-scores-one-batch-entry", _attention_scores(), [(1, 60, 1, 16), (1, 64, 1, 16)], True),
    ("strided-scores-float64", _attention_scores("float64"), [(1, 30, 2, 16), (1, 40, 2, 16)], True),
    ("strided-context", _attention_context(), [(2, 3, 25, 30), (2, 30, 3, 16)], True),
    ("strided-batch_matmul", _transposed_batch_matmul(), [(4, 40, 24), (96, 16)], True),
    ("strided-batch_matmul-broadcast", _transposed_batch_matmul(), [(1, 40, 24), (96, 16)], True),
    ("strided-matmul-3d", _transposed_matrix(), [(3, 20, 30), (3, 40, 30)], True),
    ("strided-tiny (generated code)", _attention_scores(), [(1, 2, 2, 16), (1, 2, 2, 16)], False),
    ("reshaped-transpose (generated code)", _reshaped_transpose(), [(3, 20, 30), (3, 40, 30)], False),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name,case,shapes,uses_blas", CASES, ids=[c[0] for c in CASES])
def test_products_match_numpy(name, case, shapes, uses_blas, threads, kernel_threads):
    prim, oracle = case
    _, kernel = _build(prim)
    kernel_threads(threads)
    dtype = "float64" if "float64" in name else F32
    rng = np.random.default_rng(len(name))
    arrays = [_rand(rng, s, dtype) for s in shapes]
    want = oracle(*(a.astype(np.float64) for a in arrays))
    (got,) = _run(kernel, arrays, [want.shape], dtype)
    _close(got, want, dtype)
    assert (kernel.select_variant(*arrays, got) == "blas") == uses_blas
    assert ("tv_gemm_strided" in kernel.source) == name.startswith("strided")


_STRIDED_CALLER = """
int32_t tv_test_strided(const int64_t* d, const float* a, const float* b, float* c, float alpha) {
  return tv_gemm_strided_f32(d[0], d[1], d[2], d[3], d[4], a, d[5], d[6], d[7], d[8], b, d[9], d[10], d[11], d[12],
                             c, d[13], d[14], d[15], d[16], alpha);
}
"""


@pytest.fixture(scope="module")
def strided():
    """``strided(a, b, c, alpha)``: ``tv_gemm_strided_f32`` on NumPy views a (outer, inner, m, k), b (outer,
    inner, k, n) and c (outer, inner, m, n) (strides in elements); ``strided.stats()``: the library
    pool's (jobs, chunks the callers ran, chunks the workers ran, workers)."""
    library = build.build_library([(prelude() + _STRIDED_CALLER, ())])
    function = library._cdll.tv_test_strided
    function.restype = ctypes.c_int32
    function.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_float]
    pool = library._cdll.tv_team_stats
    pool.argtypes, pool.restype = [ctypes.c_void_p], ctypes.c_int32

    def run(a, b, c, alpha=1.0):
        steps = [[s // 4 for s in v.strides] for v in (a, b, c)]
        dims = np.array([*a.shape[:3], b.shape[3], a.shape[3], *steps[0], *steps[1], *steps[2]], np.int64)
        bases = [v.base if v.base is not None else v for v in (a, b, c)]
        offsets = [v.__array_interface__["data"][0] - base.__array_interface__["data"][0] for v, base in zip((a, b, c), bases)]
        return function(dims.ctypes.data, *(base.ctypes.data + off for base, off in zip(bases, offsets)), alpha)

    def stats() -> np.ndarray:
        out = np.zeros(4, np.int64)
        assert pool(out.ctypes.data) == 0
        return out

    run.stats = stats
    return run


def test_strided_product_takes_any_view_with_a_unit_stride(strided, kernel_threads):
    """``tv_gemm_strided_f32`` called directly on NumPy views (strides in elements): transposed and
    row-strided operands, a result written with a leading dimension, single rows and columns whose
    other stride is arbitrary; a matrix with no unit stride is refused with its error code."""
    run = strided
    rng = np.random.default_rng(11)
    for threads in (1, 2):
        kernel_threads(threads)
        for m, n, k in ((20, 30, 16), (1, 40, 8), (30, 1, 8), (24, 24, 1)):
            base_a = rng.standard_normal((3, k, 2, m)).astype(np.float32)  # A read transposed
            a = base_a.transpose(0, 2, 3, 1)
            base_b = rng.standard_normal((3, 2, k, n + 5)).astype(np.float32)  # B's rows strided
            b = base_b[:, :, :, :n]
            out = np.full((3, m, 2, n), np.nan, np.float32)  # C written transposed
            alpha = 1.0 if k % 2 else -0.375  # a scaled product (alpha) in half of the cases
            assert run(a, b, out.transpose(0, 2, 1, 3), alpha) == 0
            _close(out.transpose(0, 2, 1, 3), alpha * (a.astype(np.float64) @ b.astype(np.float64)))
    square = rng.standard_normal((1, 1, 8, 8)).astype(np.float32)
    no_unit = square[:, :, ::2, ::2]
    assert run(no_unit, no_unit, np.zeros((1, 1, 4, 4), np.float32)) == c_emit.ERROR_STRIDES


@pytest.mark.parametrize("outer, inner, m, n, k", [
    (4, 4, 64, 64, 32),   # attention scores of 4 sequences x 4 heads: by entries, 4 shares per thread
    (1, 6, 40, 48, 40),   # 6 heads: by entries (a multiple of 2 and 3 threads; one entry a share at 3)
    (5, 1, 33, 72, 50),   # 5 entries: fewer than 4 per thread and not a multiple: by rows or columns
    (3, 3, 17, 40, 130),  # 9 entries: by entries at 2 threads, odd shares; rows / columns at 3 and 4
    (1, 1, 300, 45, 40),  # one product: by rows
    (1, 2, 9, 600, 40),   # two products of few rows: by entries at 2 threads, by columns at 3
    (1, 1, 2, 300, 150),  # two rows (memory-bound): split from the narrow threshold (a measured pool)
])
def test_batched_product_shares_match_numpy_at_every_thread_count(outer, inner, m, n, k, strided, kernel_threads):
    """A batched product above the parallel threshold, read transposed and written transposed in place
    (the attention's layout), at 1 to 4 threads against NumPy. A batch of at least 4 entries per thread,
    or a multiple of the threads, runs as min(entries, 4 x threads) shares of whole entries (so a worker
    that starts late leaves the caller little); else one share of rows or columns per thread. The
    pool's counts say how many shares ran."""
    rng = np.random.default_rng(outer * 100 + inner)
    a = rng.standard_normal((outer, m, inner, k)).astype(np.float32).transpose(0, 2, 1, 3)
    b = rng.standard_normal((outer, inner, n, k)).astype(np.float32).transpose(0, 1, 3, 2)
    want = a.astype(np.float64) @ b.astype(np.float64)
    rules = kernel_rules()  # (below its threshold one thread: no job; fewer rows than lanes: the narrow one)
    parallel = outer * inner * m * n * k >= (rules.parallel_work_narrow if m < rules.vector_width
                                             else rules.parallel_work)
    for threads in (1, 2, 3, 4):
        kernel_threads(threads)
        out = np.full((outer, m, inner, n), np.nan, np.float32)
        before = strided.stats()
        assert strided(a, b, out.transpose(0, 2, 1, 3)) == 0
        _close(out.transpose(0, 2, 1, 3), want)
        jobs, caller, worker, _ = strided.stats() - before
        batch = outer * inner
        by_entries = batch >= 4 * threads or (batch >= threads and batch % threads == 0)
        shares = min(batch, 4 * threads) if by_entries else threads
        if threads == 1 or not parallel:
            assert jobs == 0
        else:  # (a product class calibrated on this call runs both variants twice: four jobs)
            assert jobs in (1, 4) and caller + worker == jobs * shares, (threads, batch, jobs, caller, worker)


def test_zero_sized_reduction_gives_zeros_and_empty_rows_nothing():
    prim, _ = _batch_matmul(False, False)
    _, kernel = _build(prim)
    (got,) = _run(kernel, [np.ones((2, 300, 0), F32), np.ones((2, 0, 300), F32)], [(2, 300, 300)])
    assert not got.any()
    (got,) = _run(kernel, [np.ones((2, 0, 64), F32), np.ones((2, 64, 300), F32)], [(2, 0, 300)])
    assert got.shape == (2, 0, 300)


# ---- what runs after the product ------------------------------------------------------------------


def test_elementwise_epilogue_runs_in_place_on_the_output():
    x, w, b = Var("x", _t(None, 64)), Var("w", _t(96, 64)), Var("b", _t(96))
    _, kernel = _build(_fn([x, w, b], op.tanh(op.add(op.nn.dense(x, w), b))))
    assert "product" not in kernel.source  # no temporary: the product is written to the output
    rng = np.random.default_rng(1)
    arrays = [_rand(rng, (50, 64)), _rand(rng, (96, 64)), _rand(rng, (96,))]
    (got,) = _run(kernel, arrays, [(50, 96)])
    _close(got, np.tanh(arrays[0].astype(np.float64) @ arrays[1].T + arrays[2]))
    assert kernel.select_variant(*arrays, got) == "blas"


def test_constant_factor_after_the_product_becomes_blas_alpha():
    """``product * c`` (either order, c a scalar constant of the product's dtype; attention's 1/sqrt(d))
    is one BLAS call with alpha = c, no pass over the product afterwards; a factor that is not one
    scalar, or whose rank would broadcast the product, stays an epilogue."""
    rng = np.random.default_rng(12)
    x, w = Var("x", _t(None, 40)), Var("w", _t(48, 40))
    arrays = [_rand(rng, (33, 40)), _rand(rng, (48, 40))]
    want = arrays[0].astype(np.float64) @ arrays[1].T
    q, k = Var("q", _t(1, None, 4, 16)), Var("k", _t(1, None, 4, 16))
    scores = op.onnx.matmul(op.transpose(q, axes=[0, 2, 1, 3]), op.transpose(k, axes=[0, 2, 3, 1]))
    qk = [_rand(rng, (1, 30, 4, 16)), _rand(rng, (1, 30, 4, 16))]
    qk_want = qk[0].transpose(0, 2, 1, 3).astype(np.float64) @ qk[1].transpose(0, 2, 3, 1)
    cases = [
        # (body, arrays, output shape, expected, folded)
        (op.multiply(op.nn.dense(x, w), const(0.25)), arrays, (33, 48), 0.25 * want, True),
        (op.multiply(const(-3.0), op.nn.dense(x, w)), arrays, (33, 48), -3.0 * want, True),
        (op.multiply(scores, const(0.125)), qk, (1, 4, 30, 30), 0.125 * qk_want, True),
        (op.multiply(op.nn.dense(x, w), const(np.full((1, 48), 0.5, F32))), arrays, (33, 48), 0.5 * want, False),
        (op.multiply(op.nn.dense(x, w), const(np.full((1, 1, 1), 0.5, F32))), arrays, (1, 33, 48), 0.5 * want[None],
         False),
    ]
    for body, args, shape, expected, folded in cases:
        _, kernel = _build(_fn([x, w] if args is arrays else [q, k], body))
        call = "tv_gemm_strided_f32(" if args is qk else "tv_gemm_f32("
        assert call in kernel.source
        blas_case = kernel.source.split("/* variant blas */")[1].split("break;")[0]
        # folded: the call alone, no loop after it (inline, or a parallel loop outlined for tv_team_run)
        assert ("for (" not in blas_case and "tv_team_run(" not in blas_case) == folded
        (got,) = _run(kernel, args, [shape])
        _close(got, expected)
        assert kernel.select_variant(*args, got) == "blas"


def test_layout_changing_epilogue_reads_a_temporary():
    x, w = Var("x", _t(1, None, 64)), Var("w", _t(64, 64))
    body = op.transpose(op.reshape(op.nn.matmul(x, w), newshape=[1, -1, 4, 16]), axes=[0, 2, 1, 3])
    _, kernel = _build(_fn([x, w], body))
    assert "product" in kernel.source
    rng = np.random.default_rng(2)
    for seq in (9, 40):
        arrays = [_rand(rng, (1, seq, 64)), _rand(rng, (64, 64))]
        (got,) = _run(kernel, arrays, [(1, 4, seq, 16)])
        _close(got, (arrays[0].astype(np.float64) @ arrays[1]).reshape(1, seq, 4, 16).transpose(0, 2, 1, 3))


def test_epilogue_broadcasting_over_a_dynamic_dim_is_in_place_when_the_shapes_agree():
    # out = dense(x) + r with both row counts dynamic: equal counts (the residual add of a transformer)
    # write the product straight to the output; a broadcast product (one row) goes through the temporary
    x, w, r = Var("x", _t(1, None, 64)), Var("w", _t(32, 64)), Var("r", _t(1, None, 32))
    _, kernel = _build(_fn([x, w, r], op.add(op.nn.dense(x, w), r)))
    # two product calls: into the output (shapes agree at run time) and into the temporary
    assert kernel.source.count("tv_gemm_f32(") == 2 and "product" in kernel.source
    rng = np.random.default_rng(4)
    for rows, residual_rows in ((7, 7), (1, 5), (5, 1), (1, 1)):
        arrays = [_rand(rng, (1, rows, 64)), _rand(rng, (32, 64)), _rand(rng, (1, residual_rows, 32))]
        (got,) = _run(kernel, arrays, [(1, max(rows, residual_rows), 32)])
        _close(got, arrays[0].astype(np.float64) @ arrays[1].T + arrays[2])


def test_product_that_is_also_an_output():
    x, w, d = Var("x", _t(None, 64)), Var("w", _t(None, 64)), Var("d")
    prim = _fn([x, w], Let(d, op.nn.dense(x, w), Tuple([d, op.multiply(d, const(2.0))])))
    _, kernel = _build(prim)
    rng = np.random.default_rng(3)
    arrays = [_rand(rng, (30, 64)), _rand(rng, (40, 64))]
    first, second = _run(kernel, arrays, [(30, 40), (30, 40)])
    want = arrays[0].astype(np.float64) @ arrays[1].T
    _close(first, want)
    _close(second, 2 * want)


def test_constant_weights_and_bias_reach_the_call_and_the_epilogue():
    rng = np.random.default_rng(4)
    weight, bias = _rand(rng, (80, 32)), _rand(rng, (80,))
    x = Var("x", _t(None, 32))
    _, kernel = _build(_fn([x], op.nn.relu(op.add(op.nn.dense(x, const(weight)), const(bias)))))
    data = _rand(rng, (25, 32))
    (got,) = _run(kernel, [data], [(25, 80)])
    _close(got, np.maximum(data.astype(np.float64) @ weight.T + bias, 0))


# ---- threads, the host BLAS, other targets ----------------------------------------------------------


def test_blas_thread_setting_is_restored_after_a_parallel_product(kernel_threads):
    control = blas.host_blas()
    if control.get_threads is None:
        pytest.skip("the host BLAS exposes no thread control")
    prim, oracle = _dense((None,), 256, 128)
    _, kernel = _build(prim)
    kernel_threads(2)
    before = control.get_threads()
    rng = np.random.default_rng(5)
    arrays = [_rand(rng, (64, 128)), _rand(rng, (256, 128))]
    (got,) = _run(kernel, arrays, [(64, 256)])
    _close(got, oracle(*(a.astype(np.float64) for a in arrays)))
    assert control.get_threads() == before


def test_without_a_host_blas_the_bridge_runs_plain_loops():
    prim, oracle = _batch_matmul(True, True)
    module, kernel = _build(prim)
    cdll = module.library._cdll
    cdll.tv_set_blas.argtypes = [ctypes.c_void_p] * 6
    cdll.tv_set_blas(None, None, None, None, None, None)
    try:
        rng = np.random.default_rng(6)
        arrays = [_rand(rng, (3, 32, 20)), _rand(rng, (3, 24, 32))]
        (got,) = _run(kernel, arrays, [(3, 20, 24)])
        assert kernel.select_variant(*arrays, got) == "blas"
        _close(got, oracle(*(a.astype(np.float64) for a in arrays)))
    finally:
        blas.attach(cdll)


def test_threshold_is_the_documented_work():
    prim, _ = _dense((None,), 8, 16)  # 128 multiply-adds per row
    _, kernel = _build(prim)
    rows = gemm_min_work() // 128
    for m, expected in ((rows - 1, "generic"), (rows, "blas")):
        x, w = np.zeros((m, 16), F32), np.zeros((8, 16), F32)
        assert kernel.select_variant(x, w, np.empty((m, 8), F32)) == expected


def test_private_kernels_and_other_modes_have_no_bridge(monkeypatch):
    prim, _ = _dense((None,), 48, 40)
    assert "tv_gemm" not in prelude(static_functions=True)
    lowered = lower_primitive(prim, "aot_dense")  # the AOT flow: no host library
    dispatch = find_dispatch(lowered.func.body)
    assert dispatch is None or "blas" not in dispatch.names
    for mode in ("numpy", "off"):
        monkeypatch.setenv("TENSORVM_BLAS", mode)
        _, kernel = _build(prim)
        assert "tv_gemm" not in kernel.source.split("*/", 1)[-1]
    monkeypatch.setenv("TENSORVM_BLAS", "fast")
    with pytest.raises(Exception, match="TENSORVM_BLAS"):
        _build(prim)


# ---- convolutions: im2col + BLAS ----------------------------------------------------------------------

CONVS = [
    # (data shape, weight shape, conv2d attrs); each at least 2^15 multiply-adds (a library call on AVX-512)
    ((1, 3, 12, 12), (16, 3, 3, 3), dict(padding=[1, 1, 1, 1])),
    ((2, 4, 13, 11), (12, 4, 3, 2), dict(padding=[0, 1, 2, 0], strides=[2, 1])),
    ((1, 5, 13, 13), (14, 5, 3, 3), dict(padding=[2, 2, 2, 2], dilation=[2, 2], strides=[1, 3])),
    ((2, 16, 7, 7), (24, 16, 1, 1), {}),  # 1x1: the image is its own patch matrix
    ((1, 32, 15, 15), (64, 32, 1, 1), dict(strides=[2, 2])),
    # unit strides (the direct kernel): channel, row and column tails, asymmetric kernels and padding
    ((2, 5, 9, 13), (7, 5, 3, 2), dict(padding=[1, 0, 2, 1])),
    ((1, 4, 7, 5), (26, 4, 5, 3), dict(padding=[2, 1, 2, 1])),
    ((1, 16, 16, 16), (32, 16, 3, 3), dict(padding=[1, 1, 1, 1])),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [F32, "float64"])
@pytest.mark.parametrize("data_shape,weight_shape,attrs", CONVS)
def test_convolutions_match_the_reference_op(data_shape, weight_shape, attrs, dtype, threads, kernel_threads):
    from tensorvm.op.registry import get_op

    x, w, b = Var("x", _t(*data_shape, dtype=dtype)), Var("w", _t(*weight_shape, dtype=dtype)), \
        Var("b", _t(weight_shape[0], dtype=dtype))
    call = op.nn.conv2d(x, w, **attrs)
    _, kernel = _build(_fn([x, w, b], op.nn.relu(op.nn.bias_add(call, b, axis=1))))
    kernel_threads(threads)
    rng = np.random.default_rng(sum(data_shape))
    arrays = [_rand(rng, data_shape, dtype), _rand(rng, weight_shape, dtype), _rand(rng, (weight_shape[0],), dtype)]
    conv = get_op("nn.conv2d")
    reference = conv.kernel(conv.normalize_attrs(call.attrs), *(a.astype(np.float64) for a in arrays[:2]))
    want = np.maximum(reference + arrays[2].astype(np.float64)[:, None, None], 0)
    (got,) = _run(kernel, arrays, [want.shape], dtype)
    _close(got, want, dtype)
    # static shapes: one body, the C call (the vector kernels for float32: the pointwise one for 1x1 at
    # unit strides, else the direct one but 1x1; else im2col + product)
    pointwise = dtype == F32 and weight_shape[2:] == (1, 1) and "strides" not in attrs
    vector = dtype == F32 and weight_shape[2:] != (1, 1)
    assert kernel.variants == (("pointwise",) if pointwise else ("direct",) if vector else ("blas",))
    source = kernel.source.split("*/", 1)[-1]
    assert ("tv_conv2d_pointwise_act_f32(" if pointwise else "tv_conv2d_direct_f32(" if vector else "tv_conv2d_") in source


@pytest.mark.parametrize("channels, out, blas_at_batch_1", [(16, 32, True), (1, 8, False)])
def test_a_call_taken_at_every_nonempty_shape_is_the_only_variant(channels, out, blas_at_batch_1):
    """A convolution over a dynamic batch whose work passes the threshold already at batch 1 compiles
    the call alone (no generic copy, which would only ever have run at batch 0); a smaller one keeps
    the generic variant (its 6-pixel rows, narrower than a vector, count ceil(lanes / 6) times: see
    test_narrow_row_conv_rule.py). Either way every batch, 0 included, matches the reference op."""
    x, w, b = Var("x", _t(None, channels, 6, 6)), Var("w", _t(out, channels, 3, 3)), Var("b", _t(out, 1, 1))
    _, kernel = _build(_fn([x, w, b], op.nn.relu(op.add(op.nn.conv2d(x, w, padding=[1, 1, 1, 1]), b))))
    lanes = kernel_rules().vector_width
    assert (out * channels * 9 * 36 * -(-lanes // 6) >= gemm_min_work()) == blas_at_batch_1
    assert kernel.variants == (("direct",) if blas_at_batch_1 else ("direct", "generic"))
    from tensorvm.op.registry import get_op

    conv = get_op("nn.conv2d")
    rng = np.random.default_rng(3)
    weights, bias = rng.standard_normal((out, channels, 3, 3)).astype(F32), rng.standard_normal((out, 1, 1)).astype(F32)
    for batch in (0, 1, 3):
        data = rng.standard_normal((batch, channels, 6, 6)).astype(F32)
        (got,) = _run(kernel, [data, weights, bias], [(batch, out, 6, 6)])
        want = conv.kernel(conv.normalize_attrs({"padding": [1, 1, 1, 1]}), data.astype(np.float64),
                           weights.astype(np.float64))
        _close(got, np.maximum(want + bias, 0))


def test_grouped_convolution_stays_generated_code():
    x, w = Var("x", _t(1, 4, 10, 10)), Var("w", _t(8, 2, 3, 3))
    _, kernel = _build(_fn([x, w], op.nn.conv2d(x, w, groups=2)))
    assert "tv_conv2d" not in kernel.source


_CONV_CALLER = """
int32_t tv_test_conv(int64_t n, int64_t c, int64_t h, int64_t w, int64_t o, int64_t oh, int64_t ow, int64_t kh,
                     int64_t kw, int64_t pt, int64_t pl, const float* x, const float* weights, const float* bias,
                     int64_t has_bias, int64_t relu, int64_t pool, float* padded, float* out) {
  return tv_conv2d_direct_f32(n, c, h, w, o, oh, ow, kh, kw, 1, 1, 1, 1, pt, pl, x, weights, bias, has_bias, relu,
                              pool, padded, out);
}
"""


@pytest.mark.parametrize("flags", [(), ("-mno-avx2", "-mno-fma")], ids=["native", "portable"])
def test_direct_convolution_in_both_builds(flags, kernel_threads):
    """``tv_conv2d_direct_f32`` called directly (unit strides; strides, dilation and the other vector
    widths are tests/codegen/test_vconv.py's), built with the kernels' flags and without AVX2/FMA (the
    host's vectors lowered to 128-bit operations), on every tail: channel counts that
    need blocks of 6 and of 4 with duplicates, odd output rows, output columns not a multiple of 8; and
    with each tile epilogue (bias, relu, 2x2 max pool, which drops an odd last row or column)."""
    from tensorvm.op.registry import get_op

    library = build.build_library([(prelude() + _CONV_CALLER, flags)])
    function = library._cdll.tv_test_conv
    function.restype = ctypes.c_int32
    function.argtypes = [ctypes.c_int64] * 11 + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 2
    conv = get_op("nn.conv2d")
    rng = np.random.default_rng(9)
    shapes = [((1, 3, 5, 11), (7, 3, 3), (1, 1, 1, 1)), ((2, 2, 6, 4), (13, 2, 3), (0, 2, 1, 0)),
              ((1, 4, 7, 17), (2, 3, 3), (1, 1, 1, 1)), ((1, 2, 8, 16), (8, 3, 3), (1, 1, 1, 1))]
    shapes += [((1, 2, 6, 9), (o, 3, 3), (1, 1, 1, 1)) for o in (1, 3, 4, 5, 6, 9, 10, 11, 14, 32)]
    epilogues = [(0, 0, 0), (1, 1, 0), (0, 0, 1), (1, 0, 1), (1, 1, 1)]
    for threads in (1, 2):
        kernel_threads(threads)
        for index, ((n, c, h, w), (o, kh, kw), (pt, pl, pb, pr)) in enumerate(shapes):
            x = rng.standard_normal((n, c, h, w)).astype(np.float32)
            weights = rng.standard_normal((o, c, kh, kw)).astype(np.float32)
            bias = rng.standard_normal(o).astype(np.float32)
            want = conv.kernel(conv.normalize_attrs({"padding": [pt, pl, pb, pr]}), x.astype(np.float64),
                               weights.astype(np.float64))
            oh, ow = want.shape[2:]
            padded = np.empty(c * (oh + kh - 1) * ((ow + 15) // 16 * 16 + kw - 1), np.float32)  # (up to 16 lanes)
            for has_bias, relu, pool in (epilogues if threads == 1 or index < 4 else epilogues[-1:]):
                expected = want + bias[:, None, None] if has_bias else want
                expected = np.maximum(expected, 0) if relu else expected
                if pool:
                    expected = expected[:, :, :oh // 2 * 2, :ow // 2 * 2]
                    expected = expected.reshape(n, o, oh // 2, 2, ow // 2, 2).max(axis=(3, 5))
                out = np.full(expected.shape, np.nan, np.float32)
                assert function(n, c, h, w, o, oh, ow, kh, kw, pt, pl, x.ctypes.data, weights.ctypes.data,
                                bias.ctypes.data, has_bias, relu, pool, padded.ctypes.data, out.ctypes.data) == 0
                _close(out, expected)



def _conv_group(case: str, x, w, b):
    """A convolution's group as FuseOps may form it: the convolution, then the epilogue ``case``."""
    conv = op.nn.conv2d(x, w, padding=[1, 1, 1, 1])

    def pool(e):
        return op.nn.max_pool2d(e, pool_size=[2, 2], strides=[2, 2])

    return {
        "bias-relu-pool": lambda: pool(op.nn.relu(op.nn.bias_add(conv, b, axis=1))),
        "onnx-bias-relu": lambda: op.nn.relu(op.add(conv, b)),
        "bias-first-then-pool": lambda: pool(op.add(b, conv)),
        "pool-then-relu": lambda: op.nn.relu(pool(op.nn.bias_add(conv, b, axis=1))),
        "pool-only": lambda: pool(conv),
        "relu-then-bias": lambda: op.nn.bias_add(op.nn.relu(conv), b, axis=1),
        "sigmoid-pool": lambda: pool(op.sigmoid(conv)),
        "3x3-pool": lambda: op.nn.max_pool2d(op.nn.relu(conv), pool_size=[3, 3], strides=[2, 2]),
    }[case]()


def _conv_group_reference(case: str, x, w, b):
    from tensorvm.op.registry import get_op

    conv = get_op("nn.conv2d")
    y = conv.kernel(conv.normalize_attrs({"padding": [1, 1, 1, 1]}), x.astype(np.float64), w.astype(np.float64))
    b = b.astype(np.float64).reshape(1, -1, 1, 1)

    def pool(e, size=2):
        n, c, h, width = e.shape
        oh, ow = (h - size) // 2 + 1, (width - size) // 2 + 1
        return np.stack([e[:, :, dy:dy + 2 * oh - 1:2, dx:dx + 2 * ow - 1:2]
                         for dy in range(size) for dx in range(size)]).max(axis=0)

    relu = lambda e: np.maximum(e, 0)  # noqa: E731
    return {
        "bias-relu-pool": lambda: pool(relu(y + b)), "onnx-bias-relu": lambda: relu(y + b),
        "bias-first-then-pool": lambda: pool(y + b), "pool-then-relu": lambda: relu(pool(y + b)),
        "pool-only": lambda: pool(y), "relu-then-bias": lambda: relu(y) + b,
        "sigmoid-pool": lambda: pool(1 / (1 + np.exp(-y))), "3x3-pool": lambda: pool(relu(y), 3),
    }[case]()


_TILE_CASES = ["bias-relu-pool", "onnx-bias-relu", "bias-first-then-pool", "pool-then-relu", "pool-only"]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("data_shape", [(1, 5, 12, 16), (2, 3, 9, 13)], ids=["even", "odd-tails"])
@pytest.mark.parametrize("case", _TILE_CASES + ["relu-then-bias", "sigmoid-pool", "3x3-pool"])
def test_convolution_epilogues_in_the_tiles(case, data_shape, threads, kernel_threads):
    """A bias, relu and 2x2 max pool after a unit-stride float32 convolution are applied by the direct
    kernel to its tiles (the kernel has no loop of its own after the call); anything else runs as a
    generated epilogue over the convolution's result. Both against NumPy in float64."""
    channels = 10  # blocks of 6 and 4
    bias_shape = (channels, 1, 1) if case in ("onnx-bias-relu", "bias-first-then-pool") else (channels,)
    if case == "bias-first-then-pool":
        bias_shape = (1, channels, 1, 1)
    x, w, b = Var("x", _t(*data_shape)), Var("w", _t(channels, data_shape[1], 3, 3)), Var("b", _t(*bias_shape))
    _, kernel = _build(_fn([x, w, b], _conv_group(case, x, w, b)))
    kernel_threads(threads)
    rng = np.random.default_rng(len(case))
    arrays = [_rand(rng, data_shape), _rand(rng, (channels, data_shape[1], 3, 3)), _rand(rng, bias_shape)]
    want = _conv_group_reference(case, *arrays)
    (got,) = _run(kernel, arrays, [want.shape])
    _close(got, want)
    body = kernel.source.rsplit("\nint32_t ", 1)[-1]  # the kernel function, after the helpers
    assert "tv_conv2d_direct_f32(" in body
    assert ("for (" in body) == (case not in _TILE_CASES)


def test_only_units_with_products_carry_the_register_tiles():
    """The register-tiled products and the direct convolution (most of a small library's compile time)
    are compiled into a translation unit only when one of its kernels multiplies matrices."""
    import tensorvm as tv

    def library_source(text):
        exe = tv.vm.compile(tv.parse(text), target="c")
        exe.kernels  # noqa: B018 - builds the library
        return exe.c_library.source

    plain = library_source("def @main(%x: Tensor[(4, 8), float32]) { nn.softmax(exp(%x)) }")
    product = library_source("def @main(%x: Tensor[(64, 256), float32], %w: Tensor[(256, 256), float32]) "
                             "{ nn.dense(%x, %w) }")
    kernels = lambda source: source.split("#endif /* TV_PACKED_KERNELS */")[-1]  # noqa: E731
    assert "tv_gemm_" not in kernels(plain) and "#define TV_PACKED_KERNELS" not in plain
    assert "tv_gemm_f32(" in kernels(product) and product.startswith("#define TV_PACKED_KERNELS\n")
