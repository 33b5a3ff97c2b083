"""Compiling generated C into a shared library, cached on disk and loaded with ctypes.

The compiler is ``$TENSORVM_CC``, else ``$CC``, else ``cc``. Its capabilities are probed once per
process and cached on disk next to the libraries: ``-march=native`` is used when accepted, OpenMP
(``-fopenmp``) when it compiles and links, else ``-fopenmp-simd`` (vector pragmas only), else neither;
glibc's vector math library when it links (``-DTV_VECTOR_MATH``); Python's headers when present (for
the kernels' Python-facing wrapper module). Libraries live in ``$TENSORVM_CACHE_DIR`` (default
``~/.cache/tensorvm``), named by a hash of the sources, the compiler and the flags, so a second build
of the same source is a cache hit; files are written to a temporary name and renamed, so concurrent
processes never see half a library. The cache is trusted only as far as it is checked: it must be
this user's and not group/world-writable (else a private temporary cache is used, with a warning),
each library is loaded only if its bytes match the SHA-256 recorded beside it when it was built, and
the toolchain probe file is used only when it names exactly the compiler and flags a probe would. Big modules compile as several translation units in parallel and
link into the one library.

``build_library(source)`` returns a ``Library`` whose ``info`` (``BuildInfo``) says whether it came from
the cache and how long compiling took; ``build_stats()`` sums this over the process (for benchmarks).
A missing or failing compiler raises ``CompilerError`` (an ``UnsupportedError``) with the compiler's
output and a hint to use target "python".

Threads: one budget, ``set_num_threads(n)`` (initially ``$TENSORVM_NUM_THREADS``, else the first value
of ``$OMP_NUM_THREADS``, else the cores this process may run on, ``os.sched_getaffinity``), shared by the
kernels' parallel loops (in a shared library the generated loops, the softmax, the products and the
convolutions all run on the process's one pool, ``lib/tv_team.h`` and ``codegen/pool.py``; a few hand-written library regions, im2col,
sort/scan and NMS, and the static AOT form still use OpenMP) and the host BLAS: NumPy's OpenBLAS gets the same count, and a kernel that calls
BLAS inside its own parallel split calls it single-threaded (``c_emit``), so no second pool competes
for the cores. Idle OpenMP threads spin briefly, then sleep (``GOMP_SPINCOUNT=20000`` is set before the OpenMP
runtime loads, unless ``$OMP_WAIT_POLICY`` or ``$GOMP_SPINCOUNT`` is already set): libgomp's default spinning
made every thread look CPU-bound to the scheduler, so with another process on one of the cores each
fork-join waited for a time slice (2 threads, a 4-layer 512-wide MLP at batch 32 on a loaded 2-core
machine: 7-17 ms per call spinning, 0.9-1.8 ms sleeping; ``benchmarks/threads_under_load.py``). The count
is each library's own (``tv_num_threads`` in the prelude): ``omp_set_num_threads`` would set it for the
calling thread only, and kernels run on whichever Python thread calls them.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sysconfig
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import UnsupportedError
from ..runtime.library import (  # noqa: F401 - the runtime's part (loading, threads), re-exported
    _LOADED,
    _NUM_THREADS,
    _THREAD_SETTERS,
    available_cores,
    file_sha256,
    follow_thread_budget,
    get_num_threads,
    hash_path,
    load_cdll,
    set_num_threads,
    set_pool_provider,
    untrusted_directory,
    verified_library,
)
from ..runtime.library import library_threads as _library_threads


def _pool_table() -> int:
    from .pool import pool_table

    return pool_table()


set_pool_provider(_pool_table)  # every library loaded from now on runs on the process's one pool (codegen/pool.py)

__all__ = [
    "CompilerError", "Toolchain", "BuildInfo", "Library", "find_toolchain", "have_compiler", "default_target",
    "default_target_reason", "cache_dir", "build_library", "build_stats", "reset_toolchain", "run_tool",
    "compile_timeout", "compile_workers", "set_num_threads", "get_num_threads", "follow_thread_budget",
    "available_cores", "kernel_threads", "library_threads", "record_library", "verified_library", "CompilerTimeout",
    "load_built_library", "portable_toolchain", "HOST_FLAGS", "SharedUnit",
]

_BASE_FLAGS = ("-O3", "-fPIC", "-shared", "-std=gnu11", "-fwrapv", "-fno-math-errno", "-fno-trapping-math")
_HINT = 'use target="python" to run with NumPy kernels instead'


@dataclass(frozen=True)
class SharedUnit:
    """A translation unit that many libraries link: a part of the kernel library (``c_emit.library_part``).
    Its object file is compiled once per compiler, flags and text, kept in the kernel cache beside the
    libraries (``tvo_<hash>.o`` with its SHA-256, checked before each link like a library before loading)
    and linked into every library that lists it."""

    text: str
    flags: tuple = ()


class CompilerError(UnsupportedError):
    """The C compiler is missing or rejected generated code."""


class CompilerTimeout(CompilerError):
    """The C compiler ran past ``compile_timeout()`` and was killed."""


@dataclass(frozen=True)
class Toolchain:
    compiler: str
    version: str
    flags: tuple
    openmp: bool
    simd_pragmas: bool
    float16: bool
    python_include: str = ""  # where Python.h is, when a C wrapper for Python calls can be built
    aliases: bool = False  # hidden aliases of static functions link (the kernel library's parts: build.SharedUnit)

    @property
    def fingerprint(self) -> str:
        return f"{self.compiler}|{self.version}|{' '.join(self.flags)}"


@dataclass(frozen=True)
class BuildInfo:
    """How a library was obtained: ``cached`` (found on disk) and the seconds compiling took (0 if cached);
    ``flags`` it was built with; ``portable`` says why it was built without the host flags (``HOST_FLAGS``)
    when the compiler failed with them (empty when it was not)."""

    path: str
    source_hash: str
    cached: bool
    compile_seconds: float
    load_seconds: float
    flags: tuple
    portable: str = ""


@dataclass
class _Stats:
    builds: int = 0
    cache_hits: int = 0
    compile_seconds: float = 0.0
    history: list = field(default_factory=list)


_STATS = _Stats()
_LOCK = threading.Lock()
_TOOLCHAIN: Toolchain | None = None


def build_stats() -> dict:
    """Totals over this process: builds, cache hits, seconds spent compiling, and each ``BuildInfo``."""
    return {"builds": _STATS.builds, "cache_hits": _STATS.cache_hits,
            "compile_seconds": _STATS.compile_seconds, "history": list(_STATS.history)}


def kernel_threads() -> int:
    """How many threads the generated kernels' parallel loops use (1 without OpenMP)."""
    if _TOOLCHAIN is not None and not _TOOLCHAIN.openmp:
        return 1
    return get_num_threads()


