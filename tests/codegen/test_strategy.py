"""Strategies: kernel variants chosen by conditions on dims, at compile time or by a dispatch function.

The oracle is NumPy for results; the expected variant is computed here from the documented conditions
(BLAS from ``blas_min_flops`` multiply-adds -- ``blas_min_flops_dynamic`` when N or K is dynamic -- and
``blas_min_rows`` rows (``strategy.rules()``), the vector variant when the
dynamic N is a multiple of 8 and the dynamic K of 16, the first matching static specialization).
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorvm import op, te
from tensorvm.codegen import build, strategy
from tensorvm.codegen.build import find_toolchain
from tensorvm.codegen.c_emit import EmitOptions, emit_kernel, emit_library, prelude
from tensorvm.codegen.fused import FusedKernel, build_fused_module, lower_primitive
from tensorvm.codegen.loop_ir import find_dispatch
from tensorvm.codegen.lower import lower
from tensorvm.codegen.module import build_module
from tensorvm.codegen.strategy import (
    DispatchKernel,
    Implementation,
)
from tensorvm.errors import ExecutionError, ShapeError
from tensorvm.ir.expr import Function, Tuple, TupleGetItem, Var, const
from tensorvm.ir.types import Any, SymDim, TensorType, TupleType
from tensorvm.op.registry import get_op

F32 = "float32"


def _fn(params, body):
    return Function(params, body, attrs={"Primitive": 1})


def _t(*shape, dtype=F32):
    return TensorType(tuple(Any() if d is None else d for d in shape), dtype)


def _dense_dyn():
    x, w = Var("x", _t(None, None)), Var("w", _t(None, None))
    return _fn([x, w], op.nn.dense(x, w))


def _dense_bias_tanh(n=64):
    x, w, b = Var("x", _t(None, 24)), Var("w", _t(n, 24)), Var("b", _t(n))
    return _fn([x, w, b], op.tanh(op.add(op.nn.dense(x, w), b)))


def _dense_softmax():
    x, w = Var("x", _t(None, 16)), Var("w", _t(40, 16))
    return _fn([x, w], op.nn.softmax(op.nn.dense(x, w), axis=-1))


def _dense_const_weight():
    x = Var("x", _t(None, 16))
    weight = const(np.random.default_rng(7).standard_normal((64, 16)).astype(F32))
    return _fn([x], op.nn.relu(op.nn.dense(x, weight)))


def _batch_matmul():
    x, y = Var("x", _t(None, None, None)), Var("y", _t(None, None, None))
    return _fn([x, y], op.nn.batch_matmul(x, y))  # y is (batch, N, K): transpose_b by default


def _matmul_transposed():
    a, b = Var("a", _t(None, None)), Var("b", _t(None, None))
    return _fn([a, b], op.nn.matmul(a, b, transpose_a=True, transpose_b=True))


def _dense_f16():
    x, w = Var("x", _t(None, None, dtype="float16")), Var("w", _t(None, None, dtype="float16"))
    return _fn([x, w], op.nn.dense(x, w))


def _dense_static(m, k, n):
    x, w = Var("x", _t(m, k)), Var("w", _t(n, k))
    return _fn([x, w], op.nn.dense(x, w))


def _softmax_named():
    n = SymDim("n")
    x, y = Var("x", _t(n, 32)), Var("y", _t(n, 32))
    return _fn([x, y], op.nn.softmax(op.add(x, y), axis=-1))


def _dense_two_outputs():
    """The product is an output and feeds another one: the epilogue cannot run in place."""
    x, w = Var("x", _t(None, 8)), Var("w", _t(None, 8))
    d = Var("d")
    from tensorvm.ir.expr import Let

    return _fn([x, w], Let(d, op.nn.dense(x, w), Tuple([d, op.multiply(d, const(2.0))])))


# The sizes below were chosen against AVX2's thresholds (16 multiply-adds per cycle); the rows of the
# products meant to reach BLAS grow with this host's throughput, as its thresholds do (host.kernel_rules).
SCALE = max(1, strategy.rules().macs_per_cycle // 16)

PRIMS = {
    "dense_dyn": _dense_dyn(),
    "dense_bias_tanh": _dense_bias_tanh(),
    "dense_bias_tanh_dyn": _dense_bias_tanh(None),
    "dense_softmax": _dense_softmax(),
    "dense_const_weight": _dense_const_weight(),
    "batch_matmul": _batch_matmul(),
    "matmul_tt": _matmul_transposed(),
    "dense_f16": _dense_f16(),
    "dense_small": _dense_static(2, 16, 8),
    "dense_big": _dense_static(256 * SCALE, 64, 64),
    "dense_two_outputs": _dense_two_outputs(),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The BLAS thresholds scale with the kernels' thread count: these tests use one thread (the
    parallel rule has its own test). They cover BLAS through NumPy (``TENSORVM_BLAS=numpy``); BLAS
    called from C has its own tests (test_gemm_bridge.py)."""
    previous = build._NUM_THREADS[0]
    build.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TENSORVM_BLAS", "numpy")
        yield
    build.set_num_threads(previous)


