"""Pass infrastructure: a pass maps an ``IRModule`` to a new ``IRModule`` and never mutates its input.

``Sequential`` runs a literal list of passes, skipping those whose ``opt_level`` exceeds the
requested level; ``module_pass``/``function_pass`` turn plain functions into passes.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir import Function, IRModule

__all__ = ["Pass", "ModulePass", "FunctionPass", "BodyRewritePass", "Sequential", "module_pass", "function_pass"]


class Pass:
    name: str = "Pass"
    opt_level: int = 0
    required: tuple = ()

    def __call__(self, mod: IRModule) -> IRModule:
        return self.transform_module(mod)

    def transform_module(self, mod: IRModule) -> IRModule:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{self.name}(opt_level={self.opt_level})"


class ModulePass(Pass):
    def __init__(self, fn: Callable[[IRModule], IRModule], name: str, opt_level: int = 0):
        self.fn, self.name, self.opt_level = fn, name, opt_level

    def transform_module(self, mod: IRModule) -> IRModule:
        return self.fn(mod)


class FunctionPass(Pass):
    """Applies ``fn(func, mod) -> func`` to every global function (primitive ones included)."""

    def __init__(self, fn: Callable[[Function, IRModule], Function], name: str, opt_level: int = 0):
        self.fn, self.name, self.opt_level = fn, name, opt_level

    def transform_module(self, mod: IRModule) -> IRModule:
        return mod.with_functions({gv: self.fn(f, mod) for gv, f in mod.functions.items()})


class BodyRewritePass(Pass):
    """Rewrites the body of every non-primitive global with a fresh ``rewriter()`` (an ExprMutator);
    primitive functions are left as they are, and a function whose body did not change is kept."""

    rewriter: type

    def transform_module(self, mod: IRModule) -> IRModule:
        from .to_anf import rebuild_function  # lazy: to_anf builds on this module

        functions = {}
        for gv, fn in mod.functions.items():
            body = fn.body if fn.is_primitive else self.rewriter().visit(fn.body)
            functions[gv] = fn if body is fn.body else rebuild_function(fn, body)
        return mod.with_functions(functions)


class Sequential(Pass):
    def __init__(self, passes, opt_level: int = 3, name: str = "Sequential"):
        self.passes, self.level, self.name = list(passes), opt_level, name

    def transform_module(self, mod: IRModule) -> IRModule:
        for p in self.passes:
            if p.opt_level <= self.level:
                mod = p(mod)
        return mod


def module_pass(fn=None, *, name: str | None = None, opt_level: int = 0):
    def wrap(f):
        return ModulePass(f, name or f.__name__, opt_level)

    return wrap(fn) if fn is not None else wrap


def function_pass(fn=None, *, name: str | None = None, opt_level: int = 0):
    def wrap(f):
        return FunctionPass(f, name or f.__name__, opt_level)

    return wrap(fn) if fn is not None else wrap
