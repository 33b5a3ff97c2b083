"""Calling compiled C kernels from the VM without ctypes' per-call cost.

A ctypes call of a kernel costs ~0.7 µs, but reaching it costs far more: ``array.ctypes.data`` builds
a helper object per array (~1-3 µs each), so a three-array kernel paid ~8 µs per call in Python before
doing any work. This module compiles (once per machine, through the code generator's on-disk cache) a
tiny CPython extension, ``_tensorvm_fastcall``, whose ``Caller`` objects do the whole call in C: check
each argument (exact ``ndarray``, dtype, rank, static dims, C-contiguity, writeable outputs), read the
data pointers and the dynamic dims, and call the kernel's C function directly (buffers and dims are all
64-bit integer arguments on x86-64 and AArch64, so a switch on the argument count calls any kernel; on
other machines the extension does not build and kernels are called the checked way). Anything unusual — a check that fails, a nonzero return code — is handed to the ``slow``
callable (the code generator's checked ``KernelFunction``), which raises the precise error, so the fast
path never has to format messages.

The extension's C is the package file ``tensorvm/vm/native/fastcall.c`` with a small generated header put
in place of its ``#include "tv_fastcall_config.h"`` (``source()``: the limits below and the per-arity
``call_kernel`` switch), built against this interpreter's and this NumPy's headers (their versions are
part of the source, hence of the cache key, as the file's text is). When it cannot be built
(no Python or NumPy headers), ``caller_for`` returns ``None`` and kernels are called the checked way.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import re
import sys
import sysconfig
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np

__all__ = ["caller_for", "can_call", "fastcall_module", "build_in_background", "status", "source", "MAX_BUFFERS", "MAX_DIMS", "MAX_ARGS"]

MAX_BUFFERS = 32
MAX_DIMS = 64
MAX_ARGS = 48  # buffers + dims of one kernel

_NATIVE = Path(__file__).parent / "native"  # the extension's C: native/fastcall.c
_CONFIG_INCLUDE = '#include "tv_fastcall_config.h"'

_LOCK = threading.Lock()
_MODULE: list = []  # [module or None] once tried
_STATUS: list = ["not built yet"]


def fastcall_module():
    """The compiled ``_tensorvm_fastcall`` extension, or ``None`` when it cannot be built here (or when
    the environment sets ``TENSORVM_NATIVE=0``, which keeps the VM to pure Python)."""
    if os.environ.get("TENSORVM_NATIVE", "1") == "0":
        return None
    with _LOCK:
        if not _MODULE:
            _MODULE.append(_load_cached() or _build())
        return _MODULE[0]


def build_in_background() -> None:
    """Start loading (or building) the extension on a thread of its own unless a call has already: a cold
    compile for target "c" then builds it while the kernels are lowered in Python, instead of after the
    kernel library (0.9 s at the end of MobileNetV3-small's 14 s on a 2-core Xeon); ``fastcall_module``
    waits for it. After the host's measurements (the pool's split cost and the FMA width are timed once
    per CPU model, and a compiler on the other core would disturb them: ``codegen.host.host``)."""
    if _MODULE or os.environ.get("TENSORVM_NATIVE", "1") == "0":
        return
    from ..codegen.host import host

    host()
    threading.Thread(target=fastcall_module, name="tensorvm-fastcall-build").start()


def status() -> str:
    """Why the helper is or is not in use (for diagnostics)."""
    if os.environ.get("TENSORVM_NATIVE", "1") == "0":
        return "disabled by TENSORVM_NATIVE=0"
    fastcall_module()
    return _STATUS[0]


def _index_name() -> str:
    """The cache file naming the library built from this exact ``source()`` (so a process that only runs
    kernels finds the extension without probing the compiler: ``_load_cached``)."""
    return f"fastcall-{hashlib.sha256(source().encode()).hexdigest()[:32]}.txt"


def _load_cached():
    """The extension from the kernel cache when a build of this source recorded it there, else None."""
    module = load_cached_extension(_index_name(), "_tensorvm_fastcall")
    if module is not None:
        _STATUS[0] = f"available ({module.__file__}, cached)"
    return module


def load_cached_extension(index_name: str, module_name: str):
    """The CPython extension ``module_name`` that the kernel cache's record ``index_name`` names (its bytes
    verified like every cached library: ``record_extension`` writes the record after a build), or None;
    imports nothing of the compiler."""
    from ..runtime.library import kernel_cache_dir, verified_library

    directory, _ = kernel_cache_dir()
    try:
        name = (directory / index_name).read_text().strip() if directory is not None else ""
    except OSError:
        return None
    if not re.fullmatch(r"tv_[0-9a-f]{32}\.so", name) or not verified_library(directory / name):
        return None
    try:
        return import_extension(str(directory / name), module_name)
    except (ImportError, OSError):
        return None


def record_extension(index_name: str, path: str) -> None:
    """Record the extension built at ``path`` (in the kernel cache) under ``index_name``."""
    from ..codegen.build import _atomic_write, cache_dir

    _atomic_write(cache_dir() / index_name, Path(path).name.encode())


def import_extension(path: str, module_name: str):
    """The CPython extension module ``module_name`` from the shared library at ``path``."""
    spec = importlib.util.spec_from_file_location(
        module_name, path, loader=importlib.machinery.ExtensionFileLoader(module_name, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build():
    from ..codegen.build import build_library, find_toolchain

    try:
        include = sysconfig.get_paths()["include"]
        if not (Path(include) / "Python.h").exists():
            _STATUS[0] = f"no Python.h in {include}"
            return None
        toolchain = find_toolchain()
        flags = tuple(f for f in toolchain.flags if f not in ("-fopenmp",))
        toolchain = replace(toolchain, flags=flags + (f"-I{include}", f"-I{np.get_include()}"))
        library = build_library(source(), toolchain)
        module = import_extension(library.info.path, "_tensorvm_fastcall")
        record_extension(_index_name(), library.info.path)
        _STATUS[0] = f"available ({library.info.path})"
        return module
    except Exception as err:  # no headers, a compiler that rejects them, ...: kernels are called the checked way
        _STATUS[0] = f"unavailable: {type(err).__name__}: {str(err)[:500]}"
        return None


def source() -> str:
    """The extension's C text: ``native/fastcall.c`` with its configuration header inlined."""
    text = (_NATIVE / "fastcall.c").read_text()
    if text.count(_CONFIG_INCLUDE) != 1:
        raise RuntimeError(f"fastcall: {_NATIVE / 'fastcall.c'} must include tv_fastcall_config.h once")
    return text.replace(_CONFIG_INCLUDE, config_header())


