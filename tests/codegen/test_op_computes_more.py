"""Computes declared next to their ops (creation, shape queries, the dyn.* forms, einsum, the ONNX
importer's N-d convolutions and pools, attention, rotary embedding), generated as C, against each op's
NumPy kernel; and programs using them run on target c without NumPy fallbacks.

The cases and checks are those of ``test_op_computes``: two kernels per dtype (static shapes, and ``?``
dims), compiled into one library, each compared with the NumPy kernel on several random inputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import test_op_computes as base
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import Case, dims, make_inputs, primitive, unary

from tensorvm.codegen.fused import build_fused_module
from tensorvm.op import get_op, op_names

F32, F64, F16 = "float32", "float64", "float16"


def _arange_values(kind):
    def values(rng, shape, dtype, index):
        if index == 2:  # a nonzero step of either sign
            step = int(rng.integers(1, 4)) * int(rng.choice([-1, 1]))
            return np.array(step * (0.75 if kind == "f" else 1), dtype)
        return np.array(rng.integers(-6, 7) * (1.25 if kind == "f" else 1), dtype)

    return values


def _shape_tensor(low, high):
    def values(rng, shape, dtype, index):
        return rng.integers(low, high + 1, size=shape).astype(dtype) if np.dtype(dtype).kind in "iu" and \
            shape else None

    return values


def _scalar_input(position, low, high):
    def values(rng, shape, dtype, index):
        return np.array(rng.integers(low, high + 1), dtype) if index == position else None

    return values


def _squeeze_axes(rng, shape, dtype, index):
    return np.array([int(rng.choice([1, -2]))], dtype) if index == 1 else None


def _one_hot_values(rng, shape, dtype, index):
    if index == 0:
        return rng.integers(-1, 5, size=shape).astype(dtype)
    if index == 3:
        return np.array(rng.integers(0, 5), dtype)
    return None


def _spatial(rank: int, low: int = 4, high: int = 7):
    return lambda rng: [(int(rng.integers(1, 3)), 2) + dims(rng, rank, low, high)]


_POOLS = [
    (2, (3, 3), {"strides": (2, 2)}),
    (2, (3, 3), {"strides": (2, 2), "pads": (1, 1, 1, 1)}),
    (2, (2, 3), {"strides": (2, 1), "pads": (0, 1, 1, 0), "dilations": (1, 2), "ceil_mode": True}),
    (2, (3, 3), {"strides": (2, 2), "ceil_mode": True}),
    (2, (3, 3), {"auto_pad": "SAME_UPPER", "strides": (2, 2)}),
    (2, (2, 3), {"auto_pad": "SAME_LOWER", "strides": (1, 2)}),
    (2, (2, 2), {"auto_pad": "VALID", "pads": (1, 1, 1, 1)}),
    (1, (3,), {"strides": (2,), "pads": (1, 2)}),
    (3, (2, 2, 2), {"strides": (1, 2, 2), "pads": (1, 0, 0, 0, 1, 1)}),
    (2, (3, 3), {"strides": (2, 2), "pads": (1, 1, 1, 1), "return_indices": True}),
    (1, (2,), {"strides": (1,), "pads": (1, 1), "ceil_mode": True, "return_indices": True}),
    (2, (3, 3), {"mode": "avg", "strides": (2, 2), "pads": (1, 1, 1, 1)}),
    (2, (3, 2), {"mode": "avg", "strides": (2, 2), "pads": (1, 0, 2, 1), "count_include_pad": True,
                 "ceil_mode": True}),
    (2, (3, 3), {"mode": "avg", "auto_pad": "SAME_UPPER", "strides": (2, 2), "count_include_pad": True}),
    (3, (2, 2, 2), {"mode": "avg", "strides": (2, 2, 2), "ceil_mode": True}),
    (1, (3,), {"mode": "avg", "pads": (2, 2), "dilations": (2,)}),
    (2, (2, 2), {"mode": "lp", "p": 2, "pads": (1, 1, 0, 0)}),
    (1, (3,), {"mode": "lp", "p": 3, "strides": (2,), "ceil_mode": True}),
]


def _conv_sample(rank, kernel, channels, out, group, low=3, high=7):
    return lambda rng: [(int(rng.integers(1, 3)), channels) + dims(rng, rank, low, high),
                        (out, channels // group) + tuple(kernel)]


def _conv_t_sample(rank, kernel, channels, out, group, low=1, high=4):
    return lambda rng: [(int(rng.integers(1, 3)), channels) + dims(rng, rank, low, high),
                        (channels, out // group) + tuple(kernel)]


_CONVS = [  # rank, kernel, in-channels, out-channels, group, attrs
    (2, (3, 3), 3, 4, 1, {}),
    (2, (3, 3), 4, 4, 2, {"strides": (2, 1), "pads": (1, 0, 2, 1), "dilations": (1, 2)}),
    (2, (3, 2), 2, 3, 1, {"auto_pad": "SAME_UPPER", "strides": (2, 2)}),
    (2, (2, 3), 4, 4, 4, {"auto_pad": "SAME_LOWER"}),
    (1, (3,), 2, 3, 1, {"strides": (2,), "pads": (1, 2)}),
    (3, (2, 2, 2), 2, 2, 1, {"pads": (1, 0, 0, 0, 1, 1), "strides": (1, 2, 1)}),
]

_CONV_TS = [
    (2, (3, 3), 2, 3, 1, {}),
    (2, (3, 2), 4, 4, 2, {"strides": (2, 3), "pads": (1, 0, 0, 1), "dilations": (1, 2), "output_padding": (1, 0)}),
    (2, (3, 3), 2, 2, 1, {"auto_pad": "SAME_UPPER", "strides": (2, 2)}),
    (2, (2, 3), 2, 2, 1, {"auto_pad": "SAME_LOWER", "strides": (2, 1)}),
    (1, (3,), 2, 3, 1, {"strides": (2,), "output_padding": (1,)}),
    (3, (2, 2, 2), 2, 2, 1, {"strides": (1, 2, 2), "pads": (0, 1, 0, 1, 0, 0)}),
]


def _shapes(*shapes):
    """Shapes with letters for dims drawn in [1, 4] (one value per letter, so equal letters agree)."""
    def sample(rng):
        drawn = {}
        return [[tuple(d if isinstance(d, int) else drawn.setdefault(d, int(rng.integers(1, 5))) for d in s)
                 for s in shapes]]

    return sample


_EINSUMS = [  # equation, sample, dtypes, static axes, label
    ("ij,jk->ik", _shapes(("m", "k"), ("k", "n")), ((F32, F32), ("int8", "int8")), (), "matmul"),
    ("ij,jk", _shapes(("m", "k"), ("k", "n")), ((F32, F32),), (), "implicit"),
    ("bij,bjk->bik", _shapes(("b", "m", "k"), ("b", "k", "n")), ((F64, F64), (F16, F16)), (), "batched"),
    ("ii->i", _shapes(("n", "n")), ((F32,),), (), "diagonal"),
    ("ii", _shapes(("n", "n")), (("int32",),), (), "trace"),
    ("ij->", _shapes(("n", "m")), ((F32,),), (), "total"),
    ("...ij,...jk->...ik", _shapes(("b", 1, "n", "k"), ("c", "k", "m")), ((F32, F32),), (), "ellipsis"),
    ("i,j->ij", _shapes(("n",), ("m",)), ((F32, F32), ("int32", "int64")), (), "outer"),
    ("bhqd,bhkd->bhqk", _shapes(("b", "h", "q", "d"), ("b", "h", "k", "d")), ((F32, F32),), (), "attention"),
    ("i,i->", _shapes((1,), ("n",)), ((F32, F32),), ((0,), ()), "broadcast_letter"),
    ("ij,ij->ij", _shapes(("n", "m"), ("n", "m")), (("bool", "bool"),), (), "bool"),
    ("ijk->kji", _shapes(("n", "m", "k")), ((F32,),), (), "transpose"),
]


_ROTARY = [  # 4-d input, position_ids given, attrs
    (True, True, {}),
    (True, True, {"interleaved": True}),
    (True, False, {"rotary_embedding_dim": 4}),
    (False, True, {"num_heads": 2}),
    (False, True, {"num_heads": 2, "interleaved": True, "rotary_embedding_dim": 4}),
    (False, False, {"num_heads": 3}),
]


def _rotary_sample(four_d, positions, attrs, head=6, max_pos=9):
    def sample(rng):
        b, s = int(rng.integers(1, 3)), int(rng.integers(1, 5))
        heads = attrs.get("num_heads") or int(rng.integers(1, 3))
        x = (b, heads, s, head) if four_d else (b, s, heads * head)
        rot = attrs.get("rotary_embedding_dim") or head
        cache = (max_pos, rot // 2) if positions else (b, s, rot // 2)
        return [x, cache, cache, (b, s) if positions else (0,)]

    return sample


def _rotary_values(rng, shape, dtype, index):
    return rng.integers(0, 9, size=shape).astype(dtype) if index == 3 else None


def _attention_sample(three_d=False, heads=(2, 2), mask=None, past=False, nonpad=False, head=4):
    """Q, K, V (4-d (B, H, S, D) or 3-d (B, S, H*D)), then mask, past key/value, nonpad lengths; ``(0,)``
    stands for an omitted input. ``mask``: None, or a function (batch, heads, sq, total) -> shape."""
    hq, hk = heads

    def sample(rng):
        b, sq, skv = int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(1, 5))
        p = int(rng.integers(1, 3)) if past else 0
        if three_d:
            q, k, v = (b, sq, hq * head), (b, skv, hk * head), (b, skv, hk * (head + 1))
        else:
            q, k, v = (b, hq, sq, head), (b, hk, skv, head), (b, hk, skv, head + 1)
        cache = ((b, hk, p, head), (b, hk, p, head + 1)) if past else ((0,), (0,))
        return [q, k, v, mask(b, hq, sq, p + skv) if mask else (0,), *cache, (b,) if nonpad else (0,)]

    return sample


def _attention_static(shape):
    """Head counts and sizes stay static in the dynamic kernel (3-d: the hidden dim), omitted inputs too."""
    three_d = shape.get("three_d", False)
    heads = (2,) if three_d else (1, 3)
    static = [heads, heads, heads]
    static.append(() if shape.get("mask") else "all")
    static += [(1, 3), (1, 3)] if shape.get("past") else ["all", "all"]
    static.append(() if shape.get("nonpad") else "all")
    return tuple(static)


def _attention_values(rng, shape, dtype, index):
    if index == 6 and shape != (0,):  # key lengths at least the query length, at most the keys
        return rng.integers(3, 5, size=shape).astype(dtype)
    if index == 3 and np.dtype(dtype).kind == "f":
        return np.where(rng.random(shape) < 0.2, -np.inf, rng.standard_normal(shape)).astype(dtype)
    return None


_A4 = (F32, F32, F32, F32, F32, F32, "int64")
_ATTENTIONS = [  # sample arguments, dtypes, attrs, label
    ({}, (_A4,), {}, "plain"),
    ({"heads": (4, 2)}, (_A4,), {"is_causal": True, "qk_matmul_output_mode": 1}, "gqa_causal"),
    ({"mask": lambda b, h, q, t: (q, t)}, (_A4,), {"scale": 0.3, "qk_matmul_output_mode": 2}, "mask2d"),
    ({"mask": lambda b, h, q, t: (b, 1, q, max(t - 1, 1))}, ((F32, F32, F32, "bool", F32, F32, "int64"),),
     {"qk_matmul_output_mode": 3}, "short_bool_mask"),
    ({"past": True}, (_A4,), {"is_causal": True, "left_window_size": 1}, "past_window"),
    ({"nonpad": True}, (_A4,), {"right_window_size": 0, "softcap": 2.0}, "nonpad_softcap"),
    ({"three_d": True, "heads": (2, 1)}, (_A4,), {"q_num_heads": 2, "kv_num_heads": 1, "is_causal": True},
     "three_d"),
    ({"three_d": True, "past": True, "mask": lambda b, h, q, t: (q, t)}, (_A4,),
     {"q_num_heads": 2, "kv_num_heads": 2}, "three_d_past_mask"),
]


CASES = [
    # ---- creation and shape queries ----
    Case("arange", lambda rng: [(), (), ()], (("int32", "int32", "int32"), ("int64", "int8", "int64")),
         attrs={"dtype": "int32"}, values=_arange_values("i")),
    Case("arange", lambda rng: [(), (), ()], ((F32, F32, F32), ("int32", F64, F32)), values=_arange_values("f")),
    Case("arange", lambda rng: [(), (), ()], (("int16", "int16", "int16"),), attrs={"dtype": "float64"},
         values=_arange_values("i"), label="int_to_f64"),
    Case("shape_of", unary(0, 3), (F32, "int8")),
    Case("shape_of", unary(1, 3), (F32,), attrs={"dtype": "int64"}),
    Case("ndarray_size", unary(0, 3), (F32,)),
    Case("ndarray_size", unary(1, 2), ("uint8",), attrs={"dtype": "int64"}),
    Case("dyn.zeros", lambda rng: [(3,)], ("int64",), static=("all",), values=_shape_tensor(0, 3)),
    Case("dyn.ones", lambda rng: [(2,)], ("int32",), attrs={"dtype": "int8"}, static=("all",),
         values=_shape_tensor(0, 3)),
    Case("dyn.full", lambda rng: [(), (2,)], ((F32, "int64"), (F64, "int32")), static=((), "all"),
         values=_shape_tensor(0, 3)),
    Case("dyn.full", lambda rng: [(), (1,)], ((F32, "int64"),), attrs={"dtype": "int16"}, static=((), "all"),
         values=_shape_tensor(0, 4)),
    # ---- dyn data movement ----
    Case("dyn.expand_dims", lambda rng: [dims(rng, 2, 0, 3), ()], ((F32, "int64"), ("int8", "int32")),
         values=_scalar_input(1, -3, 2)),
    Case("dyn.expand_dims", lambda rng: [dims(rng, 2, 0, 3), ()], ((F32, "int64"),), attrs={"num_newaxis": 2},
         values=_scalar_input(1, -3, 2)),
    Case("dyn.squeeze", lambda rng: [(int(rng.integers(0, 4)), 1, int(rng.integers(0, 4))), (1,)],
         ((F32, "int64"),), static=((1,), "all"), values=_squeeze_axes),
    Case("dyn.tile", lambda rng: [dims(rng, 2, 0, 3), (3,)], ((F32, "int64"), ("int16", "int32")),
         static=((), "all"), values=_shape_tensor(0, 3)),
    Case("dyn.tile", lambda rng: [dims(rng, 3, 0, 3), (2,)], ((F32, "int64"),), static=((), "all"),
         values=_shape_tensor(0, 2), label="short_reps"),
    Case("dyn.one_hot", lambda rng: [dims(rng, 2, 0, 3), (), (), ()], (("int32", F32, F32, "int64"),),
         values=_one_hot_values),
    Case("dyn.one_hot", lambda rng: [dims(rng, 2, 0, 3), (), (), ()], (("int64", "int8", "int8", "int32"),),
         attrs={"axis": 0, "dtype": F32}, values=_one_hot_values),
    Case("nn.dropout", unary(0, 3), (F32, "int8")),
    # ---- ONNX N-d pooling ----
    *[Case("nn.pool_nd", _spatial(rank), (F32,), attrs=dict(attrs, kernel_shape=kernel), static=((1,),))
      for rank, kernel, attrs in _POOLS],
    Case("nn.pool_nd", _spatial(2), (F64, F16, "int8"), attrs={"kernel_shape": (2, 2), "pads": (1, 0, 0, 1)},
         static=((1,),)),
    Case("nn.pool_nd", _spatial(2), (F16, "int32"), attrs={"kernel_shape": (3, 2), "mode": "avg",
                                                            "pads": (1, 1, 1, 1), "strides": (2, 1)},
         static=((1,),)),
    # ---- einsum ----
    *[Case("einsum", sample, dtypes, attrs={"equation": equation}, tuple_input=True, static=static,
           label=label)
      for equation, sample, dtypes, static, label in _EINSUMS],
    # ---- rotary embedding ----
    *[Case("nn.rotary_embedding", _rotary_sample(four_d, positions, attrs), ((F32, F32, F32, "int64"),),
           attrs=attrs, values=_rotary_values, static=((3,) if four_d else (2,), (), (), "all" if not positions else ()),
           label=f"{'4d' if four_d else '3d'}_{'pos' if positions else 'nopos'}_" + "_".join(map(str, attrs.values())))
      for four_d, positions, attrs in _ROTARY],
    Case("nn.rotary_embedding", _rotary_sample(True, True, {}), ((F16, F16, F16, "int64"),), values=_rotary_values,
         static=((3,),)),
    # ---- attention ----
    *[Case("nn.attention", _attention_sample(**shape), dtypes, attrs=attrs, values=_attention_values,
           static=_attention_static(shape), label=label)
      for shape, dtypes, attrs, label in _ATTENTIONS],
    # ---- ONNX N-d convolutions ----
    *[Case("nn.conv_nd", _conv_sample(rank, kernel, channels, out, group), (F32,), attrs=dict(attrs, group=group),
           static=((1,), "all"))
      for rank, kernel, channels, out, group, attrs in _CONVS],
    Case("nn.conv_nd", _conv_sample(2, (2, 2), 2, 3, 1), (F64, F16), attrs={"pads": (1, 0, 0, 1)},
         static=((1,), "all")),
    *[Case("nn.conv_transpose_nd", _conv_t_sample(rank, kernel, channels, out, group), (F32,),
           attrs=dict(attrs, group=group), static=((1,), "all"))
      for rank, kernel, channels, out, group, attrs in _CONV_TS],
    Case("nn.conv_transpose_nd", _conv_t_sample(1, (3,), 2, 3, 1, low=3, high=5), (F32,),
         attrs={"strides": (2,), "output_shape": (8,)}, static=((1,), "all")),
    Case("nn.conv_transpose_nd", _conv_t_sample(2, (2, 2), 2, 2, 1), (F16, F64), attrs={"strides": (2, 1)},
         static=((1,), "all")),
]


def _kernels():
    out = []
    for case in CASES:
        rng = np.random.default_rng(0)
        shapes = case.sample(rng)
        for dtype in case.dtypes:
            for dynamic in ((False, True) if case.dynamic else (False,)):
                out.append((case, dtype, dynamic, case.name(dtype, dynamic), shapes))
    return out


KERNELS = _kernels()
STATIC = [k for k in KERNELS if not k[2]]
DYNAMIC = [k for k in KERNELS if k[2]]


@pytest.fixture(scope="module")
def compiled():
    _, kernels = build_fused_module({name: primitive(case, shapes, dtype, dynamic)
                                     for case, dtype, dynamic, name, shapes in KERNELS})
    return kernels


@pytest.mark.parametrize("case,dtype,dynamic,name,static_shapes", STATIC, ids=[k[3] for k in STATIC])
def test_static_kernel_matches_numpy(compiled, case, dtype, dynamic, name, static_shapes):
    for seed in range(3):
        arrays = make_inputs(case, np.random.default_rng(seed), static_shapes, dtype)
        base._check(compiled[name], case, name, arrays)


@pytest.mark.parametrize("case,dtype,dynamic,name,static_shapes", DYNAMIC, ids=[k[3] for k in DYNAMIC])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_dynamic_kernel_matches_numpy(compiled, case, dtype, dynamic, name, static_shapes, seed):
    rng = np.random.default_rng(seed)
    arrays = make_inputs(case, rng, base._conforming_sample(case, rng, static_shapes), dtype)
    base._check(compiled[name], case, name, arrays)


def test_transposed_convolution_beyond_its_full_result_is_zero_extended():
    """output_shape (8) beyond the full result (5 = (2 - 1) x 2 + 3): the full result, then zeros (ONNX
    Runtime's reading: the total padding clamped at 0). Oracle by hand: two ones, stride 2, a 3-tap kernel
    of ones over 2 input channels give 2, 2, 4, 2, 2; and the NumPy kernel."""
    case = Case("nn.conv_transpose_nd", None, attrs={"strides": (2,), "output_shape": (8,)}, static=((1,), "all"))
    _, kernels = build_fused_module({"k": primitive(case, [(1, 2, 2), (2, 3, 3)], F32, True)})
    x, w, out = np.ones((1, 2, 2), F32), np.ones((2, 3, 3), F32), np.full((1, 3, 8), np.nan, F32)
    kernels["k"](x, w, out)
    want = np.tile(np.array([2, 2, 4, 2, 2, 0, 0, 0], F32), (1, 3, 1))
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(get_op("nn.conv_transpose_nd").kernel(
        get_op("nn.conv_transpose_nd").normalize_attrs({"strides": (2,), "output_shape": (8,)}), x, w), want)


# ---- whole programs on target c ---------------------------------------------------------------------


def _program():
    """One program using every op of this file, with dynamic dims: its inputs and the oracle's outputs."""
    from tensorvm import op
    from tensorvm.ir.expr import Constant, Tuple, TupleGetItem, Var
    from tensorvm.ir.types import Any, TensorType

    def var(name, shape, dtype=F32):
        return Var(name, TensorType(tuple(Any() if d == "?" else d for d in shape), dtype))

    x, w, wt = var("x", (1, 2, "?", 6)), var("w", (4, 2, 3, 3)), var("wt", (4, 2, 2, 2))
    seq, reps, n = var("seq", (1, 2, "?", 4)), var("reps", (2,), "int64"), var("n", (), "int64")
    cos, sin, pos = var("cos", (8, 2)), var("sin", (8, 2)), var("pos", (1, "?"), "int64")
    empty = Constant(np.zeros((0,), F32))
    conv = op.nn.conv_nd(x, w, pads=(1, 1, 1, 1))
    pooled = op.nn.pool_nd(conv, kernel_shape=(2, 2), strides=(2, 2), mode="avg", ceil_mode=True)
    maxed = op.nn.pool_nd(conv, kernel_shape=(3,) * 2, auto_pad="SAME_UPPER", strides=(2, 2))
    up = op.nn.conv_transpose_nd(pooled, wt, strides=(2, 2))
    dropped = TupleGetItem(op.nn.dropout(maxed), 0)
    rotated = op.nn.rotary_embedding(seq, cos, sin, pos)
    attended = TupleGetItem(op.nn.attention(rotated, seq, seq, empty, empty, empty, Constant(np.zeros((0,), "int64")),
                                            is_causal=True), 0)
    mixed = op.einsum(Tuple([attended, seq]), equation="bhqd,bhkd->bhqk")
    count = op.cast(op.ndarray_size(mixed, dtype="int64"), dtype=F32)
    ramp = op.arange(Constant(np.array(0, "int64")), n, Constant(np.array(1, "int64")), dtype=F32)
    tiled = op.dyn.tile(op.dyn.expand_dims(ramp, Constant(np.array(0, "int64"))), reps)
    filled = op.dyn.full(Constant(np.array(2.5, F32)), op.shape_of(tiled, dtype="int64"))
    body = Tuple([up, dropped, mixed, op.add(tiled, filled), count])
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((1, 2, 7, 6)).astype(F32), rng.standard_normal((4, 2, 3, 3)).astype(F32),
            rng.standard_normal((4, 2, 2, 2)).astype(F32), rng.standard_normal((1, 2, 3, 4)).astype(F32),
            np.array([2, 3], "int64"), np.array(5, "int64"), rng.standard_normal((8, 2)).astype(F32),
            rng.standard_normal((8, 2)).astype(F32), np.array([[4, 0, 7]], "int64")]
    return [x, w, wt, seq, reps, n, cos, sin, pos], body, args


