"""The VM instruction set: the 21 opcodes of the Relay VM, one frozen dataclass per instruction.

Registers (``$n``) index a per-frame register file; ``Index`` fields are immediates. Jumps are relative
(``If``/``Goto`` offsets, never 0). Every instruction encodes to a list of int64 words
``[opcode, fields...]`` in the field order of the Relay VM (see docs/executable-format.md), and prints in
the Relay VM's text form, e.g. ``invoke_packed PackedFunc[0] (in: $0, out: $2)``.

Value conventions used by the VM (documented here because the emitter relies on them):

* ``If test target t f``: jump by ``t`` when ``value(test) == value(target)``, else by ``f``; values are
  0-d/1-element tensors or the Python ints written by ``GetTag``/``LoadConsti``.
* ``AllocTensor``'s ``offset`` is a *register* holding an int64 scalar (a Relay VM quirk kept on purpose).
* ``AllocStorage``: ``size`` is a register holding the byte count; with ``size_from_shape`` it holds an
  int64 1-D shape instead and the byte count is ``prod(shape) * itemsize(dtype_hint)``. (tensorvm's
  ``size_from_shape`` flag takes the place of the Relay VM's texture ``ndim/shape`` fields.)
* ``AllocADT``: tag 0 with no constructor is a tuple; constructor tags are ``(type_index + 1) << 24 |
  constructor_index`` (see ``adt_tag``), so a tuple is never confused with a constructor value.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar

from ..errors import FormatError

__all__ = [
    "Opcode", "Instruction", "Move", "Ret", "Invoke", "InvokeClosure", "InvokePacked", "AllocTensor",
    "AllocTensorReg", "AllocADT", "AllocClosure", "GetField", "If", "LoadConst", "Goto", "GetTag", "LoadConsti",
    "Fatal", "AllocStorage", "ShapeOf", "ReshapeTensor", "DeviceCopy", "KillRegister", "VMFunction",
    "INSTRUCTION_CLASSES", "decode_instruction", "dtype_to_code", "code_to_dtype", "adt_tag", "split_adt_tag",
    "verify_function", "tail_call_pcs", "REF_TAG", "REF_WRITE_TAG",
]


class Opcode(IntEnum):
    """Opcode numbers; they are also the serialized values (unchanged from the Relay VM)."""

    Move = 0
    Ret = 1
    Invoke = 2
    InvokeClosure = 3
    InvokePacked = 4
    AllocTensor = 5
    AllocTensorReg = 6
    AllocADT = 7
    AllocClosure = 8
    GetField = 9
    If = 10
    LoadConst = 11
    Goto = 12
    GetTag = 13
    LoadConsti = 14
    Fatal = 15
    AllocStorage = 16
    ShapeOf = 17
    ReshapeTensor = 18
    DeviceCopy = 19
    KillRegister = 20


# --- dtypes as DLPack (code, bits, lanes) triples ---------------------------------------------------
_DTYPE_CODES = {
    "int8": (0, 8), "int16": (0, 16), "int32": (0, 32), "int64": (0, 64),
    "uint8": (1, 8), "uint16": (1, 16), "uint32": (1, 32), "uint64": (1, 64), "bool": (1, 1),
    "float16": (2, 16), "float32": (2, 32), "float64": (2, 64),
}
_CODE_DTYPES = {v: k for k, v in _DTYPE_CODES.items()}


def dtype_to_code(dtype: str) -> tuple[int, int, int]:
    try:
        code, bits = _DTYPE_CODES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype!r} has no bytecode encoding; expected one of {sorted(_DTYPE_CODES)}") from None
    return code, bits, 1


def code_to_dtype(code: int, bits: int, lanes: int) -> str:
    if lanes != 1 or (code, bits) not in _CODE_DTYPES:
        raise FormatError(f"unknown dtype encoding (code={code}, bits={bits}, lanes={lanes})")
    return _CODE_DTYPES[(code, bits)]


def _dtype_text(dtype: str) -> str:
    return "uint1" if dtype == "bool" else dtype


# --- ADT tags ---------------------------------------------------------------------------------------
_TAG_SHIFT = 24


def adt_tag(type_index: int, constructor_index: int) -> int:
    """The bytecode tag of constructor ``constructor_index`` of the executable's ADT ``type_index``."""
    return (type_index + 1) << _TAG_SHIFT | constructor_index


