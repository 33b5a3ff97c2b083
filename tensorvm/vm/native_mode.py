"""exec_mode="native": running the VM functions compiled to C (docs/native_mode.md).

``native_emit`` writes the C; ``kernel_c.build_c_library(..., native=exe)`` compiles it into the
executable's kernel library and fills in a ``NativeLibrary`` (the entry point's address, the kernels'
constant arrays, the kernels' error tables). ``runtime_for(exe, vm)`` makes one VM's ``Runtime`` (from
the ``_tensorvm_native`` bridge, ``native/bridge.c``, built once per machine through the code
generator's cache like ``fastcall``): ``runtime.call(function index, VM values) -> VM value``.
Errors come back as the exceptions the bytecode VM raises for the same faults, located the same way.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import sys
import sysconfig
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import ExecutionError, ShapeError, UnsupportedError

__all__ = ["NativeLibrary", "runtime_for", "bridge_module", "bridge_source", "call_native", "MAX_DEPTH",
           "StackExhausted", "profiled_call", "argument_specs", "native_invoker", "python_primitives"]

#: Nested (non-tail) calls allowed before a native call fails with a clear error (the C stack is
#: checked too: a call that would come within 256 KiB of the thread's stack end fails the same way).
MAX_DEPTH = 100_000

_DEEP_STACK_BYTES = 1 << 30  # the thread a call reaching its C stack's end runs again on

_NATIVE = Path(__file__).parent / "native"
_INCLUDE = re.compile(r'^#include "(tv_[a-z_]+\.[ch])"\n', re.M)
RUNTIME_SOURCE = "tv_runtime.c"
_RUNTIME_INCLUDE = '#include "tv_runtime.c"'
_LOCK = threading.Lock()
_MODULE: list = []
_PROFILING = threading.local()  # .current: (NativeLibrary, rows) while this thread runs a profiled call

# error kinds of tv_runtime.h
_ERR_EXEC, _ERR_SHAPE, _ERR_KERNEL, _ERR_SHAPE_FUNC, _ERR_DEPTH, _ERR_PYTHON = 1, 2, 3, 4, 5, 6


class StackExhausted(ExecutionError):
    """A native call reached the end of its thread's C stack before the depth limit (``call_native``
    runs it again on a thread with a large stack)."""


def call_native(runtime, index: int, args: tuple):
    """``runtime.call(index, args)``; a call that reaches the end of this thread's C stack runs again on
    a thread with a 1 GiB stack (as compiled mode does past Python's limit: a VM call has no effects but
    its result), where only ``MAX_DEPTH`` bounds it."""
    try:
        return runtime.call(index, args)
    except StackExhausted:
        from ..runtime.stack import run_on_deep_stack

        profiling = getattr(_PROFILING, "current", None)
        if profiling is None:
            return run_on_deep_stack(runtime.call, (index, args), _DEEP_STACK_BYTES, 0)
        native, rows = profiling
        rows[:] = 0  # the call runs again from the start: count that run only, on its thread

        def again():
            native.profile_swap(rows.ctypes.data)
            try:
                return runtime.call(index, args)
            finally:
                native.profile_swap(None)
        return run_on_deep_stack(again, (), _DEEP_STACK_BYTES, 0)


class NativeLibrary:
    """The native part of a kernel library: ``constants`` (the kernels' constant arrays, after the
    executable's in the context's table), ``kernels`` (packed index -> ``NativeKernel``), and once built
    ``invoke_address`` and ``kernel_functions`` (packed index -> ``KernelFunction``: its error table);
    ``source`` is the generated translation unit."""

    def __init__(self, constants: tuple, kernels: dict, source: str = "", callbacks: dict | None = None):
        self.constants = constants
        self.kernels = kernels
        self.source = source
        # packed index -> why the native code calls that primitive's Python callable (native_emit.python_primitives)
        self.callbacks = dict(callbacks or {})
        self.invoke_address = None
        self.kernel_functions: dict = {}
        self.profile_swap = None  # tvn_profile_swap (ctypes): sets this thread's profile buffer

    def attach(self, module) -> None:
        """Read the entry point and the kernels' error tables from the built ``CompiledModule``."""
        self.attach_library(module.library._cdll)
        self.kernel_functions = {p: module[k.func.name] for p, k in self.kernels.items()}

    def attach_library(self, cdll) -> None:
        """Read the entry point and the profiling switch from the loaded library ``cdll``."""
        self.invoke_address = ctypes.cast(cdll.tvn_invoke, ctypes.c_void_p).value
        self.profile_swap = cdll.tvn_profile_swap
        self.profile_swap.argtypes, self.profile_swap.restype = [ctypes.c_void_p], ctypes.c_void_p


