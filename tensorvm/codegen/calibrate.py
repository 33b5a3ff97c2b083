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

**In the C dispatch.** A product that the kernels compute with ``tv_gemm_f32`` (``tv_gemm.h``) and whose
B fits the on-the-fly register tiles can also run on the host BLAS: op ``gemm``, variants ``tiles`` and
``blas``. The C side keeps one choice per shape class (the classes above, computed in C from the same
host caches) and calibrates a class on its first product (each variant twice on the real operands).
``attach_library`` hands a freshly built library the user's pin (all classes, no calibration) or this
host's cached choices; ``collect_library`` reads what the library calibrated into ``choices()`` and the
disk cache (``Executable.stats()`` calls it).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass

from ..errors import AttrError
from .host import HostDescription, host

__all__ = ["Choice", "shape_class", "choose", "pin", "choices", "reset", "attach_library", "collect_library",
           "GEMM_OP", "GEMM_VARIANTS"]


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
    """Which product kernels run and why, for ``Executable.stats()``: the kernels' vector width (and the
    FMA datapath it follows, ``host.fma_vector_host``), the packed product's instance (its
    ISA, tile and blocks, derived from the host description, and where that description came from), the
    softmax's vector width, the thresholds of ``host.kernel_rules`` with their rules, and the calibrated
    choices of this process."""
    from . import host as hostmod

    desc = host()
    params = hostmod.gemm_params(desc)
    rules = hostmod.kernel_rules(desc)
    source = ("set_host" if hostmod._OVERRIDE[0] is not None
              else "$TENSORVM_HOST" if os.environ.get("TENSORVM_HOST", "").strip() else "detected")
    return {
        "vector_width": {"vector_bytes": desc.vector_bytes, "vector_registers": desc.vector_registers,
                         "fma_bits": desc.fma_bits, "source": source, "why": hostmod.width_why(desc)},
        "packed_product": {
            "isa": desc.isa, "tile": f"{params.mr}x{params.nr}", "kc": params.kc, "mc": params.mc,
            "why": f"rule of host.gemm_params on the {source} host: {desc.vector_bytes}-byte vectors, "
                   f"{desc.vector_registers} registers, L2 {desc.l2 // 1024} KB ({desc.model or 'unknown model'})",
        },
        "convolution": {
            "isa": desc.isa, "direct_tile": f"{max(params.conv_mr, 4)}x2x{params.lanes} and 4x2x{params.lanes}",
            "packed_tile": f"{params.conv_mr}x{params.nr}",
            "pointwise_tile": f"{max(params.mr, 4)}x{params.nr} and 4x{params.nr}", "depthwise_tile": f"8x{params.lanes} (stride 2, square 3, 5, 7: 8, 7, 5 x{params.lanes}, split in registers)",
            "why": "tv_vconv.h instantiated with the packed product's vectors: direct, output channels x 2 rows "
                   "x one vector of columns (the tile's channels are the product's tile rows); packed "
                   "(nn.conv2d_packed), the product's tile of output pixels x output channels over channel "
                   "blocks of the image; pointwise (1x1), output channels x the product's two vectors of pixels read from the image's rows in place; depthwise, 8 rows x one vector of columns per channel (a stride-2 square kernel: 8, 7 or 5 rows sharing their input rows, each split into its even and odd columns in registers)",
        },
        "softmax": {"vector_bytes": desc.vector_bytes,
                    "why": "tv_softmax_f32 written once over tv_vec.h's vector, instantiated at the host's width"},
        "thresholds": {name: {"value": getattr(rules, name), "why": why} for name, why in rules.why().items()},
        "calibrated": [{"op": c.op, "shape_class": c.shape_class, "variant": c.variant, "why": c.why}
                       for c in choices()],
    }


GEMM_OP = "gemm"
GEMM_VARIANTS = ("tiles", "blas")  # tv_gemm.h: TV_GEMM_TILES = 1, TV_GEMM_BLAS = 2 (0: not chosen yet)
_ROWS, _FITS = ("m1", "m16", "m128", "mbig"), ("l1", "l2", "l3", "dram")
_CLASSES = [f"{rows}-{fits}" for rows in _ROWS for fits in _FITS]  # tv_gemm_class's order


