"""PackWeights: matrix products and long-reduction convolutions with a constant float32 weight read it
pre-packed (``nn.dense_packed``, ``nn.conv2d_packed``).

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

Likewise no ``nn.conv2d(x, W)`` remains with NCHW data, an OIHW float32 ``Constant`` weight, no groups, a
float32 result and a reduction C x KH x KW longer than the direct kernel takes
(``strategy.direct_max_reduction``: ResNet's 3x3 layers, MobileNet's 576-channel 1x1 layers) whose output
has at least a tile of pixels when the kernel is 1x1, or a 1x1 one of a short reduction whose image fills the
pointwise kernel's tiles badly or is a single pixel (1x1 images: one product over the batch, the packed
weight being a product's), or a k x k one of a short reduction whose output rows are narrower than two of
the direct kernel's vectors, whose channels fill whole blocks and that no 2x2 max pool follows
(``_takes_packed``): each became
``nn.conv2d_packed(x, pack_conv_weight(W), ...)`` with the same type, run by the packed convolution
kernel (``tv_vconv.h``; 1.1-1.4x faster than im2col + BLAS on ResNet-18's layers). Other shorter reductions
stay the direct kernel or, 1x1, the pointwise kernel over the image itself (``tv_vpointwise.h``).
"""

from __future__ import annotations

import numpy as np

from ..errors import TensorVMError
from ..ir.attrs import Attrs
from ..ir.expr import Call, Constant, Function, Let, Op, Var, is_op_call
from ..op.nn import CONV_BLOCK, halves_nchw_map, pack_conv_weight, pack_dense_weight
from ..op.registry import get_op
from .pass_infra import BodyRewritePass
from .to_anf import TypedMutator, copy_type, post_order_iter

__all__ = ["PackWeights"]

_PACKED_OP = Op("nn.dense_packed")
_PACKED_CONV_OP = Op("nn.conv2d_packed")


class _Packer(TypedMutator):
    def __init__(self):
        super().__init__()
        self.packed = {}  # id(weight Constant) -> (Constant of the panels, the weight itself)
        self.pooled = None  # ids of the body's convolutions whose result a 2x2 max pool reads

    def visit(self, expr):
        if self.pooled is None:  # (the first visit is the body's root)
            self.pooled = _pooled_convolutions(expr)
        return super().visit(expr)

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
        if is_op_call(new, "nn.conv2d") and len(new.args) == 2:
            return self._packed_conv(new, call)
        if not is_op_call(new, "nn.dense", "nn.matmul") or len(new.args) != 2:
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


    def _packed_conv(self, new: Call, call: Call):
        data, weight = new.args
        if not isinstance(weight, Constant) or weight.data.ndim != 4 or weight.data.dtype != np.float32:
            return new
        try:
            attrs = get_op("nn.conv2d").normalize_attrs(new.attrs)
        except TensorVMError:
            return new
        o, c, kh, kw = weight.data.shape
        if attrs.groups != 1 or attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW" \
                or (attrs.out_layout or "NCHW") != "NCHW" or attrs.out_dtype not in ("", "float32") \
                or not _takes_packed(call, attrs, kh, kw, c * kh * kw, id(call) in self.pooled) or min(o, c) < 1 \
                or (attrs.channels is not None and attrs.channels != o) \
                or (attrs.kernel_size is not None and tuple(attrs.kernel_size) != (kh, kw)):
            return new
        key = (id(weight), "conv")
        entry = self.packed.get(key)
        if entry is None:
            entry = self.packed[key] = (Constant(pack_conv_weight(weight.data), span=weight.span), weight)
        packed_attrs = {"channels": int(o), "in_channels": int(c), "kernel_size": (int(kh), int(kw)),
                        "strides": tuple(attrs.strides), "padding": tuple(attrs.padding),
                        "dilation": tuple(attrs.dilation)}
        if attrs.out_dtype:
            packed_attrs["out_dtype"] = attrs.out_dtype
        return copy_type(Call(_PACKED_CONV_OP, (data, entry[0]), Attrs(**packed_attrs), span=new.span), call)


def _pooled_convolutions(root) -> set:
    """ids of the ``nn.conv2d`` calls under ``root`` whose result a 2x2 stride-2 max pool reads, through a
    bias and a relu (the pool the direct kernel applies in its tiles: ``strategy.tile_epilogue``), let-bound
    or nested."""
    nodes = post_order_iter(root)
    bound = {id(n.var): n.value for n in nodes if isinstance(n, Let)}
    pooled = set()
    for node in nodes:
        if not is_op_call(node, "nn.max_pool2d") or not node.args \
                or not halves_nchw_map(get_op("nn.max_pool2d").normalize_attrs(node.attrs)):
            continue
        expr = node.args[0]
        for _ in range(4):  # (pool, relu, bias: at most a few steps)
            while isinstance(expr, Var) and id(expr) in bound:
                expr = bound[id(expr)]
            if is_op_call(expr, "nn.conv2d"):
                pooled.add(id(expr))
                break
            if not is_op_call(expr, "nn.relu", "nn.bias_add", "add") or not expr.args:
                break
            # (an add's bias may come first: ONNX's Conv imports as add(conv, B), a user may write add(B, conv))
            expr = expr.args[1] if is_op_call(expr, "add") and isinstance(expr.args[0], Constant) else expr.args[0]
    return pooled


