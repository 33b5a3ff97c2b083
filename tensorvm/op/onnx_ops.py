"""Operators that the ONNX importer needs and the Relay-style set lacks.

* ``trilu`` (a run-time diagonal). ONNX's data movement with run-time axes, pads and split sizes lowers
  to the core ``dyn.*`` ops of ``op/dynamic.py`` (``dyn.unsqueeze``, ``dyn.split``, ``dyn.pad``,
  ``dyn.reduce``, ``dyn.cumsum``, ``dyn.nn.dropout``) or to other core ops (Slice to ``strided_slice`` /
  ``dyn.strided_slice``, OneHot to ``one_hot`` / ``dyn.one_hot``, Unique to ``unique``).
* ``onnx.matmul`` (NumPy matmul with batch broadcasting), ``einsum``.
* ``image.resize`` (N-d nearest/linear/cubic with ONNX's coordinate transformations).
* N-d convolution and pooling with ONNX's padding rules: ``nn.conv_nd``, ``nn.conv_transpose_nd``,
  ``nn.pool_nd`` (max/average/Lp, ceil mode, ``auto_pad`` resolved from the run-time shape).
* Recurrent layers ``nn.lstm``, ``nn.gru``, ``nn.rnn`` and transformer blocks ``nn.attention``,
  ``nn.rotary_embedding``.

When the shape-deciding input is a ``Constant`` the type relation computes the exact output type;
otherwise the unknown dims are ``Any`` and the shape function (which reads that input's data) gives
them at run time. Kernels are NumPy; bad input raises ``ShapeError``/``ExecutionError``.

The ops here are OPAQUE (each forms a fusion group of its own). The n-d convolutions and pools,
``einsum``, ``nn.attention`` and ``nn.rotary_embedding`` have tensor-expression computes, written above
their definitions.
"""

from __future__ import annotations

import itertools
import math
import string

import numpy as np

from .. import te
from ..errors import AttrError, ExecutionError, ShapeError, TypeInferenceError, UnsupportedError
from ..ir.types import Any, TensorType, TupleType
from ..te import expr as E
from ..te.expr import INDEX_DTYPE, Const, cast, const, eq, logical_and, select
from ..te.tensor import compute, reduce_axis
from ..te.tensor import sum as te_sum
from . import shape_logic as sl
from ._common import expect_tensor
from ._compute import broadcast_read_dim, broadcast_shape, matmul_value, output_dtype, product, require_equal
from ._resample import F64, NP, TE, Spec, axis_taps, clamp, finish, nearest_index, resize_coordinate
from .dynamic import const_input as _const
from .dynamic import unique_axes as _norm_axes
from .registry import REQUIRED, AttrDef, LibraryKernel, OpPattern
from .shape_logic import DataArg
from .transform import (
    add_dims,
    define,
    expect_int_tensor,
    fmt_shape,
    int_tuple,
    mul_dims,
    one_of,
    to_bool,
    to_float,
    to_int,
    unify_dim,
)

__all__ = ["explicit_pads", "window_count"]

_FLOATS = ("float16", "float32", "float64")


# ---------------------------------------------------------------------------------------------------
# trilu


def _trilu_kernel(attrs, x, k):
    x = np.asarray(x)
    if x.ndim < 2:
        raise ShapeError(f"trilu: the input must have rank >= 2, got {x.shape}")
    k = int(np.asarray(k).reshape(-1)[0]) if np.size(k) else 0
    return np.triu(x, k) if attrs.upper else np.tril(x, k)


def _trilu_rel(types, attrs, consts=None):
    x = expect_tensor("trilu", types[0], "input")
    if x.ndim < 2:
        raise TypeInferenceError(f"trilu: the input must have rank >= 2, got {fmt_shape(x.shape)}")
    expect_int_tensor("trilu", types[1], "k")
    return x


def _trilu_compute(attrs, inputs, out_type):
    """The upper (``j - i >= k``) or lower (``j - i <= k``) triangle of the last two dims."""
    x, k = inputs
    if x.ndim < 2:
        raise TypeInferenceError(f"trilu: the input must have rank >= 2, got rank {x.ndim}")
    if k.ndim == 0:
        diagonal = cast(k[()], INDEX_DTYPE)
    else:  # a 1-d k: its first value, 0 when empty
        diagonal = select(eq(k.shape[0], 0), const(0), cast(k[(const(0),) * k.ndim], INDEX_DTYPE))

    def f(*i):
        offset = i[-1] - i[-2]
        keep = offset >= diagonal if attrs.upper else offset <= diagonal
        return select(keep, x[i], const(0, x.dtype))

    return [compute(x.shape, f, "trilu")]


define(
    "trilu", 2, _trilu_rel, _trilu_kernel, OpPattern.INJECTIVE,
    attrs=(AttrDef("upper", True, to_bool),),
    shape_logic=sl.traceable(lambda op, attrs, shapes, err: tuple(shapes[0])),
    doc="trilu(x, k): the upper (or lower) triangle of the last two dims from diagonal k (k: 0-d or 1-d, "
        "empty means 0).",
    compute=_trilu_compute,
)


# ---------------------------------------------------------------------------------------------------
# onnx.matmul, einsum


def _matmul_shape(op, a, b, err):
    if not a or not b:
        raise err(f"{op}: operands must have rank >= 1, got {fmt_shape(a)} and {fmt_shape(b)}")
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    k1, k2 = a2[-1], b2[-2]
    if isinstance(k1, (int, sl.Sym)) and isinstance(k2, (int, sl.Sym)):  # (known or traced dims)
        sl.require(k1 == k2, f"{op}: inner dims differ: {fmt_shape(a)} x {fmt_shape(b)}", err)
    from ._common import broadcast_dim

    batch_a, batch_b = a2[:-2], b2[:-2]
    n = max(len(batch_a), len(batch_b))
    batch_a = (1,) * (n - len(batch_a)) + batch_a
    batch_b = (1,) * (n - len(batch_b)) + batch_b
    try:
        batch = tuple(broadcast_dim(op, x, y) for x, y in zip(batch_a, batch_b, strict=True))
    except TypeInferenceError as e:
        raise err(str(e)) from None
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _matmul_rel(types, attrs, consts=None):
    a = expect_tensor("onnx.matmul", types[0], "A")
    b = expect_tensor("onnx.matmul", types[1], "B")
    if a.dtype != b.dtype:
        raise TypeInferenceError(f"onnx.matmul: A and B must have one dtype, got {a.dtype} and {b.dtype}")
    return TensorType(_matmul_shape("onnx.matmul", a.shape, b.shape, TypeInferenceError), a.dtype)


def _matmul_kernel(attrs, a, b):
    a, b = np.asarray(a), np.asarray(b)
    _matmul_shape("onnx.matmul", a.shape, b.shape, ShapeError)
    return np.matmul(a, b)


def _onnx_matmul_compute(attrs, inputs, out_type):
    """NumPy's matmul: 1-d operands get a unit dim (dropped from the result), batch dims broadcast."""
    a, b = inputs
    dtype = output_dtype(out_type)
    a_shape = (const(1),) + tuple(a.shape) if a.ndim == 1 else tuple(a.shape)
    b_shape = tuple(b.shape) + (const(1),) if b.ndim == 1 else tuple(b.shape)
    batch, requires = broadcast_shape("onnx.matmul", a_shape[:-2], b_shape[:-2])
    requires += require_equal("onnx.matmul", a_shape[-1], b_shape[-2], "the inner dims")
    k = reduce_axis(a_shape[-1], "k")
    shape = tuple(batch) + ((a_shape[-2],) if a.ndim > 1 else ()) + ((b_shape[-1],) if b.ndim > 1 else ())

    def f(*i):
        nb = len(batch)
        bi, rest = i[:nb], list(i[nb:])
        m = rest.pop(0) if a.ndim > 1 else None
        n = rest.pop(0) if b.ndim > 1 else None

        def batch_index(t_shape):
            dims = t_shape[:-2]
            return tuple(broadcast_read_dim(d, bi[nb - len(dims) + axis], batch[nb - len(dims) + axis])
                         for axis, d in enumerate(dims))

        av = a[batch_index(a_shape) + (m, k.var)] if a.ndim > 1 else a[k.var]
        bv = b[batch_index(b_shape) + (k.var, n)] if b.ndim > 1 else b[k.var]
        return te_sum(matmul_value(av, bv, k, dtype), k)

    return [compute(shape, f, "matmul", requires)]


def _onnx_matmul_strategy(attrs, inputs, out_type):
    """NumPy's matmul: BLAS when B is one matrix (A's leading dims fold into its rows) or when both
    have the same batch dims (or A is one matrix); other broadcasts stay generated code."""
    from ..codegen.strategy import gemm_call, matmul_implementations

    a, b = inputs
    if a.ndim < 2 or b.ndim < 2:
        return []
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if b.ndim == 2:
        gemm = gemm_call(1, product(a.shape[:-1]), n, k, 0, False, 0, False)
    elif a.ndim == 2:
        gemm = gemm_call(product(b.shape[:-2]), m, n, k, 0, False, k * n, False)
    elif a.ndim == b.ndim:
        same = const(True)
        for da, db in zip(a.shape[:-2], b.shape[:-2]):
            same = logical_and(same, eq(da, db))
        gemm = gemm_call(product(a.shape[:-2]), m, n, k, m * k, False, k * n, False, condition=same)
    else:
        return []
    return matmul_implementations(product(a.shape[:-1]), n, k, inputs, out_type, None, gemm)


define(
    "onnx.matmul", 2, _matmul_rel, _matmul_kernel, OpPattern.OUT_ELEMWISE_FUSABLE,
    shape_logic=sl.traceable(lambda op, attrs, shapes, err: _matmul_shape(op, shapes[0], shapes[1], err)),
    doc="Matrix product with NumPy's rules: 1-d operands are promoted, batch dims broadcast. Kept as an op of "
        "its own (not lowered to nn.batch_matmul): one call covers every operand rank and broadcast batch "
        "without broadcast_to/reshape copies of the operands, and its compute and strategy pick the GEMM kernel.",
    compute=_onnx_matmul_compute, strategy=_onnx_matmul_strategy,
)


def _parse_einsum(equation: str, ranks):
    eq = equation.replace(" ", "")
    if "->" in eq:
        lhs, rhs = eq.split("->")
    else:
        lhs, rhs = eq, None
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"equation {equation!r} has {len(terms)} operands, got {len(ranks)}")
    used = set(c for t in terms for c in t if c.isalpha())
    free = [c for c in string.ascii_letters if c not in used]
    ell_rank = 0
    expanded = []
    for term, rank in zip(terms, ranks, strict=True):
        if "..." in term:
            n = rank - (len(term) - 3)
            ell_rank = max(ell_rank, n)
            term = term.replace("...", "".join(free[:0]) + "\0" * n)
        expanded.append(term)
    ell = "".join(free[:ell_rank])
    out_terms = []
    for term in expanded:
        n = term.count("\0")
        out_terms.append(term.replace("\0" * n, ell[ell_rank - n:]) if n else term)
    if rhs is None:
        counts = {}
        for t in out_terms:
            for c in t:
                counts[c] = counts.get(c, 0) + 1
        rhs = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    else:
        rhs = rhs.replace("...", ell)
    return out_terms, rhs


def _einsum_shape(op, equation, shapes, err):
    """The output dims of the equation's letters: a letter's dims over the operands must be equal or 1
    (broadcast), whatever their kind (a typed unknown dim passes; a symbolic pair records the check)."""
    try:
        terms, rhs = _parse_einsum(equation, [len(s) for s in shapes])
    except ValueError as e:
        raise err(f"{op}: {e}") from None
    sizes = {}
    for term, shape in zip(terms, shapes, strict=True):
        if len(term) != len(shape):
            raise err(f"{op}: subscripts {term!r} do not match an operand of rank {len(shape)}")
        for c, d in zip(term, shape, strict=True):
            prev = sizes.get(c)
            if prev is None:
                sizes[c] = d
            elif sl.is_sym(prev) or sl.is_sym(d):
                sl.require(sl.dim_or(sl.dim_or(prev == d, prev == 1), d == 1),
                           f"{op}: subscript {c!r} has sizes {prev} and {d}", err)
                sizes[c] = sl.dim_select(prev == 1, d, prev)
            elif prev == 1:
                sizes[c] = d
            elif isinstance(prev, int) and isinstance(d, int) and d not in (1, prev):
                raise err(f"{op}: subscript {c!r} has sizes {prev} and {d}")
    return tuple(sizes[c] for c in rhs)


def _einsum_rel(types, attrs, consts=None):
    fields = types[0].fields if isinstance(types[0], TupleType) else types
    tensors = [expect_tensor("einsum", t, "operand") for t in fields]
    return TensorType(_einsum_shape("einsum", attrs.equation, [t.shape for t in tensors], TypeInferenceError),
                      tensors[0].dtype)


def _einsum_kernel(attrs, operands):
    operands = [np.asarray(o) for o in operands]
    terms, rhs = _parse_einsum(attrs.equation, [o.ndim for o in operands])
    return np.asarray(np.einsum(",".join(terms) + "->" + rhs, *operands)).astype(operands[0].dtype)


