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

Nothing is lowered twice: each primitive's key (``tensorvm.codegen.signature``: its signature, C name,
the generator's stamp and the codegen settings) finds what this process lowered before
(``signature.PLANS``), and the list of keys names the library, whose manifest in the kernel cache
(``kernel_manifest``) lets another process bind the built library without lowering. Primitives with
the same signature share one kernel.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass, field

from ..errors import TensorVMError, UnsupportedError

__all__ = ["CLibrary", "build_c_library", "c_kernel_name"]


_VARIANT = re.compile(r"/\* variant (\w+) \*/")


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
    text; ``build_info`` comes from ``tensorvm.codegen.build`` (``cached``, ``compile_seconds``, ``portable``) and
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
    aliases: dict = field(default_factory=dict)  # primitive name -> the primitive with the same signature
    reused: int = 0  # kernels not lowered for this build: from this process's memo (``codegen.signature``)
    # or the manifest of the same library built before (``kernel_manifest``)
    python_module: str = ""  # the name of the library's CPython wrapper module ("" without one)
    from_manifest: bool = False  # bound from the manifest of a library built before (``kernel_manifest``)
    # How to call the library without the compiler (``kernel_abi.LibraryABI``, and its encoding, which a saved
    # file carries), or None with ``abi_missing`` saying why it cannot be described.
    abi: object = None
    abi_payload: bytes | None = None
    abi_missing: str = ""
    origin: str = "compiled"  # "compiled" (by the code generator) | "kernel cache" | "embedded" (prebuilt)
    load_reason: str = ""  # loaded executables: why the prebuilt library was (not) used
    library_path: str | None = None
    native: object = None  # exec_mode="native": the NativeLibrary of the VM functions compiled in (native_emit)

    def variant_counts(self) -> dict:
        """How many C kernels have each variant (``direct``, ``blas``, ``generic``...; the names their
        sources give, ``/* variant NAME */``): which implementations the executable's convolutions and
        products can run."""
        counts: dict = {}
        for source in self.sources.values():
            for name in set(_VARIANT.findall(source)):
                counts[name] = counts.get(name, 0) + 1
        return dict(sorted(counts.items()))

    def summary(self) -> dict:
        from ..runtime.library import library_threads

        info = self.build_info
        return {
            "c_kernels": sorted(self.sources),
            "variants": self.variant_counts(),
            "numpy_fallbacks": dict(sorted(self.fallbacks.items())),
            "c_shape_funcs": sorted(self.shape_funcs),
            "python_shape_funcs": dict(sorted(self.shape_fallbacks.items())),
            "source_bytes": len(self.source),
            "lower_seconds": round(self.lower_seconds, 4),
            "kernels_reused": self.reused,  # planned before (this process, or a manifest): not lowered again
            "kernels_shared": dict(sorted(self.aliases.items())),  # same fused group, one kernel
            "from_manifest": self.from_manifest,  # built before (any process): bound without lowering
            "compile_seconds": round(info.compile_seconds, 4) if info is not None else 0.0,
            "cached": bool(info.cached) if info is not None else None,
            # why the library was built without the host flags (-march=native) when they failed; "" if not
            "portable_build": info.portable if info is not None else "",
            "library": self.library_path,
            "origin": self.origin,
            "load_reason": self.load_reason,
            "saved_source_matches": self.saved_source_matches,
            "threads": library_threads(self.library_path) if self.library_path else 1,  # what its OpenMP loops use
            # the pool the library's loops run on (codegen/lib/tv_team.h, the process's one: codegen/pool.py):
            # jobs, chunks run by callers / workers, workers started, which pool
            "product_pool": _pool_stats(self.library_path) if self.library_path else None,
            # exec_mode="native": bytes of the generated C of the VM functions (part of the library)
            "native_source_bytes": len(self.native.source) if self.native is not None else None,
            # exec_mode="native": primitives its C calls back into Python for (PackedFunc index -> why)
            "native_python_callbacks": dict(sorted(self.native.callbacks.items())) if self.native is not None else None,
        }


