"""Strategies: several implementations of a kernel, chosen by conditions on its dims.

An op declares a *strategy* with its definition in ``tensorvm/op/`` (``OpDef.strategy``): a function
``strategy(attrs, inputs, out_type) -> [Implementation]`` over the op's te inputs (it imports this module
in its body: importing the op registry does not import the code generator). An implementation has a
``condition`` on the input dims (a bool te expression, or True), a priority ``plevel`` and a kind:

* a **C variant**: the whole fused group lowered again knowing more: ``static_dims`` (``{dim: value}``,
  a static-shape specialization) and/or ``multiples`` (``{dim: m}``, a vector-friendly variant: dims
  that are multiples of 8 or 16 give loops without remainders and register blocking over a dynamic
  inner dim);
* an **external** variant: ``external(attrs, *arrays, out=...)`` computes the op itself (BLAS through
  NumPy for ``nn.dense``, ``nn.matmul``, ``nn.batch_matmul``); the rest of the fused group, if any,
  becomes a generated C *epilogue* kernel run afterwards, in place on the output when it is a pure
  elementwise function of the op's result, else from a temporary;
* a **call** variant (``Implementation.call``): the op computed by a C library function called from the
  kernel (``tv_gemm_*``, BLAS from C; ``tv_gemm_packed_f32``; ``tv_conv2d_*``; ``tv_softmax_f32``), the rest
  of the group generated after it in the same function. Calls in ``BLAS_BRIDGE`` need a shared library;
  ``portable`` ones (in ``PRELUDE``) serve the AOT flow too.

The generic implementation (the group as written, condition True, plevel 0) is always there. The matrix
products, convolution and softmax register strategies. Elementwise and other normalization kernels
(layer norm) gain at most ~1.07x from knowing a dim at compile time, not worth a second copy of their
code; softmax gains 1.35x from a library function (an inline exp fused with its sum).

**Resolution.** The anchor of a fused group is its op with a strategy (else there are no variants,
except the static specializations asked for with ``specialize``). Implementations are ordered by
plevel; a condition that folds to False at compile time (static dims) drops the implementation, one
that folds to True ends the list: what remains depends on run-time dims only. The C variants become
one C function with the generic signature: the generic entry checks, then a generated dispatch
function ``<kernel>_dispatch(dims...)`` picks the variant (``loop_ir.Dispatch``) -- so the VM, the
graph executor and AOT call a kernel with variants exactly like any other. External variants need a
Python caller: ``DispatchKernel`` evaluates their conditions (compiled to Python from the same te
expressions) before falling back to the C kernel.

Thresholds are rules on the host (``host.kernel_rules``), costs in cycles measured with
``benchmarks/kernels.py`` on the development machine (2 cores, AVX2; BLAS peaks at 91 GFLOP/s on one
thread, 186 on two) times the host's multiply-adds per cycle. There the generated dense kernel (static K
and N) runs at 25-36 GFLOP/s, as fast as BLAS plus the ~4 us of the Python dispatcher below about 2^20
multiply-adds (8x256x256: C 27-30 us, BLAS 29 us + dispatch; ``blas_min_flops``) and on fewer rows than
a vector has lanes (GEMV-like, memory-bound: 4x768x768: C 140 us, BLAS 198 us; ``blas_min_rows``); above
that BLAS is up to 2.6x faster (128x768x768: 4.5 ms vs 1.7 ms). With N or K dynamic the C kernel is
about twice slower and BLAS wins 16x earlier (``blas_min_flops_dynamic``). With parallel kernels BLAS runs
single-threaded (``blas_single_thread``: OpenBLAS's spinning workers made a 2-thread layer norm over 100x
slower) and the thresholds grow by ``blas_thread_factor`` per extra thread (measured at 2 threads: C 165
us vs BLAS 252 us at 8x768x768, C 681 vs 560 us at 32x768x768). An AVX-512 host doubles each.

    with strategy.specialize(n=[1, 128]):       # static variants for the named dim n
        module, kernels = build_fused_module(prims)
    kernels["fused_dense"].variants              # ('blas', 'vec', 'generic') for a dynamic dense
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

import numpy as np

from ..errors import TensorVMError, UnsupportedError
from ..ir.analysis import free_vars
from ..ir.expr import Call, Constant, Function, Op, Var, is_op_call
from ..ir.functor import ExprMutator
from ..ir.types import TensorType, TupleType
from ..op.nn import halves_nchw_map
from ..op.registry import OpPattern, get_op
from ..op.transform import RESHAPE_ONLY_OPS, transpose_axes
from ..te.expr import (
    INDEX_DTYPE,
    Binary,
    Cast,
    Const,
    PrimExpr,
    Select,
    Unary,
    as_expr,
    cast,
    const,
    dtype_kind,
    eq,
    floordiv,
    floormod,
    logical_and,
    select,
)
from ..te.expr import Var as DimVar
from ..te.tensor import ComputeOp, PlaceholderOp, Tensor, walk
from . import blas
from .build import kernel_threads
from .loop_ir import Allocate, Buffer, CallExtern, IfThenElse, seq
from .lower import LoweredParts, lower_dispatch, lower_parts, rebind

__all__ = [
    "Implementation", "strategy_of", "specialize", "KernelPlan", "ExternalPlan",
    "DispatchKernel", "PackedGemmCall", "MaxPool2dCall", "plan", "rules", "gemm_min_work", "blas_single_thread",
    "variants_enabled",
]

# The thresholds the variants are chosen by (BLAS through NumPy from ``blas_min_flops`` multiply-adds and
# ``blas_min_rows`` rows, ``blas_min_flops_dynamic`` with N or K dynamic, growing by ``blas_thread_factor``
# per extra kernel thread; a library product called from C from ``gemm_min_work``; the "vec" variant for
# dynamic N and K that are multiples of ``vector_width`` and ``reduction_width``) come from the host by the
# rules of ``host.kernel_rules``: fixed costs in cycles times the host's work per cycle.
GEMM_SUFFIX = {"float32": "f32", "float64": "f64"}


def rules():
    """This host's ``host.KernelRules`` (the thresholds of the module docstring)."""
    from .host import kernel_rules

    return kernel_rules()


def gemm_min_work() -> int:
    """Multiply-adds from which a product calls the library (``tv_gemm_*``, BLAS or the packed tiles) from
    C: ``LIBRARY_CALL_CYCLES`` x the host's multiply-adds per cycle (2^14 on AVX2, 2^15 on AVX-512)."""
    return rules().gemm_min_work


@dataclass(frozen=True)
class Implementation:
    """One way to compute an op (see the module docstring). ``condition`` is a bool te expression over
    the op's input dims, or a Python bool."""

    name: str
    condition: object = True
    plevel: int = 0
    static_dims: dict = field(default_factory=dict)
    multiples: dict = field(default_factory=dict)
    external: object = None
    work: object = None  # external: a te measure of the work (multiply-adds) ...
    min_work: int = 0  # ... that must reach min_work x the kernels' thread count (checked per call)
    call: object = None  # a LibraryCall (GemmCall, SoftmaxCall...): the op computed by a C function

    @property
    def kind(self) -> str:
        if self.call is not None:
            return "call"
        return "external" if self.external is not None else "c"


class LibraryCall:
    """What an ``Implementation.call`` computes its op with: a C function of the prelude, written by
    ``statement(args, target, suffix)``. ``portable``: in ``PRELUDE``, so every translation unit has it
    (AOT's too); else in ``BLAS_BRIDGE``, shared libraries only."""

    portable: ClassVar[bool] = False
    # only where the rest of the group is elementwise over the op's result (else the generated kernel: a
    # reduction inside a fused layer norm stays in its one loop nest)
    rest_elementwise: ClassVar[bool] = False


@dataclass(frozen=True)
class GemmCall(LibraryCall):
    """The anchor op as ``tv_gemm_<dtype>(batch, m, n, k, A, a_step, ta, B, b_step, tb, C, alpha)`` (see
    ``c_emit.BLAS_BRIDGE``): ``a``, ``b`` index the op's arguments; the rest are te expressions over its
    dims (``ta``/``tb``: 0 or 1, op(A) = A^T when set; the steps are the elements between batch entries,
    0 for an operand shared by the whole batch). ``alpha`` scales the product (a constant factor after it
    in the group, ``_scale_after``)."""

    a: int
    b: int
    batch: object
    m: object
    n: object
    k: object
    a_step: object
    ta: int
    b_step: object
    tb: int
    alpha: float = 1.0

    def statement(self, args: list, target, suffix: str):
        """The call computing the op from its argument buffers ``args`` into ``target``."""
        return CallExtern(f"tv_gemm_{suffix}", (self.batch, self.m, self.n, self.k, args[self.a], self.a_step,
                                                const(self.ta, "int64"), args[self.b], self.b_step,
                                                const(self.tb, "int64"), target, const(self.alpha, target.dtype)))


@dataclass(frozen=True)
class StridedGemmCall(LibraryCall):
    """The anchor op as ``tv_gemm_strided_<dtype>`` (``c_emit.BLAS_BRIDGE``) on operands read where they
    lie: a kernel input or a transpose of one (FuseOps puts such transposes in the product's group).
    The batch is ``outer`` x ``inner`` entries; ``a``, ``b``, ``c`` are each ``(outer step, inner step,
    row stride, column stride)`` in elements, te expressions over the kernel's dims. The C side checks
    that every matrix has a unit stride. ``alpha`` scales the product, as in ``GemmCall``."""

    outer: object
    inner: object
    m: object
    n: object
    k: object
    a: tuple
    b: tuple
    c: tuple
    alpha: float = 1.0

    def statement(self, args: list, target, suffix: str):
        """``args``: the buffers the two operands are views of."""
        return CallExtern(f"tv_gemm_strided_{suffix}", (self.outer, self.inner, self.m, self.n, self.k,
                                                        args[0], *self.a, args[1], *self.b, target, *self.c,
                                                        const(self.alpha, target.dtype)))


