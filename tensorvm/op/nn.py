"""Neural-network operators (``nn.*``): dense/matmul, activations, softmax, normalizations,
convolutions, pooling, padding and a few layout shuffles.

As in ``transform.py``, each op's output shape is computed by one function over dims that may be
``Any``/``SymDim``, shared by the type relation (``TypeInferenceError``) and the shape function and kernel
(``ShapeError``). Kernels are vectorized NumPy: convolution is im2col (a strided window view) followed by
one batched matmul, pooling reduces a strided window view. They are the reference for bigger models.

Layouts are strings such as ``NCHW``/``NHWC`` (data) and ``OIHW``/``HWIO`` (kernel); any ordering of the
letters is accepted and the kernels transpose to the canonical order.
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from .. import te
from ..errors import AttrError, ShapeError, TypeInferenceError
from ..ir.types import Any, TensorType, TupleType
from ..te import expr as E
from ..te import intrin as M
from ..te.expr import Const, PrimExpr, cast, const, dtype_kind, eq, select
from ..te.tensor import Tensor, compute, reduce_axis
from ..te.tensor import max as te_max
from ..te.tensor import sum as te_sum
from ._common import erf, expect_tensor, identity_logic
from ._compute import (
    acc_float,
    axis_of,
    broadcast_read_dim,
    broadcast_shape,
    layout_compute,
    layout_reader,
    matmul_value,
    output_dtype,
    product,
    require_equal,
    reshape_to,
    static_dim,
    unary_compute,
    with_requires,
)
from .registry import REQUIRED, AttrDef, OpPattern
from .shape_logic import Sym, dim_or, dim_select, is_sym, require, traceable
from .transform import (
    add_dims,
    define,
    define_shaped,
    fmt_shape,
    int_pair,
    int_tuple,
    is_float_dtype,
    layout_of,
    mul_dims,
    norm_axis,
    one_of,
    optional_layout,
    padding4,
    prod_dims,
    to_bool,
    to_float,
    to_int,
    to_out_dtype,
    unify_dim,
)

__all__: list[str] = []


def _positive_int(value) -> int:
    value = to_int(value)
    if value < 1:
        raise ValueError(f"expected a positive integer, got {value}")
    return value


def _check_same_dtype(op: str, *names: str):
    """A ``check_types`` hook: the listed arguments share the first argument's dtype."""

    def check(types, attrs):
        for name, t in zip(names, types[1:], strict=False):
            if t.dtype != types[0].dtype:
                raise TypeInferenceError(f"{op}: {name} must have the data's dtype {types[0].dtype}, got {t.dtype}")

    return check


def _check_float(op: str, *names: str):
    same = _check_same_dtype(op, *names)

    def check(types, attrs):
        if not is_float_dtype(types[0].dtype):
            raise TypeInferenceError(f"{op}: expected a floating-point tensor, got {types[0].dtype}")
        same(types, attrs)

    return check


def _out_dtype(types, attrs):
    return attrs.out_dtype or types[0].dtype


def _acc_dtype(dtype) -> np.dtype:
    """The dtype to compute a float reduction in: at least float32 (float16 sums lose too much)."""
    return np.promote_types(dtype, np.float32)


def _broadcast_batch(op: str, a, b, err):
    if is_sym(a) or is_sym(b):
        require(dim_or(dim_or(a == b, a == 1), b == 1), f"{op}: batch dims must match, got {a} and {b}", err)
        return dim_select(a == 1, b, a)
    if a == 1:
        return b
    if b == 1:
        return a
    return unify_dim(op, a, b, "batch dims", err)


def _div_dim(op: str, dim, k: int, err, what: str):
    if is_sym(dim):
        require(dim % k == 0, f"{op}: {what} ({dim}) must be divisible by {k}", err)
        return dim // k
    if isinstance(dim, int):
        if dim % k:
            raise err(f"{op}: {what} ({dim}) must be divisible by {k}")
        return dim // k
    return dim if k == 1 else Any()


def _expect_rank(op: str, shape, rank: int, what: str, err):
    if len(shape) != rank:
        raise err(f"{op}: {what} must have rank {rank}, got shape {fmt_shape(shape)}")


# Layout helpers: ``canonical`` is e.g. "NCHW"; ``layout`` a permutation of its letters.

def _to_canonical(shape, layout: str, canonical: str) -> tuple:
    return tuple(shape[layout.index(c)] for c in canonical)


def _from_canonical(shape, canonical: str, layout: str) -> tuple:
    return tuple(shape[canonical.index(c)] for c in layout)


def _array_to_canonical(x: np.ndarray, layout: str, canonical: str) -> np.ndarray:
    return x if layout == canonical else x.transpose([layout.index(c) for c in canonical])


def _array_from_canonical(x: np.ndarray, canonical: str, layout: str) -> np.ndarray:
    return x if layout == canonical else np.ascontiguousarray(x.transpose([canonical.index(c) for c in layout]))


# ---------------------------------------------------------------------------------------------------
# dense, matmul, batch_matmul


@traceable
def _dense_logic(op, attrs, shapes, err):
    data, weight = shapes
    if len(data) < 1:
        raise err(f"{op}: data must have rank >= 1, got a scalar")
    _expect_rank(op, weight, 2, "weight (units, in_dim)", err)
    units = weight[0]
    if attrs.units is not None:
        units = unify_dim(op, units, attrs.units, "the units attribute and weight dim 0", err)
    unify_dim(op, data[-1], weight[1], "the data's last dim and the weight's dim 1", err)
    return tuple(data[:-1]) + (units,)


def _matmul_kernel(a: np.ndarray, b: np.ndarray, out_dtype: str) -> np.ndarray:
    acc = np.dtype(out_dtype)
    return np.matmul(a.astype(acc, copy=False), b.astype(acc, copy=False))


_OUT_DTYPE = AttrDef("out_dtype", "", to_out_dtype, "output dtype; empty: the input's")
_UNITS = AttrDef("units", None, _positive_int, "the number of output units (checked against the weight)")


def _dense_compute(attrs, inputs, out_type):
    x, w = inputs
    dtype = output_dtype(out_type)
    k = reduce_axis(x.shape[-1], "k")
    requires = require_equal("nn.dense", x.shape[-1], w.shape[1], "the data's last dim and the weight's dim 1")
    if attrs.units is not None:
        requires += require_equal("nn.dense", w.shape[0], const(attrs.units), "units and the weight's dim 0")
    shape = tuple(x.shape[:-1]) + (w.shape[0],)
    return [compute(shape, lambda *i: te_sum(matmul_value(x[tuple(i[:-1]) + (k.var,)], w[i[-1], k.var], k, dtype),
                                             k), "dense", requires)]


def _blas_dense(attrs, x, w, out):
    if x.ndim == 2:
        np.matmul(x, w.T, out=out)
    else:  # (..., K) rows as one matrix: one BLAS call
        np.matmul(x.reshape(-1, x.shape[-1]), w.T, out=out.reshape(-1, out.shape[-1]))


def _dense_strategy(attrs, inputs, out_type):
    """BLAS (from C, or through NumPy: ``_blas_dense``) when big enough, a vector-friendly C variant."""
    from ..codegen.strategy import gemm_call, matmul_implementations

    x, w = inputs
    rows = product(x.shape[:-1])
    gemm = gemm_call(1, rows, w.shape[0], x.shape[-1], 0, False, 0, True)
    return matmul_implementations(rows, w.shape[0], x.shape[-1], inputs, out_type, _blas_dense, gemm)


define_shaped(
    "nn.dense", 2, _dense_logic,
    lambda attrs, shape, x, w: _matmul_kernel(x, w.T, attrs.out_dtype or x.dtype.name),
    OpPattern.OUT_ELEMWISE_FUSABLE, attrs=(_UNITS, _OUT_DTYPE), dtype_rule=_out_dtype,
    check_types=_check_same_dtype("nn.dense", "weight"),
    doc="y = x W^T with x of shape (..., in_dim) and W of shape (units, in_dim).",
    compute=_dense_compute, strategy=_dense_strategy,
)


# nn.dense_packed: nn.dense with its weight (units, in_dim) stored as panels of ``lanes`` output columns,
# (ceil(units / lanes), in_dim, lanes), zero padded: the layout the C product tv_gemm_packed_f32 reads
# contiguously (tensorvm/transform/pack_weights.py makes it from constants). ``lanes`` is the panel width
# of this host's product (two vectors: 16 with AVX2, 32 with AVX-512; tensorvm/codegen/host.py).
PACKED_LANES = 16  # (the AVX2 width; ``packed_lanes()`` is this host's)


def packed_lanes() -> int:
    """The panel width of this host's packed product (``tensorvm.codegen.host.gemm_params().nr``)."""
    from ..codegen.host import gemm_params

    return gemm_params().nr


def pack_dense_weight(weight: np.ndarray, lanes: int | None = None) -> np.ndarray:
    """The (units, in_dim) weight of ``nn.dense`` as ``nn.dense_packed``'s panels of ``lanes`` columns
    (default: ``packed_lanes()``; read-only, 64-byte aligned)."""
    from ..codegen.host import pack_panels

    weight = np.asarray(weight)
    if weight.ndim != 2:
        raise ShapeError(f"pack_dense_weight: expected a 2-D (units, in_dim) weight, got shape {weight.shape}")
    lanes = lanes or packed_lanes()
    packed = pack_panels(weight, lanes, weight.dtype)
    packed.setflags(write=False)
    return packed


def unpack_dense_weight(packed: np.ndarray, units: int) -> np.ndarray:
    """The inverse of ``pack_dense_weight``: the (units, in_dim) weight."""
    panels, in_dim, lanes = packed.shape
    return packed.transpose(0, 2, 1).reshape(panels * lanes, in_dim)[:units]


