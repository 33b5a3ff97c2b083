"""A small, strict evaluator of lowered VM modules, used as a test oracle for the lowering passes.

It gives the memory dialect its real meaning: a storage is a byte buffer filled with garbage (0xFF
bytes, NaN for floats) so that reading memory nobody wrote shows up; a tensor is a NumPy view at a
byte offset (bounds- and alignment-checked); kernels write into their outputs through
``tensorvm.vm.kernel_python``; ``memory.kill`` removes the variable, so a use after a kill fails.
A kernel whose output shares memory with one of its inputs is an error (but for an update op written
into its data, ``transform/update_in_place.py``). It also counts allocations.
"""

from __future__ import annotations

import numpy as np

from tensorvm.errors import ExecutionError
from tensorvm.ir.expr import (
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
)
from tensorvm.runtime.object import ADT, RefValue
from tensorvm.vm.kernel_python import build_kernel, build_shape_func


class LoweredError(AssertionError):
    """The lowered program broke a rule of the memory dialect."""


class Storage:
    def __init__(self, nbytes: int, alignment: int):
        self.buffer = np.full(int(nbytes), 0xFF, dtype=np.uint8)
        self.alignment = alignment


class Closure:
    def __init__(self, gv: GlobalVar, captured: tuple):
        self.gv, self.captured = gv, captured


