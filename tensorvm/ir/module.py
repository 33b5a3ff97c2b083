"""``IRModule``: the global functions and ADT definitions of one program."""

from __future__ import annotations

from .expr import Constructor, Expr, Function, GlobalVar
from .types import GlobalTypeVar, TypeData

__all__ = ["IRModule"]


class IRModule:
    """A mapping of global names to functions plus ADT definitions.

    Passes treat a module as a value: they return a new module and never mutate their input.
    Building a module (``add``, ``add_type``, ``mod["f"] = fn``) mutates it in place.
    """

    def __init__(self, functions: dict | None = None, type_definitions: dict | None = None):
        self.functions: dict[GlobalVar, Function] = {}
        self.type_definitions: dict[GlobalTypeVar, TypeData] = {}
        for tdef in (type_definitions or {}).values():
            self.add_type(tdef)
        for gv, fn in (functions or {}).items():
            self.add(gv, fn)

    # --- building -------------------------------------------------------------------------------
    @classmethod
    def from_expr(cls, expr: Expr, functions: dict | None = None, type_definitions: dict | None = None) -> IRModule:
        """A module whose ``main`` is ``expr`` (wrapped in a function of its free variables if needed)."""
        mod = cls(functions, type_definitions)
        if not isinstance(expr, Function):
            from .analysis import free_vars

            expr = Function(tuple(free_vars(expr)), expr)
        mod.add("main", expr)
        return mod

    def add(self, name: str | GlobalVar, func: Function) -> GlobalVar:
        if not isinstance(func, Function):
            raise TypeError(f"a global must be a Function, got {type(func).__name__}")
        gv = name if isinstance(name, GlobalVar) else GlobalVar(name)
        self.functions[gv] = func
        return gv

    def __setitem__(self, name: str | GlobalVar, func: Function) -> None:
        self.add(name, func)

    def add_type(self, tdef: TypeData) -> GlobalTypeVar:
        for ctor in tdef.constructors:
            other = self.find_constructor(ctor.name)
            if other is not None and other.belong_to != tdef.header:
                raise ValueError(f"constructor {ctor.name} is already defined by type {other.belong_to.name}")
        self.type_definitions[tdef.header] = tdef
        return tdef.header

    def update(self, other: IRModule) -> None:
        for tdef in other.type_definitions.values():
            self.add_type(tdef)
        for gv, fn in other.functions.items():
            self.functions[gv] = fn

    def copy(self) -> IRModule:
        mod = IRModule()
        mod.functions = dict(self.functions)
        mod.type_definitions = dict(self.type_definitions)
        return mod

    def with_functions(self, functions: dict) -> IRModule:
        """A new module with these functions and this module's type definitions."""
        mod = IRModule()
        mod.type_definitions = dict(self.type_definitions)
        mod.functions = dict(functions)
        return mod

    # --- lookup ---------------------------------------------------------------------------------
    def get_global_var(self, name: str) -> GlobalVar:
        gv = GlobalVar(name)
        if gv not in self.functions:
            raise KeyError(f"no global function @{name}; have {', '.join('@' + g.name for g in self.functions)}")
        return gv

    def __getitem__(self, name: str | GlobalVar) -> Function:
        gv = name if isinstance(name, GlobalVar) else GlobalVar(name)
        try:
            return self.functions[gv]
        except KeyError:
            raise KeyError(f"no global function @{gv.name}") from None

    def __contains__(self, name: str | GlobalVar) -> bool:
        gv = name if isinstance(name, GlobalVar) else GlobalVar(name)
        return gv in self.functions

    def get_global_type_var(self, name: str) -> GlobalTypeVar:
        gtv = GlobalTypeVar(name)
        if gtv not in self.type_definitions:
            raise KeyError(f"no type {name}")
        return gtv

    def get_type(self, name: str) -> TypeData:
        return self.type_definitions[self.get_global_type_var(name)]

    def find_constructor(self, name: str) -> Constructor | None:
        for tdef in self.type_definitions.values():
            for ctor in tdef.constructors:
                if ctor.name == name:
                    return ctor
        return None

    def constructor(self, name: str) -> Constructor:
        """The constructor ``name``; calling it on run-time values builds an ADT argument."""
        ctor = self.find_constructor(name)
        if ctor is None:
            raise KeyError(f"no constructor {name}")
        return ctor

    @property
    def global_names(self) -> list[str]:
        return [gv.name for gv in self.functions]

    def __iter__(self):
        return iter(self.functions.items())

    def __len__(self) -> int:
        return len(self.functions)

    def __str__(self) -> str:
        from .printer import module_to_str

        return module_to_str(self)

    def astext(self, show_types: bool = True) -> str:
        from .printer import module_to_str

        return module_to_str(self, show_types=show_types)

    __repr__ = __str__
