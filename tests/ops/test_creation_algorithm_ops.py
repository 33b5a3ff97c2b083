"""Creation ops (tensorvm/op/creation.py), sorting/searching ops (tensorvm/op/algorithm.py), and the
registry-wide invariants of every op in part A."""

from __future__ import annotations

import bisect
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from op_testing import (
    ALL,
    FLOATS,
    NUMERIC,
    SIGNED,
    arrays_of,
    check_op,
    run_kernel,
    shapes,
    static_type,
    wrap_int,
)

from tensorvm.errors import AttrError, ShapeError, TypeInferenceError
from tensorvm.ir.types import Any, SymDim, TensorType, TupleType
from tensorvm.op import get_op, is_registered
from tensorvm.op.registry import REQUIRED, OpPattern

SETTINGS = settings(max_examples=25, deadline=None)


def cast_values(values, dtype):
    """Python numbers as an array of ``dtype``: integers wrap, floats round, anything to bool by truth."""
    kind = np.dtype(dtype).kind
    if kind in "iu":
        values = [wrap_int(math.trunc(v), dtype) for v in values]
        return np.array(values, dtype=object).astype(dtype)
    if kind == "b":
        return np.array([bool(v) for v in values], dtype=bool)
    return np.array([float(v) for v in values], dtype=np.float64).astype(dtype)


# ---- zeros, ones, full, *_like --------------------------------------------------------------------


@pytest.mark.parametrize("name, value", [("zeros", 0), ("ones", 1)])
@SETTINGS
@given(shape=shapes(), dtype=st.sampled_from(ALL))
def test_zeros_and_ones(name, value, shape, dtype):
    expected = cast_values([value] * math.prod(shape), dtype).reshape(shape)
    check_op(name, [], {"shape": list(shape), "dtype": dtype}, expected=expected)
    like = np.empty(shape, dtype)
    check_op(f"{name}_like", [like], expected=expected)


@SETTINGS
@given(shape=shapes(), fill_dtype=st.sampled_from(ALL), dtype=st.sampled_from((None,) + ALL), data=st.data())
def test_full_and_full_like(shape, fill_dtype, dtype, data):
    fill = data.draw(arrays_of(fill_dtype, (), 0, 100), "fill_value")
    out_dtype = dtype or fill_dtype
    expected = cast_values([fill.item()] * math.prod(shape), out_dtype).reshape(shape)
    attrs = {"shape": shape} if dtype is None else {"shape": shape, "dtype": dtype}
    check_op("full", [fill], attrs, expected=expected)
    check_op("full_like", [np.empty(shape, out_dtype), fill], expected=expected)


def test_creation_errors():
    with pytest.raises(AttrError, match="missing required attribute 'shape'"):
        get_op("zeros").normalize_attrs({})
    with pytest.raises(AttrError, match="dimensions must be >= 0"):
        get_op("ones").normalize_attrs({"shape": [2, -1]})
    with pytest.raises(AttrError, match="unknown dtype"):
        get_op("zeros").normalize_attrs({"shape": [2], "dtype": "float8"})
    with pytest.raises(TypeInferenceError, match="fill_value must be a scalar"):
        get_op("full").type_rel([TensorType((1,))], {"shape": [2]})
    with pytest.raises(TypeInferenceError, match="fill_value must be a scalar"):
        get_op("full_like").type_rel([TensorType((3,)), TensorType((Any(),))], {})
    with pytest.raises(ShapeError, match="fill_value must be a scalar"):
        run_kernel("full", [np.ones((2,), "float32")], {"shape": [2]})
    assert get_op("zeros").type_rel([], {"shape": 3}) == TensorType((3,), "float32")  # an int is a 1-D shape
    assert get_op("zeros_like").type_rel([TensorType((Any(), SymDim("n")), "int8")], {}) == TensorType(
        (Any(), SymDim("n")), "int8")


@pytest.mark.parametrize("name, value", [("dyn.zeros", 0), ("dyn.ones", 1)])
@SETTINGS
@given(shape=shapes(), shape_dtype=st.sampled_from(("int32", "int64", "uint8")), dtype=st.sampled_from(ALL))
def test_dyn_zeros_and_ones_take_the_shape_from_a_tensor(name, value, shape, shape_dtype, dtype):
    expected = cast_values([value] * math.prod(shape), dtype).reshape(shape)
    shape_tensor = np.array(shape, shape_dtype)
    check_op(name, [shape_tensor], {"dtype": dtype}, expected=expected, consts=True,
             relax=False)  # a constant shape gives the exact type; an unknown length gives no rank at all
    check_op(name, [shape_tensor], {"dtype": dtype}, expected=expected, dynamic=True, relax=False)
    assert get_op(name).type_rel([static_type(shape_tensor)], {"dtype": dtype}) == TensorType(
        (Any(),) * len(shape), dtype)


