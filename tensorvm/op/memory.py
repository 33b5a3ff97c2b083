"""The memory dialect: explicit storage, tensors and kernel calls of lowered VM code.

``ManifestAlloc`` rewrites every kernel call into destination-passing style with these ops; the
VM's code generator turns each into one instruction (see ``tensorvm/transform/vm_pipeline.py``):

* ``memory.alloc_storage(size, alignment=64, dtype_hint, size_from_shape=False) -> Storage``: ``size`` is an
  int64 scalar holding bytes, or with ``size_from_shape=True`` an int64 1-D shape whose product times
  the dtype's itemsize is the byte count (so no size-arithmetic kernel is needed for dynamic shapes).
* ``memory.alloc_tensor(storage, offset, shape, dtype)``: a tensor view at byte ``offset`` (an int64
  scalar) in ``storage``; ``shape`` is an int64 1-D tensor, a ``Constant`` when static.
* ``vm.invoke_tvm_op(@prim, (ins...), (outs...)) -> ()``: run the kernel of a primitive function,
  writing its results into the preallocated outputs.
* ``vm.shape_func(@prim, (ins...), (out_shapes...), is_input=[...]) -> ()``: run the composed shape
  function of ``@prim``; input ``i`` is the argument's data when ``is_input[i]`` else its shape
  (a tuple of shapes for a tuple-typed argument); outputs are int64 1-D shape tensors.
* ``vm.shape_of(t) -> Tensor[(ndim), int64]``; ``vm.reshape_tensor(t, newshape)`` (a zero-copy view);
  ``memory.kill(v) -> ()`` (drop a register's reference early).

A storage has the type ``Storage`` (a ``TypeCall`` of the ADT ``type Storage {}`` without
constructors, as in Relay). The allocating and calling ops have no meaning outside the VM, so their
kernels raise ``UnsupportedError``; ``vm.shape_of`` and ``vm.reshape_tensor`` are pure and have kernels.
"""

from __future__ import annotations

import numpy as np

from ..errors import TypeInferenceError, UnsupportedError
from ..ir.types import (
    Any,
    FuncType,
    GlobalTypeVar,
    TensorType,
    TupleType,
    Type,
    TypeCall,
    TypeData,
    normalize_dtype,
)
from .registry import REQUIRED, AttrDef, OpDef, OpPattern, register_op

__all__ = [
    "STORAGE_TYPE", "STORAGE_TYPE_VAR", "STORAGE_TYPE_DATA", "UNIT_TYPE", "MEMORY_OP_NAMES", "is_storage_type",
]

STORAGE_TYPE_VAR = GlobalTypeVar("Storage")
STORAGE_TYPE = TypeCall(STORAGE_TYPE_VAR, ())
# Added to a module by ManifestAlloc so the lowered module is self-describing.
STORAGE_TYPE_DATA = TypeData(STORAGE_TYPE_VAR, (), ())
UNIT_TYPE = TupleType(())

MEMORY_OP_NAMES = frozenset({
    "memory.alloc_storage", "memory.alloc_tensor", "memory.kill",
    "vm.invoke_tvm_op", "vm.shape_func", "vm.shape_of", "vm.reshape_tensor",
})


def is_storage_type(ty: Type) -> bool:
    return isinstance(ty, TypeCall) and ty.func == STORAGE_TYPE_VAR


