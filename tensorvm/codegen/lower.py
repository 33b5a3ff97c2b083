"""Lowering a fused group of tensor expressions to one loop nest (a ``PrimFunc``).

Decisions, in order:

1. **Stages.** Every compute that produces a kernel output or a reduction is *materialized* (written
   to a buffer); every other compute is *inlined* into its readers (its expression is substituted at
   the read's indices). Two kinds of inlinable computes are materialized anyway: one with an
   expensive intrinsic (``exp``, ``tanh``...) read by two or more stages, so that softmax's ``exp`` runs
   once per element; and one that reads under a condition (padding) when a reduction reads it, so that
   a convolution's innermost loop has no branch. And a stage whose inlined expression would print
   bigger than ``MAX_INLINED_NODES`` materializes the computes it reads (repeatedly, down the chain),
   which bounds the C of any one expression (inlining multiplies repeated reads).
2. **Shared outer loops.** The longest prefix of dims that all stages share, and along which every
   stage reads the others at its own index, becomes one loop nest around all stages (layer-norm:
   ``for row: mean; variance; normalize``). Stages not written to an output keep only the part of
   their tensor below the prefix, in a stack or heap temporary (a scalar when nothing is left). A
   prefix that runs once (a batch of 1) is dropped.
3. **Reductions.** A reduction keeps scalar accumulators and an innermost ``omp simd`` reduction loop
   (float max/min keep a NaN flag so that they vectorize too). When its inputs are strided along the
   reduced axis (``A @ B``) or the reduced extent is short (a 3x3 window) the innermost *output* axis
   moves inside the reduction with a row of accumulators (vectorized along the row). When an input
   does not depend on the innermost output axis (``x`` in ``x @ w.T``), four outputs share each pass
   over the reduced axis (register blocking).
4. **Rows.** An elementwise stage's trailing axes run as one vector loop when every access lays them
   out as one contiguous run: read exactly by them (over dims equal to their extents) or broadcast over
   all of them (``_collapse_rows``): ``(N, C, H, W) * (N, C, 1, 1)`` loops over ``H*W`` per ``(n, c)``.
5. **Parallelism.** The shared prefix loops (except the innermost one when only straight-line stores
   are inside it) are fused into one parallel loop, forked only when the work is large enough;
   without a shared prefix, each stage fuses its own outer loops into a parallel loop.

Inputs must be placeholders whose dims are ints or ``te.var`` symbols; each symbol is bound from the
first input dim that carries it (or, for a symbol that only an output has, from that output's dim),
and every other occurrence, every output dim and every compute ``requires`` becomes an ``Assert`` on
entry.

**Variants.** ``lower(..., multiples={n: 16})`` makes a vector-friendly kernel: ``n`` is checked to be a
multiple of 16 and bound as ``(n / 16) * 16``, so the C compiler sees the trailing zero bits and drops
remainder loops, and register blocking applies to a dynamic inner axis. ``lower_dispatch`` puts several
lowerings of one computation (``lower_parts``) behind one signature: the generic entry checks, then a
``Dispatch`` on the dims (see ``tensorvm.codegen.strategy``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..errors import TypeInferenceError, UnsupportedError
from ..te.expr import (
    INDEX_DTYPE,
    Binary,
    Call,
    Cast,
    Const,
    IterVar,
    PrimExpr,
    Select,
    TensorRead,
    Var,
    as_expr,
    bitwise_or,
    cast,
    const,
    dtype_kind,
    eq,
    floordiv,
    floormod,
    logical_and,
    logical_or,
    maximum,
    minimum,
    ne,
    product,
    select,
    var,
)
from ..te.rewrite import substitute, transform
from ..te.tensor import ComputeOp, PlaceholderOp, Tensor, children, compute, reduction_identity, walk
from .hoist import optimize_loops
from .loop_ir import (
    PARALLEL,
    SERIAL,
    VECTORIZED,
    Allocate,
    Assert,
    Buffer,
    BufferLoad,
    CallExtern,
    Dispatch,
    DispatchCase,
    Evaluate,
    For,
    IfThenElse,
    LetStmt,
    PrimFunc,
    Seq,
    Store,
    seq,
)

__all__ = ["lower", "lower_parts", "lower_dispatch", "LoweredParts", "map_stmt", "rebind", "known_multiple",
           "parallel_work_threshold"]


def _rules():
    from .host import kernel_rules

    return kernel_rules()


def parallel_work_threshold() -> int:
    """Below this many inner iterations a parallel loop costs more to fork than it saves: the host's
    ``kernel_rules().parallel_elements`` (a fork-join's cycles x half a vector per cycle; 2^16 on AVX2,
    2^17 on AVX-512). On a busy machine a fork waits for a worker the OS has not scheduled yet, so the
    bar is set by a fork-join's full cost."""
    return _rules().parallel_elements


# An inlined expression larger than this (``_printed_size``) materializes the computes its stage reads.
MAX_INLINED_NODES = 4096
_CHEAP_CALLS = {"abs", "sign", "isnan", "isinf", "isfinite", "floor", "ceil", "round", "trunc"}


@dataclass(eq=False)
class _Stage:
    op: ComputeOp
    bodies: list  # expanded: reads only placeholders and other stages
    buffers: dict = field(default_factory=dict)  # value_index -> Buffer
    interchange: bool = False  # the innermost output axis runs inside the reduction
    jam: int = 1  # outputs of the innermost axis computed per pass of a reduction (register blocking)

    @property
    def shape(self) -> tuple:
        return tuple(a.extent for a in self.op.axes)

    @property
    def rank(self) -> int:
        return len(self.op.axes)


def lower(name: str, inputs: list[Tensor], outputs: list[Tensor], multiples: dict | None = None) -> PrimFunc:
    """Lower the computation of ``outputs`` from the placeholders ``inputs`` to one kernel.

    ``multiples`` (``{dim var: m}``) declares input dims known to be multiples of ``m`` (a vector-friendly
    variant): the kernel checks it on entry, and the code is generated knowing it (no remainder loops,
    register blocking over a dynamic inner dim).
    """
    return lower_parts(name, inputs, outputs, multiples).func()