def library_threads(library) -> int:
    """The thread count a loaded kernel library's OpenMP loops would use now (1 without OpenMP), as the
    library itself reports it; ``library`` is a ``Library`` or the path ``BuildInfo.path`` names."""
    return _library_threads(library.info.path if isinstance(library, Library) else library)


_PRIVATE_CACHES: dict = {}  # untrusted cache directory -> this process's private replacement
_PRIVATE_LOCK = threading.Lock()


def cache_dir() -> Path:
    """The kernel cache: ``$TENSORVM_CACHE_DIR`` or ``~/.cache/tensorvm``, when only this user can write it.

    What the cache holds is loaded into the process (libraries) or run (the compiler the toolchain file
    names), so a directory that another user can write (group/world-writable, or owned by someone else)
    is not used: this process falls back to a private temporary cache (compiling again) with a warning.
    """
    path = Path(os.environ.get("TENSORVM_CACHE_DIR") or Path.home() / ".cache" / "tensorvm")
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = path.stat()
    except OSError as err:
        raise CompilerError(f"codegen: cannot use the kernel cache directory {path}: {err}; set "
                            f"TENSORVM_CACHE_DIR to a writable directory or {_HINT}") from None
    why = untrusted_directory(st)
    if why is None:
        return path
    with _PRIVATE_LOCK:  # (not _LOCK: find_toolchain holds it while probing)
        private = _PRIVATE_CACHES.get(str(path))
        if private is None:
            private = Path(tempfile.mkdtemp(prefix="tensorvm-cache-"))  # mode 0700, ours
            _PRIVATE_CACHES[str(path)] = private
            warnings.warn(f"tensorvm: not using the kernel cache {path}: {why}; compiling into the private "
                          f"cache {private} for this process instead (make the directory yours and not "
                          f"group/world-writable, or set TENSORVM_CACHE_DIR)", RuntimeWarning, stacklevel=2)
    return private


