"""Primitive (fused) IR functions to C kernels.

A primitive function's body is a DAG of op calls over its parameters (with lets, tuples and
projections). ``lower_primitive`` turns it into tensor expressions, one ``compute`` per call (from the
op's registered ``compute``), and lowers them together into one loop nest, so a fused group is one
kernel. Parameter dims become te symbols: a static dim a constant, each ``?`` a fresh symbol and each
named dim (``n``) one shared symbol. Tuple-typed parameters and results are flattened, as the VM passes
them. Scalar constants are folded into the code; larger constants are passed to the kernel as extra
inputs, which the wrapper appends itself.

``build_fused_kernel(prim)`` compiles one function and returns ``(c_source, entry_name, wrapper)``
where ``wrapper(*in_arrays, *out_arrays)`` writes the outputs (destination passing, as in the VM
contract). ``build_fused_module({name: prim})`` compiles many functions into one library.
"""

from __future__ import annotations

import re

import numpy as np

from .. import te
from ..errors import TypeInferenceError, UnsupportedError
from ..ir.expr import Call, Constant, Function, Let, Op, Tuple, TupleGetItem, Var
from ..ir.types import Any, SymDim, TensorType, TupleType
from ..op.registry import get_op
from . import strategy
from .library import library_call, library_plan
from .loop_ir import PrimFunc
from .lower import lower_parts
from .module import CompiledModule, KernelFunction, build_module

__all__ = ["LoweredPrimitive", "lower_primitive", "plan_primitive", "build_graph", "Graph", "OpCall",
           "build_fused_kernel", "build_fused_module", "FusedKernel"]

_INLINE_CONSTANT_SIZE = 1  # constants with more elements are passed as kernel inputs


class LoweredPrimitive:
    """A primitive function lowered to a ``PrimFunc``, with the constant arrays it takes as extra inputs."""

    def __init__(self, func: PrimFunc, num_params: int, constants: list):
        self.func = func
        self.num_params = num_params
        self.constants = constants


def lower_primitive(prim: Function, name: str, strategies: bool = True) -> LoweredPrimitive:
    """Turn a primitive function into one loop-nest kernel named ``name``.

    With ``strategies`` the C variants the strategy of the group's anchor op asks for (a static-shape
    specialization, a vector-friendly one...) are lowered too and put behind a dispatch in the same
    function (same signature; see ``tensorvm.codegen.strategy``); external variants (BLAS) need a Python
    caller and come only from ``plan_primitive``.
    """
    return plan_primitive(prim, name, strategies, externals=False).lowered


def plan_primitive(prim: Function, name: str, strategies: bool = True, externals: bool = True):
    """The C kernel of ``prim`` (with its C variants) and, with ``externals``, the external variants
    (``tensorvm.codegen.strategy.KernelPlan``). A primitive that is one call of an op with a library
    kernel (``OpDef.library``) becomes a call of its C function (``tensorvm.codegen.library``)."""
    call = library_call(prim)
    if call is not None:
        return library_plan(prim, name, call)
    graph = build_graph(prim, name)
    generic = lower_parts(name, graph.inputs, graph.outputs)
    if not strategies:
        return strategy.KernelPlan(graph.lowered(generic.func()), generic, graph, [])
    return strategy.plan(prim, name, graph, generic, externals)


class Graph:
    """A primitive function as tensor expressions: ``inputs`` (the parameters' placeholders, then the
    placeholders of constants passed as extra inputs), ``outputs``, and the op calls it was built from."""

    def __init__(self, builder: _Builder, placeholders: list, outputs: list, ret_type):
        self.builder = builder
        self.placeholders = placeholders
        self.outputs = outputs
        self.ret_type = ret_type
        self.inputs = placeholders + [t for t, _ in builder.constants]

    @property
    def calls(self) -> list:
        return self.builder.calls

    @property
    def multiples(self) -> dict:
        return self.builder.multiples

    def dim_key(self, dim):
        """The key (``tensorvm.codegen.fused`` dim identity) of a te dim variable of this graph."""
        return self.builder.dim_keys.get(dim)

    def lowered(self, func: PrimFunc) -> LoweredPrimitive:
        return LoweredPrimitive(func, len(self.placeholders), [array for _, array in self.builder.constants])