@SETTINGS
@given(shape=shapes(), fill_dtype=st.sampled_from(ALL), dtype=st.sampled_from((None,) + ALL), data=st.data())
def test_dyn_full(shape, fill_dtype, dtype, data):
    fill = data.draw(arrays_of(fill_dtype, (), 0, 100), "fill_value")
    expected = cast_values([fill.item()] * math.prod(shape), dtype or fill_dtype).reshape(shape)
    attrs = {} if dtype is None else {"dtype": dtype}
    shape_tensor = np.array(shape, "int64")
    check_op("dyn.full", [fill, shape_tensor], attrs, expected=expected, consts=True, relax=False)
    check_op("dyn.full", [fill, shape_tensor], attrs, expected=expected, dynamic=True, relax=False)


def test_dyn_creation_errors():
    zeros = get_op("dyn.zeros")
    with pytest.raises(TypeInferenceError, match="shape must have an integer dtype"):
        zeros.type_rel([TensorType((2,), "float32")], {})
    with pytest.raises(TypeInferenceError, match="1-D tensor of static length"):
        zeros.type_rel([TensorType((Any(),), "int32")], {})
    with pytest.raises(TypeInferenceError, match="1-D tensor of static length"):
        zeros.type_rel([TensorType((2, 2), "int32")], {})
    with pytest.raises(TypeInferenceError, match=r"shape values must be >= 0, got \[2, -1\]"):
        zeros.type_rel([TensorType((2,), "int32")], {}, [np.array([2, -1], "int32")])
    with pytest.raises(ShapeError, match="shape values must be >= 0"):
        zeros.shape_func({}, [np.array([-3], "int64")])
    with pytest.raises(ShapeError, match="shape values must be >= 0"):
        run_kernel("dyn.ones", [np.array([1, -1], "int32")])
    with pytest.raises(TypeInferenceError, match="fill_value must be a scalar"):
        get_op("dyn.full").type_rel([TensorType((1,)), TensorType((2,), "int32")], {})
    with pytest.raises(ShapeError, match="fill_value must be a scalar"):
        run_kernel("dyn.full", [np.ones(2, "float32"), np.array([2], "int32")])


# ---- arange ---------------------------------------------------------------------------------------


@SETTINGS
@given(start=st.integers(-20, 20), stop=st.integers(-20, 20), step=st.integers(-6, 6).filter(bool),
       arg_dtype=st.sampled_from(SIGNED), dtype=st.sampled_from(SIGNED + FLOATS))
def test_arange_of_integers_matches_range(start, stop, step, arg_dtype, dtype):
    args = [np.asarray(v, arg_dtype) for v in (start, stop, step)]
    expected = cast_values(list(range(start, stop, step)), dtype)
    check_op("arange", args, {"dtype": dtype}, expected=expected, consts=True)
    # without constant arguments the length is unknown until run time
    assert get_op("arange").type_rel([static_type(a) for a in args], {"dtype": dtype}) == TensorType(
        (Any(),), dtype)


@SETTINGS
@given(quarters=st.tuples(st.integers(-40, 40), st.integers(-40, 40), st.integers(-12, 12).filter(bool)),
       arg_dtype=st.sampled_from(FLOATS), dtype=st.sampled_from(FLOATS + ("int32",)))
def test_arange_of_floats_has_ceil_length(quarters, arg_dtype, dtype):
    start, stop, step = (Fraction(q, 4) for q in quarters)
    length = max(0, math.ceil((stop - start) / step))
    expected = cast_values([start + i * step for i in range(length)], dtype)
    args = [np.asarray(float(v), arg_dtype) for v in (start, stop, step)]
    check_op("arange", args, {"dtype": dtype}, expected=expected, consts=True)


