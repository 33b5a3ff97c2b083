"""The reference interpreter: walks the IR and runs every construct with the ops' NumPy kernels.

It is the oracle every other executor is checked against, so it is written to be obviously right
rather than fast. It needs no type inference; parameter annotations are used only to check and
convert the arguments given to an entry function. (``create_executor("debug")`` type-checks the module
first, like every other executor; once types are inferred, each kernel's output is checked against them.)

Run-time values:

* tensors are NumPy arrays with their exact dtype (0-d arrays for scalars);
* tuples are Python tuples; ADT values are ``tensorvm.runtime.object.ADT``; references are
  ``RefValue``;
* functions are ``FunctionValue`` (a ``Function`` plus the frame it closed over); a constructor
  used as a value is the ``Constructor`` node, an op used as a value is the ``Op`` node.

Evaluation rules worth knowing:

* **Sharing.** A sub-expression used twice inside one function activation (a DAG edge, printed
  as ``%N = ...``) is evaluated once per activation, like a dataflow graph, at the place
  ``ToANormalForm`` binds it: in the innermost scope (function body, ``if`` branch, ``match`` arm) that
  holds all its uses, just before the first construct of that scope that uses it. The interpreter runs
  each function in that form (``transform.to_anf``, once per function), so a shared node with an effect
  (a ``ref_write``, a call that writes a reference) runs where every executor runs it and where the
  printer writes it, not wherever a branch first happened to reach it.
* **Tail calls.** Let bodies, ``if`` branches, ``match`` right-hand sides and calls of functions
  in tail position continue the evaluation loop instead of recursing, so a tail-recursive loop of
  any length runs in constant Python stack. Other calls recurse in Python (the recursion limit is
  raised while running); exhausting it is an ``ExecutionError``.
* **Ops.** Before an op's kernel runs, its shape function runs on the concrete input shapes (or
  data), so a run-time shape mismatch is a ``ShapeError`` naming the op; the kernel's outputs must
  then have exactly those shapes (anything else is an internal error in the op definition).
* ``let %f = fn (...) { ... %f(...) ... }`` binds ``%f`` recursively (the closure sees itself).
"""

from __future__ import annotations

import numpy as np

