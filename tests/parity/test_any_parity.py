"""Parity with TVM's ``test_any.py`` and the ``dyn`` op tests: every op family with ``?`` dims (and
data-dependent output shapes), run on every executor and compared with NumPy.

Most cases are rows of ``CASES``: Relay text, a function making the inputs, and an independent NumPy
oracle. Cases that need more (errors, type-inference checks, several runs) are separate tests.
"""

from __future__ import annotations

import numpy as np
import pytest
from parity_harness import parse
from programs import check_result

import tensorvm as tv
from tensorvm.errors import ShapeError, TypeInferenceError

F32 = "float32"


def rand(*shape, dtype=F32, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if np.dtype(dtype).kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(-5, 6, shape).astype(dtype)


def positive(*shape, seed=0):
    return (np.abs(rand(*shape, seed=seed)) + 0.1).astype(F32)


# --- independent NumPy oracles for the NN ops ------------------------------------------------------
def conv2d_nchw(x, w, stride=1, pad=0, dilation=1):
    """out[n, o, i, j] = sum_{c, p, q} xpad[n, c, i*s + p*d, j*s + q*d] * w[o, c, p, q]."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out_h = (h + 2 * pad - dilation * (kh - 1) - 1) // stride + 1
    out_w = (wd + 2 * pad - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, o, out_h, out_w))
    for p in range(kh):
        for q in range(kw):
            window = xp[:, :, p * dilation:p * dilation + stride * (out_h - 1) + 1:stride,
                        q * dilation:q * dilation + stride * (out_w - 1) + 1:stride]
            out += np.einsum("nchw,oc->nohw", window, w[:, :, p, q].astype(np.float64))
    return out.astype(x.dtype)


def conv2d_transpose_nchw(x, w, stride=1, pad=0):
    """Scatter every input pixel times the (in, out, kh, kw) kernel, then crop ``pad`` from each side."""
    n, c, h, wd = x.shape
    _, o, kh, kw = w.shape
    full = np.zeros((n, o, (h - 1) * stride + kh, (wd - 1) * stride + kw))
    for i in range(h):
        for j in range(wd):
            full[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw] += np.einsum(
                "nc,copq->nopq", x[:, :, i, j].astype(np.float64), w.astype(np.float64))
    return full[:, :, pad:full.shape[2] - pad, pad:full.shape[3] - pad].astype(x.dtype)


def pool2d(x, size, stride, reduce):
    n, c, h, w = x.shape
    out_h, out_w = (h - size) // stride + 1, (w - size) // stride + 1
    out = np.empty((n, c, out_h, out_w), x.dtype)
    for i in range(out_h):
        for j in range(out_w):
            out[:, :, i, j] = reduce(x[:, :, i * stride:i * stride + size, j * stride:j * stride + size], axis=(2, 3))
    return out


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# --- the table ---------------------------------------------------------------------------------------
CASES: dict[str, tuple] = {}


def case(name, text, args_fn, expected_fn, rtol=1e-5, atol=1e-6):
    assert name not in CASES, name
    CASES[name] = (text, args_fn, expected_fn, rtol, atol)


def main(params: str, body: str) -> str:
    return f"def @main({params}) {{ {body} }}"


X2 = "%x: Tensor[(?, ?), float32]"
X3 = "%x: Tensor[(?, ?, ?), float32]"
X4 = "%x: Tensor[(?, ?, ?, ?), float32]"

# broadcast and elementwise
case("broadcast_any_vs_1", main(f"{X2}, %y: Tensor[(1, ?), float32]", "add(%x, %y)"),
     lambda: (rand(3, 4), rand(1, 4, seed=1)), np.add)
case("broadcast_any_vs_value", main(f"{X2}, %y: Tensor[(3, 4), float32]", "subtract(%x, %y)"),
     lambda: (rand(1, 4), rand(3, 4, seed=1)), np.subtract)
case("broadcast_rank_3_vs_2", main(f"{X3}, %y: Tensor[(?, 1), float32]", "multiply(%x, %y)"),
     lambda: (rand(2, 3, 4), rand(3, 1, seed=1)), np.multiply)
case("broadcast_rank_4_vs_scalar", main(f"{X4}, %y: float32", "divide(%x, %y)"),
     lambda: (rand(2, 1, 3, 2), np.float32(4)), np.divide)
case("broadcast_int_compare", main("%x: Tensor[(?, 1), int32], %y: Tensor[(?), int32]", "greater(%x, %y)"),
     lambda: (rand(3, 1, dtype="int32"), rand(5, dtype="int32", seed=1)), np.greater)
case("consecutive_broadcast",
     main(f"{X2}, %y: Tensor[(?, 1), float32], %z: Tensor[(1, ?), float32], %w: Tensor[(?, ?), float32]",
          "add(multiply(add(%x, %y), %z), %w)"),
     lambda: (rand(1, 1), rand(3, 1, seed=1), rand(1, 4, seed=2), rand(3, 4, seed=3)),
     lambda x, y, z, w: (x + y) * z + w)
case("fused_add_multiply", main(X2, "multiply(add(%x, 1f), 2f)"), lambda: (rand(3, 5),), lambda x: (x + 1) * 2)
for _name, _np in (("sqrt", np.sqrt), ("negative", np.negative), ("exp", np.exp), ("round", np.round)):
    case(f"elemwise_{_name}", main(X2, f"{_name}(%x)"),
         (lambda: (positive(3, 4),)) if _name == "sqrt" else (lambda: (rand(3, 4) * 3,)), _np)
case("where_broadcast", main("%c: Tensor[(?, 1), bool], %x: Tensor[(?), float32], %y: Tensor[(1, ?), float32]",
                             "where(%c, %x, %y)"),
     lambda: (rand(3, 1, dtype=bool), rand(4), rand(1, 4, seed=1)), np.where)
case("where_scalar_condition_feeds_take",
     main("%c: bool, %x: Tensor[(?), float32], %y: Tensor[(?), float32]",
          "take(where(%c, %x, %y), 1)"),
     lambda: (np.bool_(False), rand(3), rand(3, seed=1)), lambda c, x, y: np.where(c, x, y)[1])

# creation
case("zeros_like_rank3", main(X3, "zeros_like(%x)"), lambda: (rand(2, 3, 4),), np.zeros_like)
case("ones_like_rank5", main("%x: Tensor[(?, ?, ?, ?, ?), float32]", "ones_like(%x)"),
     lambda: (rand(1, 2, 1, 3, 2),), np.ones_like)
case("full_like", main(f"{X2}, %v: float32", "full_like(%x, %v)"), lambda: (rand(2, 5), np.float32(7.5)),
     lambda x, v: np.full_like(x, v))
case("arange_from_shape_of", main(X2, 'add(arange(0, take(shape_of(%x), 0), 1, dtype="int32"), 1)'),
     lambda: (rand(5, 2),), lambda x: np.arange(5, dtype="int32") + 1)
case("arange_float_step", main("%stop: float32", 'arange(0.5f, %stop, 0.75f, dtype="float32")'),
     lambda: (np.float32(3.2),), lambda stop: np.arange(0.5, 3.2, 0.75).astype(F32))

case("zeros_with_runtime_shape", main("%s: Tensor[(2), int32]", 'dyn.zeros(%s, dtype="int8")'),
     lambda: (np.array([2, 3], "int32"),), lambda s: np.zeros((2, 3), "int8"))
case("ones_with_shape_of", main(X2, "add(dyn.ones(shape_of(%x), dtype=\"float32\"), %x)"), lambda: (rand(3, 2),),
     lambda x: x + 1)
case("full_with_runtime_shape", main("%v: float32, %s: Tensor[(3), int64]", "dyn.full(%v, %s)"),
     lambda: (np.float32(2.5), np.array([1, 0, 2], "int64")), lambda v, s: np.full((1, 0, 2), v, F32))
# shape manipulation
case("concat_any_with_static", main(f"{X2}, %y: Tensor[(2, 3), float32]", "concatenate((%x, %y), axis=0)"),
     lambda: (rand(4, 3), rand(2, 3, seed=1)), lambda x, y: np.concatenate([x, y]))
case("concat_axis1", main(f"{X2}, %y: Tensor[(?, 2), float32]", "concatenate((%x, %y), axis=1)"),
     lambda: (rand(3, 1), rand(3, 2, seed=1)), lambda x, y: np.concatenate([x, y], axis=1))
_MANY = 25
case("concat_25_inputs", main(", ".join(f"%x{i}: Tensor[(?), float32]" for i in range(_MANY)),
                              "concatenate((" + ", ".join(f"%x{i}" for i in range(_MANY)) + "), axis=0)"),
     lambda: tuple(rand(i % 3 + 1, seed=i) for i in range(_MANY)), lambda *xs: np.concatenate(xs))
for _codes, _shape in (("[0, -1]", (2, 12)), ("[-1, 0]", (8, 3)), ("[-2]", (2, 3, 4)), ("[-3, 4]", (6, 4)),
                       ("[0, -3]", (2, 12)), ("[-4, 1, 2, -2]", (1, 2, 3, 4)), ("[-4, -1, 1, 0, 4]", (2, 1, 3, 4)),
                       ("[2, -1]", (2, 12)), ("[4, 6]", (4, 6))):
    case(f"reshape_codes_{_codes}", main(X3, f"reshape(%x, newshape={_codes})"), lambda: (rand(2, 3, 4),),
         lambda x, shape=_shape: x.reshape(shape))
case("reshape_runtime_shape", main(f"{X3}, %s: Tensor[(3), int64]", "dyn.reshape(%x, %s)"),
     lambda: (rand(2, 3, 4), np.array([4, 3, 2], "int64")), lambda x, s: x.reshape(tuple(s)))
for _codes, _in, _out in (("[0, -2]", (2, 3, 4), (2, 3, 4)), ("[-4, -1, 2, -3]", (6, 3, 4), (3, 2, 12)),
                          ("[-4, 2, -1, -2]", (6, 3, 4), (2, 3, 3, 4)), ("[1, -1, 0]", (2, 3, 4), (1, 6, 4)),
                          ("[-1, 1, 0]", (2, 3, 4), (6, 1, 4))):
    case(f"reshape_tvm_codes_{_codes}", main(X3, f"reshape(%x, newshape={_codes})"),
         lambda shape=_in: (rand(*shape),), lambda x, shape=_out: x.reshape(shape))
for _codes, _out in (((1, -1), (1, 24)), ((0, -1), (2, 12))):
    case(f"reshape_runtime_codes_{list(_codes)}", main(f"{X3}, %s: Tensor[(2), int64]", "dyn.reshape(%x, %s)"),
         lambda codes=_codes: (rand(2, 3, 4), np.array(codes, "int64")), lambda x, s, shape=_out: x.reshape(shape))
case("reshape_runtime_shape_with_minus_one", main(f"{X3}, %s: Tensor[(2), int32]", "dyn.reshape(%x, %s)"),
     lambda: (rand(2, 3, 4), np.array([-1, 6], "int32")), lambda x, s: x.reshape(-1, 6))
case("reshape_like", main(f"{X3}, %y: Tensor[(?, ?), float32]", "reshape_like(%x, %y)"),
     lambda: (rand(2, 3, 4), rand(6, 4)), lambda x, y: x.reshape(y.shape))
case("reshape_concat", main(f"{X2}, %y: Tensor[(?, ?, ?), float32]",
                            "concatenate((reshape(%x, newshape=[-1]), reshape(%y, newshape=[-1])), axis=0)"),
     lambda: (rand(2, 3), rand(1, 2, 2, seed=1)), lambda x, y: np.concatenate([x.ravel(), y.ravel()]))
case("expand_dims", main(X2, "expand_dims(%x, axis=1, num_newaxis=2)"), lambda: (rand(3, 4),),
     lambda x: x.reshape(3, 1, 1, 4))
case("expand_dims_negative_axis", main(X2, "expand_dims(%x, axis=-1)"), lambda: (rand(3, 4),),
     lambda x: x[..., None])
case("transpose", main(X3, "transpose(%x, axes=[1, 0, 2])"), lambda: (rand(2, 3, 4),),
     lambda x: x.transpose(1, 0, 2))
case("transpose_default_reverses", main(X3, "transpose(%x)"), lambda: (rand(2, 3, 4),), lambda x: x.T)
case("squeeze_axis", main("%x: Tensor[(?, 1, ?), float32]", "squeeze(%x, axis=[1])"), lambda: (rand(2, 1, 3),),
     lambda x: x.squeeze(1))
case("squeeze_then_sqrt", main("%x: Tensor[(?, 1, ?), float32]", "sqrt(squeeze(%x, axis=[1]))"),
     lambda: (positive(2, 1, 3),), lambda x: np.sqrt(x.squeeze(1)))
case("squeeze_all_unit_dims", main("%x: Tensor[(1, 5, 1), float32]", "squeeze(%x)"), lambda: (rand(1, 5, 1),),
     np.squeeze)
case("batch_flatten", main("%x: Tensor[(?, 2, 3), float32]", "nn.batch_flatten(%x)"), lambda: (rand(4, 2, 3),),
     lambda x: x.reshape(4, 6))
case("split_sections", main(X2, "split(%x, indices_or_sections=2, axis=1)"), lambda: (rand(3, 4),),
     lambda x: tuple(np.split(x, 2, axis=1)))
case("split_indices", main(X2, "split(%x, indices_or_sections=[1, 3], axis=0)"), lambda: (rand(5, 2),),
     lambda x: tuple(np.split(x, [1, 3])))
case("split_tuple_get_item", main(X2, "split(%x, indices_or_sections=3, axis=0).0"), lambda: (rand(6, 2),),
     lambda x: x[:2])
case("tile", main(X3, "tile(%x, reps=[2, 1, 3])"), lambda: (rand(2, 3, 1),), lambda x: np.tile(x, (2, 1, 3)))
case("tile_more_reps_than_dims", main(X2, "tile(%x, reps=[2, 1, 2])"), lambda: (rand(2, 3),),
     lambda x: np.tile(x, (2, 1, 2)))
case("repeat", main(X2, "repeat(%x, repeats=2, axis=1)"), lambda: (rand(2, 3),), lambda x: np.repeat(x, 2, 1))
case("stack", main(f"{X2}, %y: Tensor[(?, ?), float32]", "stack((%x, %y, %x), axis=1)"),
     lambda: (rand(2, 3), rand(2, 3, seed=1)), lambda x, y: np.stack([x, y, x], axis=1))
case("pad_constant", main(X2, "nn.pad(%x, 5f, pad_width=[[1, 2], [0, 1]])"), lambda: (rand(2, 3),),
     lambda x: np.pad(x, ((1, 2), (0, 1)), constant_values=5))
case("pad_reflect", main(X2, 'nn.pad(%x, pad_width=[[1, 1], [2, 0]], pad_mode="reflect")'), lambda: (rand(3, 4),),
     lambda x: np.pad(x, ((1, 1), (2, 0)), mode="reflect"))
case("pad_edge", main(X2, 'nn.pad(%x, pad_width=[[0, 2], [1, 1]], pad_mode="edge")'), lambda: (rand(2, 2),),
     lambda x: np.pad(x, ((0, 2), (1, 1)), mode="edge"))
case("strided_slice_const", main(X3, "strided_slice(%x, begin=[0, 1, 0], end=[2, 3, 4], strides=[1, 1, 2])"),
     lambda: (rand(3, 4, 5),), lambda x: x[0:2, 1:3, 0:4:2])
case("strided_slice_negative_stride", main(X2, "strided_slice(%x, begin=[-1, 0], end=[-4, 3], strides=[-1, 1])"),
     lambda: (rand(4, 5),), lambda x: x[-1:-4:-1, 0:3])
case("strided_slice_clamps_huge_bounds",
     main(X2, "strided_slice(%x, begin=[-1000000, 1], end=[1000000, 1000000])"),
     lambda: (rand(3, 4),), lambda x: x[:, 1:])
case("strided_slice_size_mode", main(X2, 'strided_slice(%x, begin=[1, 0], end=[2, -1], slice_mode="size")'),
     lambda: (rand(4, 3),), lambda x: x[1:3, 0:])
case("strided_slice_axes", main(X3, "strided_slice(%x, begin=[1], end=[3], axes=[2])"), lambda: (rand(2, 3, 4),),
     lambda x: x[:, :, 1:3])
case("strided_slice_runtime_bounds",
     main(f"{X2}, %b: Tensor[(2), int64], %e: Tensor[(2), int64], %s: Tensor[(2), int64]",
          "dyn.strided_slice(%x, %b, %e, %s)"),
     lambda: (rand(5, 6), np.array([1, 5], "int64"), np.array([4, 0], "int64"), np.array([2, -2], "int64")),
     lambda x, b, e, s: x[1:4:2, 5:0:-2])
case("shape_of_default_int32", main(X3, "shape_of(%x)"), lambda: (rand(2, 3, 4),),
     lambda x: np.array(x.shape, "int32"))
case("shape_of_int64_then_take", main(X3, 'take(shape_of(%x, dtype="int64"), 1)'), lambda: (rand(2, 7, 4),),
     lambda x: np.int64(7))
case("ndarray_size", main(X3, 'ndarray_size(%x, dtype="int64")'), lambda: (rand(2, 3, 4),), lambda x: np.int64(24))

case("dyn_tile", main(f"{X2}, %r: Tensor[(3), int32]", "dyn.tile(%x, %r)"),
     lambda: (rand(2, 3), np.array([2, 1, 2], "int32")), lambda x, r: np.tile(x, tuple(r)))
case("dyn_expand_dims", main(f"{X2}, %a: int32", "dyn.expand_dims(%x, %a, num_newaxis=2)"),
     lambda: (rand(2, 3), np.int32(-1)), lambda x, a: x[..., None, None])
case("dyn_squeeze", main(f"{X3}, %a: Tensor[(2), int64]", "dyn.squeeze(%x, %a)"),
     lambda: (rand(1, 3, 1), np.array([0, -1], "int64")), lambda x, a: x.reshape(3))
case("dyn_broadcast_to_shape_of", main("%x: Tensor[(?), float32], %y: Tensor[(?, ?), float32]",
                                       "dyn.broadcast_to(%x, shape_of(%y))"),
     lambda: (rand(3), rand(2, 3)), lambda x, y: np.broadcast_to(x, y.shape))
case("dyn_strided_slice_size_mode",
     main(f"{X2}, %b: Tensor[(2), int32], %e: Tensor[(2), int32], %s: Tensor[(2), int32]",
          'dyn.strided_slice(%x, %b, %e, %s, slice_mode="size")'),
     lambda: (rand(5, 6), np.array([1, 2], "int32"), np.array([3, -1], "int32"), np.array([1, 1], "int32")),
     lambda x, b, e, s: x[1:4, 2:])
# index and gather
case("one_hot", main("%i: Tensor[(?), int32]", 'one_hot(%i, 1f, 0f, depth=4, axis=-1, dtype="float32")'),
     lambda: (np.array([0, 3, 1, 2, 3], "int32"),), lambda i: np.eye(4, dtype=F32)[i])
case("dyn_one_hot", main("%i: Tensor[(?, ?), int32], %d: int32", "dyn.one_hot(%i, 1i64, 0i64, %d, axis=1)"),
     lambda: (np.array([[0, 2], [1, 5]], "int32"), np.int32(3)),
     lambda i, d: np.moveaxis(i[..., None] == np.arange(3), -1, 1).astype("int64"))
case("one_hot_axis0", main("%i: Tensor[(?), int32], %on: float32, %off: float32", "one_hot(%i, %on, %off, depth=3, axis=0)"),
     lambda: (np.array([2, 0], "int32"), np.float32(5), np.float32(-1)),
     lambda i, on, off: np.where(np.eye(3, dtype=bool)[i].T, on, off).astype(F32))
for _axis, _fn in (("None", lambda x, i: np.take(x, i)), ("0", lambda x, i: np.take(x, i, axis=0)),
                   ("1", lambda x, i: np.take(x, i, axis=1)), ("-1", lambda x, i: np.take(x, i, axis=-1))):
    attr = "" if _axis == "None" else f", axis={_axis}"
    case(f"take_axis_{_axis}", main(f"{X3}, %i: Tensor[(?, ?), int32]", f"take(%x, %i{attr})"),
         lambda: (rand(3, 4, 2), np.array([[0, 1], [1, 0], [1, 1]], "int32")), _fn)
case("take_scalar_index", main(f"{X2}, %i: int32", "take(%x, %i, axis=1)"), lambda: (rand(3, 4), np.int32(2)),
     lambda x, i: x[:, 2])
case("gather", main(f"{X2}, %i: Tensor[(?, ?), int32]", "gather(%x, %i, axis=1)"),
     lambda: (rand(3, 4), np.array([[0, 3], [1, 1], [2, 0]], "int32")),
     lambda x, i: np.take_along_axis(x, i, axis=1))
case("gather_nd", main(f"{X3}, %i: Tensor[(2, ?), int32]", "gather_nd(%x, %i)"),
     lambda: (rand(3, 4, 2), np.array([[0, 2, 1], [3, 0, 1]], "int32")), lambda x, i: x[tuple(i)])
case("gather_nd_batch_dims", main(f"{X3}, %i: Tensor[(2, ?), int32]", "gather_nd(%x, %i, batch_dims=1)"),
     lambda: (rand(2, 3, 4), np.array([[2, 0], [1, 3]], "int32")),
     lambda x, i: np.stack([x[b, i[0, b], i[1, b]] for b in range(2)]))
case("scatter_nd", main(f"{X2}, %i: Tensor[(2, ?), int32], %u: Tensor[(?), float32]", "scatter_nd(%x, %i, %u)"),
     lambda: (np.zeros((3, 3), F32), np.array([[0, 2], [1, 0]], "int32"), np.array([5, 6], F32)),
     lambda x, i, u: np.array([[0, 5, 0], [0, 0, 0], [6, 0, 0]], F32))
case("scatter_nd_add_any_updates",
     main(f"{X2}, %i: Tensor[(1, ?), int32], %u: Tensor[(?, ?), float32]", 'scatter_nd(%x, %i, %u, mode="add")'),
     lambda: (np.ones((3, 2), F32), np.array([[2, 0, 2]], "int32"), np.arange(6, dtype=F32).reshape(3, 2)),
     lambda x, i, u: np.array([[3, 4], [1, 1], [1 + 0 + 4, 1 + 1 + 5]], F32))
case("searchsorted", main("%s: Tensor[(?), float32], %v: Tensor[(?, ?), float32]", "searchsorted(%s, %v, right=True)"),
     lambda: (np.array([0, 1, 1, 3], F32), np.array([[1, -1], [2, 3]], F32)),
     lambda s, v: np.searchsorted(s, v, side="right").astype("int32"))

# data-dependent output shapes
for _rank in range(1, 6):
    for _dtype in ("bool", "int32", "int8"):
        _dims = ", ".join("?" * _rank)
        _shape = (3, 2, 1, 2, 2)[:_rank]
        case(f"argwhere_rank{_rank}_{_dtype}", main(f"%x: Tensor[({_dims}{',' if _rank == 1 else ''}), {_dtype}]",
                                                    "argwhere(%x)"),
             lambda shape=_shape, dtype=_dtype: (rand(*shape, dtype=dtype, seed=len(shape)),),
             lambda x: np.argwhere(x).astype("int32"))
case("argwhere_all_false", main("%x: Tensor[(?, ?), bool]", "argwhere(%x)"), lambda: (np.zeros((2, 3), bool),),
     lambda x: np.zeros((0, 2), "int32"))
case("topk_const_k", main(X2, "topk(%x, k=2, axis=1)"), lambda: (rand(3, 5),),
     lambda x: (np.take_along_axis(x, np.argsort(-x, axis=1)[:, :2], 1), np.argsort(-x, axis=1)[:, :2].astype("int32")))
case("topk_runtime_k", main(f"{X2}, %k: int32", 'topk(%x, %k, axis=0, ret_type="values", is_ascend=True)'),
     lambda: (rand(4, 3), np.int32(3)), lambda x, k: np.sort(x, axis=0)[:3])
case("topk_k0_is_the_whole_axis", main(X2, 'topk(%x, k=0, ret_type="indices")'), lambda: (rand(2, 4),),
     lambda x: np.argsort(-x, axis=1, kind="stable").astype("int32"))
case("topk_k0_of_an_empty_input", main(X2, 'topk(%x, k=0, ret_type="values")'), lambda: (np.zeros((3, 0), F32),),
     lambda x: np.zeros((3, 0), F32))
case("unique_sorted", main("%x: Tensor[(?), int32]", "unique(%x, return_counts=True)"),
     lambda: (np.array([3, 1, 3, 2, 1], "int32"),),
     lambda x: (np.array([1, 2, 3], "int32"), np.array([1, 3, 0], "int32"), np.array([2, 0, 2, 1, 0], "int32"),
                np.array([2, 1, 2], "int32")))

# reductions
for _op, _np in (("argmax", np.argmax), ("argmin", np.argmin)):
    case(f"{_op}_keepdims", main(X3, f"{_op}(%x, axis=[1], keepdims=True)"), lambda: (rand(2, 4, 3),),
         lambda x, f=_np: f(x, axis=1)[:, None, :].astype("int32"))
case("argmax_all", main(X2, "argmax(%x)"), lambda: (rand(3, 4),), lambda x: np.int32(np.argmax(x)))
case("all_exclude", main("%x: Tensor[(?, ?, ?), bool]", "all(%x, axis=[1], exclude=True)"),
     lambda: (rand(2, 3, 2, dtype=bool),), lambda x: np.all(x, axis=(0, 2)))
case("any_keepdims", main("%x: Tensor[(?, ?), bool]", "any(%x, axis=[0], keepdims=True)"),
     lambda: (rand(3, 4, dtype=bool),), lambda x: np.any(x, axis=0, keepdims=True))
for _op, _np in (("max", np.max), ("min", np.min), ("prod", np.prod), ("mean", np.mean), ("sum", np.sum),
                 ("variance", np.var)):
    case(f"{_op}_exclude_keepdims", main(X3, f"{_op}(%x, axis=[0, 2], keepdims=True, exclude=True)"),
         lambda: (rand(2, 4, 3),), lambda x, f=_np: f(x, axis=1, keepdims=True).astype(F32))
    case(f"{_op}_axis", main(X3, f"{_op}(%x, axis=[-1])"), lambda: (rand(2, 4, 3),),
         lambda x, f=_np: f(x, axis=-1).astype(F32))

# NN
_W = rand(4, 3, 3, 3, seed=7)
case("conv2d_nchw_dynamic_batch", main("%x: Tensor[(?, 3, 6, 6), float32], %w: Tensor[(4, 3, 3, 3), float32]",
                                       "nn.conv2d(%x, %w, padding=[1, 1], kernel_size=[3, 3], channels=4)"),
     lambda: (rand(2, 3, 6, 6), _W), lambda x, w: conv2d_nchw(x, w, pad=1), rtol=1e-4, atol=1e-4)
case("conv2d_nchw_dilation_stride", main("%x: Tensor[(?, 3, 9, 9), float32], %w: Tensor[(4, 3, 3, 3), float32]",
                                         "nn.conv2d(%x, %w, strides=[2, 2], dilation=[2, 2])"),
     lambda: (rand(1, 3, 9, 9), _W), lambda x, w: conv2d_nchw(x, w, stride=2, dilation=2), rtol=1e-4, atol=1e-4)
case("conv2d_nhwc_dynamic_batch", main("%x: Tensor[(?, 6, 6, 3), float32], %w: Tensor[(3, 3, 3, 4), float32]",
                                       'nn.conv2d(%x, %w, padding=[1, 1, 1, 1], data_layout="NHWC", '
                                       'kernel_layout="HWIO")'),
     lambda: (rand(2, 6, 6, 3), _W.transpose(2, 3, 1, 0).copy()),
     lambda x, w: conv2d_nchw(x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), pad=1).transpose(0, 2, 3, 1),
     rtol=1e-4, atol=1e-4)
case("conv2d_dynamic_height_width", main("%x: Tensor[(1, 3, ?, ?), float32], %w: Tensor[(4, 3, 3, 3), float32]",
                                         "nn.conv2d(%x, %w)"),
     lambda: (rand(1, 3, 5, 7), _W), lambda x, w: conv2d_nchw(x, w), rtol=1e-4, atol=1e-4)
case("conv2d_transpose_dynamic_batch",
     main("%x: Tensor[(?, 3, 4, 4), float32], %w: Tensor[(3, 2, 3, 3), float32]",
          "nn.conv2d_transpose(%x, %w, strides=[2, 2], padding=[1, 1], channels=2, kernel_size=[3, 3])"),
     lambda: (rand(2, 3, 4, 4), rand(3, 2, 3, 3, seed=3)), lambda x, w: conv2d_transpose_nchw(x, w, 2, 1),
     rtol=1e-4, atol=1e-4)
case("max_pool2d", main(X4, "nn.max_pool2d(%x, pool_size=[2, 2], strides=[2, 2])"), lambda: (rand(2, 3, 4, 6),),
     lambda x: pool2d(x, 2, 2, np.max))
case("avg_pool2d", main(X4, "nn.avg_pool2d(%x, pool_size=[3, 3], strides=[1, 1])"), lambda: (rand(1, 2, 5, 4),),
     lambda x: pool2d(x, 3, 1, np.mean), rtol=1e-5, atol=1e-6)
case("max_pool2d_padded", main(X4, "nn.max_pool2d(%x, pool_size=[3, 3], strides=[2, 2], padding=[1, 1])"),
     lambda: (rand(1, 2, 5, 5),),
     lambda x: pool2d(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf), 3, 2, np.max))
case("max_pool2d_nhwc", main(X4, 'nn.max_pool2d(%x, pool_size=[2, 2], strides=[2, 2], layout="NHWC")'),
     lambda: (rand(2, 4, 6, 3),), lambda x: pool2d(x.transpose(0, 3, 1, 2), 2, 2, np.max).transpose(0, 2, 3, 1))
case("argmin_exclude", main(X3, "argmin(%x, axis=[1], exclude=True)"), lambda: (rand(2, 3, 2),),
     lambda x: np.argmin(x.transpose(1, 0, 2).reshape(3, 4), axis=1).astype("int32"))
case("global_max_pool2d", main(X4, "nn.global_max_pool2d(%x)"), lambda: (rand(2, 3, 4, 5),),
     lambda x: x.max(axis=(2, 3), keepdims=True))
case("global_avg_pool2d", main(X4, "nn.global_avg_pool2d(%x)"), lambda: (rand(2, 3, 4, 5),),
     lambda x: x.mean(axis=(2, 3), keepdims=True))
case("dense_dynamic_batch", main("%x: Tensor[(?, 4), float32], %w: Tensor[(3, 4), float32]", "nn.dense(%x, %w)"),
     lambda: (rand(5, 4), rand(3, 4, seed=1)), lambda x, w: x @ w.T, rtol=1e-5, atol=1e-5)
case("dense_all_dynamic", main(f"{X2}, %w: Tensor[(?, ?), float32]", "nn.dense(%x, %w)"),
     lambda: (rand(2, 6), rand(3, 6, seed=1)), lambda x, w: x @ w.T, rtol=1e-5, atol=1e-5)
case("batch_matmul_dynamic_batch", main("%x: Tensor[(?, 2, 3), float32], %y: Tensor[(?, 4, 3), float32]",
                                        "nn.batch_matmul(%x, %y)"),
     lambda: (rand(3, 2, 3), rand(3, 4, 3, seed=1)), lambda x, y: x @ y.transpose(0, 2, 1), rtol=1e-5, atol=1e-5)
case("batch_matmul_all_dynamic_no_transpose",
     main(f"{X3}, %y: Tensor[(?, ?, ?), float32]", "nn.batch_matmul(%x, %y, transpose_b=False)"),
     lambda: (rand(2, 3, 4), rand(2, 4, 5, seed=1)), lambda x, y: x @ y, rtol=1e-5, atol=1e-5)
case("batch_matmul_transpose_a", main(f"{X3}, %y: Tensor[(?, ?, ?), float32]",
                                      "nn.batch_matmul(%x, %y, transpose_a=True, transpose_b=False)"),
     lambda: (rand(2, 4, 3), rand(2, 4, 5, seed=1)), lambda x, y: x.transpose(0, 2, 1) @ y, rtol=1e-5, atol=1e-5)
case("batch_matmul_broadcast_batch", main(f"{X3}, %y: Tensor[(1, ?, ?), float32]", "nn.batch_matmul(%x, %y)"),
     lambda: (rand(3, 2, 4), rand(1, 5, 4, seed=1)), lambda x, y: x @ y.transpose(0, 2, 1), rtol=1e-5, atol=1e-5)
case("softmax", main(X3, "nn.softmax(%x, axis=1)"), lambda: (rand(2, 4, 3),), lambda x: softmax(x, 1))
case("relu", main(X2, "nn.relu(%x)"), lambda: (rand(3, 4),), lambda x: np.maximum(x, 0))
case("leaky_relu", main(X2, "nn.leaky_relu(%x, alpha=0.1f)"), lambda: (rand(3, 4),),
     lambda x: np.where(x > 0, x, np.float32(0.1) * x))
case("prelu", main(f"{X4}, %a: Tensor[(3), float32]", "nn.prelu(%x, %a)"),
     lambda: (rand(2, 3, 2, 2), np.array([0.1, 0.2, 0.3], F32)),
     lambda x, a: np.where(x > 0, x, a[None, :, None, None] * x))
case("bias_add", main(f"{X3}, %b: Tensor[(?), float32]", "nn.bias_add(%x, %b, axis=-1)"),
     lambda: (rand(2, 3, 4), rand(4, seed=1)), lambda x, b: x + b)

# control flow with dynamic shapes
RECURSIVE_CONCAT = """
def @main(%x: Tensor[(1, 1), float32]) -> Tensor[(?, 1), float32] {
  let %loop = fn (%i: int32, %acc: Tensor[(?, 1), float32]) -> Tensor[(?, 1), float32] {
    if (less(%i, 10)) {
      %loop(add(%i, 1), concatenate((%acc, multiply(%x, cast(%i, dtype="float32"))), axis=0))
    } else {
      %acc
    }
  };
  %loop(0, %x)
}"""
case("recursive_concat_grows_a_tensor", RECURSIVE_CONCAT, lambda: (np.full((1, 1), 2, F32),),
     lambda x: np.concatenate([x] + [x * i for i in range(10)]))
case("mixed_nested_tuple_input",
     main("%t: ((Tensor[(?, 2), float32], Tensor[(?), float32]), Tensor[(?, ?), float32])",
          "(add(%t.0.0, %t.1), sum(%t.0.1))"),
     lambda: (((rand(3, 2), rand(4, seed=1)), rand(3, 2, seed=2)),),
     lambda t: (t[0][0] + t[1], np.float32(t[0][1].sum())))


@pytest.mark.parametrize("name", list(CASES))
def test_dynamic_case(run, name):
    text, args_fn, expected_fn, rtol, atol = CASES[name]
    args = args_fn()
    check_result(run(text, *args), expected_fn(*args), rtol=rtol, atol=atol)


# A cross-section of the table on target "c" (generated C kernels; about 0.3 s of compiling per case
# when the build cache is cold), after a save/load round trip.
C_CASES = ["consecutive_broadcast", "where_broadcast", "arange_from_shape_of", "concat_axis1",
           "strided_slice_negative_stride", "take_axis_1", "max_exclude_keepdims", "conv2d_nchw_dilation_stride",
           "max_pool2d_padded", "batch_matmul_broadcast_batch", "softmax", "recursive_concat_grows_a_tensor"]


@pytest.mark.parametrize("name", C_CASES)
def test_dynamic_case_on_target_c(name):
    text, args_fn, expected_fn, rtol, atol = CASES[name]
    exe = tv.vm.load_executable(tv.vm.compile(parse(text), target="c").save_bytes())
    args = args_fn()
    result = tv.vm.VirtualMachine(exe).invoke("main", *args)
    check_result(result, expected_fn(*args), rtol=max(rtol, 1e-5), atol=max(atol, 1e-6))


# --- checks beyond one run ---------------------------------------------------------------------------
def test_the_same_program_serves_many_shapes(run):
    text = main(f"{X2}, %y: Tensor[(?), float32]", "nn.relu(add(%x, %y))")
    function = run.function(text)
    for rows, cols in ((1, 1), (3, 4), (5, 2), (0, 3)):
        x, y = rand(rows, cols), rand(cols, seed=1)
        check_result(function(x, y), np.maximum(x + y, 0))


def test_runtime_broadcast_mismatch_is_a_clear_error(run):
    text = main(f"{X2}, %y: Tensor[(?, ?), float32]", "add(%x, %y)")
    with pytest.raises(ShapeError, match=r"add: cannot broadcast shapes \(2, 3\) and \(4, 3\)"):
        run(text, rand(2, 3), rand(4, 3))


def test_where_with_incompatible_shapes_is_a_clear_error(run):
    text = main("%c: Tensor[(?), bool], %x: Tensor[(?), float32], %y: Tensor[(?), float32]", "where(%c, %x, %y)")
    with pytest.raises(ShapeError, match="where.*broadcast"):
        run(text, rand(3, dtype=bool), rand(2), rand(3))


def test_reshape_to_a_wrong_size_is_a_clear_error(run):
    with pytest.raises(ShapeError, match="reshape"):
        run(main(X2, "reshape(%x, newshape=[5, -1])"), rand(2, 3))


def test_a_declared_static_dim_that_a_dynamic_value_misses_is_a_shape_error(run):
    """Gradual typing: a ``?`` dim meets a declared static one (a result declared ``Tensor[(3), float32]``
    on a body of type ``Tensor[(?), float32]``; a ``(3)`` parameter given a ``(?)`` value; a let so
    annotated); type inference
    says 3, so only the run can tell. Every executor raises a ShapeError where the value at run time
    differs (the result had come back as a (5,) tensor; the interpreter had blamed itself with an
    "internal error"), and returns the value where it fits."""
    result = "def @main(%x: Tensor[(?), float32]) -> Tensor[(3), float32] { %x * 2f }"
    parameter = "def @f(%y: Tensor[(3), float32]) { %y * 2f }\ndef @main(%x: Tensor[(?), float32]) { @f(%x) }"
    let = "def @main(%x: Tensor[(?), float32]) { let %y: Tensor[(3), float32] = %x * 2f; %y + 0f }"
    for text in (result, parameter, let):
        with pytest.raises(ShapeError, match="3"):
            run(text, rand(5))
        check_result(run(text, np.arange(3, dtype=np.float32)), np.arange(3, dtype=np.float32) * 2)
    with pytest.raises(ShapeError, match="the result of @?main is .*5.*, but its type is Tensor\\[\\(3\\), float32\\]"):
        run(result, rand(5))


@pytest.mark.parametrize("begin, end, step", [(3, 11, 2), (-1, 3, -1), (9, 0, -3), (-20, 20, 4)])
def test_dyn_strided_slice_with_bounds_of_run_time_length(run, begin, end, step):
    """begin / end / strides whose length is known only at run time: Python's slice rules on every executor
    (target c had ignored the strides and read past the input; such calls now run the NumPy kernel)."""
    text = ("def @main(%x: Tensor[(?), float32], %b: Tensor[(?), int64], %e: Tensor[(?), int64], "
            "%s: Tensor[(?), int64]) { dyn.strided_slice(%x, %b, %e, %s) }")
    x = np.arange(10, dtype=np.float32)
    got = run(text, x, np.array([begin]), np.array([end]), np.array([step]))
    check_result(got, x[begin:end:step])


@pytest.mark.parametrize("dtype", ["int64", "uint64"])
def test_the_mean_of_64_bit_integers_is_exact(run, dtype):
    """The integer mean truncates the exact quotient (the docs): 64-bit sums that overflow 64 bits too (target
    c had wrapped them: 0 for eight 2**62; such means now run the NumPy kernel)."""
    info = np.iinfo(dtype)
    values = [2**62] * 8 if dtype == "int64" else [info.max] * 3
    x = np.array(values, dtype=dtype)
    got = run(f"def @main(%x: Tensor[(?), {dtype}]) {{ mean(%x, axis=[0]) }}", x)
    check_result(got, np.array(sum(values) // len(values), dtype=dtype))


def test_argwhere_shapes_follow_the_data(run):
    function = run.function(main("%x: Tensor[(?, ?), int32]", "argwhere(%x)"))
    for x in (np.eye(3, dtype="int32"), np.zeros((2, 2), "int32"), np.ones((1, 4), "int32")):
        check_result(function(x), np.argwhere(x).astype("int32"))


def test_concat_type_inference_keeps_static_dims():
    mod = tv.transform.InferType()(parse(main("%x: Tensor[(?, 3), float32], %y: Tensor[(2, 3), float32]",
                                              "concatenate((%x, %y), axis=0)")))
    assert str(mod["main"].body.checked_type) == "Tensor[(?, 3), float32]"
    mod = tv.transform.InferType()(parse(main("%x: Tensor[(4, ?), float32], %y: Tensor[(4, 2), float32]",
                                              "concatenate((%x, %y), axis=0)")))
    assert str(mod["main"].body.checked_type) == "Tensor[(8, 2), float32]"


def test_broadcast_type_inference_resolves_any_against_a_static_dim():
    mod = tv.transform.InferType()(parse(main(f"{X2}, %y: Tensor[(3, 1), float32]", "add(%x, %y)")))
    # Relay resolves ? against a static k != 1 to k; the run-time shape function checks it
    assert str(mod["main"].body.checked_type) == "Tensor[(3, ?), float32]"


def test_recursive_concat_with_a_wrong_static_annotation_is_a_type_error():
    text = RECURSIVE_CONCAT.replace("Tensor[(?, 1), float32]", "Tensor[(1, 1), float32]")
    with pytest.raises(TypeInferenceError, match="dimension 0 conflicts: 1 does not match 2"):
        tv.transform.InferType()(parse(text))


def test_squeeze_without_axes_needs_static_dims():
    # as in Relay: with ? dims, which ones are 1 is unknown until run time, so the axes must be given
    with pytest.raises(TypeInferenceError, match="squeeze"):
        tv.transform.InferType()(parse(main("%x: Tensor[(1, ?, 1), float32]", "squeeze(%x)")))


def _resize_nearest_asymmetric(x, out_h, out_w):
    """Relay's nearest resize with asymmetric coordinates: source index floor(i * in / out)."""
    h, w = x.shape[2:]
    return x[:, :, (np.arange(out_h) * h) // out_h][:, :, :, (np.arange(out_w) * w) // out_w]


def _conv1d_transpose(x, w, stride):
    n, c, width = x.shape
    out = np.zeros((n, w.shape[1], (width - 1) * stride + w.shape[2]), x.dtype)
    for i in range(width):
        out[:, :, i * stride:i * stride + w.shape[2]] += np.einsum("nc,cok->nok", x[:, :, i], w)
    return out


# Relay ops tensorvm once lacked, with ? dims (TVM's test_any_conv1d_transpose_ncw, the dyn op tests)
_X4 = rand(1, 2, 3, 4, seed=7)
_W1 = rand(2, 3, 2, seed=8)


@pytest.mark.parametrize("text, args, expected", [
    (main("%x: Tensor[(?, 2, ?), float32], %w: Tensor[(2, 3, 2), float32]",
          "nn.conv1d_transpose(%x, %w, strides=[2], kernel_size=[2], channels=3)"),
     (_X4[:, :, 0], _W1), _conv1d_transpose(_X4[:, :, 0], _W1, 2)),
    (main("%x: Tensor[(?, ?), float32]", 'nn.mirror_pad(%x, pad_width=[[1, 1], [0, 2]], mode="SYMMETRIC")'),
     (_X4[0, 0],), np.pad(_X4[0, 0], [[1, 1], [0, 2]], mode="symmetric")),
    (main("%x: Tensor[(?, ?), float32]", "nn.dilate(%x, strides=[2, 1])"),
     (_X4[0, 0],), np.insert(_X4[0, 0], [1, 2], 0.0, axis=0)),
    (main("%x: Tensor[(?, 2, ?, ?), float32]",
          'image.resize2d(%x, size=[6, 2], method="nearest_neighbor", coordinate_transformation_mode="asymmetric")'),
     (_X4,), _resize_nearest_asymmetric(_X4, 6, 2)),
    (main("%x: Tensor[(?, 2, ?, ?), float32], %s: Tensor[(2), int64]",
          'dyn.image.resize2d(%x, %s, meta_roi, method="nearest_neighbor", '
          'coordinate_transformation_mode="asymmetric")').replace("meta_roi", "zeros(shape=[4], dtype=\"float32\")"),
     (_X4, np.array([5, 8], "int64")), _resize_nearest_asymmetric(_X4, 5, 8)),
    (main("%x: Tensor[(?, 2, ?, ?), float32], %s: float32", "dyn.nn.upsampling(%x, %s, 2f)"),
     (_X4, np.float32(2)), _resize_nearest_asymmetric(_X4, 6, 8)),
    (main("%x: Tensor[(?, ?), float32], %p: Tensor[(2, 2), int32], %v: float32", "dyn.nn.pad(%x, %p, %v)"),
     (_X4[0, 0], np.array([[0, 1], [2, 0]], "int32"), np.float32(-1)),
     np.pad(_X4[0, 0], [[0, 1], [2, 0]], constant_values=-1)),
    # an identity affine grid samples every pixel at its centre
    (main("%x: Tensor[(?, 2, 3, 4), float32], %t: Tensor[(?, 2, 3), float32]",
          "image.grid_sample(%x, image.affine_grid(%t, target_shape=[3, 4]))"),
     (_X4, np.array([[[1, 0, 0], [0, 1, 0]]], "float32")), _X4),
    (main("%x: Tensor[(?, 3, 4), float32], %i: Tensor[(?), int64], %j: Tensor[(?), int64]",
          "adv_index((%x, %i, %j))"),
     (_X4[0], np.array([1, 0, 1]), np.array([2, 2, 0])), _X4[0][[1, 0, 1], [2, 2, 0]]),
    (main("%x: Tensor[(?, 3, 4), float32]", "contrib_reverse_reshape(%x, newshape=[-1, 0])"),
     (_X4[0],), _X4[0].reshape(6, 4)),
    (main("%i: Tensor[(?), int32], %s: Tensor[(1), int32]", "dyn.sparse_to_dense(%i, %s, 7f, 0f)"),
     (np.array([0, 3], "int32"), np.array([5], "int32")), np.array([7, 0, 0, 7, 0], "float32")),
    # a box over the whole image, cropped to the image's size, is the image
    (main("%x: Tensor[(?, 2, 3, 4), float32], %b: Tensor[(?, 4), float32], %i: Tensor[(?), int32]",
          "image.crop_and_resize(%x, %b, %i, crop_size=[3, 4])"),
     (_X4, np.array([[0, 0, 1, 1]], "float32"), np.array([0], "int32")), _X4),
], ids=["conv1d_transpose", "mirror_pad", "dilate", "resize2d", "dyn_resize2d", "dyn_upsampling", "dyn_pad",
        "grid_sample", "adv_index", "reverse_reshape", "dyn_sparse_to_dense", "crop_and_resize"])
def test_relay_ops_tensorvm_once_lacked(run, text, args, expected):
    check_result(run(text, *args), expected)


# (class, score, x1, y1, x2, y2): box 1 overlaps box 0 (IoU 81/119), box 2 is alone, box 3 scores below 0.3
_DETECTIONS = np.array([[[0, 0.9, 0, 0, 10, 10], [0, 0.8, 1, 1, 11, 11], [0, 0.7, 20, 20, 30, 30],
                         [0, 0.1, 0, 0, 1, 1]]], F32)


@pytest.mark.parametrize("text, args, expected", [
    (main("%d: Tensor[(?, 4, 6), float32]",
          "%v = vision.get_valid_counts(%d, 0.3f, id_index=0, score_index=1); "
          "vision.non_max_suppression(%v.1, %v.0, %v.2, -1, 0.5f, force_suppress=False, top_k=-1, coord_start=2, "
          "score_index=1, id_index=0, return_indices=True, invalid_to_bottom=False)"),
     (_DETECTIONS,), (np.array([[0, 2, -1, -1]], "int32"), np.array([[2]], "int32"))),
    (main("%b: Tensor[(1, ?, 4), float32], %s: Tensor[(1, 1, ?), float32]",
          'vision.all_class_non_max_suppression(%b, %s, 3, 0.5f, 0.3f, output_format="onnx")'),
     (_DETECTIONS[:, :, 2:], _DETECTIONS[:, None, :, 1]),
     (np.array([[0, 0, 0], [0, 0, 2], [0, 0, 0], [0, 0, 0]], "int64"), np.array([2], "int64"))),
    (main("%i: Tensor[(?, 2), int64], %v: Tensor[(?), int32], %s: Tensor[(2), int64]",
          "sparse_fill_empty_rows(%i, %v, %s, -1)"),
     (np.array([[1, 0], [1, 2]], "int64"), np.array([5, 6], "int32"), np.array([3, 4], "int64")),
     (np.array([[0, 0], [1, 0], [1, 2], [2, 0]], "int64"), np.array([-1, 5, 6, -1], "int32"),
      np.array([True, False, True]))),
], ids=["get_valid_counts_nms", "all_class_nms", "sparse_fill_empty_rows"])
def test_relay_vision_ops_tensorvm_once_lacked(run, text, args, expected):
    check_result(run(text, *args), expected)


@pytest.mark.skip(reason="layout_transform and contrib_conv2d_NCHWc are not registered ops in tensorvm yet")
def test_ops_tensorvm_does_not_have():  # pragma: no cover
    pass


# --- tuples of data-dependent ops -------------------------------------------------------------------
@pytest.mark.parametrize("text, args, expected", [
    (main("%x: Tensor[(?), int32]", "%u = unique(%x); add(%u.0, 1)"),
     (np.array([3, 1, 3, 2], "int32"),), np.array([2, 3, 4], "int32")),
    (main("%x: Tensor[(?), float32], %k: int32", '%t = topk(%x, %k); add(%t.0, cast(%t.1, dtype="float32"))'),
     (np.array([1, 5, 2, 4], F32), np.int32(2)), np.array([5 + 1, 4 + 3], F32)),
], ids=["unique", "topk_runtime_k"])
def test_fields_of_a_data_dependent_tuple_feed_a_fused_op(run, text, args, expected):
    # regression: the VM read the tuple's fields from registers killed right after the tuple was built
    check_result(run(text, *args), expected)


def test_fields_of_a_data_dependent_tuple_bound_by_let(run):
    # the same program written with let bindings works everywhere
    text = main("%x: Tensor[(?), int32]", "let %u = unique(%x); let %v = %u.0; add(%v, 1)")
    check_result(run(text, np.array([3, 1, 3, 2], "int32")), np.array([2, 3, 4], "int32"))
