"""The decoded form: what the bytecode VM's dispatch loop runs (docs/vm.md, "The decoded form").

Loading an executable decodes each bytecode instruction once (``VirtualMachine._decode``) into a tuple
``(handler, operands...)``. ``FORMS`` is the whole table of handlers: per handler its number (what the
loop tests), the bytecode opcode(s) it runs, its operands in tuple order and what it does. It is not
an instruction set of its own: every handler runs one bytecode instruction (a few run two consecutive
ones, "fused"), with its operands resolved at load time (kernel callables, constant values, absolute
jump targets, the allocator's bound ``alloc``, shapes kept as tuples where ``shape_plan`` proves it).
A reader follows a bytecode opcode to its handlers through ``by_opcode()`` (the table in docs/vm.md is
printed by ``markdown_table()``), and a function's decoded code through ``VirtualMachine.disassemble``.

The numbering groups the handlers by eight so that the loop's tree of range tests finds every hot one
within four or five comparisons (benchmarks/vm_overhead.py section 3 compares it with a handler
function per instruction; docs/vm.md). Invariant: the dispatch loop has a branch per row here, labelled
with its name (two pairs of rows share one: ALLOC_PACKED2/3, INVOKE_CLOSURE and its tail form), and the
decoder emits tuples of exactly ``1 + len(operands)`` items (``check``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Form", "FORMS", "by_opcode", "check", "describe", "markdown_table"]


@dataclass(frozen=True)
class Form:
    """One handler of the dispatch loop."""

    name: str
    opcodes: tuple   # the bytecode opcode names it runs (two for a fused pair, in order)
    operands: tuple  # the tuple's items after the handler number
    does: str        # what the handler does, in terms of ``regs`` and the operands


def _f(name: str, opcodes: str, operands: str, does: str) -> Form:
    return Form(name, tuple(opcodes.split()), tuple(operands.split()), does)


FORMS = (
    # --- 0-7: kernels and memory
    _f("PACKED2", "InvokePacked", "kernel a b", "kernel(regs[a], regs[b])"),
    _f("PACKED3", "InvokePacked", "kernel a b c", "kernel(regs[a], regs[b], regs[c])"),
    _f("ALLOC_TENSOR", "AllocTensor", "dst storage offset shape dtype view",
       "regs[dst] = view(shape, dtype, regs[storage], offset): static shape, immediate offset"),
    _f("ALLOC_STORAGE", "AllocStorage", "dst nbytes alignment dtype_hint alloc",
       "regs[dst] = alloc(nbytes, alignment, dtype_hint): a size known at load time"),
    _f("PACKED1", "InvokePacked", "kernel a", "kernel(regs[a])"),
    _f("PACKEDN", "InvokePacked", "kernel args", "kernel(*args(regs)): any other arity (args: an itemgetter)"),
    _f("SHAPE_OF", "ShapeOf", "dst tensor shape_of",
       "regs[dst] = shape_of(regs[tensor]): a tuple where shape_plan proves it, else an int64 tensor"),
    _f("ALLOC_TENSOR_REG_T", "AllocTensorReg", "dst storage offset_reg shape dtype view offset",
       "regs[dst] = view(regs[shape], dtype, regs[storage], offset or regs[offset_reg]): the shape a tuple"),
    # --- 8-15: control flow and ADTs
    _f("MOVE", "Move DeviceCopy", "dst src",
       "regs[dst] = regs[src] (DeviceCopy too: the host is the only device, a copy is an alias)"),
    _f("IF", "If", "test value then else", "pc = then if regs[test] == value else else: the target an immediate"),
    _f("GOTO", "Goto", "target", "pc = target (absolute)"),
    _f("RET", "Ret", "result", "return regs[result] to the caller's frame (or out of the loop)"),
    _f("INVOKE", "Invoke", "dst func args", "push a frame returning into regs[dst]; run func on args(regs)"),
    _f("TAIL_INVOKE", "Invoke", "func args", "a call whose result is returned: func replaces this frame"),
    _f("GET_FIELD", "GetField", "dst obj index", "regs[dst] = regs[obj].fields[index]"),
    _f("GET_TAG", "GetTag", "dst obj", "regs[dst] = regs[obj].tag"),
    # --- 16-23: dynamic shapes and the rest of the common ones
    _f("SHAPE_FUNC_T1", "InvokePacked", "dst form inputs",
       "regs[dst] = form(*inputs(regs))[0]: a shape function in tuple form, one output"),
    _f("ALLOC_STORAGE_T", "AllocStorage", "dst shape alignment dtype_hint alloc itemsize",
       "regs[dst] = alloc(prod(regs[shape]) * itemsize, ...): the size from a shape tuple"),
    _f("LOAD", "LoadConst LoadConsti", "dst value", "regs[dst] = value (a tuple where the constant is a shape)"),
    _f("KILL", "KillRegister", "dst", "regs[dst] = None"),
    _f("ALLOC_ADT", "AllocADT", "dst tag fields", "regs[dst] = ADT(tag, fields(regs))"),
    _f("RESHAPE", "ReshapeTensor", "dst tensor newshape reshape",
       "regs[dst] = reshape(regs[tensor], regs[newshape]): the shape a tuple or an int64 tensor"),
    _f("SHAPE_FUNC_TN", "InvokePacked", "dsts form inputs",
       "regs[dsts[i]] = form(*inputs(regs))[i]: a shape function in tuple form"),
    _f("ALLOC_STORAGE_REG", "AllocStorage", "dst size alignment dtype_hint alloc",
       "regs[dst] = alloc(int(regs[size]), alignment, dtype_hint)"),
    # --- 24-31: fused pairs and closures
    _f("ALLOC_PACKED2", "AllocTensor InvokePacked", "dst storage offset shape dtype view kernel a b",
       "ALLOC_TENSOR then PACKED2 (the tensor proven in bounds of its storage at load time)"),
    _f("ALLOC_PACKED3", "AllocTensor InvokePacked", "dst storage offset shape dtype view kernel a b c",
       "ALLOC_TENSOR then PACKED3 (the tensor proven in bounds of its storage at load time)"),
    _f("ALLOC_DYN", "AllocStorage AllocTensorReg", "dst shape alignment dtype_hint alloc itemsize tensor dtype view",
       "ALLOC_STORAGE_T, then regs[tensor] = view(regs[shape], dtype, regs[dst], 0)"),
    _f("KILL2", "KillRegister KillRegister", "a b", "regs[a] = regs[b] = None"),
    _f("SHAPES_FUNC_T1", "ShapeOf InvokePacked", "dst form inputs shapes",
       "regs[d] = regs[s].shape for (d, s) in shapes (the ShapeOfs before it), then SHAPE_FUNC_T1"),
    _f("INVOKE_CLOSURE", "InvokeClosure", "dst closure args",
       "push a frame returning into regs[dst]; run the closure's function on its captured values and args"),
    _f("TAIL_INVOKE_CLOSURE", "InvokeClosure", "closure args", "INVOKE_CLOSURE replacing this frame"),
    _f("ALLOC_CLOSURE", "AllocClosure", "dst func free_vars name owner",
       "regs[dst] = VMClosure(func, free_vars(regs), name, owner)"),
    # --- 32-: rare
    _f("ALLOC_STORAGE_SHAPE", "AllocStorage", "dst shape alignment dtype_hint alloc itemsize",
       "regs[dst] = alloc(shape_nbytes(regs[shape], itemsize), ...): the size from an int64 shape tensor"),
    _f("ALLOC_TENSOR_REG", "AllocTensorReg", "dst storage offset_reg shape dtype view offset",
       "ALLOC_TENSOR_REG_T with the shape an int64 tensor"),
    _f("IF_REG", "If", "test target then else", "pc = then if regs[test] == regs[target] else else"),
    _f("PACKED_FLAT", "InvokePacked", "kernel args",
       "kernel(*flatten_args(regs[r] for r in args)): some argument registers hold tuples"),
    _f("ALLOC_TENSOR_DYN_OFFSET", "AllocTensor", "dst storage offset shape dtype view",
       "ALLOC_TENSOR with the offset read from regs[offset] (checked non-negative)"),
    _f("FATAL", "Fatal", "", "raise ExecutionError: no match clause applies"),
    _f("REF_NEW", "AllocADT", "dst value", "regs[dst] = RefValue(regs[value]): AllocADT of bytecode.REF_TAG"),
    _f("REF_SET", "AllocADT", "dst cell value",
       "regs[cell].value = regs[value]; regs[dst] = (): AllocADT of bytecode.REF_WRITE_TAG"),
)

(PACKED2, PACKED3, ALLOC_TENSOR, ALLOC_STORAGE, PACKED1, PACKEDN, SHAPE_OF, ALLOC_TENSOR_REG_T,
 MOVE, IF, GOTO, RET, INVOKE, TAIL_INVOKE, GET_FIELD, GET_TAG,
 SHAPE_FUNC_T1, ALLOC_STORAGE_T, LOAD, KILL, ALLOC_ADT, RESHAPE, SHAPE_FUNC_TN, ALLOC_STORAGE_REG,
 ALLOC_PACKED2, ALLOC_PACKED3, ALLOC_DYN, KILL2, SHAPES_FUNC_T1, INVOKE_CLOSURE, TAIL_INVOKE_CLOSURE, ALLOC_CLOSURE,
 ALLOC_STORAGE_SHAPE, ALLOC_TENSOR_REG, IF_REG, PACKED_FLAT, ALLOC_TENSOR_DYN_OFFSET, FATAL, REF_NEW, REF_SET) = range(
    len(FORMS))


def by_opcode() -> dict:
    """Bytecode opcode name -> the handlers that run it (in table order)."""
    out: dict = {}
    for form in FORMS:
        for name in dict.fromkeys(form.opcodes):
            out.setdefault(name, []).append(form.name)
    return out


def check(code) -> None:
    """``ValueError`` unless every decoded instruction names a handler and has its operand count."""
    for i, ins in enumerate(code):
        if not (isinstance(ins, tuple) and ins and isinstance(ins[0], int) and 0 <= ins[0] < len(FORMS)):
            raise ValueError(f"decoded instruction {i} {ins!r} names no handler")
        form = FORMS[ins[0]]
        if len(ins) != 1 + len(form.operands):
            raise ValueError(f"decoded instruction {i}: {form.name} takes {len(form.operands)} operands "
                             f"({', '.join(form.operands)}), got {len(ins) - 1}")


def _operand(value, names: dict) -> str:
    if id(value) in names:
        return names[id(value)]
    name = getattr(value, "__name__", None) or getattr(value, "name", None)
    if callable(value) and name:
        return str(name)
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def describe(code, pcs, instructions, names: dict | None = None) -> str:
    """Decoded code as text: per instruction its index, handler, named operands and the bytecode it
    came from (``pcs[i]``, -1 for code the VM added); ``names`` maps ``id(operand)`` to a label."""
    names = names or {}
    lines = []
    for i, (ins, pc) in enumerate(zip(code, pcs)):
        form = FORMS[ins[0]]
        ops = " ".join(f"{name}={_operand(v, names)}" for name, v in zip(form.operands, ins[1:]))
        origin = f"pc {pc}: {instructions[pc]}" if 0 <= pc < len(instructions) else "added by the VM"
        lines.append(f"{i:4} {form.name:<19} {ops}  ; {origin}")
    return "\n".join(lines)


def markdown_table() -> str:
    """The table of handlers as Markdown (docs/vm.md holds this text; a test keeps them equal)."""
    rows = ["| # | handler | bytecode | operands | does |", "|---|---|---|---|---|"]
    for i, form in enumerate(FORMS):
        rows.append(f"| {i} | `{form.name}` | {' + '.join(form.opcodes)} | {', '.join(form.operands) or '-'} "
                    f"| {form.does.replace('|', '/')} |")
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover - prints the table for docs/vm.md
    print(markdown_table())
