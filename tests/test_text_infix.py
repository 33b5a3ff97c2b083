"""Relay's infix operators (``%a + %b``, comparisons) and ``match %x { ... }`` without parentheses:
the calls they stand for, precedence and associativity, values against NumPy, the printer's round
trip and long chains."""

from __future__ import annotations

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.errors import ParseError
from tensorvm.ir.parser import MAX_NESTING, parse_expr
from tensorvm.ir.structural import structural_equal
from tensorvm.transform.infer_type import infer_type

T4 = "Tensor[(4), float32]"
I4 = "Tensor[(4), int32]"

# operator -> (the op it calls, NumPy)
OPERATORS = {
    "+": ("add", np.add), "-": ("subtract", np.subtract), "*": ("multiply", np.multiply),
    "/": ("divide", np.divide), "<": ("less", np.less), ">": ("greater", np.greater),
    "<=": ("less_equal", np.less_equal), ">=": ("greater_equal", np.greater_equal),
    "==": ("equal", np.equal), "!=": ("not_equal", np.not_equal),
}

A = np.array([1.5, -2.0, 3.0, 4.0], np.float32)
B = np.array([1.5, 4.0, -0.5, 8.0], np.float32)
C = np.array([2.0, 0.25, 3.0, -1.0], np.float32)


def _same(text_a: str, text_b: str) -> None:
    a, b = tv.parse(text_a), tv.parse(text_b)
    assert structural_equal(a, b), f"{a}\n!=\n{b}"


def _run(mod, *args):
    return tv.create_executor("debug", mod).evaluate()(*args).numpy()


@pytest.mark.parametrize("symbol", list(OPERATORS))
def test_each_operator_is_the_call_and_computes_as_numpy(symbol):
    name, numpy_fn = OPERATORS[symbol]
    params = f"%a: {T4}, %b: {T4}"
    text = f"def @main({params}) {{ %a {symbol} %b }}"
    _same(text, f"def @main({params}) {{ {name}(%a, %b) }}")
    mod = tv.parse(text)
    np.testing.assert_allclose(_run(mod, A, B), numpy_fn(A, B))
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="python"))
    np.testing.assert_allclose(vm.invoke("main", A, B).numpy(), numpy_fn(A, B))


@pytest.mark.parametrize("infix, calls", [
    ("%a + %b * %c", "add(%a, multiply(%b, %c))"),
    ("%a * %b + %c", "add(multiply(%a, %b), %c)"),
    ("%a - %b - %c", "subtract(subtract(%a, %b), %c)"),
    ("%a / %b / %c", "divide(divide(%a, %b), %c)"),
    ("%a / %b * %c", "multiply(divide(%a, %b), %c)"),
    ("%a - %b + %c", "add(subtract(%a, %b), %c)"),
    ("(%a + %b) * %c", "multiply(add(%a, %b), %c)"),
    ("%a - (%b - %c)", "subtract(%a, subtract(%b, %c))"),
    ("%a + %b < %c * %a", "less(add(%a, %b), multiply(%c, %a))"),
    ("%a < %b == %b > %c", "equal(less(%a, %b), greater(%b, %c))"),
    ("%a <= %b != %a >= %c", "not_equal(less_equal(%a, %b), greater_equal(%a, %c))"),
    ("%a < %b < %c", "less(less(%a, %b), %c)"),  # left-associative like the rest (a type error here)
])
def test_precedence_and_left_associativity(infix, calls):
    params = f"%a: {T4}, %b: {T4}, %c: {T4}"
    _same(f"def @main({params}) {{ {infix} }}", f"def @main({params}) {{ {calls} }}")


@pytest.mark.parametrize("infix, grouped", [
    # TVM's associativity cases, on int32 scalars
    ("1 * 1 + 1 < 1 == True", "(((1 * 1) + 1) < 1) == True"),
    ("True == 1 < 1 + 1 * 1", "True == (1 < (1 + (1 * 1)))"),
    ("2 - 3 - 4 == 5 / 6 / 7", "((2 - 3) - 4) == ((5 / 6) / 7)"),
])
def test_scalar_expressions_group_like_tvm(infix, grouped):
    assert structural_equal(parse_expr(infix), parse_expr(grouped))
    assert not structural_equal(parse_expr("1 * 1 + 1"), parse_expr("1 * (1 + 1)"))


@pytest.mark.parametrize("text, value", [("--10", 10), ("---10", -10), ("-10", -10), ("(--2.5f, 1)", 2.5),
                                         ("--inff", np.inf), ("7--1", 8), ("7---1", 6), ("7 - --1", 6)])
def test_a_run_of_minus_signs_belongs_to_the_literal(text, value):
    # as in TVM, an odd run negates the number; after an operand the first '-' subtracts
    got = tv.create_executor("debug", tv.parse(text)).evaluate()()
    got = got[0] if isinstance(got, tuple) else got
    assert got.numpy() == value


