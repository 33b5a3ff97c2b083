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
from ..te import op_computes  # noqa: F401 - attaches the op computes to the registry
from .loop_ir import PrimFunc
from .lower import lower
from .module import CompiledModule, KernelFunction, build_module

__all__ = ["LoweredPrimitive", "lower_primitive", "build_fused_kernel", "build_fused_module", "FusedKernel"]

_INLINE_CONSTANT_SIZE = 1  # constants with more elements are passed as kernel inputs


class LoweredPrimitive:
    """A primitive function lowered to a ``PrimFunc``, with the constant arrays it takes as extra inputs."""

    def __init__(self, func: PrimFunc, num_params: int, constants: list):
        self.func = func
        self.num_params = num_params
        self.constants = constants


def lower_primitive(prim: Function, name: str) -> LoweredPrimitive:
    """Turn a primitive function into one loop-nest kernel named ``name``."""
    if not isinstance(prim, Function):
        raise TypeInferenceError(f"codegen: expected a primitive Function, got {type(prim).__name__}")
    builder = _Builder()
    placeholders, env = [], {}
    for param in prim.params:
        ty = _param_type(param)
        value = builder.placeholders_for(ty, _c_name(param.name_hint), placeholders)
        env[param] = (value, ty)
    value, ret_type = builder.value(prim.body, env)
    outputs = _flatten(value)
    if not outputs:
        raise UnsupportedError(f"codegen: primitive function {name} returns no tensor")
    _check_output_shapes(name, outputs, _flatten_types(ret_type))
    inputs = placeholders + [t for t, _ in builder.constants]
    func = lower(name, inputs, outputs)
    return LoweredPrimitive(func, len(placeholders), [array for _, array in builder.constants])


class FusedKernel:
    """``kernel(*in_arrays, *out_arrays)``: a compiled primitive function (constants appended for you)."""

    def __init__(self, kernel: KernelFunction, lowered: LoweredPrimitive):
        self.kernel = kernel
        self.name = kernel.name
        self.num_inputs = lowered.num_params
        self.num_outputs = kernel.num_outputs
        self._constants = tuple(lowered.constants)
        self._entry = kernel.entry

    def __call__(self, *arrays):
        if self._constants:
            split = len(arrays) - self.num_outputs
            arrays = arrays[:split] + self._constants + arrays[split:]
        code = self._entry(*arrays)
        if code:
            self.kernel.fail(code, arrays)

    @property
    def source(self) -> str:
        return self.kernel.source

    def __repr__(self):
        return f"<FusedKernel {self.name}: {self.num_inputs} in, {self.num_outputs} out>"


def build_fused_module(prims: dict) -> tuple[CompiledModule, dict]:
    """Compile ``{kernel_name: primitive_function}`` into one library; returns it and ``{name: FusedKernel}``."""
    lowered = {name: lower_primitive(prim, name) for name, prim in prims.items()}
    module = build_module([lp.func for lp in lowered.values()])
    return module, {name: FusedKernel(module[name], lp) for name, lp in lowered.items()}


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


class _Builder:
    def __init__(self):
        self.symbols: dict = {}
        self.constants: list = []
        self.memo: dict = {}

    def dim(self, d, hint: str):
        if isinstance(d, int):
            return d
        if isinstance(d, SymDim):
            if d.name not in self.symbols:
                self.symbols[d.name] = te.var(d.name)
            return self.symbols[d.name]
        if isinstance(d, Any):
            return te.var(hint)
        raise TypeInferenceError(f"codegen: unsupported dimension {d!r}")

    def placeholders_for(self, ty, name: str, out: list):
        if isinstance(ty, TupleType):
            return tuple(self.placeholders_for(f, f"{name}_{i}", out) for i, f in enumerate(ty.fields))
        if not isinstance(ty, TensorType):
            raise UnsupportedError(f"codegen: a kernel parameter must be a tensor or a tuple of tensors, got {ty!r}")
        shape = tuple(self.dim(d, f"{name}_d{axis}") for axis, d in enumerate(ty.shape))
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
        if isinstance(out_type, TupleType):
            if len(results) != len(out_type.fields):
                raise UnsupportedError(f"codegen: the compute of {opdef.name} gave {len(results)} outputs for "
                                       f"{len(out_type.fields)} tuple fields")
            return tuple(results), out_type
        return results[0], out_type