@pytest.fixture(scope="module")
def kernels():
    with strategy.specialize(n=[1, 4]):
        _, built = build_fused_module({**PRIMS, "softmax_named": _softmax_named()})
    return built


def _expected_matmul_variant(rows, k, n, dynamic_n=True, dynamic_k=True):
    rules = strategy.rules()
    min_flops = rules.blas_min_flops_dynamic if dynamic_n or dynamic_k else rules.blas_min_flops
    if rows * k * n >= min_flops and rows >= rules.blas_min_rows:
        return "blas"
    if (dynamic_n or dynamic_k) and (not dynamic_n or n % rules.vector_width == 0) \
            and (not dynamic_k or k % rules.reduction_width == 0):
        return "vec"
    return "generic"


def _rand(rng, *shape, dtype=F32):
    return rng.standard_normal(shape).astype(dtype)


# ---- which variants exist: compile-time resolution -----------------------------------------------------


def test_variants_resolved_at_compile_time(kernels):
    assert kernels["dense_dyn"].variants == ("blas", "vec", "generic")
    assert kernels["dense_bias_tanh_dyn"].variants == ("blas", "vec", "generic")  # N dynamic, K static
    assert kernels["dense_bias_tanh"].variants == ("blas", "generic")
    assert kernels["dense_softmax"].variants == ("blas", "generic")  # N, K static: no vector variant
    assert kernels["dense_f16"].variants == ("vec", "generic")  # no BLAS for float16
    small, big = kernels["dense_small"], kernels["dense_big"]
    assert isinstance(small, FusedKernel) and small.variants == ("generic",)  # 2 rows: never BLAS
    assert isinstance(big, DispatchKernel) and big.variants == ("blas", "generic")
    x, w, out = np.ones((256 * SCALE, 64), F32), np.ones((64, 64), F32), np.empty((256 * SCALE, 64), F32)
    assert big.select_variant(x, w, out) == "blas"  # its condition folded to True: no test at run time
    assert kernels["softmax_named"].variants == ("n_1", "n_4", "generic")


def test_static_kernels_have_no_dispatch_function():
    func = lower_primitive(_dense_static(256, 64, 64), "k").func
    assert find_dispatch(func.body) is None and func.dim_params == ()
    assert "_dispatch" not in emit_kernel(func).source


def test_variants_can_be_disabled(monkeypatch):
    monkeypatch.setenv("TENSORVM_KERNEL_VARIANTS", "0")
    assert find_dispatch(lower_primitive(_dense_dyn(), "k").func.body) is None


# ---- the dispatch picks the right variant and every variant computes the op ----------------------------


@pytest.mark.parametrize("m,k,n", [(3, 5, 7), (4, 32, 16), (2, 16, 8), (7, 48, 40), (1, 100, 300), (64, 64, 64),
                                   (128, 64, 64), (8, 1024, 64), (70, 33, 250), (0, 16, 8)])
def test_dense_dispatch(kernels, m, k, n):
    rng = np.random.default_rng(m * 1000 + k + n)
    x, w, out = _rand(rng, m, k), _rand(rng, n, k), np.full((m, n), np.nan, F32)
    kernel = kernels["dense_dyn"]
    expected = _expected_matmul_variant(m, k, n)
    assert kernel.select_variant(x, w, out) == expected
    if expected != "blas":  # the C dispatch function itself agrees
        assert kernel.kernel.kernel.select_variant(x, w, out) == expected
    kernel(x, w, out)
    np.testing.assert_allclose(out, x @ w.T, rtol=1e-4, atol=1e-4)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 300), k=st.sampled_from([1, 3, 16, 17, 32, 48, 64]), n=st.sampled_from([1, 5, 8, 16, 24, 36, 64]),
       seed=st.integers(0, 2**31))
