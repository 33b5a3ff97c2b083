"""``Executable``: what the VM runs — bytecode functions, constants, kernels and ADT constructors.

An executable is data: VM functions (bytecode plus parameter names and types), a constant pool of NumPy
arrays, a kernel table in packed-index order (each kernel names the primitive function it is built from,
whose Relay text is kept so that a loaded executable can rebuild it), and the ADT table that gives
bytecode tags their names (with each ADT's field types, for checking arguments). Kernels are built when first needed (``kernels``): NumPy callables for
target "python" (``kernel_python``), one compiled C library for target "c" (``kernel_c``; shape functions
stay Python). ``save``/``save_bytes`` write the binary format of docs/executable-format.md;
``tensorvm.vm.load_executable`` reads it back.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..errors import FormatError, UnsupportedError
from . import bytecode as bc

__all__ = ["Executable", "PrimitiveInfo", "AdtInfo", "ExecutableStats", "EXEC_MODES", "resolve_exec_mode"]

EXEC_MODES = ("bytecode", "compiled", "native")


def resolve_exec_mode(exec_mode: str, target: str) -> str:
    """The exec mode an executable runs: ``"compiled"`` is each VM function compiled for the target, C on
    target "c" (native mode, docs/native_mode.md) and generated Python on target "python" (``vm/compiled.py``,
    ``exe.as_python()`` shows it on either target)."""
    return "native" if exec_mode == "compiled" and target == "c" else exec_mode


@dataclass(frozen=True)
class PrimitiveInfo:
    """One entry of the kernel table.

    ``name`` is the kernel's name (``fused_add`` or ``shape_func_fused_add``); ``kind`` is ``"kernel"`` or
    ``"shape_func"``; ``source`` names the primitive function it is built from; ``is_input`` says, for a
    shape function, which inputs arrive as data (True) rather than as shapes. ``num_inputs`` and
    ``num_outputs`` count flattened tensors (``None`` when unknown).
    """

    name: str
    kind: str = "kernel"
    source: str = ""
    is_input: tuple = ()
    num_inputs: int | None = None
    num_outputs: int | None = None

    def __post_init__(self):
        if self.kind not in ("kernel", "shape_func"):
            raise ValueError(f"primitive kind must be 'kernel' or 'shape_func', got {self.kind!r}")
        object.__setattr__(self, "is_input", tuple(bool(b) for b in self.is_input))


@dataclass(frozen=True)
class AdtInfo:
    """An ADT of the program: its name and ``(constructor name, arity)`` pairs in tag order.

    ``type_vars`` (names) and ``field_types`` (per constructor, its fields' types as text in the syntax of
    ``serialize.type_to_text``) describe the definition, so the VM can check ADT arguments like the
    interpreter; ``field_types`` is ``None`` when unknown (hand-built executables, format version 1/2).
    """

    name: str
    constructors: tuple = ()
    type_vars: tuple = ()
    field_types: tuple | None = None

    def __post_init__(self):
        object.__setattr__(self, "constructors", tuple((str(n), int(a)) for n, a in self.constructors))
        object.__setattr__(self, "type_vars", tuple(str(v) for v in self.type_vars))
        if self.field_types is not None:
            fields = tuple(tuple(str(t) for t in ctor_fields) for ctor_fields in self.field_types)
            if [len(f) for f in fields] != [arity for _, arity in self.constructors]:
                raise ValueError(f"ADT {self.name}: field types {fields} do not match the constructor arities "
                                 f"{self.constructors}")
            object.__setattr__(self, "field_types", fields)


class ExecutableStats(dict):
    """``exe.stats()``: a dict that prints as a short report."""

    def __str__(self) -> str:
        lines = [f"functions: {self['num_functions']}"]
        for name, count in self["instructions_per_function"].items():
            lines.append(f"  {name}: {count} instructions")
        lines.append(f"instructions: {self['num_instructions']}")
        for op, count in self["instructions_by_opcode"].items():
            lines.append(f"  {op}: {count}")
        lines.append(f"constants: {self['num_constants']} ({self['constant_bytes']} bytes)")
        lines.append(f"kernels: {self['num_kernels']} (target {self['target']})")
        fallbacks = self.get("kernel_library", {}).get("numpy_fallbacks", {})
        for name in self["kernels"]:
            lines.append(f"  {name}" + ("  [NumPy fallback]" if name in fallbacks else ""))
        lib = self.get("kernel_library")
        if lib:
            if lib.get("load_reason"):
                lines.append(f"C library origin: {lib['origin']} ({lib['load_reason']})")
            lines.append(f"C library: {len(lib['c_kernels'])} C kernels, {len(fallbacks)} NumPy fallbacks, "
                         f"{lib['source_bytes']} bytes of C, lowering {lib['lower_seconds']:.3f} s, compile "
                         f"{lib['compile_seconds']:.3f} s ({_library_state(lib)}), "
                         f"{lib.get('threads', 1)} thread(s)")
            for name, why in fallbacks.items():
                lines.append(f"  fallback {name}: {why}")
        return "\n".join(lines)


@dataclass(eq=False)
class Executable:
    functions: list
    constants: list = field(default_factory=list)
    primitives: list = field(default_factory=list)
    prim_texts: dict = field(default_factory=dict)
    adts: list = field(default_factory=list)
    exec_mode: str = "bytecode"
    target: str = "python"
    prim_functions: dict = field(default_factory=dict, repr=False)
    kernel_overrides: list | None = field(default=None, repr=False)
    c_library: object = field(default=None, repr=False)  # kernel_c.CLibrary, built with the kernels

    def __post_init__(self):
        if self.exec_mode not in EXEC_MODES:
            raise ValueError(f"exec_mode must be one of {EXEC_MODES}, got {self.exec_mode!r}")
        self.exec_mode = resolve_exec_mode(self.exec_mode, self.target)
        self.functions = list(self.functions)
        self.constants = [_frozen_array(c) for c in self.constants]
        self.primitives = list(self.primitives)
        self.adts = list(self.adts)
        self.global_map = {fn.name: i for i, fn in enumerate(self.functions)}
        if len(self.global_map) != len(self.functions):
            raise ValueError("two VM functions have the same name")
        self._kernels = list(self.kernel_overrides) if self.kernel_overrides is not None else None
        self._python_source = None
        self._type_definitions = None
        # Identifies this program for the closures its VMs make (shared by ``with_exec_mode``): a closure
        # holds a function index, which means nothing to another executable.
        self.closure_owner = object()

    # --- lookup -----------------------------------------------------------------------------------
    @property
    def globals(self) -> list[str]:
        return [fn.name for fn in self.functions]

    def function(self, name: str) -> bc.VMFunction:
        try:
            return self.functions[self.global_map[name]]
        except KeyError:
            raise KeyError(f"no VM function {name!r}; have {', '.join(self.global_map)}") from None

    def type_definitions(self) -> dict:
        """``{GlobalTypeVar: TypeData}`` for the ADTs whose field types are known (rebuilt from ``adts``)."""
        if self._type_definitions is None:
            from ..ir.expr import Constructor
            from ..ir.types import GlobalTypeVar, TypeData, TypeVar
            from .serialize import text_to_type

            names = [adt.name for adt in self.adts]
            definitions = {}
            for adt in self.adts:
                if adt.field_types is None:
                    continue
                type_vars = {name: TypeVar(name) for name in adt.type_vars}
                header = GlobalTypeVar(adt.name)
                ctors = tuple(
                    Constructor(name, tuple(text_to_type(t, names, type_vars) for t in fields), header, tag)
                    for tag, ((name, _), fields) in enumerate(zip(adt.constructors, adt.field_types, strict=True)))
                definitions[header] = TypeData(header, tuple(type_vars.values()), ctors)
            self._type_definitions = definitions
        return self._type_definitions

    def get_function_params(self, name: str) -> tuple:
        return self.function(name).params

    def adt_tag_table(self) -> dict:
        """Bytecode tag -> ``(constructor index, constructor name)`` for every constructor."""
        return {bc.adt_tag(t, c): (c, name) for t, adt in enumerate(self.adts)
                for c, (name, _) in enumerate(adt.constructors)}

    def with_exec_mode(self, exec_mode: str) -> Executable:
        """The same program to run in another exec mode (kernels and closures are shared)."""
        # (as vm.compile says it, rather than the constructor's ValueError)
        if exec_mode not in EXEC_MODES:
            raise UnsupportedError(f"unknown exec_mode {exec_mode!r}; expected one of {EXEC_MODES}")
        # native mode compiles the VM functions into the library: a library built without them is not shared
        exec_mode = resolve_exec_mode(exec_mode, self.target)
        shared = exec_mode != "native" or (self.c_library is not None and self.c_library.native is not None)
        other = Executable(self.functions, self.constants, self.primitives, dict(self.prim_texts), self.adts,
                           exec_mode, self.target, dict(self.prim_functions), self._kernels if shared else None,
                           self.c_library if shared else None)
        other.closure_owner = self.closure_owner
        return other

    # --- kernels ----------------------------------------------------------------------------------
    @property
    def kernels(self) -> list:
        """The kernel callables in packed-index order (built on first use)."""
        if self._kernels is None:
            self._kernels = self._build_kernels()
        return self._kernels

    def primitive_function(self, name: str):
        """The primitive ``Function`` named ``name`` (parsed from its saved text when needed)."""
        fn = self.prim_functions.get(name)
        if fn is None:
            text = self.prim_texts.get(name)
            if text is None:
                raise FormatError(f"the executable has no primitive function {name!r}")
            from ..ir.parser import parse_module

            try:
                mod = parse_module(text)
                fn = mod[name]
            except Exception as err:  # any failure to read saved text is a format problem
                raise FormatError(f"cannot rebuild primitive {name!r} from its saved text: {err}") from err
            self.prim_functions[name] = fn
        return fn

    def primitive_text(self, name: str) -> str:
        """The Relay text of primitive function ``name`` (printed on first use)."""
        text = self.prim_texts.get(name)
        if text is None:
            fn = self.prim_functions.get(name)
            if fn is None:
                raise UnsupportedError(f"primitive {name!r} has neither a function nor text; it cannot be saved")
            from ..ir.expr import GlobalVar
            from ..ir.module import IRModule
            from ..ir.printer import module_to_str

            text = module_to_str(IRModule({GlobalVar(name): fn}))
            self.prim_texts[name] = text
        return text

    def _build_kernels(self) -> list:
        if self.target not in ("python", "c"):
            raise UnsupportedError(f"unknown target {self.target!r}; expected 'python' or 'c'")
        if self.exec_mode == "native" and self.target != "c":
            raise UnsupportedError(f"exec_mode='native' needs target 'c'; got target {self.target!r}")
        import functools
        from functools import partial

        from .kernel_abi import c_shape_func
        from .kernel_python import build_kernel, build_shape_func, build_shape_func_tuples

        compiled = {}
        if self.target == "c":
            from ..codegen.build import CompilerError
            from .kernel_c import build_c_library

            prims = {info.source: self.primitive_function(info.source) for info in self.primitives
                     if info.kind == "kernel"}
            shape_prims = {info.name: (self.primitive_function(info.source), tuple(info.is_input))
                           for info in self.primitives if info.kind == "shape_func"}
            native = None
            if self.exec_mode == "native":
                from .native_emit import check_program

                check_program(self)  # (before anything is built)
                native = self
            try:
                self.c_library = build_c_library(prims, shape_prims, native=native)
            except CompilerError:
                raise
            except FormatError:
                raise
            except Exception as err:
                if native is not None and isinstance(err, UnsupportedError):
                    raise  # native mode refuses what it cannot translate: said as such
                raise FormatError(f"cannot build the C kernel library: {_failing_primitive(prims)}"
                                  f"{type(err).__name__}: {err}") from err
            compiled = self.c_library.kernels
        kernels = []
        for info in self.primitives:
            fn = self.primitive_function(info.source)
            try:
                if info.kind == "kernel":
                    kernels.append(compiled[info.source] if info.source in compiled else build_kernel(fn))
                elif self.c_library is not None and info.name in self.c_library.shape_funcs:
                    kernels.append(c_shape_func(*self.c_library.shape_funcs[info.name],
                                                functools.cache(partial(build_shape_func_tuples, fn, tuple(info.is_input)))))
                else:
                    kernels.append(build_shape_func(fn, tuple(info.is_input)))
            except FormatError:
                raise
            except Exception as err:
                raise FormatError(f"cannot build kernel {info.name!r} from primitive {info.source!r}: {err}") from err
        return kernels

    def kernel_source(self, name: str) -> str:
        """The generated source of kernel ``name`` (a ``PackedFunc`` name): C for a compiled kernel of
        target "c", else the generated Python of its NumPy kernel or shape function."""
        index = next((i for i, p in enumerate(self.primitives) if p.name == name), None)
        if index is None:
            raise KeyError(f"no kernel {name!r}; have {', '.join(p.name for p in self.primitives)}")
        info, kernel = self.primitives[index], self.kernels[index]
        if info.kind == "kernel" and self.c_library is not None and info.source in self.c_library.sources:
            return self.c_library.sources[info.source]
        if info.kind == "shape_func" and self.c_library is not None and name in self.c_library.shape_funcs:
            spec = self.c_library.shape_funcs[name][0]
            return spec.source or f"/* {spec.name}: in the prebuilt library; its C text is exe.c_library.source */\n"
        if info.kind == "shape_func":
            return (f"# {name}: Python host code composing the shape functions of the ops of {info.source} "
                    f"(is_input={[int(b) for b in info.is_input]})\n")
        text = getattr(kernel, "__source__", None)
        if text is None:
            return f"# {name}: generated at run time without source text\n"
        why = self.c_library.fallbacks.get(info.source) if self.c_library is not None and info.kind == "kernel" \
            else None
        return (f"# NumPy fallback ({why})\n" if why else "") + text

    # --- checking ---------------------------------------------------------------------------------
    def verify(self, from_file: bool = False) -> None:
        """Check every function's bytecode refers only to things that exist (``FormatError`` if not);
        ``from_file``: also the rules for untrusted bytecode (``bytecode.verify_function``)."""
        nfuncs, nconsts, nkernels = len(self.functions), len(self.constants), len(self.primitives)
        for fn in self.functions:
            bc.verify_function(fn, nfuncs, nconsts, nkernels, from_file)
            for pc, ins in enumerate(fn.instructions):
                if isinstance(ins, bc.Invoke) and len(ins.args) != len(self.functions[ins.func_index].params):
                    callee = self.functions[ins.func_index]
                    raise FormatError(f"function {fn.name!r}, pc {pc}: {ins} passes {len(ins.args)} arguments to "
                                      f"{callee.name}, which takes {len(callee.params)}")
        if from_file:
            bc.verify_owned_arguments(self.functions)
        for info in self.primitives:
            if info.source not in self.prim_texts and info.source not in self.prim_functions \
                    and self._kernels is None:
                raise FormatError(f"kernel {info.name!r} names primitive {info.source!r}, which is missing")

    # --- views ------------------------------------------------------------------------------------
    def as_text(self, kernels: bool = False) -> str:
        """A listing of every function's bytecode, then the constant pool and the kernel table; with
        ``kernels=True`` also every kernel's generated source (C for target "c")."""
        parts = [str(fn) for fn in self.functions]
        if self.constants:
            parts.append("constants:\n" + "\n".join(
                f"  Const[{i}]: {_const_summary(c)}" for i, c in enumerate(self.constants)))
        if self.primitives:
            parts.append("kernels:\n" + "\n".join(
                f"  PackedFunc[{i}]: {p.name}" + (f" (shape function of {p.source}, is_input="
                                                  f"{[int(b) for b in p.is_input]})" if p.kind == "shape_func" else "")
                for i, p in enumerate(self.primitives)))
        if kernels:
            for i, p in enumerate(self.primitives):
                parts.append(f"// PackedFunc[{i}]: {p.name}\n" + self.kernel_source(p.name).rstrip("\n"))
        return "\n\n".join(parts) + "\n"

    @property
    def bytecode(self) -> str:
        return self.as_text()

    def as_python(self) -> str:
        """The Python source the compiled exec mode runs on target "python" (generated from the bytecode; on
        target "c" compiled mode runs the native C, and this stays for inspection)."""
        if self._python_source is None:
            from .compiled import generate_source

            self._python_source = generate_source(self)
        return self._python_source.text

    def compiled_source(self):
        if self._python_source is None:
            from .compiled import generate_source

            self._python_source = generate_source(self)
        return self._python_source

    def stats(self) -> ExecutableStats:
        by_opcode = Counter(ins.opcode.name for fn in self.functions for ins in fn.instructions)
        kernel_calls = Counter(self.primitives[ins.packed_index].name for fn in self.functions
                               for ins in fn.instructions if isinstance(ins, bc.InvokePacked))
        stats = ExecutableStats(
            num_functions=len(self.functions),
            instructions_per_function={fn.name: len(fn.instructions) for fn in self.functions},
            num_instructions=sum(by_opcode.values()),
            instructions_by_opcode=dict(by_opcode.most_common()),
            num_constants=len(self.constants),
            constant_bytes=int(sum(c.nbytes for c in self.constants)),
            num_kernels=len(self.primitives),
            kernels=[p.name for p in self.primitives],
            kernel_calls=dict(kernel_calls),  # static count of InvokePacked per kernel (shape functions too)
            target=self.target,
        )
        if self.target == "c":
            self.kernels  # noqa: B018 - the library is built with the kernels
            stats["kernel_library"] = self.c_library.summary()
            if self.c_library.origin == "compiled":  # (a prebuilt library's variants were chosen when it was built)
                from ..codegen.calibrate import collect_library, report

                if self.c_library.library_path:  # (what its C dispatch calibrated so far; dlopen: the same copy)
                    import ctypes

                    collect_library(ctypes.CDLL(self.c_library.library_path))
                stats["product_kernels"] = report()  # which product variants run and why
        return stats

    # --- files ------------------------------------------------------------------------------------
    def save_bytes(self, embed_library: bool = False) -> bytes:
        """The binary format; ``embed_library`` (target "c") puts the prebuilt kernel library in it."""
        from .serialize import executable_to_bytes

        return executable_to_bytes(self, embed_library)

    def save(self, path, embed_library: bool = False) -> None:
        """Write ``save_bytes(embed_library)`` to ``path`` (docs/deploy.md)."""
        data = self.save_bytes(embed_library)
        with open(path, "wb") as f:
            f.write(data)


def _library_state(lib: dict) -> str:
    if lib.get("origin", "compiled") != "compiled":
        return f"prebuilt, from the {lib['origin']}"
    return "cached" if lib["cached"] else "cold"


def _failing_primitive(prims: dict) -> str:
    """``"primitive @name: "`` for the first primitive that does not type-check (the usual reason a
    library cannot be built from a file's text), so the error names it; ``""`` if they all do."""
    from .kernel_python import _prepare

    for name, fn in prims.items():
        try:
            _prepare(fn)
        except Exception:  # noqa: BLE001 - any failure is the one to name
            return f"primitive function {name!r}: "
    return ""


def _frozen_array(value) -> np.ndarray:
    arr = np.asarray(value)
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")
    if arr.flags.writeable:  # never freeze the caller's array: keep a private read-only copy
        arr = arr.copy()
        arr.setflags(write=False)
    return arr


def _const_summary(c: np.ndarray) -> str:
    text = f"{c.dtype.name}[{', '.join(map(str, c.shape))}]"
    if c.size <= 8:
        text += " = " + np.array2string(c, separator=", ").replace("\n", "")
    return text
