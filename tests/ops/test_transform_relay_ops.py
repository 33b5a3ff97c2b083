"""adv_index, contrib_reverse_reshape, dyn.reshape's special values and (dyn.)sparse_to_dense (Relay's
signatures) against hand values and loop oracles, on the kernel, the interpreter, target python and
target c (no NumPy fallback)."""

from __future__ import annotations

import numpy as np
import pytest
from op_testing import check_op
from relay_runner import HEADER, check_everywhere

import tensorvm as tv
from tensorvm.errors import AttrError, ExecutionError, ShapeError, TensorVMError, TypeInferenceError
from tensorvm.ir.types import Any, SymDim, TensorType, TupleType
from tensorvm.op import get_op


def adv_index_oracle(x, *indices):
    """Loop over the broadcast index positions."""
    grid = np.broadcast_arrays(*indices)
    shape = grid[0].shape
    out = np.empty(shape + x.shape[len(indices):], x.dtype)
    for position in np.ndindex(shape):
        source = tuple(int(g[position]) % x.shape[axis] for axis, g in enumerate(grid))
        out[position] = x[source]
    return out


def test_adv_index():
    x = np.arange(2 * 3 * 4, dtype="float32").reshape(2, 3, 4)
    i, j = np.array([[0], [1], [-1]], "int64"), np.array([2, -3, 0, 1], "int32")
    assert adv_index_oracle(x, np.array([1]), np.array([2]))[0].tolist() == x[1, 2].tolist()
    expected = adv_index_oracle(x, i, j)
    opdef = get_op("adv_index")
    np.testing.assert_array_equal(opdef.kernel({}, (x, i, j)), expected)
    types = TupleType(tuple(TensorType(a.shape, a.dtype.name) for a in (x, i, j)))
    assert opdef.type_rel([types], {}) == TensorType(expected.shape, "float32")
    assert opdef.shape_func({}, [[x.shape, i.shape, j.shape]]) == [expected.shape]
    text = ("def @main(%x: Tensor[(?, 3, 4), float32], %i: Tensor[(?, 1), int64], %j: Tensor[(?), int32]) { "
            "(adv_index((%x, %i, %j)), adv_index((%x, %j))) }")
    check_everywhere(text, [x, i, j % 2], (adv_index_oracle(x, i, j % 2), adv_index_oracle(x, j % 2)))


def test_adv_index_types_and_errors():
    rel = get_op("adv_index").type_rel
    n = SymDim("n")
    data = TensorType((n, 3, 4), "float32")
    out = rel([TupleType((data, TensorType((Any(), 1), "int32"), TensorType((5,), "int64")))], {})
    assert out == TensorType((Any(), 5, 4), "float32")
    with pytest.raises(TypeInferenceError, match="broadcast"):
        rel([TupleType((data, TensorType((2,), "int32"), TensorType((3,), "int32")))], {})
    with pytest.raises(TypeInferenceError, match="integer"):
        rel([TupleType((data, TensorType((2,), "float32")))], {})
    with pytest.raises(TypeInferenceError, match="index tensors"):
        rel([TupleType((data,) + (TensorType((2,), "int32"),) * 4)], {})
    mod = tv.parse(HEADER + "def @main(%x: Tensor[(3), float32], %i: Tensor[(?), int32]) { adv_index((%x, %i)) }")
    x, bad = np.zeros(3, "float32"), np.array([0, 3], "int32")
    with pytest.raises(ExecutionError, match="out of range"):
        tv.create_executor("debug", mod).evaluate()(x, bad)
    with pytest.raises(TensorVMError, match="range"):
        tv.vm.VirtualMachine(tv.vm.compile(mod, target="c")).invoke("main", x, bad)


@pytest.mark.parametrize("shape, newshape, expected", [
    ((10, 5, 4), (-1, 0), (50, 4)),  # Relay's documented example: reshape would give (40, 5)
    ((10, 5, 4), (0, -1), (5, 40)),  # 0 copies the dim at its place counted from the right
    ((2, 3, 4, 5), (-2, -3), (2, 3, 20)),  # -3 merges the last two dims, -2 copies the rest
    ((2, 3, 4), (-3, 0), (6, 4)),
])
def test_reverse_reshape(shape, newshape, expected):
    x = np.arange(int(np.prod(shape)), dtype="int32").reshape(shape)
    for name in ("contrib_reverse_reshape", "reverse_reshape"):
        check_op(name, [x], {"newshape": newshape}, x.reshape(expected))
    dims = ", ".join("?" if k == 0 else str(d) for k, d in enumerate(shape))
    text = (f"def @main(%x: Tensor[({dims}), int32]) {{ contrib_reverse_reshape(%x, newshape=[{', '.join(map(str, newshape))}]) }}")
    check_everywhere(text, [x], x.reshape(expected))


