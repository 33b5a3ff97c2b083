"""The virtual machine: a register machine with a frame stack and a dispatch loop over pre-decoded code.

Loading an executable *decodes* each instruction once into a flat tuple ``(handler, operands...)`` whose
operands are already resolved: kernel callables, constant values, absolute jump targets, the callee's
code, an ``itemgetter`` for argument registers, and the allocator's bound ``alloc``. ``decoded.FORMS`` is
the table of handlers (per handler: the bytecode opcode it runs, its operands, what it does; docs/vm.md)
and ``VirtualMachine.disassemble`` shows a function's decoded code. The loop then does no dictionary
lookups and no attribute access per instruction beyond tuple indexing; handler numbers are small ints
tested by a small tree of ``if`` range tests that puts every hot one within four comparisons
(benchmarks/vm_overhead.py section 3 compares it with a handler function per instruction; docs/vm.md).

Calls push ``(code, return pc, registers, destination register, function index)`` on a list; the loop never
recurses in Python. A call whose result flows straight to ``Ret`` (possibly through ``Move``,
``KillRegister`` and ``Goto``) is decoded as a *tail call*: it replaces the current frame, so a
100,000-step recursive loop runs in constant space.

Where the bytecode proves a register only ever holds a shape, the shape stays a Python tuple and shape
functions run in their memoized tuple form (``shape_plan.py``); a few instruction pairs are fused into
one dispatch (``_fuse``). Storages, tensor views and C kernel calls go through a small compiled helper
(``fastcall.py``) where one can be built; ``native=False`` (or ``TENSORVM_NATIVE=0``) keeps to pure
Python with the same results, errors and memory statistics.

Values in registers: tensors are NumPy arrays (views on ``Storage`` blocks; wrapped as ``tv.NDArray``
only at the API boundary, which keeps kernel calls free of unwrapping), ADTs and tuples are
``runtime.object.ADT`` (tuples have tag 0), closures are ``VMClosure`` (a ``runtime.object.Closure`` that
names the program its function index belongs to), ``GetTag`` and ``LoadConsti`` write Python ints.

Arguments are checked against the parameter types: tensors here, ADT values with the interpreter's
``convert_argument`` (against the ADT definitions the executable carries), and closures must come from
a VM running the same executable.
"""

from __future__ import annotations

import bisect
import math
import os
import sys
import threading
import time
import warnings
from enum import IntEnum
from functools import partial
from math import prod
from operator import itemgetter
from threading import get_ident as _get_ident
from types import SimpleNamespace

import numpy as np

from ..errors import ExecutionError, ShapeError, TensorVMError, UnsupportedError
from ..ir.types import Any as AnyDim
from ..ir.types import FuncType, GlobalTypeVar, RefType, SymDim, TensorType, TupleType, TypeCall
from ..runtime.convert import Node, convert_argument, rebuild, result_checker
from ..runtime.memory import NaiveAllocator, make_allocator
from ..runtime.ndarray import NDArray
from ..runtime.object import ADT, Closure, RefValue, write_ref
from ..runtime.placement import TensorLifetime, plan_memory
from ..runtime.stack import (
    GC_PAUSERS,
    caller_ident,
    pause_gc,
    resume_gc,
)
from . import bytecode as bc
from . import decoded as D
from .shape_plan import shape_plan
from .specialize import shape_slice

_wrap = NDArray.wrap  # results are handed out without the constructor's checks

__all__ = ["VirtualMachine", "VMClosure", "SKIP_RUN", "InstrumentReturn", "shape_of", "reshape_tensor"]


class VMClosure(Closure):
    """A closure made by a VM; ``owner`` is the ``closure_owner`` of the executable whose function index
    it holds, so a closure cannot be passed to a VM running another program."""

    __slots__ = ("owner",)

    def __init__(self, func_index: int, free_vars=(), name: str = "", owner=None):
        self.func_index = func_index
        self.free_vars = tuple(free_vars)
        self.name = name
        self.owner = owner


class InstrumentReturn(IntEnum):
    """What an instrument callback may return before a kernel call."""

    NO_OP = 0
    SKIP_RUN = 1


SKIP_RUN = InstrumentReturn.SKIP_RUN

#: Frames deeper than this raise ExecutionError (non-tail recursion that never ends).
MAX_STACK_DEPTH = 1_000_000
#: Registers the frames of one call may hold in all: the frame stack's memory (about 100 bytes a register
#: in values and lists) stays far below the process's, so that a recursion that never ends is reported
#: while the error can still be built. A frame's register count comes from the file; its depth from the run.
MAX_STACK_REGISTERS = 1 << 22
# Frames per chunk of the stack whose register count is taken at once (``_deep_stack``).
_STACK_CHUNK = 1024
#: Past this many frames the cyclic garbage collector pauses until the call returns: deep non-tail
#: recursion keeps every frame's objects alive, and the collector's repeated full scans of them doubled
#: the run time (measured on a 100,000-deep @sum_up). VM values form cycles only through reference cells (a
#: cell holding a closure that captures it), which the collector finds once it runs again.
GC_PAUSE_DEPTH = 1024
# parameter-shape keys a function keeps specialized code for (and keys remembered as seen once)
_SPECIALIZE_LIMIT = 32
# Bytes of arenas (buffers made once per specialized shape, ``specialize.py``) kept per function.
_ARENA_LIMIT = 256 << 20

_INT64 = np.dtype("int64")
# The storages a shape slice makes for its arena only to learn their tensors' layout: fresh, never written
# (the body writes the arena, in the placed block), dropped once placed (``VirtualMachine._placed``).
_scratch_alloc = NaiveAllocator().alloc


# --- builtins shared by the dispatch loop and compiled mode ---------------------------------------
def shape_of(tensor) -> np.ndarray:
    """``ShapeOf``: the int64 1-D shape of a tensor."""
    return np.array(tensor.shape, _INT64)


def reshape_tensor(tensor, newshape) -> np.ndarray:
    """``ReshapeTensor``: a zero-copy view with the shape held in an int64 1-D tensor."""
    shape = tuple(newshape.tolist())
    try:
        return tensor.reshape(shape)
    except ValueError as err:
        raise ShapeError(f"reshape_tensor: cannot view a tensor of shape {tensor.shape} as {shape} ({err})") from None


def shape_nbytes(shape, itemsize: int) -> int:
    """Bytes of a tensor whose shape is the int64 1-D tensor ``shape`` (or a tuple)."""
    dims = shape if shape.__class__ is tuple else shape.tolist()
    if dims and min(dims) < 0:
        raise ShapeError(f"alloc_storage: negative dimension in shape {dims}")
    return math.prod(dims) * itemsize


def reshape_tuple(tensor, shape: tuple) -> np.ndarray:
    """``ReshapeTensor`` with the new shape held as a tuple."""
    try:
        return tensor.reshape(shape)
    except ValueError as err:
        raise ShapeError(f"reshape_tensor: cannot view a tensor of shape {tensor.shape} as {shape} ({err})") from None


def _shape_placeholder(shape, dtype, storage, offset) -> np.ndarray:
    """A tensor of ``shape`` that takes no memory (every stride 0): a shape slice reads only its shape."""
    return np.broadcast_to(np.zeros((), dtype), tuple(shape))


def _private_view(view, alloc):
    """A view function for the tensors a shape slice's kernels write: the view the generic code makes is
    made (so its bounds are checked as there), but the tensor gets a storage of its own, as its value is
    preset for every later call while the memory planner may let other tensors reuse those bytes."""
    def make(shape, dtype, storage, offset):
        view(shape, dtype, storage, offset)
        return view(shape, dtype, alloc(int(math.prod(shape)) * dtype.itemsize, 64, dtype.name), 0)
    return make


def tuple_shape_of(tensor) -> tuple:
    """``ShapeOf`` where the shape stays a tuple."""
    return tensor.shape