def split_adt_tag(tag: int) -> tuple[int, int]:
    """``(type_index, constructor_index)`` of a constructor tag; type_index is -1 for a tuple (tag 0)."""
    return (tag >> _TAG_SHIFT) - 1, tag & ((1 << _TAG_SHIFT) - 1)


# Reference cells (``ref``, ``ref_read``, ``ref_write`` that leave the function creating them) run on
# AllocADT and GetField with two reserved tags, of a type index no executable's ADTs reach:
# ``AllocADT(REF_TAG, [value])`` makes a cell, ``GetField(cell, 0)`` reads it, and
# ``AllocADT(REF_WRITE_TAG, [cell, value])`` stores the value in the cell and is ``()``.
_REF_TYPE = (1 << 30) - 2
REF_TAG = adt_tag(_REF_TYPE, 0)
REF_WRITE_TAG = adt_tag(_REF_TYPE, 1)
_REF_FIELDS = {REF_TAG: 1, REF_WRITE_TAG: 2}


def _regs(regs) -> str:
    return ", ".join(f"${r}" for r in regs)


class Instruction:
    """Base class: ``opcode``, ``to_words()``, ``from_words()``, text form, registers read and written."""

    __slots__ = ()
    opcode: ClassVar[Opcode]

    def to_words(self) -> list[int]:
        raise NotImplementedError

    @classmethod
    def from_words(cls, words: list[int]) -> Instruction:
        raise NotImplementedError

    def reads(self) -> tuple[int, ...]:
        """Registers whose values this instruction reads."""
        return ()

    def writes(self) -> tuple[int, ...]:
        """Registers this instruction writes."""
        return ()

    @property
    def name(self) -> str:
        return self.opcode.name


_INSTR = dict(frozen=True, slots=True)


@dataclass(**_INSTR)
class Move(Instruction):
    opcode: ClassVar[Opcode] = Opcode.Move
    src: int
    dst: int

    def to_words(self):
        return [self.opcode, self.src, self.dst]

    @classmethod
    def from_words(cls, w):
        _expect_len(w, 3)
        return cls(w[1], w[2])

    def reads(self):
        return (self.src,)

    def writes(self):
        return (self.dst,)

    def __str__(self):
        return f"move ${self.dst} ${self.src}"


@dataclass(**_INSTR)
class Ret(Instruction):
    opcode: ClassVar[Opcode] = Opcode.Ret
    result: int

    def to_words(self):
        return [self.opcode, self.result]

    @classmethod
    def from_words(cls, w):
        _expect_len(w, 2)
        return cls(w[1])

    def reads(self):
        return (self.result,)

    def __str__(self):
        return f"ret ${self.result}"


@dataclass(**_INSTR)
class Invoke(Instruction):
    opcode: ClassVar[Opcode] = Opcode.Invoke
    func_index: int
    args: tuple
    dst: int

    def __post_init__(self):
        object.__setattr__(self, "args", tuple(self.args))

    def to_words(self):
        return [self.opcode, self.func_index, len(self.args), self.dst, *self.args]

    @classmethod
    def from_words(cls, w):
        n = _count(w, 2, 4)
        return cls(w[1], tuple(w[4:4 + n]), w[3])

    def reads(self):
        return self.args

    def writes(self):
        return (self.dst,)

    def __str__(self):
        return f"invoke ${self.dst} VMFunc[{self.func_index}]({_regs(self.args)})"


@dataclass(**_INSTR)
class InvokeClosure(Instruction):
    opcode: ClassVar[Opcode] = Opcode.InvokeClosure
    closure: int
    args: tuple
    dst: int

    def __post_init__(self):
        object.__setattr__(self, "args", tuple(self.args))

    def to_words(self):
        return [self.opcode, self.closure, len(self.args), self.dst, *self.args]

    @classmethod
    def from_words(cls, w):
        n = _count(w, 2, 4)
        return cls(w[1], tuple(w[4:4 + n]), w[3])

    def reads(self):
        return (self.closure, *self.args)

    def writes(self):
        return (self.dst,)

    def __str__(self):
        return f"invoke_closure ${self.dst} ${self.closure}({_regs(self.args)})"


