"""Bytecode emission: a lowered module (``tensorvm.transform.lower_for_vm``) to an ``Executable``.

Every non-primitive global becomes a ``VMFunction``; primitive globals become entries of the kernel
table (a kernel, plus a ``shape_func_<prim>`` entry for each ``vm.shape_func`` use). The emission
follows the Relay VM compiler:

* registers: parameters first (a ``Closure=1`` global ``fn (captured...) { fn (params...) {...} }`` is
  flattened to ``captured..., params...``), then a fresh register per value; a let-bound variable names
  its value's register (a variable-to-variable let is a ``Move``, so killing one name never empties
  another);
* ``if``: ``LoadConsti 1`` into a target register, ``If``, each branch ends with a ``Move`` into the
  merge register (the true branch then jumps over the false one);
* ``match``: per clause a ``GetTag``/``LoadConsti``/``If`` decision tree (with ``GetField`` for nested
  patterns) whose failure jumps to the next clause; after the last clause, ``Fatal``;
* ``@f(args)`` Invoke, ``%clo(args)`` InvokeClosure, ``@lifted(captured)`` of a Closure global and a
  global used as a value AllocClosure, ``Ctor(args)`` AllocADT, tuples AllocADT tag 0, ``%t.i``
  GetField (or, for a tuple built in this function, its field's register, until a ``memory.kill``
  empties that register: ManifestLifetimes kills a tuple's fields right after building it, while the
  tuple still holds them), constants LoadConst (the pool is deduplicated); a reference that leaves the
  function creating it (``LocalRefsToValues`` made the others values) an AllocADT of the reserved
  ``REF_TAG`` (a cell), read with GetField and written with an AllocADT of ``REF_WRITE_TAG``;
* the memory dialect: ``memory.alloc_storage`` AllocStorage, ``memory.alloc_tensor`` AllocTensor (a
  constant shape) or AllocTensorReg, ``vm.invoke_tvm_op`` and ``vm.shape_func`` InvokePacked (tuple
  arguments flattened here into their fields' registers, so kernels receive tensors), ``vm.shape_of``
  ShapeOf, ``vm.reshape_tensor`` ReshapeTensor, ``memory.kill`` KillRegister, ``device_copy`` a Move.
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedError
from ..ir.expr import (
    Call,
    Constant,
    Constructor,
    Function,
    GlobalVar,
    If,
    Let,
    Match,
    Op,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    PatternWildcard,
    RefCreate,
    RefRead,
    RefWrite,
    Tuple,
    TupleGetItem,
    Var,
    is_op_call,
)
from ..ir.types import FuncType, GlobalTypeVar, TupleType, TypeCall, TypeVar, component_types, nested_types
from . import bytecode as bc
from .executable import AdtInfo, Executable, PrimitiveInfo
from .serialize import type_to_text

__all__ = ["generate"]

_UNIT_OPS = ("vm.invoke_tvm_op", "vm.shape_func", "memory.kill")


def generate(mod, exec_mode: str = "bytecode", target: str = "python") -> Executable:
    """The executable for a lowered module."""
    return _ModuleCompiler(mod).compile(exec_mode, target)


def _flat_count(ty) -> int:
    if isinstance(ty, TupleType):
        return sum(_flat_count(f) for f in ty.fields)
    return 1


def _adt_field_types(tdef, ctors) -> tuple:
    """``(type variable names, field type texts per constructor)`` of an ADT, for checking arguments;
    ``((), None)`` when they cannot be written down (a field mentions a type variable not declared)."""
    type_vars = tuple(v.name for v in tdef.type_vars)
    fields = tuple(tuple(type_to_text(t) for t in c.inputs) for c in ctors)
    declared = set(tdef.type_vars)
    if len(set(type_vars)) != len(type_vars) or any(
            not _type_vars_in(t) <= declared for c in ctors for t in c.inputs):
        return (), None
    return type_vars, fields


def _type_vars_in(ty) -> set:
    if isinstance(ty, TypeVar):
        return {ty}
    found = set().union(*map(_type_vars_in, component_types(ty)))
    return found - set(ty.type_params) if isinstance(ty, FuncType) else found


def _type_names(types) -> set:
    """The names of the ADTs the types (and the types they are made of) refer to."""
    return {part.name if isinstance(part, GlobalTypeVar) else part.func.name
            for ty in types for part in nested_types(ty) if isinstance(part, GlobalTypeVar | TypeCall)}


def _type_of(expr):
    ty = getattr(expr, "_checked_type", None)
    if ty is None and isinstance(expr, Var):
        ty = expr.type_annotation
    return ty


class _ModuleCompiler:
    def __init__(self, mod):
        self.mod = mod
        self.prims: dict[str, Function] = {}
        self.vm_globals: list[GlobalVar] = []
        for gv, fn in mod.functions.items():
            if fn.is_primitive:
                self.prims[gv.name] = fn
            else:
                self.vm_globals.append(gv)
        if not any(gv.name == "main" for gv in self.vm_globals) and "main" in mod:
            raise UnsupportedError("@main is a primitive function; the VM needs a VM function named main")
        self.func_index = {gv.name: i for i, gv in enumerate(self.vm_globals)}
        self.closure_globals = {gv.name for gv in self.vm_globals if mod[gv].attrs.get("Closure", 0)}
        # ADTs with constructors in module order, and a type without (an extern type) that their fields or a
        # VM function's signature name (the loader reads those names); bytecode tags are adt_tag(type index,
        # constructor tag).
        self.adts: list[AdtInfo] = []
        self.ctor_tags: dict[tuple[str, str], int] = {}
        named = _type_names([t for tdef in mod.type_definitions.values() for c in tdef.constructors for t in c.inputs]
                            + [mod[gv].checked_type for gv in self.vm_globals
                               if getattr(mod[gv], "_checked_type", None) is not None])
        for tdef in mod.type_definitions.values():
            if not tdef.constructors and tdef.header.name not in named:
                continue
            type_index = len(self.adts)
            ctors = sorted(tdef.constructors, key=lambda c: c.tag)
            self.adts.append(AdtInfo(tdef.header.name, tuple((c.name, len(c.inputs)) for c in ctors),
                                     *_adt_field_types(tdef, ctors)))
            for c in ctors:
                self.ctor_tags[(tdef.header.name, c.name)] = bc.adt_tag(type_index, c.tag)
        self.constants: list[np.ndarray] = []
        self.const_index: dict[tuple, int] = {}
        self.kernels: list[PrimitiveInfo] = []
        self.kernel_index: dict[tuple, int] = {}

    # --- pools ------------------------------------------------------------------------------------
    def constant(self, data: np.ndarray) -> int:
        data = np.asarray(data)
        # small constants are pooled by value; large ones (weights) by identity: hashing their bytes
        # cost a third of a second on BERT-base (the pool keeps them alive, so ids stay unique)
        key = (data.dtype.str, data.shape, data.tobytes()) if data.nbytes <= 4096 else ("id", id(data))
        index = self.const_index.get(key)
        if index is None:
            index = self.const_index[key] = len(self.constants)
            self.constants.append(data)
        return index

    def kernel(self, prim_name: str, is_input: tuple | None = None) -> int:
        """The packed index of ``prim_name``'s kernel, or of its shape function for ``is_input``."""
        key = (prim_name, is_input)
        index = self.kernel_index.get(key)
        if index is not None:
            return index
        prim = self.prims.get(prim_name)
        if prim is None:
            raise UnsupportedError(f"@{prim_name} is called as a kernel but is not a primitive function")
        num_inputs = sum(_flat_count(_type_of(p)) for p in prim.params)
        num_outputs = _flat_count(prim.ret_type if prim.ret_type is not None else _type_of(prim.body))
        if is_input is None:
            info = PrimitiveInfo(prim_name, "kernel", prim_name, (), num_inputs, num_outputs)
        else:
            name = f"shape_func_{prim_name}"
            if any(k.name == name for k in self.kernels):  # the same primitive with other is_input flags
                name = f"{name}_{''.join(str(int(b)) for b in is_input)}"
            info = PrimitiveInfo(name, "shape_func", prim_name, is_input, num_inputs, num_outputs)
        index = self.kernel_index[key] = len(self.kernels)
        self.kernels.append(info)
        return index

    # --- the module -------------------------------------------------------------------------------
    def compile(self, exec_mode: str, target: str) -> Executable:
        functions = [_FunctionCompiler(self, gv.name, self.mod[gv]).compile() for gv in self.vm_globals]
        used = {k.source for k in self.kernels}
        exe = Executable(functions, self.constants, self.kernels, {}, self.adts, exec_mode, target,
                         {name: fn for name, fn in self.prims.items() if name in used})
        exe.verify(from_file=True)  # the compiler obeys the rules for files too
        return exe


