"""MemoryPlan: liveness-based coalescing of static allocations within a function.

Requires: the output of ``ManifestAlloc`` (ANF; every static kernel output has its own
``memory.alloc_storage(<bytes>)`` used by one ``memory.alloc_tensor(%storage, 0i64, <shape>)``).

After it, in each block (a function body, an ``if`` branch, a ``match`` arm), the static tensors
allocated there that do not escape share one storage allocated at the block's start,
``memory.alloc_storage(<arena bytes>)``, each at its own byte offset (a multiple of the alignment):

* a tensor is *planned* only if every use of it is an input or output of ``vm.invoke_tvm_op`` /
  ``vm.shape_func``, an argument of ``vm.shape_of``/``memory.kill``/an allocation, an ``if``
  condition, or the source of a ``vm.reshape_tensor`` view (or a ``let`` alias) whose own uses obey
  the same rule. Anything that lets the tensor outlive the block or be seen by other code (the
  result, a tuple, an ADT, a call argument, a closure, a ``match``) keeps its own storage;
* a planned tensor is live from its allocation to the last binding of the block that uses it or
  one of its views (a use inside a nested ``if``/``match`` counts at that binding); two tensors
  whose live ranges overlap never overlap in memory, and a kernel's inputs and outputs are live at
  the same binding, so they never share bytes;
* offsets are assigned by a linear scan over allocation order with a best-fit free list, so the
  arena is never larger than the sum of the tensors' (aligned) sizes;
* a tuple of such tensors (``let %t = (%a, %b)``, e.g. a kernel's tuple result passed on to another
  kernel) and its projections are views of each field: a tuple only handed to kernels does not make
  its fields escape.

Static tensors that *do* escape the block are not reused, but those whose last use in the block is the
same binding (the outputs passed together to a tail call, the fields of a returned tuple) share one
storage, each at its own offset, allocated where the first of them was: one allocation instead of one
per tensor, with no tensor kept alive longer than the ones it escaped with.

Dynamic allocations are left alone (``ManifestLifetimes`` frees them early).
"""

from __future__ import annotations

from collections import defaultdict

from ..ir.attrs import Attrs
from ..ir.expr import (
    Call,
    Clause,
    Constant,
    Constructor,
    Expr,
    Function,
    GlobalVar,
    If,
    Match,
    Op,
    Tuple,
    TupleGetItem,
    Var,
    is_op_call,
)
from ..ir.module import IRModule
from ..op.memory import STORAGE_TYPE
from .manifest_alloc import DEFAULT_ALIGNMENT, int64_constant
from .pass_infra import Pass
from .to_anf import build_lets, copy_type, flatten_lets, post_order_iter, rebuild_function, typed_var

__all__ = ["MemoryPlan"]

_SAFE_ARG_OPS = frozenset({"vm.shape_of", "memory.kill", "memory.alloc_storage"})
_DPS_OPS = frozenset({"vm.invoke_tvm_op", "vm.shape_func"})


def vars_used(expr: Expr) -> set:
    """Every variable occurring in ``expr`` (nested blocks included)."""
    if isinstance(expr, Var):
        return {expr}
    callee_is_atom = not isinstance(expr, Call) or isinstance(expr.op, (Var, Op, GlobalVar, Constructor))
    if isinstance(expr, (Call, Tuple)) and callee_is_atom:
        # The common ANF value: atoms, or tuples of atoms (kernel groups). A callee that is itself an
        # expression (``%f(1f)(2f)``) takes the full walk below.
        items = expr.args if isinstance(expr, Call) else expr.fields
        found = set()
        for item in items:
            if isinstance(item, Var):
                found.add(item)
            elif isinstance(item, Tuple) and all(isinstance(f, (Var, Constant)) for f in item.fields):
                found.update(f for f in item.fields if isinstance(f, Var))
            elif not isinstance(item, (Constant, Op, GlobalVar)):
                return {n for n in post_order_iter(expr) if isinstance(n, Var)}
        if isinstance(expr, Call) and isinstance(expr.op, Var):
            found.add(expr.op)
        return found
    return {n for n in post_order_iter(expr) if isinstance(n, Var)}