def _pool_stats(path: str) -> dict | None:
    """What the library's product pool ran so far (None without one: no OpenMP, or no product)."""
    import ctypes

    try:
        stats = ctypes.CDLL(path).tv_team_stats  # (dlopen: the loaded copy)
    except (OSError, AttributeError):
        return None
    stats.argtypes, stats.restype = [ctypes.c_void_p], ctypes.c_int32
    values = (ctypes.c_int64 * 4)()
    stats(values)
    pool_id = ctypes.CDLL(path).tv_team_pool_id
    pool_id.argtypes, pool_id.restype = [], ctypes.c_int64
    # ("pool": which pool; the same for every library of the process that runs on the process's one)
    return {"jobs": values[0], "caller_chunks": values[1], "worker_chunks": values[2], "workers": values[3],
            "pool": int(pool_id())}


def build_c_library(prims: dict, shape_prims: dict | None = None, native=None) -> CLibrary:
    """Compile ``{primitive name: primitive Function}`` into one library (NumPy for what C cannot do),
    with the C shape functions ``{shape function name: (primitive Function, is_input)}``. ``native``: an
    executable whose VM functions are compiled into the library too (exec_mode="native"; its kernels keep
    their C variants but not the external ones, which are picked in Python per call, and anything without
    C is an ``UnsupportedError``; such a library has no manifest: it holds the program too)."""
    from ..codegen.c_emit import emit_kernel
    from ..codegen.fused import plan_primitive
    from ..codegen.signature import (
        PLANS,
        codegen_settings,
        kernel_key,
        op_definitions,
        primitive_ops,
        primitive_signature,
    )
    from . import kernel_manifest
    from .kernel_python import build_kernel
    from .shape_c import emit_shape_func

    library = CLibrary()
    start = time.perf_counter()
    settings = codegen_settings()
    # Every primitive's key first (cheap: its printed text hashed): the same group under two names is
    # one kernel; the memo's keys also hold the ops' definitions as they are now (with identities), and
    # the stable keys, when every op is the package's own and unchanged, name the whole library on disk
    # (``kernel_manifest``).
    definitions: dict = {}

    def keys(prim, signature, c_name, kind="kernel"):
        """(memo key, stable key or None) of a primitive."""
        ops = tuple(sorted(set(primitive_ops(prim))))
        if ops not in definitions:
            definitions[ops] = op_definitions(ops)
        token, stable, portable = definitions[ops]
        return (kernel_key(signature + token.encode(), c_name, settings, kind),
                kernel_key(signature + stable.encode(), c_name, settings, kind) if portable else None)

    keyed, first = {}, {}
    for index, (name, prim) in enumerate(prims.items()):
        signature = primitive_signature(prim)
        if signature in first:  # the same fused group under another name: one kernel for both
            library.aliases[name] = first[signature]
            continue
        first[signature] = name
        c_name = c_kernel_name(index, name)
        keyed[name] = (c_name, *keys(prim, signature, c_name))
    shape_keyed = {}
    for index, (name, (prim, is_input)) in enumerate((shape_prims or {}).items()):
        c_name = c_kernel_name(index, name).replace("tvk", "tvs", 1)
        shape_keyed[name] = (c_name, *keys(prim, primitive_signature(prim) + bytes(map(bool, is_input)), c_name,
                                           "shape"))
    manifest_key = None
    if native is None and all(k[2] is not None for k in [*keyed.values(), *shape_keyed.values()]):
        manifest_key = kernel_manifest.library_key([(n, k[2]) for n, k in keyed.items()],
                                                   [(n, k[2]) for n, k in shape_keyed.items()])

    def plan_of(name):
        """What lowering makes of primitive ``name``: ``(KernelPlan, emitted C)`` or ``(None, why not)``."""
        c_name, key, _ = keyed[name]
        entry = PLANS.get(key)
        if entry is None:
            try:
                plan = plan_primitive(prims[name], c_name)
                # (emission problems surface here, per kernel, not for the whole library)
                entry = (plan, [emit_kernel(func) for func in _plan_funcs(plan)])
            except (TensorVMError, NotImplementedError) as err:
                # (UnsupportedError: no compute for an op; other codegen errors: a construct it cannot lower)
                entry = (None, f"{type(err).__name__}: {err}")
            PLANS.put(key, entry)
        else:
            library.reused += 1
        return entry

    # A library seen before, in this process or another: bound from its manifest, nothing lowered (unless
    # every kernel is in this process's memo anyway).
    if manifest_key is not None and not all(PLANS.contains(k[1]) for k in keyed.values()) \
            and kernel_manifest.bind(manifest_key, library, prims, {n: k[0] for n, k in keyed.items()},
                                     set(shape_keyed), lambda name: plan_of(name)[0]):
        library.lower_seconds = time.perf_counter() - start
        _alias(library)
        return library
    plans, emitted = {}, {}
    for name in keyed:
        plan, result = plan_of(name)
        if plan is None:
            library.fallbacks[name] = result
            library.kernels[name] = build_kernel(prims[name])
        else:
            if native is not None and plan.externals:  # (picked in Python per call: native code calls C only)
                plan, result = dataclasses.replace(plan, externals=[]), result[:1]
            plans[name], emitted[name] = plan, result
    shape_specs = {}
    for name, (prim, is_input) in (shape_prims or {}).items():
        c_name, key, _ = shape_keyed[name]
        entry = PLANS.get(key)
        if entry is None:
            try:
                entry = (emit_shape_func(prim, is_input, c_name), None)
            except (TensorVMError, NotImplementedError) as err:
                entry = (None, f"{type(err).__name__}: {err}")
            PLANS.put(key, entry)
        if entry[0] is None:
            library.shape_fallbacks[name] = entry[1]
        else:
            shape_specs[name] = entry[0]
    library.lower_seconds = time.perf_counter() - start
    native_source = ""
    if native is not None:
        native_source, library.native = _native_parts(native, plans, shape_specs, library.aliases)
    if plans or shape_specs or native_source:
        _compile(library, plans, emitted, shape_specs, native_source)
        if manifest_key is not None:
            kernel_manifest.save(manifest_key, library, plans, emitted, {n: k[0] for n, k in keyed.items()})
    _alias(library)
    missing = set(prims) - set(library.kernels)
    if missing:  # pragma: no cover - every primitive is either compiled or a fallback
        raise UnsupportedError(f"no kernel was built for {sorted(missing)}")
    return library