@dataclass(frozen=True)
class PackedGemmCall(LibraryCall):
    """``nn.dense_packed`` as ``tv_gemm_packed_f32(m, n, k, lanes, x, packed, out)``
    (``c_emit.BLAS_BRIDGE``): a register-blocked product over the weight's panels of ``lanes`` columns
    (``tv_vgemm.h``, built for this host's width; another width runs plain loops), no host BLAS involved.
    ``m``, ``n``, ``k`` are te expressions over the op's dims (rows of x, units, in_dim)."""

    m: object
    n: object
    k: object
    lanes: int = 16

    def statement(self, args: list, target, suffix: str, epilogue: TileEpilogue | None = None):
        """With ``epilogue`` (``product_epilogue``; float32) ``target`` receives it applied in the tiles
        (``tv_gemm_packed_epi_f32``): ``args[epilogue.bias]`` a bias per column, ``args[epilogue.residual]``
        a residual of the product's shape, when there are."""
        if epilogue is None:
            return CallExtern(f"tv_gemm_packed_{suffix}", (self.m, self.n, self.k, const(self.lanes, "int64"),
                                                           args[0], args[1], target))
        if epilogue.pool or epilogue.relu:
            raise UnsupportedError("the packed product's epilogue has no pool and no separate relu")
        bias = args[0] if epilogue.bias is None else args[epilogue.bias]  # (a pointer never read when absent)
        residual = args[0] if epilogue.residual is None else args[epilogue.residual]
        has_bias, has_residual = (const(int(v is not None), "int64") for v in (epilogue.bias, epilogue.residual))
        return CallExtern("tv_gemm_packed_epi_f32", (
            self.m, self.n, self.k, const(self.lanes, "int64"), args[0], args[1],
            bias, has_bias, args[0], const(0, "int64"), residual, has_residual,
            const(int(epilogue.act), "int64"),
            *(const(float(v), "float32") for v in (epilogue.alpha, epilogue.beta, epilogue.lo, epilogue.hi)), target))


@dataclass(frozen=True)
class SoftmaxCall(LibraryCall):
    """``nn.softmax`` / ``nn.log_softmax`` over the last axis of a float32 array as
    ``tv_softmax_f32(rows, n, x, y, log)`` (``c_emit.PRELUDE``, so every translation unit has it, AOT's
    too): exp and its sum in one pass, with an inline exp the loop vectorizes, 1.35x faster than the
    generated four passes around libmvec's expf. ``rows`` and ``n`` are te expressions over the op's
    dims."""

    portable: ClassVar[bool] = True
    rows: object
    n: object
    log: bool

    def statement(self, args: list, target, suffix: str):
        return CallExtern(f"tv_softmax_{suffix}", (self.rows, self.n, args[0], target, const(int(self.log), "int64")))


@dataclass(frozen=True)
class MeanCall(LibraryCall):
    """``mean`` of a float32 array over its trailing axes as ``tv_mean_f32(rows, n, x, y)`` (``c_emit.PRELUDE``,
    every translation unit has it): each of ``rows`` contiguous runs of ``n`` floats summed in vectors
    (a global average pool). ``rows`` and ``n`` are te expressions over the op's dims."""

    portable: ClassVar[bool] = True
    rest_elementwise: ClassVar[bool] = True
    rows: object
    n: object

    def statement(self, args: list, target, suffix: str):
        return CallExtern(f"tv_mean_{suffix}", (self.rows, self.n, args[0], target))


@dataclass(frozen=True)
class MaxPool2dCall(LibraryCall):
    """A float32 NCHW ``nn.max_pool2d`` as ``tv_max_pool2d_f32(n, c, h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt,
    pl, x, y)`` (``tv_vpool.h``, in ``c_emit.BLAS_BRIDGE``: it runs on the thread team): per plane each input
    row's horizontal window maximum is computed once, in vectors along the output columns, and the output
    rows are the vertical maxima of those; NaN propagates as NumPy's maximum does. ``dims`` are te
    expressions (batch, channels, height, width, out height, out width); the bottom and right padding and
    ceil mode are in the out dims."""

    dims: tuple
    kernel: tuple  # (kh, kw), static
    strides: tuple
    dilation: tuple
    padding: tuple  # (top, left)

    def statement(self, args: list, target, suffix: str):
        geometry = [const(int(v), "int64") for v in (*self.kernel, *self.strides, *self.dilation, *self.padding)]
        return CallExtern(f"tv_max_pool2d_{suffix}", (*self.dims, *geometry, args[0], target))


@dataclass(frozen=True)
class Conv2dCall(LibraryCall):
    """An NCHW / OIHW convolution as a C library call (``c_emit.BLAS_BRIDGE``). A float32 1x1 convolution
    with unit strides, no padding and a short static reduction runs the pointwise kernel
    ``tv_conv2d_pointwise_act_f32`` (``tv_vpointwise.h``; ``pointwise``). A float32 convolution other
    than 1x1 with a short reduction (``direct``: an image's first layers, small CNNs), at any strides and
    dilation, runs the direct kernel ``tv_conv2d_direct_f32`` (``tv_vconv.h``, vectors of the
    host's width), which can also apply a ``TileEpilogue`` to its output tiles. The rest runs
    ``tv_conv2d_<dtype>``: per image the input patches are unfolded into a temporary (im2col; skipped for
    a 1x1 kernel with unit strides and no padding, the image being its own patch matrix) and multiplied
    by the weight matrix (O x C*KH*KW) with ``tv_gemm`` (the register tiles with the image packed on the
    fly, or BLAS)."""

    dims: tuple  # te expressions: batch, channels, height, width, out channels, out height, out width
    kernel: tuple  # (kh, kw), static
    strides: tuple
    dilation: tuple
    padding: tuple  # (top, left)
    padding_all: tuple  # (top, left, bottom, right)
    channels: int | None = None  # the input channels when static
    depthwise: bool = False  # groups = channels = out channels: ``tv_conv2d_depthwise_f32`` (float32 only)
    packed: bool = False  # ``nn.conv2d_packed``: ``tv_conv2d_packed_f32`` over the packed weight (float32 only)

    def direct(self, suffix: str) -> bool:
        """Whether the direct kernel of ``tv_vconv.h`` computes it, by this rule: its tile broadcasts one
        weight per pair of FMAs, so it runs at the FMA units' speed while the weights of a block of
        output channels (``mr`` x C x KH x KW floats, ``mr`` the tile's channels) stay in L1 beside the
        input rows it streams: up to a quarter of L1d (``direct_max_reduction``). There it reads each
        input once per tile where im2col copies it KH x KW times, and it beat im2col + the product
        (BLAS) by 1.2-1.8x on first layers and the small CNN (C x KH x KW of 27 to 288 on AVX2, 32 KB
        L1d); beyond, im2col + the product won by 1.1-1.5x (ResNet-18's layers, 576 to 4608). With
        dynamic channels a unit-stride convolution keeps the direct kernel. A depthwise convolution is
        always direct (its own kernel, float32 only)."""
        if self.depthwise or self.packed:
            return suffix == "f32"
        if self.pointwise(suffix):
            return True
        if suffix != "f32" or self.kernel == (1, 1):
            return False
        if self.channels is None:
            return (*self.strides, *self.dilation) == (1, 1, 1, 1)
        return direct_takes(self.channels, *self.kernel)

    def pointwise(self, suffix: str) -> bool:
        """Whether ``tv_conv2d_pointwise_act_f32`` (``tv_vpointwise.h``) computes it: float32, 1x1, unit
        strides, no padding, static channels up to ``direct_max_reduction`` (longer ones are packed at
        compile time, ``PackWeights``). Its register tile reads the image's rows in place and writes its
        epilogue straight into the output, where the product took a copy of the image and a second pass."""
        return (suffix == "f32" and not (self.depthwise or self.packed) and self.kernel == (1, 1)
                and self.strides == (1, 1) and not any(self.padding_all) and self.channels is not None
                and self.channels <= direct_max_reduction())

    def padded_size(self):
        """Floats of the zero-padded, column-phase-split copy of one image the direct kernel reads
        (``tv_vconv_geometry_of`` in ``tv_vconv.h``, for this host's vector lanes)."""
        from .host import gemm_params

        lanes = gemm_params().lanes
        _, c, _, _, _, oh, ow = self.dims
        (kh, kw), (sh, sw), (dh, dw) = self.kernel, self.strides, self.dilation
        hp = (oh - 1) * sh + ((kh - 1) * dh + 1)
        wq = floordiv(ow + (lanes - 1), lanes) * lanes + (kw - 1) * dw // sw
        return c * hp * (sw * wq)

    def statement(self, args: list, target, suffix: str, epilogue: TileEpilogue | None = None):
        """The call computing the convolution of ``args`` into ``target``; with ``epilogue`` (direct
        kernel only) ``target`` receives the convolution's epilogue applied, ``args[epilogue.bias]`` the
        bias when there is one."""
        n, c, h, w, o, oh, ow = self.dims
        (kh, kw), (sh, sw), (dh, dw), (pt, pl) = self.kernel, self.strides, self.dilation, self.padding
        geometry = [const(v, "int64") for v in (kh, kw, sh, sw, dh, dw, pt, pl)]
        if self.direct(suffix):
            epilogue = epilogue or TileEpilogue()
            bias = args[1] if epilogue.bias is None else args[epilogue.bias]
            if self.pointwise(suffix):
                return self._pointwise_statement(args, target, epilogue, bias)
            if epilogue.act or epilogue.residual is not None:
                return self._act_statement(args, target, epilogue, bias, geometry)
            if self.packed:  # (its channel-blocked copy of the image is allocated by the kernel)
                if epilogue.pool:
                    raise UnsupportedError("the packed convolution kernel has no max pool epilogue")
                flags = [const(int(v), "int64") for v in (epilogue.bias is not None, epilogue.relu)]
                return CallExtern("tv_conv2d_packed_f32", (n, c, h, w, o, oh, ow, *geometry, args[0], args[1], bias,
                                                           *flags, target))
            if self.depthwise:  # (its padded planes are per thread, allocated by the kernel)
                if epilogue.pool:
                    raise UnsupportedError("the depthwise convolution kernel has no max pool epilogue")
                flags = [const(int(v), "int64") for v in (epilogue.bias is not None, epilogue.relu)]
                return CallExtern("tv_conv2d_depthwise_f32", (n, c, h, w, oh, ow, *geometry, args[0], args[1], bias,
                                                              *flags, target))
            flags = [const(int(v), "int64") for v in (epilogue.bias is not None, epilogue.relu, epilogue.pool)]
            padded = Buffer("padded", args[0].dtype, (self.padded_size(),), "local")
            call = CallExtern("tv_conv2d_direct_f32", (n, c, h, w, o, oh, ow, *geometry, args[0], args[1], bias,
                                                       *flags, padded, target))
            return Allocate(padded, call)
        if epilogue is not None:
            raise UnsupportedError("a tile epilogue needs the direct convolution kernel")
        direct = (kh, kw, sh, sw) == (1, 1, 1, 1) and not any(self.padding_all)
        col = Buffer("patches", args[0].dtype, (const(1, INDEX_DTYPE),) if direct else (c * (kh * kw) * oh * ow,),
                     "local")
        call = CallExtern(f"tv_conv2d_{suffix}", (n, c, h, w, o, oh, ow, *geometry, const(int(direct), "int64"),
                                                  args[0], args[1], col, target))
        return Allocate(col, call)


    def _pointwise_statement(self, args: list, target, epilogue: TileEpilogue, bias):
        """``tv_conv2d_pointwise_act_f32`` with the epilogue's bias, relu or residual and activation."""
        if epilogue.pool:
            raise UnsupportedError("the pointwise convolution kernel has no max pool epilogue")
        n, c, h, w, o, _, _ = self.dims
        residual = args[1] if epilogue.residual is None else args[epilogue.residual]
        flags = [const(int(v), "int64") for v in (epilogue.bias is not None, epilogue.relu, epilogue.act)]
        return CallExtern("tv_conv2d_pointwise_act_f32", (
            n, c, h * w, o, args[0], args[1], bias, *flags,
            *(const(float(v), "float32") for v in (epilogue.alpha, epilogue.beta, epilogue.lo, epilogue.hi)),
            residual, const(int(epilogue.residual is not None), "int64"), target))

    def _act_statement(self, args: list, target, epilogue: TileEpilogue, bias, geometry: list):
        """The ``*_act_f32`` entry of the direct, depthwise or packed kernel: the epilogue's bias, residual and
        activation applied in its tiles (``tv_conv_epilogue`` in ``tv_vconv.h``)."""
        if epilogue.pool or epilogue.relu:
            raise UnsupportedError("a convolution tile epilogue has a pool or relu beside an activation or residual")
        n, c, h, w, o, oh, ow = self.dims
        residual = args[1] if epilogue.residual is None else args[epilogue.residual]
        has_bias = const(int(epilogue.bias is not None), "int64")
        off = const(0, "int64")  # (relu, and the direct kernel's pool)
        tail = (const(int(epilogue.act), "int64"),
                *(const(float(v), "float32") for v in (epilogue.alpha, epilogue.beta, epilogue.lo, epilogue.hi)),
                residual, const(int(epilogue.residual is not None), "int64"))
        if self.packed:
            return CallExtern("tv_conv2d_packed_act_f32", (n, c, h, w, o, oh, ow, *geometry, args[0], args[1], bias,
                                                           has_bias, off, *tail, target))
        if self.depthwise:
            return CallExtern("tv_conv2d_depthwise_act_f32", (n, c, h, w, oh, ow, *geometry, args[0], args[1], bias,
                                                              has_bias, off, *tail, target))
        padded = Buffer("padded", args[0].dtype, (self.padded_size(),), "local")
        call = CallExtern("tv_conv2d_direct_act_f32", (n, c, h, w, o, oh, ow, *geometry, args[0], args[1], bias,
                                                       has_bias, off, off, *tail, padded, target))
        return Allocate(padded, call)


