"""The text-format parser: a hand-written lexer and recursive-descent parser for Relay's syntax.

Accepts what ``tensorvm.ir.printer`` writes and what TVM prints: the version header, ``type``
definitions, ``def``s, graph bindings ``%0 = e;`` (a later ``%0`` is the same node, so sharing
survives), ``let``, ``if``, ``fn``, ``match``/``match?``, tuples and ``.N`` projections, calls of
ops, globals, closures and constructors with ``name=value`` attributes, infix operators (``%a + %b`` is
``add(%a, %b)``, with Relay's precedence), literals with dtype
suffixes, ``meta[relay.Constant][i]`` with the ``#[metadata]`` JSON section, references, comments
and types with ``?`` and symbolic dims. Globals, types and constructors may be used before they are
defined. Every node carries a ``Span``; every error is a ``ParseError`` saying what was expected and
what was found, with line and column.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import ParseError
from .expr import (
    Call,
    Clause,
    Constant,
    Constructor,
    Expr,
    Function,
    GlobalVar,
    If,
    Let,
    Match,
    Op,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    PatternWildcard,
    RefCreate,
    RefRead,
    RefWrite,
    Span,
    Tuple,
    TupleGetItem,
    Var,
)
from .module import IRModule
from .types import (
    DTYPES,
    Any,
    FuncType,
    GlobalTypeVar,
    IncompleteType,
    RefType,
    SymDim,
    TensorType,
    TupleType,
    TypeCall,
    TypeData,
    TypeVar,
    nested_types,
)

__all__ = ["parse_module", "parse_expr", "parse_type", "tokenize", "Token"]

# Literal suffix -> dtype (``1`` is int32, ``1.5`` and ``1f`` are float32).
_SUFFIX_DTYPE = {
    "f": "float32", "f16": "float16", "f32": "float32", "f64": "float64",
    "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
}


# --------------------------------------------------------------------------------------------
# Lexer
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # PUNCT, LOCAL, GLOBAL, IDENT, NUMBER, STRING, VERSION, METADATA, EOF
    text: str
    line: int
    column: int
    value: object = None  # NUMBER: (python value, dtype or None if unsuffixed int, is_float); STRING: str

    def describe(self) -> str:
        if self.kind == "EOF":
            return "end of input"
        if self.kind == "METADATA":
            return "'#[metadata]'"
        if self.kind in ("LOCAL", "GLOBAL"):
            return repr(("%" if self.kind == "LOCAL" else "@") + self.text)
        return repr(self.text)


# re.ASCII: \d must not match other scripts' digits (int() would read "1٣" as 13).
# Longest first: "->" before "-", "==" and "=>" before "=".
_PUNCT = ["->", "=>", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ",", ";", ":", "=", ".", "?",
          "+", "-", "*", "/", "<", ">"]
# Relay's infix operators: the op each calls and its precedence (higher binds tighter); all are
# left-associative, as in TVM's parser. There is no ``%`` and no unary minus (``-`` right before a
# number is part of the literal).
_BINARY_OPS = {
    "*": ("multiply", 4), "/": ("divide", 4),
    "+": ("add", 3), "-": ("subtract", 3),
    "<": ("less", 2), "<=": ("less_equal", 2), ">": ("greater", 2), ">=": ("greater_equal", 2),
    "==": ("equal", 1), "!=": ("not_equal", 1),
}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*", re.ASCII)
_NAME = re.compile(r"[A-Za-z0-9_]+", re.ASCII)
_NUMBER = re.compile(r"-?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+)([A-Za-z_][A-Za-z0-9_]*)?", re.ASCII)
_INT = re.compile(r"\d+", re.ASCII)
_SPECIAL_FLOAT = re.compile(r"-?(?:inf|nan)(f16|f32|f64|f)?(?![A-Za-z0-9_.])", re.ASCII)
_DIRECTIVE = re.compile(r"#\[\s*(version\s*=\s*\"[^\"]*\"|metadata)\s*\]")
_DIGITS = frozenset("0123456789")
_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
# No dtype holds an integer of more digits (uint64 has 20); Python refuses to convert > 4300.
_MAX_INT_DIGITS = 40
# How deeply expressions, types, patterns and attribute lists may nest (each level is a few Python
# frames here and in every pass after); sequences of bindings and chains of infix operators do not
# nest (``let``/``%0 =`` chains and ``%a + %b + ...`` of any length are read iteratively).
MAX_NESTING = 500


def _number_value(text: str, line: int, column: int, source_name: str) -> tuple:
    """``(value, dtype, is_float)`` of a numeric literal; ``dtype`` is None for an unsuffixed integer."""
    special = _SPECIAL_FLOAT.fullmatch(text)
    if special:
        suffix = special.group(1)
        return float(text[: len(text) - len(suffix or "")]), _SUFFIX_DTYPE[suffix] if suffix else "float32", True
    suffix = _NUMBER.fullmatch(text).group(1) or ""
    body = text[: len(text) - len(suffix)]
    is_float = any(ch in body for ch in ".eE")
    if suffix and suffix not in _SUFFIX_DTYPE:
        raise ParseError(f"bad literal suffix {suffix!r} in {text!r}; expected one of "
                         f"{', '.join(sorted(_SUFFIX_DTYPE))}", line, column, source_name)
    dtype = _SUFFIX_DTYPE.get(suffix)
    if is_float and dtype is not None and not dtype.startswith("float"):
        raise ParseError(f"bad literal {text!r}: a number with a fraction or exponent cannot have the integer "
                         f"suffix {suffix!r}", line, column, source_name)
    if is_float or (dtype or "").startswith("float"):
        value = float(body)
        if value in (float("inf"), float("-inf")):  # (a number too large for any float: not the inf literal)
            raise ParseError(f"literal {text!r} is out of range for {dtype or 'float32'}", line, column, source_name)
        return value, dtype or "float32", True
    if len(body.lstrip("-0")) > _MAX_INT_DIGITS:
        raise ParseError(f"integer literal of {len(body.lstrip('-'))} digits is out of range: expected at most "
                         f"{_MAX_INT_DIGITS} digits", line, column, source_name)
    return int(body), dtype, False


_MAX_DIM = 2**63 - 1  # (a dim is an int64 in every executor)


def _ends_operand(tok: Token) -> bool:
    """Whether ``tok`` may end an operand, so that a ``-`` right after it is a binary minus."""
    if tok.kind == "IDENT":
        return tok.text not in _KEYWORDS or tok.text in ("True", "False")
    return tok.kind in ("LOCAL", "GLOBAL", "NUMBER") or (tok.kind == "PUNCT" and tok.text in (")", "]"))


def tokenize(text: str, source_name: str = "<string>") -> list[Token]:
    """Split ``text`` into tokens; comments and whitespace are dropped."""
    tokens: list[Token] = []
    pos, line, line_start, n = 0, 1, 0, len(text)

    def error(message: str, at: int):
        raise ParseError(message, line, at - line_start + 1, source_name)

    while pos < n:
        ch = text[pos]
        if ch == "\n":
            pos += 1
            line, line_start = line + 1, pos
            continue
        if ch in " \t\r\f":
            pos += 1
            continue
        column = pos - line_start + 1
        if text.startswith("//", pos):
            end = text.find("\n", pos)
            pos = n if end < 0 else end
            continue
        if text.startswith("/*", pos):
            depth, start_line, start_col = 0, line, column
            while True:
                if pos >= n:
                    raise ParseError("unterminated comment: expected '*/' but found end of input",
                                     start_line, start_col, source_name)
                if text.startswith("/*", pos):
                    depth, pos = depth + 1, pos + 2
                elif text.startswith("*/", pos):
                    depth, pos = depth - 1, pos + 2
                    if depth == 0:
                        break
                else:
                    if text[pos] == "\n":
                        line, line_start = line + 1, pos + 1
                    pos += 1
            continue
        if ch == "#":
            m = _DIRECTIVE.match(text, pos)
            if not m:
                error("expected '#[version = \"...\"]' or '#[metadata]' after '#'", pos)
            if m.group(1) == "metadata":
                tokens.append(Token("METADATA", text[m.end():], line, column))
                pos = n
                break
            tokens.append(Token("VERSION", m.group(0), line, column))
            pos = m.end()
            continue
        if ch == '"':
            end = pos + 1
            while True:
                if end >= n or text[end] == "\n":
                    error("unterminated string: expected '\"' but found end of line", pos)
                if text[end] == "\\" and end + 1 < n:
                    end += 2
                    continue
                if text[end] == '"':
                    break
                end += 1
            raw = text[pos:end + 1]
            try:
                value = json.loads(raw)
            except json.JSONDecodeError:
                error(f"bad string literal {raw}", pos)
            tokens.append(Token("STRING", raw, line, column, value))
            pos = end + 1
            continue
        if ch in "%@":
            m = _NAME.match(text, pos + 1)
            if not m:
                error(f"expected a name after {ch!r} but found {text[pos + 1:pos + 2]!r}" if pos + 1 < n
                      else f"expected a name after {ch!r} but found end of input", pos)
            tokens.append(Token("LOCAL" if ch == "%" else "GLOBAL", m.group(0), line, column))
            pos = m.end()
            continue
        after_dot = bool(tokens) and tokens[-1].kind == "PUNCT" and tokens[-1].text == "."
        # (ASCII tests: str.isdigit/isalpha accept other scripts' letters and digits, which the
        # regular expressions below do not match.)
        # A run of '-' right before a number belongs to the literal, an odd run negating it (``--10`` is
        # 10, as in TVM); right after an operand, '-' subtracts instead (``%x-1``).
        literal_at = pos if ch in _DIGITS else None
        if ch == "-" and not (tokens and _ends_operand(tokens[-1])):
            end = pos
            while end < n and text[end] == "-":
                end += 1
            if end < n and (text[end] in _DIGITS or text[end] in "in"):
                literal_at = end - 1 if (end - pos) % 2 else end
        if literal_at is not None:
            if after_dot and ch in _DIGITS:  # a projection: %t.0.1 is two projections, not a float
                m = _INT.match(text, pos)
                tokens.append(Token("NUMBER", m.group(0), line, column, (int(m.group(0)), None, False)))
                pos = m.end()
                continue
            m = _SPECIAL_FLOAT.match(text, literal_at) if ch == "-" else None
            m = m or _NUMBER.match(text, literal_at)
            if m:
                tokens.append(Token("NUMBER", text[pos:m.end()], line, column,
                                    _number_value(m.group(0), line, column, source_name)))
                pos = m.end()
                continue
        if ch in _LETTERS:
            m = _SPECIAL_FLOAT.match(text, pos)
            if m:
                tokens.append(Token("NUMBER", m.group(0), line, column,
                                    _number_value(m.group(0), line, column, source_name)))
                pos = m.end()
                continue
            m = _IDENT.match(text, pos)
            tokens.append(Token("IDENT", m.group(0), line, column))
            pos = m.end()
            continue
        for p in _PUNCT:
            if text.startswith(p, pos):
                tokens.append(Token("PUNCT", p, line, column))
                pos += len(p)
                break
        else:
            error(f"unexpected character {ch!r}", pos)
    tokens.append(Token("EOF", "", line, pos - line_start + 1))
    return tokens


# --------------------------------------------------------------------------------------------
# Metadata
# --------------------------------------------------------------------------------------------

def _array_from_meta(value) -> np.ndarray:
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        value = value.numpy()
    return np.asarray(value)


def normalize_meta(meta) -> list | None:
    """``meta`` given by the caller: a list of arrays or ``{"relay.Constant": [...]}``."""
    if meta is None:
        return None
    if isinstance(meta, dict):
        unknown = [k for k in meta if k not in ("relay.Constant", "Constant")]
        if unknown:
            raise ParseError(f"meta: unsupported kind(s) {unknown}; expected 'relay.Constant'")
        meta = meta.get("relay.Constant", meta.get("Constant", []))
    return [_array_from_meta(v) for v in meta]


def _decode_metadata(token: Token, source_name: str) -> list[np.ndarray]:
    def fail(message: str):
        raise ParseError(f"bad #[metadata] section: {message}", token.line, token.column, source_name)

    text = token.text.strip()
    if not text:
        return []
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        fail(f"expected a JSON object but the JSON is invalid ({err})")
    if not isinstance(doc, dict):
        fail(f"expected a JSON object but found {type(doc).__name__}")
    if "nodes" in doc and "b64ndarrays" in doc:
        return _decode_tvm_metadata(doc, fail)
    entries = doc.get("relay.Constant", [])
    if not isinstance(entries, list):
        fail("expected 'relay.Constant' to be a list")
    arrays = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not {"dtype", "shape", "data"} <= set(entry):
            fail(f"constant {i}: expected an object with 'dtype', 'shape' and 'data'")
        dtype, shape, data = entry["dtype"], entry["shape"], entry["data"]
        if dtype not in DTYPES:
            fail(f"constant {i}: unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            fail(f"constant {i}: expected a shape of non-negative integers but found {shape!r}")
        try:
            raw = base64.b64decode(data, validate=True) if isinstance(data, str) else None
        except (binascii.Error, ValueError):
            raw = None
        if raw is None:
            fail(f"constant {i}: expected base64 data")
        np_dtype = np.dtype(dtype).newbyteorder("<")
        expected = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
        if len(raw) != expected:
            fail(f"constant {i}: expected {expected} bytes of data for {dtype}{shape} but found {len(raw)}")
        arrays.append(np.frombuffer(raw, dtype=np_dtype).reshape(shape).astype(np.dtype(dtype)))
    return arrays


# TVM prints its metadata as a serialized object graph: "nodes" (the root a Map whose "relay.Constant"
# entry is an Array of relay.Constant nodes, each naming its tensor by index in "b64ndarrays") and
# "b64ndarrays" (tensors in TVM's NDArray binary format, base64). Read as data only, every field checked.
_TVM_NDARRAY_MAGIC = 0xDD5E40F096B4A13F
_DL_CODES = {0: "int", 1: "uint", 2: "float"}


def _decode_tvm_metadata(doc: dict, fail) -> list[np.ndarray]:
    nodes, blobs = doc["nodes"], doc["b64ndarrays"]
    if not isinstance(nodes, list) or not all(isinstance(n, dict) for n in nodes) or not isinstance(blobs, list):
        fail("expected 'nodes' to be a list of objects and 'b64ndarrays' a list")

    def node(index, what: str) -> dict:
        try:
            index = int(index)
        except (TypeError, ValueError):
            index = -1
        if not 0 <= index < len(nodes):
            fail(f"{what}: node index {index} is out of range (there are {len(nodes)} nodes)")
        return nodes[index]

    root = node(doc.get("root", 1), "the root")
    keys, values = root.get("keys", []), root.get("data", [])
    if root.get("type_key") != "Map" or not isinstance(keys, list) or not isinstance(values, list) \
            or len(keys) != len(values):
        fail("expected the root node to be a Map with matching 'keys' and 'data'")
    if "relay.Constant" not in keys:
        return []
    array = node(values[keys.index("relay.Constant")], "relay.Constant")
    if array.get("type_key") != "Array" or not isinstance(array.get("data", []), list):
        fail("expected 'relay.Constant' to be an Array node")
    arrays = []
    for i, index in enumerate(array.get("data", [])):
        constant = node(index, f"constant {i}")
        attrs = constant.get("attrs", {})
        if constant.get("type_key") != "relay.Constant" or not isinstance(attrs, dict):
            fail(f"constant {i}: expected a relay.Constant node but found {constant.get('type_key')!r}")
        try:
            blob = blobs[int(attrs.get("data"))]
        except (TypeError, ValueError, IndexError):
            fail(f"constant {i}: its 'data' attribute {attrs.get('data')!r} does not index 'b64ndarrays'")
        arrays.append(_tvm_ndarray(blob, f"constant {i}", fail))
    return arrays


def _tvm_ndarray(blob, what: str, fail) -> np.ndarray:
    try:
        raw = base64.b64decode(blob, validate=True) if isinstance(blob, str) else None
    except (binascii.Error, ValueError):
        raw = None
    if raw is None or len(raw) < 32:
        fail(f"{what}: expected a base64 TVM NDArray")
    magic, _reserved, _device_type, _device_id, ndim, code, bits, lanes = struct.unpack_from("<QQiiiBBH", raw, 0)
    if magic != _TVM_NDARRAY_MAGIC:
        fail(f"{what}: bad NDArray magic {magic:#x}; expected {_TVM_NDARRAY_MAGIC:#x}")
    dtype = "bool" if (code, bits) == (1, 1) else f"{_DL_CODES.get(code, '?')}{bits}"
    if lanes != 1 or dtype not in DTYPES or not 0 <= ndim <= 32 or len(raw) < 32 + 8 * ndim + 8:
        fail(f"{what}: unsupported NDArray header (type code {code}, {bits} bits, {lanes} lanes, rank {ndim})")
    shape = struct.unpack_from(f"<{ndim}q", raw, 32)
    (size,) = struct.unpack_from("<q", raw, 32 + 8 * ndim)
    data = raw[40 + 8 * ndim:]
    np_dtype = np.dtype(dtype).newbyteorder("<")
    if any(d < 0 for d in shape) or size != int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize \
            or len(data) != size:
        fail(f"{what}: the NDArray of {dtype}{list(shape)} has {len(data)} data bytes (header says {size})")
    return np.frombuffer(data, dtype=np_dtype).reshape(shape).astype(np.dtype(dtype))


# --------------------------------------------------------------------------------------------
# Parser
# --------------------------------------------------------------------------------------------

_KEYWORDS = {"def", "fn", "let", "if", "else", "match", "type", "free_var", "meta", "ref", "ref_read",
             "ref_write", "True", "False"}


class _Parser:
    def __init__(self, tokens: list[Token], source_name: str, meta, init_module: IRModule | None,
                 known_op: Callable[[str], bool] | None):
        self.tokens = tokens
        self.pos = 0
        self.source_name = source_name
        self.init_module = init_module
        self.known_op = known_op
        self.meta = normalize_meta(meta)
        if self.meta is None and tokens[-2:-1] and tokens[-2].kind == "METADATA":
            self.meta = _decode_metadata(tokens[-2], source_name)
        self.meta_constants: dict[int, Constant] = {}
        self.type_headers: dict[str, GlobalTypeVar] = {}
        self.type_defs: dict[str, TypeData] = {}
        self.constructors: dict[str, Constructor] = {}
        self.constructor_tokens: dict[str, Token] = {}
        self.functions: dict[str, Function] = {}
        self.global_refs: dict[str, Token] = {}
        self.scopes: list[dict[str, Expr]] = []
        self.type_scopes: list[dict[str, TypeVar]] = []
        self.depth = 0  # current nesting, bounded by MAX_NESTING

    # --- token helpers ----------------------------------------------------------------------
    def peek(self, k: int = 0) -> Token:
        return self.tokens[min(self.pos + k, len(self.tokens) - 1)]

    def advance(self) -> Token:
        tok = self.tokens[self.pos]
        if tok.kind != "EOF":
            self.pos += 1
        return tok

    def is_punct(self, text: str, k: int = 0) -> bool:
        tok = self.peek(k)
        return tok.kind == "PUNCT" and tok.text == text

    def is_word(self, text: str, k: int = 0) -> bool:
        tok = self.peek(k)
        return tok.kind == "IDENT" and tok.text == text

    def accept(self, text: str) -> Token | None:
        tok = self.peek()
        if tok.kind in ("PUNCT", "IDENT") and tok.text == text:
            return self.advance()
        return None

    def expect(self, text: str, context: str = "") -> Token:
        tok = self.accept(text)
        if tok is None:
            self.error(f"expected '{text}'{context} but found {self.peek().describe()}")
        return tok

    def nested(self, parse, *args):
        """``parse(*args)`` one nesting level deeper: past ``MAX_NESTING`` a ParseError, not a RecursionError."""
        if self.depth >= MAX_NESTING:
            self.error(f"expected at most {MAX_NESTING} nested levels (of parentheses, calls, tuples, ifs, fns, "
                       f"matches, lets inside values, types, patterns or attribute lists) but found a deeper one at "
                       f"{self.peek().describe()}")
        self.depth += 1
        try:
            return parse(*args)
        finally:
            self.depth -= 1

    def error(self, message: str, tok: Token | None = None):
        tok = tok or self.peek()
        raise ParseError(message, tok.line, tok.column, self.source_name)

    def span(self, tok: Token) -> Span:
        return Span(tok.line, tok.column, self.source_name)

    def expect_kind(self, kind: str, what: str) -> Token:
        tok = self.peek()
        if tok.kind != kind:
            self.error(f"expected {what} but found {tok.describe()}")
        return self.advance()

    def expect_ident(self, what: str) -> Token:
        tok = self.peek()
        if tok.kind != "IDENT" or tok.text in _KEYWORDS:
            self.error(f"expected {what} but found {tok.describe()}")
        return self.advance()

    def at_end(self) -> bool:
        return self.peek().kind in ("EOF", "METADATA")

    # --- scopes -------------------------------------------------------------------------------
    def lookup_local(self, name: str) -> Expr | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def lookup_type_var(self, name: str) -> TypeVar | None:
        for scope in reversed(self.type_scopes):
            if name in scope:
                return scope[name]
        return None

    def find_type(self, name: str) -> GlobalTypeVar | None:
        if name in self.type_headers:
            return self.type_headers[name]
        if self.init_module is not None and GlobalTypeVar(name) in self.init_module.type_definitions:
            return GlobalTypeVar(name)
        return None

    def find_constructor(self, name: str) -> Constructor | None:
        if name in self.constructors:
            return self.constructors[name]
        if self.init_module is not None and not self.type_headers.get(name):
            ctor = self.init_module.find_constructor(name)
            # A type defined in the text hides the init module's type of the same name.
            if ctor is not None and ctor.belong_to.name not in self.type_headers:
                return ctor
        return None

    # --- module -------------------------------------------------------------------------------
    def skip_version(self) -> None:
        while self.peek().kind == "VERSION":
            self.advance()

    def skip_block(self) -> bool:
        """From the current token, skip to just past the first ``{...}`` block; False at end of input."""
        depth = 0
        while True:
            tok = self.advance()
            if tok.kind in ("EOF", "METADATA"):
                return False
            if tok.kind == "PUNCT" and tok.text == "{":
                depth += 1
            elif tok.kind == "PUNCT" and tok.text == "}":
                depth -= 1
                if depth <= 0:
                    return True

    def scan_items(self) -> list[tuple[str, int]]:
        """Find where each top-level item starts, so definitions can be read in dependency order."""
        items = []
        while not self.at_end():
            tok = self.peek()
            if tok.kind == "IDENT" and tok.text in ("type", "def"):
                items.append((tok.text, self.pos))
                if not self.skip_block():
                    break
            elif tok.kind == "IDENT" and tok.text == "extern" and self.is_word("type", 1):
                items.append(("type", self.pos))  # extern type NAME[params]: a type whose constructors are elsewhere
                self.advance()
                self.advance()
                if self.peek().kind == "IDENT":
                    self.advance()
                if self.accept("["):
                    while not self.at_end() and not self.accept("]"):
                        self.advance()
            elif tok.kind == "IDENT" and tok.text == "free_var":
                items.append(("free_var", self.pos))
                while not self.at_end() and not self.is_punct(";"):
                    self.advance()
                self.accept(";")
            else:
                items.append(("expr", self.pos))
                break
        return items

    def parse_module(self) -> IRModule:
        self.skip_version()
        items = self.scan_items()
        for kind, start in items:  # type names first: definitions may refer to later ones
            if kind == "type":
                self.pos = start + 1
                if self.tokens[start].text == "extern":
                    self.expect("type", " after 'extern'")
                tok = self.expect_ident("a type name after 'type'")
                if tok.text == "Tensor" or tok.text == "_" or tok.text in DTYPES:
                    self.error(f"expected a type name but found {tok.describe()}, which names a built-in type", tok)
                if tok.text in self.type_headers:
                    self.error(f"type {tok.text} is defined twice", tok)
                self.type_headers[tok.text] = GlobalTypeVar(tok.text)
        for kind, start in items:
            if kind == "type":
                self.pos = start
                tdef = self.parse_type_def()
                self.type_defs[tdef.header.name] = tdef
        free_vars: list[Var] = []
        main_expr = None
        main_tok = None
        self.scopes = [{}]
        for kind, start in items:
            self.pos = start
            if kind == "def":
                name_tok, fn = self.parse_def()
                if name_tok.text in self.functions:
                    self.error(f"global function @{name_tok.text} is defined twice", name_tok)
                self.functions[name_tok.text] = fn
            elif kind == "free_var":
                free_vars.append(self.parse_free_var())
            elif kind == "expr":
                main_tok = self.peek()
                main_expr = self.parse_seq()
                if not self.at_end():
                    self.error(f"expected the end of the program but found {self.peek().describe()}")
        if main_expr is not None:
            if "main" in self.functions:
                self.error("the program has both a 'def @main' and a bare expression (taken as @main)", main_tok)
            if isinstance(main_expr, Function) and not free_vars:
                self.functions["main"] = main_expr
            else:
                self.functions["main"] = Function(tuple(free_vars), main_expr, span=self.span(main_tok))
        elif free_vars:
            self.error("expected an expression after the free_var declarations but found end of input")
        for name, tok in self.global_refs.items():
            if name not in self.functions and (self.init_module is None or name not in self.init_module):
                self.error(f"undefined global function @{name}", tok)
        return self.build_module()

    def build_module(self) -> IRModule:
        mod = IRModule()
        for tdef in self.type_defs.values():
            mod.add_type(tdef)
        for name, fn in self.functions.items():
            mod.add(GlobalVar(name), fn)
        if self.init_module is None:
            return mod
        # Bring in the init module's definitions the text refers to, transitively.
        pending_globals, pending_types = set(), set()
        for fn in self.functions.values():
            _collect_references(fn, pending_globals, pending_types)
        for tdef in self.type_defs.values():
            _collect_type_data_references(tdef, pending_types)
        while pending_globals or pending_types:
            name = pending_types.pop() if pending_types else None
            if name is not None:
                gtv = GlobalTypeVar(name)
                if gtv not in mod.type_definitions and gtv in self.init_module.type_definitions:
                    tdef = self.init_module.type_definitions[gtv]
                    for ctor in tdef.constructors:
                        if ctor.name in self.constructors:
                            self.error(f"expected a constructor name that type {name} (used here, from the init "
                                       f"module) does not define, but found {ctor.name}",
                                       self.constructor_tokens[ctor.name])
                    mod.add_type(tdef)
                    _collect_type_data_references(tdef, pending_types)
                continue
            name = pending_globals.pop()
            if name not in mod and name in self.init_module:
                fn = self.init_module[name]
                mod.add(GlobalVar(name), fn)
                uses_globals, uses_types = set(), set()
                _collect_references(fn, uses_globals, uses_types)
                self.refuse_shadowing(name, uses_globals, uses_types)
                pending_globals |= uses_globals
                pending_types |= uses_types
        return mod

    def refuse_shadowing(self, copied: str, uses_globals: set, uses_types: set) -> None:
        """A definition copied from the init module (the prelude) keeps meaning its own globals and types: one the
        text defines again under the same name would be mixed with it (its constructors' tags, its arity)."""
        for name in sorted(uses_globals & self.functions.keys()):
            span = self.functions[name].span
            raise ParseError(f"@{name} is defined here and also by the prelude, whose @{copied} (used by this program) "
                             f"calls its own @{name}: rename this one", span.line if span else 0,
                             span.column if span else 0, self.source_name)
        for name in sorted(uses_types & self.type_defs.keys()):
            ctors = self.type_defs[name].constructors
            tok = self.constructor_tokens.get(ctors[0].name) if ctors else None
            raise ParseError(f"type {name} is defined here and also by the prelude, whose @{copied} (used by this "
                             f"program) works on its own {name}: rename this one", tok.line if tok else 0,
                             tok.column if tok else 0, self.source_name)

    def parse_free_var(self) -> Var:
        self.expect("free_var")
        tok = self.expect_kind("LOCAL", "a variable (%name) after 'free_var'")
        ty = self.parse_type() if self.accept(":") else None
        self.accept(";")
        var = Var(tok.text, ty, span=self.span(tok))
        if tok.text in self.scopes[0]:
            self.error(f"free variable %{tok.text} is declared twice", tok)
        self.scopes[0][tok.text] = var
        return var

    # --- definitions --------------------------------------------------------------------------
    def parse_type_params(self) -> dict[str, TypeVar]:
        params: dict[str, TypeVar] = {}
        if not self.accept("["):
            return params
        while True:
            tok = self.expect_ident("a type parameter name")
            if tok.text in params:
                self.error(f"type parameter {tok.text} is declared twice", tok)
            params[tok.text] = TypeVar(tok.text)
            if self.accept(","):
                if self.is_punct("]"):
                    break
                continue
            break
        self.expect("]", " after the type parameters")
        return params

    def parse_type_def(self) -> TypeData:
        extern = self.is_word("extern") and self.accept("extern")
        self.expect("type")
        name_tok = self.expect_ident("a type name")
        header = self.type_headers[name_tok.text]
        type_params = self.parse_type_params()
        if extern:  # (a type whose constructors are defined elsewhere: none here)
            return TypeData(header, tuple(type_params.values()), ())
        self.type_scopes.append(type_params)
        try:
            self.expect("{", f" to open the constructors of type {name_tok.text}")
            ctors = []
            while not self.is_punct("}"):
                tok = self.expect_ident(f"a constructor name in type {name_tok.text}")
                if tok.text in self.constructors:
                    self.error(f"constructor {tok.text} is defined twice", tok)
                if self.known_op is not None and self.known_op(tok.text):  # (a printed call could not say which)
                    self.error(f"constructor {tok.text} has the name of an operator; expected another name", tok)
                inputs = []
                if self.accept("("):
                    inputs = self.parse_type_list(")")
                ctor = Constructor(tok.text, tuple(inputs), header, len(ctors))
                self.constructors[tok.text] = ctor
                self.constructor_tokens[tok.text] = tok
                ctors.append(ctor)
                if not self.accept(","):
                    break
            self.expect("}", f" to close type {name_tok.text}")
        finally:
            self.type_scopes.pop()
        return TypeData(header, tuple(type_params.values()), tuple(ctors))

    def parse_params(self) -> tuple[list[Var], dict]:
        """``(%a: T, %b, attr=value)`` after the opening parenthesis has been read."""
        params: list[Var] = []
        attrs: dict = {}
        names = set()
        while not self.is_punct(")"):
            tok = self.peek()
            if tok.kind == "LOCAL":
                if attrs:
                    self.error(f"expected an attribute (name=value) after the attributes but found {tok.describe()}")
                self.advance()
                if tok.text in names:
                    self.error(f"parameter %{tok.text} is declared twice", tok)
                names.add(tok.text)
                ty = self.parse_type() if self.accept(":") else None
                params.append(Var(tok.text, ty, span=self.span(tok)))
            elif tok.kind == "IDENT" and self.is_punct("=", 1):
                self.parse_attr(attrs)
            else:
                self.error(f"expected a parameter (%name) or an attribute (name=value) but found {tok.describe()}")
            if not self.accept(","):
                break
        self.expect(")", " to close the parameter list")
        return params, attrs

    def parse_def(self) -> tuple[Token, Function]:
        def_tok = self.expect("def")
        name_tok = self.expect_kind("GLOBAL", "a global name (@name) after 'def'")
        type_params = self.parse_type_params()
        self.type_scopes.append(type_params)
        try:
            self.expect("(", f" to open the parameters of @{name_tok.text}")
            params, attrs = self.parse_params()
            ret_type = self.parse_type() if self.accept("->") else None
            body = self.parse_body(params, f" to open the body of @{name_tok.text}")
        finally:
            self.type_scopes.pop()
        fn = Function(tuple(params), body, ret_type, tuple(type_params.values()), attrs, span=self.span(def_tok))
        return name_tok, fn

    def parse_body(self, params: list[Var], context: str) -> Expr:
        self.expect("{", context)
        self.scopes.append({p.name_hint: p for p in params})
        try:
            body = self.parse_seq()
        finally:
            self.scopes.pop()
        self.expect("}", " to close the block")
        return body

    # --- attributes ---------------------------------------------------------------------------
    def parse_attr(self, attrs: dict) -> None:
        key = self.advance()
        self.expect("=")
        if key.text in attrs:
            self.error(f"attribute {key.text} is given twice", key)
        attrs[key.text] = self.parse_attr_value()

    def parse_attr_value(self):
        return self.nested(self._attr_value)

    def _attr_value(self):
        tok = self.peek()
        if tok.kind == "NUMBER":
            self.advance()
            value, _, is_float = tok.value
            return float(value) if is_float else int(value)
        if tok.kind == "STRING":
            self.advance()
            return tok.value
        if tok.kind == "IDENT":
            self.advance()
            return {"True": True, "False": False, "None": None}.get(tok.text, tok.text)
        if self.accept("[") or self.accept("("):
            close = "]" if self.tokens[self.pos - 1].text == "[" else ")"
            items = []
            while not self.is_punct(close):
                items.append(self.parse_attr_value())
                if not self.accept(","):
                    break
            self.expect(close, " to close the attribute list")
            return tuple(items)
        self.error(f"expected an attribute value (number, string, list, True/False, None) but found {tok.describe()}")

    # --- expressions --------------------------------------------------------------------------
    def parse_seq(self, statements: bool = True) -> Expr:
        """Bindings (``let %x = e;``, ``%0 = e;``) followed by the expression they scope over. With
        ``statements``, ``e; rest`` also binds: ``e`` is evaluated for its effect (``ref_write(%r, 1f);
        ref_read(%r)``) and bound to an unused ``%_``, as TVM reads it."""
        lets: list[tuple[Var, Expr, Span]] = []
        depth = len(self.scopes)
        self.scopes.append({})  # one scope for the whole sequence: later bindings shadow earlier ones
        try:
            while True:
                if self.is_word("let"):
                    let_tok = self.advance()
                    tok = self.expect_kind("LOCAL", "a variable (%name) after 'let'")
                    ty = self.parse_type() if self.accept(":") else None
                    var = Var(tok.text, ty, span=self.span(tok))
                    self.expect("=", f" after 'let %{tok.text}'")
                    # The rest of the sequence sees the new binding; a let-bound function also
                    # sees itself, so that it may recurse.
                    recursive = self.is_word("fn")
                    if recursive:
                        self.scopes[-1][tok.text] = var
                    value = self.parse_expr()
                    self.expect(";", f" after the value of 'let %{tok.text}'")
                    self.scopes[-1][tok.text] = var
                    lets.append((var, value, self.span(let_tok)))
                elif self.peek().kind == "LOCAL" and self.is_punct("=", 1):
                    tok = self.advance()
                    self.advance()
                    value = self.parse_expr()
                    self.accept(";")  # TVM's docs sometimes omit it
                    self.scopes[-1][tok.text] = value
                else:
                    start = self.peek()
                    body = self.parse_expr()
                    if not (statements and self.accept(";")):
                        break
                    lets.append((Var("_", span=self.span(start)), body, self.span(start)))
        finally:
            del self.scopes[depth:]
        for var, value, span in reversed(lets):
            body = Let(var, value, body, span=span)
        return body

    def parse_expr(self) -> Expr:
        return self.nested(self._expr)

    def _expr(self) -> Expr:
        """Operands joined by infix operators, by precedence climbing over explicit stacks: a chain of
        any length takes no Python frames here (like a sequence of bindings, it does not nest)."""
        operands = [self.parse_postfix()]
        pending: list[tuple[str, int, Token]] = []  # (op name, precedence, operator token)

        def reduce() -> None:
            name, _, tok = pending.pop()
            right, left = operands.pop(), operands.pop()
            operands.append(Call(Op(name, span=self.span(tok)), (left, right), span=self.span(tok)))

        while self.peek().kind == "PUNCT" and self.peek().text in _BINARY_OPS:
            tok = self.advance()
            name, precedence = _BINARY_OPS[tok.text]
            while pending and pending[-1][1] >= precedence:  # all are left-associative
                reduce()
            if self.known_op is not None and not self.known_op(name):
                self.error(f"operator {tok.text!r} calls {name!r}, which is not a registered operator", tok)
            pending.append((name, precedence, tok))
            operands.append(self.parse_postfix())
        while pending:
            reduce()
        return operands[0]

    def parse_postfix(self) -> Expr:
        """A primary expression followed by calls ``(...)`` and projections ``.N``."""
        first = self.peek()
        expr = self.parse_primary()
        links = 0
        while True:
            # (each call or projection nests the tree one level: a chain counts towards MAX_NESTING, so that
            # a 20,000-link @f()()... is a ParseError, not a RecursionError in type inference)
            if self.depth + links >= MAX_NESTING and (self.is_punct("(") or self.is_punct(".")):
                self.error(f"expected at most {MAX_NESTING} nested levels (a chain of calls or projections counts "
                           f"one per link) but found a deeper one at {self.peek().describe()}")
            links += 1
            # Type arguments (``@id[int32](1)``) may follow a global or constructor callee.
            if self.is_punct("(") or (self.is_punct("[") and isinstance(expr, (GlobalVar, Constructor))):
                type_args = ()
                if self.accept("["):
                    type_args = tuple(self.parse_type_list("]"))
                    if not self.is_punct("("):
                        self.error(f"expected '(' after the type arguments but found {self.peek().describe()}")
                self.expect("(")
                args, attrs = self.parse_call_args()
                expr = Call(expr, tuple(args), attrs, type_args, span=self.span(first))
            elif self.is_punct("."):
                self.advance()
                tok = self.peek()
                if tok.kind != "NUMBER" or tok.value[2] or tok.value[1] is not None or tok.value[0] < 0:
                    self.error(f"expected a field index after '.' but found {tok.describe()}")
                self.advance()
                expr = TupleGetItem(expr, tok.value[0], span=self.span(first))
            else:
                return expr

    def parse_call_args(self) -> tuple[list[Expr], dict]:
        args: list[Expr] = []
        attrs: dict = {}
        while not self.is_punct(")"):
            tok = self.peek()
            if tok.kind == "IDENT" and self.is_punct("=", 1):
                self.parse_attr(attrs)
            else:
                if attrs:
                    self.error(f"expected an attribute (name=value) after the attributes but found {tok.describe()}")
                args.append(self.parse_expr())
            if not self.accept(","):
                if not self.is_punct(")"):
                    self.error(f"expected ',' or ')' in the argument list but found {self.peek().describe()}")
                break
        self.expect(")")
        return args, attrs

    def parse_primary(self) -> Expr:
        tok = self.peek()
        if tok.kind == "PUNCT" and tok.text == "(":
            return self.parse_paren()
        if tok.kind == "LOCAL":
            self.advance()
            found = self.lookup_local(tok.text)
            if found is None:
                what = "graph binding" if tok.text.isdigit() else "variable"
                self.error(f"undefined {what} %{tok.text}", tok)
            return found
        if tok.kind == "GLOBAL":
            self.advance()
            self.global_refs.setdefault(tok.text, tok)
            return GlobalVar(tok.text, span=self.span(tok))
        if tok.kind == "NUMBER":
            self.advance()
            return self.make_constant(tok)
        if tok.kind == "IDENT":
            word = tok.text
            if word in ("True", "False"):
                self.advance()
                return Constant(np.array(word == "True"), span=self.span(tok))
            if word == "if":
                return self.parse_if()
            if word == "match":
                return self.parse_match()
            if word == "fn":
                return self.parse_fn()
            if word == "let":  # (a let in a value: its body ends at the first ';', which is the value's)
                return self.parse_seq(statements=False)
            if word in ("ref", "ref_read", "ref_write"):
                return self.parse_ref()
            if word == "meta":
                return self.parse_meta()
            if word in _KEYWORDS:
                self.error(f"expected an expression but found {tok.describe()}")
            self.advance()
            ctor = self.find_constructor(word)
            if ctor is not None:
                return ctor
            if self.known_op is not None and not self.known_op(word):
                self.error(f"unknown operator or constructor {word!r}", tok)
            return Op(word, span=self.span(tok))
        if tok.kind == "PUNCT" and tok.text == "-":
            self.error("expected an expression but found '-': the text format has no unary minus; write a "
                       "negative literal such as -1f (no space after '-') or negative(e)")
        self.error(f"expected an expression but found {tok.describe()}")

    def parse_paren(self) -> Expr:
        open_tok = self.advance()
        if self.accept(")"):
            return Tuple((), span=self.span(open_tok))
        first = self.parse_seq()
        if self.accept(")"):
            return first
        if not self.is_punct(","):
            self.error(f"expected ',' or ')' but found {self.peek().describe()}")
        fields = [first]
        while self.accept(","):
            if self.is_punct(")"):
                break
            fields.append(self.parse_expr())
        self.expect(")", " to close the tuple")
        return Tuple(tuple(fields), span=self.span(open_tok))

    def make_constant(self, tok: Token) -> Constant:
        value, dtype, is_float = tok.value
        dtype = dtype or ("float32" if is_float else "int32")
        if not is_float:
            info = np.iinfo(dtype)
            if not info.min <= value <= info.max:
                self.error(f"literal {tok.text} is out of range for {dtype} ([{info.min}, {info.max}])", tok)
            return Constant(np.array(value, dtype=dtype), span=self.span(tok))
        with np.errstate(over="ignore"):
            data = np.array(value, dtype=dtype)
        if np.isinf(data) and not np.isinf(value):
            self.error(f"literal {tok.text} is out of range for {dtype}", tok)
        return Constant(data, span=self.span(tok))

    def parse_if(self) -> If:
        if_tok = self.expect("if")
        self.expect("(", " after 'if'")
        cond = self.parse_seq()
        self.expect(")", " after the condition of 'if'")
        true_branch = self.parse_body([], " to open the 'then' branch")
        self.expect("else", " after the 'then' branch of 'if'")
        if self.is_word("if"):
            false_branch = self.nested(self.parse_if)
        else:
            false_branch = self.parse_body([], " to open the 'else' branch")
        return If(cond, true_branch, false_branch, span=self.span(if_tok))

    def parse_match(self) -> Match:
        match_tok = self.expect("match")
        complete = not self.accept("?")
        # As in TVM, the value matched is an operand: ``match %x {``, ``match (e) {``, ``match %t.0 {``.
        data = self.nested(self.parse_postfix)
        self.expect("{", " to open the match clauses")
        clauses = []
        while not self.is_punct("}"):
            bound: dict[str, Var] = {}
            lhs = self.parse_pattern(bound)
            self.expect("=>", " after the pattern")
            self.scopes.append(bound)
            try:
                rhs = self.parse_body([], "") if self.is_punct("{") else self.parse_seq()
            finally:
                self.scopes.pop()
            clauses.append(Clause(lhs, rhs))
            if not self.accept(","):
                break
        self.expect("}", " to close the match clauses")
        return Match(data, tuple(clauses), complete, span=self.span(match_tok))

    def parse_pattern(self, bound: dict[str, Var]):
        return self.nested(self._pattern, bound)

    def _pattern(self, bound: dict[str, Var]):
        tok = self.peek()
        if tok.kind == "IDENT" and tok.text == "_":
            self.advance()
            return PatternWildcard(span=self.span(tok))
        if tok.kind == "LOCAL":
            self.advance()
            if tok.text in bound:
                self.error(f"pattern variable %{tok.text} is bound twice in one pattern", tok)
            ty = self.parse_type() if self.accept(":") else None
            var = bound[tok.text] = Var(tok.text, ty, span=self.span(tok))
            return PatternVar(var, span=self.span(tok))
        if tok.kind == "IDENT" and tok.text not in _KEYWORDS:
            self.advance()
            ctor = self.find_constructor(tok.text)
            if ctor is None:
                self.error(f"unknown constructor {tok.text!r} in pattern", tok)
            subs = []
            if self.accept("("):
                while not self.is_punct(")"):
                    subs.append(self.parse_pattern(bound))
                    if not self.accept(","):
                        break
                self.expect(")", " to close the constructor pattern")
            if len(subs) != len(ctor.inputs):
                self.error(f"constructor {ctor.name} takes {len(ctor.inputs)} field(s) but the pattern has "
                           f"{len(subs)}", tok)
            return PatternConstructor(ctor, tuple(subs), span=self.span(tok))
        if tok.kind == "PUNCT" and tok.text == "(":
            self.advance()
            subs, trailing_comma = [], False
            while not self.is_punct(")"):
                subs.append(self.parse_pattern(bound))
                trailing_comma = bool(self.accept(","))
                if not trailing_comma:
                    break
            self.expect(")", " to close the tuple pattern")
            if len(subs) == 1 and not trailing_comma:
                return subs[0]
            return PatternTuple(tuple(subs), span=self.span(tok))
        self.error(f"expected a pattern (_, %var, Constructor(...) or a tuple) but found {tok.describe()}")

    def parse_fn(self) -> Function:
        fn_tok = self.expect("fn")
        type_params = self.parse_type_params()
        self.type_scopes.append(type_params)
        try:
            self.expect("(", " to open the parameters of 'fn'")
            params, attrs = self.parse_params()
            ret_type = self.parse_type() if self.accept("->") else None
            body = self.parse_body(params, " to open the body of 'fn'")
        finally:
            self.type_scopes.pop()
        return Function(tuple(params), body, ret_type, tuple(type_params.values()), attrs, span=self.span(fn_tok))

    def parse_ref(self) -> Expr:
        tok = self.advance()
        self.expect("(", f" after '{tok.text}'")
        first = self.parse_expr()
        if tok.text == "ref_write":
            self.expect(",", " between the reference and the value of 'ref_write'")
            value = self.parse_expr()
            self.expect(")", " to close 'ref_write'")
            return RefWrite(first, value, span=self.span(tok))
        self.expect(")", f" to close '{tok.text}'")
        return RefCreate(first, span=self.span(tok)) if tok.text == "ref" else RefRead(first, span=self.span(tok))

    def parse_meta(self) -> Constant:
        tok = self.expect("meta")
        self.expect("[", " after 'meta'")
        kind = self.expect_kind("IDENT", "a metadata kind such as relay.Constant")
        if kind.text not in ("relay.Constant", "Constant"):
            self.error(f"expected the metadata kind 'relay.Constant' but found {kind.describe()}", kind)
        self.expect("]")
        self.expect("[", " before the metadata index")
        index_tok = self.peek()
        if index_tok.kind != "NUMBER" or index_tok.value[2] or index_tok.value[0] < 0:
            self.error(f"expected a metadata index but found {index_tok.describe()}")
        self.advance()
        self.expect("]", " after the metadata index")
        index = index_tok.value[0]
        if self.meta is None:
            self.error(f"meta[relay.Constant][{index}] is used but the text has no #[metadata] section "
                       "and no meta was given", tok)
        if index >= len(self.meta):
            self.error(f"meta[relay.Constant][{index}] is out of range: there are {len(self.meta)} constant(s)", tok)
        if index not in self.meta_constants:
            try:
                self.meta_constants[index] = Constant(self.meta[index], span=self.span(tok))
            except TypeError as err:
                self.error(f"meta[relay.Constant][{index}]: {err}", tok)
        return self.meta_constants[index]

    # --- types --------------------------------------------------------------------------------
    def parse_type_list(self, close: str) -> list:
        types = []
        while not self.is_punct(close):
            types.append(self.parse_type())
            if not self.accept(","):
                break
        self.expect(close, " to close the type list")
        return types

    def parse_type(self):
        return self.nested(self._type)

    def _type(self):
        tok = self.peek()
        if tok.kind == "PUNCT" and tok.text == "(":
            self.advance()
            fields, trailing_comma = [], False
            while not self.is_punct(")"):
                fields.append(self.parse_type())
                trailing_comma = bool(self.accept(","))
                if not trailing_comma:
                    break
            self.expect(")", " to close the tuple type")
            if len(fields) == 1 and not trailing_comma:
                return fields[0]
            return TupleType(tuple(fields))
        if tok.kind != "IDENT":
            self.error(f"expected a type but found {tok.describe()}")
        self.advance()
        word = tok.text
        if word == "Tensor":
            return self.parse_tensor_type()
        if word == "fn":
            type_params = self.parse_type_params()
            self.type_scopes.append(type_params)
            try:
                self.expect("(", " to open the argument types of 'fn'")
                args = self.parse_type_list(")")
                self.expect("->", " after the argument types of a function type")
                ret = self.parse_type()
            finally:
                self.type_scopes.pop()
            return FuncType(tuple(args), ret, tuple(type_params.values()))
        if word == "ref":
            self.expect("(", " after 'ref' in a type")
            value = self.parse_type()
            self.expect(")", " to close 'ref(...)'")
            return RefType(value)
        if word == "_":
            return IncompleteType()
        tvar = self.lookup_type_var(word)
        if tvar is not None:
            return tvar
        if word in DTYPES:
            return TensorType((), word)
        gtv = self.find_type(word)
        if gtv is None:
            self.error(f"unknown type {word!r}; expected a dtype, Tensor[...], a type parameter or an ADT name", tok)
        if self.accept("["):
            return TypeCall(gtv, tuple(self.parse_type_list("]")))
        return gtv

    def parse_tensor_type(self) -> TensorType:
        self.expect("[", " after 'Tensor'")
        dims = []
        if self.accept("("):
            while not self.is_punct(")"):
                tok = self.peek()
                if self.accept("?"):
                    dims.append(Any())
                elif (tok.kind == "NUMBER" and not tok.value[2] and tok.value[0] >= 0
                      and (tok.value[1] or "int").startswith("int")):  # TVM may print 3i64
                    self.advance()
                    if tok.value[0] > _MAX_DIM:
                        self.error(f"dimension {tok.value[0]} is out of range: a dimension counts at most "
                                   f"{_MAX_DIM} elements (int64)", tok)
                    dims.append(tok.value[0])
                elif tok.kind == "IDENT" and tok.text not in _KEYWORDS:
                    self.advance()
                    dims.append(SymDim(tok.text))
                else:
                    self.error(f"expected a dimension (a non-negative integer, ? or a name) but found {tok.describe()}")
                if not self.accept(","):
                    break
            self.expect(")", " to close the shape")
        else:
            self.error(f"expected '(' to open the shape of Tensor[...] but found {self.peek().describe()}")
        self.expect(",", " between the shape and the dtype")
        dtype_tok = self.peek()
        if dtype_tok.kind != "IDENT" or dtype_tok.text not in DTYPES:
            self.error(f"expected a dtype ({', '.join(DTYPES)}) but found {dtype_tok.describe()}")
        self.advance()
        self.expect("]", " to close Tensor[...]")
        return TensorType(tuple(dims), dtype_tok.text)


# --------------------------------------------------------------------------------------------
# References (to copy what the text uses from an init module)
# --------------------------------------------------------------------------------------------

def _collect_type_references(ty, types: set) -> None:
    for part in nested_types(ty):
        if isinstance(part, GlobalTypeVar):
            types.add(part.name)
        elif isinstance(part, TypeCall):
            types.add(part.func.name)


def _collect_type_data_references(tdef: TypeData, types: set) -> None:
    for ctor in tdef.constructors:
        for t in ctor.inputs:
            _collect_type_references(t, types)


def _collect_pattern_references(pattern, types: set) -> None:
    if isinstance(pattern, PatternConstructor):
        types.add(pattern.constructor.belong_to.name)
    if isinstance(pattern, (PatternConstructor, PatternTuple)):
        for p in pattern.patterns:
            _collect_pattern_references(p, types)
    elif isinstance(pattern, PatternVar):
        _collect_type_references(pattern.var.type_annotation, types)


def _collect_references(fn: Function, globals_: set, types: set) -> None:
    from .analysis import post_order

    for node in post_order(fn):
        if isinstance(node, GlobalVar):
            globals_.add(node.name)
        elif isinstance(node, Constructor):
            types.add(node.belong_to.name)
        elif isinstance(node, Var):
            _collect_type_references(node.type_annotation, types)
        elif isinstance(node, Function):
            _collect_type_references(node.ret_type, types)
        elif isinstance(node, Call):
            for t in node.type_args:
                _collect_type_references(t, types)
        elif isinstance(node, Match):
            for clause in node.clauses:
                _collect_pattern_references(clause.lhs, types)


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------

def parse_module(text: str, source_name: str = "<string>", meta=None, init_module: IRModule | None = None,
                 known_op: Callable[[str], bool] | None = None) -> IRModule:
    """Parse a whole program. Names the text does not define are looked up in ``init_module`` (and the
    definitions used are copied into the result); ``known_op(name)`` rejects unknown operators."""
    if not isinstance(text, str):
        raise ParseError(f"expected the program as a str but got {type(text).__name__}", 0, 0, source_name)
    parser = _Parser(tokenize(text, source_name), source_name, meta, init_module, known_op)
    return parser.parse_module()


def parse_expr(text: str, source_name: str = "<string>", meta=None, init_module: IRModule | None = None,
               known_op: Callable[[str], bool] | None = None) -> Expr:
    """Parse one expression; its free variables must be declared with ``free_var %x: T;`` lines."""
    parser = _Parser(tokenize(text, source_name), source_name, meta, init_module, known_op)
    parser.skip_version()
    parser.scopes = [{}]
    while parser.is_word("free_var"):
        parser.parse_free_var()
    expr = parser.parse_seq()
    if not parser.at_end():
        parser.error(f"expected the end of the expression but found {parser.peek().describe()}")
    for name, tok in parser.global_refs.items():
        if init_module is not None and name not in init_module:
            parser.error(f"undefined global function @{name}", tok)
    return expr


def parse_type(text: str, source_name: str = "<string>", init_module: IRModule | None = None):
    """Parse one type, such as ``Tensor[(?, 3), float32]`` or ``fn [A](A) -> A``."""
    parser = _Parser(tokenize(text, source_name), source_name, None, init_module, None)
    ty = parser.parse_type()
    if parser.peek().kind != "EOF":
        parser.error(f"expected the end of the type but found {parser.peek().describe()}")
    return ty