def profiled_call(native, num_primitives: int, call):
    """``(rows, result)``: ``call()`` with the native code timing every kernel and shape-function call
    it makes on this thread; ``rows[p]`` is ``(calls, ns)`` of packed index ``p``."""
    rows = np.zeros((max(num_primitives, 1), 2), np.int64)
    native.profile_swap(rows.ctypes.data)
    _PROFILING.current = (native, rows)  # (for a call that runs again on a deep stack: call_native)
    try:
        result = call()
    finally:
        native.profile_swap(None)
        _PROFILING.current = None
    return rows, result


NATIVE_HEADER = "/* exec_mode='native': generated by tensorvm/vm/native_emit.py from the program of SHA-256 "


def native_header(exe) -> str:
    """The first line of the native C: it names the program it was generated from (``serialize.program_digest``),
    which a loader checks before running a prebuilt library's native functions (``prebuilt_native``)."""
    from .serialize import program_digest

    return f"{NATIVE_HEADER}{program_digest(exe)} (its bytecode). */"


def native_source_of(exe, c_source: str) -> str | None:
    """The native part of a library's C text (from its header to the end) when it was generated from
    ``exe``'s program, else None."""
    if c_source.count(NATIVE_HEADER) != 1:
        return None
    part = c_source[c_source.index(NATIVE_HEADER):]
    return part if part.startswith(native_header(exe) + "\n") else None


def prebuilt_native(exe, cdll, c_source: str, abi, checked: dict) -> NativeLibrary:
    """The ``NativeLibrary`` of a prebuilt library (``kernel_abi.prebuilt_library``, which checked that its
    native part was generated from ``exe``'s program): the kernels' constants in the order the emitter
    gave them (packed index order, each kernel's after the executable's), the entry point and the kernels'
    error tables (``checked``: kernel name -> ``CheckedKernel``)."""
    constants, functions, shape_specs = [], {}, {}
    for p, info in enumerate(exe.primitives):
        if info.kind == "kernel":
            constants.extend(abi.kernels[info.source].constants)
            functions[p] = checked[info.source]
        else:
            shape_specs[p] = abi.shape_funcs[info.name]
    native = NativeLibrary(tuple(constants), {}, native_source_of(exe, c_source) or "",
                           python_primitives(exe, functions, shape_specs))
    native.attach_library(cdll)
    native.kernel_functions = functions
    return native


def python_primitives(exe, kernels: dict, shape_funcs: dict) -> dict:
    """Packed index -> why native code calls that primitive's Python callable (the bytecode VM's) through
    the bridge's callback: it has no C function, or its C shape function leaves some cases to Python. (A C
    shape function's failures also run the Python one, which raises the bytecode VM's precise error; that
    path exists only under Python and is not listed.) Here, not in ``native_emit``: a loader of a prebuilt
    library (``prebuilt_native``) lists them without importing the emitter."""
    from .bytecode import InvokePacked

    used = sorted({ins.packed_index for fn in exe.functions for ins in fn.instructions
                   if isinstance(ins, InvokePacked)})
    out = {}
    for p in used:
        info = exe.primitives[p]
        if info.kind == "kernel" and p not in kernels:
            out[p] = f"kernel {info.name} has no C function (it runs on NumPy)"
        elif info.kind == "shape_func" and p not in shape_funcs:
            out[p] = f"shape function {info.name} has no C version (a Python shape function)"
        elif info.kind == "shape_func" and shape_funcs[p].deferred:
            out[p] = f"the C shape function {info.name} leaves some cases to its Python shape function"
    return out


def runtime_text(name: str = RUNTIME_SOURCE) -> str:
    """The text of the package file ``native/<name>`` with each local ``#include "tv_*"`` replaced by
    that file's text (expanded the same way), so a translation unit is one self-contained text."""
    return _INCLUDE.sub(lambda m: runtime_text(m.group(1)) + "\n", (_NATIVE / name).read_text())


def bridge_source() -> str:
    """``native/bridge.c`` with the runtime's text in place of its ``#include "tv_runtime.c"``."""
    text = (_NATIVE / "bridge.c").read_text()
    if text.count(_RUNTIME_INCLUDE) != 1:
        raise RuntimeError("bridge.c must include tv_runtime.c once")
    header = f"/* python {sys.version.split()[0]}, numpy {np.__version__} (part of the cache key) */\n"
    return header + text.replace(_RUNTIME_INCLUDE, runtime_text())


