"""The text printer: Relay's text format for types, expressions and modules.

Inside a function body every non-atomic sub-expression is printed once, in post-order, as a graph
binding ``%0 = add(%x, %y);`` in the block (function body, if branch, match arm) where
``ToANormalForm`` binds it, which is where every executor evaluates it: the innermost block holding
all its uses, just before the first statement of that block that uses it; later uses refer to
``%0``. (A node first used inside a parenthesised let is printed there, since it may read the let's
variables, and again where it is used outside.) So a shared node with an effect (a call that writes a
reference) prints, and re-parses, as one evaluation at the same place. Variable names are made unique
within each ``def`` (``x``, ``x1``, ...) so that re-parsing gives the same binding structure. Scalar constants print inline
(``1f``, ``2i64``, ``True``); other constants print as ``meta[relay.Constant][i]`` and a module's
text ends with a ``#[metadata]`` section holding them as JSON (dtype, shape, base64 of the raw
little-endian bytes). ``tensorvm.ir.parser`` reads all of it back.
"""

from __future__ import annotations

import base64
import json
import math
import re

import numpy as np

from .analysis import free_vars, pattern_vars
from .expr import (
    Call,
    Constant,
    Constructor,
    Expr,
    Function,
    GlobalVar,
    If,
    Let,
    Match,
    Op,
    Pattern,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    PatternWildcard,
    RefCreate,
    RefRead,
    RefWrite,
    Tuple,
    TupleGetItem,
    Var,
)
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
    TypeVar,
)

__all__ = [
    "type_to_str", "expr_to_str", "module_to_str", "scalar_to_str", "attr_value_to_str", "VERSION_HEADER",
    "DTYPE_SUFFIX",
]

VERSION_HEADER = '#[version = "0.0.5"]'

# Literal suffix per dtype; int32 and float32 are the defaults (``1``, ``1f``).
DTYPE_SUFFIX = {
    "int8": "i8", "int16": "i16", "int32": "", "int64": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
    "float16": "f16", "float32": "f", "float64": "f64",
}

# Words the parser reserves; a variable or type parameter never prints as one of them.
_RESERVED = {"def", "fn", "let", "if", "else", "match", "type", "free_var", "meta", "ref", "ref_read",
             "ref_write", "Tensor", "True", "False", "None", "inf", "nan"} | set(DTYPES)
_IDENT_CHARS = re.compile(r"[^A-Za-z0-9_]")


# --------------------------------------------------------------------------------------------
# Scalars and attributes
# --------------------------------------------------------------------------------------------