def direct_max_reduction(desc=None) -> int:
    """The longest reduction (C x KH x KW) the direct convolution takes on this host (``Conv2dCall.direct``):
    a block of ``mr`` output channels' weights fills at most a quarter of L1d (341 on AVX2 with 32 KB,
    219 on AVX-512 with 48 KB, 146 with 32 KB)."""
    from .host import gemm_params, host

    desc = desc or host()
    return desc.l1d // 4 // (4 * max(gemm_params(desc).mr, 4))


def direct_takes(channels: int, kh: int, kw: int, desc=None) -> bool:
    """Whether the direct convolution takes a (channels x kh x kw) reduction rather than the packed one:
    up to ``direct_max_reduction``, stretched by the work the packed kernel would waste on channels padded
    to its blocks of ``CONV_BLOCK`` (ceil(C / 8) x 8 / C: 8/3 for an RGB stem). Past its L1 bound the
    direct kernel slows by less than that: ResNet-18's 3 -> 64 7x7 stem (147, one past the bound of 146
    with the 14-row tile of 64-byte vectors and 32 KB L1d) took 2474 us direct against 6006 packed; 4 input
    channels (waste 2): 3175 against 5991 (docs/kernels.md, "Vector width and the FMA datapath")."""
    from ..op.nn import CONV_BLOCK

    padded = -(-channels // CONV_BLOCK) * CONV_BLOCK
    return channels * kh * kw * channels <= direct_max_reduction(desc) * padded


@dataclass(frozen=True)
class TileEpilogue:
    """What the direct convolution kernel applies to each output tile in registers before storing it:
    a per-channel bias (``bias``: the position of the bias among the call's argument buffers), a relu,
    and a 2x2 stride-2 max pool (FuseOps puts such a pool in the convolution's group). Without the relu
    and the pool (``activation_epilogue``): a residual (``residual``: the position of an array of the
    output's shape, added after the bias) and an activation after it, ``act`` of the ``ACT_*`` bits:
    s = alpha v + beta, clamped below at ``lo`` (``ACT_LO``) and above at ``hi`` (``ACT_HI``), times v with
    ``ACT_GATE`` (the direct, depthwise and packed kernels; ``tv_conv_epilogue`` in ``tv_vconv.h``)."""

    bias: int | None = None
    relu: bool = False
    pool: bool = False
    act: int = 0
    alpha: float = 1.0
    beta: float = 0.0
    lo: float = 0.0
    hi: float = 0.0
    residual: int | None = None


ACT_LO, ACT_HI, ACT_GATE = 1, 2, 4  # (TV_ACT_* in tv_vec.h)
ACT_GELU, ACT_GELU_TANH = 8, 16  # (tv_vgemm.h; the packed product's epilogue only: v Phi(v) with erf, its tanh approximation)
# Whether nn.dense_packed groups run their epilogue in the product's tiles (``product_epilogue``,
# ``tv_gemm_packed_epi_f32``) instead of the product then a generated second pass. Off: measured slower on
# a quiet machine (DistilBERT/RoBERTa's dense groups side by side, 1 thread: bias + erf GELU 1.14-1.21x,
# bias + residual 1.01-1.12x the second pass's time); see docs/kernels.md. Tests turn it on.
PRODUCT_EPILOGUE = False


def tile_epilogue(fn: Function, channels) -> tuple[TileEpilogue, Var | None] | None:
    """The ``TileEpilogue`` that computes ``fn`` (the rest of a convolution's group, the convolution's
    result as its first parameter; see ``_epilogue_function``), with the parameter holding the bias
    (or None); None when ``fn`` is something else. Recognized, each at most once: a 2x2 stride-2 max
    pool, ``nn.relu`` and a per-channel bias (``nn.bias_add`` over axis 1, or ``add`` of a parameter
    shaped (O, 1, 1) or (1, O, 1, 1), as ONNX Conv imports; O = ``channels``, float32), in any order
    but a bias after the relu: the pool commutes with both (``relu(pool(x))``, as in
    ``F.relu(F.max_pool2d(conv(x), 2))``, is ``pool(relu(x))``)."""
    from .fused import _param_type

    result, expr, found, bias = fn.params[0], fn.body, [], None
    while expr is not result:
        if not isinstance(expr, Call) or not isinstance(expr.op, Op) or not expr.args:
            return None
        name, attrs, args = expr.op.name, expr.attrs, expr.args
        if name == "nn.max_pool2d":
            if not halves_nchw_map(get_op(name).normalize_attrs(attrs)):
                return None
            kind, expr = "pool", args[0]
        elif name == "nn.relu":
            kind, expr = "relu", args[0]
        elif name in ("nn.bias_add", "add") and len(args) == 2:
            if name == "nn.bias_add":
                if get_op(name).normalize_attrs(attrs).axis not in (1, -3):
                    return None
                expr, bias, shapes = args[0], args[1], ((channels,),)
            else:
                first, second = args
                expr, bias = (first, second) if isinstance(second, Var) and second is not result else (second, first)
                shapes = ((channels, 1, 1), (1, channels, 1, 1))
            ty = _param_type(bias) if isinstance(bias, Var) and bias is not result else None
            if not isinstance(ty, TensorType) or ty.dtype != "float32" or tuple(ty.shape) not in shapes:
                return None
            kind = "bias"
        else:
            return None
        if kind in found or (kind == "relu" and "bias" in found):  # (a bias after the clamp is not ours)
            return None
        found.append(kind)
    return TileEpilogue(None, "relu" in found, "pool" in found), bias


def _scalar(expr, rank: int) -> float | None:
    """The value of a float32 constant of one element and at most ``rank`` dims (no broadcast beyond the
    result), finite; else None."""
    if not isinstance(expr, Constant) or expr.data.size != 1 or expr.data.dtype != np.float32 \
            or expr.data.ndim > rank:
        return None
    value = float(expr.data.reshape(()))
    return value if np.isfinite(value) else None


def _op_call(expr, *names) -> bool:
    return is_op_call(expr, *names) and bool(expr.args)


def _with_scalar(expr, rank: int):
    """``(other operand, constant)`` of a binary call with one scalar constant operand (the constant second
    for subtract and divide); else None."""
    if len(expr.args) != 2:
        return None
    first, second = expr.args
    k = _scalar(second, rank)
    if k is not None:
        return first, k
    k = _scalar(first, rank)
    if k is not None and expr.op.name in ("add", "multiply"):
        return second, k
    return None


def _clamped_affine(expr, rank: int):
    """``(bits, alpha, beta, lo, hi, v)`` when ``expr`` is clamp(alpha v + beta, lo, hi) (``ACT_LO`` /
    ``ACT_HI`` for the bounds it has: relu, clip, maximum and minimum by constants, an affine map by
    constants inside and a division or product by a positive constant outside: hard-sigmoid, relu6,
    ``clip(v + 3, 0, 6) / 6``); else None."""
    scale = 1.0
    if _op_call(expr, "divide", "multiply"):
        found = _with_scalar(expr, rank)
        if found is None or found[1] <= 0:
            return None
        scale = 1.0 / found[1] if expr.op.name == "divide" else found[1]
        expr = found[0]
    bits, lo, hi = 0, 0.0, 0.0
    if _op_call(expr, "nn.relu"):
        bits, expr = ACT_LO, expr.args[0]
    elif _op_call(expr, "clip"):
        attrs = get_op("clip").normalize_attrs(expr.attrs)
        lo, hi, expr = float(attrs.a_min), float(attrs.a_max), expr.args[0]
        bits = (ACT_LO if np.isfinite(lo) else 0) | (ACT_HI if np.isfinite(hi) else 0)
        lo, hi = (lo if bits & ACT_LO else 0.0), (hi if bits & ACT_HI else 0.0)
    else:
        while _op_call(expr, "maximum", "minimum"):
            bit = ACT_LO if expr.op.name == "maximum" else ACT_HI
            found = _with_scalar(expr, rank)
            if found is None or bits & bit:
                return None
            bits |= bit
            expr, lo, hi = (found[0], found[1], hi) if bit == ACT_LO else (found[0], lo, found[1])
    if not bits or (bits == ACT_LO | ACT_HI and lo > hi):
        return None
    alpha, beta = 1.0, 0.0
    if _op_call(expr, "add", "subtract"):
        found = _with_scalar(expr, rank)
        if found is not None:
            expr, beta = found[0], (found[1] if expr.op.name == "add" else -found[1])
    if _op_call(expr, "multiply", "divide"):
        found = _with_scalar(expr, rank)
        if found is not None and found[1] != 0:
            expr, alpha = found[0], (found[1] if expr.op.name == "multiply" else 1.0 / found[1])
    return bits, alpha * scale, beta * scale, lo * scale, hi * scale, expr


def _activation(expr, rank: int, gelu: bool = False):
    """``(act, alpha, beta, lo, hi, v)`` when ``expr`` is an activation of ``v`` a tile epilogue applies: a
    clamped affine map (``_clamped_affine``), optionally times its own input (hard-swish:
    ``x * hard_sigmoid(x)``), or (``gelu``: the packed product's epilogue) GELU, ``nn.gelu`` or the forms
    ONNX exports (``_gelu_erf``, ``_gelu_tanh``); ``(0, 1, 0, 0, 0, expr)`` for none."""
    if gelu and _op_call(expr, "nn.gelu") and len(expr.args) == 1:
        tanh = get_op("nn.gelu").normalize_attrs(expr.attrs).approximate == "tanh"
        return ACT_GELU_TANH if tanh else ACT_GELU, 1.0, 0.0, 0.0, 0.0, expr.args[0]
    if gelu:
        for act, match in ((ACT_GELU, _gelu_erf), (ACT_GELU_TANH, _gelu_tanh)):
            v = match(expr, rank)
            if v is not None:
                return act, 1.0, 0.0, 0.0, 0.0, v
    if _op_call(expr, "multiply") and len(expr.args) == 2:  # the gate: v * clamp(alpha v + beta, lo, hi)
        for v, gate in (expr.args, expr.args[::-1]):
            found = _clamped_affine(gate, rank)
            if found is not None and found[-1] is v:
                return (found[0] | ACT_GATE, *found[1:5], v)
    found = _clamped_affine(expr, rank)
    return found if found is not None else (0, 1.0, 0.0, 0.0, 0.0, expr)


def _factors(expr, rank: int, out: list) -> list:
    """The factors of a tree of ``multiply`` calls (a division by a scalar constant as a factor 1/c)."""
    if _op_call(expr, "multiply") and len(expr.args) == 2:
        for arg in expr.args:
            _factors(arg, rank, out)
    elif _op_call(expr, "divide") and (found := _with_scalar(expr, rank)) is not None and found[1] != 0:
        _factors(found[0], rank, out)
        out.append(1.0 / found[1])
    else:
        k = _scalar(expr, rank)
        out.append(expr if k is None else k)
    return out


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * abs(b)


def _scaled(expr, rank: int):
    """``(constant factor, [other factors])`` of ``expr`` (``_factors``)."""
    factors = _factors(expr, rank, [])
    return float(np.prod([f for f in factors if isinstance(f, float)])), [f for f in factors if not isinstance(f, float)]


def _half_v_one_plus(expr, rank: int, fn: str):
    """``[(v, argument)]``: the candidates for 0.5 v (1 + fn(argument)) in ``expr`` (factors in any order and
    grouping)."""
    scale, terms = _scaled(expr, rank)
    found = []
    if len(terms) == 2 and _close(scale, 0.5):
        for v, phi in (terms, terms[::-1]):
            if _op_call(phi, "add") and len(phi.args) == 2:
                for call, one in (phi.args, phi.args[::-1]):
                    if _scalar(one, rank) == 1.0 and _op_call(call, fn) and len(call.args) == 1:
                        found.append((v, call.args[0]))
    return found


def _gelu_erf(expr, rank: int):
    """``v`` when ``expr`` is 0.5 v (1 + erf(v / sqrt 2)) (the division possibly a product by 1/sqrt 2:
    torch's GELU exported to ONNX); else None."""
    for v, argument in _half_v_one_plus(expr, rank, "erf"):
        k, terms = _scaled(argument, rank)
        if terms == [v] and _close(k, 1 / np.sqrt(2.0)):
            return v
    return None


def _gelu_tanh(expr, rank: int):
    """``v`` when ``expr`` is 0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3))) (GPT-2's GELU exported to
    ONNX; the cube as ``power(v, 3)`` or a product); else None."""
    for v, argument in _half_v_one_plus(expr, rank, "tanh"):
        k, terms = _scaled(argument, rank)
        if len(terms) != 1 or not _close(k, np.sqrt(2 / np.pi)) or not _op_call(terms[0], "add") \
                or len(terms[0].args) != 2:
            continue
        for linear, cubic in (terms[0].args, terms[0].args[::-1]):
            c, cube = _scaled(cubic, rank)
            if len(cube) == 1 and _op_call(cube[0], "power") and len(cube[0].args) == 2 \
                    and cube[0].args[0] is v and _scalar(cube[0].args[1], rank) == 3.0:
                cube = [v, v, v]
            if linear is v and _close(c, 0.044715) and len(cube) == 3 and all(f is v for f in cube):
                return v
    return None


def _residual(expr, result, out_type):
    """``(residual, rest)`` when ``expr`` is ``rest + residual`` with the residual a float32 parameter of the
    result's rank whose static dims equal the result's (dynamic ones are checked per call); else
    ``(None, expr)``."""
    from .fused import _param_type

    rank = len(out_type.shape)
    if _op_call(expr, "add") and len(expr.args) == 2:
        for v, other in (expr.args, expr.args[::-1]):
            ty = _param_type(other) if isinstance(other, Var) and other is not result else None
            if isinstance(ty, TensorType) and ty.dtype == "float32" and len(ty.shape) == rank and all(
                    a == b if isinstance(a, int) and isinstance(b, int) else not isinstance(a, int) and not isinstance(b, int)
                    for a, b in zip(ty.shape, out_type.shape)):
                return other, v
    return None, expr


def activation_epilogue(fn: Function, out_type) -> tuple[TileEpilogue, Var | None, Var | None] | None:
    """The ``TileEpilogue`` with an activation and/or a residual that computes ``fn`` (as ``tile_epilogue``
    takes it; ``out_type`` the convolution's result type), with the parameters holding the bias and the
    residual (or None): act(v + residual) where v is the result plus an optional per-channel bias (as
    ``tile_epilogue`` recognizes it), the residual as ``_residual`` finds it, and act a clamped affine map,
    optionally times its own input (``_activation``), or nothing. None when ``fn`` is something else or
    has neither an activation nor a residual."""
    result, rank = fn.params[0], len(out_type.shape)
    act, alpha, beta, lo, hi, expr = _activation(fn.body, rank)
    residual, expr = _residual(expr, result, out_type)
    if not act and residual is None:
        return None
    bias = None
    if expr is not result:
        match = tile_epilogue(Function(fn.params, expr, None), out_type.shape[1])
        if match is None or match[0].relu or match[0].pool or match[1] is None:
            return None
        bias = match[1]
    if residual is not None and residual is bias:
        return None
    return TileEpilogue(None, act=act, alpha=alpha, beta=beta, lo=lo, hi=hi), bias, residual


def product_epilogue(fn: Function, out_type) -> tuple[TileEpilogue, Var | None, Var | None] | None:
    """The epilogue of the packed product (``tv_vgemm_epilogue``) that computes ``fn`` (the rest of an
    ``nn.dense_packed`` group, its result the first parameter; ``out_type`` the product's type), with the
    parameters holding the bias and the residual (or None): act(v + residual), v the result plus an
    optional bias per output column (``add`` of a float32 parameter shaped (N,) or (1, ..., N) of at most
    the result's rank, or ``nn.bias_add`` over the last axis; N the result's static last dim), the residual
    as ``_residual`` finds it, act as ``_activation`` with GELU. None when ``fn`` is something else or is
    nothing of these."""
    from .fused import _param_type

    result, rank = fn.params[0], len(out_type.shape)
    act, alpha, beta, lo, hi, expr = _activation(fn.body, rank, gelu=True)
    residual, expr = _residual(expr, result, out_type)
    bias, units = None, out_type.shape[-1]
    if expr is not result and isinstance(units, int):
        if _op_call(expr, "nn.bias_add") and len(expr.args) == 2:
            if get_op("nn.bias_add").normalize_attrs(expr.attrs).axis in (-1, rank - 1):
                expr, bias = expr.args
        elif _op_call(expr, "add") and len(expr.args) == 2:
            first, second = expr.args
            expr, bias = (first, second) if first is result else (second, first)
        ty = _param_type(bias) if isinstance(bias, Var) and bias is not result else None
        if not isinstance(ty, TensorType) or ty.dtype != "float32" or not 1 <= len(ty.shape) <= rank \
                or tuple(ty.shape) != (1,) * (len(ty.shape) - 1) + (units,):
            return None
    if expr is not result or (residual is not None and residual is bias) or (bias is None and residual is None
                                                                            and not act):
        return None
    return TileEpilogue(None, act=act, alpha=alpha, beta=beta, lo=lo, hi=hi), bias, residual


def strategy_of(opdef):
    return opdef.strategy if callable(opdef.strategy) else None


def variants_enabled() -> bool:
    """False when ``$TENSORVM_KERNEL_VARIANTS`` is ``0``: every kernel is compiled generic only."""
    return os.environ.get("TENSORVM_KERNEL_VARIANTS", "1").strip() != "0"


# ---- static specializations asked for by the user ----------------------------------------------------

_HINTS: dict = {}  # process-wide: lowering may run in helper threads (deep programs)
_HINTS_LOCK = threading.Lock()


@contextlib.contextmanager
def specialize(**dims):
    """Within this block, kernels over a named dim (``SymDim``) get a static variant per listed value:
    ``with specialize(n=[1, 128]): tv.vm.compile(mod, target="c")``. The setting is process-wide."""
    for name, values in dims.items():
        if isinstance(values, (str, bytes)) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                       for v in values):
            raise ValueError(f"specialize: the values of {name} must be non-negative ints, got {values!r}")
    with _HINTS_LOCK:
        previous = dict(_HINTS)
        _HINTS.update({name: tuple(values) for name, values in dims.items()})
    try:
        yield
    finally:
        with _HINTS_LOCK:
            _HINTS.clear()
            _HINTS.update(previous)


