"""The reference interpreter and the executors' front door.

Programs are built with IR constructors here (so these tests do not depend on the parser), plus
the shared program suite (``tests/programs.py``) run end to end from Relay text.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from programs import PROGRAMS, Program, check_result

import tensorvm as tv
from tensorvm.errors import ExecutionError, ShapeError, TypeInferenceError, UnsupportedError
from tensorvm.executor import create_executor
from tensorvm.interpreter import FunctionValue, Interpreter
from tensorvm.ir import (
    Any,
    Call,
    Clause,
    Constructor,
    Function,
    GlobalTypeVar,
    GlobalVar,
    If,
    IRModule,
    Let,
    Match,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    PatternWildcard,
    RefCreate,
    RefRead,
    RefWrite,
    SymDim,
    TensorType,
    Tuple,
    TupleGetItem,
    TupleType,
    TypeCall,
    TypeData,
    TypeVar,
    Var,
    const,
)
from tensorvm.op import make_call
from tensorvm.runtime.ndarray import NDArray
from tensorvm.runtime.object import ADT, RefValue

F32 = "float32"


def scalar(dtype: str = "int32") -> TensorType:
    return TensorType((), dtype)


def tensor(*shape, dtype: str = F32) -> TensorType:
    return TensorType(shape, dtype)


def call(name, *args, **attrs):
    return make_call(name, *args, **attrs)


def module_with(**functions) -> IRModule:
    mod = IRModule()
    for name, fn in functions.items():
        mod.add(name, fn)
    return mod


def main_of(params, body) -> IRModule:
    return module_with(main=Function(tuple(params), body))


# --- a small List ADT built by hand (the prelude is parsed from text; see test_prelude.py) -----------
A = TypeVar("A")
LIST = GlobalTypeVar("MyList")
CONS = Constructor("MyCons", (A, TypeCall(LIST, (A,))), LIST, 0)
NIL = Constructor("MyNil", (), LIST, 1)
LIST_DEF = TypeData(LIST, (A,), (CONS, NIL))


def list_value(items):
    value = ADT(1, (), "MyNil")
    for item in reversed(items):
        value = ADT(0, (item, value), "MyCons")
    return value


# --- ops, broadcasting and shape checks --------------------------------------------------------------
def test_op_call_broadcasts_dynamic_shapes_like_numpy():
    x, y = Var("x", tensor(Any(), 2)), Var("y", tensor(1, 2))
    mod = main_of([x, y], call("add", x, y))
    a = np.arange(6, dtype=F32).reshape(3, 2)
    b = np.array([[10, 20]], dtype=F32)
    out = Interpreter(mod).run("main", a, b)
    np.testing.assert_array_equal(out, a + b)
    assert out.dtype == np.float32


def test_runtime_broadcast_mismatch_is_a_shape_error_naming_the_op():
    x, y = Var("x", tensor(Any(), 2)), Var("y", tensor(Any(), 2))
    mod = main_of([x, y], call("multiply", x, y))
    with pytest.raises(ShapeError, match=r"multiply.*\(3, 2\).*\(4, 2\)"):
        Interpreter(mod).run("main", np.ones((3, 2), F32), np.ones((4, 2), F32))


def test_kernel_output_that_disagrees_with_the_shape_function_is_an_internal_error(monkeypatch):
    opdef = tv.op.get_op("negative")
    monkeypatch.setattr(opdef, "kernel", lambda attrs, x: np.zeros((x.shape[0] + 1,), x.dtype))
    x = Var("x", tensor(Any()))
    with pytest.raises(ExecutionError, match="internal error in op negative"):
        Interpreter(main_of([x], call("negative", x))).run("main", np.ones(3, F32))


def test_kernel_exception_is_wrapped_with_the_op_name(monkeypatch):
    opdef = tv.op.get_op("negative")

    def broken(attrs, x):
        raise ValueError("boom")

    monkeypatch.setattr(opdef, "kernel", broken)
    x = Var("x", tensor(2))
    with pytest.raises(ExecutionError, match="negative: kernel failed.*boom"):
        Interpreter(main_of([x], call("negative", x))).run("main", np.ones(2, F32))


def test_kernel_dtype_is_checked_against_inferred_type_when_present():
    x = Var("x", tensor(2))
    body = call("negative", x).with_type(tensor(2, dtype="float64"))  # a wrong inferred type
    with pytest.raises(ExecutionError, match="type inference says"):
        Interpreter(main_of([x], body)).run("main", np.ones(2, F32))


@settings(max_examples=30, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=0, max_size=3),
    masks=st.lists(st.lists(st.booleans(), min_size=3, max_size=3), min_size=2, max_size=2),
    ops=st.lists(st.sampled_from(["add", "subtract", "multiply"]), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_random_broadcast_chains_match_numpy(shape, masks, ops, seed):
    rng = np.random.default_rng(seed)
    # Each input keeps some dims and sets others to 1 (broadcasting), with Any dims in its type.
    shapes = [tuple(1 if m else d for d, m in zip(shape, mask, strict=False)) for mask in masks]
    arrays = [rng.standard_normal(s).astype(F32) for s in shapes]
    params = [Var(f"p{i}", TensorType(tuple(Any() for _ in s), F32)) for i, s in enumerate(shapes)]
    numpy_fns = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply}
    body, expected = params[0], arrays[0]
    for i, name in enumerate(ops):
        other = i % 2 == 0
        body = call(name, body, params[1]) if other else call(name, params[1], body)
        expected = numpy_fns[name](expected, arrays[1]) if other else numpy_fns[name](arrays[1], expected)
    out = Interpreter(main_of(params, body)).run("main", *arrays)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert out.shape == np.broadcast_shapes(*shapes) and out.dtype == np.float32


# --- control flow, recursion and tail calls -----------------------------------------------------------
def count_loop_module() -> IRModule:
    """@loop(i, acc) = if i == 0 then acc else @loop(i - 1, acc + i): a tail call."""
    i, acc = Var("i", scalar()), Var("acc", scalar("int64"))
    loop = GlobalVar("loop")
    body = If(call("equal", i, const(0)), acc,
              Call(loop, (call("subtract", i, const(1)), call("add", acc, call("cast", i, dtype="int64")))))
    return module_with(loop=Function((i, acc), body))


def test_ten_thousand_step_tail_recursive_global_loop():
    n = 10_000
    out = Interpreter(count_loop_module()).run("loop", n, np.int64(0))
    assert out == n * (n + 1) // 2 and out.dtype == np.int64


def test_tail_recursive_let_bound_closure_captures_a_free_variable():
    # let %loop = fn (%i) { if (%i == 0) { %acc_base } else { %loop(%i - 1) } }: recursive through the let.
    x = Var("x", scalar(F32))
    loop, i = Var("loop"), Var("i", scalar())
    body = If(call("equal", i, const(0)), call("multiply", x, const(2.0)), Call(loop, (call("subtract", i, const(1)),)))
    program = Let(loop, Function((i,), body), Call(loop, (const(10_000),)))
    out = Interpreter(main_of([x], program)).run("main", np.float32(1.5))
    assert out == np.float32(3.0)


def test_tail_calls_run_in_constant_python_stack(monkeypatch):
    # Record the Python stack depth each time the loop body's add runs: it must not grow.
    depths = []
    opdef = tv.op.get_op("add")
    kernel = opdef.kernel

    def recording_kernel(attrs, *arrays):
        frame, depth = sys._getframe(), 0
        while frame is not None:
            frame, depth = frame.f_back, depth + 1
        depths.append(depth)
        return kernel(attrs, *arrays)

    monkeypatch.setattr(opdef, "kernel", recording_kernel)
    Interpreter(count_loop_module()).run("loop", 2000, np.int64(0))
    assert len(depths) == 2000 and max(depths) == min(depths)


def test_non_tail_recursion_beyond_pythons_default_depth():
    n_var = Var("n", scalar())
    sum_up = GlobalVar("sum_up")
    body = If(call("equal", n_var, const(0)), n_var,
              call("add", Call(sum_up, (call("subtract", n_var, const(1)),)), n_var))
    mod = module_with(sum_up=Function((n_var,), body))
    assert Interpreter(mod).run("sum_up", 3000) == 3000 * 3001 // 2


def test_if_requires_a_rank_0_condition():
    x = Var("x", tensor(2, dtype="bool"))
    mod = main_of([x], If(x, const(1), const(2)))
    with pytest.raises(ExecutionError, match="rank-0"):
        Interpreter(mod).run("main", np.array([True, False]))


def test_if_takes_the_branch_of_a_tensor_condition():
    x = Var("x", tensor(3))
    cond = call("equal", const(np.float32(0)), const(np.float32(0)))  # a rank-0 bool
    flag = Var("flag", scalar("bool"))
    mod = main_of([x, flag], If(flag, call("negative", x), If(cond, x, call("exp", x))))
    data = np.array([1, -2, 3], F32)
    np.testing.assert_array_equal(Interpreter(mod).run("main", data, True), -data)
    np.testing.assert_array_equal(Interpreter(mod).run("main", data, False), data)


def test_shared_subexpressions_are_evaluated_once_per_activation():
    # x_{k+1} = x_k + x_k, 40 times: a DAG with 2**40 paths that must run in linear time.
    x = Var("x", scalar("float64"))
    node = x
    for _ in range(40):
        node = call("add", node, node)
    assert Interpreter(main_of([x], node)).run("main", np.float64(1.0)) == 2.0**40


def test_long_let_chains_do_not_recurse():
    x = Var("x", scalar())
    lets = []
    current = x
    for k in range(5000):
        v = Var(f"v{k}")
        lets.append((v, call("add", current, const(1))))
        current = v
    body = current
    for v, value in reversed(lets):
        body = Let(v, value, body)
    assert Interpreter(main_of([x], body)).run("main", 7) == 5007


# --- closures ------------------------------------------------------------------------------------------
def test_closure_captures_its_defining_environment():
    x, y, k = Var("x", scalar(F32)), Var("y", scalar(F32)), Var("k")
    f = Var("f")
    body = Let(k, call("multiply", x, const(10.0)),
               Let(f, Function((y,), call("add", y, k)), Call(f, (const(1.0),))))
    assert Interpreter(main_of([x], body)).run("main", 2.0) == np.float32(21.0)


def test_currying_returns_closures_that_remember_each_argument():
    a, b = Var("a"), Var("b")
    adder = Function((a,), Function((b,), call("subtract", a, b)))
    expr = Call(Call(adder, (const(10),)), (const(3),))
    assert Interpreter().evaluate(expr) == 7


def test_closure_values_can_be_returned_and_called_from_python():
    a, b = Var("a", scalar()), Var("b", scalar())
    mod = main_of([a], Function((b,), call("multiply", a, b)))
    times_six = Interpreter(mod).run("main", 6)
    assert isinstance(times_six, FunctionValue)
    assert times_six(7) == 42
    with pytest.raises(ExecutionError, match="takes 1 argument"):
        times_six(1, 2)


def test_primitive_functions_are_just_called():
    p0, p1 = Var("p0", tensor(2)), Var("p1", tensor(2))
    fused = Function((p0, p1), call("exp", call("add", p0, p1)), attrs={"Primitive": 1})
    x = Var("x", tensor(2))
    mod = main_of([x], Call(fused, (x, x)))
    data = np.array([0.0, 0.5], F32)
    np.testing.assert_allclose(Interpreter(mod).run("main", data), np.exp(data + data), rtol=1e-6)


def test_globals_call_each_other_and_are_values():
    x = Var("x", scalar())
    double = Function((x,), call("add", x, x))
    f, y = Var("f"), Var("y", scalar())
    apply_twice = Function((f, y), Call(f, (Call(f, (y,)),)))
    z = Var("z", scalar())
    mod = module_with(double=double, apply_twice=apply_twice,
                      main=Function((z,), Call(GlobalVar("apply_twice"), (GlobalVar("double"), z))))
    assert Interpreter(mod).run("main", 5) == 20


# --- tuples, ADTs, match, refs ---------------------------------------------------------------------------
def test_tuples_in_and_out_and_projection():
    t = Var("t", TupleType((tensor(Any()), TupleType((scalar(), tensor(2))))))
    body = Tuple((TupleGetItem(TupleGetItem(t, 1), 0), call("negative", TupleGetItem(t, 0))))
    out = Interpreter(main_of([t], body)).run("main", (np.ones(3, F32), (np.int32(4), np.zeros(2, F32))))
    assert isinstance(out, tuple) and out[0] == 4
    np.testing.assert_array_equal(out[1], -np.ones(3, F32))


def list_length_module() -> IRModule:
    xs, rest = Var("xs", TypeCall(LIST, (tensor(Any()),))), Var("rest")
    length = GlobalVar("length")
    body = Match(xs, (
        Clause(PatternConstructor(CONS, (PatternWildcard(), PatternVar(rest))),
               call("add", const(1), Call(length, (rest,)))),
        Clause(PatternConstructor(NIL, ()), const(0)),
    ))
    mod = IRModule(type_definitions={LIST: LIST_DEF})
    mod.add("length", Function((xs,), body))
    return mod


def test_match_on_adt_arguments():
    items = [np.ones(k, F32) for k in range(5)]
    assert Interpreter(list_length_module()).run("length", list_value(items)) == 5


def test_adt_arguments_are_checked_against_the_type_arguments():
    items = [np.ones(2, "float64")]
    with pytest.raises(ExecutionError, match=r"parameter %xs\.MyCons\[0\].*float32.*float64"):
        Interpreter(list_length_module()).run("length", list_value(items))
    with pytest.raises(ExecutionError, match="expects a value of type MyList"):
        Interpreter(list_length_module()).run("length", (1, 2))
    with pytest.raises(ExecutionError, match="got a Rose value"):
        Interpreter(list_length_module()).run("length", ADT(0, (1, 2), "Rose"))


def test_first_matching_clause_wins_and_nested_patterns_bind():
    xs, h1, h2 = Var("xs"), Var("h1"), Var("h2")
    second = Match(xs, (
        Clause(PatternConstructor(CONS, (PatternVar(h1), PatternConstructor(CONS, (PatternVar(h2), PatternWildcard())))),
               h2),
        Clause(PatternWildcard(), const(-1)),
        Clause(PatternConstructor(NIL, ()), const(-2)),
    ))
    mod = IRModule(type_definitions={LIST: LIST_DEF})
    mod.add("second", Function((xs,), second))
    it = Interpreter(mod)
    assert it.run("second", list_value([np.int32(5), np.int32(6), np.int32(7)])) == 6
    assert it.run("second", list_value([np.int32(5)])) == -1
    assert it.run("second", list_value([])) == -1  # the wildcard comes before the Nil clause


def test_incomplete_match_without_a_matching_clause_is_an_execution_error():
    xs, h = Var("xs"), Var("h")
    head = Match(xs, (Clause(PatternConstructor(CONS, (PatternVar(h), PatternWildcard())), h),), complete=False)
    mod = IRModule(type_definitions={LIST: LIST_DEF})
    mod.add("head", Function((xs,), head))
    with pytest.raises(ExecutionError, match="no clause matches"):
        Interpreter(mod).run("head", list_value([]))


def test_tuple_patterns_and_constructor_calls_build_adts():
    a, b = Var("a"), Var("b")
    pair = Tuple((const(1), Call(CONS, (const(2), Call(NIL, ())))))
    expr = Match(pair, (Clause(PatternTuple((PatternVar(a), PatternVar(b))), Tuple((b, a))),))
    out = Interpreter(IRModule(type_definitions={LIST: LIST_DEF})).evaluate(expr)
    assert isinstance(out[0], ADT) and out[0].constructor == "MyCons" and out[0].fields[0] == 2
    assert out[0].fields[1].tag == NIL.tag and out[1] == 1


def test_a_bare_nullary_constructor_is_its_value():
    out = Interpreter().evaluate(NIL)
    assert isinstance(out, ADT) and out.tag == 1 and out.fields == ()


def test_refs_create_read_and_write():
    r = Var("r")
    x = Var("x", scalar())
    body = Let(r, RefCreate(x),
               Let(Var("_"), RefWrite(r, call("add", RefRead(r), const(1))),
                   Let(Var("_2"), RefWrite(r, call("multiply", RefRead(r), const(10))), RefRead(r))))
    assert Interpreter(main_of([x], body)).run("main", 4) == 50
    ref = Interpreter().evaluate(RefCreate(const(3)))
    assert isinstance(ref, RefValue) and ref.value == 3


def test_non_tensor_op_arguments_are_reported():
    f, x = Var("f"), Var("x")
    expr = Let(f, Function((x,), x), call("add", f, const(1)))
    with pytest.raises(ExecutionError, match="add: argument 0 must be a tensor.*function"):
        Interpreter().evaluate(expr)


def test_unbound_variables_and_unknown_globals_are_reported():
    with pytest.raises(ExecutionError, match="%ghost"):
        Interpreter().evaluate(call("add", Var("ghost"), const(1)))
    with pytest.raises(ExecutionError, match="no global function @missing"):
        Interpreter().evaluate(Call(GlobalVar("missing"), ()))
    with pytest.raises(ExecutionError, match="not a function"):
        Interpreter().evaluate(Call(const(1), ()))


# --- argument checking --------------------------------------------------------------------------------
def sym_module():
    n = SymDim("n")
    x, y = Var("x", TensorType((n, 2), F32)), Var("y", TensorType((n,), "int32"))
    return main_of([x, y], x)


def test_argument_dtype_mismatch_names_the_parameter():
    with pytest.raises(ExecutionError, match=r"parameter %y expects Tensor\[\(n\), int32\].*float32"):
        Interpreter(sym_module()).run("main", np.ones((3, 2), F32), np.ones(3, F32))


def test_argument_rank_and_static_dim_mismatch_are_shape_errors():
    with pytest.raises(ShapeError, match="parameter %x .*rank 2.*rank 1"):
        Interpreter(sym_module()).run("main", np.ones(3, F32), np.ones(3, "int32"))
    with pytest.raises(ShapeError, match="parameter %x .*dimension 1: expected 2, got 5"):
        Interpreter(sym_module()).run("main", np.ones((3, 5), F32), np.ones(3, "int32"))


def test_symbolic_dims_must_agree_across_parameters():
    out = Interpreter(sym_module()).run("main", np.ones((4, 2), F32), np.ones(4, "int32"))
    assert out.shape == (4, 2)
    with pytest.raises(ShapeError, match=r"parameter %y .*n = 5.*parameter %x has n = 4"):
        Interpreter(sym_module()).run("main", np.ones((4, 2), F32), np.ones(5, "int32"))


def test_python_values_are_converted_to_the_parameter_dtype_when_lossless():
    x, y = Var("x", scalar(F32)), Var("y", tensor(2, dtype="int64"))
    mod = main_of([x, y], Tuple((x, y)))
    it = Interpreter(mod)
    out = it.run("main", 1, [3, 4])
    assert out[0].dtype == np.float32 and out[0].shape == () and out[1].dtype == np.int64
    with pytest.raises(ExecutionError, match="parameter %y .*floating-point"):
        it.run("main", 1.0, [1.5, 2.0])
    with pytest.raises(ExecutionError, match="parameter %x .*boolean"):
        it.run("main", True, [1, 2])
    b = Var("b", scalar("int8"))
    with pytest.raises(ExecutionError, match="do not fit int8"):
        Interpreter(main_of([b], b)).run("main", 300)
    v = Var("v", tensor(Any(), dtype="int32"))
    empty = Interpreter(main_of([v], v)).run("main", [])
    assert empty.shape == (0,) and empty.dtype == np.int32
    with pytest.raises(ExecutionError, match="parameter %v expects a tensor, got a tuple"):
        Interpreter(main_of([v], v)).run("main", (1, 2))


def test_ndarray_numpy_scalars_keywords_and_arity():
    x, y = Var("x", tensor(2)), Var("y", scalar(F32))
    it = Interpreter(main_of([x, y], call("multiply", x, y)))
    np.testing.assert_array_equal(it.run("main", NDArray(np.ones(2, F32)), y=np.float32(3)), [3, 3])
    with pytest.raises(ExecutionError, match="missing argument.*%y"):
        it.run("main", np.ones(2, F32))
    with pytest.raises(ExecutionError, match="takes 2 argument"):
        it.run("main", 1, 2, 3)
    with pytest.raises(ExecutionError, match="no parameter named 'z'"):
        it.run("main", np.ones(2, F32), z=1)
    with pytest.raises(ExecutionError, match="expects a tensor"):
        it.run("main", "hello", 1.0)
    with pytest.raises(ExecutionError, match="expects a tuple"):
        Interpreter(main_of([Var("t", TupleType((scalar(),)))], const(0))).run("main", 1)


def test_unannotated_parameters_take_default_dtypes():
    x = Var("x")
    out = Interpreter(main_of([x], x)).run("main", 1.5)
    assert out.dtype == np.float32
    assert Interpreter(main_of([x], x)).run("main", 2).dtype == np.int32


# --- executors ----------------------------------------------------------------------------------------
def test_debug_executor_returns_ndarrays_tuples_and_adts():
    x = Var("x", tensor(Any()))
    body = Tuple((call("negative", x), Tuple((x,)), Call(CONS, (x, Call(NIL, ())))))
    mod = IRModule(type_definitions={LIST: LIST_DEF})
    mod.add("main", Function((x,), body))
    out = create_executor("debug", mod).evaluate()(np.arange(3, dtype=F32))
    assert isinstance(out, tuple) and isinstance(out[0], NDArray) and isinstance(out[1], tuple)
    np.testing.assert_array_equal(out[0].numpy(), -np.arange(3))
    assert isinstance(out[2], ADT) and isinstance(out[2].fields[0], NDArray)


def test_debug_executor_binds_params_and_keywords():
    x, w = Var("x", tensor(2)), Var("w", tensor(2))
    mod = main_of([x, w], call("multiply", x, w))
    ex = create_executor("debug", mod, params={"w": np.array([2, 3], F32)})
    f = ex.evaluate()
    np.testing.assert_array_equal(f(x=np.ones(2, F32)).numpy(), [2, 3])
    assert len(ex.mod["main"].params) == 1
    with pytest.raises(TypeInferenceError, match="parameter %w"):
        create_executor("debug", mod, params={"w": np.ones(3, F32)})
    with pytest.raises(TypeInferenceError, match="cannot bind v"):
        create_executor("debug", mod, params={"v": np.ones(2, F32)})


def test_executor_evaluate_expressions_and_functions():
    ex = create_executor("debug")
    out = ex.evaluate(call("add", const(1.0), const(2.0)))
    assert isinstance(out, NDArray) and out.numpy() == np.float32(3)
    a = Var("a", scalar())
    f = ex.evaluate(Function((a,), call("add", a, a)))
    assert f(21).numpy() == 42
    assert ex.evaluate(const(5)).numpy() == 5


def test_constant_results_are_writable_copies():
    out = create_executor("debug", main_of([], const(np.ones(2, F32)))).evaluate()()
    out.numpy()[0] = 5  # would fail on the constant's read-only buffer


def test_unknown_executor_kind():
    with pytest.raises(UnsupportedError, match="unknown executor kind"):
        create_executor("jit", IRModule())


def test_tv_create_executor_is_the_same_function():
    assert tv.create_executor is create_executor


# --- the shared program suite ----------------------------------------------------------------------------
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_program_suite_on_the_interpreter(program: Program):
    mod = program.parse()
    args = program.args_fn()
    f = create_executor("debug", mod).evaluate(program.entry)
    if program.error is not None:
        error_type, fragment = program.error
        with pytest.raises(error_type, match=fragment):
            f(*args)
        return
    result = f(*program.args_fn())  # fresh arguments: the program must not depend on aliasing
    if program.expected_fn is not None:
        check_result(result, program.expected_fn(*args), mod, rtol=program.rtol, atol=program.atol)


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_program_suite_type_checks_and_kernels_fit_the_inferred_types(program: Program):
    """After InferType every op call carries its type; the interpreter then checks each kernel's
    output dtype and static dims against it, so the suite also cross-checks ops and type relations."""
    infer_type = pytest.importorskip("tensorvm.transform.infer_type")
    mod = infer_type.InferType()(program.parse())
    args = program.args_fn()
    f = create_executor("debug", mod).evaluate(program.entry)
    if program.error is not None:
        with pytest.raises(program.error[0], match=program.error[1]):
            f(*args)
    elif program.expected_fn is not None:
        check_result(f(*args), program.expected_fn(*args), mod, rtol=program.rtol, atol=program.atol)
    else:
        f(*args)


def test_vm_executor_compiles_binds_keywords_and_converts_results(monkeypatch):
    """The VM itself is tested elsewhere; here a stand-in VM checks the executor's plumbing."""
    vm_package = pytest.importorskip("tensorvm.vm")
    compiled = []

    class FakeVM:
        def __init__(self, exe):
            self.exe = exe

        def __getitem__(self, name):
            mod, params = self.exe
            interpreter = Interpreter(create_executor("debug", mod, params=params).mod)
            return lambda *args: interpreter.run(name, *args)

    def fake_compile(mod, target="python", params=None):
        compiled.append((target, dict(params or {})))
        return (mod, params)

    monkeypatch.setattr(vm_package, "compile", fake_compile)
    monkeypatch.setattr(vm_package, "VirtualMachine", FakeVM)
    x, w = Var("x", tensor(Any())), Var("w", tensor(Any()))
    mod = main_of([x, w], Tuple((call("multiply", x, w), x)))
    f = create_executor("vm", mod, target="c", params={"w": np.array([2, 3], F32)}).evaluate()
    out = f(x=np.ones(2, F32))
    assert len(compiled) == 1 and compiled[0][0] == "c"
    np.testing.assert_array_equal(compiled[0][1]["w"], [2, 3])
    assert isinstance(out, tuple) and isinstance(out[0], NDArray)
    np.testing.assert_array_equal(out[0].numpy(), [2, 3])
    with pytest.raises(ExecutionError, match="missing argument"):
        f()