def test_arange_by_hand_and_its_errors():
    f = np.float32
    assert run_kernel("arange", [f(0), f(1), f(0.3)]).tolist() == pytest.approx([0, 0.3, 0.6, 0.9])
    assert run_kernel("arange", [np.int64(2**62), np.int64(2**62 + 3), np.int64(1)], {"dtype": "int64"}).tolist() \
        == [2**62, 2**62 + 1, 2**62 + 2]
    arange = get_op("arange")
    assert arange.is_data_dependent and arange.pattern == OpPattern.OPAQUE
    zero_step = [np.int32(0), np.int32(5), np.int32(0)]
    with pytest.raises(ShapeError, match="step must not be zero"):
        arange.shape_func({}, zero_step)
    with pytest.raises(ShapeError, match="step must not be zero"):
        run_kernel("arange", zero_step)
    with pytest.raises(TypeInferenceError, match="step must not be zero"):
        arange.type_rel([TensorType((), "int32")] * 3, {}, zero_step)
    with pytest.raises(ShapeError, match="must be finite"):
        arange.shape_func({}, [f(0), f(np.inf), f(1)])
    with pytest.raises(ShapeError, match="stop must be a scalar"):
        arange.shape_func({}, [f(0), np.ones((2,), "float32"), f(1)])
    with pytest.raises(TypeInferenceError, match="step must be a scalar"):
        arange.type_rel([TensorType(()), TensorType(()), TensorType((1,))], {})
    with pytest.raises(TypeInferenceError, match="start must have a numeric"):
        arange.type_rel([TensorType((), "bool")] * 3, {})
    with pytest.raises(AttrError, match="numeric dtype"):
        arange.normalize_attrs({"dtype": "bool"})


# ---- argwhere -------------------------------------------------------------------------------------


@SETTINGS
@given(data=st.data())
def test_argwhere_lists_nonzero_coordinates_in_row_major_order(data):
    dtype = data.draw(st.sampled_from(("bool", "int8", "int32", "float32")), "dtype")
    x = data.draw(arrays_of(dtype, shapes(max_dims=5), -1, 1), "x")
    coordinates = [index for index in np.ndindex(x.shape) if x[index]]
    expected = np.array(coordinates, dtype="int32").reshape(len(coordinates), x.ndim)
    check_op("argwhere", [x], expected=expected, dynamic=True)
    assert get_op("argwhere").type_rel([TensorType((Any(), 3), dtype)], {}) == TensorType((Any(), 2), "int32")


# ---- sort, argsort, topk --------------------------------------------------------------------------


def python_order(row, ascending):
    """Stable order of a Python list (sorted(reverse=True) keeps equal elements in order too)."""
    return sorted(range(len(row)), key=lambda i: row[i], reverse=not ascending)


def along_axis(x, axis, row_fn, out_dtype):
    """Apply ``row_fn`` (list -> list) to each 1-D slice along ``axis``."""
    moved = np.moveaxis(x, axis, -1)
    rows = [row_fn([v.item() for v in moved[index]]) for index in np.ndindex(moved.shape[:-1])]
    # With no slices at all (an empty leading dim) a dummy row still tells the output width.
    width = len(rows[0]) if rows else len(row_fn([0] * moved.shape[-1]))
    out = cast_values([v for row in rows for v in row], out_dtype).reshape(moved.shape[:-1] + (width,))
    return np.moveaxis(out, -1, axis)


@st.composite
def sortable(draw, min_side=0):
    dtype = draw(st.sampled_from(ALL))
    x = draw(arrays_of(dtype, shapes(min_dims=1, min_side=min_side), -3, 3))  # ties are common
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    return x, axis


@SETTINGS
@given(case=sortable(), ascending=st.booleans(), index_dtype=st.sampled_from(("int32", "int64")))
def test_sort_and_argsort_are_stable(case, ascending, index_dtype):
    x, axis = case
    attrs = {"axis": axis, "is_ascend": ascending}
    order = along_axis(x, axis, lambda row: python_order(row, ascending), index_dtype)
    check_op("argsort", [x], {**attrs, "dtype": index_dtype}, expected=order)
    values = along_axis(x, axis, lambda row: [row[i] for i in python_order(row, ascending)], x.dtype.name)
    check_op("sort", [x], attrs, expected=values)