def _hinted_implementations(graph) -> list:
    with _HINTS_LOCK:
        hints = dict(_HINTS)
    out = []
    for name, values in hints.items():
        dim = graph.builder.symbols.get(name)
        if dim is None:
            continue
        for value in values:
            out.append(Implementation(f"{name}_{value}", eq(dim, value), plevel=5, static_dims={dim: value}))
    return out


# ---- planning --------------------------------------------------------------------------------------


@dataclass(eq=False)
class ExternalPlan:
    """An external variant of a kernel: ``run(attrs, *arrays, out=target)`` on the kernel inputs at
    ``inputs`` (positions among the kernel's inputs, constants included), then the ``epilogue`` kernel
    (or none) on ``(target, *user inputs at epilogue_inputs, *outputs)``."""

    name: str
    condition: PrimExpr
    run: object
    attrs: object
    inputs: list
    result_shape: tuple
    result_dtype: str
    epilogue: object = None  # LoweredPrimitive
    epilogue_name: str = ""
    epilogue_inputs: list = field(default_factory=list)
    inplace: bool = False
    work: object = None
    min_work: int = 0


@dataclass(eq=False)
class KernelPlan:
    """What a primitive function compiles to: the C kernel (``lowered``, with its C variants behind a
    dispatch) and the external variants tried before it."""

    lowered: object  # LoweredPrimitive
    generic: LoweredParts
    graph: object
    externals: list

    def make_kernel(self, module, c_call=None):
        """The callable for this plan once ``module`` (a ``CompiledModule`` holding ``lowered.func`` and
        every external's ``epilogue.func``) is built: a ``FusedKernel``, or a ``DispatchKernel`` when
        there are external variants. ``c_call`` (optional) is a faster caller of the same C kernel that
        the dispatcher then uses for its C path (e.g. the VM's fast caller)."""
        from .fused import FusedKernel

        kernel = FusedKernel(module[self.lowered.func.name], self.lowered)
        if not self.externals:
            return kernel
        return DispatchKernel(kernel, self, module, c_call)


