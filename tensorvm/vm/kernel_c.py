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
primitive is called). A library whose kernels are all plain C kernels and whose shape functions are all C
is also described (``CLibrary.abi``: ``kernel_abi.LibraryABI``) and recorded in the kernel cache's index,
so a saved executable can run on it without the compiler (docs/deploy.md). Otherwise loading a saved
executable regenerates the C from the primitive functions' Relay text with this same code generator
(never compiling or loading code taken from the file), so an unchanged program is a cache hit and costs
no compile.
"""

from __future__ import annotations

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
    # How to call the library without the compiler (``kernel_abi.LibraryABI``, and its encoding, which a saved
    # file carries), or None with ``abi_missing`` saying why it cannot be described.
    abi: object = None
    abi_payload: bytes | None = None
    abi_missing: str = ""
    origin: str = "compiled"  # "compiled" (by the code generator) | "kernel cache" | "embedded" (prebuilt)
    load_reason: str = ""  # loaded executables: why the prebuilt library was (not) used
    library_path: str | None = None

    def summary(self) -> dict:
        from ..runtime.library import library_threads

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
            "library": self.library_path,
            "origin": self.origin,
            "load_reason": self.load_reason,
            "saved_source_matches": self.saved_source_matches,
            "threads": library_threads(self.library_path) if self.library_path else 1,  # what its OpenMP loops use
        }


def build_c_library(prims: dict, shape_prims: dict | None = None) -> CLibrary:
    """Compile ``{primitive name: primitive Function}`` into one library (NumPy for what C cannot do),
    with the C shape functions ``{shape function name: (primitive Function, is_input)}``."""
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
    if plans or shape_specs:
        _compile(library, plans, shape_specs)
    missing = set(prims) - set(library.kernels)
    if missing:  # pragma: no cover - every primitive is either compiled or a fallback
        raise UnsupportedError(f"no kernel was built for {sorted(missing)}")
    return library


def _compile(library: CLibrary, plans: dict, shape_specs: dict) -> None:
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
    module = build_module(funcs, extra_source=shape_source)
    library.source = module.source
    library.build_info = module.build_info
    library.library_path = module.build_info.path
    abis = {}
    for name, spec in shape_specs.items():
        library.shape_funcs[name] = (spec, module.library.function(spec.name, 3, 0))
    for name, plan in plans.items():
        kernel = plan.make_kernel(module)
        func = plan.lowered.func
        library.sources[name] = kernel.source
        fast = None
        if plan.externals:  # (a kernel with a BLAS variant picks it in Python, per call)
            library.abi_missing = f"kernel {name} picks a BLAS variant in Python"
        else:
            abi = _kernel_abi(name, func, tuple(plan.lowered.constants), kernel.kernel._errors)
            entry = module.library.function(func.name, len(func.params), len(func.dim_params))
            if abi is None:
                library.abi_missing = f"kernel {name} has a calling convention the fast caller does not know"
            else:
                abis[name] = abi
                fast = caller_for(abi, ctypes.cast(entry, ctypes.c_void_p).value, kernel)
        library.kernels[name] = fast if fast is not None else kernel
    if library.fallbacks:
        library.abi_missing = f"kernel {next(iter(library.fallbacks))} runs on NumPy"
    elif library.shape_fallbacks:
        library.abi_missing = f"shape function {next(iter(library.shape_fallbacks))} runs in Python"
    if not library.abi_missing:
        _describe(library, abis, shape_specs)


def _kernel_abi(name: str, func, constants: tuple, errors: dict):
    """The ``KernelABI`` of a compiled kernel (None if its dims are not passed in buffer, axis order)."""
    from ..codegen.c_emit import RUNTIME_ERRORS
    from ..te.expr import Const
    from .kernel_abi import KernelABI

    buffers = tuple((str(buf.dtype), len(buf.shape), tuple((axis, int(d.value)) for axis, d in enumerate(buf.shape)
                                                            if isinstance(d, Const))) for buf in func.params)
    abi = KernelABI(name, func.name, func.num_inputs, buffers, constants,
                    tuple((int(code), str(message), code in RUNTIME_ERRORS) for code, message in sorted(errors.items())))
    return abi if len(abi.dim_positions()) == len(func.dim_params) else None


def _describe(library: CLibrary, kernels: dict, shape_specs: dict) -> None:
    """Set ``library.abi`` (with its manifest) and record it in the kernel cache's index, so that a saved
    executable can find and call this library without the compiler (``kernel_abi.prebuilt_library``)."""
    import hashlib
    from pathlib import Path

    from ..codegen.build import _atomic_write, find_toolchain
    from ..runtime.library import cpu_features, hash_path, target_triple
    from .kernel_abi import LibraryABI, LibraryManifest, cache_index_key
    from .serialize import encode_abi

    info = library.build_info
    toolchain = find_toolchain()
    try:
        library_sha256 = hash_path(Path(info.path)).read_text().strip()
        size = Path(info.path).stat().st_size
    except OSError as err:
        library.abi_missing = f"the built library cannot be read: {err}"
        return
    features = cpu_features(override=False) if "-march=native" in info.flags else ()  # what -march=native used
    manifest = LibraryManifest(hashlib.sha256(library.source.encode()).hexdigest(), toolchain.compiler,
                               toolchain.version, tuple(info.flags), target_triple(), features, library_sha256, size)
    library.abi = LibraryABI(manifest, kernels, {name: spec for name, spec in shape_specs.items()})
    library.abi_payload = encode_abi(library.abi)
    index = Path(info.path).with_name(f"tvx_{cache_index_key(library.abi_payload, manifest)}.txt")
    try:
        if not index.exists():
            _atomic_write(index, f"{Path(info.path).name} {library_sha256}\n".encode())
    except OSError as err:  # a read-only cache: the library is used, only not found again without the compiler
        library.abi_missing = f"cannot record the library in the kernel cache: {err}"
