"""ManifestAlloc: make every kernel call explicit, in destination-passing style.

Requires: A-normal form (``ToANormalForm``), primitive functions lifted to globals (``LambdaLift``)
and checked types. The memory-dialect ops are those of ``tensorvm/op/memory.py``.

After it, no VM function calls a primitive directly. Each ``let %v = @prim(%a, %b);`` became:

* static output type: per output tensor ``memory.alloc_storage(<bytes>)`` and
  ``memory.alloc_tensor(%storage, 0i64, <shape constant>)``, then
  ``vm.invoke_tvm_op(@prim, (%a, %b), (%out,))``; ``%v`` is replaced by ``%out`` (or bound to the
  tuple of the outputs when the primitive returns a tuple);
* dynamic output type of static and symbolic dims only, each output's type that of an input:
  ``vm.shape_of`` of that input, then the allocations and the invoke (no shape function);
* other dynamic output types: the shape of each input that the shape function reads by shape
  (``vm.shape_of``, or a constant when the input's type is static) or the input itself when it reads
  its data, preallocated int64 shape tensors, ``vm.shape_func(@prim, (ins), (out_shapes),
  is_input=[...])``, then per dynamic output ``memory.alloc_storage(%out_shape,
  size_from_shape=True)`` and ``memory.alloc_tensor(%storage, 0i64, %out_shape)``, then the invoke;
* a ``reshape_only=1`` primitive: ``vm.reshape_tensor(%data, <shape>)`` (a zero-copy view), the shape
  being a constant or computed by the shape function as above;
* a primitive that is ``shape_of(%p)`` with int64 results: ``vm.shape_of(%p)`` (the VM's ShapeOf
  instruction, no kernel);
* an update proven to own its data (``update_in_place.py``: a buffer a recursive loop fills):
  ``vm.invoke_tvm_op(@prim, (%data, ...), (%data,))``, no allocation, and ``%v`` is replaced by
  ``%data``.

The module gains the ``type Storage {}`` definition (the type of a storage block).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from ..errors import UnsupportedError
from ..ir.attrs import Attrs
from ..ir.expr import (
    Call,
    Clause,
    Constant,
    Expr,
    Function,
    GlobalVar,
    If,
    Let,
    Match,
    Op,
    RefCreate,
    RefRead,
    RefWrite,
    Tuple,
    TupleGetItem,
    Var,
)
from ..ir.module import IRModule
from ..ir.types import Any, TensorType, TupleType
from ..op.memory import STORAGE_TYPE, STORAGE_TYPE_DATA, UNIT_TYPE
from ..op.registry import get_op
from .fuse_ops import flatten_tensor_types, is_static_type
from .pass_infra import Pass
from .to_anf import (
    build_lets,
    copy_type,
    flatten_lets,
    known_type,
    post_order_iter,
    primitive_children,
    rebuild_function,
    typed_var,
)
from .update_in_place import in_place_updates

__all__ = ["ManifestAlloc", "shape_func_inputs"]

DEFAULT_ALIGNMENT = 64

_ALLOC_STORAGE, _ALLOC_TENSOR = Op("memory.alloc_storage"), Op("memory.alloc_tensor")
_INVOKE, _SHAPE_FUNC = Op("vm.invoke_tvm_op"), Op("vm.shape_func")
_SHAPE_OF, _RESHAPE_TENSOR = Op("vm.shape_of"), Op("vm.reshape_tensor")


@cache
def _storage_attrs(alignment: int, dtype: str, size_from_shape: bool) -> Attrs:
    if size_from_shape:
        return Attrs(alignment=alignment, dtype_hint=dtype, size_from_shape=True)
    return Attrs(alignment=alignment, dtype_hint=dtype)


@cache
def _tensor_attrs(dtype: str) -> Attrs:
    return Attrs(dtype=dtype)


def int64_constant(value) -> Constant:
    array = np.asarray(value, dtype="int64")
    return Constant(array).with_type(TensorType(array.shape, "int64"))


def shape_func_inputs(prim: Function) -> tuple:
    """Per parameter of a primitive: 1 if its composed shape function reads the data, 0 for the shape.

    Only ops with a dynamic output type run their own shape function, so only they can need data;
    FuseOps keeps such ops alone, so their data inputs are parameters (or constants).
    """
    params = {p: i for i, p in enumerate(prim.params)}
    flags = [0] * len(prim.params)
    for node in post_order_iter(prim.body, primitive_children):
        if not (isinstance(node, Call) and isinstance(node.op, Op)):
            continue
        opdef = get_op(node.op)
        if is_static_type(known_type(node)) or not opdef.is_data_dependent:
            continue
        for j, arg in enumerate(node.args):
            if not opdef.input_needs_data(j):
                continue
            if arg in params:
                flags[params[arg]] = 1
            elif not isinstance(arg, Constant):
                raise UnsupportedError(
                    f"the shape function of {node.op.name} needs the data of its input {j}, which is computed "
                    f"inside the same primitive function; such an op must stand alone (FuseOps makes it opaque)")
    return tuple(flags)


def primitive_data_param(prim: Function) -> int | None:
    """For a reshape-only primitive: the index of the parameter whose data every op reshapes."""
    node = prim.body
    while isinstance(node, Call) and node.args:
        node = node.args[0]
    if node in prim.params and isinstance(known_type(node), TensorType):
        return prim.params.index(node)
    return None


def _nbytes(ty: TensorType) -> int:
    return int(np.prod(ty.shape, dtype=np.int64)) * np.dtype(ty.dtype).itemsize


class _Lowerer:
    def __init__(self, mod: IRModule):
        self.mod = mod
        self.proven = in_place_updates(mod)  # per function: results of updates that write their data
        self.in_place: frozenset = frozenset()  # those of the function being lowered
        self.subst: dict[Var, Expr] = {}
        self.tuple_fields: dict[Var, tuple] = {}  # var bound to a kernel's tuple of outputs -> the fields

    # --- helpers ---
    def sub(self, atom: Expr) -> Expr:
        return self.subst.get(atom, atom) if isinstance(atom, Var) else atom

    def primitive_of(self, callee: Expr) -> Function | None:
        if isinstance(callee, GlobalVar) and callee in self.mod.functions:
            fn = self.mod.functions[callee]
            return fn if fn.is_primitive else None
        if isinstance(callee, Function) and callee.is_primitive:
            raise UnsupportedError("ManifestAlloc needs primitive functions lifted to globals; run LambdaLift first")
        return None

    @staticmethod
    def bind(out: list, name: str, value: Expr, ty) -> Var:
        var = typed_var(name, ty)
        value.with_type(ty)
        out.append((var, value))
        return var

    # --- blocks ---
    def lower_function(self, fn: Function) -> Function:
        if fn.is_primitive:
            return fn
        if fn.attrs.get("Closure") and isinstance(fn.body, Function):
            return rebuild_function(fn, self.lower_function(fn.body))
        return rebuild_function(fn, self.lower_block(fn.body))

    def lower_block(self, expr: Expr) -> Expr:
        bindings, tail = flatten_lets(expr)
        out: list = []
        for var, value in bindings:
            if isinstance(value, Call):
                prim = self.primitive_of(value.op)
                if prim is not None:
                    self.lower_kernel_call(var, value, prim, out)
                    continue
            if isinstance(value, TupleGetItem):
                fields = self.tuple_fields.get(self.sub(value.tuple_value))
                if fields is not None:  # a field of a kernel's tuple result: the output tensor itself
                    self.subst[var] = fields[value.index]
                    continue
            out.append((var, self.lower_value(value)))
        if isinstance(tail, (If, Match)):
            tail = self.lower_value(tail)
        elif isinstance(tail, Call) and self.primitive_of(tail.op) is not None:
            raise UnsupportedError("ManifestAlloc needs A-normal form (a kernel call in tail position); run ToANormalForm first")
        else:
            tail = self.lower_value(tail)
        return build_lets(out, tail)

    def lower_value(self, value: Expr) -> Expr:
        s = self.sub
        if isinstance(value, Var):
            return s(value)
        if isinstance(value, Call):
            new = Call(s(value.op), tuple(s(a) for a in value.args), value.attrs, value.type_args, span=value.span)
        elif isinstance(value, Tuple):
            new = Tuple(tuple(s(f) for f in value.fields), span=value.span)
        elif isinstance(value, TupleGetItem):
            new = TupleGetItem(s(value.tuple_value), value.index, span=value.span)
        elif isinstance(value, If):
            new = If(s(value.cond), self.lower_block(value.true_branch), self.lower_block(value.false_branch),
                     span=value.span)
        elif isinstance(value, Match):
            clauses = tuple(Clause(c.lhs, self.lower_block(c.rhs)) for c in value.clauses)
            new = Match(s(value.data), clauses, value.complete, span=value.span)
        elif isinstance(value, Function):
            return self.lower_function(value)
        elif isinstance(value, RefCreate):
            new = RefCreate(s(value.value), span=value.span)
        elif isinstance(value, RefRead):
            new = RefRead(s(value.ref), span=value.span)
        elif isinstance(value, RefWrite):
            new = RefWrite(s(value.ref), s(value.value), span=value.span)
        elif isinstance(value, Let):
            raise UnsupportedError("ManifestAlloc needs A-normal form (a let inside a bound value); run ToANormalForm first")
        else:
            return value
        return copy_type(new, value)

    # --- kernel calls ---
    def lower_kernel_call(self, var: Var, call: Call, prim: Function, out: list) -> None:
        args = [self.sub(a) for a in call.args]
        ret_type = prim.ret_type or known_type(prim.body)
        out_types = flatten_tensor_types(ret_type)
        if _is_shape_of(prim):
            out.append((var, Call(_SHAPE_OF, (args[0],)).with_type(ret_type)))
            return
        if prim.attrs.get("reshape_only") and isinstance(ret_type, TensorType):
            data_index = primitive_data_param(prim)
            if data_index is not None:
                if ret_type.is_static:
                    shape = int64_constant(ret_type.shape)
                else:
                    (shape,) = self.emit_shape_func(call.op, prim, args, out_types, out)
                value = Call(_RESHAPE_TENSOR, (args[data_index], shape)).with_type(ret_type)
                out.append((var, value))
                return
        if var in self.in_place:  # the kernel writes into its data, which nothing reads afterwards
            self.bind(out, "unit", Call(_INVOKE, (call.op, self._inputs(args, prim), Tuple((args[0],)).with_type(
                TupleType((known_type(args[0]),))))), UNIT_TYPE)
            self.subst[var] = args[0]
            return
        shapes = None
        if not is_static_type(ret_type):
            shapes = self.shapes_of_alike_inputs(prim, args, out_types, out) or \
                self.emit_shape_func(call.op, prim, args, out_types, out)
        outs = []
        for j, ty in enumerate(out_types):
            if ty.is_static:
                outs.append(self.static_alloc(ty, out))
            else:
                outs.append(self.dynamic_alloc(ty, shapes[j], out))
        ins = self._inputs(args, prim)
        outs_tuple = Tuple(tuple(outs)).with_type(TupleType(tuple(out_types)))
        self.bind(out, "unit", Call(_INVOKE, (call.op, ins, outs_tuple)), UNIT_TYPE)
        if isinstance(ret_type, TensorType):
            self.subst[var] = outs[0]
        else:
            value = self._restructure(ret_type, iter(outs), out)
            self.tuple_fields[var] = value.fields
            out.append((var, value))

    @staticmethod
    def _inputs(args: list, prim: Function) -> Tuple:
        return Tuple(tuple(args)).with_type(TupleType(tuple(known_type(a) or p.type_annotation
                                                            for a, p in zip(args, prim.params))))

    def _restructure(self, ty, fields, out: list) -> Expr:
        """The tuple value of type ``ty`` made of the flat output tensors ``fields`` (nested tuples bound)."""
        if not isinstance(ty, TupleType):
            return next(fields)
        parts = []
        for field_ty in ty.fields:
            part = self._restructure(field_ty, fields, out)
            parts.append(self.bind(out, "tuple", part, field_ty) if isinstance(part, Tuple) else part)
        return Tuple(tuple(parts)).with_type(ty)

    def emit_shape_func(self, callee: Expr, prim: Function, args: list, out_types: list, out: list) -> list:
        is_input = shape_func_inputs(prim)
        ins = []
        for flag, param, arg in zip(is_input, prim.params, args):
            ins.append(arg if flag else self.shape_value(arg, known_type(param), out))
        out_shapes = [self.static_alloc(TensorType((len(ty.shape),), "int64"), out) for ty in out_types]
        in_types = tuple(known_type(a) for a in ins)
        call = Call(_SHAPE_FUNC, (callee, Tuple(tuple(ins)).with_type(TupleType(in_types)),
                                  Tuple(tuple(out_shapes)).with_type(TupleType(tuple(known_type(s) for s in out_shapes)))),
                    Attrs(is_input=list(is_input)))
        self.bind(out, "unit", call, UNIT_TYPE)
        return out_shapes

    def shapes_of_alike_inputs(self, prim: Function, args: list, out_types: list, out: list) -> list | None:
        """Each dynamic output's shape as the shape of an input of the same type, or None when some
        dynamic output has none (then the shape function runs). Only a type of static and symbolic dims
        qualifies: a symbolic dim is equal wherever its name recurs (kernels check that on entry), while
        two ``?`` dims are unrelated. Saves the shape function of, e.g., an elementwise kernel whose
        output has its input's type (a recurrent step's gates on a batch of symbolic size)."""
        param_types = [known_type(p) or p.type_annotation for p in prim.params]
        shapes, found = [], {}
        for ty in out_types:
            if ty.is_static:
                shapes.append(None)
                continue
            if any(isinstance(d, Any) for d in ty.shape):
                return None
            index = next((j for j, pt in enumerate(param_types) if isinstance(pt, TensorType)
                          and tuple(pt.shape) == tuple(ty.shape)), None)
            if index is None:
                return None
            if index not in found:
                found[index] = self.bind(out, "in_shape", Call(_SHAPE_OF, (args[index],)),
                                         TensorType((ty.ndim,), "int64"))
            shapes.append(found[index])
        return shapes

    def shape_value(self, arg: Expr, ty, out: list) -> Expr:
        """An int64 shape tensor for ``arg`` (a tuple of them for a tuple-typed argument)."""
        if isinstance(ty, TensorType):
            if ty.is_static:
                return int64_constant(ty.shape)
            return self.bind(out, "in_shape", Call(_SHAPE_OF, (arg,)), TensorType((ty.ndim,), "int64"))
        if isinstance(ty, TupleType):
            fields = []
            for index, field_ty in enumerate(ty.fields):
                field = arg.fields[index] if isinstance(arg, Tuple) else self.bind(
                    out, "field", TupleGetItem(arg, index), field_ty)
                fields.append(self.shape_value(field, field_ty, out))
            tuple_ty = TupleType(tuple(known_type(f) for f in fields))
            return self.bind(out, "in_shapes", Tuple(tuple(fields)), tuple_ty)
        raise UnsupportedError(f"cannot pass a value of type {ty} to a shape function")

    def static_alloc(self, ty: TensorType, out: list) -> Var:
        storage = self.bind(out, "storage", Call(_ALLOC_STORAGE, (int64_constant(_nbytes(ty)),), _storage_attrs(
            DEFAULT_ALIGNMENT, ty.dtype, False)), STORAGE_TYPE)
        value = Call(_ALLOC_TENSOR, (storage, int64_constant(0), int64_constant(ty.shape)), _tensor_attrs(ty.dtype))
        return self.bind(out, "tensor", value, ty)

    def dynamic_alloc(self, ty: TensorType, shape: Var, out: list) -> Var:
        storage = self.bind(out, "storage", Call(_ALLOC_STORAGE, (shape,), _storage_attrs(
            DEFAULT_ALIGNMENT, ty.dtype, True)), STORAGE_TYPE)
        value = Call(_ALLOC_TENSOR, (storage, int64_constant(0), shape), _tensor_attrs(ty.dtype))
        return self.bind(out, "tensor", value, ty)


class ManifestAlloc(Pass):
    name = "ManifestAlloc"

    def transform_module(self, mod: IRModule) -> IRModule:
        lowerer = _Lowerer(mod)
        functions = {}
        for gv, fn in mod.functions.items():
            lowerer.in_place = lowerer.proven.get(gv, frozenset())
            functions[gv] = lowerer.lower_function(fn)
        new = mod.with_functions(functions)
        if STORAGE_TYPE_DATA.header not in new.type_definitions:
            new.add_type(STORAGE_TYPE_DATA)
        return new


def _is_shape_of(prim: Function) -> bool:
    """Whether ``prim`` is ``shape_of`` of its one tensor parameter, with int64 results (what the VM's
    ShapeOf instruction makes)."""
    body = prim.body
    return (len(prim.params) == 1 and isinstance(body, Call) and isinstance(body.op, Op)
            and body.op.name == "shape_of" and len(body.args) == 1 and body.args[0] is prim.params[0]
            and isinstance(known_type(body), TensorType) and known_type(body).dtype == "int64")