@traceable
def _dense_packed_logic(op, attrs, shapes, err):
    data, packed = shapes
    if len(data) < 1:
        raise err(f"{op}: data must have rank >= 1, got a scalar")
    _expect_rank(op, packed, 3, "packed_weight (panels, in_dim, lanes)", err)
    lanes = packed[2] if isinstance(packed[2], int) else packed_lanes()  # (unknown: this host's width)
    lanes = unify_dim(op, packed[2], lanes, "the packed weight's dim 2 and its panel width", err)
    if not isinstance(lanes, int) or lanes < 1:
        raise err(f"{op}: the packed weight's panel width (dim 2) must be positive, got {lanes}")
    unify_dim(op, packed[0], -(-attrs.units // lanes), f"the packed weight's dim 0 and ceil(units / "
              f"{lanes}) for units={attrs.units}", err)
    unify_dim(op, data[-1], packed[1], "the data's last dim and the packed weight's dim 1", err)
    return tuple(data[:-1]) + (attrs.units,)


def _dense_packed_compute(attrs, inputs, out_type):
    x, w = inputs
    dtype = output_dtype(out_type)
    # (a panel width unknown at compile time is this host's, checked at run time)
    lanes = w.shape[2].value if isinstance(w.shape[2], Const) else packed_lanes()
    k = reduce_axis(x.shape[-1], "k")
    requires = require_equal("nn.dense_packed", x.shape[-1], w.shape[1],
                              "the data's last dim and the packed weight's dim 1")
    requires += require_equal("nn.dense_packed", w.shape[2], const(lanes), f"the packed weight's dim 2 and {lanes}")
    requires += require_equal("nn.dense_packed", w.shape[0], const(-(-attrs.units // lanes)),
                               f"ceil(units / {lanes}) and the packed weight's dim 0")
    shape = tuple(x.shape[:-1]) + (const(attrs.units),)

    def f(*i):
        j = i[-1]
        weight = w[E.floordiv(j, lanes), k.var, E.floormod(j, lanes)]
        return te_sum(matmul_value(x[tuple(i[:-1]) + (k.var,)], weight, k, dtype), k)

    return [compute(shape, f, "dense_packed", requires)]


def _dense_packed_strategy(attrs, inputs, out_type):
    """float32: always the packed product (measured at least as fast as BLAS from 1 to 256 rows at BERT
    and MLP sizes, on 1 and 2 threads; see ``tensorvm/transform/pack_weights.py``). Other dtypes, and
    panels of another width than this host's product (packed for another CPU): the generated kernel over
    the packed layout."""
    from ..codegen.strategy import Implementation, PackedGemmCall, index_expr

    x, w = inputs
    lanes = w.shape[2].value if isinstance(w.shape[2], Const) else packed_lanes()  # (as the compute)
    if {x.dtype, w.dtype, out_type.dtype} != {"float32"} or lanes != packed_lanes():
        return []

    call = PackedGemmCall(index_expr(product(x.shape[:-1])), index_expr(attrs.units), index_expr(x.shape[-1]), lanes)
    return [Implementation("packed", True, plevel=20, call=call)]


define_shaped(
    "nn.dense_packed", 2, _dense_packed_logic,
    lambda attrs, shape, x, p: _matmul_kernel(x, unpack_dense_weight(p, attrs.units).T, attrs.out_dtype or x.dtype.name),
    OpPattern.OUT_ELEMWISE_FUSABLE,
    attrs=(AttrDef("units", REQUIRED, _positive_int, "the number of output units (columns of the result)"),
           _OUT_DTYPE),
    dtype_rule=_out_dtype, check_types=_check_same_dtype("nn.dense_packed", "packed_weight"),
    doc="nn.dense with a pre-packed weight: y[..., j] = sum_k x[..., k] * packed_weight[j // L, k, j % L], "
        "packed_weight of shape (ceil(units / L), in_dim, L) for a panel width L (this host's: "
        "``packed_lanes()``).",
    compute=_dense_packed_compute, strategy=_dense_packed_strategy,
)


@traceable
def _matmul_logic(op, attrs, shapes, err):
    a, b = shapes
    if len(a) < (2 if attrs.transpose_a else 1):
        raise err(f"{op}: tensor_a has too few dims: {fmt_shape(a)}")
    _expect_rank(op, b, 2, "tensor_b", err)
    if attrs.transpose_a:
        k, prefix = a[-2], tuple(a[:-2]) + (a[-1],)
    else:
        k, prefix = a[-1], tuple(a[:-1])
    k2, n = (b[1], b[0]) if attrs.transpose_b else (b[0], b[1])
    unify_dim(op, k, k2, "the reduction dims of tensor_a and tensor_b", err)
    if attrs.units is not None:
        n = unify_dim(op, n, attrs.units, "the units attribute and tensor_b's output dim", err)
    return prefix + (n,)


def _nn_matmul_kernel(attrs, shape, a, b):
    a = np.swapaxes(a, -1, -2) if attrs.transpose_a else a
    b = b.T if attrs.transpose_b else b
    return _matmul_kernel(a, b, attrs.out_dtype or a.dtype.name)


def _matmul_compute(attrs, inputs, out_type):
    a, b = inputs
    dtype = output_dtype(out_type)
    if attrs.transpose_a:
        kdim, prefix = a.shape[-2], tuple(a.shape[:-2]) + (a.shape[-1],)
    else:
        kdim, prefix = a.shape[-1], tuple(a.shape[:-1])
    k2, n = (b.shape[1], b.shape[0]) if attrs.transpose_b else (b.shape[0], b.shape[1])
    requires = require_equal("nn.matmul", kdim, k2, "the reduction dims of tensor_a and tensor_b")
    k = reduce_axis(kdim, "k")

    def f(*i):
        head, j = i[:-1], i[-1]
        a_index = tuple(head[:-1]) + (k.var, head[-1]) if attrs.transpose_a else tuple(head) + (k.var,)
        b_index = (j, k.var) if attrs.transpose_b else (k.var, j)
        return te_sum(matmul_value(a[a_index], b[b_index], k, dtype), k)

    return [compute(prefix + (n,), f, "matmul", requires)]


def _blas_matmul(attrs, a, b, out):
    rhs = b.T if attrs.transpose_b else b
    if attrs.transpose_a:
        np.matmul(np.swapaxes(a, -1, -2), rhs, out=out)
    elif a.ndim == 2:
        np.matmul(a, rhs, out=out)
    else:
        np.matmul(a.reshape(-1, a.shape[-1]), rhs, out=out.reshape(-1, out.shape[-1]))


def _matmul_strategy(attrs, inputs, out_type):
    from ..codegen.strategy import gemm_call, matmul_implementations

    a, b = inputs
    rows = product(a.shape[:-2] + (a.shape[-1],)) if attrs.transpose_a else product(a.shape[:-1])
    k = a.shape[-2] if attrs.transpose_a else a.shape[-1]
    n = b.shape[0] if attrs.transpose_b else b.shape[1]
    gemm = None
    if not attrs.transpose_a or a.ndim == 2:  # (a batched, transposed A is not one product)
        gemm = gemm_call(1, rows, n, k, 0, attrs.transpose_a, 0, attrs.transpose_b)
    return matmul_implementations(rows, n, k, inputs, out_type, _blas_matmul, gemm)


define_shaped(
    "nn.matmul", 2, _matmul_logic, _nn_matmul_kernel, OpPattern.OUT_ELEMWISE_FUSABLE,
    attrs=(_UNITS, _OUT_DTYPE, AttrDef("transpose_a", False, to_bool), AttrDef("transpose_b", False, to_bool)),
    dtype_rule=_out_dtype, check_types=_check_same_dtype("nn.matmul", "tensor_b"),
    doc="y = A B with A of shape (..., K) (or (..., K, M) transposed) and a 2-D B of shape (K, N) "
        "(or (N, K) transposed).",
    compute=_matmul_compute, strategy=_matmul_strategy,
)


@traceable
def _batch_matmul_logic(op, attrs, shapes, err):
    x, y = shapes
    _expect_rank(op, x, 3, "x", err)
    _expect_rank(op, y, 3, "y", err)
    bx, m, k1 = (x[0], x[2], x[1]) if attrs.transpose_a else tuple(x)
    by, n, k2 = tuple(y) if attrs.transpose_b else (y[0], y[2], y[1])
    unify_dim(op, k1, k2, "the reduction dims of x and y", err)
    return (_broadcast_batch(op, bx, by, err), m, n)


def _batch_matmul_kernel(attrs, shape, x, y):
    x = np.swapaxes(x, 1, 2) if attrs.transpose_a else x
    y = np.swapaxes(y, 1, 2) if attrs.transpose_b else y
    return _matmul_kernel(x, y, attrs.out_dtype or x.dtype.name)


def _batch_matmul_compute(attrs, inputs, out_type):
    x, y = inputs
    dtype = output_dtype(out_type)
    bx, m, k1 = (x.shape[0], x.shape[2], x.shape[1]) if attrs.transpose_a else tuple(x.shape)
    by, n, k2 = tuple(y.shape) if attrs.transpose_b else (y.shape[0], y.shape[2], y.shape[1])
    (batch,), requires = broadcast_shape("nn.batch_matmul", (bx,), (by,))
    requires += require_equal("nn.batch_matmul", k1, k2, "the reduction dims of x and y")
    k = reduce_axis(k1, "k")

    def f(bi, i, j):
        xb = broadcast_read_dim(x.shape[0], bi, batch)
        yb = broadcast_read_dim(y.shape[0], bi, batch)
        xv = x[xb, k.var, i] if attrs.transpose_a else x[xb, i, k.var]
        yv = y[yb, j, k.var] if attrs.transpose_b else y[yb, k.var, j]
        return te_sum(matmul_value(xv, yv, k, dtype), k)

    return [compute((batch, m, n), f, "batch_matmul", requires)]


def _blas_batch_matmul(attrs, x, y, out):
    np.matmul(np.swapaxes(x, 1, 2) if attrs.transpose_a else x,
              np.swapaxes(y, 1, 2) if attrs.transpose_b else y, out=out)


def _batch_matmul_strategy(attrs, inputs, out_type):
    from ..codegen.strategy import gemm_call, matmul_implementations

    x, y = inputs
    m, k = (x.shape[2], x.shape[1]) if attrs.transpose_a else (x.shape[1], x.shape[2])
    n = y.shape[1] if attrs.transpose_b else y.shape[2]
    batch = E.maximum(x.shape[0], y.shape[0])  # the broadcast batch (a batch of 0 has no work anyway)
    gemm = gemm_call(batch, m, n, k, select(eq(x.shape[0], 1), 0, m * k), attrs.transpose_a,
                     select(eq(y.shape[0], 1), 0, k * n), attrs.transpose_b)
    return matmul_implementations(m * batch, n, k, inputs, out_type, _blas_batch_matmul, gemm)


define_shaped(
    "nn.batch_matmul", 2, _batch_matmul_logic, _batch_matmul_kernel, OpPattern.OUT_ELEMWISE_FUSABLE,
    attrs=(_OUT_DTYPE, AttrDef("transpose_a", False, to_bool), AttrDef("transpose_b", True, to_bool)),
    dtype_rule=_out_dtype, check_types=_check_same_dtype("nn.batch_matmul", "y"),
    doc="Batched x y (y transposed by default, like Relay): (B, M, K) x (B, N, K) -> (B, M, N); a batch "
        "of 1 broadcasts.",
    compute=_batch_matmul_compute, strategy=_batch_matmul_strategy,
)


# ---------------------------------------------------------------------------------------------------
# bias_add, activations


def _channel_vectors(op, data, vectors, axis, err, names):
    """Check that each of ``vectors`` is 1-D of length ``data[axis]``. Returns the normalized axis and
    the data's shape with that dim refined by the vectors' lengths (``?`` and ``(8,)`` give 8)."""
    axis = norm_axis(op, axis, len(data), err)
    channels = data[axis]
    for name, vec in zip(names, vectors, strict=True):
        _expect_rank(op, vec, 1, name, err)
        channels = unify_dim(op, channels, vec[0], f"data dim {axis} and the length of {name}", err)
    return axis, tuple(data[:axis]) + (channels,) + tuple(data[axis + 1:])


def _along(vec: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """Reshape a 1-D vector to broadcast along ``axis`` of a rank-``ndim`` tensor."""
    return vec.reshape((-1,) + (1,) * (ndim - axis - 1))


def _bias_logic(name):
    @traceable
    def logic(op, attrs, shapes, err):
        return _channel_vectors(op, shapes[0], shapes[1:], attrs.axis, err, (name,))[1]

    return logic


def _bias_add_compute(attrs, inputs, out_type):
    x, b = inputs
    axis = axis_of("nn.bias_add", attrs.axis, x.ndim)
    requires = require_equal("nn.bias_add", x.shape[axis], b.shape[0], "the data's channel dim and the bias")
    return [compute(x.shape, lambda *i: x[i] + b[i[axis]], "bias_add", requires)]


define_shaped(
    "nn.bias_add", 2, _bias_logic("bias"),
    lambda attrs, shape, x, b: x + _along(b, attrs.axis % x.ndim, x.ndim), OpPattern.BROADCAST,
    attrs=(AttrDef("axis", 1, to_int),), check_types=_check_same_dtype("nn.bias_add", "bias"),
    doc="Add a 1-D bias along ``axis``.",
    compute=_bias_add_compute,
)


def _unary(name, kernel, attrs=(), floats_only=False, doc="", compute=None):
    define_shaped(
        name, 1, identity_logic, lambda attrs, shape, x: kernel(attrs, x),
        OpPattern.ELEMWISE, attrs=attrs, check_types=_check_float(name) if floats_only else None, doc=doc,
        compute=compute,
    )


_unary("nn.relu", lambda attrs, x: np.maximum(x, x.dtype.type(0)), doc="max(x, 0).",
       compute=unary_compute("nn.relu", lambda x, a: E.maximum(x, 0)))
_unary(
    "nn.leaky_relu", lambda attrs, x: np.where(x > 0, x, x * x.dtype.type(attrs.alpha)),
    attrs=(AttrDef("alpha", 0.01, to_float),), floats_only=True, doc="x if x > 0 else alpha * x.",
    compute=unary_compute("nn.leaky_relu", lambda x, a: select(x > 0, x, x * const(a.alpha, x.dtype))),
)


def _gelu(attrs, x):
    acc = x.astype(np.float64)
    if attrs.approximate == "tanh":
        inner = math.sqrt(2 / math.pi) * (acc + 0.044715 * acc**3)
        return (0.5 * acc * (1 + np.tanh(inner))).astype(x.dtype)
    # erf in x's own precision: exact for float64, the fast vectorized form for float32/float16.
    phi = erf((acc / math.sqrt(2)).astype(x.dtype)).astype(np.float64)
    return (0.5 * acc * (1 + phi)).astype(x.dtype)


def _gelu_te(x, attrs):
    acc = acc_float(x.dtype)
    v = cast(x, acc)
    if attrs.approximate == "tanh":
        inner = const(math.sqrt(2 / math.pi), acc) * (v + const(0.044715, acc) * v * v * v)
        y = const(0.5, acc) * v * (const(1.0, acc) + M.tanh(inner))
    else:
        y = const(0.5, acc) * v * (const(1.0, acc) + M.erf(v * const(1 / math.sqrt(2), acc)))
    return y


_unary(
    "nn.gelu", _gelu, attrs=(AttrDef("approximate", "none", one_of("none", "tanh")),), floats_only=True,
    doc="x * Phi(x) (exact, with erf) or its tanh approximation.",
    compute=unary_compute("nn.gelu", _gelu_te),
)


def _prelu_compute(attrs, inputs, out_type):
    x, alpha = inputs
    axis = axis_of("nn.prelu", attrs.axis, x.ndim)
    requires = require_equal("nn.prelu", x.shape[axis], alpha.shape[0], "the data's channel dim and alpha")
    return [compute(x.shape, lambda *i: select(x[i] > 0, x[i], x[i] * alpha[i[axis]]), "prelu", requires)]


define_shaped(
    "nn.prelu", 2, _bias_logic("alpha"),
    lambda attrs, shape, x, a: np.where(x > 0, x, x * _along(a, attrs.axis % x.ndim, x.ndim)).astype(x.dtype),
    OpPattern.BROADCAST, attrs=(AttrDef("axis", 1, to_int),), check_types=_check_float("nn.prelu", "alpha"),
    doc="x if x > 0 else alpha[c] * x, with the 1-D alpha along ``axis``.",
    compute=_prelu_compute,
)


@traceable
def _axis_logic(op, attrs, shapes, err):
    norm_axis(op, attrs.axis, len(shapes[0]), err)
    return tuple(shapes[0])


def _softmax(attrs, shape, x, log=False):
    if x.size == 0:
        return x.copy()
    acc = x.astype(_acc_dtype(x.dtype))
    shifted = acc - acc.max(axis=attrs.axis, keepdims=True)
    exp = np.exp(shifted)
    total = exp.sum(axis=attrs.axis, keepdims=True)
    out = shifted - np.log(total) if log else exp / total
    return out.astype(x.dtype)


def _softmax_te(attrs, x: Tensor, log: bool):
    axis = axis_of("nn.softmax", attrs.axis, x.ndim)
    acc = acc_float(x.dtype)
    kept = tuple(d for a, d in enumerate(x.shape) if a != axis)

    def kept_of(i):
        return tuple(j for a, j in enumerate(i) if a != axis)

    def full(kept_index, r):
        index = list(kept_index)
        index.insert(axis, r)
        return tuple(index)

    r1 = reduce_axis(x.shape[axis], "r")
    peak = compute(kept, lambda *i: te_max(cast(x[full(i, r1.var)], acc), r1), "softmax_max")
    shifted = compute(x.shape, lambda *i: cast(x[i], acc) - peak[kept_of(i)], "softmax_shift")
    exps = compute(x.shape, lambda *i: M.exp(shifted[i]), "softmax_exp")
    r2 = reduce_axis(x.shape[axis], "s")
    total = compute(kept, lambda *i: te_sum(exps[full(i, r2.var)], r2), "softmax_sum")
    if log:
        return compute(x.shape, lambda *i: cast(shifted[i] - M.log(total[kept_of(i)]), x.dtype), "log_softmax")
    return compute(x.shape, lambda *i: cast(exps[i] / total[kept_of(i)], x.dtype), "softmax")


def _softmax_compute(attrs, inputs, out_type):
    return [_softmax_te(attrs, inputs[0], log=False)]


def _softmax_strategy(attrs, inputs, out_type, log: bool = False):
    """float32 over the last axis: ``tv_softmax_f32`` (``SoftmaxCall``); otherwise the generated kernel."""
    from ..codegen.strategy import Implementation, SoftmaxCall, index_expr

    (x,) = inputs
    if x.ndim == 0 or {x.dtype, out_type.dtype} != {"float32"} or not -x.ndim <= attrs.axis < x.ndim \
            or attrs.axis % x.ndim != x.ndim - 1:
        return []
    call = SoftmaxCall(index_expr(product(x.shape[:-1])), index_expr(x.shape[-1]), log)
    return [Implementation("rows", True, plevel=20, call=call)]


def _log_softmax_strategy(attrs, inputs, out_type):
    return _softmax_strategy(attrs, inputs, out_type, log=True)


define_shaped(
    "nn.softmax", 1, _axis_logic, _softmax, OpPattern.OPAQUE, attrs=(AttrDef("axis", -1, to_int),),
    check_types=_check_float("nn.softmax"), doc="exp(x) / sum(exp(x)) along ``axis``.",
    compute=_softmax_compute, strategy=_softmax_strategy,
)


def _log_softmax_compute(attrs, inputs, out_type):
    return [_softmax_te(attrs, inputs[0], log=True)]


define_shaped(
    "nn.log_softmax", 1, _axis_logic, lambda attrs, shape, x: _softmax(attrs, shape, x, log=True),
    OpPattern.OPAQUE, attrs=(AttrDef("axis", -1, to_int),), check_types=_check_float("nn.log_softmax"),
    doc="x - log(sum(exp(x))) along ``axis``.",
    compute=_log_softmax_compute, strategy=_log_softmax_strategy,
)


# ---------------------------------------------------------------------------------------------------
# normalizations (inference)

_EPSILON = AttrDef("epsilon", 1e-5, to_float)
_CENTER = AttrDef("center", True, to_bool)
_SCALE = AttrDef("scale", True, to_bool)


def _normalize(x: np.ndarray, axes: tuple, epsilon: float) -> np.ndarray:
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon)


def _scale_shift(attrs, y, axis, gamma, beta):
    if attrs.scale:
        y = y * _along(gamma.astype(y.dtype), axis, y.ndim)
    if attrs.center and beta is not None:
        y = y + _along(beta.astype(y.dtype), axis, y.ndim)
    return y


def _norm_logic(names):
    @traceable
    def logic(op, attrs, shapes, err):
        return _channel_vectors(op, shapes[0], shapes[1:], attrs.axis, err, names)[1]

    return logic


def _layer_norm(attrs, shape, x, gamma, beta):
    if x.size == 0:
        return x.copy()
    axis = attrs.axis % x.ndim
    y = _normalize(x.astype(_acc_dtype(x.dtype)), (axis,), attrs.epsilon)
    return _scale_shift(attrs, y, axis, gamma, beta).astype(x.dtype)


def _normalized(op: str, x: Tensor, axes: tuple, epsilon: float, prefix: str):
    """(x - mean) / sqrt(var + epsilon) over ``axes``, in the float accumulation dtype (a compute)."""
    acc = acc_float(x.dtype)
    kept = tuple(d for a, d in enumerate(x.shape) if a not in axes)
    count = cast(product(x.shape[a] for a in axes), acc)

    def kept_of(i):
        return tuple(j for a, j in enumerate(i) if a not in axes)

    def full(kept_index, raxes):
        it, rit = iter(kept_index), iter(raxes)
        return tuple(next(rit).var if a in axes else next(it) for a in range(x.ndim))

    r1 = [reduce_axis(x.shape[a], f"r{a}") for a in axes]
    total = compute(kept, lambda *i: te_sum(cast(x[full(i, r1)], acc), r1), f"{prefix}_sum")
    mean_ = compute(kept, lambda *i: total[i] / count, f"{prefix}_mean")
    r2 = [reduce_axis(x.shape[a], f"v{a}") for a in axes]

    def squares(*i):
        d = cast(x[full(i, r2)], acc) - mean_[i]
        return te_sum(d * d, r2)

    sq = compute(kept, squares, f"{prefix}_sq")
    denom = compute(kept, lambda *i: M.sqrt(sq[i] / count + const(epsilon, acc)), f"{prefix}_denom")
    return compute(x.shape, lambda *i: (cast(x[i], acc) - mean_[kept_of(i)]) / denom[kept_of(i)], f"{prefix}_norm")


def _scale_shift_te(y: Tensor, attrs, axis: int, gamma: Tensor | None, beta: Tensor | None, dtype: str, name: str):
    def f(*i):
        v = y[i]
        if attrs.scale and gamma is not None:
            v = v * cast(gamma[i[axis]], v.dtype)
        if attrs.center and beta is not None:
            v = v + cast(beta[i[axis]], v.dtype)
        return cast(v, dtype)

    return compute(y.shape, f, name)


def _channel_requires(op: str, x: Tensor, axis: int, vectors) -> list:
    requires = []
    for vec in vectors:
        requires += require_equal(op, x.shape[axis], vec.shape[0], "the channel dim and a per-channel vector")
    return requires


def _layer_norm_compute(attrs, inputs, out_type):
    x, gamma, beta = inputs
    axis = axis_of("nn.layer_norm", attrs.axis, x.ndim)
    y = _normalized("nn.layer_norm", x, (axis,), attrs.epsilon, "ln")
    out = _scale_shift_te(y, attrs, axis, gamma, beta, x.dtype, "layer_norm")
    return [with_requires(out, _channel_requires("nn.layer_norm", x, axis, (gamma, beta)))]


define_shaped(
    "nn.layer_norm", 3, _norm_logic(("gamma", "beta")), _layer_norm, OpPattern.OPAQUE,
    attrs=(AttrDef("axis", -1, to_int), _EPSILON, _CENTER, _SCALE),
    check_types=_check_float("nn.layer_norm", "gamma", "beta"),
    doc="(x - mean) / sqrt(var + epsilon) * gamma + beta over ``axis``.",
    compute=_layer_norm_compute,
)


def _rms_norm(attrs, shape, x, gamma):
    if x.size == 0:
        return x.copy()
    axis = attrs.axis % x.ndim
    acc = x.astype(_acc_dtype(x.dtype))
    y = acc / np.sqrt((acc * acc).mean(axis=axis, keepdims=True) + attrs.epsilon)
    return (y * _along(gamma.astype(y.dtype), axis, x.ndim)).astype(x.dtype)


def _rms_norm_compute(attrs, inputs, out_type):
    x, gamma = inputs
    axis = axis_of("nn.rms_norm", attrs.axis, x.ndim)
    acc = acc_float(x.dtype)
    kept = tuple(d for a, d in enumerate(x.shape) if a != axis)
    r = reduce_axis(x.shape[axis], "r")

    def full(i, rv):
        index = list(i)
        index.insert(axis, rv)
        return tuple(index)

    sq = compute(kept, lambda *i: te_sum(cast(x[full(i, r.var)], acc) * cast(x[full(i, r.var)], acc), r), "rms_sq")
    count = cast(x.shape[axis], acc)
    denom = compute(kept, lambda *i: M.sqrt(sq[i] / count + const(attrs.epsilon, acc)), "rms_denom")
    requires = _channel_requires("nn.rms_norm", x, axis, (gamma,))

    def f(*i):
        kept_index = tuple(j for a, j in enumerate(i) if a != axis)
        return cast(cast(x[i], acc) / denom[kept_index] * cast(gamma[i[axis]], acc), x.dtype)

    return [compute(x.shape, f, "rms_norm", requires)]


define_shaped(
    "nn.rms_norm", 2, _norm_logic(("gamma",)), _rms_norm, OpPattern.OPAQUE,
    attrs=(AttrDef("axis", -1, to_int), _EPSILON), check_types=_check_float("nn.rms_norm", "gamma"),
    doc="x / sqrt(mean(x^2) + epsilon) * gamma over ``axis``.",
    compute=_rms_norm_compute,
)


def _instance_norm(attrs, shape, x, gamma, beta):
    if x.size == 0:
        return x.copy()
    axis = attrs.axis % x.ndim
    axes = tuple(i for i in range(1, x.ndim) if i != axis)
    y = _normalize(x.astype(_acc_dtype(x.dtype)), axes, attrs.epsilon)
    return _scale_shift(attrs, y, axis, gamma, beta).astype(x.dtype)


@traceable
def _instance_norm_logic(op, attrs, shapes, err):
    if len(shapes[0]) < 2:
        raise err(f"{op}: data must have rank >= 2, got {fmt_shape(shapes[0])}")
    if norm_axis(op, attrs.axis, len(shapes[0]), err) == 0:
        raise err(f"{op}: the channel axis cannot be the batch axis 0")
    return _norm_logic(("gamma", "beta"))(op, attrs, shapes, err)


def _instance_norm_compute(attrs, inputs, out_type):
    x, gamma, beta = inputs
    axis = axis_of("nn.instance_norm", attrs.axis, x.ndim)
    axes = tuple(a for a in range(1, x.ndim) if a != axis)
    y = _normalized("nn.instance_norm", x, axes, attrs.epsilon, "in")
    out = _scale_shift_te(y, attrs, axis, gamma, beta, x.dtype, "instance_norm")
    return [with_requires(out, _channel_requires("nn.instance_norm", x, axis, (gamma, beta)))]


define_shaped(
    "nn.instance_norm", 3, _instance_norm_logic, _instance_norm, OpPattern.OPAQUE,
    attrs=(AttrDef("axis", 1, to_int), _EPSILON, _CENTER, _SCALE),
    check_types=_check_float("nn.instance_norm", "gamma", "beta"),
    doc="Normalize each (sample, channel) over the remaining dims, then scale and shift per channel.",
    compute=_instance_norm_compute,
)


@traceable
def _group_norm_logic(op, attrs, shapes, err):
    shape = _instance_norm_logic(op, attrs, shapes, err)
    channels = shape[attrs.axis % len(shape)]
    _div_dim(op, channels, attrs.num_groups, err, "the number of channels")
    return shape


def _group_norm(attrs, shape, x, gamma, beta):
    if x.size == 0:
        return x.copy()
    axis = attrs.axis % x.ndim
    moved = np.moveaxis(x.astype(_acc_dtype(x.dtype)), axis, 1)
    n, c = moved.shape[:2]
    grouped = moved.reshape((n, attrs.num_groups, c // attrs.num_groups) + moved.shape[2:])
    y = _normalize(grouped, tuple(range(2, grouped.ndim)), attrs.epsilon).reshape(moved.shape)
    y = np.moveaxis(y, 1, axis)
    return _scale_shift(attrs, y, axis, gamma, beta).astype(x.dtype)


def _group_norm_compute(attrs, inputs, out_type):
    """Each sample normalized over groups of channels (and every other dim), then scaled per channel."""
    x, gamma, beta = inputs
    axis = axis_of("nn.group_norm", attrs.axis, x.ndim)
    if axis == 0:
        raise TypeInferenceError("nn.group_norm: the channel axis cannot be the batch axis 0")
    acc = acc_float(x.dtype)
    groups, channels = attrs.num_groups, x.shape[axis]
    per_group = E.floordiv(channels, groups)
    others = [a for a in range(1, x.ndim) if a != axis]
    count = cast(per_group * product(x.shape[a] for a in others), acc)
    requires = [(eq(E.floormod(channels, groups), 0), "nn.group_norm: the number of channels must be divisible by "
                                                      "num_groups")]
    requires += _channel_requires("nn.group_norm", x, axis, (gamma, beta))

    def full(n, g, raxes):
        index = [n] + [None] * (x.ndim - 1)
        index[axis] = g * per_group + raxes[0].var
        for a, r in zip(others, raxes[1:]):
            index[a] = r.var
        return tuple(index)

    def raxes(tag):
        return [reduce_axis(per_group, f"{tag}c")] + [reduce_axis(x.shape[a], f"{tag}{a}") for a in others]

    r1, r2 = raxes("r"), raxes("v")
    kept = (x.shape[0], const(groups))
    total = compute(kept, lambda n, g: te_sum(cast(x[full(n, g, r1)], acc), r1), "gn_sum")
    mean_ = compute(kept, lambda n, g: total[n, g] / count, "gn_mean")

    def squares(n, g):
        d = cast(x[full(n, g, r2)], acc) - mean_[n, g]
        return te_sum(d * d, r2)

    sq = compute(kept, squares, "gn_sq")
    denom = compute(kept, lambda n, g: M.sqrt(sq[n, g] / count + const(attrs.epsilon, acc)), "gn_denom")

    def normalized(*i):
        g = E.floordiv(i[axis], per_group)
        return (cast(x[i], acc) - mean_[i[0], g]) / denom[i[0], g]

    y = compute(x.shape, normalized, "gn_norm")
    out = _scale_shift_te(y, attrs, axis, gamma, beta, x.dtype, "group_norm")
    return [with_requires(out, requires)]


define_shaped(
    "nn.group_norm", 3, _group_norm_logic, _group_norm, OpPattern.OPAQUE,
    attrs=(AttrDef("num_groups", REQUIRED, _positive_int), AttrDef("axis", 1, to_int), _EPSILON, _CENTER, _SCALE),
    check_types=_check_float("nn.group_norm", "gamma", "beta"),
    doc="Normalize each sample over groups of ``num_groups`` channels (and all spatial dims).",
    compute=_group_norm_compute,
)


_BN_NAMES = ("gamma", "beta", "moving_mean", "moving_var")


@traceable
def _batch_norm_shapes(op, attrs, shapes, err):
    axis, data = _channel_vectors(op, shapes[0], shapes[1:], attrs.axis, err, _BN_NAMES)
    return [data, (data[axis],), (data[axis],)]


def _batch_norm_rel(types, attrs, consts=None):
    op = "nn.batch_norm"
    tensors = [expect_tensor(op, t, name) for t, name in zip(types, ("data",) + _BN_NAMES, strict=True)]
    _check_float(op, *_BN_NAMES)(tensors, attrs)
    data, vec, _ = _batch_norm_shapes(op, attrs, [t.shape for t in tensors], TypeInferenceError)
    dtype = tensors[0].dtype
    return TupleType((TensorType(data, dtype), TensorType(vec, dtype), TensorType(vec, dtype)))


def _batch_norm(attrs, x, gamma, beta, mean, var):
    arrays = [np.asarray(a) for a in (x, gamma, beta, mean, var)]
    _batch_norm_shapes("nn.batch_norm", attrs, [a.shape for a in arrays], ShapeError)
    x, gamma, beta, mean, var = arrays
    axis = attrs.axis % x.ndim
    acc = _acc_dtype(x.dtype)
    y = (x.astype(acc) - _along(mean.astype(acc), axis, x.ndim)) / np.sqrt(_along(var.astype(acc), axis, x.ndim)
                                                                           + attrs.epsilon)
    y = _scale_shift(attrs, y, axis, gamma, beta).astype(x.dtype)
    return y, mean.copy(), var.copy()


def _batch_norm_compute(attrs, inputs, out_type):
    x, gamma, beta, mean_, var_ = inputs
    axis = axis_of("nn.batch_norm", attrs.axis, x.ndim)
    acc = acc_float(x.dtype)
    requires = _channel_requires("nn.batch_norm", x, axis, (gamma, beta, mean_, var_))

    def f(*i):
        c = i[axis]
        v = (cast(x[i], acc) - cast(mean_[c], acc)) / M.sqrt(cast(var_[c], acc) + const(attrs.epsilon, acc))
        if attrs.scale:
            v = v * cast(gamma[c], acc)
        if attrs.center:
            v = v + cast(beta[c], acc)
        return cast(v, x.dtype)

    out = compute(x.shape, f, "batch_norm", requires)
    mean_copy = compute(mean_.shape, lambda c: mean_[c], "batch_norm_mean")
    var_copy = compute(var_.shape, lambda c: var_[c], "batch_norm_var")
    return [out, mean_copy, var_copy]


define(
    "nn.batch_norm", 5, _batch_norm_rel, _batch_norm, OpPattern.OPAQUE,
    attrs=(AttrDef("axis", 1, to_int), _EPSILON, _CENTER, _SCALE),
    shape_logic=_batch_norm_shapes,
    doc="Inference batch norm: (x - moving_mean) / sqrt(moving_var + epsilon) * gamma + beta along ``axis``; "
        "returns (out, moving_mean, moving_var) like Relay.",
    compute=_batch_norm_compute,
)


# ---------------------------------------------------------------------------------------------------
# windows: shared by convolution and pooling


def _window_out(op, dim, kernel, pad_total, stride, dilation, ceil_mode, err, what):
    """The number of window positions along one spatial dim (Relay's formula, with ceil_mode)."""
    if isinstance(dim, (int, Sym)) and isinstance(kernel, (int, Sym)):  # known or traced dims
        extent = dilation * (kernel - 1) + 1
        room = dim + pad_total - extent
        require(room >= 0, f"{op}: the {what} window ({extent} with dilation) is larger than the padded input "
                           f"({dim} + {pad_total} padding)", err)
        return (room + (stride - 1 if ceil_mode else 0)) // stride + 1
    if kernel == 1 and pad_total == 0 and stride == 1:
        return dim
    return Any()


def _windows(x: np.ndarray, kernel, strides, dilation, out_hw) -> np.ndarray:
    """A read-only view (..., OH, OW, KH, KW) of the windows over the last two axes of ``x``."""
    sh, sw = x.strides[-2:]
    return np.lib.stride_tricks.as_strided(
        x, shape=x.shape[:-2] + tuple(out_hw) + tuple(kernel),
        strides=x.strides[:-2] + (sh * strides[0], sw * strides[1], sh * dilation[0], sw * dilation[1]),
        writeable=False,
    )


def _conv2d_nchw(x, w, strides, padding, dilation, groups, out_dtype) -> np.ndarray:
    """Grouped 2-D convolution, NCHW data and OIHW weight, as im2col + one batched matmul."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    pt, pl, pb, pr = padding
    oh = (h + pt + pb - dilation[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + pl + pr - dilation[1] * (kw - 1) - 1) // strides[1] + 1
    acc = np.dtype(out_dtype)
    xp = np.pad(x.astype(acc, copy=False), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    cols = _windows(xp, (kh, kw), strides, dilation, (oh, ow))  # (N, C, OH, OW, KH, KW)
    cols = cols.reshape(n, groups, cg, oh, ow, kh, kw).transpose(1, 0, 3, 4, 2, 5, 6)
    cols = cols.reshape(groups, n * oh * ow, cg * kh * kw)
    weights = w.astype(acc, copy=False).reshape(groups, o // groups, cg * kh * kw).transpose(0, 2, 1)
    out = np.matmul(cols, weights)  # (G, N*OH*OW, O/G)
    return out.reshape(groups, n, oh, ow, o // groups).transpose(1, 0, 4, 2, 3).reshape(n, o, oh, ow)


_CONV_ATTRS = (
    AttrDef("strides", (1, 1), int_pair(1)),
    AttrDef("padding", (0, 0, 0, 0), padding4, "(top, left, bottom, right); 1 or 2 values are expanded"),
    AttrDef("dilation", (1, 1), int_pair(1)),
    AttrDef("groups", 1, _positive_int),
    AttrDef("channels", None, _positive_int),
    AttrDef("kernel_size", None, int_pair(1)),
)


def _conv_common(op, attrs, shapes, err, kernel_canonical):
    data, weight = shapes
    _expect_rank(op, data, 4, "data", err)
    _expect_rank(op, weight, 4, "weight", err)
    n, c, h, w = _to_canonical(data, attrs.data_layout, "NCHW")
    kernel = dict(zip(kernel_canonical, _to_canonical(weight, attrs.kernel_layout, kernel_canonical), strict=True))
    kh, kw = kernel["H"], kernel["W"]
    if attrs.kernel_size is not None:
        kh = unify_dim(op, kh, attrs.kernel_size[0], "kernel_size[0] and the weight's height", err)
        kw = unify_dim(op, kw, attrs.kernel_size[1], "kernel_size[1] and the weight's width", err)
    return n, c, h, w, kernel["O"], kernel["I"], kh, kw


@traceable
def _conv2d_logic(op, attrs, shapes, err):
    n, c, h, w, o, i, kh, kw = _conv_common(op, attrs, shapes, err, "OIHW")
    g = attrs.groups
    unify_dim(op, c, mul_dims(i, g), f"the data's channels and weight in-channels x groups ({g})", err)
    if attrs.channels is not None:
        o = unify_dim(op, o, attrs.channels, "the channels attribute and the weight's out-channels", err)
    _div_dim(op, o, g, err, "the number of output channels")
    pt, pl, pb, pr = attrs.padding
    oh = _window_out(op, h, kh, pt + pb, attrs.strides[0], attrs.dilation[0], False, err, "kernel height")
    ow = _window_out(op, w, kw, pl + pr, attrs.strides[1], attrs.dilation[1], False, err, "kernel width")
    return _from_canonical((n, o, oh, ow), "NCHW", attrs.out_layout or attrs.data_layout)


def _conv2d_kernel(attrs, shape, x, w):
    x = _array_to_canonical(x, attrs.data_layout, "NCHW")
    w = _array_to_canonical(w, attrs.kernel_layout, "OIHW")
    out = _conv2d_nchw(x, w, attrs.strides, attrs.padding, attrs.dilation, attrs.groups,
                       attrs.out_dtype or x.dtype.name)
    return _array_from_canonical(out, "NCHW", attrs.out_layout or attrs.data_layout)


def _window_extent(dim, kernel: int, pad_total: int, stride: int, dilation: int, ceil_mode: bool):
    extent = dilation * (kernel - 1) + 1
    room = dim + pad_total - extent
    return E.floordiv(room + (stride - 1 if ceil_mode else 0), stride) + 1, room


def _padded(x: Tensor, layout: str, top: int, left: int, bottom, right, name: str, fill=0):
    """``x`` with ``fill`` around H and W (a compute of its own, so the code generator can materialize it
    instead of testing the border inside a convolution's or pool's innermost loop); ``bottom`` and
    ``right`` may be te expressions (a ceil-mode pool's room)."""
    if all(isinstance(p, int) and p == 0 or E.is_const(p, 0) for p in (top, left, bottom, right)):
        return x
    h_axis, w_axis = layout.index("H"), layout.index("W")
    height, width = x.shape[h_axis], x.shape[w_axis]
    shape = tuple(d + (top + bottom if a == h_axis else left + right if a == w_axis else 0)
                  for a, d in enumerate(x.shape))

    def f(*i):
        y, z = i[h_axis] - top, i[w_axis] - left
        index = tuple(y if a == h_axis else z if a == w_axis else j for a, j in enumerate(i))
        return select(E.all_of(y >= 0, y < height, z >= 0, z < width), x[index], const(fill, x.dtype))

    return compute(shape, f, name)


def _conv2d_compute(attrs, inputs, out_type):
    x, w = inputs
    dtype = output_dtype(out_type)
    xd, _ = layout_reader(x, attrs.data_layout, "NCHW")
    wd, w_read = layout_reader(w, attrs.kernel_layout, "OIHW")
    g = attrs.groups
    pt, pl, pb, pr = attrs.padding
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    oh, room_h = _window_extent(xd["H"], static_dim(wd["H"], "kernel height"), pt + pb, sh, dh, False)
    ow, room_w = _window_extent(xd["W"], static_dim(wd["W"], "kernel width"), pl + pr, sw, dw, False)
    requires = require_equal("nn.conv2d", xd["C"], wd["I"] * g, "the data's channels and weight in-channels x groups")
    requires += [(room_h >= 0, "nn.conv2d: the kernel is taller than the padded input"),
                 (room_w >= 0, "nn.conv2d: the kernel is wider than the padded input")]
    _, x_read = layout_reader(_padded(x, attrs.data_layout, pt, pl, pb, pr, "conv2d_pad"), attrs.data_layout,
                               "NCHW")
    out_per_group = E.floordiv(wd["O"], g)
    ci = reduce_axis(wd["I"], "ci")
    kh = reduce_axis(wd["H"], "kh")
    kw = reduce_axis(wd["W"], "kw")

    def f(N, C, H, W):
        channel = E.floordiv(C, out_per_group) * wd["I"] + ci.var if g > 1 else ci.var
        value = cast(x_read(N=N, C=channel, H=H * sh + kh.var * dh, W=W * sw + kw.var * dw), dtype)
        return te_sum(value * cast(w_read(O=C, I=ci.var, H=kh.var, W=kw.var), dtype), [ci, kh, kw])

    out_layout = attrs.out_layout or attrs.data_layout
    shape = {"N": xd["N"], "C": wd["O"], "H": oh, "W": ow}
    return [layout_compute(shape, out_layout, f, "conv2d", requires)]


def _conv2d_strategy(attrs, inputs, out_type):
    """C library calls for NCHW/OIHW convolutions (when BLAS is called from C): without groups the vector
    direct kernel or im2col + product, depthwise ones (groups = channels = out channels, static) the vector
    depthwise kernel (``Conv2dCall``). Other grouped convolutions stay generated code."""
    from ..codegen import blas
    from ..codegen.strategy import GEMM_SUFFIX, Conv2dCall, Implementation, gemm_min_work, index_expr

    x, w = inputs
    dtypes = {x.dtype, w.dtype, out_type.dtype}
    n, c, h, width = x.shape
    depthwise = attrs.groups > 1 and isinstance(c, Const) and c.value == attrs.groups \
        and isinstance(w.shape[0], Const) and w.shape[0].value == attrs.groups and out_type.dtype == "float32"
    if blas.mode() != "c" or len(dtypes) != 1 or not dtypes <= set(GEMM_SUFFIX) or (attrs.groups != 1 and not depthwise) \
            or attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW" or (attrs.out_layout or "NCHW") != "NCHW" \
            or not isinstance(w.shape[2], Const) or not isinstance(w.shape[3], Const):
        return []
    kh, kw = w.shape[2].value, w.shape[3].value
    pt, pl, pb, pr = (int(p) for p in attrs.padding)
    (sh, sw), (dh, dw) = (tuple(int(v) for v in attrs.strides), tuple(int(v) for v in attrs.dilation))
    oh = E.floordiv(h + (pt + pb - dh * (kh - 1) - 1), sh) + 1
    ow = E.floordiv(width + (pl + pr - dw * (kw - 1) - 1), sw) + 1
    call = Conv2dCall(tuple(index_expr(d) for d in (n, c, h, width, w.shape[0], oh, ow)),
                      (kh, kw), (sh, sw), (dh, dw), (pt, pl), (pt, pl, pb, pr),
                      c.value if isinstance(c, Const) else None, depthwise)
    work = product([n, w.shape[0], oh, ow, 1 if depthwise else c]) * (kh * kw)
    # The generated kernel's vectors run along an output row: a row narrower than a vector fills only ow of
    # its lanes (a 1 x 1 image: one scalar chain of FMAs per output; MobileNetV3's 240 -> 64
    # squeeze-excitation product took 10 us so, 1.4 us through the library), so its work counts
    # ceil(lanes / ow) times against the library call's threshold.
    if isinstance(ow, Const):  # (a static width: ow folds to its value)
        from ..codegen.strategy import rules

        lanes = rules().vector_width
        if 0 < ow.value < lanes:
            work = work * -(-lanes // ow.value)
    # named after the C kernel that runs (exe.stats()' "product_kernels" gives its tile for this host)
    suffix = GEMM_SUFFIX[out_type.dtype]
    name = "depthwise" if depthwise else "pointwise" if call.pointwise(suffix) else "direct" if call.direct(suffix) \
        else "blas"
    return [Implementation(name, work >= gemm_min_work(), plevel=20, call=call)]


define_shaped(
    "nn.conv2d", 2, _conv2d_logic, _conv2d_kernel, OpPattern.OUT_ELEMWISE_FUSABLE,
    attrs=_CONV_ATTRS + (
        AttrDef("data_layout", "NCHW", layout_of("NCHW")), AttrDef("kernel_layout", "OIHW", layout_of("OIHW")),
        AttrDef("out_layout", "", optional_layout("NCHW")), _OUT_DTYPE,
    ),
    dtype_rule=_out_dtype, check_types=_check_same_dtype("nn.conv2d", "weight"),
    doc="2-D convolution (grouped/depthwise with ``groups``); weight (O, I/groups, KH, KW) in OIHW.",
    compute=_conv2d_compute, strategy=_conv2d_strategy,
)


# nn.conv2d_packed: an NCHW convolution (no groups) whose constant OIHW weight is stored as the panels of the
# packed product over a reduction ordered (channel block, ky, kx, channel in block): W (O, C, KH, KW), its
# channels zero padded to a multiple of CONV_BLOCK, becomes (O, C/B, B, KH, KW) -> (O, C/B, KH, KW, B) ->
# (O, K) -> pack_panels, shape (ceil(O / L), K, L) for the panel width L (``packed_lanes()``). The C kernel
# (tv_conv2d_packed_f32, tv_vconv.h) reads the image in the same channel blocks, so that a tile's reduction
# walks memory in order (tensorvm/transform/pack_weights.py makes it from constants).
CONV_BLOCK = 8  # channels per block: a pixel's 8 floats are 32 bytes, 8 reduction steps unrolled per tap


def pack_conv_weight(weight: np.ndarray, lanes: int | None = None) -> np.ndarray:
    """The (O, C, KH, KW) weight of ``nn.conv2d`` as ``nn.conv2d_packed``'s panels (read-only, 64-byte aligned)."""
    from ..codegen.host import aligned_zeros

    weight = np.asarray(weight)
    if weight.ndim != 4:
        raise ShapeError(f"pack_conv_weight: expected a 4-D (O, C, KH, KW) weight, got shape {weight.shape}")
    o, c, kh, kw = weight.shape
    lanes = lanes or packed_lanes()
    blocks, panels = -(-c // CONV_BLOCK), -(-o // lanes)
    # one strided copy into the panels (the weights of a model are packed on every compile)
    packed = aligned_zeros((panels, blocks * CONV_BLOCK * kh * kw, lanes), weight.dtype)
    view = packed.reshape(panels, blocks, kh, kw, CONV_BLOCK, lanes)
    whole = o // lanes
    for first, last in ((0, whole), (whole, panels)):  # whole panels, then the last one (partial) alone
        if first == last:
            continue
        rows = weight[first * lanes:min(o, last * lanes)]
        if rows.shape[0] != (last - first) * lanes or c != blocks * CONV_BLOCK:
            full = np.zeros(((last - first) * lanes, blocks * CONV_BLOCK, kh, kw), weight.dtype)
            full[:rows.shape[0], :c] = rows
            rows = full
        view[first:last] = rows.reshape(last - first, lanes, blocks, CONV_BLOCK, kh, kw).transpose(0, 2, 4, 5, 3, 1)
    packed.setflags(write=False)
    return packed


def unpack_conv_weight(packed: np.ndarray, channels: int, in_channels: int, kernel: tuple) -> np.ndarray:
    """The inverse of ``pack_conv_weight``: the (O, C, KH, KW) weight."""
    kh, kw = kernel
    blocks = -(-in_channels // CONV_BLOCK)
    ordered = unpack_dense_weight(packed, channels).reshape(channels, blocks, kh, kw, CONV_BLOCK)
    return ordered.transpose(0, 1, 4, 2, 3).reshape(channels, blocks * CONV_BLOCK, kh, kw)[:, :in_channels]


def _conv_packed_reduction(attrs) -> int:
    return -(-attrs.in_channels // CONV_BLOCK) * CONV_BLOCK * attrs.kernel_size[0] * attrs.kernel_size[1]


@traceable
def _conv2d_packed_logic(op, attrs, shapes, err):
    data, packed = shapes
    _expect_rank(op, data, 4, "data", err)
    _expect_rank(op, packed, 3, "packed_weight (panels, reduction, lanes)", err)
    n, c, h, w = data
    unify_dim(op, c, attrs.in_channels, "the data's channels and in_channels", err)
    lanes = packed[2] if isinstance(packed[2], int) else packed_lanes()
    lanes = unify_dim(op, packed[2], lanes, "the packed weight's dim 2 and its panel width", err)
    if not isinstance(lanes, int) or lanes < 1:
        raise err(f"{op}: the packed weight's panel width (dim 2) must be positive, got {lanes}")
    unify_dim(op, packed[0], -(-attrs.channels // lanes), f"the packed weight's dim 0 and ceil(channels / {lanes})",
              err)
    unify_dim(op, packed[1], _conv_packed_reduction(attrs), "the packed weight's dim 1 and the padded reduction", err)
    (kh, kw), (pt, pl, pb, pr) = attrs.kernel_size, attrs.padding
    oh = _window_out(op, h, kh, pt + pb, attrs.strides[0], attrs.dilation[0], False, err, "kernel height")
    ow = _window_out(op, w, kw, pl + pr, attrs.strides[1], attrs.dilation[1], False, err, "kernel width")
    return (n, attrs.channels, oh, ow)


def _conv2d_packed_kernel(attrs, shape, x, packed):
    weight = unpack_conv_weight(packed, attrs.channels, attrs.in_channels, attrs.kernel_size)
    return _conv2d_nchw(x, weight, attrs.strides, attrs.padding, attrs.dilation, 1, attrs.out_dtype or x.dtype.name)


def _conv2d_packed_compute(attrs, inputs, out_type):
    x, w = inputs
    dtype = output_dtype(out_type)
    lanes = w.shape[2].value if isinstance(w.shape[2], Const) else packed_lanes()
    (kh_, kw_), (pt, pl, pb, pr) = attrs.kernel_size, attrs.padding
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    oh, room_h = _window_extent(x.shape[2], kh_, pt + pb, sh, dh, False)
    ow, room_w = _window_extent(x.shape[3], kw_, pl + pr, sw, dw, False)
    requires = require_equal("nn.conv2d_packed", x.shape[1], const(attrs.in_channels), "the data's channels and "
                             "in_channels")
    requires += require_equal("nn.conv2d_packed", w.shape[2], const(lanes), f"the packed weight's dim 2 and {lanes}")
    requires += [(room_h >= 0, "nn.conv2d_packed: the kernel is taller than the padded input"),
                 (room_w >= 0, "nn.conv2d_packed: the kernel is wider than the padded input")]
    _, x_read = layout_reader(_padded(x, "NCHW", pt, pl, pb, pr, "conv2d_pad"), "NCHW", "NCHW")
    ci, kh, kw = reduce_axis(attrs.in_channels, "ci"), reduce_axis(kh_, "kh"), reduce_axis(kw_, "kw")

    def f(N, C, H, W):
        step = ((E.floordiv(ci.var, CONV_BLOCK) * kh_ + kh.var) * kw_ + kw.var) * CONV_BLOCK + E.floormod(ci.var,
                                                                                                        CONV_BLOCK)
        value = cast(x_read(N=N, C=ci.var, H=H * sh + kh.var * dh, W=W * sw + kw.var * dw), dtype)
        return te_sum(value * cast(w[E.floordiv(C, lanes), step, E.floormod(C, lanes)], dtype), [ci, kh, kw])

    return [compute((x.shape[0], const(attrs.channels), oh, ow), f, "conv2d_packed", requires)]


def _conv2d_packed_strategy(attrs, inputs, out_type):
    """float32 with this host's panel width: the packed convolution kernel (``Conv2dCall`` with ``packed``);
    otherwise the generated kernel over the packed layout."""
    from ..codegen.strategy import Conv2dCall, Implementation, index_expr

    x, w = inputs
    lanes = w.shape[2].value if isinstance(w.shape[2], Const) else packed_lanes()
    if {x.dtype, w.dtype, out_type.dtype} != {"float32"} or lanes != packed_lanes():
        return []
    n, c, h, width = x.shape
    (kh, kw), (pt, pl, pb, pr) = attrs.kernel_size, attrs.padding
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    oh = E.floordiv(h + (pt + pb - dh * (kh - 1) - 1), sh) + 1
    ow = E.floordiv(width + (pl + pr - dw * (kw - 1) - 1), sw) + 1
    call = Conv2dCall(tuple(index_expr(d) for d in (n, const(attrs.in_channels), h, width, const(attrs.channels), oh,
                                                     ow)),
                      (kh, kw), (sh, sw), (dh, dw), (pt, pl), (pt, pl, pb, pr), attrs.in_channels, packed=True)
    return [Implementation("packed", True, plevel=20, call=call)]


define_shaped(
    "nn.conv2d_packed", 2, _conv2d_packed_logic, _conv2d_packed_kernel, OpPattern.OUT_ELEMWISE_FUSABLE,
    attrs=(AttrDef("channels", REQUIRED, _positive_int, "output channels"),
           AttrDef("in_channels", REQUIRED, _positive_int, "input channels"),
           AttrDef("kernel_size", REQUIRED, int_pair(1)),
           AttrDef("strides", (1, 1), int_pair(1)),
           AttrDef("padding", (0, 0, 0, 0), padding4, "(top, left, bottom, right); 1 or 2 values are expanded"),
           AttrDef("dilation", (1, 1), int_pair(1)),
           _OUT_DTYPE),
    dtype_rule=_out_dtype, check_types=_check_same_dtype("nn.conv2d_packed", "packed_weight"),
    doc="nn.conv2d (NCHW, no groups) with a pre-packed weight: ``pack_conv_weight`` of the (O, C, KH, KW) weight, "
        "panels of L output channels over the reduction (channel block of 8, ky, kx, channel in block).",
    compute=_conv2d_packed_compute, strategy=_conv2d_packed_strategy,
)


@traceable
def _conv2d_transpose_logic(op, attrs, shapes, err):
    n, c, h, w, og, i, kh, kw = _conv_common(op, attrs, shapes, err, "IOHW")
    g = attrs.groups
    unify_dim(op, c, i, "the data's channels and the weight's in-channels", err)
    _div_dim(op, c, g, err, "the number of input channels")
    o = mul_dims(og, g)
    if attrs.channels is not None:
        o = unify_dim(op, o, attrs.channels, "the channels attribute and weight out-channels x groups", err)
    out_hw = []
    for axis, (dim, k) in enumerate(((h, kh), (w, kw))):
        stride, dil, extra = attrs.strides[axis], attrs.dilation[axis], attrs.output_padding[axis]
        pad = attrs.padding[axis] + attrs.padding[axis + 2]
        if extra >= max(stride, dil):
            raise AttrError(f"{op}: output_padding {attrs.output_padding} must be smaller than the stride "
                            f"or the dilation")
        if isinstance(dim, (int, Sym)) and isinstance(k, (int, Sym)):  # (known or traced dims)
            require(dim >= 1, f"{op}: spatial dims must be positive, got {dim}", err)
            size = (dim - 1) * stride - pad + dil * (k - 1) + extra + 1
            require(size >= 0, f"{op}: padding {attrs.padding} leaves a negative output size", err)
            out_hw.append(size)
        else:
            out_hw.append(dim if (stride, k, pad, extra) == (1, 1, 0, 0) else Any())
    return _from_canonical((n, o) + tuple(out_hw), "NCHW", attrs.out_layout or attrs.data_layout)


def _conv2d_transpose_kernel(attrs, shape, x, w):
    """The definition, vectorized: one batched matmul gives every input pixel's kernel-weighted
    contribution, then one strided add per kernel tap scatters them; the padding is cropped off."""
    x = _array_to_canonical(x, attrs.data_layout, "NCHW")
    w = _array_to_canonical(w, attrs.kernel_layout, "IOHW")
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    g = attrs.groups
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    pt, pl = attrs.padding[:2]  # the bottom/right padding is implied by the output size
    acc = np.dtype(attrs.out_dtype or x.dtype.name)
    xg = x.astype(acc, copy=False).reshape(n, g, c // g, h * wd).transpose(1, 0, 3, 2).reshape(g, n * h * wd, c // g)
    wg = w.astype(acc, copy=False).reshape(g, c // g, og * kh * kw)
    taps = np.matmul(xg, wg).reshape(g, n, h, wd, og, kh, kw).transpose(1, 0, 4, 5, 6, 2, 3)
    taps = taps.reshape(n, g * og, kh, kw, h, wd)
    out_h, out_w = _to_canonical(shape, attrs.out_layout or attrs.data_layout, "NCHW")[2:]
    full = np.zeros((n, g * og, max((h - 1) * sh + dh * (kh - 1) + 1, pt + out_h),
                     max((wd - 1) * sw + dw * (kw - 1) + 1, pl + out_w)), dtype=acc)
    for a in range(kh):
        for e in range(kw):
            full[:, :, a * dh:a * dh + (h - 1) * sh + 1:sh, e * dw:e * dw + (wd - 1) * sw + 1:sw] += taps[:, :, a, e]
    out = full[:, :, pt:pt + out_h, pl:pl + out_w]
    return _array_from_canonical(out, "NCHW", attrs.out_layout or attrs.data_layout)


def _conv2d_transpose_compute(attrs, inputs, out_type):
    x, w = inputs
    dtype = output_dtype(out_type)
    xd, x_read = layout_reader(x, attrs.data_layout, "NCHW")
    wd, w_read = layout_reader(w, attrs.kernel_layout, "IOHW")
    g = attrs.groups
    pt, pl, pb, pr = attrs.padding
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    khs, kws = static_dim(wd["H"], "kernel height"), static_dim(wd["W"], "kernel width")
    oh = (xd["H"] - 1) * sh - (pt + pb) + dh * (khs - 1) + attrs.output_padding[0] + 1
    ow = (xd["W"] - 1) * sw - (pl + pr) + dw * (kws - 1) + attrs.output_padding[1] + 1
    in_per_group = E.floordiv(xd["C"], g)
    requires = require_equal("nn.conv2d_transpose", xd["C"], wd["I"], "the data's and the weight's in-channels")
    ci = reduce_axis(in_per_group, "ci")
    kh, kw = reduce_axis(khs, "kh"), reduce_axis(kws, "kw")
    height, width = xd["H"], xd["W"]

    def f(N, C, H, W):
        group = E.floordiv(C, wd["O"]) if g > 1 else const(0)
        channel = group * in_per_group + ci.var
        ty = H + pt - kh.var * dh
        tz = W + pl - kw.var * dw
        y, z = E.floordiv(ty, sh), E.floordiv(tz, sw)
        hit = E.all_of(ty >= 0, tz >= 0, eq(E.floormod(ty, sh), 0), eq(E.floormod(tz, sw), 0), y < height, z < width)
        value = cast(x_read(N=N, C=channel, H=y, W=z), dtype) * cast(
            w_read(I=channel, O=E.floormod(C, wd["O"]) if g > 1 else C, H=kh.var, W=kw.var), dtype)
        return te_sum(value, [ci, kh, kw], where=hit)

    out_layout = attrs.out_layout or attrs.data_layout
    shape = {"N": xd["N"], "C": wd["O"] * g, "H": oh, "W": ow}
    return [layout_compute(shape, out_layout, f, "conv2d_transpose", requires)]


define_shaped(
    "nn.conv2d_transpose", 2, _conv2d_transpose_logic, _conv2d_transpose_kernel, OpPattern.OUT_ELEMWISE_FUSABLE,
    attrs=_CONV_ATTRS + (
        AttrDef("output_padding", (0, 0), int_pair(0)),
        AttrDef("data_layout", "NCHW", layout_of("NCHW")), AttrDef("kernel_layout", "IOHW", layout_of("IOHW")),
        AttrDef("out_layout", "", optional_layout("NCHW")), _OUT_DTYPE,
    ),
    dtype_rule=_out_dtype, check_types=_check_same_dtype("nn.conv2d_transpose", "weight"),
    doc="2-D transposed convolution; weight (I, O/groups, KH, KW) in IOHW (Relay's default).",
    compute=_conv2d_transpose_compute,
)


# ---------------------------------------------------------------------------------------------------
# pooling

_LAYOUT = AttrDef("layout", "NCHW", layout_of("NCHW"))
_OUT_LAYOUT = AttrDef("out_layout", "", optional_layout("NCHW"))
_POOL_ATTRS = (
    AttrDef("pool_size", (1, 1), int_pair(1)),
    AttrDef("strides", (1, 1), int_pair(1)),
    AttrDef("dilation", (1, 1), int_pair(1)),
    AttrDef("padding", (0, 0, 0, 0), padding4, "(top, left, bottom, right); 1 or 2 values are expanded"),
    _LAYOUT, _OUT_LAYOUT,
    AttrDef("ceil_mode", False, to_bool),
)


@traceable
def _pool_logic(op, attrs, shapes, err):
    (shape,) = shapes
    _expect_rank(op, shape, 4, "data", err)
    n, c, h, w = _to_canonical(shape, attrs.layout, "NCHW")
    pt, pl, pb, pr = attrs.padding
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    oh = _window_out(op, h, kh, pt + pb, sh, dh, attrs.ceil_mode, err, "pool height")
    ow = _window_out(op, w, kw, pl + pr, sw, dw, attrs.ceil_mode, err, "pool width")
    return _from_canonical((n, c, oh, ow), "NCHW", attrs.out_layout or attrs.layout)


def _min_value(dtype: np.dtype):
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def _tap_slices(padded: np.ndarray, kernel, strides, dilation, out_hw):
    """For each window tap, the strided view of ``padded`` (over its last two axes) it reads."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = kernel, strides, dilation, out_hw
    for a in range(kh):
        for e in range(kw):
            yield padded[..., a * dh:a * dh + (oh - 1) * sh + 1:sh, e * dw:e * dw + (ow - 1) * sw + 1:sw]


def _pool2d(attrs, out_shape, x, kind):
    x = _array_to_canonical(x, attrs.layout, "NCHW")
    _, _, oh, ow = _to_canonical(out_shape, attrs.out_layout or attrs.layout, "NCHW")
    h, w = x.shape[2:]
    pt, pl, pb, pr = attrs.padding
    (kh, kw), strides, dilation = attrs.pool_size, attrs.strides, attrs.dilation
    # ceil_mode may need room beyond the explicit padding for the last window
    extra_b = max(0, (oh - 1) * strides[0] + dilation[0] * (kh - 1) + 1 - (h + pt + pb))
    extra_r = max(0, (ow - 1) * strides[1] + dilation[1] * (kw - 1) + 1 - (w + pl + pr))
    widths = ((0, 0), (0, 0), (pt, pb + extra_b), (pl, pr + extra_r))
    window = ((kh, kw), strides, dilation, (oh, ow))
    if kind == "max":
        padded = np.pad(x, widths, constant_values=_min_value(x.dtype))
        out = np.full(x.shape[:2] + (oh, ow), _min_value(x.dtype), dtype=x.dtype)
        for tap in _tap_slices(padded, *window):
            np.maximum(out, tap, out=out)
    else:
        acc = np.float64 if not np.issubdtype(x.dtype, np.floating) else _acc_dtype(x.dtype)
        total = np.zeros(x.shape[:2] + (oh, ow), dtype=acc)
        for tap in _tap_slices(np.pad(x.astype(acc), widths), *window):
            total += tap
        # counted positions: the data, plus the explicit padding when count_include_pad
        if attrs.count_include_pad:
            mask = np.pad(np.ones((h + pt + pb, w + pl + pr)), ((0, extra_b), (0, extra_r)))
        else:
            mask = np.pad(np.ones((h, w)), widths[2:])
        count = sum(_tap_slices(mask, *window))
        out = (total / np.maximum(count, 1)).astype(x.dtype)
    return _array_from_canonical(out, "NCHW", attrs.out_layout or attrs.layout)


def halves_nchw_map(attrs) -> bool:
    """Whether pooling ``attrs`` (normalized) are a 2x2 window with stride 2, no padding or dilation,
    floor mode and NCHW in and out: the pool a direct convolution kernel applies to its output tiles
    (``codegen.strategy.tile_epilogue``; FuseOps puts it in the convolution's group for that)."""
    return (tuple(attrs.pool_size) == (2, 2) and tuple(attrs.strides) == (2, 2) and tuple(attrs.dilation) == (1, 1)
            and not any(attrs.padding) and not attrs.ceil_mode and attrs.layout == "NCHW"
            and (attrs.out_layout or "NCHW") == "NCHW")


def _pool_te(attrs, x: Tensor, kind: str):
    xd, _ = layout_reader(x, attrs.layout, "NCHW")
    pt, pl, pb, pr = attrs.padding
    (kh_, kw_), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    oh, room_h = _window_extent(xd["H"], kh_, pt + pb, sh, dh, attrs.ceil_mode)
    ow, room_w = _window_extent(xd["W"], kw_, pl + pr, sw, dw, attrs.ceil_mode)
    requires = [(room_h >= 0, "pool: the window is taller than the padded input"),
                (room_w >= 0, "pool: the window is wider than the padded input")]
    kh, kw = reduce_axis(kh_, "kh"), reduce_axis(kw_, "kw")
    height, width = xd["H"], xd["W"]
    out_layout = attrs.out_layout or attrs.layout
    shape = {"N": xd["N"], "C": xd["C"], "H": oh, "W": ow}
    # The windows read the data padded with the pool's neutral value, including the room the last
    # ceil-mode window needs past the end padding: no border test in the window loop, which vectorizes.
    bottom, right = pb, pr
    if attrs.ceil_mode:
        bottom = E.maximum((oh - 1) * sh + dh * (kh_ - 1) + 1 - (height + pt), pb)
        right = E.maximum((ow - 1) * sw + dw * (kw_ - 1) + 1 - (width + pl), pr)
    fill = E.min_value(x.dtype) if kind == "max" else 0
    _, x_read = layout_reader(_padded(x, attrs.layout, pt, pl, bottom, right, f"{kind}_pool2d_pad", fill),
                              attrs.layout, "NCHW")

    def window(N, C, H, W):
        return x_read(N=N, C=C, H=H * sh + kh.var * dh, W=W * sw + kw.var * dw)

    if kind == "max":
        return layout_compute(shape, out_layout, lambda N, C, H, W: te_max(window(N, C, H, W), [kh, kw]),
                              "max_pool2d", requires)
    acc = acc_float(x.dtype) if dtype_kind(x.dtype) == "f" else "float64"
    total = layout_compute(shape, out_layout,
                           lambda N, C, H, W: te_sum(cast(window(N, C, H, W), acc), [kh, kw]),
                           "avg_pool2d_sum", requires)
    kh2, kw2 = reduce_axis(kh_, "ch"), reduce_axis(kw_, "cw")

    def count_fn(N, C, H, W):
        y, z = H * sh + kh2.var * dh - pt, W * sw + kw2.var * dw - pl
        if attrs.count_include_pad:
            counted = E.all_of(y < height + pb, z < width + pr)
        else:
            checks = [y >= 0] if pt else []
            checks += [y < height] if pb or attrs.ceil_mode else []
            checks += [z >= 0] if pl else []
            checks += [z < width] if pr or attrs.ceil_mode else []
            counted = E.all_of(*checks) if checks else None
        if counted is None:
            return te_sum(const(1.0, acc), [kh2, kw2])
        return te_sum(select(counted, const(1.0, acc), const(0.0, acc)), [kh2, kw2])

    count = layout_compute(shape, out_layout, count_fn, "avg_pool2d_count")
    return compute(total.shape, lambda *i: cast(total[i] / E.maximum(count[i], const(1.0, acc)), x.dtype),
                   "avg_pool2d")


def _max_pool2d_compute(attrs, inputs, out_type):
    return [_pool_te(attrs, inputs[0], "max")]


def _max_pool2d_strategy(attrs, inputs, out_type):
    """float32 NCHW in and out, any window: ``tv_max_pool2d_f32`` (``MaxPool2dCall``, ``tv_vpool.h``: the
    vector kernel, no padded copy of the input); otherwise the generated kernel. In a convolution's group
    (the 2x2 pool of its tiles' epilogue) the convolution is the anchor, not the pool."""
    from ..codegen.strategy import Implementation, MaxPool2dCall, index_expr

    (x,) = inputs
    if x.ndim != 4 or {x.dtype, out_type.dtype} != {"float32"} or attrs.layout != "NCHW" \
            or (attrs.out_layout or "NCHW") != "NCHW":
        return []
    n, c, h, w = x.shape
    pt, pl, pb, pr = (int(p) for p in attrs.padding)
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    oh, _ = _window_extent(h, kh, pt + pb, sh, dh, attrs.ceil_mode)
    ow, _ = _window_extent(w, kw, pl + pr, sw, dw, attrs.ceil_mode)
    call = MaxPool2dCall(tuple(index_expr(d) for d in (n, c, h, w, oh, ow)), (int(kh), int(kw)),
                         (int(sh), int(sw)), (int(dh), int(dw)), (pt, pl))
    return [Implementation("vector_pool", True, plevel=20, call=call)]


define_shaped(
    "nn.max_pool2d", 1, _pool_logic, lambda attrs, shape, x: _pool2d(attrs, shape, x, "max"),
    OpPattern.OUT_ELEMWISE_FUSABLE, attrs=_POOL_ATTRS, doc="2-D max pooling.",
    compute=_max_pool2d_compute, strategy=_max_pool2d_strategy,
)


def _avg_pool2d_compute(attrs, inputs, out_type):
    return [_pool_te(attrs, inputs[0], "avg")]


define_shaped(
    "nn.avg_pool2d", 1, _pool_logic, lambda attrs, shape, x: _pool2d(attrs, shape, x, "avg"),
    OpPattern.OUT_ELEMWISE_FUSABLE, attrs=_POOL_ATTRS + (AttrDef("count_include_pad", False, to_bool),),
    doc="2-D average pooling; the divisor counts the explicit padding only with ``count_include_pad``.",
    compute=_avg_pool2d_compute,
)


@traceable
def _global_pool_logic(op, attrs, shapes, err):
    (shape,) = shapes
    _expect_rank(op, shape, 4, "data", err)
    n, c, _, _ = _to_canonical(shape, attrs.layout, "NCHW")
    return _from_canonical((n, c, 1, 1), "NCHW", attrs.out_layout or attrs.layout)


def _global_pool(attrs, x, kind):
    x = _array_to_canonical(x, attrs.layout, "NCHW")
    if kind == "max":
        out = x.max(axis=(2, 3), keepdims=True, initial=_min_value(x.dtype))
    else:
        out = x.astype(np.float64 if not np.issubdtype(x.dtype, np.floating) else _acc_dtype(x.dtype))
        out = out.mean(axis=(2, 3), keepdims=True) if x.shape[2] * x.shape[3] else out.sum((2, 3), keepdims=True)
        out = out.astype(x.dtype)
    return _array_from_canonical(out, "NCHW", attrs.out_layout or attrs.layout)


def _global_pool_te(attrs, x: Tensor, kind: str):
    xd, x_read = layout_reader(x, attrs.layout, "NCHW")
    kh, kw = reduce_axis(xd["H"], "kh"), reduce_axis(xd["W"], "kw")
    out_layout = attrs.out_layout or attrs.layout
    shape = {"N": xd["N"], "C": xd["C"], "H": const(1), "W": const(1)}
    if kind == "max":
        return layout_compute(shape, out_layout, lambda N, C, H, W: te_max(x_read(N=N, C=C, H=kh.var, W=kw.var),
                                                                            [kh, kw]), "global_max_pool2d")
    acc = acc_float(x.dtype) if dtype_kind(x.dtype) == "f" else "float64"
    total = layout_compute(shape, out_layout, lambda N, C, H, W: te_sum(cast(x_read(N=N, C=C, H=kh.var, W=kw.var),
                                                                                acc), [kh, kw]), "global_pool_sum")
    count = E.maximum(cast(xd["H"] * xd["W"], acc), const(1.0, acc))
    return compute(total.shape, lambda *i: cast(total[i] / count, x.dtype), "global_avg_pool2d")


for _kind in ("avg", "max"):
    define_shaped(
        f"nn.global_{_kind}_pool2d", 1, _global_pool_logic,
        (lambda kind: lambda attrs, shape, x: _global_pool(attrs, x, kind))(_kind),
        OpPattern.OUT_ELEMWISE_FUSABLE, attrs=(_LAYOUT, _OUT_LAYOUT),
        compute=(lambda kind: lambda attrs, inputs, out_type: [_global_pool_te(attrs, inputs[0], kind)])(
            _kind),
        doc=f"2-D global {_kind} pooling over the whole height and width.",
    )


@traceable
def _adaptive_pool_logic(op, attrs, shapes, err):
    (shape,) = shapes
    _expect_rank(op, shape, 4, "data", err)
    n, c, h, w = _to_canonical(shape, attrs.layout, "NCHW")
    oh, ow = (h, w) if attrs.output_size is None else attrs.output_size
    for dim, out in ((h, oh), (w, ow)):
        if isinstance(out, int) and out > 0:
            require(dim != 0, f"{op}: cannot pool an empty spatial dim to size {out}", err)
    return _from_canonical((n, c, oh, ow), "NCHW", attrs.out_layout or attrs.layout)


def _adaptive_bounds(size: int, out: int):
    """Window i covers [floor(i * size / out), ceil((i + 1) * size / out))."""
    starts = (np.arange(out) * size) // out
    ends = -((-(np.arange(out) + 1) * size) // out)
    return starts, ends


def _adaptive_matrix(size: int, out: int) -> np.ndarray:
    starts, ends = _adaptive_bounds(size, out)
    positions = np.arange(size)
    inside = (positions >= starts[:, None]) & (positions < ends[:, None])
    return inside / np.maximum(ends - starts, 1)[:, None]


def _adaptive_pool(attrs, out_shape, x, kind):
    x = _array_to_canonical(x, attrs.layout, "NCHW")
    _, _, oh, ow = _to_canonical(out_shape, attrs.out_layout or attrs.layout, "NCHW")
    h, w = x.shape[2:]
    if kind == "avg":
        acc = np.float64 if not np.issubdtype(x.dtype, np.floating) else _acc_dtype(x.dtype)
        out = _adaptive_matrix(h, oh).astype(acc) @ x.astype(acc) @ _adaptive_matrix(w, ow).T.astype(acc)
    else:
        (hs, he), (ws, we) = _adaptive_bounds(h, oh), _adaptive_bounds(w, ow)
        out = np.empty(x.shape[:2] + (oh, ow), dtype=x.dtype)
        for i in range(oh):  # one vectorized max per output position
            for j in range(ow):
                out[:, :, i, j] = x[:, :, hs[i]:he[i], ws[j]:we[j]].max(axis=(2, 3), initial=_min_value(x.dtype))
    return _array_from_canonical(out.astype(x.dtype), "NCHW", attrs.out_layout or attrs.layout)


def _adaptive_window(size, out, i):
    """Window ``i`` of ``out`` over ``size``: [floor(i*size/out), ceil((i+1)*size/out))."""
    start = E.floordiv(i * size, out)
    end = E.floordiv((i + 1) * size + out - 1, out)
    return start, end


def _adaptive_span(size, out) -> PrimExpr:
    """The longest window: exact when both are static, else the whole dim."""
    if isinstance(size, Const) and isinstance(out, Const) and out.value > 0:
        s, o = size.value, out.value
        return const(builtins.max(0, *[-(-(k + 1) * s // o) - (k * s // o) for k in range(o)]) if o else 0)
    return size


def _adaptive_pool_te(attrs, x: Tensor, kind: str):
    xd, x_read = layout_reader(x, attrs.layout, "NCHW")
    if attrs.output_size is None:
        oh, ow = xd["H"], xd["W"]
    else:
        oh, ow = const(attrs.output_size[0]), const(attrs.output_size[1])
    out_layout = attrs.out_layout or attrs.layout
    shape = {"N": xd["N"], "C": xd["C"], "H": oh, "W": ow}
    rh, rw = reduce_axis(_adaptive_span(xd["H"], oh), "rh"), reduce_axis(_adaptive_span(xd["W"], ow), "rw")

    def window(H, W):
        hs, he = _adaptive_window(xd["H"], oh, H)
        ws, we = _adaptive_window(xd["W"], ow, W)
        y, z = hs + rh.var, ws + rw.var
        return y, z, E.all_of(y < he, z < we), (he - hs) * (we - ws)

    if kind == "max":
        def f(N, C, H, W):
            y, z, inside, _ = window(H, W)
            return te_max(x_read(N=N, C=C, H=y, W=z), [rh, rw], where=inside)

        return layout_compute(shape, out_layout, f, "adaptive_max_pool2d")
    acc = acc_float(x.dtype) if dtype_kind(x.dtype) == "f" else "float64"

    def total_fn(N, C, H, W):
        y, z, inside, _ = window(H, W)
        return te_sum(cast(x_read(N=N, C=C, H=y, W=z), acc), [rh, rw], where=inside)

    total = layout_compute(shape, out_layout, total_fn, "adaptive_pool_sum")

    def finish(*i):
        letters = dict(zip(out_layout, i))
        _, _, _, count = window(letters["H"], letters["W"])
        return cast(total[i] / E.maximum(cast(count, acc), const(1.0, acc)), x.dtype)

    return compute(total.shape, finish, "adaptive_avg_pool2d")


for _kind in ("avg", "max"):
    define_shaped(
        f"nn.adaptive_{_kind}_pool2d", 1, _adaptive_pool_logic,
        (lambda kind: lambda attrs, shape, x: _adaptive_pool(attrs, shape, x, kind))(_kind),
        OpPattern.OUT_ELEMWISE_FUSABLE,
        compute=(lambda kind: lambda attrs, inputs, out_type: [_adaptive_pool_te(attrs, inputs[0], kind)])(
            _kind),
        attrs=(AttrDef("output_size", None, int_pair(0)), _LAYOUT, _OUT_LAYOUT),
        doc=f"2-D adaptive {_kind} pooling to ``output_size`` (None: the input's size); window i spans "
            f"[floor(i*H/OH), ceil((i+1)*H/OH)).",
    )


# ---------------------------------------------------------------------------------------------------
# pad, batch_flatten, dropout, lrn, depth_to_space, space_to_depth


def _pad_width(value):
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"expected ((before, after), ...) per dim, got {value!r}")
    pairs = []
    for item in value:
        pair = int_tuple(0)(item)
        if len(pair) != 2:
            raise ValueError(f"expected a (before, after) pair per dim, got {item!r}")
        pairs.append(pair)
    return tuple(pairs)


@traceable
def _pad_logic(op, attrs, shapes, err):
    if len(shapes) not in (1, 2):
        raise err(f"{op}: expected data and an optional scalar pad_value, got {len(shapes)} arguments")
    data = shapes[0]
    if len(shapes) == 2 and len(shapes[1]) != 0:
        raise err(f"{op}: pad_value must be a scalar, got shape {fmt_shape(shapes[1])}")
    if len(attrs.pad_width) != len(data):
        raise err(f"{op}: pad_width has {len(attrs.pad_width)} pairs for data of rank {len(data)}")
    out = []
    for axis, (dim, (before, after)) in enumerate(zip(data, attrs.pad_width, strict=True)):
        if isinstance(dim, (int, Sym)) and (before or after):  # (a known or traced dim)
            if attrs.pad_mode == "reflect":
                require(max(before, after) < dim, f"{op}: reflect padding ({before}, {after}) must be smaller than "
                                                  f"dim {axis} ({dim})", err)
            if attrs.pad_mode == "edge":
                require(dim != 0, f"{op}: edge padding of the empty dim {axis}", err)
        out.append(add_dims(dim, before + after))
    return tuple(out)


def _pad_rel(types, attrs, consts=None):
    tensors = [expect_tensor("nn.pad", t, "argument") for t in types]
    return TensorType(_pad_logic("nn.pad", attrs, [t.shape for t in tensors], TypeInferenceError),
                      tensors[0].dtype)


def _pad_kernel(attrs, data, pad_value=None):
    data = np.asarray(data)
    shapes = [data.shape] + ([np.shape(pad_value)] if pad_value is not None else [])
    _pad_logic("nn.pad", attrs, shapes, ShapeError)
    if data.ndim == 0:  # nothing to pad (np.pad rejects an empty pad_width)
        return data.copy()
    if attrs.pad_mode != "constant":
        return np.pad(data, attrs.pad_width, mode=attrs.pad_mode)
    value = np.asarray(0 if pad_value is None else pad_value).astype(data.dtype)
    return np.pad(data, attrs.pad_width, constant_values=value)


def _pad_compute(attrs, inputs, out_type):
    x = inputs[0]
    fill = cast(inputs[1][()], x.dtype) if len(inputs) > 1 else const(0, x.dtype)
    widths = attrs.pad_width
    if len(widths) != x.ndim:
        raise TypeInferenceError(f"nn.pad: pad_width has {len(widths)} pairs for rank {x.ndim}")
    shape = tuple(d + before + after for d, (before, after) in zip(x.shape, widths))
    requires = []
    mode = attrs.pad_mode
    for axis, (d, (before, after)) in enumerate(zip(x.shape, widths)):
        if mode == "reflect" and (before or after):
            requires.append((d > builtins.max(before, after), f"nn.pad: reflect padding of dim {axis} must be "
                                                              f"smaller than the dim"))
        if mode == "edge" and (before or after):
            requires.append((d > 0, f"nn.pad: edge padding of the empty dim {axis}"))

    def f(*i):
        index, inside = [], []
        for j, d, (before, _) in zip(i, x.shape, widths):
            k = j - before
            if mode == "constant":
                inside += [k >= 0, k < d] if before or _ else []
                index.append(k)
            elif mode == "edge":
                index.append(E.minimum(E.maximum(k, 0), d - 1))
            else:  # reflect without repeating the edge
                k = select(k < 0, -k, k)
                index.append(select(k >= d, 2 * (d - 1) - k, k))
        value = x[tuple(index)]
        return select(E.all_of(*inside), value, fill) if inside else value

    return [compute(shape, f, "pad", requires)]


define(
    "nn.pad", -1, _pad_rel, _pad_kernel, OpPattern.INJECTIVE,
    attrs=(AttrDef("pad_width", REQUIRED, _pad_width), AttrDef("pad_mode", "constant",
                                                                one_of("constant", "edge", "reflect"))),
    shape_logic=_pad_logic,
    doc="Pad by pad_width ((before, after) per dim) with the scalar pad_value (2nd argument, default 0), "
        "or by repeating the edge or reflecting.",
    compute=_pad_compute,
)


@traceable
def _batch_flatten_logic(op, attrs, shapes, err):
    (shape,) = shapes
    if len(shape) < 1:
        raise err(f"{op}: data must have rank >= 1, got a scalar")
    return (shape[0], prod_dims(shape[1:]))


def _batch_flatten_compute(attrs, inputs, out_type):
    x = inputs[0]
    return [reshape_to("nn.batch_flatten", x, (x.shape[0], product(x.shape[1:])))]


define_shaped(
    "nn.batch_flatten", 1, _batch_flatten_logic, lambda attrs, shape, x: x.reshape(shape), OpPattern.INJECTIVE,
    doc="Flatten all dims but the first.",
    compute=_batch_flatten_compute,
)


def _dropout_rel(types, attrs, consts=None):
    data = expect_tensor("nn.dropout", types[0], "data")
    return TupleType((data, data))


def _dropout_compute(attrs, inputs, out_type):
    x = inputs[0]
    return [te.compute(x.shape, lambda *i: x[i], "dropout"),
            te.compute(x.shape, lambda *i: te.const(1, x.dtype), "dropout_mask")]


define(
    "nn.dropout", 1, _dropout_rel, lambda attrs, x: (np.array(x, copy=True), np.ones_like(x)), OpPattern.OPAQUE,
    attrs=(AttrDef("rate", 0.5, to_float),), compute=_dropout_compute,
    shape_logic=traceable(lambda op, attrs, shapes, err: [tuple(shapes[0]), tuple(shapes[0])]),
    doc="Inference dropout: (data, mask of ones), a tuple like Relay's.",
)


def _lrn(attrs, shape, x):
    if x.size == 0:  # (an empty axis is shorter than the window NumPy's sliding view needs)
        return x.copy()
    axis = attrs.axis % x.ndim
    acc = x.astype(_acc_dtype(x.dtype))
    widths = [(0, 0)] * x.ndim
    widths[axis] = (attrs.size // 2, attrs.size // 2)  # Relay's window: [c - size//2, c - size//2 + size)
    squares = np.pad(acc * acc, widths)
    window = np.lib.stride_tricks.sliding_window_view(squares, attrs.size, axis=axis)
    total = window.sum(axis=-1)
    total = total[(slice(None),) * axis + (slice(0, x.shape[axis]),)]
    return (acc / (attrs.bias + attrs.alpha / attrs.size * total) ** attrs.beta).astype(x.dtype)


def _lrn_compute(attrs, inputs, out_type):
    """x / (bias + alpha / size * sum of squares over the window [c - size//2, c - size//2 + size))^beta."""
    x = inputs[0]
    axis = axis_of("nn.lrn", attrs.axis, x.ndim)
    acc = acc_float(x.dtype)
    channels, half = x.shape[axis], attrs.size // 2
    r = reduce_axis(attrs.size, "r")

    def window(*i):
        j = i[axis] - half + r.var
        index = list(i)
        index[axis] = E.minimum(E.maximum(j, 0), channels - 1)  # in range even where masked out
        v = cast(x[tuple(index)], acc)
        return te_sum(v * v, r, where=E.logical_and(j >= 0, j < channels))

    total = compute(x.shape, window, "lrn_sum")
    scale, bias, beta = (const(v, acc) for v in (attrs.alpha / attrs.size, attrs.bias, attrs.beta))
    return [compute(x.shape, lambda *i: cast(cast(x[i], acc) / E.power(bias + scale * total[i], beta), x.dtype),
                    "lrn")]


define_shaped(
    "nn.lrn", 1, _axis_logic, _lrn, OpPattern.OPAQUE,
    attrs=(AttrDef("size", 5, _positive_int), AttrDef("axis", 1, to_int), AttrDef("bias", 2.0, to_float),
           AttrDef("alpha", 1e-5, to_float), AttrDef("beta", 0.75, to_float)),
    check_types=_check_float("nn.lrn"),
    doc="Local response normalization across ``axis``: x / (bias + alpha/size * sum(x^2))^beta.",
    compute=_lrn_compute,
)


@traceable
def _depth_to_space_logic(op, attrs, shapes, err):
    (shape,) = shapes
    _expect_rank(op, shape, 4, "data", err)
    n, c, h, w = _to_canonical(shape, attrs.layout, "NCHW")
    b = attrs.block_size
    out = (n, _div_dim(op, c, b * b, err, "the number of channels"), mul_dims(h, b), mul_dims(w, b))
    return _from_canonical(out, "NCHW", attrs.layout)


def _depth_to_space(attrs, out_shape, x):
    x = _array_to_canonical(x, attrs.layout, "NCHW")
    n, c, h, w = x.shape
    b = attrs.block_size
    if attrs.mode == "DCR":
        out = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        out = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return _array_from_canonical(out.reshape(n, c // (b * b), h * b, w * b), "NCHW", attrs.layout)


def _depth_to_space_compute(attrs, inputs, out_type):
    x = inputs[0]
    xd, x_read = layout_reader(x, attrs.layout, "NCHW")
    b = attrs.block_size
    channels = E.floordiv(xd["C"], b * b)
    requires = [(eq(E.floormod(xd["C"], b * b), 0), "nn.depth_to_space: channels must be divisible by block^2")]

    def f(N, C, H, W):
        b1, b2 = E.floormod(H, b), E.floormod(W, b)
        if attrs.mode == "DCR":
            channel = (b1 * b + b2) * channels + C
        else:
            channel = C * (b * b) + b1 * b + b2
        return x_read(N=N, C=channel, H=E.floordiv(H, b), W=E.floordiv(W, b))

    shape = {"N": xd["N"], "C": channels, "H": xd["H"] * b, "W": xd["W"] * b}
    return [layout_compute(shape, attrs.layout, f, "depth_to_space", requires)]


define_shaped(
    "nn.depth_to_space", 1, _depth_to_space_logic, _depth_to_space, OpPattern.INJECTIVE,
    attrs=(AttrDef("block_size", REQUIRED, _positive_int), _LAYOUT, AttrDef("mode", "DCR", one_of("DCR", "CRD"))),
    doc="Move channel blocks into block_size x block_size spatial tiles (DCR or CRD order).",
    compute=_depth_to_space_compute,
)


@traceable
def _space_to_depth_logic(op, attrs, shapes, err):
    (shape,) = shapes
    _expect_rank(op, shape, 4, "data", err)
    n, c, h, w = _to_canonical(shape, attrs.layout, "NCHW")
    b = attrs.block_size
    out = (n, mul_dims(c, b * b), _div_dim(op, h, b, err, "the height"), _div_dim(op, w, b, err, "the width"))
    return _from_canonical(out, "NCHW", attrs.layout)


def _space_to_depth(attrs, out_shape, x):
    x = _array_to_canonical(x, attrs.layout, "NCHW")
    n, c, h, w = x.shape
    b = attrs.block_size
    out = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4).reshape(n, c * b * b, h // b, w // b)
    return _array_from_canonical(out, "NCHW", attrs.layout)


def _space_to_depth_compute(attrs, inputs, out_type):
    x = inputs[0]
    xd, x_read = layout_reader(x, attrs.layout, "NCHW")
    b = attrs.block_size
    c = xd["C"]
    requires = [(eq(E.floormod(xd["H"], b), 0), "nn.space_to_depth: height must be divisible by the block"),
                (eq(E.floormod(xd["W"], b), 0), "nn.space_to_depth: width must be divisible by the block")]

    def f(N, C, H, W):
        block = E.floordiv(C, c)
        return x_read(N=N, C=E.floormod(C, c), H=H * b + E.floordiv(block, b), W=W * b + E.floormod(block, b))

    shape = {"N": xd["N"], "C": c * (b * b), "H": E.floordiv(xd["H"], b), "W": E.floordiv(xd["W"], b)}
    return [layout_compute(shape, attrs.layout, f, "space_to_depth", requires)]


define_shaped(
    "nn.space_to_depth", 1, _space_to_depth_logic, _space_to_depth, OpPattern.INJECTIVE,
    attrs=(AttrDef("block_size", REQUIRED, _positive_int), _LAYOUT),
    doc="Move block_size x block_size spatial tiles into channels (the inverse of DCR depth_to_space).",
    compute=_space_to_depth_compute,
)