@dataclass(**_INSTR)
class InvokePacked(Instruction):
    """Call kernel ``packed_index`` in destination-passing style: ``args`` = inputs then outputs."""

    opcode: ClassVar[Opcode] = Opcode.InvokePacked
    packed_index: int
    arity: int
    output_size: int
    args: tuple

    def __post_init__(self):
        object.__setattr__(self, "args", tuple(self.args))
        if self.arity != len(self.args) or not 0 <= self.output_size <= self.arity:
            raise ValueError(f"invoke_packed: arity {self.arity} / output_size {self.output_size} do not fit "
                             f"{len(self.args)} argument registers")

    def to_words(self):
        return [self.opcode, self.packed_index, self.arity, self.output_size, *self.args]

    @classmethod
    def from_words(cls, w):
        n = _count(w, 2, 4)
        if not 0 <= w[3] <= n:
            raise FormatError(f"invoke_packed: output_size {w[3]} exceeds arity {n}")
        return cls(w[1], n, w[3], tuple(w[4:4 + n]))

    @property
    def inputs(self) -> tuple:
        return self.args[:self.arity - self.output_size]

    @property
    def outputs(self) -> tuple:
        return self.args[self.arity - self.output_size:]

    def reads(self):
        return self.args  # outputs are read too: the kernel writes into their buffers

    def __str__(self):
        return f"invoke_packed PackedFunc[{self.packed_index}] (in: {_regs(self.inputs)}, out: {_regs(self.outputs)})"


@dataclass(**_INSTR)
class AllocTensor(Instruction):
    """A tensor of static ``shape`` viewing ``storage`` at the byte offset held in register ``offset``."""

    opcode: ClassVar[Opcode] = Opcode.AllocTensor
    storage: int
    offset: int
    shape: tuple
    dtype: str
    dst: int

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        dtype_to_code(self.dtype)

    def to_words(self):
        return [self.opcode, self.storage, self.offset, *dtype_to_code(self.dtype), len(self.shape), self.dst,
                *self.shape]

    @classmethod
    def from_words(cls, w):
        n = _count(w, 6, 8)
        if any(d < 0 for d in w[8:8 + n]):
            raise FormatError("alloc_tensor: negative dimension")
        return cls(w[1], w[2], tuple(w[8:8 + n]), code_to_dtype(w[3], w[4], w[5]), w[7])

    def reads(self):
        return (self.storage, self.offset)

    def writes(self):
        return (self.dst,)

    def __str__(self):
        return (f"alloc_tensor ${self.dst} ${self.storage} ${self.offset} [{', '.join(map(str, self.shape))}] "
                f"{_dtype_text(self.dtype)}")


@dataclass(**_INSTR)
class AllocTensorReg(Instruction):
    """Like ``AllocTensor`` with the shape read from an int64 1-D tensor in ``shape_register``."""

    opcode: ClassVar[Opcode] = Opcode.AllocTensorReg
    storage: int
    offset: int
    shape_register: int
    dtype: str
    dst: int

    def __post_init__(self):
        dtype_to_code(self.dtype)

    def to_words(self):
        return [self.opcode, self.storage, self.offset, self.shape_register, *dtype_to_code(self.dtype), self.dst]

    @classmethod
    def from_words(cls, w):
        _expect_len(w, 8)
        return cls(w[1], w[2], w[3], code_to_dtype(w[4], w[5], w[6]), w[7])

    def reads(self):
        return (self.storage, self.offset, self.shape_register)

    def writes(self):
        return (self.dst,)

    def __str__(self):
        return (f"alloc_tensor_reg ${self.dst} ${self.storage} ${self.offset} ${self.shape_register} "
                f"{_dtype_text(self.dtype)}")