def build_graph(prim: Function, name: str, static_dims: dict | None = None, multiples: dict | None = None) -> Graph:
    """The te graph of ``prim``. ``static_dims`` / ``multiples`` (``{dim key: int}``) make some dims
    constants / declare them multiples of a width, for the variants of a kernel."""
    if not isinstance(prim, Function):
        raise TypeInferenceError(f"codegen: expected a primitive Function, got {type(prim).__name__}")
    builder = _Builder(static_dims, multiples)
    placeholders, env = [], {}
    for index, param in enumerate(prim.params):
        ty = _param_type(param)
        value = builder.placeholders_for(ty, _c_name(param.name_hint), placeholders, (index,))
        env[param] = (value, ty)
    value, ret_type = builder.value(prim.body, env)
    outputs = _flatten(value)
    if not outputs:
        raise UnsupportedError(f"codegen: primitive function {name} returns no tensor")
    _check_output_shapes(name, outputs, _flatten_types(ret_type))
    return Graph(builder, placeholders, outputs, ret_type)


class FusedKernel:
    """``kernel(*in_arrays, *out_arrays)``: a compiled primitive function (constants appended for you).

    ``bind(*arrays)`` gives a pre-checked zero-argument call; ``variants`` / ``select_variant(*arrays)``
    show the kernel's C variants and which one its dispatch function picks.
    """

    def __init__(self, kernel: KernelFunction, lowered: LoweredPrimitive):
        self.kernel = kernel
        self.name = kernel.name
        self.num_inputs = lowered.num_params
        self.num_outputs = kernel.num_outputs
        self._constants = tuple(lowered.constants)
        self._entry = kernel.entry

    def _with_constants(self, arrays: tuple) -> tuple:
        if not self._constants:
            return arrays
        split = len(arrays) - self.num_outputs
        return arrays[:split] + self._constants + arrays[split:]

    def __call__(self, *arrays):
        if self._constants:
            split = len(arrays) - self.num_outputs
            arrays = arrays[:split] + self._constants + arrays[split:]
        code = self._entry(*arrays)
        if code:
            self.kernel.fail(code, arrays)

    def bind(self, *arrays):
        """A zero-argument call of the kernel on ``arrays`` (inputs, then outputs), checked once now;
        arrays that do not fit give a call that raises the kernel's error when run."""
        return self.kernel.bind(*self._with_constants(arrays))

    @property
    def variants(self) -> tuple:
        return self.kernel.variants

    def select_variant(self, *arrays) -> str:
        """The variant the kernel's C dispatch picks for these arrays (inputs, then outputs)."""
        return self.kernel.select_variant(*self._with_constants(arrays))

    @property
    def source(self) -> str:
        return self.kernel.source

    def __repr__(self):
        return f"<FusedKernel {self.name}: {self.num_inputs} in, {self.num_outputs} out>"


def build_fused_module(prims: dict, strategies: bool = True) -> tuple[CompiledModule, dict]:
    """Compile ``{kernel_name: primitive_function}`` into one library; returns it and ``{name: kernel}``.

    Each kernel is called ``kernel(*in_arrays, *out_arrays)``. It is a ``FusedKernel``, or, when its
    strategy has an external variant (BLAS for a large enough ``nn.dense``), a
    ``strategy.DispatchKernel`` with the same interface that picks BLAS or the C kernel per call.
    ``strategies=False`` compiles the generic kernels only.
    """
    plans = {name: plan_primitive(prim, name, strategies) for name, prim in prims.items()}
    funcs = [p.lowered.func for p in plans.values()]
    funcs += [e.epilogue.func for p in plans.values() for e in p.externals if e.epilogue is not None]
    module = build_module(funcs)
    return module, {name: plan.make_kernel(module) for name, plan in plans.items()}


