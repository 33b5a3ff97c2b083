"""How wide this core's FMA datapath is: a short measured probe, cached per host like the pool's timings.

An AVX-512 instruction set says nothing about throughput: Intel's server parts with two 512-bit FMA
units retire twice the float32 multiply-adds per cycle with 64-byte vectors as with 32-byte ones, while
Zen 4 executes a 512-bit operation as two 256-bit halves, so 64-byte vectors do the same work per cycle
there and only cost registers, tails and (measured, docs/kernels.md) up to 2.4x in some kernels.
``fma_bits(key)`` runs ``lib/probe/tv_fma_probe.c`` (independent FMA chains at 32 and 64 bytes,
interleaved, a few milliseconds) and answers 512 when the 64-byte vectors did at least 1.7x the
multiply-adds per nanosecond of the 32-byte ones, 256 when they did at most 1.3x; ``host.host()`` puts
the answer into the description (``fma_bits``), from which the kernels' vector width and
``kernel_rules().macs_per_cycle`` follow.

The result is cached in the kernel cache keyed by ``HostDescription.key``, unless the measurement was
disturbed (``_plausible``: the repeats disagree, or the ratio falls between the two answers, as it does
when another process took the core during one width's rounds): a disturbed probe is neither cached nor
used (``fma_bits`` 0: unmeasured, the ISA's own width), and a later process measures again.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import statistics
import threading

__all__ = ["fma_bits", "measure", "decide"]

_LOCK = threading.RLock()
_BITS: dict = {}  # host key -> 256 / 512 / 0 (disturbed: not cached on disk)
_ITERS = 50_000  # FMAs per chain per measurement (~0.1-0.3 ms at 3 GHz)
_REPEATS = 7
FULL_RATIO, SPLIT_RATIO = 1.7, 1.3  # 512-bit / 256-bit throughput: ~2.0 full width, ~1.0 split
_MAX_SPREAD = 1.5  # a width's median repeat over its best: above, the core was shared
_ATTEMPTS = 3  # probes before a disturbed answer is given up for this process


def _library():
    from .build import CompilerError, build_library, have_compiler
    from .c_emit import library_text

    if not have_compiler():
        return None
    try:
        cdll = build_library(library_text(["probe/tv_fma_probe.c"]))._cdll
    except CompilerError:
        return None
    cdll.tv_fma_probe_ns.restype = ctypes.c_int64
    cdll.tv_fma_probe_ns.argtypes = [ctypes.c_int32, ctypes.c_int64, ctypes.POINTER(ctypes.c_float)]
    return cdll


def measure(cdll=None) -> dict | None:
    """{32: [ns, ...], 64: [ns, ...]}: ``_REPEATS`` interleaved timings of the probe at each width (the
    same number of FMA instructions, so a 64-byte round does twice the multiply-adds); None without a
    compiler."""
    cdll = cdll or _library()
    if cdll is None:
        return None
    sink = ctypes.c_float()
    cdll.tv_fma_probe_ns(32, _ITERS, ctypes.byref(sink))  # (warms the core's clock and the code)
    cdll.tv_fma_probe_ns(64, _ITERS, ctypes.byref(sink))
    times: dict = {32: [], 64: []}
    for _ in range(_REPEATS):
        for width in (32, 64):
            times[width].append(float(cdll.tv_fma_probe_ns(width, _ITERS, ctypes.byref(sink))))
    return times


def _plausible(times: dict) -> bool:
    """Whether the repeats agree (each width's median within ``_MAX_SPREAD`` of its best)."""
    for width in (32, 64):
        values = times.get(width) or []
        if not values or min(values) <= 0 or statistics.median(values) > _MAX_SPREAD * min(values):
            return False
    return True


def decide(times: dict) -> int:
    """512 or 256 from a measurement (see the top), 0 when it was disturbed or falls between the two."""
    if not _plausible(times):
        return 0
    ratio = 2 * min(times[32]) / min(times[64])  # multiply-adds per ns at 64 bytes over those at 32
    if ratio >= FULL_RATIO:
        return 512
    if ratio <= SPLIT_RATIO:
        return 256
    return 0


def fma_bits(key: str, measure_fn=None) -> int:
    """This host's FMA datapath width in bits (``key``: ``HostDescription.key``): from the kernel cache,
    else measured now (again, up to ``_ATTEMPTS`` probes, while disturbed) and cached when the measurement
    is clean; 0 without a compiler or when every probe was disturbed (not cached: a later process
    measures again). ``measure_fn`` replaces the probe (tests)."""
    with _LOCK:
        if key in _BITS:
            return _BITS[key]
        from .build import _atomic_write, cache_dir

        path = cache_dir() / f"fma-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
        bits = _read(path)
        if bits is None:
            bits, times = 0, None
            for _ in range(_ATTEMPTS):  # (a busy core disturbs one probe of a few ms, rarely three)
                times = (measure_fn or measure)()
                bits = decide(times) if times is not None else 0
                if bits or times is None:
                    break
            if bits:
                _atomic_write(path, json.dumps({"fma_bits": bits, "ns": {str(w): t for w, t in times.items()},
                                                "host": key}).encode())
        _BITS[key] = bits
        return bits


def _read(path) -> int | None:
    try:
        bits = json.loads(path.read_text())["fma_bits"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return bits if bits in (256, 512) and not isinstance(bits, bool) else None