class LoweredEvaluator:
    def __init__(self, mod):
        self.mod = mod
        self.kernels: dict = {}
        self.storage_count = 0
        self.storage_bytes = 0
        self.invokes = 0

    # --- entry ---
    def run(self, name: str, *args):
        fn = self.mod[name]
        return self.call_function(GlobalVar(name), fn, list(args))

    def call_function(self, gv: GlobalVar, fn: Function, args: list):
        if len(args) != len(fn.params):
            raise LoweredError(f"@{gv.name} takes {len(fn.params)} arguments, got {len(args)}")
        env = {p: _as_value(a) for p, a in zip(fn.params, args)}
        return self.eval_block(fn.body, env)

    # --- blocks ---
    def eval_block(self, expr, env: dict):
        while isinstance(expr, Let):
            env[expr.var] = self.eval_value(expr.value, env, expr.var)
            expr = expr.body
        return self.eval_value(expr, env, None)

    def atom(self, expr, env: dict):
        if isinstance(expr, Var):
            if expr not in env:
                raise LoweredError(f"%{expr.name_hint} is used but not defined (or already killed)")
            return env[expr]
        if isinstance(expr, Constant):
            return expr.data
        if isinstance(expr, GlobalVar):
            fn = self.mod[expr]
            if fn.attrs.get("Closure"):
                raise LoweredError(f"closure global @{expr.name} used as a value")
            return Closure(expr, ())
        if isinstance(expr, Constructor):
            if expr.inputs:
                raise LoweredError(f"constructor {expr.name} used as a value (EtaExpand should wrap it)")
            return ADT(expr.tag, (), constructor=expr.name)
        if isinstance(expr, Tuple):
            return tuple(self.atom(f, env) for f in expr.fields)
        raise LoweredError(f"expected an atom, got {type(expr).__name__}")

    def eval_value(self, value, env: dict, bound):
        if isinstance(value, (Var, Constant, GlobalVar, Constructor)):
            return self.atom(value, env)
        if isinstance(value, Tuple):
            return tuple(self.atom(f, env) for f in value.fields)
        if isinstance(value, TupleGetItem):
            return self.atom(value.tuple_value, env)[value.index]
        if isinstance(value, If):
            cond = self.atom(value.cond, env)
            return self.eval_block(value.true_branch if bool(np.asarray(cond)) else value.false_branch, env)
        if isinstance(value, Match):
            data = self.atom(value.data, env)
            for clause in value.clauses:
                bindings = {}
                if _match(clause.lhs, data, bindings):
                    env.update(bindings)
                    return self.eval_block(clause.rhs, env)
            raise ExecutionError("no match clause matched (the VM executes Fatal)")
        if isinstance(value, RefCreate):
            return RefValue(self.atom(value.value, env))
        if isinstance(value, RefRead):
            return self.atom(value.ref, env).value
        if isinstance(value, RefWrite):
            self.atom(value.ref, env).value = self.atom(value.value, env)
            return ()
        if isinstance(value, Function):
            raise LoweredError("a function literal remains after lambda lifting")
        if isinstance(value, Call):
            return self.eval_call(value, env)
        raise LoweredError(f"unexpected {type(value).__name__} in lowered code")

    def eval_call(self, call: Call, env: dict):
        op = call.op
        if isinstance(op, Op):
            return self.memory_op(op.name, call, env)
        args = [self.atom(a, env) for a in call.args]
        if isinstance(op, Constructor):
            return ADT(op.tag, tuple(args), constructor=op.name)
        if isinstance(op, GlobalVar):
            fn = self.mod[op]
            if fn.is_primitive:
                raise LoweredError(f"direct call of primitive @{op.name} (ManifestAlloc should have lowered it)")
            if fn.attrs.get("Closure"):
                return Closure(op, tuple(args))
            return self.call_function(op, fn, args)
        closure = self.atom(op, env)
        if not isinstance(closure, Closure):
            raise LoweredError(f"calling a non-closure {type(closure).__name__}")
        fn = self.mod[closure.gv]
        if fn.attrs.get("Closure"):
            inner = fn.body
            local = {p: v for p, v in zip(fn.params, closure.captured)}
            local.update({p: _as_value(a) for p, a in zip(inner.params, args)})
            return self.eval_block(inner.body, local)
        return self.call_function(closure.gv, fn, args)

    # --- the memory dialect ---
    def memory_op(self, name: str, call: Call, env: dict):
        args = call.args
        attrs = call.attrs
        if name == "memory.alloc_storage":
            size = self.atom(args[0], env)
            dtype = attrs.get("dtype_hint", "float32")
            if attrs.get("size_from_shape"):
                nbytes = int(np.prod(np.asarray(size), dtype=np.int64)) * np.dtype(dtype).itemsize
            else:
                nbytes = int(size)
            self.storage_count += 1
            self.storage_bytes += nbytes
            return Storage(nbytes, attrs.get("alignment", 64))
        if name == "memory.alloc_tensor":
            storage = self.atom(args[0], env)
            offset = int(self.atom(args[1], env))
            shape = tuple(int(d) for d in np.asarray(self.atom(args[2], env)).reshape(-1))
            dtype = np.dtype(attrs.get("dtype", "float32"))
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if not isinstance(storage, Storage):
                raise LoweredError("alloc_tensor of a non-storage")
            if offset % min(storage.alignment, 64) or offset < 0 or offset + nbytes > storage.buffer.size:
                raise LoweredError(f"tensor of {nbytes} bytes at offset {offset} does not fit a storage of "
                                   f"{storage.buffer.size} bytes (or is misaligned)")
            return storage.buffer[offset:offset + nbytes].view(dtype).reshape(shape)
        if name in ("vm.invoke_tvm_op", "vm.shape_func"):
            gv = args[0]
            prim = self.mod[gv]
            if not prim.is_primitive:
                raise LoweredError(f"{name} of non-primitive @{gv.name}")
            ins = _flatten([self.atom(a, env) for a in args[1].fields])
            outs = _flatten([self.atom(a, env) for a in args[2].fields])
            if name == "vm.invoke_tvm_op":
                key = ("kernel", gv.name)
                if key not in self.kernels:
                    self.kernels[key] = build_kernel(prim)
                checked = ins[1:] if _in_place_update(prim, args) else ins  # (data is its output)
                for o in outs:
                    for i in checked:
                        if isinstance(i, np.ndarray) and np.shares_memory(o, i):
                            raise LoweredError(f"@{gv.name}: an output shares memory with an input")
                self.invokes += 1
            else:
                key = ("shape", gv.name, tuple(attrs["is_input"]))
                if key not in self.kernels:
                    self.kernels[key] = build_shape_func(prim, tuple(attrs["is_input"]))
            self.kernels[key](*[np.asarray(i) for i in ins], *outs)
            return ()
        if name == "vm.shape_of":
            return np.array(np.shape(self.atom(args[0], env)), dtype="int64")
        if name == "vm.reshape_tensor":
            data = self.atom(args[0], env)
            shape = tuple(int(d) for d in np.asarray(self.atom(args[1], env)).reshape(-1))
            view = data.reshape(shape)
            if not np.shares_memory(view, data) and data.size:
                raise LoweredError("reshape_tensor copied")
            return view
        if name == "memory.kill":
            var = args[0]
            if var not in env:
                raise LoweredError(f"kill of %{var.name_hint}, which is not defined (or killed twice)")
            del env[var]
            return ()
        raise LoweredError(f"op {name} called in a VM function (FuseOps should have wrapped it)")


