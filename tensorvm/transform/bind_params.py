"""BindParams: bind named parameters of a function (``main`` by default) to constant tensors.

Requires: nothing. ``BindParams({"w": array}, func_name="main")``.

After it, the bound parameters are gone from the function's parameter list and every use of them
is a ``Constant`` (so ``FoldConstant`` can fold what depends only on them). A name that is not a
parameter, or a value whose dtype, rank or static dims disagree with the parameter's annotation,
is a ``TypeInferenceError`` naming the parameter.
"""

from __future__ import annotations

import numpy as np

from ..errors import TypeInferenceError
from ..ir.expr import Constant, Function
from ..ir.module import IRModule
from ..ir.types import TensorType
from .pass_infra import Pass
from .to_anf import TypedMutator

__all__ = ["BindParams", "bind_params"]


def _as_array(value) -> np.ndarray:
    if hasattr(value, "numpy") and callable(value.numpy):
        value = value.numpy()
    return np.asarray(value)


def _check(name: str, ann, array: np.ndarray) -> None:
    if ann is None:
        return
    if not isinstance(ann, TensorType):
        raise TypeInferenceError(f"parameter %{name} has type {ann}; only tensor parameters can be bound")
    if array.dtype.name != ann.dtype or array.ndim != ann.ndim or any(
            isinstance(d, int) and d != s for d, s in zip(ann.shape, array.shape)):
        raise TypeInferenceError(
            f"cannot bind parameter %{name}: expected {ann}, got an array of shape {array.shape} and dtype "
            f"{array.dtype.name}")


def bind_params(fn: Function, params: dict) -> Function:
    by_name = {p.name_hint: p for p in fn.params}
    unknown = [name for name in params if name not in by_name]
    if unknown:
        raise TypeInferenceError(
            f"cannot bind {', '.join(unknown)}: not parameters of the function (it has "
            f"{', '.join('%' + p.name_hint for p in fn.params) or 'none'})")
    mapping = {}
    for name, value in params.items():
        param = by_name[name]
        array = _as_array(value)
        _check(name, param.type_annotation, array)
        mapping[param] = Constant(array).with_type(TensorType(array.shape, array.dtype.name))
    mutator = TypedMutator()
    mutator.memo.update(mapping)
    body = mutator.visit(fn.body)
    remaining = tuple(p for p in fn.params if p not in mapping)
    return Function(remaining, body, fn.ret_type, fn.type_params, fn.attrs, span=fn.span)


class BindParams(Pass):
    name = "BindParams"

    def __init__(self, params: dict, func_name: str = "main"):
        self.params, self.func_name = dict(params or {}), func_name

    def transform_module(self, mod: IRModule) -> IRModule:
        if not self.params:
            return mod
        if self.func_name not in mod:
            raise TypeInferenceError(f"cannot bind parameters of @{self.func_name}: the module has no such function")
        gv = mod.get_global_var(self.func_name)
        functions = dict(mod.functions)
        functions[gv] = bind_params(mod.functions[gv], self.params)
        return mod.with_functions(functions)