def _deep_stack(frames: list, deep: list | None) -> list:
    """Called on each call made when the frame stack is deep: pause the cyclic GC once, and enforce the
    limits on depth and on registers held. ``deep`` (None before the first call) holds the register count
    of each whole chunk of ``_STACK_CHUNK`` frames; frames below the top are never changed, so a chunk is
    counted when its last frame is pushed and its count stays right until it is popped."""
    depth = len(frames)
    if depth > MAX_STACK_DEPTH:
        raise ExecutionError(f"stack overflow: more than {MAX_STACK_DEPTH} nested calls")
    if deep is None:
        pause_gc(id(frames))  # counted: other threads may be deep too
        deep = []
    if depth % _STACK_CHUNK == 0:
        del deep[depth // _STACK_CHUNK - 1:]
        deep.append(sum([len(frame[2]) for frame in frames[depth - _STACK_CHUNK:]]))
        held = sum(deep)
        if held > MAX_STACK_REGISTERS:
            raise ExecutionError(f"stack overflow: {depth} nested calls hold {held} registers, more than the "
                                 f"{MAX_STACK_REGISTERS} a call's frames may hold")
    return deep


def _offset(value) -> int:
    """A byte offset for a tensor view: NumPy accepts negative offsets (reading before the buffer), so
    every offset is checked here."""
    offset = int(value)
    if offset < 0:
        raise ShapeError(f"alloc_tensor: negative byte offset {offset}")
    return offset


def _scalar(value):
    """The Python value of an ``If`` operand (an int, or a one-element tensor)."""
    if value.__class__ is int:
        return value
    try:
        return value.item()
    except (AttributeError, ValueError):
        raise ExecutionError(f"if: the condition must be a scalar, got {type(value).__name__} "
                             f"{getattr(value, 'shape', '')}") from None


def flatten_args(values) -> list:
    """Kernel arguments with ADT (tuple) values expanded into their fields, recursively (Relay VM rule)."""
    out = []
    for v in values:
        if v.__class__ is ADT:
            out.extend(flatten_args(v.fields))
        else:
            out.append(v)
    return out


def _tuple_getter(regs: tuple):
    """A C-level function returning the registers' values as a sequence (itemgetter quirks handled)."""
    if len(regs) == 1:
        return itemgetter(slice(regs[0], regs[0] + 1))
    if not regs:
        return itemgetter(slice(0, 0))
    return itemgetter(*regs)


def _fast_specs(param_types) -> tuple | None:
    """``(dtype, rank, shape, ((axis, static dim), ...))`` per parameter (``shape`` the whole shape when
    every dim is static, else None), when every parameter is a tensor without symbolic dims: then
    arguments that already fit pass without conversion."""
    if param_types is None:
        return None
    specs = []
    for ty in param_types:
        if not isinstance(ty, TensorType) or any(isinstance(d, SymDim) for d in ty.shape):
            return None
        static = tuple((axis, d) for axis, d in enumerate(ty.shape) if isinstance(d, int))
        shape = tuple(ty.shape) if len(static) == len(ty.shape) else None
        specs.append((np.dtype(ty.dtype), len(ty.shape), shape, static))
    return tuple(specs)


def _held_bytes(values) -> int:
    """Bytes of the memory blocks the arrays among ``values`` view (each block counted once)."""
    blocks = {}
    for value in values:
        while isinstance(value, np.ndarray) and isinstance(value.base, np.ndarray):
            value = value.base
        if isinstance(value, np.ndarray):
            blocks[id(value)] = value.nbytes
    return sum(blocks.values())


def _fits(value, static: tuple) -> bool:
    """Whether an array's shape has the static dims of a parameter with dynamic ones."""
    got = value.shape
    for axis, dim in static:
        if got[axis] != dim:
            return False
    return True


class _FunctionInfo:
    """What the VM knows about one function: decoded code, register count, and argument checkers."""

    __slots__ = ("name", "index", "code", "pcs", "num_regs", "params", "param_types", "ret_type", "fast_specs",
                 "tail", "shape_slice", "specialized", "sightings", "arena_bytes", "entry", "owned", "result_check")

    def __init__(self, fn: bc.VMFunction, index: int, num_regs: int | None = None):
        self.name, self.index = fn.name, index
        self.num_regs = fn.register_file_size if num_regs is None else num_regs
        self.params, self.param_types, self.ret_type = fn.params, fn.param_types, fn.ret_type
        self.code: tuple = ()  # decoded instructions
        self.pcs: tuple = ()   # the bytecode pc of each decoded instruction
        self.fast_specs = _fast_specs(fn.param_types)
        # (the static dims of the declared result, checked on what invoke returns: runtime.convert.result_checker)
        self.result_check = result_checker(fn.ret_type, f"the result of {fn.name}")
        self.tail = (None,) * (self.num_regs - len(fn.params))  # the register file after the arguments
        self.shape_slice = None  # specialize.ShapeSlice when the function can run specialized to its shapes
        self.specialized: dict = {}  # parameter shapes -> _FunctionInfo of the body with the slice's results
        self.sightings: dict = {}    # parameter shapes seen once (specialized at the second sighting)
        self.arena_bytes = 0         # a specialized body: the bytes of the buffers made for it once
        self.entry = None            # a specialized body in compiled exec mode: its generated code, run(args)
        self.owned = ()              # parameters whose buffer the function writes (bytecode.owned_parameters)


class VirtualMachine:
    """Runs an ``Executable``.

    ``allocator`` is ``"pooled"`` (default), ``"naive"`` or an ``Allocator`` instance. ``native=False``
    keeps to pure Python even where the compiled helper (``fastcall``: storages and tensor views made in C)
    is available. ``specialize=False`` (default: on unless ``$TENSORVM_SPECIALIZE`` is ``0``) runs every
    call of a straight-line function generically: no shape slice, no arena (``specialize.py``); in native
    mode, no function places an arena (docs/native_mode.md, "Arena").

    Threads: a VM runs one call at a time (it keeps per-call state: buffers of specialized shapes, the
    allocator's pools, the selected program). Calls from other threads while it is busy wait their turn;
    for parallel runs, make one VM per thread (VMs may share an executable; C kernels run without the
    GIL). A call made on the thread already running one is allowed from an instrument callback (that
    program keeps no per-call buffers) and otherwise raises ``ExecutionError``. An allocator instance
    must not be shared by VMs used from different threads.
    """

    def __init__(self, exe, allocator="pooled", device=None, native: bool = True, specialize: bool | None = None):
        if device not in (None, "cpu", "python") and str(device) != "cpu":
            raise ExecutionError(f"the VM runs on the host ('cpu'); got device {device!r}")
        self.exe = exe
        self.allocator = make_allocator(allocator)
        self._native = _native_module() if native else None
        if self._native is not None and self.allocator._native_storage is None:
            self.allocator.attach_native(self._native)
        self._kernels = exe.kernels
        self._kernel_inputs = [k.num_inputs for k in exe.primitives]
        self._kernel_names = [k.name for k in exe.primitives]
        self._funcs = [_FunctionInfo(fn, i) for i, fn in enumerate(exe.functions)]
        for info, owned in zip(self._funcs, bc.owned_parameters(exe.functions), strict=True):
            info.owned = tuple(sorted(owned))
        if specialize is None:
            specialize = os.environ.get("TENSORVM_SPECIALIZE", "1").strip() != "0"
        for info, fn in zip(self._funcs, exe.functions):
            info.shape_slice = shape_slice(fn) if specialize else None
        self._body_makers: dict = {}  # compiled mode: function index -> maker of its specialized body's code
        self._calls = {"generic": 0, "specialized": 0}  # calls from the API, by the code they ran
        self._plain_parts = None  # (kernels, builtins, shape forms) of the plain program, for specializing
        self._by_name = {info.name: info for info in self._funcs}
        self._adt_tags = exe.adt_tag_table()           # full tag -> (constructor index, name)
        self._adt_by_name = {name: tag for tag, (_, name) in self._adt_tags.items()}
        self._type_module = None  # the executable's ADT definitions, for convert_argument (built when needed)
        self._instrument = None
        self._profile_recorder = None
        self._programs: dict[str, list] = {}
        self._compiled: dict[str, list] = {}
        self._inputs: dict[str, list] = {}
        self._given_inputs: dict[str, list] = {}  # the inputs as the user gave them, in parameter order
        self._partial_inputs: set[str] = set()  # functions with inputs changed by set_one_input, unchecked together
        self._outputs: dict = {}  # function name -> the result of its last invoke_stateful
        self._last_stateful = None
        self._exec_mode = exe.exec_mode
        # why a native-mode executable runs in the dispatch loop here ("" when it does not): native mode's
        # C entry point goes through a CPython extension built on each machine (docs/deploy.md), and a
        # machine without a compiler that never built it still has the executable's bytecode and kernels
        self.native_unavailable = ""
        if self._exec_mode == "native":
            from .native_mode import bridge_module

            try:
                bridge_module()
            except UnsupportedError as err:
                self._exec_mode, self.native_unavailable = "bytecode", str(err)
                warnings.warn(f"{err}: this VirtualMachine runs the executable's bytecode in the dispatch loop "
                              f"(the same C kernels) instead", RuntimeWarning, stacklevel=2)
        self._lock = threading.Lock()  # held by the thread running a call (see the class docstring)
        self._owner = None             # that thread's ident
        if self._exec_mode == "compiled":
            from .compiled import may_nest

            self._nests = may_nest(exe)
        else:
            self._nests = False
        self._native_rt = None
        if self._exec_mode == "native":  # one C entry point per call (native_mode.py)
            from .native_mode import call_native, runtime_for

            self._native_rt = runtime_for(exe, self, self.allocator.limit_bytes)
            self._native_rt.set_arenas(specialize)  # (native mode's arenas: docs/native_mode.md, "Arena")
            self._call_native = call_native
            from .native_mode import native_invoker

            self._invoke = native_invoker(self, self._invoke)  # (arguments checked and converted in C)
        self._select_program("plain")

    # --- one call at a time -----------------------------------------------------------------------
    def _one_call(self, what: str, fn, *args):
        """``fn(*args)`` holding the VM (a ``with`` block, so that an interrupt cannot leave it held)."""
        if self._owner is not None and self._owner == caller_ident():  # nested in this thread's call
            if self._mode == "plain":
                raise ExecutionError(f"VirtualMachine.{what}: this VM is already running a call on this "
                                     f"thread (a re-entrant call, e.g. from a signal handler); use another "
                                     f"VirtualMachine")
            return fn(*args)
        with self._lock:
            try:
                self._owner = _get_ident()
                return fn(*args)
            finally:
                self._owner = None

    # --- program variants: plain, instrumented, profiled ----------------------------------------
    def _select_program(self, mode: str) -> None:
        if self._exec_mode == "native" and mode != "instrument":
            pass  # one C entry point per call (a profile is recorded by the C code: _profile_native)
        elif self._exec_mode == "compiled":
            if mode not in self._compiled:
                from .compiled import instantiate

                kernels, builtins, forms = self._program_parts(mode)
                self._compiled[mode] = instantiate(self.exe, builtins, kernels, forms)
            self._entries = self._compiled[mode]
        else:
            if mode not in self._programs:
                self._programs[mode] = self._decode_all(mode)
            for info, (code, pcs) in zip(self._funcs, self._programs[mode]):
                info.code, info.pcs = code, pcs
        self._mode = mode

    def _wrapped_kernels(self, mode: str) -> list:
        if mode == "instrument":
            return [_instrumented(k, name, self._instrument) for k, name in zip(self._kernels, self._kernel_names)]
        if mode == "profile":
            rec = self._profile_recorder
            return [rec.timed(k, name, "kernel") for k, name in zip(self._kernels, self._kernel_names)]
        return list(self._kernels)

    def _builtins(self, mode: str) -> dict:
        """The functions decoded instructions call: the allocator, tensor views, shapes (timed when profiling).

        ``view(shape, dtype, storage, offset)`` is ``np.ndarray`` itself: NumPy checks the bounds, and
        ``located_error`` turns its complaint into a ``ShapeError`` naming the instruction.
        """
        view = self._native.view if self._native is not None else np.ndarray
        builtins = {"alloc": self.allocator.alloc, "view": view, "view_reg": view,
                    "shape_of": shape_of, "reshape_tensor": reshape_tensor, "shape_of_t": tuple_shape_of,
                    "reshape_t": reshape_tuple}
        if mode == "profile":
            rec = self._profile_recorder
            names = {"alloc": "VM::AllocStorage", "view": "VM::AllocTensor", "view_reg": "VM::AllocTensorReg",
                     "shape_of": "VM::ShapeOf", "reshape_tensor": "VM::ReshapeTensor", "shape_of_t": "VM::ShapeOf",
                     "reshape_t": "VM::ReshapeTensor"}
            builtins = {key: rec.timed(fn, names[key], "vm") for key, fn in builtins.items()}
        return builtins

    def _shape_forms(self, mode: str, kernels: list) -> list:
        """Per kernel: what a tuple-mode shape-function call runs in this mode (None: not a shape function
        with a tuple form). Profiled runs time the tuple form; instrumented runs go through an adapter
        that calls the instrumented kernel in its documented form (int64 shape tensors)."""
        forms = tuple_forms(self._kernels, self.exe.primitives)
        if mode == "profile":
            rec = self._profile_recorder
            return [None if f is None else _same_form(rec.timed(f, name, "kernel"), f)
                    for f, name in zip(forms, self._kernel_names)]
        if mode == "instrument":
            return [None if f is None else _same_form(_dps_adapter(k, f), f) for f, k in zip(forms, kernels)]
        return forms

    def _program_parts(self, mode: str) -> tuple:
        """``(kernels, builtins, shape-function forms)`` that the ``mode`` variant of the program calls."""
        kernels = self._wrapped_kernels(mode)
        return kernels, self._builtins(mode), self._shape_forms(mode, kernels)

    def _decode_all(self, mode: str) -> list:
        parts = self._program_parts(mode)
        return [self._decode(fn, *parts) for fn in self.exe.functions]

    def _decode(self, fn: bc.VMFunction, kernels: list, builtins: dict, forms: list, keep=None,
                skip=frozenset(), placeholders=frozenset(), private=frozenset(), scratch=frozenset()) -> tuple:
        """``fn``'s instructions as decoded tuples, plus the bytecode pc of each (for error messages).

        Registers written once by ``LoadConst``/``LoadConsti`` and read only where an immediate fits
        (offsets, static sizes, ``If`` targets) are folded into their readers and their loads dropped.
        Shapes stay tuples where ``shape_plan`` proves it safe. ``keep`` (the pcs to decode, default all)
        and ``skip`` select part of a straight-line function (a shape slice or the body after it); the
        tensors allocated at ``placeholders`` get their shape and no memory, those at ``private`` memory of
        their own; the storages allocated at ``scratch`` come from a throwaway allocator (``_scratch_alloc``).
        """
        O = bc.Opcode
        instrs = fn.instructions
        consts = self.exe.constants
        known = _constant_registers(fn, consts)
        folded = _immediate_only_registers(fn, known)
        tails = bc.tail_call_pcs(fn)
        plan = shape_plan(fn, forms, consts)
        tuple_regs = plan.tuple_regs
        code, pcs = [], []
        for pc, ins in enumerate(instrs):
            alloc = _scratch_alloc if pc in scratch else builtins["alloc"]
            op = ins.opcode
            if (op in (O.LoadConst, O.LoadConsti) and ins.dst in folded) or pc in plan.dropped or pc in skip \
                    or (keep is not None and pc not in keep):
                continue
            pcs.append(pc)
            if pc in placeholders:
                view = view_reg = _shape_placeholder
            elif pc in private:
                view = view_reg = _private_view(builtins["view"], builtins["alloc"])
            else:
                view, view_reg = builtins["view"], builtins["view_reg"]
            if op == O.InvokePacked:
                kernel = kernels[ins.packed_index]
                expected = self._kernel_inputs[ins.packed_index]
                if pc in plan.tuple_calls:
                    form, getter = forms[ins.packed_index], _tuple_getter(ins.inputs)
                    if ins.output_size == 1:
                        code.append((D.SHAPE_FUNC_T1, ins.outputs[0], form, getter))
                    else:
                        code.append((D.SHAPE_FUNC_TN, ins.outputs, form, getter))
                elif expected is not None and expected != ins.arity - ins.output_size:
                    code.append((D.PACKED_FLAT, kernel, ins.args))  # some input registers hold tuples
                elif ins.arity == 2:
                    code.append((D.PACKED2, kernel, *ins.args))
                elif ins.arity == 3:
                    code.append((D.PACKED3, kernel, *ins.args))
                elif ins.arity == 1:
                    code.append((D.PACKED1, kernel, ins.args[0]))
                else:
                    code.append((D.PACKEDN, kernel, _tuple_getter(ins.args)))
            elif op == O.AllocTensor:
                dtype = np.dtype(ins.dtype)
                if ins.offset in known:
                    code.append((D.ALLOC_TENSOR, ins.dst, ins.storage, _offset(known[ins.offset]), ins.shape, dtype,
                                 view))
                else:
                    code.append((D.ALLOC_TENSOR_DYN_OFFSET, ins.dst, ins.storage, ins.offset, ins.shape, dtype, view))
            elif op == O.AllocStorage:
                if ins.size_from_shape and ins.size in tuple_regs:
                    code.append((D.ALLOC_STORAGE_T, ins.dst, ins.size, ins.alignment, ins.dtype_hint, alloc,
                                 np.dtype(ins.dtype_hint).itemsize))
                elif ins.size_from_shape:
                    code.append((D.ALLOC_STORAGE_SHAPE, ins.dst, ins.size, ins.alignment, ins.dtype_hint, alloc,
                                 np.dtype(ins.dtype_hint).itemsize))
                elif ins.size in known:
                    code.append((D.ALLOC_STORAGE, ins.dst, int(known[ins.size]), ins.alignment, ins.dtype_hint, alloc))
                else:
                    code.append((D.ALLOC_STORAGE_REG, ins.dst, ins.size, ins.alignment, ins.dtype_hint, alloc))
            elif op == O.LoadConst:
                value = consts[ins.const_index]
                code.append((D.LOAD, ins.dst, tuple(value.tolist()) if ins.dst in tuple_regs else value))
            elif op == O.LoadConsti:
                code.append((D.LOAD, ins.dst, ins.value))
            elif op == O.Invoke:
                callee = self._funcs[ins.func_index]
                if len(ins.args) != len(callee.params):
                    raise ExecutionError(f"{fn.name} pc {pc}: {ins} passes {len(ins.args)} arguments; {callee.name} "
                                         f"takes {len(callee.params)}")
                target = (D.TAIL_INVOKE,) if pc in tails else (D.INVOKE, ins.dst)
                code.append((*target, ins.func_index, _tuple_getter(ins.args)))
            elif op == O.InvokeClosure:
                target = (D.TAIL_INVOKE_CLOSURE,) if pc in tails else (D.INVOKE_CLOSURE, ins.dst)
                code.append((*target, ins.closure, ins.args))
            elif op == O.Ret:
                code.append((D.RET, ins.result))
            elif op == O.If:  # jump targets are bytecode pcs here, renumbered below
                if ins.target in known:
                    code.append((D.IF, ins.test, known[ins.target], pc + ins.true_offset, pc + ins.false_offset))
                else:
                    code.append((D.IF_REG, ins.test, ins.target, pc + ins.true_offset, pc + ins.false_offset))
            elif op == O.Goto:
                code.append((D.GOTO, pc + ins.pc_offset))
            elif op == O.Move:
                code.append((D.MOVE, ins.dst, ins.src))
            elif op == O.GetField:
                code.append((D.GET_FIELD, ins.dst, ins.object, ins.field_index))
            elif op == O.KillRegister:
                code.append((D.KILL, ins.dst))
            elif op == O.ShapeOf:
                if ins.dst in tuple_regs:
                    code.append((D.SHAPE_OF, ins.dst, ins.tensor, builtins["shape_of_t"]))
                else:
                    code.append((D.SHAPE_OF, ins.dst, ins.tensor, builtins["shape_of"]))
            elif op == O.AllocTensorReg:
                offset = _offset(known[ins.offset]) if ins.offset in known else None
                kind = D.ALLOC_TENSOR_REG_T if ins.shape_register in tuple_regs else D.ALLOC_TENSOR_REG
                code.append((kind, ins.dst, ins.storage, ins.offset, ins.shape_register, np.dtype(ins.dtype), view_reg,
                             offset))
            elif op == O.GetTag:
                code.append((D.GET_TAG, ins.dst, ins.object))
            elif op == O.AllocADT and ins.tag == bc.REF_TAG:
                code.append((D.REF_NEW, ins.dst, ins.fields[0]))
            elif op == O.AllocADT and ins.tag == bc.REF_WRITE_TAG:
                code.append((D.REF_SET, ins.dst, ins.fields[0], ins.fields[1]))
            elif op == O.AllocADT:
                code.append((D.ALLOC_ADT, ins.dst, ins.tag, _tuple_getter(ins.fields)))
            elif op == O.AllocClosure:
                code.append((D.ALLOC_CLOSURE, ins.dst, ins.func_index, _tuple_getter(ins.free_vars),
                             self._funcs[ins.func_index].name, self.exe.closure_owner))
            elif op == O.ReshapeTensor:
                if ins.newshape in tuple_regs:
                    code.append((D.RESHAPE, ins.dst, ins.tensor, ins.newshape, builtins["reshape_t"]))
                else:
                    code.append((D.RESHAPE, ins.dst, ins.tensor, ins.newshape, builtins["reshape_tensor"]))
            elif op == O.DeviceCopy:
                code.append((D.MOVE, ins.dst, ins.src))  # one device (the host): a copy is an alias
            elif op == O.Fatal:
                code.append((D.FATAL,))
            else:  # pragma: no cover - every opcode is handled above
                raise ExecutionError(f"cannot decode {ins}")
        code, pcs = _fuse(code, pcs, fn, known)
        # renumber jump targets: a dropped load is a no-op, so a jump to it goes to the next kept one
        index, nxt = [0] * (len(instrs) + 1), len(code)
        kept = dict(zip(pcs, range(len(code))))
        for pc in range(len(instrs), -1, -1):
            nxt = kept.get(pc, nxt)
            index[pc] = nxt
        for i, ins in enumerate(code):
            if ins[0] in (D.IF, D.IF_REG):
                code[i] = (*ins[:3], index[ins[3]], index[ins[4]])
            elif ins[0] == D.GOTO:
                code[i] = (D.GOTO, index[ins[1]])
        return tuple(code), tuple(pcs)

    def disassemble(self, func_name: str = "main") -> str:
        """``func_name``'s decoded code as the dispatch loop runs it: one line per decoded instruction with
        its handler (``decoded.FORMS``), named operands and the bytecode instruction it came from."""
        if self._exec_mode != "bytecode":
            raise UnsupportedError(f"disassemble: exec mode {self._exec_mode!r} runs no decoded code (its code is "
                                   f"exe.as_python() in compiled mode, the library's C in native mode)")
        info = self._function(func_name)
        names = {id(k): f"{name}({form})" for form, ks in (("kernel", self._kernels), ("tuple form", self._shape_forms(
            self._mode, self._kernels))) for k, name in zip(ks, self._kernel_names) if k is not None}
        return D.describe(info.code, info.pcs, self.exe.functions[info.index].instructions, names)

    # --- the dispatch loop: one branch per handler of decoded.FORMS, numbered as there --------------
    def _run(self, info: _FunctionInfo, args: list):
        funcs = self._funcs
        fidx = info.index
        code = info.code
        regs = [*args, *info.tail]
        frames = []
        pc = 0
        deep = None  # the frame stack's state once it is deep (_deep_stack)
        try:
            while True:
                ins = code[pc]
                op = ins[0]
                if op < 16:
                    if op < 8:  # --- kernels and memory
                        if op < 4:
                            if op < 2:
                                if op == 0:  # PACKED2
                                    ins[1](regs[ins[2]], regs[ins[3]])
                                else:  # PACKED3
                                    ins[1](regs[ins[2]], regs[ins[3]], regs[ins[4]])
                            elif op == 2:  # ALLOC_TENSOR: ndarray(shape, dtype, storage, offset)
                                regs[ins[1]] = ins[6](ins[4], ins[5], regs[ins[2]], ins[3])
                            else:  # ALLOC_STORAGE (static size)
                                regs[ins[1]] = ins[5](ins[2], ins[3], ins[4])
                        elif op < 6:
                            if op == 4:  # PACKED1
                                ins[1](regs[ins[2]])
                            else:  # PACKEDN
                                ins[1](*ins[2](regs))
                        elif op == 6:  # SHAPE_OF
                            regs[ins[1]] = ins[3](regs[ins[2]])
                        else:  # ALLOC_TENSOR_REG_T
                            offset = ins[7] if ins[7] is not None else _offset(regs[ins[3]])
                            regs[ins[1]] = ins[6](regs[ins[4]], ins[5], regs[ins[2]], offset)
                        pc += 1
                    elif op < 12:  # --- control flow and ADTs
                        if op < 10:
                            if op == 8:  # MOVE
                                regs[ins[1]] = regs[ins[2]]
                                pc += 1
                            else:  # IF, target known; .item() because comparing NumPy scalars costs ~1 us
                                test = regs[ins[1]]
                                if test.__class__ is not int:
                                    test = test.item()
                                pc = ins[3] if test == ins[2] else ins[4]
                        elif op == 10:  # GOTO
                            pc = ins[1]
                        else:  # RET
                            result = regs[ins[1]]
                            if not frames:
                                return result
                            code, pc, regs, dst, fidx = frames.pop()
                            regs[dst] = result
                    elif op < 14:
                        if op == 12:  # INVOKE
                            frames.append((code, pc + 1, regs, ins[1], fidx))
                            if len(frames) > GC_PAUSE_DEPTH:
                                deep = _deep_stack(frames, deep)
                            fidx = ins[2]
                            callee = funcs[fidx]
                            code = callee.code
                            regs = [*ins[3](regs), *([None] * (callee.num_regs - len(callee.params)))]
                        else:  # TAIL_INVOKE: the callee takes over this frame
                            fidx = ins[1]
                            callee = funcs[fidx]
                            code = callee.code
                            regs = [*ins[2](regs), *([None] * (callee.num_regs - len(callee.params)))]
                        pc = 0
                    elif op == 14:  # GET_FIELD
                        regs[ins[1]] = regs[ins[2]].fields[ins[3]]
                        pc += 1
                    else:  # GET_TAG
                        regs[ins[1]] = regs[ins[2]].tag
                        pc += 1
                elif op < 24:  # --- dynamic shapes and the rest of the common ones
                    if op < 20:
                        if op < 18:
                            if op == 16:  # SHAPE_FUNC_T1
                                regs[ins[1]] = ins[2](*ins[3](regs))[0]
                            else:  # ALLOC_STORAGE_T: the size from a shape tuple
                                shape = regs[ins[2]]
                                if shape and min(shape) < 0:
                                    raise ShapeError(f"alloc_storage: negative dimension in shape {shape}")
                                regs[ins[1]] = ins[5](prod(shape) * ins[6], ins[3], ins[4])
                        elif op == 18:  # LOAD
                            regs[ins[1]] = ins[2]
                        else:  # KILL
                            regs[ins[1]] = None
                    elif op < 22:
                        if op == 20:  # ALLOC_ADT
                            regs[ins[1]] = ADT(ins[2], ins[3](regs))
                        else:  # RESHAPE
                            regs[ins[1]] = ins[4](regs[ins[2]], regs[ins[3]])
                    elif op == 22:  # SHAPE_FUNC_TN
                        for reg, shape in zip(ins[1], ins[2](*ins[3](regs))):
                            regs[reg] = shape
                    else:  # ALLOC_STORAGE_REG
                        regs[ins[1]] = ins[5](int(regs[ins[2]]), ins[3], ins[4])
                    pc += 1
                elif op < 32:  # --- fused pairs and closures
                    if op < 28:
                        if op < 26:
                            # ALLOC_PACKED2 / ALLOC_PACKED3: a static tensor (in bounds, checked at decode), then the kernel
                            regs[ins[1]] = ins[6](ins[4], ins[5], regs[ins[2]], ins[3])
                            if op == 24:
                                ins[7](regs[ins[8]], regs[ins[9]])
                            else:
                                ins[7](regs[ins[8]], regs[ins[9]], regs[ins[10]])
                        elif op == 26:  # ALLOC_DYN: a storage sized by a shape tuple and its one tensor
                            shape = regs[ins[2]]
                            if shape and min(shape) < 0:
                                raise ShapeError(f"alloc_storage: negative dimension in shape {shape}")
                            storage = regs[ins[1]] = ins[5](prod(shape) * ins[6], ins[3], ins[4])
                            regs[ins[7]] = ins[9](shape, ins[8], storage, 0)
                        else:  # KILL2
                            regs[ins[1]] = regs[ins[2]] = None
                        pc += 1
                    elif op == 28:  # SHAPES_FUNC_T1: the ShapeOfs feeding a shape function, then the call
                        for dst, src in ins[4]:
                            regs[dst] = regs[src].shape
                        regs[ins[1]] = ins[2](*ins[3](regs))[0]
                        pc += 1
                    elif op == 31:  # ALLOC_CLOSURE
                        regs[ins[1]] = VMClosure(ins[2], ins[3](regs), ins[4], ins[5])
                        pc += 1
                    else:  # INVOKE_CLOSURE / TAIL_INVOKE_CLOSURE
                        if op == 29:
                            clo = regs[ins[2]]
                            argregs = ins[3]
                        else:
                            clo = regs[ins[1]]
                            argregs = ins[2]
                        if clo.__class__ is not VMClosure:
                            raise ExecutionError(f"invoke_closure: expected a closure, got {type(clo).__name__}")
                        callee = funcs[clo.func_index]
                        new = [*clo.free_vars, *[regs[r] for r in argregs]]
                        if len(new) != len(callee.params):
                            raise ExecutionError(
                                f"invoke_closure: {callee.name} takes {len(callee.params)} values (captured + "
                                f"arguments), got {len(new)}")
                        if op == 29:
                            frames.append((code, pc + 1, regs, ins[1], fidx))
                            if len(frames) > GC_PAUSE_DEPTH:
                                deep = _deep_stack(frames, deep)
                        fidx = callee.index
                        code = callee.code
                        new += [None] * (callee.num_regs - len(new))
                        regs = new
                        pc = 0
                elif op == 32:  # --- rare; ALLOC_STORAGE_SHAPE
                    regs[ins[1]] = ins[5](shape_nbytes(regs[ins[2]], ins[6]), ins[3], ins[4])
                    pc += 1
                elif op == 33:  # ALLOC_TENSOR_REG
                    offset = ins[7] if ins[7] is not None else _offset(regs[ins[3]])
                    regs[ins[1]] = ins[6](tuple(regs[ins[4]].tolist()), ins[5], regs[ins[2]], offset)
                    pc += 1
                elif op == 34:  # IF_REG
                    pc = ins[3] if _scalar(regs[ins[1]]) == _scalar(regs[ins[2]]) else ins[4]
                elif op == 35:  # PACKED_FLAT
                    ins[1](*flatten_args([regs[r] for r in ins[2]]))
                    pc += 1
                elif op == 36:  # ALLOC_TENSOR_DYN_OFFSET
                    regs[ins[1]] = ins[6](ins[4], ins[5], regs[ins[2]], _offset(regs[ins[3]]))
                    pc += 1
                elif op == 37:  # FATAL
                    raise ExecutionError("the VM reached a Fatal instruction (no match clause applies)")
                elif op == 38:  # REF_NEW
                    regs[ins[1]] = RefValue(regs[ins[2]])
                    pc += 1
                elif op == 39:  # REF_SET
                    write_ref(regs[ins[2]], regs[ins[3]])
                    regs[ins[1]] = ADT(0, ())
                    pc += 1
                else:  # pragma: no cover - the decoder emits only the handlers of decoded.FORMS
                    raise ExecutionError(f"bad decoded opcode {op}")
        except Exception as err:
            # The callers' frames go before the error is built: a recursion that ran out of memory holds it
            # there (a stack past GC_PAUSE_DEPTH keeps that many, for the test below).
            del frames[GC_PAUSE_DEPTH + 1:]
            raise self._located_error(err, fidx, pc, info if code is info.code else None) from err
        finally:
            if deep is not None or len(frames) > GC_PAUSE_DEPTH:  # (also when an interrupt came inside pause_gc)
                GC_PAUSERS.discard(id(frames))  # (in C, before an interrupt can be raised: runtime.stack.leave)
                resume_gc(id(frames))

    def _located_error(self, err: Exception, fidx: int, index: int, info: _FunctionInfo | None = None) -> Exception:
        pcs = (info or self._funcs[fidx]).pcs
        pc = pcs[index] if 0 <= index < len(pcs) else -1
        fn = self.exe.functions[fidx]
        ins = fn.instructions[pc] if 0 <= pc < len(fn.instructions) else "?"
        return located_error(err, fn.name, pc, ins)

    # --- calling ----------------------------------------------------------------------------------
    def _call(self, info: _FunctionInfo, args: list):
        if info.owned:  # the function writes these buffers: never the caller's arrays (nor kept inputs)
            args = list(args)
            for k in info.owned:
                args[k] = args[k].copy()
        if self._native_rt is not None and self._mode != "instrument":  # (no specializing: the C computes shapes)
            self._calls["generic"] += 1
            return self._call_native(self._native_rt, info.index, tuple(args))
        if info.shape_slice is not None and self._mode == "plain":
            key = tuple([a.shape for a in args])
            body = info.specialized.get(key)
            if body is None and key in info.sightings:
                body = self._specialize(info, key, args)
            if body is not None:
                self._calls["specialized"] += 1
                if body.entry is not None:  # compiled exec mode: the body's own generated code
                    return body.entry(args)
                return self._run(body, args)
            if len(info.sightings) >= _SPECIALIZE_LIMIT:
                info.sightings.clear()
            info.sightings[key] = True
        self._calls["generic"] += 1
        if self._exec_mode == "compiled":
            from .compiled import call_compiled

            return call_compiled(self._entries, info.index, args, self.exe, self._nests)
        return self._run(info, args)

    def _specialize(self, info: _FunctionInfo, key: tuple, args: list) -> _FunctionInfo:
        """Runs ``info``'s shape slice for these arguments' shapes and returns (and keeps) its body with the
        slice's results preset (``specialize.py``). A shape is specialized when seen a second time, so that
        a stream of ever-new shapes keeps to the generic code; at most ``_SPECIALIZE_LIMIT`` are kept."""
        if self._plain_parts is None:
            self._plain_parts = self._program_parts("plain")
        fn = self.exe.functions[info.index]
        plan = info.shape_slice
        code, pcs = self._decode(fn, *self._plain_parts, keep=plan.slice_pcs, placeholders=plan.placeholders,
                                 private=plan.private, scratch=plan.scratch)
        results = info.num_regs  # one more register: the tuple of the slice's results
        sliced = _FunctionInfo(fn, info.index, num_regs=results + 1)
        returned = (*plan.preset, *(storage for storage, *_ in plan.arena))
        sliced.code = (*code, (D.ALLOC_ADT, results, 0, _tuple_getter(returned)), (D.RET, results))
        sliced.pcs = (*pcs, -1, -1)
        values = self._run(sliced, args).fields
        values = self._placed(plan.arena, values[:len(plan.preset)], values[len(plan.preset):])
        body = _FunctionInfo(fn, info.index)
        body.code, body.pcs = self._decode(fn, *self._plain_parts, skip=plan.body_skip)
        tail = list(body.tail)
        for reg, value in zip(plan.preset, values):
            tail[reg - len(fn.params)] = value
        body.tail = tuple(tail)
        body.arena_bytes = _held_bytes(values)
        if self._exec_mode == "compiled":
            body.entry = self._body_maker(info)(values)
        # the kept arenas are bounded in number and in bytes (the newest is always kept)
        while info.specialized and (len(info.specialized) >= _SPECIALIZE_LIMIT or body.arena_bytes + sum(
                b.arena_bytes for b in info.specialized.values()) > _ARENA_LIMIT):
            del info.specialized[next(iter(info.specialized))]
        info.specialized[key] = body
        info.sightings.pop(key, None)
        return body

    def _placed(self, arena: tuple, values: tuple, scratch: tuple) -> tuple:
        """``values`` with every view of a scratch storage of the ``arena`` moved to that storage's place in
        one block of this VM's allocator: storages whose body spans do not overlap share bytes
        (``specialize.py``; placed by ``plan_memory``, checked by the plan's own ``check``)."""
        # (a storage of shapes the decoder keeps as tuples is not made: ``shape_plan``'s dropped storages)
        made = [(entry, storage) for entry, storage in zip(arena, scratch, strict=True)
                if isinstance(storage, np.ndarray)]
        if not made:
            return values
        alignment = max(64, *(align for (_, align, _, _), _ in made))
        plan = plan_memory([TensorLifetime(str(reg), storage.nbytes, first, last)
                            for (reg, _, first, last), storage in made], "greedy_by_size", alignment).check()
        block = self.allocator.alloc(plan.total_bytes, alignment, "uint8")
        # the scratch storages' address ranges, sorted, with where each one's bytes go in the block
        ranges = sorted((storage.ctypes.data, storage.nbytes, plan.offsets[str(reg)])
                        for (reg, *_), storage in made if storage.nbytes)
        starts = [start for start, _, _ in ranges]
        placed = []
        for value in values:
            if isinstance(value, np.ndarray) and value.nbytes:
                address = value.ctypes.data
                index = bisect.bisect_right(starts, address) - 1
                if index >= 0 and address < starts[index] + ranges[index][1]:
                    start, _, offset = ranges[index]
                    value = np.ndarray(value.shape, value.dtype, buffer=block, offset=offset + address - start,
                                       strides=value.strides)
            placed.append(value)
        return tuple(placed)

    def _body_maker(self, info: _FunctionInfo):
        """Compiled mode: the maker of ``info``'s specialized body as generated code (one per function)."""
        maker = self._body_makers.get(info.index)
        if maker is None:
            from .compiled import specialized_body

            maker = specialized_body(self.exe, info.index, info.shape_slice, self._compiled["plain"])
            self._body_makers[info.index] = maker
        return maker

    def exec_stats(self) -> dict:
        """What ran: the exec mode, the calls made through the API (``invoke``, ``run``, ``benchmark``...) by
        the code they ran (``generic``, or a body ``specialized`` to its argument shapes), where specialized
        bodies run (``"compiled code"`` or ``"dispatch loop"``), where calls run while an instrument callback
        is set (native mode: the dispatch loop, calling the same C kernels) and how many shapes are
        specialized now; native mode: ``python_callbacks``, the calls its C made back into Python (primitives
        without C functions: ``exe.stats()["kernel_library"]["native_python_callbacks"]`` lists them)."""
        extra = {"python_callbacks": self._native_rt.python_calls()} if self._native_rt is not None else {}
        if self.native_unavailable:
            extra["native_unavailable"] = self.native_unavailable
        return {"exec_mode": self._exec_mode, "calls": dict(self._calls), **extra,
                "specialized_runs_in": {"compiled": "compiled code", "native": "nowhere (native code)"}.get(
                    self._exec_mode, "dispatch loop"),
                "instrumented_runs_in": "compiled code" if self._exec_mode == "compiled" else "dispatch loop",
                "specialized_shapes": sum(len(info.specialized) for info in self._funcs)}

    def _function(self, func_name: str) -> _FunctionInfo:
        try:
            return self._by_name[func_name]
        except KeyError:
            raise ExecutionError(f"no function {func_name!r} in the executable; have "
                                 f"{', '.join(sorted(self._by_name))}") from None

    def invoke(self, func_name: str = "main", *args, **kwargs):
        """Run ``func_name`` on ``args`` (or on the inputs given to ``set_input``); returns user values."""
        info = self._function(func_name)
        if self._owner is not None:  # busy: nested in this thread's call, or another thread's (then wait)
            return self._one_call("invoke", self._invoke, info, args, kwargs)
        with self._lock:  # (_one_call inlined: the common case)
            try:
                self._owner = _get_ident()
                return self._invoke(info, args, kwargs)
            finally:
                self._owner = None

    def _invoke(self, info: _FunctionInfo, args: tuple, kwargs: dict):
        if args or kwargs or not info.params:
            values = self._convert_inputs(info, args, kwargs)
        else:
            values = self._stored_inputs(info)
        result = self._call(info, values)
        if info.result_check is not None:
            info.result_check(result)
        return self._to_user(result)

    def invoke_closure(self, closure, *args):
        """Call ``closure`` (one this VM's program returned) on ``args``; returns user values (the Relax VM's
        ``invoke_closure``)."""
        clo = self._own_closure(closure, "invoke_closure")
        info = self._funcs[clo.func_index]
        expected = len(info.params) - len(clo.free_vars)
        if len(args) != expected:
            raise ExecutionError(f"invoke_closure: {clo!r} takes {expected} argument(s), got {len(args)}")
        return self.invoke(info.name, *clo.free_vars, *args)

    def run(self, *args, **kwargs):
        """``invoke("main", *args)`` (the Relay VM's ``run``)."""
        return self.invoke("main", *args, **kwargs)

    def __getitem__(self, func_name: str):
        info = self._function(func_name)
        return lambda *args, **kwargs: self.invoke(info.name, *args, **kwargs)

    def set_input(self, func_name: str, *args, **kwargs) -> None:
        """Check, convert and keep inputs for ``func_name`` (positional, or by parameter name)."""
        info = self._function(func_name)
        self._one_call("set_input", self._set_inputs, info, args, kwargs)

    def _set_inputs(self, info: _FunctionInfo, args: tuple, kwargs: dict) -> None:
        self._inputs[info.name] = self._convert_inputs(info, args, kwargs)
        # the values as given, for set_one_input to replace one of them and check them together again
        self._given_inputs[info.name] = self._arrange(info, args, kwargs)
        self._partial_inputs.discard(info.name)

    def set_one_input(self, func_name: str, *args, **kwargs) -> None:
        """Set one input of ``func_name``, the others staying as they are: ``set_one_input("main", 1, x)``,
        ``set_one_input("main", "x", x)`` or ``set_one_input("main", x=x)`` (the Relay VM's forms).
        The value is checked against its parameter now; the inputs together (symbolic dims shared by
        several parameters) when the function runs, which fails clearly while some input is unset."""
        if kwargs and not args and len(kwargs) == 1:
            (key, value), = kwargs.items()
        elif len(args) == 2 and not kwargs:
            key, value = args
        else:
            raise ExecutionError(f"set_one_input({func_name!r}, ...): expected one index or parameter name "
                                 f"and one value (set_one_input(name, 0, x) or set_one_input(name, x=x)), "
                                 f"got {len(args)} positional and {len(kwargs)} keyword argument(s)")
        info = self._function(func_name)
        self._one_call("set_one_input", self._set_one_input, info, key, value)

    def _set_one_input(self, info: _FunctionInfo, key, value) -> None:
        params = info.params
        if isinstance(key, str):
            if key not in params:
                raise ExecutionError(f"{info.name} has no parameter {key!r}; parameters: {', '.join(params)}")
            index = params.index(key)
        elif isinstance(key, int | np.integer) and not isinstance(key, bool) and 0 <= key < len(params):
            index = int(key)
        else:
            raise ExecutionError(f"{info.name}: expected a parameter name or an index in [0, {len(params)}) "
                                 f"but got {key!r}")
        ty = info.param_types[index] if info.param_types else None
        self._convert(value, ty, f"{info.name} parameter {params[index]!r}", {})  # fail now if it is wrong
        given = list(self._given_inputs.get(info.name) or [_MISSING] * len(params))
        given[index] = value
        self._given_inputs[info.name] = given
        self._inputs.pop(info.name, None)
        self._partial_inputs.add(info.name)

    def _stored_inputs(self, info: _FunctionInfo) -> list:
        if info.name in self._partial_inputs:  # set one by one: check them together (shared symbolic dims)
            given = self._given_inputs[info.name]
            missing = [p for p, v in zip(info.params, given) if v is _MISSING]
            if missing:
                raise ExecutionError(f"{info.name}: input(s) {', '.join(missing)} not set; set them with "
                                     f"set_input or set_one_input")
            self._inputs[info.name] = self._convert_inputs(info, tuple(given), {})
            self._partial_inputs.discard(info.name)
        try:
            return self._inputs[info.name]
        except KeyError:
            raise ExecutionError(f"{info.name} takes {len(info.params)} argument(s) "
                                 f"({', '.join(info.params)}); pass them or call set_input first") from None

    def invoke_stateful(self, func_name: str = "main", *args, **kwargs) -> None:
        """Run ``func_name`` and keep the result for ``get_outputs``; ``args``/``kwargs``, when given, are
        set as its inputs first (as ``set_input`` does, so later calls reuse them), else the inputs
        set before are used."""
        info = self._function(func_name)
        self._outputs[info.name] = self._one_call("invoke_stateful", self._invoke_stateful, info, args, kwargs)
        self._last_stateful = info.name

    def _invoke_stateful(self, info: _FunctionInfo, args: tuple, kwargs: dict):
        if args or kwargs:
            self._set_inputs(info, args, kwargs)
        return self._invoke(info, (), {})

    def invoke_with_outputs(self, func_name: str, input_args, output_args) -> None:
        """Run ``func_name`` and write its results into the caller's arrays ``output_args`` (one per
        result: the fields of a tuple result, else the result), as the Relay VM's ``invoke_with_outputs``.

        ``input_args`` maps parameter names to inputs (a list or tuple gives them by position) and
        sets them as ``set_input`` does; ``None`` or empty runs on the inputs set before. Each output
        array must be writeable and have exactly its result's shape and dtype (nothing is cast or
        broadcast: a mismatch is an ``ExecutionError`` and nothing is written). An output array may
        alias an input: results are computed completely before any output is written."""
        info = self._function(func_name)
        if input_args and not isinstance(input_args, dict | list | tuple):
            raise ExecutionError(f"invoke_with_outputs: expected input_args as a dict of parameter names to "
                                 f"values (or a list), got {type(input_args).__name__}")
        if not isinstance(output_args, list | tuple):
            raise ExecutionError(f"invoke_with_outputs: expected output_args as a list of arrays, got "
                                 f"{type(output_args).__name__}")
        self._one_call("invoke_with_outputs", self._invoke_with_outputs, info, input_args, list(output_args))

    def _invoke_with_outputs(self, info: _FunctionInfo, input_args, outputs: list) -> None:
        if input_args:
            args, kwargs = ((), input_args) if isinstance(input_args, dict) else (tuple(input_args), {})
            self._set_inputs(info, args, kwargs)
        result = self._invoke(info, (), {})
        results = list(result) if isinstance(result, tuple) else [result]
        if len(results) != len(outputs):
            raise ExecutionError(f"invoke_with_outputs: {info.name} has {len(results)} result(s) but "
                                 f"{len(outputs)} output array(s) were given")
        arrays, targets = [], []
        for i, (value, out) in enumerate(zip(results, outputs)):
            if not isinstance(value, NDArray):
                raise ExecutionError(f"invoke_with_outputs: result {i} of {info.name} is {_describe(value)}, "
                                     f"not a tensor; only tensor results can be written into arrays")
            target = out.numpy() if isinstance(out, NDArray) else out
            if not isinstance(target, np.ndarray):
                raise ExecutionError(f"invoke_with_outputs: output {i} must be a NumPy array or NDArray, "
                                     f"got {type(out).__name__}")
            array = value.numpy()
            if target.shape != array.shape or target.dtype != array.dtype:
                raise ExecutionError(f"invoke_with_outputs: output {i} of {info.name} is a {array.dtype} tensor "
                                     f"of shape {array.shape}, but the array given for it is {_describe(target)}")
            if not target.flags.writeable:
                raise ExecutionError(f"invoke_with_outputs: output {i} is a read-only array")
            arrays.append(array)
            targets.append(target)
        # A result sharing memory with another output's array (e.g. an input returned as is, whose
        # array is also an output) would change when that output is written: copy it first.
        for i, array in enumerate(arrays):
            if any(j != i and np.may_share_memory(array, t) for j, t in enumerate(targets)):
                arrays[i] = array.copy()
        for array, target in zip(arrays, targets):
            np.copyto(target, array)

    def get_outputs(self, func_name: str | None = None) -> list:
        """The outputs of the last ``invoke_stateful`` of ``func_name`` (default: of the last one run): a tuple
        result's fields, else ``[result]``; each function keeps its own, as in the Relax VM."""
        if func_name is not None:
            self._function(func_name)  # (an unknown name is an error)
        name = func_name if func_name is not None else self._last_stateful
        if name not in self._outputs:
            raise ExecutionError(f"no outputs{f' of {name}' if name else ''}: call invoke_stateful"
                                 f"{f'({name!r})' if name else ''} first")
        out = self._outputs[name]
        return list(out) if isinstance(out, tuple) else [out]

    def get_num_outputs(self, func_name: str | None = None) -> int:
        return len(self.get_outputs(func_name))

    def get_output(self, index: int, func_name: str | None = None):
        outputs = self.get_outputs(func_name)
        # (as the graph executor's get_output: no negative or non-integer index)
        if not isinstance(index, int | np.integer) or isinstance(index, bool) or not 0 <= index < len(outputs):
            raise ExecutionError(f"output index {index!r} is out of range; the last invoke_stateful gave "
                                 f"{len(outputs)} output(s)")
        return outputs[index]

    def get_input_index(self, input_name: str, func_name: str = "main") -> int:
        info = self._function(func_name)
        return info.params.index(input_name) if input_name in info.params else -1

    # --- instrumentation, statistics, profiling ---------------------------------------------------
    def set_instrument(self, fn) -> None:
        """Call ``fn(func_name, before_run, ret_value, *args)`` around every kernel call; ``None`` removes it.

        Returning ``SKIP_RUN`` from the before-call skips the kernel (and the after-call). In native mode,
        calls run through the dispatch loop while a callback is set (the same C kernels, called from
        Python so that the callback sees each one; docs/native_mode.md).
        """
        self._one_call("set_instrument", self._set_instrument, fn)

    def _set_instrument(self, fn) -> None:
        self._instrument = fn
        self._programs.pop("instrument", None)
        self._compiled.pop("instrument", None)
        self._select_program("plain" if fn is None else "instrument")

    def memory_stats(self) -> dict:
        if self._native_rt is not None:  # native mode allocates from its C pool (same counters)
            return self._native_rt.stats()
        return self.allocator.stats()

    def reset_memory_stats(self) -> None:
        if self._native_rt is not None:
            self._native_rt.reset_stats()
            return
        self.allocator.reset_stats()

    def profile(self, func_name: str = "main", *args, warmup: int = 2, **kwargs):
        """Run once (after ``warmup`` runs, the last one instrumented and discarded) timing every kernel and
        VM op; returns a ``ProfileReport`` (its ``result`` is the run's result)."""
        return self._one_call("profile", self._profile, self._function(func_name), args, kwargs, warmup)

    def _profile(self, info: _FunctionInfo, args: tuple, kwargs: dict, warmup: int):
        from .profiler import ProfileRecorder, ProfileReport

        func_name = info.name
        values = self._convert_inputs(info, args, kwargs) if (args or kwargs or not info.params) \
            else self._stored_inputs(info)
        if self._native_rt is not None:
            return self._profile_native(info, values, warmup)
        for _ in range(warmup - 1):
            self._call(info, values)
        previous = self._mode
        self._profile_recorder = recorder = ProfileRecorder()
        self._programs.pop("profile", None)
        self._compiled.pop("profile", None)
        self._select_program("profile")
        try:
            if warmup > 0:  # warm the instrumented program too, then forget that run
                self._call(info, values)
                recorder.reset()
            start = time.perf_counter_ns()
            result = self._call(info, values)
            total_ns = time.perf_counter_ns() - start
        finally:
            self._select_program(previous)
            self._profile_recorder = None
        return ProfileReport.from_recorder(recorder, total_ns, func_name, self._exec_mode,
                                           result=self._to_user(result))

    def _profile_native(self, info: _FunctionInfo, values: list, warmup: int):
        """Native mode's profile: the C code times each kernel and shape-function call (``tv_native.c``);
        the rows are named as the bytecode VM's (the time between them is the C code's own work)."""
        from .native_mode import profiled_call
        from .profiler import ProfileRecorder, ProfileReport

        previous = self._mode
        self._select_program("plain")  # (an instrument set: the profile runs the C code all the same)
        try:
            for _ in range(warmup):
                self._call(info, values)
            span = []

            def run():
                start = time.perf_counter_ns()
                try:
                    return self._call(info, values)
                finally:
                    span.append(time.perf_counter_ns() - start)
            rows, result = profiled_call(self.exe.c_library.native, len(self._kernel_names), run)
            total_ns = span[-1]
        finally:
            self._select_program(previous)
        recorder = ProfileRecorder()
        for name, (calls, ns) in zip(self._kernel_names, rows.tolist()):
            if calls:
                entry = recorder.entries.setdefault(name, ["kernel", 0, 0, []])
                entry[1] += calls
                entry[2] += ns
        return ProfileReport.from_recorder(recorder, total_ns, info.name, self._exec_mode,
                                           result=self._to_user(result))

    def benchmark(self, func_name: str = "main", *args, number: int = 10, repeat: int = 5, **kwargs):
        """Time ``repeat`` batches of ``number`` calls; returns a ``BenchmarkResult`` (seconds per call)."""
        return self._one_call("benchmark", self._benchmark, self._function(func_name), args, kwargs, number, repeat)

    def _benchmark(self, info: _FunctionInfo, args: tuple, kwargs: dict, number: int, repeat: int):
        from .profiler import BenchmarkResult

        values = self._convert_inputs(info, args, kwargs) if (args or kwargs or not info.params) \
            else self._stored_inputs(info)
        if not all(isinstance(n, int | np.integer) and not isinstance(n, bool) and n >= 1
                   for n in (number, repeat)):
            raise ExecutionError(f"benchmark: expected number (calls per batch) and repeat (batches) to be "
                                 f"positive integers, got number={number!r}, repeat={repeat!r}")
        call = self._call
        call(info, values)  # warm-up (pools fill, caches warm)
        results = []
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(number):
                call(info, values)
            results.append((time.perf_counter() - start) / number)
        return BenchmarkResult(results)

    # --- argument conversion and checking ---------------------------------------------------------
    def _convert_inputs(self, info: _FunctionInfo, args: tuple, kwargs: dict) -> list:
        fast = info.fast_specs
        if fast is not None and not kwargs and len(args) == len(fast):
            for value, (dtype, ndim, shape, static) in zip(args, fast):  # C-contiguous arrays of the right type
                if value.__class__ is not np.ndarray or value.dtype is not dtype or not value.flags.c_contiguous \
                        or (value.shape != shape if shape is not None
                            else value.ndim != ndim or not _fits(value, static)):
                    break
            else:
                return list(args)
        params = info.params
        values = self._arrange(info, args, kwargs)
        types = info.param_types or (None,) * len(params)
        sym_dims: dict = {}
        if all(t.__class__ is TensorType for t in types):  # the common case, without dispatch on types
            return [_convert_tensor(value, ty, f"{info.name} parameter {name!r}", sym_dims)
                    for value, ty, name in zip(values, types, params)]
        return [self._convert(value, ty, f"{info.name} parameter {name!r}", sym_dims)
                for value, ty, name in zip(values, types, params)]

    def _arrange(self, info: _FunctionInfo, args: tuple, kwargs: dict) -> list:
        """The arguments in parameter order (keyword arguments by parameter name); all must be given."""
        params = info.params
        if len(args) > len(params):
            raise ExecutionError(f"{info.name} takes {len(params)} argument(s) ({', '.join(params)}), "
                                 f"got {len(args)}")
        values = list(args) + [_MISSING] * (len(params) - len(args))
        for key, value in kwargs.items():
            if key not in params:
                raise ExecutionError(f"{info.name} has no parameter {key!r}; parameters: {', '.join(params)}")
            index = params.index(key)
            if values[index] is not _MISSING:
                raise ExecutionError(f"{info.name}: parameter {key!r} given twice")
            values[index] = value
        missing = [p for p, v in zip(params, values) if v is _MISSING]
        if missing:
            raise ExecutionError(f"{info.name}: missing argument(s) for {', '.join(missing)}")
        return values

    def _convert(self, value, ty, where: str, sym_dims: dict):
        if isinstance(ty, TensorType):
            return _convert_tensor(value, ty, where, sym_dims)
        if isinstance(ty, TupleType):
            if isinstance(value, ADT) and value.tag == 0 and value.constructor is None:
                value = value.fields
            if not isinstance(value, (tuple, list)) or len(value) != len(ty.fields):
                raise ExecutionError(f"{where}: expected a tuple of {len(ty.fields)} values "
                                     f"({ty!r}), got {_describe(value)}")
            return ADT(0, [self._convert(v, t, f"{where}[{i}]", sym_dims)
                           for i, (v, t) in enumerate(zip(value, ty.fields))])
        if isinstance(ty, FuncType):
            return self._own_closure(value, where, ty)
        if isinstance(ty, RefType):  # the caller's cell itself (the program may write it), its content the VM's
            if value.__class__ is not RefValue:
                raise ExecutionError(f"{where}: expected a reference ({ty!r}), got {_describe(value)}")
            value.value = self._convert(value.value, ty.value, f"{where}.value", sym_dims)
            return value
        if isinstance(ty, (TypeCall, GlobalTypeVar)):
            # the interpreter's checks (constructor of the right type, field types, symbolic dims), then
            # the VM's form of the value
            if self._type_module is None:  # (what convert_argument reads of a module)
                self._type_module = SimpleNamespace(type_definitions=self.exe.type_definitions())
            checked = convert_argument(value, ty, where, self._type_module, sym_dims)
            return self._vm_value(checked, where)
        return self._convert_untyped(value, where)

    def _vm_value(self, value, where: str):
        """A value in the interpreter's form (``convert_argument``) in the VM's: tuples become ADTs with tag
        0, constructors get their bytecode tags, arrays are C-contiguous, closures must be ours (nested
        values through ``rebuild``: no recursion)."""
        def step(value):
            cls = value.__class__
            if cls is np.ndarray:
                return _contiguous(value)
            if cls is ADT:
                return Node(value.fields, partial(ADT, self._vm_tag(value, where)))
            if cls is tuple:
                return Node(value, partial(ADT, 0))
            if isinstance(value, Closure):
                return self._own_closure(value, where)
            if cls is RefValue:  # the caller's cell itself (as for a RefType parameter), its content the VM's
                return Node((value.value,), partial(_refill, value))
            raise ExecutionError(f"{where}: cannot pass {_describe(value)} to the VM")

        return rebuild(value, step)

    def _vm_tag(self, value: ADT, where: str) -> int:
        if value.constructor is None:
            if value.tag in self._adt_tags or value.tag == 0:
                return value.tag  # already a VM value (e.g. a result passed back in)
            raise ExecutionError(f"{where}: an ADT argument needs its constructor; build it with "
                                 f"mod.constructor(name)(...)")
        try:
            return self._adt_by_name[value.constructor]
        except KeyError:
            raise ExecutionError(f"{where}: constructor {value.constructor!r} is not defined in this "
                                 f"executable") from None

    def _own_closure(self, value, where: str, ty=None):
        if not isinstance(value, Closure):
            expected = f"a VM closure ({ty!r})" if ty is not None else "a VM closure"
            raise ExecutionError(f"{where}: expected {expected}, got {_describe(value)}")
        if value.__class__ is not VMClosure or value.owner is not self.exe.closure_owner:
            raise ExecutionError(f"{where}: {value!r} was made by another executable (its function index means "
                                 f"nothing here); pass a closure only to a VM running the executable that made it")
        return value

    def _convert_untyped(self, value, where: str):
        return rebuild(value, lambda v: self._untyped_step(v, where))

    def _untyped_step(self, value, where: str):
        """One value of ``_convert_untyped``'s walk (``rebuild``): converted, or a tuple's or ADT's ``Node``."""
        if isinstance(value, np.ndarray):
            return _contiguous(value)
        if isinstance(value, NDArray):
            return _contiguous(value.numpy())
        value = _nullary_constructor_value(value)
        if isinstance(value, ADT):
            return Node(value.fields, partial(ADT, self._vm_tag(value, where)))
        if isinstance(value, tuple):
            return Node(value, partial(ADT, 0))
        if isinstance(value, Closure):
            return self._own_closure(value, where)
        if isinstance(value, (bool, np.bool_)):
            return np.asarray(value, "bool")
        if isinstance(value, int):
            return np.asarray(value, "int32")
        if isinstance(value, float):
            return np.asarray(value, "float32")
        if isinstance(value, (np.generic, list)):
            return np.asarray(value)
        raise ExecutionError(f"{where}: cannot pass a {type(value).__name__} to the VM")

    # --- results ----------------------------------------------------------------------------------
    def _to_user(self, value):
        return rebuild(value, self._user_step)

    def _user_step(self, value):
        """One value of ``_to_user``'s walk (``rebuild``): converted, or an ADT's ``Node``."""
        cls = value.__class__
        if cls is np.ndarray:
            return _wrap(value)
        if cls is ADT:
            if value.tag == 0:
                return Node(value.fields, tuple)
            known = self._adt_tags.get(value.tag)
            if known is None:
                return Node(value.fields, partial(ADT, value.tag))
            return Node(value.fields, partial(_user_adt, known[0], known[1]))
        if isinstance(value, np.ndarray):  # a Storage or other subclass
            return NDArray(np.asarray(value))
        if isinstance(value, int | np.generic):
            return NDArray(np.asarray(value))
        return value


def _user_adt(tag: int, constructor: str, fields: list) -> ADT:
    return ADT(tag, fields, constructor=constructor)


_MISSING = object()


def _nullary_constructor_value(value):
    """``mod.constructor("Nil")()`` builds an IR call (it cannot tell values from expressions without
    arguments); as an argument it means the value ``Nil``."""
    expr = sys.modules.get("tensorvm.ir.expr")  # (without it loaded, no value is an IR call)
    if expr is not None and isinstance(value, expr.Call) and isinstance(value.op, expr.Constructor) \
            and not value.args and not value.op.inputs:
        return ADT(value.op.tag, (), constructor=value.op.name)
    return value


def _describe(value) -> str:
    if isinstance(value, (np.ndarray, NDArray)):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    if isinstance(value, ADT):
        return f"ADT {value.constructor or value.tag}"
    return f"{type(value).__name__} {value!r}"[:80]


_NP_DTYPES = {name: np.dtype(name) for name in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
    "float64")}


