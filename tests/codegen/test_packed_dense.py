"""Pre-packed weights: ``nn.dense_packed``, the ``PackWeights`` pass and the C product ``tv_gemm_packed_f32``.

The oracle is NumPy (float64 products of the same operands): the op's NumPy kernel, the C product
called directly (its AVX2 tiles and its portable fallback, remainders of rows, columns and reduction
blocks, 1 and 2 threads), and whole programs through the VM on targets "c" and "python".
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorvm import op
from tensorvm.codegen import build
from tensorvm.codegen.c_emit import prelude
from tensorvm.errors import ShapeError, TypeInferenceError
from tensorvm.ir.analysis import post_order
from tensorvm.ir.attrs import Attrs
from tensorvm.ir.expr import Call, Constant, Function, Op, Tuple, Var, const
from tensorvm.ir.module import IRModule
from tensorvm.ir.types import Any, TensorType
from tensorvm.op.nn import pack_dense_weight, packed_lanes, unpack_dense_weight
from tensorvm.op.registry import get_op
from tensorvm.transform.infer_type import InferType
from tensorvm.transform.pack_weights import PackWeights
from tensorvm.transform.vm_pipeline import lower_for_vm, vm_passes
from tensorvm.vm.codegen import generate
from tensorvm.vm.vm import VirtualMachine

F32 = "float32"


def _t(*shape, dtype=F32):
    return TensorType(tuple(Any() if d is None else d for d in shape), dtype)


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max(initial=0))))


needs_cc = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")


# ---- the op -------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(lead=st.lists(st.integers(0, 4), min_size=0, max_size=2), n=st.integers(1, 40), k=st.integers(0, 24),
       seed=st.integers(0, 2**16))
def test_kernel_is_dense_on_the_unpacked_weight(lead, n, k, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*lead, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    packed = pack_dense_weight(w)
    lanes = packed_lanes()
    assert packed.shape == (-(-n // lanes), k, lanes)
    np.testing.assert_array_equal(unpack_dense_weight(packed, n), w)
    if n % lanes:  # the last panel's lanes past n are zeros
        assert not packed[-1, :, n % lanes:].any()
    opdef = get_op("nn.dense_packed")
    got = np.asarray(opdef.kernel(opdef.normalize_attrs({"units": n}), x, packed))
    assert got.shape == (*lead, n) and got.dtype == np.float32
    _close(got, x.astype(np.float64) @ w.T.astype(np.float64))


def test_packed_weights_are_aligned_read_only_panels():
    w = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
    packed = pack_dense_weight(w)
    assert packed.ctypes.data % 64 == 0 and not packed.flags.writeable
    assert packed[1, 1, 3] == w[packed_lanes() + 3, 1]
    with pytest.raises(ShapeError, match="2-D"):
        pack_dense_weight(np.zeros(3, np.float32))


def test_type_relation_and_its_errors():
    rel = get_op("nn.dense_packed")

    def infer(x, p, **attrs):
        return rel.type_rel([x, p], rel.normalize_attrs(attrs))

    assert infer(_t(None, 7, 32), _t(3, 32, 16), units=40) == _t(None, 7, 40)
    assert infer(_t(5, 32), _t(3, 32, 16), units=33, out_dtype="float64") == _t(5, 33, dtype="float64")
    with pytest.raises(TypeInferenceError, match="dim 1"):
        infer(_t(5, 31), _t(3, 32, 16), units=40)
    with pytest.raises(TypeInferenceError, match="ceil"):
        infer(_t(5, 32), _t(2, 32, 16), units=40)
    with pytest.raises(TypeInferenceError, match="panel width"):
        infer(_t(5, 32), _t(5, 32, 0), units=40)
    lanes = packed_lanes()  # an unknown panel width is this host's
    assert infer(_t(5, 32), _t(-(-40 // lanes), 32, None), units=40).shape == (5, 40)
    with pytest.raises(TypeInferenceError, match="ceil"):  # panels of 8 columns: 5 of them for 40 units
        infer(_t(5, 32), _t(3, 32, 8), units=40)
    assert infer(_t(5, 32), _t(5, 32, 8), units=40).shape == (5, 40)
    with pytest.raises(TypeInferenceError, match="dtype"):
        infer(_t(5, 32, dtype="float64"), _t(3, 32, 16), units=40)
    with pytest.raises(ShapeError, match="dim 1"):  # the shape function at run time
        rel.shape_func(rel.normalize_attrs({"units": 40}), [(5, 31), (3, 32, 16)])
    assert rel.shape_func(rel.normalize_attrs({"units": 40}), [(2, 5, 32), (3, 32, 16)]) == [(2, 5, 40)]


# ---- the C product ----------------------------------------------------------------------------------

_CALLER = """
int32_t tv_test_packed(int64_t m, int64_t n, int64_t k, int64_t lanes, const float* x, const float* packed,
                       float* out) {
  return tv_gemm_packed_f32(m, n, k, lanes, x, packed, out);
}
"""


@pytest.fixture(scope="module", params=["native", "portable"])
def packed_product(request):
    """``tv_gemm_packed_f32`` compiled with the kernels' flags (AVX2 tiles where the machine has them)
    and without AVX2/FMA (the portable tiles)."""
    if not build.have_compiler():
        pytest.skip("no C compiler")
    extra = () if request.param == "native" else ("-mno-avx2", "-mno-fma")
    library = build.build_library([(prelude() + _CALLER, extra)])
    function = library._cdll.tv_test_packed
    function.restype = ctypes.c_int32
    function.argtypes = [ctypes.c_int64] * 4 + [ctypes.c_void_p] * 3
    library._cdll.tv_set_num_threads.argtypes = [ctypes.c_int32]

    def run(x, packed, n, threads):
        library._cdll.tv_set_num_threads(threads)
        out = np.full((x.shape[0], n), np.nan, np.float32)
        assert function(x.shape[0], n, x.shape[1], packed.shape[2], x.ctypes.data, packed.ctypes.data,
                        out.ctypes.data) == 0
        return out

    return run


# rows: the 6-row tiles and every remainder, one row (GEMV, odd reductions), several row blocks;
# columns: a partial last panel; reductions: 0, below, at and above one block of 768, and split into
# unequal blocks (769 -> 385 + 384, 1600 -> 534 + 534 + 532); rows in one block of up to 132 or in two
PRODUCT_SHAPES = [(m, n, k) for m in (1, 2, 5, 6, 7, 16) for n, k in ((16, 256), (17, 257), (40, 3))] + [
    (1, 33, 1), (1, 48, 5), (3, 5, 0), (0, 20, 8), (100, 16, 600), (100, 70, 520), (211, 300, 40), (13, 100, 300),
    (7, 20, 768), (7, 20, 769), (16, 17, 1537), (100, 40, 1600), (130, 33, 800), (140, 20, 800)]


@pytest.mark.parametrize("threads", [1, 2])
def test_product_matches_numpy(packed_product, threads):
    rng = np.random.default_rng(threads)
    for m, n, k in PRODUCT_SHAPES:
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        got = packed_product(x, pack_dense_weight(w), n, threads)
        _close(got, x.astype(np.float64) @ w.T.astype(np.float64))


@pytest.mark.parametrize("lanes", [8, 32])
def test_weights_packed_for_another_width_still_multiply(packed_product, lanes):
    """Panels of another width than the library's tiles (weights packed on another CPU) run plain loops."""
    rng = np.random.default_rng(lanes)
    for m, n, k in [(1, 5, 3), (7, 40, 33), (20, 70, 9)]:
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        got = packed_product(x, pack_dense_weight(w, lanes), n, 1)
        _close(got, x.astype(np.float64) @ w.T.astype(np.float64))


