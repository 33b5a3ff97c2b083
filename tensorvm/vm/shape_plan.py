"""Decode-time analysis: which registers of a function can hold shapes as Python tuples.

The bytecode keeps shapes in int64 1-D tensors, as the Relay VM does: ``ShapeOf`` makes one, a shape
function writes its results into preallocated ones, and ``AllocStorage(size_from_shape)``,
``AllocTensorReg`` and ``ReshapeTensor`` read them. In Python, each of those tensors costs an
allocation, a NumPy conversion and a ``tolist()``, which made a dynamic kernel call ~20x dearer than a
static one. So the VM (both exec modes) keeps such a register as a tuple of ints when the bytecode
proves every use of it is a shape use:

* a *tuple-mode shape function call* is an ``InvokePacked`` of a shape function (a kernel with a
  ``tuple_form``) whose every output register is written only by one ``AllocTensor`` (the int64 buffer
  the bytecode preallocates) and read only in shape positions; it is run as
  ``outputs = shape_func.tuple_form(*inputs)`` and its preallocations are skipped (with their storage
  when nothing else uses it);
* a register written only by ``ShapeOf``, or only by one ``LoadConst`` of an int64 1-D constant, and
  read only in shape positions holds a tuple too;
* shape positions: a by-shape input of a shape function, the size of ``AllocStorage(size_from_shape)``,
  the shape of ``AllocTensorReg``, the new shape of ``ReshapeTensor``.

Anything else (a shape passed to a kernel as data, stored in a tuple, returned, moved) keeps the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import bytecode as bc

__all__ = ["ShapePlan", "shape_plan"]

_SHAPE_USE = "shape"  # a read that only needs the shape's values
_SF_OUT = "sf_out"


@dataclass
class ShapePlan:
    """``tuple_regs``: registers holding tuples; ``tuple_calls``: pcs of shape-function calls run in tuple
    form; ``dropped``: pcs of instructions that become no-ops (preallocations of tuple outputs)."""

    tuple_regs: set = field(default_factory=set)
    tuple_calls: set = field(default_factory=set)
    dropped: set = field(default_factory=set)


def _tuple_form(forms, index):
    return forms[index] if 0 <= index < len(forms) else None


def shape_plan(fn: bc.VMFunction, forms, constants) -> ShapePlan:
    """The tuple-shape plan of ``fn``; ``forms[i]`` is the tuple form of kernel ``i`` when it is a shape
    function that has one (``kernel_python.build_shape_func_tuples``), else None."""
    code = fn.instructions
    writers: dict[int, list] = {}
    readers: dict[int, list] = {}  # register -> [(pc, role)]
    for pc, ins in enumerate(code):
        for reg in ins.writes():
            writers.setdefault(reg, []).append(pc)
        roles = _read_roles(ins, forms)
        for reg, role in roles:
            readers.setdefault(reg, []).append((pc, role))
    nparams = len(fn.params)
    plan = ShapePlan()

    def shape_only(reg: int, allow_output_at: int | None = None) -> bool:
        for pc, role in readers.get(reg, ()):
            if role == _SHAPE_USE:
                continue
            if role == _SF_OUT and pc == allow_output_at:
                continue
            return False
        return True

    # 1. shape-function calls whose outputs can be tuples
    for pc, ins in enumerate(code):
        if not isinstance(ins, bc.InvokePacked):
            continue
        form = _tuple_form(forms, ins.packed_index)
        if form is None or len(ins.inputs) != len(form.flat_is_input) or ins.output_size != form.num_outputs:
            continue
        ok = len(set(ins.outputs)) == len(ins.outputs) and not set(ins.outputs) & set(ins.inputs)
        for out in ins.outputs:
            pcs = writers.get(out, [])
            if not ok or out < nparams or len(pcs) != 1 or not isinstance(code[pcs[0]], bc.AllocTensor) \
                    or code[pcs[0]].dtype != "int64" or len(code[pcs[0]].shape) != 1 or pcs[0] > pc \
                    or not shape_only(out, allow_output_at=pc):
                ok = False
        if ok:
            plan.tuple_calls.add(pc)
            plan.tuple_regs.update(ins.outputs)
            plan.dropped.update(writers[out][0] for out in ins.outputs)
    # 2. ShapeOf and constant shapes read only as shapes
    for reg, pcs in writers.items():
        if reg < nparams or reg in plan.tuple_regs:
            continue
        kinds = {type(code[pc]) for pc in pcs}
        if kinds == {bc.ShapeOf}:
            pass
        elif kinds == {bc.LoadConst} and len(pcs) == 1:
            data = constants[code[pcs[0]].const_index]
            if data.ndim != 1 or data.dtype.name != "int64":
                continue
        else:
            continue
        if shape_only(reg):
            plan.tuple_regs.add(reg)
    # 3. storages whose every tensor was a dropped preallocation
    for pc, ins in enumerate(code):
        if not isinstance(ins, bc.AllocStorage) or len(writers.get(ins.dst, ())) != 1:
            continue
        uses = readers.get(ins.dst, [])
        if uses and all(use_pc in plan.dropped for use_pc, _ in uses):
            plan.dropped.add(pc)
    return plan


def _read_roles(ins, forms) -> list:
    """``(register, role)`` for every register ``ins`` reads."""
    if isinstance(ins, bc.InvokePacked):
        form = _tuple_form(forms, ins.packed_index)
        if form is None or len(ins.inputs) != len(form.flat_is_input):
            return [(r, "other") for r in ins.args]
        roles = [(r, "other" if by_data else _SHAPE_USE) for r, by_data in zip(ins.inputs, form.flat_is_input)]
        return roles + [(r, _SF_OUT) for r in ins.outputs]
    if isinstance(ins, bc.AllocStorage):
        return [(ins.size, _SHAPE_USE if ins.size_from_shape else "other")]
    if isinstance(ins, bc.AllocTensorReg):
        return [(ins.storage, "other"), (ins.offset, "other"), (ins.shape_register, _SHAPE_USE)]
    if isinstance(ins, bc.ReshapeTensor):
        return [(ins.tensor, "other"), (ins.newshape, _SHAPE_USE)]
    return [(r, "other") for r in ins.reads()]