@dataclass(**_INSTR)
class AllocADT(Instruction):
    opcode: ClassVar[Opcode] = Opcode.AllocADT
    tag: int
    fields: tuple
    dst: int

    def __post_init__(self):
        object.__setattr__(self, "fields", tuple(self.fields))

    def to_words(self):
        return [self.opcode, self.tag, len(self.fields), self.dst, *self.fields]

    @classmethod
    def from_words(cls, w):
        n = _count(w, 2, 4)
        if w[1] < 0:
            raise FormatError("alloc_data: negative tag")
        if w[1] in _REF_FIELDS and n != _REF_FIELDS[w[1]]:
            raise FormatError(f"alloc_data: a reference {'cell' if w[1] == REF_TAG else 'write'} takes "
                              f"{_REF_FIELDS[w[1]]} field(s), got {n}")
        return cls(w[1], tuple(w[4:4 + n]), w[3])

    def reads(self):
        return self.fields

    def writes(self):
        return (self.dst,)

    def __str__(self):
        if self.tag == REF_TAG:
            return f"ref ${self.dst} [{_regs(self.fields)}]"
        if self.tag == REF_WRITE_TAG:
            return f"ref_write ${self.dst} [{_regs(self.fields)}]"
        return f"alloc_data ${self.dst} tag({self.tag}) [{_regs(self.fields)}]"


@dataclass(**_INSTR)
class AllocClosure(Instruction):
    opcode: ClassVar[Opcode] = Opcode.AllocClosure
    func_index: int
    free_vars: tuple
    dst: int

    def __post_init__(self):
        object.__setattr__(self, "free_vars", tuple(self.free_vars))

    def to_words(self):
        return [self.opcode, self.func_index, len(self.free_vars), self.dst, *self.free_vars]

    @classmethod
    def from_words(cls, w):
        n = _count(w, 2, 4)
        return cls(w[1], tuple(w[4:4 + n]), w[3])

    def reads(self):
        return self.free_vars

    def writes(self):
        return (self.dst,)

    def __str__(self):
        return f"alloc_closure ${self.dst} VMFunc[{self.func_index}]({_regs(self.free_vars)})"


@dataclass(**_INSTR)
class GetField(Instruction):
    opcode: ClassVar[Opcode] = Opcode.GetField
    object: int
    field_index: int
    dst: int

    def to_words(self):
        return [self.opcode, self.object, self.field_index, self.dst]

    @classmethod
    def from_words(cls, w):
        _expect_len(w, 4)
        if w[2] < 0:
            raise FormatError("get_field: negative field index")
        return cls(w[1], w[2], w[3])

    def reads(self):
        return (self.object,)

    def writes(self):
        return (self.dst,)

    def __str__(self):
        return f"get_field ${self.dst} ${self.object}[{self.field_index}]"


@dataclass(**_INSTR)
class If(Instruction):
    opcode: ClassVar[Opcode] = Opcode.If
    test: int
    target: int
    true_offset: int
    false_offset: int

    def to_words(self):
        return [self.opcode, self.test, self.target, self.true_offset, self.false_offset]

    @classmethod
    def from_words(cls, w):
        _expect_len(w, 5)
        return cls(w[1], w[2], w[3], w[4])

    def reads(self):
        return (self.test, self.target)

    def __str__(self):
        return f"if ${self.test} ${self.target} {self.true_offset} {self.false_offset}"


@dataclass(**_INSTR)
class LoadConst(Instruction):
    opcode: ClassVar[Opcode] = Opcode.LoadConst
    const_index: int
    dst: int
    device_index: int = 0

    def to_words(self):
        return [self.opcode, self.const_index, self.device_index, self.dst]

    @classmethod
    def from_words(cls, w):
        _expect_len(w, 4)
        return cls(w[1], w[3], w[2])

    def writes(self):
        return (self.dst,)

    def __str__(self):
        return f"load_const ${self.dst} Const[{self.const_index}] {self.device_index}"