def test_dense_variants_match_numpy(kernels, m, k, n, seed):
    rng = np.random.default_rng(seed)
    x, w, out = _rand(rng, m, k), _rand(rng, n, k), np.empty((m, n), F32)
    kernel = kernels["dense_dyn"]
    assert kernel.select_variant(x, w, out) == _expected_matmul_variant(m, k, n)
    kernel(x, w, out)
    np.testing.assert_allclose(out, x @ w.T, rtol=1e-4, atol=1e-4)
    kernel.kernel(x, w, out)  # the C kernel alone (its own dispatch between vec and generic)
    np.testing.assert_allclose(out, x @ w.T, rtol=1e-4, atol=1e-4)


@settings(max_examples=25, deadline=None)
@given(batch=st.sampled_from([(1, 1), (3, 3), (1, 4), (5, 1)]), m=st.integers(1, 40), k=st.sampled_from([2, 16, 64]),
       n=st.sampled_from([3, 8, 80]), seed=st.integers(0, 2**31))
def test_batch_matmul_variants(kernels, batch, m, k, n, seed):
    rng = np.random.default_rng(seed)
    x, y = _rand(rng, batch[0], m, k), _rand(rng, batch[1], n, k)
    out = np.empty((max(batch), m, n), F32)
    kernel = kernels["batch_matmul"]
    expected = x @ np.swapaxes(y, 1, 2)
    assert kernel.select_variant(x, y, out) == _expected_matmul_variant(max(batch) * m, k, n)
    kernel(x, y, out)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    kernel.kernel(x, y, out)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m,k,n", [(3, 4, 5), (256, 64, 48), (16, 16, 8)])
def test_transposed_matmul_variants(kernels, m, k, n):
    rng = np.random.default_rng(m + k + n)
    a, b, out = _rand(rng, k, m), _rand(rng, n, k), np.empty((m, n), F32)
    kernel = kernels["matmul_tt"]
    assert kernel.select_variant(a, b, out) == _expected_matmul_variant(m, k, n)
    for run in (kernel, kernel.kernel):
        out[:] = np.nan
        run(a, b, out)
        np.testing.assert_allclose(out, a.T @ b.T, rtol=1e-4, atol=1e-4)


def test_float16_dense_variants(kernels):
    rng = np.random.default_rng(3)
    kernel = kernels["dense_f16"]
    for m, k, n, expected in [(3, 32, 16, "vec"), (3, 30, 16, "generic"), (20, 64, 64, "vec")]:
        x, w, out = _rand(rng, m, k, dtype="float16"), _rand(rng, n, k, dtype="float16"), np.empty((m, n), "float16")
        assert kernel.select_variant(x, w, out) == expected
        kernel(x, w, out)
        reference = (x.astype(F32) @ w.astype(F32).T).astype("float16")
        np.testing.assert_allclose(out.astype(F32), reference.astype(F32), rtol=2e-2, atol=2e-2)


