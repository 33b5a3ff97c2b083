"""Kernels for target "c": the executable's primitive functions compiled into one shared library.

``build_c_library(prims)`` lowers every primitive function that is called as a kernel with
``tensorvm.codegen`` (one fused loop nest per primitive, or a call of the C library function an opaque
op names, e.g. ``sort``: ``tensorvm.codegen.library``), emits them into one C translation unit
(split into a few units compiled in parallel for big modules), and builds it through the on-disk cache
of ``tensorvm.codegen.build`` (the cache key is a hash of the source, so the same program compiles once
per machine). A primitive the C generator cannot handle (an op with neither a tensor-expression compute
nor a library call, or a construct the lowering rejects) runs its NumPy kernel instead; the
reason is kept in ``CLibrary.fallbacks`` and shown by ``exe.stats()``. The shape functions the bytecode
calls (``vm.shape_func``) are C functions of the same library, traced from the ops' shape logic
(``tensorvm.vm.shape_c``); one whose primitive holds an op without a traceable logic stays Python
(``CLibrary.shape_fallbacks``, shown by ``exe.stats()``).

Each C function is named ``tvk<index>_<primitive name>`` (a valid, unique C identifier whatever the
primitive is called). Loading a saved executable regenerates the C from the primitive functions' Relay
text with this same code generator (never compiling or loading code taken from the file), so an
unchanged program is a cache hit and costs no compile.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass, field

from ..errors import TensorVMError, UnsupportedError

__all__ = ["CLibrary", "build_c_library", "c_kernel_name"]


def c_kernel_name(index: int, prim_name: str) -> str:
    """The C function name of the ``index``-th compiled primitive."""
    clean = re.sub(r"\W", "_", prim_name).strip("_")[:60]
    return f"tvk{index}_{clean}" if clean else f"tvk{index}"


@dataclass
class CLibrary:
    """The kernels of one executable for target "c".

    ``kernels`` maps primitive name -> callable ``kernel(*ins, *outs)`` (a compiled C kernel, or the
    NumPy kernel for a fallback); ``sources`` maps primitive name -> the C source of its function;
    ``fallbacks`` maps primitive name -> why it runs on NumPy; ``source`` is the whole library's C
    text; ``build_info`` comes from ``tensorvm.codegen.build`` (``cached``, ``compile_seconds``) and
    ``lower_seconds`` is the time spent lowering and emitting C.
    """

    kernels: dict = field(default_factory=dict)
    sources: dict = field(default_factory=dict)
    fallbacks: dict = field(default_factory=dict)
    source: str = ""
    build_info: object = None
    lower_seconds: float = 0.0
    saved_source_matches: bool | None = None  # loaded executables: does the file's C equal the regenerated C
    shape_funcs: dict = field(default_factory=dict)  # shape function name -> (ShapeFuncC, C function)
    shape_fallbacks: dict = field(default_factory=dict)  # shape function name -> why it stays Python
    native: object = None  # exec_mode="native": the NativeLibrary of the VM functions compiled in (native_emit)

    def summary(self) -> dict:
        from ..codegen.build import library_threads

        info = self.build_info
        return {
            "c_kernels": sorted(self.sources),
            "numpy_fallbacks": dict(sorted(self.fallbacks.items())),
            "c_shape_funcs": sorted(self.shape_funcs),
            "python_shape_funcs": dict(sorted(self.shape_fallbacks.items())),
            "source_bytes": len(self.source),
            "lower_seconds": round(self.lower_seconds, 4),
            "compile_seconds": round(info.compile_seconds, 4) if info is not None else 0.0,
            "cached": bool(info.cached) if info is not None else None,
            "library": info.path if info is not None else None,
            "saved_source_matches": self.saved_source_matches,
            "threads": library_threads(info.path) if info is not None else 1,  # what its OpenMP loops use now
            # exec_mode="native": bytes of the generated C of the VM functions (part of the library)
            "native_source_bytes": len(self.native.source) if self.native is not None else None,
        }


def build_c_library(prims: dict, shape_prims: dict | None = None, native=None) -> CLibrary:
    """Compile ``{primitive name: primitive Function}`` into one library (NumPy for what C cannot do),
    with the C shape functions ``{shape function name: (primitive Function, is_input)}``. ``native``: an
    executable whose VM functions are compiled into the library too (exec_mode="native"; its kernels keep
    their C variants but not the external ones, which are picked in Python per call, and anything without
    C is an ``UnsupportedError``)."""
    from ..codegen.c_emit import emit_kernel
    from ..codegen.fused import plan_primitive
    from .kernel_python import build_kernel
    from .shape_c import emit_shape_func

    library = CLibrary()
    start = time.perf_counter()
    plans = {}
    for index, (name, prim) in enumerate(prims.items()):
        try:
            plan = plan_primitive(prim, c_kernel_name(index, name))
            if native is not None:  # external variants are picked in Python per call: native code calls C only
                plan = dataclasses.replace(plan, externals=[])
            for func in [plan.lowered.func] + [e.epilogue.func for e in plan.externals if e.epilogue is not None]:
                emit_kernel(func)  # emission problems surface here, per kernel, not for the whole library
        except (TensorVMError, NotImplementedError) as err:
            # (UnsupportedError: no compute for an op; other codegen errors: a construct it cannot lower)
            library.fallbacks[name] = f"{type(err).__name__}: {err}"
            library.kernels[name] = build_kernel(prim)
            continue
        plans[name] = plan
    shape_specs = {}
    for index, (name, (prim, is_input)) in enumerate((shape_prims or {}).items()):
        try:
            shape_specs[name] = emit_shape_func(prim, is_input, c_kernel_name(index, name).replace("tvk", "tvs", 1))
        except (TensorVMError, NotImplementedError) as err:
            library.shape_fallbacks[name] = f"{type(err).__name__}: {err}"
    library.lower_seconds = time.perf_counter() - start
    native_source = ""
    if native is not None:
        native_source, library.native = _native_parts(native, plans, shape_specs)
    if plans or shape_specs or native_source:
        _compile(library, plans, shape_specs, native_source)
    missing = set(prims) - set(library.kernels)
    if missing:  # pragma: no cover - every primitive is either compiled or a fallback
        raise UnsupportedError(f"no kernel was built for {sorted(missing)}")
    return library


def _native_parts(exe, plans: dict, shape_specs: dict) -> tuple:
    """The native translation unit of ``exe`` over these kernels and shape functions, and its
    ``NativeLibrary`` (filled in by ``_compile``)."""
    from .native_emit import NativeKernel, emit_program
    from .native_mode import NativeLibrary

    kernels, shape_funcs, constants = {}, {}, []
    first = len(exe.constants)
    for p, info in enumerate(exe.primitives):
        if info.kind == "kernel" and info.source in plans:
            lowered = plans[info.source].lowered
            kernels[p] = NativeKernel(lowered.func, first + len(constants), len(lowered.constants))
            constants.extend(lowered.constants)
        elif info.kind == "shape_func" and info.name in shape_specs:
            shape_funcs[p] = shape_specs[info.name]
    source = emit_program(exe, kernels, shape_funcs)
    return source, NativeLibrary(tuple(constants), kernels, source)


def _compile(library: CLibrary, plans: dict, shape_specs: dict, native_source: str = "") -> None:
    """Build every planned kernel into one library; plain C kernels get the fast caller (``fastcall``)."""
    import ctypes

    from ..codegen.c_emit import library_text
    from ..codegen.module import build_module
    from .fastcall import caller_for
    from .shape_c import SHAPE_LIBRARY

    funcs = [p.lowered.func for p in plans.values()]
    funcs += [e.epilogue.func for p in plans.values() for e in p.externals if e.epilogue is not None]
    shape_source = ""
    if shape_specs:
        shape_source = library_text([SHAPE_LIBRARY]) + "\n".join(s.source for s in shape_specs.values())
    if native_source:
        shape_source += "\n" + native_source
    module = build_module(funcs, extra_source=shape_source)
    library.source = module.source
    library.build_info = module.build_info
    for name, spec in shape_specs.items():
        library.shape_funcs[name] = (spec, module.library.function(spec.name, 3, 0))
    if library.native is not None:
        library.native.attach(module)
    for name, plan in plans.items():
        kernel = plan.make_kernel(module)
        func = plan.lowered.func
        library.sources[name] = kernel.source
        fast = None
        if not plan.externals:  # (a kernel with a BLAS variant picks it in Python, per call)
            entry = module.library.function(func.name, len(func.params), len(func.dim_params))
            fast = caller_for(func, ctypes.cast(entry, ctypes.c_void_p).value, tuple(plan.lowered.constants), kernel)
        library.kernels[name] = fast if fast is not None else kernel