def _gemm_table(cdll):
    try:
        return cdll.tv_gemm_set_choice, cdll.tv_gemm_choices
    except AttributeError:  # (a library without the BLAS bridge)
        return None


def attach_library(cdll, desc: HostDescription | None = None) -> None:
    """Give a kernel library the product variant pinned for ``gemm`` (every class, no calibration), else
    the choices cached on disk for this host (the other classes calibrate in C on first use)."""
    table = _gemm_table(cdll)
    if table is None:
        return
    setter = table[0]
    setter.argtypes, setter.restype = [ctypes.c_int32] * 3, ctypes.c_int32
    desc = desc or host()
    pinned = _pinned(GEMM_OP)
    explicit = GEMM_OP in _PINS or any(item.strip().startswith(f"{GEMM_OP}=")
                                       for item in os.environ.get("TENSORVM_VARIANT", "").split(","))
    if pinned is not None and pinned not in GEMM_VARIANTS:
        if explicit:
            raise AttrError(f"calibrate: the variant {pinned!r} pinned for {GEMM_OP} is not one of {list(GEMM_VARIANTS)}")
        pinned = None  # (a pin for every op naming another op's variant)
    if pinned is not None:
        for index in range(len(_CLASSES)):
            setter(index, GEMM_VARIANTS.index(pinned) + 1, 0)
        with _LOCK:
            for cls in _CLASSES:
                _MEMORY.pop((desc.key, GEMM_OP, cls), None)
        _remember(desc, Choice(GEMM_OP, "*", pinned, "pinned"))
        return
    stored = _read(_cache_file(desc))
    for index, cls in enumerate(_CLASSES):
        entry = stored.get(f"{GEMM_OP}|{cls}")
        variant = entry.get("variant") if isinstance(entry, dict) else None
        setter(index, GEMM_VARIANTS.index(variant) + 1 if variant in GEMM_VARIANTS else 0, 1)
        if variant in GEMM_VARIANTS:
            _remember(desc, Choice(GEMM_OP, cls, variant, "cached", tuple(entry.get("seconds", ()))))


def collect_library(cdll, desc: HostDescription | None = None) -> list:
    """The product variants a library chose (``Choice``s), recording those it calibrated in ``choices()``
    and in this host's disk cache."""
    table = _gemm_table(cdll)
    if table is None:
        return []
    getter = table[1]
    getter.argtypes, getter.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int32
    variants = (ctypes.c_int32 * len(_CLASSES))()
    nanoseconds = (ctypes.c_int64 * (2 * len(_CLASSES)))()
    getter(variants, nanoseconds)
    desc = desc or host()
    found, new = [], []
    for index, cls in enumerate(_CLASSES):
        if not 1 <= variants[index] <= len(GEMM_VARIANTS):
            continue
        with _LOCK:
            known = _MEMORY.get((desc.key, GEMM_OP, cls))
        if known is None and not nanoseconds[2 * index]:  # (set, not calibrated: the pin, listed as class "*")
            continue
        if known is None:
            seconds = tuple((name, nanoseconds[2 * index + k] / 1e9) for k, name in enumerate(GEMM_VARIANTS))
            known = _remember(desc, Choice(GEMM_OP, cls, GEMM_VARIANTS[variants[index] - 1], "calibrated", seconds))
            new.append(known)
        found.append(known)
    if new:
        with _LOCK:
            from .build import _atomic_write

            path = _cache_file(desc)
            data = _read(path)
            for choice in new:
                data[f"{GEMM_OP}|{choice.shape_class}"] = {"variant": choice.variant, "host": desc.key,
                                                           "seconds": [list(t) for t in choice.seconds]}
            _atomic_write(path, json.dumps(data, indent=1, sort_keys=True).encode())
    return found