def _takes_packed(call, attrs, kh: int, kw: int, reduction: int, pooled: bool = False) -> bool:
    """Whether the packed convolution computes ``call`` (its output's image size read from its type), by
    this rule: a reduction longer than the direct kernel takes (``direct_max_reduction``), or a 1x1 one
    with unit strides and no padding whose pixels leave more than an eighth of the pointwise kernel's
    columns empty (``tv_vpointwise.h``: tiles of ``nr``
    pixels; 49 pixels fill 49 of 64 columns, 196 fill 196 of 208: measured with MobileNetV3's layers
    side by side, the packed kernel (tiles of pixels x channels) was 1.2x faster at 7 x 7, the
    pointwise one 1.1-1.4x faster at 14 x 14 and above), or a k x k one with narrow output rows
    (``_narrow_rows_packed``), or a strided or padded 1x1 one (which the pointwise kernel does not take)
    whose channels fill whole blocks: ResNet's downsampling layers, 64 -> 128 at 56 x 56 stride 2 208 us
    direct against 155 packed at 1 thread, 220 against 114 at 2 (the direct kernel's phase-split copy
    did not split over threads), 128 -> 256 at 28 x 28 190 against 128, 32 -> 64 at 112 x 112 level,
    16 -> 32 at 56 x 56 26 against 16 (Zen 4, the kernels called from C). For a 1x1 kernel, an output
    of at least a tile of pixels (``mr``), or
    squeeze-excitation's 1x1 images unpadded: the packed kernel runs them as one product of the batch's rows
    over the packed weight (MobileNetV3-small's 144 -> 576 at batch 3: 8.5 against 15.6 us with a BLAS GEMV
    per image on a Zen 5 EPYC), smaller images with fewer pixels than a tile stay the pointwise kernel."""
    from ..codegen.host import gemm_params
    from ..codegen.strategy import direct_max_reduction, direct_takes

    channels = reduction // (kh * kw)
    if (kh, kw) != (1, 1) and not direct_takes(channels, kh, kw):  # (channels padded to blocks: see there)
        return True
    shape = getattr(getattr(call, "checked_type", None), "shape", None)
    if shape is None or len(shape) != 4:
        return False
    oh, ow = (d.value if hasattr(d, "value") else d for d in shape[2:])
    static = isinstance(oh, int) and isinstance(ow, int)
    if (kh, kw) != (1, 1):
        return static and _narrow_rows_packed(oh, ow, channels, pooled)
    if not static:
        return reduction > direct_max_reduction()
    pixels = oh * ow
    params = gemm_params()
    if pixels == 1 and _one_pixel_images(call) and not any(attrs.padding):
        return True  # (the packed kernel's product over the batch: tv_pconv_one_pixel)
    if pixels < params.mr:
        return False
    if reduction > direct_max_reduction():
        return True
    if tuple(attrs.strides) != (1, 1) or any(attrs.padding):  # (the pointwise kernel does not take it)
        return channels % CONV_BLOCK == 0
    return 8 * (-(-pixels // params.nr) * params.nr - pixels) > pixels


def _one_pixel_images(call) -> bool:
    """Whether the convolution's input images are static 1 x 1 (squeeze-and-excitation: its image rows are
    then the batch's rows of channels, a product's rows)."""
    shape = getattr(getattr(call.args[0], "checked_type", None), "shape", None)
    return shape is not None and len(shape) == 4 and all(getattr(d, "value", d) == 1 for d in shape[2:])


def _narrow_rows_packed(oh: int, ow: int, channels: int, pooled: bool) -> bool:
    """A k x k convolution the direct kernel could take (an output of ``oh`` x ``ow``) still runs packed
    when its output rows are narrower than two of the direct kernel's vectors (``lanes``: the direct tile
    is one vector of a row's columns,
    and a short row wastes lanes or pays a tile's setup per few pixels), its image has at least a packed
    tile of pixels, its input channels fill whole blocks (no padded channels) and no 2x2 max pool follows
    it (which the direct kernel applies in its tiles, the packed one in a kernel of its own). Measured
    side by side with 8 lanes, packed / direct at 1 (and 2) threads: rows of one vector or less, 32 -> 64
    channels at 8 x 8 0.80 (0.84), 32 -> 32 at 8 x 8 0.80 (0.74), 16 -> 64 at 8 x 8 0.81, 32 -> 64 at 4 x 4
    0.36, at 12 x 12 0.74; but with a pool after it at 8 x 8 1.30 (1.32), 20 input channels at 8 x 8 1.05
    and at 16 x 16 1.27; rows of two vectors (16 x 16) 0.91-0.94 without a pool, 1.14 with one; four
    (32 x 32) 1.04-1.11: the rule stops below two vectors."""
    from ..codegen.host import gemm_params

    if pooled or channels % CONV_BLOCK:
        return False
    params = gemm_params()
    return oh * ow >= params.mr and 0 < ow < 2 * params.lanes


class PackWeights(BodyRewritePass):
    name = "PackWeights"
    rewriter = _Packer
