"""Fused primitive functions (DAGs of op calls) as single C kernels, checked against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorvm import op
from tensorvm.codegen.fused import build_fused_kernel, build_fused_module, lower_primitive
from tensorvm.codegen.loop_ir import PARALLEL, For, Seq
from tensorvm.errors import ShapeError, TypeInferenceError, UnsupportedError
from tensorvm.ir.expr import Function, If, Let, Tuple, TupleGetItem, Var, const
from tensorvm.ir.types import Any, SymDim, TensorType, TupleType
from tensorvm.op import get_op

H = 48


def _fn(params, body):
    return Function(params, body, attrs={"Primitive": 1})


def _dense_add_tanh():
    x, w, b = Var("x", TensorType((Any(), H))), Var("w", TensorType((16, H))), Var("b", TensorType((16,)))
    return _fn([x, w, b], op.tanh(op.add(op.nn.dense(x, w), b)))


def _layer_norm_from_ops():
    """The layer norm as a front end emits it: mean, subtract, variance, rsqrt, scale and shift."""
    x, g, b = Var("x", TensorType((Any(), H))), Var("g", TensorType((H,))), Var("b", TensorType((H,)))
    mean = op.mean(x, axis=[-1], keepdims=True)
    centered = op.subtract(x, mean)
    var = op.mean(op.multiply(centered, centered), axis=[-1], keepdims=True)
    normalized = op.multiply(centered, op.rsqrt(op.add(var, const(1e-5))))
    return _fn([x, g, b], op.add(op.multiply(normalized, g), b))


def _softmax_from_ops():
    x = Var("x", TensorType((Any(), Any())))
    e = op.exp(op.subtract(x, op.max(x, axis=[-1], keepdims=True)))
    return _fn([x], op.divide(e, op.sum(e, axis=[-1], keepdims=True)))


def _tuples_and_lets():
    """split into a tuple, a let, projections, a tuple parameter and a tuple result."""
    pair = Var("pair", TupleType((TensorType((Any(), 4)), TensorType((Any(), 4)))))
    parts = Var("parts")
    joined = op.concatenate(pair, axis=0)
    body = Let(parts, op.split(joined, indices_or_sections=2, axis=1),
               Tuple([op.multiply(TupleGetItem(parts, 0), const(2.0)), TupleGetItem(parts, 1)]))
    return _fn([pair], body)


def _with_constants():
    x = Var("x", TensorType((3, 4)))
    table = const(np.arange(12, dtype="float32").reshape(3, 4))
    return _fn([x], op.add(op.multiply(x, table), const(0.5)))


def _symbolic():
    n = SymDim("n")
    x, y = Var("x", TensorType((n, 4))), Var("y", TensorType((n, 4)))
    return _fn([x, y], op.maximum(x, y))


PRIMS = {
    "fused_dense_add_tanh": _dense_add_tanh(),
    "fused_layer_norm": _layer_norm_from_ops(),
    "fused_softmax": _softmax_from_ops(),
    "fused_tuples": _tuples_and_lets(),
    "fused_constants": _with_constants(),
    "fused_symbolic": _symbolic(),
}


@pytest.fixture(scope="module")
def kernels():
    _, kernels = build_fused_module(PRIMS)
    return kernels


def _parallel_loops(func):
    stack, found = [func.body], []
    while stack:
        s = stack.pop()
        if isinstance(s, For) and s.kind == PARALLEL:
            found.append(s)
        stack.extend(getattr(s, "stmts", ()) if isinstance(s, Seq) else
                     [c for c in (getattr(s, "body", None), getattr(s, "then_case", None)) if c is not None])
    return found


@pytest.mark.parametrize("name", ["fused_dense_add_tanh", "fused_layer_norm", "fused_softmax"])
def test_fused_group_is_one_loop_nest(name):
    func = lower_primitive(PRIMS[name], name).func
    assert len(_parallel_loops(func)) == 1  # one parallel nest: every op of the group runs inside it


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(0, 33), seed=st.integers(0, 2**31))
def test_dense_add_tanh(kernels, rows, seed):
    rng = np.random.default_rng(seed)
    x, w, b = (rng.standard_normal(s).astype("float32") for s in ((rows, H), (16, H), (16,)))
    out = np.empty((rows, 16), "float32")
    kernels["fused_dense_add_tanh"](x, w, b, out)
    np.testing.assert_allclose(out, np.tanh(x @ w.T + b), rtol=1e-4, atol=1e-5)


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 20), seed=st.integers(0, 2**31))
def test_layer_norm_from_ops(kernels, rows, seed):
    rng = np.random.default_rng(seed)
    x, g, b = (rng.standard_normal(s).astype("float32") for s in ((rows, H), (H,), (H,)))
    out = np.empty_like(x)
    kernels["fused_layer_norm"](x, g, b, out)
    mean = x.mean(-1, keepdims=True)
    expected = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 6), cols=st.integers(1, 300), seed=st.integers(0, 2**31))
def test_softmax_from_ops(kernels, rows, cols, seed):
    x = (np.random.default_rng(seed).standard_normal((rows, cols)) * 4).astype("float32")
    out = np.empty_like(x)
    kernels["fused_softmax"](x, out)
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_tuple_parameters_results_and_lets(kernels):
    a, b = np.arange(8, dtype="float32").reshape(2, 4), -np.arange(12, dtype="float32").reshape(3, 4)
    left, right = np.empty((5, 2), "float32"), np.empty((5, 2), "float32")
    kernels["fused_tuples"](a, b, left, right)  # the tuple parameter arrives flattened, like in the VM
    joined = np.concatenate([a, b])
    np.testing.assert_array_equal(left, joined[:, :2] * 2)
    np.testing.assert_array_equal(right, joined[:, 2:])


def test_constants_are_folded_or_passed_for_you(kernels):
    kernel = kernels["fused_constants"]
    assert kernel.num_inputs == 1 and kernel.kernel.num_inputs == 2  # the 3x4 table is a hidden input
    x = np.ones((3, 4), "float32")
    out = np.empty_like(x)
    kernel(x, out)
    np.testing.assert_array_equal(out, np.arange(12, dtype="float32").reshape(3, 4) + 0.5)


def test_named_dims_must_agree(kernels):
    x, y = np.ones((3, 4), "float32"), np.zeros((3, 4), "float32")
    out = np.empty_like(x)
    kernels["fused_symbolic"](x, y, out)
    np.testing.assert_array_equal(out, x)
    with pytest.raises(ShapeError, match="must be n"):
        kernels["fused_symbolic"](x, np.zeros((2, 4), "float32"), out)


def test_build_fused_kernel_returns_source_name_and_wrapper():
    x = Var("x", TensorType((Any(),), "int32"))
    source, name, wrapper = build_fused_kernel(_fn([x], op.negative(op.abs(x))))
    assert name == "fused_abs_negative" and f"int32_t {name}(" in source
    out = np.empty(4, "int32")
    wrapper(np.array([1, -2, 3, -4], "int32"), out)
    np.testing.assert_array_equal(out, [-1, -2, -3, -4])


def test_unsupported_functions_get_clear_errors(monkeypatch):
    x = Var("x", TensorType((3,)))
    with pytest.raises(UnsupportedError, match="If"):
        lower_primitive(_fn([x], If(const(True), x, x)), "k")
    monkeypatch.setattr(get_op("argsort"), "library", None)  # (an op with neither compute nor library call)
    with pytest.raises(UnsupportedError, match='target="python"'):
        lower_primitive(_fn([x], op.argsort(x)), "k")
    with pytest.raises(TypeInferenceError, match="no type"):
        lower_primitive(_fn([Var("y")], op.exp(Var("y"))), "k")
    with pytest.raises(UnsupportedError, match="free variable"):
        lower_primitive(_fn([x], op.add(x, Var("z", TensorType((3,))))), "k")
    y = Var("y", TensorType((4,)))
    with pytest.raises(TypeInferenceError, match="broadcast"):
        lower_primitive(_fn([x, y], op.add(x, y)), "k")
