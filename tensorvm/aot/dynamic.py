"""AOT for dynamic programs: a VM program as a standalone C library with a header and no Python.

    lib = tv.aot.build(mod, name="tree", params=weights, dynamic=True)   # a DynamicAOTModule
    lib.sources     # {"tree.c": ..., "tree.h": ..., "tensorvm_dynamic.h": ...}
    lib.write_sources(directory)                                          # include/*.h, src/tree.c
    # cc -std=c11 -O2 -fwrapv -ffp-contract=fast -Iinclude app.c src/tree.c -lm -lpthread   (lib.c_flags)

The program is compiled as for ``exec_mode="native"`` (``vm/native_emit.py`` writes one C function per
VM function from the lowered module; kernels and C shape functions come from the same kernel library),
and that library's C text becomes one translation unit with internal linkage everywhere except the API
(every exported symbol starts with ``tvd_<name>_``):

* the runtime (``vm/native/tv_runtime.c``: values, reference counting, the pool), routed to the
  application's allocator (``dynamic_c/tvd_prologue.h``);
* the kernels, the C shape functions and the native functions, unchanged but ``static``, their OpenMP
  pragmas kept under ``#ifdef _OPENMP``;
* the program's constants (the executable's, with ``params`` bound, and the kernels' constant arrays) as
  ``static const`` arrays, or with ``constants="blob"`` only their dtypes and shapes, the bytes going to a
  params blob the application loads (``dynamic_c/tvd_blob.c`` checks it against the program's hash);
* the API (``dynamic_c/tvd_api.c``: model, values, tensors, errors) and, generated here, an entry point
  per Relay function, a constructor per ADT constructor and the type checks they run (named dims bound
  across the arguments as the VM binds them; closures checked against the program's closure functions).

Invariant: the library runs exactly the native functions the VM's native mode runs (same C), so its
results are native mode's; everything it adds is argument checking, ownership and error reporting.
See docs/aot_dynamic.md for the C API.
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import UnsupportedError
from ..ir.types import SymDim
from ..vm.native_emit import _c_string, _comment, _dtype_pair
from .build import _C_RESERVED, _c_initializer, _optional_pragmas
from .lower import c_identifier

__all__ = ["DynamicAOTModule", "build_dynamic", "COMMON_HEADER", "C_FLAGS"]

_DIR = Path(__file__).parent / "dynamic_c"
COMMON_HEADER = "tensorvm_dynamic.h"
_BYTES_AS_STRING = 4096  # constants of at least this many bytes are written as bytes (_bytes_initializer)
#: Flags the library must be compiled with (the kernel library's own build uses them too, codegen/build.py):
#: integer kernels wrap on overflow, as NumPy does; the vector kernels' ``a * b + c`` become FMAs where the
#: target has them (``-std=c11`` turns that off: the products then run at about half their speed). Add
#: -O2/-O3, -march=..., -fopenmp as wanted.
C_FLAGS = ("-fwrapv", "-ffp-contract=fast")
# API functions of every library (an entry point or constructor may not take these names)
_API = ("create", "destroy", "load_params", "load_params_file", "last_error", "set_num_threads", "trim",
        "memory_stats", "retain", "release",
        "is_tensor", "is_closure", "tag", "num_fields", "field", "tensor_get", "tensor", "tuple")
_EXPORTED = '__attribute__((visibility("default"))) '
_INVOKE = _EXPORTED + 'int32_t tvn_invoke('
# A function definition with external linkage (its attribute, such as weak, dropped): made static
_GLOBAL_DEFINITION = re.compile(
    r"^(?:__attribute__\(\([^)]*\)\)[ \t]*)?(?!static\b|__attribute__|inline\b|TV_SELECT_OF_LOADS static\b)"
    r"([A-Za-z_][\w \t\*]*?\b[A-Za-z_]\w*[ \t]*\([^;{\n]*\)[ \t]*\{)", re.M)
_KERNEL_PROTO = re.compile(r"^int32_t tvk\d+_\w+\([^;{}\n]*\);\n", re.M)
_MESSAGES = re.compile(r"^const char\* const (tvs\w+_messages\[\])", re.M)


@dataclass(frozen=True)
class EntryPoint:
    """A Relay function as the C API exposes it: ``tvd_<name>_<c_name>``."""

    name: str  # the Relay function
    c_name: str
    params: tuple  # (C parameter name, IR type, is a tensor struct)
    ret_type: object


@dataclass(frozen=True)
class Constructor:
    """An ADT constructor as the C API exposes it: ``tvd_<name>_<type>_<ctor>`` and its tag macro."""

    type_name: str
    name: str
    tag: int
    fields: tuple  # IR types


@dataclass
class DynamicAOTModule:
    """The result of ``build(..., dynamic=True)``: the C library's sources and what they export."""

    name: str
    sources: dict  # file name -> text: "<name>.c", "<name>.h", "tensorvm_dynamic.h"
    entry_points: tuple
    constructors: tuple
    constants_size: int  # bytes of the embedded constants
    relay_text: str = field(default="", repr=False)
    c_flags: tuple = C_FLAGS  # what compiling <name>.c needs (integer wrap-around, as NumPy)
    blob: bytes | None = field(default=None, repr=False)  # constants="blob": the params blob (docs/aot_dynamic.md)

    @property
    def blob_name(self) -> str:
        return f"{self.name}.params"

    @property
    def prefix(self) -> str:
        return f"tvd_{self.name}"

    @property
    def header_name(self) -> str:
        return f"{self.name}.h"

    def write_sources(self, directory) -> dict:
        """Write ``include/*.h`` and ``src/<name>.c``; returns ``{"include_dirs": [...], "sources": [...]}``."""
        directory = Path(directory)
        paths = {}
        for fname, text in self.sources.items():
            path = directory / ("include" if fname.endswith(".h") else "src") / fname
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            paths[fname] = path
        out = {"include_dirs": [directory / "include"], "sources": [p for f, p in paths.items() if f.endswith(".c")]}
        if self.blob is not None:
            out["blob"] = directory / self.blob_name
            out["blob"].write_bytes(self.blob)
        return out

    def __repr__(self):
        return (f"<DynamicAOTModule {self.name}: {len(self.entry_points)} entry points, "
                f"{len(self.constructors)} constructors, {self.constants_size} bytes of constants>")