def _in_place_update(prim, args) -> bool:
    """``vm.invoke_tvm_op(@update, (%data, ...), (%data,))``: an update op's kernel writing into its data."""
    from tensorvm.transform.update_in_place import UPDATE_OPS

    body = prim.body
    return (isinstance(body, Call) and isinstance(body.op, Op) and body.op.name in UPDATE_OPS
            and len(args[2].fields) == 1 and args[1].fields and args[2].fields[0] is args[1].fields[0])


def _flatten(values: list) -> list:
    out = []
    for v in values:
        if isinstance(v, (tuple, ADT)):
            out.extend(_flatten(list(v)))
        else:
            out.append(v)
    return out


def _as_value(value):
    if hasattr(value, "numpy") and callable(value.numpy):
        return value.numpy()
    if isinstance(value, (bool, int, float)):
        return np.asarray(value)
    return value


def _match(pattern, value, bindings: dict) -> bool:
    if isinstance(pattern, PatternWildcard):
        return True
    if isinstance(pattern, PatternVar):
        bindings[pattern.var] = value
        return True
    if isinstance(pattern, PatternTuple):
        return all(_match(p, v, bindings) for p, v in zip(pattern.patterns, value))
    if isinstance(pattern, PatternConstructor):
        if value.tag != pattern.constructor.tag:
            return False
        return all(_match(p, v, bindings) for p, v in zip(pattern.patterns, value.fields))
    raise LoweredError(f"unknown pattern {pattern!r}")


# --- checking the shape of lowered code --------------------------------------------------------
_ATOMS = (Var, GlobalVar, Constant, Constructor)


def _is_atom(expr) -> bool:
    return isinstance(expr, _ATOMS)


def assert_anf(expr, allow_primitive_literals: bool = True, lowered: bool = False, mod=None) -> None:
    """Assert ``expr`` is a let chain of simple values ending in an atom or If/Match (recursively)."""
    while isinstance(expr, Let):
        _assert_simple(expr.value, allow_primitive_literals, lowered, mod)
        expr = expr.body
    if isinstance(expr, (If, Match)):
        _assert_simple(expr, allow_primitive_literals, lowered, mod)
    else:
        assert _is_atom(expr), f"a block ends in {type(expr).__name__}, not an atom"


