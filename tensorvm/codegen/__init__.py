"""Kernel generation for target "c": tensor expressions to one loop nest per fused group (``lower``),
printed as C99 (``c_emit``), compiled into cached shared libraries (``build``) and called on NumPy
arrays in destination-passing style (``module``, ``fused``).

    from tensorvm.codegen import build_fused_module
    module, kernels = build_fused_module({"fused_dense_tanh": prim_function})
    kernels["fused_dense_tanh"](x, w, out)      # inputs, then outputs

Kernels may have variants chosen by their dims (``strategy``): C variants behind a generated dispatch
function, and external ones (BLAS through NumPy for large matrix products).
"""

from __future__ import annotations

from .build import BuildInfo, CompilerError, build_stats, find_toolchain, set_num_threads  # noqa: F401
from .fused import FusedKernel, build_fused_kernel, build_fused_module, lower_primitive  # noqa: F401
from .lower import lower  # noqa: F401
from .module import CompiledModule, KernelFunction, build_module  # noqa: F401
from .strategy import DispatchKernel, Implementation, specialize  # noqa: F401