def _convert_tensor(value, ty: TensorType, where: str, sym_dims: dict) -> np.ndarray:
    """A NumPy array for a tensor parameter: arrays must match the dtype exactly; Python numbers and lists
    take the parameter's dtype when that keeps their kind (bool to bool, int to int/float, float to float).
    A Python tuple is not a tensor (the value of a tuple-typed parameter: as the interpreter says)."""
    dtype = _NP_DTYPES[ty.dtype]
    if value.__class__ is NDArray:
        value = value.numpy()
    if isinstance(value, np.ndarray):
        arr = value
    elif isinstance(value, np.generic):
        arr = np.asarray(value)
    elif isinstance(value, (bool, int, float, list)):
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError) as err:
            raise ExecutionError(f"{where}: cannot make a {dtype} tensor from {value!r}: {err}") from None
        if arr.dtype != dtype:
            arr = _cast_python_value(arr, value, ty.dtype, where)
    else:
        raise ExecutionError(f"{where}: expected a {dtype} tensor ({ty!r}), got {_describe(value)}")
    if arr.dtype != dtype:
        raise ExecutionError(f"{where}: expected dtype {dtype}, got {arr.dtype} (shape {arr.shape})")
    shape = ty.shape
    if arr.ndim != len(shape):
        raise ShapeError(f"{where}: expected rank {len(shape)} ({ty!r}), got shape {arr.shape}")
    for axis, (want, got) in enumerate(zip(shape, arr.shape)):
        if want.__class__ is int:
            if want != got:
                raise ShapeError(f"{where}: dimension {axis} must be {want} ({ty!r}), got shape {arr.shape}")
        elif want.__class__ is SymDim:
            bound = sym_dims.setdefault(want.name, (got, where))
            if bound[0] != got:
                raise ShapeError(f"{where}: dimension {axis} is the symbolic dimension {want.name}, bound to "
                                 f"{bound[0]} by {bound[1]}, but got {got} (shape {arr.shape})")
        elif not isinstance(want, (AnyDim, SymDim)):
            raise ShapeError(f"{where}: unexpected dimension {want!r} in {ty!r}")
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def _cast_python_value(arr: np.ndarray, value, dtype: str, where: str) -> np.ndarray:
    source, target = arr.dtype.kind, np.dtype(dtype).kind
    if arr.size and not (source == target or (source in "iu" and target in "iuf")):
        raise ExecutionError(f"{where}: expected {dtype}, got {value!r} ({arr.dtype.name} values)")
    cast = arr.astype(dtype)
    if source in "iu" and not np.array_equal(cast.astype(arr.dtype), arr):
        raise ExecutionError(f"{where}: expected {dtype}, got {value!r}: the values do not fit {dtype}")
    return cast