@SETTINGS
@given(case=sortable(min_side=1), data=st.data())
def test_topk(case, data):
    x, axis = case
    size = x.shape[axis]
    k = data.draw(st.integers(0, size), "k")  # k < 1 means the whole axis (Relay)
    ret_type = data.draw(st.sampled_from(("both", "values", "indices")), "ret_type")
    ascending = data.draw(st.booleans(), "is_ascend")
    index_dtype = data.draw(st.sampled_from(("int32", "int64")), "dtype")
    taken = k if k >= 1 else size

    def top_indices(row):
        return python_order(row, ascending)[:taken]

    indices = along_axis(x, axis, top_indices, index_dtype)
    values = along_axis(x, axis, lambda row: [row[i] for i in top_indices(row)], x.dtype.name)
    expected = {"both": (values, indices), "values": values, "indices": indices}[ret_type]
    attrs = {"axis": axis, "ret_type": ret_type, "is_ascend": ascending, "dtype": index_dtype}
    check_op("topk", [x], {**attrs, "k": k}, expected=expected)
    # k as a run-time argument: data-dependent unless the relation sees it as a constant
    k_arg = np.asarray(k, data.draw(st.sampled_from(("int32", "int64")), "k dtype"))
    check_op("topk", [x, k_arg], attrs, expected=expected, consts=True)
    check_op("topk", [x, k_arg], attrs, expected=expected, dynamic=True)
    dynamic = get_op("topk").type_rel([static_type(x), static_type(k_arg)], attrs)
    first = dynamic.fields[0] if isinstance(dynamic, TupleType) else dynamic
    assert isinstance(first.shape[axis], Any)


def test_sorting_by_hand_with_nan_and_errors():
    x = np.float32([2, np.nan, 1, 2])
    assert run_kernel("argsort", [x]).tolist() == [2, 0, 3, 1]  # NaN counts as the largest
    assert run_kernel("argsort", [x], {"is_ascend": False}).tolist() == [1, 0, 3, 2]
    values, indices = run_kernel("topk", [np.int32([[1, 5, 5, 3]])], {"k": 2})
    assert values.tolist() == [[5, 5]] and indices.tolist() == [[1, 2]]
    topk = get_op("topk")
    with pytest.raises(TypeInferenceError, match="k=5 exceeds the size 4 of axis 0"):
        topk.type_rel([TensorType((4,))], {"k": 5})
    with pytest.raises(ShapeError, match="k=5 exceeds the size 4"):
        topk.shape_func({"k": 5}, [(4,)])
    with pytest.raises(ShapeError, match="k=7 exceeds"):
        run_kernel("topk", [np.zeros((4,), "float32"), np.int32(7)])
    with pytest.raises(AttrError, match="both as an attribute and as an argument"):
        topk.type_rel([TensorType((4,)), TensorType((), "int32")], {"k": 2})
    with pytest.raises(TypeInferenceError, match="k must have an integer dtype"):
        topk.type_rel([TensorType((4,)), TensorType((), "float32")], {})
    with pytest.raises(AttrError, match="ret_type"):
        topk.normalize_attrs({"ret_type": "all"})
    with pytest.raises(AttrError, match="integer or float dtype"):  # (float indices are Relay's too)
        topk.normalize_attrs({"dtype": "bool"})
    with pytest.raises(TypeInferenceError, match="rank >= 1"):
        get_op("sort").type_rel([TensorType(())], {})
    with pytest.raises(TypeInferenceError, match="axis 2 is out of range"):
        get_op("argsort").type_rel([TensorType((3, 3))], {"axis": 2})
    assert topk.input_needs_data(1) and not topk.input_needs_data(0)
    # a symbolic axis keeps k; other dims flow through
    out = topk.type_rel([TensorType((SymDim("n"), Any()))], {"k": 3, "ret_type": "values"})
    assert out == TensorType((SymDim("n"), 3))


# ---- cumsum, cumprod ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
@SETTINGS
@given(data=st.data())
def test_scans_match_itertools_accumulate(name, data):
    dtype = data.draw(st.sampled_from(NUMERIC), "dtype")
    kind = np.dtype(dtype).kind
    if name == "cumprod" and kind == "f":
        values = st.sampled_from([-1.0, -0.5, 0.5, 1.0])  # powers of two: exact in every order
    elif kind == "f":
        values = st.integers(-16, 16).map(lambda n: n / 4)
    else:
        values = None
    x = data.draw(arrays_of(dtype, shapes(max_dims=3), values=values), "x")
    axis = data.draw(st.none() | st.integers(-x.ndim, x.ndim - 1) if x.ndim else st.none(), "axis")
    same_kind = [d for d in NUMERIC if np.dtype(d).kind == kind]
    out_dtype = data.draw(st.sampled_from([None] + same_kind), "dtype attr")
    exclusive = data.draw(st.booleans(), "exclusive")
    target = out_dtype or dtype
    operator = (lambda a, b: a + b) if name == "cumsum" else (lambda a, b: a * b)
    identity = 0 if name == "cumsum" else 1

    def scan(row):
        row = cast_values(row, target).tolist()  # accumulate in the output dtype, wrapping as we go
        if np.dtype(target).kind in "iu":
            running = list(itertools.accumulate(row, lambda a, b: wrap_int(operator(a, b), target)))
        else:
            running = list(itertools.accumulate(row, operator))
        return ([identity] + running[:-1]) if exclusive and running else running

    source = x.reshape(-1) if axis is None else x
    expected = along_axis(source, 0 if axis is None else axis, scan, target)
    attrs = {"axis": axis, "dtype": out_dtype, "exclusive": exclusive}
    check_op(name, [x], {k: v for k, v in attrs.items() if v is not None}, expected=expected)