class UseInfo:
    """How the variables of one function are used: which escape, which alias which."""

    def __init__(self, body: Expr):
        self.escapes: set[Var] = set()
        self.aliases: dict[Var, list[Var]] = defaultdict(list)  # var -> vars viewing the same memory
        self.storage_users: dict[Var, list[Var]] = defaultdict(list)  # storage -> tensors allocated in it
        self._blocks = [body]
        while self._blocks:
            self._walk_block(self._blocks.pop())

    def _walk_block(self, expr: Expr) -> None:
        bindings, tail = flatten_lets(expr)
        for var, value in bindings:
            self._value(value, var)
        if isinstance(tail, (If, Match)):
            self._value(tail, None)
        elif isinstance(tail, Var):
            self.escapes.add(tail)

    def _escape_all(self, expr: Expr) -> None:
        self.escapes.update(vars_used(expr))

    def _value(self, value: Expr, bound: Var | None) -> None:
        if isinstance(value, Var):
            if bound is not None:
                self.aliases[value].append(bound)
            else:
                self.escapes.add(value)
        elif isinstance(value, Tuple) and bound is not None and all(isinstance(f, (Var, Constant))
                                                                    for f in value.fields):
            for field_var in value.fields:  # the tuple's uses are uses of each field
                if isinstance(field_var, Var):
                    self.aliases[field_var].append(bound)
        elif isinstance(value, TupleGetItem) and bound is not None and isinstance(value.tuple_value, Var):
            self.aliases[value.tuple_value].append(bound)
        elif isinstance(value, If):
            self._blocks.extend((value.true_branch, value.false_branch))
        elif isinstance(value, Match):
            self._escape_all(value.data)
            self._blocks.extend(c.rhs for c in value.clauses)
        elif isinstance(value, Call) and isinstance(value.op, Op):
            name = value.op.name
            if name in _DPS_OPS:
                for group in value.args[1:]:
                    if not isinstance(group, Tuple):
                        self._escape_all(group)
            elif name == "memory.alloc_tensor":
                if isinstance(value.args[0], Var) and bound is not None:
                    self.storage_users[value.args[0]].append(bound)
            elif name == "vm.reshape_tensor":
                if isinstance(value.args[0], Var):
                    if bound is not None:
                        self.aliases[value.args[0]].append(bound)
                    else:
                        self.escapes.add(value.args[0])
            elif name not in _SAFE_ARG_OPS:
                self._escape_all(value)
        elif isinstance(value, Function):
            self._escape_all(value)
        else:
            self._escape_all(value)

    def contained(self, var: Var) -> bool:
        """Whether ``var`` and every view of it stay within the kernel-call protocol."""
        seen, stack = set(), [var]
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            if v in self.escapes:
                return False
            stack.extend(self.aliases.get(v, ()))
        return True

    def views(self, var: Var) -> list:
        """``var`` and every variable aliasing its memory, transitively."""
        seen, stack = [], [var]
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.append(v)
            stack.extend(self.aliases.get(v, ()))
        return seen


def _static_alloc_size(value: Expr) -> int | None:
    """The byte size of a static ``memory.alloc_storage`` call, else None."""
    if not is_op_call(value, "memory.alloc_storage"):
        return None
    if value.attrs.get("size_from_shape") or not isinstance(value.args[0], Constant):
        return None
    return int(value.args[0].data)


def _is_alloc_tensor(value: Expr) -> bool:
    return is_op_call(value, "memory.alloc_tensor")


def _round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def _storage_call(total: int, align: int, dtypes: set) -> Call:
    """``memory.alloc_storage(<total bytes>)`` for a storage shared by tensors of ``dtypes``."""
    return Call(Op("memory.alloc_storage"), (int64_constant(total),), Attrs(
        alignment=align, dtype_hint=dtypes.pop() if len(dtypes) == 1 else "uint8")).with_type(STORAGE_TYPE)


class _FreeList:
    """Best-fit allocation of byte ranges in a growing arena."""

    def __init__(self):
        self.free: list[list[int]] = []  # [offset, size], sorted by offset
        self.top = 0

    def alloc(self, size: int) -> int:
        best = None
        for block in self.free:
            if block[1] >= size and (best is None or block[1] < best[1]):
                best = block
        if best is not None:
            offset = best[0]
            best[0] += size
            best[1] -= size
            if best[1] == 0:
                self.free.remove(best)
            return offset
        if self.free and self.free[-1][0] + self.free[-1][1] == self.top:
            last = self.free.pop()  # grow the trailing hole instead of leaving it
            offset = last[0]
            self.top = offset + size
            return offset
        offset = self.top
        self.top += size
        return offset

    def release(self, offset: int, size: int) -> None:
        if size == 0:
            return
        index = 0
        while index < len(self.free) and self.free[index][0] < offset:
            index += 1
        self.free.insert(index, [offset, size])
        # Coalesce with the neighbours.
        if index + 1 < len(self.free) and offset + size == self.free[index + 1][0]:
            self.free[index][1] += self.free.pop(index + 1)[1]
        if index > 0 and self.free[index - 1][0] + self.free[index - 1][1] == offset:
            self.free[index - 1][1] += self.free.pop(index)[1]


def plan_offsets(intervals: list) -> tuple[list[int], int]:
    """Offsets for ``(start, end, size)`` intervals (inclusive live ranges) and the arena size."""
    order = sorted(range(len(intervals)), key=lambda i: (intervals[i][0], i))
    by_end = sorted(range(len(intervals)), key=lambda i: intervals[i][1])
    free = _FreeList()
    offsets = [0] * len(intervals)
    released = 0
    for i in order:
        start = intervals[i][0]
        while released < len(by_end) and intervals[by_end[released]][1] < start:
            j = by_end[released]  # ended before ``i`` starts, so already placed
            free.release(offsets[j], intervals[j][2])
            released += 1
        offsets[i] = free.alloc(intervals[i][2])
    return offsets, free.top


