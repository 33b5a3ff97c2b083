"""Structural equality and hashing: alpha-equivalence, constants, DAGs, free variables, modules."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorvm.ir import (
    Any,
    Attrs,
    Call,
    Clause,
    Constructor,
    ExprMutator,
    Function,
    FuncType,
    GlobalTypeVar,
    GlobalVar,
    If,
    IncompleteType,
    IRModule,
    Let,
    Match,
    Op,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    PatternWildcard,
    SymDim,
    TensorType,
    Tuple,
    TupleType,
    TypeCall,
    TypeData,
    TypeVar,
    Var,
    const,
)
from tensorvm.ir.structural import assert_structural_equal, structural_equal, structural_hash

F32 = TensorType((), "float32")


def add(a, b):
    return Call(Op("add"), (a, b))


def assert_equal_and_same_hash(a, b, **kwargs):
    assert_structural_equal(a, b, **kwargs)
    assert structural_equal(b, a, **kwargs)
    assert structural_hash(a) == structural_hash(b)


def assert_different(a, b, **kwargs):
    assert not structural_equal(a, b, **kwargs)
    assert not structural_equal(b, a, **kwargs)
    with pytest.raises(AssertionError):
        assert_structural_equal(a, b, **kwargs)


# --------------------------------------------------------------------------------------------
# Alpha-equivalence
# --------------------------------------------------------------------------------------------

def test_function_params_map_by_position():
    x, y, a, b = Var("x", F32), Var("y", F32), Var("a", F32), Var("b", F32)
    assert_equal_and_same_hash(Function((x, y), add(x, y)), Function((a, b), add(a, b)))
    # Same names, swapped roles: different.
    assert_different(Function((x, y), add(x, y)), Function((a, b), add(b, a)))
    assert structural_hash(Function((x, y), x)) != structural_hash(Function((a, b), b))


def test_param_annotations_are_compared():
    x, y = Var("x", F32), Var("y", TensorType((), "int32"))
    assert_different(Function((x,), x), Function((y,), y))
    assert_different(Function((x,), x), Function((Var("z"),), Var("z")))  # free var in the body anyway
    z = Var("z")
    assert_different(Function((x,), x), Function((z,), z))


def test_let_vars_and_shadowing():
    x1, x2, y1, y2 = Var("x"), Var("x"), Var("y"), Var("q")
    e1 = Let(x1, const(1), Let(x2, add(x1, x1), x2))
    e2 = Let(y1, const(1), Let(y2, add(y1, y1), y2))
    assert_equal_and_same_hash(e1, e2)
    e3 = Let(y1, const(1), Let(y2, add(y1, y1), y1))  # returns the outer variable
    assert_different(e1, e3)


def test_pattern_vars_map_by_position():
    header = GlobalTypeVar("P")
    mk = Constructor("Mk", (F32, F32), header, 0)
    d = Var("d")
    a, b, c, e = Var("a"), Var("b"), Var("c"), Var("e")

    def match(p, q, use):
        return Function((d,), Match(d, (Clause(PatternConstructor(mk, (PatternVar(p), PatternVar(q))), use),)))

    assert_equal_and_same_hash(match(a, b, a), match(c, e, c))
    assert_different(match(a, b, a), match(c, e, e))
    # Wildcards, tuples and completeness are structure too.
    wild = Function((d,), Match(d, (Clause(PatternWildcard(), const(0)),)))
    tup = Function((d,), Match(d, (Clause(PatternTuple((PatternWildcard(),)), const(0)),)))
    assert_different(wild, tup)
    assert_different(wild, Function((d,), Match(d, (Clause(PatternWildcard(), const(0)),), complete=False)))


def test_type_params_map_by_position():
    a, b = TypeVar("A"), TypeVar("B")
    xa, xb = Var("x", a), Var("x", b)
    assert_equal_and_same_hash(Function((xa,), xa, a, (a,)), Function((xb,), xb, b, (b,)))
    assert_equal_and_same_hash(FuncType((a,), a, (a,)), FuncType((b,), b, (b,)))
    # A bound type parameter does not match a different (free) one.
    assert_different(Function((xa,), xa, a, (a,)), Function((xb,), xb, a, (b,)))
    # Free type variables compare by identity unless mapped.
    assert_different(TupleType((a,)), TupleType((b,)))
    assert structural_equal(TupleType((a,)), TupleType((b,)), map_free_vars=True)


def test_incomplete_types_are_placeholders():
    assert_equal_and_same_hash(TupleType((IncompleteType(),)), TupleType((IncompleteType(),)))


# --------------------------------------------------------------------------------------------
# Free variables
# --------------------------------------------------------------------------------------------

def test_free_vars_compare_by_identity_unless_mapped():
    x, y = Var("x", F32), Var("x", F32)
    assert_equal_and_same_hash(add(x, x), add(x, x))
    assert_different(add(x, x), add(y, y))
    assert_structural_equal(add(x, x), add(y, y), map_free_vars=True)
    assert structural_hash(add(x, x)) == structural_hash(add(y, y))
    # Mapping stays a bijection: two free vars cannot both map to one.
    assert not structural_equal(add(x, y), add(x, x), map_free_vars=True)
    assert not structural_equal(add(x, x), add(x, y), map_free_vars=True)
    # A free var never matches a bound one.
    assert not structural_equal(Function((y,), add(x, y)), Function((y,), add(y, y)), map_free_vars=True)


def test_mapped_free_vars_must_have_equal_annotations():
    assert not structural_equal(Var("x", F32), Var("y", TensorType((), "int32")), map_free_vars=True)


# --------------------------------------------------------------------------------------------
# Constants, attributes, types
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("a, b", [
    (np.array(1, "int32"), np.array(1, "int64")),
    (np.array([1, 2], "float32"), np.array([1, 3], "float32")),
    (np.array([1, 2], "float32"), np.array([[1, 2]], "float32")),
    (np.array(0.0, "float32"), np.array(-0.0, "float32")),
    (np.array(True), np.array(1, "uint8")),
])
def test_different_constants(a, b):
    assert_different(const(a), const(b))


def test_equal_constants_including_nan():
    a = np.array([np.nan, 1.0, -0.0], "float32")
    b = a.copy()
    b[0] = -np.nan  # another NaN bit pattern
    assert_equal_and_same_hash(const(a), const(b))
    assert_equal_and_same_hash(const(np.arange(6).reshape(2, 3)), const(np.arange(6).reshape(2, 3)))


@pytest.mark.parametrize("a, b", [
    ({"axis": 1}, {"axis": 1.0}),
    ({"axis": 1}, {"axis": True}),
    ({"axis": 1}, {"axis": 2}),
    ({"axis": 1}, {"axes": 1}),
    ({"padding": (1, 1)}, {"padding": (1, 1, 1)}),
    ({"layout": "NCHW"}, {"layout": "NHWC"}),
    ({"x": None}, {"x": 0}),
])
def test_attrs_differ_by_value_and_kind(a, b):
    x = Var("x")
    assert_different(Call(Op("f"), (x,), Attrs(a)), Call(Op("f"), (x,), Attrs(b)))


def test_attrs_ignore_order_and_treat_nan_as_equal():
    x = Var("x")
    one = Call(Op("f"), (x,), Attrs({"a": 1, "b": float("nan")}))
    two = Call(Op("f"), (x,), Attrs({"b": float("nan"), "a": 1}))
    assert_equal_and_same_hash(one, two)


@pytest.mark.parametrize("a, b", [
    (TensorType((Any(), 2)), TensorType((1, 2))),
    (TensorType((SymDim("n"),)), TensorType((SymDim("m"),))),
    (TensorType((SymDim("n"),)), TensorType((Any(),))),
    (TensorType((2,), "float32"), TensorType((2,), "float16")),
    (TupleType((F32,)), TupleType((F32, F32))),
    (TypeCall(GlobalTypeVar("List"), (F32,)), TypeCall(GlobalTypeVar("Tree"), (F32,))),
    (FuncType((F32,), F32), FuncType((F32, F32), F32)),
])
def test_different_types(a, b):
    assert_different(a, b)


def test_equal_types_hash_alike():
    assert_equal_and_same_hash(TensorType((Any(), SymDim("n"), 3)), TensorType((Any(), SymDim("n"), 3)))


def test_spans_and_checked_types_are_ignored():
    from tensorvm.ir import Span

    x = Var("x")
    a = Call(Op("add"), (x, x), span=Span(1, 1))
    b = Call(Op("add"), (x, x), span=Span(9, 9)).with_type(F32)
    assert_equal_and_same_hash(a, b)


# --------------------------------------------------------------------------------------------
# DAGs, modules, long programs, error messages
# --------------------------------------------------------------------------------------------

def test_dag_equals_tree():
    x = Var("x", F32)
    shared = add(x, x)
    dag = Function((x,), Tuple((shared, shared, If(shared, shared, shared))))

    def copy():
        return add(x, x)

    tree = Function((x,), Tuple((copy(), copy(), If(copy(), copy(), copy()))))
    assert_equal_and_same_hash(dag, tree)


def test_shared_binder_hashes_like_its_copies():
    x = Var("x", F32)
    p = Var("p", F32)
    fn = Function((p,), add(p, x))
    p2 = Var("p", F32)
    dag = Function((x,), Let(Var("z"), const(1), Tuple((fn, Let(Var("w"), const(2), fn)))))
    tree = Function((x,), Let(Var("z"), const(1), Tuple((fn, Let(Var("w"), const(2), Function((p2,), add(p2, x)))))))
    assert_equal_and_same_hash(dag, tree)


def _module(body_const: int, extra: bool = False) -> IRModule:
    a = TypeVar("A")
    header = GlobalTypeVar("List")
    tdef = TypeData(header, (a,), (Constructor("Cons", (a, TypeCall(header, (a,))), header, 0),
                                   Constructor("Nil", (), header, 1)))
    x = Var("x", F32)
    functions = {GlobalVar("main"): Function((x,), add(x, const(body_const)))}
    if extra:
        functions[GlobalVar("other")] = Function((), const(0))
    return IRModule(functions, {header: tdef})


def test_modules_compare_globals_and_types_by_name():
    assert_equal_and_same_hash(_module(1), _module(1))
    assert_different(_module(1), _module(2))
    assert_different(_module(1), _module(1, extra=True))
    other = _module(1)
    other.type_definitions.clear()
    assert_different(_module(1), other)


def test_module_order_does_not_matter():
    x, y = Var("x"), Var("y")
    m1 = IRModule({GlobalVar("a"): Function((x,), x), GlobalVar("b"): Function((y,), y)})
    m2 = IRModule({GlobalVar("b"): Function((y,), y), GlobalVar("a"): Function((x,), x)})
    assert_equal_and_same_hash(m1, m2)


def test_long_let_chains_do_not_exhaust_the_stack():
    def chain(n):
        x = Var("x", F32)
        lets, prev = [], x
        for _ in range(n):
            v = Var("v")
            lets.append((v, add(prev, const(1.0))))
            prev = v
        body = prev
        for v, value in reversed(lets):
            body = Let(v, value, body)
        return Function((x,), body)

    assert_equal_and_same_hash(chain(12000), chain(12000))
    assert not structural_equal(chain(3000), chain(3001))


def test_assert_message_points_at_the_first_difference():
    x = Var("x", F32)
    a = Function((x,), Tuple((add(x, const(1.0)), const(2.0))))
    y = Var("y", F32)
    b = Function((y,), Tuple((add(y, const(1.5)), const(2.0))))
    with pytest.raises(AssertionError) as err:
        assert_structural_equal(a, b)
    message = str(err.value)
    assert "body.fields[0].args[1]" in message and "constants differ" in message
    assert "lhs: 1f" in message and "rhs: 1.5f" in message
    mod_a, mod_b = _module(1), _module(1, extra=True)
    with pytest.raises(AssertionError, match="only on the right: \\['other'\\]"):
        assert_structural_equal(mod_a, mod_b)
    with pytest.raises(AssertionError, match=r"@main\.body\.args\[1\]"):
        assert_structural_equal(_module(1), _module(3))


def test_structural_hash_is_stable_across_processes():
    import subprocess
    import sys

    code = ("from tensorvm.ir import *; from tensorvm.ir.structural import structural_hash as h; "
            "x = Var('x'); print(h(Function((x,), Call(Op('nn.dense'), (x, const([1.0, 2.0])), Attrs(units=2)))))")
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={"PYTHONHASHSEED": seed}, check=True).stdout for seed in ("1", "2")}
    assert len(outputs) == 1


# --------------------------------------------------------------------------------------------
# Property: a renamed copy is equal with the same hash; one changed constant is not equal
# --------------------------------------------------------------------------------------------

class _Renamer(ExprMutator):
    """A copy with fresh variables everywhere (and shared nodes kept shared)."""

    def __init__(self):
        super().__init__()
        self.fresh = {}

    def visit_var(self, v):
        if v not in self.fresh:
            self.fresh[v] = Var(v.name_hint + "_renamed", v.type_annotation)
        return self.fresh[v]

    def visit_let(self, let):
        return Let(self.visit(let.var), self.visit(let.value), self.visit(let.body))


class _Untangler(ExprMutator):
    """Undo sharing: every use becomes its own copy."""

    def visit(self, expr):
        self.memo.clear()
        return super().visit(expr)


@st.composite
def expressions(draw, max_depth=5):
    x = Var("x", F32)
    scope = [x]
    pool = []
    constants = []

    def gen(depth):
        k = draw(st.integers(0, 6 if depth > 0 else 1))
        if k == 0:
            return draw(st.sampled_from(scope))
        if k == 1:
            c = const(draw(st.floats(-4, 4, width=32)))
            constants.append(c)
            return c
        if k == 2:
            node = add(gen(depth - 1), gen(depth - 1))
        elif k == 3:
            v = Var(draw(st.sampled_from(["x", "y", "v"])), F32)
            value = gen(depth - 1)
            saved = len(pool)
            scope.append(v)
            body = gen(depth - 1)
            scope.pop()
            del pool[saved:]
            node = Let(v, value, body)
        elif k == 4:
            node = Tuple((gen(depth - 1), gen(depth - 1)))
        elif k == 5:
            node = If(gen(depth - 1), gen(depth - 1), gen(depth - 1))
        else:
            return draw(st.sampled_from(pool)) if pool else gen(depth - 1)
        pool.append(node)
        return node

    body = gen(max_depth)
    return Function((x,), body), constants


@settings(max_examples=40, deadline=None)
@given(expressions(), st.data())
def test_renamed_and_unshared_copies_are_equal_and_a_changed_constant_is_not(program, data):
    fn, constants = program
    renamed = _Renamer().visit(fn)
    assert_equal_and_same_hash(fn, renamed)
    untangled = _Untangler().visit(fn)
    assert_equal_and_same_hash(fn, untangled)
    if constants:
        target = data.draw(st.sampled_from(constants))

        class Change(ExprMutator):
            def visit_constant(self, c):
                return const(c.data + np.float32(1)) if c is target else c

        assert not structural_equal(fn, Change().visit(fn))