def _refill(cell: RefValue, fields: list) -> RefValue:
    cell.value = fields[0]
    return cell


def _contiguous(arr: np.ndarray) -> np.ndarray:
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def tuple_forms(kernels: list, primitives: list) -> list:
    """Per kernel: the tuple form of a shape function (``kernel_python.build_shape_func_tuples``), or None."""
    return [getattr(k, "tuple_form", None) if p.kind == "shape_func" else None for k, p in zip(kernels, primitives)]


def _native_module():
    """The compiled helper module, or None (no C compiler or Python headers; or TENSORVM_NATIVE=0)."""
    try:
        from .fastcall import fastcall_module
    except ImportError:  # pragma: no cover - a deployment without the compiler layer
        return None
    return fastcall_module()


def _same_form(wrapper, form):
    """``wrapper`` described like the tuple-form shape function it stands for."""
    wrapper.flat_is_input, wrapper.num_outputs, wrapper.out_ranks = form.flat_is_input, form.num_outputs, \
        form.out_ranks
    return wrapper


def _dps_adapter(kernel, form):
    """A tuple-form shape function that runs ``kernel`` (destination passing, int64 shape tensors)."""
    by_shape, ranks = [not flag for flag in form.flat_is_input], form.out_ranks

    def call(*inputs):
        arrays = [np.array(v, _INT64) if flag and v.__class__ is tuple else v for v, flag in zip(inputs, by_shape)]
        outs = [np.zeros((rank,), _INT64) for rank in ranks]
        kernel(*arrays, *outs)
        return tuple(tuple(o.tolist()) for o in outs)
    return call