class _Planner:
    def __init__(self, uses: UseInfo):
        self.uses = uses

    def plan_block(self, expr: Expr) -> Expr:
        bindings, tail = flatten_lets(expr)
        bindings = [(var, self.plan_value(value)) for var, value in bindings]
        if isinstance(tail, (If, Match)):
            tail = self.plan_value(tail)
        index_of = {var: k for k, (var, _) in enumerate(bindings)}
        # Candidates: static storages holding exactly one tensor at offset 0, both bound in this block;
        # contained ones share a reusing arena, escaping ones are grouped by their last use.
        contained, escaping = [], []
        for var, value in bindings:
            size = _static_alloc_size(value)
            if size is None or var in self.uses.escapes:
                continue
            users = self.uses.storage_users.get(var, [])
            if len(users) != 1 or users[0] not in index_of:
                continue
            tensor = users[0]
            tensor_value = bindings[index_of[tensor]][1]
            if not (_is_alloc_tensor(tensor_value) and isinstance(tensor_value.args[1], Constant)
                    and int(tensor_value.args[1].data) == 0):
                continue
            entry = (var, tensor, size, int(value.attrs.get("alignment", DEFAULT_ALIGNMENT)),
                     value.attrs.get("dtype_hint", "float32"))
            (contained if self.uses.contained(tensor) else escaping).append(entry)
        if len(contained) < 2 and len(escaping) < 2:
            return build_lets(bindings, tail)
        last_use = self._last_uses(bindings, tail)
        placements: dict = {}  # storage var removed -> (new storage var, offset) for its tensor
        new_storages: dict = defaultdict(list)  # index of the binding new storages go before -> [(var, value)]
        if len(contained) >= 2:
            intervals = []
            align = max(c[3] for c in contained)
            for _storage, tensor, size, _align, _dtype in contained:
                start = index_of[tensor]
                end = max([start] + [last_use.get(v, start) for v in self.uses.views(tensor)])
                intervals.append((start, end, _round_up(max(size, 1), align)))
            offsets, total = plan_offsets(intervals)
            arena = typed_var("arena", STORAGE_TYPE)
            new_storages[0].append((arena, _storage_call(total, align, {c[4] for c in contained})))
            placements.update({c[0]: (arena, off) for c, off in zip(contained, offsets)})
        groups: dict = defaultdict(list)
        for entry in escaping:
            tensor = entry[1]
            groups[max(last_use.get(v, index_of[tensor]) for v in self.uses.views(tensor))].append(entry)
        for group in groups.values():
            if len(group) < 2:
                continue
            align = max(c[3] for c in group)
            offsets, total = [], 0
            for _storage, _tensor, size, _align, _dtype in group:  # side by side: they all outlive the block
                offsets.append(total)
                total += _round_up(max(size, 1), align)
            storage = typed_var("escaping", STORAGE_TYPE)
            new_storages[min(index_of[c[0]] for c in group)].append(
                (storage, _storage_call(total, align, {c[4] for c in group})))
            placements.update({c[0]: (storage, off) for c, off in zip(group, offsets)})
        if not placements:
            return build_lets(bindings, tail)
        storage_of = {}  # tensor var -> (new storage, offset)
        for var, _value in bindings:
            if var in placements:
                storage_of[self.uses.storage_users[var][0]] = placements[var]
        new_bindings = []
        for k, (var, value) in enumerate(bindings):
            new_bindings.extend(new_storages.get(k, ()))
            if var in placements:
                continue
            if var in storage_of:
                storage, offset = storage_of[var]
                value = copy_type(Call(value.op, (storage, int64_constant(offset), value.args[2]), value.attrs,
                                       span=value.span), value)
            new_bindings.append((var, value))
        return build_lets(new_bindings, tail)

    @staticmethod
    def _last_uses(bindings, tail) -> dict:
        last: dict[Var, int] = {}
        for k, (_var, value) in enumerate(bindings):
            for v in vars_used(value):
                last[v] = k
        for v in vars_used(tail):
            last[v] = len(bindings)
        return last

    def plan_value(self, value: Expr) -> Expr:
        if isinstance(value, If):
            return copy_type(If(value.cond, self.plan_block(value.true_branch), self.plan_block(value.false_branch),
                                span=value.span), value)
        if isinstance(value, Match):
            clauses = tuple(Clause(c.lhs, self.plan_block(c.rhs)) for c in value.clauses)
            return copy_type(Match(value.data, clauses, value.complete, span=value.span), value)
        return value


def plan_function(fn: Function) -> Function:
    if fn.is_primitive:
        return fn
    if fn.attrs.get("Closure") and isinstance(fn.body, Function):
        return rebuild_function(fn, plan_function(fn.body))
    return rebuild_function(fn, _Planner(UseInfo(fn.body)).plan_block(fn.body))


class MemoryPlan(Pass):
    name = "MemoryPlan"

    def transform_module(self, mod: IRModule) -> IRModule:
        return mod.with_functions({gv: plan_function(fn) for gv, fn in mod.functions.items()})