def bridge_module():
    """The compiled ``_tensorvm_native`` bridge (``UnsupportedError`` when it cannot be built here): from the
    kernel cache where a build recorded it (without the compiler), else built now."""
    with _LOCK:
        if not _MODULE:
            from .fastcall import load_cached_extension

            _MODULE.append(load_cached_extension(_bridge_index(), "_tensorvm_native") or _build())
        if isinstance(_MODULE[0], Exception):
            raise UnsupportedError(f"native mode: the bridge extension cannot be built here: {_MODULE[0]}")
        return _MODULE[0]


def _bridge_index() -> str:
    """The kernel cache's record of the bridge built from this exact ``bridge_source()``."""
    return f"native-bridge-{hashlib.sha256(bridge_source().encode()).hexdigest()[:32]}.txt"


def _build():
    from ..codegen.build import build_library, find_toolchain
    from .fastcall import import_extension, record_extension

    try:
        include = sysconfig.get_paths()["include"]
        if not (Path(include) / "Python.h").exists():
            return RuntimeError(f"no Python.h in {include}")
        toolchain = find_toolchain()
        flags = tuple(f for f in toolchain.flags if f != "-fopenmp")
        toolchain = replace(toolchain, flags=flags + (f"-I{include}", f"-I{np.get_include()}"))
        library = build_library(bridge_source(), toolchain)
        module = import_extension(library.info.path, "_tensorvm_native")
        record_extension(_bridge_index(), library.info.path)
        return module
    except Exception as err:  # noqa: BLE001 - reported as the reason native mode is unavailable
        return err


def runtime_for(exe, vm, limit_bytes: int | None = None):
    """A ``Runtime`` running ``exe``'s native functions for the VirtualMachine ``vm`` (its closures are
    ``VMClosure``s owned by ``exe``)."""
    from ..runtime.object import ADT
    from .vm import VMClosure

    exe.kernels  # noqa: B018 - builds the library (and its native part)
    native = exe.c_library.native if exe.c_library is not None else None
    if native is None or native.invoke_address is None:
        raise UnsupportedError("native mode: the executable's kernel library has no native functions")
    names = [fn.name for fn in exe.functions]
    owner = exe.closure_owner

    def make_closure(func_index, free_vars):
        return VMClosure(func_index, free_vars, names[func_index], owner)

    def on_error(kind, func, pc, packed, code, message):
        return native_error(exe, native, kind, func, pc, packed, code, message)

    constants = tuple(exe.constants) + tuple(np.asarray(c, order="C") for c in native.constants)  # (0-d stays 0-d)
    # (the callables the bytecode VM calls, by packed index: the C calls back those without C functions)
    return bridge_module().Runtime(native.invoke_address, constants, -1 if limit_bytes is None else limit_bytes,
                                   MAX_DEPTH, ADT, make_closure, on_error, tuple(exe.kernels))


#: Spec nodes one executable's parameter types may take (a polymorphically recursive ADT would not end).
MAX_SPEC_NODES = 4096


def argument_specs(exe, param_types, adt_by_name: dict) -> tuple:
    """``(nodes, params, nsymbols)``: the bridge's description of the parameter types (``bridge.c``,
    ``runtime_invoke``) so that ``Runtime.invoke`` checks and converts arguments in C. ``params[i]`` is
    the tuple of node indices of function ``i``'s parameters, or None when one of them has a type only
    the Python conversion handles (functions, references, unannotated, an ADT not described here).
    ``adt_by_name`` maps a constructor's name to its VM tag (``VirtualMachine._adt_by_name``)."""
    from ..ir.types import GlobalTypeVar, SymDim, TensorType, TupleType, TypeCall
    from ..runtime.convert import substitute_type

    definitions = None
    nodes: list = []
    memo: dict = {}
    symbols: dict = {}

    class Declined(Exception):
        pass

    def node(ty) -> int:
        nonlocal definitions
        key = ty
        if key in memo:
            return memo[key]
        if len(nodes) >= MAX_SPEC_NODES:
            raise Declined
        index = len(nodes)
        if isinstance(ty, TensorType):
            dims = tuple(d if isinstance(d, int) else -2 - symbols.setdefault(d.name, len(symbols))
                         if isinstance(d, SymDim) else -1 for d in ty.shape)
            nodes.append((0, np.dtype(ty.dtype), dims))
            memo[key] = index
            return index
        if isinstance(ty, TupleType):
            nodes.append(None)
            memo[key] = index
            nodes[index] = (1, tuple(node(f) for f in ty.fields))
            return index
        if isinstance(ty, (TypeCall, GlobalTypeVar)):
            header = ty.func if isinstance(ty, TypeCall) else ty
            if definitions is None:
                definitions = exe.type_definitions()
            tdef = definitions.get(header)
            if tdef is None:
                raise Declined
            mapping = dict(zip(tdef.type_vars, ty.args if isinstance(ty, TypeCall) else (), strict=False))
            nodes.append(None)
            memo[key] = index  # (before the fields: a recursive type refers to itself)
            ctors = {}
            for ctor in tdef.constructors:
                if ctor.name in adt_by_name:  # (others: the Python conversion says it is not in this executable)
                    fields = tuple(node(substitute_type(t, mapping)) for t in ctor.inputs)
                    ctors[ctor.name] = (ctor.tag, adt_by_name[ctor.name], fields)
            nodes[index] = (2, ctors)
            return index
        raise Declined

    params = []
    for types in param_types:
        try:
            params.append(None if types is None else tuple(node(t) for t in types))
        except (Declined, TypeError):  # (TypeError: an unhashable type, not described)
            params.append(None)
    if len(nodes) >= MAX_SPEC_NODES or any(n is None for n in nodes):
        return (), [None] * len(params), 0
    return tuple(nodes), params, len(symbols)