def test_reverse_reshape_errors():
    rel = get_op("contrib_reverse_reshape").type_rel
    with pytest.raises(AttrError):  # -4's two values would be read in the wrong order
        rel([TensorType((4, 6), "float32")], {"newshape": (-4, 2, 2, 0)})
    with pytest.raises(TypeInferenceError, match="cannot reshape"):
        rel([TensorType((4, 6), "float32")], {"newshape": (5, 0)})


@pytest.mark.parametrize("newshape, expected", [
    ([0, -3], (2, 12)), ([-3, 0], (6, 4)), ([-4, 1, 2, -2], (1, 2, 3, 4)), ([-4, 2, -1, 0, 0], None),
    ([-2, 1], None), ([2, 3, -2], (2, 3, 4)), ([0, -3, 1], (2, 12, 1)),
])
def test_dyn_reshape_special_values(newshape, expected):
    x = np.arange(24, dtype="float32").reshape(2, 3, 4)
    values = np.array(newshape, "int64")
    text = (f"def @main(%x: Tensor[(2, ?, 4), float32], %s: Tensor[({len(newshape)}), int64]) "
            f"{{ dyn.reshape(%x, %s) }}")
    if expected is None:  # the rank would differ from the length of newshape: an error everywhere
        with pytest.raises(ShapeError, match="rank"):
            get_op("dyn.reshape").shape_func({}, [x.shape, values])
        mod = tv.parse(HEADER + text)
        for run in (lambda: tv.create_executor("debug", mod).evaluate()(x, values),
                    lambda: tv.vm.VirtualMachine(tv.vm.compile(mod, target="c")).invoke("main", x, values)):
            with pytest.raises(ShapeError, match="rank"):
                run()
        return
    check_everywhere(text, [x, values], x.reshape(expected))
    check_op("dyn.reshape", [x, values], {}, x.reshape(expected), consts=True)


def sparse_oracle(indices, values, default, shape):
    out = np.full(shape, default, values.dtype)
    coords = np.asarray(indices).reshape(-1, 1) if np.ndim(indices) < 2 else indices
    vals = np.broadcast_to(values, (len(coords),))
    for k, coord in enumerate(coords):  # in order: a repeated index keeps the last value
        out[tuple(int(c) for c in coord)] = vals[k]
    return out


def test_sparse_to_dense():
    indices = np.array([[0, 1], [2, 3], [0, 1], [1, 0]], "int32")
    values = np.array([5, 6, 7, 8], "int64")
    expected = sparse_oracle(indices, values, -1, (3, 4))
    assert expected[0, 1] == 7
    check_op("sparse_to_dense", [indices, values, np.int64(-1)], {"output_shape": (3, 4)}, expected)
    check_op("sparse_to_dense", [np.array([3, 0], "int32"), np.float32(2), np.float32(0)], {"output_shape": (5,)},
             sparse_oracle(np.array([3, 0]), np.float32(2), 0, (5,)))
    check_op("sparse_to_dense", [np.int64(2), np.float32(9), np.float32(1)], {"output_shape": (4,)},
             np.array([1, 1, 9, 1], "float32"))
    text = ("def @main(%i: Tensor[(?, 2), int32], %v: Tensor[(?), int64], %s: Tensor[(2), int64]) { "
            "(sparse_to_dense(%i, %v, -1i64, output_shape=[3, 4]), dyn.sparse_to_dense(%i, %s, %v, 0i64)) }")
    check_everywhere(text, [indices, values, np.array([4, 5], "int64")],
                     (expected, sparse_oracle(indices, values, 0, (4, 5))))


def test_sparse_to_dense_types_and_errors():
    rel = get_op("dyn.sparse_to_dense").type_rel
    idx, vals, default = TensorType((Any(), 2), "int32"), TensorType((Any(),), "float32"), TensorType((), "float32")
    assert rel([idx, TensorType((2,), "int64"), vals, default], {}) == TensorType((Any(), Any()), "float32")
    assert rel([idx, TensorType((2,), "int64"), vals, default], {}, [None, np.array([3, 4]), None, None]) == \
        TensorType((3, 4), "float32")
    with pytest.raises(TypeInferenceError, match="coordinates"):
        rel([idx, TensorType((3,), "int64"), vals, default], {})
    with pytest.raises(TypeInferenceError, match="dtype"):
        rel([idx, TensorType((2,), "int64"), vals, TensorType((), "int32")], {})
    with pytest.raises(TypeInferenceError, match="values"):
        get_op("sparse_to_dense").type_rel([TensorType((3, 2), "int32"), TensorType((4,), "float32"), default],
                                           {"output_shape": (3, 4)})
    mod = tv.parse(HEADER + "def @main(%i: Tensor[(?), int32]) { sparse_to_dense(%i, 1f, 0f, output_shape=[3]) }")
    with pytest.raises(ExecutionError, match="out of range"):
        tv.create_executor("debug", mod).evaluate()(np.array([3], "int32"))
    with pytest.raises(TensorVMError, match="range"):
        tv.vm.VirtualMachine(tv.vm.compile(mod, target="c")).invoke("main", np.array([3], "int32"))
