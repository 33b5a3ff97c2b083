"""Malformed or extreme text fails cleanly: a ParseError with line/column (or a TypeInferenceError),
never AttributeError, ValueError or RecursionError; deep-but-accepted programs and long let chains
go through the printer, structural equality, type inference, the interpreter and the VM."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorvm as tv
from tensorvm.errors import ParseError, TypeInferenceError
from tensorvm.ir.parser import MAX_NESTING, parse_expr
from tensorvm.ir.structural import structural_equal
from tensorvm.transform.infer_type import MAX_TYPE_NESTING, infer_expr, infer_type


@pytest.mark.parametrize("text, column, words", [
    ("é", 1, ["unexpected character 'é'"]),
    ("def @main() { 1f + é }", 20, ["unexpected character"]),
    ("%x.٣", 4, ["unexpected character '٣'"]),   # an Arabic-Indic digit after '.'
    ("1٣", 2, ["unexpected character '٣'"]),  # (int() would read it as 13)
    ("def @main() { ab\u00e9c }", 17, ["unexpected character 'é'"]),
])
def test_non_ascii_text_is_a_parse_error(text, column, words):
    with pytest.raises(ParseError) as info:
        tv.parse(text)
    assert (info.value.line, info.value.column) == (1, column)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("digits", [41, 4301, 100_000])
def test_huge_integer_literals_are_parse_errors(digits):
    with pytest.raises(ParseError, match=f"{digits} digits is out of range"):
        tv.parse("def @main() { " + "1" * digits + " }")


def test_long_float_literals_still_parse():
    mod = tv.parse("def @main() { 1." + "5" * 5000 + " }")
    assert tv.create_executor("debug", mod).evaluate()().numpy() == np.float32(14 / 9)


def _nested(kind: str, depth: int) -> tuple[str, list]:
    """A program nesting ``kind`` ``depth`` deep and its arguments; every one evaluates to 1f."""
    if kind == "parens":
        return "def @main() { " + "(" * depth + "1f" + ")" * depth + " }", []
    if kind == "tuples":
        return "def @main() { " + "(" * depth + "1f" + ",).0" * depth + " }", []
    if kind == "calls":
        return "def @main() { " + "negative(" * depth + "1f" + ")" * depth + " }", []
    if kind == "lets":
        return ("def @main() { " + "".join(f"let %v{i} = " for i in range(depth)) + "1f"
                + "".join(f"; %v{i}" for i in reversed(range(depth))) + " }", [])
    if kind == "else_ifs":
        return "def @main(%c: bool) { " + "if (%c) { 2f } else " * depth + "{ 1f } }", [np.array(False)]
    if kind == "ifs":
        return "def @main(%c: bool) { " + "if (%c) { " * depth + "1f" + " } else { 2f }" * depth + " }", [np.array(True)]
    if kind == "fns":
        return "def @main() { " + "fn () { " * depth + "1f" + " }()" * depth + " }", []
    if kind == "matches":
        return "def @main() { " + "match (1f) { _ => " * depth + "1f" + " }" * depth + " }", []
    if kind == "types":
        return ("def @main(%x: " + "(" * depth + "float32" + ",)" * depth + ") { 1f }",
                [np.array(0, np.float32)])
    raise AssertionError(kind)


KINDS = ["parens", "tuples", "calls", "lets", "else_ifs", "ifs", "fns", "matches", "types"]


@pytest.mark.parametrize("kind", KINDS)
def test_nesting_beyond_the_limit_is_a_parse_error(kind):
    text, _ = _nested(kind, MAX_NESTING + 10)
    with pytest.raises(ParseError, match=f"at most {MAX_NESTING} nested levels") as info:
        tv.parse(text)
    assert info.value.line == 1 and info.value.column > MAX_NESTING


@pytest.mark.parametrize("kind", KINDS)
def test_deep_accepted_programs_print_compare_type_and_run(kind):
    depth = 150 if kind in ("tuples", "fns") else MAX_NESTING - 10  # (the VM pipeline is slow on those)
    text, args = _nested(kind, depth)
    mod = tv.parse(text)
    again = tv.parse(mod.astext())
    assert structural_equal(mod, again)
    infer_type(mod)
    if kind == "types":
        args = [_nested_value(depth)]
    want = np.float32(-1.0 if kind == "calls" and depth % 2 else 1.0)
    for executor in (tv.create_executor("debug", mod), None):
        if executor is None:
            vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="python"))
            got = vm.invoke("main", *args)
        else:
            got = executor.evaluate()(*args)
        assert np.asarray(got.numpy()) == want


def _nested_value(depth):
    value = np.array(0, np.float32)
    for _ in range(depth):
        value = (value,)
    return value


def _let_chain(n: int) -> str:
    return "".join(f"let %v{i} = {'1f' if i == 0 else f'add(%v{i - 1}, 1f)'};\n" for i in range(n)) + f"%v{n - 1}"


def test_long_let_chains_parse_type_print_and_run():
    # more lets than Python's recursion limit allows frames (20,000 here; a recursive walk takes a few frames per let)
    n = 8_000
    mod = tv.parse("def @main() {\n" + _let_chain(n) + "\n}")
    typed = infer_type(mod)
    assert typed.astext().count("let %v") == n
    assert tv.create_executor("debug", mod).evaluate()().numpy() == np.float32(n)


def _tuple_chain(n: int) -> str:
    """Each let wraps the previous value in a tuple: the type of %v{i} nests i + 1 tuples deep."""
    return "".join(f"let %v{i} = ({'1f' if i == 0 else f'%v{i - 1}'}, 2f);\n" for i in range(n)) + f"%v{n - 1}"


def test_let_chain_of_nested_tuples_types_in_linear_time():
    # each type contains the previous one: resolving every type afresh was quadratic (~5 s here at 500)
    n = MAX_TYPE_NESTING
    expr = parse_expr(_tuple_chain(n) + ".1")
    start = time.perf_counter()
    assert infer_expr(expr) == tv.TensorType((), "float32")
    assert time.perf_counter() - start < 1.5


def test_tuple_types_nesting_beyond_the_limit_are_a_type_error():
    mod = tv.parse("def @main() {\n" + _tuple_chain(MAX_TYPE_NESTING + 1) + "\n}")
    with pytest.raises(TypeInferenceError, match=f"nests {MAX_TYPE_NESTING + 1} tuples deep; expected at most"):
        infer_type(mod)


def test_the_deepest_tuple_chain_prints_and_runs():
    n = 200
    mod = infer_type(tv.parse("def @main() {\n" + _tuple_chain(n) + "\n}"))
    assert structural_equal(tv.parse(mod.astext()), mod)
    value = tv.create_executor("debug", mod).evaluate()()
    for _ in range(n - 1):
        assert value[1].numpy() == np.float32(2)
        value = value[0]
    assert value[0].numpy() == np.float32(1)


# ---- fuzzing: mutated programs either parse (and type) or fail with the project's errors ----------

def _seed_texts() -> list[str]:
    from programs import PROGRAMS

    return [p.text for p in PROGRAMS][:40]


_ALPHABET = st.sampled_from(list("(){}[],;:=.%@#-+*/\"\\ \n\t0123456789aefnilx_?") + ["é", "٣", "\u0000", "\U0001F600",
                                                                                          "let ", "fn ", "if ", "match "])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_programs_fail_cleanly(data):
    texts = _seed_texts()
    text = texts[data.draw(st.integers(0, len(texts) - 1))]
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["insert", "delete", "duplicate", "replace"]))
        at = data.draw(st.integers(0, len(text)))
        end = min(len(text), at + data.draw(st.integers(0, 30)))
        if kind == "insert":
            text = text[:at] + data.draw(_ALPHABET) + text[at:]
        elif kind == "delete":
            text = text[:at] + text[end:]
        elif kind == "duplicate":
            text = text[:end] + text[at:end] * data.draw(st.integers(1, 50)) + text[end:]
        else:
            text = text[:at] + data.draw(_ALPHABET) + text[end:]
    try:
        infer_type(tv.parse(text))
    except (ParseError, TypeInferenceError):
        pass


@pytest.mark.parametrize("text, line, words", [
    # found by the mutation loop: the prelude's List (used here) also defines Cons -> was a ValueError
    ("type T[A] {\n  Cons(A, List[A]),\n}\ndef @main() { 1f }", 2, ["type List", "Cons"]),
    ("type Tensor[A] {\n  C(A),\n}\ndef @main() { 1f }", 1, ["'Tensor'", "built-in type"]),
    ("type float32 {\n  C,\n}\ndef @main() { 1f }", 1, ["'float32'", "built-in type"]),
])
def test_type_definitions_clashing_with_the_prelude_or_builtins(text, line, words):
    with pytest.raises(ParseError) as info:
        tv.parse(text)
    assert info.value.line == line
    for word in words:
        assert word in str(info.value)


def test_long_graph_binding_chain_compiles_for_the_vm():
    # %i = negative(%i-1): one call nested 8,000 deep; FuseOps built chained groups recursively
    n = 8_000
    text = ("def @main(%x: float32) {\n" + "".join(f"  %{i} = negative({'%x' if i == 0 else f'%{i - 1}'});\n"
                                                   for i in range(n)) + f"  %{n - 1}\n}}")
    mod = tv.parse(text)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="python"))
    assert vm.invoke("main", np.float32(2)).numpy() == np.float32(2 if n % 2 == 0 else -2)


@pytest.mark.parametrize("link", ["()", ".0"])
def test_a_chain_of_calls_or_projections_counts_towards_the_nesting_limit(link):
    """@main()()()... 20,000 links deep had parsed, and type inference then died of a RecursionError
    (its types nest as deep); a chain counts one level per link, like parentheses."""
    text = "def @main(%t: ((int32,),)) { @main" + link * 20_000 + " }"
    with pytest.raises(ParseError, match=f"at most {MAX_NESTING} nested levels"):
        tv.parse(text)
    assert tv.parse("def @main(%t: ((int32,),)) { %t.0.0 }")  # (a short chain parses)
