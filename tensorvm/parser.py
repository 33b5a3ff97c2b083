"""``tv.parse``: Relay text to an ``IRModule``, checked against the op registry and the prelude.

Unknown operators are rejected, every op call's attributes are validated by the op's definition
(the call keeps the attributes as written, so printing round-trips), and names the text does not
define but the prelude does (``List``, ``Cons``, ``@map``, ...) are resolved against the prelude,
whose definitions the program uses are copied into the result.
"""

from __future__ import annotations

from .errors import AttrError, ParseError
from .ir.analysis import post_order
from .ir.expr import Call, Op
from .ir.module import IRModule
from .ir.parser import parse_expr, parse_module, parse_type

__all__ = ["parse", "parse_expr", "parse_type", "prelude_or_none"]


def prelude_or_none() -> IRModule | None:
    """The prelude module, or None while ``tensorvm.prelude`` is not available."""
    try:
        from .prelude import prelude_module
    except ImportError:
        return None
    return prelude_module()


def _check_attrs(mod: IRModule, functions, source_name: str) -> None:
    from .op import get_op

    for gv in functions:
        for node in post_order(mod[gv]):
            if isinstance(node, Call) and isinstance(node.op, Op):
                try:
                    get_op(node.op.name).normalize_attrs(node.attrs)
                except AttrError as err:
                    span = node.span
                    raise ParseError(str(err), span.line if span else 0, span.column if span else 0,
                                     source_name) from None


def parse(text: str, meta=None, source_name: str = "<string>", prelude: bool = True) -> IRModule:
    """Parse a program in the text format.

    ``meta`` gives the constants ``meta[relay.Constant][i]`` refers to (a list of arrays or
    ``{"relay.Constant": [...]}``) when the text has no ``#[metadata]`` section.
    """
    from . import op

    init_module = prelude_or_none() if prelude else None
    mod = parse_module(text, source_name=source_name, meta=meta, init_module=init_module,
                       known_op=op.is_registered)
    # Definitions copied from the prelude were checked when the prelude was parsed.
    own = [gv for gv in mod.functions
           if init_module is None or gv not in init_module.functions or mod[gv] is not init_module[gv]]
    _check_attrs(mod, own, source_name)
    return mod
