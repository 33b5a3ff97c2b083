"""PackWeights: matrix products with a constant float32 weight read it pre-packed (``nn.dense_packed``).

Requires: nothing (types are kept where known). Primitive functions are left alone. Meant for target
"c" only, before ``FuseOps`` (the packed op fuses with its epilogue like ``nn.dense``): its C kernel,
``tv_gemm_packed_f32``, is measured at least as fast as BLAS called from C from 1 to 256 rows at BERT
and MLP sizes (1.2-1.45x at 16 rows, where BLAS spends its time re-packing the weight on every call).

After it, no ``nn.dense(x, W)`` and no ``nn.matmul(x, W)`` with ``transpose_a`` false remains whose
weight ``W`` is a 2-D float32 ``Constant`` with at least one unit and whose output dtype is float32:
each became ``nn.dense_packed(x, P, units=N)`` with the same type and ``out_dtype``, where ``P`` is
``pack_dense_weight`` of the (N, K) weight (W for dense and for matmul with ``transpose_b``, W^T
for a plain matmul). ``P`` replaces the constant: a weight used only by products is not kept twice,
and a weight shared by several products is packed once.
"""

from __future__ import annotations

import numpy as np

from ..errors import TensorVMError
from ..ir.attrs import Attrs
from ..ir.expr import Call, Constant, Function, Op
from ..op.nn import pack_dense_weight
from ..op.registry import get_op
from .pass_infra import BodyRewritePass
from .to_anf import TypedMutator, copy_type

__all__ = ["PackWeights"]

_PACKED_OP = Op("nn.dense_packed")


class _Packer(TypedMutator):
    def __init__(self):
        super().__init__()
        self.packed = {}  # id(weight Constant) -> (Constant of the panels, the weight itself)

    def visit_function(self, fn: Function):
        return fn if fn.is_primitive else super().visit_function(fn)

    def _packed_constant(self, weight: Constant, transposed: bool) -> Constant:
        key = (id(weight), transposed)
        entry = self.packed.get(key)
        if entry is None:
            data = weight.data.T if transposed else weight.data
            entry = self.packed[key] = (Constant(pack_dense_weight(data), span=weight.span), weight)
        return entry[0]

    def visit_call(self, call: Call):
        new = super().visit_call(call)
        if not isinstance(new.op, Op) or new.op.name not in ("nn.dense", "nn.matmul") or len(new.args) != 2:
            return new
        data, weight = new.args
        if not isinstance(weight, Constant) or weight.data.ndim != 2 or weight.data.dtype != np.float32:
            return new
        try:
            attrs = get_op(new.op.name).normalize_attrs(new.attrs)
        except TensorVMError:  # type inference reports bad attributes on the original call
            return new
        if attrs.out_dtype not in ("", "float32"):
            return new
        if new.op.name == "nn.dense":
            transposed = False
        else:
            if attrs.transpose_a:
                return new
            transposed = not attrs.transpose_b
        units = weight.data.shape[1] if transposed else weight.data.shape[0]
        if units < 1 or (attrs.units is not None and attrs.units != units):
            return new  # (a units conflict: type inference reports it on the original call)
        packed_attrs = {"units": int(units)}
        if attrs.out_dtype:
            packed_attrs["out_dtype"] = attrs.out_dtype
        packed = self._packed_constant(weight, transposed)
        return copy_type(Call(_PACKED_OP, (data, packed), Attrs(**packed_attrs), span=new.span), call)


class PackWeights(BodyRewritePass):
    name = "PackWeights"
    rewriter = _Packer
