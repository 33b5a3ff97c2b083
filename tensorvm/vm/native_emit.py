"""The native exec mode's emitter: each VM function's bytecode as a C function (docs/native_mode.md).

``check_program(exe)`` refuses, with an ``UnsupportedError`` naming the function, pc and instruction,
every program this emitter cannot translate exactly, before anything is built. ``emit_program(exe,
kernels, shape_funcs)`` writes the C translation unit that goes into the executable's kernel library:
the runtime (``native/tv_runtime.c``), one checked wrapper per kernel and per C shape function the
bytecode calls, one C function per VM function and the entry point ``tvn_invoke``.

Invariant: the C does what the bytecode VM does for every instruction it emits, or fails with the
error the VM raises for the same fault. A primitive with no C function (a NumPy kernel, a Python shape
function, the cases a C shape function leaves to Python) is called through the host's callback
(``tv_ctx.callback``: under Python the bridge calls the bytecode VM's callable for it; the standalone AOT
library has none and refuses such programs, ``python_primitives``).

Registers are slots of a C array (``reg_``; written ``r<n>`` while a statement is made), each a ``tv_obj*``
owning one reference, or, for registers written only by ``GetTag``/``LoadConsti`` (and ``Move``s of them)
and read only as integers, C locals ``i<n>`` (``int64_t``). Control flow is ``goto``
between labels at jump targets; a self tail call jumps back to the start (constant stack).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedError
from ..ir.types import RefType, nested_types
from . import bytecode as bc
from .arena_slots import arena_slots
from .native_mode import RUNTIME_SOURCE, native_header, python_primitives, runtime_text

__all__ = ["check_program", "emit_program", "python_primitives", "NativeKernel", "RUNTIME_SOURCE", "runtime_text"]

HELPERS_SOURCE = "tv_native.c"

# The instructions the emitter translates: all of them.
_SUPPORTED = frozenset(bc.Opcode)
_INT_WRITERS = (bc.GetTag, bc.LoadConsti)
_REGISTER = re.compile(r"\br(\d+)\b")  # a value register's name in a statement (``_FunctionEmitter.emit``)


@dataclass(frozen=True)
class NativeKernel:
    """What the emitter needs of one compiled kernel: its C function (a loop-IR ``PrimFunc``) and where
    its constant arrays start in the context's constant table."""

    func: object
    first_constant: int
    num_constants: int


def _where(fn, pc, ins) -> str:
    return f"VM function {fn.name!r} at pc {pc} ({ins})"


def _int_registers(fn: bc.VMFunction) -> set:
    """Registers holding C integers: written only by GetTag/LoadConsti (or Moves of such registers, or
    killed) and read only where the emitter takes a C integer (``_int_operand_ok``). Any other register an
    integer is written to is a value register: the integer is boxed as a 0-d int64 tensor (``tvn_box_int``),
    which every reader takes as the bytecode VM takes its Python int."""
    writers: dict = {}
    for ins in fn.instructions:
        for reg in ins.writes():
            writers.setdefault(reg, []).append(ins)
    ints = {r for r, ws in writers.items()
            if r >= len(fn.params) and any(isinstance(i, _INT_WRITERS) for i in ws)
            and all(isinstance(i, (*_INT_WRITERS, bc.Move, bc.KillRegister)) for i in ws)}
    changed = True
    while changed:  # (to the fixed point: dropping one register may drop those moved from or to it)
        changed = False
        for r in sorted(ints):
            if any(isinstance(i, bc.Move) and i.src not in ints for i in writers[r]):
                ints.discard(r)
                changed = True
        for ins in fn.instructions:
            for reg in set(ins.reads()) & ints:
                if not _int_operand_ok(ins, reg):
                    ints.discard(reg)
                    changed = True
    return ints


def _int_operand_ok(ins, reg) -> bool:
    """Whether an instruction may read register ``reg`` as a C integer."""
    if isinstance(ins, bc.If):
        return True
    if isinstance(ins, bc.AllocStorage):
        return reg == ins.size and not ins.size_from_shape
    if isinstance(ins, (bc.AllocTensor, bc.AllocTensorReg)):
        return reg == ins.offset
    return isinstance(ins, (bc.Move, bc.KillRegister))


NATIVE_MAX_RANK = 16  # (tv_runtime.h: TV_MAX_RANK, a tensor's dims in its struct)


def _holds_ref(ty) -> bool:
    return any(isinstance(part, RefType) for part in nested_types(ty))