def _einsum_compute(attrs, inputs, out_type):
    """The products of the operands' elements summed over the letters absent from the output, in the
    operands' promoted dtype (NumPy's einsum; float16 accumulates in float32), cast to the first
    operand's dtype. A letter's dim of 1 broadcasts (NumPy does so for every letter); a letter repeated
    within a term reads a diagonal."""
    from ._compute import broadcast_read_dim, broadcast_shape

    operands = list(inputs[0]) if isinstance(inputs[0], tuple) else list(inputs)
    try:
        terms, rhs = _parse_einsum(attrs.equation, [t.ndim for t in operands])
    except ValueError as e:
        raise TypeInferenceError(f"einsum: {e}") from None
    occurrences = {}
    for term, t in zip(terms, operands, strict=True):
        if len(term) != t.ndim:
            raise TypeInferenceError(f"einsum: subscripts {term!r} do not match an operand of rank {t.ndim}")
        for c, d in zip(term, t.shape, strict=True):
            occurrences.setdefault(c, []).append(d)
    sizes, requires = {}, []
    for c, found in occurrences.items():
        (sizes[c],), needs = broadcast_shape(f"einsum (subscript {c!r})", *[(d,) for d in found])
        requires += needs
    if any(c not in sizes for c in rhs) or len(set(rhs)) != len(rhs):
        raise TypeInferenceError(f"einsum: bad output subscripts {rhs!r} for {attrs.equation!r}")
    promoted = np.result_type(*[t.dtype for t in operands]).name
    acc = "int64" if promoted == "bool" else promoted  # bool: any of the ands
    summed = {c: te.reduce_axis(sizes[c], f"r_{c}") for c in sizes if c not in rhs}

    def f(*out):
        at = dict(zip(rhs, out, strict=True))
        at.update({c: axis.var for c, axis in summed.items()})
        product = None
        for term, t in zip(terms, operands, strict=True):
            index = tuple(broadcast_read_dim(d, at[c], sizes[c]) for c, d in zip(term, t.shape, strict=True))
            value = te.cast(t[index], acc)
            product = value if product is None else product * value
        return te.sum(product, list(summed.values())) if summed else product

    shape = tuple(sizes[c] for c in rhs)
    result = te.compute(shape, f, "einsum", requires)
    dtype = operands[0].dtype
    if dtype == acc:
        return [result]
    finish = (lambda v: te.ne(v, 0)) if promoted == "bool" else (lambda v: te.cast(v, dtype))
    return [te.compute(shape, lambda *i: te.cast(finish(result[i]), dtype), "einsum_cast")]


define(
    "einsum", 1, _einsum_rel, _einsum_kernel, OpPattern.OPAQUE,
    attrs=(AttrDef("equation", REQUIRED, str),),
    shape_logic=sl.traceable(lambda op, attrs, args, err: _einsum_shape(op, attrs.equation, args[0], err)),
    doc="Einstein summation over a tuple of operands (``...`` broadcasting, implicit output allowed).",
    compute=_einsum_compute,
)


# ---------------------------------------------------------------------------------------------------
# image.resize: ONNX Resize


def _branch(cond, when_true, when_false) -> list:
    """``when_true() if cond else when_false()`` (lists of dims): a plain condition runs one side only
    (the other may read data that is not there); a symbolic one traces both and selects in C."""
    if not sl.is_sym(cond):
        return when_true() if cond else when_false()
    return [sl.dim_select(cond, a, b) for a, b in zip(when_true(), when_false(), strict=True)]


def _check_vector(op, arg, what, kinds, err) -> None:
    """A 1-D tensor of a dtype kind; an empty one (an omitted input) may have any dtype."""
    empty = sl.const_int(arg.shape[0]) and arg.shape[0] == 0 if len(arg.shape) == 1 else False
    if len(arg.shape) != 1 or not (empty or np.dtype(arg.dtype).kind in kinds):
        raise err(f"{op}: {what} must be a 1-D {'float' if kinds == 'f' else 'integer'} tensor (empty when "
                  f"omitted), got {arg.dtype} of shape {tuple(arg.shape)}")


_DIM_LIMIT = 2.0 ** 63


@sl.traceable
def _resize_logic(op, attrs, args, err):
    """ONNX Resize's output shape: ``sizes`` when given (stretched, or scaled by one ratio per
    keep_aspect_ratio_policy: floor(dim * ratio + 0.5)), else floor(dim * scale) per resized axis. An
    empty scales/sizes stands for an omitted input. Their lengths may be run-time dims when traced, so the
    choice between them is a select, and every data read is guarded by the length checks before it."""
    shape, scales, sizes = tuple(args[0]), args[2], args[3]
    axes = _norm_axes(op, attrs.axes, len(shape), err) if attrs.axes else tuple(range(len(shape)))
    _check_vector(op, scales, "scales", "f", err)
    _check_vector(op, sizes, "sizes", "iu", err)
    n, policy = len(axes), attrs.keep_aspect_ratio_policy
    has_sizes = sizes.shape[0] != 0

    def guarded(cond, check):  # ``check`` where ``cond`` holds
        return sl.dim_or(sl.dim_not(cond), check)

    sl.require(guarded(has_sizes, sizes.shape[0] == n), f"{op}: sizes must have one value per resized axis ({n})",
               err)
    sl.require(sl.dim_or(has_sizes, scales.shape[0] == n),
               f"{op}: give scales or sizes with one value per resized axis ({n})", err)

    def from_sizes():
        values = [sizes.item(i) for i in range(n)]
        for v in values:
            sl.require(guarded(has_sizes, v >= 0), f"{op}: sizes must be non-negative", err)
        if policy == "stretch":
            for v, a in zip(values, axes, strict=True):  # an empty dim cannot grow: nothing to sample
                sl.require(guarded(has_sizes, sl.dim_or(shape[a] != 0, v == 0)),
                           f"{op}: cannot resize an empty dim to a non-empty one", err)
            return values
        for a in axes:
            sl.require(guarded(has_sizes, shape[a] != 0),
                       f"{op}: keep_aspect_ratio_policy {policy!r} needs non-empty resized dims", err)
        ratios = [sl.as_double(v) / shape[a] for v, a in zip(values, axes, strict=True)]
        ratio = ratios[0]
        for r in ratios[1:]:
            ratio = sl.dim_min(ratio, r) if policy == "not_larger" else sl.dim_max(ratio, r)
        out = []
        for a in axes:
            scaled = shape[a] * ratio + 0.5
            sl.require(guarded(has_sizes, scaled < _DIM_LIMIT), f"{op}: an output dim is too large", err)
            out.append(sl.floor_int(scaled))
        return out

    def from_scales():
        out = []
        for i, a in enumerate(axes):
            s = scales.item(i)
            sl.require(guarded(sl.dim_not(has_sizes), sl.dim_and(sl.is_finite(s), s > 0)),
                       f"{op}: scales must be positive and finite", err)
            scaled = shape[a] * s
            sl.require(guarded(sl.dim_not(has_sizes), scaled < _DIM_LIMIT), f"{op}: an output dim is too large",
                       err)
            out.append(sl.floor_int(scaled))
        return out

    resized = _branch(has_sizes, from_sizes, from_scales)
    out = list(shape)
    for a, d in zip(axes, resized, strict=True):
        out[a] = d
    return tuple(out)


def _floats(arr):
    arr = np.asarray(arr)
    return None if arr.size == 0 else tuple(float(v) for v in arr.reshape(-1))


def _resize_rel(types, attrs, consts=None):
    op = "image.resize"
    x = expect_tensor(op, types[0], "X")
    vectors = []
    for i, what in ((2, "scales"), (3, "sizes")):
        t = expect_tensor(op, types[i], what)
        value = _const(consts, i)
        vectors.append(DataArg(t.shape, t.dtype, None if value is None else np.asarray(value)))
    if x.is_static and all(v.values is not None for v in vectors):
        return TensorType(tuple(_resize_logic(op, attrs, [x.shape, None, *vectors], TypeInferenceError)), x.dtype)
    _check_vector(op, vectors[0], "scales", "f", TypeInferenceError)
    _check_vector(op, vectors[1], "sizes", "iu", TypeInferenceError)
    axes = _norm_axes(op, attrs.axes, x.ndim, TypeInferenceError) if attrs.axes else range(x.ndim)
    return TensorType(tuple(Any() if i in axes else d for i, d in enumerate(x.shape)), x.dtype)


def _resize_shape(attrs, shape, scales, sizes) -> tuple:
    """The run-time output shape (the kernel's; the VM's shape function is derived from the same logic)."""
    return tuple(_resize_logic("image.resize", attrs, [tuple(shape), None, DataArg.of_array(scales),
                                                       DataArg.of_array(sizes)], ShapeError))


def _source_coordinate(m, mode, x, in_size, out_size, scale, roi_start, roi_end):
    """Resize's source coordinate of output position ``x`` by ONNX's formulas, opset 11's
    tf_half_pixel_for_nn included: ``(x + 0.5) / scale``, half_pixel's without the ``- 0.5``."""
    if mode == "tf_half_pixel_for_nn":
        return (m.to_float(x) + 0.5) / scale
    return resize_coordinate(m, mode, x, in_size, out_size, roi_start, roi_end, scale=scale)


def _source_coords(attrs, out_size, in_size, scale, roi_start, roi_end):
    """Source coordinates of the output positions; ``scale * in_size`` is the (unrounded) output length."""
    return _source_coordinate(NP, attrs.coordinate_transformation_mode, np.arange(out_size), in_size, out_size,
                              scale, roi_start, roi_end)


def _nearest(attrs, coords, in_size):
    return np.clip(nearest_index(NP, attrs.nearest_mode, coords), 0, in_size - 1).astype(np.int64)


def _cubic(s, a):
    s = np.abs(s)
    return np.where(s <= 1, ((a + 2) * s - (a + 3)) * s * s + 1,
                    np.where(s < 2, ((a * s - 5 * a) * s + 8 * a) * s - 4 * a, 0.0))


def _interpolation_taps(attrs, coords, scale):
    """(taps, weights): the input positions each output reads and their weights (linear or cubic).

    The window starts left of the coordinate (an integer coordinate counts as the right end of its
    interval, ratio 1); with antialias a downscale widens the kernel by 1/scale and normalizes it."""
    s = scale if attrs.antialias and scale < 1 else 1.0
    support = 1.0 if attrs.mode == "linear" else 2.0
    start = int(math.floor(-support / s)) + 1
    offsets = np.arange(start, 2 - start)
    base = np.ceil(coords).astype(np.int64) - 1
    ratio = coords - base
    args = (offsets[None, :] - ratio[:, None]) * s
    if attrs.mode == "linear":
        weights = np.clip(1 - np.abs(args), 0, 1)
    else:
        weights = _cubic(args, attrs.cubic_coeff_a)
    if s != 1.0:
        weights = weights / weights.sum(axis=1, keepdims=True)
    return base[:, None] + offsets[None, :], weights


def _resize_axis(attrs, x, axis, out_size, scale, roi_start, roi_end):
    in_size = x.shape[axis]
    coords = _source_coords(attrs, out_size, in_size, scale, roi_start, roi_end)
    if attrs.mode == "nearest":
        out = np.take(x, _nearest(attrs, coords, in_size), axis=axis)
    else:
        taps, weights = _interpolation_taps(attrs, coords, scale)
        if attrs.exclude_outside:
            weights = np.where((taps < 0) | (taps >= in_size), 0.0, weights)
            total = weights.sum(axis=1, keepdims=True)
            weights = weights / np.where(total == 0, 1, total)
        idx = np.clip(taps, 0, in_size - 1)
        gathered = np.take(x, idx.reshape(-1), axis=axis).reshape(x.shape[:axis] + idx.shape + x.shape[axis + 1:])
        wshape = (1,) * axis + weights.shape + (1,) * (x.ndim - axis - 1)
        out = (gathered * weights.reshape(wshape)).sum(axis=axis + 1)
    if attrs.coordinate_transformation_mode == "tf_crop_and_resize":
        outside = (coords < 0) | (coords > in_size - 1)
        if outside.any():
            mask_shape = (1,) * axis + (out_size,) + (1,) * (x.ndim - axis - 1)
            out = np.where(outside.reshape(mask_shape), attrs.extrapolation_value, out)
    return out


def _resize_kernel(attrs, x, roi, scales, sizes):
    x = np.asarray(x)
    out_shape = _resize_shape(attrs, x.shape, scales, sizes)
    if 0 in out_shape:  # (a non-empty output has a non-empty input: the shape logic checks it)
        return np.zeros(out_shape, x.dtype)
    axes = _norm_axes("image.resize", attrs.axes, x.ndim, ShapeError) if attrs.axes else tuple(range(x.ndim))
    scale_values = _floats(scales)
    roi = _floats(roi)
    ratio = _kept_ratio(attrs, [x.shape[a] for a in axes], sizes, np.size(sizes) != 0, np.minimum, np.maximum)
    work = x.astype(np.float64)
    for j, axis in enumerate(axes):
        out_size = out_shape[axis]
        if scale_values is not None and np.size(sizes) == 0:
            scale = scale_values[j]
        else:
            scale = out_size / x.shape[axis] if ratio is None else ratio
        if out_size == x.shape[axis] and scale == 1.0 and attrs.coordinate_transformation_mode != \
                "tf_crop_and_resize" and not (attrs.mode == "cubic" and attrs.exclude_outside):
            continue
        if roi is not None and len(roi) == 2 * len(axes):
            roi_start, roi_end = roi[j], roi[j + len(axes)]
        else:
            roi_start, roi_end = 0.0, 1.0
        work = _resize_axis(attrs, work, axis, out_size, scale, roi_start, roi_end)
    if np.issubdtype(x.dtype, np.integer):
        info = np.iinfo(x.dtype)
        work = np.clip(np.round(work), info.min, info.max)
    return work.astype(x.dtype)