def build_dynamic(mod, name: str, params: dict | None = None, opt_level: int = 3,
                  constants: str = "embed") -> DynamicAOTModule:
    """Compile every function of ``mod`` (recursion, ADTs, closures, dynamic shapes) to a standalone C library;
    ``params`` binds parameters of ``@main`` by name as constants. ``constants="embed"`` writes the constants
    into the C; ``"blob"`` into a params blob (``DynamicAOTModule.blob``) the application loads at run time
    (``tvd_<name>_load_params``), checked against the program's hash. See the module docstring."""
    from .. import vm as tvvm
    from ..vm.native_emit import check_program

    if constants not in ("embed", "blob"):
        raise UnsupportedError(f"AOT dynamic: constants must be 'embed' or 'blob', got {constants!r}")

    exe = tvvm.compile(mod, target="c", params=params, opt_level=opt_level, exec_mode="native")
    check_program(exe)
    exe.kernels  # noqa: B018 - builds the kernel library with the native functions
    library = exe.c_library
    if library is None or library.native is None or not library.native.source:
        raise UnsupportedError("AOT dynamic: the program's kernel library has no native functions")
    if library.native.callbacks:  # (native mode calls these in Python; this library has no Python)
        raise UnsupportedError("AOT dynamic: the library runs without Python, and the program needs it for "
                               + "; ".join(f"PackedFunc[{p}]: {why}" for p, why in sorted(library.native.callbacks.items())))
    return _Emitter(exe, mod, name, constants == "blob").run()


def _unit_text(name: str) -> str:
    return (_DIR / name).read_text()


def _type_text(ty) -> str:
    from ..ir.printer import type_to_str

    try:
        return type_to_str(ty)
    except Exception:  # noqa: BLE001 - only a message
        return str(ty)