def build_fused_kernel(prim: Function, name: str | None = None):
    """Compile one primitive function: ``(c_source, entry_name, wrapper)``."""
    name = name or _default_name(prim)
    module, kernels = build_fused_module({name: prim})
    return module.source, name, kernels[name]


def _default_name(prim: Function) -> str:
    ops = [n.op.name for n in _calls(prim.body)]
    return _c_name("fused_" + "_".join(o.replace(".", "_") for o in ops[:6]) if ops else "fused_identity")


def _calls(expr):
    out, stack, seen = [], [expr], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, Call):
            if isinstance(node.op, Op):
                out.append(node)
            stack.extend(reversed(node.args))
        elif isinstance(node, Tuple):
            stack.extend(reversed(node.fields))
        elif isinstance(node, TupleGetItem):
            stack.append(node.tuple_value)
        elif isinstance(node, Let):
            stack.extend([node.body, node.value])
    return list(reversed(out))


def _param_type(param: Var):
    ty = getattr(param, "_checked_type", None) or param.type_annotation
    if ty is None:
        raise TypeInferenceError(f"codegen: parameter %{param.name_hint} has no type; annotate it or run InferType")
    return ty


def _c_name(name: str) -> str:
    clean = re.sub(r"\W", "_", name).strip("_") or "p"
    return clean if not clean[0].isdigit() else "p" + clean


def _flatten_types(ty) -> list:
    if isinstance(ty, TupleType):
        return [t for f in ty.fields for t in _flatten_types(f)]
    return [ty]


def _check_output_shapes(name: str, outputs: list, types: list):
    """A compute must agree with the type relation wherever both know a dim (else the caller would
    allocate outputs the kernel rejects)."""
    for index, (tensor, ty) in enumerate(zip(outputs, types)):
        if len(tensor.shape) != len(ty.shape) or tensor.dtype != ty.dtype:
            raise UnsupportedError(f"codegen: {name} output {index} is {tensor.dtype}{list(tensor.shape)} but its "
                                   f"type is {ty!r}")
        for axis, (dim, expected) in enumerate(zip(tensor.shape, ty.shape)):
            if isinstance(dim, te.Const) and isinstance(expected, int) and dim.value != expected:
                raise UnsupportedError(f"codegen: {name} output {index} dim {axis} is {dim.value} but its type "
                                       f"says {expected}")


def _flatten(value) -> list:
    if isinstance(value, tuple):
        return [t for v in value for t in _flatten(v)]
    return [value]


class OpCall:
    """An op call of a primitive function as the builder met it: its definition, normalized attrs, te
    arguments, type, IR call and te results."""

    def __init__(self, opdef, attrs, args: list, arg_types: list, out_type, call: Call, results: list):
        self.opdef = opdef
        self.attrs = attrs
        self.args = args
        self.arg_types = arg_types
        self.out_type = out_type
        self.call = call
        self.results = results