@dataclass(**_INSTR)
class Goto(Instruction):
    opcode: ClassVar[Opcode] = Opcode.Goto
    pc_offset: int

    def to_words(self):
        return [self.opcode, self.pc_offset]

    @classmethod
    def from_words(cls, w):
        _expect_len(w, 2)
        return cls(w[1])

    def __str__(self):
        return f"goto {self.pc_offset}"


@dataclass(**_INSTR)
class GetTag(Instruction):
    opcode: ClassVar[Opcode] = Opcode.GetTag
    object: int
    dst: int

    def to_words(self):
        return [self.opcode, self.object, self.dst]

    @classmethod
    def from_words(cls, w):
        _expect_len(w, 3)
        return cls(w[1], w[2])

    def reads(self):
        return (self.object,)

    def writes(self):
        return (self.dst,)

    def __str__(self):
        return f"get_tag ${self.dst} ${self.object}"


@dataclass(**_INSTR)
class LoadConsti(Instruction):
    opcode: ClassVar[Opcode] = Opcode.LoadConsti
    value: int
    dst: int

    def to_words(self):
        return [self.opcode, self.value, self.dst]

    @classmethod
    def from_words(cls, w):
        _expect_len(w, 3)
        return cls(w[1], w[2])

    def writes(self):
        return (self.dst,)

    def __str__(self):
        return f"load_consti ${self.dst} {self.value}"


@dataclass(**_INSTR)
class Fatal(Instruction):
    opcode: ClassVar[Opcode] = Opcode.Fatal

    def to_words(self):
        return [self.opcode]

    @classmethod
    def from_words(cls, w):
        _expect_len(w, 1)
        return cls()

    def __str__(self):
        return "fatal"


@dataclass(**_INSTR)
class AllocStorage(Instruction):
    opcode: ClassVar[Opcode] = Opcode.AllocStorage
    size: int
    alignment: int
    dtype_hint: str
    dst: int
    device_index: int = 0
    size_from_shape: bool = False

    def __post_init__(self):
        dtype_to_code(self.dtype_hint)
        object.__setattr__(self, "size_from_shape", bool(self.size_from_shape))

    def to_words(self):
        return [self.opcode, self.size, self.alignment, *dtype_to_code(self.dtype_hint), self.device_index,
                int(self.size_from_shape), self.dst]

    @classmethod
    def from_words(cls, w):
        _expect_len(w, 9)
        if w[2] <= 0 or w[2] & (w[2] - 1) or w[7] not in (0, 1):
            raise FormatError(f"alloc_storage: bad alignment {w[2]} or size_from_shape flag {w[7]}")
        return cls(w[1], w[2], code_to_dtype(w[3], w[4], w[5]), w[8], w[6], bool(w[7]))

    def reads(self):
        return (self.size,)

    def writes(self):
        return (self.dst,)

    def __str__(self):
        size = f"shape ${self.size}" if self.size_from_shape else f"${self.size}"
        return f"alloc_storage ${self.dst} {size} {self.alignment} {_dtype_text(self.dtype_hint)} {self.device_index}"


@dataclass(**_INSTR)
class ShapeOf(Instruction):
    opcode: ClassVar[Opcode] = Opcode.ShapeOf
    tensor: int
    dst: int

    def to_words(self):
        return [self.opcode, self.tensor, self.dst]

    @classmethod
    def from_words(cls, w):
        _expect_len(w, 3)
        return cls(w[1], w[2])

    def reads(self):
        return (self.tensor,)

    def writes(self):
        return (self.dst,)

    def __str__(self):
        return f"shape_of ${self.dst} ${self.tensor}"


@dataclass(**_INSTR)
class ReshapeTensor(Instruction):
    opcode: ClassVar[Opcode] = Opcode.ReshapeTensor
    tensor: int
    newshape: int
    dst: int

    def to_words(self):
        return [self.opcode, self.tensor, self.newshape, self.dst]

    @classmethod
    def from_words(cls, w):
        _expect_len(w, 4)
        return cls(w[1], w[2], w[3])

    def reads(self):
        return (self.tensor, self.newshape)

    def writes(self):
        return (self.dst,)

    def __str__(self):
        return f"reshape_tensor ${self.dst} ${self.tensor} ${self.newshape}"