def _compiler_name() -> str:
    return os.environ.get("TENSORVM_CC") or os.environ.get("CC") or "cc"


def reset_toolchain():
    """Forget the probed toolchain (after changing ``TENSORVM_CC``/``CC``)."""
    global _TOOLCHAIN
    with _LOCK:
        _TOOLCHAIN = None


def find_toolchain() -> Toolchain:
    """The C compiler and the flags it accepts (probed once, cached in memory and on disk)."""
    global _TOOLCHAIN
    with _LOCK:
        if _TOOLCHAIN is None or _TOOLCHAIN.compiler != shutil.which(_compiler_name()):
            _TOOLCHAIN = _probe()
        return _TOOLCHAIN


def have_compiler() -> bool:
    """Whether a C compiler that can build kernels is found (target "c" needs one)."""
    try:
        find_toolchain()
    except CompilerError:
        return False
    return True


def default_target() -> str:
    """The target ``tv.vm.compile``, ``create_executor`` and ``tensorvm compile`` use when given none: "c"
    (generated C kernels) when a C compiler that can build kernels is found, else "python" (NumPy
    kernels); ``$TENSORVM_TARGET`` (``c`` or ``python``) overrides it. ``default_target_reason()`` says why."""
    return _default_target()[0]


def default_target_reason() -> str:
    """Why ``default_target()`` is what it is (the compiler found, or why none could be used)."""
    return _default_target()[1]


def _default_target() -> tuple[str, str]:
    chosen = os.environ.get("TENSORVM_TARGET", "").strip().lower()
    if chosen in ("c", "python"):
        return chosen, f"$TENSORVM_TARGET is {chosen!r}"
    if chosen:
        raise UnsupportedError(f"$TENSORVM_TARGET must be 'c' or 'python', got {chosen!r}")
    try:
        toolchain = find_toolchain()
    except CompilerError as err:
        return "python", f"no usable C compiler: {str(err).splitlines()[0]}"
    return "c", f"C compiler {toolchain.compiler} found"


def _probe() -> Toolchain:
    name = _compiler_name()
    compiler = shutil.which(name)
    if compiler is None:
        raise CompilerError(f"codegen: no C compiler found (looked for {name!r}; set TENSORVM_CC or CC to one); "
                            f"{_HINT}")
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
    except OSError as err:
        raise CompilerError(f"codegen: cannot run the C compiler {compiler}: {err}; {_HINT}") from None
    first_line = (version.stdout or version.stderr).strip().splitlines()[0] if (version.stdout or version.stderr) \
        else ""
    binary = os.stat(compiler)
    # The probe's result depends on the compiler binary, the base flags and the prelude it compiles.
    from .c_emit import PRELUDE

    identity = (f"{compiler}|{first_line}|{binary.st_mtime_ns}|{binary.st_size}|{_BASE_FLAGS}|{PRELUDE}"
                f"|{_IF_CONVERSION_PROBE}|{_ALIAS_PROBE}")
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    probe_file = cache_dir() / f"toolchain-{key}.json"
    try:
        cached = _toolchain_from_json(json.loads(probe_file.read_text()), compiler, first_line)
    except (OSError, ValueError):
        cached = None
    if cached is not None:
        return cached
    toolchain = _probe_flags(compiler, first_line)
    _atomic_write(probe_file, json.dumps(asdict(toolchain)).encode())
    return toolchain