def check_program(exe) -> None:
    """``UnsupportedError`` for what the native emitter does not translate (docs/native_mode.md says why)."""
    if exe.target != "c":
        raise UnsupportedError(f"exec_mode='native' needs target 'c' (the VM functions become C in the kernel "
                               f"library); got target {exe.target!r}")
    for fn in exe.functions:
        if fn.name == "main" and any(_holds_ref(t) for t in (*(fn.param_types or ()), fn.ret_type)):
            raise UnsupportedError("native mode: main takes or returns a reference, which would be copied between "
                                   "Python and C (its writes not shared); the bytecode loop runs it")
        for pc, ins in enumerate(fn.instructions):
            if ins.opcode not in _SUPPORTED:
                raise UnsupportedError(f"native mode does not support {ins.name} yet ({_where(fn, pc, ins)})")
            if isinstance(ins, bc.AllocStorage) and ins.alignment > 64:
                raise UnsupportedError(f"native mode: alignment {ins.alignment} > 64 ({_where(fn, pc, ins)})")


# --- emission ---------------------------------------------------------------------------------------
def _c_string(text: str) -> str:
    escaped = text.encode("ascii", "backslashreplace").decode().replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\n", "\\n").replace("?", "\\?") + '"'


def _dtype_pair(dtype: str) -> tuple[int, int]:
    code, bits, _ = bc.dtype_to_code(dtype)
    return code, bits


def emit_program(exe, kernels: dict, shape_funcs: dict) -> str:
    """The native translation unit of ``exe``: ``kernels`` maps packed index -> ``NativeKernel`` and
    ``shape_funcs`` packed index -> ``ShapeFuncC`` for every ``InvokePacked`` target (else refused)."""
    from ..codegen.c_emit import C_TYPES

    check_program(exe)
    # (the most values a function takes: the arguments a tail call moves, tv_native.c's tvn_tail)
    most = max((len(fn.params) for fn in exe.functions), default=0)
    out = [native_header(exe), f"#define TVN_MAX_ARGS {most}", runtime_text(HELPERS_SOURCE)]
    n = len(exe.functions)
    out.extend(f"static int32_t tvn_f{i}(tv_ctx* ctx, tv_obj* const* args, tv_obj** ret);" for i in range(n))
    out.append(f"static const tv_function tvn_funcs[{max(n, 1)}] = {{{', '.join(f'tvn_f{i}' for i in range(n)) or '0'}}};")
    out.append(f"static const int32_t tvn_arity[{max(n, 1)}] = "
               f"{{{', '.join(str(len(fn.params)) for fn in exe.functions) or '0'}}};")
    out.append(f"TV_UNUSED static int32_t tvn_function_arity(int32_t f) {{ return f >= 0 && f < {n} ? tvn_arity[f] : -1; }}")
    out.append("TV_UNUSED static tv_function tvn_function(int32_t f) { return tvn_funcs[f]; }")
    used = sorted({ins.packed_index for fn in exe.functions for ins in fn.instructions
                   if isinstance(ins, bc.InvokePacked)})
    for p in used:
        if p in kernels:
            out.append(_kernel_wrapper(p, kernels[p], C_TYPES))
        elif p in shape_funcs:
            out.append(_shape_wrapper(p, shape_funcs[p]))
        elif exe.primitives[p].kind == "shape_func":
            out.append(f"static int32_t tvn_s{p}(tv_ctx* ctx, tv_obj* const* a, int32_t n, int32_t fidx, int32_t pc, "
                       f"uint64_t of_tensor) {{\n  return tvn_callback(ctx, a, n, fidx, pc, {p}, of_tensor);\n}}")
        else:
            out.append(f"static int32_t tvn_k{p}(tv_ctx* ctx, tv_obj* const* a, int32_t n, int32_t fidx, int32_t pc) "
                       f"{{\n  return tvn_callback(ctx, a, n, fidx, pc, {p}, 0);\n}}")
    for i, fn in enumerate(exe.functions):
        out.append(_FunctionEmitter(exe, i, fn, shape_funcs).emit())
    out.append(f"""
__attribute__((visibility("default"))) int32_t tvn_invoke(tv_ctx* ctx, int32_t index, tv_obj* const* args,
                                                          int32_t nargs, tv_obj** ret) {{
  if (index < 0 || index >= {n} || nargs != tvn_arity[index])
    return tv_error_set(ctx, TV_ERR_EXEC, index, -1, "tvn_invoke: no function %d taking %d arguments", index, nargs);
  ctx->depth = 0;
  ctx->profile = tvn_profile_of_thread();
  const int32_t rc = tvn_call(ctx, index, args, ret);
  if (ctx->pool->ncells > 0) tv_cells_collect(ctx->pool); /* (cycles the call made and dropped: tv_runtime.c) */
  return rc;
}}
""")
    return "\n".join(out)