def config_header() -> str:
    """The generated ``tv_fastcall_config.h``: versions, limits and ``call_kernel``, one case per argument
    count (a call through a pointer of each arity)."""
    cases = []
    for n in range(MAX_ARGS + 1):
        params = ", ".join(["intptr_t"] * n) or "void"
        args = ", ".join(f"w[{i}]" for i in range(n))
        cases.append(f"    case {n}: return ((int32_t (*)({params}))fn)({args});")
    return (f"/* tv_fastcall_config.h (generated by tensorvm/vm/fastcall.py): python {sys.version.split()[0]}, "
            f"numpy {np.__version__} (versions are part of the cache key). */\n"
            f"#define MAX_BUFFERS {MAX_BUFFERS}\n#define MAX_DIMS {MAX_DIMS}\n#define MAX_ARGS {MAX_ARGS}\n"
            "static int32_t call_kernel(void* fn, const intptr_t* w, int n) {\n    (void)w;\n    switch (n) {\n"
            + "\n".join(cases) + "\n    default: return -1;\n    }\n}\n")


def can_call(abi) -> bool:
    """Whether ``caller_for`` gives the kernel ``abi`` describes a fast caller (the extension is here and the
    kernel's arguments are within its limits)."""
    nbuffers, ndims = len(abi.buffers), len(abi.dim_positions())
    return (fastcall_module() is not None and nbuffers <= MAX_BUFFERS and ndims <= MAX_DIMS
            and nbuffers + ndims <= MAX_ARGS)


def caller_for(abi, address: int, slow):
    """A fast ``caller(*inputs, *outputs)`` for the kernel ``abi`` describes (a ``kernel_abi.KernelABI``)
    whose C function is at ``address``; ``None`` when the fast path is unavailable."""
    if not can_call(abi):
        return None
    module, nbuffers = fastcall_module(), len(abi.buffers)
    static_buf, static_axis, static_value = [], [], []
    for k, (_, _, static) in enumerate(abi.buffers):
        for axis, size in static:
            static_buf.append(k)
            static_axis.append(axis)
            static_value.append(int(size))
    dyn = abi.dim_positions()
    return module.make(address, abi.num_inputs - len(abi.constants), tuple(np.dtype(b[0]) for b in abi.buffers),
                       tuple(b[1] for b in abi.buffers), tuple(int(k >= abi.num_inputs) for k in range(nbuffers)),
                       tuple(static_buf), tuple(static_axis), tuple(static_value), tuple(k for k, _ in dyn),
                       tuple(a for _, a in dyn), tuple(abi.constants), slow)