_OPTIONAL_FLAGS = ("-march=native", "-fexcess-precision=standard", "-fopenmp", "-fopenmp-simd", "-DTV_VECTOR_MATH",
                   "-DTV_NO_LOOP_IF_CONVERSION")


def _toolchain_from_json(data, compiler: str, version: str) -> Toolchain | None:
    """The toolchain a probe file describes, if it is exactly what ``_probe_flags`` could have written for
    this compiler (else None: probe again). The file names a command to run and its flags, so nothing in
    it is taken on trust: the compiler must be the one found on the PATH, the flags the probe's own."""
    fields = {f.name for f in dataclasses.fields(Toolchain)}
    if not isinstance(data, dict) or set(data) != fields:
        return None
    flags = data["flags"]
    if data["compiler"] != compiler or data["version"] != version or not isinstance(flags, list):
        return None
    extra = flags[len(_BASE_FLAGS):]
    if tuple(flags[:len(_BASE_FLAGS)]) != _BASE_FLAGS or len(set(extra)) != len(extra) \
            or not all(isinstance(f, str) and f in _OPTIONAL_FLAGS for f in extra):
        return None
    if not all(isinstance(data[k], bool) for k in ("openmp", "simd_pragmas", "float16", "aliases")) \
            or data["openmp"] != ("-fopenmp" in extra) \
            or data["python_include"] not in ("", sysconfig.get_paths().get("include") or ""):
        return None
    return Toolchain(compiler, version, tuple(flags), data["openmp"], data["simd_pragmas"], data["float16"],
                     data["python_include"], data["aliases"])


def _probe_flags(compiler: str, version: str) -> Toolchain:
    with tempfile.TemporaryDirectory(prefix="tensorvm-probe-") as tmp:
        def accepts(flags, code="int tv_probe(void) { return 0; }\n") -> bool:
            src = Path(tmp) / "probe.c"
            src.write_text(code)
            result = run_tool([compiler, *_BASE_FLAGS, *flags, str(src), "-o", str(Path(tmp) / "probe.so")], 120)
            return result.returncode == 0

        if not accepts(()):
            raise CompilerError(f"codegen: the C compiler {compiler} cannot build a shared library with "
                                f"{' '.join(_BASE_FLAGS)}; {_HINT}")
        flags = [f for f in ("-march=native", "-fexcess-precision=standard") if accepts((f,))]
        omp_code = "#include <omp.h>\nint tv_probe(void) { return omp_get_max_threads(); }\n"
        openmp = accepts(("-fopenmp",), omp_code)
        simd = openmp or accepts(("-fopenmp-simd",))
        if openmp:
            flags.append("-fopenmp")
        elif simd:
            flags.append("-fopenmp-simd")
        float16 = accepts(tuple(flags), "_Float16 tv_probe(_Float16 a) { return (_Float16)((float)a + 1.0f); }\n")
        if _vector_math_works(compiler, flags, tmp):
            flags.append("-DTV_VECTOR_MATH")
        if not _if_conversion_sound(compiler, flags, tmp):
            flags.append("-DTV_NO_LOOP_IF_CONVERSION")  # PRELUDE's TV_SELECT_OF_LOADS turns it off
        # (ELF has them; Mach-O, for one, does not: there the library stays one unit per model)
        aliases = accepts(tuple(flags), _ALIAS_PROBE)
        include = sysconfig.get_paths().get("include") or ""
        python_code = "#define PY_SSIZE_T_CLEAN\n#include <Python.h>\nint tv_probe(PyObject* o) { return PyTuple_Check(o); }\n"
        if not include or not accepts(("-I" + include,), python_code):
            include = ""
    return Toolchain(compiler, version, tuple(_BASE_FLAGS) + tuple(flags), openmp, simd, float16, include, aliases)