@dataclass(**_INSTR)
class DeviceCopy(Instruction):
    opcode: ClassVar[Opcode] = Opcode.DeviceCopy
    src: int
    src_device_index: int
    dst_device_index: int
    dst: int

    def to_words(self):
        return [self.opcode, self.src, self.src_device_index, self.dst_device_index, self.dst]

    @classmethod
    def from_words(cls, w):
        _expect_len(w, 5)
        return cls(w[1], w[2], w[3], w[4])

    def reads(self):
        return (self.src,)

    def writes(self):
        return (self.dst,)

    def __str__(self):
        return f"device_copy ${self.dst} ${self.src} {self.dst_device_index} {self.src_device_index}"


@dataclass(**_INSTR)
class KillRegister(Instruction):
    opcode: ClassVar[Opcode] = Opcode.KillRegister
    dst: int

    def to_words(self):
        return [self.opcode, self.dst]

    @classmethod
    def from_words(cls, w):
        _expect_len(w, 2)
        return cls(w[1])

    def writes(self):
        return (self.dst,)

    def __str__(self):
        return f"kill_register ${self.dst}"


INSTRUCTION_CLASSES: dict[Opcode, type[Instruction]] = {
    cls.opcode: cls for cls in (
        Move, Ret, Invoke, InvokeClosure, InvokePacked, AllocTensor, AllocTensorReg, AllocADT, AllocClosure,
        GetField, If, LoadConst, Goto, GetTag, LoadConsti, Fatal, AllocStorage, ShapeOf, ReshapeTensor,
        DeviceCopy, KillRegister,
    )
}


def _expect_len(words, n: int) -> None:
    if len(words) != n:
        raise FormatError(f"{Opcode(words[0]).name}: expected {n} words, got {len(words)}")


def _count(words, count_at: int, fixed: int) -> int:
    """The variable-length tail's element count (at ``count_at``), checked against the word count."""
    if len(words) < fixed:
        raise FormatError(f"{Opcode(words[0]).name}: expected at least {fixed} words, got {len(words)}")
    n = words[count_at]
    if n < 0 or len(words) != fixed + n:
        raise FormatError(f"{Opcode(words[0]).name}: count {n} does not match {len(words)} words")
    return n


def decode_instruction(words: list[int]) -> Instruction:
    """The instruction encoded by ``words`` (``[opcode, fields...]``); ``FormatError`` if malformed."""
    if not words:
        raise FormatError("empty instruction")
    try:
        cls = INSTRUCTION_CLASSES[Opcode(words[0])]
    except ValueError:
        raise FormatError(f"unknown opcode {words[0]}") from None
    try:
        return cls.from_words(list(words))
    except (ValueError, TypeError) as err:
        raise FormatError(f"malformed {cls.__name__} instruction {list(words)}: {err}") from None


@dataclass(frozen=True, slots=True)
class VMFunction:
    """A function in bytecode: parameter names, instructions, and the size of its register file.

    ``param_types``/``ret_type`` (IR types, optional) let the VM check arguments and name results.
    """

    name: str
    params: tuple
    instructions: tuple
    register_file_size: int
    param_types: tuple | None = None
    ret_type: object = None

    def __post_init__(self):
        object.__setattr__(self, "params", tuple(self.params))
        object.__setattr__(self, "instructions", tuple(self.instructions))
        if self.param_types is not None:
            object.__setattr__(self, "param_types", tuple(self.param_types))

    def __str__(self) -> str:
        lines = [f"{self.name}({', '.join(self.params)}):  # registers: {self.register_file_size}"]
        width = len(str(max(len(self.instructions) - 1, 0)))
        lines += [f"  {pc:>{width}}: {ins}" for pc, ins in enumerate(self.instructions)]
        return "\n".join(lines)


_OUTPUT_WRITERS = frozenset({AllocTensor, AllocTensorReg, KillRegister})
_STORAGE_WRITERS = frozenset({AllocStorage, KillRegister})