def test_a_program_of_these_ops_runs_on_target_c_without_numpy_fallbacks():
    import tensorvm as tv
    from tensorvm.ir.expr import Function

    params, body, args = _program()
    mod = tv.IRModule.from_expr(Function(params, body))
    exe = tv.vm.compile(mod, target="c")
    assert exe.stats()["kernel_library"]["numpy_fallbacks"] == {}
    got = tv.vm.VirtualMachine(exe).invoke("main", *args)
    want = tv.vm.VirtualMachine(tv.vm.compile(mod, target="python")).invoke("main", *args)
    assert len(got) == len(want) == 5
    for g, r in zip(got, want, strict=True):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-5, atol=1e-5)


# The computes of the Relay parity ops (and the image.* ops) are tested with their ops, in these files
# of tests/ops.
# Op modules whose computes are tested in a file of their own (paths under tests/); the ONNX-facing
# dyn.* ops are tested through the importer, against ONNX Runtime / ONNX's reference evaluator.
_TESTED_WITH_THEIR_OPS = {"tensorvm.op.image": "ops/test_image_ops.py", "tensorvm.op.nn_relay": "ops/test_nn_relay_ops.py",
                          "tensorvm.op.transform_relay": "ops/test_transform_relay_ops.py",
                          "tensorvm.op.dynamic": "frontend/test_onnx_dynamic_lowering.py",
                          "tensorvm.op.recurrent": "ops/test_recurrent_cells.py"}


