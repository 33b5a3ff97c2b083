"""The loop IR: what a fused group of tensor expressions becomes before it is printed as C.

Buffers are flat, row-major, contiguous arrays: a kernel's arguments (``scope="global"``) or
temporaries (``scope="local"``, introduced by ``Allocate``). Expressions are te expressions plus
``BufferLoad``; statements are:

* ``For(var, extent, body, kind)``: ``kind`` is serial, parallel (an OpenMP loop; ``parallel_if`` is the
  run-time condition worth forking for) or vectorized (an ``omp simd`` loop; ``reductions`` names the
  scalar accumulators it reduces into, e.g. ``(("+", acc),)``);
* ``Store(buffer, index, value)``, ``LetStmt(var, value, body)``, ``IfThenElse``, ``Evaluate``, ``Seq``;
* ``Allocate(buffer, body)``: a temporary live in ``body`` (a shape-``()`` buffer is a scalar variable);
* ``Assert(condition, message)``: a precondition checked on entry; the kernel returns an error code
  instead of running. Asserts appear only at the top of a function, before any allocation;
* ``CallExtern(name, args, source)``: a call of a C helper of the prelude (``tv_gemm_f32``...) or, with
  ``source``, of a library file (``tensorvm/codegen/lib/<source>``, included in the translation unit)
  that returns an ``int32_t`` error code; ``args`` are buffers (passed as pointers) and int64 expressions;
* ``Dispatch(cases, default)``: the variants of one kernel (see ``tensorvm.codegen.strategy``): runs
  the body of the first case whose condition (over the dimension parameters only) holds, else the
  default body. The C emitter puts the choice in a function of its own, ``<kernel>_dispatch(dims...)``.

A ``PrimFunc`` is one kernel: buffer parameters (inputs, then outputs), the int64 dimension parameters
and the body. ``restrict=False`` emits the buffer parameters without ``restrict`` (for a kernel that is
called with an input and an output sharing memory, e.g. an epilogue run in place).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..te.expr import INDEX_DTYPE, PrimExpr, Var, _node, as_expr, const

__all__ = [
    "SERIAL", "PARALLEL", "VECTORIZED", "Buffer", "BufferLoad", "Stmt", "For", "Store", "LetStmt", "IfThenElse",
    "Allocate", "Evaluate", "Seq", "Assert", "CallExtern", "Dispatch", "DispatchCase", "PrimFunc", "seq", "stmt_to_str",
    "find_dispatch", "walk_stmts",
]

SERIAL, PARALLEL, VECTORIZED = "serial", "parallel", "vectorized"


@dataclass(frozen=True, eq=False)
class Buffer:
    """A flat row-major array of ``dtype`` with a (possibly symbolic) ``shape``."""

    name: str
    dtype: str
    shape: tuple
    scope: str = "global"

    @property
    def size(self) -> PrimExpr:
        size = const(1)
        for d in self.shape:
            size = size * d
        return size

    def flat_index(self, indices) -> PrimExpr:
        if len(indices) != len(self.shape):
            raise ValueError(f"buffer {self.name} has rank {len(self.shape)}, indexed with {len(indices)}")
        flat = const(0)
        for index, dim in zip(indices, self.shape):
            flat = flat * dim + index
        return flat

    def load(self, indices) -> BufferLoad:
        return BufferLoad(self, self.flat_index(tuple(indices)), self.dtype)

    def __repr__(self):
        return f"Buffer({self.name}, {list(self.shape)}, {self.dtype}, {self.scope})"


@_node
class BufferLoad(PrimExpr):
    buffer: Buffer
    index: PrimExpr
    dtype: str

    def __repr__(self):
        return f"{self.buffer.name}[{self.index!r}]"

    def children(self) -> tuple:
        return (self.index,)

    def rebuild(self, kids) -> BufferLoad:
        return BufferLoad(self.buffer, kids[0], self.dtype)


class Stmt:
    __slots__ = ()

    def __str__(self):
        return stmt_to_str(self)


@dataclass(frozen=True, eq=False)
class For(Stmt):
    loop_var: Var
    extent: PrimExpr
    body: Stmt
    kind: str = SERIAL
    parallel_if: PrimExpr | None = None
    reductions: tuple = ()


@dataclass(frozen=True, eq=False)
class Store(Stmt):
    buffer: Buffer
    index: PrimExpr
    value: PrimExpr


@dataclass(frozen=True, eq=False)
class LetStmt(Stmt):
    var: Var
    value: PrimExpr
    body: Stmt


@dataclass(frozen=True, eq=False)
class IfThenElse(Stmt):
    condition: PrimExpr
    then_case: Stmt
    else_case: Stmt | None = None


@dataclass(frozen=True, eq=False)
class Allocate(Stmt):
    buffer: Buffer
    body: Stmt


@dataclass(frozen=True, eq=False)
class Evaluate(Stmt):
    value: PrimExpr


@dataclass(frozen=True, eq=False)
class Seq(Stmt):
    stmts: tuple


@dataclass(frozen=True, eq=False)
class Assert(Stmt):
    condition: PrimExpr
    message: str


@dataclass(frozen=True, eq=False)
class CallExtern(Stmt):
    name: str
    args: tuple  # Buffer | PrimExpr
    source: str = ""  # the library file defining the function ("": the prelude)


@dataclass(frozen=True, eq=False)
class DispatchCase:
    """A variant of a kernel: its ``name``, the ``condition`` under which it runs and its ``body``."""

    name: str
    condition: PrimExpr
    body: Stmt


@dataclass(frozen=True, eq=False)
class Dispatch(Stmt):
    """Run the first case whose condition holds (conditions read dimension parameters only), else
    ``default`` (named ``default_name``)."""

    cases: tuple
    default: Stmt
    default_name: str = "generic"

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.cases] + [self.default_name]


def seq(*stmts) -> Stmt:
    """A sequence, flattened; a single statement stays itself."""
    flat = []
    for s in stmts:
        if isinstance(s, Seq):
            flat.extend(s.stmts)
        elif s is not None:
            flat.append(s)
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


@dataclass(frozen=True, eq=False)
class PrimFunc:
    """A kernel: ``params`` (input buffers, then output buffers), ``dim_params`` (int64 scalars) and body."""

    name: str
    params: tuple
    dim_params: tuple
    body: Stmt
    num_inputs: int
    restrict: bool = True

    def __str__(self):
        params = ", ".join([f"{b.name}: {b.dtype}{list(b.shape)}" for b in self.params]
                           + [f"{v.name}: {v.dtype}" for v in self.dim_params])
        return f"primfn {self.name}({params}) {{\n{stmt_to_str(self.body, 1)}}}\n"


def stmt_to_str(stmt: Stmt, indent: int = 0) -> str:
    """A readable rendering of the loop IR (for debugging and ``as_text``)."""
    pad = "  " * indent
    if isinstance(stmt, Seq):
        return "".join(stmt_to_str(s, indent) for s in stmt.stmts)
    if isinstance(stmt, For):
        extra = f" if {stmt.parallel_if!r}" if stmt.parallel_if is not None else ""
        extra += "".join(f" reduce({op}:{buf.name})" for op, buf in stmt.reductions)
        return (f"{pad}for {stmt.loop_var.name} in [0, {stmt.extent!r}) {stmt.kind}{extra}:\n"
                + stmt_to_str(stmt.body, indent + 1))
    if isinstance(stmt, Store):
        return f"{pad}{stmt.buffer.name}[{stmt.index!r}] = {stmt.value!r}\n"
    if isinstance(stmt, LetStmt):
        return f"{pad}let {stmt.var.name} = {stmt.value!r}\n" + stmt_to_str(stmt.body, indent)
    if isinstance(stmt, IfThenElse):
        text = f"{pad}if {stmt.condition!r}:\n" + stmt_to_str(stmt.then_case, indent + 1)
        if stmt.else_case is not None:
            text += f"{pad}else:\n" + stmt_to_str(stmt.else_case, indent + 1)
        return text
    if isinstance(stmt, Allocate):
        b = stmt.buffer
        return f"{pad}allocate {b.name}: {b.dtype}{list(b.shape)}\n" + stmt_to_str(stmt.body, indent)
    if isinstance(stmt, Evaluate):
        return f"{pad}{stmt.value!r}\n"
    if isinstance(stmt, Assert):
        return f"{pad}assert {stmt.condition!r}, {stmt.message!r}\n"
    if isinstance(stmt, CallExtern):
        args = ", ".join(a.name if isinstance(a, Buffer) else repr(a) for a in stmt.args)
        return f"{pad}call {stmt.name}({args})\n"
    if isinstance(stmt, Dispatch):
        text = ""
        for case in stmt.cases:
            text += f"{pad}variant {case.name} if {case.condition!r}:\n" + stmt_to_str(case.body, indent + 1)
        return text + f"{pad}variant {stmt.default_name} otherwise:\n" + stmt_to_str(stmt.default, indent + 1)
    raise TypeError(f"not a loop-IR statement: {stmt!r}")


def walk_stmts(stmt: Stmt):
    """Every statement of ``stmt``, each before the statements inside it (a sequence's in order; a
    condition's else branch before its then branch, a dispatch's default before its cases): the bodies of
    loops, lets and allocations, both branches, every case."""
    stack = [stmt]
    while stack:
        s = stack.pop()
        yield s
        if isinstance(s, Seq):
            stack.extend(reversed(s.stmts))
        elif isinstance(s, (For, LetStmt, Allocate)):
            stack.append(s.body)
        elif isinstance(s, IfThenElse):
            stack.extend(branch for branch in (s.then_case, s.else_case) if branch is not None)
        elif isinstance(s, Dispatch):
            stack.extend(case.body for case in s.cases)
            stack.append(s.default)


def find_dispatch(stmt: Stmt) -> Dispatch | None:
    """The ``Dispatch`` of a kernel body (below its entry lets and checks), or None."""
    while True:
        if isinstance(stmt, Dispatch):
            return stmt
        if isinstance(stmt, LetStmt):
            stmt = stmt.body
        elif isinstance(stmt, Seq):
            found = [s for s in stmt.stmts if isinstance(s, (Dispatch, LetStmt, Seq))]
            if not found:
                return None
            stmt = found[0]
        else:
            return None


def index_const(value: int) -> PrimExpr:
    return as_expr(value, INDEX_DTYPE)