@pytest.mark.parametrize("infix, want", [
    ("%a + %b * %c", A + B * C),
    ("%a - %b - %c", (A - B) - C),
    ("%a / %b / %c", (A / B) / C),
    ("(%a + %b) * %c - %a / %b", (A + B) * C - A / B),
    ("%a-1f*%b", A - np.float32(1) * B),  # no spaces: '-' after an operand subtracts
    ("%a * -2f - -0.5f", A * np.float32(-2) - np.float32(-0.5)),
])
def test_arithmetic_values(infix, want):
    mod = tv.parse(f"def @main(%a: {T4}, %b: {T4}, %c: {T4}) {{ {infix} }}")
    np.testing.assert_allclose(_run(mod, A, B, C), want, rtol=1e-6)


def test_infix_mixes_with_calls_tuples_projections_lets_and_ifs():
    text = f"""
    def @main(%a: {T4}, %b: {T4}, %c: {T4}) {{
      %0 = (%a + %b, %c * 2f);
      let %s = %0.0 - %0.1;
      let %t = (%s, negative(%a + %c));
      let %m = maximum(%t.0 * %t.1, %b / 4f) + sum(%a - %b);
      if (sum(%m) > 0f) {{ %m * %m }} else {{ %m - %m }}
    }}
    """
    mod = tv.parse(text)
    s = (A + B) - C * 2
    m = np.maximum(s * -(A + C), B / 4) + np.sum(A - B)
    want = m * m if np.sum(m) > 0 else m - m
    np.testing.assert_allclose(_run(mod, A, B, C), want, rtol=1e-6)
    _same(text, f"""
    def @main(%a: {T4}, %b: {T4}, %c: {T4}) {{
      %0 = (add(%a, %b), multiply(%c, 2f));
      let %s = subtract(%0.0, %0.1);
      let %t = (%s, negative(add(%a, %c)));
      let %m = add(maximum(multiply(%t.0, %t.1), divide(%b, 4f)), sum(subtract(%a, %b)));
      if (greater(sum(%m), 0f)) {{ multiply(%m, %m) }} else {{ subtract(%m, %m) }}
    }}
    """)


@pytest.mark.parametrize("text", [
    f"def @main(%a: {T4}, %b: {T4}) {{ %a + %b * %a - %b / %a }}",
    f"def @main(%a: {I4}, %b: {I4}) {{ (%a < %b, %a - 1 >= %b, %a == %b, %a != -1) }}",
    "def @f(%x: int32) -> int32 { if (%x <= 0) { 0 } else { %x + @f(%x - 1) } }\n"
    "def @main() -> int32 { @f(10) * 2 }",
])
def test_printed_programs_reparse_to_the_same_structure(text):
    mod = tv.parse(text)
    again = tv.parse(mod.astext())
    assert structural_equal(mod, again)
    typed = infer_type(mod)
    assert structural_equal(tv.parse(typed.astext()), mod)


def test_recursive_program_with_infix_runs_on_interpreter_and_vm():
    mod = tv.parse("def @f(%x: int32) -> int32 { if (%x <= 0) { 0 } else { %x + @f(%x - 1) } }\n"
                   "def @main(%n: int32) -> int32 { @f(%n) * 2 }")
    n = np.array(10, np.int32)
    assert _run(mod, n) == 2 * sum(range(11))
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="python"))
    assert vm.invoke("main", n).numpy() == 2 * sum(range(11))


def test_a_chain_of_10000_terms_parses_types_prints_and_runs():
    # a chain does not nest in the parser (explicit stacks), like a sequence of bindings; the tree it
    # builds is as deep as a graph-binding chain of as many ops, which every later pass handles
    n = 10_000
    mod = tv.parse(f"def @main(%a: {T4}) {{ " + " + ".join(["%a"] * n) + " }")
    typed = infer_type(mod)
    assert structural_equal(tv.parse(typed.astext()), mod)
    small = np.array([1, 2, 3, 4], np.float32) / 1024  # exact in float32 at every step
    np.testing.assert_array_equal(_run(mod, small), small * n)
    # operators of other precedences in a long chain, against NumPy step by step
    terms = ["%a * %b", "%a / %b", "%a - %b"] * 300
    mod = tv.parse(f"def @main(%a: {T4}, %b: {T4}) {{ " + " + ".join(terms) + " }")
    want = A * B
    for term in terms[1:]:
        want = want + {"%a * %b": A * B, "%a / %b": A / B, "%a - %b": A - B}[term]
    np.testing.assert_allclose(_run(mod, A, B), want, rtol=1e-5)


def test_parentheses_in_a_chain_still_count_towards_the_nesting_limit():
    text = f"def @main(%a: {T4}) {{ " + "%a + (" * (MAX_NESTING + 10) + "%a" + ")" * (MAX_NESTING + 10) + " }"
    with pytest.raises(ParseError, match=f"at most {MAX_NESTING} nested levels"):
        tv.parse(text)