from .errors import ExecutionError, ShapeError, TensorVMError
from .ir.expr import (
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
from .ir.module import IRModule
from .ir.types import (
    TensorType,
    TupleType,
)
from .op.registry import get_op
from .runtime.convert import (  # noqa: F401 - (moved there; the VM shares them)
    _NUMPY_DTYPES,
    convert_argument,
    describe_value,
    result_checker,
    substitute_type,
    type_str,
)
from .runtime.object import ADT, RefValue
from .runtime.stack import DEEP_RECURSION_LIMIT, recursion_users

__all__ = [
    "Interpreter", "FunctionValue", "convert_argument", "bind_arguments", "describe_value", "deep_recursion",
]

# Calls outside tail position become Python recursion (about four Python frames per call).
_RECURSION_LIMIT = DEEP_RECURSION_LIMIT


def deep_recursion(limit: int = _RECURSION_LIMIT):
    """Raise Python's recursion limit for the duration (Python-to-Python calls use no C stack in 3.11+).

    Counted across threads (``runtime.stack``): the limit goes back only when no thread still needs it."""
    return recursion_users(limit)


class Frame:
    """One function activation: its variable bindings, the enclosing (captured) frame, and a memo
    of the sub-expressions already evaluated in it (so shared nodes are computed once)."""

    __slots__ = ("bindings", "parent", "memo")

    def __init__(self, bindings: dict | None = None, parent: Frame | None = None):
        self.bindings = bindings if bindings is not None else {}
        self.parent = parent
        self.memo: dict = {}

    def lookup(self, var: Var):
        frame = self
        while frame is not None:
            try:
                return frame.bindings[var]
            except KeyError:
                frame = frame.parent
        raise ExecutionError(f"variable %{var.name_hint} is used but not bound")


class FunctionValue:
    """A function value: a ``Function`` with the frame it closed over (``None`` for globals).

    Calling it from Python checks and converts the arguments against the parameter annotations.
    """

    __slots__ = ("func", "env", "name", "interpreter")

    def __init__(self, func: Function, env: Frame | None, interpreter: Interpreter, name: str = ""):
        self.func, self.env, self.interpreter, self.name = func, env, interpreter, name

    def __call__(self, *args, **kwargs):
        return self.interpreter.call(self, *args, **kwargs)

    def __repr__(self) -> str:
        what = f"@{self.name}" if self.name else "closure"
        return f"FunctionValue({what}, params={len(self.func.params)})"


class Interpreter:
    """Evaluates expressions and global functions of ``mod``.

    ``evaluate("main")`` returns the global as a callable ``FunctionValue``; ``evaluate(expr)``
    evaluates a closed expression; ``run("main", *args)`` checks the arguments against ``@main``'s
    parameter types and runs it.
    """

    def __init__(self, mod: IRModule | None = None):
        if mod is not None and not isinstance(mod, IRModule):
            raise TypeError(f"Interpreter expects an IRModule, got {type(mod).__name__}")
        self.mod = mod if mod is not None else IRModule()
        self._globals: dict[str, FunctionValue] = {}
        self._normal_forms: dict = {}  # id(Function or expression) -> (it, its A-normal form)
        self._param_checks: dict = {}  # id(Function) -> (it, ((index, check), ...) of its statically shaped parameters)
        self._result_checks: dict = {}  # id(Function) -> (it, the check of its result's static dims, or None)

    # --- public API ---------------------------------------------------------------------------
    def evaluate(self, expr_or_global_name: Expr | str = "main"):
        """The value of a global (by name or ``GlobalVar``) or of a closed expression."""
        if isinstance(expr_or_global_name, str):
            return self._global(GlobalVar(expr_or_global_name))
        if not isinstance(expr_or_global_name, Expr):
            raise TypeError(f"evaluate expects an expression or a global name, got {type(expr_or_global_name).__name__}")
        expr = self._normal_form(expr_or_global_name)
        with deep_recursion():
            return self._guarded(lambda: self._value(expr, Frame()))

    def run(self, name: str = "main", *args, **kwargs):
        """Run global ``name`` on Python/NumPy arguments (checked against its parameter types)."""
        return self.call(self._global(GlobalVar(name)), *args, **kwargs)

    def call(self, function, *args, **kwargs):
        """Call a function value on user arguments: bind keywords, check and convert, then apply."""
        if not isinstance(function, FunctionValue):
            raise ExecutionError(f"cannot call {describe_value(function)}: it is not a function")
        where = f"@{function.name}" if function.name else "the closure"
        values = bind_arguments(function.func, args, kwargs, where)
        converted = convert_arguments(function.func, values, where, self.mod)
        with deep_recursion():
            result = self._guarded(lambda: self._apply(function, converted))
        check = result_checker(function.func.ret_type, f"the result of {where}")
        if check is not None:
            check(result)
        return result

    # --- evaluation ---------------------------------------------------------------------------
    def _guarded(self, thunk):
        try:
            return thunk()
        except RecursionError:
            raise ExecutionError(
                "recursion too deep for the reference interpreter: calls outside tail position nest "
                f"more than about {_RECURSION_LIMIT // 4} deep"
            ) from None

    def _global(self, gv: GlobalVar) -> FunctionValue:
        value = self._globals.get(gv.name)
        if value is None:
            if gv not in self.mod:
                names = ", ".join("@" + n for n in self.mod.global_names) or "none"
                raise ExecutionError(f"no global function @{gv.name} in the module (have: {names})")
            value = FunctionValue(self._normal_form(self.mod[gv]), None, self, gv.name)
            self._globals[gv.name] = value
        return value

    def _normal_form(self, expr: Expr) -> Expr:
        """``expr`` in A-normal form (see "Sharing" above), converted once (nested functions included)."""
        known = self._normal_forms.get(id(expr))  # (by identity: hashing a function hashes its whole body)
        if known is None or known[0] is not expr:
            from .transform.to_anf import to_anf

            with deep_recursion():  # (to_anf recurses along a chain of operands)
                known = self._normal_forms[id(expr)] = (expr, to_anf(expr))
        return known[1]

    def _apply(self, function: FunctionValue, args: list):
        frame = self._enter(function, args)
        return self._eval(function.func.body, frame)

    def _enter(self, function: FunctionValue, args: list) -> Frame:
        params = function.func.params
        if len(params) != len(args):
            what = f"@{function.name}" if function.name else "closure"
            raise ExecutionError(f"{what} takes {len(params)} argument(s), got {len(args)}")
        func = function.func
        known = self._param_checks.get(id(func))  # (by identity: hashing a function hashes its whole body)
        if known is None or known[0] is not func:  # (the declared static dims of its parameters, once)
            what = f"@{function.name}" if function.name else "the closure"
            known = self._param_checks[id(func)] = (func, tuple(
                (i, check) for i, p in enumerate(params)
                if (check := result_checker(p.type_annotation, f"{what}'s parameter %{p.name_hint}")) is not None))
        for i, check in known[1]:
            check(args[i])
        return Frame(dict(zip(params, args, strict=True)), function.env)

    def _value(self, expr: Expr, frame: Frame):
        """Evaluate a sub-expression not in tail position, once per activation."""
        kind = type(expr)
        if kind is Var:
            return frame.lookup(expr)
        if kind is Constant:
            return expr.data
        memo = frame.memo
        try:
            return memo[expr]
        except KeyError:
            pass
        value = self._eval(expr, frame)
        memo[expr] = value
        return value

    def _eval(self, expr: Expr, frame: Frame):
        """Evaluate ``expr``; constructs in tail position loop here instead of recursing. The result is checked
        against the declared static dims of every function entered on the way (each check once)."""
        pending = None
        while True:
            kind = type(expr)
            if kind is Let:
                if expr.body is expr.var and not isinstance(expr.value, Function):
                    expr = expr.value  # (``let %x = e; %x``, A-normal form's tail: e stays in tail position)
                    continue
                if isinstance(expr.value, Function):
                    # The closure captures this frame, so binding its name here makes it recursive.
                    frame.bindings[expr.var] = FunctionValue(expr.value, frame, self)
                else:
                    frame.bindings[expr.var] = self._value(expr.value, frame)
                expr = expr.body
            elif kind is If:
                cond = self._value(expr.cond, frame)
                expr = expr.true_branch if _truth(cond) else expr.false_branch
            elif kind is Match:
                expr = self._select_clause(expr, self._value(expr.data, frame), frame)
            elif kind is Call and not isinstance(expr.op, (Op, Constructor)):
                callee = self._value(expr.op, frame)
                args = [self._value(a, frame) for a in expr.args]
                if not isinstance(callee, FunctionValue):
                    return _checked(self._apply_other(callee, args), pending)
                frame = self._enter(callee, args)
                check = self._result_check(callee)
                if check is not None:
                    pending = pending or {}
                    pending[id(check)] = check
                expr = callee.func.body
            else:
                return _checked(self._eval_leaf(expr, frame), pending)

    def _result_check(self, function: FunctionValue):
        """The check of ``function``'s result against the static dims of its return annotation, or None."""
        func = function.func
        known = self._result_checks.get(id(func))  # (by identity, as _param_checks)
        if known is None or known[0] is not func:
            what = f"@{function.name}" if function.name else "the closure"
            known = self._result_checks[id(func)] = (func, result_checker(func.ret_type, f"the result of {what}"))
        return known[1]

    def _eval_leaf(self, expr: Expr, frame: Frame):
        kind = type(expr)
        if kind is Call:  # an op call or a constructor application
            args = [self._value(a, frame) for a in expr.args]
            if isinstance(expr.op, Constructor):
                return self._apply_other(expr.op, args)
            return run_op(expr.op.name, expr.attrs, args, expr)
        if kind is Var:
            return frame.lookup(expr)
        if kind is Constant:
            return expr.data
        if kind is GlobalVar:
            return self._global(expr)
        if kind is Function:
            return FunctionValue(expr, frame, self)
        if kind is Tuple:
            return tuple([self._value(f, frame) for f in expr.fields])
        if kind is TupleGetItem:
            value = self._value(expr.tuple_value, frame)
            if not isinstance(value, tuple):
                raise ExecutionError(f"projection .{expr.index} of {describe_value(value)}: expected a tuple")
            if not 0 <= expr.index < len(value):
                raise ExecutionError(f"projection .{expr.index} out of range for a tuple of {len(value)} field(s)")
            return value[expr.index]
        if kind is Constructor:
            # A nullary constructor used as a value is the ADT value itself (``Nil``).
            return ADT(expr.tag, (), constructor=expr.name) if not expr.inputs else expr
        if kind is Op:
            return expr
        if kind is RefCreate:
            return RefValue(self._value(expr.value, frame))
        if kind is RefRead:
            return _expect_ref(self._value(expr.ref, frame)).value
        if kind is RefWrite:
            ref = _expect_ref(self._value(expr.ref, frame))
            ref.value = self._value(expr.value, frame)
            return ()
        raise ExecutionError(f"the interpreter cannot evaluate a {kind.__name__} node")

    def _apply_other(self, callee, args: list):
        """Apply a callee that is not a closure: a constructor or an op used as a value."""
        if isinstance(callee, Constructor):
            if len(args) != len(callee.inputs):
                raise ExecutionError(f"constructor {callee.name} takes {len(callee.inputs)} field(s), got {len(args)}")
            return ADT(callee.tag, tuple(args), constructor=callee.name)
        if isinstance(callee, Op):
            return run_op(callee.name, {}, args, None)
        if isinstance(callee, ADT) and not callee.fields:
            raise ExecutionError(f"constructor {callee.constructor or callee.tag} takes no arguments")
        raise ExecutionError(f"cannot call {describe_value(callee)}: it is not a function")

    # --- match --------------------------------------------------------------------------------
    def _select_clause(self, match: Match, data, frame: Frame) -> Expr:
        for clause in match.clauses:
            bindings: dict = {}
            if _match_pattern(clause.lhs, data, bindings):
                frame.bindings.update(bindings)
                return clause.rhs
        raise ExecutionError(f"match: no clause matches the value {describe_value(data)}")


def _checked(value, pending: dict | None):
    if pending:
        for check in pending.values():
            check(value)
    return value


def _match_pattern(pattern, value, bindings: dict) -> bool:
    if isinstance(pattern, PatternWildcard):
        return True
    if isinstance(pattern, PatternVar):
        bindings[pattern.var] = value
        return True
    if isinstance(pattern, PatternConstructor):
        if not isinstance(value, ADT) or value.tag != pattern.constructor.tag:
            return False
        if len(value.fields) != len(pattern.patterns):
            raise ExecutionError(
                f"match: constructor {pattern.constructor.name} pattern has {len(pattern.patterns)} field(s), "
                f"the value has {len(value.fields)}"
            )
        return all(_match_pattern(p, f, bindings) for p, f in zip(pattern.patterns, value.fields, strict=True))
    if isinstance(pattern, PatternTuple):
        if not isinstance(value, tuple) or len(value) != len(pattern.patterns):
            return False
        return all(_match_pattern(p, f, bindings) for p, f in zip(pattern.patterns, value, strict=True))
    raise ExecutionError(f"match: unknown pattern {type(pattern).__name__}")


def _truth(cond) -> bool:
    if not isinstance(cond, np.ndarray) or cond.ndim != 0:
        raise ExecutionError(f"if: the condition must be a rank-0 tensor, got {describe_value(cond)}")
    return bool(cond)


def _expect_ref(value) -> RefValue:
    if not isinstance(value, RefValue):
        raise ExecutionError(f"expected a reference, got {describe_value(value)}")
    return value


# --- ops ------------------------------------------------------------------------------------------
def run_op(name: str, attrs, args: list, call: Call | None = None):
    """Run op ``name``: normalize attrs, run its shape function, run its kernel, check the shapes."""
    opdef = get_op(name)
    if opdef.num_inputs >= 0 and len(args) != opdef.num_inputs:
        raise ExecutionError(f"{name} takes {opdef.num_inputs} argument(s), got {len(args)}")
    for index, arg in enumerate(args):
        if not _is_tensor_or_tensors(arg):
            raise ExecutionError(f"{name}: argument {index} must be a tensor or a tuple of tensors, "
                                 f"got {describe_value(arg)}")
    attrs = opdef.normalize_attrs(attrs)
    expected_shapes = None
    if opdef.shape_func is not None:
        shape_args = [_shape_func_input(opdef, i, a) for i, a in enumerate(args)]
        try:
            expected_shapes = [tuple(int(d) for d in s) for s in opdef.shape_func(attrs, shape_args)]
        except ShapeError as err:
            if name in str(err):
                raise
            raise ShapeError(f"{name}: {err}") from err
        except TensorVMError:
            raise
        except Exception as err:  # a shape function that fails on bad input is a shape error too
            raise ShapeError(f"{name}: the shape function rejected inputs {_describe_args(args)}: "
                             f"{type(err).__name__}: {err}") from err
    try:
        result = opdef.kernel(attrs, *args)
    except TensorVMError:
        raise
    except Exception as err:
        raise ExecutionError(f"{name}: kernel failed on {_describe_args(args)}: {type(err).__name__}: {err}") from err
    result = _as_value(result)
    outputs = list(result) if isinstance(result, tuple) else [result]
    if expected_shapes is not None:
        actual = [tuple(o.shape) for o in outputs]
        if actual != expected_shapes:
            raise ExecutionError(
                f"internal error in op {name}: the kernel returned shapes {actual} but the shape function "
                f"computed {expected_shapes} for inputs {_describe_args(args)}"
            )
    if call is not None:
        _check_against_type(name, call, outputs)
    return result


def _is_tensor_or_tensors(value) -> bool:
    if isinstance(value, tuple):
        return all(isinstance(v, np.ndarray) for v in value)
    return isinstance(value, np.ndarray)


def _shape_func_input(opdef, index: int, value):
    if opdef.input_needs_data(index):
        return value
    if isinstance(value, tuple):
        return [tuple(v.shape) for v in value]
    return tuple(value.shape)


def _as_value(result):
    if isinstance(result, (tuple, list)):
        return tuple(_as_value(r) for r in result)
    return np.asarray(result)


def _check_against_type(name: str, call: Call, outputs: list) -> None:
    """When type inference ran, the kernel's outputs must fit the inferred type (dtype, static dims)."""
    ty = getattr(call, "_checked_type", None)
    if ty is None:
        return
    types = list(ty.fields) if isinstance(ty, TupleType) else [ty]
    if len(types) != len(outputs) or not all(isinstance(t, TensorType) for t in types):
        return
    for out, t in zip(outputs, types, strict=True):
        if out.dtype != _NUMPY_DTYPES.get(t.dtype) or out.ndim != len(t.shape):
            raise ExecutionError(
                f"internal error in op {name}: the kernel returned {describe_value(out)} but type inference "
                f"says {type_str(t)}"
            )
        if not all(not isinstance(d, int) or d == n for d, n in zip(t.shape, out.shape, strict=True)):
            # (gradual typing: a ``?`` dim unified with a declared static one, which the value misses)
            raise ShapeError(
                f"op {name}: its result is {describe_value(out)}, but the program's types say {type_str(t)} (a "
                f"dim unknown until run time met a declared static one, and differs from it)"
            )


# --- arguments ------------------------------------------------------------------------------------
def bind_arguments(func: Function, args, kwargs, where: str) -> list:
    """Positional plus keyword (by parameter name) arguments, in parameter order."""
    params = func.params
    if len(args) > len(params):
        raise ExecutionError(f"{where} takes {len(params)} argument(s), got {len(args)}")
    values = list(args) + [_MISSING] * (len(params) - len(args))
    for key, value in kwargs.items():
        matches = [i for i, p in enumerate(params) if p.name_hint == key]
        if not matches:
            names = ", ".join("%" + p.name_hint for p in params) or "none"
            raise ExecutionError(f"{where} has no parameter named {key!r} (parameters: {names})")
        if len(matches) > 1:
            raise ExecutionError(f"{where} has several parameters named {key!r}; pass them by position")
        if values[matches[0]] is not _MISSING:
            raise ExecutionError(f"{where}: parameter %{key} is given twice")
        values[matches[0]] = value
    missing = [params[i].name_hint for i, v in enumerate(values) if v is _MISSING]
    if missing:
        raise ExecutionError(f"{where}: missing argument(s) for " + ", ".join("%" + m for m in missing))
    return values


_MISSING = object()


def convert_arguments(func: Function, values: list, where: str, mod: IRModule | None = None) -> list:
    """Check user arguments against ``func``'s parameter annotations and convert them to run-time values.

    Symbolic dimensions (``n``) must agree across all parameters.
    """
    symbols: dict = {}
    return [convert_argument(v, p.type_annotation, f"{where}: parameter %{p.name_hint}", mod, symbols)
            for p, v in zip(func.params, values, strict=True)]


def _describe_args(args: list) -> str:
    return "(" + ", ".join(describe_value(a) for a in args) + ")"