# What a library part's unit does (c_emit.library_part): export a static function under a hidden alias of its type.
_ALIAS_PROBE = ("__attribute__((unused)) static int tv_twice(int a) { return 2 * a; }\n"
                'extern __typeof__(tv_twice) tv_probe __attribute__((alias("tv_twice"), visibility("hidden")));\n'
                "int tv_probe_call(int a) { return tv_probe(a); }\n")


def _vector_math_works(compiler: str, flags: list, tmp: str) -> bool:
    """Whether the prelude's vector-math declarations compile, link and load (glibc's libmvec)."""
    from .c_emit import PRELUDE  # the prelude is the thing to probe

    code = (_PROBES / "vector_math.c").read_text().replace('#include "tv_kernel.h"\n', PRELUDE, 1)
    src, lib = Path(tmp) / "vector_math.c", Path(tmp) / "vector_math.so"
    src.write_text(code)
    result = run_tool([compiler, *_BASE_FLAGS, *flags, "-DTV_VECTOR_MATH", str(src), "-o", str(lib), "-lm"], 120)
    if result.returncode != 0:
        return False
    try:
        ctypes.CDLL(str(lib))
    except OSError:
        return False
    return True


# The toolchain probes' C (what each one tests is said in its file).
_PROBES = Path(__file__).parent / "probes"
_IF_CONVERSION_PROBE = (_PROBES / "if_conversion.c").read_text()


def _if_conversion_sound(compiler: str, flags: list, tmp: str) -> bool:
    """Whether ``_IF_CONVERSION_PROBE`` built with ``flags`` computes the right answer."""
    src, lib = Path(tmp) / "if_conversion.c", Path(tmp) / "if_conversion.so"
    src.write_text(_IF_CONVERSION_PROBE)
    result = run_tool([compiler, *_BASE_FLAGS, *flags, str(src), "-o", str(lib)], 120)
    if result.returncode != 0:
        return False  # cannot tell: keep the safer flags
    source = (ctypes.c_float * 6)(*range(6))
    out = (ctypes.c_float * 12)()
    ctypes.CDLL(str(lib)).tv_probe(source, out)
    return list(out) == [float(v) for v in range(6)] * 2


def _atomic_write(path: Path, data: bytes):
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Library:
    """A loaded shared library of kernels."""

    def __init__(self, cdll: ctypes.CDLL, info: BuildInfo, python_module=None):
        self._cdll = cdll
        self._python_module = python_module
        self.info = info

    def function(self, name: str, num_pointers: int, num_ints: int):
        """The kernel itself, called through ctypes with data pointers and dims."""
        fn = getattr(self._cdll, name)
        fn.argtypes = [ctypes.c_void_p] * num_pointers + [ctypes.c_int64] * num_ints
        fn.restype = ctypes.c_int32
        return fn

    def python_function(self, name: str):
        """The kernel's wrapper in the library's Python extension module, or None without one."""
        if self._python_module is None:
            return None
        return getattr(self._python_module, name, None)