class _Emitter:
    def __init__(self, exe, mod, name: str, blob: bool = False):
        self.exe, self.mod, self.name, self.blob = exe, mod, name, blob
        self.prefix = f"tvd_{name}"
        self.macro = self.prefix.upper()
        self.defs = {h.name: d for h, d in exe.type_definitions().items()}
        self.type_index = {adt.name: i for i, adt in enumerate(exe.adts)}
        self.checks: dict = {}  # key -> C function name
        self.syms: dict = {}  # named dim -> its index in a call's bindings (tvd_syms)
        self.closure_targets = _closure_targets(exe)  # VM function -> (its signature, captured count)
        self.check_protos: list = []  # (the checks of recursive types call each other)
        self.check_code: list = []

    # --- names -------------------------------------------------------------------------------------
    def run(self) -> DynamicAOTModule:
        entries = self._entries()
        ctors = self._constructors()
        used = {}
        for what, c_name in [*((f"function @{e.name}", e.c_name) for e in entries),
                             *((f"constructor {c.type_name}.{c.name}", f"{c.type_name}_{c.name}") for c in ctors)]:
            if c_name in _API or c_name in used:
                raise UnsupportedError(f"AOT dynamic: the C name tvd_{self.name}_{c_name} of {what} is taken by "
                                       f"{used.get(c_name, 'the API')}; rename it")
            used[c_name] = what
        source, constants = self._source(entries, ctors)
        blob = None
        if self.blob:  # (the hash covers the whole unit but its own line: code, names and the constants' shapes)
            digest = hashlib.sha256(source.encode()).digest()
            source = source.replace(_HASH_PLACEHOLDER, ", ".join(map(str, digest)))
            blob = _params_blob(constants, digest)
        sources = {f"{self.name}.c": source, f"{self.name}.h": self._header(entries, ctors),
                   COMMON_HEADER: _unit_text(COMMON_HEADER)}
        return DynamicAOTModule(self.name, sources, tuple(entries), tuple(ctors),
                                sum(int(c.nbytes) for c in constants), str(self.mod), blob=blob)

    def _entries(self) -> list:
        exe = self.exe
        entries = []
        for gv, fn in self.mod.functions.items():
            if fn.is_primitive or gv.name not in exe.global_map:
                continue
            vmfn = exe.functions[exe.global_map[gv.name]]
            if vmfn.param_types is None or len(vmfn.param_types) != len(vmfn.params):
                raise UnsupportedError(f"AOT dynamic: @{gv.name} has no parameter types")
            names, params = set(), []
            for pname, ty in zip(vmfn.params, vmfn.param_types, strict=True):
                c = c_identifier(pname)
                while c in names or _taken(c):
                    c += "_"
                names.add(c)
                params.append((c, ty, _is_tensor_type(ty)))
            entries.append(EntryPoint(gv.name, c_identifier(gv.name), tuple(params), vmfn.ret_type))
        return entries

    def _constructors(self) -> list:
        from ..vm import bytecode as bc

        out = []
        for t, adt in enumerate(self.exe.adts):
            tdef = self.defs.get(adt.name)
            for c, (cname, arity) in enumerate(adt.constructors):
                fields = tdef.constructors[c].inputs if tdef is not None else (None,) * arity
                out.append(Constructor(c_identifier(adt.name), c_identifier(cname), bc.adt_tag(t, c), tuple(fields)))
        return out

    # --- the C unit --------------------------------------------------------------------------------
    def _source(self, entries, ctors) -> tuple:
        exe, native = self.exe, self.exe.c_library.native
        # the kernels and shape functions (made static), then the native unit (static already but its entry)
        kernels, sep, rest = exe.c_library.source.partition(native.source)
        if not sep or rest.strip() or native.source.count(_INVOKE) != 1:
            raise UnsupportedError("AOT dynamic: unexpected kernel library text (the native unit is not at its end)")
        kernels = _optional_pragmas(_GLOBAL_DEFINITION.sub(r"static inline \1", _MESSAGES.sub(
            r"static const char* const \1", kernels)))
        # (their temporaries: from the application's allocator too; the kernel text allocates with malloc/free only)
        if re.search(r"\b(calloc|realloc|aligned_alloc|posix_memalign)\(", kernels):
            raise UnsupportedError("AOT dynamic: a kernel allocates with a function other than malloc/free")
        kernels = re.sub(r"\bfree\(", "tvd_obj_free(", re.sub(r"\bmalloc\(", "tvd_obj_malloc(", kernels))
        # (the native unit declares the kernels it calls: here their definitions come first, in the same unit)
        # (and its exported functions, the Python bridge's entries such as tvn_invoke and tvn_profile_swap,
        # static: only tvd_<name>_* leaves the library, so several models link into one application)
        native_text = _KERNEL_PROTO.sub("", native.source.replace(_EXPORTED, "TV_UNUSED static "))
        library = kernels + native_text
        constants = [np.asarray(c) for c in exe.constants] + [np.asarray(c) for c in native.constants]
        body = [self._entry(e) for e in entries] + [self._constructor(c) for c in ctors]
        out = [f"/* {self.name}.c: the tensorvm program {self.name!r} as a standalone C library (generated by "
               f"tensorvm/aot/dynamic.py; do not edit). API: {self.name}.h, docs/aot_dynamic.md. */",
               _unit_text("tvd_prologue.h"),
               "#ifndef _OPENMP  /* (without OpenMP the kernels run serially: their parallel pragmas are inert) */",
               '#pragma GCC diagnostic ignored "-Wunknown-pragmas"', "#endif",
               f'#include "{self.name}.h"',
               library,
               f"#define TVD_FN(x) {self.prefix}_##x",
               f"#define TVD_NUM_SYMS {max(len(self.syms), 1)} /* the named dims of the parameters' types */",
               *(["#define TVD_BLOB_PARAMS /* constants from a params blob (tvd_blob.c) */"] if self.blob else []),
               _unit_text("tvd_api.c"),
               "/* ---- tables ---- */"]
        out += self._constant_tables(constants)
        out += self._name_tables(native)
        names = ", ".join(_c_string(n) for n in self.syms) or '"?"'
        if self.blob:
            out += [f"static const unsigned char tvd_program_hash[32] = {{{_HASH_PLACEHOLDER}}};",
                    _unit_text("tvd_blob.c")]
        out += [f"static const char* const tvd_sym_names[TVD_NUM_SYMS] = {{{names}}};",
                "TV_UNUSED static const char* tvd_sym_name(int32_t k) { return tvd_sym_names[k]; }"]
        out += ["/* ---- type checks ---- */"] + self.check_protos + self.check_code + ["/* ---- entry points ---- */"] + body
        return "\n".join(out) + "\n", constants

    def _constant_tables(self, constants) -> list:
        from ..codegen.c_emit import C_TYPES
        from ..vm import bytecode as bc

        lines, info = [], []
        needs_math = False
        for k, array in enumerate(constants):
            array = np.ascontiguousarray(array) if array.ndim else array
            dtype = array.dtype.name
            if dtype not in C_TYPES:
                raise UnsupportedError(f"AOT dynamic: constant {k} has dtype {dtype}, which C cannot hold here")
            if self.blob:
                data = "NULL"  # (tvd_blob.c: from the params blob)
            elif array.nbytes >= _BYTES_AS_STRING:
                lines += _bytes_initializer(f"tvd_c{k}", C_TYPES[dtype], array)
                data = f"tvd_c{k}.values"
            else:
                values, special = _c_initializer(array)
                needs_math |= special
                lines.append(f"static const _Alignas(64) {C_TYPES[dtype]} tvd_c{k}[{max(array.size, 1)}] = {{")
                lines += ["  " + ", ".join(values[i:i + 8]) + "," for i in range(0, len(values), 8)]
                lines.append("};")
                data = f"tvd_c{k}"
            shape = "NULL"
            if array.ndim:
                lines.append(f"static const int64_t tvd_c{k}_shape[{array.ndim}] = {{{', '.join(map(str, array.shape))}}};")
                shape = f"tvd_c{k}_shape"
            code, bits, _ = bc.dtype_to_code(dtype)
            info.append(f"  {{{data}, {code}, {bits}, {array.ndim}, {shape}}},")
        n = len(constants)
        lines.append(f"static const tvd_constant tvd_constant_table[{max(n, 1)}] = {{")
        lines += info or ["  {NULL, 0, 0, 0, NULL},"]
        lines.append("};")
        lines.append(f"static int64_t tvd_num_constants(void) {{ return {n}; }}")
        lines.append("static const tvd_constant* tvd_constant_info(int64_t k) { return &tvd_constant_table[k]; }")
        if self.blob or any(np.asarray(c).nbytes >= _BYTES_AS_STRING for c in constants):  # (bytes: little-endian)
            order = "__ORDER_LITTLE_ENDIAN__" if sys.byteorder == "little" else "__ORDER_BIG_ENDIAN__"
            lines[:0] = [f"#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != {order}",
                         f'#error "{self.name}.c holds its constants as {sys.byteorder}-endian bytes"', "#endif"]
        return (["#include <math.h>"] if needs_math else []) + lines

    def _name_tables(self, native) -> list:
        from ..codegen.c_emit import RUNTIME_ERRORS

        exe = self.exe
        names = ", ".join(_c_string(fn.name) for fn in exe.functions) or '"?"'
        lines = [f"static const char* const tvd_function_names[{max(len(exe.functions), 1)}] = {{{names}}};",
                 f"static const char* tvd_function_name(int32_t f) {{ return f >= 0 && f < {len(exe.functions)} ? "
                 f"tvd_function_names[f] : \"?\"; }}"]
        signatures = ", ".join(_c_string(_type_text(self.closure_targets[f][0])) if f in self.closure_targets
                               else '"?"' for f in range(len(exe.functions))) or '"?"'
        lines += [f"static const char* const tvd_closure_signatures[{max(len(exe.functions), 1)}] = {{{signatures}}};",
                  f"TV_UNUSED static const char* tvd_closure_signature(int32_t f) {{ return f >= 0 && "
                  f"f < {len(exe.functions)} ? tvd_closure_signatures[f] : \"?\"; }}"]
        prims = ", ".join(_c_string(p.name) for p in exe.primitives) or '"?"'
        lines += [f"static const char* const tvd_packed_names[{max(len(exe.primitives), 1)}] = {{{prims}}};",
                  f"static const char* tvd_packed_name(int32_t p) {{ return p >= 0 && p < {len(exe.primitives)} ? "
                  f"tvd_packed_names[p] : \"?\"; }}"]
        lines.append("static const char* tvd_kernel_error(int32_t packed, int32_t code, const char** kernel, int* runtime) {")
        runtime = " || ".join(f"code == {c}" for c in sorted(RUNTIME_ERRORS)) or "0"
        lines.append(f"  *runtime = {runtime};")
        lines.append("  switch (packed) {")
        for p, kernel in sorted(native.kernel_functions.items()):
            lines.append(f"    case {p}:")
            lines.append(f"      *kernel = {_c_string(kernel.name)};")
            lines.append("      switch (code) {")
            for code, message in sorted(kernel._errors.items()):
                lines.append(f"        case {int(code)}: return {_c_string(str(message))};")
            lines.append("        default: return \"unknown error code\";")
            lines.append("      }")
        lines += ["    default:", "      *kernel = \"?\";", "      return \"unknown error code\";", "  }", "}"]
        return lines

    # --- type checks -------------------------------------------------------------------------------
    def _check(self, ty) -> str:
        """The C function checking that a value has type ``ty`` (``int32_t f(tvd_model*, const tv_obj*,
        const char* where)``). An ADT of no type variables is checked by its tag only: its values are
        well typed by construction (the constructors check their fields, the program makes the rest); an
        ADT applied to concrete types (``List[Tensor[...]]``) is checked field by field."""
        from ..ir.types import FuncType, GlobalTypeVar, TensorType, TupleType, TypeCall

        key = _type_text(ty) if ty is not None else "_"
        if isinstance(ty, TensorType):
            key = ("tensor", key)
        if key in self.checks:
            return self.checks[key]
        fname = f"tvd_ty{len(self.checks)}"
        self.checks[key] = fname
        signature = f"static int32_t {fname}(tvd_model* m, const tv_obj* o, const char* where, tvd_syms* s)"
        self.check_protos.append(signature + ";")
        head = f"{signature} {{  /* {_comment(_type_text(ty))} */"
        text = _c_string(_type_text(ty))
        if isinstance(ty, TensorType):
            code, bits = _dtype_pair(ty.dtype)
            dims = ", ".join(str(d) if isinstance(d, int) else "-1" for d in ty.shape) or "0"
            body = [f"  static const int64_t dims[{max(len(ty.shape), 1)}] = {{{dims}}};",
                    f"  int32_t rc = tvd_check_tensor(m, o, {code}, {bits}, {len(ty.shape)}, dims, where, {text});"]
            body += self._bind(ty, "((const tv_tensor*)o)->shape", text) or ["  (void)s;"]
            body.append("  return rc;")
        elif isinstance(ty, TupleType):
            body = [f"  int32_t rc = tvd_check_adt(m, o, -1, 0, NULL, {len(ty.fields)}, where, {text});",
                    "  if (rc != TVD_OK) return rc;"]
            for i, f in enumerate(ty.fields):
                body.append(f"  if ((rc = {self._check(f)}(m, ((const tv_adt*)o)->fields[{i}], where, s)) != TVD_OK) return rc;")
            body.append("  return TVD_OK;")
        elif isinstance(ty, (GlobalTypeVar, TypeCall)):
            body = self._adt_check(ty, fname, text)
        elif isinstance(ty, FuncType):
            body = self._closure_check(ty, text)
        else:  # a type variable, or a type the program leaves open: any value
            body = ["  (void)s;", "  if (o == NULL) return tvd_fail(m, TVD_ERR_ARGUMENT, \"%s: a value is NULL\", where);",
                    "  return TVD_OK;"]
        self.check_code += [head] + body + ["}"]
        return fname

    def _closure_check(self, ty, text: str) -> list:
        """A closure of this program whose function takes ``len(ty.arg_types)`` arguments beyond what it
        captured, of types and result fitting ``ty``: the program's closures (its ``AllocClosure``
        functions) are known here, so the C check is a lookup of the closure's function."""
        accept = [f for f, (sig, _) in sorted(self.closure_targets.items()) if _fits(ty, sig)]
        table = ", ".join(map(str, accept)) or "-1"
        return [f"  static const int32_t accept[{max(len(accept), 1)}] = {{{table}}};", "  (void)s;",
                f"  return tvd_check_closure(m, o, {len(ty.arg_types)}, {len(accept)}, accept, where, {text});"]

    def _adt_check(self, ty, fname: str, text: str) -> list:
        from ..ir.types import TypeCall
        from ..runtime.convert import substitute_type

        header = ty.func if isinstance(ty, TypeCall) else ty
        args = ty.args if isinstance(ty, TypeCall) else ()
        tdef, index = self.defs.get(header.name), self.type_index.get(header.name)
        if tdef is None or index is None:
            raise UnsupportedError(f"AOT dynamic: the definition of type {header.name} is unknown")
        arity = ", ".join(str(len(c.inputs)) for c in tdef.constructors) or "0"
        lines = [f"  static const int32_t arity[{max(len(tdef.constructors), 1)}] = {{{arity}}};"]
        top = (f"int32_t rc = tvd_check_adt(m, o, {index}, {len(tdef.constructors)}, arity, 0, where, {text}); "
               f"if (rc != TVD_OK) return rc;")
        mapping = dict(zip(tdef.type_vars, args, strict=False))
        # (fields with named dims are checked too: the dims bind across the call's arguments, as the VM binds them)
        deep = (bool(tdef.type_vars) and bool(args) and not any(_has_type_var(a) for a in args)) or any(
            _has_sym_dim(substitute_type(t, mapping)) for c in tdef.constructors for t in c.inputs)
        if not deep:
            return lines + ["  (void)s;", f"  {top}", "  return TVD_OK;"]
        lines += ["  for (;;) {", f"    {top}", "    const tv_adt* a = (const tv_adt*)o;",
                  "    switch (a->tag & ((1 << 24) - 1)) {"]
        for c, ctor in enumerate(tdef.constructors):
            fields = [substitute_type(t, mapping) for t in ctor.inputs]
            lines.append(f"      case {c}:")
            last_self = bool(fields) and _type_text(fields[-1]) == _type_text(ty)
            for i, f in enumerate(fields):
                if i == len(fields) - 1 and last_self:
                    lines.append(f"        o = a->fields[{i}];")
                    lines.append("        continue;")
                    break
                lines.append(f"        if ((rc = {self._check(f)}(m, a->fields[{i}], where, s)) != TVD_OK) return rc;")
            else:
                lines.append("        return TVD_OK;")
        lines += ["      default:", "        return TVD_OK;", "    }", "  }"]
        return lines

    # --- API functions -----------------------------------------------------------------------------
    def _entry(self, e: EntryPoint) -> str:
        f = self.exe.global_map[e.name]
        n = len(e.params)
        what = _c_string(f"@{e.name}")
        lines = [f"{self._entry_signature(e)} {{",
                 "  if (m == NULL) return TVD_ERR_ARGUMENT;",
                 f"  if (result == NULL) return tvd_fail(m, TVD_ERR_ARGUMENT, \"%s: result is NULL\", {what});",
                 "  *result = NULL;",
                 "  tvd_scope scope = tvd_enter(m);",
                 f"  tv_obj* args[{max(n, 1)}] = {{NULL}};",
                 "  int32_t rc = TVD_OK;",
                 "  tvd_syms s = {{0}, {NULL}};  /* (the named dims of this call's arguments) */", "  (void)s;"]
        for i, (c, ty, is_tensor) in enumerate(e.params):
            where = _c_string(f"@{e.name}: parameter %{c}")
            if is_tensor:
                code, bits = _dtype_pair(ty.dtype)
                dims = ", ".join(str(d) if isinstance(d, int) else "-1" for d in ty.shape) or "0"
                lines.append(f"  static const int64_t dims{i}[{max(len(ty.shape), 1)}] = {{{dims}}};")
                lines.append(f"  if (rc == TVD_OK) rc = tvd_tensor_object(m, {c}, 0, {code}, {bits}, {len(ty.shape)}, "
                             f"dims{i}, {where}, &args[{i}]);")
                if any(isinstance(d, SymDim) for d in ty.shape):
                    lines.append("  if (rc == TVD_OK) {")
                    lines += ["  " + line for line in self._bind(ty, f"((const tv_tensor*)args[{i}])->shape",
                                                                  _c_string(_type_text(ty)), where, "&s")]
                    lines.append("  }")
            else:
                lines.append(f"  if (rc == TVD_OK && (rc = {self._check(ty)}(m, tvd_obj({c}), {where}, &s)) == TVD_OK) "
                             f"{{ args[{i}] = tvd_obj({c}); tv_incref(args[{i}]); }}")
        lines.append(f"  if (rc == TVD_OK) rc = tvd_call(m, {f}, args, {what}, result);")
        lines.append(f"  for (int32_t i = 0; i < {n}; ++i) tv_decref(args[i]);")
        lines += ["  tvd_leave(scope);", "  return rc;", "}"]
        return "\n".join(lines)

    def _bind(self, ty, shape: str, text: str, where: str = "where", syms: str = "s") -> list:
        """C lines binding the named dims of tensor type ``ty`` (its value's shape at ``shape``) in the call's
        bindings ``syms`` (a ``tvd_syms*``), or failing with what the earlier binding said, as the VM binds
        them: at their first tensor in parameter order, depth first."""
        dims = [(axis, self.syms.setdefault(d.name, len(self.syms))) for axis, d in enumerate(ty.shape)
                if isinstance(d, SymDim)]
        if not dims:
            return []
        table = ", ".join(str(self.syms[d.name]) if isinstance(d, SymDim) else "-1" for d in ty.shape)
        return [f"  static const int32_t syms[{len(ty.shape)}] = {{{table}}};",
                f"  if (rc == TVD_OK) rc = tvd_bind_dims(m, {syms}, {len(ty.shape)}, {shape}, syms, {where}, {text});"]

    def _entry_signature(self, e: EntryPoint) -> str:
        params = ["tvd_model* m"] + [f"const tvd_tensor* {c}" if t else f"tvd_value* {c}" for c, _, t in e.params]
        return f"int32_t {self.prefix}_{e.c_name}({', '.join(params + ['tvd_value** result'])})"

    def _constructor(self, c: Constructor) -> str:
        n = len(c.fields)
        check = f"tvd_ctor_{c.type_name}_{c.name}"
        lines = [f"static int32_t {check}(tvd_model* m, tv_obj* const* f) {{", "  int32_t rc = TVD_OK;", "  (void)f;",
                 "  tvd_syms s = {{0}, {NULL}};  /* (named dims bind across the fields of one constructor call) */", "  (void)s;"]
        for i, ty in enumerate(c.fields):
            where = _c_string(f"{c.type_name}.{c.name}: field {i}")
            lines.append(f"  if ((rc = {self._check(ty)}(m, f[{i}], {where}, &s)) != TVD_OK) return rc;")
        lines += ["  (void)m;", "  return rc;", "}"]
        fields = "{" + (", ".join(f"f{i}" for i in range(n)) or "NULL") + "}"
        lines += [f"{self._constructor_signature(c)} {{", f"  tvd_value* const fields[] = {fields};",
                  f"  return tvd_construct(m, {_c_string(f'{c.type_name}.{c.name}')}, INT64_C({c.tag}), {n}, fields, "
                  f"{check}, out);", "}"]
        return "\n".join(lines)

    def _constructor_signature(self, c: Constructor) -> str:
        params = ["tvd_model* m"] + [f"tvd_value* f{i}" for i in range(len(c.fields))] + ["tvd_value** out"]
        return f"int32_t {self.prefix}_{c.type_name}_{c.name}({', '.join(params)})"

    # --- the header --------------------------------------------------------------------------------
    def _header(self, entries, ctors) -> str:
        p, m = self.prefix, self.macro
        lines = [f"/* {self.name}.h: C interface of the tensorvm program {self.name!r} as a standalone library",
                 "   (generated by tensorvm/aot/dynamic.py; do not edit). See docs/aot_dynamic.md. */",
                 f"#ifndef {m}_H_", f"#define {m}_H_", "", f'#include "{COMMON_HEADER}"', "",
                 "#ifdef __cplusplus", 'extern "C" {', "#endif", "",
                 "/* ---- the model ---- */",
                 "/* A new instance (options NULL: the defaults); *out is released with destroy. */",
                 f"int32_t {p}_create(const tvd_options* options, tvd_model** out);",
                 "/* Frees the instance; values it made stay valid (each holds what it needs) until released. */",
                 f"void {p}_destroy(tvd_model* m);",
                 "/* What the last failed call on m was about (\"\" after a success). */",
                 f"const char* {p}_last_error(const tvd_model* m);",
                 "/* The kernels' thread budget (n <= 0: every core); the count in effect (1 without OpenMP). */",
                 f"int32_t {p}_set_num_threads(int32_t n);",
                 "/* Gives the pool's cached blocks back to the allocator. */",
                 f"void {p}_trim(tvd_model* m);",
                 f"void {p}_memory_stats(const tvd_model* m, tvd_memory_stats* out);", "",
                 "/* ---- values: every tvd_value* given out is the caller's, released once ---- */",
                 f"void {p}_retain(tvd_value* v);",
                 f"void {p}_release(tvd_value* v); /* NULL: nothing */",
                 "/* A tensor value holding a copy of t's data (for ADT fields and tuples). */",
                 f"int32_t {p}_tensor(tvd_model* m, const tvd_tensor* t, tvd_value** out);",
                 "/* A view of a tensor value (shape and data point into v: valid while v is). */",
                 f"int32_t {p}_tensor_get(const tvd_value* v, tvd_tensor* out);",
                 "/* A tuple of n values (each gets a new reference; the caller keeps its own). */",
                 f"int32_t {p}_tuple(tvd_model* m, int32_t n, tvd_value* const* fields, tvd_value** out);",
                 f"int32_t {p}_is_tensor(const tvd_value* v);",
                 f"int32_t {p}_is_closure(const tvd_value* v);",
                 f"/* The tag of an ADT value ({m}_<TYPE>_<CTOR>) or a tuple (0); -1 for a tensor or closure. */",
                 f"int64_t {p}_tag(const tvd_value* v);",
                 f"int32_t {p}_num_fields(const tvd_value* v); /* -1: not an ADT value or tuple */",
                 "/* Field i of an ADT value or tuple, borrowed (valid while v is; retain to keep it); NULL if none. */",
                 f"tvd_value* {p}_field(const tvd_value* v, int32_t i);", ""]
        if self.blob:
            lines += [f"/* ---- the constants: from the params blob {self.name}.params, loaded once per model before any",
                      "   call (copied: the caller's buffer may go at once). A blob that is truncated, corrupted, another",
                      "   program's or another version's is refused with TVD_ERR_FORMAT and a message ---- */",
                      f"int32_t {p}_load_params(tvd_model* m, const void* data, size_t size);",
                      f"int32_t {p}_load_params_file(tvd_model* m, const char* path);", ""]
        if ctors:
            lines.append("/* ---- ADT constructors: fields borrowed (the value takes its own references), checked ---- */")
        for c in ctors:
            fields = ", ".join(_type_text(t) if t is not None else "?" for t in c.fields)
            lines.append(f"#define {m}_{c.type_name.upper()}_{c.name.upper()} INT64_C({c.tag}) /* {c.type_name}.{c.name}"
                         f"({_comment(fields)}) */")
            lines.append(f"{self._constructor_signature(c)};")
        lines += ["", "/* ---- entry points: tensors are read during the call only; *result is the caller's ---- */"]
        for e in entries:
            sig = ", ".join(f"%{c}: {_type_text(t)}" for c, t, _ in e.params)
            lines.append(f"/* @{_comment(e.name)}({_comment(sig)}) -> {_comment(_type_text(e.ret_type))} */")
            lines.append(f"{self._entry_signature(e)};")
        lines += ["", "#ifdef __cplusplus", "}", "#endif", "", f"#endif /* {m}_H_ */"]
        return "\n".join(lines) + "\n"