def test_unaligned_weights_are_fine(packed_product):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((9, 70)).astype(np.float32)
    w = rng.standard_normal((50, 70)).astype(np.float32)
    aligned = pack_dense_weight(w)
    shifted = np.empty(aligned.size + 1, np.float32)[1:].reshape(aligned.shape)  # 4 bytes off
    shifted[...] = aligned
    _close(packed_product(x, shifted, 50, 1), x.astype(np.float64) @ w.T.astype(np.float64))


# ---- the pass -----------------------------------------------------------------------------------------


def _calls(expr, name):
    return [e for e in post_order(expr) if isinstance(e, Call) and getattr(e.op, "name", None) == name]


def _main(body_of, *params):
    return InferType()(IRModule.from_expr(Function(list(params), body_of(*params))))


def test_pass_packs_constant_weights_of_dense_and_matmul():
    rng = np.random.default_rng(1)
    w_dense, w_kn, w_nk = (rng.standard_normal(s).astype(np.float32) for s in ((20, 8), (8, 20), (20, 8)))
    x = Var("x", _t(None, 8))
    mod = _main(lambda x: op.add(op.add(op.nn.dense(x, const(w_dense)), op.nn.matmul(x, const(w_kn))),
                                 op.nn.matmul(x, const(w_nk), transpose_b=True, units=20)), x)
    packed_mod = PackWeights()(mod)
    body = packed_mod["main"].body
    assert _calls(body, "nn.dense") == [] and _calls(body, "nn.matmul") == []
    calls = _calls(body, "nn.dense_packed")
    assert len(calls) == 3 and all(c.attrs.units == 20 for c in calls)
    for call in calls:
        lanes = packed_lanes()
        assert isinstance(call.args[1], Constant) and call.args[1].data.shape == (-(-20 // lanes), 8, lanes)
    weights = sorted((unpack_dense_weight(c.args[1].data, 20) for c in calls), key=lambda a: a.tobytes())
    want = sorted((w_dense, w_kn.T, w_nk), key=lambda a: a.tobytes())
    for got, expected in zip(weights, want, strict=True):
        np.testing.assert_array_equal(got, expected)
    assert InferType()(packed_mod)["main"].body.checked_type == mod["main"].body.checked_type
    data = rng.standard_normal((3, 8)).astype(np.float32)
    _close(_run_lowered(packed_mod, "python", data),
           data.astype(np.float64) @ (w_dense.T + w_kn + w_nk.T).astype(np.float64))


def test_pass_leaves_other_products_alone():
    rng = np.random.default_rng(2)
    x, w = Var("x", _t(None, 8)), Var("w", _t(20, 8))
    x64 = Var("x64", _t(None, 8, dtype="float64"))
    xt = Var("xt", _t(8, None))
    mod = _main(lambda x, w, x64, xt: Tuple([
        op.nn.dense(x, w),  # not a constant
        op.nn.dense(x64, const(rng.standard_normal((20, 8)))),  # float64
        op.nn.matmul(xt, const(rng.standard_normal((8, 20)).astype(np.float32)), transpose_a=True)]), x, w, x64, xt)
    body = PackWeights()(mod)["main"].body
    assert _calls(body, "nn.dense_packed") == []
    assert len(_calls(body, "nn.dense")) == 2 and len(_calls(body, "nn.matmul")) == 1


def test_a_shared_weight_is_packed_once():
    w = const(np.ones((20, 8), np.float32))
    x, y = Var("x", _t(None, 8)), Var("y", _t(None, 8))
    body = PackWeights()(_main(lambda x, y: op.add(op.nn.dense(x, w), op.nn.dense(y, w)), x, y))["main"].body
    first, second = _calls(body, "nn.dense_packed")
    assert first.args[1] is second.args[1]


def test_only_target_c_packs():
    assert any(type(p).__name__ == "PackWeights" for p in vm_passes(target="c"))
    assert not any(type(p).__name__ == "PackWeights" for p in vm_passes())  # graph executor, AOT, python
    assert not any(type(p).__name__ == "PackWeights" for p in vm_passes(target="python"))


# ---- through the VM ------------------------------------------------------------------------------------


def _run_lowered(mod, target, *args, params=None, lower_target=None):
    lowered = lower_for_vm(mod, params=params, target=lower_target or target)
    exe = generate(lowered, target=target)
    return VirtualMachine(exe).invoke("main", *args).numpy()


def _gelu(v):
    from math import erf

    return 0.5 * v * (1 + np.vectorize(erf)(v / np.sqrt(2)))


def _programs(rng):
    """(module, params, oracle(x)): dense + bias + gelu and matmul + bias, rows dynamic."""
    w1, b1 = rng.standard_normal((72, 48)).astype(np.float32) * 0.2, rng.standard_normal(72).astype(np.float32)
    w2, b2 = rng.standard_normal((48, 40)).astype(np.float32) * 0.2, rng.standard_normal(40).astype(np.float32)
    x, w, b = Var("x", _t(None, 48)), Var("w", _t(72, 48)), Var("b", _t(72))
    dense = IRModule.from_expr(Function([x, w, b], op.nn.gelu(op.nn.bias_add(op.nn.dense(x, w), b))))
    x, w, b = Var("x", _t(None, 48)), Var("w", _t(48, 40)), Var("b", _t(40))
    matmul = IRModule.from_expr(Function([x, w, b], op.add(op.nn.matmul(x, w), b)))
    return [
        (dense, {"w": w1, "b": b1}, lambda a: _gelu(a.astype(np.float64) @ w1.T + b1)),
        (matmul, {"w": w2, "b": b2}, lambda a: a.astype(np.float64) @ w2 + b2),
    ]


@needs_cc
@pytest.mark.parametrize("threads", [1, 2])
def test_vm_results_match_numpy_for_dynamic_rows(threads, kernel_threads):
    kernel_threads(threads)
    rng = np.random.default_rng(threads)
    for mod, params, oracle in _programs(rng):
        exes = {target: generate(lower_for_vm(mod, params=params, target=target), target=target)
                for target in ("c", "python")}
        assert "= tv_gemm_packed_f32(" in exes["c"].as_text(kernels=True)
        assert "nn.dense_packed" not in exes["python"].as_text()
        for rows in (1, 5, 64, 300):
            data = rng.standard_normal((rows, 48)).astype(np.float32)
            for exe in exes.values():
                _close(VirtualMachine(exe).invoke("main", data).numpy(), oracle(data))


@needs_cc
@pytest.mark.parametrize("lanes", [8, 32])
def test_weights_packed_for_another_cpu_run_the_generated_kernel(lanes):
    """Panels of another width than this host's product: the generated kernel over that layout."""
    rng = np.random.default_rng(lanes)
    w = rng.standard_normal((40, 24)).astype(np.float32)
    x = Var("x", _t(None, 24))
    packed = const(pack_dense_weight(w, lanes))
    mod = IRModule.from_expr(Function([x], Call(Op("nn.dense_packed"), (x, packed), Attrs(units=40))))
    exe = generate(lower_for_vm(mod, target="c"), target="c")
    assert ("tv_gemm_packed_f32(" in exe.as_text(kernels=True)) == (lanes == packed_lanes())
    data = rng.standard_normal((7, 24)).astype(np.float32)
    _close(VirtualMachine(exe).invoke("main", data).numpy(), data.astype(np.float64) @ w.T.astype(np.float64))


@needs_cc
def test_packed_op_on_the_python_target():
    """A module already holding nn.dense_packed (lowered for "c") also runs on NumPy kernels."""
    mod, params, oracle = _programs(np.random.default_rng(3))[0]
    data = np.random.default_rng(4).standard_normal((6, 48)).astype(np.float32)
    _close(_run_lowered(mod, "python", data, params=params, lower_target="c"), oracle(data))


@needs_cc
def test_executable_holds_only_the_packed_weight_and_round_trips():
    from tensorvm.vm import load_executable

    mod, params, oracle = _programs(np.random.default_rng(5))[0]
    exe = generate(lower_for_vm(mod, params=params, target="c"), target="c")
    shapes = [np.asarray(c).shape for c in exe.constants]
    lanes = packed_lanes()
    assert (-(-72 // lanes), 48, lanes) in shapes and (72, 48) not in shapes  # the weight is not kept twice
    from tensorvm.codegen.host import gemm_params, host

    product = exe.stats()["product_kernels"]["packed_product"]  # which instance runs, and why
    assert product["isa"] == host().isa and product["tile"] == f"{gemm_params().mr}x{lanes}"
    data = np.random.default_rng(6).standard_normal((9, 48)).astype(np.float32)
    loaded = load_executable(exe.save_bytes())
    _close(VirtualMachine(loaded).invoke("main", data).numpy(), oracle(data))


# ---- the epilogue in the product's tiles (strategy.product_epilogue, tv_gemm_packed_epi_f32) ------------


@pytest.fixture
def product_epilogue(monkeypatch):
    """The routing on (``strategy.PRODUCT_EPILOGUE``, off by default until measured faster)."""
    from tensorvm.codegen import strategy

    monkeypatch.setattr(strategy, "PRODUCT_EPILOGUE", True)


def _gelu_tanh(v):
    return v / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))


def _erf_gelu_as_exported(v):
    """0.5 v (1 + erf(v / sqrt 2)) in the ops torch's GELU becomes in ONNX (and another grouping)."""
    first = op.multiply(op.multiply(v, op.add(op.erf(op.divide(v, const(np.float32(np.sqrt(2))))),
                                              const(np.float32(1)))), const(np.float32(0.5)))
    return first


def _epilogue_programs(rng, n=45, k=37):
    """(name, body(product, bias, residual) -> expr, uses residual, oracle(product64, bias, residual))."""
    def hard_swish(v):
        return op.multiply(v, op.divide(op.clip(op.add(v, const(np.float32(3))), a_min=0.0, a_max=6.0),
                                        const(np.float32(6))))
    return [
        ("bias", lambda p, b, r: op.add(b, p), False, lambda p, b, r: p + b),
        ("bias_add+residual", lambda p, b, r: op.add(op.nn.bias_add(p, b, axis=-1), r), True, lambda p, b, r: p + b + r),
        ("residual", lambda p, b, r: op.add(r, p), True, lambda p, b, r: p + r),
        ("bias+erf gelu", lambda p, b, r: _erf_gelu_as_exported(op.add(p, b)), False,
         lambda p, b, r: _gelu(p + b)),
        ("bias+residual+tanh gelu", lambda p, b, r: op.nn.gelu(op.add(op.add(p, b), r), approximate="tanh"), True,
         lambda p, b, r: _gelu_tanh(p + b + r)),
        ("bias+hard-swish", lambda p, b, r: hard_swish(op.add(p, b)), False,
         lambda p, b, r: (p + b) * np.clip(p + b + 3, 0, 6) / 6),
        ("relu", lambda p, b, r: op.nn.relu(op.add(p, b)), False, lambda p, b, r: np.maximum(p + b, 0)),
        ("bias+erf gelu regrouped", lambda p, b, r: _erf_gelu_regrouped(op.add(b, p)), False,
         lambda p, b, r: _gelu(p + b)),
        ("bias+tanh gelu as exported", lambda p, b, r: _tanh_gelu_as_exported(op.add(p, b)), False,
         lambda p, b, r: _gelu_tanh(p + b)),
    ]


def _f32(value):
    return const(np.float32(value))


def _erf_gelu_regrouped(v):
    """(0.5 v) (erf(v * (1 / sqrt 2)) + 1)."""
    return op.multiply(op.multiply(_f32(0.5), v), op.add(op.erf(op.multiply(v, _f32(1 / np.sqrt(2)))), _f32(1)))


def _tanh_gelu_as_exported(v):
    """0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3))), the cube a power (GPT-2's GELU in ONNX)."""
    inner = op.multiply(_f32(np.sqrt(2 / np.pi)), op.add(v, op.multiply(_f32(0.044715), op.power(v, _f32(3)))))
    return op.multiply(op.multiply(_f32(0.5), v), op.add(_f32(1), op.tanh(inner)))


@needs_cc
@pytest.mark.parametrize("threads", [1, 2])
def test_product_epilogue_runs_in_the_tiles_and_matches_numpy(threads, kernel_threads, product_epilogue):
    """Each fused tail of a dense with a constant weight runs in the product's tiles (one call, no second
    pass), at dynamic rows (1 to 300, a partial last panel of 45 columns), with NaN and inf inputs."""
    kernel_threads(threads)
    rng = np.random.default_rng(10 + threads)
    n, k = 45, 37
    w = (rng.standard_normal((n, k)) * 0.3).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    for name, body, uses_residual, oracle in _epilogue_programs(rng, n, k):
        x, r = Var("x", _t(None, k)), Var("r", _t(None, n))
        params = [x, r] if uses_residual else [x]
        mod = IRModule.from_expr(Function(params, body(op.nn.dense(x, const(w)), const(bias), r)))
        exe = generate(lower_for_vm(mod, target="c"), target="c")
        text = exe.as_text(kernels=True)
        assert "= tv_gemm_packed_epi_f32(" in text, name
        # (with a residual of dynamic rows, the product then its second pass stays for a residual that broadcasts)
        assert ("= tv_gemm_packed_f32(" in text) == uses_residual, name
        vm = VirtualMachine(exe)
        for rows in (1, 5, 64, 300):
            data = (rng.standard_normal((rows, k)) * 2).astype(np.float32)
            data[0, 3] = np.nan if rows > 1 else 1.0
            if rows > 5:
                data[4, :] = np.inf
            res = rng.standard_normal((rows, n)).astype(np.float32)
            got = vm.invoke("main", *([data, res] if uses_residual else [data])).numpy()
            with np.errstate(all="ignore"):
                want = oracle(data.astype(np.float64) @ w.T.astype(np.float64), bias, res)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{name}, {rows} rows")
            finite = np.isfinite(want)
            np.testing.assert_array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
            _close(got[finite], want[finite])


@needs_cc
def test_product_epilogue_keeps_the_second_pass_where_it_cannot_apply(product_epilogue):
    """A residual that broadcasts over the rows (one row for many) and a bias per row are not the tiles'
    epilogue: the product then its second pass, with the same results as NumPy."""
    rng = np.random.default_rng(20)
    n, k = 21, 11
    w = rng.standard_normal((n, k)).astype(np.float32)
    x, r = Var("x", _t(None, k)), Var("r", _t(None, n))
    mod = IRModule.from_expr(Function([x, r], op.add(op.nn.dense(x, const(w)), r)))
    exe = generate(lower_for_vm(mod, target="c"), target="c")
    assert "= tv_gemm_packed_epi_f32(" in exe.as_text(kernels=True)  # (under a check of the residual's rows)
    vm = VirtualMachine(exe)
    data = rng.standard_normal((6, k)).astype(np.float32)
    for res_rows in (6, 1):
        res = rng.standard_normal((res_rows, n)).astype(np.float32)
        _close(vm.invoke("main", data, res).numpy(), data.astype(np.float64) @ w.T.astype(np.float64) + res)
    # not GELU (erf(v / 2)): the generated second pass
    d = op.nn.dense(x, const(w))
    mod = IRModule.from_expr(Function([x], op.multiply(op.multiply(_f32(0.5), d), op.add(op.erf(op.divide(d, _f32(2))),
                                                                                       _f32(1)))))
    exe = generate(lower_for_vm(mod, target="c"), target="c")
    assert "= tv_gemm_packed_epi_f32(" not in exe.as_text(kernels=True)
    from math import erf

    p = data.astype(np.float64) @ w.T.astype(np.float64)
    _close(VirtualMachine(exe).invoke("main", data).numpy(), 0.5 * p * (1 + np.vectorize(erf)(p / 2)))
    column = Var("c", _t(None, 1))
    mod = IRModule.from_expr(Function([x, column], op.add(op.nn.dense(x, const(w)), column)))
    exe = generate(lower_for_vm(mod, target="c"), target="c")
    assert "= tv_gemm_packed_epi_f32(" not in exe.as_text(kernels=True)
    col = rng.standard_normal((6, 1)).astype(np.float32)
    _close(VirtualMachine(exe).invoke("main", data, col).numpy(), data.astype(np.float64) @ w.T.astype(np.float64) + col)


@needs_cc
def test_product_epilogue_is_off_by_default():
    """Without ``strategy.PRODUCT_EPILOGUE`` a dense + bias + GELU group is the product then its pass."""
    mod, params, oracle = _programs(np.random.default_rng(7))[0]
    exe = generate(lower_for_vm(mod, params=params, target="c"), target="c")
    text = exe.as_text(kernels=True)
    assert "= tv_gemm_packed_f32(" in text and "= tv_gemm_packed_epi_f32(" not in text