def build_library(source: str | list, toolchain: Toolchain | None = None, python_module: str = "") -> Library:
    """Compile ``source`` into a shared library (or reuse the cached one) and load it.

    ``source`` may be a list of translation units (each a text, a ``(text, extra_flags)`` pair or a
    ``SharedUnit``): they are compiled concurrently (one per core) and linked into the one library, which
    is what makes large modules build fast; a ``SharedUnit`` already in the cache is not compiled again. ``python_module`` names the CPython extension module one of the units
    defines (``PyInit_<name>``), imported from the library once it is loaded.
    """
    toolchain = toolchain or find_toolchain()
    units = [source] if isinstance(source, str) else list(source)
    units = [_unit(u) for u in units]
    directory = cache_dir()
    digest, lib_path = _library_path(units, toolchain, directory)
    portable = ""
    # A library found on disk is loaded only when its bytes hash to what the build that wrote it recorded
    # (a truncated, corrupted or swapped file is rebuilt, never loaded).
    cached = str(lib_path) in _LOADED or verified_library(lib_path)
    fallback = portable_toolchain(toolchain)
    if not cached and fallback is not None:  # the host flags failed on these units before: the portable build
        portable = _portable_reason(lib_path)
        if portable:
            toolchain = fallback
            digest, lib_path = _library_path(units, toolchain, directory)
            cached = str(lib_path) in _LOADED or verified_library(lib_path)
    compile_seconds = 0.0
    if not cached:
        try:
            compile_seconds = _compile(units, toolchain, directory, digest, lib_path)
        except CompilerTimeout:
            raise
        except CompilerError as err:
            if fallback is None or portable:
                raise
            # The toolchain accepted the host flags on the probe but fails on this code (e.g. an assembler
            # that does not know the instructions -march=native lets the compiler use): build it portable.
            portable = (f"the compiler failed with {' '.join(f for f in toolchain.flags if f in HOST_FLAGS)}, "
                        f"so the library was built without them: {_first_error_line(err)}")
            host_lib = lib_path
            toolchain = fallback
            digest, lib_path = _library_path(units, toolchain, directory)
            start = time.perf_counter()
            try:
                _compile(units, toolchain, directory, digest, lib_path)
            except CompilerError as portable_err:
                raise CompilerError(f"{err}\n(the portable build without the host flags failed too: "
                                    f"{_first_error_line(portable_err)})") from None
            compile_seconds = time.perf_counter() - start
            _atomic_write(_portable_path(host_lib), portable.encode())
        if not verified_library(lib_path):
            raise CompilerError(f"codegen: the library {lib_path} changed on disk right after it was built "
                                f"(is another process writing the kernel cache?); {_HINT}")
    return _load(lib_path, digest, cached, compile_seconds, toolchain.flags, portable, python_module)


def load_built_library(path: str, python_module: str = "", flags: tuple = (), portable: str = "") -> Library | None:
    """The library a ``build_library`` call built before at ``path`` (its ``BuildInfo.path``; ``flags`` and
    ``portable`` as that ``BuildInfo`` said), loaded again without its sources; None when it is not in the
    kernel cache or its bytes do not match their recorded SHA-256. For callers that keep what they need
    to call the library, keyed by what generated it."""
    lib_path = Path(path)
    if lib_path.parent != cache_dir() or not lib_path.name.startswith("tv_") or lib_path.suffix != ".so":
        return None
    if str(lib_path) not in _LOADED and not verified_library(lib_path):
        return None
    return _load(lib_path, lib_path.stem[3:], True, 0.0, tuple(flags), portable, python_module)


def _unit(unit) -> tuple:
    """A unit as ``(text, extra flags, shared)``."""
    if isinstance(unit, SharedUnit):
        return unit.text, tuple(unit.flags), True
    if isinstance(unit, tuple):
        return unit[0], tuple(unit[1]), False
    return unit, (), False


def _load(lib_path: Path, digest: str, cached: bool, compile_seconds: float, flags: tuple, portable: str,
          python_module: str) -> Library:
    key = str(lib_path)
    start = time.perf_counter()
    try:
        cdll = load_cdll(key)
    except OSError as err:
        raise CompilerError(f"codegen: cannot load the compiled library {lib_path}: {err}; {_HINT}") from None
    with _LOCK:
        module = _import_extension(python_module, key) if python_module else None
        info = BuildInfo(key, digest, cached, compile_seconds, time.perf_counter() - start, flags, portable)
        _STATS.builds += 1
        _STATS.cache_hits += int(cached)
        _STATS.compile_seconds += compile_seconds
        _STATS.history.append(info)
    return Library(cdll, info, module)


