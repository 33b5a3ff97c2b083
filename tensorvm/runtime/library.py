"""Loading compiled kernel libraries, without the compiler: verified files, one thread budget, the CPU.

The code generator (``tensorvm.codegen.build``) compiles libraries into the kernel cache; this module is
the part a deployed executable needs to *use* them (``vm.kernel_abi``): a library is loaded only when its
bytes hash to what was recorded beside it when it was built (``verified_library``) and the cache directory
is this user's and not group/world-writable (``untrusted_directory``); every loaded library gets the
process's thread budget, the process's one thread pool and the host BLAS (``load_cdll``). ``cpu_features()`` reads the running CPU's
instruction-set extensions from ``/proc/cpuinfo`` (``$TENSORVM_CPU_FEATURES`` replaces them, to test a
machine without some of them).

Threads: one budget, ``set_num_threads(n)`` (initially ``$TENSORVM_NUM_THREADS``, a value other than a
positive integer being ignored with a warning, else the first value of ``$OMP_NUM_THREADS``, else the cores
this process may run on), shared by the kernels' OpenMP loops and the
host BLAS (see ``tensorvm.codegen.build``'s documentation for why idle OpenMP threads sleep).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import stat
import threading
import warnings
from pathlib import Path

from . import blas

__all__ = ["set_num_threads", "get_num_threads", "follow_thread_budget", "available_cores", "load_cdll",
           "verified_library", "file_sha256", "untrusted_directory", "kernel_cache_dir", "cpu_features",
           "isa_features", "target_triple", "library_threads"]

_LOCK = threading.Lock()
_LOADED: dict = {}  # path -> ctypes.CDLL (and, for extension modules, (name, path) -> module)
_LOADED_ANY: list = [False]
_NUM_THREADS: list = [None]  # set_num_threads' choice, applied to libraries loaded later too
_THREAD_SETTERS: list = []  # other libraries' setters (AOT models: ``follow_thread_budget``)
_POOL: list = [0, None]  # the process pool's table of entry points (0: none yet), and what provides it


def _threads_from_environment():
    value = os.environ.get("TENSORVM_NUM_THREADS")
    if value is None:
        return
    if value.strip().isdigit() and int(value) > 0:
        _NUM_THREADS[0] = int(value)
        return
    # A warning, not an error: this runs at import, and a typo in the environment must not break it.
    warnings.warn(f"tensorvm: ignoring TENSORVM_NUM_THREADS={value!r}: expected a positive integer; using the "
                  f"default thread budget ($OMP_NUM_THREADS, else the cores this process may use)",
                  RuntimeWarning, stacklevel=2)


# Idle OpenMP threads spin this many rounds (tens of microseconds on current cores: the gap between the
# kernel calls of one inference), then sleep. Waking a sleeping thread for every kernel made the suite's
# LSTM 2.4x slower at 2 threads on a quiet machine (``OMP_WAIT_POLICY=passive``); libgomp's default spin
# (300,000 rounds) keeps a thread on its core long enough that a busy core stalls every fork-join
# (``benchmarks/threads_under_load.py``). docs/architecture.md has the measurements.
IDLE_SPIN_ROUNDS = 20000


def _idle_threads_sleep():
    """Sets libgomp's spin before sleeping (``GOMP_SPINCOUNT``) unless the user chose a wait policy or a
    spin; read once, when libgomp loads."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = str(IDLE_SPIN_ROUNDS)


_threads_from_environment()
_idle_threads_sleep()


def set_num_threads(count: int | None):
    """Sets the thread budget of kernels and BLAS: ``count`` threads, or ``None`` for the default (the
    cores this process may run on). See ``get_num_threads``.

    All kernel libraries share one OpenMP runtime, so this applies to every kernel, including those of
    libraries loaded later; NumPy's OpenBLAS gets the same count. Without OpenMP the kernels are
    single-threaded anyway.
    """
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ValueError(f"set_num_threads: expected a positive integer or None, got {count!r}")
    with _LOCK:
        _NUM_THREADS[0] = count
        for cdll in _LOADED.values():
            if isinstance(cdll, ctypes.CDLL):
                _apply_threads(cdll)
        for setter in _THREAD_SETTERS:
            setter(get_num_threads())
        _apply_blas_threads()


def follow_thread_budget(setter) -> int:
    """Make ``setter(count)`` (a library's thread setter, such as an AOT model's
    ``tvmgen_<name>_set_num_threads``) follow the budget: called now and on every ``set_num_threads``.
    Returns what it returns now."""
    with _LOCK:
        if setter not in _THREAD_SETTERS:
            _THREAD_SETTERS.append(setter)
        return setter(get_num_threads())


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def get_num_threads() -> int:
    """The thread budget: ``set_num_threads``'s count, else ``$TENSORVM_NUM_THREADS``, else the first value
    of ``$OMP_NUM_THREADS``, else ``available_cores()``."""
    if _NUM_THREADS[0] is not None:
        return _NUM_THREADS[0]
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return available_cores()


def _apply_threads(cdll):
    try:
        setter = cdll.tv_set_num_threads
    except AttributeError:  # built with static prelude functions (AOT style): nothing to set
        return
    setter.argtypes = [ctypes.c_int32]
    setter(get_num_threads())


def _apply_blas_threads():
    host = blas.host_blas()
    if host is not None and host.set_threads is not None:
        host.set_threads(get_num_threads())


def library_threads(path: str) -> int:
    """The thread count the loaded kernel library at ``path`` would use now (1 without OpenMP), as the
    library itself reports it."""
    getter = _LOADED[str(path)].tv_get_num_threads
    getter.restype, getter.argtypes = ctypes.c_int32, []
    return int(getter())