# --- attribute converters ----------------------------------------------------------------------
def _alignment(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value & (value - 1):
        raise ValueError("expected a positive power of two")
    return value


def _is_input(value) -> tuple:
    flags = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if not all(isinstance(f, (bool, int)) and int(f) in (0, 1) for f in flags):
        raise ValueError("expected a list of 0/1 flags, one per input")
    return tuple(int(f) for f in flags)


def _bool(value) -> bool:
    if not isinstance(value, (bool, int)):
        raise ValueError("expected a bool")
    return bool(value)


# --- type relation helpers ---------------------------------------------------------------------
def _expect_int64_scalar(op: str, ty: Type, what: str) -> None:
    if not (isinstance(ty, TensorType) and ty.dtype == "int64" and ty.ndim == 0):
        raise TypeInferenceError(f"{op}: expected {what} to be an int64 scalar, got {ty}")


def _expect_shape_tensor(op: str, ty: Type, what: str) -> int | None:
    """Check an int64 1-D shape tensor; return its length (the rank it describes) when static."""
    if not (isinstance(ty, TensorType) and ty.dtype == "int64" and ty.ndim == 1):
        raise TypeInferenceError(f"{op}: expected {what} to be an int64 1-D shape tensor, got {ty}")
    return ty.shape[0] if isinstance(ty.shape[0], int) else None


def _shape_from(op: str, ty: Type, const, what: str) -> tuple:
    """The type-level shape described by a shape argument: its values if constant, else Any dims."""
    rank = _expect_shape_tensor(op, ty, what)
    if const is not None:
        dims = [int(d) for d in np.asarray(const).reshape(-1)]
        if any(d < 0 for d in dims):
            raise TypeInferenceError(f"{op}: {what} must hold non-negative dims, got {dims}")
        return tuple(dims)
    if rank is None:
        raise TypeInferenceError(f"{op}: the length of {what} must be static, got {ty}")
    return (Any(),) * rank


def _flat_count(ty: Type) -> int:
    if isinstance(ty, TupleType):
        return sum(_flat_count(f) for f in ty.fields)
    return 1


def _expect_tuple(op: str, ty: Type, what: str) -> TupleType:
    if not isinstance(ty, TupleType):
        raise TypeInferenceError(f"{op}: expected {what} to be a tuple, got {ty}")
    return ty


def _check_callee(op: str, fn_ty: Type, ins: TupleType) -> FuncType | None:
    if not isinstance(fn_ty, FuncType):
        raise TypeInferenceError(f"{op}: expected a primitive function as the first argument, got {fn_ty}")
    if len(fn_ty.arg_types) != len(ins.fields):
        raise TypeInferenceError(
            f"{op}: the primitive takes {len(fn_ty.arg_types)} input(s), got {len(ins.fields)}")
    return fn_ty


# --- type relations ----------------------------------------------------------------------------
def _alloc_storage_rel(types, attrs, consts=None):
    op = "memory.alloc_storage"
    if attrs.size_from_shape:
        _expect_shape_tensor(op, types[0], "the size (a shape, since size_from_shape=True)")
    else:
        _expect_int64_scalar(op, types[0], "the size in bytes")
        if consts is not None and consts[0] is not None and int(consts[0]) < 0:
            raise TypeInferenceError(f"{op}: the size must be >= 0, got {int(consts[0])}")
    return STORAGE_TYPE


def _alloc_tensor_rel(types, attrs, consts=None):
    op = "memory.alloc_tensor"
    if not is_storage_type(types[0]):
        raise TypeInferenceError(f"{op}: expected a Storage as the first argument, got {types[0]}")
    _expect_int64_scalar(op, types[1], "the offset")
    shape_const = consts[2] if consts is not None else None
    return TensorType(_shape_from(op, types[2], shape_const, "the shape"), attrs.dtype)


def _invoke_tvm_op_rel(types, attrs, consts=None):
    op = "vm.invoke_tvm_op"
    ins = _expect_tuple(op, types[1], "the inputs")
    outs = _expect_tuple(op, types[2], "the outputs")
    fn_ty = _check_callee(op, types[0], ins)
    expected = _flat_count(fn_ty.ret_type)
    if len(outs.fields) != expected:
        raise TypeInferenceError(f"{op}: the primitive has {expected} output(s), got {len(outs.fields)}")
    return UNIT_TYPE


def _shape_func_rel(types, attrs, consts=None):
    op = "vm.shape_func"
    ins = _expect_tuple(op, types[1], "the inputs")
    outs = _expect_tuple(op, types[2], "the output shapes")
    _check_callee(op, types[0], ins)
    if len(attrs.is_input) != len(ins.fields):
        raise TypeInferenceError(
            f"{op}: is_input has {len(attrs.is_input)} flag(s) for {len(ins.fields)} input(s)")
    for i, ty in enumerate(outs.fields):
        _expect_shape_tensor(op, ty, f"output shape {i}")
    return UNIT_TYPE


def _shape_of_rel(types, attrs, consts=None):
    ty = types[0]
    if not isinstance(ty, TensorType):
        raise TypeInferenceError(f"vm.shape_of: expected a tensor, got {ty}")
    return TensorType((ty.ndim,), "int64")


def _reshape_tensor_rel(types, attrs, consts=None):
    op = "vm.reshape_tensor"
    data = types[0]
    if not isinstance(data, TensorType):
        raise TypeInferenceError(f"{op}: expected a tensor, got {data}")
    shape = _shape_from(op, types[1], consts[1] if consts is not None else None, "the new shape")
    if data.is_static and all(isinstance(d, int) for d in shape):
        if int(np.prod(data.shape, dtype=np.int64)) != int(np.prod(shape, dtype=np.int64)):
            raise TypeInferenceError(f"{op}: cannot view {data} as shape {shape}")
    return TensorType(shape, data.dtype)


def _kill_rel(types, attrs, consts=None):
    return UNIT_TYPE


# --- kernels -----------------------------------------------------------------------------------
def _vm_only(name: str):
    def kernel(attrs, *args):
        raise UnsupportedError(
            f"{name} is an op of lowered VM code (the memory dialect); it runs on the VM "
            f"(tensorvm.vm), not on the interpreter")

    return kernel


def _shape_of_kernel(attrs, data):
    return np.asarray(np.shape(data), dtype="int64")


def _reshape_tensor_kernel(attrs, data, newshape):
    return np.reshape(data, tuple(int(d) for d in np.asarray(newshape).reshape(-1)))


def _register():
    register_op(OpDef(
        name="memory.alloc_storage", kind="dialect", num_inputs=1, type_rel=_alloc_storage_rel,
        kernel=_vm_only("memory.alloc_storage"), pattern=OpPattern.OPAQUE,
        attrs=(AttrDef("alignment", 64, _alignment, "byte alignment of the block"),
               AttrDef("dtype_hint", "float32", normalize_dtype, "dtype of the tensors it will hold"),
               AttrDef("size_from_shape", False, _bool, "the size argument is a shape, not bytes")),
        doc="Allocate a storage block of the given size in bytes (or of a shape's size in dtype_hint).",
    ))
    register_op(OpDef(
        name="memory.alloc_tensor", kind="dialect", num_inputs=3, type_rel=_alloc_tensor_rel,
        kernel=_vm_only("memory.alloc_tensor"), pattern=OpPattern.OPAQUE,
        attrs=(AttrDef("dtype", "float32", normalize_dtype, "dtype of the tensor"),),
        doc="A tensor of the given shape viewing a storage block at a byte offset.",
    ))
    register_op(OpDef(
        name="vm.invoke_tvm_op", kind="dialect", num_inputs=3, type_rel=_invoke_tvm_op_rel,
        kernel=_vm_only("vm.invoke_tvm_op"), pattern=OpPattern.OPAQUE,
        doc="Call a primitive function's kernel in destination-passing style.",
    ))
    register_op(OpDef(
        name="vm.shape_func", kind="dialect", num_inputs=3, type_rel=_shape_func_rel,
        kernel=_vm_only("vm.shape_func"), pattern=OpPattern.OPAQUE,
        attrs=(AttrDef("is_input", REQUIRED, _is_input, "per input: 1 = pass data, 0 = pass shape"),),
        doc="Run a primitive function's composed shape function into preallocated shape tensors.",
    ))
    register_op(OpDef(
        name="vm.shape_of", kind="dialect", num_inputs=1, type_rel=_shape_of_rel, kernel=_shape_of_kernel,
        pattern=OpPattern.OPAQUE, shape_func=lambda attrs, args: [(len(args[0]),)],
        doc="The shape of a tensor as an int64 1-D tensor.",
    ))
    register_op(OpDef(
        name="vm.reshape_tensor", kind="dialect", num_inputs=2, type_rel=_reshape_tensor_rel,
        kernel=_reshape_tensor_kernel, pattern=OpPattern.OPAQUE,
        shape_func=lambda attrs, args: [tuple(int(d) for d in np.asarray(args[1]).reshape(-1))],
        shape_func_data_dependent=(False, True),
        doc="A zero-copy view of a tensor with a new shape (same number of elements).",
    ))
    register_op(OpDef(
        name="memory.kill", kind="dialect", num_inputs=1, type_rel=_kill_rel, kernel=_vm_only("memory.kill"),
        pattern=OpPattern.OPAQUE, doc="Drop a register's reference after its last use.",
    ))


_register()