def test_scan_errors_and_types():
    with pytest.raises(AttrError, match="cannot accumulate in bool"):
        get_op("cumsum").type_rel([TensorType((3,), "bool")], {})
    assert run_kernel("cumsum", [np.array([True, True, False])], {"dtype": "int32"}).tolist() == [1, 2, 2]
    assert get_op("cumsum").type_rel([TensorType((2, 3))], {}) == TensorType((6,))
    assert get_op("cumprod").type_rel([TensorType((2, Any()))], {}) == TensorType((Any(),))
    with pytest.raises(TypeInferenceError, match="axis 1 is out of range for rank 1"):
        get_op("cumsum").type_rel([TensorType((3,))], {"axis": 1})
    with pytest.raises(ShapeError, match="out of range"):
        run_kernel("cumprod", [np.ones((3,), "float32")], {"axis": -2})


# ---- unique, searchsorted -------------------------------------------------------------------------


@SETTINGS
@given(data=st.data(), is_sorted=st.booleans(), return_counts=st.booleans())
def test_unique(data, is_sorted, return_counts):
    dtype = data.draw(st.sampled_from(("int32", "uint8", "float32", "bool")), "dtype")
    x = data.draw(arrays_of(dtype, shapes(1, 1, 0, 12), -3, 3), "x")
    items = x.tolist()
    first = {}
    for i, v in enumerate(items):
        first.setdefault(v, i)
    keys = sorted(first) if is_sorted else list(first)  # dicts keep insertion (first-appearance) order
    expected = [cast_values(keys, dtype), np.array([first[k] for k in keys], "int32").reshape(-1),
                np.array([keys.index(v) for v in items], "int32").reshape(-1)]
    if return_counts:
        expected.append(np.array([items.count(k) for k in keys], "int32").reshape(-1))
    attrs = {"is_sorted": is_sorted, "return_counts": return_counts}
    result = check_op("unique", [x], attrs, expected=tuple(expected), dynamic=True)
    np.testing.assert_array_equal(result[0][result[2]], x)  # values[inverse] rebuilds the input
    # what the VM runs instead (Legalize): the same, given the stable ascending order
    order = np.argsort(x, kind="stable").astype(data.draw(st.sampled_from(("int64", "int32")), "order dtype"))
    check_op("sorted_unique", [x, order], attrs, expected=tuple(expected), dynamic=True)


def test_unique_errors():
    with pytest.raises(TypeInferenceError, match="must be 1-D"):
        get_op("unique").type_rel([TensorType((2, 2))], {})
    with pytest.raises(ShapeError, match="must be 1-D"):
        get_op("unique").shape_func({}, [np.zeros((2, 2))])
    assert get_op("unique").is_data_dependent
    rel = get_op("sorted_unique").type_rel
    for data, order in (((5,), (4,)), ((5,), (5, 1))):
        with pytest.raises(TypeInferenceError, match="order must be 1-D with data's length"):
            rel([TensorType(data), TensorType(order, "int64")], {})
    with pytest.raises(TypeInferenceError, match="must be 1-D"):
        rel([TensorType((5, 2)), TensorType((5,), "int64")], {})
    with pytest.raises(ShapeError, match="does not sort data ascending"):
        get_op("sorted_unique").shape_func({}, [np.array([2, 1]), np.array([0, 1])])


