"""Data-movement ops (tensorvm/op/transform.py): kernels against element-by-element oracles written
here, type relations and shape functions against the kernels' results, Any/SymDim flow, and errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from op_testing import arrays_of, assert_compatible, check_op, shapes, static_type

from tensorvm.errors import AttrError, ExecutionError, ShapeError, TypeInferenceError
from tensorvm.ir.types import Any, SymDim, TensorType, TupleType
from tensorvm.op import OpPattern, get_op
from tensorvm.op.transform import RESHAPE_ONLY_OPS

SETTINGS = settings(max_examples=25, deadline=None)
ANY = Any()
N = SymDim("n")


def rel(name, types, consts=None, **attrs):
    opdef = get_op(name)
    return opdef.type_rel(types, opdef.normalize_attrs(attrs), consts)


def tt(*shape, dtype="float32"):
    return TensorType(shape, dtype)


def iota(shape, dtype="float32"):
    return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)


def check_tuple_input_op(name, fields, attrs, expected):
    """check_op for ops whose single argument is a tuple of tensors (concatenate, stack)."""
    opdef = get_op(name)
    fields = tuple(np.asarray(f) for f in fields)
    out = np.asarray(opdef.kernel(attrs, fields))
    np.testing.assert_array_equal(out, expected)
    assert out.dtype == expected.dtype
    ty = opdef.type_rel([static_type(fields)], attrs, None)
    assert ty == static_type(out)
    assert [tuple(s) for s in opdef.shape_func(attrs, [[f.shape for f in fields]])] == [out.shape]
    relaxed = TupleType(tuple(TensorType((ANY,) * f.ndim, f.dtype.name) for f in fields))
    assert_compatible(opdef.type_rel([relaxed], attrs, None), ty, name)
    return out


# ---- registry facts ---------------------------------------------------------------------------------


def test_patterns_and_reshape_only_set():
    assert {"reshape", "squeeze", "expand_dims", "nn.batch_flatten", "reshape_like"} <= RESHAPE_ONLY_OPS
    expected = {
        "reshape": OpPattern.INJECTIVE, "transpose": OpPattern.INJECTIVE, "concatenate": OpPattern.INJECTIVE,
        "split": OpPattern.INJECTIVE, "take": OpPattern.INJECTIVE, "strided_slice": OpPattern.INJECTIVE,
        "expand_dims": OpPattern.BROADCAST, "broadcast_to": OpPattern.BROADCAST, "copy": OpPattern.ELEMWISE,
        "shape_of": OpPattern.OPAQUE, "scatter_nd": OpPattern.OPAQUE, "one_hot": OpPattern.OUT_ELEMWISE_FUSABLE,
    }
    for name, pattern in expected.items():
        assert get_op(name).pattern == pattern, name
    assert get_op("dyn.reshape").shape_func_data_dependent == (False, True)
    assert get_op("dyn.strided_slice").shape_func_data_dependent == (False, True, True, True)
    assert not get_op("reshape").is_data_dependent and not get_op("shape_of").is_data_dependent


# ---- reshape family ----------------------------------------------------------------------------------


@st.composite
def reshape_cases(draw):
    """An input shape and a newshape written with special values, built together with the shape it
    must produce (so the oracle never runs the special-value rules)."""
    shape = draw(shapes(1, 4, 1, 4))
    newshape, expected, i = [], [], 0
    while i < len(shape):
        actions = ["copy", "explicit", "rest"] + (["merge"] if i + 1 < len(shape) else [])
        actions += ["split"] if shape[i] in (2, 4) else []
        action = draw(st.sampled_from(actions))
        if action == "copy":
            newshape.append(0), expected.append(shape[i])
        elif action == "explicit":
            newshape.append(shape[i]), expected.append(shape[i])
        elif action == "rest":
            newshape.append(-2), expected.extend(shape[i:])
            break
        elif action == "merge":
            newshape.append(-3), expected.append(shape[i] * shape[i + 1])
            i += 1
        else:
            first = draw(st.sampled_from([d for d in (1, 2) if shape[i] % d == 0]))
            second = shape[i] // first
            written = draw(st.sampled_from([(first, second), (-1, second), (first, -1)]))
            newshape += [-4, *written]
            expected += [first, second]
        i += 1
    explicit = [k for k, v in enumerate(newshape) if v > 0 and (k == 0 or newshape[k - 1] != -4)
                and not (k >= 2 and newshape[k - 2] == -4)]
    if explicit and draw(st.booleans()):
        newshape[draw(st.sampled_from(explicit))] = -1
    return shape, tuple(newshape), tuple(expected)


@SETTINGS
@given(reshape_cases())
def test_reshape_special_values(case):
    shape, newshape, expected_shape = case
    x = iota(shape)
    check_op("reshape", [x], {"newshape": newshape}, np.arange(x.size, dtype="float32").reshape(expected_shape))


def test_reshape_examples_and_allowzero():
    x = iota((2, 3, 4))
    for newshape, expected in [((6, 1, -1), (6, 1, 4)), ((-1,), (24,)), ((0, -2), (2, 3, 4)),
                               ((-4, 1, 2, 0, -1), (1, 2, 3, 4)), ((-3, 0), (6, 4)), ((2, -4, -1, 3, 4), (2, 1, 3, 4))]:
        assert check_op("reshape", [x], {"newshape": newshape}).shape == expected
    zero = np.zeros((0, 3), "float32")
    assert check_op("reshape", [zero], {"newshape": (3, 0), "allowzero": True}).shape == (3, 0)
    assert check_op("reshape", [zero], {"newshape": (0, 3)}).shape == (0, 3)  # 0 copies the input's 0


def test_reshape_symbolic_and_any_dims():
    assert rel("reshape", [tt(N, 3, 4)], newshape=(-1, 12)).shape == (N, 12)
    assert rel("reshape", [tt(N, 3, 4)], newshape=(0, -1)).shape == (N, 12)
    assert rel("reshape", [tt(N, 3, 4)], newshape=(-3, 4)).shape[1] == 4
    assert rel("reshape", [tt(ANY, 6)], newshape=(-1, 2, 3)).shape == (ANY, 2, 3)
    assert rel("reshape", [tt(2, N)], newshape=(-2,)).shape == (2, N)


def test_reshape_errors():
    x = tt(2, 3)
    for newshape in [(4, 2), (-1, -1), (5, -1), (0, 0, 0), (-4, 4, -1), (-4, 2), (-3, -3)]:
        with pytest.raises(TypeInferenceError):
            rel("reshape", [x], newshape=newshape)
    with pytest.raises(ShapeError, match="reshape"):
        get_op("reshape").shape_func({"newshape": (4, 2)}, [(2, 3)])
    with pytest.raises(ShapeError):
        get_op("reshape").kernel({"newshape": (7,)}, np.zeros((2, 3)))
    for bad in [{"newshape": "x"}, {"newshape": (1.5,)}, {"newshape": (-5,)}, {}, {"newshape": (2,), "bogus": 1}]:
        with pytest.raises(AttrError):
            get_op("reshape").normalize_attrs(bad)


def test_dyn_reshape():
    x = iota((2, 3, 4))
    out = check_op("dyn.reshape", [x, np.array([0, -1], "int64")], expected=x.reshape(2, 12), consts=True,
                   relax=False)
    assert out.shape == (2, 12)
    assert rel("dyn.reshape", [tt(2, 3, 4), tt(3, dtype="int64")]).shape == (ANY, ANY, ANY)
    assert rel("dyn.reshape", [tt(2, 3, 4), tt(2, dtype="int32")], [None, np.array([4, -1])]).shape == (4, 6)
    with pytest.raises(TypeInferenceError, match="static"):
        rel("dyn.reshape", [tt(2, 3), tt(ANY, dtype="int64")])
    with pytest.raises(TypeInferenceError, match="integer"):
        rel("dyn.reshape", [tt(2, 3), tt(2)])
    with pytest.raises(ShapeError):
        get_op("dyn.reshape").shape_func({}, [(2, 3), np.array([4, 2])])
    # reshape's -2/-3/-4 where they keep the rank at the length of newshape (Relay's typing)
    assert get_op("dyn.reshape").shape_func({}, [(2, 3), np.array([-3])]) == [(6,)]
    with pytest.raises(ShapeError, match="rank"):
        get_op("dyn.reshape").shape_func({}, [(2, 3), np.array([-2])])
    with pytest.raises(ShapeError, match="invalid value -5"):
        get_op("dyn.reshape").shape_func({}, [(2, 3), np.array([-5, 1])])


def test_reshape_like():
    x, like = iota((2, 3, 4)), np.zeros((6, 4), "int8")
    check_op("reshape_like", [x, like], expected=np.arange(24, dtype="float32").reshape(6, 4))
    check_op("reshape_like", [x, np.zeros((5, 4, 3))], {"lhs_begin": 1, "rhs_begin": 1}, x.reshape(2, 4, 3))
    check_op("reshape_like", [x, np.zeros((6, 9))], {"lhs_end": 2, "rhs_end": -1}, x.reshape(6, 4))
    assert rel("reshape_like", [tt(N, 3, 4), tt(ANY, 12)], lhs_begin=1, rhs_begin=1).shape == (N, 12)
    with pytest.raises(TypeInferenceError):
        rel("reshape_like", [tt(2, 3), tt(7)])


# ---- transpose, expand_dims, squeeze --------------------------------------------------------------------


def loop_oracle(out_shape, source, dtype):
    """out[idx] = source(idx) for every index (an element-by-element oracle)."""
    out = np.empty(out_shape, dtype=dtype)
    for idx in np.ndindex(out_shape):
        out[idx] = source(idx)
    return out


@SETTINGS
@given(shapes(0, 4, 0, 3), st.data())
def test_transpose(shape, data):
    x = data.draw(arrays_of("int16", shape))
    perm = data.draw(st.permutations(range(len(shape))))
    axes = [a - len(shape) if data.draw(st.booleans()) else a for a in perm]
    expected = loop_oracle(tuple(shape[a] for a in perm), lambda idx: x[tuple(idx[perm.index(d)] for d in range(len(shape)))],
                           "int16")
    check_op("transpose", [x], {"axes": axes}, expected)
    reversed_axes = loop_oracle(tuple(reversed(shape)), lambda idx: x[tuple(reversed(idx))], "int16")
    check_op("transpose", [x], {}, reversed_axes)


def test_transpose_errors_and_symbols():
    assert rel("transpose", [tt(N, 3, ANY)], axes=(2, 0, 1)).shape == (ANY, N, 3)
    for axes in [(0, 0, 1), (0, 1), (0, 1, 3)]:
        with pytest.raises(TypeInferenceError):
            rel("transpose", [tt(1, 2, 3)], axes=axes)


@SETTINGS
@given(shapes(0, 3, 0, 3), st.data())
def test_expand_dims(shape, data):
    x = data.draw(arrays_of("float32", shape))
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    count = data.draw(st.integers(0, 2))
    position = axis % (len(shape) + 1)
    expected_shape = shape[:position] + (1,) * count + shape[position:]
    expected = loop_oracle(expected_shape, lambda idx: x[idx[:position] + idx[position + count:]], "float32")
    check_op("expand_dims", [x], {"axis": axis, "num_newaxis": count}, expected)


@SETTINGS
@given(st.lists(st.sampled_from([1, 1, 2, 3]), min_size=0, max_size=4), st.data())
def test_squeeze(dims, data):
    x = data.draw(arrays_of("int32", tuple(dims)))
    ones = [i for i, d in enumerate(dims) if d == 1]
    expected_all = x.reshape(tuple(d for d in dims if d != 1))
    check_op("squeeze", [x], {}, expected_all, relax=False)
    chosen = data.draw(st.lists(st.sampled_from(ones), unique=True)) if ones else []
    kept = tuple(d for i, d in enumerate(dims) if i not in chosen)
    check_op("squeeze", [x], {"axis": [c - len(dims) for c in chosen]}, x.reshape(kept))


def test_squeeze_dynamic_and_errors():
    assert rel("squeeze", [tt(N, 1, ANY)], axis=(1,)).shape == (N, ANY)
    assert rel("squeeze", [tt(N, ANY)], axis=(1,)).shape == (N,)  # ? must be 1 at run time
    with pytest.raises(TypeInferenceError, match="static"):
        rel("squeeze", [tt(N, 1)])
    with pytest.raises(TypeInferenceError, match="must match"):
        rel("squeeze", [tt(2, 3)], axis=(0,))
    with pytest.raises(ShapeError):
        get_op("squeeze").shape_func({"axis": (1,)}, [(2, 3)])


# ---- concatenate, stack, split -------------------------------------------------------------------------


@SETTINGS
@given(shapes(1, 3, 0, 3), st.data())
def test_concatenate(base, data):
    axis = data.draw(st.integers(-len(base), len(base) - 1))
    count = data.draw(st.integers(1, 3))
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=count, max_size=count))
    ax = axis % len(base)
    fields = [data.draw(arrays_of("float64", base[:ax] + (s,) + base[ax + 1:])) for s in sizes]
    offsets = np.cumsum([0] + sizes)

    def source(idx):
        k = int(np.searchsorted(offsets, idx[ax], side="right")) - 1
        return fields[k][idx[:ax] + (idx[ax] - offsets[k],) + idx[ax + 1:]]

    expected = loop_oracle(base[:ax] + (sum(sizes),) + base[ax + 1:], source, "float64")
    check_tuple_input_op("concatenate", fields, {"axis": axis}, expected)


def test_concatenate_dynamic_and_errors():
    fields = TupleType((tt(N, 2), tt(N, 3)))
    assert rel("concatenate", [fields], axis=1).shape == (N, 5)
    assert rel("concatenate", [TupleType((tt(ANY, 2), tt(3, 2)))]).shape == (ANY, 2)
    assert rel("concatenate", [TupleType((tt(ANY, 2), tt(ANY, ANY)))], axis=1).shape == (ANY, ANY)
    assert rel("concatenate", [TupleType((tt(ANY, 2), tt(4, 2)))], axis=1).shape == (4, 4)
    for bad in [TupleType((tt(2, 2), tt(3, 3))), TupleType((tt(2, 2), tt(2,))), TupleType(()), tt(2, 2),
                TupleType((tt(2, 2), tt(2, 2, dtype="int32")))]:
        with pytest.raises(TypeInferenceError):
            rel("concatenate", [bad])
    with pytest.raises(ShapeError, match="must match"):
        get_op("concatenate").shape_func(get_op("concatenate").normalize_attrs({}), [[(2, 2), (2, 3)]])
    with pytest.raises(ShapeError):
        get_op("concatenate").kernel({}, (np.zeros((2, 2)), np.zeros((2, 3))))


@SETTINGS
@given(shapes(0, 3, 0, 3), st.data())
def test_stack(shape, data):
    count = data.draw(st.integers(1, 3))
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    fields = [data.draw(arrays_of("int8", shape)) for _ in range(count)]
    ax = axis % (len(shape) + 1)
    expected = loop_oracle(shape[:ax] + (count,) + shape[ax:], lambda idx: fields[idx[ax]][idx[:ax] + idx[ax + 1:]],
                           "int8")
    check_tuple_input_op("stack", fields, {"axis": axis}, expected)
    with pytest.raises(TypeInferenceError):
        rel("stack", [TupleType((tt(2, 3), tt(3, 2)))])


@SETTINGS
@given(shapes(1, 3, 0, 6), st.data())
def test_split(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    ax = axis % len(shape)
    dim = shape[ax]
    x = data.draw(arrays_of("float32", shape))
    if data.draw(st.booleans()):
        divisors = [k for k in range(1, max(dim, 1) + 1) if dim % k == 0] or [1, 2]
        spec = data.draw(st.sampled_from(divisors))
        bounds = [dim // spec * k for k in range(spec + 1)]
    else:
        spec = tuple(sorted(data.draw(st.lists(st.integers(0, dim), max_size=3))))
        bounds = [0, *spec, dim]
    expected = tuple(
        loop_oracle(shape[:ax] + (b - a,) + shape[ax + 1:], lambda idx, a=a: x[idx[:ax] + (idx[ax] + a,) + idx[ax + 1:]],
                    "float32")
        for a, b in itertools.pairwise(bounds)
    )
    check_op("split", [x], {"indices_or_sections": spec, "axis": axis}, expected)


def test_split_dynamic_and_errors():
    out = rel("split", [tt(N, 6)], indices_or_sections=3, axis=1)
    assert out == TupleType((tt(N, 2),) * 3)
    out = rel("split", [tt(ANY, 4)], indices_or_sections=(1, 3))
    assert [f.shape for f in out.fields] == [(1, 4), (2, 4), (ANY, 4)]
    assert rel("split", [tt(N, 4)], indices_or_sections=2).fields[0].shape == (ANY, 4)
    with pytest.raises(TypeInferenceError, match="divisible"):
        rel("split", [tt(5, 2)], indices_or_sections=2)
    with pytest.raises(TypeInferenceError, match="beyond"):
        rel("split", [tt(5, 2)], indices_or_sections=(2, 6))
    with pytest.raises(ShapeError, match="divisible"):
        get_op("split").shape_func({"indices_or_sections": 2}, [(5,)])
    for bad in [0, (3, 1), (-1,), "2"]:
        with pytest.raises(AttrError):
            get_op("split").normalize_attrs({"indices_or_sections": bad})


# ---- take, gather, gather_nd, scatters ------------------------------------------------------------------


@SETTINGS
@given(shapes(1, 3, 1, 3), shapes(0, 2, 0, 3), st.data())
def test_take(data_shape, index_shape, data):
    x = data.draw(arrays_of("float32", data_shape))
    mode = data.draw(st.sampled_from(["clip", "wrap", "fast"]))
    use_axis = data.draw(st.booleans())
    axis = data.draw(st.integers(-len(data_shape), len(data_shape) - 1)) if use_axis else None
    n = data_shape[axis] if use_axis else x.size
    low, high = (-n, n - 1) if mode == "fast" else (-2 * n - 1, 2 * n + 1)
    idx = data.draw(arrays_of("int32", index_shape, low, high))

    def fix(i):
        return min(max(i, 0), n - 1) if mode == "clip" else i % n

    if not use_axis:
        flat = x.reshape(-1)
        expected = loop_oracle(index_shape, lambda k: flat[fix(int(idx[k]))], "float32")
    else:
        ax = axis % len(data_shape)
        out_shape = data_shape[:ax] + index_shape + data_shape[ax + 1:]
        k = len(index_shape)
        expected = loop_oracle(
            out_shape, lambda o: x[o[:ax] + (fix(int(idx[o[ax:ax + k]])),) + o[ax + k:]], "float32")
    check_op("take", [x, idx], {"axis": axis, "mode": mode}, expected)


def test_take_batch_dims():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4)).astype("float32")
    idx = rng.integers(0, 4, size=(2, 5)).astype("int64")
    expected = loop_oracle((2, 3, 5), lambda o: x[o[0], o[1], idx[o[0], o[2]]], "float32")
    check_op("take", [x, idx], {"axis": 2, "batch_dims": 1}, expected)
    check_op("take", [x, idx], {"axis": -1, "batch_dims": -1}, expected)
    assert rel("take", [tt(N, 3, 4), tt(ANY, 5, dtype="int32")], axis=2, batch_dims=1).shape == (N, 3, 5)
    with pytest.raises(TypeInferenceError, match="batch dim"):
        rel("take", [tt(2, 3, 4), tt(3, 5, dtype="int32")], axis=2, batch_dims=1)
    with pytest.raises(TypeInferenceError, match="integer"):
        rel("take", [tt(2, 3), tt(2)], axis=0)
    with pytest.raises(ExecutionError, match="out of range"):
        get_op("take").kernel({"axis": 0, "mode": "fast"}, np.zeros(3), np.array([3]))
    with pytest.raises(ExecutionError, match="size 0"):
        get_op("take").kernel({"axis": 0}, np.zeros(0), np.array([0]))
    with pytest.raises(AttrError):
        get_op("take").normalize_attrs({"mode": "raise"})


@SETTINGS
@given(shapes(1, 3, 1, 3), st.data())
def test_gather(data_shape, data):
    x = data.draw(arrays_of("int32", data_shape))
    axis = data.draw(st.integers(-len(data_shape), len(data_shape) - 1))
    ax = axis % len(data_shape)
    index_shape = tuple(data.draw(st.integers(0, 3)) if d == ax else data.draw(st.integers(0, n))
                        for d, n in enumerate(data_shape))
    n = data_shape[ax]
    idx = data.draw(arrays_of("int64", index_shape, -n, n - 1))
    expected = loop_oracle(index_shape, lambda o: x[o[:ax] + (int(idx[o]) % n,) + o[ax + 1:]], "int32")
    check_op("gather", [x, idx], {"axis": axis}, expected)


def test_gather_errors():
    with pytest.raises(TypeInferenceError, match="rank"):
        rel("gather", [tt(2, 3), tt(2, dtype="int32")], axis=0)
    with pytest.raises(TypeInferenceError, match="exceeds"):
        rel("gather", [tt(2, 3), tt(2, 4, dtype="int32")], axis=0)
    with pytest.raises(ExecutionError):
        get_op("gather").kernel({"axis": 0}, np.zeros((2, 2)), np.array([[2, 0]]))


@SETTINGS
@given(shapes(1, 4, 1, 3), st.data())
def test_gather_nd(data_shape, data):
    batch_dims = data.draw(st.integers(0, len(data_shape) - 1))
    depth = data.draw(st.integers(1, len(data_shape) - batch_dims))
    y_shape = data.draw(shapes(0, 2, 0, 3))
    x = data.draw(arrays_of("float32", data_shape))
    idx = np.stack([data.draw(arrays_of("int32", data_shape[:batch_dims] + y_shape, 0, data_shape[batch_dims + k] - 1))
                    for k in range(depth)])
    out_shape = data_shape[:batch_dims] + y_shape + data_shape[batch_dims + depth:]
    nb, ny = batch_dims, len(y_shape)

    def source(o):
        point = tuple(int(idx[(k,) + o[:nb + ny]]) for k in range(depth))
        return x[o[:nb] + point + o[nb + ny:]]

    check_op("gather_nd", [x, idx], {"batch_dims": batch_dims}, loop_oracle(out_shape, source, "float32"),
             relax=False)


def test_gather_nd_dynamic():
    assert rel("gather_nd", [tt(N, 4, 5), tt(2, ANY, dtype="int32")]).shape == (ANY, 5)
    assert rel("gather_nd", [tt(N, 4, 5), tt(ANY, 7, dtype="int32")], index_rank=1).shape == (7, 4, 5)
    with pytest.raises(TypeInferenceError, match="index_rank"):
        rel("gather_nd", [tt(3, 4), tt(ANY, 7, dtype="int32")])
    with pytest.raises(TypeInferenceError, match="does not fit"):
        rel("gather_nd", [tt(3, 4), tt(3, 7, dtype="int32")])


def scatter_oracle(out, positions, values, reduction):
    """Apply the updates one at a time, in order; ``mean`` averages the data with all its updates."""
    count = np.ones(out.shape)
    total = out.astype(np.float64)
    for pos, value in zip(positions, values, strict=True):
        if reduction == "update":
            out[pos] = value
        elif reduction == "add":
            out[pos] += value
        elif reduction == "mul":
            out[pos] *= value
        elif reduction == "min":
            out[pos] = min(out[pos], value)
        elif reduction == "max":
            out[pos] = max(out[pos], value)
        else:
            total[pos] += value
            count[pos] += 1
    if reduction == "mean":
        out[...] = (total / count).astype(out.dtype)
    return out


@SETTINGS
@given(shapes(1, 3, 1, 3), st.data())
def test_scatter_elements(data_shape, data):
    reduction = data.draw(st.sampled_from(["update", "add", "mul", "mean", "min", "max"]))
    x = data.draw(arrays_of("float64", data_shape, -4, 4))
    axis = data.draw(st.integers(-len(data_shape), len(data_shape) - 1))
    ax = axis % len(data_shape)
    index_shape = tuple(data.draw(st.integers(0, n)) for n in data_shape)
    n = data_shape[ax]
    # "update" with repeated targets has no defined winner, so use distinct targets there
    unique = reduction == "update"
    if unique:
        index_shape = index_shape[:ax] + (min(index_shape[ax], n),) + index_shape[ax + 1:]
        idx = np.empty(index_shape, "int32")
        for rest in np.ndindex(index_shape[:ax] + index_shape[ax + 1:]):
            perm = data.draw(st.permutations(range(n)))[:index_shape[ax]]
            for k, v in enumerate(perm):
                idx[rest[:ax] + (k,) + rest[ax:]] = v
    else:
        idx = data.draw(arrays_of("int32", index_shape, -n, n - 1))
    updates = data.draw(arrays_of("float64", index_shape, -4, 4))
    positions = [p[:ax] + (int(idx[p]) % n,) + p[ax + 1:] for p in np.ndindex(index_shape)]
    expected = scatter_oracle(x.copy(), positions, [updates[p] for p in np.ndindex(index_shape)], reduction)
    check_op("scatter_elements", [x, idx, updates], {"axis": axis, "reduction": reduction}, expected,
             rtol=1e-12, atol=1e-12)


@SETTINGS
@given(shapes(1, 3, 1, 3), st.data())
def test_scatter_nd(data_shape, data):
    mode = data.draw(st.sampled_from(["update", "add", "mul", "min", "max"]))
    depth = data.draw(st.integers(1, len(data_shape)))
    x = data.draw(arrays_of("int64", data_shape, -50, 50))
    # "update" with repeated targets has no defined winner, so its targets are distinct
    point = st.tuples(*[st.integers(0, data_shape[k] - 1) for k in range(depth)])
    points = data.draw(st.lists(point, max_size=4, unique=mode == "update"))
    idx = np.array(points, dtype="int64").reshape(len(points), depth).T
    if data.draw(st.booleans()):  # indices of shape (M, 1, P)
        idx = idx.reshape(depth, 1, len(points))
    y_shape = idx.shape[1:]
    updates = data.draw(arrays_of("int64", y_shape + data_shape[depth:], -50, 50))
    positions, values = [], []
    for p in np.ndindex(y_shape):
        target = tuple(int(idx[(k,) + p]) for k in range(depth))
        for rest in np.ndindex(data_shape[depth:]):
            positions.append(target + rest)
            values.append(updates[p + rest])
    expected = scatter_oracle(x.copy(), positions, values, mode)
    check_op("scatter_nd", [x, idx, updates], {"mode": mode}, expected, relax=False)


def test_scatter_errors():
    with pytest.raises(TypeInferenceError, match="updates"):
        rel("scatter_nd", [tt(4, 5), tt(1, 3, dtype="int32"), tt(3, 4)])
    with pytest.raises(TypeInferenceError, match="dtype"):
        rel("scatter_nd", [tt(4, 5), tt(1, 3, dtype="int32"), tt(3, 5, dtype="float64")])
    with pytest.raises(TypeInferenceError, match="must match"):
        rel("scatter_elements", [tt(4, 5), tt(2, 3, dtype="int32"), tt(2, 2)])
    with pytest.raises(ExecutionError):
        get_op("scatter_nd").kernel({}, np.zeros(3), np.array([[3]]), np.ones(1))
    assert rel("scatter_elements", [tt(N, 5), tt(ANY, 2, dtype="int32"), tt(ANY, 2)]).shape == (N, 5)


# ---- strided_slice ----------------------------------------------------------------------------------


def relay_slice_range(dim, begin, end, stride):
    """Relay's canonicalization, spelled out: negative indices count from the end, then begin/end are
    clamped to [0, dim] (positive stride) or [-1, dim - 1] (negative stride)."""
    lo, hi = (0, dim) if stride > 0 else (-1, dim - 1)

    def canon(index):
        index = index + dim if index < 0 else index
        return min(max(index, lo), hi)

    b = canon(begin) if begin is not None else (0 if stride > 0 else dim - 1)
    e = canon(end) if end is not None else (dim if stride > 0 else -1)
    out, i = [], b
    while (stride > 0 and i < e) or (stride < 0 and i > e):
        out.append(i)
        i += stride
    return out


@SETTINGS
@given(shapes(1, 3, 0, 5), st.data())
def test_strided_slice(shape, data):
    x = data.draw(arrays_of("int16", shape))
    use_axes = data.draw(st.booleans())
    axes = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True, min_size=1)) if use_axes else None
    count = len(axes) if use_axes else data.draw(st.integers(1, len(shape)))
    bound = st.integers(-7, 7)
    begin = data.draw(st.lists(bound, min_size=count, max_size=count))
    end = data.draw(st.lists(bound, min_size=count, max_size=count))
    strides = data.draw(st.lists(st.integers(-3, 3).filter(bool), min_size=count, max_size=count))
    ranges = [list(range(n)) for n in shape]
    for i, axis in enumerate(axes if use_axes else range(count)):
        ranges[axis] = relay_slice_range(shape[axis], begin[i], end[i], strides[i])
    expected = x[np.ix_(*ranges)] if all(ranges) else np.zeros(tuple(map(len, ranges)), "int16")
    check_op("strided_slice", [x], {"begin": begin, "end": end, "strides": strides, "axes": axes}, expected)


@SETTINGS
@given(shapes(1, 3, 0, 5), st.data())
def test_strided_slice_size_mode(shape, data):
    x = data.draw(arrays_of("float32", shape))
    begin = [data.draw(st.integers(-n - 1, n)) for n in shape]
    sizes = [data.draw(st.integers(-1, n + 1)) for n in shape]
    ranges = []
    for n, b, s in zip(shape, begin, sizes, strict=True):
        start = relay_slice_range(n, b, None, 1)
        start = start[0] if start else n
        ranges.append(list(range(start, n if s < 0 else min(start + s, n))))
    expected = x[np.ix_(*ranges)] if all(ranges) else np.zeros(tuple(map(len, ranges)), "float32")
    check_op("strided_slice", [x], {"begin": begin, "end": sizes, "strides": [5] * len(shape), "slice_mode": "size"},
             expected)


def test_strided_slice_dynamic():
    assert rel("strided_slice", [tt(N, 8)], begin=(0, 2), end=(2**31 - 1, 6)).shape == (N, 4)
    assert rel("strided_slice", [tt(N, 8)], begin=(1,), end=(3,)).shape == (ANY, 8)
    assert rel("strided_slice", [tt(N, 8)], begin=(0,), end=(-1,), slice_mode="size").shape == (N, 8)
    assert rel("strided_slice", [tt(N, ANY, 3)], begin=(1,), end=(2,), axes=(2,)).shape == (N, ANY, 1)
    with pytest.raises(TypeInferenceError, match="rank"):
        rel("strided_slice", [tt(3)], begin=(0, 0), end=(1, 1))
    with pytest.raises(TypeInferenceError, match="more values"):
        rel("strided_slice", [tt(3, 3)], begin=(0, 0), end=(1, 1), axes=(1,))
    with pytest.raises(AttrError, match="nonzero"):
        get_op("strided_slice").normalize_attrs({"begin": (0,), "end": (1,), "strides": (0,)})
    with pytest.raises(AttrError):
        get_op("strided_slice").normalize_attrs({"begin": (0,), "end": (1,), "slice_mode": "step"})


def test_dyn_strided_slice():
    x = iota((4, 5, 6))
    args = [x, np.array([1, -1], "int64"), np.array([3, 0], "int64"), np.array([1, -2], "int64")]
    expected = loop_oracle((2, 2, 6), lambda o: x[1 + o[0], 4 - 2 * o[1], o[2]], "float32")
    check_op("dyn.strided_slice", args, expected=expected, consts=True, relax=False)
    t_int = tt(2, dtype="int64")
    assert rel("dyn.strided_slice", [tt(N, 5, 6), t_int, t_int, t_int]).shape == (ANY, ANY, 6)
    assert rel("dyn.strided_slice", [tt(4, 5, 6)] + [t_int] * 3, [None, *args[1:]]).shape == (2, 2, 6)
    assert rel("dyn.strided_slice", [tt(4, 5, 6)] + [tt(ANY, dtype="int64")] * 3).shape == (ANY, ANY, ANY)
    with pytest.raises(TypeInferenceError, match="integer"):
        rel("dyn.strided_slice", [tt(4), tt(1), tt(1), tt(1)])
    with pytest.raises(ShapeError, match="nonzero"):
        get_op("dyn.strided_slice").kernel({}, x, np.array([0]), np.array([1]), np.array([0]))


# ---- broadcast_to, tile, repeat, reverse ------------------------------------------------------------------


@SETTINGS
@given(shapes(0, 3, 0, 3), st.data())
def test_broadcast_to(target, data):
    source = tuple(1 if data.draw(st.booleans()) else d for d in target[len(target) - data.draw(st.integers(0, len(target))):])
    x = data.draw(arrays_of("float32", source))
    offset = len(target) - len(source)
    expected = loop_oracle(target, lambda o: x[tuple(0 if s == 1 else o[offset + k] for k, s in enumerate(source))],
                           "float32")
    check_op("broadcast_to", [x], {"shape": target}, expected)
    check_op("broadcast_to_like", [x, np.zeros(target, "int8")], {}, expected)
    check_op("dyn.broadcast_to", [x, np.array(target, "int64")], {}, expected, consts=True, relax=False)


def test_broadcast_to_dynamic_and_errors():
    assert rel("broadcast_to", [tt(ANY, 1)], shape=(4, 3)).shape == (4, 3)
    assert rel("broadcast_to_like", [tt(3, 1), tt(N, ANY, 5)]).shape == (N, 3, 5)
    assert rel("dyn.broadcast_to", [tt(3, 1), tt(3, dtype="int64")]).shape == (ANY, 3, ANY)
    with pytest.raises(TypeInferenceError):
        rel("broadcast_to", [tt(2, 3)], shape=(4, 3))
    with pytest.raises(TypeInferenceError, match="lower-rank"):
        rel("broadcast_to", [tt(2, 3)], shape=(3,))
    with pytest.raises(ShapeError):
        get_op("broadcast_to").shape_func({"shape": (4, 3)}, [(2, 3)])
    with pytest.raises(ShapeError):
        get_op("dyn.broadcast_to").shape_func({}, [(2, 3), np.array([2, 4])])


@SETTINGS
@given(shapes(0, 3, 1, 3), st.lists(st.integers(0, 3), max_size=4), st.data())
def test_tile(shape, reps, data):
    x = data.draw(arrays_of("uint8", shape))
    ndim = max(len(shape), len(reps))
    full_shape = (1,) * (ndim - len(shape)) + shape
    full_reps = (1,) * (ndim - len(reps)) + tuple(reps)
    xs = x.reshape(full_shape)
    expected = loop_oracle(tuple(d * r for d, r in zip(full_shape, full_reps, strict=True)),
                           lambda o: xs[tuple(i % d for i, d in zip(o, full_shape, strict=True))], "uint8")
    check_op("tile", [x], {"reps": reps}, expected)


@SETTINGS
@given(shapes(1, 3, 0, 3), st.integers(1, 3), st.data())
def test_repeat_and_reverse(shape, repeats, data):
    x = data.draw(arrays_of("float32", shape))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    ax = axis % len(shape)
    out_shape = shape[:ax] + (shape[ax] * repeats,) + shape[ax + 1:]
    check_op("repeat", [x], {"repeats": repeats, "axis": axis},
             loop_oracle(out_shape, lambda o: x[o[:ax] + (o[ax] // repeats,) + o[ax + 1:]], "float32"))
    check_op("reverse", [x], {"axis": axis},
             loop_oracle(shape, lambda o: x[o[:ax] + (shape[ax] - 1 - o[ax],) + o[ax + 1:]], "float32"))
    assert rel("repeat", [tt(N, 3)], repeats=2, axis=1).shape == (N, 6)
    assert rel("repeat", [tt(N, 3)], repeats=1, axis=0).shape == (N, 3)
    with pytest.raises(AttrError):
        get_op("repeat").normalize_attrs({"repeats": 0, "axis": 0})
    with pytest.raises(TypeInferenceError, match="out of range"):
        rel("reverse", [tt(2)], axis=1)


# ---- shape queries, copy, one_hot, sequence_mask ------------------------------------------------------------


@SETTINGS
@given(shapes(0, 4, 0, 3), st.sampled_from(["int32", "int64"]))
def test_shape_of_ndarray_size_copy(shape, dtype):
    x = np.ones(shape, "float16")
    check_op("shape_of", [x], {"dtype": dtype}, np.array(list(shape), dtype))
    check_op("shape_of", [x], {}, np.array(list(shape), "int32"))
    size = 1
    for d in shape:
        size *= d
    check_op("ndarray_size", [x], {"dtype": dtype}, np.array(size, dtype))
    out = check_op("copy", [x], {}, np.ones(shape, "float16"))
    assert out is not x
    assert rel("shape_of", [tt(N, ANY)]) == tt(2, dtype="int32")
    with pytest.raises(AttrError, match="integer"):
        get_op("shape_of").normalize_attrs({"dtype": "float32"})


@SETTINGS
@given(shapes(0, 2, 0, 3), st.integers(0, 4), st.data())
def test_one_hot(shape, depth, data):
    idx = data.draw(arrays_of("int32", shape, -1, depth + 1))
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    ax = axis % (len(shape) + 1)
    on, off = np.array(5, "int8"), np.array(-2, "int8")
    dtype = data.draw(st.sampled_from(["", "float32"]))
    out_shape = shape[:ax] + (depth,) + shape[ax:]
    expected = loop_oracle(out_shape, lambda o: 5 if idx[o[:ax] + o[ax + 1:]] == o[ax] else -2, dtype or "int8")
    check_op("one_hot", [idx, on, off], {"depth": depth, "axis": axis, "dtype": dtype}, expected)
    with pytest.raises(TypeInferenceError, match="scalars"):
        rel("one_hot", [tt(3, dtype="int32"), tt(2), tt()], depth=3)
    with pytest.raises(AttrError):
        get_op("one_hot").normalize_attrs({})


@SETTINGS
@given(shapes(2, 3, 0, 3), st.sampled_from([0, 1]), st.data())
def test_sequence_mask(shape, axis, data):
    x = data.draw(arrays_of("float32", shape))
    batch, steps = shape[1 - axis], shape[axis]
    lengths = data.draw(arrays_of("int32", (batch,), 0, steps + 1))

    def source(o):
        t, b = (o[0], o[1]) if axis == 0 else (o[1], o[0])
        return x[o] if t < lengths[b] else -1.5

    check_op("sequence_mask", [x, lengths], {"axis": axis, "mask_value": -1.5}, loop_oracle(shape, source, "float32"))
    with pytest.raises(TypeInferenceError, match="batch"):
        rel("sequence_mask", [tt(3, 4), tt(3, dtype="int32")])


# ---- generic: every op here rejects a non-tensor argument with a clear error ------------------------------


@pytest.mark.parametrize("name,attrs", [
    ("reshape", {"newshape": (1,)}), ("transpose", {}), ("squeeze", {}), ("take", {}),
    ("strided_slice", {"begin": (0,), "end": (1,)}), ("tile", {"reps": (1,)}), ("shape_of", {}),
])
def test_non_tensor_argument(name, attrs):
    opdef = get_op(name)
    args = [TupleType((tt(2),))] + [tt(2, dtype="int32")] * (opdef.num_inputs - 1)
    with pytest.raises(TypeInferenceError, match="tensor"):
        rel(name, args, **attrs)


def test_relaxed_type_keeps_structure_for_symbols():
    concrete = rel("split", [tt(4, 6)], indices_or_sections=2, axis=1)
    assert_compatible(rel("split", [tt(N, 6)], indices_or_sections=2, axis=1), concrete, "split")
    assert rel("expand_dims", [tt(N, ANY)], axis=1) == tt(N, 1, ANY)
    assert rel("tile", [tt(N, 2)], reps=(1, 3)).shape == (N, 6)
    assert rel("one_hot", [tt(N, dtype="int32"), tt(), tt()], depth=4).shape == (N, 4)


def test_arity_required_attrs_and_array_shapes():
    with pytest.raises(TypeInferenceError, match="expected 1 argument"):
        get_op("concatenate").type_rel([], {})
    with pytest.raises(TypeInferenceError, match="expected 2 argument"):
        rel("take", [tt(3)])
    with pytest.raises(ExecutionError, match="expected 2 argument"):
        get_op("take").kernel({}, np.zeros(3))
    with pytest.raises(AttrError, match="required"):
        rel("reshape", [tt(2, 3)], newshape=None)
    # a shape function accepts run-time shapes given as int64 arrays, not only tuples
    shape = np.array([2, 3, 4], "int64")
    assert get_op("reshape").shape_func({"newshape": (0, -1)}, [shape]) == [(2, 12)]
    assert get_op("concatenate").shape_func({"axis": 1}, [[shape, shape]]) == [(2, 6, 4)]
    assert get_op("split").shape_func({"indices_or_sections": 2, "axis": 0}, [shape]) == [(1, 3, 4)] * 2


# ---- dyn.tile, dyn.expand_dims, dyn.squeeze, dyn.one_hot ---------------------------------------------


@SETTINGS
@given(shapes(0, 3, 0, 3), st.lists(st.integers(0, 3), min_size=0, max_size=4), st.sampled_from(["int32", "int64"]),
       st.data())
def test_dyn_tile_matches_numpy(shape, reps, reps_dtype, data):
    x = data.draw(arrays_of("float32", shape))
    reps_t = np.array(reps, reps_dtype).reshape(len(reps))
    expected = np.tile(x, tuple(reps))
    check_op("dyn.tile", [x, reps_t], expected=expected, consts=True, relax=False)
    check_op("dyn.tile", [x, reps_t], expected=expected, dynamic=True, relax=False)
    assert rel("dyn.tile", [static_type(x), static_type(reps_t)]).shape == (ANY,) * max(len(shape), len(reps))


@SETTINGS
@given(shapes(0, 3, 0, 3), st.data())
def test_dyn_expand_dims_matches_numpy(shape, data):
    x = data.draw(arrays_of("int32", shape))
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    count = data.draw(st.integers(0, 2))
    position = axis % (len(shape) + 1)
    expected = x.reshape(shape[:position] + (1,) * count + shape[position:])
    args = [x, np.int64(axis)]
    check_op("dyn.expand_dims", args, {"num_newaxis": count}, expected, consts=True, relax=False)
    check_op("dyn.expand_dims", args, {"num_newaxis": count}, expected, dynamic=True, relax=False)


@SETTINGS
@given(st.lists(st.sampled_from([1, 1, 2, 3]), min_size=0, max_size=4), st.data())
def test_dyn_squeeze_matches_numpy(dims, data):
    x = data.draw(arrays_of("float32", tuple(dims)))
    ones = [i for i, d in enumerate(dims) if d == 1]
    chosen = data.draw(st.lists(st.sampled_from(ones), unique=True)) if ones else []
    axes = np.array([c - len(dims) for c in chosen], "int32").reshape(len(chosen))
    expected = x.reshape(tuple(d for i, d in enumerate(dims) if i not in chosen))
    check_op("dyn.squeeze", [x, axes], expected=expected, consts=True, relax=False)
    check_op("dyn.squeeze", [x, axes], expected=expected, dynamic=True, relax=False)


def test_a_repeated_squeeze_axis_is_an_error():
    """dyn.squeeze's output rank is its number of axes: (1, 1) squeezed over [0, -2] used to give (1,) in
    Python and the kernel (axes deduplicated) while its C shape function rejected it, as NumPy does."""
    x = np.ones((1, 1), "float32")
    with pytest.raises(ValueError):
        np.squeeze(x, axis=(0, -2))
    op = get_op("dyn.squeeze")
    with pytest.raises(ShapeError, match="repeated"):
        op.shape_func(op.normalize_attrs({}), [(1, 1), np.array([0, -2], "int64")])
    with pytest.raises(ShapeError, match="repeated"):
        op.kernel(op.normalize_attrs({}), x, np.array([0, -2], "int64"))


@SETTINGS
@given(shapes(0, 2, 0, 3), st.integers(0, 4), st.data())
def test_dyn_one_hot_matches_the_static_op(shape, depth, data):
    indices = data.draw(arrays_of("int32", shape, -1, 4))
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    on, off = np.float32(5), np.float32(-1)
    attrs = {"axis": axis}
    position = axis % (len(shape) + 1)
    hot = np.moveaxis(indices[..., None] == np.arange(depth), -1, position)
    expected = np.where(hot, on, off).astype("float32")
    args = [indices, on, off, np.int32(depth)]
    check_op("dyn.one_hot", args, attrs, expected, consts=True, relax=False)
    check_op("dyn.one_hot", args, attrs, expected, dynamic=True, relax=False)
    static = get_op("one_hot").kernel({"depth": depth, "axis": axis}, indices, on, off)
    np.testing.assert_array_equal(static, expected)


def test_dyn_forms_are_data_dependent_and_check_their_inputs():
    for name in ("dyn.tile", "dyn.expand_dims", "dyn.squeeze"):
        assert get_op(name).shape_func_data_dependent == (False, True) and get_op(name).pattern == OpPattern.OPAQUE
    assert get_op("dyn.one_hot").shape_func_data_dependent == (False, False, False, True)
    with pytest.raises(TypeInferenceError, match="static length"):
        rel("dyn.tile", [tt(2, 3), tt(ANY, dtype="int32")])
    with pytest.raises(TypeInferenceError, match="integer dtype"):
        rel("dyn.tile", [tt(2, 3), tt(2)])
    with pytest.raises(TypeInferenceError, match="axis must be a scalar"):
        rel("dyn.expand_dims", [tt(2, 3), tt(1, dtype="int32")])
    with pytest.raises(TypeInferenceError, match="3 axes to squeeze from a tensor of rank 2"):
        rel("dyn.squeeze", [tt(2, 1), tt(3, dtype="int32")])
    with pytest.raises(TypeInferenceError, match="out of range"):  # a constant axis is checked statically
        rel("dyn.expand_dims", [tt(2, 3), tt(dtype="int32")], [None, np.int32(5)])
    with pytest.raises(ShapeError, match="bad reps tensor"):
        get_op("dyn.tile").shape_func({}, [(2, 3), np.array([1, -2], "int64")])
    with pytest.raises(ShapeError, match="bad depth tensor"):
        get_op("dyn.one_hot").kernel({}, np.zeros(2, "int32"), np.float32(1), np.float32(0), np.int32(-1))
    with pytest.raises(ShapeError, match="squeezed dim 0"):
        get_op("dyn.squeeze").kernel({}, np.zeros((2, 1)), np.array([0]))
