"""What a target-"c" executable needs to call its compiled kernel library, without the compiler.

The code generator describes each kernel it compiled by a ``KernelABI`` (C symbol, buffers with dtype, rank
and static dims — the other dims are passed at run time, in buffer then axis order —, constant inputs
appended after the inputs, its error table) and each C shape function by a ``ShapeFuncC`` (symbol, what
its caller passes, its message table); a ``LibraryManifest`` says what the library was built from and for
(SHA-256 of the C text, compiler, version, flags, target triple, CPU features). A saved executable carries
them (``serialize``: section ``KABI``), so ``load_executable`` can call a prebuilt library through
``fastcall``/ctypes (``prebuilt_library``) importing none of the compiler (docs/deploy.md).

The shape-function wrappers the VM calls (``memoized_shape_func``, ``dps_shape_func``, ``CShapeFunction``)
live here for the same reason.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import tempfile
from dataclasses import dataclass

import numpy as np

from ..errors import ExecutionError, ShapeError

__all__ = ["KernelABI", "ShapeFuncC", "LibraryManifest", "LibraryABI", "CShapeFunction", "CheckedKernel",
           "memoized_shape_func", "dps_shape_func", "c_shape_func", "cache_index_key", "ERROR_BASE"]

ERROR_BASE = 2000  # TV_SHAPE_ERROR_BASE (codegen/lib/tv_shape.h)


#: Memoized shape functions keep at most this many distinct input shapes (then start over).
SHAPE_CACHE_SIZE = 512
#: Data inputs of at most this many elements are part of the memo key; larger ones are never cached.
SHAPE_CACHE_MAX_DATA = 64



def _shape_key(value) -> tuple:
    """A by-shape input as a hashable shape: a tuple as it is, an int64 shape tensor (what ``ShapeOf``
    leaves when the shape is also used as data) by its values (GPT-2's decode step met two such shape
    functions per call, each computed again through ctypes: 5% of the step)."""
    return value if value.__class__ is tuple else tuple(np.asarray(value).reshape(-1).tolist())


def memoized_shape_func(compute, flat_is_input: tuple, out_ranks: tuple, label: str):
    """``compute(*inputs) -> shapes`` memoized by its input shapes and small data inputs (see
    ``build_shape_func_tuples``), carrying ``flat_is_input``, ``num_outputs``, ``out_ranks``, ``label``."""
    cache: dict = {}
    if not any(flat_is_input):
        def shape_func(*inputs) -> tuple:
            key = inputs
            try:
                return cache[key]
            except KeyError:
                pass
            except TypeError:  # an int64 shape tensor (unhashable): keyed by its values, the shape it holds
                key = tuple(_shape_key(value) for value in inputs)
                if key in cache:
                    return cache[key]
            result = compute(*inputs)
            if len(cache) >= SHAPE_CACHE_SIZE:
                cache.clear()
            cache[key] = result
            return result
    else:
        data_positions = tuple(i for i, flag in enumerate(flat_is_input) if flag)

        def shape_func(*inputs) -> tuple:
            # data inputs of shape functions are mostly tiny (a new shape, a start/stop): key them by value
            key = list(inputs)
            for i in data_positions:
                value = inputs[i]
                if value.__class__ is not np.ndarray or value.size > SHAPE_CACHE_MAX_DATA:
                    return compute(*inputs)
                key[i] = (value.dtype.char, value.shape, value.tobytes())
            key = tuple(key)
            try:
                return cache[key]
            except KeyError:
                pass
            except TypeError:
                return compute(*inputs)
            result = compute(*inputs)
            if len(cache) >= SHAPE_CACHE_SIZE:
                cache.clear()
            cache[key] = result
            return result

    shape_func.__name__ = "shape_func"
    shape_func.flat_is_input = flat_is_input
    shape_func.num_outputs = len(out_ranks)
    shape_func.out_ranks = out_ranks
    shape_func.label = label
    return shape_func



def dps_shape_func(compute):
    """The destination-passing form of a tuple-form shape function (``shape_func(*ins, *out_shapes)``)."""
    n_in, n_out, label = len(compute.flat_is_input), compute.num_outputs, compute.label

    def shape_func(*arrays):
        if len(arrays) != n_in + n_out:
            raise ShapeError(f"shape function of {label}: expected {n_in} inputs and {n_out} outputs, "
                             f"got {len(arrays)} arrays")
        result = compute(*arrays[:n_in])
        for shape, out in zip(result, arrays[n_in:]):
            if out.shape != (len(shape),):
                raise ShapeError(f"shape function of {label}: result shape {shape} does not fit an output of rank "
                                 f"{len(shape)} (buffer {out.shape})")
            out[...] = shape
        return None

    shape_func.__name__ = "shape_func"
    shape_func.tuple_form = compute
    return shape_func


@dataclass(frozen=True)
class ShapeFuncC:
    """One emitted C shape function: its name and text, its error messages (code ``ERROR_BASE + k``),
    and what its caller passes (per flat input: read by data?, rank, dtype; per flat output: rank)."""

    name: str
    source: str
    messages: tuple
    deferred: frozenset
    flat_is_input: tuple
    in_ranks: tuple
    in_dtypes: tuple
    out_ranks: tuple
    label: str



class CShapeFunction:
    """A compiled C shape function called from Python: ``compute(*inputs) -> (shape, ...)``, inputs as
    ``build_shape_func_tuples`` takes them (tuples or int64 shape tensors; arrays for data inputs).

    A nonzero return code runs the Python shape function (``python()`` builds it), which raises the
    precise ``ShapeError``; the C table's message is the fallback when it does not."""

    def __init__(self, spec: ShapeFuncC, fn, python):
        self.spec, self._fn, self._python = spec, fn, python
        n_in, n_out = len(spec.flat_is_input), len(spec.out_ranks)
        self._shape_types = [ctypes.c_int64 * max(r, 1) for r in spec.in_ranks]
        self._out_types = [ctypes.c_int64 * max(r, 1) for r in spec.out_ranks]
        self._in_array, self._out_array = ctypes.c_void_p * max(n_in, 1), ctypes.c_void_p * max(n_out, 1)
        self._dtypes = [np.dtype(d) for d in spec.in_dtypes]
        self.deferrals = 0  # calls answered by the Python shape function (see shape_logic.supported)

    def compute(self, *inputs) -> tuple:
        spec = self.spec
        if len(inputs) != len(spec.flat_is_input):
            raise ShapeError(f"shape function of {spec.label}: expected {len(spec.flat_is_input)} inputs, got "
                             f"{len(inputs)}")
        keep, shapes, datas = [], [], []
        for i, (value, by_data, rank) in enumerate(zip(inputs, spec.flat_is_input, spec.in_ranks)):
            if by_data:
                if value.__class__ is not np.ndarray or value.dtype != self._dtypes[i] \
                        or not value.flags.c_contiguous:
                    value = np.asarray(value, dtype=self._dtypes[i], order="C")  # (keeps a 0-d value 0-d)
                keep.append(value)
                shape = value.shape
                datas.append(value.ctypes.data)
            else:
                shape = _shape_key(value)
                datas.append(None)
            if len(shape) != rank:
                raise ShapeError(f"shape function of {spec.label}: input {i} has shape {tuple(shape)}, expected "
                                 f"rank {rank}")
            buf = self._shape_types[i](*shape)
            keep.append(buf)
            shapes.append(ctypes.addressof(buf))
        outs = [t() for t in self._out_types]
        code = self._fn(self._in_array(*shapes), self._in_array(*datas),
                        self._out_array(*(ctypes.addressof(o) for o in outs)))
        if code:
            return self._fail(code, inputs)
        return tuple(tuple(o[:r]) for o, r in zip(outs, spec.out_ranks))

    def _fail(self, code: int, inputs):
        k = code - ERROR_BASE
        if k in self.spec.deferred:  # a case outside the traced form: the Python shape function answers
            self.deferrals += 1
            return self._python()(*inputs)
        self._python()(*inputs)  # raises the precise error
        message = self.spec.messages[k] if 0 <= k < len(self.spec.messages) else f"error code {code}"
        raise ShapeError(f"{message} (the C shape function of {self.spec.label} rejected shapes its Python "
                         f"shape function accepts)")