@dataclass(eq=False)
class LoweredParts:
    """A lowered kernel before assembly: its signature, its entry (``lets`` binding the dim symbols from
    the dim parameters, ``checks`` on them) and the loop nest ``body``."""

    name: str
    params: tuple
    num_inputs: int
    dim_params: tuple
    dim_positions: tuple  # (parameter position, axis) of each dim parameter
    lets: list  # [(symbol, value)], in binding order
    checks: list  # [(condition, message)]
    body: object
    multiples: dict = field(default_factory=dict)  # {symbol: m}: the dims this kernel assumes multiples of m
    symbol_params: dict = field(default_factory=dict)  # {symbol: the dim parameter it is bound from}

    def func(self) -> PrimFunc:
        return PrimFunc(self.name, self.params, self.dim_params, self.entry(self.body), self.num_inputs)

    def entry(self, body):
        """``body`` behind this kernel's dim bindings and entry checks."""
        stmt = seq(*(Assert(c, m) for c, m in self.checks), body)
        for dim, value in reversed(self.lets):
            stmt = LetStmt(dim, value, stmt)
        return stmt


def lower_parts(name: str, inputs: list[Tensor], outputs: list[Tensor], multiples: dict | None = None) -> LoweredParts:
    """``lower`` without assembling the kernel (``lower_dispatch`` combines several of these)."""
    multiples = {v: m for v, m in (multiples or {}).items() if m > 1}
    _check_placeholders(inputs)
    outputs = _distinct_outputs(outputs)
    ops = _topo_ops(outputs, set(inputs))
    in_buffers = [Buffer(_c_name(t.name, f"in{i}"), t.dtype, t.shape) for i, t in enumerate(inputs)]
    out_buffers = [Buffer(f"out{i}", t.dtype, t.shape) for i, t in enumerate(outputs)]
    stages = _make_stages(ops, outputs)
    buffers = {t: (b, False) for t, b in zip(inputs, in_buffers)}
    k = _plan(stages, outputs, out_buffers, buffers, multiples)
    body = optimize_loops(_emit(stages, k, buffers))
    params = tuple(in_buffers + out_buffers)
    requires = [(_input_loads(c, dict(zip(inputs, in_buffers, strict=True))), m) for op in ops for c, m in op.requires]
    return _prologue(name, params, len(inputs), requires, body, multiples)


def _input_loads(expr, in_buffers: dict):
    """A requirement's reads of input elements (a run-time flag, e.g.) as loads of the input buffers."""

    def fn(node):
        if isinstance(node, TensorRead) and node.tensor in in_buffers:
            return in_buffers[node.tensor].load(node.indices)
        return None

    return transform(expr, fn)


def lower_dispatch(generic: LoweredParts, variants: list) -> PrimFunc:
    """One kernel with the signature and entry checks of ``generic`` that runs the first of ``variants``
    whose condition holds, else the generic body.

    ``variants`` are ``(name, condition, parts)``: ``condition`` is a bool te expression over the
    generic kernel's dim symbols, ``parts`` the same computation lowered with more knowledge (static
    dims, dims that are multiples of a vector width). The generic entry checks run first, so a variant
    needs none of its own; its assumptions (each dim it has as a constant, each multiple it relies on)
    are added to its condition, so it can never run on shapes it was not made for.
    """
    symbol_values = {dim: value for dim, value in generic.lets}
    generic_dims = dict(zip(generic.dim_positions, generic.dim_params))
    cases = []
    for name, condition, parts in variants:
        if len(parts.params) != len(generic.params):
            raise UnsupportedError(f"lower: variant {name} of {generic.name} has another signature")
        buffer_map = dict(zip(parts.params, generic.params))
        param_map = {p: generic_dims[pos] for p, pos in zip(parts.dim_params, parts.dim_positions)}
        assumptions = [condition]
        for position, buf in enumerate(parts.params):
            for axis, dim in enumerate(buf.shape):
                if isinstance(dim, Const) and (position, axis) in generic_dims:
                    assumptions.append(eq(generic_dims[(position, axis)], dim))
        for dim, m in parts.multiples.items():
            assumptions.append(eq(floormod(param_map[parts.symbol_params[dim]], m), 0))
        full = substitute(_all(assumptions), symbol_values)
        if isinstance(full, Const) and not full.value:
            continue
        cases.append(DispatchCase(name, full, rebind(parts, param_map, buffer_map)))
        if isinstance(full, Const):  # always true: later variants and the generic body never run
            break
    if not cases:
        return generic.func()
    if isinstance(cases[-1].condition, Const):  # the last case always runs: it is the default
        *cases, last = cases
        body = Dispatch(tuple(cases), last.body, last.name)  # (no cases: a plain body that keeps its name)
    else:
        body = Dispatch(tuple(cases), generic.body)
    return PrimFunc(generic.name, generic.params, generic.dim_params, generic.entry(body), generic.num_inputs)


def _all(conditions) -> PrimExpr:
    """The conjunction of ``conditions``, each distinct clause once."""
    clauses = []

    def add(c):
        if isinstance(c, Binary) and c.op == "and":
            add(c.a)
            add(c.b)
        elif c not in clauses:
            clauses.append(c)

    for c in conditions:
        add(as_expr(c))
    result = const(True)
    for c in clauses:
        result = logical_and(result, c)
    return result


def rebind(parts: LoweredParts, param_map: dict, buffer_map: dict):
    """A variant's body in the generic kernel: its dim symbols bound from the generic dim parameters,
    its buffer parameters replaced by the generic ones."""

    def expr(e):
        if e is None:
            return None

        def fn(node):
            if isinstance(node, Var):
                return param_map.get(node)
            if isinstance(node, BufferLoad) and node.buffer in buffer_map:
                return BufferLoad(buffer_map[node.buffer], node.index, node.dtype)
            return None

        return transform(e, fn)

    body = map_stmt(parts.body, expr, buffer_map)
    for dim, value in reversed(parts.lets):
        body = LetStmt(dim, expr(value), body)
    return body