# Flags that target the machine itself; a build that fails with them is retried without them (portable).
HOST_FLAGS = ("-march=native",)


def portable_toolchain(toolchain: Toolchain) -> Toolchain | None:
    """``toolchain`` without ``HOST_FLAGS``, or None when it has none of them."""
    flags = tuple(f for f in toolchain.flags if f not in HOST_FLAGS)
    return dataclasses.replace(toolchain, flags=flags) if flags != toolchain.flags else None


def _library_path(units: list, toolchain: Toolchain, directory: Path) -> tuple[str, Path]:
    identity = "\0".join(f"{' '.join(extra)}\0{'shared' if shared else ''}\0{text}" for text, extra, shared in units)
    digest = hashlib.sha256(f"{toolchain.fingerprint}\0{len(units)}\0{identity}".encode()).hexdigest()[:32]
    return digest, directory / f"tv_{digest}.so"


def _portable_path(lib_path: Path) -> Path:
    """Where a failed build with the host flags leaves its reason (so later builds go portable at once)."""
    return lib_path.with_name(lib_path.name + ".portable")


def _portable_reason(lib_path: Path) -> str:
    """The recorded reason the host flags failed for ``lib_path``'s sources ("" when they did not)."""
    try:
        text = _portable_path(lib_path).read_bytes()[:2000].decode("utf-8", "replace")
    except OSError:
        return ""
    return "".join(c if c.isprintable() else " " for c in text).strip()  # (shown to the user: text only)


def _first_error_line(err: Exception) -> str:
    lines = [line for line in str(err).splitlines() if "error" in line.lower() and not line.startswith("command:")]
    return (lines[1] if len(lines) > 1 else lines[0] if lines else str(err).splitlines()[0])[:300]


def record_library(tmp_lib: str | Path, lib_path: Path) -> None:
    """Move a freshly built library ``tmp_lib`` to ``lib_path`` with the SHA-256 of its bytes beside it."""
    _atomic_write(hash_path(lib_path), (file_sha256(Path(tmp_lib)) + "\n").encode())
    os.replace(tmp_lib, lib_path)