def set_pool_provider(provider) -> None:
    """``provider()`` gives the address of the process's pool (``tv_team_pool``, see
    ``tensorvm.codegen.pool``), or 0 while there is none; asked on each load until it gives one."""
    _POOL[1] = provider


def _process_pool() -> int:
    if not _POOL[0] and _POOL[1] is not None:
        table = _POOL[1]()
        if table:
            with _LOCK:
                _POOL[0] = table
                for cdll in _LOADED.values():  # (those loaded before: the pool library, or without the provider)
                    if isinstance(cdll, ctypes.CDLL):
                        _attach_pool(cdll)
    return _POOL[0]


# The layout of the pool's state and table the process's pool library is built with (lib/tv_team.h:
# TV_TEAM_ABI, which the pool library is always built from): a library of another layout (prebuilt by an
# older tensorvm, or before the pool had a layout number) keeps its own pool.
TEAM_ABI = 2


def _attach_pool(cdll):
    try:
        attach, abi = cdll.tv_team_attach, cdll.tv_team_abi
    except AttributeError:  # a library without threads (no OpenMP), AOT style, or of an older layout: its own pool
        return
    abi.restype, abi.argtypes = ctypes.c_int32, []
    if abi() != TEAM_ABI:
        return
    attach.restype, attach.argtypes = ctypes.c_int32, [ctypes.c_void_p]
    attach(_POOL[0] or None)


def load_cdll(path: str) -> ctypes.CDLL:
    """Load the kernel library at ``path`` once per process (``OSError`` if it cannot be), giving it the
    thread budget, the process's pool and the host BLAS. The caller has checked that the file may be loaded."""
    key = str(path)
    _process_pool()
    with _LOCK:
        cdll = _LOADED.get(key)
        if cdll is None:
            cdll = ctypes.CDLL(key)
            _LOADED[key] = cdll
            if not _LOADED_ANY[0]:  # the first library: BLAS joins the budget too
                _LOADED_ANY[0] = True
                _apply_blas_threads()
            _apply_threads(cdll)
            _attach_pool(cdll)
            blas.attach(cdll)
        return cdll


# --- the cache's files ----------------------------------------------------------------------------
def untrusted_directory(st) -> str | None:
    """Why a cache directory with this ``stat`` is unsafe to load code from, or None."""
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"it is owned by user id {st.st_uid}, not by this user ({os.getuid()})"
    if st.st_mode & 0o022:
        return f"it is group- or world-writable (mode {stat.filemode(st.st_mode)})"
    return None


def kernel_cache_dir() -> tuple[Path | None, str]:
    """The kernel cache directory (``$TENSORVM_CACHE_DIR`` or ``~/.cache/tensorvm``) if it exists and may be
    loaded from, else ``(None, why not)``; never creates it (that is the compiler's job)."""
    path = Path(os.environ.get("TENSORVM_CACHE_DIR") or Path.home() / ".cache" / "tensorvm")
    try:
        st = path.stat()
    except OSError as err:
        return None, f"no kernel cache ({err.strerror}: {path})"
    why = untrusted_directory(st)
    return (None, f"the kernel cache {path} is not used: {why}") if why else (path, "")


def hash_path(lib_path: Path) -> Path:
    return lib_path.with_name(lib_path.name + ".sha256")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verified_library(lib_path: Path) -> bool:
    """Whether ``lib_path`` exists and its bytes have the SHA-256 recorded when it was built."""
    try:
        recorded = hash_path(lib_path).read_text().strip()
        return len(recorded) == 64 and file_sha256(lib_path) == recorded
    except OSError:
        return False


# --- the CPU --------------------------------------------------------------------------------------
# Instruction-set extensions among /proc/cpuinfo's x86 flags (the others describe the machine, not what
# code may use, and differ between hosts that run the same code); on other architectures every
# "Features" entry is an ISA extension.
_X86_ISA = re.compile(r"(sse\w*|ssse3|avx\w*|amx\w*|fma\w*|f16c|bmi\w*|popcnt|movbe|abm|lzcnt|adx|sha_ni|aes|"
                      r"pclmulqdq|vaes|vpclmulqdq|gfni|xsave\w*|cx16|rdrand|rdseed|mmx|cmov|vnni\w*)")
_X86 = ("x86_64", "amd64", "i386", "i686")


def isa_features(flags) -> tuple:
    """The instruction-set extensions among CPU ``flags`` (sorted, unique; names of letters, digits,
    underscores and dots only, as a saved manifest holds them)."""
    if platform.machine().lower() in _X86:
        flags = [f for f in flags if _X86_ISA.fullmatch(f)]
    return tuple(sorted({f for f in flags if re.fullmatch(r"[A-Za-z0-9_.]{1,64}", f)}))


def cpu_features(override: bool = True) -> tuple:
    """The running CPU's instruction-set extensions (``$TENSORVM_CPU_FEATURES``, comma- or space-separated,
    replaces what ``/proc/cpuinfo`` says unless ``override`` is False: a way to test a CPU without some of
    them; what a build records is always the real CPU's)."""
    value = os.environ.get("TENSORVM_CPU_FEATURES") if override else None
    if value is not None:
        return isa_features(value.replace(",", " ").split())
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() in ("flags", "Features"):
                    return isa_features(value.split())
    except OSError:
        pass
    return ()


def target_triple() -> str:
    """``machine-system`` of this process (what a shared library must match, beside the CPU features)."""
    return f"{platform.machine().lower()}-{platform.system().lower()}"