def map_stmt(stmt, expr, buffer_map: dict):
    """``stmt`` with every expression passed through ``expr`` and buffers renamed by ``buffer_map``."""
    def buf(b):
        return buffer_map.get(b, b)

    def go(s):
        if isinstance(s, Seq):
            return Seq(tuple(go(x) for x in s.stmts))
        if isinstance(s, For):
            return For(s.loop_var, expr(s.extent), go(s.body), s.kind, expr(s.parallel_if),
                       tuple((op, buf(b)) for op, b in s.reductions))
        if isinstance(s, Store):
            return Store(buf(s.buffer), expr(s.index), expr(s.value))
        if isinstance(s, LetStmt):
            return LetStmt(s.var, expr(s.value), go(s.body))
        if isinstance(s, IfThenElse):
            return IfThenElse(expr(s.condition), go(s.then_case), None if s.else_case is None else go(s.else_case))
        if isinstance(s, Allocate):
            return Allocate(buf(s.buffer), go(s.body))
        if isinstance(s, Evaluate):
            return Evaluate(expr(s.value))
        if isinstance(s, Assert):
            return Assert(expr(s.condition), s.message)
        if isinstance(s, CallExtern):
            return CallExtern(s.name, tuple(buf(a) if isinstance(a, Buffer) else expr(a) for a in s.args), s.source)
        if isinstance(s, Dispatch):
            return Dispatch(tuple(DispatchCase(c.name, expr(c.condition), go(c.body)) for c in s.cases),
                            go(s.default), s.default_name)
        raise TypeError(f"not a loop-IR statement: {s!r}")

    return go(stmt)


# ---- graph ----------------------------------------------------------------------------------------


def _check_placeholders(inputs):
    for t in inputs:
        if not isinstance(t, Tensor) or not isinstance(t.op, PlaceholderOp):
            raise TypeInferenceError(f"lower: inputs must be te placeholders, got {t!r}")
        for d in t.shape:
            if not isinstance(d, (Const, Var)):
                raise UnsupportedError(f"lower: placeholder {t.name} has the dim {d!r}; input dims must be "
                                       f"ints or te.var symbols")


def _distinct_outputs(outputs: list[Tensor]) -> list[Tensor]:
    """Each kernel output must be written by its own compute: copy placeholders and repeated tensors."""
    result, seen = [], set()
    for t in outputs:
        if isinstance(t.op, PlaceholderOp) or t in seen:
            t = compute(t.shape, lambda *idx, src=t: src[idx], f"{t.name}_copy")
        seen.add(t)
        result.append(t)
    return result


def _reads(expr) -> list[TensorRead]:
    return [n for n in walk(expr) if isinstance(n, TensorRead)]


def _topo_ops(outputs, inputs: set) -> list[ComputeOp]:
    order, state = [], {}
    stack = [(t.op, False) for t in reversed(outputs)]
    while stack:
        op, done = stack.pop()
        if done:
            if state.get(op) != "done":
                state[op] = "done"
                order.append(op)
            continue
        if op in state:
            continue
        state[op] = "visiting"
        stack.append((op, True))
        for body in op.bodies:
            for read in _reads(body):
                producer = read.tensor
                if isinstance(producer.op, PlaceholderOp):
                    if producer not in inputs:
                        raise TypeInferenceError(f"lower: placeholder {producer.name} is read but is not an input")
                elif producer.op not in state:
                    stack.append((producer.op, False))
    return order


def _make_stages(ops: list[ComputeOp], outputs: list[Tensor]) -> list[_Stage]:
    stage_ops = {t.op for t in outputs} | {op for op in ops if op.is_reduction}
    for _ in range(len(ops) + 1):
        users: dict = {}
        expanded = {op: [_expand(b, stage_ops, op, users) for b in op.bodies] for op in ops if op in stage_ops}
        more = {op for op, readers in users.items()
                if (len(readers) > 1 and _expensive(op))
                or (_guarded(op) and any(r.is_reduction for r in readers))}
        for op, bodies in expanded.items():  # too big to print: materialize what it reads directly
            if any(_printed_size(b) > MAX_INLINED_NODES for b in bodies):
                more |= {r.tensor.op for b in op.bodies for r in _reads(b) if isinstance(r.tensor.op, ComputeOp)}
        if not more - stage_ops:
            break
        stage_ops |= more
    return [_Stage(op, expanded[op]) for op in ops if op in stage_ops]


