"""A compiled module: several kernels in one shared library, each callable on NumPy arrays.

``build_module(funcs)`` emits one C file for all the ``PrimFunc``s, builds it (see ``build.py``) and
returns a ``CompiledModule``; ``module[name]`` is a ``KernelFunction`` called in destination-passing
style, ``kernel(*inputs, *outputs)``, on C-contiguous NumPy arrays without copying them. The call checks
each array's dtype, rank, contiguity and static dims (``ExecutionError``/``ShapeError`` naming the
argument), passes the dynamic dims, and turns a nonzero return code into a ``ShapeError`` (a failed
entry check, e.g. a broadcast that does not fit) or an ``ExecutionError`` (a fault while running).

When Python's headers are available the library also holds a C wrapper per kernel that does the checks
through the buffer protocol and calls the kernel without the GIL (well under a microsecond of overhead
instead of ~10 us through ctypes); the Python-side checks then only run to explain a rejected call.

``kernel.bind(*arrays)`` checks the arrays once and returns a zero-argument call of the kernel on them
(for executors that run the same kernel on the same buffers again and again). A kernel with variants
(``tensorvm.codegen.strategy``) lists them in ``kernel.variants``; ``kernel.select_variant(*arrays)``
asks its C dispatch function which one would run.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from ..errors import ExecutionError, ShapeError
from ..te.expr import Const
from .build import BuildInfo, Library, SharedUnit, Toolchain, build_library, compile_workers, find_toolchain
from .c_emit import (
    LIBRARY_PART_FLAGS,
    PYTHON_BAD_ARGUMENTS,
    RUNTIME_ERRORS,
    EmittedKernel,
    emit_kernel,
    emit_library,
    emit_python_wrappers,
    library_part,
    library_parts,
)
from .loop_ir import PrimFunc

__all__ = ["KernelFunction", "CompiledModule", "build_module", "split_units"]


class KernelFunction:
    """A generated kernel bound to its library: ``kernel(*in_arrays, *out_arrays)``."""

    def __init__(self, emitted: EmittedKernel, library: Library):
        func = emitted.func
        self.name = func.name
        self.source = emitted.source
        self.func = func
        self.num_inputs = func.num_inputs
        self.num_outputs = len(func.params) - func.num_inputs
        self._errors = emitted.errors
        self._specs = []
        self._dim_positions = []
        for position, buf in enumerate(func.params):
            static = tuple((axis, d.value) for axis, d in enumerate(buf.shape) if isinstance(d, Const))
            self._specs.append((buf.name, np.dtype(buf.dtype), len(buf.shape), static, position >= func.num_inputs))
            self._dim_positions.extend((position, axis) for axis, d in enumerate(buf.shape)
                                       if not isinstance(d, Const))
        self._fn = library.function(self.name, len(func.params), len(self._dim_positions))
        # entry(*arrays) -> error code: the C wrapper when there is one, else the ctypes path.
        self._wrapper = library.python_function(self.name)
        self.entry = self._wrapper or self._call_through_ctypes
        self.variants = tuple(emitted.variants) or ("generic",)
        self._dispatch = None
        if len(emitted.variants) > 1:
            self._dispatch = library.function(f"{self.name}_dispatch", 0, len(self._dim_positions))

    def __call__(self, *arrays):
        code = self.entry(*arrays)
        if code:
            self.fail(code, arrays)

    def bind(self, *arrays):
        """A zero-argument call of the kernel on ``arrays`` (inputs, then outputs), checked now.

        The call keeps the arrays alive and must not outlive a change of their shapes (arrays cannot
        change shape in place, so this only matters for views of resized buffers). Arrays that do not
        fit the kernel give a call that raises the kernel's error when run.
        """
        try:
            self._check(arrays)
        except (ExecutionError, ShapeError):
            return functools.partial(self, *arrays)
        if self._wrapper is not None:
            entry = functools.partial(self._wrapper, *arrays)
        else:
            entry = functools.partial(self._fn, *self._check(arrays),
                                      *(arrays[p].shape[axis] for p, axis in self._dim_positions))
        fail = self.fail

        def call():
            code = entry()
            if code:
                fail(code, arrays)

        return call

    def select_variant(self, *arrays) -> str:
        """The name of the variant the kernel's dispatch function picks for these arrays' shapes."""
        if self._dispatch is None:
            return self.variants[0]
        if len(arrays) != len(self._specs):
            raise ExecutionError(f"{self.name}: expected {len(self._specs)} arrays, got {len(arrays)}")
        dims = [int(np.shape(arrays[p])[axis]) for p, axis in self._dim_positions]
        return self.variants[self._dispatch(*dims)]

    def _call_through_ctypes(self, *arrays) -> int:
        pointers = self._check(arrays)
        return self._fn(*pointers, *(arrays[position].shape[axis] for position, axis in self._dim_positions))

    def fail(self, code: int, arrays):
        """Raise the error for a nonzero ``entry`` code."""
        if code == PYTHON_BAD_ARGUMENTS:
            self._check(arrays)  # raises the precise error
            raise ExecutionError(f"{self.name}: the arguments do not fit the kernel")
        self._raise(code, arrays)

    def _check(self, arrays) -> list:
        """Check every argument (raising a clear error) and return the data pointers."""
        if len(arrays) != len(self._specs):
            raise ExecutionError(f"{self.name}: expected {self.num_inputs} input(s) and {self.num_outputs} "
                                 f"output(s), got {len(arrays)} arrays")
        pointers = []
        for array, (name, dtype, ndim, static, is_output) in zip(arrays, self._specs):
            if type(array) is not np.ndarray:
                raise ExecutionError(f"{self.name}: argument {name} must be a NumPy array, got "
                                     f"{type(array).__name__}")
            if array.dtype != dtype:
                raise ExecutionError(f"{self.name}: argument {name} must have dtype {dtype}, got {array.dtype}")
            if array.ndim != ndim:
                raise ShapeError(f"{self.name}: argument {name} must have rank {ndim}, got shape {array.shape}")
            for axis, size in static:
                if array.shape[axis] != size:
                    raise ShapeError(f"{self.name}: argument {name} dim {axis} must be {size}, got shape "
                                     f"{array.shape}")
            if not array.flags.c_contiguous:
                raise ExecutionError(f"{self.name}: argument {name} must be C-contiguous (use "
                                     f"np.ascontiguousarray)")
            if is_output and not array.flags.writeable:
                raise ExecutionError(f"{self.name}: output {name} is read-only")
            pointers.append(array.ctypes.data)
        return pointers

    def _raise(self, code: int, arrays):
        shapes = ", ".join(f"{spec[0]}{tuple(a.shape)}" for spec, a in zip(self._specs, arrays))
        message = self._errors.get(code, f"unknown error code {code}")
        if code in RUNTIME_ERRORS:
            raise ExecutionError(f"{self.name}: {message}")
        raise ShapeError(f"{self.name}: {message} (shapes: {shapes})")

    def __repr__(self):
        return f"<KernelFunction {self.name}: {self.num_inputs} in, {self.num_outputs} out>"


class CompiledModule:
    """Kernels compiled together into one shared library."""

    def __init__(self, emitted: list[EmittedKernel], source: str, library: Library):
        self.source = source
        self.library = library
        self.kernels = {k.name: KernelFunction(k, library) for k in emitted}

    @property
    def build_info(self) -> BuildInfo:
        return self.library.info

    def __getitem__(self, name: str) -> KernelFunction:
        return self.kernels[name]

    def __contains__(self, name: str) -> bool:
        return name in self.kernels

    def kernel_source(self, name: str) -> str:
        return self.kernels[name].source


# Translation units: a module with more kernel C than ``_PARALLEL_BYTES`` is split into one unit per
# compile worker, and no unit gets more than ``_UNIT_BYTES`` (a compiler's time and memory grow faster
# than linearly in the size of what it is given; a kernel bigger than that is a unit of its own).
_PARALLEL_BYTES = 80_000
_UNIT_BYTES = 160_000

# The Python wrappers are glue around CPython's buffer calls, not loops: -O1 compiles them in about half
# the time of -O3 (MobileNetV3-small's 57 wrappers: 0.9 s instead of 1.7 s of CPU) for 4-5 ns more per
# call (186 vs 182 ns, within 2-3%; ``benchmarks/compile_time.py --wrappers``), and the VM calls plain
# kernels through its own fast caller (``vm/fastcall.py``), not through these wrappers.
_WRAPPER_FLAGS = ("-O1",)
# The native exec mode's program (``vm/native_emit.py``: each VM function as one C function of gotos,
# refcounts and calls into the kernels) is control flow, not loops, and one function per VM function: a
# bidirectional 2-layer GRU's main function is 1,350 lines, on which -O3 (tree PRE, VRP) spent 28 s of the
# model's 31 s cold compile and -O1 2 s, with the same run time (``benchmarks/compile_time.py --native``).
NATIVE_FLAGS = ("-O1",)


def split_units(emitted: list, workers: int, units: int | None = None) -> list[list]:
    """``emitted`` kernels grouped into translation units: at least ``units`` of them (else as many as
    the size bounds above ask for); each kernel goes, largest first, to the unit with the least C so far,
    or to a new one when that would pass ``_UNIT_BYTES`` (a unit holds its kernels in their original
    order)."""
    sizes = [len(k.source) for k in emitted]
    total = sum(sizes)
    if units is None:
        units = max(-(-total // _UNIT_BYTES), min(workers, total // _PARALLEL_BYTES))
    units = max(1, min(units, len(emitted)))
    loads, members = [0] * units, [[] for _ in range(units)]
    for index in sorted(range(len(emitted)), key=lambda i: -sizes[i]):
        unit = loads.index(min(loads))
        if loads[unit] and loads[unit] + sizes[index] > _UNIT_BYTES:  # full: a new unit
            loads.append(0)
            members.append([])
            unit = len(loads) - 1
        loads[unit] += sizes[index]
        members[unit].append(index)
    return [[emitted[i] for i in sorted(m)] for m in members if m]


def build_module(funcs: list[PrimFunc], toolchain: Toolchain | None = None, jobs: int | None = None,
                 extra_source: str | list = "", emitted: list[EmittedKernel] | None = None,
                 wrappers=None) -> CompiledModule:
    """Compile ``funcs`` into one library; big modules compile as several translation units in parallel
    (``jobs`` of them when given, else as ``split_units`` decides). ``extra_source``: more self-contained
    translation units linked in (the C shape functions, the native program): a text, or a list of texts and
    ``(text, extra flags)`` pairs. ``emitted``: the ``emit_kernel`` of each of ``funcs`` when the caller has
    it already (not emitted again). ``wrappers``: the names of the kernels that get a CPython wrapper
    (``KernelFunction.entry``; the others are called through ctypes), default all of them: the VM, which
    calls plain kernels through its own fast caller, asks for those it calls as ``KernelFunction`` objects only
    (the wrappers of MobileNetV3-small's 57 kernels were 0.9 s of compiler CPU in its cold build)."""
    names = [f.name for f in funcs]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise ValueError(f"codegen: kernel names must be unique, got {sorted(duplicates)} more than once")
    if emitted is None:
        emitted = [emit_kernel(f) for f in funcs]
    elif [k.func for k in emitted] != list(funcs):
        raise ValueError("codegen: build_module's emitted kernels must be those of funcs, in order")
    source = emit_library(emitted)  # (the whole library as one unit: what an AOT build or a reader gets)
    groups = split_units(emitted, compile_workers(), jobs)
    toolchain = toolchain or find_toolchain()
    parts = library_parts(emitted) if toolchain.aliases else []
    if parts:  # the kernels call the library parts' cached objects (c_emit.LIBRARY_PARTS)
        units = [emit_library(group, linked_parts=True) for group in groups]
        units += [SharedUnit(library_part(part), LIBRARY_PART_FLAGS.get(part, ())) for part in parts]
    else:
        units = [source] if len(groups) <= 1 else [emit_library(group) for group in groups]  # (no kernels: the prelude alone)
    for extra in [extra_source] if isinstance(extra_source, str) else extra_source:
        text = extra if isinstance(extra, str) else extra[0]
        if text:
            units.append(extra)
            source += "\n" + text
    module_name = ""
    wrapped = emitted if wrappers is None else [k for k in emitted if k.name in wrappers]
    if toolchain.python_include and wrapped:
        # Named after the kernels and the wrapped ones, so that different libraries never share a module name.
        identity = source + "\0" + ",".join(k.name for k in wrapped)
        module_name = "tvk_" + hashlib.sha256(identity.encode()).hexdigest()[:20]
        units.append((emit_python_wrappers(wrapped, module_name), ("-I" + toolchain.python_include, *_WRAPPER_FLAGS)))
    return CompiledModule(emitted, source, build_library(units, toolchain, module_name))