def verify_function(fn: VMFunction, num_functions: int, num_constants: int, num_kernels: int,
                    from_file: bool = False) -> None:
    """Check that ``fn`` only names registers, jump targets, functions, constants and kernels that exist.

    The VM relies on this for executables read from disk: verified bytecode cannot index out of range.
    ``from_file`` adds the rules for untrusted bytecode (what the compiler always obeys; hand-built test
    bytecode need not): the register file is bounded by the registers the function can name, parameter
    registers are never written, and kernels write only into tensors over storage the function allocated.
    """
    def fail(pc, message):
        raise FormatError(f"function {fn.name!r}, pc {pc}: {message}")

    size, nparams = fn.register_file_size, len(fn.params)
    if size < nparams or size < 0:
        fail(0, f"register file size {size} is smaller than the {nparams} parameters")
    count = len(fn.instructions)
    if count == 0:
        fail(0, "a function needs at least one instruction")
    # Every register is a parameter or named by some instruction word, so the register file (allocated per
    # call) is bounded by the function's size in the file, not by a size field.
    limit = nparams + sum(len(ins.to_words()) for ins in fn.instructions) + 1
    if from_file and size > limit:
        fail(0, f"register file size {size} exceeds the {limit} registers its parameters and instructions can name")
    writers: dict = {}
    for pc, ins in enumerate(fn.instructions):
        for reg in ins.writes():
            writers.setdefault(reg, set()).add(type(ins))
            # A parameter register holds the caller's value: never overwritten (dropping the frame's
            # reference with KillRegister is allowed; the compiler does it after the last use).
            if from_file and reg < nparams and not isinstance(ins, KillRegister):
                fail(pc, f"{ins} writes parameter register ${reg}")
    for pc, ins in enumerate(fn.instructions):
        for reg in (*ins.reads(), *ins.writes()):
            if not 0 <= reg < size:
                fail(pc, f"{ins} uses register ${reg} outside the register file (size {size})")
        # Kernels write into their outputs and tensors view storage: both must be memory this function
        # allocated or a parameter it owns (``owned_parameters``: the VM copies a caller's array for one),
        # never a value that may alias the caller's arrays (a view, a tuple field, a moved register).
        if from_file and isinstance(ins, InvokePacked):
            for reg in ins.outputs:
                if reg < nparams and ins.inputs[:1] != (reg,):
                    fail(pc, f"{ins} writes into parameter ${reg} other than as an update of its first input")
                if reg >= nparams and not writers.get(reg, set()) <= _OUTPUT_WRITERS:
                    fail(pc, f"{ins} writes into ${reg}, which does not hold a tensor allocated by the function")
        if from_file and isinstance(ins, (AllocTensor, AllocTensorReg)) and (
                ins.storage < nparams or not writers.get(ins.storage, set()) <= _STORAGE_WRITERS):
            fail(pc, f"{ins} views ${ins.storage}, which does not hold storage allocated by the function")
        if isinstance(ins, If):
            offsets = (ins.true_offset, ins.false_offset)
        elif isinstance(ins, Goto):
            offsets = (ins.pc_offset,)
        else:
            offsets = ()
        for off in offsets:
            if off == 0 or not 0 <= pc + off < count:
                fail(pc, f"{ins} jumps to {pc + off}, outside 0..{count - 1} (or by 0)")
        if isinstance(ins, (Invoke, AllocClosure)) and not 0 <= ins.func_index < num_functions:
            fail(pc, f"{ins} names function {ins.func_index}; there are {num_functions}")
        if isinstance(ins, LoadConst) and not 0 <= ins.const_index < num_constants:
            fail(pc, f"{ins} names constant {ins.const_index}; there are {num_constants}")
        if isinstance(ins, InvokePacked) and not 0 <= ins.packed_index < num_kernels:
            fail(pc, f"{ins} names kernel {ins.packed_index}; there are {num_kernels}")
        if isinstance(ins, (AllocStorage, DeviceCopy, LoadConst)):
            devices = ((ins.src_device_index, ins.dst_device_index) if isinstance(ins, DeviceCopy)
                       else (ins.device_index,))
            if any(d != 0 for d in devices):
                fail(pc, f"{ins} names a device other than 0 (the host, the only device)")
    last = fn.instructions[-1]
    if not isinstance(last, (Ret, Goto, Fatal, If)):
        fail(count - 1, f"the last instruction {last} falls off the end of the function")