def test_static_specializations_from_hints(kernels):
    rng = np.random.default_rng(5)
    kernel = kernels["softmax_named"]
    for rows, expected in [(1, "n_1"), (4, "n_4"), (5, "generic"), (2, "generic")]:
        x, y, out = _rand(rng, rows, 32), _rand(rng, rows, 32), np.empty((rows, 32), F32)
        assert kernel.select_variant(x, y, out) == expected
        kernel(x, y, out)
        e = np.exp((x + y) - (x + y).max(-1, keepdims=True))
        np.testing.assert_allclose(out, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_a_variant_never_runs_on_shapes_it_was_not_made_for(monkeypatch):
    """A strategy that claims an M=1 specialization always applies: the dispatch still adds the
    variant's own assumption (M == 1), so other batch sizes take the generic body."""
    def claims_always(attrs, inputs, out_type):
        return [Implementation("m1", True, plevel=30, static_dims={inputs[0].shape[0]: 1})]

    monkeypatch.setattr(get_op("nn.dense"), "strategy", claims_always)
    x, w = Var("x", _t(None, 8)), Var("w", _t(4, 8))
    _, built = build_fused_module({"k": _fn([x, w], op.nn.dense(x, w))})
    kernel = built["k"]
    assert kernel.variants == ("m1", "generic")
    rng = np.random.default_rng(0)
    for m, expected in [(1, "m1"), (3, "generic")]:
        xs, ws, out = _rand(rng, m, 8), _rand(rng, 4, 8), np.empty((m, 4), F32)
        assert kernel.select_variant(xs, ws, out) == expected
        kernel(xs, ws, out)
        np.testing.assert_allclose(out, xs @ ws.T, rtol=1e-5, atol=1e-5)


# ---- BLAS and the generated C agree, with epilogues ------------------------------------------------------


@pytest.mark.parametrize("name,rows", [("dense_bias_tanh", 3), ("dense_bias_tanh", 700),
                                       ("dense_bias_tanh_dyn", 40), ("dense_bias_tanh_dyn", 700)])
def test_dense_epilogue(kernels, name, rows):
    kernel = kernels[name]
    # tanh(add(dense, b)) reads the product at its own index, so BLAS writes the output and the epilogue
    # runs in place -- unless N is dynamic: then b might broadcast the product (N == 1) and widen it.
    assert kernel._plan.externals[0].inplace == (name == "dense_bias_tanh")
    rng = np.random.default_rng(rows)
    x, w, b = _rand(rng, rows, 24), _rand(rng, 64, 24), _rand(rng, 64)
    expected = np.tanh(x @ w.T + b)
    blas, c = np.empty((rows, 64), F32), np.empty((rows, 64), F32)
    kernel(x, w, b, blas)
    kernel.kernel(x, w, b, c)
    np.testing.assert_allclose(blas, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c, blas, rtol=1e-5, atol=1e-5)
    dynamic = name.endswith("_dyn")
    assert kernel.select_variant(x, w, b, blas) == _expected_matmul_variant(rows, 24, 64, dynamic, False)


def test_dense_epilogue_from_a_temporary(kernels):
    kernel = kernels["dense_softmax"]
    assert not kernel._plan.externals[0].inplace  # softmax reads whole rows of the product
    rng = np.random.default_rng(1)
    rows = 2000 * SCALE
    x, w = _rand(rng, rows, 16), _rand(rng, 40, 16)
    blas, c = np.empty((rows, 40), F32), np.empty((rows, 40), F32)
    assert kernel.select_variant(x, w, blas) == "blas"
    kernel(x, w, blas)
    kernel.kernel(x, w, c)
    d = x @ w.T
    e = np.exp(d - d.max(-1, keepdims=True))
    np.testing.assert_allclose(blas, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c, blas, rtol=1e-5, atol=1e-6)


def test_dense_product_that_is_also_an_output(kernels):
    kernel = kernels["dense_two_outputs"]
    assert not kernel._plan.externals[0].inplace
    rng = np.random.default_rng(2)
    x, w = _rand(rng, 1000, 8), _rand(rng, 80, 8)
    d, twice = np.empty((1000, 80), F32), np.empty((1000, 80), F32)
    assert kernel.select_variant(x, w, d, twice) == "blas"
    kernel(x, w, d, twice)
    np.testing.assert_allclose(d, x @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(twice, 2 * (x @ w.T), rtol=1e-5, atol=1e-5)


def test_constant_weights_reach_blas(kernels):
    kernel = kernels["dense_const_weight"]
    weight = np.random.default_rng(7).standard_normal((64, 16)).astype(F32)
    rng = np.random.default_rng(4)
    for rows, expected in [(2, "generic"), (1100 * SCALE, "blas")]:
        x, out = _rand(rng, rows, 16), np.empty((rows, 64), F32)
        assert kernel.num_inputs == 1 and kernel.select_variant(x, out) == expected
        kernel(x, out)
        np.testing.assert_allclose(out, np.maximum(x @ weight.T, 0), rtol=1e-5, atol=1e-5)


def test_parallel_kernels_raise_the_threshold_and_keep_blas_on_one_thread(monkeypatch):
    """With parallel kernels, BLAS runs on the calling thread only (its spinning workers would slow
    the OpenMP loops down) and must beat the kernels' threads: the work threshold scales with them."""
    seen = []

    def recording_blas(attrs, x, w, out):
        control = strategy._blas_threads()
        seen.append(control.get() if control.get is not None else 1)
        np.matmul(x, w.T, out=out)

    def blas_only(attrs, inputs, out_type):
        x, w = inputs
        return [Implementation("blas", True, plevel=20, external=recording_blas,
                               work=x.shape[0] * w.shape[0] * x.shape[1], min_work=1000)]

    monkeypatch.setattr(get_op("nn.dense"), "strategy", blas_only)
    x, w = Var("x", _t(None, 10)), Var("w", _t(10, 10))
    _, built = build_fused_module({"k": _fn([x, w], op.nn.dense(x, w))})
    kernel = built["k"]
    rng = np.random.default_rng(0)
    xs, ws = _rand(rng, 15, 10), _rand(rng, 10, 10)
    out = np.empty((15, 10), F32)  # 1500 multiply-adds: BLAS on one thread, not on two (needs 16x more)
    try:
        build.set_num_threads(2)
        blas_controlled = strategy._blas_threads().get is not None
        assert kernel.select_variant(xs, ws, out) == "generic"
        big = _rand(rng, 200 * SCALE, 10)
        big_out = np.empty((200 * SCALE, 10), F32)
        assert kernel.select_variant(big, ws, big_out) == ("blas" if blas_controlled else "generic")
        kernel(big, ws, big_out)
        np.testing.assert_allclose(big_out, big @ ws.T, rtol=1e-5, atol=1e-5)
        if blas_controlled:
            before = strategy._blas_threads().get()
            assert seen == [1] and strategy._blas_threads().get() == before
    finally:
        build.set_num_threads(1)
    assert kernel.select_variant(xs, ws, out) == "blas"


# ---- errors and binding ----------------------------------------------------------------------------------


def test_bad_arrays_get_the_c_kernels_errors(kernels):
    kernel = kernels["dense_bias_tanh"]
    rows = 700 * SCALE
    x, w, b = np.ones((rows, 24), F32), np.ones((64, 24), F32), np.ones(64, F32)
    assert kernel.select_variant(x, w, b, np.empty((rows, 64), F32)) == "blas"  # these errors skip BLAS
    with pytest.raises(ShapeError, match="out0 dim 0"):
        kernel(x, w, b, np.empty((rows - 1, 64), F32))
    with pytest.raises(ExecutionError, match="dtype float32"):
        kernel(x.astype("float64"), w, b, np.empty((rows, 64), F32))
    with pytest.raises(ExecutionError, match="C-contiguous"):
        kernel(np.ones((24, rows), F32).T, w, b, np.empty((rows, 64), F32))
    with pytest.raises(ExecutionError, match="expected"):
        kernel(x, w)


def test_bind_chooses_once_and_reuses(kernels):
    rng = np.random.default_rng(9)
    for name, m in [("dense_softmax", 2000), ("dense_softmax", 3), ("dense_bias_tanh", 700)]:
        kernel = kernels[name]
        args = [_rand(rng, m, 16), _rand(rng, 40, 16)] if name == "dense_softmax" else \
            [_rand(rng, m, 24), _rand(rng, 64, 24), _rand(rng, 64)]
        out = np.empty((m, args[1].shape[0]), F32)
        kernel(*args, out)
        expected = out.copy()
        out[:] = np.nan
        call = kernel.bind(*args, out)
        call()
        call()
        np.testing.assert_array_equal(out, expected)
    bad = kernels["dense_dyn"].bind(np.ones((2, 3), F32), np.ones((4, 5), F32), np.empty((2, 4), F32))
    with pytest.raises(ShapeError):
        bad()


def test_bind_on_plain_kernels():
    n = te.var("n")
    x = te.placeholder((n,), F32, "x")
    module = build_module([lower("twice", [x], [te.compute((n,), lambda i: x[i] * 2.0, "y")])])
    kernel = module["twice"]
    a, out = np.arange(5, dtype=F32), np.empty(5, F32)
    call = kernel.bind(a, out)
    call()
    np.testing.assert_array_equal(out, a * 2)
    with pytest.raises(ShapeError):
        kernel.bind(a, np.empty(4, F32))()


# ---- the vector-friendly lowering on its own ------------------------------------------------------------


def test_multiples_are_checked_on_entry_and_remove_remainders():
    n, k = te.var("n"), te.var("k")
    x, w = te.placeholder((4, k), F32, "x"), te.placeholder((n, k), F32, "w")
    r = te.reduce_axis(k, "r")
    out = te.compute((4, n), lambda i, j: te.sum(x[i, r.var] * w[j, r.var], r), "dense")
    func = lower("dense_vec", [x, w], [out], multiples={n: 8, k: 16})
    source = emit_kernel(func).source
    assert "/ INT64_C(16)) * INT64_C(16)" in source and "dense_acc3" in source  # register blocking, dynamic N
    kernel = build_module([func])["dense_vec"]
    rng = np.random.default_rng(0)
    xs, ws = _rand(rng, 4, 32), _rand(rng, 24, 32)
    result = np.empty((4, 24), F32)
    kernel(xs, ws, result)
    np.testing.assert_allclose(result, xs @ ws.T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError, match="multiple of 16"):
        kernel(_rand(rng, 4, 30), _rand(rng, 24, 30), result)


# ---- emission options and warnings -----------------------------------------------------------------------


def _int_pow_and_unused_tuple_field():
    pair = Var("pair", TupleType((_t(None, dtype="uint8"), _t(None, dtype="int32"))))
    return _fn([pair], op.power(TupleGetItem(pair, 0), TupleGetItem(pair, 0)))


def test_options_for_private_kernels():
    func = lower_primitive(_softmax_named(), "k", strategies=False).func
    default = emit_kernel(func).source
    assert "int32_t k(" in default and "tv_team_run(" in default and "#pragma omp parallel" not in default
    options = EmitOptions(storage="static", alloc="ws_alloc", free="ws_free", team=False, parallel_guard="defined(_OPENMP)",
                          simd_guard="defined(_OPENMP) || defined(SIMD)")
    private = emit_kernel(func, options).source
    assert private.startswith("static int32_t k(")
    lines = private.splitlines()
    for i, line in enumerate(lines):
        if "#pragma omp parallel" in line:
            assert lines[i - 1] == "#if defined(_OPENMP)" and lines[i + 1] == "#endif"
        elif "#pragma omp simd" in line:
            assert lines[i - 1] == "#if defined(_OPENMP) || defined(SIMD)"
    big = te.var("n")
    x = te.placeholder((big, 20000), F32, "x")
    r = te.reduce_axis(20000, "r")
    heap = lower("heap", [x], [te.compute((big,), lambda i: te.sum(x[i, r.var], r), "s"),
                               te.compute((big, 20000), lambda i, j: x[i, j] * 2.0, "t")])
    text = emit_kernel(heap, EmitOptions(alloc="ws_alloc", free="ws_free", parallel=False)).source
    assert "malloc" not in text and "#pragma omp parallel" not in text
    assert "tv_set_num_threads" in prelude() and "static inline int32_t tv_set_num_threads" in prelude(True)
    assert "__attribute__((weak))" not in prelude(True)


def test_generated_c_is_clean_under_wextra(tmp_path):
    """The prelude and kernels compile without warnings under -Wall -Wextra (unsigned powers, an unused
    tuple field, a dispatch function, kernels made static with a static prelude)."""
    toolchain = find_toolchain()
    funcs = [lower_primitive(_int_pow_and_unused_tuple_field(), "pow_u8"), lower_primitive(_dense_dyn(), "dense")]
    static = emit_library([emit_kernel(f.func, EmitOptions(storage="static", team=False)) for f in funcs],
                          static_functions=True)
    static += "void* keep[] = {(void*)pow_u8, (void*)dense};\n"
    kernels = [emit_kernel(f.func) for f in funcs]  # (parallel loops on tv_team: outlined bodies)
    assert all("tv_team_run(" in k.source and "omp parallel" not in k.source for k in kernels)
    shared = emit_library(kernels)
    for name, source in (("static", static), ("shared", shared)):
        path = tmp_path / f"{name}.c"
        path.write_text(source)
        flags = [f for f in toolchain.flags if f not in ("-shared",)]
        result = subprocess.run([toolchain.compiler, *flags, "-Wall", "-Wextra", "-Werror", "-c", str(path),
                                 "-o", str(tmp_path / f"{name}.o")], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (name, result.stderr[:3000])