def plan(prim: Function, name: str, graph, generic: LoweredParts, externals: bool = True) -> KernelPlan:
    """Resolve the strategy of ``prim``'s anchor op and lower the C variants it keeps."""
    if not variants_enabled():
        return KernelPlan(graph.lowered(generic.func()), generic, graph, [])
    anchor, implementations = _implementations(graph)
    if not externals:  # (no host library: a translation unit of its own, the AOT flow)
        implementations = [i for i in implementations if i.kind != "call" or i.call.portable]
    c_variants, external_impls = _resolve(implementations)
    variants = []
    for impl in c_variants:
        if impl.kind == "call":
            parts = _call_variant(prim, name, graph, generic, anchor, impl)
        else:
            parts = _lower_variant(prim, name, graph, impl)
        if parts is not None:
            variants.append((impl.name, as_expr(impl.condition), parts))
            if isinstance(impl.condition, Const) and impl.condition.value:
                break  # always taken: nothing after it runs
    lowered = graph.lowered(lower_dispatch(generic, variants))
    plans = []
    if externals and anchor is not None:
        for impl in external_impls:
            ext = _external_plan(prim, name, graph, anchor, impl)
            if ext is not None:
                plans.append(ext)
    return KernelPlan(lowered, generic, graph, plans)


def _anchor(graph):
    """The op call whose strategy decides the kernel's variants: the most complex op with a strategy."""
    candidates = [c for c in graph.calls if strategy_of(c.opdef) is not None]
    if not candidates:
        return None
    return max(candidates, key=lambda c: (c.opdef.pattern != OpPattern.OPAQUE, c.opdef.pattern))


def _implementations(graph):
    anchor = _anchor(graph)
    impls = list(_hinted_implementations(graph))
    if anchor is not None:
        strategy = strategy_of(anchor.opdef)
        impls += list(strategy(anchor.attrs, anchor.args, anchor.out_type))
    return anchor, impls


def _resolve(impls: list) -> tuple[list, list]:
    """(C variants, external variants) that can still run, in priority order, without the generic
    (the C dispatch's default)."""
    c_variants, externals = [], []
    for impl in sorted(impls, key=lambda i: -i.plevel):
        condition = as_expr(impl.condition)
        if condition.dtype != "bool":
            raise UnsupportedError(f"strategy: the condition of {impl.name} must be a bool expression, got "
                                   f"{condition.dtype}")
        if isinstance(condition, Const) and not condition.value:
            continue
        if impl.kind == "call":  # (may not apply to the group: plan() stops after the first that does)
            c_variants.append(dataclasses.replace(impl, condition=_for_nonempty(condition)))
            continue
        if impl.kind == "external":
            externals.append(impl)
            if isinstance(condition, Const) and impl.work is None:  # always taken: nothing after it runs
                break
            continue
        static = {d: v for d, v in impl.static_dims.items() if isinstance(d, DimVar)}
        multiples = {d: m for d, m in impl.multiples.items() if isinstance(d, DimVar) and m > 1}
        if not static and not multiples:  # the generic kernel itself
            if isinstance(condition, Const):
                break
            continue
        c_variants.append(Implementation(impl.name, condition, impl.plevel, static, multiples))
        if isinstance(condition, Const):
            break
    return c_variants, externals


def _for_nonempty(condition: PrimExpr) -> PrimExpr:
    """``condition`` with each ``work >= c`` test that holds for every non-empty shape made True.

    ``work`` must be a product of dims and positive constants, so it is smallest when every dim is 1;
    if even that passes, the test only ever sends empty tensors elsewhere, and a call variant (which
    handles zero dims: its loops run zero times) then covers every shape: the generic variant is not
    compiled at all (half the C of a convolution kernel of a batch-dynamic CNN)."""
    if not isinstance(condition, Binary):
        return condition
    if condition.op == "ge" and isinstance(condition.b, Const):
        floor = _product_floor(condition.a)
        return const(True) if floor is not None and floor >= condition.b.value else condition
    if condition.op == "and":
        a, b = _for_nonempty(condition.a), _for_nonempty(condition.b)
        if isinstance(a, Const) and a.value is True:
            return b
        if isinstance(b, Const) and b.value is True:
            return a
        return condition if a is condition.a and b is condition.b else logical_and(a, b)
    return condition


def _product_floor(expr) -> int | None:
    """The least value of ``expr`` when every dim is at least 1, if it is a product of dims and positive
    integer constants (else None: nothing is known)."""
    if isinstance(expr, DimVar):
        return 1
    if isinstance(expr, Const):
        return expr.value if dtype_kind(expr.dtype) in "iu" and expr.value >= 1 else None
    if isinstance(expr, Binary) and expr.op == "mul":
        a, b = _product_floor(expr.a), _product_floor(expr.b)
        return None if a is None or b is None else a * b
    return None


def _lower_variant(prim, name: str, graph, impl: Implementation):
    from .fused import build_graph

    try:
        static = {_key(graph, d): int(v) for d, v in impl.static_dims.items()}
        multiples = {_key(graph, d): int(m) for d, m in impl.multiples.items()}
        variant = build_graph(prim, name, static, multiples)
        return lower_parts(name, variant.inputs, variant.outputs, variant.multiples)
    except TensorVMError:  # e.g. a static value the computes reject: the generic kernel reports it
        return None


def _key(graph, dim):
    key = graph.dim_key(dim)
    if key is None:
        raise UnsupportedError(f"strategy: {dim!r} is not a dim of the kernel's parameters")
    return key


# ---- external variants -----------------------------------------------------------------------------


class _Replace(ExprMutator):
    def __init__(self, target, replacement):
        super().__init__()
        self.target, self.replacement = target, replacement

    def visit_call(self, call):
        if call is self.target:
            return self.replacement
        return super().visit_call(call)


def _contiguous_strides(shape) -> tuple:
    strides, step = [], const(1, INDEX_DTYPE)
    for extent in reversed(shape):
        strides.append(step)
        step = step * index_expr(extent)
    return tuple(reversed(strides))