def _import_extension(name: str, path: str):
    """Load the extension module ``name`` from the library at ``path`` (not put in ``sys.modules``)."""
    key = (name, path)
    if key not in _LOADED:
        loader = importlib.machinery.ExtensionFileLoader(name, path)
        spec = importlib.util.spec_from_file_location(name, path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        _LOADED[key] = module
    return _LOADED[key]


def compile_timeout() -> float:
    """Seconds one compiler run may take: ``$TENSORVM_COMPILE_TIMEOUT`` or 600."""
    value = os.environ.get("TENSORVM_COMPILE_TIMEOUT", "").strip()
    try:
        seconds = float(value) if value else 600.0
    except ValueError:
        seconds = 600.0
    return seconds if seconds > 0 else 600.0


def run_tool(command: list, timeout: float) -> subprocess.CompletedProcess:
    """Run ``command`` (output captured as text) in a process group of its own; past ``timeout`` seconds
    the whole group is killed (the driver's ``cc1``/``as``/``ld`` children too: killing only the driver
    once left a ``cc1`` running for 54 minutes with 8 GB) and ``subprocess.TimeoutExpired`` raised."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:  # the timeout, or an interrupt: leave nothing of the group running
        _kill_group(proc)
        raise
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def compile_workers() -> int:
    """How many compiler processes run at once: ``$TENSORVM_COMPILE_JOBS``, else one per core. (Not the
    kernels' thread budget: a model run on one thread still compiles once, and compiling MobileNetV3's
    units one at a time under ``set_num_threads(1)`` made its cold compile 28 s instead of 19.5 s here.)"""
    value = os.environ.get("TENSORVM_COMPILE_JOBS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return os.cpu_count() or 1


def _kill_group(proc: subprocess.Popen):
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)  # (the group id is the child's pid: start_new_session)
    except (ProcessLookupError, PermissionError):
        pass
    proc.kill()
    proc.communicate()


def _run_compiler(command: list, src_path: Path):
    timeout = compile_timeout()
    try:
        result = run_tool(command, timeout)
    except subprocess.TimeoutExpired:
        raise CompilerTimeout(f"codegen: the C compiler took more than {timeout:g} s on {src_path} and was killed "
                            f"with its whole process group (set TENSORVM_COMPILE_TIMEOUT to allow more); "
                            f"{_HINT}") from None
    except OSError as err:
        raise CompilerError(f"codegen: running the C compiler failed: {err}; {_HINT}") from None
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip()
        if len(output) > 4000:
            output = output[:4000] + "\n... (truncated)"
        raise CompilerError(f"codegen: the C compiler failed on {src_path} (exit {result.returncode}); {_HINT}.\n"
                            f"command: {' '.join(command)}\n{output}")


def _compile(units: list, toolchain: Toolchain, directory: Path, digest: str, lib_path: Path) -> float:
    fd, tmp_lib = tempfile.mkstemp(dir=directory, prefix=f"tv_{digest}.", suffix=".so.tmp")
    os.close(fd)
    start = time.perf_counter()
    objects, temporary = [], []
    try:
        if len(units) == 1 and not units[0][2]:
            text, extra, _ = units[0]
            src_path = directory / f"tv_{digest}.c"
            _atomic_write(src_path, text.encode())
            _run_compiler([toolchain.compiler, *toolchain.flags, *extra, str(src_path), "-o", tmp_lib, "-lm"],
                          src_path)
        else:
            compile_flags = [f for f in toolchain.flags if f != "-shared"]
            jobs, shared = [], []
            for k, (text, extra, is_shared) in enumerate(units):
                if is_shared:
                    obj_path = _shared_object_path(text, extra, toolchain, directory)
                    objects.append(str(obj_path))
                    if verified_library(obj_path):
                        continue
                    src_path = obj_path.with_suffix(".c")
                    fd, obj = tempfile.mkstemp(dir=directory, prefix=obj_path.name + ".", suffix=".tmp.o")
                    os.close(fd)
                    shared.append((obj, obj_path))
                else:
                    src_path = directory / f"tv_{digest}_{k}.c"
                    obj = f"{tmp_lib}.{k}.o"
                    objects.append(obj)
                temporary.append(obj)
                _atomic_write(src_path, text.encode())
                jobs.append(([toolchain.compiler, *compile_flags, *extra, "-c", str(src_path), "-o", obj], src_path,
                             (0, 0) if is_shared else (1, -len(text))))
            # The longest compiles first: with fewer workers than units, the longest starts at once instead
            # of after the short ones (the library is ready when the last unit is). The shared parts, in
            # their table's order (c_emit.LIBRARY_PARTS: the longest first; most of their text is a prelude
            # they do not compile), then the other units, the largest text first.
            jobs.sort(key=lambda job: job[2])
            with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), compile_workers()))) as pool:
                for future in [pool.submit(_run_compiler, command, src_path) for command, src_path, _ in jobs]:
                    future.result()
            for obj, obj_path in shared:  # (another process may have recorded the same object meanwhile)
                record_library(obj, obj_path)
            _run_compiler([toolchain.compiler, *toolchain.flags, *objects, "-o", tmp_lib, "-lm"], lib_path)
        record_library(tmp_lib, lib_path)
    finally:
        Path(tmp_lib).unlink(missing_ok=True)
        for obj in temporary:
            Path(obj).unlink(missing_ok=True)
    return time.perf_counter() - start


def _shared_object_path(text: str, extra: tuple, toolchain: Toolchain, directory: Path) -> Path:
    """Where a ``SharedUnit``'s object is cached: named by its compiler, flags and text."""
    identity = f"{toolchain.fingerprint}\0{' '.join(extra)}\0{text}"
    return directory / f"tvo_{hashlib.sha256(identity.encode()).hexdigest()[:32]}.o"
