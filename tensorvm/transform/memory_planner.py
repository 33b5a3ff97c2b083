"""Static memory planning for the graph executor and AOT: a static program's tensor lifetimes, and the
lowering that yields them.

* ``static_lifetimes(func)`` derives ``TensorLifetime`` records from a fused, A-normal-form, fully static
  function (the graph/AOT lowering: FuseOps + ToANF + LambdaLift): one step per kernel call, in
  execution order. ``lower_static(mod, params)`` runs that lowering (the VM passes up to, not
  including, ManifestAlloc) and ``static_schedule(func)`` gives the kernel calls over named tensors
  that both the graph JSON writer and the AOT emitter walk. A dynamic dim, control flow, a closure,
  a call of a non-primitive function or an ADT is refused (``UnsupportedError``, pointing to the VM).
* ``plan_memory`` places the records in one workspace; it is the runtime's
  (``tensorvm.runtime.placement``: the VM plans its specialized arenas with it at run time) and is
  re-exported here with its records and algorithms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedError
from ..runtime.placement import (
    INPUT,
    INTERMEDIATE,
    OUTPUT,
    PARAM,
    PLANNER_ALGORITHMS,
    MemoryPlanError,
    StaticMemoryPlan,
    TensorLifetime,
    plan_memory,
)

__all__ = [
    "TensorLifetime",
    "StaticMemoryPlan",
    "plan_memory",
    "PLANNER_ALGORITHMS",
    "MemoryPlanError",
    "static_lifetimes",
    "lower_static",
    "LoweredStep",
    "static_schedule",
    "StaticSchedule",
    "ScheduledTensor",
]

# --- the static schedule of a lowered function --------------------------------------------------
@dataclass(frozen=True)
class ScheduledTensor:
    """One tensor of a static schedule: its shape, dtype, size and role."""

    name: str
    shape: tuple
    dtype: str
    kind: str  # input | param | intermediate | output (an intermediate the function returns)
    alias_of: str | None = None  # the tensor a reshape-only step views

    @property
    def size_bytes(self) -> int:
        return _num_elements(self.shape) * _itemsize(self.dtype)


@dataclass(frozen=True)
class LoweredStep:
    """One kernel call of a static schedule, in execution order."""

    index: int
    func_name: str  # the primitive global (``fused_...``)
    inputs: tuple  # tensor names, tuple arguments flattened
    outputs: tuple  # tensor names, tuple results flattened
    reshape_only: bool = False  # the output views the single input (``__nop`` in the graph JSON)


@dataclass
class StaticSchedule:
    """A fused static function as a flat list of kernel calls over named tensors.

    ``inputs`` are the flattened parameters (a tuple parameter ``%t`` gives ``t.0``, ``t.1``, ...;
    ``input_structure`` rebuilds the tree), ``params`` the constants (name -> array), ``outputs``
    the flattened result (``output_structure`` is its tree of indices into ``outputs``).
    """

    tensors: dict  # name -> ScheduledTensor
    steps: list
    inputs: list
    params: dict
    outputs: list
    input_structure: dict  # parameter name -> tree of input names (a str for a tensor parameter)
    output_structure: object  # an int index into outputs, or a tuple of such trees
    primitives: dict  # func_name -> primitive Function

    def lifetimes(self) -> list:
        """The ``TensorLifetime`` of every tensor, one step per kernel call."""
        first, last = {}, {}
        end = len(self.steps)
        for name in list(self.inputs) + list(self.params):
            first[name], last[name] = 0, 0
        for step in self.steps:
            for name in step.inputs:
                last[name] = max(last.get(name, step.index), step.index)
            for name in step.outputs:
                first[name] = step.index
                last[name] = max(last.get(name, step.index), step.index)
        result = []
        for name, tensor in self.tensors.items():
            kind = tensor.kind
            lo, hi = first.get(name, 0), last.get(name, 0)
            if kind in (INPUT, PARAM, OUTPUT):
                lo, hi = 0, end  # never overwritten: live for the whole run
            result.append(TensorLifetime(name, tensor.size_bytes, lo, hi, tensor.alias_of, kind))
        return result


def _num_elements(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


_VM_HINT = 'run it on the VM instead (tv.vm.compile(mod) or tv.create_executor("vm", mod))'


def _refuse(what: str) -> UnsupportedError:
    return UnsupportedError(f"static planning needs a program with static shapes and no control flow, "
                            f"closures or ADTs, but {what}; {_VM_HINT}")


def _static_tensor_types(ty, where: str) -> list:
    from ..ir.types import TensorType, TupleType

    if isinstance(ty, TensorType):
        if not all(isinstance(d, int) for d in ty.shape):
            raise _refuse(f"{where} has the dynamic type Tensor[{ty.shape}, {ty.dtype}]")
        return [ty]
    if isinstance(ty, TupleType):
        return [t for i, f in enumerate(ty.fields) for t in _static_tensor_types(f, f"{where}.{i}")]
    raise _refuse(f"{where} has type {ty!r} (only tensors and tuples of tensors are static)")


def static_schedule(func, mod=None) -> StaticSchedule:
    """The kernel calls of a fused, A-normal-form, static function (``mod`` resolves ``@fused_...``).

    ``func`` may also be an ``IRModule`` (its ``main`` is used). Raises ``UnsupportedError`` naming
    the construct (a dynamic dim, an ``if``, a ``match``, a closure, a call of a non-primitive
    function, an ADT) and pointing to the VM.
    """
    from ..ir.expr import Call, Constant, Function, GlobalVar, Tuple, TupleGetItem, Var
    from ..ir.module import IRModule
    from .to_anf import flatten_lets, known_type

    if isinstance(func, IRModule):
        mod, func = func, func["main"]
    if not isinstance(func, Function):
        raise MemoryPlanError(f"static_schedule expects a Function or IRModule, got {type(func).__name__}")
    tensors: dict[str, ScheduledTensor] = {}
    used_names: set[str] = set()
    steps: list[LoweredStep] = []
    params: dict = {}
    primitives: dict = {}
    env: dict = {}  # Var -> tree of tensor names

    def fresh(hint: str) -> str:
        base = hint or "t"
        name, k = base, 1
        while name in used_names:
            name, k = f"{base}_{k}", k + 1
        used_names.add(name)
        return name

    def tree_for(ty, base: str, kind: str, alias=None):
        from ..ir.types import TupleType

        if isinstance(ty, TupleType):
            return tuple(tree_for(f, f"{base}.{i}", kind) for i, f in enumerate(ty.fields))
        (tensor_type,) = _static_tensor_types(ty, base)
        name = fresh(base)
        tensors[name] = ScheduledTensor(name, tuple(tensor_type.shape), tensor_type.dtype, kind, alias)
        return name

    def flat(tree) -> list:
        return [tree] if isinstance(tree, str) else [n for t in tree for n in flat(t)]

    def atom(expr):
        if isinstance(expr, Var):
            if expr not in env:
                raise MemoryPlanError(f"variable %{expr.name_hint} is used before it is bound")
            return env[expr]
        if isinstance(expr, Constant):
            if id(expr) not in const_names:
                data = expr.data
                name = fresh(f"p{len(params)}")
                tensors[name] = ScheduledTensor(name, tuple(data.shape), data.dtype.name, PARAM)
                params[name] = data
                const_names[id(expr)] = name
            return const_names[id(expr)]
        if isinstance(expr, Tuple):
            return tuple(atom(f) for f in expr.fields)
        raise _refuse(f"the value {type(expr).__name__} is used as an argument")

    const_names: dict[int, str] = {}
    # Reserve the parameter names first so intermediates never take them.
    input_structure = {}
    for param in func.params:
        ty = known_type(param)
        if ty is None:
            raise MemoryPlanError(f"parameter %{param.name_hint} has no type; run InferType first")
        env[param] = input_structure[param.name_hint] = tree_for(ty, param.name_hint, INPUT)
    inputs = [n for p in func.params for n in flat(env[p])]
    bindings, tail = flatten_lets(func.body)
    for var, value in bindings:
        where = f"%{var.name_hint}"
        if isinstance(value, (Var, Constant, Tuple)):
            env[var] = atom(value)
        elif isinstance(value, TupleGetItem):
            tree = atom(value.tuple_value)
            if isinstance(tree, str) or not 0 <= value.index < len(tree):
                raise MemoryPlanError(f"{where}: projection .{value.index} of a non-tuple or out of range")
            env[var] = tree[value.index]
        elif isinstance(value, Call) and isinstance(value.op, GlobalVar):
            callee = mod[value.op] if mod is not None and value.op in mod else None
            if callee is None or not callee.is_primitive:
                raise _refuse(f"{where} calls @{value.op.name}, which is not a fused kernel (a function call)")
            if value.attrs and len(value.attrs):
                raise MemoryPlanError(f"{where}: a kernel call takes no attributes")
            args = [n for a in value.args for n in flat(atom(a))]
            reshape_only = bool(callee.attrs.get("reshape_only", 0))
            ty = known_type(value) or known_type(var)
            if ty is None:
                raise MemoryPlanError(f"{where} has no type; run InferType first")
            out_tree = tree_for(ty, var.name_hint, INTERMEDIATE)
            outs = flat(out_tree)
            if reshape_only:
                if len(args) != 1 or len(outs) != 1 or tensors[args[0]].size_bytes != tensors[outs[0]].size_bytes:
                    reshape_only = False  # not a pure view: run it as a kernel
                else:
                    tensors[outs[0]] = ScheduledTensor(outs[0], tensors[outs[0]].shape, tensors[outs[0]].dtype,
                                                       INTERMEDIATE, args[0])
            primitives[value.op.name] = callee
            steps.append(LoweredStep(len(steps), value.op.name, tuple(args), tuple(outs), reshape_only))
            env[var] = out_tree
        else:
            raise _refuse(f"{where} is bound to {_describe(value)}")
    if not isinstance(tail, (Var, Constant, Tuple)):
        raise _refuse(f"the function ends in {_describe(tail)}")
    result_tree = atom(tail)
    outputs = flat(result_tree)
    counter = iter(range(len(outputs)))

    def index_tree(tree):
        return next(counter) if isinstance(tree, str) else tuple(index_tree(t) for t in tree)

    output_structure = index_tree(result_tree)
    for name in outputs:
        t = tensors[name]
        if t.kind == INTERMEDIATE:
            tensors[name] = ScheduledTensor(t.name, t.shape, t.dtype, OUTPUT, t.alias_of)
    return StaticSchedule(tensors, steps, inputs, params, outputs, input_structure, output_structure, primitives)


def _describe(expr) -> str:
    from ..ir.expr import Call, Constructor, Function, GlobalVar, If, Match, Op

    if isinstance(expr, If):
        return "an if expression (control flow)"
    if isinstance(expr, Match):
        return "a match expression (ADTs)"
    if isinstance(expr, Function):
        return "a function value (a closure)"
    if isinstance(expr, Call) and isinstance(expr.op, Constructor):
        return f"the constructor {expr.op.name} (ADTs)"
    if isinstance(expr, Call) and isinstance(expr.op, Op):
        return f"an unfused call of {expr.op.name} (run FuseOps first)"
    if isinstance(expr, Call):
        return "a call of a function value (a closure)"
    if isinstance(expr, GlobalVar):
        return f"the function @{expr.name} used as a value"
    return f"a {type(expr).__name__} node"


def static_lifetimes(func, mod=None) -> list:
    """``TensorLifetime``s of every tensor of a fused, A-normal-form, static function.

    One step per kernel call in execution order; reshape-only kernels alias their input; inputs,
    constants and outputs have kind ``input``/``param``/``output`` (never overwritten). ``func``
    may be an ``IRModule`` (its ``main``); ``mod`` resolves the ``@fused_...`` globals.
    """
    return static_schedule(func, mod).lifetimes()


def lower_static(mod, params: dict | None = None, opt_level: int = 3, target: str | None = None):
    """Lower ``mod`` for static execution (graph executor, AOT): the VM lowering up to, not
    including, ``ManifestAlloc`` — fold, fuse, A-normal form, lambda lifting — so ``main`` is a
    chain of ``@fused_...`` kernel calls that ``static_schedule`` reads. ``params`` binds parameters
    of ``main`` to constants. A ``main`` whose signature has a dynamic dim is refused up front.
    ``target`` is the kernels' (as in ``vm_passes``: "c" packs constant weights for the C kernels).
    """
    from .bind_params import BindParams
    from .infer_type import InferType
    from .manifest_alloc import ManifestAlloc
    from .pass_infra import Sequential
    from .vm_pipeline import vm_passes

    if "main" not in mod:
        raise MemoryPlanError(f"the module has no @main function; it has {', '.join(mod.global_names) or 'none'}")
    if params:
        mod = BindParams(params)(mod)
    typed = InferType()(mod)
    main = typed["main"]
    for param in main.params:
        _static_tensor_types(param.checked_type, f"parameter %{param.name_hint}")
    _static_tensor_types(main.body.checked_type, "the result of @main")
    passes = []
    for p in vm_passes(opt_level, memory_plan=False, target=target):
        if isinstance(p, ManifestAlloc):
            break
        passes.append(p)
    if passes and not isinstance(passes[-1], InferType):
        passes.append(InferType())
    return Sequential(passes, opt_level=max(opt_level, 0))(mod)
