"""Random well-typed tensorvm programs, as Relay text, for the differential fuzzer (``program_fuzz.py``).

``programs()`` is a Hypothesis strategy of ``Case``s: a module's text plus what the runner needs to make
inputs for it (each parameter's shape in terms of the program's dim variables). Programs are built
bottom up in a small environment of typed values, so each one is well typed by construction; the runner
still checks it with ``InferType`` (a rejection is a generator bug, or a tensorvm bug when the program is
valid Relay).

The generator tracks every tensor's *run-time* shape as polynomials over dim variables (``Dim``): a
parameter's ``?`` or named (``n``) dim is a variable whose value the runner draws per call, and
concatenate adds dims, reshape multiplies them, a convolution shifts them. Broadcasting, dense, concatenate
and ``if`` branches then only combine values whose shapes agree for every value of the variables. A
value-dependent dim (``argwhere``) is a fresh *opaque* variable: it equals only itself and no parameter
is ever shaped by it. Dim variables take values of at least 2, so a broadcast never depends on one
being 1 at run time.

Constructs: elementwise unary/binary ops with broadcasting, ``shape_of`` feeding arithmetic, loop
bounds and ``arange``, reshapes and views (reshape, transpose, expand_dims, squeeze, strided_slice),
concatenate and split, reductions, dense, batch_matmul, conv2d, ``if`` on tensor and shape conditions,
loops as tail recursion (with a fixed or a growing accumulator), non-tail recursion, tuples, closures
(called directly and through ``@map``), ADTs (``List`` through ``@map``/``@foldl``/``match``, ``Option``,
``Tree``) and value-dependent shapes (``argwhere``).

Exactness: inputs are small integers, and every op but ``tanh``, ``sigmoid``, ``mean`` and a division by a
value keeps float32 values exact dyadic numbers (a division by a power of two included), whose sums do
not depend on the order of summation. Only exact values decide control flow or an integer result (an
``if`` condition, ``argmax``, ``argwhere``): an inexact one (a sum whose exact value is 1.00000003 compared
with 1) may legitimately take another branch on an executor that rounds differently. The generator
tracks which names hold inexact values (``Generator.inexact``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hypothesis import strategies as st

HEADER = '#[version = "0.0.5"]\n'


# --- dims: polynomials over dim variables ------------------------------------------------------------------
@dataclass(frozen=True)
class Dim:
    """A polynomial with integer coefficients: ``terms`` maps a monomial (sorted variable ids) to its
    coefficient; ``()`` is the constant term."""

    terms: tuple = ()

    @staticmethod
    def const(c: int) -> Dim:
        return Dim((((), c),)) if c else Dim()

    @staticmethod
    def var(i: int) -> Dim:
        return Dim((((i,), 1),))

    def _dict(self) -> dict:
        return dict(self.terms)

    @staticmethod
    def _make(d: dict) -> Dim:
        return Dim(tuple(sorted((m, c) for m, c in d.items() if c)))

    def __add__(self, other: Dim) -> Dim:
        d = self._dict()
        for m, c in other.terms:
            d[m] = d.get(m, 0) + c
        return Dim._make(d)

    def __mul__(self, other: Dim) -> Dim:
        d: dict = {}
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                m = tuple(sorted(m1 + m2))
                d[m] = d.get(m, 0) + c1 * c2
        return Dim._make(d)

    def vars(self) -> set:
        return {v for m, _ in self.terms for v in m}

    @property
    def is_const(self) -> bool:
        return all(m == () for m, _ in self.terms)

    @property
    def value(self) -> int:
        assert self.is_const
        return dict(self.terms).get((), 0)

    def divisible(self, k: int) -> bool:
        return all(c % k == 0 for _, c in self.terms)

    def div(self, k: int) -> Dim:
        return Dim(tuple((m, c // k) for m, c in self.terms))

    def evaluate(self, env: dict) -> int:
        total = 0
        for m, c in self.terms:
            p = c
            for v in m:
                p *= env[v]
            total += p
        return total


ONE = Dim.const(1)


@dataclass(frozen=True)
class Param:
    """A parameter of ``@main``: name and shape (``Dim``s over the input variables), float32."""

    name: str
    shape: tuple
    annotation: str


@dataclass(frozen=True)
class Case:
    """A generated program: ``text`` (with the version header) and ``@main``'s parameters."""

    text: str
    params: tuple
    variables: tuple  # ids of the input dim variables (each drawn from 2..5 per shape set)
    seed: int

    def __str__(self) -> str:
        return self.text


# --- values in the environment -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Tensor:
    expr: str
    shape: tuple  # of Dim
    dtype: str = "float32"

    @property
    def rank(self) -> int:
        return len(self.shape)


def broadcasts_into(small: tuple, big: tuple) -> bool:
    """Whether a tensor shaped ``small`` broadcasts against ``big`` giving ``big``'s shape."""
    if len(small) > len(big):
        return False
    return all(s == b or s == ONE for s, b in zip(reversed(small), reversed(big)))


class _Scope:
    """Variables visible in a block: a parent's and the block's own."""

    def __init__(self, parent: _Scope | None = None):
        self.parent = parent
        self.own: list[Tensor] = []

    def tensors(self) -> list[Tensor]:
        return (self.parent.tensors() if self.parent else []) + self.own


@dataclass
class _Program:
    params: list = field(default_factory=list)
    globals: list = field(default_factory=list)
    variables: list = field(default_factory=list)  # input dim variables
    next_var: int = 0
    next_name: int = 0


UNARY = ("negative", "abs", "nn.relu", "tanh", "sigmoid")
BINARY = ("add", "subtract", "multiply", "maximum", "minimum")
REDUCE = ("sum", "max", "min", "mean")
# ops whose float32 result is rounded, so it depends on how an executor computes it (``add(abs(`` is the
# denominator of a division by a value, see ``s_binary``)
INEXACT_OPS = re.compile(r"\b(?:tanh|sigmoid|mean)\(|\badd\(abs\(")
NAME = re.compile(r"[%@][A-Za-z_]\w*")
MAX_ELEMENTS = 400  # a bound on a generated tensor's size for the largest draw of every variable


