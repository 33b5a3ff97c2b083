"""The executable's binary format (docs/executable-format.md): writing, and reading with full checks.

Reading never unpickles or executes anything from the file: every field is read with bounds checks,
every count is checked against the bytes that remain, every name must be an identifier of the text
format (``NAME``: names never become code, see ``compiled.py``), type text nests at most
``MAX_TYPE_DEPTH`` levels, constant shapes are bounded, the bytecode is verified with the rules for
untrusted files (``bytecode.verify_function(from_file=True)``: registers, jumps, indexes, no writes to
parameters), and primitive functions are rebuilt by *parsing* their Relay text. Anything wrong raises
``FormatError`` (the threat model is in docs/executable-format.md).

Version 2 adds optional sections after ``CODE``: ``CLIB`` (target "c": the C source of the kernel library,
kept for reading). The loader never compiles or loads that text: it regenerates the C from the primitive
functions with tensorvm's own code generator (a cache hit when it is unchanged) and only records whether
the saved text matches. Version 3 adds the optional ``ATYP`` section before ``CLIB``: the type variables
of each ADT and its constructors' field types, with which the VM checks ADT arguments.
Version 4 adds ``KABI`` (how to call the prebuilt kernel library: symbols, buffers, constants, error
tables, C shape functions, and a manifest with the C text's hash, the toolchain, the triple and the CPU
features) and ``KLIB`` (the library's bytes, written only on request); when and whose library the loader
then uses instead of regenerating the C is in docs/deploy.md (``kernel_abi.prebuilt_library``).

Types (parameter and result types) are stored as short text in a Relay-like syntax written and read by
this module (``type_to_text``/``text_to_type``), so the format does not depend on the full parser.
"""

from __future__ import annotations

import hashlib
import math
import re
import struct
from types import SimpleNamespace

import numpy as np

from ..errors import FormatError, UnsupportedError
from ..ir.types import (
    DTYPES,
    Any,
    FuncType,
    GlobalTypeVar,
    RefType,
    SymDim,
    TensorType,
    TupleType,
    TypeCall,
    TypeVar,
)
from . import bytecode as bc
from .executable import EXEC_MODES, AdtInfo, Executable, PrimitiveInfo

__all__ = ["MAGIC", "FORMAT_VERSION", "executable_to_bytes", "load_executable", "type_to_text", "text_to_type"]

