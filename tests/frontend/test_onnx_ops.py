"""The ops added for the ONNX importer (``tensorvm/op/onnx_ops.py``, and the run-time-valued ``dyn.*`` ops of
``tensorvm/op/dynamic.py`` that its converters lower to): each op's type relation (with
constant arguments: the exact static type), shape function and kernel agree with each other and with
NumPy or ONNX's reference evaluator; bad input is a clear error."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorvm as tv
from tensorvm.errors import ShapeError, TypeInferenceError
from tensorvm.ir.types import Any, TensorType
from tensorvm.op import get_op, onnx_ops  # noqa: F401 - registers the ops


def check(op_name, arrays, attrs=None, const_args=None):
    """Run the kernel; check the relation (constants where given) and shape function against its result."""
    opdef = get_op(op_name)
    attrs = opdef.normalize_attrs(attrs or {})
    out = opdef.kernel(attrs, *arrays)
    outs = out if isinstance(out, tuple) else (out,)
    types = [TensorType(a.shape, a.dtype.name) if not isinstance(a, tuple) else
             tv.TupleType(tuple(TensorType(x.shape, x.dtype.name) for x in a)) for a in arrays]
    consts = [a if const_args and i in const_args else None for i, a in enumerate(arrays)]
    rel = opdef.type_rel(types, attrs, consts)
    rel_fields = rel.fields if isinstance(rel, tv.TupleType) else (rel,)
    assert len(rel_fields) == len(outs)
    for ty, o in zip(rel_fields, outs, strict=True):
        assert ty.dtype == np.asarray(o).dtype.name
        assert len(ty.shape) == np.ndim(o)
        for d, n in zip(ty.shape, np.shape(o), strict=True):
            assert isinstance(d, Any) or d == n or not isinstance(d, int)
    if opdef.shape_func is not None:
        args = [a if opdef.input_needs_data(i) else (a.shape if not isinstance(a, tuple) else [x.shape for x in a])
                for i, a in enumerate(arrays)]
        assert [tuple(s) for s in opdef.shape_func(attrs, args)] == [np.shape(o) for o in outs]
    return outs


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=3), st.data())
def test_dyn_slice_matches_python_slicing(shape, data):
    x = np.arange(int(np.prod(shape)), dtype="float32").reshape(shape)
    axis = data.draw(st.integers(0, len(shape) - 1))
    start = data.draw(st.integers(-8, 8))
    end = data.draw(st.sampled_from([-9, -1, 0, 2, 7, 2**62, -(2**62)]))
    step = data.draw(st.sampled_from([-3, -1, 1, 2]))
    i64 = lambda v: np.array(v, np.int64)  # noqa: E731
    # dyn.strided_slice on the listed axes: what ONNX Slice with run-time bounds lowers to.
    (out,) = check("dyn.strided_slice", [x, i64([start]), i64([end]), i64([step])], {"axes": (axis,)},
                   const_args={1, 2, 3})
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, end, step)
    np.testing.assert_array_equal(out, x[tuple(index)])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.data(),
       st.sampled_from(["constant", "edge", "reflect", "wrap"]))
def test_dyn_pad_matches_numpy(shape, data, mode):
    x = np.arange(int(np.prod(shape)), dtype="float32").reshape(shape) + 1
    low = -1 if mode == "constant" else 0
    pads = [data.draw(st.integers(low, 2)) for _ in range(2 * len(shape))]
    if mode == "reflect":
        pads = [min(p, d - 1) for p, d in zip(pads, list(shape) * 2, strict=True)]
    n = len(shape)
    for i in range(n):  # cropping the whole axis away is an error (tested below), not a pad
        if shape[i] + min(pads[i], 0) + min(pads[i + n], 0) < 1:
            pads[i + n] = 0
    (out,) = check("dyn.pad", [x, np.array(pads, np.int64), np.array(7, "float32"), np.zeros(0, np.int64)],
                   {"mode": mode}, const_args={1, 3})
    crop = tuple(slice(max(-pads[i], 0), shape[i] - max(-pads[i + n], 0)) for i in range(n))
    widths = [(max(pads[i], 0), max(pads[i + n], 0)) for i in range(n)]
    kwargs = {"constant_values": 7} if mode == "constant" else {}
    np.testing.assert_array_equal(out, np.pad(x[crop], widths, mode=mode, **kwargs))


def test_dyn_pad_cropping_a_whole_axis_is_a_shape_error():
    with pytest.raises(ShapeError, match="crop more than"):
        get_op("dyn.pad").kernel(get_op("dyn.pad").normalize_attrs({}), np.ones(1, "float32"),
                                  np.array([-1, -1], np.int64), np.array(0, "float32"), np.zeros(0, np.int64))


def test_dyn_pad_cropping_more_than_an_axis_is_an_error_even_when_the_other_side_pads():
    """Crops come first: a crop of 1 from an empty axis is an error, not a net size of 0 - 1 + 2 (the NumPy
    kernel padded what was left, 2, while the shape function said 1)."""
    op = get_op("dyn.pad")
    args = (np.ones((0,), "float32"), np.array([-1, 2], np.int64), np.array(0, "float32"), np.zeros(0, np.int64))
    with pytest.raises(ShapeError, match="crop more than"):
        op.kernel(op.normalize_attrs({}), *args)
    with pytest.raises(ShapeError, match="crop more than"):
        op.shape_func(op.normalize_attrs({}), [(0,), args[1], (), args[3]])


def test_unsqueeze_and_split_with_run_time_values():
    x = np.arange(6, dtype="int32").reshape(2, 3)
    (un,) = check("dyn.unsqueeze", [x, np.array([0, -1], np.int64)], const_args={1})
    assert un.shape == (1, 2, 3, 1)
    parts = check("dyn.split", [np.arange(7), np.array([2, 5], np.int64)], {"num_outputs": 2, "axis": 0})
    assert [p.tolist() for p in parts] == [[0, 1], [2, 3, 4, 5, 6]]
    equal = check("dyn.split", [np.arange(7), np.zeros(0, np.int64)], {"num_outputs": 3})
    assert [len(p) for p in equal] == [3, 3, 1]
    opdef = get_op("dyn.split")
    with pytest.raises(ShapeError, match="add up to the axis size 7"):
        opdef.kernel(opdef.normalize_attrs({"num_outputs": 2}), np.arange(7), np.array([2, 2], np.int64))
    with pytest.raises(ShapeError, match="repeated"):
        get_op("dyn.unsqueeze").kernel(get_op("dyn.unsqueeze").normalize_attrs({}), x, np.array([0, 0], np.int64))


@pytest.mark.parametrize("mode", ["sum", "mean", "max", "min", "prod"])
def test_dyn_reduce_over_run_time_axes(mode):
    x = np.random.default_rng(0).uniform(0.5, 2, (2, 3, 4)).astype("float32")
    (out,) = check("dyn.reduce", [x, np.array([0, -1], np.int64)], {"mode": mode})
    expected = getattr(np, mode)(x, axis=(0, 2), keepdims=True)
    np.testing.assert_allclose(out, expected, rtol=1e-5)
    (empty,) = check("dyn.reduce", [np.zeros((0, 3), "float32"), np.array([0], np.int64)], {"mode": "max"})
    assert empty.shape == (1, 3) and np.all(np.isneginf(empty))


def test_trilu_cumsum_matmul_einsum():
    x = np.arange(12, dtype="float32").reshape(3, 4)
    (up,) = check("trilu", [x, np.array(1, np.int64)], {"upper": True})
    np.testing.assert_array_equal(up, np.triu(x, 1))
    (cs,) = check("dyn.cumsum", [x, np.array(1, np.int32)], {"exclusive": True, "reverse": True})
    np.testing.assert_array_equal(cs, np.flip(np.cumsum(np.flip(x, 1), 1), 1) - x)
    a = np.random.default_rng(1).standard_normal((2, 1, 3, 4)).astype("float32")
    b = np.random.default_rng(2).standard_normal((5, 4, 2)).astype("float32")
    (mm,) = check("onnx.matmul", [a, b])
    np.testing.assert_allclose(mm, np.matmul(a, b), rtol=1e-5)
    (es,) = check("einsum", [(a[0, 0], b[0])], {"equation": "ij,jk"})
    np.testing.assert_allclose(es, a[0, 0] @ b[0], rtol=1e-5)
    with pytest.raises(TypeInferenceError, match="inner dims"):
        get_op("onnx.matmul").type_rel([TensorType((2, 3), "float32"), TensorType((4, 2), "float32")], {})


def _onnx_reference(op_type, inputs, **attrs):
    onnx = pytest.importorskip("onnx")
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op_type, names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(
        a.dtype), a.shape) for n, a in zip(names, inputs, strict=True)], [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    return ReferenceEvaluator(model).run(None, dict(zip(names, inputs, strict=True)))[0]


@pytest.mark.parametrize("spatial", [(7,), (5, 6), (4, 5, 3)])
def test_conv_nd_and_pool_nd_match_the_reference(spatial):
    rng = np.random.default_rng(len(spatial))
    x = rng.standard_normal((2, 4) + spatial).astype("float32")
    w = rng.standard_normal((6, 2) + (2,) * len(spatial)).astype("float32")
    pads = [1] * len(spatial) + [0] * len(spatial)
    (conv,) = check("nn.conv_nd", [x, w], {"group": 2, "pads": pads, "strides": [2] * len(spatial)})
    np.testing.assert_allclose(conv, _onnx_reference("Conv", [x, w], group=2, pads=pads, strides=[2] * len(spatial)),
                               rtol=1e-4, atol=1e-5)
    kernel, strides, sym = [3] * len(spatial), [2] * len(spatial), [1] * (2 * len(spatial))
    for op_type, mode in [("MaxPool", "max"), ("AveragePool", "avg")]:
        attrs = {"kernel_shape": kernel, "ceil_mode": True, "pads": sym, "strides": strides}
        (pooled,) = check("nn.pool_nd", [x], {"mode": mode, **attrs})
        np.testing.assert_allclose(pooled, _onnx_reference(op_type, [x], **attrs), rtol=1e-5)
    wt = rng.standard_normal((4, 3) + (3,) * len(spatial)).astype("float32")
    (convt,) = check("nn.conv_transpose_nd", [x, wt], {"strides": [2] * len(spatial)})
    np.testing.assert_allclose(convt, _onnx_reference("ConvTranspose", [x, wt], strides=[2] * len(spatial)),
                               rtol=1e-4, atol=1e-5)


def test_resize_static_type_from_constant_scales():
    x = np.arange(16, dtype="float32").reshape(1, 1, 4, 4)
    scales = np.array([1, 1, 0.5, 2], "float32")
    (out,) = check("image.resize", [x, np.zeros(0, "float32"), scales, np.zeros(0, np.int64)],
                   {"mode": "linear"}, const_args={2, 3})
    assert out.shape == (1, 1, 2, 8)
    np.testing.assert_allclose(out, _onnx_reference("Resize", [x, np.zeros(0, "float32"), scales], mode="linear"),
                               rtol=1e-5)


def test_nms_shapes_come_from_the_data():
    boxes = np.array([[[0, 0, 1, 1], [0, 0, 1, 1.05], [5, 5, 6, 6]]], "float32")
    scores = np.array([[[0.9, 0.8, 0.7]]], "float32")
    selected, count = check("vision.all_class_non_max_suppression",
                            [boxes, scores, np.array([5]), np.array([0.5], "float32"), np.array(-np.inf, "float32")])
    assert count.tolist() == [2] and selected.tolist() == [[0, 0, 0], [0, 0, 2], [0, 0, 0]]
