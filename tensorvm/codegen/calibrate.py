"""A short calibration between competing implementations, on first use per shape class, cached on disk.

Where several implementations of one operation compete (the packed product at each tile shape, host BLAS
through the bridge), ``choose(op, shape, candidates)`` times each candidate a few times on the real
operands the first time a *shape class* is met and keeps the fastest; the choice is cached in memory and
in ``cache_dir()/calibration-<host>.json``, keyed by the host's model and features
(``HostDescription.key``), so another CPU (or a faked host description) calibrates afresh and this one
never again. ``choices()`` lists what was chosen in this process and why (``calibrated``: the times;
``cached``: an earlier calibration; ``pinned``: the user's choice); ``Executable.stats()`` reports it.

A user pins a variant with ``pin(op, name)`` or ``$TENSORVM_VARIANT`` (``op=name[,op=name...]``, or a
bare ``name`` for every op that has it); a pin naming no candidate raises ``AttrError``.

Shape classes: rows (``m``) in 1, up to 16, up to 128, more; the weight's size (``n x k`` floats) against
the host's L1, L2, L3 (a product whose weight stays in cache behaves differently from one streaming from
memory). Timing never decides correctness: every candidate computes the same result.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass

from ..errors import AttrError
from .host import HostDescription, host

__all__ = ["Choice", "shape_class", "choose", "pin", "choices", "reset"]


@dataclass(frozen=True)
class Choice:
    """What ``choose`` picked for one op and shape class: ``variant``, ``why`` (``calibrated``, ``cached``
    or ``pinned``) and the seconds each candidate took when it was calibrated."""

    op: str
    shape_class: str
    variant: str
    why: str
    seconds: tuple = ()


_LOCK = threading.Lock()
_MEMORY: dict = {}  # (host key, op, class) -> Choice
_PINS: dict = {}  # op (or "*") -> variant


def shape_class(m: int, n: int, k: int, desc: HostDescription | None = None) -> str:
    """The class of an m x k by k x n product on ``desc``: rows bucket and where its weight fits."""
    desc = desc or host()
    rows = "m1" if m <= 1 else "m16" if m <= 16 else "m128" if m <= 128 else "mbig"
    weight = 4 * n * k
    fits = "l1" if weight <= desc.l1d else "l2" if weight <= desc.l2 else "l3" if weight <= desc.l3 else "dram"
    return f"{rows}-{fits}"


def pin(op: str, variant: str | None):
    """Always take ``variant`` for ``op`` (``"*"``: every op); ``None`` removes the pin."""
    with _LOCK:
        if variant is None:
            _PINS.pop(op, None)
        else:
            _PINS[op] = variant


def reset():
    """Forget this process's choices and pins (the disk cache stays)."""
    with _LOCK:
        _MEMORY.clear()
        _PINS.clear()


def choices() -> list:
    """The choices made in this process (``Choice``), in the order they were made."""
    with _LOCK:
        return list(_MEMORY.values())


def _pinned(op: str) -> str | None:
    if op in _PINS or "*" in _PINS:
        return _PINS.get(op, _PINS.get("*"))
    for item in os.environ.get("TENSORVM_VARIANT", "").split(","):
        name, _, value = item.strip().rpartition("=")
        if value and name in (op, ""):
            return value
    return None


def _cache_file(desc: HostDescription):
    from .build import cache_dir

    return cache_dir() / f"calibration-{hashlib.sha256(desc.key.encode()).hexdigest()[:16]}.json"


def _read(path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def choose(op: str, shape: tuple, candidates: dict, runs: int = 3, desc: HostDescription | None = None) -> Choice:
    """The variant of ``op`` to run for a product of ``shape`` = (m, n, k): ``candidates`` maps variant
    names to callables running that variant once on the real operands (each must compute the same
    result). Pinned, else remembered, else cached on disk for this host, else calibrated now (the
    fastest of ``runs`` calls each, after one warm-up call) and stored."""
    if not candidates:
        raise AttrError(f"calibrate: no candidate variants for {op}")
    desc = desc or host()
    cls = shape_class(*shape, desc=desc)
    pinned = _pinned(op)
    if pinned is not None:
        if pinned not in candidates:
            raise AttrError(f"calibrate: the variant {pinned!r} pinned for {op} is not one of {sorted(candidates)}")
        return _remember(desc, Choice(op, cls, pinned, "pinned"))
    key = (desc.key, op, cls)
    with _LOCK:
        known = _MEMORY.get(key)
    if known is not None and known.variant in candidates:
        return known
    path = _cache_file(desc)
    stored = _read(path).get(f"{op}|{cls}")
    if isinstance(stored, dict) and stored.get("variant") in candidates:
        return _remember(desc, Choice(op, cls, stored["variant"], "cached", tuple(stored.get("seconds", ()))))
    timings = []
    for name, run in candidates.items():
        run()  # warm-up: first-touch, caches
        best = float("inf")
        for _ in range(max(1, runs)):
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
        timings.append((name, best))
    winner = min(timings, key=lambda item: item[1])[0]
    choice = _remember(desc, Choice(op, cls, winner, "calibrated", tuple(timings)))
    with _LOCK:  # read-modify-write of the file, then an atomic replace
        from .build import _atomic_write

        data = _read(path)
        data[f"{op}|{cls}"] = {"variant": winner, "seconds": [list(t) for t in timings], "host": desc.key}
        _atomic_write(path, json.dumps(data, indent=1, sort_keys=True).encode())
    return choice


def _remember(desc: HostDescription, choice: Choice) -> Choice:
    with _LOCK:
        _MEMORY[(desc.key, choice.op, choice.shape_class)] = choice
    return choice


def report() -> dict:
    """Which product kernels run and why, for ``Executable.stats()``: the packed product's instance (its
    ISA, tile and blocks, derived from the host description, and where that description came from) and
    the calibrated choices of this process."""
    from . import host as hostmod

    desc = host()
    params = hostmod.gemm_params(desc)
    source = ("set_host" if hostmod._OVERRIDE[0] is not None
              else "$TENSORVM_HOST" if os.environ.get("TENSORVM_HOST", "").strip() else "detected")
    return {
        "packed_product": {
            "isa": desc.isa, "tile": f"{params.mr}x{params.nr}", "kc": params.kc, "mc": params.mc,
            "why": f"rule of host.gemm_params on the {source} host: {desc.vector_bytes}-byte vectors, "
                   f"{desc.vector_registers} registers, L2 {desc.l2 // 1024} KB ({desc.model or 'unknown model'})",
        },
        "convolution": {
            "isa": desc.isa, "direct_tile": f"{max(params.mr, 4)}x2x{params.lanes} and 4x2x{params.lanes}",
            "packed_tile": f"{params.mr}x{params.nr}", "depthwise_tile": f"4x{params.lanes}",
            "why": "tv_vconv.h instantiated with the packed product's vectors: direct, output channels x 2 rows "
                   "x one vector of columns (the tile's channels are the product's tile rows); packed "
                   "(nn.conv2d_packed), the product's tile of output pixels x output channels over channel "
                   "blocks of the image; depthwise, 4 rows x one vector of columns per channel",
        },
        "calibrated": [{"op": c.op, "shape_class": c.shape_class, "variant": c.variant, "why": c.why}
                       for c in choices()],
    }
