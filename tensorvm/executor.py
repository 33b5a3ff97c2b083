"""``create_executor``: one front door to every way of running a module.

    ex = tv.create_executor("debug", mod, params={"w": w})
    f = ex.evaluate()            # @main as a Python callable
    out = f(x, y=y)              # positional or by parameter name

Kinds: ``"debug"`` (the reference interpreter), ``"vm"`` (``tensorvm.vm``), ``"graph"`` (the graph
executor, static programs) and ``"aot"`` (generated C run function, static programs). Results are
converted for users: tensors become ``NDArray``, tuples Python tuples (recursively), ADT values ``ADT``
with converted fields; closures stay opaque.
``params`` binds parameters of ``@main`` by name as constants (they disappear from its signature;
``tensorvm.transform.bind_params`` checks them, so every kind reports a bad param the same way).
"""

from __future__ import annotations

import numpy as np

from .errors import ExecutionError, UnsupportedError
from .interpreter import FunctionValue, Interpreter, bind_arguments
from .ir.expr import Constant, Expr, Function, GlobalVar
from .ir.module import IRModule
from .runtime.convert import Node, rebuild
from .runtime.ndarray import NDArray
from .runtime.object import ADT
from .transform.bind_params import bind_params
from .transform.infer_type import infer_expr, infer_type

__all__ = ["create_executor", "Executor", "DebugExecutor", "VMExecutor", "to_user_value"]

EXECUTOR_KINDS = ("debug", "vm", "graph", "aot")


def create_executor(kind: str = "debug", mod: IRModule | None = None, device=None, target: str | None = None,
                    params: dict | None = None) -> Executor:
    """An executor of ``kind`` for ``mod``. ``device`` is accepted for API compatibility (CPU only).
    ``target`` (for "vm" and "graph"): "c" or "python"; by default "c" when a C compiler is found
    (``tensorvm.codegen.build.default_target``)."""
    mod = mod if mod is not None else IRModule()
    if not isinstance(mod, IRModule):
        raise TypeError(f"create_executor expects an IRModule, got {type(mod).__name__}")
    if kind == "debug":
        return DebugExecutor(mod, params)
    if target is None and kind in ("vm", "graph"):
        from .codegen.build import default_target

        target = default_target()
    if kind == "vm":
        return VMExecutor(mod, target, params)
    if kind == "graph":
        from .graph.build import GraphExecutor  # lazy: the graph layer depends on everything else

        return GraphExecutor(mod, target, params)
    if kind == "aot":
        from .aot.loader import AOTExecutor  # lazy: the AOT layer depends on everything else

        return AOTExecutor(mod, target, params)
    raise UnsupportedError(f"unknown executor kind {kind!r}; expected one of {', '.join(EXECUTOR_KINDS)}")


class Executor:
    """Base class: ``evaluate(expr=None)`` gives ``@main`` (or a function) as a callable, or a value."""

    def __init__(self, mod: IRModule, params: dict | None):
        self.mod = mod
        self.params = dict(params or {})
        if self.params:
            if "main" not in mod:
                raise ExecutionError("params were given but the module has no @main to bind them to")
            self.mod = mod.copy()
            self.mod.add("main", bind_params(mod["main"], self.params))

    def evaluate(self, expr: Expr | str | None = None):
        """``None`` or a global (name or ``GlobalVar``): a callable; a ``Function``: a callable;
        any other expression: its value."""
        if expr is None:
            expr = "main"
        if isinstance(expr, GlobalVar):
            expr = expr.name
        if isinstance(expr, str):
            return self._make_callable(expr, self.mod[expr] if expr in self.mod else None)
        if isinstance(expr, Function):
            return self._make_callable(None, expr)
        if isinstance(expr, Constant):
            return to_user_value(expr.data)
        if isinstance(expr, Expr):
            return self._make_callable(None, Function((), expr))()
        raise TypeError(f"evaluate expects an expression, a global name or None, got {type(expr).__name__}")

    def _make_callable(self, name: str | None, func: Function | None):  # pragma: no cover - abstract
        raise NotImplementedError