def _instrumented(kernel, name: str, fn):
    """``kernel`` wrapped with the user's instrument callback (arguments shown as NDArrays)."""
    def call(*args):
        wrapped = [NDArray(a) if isinstance(a, np.ndarray) else a for a in args]
        if fn(name, True, None, *wrapped) == SKIP_RUN:
            return
        kernel(*args)
        fn(name, False, None, *wrapped)
    return call


def _jump_targets(fn: bc.VMFunction) -> set:
    targets = set()
    for pc, ins in enumerate(fn.instructions):
        if isinstance(ins, bc.If):
            targets.update((pc + ins.true_offset, pc + ins.false_offset))
        elif isinstance(ins, bc.Goto):
            targets.add(pc + ins.pc_offset)
    return targets


def _static_storages(fn: bc.VMFunction, known: dict) -> dict:
    """Registers written exactly once, by an ``AllocStorage`` of a known size: register -> bytes."""
    writes: dict = {}
    for ins in fn.instructions:
        for reg in ins.writes():
            writes[reg] = writes.get(reg, 0) + 1
    return {ins.dst: int(known[ins.size]) for ins in fn.instructions
            if isinstance(ins, bc.AllocStorage) and not ins.size_from_shape and ins.size in known
            and writes[ins.dst] == 1}


