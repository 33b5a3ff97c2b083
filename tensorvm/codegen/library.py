"""Kernels of ops computed by a named C library function (``OpDef.library``, a ``LibraryKernel``).

Sorting, scans, searching and data-dependent scatters have no tensor expression; their ops name a
hand-written C function of ``tensorvm/codegen/lib`` instead. A primitive function that is one call of
such an op (they are opaque: FuseOps leaves them alone) becomes a kernel with the usual signature and
entry checks whose body is that call (a ``CallExtern``): ``library_plan`` builds it, and
``plan_primitive`` uses it before trying tensor expressions. The call's arguments come from the op's
``LibraryKernel.arguments``; a tuple argument (e.g. a shape) is passed as a pointer to an ``int64_t``
array filled on entry. Constant arguments are passed as kernel inputs, as in any kernel.
"""

from __future__ import annotations

from ..errors import UnsupportedError
from ..ir.expr import Call, Constant, Function, Op, Var
from ..ir.types import Any, SymDim, TensorType
from ..op.registry import get_op, is_registered
from ..te.expr import INDEX_DTYPE, PrimExpr, as_expr, cast, const
from ..te.expr import var as dim_var
from ..te.tensor import placeholder
from .loop_ir import Allocate, Buffer, CallExtern, Store, seq
from .lower import _prologue

__all__ = ["library_call", "library_plan"]


def library_call(prim: Function):
    """The op call of ``prim`` when its body is one call of an op with a library kernel, else None."""
    body = prim.body
    if not (isinstance(body, Call) and isinstance(body.op, Op) and is_registered(body.op.name)):
        return None
    if get_op(body.op.name).library is None:
        return None
    if not all(isinstance(a, Constant) or (isinstance(a, Var) and a in prim.params) for a in body.args):
        return None
    return body


def library_plan(prim: Function, name: str, call: Call):
    """The ``KernelPlan`` of ``prim``, one call of a library op (``library_call``)."""
    from .fused import Graph, _Builder, _c_name, _flatten_types, _param_type
    from .strategy import KernelPlan

    opdef = get_op(call.op.name)
    attrs = opdef.normalize_attrs(call.attrs)
    builder = _Builder()
    placeholders, env = [], {}
    for index, param in enumerate(prim.params):
        env[param] = builder.placeholders_for(_param_type(param), _c_name(param.name_hint), placeholders, (index,))
    args = [_constant_input(builder, a.data) if isinstance(a, Constant) else env[a] for a in call.args]
    if any(isinstance(a, tuple) for a in args):
        raise UnsupportedError(f"codegen: {opdef.name}'s library kernel takes no tuple arguments")
    out_type = getattr(call, "_checked_type", None)
    if out_type is None:  # (a primitive built by hand: the relation over the parameters' types)
        out_type = opdef.type_rel([_param_type(a) if isinstance(a, Var) else TensorType(a.data.shape, a.data.dtype.name)
                                   for a in call.args], attrs,
                                  [a.data if isinstance(a, Constant) else None for a in call.args])
    kernel_inputs = placeholders + [t for t, _ in builder.constants]
    in_buffers = [Buffer(_c_name(t.name), t.dtype, t.shape) for t in kernel_inputs]
    arg_buffers = [in_buffers[next(i for i, t in enumerate(kernel_inputs) if t is a)] for a in args]
    out_buffers = []
    for index, ty in enumerate(_flatten_types(out_type)):
        if not isinstance(ty, TensorType):
            raise UnsupportedError(f"codegen: {opdef.name} returns {ty!r}, not tensors")
        shape = tuple(_out_dim(builder, d, f"out{index}_d{axis}") for axis, d in enumerate(ty.shape))
        out_buffers.append(Buffer(f"out{index}", ty.dtype, shape))
    c_args, requires = opdef.library.arguments(attrs, arg_buffers, out_buffers)
    body = _call_with_arrays(opdef.library.function_name(attrs), opdef.library.source, c_args)
    params = tuple(in_buffers + out_buffers)
    parts = _prologue(name, params, len(in_buffers), list(requires), body, {})
    graph = Graph(builder, placeholders, [], out_type)
    return KernelPlan(graph.lowered(parts.func()), parts, graph, [])


def _constant_input(builder, data):
    """A constant argument as an extra kernel input (even a scalar: the C function reads it by pointer)."""
    tensor = placeholder(data.shape, data.dtype.name, f"const{len(builder.constants)}")
    builder.constants.append((tensor, data.copy(order="C")))
    builder.constant_sources.append(data)
    return tensor


def _out_dim(builder, dim, hint: str):
    """An output dim: a constant, the shared symbol of a named dim, or a fresh symbol bound from the
    output array (``Any``: a dim only the shape function knows)."""
    if isinstance(dim, int):
        return const(dim, INDEX_DTYPE)
    if isinstance(dim, SymDim):
        return builder.dim(dim, (), hint)
    if isinstance(dim, Any):
        return dim_var(hint)
    raise UnsupportedError(f"codegen: unsupported output dimension {dim!r}")


def _call_with_arrays(function: str, source: str, args) -> object:
    """``CallExtern(function, args)``, each tuple argument first stored in an ``int64_t`` array."""
    converted, arrays = [], []
    for index, arg in enumerate(args):
        if isinstance(arg, Buffer):
            converted.append(arg)
        elif isinstance(arg, tuple):
            values = [_as_int64(v) for v in arg] or [const(0, INDEX_DTYPE)]  # (no zero-length C array)
            array = Buffer(f"lib_arg{index}", INDEX_DTYPE, (const(len(values), INDEX_DTYPE),), "local")
            arrays.append((array, values))
            converted.append(array)
        else:
            converted.append(_as_int64(arg))
    body = CallExtern(function, tuple(converted), source)
    for array, values in reversed(arrays):
        stores = [Store(array, const(i, INDEX_DTYPE), v) for i, v in enumerate(values)]
        body = Allocate(array, seq(*stores, body))
    return body


def _as_int64(value) -> PrimExpr:
    if isinstance(value, (bool, int)):
        return const(int(value), INDEX_DTYPE)
    expr = as_expr(value)
    return expr if expr.dtype == INDEX_DTYPE else cast(expr, INDEX_DTYPE)