def owned_parameters(functions) -> tuple:
    """Per function, the indices of the parameters it *owns*: a kernel writes into the parameter (an
    update run in place, ``transform/update_in_place.py``), or the function passes it on as an owned
    parameter of a function it calls. A caller hands over such an argument and never reads it again;
    the VM copies an array its user passes for one, so the user's arrays are never written."""
    owned = [set() for _ in functions]
    for i, fn in enumerate(functions):
        nparams = len(fn.params)
        for ins in fn.instructions:
            if isinstance(ins, InvokePacked):
                owned[i].update(reg for reg in ins.outputs if reg < nparams)
    changed = True
    while changed:
        changed = False
        for i, fn in enumerate(functions):
            nparams = len(fn.params)
            for ins in fn.instructions:
                if isinstance(ins, Invoke) and 0 <= ins.func_index < len(functions):
                    for k in owned[ins.func_index]:
                        reg = ins.args[k] if k < len(ins.args) else None
                        if reg is not None and reg < nparams and reg not in owned[i]:
                            owned[i].add(reg)
                            changed = True
    return tuple(frozenset(o) for o in owned)


def verify_owned_arguments(functions) -> None:
    """The rules for untrusted bytecode about owned parameters (``owned_parameters``): an owned argument
    is a tensor the caller allocated (or a parameter the caller owns), passed once in the call, and a
    function owning parameters is called directly, never made a closure (whose callers are unknown)."""
    owned = owned_parameters(functions)
    for fn in functions:
        nparams = len(fn.params)
        writers: dict = {}
        for ins in fn.instructions:
            for reg in ins.writes():
                writers.setdefault(reg, set()).add(type(ins))
        for pc, ins in enumerate(fn.instructions):
            if isinstance(ins, AllocClosure) and 0 <= ins.func_index < len(functions) and owned[ins.func_index]:
                raise FormatError(f"function {fn.name!r}, pc {pc}: {ins} makes a closure of "
                                  f"{functions[ins.func_index].name!r}, which owns parameters "
                                  f"{sorted(owned[ins.func_index])}")
            if not (isinstance(ins, Invoke) and 0 <= ins.func_index < len(functions)):
                continue
            for k in owned[ins.func_index]:
                reg = ins.args[k]
                allocated = reg >= nparams and writers.get(reg, set()) <= _OUTPUT_WRITERS
                if not (allocated or reg < nparams) or list(ins.args).count(reg) != 1:
                    raise FormatError(f"function {fn.name!r}, pc {pc}: {ins} passes ${reg} as argument {k}, "
                                      f"which the callee owns; it must be a tensor the caller allocated (or a "
                                      f"parameter it owns), passed once")


def tail_call_pcs(fn: VMFunction) -> frozenset[int]:
    """The pcs of ``Invoke``/``InvokeClosure`` instructions whose result flows straight to ``Ret``.

    "Straight" allows ``KillRegister`` of other registers (pointless before a return), ``Move`` of the
    result into another register, and ``Goto`` in between, which is how a call in an ``if`` branch
    reaches the function's ``ret $merge``. Such a call can replace the caller's frame.
    """
    code = fn.instructions
    tails = set()
    for pc, ins in enumerate(code):
        if not isinstance(ins, (Invoke, InvokeClosure)):
            continue
        result, p, steps = ins.dst, pc + 1, 0
        while 0 <= p < len(code) and steps < 64:
            steps += 1
            nxt = code[p]
            if isinstance(nxt, Ret):
                if nxt.result == result:
                    tails.add(pc)
                break
            if isinstance(nxt, KillRegister) and nxt.dst != result:
                p += 1
            elif isinstance(nxt, Move) and nxt.src == result:
                result, p = nxt.dst, p + 1
            elif isinstance(nxt, Goto):
                p += nxt.pc_offset
            else:
                break
    return frozenset(tails)