def native_invoker(vm, generic):
    """``VirtualMachine._invoke`` for native mode: arguments checked and converted in C, the call, and its
    result in the user's form, in one ``Runtime.invoke``; ``generic(info, args, kwargs)`` (the Python
    conversion, then ``call_native``) for keyword arguments, stored inputs, parameters the function
    writes, and arguments the C checks decline (so errors are the Python conversion's, word for word)."""
    from ..runtime.ndarray import NDArray
    from ..runtime.stack import run_on_deep_stack

    rt = vm._native_rt
    nodes, params, nsymbols = argument_specs(vm.exe, [info.param_types for info in vm._funcs], vm._adt_by_name)
    rt.set_argument_specs(nodes, nsymbols, NDArray.wrap,
                          {tag: (index, name) for tag, (index, name) in vm._adt_tags.items()})
    for info in vm._funcs:
        if info.owned:  # (the Python path copies these arguments first)
            params[info.index] = None
    calls = vm._calls
    invoke = rt.invoke

    def native_invoke(info, args: tuple, kwargs: dict):
        spec = params[info.index]
        # (an instrument callback set: calls run through the dispatch loop, which the generic path takes)
        if spec is not None and not kwargs and len(args) == len(spec) and vm._mode != "instrument":
            try:
                result = invoke(info.index, spec, args)
            except StackExhausted:
                result = run_on_deep_stack(invoke, (info.index, spec, args), _DEEP_STACK_BYTES, 0)
            if result is not NotImplemented:
                calls["generic"] += 1
                if info.result_check is not None:
                    info.result_check(result)
                return result
        return generic(info, args, kwargs)

    return native_invoke


def native_error(exe, native, kind, func, pc, packed, code, message) -> Exception:
    """The exception for a failed native call: the type the bytecode VM raises for the same fault, its
    message naming the VM function, the pc and the instruction (as ``vm.located_error``)."""
    if 0 <= func < len(exe.functions):
        fn = exe.functions[func]
        ins = fn.instructions[pc] if 0 <= pc < len(fn.instructions) else "?"
        where = f" [in VM function {fn.name!r} at pc {pc} ({ins})]"
    else:
        where = ""
    if kind == _ERR_KERNEL:
        kernel = native.kernel_functions.get(packed)
        name = kernel.name if kernel is not None else f"PackedFunc[{packed}]"
        text = kernel._errors.get(code, f"unknown error code {code}") if kernel is not None else f"error code {code}"
        if isinstance(text, tuple):  # a prebuilt library's kernel (kernel_abi.CheckedKernel): (message, run-time?)
            text, runtime = text
        else:
            from ..codegen.c_emit import RUNTIME_ERRORS

            runtime = code in RUNTIME_ERRORS
        return (ExecutionError if runtime else ShapeError)(f"{name}: {text}{where}")
    if kind == _ERR_PYTHON:  # (message: the exception the primitive's Python callable raised)
        from .vm import located_error

        if not (0 <= func < len(exe.functions)) or not isinstance(message, BaseException):
            return ExecutionError(f"a Python callback failed: {message}{where}")
        located = located_error(message, fn.name, pc, ins)
        located.__cause__ = message  # (as the bytecode VM's ``raise ... from err``)
        return located
    if kind == _ERR_SHAPE_FUNC:
        label = exe.primitives[packed].name if 0 <= packed < len(exe.primitives) else "?"
        return ShapeError(f"{message} (shape function {label}){where}")
    if kind == _ERR_SHAPE:
        return ShapeError(f"{message}{where}")
    if kind == _ERR_DEPTH:
        return (StackExhausted if code == 1 else ExecutionError)(f"{message}{where}")
    return ExecutionError(f"{message}{where}")