class _Builder:
    def __init__(self, static_dims: dict | None = None, multiples: dict | None = None):
        self.symbols: dict = {}
        self.constants: list = []
        self.constant_sources: list = []  # the arrays the constants were made from, in order
        self.memo: dict = {}
        self.calls: list = []
        self.dim_keys: dict = {}  # te dim var -> ("sym", name) or ("any", parameter path, axis)
        self.static_dims = static_dims or {}
        self.multiple_keys = multiples or {}
        self.multiples: dict = {}  # te dim var -> m, for the lowering

    def dim(self, d, key: tuple, hint: str):
        if isinstance(d, int):
            return d
        if isinstance(d, SymDim):
            key = ("sym", d.name)
            if key in self.static_dims:
                return self.static_dims[key]
            if d.name not in self.symbols:
                self.symbols[d.name] = self._var(d.name, key)
            return self.symbols[d.name]
        if isinstance(d, Any):
            key = ("any",) + key
            if key in self.static_dims:
                return self.static_dims[key]
            return self._var(hint, key)
        raise TypeInferenceError(f"codegen: unsupported dimension {d!r}")

    def _var(self, name: str, key: tuple):
        v = te.var(name)
        self.dim_keys[v] = key
        if self.multiple_keys.get(key, 1) > 1:
            self.multiples[v] = self.multiple_keys[key]
        return v

    def placeholders_for(self, ty, name: str, out: list, path: tuple = ()):
        if isinstance(ty, TupleType):
            return tuple(self.placeholders_for(f, f"{name}_{i}", out, path + (i,)) for i, f in enumerate(ty.fields))
        if not isinstance(ty, TensorType):
            raise UnsupportedError(f"codegen: a kernel parameter must be a tensor or a tuple of tensors, got {ty!r}")
        shape = tuple(self.dim(d, (path, axis), f"{name}_d{axis}") for axis, d in enumerate(ty.shape))
        tensor = te.placeholder(shape, ty.dtype, name)
        out.append(tensor)
        return tensor

    def value(self, expr, env):
        """(te value, IR type) of ``expr``: a Tensor, or a tuple of values for tuple types."""
        if isinstance(expr, Var):
            if expr not in env:
                raise UnsupportedError(f"codegen: free variable %{expr.name_hint} in a primitive function")
            return env[expr]
        if id(expr) in self.memo:
            return self.memo[id(expr)]
        result = self._value(expr, env)
        self.memo[id(expr)] = result
        return result

    def _value(self, expr, env):
        if isinstance(expr, Constant):
            return self.constant(expr.data), TensorType(expr.data.shape, expr.data.dtype.name)
        if isinstance(expr, Tuple):
            items = [self.value(f, env) for f in expr.fields]
            return tuple(v for v, _ in items), TupleType(tuple(t for _, t in items))
        if isinstance(expr, TupleGetItem):
            value, ty = self.value(expr.tuple_value, env)
            if not isinstance(value, tuple) or not 0 <= expr.index < len(value):
                raise TypeInferenceError(f"codegen: projection .{expr.index} of a non-tuple or out of range")
            return value[expr.index], ty.fields[expr.index]
        if isinstance(expr, Let):
            env = dict(env)
            env[expr.var] = self.value(expr.value, env)
            return self.value(expr.body, env)
        if isinstance(expr, Call) and isinstance(expr.op, Op):
            return self.call(expr, env)
        raise UnsupportedError(f"codegen: a primitive function cannot contain {type(expr).__name__} nodes; "
                               f"only op calls, tuples, projections, lets and constants")

    def constant(self, data: np.ndarray):
        if data.size <= _INLINE_CONSTANT_SIZE and data.size == 1:
            value = te.const(data.reshape(()).item(), data.dtype.name)
            return te.compute(data.shape, lambda *idx: value, "const")
        tensor = te.placeholder(data.shape, data.dtype.name, f"const{len(self.constants)}")
        self.constants.append((tensor, np.array(data, order="C")))
        self.constant_sources.append(data)  # (the IR constant's array: kernels of one group share it)
        return tensor

    def call(self, call: Call, env):
        opdef = get_op(call.op.name)
        if opdef.compute is None:
            raise UnsupportedError(f"codegen: operator {opdef.name} has no tensor-expression compute; "
                                   f'use target="python" for it')
        args = [self.value(a, env) for a in call.args]
        attrs = opdef.normalize_attrs(call.attrs)
        out_type = getattr(call, "_checked_type", None)
        if out_type is None:
            out_type = opdef.type_rel([t for _, t in args], attrs, [a.data if isinstance(a, Constant) else None
                                                                   for a in call.args])
        results = opdef.compute(attrs, [v for v, _ in args], out_type)
        self.calls.append(OpCall(opdef, attrs, [v for v, _ in args], [t for _, t in args], out_type, call,
                                 list(results)))
        if isinstance(out_type, TupleType):
            if len(results) != len(out_type.fields):
                raise UnsupportedError(f"codegen: the compute of {opdef.name} gave {len(results)} outputs for "
                                       f"{len(out_type.fields)} tuple fields")
            return tuple(results), out_type
        return results[0], out_type
