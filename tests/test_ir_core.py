"""The IR's core data structures: types, attrs, expressions, modules, visitors and mutators."""

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.ir import (
    Any,
    Attrs,
    Call,
    Function,
    GlobalVar,
    IRModule,
    Let,
    Op,
    SymDim,
    TensorType,
    Tuple,
    TupleGetItem,
    TupleType,
    Var,
    const,
    free_vars,
    post_order,
)
from tensorvm.ir.functor import ExprMutator, ExprVisitor


def test_tensor_type_dims_and_dtype_normalization():
    t = TensorType((Any(), 3, SymDim("n")), "float")
    assert t.dtype == "float32"
    assert t.ndim == 3 and not t.is_static
    assert TensorType((2, 3)) == TensorType((2, 3), "float32")
    assert TensorType((np.int64(2),)).shape == (2,)
    with pytest.raises(ValueError, match="unknown dtype"):
        TensorType((1,), "complex64")
    with pytest.raises(ValueError, match=">= 0"):
        TensorType((-1,))
    with pytest.raises(TypeError, match="dimension"):
        TensorType((1.5,))


def test_type_vars_are_identities_but_global_type_vars_are_names():
    a1, a2 = tv.ir.TypeVar("A"), tv.ir.TypeVar("A")
    assert a1 != a2 and a1 == a1
    assert tv.ir.GlobalTypeVar("List") == tv.ir.GlobalTypeVar("List")
    assert TupleType([TensorType(())]) == TupleType((TensorType(()),))


def test_attrs_are_frozen_normalized_and_hashable():
    a = Attrs({"padding": [1, 1], "axis": np.int64(2)})
    assert a.padding == (1, 1) and a["axis"] == 2 and type(a["axis"]) is int
    assert a == {"padding": (1, 1), "axis": 2}
    assert hash(a) == hash(Attrs(padding=(1, 1), axis=2))
    with pytest.raises(AttributeError):
        a.padding = (2, 2)
    assert a.with_(axis=3).axis == 3 and a.axis == 2


def test_constants_are_read_only_and_typed():
    c = const(1.5)
    assert c.data.dtype == np.float32 and c.type == TensorType((), "float32")
    assert const(3).data.dtype == np.int32
    assert const([1, 2], "int64").type == TensorType((2,), "int64")
    with pytest.raises(ValueError):
        c.data[()] = 2.0


def test_nodes_compare_by_identity_except_names():
    x, y = Var("x"), Var("x")
    assert x != y
    assert GlobalVar("f") == GlobalVar("f") and Op("add") == Op("add")
    c1, c2 = Call(Op("add"), (x, x)), Call(Op("add"), (x, x))
    assert c1 != c2 and len({c1, c2}) == 2


def test_builder_api_checks_attrs():
    x = tv.ir.var("x", shape=(Any(), 2))
    call = tv.op.add(x, x)
    assert isinstance(call, Call) and call.op == Op("add") and call.args == (x, x)
    with pytest.raises(TypeError, match="takes 2"):
        tv.op.add(x)
    with pytest.raises(tv.AttrError, match="unknown attribute"):
        tv.op.add(x, x, axis=1)
    with pytest.raises(AttributeError):
        tv.op.no_such_op  # noqa: B018


def test_module_globals_types_and_constructors():
    mod = IRModule()
    x = Var("x")
    gv = mod.add("main", Function((x,), x))
    assert mod["main"].params == (x,) and gv == mod.get_global_var("main")
    assert "main" in mod and "other" not in mod
    with pytest.raises(KeyError, match="no global function @other"):
        mod.get_global_var("other")
    with pytest.raises(TypeError, match="must be a Function"):
        mod.add("bad", x)
    header = tv.ir.GlobalTypeVar("Pair")
    a = tv.ir.TypeVar("A")
    ctor = tv.ir.Constructor("MkPair", (a, a), header, 0)
    mod.add_type(tv.ir.TypeData(header, (a,), (ctor,)))
    assert mod.constructor("MkPair") == ctor
    value = mod.constructor("MkPair")(np.ones(2), np.zeros(2))
    assert isinstance(value, tv.ADT) and value.tag == 0 and len(value) == 2
    assert isinstance(ctor(x, x), Call)


def test_free_vars_and_post_order():
    x, y, z = Var("x"), Var("y"), Var("z")
    body = Let(z, tv.op.add(x, y), Tuple((z, TupleGetItem(Tuple((x,)), 0))))
    fn = Function((x,), body)
    assert free_vars(fn) == [y]
    assert set(free_vars(body)) == {x, y}
    order = post_order(tv.op.add(x, tv.op.exp(x)))
    assert order[-1].op == Op("add") and order.index(x) < len(order) - 1
    assert sum(1 for n in order if n is x) == 1  # shared node visited once


def test_mutator_preserves_sharing_and_identity_when_unchanged():
    x = Var("x")
    shared = tv.op.exp(x)
    expr = tv.op.add(shared, shared)
    assert ExprMutator().visit(expr) is expr

    class ExpToNeg(ExprMutator):
        def visit_call(self, call):
            new = super().visit_call(call)
            return tv.op.negative(*new.args) if new.op == Op("exp") else new

    out = ExpToNeg().visit(expr)
    assert out.op == Op("add") and out.args[0] is out.args[1] and out.args[0].op == Op("negative")


def test_visitors_handle_long_let_chains():
    x = Var("x")
    body = x
    for i in range(30000):
        v = Var(f"v{i}")
        body = Let(v, const(i), body)
    seen = []

    class Count(ExprVisitor):
        def visit_constant(self, c):
            seen.append(c)

    Count().visit(body)
    assert len(seen) == 30000
    assert ExprMutator().visit(body) is body


def test_visitors_handle_deep_graph_form_chains():
    x = Var("x")
    expr = x
    for i in range(40000):
        expr = tv.op.exp(expr) if i % 2 else tv.op.negative(expr)
    assert free_vars(expr) == [x]
    assert len([n for n in post_order(expr) if isinstance(n, Call)]) == 40000
    assert ExprMutator().visit(expr) is expr