def _assert_simple(value, allow_prim, lowered, mod) -> None:
    if _is_atom(value):
        return
    if isinstance(value, If):
        assert _is_atom(value.cond), "if condition is not an atom"
        assert_anf(value.true_branch, allow_prim, lowered, mod)
        assert_anf(value.false_branch, allow_prim, lowered, mod)
    elif isinstance(value, Match):
        assert _is_atom(value.data), "match scrutinee is not an atom"
        for clause in value.clauses:
            assert_anf(clause.rhs, allow_prim, lowered, mod)
    elif isinstance(value, Function):
        assert not lowered, "a function literal remains in lowered code"
        if value.is_primitive:
            return
        assert_anf(value.body, allow_prim, lowered, mod)
    elif isinstance(value, Call):
        callee = value.op
        if isinstance(callee, Function):
            assert allow_prim and callee.is_primitive and not lowered, "a non-primitive function literal is called"
        elif isinstance(callee, Op):
            if lowered:
                assert callee.name.startswith(("memory.", "vm.")), f"op {callee.name} called in a VM function"
        else:
            assert _is_atom(callee), "callee is not an atom"
            if lowered and isinstance(callee, GlobalVar) and mod is not None:
                assert not mod[callee].is_primitive, f"primitive @{callee.name} called directly"
        for arg in value.args:
            if isinstance(arg, Tuple) and isinstance(callee, Op) and callee.name in ("vm.invoke_tvm_op", "vm.shape_func"):
                assert all(_is_atom(f) for f in arg.fields), "non-atomic field in a kernel call's tuple"
            else:
                assert _is_atom(arg), f"non-atomic argument {type(arg).__name__} in a call"
    elif isinstance(value, Tuple):
        assert all(_is_atom(f) for f in value.fields), "non-atomic tuple field"
    elif isinstance(value, TupleGetItem):
        assert _is_atom(value.tuple_value), "projection of a non-atom"
    elif isinstance(value, (RefCreate, RefRead, RefWrite)):
        pass
    else:
        raise AssertionError(f"unexpected value {type(value).__name__}")


def check_lowered(mod) -> None:
    """Assert ``mod`` has the lowered form of the VM contract (see tensorvm/transform/vm_pipeline.py)."""
    for gv, fn in mod.functions.items():
        if fn.is_primitive:
            for node in _prim_nodes(fn.body):
                assert isinstance(node, (Call, Tuple, TupleGetItem, Var, Constant)), \
                    f"@{gv.name}: {type(node).__name__} in a primitive"
                if isinstance(node, Call):
                    assert isinstance(node.op, Op) and not node.op.name.startswith(("memory.", "vm.")), \
                        f"@{gv.name}: a primitive calls something other than an op"
            continue
        target = fn.body if fn.attrs.get("Closure") else fn
        assert isinstance(target, Function), f"@{gv.name}: a Closure global must wrap a function"
        assert_anf(target.body, allow_primitive_literals=False, lowered=True, mod=mod)


def _prim_nodes(expr) -> list:
    out, stack, seen = [], [expr], set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        out.append(node)
        if isinstance(node, Call):
            stack.extend(node.args)
        elif isinstance(node, Tuple):
            stack.extend(node.fields)
        elif isinstance(node, TupleGetItem):
            stack.append(node.tuple_value)
    return out


def memory_ops(expr) -> list:
    """The memory-dialect calls of a block in order (top-level bindings only), as (var, call) pairs."""
    out = []
    while isinstance(expr, Let):
        value = expr.value
        if isinstance(value, Call) and isinstance(value.op, Op):
            out.append((expr.var, value))
        expr = expr.body
    return out


# --- test conveniences ---------------------------------------------------------------------------
def parse(text: str):
    import tensorvm as tv

    return tv.parse('#[version = "0.0.5"]\n' + text)


def interpret(mod, *args, name: str = "main"):
    """Run ``mod`` on the reference interpreter (the oracle)."""
    from tensorvm.interpreter import Interpreter

    return Interpreter(mod).run(name, *args)


def assert_same(actual, expected, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Compare two executor results (arrays, tuples, ADTs) exactly in structure, closely in value."""
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected), (actual, expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, rtol, atol)
        return
    if isinstance(expected, ADT):
        assert isinstance(actual, ADT) and actual.tag == expected.tag, (actual, expected)
        assert_same(actual.fields, expected.fields, rtol, atol)
        return
    a = np.asarray(actual.numpy() if hasattr(actual, "numpy") else actual)
    e = np.asarray(expected.numpy() if hasattr(expected, "numpy") else expected)
    assert a.shape == e.shape and a.dtype == e.dtype, f"{a.shape}/{a.dtype} vs {e.shape}/{e.dtype}"
    if e.dtype.kind == "f":
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(a, e)