@dataclass(frozen=True, eq=False)  # (holds arrays: compared by identity)
class KernelABI:
    """How to call one compiled kernel: ``symbol(*buffers, *dims) -> int32`` (0: success).

    ``buffers``: per buffer ``(dtype, rank, ((axis, size), ...) static dims)``, inputs first; the first
    ``num_inputs`` are inputs, of which the last ``len(constants)`` are the kernel's constants (appended by
    the caller); ``errors``: ``(code, message, is_runtime)`` (a run-time error is an ``ExecutionError``,
    the others ``ShapeError``s)."""

    primitive: str
    symbol: str
    num_inputs: int
    buffers: tuple
    constants: tuple = ()
    errors: tuple = ()

    def dim_positions(self) -> list:
        return [(k, axis) for k, (_, rank, static) in enumerate(self.buffers)
                for axis in range(rank) if axis not in dict(static)]


@dataclass(frozen=True)
class LibraryManifest:
    """What a kernel library was built from (``c_sha256``: the whole C text) and for (compiler, its version
    line, flags, ``triple``, the CPU ``features`` it may use: the build host's when ``-march=native``);
    ``library_sha256``/``library_size`` identify the shared library's bytes."""

    c_sha256: str
    compiler: str
    version: str
    flags: tuple
    triple: str
    features: tuple
    library_sha256: str
    library_size: int

    @property
    def fingerprint(self) -> str:
        return f"{self.compiler}|{self.version}|{' '.join(self.flags)}"