def test_vm_and_debug_executors_agree_through_the_front_door():
    pytest.importorskip("tensorvm.vm")
    x, w = Var("x", tensor(Any(), 2)), Var("w", tensor(1, 2))
    mod = main_of([x, w], Tuple((call("add", x, w), call("multiply", x, w))))
    params = {"w": np.array([[2, 3]], F32)}
    data = np.arange(6, dtype=F32).reshape(3, 2)
    results = [create_executor(kind, mod, params=params).evaluate()(x=data) for kind in ("debug", "vm")]
    for result in results:
        check_result(result, (data + params["w"], data * params["w"]))


def test_nullary_constructor_built_in_python_is_a_value():
    mod = tv.parse("def @main(%l: List[int32]) -> int32 { @length(%l) }")
    cons, nil = mod.constructor("Cons"), mod.constructor("Nil")
    run = tv.create_executor("debug", mod).evaluate()
    assert int(run(nil()).numpy()) == 0
    assert int(run(cons(np.int32(1), cons(np.int32(2), nil.value()))).numpy()) == 2


def test_a_function_result_contradicting_its_declared_static_dims_is_a_shape_error_everywhere():
    """@f declares -> Tensor[(2, 3)] over a body of type (?, 3) and returns (4, 3): the interpreter checks every
    function's result against its declared static dims, as it does @main's and the parameters'; the VM's
    kernels check the static dims they were built for on target python too, as the C kernels do (the
    interpreter and target python had summed the (4, 3) to a number, target c had refused)."""
    import tensorvm as tv
    from tensorvm.errors import ShapeError

    mod = tv.parse("def @f(%x: Tensor[(?, 3), float32]) -> Tensor[(2, 3), float32] { concatenate((%x, %x)) }\n"
                   "def @main(%x: Tensor[(2, 3), float32]) { sum(@f(%x)) }")
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ShapeError, match="the result of @f is Tensor"):
        tv.create_executor("debug", mod).evaluate()(x)
    for target, mode in (("python", "bytecode"), ("python", "compiled"), ("c", "bytecode"), ("c", "native")):
        with pytest.raises(ShapeError, match=r"argument p0|argument 0"):
            tv.vm.VirtualMachine(tv.vm.compile(mod, target=target, exec_mode=mode)).run(x)
