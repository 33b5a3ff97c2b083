"""The IR: types, expressions, modules, visitors, structural equality, and the text format."""

from __future__ import annotations

import importlib
import importlib.util

# Names are imported from their submodule when first used (the VM's loader needs ``ir.types`` only).
_LAZY = {
    "all_vars": "analysis",
    "bound_vars": "analysis",
    "called_globals": "analysis",
    "free_vars": "analysis",
    "post_order": "analysis",
    "unmatched_cases": "analysis",
    "Attrs": "attrs",
    "Call": "expr",
    "Clause": "expr",
    "Constant": "expr",
    "Constructor": "expr",
    "Expr": "expr",
    "Function": "expr",
    "GlobalVar": "expr",
    "If": "expr",
    "Let": "expr",
    "Match": "expr",
    "Op": "expr",
    "Pattern": "expr",
    "PatternConstructor": "expr",
    "PatternTuple": "expr",
    "PatternVar": "expr",
    "PatternWildcard": "expr",
    "RefCreate": "expr",
    "RefRead": "expr",
    "RefWrite": "expr",
    "Span": "expr",
    "Tuple": "expr",
    "TupleGetItem": "expr",
    "Var": "expr",
    "const": "expr",
    "is_op_call": "expr",
    "op_name": "expr",
    "ExprFunctor": "functor",
    "ExprMutator": "functor",
    "ExprVisitor": "functor",
    "IRModule": "module",
    "Any": "types",
    "Dim": "types",
    "FuncType": "types",
    "GlobalTypeVar": "types",
    "IncompleteType": "types",
    "RefType": "types",
    "SymDim": "types",
    "TensorType": "types",
    "TupleType": "types",
    "Type": "types",
    "TypeCall": "types",
    "TypeData": "types",
    "TypeVar": "types",
    "is_static_shape": "types",
    "normalize_dtype": "types",
    "scalar_type": "types",
}
__all__ = [*_LAZY, "var"]  # (``from tensorvm.ir import *`` imports them all)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f"{__name__}.{name}")  # a submodule used as an attribute
        raise AttributeError(f"module 'tensorvm.ir' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def var(name: str, type_annotation=None, shape=None, dtype: str = "float32"):
    """A variable; ``var("x", shape=(Any(), 3))`` annotates it with a tensor type."""
    from .expr import Var
    from .types import TensorType

    if type_annotation is None and shape is not None:
        type_annotation = TensorType(tuple(shape), dtype)
    return Var(name, type_annotation)