def _float_text(value: float, dtype: str) -> str:
    """The shortest decimal that reads back to exactly this value of ``dtype``."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if dtype == "float64":
        text = repr(float(value))
    else:
        text = str(np.dtype(dtype).type(value))
    if text.endswith(".0"):
        text = text[:-2]
    return text


def scalar_to_str(value, dtype: str) -> str:
    """A scalar literal with its dtype suffix: ``1f``, ``-2i64``, ``True``, ``1.5f16``, ``nanf``."""
    if dtype == "bool":
        return "True" if bool(value) else "False"
    suffix = DTYPE_SUFFIX[dtype]
    if dtype.startswith("float"):
        return _float_text(float(value), dtype) + suffix
    return f"{int(value)}{suffix}"


def attr_value_to_str(value) -> str:
    """Relay style: ``[1, 1]``, ``"NCHW"``, ``1e-05f``, ``True``, ``None``."""
    if value is None:
        return "None"
    if isinstance(value, (bool, np.bool_)):
        return "True" if value else "False"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return _float_text(float(value), "float64") + "f"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(attr_value_to_str(v) for v in value) + "]"
    if isinstance(value, (TensorType, TupleType, FuncType, TypeCall, TypeVar, GlobalTypeVar, RefType)):
        return type_to_str(value)
    if isinstance(value, Any):
        return "?"
    return repr(value)  # not readable back; printing never fails


def _attrs_to_list(attrs) -> list[str]:
    return [f"{key}={attr_value_to_str(value)}" for key, value in attrs.items()]


# --------------------------------------------------------------------------------------------
# Types
# --------------------------------------------------------------------------------------------

def _dim_to_str(dim) -> str:
    if isinstance(dim, Any):
        return "?"
    if isinstance(dim, SymDim):
        return dim.name
    return str(dim)


def type_to_str(ty, tvar_name=None) -> str:
    """``Tensor[(?, 2), float32]``, ``float32``, ``(int32, float32)``, ``fn [A](A) -> A``, ``List[A]``."""
    name_of = tvar_name or (lambda tv: tv.name)
    if ty is None:
        return "_"
    if isinstance(ty, TensorType):
        if not ty.shape:
            return ty.dtype
        return f"Tensor[({', '.join(_dim_to_str(d) for d in ty.shape)}), {ty.dtype}]"
    if isinstance(ty, TupleType):
        fields = [type_to_str(f, tvar_name) for f in ty.fields]
        return "(" + fields[0] + ",)" if len(fields) == 1 else "(" + ", ".join(fields) + ")"
    if isinstance(ty, FuncType):
        params = ""
        if ty.type_params:
            params = "[" + ", ".join(name_of(tp) for tp in ty.type_params) + "]"
        args = ", ".join(type_to_str(a, tvar_name) for a in ty.arg_types)
        return f"fn {params}({args}) -> {type_to_str(ty.ret_type, tvar_name)}"
    if isinstance(ty, TypeVar):
        return name_of(ty)
    if isinstance(ty, GlobalTypeVar):
        return ty.name
    if isinstance(ty, TypeCall):
        return f"{ty.func.name}[{', '.join(type_to_str(a, tvar_name) for a in ty.args)}]"
    if isinstance(ty, RefType):
        return f"ref({type_to_str(ty.value, tvar_name)})"
    if isinstance(ty, IncompleteType):
        return "_"
    return repr(ty)


# --------------------------------------------------------------------------------------------
# Expressions
# --------------------------------------------------------------------------------------------

def _indent(lines: list[str]) -> list[str]:
    return ["  " + line if line else line for line in lines]


def _sanitize(name: str, fallback: str) -> str:
    name = _IDENT_CHARS.sub("_", name or "")
    if not name:
        return fallback
    if name[0].isdigit():
        name = fallback + name  # never numeric-looking: %0 is a graph binding
    return name


class _Printer:
    def __init__(self, show_types: bool, reserved_type_names=()):
        self.show_types = show_types
        self.constants: list[Constant] = []
        self.constant_index: dict[Constant, int] = {}
        self.reserved_type_names = set(reserved_type_names)
        self.start_function()

    # --- naming -----------------------------------------------------------------------------
    def start_function(self) -> None:
        """Names are unique per ``def``; graph bindings count from ``%0`` in each."""
        self.var_names: dict[Var, str] = {}
        self.used_names: set[str] = set()
        self.next_suffix: dict[str, int] = {}
        self.tvar_names: dict = {}
        self.used_tvar_names: set[str] = set()
        self.counter = 0
        self.scopes: list[dict[Expr, str]] = []
        self.block_scopes: list = []  # the ToANormalForm scope of each open block (home_block)
        self.block_binds: list = []  # the variables each open block binds: its lets, parameters, pattern's
        self.home: dict = {}  # node -> the scope ToANormalForm binds it in
        self.child_scopes: dict = {}  # If / Match / Function -> the scopes of its blocks

    def analyse(self, body: Expr):
        """Where ``ToANormalForm`` binds each node of ``body`` (a function body or a bare expression);
        returns the scope of ``body``'s own block."""
        from ..transform.to_anf import _ANFConverter, _Scope

        converter, root = _ANFConverter(), _Scope(None)
        converter.assign_scopes(body, root)
        self.home, self.child_scopes = converter.scope, converter.child_scopes
        return root

    def var_name(self, var: Var) -> str:
        name = self.var_names.get(var)
        if name is None:
            base = _sanitize(var.name_hint, "v")
            name, k = base, self.next_suffix.get(base, 0)
            if k:
                name = f"{base}{k}"
            while name in self.used_names:  # counting per base name keeps this linear
                k += 1
                name = f"{base}{k}"
            self.next_suffix[base] = k + 1
            self.used_names.add(name)
            self.var_names[var] = name
        return "%" + name

    def tvar_name(self, tv) -> str:
        name = self.tvar_names.get(tv)
        if name is None:
            base = _sanitize(getattr(tv, "name", ""), "T")
            name, k = base, 0
            while (name in self.used_tvar_names or name in _RESERVED or name in self.reserved_type_names
                   or name == "_"):
                k += 1
                name = f"{base}{k}"
            self.used_tvar_names.add(name)
            self.tvar_names[tv] = name
        return name

    def type_str(self, ty) -> str:
        return type_to_str(ty, self.tvar_name)

    def type_comment(self, expr: Expr) -> str:
        if not self.show_types:
            return ""
        ty = getattr(expr, "_checked_type", None)
        return f" /* ty={self.type_str(ty)} */" if ty is not None else ""

    # --- atoms and bindings -------------------------------------------------------------------
    def atom(self, e: Expr) -> str | None:
        """The inline text of an atomic node, or None when the node must be bound."""
        if isinstance(e, Var):
            return self.var_name(e)
        if isinstance(e, GlobalVar):
            return "@" + e.name
        if isinstance(e, (Op, Constructor)):
            return e.name
        if isinstance(e, Constant):
            if e.data.ndim == 0:
                return scalar_to_str(e.data.item(), e.data.dtype.name)
            index = self.constant_index.get(e)
            if index is None:
                index = self.constant_index[e] = len(self.constants)
                self.constants.append(e)
            return f"meta[relay.Constant][{index}]"
        if isinstance(e, TupleGetItem) and isinstance(e.tuple_value, Var):
            return f"{self.var_name(e.tuple_value)}.{e.index}"
        return None

    def lookup(self, e: Expr) -> str | None:
        for scope in reversed(self.scopes):
            name = scope.get(e)
            if name is not None:
                return name
        return None

    def operand(self, e: Expr) -> str:
        """Text for ``e`` used as an operand: inline if atomic, else the name of its binding."""
        text = self.atom(e)
        if text is not None:
            return text + self.type_comment(e) if isinstance(e, Constant) and e.data.ndim == 0 else text
        name = self.lookup(e)
        if name is None:
            self.bind_tree(e)
            name = self.lookup(e)
        return name

    @staticmethod
    def operand_children(e: Expr) -> tuple:
        """Children printed in the current block (those in nested blocks are not listed)."""
        if isinstance(e, Call):
            return (e.op, *e.args)
        if isinstance(e, Tuple):
            return e.fields
        if isinstance(e, TupleGetItem):
            return (e.tuple_value,)
        if isinstance(e, If):
            return (e.cond,)
        if isinstance(e, Match):
            return (e.data,)
        if isinstance(e, RefCreate):
            return (e.value,)
        if isinstance(e, RefRead):
            return (e.ref,)
        if isinstance(e, RefWrite):
            return (e.ref, e.value)
        return ()

    @staticmethod
    def is_atomic(e: Expr) -> bool:
        """Printed inline (no side effects: names and meta indices are given in printing order)."""
        return (isinstance(e, (Var, GlobalVar, Op, Constructor, Constant))
                or (isinstance(e, TupleGetItem) and isinstance(e.tuple_value, Var)))

    def needs_binding(self, e: Expr) -> bool:
        return not self.is_atomic(e) and self.lookup(e) is None

    def bind_tree(self, root: Expr, include_root: bool = True) -> None:
        """Bind every unbound non-atomic node under ``root`` in post-order (iteratively)."""
        stack = [(root, False)]
        while stack:
            e, ready = stack.pop()
            if ready:
                if self.lookup(e) is None and (include_root or e is not root):
                    self.emit_binding(e)
                continue
            if e is not root and not self.needs_binding(e):
                continue
            stack.append((e, True))
            stack.extend((c, False) for c in reversed(self.operand_children(e)) if self.needs_binding(c))

    def home_block(self, e: Expr) -> int:
        """The open block ``e`` is bound in, counted from the innermost (-1): the outermost one of its
        ToANormalForm scope (its lines are still open, so the binding lands before the statement being
        printed there) that does not take ``e`` away from a variable it reads (a block's lets, parameters
        or pattern variables: a parenthesised let binds variables without being a scope of its own, and
        a variable bound in two sibling blocks makes a node that reads it in both look shared between
        them); else this one."""
        home, depth = self.home.get(e), len(self.block_scopes)
        outermost = next((back for back in range(depth, 0, -1) if self.block_scopes[-back] is home), 1)
        if outermost == 1:
            return -1  # (this block: the common case, no variable to look at)
        reads, found = set(free_vars(e)), -1
        for back in range(1, outermost + 1):
            if self.block_scopes[-back] is home:
                found = -back
            if not reads.isdisjoint(self.block_binds[-back]):
                break  # (it reads a variable of this block: it cannot leave it)
        return found

    def emit_binding(self, e: Expr) -> None:
        block = self.home_block(e)
        text = self.render(e)
        name = f"%{self.counter}"
        self.counter += 1
        self.emit_lines(f"{name} = ", text, self.type_comment(e) + ";", block)
        self.scopes[block][e] = name

    def emit_lines(self, prefix: str, text: str, suffix: str, block: int = -1) -> None:
        lines = text.split("\n")
        lines[0] = prefix + lines[0]
        lines[-1] = lines[-1] + suffix
        self.out[block].extend(lines)

    def direct(self, e: Expr) -> str:
        """Text for ``e`` written out in place (a let value or a block's result)."""
        text = self.atom(e)
        if text is not None:
            return text
        name = self.lookup(e)
        if name is not None:
            return name
        self.bind_tree(e, include_root=False)
        return self.render(e)

    # --- blocks -----------------------------------------------------------------------------
    def block(self, expr: Expr, scope=None, binds=()) -> list[str]:
        """The lines of a block: its bindings and lets, then its result (lets walked iteratively).
        ``scope``: the block's ToANormalForm scope; a block that is not one of its own (a parenthesised
        let, a primitive function's body) takes the scope its node is bound in; None (no analysis): the
        enclosing block's. ``binds``: the variables it binds besides its lets (parameters, a pattern's):
        a node that reads one of them is printed inside it (home_block)."""
        self.scopes.append({})
        self.out.append([])
        self.block_scopes.append(scope if scope is not None else (self.block_scopes[-1] if self.block_scopes else None))
        lets, chain = set(binds), expr
        while isinstance(chain, Let):
            lets.add(chain.var)
            chain = chain.body
        self.block_binds.append(lets)
        try:
            e = expr
            while isinstance(e, Let) and self.lookup(e) is None:
                value = self.direct(e.value)
                annotation = f": {self.type_str(e.var.type_annotation)}" if e.var.type_annotation else ""
                self.emit_lines(f"let {self.var_name(e.var)}{annotation} = ", value,
                                self.type_comment(e.value) + ";")
                e = e.body
            self.emit_lines("", self.direct(e), self.type_comment(e))
            return self.out[-1]
        finally:
            self.out.pop()
            self.scopes.pop()
            self.block_scopes.pop()
            self.block_binds.pop()

    def render(self, e: Expr) -> str:
        """The text of a non-atomic node whose operands are already bound."""
        if isinstance(e, Call):
            callee = self.operand(e.op)
            if e.type_args:
                callee += "[" + ", ".join(self.type_str(t) for t in e.type_args) + "]"
            items = [self.operand(a) for a in e.args] + _attrs_to_list(e.attrs)
            return f"{callee}({', '.join(items)})"
        if isinstance(e, Tuple):
            fields = [self.operand(f) for f in e.fields]
            return "(" + fields[0] + ",)" if len(fields) == 1 else "(" + ", ".join(fields) + ")"
        if isinstance(e, TupleGetItem):
            value = self.operand(e.tuple_value)
            if isinstance(e.tuple_value, Constant) and e.tuple_value.data.ndim == 0:
                value = f"({value})"  # 0.0 would read as a float
            return f"{value}.{e.index}"
        if isinstance(e, RefCreate):
            return f"ref({self.operand(e.value)})"
        if isinstance(e, RefRead):
            return f"ref_read({self.operand(e.ref)})"
        if isinstance(e, RefWrite):
            return f"ref_write({self.operand(e.ref)}, {self.operand(e.value)})"
        if isinstance(e, If):
            cond = self.operand(e.cond)
            true_scope, false_scope = self.child_scopes.get(e, (None, None))
            lines = [f"if ({cond}) {{", *_indent(self.block(e.true_branch, true_scope)), "} else {",
                     *_indent(self.block(e.false_branch, false_scope)), "}"]
            return "\n".join(lines)
        if isinstance(e, Match):
            lines = [f"match{'' if e.complete else '?'} ({self.operand(e.data)}) {{"]
            arms = self.child_scopes.get(e, (None,) * len(e.clauses))
            for clause, arm in zip(e.clauses, arms):
                lines.append(f"  {self.pattern(clause.lhs)} => {{")
                lines.extend(_indent(_indent(self.block(clause.rhs, arm, pattern_vars(clause.lhs)))))
                lines.append("  },")
            lines.append("}")
            return "\n".join(lines)
        if isinstance(e, Function):
            return self.function(e)
        if isinstance(e, Let):  # a let used as an operand: a parenthesised block
            return "\n".join(["(", *_indent(self.block(e, self.home.get(e))), ")"])
        raise TypeError(f"cannot print {type(e).__name__}")

    def pattern(self, p: Pattern) -> str:
        if isinstance(p, PatternWildcard):
            return "_"
        if isinstance(p, PatternVar):
            ann = p.var.type_annotation
            return self.var_name(p.var) + (f": {self.type_str(ann)}" if ann is not None else "")
        if isinstance(p, PatternConstructor):
            if not p.patterns:
                return p.constructor.name
            return f"{p.constructor.name}({', '.join(self.pattern(s) for s in p.patterns)})"
        if isinstance(p, PatternTuple):
            subs = [self.pattern(s) for s in p.patterns]
            return "(" + subs[0] + ",)" if len(subs) == 1 else "(" + ", ".join(subs) + ")"
        raise TypeError(f"cannot print pattern {type(p).__name__}")

    def signature(self, fn: Function) -> str:
        type_params = ""
        if fn.type_params:
            type_params = "[" + ", ".join(self.tvar_name(tp) for tp in fn.type_params) + "]"
        params = []
        for p in fn.params:
            ann = p.type_annotation
            params.append(self.var_name(p) + (f": {self.type_str(ann)}" if ann is not None else ""))
        params += _attrs_to_list(fn.attrs)
        ret = f" -> {self.type_str(fn.ret_type)}" if fn.ret_type is not None else ""
        return f"{type_params}({', '.join(params)}){ret}"

    def function(self, fn: Function) -> str:
        # (a primitive function is not a scope of ToANormalForm's: its body takes the scope it is bound in)
        scope = self.child_scopes[fn][0] if fn in self.child_scopes else self.home.get(fn)
        return "\n".join([f"fn {self.signature(fn)} {{", *_indent(self.block(fn.body, scope, fn.params)), "}"])

    def top_level(self, expr: Expr) -> list[str]:
        self.out = [[]]
        if isinstance(expr, Function):
            return ["fn " + self.signature(expr) + " {",
                    *_indent(self.block(expr.body, self.analyse(expr.body), expr.params)), "}"]
        return self.block(expr, self.analyse(expr))

    def metadata(self) -> list[str]:
        if not self.constants:
            return []
        entries = []
        for c in self.constants:
            data = c.data
            little = data.astype(data.dtype.newbyteorder("<"), copy=False)
            entries.append({"dtype": data.dtype.name, "shape": list(data.shape),
                            "data": base64.b64encode(little.tobytes()).decode("ascii")})
        return ["#[metadata]", json.dumps({"relay.Constant": entries})]


