"""The prelude: ``List``, ``Option`` and ``Tree`` with the classic functions over them.

The definitions are Relay text in ``prelude.rly`` (shipped as package data), parsed once.
``prelude_module()`` returns a fresh copy of the parsed module, so callers may add to it.
The helpers below build and read prelude values from Python::

    lst = make_list([np.float32(1), np.float32(2)])   # Cons(1f, Cons(2f, Nil)) as an ADT value
    to_python_list(lst)                               # [array(1., dtype=float32), array(2., ...)]
"""

from __future__ import annotations

import functools
from importlib import resources

from .ir.module import IRModule
from .runtime.object import ADT

__all__ = [
    "PRELUDE_FUNCTIONS", "PRELUDE_TYPES", "prelude_text", "prelude_module", "make_list", "to_python_list",
    "make_some", "make_none", "make_tree", "tree_to_python",
]

PRELUDE_TYPES = ("List", "Option", "Tree")
PRELUDE_FUNCTIONS = (
    "id", "compose", "flip", "hd", "tl", "nth", "update", "map", "foldl", "foldr", "foldr1", "concat",
    "filter", "zip", "rev", "map_accumr", "map_accuml", "unfoldr", "unfoldl", "sum", "length", "all", "any",
    "tmap", "size", "iterate",
)


def prelude_text() -> str:
    """The Relay source of the prelude."""
    return resources.files(__package__).joinpath("prelude.rly").read_text(encoding="utf-8")


@functools.cache
def _parsed_prelude() -> IRModule:
    from .parser import parse  # lazy: the parser itself may include the prelude by default

    return parse(prelude_text(), prelude=False)


def prelude_module() -> IRModule:
    """The prelude's types and functions, as a new module (parsed once, then copied)."""
    return _parsed_prelude().copy()


# --- building and reading prelude values in Python --------------------------------------------------
# Tags are the constructors' positions in their type definitions in prelude.rly.
_CONS, _NIL = 0, 1
_SOME, _NONE = 0, 1
_ROSE = 0


def make_list(values) -> ADT:
    """A prelude ``List`` value holding ``values`` in order (built iteratively, so any length works)."""
    result = ADT(_NIL, (), constructor="Nil")
    for value in reversed(list(values)):
        result = ADT(_CONS, (value, result), constructor="Cons")
    return result


def to_python_list(value) -> list:
    """The elements of a ``List`` value (an ``ADT`` chain of ``Cons`` ending in ``Nil``)."""
    items = []
    while True:
        if not isinstance(value, ADT):
            raise TypeError(f"expected a List value (Cons/Nil), got {type(value).__name__}")
        if value.tag == _NIL and not value.fields:
            return items
        if value.tag != _CONS or len(value.fields) != 2:
            raise TypeError(f"expected a List value (Cons/Nil), got {value!r:.80}")
        items.append(value.fields[0])
        value = value.fields[1]


def make_some(value) -> ADT:
    return ADT(_SOME, (value,), constructor="Some")


def make_none() -> ADT:
    return ADT(_NONE, (), constructor="None")


def make_tree(value, children=()) -> ADT:
    """A rose tree ``Rose(value, [children])``."""
    return ADT(_ROSE, (value, make_list(children)), constructor="Rose")


def tree_to_python(tree) -> tuple:
    """``(value, [child, ...])`` with every child converted the same way."""
    if not isinstance(tree, ADT) or tree.tag != _ROSE or len(tree.fields) != 2:
        raise TypeError(f"expected a Tree value (Rose), got {tree!r:.80}")
    value, children = tree.fields
    return value, [tree_to_python(child) for child in to_python_list(children)]