def _operand_view(graph, tensor):
    """``(kernel input position, strides, contiguous)`` when ``tensor`` is a kernel input or a chain of
    transposes and reshapes of one (its elements then lie in that input at these element strides; a
    reshape only of a contiguous view); else None."""
    if isinstance(tensor.op, PlaceholderOp):
        if tensor not in graph.inputs:
            return None
        return graph.inputs.index(tensor), _contiguous_strides(tensor.shape), True
    producer = next((c for c in graph.calls if any(r is tensor for r in c.results)), None)
    if producer is None or producer.opdef.name not in RESHAPE_ONLY_OPS | {"transpose"}:
        return None
    source = _operand_view(graph, producer.args[0])
    if source is None:
        return None
    position, strides, contiguous = source
    if producer.opdef.name != "transpose":
        return (position, _contiguous_strides(tensor.shape), True) if contiguous else None
    axes = transpose_axes("transpose", producer.attrs, len(strides), UnsupportedError)
    return position, tuple(strides[a] for a in axes), contiguous and axes == tuple(range(len(axes)))


def _strided_gemm(graph, anchor, out_axes: tuple | None = None):
    """The anchor product as a ``StridedGemmCall`` with ``(call, operand positions)``, when an operand is a
    transpose of a kernel input (``_operand_view``) or the result is stored transposed by ``out_axes``,
    and the product is a batched matmul whose batch has at most two dims (other than static ones of 1);
    else None."""
    name = anchor.opdef.name
    if name not in ("onnx.matmul", "nn.batch_matmul") or len(anchor.results) != 1 or len(anchor.args) != 2:
        return None
    views = [_operand_view(graph, arg) for arg in anchor.args]
    if None in views or (out_axes is None and all(not isinstance(arg.op, ComputeOp) for arg in anchor.args)):
        return None
    (pa, sa, _), (pb, sb, _) = views
    a, b = anchor.args
    out = anchor.results[0]
    if out_axes is None:
        sc = _contiguous_strides(out.shape)
    else:  # dim d of the product is dim out_axes.index(d) of the stored (transposed) result
        stored = _contiguous_strides([out.shape[d] for d in out_axes])
        sc = tuple(stored[out_axes.index(d)] for d in range(len(out_axes)))
    if name == "onnx.matmul":
        if a.ndim != b.ndim or a.ndim < 2:
            return None
        batch = [(out.shape[i], sa[i], sb[i], sc[i]) for i in range(a.ndim - 2)]
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        a_rows, a_cols, b_rows, b_cols = sa[-2], sa[-1], sb[-2], sb[-1]
    else:
        ta, tb = anchor.attrs.transpose_a, anchor.attrs.transpose_b
        # a batch of 1 is broadcast: its step is 0
        batch = [(out.shape[0], select(eq(a.shape[0], 1), 0, sa[0]), select(eq(b.shape[0], 1), 0, sb[0]), sc[0])]
        m, k = (a.shape[2], a.shape[1]) if ta else (a.shape[1], a.shape[2])
        n = b.shape[1] if tb else b.shape[2]
        a_rows, a_cols = (sa[2], sa[1]) if ta else (sa[1], sa[2])
        b_rows, b_cols = (sb[2], sb[1]) if tb else (sb[1], sb[2])
    batch = [d for d in batch if not (isinstance(d[0], Const) and d[0].value == 1)]
    if len(batch) > 2:
        return None
    single = (1, 0, 0, 0)  # no batch dim: one entry
    (outer, a0, b0, c0), (inner, a1, b1, c1) = (batch + [single, single])[:2]
    call = StridedGemmCall(index_expr(outer), index_expr(inner), index_expr(m), index_expr(n), index_expr(k),
                           tuple(index_expr(v) for v in (a0, a1, a_rows, a_cols)),
                           tuple(index_expr(v) for v in (b0, b1, b_rows, b_cols)),
                           tuple(index_expr(v) for v in (c0, c1, sc[-2], sc[-1])))
    return call, [pa, pb]


def _anchor_positions(graph, anchor):
    """Where the anchor op's arguments are among the kernel's inputs, or None when one is computed
    inside the group (then no call can take them as they are)."""
    positions = []
    for arg in anchor.args:
        if not isinstance(arg, Tensor) or not isinstance(arg.op, PlaceholderOp) or arg not in graph.inputs:
            return None
        positions.append(graph.inputs.index(arg))
    if len(anchor.results) != 1 or isinstance(anchor.out_type, TupleType):
        return None
    return positions


def _epilogue_function(prim: Function, anchor):
    """The rest of the group once the anchor op's result is given: ``(function, input positions)`` with
    the result as the function's first parameter, followed by the parameters of ``prim`` it reads
    (``input positions``: their flattened positions among the kernel's inputs); None when the group
    is the anchor op alone."""
    from .fused import _flatten_types, _param_type

    result_var = Var("op_result", anchor.out_type)
    body = _Replace(anchor.call, result_var).visit(prim.body)
    if body is result_var:
        return None
    used = set(free_vars(body))
    params = [p for p in prim.params if p in used]
    offsets, offset = {}, 0
    for p in prim.params:
        offsets[p] = offset
        offset += len(_flatten_types(_param_type(p)))
    positions = []
    for p in params:
        positions += list(range(offsets[p], offsets[p] + len(_flatten_types(_param_type(p)))))
    return Function([result_var] + params, body, prim.ret_type, attrs=prim.attrs), positions


def _external_plan(prim: Function, name: str, graph, anchor, impl: Implementation):
    """The external variant ``impl`` of the anchor op, with the rest of the group as an epilogue."""
    from .fused import plan_primitive

    positions = _anchor_positions(graph, anchor)
    if positions is None:
        return None
    result = anchor.results[0]
    epilogue = epilogue_name = None
    epilogue_inputs, inplace = [], False
    split = _epilogue_function(prim, anchor)
    if split is not None:
        epilogue_fn, epilogue_inputs = split
        epilogue_name = f"{name}_epilogue"
        try:
            epi = plan_primitive(epilogue_fn, epilogue_name, externals=False)
        except TensorVMError:
            return None
        inplace = _elementwise_of_first_input(epi.graph)
        epilogue = epi.lowered
        if inplace:  # the kernel will read and write the same buffer: no restrict on its pointers
            epilogue.func = dataclasses.replace(epilogue.func, restrict=False)
    return ExternalPlan(impl.name, as_expr(impl.condition), impl.external, anchor.attrs, positions,
                        tuple(result.shape), result.dtype, epilogue, epilogue_name, epilogue_inputs, inplace,
                        None if impl.work is None else as_expr(impl.work), impl.min_work)


def _call_variant(prim: Function, name: str, graph, generic: LoweredParts, anchor, impl: Implementation):
    """The kernel with its anchor op computed by a C library function (``impl.call``: ``tv_gemm_*``, BLAS
    from C, ``tv_softmax_f32``...) and the rest of the group lowered after it, in the same function: the
    op's result goes to the output when the group is the op alone or the rest is elementwise over it
    (then computed in place), else to a temporary."""
    from .fused import build_graph

    positions = _anchor_positions(graph, anchor)
    call = impl.call
    split = _epilogue_function(prim, anchor)
    if call.rest_elementwise and split is not None:
        try:
            if not _elementwise_of_first_input(build_graph(split[0], f"{name}_epilogue")):
                return None
        except TensorVMError:
            return None
    out_axes = _transposed_result(split)
    if isinstance(call, GemmCall) and (positions is None or out_axes is not None):
        # operands that are transposes read in place, a transposed result written in place
        strided = _strided_gemm(graph, anchor, out_axes)
        if strided is not None:
            call, positions = strided
            if out_axes is not None:
                split = None  # the product stores the group's output itself
    result = anchor.results[0] if anchor.results else None
    if positions is None or result.dtype not in GEMM_SUFFIX:
        return None
    scale = _scale_after(split, anchor) if isinstance(call, (GemmCall, StridedGemmCall)) else None
    if scale is not None:  # BLAS's alpha: no pass over the product afterwards
        call, split = dataclasses.replace(call, alpha=scale), None
    args = [generic.params[p] for p in positions]
    if any(a.dtype != result.dtype for a in args):
        return None
    outputs = generic.params[generic.num_inputs:]

    def gemm_into(target):
        return call.statement(args, target, GEMM_SUFFIX[result.dtype])

    fused = _tile_epilogue_call(call, split, args, generic, outputs, anchor) if split is not None else None
    if fused is not None and fused[1] is None:
        body = fused[0]
    elif split is None:
        if len(outputs) != 1 or outputs[0].dtype != result.dtype:
            return None
        body = gemm_into(outputs[0])
    else:
        epilogue_fn, epilogue_inputs = split

        def product_then_epilogue(target, epi):
            parts = lower_parts(name, epi.inputs, epi.outputs)
            constant_params = parts.params[1 + len(epilogue_inputs):parts.num_inputs]
            buffer_map = {parts.params[0]: target}
            for epi_param, position in zip(parts.params[1:], epilogue_inputs):
                buffer_map[epi_param] = generic.params[position]
            for epi_param, position in zip(constant_params, constant_positions):
                buffer_map[epi_param] = generic.params[position]
            for epi_param, out in zip(parts.params[parts.num_inputs:], outputs):
                buffer_map[epi_param] = out
            param_map = {v: buffer_map[parts.params[pos]].shape[axis]
                         for v, (pos, axis) in zip(parts.dim_params, parts.dim_positions)}
            return seq(gemm_into(target), rebind(parts, param_map, buffer_map))

        try:
            epi = build_graph(epilogue_fn, f"{name}_epilogue")
            constant_positions = [_constant_position(graph, source) for source in epi.builder.constant_sources]
            if None in constant_positions:
                return None
            if _elementwise_of_first_input(epi):
                body = product_then_epilogue(outputs[0], epi)
            else:
                product = Buffer("product", result.dtype, tuple(result.shape), "local")
                body = Allocate(product, product_then_epilogue(product, epi))
                if _elementwise_of_first_input(epi, same_shape_at_run_time=True):
                    # broadcasting over dynamic dims: in place whenever the output has the product's shape
                    # (a second copy of the epilogue, from a fresh graph: each copy binds its dims once)
                    same = const(True)
                    for a, b in zip(outputs[0].shape, result.shape):
                        same = logical_and(same, eq(a, b))
                    in_place = product_then_epilogue(outputs[0], build_graph(epilogue_fn, f"{name}_epilogue"))
                    body = IfThenElse(same, in_place, body)
        except TensorVMError:
            return None
        if fused is not None:  # (the tiles' epilogue where the residual has the output's shape)
            body = IfThenElse(fused[1], fused[0], body)
    return LoweredParts(name, generic.params, generic.num_inputs, generic.dim_params, generic.dim_positions,
                        [], [], body)


