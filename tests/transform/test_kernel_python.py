"""tensorvm.vm.kernel_python: DPS kernels and composed shape functions of primitive functions,
checked against NumPy written here."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lowered_eval import parse

from tensorvm.errors import ShapeError, UnsupportedError
from tensorvm.ir.expr import GlobalVar
from tensorvm.transform.infer_type import InferType
from tensorvm.vm.kernel_python import build_kernel, build_shape_func


def primitive(text: str, name: str = "prim"):
    mod = InferType()(parse(text))
    return mod[GlobalVar(name)]


ADD = primitive("""
def @prim(%p0: Tensor[(?, ?), float32], %p1: Tensor[(1, 2), float32], Primitive=1) -> Tensor[(?, 2), float32] {
  add(%p0, %p1)
}""")


def test_single_ufunc_op_writes_straight_into_the_output():
    kernel = build_kernel(ADD)
    assert "out=o0" in kernel.__source__
    x, y = np.arange(6, dtype="float32").reshape(3, 2), np.array([[10, 20]], "float32")
    out = np.empty((3, 2), "float32")
    assert kernel(x, y, out) is None
    np.testing.assert_array_equal(out, x + y)


def test_fused_group_matches_numpy():
    prim = primitive("""
def @prim(%p0: Tensor[(?, 3), float32], %p1: Tensor[(4, 3), float32], %p2: Tensor[(4), float32],
          Primitive=1) -> Tensor[(?, 4), float32] {
  %0 = nn.dense(%p0, %p1);
  %1 = nn.bias_add(%0, %p2);
  %2 = nn.relu(%1);
  multiply(%2, 0.5f)
}""")
    kernel = build_kernel(prim)
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((5, 3)), rng.standard_normal((4, 3)), rng.standard_normal(4)
    x, w, b = (a.astype("float32") for a in (x, w, b))
    out = np.full((5, 4), np.nan, "float32")
    kernel(x, w, b, out)
    np.testing.assert_allclose(out, np.maximum(x @ w.T + b, 0) * 0.5, rtol=1e-5, atol=1e-6)


def test_tuple_inputs_and_outputs_are_flattened():
    prim = primitive("""
def @prim(%p0: (Tensor[(?, 2), float32], Tensor[(?, 2), float32]), Primitive=1)
    -> (Tensor[(?, 1), float32], Tensor[(?, 1), float32]) {
  %0 = concatenate(%p0, axis=0);
  split(%0, indices_or_sections=2, axis=1)
}""")
    a, b = np.arange(4, dtype="float32").reshape(2, 2), np.arange(10, 16, dtype="float32").reshape(3, 2)
    shape_func = build_shape_func(prim, (0,))
    s0, s1 = np.zeros(2, "int64"), np.zeros(2, "int64")
    shape_func(np.array(a.shape, "int64"), np.array(b.shape, "int64"), s0, s1)
    assert s0.tolist() == [5, 1] and s1.tolist() == [5, 1]
    o0, o1 = np.empty((5, 1), "float32"), np.empty((5, 1), "float32")
    build_kernel(prim)(a, b, o0, o1)
    both = np.concatenate([a, b])
    np.testing.assert_array_equal(o0, both[:, :1])
    np.testing.assert_array_equal(o1, both[:, 1:])


def test_wrong_output_buffer_is_a_clear_error():
    copying = primitive("""
def @prim(%p0: Tensor[(?), float32], Primitive=1) -> Tensor[(?), float32] {
  %0 = exp(%p0);
  sigmoid(%0)
}""")
    with pytest.raises(ShapeError, match="produced shape"):
        build_kernel(copying)(np.ones(3, "float32"), np.empty(4, "float32"))
    direct = primitive("""
def @prim(%p0: Tensor[(?), float32], Primitive=1) -> Tensor[(?), float32] {
  %0 = exp(%p0);
  negative(%0)
}""")
    with pytest.raises(ShapeError, match="negative"):
        build_kernel(direct)(np.ones(3, "float32"), np.empty(4, "float32"))


def test_shape_function_composes_and_reports_the_failing_op():
    shape_func = build_shape_func(ADD, (0, 0))
    out = np.zeros(2, "int64")
    shape_func(np.array([4, 1], "int64"), np.array([1, 2], "int64"), out)
    assert out.tolist() == [4, 2]
    with pytest.raises(ShapeError, match="add"):
        shape_func(np.array([4, 3], "int64"), np.array([1, 2], "int64"), out)


def test_shape_function_checks_the_optimistic_type():
    # (?) + (3) is typed (3): a run-time (1) broadcasts fine, a run-time (2) cannot.
    prim = primitive("""