def _own_test_file(name: str, module: str) -> Path | None:
    file = "ops/test_image_ops.py" if name.startswith("image.") else _TESTED_WITH_THEIR_OPS.get(module)
    return Path(__file__).parents[1] / file if file else None


def test_every_compute_is_tested():
    """Every compute has a case here or in test_op_computes, or is tested in its op test file, which
    must name or call the op. (Which ops still lack a compute: tests/ops/test_op_declarations.py.)"""
    tested = {case.op for case in base.CASES} | {case.op for case in CASES}
    untested = []
    for name in op_names():
        opdef = get_op(name)
        if opdef.compute is None or name in tested or not opdef.defined_in.startswith("tensorvm.op."):
            continue
        own = _own_test_file(name, opdef.defined_in)
        text = own.read_text() if own else ""
        if f'"{name}"' not in text and f"{name}(" not in text:  # checked by name, or called in a program
            untested.append(name)
    assert untested == []


@pytest.mark.parametrize("source", ["float32", "float64"])
@pytest.mark.parametrize("target", ["uint32", "uint64"])
def test_float_to_wide_unsigned_cast_wraps_negatives_like_numpy(source, target):
    """A finite float in int64's range cast to uint32/uint64 is its truncation modulo 2^bits (NumPy's cast here),
    in a static and a dynamic kernel alike: a bare C conversion (undefined outside the unsigned range) gave
    UINT_MAX for -300 in the dynamic kernel and the truncation in the static one."""
    import tensorvm as tv

    values = [-300.0, -1.5, -2.0 ** 31, 3e9, 1e10, 2.0, 0.0]
    x = np.array(values, source)
    bits = 32 if target == "uint32" else 64
    expected = np.array([int(np.trunc(v)) % (1 << bits) for v in x.astype(np.float64)], target)
    for shape in ("7", "?"):
        mod = tv.parse(f'def @main(%x: Tensor[({shape}), {source}]) {{ cast(%x, dtype="{target}") }}')
        for mode in ("bytecode", "native"):
            got = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", exec_mode=mode)).run(x).numpy()
            np.testing.assert_array_equal(got, expected)