def _scale_after(split, anchor) -> float | None:
    """The factor when the rest of the group (``split``, from ``_epilogue_function``) is the anchor's result
    times a scalar constant of its dtype (attention's 1/sqrt(d) after Q K^T); else None."""
    if split is None:
        return None
    fn, _ = split
    body, result = fn.body, fn.params[0]
    if not (is_op_call(body, "multiply") and len(body.args) == 2
            and result in body.args):
        return None
    factor = body.args[1] if body.args[0] is result else body.args[0]
    out = anchor.out_type
    if not isinstance(factor, Constant) or factor.data.size != 1 or factor.data.dtype != out.dtype \
            or factor.data.ndim > len(out.shape):  # (a factor of higher rank would broadcast the result)
        return None
    return float(factor.data.reshape(()))


def _transposed_result(split) -> tuple | None:
    """The axes when the rest of the group (``split``, from ``_epilogue_function``) is one transpose of the
    anchor's result keeping its last axis last (FuseOps' ``_product_writes_in_place``); else None."""
    if split is None:
        return None
    fn, _ = split
    body = fn.body
    if not (is_op_call(body, "transpose")
            and len(fn.params) == 1 and body.args[0] is fn.params[0]):
        return None
    ndim = len(fn.params[0].type_annotation.shape)
    axes = transpose_axes("transpose", get_op("transpose").normalize_attrs(body.attrs), ndim, UnsupportedError)
    return axes if axes[-1] == ndim - 1 else None


def _tile_epilogue_call(call, split, args: list, generic: LoweredParts, outputs: list, anchor):
    """The direct convolution or the packed product writing the group's output itself, when the rest of the
    group (``split``, from ``_epilogue_function``) is a ``TileEpilogue`` it applies: ``(statement,
    condition)``, the condition (or None) under which it computes the group (a residual's dynamic dims equal
    to the output's, else it would broadcast, and then the product's too); else None."""
    from .fused import _flatten_types, _param_type

    if len(outputs) != 1 or outputs[0].dtype != "float32" or anchor.results[0].dtype != "float32":
        return None
    epilogue_fn, epilogue_inputs = split
    residual = None
    if isinstance(call, PackedGemmCall):
        found = product_epilogue(epilogue_fn, anchor.out_type) if PRODUCT_EPILOGUE else None
        if found is None:
            return None
        match, residual = found[:2], found[2]
    elif isinstance(call, Conv2dCall) and call.direct("f32"):
        channels = anchor.out_type.shape[1]
        match = tile_epilogue(epilogue_fn, channels) if isinstance(channels, int) else None
        if match is None and isinstance(channels, int):
            found = activation_epilogue(epilogue_fn, anchor.out_type)
            if found is not None:
                match, residual = found[:2], found[2]
        if match is None or ((call.depthwise or call.packed or call.pointwise("f32")) and match[0].pool):
            return None
    else:
        return None
    epilogue, bias = match
    buffers = list(args)

    def buffer_of(param):
        offset = 0  # the parameter's flattened position among the epilogue's inputs
        for candidate in epilogue_fn.params[1:]:
            if candidate is param:
                break
            offset += len(_flatten_types(_param_type(candidate)))
        buffers.append(generic.params[epilogue_inputs[offset]])
        return len(buffers) - 1

    if bias is not None:
        epilogue = dataclasses.replace(epilogue, bias=buffer_of(bias))
    condition, shapes = None, []
    if residual is not None:
        epilogue = dataclasses.replace(epilogue, residual=buffer_of(residual))
        shapes.append(buffers[epilogue.residual].shape)
        if isinstance(call, PackedGemmCall):  # (it stores m x n floats: the output must not broadcast the product)
            shapes.append(anchor.results[0].shape)
    for shape in shapes:
        if len(shape) != len(outputs[0].shape):
            return None
        for a, b in zip(shape, outputs[0].shape):
            if not (isinstance(a, (int, Const)) and isinstance(b, (int, Const))):
                same = eq(a, b)
                condition = same if condition is None else logical_and(condition, same)
            elif int(a.value if isinstance(a, Const) else a) != int(b.value if isinstance(b, Const) else b):
                return None
    return call.statement(buffers, outputs[0], "f32", epilogue), condition


def _constant_position(graph, source) -> int | None:
    """The kernel input holding the constant made from the array ``source``."""
    for index, candidate in enumerate(graph.builder.constant_sources):
        if candidate is source:
            return len(graph.placeholders) + index
    return None


def _elementwise_of_first_input(graph, same_shape_at_run_time: bool = False) -> bool:
    """Whether the graph's single output is, element by element, a function of its first input at the
    same index (so it may be computed in place over that input). With ``same_shape_at_run_time``: given
    that a run-time check found the output's shape equal to the input's (their dims may differ as
    expressions), and counting broadcasting reads ``select(d == 1, 0, i)`` of a tensor whose dim ``d`` is
    the input's as reads at ``i``."""
    if len(graph.outputs) != 1:
        return False
    source, out = graph.inputs[0], graph.outputs[0]
    if out.dtype != source.dtype or len(out.shape) != len(source.shape) \
            or (not same_shape_at_run_time and any(a != b for a, b in zip(out.shape, source.shape))):
        return False
    reads_source: dict = {}

    def depends_on_source(tensor) -> bool:  # (values not computed from the source may be read anywhere)
        if tensor is source:
            return True
        if not isinstance(tensor.op, ComputeOp):
            return False
        if tensor.op not in reads_source:
            reads_source[tensor.op] = False
            reads_source[tensor.op] = any(depends_on_source(n.tensor) for body in tensor.op.bodies
                                          for n in walk(body) if hasattr(n, "tensor"))
        return reads_source[tensor.op]

    stack, seen = [out.op], set()
    while stack:
        op = stack.pop()
        if op in seen or not isinstance(op, ComputeOp):
            continue
        seen.add(op)
        if op.is_reduction or len(op.axes) != len(source.shape):
            return False
        axes = [a.var for a in op.axes]
        for body in op.bodies:
            for node in walk(body):
                if not hasattr(node, "tensor"):
                    continue
                producer = node.tensor
                if depends_on_source(producer):
                    if len(node.indices) != len(axes) or not all(
                            _same_position(i, a, d) or (same_shape_at_run_time and _unit_broadcast_read(i, a, d))
                            for i, a, d in zip(node.indices, axes, source.shape)):
                        return False
                    stack.append(producer.op)
    return True


def _same_position(index, axis, extent) -> bool:
    """Whether reading at ``index`` along an axis of ``extent`` is reading at the axis variable itself
    (a broadcast read of a unit dim uses 0, which is the only value of the axis)."""
    if index is axis:
        return True
    return isinstance(index, Const) and index.value == 0 and isinstance(extent, Const) and extent.value == 1


def _unit_broadcast_read(index, axis, extent) -> bool:
    """Whether ``index`` is ``select(extent == 1, 0, axis)``: a read that broadcasts a dim of run-time
    extent (at ``axis`` itself when the extent equals the output's)."""
    return (isinstance(index, Select) and index.false_value is axis and isinstance(index.true_value, Const)
            and index.true_value.value == 0 and index.cond == eq(extent, 1))


# ---- te expressions as Python -----------------------------------------------------------------------

_PY_BINARY = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "floormod": "%", "eq": "==", "ne": "!=",
              "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "and": "and", "or": "or", "xor": "!=",
              "bitand": "&", "bitor": "|", "bitxor": "^", "shl": "<<", "shr": ">>"}


def _py(expr: PrimExpr, sources: dict) -> str:
    if isinstance(expr, Const):
        return repr(expr.value)
    if isinstance(expr, DimVar):
        if expr not in sources:
            raise UnsupportedError(f"strategy: the dim {expr.name} is not bound by a kernel parameter")
        position, axis = sources[expr]
        return f"a[{position}].shape[{axis}]"
    if isinstance(expr, Binary):
        a, b = _py(expr.a, sources), _py(expr.b, sources)
        if expr.op in ("min", "max"):
            return f"{expr.op}({a}, {b})"
        if expr.op in ("truncdiv", "truncmod"):
            return f"_{expr.op}({a}, {b})"
        if expr.op in _PY_BINARY:
            return f"({a} {_PY_BINARY[expr.op]} {b})"
    if isinstance(expr, Unary):
        return f"({ {'neg': '-', 'not': 'not ', 'bitnot': '~'}[expr.op]}{_py(expr.a, sources)})"
    if isinstance(expr, Select):
        return f"({_py(expr.true_value, sources)} if {_py(expr.cond, sources)} else {_py(expr.false_value, sources)})"
    if isinstance(expr, Cast) and dtype_kind(expr.dtype) in "iub":
        return f"{'bool' if expr.dtype == 'bool' else 'int'}({_py(expr.value, sources)})"
    raise UnsupportedError(f"strategy: cannot evaluate {expr!r} in Python")


def _truncdiv(a, b):
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _truncmod(a, b):
    return a - b * _truncdiv(a, b)


def _dim_sources(generic: LoweredParts) -> dict:
    """Where each dim symbol and dim parameter of the generic kernel is read from (kernel positions)."""
    sources = dict(zip(generic.dim_params, generic.dim_positions))
    for symbol, value in generic.lets:
        if value in sources:
            sources[symbol] = sources[value]
    return sources


# ---- the Python dispatcher --------------------------------------------------------------------------