@dataclass(frozen=True)
class LibraryABI:
    """A library's manifest, its kernels (``{primitive name: KernelABI}``) and C shape functions
    (``{shape function name: ShapeFuncC}``, ``source`` empty when read from a file)."""

    manifest: LibraryManifest
    kernels: dict
    shape_funcs: dict


def cache_index_key(abi_payload: bytes, manifest: LibraryManifest) -> str:
    """The kernel cache's name for "the library a local build compiled from this C, for this calling
    description, with this toolchain": only a build writes it (``kernel_c``), so a file cannot forge it."""
    text = "\0".join((manifest.c_sha256, hashlib.sha256(abi_payload).hexdigest(), manifest.fingerprint, manifest.triple))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class CheckedKernel:
    """``kernel(*inputs, *outputs)`` through ctypes, every argument checked (the fast caller's slow path,
    and the caller when ``fastcall`` is unavailable)."""

    def __init__(self, abi: KernelABI, fn):
        self.abi, self.name, self._fn = abi, abi.symbol, fn
        self._dims = abi.dim_positions()
        self._errors = {code: (message, runtime) for code, message, runtime in abi.errors}
        self.num_outputs = len(abi.buffers) - abi.num_inputs

    def __call__(self, *arrays):
        abi = self.abi
        if abi.constants:
            split = len(arrays) - self.num_outputs
            arrays = arrays[:split] + abi.constants + arrays[split:]
        if len(arrays) != len(abi.buffers):
            raise ExecutionError(f"{self.name}: expected {len(abi.buffers)} arrays (inputs, constants, outputs), "
                                 f"got {len(arrays)}")
        pointers = []
        for k, (array, (dtype, rank, static)) in enumerate(zip(arrays, abi.buffers)):
            if type(array) is not np.ndarray:
                raise ExecutionError(f"{self.name}: argument {k} must be a NumPy array, got {type(array).__name__}")
            if array.dtype != np.dtype(dtype):
                raise ExecutionError(f"{self.name}: argument {k} must have dtype {dtype}, got {array.dtype}")
            if array.ndim != rank:
                raise ShapeError(f"{self.name}: argument {k} must have rank {rank}, got shape {array.shape}")
            for axis, size in static:
                if array.shape[axis] != size:
                    raise ShapeError(f"{self.name}: argument {k} dim {axis} must be {size}, got shape {array.shape}")
            if not array.flags.c_contiguous:
                raise ExecutionError(f"{self.name}: argument {k} must be C-contiguous")
            if k >= abi.num_inputs and not array.flags.writeable:
                raise ExecutionError(f"{self.name}: output {k} is read-only")
            pointers.append(array.ctypes.data)
        code = self._fn(*pointers, *(arrays[k].shape[axis] for k, axis in self._dims))
        if code:
            message, runtime = self._errors.get(code, (f"unknown error code {code}", False))
            if runtime:
                raise ExecutionError(f"{self.name}: {message}")
            shapes = ", ".join(str(tuple(a.shape)) for a in arrays)
            raise ShapeError(f"{self.name}: {message} (shapes: {shapes})")


def c_shape_func(spec: ShapeFuncC, c_function, python):
    """The VM's shape function (DPS, with its memoized ``tuple_form``) calling the C shape function;
    ``python()`` builds the Python shape function (importing the compiler) for the deferred cases."""
    c_func = CShapeFunction(spec, c_function, python)
    shape_func = dps_shape_func(memoized_shape_func(c_func.compute, spec.flat_is_input, spec.out_ranks, spec.label))
    shape_func.c_function = c_func
    return shape_func