class _FunctionCompiler:
    def __init__(self, module: _ModuleCompiler, name: str, fn: Function):
        self.module, self.name, self.fn = module, name, fn
        self.code: list = []
        self.num_regs = 0
        self.regs: dict[Var, int] = {}
        # register of a tuple built here -> its fields' registers, so that a projection or a kernel
        # argument reads the field's register instead of a GetField; dropped once a field is killed
        self.tuple_fields: dict[int, list] = {}
        self.tuples_holding: dict[int, set[int]] = {}  # field register -> tuples in tuple_fields using it
        self.unit_vars: set = set()
        self.named: set[int] = set()  # registers some variable names

    def new_reg(self) -> int:
        self.num_regs += 1
        return self.num_regs - 1

    def emit(self, ins) -> int:
        self.code.append(ins)
        return len(self.code) - 1

    # --- the function -----------------------------------------------------------------------------
    def compile(self) -> bc.VMFunction:
        fn = self.fn
        params = list(fn.params)
        body = fn.body
        ret_type = fn.ret_type
        if fn.attrs.get("Closure", 0):
            if not isinstance(body, Function):
                raise UnsupportedError(f"closure global @{self.name} must have the form fn (captured) {{ fn (...) }}")
            params += list(body.params)
            ret_type = body.ret_type
            body = body.body
        for p in params:
            self.bind_register(p, self.new_reg())
        result = self.expr(body)
        self.emit(bc.Ret(result))
        if ret_type is None:
            ret_type = _type_of(body)
        types = tuple(_type_of(p) for p in params)
        return bc.VMFunction(self.name, tuple(p.name_hint for p in params), tuple(self.code), max(self.num_regs, 1),
                             types, ret_type)

    # --- expressions ------------------------------------------------------------------------------
    def expr(self, e) -> int:
        """Emit code computing ``e``; return the register holding its value."""
        if isinstance(e, Let):
            while isinstance(e, Let):
                self.bind(e.var, e.value)
                e = e.body
            return self.expr(e)
        if isinstance(e, Var):
            return self.var(e)
        if isinstance(e, Constant):
            dst = self.new_reg()
            self.emit(bc.LoadConst(self.module.constant(e.data), dst))
            return dst
        if isinstance(e, GlobalVar):
            return self.global_value(e)
        if isinstance(e, Tuple):
            fields = [self.expr(f) for f in e.fields]
            dst = self.new_reg()
            self.emit(bc.AllocADT(0, tuple(fields), dst))
            self.remember_fields(dst, fields)
            return dst
        if isinstance(e, TupleGetItem):
            obj = self.expr(e.tuple_value)
            known = self.tuple_fields.get(obj)
            if known is not None and e.index < len(known):
                return known[e.index]
            dst = self.new_reg()
            self.emit(bc.GetField(obj, e.index, dst))
            return dst
        if isinstance(e, If):
            return self.if_(e)
        if isinstance(e, Match):
            return self.match(e)
        if isinstance(e, Call):
            return self.call(e)
        if isinstance(e, Constructor):  # a constructor without arguments used as a value
            if e.inputs:
                raise UnsupportedError(f"constructor {e.name} used as a value must be eta-expanded (EtaExpand)")
            return self.alloc_adt(e, [])
        if isinstance(e, Function):
            raise UnsupportedError(f"{self.name}: a function literal remains after lambda lifting")
        if isinstance(e, RefCreate):  # (never a known tuple: a cell's field changes)
            value = self.expr(e.value)
            dst = self.new_reg()
            self.emit(bc.AllocADT(bc.REF_TAG, (value,), dst))
            return dst
        if isinstance(e, RefRead):
            cell = self.expr(e.ref)
            dst = self.new_reg()
            self.emit(bc.GetField(cell, 0, dst))
            return dst
        if isinstance(e, RefWrite):
            cell, value = self.expr(e.ref), self.expr(e.value)
            dst = self.new_reg()
            self.emit(bc.AllocADT(bc.REF_WRITE_TAG, (cell, value), dst))
            return dst
        raise UnsupportedError(f"{self.name}: the VM cannot compile a {type(e).__name__}")

    def remember_fields(self, tuple_reg: int, fields: list) -> None:
        self.tuple_fields[tuple_reg] = fields
        for field in fields:
            self.tuples_holding.setdefault(field, set()).add(tuple_reg)

    def forget_fields_of(self, killed: int) -> None:
        """``killed`` is emptied: tuples holding it must be read with GetField from now on.

        Code is emitted in execution order with forward jumps only, so every read emitted after this
        point runs after the kill (a kill in one ``if`` branch only makes the other branch and the code
        after the merge use GetField, which is always correct)."""
        for tuple_reg in self.tuples_holding.pop(killed, ()):
            self.tuple_fields.pop(tuple_reg, None)

    def var(self, v: Var) -> int:
        try:
            reg = self.regs[v]
        except KeyError:
            raise UnsupportedError(f"{self.name}: variable %{v.name_hint} is used but not bound") from None
        if v in self.unit_vars:  # the () result of a kernel call, used after all
            self.unit_vars.discard(v)
            self.emit(bc.AllocADT(0, (), reg))
        return reg

    def bind(self, var: Var, value) -> None:
        if is_op_call(value, *_UNIT_OPS):
            self.call(value)
            self.regs[var] = self.new_reg()
            self.unit_vars.add(var)
            return
        self.bind_register(var, self.expr(value))

    def bind_register(self, var: Var, reg: int) -> None:
        """Name ``reg`` ``var``; a register another variable already names is copied first, so that
        ``memory.kill`` of one name never empties another (aliases come from ``let %a = %b``,
        projections of known tuples and variable patterns)."""
        if reg in self.named:
            dst = self.new_reg()
            self.emit(bc.Move(reg, dst))
            reg = dst
        self.regs[var] = reg
        self.named.add(reg)

    def global_value(self, gv: GlobalVar) -> int:
        if gv.name in self.module.prims:
            raise UnsupportedError(f"primitive @{gv.name} used as a value")
        index = self.func_index(gv)
        dst = self.new_reg()
        self.emit(bc.AllocClosure(index, (), dst))
        return dst

    def func_index(self, gv: GlobalVar) -> int:
        try:
            return self.module.func_index[gv.name]
        except KeyError:
            raise UnsupportedError(f"{self.name}: call of unknown global @{gv.name}") from None

    def alloc_adt(self, ctor: Constructor, fields: list) -> int:
        try:
            tag = self.module.ctor_tags[(ctor.belong_to.name, ctor.name)]
        except KeyError:
            raise UnsupportedError(f"constructor {ctor.name} of {ctor.belong_to.name} is not defined in the "
                                   f"module") from None
        dst = self.new_reg()
        self.emit(bc.AllocADT(tag, tuple(fields), dst))
        return dst

    # --- control flow -----------------------------------------------------------------------------
    def if_(self, e: If) -> int:
        cond = self.expr(e.cond)
        target = self.new_reg()
        self.emit(bc.LoadConsti(1, target))
        merge = self.new_reg()
        branch = self.emit(None)  # patched: If cond target 1 (false branch)
        self.emit(bc.Move(self.expr(e.true_branch), merge))
        goto = self.emit(None)
        false_start = len(self.code)
        self.emit(bc.Move(self.expr(e.false_branch), merge))
        self.code[branch] = bc.If(cond, target, 1, false_start - branch)
        self.code[goto] = bc.Goto(len(self.code) - goto)
        return merge

    def match(self, m: Match) -> int:
        data = self.expr(m.data)
        merge = self.new_reg()
        gotos = []
        for clause in m.clauses:
            fails: list[int] = []
            self.pattern(clause.lhs, data, fails)
            self.emit(bc.Move(self.expr(clause.rhs), merge))
            gotos.append(self.emit(None))
            next_clause = len(self.code)
            for pc in fails:
                ins = self.code[pc]
                self.code[pc] = bc.If(ins.test, ins.target, 1, next_clause - pc)
        self.emit(bc.Fatal())  # no clause applies
        end = len(self.code)
        for pc in gotos:
            self.code[pc] = bc.Goto(end - pc)
        # the Fatal is the last instruction of the match; code continues after it
        return merge

    def pattern(self, p, reg: int, fails: list) -> None:
        """Test ``p`` against the value in ``reg`` (failure jumps are appended to ``fails``) and bind its vars."""
        if isinstance(p, PatternWildcard):
            return
        if isinstance(p, PatternVar):
            self.bind_register(p.var, reg)
            return
        if isinstance(p, PatternConstructor):
            tag = self.module.ctor_tags.get((p.constructor.belong_to.name, p.constructor.name))
            if tag is None:
                raise UnsupportedError(f"constructor {p.constructor.name} is not defined in the module")
            got, want = self.new_reg(), self.new_reg()
            self.emit(bc.GetTag(reg, got))
            self.emit(bc.LoadConsti(tag, want))
            fails.append(self.emit(bc.If(got, want, 1, 1)))  # false offset patched by match()
            subs = p.patterns
        elif isinstance(p, PatternTuple):
            subs = p.patterns
        else:
            raise UnsupportedError(f"unknown pattern {type(p).__name__}")
        for i, sub in enumerate(subs):
            if isinstance(sub, PatternWildcard):
                continue
            field = self.new_reg()
            self.emit(bc.GetField(reg, i, field))
            self.pattern(sub, field, fails)

    # --- calls ------------------------------------------------------------------------------------
    def call(self, call: Call) -> int:
        op = call.op
        if isinstance(op, Op):
            return self.op_call(call)
        if isinstance(op, Constructor):
            return self.alloc_adt(op, [self.expr(a) for a in call.args])
        args = [self.expr(a) for a in call.args]
        dst = self.new_reg()
        if isinstance(op, GlobalVar):
            if op.name in self.module.prims:
                raise UnsupportedError(f"primitive @{op.name} called directly; it must go through "
                                       f"vm.invoke_tvm_op (run ManifestAlloc)")
            index = self.func_index(op)
            if op.name in self.module.closure_globals:
                self.emit(bc.AllocClosure(index, tuple(args), dst))
            else:
                self.emit(bc.Invoke(index, tuple(args), dst))
            return dst
        closure = self.expr(op)
        self.emit(bc.InvokeClosure(closure, tuple(args), dst))
        return dst

    def flat_args(self, group) -> list:
        """Registers of a kernel's argument group, tuples flattened into their fields."""
        items = group.fields if isinstance(group, Tuple) else (group,)
        regs: list[int] = []
        for item in items:
            self.flatten_into(self.expr(item), _type_of(item), regs)
        return regs

    def flatten_into(self, reg: int, ty, out: list) -> None:
        known = self.tuple_fields.get(reg)
        if isinstance(ty, TupleType) or known is not None:
            count = len(ty.fields) if isinstance(ty, TupleType) else len(known)
            for i in range(count):
                if known is not None:
                    field = known[i]
                else:
                    field = self.new_reg()
                    self.emit(bc.GetField(reg, i, field))
                self.flatten_into(field, ty.fields[i] if isinstance(ty, TupleType) else None, out)
        else:
            out.append(reg)

    def op_call(self, call: Call) -> int:
        name = call.op.name
        attrs = call.attrs
        args = call.args
        if name in ("vm.invoke_tvm_op", "vm.shape_func"):
            prim = args[0]
            if not isinstance(prim, GlobalVar):
                raise UnsupportedError(f"{name}: the callee must be a primitive global, got {type(prim).__name__}")
            ins, outs = self.flat_args(args[1]), self.flat_args(args[2])
            if name == "vm.invoke_tvm_op":
                index = self.module.kernel(prim.name)
            else:
                index = self.module.kernel(prim.name, tuple(bool(f) for f in attrs["is_input"]))
            self.emit(bc.InvokePacked(index, len(ins) + len(outs), len(outs), tuple(ins + outs)))
            return self.new_reg()
        if name == "memory.alloc_storage":
            size = self.expr(args[0])
            dst = self.new_reg()
            self.emit(bc.AllocStorage(size, int(attrs.get("alignment", 64)), str(attrs.get("dtype_hint", "float32")),
                                      dst, 0, bool(attrs.get("size_from_shape", False))))
            return dst
        if name == "memory.alloc_tensor":
            storage, offset = self.expr(args[0]), self.expr(args[1])
            dtype = str(attrs.get("dtype", "float32"))
            dst = self.new_reg()
            if isinstance(args[2], Constant):
                shape = tuple(int(d) for d in np.asarray(args[2].data).reshape(-1))
                self.emit(bc.AllocTensor(storage, offset, shape, dtype, dst))
            else:
                self.emit(bc.AllocTensorReg(storage, offset, self.expr(args[2]), dtype, dst))
            return dst
        if name == "vm.shape_of":
            tensor = self.expr(args[0])
            dst = self.new_reg()
            self.emit(bc.ShapeOf(tensor, dst))
            return dst
        if name == "vm.reshape_tensor":
            tensor, shape = self.expr(args[0]), self.expr(args[1])
            dst = self.new_reg()
            self.emit(bc.ReshapeTensor(tensor, shape, dst))
            return dst
        if name == "memory.kill":
            target = args[0]
            if isinstance(target, Var) and target in self.regs:
                self.emit(bc.KillRegister(self.regs[target]))
                self.forget_fields_of(self.regs[target])
            return self.new_reg()
        if name == "device_copy":
            src = self.expr(args[0])
            dst = self.new_reg()
            self.emit(bc.Move(src, dst))
            return dst
        raise UnsupportedError(f"{self.name}: operator {name} was not lowered to a kernel call "
                               f"(the VM runs only the memory dialect; use tensorvm.transform.lower_for_vm)")