@pytest.mark.parametrize("text, words", [
    (f"def @main(%a: {T4}) {{ -%a }}", ["no unary minus", "negative(e)"]),
    (f"def @main(%a: {T4}) {{ %a * - 1f }}", ["no unary minus"]),
    (f"def @main(%a: {T4}) {{ %a + }}", ["expected an expression but found '}'"]),
    (f"def @main(%a: {T4}) {{ %a % %a }}", ["expected a name after '%'"]),  # Relay has no '%' operator
    (f"def @main(%a: {T4}) {{ %a => %a }}", ["expected '}' to close the block but found '=>'"]),
    ("def @main(%l: List[int32]) { match %l + 1 { _ => 0 } }", ["expected '{' to open the match clauses"]),
])
def test_malformed_infix_is_a_parse_error(text, words):
    with pytest.raises(ParseError) as info:
        tv.parse(text)
    for word in words:
        assert word in str(info.value)
    assert info.value.line == 1


# ---- match without parentheses ------------------------------------------------------------------

def test_match_without_parentheses_is_the_same_match():
    body = "{ Cons(%h, _) => %h + 1, Nil => 0 }"
    _same(f"def @main(%l: List[int32]) -> int32 {{ match %l {body} }}",
          f"def @main(%l: List[int32]) -> int32 {{ match (%l) {body} }}")
    mod = tv.parse(f"def @main(%l: List[int32]) -> int32 {{ match %l {body} }}")
    cons, nil = mod.constructor("Cons"), mod.constructor("Nil")
    assert _run(mod, cons(np.array(41, np.int32), nil())) == 42
    assert _run(mod, nil()) == 0


def test_match_scrutinee_may_be_a_projection_a_call_or_a_tuple():
    text = """
    def @main(%t: (int32, List[int32])) -> int32 {
      let %a = match? %t.1 { Cons(%h, _) => %h };
      let %b = match @len(%t.1) { %n => %n * 10 };
      let %c = match (%t.0, %a) { (%x, %y) => %x - %y };
      %a + %b + %c
    }
    def @len(%l: List[int32]) -> int32 { match %l { Cons(_, %r) => 1 + @len(%r), Nil => 0 } }
    """
    mod = tv.parse(text)
    assert "match? (%t.1)" in mod.astext()
    cons, nil = mod.constructor("Cons"), mod.constructor("Nil")
    lst = cons(np.array(7, np.int32), cons(np.array(8, np.int32), nil()))
    # a = 7, b = 20, c = 5 - 7
    assert _run(mod, (np.array(5, np.int32), lst)) == 7 + 20 + (5 - 7)
    assert structural_equal(tv.parse(mod.astext()), mod)


# ---- statement sequences: ``e; rest`` ------------------------------------------------------------

def test_a_statement_sequence_is_a_let_of_an_unused_variable():
    _same("def @main() { (); () }", "def @main() { let %_ = (); () }")
    _same("def @main() { 1; 2f; (3, 4) }", "def @main() { let %_ = 1; let %_ = 2f; (3, 4) }")
    # a let inside a value still ends at the value's ';'
    _same("def @main() { let %a = let %b = 1; %b; %a }", "def @main() { let %a = (let %b = 1; %b); %a }")
    with pytest.raises(ParseError, match="expected an expression but found '}'"):
        tv.parse("def @main() { 1; }")


def test_reference_writes_as_statements_run():
    mod = tv.parse("""
    def @main(%x: float32) {
      %0 = ref(%x);
      ref_write(%0, %x + 1f);
      ref_write(%0, ref_read(%0) * 3f);
      ref_read(%0)
    }""")
    assert _run(mod, np.float32(2)) == np.float32((2 + 1) * 3)
    assert structural_equal(tv.parse(mod.astext()), mod)


def test_tvm_style_match_arm_with_a_statement_runs_on_the_interpreter_and_the_vm():
    text = """
    def @len[A](%xs: List[A]) -> int32 {
      match? %xs {
        Cons(_, %rest: List[A]) => {
          ();
          1 + @len(%rest)
        },
        Nil => 0,
      }
    }
    def @main(%xs: List[float32]) -> int32 { @len(%xs) }
    """
    mod = tv.parse(text)
    cons, nil = mod.constructor("Cons"), mod.constructor("Nil")
    xs = cons(np.float32(1), cons(np.float32(2), cons(np.float32(3), nil())))
    assert _run(mod, xs) == 3
    assert tv.vm.VirtualMachine(tv.vm.compile(mod)).invoke("main", xs).numpy() == 3
    curried = tv.parse("""
    def @main() -> int32 {
      let %mult = fn (%x: int32) { fn (%y: int32) { %x * %y } };
      %mult(2);
      %mult(6)(7)
    }""")
    assert _run(curried) == 42
