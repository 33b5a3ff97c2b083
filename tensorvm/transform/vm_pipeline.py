"""``lower_for_vm``: the passes that turn a module into the lowered form the VM compiles.

The lowered module (the contract with ``tensorvm/vm/codegen.py``):

1. Every global is a *primitive* function (``Primitive=1``, named ``fused_<ops>``, a typed body of
   op calls, tuples and projections; optionally ``reshape_only=1``) or a *VM function* in A-normal
   form: a chain of ``let %v = <value>;`` ending in an atom (var, constant, global) or an
   ``If``/``Match`` whose branches are again such chains. A value is an atom, a call with atomic
   callee and arguments, a tuple or projection of atoms, an ``If``/``Match``, or a memory-dialect
   call. No function literal remains: a closure is a global with ``Closure=1`` of the form
   ``fn (captured...) { fn (params...) { body } }`` and its use site is ``@lifted(captured...)``
   (AllocClosure); a global used as a value is AllocClosure with no captures. ``@f(args)`` ->
   Invoke, ``%clo(args)`` -> InvokeClosure, ``Ctor(args)`` -> AllocADT, ``(a, b)`` -> AllocADT tag 0,
   ``%t.i`` -> GetField, ``Constant`` -> LoadConst.
2. Kernel calls are explicit, in destination-passing style, with the ops of ``tensorvm/op/memory.py``:
   ``memory.alloc_storage``, ``memory.alloc_tensor``, ``vm.invoke_tvm_op``, ``vm.shape_of``,
   ``vm.shape_func``, ``vm.reshape_tensor``, ``memory.kill``. The kernels for target "python" come
   from ``tensorvm/vm/kernel_python.py`` (``build_kernel``, ``build_shape_func``).
3. Static allocations of each block share one arena (``MemoryPlan``; static tensors that escape the
   block together, e.g. the arguments of a tail call, share one storage side by side) and dynamic
   values are killed after their last use (``ManifestLifetimes``).

Details of the lowered form the code generator must know:

* ``vm.invoke_tvm_op``, ``vm.shape_func`` and ``memory.kill`` have type ``()`` and are let-bound to
  variables that are never used (``let %unit = vm.invoke_tvm_op(...)``).
* The input and output groups of ``vm.invoke_tvm_op``/``vm.shape_func`` are ``Tuple`` literals of
  atoms written inline in the call (not let-bound). An input may be a ``Constant`` (a shape known at
  compile time, or a non-scalar constant argument of a primitive) or a variable holding a tuple (an
  ADT register, flattened at run time).
* ``is_input`` has one flag per primitive *parameter* (a tuple-typed parameter counts once). For a
  tuple-typed parameter read by shape, the input is a variable bound to the tuple of the fields'
  shape tensors (``let %in_shapes = (%s0, %s1);``), flattened at run time like any ADT input.
* A primitive returning a tuple gets one allocation per (flattened) field; its result variable is
  bound to the tuple of those tensors after the invoke (``let %v = (%tensor, %tensor1);``).
* The storage type is ``Storage`` (``TypeCall`` of ``type Storage {}``, added to the module).
* ``memory.kill(%storage)`` comes after the last use of every tensor allocated in that storage (not
  right after its ``alloc_tensor``), and only when none of those tensors escapes, so a VM may free a
  storage on ``KillRegister`` or when its last reference dies. ``memory.kill(%tensor)`` (or of a
  tuple holding dynamic tensors) drops only the register's reference: a tuple or closure may still
  hold the value. No kill follows a call whose result the block returns, so tail calls stay tail calls.
* The shape of ``alloc_tensor`` is an int64 1-D ``Constant`` (static) or a variable bound to an
  int64 shape tensor written by ``vm.shape_func`` (dynamic). Offsets and sizes are int64 scalar
  ``Constant``s; ``alloc_storage(%shape, size_from_shape=True)`` sizes the block as the product of
  the shape times the dtype's itemsize.
"""

from __future__ import annotations

from ..errors import UnsupportedError
from ..ir.module import IRModule
from .bind_params import BindParams
from .constant_arguments import ConstantArguments
from .dead_code import DeadCodeElimination
from .eliminate_common_subexpr import EliminateCommonSubexpr
from .eta_expand import EtaExpand
from .fold_constant import FoldConstant
from .fuse_lstm_cell import FuseLSTMCell
from .fuse_ops import FuseOps
from .infer_type import InferType
from .inline_primitives import InlinePrimitives
from .lambda_lift import LambdaLift
from .legalize import Legalize
from .local_refs import LocalRefsToValues
from .manifest_alloc import ManifestAlloc
from .manifest_lifetimes import ManifestLifetimes
from .memory_plan import MemoryPlan
from .pack_weights import PackWeights
from .pass_infra import Sequential
from .simplify_expr import SimplifyExpr
from .stack_shared_products import StackSharedProducts
from .to_anf import ToANormalForm

__all__ = ["lower_for_vm", "vm_passes"]


def vm_passes(opt_level: int = 3, memory_plan: bool = True, target: str | None = None) -> list:
    """The lowering passes, in order (``opt_level`` 0 puts every op in its own kernel). ``target`` "c"
    adds ``PackWeights`` (products with constant weights read them pre-packed, a C kernel's layout)."""
    passes = [
        LocalRefsToValues(),  # first: a reference that stays in its function is values (the VM holds none)
        EtaExpand(),  # type inference rejects an op used as a value
        ConstantArguments(),  # a recursive loop's weights become constants (folded, packed below)
        Legalize(),  # (before folding: what an op becomes folds too; before packing: a conv1d's weight is packed)
        InferType(),
        SimplifyExpr(),
        FoldConstant(),
        EliminateCommonSubexpr(),  # after folding: constants are compared by value
        DeadCodeElimination(),
        StackSharedProducts() if opt_level >= 1 else None,  # after folding and CSE (one node per weight)
        InferType(),
        PackWeights() if target == "c" else None,  # after folding (W^T becomes a constant), before fusion
        FuseLSTMCell() if opt_level >= 1 else None,  # an LSTM's cell math written out: one nn.lstm_cell
        InferType(),
        FuseOps(fuse_opt_level=1 if opt_level >= 1 else 0),
        ToANormalForm(),
        InlinePrimitives(),
        InferType(),
        LambdaLift(),
        InferType(),
        ManifestAlloc(),
        DeadCodeElimination(),
        MemoryPlan() if memory_plan else None,
        ManifestLifetimes(),
        InferType(),
    ]
    return [p for p in passes if p is not None]


def lower_for_vm(mod: IRModule, params: dict | None = None, opt_level: int = 3,
                 memory_plan: bool = True, target: str | None = None) -> IRModule:
    """Lower ``mod`` for the VM; ``params`` binds parameters of ``main`` to constants.

    ``memory_plan=False`` skips ``MemoryPlan`` (to measure what it saves); ``target`` is the kernels'
    target ("c" packs constant weights of matrix products for its kernels; see ``vm_passes``)."""
    if not isinstance(mod, IRModule):
        raise UnsupportedError(f"lower_for_vm expects an IRModule, got {type(mod).__name__}")
    if params:
        mod = BindParams(params)(mod)
    return Sequential(vm_passes(opt_level, memory_plan, target), opt_level=max(opt_level, 0))(mod)