def _kept_ratio(attrs, in_dims, sizes, has_sizes: bool, smaller, larger):
    """With ``sizes`` and keep_aspect_ratio_policy not_larger / not_smaller, the one scale of every resized
    axis: the smallest / largest of sizes[j] / in[j] (the spec samples with it, not with out / in, which the
    rounding of each output dim makes differ per axis); None otherwise (``smaller`` / ``larger``: the min
    and max of the kernel's or the compute's numbers)."""
    if not has_sizes or attrs.keep_aspect_ratio_policy == "stretch":
        return None
    pick = smaller if attrs.keep_aspect_ratio_policy == "not_larger" else larger
    ratio = None
    for j, n_in in enumerate(in_dims):
        r = sizes[j] / n_in
        ratio = r if ratio is None else pick(ratio, r)
    return ratio


def _static_length(t, what: str) -> int:
    if t.ndim != 1 or not isinstance(t.shape[0], Const):
        raise UnsupportedError(f"image.resize: the compute needs {what} to be 1-D of static length, got {t.shape}")
    return t.shape[0].value


def _resize_compute(attrs, inputs, out_type):
    """The kernel's separable resampling: one stage per resized axis, in the kernel's order. A linear or
    cubic stage is a reduction over its 2 or 4 taps, so each stage is materialized (inlined into the
    next, N axes would read 4**N taps). An axis the kernel skips (the same size, scale 1, no crop or
    exclude_outside) reads only its centre tap, at run time when the scale comes from a tensor."""
    from ._compute import output_dims as _output_dims
    from ._compute import product as _prod

    x, roi, scales, sizes = inputs
    if attrs.antialias:
        raise UnsupportedError("image.resize: no compute with antialias (its kernel width follows the scale)")
    axes = _norm_axes("image.resize", attrs.axes, x.ndim, TypeInferenceError) if attrs.axes else tuple(range(x.ndim))
    n_roi, n_scales = _static_length(roi, "roi"), _static_length(scales, "scales")
    use_scales = _static_length(sizes, "sizes") == 0 and n_scales > 0
    out_dims = _output_dims("image.resize", out_type)
    mode = attrs.coordinate_transformation_mode
    method = {"nearest": "nearest_neighbor"}.get(attrs.mode, attrs.mode)
    spec = Spec(method, mode, attrs.nearest_mode, attrs.cubic_coeff_a, attrs.exclude_outside,
                attrs.extrapolation_value)
    may_skip = mode != "tf_crop_and_resize" and not (method == "cubic" and attrs.exclude_outside)
    requires = [(E.logical_or(E.all_of(*(x.shape[a] > 0 for a in axes)), E.eq(_prod(out_dims), 0)),
                 "image.resize: cannot resize an empty input to a non-empty output")]
    stage = compute(x.shape, lambda *i: cast(x[i], F64), "resize_in", requires)
    n_sizes = _static_length(sizes, "sizes")
    ratio = _kept_ratio(attrs, [cast(x.shape[a], F64) for a in axes], [cast(sizes[(const(j),)], F64) for j in
                                                                       range(n_sizes)], n_sizes != 0, E.minimum, E.maximum)
    for j, a in enumerate(axes):
        n_in, n_out = x.shape[a], out_dims[a]
        if use_scales:
            scale = cast(scales[(const(j),)], F64)
        else:
            scale = cast(n_out, F64) / cast(n_in, F64) if ratio is None else ratio
        if n_roi == 2 * len(axes):
            start, end = cast(roi[(const(j),)], F64), cast(roi[(const(j + len(axes)),)], F64)
        else:
            start, end = const(0.0, F64), const(1.0, F64)
        identity = E.all_of(E.eq(n_out, n_in), E.eq(scale, 1.0)) if may_skip else const(False)
        shape = tuple(n_out if k == a else d for k, d in enumerate(stage.shape))
        stage = _resize_stage(spec, stage, a, shape, scale, start, end, identity)
    dtype = x.dtype
    return [compute(out_dims, lambda *i: cast(finish(TE, spec, stage[i], [], [], dtype), dtype), "resize")]


def _resize_stage(spec, prev, axis, shape, scale, start, end, identity):
    """``prev`` resized along ``axis`` (float64), with the axis' extrapolation."""
    n_in, n_out = prev.shape[axis], shape[axis]

    def at(i, position):
        return prev[tuple(position if k == axis else j for k, j in enumerate(i))]

    def outside(c):
        return E.logical_or(c < 0.0, c > cast(n_in - 1, F64))

    def extrapolated(c, value):
        if spec.mode != "tf_crop_and_resize":
            return value
        return E.select(outside(c), const(spec.extrapolation_value, F64), value)

    def source(i):
        c = _source_coordinate(TE, spec.mode, i[axis], n_in, n_out, scale, start, end)
        if spec.mode == "tf_half_pixel_for_nn":  # (its scale 1 moves the positions by half a pixel)
            c = E.select(identity, cast(i[axis], F64), c)  # an axis the kernel skips keeps its positions
        return c

    if spec.method == "nearest_neighbor":
        def nearest(*i):
            c = source(i)
            return extrapolated(c, at(i, clamp(TE, cast(nearest_index(TE, spec.rounding, c), "int64"), n_in)))

        return compute(shape, nearest, "resize_nearest")
    count = 2 if spec.method == "linear" else 4
    centre = 0 if count == 2 else 1
    r = reduce_axis(count, "tap")

    def interpolate(*i):
        c = source(i)
        positions, weights = axis_taps(TE, spec, c, n_in)
        weight, position = weights[-1], positions[-1]
        for k in range(count - 2, -1, -1):  # the tap's weight and position by its index
            weight = E.select(E.eq(r.var, k), weights[k], weight)
            position = E.select(E.eq(r.var, k), positions[k], position)
        taps = te_sum(weight * at(i, position), [r], where=E.logical_or(E.logical_not(identity),
                                                                        E.eq(r.var, centre)))
        return taps

    summed = compute(shape, interpolate, f"resize_{spec.method}")
    if spec.mode != "tf_crop_and_resize":
        return summed
    return compute(shape, lambda *i: extrapolated(resize_coordinate(TE, spec.mode, i[axis], n_in, n_out, start, end,
                                                                    scale=scale), summed[i]), "resize_extrapolate")


