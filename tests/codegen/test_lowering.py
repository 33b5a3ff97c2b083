"""Lowering decisions (inlining, shared outer loops, reductions, parallelism) and the emitted C, plus
hand-written tensor-expression kernels compiled into one library and checked against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorvm import te
from tensorvm.codegen.c_emit import emit_kernel
from tensorvm.codegen.host import kernel_rules
from tensorvm.codegen.loop_ir import PARALLEL, VECTORIZED, Allocate, For, walk_stmts
from tensorvm.codegen.lower import lower
from tensorvm.codegen.module import build_module
from tensorvm.errors import ShapeError, UnsupportedError
from tensorvm.te.expr import Call
from tensorvm.te.tensor import walk

# ---- helpers ----------------------------------------------------------------------------------------


def _loops(func):
    return [s for s in walk_stmts(func.body) if isinstance(s, For)]


def _layer_norm(n, width=64):
    x = te.placeholder((n, width), "float32", "x")
    k1, k2 = te.reduce_axis(width, "k1"), te.reduce_axis(width, "k2")
    total = te.compute((n,), lambda i: te.sum(x[i, k1], axis=k1), "total")
    mean = te.compute((n,), lambda i: total[i] / float(width), "mean")
    sq = te.compute((n,), lambda i: te.sum((x[i, k2] - mean[i]) * (x[i, k2] - mean[i]), axis=k2), "sq")
    out = te.compute((n, width), lambda i, j: (x[i, j] - mean[i]) / te.sqrt(sq[i] / float(width) + 1e-5), "ln")
    return x, out


def _dense_tanh(m):
    x = te.placeholder((m, 32), "float32", "x")
    w = te.placeholder((16, 32), "float32", "w")
    b = te.placeholder((16,), "float32", "b")
    k = te.reduce_axis(32, "k")
    d = te.compute((m, 16), lambda i, j: te.sum(x[i, k] * w[j, k], axis=k), "dense")
    out = te.compute((m, 16), lambda i, j: te.tanh(d[i, j] + b[j]), "out")
    return [x, w, b], out


def _matmul(m):
    a = te.placeholder((m, 24), "float32", "a")
    b = te.placeholder((24, 40), "float32", "b")
    k = te.reduce_axis(24, "k")
    return [a, b], te.compute((m, 40), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), "mm")


def _softmax(n, width):
    x = te.placeholder((n, width), "float32", "x")
    r, s = te.reduce_axis(width, "r"), te.reduce_axis(width, "s")
    peak = te.compute((n,), lambda i: te.max(x[i, r], axis=r), "peak")
    e = te.compute((n, width), lambda i, j: te.exp(x[i, j] - peak[i]), "e")
    total = te.compute((n,), lambda i: te.sum(e[i, s], axis=s), "total")
    return x, te.compute((n, width), lambda i, j: e[i, j] / total[i], "softmax")


# ---- lowering decisions -----------------------------------------------------------------------------


def test_layer_norm_shares_one_parallel_row_loop():
    n = te.var("n")
    x, out = _layer_norm(n)
    func = lower("ln", [x], [out])
    top = [s for s in walk_stmts(func.body) if isinstance(s, For) and s.kind == PARALLEL]
    assert len(top) == 1 and top[0].parallel_if is not None  # dynamic size: fork only when worth it
    temps = [s.buffer for s in walk_stmts(top[0].body) if isinstance(s, Allocate)]
    assert {b.name for b in temps} >= {"total", "sq"} and all(b.shape == () for b in temps)
    reductions = [s for s in _loops(func) if s.reductions]
    assert len(reductions) == 2 and all(s.kind == VECTORIZED and s.reductions[0][0] == "+" for s in reductions)


def test_epilogue_is_fused_after_a_register_blocked_reduction():
    inputs, out = _dense_tanh(te.var("m"))
    func = lower("dense_tanh", inputs, [out])
    loops = _loops(func)
    assert loops[0].kind == PARALLEL and len([s for s in loops if s.kind == PARALLEL]) == 1
    reduction = next(s for s in loops if s.reductions)
    assert len(reduction.reductions) == kernel_rules().jam  # outputs per pass over k share the loads of x
    epilogue = [s for s in walk_stmts(loops[0].body) if isinstance(s, For) and s.kind == VECTORIZED
                and not s.reductions]
    assert epilogue  # tanh(dense + b) runs inside the same row loop, from the row temporary


def test_strided_reduction_moves_the_output_axis_inside():
    inputs, out = _matmul(te.var("m"))
    func = lower("mm", inputs, [out])
    reduce_loop = next(s for s in _loops(func) if s.loop_var.name == "k")
    assert isinstance(reduce_loop.body, For) and reduce_loop.body.kind == VECTORIZED  # for k: for j (vector)


def test_shared_expensive_compute_is_computed_once():
    x, out = _softmax(te.var("n"), 32)
    func = lower("softmax", [x], [out])
    source = str(func)
    assert source.count("exp(") == 1


def test_small_static_kernel_stays_serial_and_static_dims_are_constants():
    x = te.placeholder((4, 4), "float32", "x")
    y = te.compute((4, 4), lambda i, j: x[i, j] + 1.0, "y")
    func = lower("small", [x], [y])
    assert func.dim_params == () and all(s.kind != PARALLEL for s in _loops(func))
    source = emit_kernel(func).source
    assert "int32_t small(const float* restrict x, float* restrict out0)" in source


def test_emitted_c_has_dim_parameters_and_pragmas():
    inputs, out = _dense_tanh(te.var("m"))
    source = emit_kernel(lower("dense_tanh", inputs, [out])).source
    assert "int64_t x_shape0" in source and "int64_t out0_shape0" in source
    assert "tv_team_run(" in source and "#pragma omp simd reduction(+:" in source
    assert "#pragma omp parallel" not in source  # (the parallel loop runs on tensorvm's pool)
    assert "return 1;" in source  # the output dim check


def test_dims_that_cannot_be_inferred_are_rejected():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n,), "float32", "x")
    y = te.compute((n,), lambda i: x[te.minimum(i, m)] * 2.0, "y")  # m is no dim of any argument
    with pytest.raises(UnsupportedError, match="m cannot be inferred"):
        lower("bad", [x], [y])
    only_out = lower("out_dim", [x], [te.compute((m,), lambda i: x[0], "z")])  # an output's own dim: bound
    assert [v.name for v in only_out.dim_params] == ["x_shape0", "out0_shape0"]
    z = te.placeholder((n * 2,), "float32", "z")
    with pytest.raises(UnsupportedError, match="ints or te.var"):
        lower("bad2", [z], [te.compute((n,), lambda i: z[i], "w")])


# ---- compiled hand-written kernels ------------------------------------------------------------------


@pytest.fixture(scope="module")
def module():
    funcs = []
    n = te.var("n")
    x, out = _layer_norm(n)
    funcs.append(lower("ln", [x], [out]))
    inputs, out = _dense_tanh(te.var("m"))
    funcs.append(lower("dense_tanh", inputs, [out]))
    inputs, out = _matmul(te.var("m"))
    funcs.append(lower("mm", inputs, [out]))
    w = te.var("w")
    x, out = _softmax(te.var("n"), w)  # a dynamic row: the exp row lives on the heap
    funcs.append(lower("softmax_dyn", [x], [out]))
    # a symbol shared by two inputs, and two outputs
    n = te.var("n")
    a, b = te.placeholder((n,), "float32", "a"), te.placeholder((n,), "float32", "b")
    s = te.compute((n,), lambda i: a[i] + b[i], "s")
    d = te.compute((n,), lambda i: a[i] - b[i], "d")
    funcs.append(lower("sum_diff", [a, b], [s, d]))
    # an output that is an input, and the same tensor twice
    c = te.placeholder((3,), "int32", "c")
    funcs.append(lower("identity", [c], [c, c]))
    # float16 arithmetic rounds after every operation, like NumPy
    h = te.placeholder((n,), "float16", "h")
    funcs.append(lower("half", [h], [te.compute((n,), lambda i: h[i] * h[i] + h[i], "hh")]))
    # argmax with a where= condition (skip negative values)
    v = te.placeholder((n, 6), "float32", "v")
    k = te.reduce_axis(6, "k")
    idx, _ = te.compute((n,), lambda i: te.argmax(v[i, k], axis=k), "am")
    funcs.append(lower("argmax", [v], [idx]))
    return build_module(funcs)


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(0, 40), seed=st.integers(0, 2**31))
def test_compiled_layer_norm_and_dense(module, rows, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 64)).astype("float32")
    out = np.empty_like(x)
    module["ln"](x, out)
    mean = x.mean(-1, keepdims=True)
    expected = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    xd = rng.standard_normal((rows, 32)).astype("float32")
    w = rng.standard_normal((16, 32)).astype("float32")
    b = rng.standard_normal(16).astype("float32")
    out = np.empty((rows, 16), "float32")
    module["dense_tanh"](xd, w, b, out)
    np.testing.assert_allclose(out, np.tanh(xd @ w.T + b), rtol=1e-4, atol=1e-5)
    a, bm = rng.standard_normal((rows, 24)).astype("float32"), rng.standard_normal((24, 40)).astype("float32")
    out = np.empty((rows, 40), "float32")
    module["mm"](a, bm, out)
    np.testing.assert_allclose(out, a @ bm, rtol=1e-4, atol=1e-4)


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 5), width=st.sampled_from([1, 7, 9000]), seed=st.integers(0, 2**31))
def test_compiled_softmax_with_dynamic_row(module, rows, width, seed):
    x = np.random.default_rng(seed).standard_normal((rows, width)).astype("float32") * 5
    out = np.empty_like(x)
    module["softmax_dyn"](x, out)
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_shared_symbol_and_multiple_outputs(module):
    a, b = np.arange(5, dtype="float32"), np.ones(5, "float32")
    s, d = np.empty(5, "float32"), np.empty(5, "float32")
    module["sum_diff"](a, b, s, d)
    np.testing.assert_array_equal(s, a + b)
    np.testing.assert_array_equal(d, a - b)
    with pytest.raises(ShapeError, match="input b dim 0 must be n"):
        module["sum_diff"](a, np.ones(4, "float32"), s, d)


def test_outputs_that_are_inputs_are_copied(module):
    c = np.array([1, -2, 3], "int32")
    o1, o2 = np.zeros(3, "int32"), np.zeros(3, "int32")
    module["identity"](c, o1, o2)
    np.testing.assert_array_equal(o1, c)
    np.testing.assert_array_equal(o2, c)


def test_float16_rounds_like_numpy(module):
    h = (np.random.default_rng(1).standard_normal(1000) * 30).astype("float16")
    out = np.empty_like(h)
    module["half"](h, out)
    np.testing.assert_array_equal(out, h * h + h)


def test_argmax_first_index_and_nan(module):
    v = np.array([[1, 3, 3, 0, 2, 3], [np.nan, 1, np.nan, 0, 0, 0], [-np.inf] * 6], "float32")
    out = np.empty(3, "int64")
    module["argmax"](v, out)
    np.testing.assert_array_equal(out, np.argmax(v, axis=1))


def test_nan_wins_vectorized_max():
    x = te.placeholder((te.var("n"),), "float32", "x")
    r = te.reduce_axis(x.shape[0], "r")
    peak = te.compute((), lambda: te.max(x[r], axis=r), "peak")
    func = lower("peak", [x], [peak])
    assert any(s.reductions and s.reductions[0][0] == "max" for s in _loops(func))
    kernel = build_module([func])["peak"]
    for values in ([1.0, 5.0, -2.0], [1.0, np.nan, 7.0], [], [-np.inf]):
        out = np.empty((), "float32")
        kernel(np.array(values, "float32"), out)
        expected = np.max(np.array(values, "float32"), initial=-np.inf)
        assert (np.isnan(out) and np.isnan(expected)) or out == expected


def test_no_stray_calls_in_index_math():
    n = te.var("n")
    x = te.placeholder((n, 12), "float32", "x")
    y = te.compute((n, 3, 4), lambda i, j, k: x[i, j * 4 + k], "y")
    func = lower("r", [x], [y])
    assert not any(isinstance(node, Call) for s in walk_stmts(func.body) for v in (getattr(s, "value", None),)
                   if v is not None for node in walk(v))