def _printed_size(expr) -> int:
    """The nodes of ``expr`` as C prints it: a subexpression read n times is printed n times, so
    inlining a chain of computes that each read their input several times (a select over a value, the
    index arithmetic of stacked transposes and reshapes) grows exponentially: an SSD's group once
    became a single 67 MB expression. Counted bottom-up, saturating just above the bound."""
    sizes: dict = {}
    stack = [(expr, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        kids = children(node)
        if done:
            sizes[id(node)] = min(MAX_INLINED_NODES + 1, 1 + sum(sizes[id(k)] for k in kids))
            continue
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in sizes)
    return sizes[id(expr)]


def _guarded(op: ComputeOp) -> bool:
    """A compute that reads under a condition (padding): inlined into a reduction window it would
    put a branch in the innermost loop; materialized, the reduction reads a plain buffer."""
    for body in op.bodies:
        for node in walk(body):
            if isinstance(node, Select) and any(isinstance(n, TensorRead) for branch in
                                                (node.true_value, node.false_value) for n in walk(branch)):
                return True
    return False


def _expensive(op: ComputeOp) -> bool:
    return any(isinstance(n, Call) and n.name not in _CHEAP_CALLS for b in op.bodies for n in walk(b))


def _expand(expr, stage_ops: set, reader: ComputeOp, users: dict) -> PrimExpr:
    """Inline every read of a non-stage compute (recursively); record which stage inlined what."""
    memo: dict = {}

    def inline(node):
        if isinstance(node, TensorRead) and isinstance(node.tensor.op, ComputeOp) \
                and node.tensor.op not in stage_ops:
            op = node.tensor.op
            users.setdefault(op, set()).add(reader)
            body = substitute(op.bodies[node.tensor.value_index],
                              {a.var: i for a, i in zip(op.axes, node.indices)})
            return transform(body, inline, memo)
        return None

    return transform(expr, inline, memo)


# ---- planning: buffers, prefix, reduction order ---------------------------------------------------


def _plan(stages: list[_Stage], outputs, out_buffers, buffers: dict, multiples: dict) -> int:
    """Pick the shared prefix ``k`` and give every stage tensor its buffer (in ``buffers``)."""
    for st in stages:
        st.interchange = _wants_interchange(st)
        st.jam = 1 if st.interchange else _jam_factor(st, multiples)
    k = _shared_prefix(stages)
    output_of = {t: b for t, b in zip(outputs, out_buffers)}
    for st in stages:
        for i in range(len(st.op.bodies)):
            tensor = _tensor_of(st.op, i, outputs, stages)
            if tensor in output_of:
                st.buffers[i] = output_of[tensor]
                buffers[tensor] = (output_of[tensor], False)
            else:
                dtype = st.bodies[i].dtype
                buf = Buffer(_c_name(f"{st.op.name}_{i}" if len(st.op.bodies) > 1 else st.op.name, "tmp"),
                             dtype, st.shape[k:], "local")
                st.buffers[i] = buf
                buffers[tensor] = (buf, True)
    return k


def _tensor_of(op: ComputeOp, index: int, outputs, stages) -> Tensor:
    """The Tensor object for output ``index`` of ``op`` (found among reads or kernel outputs)."""
    for t in outputs:
        if t.op is op and t.value_index == index:
            return t
    for st in stages:
        for body in st.bodies:
            for read in _reads(body):
                if read.tensor.op is op and read.tensor.value_index == index:
                    return read.tensor
    return Tensor(op, index, tuple(a.extent for a in op.axes), op.bodies[index].dtype, op.name)  # never read


def _shared_prefix(stages: list[_Stage]) -> int:
    limit = min(st.rank - (1 if st.interchange or st.jam > 1 else 0) for st in stages)
    ref = stages[0].shape
    k = 0
    while k < limit and all(st.shape[k] == ref[k] for st in stages):
        k += 1
    for st in stages:
        own = [a.var for a in st.op.axes]
        for body in st.bodies:
            for read in _reads(body):
                if isinstance(read.tensor.op, ComputeOp):
                    match = 0
                    while match < k and read.indices[match] is own[match]:
                        match += 1
                    k = min(k, match)
    # A single stage needs no shared nest: its own loops fuse into one parallel loop (which, unlike a
    # prefix, includes a register-blocked axis, so a batch of 1 still runs on every thread).
    if len(stages) == 1:
        return 0
    # A shared loop nest that runs once (a batch of 1) gains nothing: let each stage parallelize itself.
    trip = const(1)
    for d in ref[:k]:
        trip = trip * d
    return 0 if isinstance(trip, Const) and trip.value <= 1 else k


def _coefficient(expr: PrimExpr, v: Var):
    """The constant coefficient of ``v`` in ``expr`` if ``expr`` is affine in ``v``; else None."""
    if expr is v:
        return 1
    if not any(n is v for n in walk(expr)):
        return 0
    if isinstance(expr, Binary) and expr.op in ("add", "sub"):
        a, b = _coefficient(expr.a, v), _coefficient(expr.b, v)
        if a is None or b is None:
            return None
        return a + b if expr.op == "add" else a - b
    if isinstance(expr, Binary) and expr.op == "mul":
        for x, y in ((expr.a, expr.b), (expr.b, expr.a)):
            if isinstance(y, Const):
                c = _coefficient(x, v)
                return None if c is None else c * y.value
        return None
    if isinstance(expr, Cast):
        return _coefficient(expr.value, v)
    return None


def _access(read: TensorRead, v: Var) -> str:
    """How a read moves along ``v``: "invariant", "contiguous", "strided:<c>" or "unknown"."""
    coefs = [_coefficient(i, v) for i in read.indices]
    if any(c is None for c in coefs):
        return "unknown"
    if not any(coefs):
        return "invariant"
    if all(c == 0 for c in coefs[:-1]):
        return "contiguous" if coefs[-1] == 1 else f"strided:{coefs[-1]}"
    return "strided:outer"


def known_multiple(expr: PrimExpr, multiples: dict) -> int:
    """The largest m known to divide ``expr`` (constants, dims declared multiples, sums and products)."""
    if isinstance(expr, Const):
        return abs(int(expr.value)) if dtype_kind(expr.dtype) in "iu" else 1
    if isinstance(expr, Var):
        return multiples.get(expr, 1)
    if isinstance(expr, Binary) and expr.op == "mul":
        return known_multiple(expr.a, multiples) * known_multiple(expr.b, multiples)
    if isinstance(expr, Binary) and expr.op in ("add", "sub"):
        return math.gcd(known_multiple(expr.a, multiples), known_multiple(expr.b, multiples))
    if isinstance(expr, Cast):
        return known_multiple(expr.value, multiples)
    return 1


def _jam_factor(st: _Stage, multiples: dict) -> int:
    """Compute ``jam`` outputs (``host.kernel_rules``: a quarter of the vector registers, 4 with 16) along
    the innermost axis per pass over the reduction when an input is shared by them (``x[i, k]`` in
    ``x @ w.T``): fewer loads per multiply-add, more accumulators. The largest of ``jam``, ``jam / 2``, ...
    down to 4 that divides the axis and leaves at least two passes."""
    if not st.op.is_reduction or st.rank == 0:
        return 1
    red = st.bodies[0]
    inner = st.op.axes[-1]
    if red.combiner not in ("sum", "prod") or red.condition is not None or not _simd_safe(red.sources[0]):
        return 1
    jam, multiple = _rules().jam, known_multiple(inner.extent, multiples)
    while jam >= 4 and (multiple % jam  # (0, an empty axis, is a multiple too)
                        or isinstance(inner.extent, Const) and inner.extent.value < 2 * jam):
        jam //= 2
    if jam < 4:
        return 1
    reads = _reads(red.sources[0])
    shared = any(_access(rd, inner.var) == "invariant" and _access(rd, red.axes[-1].var) == "contiguous"
                 for rd in reads)
    return jam if shared else 1


def _wants_interchange(st: _Stage) -> bool:
    if not st.op.is_reduction or st.rank == 0:
        return False
    red = st.bodies[0]
    if red.combiner not in ("sum", "prod", "max", "min"):
        return False
    inner, r = st.op.axes[-1], red.axes[-1]
    reads = [rd for s in red.sources for rd in _reads(s)]
    along_out = [_access(rd, inner.var) for rd in reads]
    if not all(a == "invariant" or a == "contiguous" or a.startswith("strided:") and a != "strided:outer"
               for a in along_out):
        return False
    if not any(a == "contiguous" or a in ("strided:2", "strided:-2") for a in along_out):
        return False  # (a stride-2 read -- a pooling window with stride 2 -- vectorizes as two loads)
    along_red = [_access(rd, r.var) for rd in reads]
    short = isinstance(r.extent, Const) and r.extent.value <= _rules().reduction_width  # (two vectors or less)
    return short or any(a not in ("invariant", "contiguous") for a in along_red)


# ---- emission -------------------------------------------------------------------------------------


def _emit(stages: list[_Stage], k: int, buffers: dict):
    ref = stages[0]
    prefix_axes = ref.op.axes[:k]
    prefix_vars = [var(a.var.name) for a in prefix_axes]
    nests = [_stage_nest(st, k, prefix_vars, buffers, parallel_outer=(k == 0)) for st in stages]
    temps = [b for st in stages for b in st.buffers.values() if b.scope == "local"]
    inner = seq(*nests)
    if k == 0:
        return _allocate(temps, inner)
    extents = [a.extent for a in prefix_axes]
    # With loops inside, all prefix loops fuse into the parallel loop; with straight-line stores inside,
    # the innermost prefix loop stays a loop of its own for the vectorizer.
    has_inner_loops = any(st.rank > k or st.op.is_reduction for st in stages)
    fused = k if has_inner_loops or k == 1 else k - 1
    body = _allocate(temps, inner)
    if fused < k:
        simd = all(_simd_safe(b) for st in stages for b in st.bodies)
        body = For(prefix_vars[k - 1], extents[k - 1], body, VECTORIZED if simd else SERIAL)
    work = _work(stages)
    return _parallel_nest(prefix_vars[:fused], extents[:fused], body, work)


def _allocate(temps, body):
    for buf in reversed(temps):
        body = Allocate(buf, body)
    return body


def _work(stages) -> PrimExpr:
    """A size estimate of the whole computation: the trip counts of every stage, added (a layer norm
    reads its row three times: at 128 rows of 256, 32768 outputs but 98304 elements of work)."""
    total = None
    for st in stages:
        extents = [a.extent for a in st.op.axes] + ([a.extent for a in st.bodies[0].axes] if st.op.is_reduction else [])
        size = const(1)
        for e in extents:
            size = size * e
        total = size if total is None else total + size
    return total


def _parallel_nest(loop_vars, extents, body, work):
    """``loop_vars`` as one parallel loop (fused; indices recovered by div/mod) when the work is large
    enough, else as plain serial loops."""
    if not loop_vars:
        return body
    kind, condition = _parallel_kind(work, extents)
    if kind != PARALLEL or len(loop_vars) == 1:
        for v, e in reversed(list(zip(loop_vars, extents))):
            body = For(v, e, body, kind if len(loop_vars) == 1 else SERIAL, condition)
        return body
    fused = var("_".join(v.name for v in loop_vars) + "_fused")
    stride = const(1)
    for position in range(len(loop_vars) - 1, -1, -1):
        index = fused // stride
        if position > 0:  # the outermost index needs no modulo
            index = index % extents[position]
        body = LetStmt(loop_vars[position], index, body)
        stride = stride * extents[position]
    return For(fused, stride, body, kind, condition)


def _parallel_kind(work, extents):
    threshold = parallel_work_threshold()
    if isinstance(work, Const):
        return (PARALLEL, None) if work.value >= threshold else (SERIAL, None)
    if all(isinstance(e, Const) and e.value <= 1 for e in extents):
        return SERIAL, None
    return PARALLEL, work >= threshold


def _simd_safe(expr) -> bool:
    """No loads under a lazy branch (a vector loop would read them for every lane)."""
    for node in walk(expr):
        lazy = ()
        if isinstance(node, Select):
            lazy = (node.true_value, node.false_value)
        elif isinstance(node, Binary) and node.op in ("and", "or"):
            lazy = (node.b,)
        if any(isinstance(n, (TensorRead, BufferLoad)) for branch in lazy for n in walk(branch)):
            return False
    return True


def _convert(expr, k: int, buffers: dict, axis_map: dict) -> PrimExpr:
    """Replace stage axis vars by loop vars and tensor reads by buffer loads."""

    def fn(node):
        if isinstance(node, Var):
            return axis_map.get(node)
        if isinstance(node, TensorRead):
            buf, local = buffers[node.tensor]
            return buf.load(node.indices[k:] if local else node.indices)
        return None

    return transform(expr, fn)


def _stage_nest(st: _Stage, k: int, prefix_vars, buffers, parallel_outer: bool):
    axes = st.op.axes
    axis_map = {a.var: p for a, p in zip(axes[:k], prefix_vars)}
    index_vars = list(prefix_vars) + [a.var for a in axes[k:]]

    def store_index(buf):
        return buf.flat_index(index_vars[k:] if buf.scope == "local" else index_vars)

    own = list(axes[k:])
    if not st.op.is_reduction:
        rows = _collapse_rows(st, k, own, buffers, axis_map, index_vars, parallel_outer)
        if rows is not None:
            own, values, store_index = rows
        else:
            values = [_convert(b, k, buffers, axis_map) for b in st.bodies]
        body = seq(*(Store(st.buffers[i], store_index(st.buffers[i]), v) for i, v in enumerate(values)))
        simd = all(_simd_safe(v) for v in values)
        return _loops(own, body, st, VECTORIZED if simd else SERIAL, parallel_outer, keep_inner=True)
    reduce = [_convert(b, k, buffers, axis_map) for b in st.bodies]
    if st.interchange:
        return _interchanged_reduction(st, reduce, own, store_index, parallel_outer)
    if st.jam > 1:
        return _jammed_reduction(st, reduce, own, store_index, parallel_outer)
    body = _scalar_reduction(st, reduce, store_index)
    return _loops(own, body, st, SERIAL, parallel_outer)


# A row of this many vectors is long enough: its loop overhead and scalar tail no longer matter.
ROW_VECTORS = 16
# Collapsing stops before the parallel loop has fewer iterations than this (the static part of its trip
# count): 4 chunks per thread (``tv_team_chunks``) on 16 threads.
MIN_PARALLEL_ROWS = 64


def _collapse_rows(st: _Stage, k: int, own: list, buffers: dict, axis_map: dict, index_vars: list,
                   parallel_outer: bool):
    """The trailing axes of an elementwise stage as one loop, when every access lays them out as one
    contiguous run: ``(own axes, values, store_index)`` with the collapsed axes replaced by one, or None.

    A broadcast multiply of ``(N, C, H, W)`` by ``(N, C, 1, 1)`` then runs a vector loop over ``H*W``
    floats per ``(n, c)``, not over ``W`` (7 or 14 floats: one vector and a scalar tail per row). The
    axes ``a_j..a_last`` collapse when each read (and the store) either indexes its last dims exactly by
    them, over dims equal to their extents (so they are one run in its row-major layout), and uses them
    nowhere else, or does not use them at all (broadcast over all of them); no other use of them (a
    condition, an index arithmetic) may remain. Collapsing goes outward while the row is shorter than
    ``ROW_VECTORS`` vectors (or dynamic) and, under a parallel loop, leaves it an axis and at least
    ``MIN_PARALLEL_ROWS`` iterations."""
    limit = len(own) - (1 if parallel_outer else 0)
    if limit < 2:
        return None
    work = _work([st])
    serial = isinstance(work, Const) and work.value < parallel_work_threshold()
    long_row = ROW_VECTORS * _rules().vector_width
    best = None
    for m in range(2, limit + 1):
        row = product(a.extent for a in own[len(own) - m + 1:])
        if isinstance(row, Const) and row.value >= long_row:
            break
        if parallel_outer and not serial:
            outer = product(a.extent for a in own[:len(own) - m] if isinstance(a.extent, Const))
            if outer.value < MIN_PARALLEL_ROWS:
                break
        attempt = _collapsed(st, k, own, m, buffers, axis_map, index_vars)
        if attempt is None:  # (a read that fails for m axes fails for more)
            break
        best = attempt
    return best


def _collapsed(st: _Stage, k: int, own: list, m: int, buffers: dict, axis_map: dict, index_vars: list):
    """``_collapse_rows`` for the last ``m`` axes, or None when an access does not allow it."""
    tail = own[-m:]
    tail_vars = [a.var for a in tail]
    extents = [a.extent for a in tail]
    flat = IterVar(var("_".join(v.name for v in tail_vars)), product(extents), "spatial")
    failed = []

    def uses_tail(e) -> bool:
        return any(n is v for n in walk(e) for v in tail_vars)

    def row_index(buf: Buffer, indices) -> PrimExpr | None:
        """``buf[indices]`` with the tail as one run at ``flat``; None when the layout differs."""
        uses = [uses_tail(i) for i in indices]
        if not any(uses):
            return buf.flat_index(tuple(indices))  # broadcast over the whole tail
        if len(indices) < m or any(uses[:-m]) or any(i is not v for i, v in zip(indices[-m:], tail_vars)) \
                or not all(d == e for d, e in zip(buf.shape[-m:], extents)):
            return None
        return buf.flat_index(tuple(indices[:-m]) + (const(0),) * m) + flat.var

    def fn(node):
        if isinstance(node, Var):
            return axis_map.get(node)
        if isinstance(node, TensorRead):
            buf, local = buffers[node.tensor]
            index = row_index(buf, node.indices[k:] if local else node.indices)
            if index is None:
                failed.append(node)
                return None
            return BufferLoad(buf, index, buf.dtype)
        return None

    memo: dict = {}
    values = [transform(b, fn, memo) for b in st.bodies]
    if failed or any(uses_tail(v) for v in values):
        return None

    def store_index(buf: Buffer):
        indices = index_vars[k:] if buf.scope == "local" else index_vars
        return row_index(buf, indices)

    if any(store_index(buf) is None for buf in st.buffers.values()):
        return None
    return own[:-m] + [flat], values, store_index


def _loops(axes, body, st, innermost_kind, parallel, keep_inner: bool = False):
    """Loops over ``axes`` around ``body``. With ``parallel``, the outer loops (all of them, or all but
    the innermost with ``keep_inner``) are fused into one parallel loop."""
    split = len(axes) - 1 if parallel and keep_inner and len(axes) > 1 else (len(axes) if parallel else 0)
    for depth, a in enumerate(reversed(axes[split:])):
        body = For(a.var, a.extent, body, innermost_kind if depth == 0 else SERIAL)
    outer = axes[:split]
    return _parallel_nest([a.var for a in outer], [a.extent for a in outer], body, _work([st]))


def _init_value(combiner: str, dtype: str):
    try:
        return reduction_identity(combiner, dtype)
    except TypeInferenceError as err:
        raise UnsupportedError(f"lower: unknown reduction {combiner}") from err


def _combine(combiner: str, acc: PrimExpr, value: PrimExpr) -> PrimExpr:
    value = cast(value, acc.dtype)
    if combiner == "sum":
        return acc + value
    if combiner == "prod":
        return acc * value
    if combiner == "max":
        return maximum(acc, value)
    return minimum(acc, value)


def _simd_reduction_op(combiner: str, dtype: str):
    """The OpenMP reduction identifier when lanes may be combined in any order, else None."""
    if combiner == "sum":
        return "+"
    if combiner == "prod":
        return "*"
    if combiner in ("max", "min") and dtype_kind(dtype) in "iu":
        return combiner
    return None


def _reduce_loops(red, body, innermost_kind=SERIAL, reductions=()):
    for depth, a in enumerate(reversed(red.axes)):
        if depth == 0:
            body = For(a.var, a.extent, body, innermost_kind, None, reductions)
        else:
            body = For(a.var, a.extent, body)
    return body


def _scalar_reduction(st: _Stage, reduce: list, store_index):
    red = reduce[0]
    if red.combiner.startswith("arg"):
        return _arg_reduction(st, reduce, store_index)
    acc = Buffer(f"{st.op.name}_acc", red.acc_dtype or red.dtype, (), "local")
    acc_value = acc.load(())
    out = st.buffers[0]
    simd_safe = red.condition is None and _simd_safe(red.sources[0])
    if simd_safe and red.combiner in ("max", "min") and dtype_kind(acc.dtype) == "f":
        return _float_extremum(st, red, acc, out, store_index)
    update = Store(acc, const(0), _combine(red.combiner, acc_value, red.sources[0]))
    if red.condition is not None:
        update = IfThenElse(red.condition, update)
    simd_op = _simd_reduction_op(red.combiner, acc.dtype) if simd_safe else None
    if _blocked_sum(red, acc.dtype):
        return _blocked_float_sum(red, acc, simd_op, st.buffers[0], store_index)
    loops = _reduce_loops(red, update, VECTORIZED if simd_op else SERIAL, ((simd_op, acc),) if simd_op else ())
    return Allocate(acc, seq(
        Store(acc, const(0), _init_value(red.combiner, acc.dtype)),
        loops,
        Store(out, store_index(out), cast(acc_value, out.dtype)),
    ))


# A float sum adds at most this many elements along its innermost axis in its own precision (each vector
# lane a share of them) before the block's total joins a float64 total: a float32 sum of n elements in
# lanes had drifted by up to n / lanes roundings (4e6 floats of 1e4: the mean off by 1e-3, the variance of
# values 1e4 +- 1 by 1e2); per block the drift stays below SUM_BLOCK / lanes roundings of the block's own
# total, and the float64 total adds the blocks exactly enough. One float64 add per block: nothing measurable.
SUM_BLOCK = 4096


def _blocked_sum(red, acc_dtype: str) -> bool:
    """Whether a sum reduction runs in blocks (``_blocked_float_sum``): float32 (or narrower) accumulation
    over an innermost axis that is not known to fit in one block."""
    extent = red.axes[-1].extent
    return (red.combiner == "sum" and acc_dtype in ("float32", "float16")
            and not (isinstance(extent, Const) and extent.value <= SUM_BLOCK))


def _blocked_float_sum(red, acc: Buffer, simd_op, out: Buffer, store_index):
    """``for block: acc = 0; for r in block: acc += x[r]; total += acc`` over the innermost reduced axis
    (outer reduced axes around it), ``total`` in float64 (SUM_BLOCK)."""
    total = Buffer(f"{acc.name}_total", "float64", (), "local")
    axis = red.axes[-1]
    block, within = var(f"{axis.var.name}_block", axis.var.dtype), var(f"{axis.var.name}_in", axis.var.dtype)
    first = block * SUM_BLOCK
    at = {axis.var: first + within}
    update = Store(acc, const(0), _combine("sum", acc.load(()), substitute(red.sources[0], at)))
    if red.condition is not None:
        update = IfThenElse(substitute(red.condition, at), update)
    inner = For(within, minimum(const(SUM_BLOCK), axis.extent - first), update,
                VECTORIZED if simd_op else SERIAL, None, ((simd_op, acc),) if simd_op else ())
    body = For(block, floordiv(axis.extent + (SUM_BLOCK - 1), SUM_BLOCK), seq(
        Store(acc, const(0), _init_value("sum", acc.dtype)),
        inner,
        Store(total, const(0), total.load(()) + cast(acc.load(()), "float64")),
    ))
    for a in reversed(red.axes[:-1]):
        body = For(a.var, a.extent, body)
    return Allocate(acc, Allocate(total, seq(
        Store(total, const(0), const(0.0, "float64")),
        body,
        Store(out, store_index(out), cast(total.load(()), out.dtype)),
    )))


def _float_extremum(st: _Stage, red, acc: Buffer, out: Buffer, store_index):
    """A float max/min as a vector reduction: lanes keep the extremum of the non-NaN values and a flag
    records any NaN, which then wins (NumPy's rule) without serializing the loop. The flag is an int32
    or-ed with each comparison: gcc vectorizes that, while a bool ``||`` kept the loop scalar (a 128-wide
    softmax row took 1.7x longer)."""
    seen_nan = Buffer(f"{st.op.name}_nan", "int32", (), "local")
    v = var("v", acc.dtype)
    acc_value, nan_value = acc.load(()), seen_nan.load(())
    better = (v > acc_value) if red.combiner == "max" else (v < acc_value)
    update = LetStmt(v, cast(red.sources[0], acc.dtype), seq(
        Store(acc, const(0), select(better, v, acc_value)),
        Store(seen_nan, const(0), bitwise_or(nan_value, cast(ne(v, v), "int32"))),
    ))
    loops = _reduce_loops(red, update, VECTORIZED, ((red.combiner, acc), ("|", seen_nan)))
    return Allocate(acc, Allocate(seen_nan, seq(
        Store(acc, const(0), _init_value(red.combiner, acc.dtype)),
        Store(seen_nan, const(0), const(0, "int32")),
        loops,
        Store(out, store_index(out), cast(select(ne(nan_value, const(0, "int32")), const(math.nan, acc.dtype),
                                                 acc_value), out.dtype)),
    )))


def _arg_reduction(st: _Stage, reduce: list, store_index):
    red = reduce[0]
    index_src, value_src = red.sources
    best_index = Buffer(f"{st.op.name}_idx", index_src.dtype, (), "local")
    best_value = Buffer(f"{st.op.name}_val", value_src.dtype, (), "local")
    vi, vv = var("idx", index_src.dtype), var("v", value_src.dtype)
    bi, bv = best_index.load(()), best_value.load(())
    better = (vv > bv) if red.combiner.startswith("argmax") else (vv < bv)
    if red.combiner.endswith("_last"):
        better = logical_or(better, eq(vv, bv))
        take = logical_or(logical_or(bi < 0, ne(vv, vv)), logical_and(eq(bv, bv), better))
    else:
        take = logical_or(bi < 0, logical_and(eq(bv, bv), logical_or(better, ne(vv, vv))))
    update = LetStmt(vv, value_src, LetStmt(vi, index_src, IfThenElse(take, seq(
        Store(best_value, const(0), vv), Store(best_index, const(0), vi)))))
    if red.condition is not None:
        update = IfThenElse(red.condition, update)
    stores = [Store(buf, store_index(buf), cast(bi if i == 0 else bv, buf.dtype)) for i, buf in st.buffers.items()]
    return Allocate(best_index, Allocate(best_value, seq(
        Store(best_index, const(0), const(-1, index_src.dtype)),
        Store(best_value, const(0), const(0, value_src.dtype)),
        _reduce_loops(red, update),
        *stores,
    )))


def _jammed_reduction(st: _Stage, reduce: list, own: list, store_index, parallel_outer: bool):
    """``jam`` accumulators for consecutive outputs j0..j0+jam-1, all updated in one vector pass."""
    red = reduce[0]
    inner = own[-1]
    outer = IterVar(var(f"{inner.var.name}_outer"), floordiv(inner.extent, st.jam), "spatial")
    acc_dtype = red.acc_dtype or red.dtype
    accs = [Buffer(f"{st.op.name}_acc{u}", acc_dtype, (), "local") for u in range(st.jam)]
    positions = [outer.var * st.jam + u for u in range(st.jam)]
    updates = [Store(acc, const(0), _combine(red.combiner, acc.load(()), substitute(red.sources[0], {inner.var: j})))
               for acc, j in zip(accs, positions)]
    simd_op = _simd_reduction_op(red.combiner, acc_dtype)
    out = st.buffers[0]
    stores = [Store(out, substitute(store_index(out), {inner.var: j}), cast(acc.load(()), out.dtype))
              for acc, j in zip(accs, positions)]
    body = seq(*(Store(acc, const(0), _init_value(red.combiner, acc_dtype)) for acc in accs),
               _reduce_loops(red, seq(*updates), VECTORIZED, tuple((simd_op, acc) for acc in accs)),
               *stores)
    for acc in reversed(accs):
        body = Allocate(acc, body)
    return _loops(own[:-1] + [outer], body, st, SERIAL, parallel_outer)


def _interchanged_reduction(st: _Stage, reduce: list, own: list, store_index, parallel_outer: bool):
    """Accumulate a whole output row at once: for r: for j: row[j] = combine(row[j], source)."""
    red = reduce[0]
    inner = own[-1]
    out = st.buffers[0]
    acc_dtype = red.acc_dtype or red.dtype
    direct = out.scope == "local" and len(out.shape) == 1 and acc_dtype == out.dtype
    row = out if direct else Buffer(f"{st.op.name}_row", acc_dtype, (inner.extent,), "local")
    j = inner.var
    acc_value = row.load((j,))
    update = Store(row, j, _combine(red.combiner, acc_value, red.sources[0]))
    if red.condition is not None:
        update = IfThenElse(red.condition, update)
    simd = red.condition is None and _simd_safe(red.sources[0])
    nest = seq(
        For(j, inner.extent, Store(row, j, _init_value(red.combiner, acc_dtype)), VECTORIZED),
        _reduce_loops(red, For(j, inner.extent, update, VECTORIZED if simd else SERIAL)),
    )
    if not direct:
        nest = Allocate(row, seq(nest, For(j, inner.extent, Store(out, store_index(out), cast(acc_value, out.dtype)),
                                           VECTORIZED)))
    return _loops(own[:-1], nest, st, SERIAL, parallel_outer)


# ---- signature and entry checks -------------------------------------------------------------------


def _prologue(name: str, params, num_inputs: int, requires: list, body, multiples: dict) -> LoweredParts:
    """Bind dimension symbols from the parameters' dims and check everything else on entry."""
    dim_params, positions, lets, checks, bound = [], [], [], [], {}
    for position, buf in enumerate(params):
        role = "input" if position < num_inputs else "output"
        for axis, dim in enumerate(buf.shape):
            if isinstance(dim, Const):
                continue
            param = Var(f"{buf.name}_shape{axis}", INDEX_DTYPE)
            dim_params.append(param)
            positions.append((position, axis))
            if isinstance(dim, Var) and dim not in bound:  # inputs first; an output dim only known from
                bound[dim] = param                            # data (dyn.reshape) is taken from the output
                m = multiples.get(dim, 1)
                # floordiv(p, m) * m: the C compiler sees the trailing zero bits and drops remainder loops
                lets.append((dim, floordiv(param, m) * m if m > 1 else param))
                if m > 1:
                    checks.append((eq(floormod(param, m), 0), f"{role} {buf.name} dim {axis} must be a multiple "
                                                              f"of {m} in this variant"))
            else:
                checks.append((eq(param, dim), f"{role} {buf.name} dim {axis} must be {dim!r}"))
    checks.extend(requires)
    parts = LoweredParts(name, params, num_inputs, tuple(dim_params), tuple(positions), lets, checks, body,
                         {d: m for d, m in multiples.items() if d in bound}, bound)
    stmt = parts.entry(body)
    unbound = _free_vars(stmt) - set(dim_params)
    if unbound:
        names = ", ".join(sorted(v.name for v in unbound))
        raise UnsupportedError(f"lower: the dims {names} cannot be inferred from the input shapes")
    return parts


def _free_vars(stmt) -> set:
    """Variables used in ``stmt`` but not defined by one of its loops or lets."""
    used, defined = set(), set()

    def expr(e):
        if e is not None:
            used.update(n for n in walk(e) if isinstance(n, Var))
            for n in walk(e):
                if isinstance(n, BufferLoad):
                    buffer(n.buffer)

    def buffer(b):
        for d in b.shape:
            expr(d)

    stack = [stmt]
    while stack:
        s = stack.pop()
        if isinstance(s, Seq):
            stack.extend(s.stmts)
        elif isinstance(s, For):
            defined.add(s.loop_var)
            expr(s.extent)
            expr(s.parallel_if)
            stack.append(s.body)
        elif isinstance(s, LetStmt):
            defined.add(s.var)
            expr(s.value)
            stack.append(s.body)
        elif isinstance(s, Store):
            buffer(s.buffer)
            expr(s.index)
            expr(s.value)
        elif isinstance(s, IfThenElse):
            expr(s.condition)
            stack.extend(x for x in (s.then_case, s.else_case) if x is not None)
        elif isinstance(s, Allocate):
            buffer(s.buffer)
            stack.append(s.body)
        elif isinstance(s, (Assert, Evaluate)):
            expr(s.condition if isinstance(s, Assert) else s.value)
        elif isinstance(s, Dispatch):
            for case in s.cases:
                expr(case.condition)
                stack.append(case.body)
            stack.append(s.default)
    return used - defined


def _c_name(name: str, fallback: str) -> str:
    clean = re.sub(r"\W", "_", name).strip("_")
    return clean if clean and not clean[0].isdigit() else fallback
