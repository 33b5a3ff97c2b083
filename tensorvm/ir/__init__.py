"""The IR: types, expressions, modules, visitors, structural equality, and the text format."""

from .analysis import all_vars, bound_vars, called_globals, free_vars, post_order  # noqa: F401
from .attrs import Attrs  # noqa: F401
from .expr import (  # noqa: F401
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
    Pattern,
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
    const,
)
from .functor import ExprFunctor, ExprMutator, ExprVisitor  # noqa: F401
from .module import IRModule  # noqa: F401
from .types import (  # noqa: F401
    Any,
    Dim,
    FuncType,
    GlobalTypeVar,
    IncompleteType,
    RefType,
    SymDim,
    TensorType,
    TupleType,
    Type,
    TypeCall,
    TypeData,
    TypeVar,
    is_static_shape,
    normalize_dtype,
    scalar_type,
)


def var(name: str, type_annotation=None, shape=None, dtype: str = "float32") -> Var:
    """A variable; ``var("x", shape=(Any(), 3))`` annotates it with a tensor type."""
    if type_annotation is None and shape is not None:
        type_annotation = TensorType(tuple(shape), dtype)
    return Var(name, type_annotation)