def _fuse(code: list, pcs: list, fn: bc.VMFunction, known: dict) -> tuple:
    """Pairs of decoded instructions that run as one (fewer trips through the dispatch loop):

    * a static ``AllocTensor`` (bounds proven here, so it cannot fail) and the kernel call after it;
    * ``AllocStorage`` sized by a shape tuple and the ``AllocTensorReg`` of that shape at offset 0 on it;
    * two ``KillRegister``; the ``ShapeOf`` tuples just before a shape function and the call.

    The second instruction of a pair must not be a jump target; the pair keeps the pc of the instruction
    that can fail (the kernel, the storage, the shape function) for error messages."""
    targets = _jump_targets(fn)
    storages = _static_storages(fn, known)
    out_code, out_pcs = [], []
    i = 0

    def reachable_only_from_before(j: int) -> bool:  # no jump lands on pcs[j] or on dropped pcs before it
        return not any(p in targets for p in range(pcs[j - 1] + 1, pcs[j] + 1))

    while i < len(code):
        ins = code[i]
        nxt = code[i + 1] if i + 1 < len(code) and reachable_only_from_before(i + 1) else None
        op = ins[0]
        if nxt is not None and op == D.ALLOC_TENSOR and nxt[0] in (D.PACKED2, D.PACKED3) \
                and ins[2] in storages and ins[3] + math.prod(ins[4]) * ins[5].itemsize <= storages[ins[2]]:
            kind = D.ALLOC_PACKED2 if nxt[0] == D.PACKED2 else D.ALLOC_PACKED3
            out_code.append((kind, *ins[1:7], *nxt[1:]))
            out_pcs.append(pcs[i + 1])
            i += 2
            continue
        if nxt is not None and op == D.ALLOC_STORAGE_T and nxt[0] == D.ALLOC_TENSOR_REG_T and nxt[2] == ins[1] \
                and nxt[4] == ins[2] and nxt[7] == 0 and nxt[5].itemsize == ins[6]:
            out_code.append((D.ALLOC_DYN, *ins[1:7], nxt[1], nxt[5], nxt[6]))
            out_pcs.append(pcs[i])
            i += 2
            continue
        if nxt is not None and op == D.KILL and nxt[0] == D.KILL:
            out_code.append((D.KILL2, ins[1], nxt[1]))
            out_pcs.append(pcs[i])
            i += 2
            continue
        if op == D.SHAPE_OF:  # a run of tuple ShapeOfs (plain .shape) ending at a one-output shape function
            j = i
            while j < len(code) and code[j][0] == D.SHAPE_OF and code[j][3] is tuple_shape_of \
                    and (j == i or reachable_only_from_before(j)):
                j += 1
            if j > i and j < len(code) and code[j][0] == D.SHAPE_FUNC_T1 and reachable_only_from_before(j):
                shapes = tuple((c[1], c[2]) for c in code[i:j])
                out_code.append((D.SHAPES_FUNC_T1, *code[j][1:4], shapes))
                out_pcs.append(pcs[j])
                i = j + 1
                continue
        out_code.append(ins)
        out_pcs.append(pcs[i])
        i += 1
    return out_code, out_pcs


