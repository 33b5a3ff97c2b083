"""Which storages of a VM function native mode places in the function's arena (docs/native_mode.md,
"Arena"), and over which instructions each one's bytes are in use.

Invariant: a storage is a slot only when every value made from it stays in the function's registers and is
gone when the function's C frame ends (or loops back through a self tail call, which releases every
register first): the storage is written once, by an ``AllocStorage``, and read only as the storage of its
tensors; its tensors and their views (reshapes) are each written once and read only by instructions that
do not keep them (kernels, ``ShapeOf``, reshapes, sizes, offsets and shapes read as numbers, a branch's
test, ``DeviceCopy``, an ADT that nothing reads), never moved, returned, put into an ADT that is read or a
closure, or passed to a call. (A register the function's end releases holds no bytes in use: every view is
released before its arena's call ends.) A slot's span
runs from the first to the last instruction reading or writing any of its tensors or views, in instruction
order. Jumps inside a function only go forward, so on any path two slots whose spans do not overlap are
never in use at the same time: they may share bytes. A function with a backward jump has no slots.
"""

from __future__ import annotations

from . import bytecode as bc

__all__ = ["arena_slots"]

# instructions that read a tensor without keeping a reference to it (or make a view that is tracked)
_READS_ONLY = (bc.InvokePacked, bc.ShapeOf, bc.ReshapeTensor, bc.AllocStorage, bc.AllocTensor, bc.AllocTensorReg,
               bc.If, bc.DeviceCopy)


def arena_slots(fn: bc.VMFunction) -> tuple:
    """((pc of the AllocStorage, first pc, last pc), ...) of ``fn``'s arena slots, ordered by that pc."""
    code = fn.instructions
    for ins in code:
        if (isinstance(ins, bc.If) and min(ins.true_offset, ins.false_offset) <= 0) or \
                (isinstance(ins, bc.Goto) and ins.pc_offset <= 0):
            return ()
    writers: dict[int, list[int]] = {}
    for pc, ins in enumerate(code):
        if not isinstance(ins, bc.KillRegister):
            for reg in ins.writes():
                writers.setdefault(reg, []).append(pc)
    params = set(range(len(fn.params)))

    def written_once(reg: int) -> bool:
        return reg not in params and len(writers.get(reg, ())) == 1

    storages = {reg for reg, pcs in writers.items() if written_once(reg) and isinstance(code[pcs[0]], bc.AllocStorage)}
    bytes_of: dict[int, int] = {}  # a tensor or view -> the storage it views
    rejected: set[int] = set()
    for ins in code:  # (forward jumps, one writer each: a value is made before any instruction reads it)
        if isinstance(ins, (bc.AllocTensor, bc.AllocTensorReg)) and ins.storage in storages:
            source = ins.storage
        elif isinstance(ins, bc.ReshapeTensor) and ins.tensor in bytes_of:
            source = bytes_of[ins.tensor]
        else:
            continue
        if written_once(ins.dst):
            bytes_of[ins.dst] = source
        else:
            rejected.add(source)
    # an ADT (a tuple of a kernel's outputs) that nothing reads holds references but never reaches the bytes
    read = {reg for ins in code if not isinstance(ins, bc.KillRegister) for reg in ins.reads()}
    spans: dict[int, list[int]] = {}
    for pc, ins in enumerate(code):
        if isinstance(ins, bc.KillRegister):
            continue
        unread_adt = isinstance(ins, bc.AllocADT) and ins.dst not in read and ins.tag != bc.REF_WRITE_TAG
        for reg in ins.reads():
            if reg in bytes_of and not isinstance(ins, _READS_ONLY) and not unread_adt:
                rejected.add(bytes_of[reg])
            if reg in storages and not (isinstance(ins, (bc.AllocTensor, bc.AllocTensorReg)) and reg == ins.storage):
                rejected.add(reg)
        for reg in (*ins.reads(), *ins.writes()):
            if reg in bytes_of:
                spans.setdefault(bytes_of[reg], [pc, pc])[1] = pc
    return tuple(sorted((writers[storage][0], first, last) for storage, (first, last) in spans.items()
                        if storage not in rejected))