define(
    "image.resize", 4, _resize_rel, _resize_kernel, OpPattern.OPAQUE,
    attrs=(
        AttrDef("mode", "nearest", one_of("nearest", "linear", "cubic")),
        AttrDef("coordinate_transformation_mode", "half_pixel",
                one_of("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                       "pytorch_align_corners", "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize")),
        AttrDef("nearest_mode", "round_prefer_floor", one_of("round_prefer_floor", "round_prefer_ceil", "floor",
                                                            "ceil")),
        AttrDef("cubic_coeff_a", -0.75, to_float), AttrDef("exclude_outside", False, to_bool),
        AttrDef("extrapolation_value", 0.0, to_float), AttrDef("antialias", False, to_bool),
        AttrDef("keep_aspect_ratio_policy", "stretch", one_of("stretch", "not_larger", "not_smaller")),
        AttrDef("axes", (), int_tuple()),
    ),
    shape_logic=_resize_logic, data_dependent=(False, True, True, True), compute=_resize_compute,
    doc="image.resize(X, roi, scales, sizes): ONNX Resize (nearest, linear or cubic per axis); empty "
        "tensors stand for omitted inputs. coordinate_transformation_mode pytorch_align_corners is align_corners "
        "over the output's own length (PyTorch's, ONNX Runtime's), which the importer picks for PyTorch's models.",
)


# ---------------------------------------------------------------------------------------------------
# N-d convolution and pooling


def _auto_pads(auto_pad, in_sizes, kernel, strides, dilations):
    begins, ends = [], []
    for d, k, s, dl in zip(in_sizes, kernel, strides, dilations, strict=True):
        out = -(-d // s)
        total = max((out - 1) * s + (k - 1) * dl + 1 - d, 0)
        small, large = total // 2, total - total // 2
        if auto_pad == "SAME_UPPER":
            begins.append(small)
            ends.append(large)
        else:
            begins.append(large)
            ends.append(small)
    return tuple(begins) + tuple(ends)


def _window_attrs(attrs, spatial, kernel):
    n = len(spatial)
    strides = attrs.strides or (1,) * n
    dilations = attrs.dilations or (1,) * n
    if attrs.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = _auto_pads(attrs.auto_pad, spatial, kernel, strides, dilations)
    elif attrs.auto_pad == "VALID":
        pads = (0,) * (2 * n)
    else:
        pads = attrs.pads or (0,) * (2 * n)
    if not len(strides) == len(dilations) == n or len(pads) != 2 * n:
        raise ShapeError(f"strides, dilations and pads must have {n}, {n} and {2 * n} values, got "
                         f"{strides}, {dilations}, {pads}")
    return strides, dilations, pads


def explicit_pads(auto_pad: str, pads, spatial, kernel, strides, dilations) -> tuple | None:
    """The (begins..., ends...) pads ``auto_pad`` stands for; None when SAME needs a spatial dim that is
    not static, or when the attributes have the wrong lengths (the op reports that)."""
    n = len(kernel)
    if len(spatial) != n or len(strides) != n or len(dilations) != n:
        return None
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if not all(isinstance(d, int) for d in tuple(spatial) + tuple(kernel)):
            return None
        return _auto_pads(auto_pad, spatial, kernel, strides, dilations)
    pads = tuple(pads or ()) if auto_pad == "NOTSET" else ()
    pads = pads or (0,) * (2 * n)
    return pads if len(pads) == 2 * n else None


def _conv_out(d, k, s, dl, pb, pe, ceil_mode=False):
    extent = (k - 1) * dl + 1
    room = d + pb + pe - extent
    if ceil_mode:
        out = -(-room // s) + 1
        if (out - 1) * s >= d + pb:  # the last window must start inside the data or the begin padding
            out -= 1
        return out
    return room // s + 1


window_count = _conv_out  # the number of window positions along one axis, with ONNX's ceil-mode rule

_WINDOW_ATTRS = (
    AttrDef("strides", (), int_tuple(1)), AttrDef("pads", (), int_tuple()), AttrDef("dilations", (), int_tuple(1)),
    AttrDef("auto_pad", "NOTSET", one_of("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")),
)


# ---- the same window rules over te dims, for the computes (static dims fold to constants) ----


def _static_ints(op: str, dims, what: str) -> tuple:
    if not all(isinstance(d, te.Const) for d in dims):
        raise UnsupportedError(f"{op}: compiled code needs a static {what}, got {list(dims)}")
    return tuple(d.value for d in dims)


def _te_windows(op: str, attrs, spatial, kernel, ceil_mode: bool = False, same_out: bool = False):
    """Per spatial axis ``(begin pad, end pad, output size)`` as te expressions, by ``_window_attrs`` and
    ``_conv_out``'s rules (``same_out``: the SAME output size ``ceil(d / stride)`` of a pool)."""
    n = len(spatial)
    strides = attrs.strides or (1,) * n
    dilations = attrs.dilations or (1,) * n
    if attrs.auto_pad in ("NOTSET", "VALID"):
        pads = (attrs.pads or (0,) * (2 * n)) if attrs.auto_pad == "NOTSET" else (0,) * (2 * n)
        pads = tuple(te.const(v) for v in pads)
    if not len(strides) == len(dilations) == n or (attrs.auto_pad == "NOTSET" and len(pads) != 2 * n):
        raise ShapeError(f"{op}: strides, dilations and pads must have {n}, {n} and {2 * n} values, got "
                         f"{strides}, {dilations}, {attrs.pads}")
    out = []
    for i, (d, k, s, dl) in enumerate(zip(spatial, kernel, strides, dilations, strict=True)):
        extent = (k - 1) * dl + 1
        if attrs.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            ceil_out = te.floordiv(d + (s - 1), s)
            total = te.maximum((ceil_out - 1) * s + extent - d, 0)
            small = te.floordiv(total, 2)
            begin, end = (small, total - small) if attrs.auto_pad == "SAME_UPPER" else (total - small, small)
        else:
            begin, end = pads[i], pads[i + n]
        room = d + begin + end - extent
        if same_out and attrs.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            size = ceil_out
        elif ceil_mode:  # the last window must start inside the data or the begin padding
            size = te.floordiv(room + (s - 1), s) + 1
            size = te.select((size - 1) * s >= d + begin, size - 1, size)
        else:
            size = te.floordiv(room, s) + 1
        out.append((begin, end, te.maximum(size, 0)))
    return strides, dilations, out


def _nonzero(e) -> bool:
    """Whether a te value may be nonzero (a symbolic one may)."""
    return not (isinstance(e, te.Const) and e.value == 0)


def _padded(x, pads, name: str, fill=0):
    """``x`` with ``fill`` around its trailing spatial dims (``pads``: per spatial axis (begin, end)), a
    compute of its own so that a convolution's or pool's inner loop reads it without border tests (which
    keep the loop from vectorizing)."""
    if not any(_nonzero(b) or _nonzero(e) for b, e in pads):
        return x
    lead = x.ndim - len(pads)
    spatial = x.shape[lead:]
    shape = tuple(x.shape[:lead]) + tuple(d + b + e for d, (b, e) in zip(spatial, pads, strict=True))

    def f(*i):
        pos = tuple(j - b for j, (b, _) in zip(i[lead:], pads, strict=True))
        inside = te.all_of(*[c for p, d in zip(pos, spatial, strict=True) for c in (p >= 0, p < d)])
        return te.select(inside, x[tuple(i[:lead]) + pos], te.const(fill, x.dtype))

    return te.compute(shape, f, name)


def _conv_nd_shape(op, attrs, x, w, err):
    if len(x) < 3 or len(w) != len(x):
        raise err(f"{op}: expected data (N, C, D...) and weight (M, C/group, K...) of one rank >= 3, got "
                  f"{fmt_shape(x)} and {fmt_shape(w)}")
    spatial, kernel = x[2:], w[2:]
    out = [x[0], w[0]]
    if not all(isinstance(d, int) for d in tuple(spatial) + tuple(kernel)):
        return tuple(out) + (Any(),) * len(spatial)
    if isinstance(x[1], (int, sl.Sym)):  # (a known or traced dim; the spatial dims above are static)
        sl.require(x[1] == w[1] * attrs.group, f"{op}: the data has {x[1]} channels but weight x group = {w[1]} x "
                                               f"{attrs.group}", err)
    try:
        strides, dilations, pads = _window_attrs(attrs, spatial, kernel)
    except ShapeError as e:
        raise err(f"{op}: {e}") from None
    n = len(spatial)
    for i in range(n):
        size = _conv_out(spatial[i], kernel[i], strides[i], dilations[i], pads[i], pads[i + n])
        if size < 1:
            raise err(f"{op}: the kernel does not fit the padded input along spatial axis {i}")
        out.append(size)
    return tuple(out)


def _windows_nd(x, kernel, strides, dilations, out_sizes):
    """A view (N, C, O1..On, K1..Kn) of the windows over the trailing spatial dims of ``x``."""
    n = len(kernel)
    sp = x.strides[-n:]
    return np.lib.stride_tricks.as_strided(
        x, shape=x.shape[:-n] + tuple(out_sizes) + tuple(kernel),
        strides=x.strides[:-n] + tuple(s * st for s, st in zip(sp, strides, strict=True))
        + tuple(s * d for s, d in zip(sp, dilations, strict=True)),
        writeable=False)


def _conv_nd_kernel(attrs, x, w):
    x, w = np.asarray(x), np.asarray(w)
    out_shape = _conv_nd_shape("nn.conv_nd", attrs, x.shape, w.shape, ShapeError)
    n = x.ndim - 2
    strides, dilations, pads = _window_attrs(attrs, x.shape[2:], w.shape[2:])
    acc = np.float64 if x.dtype != np.float32 else np.float32
    xp = np.pad(x.astype(acc), ((0, 0), (0, 0)) + tuple((pads[i], pads[i + n]) for i in range(n)))
    cols = _windows_nd(xp, w.shape[2:], strides, dilations, out_shape[2:])  # (N, C, O..., K...)
    g = attrs.group
    batch, c = x.shape[:2]
    m, cg = w.shape[:2]
    osz = int(np.prod(out_shape[2:]))
    ksz = int(np.prod(w.shape[2:]))
    cols = cols.reshape((batch, g, cg) + tuple(out_shape[2:]) + tuple(w.shape[2:]))
    spatial_axes = tuple(range(3, 3 + n))
    kernel_axes = tuple(range(3 + n, 3 + 2 * n))
    cols = cols.transpose((1, 0) + spatial_axes + (2,) + kernel_axes).reshape(g, batch * osz, cg * ksz)
    weights = w.astype(acc).reshape(g, m // g, cg * ksz).transpose(0, 2, 1)
    out = np.matmul(cols, weights)  # (G, N*O, M/G)
    out = out.reshape((g, batch) + tuple(out_shape[2:]) + (m // g,))
    out = np.moveaxis(out, -1, 2).reshape((batch, m) + tuple(out_shape[2:]))
    # moveaxis put the group axis first; bring it next to the per-group channels
    return np.ascontiguousarray(out).astype(x.dtype)


def _conv_nd_kernel_grouped(attrs, x, w):
    x, w = np.asarray(x), np.asarray(w)
    _conv_nd_shape("nn.conv_nd", attrs, x.shape, w.shape, ShapeError)  # (the group slices would drop channels)
    g = attrs.group
    if g == 1:
        return _conv_nd_kernel(attrs, x, w)
    cg, mg = w.shape[1], w.shape[0] // g
    parts = []
    single = _Attrs1(attrs)
    for i in range(g):
        parts.append(_conv_nd_kernel(single, x[:, i * cg:(i + 1) * cg], w[i * mg:(i + 1) * mg]))
    return np.concatenate(parts, axis=1)


class _Attrs1:
    """The attrs of a grouped convolution as seen by one group."""

    def __init__(self, attrs):
        self._attrs = attrs

    def __getattr__(self, name):
        return 1 if name == "group" else getattr(self._attrs, name)


_CONV_ATTRS = _WINDOW_ATTRS + (AttrDef("group", 1, to_int),)


def _conv_nd_compute(attrs, inputs, out_type):
    """Grouped N-d convolution over zero-padded data, accumulated like the kernel (float32 for float32,
    else float64)."""
    x, w = inputs
    if x.ndim < 3 or w.ndim != x.ndim:
        raise TypeInferenceError(f"nn.conv_nd: expected data and weight of one rank >= 3, got ranks {x.ndim} "
                                 f"and {w.ndim}")
    kernel = _static_ints("nn.conv_nd", w.shape[2:], "kernel size")
    strides, dilations, windows = _te_windows("nn.conv_nd", attrs, x.shape[2:], kernel)
    g = attrs.group
    channels, out_channels = w.shape[1], w.shape[0]
    requires = [(te.eq(x.shape[1], channels * g), "nn.conv_nd: the data's channels must be the weight's "
                                                  "in-channels x group"),
                (te.eq(te.floormod(out_channels, g), 0), "nn.conv_nd: the out-channels must divide into groups")]
    requires += [(size >= 1, f"nn.conv_nd: the kernel does not fit the padded input along spatial axis {i}")
                 for i, (_, _, size) in enumerate(windows)]
    padded = _padded(x, [(b, e) for b, e, _ in windows], "conv_nd_pad")
    acc = "float32" if x.dtype == "float32" else "float64"
    ci = te.reduce_axis(channels, "ci")
    taps = [te.reduce_axis(k, f"k{i}") for i, k in enumerate(kernel)]
    per_group = te.floordiv(out_channels, g)

    def f(b, o, *out):
        channel = te.floordiv(o, per_group) * channels + ci.var if g > 1 else ci.var
        pos = tuple(j * s + t.var * dl for j, t, s, dl in zip(out, taps, strides, dilations, strict=True))
        value = te.cast(padded[(b, channel) + pos], acc) * te.cast(w[(o, ci.var) + tuple(t.var for t in taps)], acc)
        return te.sum(value, [ci] + taps)

    shape = (x.shape[0], out_channels) + tuple(size for _, _, size in windows)
    conv = te.compute(shape, f, "conv_nd", requires)
    if acc == x.dtype:
        return [conv]
    return [te.compute(shape, lambda *i: te.cast(conv[i], x.dtype), "conv_nd_cast")]


define(
    "nn.conv_nd", 2,
    lambda types, attrs, consts=None: TensorType(_conv_nd_shape(
        "nn.conv_nd", attrs, expect_tensor("nn.conv_nd", types[0], "data").shape,
        expect_tensor("nn.conv_nd", types[1], "weight").shape, TypeInferenceError), types[0].dtype),
    _conv_nd_kernel_grouped, OpPattern.OPAQUE, attrs=_CONV_ATTRS, compute=_conv_nd_compute,
    shape_logic=sl.traceable(lambda op, attrs, shapes, err: _conv_nd_shape(op, attrs, shapes[0], shapes[1], err)),
    doc="N-d grouped convolution with ONNX's attributes: pads = (begins..., ends...), auto_pad resolved "
        "from the input's spatial size.",
)


def _conv_t_shape(op, attrs, x, w, err):
    if len(x) < 3 or len(w) != len(x):
        raise err(f"{op}: expected data (N, C, D...) and weight (C, M/group, K...) of one rank >= 3, got "
                  f"{fmt_shape(x)} and {fmt_shape(w)}")
    n = len(x) - 2
    out = [x[0], mul_dims(w[1], attrs.group)]
    if isinstance(x[1], (int, sl.Sym)) and isinstance(w[0], (int, sl.Sym)):  # (known or traced dims)
        sl.require(x[1] == w[0], f"{op}: the data has {x[1]} channels but the weight expects {w[0]}", err)
    if attrs.output_shape:
        return tuple(out) + tuple(attrs.output_shape[-n:])
    spatial, kernel = x[2:], w[2:]
    if not all(isinstance(d, int) for d in tuple(spatial) + tuple(kernel)):
        return tuple(out) + (Any(),) * n
    strides = attrs.strides or (1,) * n
    dilations = attrs.dilations or (1,) * n
    out_pad = attrs.output_padding or (0,) * n
    for i in range(n):
        if attrs.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out.append(spatial[i] * strides[i])
        else:
            pads = attrs.pads or (0,) * (2 * n)
            if attrs.auto_pad == "VALID":
                pads = (0,) * (2 * n)
            out.append(strides[i] * (spatial[i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1
                       - pads[i] - pads[i + n])
    return tuple(out)


def _conv_t_kernel(attrs, x, w):
    x, w = np.asarray(x), np.asarray(w)
    out_shape = _conv_t_shape("nn.conv_transpose_nd", attrs, x.shape, w.shape, ShapeError)
    n = x.ndim - 2
    strides = attrs.strides or (1,) * n
    dilations = attrs.dilations or (1,) * n
    out_pad = attrs.output_padding or (0,) * n
    kernel = w.shape[2:]
    full = [strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1 for i in range(n)]
    target = out_shape[2:]
    if attrs.output_shape or attrs.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        total = [full[i] - target[i] for i in range(n)]
        if attrs.auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
            # An output_shape beyond the full result is zero-extended at the end: ONNX Runtime clamps the
            # total padding at 0 and the reference evaluator keeps the pads 0.
            total = [max(t, 0) for t in total]
        # A SAME output beyond the full result gets negative pads by the spec's formula (floor halves, as
        # the reference evaluator's; ONNX Runtime's output is then shorter than its own SAME length).
        if attrs.auto_pad == "SAME_UPPER":
            pads = [t // 2 for t in total] + [t - t // 2 for t in total]
        else:
            pads = [t - t // 2 for t in total] + [t // 2 for t in total]
    elif attrs.auto_pad == "VALID":
        pads = [0] * (2 * n)
    else:
        pads = list(attrs.pads or (0,) * (2 * n))
    g = attrs.group
    batch, c = x.shape[:2]
    cg, mg = c // g, w.shape[1]
    acc = np.float64
    buf = np.zeros((batch, g * mg) + tuple(max(f, 1) for f in full), dtype=acc)
    xg = x.astype(acc).reshape((batch, g, cg) + x.shape[2:])
    wg = w.astype(acc).reshape((g, cg, mg) + kernel)
    for tap in itertools.product(*[range(k) for k in kernel]):
        # contribution of kernel tap: out[n, g*mg+m, s*i + d*k] += x[n, g, c, i] * w[g, c, m, k]
        contrib = np.einsum("ngc...,gcm->ngm...", xg, wg[(slice(None), slice(None), slice(None)) + tap])
        contrib = contrib.reshape((batch, g * mg) + x.shape[2:])
        index = (slice(None), slice(None)) + tuple(
            slice(tap[i] * dilations[i], tap[i] * dilations[i] + strides[i] * (x.shape[2 + i] - 1) + 1, strides[i])
            for i in range(n))
        buf[index] += contrib
    # The output is the full result's window [begin pad, begin pad + size); where it reaches outside the
    # full result (a negative pad: an output larger than the full result) it holds zeros.
    out = np.zeros(buf.shape[:2] + tuple(target), dtype=acc)
    source, dest = [slice(None)] * 2, [slice(None)] * 2
    for i in range(n):
        start = max(pads[i], 0)
        stop = max(min(pads[i] + target[i], buf.shape[2 + i]), start)
        source.append(slice(start, stop))
        dest.append(slice(start - pads[i], stop - pads[i]))
    out[tuple(dest)] = buf[tuple(source)]
    return out.astype(x.dtype)


def _conv_t_compute(attrs, inputs, out_type):
    """Each output position gathers the taps that land on it: ``pos + begin pad = i * stride + tap *
    dilation`` for an input position i, accumulated in float64 like the kernel. A position outside the
    full result (a negative pad) gathers no tap: a zero."""
    x, w = inputs
    op = "nn.conv_transpose_nd"
    if x.ndim < 3 or w.ndim != x.ndim:
        raise TypeInferenceError(f"{op}: expected data and weight of one rank >= 3, got ranks {x.ndim} and {w.ndim}")
    n = x.ndim - 2
    kernel = _static_ints(op, w.shape[2:], "kernel size")
    strides = attrs.strides or (1,) * n
    dilations = attrs.dilations or (1,) * n
    out_pad = attrs.output_padding or (0,) * n
    pads = (attrs.pads or (0,) * (2 * n)) if attrs.auto_pad == "NOTSET" else (0,) * (2 * n)
    if not len(strides) == len(dilations) == len(out_pad) == n or len(pads) != 2 * n:
        raise ShapeError(f"{op}: strides, dilations, output_padding and pads must have {n}, {n}, {n} and {2 * n} "
                         f"values, got {strides}, {dilations}, {out_pad}, {pads}")
    g = attrs.group
    channels, per_group_out = x.shape[1], w.shape[1]
    requires = [(te.eq(channels, w.shape[0]), f"{op}: the data's channels must match the weight's dim 0"),
                (te.eq(te.floormod(channels, g), 0), f"{op}: the channels must divide into groups")]
    sizes, begins = [], []
    for i, (d, k) in enumerate(zip(x.shape[2:], kernel, strict=True)):
        full = strides[i] * (d - 1) + out_pad[i] + (k - 1) * dilations[i] + 1
        same = attrs.auto_pad in ("SAME_UPPER", "SAME_LOWER")
        if attrs.output_shape or same:
            size = te.const(attrs.output_shape[-n:][i]) if attrs.output_shape else d * strides[i]
            total = full - size
            if not same:  # (the kernel's pads, negative ones included)
                total = E.maximum(total, 0)
            half = te.floordiv(total, 2)
            begins.append(half if attrs.auto_pad == "SAME_UPPER" else total - half)
        else:
            size = full - pads[i] - pads[i + n]
            begins.append(te.const(pads[i]))
        sizes.append(size)
    per_group_in = te.floordiv(channels, g)
    ci = te.reduce_axis(per_group_in, "ci")
    taps = [te.reduce_axis(k, f"k{i}") for i, k in enumerate(kernel)]

    def f(b, o, *out):
        channel = te.floordiv(o, per_group_out) * per_group_in + ci.var if g > 1 else ci.var
        index, hits = [], []
        for j, t, s, dl, begin, d in zip(out, taps, strides, dilations, begins, x.shape[2:], strict=True):
            shifted = j + begin - t.var * dl
            y = te.floordiv(shifted, s) if s > 1 else shifted
            hits += [shifted >= 0, y < d] + ([te.eq(te.floormod(shifted, s), 0)] if s > 1 else [])
            index.append(y)
        m = te.floormod(o, per_group_out) if g > 1 else o
        value = te.cast(x[(b, channel) + tuple(index)], "float64") * te.cast(
            w[(channel, m) + tuple(t.var for t in taps)], "float64")
        return te.sum(value, [ci] + taps, where=te.all_of(*hits))

    shape = (x.shape[0], per_group_out * g) + tuple(sizes)
    total = te.compute(shape, f, "conv_transpose_nd", requires)
    return [te.compute(shape, lambda *i: te.cast(total[i], x.dtype), "conv_transpose_nd_cast")]


define(
    "nn.conv_transpose_nd", 2,
    lambda types, attrs, consts=None: TensorType(_conv_t_shape(
        "nn.conv_transpose_nd", attrs, expect_tensor("nn.conv_transpose_nd", types[0], "data").shape,
        expect_tensor("nn.conv_transpose_nd", types[1], "weight").shape, TypeInferenceError), types[0].dtype),
    _conv_t_kernel, OpPattern.OPAQUE,
    attrs=_CONV_ATTRS + (AttrDef("output_padding", (), int_tuple(0)), AttrDef("output_shape", (), int_tuple(0))),
    shape_logic=sl.traceable(lambda op, attrs, shapes, err: _conv_t_shape(op, attrs, shapes[0], shapes[1], err)),
    compute=_conv_t_compute,
    doc="N-d transposed convolution with ONNX's attributes (weight (C, M/group, K...), output_padding, "
        "output_shape, auto_pad).",
)


def _pool_shape(op, attrs, x, err):
    n = len(attrs.kernel_shape)
    if len(x) != n + 2:
        raise err(f"{op}: a {n}-d kernel needs data of rank {n + 2}, got {fmt_shape(x)}")
    spatial = x[2:]
    if not all(isinstance(d, int) for d in spatial):
        return tuple(x[:2]) + (Any(),) * n
    try:
        strides, dilations, pads = _window_attrs(attrs, spatial, attrs.kernel_shape)
    except ShapeError as e:
        raise err(f"{op}: {e}") from None
    out = list(x[:2])
    for i in range(n):
        if attrs.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out.append(-(-spatial[i] // strides[i]))
        else:
            out.append(_conv_out(spatial[i], attrs.kernel_shape[i], strides[i], dilations[i], pads[i], pads[i + n],
                                 attrs.ceil_mode))
    return tuple(out)


def _pool_kernel(attrs, x):
    x = np.asarray(x)
    out_shape = _pool_shape("nn.pool_nd", attrs, x.shape, ShapeError)
    n = len(attrs.kernel_shape)
    strides, dilations, pads = _window_attrs(attrs, x.shape[2:], attrs.kernel_shape)
    kernel = attrs.kernel_shape
    # room for the last (ceil-mode) window beyond the explicit end padding
    extra = [max(0, (out_shape[2 + i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1
                 - (x.shape[2 + i] + pads[i] + pads[i + n])) for i in range(n)]
    widths = ((0, 0), (0, 0)) + tuple((pads[i], pads[i + n] + extra[i]) for i in range(n))
    mode = attrs.mode
    if mode == "max":
        fill = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
        xp = np.pad(x, widths, constant_values=fill)
        win = _windows_nd(xp, kernel, strides, dilations, out_shape[2:])
        axes = tuple(range(-n, 0))
        out = win.max(axis=axes)
        if not attrs.return_indices:
            return out
        if out.size == 0:  # (no window to take the argmax of; the reshape below cannot infer -1)
            return out, np.zeros(out.shape, np.int64)
        flat = win.reshape(win.shape[:2 + n] + (-1,)).argmax(axis=-1)
        taps = np.unravel_index(flat, kernel)
        coords = []
        for i in range(n):
            o = np.arange(out_shape[2 + i]).reshape((-1,) + (1,) * (n - 1 - i))
            coords.append(o * strides[i] + taps[i] * dilations[i] - pads[i])
        index = np.zeros(out.shape, dtype=np.int64)
        for i in range(n):
            index = index * x.shape[2 + i] + coords[i]
        plane = int(np.prod(x.shape[2:]))
        base = (np.arange(x.shape[0])[:, None] * x.shape[1] + np.arange(x.shape[1])[None, :]) * plane
        index = index + base.reshape(base.shape + (1,) * n)
        return out, index.astype(np.int64)
    acc = np.float64
    xp = np.pad(x.astype(acc), widths)
    win = _windows_nd(xp, kernel, strides, dilations, out_shape[2:])
    axes = tuple(range(-n, 0))
    if mode == "lp":
        return np.power(np.sum(np.power(np.abs(win), attrs.p), axis=axes), 1.0 / attrs.p).astype(x.dtype)
    total = win.sum(axis=axes)
    inner = tuple(x.shape[2:])
    if attrs.count_include_pad:
        mask = np.pad(np.ones(tuple(inner[i] + pads[i] + pads[i + n] for i in range(n))),
                      tuple((0, extra[i]) for i in range(n)))
    else:
        mask = np.pad(np.ones(inner), tuple((pads[i], pads[i + n] + extra[i]) for i in range(n)))
    count = _windows_nd(mask[None, None], kernel, strides, dilations, out_shape[2:]).sum(axis=axes)[0, 0]
    return (total / np.maximum(count, 1)).astype(x.dtype)


def _pool_rel(types, attrs, consts=None):
    x = expect_tensor("nn.pool_nd", types[0], "data")
    shape = _pool_shape("nn.pool_nd", attrs, x.shape, TypeInferenceError)
    out = TensorType(shape, x.dtype)
    return TupleType((out, TensorType(shape, "int64"))) if attrs.return_indices else out


@sl.traceable
def _pool_logic(op, attrs, shapes, err):
    """The pooled shape (static spatial dims: a symbolic one gives ``Any``, which does not trace)."""
    shape = _pool_shape(op, attrs, tuple(shapes[0]), err)
    return [shape, shape] if attrs.return_indices else shape


def _pool_compute(attrs, inputs, out_type):
    """Windows over the trailing spatial dims of the data padded with the pool's neutral value (the
    lowest value for max, zeros for avg and lp), including the room a ceil-mode window needs past the end
    padding, so that the inner loop has no border test; avg divides by the counted taps."""
    x = inputs[0]
    n = len(attrs.kernel_shape)
    if x.ndim != n + 2:
        raise TypeInferenceError(f"nn.pool_nd: a {n}-d kernel needs data of rank {n + 2}, got rank {x.ndim}")
    spatial = x.shape[2:]
    strides, dilations, windows = _te_windows("nn.pool_nd", attrs, spatial, attrs.kernel_shape, attrs.ceil_mode,
                                              same_out=True)
    shape = tuple(x.shape[:2]) + tuple(size for _, _, size in windows)
    pads = []
    for (begin, end, size), d, k, s, dl in zip(windows, spatial, attrs.kernel_shape, strides, dilations, strict=True):
        needed = (size - 1) * s + (k - 1) * dl + 1 - (d + begin)  # past the data, for the last window
        pads.append((begin, te.maximum(needed, end) if attrs.ceil_mode else end))
    fill = te.min_value(x.dtype) if attrs.mode == "max" else 0
    padded = _padded(x, pads, "pool_nd_pad", fill)
    taps = [te.reduce_axis(k, f"k{i}") for i, k in enumerate(attrs.kernel_shape)]

    def at(b, c, out):
        return (b, c) + tuple(o * s + t.var * dl for o, t, s, dl in zip(out, taps, strides, dilations, strict=True))

    if attrs.mode == "max" and attrs.return_indices:
        def pair(b, c, *o):
            flat = b * x.shape[1] + c
            for d, o_i, t, s, dl, (begin, _) in zip(spatial, o, taps, strides, dilations, pads, strict=True):
                flat = flat * d + (o_i * s + t.var * dl - begin)
            return te.argmax(padded[at(b, c, o)], taps, index=flat)

        index, value = te.compute(shape, pair, "pool_nd_argmax")
        return [value, index]
    if attrs.mode == "max":
        return [te.compute(shape, lambda b, c, *o: te.max(padded[at(b, c, o)], taps), "max_pool_nd")]
    acc = "float64"
    if attrs.mode == "lp":
        p = te.const(float(attrs.p), acc)
        # padding counts as zeros, as in the kernel (0 ** 0 is 1)
        total = te.compute(shape, lambda b, c, *o: te.sum(te.power(te.abs(te.cast(padded[at(b, c, o)], acc)), p),
                                                          taps), "lp_pool_nd_sum")
        return [te.compute(shape, lambda *i: te.cast(te.power(total[i], te.const(1.0 / attrs.p, acc)), x.dtype),
                           "lp_pool_nd")]
    total = te.compute(shape, lambda b, c, *o: te.sum(te.cast(padded[at(b, c, o)], acc), taps), "avg_pool_nd_sum")
    # The divisor factors over the axes: per axis, the counted taps of each window position.
    counts = []
    for i, k in enumerate(attrs.kernel_shape):
        begin, end, size = windows[i]
        tap = te.reduce_axis(k, f"c{i}")

        def counted(o, i=i, begin=begin, end=end, tap=tap):
            pos = o * strides[i] + tap.var * dilations[i] - begin
            inside = pos < spatial[i] + end if attrs.count_include_pad else te.all_of(pos >= 0, pos < spatial[i])
            return te.sum(te.select(inside, te.const(1.0, acc), te.const(0.0, acc)), tap)

        counts.append(te.compute((size,), counted, f"avg_pool_nd_count{i}"))

    def average(b, c, *o):
        count = te.const(1.0, acc)
        for i, oi in enumerate(o):
            count = count * counts[i][oi]
        return te.cast(total[(b, c) + o] / te.maximum(count, te.const(1.0, acc)), x.dtype)

    return [te.compute(shape, average, "avg_pool_nd")]


define(
    "nn.pool_nd", 1, _pool_rel, _pool_kernel, OpPattern.OPAQUE,
    attrs=_WINDOW_ATTRS + (
        AttrDef("kernel_shape", REQUIRED, int_tuple(1, nonempty=True)),
        AttrDef("mode", "max", one_of("max", "avg", "lp")), AttrDef("ceil_mode", False, to_bool),
        AttrDef("count_include_pad", False, to_bool), AttrDef("p", 2, to_int),
        AttrDef("return_indices", False, to_bool),
    ),
    shape_logic=_pool_logic, compute=_pool_compute,
    doc="N-d max/average/Lp pooling with ONNX's attributes; with return_indices, max pooling also returns "
        "the flat (row-major, per tensor) int64 index of each maximum.",
)


# ---------------------------------------------------------------------------------------------------
# recurrent layers

_ACTIVATIONS = {
    "sigmoid": lambda x, a, b: 1 / (1 + np.exp(-x)),
    "tanh": lambda x, a, b: np.tanh(x),
    "relu": lambda x, a, b: np.maximum(x, 0),
    "affine": lambda x, a, b: a * x + b,
    "leakyrelu": lambda x, a, b: np.where(x >= 0, x, a * x),
    "thresholdedrelu": lambda x, a, b: np.where(x > a, x, 0),
    "scaledtanh": lambda x, a, b: a * np.tanh(b * x),
    "hardsigmoid": lambda x, a, b: np.clip(a * x + b, 0, 1),
    "elu": lambda x, a, b: np.where(x >= 0, x, a * (np.exp(x) - 1)),
    "softsign": lambda x, a, b: x / (1 + np.abs(x)),
    "softplus": lambda x, a, b: np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x))),  # (exp never overflows)
}
_ACT_DEFAULT_ALPHA = {"leakyrelu": 0.01, "thresholdedrelu": 1.0, "scaledtanh": 1.0, "hardsigmoid": 0.2,
                      "elu": 1.0, "affine": 1.0}
_ACT_DEFAULT_BETA = {"scaledtanh": 1.0, "hardsigmoid": 0.5, "affine": 0.0}


def activation_parameters(names, alphas, betas) -> list:
    """``(name, alpha, beta)`` of each of a recurrent layer's activation functions (known lower-case names).
    As ONNX specifies (and ONNX Runtime reads them), ``activation_alpha`` / ``activation_beta`` are consumed in
    order by the functions that take that parameter, not indexed by a function's position in the list; past
    the end of its list a function takes its default."""
    alphas, betas = iter(alphas), iter(betas)
    out = []
    for name in names:
        alpha = next(alphas, _ACT_DEFAULT_ALPHA[name]) if name in _ACT_DEFAULT_ALPHA else 1.0
        beta = next(betas, _ACT_DEFAULT_BETA[name]) if name in _ACT_DEFAULT_BETA else 0.0
        out.append((name, float(alpha), float(beta)))
    return out


def _activation_specs(attrs, per_direction: int, num_directions: int, err=ExecutionError) -> list:
    """(name, alpha, beta) of each gate function, direction after direction (one direction's list, its
    parameters included, serves both directions)."""
    names = [a.lower() for a in attrs.activations]
    if not names:
        names = {3: ["sigmoid", "tanh", "tanh"], 2: ["sigmoid", "tanh"], 1: ["tanh"]}[per_direction] * num_directions
    shared = len(names) == per_direction and num_directions == 2
    if not shared and len(names) != per_direction * num_directions:
        raise err(f"recurrent layer: {len(names)} activations for {num_directions} direction(s) of "
                  f"{per_direction} gate functions")
    for name in names:
        if name not in _ACTIVATIONS:
            raise err(f"recurrent layer: unknown activation {name!r}")
    specs = activation_parameters(names, attrs.activation_alpha, attrs.activation_beta)
    return specs * 2 if shared else specs


def _activations(attrs, per_direction: int, num_directions: int):
    out = [lambda x, fn=_ACTIVATIONS[name], a=a, b=b: fn(x, a, b)
           for name, a, b in _activation_specs(attrs, per_direction, num_directions)]
    return [out[d * per_direction:(d + 1) * per_direction] for d in range(num_directions)]


def _rnn_common(op, attrs, x, w, gates):
    if attrs.layout:
        x = np.swapaxes(x, 0, 1)
    seq, batch, _ = x.shape
    num_dir = w.shape[0]
    expected = 2 if attrs.direction == "bidirectional" else 1
    if num_dir != expected:
        raise ShapeError(f"{op}: W has {num_dir} directions but direction={attrs.direction!r}")
    return x, seq, batch, num_dir


def _seq_lens(sequence_lens, seq, batch):
    lens = np.asarray(sequence_lens)
    return np.full(batch, seq, np.int64) if lens.size == 0 else lens.astype(np.int64).reshape(batch)


def _clip(v, attrs):
    return np.clip(v, -attrs.clip, attrs.clip) if attrs.clip is not None else v


def _run_directions(op, attrs, x, w, per_dir, step, states0, lens):
    """Run ``step(d, x_t, states) -> new states`` forward/backward; returns Y and the final states."""
    seq, batch = x.shape[:2]
    num_dir = w.shape[0]
    hidden = attrs.hidden_size
    y = np.zeros((seq, num_dir, batch, hidden), dtype=np.float64)
    finals = []
    for d in range(num_dir):
        reverse = attrs.direction == "reverse" or d == 1
        states = [s[d].astype(np.float64) for s in states0]
        for t in range(seq):
            active = t < lens  # per batch entry: this step exists
            for_t = t
            if reverse:
                # each sequence is reversed within its own length
                for_t = None
            if reverse:
                index = np.where(active, lens - 1 - t, 0)
                x_t = x[index, np.arange(batch)]
            else:
                x_t = x[for_t]
            new = step(d, x_t.astype(np.float64), states)
            states = [np.where(active[:, None], n, s) for n, s in zip(new, states, strict=True)]
            h = np.where(active[:, None], states[0], 0.0)
            if reverse:
                y[index[active], d, np.arange(batch)[active]] = h[active]
            else:
                y[t, d] = h
        finals.append(states)
    return y, finals


def _lstm_kernel(attrs, x, w, r, b, sequence_lens, initial_h, initial_c, p):
    x, w, r = np.asarray(x), np.asarray(w, np.float64), np.asarray(r, np.float64)
    dtype = x.dtype
    x, seq, batch, num_dir = _rnn_common("nn.lstm", attrs, x, w, 4)
    hidden = attrs.hidden_size
    b = np.asarray(b, np.float64) if np.size(b) else np.zeros((num_dir, 8 * hidden))
    p = np.asarray(p, np.float64) if np.size(p) else np.zeros((num_dir, 3 * hidden))
    h0 = _initial(initial_h, attrs, num_dir, batch, hidden)
    c0 = _initial(initial_c, attrs, num_dir, batch, hidden)
    acts = _activations(attrs, 3, num_dir)
    lens = _seq_lens(sequence_lens, seq, batch)

    def step(d, x_t, states):
        h, c = states
        f_act, g_act, h_act = acts[d]
        gates = x_t @ w[d].T + h @ r[d].T + b[d, :4 * hidden] + b[d, 4 * hidden:]
        i, o, f, cc = np.split(gates, 4, axis=1)
        pi, po, pf = np.split(p[d], 3)
        i = f_act(_clip(i + pi * c, attrs))
        f = f_act(_clip(f + pf * c, attrs))
        if attrs.input_forget:
            f = 1 - i
        cc = g_act(_clip(cc, attrs))
        c_new = f * c + i * cc
        o = f_act(_clip(o + po * c_new, attrs))
        return [o * h_act(c_new), c_new]

    y, finals = _run_directions("nn.lstm", attrs, x, w, 4, step, [h0, c0], lens)
    y_h = np.stack([f[0] for f in finals])
    y_c = np.stack([f[1] for f in finals])
    return _rnn_outputs(attrs, dtype, y, y_h, y_c)


def _initial(value, attrs, num_dir, batch, hidden):
    value = np.asarray(value, np.float64)
    if value.size == 0:
        return np.zeros((num_dir, batch, hidden))
    return np.swapaxes(value, 0, 1) if attrs.layout else value


def _rnn_outputs(attrs, dtype, y, *finals):
    if attrs.layout:
        y = np.transpose(y, (2, 0, 1, 3))
        finals = tuple(np.swapaxes(f, 0, 1) for f in finals)
    return (y.astype(dtype),) + tuple(f.astype(dtype) for f in finals)


def _gru_kernel(attrs, x, w, r, b, sequence_lens, initial_h):
    x, w, r = np.asarray(x), np.asarray(w, np.float64), np.asarray(r, np.float64)
    dtype = x.dtype
    x, seq, batch, num_dir = _rnn_common("nn.gru", attrs, x, w, 3)
    hidden = attrs.hidden_size
    b = np.asarray(b, np.float64) if np.size(b) else np.zeros((num_dir, 6 * hidden))
    h0 = _initial(initial_h, attrs, num_dir, batch, hidden)
    acts = _activations(attrs, 2, num_dir)
    lens = _seq_lens(sequence_lens, seq, batch)

    def step(d, x_t, states):
        (h,) = states
        f_act, g_act = acts[d]
        wz, wr, wh = np.split(w[d], 3)
        rz, rr, rh = np.split(r[d], 3)
        wbz, wbr, wbh, rbz, rbr, rbh = np.split(b[d], 6)
        z = f_act(_clip(x_t @ wz.T + h @ rz.T + wbz + rbz, attrs))
        rg = f_act(_clip(x_t @ wr.T + h @ rr.T + wbr + rbr, attrs))
        if attrs.linear_before_reset:
            hh = g_act(_clip(x_t @ wh.T + rg * (h @ rh.T + rbh) + wbh, attrs))
        else:
            hh = g_act(_clip(x_t @ wh.T + (rg * h) @ rh.T + rbh + wbh, attrs))
        return [(1 - z) * hh + z * h]

    y, finals = _run_directions("nn.gru", attrs, x, w, 3, step, [h0], lens)
    return _rnn_outputs(attrs, dtype, y, np.stack([f[0] for f in finals]))


def _simple_rnn_kernel(attrs, x, w, r, b, sequence_lens, initial_h):
    x, w, r = np.asarray(x), np.asarray(w, np.float64), np.asarray(r, np.float64)
    dtype = x.dtype
    x, seq, batch, num_dir = _rnn_common("nn.rnn", attrs, x, w, 1)
    hidden = attrs.hidden_size
    b = np.asarray(b, np.float64) if np.size(b) else np.zeros((num_dir, 2 * hidden))
    h0 = _initial(initial_h, attrs, num_dir, batch, hidden)
    acts = _activations(attrs, 1, num_dir)
    lens = _seq_lens(sequence_lens, seq, batch)

    def step(d, x_t, states):
        (h,) = states
        return [acts[d][0](_clip(x_t @ w[d].T + h @ r[d].T + b[d, :hidden] + b[d, hidden:], attrs))]

    y, finals = _run_directions("nn.rnn", attrs, x, w, 1, step, [h0], lens)
    return _rnn_outputs(attrs, dtype, y, np.stack([f[0] for f in finals]))


def _rnn_shapes(op, attrs, x, w, num_states, r=None, err=TypeInferenceError):
    """The layer's output shapes (Y, then the final states). W's directions must match ``direction``, and
    W (and R when given) must be (directions, gates x hidden, input size) and (directions, gates x hidden,
    hidden): checks over any dims (``unify_dim``), so the logic traces into a C shape function."""
    if len(x) != 3 or len(w) != 3 or (r is not None and len(r) != 3):
        raise err(f"{op}: X, W and R must be 3-d, got {fmt_shape(x)}, {fmt_shape(w)} and {fmt_shape(r or ())}")
    if attrs.layout:
        batch, seq = x[0], x[1]
    else:
        seq, batch = x[0], x[1]
    gates, h = _KINDS[op][1], attrs.hidden_size
    d = unify_dim(op, w[0], 2 if attrs.direction == "bidirectional" else 1,
                  f"the number of directions of W and of direction={attrs.direction!r}", err)
    unify_dim(op, w[1], gates * h, "W's second dim and gates x hidden_size", err)
    unify_dim(op, w[2], x[2], "W's input size and X's", err)
    if r is not None:
        for got, want, what in zip(r, (d, gates * h, h), ("directions", "gates x hidden_size", "hidden_size")):
            unify_dim(op, got, want, f"R's {what}", err)
    y = (batch, seq, d, h) if attrs.layout else (seq, d, batch, h)
    state = (batch, d, h) if attrs.layout else (d, batch, h)
    return [y] + [state] * num_states


_KINDS = {"nn.lstm": (0, 4, 3), "nn.gru": (1, 3, 2), "nn.rnn": (2, 1, 1)}  # C kind code, gates, functions


def _double_bits(v: float) -> int:
    """A double as the int64 of its bits: the library call passes integers only (tv_rnn_double)."""
    return int(np.array(v, np.float64).view(np.int64))


def _rnn_arguments(name):
    """The call of ``tv_recurrent`` (codegen/lib/recurrent.c) for ``name``: the arrays (an omitted input is
    an empty one and is not read; GRU and RNN pass h0 for c0 and P, and Y_h for Y_c), the dims, flags,
    clip and activations. Entry checks make every array the size the call reads."""
    from ._library import dtype_code, product

    kind, gates, per = _KINDS[name]

    def arguments(attrs, inputs, outputs):
        x, w, r, b, lens, h0 = inputs[:6]
        c0, p = inputs[6:8] if kind == 0 else (h0, h0)
        y, y_h = outputs[:2]
        y_c = outputs[2] if kind == 0 else y_h
        if x.dtype not in _FLOATS:
            raise TypeInferenceError(f"{name}: X must be float16, float32 or float64, got {x.dtype}")
        for t, what in ((w, "W"), (r, "R"), (b, "B"), (h0, "initial_h"), (c0, "initial_c"), (p, "P")):
            if t.dtype != x.dtype:
                raise TypeInferenceError(f"{name}: {what} must have X's dtype {x.dtype}, got {t.dtype}")
        if not lens.dtype.startswith(("int", "uint")):
            raise TypeInferenceError(f"{name}: sequence_lens must be integers, got {lens.dtype}")
        num_dir = 2 if attrs.direction == "bidirectional" else 1
        hidden = attrs.hidden_size
        seq, batch = (x.shape[1], x.shape[0]) if attrs.layout else (x.shape[0], x.shape[1])
        size = x.shape[2]
        gh = gates * hidden
        requires = [(E.eq(w.shape[0], num_dir), f"{name}: W's first dim must be {num_dir}, the number of directions "
                                                f"of direction={attrs.direction!r}")]
        requires += [(E.eq(d, want), f"{name}: W must be ({num_dir}, {gh}, the input size)")
                     for d, want in zip(w.shape, (num_dir, gh, size), strict=True)]
        requires += [(E.eq(d, want), f"{name}: R must be ({num_dir}, {gh}, {hidden})")
                     for d, want in zip(r.shape, (num_dir, gh, hidden), strict=True)]
        flags = []
        for t, count, what in ((b, num_dir * 2 * gh, "B"), (lens, batch, "sequence_lens"),
                               (h0, num_dir * batch * hidden, "initial_h"), (c0, num_dir * batch * hidden, "initial_c"),
                               (p, num_dir * 3 * hidden, "P")):
            n = product(t.shape)
            requires.append((E.logical_or(E.eq(n, 0), E.eq(n, count)),
                             f"{name}: {what} must be empty (omitted) or have {_count_text(count)} elements"))
            flags.append(E.ne(n, 0))
        has_b, has_lens, has_h0, has_c0, has_p = flags
        if kind != 0:
            has_c0 = has_p = 0
        specs = _activation_specs(attrs, per, num_dir, AttrError)
        codes = tuple(list(_ACTIVATIONS).index(n) for n, _, _ in specs)
        return [kind, dtype_code(x.dtype), x, w, r, b, lens, dtype_code(lens.dtype), h0, c0, p, y, y_h, y_c,
                (seq, batch, size, hidden, num_dir),
                (attrs.direction == "reverse", attrs.layout, has_b, has_lens, has_h0, has_c0, has_p,
                 bool(getattr(attrs, "input_forget", False)), bool(getattr(attrs, "linear_before_reset", False)),
                 attrs.clip is not None),
                _double_bits(attrs.clip if attrs.clip is not None else 0.0), codes,
                tuple(_double_bits(a) for _, a, _ in specs), tuple(_double_bits(b) for _, _, b in specs)], requires

    return arguments


def _count_text(count) -> str:
    return str(count.value) if isinstance(count, Const) else "the layer's"


def _rnn_def(name, kernel, num_inputs, num_states, extra_attrs=()):
    def rel(types, attrs, consts=None):
        x = expect_tensor(name, types[0], "X")
        w = expect_tensor(name, types[1], "W")
        shapes = _rnn_shapes(name, attrs, x.shape, w.shape, num_states,
                             expect_tensor(name, types[2], "R").shape)
        return TupleType(tuple(TensorType(s, x.dtype) for s in shapes))

    def checked_kernel(attrs, x, w, r, *rest):
        _rnn_shapes(name, attrs, np.shape(x), np.shape(w), num_states, np.shape(r), ShapeError)
        return kernel(attrs, x, w, r, *rest)

    define(
        name, num_inputs, rel, checked_kernel, OpPattern.OPAQUE,
        attrs=(
            AttrDef("hidden_size", REQUIRED, to_int),
            AttrDef("direction", "forward", one_of("forward", "reverse", "bidirectional")),
            AttrDef("activations", (), lambda v: tuple(str(s) for s in v)),
            AttrDef("activation_alpha", (), lambda v: tuple(float(s) for s in v)),
            AttrDef("activation_beta", (), lambda v: tuple(float(s) for s in v)),
            AttrDef("clip", None, to_float), AttrDef("layout", 0, to_int),
        ) + tuple(extra_attrs),
        shape_logic=sl.traceable(lambda op, attrs, args, err: _rnn_shapes(op, attrs, args[0], args[1], num_states,
                                                                          args[2], err)),
        library=LibraryKernel("tv_recurrent", "recurrent.c", _rnn_arguments(name)),
        doc=f"ONNX {name[3:].upper()} layer: returns (Y, final states); empty tensors stand for omitted inputs. "
            "On target c a named C library call (codegen/lib/recurrent.c) runs the whole layer in double, like "
            "the NumPy kernel: the ONNX importer emits this op only when it cannot build the layer as an IR "
            "loop (W's number of directions unknown at import), so the op must cover every ONNX option and "
            "dtype by itself, which one hand-written function does without a Legalize that would rebuild "
            "the importer's loop from types known only later.",
    )


_rnn_def("nn.lstm", _lstm_kernel, 8, 2, (AttrDef("input_forget", False, to_bool),))
_rnn_def("nn.gru", _gru_kernel, 6, 1, (AttrDef("linear_before_reset", False, to_bool),))
_rnn_def("nn.rnn", _simple_rnn_kernel, 6, 1)


# ---------------------------------------------------------------------------------------------------
# nn.attention (ONNX Attention, opset 23/24), nn.rotary_embedding


def _softmax(x, axis=-1):
    peak = np.max(x, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0)
    e = np.exp(x - peak)
    total = e.sum(axis=axis, keepdims=True)
    return e / np.where(total == 0, 1, total)


def _attention_parts(attrs, q, k, v, mask, past_k, past_v, nonpad):
    """ONNX Attention on NumPy arrays: (Y, present_key, present_value, qk_matmul_output)."""
    dtype = q.dtype
    three_d = q.ndim == 3
    if three_d:
        if not attrs.q_num_heads or not attrs.kv_num_heads:
            raise ShapeError("nn.attention: 3-d inputs need q_num_heads and kv_num_heads")
        b, sq, _ = q.shape
        q = q.reshape(b, sq, attrs.q_num_heads, -1).transpose(0, 2, 1, 3)
        k = k.reshape(b, k.shape[1], attrs.kv_num_heads, -1).transpose(0, 2, 1, 3)
        v = v.reshape(b, v.shape[1], attrs.kv_num_heads, -1).transpose(0, 2, 1, 3)
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    if np.size(past_k):
        k = np.concatenate([np.asarray(past_k, np.float64), k], axis=2)
        v = np.concatenate([np.asarray(past_v, np.float64), v], axis=2)
    present_k, present_v = k, v
    hq, hk = q.shape[1], k.shape[1]
    if hq != hk:
        if hq % hk:
            raise ShapeError(f"nn.attention: {hq} query heads are not a multiple of {hk} key/value heads")
        k = np.repeat(k, hq // hk, axis=1)
        v = np.repeat(v, hq // hk, axis=1)
    scale = attrs.scale if attrs.scale is not None else 1 / math.sqrt(q.shape[-1])
    qk = (q * math.sqrt(scale)) @ (np.swapaxes(k, -1, -2) * math.sqrt(scale))
    if attrs.softcap > 0:  # before the mask, so that masked scores stay -inf
        qk = attrs.softcap * np.tanh(qk / attrs.softcap)
    sq, skv = qk.shape[-2], qk.shape[-1]
    bias = np.zeros((sq, skv), dtype=np.float64)
    if np.size(mask):
        mask = np.asarray(mask)
        m = np.where(mask, 0.0, -np.inf) if mask.dtype == np.bool_ else mask.astype(np.float64)
        if m.shape[-1] < skv:  # a mask shorter than the total sequence is padded with -inf
            pad = [(0, 0)] * (m.ndim - 1) + [(0, skv - m.shape[-1])]
            m = np.pad(m, pad, constant_values=-np.inf)
        bias = bias + m
    lens = np.asarray(nonpad).astype(np.int64).reshape(-1) if np.size(nonpad) else None
    # Where the query block starts among the keys: after the cache, or (external cache) at
    # nonpad_kv_seqlen - q_len per batch entry.
    if np.size(past_k):
        offset = np.full((1, 1, 1), np.asarray(past_k).shape[2])
    elif lens is not None:
        offset = (lens - sq).reshape(-1, 1, 1)
    else:
        offset = np.zeros((1, 1, 1), np.int64)
    diff = np.arange(sq)[None, :, None] + offset - np.arange(skv)[None, None, :]  # (B or 1, q, kv)
    allowed = np.ones(diff.shape, dtype=bool)
    if attrs.is_causal:
        allowed &= diff >= 0
    if attrs.left_window_size >= 0:
        allowed &= diff <= attrs.left_window_size
    if attrs.right_window_size >= 0:
        allowed &= -diff <= attrs.right_window_size
    if not allowed.all():
        bias = bias + np.where(allowed, 0.0, -np.inf)[:, None]  # (B or 1, 1, q, kv)
    if lens is not None:
        pad_mask = np.where(np.arange(skv)[None, :] < lens[:, None], 0.0, -np.inf)  # (B, Skv)
        bias = bias + pad_mask[:, None, None, :]
    scores = qk + bias
    # qk_matmul_output: 0 and 1 the (soft-capped) product, 2 with the mask bias added, 3 the probabilities
    # (the numbering of ONNX's reference implementation, whose outputs the conformance tests hold).
    qk_out = scores if attrs.qk_matmul_output_mode == 2 else qk
    probs = _softmax(scores)
    # A query row that may attend no key at all gives zeros.
    blocked = np.isneginf(np.max(np.broadcast_to(bias, scores.shape), axis=-1, keepdims=True))
    probs = np.where(blocked, 0.0, probs)
    if attrs.qk_matmul_output_mode == 3:
        qk_out = probs
    y = probs @ v
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(y.shape[0], y.shape[2], -1)
    return (y.astype(dtype), present_k.astype(dtype), present_v.astype(dtype), qk_out.astype(dtype))


def _known(d) -> bool:
    return sl.const_int(d) or sl.is_sym(d)


def _dims_equal(op, pairs, what, err):
    """Each ``(got, want)`` pair equal when both are known or one is symbolic (a typed unknown passes)."""
    for got, want in pairs:
        if _known(got) and _known(want):
            sl.require(got == want, f"{op}: {what}, got {got} and {want}", err)


def _heads_split(op, dim, heads, what, err):
    """``dim // heads`` for a dim that must be a multiple of ``heads`` (an unknown typed dim gives Any)."""
    if not _known(dim):
        return Any()
    sl.require(dim % heads == 0, f"{op}: {what} ({dim}) is not a multiple of its {heads} heads", err)
    return dim // heads


@sl.traceable
def _attention_logic(op, attrs, args, err):
    """(Y, present_key, present_value, qk_matmul_output): the heads (3-d inputs split their last dim
    into q_num_heads / kv_num_heads), the key/value cache in front of the keys. Checks what the shapes
    must agree on; the mask and nonpad_kv_seqlen are the kernel's (they change no output shape)."""
    q, k, v, past_k = (tuple(args[i]) for i in (0, 1, 2, 4))
    if len(q) not in (3, 4) or len(k) != len(q) or len(v) != len(q):
        raise err(f"{op}: Q, K and V must all be 3-d or all 4-d, got {fmt_shape(q)}, {fmt_shape(k)}, {fmt_shape(v)}")
    if len(q) == 3:
        hq, hk = attrs.q_num_heads, attrs.kv_num_heads
        if not hq or not hk:
            raise err(f"{op}: 3-d inputs need q_num_heads and kv_num_heads")
        b, sq, skv = q[0], q[1], k[1]
        head = _heads_split(op, q[2], hq, "Q's hidden size", err)
        k_head = _heads_split(op, k[2], hk, "K's hidden size", err)
        v_head = _heads_split(op, v[2], hk, "V's hidden size", err)
        _dims_equal(op, [(v[1], skv)], "K and V must have the same sequence length", err)
        y = (b, sq, mul_dims(v_head, hq))
    else:
        b, hq, sq, head = q
        hk, skv, k_head, v_head = k[1], k[2], k[3], v[3]
        _dims_equal(op, [(v[1], hk), (v[2], skv)], "K and V must have the same heads and sequence length", err)
        y = (b, hq, sq, v_head)
    if _known(hq) and _known(hk):
        sl.require(sl.dim_or(hq == hk, sl.dim_and(hk > 0, hq % sl.dim_max(hk, 1) == 0)),
                   f"{op}: {hq} query heads are not a multiple of {hk} key/value heads", err)
    _dims_equal(op, [(k[0], b), (v[0], b)], "Q, K and V must have the same batch", err)
    _dims_equal(op, [(k_head, head)], "Q's and K's head sizes must match", err)
    total = add_dims(past_k[2], skv) if len(past_k) == 4 else skv
    return [y, (b, hk, total, k_head), (b, hk, total, v_head), (b, hq, sq, total)]


def _attention_rel(types, attrs, consts=None):
    tensors = [expect_tensor("nn.attention", t, "argument") for t in types]
    shapes = _attention_logic("nn.attention", attrs, [t.shape for t in tensors], TypeInferenceError)
    return TupleType(tuple(TensorType(s, tensors[0].dtype) for s in shapes))


def _attention_kernel(attrs, q, k, v, mask, past_k, past_v, nonpad):
    _attention_logic("nn.attention", attrs, [np.shape(a) for a in (q, k, v, mask, past_k, past_v, nonpad)],
                     ShapeError)
    return _attention_parts(attrs, np.asarray(q), np.asarray(k), np.asarray(v), mask, past_k, past_v, nonpad)


def _attention_compute(attrs, inputs, out_type):
    """ONNX Attention as ``_attention_parts`` computes it, in float64: scaled (and soft-capped) scores,
    a bias from the mask, the causal/window rules and the key padding, a softmax whose fully blocked
    rows are zeros, and the weighted sum of the values; the key/value cache concatenated in front."""
    from ._compute import broadcast_read_dim

    q, k, v, mask, past_k, past_v, nonpad = inputs
    op, f64 = "nn.attention", "float64"
    dtype = q.dtype
    neg_inf = te.const(-math.inf, f64)
    requires = []
    if q.ndim == 3:
        hq, hk = attrs.q_num_heads, attrs.kv_num_heads
        if not hq or not hk:
            raise TypeInferenceError(f"{op}: 3-d inputs need q_num_heads and kv_num_heads")
        batch, sq, skv = q.shape[0], q.shape[1], k.shape[1]
        dq, dk, dv = te.floordiv(q.shape[2], hq), te.floordiv(k.shape[2], hk), te.floordiv(v.shape[2], hk)
        hq, hk = te.const(hq), te.const(hk)
        for t, heads, what in ((q, hq, "Q"), (k, hk, "K"), (v, hk, "V")):
            requires.append((te.eq(te.floormod(t.shape[2], heads), 0),
                             f"{op}: the hidden size of {what} must be a multiple of its number of heads"))

        def head_reader(t, size):
            return lambda b, h, s, d: t[b, s, h * size + d]

        q4, k4, v4 = head_reader(q, dq), head_reader(k, dk), head_reader(v, dv)
    elif q.ndim == 4:
        batch, hq, sq, dq = q.shape
        hk, skv, dk, dv = k.shape[1], k.shape[2], k.shape[3], v.shape[3]

        def q4(b, h, s, d):
            return q[b, h, s, d]

        def k4(b, h, s, d):
            return k[b, h, s, d]

        def v4(b, h, s, d):
            return v[b, h, s, d]
    else:
        raise TypeInferenceError(f"{op}: Q, K and V must all be 3-d or all 4-d, got rank {q.ndim}")
    requires += [(te.eq(te.floormod(hq, hk), 0), f"{op}: the query heads must be a multiple of the key/value heads"),
                 (te.eq(dq, dk), f"{op}: the query and key head sizes must match")]
    group = te.floordiv(hq, hk)
    with_past = not _omitted(past_k)
    past = past_k.shape[2] if with_past else te.const(0)
    total = past + skv
    requires.append((total > 0, f"{op}: no keys to attend to (total sequence length 0)"))

    def cached(t_past, read):
        def at(b, h, s, d):
            if not with_past:
                return te.cast(read(b, h, s, d), f64)
            return te.select(s < past, te.cast(t_past[b, h, s, d], f64), te.cast(read(b, h, s - past, d), f64))

        return at

    key, value = cached(past_k, k4), cached(past_v, v4)
    present_k = te.compute((batch, hk, total, dk), lambda b, h, s, d: te.cast(key(b, h, s, d), dtype), "present_key")
    present_v = te.compute((batch, hk, total, dv), lambda b, h, s, d: te.cast(value(b, h, s, d), dtype),
                           "present_value")

    if attrs.scale is not None:  # q and k are each scaled by sqrt(scale), as in the kernel
        root = te.const(math.sqrt(attrs.scale), f64)
    elif isinstance(dq, te.Const):
        root = te.const(math.sqrt(1 / math.sqrt(dq.value)), f64)
    else:
        root = te.sqrt(te.const(1.0, f64) / te.sqrt(te.cast(dq, f64)))
    r = te.reduce_axis(dq, "d")
    qk = te.compute((batch, hq, sq, total), lambda b, h, i, j: te.sum(
        te.cast(q4(b, h, i, r.var), f64) * root * (key(b, te.floordiv(h, group), j, r.var) * root), r), "attention_qk")
    if attrs.softcap > 0:  # before the mask, so that masked scores stay -inf
        cap = te.const(attrs.softcap, f64)
        qk_raw = qk
        qk = te.compute(qk_raw.shape, lambda *i: cap * te.tanh(qk_raw[i] / cap), "attention_softcap")

    with_nonpad = not _omitted(nonpad)
    lengths = (lambda b: te.cast(nonpad[broadcast_read_dim(nonpad.shape[0], b, batch)], "int64")) \
        if with_nonpad else None
    if with_nonpad and nonpad.ndim != 1:
        raise TypeInferenceError(f"{op}: nonpad_kv_seqlen must be 1-d, got rank {nonpad.ndim}")
    with_mask = not _omitted(mask)
    if with_mask:
        if mask.ndim > 4:
            raise TypeInferenceError(f"{op}: the mask has rank {mask.ndim} (at most 4)")
        requires.append((mask.shape[-1] <= total, f"{op}: the mask is longer than the total sequence"))
        full = (batch, hq, sq, total)
        for axis in range(mask.ndim - 1):
            d, target = mask.shape[axis], full[4 - mask.ndim + axis]
            requires.append((te.logical_or(te.eq(d, 1), te.eq(d, target)),
                             f"{op}: mask dim {axis} does not broadcast to the scores"))

    def bias(b, h, i, j):
        terms = []
        if with_mask:
            full = (b, h, i, j)
            index = tuple(broadcast_read_dim(mask.shape[a], full[4 - mask.ndim + a], (batch, hq, sq, total)[4 - mask.ndim + a])
                          for a in range(mask.ndim - 1)) + (j,)
            m = mask[index]
            m = te.select(m, te.const(0.0, f64), neg_inf) if mask.dtype == "bool" else te.cast(m, f64)
            terms.append(te.select(j < mask.shape[-1], m, neg_inf))  # a short mask is padded with -inf
        if with_past:
            offset = te.select(past > 0, past, lengths(b) - sq) if with_nonpad else past
        else:
            offset = lengths(b) - sq if with_nonpad else te.const(0)
        diff = i + offset - j
        rules = ([diff >= 0] if attrs.is_causal else []) + \
            ([diff <= attrs.left_window_size] if attrs.left_window_size >= 0 else []) + \
            ([-diff <= attrs.right_window_size] if attrs.right_window_size >= 0 else [])
        if rules:
            terms.append(te.select(te.all_of(*rules), te.const(0.0, f64), neg_inf))
        if with_nonpad:
            terms.append(te.select(j < lengths(b), te.const(0.0, f64), neg_inf))
        result = te.const(0.0, f64)
        for term in terms:
            result = result + term
        return result

    scores = te.compute(qk.shape, lambda b, h, i, j: qk[b, h, i, j] + bias(b, h, i, j), "attention_scores")
    rows = (batch, hq, sq)
    j1, j2, j3 = (te.reduce_axis(total, name) for name in ("j", "jb", "js"))
    peak = te.compute(rows, lambda b, h, i: te.max(scores[b, h, i, j1.var], j1), "attention_peak")
    blocked = te.compute(rows, lambda b, h, i: te.max(bias(b, h, i, j2.var), j2), "attention_blocked")
    shift = te.compute(rows, lambda *i: te.select(te.isfinite(peak[i]), peak[i], te.const(0.0, f64)),
                       "attention_shift")
    exps = te.compute(qk.shape, lambda b, h, i, j: te.exp(scores[b, h, i, j] - shift[b, h, i]), "attention_exp")
    sums = te.compute(rows, lambda b, h, i: te.sum(exps[b, h, i, j3.var], j3), "attention_sum")

    def probability(b, h, i, j):
        denominator = te.select(te.eq(sums[b, h, i], 0.0), te.const(1.0, f64), sums[b, h, i])
        return te.select(te.eq(blocked[b, h, i], neg_inf), te.const(0.0, f64), exps[b, h, i, j] / denominator)

    probs = te.compute(qk.shape, probability, "attention_probs")
    t = te.reduce_axis(total, "t")
    y = te.compute((batch, hq, sq, dv), lambda b, h, i, d: te.sum(
        probs[b, h, i, t.var] * value(b, te.floordiv(h, group), t.var, d), t), "attention_y")
    if q.ndim == 3:
        out = te.compute((batch, sq, hq * dv), lambda b, i, hd: te.cast(
            y[b, te.floordiv(hd, dv), i, te.floormod(hd, dv)], dtype), "attention_out", requires)
    else:
        out = te.compute(y.shape, lambda *i: te.cast(y[i], dtype), "attention_out", requires)
    chosen = {2: scores, 3: probs}.get(attrs.qk_matmul_output_mode, qk)
    qk_out = te.compute(qk.shape, lambda *i: te.cast(chosen[i], dtype), "attention_qk_out")
    return [out, present_k, present_v, qk_out]


define(
    "nn.attention", 7, _attention_rel, _attention_kernel, OpPattern.OPAQUE,
    attrs=(
        AttrDef("is_causal", False, to_bool), AttrDef("kv_num_heads", 0, to_int), AttrDef("q_num_heads", 0, to_int),
        AttrDef("qk_matmul_output_mode", 0, to_int), AttrDef("scale", None, to_float),
        AttrDef("softcap", 0.0, to_float), AttrDef("softmax_precision", 0, to_int),
        AttrDef("left_window_size", -1, to_int), AttrDef("right_window_size", -1, to_int),
    ),
    shape_logic=_attention_logic,
    doc="ONNX Attention(Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen) -> (Y, present_key, "
        "present_value, qk_matmul_output); empty tensors stand for omitted inputs.",
    compute=_attention_compute,
)


def _rotary_kernel(attrs, x, cos_cache, sin_cache, position_ids):
    x = np.asarray(x)
    dtype = x.dtype
    four_d = x.ndim == 4
    if four_d:
        xs = np.transpose(x, (0, 2, 1, 3)).astype(np.float64)  # (B, S, H, D)
    else:
        if not attrs.num_heads:
            raise ShapeError("nn.rotary_embedding: a 3-d input needs num_heads")
        b, s, hidden = x.shape
        xs = x.reshape(b, s, attrs.num_heads, hidden // attrs.num_heads).astype(np.float64)
    head = xs.shape[-1]
    rot = attrs.rotary_embedding_dim or head
    cos_c, sin_c = np.asarray(cos_cache, np.float64), np.asarray(sin_cache, np.float64)
    if np.size(position_ids):
        pos = np.asarray(position_ids).astype(np.int64)
        cos_c, sin_c = cos_c[pos], sin_c[pos]  # (B, S, rot/2)
    cos_c, sin_c = cos_c[..., None, :rot // 2], sin_c[..., None, :rot // 2]
    part, rest = xs[..., :rot], xs[..., rot:]
    if attrs.interleaved:
        x1, x2 = part[..., 0::2], part[..., 1::2]
    else:
        x1, x2 = part[..., :rot // 2], part[..., rot // 2:]
    r1 = x1 * cos_c - x2 * sin_c
    r2 = x2 * cos_c + x1 * sin_c
    if attrs.interleaved:
        rotated = np.stack([r1, r2], axis=-1).reshape(part.shape)
    else:
        rotated = np.concatenate([r1, r2], axis=-1)
    out = np.concatenate([rotated, rest], axis=-1)
    out = np.transpose(out, (0, 2, 1, 3)) if four_d else out.reshape(x.shape)
    return out.astype(dtype)


def _omitted(t) -> bool:
    """Whether an optional input is omitted: the importer passes a 1-d tensor of static length 0."""
    return t.ndim == 1 and isinstance(t.shape[0], te.Const) and t.shape[0].value == 0


def _rotary_compute(attrs, inputs, out_type):
    """Each element of the first ``rotary_embedding_dim`` of a head rotated with its partner (the other
    half, or the neighbour when interleaved) by the cached angle of its position, in float64."""
    from ._compute import broadcast_read_dim

    x, cos_cache, sin_cache, positions = inputs
    op = "nn.rotary_embedding"
    requires = []
    if x.ndim == 4:
        batch, seq, head = x.shape[0], x.shape[2], x.shape[3]
    elif x.ndim == 3:
        if not attrs.num_heads:
            raise TypeInferenceError(f"{op}: a 3-d input needs num_heads")
        batch, seq = x.shape[0], x.shape[1]
        head = te.floordiv(x.shape[2], attrs.num_heads)
        requires.append((te.eq(te.floormod(x.shape[2], attrs.num_heads), 0),
                         f"{op}: the hidden size must be a multiple of num_heads ({attrs.num_heads})"))
    else:
        raise TypeInferenceError(f"{op}: the input must be 3-d or 4-d, got rank {x.ndim}")
    rot = te.const(attrs.rotary_embedding_dim) if attrs.rotary_embedding_dim else head
    half = te.floordiv(rot, 2)
    requires += [(te.eq(te.floormod(rot, 2), 0), f"{op}: the rotary dim must be even"),
                 (rot <= head, f"{op}: the rotary dim exceeds the head size")]
    with_positions = not _omitted(positions)
    expected = 3 if not with_positions else 2
    for cache in (cos_cache, sin_cache):
        if cache.ndim != expected:
            raise TypeInferenceError(f"{op}: the caches must be {expected}-d {'with' if with_positions else 'without'}"
                                     f" position_ids, got rank {cache.ndim}")
        requires.append((cache.shape[-1] >= half, f"{op}: the caches hold fewer than rotary_dim / 2 angles"))
    if with_positions and positions.ndim not in (1, 2):
        raise TypeInferenceError(f"{op}: position_ids must be 1-d or 2-d, got rank {positions.ndim}")

    def angle(cache, b, s, j):
        if not with_positions:
            return cache[broadcast_read_dim(cache.shape[0], b, batch), broadcast_read_dim(cache.shape[1], s, seq), j]
        at = (broadcast_read_dim(positions.shape[-1], s, seq),)
        if positions.ndim == 2:
            at = (broadcast_read_dim(positions.shape[0], b, batch),) + at
        return cache[te.index_check(positions[at], cache.shape[0]), j]

    def rotated(read, b, s, d):
        """Element d of the head at (b, s), where ``read(k)`` reads element k of that head."""
        if attrs.interleaved:
            j, second = te.floordiv(d, 2), te.eq(te.floormod(d, 2), 1)
            x1, x2 = read(2 * j), read(2 * j + 1)
        else:
            second = d >= half
            j = te.select(second, d - half, d)
            x1, x2 = read(j), read(j + half)
        c, s_ = (te.cast(angle(cache, b, s, j), "float64") for cache in (cos_cache, sin_cache))
        value = te.select(second, x2 * c + x1 * s_, x1 * c - x2 * s_)
        return te.cast(te.select(d < rot, value, read(d)), x.dtype)

    if x.ndim == 4:
        def f(b, h, s, d):
            return rotated(lambda k: te.cast(x[b, h, s, k], "float64"), b, s, d)
    else:
        def f(b, s, hd):
            h, d = te.floordiv(hd, head), te.floormod(hd, head)
            return rotated(lambda k: te.cast(x[b, s, h * head + k], "float64"), b, s, d)

    return [te.compute(x.shape, f, "rotary_embedding", requires)]


define(
    "nn.rotary_embedding", 4,
    lambda types, attrs, consts=None: expect_tensor("nn.rotary_embedding", types[0], "input"),
    _rotary_kernel, OpPattern.OPAQUE,
    attrs=(AttrDef("interleaved", False, to_bool), AttrDef("num_heads", 0, to_int),
           AttrDef("rotary_embedding_dim", 0, to_int)),
    shape_logic=sl.traceable(lambda op, attrs, shapes, err: tuple(shapes[0])), compute=_rotary_compute,
    doc="ONNX RotaryEmbedding(input, cos_cache, sin_cache, position_ids); an empty position_ids means the "
        "caches are already (batch, seq, dim/2).",
)