MAGIC = b"\x89TVMEXE\n"
FORMAT_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)  # version 1: no optional sections; version 2: no ATYP; 3: no KABI/KLIB
SECTIONS = (b"GLOB", b"ADTS", b"CNST", b"PRIM", b"CODE")
OPTIONAL_SECTIONS = (b"ATYP", b"CLIB", b"KABI", b"KLIB")
_FIRST_VERSION = {b"ATYP": 3, b"CLIB": 2, b"KABI": 4, b"KLIB": 4}
MAX_LIBRARY_BYTES = 1 << 30  # an embedded kernel library (KLIB) larger than this is refused
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,200}")  # a C function name in a KABI section
_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_RANK = 32
_CHECKSUM_SIZE = 32  # SHA-256
# Names (functions, parameters, kernels, primitive functions, ADTs, constructors, type variables) follow the
# text format's identifier grammar (globals ``@[A-Za-z0-9_]+``, locals ``%[A-Za-z0-9_]+``, dotted type and
# constructor names), which is all the compiler produces; anything else in a file is a FormatError.
NAME = re.compile(r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*")
MAX_NAME_LENGTH = 1024
MAX_TYPE_DEPTH = 500  # nesting of types in type text (as type inference allows: MAX_TYPE_NESTING; parsing recurses per level)
MAX_TYPE_TEXT = 1 << 20
_KIND_CODES = {"kernel": 0, "shape_func": 1}
TARGETS = ("python", "c")


# --- types as text --------------------------------------------------------------------------------
def type_to_text(ty) -> str:
    """A type in Relay-like text (``""`` for an unknown type)."""
    if ty is None:
        return ""
    if isinstance(ty, TensorType):
        if not ty.shape:
            return ty.dtype
        dims = ", ".join("?" if isinstance(d, Any) else str(d.name if isinstance(d, SymDim) else d)
                         for d in ty.shape)
        return f"Tensor[({dims}{',' if len(ty.shape) == 1 else ''}), {ty.dtype}]"
    if isinstance(ty, TupleType):
        inner = ", ".join(type_to_text(f) for f in ty.fields)
        return f"({inner}{',' if len(ty.fields) == 1 else ''})"
    if isinstance(ty, TypeCall):
        return f"{ty.func.name}[{', '.join(type_to_text(a) for a in ty.args)}]"
    if isinstance(ty, (GlobalTypeVar, TypeVar)):
        return ty.name
    if isinstance(ty, FuncType):
        return f"fn ({', '.join(type_to_text(a) for a in ty.arg_types)}) -> {type_to_text(ty.ret_type)}"
    if isinstance(ty, RefType):
        return f"ref({type_to_text(ty.value)})"
    return ""  # incomplete or unknown: the VM does not check it


_TOKEN = re.compile(r"\s*(->|[A-Za-z_][A-Za-z0-9_.]*|\d+|[\[\](),?])")


def text_to_type(text: str, adt_names=(), type_vars: dict | None = None):
    """Read ``type_to_text``'s output; names in ``adt_names`` are ADTs, other names type variables.

    ``type_vars`` maps names to the ``TypeVar`` objects to use (new ones are added to it), so several
    texts can share type variables (the fields of an ADT's constructors); by default each text has its own.
    """
    if not text:
        return None
    if len(text) > MAX_TYPE_TEXT:
        raise FormatError(f"type text of {len(text)} characters (at most {MAX_TYPE_TEXT})")
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip() == "":
                break
            raise FormatError(f"bad type text {text!r} at {pos}")
        tokens.append(m.group(1))
        pos = m.end()
    adts = set(adt_names)
    type_vars = {} if type_vars is None else type_vars
    index = 0

    def peek():
        return tokens[index] if index < len(tokens) else None

    def take(expected=None):
        nonlocal index
        tok = peek()
        if tok is None or (expected is not None and tok != expected):
            raise FormatError(f"bad type text {text!r}: expected {expected or 'more'}, got {tok!r}")
        index += 1
        return tok

    def parse(depth=0):
        if depth > MAX_TYPE_DEPTH:  # keeps this recursive parser and the VM's type checks shallow
            raise FormatError(f"type text nested deeper than {MAX_TYPE_DEPTH} levels: {text[:80]!r}...")
        tok = take()
        if tok == "Tensor":
            take("[")
            take("(")
            dims = []
            while peek() != ")":
                d = take()
                dims.append(Any() if d == "?" else int(d) if d.isdigit() else SymDim(d))
                if peek() == ",":
                    take(",")
            take(")")
            take(",")
            dtype = take()
            take("]")
            if dtype not in DTYPES:
                raise FormatError(f"bad type text {text!r}: unknown dtype {dtype!r}")
            return TensorType(tuple(dims), dtype)
        if tok in DTYPES:
            return TensorType((), tok)
        if tok == "(":
            fields = []
            while peek() != ")":
                fields.append(parse(depth + 1))
                if peek() == ",":
                    take(",")
            take(")")
            return TupleType(tuple(fields))
        if tok == "fn":
            take("(")
            args = []
            while peek() != ")":
                args.append(parse(depth + 1))
                if peek() == ",":
                    take(",")
            take(")")
            take("->")
            return FuncType(tuple(args), parse(depth + 1))
        if tok == "ref":
            take("(")
            inner = parse(depth + 1)
            take(")")
            return RefType(inner)
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", tok):
            if tok in adts:
                if peek() == "[":
                    take("[")
                    args = []
                    while peek() != "]":
                        args.append(parse(depth + 1))
                        if peek() == ",":
                            take(",")
                    take("]")
                    return TypeCall(GlobalTypeVar(tok), tuple(args))
                return GlobalTypeVar(tok)
            return type_vars.setdefault(tok, TypeVar(tok))
        raise FormatError(f"bad type text {text!r}: unexpected {tok!r}")

    try:
        result = parse()
    except (ValueError, TypeError) as err:
        raise FormatError(f"bad type text {text!r}: {err}") from None
    if index != len(tokens):
        raise FormatError(f"bad type text {text!r}: trailing {tokens[index:]}")
    return result


# --- writing --------------------------------------------------------------------------------------
class _Writer:
    def __init__(self):
        self.buf = bytearray()

    def u8(self, v):
        self.buf += struct.pack("<B", v)

    def u32(self, v):
        self.buf += struct.pack("<I", v)

    def i32(self, v):
        self.buf += struct.pack("<i", v)

    def u64(self, v):
        self.buf += struct.pack("<Q", v)

    def i64s(self, values):
        self.buf += np.asarray(values, dtype="<i8").tobytes()

    def str(self, s: str):
        data = s.encode("utf-8")
        self.u32(len(data))
        self.buf += data

    def raw(self, data: bytes):
        self.buf += data


def executable_to_bytes(exe: Executable, embed_library: bool = False) -> bytes:
    """The executable in the binary format (magic, version, sections, SHA-256 checksum).

    Target "c": the kernel library's C text (``CLIB``) and, when the library can be described, how to call
    it without the compiler (``KABI``); ``embed_library`` also puts the shared library's bytes in the file
    (``KLIB``; docs/deploy.md says when a loader uses them)."""
    _check_names(exe)
    sections = {
        b"GLOB": _write_globals(exe), b"ADTS": _write_adts(exe), b"CNST": _write_constants(exe),
        b"PRIM": _write_primitives(exe), b"CODE": _write_code(exe),
    }
    w = _Writer()
    w.raw(MAGIC)
    w.u32(FORMAT_VERSION)
    w.u32(0)  # flags, reserved
    w.str(exe.exec_mode)
    w.str(exe.target)
    if any(adt.field_types is not None for adt in exe.adts):
        sections[b"ATYP"] = _write_adt_types(exe)
    if exe.target == "c":
        sections[b"CLIB"] = _write_c_library(exe)
        if exe.c_library is not None and exe.c_library.abi_payload is not None:
            sections[b"KABI"] = exe.c_library.abi_payload
            if embed_library:
                sections[b"KLIB"] = _library_bytes(exe.c_library)
        elif embed_library and exe.c_library is not None and exe.c_library.source:
            # (an executable without kernels or native code has no library: nothing to embed)
            raise UnsupportedError(f"cannot embed the kernel library: {exe.c_library.abi_missing or 'it is not described'}")
    elif embed_library:
        raise UnsupportedError(f"embed_library needs target 'c', the executable's is {exe.target!r}")
    for tag in SECTIONS + OPTIONAL_SECTIONS:
        if tag not in sections:
            continue
        payload = sections[tag]
        w.raw(tag)
        w.u64(len(payload))
        w.raw(payload)
    w.raw(hashlib.sha256(w.buf).digest())
    return bytes(w.buf)


def program_digest(exe) -> str:
    """SHA-256 of the program as its file holds it (the GLOB, ADTS, CNST, PRIM and CODE sections, and ATYP
    when present): native mode's C names it, so a prebuilt native library runs only the program it was
    generated from (``kernel_abi.prebuilt_library``)."""
    digest = hashlib.sha256()
    writers = [_write_globals, _write_adts, _write_constants, _write_primitives, _write_code]
    if any(adt.field_types is not None for adt in exe.adts):
        writers.append(_write_adt_types)
    for write in writers:
        payload = write(exe)
        digest.update(len(payload).to_bytes(8, "little"))
        digest.update(payload)
    return digest.hexdigest()


def _check_names(exe) -> None:
    """Refuse to write a name the loader would reject (``NAME``), rather than write an unloadable file."""
    names = [("function", fn.name) for fn in exe.functions]
    names += [("parameter", p) for fn in exe.functions for p in fn.params]
    names += [("kernel", p.name) for p in exe.primitives] + [("primitive function", p.source) for p in exe.primitives]
    names += [("ADT", a.name) for a in exe.adts] + [("constructor", c) for a in exe.adts for c, _ in a.constructors]
    names += [("type variable", v) for a in exe.adts for v in a.type_vars]
    for what, name in names:
        if len(name) > MAX_NAME_LENGTH or not NAME.fullmatch(name):
            raise UnsupportedError(f"cannot save the executable: {what} name {name!r} is not a name the format "
                                   f"holds (letters, digits and underscores, dotted; at most {MAX_NAME_LENGTH} "
                                   f"characters)")


def _write_globals(exe) -> bytes:
    w = _Writer()
    w.u32(len(exe.functions))
    for fn in exe.functions:
        w.str(fn.name)
        w.u32(len(fn.params))
        types = fn.param_types or (None,) * len(fn.params)
        for name, ty in zip(fn.params, types):
            w.str(name)
            w.str(type_to_text(ty))
        w.str(type_to_text(fn.ret_type))
    return bytes(w.buf)


def _write_adts(exe) -> bytes:
    w = _Writer()
    w.u32(len(exe.adts))
    for adt in exe.adts:
        w.str(adt.name)
        w.u32(len(adt.constructors))
        for name, arity in adt.constructors:
            w.str(name)
            w.u32(arity)
    return bytes(w.buf)


def _write_adt_types(exe) -> bytes:
    """Per ADT of ``ADTS`` (same order): a u8 flag (1: types known), then the type variables' names and,
    per constructor, its field types as text."""
    w = _Writer()
    for adt in exe.adts:
        w.u8(adt.field_types is not None)
        if adt.field_types is None:
            continue
        w.u32(len(adt.type_vars))
        for name in adt.type_vars:
            w.str(name)
        for fields in adt.field_types:
            for text in fields:
                w.str(text)
    return bytes(w.buf)


def _write_constants(exe) -> bytes:
    w = _Writer()
    w.u32(len(exe.constants))
    for c in exe.constants:
        w.str(c.dtype.name)
        w.u32(c.ndim)
        w.i64s(c.shape)
        data = c.astype(c.dtype.newbyteorder("<"), copy=False).tobytes(order="C")
        w.u64(len(data))
        w.raw(data)
    return bytes(w.buf)


def _write_primitives(exe) -> bytes:
    w = _Writer()
    sources = list(dict.fromkeys(p.source for p in exe.primitives))
    w.u32(len(sources))
    for name in sources:
        w.str(name)
        w.str(exe.primitive_text(name))
    w.u32(len(exe.primitives))
    for p in exe.primitives:
        w.str(p.name)
        w.u8(_KIND_CODES[p.kind])
        w.str(p.source)
        w.u32(len(p.is_input))
        for flag in p.is_input:
            w.u8(int(flag))
        w.i32(-1 if p.num_inputs is None else p.num_inputs)
        w.i32(-1 if p.num_outputs is None else p.num_outputs)
    return bytes(w.buf)


def _write_c_library(exe) -> bytes:
    exe.kernels  # noqa: B018 - the library (and its source) is built with the kernels
    w = _Writer()
    w.str(exe.c_library.source if exe.c_library is not None else "")
    return bytes(w.buf)


def _library_bytes(library) -> bytes:
    """The shared library's bytes, checked against the manifest (the file on disk may have changed)."""
    try:
        with open(library.library_path, "rb") as f:
            data = f.read()
    except (OSError, TypeError) as err:
        raise UnsupportedError(f"cannot embed the kernel library {library.library_path}: {err}") from None
    if hashlib.sha256(data).hexdigest() != library.abi.manifest.library_sha256:
        raise UnsupportedError(f"cannot embed the kernel library {library.library_path}: its bytes changed since "
                               f"it was built")
    return data


def encode_abi(abi) -> bytes:
    """A ``kernel_abi.LibraryABI`` in the ``KABI`` section's layout (docs/executable-format.md)."""
    w = _Writer()
    m = abi.manifest
    for text in (m.c_sha256, m.compiler, m.version):
        w.str(text)
    w.u32(len(m.flags))
    for flag in m.flags:
        w.str(flag)
    w.str(m.triple)
    w.u32(len(m.features))
    for feature in m.features:
        w.str(feature)
    w.str(m.library_sha256)
    w.u64(m.library_size)
    w.u32(len(abi.kernels))
    for k in abi.kernels.values():
        w.str(k.primitive)
        w.str(k.symbol)
        w.u32(k.num_inputs)
        w.u32(len(k.buffers))
        for dtype, rank, static in k.buffers:
            w.str(dtype)
            w.u32(rank)
            w.u32(len(static))
            for axis, size in static:
                w.u32(axis)
                w.i64s([size])
        w.buf += _write_constants(SimpleNamespace(constants=[np.asarray(c, order="C") for c in k.constants]))
        w.u32(len(k.errors))
        for code, message, runtime in k.errors:
            w.i32(code)
            w.str(message)
            w.u8(int(runtime))
    w.u32(len(abi.shape_funcs))
    for name, spec in abi.shape_funcs.items():
        w.str(name)
        w.str(spec.name)
        w.u32(len(spec.messages))
        for message in spec.messages:
            w.str(message)
        deferred = sorted(spec.deferred)
        w.u32(len(deferred))
        for k in deferred:
            w.u32(k)
        w.u32(len(spec.flat_is_input))
        for flag, rank, dtype in zip(spec.flat_is_input, spec.in_ranks, spec.in_dtypes, strict=True):
            w.u8(int(flag))
            w.u32(rank)
            w.str(dtype)
        w.u32(len(spec.out_ranks))
        for rank in spec.out_ranks:
            w.u32(rank)
        w.str(spec.label)
    return bytes(w.buf)


def decode_abi(payload: bytes):
    """Read a ``KABI`` section (every count bounded by the bytes, names and hashes checked)."""
    from .kernel_abi import KernelABI, LibraryABI, LibraryManifest, ShapeFuncC

    r = _Reader(payload, "KABI section")

    def sha(what):
        text = r.str()
        if not _SHA256.fullmatch(text):
            raise FormatError(f"KABI section: bad {what} {text[:80]!r}: expected 64 hex digits")
        return text

    def rank():
        value = r.u32()
        if value > MAX_RANK:
            raise FormatError(f"KABI section: rank {value} is larger than {MAX_RANK}")
        return value

    def symbol():
        text = r.str()
        if not _SYMBOL.fullmatch(text):
            raise FormatError(f"KABI section: bad C symbol {text[:80]!r}")
        return text

    def dtype():
        text = r.str()
        if text not in DTYPES:
            raise FormatError(f"KABI section: unknown dtype {text!r}")
        return text

    c_sha256, compiler, version = sha("C source hash"), r.str(), r.str()
    flags = tuple(r.str() for _ in range(r.count(4, "flag")))
    triple = r.str()
    features = tuple(r.name("CPU feature") for _ in range(r.count(4, "CPU feature")))
    manifest = LibraryManifest(c_sha256, compiler, version, flags, triple, features, sha("library hash"), r.u64())
    kernels = {}
    for _ in range(r.count(16, "kernel")):
        primitive, sym = r.name("primitive function"), symbol()
        num_inputs = r.u32()
        buffers = []
        for _ in range(r.count(12, "buffer")):
            dt, rk = dtype(), rank()
            static = tuple((r.u32(), r.i64s(1)[0]) for _ in range(r.count(12, "static dim")))
            if len({a for a, _ in static}) != len(static) or any(a >= rk or v < 0 for a, v in static):
                raise FormatError(f"KABI section: kernel {sym}: bad static dims {static} of a rank-{rk} buffer")
            buffers.append((dt, rk, static))
        constants = tuple(_read_constants(_Reader(bytes(_constants_span(r)), "KABI constants")))
        errors = tuple((r.i32(), r.str(), bool(r.u8())) for _ in range(r.count(9, "error")))
        if not len(constants) <= num_inputs <= len(buffers) or primitive in kernels:
            raise FormatError(f"KABI section: kernel {sym}: {num_inputs} inputs, {len(constants)} constants and "
                              f"{len(buffers)} buffers do not fit (or its primitive is described twice)")
        for j, c in enumerate(constants):
            dt, rk, static = buffers[num_inputs - len(constants) + j]
            if c.dtype.name != dt or c.ndim != rk or any(c.shape[a] != v for a, v in static):
                raise FormatError(f"KABI section: kernel {sym}: constant {j} does not fit its buffer")
        kernels[primitive] = KernelABI(primitive, sym, num_inputs, tuple(buffers), constants, errors)
    shape_funcs = {}
    for _ in range(r.count(28, "shape function")):
        name, sym = r.name("kernel"), symbol()
        messages = tuple(r.str() for _ in range(r.count(4, "message")))
        deferred = frozenset(r.u32() for _ in range(r.count(4, "deferred message")))
        inputs = [(bool(r.u8()), rank(), dtype()) for _ in range(r.count(9, "shape function input"))]
        out_ranks = tuple(rank() for _ in range(r.count(4, "shape function output")))
        label = r.str()
        if any(k >= len(messages) for k in deferred) or name in shape_funcs:
            raise FormatError(f"KABI section: shape function {sym}: a deferred message index is out of range "
                              f"(or it is described twice)")
        shape_funcs[name] = ShapeFuncC(sym, "", messages, deferred, tuple(f for f, _, _ in inputs),
                                       tuple(rk for _, rk, _ in inputs), tuple(d for _, _, d in inputs), out_ranks,
                                       label)
    r.done()
    return LibraryABI(manifest, kernels, shape_funcs)


def _constants_span(r: _Reader) -> memoryview:
    """The bytes of one constant table (the ``CNST`` layout) at the reader's position, consumed."""
    start = r.pos
    for _ in range(r.count(16, "constant")):
        r.take(r.u32())  # dtype
        r.take(8 * min(r.u32(), MAX_RANK + 1))  # rank, dims (checked again by _read_constants)
        r.take(r.u64())
    return r.data[start:r.pos]


def _write_code(exe) -> bytes:
    w = _Writer()
    w.u32(len(exe.functions))
    for fn in exe.functions:
        w.str(fn.name)
        w.u32(fn.register_file_size)
        w.u32(len(fn.instructions))
        for ins in fn.instructions:
            words = ins.to_words()
            w.u32(len(words))
            w.i64s(words)
    return bytes(w.buf)


# --- reading --------------------------------------------------------------------------------------
class _Reader:
    """Bounds-checked little-endian reads over bytes; every failure is a ``FormatError``."""

    def __init__(self, data: bytes, what: str):
        self.data, self.pos, self.what = memoryview(data), 0, what

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int) -> memoryview:
        if n < 0 or n > self.remaining():
            raise FormatError(f"{self.what}: truncated (needed {n} bytes at offset {self.pos}, "
                              f"{self.remaining()} left)")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def i32(self) -> int:
        return struct.unpack("<i", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def count(self, min_item_bytes: int, what: str) -> int:
        """A u32 element count that the remaining bytes can actually hold."""
        n = self.u32()
        if n * min_item_bytes > self.remaining():
            raise FormatError(f"{self.what}: {what} count {n} does not fit in the {self.remaining()} bytes left")
        return n

    def i64s(self, n: int) -> list[int]:
        return np.frombuffer(self.take(8 * n), dtype="<i8").tolist()

    def str(self) -> str:
        n = self.u32()
        try:
            return bytes(self.take(n)).decode("utf-8")
        except UnicodeDecodeError as err:
            raise FormatError(f"{self.what}: invalid UTF-8 in a string ({err})") from None

    def name(self, what: str) -> str:
        """A string that must be a name (``NAME``): never code, never a line break or a quote."""
        text = self.str()
        if len(text) > MAX_NAME_LENGTH or not NAME.fullmatch(text):
            raise FormatError(f"{self.what}: bad {what} name {text[:80]!r}: expected letters, digits and "
                              f"underscores (dotted), at most {MAX_NAME_LENGTH} characters")
        return text

    def done(self) -> None:
        if self.remaining():
            raise FormatError(f"{self.what}: {self.remaining()} unexpected trailing bytes")


def load_executable(path_or_bytes, trust_library: bool = False) -> Executable:
    """Read an executable saved by ``Executable.save``/``save_bytes`` (a path, bytes or a file object).

    Target "c": a prebuilt kernel library is used, without importing the compiler, when the kernel cache
    holds the one a local build made from the file's C text and calling description, or, with
    ``trust_library=True`` only, when the file embeds one; else the library is rebuilt from the file's
    primitive functions (``exe.stats()["kernel_library"]["load_reason"]`` says why). docs/deploy.md."""
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        data = bytes(path_or_bytes)
    elif hasattr(path_or_bytes, "read"):
        data = path_or_bytes.read()
    else:
        try:
            with open(path_or_bytes, "rb") as f:
                data = f.read()
        except OSError as err:
            raise FormatError(f"cannot read executable {path_or_bytes!r}: {err}") from None
    return _parse(data, trust_library)


def _parse(data: bytes, trust_library: bool = False) -> Executable:
    if len(data) < len(MAGIC) + 8 + _CHECKSUM_SIZE:
        raise FormatError(f"not a tensorvm executable: only {len(data)} bytes")
    if data[:len(MAGIC)] != MAGIC:
        raise FormatError(f"not a tensorvm executable: bad magic number {data[:len(MAGIC)]!r}")
    version = struct.unpack_from("<I", data, len(MAGIC))[0]
    if version not in READABLE_VERSIONS:
        raise FormatError(f"unsupported executable format version {version}; this tensorvm reads versions "
                          f"{', '.join(map(str, READABLE_VERSIONS))}")
    body, checksum = data[:-_CHECKSUM_SIZE], data[-_CHECKSUM_SIZE:]
    if hashlib.sha256(body).digest() != checksum:
        raise FormatError("executable checksum mismatch: the file is corrupted or truncated")
    r = _Reader(body, "executable header")
    r.take(len(MAGIC) + 4)
    flags = r.u32()
    if flags != 0:
        raise FormatError(f"unknown header flags {flags:#x}")
    exec_mode, target = r.str(), r.str()
    if exec_mode not in EXEC_MODES:
        raise FormatError(f"unknown exec mode {exec_mode!r}; expected one of {EXEC_MODES}")
    if target not in TARGETS:
        raise FormatError(f"unknown target {target!r}; expected one of {TARGETS}")
    sections = {}
    for tag in SECTIONS:
        got = bytes(r.take(4))
        if got != tag:
            raise FormatError(f"expected section {tag.decode()} at offset {r.pos - 4}, found {got!r}")
        sections[tag] = bytes(r.take(r.u64()))
    while version >= 2 and r.remaining():  # optional sections, each at most once, in their order
        tag = bytes(r.take(4))
        if tag not in OPTIONAL_SECTIONS or version < _FIRST_VERSION[tag]:
            raise FormatError(f"unknown section {tag!r} at offset {r.pos - 4} (format version {version})")
        if tag in sections or any(t in sections for t in OPTIONAL_SECTIONS[OPTIONAL_SECTIONS.index(tag) + 1:]):
            raise FormatError(f"section {tag.decode()} is repeated or out of order")
        sections[tag] = bytes(r.take(r.u64()))
    r.done()
    saved_c_source = None
    if b"CLIB" in sections:
        if target != "c":
            raise FormatError(f"a CLIB section in an executable for target {target!r}")
        clib = _Reader(sections[b"CLIB"], "CLIB section")
        saved_c_source = clib.str()
        clib.done()

    adts = _read_adts(_Reader(sections[b"ADTS"], "ADTS section"))
    if b"ATYP" in sections:
        adts = _read_adt_types(_Reader(sections[b"ATYP"], "ATYP section"), adts)
    adt_names = {a.name for a in adts}
    globals_ = _read_globals(_Reader(sections[b"GLOB"], "GLOB section"), adt_names)
    constants = _read_constants(_Reader(sections[b"CNST"], "CNST section"))
    prim_texts, primitives = _read_primitives(_Reader(sections[b"PRIM"], "PRIM section"))
    functions = _read_code(_Reader(sections[b"CODE"], "CODE section"), globals_)
    try:
        exe = Executable(functions, constants, primitives, prim_texts, adts, exec_mode, target)
    except ValueError as err:
        raise FormatError(f"inconsistent executable: {err}") from None
    exe.verify(from_file=True)
    reason, missing = "", ()
    if b"KLIB" in sections and b"KABI" not in sections:
        raise FormatError("a KLIB section without its KABI section")
    if b"KABI" in sections:
        if saved_c_source is None:
            raise FormatError("a KABI section without the CLIB section it describes")
        from .kernel_abi import prebuilt_library

        abi = decode_abi(sections[b"KABI"])
        embedded = sections.get(b"KLIB")
        if embedded is not None and (len(embedded) > MAX_LIBRARY_BYTES or len(embedded) != abi.manifest.library_size
                                     or hashlib.sha256(embedded).hexdigest() != abi.manifest.library_sha256):
            raise FormatError(f"KLIB section: {len(embedded)} bytes that are not the library the manifest names "
                              f"({abi.manifest.library_size} bytes, at most {MAX_LIBRARY_BYTES})")
        kernels, library, reason, missing = prebuilt_library(exe, abi, sections[b"KABI"], saved_c_source, embedded,
                                                             trust_library)
        if kernels is not None:
            exe.c_library, exe._kernels = library, kernels
            return exe
    elif target == "c":
        reason = "the file does not describe a prebuilt library (no KABI section)"
    try:
        exe.kernels  # noqa: B018 - rebuild the kernels now, so a bad primitive fails at load time
    except UnsupportedError as err:
        if missing:
            raise UnsupportedError(f"the executable's kernel library was built for CPU features this CPU lacks "
                                   f"({', '.join(missing)}), and it cannot be rebuilt here: {err}") from err
        raise
    if exe.c_library is not None:
        exe.c_library.saved_source_matches = None if saved_c_source is None else \
            saved_c_source == exe.c_library.source
        exe.c_library.load_reason = f"rebuilt by the compiler: {reason}" if reason else "rebuilt by the compiler"
    return exe


def _read_globals(r: _Reader, adt_names) -> list:
    out = []
    for _ in range(r.count(12, "function")):
        name = r.name("function")
        params, types = [], []
        for _ in range(r.count(8, "parameter")):
            params.append(r.name("parameter"))
            types.append(text_to_type(r.str(), adt_names))
        ret = text_to_type(r.str(), adt_names)
        out.append((name, tuple(params), tuple(types), ret))
    r.done()
    return out


def _read_adts(r: _Reader) -> list:
    adts = []
    for _ in range(r.count(8, "ADT")):
        name = r.name("ADT")
        ctors = []
        for _ in range(r.count(8, "constructor")):
            ctors.append((r.name("constructor"), r.u32()))
        adts.append(AdtInfo(name, tuple(ctors)))
    r.done()
    if len({a.name for a in adts}) != len(adts):
        raise FormatError("ADTS section: an ADT name appears twice")
    names = [c for a in adts for c, _ in a.constructors]
    if len(set(names)) != len(names):
        raise FormatError("ADTS section: a constructor name appears twice")
    return adts


def _read_adt_types(r: _Reader, adts: list) -> list:
    names = [a.name for a in adts]
    out = []
    for adt in adts:
        if not r.u8():
            out.append(adt)
            continue
        type_vars = tuple(r.name("type variable") for _ in range(r.count(4, "type variable")))
        if len(set(type_vars)) != len(type_vars) or set(type_vars) & set(names):
            raise FormatError(f"ATYP section: bad type variables {type_vars} of {adt.name}")
        shared: dict = {}
        fields = []
        for _, arity in adt.constructors:
            texts = tuple(r.str() for _ in range(arity))
            for text in texts:  # parsed now, so a bad type is a FormatError at load time
                text_to_type(text, names, shared)
            fields.append(texts)
        if set(shared) - set(type_vars):
            raise FormatError(f"ATYP section: the fields of {adt.name} use undeclared type variables "
                              f"{sorted(set(shared) - set(type_vars))}")
        out.append(AdtInfo(adt.name, adt.constructors, type_vars, tuple(fields)))
    r.done()
    return out


def _read_constants(r: _Reader) -> list:
    out = []
    for i in range(r.count(16, "constant")):
        dtype = r.str()
        if dtype not in DTYPES:
            raise FormatError(f"constant {i}: unknown dtype {dtype!r}")
        ndim = r.u32()
        if ndim > 32:
            raise FormatError(f"constant {i}: rank {ndim} is too large")
        shape = r.i64s(ndim)
        if any(d < 0 for d in shape):
            raise FormatError(f"constant {i}: negative dimension in {shape}")
        nbytes = r.u64()
        # Zero-size constants may have any other dims: bound them all, so that no shape NumPy cannot
        # represent (or later code cannot multiply out) gets through.
        if math.prod(max(d, 1) for d in shape) * np.dtype(dtype).itemsize >= 1 << 62:
            raise FormatError(f"constant {i}: shape {shape} is too large")
        expected = math.prod(shape) * np.dtype(dtype).itemsize
        if nbytes != expected:
            raise FormatError(f"constant {i}: {nbytes} data bytes, but a {dtype} tensor of shape {shape} "
                              f"needs {expected}")
        arr = np.frombuffer(r.take(nbytes), dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)
        arr = arr.reshape(shape)
        arr.setflags(write=False)
        out.append(arr)
    r.done()
    return out


def _read_primitives(r: _Reader):
    texts = {}
    for _ in range(r.count(8, "primitive function")):
        name = r.name("primitive function")
        if name in texts:
            raise FormatError(f"PRIM section: primitive function {name!r} appears twice")
        texts[name] = r.str()
    kernels = []
    kinds = {v: k for k, v in _KIND_CODES.items()}
    for _ in range(r.count(21, "kernel")):
        name = r.name("kernel")
        kind = kinds.get(r.u8())
        if kind is None:
            raise FormatError(f"kernel {name!r}: unknown kind")
        source = r.name("primitive function")
        if source not in texts:
            raise FormatError(f"kernel {name!r} names primitive function {source!r}, which the file lacks")
        flags = [r.u8() for _ in range(r.count(1, "is_input flag"))]
        if any(f > 1 for f in flags):
            raise FormatError(f"kernel {name!r}: is_input flags must be 0 or 1")
        num_inputs, num_outputs = r.i32(), r.i32()
        if num_inputs < -1 or num_outputs < -1:
            raise FormatError(f"kernel {name!r}: bad input/output counts")
        kernels.append(PrimitiveInfo(name, kind, source, tuple(bool(f) for f in flags),
                                     None if num_inputs < 0 else num_inputs, None if num_outputs < 0 else num_outputs))
    r.done()
    return texts, kernels


def _read_code(r: _Reader, globals_) -> list:
    n = r.count(12, "function")
    if n != len(globals_):
        raise FormatError(f"CODE section has {n} functions, GLOB section {len(globals_)}")
    functions = []
    for name, params, types, ret in globals_:
        got = r.name("function")
        if got != name:
            raise FormatError(f"CODE section: function {got!r} where GLOB section has {name!r}")
        size = r.u32()
        count = r.count(12, "instruction")
        instructions = []
        for _ in range(count):
            nwords = r.count(8, "instruction word")
            if nwords == 0:
                raise FormatError(f"function {name!r}: empty instruction")
            instructions.append(bc.decode_instruction(r.i64s(nwords)))
        functions.append(bc.VMFunction(name, params, tuple(instructions), size, types, ret))
    r.done()
    return functions