_HASH_PLACEHOLDER = "TVD_PROGRAM_HASH"
_BLOB_HEADER = 80


def _params_blob(constants, digest: bytes) -> bytes:
    """The params blob of these constants (layout and checksum: dynamic_c/tvd_blob.c, docs/aot_dynamic.md)."""
    datas = [np.ascontiguousarray(c).astype(c.dtype.newbyteorder("<"), copy=False).tobytes() for c in constants]
    table, at = [], _round64(_BLOB_HEADER + 16 * len(datas))
    for data in datas:
        table.append((at, len(data)))
        at = _round64(at + len(data))
    body = bytearray(at - _BLOB_HEADER)
    for k, ((offset, nbytes), data) in enumerate(zip(table, datas, strict=True)):
        body[16 * k:16 * k + 16] = np.array([offset, nbytes], "<u8").tobytes()
        body[offset - _BLOB_HEADER:offset - _BLOB_HEADER + nbytes] = data
    words = np.frombuffer(bytes(body), "<u8")
    total = int(words.sum(dtype=np.uint64))
    weighted = int((words * np.arange(1, len(words) + 1, dtype=np.uint64)).sum(dtype=np.uint64))
    header = b"TVDPARAM" + np.array([1, len(datas)], "<u4").tobytes() + np.array([at, total, weighted], "<u8").tobytes() \
        + digest + bytes(8)
    return header + bytes(body)