def expr_to_str(expr: Expr, show_types: bool = False, show_meta_data: bool = False) -> str:
    """An expression in the text format; free variables print by name, without declarations."""
    printer = _Printer(show_types)
    lines = printer.top_level(expr)
    if show_meta_data:
        lines += printer.metadata()
    return "\n".join(lines)


def _type_data_lines(printer: _Printer, tdef) -> list[str]:
    printer.start_function()
    params = ""
    if tdef.type_vars:
        params = "[" + ", ".join(printer.tvar_name(tv) for tv in tdef.type_vars) + "]"
    if not tdef.constructors:
        return [f"extern type {tdef.header.name}{params}"]
    lines = [f"type {tdef.header.name}{params} {{"]
    for ctor in tdef.constructors:
        fields = f"({', '.join(printer.type_str(t) for t in ctor.inputs)})" if ctor.inputs else ""
        lines.append(f"  {ctor.name}{fields},")
    lines.append("}")
    return lines


def pattern_to_str(pattern: Pattern) -> str:
    """A pattern as the text format writes it (``Cons(_, Nil)``)."""
    return _Printer(show_types=False).pattern(pattern)


def module_to_str(mod, show_types: bool = True, show_meta_data: bool = True) -> str:
    """The whole module: version header, type definitions, ``def``s, then the ``#[metadata]`` section."""
    printer = _Printer(show_types, reserved_type_names=[g.name for g in mod.type_definitions])
    lines = [VERSION_HEADER]
    for tdef in mod.type_definitions.values():
        lines += _type_data_lines(printer, tdef)
        lines.append("")
    for gv, fn in mod.functions.items():
        printer.start_function()
        printer.out = [[]]
        header = printer.signature(fn)
        lines.append(f"def @{gv.name}{header} {{")
        lines += _indent(printer.block(fn.body, printer.analyse(fn.body), fn.params))
        lines.append("}")
        lines.append("")
    if lines[-1] == "":
        lines.pop()
    if show_meta_data:
        lines += printer.metadata()
    return "\n".join(lines) + "\n"
