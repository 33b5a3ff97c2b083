"""Shape logic written once (tensorvm/op/shape_logic.py): for every op whose logic traces into C, the C
shape function (traced from the logic, compiled), the Python shape function and the NumPy kernel's
actual output shape agree on generated cases, and all three reject the same mismatches.

Each case is one op called on concrete arrays; its primitive has parameters of the same ranks with
every dim ``?`` (so the C function checks everything at run time). All the cases' C functions are
compiled into one library. ``tensorvm.op.shape_coverage.NOT_TRACED`` lists (with reasons) the ops whose
shape functions do not trace into C yet; it is strict: an op that traces must leave the list.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.errors import ExecutionError, ShapeError, TypeInferenceError
from tensorvm.ir.expr import Call, Function, Op, Var
from tensorvm.ir.types import Any, TensorType, TupleType
from tensorvm.op import get_op
from tensorvm.op.nn import packed_lanes
from tensorvm.op.registry import op_names
from tensorvm.op.shape_coverage import NOT_TRACED, c_shape_function
from tensorvm.op.shape_logic import ShapeLogicTraceError

codegen = pytest.importorskip("tensorvm.codegen.build")
if not codegen.have_compiler():  # pragma: no cover - the CI machine has one
    pytest.skip("no C compiler", allow_module_level=True)

RNG_SEED = 17
CASES_PER_OP = 12

# ---- case generators ------------------------------------------------------------------------------


def _shape(rng, rank: int, sides=(0, 1, 2, 3)) -> tuple:
    return tuple(int(rng.choice(sides)) for _ in range(rank))


def _array(rng, shape, dtype: str):
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("float"):
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-3, 4, shape).astype(dtype)


def _pick_dtype(name: str, arity: int) -> str:
    """The first of float32, int32, bool the op's relation accepts for all its inputs."""
    opdef = get_op(name)
    for dtype in ("float32", "int32", "bool"):
        try:
            opdef.type_rel([TensorType((2,), dtype)] * arity, {}, None)
            return dtype
        except (TypeInferenceError, tv.errors.AttrError):
            continue
    return "float32"


_ATTRS = {"clip": {"a_min": -1.0, "a_max": 1.0}, "cast": {"dtype": "int32"}, "reinterpret": {"dtype": "int32"}}


def _elementwise_cases(name, rng):
    dtype = _pick_dtype(name, 1)
    cases = []
    for _ in range(CASES_PER_OP):
        x = _array(rng, _shape(rng, int(rng.integers(0, 4))), dtype)
        if name == "full_like":
            cases.append(({}, [x, np.array(1, dtype)]))
        elif name == "cast_like":
            cases.append(({}, [x, _array(rng, _shape(rng, 1), "int32")]))
        else:
            cases.append((_ATTRS.get(name, {}), [x]))
    return cases


def _broadcast_cases(name, rng):
    arity = get_op(name).num_inputs
    dtype = _pick_dtype(name, arity)
    cases = []
    for _ in range(CASES_PER_OP):
        shapes = [_shape(rng, int(rng.integers(0, 4)), (1, 2, 3)) for _ in range(arity)]
        dtypes = ["bool", dtype, dtype] if name == "where" else [dtype] * arity
        cases.append(({}, [_array(rng, s, d) for s, d in zip(shapes, dtypes)]))
    return cases


def _reduce_cases(name, rng):
    dtype = "float32" if name in ("mean", "logsumexp", "variance", "std") else _pick_dtype(name, 1)
    cases = []
    for _ in range(CASES_PER_OP):
        rank = int(rng.integers(1, 4))
        x = _array(rng, _shape(rng, rank), dtype)
        axis = sorted({int(a) for a in rng.integers(-rank, rank, int(rng.integers(1, rank + 1)))} ,
                      key=lambda a: a % rank)
        axis = list({a % rank: a for a in axis}.values())
        attrs = {"axis": axis if rng.random() < 0.8 else None, "keepdims": bool(rng.random() < 0.5),
                 "exclude": bool(rng.random() < 0.3)}
        inputs = [x]
        if name in ("variance", "std") and rng.random() < 0.5:
            inputs.append(_array(rng, _shape(rng, int(rng.integers(0, rank + 1)), (1, 2, 3)), dtype))
        cases.append((attrs, inputs))
    return cases


def _generator(name):
    opdef = get_op(name)
    logic = opdef.shape_logic
    qual = getattr(logic, "__qualname__", "")
    if qual.startswith("identity_logic"):
        return _elementwise_cases
    if qual.startswith("broadcast_logic"):
        return _broadcast_cases
    if qual.startswith(("_reduce_logic", "_moment_logic")):
        return _reduce_cases
    return GENERATORS.get(name)


def _cases(make):
    """A generator calling ``make(rng) -> (attrs, inputs)`` CASES_PER_OP times."""
    return lambda name, rng: [make(rng) for _ in range(CASES_PER_OP)]


def _f32(rng, shape):
    return _array(rng, shape, "float32")


def _side(rng, sides=(1, 2, 3)):
    return int(rng.choice(sides))


def _dense(rng):
    k = _side(rng, (2, 3))
    x = _f32(rng, _shape(rng, int(rng.integers(1, 3))) + (k,))
    w = _f32(rng, (_side(rng), k if rng.random() < 0.7 else _side(rng, (2, 3))))
    return ({"units": _side(rng)} if rng.random() < 0.3 else {}), [x, w]


def _recurrent_cell(gates):
    """nn.lstm_cell / nn.gru_cell: x and r (batch, gates * hidden), the state (batch, hidden), GRU's rb
    (hidden,); sometimes a batch or width that disagrees."""
    def make(rng):
        batch, hidden = _side(rng), _side(rng)
        widths = [gates * hidden if rng.random() < 0.8 else gates * hidden + 1 for _ in range(2)]
        batches = [batch if rng.random() < 0.8 else batch + 1 for _ in range(2)]
        rb = [_f32(rng, (hidden if rng.random() < 0.8 else hidden + 1,))] if gates == 3 else []
        return {}, [_f32(rng, (b, w)) for b, w in zip(batches, widths)] + [_f32(rng, (batch, hidden))] + rb

    return make


def _matmul(rng):
    ta, tb = bool(rng.random() < 0.5), bool(rng.random() < 0.5)
    k, k2 = _side(rng, (2, 3)), _side(rng, (2, 3))
    m, n = _side(rng), _side(rng)
    a = _f32(rng, (_side(rng), k, m) if ta else (_side(rng), m, k))
    b = _f32(rng, (n, k2) if tb else (k2, n))
    return {"transpose_a": ta, "transpose_b": tb}, [a, b]


def _batch_matmul(rng):
    k, k2 = _side(rng, (2, 3)), _side(rng, (2, 3))
    return {}, [_f32(rng, (_side(rng), _side(rng), k)), _f32(rng, (_side(rng), _side(rng), k2))]


def _vectors(count):
    def make(rng):
        rank = int(rng.integers(1, 4))
        x = _f32(rng, _shape(rng, rank, (1, 2, 3)))
        axis = int(rng.integers(-rank, rank))
        length = x.shape[axis] if rng.random() < 0.7 else _side(rng)
        return {"axis": axis}, [x] + [_f32(rng, (length,)) for _ in range(count)]

    return make


def _axis(rng):
    rank = int(rng.integers(1, 4))
    return {"axis": int(rng.integers(-rank, rank))}, [_f32(rng, _shape(rng, rank))]


