"""Tensor-expression computes of the operators, attached to the registry on import.

Each op has one function, named after it (``nn.dense`` -> ``nn_dense``; a trailing underscore where the
name is a Python builtin or a te helper: ``sum_``, ``cast_``), with the signature
``compute(attrs, inputs, out_type) -> list[Tensor]``: ``attrs`` are the op's normalized attributes,
``inputs`` its arguments as te tensors (a tuple-typed argument is a tuple of tensors) and ``out_type``
the call's inferred type (for the output dtype). The result lists one tensor per output (tuple
outputs flattened). Semantics follow each op's NumPy kernel, including its dtype rules (accumulation
in float32 for float16, integer wrap-around) and its run-time checks, expressed as ``requires``.

Shapes are te expressions over the input dims, so one compute serves static and dynamic shapes; where
a dim is only known at run time, broadcasting reads index ``select(dim == 1, 0, i)`` and the compute
requires the dims to be compatible.
"""

from __future__ import annotations

from ..errors import TypeInferenceError
from ..op._compute import (
    broadcast_read,
    broadcast_read_dim,
    broadcast_shape,
    unary_compute,
)
from ..op._compute import (
    matmul_value as _matmul_value,
)
from ..op._compute import (
    output_dtype as _out_dtype,
)
from ..op._compute import (
    require_equal as _require_equal,
)
from ..op._compute import (  # noqa: F401 - moving to the op files
    same as _same,
)
from ..op.registry import get_op, is_registered
from .expr import INDEX_DTYPE, cast, const, eq, select
from .tensor import compute, reduce_axis
from .tensor import sum as te_sum

__all__ = ["COMPUTES", "broadcast_shape", "broadcast_read"]

COMPUTES: dict = {}


def _register(name: str):
    def decorate(fn):
        COMPUTES[name] = fn
        return fn

    return decorate


# ---- shape helpers --------------------------------------------------------------------------------


def _elementwise(name: str, fn):
    return _register(name)(unary_compute(name, fn))


# ---- elementwise ----------------------------------------------------------------------------------


# ---- creation -------------------------------------------------------------------------------------


# ---- reductions -----------------------------------------------------------------------------------


# ---- data movement --------------------------------------------------------------------------------


# ---- nn: matrix products ----------------------------------------------------------------------------


@_register("onnx.matmul")
def onnx_matmul(attrs, inputs, out_type):
    """NumPy's matmul: 1-d operands get a unit dim (dropped from the result), batch dims broadcast."""
    a, b = inputs
    dtype = _out_dtype(out_type)
    a_shape = (const(1),) + tuple(a.shape) if a.ndim == 1 else tuple(a.shape)
    b_shape = tuple(b.shape) + (const(1),) if b.ndim == 1 else tuple(b.shape)
    batch, requires = broadcast_shape("onnx.matmul", a_shape[:-2], b_shape[:-2])
    requires += _require_equal("onnx.matmul", a_shape[-1], b_shape[-2], "the inner dims")
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
        return te_sum(_matmul_value(av, bv, k, dtype), k)

    return [compute(shape, f, "matmul", requires)]


@_register("trilu")
def trilu(attrs, inputs, out_type):
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


# ---- nn: per-channel and normalization -------------------------------------------------------------


# ---- nn: convolution, pooling, padding ------------------------------------------------------------


# ---- registration ---------------------------------------------------------------------------------


def _attach():
    for name, fn in COMPUTES.items():
        if is_registered(name):
            get_op(name).compute = fn


_attach()