def _alias(library: CLibrary) -> None:
    """Primitives with the signature of another get that one's kernel."""
    for name, original in library.aliases.items():
        library.kernels[name] = library.kernels[original]
        if original in library.sources:
            library.sources[name] = library.sources[original]
        if original in library.fallbacks:
            library.fallbacks[name] = library.fallbacks[original]


def _plan_funcs(plan) -> list:
    """The loop-IR functions a plan compiles: its kernel, then its external variants' epilogues."""
    return [plan.lowered.func] + [e.epilogue.func for e in plan.externals if e.epilogue is not None]


def _native_parts(exe, plans: dict, shape_specs: dict, aliases: dict) -> tuple:
    """The native translation unit of ``exe`` over these kernels and shape functions (a primitive sharing
    another's signature calls that one's kernel), and its ``NativeLibrary`` (filled in by ``_compile``)."""
    from .native_emit import NativeKernel, emit_program, python_primitives
    from .native_mode import NativeLibrary

    kernels, shape_funcs, constants = {}, {}, []
    first = len(exe.constants)
    for p, info in enumerate(exe.primitives):
        source = aliases.get(info.source, info.source)
        if info.kind == "kernel" and source in plans:
            lowered = plans[source].lowered
            kernels[p] = NativeKernel(lowered.func, first + len(constants), len(lowered.constants))
            constants.extend(lowered.constants)
        elif info.kind == "shape_func" and info.name in shape_specs:
            shape_funcs[p] = shape_specs[info.name]
    source = emit_program(exe, kernels, shape_funcs)
    return source, NativeLibrary(tuple(constants), kernels, source, python_primitives(exe, kernels, shape_funcs))