def _conv2d(rng):
    groups = int(rng.choice([1, 2]))
    c = groups * _side(rng, (1, 2))
    x = _f32(rng, (_side(rng, (1, 2)), c if rng.random() < 0.8 else c + 1, _side(rng, (1, 3, 5)), _side(rng, (1, 4))))
    w = _f32(rng, (groups * _side(rng, (1, 2)), c // groups, _side(rng, (1, 2, 3)), _side(rng, (1, 2))))
    attrs = {"groups": groups, "strides": (_side(rng, (1, 2)),) * 2, "padding": (_side(rng, (0, 1)),) * 4,
             "dilation": (_side(rng, (1, 2)),) * 2}
    return attrs, [x, w]


def _pool(rng):
    x = _f32(rng, (1, 2, _side(rng, (1, 3, 5)), _side(rng, (2, 4))))
    attrs = {"pool_size": (_side(rng), _side(rng, (1, 2))), "strides": (_side(rng, (1, 2)),) * 2,
             "padding": (_side(rng, (0, 1)),) * 4, "ceil_mode": bool(rng.random() < 0.5)}
    return attrs, [x]


def _one_input(rank_low=0):
    return lambda rng: ({}, [_f32(rng, _shape(rng, int(rng.integers(rank_low, 4))))])


def _broadcast_to(rng):
    return {"shape": _shape(rng, int(rng.integers(0, 4)), (1, 2, 3))}, [_f32(rng, _shape(rng, int(rng.integers(0, 3)),
                                                                                         (1, 2, 3)))]


def _broadcast_to_like(rng):
    return {}, [_f32(rng, _shape(rng, int(rng.integers(0, 3)), (1, 2, 3))),
                _f32(rng, _shape(rng, int(rng.integers(0, 4)), (1, 2, 3)))]


def _reshape(rng):
    shape = _shape(rng, int(rng.integers(1, 4)), (1, 2, 3, 4))
    size = int(np.prod(shape))
    options = [(-1,), (size,), (0, -1), (-1, 2), (2, -1, 1), (-2,), (-3, -2) if len(shape) >= 2 else (-1,),
               (-4, 2, -1, -2), (0, 0, -1) if len(shape) >= 2 else (0,), (4, -1), (size + 1,)]
    return {"newshape": options[int(rng.integers(len(options)))]}, [_f32(rng, shape)]


def _transpose(rng):
    rank = int(rng.integers(0, 4))
    axes = None if rng.random() < 0.3 else tuple(int(a) for a in rng.permutation(rank))
    return {"axes": axes}, [_f32(rng, _shape(rng, rank))]


def _expand_dims(rng):
    rank = int(rng.integers(0, 4))
    return {"axis": int(rng.integers(-rank - 1, rank + 1)), "num_newaxis": int(rng.integers(0, 3))}, \
        [_f32(rng, _shape(rng, rank))]


def _squeeze(rng):
    rank = int(rng.integers(1, 4))
    shape = _shape(rng, rank, (1, 1, 2))
    return {"axis": (int(rng.integers(-rank, rank)),)}, [_f32(rng, shape)]


def _reshape_like(rng):
    x = _f32(rng, _shape(rng, int(rng.integers(1, 4)), (1, 2, 3)))
    like = _f32(rng, _shape(rng, int(rng.integers(1, 3)), (1, 2, 3, 6)))
    return {}, [x, like]


def _argwhere(rng):
    x = _array(rng, _shape(rng, int(rng.integers(0, 4))), str(rng.choice(["bool", "float32", "int8"])))
    return {}, [x]


def _topk(rng):
    x = _f32(rng, _shape(rng, int(rng.integers(1, 3)), (1, 2, 4)))
    attrs = {"axis": int(rng.integers(-x.ndim, x.ndim)), "ret_type": str(rng.choice(["both", "values", "indices"]))}
    k = int(rng.integers(-1, 6))
    if rng.random() < 0.5:
        return {**attrs, "k": k}, [x]
    return attrs, [x, np.array(k, str(rng.choice(["int32", "int64"])))]


def _sorted_unique(rng):
    data = rng.choice(np.array([0.0, 1.0, 2.5, np.nan], "float32"), int(rng.integers(0, 7)))
    order = np.argsort(data, kind="stable").astype("int64")
    roll = rng.random()
    if roll < 0.1 and len(order) > 1 and np.unique(data).size > 1:
        order = order[::-1].copy()  # not ascending
    elif roll < 0.2 and len(order):
        order[0] = len(order)  # out of range
    elif roll < 0.3:
        order = np.append(order, 0)  # wrong length
    return {"return_counts": bool(rng.random() < 0.5)}, [data, order]


def _arange(rng):
    if rng.random() < 0.5:
        values = [np.array(int(rng.integers(-6, 7)), "int64") for _ in range(3)]
    else:
        choices = np.array([-2.5, -1.0, 0.0, 0.5, 3.0, 7.25, np.inf], "float32")
        values = [np.array(rng.choice(choices), "float32") for _ in range(3)]
    return {"dtype": "float32"}, values


def _sorting(rng):
    rank = int(rng.integers(0, 3))
    return {"axis": int(rng.integers(-rank - 1, rank + 1)) if rank else -1}, [_f32(rng, _shape(rng, rank))]


def _scan(rng):
    rank = int(rng.integers(0, 3))
    axis = None if rng.random() < 0.4 or not rank else int(rng.integers(-rank, rank))
    return {"axis": axis}, [_f32(rng, _shape(rng, rank))]


def _tuple_of(rng, count, base):
    return tuple(_f32(rng, tuple(d if rng.random() < 0.85 else _side(rng) for d in base)) for _ in range(count))


def _concatenate(rng):
    rank = int(rng.integers(1, 4))
    axis = int(rng.integers(-rank, rank))
    return {"axis": axis}, [_tuple_of(rng, int(rng.integers(1, 4)), _shape(rng, rank))]


def _stack(rng):
    rank = int(rng.integers(0, 3))
    return {"axis": int(rng.integers(-rank - 1, rank + 1))}, [_tuple_of(rng, int(rng.integers(1, 4)), _shape(rng, rank))]


def _split(rng):
    rank = int(rng.integers(1, 3))
    x = _f32(rng, _shape(rng, rank, (0, 2, 3, 4, 6)))
    spec = int(rng.integers(1, 4)) if rng.random() < 0.5 else tuple(sorted(int(v) for v in rng.integers(0, 6, 2)))
    return {"indices_or_sections": spec, "axis": int(rng.integers(-rank, rank))}, [x]


def _take(rng):
    rank = int(rng.integers(1, 3))
    x = _f32(rng, _shape(rng, rank, (1, 2, 3)))
    indices = rng.integers(0, 1, _shape(rng, int(rng.integers(0, 3)), (1, 2))).astype("int32")
    axis = None if rng.random() < 0.3 else int(rng.integers(-rank, rank))
    return {"axis": axis, "mode": "clip"}, [x, indices]


def _gather(rng):
    rank = int(rng.integers(1, 3))
    x = _f32(rng, _shape(rng, rank, (1, 2, 3)))
    indices = rng.integers(0, 1, _shape(rng, rank, (1, 2, 3))).astype("int32")
    return {"axis": int(rng.integers(-rank, rank))}, [x, indices]


def _gather_nd(rng):
    x = _f32(rng, _shape(rng, int(rng.integers(1, 4)), (1, 2, 3)))
    depth = int(rng.integers(1, 3))
    indices = np.zeros((depth,) + _shape(rng, int(rng.integers(0, 2)), (1, 2)), "int32")
    return {"index_rank": depth}, [x, indices]


def _scatter_elements(rng):
    rank = int(rng.integers(1, 3))
    x = _f32(rng, _shape(rng, rank, (1, 2, 3)))
    shape = _shape(rng, rank, (1, 2, 3))
    updates_shape = shape if rng.random() < 0.8 else _shape(rng, rank, (1, 2))
    return {"axis": int(rng.integers(-rank, rank))}, [x, np.zeros(shape, "int32"), _f32(rng, updates_shape)]


def _scatter_nd(rng):
    x = _f32(rng, _shape(rng, int(rng.integers(1, 3)), (1, 2, 3)))
    depth = int(rng.integers(1, x.ndim + 1))
    rest = _shape(rng, int(rng.integers(0, 2)), (1, 2))
    expected = rest + x.shape[depth:]
    updates = _f32(rng, expected if rng.random() < 0.8 else _shape(rng, len(expected), (1, 2)))
    return {}, [x, np.zeros((depth,) + rest, "int32"), updates]


def _norm_data(rng, rank_low=2):
    return _f32(rng, _shape(rng, int(rng.integers(rank_low, 4)), (1, 2, 4)))


def _instance_norm(rng):
    x = _norm_data(rng)
    c = x.shape[1] if rng.random() < 0.8 else _side(rng)
    return {"axis": 1}, [x, _f32(rng, (c,)), _f32(rng, (c,))]


def _group_norm(rng):
    attrs, inputs = _instance_norm(rng)
    return {**attrs, "num_groups": int(rng.choice([1, 2]))}, inputs


def _space_depth(to_space):
    def make(rng):
        b = 2
        if to_space:
            shape = (1, int(rng.choice([4, 8, 6])), _side(rng), _side(rng))
        else:
            shape = (1, _side(rng), int(rng.choice([2, 4, 3])), int(rng.choice([2, 4, 1])))
        return {"block_size": b}, [_f32(rng, shape)]

    return make


def _dense_packed(rng):
    units = int(rng.choice([3, 16, 17]))
    k = _side(rng, (2, 3))
    lanes = packed_lanes()  # (a dynamic panel width is this host's, as the C shape function checks)
    panels = -(-units // lanes) if rng.random() < 0.8 else 3
    packed = _f32(rng, (panels, k if rng.random() < 0.8 else k + 1, lanes))
    return {"units": units}, [_f32(rng, (_side(rng), k)), packed]


def _conv2d_packed(rng):
    o, c = int(rng.choice([3, 16, 17])), int(rng.choice([1, 9]))
    kh, kw = _side(rng, (1, 2, 3)), _side(rng, (1, 2))
    lanes = packed_lanes()
    panels = -(-o // lanes) if rng.random() < 0.8 else 3
    k = -(-c // 8) * 8 * kh * kw
    packed = _f32(rng, (panels, k if rng.random() < 0.8 else k + 1, lanes))
    attrs = {"channels": o, "in_channels": c, "kernel_size": (kh, kw), "strides": (_side(rng, (1, 2)), 1),
             "padding": (_side(rng, (0, 1)), 0, 1, 0)}
    return attrs, [_f32(rng, (_side(rng), c if rng.random() < 0.9 else c + 1, _side(rng, (1, 3, 4)), _side(rng, (2, 3)))),
                   packed]


def _adaptive(rng):
    x = _f32(rng, (1, 2, _side(rng, (0, 2, 3)), _side(rng, (1, 4))))
    return {"output_size": (_side(rng, (1, 2)), _side(rng, (1, 3)))}, [x]


def _strided_slice(rng):
    rank = int(rng.integers(1, 3))
    x = _f32(rng, _shape(rng, rank, (0, 1, 3, 5)))
    count = int(rng.integers(1, rank + 1))
    begin = tuple(int(v) for v in rng.integers(-6, 6, count))
    end = tuple(int(v) for v in rng.integers(-6, 7, count))
    strides = tuple(int(rng.choice([-2, -1, 1, 2, 3])) for _ in range(count))
    mode = "size" if rng.random() < 0.2 else "end"
    if mode == "size":
        begin = tuple(abs(b) for b in begin)
    return {"begin": begin, "end": end, "strides": strides, "slice_mode": mode}, [x]


def _axis_only(rng):
    rank = int(rng.integers(1, 4))
    return {"axis": int(rng.integers(-rank, rank))}, [_f32(rng, _shape(rng, rank))]


def _repeat(rng):
    attrs, inputs = _axis_only(rng)
    return {**attrs, "repeats": int(rng.integers(1, 4))}, inputs


def _tile(rng):
    reps = tuple(int(v) for v in rng.integers(0, 3, int(rng.integers(0, 4))))
    return {"reps": reps}, [_f32(rng, _shape(rng, int(rng.integers(0, 3))))]


def _one_hot(rng):
    indices = rng.integers(0, 3, _shape(rng, int(rng.integers(0, 3)))).astype("int32")
    rank = indices.ndim
    return ({"depth": 3, "axis": int(rng.integers(-rank - 1, rank + 1))},
            [indices, np.array(1.0, "float32"), np.array(0.0, "float32")])


def _sequence_mask(rng):
    x = _f32(rng, _shape(rng, int(rng.integers(2, 4)), (1, 2, 3)))
    axis = int(rng.integers(0, 2))
    batch = x.shape[1 - axis] if rng.random() < 0.8 else _side(rng)
    return {"axis": axis}, [x, rng.integers(0, 3, (batch,)).astype("int32")]


def _reverse_reshape(rng):
    shape = _shape(rng, int(rng.integers(1, 4)), (1, 2, 3, 4))
    options = [(-1,), (0, -1), (-1, 0), (-2,), (2, -1), (-3,) if len(shape) >= 2 else (-1,), (5, -1)]
    return {"newshape": options[int(rng.integers(len(options)))]}, [_f32(rng, shape)]


def _grid_sample(rng):
    n = _side(rng, (1, 2))
    grid = _f32(rng, (n if rng.random() < 0.8 else 3, 2, _side(rng), _side(rng)))
    return {}, [_f32(rng, (n, 2, _side(rng, (2, 3)), _side(rng, (2, 3)))), grid]


def _crop(rng):
    boxes = np.tile(np.array([0.0, 0.0, 1.0, 1.0], "float32"), (_side(rng), 1))
    count = boxes.shape[0] if rng.random() < 0.8 else boxes.shape[0] + 1
    return {"crop_size": (2, 3)}, [_f32(rng, (1, 4, 4, 2)), boxes, np.zeros((count,), "int32")]


def _mirror_pad(rng):
    rank = int(rng.integers(1, 3))
    x = _f32(rng, _shape(rng, rank, (1, 2, 3)))
    pads = tuple((int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in range(rank))
    return {"pad_width": pads, "mode": str(rng.choice(["REFLECT", "SYMMETRIC"]))}, [x]


def _dilate(rng):
    rank = int(rng.integers(1, 3))
    x = _f32(rng, _shape(rng, rank, (0, 1, 3)))
    return {"strides": tuple(int(v) for v in rng.integers(1, 3, rank))}, [x]


def _conv_transpose(dims):
    def make(rng):
        c = _side(rng, (1, 2))
        spatial = tuple(_side(rng, (1, 3)) for _ in range(dims))
        x = _f32(rng, (1, c if rng.random() < 0.8 else c + 1) + spatial)
        w = _f32(rng, (c, _side(rng, (1, 2))) + tuple(_side(rng, (1, 2, 3)) for _ in range(dims)))
        stride = _side(rng, (1, 2))
        attrs = {"strides": (stride,) * dims, "padding": (_side(rng, (0, 1, 2)),) * (2 * dims)}
        return attrs, [x, w]

    return make


def _dyn_reshape(rng):
    shape = _shape(rng, int(rng.integers(0, 4)), (0, 1, 2, 3, 4))
    size = int(np.prod(shape))
    options = [(-1,), (size,), (0, -1), (-1, 2), (2, -1, 1), (-1, -1), (0, 0, 0, 0), (4, -1), (size + 1,), (-2,),
               (1, -3), (0, 5)]
    newshape = np.array(options[int(rng.integers(len(options)))], str(rng.choice(["int32", "int64"])))
    return {"allowzero": bool(rng.random() < 0.2)}, [_f32(rng, shape), newshape]


def _dyn_fill(with_value):
    def make(rng):
        shape = np.array([int(v) for v in rng.integers(-1, 4, int(rng.integers(0, 4)))], "int64")
        return {}, ([np.array(2.0, "float32")] if with_value else []) + [shape]

    return make


def _static_fill(with_value):
    def make(rng):
        attrs = {"shape": _shape(rng, int(rng.integers(0, 3)))}
        return attrs, [np.array(2.0, "float32")] if with_value else []

    return make


def _pad(rng):
    rank = int(rng.integers(1, 3))
    x = _f32(rng, _shape(rng, rank, (0, 1, 2, 3)))
    pads = tuple((int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in range(rank))
    return {"pad_width": pads, "pad_mode": str(rng.choice(["constant", "edge", "reflect"]))}, \
        [x] + ([np.array(1.0, "float32")] if rng.random() < 0.5 else [])


def _batch_norm(rng):
    x = _f32(rng, _shape(rng, int(rng.integers(2, 4)), (1, 2, 3)))
    c = x.shape[1] if rng.random() < 0.8 else _side(rng)
    return {"axis": 1}, [x] + [_f32(rng, (c,)) for _ in range(4)]


def _onnx_matmul(rng):
    k = _side(rng, (2, 3))
    a = _f32(rng, _shape(rng, int(rng.integers(0, 2)), (1, 2, 3)) + (_side(rng), k)) if rng.random() < 0.8 \
        else _f32(rng, (k,))
    b_k = k if rng.random() < 0.8 else _side(rng, (2, 3))
    b = _f32(rng, _shape(rng, int(rng.integers(0, 2)), (1, 2, 3)) + (b_k, _side(rng))) if rng.random() < 0.8 \
        else _f32(rng, (b_k,))
    return {}, [a, b]


def _with_int_k(rng):
    return {}, [_f32(rng, _shape(rng, int(rng.integers(2, 4)))), np.array(1, "int64")]


def _resize(d):
    def make(rng):
        x = _f32(rng, (1, 2) + _shape(rng, d, (0, 2, 3)))
        return {"size": tuple(_side(rng, (0, 1, 4)) for _ in range(d))}, [x]

    return make


def _affine_grid(rng):
    return {"target_shape": (_side(rng), _side(rng))}, [_f32(rng, (_side(rng), 2, 3))]


def _rotary(rng):
    batch, seq = _side(rng, (1, 2)), _side(rng, (1, 3))
    return {"num_heads": 2}, [_f32(rng, (batch, seq, 4)), _f32(rng, (4, 2)), _f32(rng, (4, 2)),
                rng.integers(0, 4, (batch, seq)).astype("int64")]


def _searchsorted(rng):
    rank = int(rng.integers(1, 3))
    seq = np.sort(_f32(rng, _shape(rng, rank, (1, 2, 3))), axis=-1)
    lead = seq.shape[:-1] if rng.random() < 0.8 else _shape(rng, rank - 1, (1, 2, 3))
    return {}, [seq, _f32(rng, lead + (_side(rng),))]


def _adv_index(rng):
    data = _f32(rng, _shape(rng, int(rng.integers(1, 4)), (1, 2, 3)))
    count = int(rng.integers(1, data.ndim + 1))
    indices = tuple(np.zeros(_shape(rng, int(rng.integers(0, 3)), (1, 2, 3)), "int64") for _ in range(count))
    return {}, [(data,) + indices]


def _dyn_broadcast_to(rng):
    attrs, (x,) = _broadcast_to(rng)
    return {}, [x, np.array(attrs["shape"] if rng.random() < 0.9 else (-1,) + attrs["shape"][1:], "int64")]


def _upsampling(d):
    def make(rng):
        x = _f32(rng, (1, 1) + _shape(rng, d, (0, 1, 2, 3, 5)))
        names = ("scale_d", "scale_h", "scale_w")[3 - d:]
        return {n: float(rng.choice([0.5, 1.0, 1.5, 2.0, 2.5])) for n in names}, [x]

    return make


def _sparse_to_dense(rng):
    count, rank = _side(rng), int(rng.integers(1, 3))
    indices = np.zeros((count, rank if rng.random() < 0.8 else rank + 1), "int64")
    values = _f32(rng, (count if rng.random() < 0.8 else count + 1,)) if rng.random() < 0.7 else np.array(1.0, "float32")
    return {"output_shape": (2,) * rank}, [indices, values, np.array(0.0, "float32")]


_AUTO_PADS = ("NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")


def _conv_nd(transpose):
    def make(rng):
        group = int(rng.choice([1, 2]))
        c = group * _side(rng, (1, 2))
        x = _f32(rng, (_side(rng, (1, 2)), c if rng.random() < 0.8 else c + 1, _side(rng, (2, 3, 5)), _side(rng, (2, 4))))
        w = _f32(rng, ((c, _side(rng, (1, 2))) if transpose else (group * _side(rng, (1, 2)), c // group))
                 + (_side(rng, (1, 2)), _side(rng, (1, 3))))
        attrs = {"group": 1 if transpose else group, "strides": (_side(rng, (1, 2)),) * 2,
                 "auto_pad": str(rng.choice(_AUTO_PADS))}
        if attrs["auto_pad"] == "NOTSET":
            attrs["pads"] = (_side(rng, (0, 1)),) * 4
        return attrs, [x, w]

    return make


def _pool_nd(rng):
    x = _f32(rng, (_side(rng, (1, 2)), _side(rng, (1, 2)), _side(rng, (1, 3, 5)), _side(rng, (2, 4))))
    attrs = {"kernel_shape": (_side(rng), _side(rng, (1, 2))), "strides": (_side(rng, (1, 2)),) * 2,
             "ceil_mode": bool(rng.random() < 0.5), "mode": str(rng.choice(["max", "avg"])),
             "auto_pad": str(rng.choice(_AUTO_PADS)), "return_indices": bool(rng.random() < 0.3)}
    if attrs["auto_pad"] == "NOTSET":
        attrs["pads"] = (_side(rng, (0, 1)),) * 4
    if attrs["return_indices"]:
        attrs["mode"] = "max"
    return attrs, [x]


def _dyn_cumsum(rng):
    x = _f32(rng, _shape(rng, int(rng.integers(1, 4))))
    return {}, [x, np.array(int(rng.integers(-x.ndim - 1, x.ndim + 1)), "int64")]


def _dyn_dropout(rng):
    return {}, [_f32(rng, _shape(rng, int(rng.integers(0, 3)))), np.array(0.5, "float32"), np.array(False)]


def _recurrent(gates, num_inputs):
    """A layer with consistent W and R but for, now and then, W's directions, its input size or R's
    hidden size (the checks of the logic); omitted optional inputs are empty tensors."""
    def case(rng):
        direction = str(rng.choice(["forward", "reverse", "bidirectional"]))
        d, hidden, size = 2 if direction == "bidirectional" else 1, _side(rng, (1, 2)), _side(rng, (1, 2, 3))
        layout = int(rng.random() < 0.3)
        seq, batch = _side(rng, (1, 2, 3)), _side(rng, (1, 2))
        x = _f32(rng, (batch, seq, size) if layout else (seq, batch, size))
        w_d = d if rng.random() < 0.8 else 3 - d
        w_size = size if rng.random() < 0.8 else size + 1
        r_hidden = hidden if rng.random() < 0.85 else hidden + 1
        w, r = _f32(rng, (w_d, gates * hidden, w_size)), _f32(rng, (w_d, gates * hidden, r_hidden))
        empty = np.zeros((0,), "float32")
        lens = np.zeros((0,), "int32")
        rest = [empty, lens, empty] + [empty] * (num_inputs - 6)
        return {"hidden_size": hidden, "direction": direction, "layout": layout}, [x, w, r] + rest

    return case


def _mostly(rng, good, bad, p=0.8):
    return good if rng.random() < p else bad


def _scalar(rng, dtype):
    """The one-value argument of the vision ops: 0-d, (1,), or (2,) now and then (rejected)."""
    shape = [(), (1,), (2,)][int(rng.choice(3, p=[0.45, 0.45, 0.1]))]
    return np.full(shape, 0.5 if dtype == "float32" else 2, dtype)


def _get_valid_counts(rng):
    data = _f32(rng, (_side(rng), _side(rng), _side(rng, (1, 2, 3, 5))))
    attrs = {"score_index": int(rng.integers(0, 3)), "id_index": int(rng.integers(-1, 2))}
    return attrs, [data, _scalar(rng, "float32")]


def _nms(rng):
    batch, anchors, elems = _side(rng, (1, 2)), _side(rng, (1, 2, 3)), _mostly(rng, 6, _side(rng, (4, 5, 7)))
    data = _f32(rng, (batch, anchors, elems))
    valid = rng.integers(0, anchors + 1, (_mostly(rng, batch, batch + 1, 0.9),)).astype("int32")
    indices = np.tile(np.arange(anchors, dtype="int32"), (batch, 1))[:, :_mostly(rng, anchors, anchors - 1, 0.9)]
    attrs = {"return_indices": bool(rng.random() < 0.6), "top_k": int(rng.choice([-1, 1])),
             "force_suppress": bool(rng.random() < 0.5)}
    return attrs, [data, valid, indices, _scalar(rng, "int32"), _scalar(rng, "float32")]


def _all_class_nms(rng):
    batch, classes, boxes = _side(rng, (1, 2)), _side(rng, (1, 2)), _side(rng, (1, 2, 3))
    box_data = _f32(rng, (batch, boxes, _mostly(rng, 4, 3, 0.9)))
    scores = _f32(rng, (_mostly(rng, batch, batch + 1, 0.9), classes, _mostly(rng, boxes, boxes + 1, 0.9)))
    attrs = {"output_format": str(rng.choice(["onnx", "tensorflow"]))}
    return attrs, [box_data, scores, _scalar(rng, "int32"), _scalar(rng, "float32"), _scalar(rng, "float32")]


def _rois(rng, count, batch, width):
    """Regions inside a 4 x 4 map, of valid batches (a bad batch index is the kernel's data error)."""
    corners = np.sort(rng.uniform(0, 4, (count, 2, 2)), axis=1).reshape(count, 4).astype("float32")
    if width == 5:
        return np.concatenate([rng.integers(0, batch, (count, 1)).astype("float32"), corners], axis=1)
    return np.concatenate([corners, corners[:, :width - 4]], axis=1) if width > 4 else corners[:, :width]


def _roi_align(rng):
    n, c, count = _side(rng, (1, 2)), _side(rng), _side(rng)
    layout = str(rng.choice(["NCHW", "NHWC"]))
    data = _f32(rng, (n, c, 4, 4) if layout == "NCHW" else (n, 4, 4, c))
    attrs = {"pooled_size": (int(rng.integers(1, 3)), int(rng.integers(1, 3))), "layout": layout,
             "mode": str(rng.choice(["avg", "max"])), "sample_ratio": int(rng.choice([-1, 2]))}
    return attrs, [data, _rois(rng, count, n, _mostly(rng, 5, 4, 0.85))]


def _onnx_roi_align(rng):
    n, count = _side(rng, (1, 2)), _side(rng)
    rois = _rois(rng, count, n, _mostly(rng, 4, 5, 0.9))
    batches = rng.integers(0, n, (_mostly(rng, count, count + 1, 0.85),)).astype("int64")
    attrs = {"output_height": int(rng.integers(1, 3)), "output_width": int(rng.integers(1, 3)),
             "mode": str(rng.choice(["avg", "max"]))}
    return attrs, [_f32(rng, (n, _side(rng), 4, 4)), rois, batches]


_EQUATIONS = ("ij,jk->ik", "ij->ji", "ii->i", "bij,bjk->bik", "i,i->", "ij,j", "...i,...i->...", "ij,ij->ij")


def _einsum(rng):
    """Operands whose letters mostly agree; now and then one dim is another side (1 broadcasts)."""
    equation = str(rng.choice(_EQUATIONS))
    lhs = equation.split("->")[0].split(",")
    extra = _shape(rng, int(rng.integers(0, 3)), (1, 2))
    sizes = {c: _side(rng, (1, 2, 3)) for c in "bijk"}
    operands = []
    for term in lhs:
        dims = (extra if "..." in term else ()) + tuple(sizes[c] for c in term.replace("...", ""))
        if dims and rng.random() < 0.25:
            k = int(rng.integers(0, len(dims)))
            dims = dims[:k] + (_side(rng, (1, 2, 3, 4)),) + dims[k + 1:]
        operands.append(_f32(rng, dims))
    return {"equation": equation}, [tuple(operands)]


def _sparse_fill(rng):
    """Sorted rows within dense_shape[0] (now and then unsorted, out of range, negative rows, or a
    values vector of the wrong length)."""
    n, ndim, rows = _side(rng, (0, 1, 2, 3, 4)), _side(rng, (1, 2)), _side(rng, (0, 1, 2, 3, 4))
    first = np.sort(rng.integers(0, max(rows, 1), n))
    if rng.random() < 0.2 and n > 1:
        first = first[::-1].copy() if first[0] != first[-1] else first + rows
    indices = np.concatenate([first[:, None], rng.integers(0, 3, (n, ndim - 1))], axis=1).astype("int64")
    dense_shape = np.array([_mostly(rng, rows, -1, 0.9)] + [3] * (ndim - 1), "int64")
    values = _f32(rng, (_mostly(rng, n, n + 1, 0.9),))
    return {}, [indices, values, dense_shape, np.array(0.5, "float32")]


def _attention(rng):
    """3-d or 4-d Q, K, V of consistent heads, with or without a key/value cache; now and then a hidden
    size that is no multiple of the heads, another batch or head size, or query heads that are no
    multiple of the key/value heads (the mask and nonpad lengths are omitted: empty)."""
    b, sq, skv, head, v_head = _side(rng, (1, 2)), _side(rng, (1, 2, 3)), _side(rng, (1, 2, 3)), 2, _side(rng, (1, 2))
    hk = _side(rng, (1, 2))
    hq = hk * _side(rng, (1, 2)) if rng.random() < 0.85 else 3
    kb, k_head = _mostly(rng, b, b + 1, 0.9), _mostly(rng, head, head + 1, 0.9)
    empty = np.zeros((0,), "float32")
    past = int(rng.integers(0, 3)) if rng.random() < 0.5 else None
    if rng.random() < 0.5:
        attrs = {"q_num_heads": hq, "kv_num_heads": hk}
        q, k, v = (b, sq, hq * head), (kb, skv, hk * k_head), (b, skv, hk * v_head)
        if rng.random() < 0.1:
            q = (b, sq, hq * head + 1)
    else:
        attrs = {}
        q, k, v = (b, hq, sq, head), (kb, hk, skv, k_head), (b, hk, skv, v_head)
    past_k = _f32(rng, (b, hk, past, head)) if past is not None else empty
    past_v = _f32(rng, (b, hk, past, v_head)) if past is not None else empty
    return attrs, [_f32(rng, q), _f32(rng, k), _f32(rng, v), empty, past_k, past_v, np.zeros((0,), "int64")]


def _dyn_split(rng):
    """Run-time sizes: none (near-equal parts), a partition of the axis, or now and then a wrong count,
    a negative size or a wrong sum."""
    x = _f32(rng, _shape(rng, int(rng.integers(1, 4)), (0, 1, 2, 3, 4, 5)))
    axis, parts = int(rng.integers(-x.ndim, x.ndim)), _side(rng, (1, 2, 3))
    dim, kind = x.shape[axis], rng.choice(["empty", "partition", "partition", "bad"])
    if kind == "empty":
        sizes = np.zeros((0,), "int64")
    else:
        cuts = np.sort(rng.integers(0, dim + 1, parts - 1))
        sizes = np.diff(np.concatenate([[0], cuts, [dim]])).astype("int64")
        if kind == "bad":
            sizes = [sizes[:-1] if parts > 1 else sizes + 1, sizes + 1, np.append(sizes, 0), -sizes - 1][
                int(rng.integers(0, 4))].astype("int64")
    return {"axis": axis, "num_outputs": parts}, [x, np.asarray(sizes, "int32" if rng.random() < 0.3 else "int64")]


def _dyn_unsqueeze(rng):
    """A static number of run-time axes, now and then out of range or repeated."""
    x = _f32(rng, _shape(rng, int(rng.integers(0, 3))))
    n = int(rng.integers(0, 3))
    ndim = x.ndim + n
    axes = rng.integers(-ndim - 1, ndim + 1, n)
    if n == 1 and rng.random() < 0.3:
        return {}, [x, np.array(axes[0], "int64")]
    return {}, [x, axes.astype("int64")]


def _dyn_reduce(rng):
    """A static number of run-time axes (none: every axis or none, by empty_is_all), now and then out of
    range or repeated."""
    x = _f32(rng, _shape(rng, int(rng.integers(0, 4))))
    n = int(rng.integers(0, 3))
    axes = rng.integers(-x.ndim - 1, x.ndim + 1, n).astype("int64")
    attrs = {"mode": str(rng.choice(["sum", "max", "mean"])), "empty_is_all": bool(rng.random() < 0.7)}
    return attrs, [x, np.array(axes[0]) if n == 1 and rng.random() < 0.3 else axes]


def _dyn_tile(rng):
    x = _f32(rng, _shape(rng, int(rng.integers(0, 3))))
    reps = rng.integers(0, 3, int(rng.integers(0, 4)))
    if len(reps) and rng.random() < 0.2:
        reps[0] = -1
    return {}, [x, reps.astype("int64")]


def _dyn_one_hot(rng):
    indices = rng.integers(-1, 4, _shape(rng, int(rng.integers(0, 3)))).astype("int32")
    axis = int(rng.integers(-indices.ndim - 2, indices.ndim + 2))
    depth = np.array(int(rng.integers(-1, 4)), "int64")
    return {"axis": axis}, [indices, np.array(1.0, "float32"), np.array(0.0, "float32"), depth]


def _dyn_expand_dims(rng):
    x = _f32(rng, _shape(rng, int(rng.integers(0, 4))))
    axis = np.array(int(rng.integers(-x.ndim - 2, x.ndim + 2)), "int64")
    return {"num_newaxis": int(rng.integers(0, 3))}, [x, axis]


def _dyn_squeeze(rng):
    """A static number of run-time axes, mostly of dims of 1; now and then out of range or repeated."""
    x = _f32(rng, _shape(rng, int(rng.integers(0, 4)), (1, 1, 2, 3)))
    n = int(rng.integers(0, x.ndim + 1))
    ones = [i for i, d in enumerate(x.shape) if d == 1]
    axes = [int(a) for a in rng.permutation(ones)[:n]] if rng.random() < 0.7 else \
        list(rng.integers(-x.ndim - 1, x.ndim + 1, n))
    axes = [a - x.ndim if rng.random() < 0.3 else a for a in axes]
    return {}, [x, np.array(axes, "int64").reshape(-1)]


def _dyn_nn_pad(rng):
    """Run-time pad widths, now and then negative, of the wrong rank, or too wide for reflect / of an empty
    dim for edge."""
    x = _f32(rng, _shape(rng, int(rng.integers(1, 4))))
    widths = rng.integers(0, 3, (x.ndim + (1 if rng.random() < 0.1 else 0), 2))
    if rng.random() < 0.15:
        widths[0, 1] = -1
    return {"pad_mode": str(rng.choice(["constant", "edge", "reflect"]))}, [x, widths.astype("int64"),
                                                                             np.array(0.5, "float32")]


def _dyn_pad(rng):
    """Run-time pads (negative ones crop) over run-time axes (none: every axis), now and then cropping
    more than the dim, emptying a padded axis in a non-constant mode, of the wrong count, or with axes out of
    range or repeated."""
    x = _f32(rng, _shape(rng, int(rng.integers(1, 4))))
    n = int(rng.integers(0, x.ndim + 1))
    axes = rng.permutation(x.ndim)[:n] - (x.ndim if rng.random() < 0.3 else 0)
    if n and rng.random() < 0.15:
        axes[-1] = axes[0] if n > 1 else x.ndim
    pads = rng.integers(-2, 3, 2 * (n or x.ndim) + (1 if rng.random() < 0.1 else 0))
    return {"mode": str(rng.choice(["constant", "edge", "reflect", "wrap"]))}, [
        x, pads.astype("int64"), np.array(0.5, "float32"), axes.astype("int32")]


def _dyn_sparse_to_dense(rng):
    """sparse_to_dense's cases with a run-time output_shape, now and then with a negative dim."""
    attrs, (indices, values, default) = _sparse_to_dense(rng)
    out_shape = np.array(attrs["output_shape"], "int64")
    if rng.random() < 0.2:
        out_shape[-1] = -1
    return {}, [indices, out_shape.astype("int32" if rng.random() < 0.3 else "int64"), values, default]


_I64 = np.iinfo("int64")


def _dyn_strided_slice(rng):
    """Run-time begin/end/strides of a static length (over the leading axes or the ``axes`` attribute, in
    end or size mode): out-of-range, INT64_MIN/MAX (ONNX's "to the end") and negative values, strides of
    both signs, now and then 0."""
    x = _f32(rng, _shape(rng, int(rng.integers(1, 4)), (0, 1, 3, 5)))
    n = int(rng.integers(1, x.ndim + 1))
    bounds = [-7, -3, -1, 0, 1, 2, 4, 7, int(_I64.min), int(_I64.max)]
    begin, end = (np.array([rng.choice(bounds) for _ in range(n)], "int64") for _ in range(2))
    strides = np.array([rng.choice([-3, -2, -1, 1, 2, 3, int(_I64.max), int(_I64.min)]) for _ in range(n)], "int64")
    if rng.random() < 0.15:
        strides[-1] = 0
    attrs = {"slice_mode": "size" if rng.random() < 0.25 else "end"}
    if rng.random() < 0.3:
        attrs["axes"] = tuple(int(a) for a in rng.permutation(x.ndim)[:n])
    return attrs, [x, begin, end, strides.astype("int32") if rng.random() < 0.2 and 0 in strides else strides]


def _dyn_upsampling(d):
    """Run-time scales of float32, float64 or int32 scalars: halves (ties round to even), now and then 0,
    negative, NaN or beyond int64 once multiplied."""
    def make(rng):
        attrs, (x,) = _upsampling(d)(rng)
        scales = []
        for value in attrs.values():
            value = float(rng.choice([value, 0.0, -1.5, np.nan, 1e30])) if rng.random() < 0.2 else value
            small_int = bool(np.isfinite(value)) and value == int(value) and abs(value) < 100
            dtype = str(rng.choice(["float32", "float64", "int32"] if small_int else ["float32", "float64"]))
            scales.append(np.array(value, dtype))
        return {}, [x, *scales]

    return make


def _dyn_resize2d(rng):
    """A run-time (height, width), now and then negative or of another length; a roi now and then not of 4."""
    x = _f32(rng, (1, 2) + _shape(rng, 2, (0, 2, 3)))
    size = rng.integers(-1 if rng.random() < 0.2 else 0, 5, 3 if rng.random() < 0.1 else 2)
    roi = np.zeros(3 if rng.random() < 0.1 else 4, "float32")
    return {}, [x, size.astype("int32" if rng.random() < 0.3 else "int64"), roi]


def _onnx_resize(rng):
    """ONNX Resize: scales (now and then NaN, infinite, 0 or negative) or sizes (now and then negative) of
    the right length or not, each keep_aspect_ratio_policy, all or some axes, empty input dims."""
    x = _f32(rng, (1,) + _shape(rng, 2, (0, 2, 3, 3, 4)))
    axes = [(0, 1, 2), (1, 2), (2,)][int(rng.integers(3))]
    n = len(axes) + (1 if rng.random() < 0.1 else 0)
    attrs = {"keep_aspect_ratio_policy": str(rng.choice(["stretch", "not_larger", "not_smaller"]))}
    if len(axes) < 3:  # (no axes attribute: every axis)
        attrs["axes"] = axes
    empty_f, empty_i = np.zeros(0, "float32"), np.zeros(0, "int64")
    if rng.random() < 0.5:
        scales = rng.choice([0.5, 1.0, 1.5, 2.0, 3.25, 0.0, -1.0, np.nan, np.inf], n,
                            p=[.2, .2, .2, .15, .17, .02, .02, .02, .02]).astype("float32")
        return attrs, [x, empty_f, scales, empty_i]
    sizes = rng.integers(-1 if rng.random() < 0.1 else 0, 6, n).astype("int64")
    return attrs, [x, empty_f, empty_f if rng.random() < 0.9 else np.ones(n, "float32"), sizes]


#: Generators of the ops whose logic is neither elementwise, broadcast nor a reduction.
GENERATORS: dict = {
    "copy": _elementwise_cases, "nn.dense": _cases(_dense),
    "nn.lstm_cell": _cases(_recurrent_cell(4)), "nn.gru_cell": _cases(_recurrent_cell(3)), "nn.matmul": _cases(_matmul),
    "nn.batch_matmul": _cases(_batch_matmul), "nn.bias_add": _cases(_vectors(1)), "nn.prelu": _cases(_vectors(1)),
    "nn.softmax": _cases(_axis), "nn.log_softmax": _cases(_axis), "nn.lrn": _cases(_axis),
    "nn.layer_norm": _cases(_vectors(2)), "nn.rms_norm": _cases(_vectors(1)), "nn.conv2d": _cases(_conv2d),
    "nn.max_pool2d": _cases(_pool), "nn.avg_pool2d": _cases(_pool),
    "nn.global_max_pool2d": _cases(lambda rng: ({}, [_f32(rng, (_side(rng), 2, _side(rng), 3))])),
    "nn.global_avg_pool2d": _cases(lambda rng: ({}, [_f32(rng, (_side(rng), 2, _side(rng), 3))])),
    "nn.batch_flatten": _cases(_one_input(1)), "shape_of": _cases(_one_input()),
    "ndarray_size": _cases(_one_input()), "broadcast_to": _cases(_broadcast_to),
    "broadcast_to_like": _cases(_broadcast_to_like), "reshape": _cases(_reshape), "transpose": _cases(_transpose),
    "expand_dims": _cases(_expand_dims), "squeeze": _cases(_squeeze), "reshape_like": _cases(_reshape_like),
    "argwhere": _cases(_argwhere), "topk": _cases(_topk), "sorted_unique": _cases(_sorted_unique),
    "arange": _cases(_arange), "sort": _cases(_sorting), "argsort": _cases(_sorting), "cumsum": _cases(_scan),
    "cumprod": _cases(_scan), "concatenate": _cases(_concatenate), "stack": _cases(_stack), "split": _cases(_split),
    "take": _cases(_take), "gather": _cases(_gather), "gather_nd": _cases(_gather_nd),
    "scatter_elements": _cases(_scatter_elements), "scatter_nd": _cases(_scatter_nd),
    "nn.instance_norm": _cases(_instance_norm), "nn.group_norm": _cases(_group_norm),
    "nn.depth_to_space": _cases(_space_depth(True)), "nn.space_to_depth": _cases(_space_depth(False)),
    "nn.dense_packed": _cases(_dense_packed), "nn.conv2d_packed": _cases(_conv2d_packed),
    "nn.adaptive_avg_pool2d": _cases(_adaptive),
    "nn.adaptive_max_pool2d": _cases(_adaptive), "strided_slice": _cases(_strided_slice),
    "reverse": _cases(_axis_only), "repeat": _cases(_repeat), "tile": _cases(_tile), "one_hot": _cases(_one_hot),
    "sequence_mask": _cases(_sequence_mask), "reverse_reshape": _cases(_reverse_reshape),
    "contrib_reverse_reshape": _cases(_reverse_reshape), "image.grid_sample": _cases(_grid_sample),
    "image.crop_and_resize": _cases(_crop), "nn.mirror_pad": _cases(_mirror_pad), "nn.dilate": _cases(_dilate),
    "nn.conv1d_transpose": _cases(_conv_transpose(1)), "nn.conv2d_transpose": _cases(_conv_transpose(2)),
    "dyn.reshape": _cases(_dyn_reshape), "dyn.zeros": _cases(_dyn_fill(False)), "dyn.ones": _cases(_dyn_fill(False)),
    "dyn.full": _cases(_dyn_fill(True)), "zeros": _cases(_static_fill(False)), "ones": _cases(_static_fill(False)),
    "full": _cases(_static_fill(True)), "nn.pad": _cases(_pad), "nn.batch_norm": _cases(_batch_norm),
    "nn.dropout": _cases(_one_input()), "onnx.matmul": _cases(_onnx_matmul), "trilu": _cases(_with_int_k),
    "image.resize1d": _cases(_resize(1)), "image.resize2d": _cases(_resize(2)),
    "image.resize3d": _cases(_resize(3)), "image.affine_grid": _cases(_affine_grid),
    "image.resize": _cases(_onnx_resize),
    "nn.rotary_embedding": _cases(_rotary),
    "searchsorted": _cases(_searchsorted), "adv_index": _cases(_adv_index),
    "dyn.broadcast_to": _cases(_dyn_broadcast_to), "nn.upsampling": _cases(_upsampling(2)),
    "nn.upsampling3d": _cases(_upsampling(3)), "sparse_to_dense": _cases(_sparse_to_dense),
    "nn.conv_nd": _cases(_conv_nd(False)), "nn.conv_transpose_nd": _cases(_conv_nd(True)),
    "nn.pool_nd": _cases(_pool_nd), "dyn.cumsum": _cases(_dyn_cumsum), "dyn.nn.dropout": _cases(_dyn_dropout),
    "vision.get_valid_counts": _cases(_get_valid_counts), "vision.non_max_suppression": _cases(_nms),
    "vision.all_class_non_max_suppression": _cases(_all_class_nms), "vision.roi_align": _cases(_roi_align),
    "vision.onnx_roi_align": _cases(_onnx_roi_align),
    "dyn.split": _cases(_dyn_split), "dyn.unsqueeze": _cases(_dyn_unsqueeze),
    "dyn.reduce": _cases(_dyn_reduce), "dyn.tile": _cases(_dyn_tile), "dyn.one_hot": _cases(_dyn_one_hot),
    "dyn.expand_dims": _cases(_dyn_expand_dims), "dyn.squeeze": _cases(_dyn_squeeze),
    "dyn.nn.pad": _cases(_dyn_nn_pad), "dyn.pad": _cases(_dyn_pad), "dyn.image.resize2d": _cases(_dyn_resize2d), "dyn.nn.upsampling": _cases(_dyn_upsampling(2)),
    "dyn.nn.upsampling3d": _cases(_dyn_upsampling(3)), "dyn.strided_slice": _cases(_dyn_strided_slice), "dyn.sparse_to_dense": _cases(_dyn_sparse_to_dense), "einsum": _cases(_einsum), "nn.attention": _cases(_attention), "sparse_fill_empty_rows": _cases(_sparse_fill), "nn.lstm": _cases(_recurrent(4, 8)), "nn.gru": _cases(_recurrent(3, 6)), "nn.rnn": _cases(_recurrent(1, 6)),
}

# ---- running one case three ways ------------------------------------------------------------------


def _dynamic_type(value, static_axes=()):
    """The value's type with every dim ``?`` but those of ``static_axes``."""
    if isinstance(value, (tuple, list)):
        return TupleType(tuple(_dynamic_type(v) for v in value))
    value = np.asarray(value)
    return TensorType(tuple(d if axis in static_axes else Any() for axis, d in enumerate(value.shape)),
                      value.dtype.name)


#: Dims an op's relation needs static ({input: axes}): scatter_nd's index depth, the length of a shape tensor.
STATIC_DIMS = {"scatter_nd": {1: (0,)}, "dyn.reshape": {1: (0,)}, "dyn.unsqueeze": {1: (0,)}, "dyn.reduce": {1: (0,)}, "dyn.tile": {1: (0,)}, "dyn.squeeze": {1: (0,)}, "dyn.zeros": {0: (0,)}, "dyn.ones": {0: (0,)},
               "dyn.full": {1: (0,)}, "dyn.pad": {1: (0,), 3: (0,)}, "dyn.strided_slice": {1: (0,), 2: (0,), 3: (0,)}, "dyn.sparse_to_dense": {1: (0,)}, "dyn.broadcast_to": {1: (0,)},
               # (the n-d window ops trace for static spatial dims, e.g. a dynamic batch)
               "nn.conv_nd": {0: (2, 3), 1: (2, 3)}, "nn.conv_transpose_nd": {0: (2, 3), 1: (2, 3)},
               "nn.pool_nd": {0: (2, 3)}}


def _flat(value) -> list:
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in _flat(v)]
    return [np.asarray(value)]


def _shapes_of(result) -> list:
    if isinstance(result, (tuple, list)):
        return [tuple(np.shape(r)) for r in result]
    return [tuple(np.shape(result))]


def _kernel_outcome(name, attrs, inputs):
    try:
        with np.errstate(all="ignore"):
            return _shapes_of(get_op(name).kernel(attrs, *inputs))
    except (ShapeError, ExecutionError, ValueError, IndexError):
        return "error"


def _python_outcome(name, attrs, inputs):
    opdef = get_op(name)
    args = []
    for i, value in enumerate(inputs):
        if opdef.input_needs_data(i):
            args.append(np.asarray(value))
        elif isinstance(value, (tuple, list)):
            args.append([np.shape(v) for v in value])
        else:
            args.append(np.shape(value))
    try:
        return [tuple(s) for s in opdef.shape_func(attrs, args)]
    except ShapeError:
        return "error"


class _Case:
    def __init__(self, name, attrs, inputs, index):
        self.name, self.attrs, self.inputs = name, attrs, inputs
        opdef = get_op(name)
        self.is_input = tuple(opdef.input_needs_data(i) for i in range(len(inputs)))
        static = STATIC_DIMS.get(name, {})
        params = [Var(f"p{i}", _dynamic_type(v, static.get(i, ()))) for i, v in enumerate(inputs)]
        self.prim = Function(params, Call(Op(name), params, attrs))
        self.c_name = f"tvs_case{index}"
        self.flat_inputs = []
        for value, by_data in zip(inputs, self.is_input):
            self.flat_inputs += [a if by_data else a.shape for a in _flat(value)]

    def __repr__(self):
        return f"{self.name}({', '.join(str(_shapes_of(v)) for v in self.inputs)}, attrs={self.attrs})"


def _typed(case) -> bool:
    """Whether the case's dynamic primitive type-checks (a kernel-rejected case may not)."""
    from tensorvm.vm.kernel_python import _prepare

    try:
        _prepare(case.prim)
        return True
    except TypeInferenceError:
        return False


@pytest.fixture(scope="module")
def compiled_cases():
    """Every traceable op's cases with their compiled C shape functions (one library for all)."""
    from tensorvm.codegen.build import build_library
    from tensorvm.codegen.c_emit import library_text
    from tensorvm.vm.kernel_python import build_shape_func_tuples
    from tensorvm.vm.shape_c import SHAPE_LIBRARY, CShapeFunction, emit_shape_func

    rng = np.random.default_rng(RNG_SEED)
    cases, specs, untyped = [], [], []
    for name in traceable_ops():
        for attrs, inputs in _generator(name)(name, rng):
            case = _Case(name, attrs, inputs, len(cases))
            if not _typed(case):
                untyped.append(case)
                continue
            specs.append(emit_shape_func(case.prim, case.is_input, case.c_name))
            cases.append(case)
    library = build_library(library_text([SHAPE_LIBRARY]) + "\n".join(s.source for s in specs))
    for case, spec in zip(cases, specs):
        # (the Python shape function: raises the precise error after a C failure, answers a deferred case)
        python = functools.partial(build_shape_func_tuples, case.prim, case.is_input)
        case.c_func = CShapeFunction(spec, library.function(spec.name, 3, 0), python)
    return cases, untyped


def traceable_ops() -> list:
    return [n for n in op_names() if get_op(n).shape_logic_traceable]


def _c_outcome(case):
    try:
        return [tuple(s) for s in case.c_func.compute(*case.flat_inputs)]
    except ShapeError:
        return "error"


def test_every_traceable_op_has_a_case_generator():
    missing = [n for n in traceable_ops() if _generator(n) is None]
    assert not missing, f"traceable ops without cases in GENERATORS: {missing}"
    stale = sorted(set(GENERATORS) - set(traceable_ops()))
    assert not stale, f"GENERATORS of ops that are gone or do not trace: {stale}"


def test_c_python_and_kernel_shapes_agree(compiled_cases):
    cases, _ = compiled_cases
    assert {c.name for c in cases} == set(traceable_ops())
    disagreements = []
    outcomes = set()
    for case in cases:
        kernel = _kernel_outcome(case.name, case.attrs, case.inputs)
        python = _python_outcome(case.name, case.attrs, case.inputs)
        c = _c_outcome(case)
        outcomes.add(kernel == "error")
        if not kernel == python == c:
            disagreements.append(f"{case}: kernel {kernel}, python {python}, C {c}")
    assert not disagreements, "\n".join(disagreements[:20])
    assert outcomes == {True, False}, "the cases must include both accepted and rejected shapes"


def test_untyped_cases_are_rejected_by_the_kernel(compiled_cases):
    """A case whose dynamic primitive does not type-check must be one the kernel rejects too."""
    _, untyped = compiled_cases
    accepted = [c for c in untyped if _kernel_outcome(c.name, c.attrs, c.inputs) != "error"]
    assert not accepted, f"cases the kernel accepts but typing rejects: {accepted[:5]}"


# ---- coverage: ops whose shape function does not trace into C yet ---------------------------------


def test_not_traced_list_is_exact():
    """``NOT_TRACED`` lists exactly the ops run by the VM whose shape logic does not trace."""
    untraceable = {n for n in op_names() if c_shape_function(get_op(n))[0] == "no"}
    listed = set(NOT_TRACED)
    assert not (listed - untraceable), f"ops that trace now (or are not run by the VM); remove them from " \
                                       f"NOT_TRACED: {sorted(listed - untraceable)}"
    assert not (untraceable - listed), f"ops without a traceable shape logic missing from NOT_TRACED: " \
                                       f"{sorted(untraceable - listed)}"


def test_the_ops_without_a_c_shape_function_by_design_are_those_the_vm_never_runs():
    """unique and the Relay forms (legalized before the VM) and the VM's own ops are "n.a.", not missing; every
    other op has a shape function."""
    from tensorvm.op.relay_forms import RELAY_FORMS

    not_applicable = sorted(n for n in op_names() if c_shape_function(get_op(n))[0] == "n.a.")
    assert not_applicable == sorted(["memory.alloc_storage", "memory.alloc_tensor", "memory.kill", "unique",
                                     "vm.invoke_tvm_op", "vm.reshape_tensor", "vm.shape_func", "vm.shape_of",
                                     *RELAY_FORMS])
    assert all(get_op(n).shape_func is not None for n in op_names() if n not in not_applicable)
    assert "Legalize" in c_shape_function(get_op("nn.conv1d"))[1]
    assert "Legalize" in c_shape_function(get_op("unique"))[1]


def test_a_python_branch_on_a_symbolic_dim_is_reported_not_miscompiled():
    from tensorvm.op.shape_logic import Leaf, tracing

    def branching_logic(op, attrs, shapes, err):
        return (shapes[0][0] + 1,) if shapes[0][0] > 2 else (shapes[0][0],)

    with tracing("my_op"), pytest.raises(ShapeLogicTraceError, match="my_op: .*Python condition"):
        branching_logic("my_op", {}, [(Leaf("shapes[0][0]"),)], ShapeError)


def test_floor_division_and_modulo_of_negatives_follow_python():
    """The C helpers tv_shape_floordiv/floormod against Python's // and % (shape logic's semantics)."""
    from tensorvm.codegen.build import build_library
    from tensorvm.codegen.c_emit import library_text
    from tensorvm.op.shape_logic import Leaf, binary, c_expr

    a, b = Leaf("a"), Leaf("b")
    source = library_text(["tv_shape.h"]) + (
        f"int64_t fdiv(int64_t a, int64_t b) {{ return {c_expr(binary('//', a, b))}; }}\n"
        f"int64_t fmod_(int64_t a, int64_t b) {{ return {c_expr(binary('%', a, b))}; }}\n")
    library = build_library(source)
    import ctypes

    fdiv, fmod = library._cdll.fdiv, library._cdll.fmod_
    for fn in (fdiv, fmod):
        fn.argtypes, fn.restype = [ctypes.c_int64, ctypes.c_int64], ctypes.c_int64
    for x in (-7, -6, -1, 0, 1, 6, 7):
        for y in (-3, -2, -1, 1, 2, 3):
            assert (fdiv(x, y), fmod(x, y)) == (x // y, x % y), (x, y)


def test_lrn_of_an_empty_tensor_is_empty():
    """Found by the differential test: nn.lrn's kernel raised NumPy's ValueError on an empty axis."""
    x = np.zeros((1, 0), "float32")
    out = get_op("nn.lrn").kernel({"axis": -1}, x)
    assert out.shape == (1, 0) and out.dtype == np.float32


def test_resizing_an_empty_dim_into_an_empty_output_is_accepted_like_the_kernel():
    """Found by the differential test: the shape function rejected (1, 2, 0, 0) -> size (0, 4), whose
    output (1, 2, 0, 4) is empty, while the kernel (the interpreter) returns it."""
    opdef = get_op("image.resize2d")
    x = np.zeros((1, 2, 0, 0), "float32")
    assert opdef.shape_func({"size": (0, 4)}, [x.shape]) == [(1, 2, 0, 4)] == [opdef.kernel({"size": (0, 4)}, x).shape]
    with pytest.raises(ShapeError, match="cannot resize the empty"):
        opdef.shape_func({"size": (2, 4)}, [(1, 2, 0, 3)])


@pytest.mark.parametrize("scales, sizes, policy, shape, message", [
    # a 0 dim under keep_aspect_ratio_policy divided by zero (ZeroDivisionError)
    (None, [1, 2, 4, 4], "not_larger", (1, 2, 0, 3), "needs non-empty resized dims"),
    # a NaN scale passed the `s <= 0` check and reached int(NaN)
    ([1.0, 1.0, np.nan, 2.0], None, "stretch", (1, 2, 3, 3), "positive and finite"),
    ([1.0, 1.0, np.inf, 2.0], None, "stretch", (1, 2, 3, 3), "positive and finite"),
    # negative sizes were taken as the output dims
    (None, [1, 2, -1, 4], "stretch", (1, 2, 3, 3), "non-negative"),
    # an empty dim stretched to a non-empty one: the kernel divided by zero
    (None, [1, 2, 4, 4], "stretch", (1, 2, 0, 3), "empty dim to a non-empty"),
])
def test_onnx_resize_rejects_what_it_cannot_size(scales, sizes, policy, shape, message):
    """Bugs of image.resize's former shape function, each now a ShapeError from the shape function, the
    kernel and the C shape function alike (the C one through the differential cases above)."""
    opdef = get_op("image.resize")
    scales = np.zeros(0, "float32") if scales is None else np.array(scales, "float32")
    sizes = np.zeros(0, "int64") if sizes is None else np.array(sizes, "int64")
    attrs = {"keep_aspect_ratio_policy": policy}
    with pytest.raises(ShapeError, match=message):
        opdef.shape_func(attrs, [shape, np.zeros(0, "float32"), scales, sizes])
    with pytest.raises(ShapeError, match=message):
        opdef.kernel(attrs, np.zeros(shape, "float32"), np.zeros(0, "float32"), scales, sizes)


def test_onnx_resize_sizes_by_policy_against_hand_values():
    """keep_aspect_ratio_policy: one ratio for the resized axes, floor(dim * ratio + 0.5) (ONNX's rule)."""
    opdef = get_op("image.resize")
    empty = np.zeros(0, "float32")
    sizes = np.array([10, 10], "int64")
    for policy, expected in (("not_larger", (1, 1, 10, 5)), ("not_smaller", (1, 1, 20, 10)),
                             ("stretch", (1, 1, 10, 10))):
        attrs = {"keep_aspect_ratio_policy": policy, "axes": (2, 3)}
        assert opdef.shape_func(attrs, [(1, 1, 4, 2), empty, empty, sizes]) == [expected]
    # an empty input resized by scales, or stretched to an empty size, is an empty output (as the kernel gives)
    x = np.zeros((1, 1, 0, 2), "float32")
    out = opdef.kernel({}, x, empty, np.array([1, 1, 2, 1.5], "float32"), np.zeros(0, "int64"))
    assert out.shape == (1, 1, 0, 3)


def test_traces_of_concurrent_threads_stay_apart():
    """Each thread records its requires in its own trace (executables may be built concurrently)."""
    import threading

    from tensorvm.op.shape_logic import Leaf, require, tracing

    barrier, recorded = threading.Barrier(2), {}

    def trace(name):
        with tracing(name) as t:
            barrier.wait()
            require(Leaf(f"{name}_dim") > 0, f"{name} check", ShapeError)
            barrier.wait()
        recorded[name] = [message for _, message, _ in t.requires]

    threads = [threading.Thread(target=trace, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert recorded == {"a": ["a check"], "b": ["b check"]}


def test_a_grouped_conv_nd_kernel_rejects_channels_the_groups_do_not_cover():
    """Found by the differential test: with 3 data channels, group 2 and a weight of 1 channel per group,
    the NumPy kernel sliced channels 0 and 1 and ignored channel 2 instead of reporting the mismatch."""
    x, w = np.ones((2, 3, 2, 4), "float32"), np.ones((4, 1, 1, 3), "float32")
    with pytest.raises(ShapeError, match="3 channels but weight x group = 1 x 2"):
        get_op("nn.conv_nd").kernel({"group": 2, "auto_pad": "SAME_LOWER"}, x, w)


def test_the_recurrent_and_roi_align_kernels_check_what_their_shape_logics_check():
    """Found while writing their logics: the NumPy kernel of vision.onnx_roi_align answered for more
    batch_indices than regions without a word, and nn.gru's raised NumPy's "array split does not result in
    an equal division" for W of the wrong gate count; both now check the op's shape logic first, like the
    C library calls' entry checks."""
    x, w, r = np.zeros((2, 1, 3), "float32"), np.zeros((1, 4, 3), "float32"), np.zeros((1, 4, 2), "float32")
    empty = np.zeros((0,), "float32")
    with pytest.raises(ShapeError, match="W's second dim and gates x hidden_size must match, got 4 and 6"):
        get_op("nn.gru").kernel({"hidden_size": 2}, x, w, r, empty, np.zeros((0,), "int32"), empty)
    rois, batches = np.zeros((2, 4), "float32"), np.zeros((3,), "int64")
    with pytest.raises(ShapeError, match="batch_indices"):
        get_op("vision.onnx_roi_align").kernel({}, np.zeros((1, 1, 4, 4), "float32"), rois, batches)


def test_attention_rejects_keys_of_another_batch():
    """Found while writing its logic: nn.attention's kernel reshaped 3-d K (2, 1, 2) of batch 2 for Q's
    batch 1 into one head of size 4, matching Q's, and answered; the shape function and kernel now say no."""
    q, k, v = np.ones((1, 1, 4), "float32"), np.ones((2, 1, 2), "float32"), np.ones((1, 1, 2), "float32")
    empty, attrs = np.zeros((0,), "float32"), {"q_num_heads": 1, "kv_num_heads": 1}
    with pytest.raises(ShapeError, match="the same batch, got 2 and 1"):
        get_op("nn.attention").kernel(attrs, q, k, v, empty, empty, empty, np.zeros((0,), "int64"))
    with pytest.raises(ShapeError, match="the same batch"):
        get_op("nn.attention").shape_func(attrs, [a.shape for a in (q, k, v, empty, empty, empty, empty)])


def test_a_max_pool_nd_with_indices_of_an_empty_output_is_empty():
    """Found by the differential test: nn.pool_nd (max, return_indices) of a (1, 2, 1, 4) input with a window
    of 2 rows has an empty output (1, 2, 0, 2), which its shape function gives, but the kernel raised
    NumPy's "cannot reshape array of size 0" taking the argmax."""
    attrs = {"kernel_shape": (2, 1), "strides": (2, 2), "mode": "max", "return_indices": True, "pads": (0, 0, 0, 0)}
    out, index = get_op("nn.pool_nd").kernel(attrs, np.ones((1, 2, 1, 4), "float32"))
    assert out.shape == index.shape == (1, 2, 0, 2) and index.dtype == np.int64
