"""Compile an ``AOTModule``'s C sources with ``cc`` into a shared library and run it from Python.

    runner = tv.aot.load(module)         # or module.load()
    out = runner(x, w)                    # @main's parameters, positional or by name; NumPy results
    runner.descriptor()                   # tvmgen_<name>_model read back from the library

The library holds exactly what an application links (the model file, the params file and the
``tensorvm_aot.c`` shim); the runner calls the shim's ``tvaot_run``, which checks every buffer against
the model descriptor before calling ``tvmgen_<name>_run``. Libraries are cached by a hash of the
sources, the compiler and its flags (``tensorvm.codegen.build``'s toolchain and cache directory).
Runs of one library take turns (a lock per library): a model with an internal workspace keeps it in the
library, shared by every runner of it, so concurrent runs would write each other's intermediates.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from ..codegen.build import (
    CompilerError,
    Toolchain,
    cache_dir,
    find_toolchain,
    follow_thread_budget,
    get_num_threads,
    run_tool,
)
from ..errors import ExecutionError, FormatError, ShapeError, UnsupportedError
from ..executor import CompiledExecutor
from .build import AOTModule

__all__ = ["load", "AOTRunner", "AOTExecutor", "compile_library", "object_sizes", "check_descriptor"]

_LOCK = threading.Lock()
_LOADED: dict = {}
_RUN_LOCKS: dict = {}  # library path -> the lock its runs take (see the module docstring)
_KERNEL_FLAG = 0x40000000


def _flags(toolchain: Toolchain) -> list:
    flags = list(toolchain.flags)
    if "-fopenmp-simd" in flags and "-fopenmp" not in flags:
        flags.append("-DTVAOT_OMP_SIMD")
    return flags


def compile_library(module: AOTModule, toolchain: Toolchain | None = None, extra_flags=()) -> tuple[Path, dict]:
    """Build (or find in the cache) the shared library of ``module``: ``(path, info)``."""
    from ..codegen.build import record_library, verified_library  # the kernel cache's hash records
    toolchain = toolchain or find_toolchain()
    flags = _flags(toolchain) + list(extra_flags)
    digest = hashlib.sha256()
    digest.update(toolchain.fingerprint.encode() + b"\0" + " ".join(flags).encode() + b"\0")
    with tempfile.TemporaryDirectory(prefix="tensorvm-aot-") as tmp:
        layout = module.write_sources(tmp)
        for path in sorted(Path(tmp).rglob("*")):
            if path.is_file():
                digest.update(str(path.relative_to(tmp)).encode() + b"\0" + path.read_bytes() + b"\0")
        key = digest.hexdigest()[:32]
        directory = cache_dir() / "aot"
        directory.mkdir(parents=True, exist_ok=True)
        lib_path = directory / f"tvaot_{module.name}_{key}.so"
        if verified_library(lib_path):  # its bytes hash to what its build recorded, else rebuilt
            return lib_path, {"cached": True, "compile_seconds": 0.0, "path": str(lib_path)}
        fd, tmp_lib = tempfile.mkstemp(dir=directory, prefix=lib_path.name, suffix=".tmp")
        os.close(fd)
        command = [toolchain.compiler, *flags, *[f"-I{d}" for d in layout["include_dirs"]],
                   *[str(s) for s in layout["sources"]], "-o", tmp_lib, "-lm"]
        start = time.perf_counter()
        _run_compiler(command, tmp_lib)
        seconds = time.perf_counter() - start
        record_library(tmp_lib, lib_path)
    return lib_path, {"cached": False, "compile_seconds": seconds, "path": str(lib_path)}


def _run_compiler(command: list, output: str):
    try:
        result = run_tool(command, 900)  # (killed with its process group past the timeout)
    except (OSError, subprocess.TimeoutExpired) as err:
        Path(output).unlink(missing_ok=True)
        raise CompilerError(f"AOT: running the C compiler failed: {err}") from None
    if result.returncode != 0:
        Path(output).unlink(missing_ok=True)
        text = (result.stderr or result.stdout).strip()
        if len(text) > 4000:
            text = text[:4000] + "\n... (truncated)"
        raise CompilerError(f"AOT: the C compiler failed (exit {result.returncode}).\ncommand: {' '.join(command)}\n"
                            f"{text}")


def object_sizes(module: AOTModule, flags=("-O2",), compiler: str | None = None) -> dict:
    """Compile each C source to an object file: ``{file: {"text", "data", "bss", "file_bytes"}}``.

    ``text``/``data``/``bss`` come from binutils ``size`` when it is installed (else ``None``)."""
    compiler = compiler or find_toolchain().compiler
    size_tool = shutil.which("size")
    out = {}
    with tempfile.TemporaryDirectory(prefix="tensorvm-aot-obj-") as tmp:
        layout = module.write_sources(tmp)
        for source in layout["sources"]:
            obj = Path(tmp) / (source.stem + ".o")
            _run_compiler([compiler, *flags, "-std=gnu11", "-c", *[f"-I{d}" for d in layout["include_dirs"]],
                           str(source), "-o", str(obj)], str(obj))
            entry = {"text": None, "data": None, "bss": None, "file_bytes": obj.stat().st_size}
            if size_tool:
                result = subprocess.run([size_tool, str(obj)], capture_output=True, text=True)
                fields = result.stdout.splitlines()[-1].split() if result.returncode == 0 else []
                if len(fields) >= 3:
                    entry.update(text=int(fields[0]), data=int(fields[1]), bss=int(fields[2]))
            out[source.name] = entry
    return out


class _TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_char_p), ("dtype_code", ctypes.c_uint8),
                ("dtype_bits", ctypes.c_uint8), ("ndim", ctypes.c_int32), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("size_bytes", ctypes.c_size_t), ("struct_offset", ctypes.c_size_t)]


class _Model(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_uint32), ("name", ctypes.c_char_p), ("num_inputs", ctypes.c_uint32),
                ("num_outputs", ctypes.c_uint32), ("inputs", ctypes.POINTER(_TensorInfo)),
                ("outputs", ctypes.POINTER(_TensorInfo)), ("workspace_size", ctypes.c_size_t),
                ("workspace_alignment", ctypes.c_size_t), ("workspace_external", ctypes.c_int32),
                ("reentrant", ctypes.c_int32), ("constants_size", ctypes.c_size_t), ("run", ctypes.c_void_p)]


_RUN_FN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


def load(module: AOTModule, toolchain: Toolchain | None = None, extra_flags=()) -> AOTRunner:
    """Compile ``module`` (cached) and return an ``AOTRunner``."""
    if not isinstance(module, AOTModule):
        raise ExecutionError(f"tv.aot.load expects an AOTModule (from tv.aot.build), got {type(module).__name__}")
    path, info = compile_library(module, toolchain, extra_flags)
    with _LOCK:
        cdll = _LOADED.get(str(path))
        if cdll is None:
            try:
                cdll = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)  # models of the same name must not interpose
            except OSError as err:
                if info["cached"]:  # a file on disk, not what the compiler just wrote
                    raise FormatError(f"AOT: the cached library {path}: expected a shared library, but it "
                                      f"cannot be loaded ({err}); delete it to build it again") from None
                raise CompilerError(f"AOT: cannot load the compiled library {path}: {err}") from None
            check_descriptor(module, cdll, path)
            _LOADED[str(path)] = cdll
        _RUN_LOCKS.setdefault(str(path), threading.Lock())
    return AOTRunner(module, cdll, path, info)


_ABI_VERSION = 1  # TVAOT_ABI_VERSION of runtime/include/tensorvm_aot.h
_MAX_NDIM = 32


def check_descriptor(module: AOTModule, cdll, path) -> None:
    """The library's ``tvmgen_<name>_model`` descriptor is the one ``module`` generates: the loader
    sizes the buffers it passes from ``module``, so a library of another model (a stale or swapped
    cache file) would run on the wrong buffers. Bounds are checked before anything is followed."""

    def fail(field, expected, got):
        return FormatError(f"AOT: the library {path} does not match model {module.name!r}: {field}: expected "
                           f"{expected}, got {got}; delete it to build it again")

    try:
        model = _Model.in_dll(cdll, f"{module.prefix}_model")
        for symbol in ("tvaot_run", "tvaot_error_string"):  # the shim's entry points
            getattr(cdll, symbol)
    except (ValueError, AttributeError) as err:
        raise FormatError(f"AOT: the library {path}: expected the symbols {module.prefix}_model, tvaot_run and "
                          f"tvaot_error_string ({err}); delete it to build it again") from None
    for field, expected in (("abi_version", _ABI_VERSION), ("num_inputs", len(module.inputs)),
                            ("num_outputs", len(module.outputs)), ("workspace_size", module.workspace_size),
                            ("workspace_alignment", module.workspace_alignment),
                            ("workspace_external", int(module.workspace_external))):
        if getattr(model, field) != expected:
            raise fail(field, expected, getattr(model, field))
    if not model.name or model.name.decode("utf-8", "replace") != module.name or not model.run:
        raise fail("name", repr(module.name), repr(model.name))
    for which, infos, ptr in (("input", module.inputs, model.inputs), ("output", module.outputs, model.outputs)):
        if infos and not ptr:
            raise fail(f"{which}s", f"{len(infos)} tensor descriptions", "none")
        for i, t in enumerate(infos):
            got = ptr[i]
            if not 0 <= got.ndim <= _MAX_NDIM or (got.ndim and not got.shape):
                raise fail(f"{which} {i} ({t.name}) rank", len(t.shape), got.ndim)
            shape = [got.shape[k] for k in range(got.ndim)]
            dtype = (got.dtype or b"").decode("utf-8", "replace")
            if shape != list(t.shape) or dtype != t.dtype or got.size_bytes != t.size_bytes:
                raise fail(f"{which} {i} ({t.name})", f"shape {list(t.shape)} {t.dtype} ({t.size_bytes} bytes)",
                           f"shape {shape} {dtype} ({got.size_bytes} bytes)")


class AOTRunner:
    """Runs a compiled AOT model on NumPy arrays (``runner(*args, **kwargs)``)."""

    def __init__(self, module: AOTModule, cdll, path: Path, build_info: dict):
        self.module = module
        self.library_path = path
        self._run_lock = _RUN_LOCKS.setdefault(str(path), threading.Lock())
        self.build_info = build_info
        self._cdll = cdll
        self._model = _Model.in_dll(cdll, f"{module.prefix}_model")
        self._run = cdll.tvaot_run
        self._run.restype = ctypes.c_int32
        self._run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                              ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
        self._error_string = cdll.tvaot_error_string
        self._error_string.restype = ctypes.c_char_p
        self._error_string.argtypes = [ctypes.c_int32]
        self._model_ptr = ctypes.addressof(self._model)
        threads = getattr(cdll, f"{module.prefix}_set_num_threads")
        threads.restype, threads.argtypes = ctypes.c_int32, [ctypes.c_int32]
        self._threads = threads
        follow_thread_budget(threads)  # set now and on every tv.set_num_threads
        self._n_in, self._n_out = len(module.inputs), len(module.outputs)
        self._in_sizes = (ctypes.c_size_t * max(self._n_in, 1))(*[t.size_bytes for t in module.inputs])
        self._out_sizes = (ctypes.c_size_t * max(self._n_out, 1))(*[t.size_bytes for t in module.outputs])
        self._workspace = None
        self._workspace_ptr = None
        if module.workspace_external and module.workspace_size:
            raw = np.zeros(module.workspace_size + module.workspace_alignment, dtype=np.uint8)
            start = (-raw.ctypes.data) % module.workspace_alignment
            self._workspace = raw[start:start + module.workspace_size]
            self._workspace_ptr = self._workspace.ctypes.data

    # -- introspection --

    @property
    def num_threads(self) -> int:
        """The threads the model's parallel loops use, as the library reports it (1 without OpenMP); it
        follows ``tv.set_num_threads``."""
        return int(self._threads(get_num_threads()))  # (re-setting the budget it already has)

    def descriptor(self) -> dict:
        """The C descriptor ``tvmgen_<name>_model`` as a dict (read from the library)."""
        m = self._model

        def tensors(ptr, count):
            out = []
            for i in range(count):
                t = ptr[i]
                out.append({"name": t.name.decode(), "dtype": t.dtype.decode(), "dtype_code": t.dtype_code,
                            "dtype_bits": t.dtype_bits, "shape": [t.shape[k] for k in range(t.ndim)],
                            "size_bytes": t.size_bytes})
            return out

        return {"abi_version": m.abi_version, "name": m.name.decode(), "num_inputs": m.num_inputs,
                "num_outputs": m.num_outputs, "inputs": tensors(m.inputs, m.num_inputs),
                "outputs": tensors(m.outputs, m.num_outputs), "workspace_size": m.workspace_size,
                "workspace_alignment": m.workspace_alignment, "workspace_external": bool(m.workspace_external),
                "reentrant": bool(m.reentrant), "constants_size": m.constants_size}

    # -- running --

    def __call__(self, *args, **kwargs):
        return self.run(*args, **kwargs)

    def run(self, *args, **kwargs):
        """Run on @main's parameters (tuples for tuple parameters); returns arrays in @main's result shape."""
        flat = self.flatten_args(args, kwargs)
        outputs = self.run_flat(flat)
        return _rebuild(self.module.output_tree, outputs)

    def flatten_args(self, args, kwargs) -> list:
        names = self.module.param_names
        if len(args) > len(names):
            raise ExecutionError(f"AOT model {self.module.name}: expected {len(names)} argument(s) "
                                 f"({', '.join(names)}), got {len(args)}")
        values = list(args) + [None] * (len(names) - len(args))
        given = [True] * len(args) + [False] * (len(names) - len(args))
        for key, value in kwargs.items():
            if key not in names:
                raise ExecutionError(f"AOT model {self.module.name}: no parameter named {key!r} (parameters: "
                                     f"{', '.join(names) or 'none'})")
            index = names.index(key)
            if given[index]:
                raise ExecutionError(f"AOT model {self.module.name}: parameter {key!r} given twice")
            values[index], given[index] = value, True
        missing = [n for n, g in zip(names, given) if not g]
        if missing:
            raise ExecutionError(f"AOT model {self.module.name}: missing argument(s) {', '.join(missing)}")
        flat = [None] * len(self.module.inputs)
        for name, tree, value in zip(names, self.module.input_tree, values):
            _flatten_into(tree, value, flat, name)
        return flat

    def run_flat(self, inputs: list) -> list:
        """Run on the flattened inputs (in descriptor order); returns the flattened outputs."""
        if len(inputs) != self._n_in:
            raise ExecutionError(f"AOT model {self.module.name}: expected {self._n_in} input tensors, "
                                 f"got {len(inputs)}")
        arrays = [self._check_input(info, value) for info, value in zip(self.module.inputs, inputs)]
        outputs = [np.empty(t.shape, dtype=t.dtype) for t in self.module.outputs]
        in_ptrs = (ctypes.c_void_p * max(self._n_in, 1))(*[a.ctypes.data for a in arrays])
        out_ptrs = (ctypes.c_void_p * max(self._n_out, 1))(*[a.ctypes.data for a in outputs])
        with self._run_lock:
            rc = self._run(self._model_ptr, in_ptrs, self._in_sizes, self._n_in, out_ptrs, self._out_sizes,
                           self._n_out, self._workspace_ptr, self.module.workspace_size)
        if rc:
            self._raise(rc)
        return outputs

    def _check_input(self, info, value) -> np.ndarray:
        if hasattr(value, "numpy") and callable(value.numpy):
            value = value.numpy()
        if isinstance(value, (bool, int, float)) and not isinstance(value, np.generic):
            value = np.asarray(value, dtype=info.dtype)
        array = np.asarray(value)
        if array.dtype != np.dtype(info.dtype):
            raise ExecutionError(f"AOT model {self.module.name}: input {info.name} must be {info.dtype}, got "
                                 f"{array.dtype}")
        if array.shape != tuple(info.shape):
            raise ShapeError(f"AOT model {self.module.name}: input {info.name} must have shape {tuple(info.shape)}, "
                             f"got {array.shape}")
        return np.ascontiguousarray(array)

    def _raise(self, rc: int):
        if rc & _KERNEL_FLAG:
            where, message = self.module.kernel_error(rc)
            code = rc & 0xFFF
            error = ShapeError if 0 < code < 1000 else ExecutionError
            raise error(f"AOT model {self.module.name}: kernel {where} failed: {message}")
        text = self._error_string(rc).decode()
        raise ExecutionError(f"AOT model {self.module.name}: run failed with code {rc}: {text}")

    def benchmark(self, *args, number: int = 10, repeat: int = 3, **kwargs) -> dict:
        """Seconds per run on pre-bound buffers: best and median of ``repeat`` rounds of ``number``
        runs. The buffers are checked once by ``tvaot_run``; the timed runs call the descriptor's
        entry directly (one ctypes call with three pointer arguments)."""
        arrays = [self._check_input(info, v) for info, v in zip(self.module.inputs, self.flatten_args(args, kwargs))]
        outputs = [np.empty(t.shape, dtype=t.dtype) for t in self.module.outputs]
        in_ptrs = (ctypes.c_void_p * max(self._n_in, 1))(*[a.ctypes.data for a in arrays])
        out_ptrs = (ctypes.c_void_p * max(self._n_out, 1))(*[a.ctypes.data for a in outputs])
        with self._run_lock:
            rc = self._run(self._model_ptr, in_ptrs, self._in_sizes, self._n_in, out_ptrs, self._out_sizes,
                           self._n_out, self._workspace_ptr, self.module.workspace_size)
            if rc:
                self._raise(rc)
            entry = _RUN_FN(self._model.run)
            call_args = (ctypes.cast(in_ptrs, ctypes.c_void_p), ctypes.cast(out_ptrs, ctypes.c_void_p),
                         ctypes.c_void_p(self._workspace_ptr))
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                for _ in range(number):
                    rc |= entry(*call_args)
                times.append((time.perf_counter() - start) / number)
        if rc:
            self._raise(rc)
        return {"best": min(times), "median": float(np.median(times)), "number": number, "repeat": repeat}

    def __repr__(self):
        return f"<AOTRunner {self.module.name} ({self.library_path.name})>"


def _flatten_into(tree, value, flat: list, what: str):
    if isinstance(tree, tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(tree):
            raise ExecutionError(f"AOT: argument {what} must be a tuple of {len(tree)} values, got "
                                 f"{type(value).__name__}")
        for i, (sub, v) in enumerate(zip(tree, value)):
            _flatten_into(sub, v, flat, f"{what}.{i}")
    else:
        flat[tree] = value


def _rebuild(tree, outputs: list):
    if isinstance(tree, tuple):
        return tuple(_rebuild(t, outputs) for t in tree)
    return outputs[tree]


class AOTExecutor(CompiledExecutor):
    """``tv.create_executor("aot", mod, params=...)``: builds ``@main`` to C, compiles and runs it
    (the build links the params itself, as named constants).

    AOT always generates C, so ``target`` may be ``"c"`` or the executors' default ``"python"``.
    """

    kind = "AOT"

    def __init__(self, mod, target: str = "python", params: dict | None = None):
        if target not in ("c", "python", None):
            raise UnsupportedError(f"the AOT executor generates C: target must be 'c', got {target!r}")
        super().__init__(mod, target, params)

    def _build(self, mod):
        from .build import build

        runner = load(build(mod, name="main", params=self.build_params or None))
        return lambda names, values: runner(*values)