def _constant_registers(fn: bc.VMFunction, constants) -> dict:
    """Registers written exactly once, by ``LoadConst``/``LoadConsti`` (and not parameters), with values.

    Readers of such a register may use the value as an immediate (how offsets and static sizes avoid a
    per-execution ``int()``).
    """
    writes: dict[int, int] = {}
    values: dict[int, object] = {}
    for ins in fn.instructions:
        for reg in ins.writes():
            writes[reg] = writes.get(reg, 0) + 1
        if isinstance(ins, bc.LoadConst):
            data = constants[ins.const_index]
            if data.ndim == 0 and data.dtype.kind in "iub":
                values[ins.dst] = data.item()
        elif isinstance(ins, bc.LoadConsti):
            values[ins.dst] = ins.value
    n_params = len(fn.params)
    # (negative values stay in registers, so that the run-time checks of offsets and sizes see them)
    return {r: v for r, v in values.items() if writes.get(r) == 1 and r >= n_params and v >= 0}


def _immediate_only_registers(fn: bc.VMFunction, known: dict) -> set:
    """Constant registers (``known``) read only where the decoder uses the value as an immediate."""
    O = bc.Opcode
    folded = set(known)
    for ins in fn.instructions:
        op = ins.opcode
        if op == O.AllocTensor:
            reads = (ins.storage,)
        elif op == O.AllocTensorReg:
            reads = (ins.storage, ins.shape_register)
        elif op == O.AllocStorage:
            reads = (ins.size,) if ins.size_from_shape else ()
        elif op == O.If:
            reads = (ins.test,)
        else:
            reads = ins.reads()
        folded.difference_update(reads)
    return folded


def located_error(err: Exception, func_name: str, pc: int, ins) -> Exception:
    """``err`` re-raised with the VM location: ``ExecutionError`` unless it is a tensorvm error already."""
    where = f"in VM function {func_name!r} at pc {pc} ({ins})"
    if isinstance(ins, (bc.AllocTensor, bc.AllocTensorReg)) and isinstance(err, (TypeError, ValueError)):
        return ShapeError(f"alloc_tensor: cannot place a {ins.dtype} tensor in its storage: {err} [{where}]")
    if isinstance(err, TensorVMError):
        try:
            return type(err)(f"{err} [{where}]")
        except TypeError:
            return ExecutionError(f"{type(err).__name__}: {err} [{where}]")
    if isinstance(err, (AttributeError, TypeError)) and ("fields" in str(err) or "tag" in str(err)):
        return ExecutionError(f"expected an ADT or tuple value ({err}) [{where}]")
    if isinstance(err, MemoryError):
        return ExecutionError(f"out of memory ({err}) [{where}]")
    return ExecutionError(f"{type(err).__name__}: {err} [{where}]")