def prebuilt_library(exe, abi: LibraryABI, payload: bytes, c_source: str, embedded: bytes | None,
                     trust_library: bool):
    """``(kernels, CLibrary, reason, missing CPU features)`` for a loaded executable whose file describes
    its library (``abi``, encoded as ``payload``): the kernels in packed-index order calling the prebuilt
    library, or ``(None, None, why not, missing)`` when it cannot be used (the caller rebuilds).

    The rule (docs/deploy.md): the C text must hash to the manifest's, the triple and the running CPU's
    features must cover the manifest's; then the library the kernel cache's index names for this C text,
    calling description and toolchain (written only by a local build) is loaded; else an embedded
    library only with ``trust_library``: loading a shared library runs its code."""
    from ..runtime.library import cpu_features, kernel_cache_dir, load_cdll, target_triple, verified_library
    from .kernel_c import CLibrary

    m = abi.manifest
    if hashlib.sha256(c_source.encode()).hexdigest() != m.c_sha256:
        return None, None, "the C source in the file does not hash to its manifest's", ()
    if exe.exec_mode == "native":  # the library holds the program too: it must be this file's
        from .native_mode import native_source_of

        if native_source_of(exe, c_source) is None:
            return None, None, "the library's native functions were not generated from this file's program", ()
    if m.triple != target_triple():
        return None, None, f"the library was built for {m.triple}, this machine is {target_triple()}", ()
    missing = tuple(sorted(set(m.features) - set(cpu_features())))
    if missing:
        return None, None, f"the library was built for CPU features this CPU lacks: {', '.join(missing)}", missing
    need = {p.source for p in exe.primitives if p.kind == "kernel"} - set(abi.kernels)
    need |= {p.name for p in exe.primitives if p.kind == "shape_func"} - set(abi.shape_funcs)
    if need:
        return None, None, f"the file describes no C function for {', '.join(sorted(need))}", ()
    path, origin = None, ""
    directory, why_no_cache = kernel_cache_dir()
    if directory is not None:
        try:
            name, recorded = (directory / f"tvx_{cache_index_key(payload, m)}.txt").read_text().split()
        except (OSError, ValueError):
            name = recorded = ""
        if recorded == m.library_sha256 and name.startswith("tv_") and name.endswith(".so") and "/" not in name \
                and _recorded_hash(directory / name) == recorded and verified_library(directory / name):
            path, origin = str(directory / name), "kernel cache"
    if path is None and embedded is not None:
        if not trust_library:
            return None, None, ("the kernel cache holds no library built from this C text and the embedded one is "
                                "not trusted (load_executable(..., trust_library=True) loads it)"), ()
        path, origin = _private_copy(embedded), "embedded (trust_library=True)"
    if path is None:
        return None, None, f"no prebuilt library: {why_no_cache or 'not in the kernel cache'}", ()
    try:
        cdll = load_cdll(path)
        library = CLibrary(source=c_source, abi=abi, abi_payload=payload, origin=origin, library_path=path,
                           load_reason=f"prebuilt library from the {origin}")
        checked = {}
        for name, k in abi.kernels.items():
            fn = getattr(cdll, k.symbol)
            fn.argtypes = [ctypes.c_void_p] * len(k.buffers) + [ctypes.c_int64] * len(k.dim_positions())
            fn.restype = ctypes.c_int32
            slow = checked[name] = CheckedKernel(k, fn)
            library.kernels[name] = _fast(k, fn, slow) or slow
            library.sources[name] = f"/* {k.symbol}: in the prebuilt library; its C text is exe.c_library.source */\n"
        for name, spec in abi.shape_funcs.items():
            fn = getattr(cdll, spec.name)
            fn.argtypes, fn.restype = [ctypes.c_void_p] * 3, ctypes.c_int32
            library.shape_funcs[name] = (spec, fn)
        if exe.exec_mode == "native":
            from .native_mode import prebuilt_native

            library.native = prebuilt_native(exe, cdll, c_source, abi, checked)
    except (OSError, AttributeError) as err:
        return None, None, f"the prebuilt library {path} cannot be used: {err}", ()
    kernels = []
    for info in exe.primitives:
        if info.kind == "kernel":
            kernels.append(library.kernels[info.source])
        else:
            spec, fn = library.shape_funcs[info.name]
            kernels.append(c_shape_func(spec, fn, _python_shape_func(exe, info)))
    return kernels, library, "", ()


def _recorded_hash(path) -> str:
    """The SHA-256 the build recorded beside a cached library ("" if none): the index must name these bytes
    (a library rebuilt under the same name since is not the one the index recorded)."""
    from ..runtime.library import hash_path

    try:
        return hash_path(path).read_text().strip()
    except OSError:
        return ""


def _fast(abi: KernelABI, fn, slow):
    from .fastcall import caller_for

    return caller_for(abi, ctypes.cast(fn, ctypes.c_void_p).value, slow)


def _python_shape_func(exe, info):
    """Builds the Python shape function for the cases a C shape function defers (importing the compiler,
    then: parser, type inference and the ops' shape logic)."""
    import functools

    def build():
        from .kernel_python import build_shape_func_tuples

        return build_shape_func_tuples(exe.primitive_function(info.source), tuple(info.is_input))

    return functools.cache(build)


def _private_copy(data: bytes) -> str:
    """The embedded library in a file of a new private directory (mode 0700), for ``dlopen``."""
    directory = tempfile.mkdtemp(prefix="tensorvm-lib-")
    path = os.path.join(directory, "embedded.so")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path