def @prim(%p0: Tensor[(?), float32], %p1: Tensor[(3), float32], Primitive=1) -> Tensor[(3), float32] {
  %0 = add(%p0, %p1);
  %1 = exp(%p0);
  %2 = add(%1, %0);
  multiply(%2, %p0)
}""".replace("-> Tensor[(3), float32]", "-> Tensor[(?), float32]"))
    shape_func = build_shape_func(prim, (0, 0))
    out = np.zeros(1, "int64")
    shape_func(np.array([1], "int64"), np.array([3], "int64"), out)
    assert out.tolist() == [3]
    with pytest.raises(ShapeError):
        shape_func(np.array([2], "int64"), np.array([3], "int64"), out)


def test_data_dependent_shape_function_reads_data():
    prim = primitive("""
def @prim(%p0: float32, %p1: float32, Primitive=1) -> Tensor[(?), float32] {
  arange(%p0, %p1, 0.5f)
}""")
    shape_func = build_shape_func(prim, (1, 1))
    out = np.zeros(1, "int64")
    shape_func(np.array(1.0, "float32"), np.array(3.2, "float32"), out)
    assert out.tolist() == [len(np.arange(1.0, 3.2, 0.5))]
    with pytest.raises(UnsupportedError, match="data"):
        build_shape_func(prim, (0, 0))(np.zeros(0, "int64"), np.zeros(0, "int64"), out)


def test_static_ops_inside_a_dynamic_group_use_their_types():
    prim = primitive("""
def @prim(%p0: Tensor[(?, 4), float32], %p1: Tensor[(2, 2), float32], Primitive=1) -> Tensor[(?, 4), float32] {
  %0 = reshape(%p1, newshape=[4]);
  add(%p0, %0)
}""")
    out = np.zeros(2, "int64")
    build_shape_func(prim, (0, 0))(np.array([7, 4], "int64"), np.array([2, 2], "int64"), out)
    assert out.tolist() == [7, 4]


def test_kernels_rebuilt_from_text_are_typed_on_demand():
    mod = parse("""
def @prim(%p0: Tensor[(?), float32], Primitive=1) -> Tensor[(?), float32] {
  %0 = exp(%p0);
  add(%0, 1f)
}""")
    prim = mod[GlobalVar("prim")]  # no InferType: as an executable loader would parse it
    out = np.empty(2, "float32")
    build_kernel(prim)(np.array([0.0, 1.0], "float32"), out)
    np.testing.assert_allclose(out, np.exp([0.0, 1.0]) + 1, rtol=1e-6)
    shape = np.zeros(1, "int64")
    build_shape_func(prim, (0,))(np.array([5], "int64"), shape)
    assert shape.tolist() == [5]


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["add", "subtract", "multiply", "maximum", "less", "equal"]),
       st.sampled_from(["float32", "float64", "int32", "int64"]),
       st.tuples(st.integers(1, 3), st.integers(1, 3)), st.booleans())
def test_ufunc_kernels_equal_the_reference_kernels(op, dtype, shape, broadcast):
    out_dtype = "bool" if op in ("less", "equal") else dtype
    prim = primitive(f"""
def @prim(%p0: Tensor[(?, ?), {dtype}], %p1: Tensor[(?, ?), {dtype}], Primitive=1) -> Tensor[(?, ?), {out_dtype}] {{
  {op}(%p0, %p1)
}}""")
    rng = np.random.default_rng(sum(shape))
    a = (rng.standard_normal(shape) * 5).astype(dtype)
    b = (rng.standard_normal((1, shape[1]) if broadcast else shape) * 5).astype(dtype)
    out = np.empty(shape, out_dtype)
    build_kernel(prim)(a, b, out)
    expected = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
                "less": np.less, "equal": np.equal}[op](a, b)
    np.testing.assert_array_equal(out, expected.astype(out_dtype))
