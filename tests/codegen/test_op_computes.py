"""Every operator compute, generated as C, against the operator's NumPy kernel.

Each case becomes two kernels per dtype (static shapes, and ``?`` dims), all compiled into one library
for the module (compiling dominates the cost; the library is cached on disk between runs). Hypothesis
draws the seeds of the shapes and values.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import (
    Case,
    above_one,
    broadcast_pair,
    check_close,
    default_values,
    dims,
    fixed_rank,
    halves,
    magnitudes,
    make_inputs,
    nonzero_divisor,
    positive,
    primitive,
    reference,
    same_shapes,
    small_ints,
    unary,
    unit,
    with_nans,
)

from tensorvm.codegen.fused import build_fused_module
from tensorvm.errors import ExecutionError, ShapeError, TensorVMError
from tensorvm.ir.attrs import Attrs
from tensorvm.op import get_op
from tensorvm.op.nn import packed_lanes

F32, F64, F16 = "float32", "float64", "float16"
INT_MIX = ("int32", "int8", "uint8")


def _pow_values(rng, shape, dtype, index):
    if np.dtype(dtype).kind == "f":
        return (rng.random(shape) * 3 + 0.1).astype(dtype) if index == 0 else rng.standard_normal(shape).astype(dtype)
    if index == 0:  # a nonzero base: zero to a negative power is an error (tested separately)
        return (rng.integers(1, 4, size=shape) * rng.choice([-1, 1], size=shape)).astype(dtype)
    return rng.integers(-2, 6, size=shape).astype(dtype)


def _shift_values(rng, shape, dtype, index):
    if index == 1:
        bits = np.dtype(dtype).itemsize * 8
        low = -2 if np.dtype(dtype).kind == "i" else 0
        return rng.integers(low, bits + 3, size=shape).astype(dtype)
    return None


def _cast_safe(rng, shape, dtype, index):
    return (rng.standard_normal(shape) * 40).astype(dtype) if np.dtype(dtype).kind == "f" else None


def _unsigned_safe(rng, shape, dtype, index):
    return (rng.random(shape) * 200).astype(dtype) if np.dtype(dtype).kind == "f" else None


def _indices(low, high):
    def values(rng, shape, dtype, index):
        return rng.integers(low, high, size=shape).astype(dtype) if index == 1 else None

    return values


def _reduce_sample(rank: int = 3, low: int = 0):
    return lambda rng: [dims(rng, rank, low, 4)]


def _newshape(rng, shape, dtype, index):
    return np.array([-1, 2, 0][: shape[0]], dtype) if index == 1 else None


def _target_shape(rng, shape, dtype, index):
    return np.array([2, 3, int(rng.integers(1, 4))], dtype) if index == 1 else None


def _slice_values(rng, shape, dtype, index):
    if index == 0:
        return None
    if index == 3:  # strides: nonzero, either sign
        return (rng.integers(1, 3, size=shape) * rng.choice([-1, 1], size=shape)).astype(dtype)
    return rng.integers(-7, 8, size=shape).astype(dtype)


def _take_sample(rng):
    return [dims(rng, 3, 1, 4), dims(rng, 2, 0, 3)]


def _conv_sample(channels=3, out=4, kernel=3, groups=1, layout="NCHW", kernel_layout="OIHW"):
    def sample(rng):
        n, h, w = int(rng.integers(1, 3)), int(rng.integers(5, 9)), int(rng.integers(5, 9))
        data = {"N": n, "C": channels, "H": h, "W": w}
        weight = {"O": out, "I": channels // groups, "H": kernel, "W": kernel}
        return [tuple(data[c] for c in layout), tuple(weight[c] for c in kernel_layout)]

    return sample


def _conv_t_sample(rng):
    n, h, w = int(rng.integers(1, 3)), int(rng.integers(2, 6)), int(rng.integers(2, 6))
    return [(n, 4, h, w), (4, 3, 3, 3)]


def _pool_sample(rng):
    return [(int(rng.integers(1, 3)), 2, int(rng.integers(4, 9)), int(rng.integers(4, 9)))]


def _concat_sample(count):
    def sample(rng):
        base = list(dims(rng, 3, 1, 4))
        shapes = []
        for _ in range(count):
            s = list(base)
            s[1] = int(rng.integers(0, 4))
            shapes.append(tuple(s))
        return [shapes]

    return sample


def _stack_sample(rng):
    shape = dims(rng, 2, 0, 4)
    return [[shape, shape, shape]]


def _bn_sample(rng):
    shape = (int(rng.integers(1, 3)), 3, int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    return [shape, (3,), (3,), (3,), (3,)]


def _bn_values(rng, shape, dtype, index):
    return (rng.random(shape) + 0.5).astype(dtype) if index == 4 else None


def _norm_sample(rng):
    rows, cols = int(rng.integers(1, 5)), int(rng.integers(1, 9))
    return [(rows, cols), (cols,), (cols,)]


def _seq_mask_sample(rng):
    t, b = int(rng.integers(1, 5)), int(rng.integers(1, 4))
    return [(t, b, 2), (b,)]


def _scalar_pair(rng):
    return [dims(rng, 2, 0, 4), ()]


CASES = [
    # ---- binary broadcasting ----
    *[Case(op, broadcast_pair(), (F32, F64, F16, "int32", "int8", "uint8"))
      for op in ("add", "subtract", "multiply")],
    Case("divide", broadcast_pair(), (F32, "int32", "int8"), values=nonzero_divisor),
    Case("floor_divide", broadcast_pair(), (F32, F64, "int32", "int8", "uint8"), values=nonzero_divisor),
    Case("mod", broadcast_pair(), (F32, "int32", "int16"), values=nonzero_divisor),
    Case("floor_mod", broadcast_pair(), (F32, "int64", "int8"), values=nonzero_divisor),
    Case("power", broadcast_pair(), (F32, "int32", "int8"), values=_pow_values),
    *[Case(op, broadcast_pair(), (F32, F16, "int16", "bool"), values=with_nans) for op in ("maximum", "minimum")],
    *[Case(op, broadcast_pair(), (F32, "int32", "bool"))
      for op in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")],
    *[Case(op, broadcast_pair(), ("bool",)) for op in ("logical_and", "logical_or", "logical_xor")],
    *[Case(op, broadcast_pair(), ("int32", "uint8", "bool")) for op in ("bitwise_and", "bitwise_or", "bitwise_xor")],
    *[Case(op, broadcast_pair(), ("int32", "int8", "uint16", "int64"), values=_shift_values)
      for op in ("left_shift", "right_shift")],
    Case("where", broadcast_pair(count=3), (("bool", F32, F32), ("int32", "int8", "int8"), ("bool", F16, F16))),
    # ---- unary ----
    Case("negative", unary(), (F32, "int8", "uint8")),
    Case("abs", unary(), (F32, "int8", "int64")),
    Case("sign", unary(), (F32, "int32", "uint8"), values=with_nans),
    *[Case(op, unary(), (F32, F16, "int32"), values=halves) for op in ("floor", "ceil", "round", "trunc")],
    *[Case(op, unary(), (F32, F64, F16)) for op in ("exp", "tanh", "sigmoid", "erf", "sin", "cos", "tan", "atan", "sinh",
                                                    "cosh", "asinh")],
    *[Case(op, unary(), (F32, F64, F16), values=unit) for op in ("asin", "acos", "atanh")],
    Case("acosh", unary(), (F32, F64, F16), values=above_one),
    *[Case(op, unary(), (F32, F64, F16), values=positive) for op in ("log", "log2", "log10", "log1p", "sqrt", "rsqrt")],
    *[Case(op, unary(), (F32, "int32"), values=with_nans) for op in ("isnan", "isinf", "isfinite")],
    Case("logical_not", unary(), ("bool",)),
    Case("bitwise_not", unary(), ("int32", "uint8", "bool")),
    Case("copy", unary(), (F32, "int16")),
    Case("annotation.stop_fusion", unary(), (F32, "int16")),  # (only reached if it outlives FuseOps)
    *[Case("cast", unary(), (src,), attrs={"dtype": dst}, values=_cast_safe)
      for src, dst in ((F32, "int32"), ("int32", F32), (F32, F16), (F64, F32), ("int32", "bool"), ("bool", F32),
                       (F16, F32), ("uint8", "int8"), ("int64", "uint16"))],
    Case("cast", unary(), (F32,), attrs={"dtype": "uint8"}, values=_unsigned_safe, label="to_uint8"),
    Case("cast_like", same_shapes(2), ((F32, "int32"), ("int32", F64)), values=_cast_safe),
    Case("clip", unary(), (F32, F16, "int8", "uint8"), attrs={"a_min": -1.5, "a_max": 300.0}, values=with_nans),
    Case("nn.relu", unary(), (F32, "int32"), values=with_nans),
    Case("nn.leaky_relu", unary(), (F32,), attrs={"alpha": 0.2}),
    Case("nn.gelu", unary(), (F32, F64, F16)),
    Case("nn.gelu", unary(), (F32,), attrs={"approximate": "tanh"}),
    # ---- creation ----
    Case("zeros", lambda rng: [], ("float32",), attrs={"shape": (2, 3), "dtype": "int8"}),
    Case("ones", lambda rng: [], ("float32",), attrs={"shape": (4,), "dtype": "float32"}),
    Case("full", lambda rng: [()], (F32, "int32"), attrs={"shape": (3, 2), "dtype": "int16"}),
    Case("full", lambda rng: [()], (F64,), attrs={"shape": (2,)}),
    Case("zeros_like", unary(), (F32, "int8")),
    Case("ones_like", unary(), ("uint8",)),
    Case("full_like", _scalar_pair, (F32, ("int32", "int32"))),
    # ---- reductions ----
    *[Case(op, _reduce_sample(), (F32, "int32"), attrs=attrs)
      for op in ("sum", "prod") for attrs in ({}, {"axis": [1]}, {"axis": [0, 2], "keepdims": True},
                                              {"axis": [1], "exclude": True})],
    Case("sum", _reduce_sample(), (F16, "int8"), attrs={"axis": [-1]}),
    *[Case(op, _reduce_sample(low=1), (F32, F16, "int16", "bool"), attrs=attrs, values=with_nans)
      for op in ("max", "min") for attrs in ({"axis": [2]}, {"axis": [0, 1], "keepdims": True})],
    *[Case(op, _reduce_sample(), ("bool",), attrs={"axis": [1]}) for op in ("all", "any")],
    Case("mean", _reduce_sample(), (F32, F16, "int32", "uint8"), attrs={"axis": [1, 2]}),
    Case("mean", _reduce_sample(low=1), ("int8",), attrs={"axis": [0], "keepdims": True}),
    Case("logsumexp", _reduce_sample(), (F32, F64), attrs={"axis": [1]}),
    *[Case(op, _reduce_sample(low=1), (F32, "int32"), attrs=attrs, values=with_nans)
      for op in ("argmax", "argmin") for attrs in ({"axis": [1]}, {"axis": [0, 2], "keepdims": True},
                                                   {"axis": [2], "select_last_index": True})],
    Case("argmax", _reduce_sample(low=1), ("int8",), attrs={"axis": [2]}, values=small_ints(-2, 2)),
    Case("argmax", _reduce_sample(low=1), ("int8",), attrs={"axis": [2], "select_last_index": True},
         values=small_ints(-2, 2), label="ties_last"),
    *[Case(op, _reduce_sample(), (F32, F16), attrs={"axis": [1], "unbiased": unbiased})
      for op in ("variance", "std") for unbiased in (False, True)],
    Case("variance", lambda rng: [dims(rng, 3, 1, 4)] * 1 + [(1,)], (F32,), attrs={"axis": [2]},
         label="given_mean", static=((), "all")),
    # over no axes (axis=[]): each element reduced alone (it had been an IndexError in the lowering)
    *[Case(op, _reduce_sample(low=1), (F32,), attrs={"axis": []}, label="no_axes")
      for op in ("sum", "prod", "max", "mean", "variance", "std", "logsumexp", "argmax")],
    Case("any", _reduce_sample(), ("bool",), attrs={"axis": [], "keepdims": True}, label="no_axes"),
    # ---- data movement ----
    Case("reshape", lambda rng: [(int(rng.integers(0, 4)), 12)], (F32,), attrs={"newshape": [-1, 3, 4]},
         static=((1,),)),
    Case("reshape", lambda rng: [(2, 3, int(rng.integers(1, 4)))], (F32,), attrs={"newshape": [0, -3, -1]}),
    Case("reshape", lambda rng: [(int(rng.integers(1, 4)), 6, 2)], (F32,), attrs={"newshape": [-2]}),
    Case("reshape", lambda rng: [(int(rng.integers(1, 4)), 6)], (F32, "int8"), attrs={"newshape": [0, -4, 2, -1]},
         static=((1,),)),
    Case("reshape", lambda rng: [(4, 6)], (F32,), attrs={"newshape": [3, 8]}, dynamic=False),
    Case("reshape_like", lambda rng: [(2, 6), (3, 4)], (F32,), static=((), ())),
    Case("dyn.reshape", lambda rng: [(int(rng.integers(1, 4)), 6), (3,)], ((F32, "int64"),), static=((), "all"),
         values=_newshape),
    Case("dyn.broadcast_to", lambda rng: [(1, int(rng.integers(1, 4))), (3,)], ((F32, "int64"),),
         static=((), "all"), values=_target_shape),
    Case("dyn.strided_slice", lambda rng: [dims(rng, 2, 0, 6), (2,), (2,), (2,)], ((F32, "int64", "int64", "int64"),),
         static=((), "all", "all", "all"), values=_slice_values),
    Case("dyn.strided_slice", lambda rng: [dims(rng, 2, 0, 6), (2,), (2,), (2,)], ((F32, "int64", "int64", "int64"),),
         attrs={"slice_mode": "size"}, static=((), "all", "all", "all"), values=_slice_values),
    Case("nn.batch_flatten", lambda rng: [dims(rng, 3, 0, 4)], (F32,)),
    Case("squeeze", lambda rng: [(int(rng.integers(0, 4)), 1, int(rng.integers(0, 4)))], (F32,),
         attrs={"axis": [1]}),
    Case("squeeze", lambda rng: [(1, 3, 1)], (F32,), dynamic=False),
    Case("expand_dims", unary(1, 3), (F32,), attrs={"axis": 1, "num_newaxis": 2}),
    Case("expand_dims", unary(0, 2), ("int32",), attrs={"axis": -1}),
    Case("transpose", fixed_rank(3), (F32, "int8")),
    Case("transpose", fixed_rank(4), (F32,), attrs={"axes": [0, 2, 3, 1]}),
    Case("concatenate", _concat_sample(3), (F32, "int16"), attrs={"axis": 1}, tuple_input=True),
    Case("concatenate", _concat_sample(2), (F32,), attrs={"axis": -2}, tuple_input=True),
    Case("stack", _stack_sample, (F32,), attrs={"axis": 1}, tuple_input=True),
    Case("split", lambda rng: [(int(rng.integers(1, 4)), 6)], (F32,), attrs={"indices_or_sections": 3, "axis": 1}),
    Case("split", lambda rng: [(int(rng.integers(2, 7)), 2)], (F32,), attrs={"indices_or_sections": [1, 2]}),
    *[Case("take", _take_sample, ((F32, "int32"),), attrs={"axis": 1, "mode": mode}, values=_indices(-6, 6))
      for mode in ("clip", "wrap")],
    Case("take", _take_sample, ((F32, "int64"),), attrs={"axis": 1, "mode": "fast"}, values=_indices(-1, 1)),
    Case("take", _take_sample, ((F32, "int32"),), attrs={}, values=_indices(-3, 70)),
    Case("take", lambda rng: [(3, 4, 2), (3, 2)], ((F32, "int32"),), attrs={"axis": 1, "batch_dims": 1},
         values=_indices(0, 4)),
    Case("gather", lambda rng: [(3, 5), (int(rng.integers(0, 4)), 5)], ((F32, "int32"),), attrs={"axis": 0},
         values=_indices(-3, 3)),
    Case("gather_nd", lambda rng: [(3, 4, 2), (2, int(rng.integers(0, 5)))], ((F32, "int32"),),
         values=_indices(0, 3), static=((), (0,))),
    Case("gather_nd", lambda rng: [(2, 3, 4), (1, 2, int(rng.integers(1, 4)))], ((F32, "int32"),),
         attrs={"batch_dims": 1}, values=_indices(0, 3), static=((), (0,))),
    Case("strided_slice", fixed_rank(3, low=0, high=6), (F32,), attrs={"begin": [1, -4], "end": [4, 100],
                                                                       "strides": [1, 2]}),
    Case("strided_slice", fixed_rank(2, low=0, high=6), (F32,), attrs={"begin": [-1], "end": [-100],
                                                                       "strides": [-2]}),
    Case("strided_slice", fixed_rank(2, low=0, high=6), ("int32",), attrs={"begin": [1, -3], "end": [2, 2],
                                                                          "slice_mode": "size"}),
    Case("strided_slice", fixed_rank(3, low=0, high=6), (F32,), attrs={"begin": [2], "end": [5], "axes": [2]}),
    Case("broadcast_to", lambda rng: [(int(rng.integers(1, 2)) if rng.random() < 0.5 else 3, 1)], (F32,),
         attrs={"shape": [2, 3, 4]}),
    Case("broadcast_to_like", lambda rng: [(1, 3), (2, 3)], (F32,)),
    Case("tile", fixed_rank(2, low=0, high=3), (F32,), attrs={"reps": [2, 1, 3]}),
    Case("repeat", fixed_rank(2, low=0, high=3), (F32,), attrs={"repeats": 3, "axis": 1}),
    Case("reverse", fixed_rank(3), (F32,), attrs={"axis": 1}),
    Case("one_hot", lambda rng: [dims(rng, 2, 0, 3), (), ()], (("int32", F32, F32),), attrs={"depth": 4, "axis": 1},
         values=_indices(-1, 5)),
    Case("sequence_mask", _seq_mask_sample, ((F32, "int32"),), attrs={"mask_value": -1.0},
         values=_indices(0, 5)),
    # ---- nn ----
    Case("nn.dense", lambda rng: [(int(rng.integers(0, 5)), 8), (6, 8)], (F32, F64, "int32"), static=((1,), "all")),
    Case("nn.dense", lambda rng: [(2, int(rng.integers(1, 4)), 5), (3, 5)], (F32,), attrs={"units": 3},
         label="nd"),
    Case("nn.dense", lambda rng: [(3, 8), (4, 8)], (F16,), dynamic=False),
    Case("nn.dense_packed", lambda rng: [(int(rng.integers(0, 5)), 8), (2, 8, 16)], (F32, F64), attrs={"units": 20},
         static=((1,), "all")),
    Case("nn.dense_packed", lambda rng: [(2, int(rng.integers(1, 4)), 5), (1, 5, packed_lanes())], (F32,), attrs={"units": 16},
         label="nd"),
    Case("nn.conv2d_packed", lambda rng: [(int(rng.integers(0, 3)), 9, 6, 7), (2, 16 * 6, 16)], (F32, F64),
         attrs={"channels": 20, "in_channels": 9, "kernel_size": (3, 2), "strides": (2, 1), "padding": (1, 0, 1, 1),
                "dilation": (1, 2)}, static=((1,), "all")),
    Case("nn.dense", lambda rng: [(int(rng.integers(0, 5)), 8), (12, 8)], (F32, "int32"), static=((1,), "all"),
         label="blocked"),
    Case("nn.batch_matmul", lambda rng: [(2, int(rng.integers(1, 4)), 5), (2, 8, 5)], (F32,), label="blocked"),
    *[Case("nn.matmul", lambda rng, ta=ta, tb=tb: [((5, int(rng.integers(1, 5))) if ta else (int(rng.integers(1, 5)), 5)),
                                                  ((6, 5) if tb else (5, 6))],
           (F32,), attrs={"transpose_a": ta, "transpose_b": tb}) for ta in (False, True) for tb in (False, True)],
    Case("nn.batch_matmul", lambda rng: [(2, int(rng.integers(1, 4)), 5), (2, 3, 5)], (F32,)),
    Case("onnx.matmul", lambda rng: [(2, int(rng.integers(1, 4)), 4), (1, 4, int(rng.integers(1, 5)))], (F32,)),
    Case("nn.group_norm", lambda rng: [(int(rng.integers(1, 3)), 6, int(rng.integers(1, 4)), 2), (6,), (6,)],
         (F32, F16), attrs={"num_groups": 3}),
    Case("nn.group_norm", lambda rng: [(2, int(rng.integers(1, 4)), 4), (4,), (4,)], (F32,),
         attrs={"num_groups": 2, "axis": -1, "center": False}),
    Case("nn.lrn", lambda rng: [(int(rng.integers(1, 3)), int(rng.integers(1, 7)), 2, 3)], (F32, F16),
         attrs={"size": 3}),
    Case("nn.lrn", lambda rng: [(2, 3, int(rng.integers(1, 8)))], (F32,),
         attrs={"size": 4, "axis": -1, "alpha": 0.1, "beta": 0.5, "bias": 1.0}),
    Case("onnx.matmul", lambda rng: [(4,), (int(rng.integers(1, 3)), 4, 3)], (F32,), label="vec_mat"),
    Case("onnx.matmul", lambda rng: [(int(rng.integers(0, 4)), 4), (4,)], (F32, "int32"), label="mat_vec"),
    *[Case("trilu", lambda rng, k=k: [dims(rng, 3, 0, 5), k], ((F32, "int64"),), attrs={"upper": upper},
           values=small_ints(-3, 3), label=f"{'upper' if upper else 'lower'}_k{k[0] if k else 'scalar'}")
      for upper in (True, False) for k in ((1,), (), (0,))],
    Case("nn.batch_matmul", lambda rng: [(1, 4, 3), (2, 3, int(rng.integers(1, 5)))], (F32,),
         attrs={"transpose_b": False}),
    Case("nn.batch_matmul", lambda rng: [(2, 3, 4), (2, 3, 5)], (F32,), attrs={"transpose_a": True,
                                                                              "transpose_b": False}),
    Case("nn.bias_add", lambda rng: [dims(rng, 3, 0, 4)[:1] + (4,) + dims(rng, 1, 0, 3), (4,)], (F32, "int32")),
    Case("nn.bias_add", lambda rng: [dims(rng, 2, 0, 3) + (3,), (3,)], (F32,), attrs={"axis": -1}),
    Case("nn.prelu", lambda rng: [(int(rng.integers(0, 3)), 3, 2), (3,)], (F32,)),
    *[Case(op, fixed_rank(2, low=0, high=9), (F32, F64, F16), attrs={"axis": axis}, values=with_nans
           if op == "nn.softmax" else None)
      for op in ("nn.softmax", "nn.log_softmax") for axis in (-1, 0)],
    Case("nn.softmax", fixed_rank(4, low=1, high=4), (F32,), attrs={"axis": 1}),
    Case("nn.layer_norm", _norm_sample, (F32, F16)),
    Case("nn.layer_norm", lambda rng: [(3, int(rng.integers(1, 4)), 4), (3,), (3,)], (F32,),
         attrs={"axis": 0, "center": False}),
    Case("nn.layer_norm", _norm_sample, (F64,), attrs={"scale": False, "epsilon": 0.1}),
    Case("nn.rms_norm", lambda rng: _norm_sample(rng)[:2], (F32,)),
    Case("nn.instance_norm", lambda rng: [(2, 3, int(rng.integers(1, 5)), 2), (3,), (3,)], (F32,)),
    Case("nn.batch_norm", _bn_sample, (F32,), values=_bn_values),
    Case("nn.conv2d", _conv_sample(), (F32,), attrs={"padding": [1, 1]}, static=((1,), "all")),
    Case("nn.conv2d", _conv_sample(), (F32, F64), attrs={"strides": [2, 1], "dilation": [1, 2],
                                                         "padding": [0, 1, 2, 0]}, static=((1,), "all")),
    Case("nn.conv2d", _conv_sample(channels=4, out=6, groups=2), (F32,), attrs={"groups": 2, "padding": [1]},
         static=((1,), "all")),
    Case("nn.conv2d", _conv_sample(layout="NHWC", kernel_layout="HWIO"), (F32,),
         attrs={"data_layout": "NHWC", "kernel_layout": "HWIO", "padding": [1, 1]}, static=((3,), "all")),
    Case("nn.conv2d", lambda rng: [(1, 2, 5, 5), (3, 2, 1, 1)], ("int32",), dynamic=False),
    Case("nn.conv2d_transpose", _conv_t_sample, (F32,), attrs={"strides": [2, 2], "padding": [1, 0, 0, 1],
                                                                "output_padding": [1, 0]}, static=((1,), "all")),
    Case("nn.conv2d_transpose", lambda rng: [(1, 4, int(rng.integers(2, 5)), 3), (4, 2, 2, 3)], (F32,),
         attrs={"groups": 2, "dilation": [2, 1]}, static=((1,), "all")),
    *[Case("nn.max_pool2d", _pool_sample, (F32, "int8"), attrs=attrs, values=with_nans)
      for attrs in ({"pool_size": [2, 2], "strides": [2, 2]},
                    {"pool_size": [3, 2], "strides": [2, 1], "padding": [1, 0, 1, 1], "ceil_mode": True},
                    {"pool_size": [2, 2], "dilation": [2, 1]})],
    *[Case("nn.avg_pool2d", _pool_sample, (F32, "int32"), attrs=attrs)
      for attrs in ({"pool_size": [2, 2], "strides": [2, 2]},
                    {"pool_size": [3, 3], "strides": [2, 2], "padding": [1, 1], "ceil_mode": True},
                    {"pool_size": [3, 3], "padding": [1, 1], "count_include_pad": True})],
    Case("nn.max_pool2d", lambda rng: [(1, 6, 5, 2)], (F32,), attrs={"pool_size": [2, 2], "layout": "NHWC"},
         dynamic=False),
    *[Case(op, lambda rng: [(int(rng.integers(1, 3)), int(rng.integers(4, 9)), int(rng.integers(4, 9)), 2)],
           (F32, "int8"), attrs={"pool_size": [3, 3], "strides": [2, 2], "padding": [1, 0, 2, 1], "ceil_mode": True,
                                 "layout": "NHWC"}, label="padded_ceil_nhwc")
      for op in ("nn.max_pool2d", "nn.avg_pool2d")],
    *[Case(op, _pool_sample, (F32, "int32")) for op in ("nn.global_avg_pool2d", "nn.global_max_pool2d")],
    *[Case(op, _pool_sample, (F32,), attrs={"output_size": [3, 2]})
      for op in ("nn.adaptive_avg_pool2d", "nn.adaptive_max_pool2d")],
    Case("nn.adaptive_avg_pool2d", lambda rng: [(1, 2, 7, 5)], (F32,), attrs={"output_size": [3, 4]}, dynamic=False),
    Case("nn.pad", fixed_rank(2, low=0, high=4), (F32, "int8"), attrs={"pad_width": [[1, 2], [0, 1]]}),
    Case("nn.pad", _scalar_pair, (F32,), attrs={"pad_width": [[2, 0], [1, 1]]}, label="value"),
    *[Case("nn.pad", fixed_rank(2, low=3, high=5), (F32,), attrs={"pad_width": [[2, 1], [0, 2]], "pad_mode": m})
      for m in ("edge", "reflect")],
    *[Case("nn.depth_to_space", lambda rng: [(1, 8, int(rng.integers(1, 4)), 2)], (F32,),
           attrs={"block_size": 2, "mode": mode}) for mode in ("DCR", "CRD")],
    Case("nn.space_to_depth", lambda rng: [(1, 2, 2 * int(rng.integers(1, 3)), 4)], (F32,),
         attrs={"block_size": 2}),
]


def _kernels():
    """(case, dtype, dynamic, name, static_shapes) for every kernel of the module."""
    out = []
    for index, case in enumerate(CASES):
        shapes = case.sample(np.random.default_rng(index))
        for dtype in case.dtypes:
            for dynamic in (False, True) if case.dynamic else (False,):
                name = case.name(dtype, dynamic)
                name = f"{name}_{index}"
                out.append((case, dtype, dynamic, name, shapes))
    return out


KERNELS = _kernels()


@pytest.fixture(scope="module")
def all_kernels():
    prims = {name: primitive(case, shapes, dtype, dynamic) for case, dtype, dynamic, name, shapes in KERNELS}
    prims.update(_error_kernels())
    _, kernels = build_fused_module(prims)
    return kernels


@pytest.fixture(scope="module")
def compiled(all_kernels):
    return all_kernels


@pytest.fixture(scope="module")
def errors_module(all_kernels):
    return all_kernels


def _outputs_like(kernel, case, arrays):
    """Outputs of the kernel's dtypes and of the shapes the op's shape function gives (or the input's)."""
    opdef = get_op(case.op)
    args = [[a.shape for a in arrays]] if case.tuple_input else [a.shape for a in arrays]
    try:
        shapes = opdef.shape_func(Attrs(case.attrs), args)
    except TensorVMError:
        shapes = [arrays[0].shape]
    buffers = kernel.kernel.func.params[kernel.kernel.num_inputs:]
    return [np.empty(s, b.dtype) for s, b in zip(shapes, buffers)]


def _check(kernel, case, name, arrays):
    try:
        refs = reference(case, arrays)
    except TensorVMError:  # the NumPy kernel rejects these inputs: so must the C kernel
        with pytest.raises(TensorVMError):
            kernel(*arrays, *_outputs_like(kernel, case, arrays))
        return
    outs = [np.empty(r.shape, r.dtype) for r in refs]
    kernel(*arrays, *outs)
    sizes = magnitudes(case, arrays) or [None] * len(refs)
    for k, (out, ref, size) in enumerate(zip(outs, refs, sizes)):
        check_close(out, ref, f"{name} output {k} for shapes {[a.shape for a in arrays]}", size)


STATIC = [k for k in KERNELS if not k[2]]
DYNAMIC = [k for k in KERNELS if k[2]]


@pytest.mark.parametrize("case,dtype,dynamic,name,static_shapes", STATIC, ids=[k[3] for k in STATIC])
def test_static_kernel_matches_numpy(compiled, case, dtype, dynamic, name, static_shapes):
    for seed in range(3):
        arrays = make_inputs(case, np.random.default_rng(seed), static_shapes, dtype)
        _check(compiled[name], case, name, arrays)


@pytest.mark.parametrize("case,dtype,dynamic,name,static_shapes", DYNAMIC, ids=[k[3] for k in DYNAMIC])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_dynamic_kernel_matches_numpy(compiled, case, dtype, dynamic, name, static_shapes, seed):
    rng = np.random.default_rng(seed)
    arrays = make_inputs(case, rng, _conforming_sample(case, rng, static_shapes), dtype)
    _check(compiled[name], case, name, arrays)


def _flat(shapes, case):
    return list(shapes[0]) if case.tuple_input else list(shapes)


def _conforming_sample(case, rng, static_shapes):
    """New random shapes with the kernel's ranks and static dims (the kernel was typed from static_shapes)."""
    reference_shapes = _flat(static_shapes, case)
    for _ in range(1000):
        shapes = case.sample(rng)
        flat = _flat(shapes, case)
        if len(flat) != len(reference_shapes) or any(len(a) != len(b) for a, b in zip(flat, reference_shapes)):
            continue
        fixed = [case.static[i] if i < len(case.static) else () for i in range(len(flat))]
        if all(axes == "all" and tuple(a) == tuple(b) or axes != "all" and all(a[x] == b[x] for x in axes)
               for a, b, axes in zip(flat, reference_shapes, fixed)):
            return shapes
    return static_shapes


# ---- run-time errors --------------------------------------------------------------------------------


def _error_kernels():
    dyn2 = Case("add", None)
    return {
        "err_add": primitive(dyn2, [(3, 4), (3, 4)], "float32", True),
        "err_floordiv": primitive(Case("floor_divide", None), [(3,), (3,)], "int32", True),
        "err_take_fast": primitive(Case("take", None, attrs={"axis": 1, "mode": "fast"}), [(2, 3, 2), (1, 2)],
                                   ("float32", "int64"), True),
        "err_take_clip": primitive(Case("take", None, attrs={"axis": 1}), [(2, 3, 2), (1, 1)],
                                   ("float32", "int32"), True),
        "err_max": primitive(Case("max", None, attrs={"axis": [2]}), [(2, 2, 3)], "float32", True),
        "err_power": primitive(Case("power", None), [(3,), (3,)], "int32", True),
    }


def test_broadcast_mismatch_at_run_time(errors_module):
    x, y = np.ones((3, 4), "float32"), np.ones((2, 4), "float32")
    with pytest.raises(ShapeError, match="broadcast"):
        errors_module["err_add"](x, y, np.empty((3, 4), "float32"))


def test_wrong_output_shape_is_a_shape_error(errors_module):
    x = np.ones((3, 4), "float32")
    with pytest.raises(ShapeError, match="out0 dim 1"):
        errors_module["err_add"](x, x, np.empty((3, 5), "float32"))


def test_integer_division_by_zero(errors_module):
    x = np.array([1, 2, 3], "int32")
    with pytest.raises(ExecutionError, match="division by zero"):
        errors_module["err_floordiv"](x, np.array([1, 0, 1], "int32"), np.empty(3, "int32"))
    with pytest.raises(ExecutionError, match="division by zero"):
        errors_module["err_power"](np.array([0, 2, 1], "int32"), np.array([-1, 1, 1], "int32"), np.empty(3, "int32"))


def test_take_fast_mode_out_of_range(errors_module):
    data = np.ones((2, 3, 2), "float32")
    with pytest.raises(ExecutionError, match="out of range"):
        errors_module["err_take_fast"](data, np.array([[0, 3]], "int64"), np.empty((2, 1, 2, 2), "float32"))
    out = np.empty((2, 1, 2, 2), "float32")
    errors_module["err_take_fast"](data, np.array([[0, -3]], "int64"), out)  # -3 is in range: fine
    np.testing.assert_array_equal(out, np.ones_like(out))


def test_take_from_an_empty_axis(errors_module):
    with pytest.raises(ShapeError, match="size 0"):
        errors_module["err_take_clip"](np.ones((2, 0, 2), "float32"), np.zeros((1, 1), "int32"),
                                       np.empty((2, 1, 1, 2), "float32"))


def test_argument_checks(errors_module):
    kernel = errors_module["err_add"]
    x = np.ones((3, 4), "float32")
    out = np.empty((3, 4), "float32")
    with pytest.raises(ExecutionError, match="dtype float32"):
        kernel(x.astype("float64"), x, out)
    with pytest.raises(ExecutionError, match="C-contiguous"):
        kernel(np.ones((4, 3), "float32").T, x, out)
    with pytest.raises(ShapeError, match="rank"):
        kernel(np.ones((3, 4, 1), "float32"), x, out)
    with pytest.raises(ExecutionError, match="expected 2 input"):
        kernel(x, out)
    with pytest.raises(ExecutionError, match="NumPy array"):
        kernel([[1.0]], x, out)
    out.setflags(write=False)
    with pytest.raises(ExecutionError, match="read-only"):
        kernel(x, x, out)


def test_reduction_without_identity_on_empty_axis(errors_module):
    with pytest.raises(ShapeError, match="empty axis"):
        errors_module["err_max"](np.ones((2, 2, 0), "float32"), np.empty((2, 2), "float32"))


def test_default_values_cover_dtypes():
    rng = np.random.default_rng(0)
    for dtype in ("bool", "int8", "uint64", "float16"):
        assert default_values(rng, (3,), dtype).dtype == np.dtype(dtype)