class Generator:
    """Builds one program from Hypothesis draws. ``block`` methods append bindings to ``lines`` and
    return the new value."""

    def __init__(self, draw, static: bool, dataflow: bool = False):
        self.draw = draw
        self.static = static
        self.dynamic = dataflow  # dynamic dims, but dataflow only: @main stays straight-line code
        self.prog = _Program()
        self.depth = 0
        self.in_global = False  # in a global function's body: no new parameters of @main
        # names holding values that may be inexact: results of INEXACT_OPS, what is computed from them, and
        # function parameters (their arguments are not known while the body is built)
        self.inexact: set[str] = set()

    def is_inexact(self, text: str, params: tuple = ()) -> bool:
        """Whether ``text`` computes an inexact value: it uses an inexact op or names an inexact value
        (other than ``params``)."""
        return bool(INEXACT_OPS.search(text)) or any(n in self.inexact and n not in params
                                                     for n in NAME.findall(text))

    def note(self, name: str, text: str, params: tuple = ()) -> None:
        """Record whether ``name``, defined by ``text``, holds an inexact value."""
        if self.is_inexact(text, params):
            self.inexact.add(name)

    def add_global(self, name: str, text: str) -> None:
        """A global function: inexact when its body uses an inexact op (it names only its parameters and
        locals, so a call is exact when the function and the arguments are)."""
        self.prog.globals.append(text)
        if INEXACT_OPS.search(text):
            self.inexact.add(name)

    def exact(self, t: Tensor) -> bool:
        return t.expr not in self.inexact

    # --- helpers ---
    def choice(self, seq):
        return self.draw(st.sampled_from(list(seq)))

    def chance(self, p: float = 0.5) -> bool:
        return self.draw(st.integers(0, 99)) < int(p * 100)

    def fresh(self, prefix: str = "v") -> str:
        self.prog.next_name += 1
        return f"%{prefix}{self.prog.next_name}"

    def fresh_var(self, opaque: bool = False) -> Dim:
        i = self.prog.next_var
        self.prog.next_var += 1
        if not opaque:
            self.prog.variables.append(i)
        return Dim.var(i)

    def max_size(self, shape: tuple) -> int:
        total = 1
        for d in shape:
            total *= d.evaluate({v: 5 for v in d.vars()})
        return total

    def evaluable(self, shape: tuple) -> bool:
        return all(d.vars() <= set(self.prog.variables) for d in shape)

    def may_be_empty(self, shape: tuple) -> bool:
        """Whether a dim may be 0 at run time (it depends on a value-dependent dim)."""
        return not self.evaluable(shape)

    def type_of(self, shape: tuple, dtype: str = "float32") -> str:
        dims = [str(d.value) if d.is_const else "?" for d in shape]
        inner = dims[0] if len(dims) == 1 else ", ".join(dims)
        return f"Tensor[({inner}), {dtype}]"

    def bind(self, lines: list, scope: _Scope, expr: str, shape: tuple, dtype: str = "float32") -> Tensor:
        name = self.fresh()
        lines.append(f"let {name} = {expr};")
        self.note(name, expr)
        t = Tensor(name, tuple(shape), dtype)
        if dtype == "float32":
            scope.own.append(t)
        return t

    def new_param(self, shape: tuple, dims_text: list | None = None) -> Tensor:
        name = self.fresh("p")
        if dims_text is None:
            ann = self.type_of(shape)
        else:
            inner = dims_text[0] if len(dims_text) == 1 else ", ".join(dims_text)
            ann = f"Tensor[({inner}), float32]"
        self.prog.params.append(Param(name, tuple(shape), ann))
        return Tensor(name, tuple(shape))

    # --- parameters of @main ---
    def main_params(self, scope: _Scope) -> None:
        symbols: dict[str, Dim] = {}
        for _ in range(self.draw(st.integers(1, 3))):
            rank = self.choice((1, 2, 2, 3, 4))
            shape, text = [], []
            for axis in range(rank):
                if rank == 4 and axis == 1:
                    kind = "const"  # the channel axis of a convolution input
                else:
                    kind = "const" if self.static else self.choice(("const", "any", "any", "sym"))
                if kind == "const":
                    c = self.choice((1, 2, 3, 4)) if rank < 4 else self.choice((2, 3))
                    shape.append(Dim.const(c))
                    text.append(str(c))
                elif kind == "any":
                    shape.append(self.fresh_var())
                    text.append("?")
                else:
                    sym = self.choice(("n", "m"))
                    if sym not in symbols:
                        symbols[sym] = self.fresh_var()
                    shape.append(symbols[sym])
                    text.append(sym)
            scope.own.append(self.new_param(tuple(shape), text))

    # --- picking values ---
    def pick(self, scope: _Scope, pred=lambda t: True) -> Tensor | None:
        cands = [t for t in scope.tensors() if pred(t)]
        if not cands:
            return None
        # newer values are likelier, so programs chain rather than fan out
        weights = list(range(len(cands)))
        i = self.draw(st.integers(0, len(cands) - 1))
        j = self.draw(st.integers(0, len(cands) - 1))
        return cands[max(i, j, key=lambda k: weights[k])]

    def operand_for(self, lines: list, scope: _Scope, shape: tuple) -> str:
        """An expression that broadcasts into ``shape``: a value of the scope, a reduction of one, or a
        literal."""
        t = self.pick(scope, lambda u: broadcasts_into(u.shape, shape) and u.rank <= len(shape))
        if t is not None and self.chance(0.8):
            return t.expr
        return self.choice(("2f", "-1f", "0.5f", "3f"))

    def to_shape(self, lines: list, scope: _Scope, shape: tuple) -> Tensor:
        """A value of exactly ``shape``: one of the scope's, combined elementwise with something that
        broadcasts into it."""
        base = self.pick(scope, lambda u: u.shape == shape)
        assert base is not None, "to_shape needs a value of the shape in scope"
        for _ in range(self.draw(st.integers(0, 2))):
            op = self.choice(BINARY + UNARY)
            if op in UNARY:
                base = self.bind(lines, scope, f"{op}({base.expr})", shape)
            else:
                other = self.operand_for(lines, scope, shape)
                a, b = (base.expr, other) if self.chance() else (other, base.expr)
                base = self.bind(lines, scope, f"{op}({a}, {b})", shape)
        return base

    # --- statements ---
    def statement(self, lines: list, scope: _Scope) -> Tensor | None:
        kinds = ["unary", "binary", "binary", "shape_arith", "shape_tensor", "reshape", "view", "concat", "split",
                 "reduce", "dense", "dense", "conv", "tuple"]
        if not self.static and self.dynamic:  # straight-line code: stress the VM's shape specialization
            kinds += ["arange", "argwhere", "shape_arith", "shape_tensor", "dense"]
        elif not self.static:
            kinds += ["arange", "argwhere", "if", "if", "loop", "grow_loop", "fill_loop", "recursion", "closure",
                      "list", "option", "tree", "ref", "shared_ref", "knot", "shared_effect", "dropped_effect"]
        if self.depth >= 2:  # bounded nesting: blocks inside blocks only use dataflow
            kinds = kinds[:14]
        for _ in range(4):  # a kind may not apply to the values at hand: try another
            value = getattr(self, "s_" + self.choice(kinds))(lines, scope)
            if value is not None:
                return value
        return None

    def s_unary(self, lines, scope):
        t = self.pick(scope)
        op = self.choice(UNARY + ("clip",))
        if op == "clip":
            return self.bind(lines, scope, f"clip({t.expr}, a_min=-2f, a_max=2.5f)", t.shape)
        return self.bind(lines, scope, f"{op}({t.expr})", t.shape)

    def s_binary(self, lines, scope):
        a = self.pick(scope)
        # a partner: any value broadcasting with ``a`` either way, or a reduction of ``a``
        b = self.pick(scope, lambda u: broadcasts_into(u.shape, a.shape) or broadcasts_into(a.shape, u.shape))
        if b is None or self.chance(0.25):
            if a.rank and self.chance():
                axis = self.draw(st.integers(0, a.rank - 1))
                op = "sum" if self.may_be_empty(a.shape) else self.choice(("max", "sum", "mean"))
                b = self.bind(lines, scope, f"{op}({a.expr}, axis=[{axis}], "
                              f"keepdims=True)", a.shape[:axis] + (ONE,) + a.shape[axis + 1:])
            else:
                b = Tensor(self.choice(("2f", "-1f", "0.5f")), ())
        shape = a.shape if broadcasts_into(b.shape, a.shape) else b.shape
        op = self.choice(BINARY + ("divide",))
        x, y = (a.expr, b.expr) if self.chance() else (b.expr, a.expr)
        if op == "divide" and self.chance():  # by a power of two: the result stays exact
            return self.bind(lines, scope, f"divide({a.expr}, {self.choice(('2f', '4f', '0.5f'))})", a.shape)
        if op == "divide":  # a denominator of at least 1: no inf or NaN (inexact: see INEXACT_OPS)
            return self.bind(lines, scope, f"divide({x}, add(abs({y}), 1f))", shape)
        return self.bind(lines, scope, f"{op}({x}, {y})", shape)

    def s_shape_arith(self, lines, scope):
        """``shape_of`` feeding arithmetic: the dims as floats, summed or taken one by one."""
        t = self.pick(scope, lambda u: u.rank > 0)
        if t is None:
            return None
        dtype = self.choice(("int32", "int64"))
        shp = f'shape_of({t.expr}, dtype="{dtype}")'
        target = self.pick(scope)
        if self.chance():
            axis = self.draw(st.integers(0, t.rank - 1))
            s = f'cast(take({shp}, {axis}), dtype="float32")'
        else:
            s = f'sum(cast({shp}, dtype="float32"))'
        if self.chance(0.3) and target.rank >= 1 and target.shape[-1] == Dim.const(t.rank):
            s = f'cast({shp}, dtype="float32")'  # the whole shape vector, broadcast along the last axis
        return self.bind(lines, scope, f"{self.choice(('add', 'multiply', 'subtract'))}({target.expr}, {s})",
                         target.shape)

    def s_shape_tensor(self, lines, scope):
        """A tensor computed from shapes alone (``shape_of`` feeding compute): the dims as a float row."""
        t = self.pick(scope, lambda u: u.rank > 0)
        if t is None:
            return None
        dtype = self.choice(("int32", "int64"))
        row = f'cast(shape_of({t.expr}, dtype="{dtype}"), dtype="float32")'
        if self.chance():
            return self.bind(lines, scope, f"expand_dims({row}, axis=0)", (ONE, Dim.const(t.rank)))
        return self.bind(lines, scope, row, (Dim.const(t.rank),))

    def s_reshape(self, lines, scope):
        t = self.pick(scope, lambda u: u.rank >= 1)
        if t is None:
            return None
        prod = ONE
        for d in t.shape:
            prod = prod * d
        form = self.choice(("flat", "keep_first", "column", "split_last"))
        if self.may_be_empty(t.shape):  # -1 is ambiguous for an empty tensor unless it is the only dim
            form = "flat"
        if form == "flat" or t.rank == 1:
            return self.bind(lines, scope, f"reshape({t.expr}, newshape=[-1])", (prod,))
        if form == "keep_first":
            rest = ONE
            for d in t.shape[1:]:
                rest = rest * d
            return self.bind(lines, scope, f"reshape({t.expr}, newshape=[0, -1])", (t.shape[0], rest))
        if form == "column":
            return self.bind(lines, scope, f"reshape({t.expr}, newshape=[-1, 1])", (prod, ONE))
        last = t.shape[-1]
        if last.is_const and last.value in (2, 4):  # (.., 2k) -> (.., k, 2)
            dims = ", ".join(["0"] * (t.rank - 1))
            return self.bind(lines, scope, f"reshape({t.expr}, newshape=[{dims}, -1, 2])",
                             t.shape[:-1] + (Dim.const(last.value // 2), Dim.const(2)))
        return self.bind(lines, scope, f"reshape({t.expr}, newshape=[-1])", (prod,))

    def s_view(self, lines, scope):
        t = self.pick(scope, lambda u: u.rank >= 1)
        if t is None:
            return None
        form = self.choice(("transpose", "expand_dims", "squeeze", "slice", "slice_step"))
        if form == "transpose" and t.rank >= 2:
            perm = self.draw(st.permutations(range(t.rank)))
            return self.bind(lines, scope, f"transpose({t.expr}, axes={list(perm)})",
                             tuple(t.shape[i] for i in perm))
        if form == "expand_dims" and t.rank < 4:
            axis = self.draw(st.integers(0, t.rank))
            return self.bind(lines, scope, f"expand_dims({t.expr}, axis={axis})",
                             t.shape[:axis] + (ONE,) + t.shape[axis:])
        ones = [i for i, d in enumerate(t.shape) if d == ONE]
        if form == "squeeze" and ones:
            axis = self.choice(ones)
            return self.bind(lines, scope, f"squeeze({t.expr}, axis=[{axis}])", t.shape[:axis] + t.shape[axis + 1:])
        axis = self.draw(st.integers(0, t.rank - 1))
        d = t.shape[axis]
        if form == "slice_step" and d.is_const and d.value >= 2:
            out = (d.value + 1) // 2
            return self.bind(lines, scope, f"strided_slice({t.expr}, begin=[0], end=[{d.value}], strides=[2], "
                             f"axes=[{axis}])", t.shape[:axis] + (Dim.const(out),) + t.shape[axis + 1:])
        if d.is_const and d.value >= 2:
            b = self.draw(st.integers(0, d.value - 1))
            e = self.draw(st.integers(b + 1, d.value))
            new = Dim.const(e - b)
            text = f"strided_slice({t.expr}, begin=[{b}], end=[{e}], axes=[{axis}])"
        elif self.may_be_empty((d,)):
            return None
        else:  # a dynamic dim: its first row (always there)
            new = ONE
            text = f"strided_slice({t.expr}, begin=[0], end=[1], axes=[{axis}])"
        return self.bind(lines, scope, text, t.shape[:axis] + (new,) + t.shape[axis + 1:])

    def s_concat(self, lines, scope):
        a = self.pick(scope, lambda u: u.rank >= 1)
        if a is None:
            return None
        axis = self.draw(st.integers(0, a.rank - 1))

        def fits(u):
            return u.rank == a.rank and all(x == y for i, (x, y) in enumerate(zip(u.shape, a.shape)) if i != axis)
        parts = [a]
        for _ in range(self.draw(st.integers(1, 2))):
            parts.append(self.pick(scope, fits))
        shape = list(a.shape)
        shape[axis] = Dim()
        for p in parts:
            shape[axis] = shape[axis] + p.shape[axis]
        if self.max_size(tuple(shape)) > MAX_ELEMENTS:
            parts = parts[:2]
            shape[axis] = a.shape[axis] + parts[1].shape[axis]
        fields = ", ".join(p.expr for p in parts)
        return self.bind(lines, scope, f"concatenate(({fields}), axis={axis})", tuple(shape))

    def s_split(self, lines, scope):
        """split into equal sections (of a dim with an even polynomial) or at indices (a constant dim)."""
        t = self.pick(scope, lambda u: any(d.divisible(2) and d != Dim() or (d.is_const and d.value >= 2)
                                           for d in u.shape))
        if t is None:
            return None
        axes = [i for i, d in enumerate(t.shape) if d.divisible(2) and d != Dim() or (d.is_const and d.value >= 2)]
        axis = self.choice(axes)
        d = t.shape[axis]
        if d.divisible(2) and (not d.is_const or self.chance()):
            k = 3 if d.divisible(3) and self.chance() else 2
            k = k if d.divisible(k) else 2
            part = d.div(k)
            i = self.draw(st.integers(0, k - 1))
            tup = self.bind(lines, scope, f"split({t.expr}, indices_or_sections={k}, axis={axis})", (), "tuple")
            return self.bind(lines, scope, f"{tup.expr}.{i}", t.shape[:axis] + (part,) + t.shape[axis + 1:])
        cut = self.draw(st.integers(1, d.value - 1))
        i = self.draw(st.integers(0, 1))
        size = cut if i == 0 else d.value - cut
        tup = self.bind(lines, scope, f"split({t.expr}, indices_or_sections=[{cut}], axis={axis})", (), "tuple")
        return self.bind(lines, scope, f"{tup.expr}.{i}", t.shape[:axis] + (Dim.const(size),) + t.shape[axis + 1:])

    def s_reduce(self, lines, scope):
        op = self.choice(REDUCE + ("argmax",))
        # argmax decides an integer: only of an exact value (else near-ties may pick another index)
        t = self.pick(scope, lambda u: u.rank >= 1 and (op != "argmax" or self.exact(u)))
        if t is None:
            return None
        if self.may_be_empty(t.shape):  # max, min, mean and argmax of nothing are errors or NaN
            op = "sum"
        if op == "argmax":
            axis = self.draw(st.integers(0, t.rank - 1))
            idx = self.bind(lines, scope, f"argmax({t.expr}, axis=[{axis}])", t.shape[:axis] + t.shape[axis + 1:],
                            "int32")
            return self.bind(lines, scope, f'cast({idx.expr}, dtype="float32")', idx.shape)
        if self.chance(0.2):
            return self.bind(lines, scope, f"{op}({t.expr})", ())
        axis = self.draw(st.integers(0, t.rank - 1))
        keep = self.chance()
        shape = t.shape[:axis] + ((ONE,) if keep else ()) + t.shape[axis + 1:]
        return self.bind(lines, scope, f"{op}({t.expr}, axis=[{axis}], keepdims={keep})", shape)

    def s_dense(self, lines, scope):
        a = self.pick(scope, lambda u: u.rank == 2)
        if a is None:
            return None
        m, k = a.shape
        if self.chance(0.3) or not self.evaluable((k,)) or self.in_global:  # a x a^T: no weights needed
            if self.max_size((m, m)) > MAX_ELEMENTS:
                return None
            return self.bind(lines, scope, f"nn.dense({a.expr}, {a.expr})", (m, m))
        fits = [u.shape[0] for u in scope.tensors() if u.rank == 2 and u.shape[1] == k and u.shape[0].is_const]
        units = self.choice(fits) if fits and self.chance(0.7) else Dim.const(self.choice((1, 2, 3)))
        w = self.pick(scope, lambda u: u.shape == (units, k)) if self.chance(0.8) else None
        w = w or self.new_param((units, k))
        return self.bind(lines, scope, f"nn.dense({a.expr}, {w.expr})", (m, units))

    def s_conv(self, lines, scope):
        if self.in_global:
            return None
        a = self.pick(scope, lambda u: u.rank == 4 and u.shape[1].is_const and self.evaluable(u.shape))
        if a is None:
            a = self.pick(scope, lambda u: u.rank == 3 and u.shape[0].is_const and u.shape[0].value <= 4
                          and self.evaluable(u.shape))
            if a is None:
                return None
            if self.chance():  # batch_matmul of a 3-d value with itself
                b, m, _ = a.shape
                if self.max_size((b, m, m)) > MAX_ELEMENTS:
                    return None
                return self.bind(lines, scope, f"nn.batch_matmul({a.expr}, {a.expr})", (b, m, m))
            a = self.bind(lines, scope, f"expand_dims({a.expr}, axis=0)", (ONE,) + a.shape)
        n, c, h, w = a.shape
        kh, kw = self.choice((1, 2, 3)), self.choice((1, 3))
        pad = self.choice((0, 1)) if (kh, kw) != (1, 1) else 0
        # (a dynamic side may be 1 at run time, a dim another convolution shrank: its window must fit 1 + padding)
        if not (h.is_const and h.value + 2 * pad < kh) and not (w.is_const and w.value + 2 * pad < kw) \
                and (h.is_const or kh <= 1 + 2 * pad) and (w.is_const or kw <= 1 + 2 * pad):
            o = Dim.const(self.choice((1, 2)))
            weight = self.new_param((o, c, Dim.const(kh), Dim.const(kw)))
            oh = h + Dim.const(2 * pad - kh + 1)
            ow = w + Dim.const(2 * pad - kw + 1)
            return self.bind(lines, scope, f"nn.conv2d({a.expr}, {weight.expr}, padding=[{pad}, {pad}], "
                             f"kernel_size=[{kh}, {kw}])", (n, o, oh, ow))
        return None

    def s_tuple(self, lines, scope):
        a, b = self.pick(scope), self.pick(scope)
        tup = self.bind(lines, scope, f"({a.expr}, {b.expr})", (), "tuple")
        i = self.draw(st.integers(0, 1))
        return self.bind(lines, scope, f"{tup.expr}.{i}", (a, b)[i].shape)

    # --- value-dependent shapes ---
    def s_arange(self, lines, scope):
        t = self.pick(scope, lambda u: u.rank >= 1)
        if t is None:
            return None
        axis = self.draw(st.integers(0, t.rank - 1))
        stop = f'cast(take(shape_of({t.expr}), {axis}), dtype="float32")'
        r = self.bind(lines, scope, f"arange(0f, {stop}, 1f, dtype=\"float32\")", (t.shape[axis],))
        return r

    def s_argwhere(self, lines, scope):
        t = self.pick(scope, lambda u: 1 <= u.rank <= 3 and self.exact(u))  # its shape depends on signs
        if t is None:
            return None
        cond = self.choice(("greater", "less_equal"))
        idx = self.bind(lines, scope, f"argwhere({cond}({t.expr}, 0f))", (), "int32")
        rows = self.fresh_var(opaque=True)
        return self.bind(lines, scope, f'cast({idx.expr}, dtype="float32")', (rows, Dim.const(t.rank)))

    # --- control flow ---
    def block_parts(self, scope: _Scope, shape: tuple, indent: str, min_stmts: int = 0) -> tuple:
        """A nested block (branch, function body) ending in a value of ``shape``: the text of its
        bindings (each line ending in a newline) and the result's expression."""
        inner = _Scope(scope)
        lines: list[str] = []
        self.depth += 1
        for _ in range(self.draw(st.integers(min_stmts, 2))):
            self.statement(lines, inner)
        result = self.to_shape(lines, inner, shape)
        self.depth -= 1
        return "".join(indent + line + "\n" for line in lines), result.expr

    def block(self, scope: _Scope, shape: tuple, indent: str, min_stmts: int = 0) -> str:
        """``block_parts`` as one text."""
        bindings, result = self.block_parts(scope, shape, indent, min_stmts)
        return bindings + indent + result

    def condition(self, scope: _Scope) -> str:
        t = self.pick(scope)
        if t.rank and self.chance(0.3):
            axis = self.draw(st.integers(0, t.rank - 1))
            return f"less(take(shape_of({t.expr}), {axis}), 3)"  # a shape condition
        t = self.pick(scope, self.exact)  # a tensor condition: of an exact value (@main's parameters are)
        assert t is not None, "a condition needs an exact value in scope"
        return f"greater(sum({t.expr}), {self.choice(('0f', '1f', '-2f'))})"

    def s_if(self, lines, scope):
        t = self.pick(scope)
        cond = self.condition(scope)
        then = self.block(scope, t.shape, "  ")
        other = self.block(scope, t.shape, "  ")
        return self.bind(lines, scope, f"if ({cond}) {{\n{then}\n}} else {{\n{other}\n}}", t.shape)

    def s_ref(self, lines, scope):
        """A reference read and written in this block only (some writes under an ``if``): the VM's
        LocalRefsToValues makes it values, the interpreter keeps a mutable cell."""
        t = self.pick(scope)
        r = self.fresh("r")
        lines.append(f"let {r} = ref({t.expr});")

        def write(u):
            update = f"{self.choice(BINARY)}(ref_read({r}), {u.expr})"
            return f"ref_write({r}, {update})", update

        sources = self.writes(lines, scope, 3, lambda v: broadcasts_into(v.shape, t.shape), write)
        value = self.bind(lines, scope, f"ref_read({r})", t.shape)
        self.note(value.expr, " ".join([t.expr, *sources]))
        return value

    def s_shared_ref(self, lines, scope):
        """A reference a closure captures and writes (called once or twice, once perhaps under an ``if``),
        read after the calls: it leaves its function, so the VM keeps it a cell (bytecode.REF_TAG)."""
        t = self.pick(scope)
        r, write, arg = self.fresh("r"), self.fresh("w"), self.fresh("a")
        ty = self.type_of(t.shape)
        op = self.choice(BINARY)
        lines.append(f"let {r} = ref({t.expr});")
        lines.append(f"let {write} = fn ({arg}: {ty}) -> () {{ ref_write({r}, {op}(ref_read({r}), {arg})) }};")
        sources = self.writes(lines, scope, 2, lambda v: v.shape == t.shape, lambda u: (f"{write}({u.expr})", u.expr))
        value = self.bind(lines, scope, f"ref_read({r})", t.shape)
        self.note(value.expr, " ".join([t.expr, op, *sources]))
        return value

    def s_knot(self, lines, scope):
        """Recursion through a reference: a closure stored in the cell it captures, called 0 to 3 deep. The
        cell and the closure hold each other: a cycle that native mode's collector frees after the call
        (docs/native_mode.md, "Values in C")."""
        t = self.pick(scope)
        u = self.pick(scope, lambda v: v.shape == t.shape)
        r, f, j = self.fresh("r"), self.fresh("f"), self.fresh("j")
        ty = self.type_of(t.shape)
        op = self.choice(BINARY)
        lines.append(f"let {r} = ref(fn ({j}: int32) -> {ty} {{ {t.expr} }});")
        lines.append(f"let {f} = fn ({j}: int32) -> {ty} {{ if (greater({j}, 0)) {{ "
                     f"{op}(ref_read({r})(subtract({j}, 1)), {u.expr}) }} else {{ {t.expr} }} }};")
        lines.append(f"ref_write({r}, {f});")
        value = self.bind(lines, scope, f"ref_read({r})({self.draw(st.integers(0, 3))})", t.shape)
        self.note(value.expr, " ".join([t.expr, op, u.expr]))
        return value

    def s_shared_effect(self, lines, scope):
        """A call that writes a reference, bound once as a graph binding (``%N = ...``) and used in one
        branch of an ``if`` and after it: it runs once, where ToANormalForm binds it (before the ``if``,
        whichever branch runs), in the interpreter and every executor, and the cell read after the ``if``
        sees its write (the interpreter had run it where a branch first reached it)."""
        t = self.pick(scope)
        u = self.pick(scope, lambda v: v.shape == t.shape)
        r, bump, arg, old, branch = (self.fresh(p) for p in ("r", "b", "a", "o", "s"))
        ty = self.type_of(t.shape)
        op, other = self.choice(BINARY), self.choice(BINARY)
        lines.append(f"let {r} = ref({t.expr});")
        lines.append(f"let {bump} = fn ({arg}: {ty}) -> {ty} {{ let {old} = ref_read({r}); "
                     f"ref_write({r}, {op}({old}, {arg})); {old} }};")
        self.prog.next_name += 1
        shared = f"%{self.prog.next_name}"  # (a number: a graph binding, not a let)
        lines.append(f"{shared} = {bump}({u.expr});")
        lines.append(f"let {branch} = if ({self.condition(scope)}) {{ {other}({shared}, {t.expr}) }} else {{ {t.expr} }};")
        value = self.bind(lines, scope, f"{other}(add({branch}, ref_read({r})), {shared})", t.shape)
        self.note(value.expr, " ".join([t.expr, op, other, u.expr]))
        return value

    def s_dropped_effect(self, lines, scope):
        """A call that writes a reference where a pass may take its value as unused: a field of a tuple
        literal projected away, ``shape_of``'s, ``reshape_like``'s or ``cast_like``'s model (FoldConstant and
        SimplifyExpr had dropped such calls, and their writes with them), in a global written in graph form
        that the cell is passed to; the cell read after the call must see the write."""
        t = self.pick(scope)
        u = self.pick(scope, lambda v: v.shape == t.shape)
        k = len(self.prog.globals)
        ty = self.type_of(t.shape)
        op, other = self.choice(BINARY), self.choice(BINARY)
        form = self.choice(("project", "shape_of", "reshape_like", "cast_like"))
        call = f"@bump{k}(%r, %u)"
        dropped = {"project": f"({call}, %x).1", "shape_of": f"dyn.reshape(%x, shape_of({call}))",
                   "reshape_like": f"reshape_like(%x, {call})", "cast_like": f"cast_like(%x, {call})"}[form]
        self.add_global(f"@bump{k}", f"def @bump{k}(%r: ref({ty}), %a: {ty}) -> {ty} {{\n"
                                     f"  let %o = ref_read(%r);\n  let %w = ref_write(%r, {op}(%o, %a));\n  %o\n}}")
        self.add_global(f"@drop{k}", f"def @drop{k}(%r: ref({ty}), %x: {ty}, %u: {ty}) -> {ty} {{\n  {dropped}\n}}")
        cell = self.fresh("dr")
        lines.append(f"let {cell} = ref({t.expr});")
        kept = self.bind(lines, scope, f"@drop{k}({cell}, {t.expr}, {u.expr})", t.shape)
        value = self.bind(lines, scope, f"{other}(add({kept.expr}, ref_read({cell})), {t.expr})", t.shape)
        self.note(value.expr, " ".join([t.expr, op, other, u.expr, form]))
        return value

    def writes(self, lines, scope, most: int, fits, statement) -> list:
        """1 to ``most`` statements ``statement(u)`` (its text and what it reads) for values ``u`` that
        ``fits``, each perhaps under an ``if``; what they read."""
        sources = []
        for _ in range(self.draw(st.integers(1, most))):
            text, source = statement(self.pick(scope, fits))
            sources.append(source)
            if self.chance(0.4):
                lines.append(f"if ({self.condition(scope)}) {{ {text} }} else {{ () }};")
            else:
                lines.append(f"{text};")
        return sources

    def bound(self, scope: _Scope) -> str:
        """A loop or recursion count: a literal or a dim of a parameter (shape_of)."""
        t = self.pick(scope, lambda u: u.rank >= 1 and all(d.vars() <= set(self.prog.variables) for d in u.shape)
                      and len(u.shape[0].terms) <= 1 and u.shape[0].evaluate({v: 5 for v in u.shape[0].vars()}) <= 5)
        if t is not None and self.chance():
            return f"take(shape_of({t.expr}), 0)", t.shape[0]
        n = self.draw(st.integers(0, 3))
        return str(n), Dim.const(n)

    def function_scope(self, params: list[tuple[str, tuple]]) -> _Scope:
        s = _Scope()
        for name, shape in params:
            s.own.append(Tensor(name, shape))
            self.inexact.add(name)
        return s

    def s_loop(self, lines, scope):
        """A loop as tail recursion: ``@loop(i, acc, n, k)`` steps ``acc`` until ``i`` reaches ``n``."""
        acc = self.pick(scope)
        extra = self.pick(scope, lambda u: broadcasts_into(u.shape, acc.shape))
        name = f"@loop{len(self.prog.globals)}"
        body_scope = self.function_scope([("%acc", acc.shape), ("%k", extra.shape)])
        saved = self.depth, self.in_global
        self.depth, self.in_global = 2, True
        bindings, step = self.block_parts(body_scope, acc.shape, "    ", min_stmts=1)
        self.depth, self.in_global = saved
        self.add_global(name,
            f"def {name}(%i: int32, %acc: {self.type_of(acc.shape)}, %n: int32, %k: {self.type_of(extra.shape)}) {{\n"
            f"  if (less(%i, %n)) {{\n{bindings}"
            f"    {name}(add(%i, 1), {step}, %n, %k)\n"
            f"  }} else {{\n    %acc\n  }}\n}}")
        n, _ = self.bound(scope)
        return self.bind(lines, scope, f"{name}(0, {acc.expr}, {n}, {extra.expr})", acc.shape)

    def s_grow_loop(self, lines, scope):
        """A loop whose accumulator grows by a row each step (its type's first dim is ``?``)."""
        acc = self.pick(scope, lambda u: u.rank >= 1 and self.evaluable(u.shape[:1]))
        if acc is None:
            return None
        name = f"@grow{len(self.prog.globals)}"
        shape = acc.shape
        dyn = (Dim.var(10_000),) + shape[1:]  # a placeholder dim for the body's text
        ty = self.type_of(dyn)
        self.add_global(name,
            f"def {name}(%i: int32, %acc: {ty}, %n: int32) -> {ty} {{\n"
            f"  if (less(%i, %n)) {{\n"
            f"    let %row = {self.choice(('negative', 'nn.relu', 'abs'))}(strided_slice(%acc, begin=[0], end=[1], axes=[0]));\n"
            f"    {name}(add(%i, 1), concatenate((%acc, %row), axis=0), %n)\n"
            f"  }} else {{\n    %acc\n  }}\n}}")
        n, count = self.bound(scope)
        new = (shape[0] + count,) + shape[1:]
        if self.max_size(new) > MAX_ELEMENTS:
            return None
        return self.bind(lines, scope, f"{name}(0, {acc.expr}, {n})", new)

    def s_fill_loop(self, lines, scope):
        """A loop writing row ``i`` of a buffer each step with ``scatter_nd`` (run in place when the loop
        owns the buffer: a fresh value here, or one the program may read again)."""
        src = self.pick(scope, lambda u: u.rank >= 1)
        if src is None:
            return None
        name = f"@fill{len(self.prog.globals)}"
        ty = self.type_of(src.shape)
        self.add_global(name,
            f"def {name}(%i: int32, %buf: {ty}, %src: {ty}) -> {ty} {{\n"
            f"  if (less(%i, cast(take(shape_of(%buf), 0), dtype=\"int32\"))) {{\n"
            f"    let %row = {self.choice(('negative', 'nn.relu', 'abs'))}(take(%src, %i, axis=0, mode=\"clip\"));\n"
            f"    {name}(add(%i, 1), scatter_nd(%buf, expand_dims(%i, axis=0), %row), %src)\n"
            f"  }} else {{\n    %buf\n  }}\n}}")
        buf = self.pick(scope, lambda u: u.shape == src.shape)
        start = f"{self.choice(UNARY)}({buf.expr})" if self.chance() else buf.expr
        return self.bind(lines, scope, f"{name}(0, {start}, {src.expr})", src.shape)

    def s_recursion(self, lines, scope):
        """Non-tail recursion: ``@rec(i, x) = h(@rec(i - 1, g(x)), x)``, ``x`` at ``i == 0``."""
        x = self.pick(scope)
        name = f"@rec{len(self.prog.globals)}"
        saved = self.depth, self.in_global
        self.depth, self.in_global = 2, True
        g_lines, g_val = self.block_parts(self.function_scope([("%x", x.shape)]), x.shape, "    ")
        h = self.block(self.function_scope([("%x", x.shape), ("%r", x.shape)]), x.shape, "    ")
        self.depth, self.in_global = saved
        ty = self.type_of(x.shape)
        self.add_global(name,
            f"def {name}(%i: int32, %x: {ty}) -> {ty} {{\n"
            f"  if (equal(%i, 0)) {{\n    %x\n  }} else {{\n{g_lines}"
            f"    let %r = {name}(subtract(%i, 1), {g_val});\n{h}\n  }}\n}}")
        n, _ = self.bound(scope)
        return self.bind(lines, scope, f"{name}({n}, {x.expr})", x.shape)

    def closure(self, scope: _Scope, shape: tuple) -> str:
        """A closure from ``shape`` to ``shape`` capturing the scope; its name."""
        name = self.fresh("f")
        pname = self.fresh("a")
        inner = _Scope(scope)
        inner.own.append(Tensor(pname, shape))
        self.inexact.add(pname)  # the arguments are not known here
        saved, self.depth = self.depth, 2
        body_lines: list[str] = []
        for _ in range(self.draw(st.integers(0, 1))):
            self.statement(body_lines, inner)
        result = self.to_shape(body_lines, _only(inner, pname, shape), shape)
        self.depth = saved
        body = "\n".join("  " + s for s in body_lines + [result.expr])
        local = tuple(NAME.findall(" ".join(line.split("=")[0] for line in body_lines if line.startswith("let "))))
        self.note(name, body, params=(pname,) + local)  # inexact ops or captured inexact values
        return name, f"let {name} = fn ({pname}: {self.type_of(shape)}) {{\n{body}\n}};"

    def s_closure(self, lines, scope):
        t = self.pick(scope)
        name, text = self.closure(scope, t.shape)
        lines.append(text)
        r = self.bind(lines, scope, f"{name}({t.expr})", t.shape)
        if self.chance():  # called again on another value of the shape
            u = self.pick(scope, lambda v: v.shape == t.shape)
            r = self.bind(lines, scope, f"{name}({u.expr})", t.shape)
        return r

    def list_of(self, lines, scope, t: Tensor) -> str:
        items = [t.expr] + [self.pick(scope, lambda v: v.shape == t.shape).expr for _ in range(self.draw(st.integers(0, 2)))]
        text = "Nil"
        for item in reversed(items):
            text = f"Cons({item}, {text})"
        name = self.fresh("l")
        lines.append(f"let {name} = {text};")
        self.note(name, text)
        return name

    def s_list(self, lines, scope):
        t = self.pick(scope)
        lst = self.list_of(lines, scope, t)
        form = self.choice(("map_fold", "fold", "match", "map_match"))
        if form in ("map_fold", "map_match"):
            fname, text = self.closure(scope, t.shape)
            lines.append(text)
            mapped = self.fresh("l")
            lines.append(f"let {mapped} = @map({fname}, {lst});")
            self.note(mapped, f"{fname} {lst}")
            lst = mapped
        if form in ("map_fold", "fold"):
            op = self.choice(("add", "maximum", "subtract"))
            init = self.pick(scope, lambda v: v.shape == t.shape)
            ty = self.type_of(t.shape)
            return self.bind(lines, scope, f"@foldl(fn (%s: {ty}, %e: {ty}) {{ {op}(%s, %e) }}, {init.expr}, {lst})",
                             t.shape)
        other = self.block(scope, t.shape, "    ")
        return self.bind(lines, scope, f"match ({lst}) {{\n  Cons(%h, Cons(%h2, _)) => {{ add(%h, %h2) }},\n"
                         f"  Cons(%h, Nil) => {{ negative(%h) }},\n  Nil => {{\n{other}\n  }},\n}}", t.shape)

    def s_option(self, lines, scope):
        t = self.pick(scope)
        cond = self.condition(scope)
        u = self.to_shape(lines, scope, t.shape)
        opt = self.bind(lines, scope, f"if ({cond}) {{ Some({u.expr}) }} else {{ None }}", (), "adt")
        other = self.block(scope, t.shape, "    ")
        return self.bind(lines, scope, f"match ({opt.expr}) {{\n  Some(%o) => {{ nn.relu(%o) }},\n"
                         f"  None => {{\n{other}\n  }},\n}}", t.shape)

    def s_tree(self, lines, scope):
        t = self.pick(scope)
        u = self.pick(scope, lambda v: v.shape == t.shape)
        tree = self.bind(lines, scope, f"Rose({t.expr}, Cons(Rose({u.expr}, Nil), Cons(Rose({t.expr}, Nil), Nil)))",
                         (), "adt")
        return self.bind(lines, scope, f"match ({tree.expr}) {{\n  Rose(%a, Cons(Rose(%b, _), _)) => "
                         f"{{ subtract(%a, %b) }},\n  Rose(%a, _) => {{ %a }},\n}}", t.shape)

    # --- the program ---
    def program(self) -> str:
        scope = _Scope()
        self.main_params(scope)
        lines: list[str] = []
        for _ in range(self.choice(range(2, 9))):  # uniform: integers() favours the bounds
            self.statement(lines, scope)
        outs = [t for t in scope.own if not t.expr.startswith("%p")][-3:] or scope.own[-1:]
        count = self.draw(st.integers(1, len(outs)))
        chosen = outs[-count:]
        ret = chosen[0].expr if len(chosen) == 1 else "(" + ", ".join(t.expr for t in chosen) + ")"
        if not self.static and self.chance(0.15):  # a List comes back to the caller
            ret = f"({ret}, Cons({chosen[-1].expr}, Nil))"
        params = ", ".join(f"{p.name}: {p.annotation}" for p in self.prog.params)
        body = "\n".join("  " + line for line in lines + [ret])
        main = f"def @main({params}) {{\n{body}\n}}"
        return HEADER + "\n\n".join(self.prog.globals + [main]) + "\n"


def _only(scope: _Scope, pname: str, shape: tuple) -> _Scope:
    """``scope`` with the closure parameter as the only value of its own shape, so the body's result
    depends on the argument."""
    s = _Scope(scope.parent)
    s.own = [t for t in scope.own if t.shape != shape or t.expr == pname]
    s.parent = _Filtered(scope.parent, shape)
    return s


class _Filtered(_Scope):
    def __init__(self, parent: _Scope, shape: tuple):
        super().__init__(None)
        self.inner, self.shape = parent, shape

    def tensors(self):
        return [t for t in self.inner.tensors() if t.shape != self.shape]


FLAVORS = ("static", "dataflow", "full")


@st.composite
def programs(draw, flavor: str | None = None) -> Case:
    """A random well-typed program of a ``flavor``: ``static`` (fixed shapes, dataflow only: fit for the
    graph executor and AOT), ``dataflow`` (dynamic and symbolic dims, value-dependent shapes, no control
    flow: @main is straight-line code, which the VM specializes per shape), ``full`` (every construct);
    ``None``: any (25% / 35% / 40%)."""
    if flavor is None:
        roll = draw(st.integers(0, 99))
        flavor = "static" if roll < 25 else "dataflow" if roll < 60 else "full"
    gen = Generator(draw, flavor == "static", dataflow=flavor == "dataflow")
    text = gen.program()
    seed = draw(st.integers(0, 2**32 - 1))
    return Case(text, tuple(gen.prog.params), tuple(gen.prog.variables), seed)
