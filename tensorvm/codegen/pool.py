"""The process's one thread pool, and what a split costs on this host.

Every kernel library carries the code of a pool (``lib/tv_team.h``), but the host gives them all one:
``process_pool()`` builds the small pool library (``lib/pool/tv_pool.c``, through the kernel cache like any
library) once per process, and ``runtime.library.load_cdll`` hands its table of entry points to every
library it loads (``tv_team_attach``), so that two models, or a model and the C libraries of its ops, run
their parallel loops on the same workers instead of two sets of spinning workers competing for the cores.
Without a compiler with OpenMP there is no pool library and each library runs its own pool (the
standalone AOT library in an application always does).

``pool_timings()`` measures the pool on first use (``tv_pool_fork_join_ns``: the median time of a split
over two threads whose workers spin, and of one whose workers sleep) and caches the result in the kernel
cache, keyed like the calibration by the CPU's model and features (``HostDescription.key``), so each host
measures once. ``host.host()`` puts the numbers into the description (``fork_join_ns``, ``wake_ns``), from
which ``host.kernel_rules`` derives the least work of a chunk of a parallel loop (``team_chunk_elements``),
the work from which a narrow product splits (``parallel_work_narrow``) and the idle workers' spin
(``team_spin_ns``). The measurement is given to the running pool (``share_fork_join``), never written into
a kernel's text: each library derives the two thresholds from it by its own rules at run time, so a
library's text, and its kernel cache key, does not depend on whether this process's measurement
succeeded (``host.codegen_view``).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import threading
from dataclasses import dataclass

__all__ = ["process_pool", "pool_timings", "PoolTimings"]

_LOCK = threading.RLock()
_POOL: list = [None]  # the loaded pool library (ctypes.CDLL), False when there is none
_TIMINGS: dict = {}  # host key -> PoolTimings
_MEASURE_ROUNDS = 200


@dataclass(frozen=True)
class PoolTimings:
    """A split's cost over two threads with the workers spinning, and with them asleep (nanoseconds)."""

    fork_join_ns: float
    wake_ns: float


def process_pool():
    """The loaded pool library (``ctypes.CDLL``), built on first use; None without a compiler with OpenMP
    (or when building it failed: the libraries then keep their own pools)."""
    with _LOCK:
        if _POOL[0] is None:
            _POOL[0] = False  # (while it builds: the pool library itself is loaded without a pool)
            _POOL[0] = _build() or False
        return _POOL[0] or None


def _pool_text() -> str:
    """The pool library's C text."""
    from .c_emit import library_text

    return library_text(["pool/tv_pool.c"])


def _build():
    from .build import CompilerError, build_library, find_toolchain, have_compiler

    if not have_compiler() or not find_toolchain().openmp:
        return None
    try:
        cdll = build_library(_pool_text())._cdll
    except CompilerError:
        return None
    cdll.tv_pool.restype, cdll.tv_pool.argtypes = ctypes.c_void_p, []
    cdll.tv_pool_fork_join_ns.restype = ctypes.c_int64
    cdll.tv_pool_fork_join_ns.argtypes = [ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]
    return cdll


def pool_table() -> int:
    """The address of the process pool's entry points (``tv_team_pool``), 0 without a pool library."""
    pool = process_pool()
    if pool is None:
        return 0
    from .host import host, kernel_rules

    set_spin_ns(kernel_rules(host()).team_spin_ns)
    share_fork_join()
    return int(pool.tv_pool())


def _table():
    """The process pool's table of entry points (``tv_team_pool``), None without a pool library."""
    pool = process_pool()
    return None if pool is None else ctypes.cast(pool.tv_pool(), ctypes.POINTER(_Table)).contents


def set_spin_ns(ns: int) -> None:
    """How long the pool's idle workers spin before they sleep (``host.kernel_rules().team_spin_ns``)."""
    table = _table()
    if table is not None:
        table.set_spin(int(ns))


def share_fork_join() -> None:
    """Give the running pool this machine's measured split cost (``host.machine_fork_join_cycles``), from
    which every library running on it derives its split thresholds by its own rules; nothing before the
    pool is built (``pool_table`` does it then)."""
    if _POOL[0]:
        from .host import machine_fork_join_cycles

        set_fork_join_cycles(machine_fork_join_cycles())


def set_fork_join_cycles(cycles: int) -> None:
    """The split cost (cycles, 0: unmeasured) the kernels on the pool derive ``parallel_work_narrow`` and
    ``team_chunk_elements`` from at each call (``tv_team_narrow_work``, ``tv_team_chunk_elements``)."""
    table = _table()
    if table is not None:
        table.set_fork_join(int(cycles))


class _Table(ctypes.Structure):
    _fields_ = [("run", ctypes.c_void_p), ("stats", ctypes.c_void_p),
                ("set_spin", ctypes.CFUNCTYPE(None, ctypes.c_int64)), ("state", ctypes.c_void_p),
                ("set_fork_join", ctypes.CFUNCTYPE(None, ctypes.c_int64))]


def timings_path(key: str):
    """Where the kernel cache keeps the timings of host ``key``'s pool: keyed by the pool's code too, since a
    pool that publishes its jobs otherwise splits at another cost."""
    from .build import cache_dir

    identity = f"{key}\0{_pool_text()}"
    return cache_dir() / f"pool-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.json"


def pool_timings(key: str) -> PoolTimings | None:
    """This host's ``PoolTimings`` (``key``: ``HostDescription.key``): from the kernel cache, else
    measured now (a fraction of a second) and cached; None without a pool library, or when the
    measurement was disturbed by other work on the machine (``_plausible``)."""
    with _LOCK:
        if key in _TIMINGS:
            return _TIMINGS[key]
        from .build import _atomic_write

        path = timings_path(key)
        timings = _read(path)
        if timings is None:
            pool = process_pool()
            if pool is None:
                return None
            # (the least of three medians: a round that another process's time slice delayed says
            # nothing about the pool)
            timings = PoolTimings(min(float(pool.tv_pool_fork_join_ns(2, _MEASURE_ROUNDS, 0)) for _ in range(3)),
                                  min(float(pool.tv_pool_fork_join_ns(2, _MEASURE_ROUNDS // 10, 1)) for _ in range(3)))
            if not _plausible(timings):
                # Every round waited for a time slice of another process (a busy machine: ~1 ms, the
                # scheduler's tick): that says nothing about this host, so it is neither cached nor used;
                # the rules keep their unmeasured defaults and a later process measures again.
                _TIMINGS[key] = None
                return None
            _atomic_write(path, json.dumps({"fork_join_ns": timings.fork_join_ns, "wake_ns": timings.wake_ns,
                                            "host": key}).encode())
        _TIMINGS[key] = timings
        return timings


# Above these a measurement was disturbed by other processes: a split over two spinning workers takes
# 0.2-5 us on the CPUs measured, a wake of a sleeping one 5-100 us; a preempted round takes a tick.
_MAX_FORK_JOIN_NS, _MAX_WAKE_NS = 50_000.0, 500_000.0


def _plausible(timings: PoolTimings) -> bool:
    return timings.fork_join_ns <= _MAX_FORK_JOIN_NS and timings.wake_ns <= _MAX_WAKE_NS


def _read(path) -> PoolTimings | None:
    """The timings a file of this cache holds, or None when it is missing or not exactly that (data)."""
    try:
        data = json.loads(path.read_text())
        values = data["fork_join_ns"], data["wake_ns"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e9 for v in values):
        return None
    timings = PoolTimings(float(values[0]), float(values[1]))
    return timings if _plausible(timings) else None  # (a disturbed measurement an older version cached)