def _kernel_wrapper(p: int, kernel: NativeKernel, c_types: dict) -> str:
    """``tvn_k<p>``: flatten the arguments, check each tensor as the kernel's ABI needs (dtype, rank,
    static dims: the checks ``KernelFunction`` makes), then call the kernel with its dynamic dims."""
    from ..te.expr import Const

    func = kernel.func
    nuser_in = func.num_inputs - kernel.num_constants
    nuser = len(func.params) - kernel.num_constants
    proto, call, checks, dims = [], [], [], []
    user = 0
    for k, buf in enumerate(func.params):
        ctype = c_types[buf.dtype]
        proto.append(f"{ctype}*")
        if nuser_in <= k < nuser_in + kernel.num_constants:
            call.append(f"({ctype}*)((tv_tensor*)ctx->constants[{kernel.first_constant + k - nuser_in}])->data")
            continue
        code, bits = _dtype_pair(buf.dtype)
        checks.append(f"  if (t[{user}]->dtype_code != {code} || t[{user}]->dtype_bits != {bits} || t[{user}]->ndim != "
                      f"{len(buf.shape)}) return tvn_arg_error(ctx, fidx, pc, {p}, {user}, t[{user}], "
                      f"{_c_string(buf.dtype)}, {len(buf.shape)});")
        for axis, dim in enumerate(buf.shape):
            if isinstance(dim, Const):
                checks.append(f"  if (t[{user}]->shape[{axis}] != {int(dim.value)}) return tvn_arg_error(ctx, fidx, pc, "
                              f"{p}, {user}, t[{user}], {_c_string(buf.dtype)}, {len(buf.shape)});")
            else:
                dims.append(f"t[{user}]->shape[{axis}]")
        call.append(f"({ctype}*)t[{user}]->data")
        user += 1
    if len(dims) != len(func.dim_params):
        raise UnsupportedError(f"native mode: kernel {func.name} has {len(func.dim_params)} dim parameters for "
                               f"{len(dims)} dynamic dims (an ABI the emitter does not know)")
    proto += ["int64_t"] * len(dims)
    return f"""
int32_t {func.name}({', '.join(proto) or 'void'});
static int32_t tvn_k{p}(tv_ctx* ctx, tv_obj* const* a, int32_t n, int32_t fidx, int32_t pc) {{
  tv_tensor* t[{max(nuser, 1)}];
  if (tvn_flatten(a, n, t, {nuser}) != {nuser}) return tvn_count_error(ctx, fidx, pc, {p}, {nuser});
{chr(10).join(checks)}
  int32_t code;
  if (__builtin_expect(ctx->profile == NULL, 1)) code = {func.name}({', '.join(call + dims)});
  else {{ const int64_t start = tvn_now(); code = {func.name}({', '.join(call + dims)}); tvn_profile_add(ctx, {p}, start); }}
  if (code != 0) {{
    tv_error_set(ctx, TV_ERR_KERNEL, fidx, pc, "kernel error %d", code);
    ctx->error.packed = {p};
    ctx->error.code = code;
    return TV_ERR_KERNEL;
  }}
  return 0;
}}"""


def _constant_int_registers(fn: bc.VMFunction, ints: set, constants) -> set:
    """Registers written only by ``LoadConst`` of one-element integer constants (or killed) and read only
    where the emitter takes a C integer (offsets, sizes, If operands): C integers, as ``LoadConsti``'s
    (no reference counting of the constant, no reading of its tensor at each use)."""
    writers: dict = {}
    for ins in fn.instructions:
        for reg in ins.writes():
            writers.setdefault(reg, []).append(ins)

    def integer_constant(ins) -> bool:
        value = constants[ins.const_index] if 0 <= ins.const_index < len(constants) else None
        return isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "iu"

    candidates = {r for r, ws in writers.items()
                  if r >= len(fn.params) and r not in ints and any(isinstance(i, bc.LoadConst) for i in ws)
                  and all(isinstance(i, bc.KillRegister) or (isinstance(i, bc.LoadConst) and integer_constant(i))
                          for i in ws)}
    for ins in fn.instructions:
        for reg in set(ins.reads()) & candidates:
            if isinstance(ins, bc.Move) or not _int_operand_ok(ins, reg):
                candidates.discard(reg)
    return candidates