def _round64(n: int) -> int:
    return (n + 63) // 64 * 64


_ESCAPES = tuple(f"\\x{b:02x}" for b in range(256))


def _bytes_initializer(name: str, ctype: str, array) -> list:
    """A large constant as its bytes in string literals (a compiler reads these ~10x faster than a list
    of float literals: the LSTM 256->512's 6 MB of weights), read through a union as its C type."""
    data = array.tobytes()
    lines = [f"static const union {{ unsigned char bytes[{len(data)}]; {ctype} values[{array.size}]; }} "
             f"__attribute__((aligned(64))) {name} = {{.bytes ="]
    lines += ['  "' + "".join(map(_ESCAPES.__getitem__, data[i:i + 48])) + '"' for i in range(0, len(data), 48)]
    lines.append("};")
    return lines


def _taken(name: str) -> bool:
    """Whether a C parameter name would clash with a keyword or a local or helper of the entry point."""
    return (name in _C_RESERVED or name in ("m", "result", "args", "rc", "scope", "i")
            or re.fullmatch(r"dims\d+", name) is not None or name.startswith(("tv_", "tvd_", "tvn_")))


def _is_tensor_type(ty) -> bool:
    from ..ir.types import TensorType

    return isinstance(ty, TensorType)


def _closure_targets(exe) -> dict:
    """VM function -> (its signature as a closure: a FuncType of the parameters it does not capture, and the
    number it captures), for every function the program makes closures of."""
    from ..ir.types import FuncType
    from ..vm import bytecode as bc

    out = {}
    for fn in exe.functions:
        for ins in fn.instructions:
            if isinstance(ins, bc.AllocClosure):
                target = exe.functions[ins.func_index]
                nfree = len(ins.free_vars)
                types = target.param_types if target.param_types is not None else (None,) * len(target.params)
                out[ins.func_index] = (FuncType(tuple(types[nfree:]), target.ret_type), nfree)
    return out


