"""The hand-written C kernels of this checkout and of another one, side by side in one process: the text of
the C library (``tensorvm/codegen/lib``) with a benchmark's own callers appended, built once from each
checkout's files (``conv_layers.py --against``, ``depthwise_layers.py --against``)."""

from __future__ import annotations

from pathlib import Path

LIBRARY_FILES = ["tv_kernel.h", "tv_gemm.h"]


def library_text(calls: str, checkout: str | None = None) -> str:
    """The C library of ``checkout`` (this one when None), instantiated for this host, then ``calls``.
    ``c_emit`` keeps each file's text once read, so that cache is emptied before and after reading
    another checkout's (else both texts are this checkout's)."""
    from tensorvm.codegen import c_emit

    defines = c_emit._rule_defines() + c_emit._product_defines()
    if checkout is None:
        return defines + c_emit.library_text(LIBRARY_FILES) + calls
    own = c_emit.LIBRARY_DIR
    c_emit.LIBRARY_DIR = Path(checkout) / "tensorvm" / "codegen" / "lib"
    c_emit._library_file.cache_clear()
    try:
        return defines + c_emit.library_text(LIBRARY_FILES) + calls
    finally:
        c_emit.LIBRARY_DIR = own
        c_emit._library_file.cache_clear()


def libraries(calls: str, against: str | None) -> dict:
    """{"here": this checkout's library (a ctypes CDLL), "there": ``against``'s when given}."""
    from tensorvm.codegen.build import build_library

    built = {"here": build_library(library_text(calls))._cdll}
    if against:
        built["there"] = build_library(library_text(calls, against))._cdll
    return built