def _shape_of_registers(fn: bc.VMFunction, ints: set, shape_funcs: dict, primitives) -> set:
    """Registers that need not hold a shape tensor: written only by ``ShapeOf`` (or killed) and read only as
    an input a C shape function reads by shape. Such a register holds a tensor of the dims alone (no
    storage: ``tvn_shape_header``; holding the tensor itself kept its memory to the end of the call, as the
    compiler never kills shapes) and the shape function reads its dims (``tvn_s<p>``'s ``of_tensor``): no
    storage allocated for the shape."""
    writers: dict = {}
    for ins in fn.instructions:
        for reg in ins.writes():
            writers.setdefault(reg, []).append(ins)
    candidates = {r for r, ws in writers.items()
                  if r >= len(fn.params) and r not in ints and any(isinstance(i, bc.ShapeOf) for i in ws)
                  and all(isinstance(i, (bc.ShapeOf, bc.KillRegister)) for i in ws)}
    for ins in fn.instructions:
        if not candidates:
            break
        readers = set(ins.reads()) & candidates
        if not readers:
            continue
        spec = shape_funcs.get(ins.packed_index) if isinstance(ins, bc.InvokePacked) else None
        if spec is None or primitives[ins.packed_index].kind != "shape_func":
            candidates -= readers
            continue
        nin = len(spec.flat_is_input)
        for k, reg in enumerate(ins.args):
            if reg in candidates and (k >= min(nin, 64) or spec.flat_is_input[k]):
                candidates.discard(reg)  # (an output, read by data, or past the mask)
    return candidates


def _shape_wrapper(p: int, spec) -> str:
    """``tvn_s<p>``: a C shape function called as the VM calls shape functions (DPS: inputs are tensors
    read by data or int64 shape tensors, outputs int64 shape tensors). Bit ``i`` of ``of_tensor`` says
    input ``i`` is a tensor whose dims are the shape (a ``ShapeOf`` not made, ``_shape_of_registers``)."""
    nin, nout = len(spec.flat_is_input), len(spec.out_ranks)
    lines = []
    for i, (by_data, rank, dtype) in enumerate(zip(spec.flat_is_input, spec.in_ranks, spec.in_dtypes)):
        if by_data:
            code, bits = _dtype_pair(dtype)
            lines.append(f"  if (t[{i}]->dtype_code != {code} || t[{i}]->dtype_bits != {bits} || t[{i}]->ndim != {rank}) "
                         f"return tvn_arg_error(ctx, fidx, pc, {p}, {i}, t[{i}], {_c_string(dtype)}, {rank});")
            lines.append(f"  shapes[{i}] = t[{i}]->shape; data[{i}] = t[{i}]->data;")
        elif i < 64:
            lines.append(f"  if (of_tensor >> {i} & 1) {{\n"
                         f"    if (t[{i}]->ndim != {rank}) return tvn_arg_error(ctx, fidx, pc, {p}, {i}, t[{i}], "
                         f"\"tensor (its shape) of rank {rank}\", {rank});\n"
                         f"    shapes[{i}] = t[{i}]->shape;\n  }} else {{\n"
                         f"    if (!tvn_is_shape(t[{i}], {rank})) return tvn_arg_error(ctx, fidx, pc, {p}, {i}, t[{i}], "
                         f"\"int64 shape of rank {rank}\", 1);\n"
                         f"    shapes[{i}] = (const int64_t*)t[{i}]->data;\n  }}\n  data[{i}] = NULL;")
        else:
            lines.append(f"  if (!tvn_is_shape(t[{i}], {rank})) return tvn_arg_error(ctx, fidx, pc, {p}, {i}, t[{i}], "
                         f"\"int64 shape of rank {rank}\", 1);")
            lines.append(f"  shapes[{i}] = (const int64_t*)t[{i}]->data; data[{i}] = NULL;")
    for j, rank in enumerate(spec.out_ranks):
        k = nin + j
        lines.append(f"  if (!tvn_is_shape(t[{k}], {rank})) return tvn_arg_error(ctx, fidx, pc, {p}, {k}, t[{k}], "
                     f"\"int64 shape of rank {rank}\", 1);")
        lines.append(f"  out[{j}] = (int64_t*)t[{k}]->data;")
    nmsg = len(spec.messages)
    return f"""
int32_t {spec.name}(const int64_t* const* shapes, const void* const* data, int64_t* const* out);
extern const char* const {spec.name}_messages[];
static int32_t tvn_s{p}(tv_ctx* ctx, tv_obj* const* a, int32_t n, int32_t fidx, int32_t pc, uint64_t of_tensor) {{
  tv_tensor* t[{nin + nout}];
  const int64_t* shapes[{max(nin, 1)}];
  const void* data[{max(nin, 1)}];
  int64_t* out[{max(nout, 1)}];
  /* (of_tensor names arguments: they are the flattened values only when no argument is a tuple) */
  if (tvn_flatten(a, n, t, {nin + nout}) != {nin + nout} || (of_tensor != 0 && n != {nin + nout}))
    return tvn_count_error(ctx, fidx, pc, {p}, {nin + nout});
{chr(10).join(lines)}
  int32_t code;
  if (__builtin_expect(ctx->profile == NULL, 1)) code = {spec.name}(shapes, data, out);
  else {{ const int64_t start = tvn_now(); code = {spec.name}(shapes, data, out); tvn_profile_add(ctx, {p}, start); }}
  if (code != 0) {{
    /* under Python: the Python shape function answers a deferred case or raises the bytecode VM's error (one
       call, as the bytecode VM counts it: the callback's count replaces this one's, its time adds) */
    if (ctx->callback != NULL) {{
      if (ctx->profile != NULL) ctx->profile[2 * {p}] -= 1;
      return tvn_callback(ctx, a, n, fidx, pc, {p}, of_tensor);
    }}
    const int32_t k = code - 2000;
    tv_error_set(ctx, TV_ERR_SHAPE_FUNC, fidx, pc, "%s", (k >= 0 && k < {nmsg}) ? {spec.name}_messages[k] : "unknown error");
    ctx->error.packed = {p};
    ctx->error.code = code;
    return TV_ERR_SHAPE_FUNC;
  }}
  return 0;
}}"""