class DebugExecutor(Executor):
    """Runs on the reference interpreter, after type-checking the program as every other executor
    does (TVM's debug executor too), so an ill-typed program is rejected here as well rather than
    run; the inferred types also let the interpreter check every kernel's output against them."""

    def __init__(self, mod: IRModule, params: dict | None = None):
        super().__init__(mod, params)
        self.interpreter = Interpreter(self.mod)
        self._module_checked = False

    def _type_check(self, func: Function | None) -> None:
        if func is None or func in self.mod.functions.values():
            if not self._module_checked:
                infer_type(self.mod)  # annotates the module's nodes in place
                self._module_checked = True
        else:
            infer_expr(func, self.mod)

    def _make_callable(self, name, func):
        self._type_check(func)
        if name is not None:
            function = self.interpreter.evaluate(name)
        else:
            function = self.interpreter.evaluate(func)

        def run(*args, **kwargs):
            return to_user_value(function(*args, **kwargs))

        run.__name__ = name or "function"
        return run


class CompiledExecutor(Executor):
    """An executor that builds ``@main`` once per entry function and calls the built program.

    Subclasses set ``kind`` and implement ``_build(mod) -> call``, where ``call(names, values)`` runs
    the built ``@main`` on the values of its parameters named ``names`` (those not bound as params).
    The build binds ``build_params`` itself (as constants, graph params or linked C arrays).
    """

    kind = ""

    def __init__(self, mod: IRModule, target: str = "python", params: dict | None = None):
        super().__init__(mod, None)
        self.target, self.build_params = target, dict(params or {})
        self._cache: dict = {}

    def _build(self, mod: IRModule):  # pragma: no cover - abstract
        raise NotImplementedError

    def _make_callable(self, name, func):
        if name is not None and name != "main":
            raise UnsupportedError(f"the {self.kind} executor runs @main only, not @{name}")
        if name is None:  # run an expression as the entry of a copy of the module
            mod = self.mod.copy()
            mod.add("main", func)
        else:
            if "main" not in self.mod:
                raise ExecutionError("the module has no @main")
            mod, func = self.mod, self.mod["main"]
        key = id(func)
        if key not in self._cache:
            self._cache[key] = (func, self._build(mod))
        _, call = self._cache[key]
        remaining = [p for p in func.params if p.name_hint not in self.build_params]
        names = [p.name_hint for p in remaining]
        signature = Function(tuple(remaining), func.body)

        def run(*args, **kwargs):
            values = bind_arguments(signature, args, kwargs, "@main")
            return to_user_value(call(names, values))

        run.__name__ = "main"
        return run


class VMExecutor(CompiledExecutor):
    """Compiles with ``tensorvm.vm.compile`` and runs on the ``VirtualMachine``."""

    kind = "VM"

    def _build(self, mod: IRModule):
        from . import vm as tvm_vm  # lazy: the VM layer depends on everything else

        machine = tvm_vm.VirtualMachine(tvm_vm.compile(mod, target=self.target, params=self.build_params or None))
        return lambda names, values: machine["main"](*values)


def to_user_value(value):
    """Convert a run-time value for users: arrays to ``NDArray``, tuples and ADT fields (``rebuild``: no
    recursion, whatever the value's depth)."""
    return _to_user(value)


def _to_user(value):
    return rebuild(value, _user_step)


def _user_step(value):
    """One value of ``_to_user``'s walk (``rebuild``: a list of any length, no recursion)."""
    if isinstance(value, NDArray):
        return value
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        # Constants are read-only and kernels may return views of them: hand out writable arrays.
        return NDArray(array if array.flags.writeable else array.copy())
    if isinstance(value, tuple):
        return Node(value, tuple)
    if isinstance(value, ADT):
        tag, constructor = value.tag, value.constructor
        return Node(value.fields, lambda fields: ADT(tag, tuple(fields), constructor=constructor))
    if isinstance(value, FunctionValue) and not isinstance(value, _UserFunctionValue):
        return _UserFunctionValue(value.func, value.env, value.interpreter, value.name)
    return value  # VM closures and references stay opaque


class _UserFunctionValue(FunctionValue):
    """A closure the debug executor returned: called from Python, it gives user values as the executor's own
    callables do (NDArrays), and it passes back into the interpreter as the closure it is."""

    __slots__ = ()

    def __call__(self, *args, **kwargs):
        return to_user_value(self.interpreter.call(self, *args, **kwargs))