def _compile(library: CLibrary, plans: dict, emitted: dict, shape_specs: dict, native_source: str = "") -> None:
    """Build every planned kernel (its C already emitted) into one library; plain C kernels get the fast
    caller (``fastcall``)."""

    from ..codegen.c_emit import library_text
    from ..codegen.module import NATIVE_FLAGS, build_module
    from .shape_c import SHAPE_LIBRARY

    funcs = [func for plan in plans.values() for func in _plan_funcs(plan)]
    extra = []
    if shape_specs:
        extra.append(library_text([SHAPE_LIBRARY]) + "\n".join(s.source for s in shape_specs.values()))
    if native_source:  # (its own unit, at NATIVE_FLAGS: it declares the kernels and shape functions it calls)
        extra.append((native_source, NATIVE_FLAGS))
    module = build_module(funcs, extra_source=extra,
                          emitted=[kernel for kernels in emitted.values() for kernel in kernels],
                          wrappers=_wrapped(plans, emitted))
    library.source = module.source
    library.build_info = module.build_info
    from ..codegen.calibrate import attach_library

    attach_library(module.library._cdll)  # (the user's pin or the cached product choices)
    python_module = module.library._python_module
    library.python_module = python_module.__name__ if python_module is not None else ""
    library.library_path = module.build_info.path
    abis = {}
    for name, spec in shape_specs.items():
        library.shape_funcs[name] = (spec, module.library.function(spec.name, 3, 0))
    if library.native is not None:
        library.native.attach(module)
    for name, plan in plans.items():
        kernel = plan.make_kernel(module)
        library.sources[name] = kernel.source
        library.kernels[name], missing = fast_kernel(name, kernel, plan.lowered.func, module.library,
                                                     tuple(plan.lowered.constants), bool(plan.externals), abis)
        library.abi_missing = missing or library.abi_missing
    describe_if_complete(library, abis, shape_specs)


def _wrapped(plans: dict, emitted: dict):
    """The kernels the VM calls as ``KernelFunction`` objects, which get CPython wrappers (``build_module``'s
    ``wrappers``): those of plans with external variants (``DispatchKernel`` calls its C kernel and
    epilogues), and those the fast caller cannot call; all of them (None) when there is no fast caller
    (``fastcall``) in this process."""
    from .fastcall import can_call, fastcall_module

    if fastcall_module() is None:
        return None
    names = set()
    for name, plan in plans.items():
        abi = _kernel_abi(name, plan.lowered.func, tuple(plan.lowered.constants), emitted[name][0].errors)
        if plan.externals or abi is None or not can_call(abi):
            names.update(f.name for f in _plan_funcs(plan))
    return names


def fast_kernel(name: str, kernel, func, built, constants: tuple, externals: bool, abis: dict) -> tuple:
    """``(the kernel to call, why the library cannot be described or "")`` for the compiled ``kernel``
    (of the loop-IR function ``func``, in the library ``built``): its fast caller (``fastcall``) when it is a plain C
    kernel, with its ``KernelABI`` recorded in ``abis``, else the kernel itself."""
    import ctypes

    from .fastcall import caller_for

    if externals:  # (a kernel with a BLAS variant picks it in Python, per call)
        return kernel, f"kernel {name} picks a BLAS variant in Python"
    abi = _kernel_abi(name, func, constants, kernel.kernel._errors)
    if abi is None:
        return kernel, f"kernel {name} has a calling convention the fast caller does not know"
    abis[name] = abi
    entry = built.function(func.name, len(func.params), len(func.dim_params))
    fast = caller_for(abi, ctypes.cast(entry, ctypes.c_void_p).value, kernel)
    return (fast if fast is not None else kernel), ""


def describe_if_complete(library: CLibrary, abis: dict, shape_specs: dict) -> None:
    """Describe ``library`` for saved files (``_describe``) unless something in it is not plain C, which
    ``abi_missing`` then names."""
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