class _FunctionEmitter:
    def __init__(self, exe, index: int, fn: bc.VMFunction, shape_funcs: dict):
        self.exe, self.index, self.fn = exe, index, fn
        self.ints = _int_registers(fn)
        self.ints |= _constant_int_registers(fn, self.ints, exe.constants)
        self.shape_of = _shape_of_registers(fn, self.ints, shape_funcs, exe.primitives)
        regs = set(range(len(fn.params)))
        for ins in fn.instructions:
            regs.update(ins.reads())
            regs.update(ins.writes())
        self.objs = sorted(regs - self.ints)
        self.tails = bc.tail_call_pcs(fn)
        # the function's arena slots (arena_slots.py): AllocStorage pc -> slot, and each slot's span
        arena = arena_slots(fn)
        self.arena = {pc: k for k, (pc, _, _) in enumerate(arena)}
        self.spans = tuple((first, last) for _, first, last in arena)
        self.targets = set()
        for pc, ins in enumerate(fn.instructions):
            if isinstance(ins, bc.If):
                self.targets.update((pc + ins.true_offset, pc + ins.false_offset))
            elif isinstance(ins, bc.Goto):
                self.targets.add(pc + ins.pc_offset)

    def emit(self) -> str:
        fn, lines = self.fn, []
        lines.append(f"/* {_comment(fn.name)}({', '.join(_comment(p) for p in fn.params)}) */")
        lines.append(f"static int32_t tvn_f{self.index}(tv_ctx* ctx, tv_obj* const* args, tv_obj** ret) {{")
        # Value registers are the slots of one array (reg_), not C locals: every error exit then jumps to the
        # one loop releasing them, where separate locals made the compiler materialize each register's
        # state at each of the hundreds of exits (half a megabyte of code for a 64-kernel chain).
        slot = {r: k for k, r in enumerate(self.objs)}

        def registers(text: str) -> str:  # (the statements hold no user text: names are in comments only)
            return _REGISTER.sub(lambda m: f"reg_[{slot[int(m.group(1))]}]" if int(m.group(1)) in slot
                                 else m.group(0), text)
        lines.append("  int32_t rc = 0;")
        lines.append(f"  tv_obj* reg_[{max(len(self.objs), 1)}] = {{NULL}};")
        lines.extend(f"  int64_t i{r} = 0;" for r in sorted(self.ints))
        lines.append("  (void)args;\n  (void)ret;")
        if self.arena:  # (before any exit: the exit ends the arena's call)
            lines.append(f"  tv_arena* ar_ = tvn_arena_begin(ctx, {self.index}, {len(self.exe.functions)}, "
                         f"{len(self.arena)});")
            lines.insert(0, f"static const int32_t tvn_f{self.index}_spans[{len(self.spans)}][2] = {{"
                            + ", ".join(f"{{{a}, {b}}}" for a, b in self.spans) + "};")
        lines.extend(registers(f"  r{i} = args[{i}]; tv_incref(r{i});") for i in range(len(fn.params)))
        lines.append("tv_start:;")
        for pc, ins in enumerate(fn.instructions):
            if pc in self.targets:
                lines.append(f"L{pc}:;")
            lines.append(f"  /* {pc}: {_comment(str(ins))} */")
            lines.extend("  " + line for line in registers(self._statement(pc, ins)).split("\n"))
        lines.append(f"  rc = tv_error_set(ctx, TV_ERR_EXEC, {self.index}, {len(fn.instructions)}, "
                     f"\"the function ends without ret\");")
        lines.append("tv_exit:")
        lines.append(f"  for (int32_t k_ = 0; k_ < {len(self.objs)}; ++k_) tv_decref(reg_[k_]);")
        if self.arena:
            lines.append(f"  tvn_arena_end(ctx, ar_, {self.index}, rc == 0 || rc == TVN_TAIL, tvn_f{self.index}_spans);")
        lines.append("  return rc;")
        lines.append("}")
        if pc_targets := [t for t in self.targets if not 0 <= t < len(fn.instructions)]:
            raise UnsupportedError(f"native mode: {fn.name!r} jumps outside the function (to {pc_targets})")
        if not self._uses_start:
            lines.remove("tv_start:;")
        return "\n".join(lines)

    _uses_start = False

    def _fail(self, pc: int, kind: str, message: str) -> str:
        return f"{{ rc = tv_error_set(ctx, {kind}, {self.index}, {pc}, \"%s\", {_c_string(message)}); goto tv_exit; }}"

    def _box(self, pc: int, value: str, dst: int) -> str:
        """Value register ``dst`` takes the integer ``value`` (a 0-d int64 tensor: ``_int_registers``)."""
        return self._check(f"tvn_box_int(ctx, {value}, &r{dst}, {self.index}, {pc})")

    def _check(self, call: str) -> str:
        return f"if ((rc = {call}) != 0) goto tv_exit;"

    def _args(self, regs) -> str:
        return "{" + (", ".join(f"r{r}" for r in regs) or "NULL") + "}"

    def _set(self, dst: int, value: str) -> str:
        """Register ``dst`` takes ``value`` (a new reference)."""
        return f"{{ tv_obj* s_ = {value}; tv_decref(r{dst}); r{dst} = s_; }}"

    def _int_of(self, reg: int, pc: int, what: str, var: str) -> str:
        """C statements putting register ``reg`` (int or scalar tensor) into the int64 ``var``."""
        if reg in self.ints:
            return f"{var} = i{reg};"
        return f"if (tvn_int_operand(ctx, r{reg}, &{var}, {self.index}, {pc}, {_c_string(what)})) {{ rc = ctx->error.kind; goto tv_exit; }}"

    def _statement(self, pc: int, ins) -> str:  # noqa: C901 - one case per opcode
        O, f = bc.Opcode, self.index
        op = ins.opcode
        if op == O.Move:
            if ins.dst in self.ints:
                return f"i{ins.dst} = i{ins.src};"
            if ins.src in self.ints:
                return self._box(pc, f"i{ins.src}", ins.dst)
            return f"tv_incref(r{ins.src}); " + self._set(ins.dst, f"r{ins.src}")
        if op == O.Ret:
            return f"*ret = r{ins.result}; tv_incref(r{ins.result}); rc = 0; goto tv_exit;"
        if op == O.LoadConst:
            if ins.dst in self.ints:  # (a one-element integer constant: _constant_int_registers)
                value = int(np.asarray(self.exe.constants[ins.const_index]).reshape(()).astype(np.int64))
                return f"i{ins.dst} = INT64_C({value});"
            return f"tv_incref(ctx->constants[{ins.const_index}]); " + self._set(ins.dst, f"ctx->constants[{ins.const_index}]")
        if op == O.LoadConsti:
            if ins.dst not in self.ints:
                return self._box(pc, f"INT64_C({int(ins.value)})", ins.dst)
            return f"i{ins.dst} = INT64_C({int(ins.value)});"
        if op == O.KillRegister:
            return "" if ins.dst in self.ints else f"tv_decref(r{ins.dst}); r{ins.dst} = NULL;"
        if op == O.Goto:
            return f"goto L{pc + ins.pc_offset};"
        if op == O.If:
            def operand(reg, name):
                if reg in self.ints:
                    return f"{name}i = i{reg}; {name}f = 0;"
                return (f"if (tvn_test(ctx, r{reg}, &{name}i, &{name}d, &{name}f, {f}, {pc})) "
                        f"{{ rc = ctx->error.kind; goto tv_exit; }}")
            return ("{ int64_t ai = 0, bi = 0; double ad = 0, bd = 0; int af = 0, bf = 0;\n"
                    f"  {operand(ins.test, 'a')}\n  {operand(ins.target, 'b')}\n"
                    f"  if (tv_values_equal(ai, ad, af, bi, bd, bf)) goto L{pc + ins.true_offset}; "
                    f"else goto L{pc + ins.false_offset}; }}")
        if op == O.Fatal:
            return self._fail(pc, "TV_ERR_EXEC", "the VM reached a Fatal instruction (no match clause applies)")
        if op == O.InvokePacked:
            info = self.exe.primitives[ins.packed_index]
            if info.kind == "shape_func":
                mask = sum(1 << k for k, reg in enumerate(ins.args) if reg in self.shape_of)
                call = f"tvn_s{ins.packed_index}(ctx, a_, {len(ins.args)}, {f}, {pc}, UINT64_C({mask}))"
            else:
                call = f"tvn_k{ins.packed_index}(ctx, a_, {len(ins.args)}, {f}, {pc})"
            return f"{{ tv_obj* a_[] = {self._args(ins.args)}; " + self._check(call) + " }"
        if op == O.AllocStorage:
            if ins.size_from_shape:
                itemsize = np.dtype(ins.dtype_hint).itemsize
                size = (f"int64_t d_[TV_MAX_RANK]; int32_t n_; "
                        f"if (tvn_shape_operand(ctx, r{ins.size}, d_, &n_, {f}, {pc}, \"alloc_storage\")) "
                        f"{{ rc = ctx->error.kind; goto tv_exit; }}\n  const int64_t s_ = tvn_nbytes(d_, n_, {itemsize});")
            else:
                size = "int64_t s_ = 0; " + self._int_of(ins.size, pc, "alloc_storage", "s_")
            if pc in self.arena:
                alloc = f"tvn_arena_storage(ctx, ar_, {self.arena[pc]}, s_, &r{ins.dst}, {f}, {pc})"
            else:
                alloc = f"tvn_alloc_storage(ctx, s_, &r{ins.dst}, {f}, {pc})"
            return "{ " + size + "\n  " + self._check(alloc) + " }"
        if op in (O.AllocTensor, O.AllocTensorReg):
            code, bits = _dtype_pair(ins.dtype)
            offset = "int64_t o_ = 0; " + self._int_of(ins.offset, pc, "alloc_tensor", "o_")
            if op == O.AllocTensor:
                dims = f"const int64_t d_[{max(len(ins.shape), 1)}] = {{{', '.join(map(str, ins.shape)) or '0'}}}; " \
                       f"const int32_t n_ = {len(ins.shape)};"
                if len(ins.shape) > NATIVE_MAX_RANK:
                    raise UnsupportedError(f"native mode: rank {len(ins.shape)} > {NATIVE_MAX_RANK} "
                                           f"({_where(self.fn, pc, ins)})")
            else:
                dims = (f"int64_t d_[TV_MAX_RANK]; int32_t n_; if (tvn_shape_operand(ctx, r{ins.shape_register}, d_, "
                        f"&n_, {f}, {pc}, \"alloc_tensor_reg\")) {{ rc = ctx->error.kind; goto tv_exit; }}")
            return ("{ " + offset + "\n  " + dims + "\n  "
                    + self._check(f"tvn_alloc_tensor(ctx, r{ins.storage}, o_, d_, n_, {code}, {bits}, &r{ins.dst}, "
                                  f"{f}, {pc})") + " }")
        if op == O.DeviceCopy:
            return self._check(f"tvn_device_copy(ctx, r{ins.src}, &r{ins.dst}, {f}, {pc})")
        if op == O.ShapeOf:
            if ins.dst in self.shape_of:  # the tensor's dims alone (the shape the shape function reads)
                return self._check(f"tvn_shape_header(ctx, r{ins.tensor}, &r{ins.dst}, {f}, {pc})")
            return self._check(f"tvn_shape_of(ctx, r{ins.tensor}, &r{ins.dst}, {f}, {pc})")
        if op == O.ReshapeTensor:
            return self._check(f"tvn_reshape(ctx, r{ins.tensor}, r{ins.newshape}, &r{ins.dst}, {f}, {pc})")
        if op == O.AllocADT and ins.tag == bc.REF_WRITE_TAG:  # (a cell itself is an ADT of bc.REF_TAG)
            return self._check(f"tvn_ref_write(ctx, r{ins.fields[0]}, r{ins.fields[1]}, &r{ins.dst}, {f}, {pc})")
        if op == O.AllocADT:
            return (f"{{ tv_obj* a_[] = {self._args(ins.fields)}; tv_adt* v_ = tv_adt_new(INT64_C({ins.tag}), "
                    f"{len(ins.fields)}, a_);\n  if (v_ == NULL) " + self._fail(pc, "TV_ERR_EXEC", "out of memory")
                    + "\n  " + self._set(ins.dst, "&v_->h") + " }")
        if op == O.AllocClosure:
            return (f"{{ tv_obj* a_[] = {self._args(ins.free_vars)}; tv_closure* v_ = tv_closure_new({ins.func_index}, "
                    f"{len(ins.free_vars)}, a_);\n  if (v_ == NULL) " + self._fail(pc, "TV_ERR_EXEC", "out of memory")
                    + "\n  " + self._set(ins.dst, "&v_->h") + " }")
        if op == O.GetTag:
            return (f"if (r{ins.object} == NULL || r{ins.object}->kind != TV_KIND_ADT) "
                    + self._fail(pc, "TV_ERR_EXEC", "get_tag: expected an ADT or tuple value")
                    + "\n  " + (f"i{ins.dst} = ((const tv_adt*)r{ins.object})->tag;" if ins.dst in self.ints
                                 else self._box(pc, f"((const tv_adt*)r{ins.object})->tag", ins.dst)))
        if op == O.GetField:
            return self._check(f"tvn_get_field(ctx, r{ins.object}, INT64_C({ins.field_index}), &r{ins.dst}, {f}, {pc})")
        if op == O.Invoke:
            if pc in self.tails and ins.func_index == self.index:
                self._uses_start = True
                n = len(ins.args)
                new = " ".join(f"tv_obj* n{k}_ = r{a}; tv_incref(n{k}_);" for k, a in enumerate(ins.args))
                release = (f"for (int32_t k_ = 0; k_ < {len(self.objs)}; ++k_) {{ tv_decref(reg_[k_]); "
                           f"reg_[k_] = NULL; }}")
                assign = " ".join(f"r{k} = n{k}_;" for k in range(n))
                return "{ " + new + "\n  " + release + "\n  " + assign + "\n  goto tv_start; }"
            if pc in self.tails:  # (another function: its caller's frame calls it, tv_native.c's tvn_tail)
                return (f"{{ tv_obj* a_[] = {self._args(ins.args)};\n"
                        f"  rc = tvn_tail_invoke({ins.func_index}, a_, {len(ins.args)}); goto tv_exit; }}")
            return (f"{{ tv_obj* a_[] = {self._args(ins.args)}; tv_obj* v_ = NULL;\n"
                    f"  if (tvn_too_deep(ctx, &v_)) {{ rc = tvn_depth_error(ctx, {f}, {pc}); goto tv_exit; }}\n"
                    f"  rc = tvn_f{ins.func_index}(ctx, a_, &v_);\n"
                    f"  if (rc == TVN_TAIL) rc = tvn_trampoline(ctx, &v_);\n  ctx->depth -= 1;\n"
                    f"  if (rc != 0) goto tv_exit;\n  " + self._set(ins.dst, "v_") + " }")
        if op == O.InvokeClosure:
            if pc in self.tails:
                return (f"{{ tv_obj* a_[] = {self._args(ins.args)};\n"
                        f"  rc = tvn_tail_closure(ctx, r{ins.closure}, a_, {len(ins.args)}, {f}, {pc}); goto tv_exit; }}")
            return (f"{{ tv_obj* a_[] = {self._args(ins.args)}; tv_obj* v_ = NULL;\n  "
                    + self._check(f"tvn_call_closure(ctx, r{ins.closure}, a_, {len(ins.args)}, &v_, {f}, {pc})")
                    + "\n  " + self._set(ins.dst, "v_") + " }")
        raise UnsupportedError(f"native mode does not support {ins.name} ({_where(self.fn, pc, ins)})")


def _comment(text: str) -> str:
    return text.encode("ascii", "backslashreplace").decode().replace("*/", "* /").replace("\n", " ")
