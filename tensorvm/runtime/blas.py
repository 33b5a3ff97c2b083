"""The host's BLAS, for kernels that call it from C (``tv_gemm_*`` in ``c_emit.BLAS_BRIDGE``).

NumPy ships OpenBLAS with 64-bit integers and prefixed symbols (``scipy_cblas_sgemm64_``); it is
found, as threadpoolctl finds it, among the libraries loaded in this process, and its entry points are
handed to each kernel library when it is loaded (``tv_set_blas``). Only ILP64 CBLAS symbols are used,
since the bridge passes 64-bit integers; without them ``available()`` is False and the matrix products
stay generated C code.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass

from ..errors import UnsupportedError

__all__ = ["HostBlas", "host_blas", "available", "attach", "mode", "MODES"]

# ``$TENSORVM_BLAS``: "c" (default) calls the host BLAS from the kernels; "numpy" calls it through NumPy
# from a Python dispatcher (the path for hosts whose BLAS the bridge cannot use); "off" keeps every
# product in generated code.
MODES = ("c", "numpy", "off")

_PREFIXES = ("scipy_cblas_", "cblas_")
_THREAD_NAMES = (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
                 ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
                 ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
                 ("openblas_get_num_threads", "openblas_set_num_threads"))


@dataclass(frozen=True)
class HostBlas:
    """Addresses of the host BLAS's entry points (0 when missing) and its thread-count controls."""

    path: str
    sgemm: int = 0
    dgemm: int = 0
    sgemv: int = 0
    dgemv: int = 0
    get_threads: object = None  # ctypes functions: () -> int, (int) -> None
    set_threads: object = None

    @property
    def has_gemm(self) -> bool:
        return bool(self.sgemm and self.dgemm)


def _loaded_openblas() -> list[str]:
    try:
        with open("/proc/self/maps") as maps:
            return sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and ".so" in line})
    except OSError:
        return []


def _address(lib, name: str) -> int:
    try:
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0
    except AttributeError:
        return 0


@functools.lru_cache(maxsize=1)
def host_blas() -> HostBlas | None:
    """The loaded OpenBLAS (NumPy's), or None."""
    import numpy  # noqa: F401 - loads NumPy's BLAS

    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        get = set_ = None
        for get_name, set_name in _THREAD_NAMES:
            if hasattr(lib, get_name) and hasattr(lib, set_name):
                get, set_ = getattr(lib, get_name), getattr(lib, set_name)
                get.restype, get.argtypes = ctypes.c_int, []
                set_.restype, set_.argtypes = None, [ctypes.c_int]
                break
        for prefix in _PREFIXES:
            entries = {op: _address(lib, f"{prefix}{op}64_") for op in ("sgemm", "dgemm", "sgemv", "dgemv")}
            if entries["sgemm"] and entries["dgemm"]:
                return HostBlas(path, get_threads=get, set_threads=set_, **entries)
        if get is not None:
            return HostBlas(path, get_threads=get, set_threads=set_)
    return None


def mode() -> str:
    """How matrix products use BLAS (``$TENSORVM_BLAS``): "c", "numpy" or "off"; "c" falls back to
    "numpy" when no host BLAS can be called from C."""
    value = os.environ.get("TENSORVM_BLAS", "c").strip().lower() or "c"
    if value not in MODES:
        raise UnsupportedError(f"$TENSORVM_BLAS must be one of {', '.join(MODES)}, got {value!r}")
    if value == "c" and not available():
        return "numpy"
    return value


def available() -> bool:
    """Whether kernels can call BLAS from C in this process."""
    blas = host_blas()
    return blas is not None and blas.has_gemm


def attach(cdll) -> None:
    """Hand the host BLAS to a kernel library that has the bridge (a no-op otherwise)."""
    blas = host_blas()
    try:
        setter = cdll.tv_set_blas
    except AttributeError:  # built without the bridge (AOT style)
        return
    setter.restype, setter.argtypes = ctypes.c_int32, [ctypes.c_void_p] * 6
    if blas is None or not blas.has_gemm:
        setter(None, None, None, None, None, None)
        return

    def address(function):
        return ctypes.cast(function, ctypes.c_void_p).value if function is not None else None

    setter(blas.sgemm, blas.dgemm, blas.sgemv or None, blas.dgemv or None, address(blas.get_threads),
           address(blas.set_threads))