class DispatchKernel:
    """A kernel with external variants: ``kernel(*in_arrays, *out_arrays)`` runs the first external
    variant whose condition holds on these arrays, else the C kernel (``self.kernel``, which dispatches
    among its C variants itself). Same interface as ``FusedKernel`` (``bind``, ``variants``,
    ``select_variant``, ``source``).

    Each external variant has one generated Python test (``_accepts``): the arrays are exact ndarrays
    of the kernel's dtypes, ranks and static dims, C-contiguous (outputs writeable), the kernel's entry
    checks hold and the variant's condition holds. Anything else goes to the C kernel, which raises the
    precise error for bad arrays.
    """

    def __init__(self, kernel, plan: KernelPlan, module, c_call=None):
        from .fused import FusedKernel

        self.kernel = kernel
        self._c_call = c_call or kernel
        self.name = kernel.name
        self.num_inputs = kernel.num_inputs
        self.num_outputs = kernel.num_outputs
        self._plan = plan
        self._externals = []
        for ext in plan.externals:
            epilogue = None
            if ext.epilogue is not None:
                epilogue = FusedKernel(module[ext.epilogue.func.name], ext.epilogue)
            accepts, shape = _compile_test(plan, ext, kernel)
            self._externals.append((ext, accepts, _runner(ext, epilogue, shape, kernel), epilogue))
        self.variants = tuple(e.name for e, *_ in self._externals) + tuple(kernel.variants)

    @property
    def source(self) -> str:
        parts = [self.kernel.source]
        parts += [epilogue.source for *_, epilogue in self._externals if epilogue is not None]
        return "\n".join(parts)

    def _choose(self, arrays: tuple):
        """The external variant for ``arrays``, or None for the C kernel."""
        for entry in self._externals:
            try:
                if entry[1](arrays):
                    return entry
            except Exception:  # noqa: BLE001 - odd arguments: the C kernel explains them
                return None
        return None

    def __call__(self, *arrays):
        for _, accepts, run, _ in self._externals:
            try:
                chosen = accepts(arrays)
            except Exception:  # noqa: BLE001 - odd arguments: the C kernel explains them
                break
            if chosen:
                return run(arrays)
        return self._c_call(*arrays)

    def bind(self, *arrays):
        """A zero-argument call on ``arrays``: the variant is chosen once, now."""
        entry = self._choose(arrays)
        if entry is None:
            return self.kernel.bind(*arrays)
        return functools.partial(entry[2], arrays, True)

    def select_variant(self, *arrays) -> str:
        entry = self._choose(arrays)
        return entry[0].name if entry is not None else self.kernel.select_variant(*arrays)

    def __repr__(self):
        return f"<DispatchKernel {self.name}: variants {', '.join(self.variants)}>"


class _ThreadControl(NamedTuple):
    get: object  # () -> int, or None when the host BLAS has no thread control
    set: object  # (int) -> None


def _blas_threads() -> _ThreadControl:
    """The host BLAS's thread count controls (found once, by ``blas.host_blas``)."""
    host = blas.host_blas()
    return _ThreadControl(host.get_threads, host.set_threads) if host is not None else _ThreadControl(None, None)


@contextlib.contextmanager
def blas_single_thread():
    """BLAS on the calling thread only, for the duration of the block.

    Measured on 2 cores: once OpenBLAS has run on its own worker threads, those spin for a long time
    after each call, and the generated kernels' OpenMP loops (on the same cores) slow down about 10x
    (a 128x768 layer norm: 27 us alone, 570 us next to 2-thread BLAS, 60 us next to 1-thread BLAS).
    """
    control = _blas_threads()
    previous = control.get() if control.get is not None else 1
    if previous != 1:
        control.set(1)
    try:
        yield
    finally:
        if previous != 1:
            control.set(previous)


def _work_scale() -> int:
    """How much more work an external variant needs with the kernels' current thread count:
    ``rules().blas_thread_factor`` per extra thread, or never (when the kernels run in parallel and NumPy's
    BLAS cannot be kept off their cores)."""
    threads = min(kernel_threads(), 16)
    if threads > 1 and _blas_threads().get is None:
        return 1 << 62
    return rules().blas_thread_factor ** (threads - 1)


def _compile_test(plan: KernelPlan, ext: ExternalPlan, kernel):
    """(accepts(arrays) -> bool, result_shape(arrays) -> tuple) over the user's arrays (inputs, outputs)."""
    func = kernel.kernel.func
    num_constants = func.num_inputs - kernel.num_inputs

    def user_position(position: int) -> int:
        if kernel.num_inputs <= position < func.num_inputs:
            raise UnsupportedError("strategy: a constant input has no run-time dims")
        return position if position < kernel.num_inputs else position - num_constants

    sources = {v: (user_position(p), axis) for v, (p, axis) in _dim_sources(plan.generic).items()}
    clauses = [_py(ext.condition, sources)]  # first: a call that stays in C pays for this test only
    for position, buf in enumerate(func.params):
        if kernel.num_inputs <= position < func.num_inputs:
            continue
        a = f"a[{user_position(position)}]"
        clauses += [f"type({a}) is _ndarray", f"{a}.dtype == _dtype({buf.dtype!r})", f"{a}.ndim == {len(buf.shape)}",
                    f"{a}.flags.c_contiguous"]
        clauses += [f"{a}.shape[{axis}] == {d.value}" for axis, d in enumerate(buf.shape) if isinstance(d, Const)]
        if position >= func.num_inputs:
            clauses.append(f"{a}.flags.writeable")
    clauses += [_py(c, sources) for c, _ in plan.generic.checks]
    if ext.work is not None:  # the generated kernels scale with threads, single-threaded BLAS does not
        clauses.append(f"{_py(ext.work, sources)} >= {int(ext.min_work)} * _work_scale()")
    count = len(func.params) - num_constants
    scope = {"__builtins__": {}, "min": min, "max": max, "int": int, "bool": bool, "type": type, "len": len,
             "_truncdiv": _truncdiv, "_truncmod": _truncmod, "_ndarray": np.ndarray, "_dtype": np.dtype,
             "_work_scale": _work_scale}
    accepts = eval(compile(f"lambda a: len(a) == {count} and " + " and ".join(clauses),  # noqa: S307
                           "<tensorvm strategy>", "eval"), scope)
    shape = eval(compile("lambda a: (" + "".join(_py(d, sources) + ", " for d in ext.result_shape) + ")",  # noqa: S307
                         "<tensorvm strategy>", "eval"), scope)
    return accepts, shape


def _runner(ext: ExternalPlan, epilogue, shape, kernel):
    """``run(arrays, keep_temporary=False)``: the external call and the epilogue on checked arrays."""
    constants = kernel._constants
    num_inputs = kernel.num_inputs
    sources = [(False, p) if p < num_inputs else (True, p - num_inputs) for p in ext.inputs]
    external, attrs, dtype = ext.run, ext.attrs, np.dtype(ext.result_dtype)
    in_place = epilogue is None or ext.inplace
    epilogue_inputs = tuple(ext.epilogue_inputs)
    kept = {}

    def run(arrays, keep_temporary=False):
        outputs = arrays[num_inputs:]
        operands = [constants[p] if is_constant else arrays[p] for is_constant, p in sources]
        if in_place:
            target = outputs[0]
        elif keep_temporary:  # a bound call reuses its temporary
            target = kept.get("t")
            if target is None:
                target = kept["t"] = np.empty(shape(arrays), dtype)
        else:
            target = np.empty(shape(arrays), dtype)
        if kernel_threads() > 1:
            with blas_single_thread():
                external(attrs, *operands, out=target)
        else:
            external(attrs, *operands, out=target)
        if epilogue is not None:
            epilogue(target, *(arrays[i] for i in epilogue_inputs), *outputs)

    return run


# ---- the matmul family -----------------------------------------------------------------------------


def _prod(dims):
    total = const(1)
    for d in dims:
        total = total * d
    return total


def matmul_implementations(rows, n, k, inputs, out_type, external, gemm=None) -> list:
    """BLAS when big enough (called from C when the host BLAS allows it, else through NumPy), a
    vector-friendly C variant when the inner dims are dynamic multiples."""
    impls = []
    dtypes = {t.dtype for t in inputs} | {out_type.dtype}
    blas_mode = blas.mode()
    if len(dtypes) == 1 and dtypes <= set(GEMM_SUFFIX) and blas_mode != "off":
        if gemm is not None and blas_mode == "c":
            work = _prod([gemm.call.batch, gemm.call.m, gemm.call.n, gemm.call.k])
            condition = work >= gemm_min_work()
            if gemm.condition is not None:
                condition = logical_and(gemm.condition, condition)
            impls.append(Implementation("blas", condition, plevel=20, call=gemm.call))
        elif external is not None:  # (also in mode "c" for a product the bridge does not cover)
            host_rules = rules()
            static = isinstance(n, Const) and isinstance(k, Const)
            min_flops = host_rules.blas_min_flops if static else host_rules.blas_min_flops_dynamic
            impls.append(Implementation("blas", rows >= host_rules.blas_min_rows, plevel=20, external=external,
                                        work=_prod([rows, n, k]), min_work=min_flops))
    host_rules = rules()
    multiples = {d: m for d, m in ((n, host_rules.vector_width), (k, host_rules.reduction_width))
                 if isinstance(d, DimVar)}
    if multiples:
        condition = const(True)
        for d, m in multiples.items():
            condition = logical_and(condition, eq(floormod(d, m), 0))
        impls.append(Implementation("vec", condition, plevel=10, multiples=multiples))
    return impls


@dataclass(frozen=True)
class _Gemm:
    """A GemmCall and the condition on the dims under which it computes the op (None: always)."""

    call: GemmCall
    condition: object = None


def index_expr(value) -> PrimExpr:
    """``value`` as an index-typed te expression (the C helpers take int64 dims)."""
    return cast(as_expr(value), INDEX_DTYPE)


def gemm_call(batch, m, n, k, a_step, ta, b_step, tb, condition=None) -> _Gemm:
    return _Gemm(GemmCall(0, 1, index_expr(batch), index_expr(m), index_expr(n), index_expr(k), index_expr(a_step), int(ta),
                          index_expr(b_step), int(tb)), condition)