def _fits(want, got) -> bool:
    """Whether a value of type ``got`` may stand where ``want`` is expected: the same structure, where an
    unknown (``?``, named dim, type variable, missing type) fits anything."""
    from ..ir.types import FuncType, GlobalTypeVar, TensorType, TupleType, TypeCall

    if want is None or got is None:
        return True
    if isinstance(want, TensorType) or isinstance(got, TensorType):
        return (isinstance(want, TensorType) and isinstance(got, TensorType) and want.dtype == got.dtype
                and len(want.shape) == len(got.shape)
                and all(not isinstance(a, int) or not isinstance(b, int) or a == b for a, b in zip(want.shape, got.shape)))
    if isinstance(want, TupleType) or isinstance(got, TupleType):
        return (isinstance(want, TupleType) and isinstance(got, TupleType) and len(want.fields) == len(got.fields)
                and all(map(_fits, want.fields, got.fields)))
    if isinstance(want, FuncType) or isinstance(got, FuncType):
        return (isinstance(want, FuncType) and isinstance(got, FuncType) and len(want.arg_types) == len(got.arg_types)
                and all(map(_fits, want.arg_types, got.arg_types)) and _fits(want.ret_type, got.ret_type))
    if isinstance(want, (TypeCall, GlobalTypeVar)) or isinstance(got, (TypeCall, GlobalTypeVar)):
        head = [t.func.name if isinstance(t, TypeCall) else getattr(t, "name", None) for t in (want, got)]
        args = [t.args if isinstance(t, TypeCall) else () for t in (want, got)]
        return (head[0] == head[1] and isinstance(want, (TypeCall, GlobalTypeVar)) and isinstance(got, (TypeCall, GlobalTypeVar))
                and (not args[0] or not args[1] or (len(args[0]) == len(args[1]) and all(map(_fits, *args)))))
    return True  # a type variable or an incomplete type


def _has_sym_dim(ty) -> bool:
    from ..ir.types import TensorType, TupleType, TypeCall

    if isinstance(ty, TensorType):
        return any(isinstance(d, SymDim) for d in ty.shape)
    if isinstance(ty, TupleType):
        return any(map(_has_sym_dim, ty.fields))
    if isinstance(ty, TypeCall):
        return any(map(_has_sym_dim, ty.args))
    return False


def _has_type_var(ty) -> bool:
    from ..ir.types import FuncType, TupleType, TypeCall, TypeVar

    if isinstance(ty, TypeVar):
        return True
    if isinstance(ty, TupleType):
        return any(map(_has_type_var, ty.fields))
    if isinstance(ty, TypeCall):
        return any(map(_has_type_var, ty.args))
    if isinstance(ty, FuncType):
        return True
    return False
