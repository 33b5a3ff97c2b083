"""Decode-time analysis for running a dynamic function as if it were compiled for its input shapes.

A function with dynamic dims computes, on every call, the shapes of its intermediates (``ShapeOf``,
shape functions) and sometimes small tensors made only from shapes and constants (BERT's position ids
and attention mask, a reshape's target built by ``Shape -> Gather -> Concat``). None of that depends on
the inputs' *values*: given the parameters' shapes, it is fixed. This module finds that part of a
straight-line function's bytecode (its *shape slice*), so the VM can run it once per distinct tuple of
parameter shapes, keep the results, and from then on run only the rest (the *body*) with those results
preset in the register file: the same kernels and allocations a statically shaped executable runs.

A register is *shape-determined* when its value is a function of the parameters' shapes and the
constants alone:

* ``LoadConst`` / ``LoadConsti`` results;
* ``ShapeOf`` of a tensor whose shape is known from the parameters' shapes (a parameter, a tensor
  allocated with a static or shape-determined shape, a reshape to a shape-determined shape);
* the outputs of a kernel (a shape function or any other; all kernels are pure) whose every input is
  shape-determined, when nothing else writes those outputs;
* the tensors allocated for such outputs, and reshapes of shape-determined tensors to
  shape-determined shapes.

A shape-determined tensor that could reach the caller (returned, put in a tuple, moved), directly or
through reshapes, is excluded: every call must hand out its own buffer.

The slice's kernels write into memory of their own (``ShapeSlice.private``), not into the storage the
memory planner gave their outputs: the planner lets tensors whose lifetimes do not overlap share bytes,
but a preset value lives for every later call with its key, so a later tensor of the body (or of the
slice) placed on the same bytes would overwrite it. Nothing else writes a preset: the body skips the
instructions that computed it, a shape-determined output has one writing kernel, and kernels write only
into tensors allocated for them (never into a view, a constant or a shape).

The slice also makes the function's *arena* once per key: every storage whose size is shape-determined
and whose tensors all stay in the function (none can reach the caller), with those tensors and the
reshapes of them. A call writes such a buffer before reading it and nothing of it outlives the call, so
one set of buffers serves every call with that key, and the body runs without their allocations.

The arena is *placed*, not a buffer per storage: each arena storage is live in the body from the first to
the last instruction that reads or writes any tensor or view of it (``ShapeSlice.arena``), and storages
whose spans do not overlap share bytes of one block (the VM places them with the runtime's planner once
per key). Besides the memory, this keeps the arena as small as the most bytes live at once, so that a
kernel's output lands on bytes a recent kernel touched (still in cache) instead of on a buffer of its own
last written a whole call ago: MobileNetV3-small at batch 8 held 54 MB of arena, more than the last-level
cache. A kernel's inputs and outputs are used at the same instruction, so they never share bytes.

Only straight-line functions qualify: no branches, calls or closures, every parameter a tensor, every
register written once, and every kernel output a tensor allocated for it (as the compiler emits). The
slice keeps the storages its tensors live in; the body drops a storage only when the slice alone reads
it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.types import TensorType
from . import bytecode as bc

__all__ = ["ShapeSlice", "shape_slice"]

_STRAIGHT_LINE = (bc.LoadConst, bc.LoadConsti, bc.AllocStorage, bc.AllocTensor, bc.AllocTensorReg, bc.InvokePacked,
                  bc.ShapeOf, bc.ReshapeTensor, bc.KillRegister, bc.Ret, bc.Move, bc.AllocADT, bc.GetField)
_ESCAPES = (bc.Ret, bc.Move, bc.AllocADT, bc.GetField)


@dataclass(frozen=True)
class ShapeSlice:
    """``slice_pcs``: the instructions to run once per parameter-shape key (in order); ``preset``: the
    registers they compute that the body reads (their values are kept and preset); ``body_skip``: pcs
    the body leaves out (the slice's instructions, storages only the slice uses, kills of presets)."""

    slice_pcs: frozenset
    preset: tuple
    body_skip: frozenset
    placeholders: frozenset  # slice pcs allocating a tensor the slice reads only the shape of
    private: frozenset = frozenset()  # slice pcs allocating a kernel's output: it gets memory of its own
    arena: tuple = ()  # (storage register, alignment, first body pc, last body pc) of each arena storage
    #                    the body uses; the slice makes these storages (``scratch``: no memory of its own
    #                    is needed for them, their tensors are placed in one block afterwards)
    scratch: frozenset = frozenset()  # slice pcs allocating those storages


def shape_slice(fn: bc.VMFunction) -> ShapeSlice | None:
    """``fn``'s shape slice, or None when ``fn`` does not qualify or nothing in it is shape-determined."""
    code = fn.instructions
    types = fn.param_types or ()
    if len(types) != len(fn.params) or not all(isinstance(ty, TensorType) for ty in types):
        return None
    if not all(isinstance(ins, _STRAIGHT_LINE) for ins in code) or not any(isinstance(ins, bc.Ret) for ins in code):
        return None
    writer: dict[int, int] = {}  # register -> the pc writing it (kills aside, each is written once)
    for pc, ins in enumerate(code):
        if isinstance(ins, bc.KillRegister):
            continue
        for reg in ins.writes():
            if reg < len(fn.params) or reg in writer:
                return None
            writer[reg] = pc
    kernel_outputs: dict[int, int] = {}
    for ins in code:
        if isinstance(ins, bc.InvokePacked):
            for reg in ins.outputs:
                kernel_outputs[reg] = kernel_outputs.get(reg, 0) + 1

    escaping: set[int] = set()  # registers whose value may reach the caller, through reshapes too
    for ins in reversed(code):
        if isinstance(ins, _ESCAPES):
            escaping.update(ins.reads())
        elif isinstance(ins, bc.ReshapeTensor) and ins.dst in escaping:
            escaping.add(ins.tensor)

    known_shape: set[int] = set(range(len(fn.params)))  # tensors whose shape follows from the key
    determined: set[int] = set()                        # registers whose value follows from the key
    derived_pcs: set[int] = set()
    private: set[int] = set()  # allocations of the slice kernels' outputs

    def determine(pc: int, regs) -> None:
        determined.update(regs)
        derived_pcs.add(pc)

    def allocated(reg: int) -> bool:
        return reg in writer and isinstance(code[writer[reg]], (bc.AllocTensor, bc.AllocTensorReg))

    if not all(allocated(r) for r in kernel_outputs):
        return None  # a kernel writing into a view, a constant or a shape could write into a preset value

    for pc, ins in enumerate(code):
        if isinstance(ins, (bc.LoadConst, bc.LoadConsti)):
            if ins.dst not in escaping:
                determine(pc, (ins.dst,))
        elif isinstance(ins, bc.ShapeOf):
            if ins.tensor in known_shape and ins.dst not in escaping:
                determine(pc, (ins.dst,))
        elif isinstance(ins, bc.AllocTensor) or (isinstance(ins, bc.AllocTensorReg)
                                                  and ins.shape_register in determined):
            known_shape.add(ins.dst)
        elif isinstance(ins, bc.ReshapeTensor):
            if ins.newshape in determined:
                known_shape.add(ins.dst)
                if ins.tensor in determined and ins.dst not in escaping:
                    determine(pc, (ins.dst,))
        elif isinstance(ins, bc.InvokePacked):
            outs = ins.outputs
            if all(r in determined for r in ins.inputs) and all(
                    allocated(r) and r in known_shape and kernel_outputs[r] == 1 and r not in escaping for r in outs):
                determine(pc, outs)
                for r in outs:  # the output buffers are made once, by the slice, in memory of their own
                    derived_pcs.add(writer[r])
                    private.add(writer[r])
    # storages of a key-determined size holding only tensors that stay in the function: the slice makes
    # them and their tensors once per key, an arena every call reuses (the body writes a buffer before
    # it reads it on each call, and nothing of it outlives the call)
    tensors_in: dict[int, list[int]] = {}
    for pc, ins in enumerate(code):
        if isinstance(ins, (bc.AllocTensor, bc.AllocTensorReg)):
            tensors_in.setdefault(ins.storage, []).append(pc)
    arena: set[int] = set()  # registers of the arena: storages, tensors and views of them
    bytes_of: dict[int, int] = {}  # arena tensor or view -> the storage whose bytes it views
    for storage, pcs in tensors_in.items():
        alloc = code[writer[storage]] if storage in writer else None
        if isinstance(alloc, bc.AllocStorage) and alloc.size in determined and all(
                code[p].dst not in escaping and code[p].offset in determined
                and (isinstance(code[p], bc.AllocTensor) or code[p].shape_register in determined) for p in pcs):
            arena.add(storage)
            derived_pcs.add(writer[storage])
            for p in pcs:
                arena.add(code[p].dst)
                bytes_of[code[p].dst] = storage
                derived_pcs.add(p)
    for pc, ins in enumerate(code):
        if isinstance(ins, bc.ReshapeTensor) and ins.tensor in arena and ins.newshape in determined \
                and ins.dst not in escaping:
            arena.add(ins.dst)
            bytes_of[ins.dst] = bytes_of[ins.tensor]
            derived_pcs.add(pc)
    if not arena and not any(isinstance(code[pc], (bc.ShapeOf, bc.InvokePacked)) for pc in derived_pcs):
        return None  # nothing computed per call that the key fixes: no gain

    # storages the slice's tensors live in go into the slice; the body keeps those it also reads
    readers: dict[int, set] = {}
    for pc, ins in enumerate(code):
        if not isinstance(ins, bc.KillRegister):
            for reg in ins.reads():
                readers.setdefault(reg, set()).add(pc)
    # the slice reads the shapes of some tensors it does not compute: they become placeholders (the same
    # shape, no memory), and views of them the same views of the placeholders
    slice_pcs = set(derived_pcs)
    placeholders: set[int] = set()
    pending = [pc for pc in derived_pcs if isinstance(code[pc], bc.ShapeOf)]
    while pending:
        ins = code[pending.pop()]
        reg = ins.tensor
        pc = writer.get(reg)
        if pc is None or pc in slice_pcs:
            continue  # a parameter, or made by the slice
        slice_pcs.add(pc)
        if isinstance(code[pc], bc.ReshapeTensor):
            pending.append(pc)
        else:
            placeholders.add(pc)
    body_skip = set(derived_pcs)
    for pc, ins in enumerate(code):
        if isinstance(ins, bc.AllocStorage):
            users = readers.get(ins.dst, set())
            if users & derived_pcs:
                slice_pcs.add(pc)
                if users <= derived_pcs:
                    body_skip.add(pc)
    body_regs = set()
    for pc, ins in enumerate(code):
        if pc not in body_skip and not isinstance(ins, bc.KillRegister):
            body_regs.update(ins.reads())
    kept = determined | arena
    preset = tuple(sorted(r for r in kept if r in body_regs))
    dropped_storages = {code[pc].dst for pc in body_skip if isinstance(code[pc], bc.AllocStorage)}
    for pc, ins in enumerate(code):
        if isinstance(ins, bc.KillRegister) and (ins.dst in kept or ins.dst in dropped_storages):
            body_skip.add(pc)
    spans = _arena_spans(code, body_skip, bytes_of)
    placed = tuple((storage, code[writer[storage]].alignment, *spans[storage]) for storage in sorted(spans))
    return ShapeSlice(frozenset(slice_pcs), preset, frozenset(body_skip), frozenset(placeholders),
                      frozenset(private), placed, frozenset(writer[storage] for storage in spans))


def _arena_spans(code, body_skip, bytes_of: dict) -> dict:
    """{arena storage: [first, last] body pc reading or writing a tensor or view of it} (a reshape the body
    makes of such a tensor views the same bytes; a storage the body never touches has no span)."""
    bytes_of = dict(bytes_of)
    spans: dict[int, list] = {}
    for pc, ins in enumerate(code):
        if pc in body_skip or isinstance(ins, bc.KillRegister):
            continue
        if isinstance(ins, bc.ReshapeTensor) and ins.tensor in bytes_of:
            bytes_of[ins.dst] = bytes_of[ins.tensor]
        for reg in (*ins.reads(), *ins.writes()):
            storage = bytes_of.get(reg)
            if storage is not None:
                spans.setdefault(storage, [pc, pc])[1] = pc
    return spans
