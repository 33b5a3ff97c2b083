"""Ahead-of-time compilation of static programs to C (issue 6; see ``docs/aot.md``).

``build(mod, name=..., params=...)`` gives an ``AOTModule``: a model C file whose
``tvmgen_<name>_run`` calls the fused kernels in order on a statically planned workspace, a header,
the parameters as ``static const`` arrays, and a descriptor. ``export_model_library_format`` writes
them as a Model Library Format tarball; ``load`` compiles them with ``cc`` and runs them from Python.
``build(mod, name=..., dynamic=True)`` compiles a dynamic program (recursion, ADTs, run-time shapes) to a
standalone C library with a header instead (``DynamicAOTModule``; ``docs/aot_dynamic.md``).
"""

from .build import AOTModule, KernelInfo, StepInfo, TensorInfo, build, runtime_files
from .dynamic import DynamicAOTModule, build_dynamic
from .export import export_model_library_format
from .loader import AOTRunner, compile_library, load, object_sizes

__all__ = ["build", "AOTModule", "DynamicAOTModule", "build_dynamic", "TensorInfo", "KernelInfo", "StepInfo", "runtime_files",
           "export_model_library_format", "load", "AOTRunner", "compile_library", "object_sizes"]