@SETTINGS
@given(data=st.data(), right=st.booleans(), index_dtype=st.sampled_from(("int32", "int64")))
def test_searchsorted_matches_bisect(data, right, index_dtype):
    dtype = data.draw(st.sampled_from(("int32", "float32", "uint8")), "dtype")
    batched = data.draw(st.booleans(), "batched")
    leading = data.draw(shapes(1, 2, 0, 3), "leading") if batched else ()
    width = data.draw(st.integers(0, 5), "sequence width")
    raw = data.draw(arrays_of(dtype, leading + (width,), -5, 5), "sequence")
    seq = np.sort(raw, axis=-1)
    values_shape = leading + (data.draw(st.integers(0, 4), "values width"),) if batched else data.draw(
        shapes(0, 3), "values shape")
    values = data.draw(arrays_of(dtype, values_shape, -6, 6), "values")
    search = bisect.bisect_right if right else bisect.bisect_left
    if batched:
        expected = np.zeros(values.shape, index_dtype)
        for index in np.ndindex(values.shape):
            expected[index] = search(seq[index[:-1]].tolist(), values[index].item())
    else:
        expected = np.array([search(seq.tolist(), v.item()) for v in values.reshape(-1)],
                            index_dtype).reshape(values.shape)
    check_op("searchsorted", [seq, values], {"right": right, "dtype": index_dtype}, expected=expected)


def test_searchsorted_errors():
    rel = get_op("searchsorted").type_rel
    with pytest.raises(TypeInferenceError, match="same leading dimensions"):
        rel([TensorType((2, 5)), TensorType((3, 4))], {})
    with pytest.raises(TypeInferenceError, match="one dtype"):
        rel([TensorType((5,)), TensorType((3,), "int32")], {})
    with pytest.raises(ShapeError, match="same leading dimensions"):
        run_kernel("searchsorted", [np.zeros((2, 5)), np.zeros((4,))])
    assert rel([TensorType((Any(), 5)), TensorType((2, Any()))], {}) == TensorType((2, Any()), "int32")


# ---- the registry ---------------------------------------------------------------------------------

PART_A_OPS = {
    "tensor": """add subtract multiply divide floor_divide mod floor_mod power maximum minimum negative exp log
        log2 log10 log1p sqrt rsqrt tanh sigmoid erf abs floor ceil round trunc sign sin cos tan asin acos atan
        sinh cosh asinh acosh atanh clip cast cast_like
        isnan isinf isfinite logical_and logical_or logical_not logical_xor bitwise_and bitwise_or bitwise_xor
        bitwise_not left_shift right_shift equal not_equal less less_equal greater greater_equal where""",
    "reduce": "sum mean max min prod all any logsumexp argmax argmin variance std",
    "creation": "zeros ones full dyn.zeros dyn.ones dyn.full zeros_like ones_like full_like arange",
    "algorithm": "argwhere topk sort argsort cumsum cumprod unique sorted_unique searchsorted",
}
ALL_PART_A = sorted(name for names in PART_A_OPS.values() for name in names.split())


@pytest.mark.parametrize("name", ALL_PART_A)
def test_every_op_is_complete(name):
    assert is_registered(name), name
    opdef = get_op(name)
    assert callable(opdef.kernel) and callable(opdef.type_rel) and callable(opdef.shape_func)
    assert isinstance(opdef.pattern, OpPattern)
    assert opdef.doc
    # attribute normalization is idempotent (kernels re-normalize what type inference normalized)
    if not any(a.default is REQUIRED for a in opdef.attrs):
        once = opdef.normalize_attrs({})
        assert opdef.normalize_attrs(once) == once
    # data-dependent shape functions are exactly the documented ones
    assert opdef.is_data_dependent == (name in {"arange", "argwhere", "unique", "sorted_unique", "topk", "dyn.zeros",
                                                "dyn.ones", "dyn.full"})
    if opdef.is_data_dependent:
        assert opdef.pattern == OpPattern.OPAQUE  # a fused group cannot compute their shapes



@pytest.mark.parametrize("name, shapes_in, attrs", [
    ("add", [(2, 1), (3,)], {}), ("where", [(2, 1), (1, 3), ()], {}), ("sum", [(2, 3)], {"axis": 0}),
    ("variance", [(2, 3), (2, 1)], {"axis": 1}), ("cumsum", [(2, 3)], {}), ("sort", [(4,)], {}),
    ("topk", [(2, 5)], {"k": 2}), ("searchsorted", [(2, 4), (2, 3)], {}), ("exp", [()], {}),
])
def test_shape_functions_accept_shapes_as_int64_arrays(name, shapes_in, attrs):
    """The VM hands shape functions int64 shape tensors; they must give the same answer as tuples."""
    opdef = get_op(name)
    as_tuples = opdef.shape_func(attrs, [tuple(s) for s in shapes_in])
    as_arrays = opdef.shape_func(attrs, [np.array(s, dtype="int64") for s in shapes_in])
    assert as_arrays == as_tuples
    assert all(type(d) is int for shape in as_arrays for d in shape)
