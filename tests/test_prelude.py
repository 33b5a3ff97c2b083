"""The prelude's functions, one by one, on the reference interpreter (values computed by hand or
with plain Python lists)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorvm as tv
from tensorvm.errors import ExecutionError
from tensorvm.interpreter import Interpreter
from tensorvm.prelude import (
    PRELUDE_FUNCTIONS,
    PRELUDE_TYPES,
    make_list,
    make_none,
    make_some,
    make_tree,
    prelude_module,
    prelude_text,
    to_python_list,
    tree_to_python,
)
from tensorvm.runtime.object import ADT

HEADER = '#[version = "0.0.5"]\n'


@functools.cache
def interpreter_for(text: str) -> Interpreter:
    return Interpreter(tv.parse(HEADER + text))


def run(text: str, *args):
    return interpreter_for(text).run("main", *args)


def ints(value) -> list[int]:
    return [int(v) for v in to_python_list(value)]


def i32_list(values):
    return make_list([np.int32(v) for v in values])


INT_LIST_MAIN = "def @main(%xs: List[int32]) {{ {body} }}"


def on_int_list(body: str, values):
    return run(INT_LIST_MAIN.format(body=body), i32_list(values))


# --- the module itself -------------------------------------------------------------------------------
def test_prelude_defines_the_relay_types_and_functions():
    mod = prelude_module()
    assert sorted(mod.global_names) == sorted(PRELUDE_FUNCTIONS)
    assert {t.name for t in mod.type_definitions} == set(PRELUDE_TYPES)
    tags = {c.name: c.tag for tdef in mod.type_definitions.values() for c in tdef.constructors}
    assert tags == {"Cons": 0, "Nil": 1, "Some": 0, "None": 1, "Rose": 0}
    # The Python helpers build values with the same tags the parsed constructors carry.
    assert make_list([1]).tag == tags["Cons"] and make_list([]).tag == tags["Nil"]
    assert make_some(1).tag == tags["Some"] and make_none().tag == tags["None"]


def test_prelude_module_is_parsed_once_and_handed_out_as_copies():
    first, second = prelude_module(), prelude_module()
    assert first is not second and first["map"] is second["map"]
    first.add("extra", first["id"])
    assert "extra" not in prelude_module()


def test_prelude_source_ships_as_package_data():
    text = prelude_text()
    assert "type List[A]" in text and "def @map" in text


def test_programs_get_the_prelude_by_default():
    mod = tv.parse(HEADER + "def @main() { @length(Cons(1, Nil)) }")
    assert Interpreter(mod).run("main") == 1


# --- Python helpers -----------------------------------------------------------------------------------
def test_make_list_and_to_python_list_round_trip_long_lists():
    values = list(range(20_000))
    assert to_python_list(make_list(values)) == values
    with pytest.raises(TypeError, match="List value"):
        to_python_list(make_some(1))


def test_make_tree_and_tree_to_python():
    tree = make_tree(1, [make_tree(2), make_tree(3, [make_tree(4)])])
    assert tree_to_python(tree) == (1, [(2, []), (3, [(4, [])])])


# --- functions ----------------------------------------------------------------------------------------
def test_id_compose_flip():
    text = """
def @main(%x: int32) {
  let %inc = fn (%v: int32) -> int32 { add(%v, 1) };
  let %dbl = fn (%v: int32) -> int32 { multiply(%v, 2) };
  let %minus = fn (%a: int32, %b: int32) -> int32 { subtract(%a, %b) };
  (@id(%x), @compose(%inc, %dbl)(%x), @compose(%dbl, %inc)(%x), @flip(%minus)(%x, 10))
}"""
    out = run(text, 7)
    assert [int(v) for v in out] == [7, 15, 16, 3]


def test_hd_tl_nth_update():
    out = on_int_list("(@hd(%xs), @tl(%xs), @nth(%xs, 2), @update(%xs, 1, 42))", [5, 6, 7, 8])
    assert int(out[0]) == 5 and ints(out[1]) == [6, 7, 8] and int(out[2]) == 7
    assert ints(out[3]) == [5, 42, 7, 8]


@pytest.mark.parametrize("body", ["@hd(%xs)", "@tl(%xs)", "@nth(%xs, 0)", "@foldr1(fn (%a: int32, %b: int32) -> int32 { %a }, %xs)"])
def test_partial_functions_fail_on_the_empty_list(body):
    with pytest.raises(ExecutionError, match="no clause matches"):
        on_int_list(body, [])


def test_nth_out_of_range_fails():
    with pytest.raises(ExecutionError, match="no clause matches"):
        on_int_list("@nth(%xs, 3)", [1, 2, 3])


def test_map_foldl_foldr_foldr1():
    out = on_int_list("""
  let %sq = fn (%v: int32) -> int32 { multiply(%v, %v) };
  let %minus = fn (%a: int32, %b: int32) -> int32 { subtract(%a, %b) };
  (@map(%sq, %xs), @foldl(%minus, 100, %xs), @foldr(%minus, 100, %xs), @foldr1(%minus, %xs))""", [1, 2, 3])
    assert ints(out[0]) == [1, 4, 9]
    assert int(out[1]) == ((100 - 1) - 2) - 3            # 94
    assert int(out[2]) == 1 - (2 - (3 - 100))            # -98
    assert int(out[3]) == 1 - (2 - 3)                    # 2


def test_foldl_order_builds_a_reversed_list():
    out = on_int_list("@foldl(fn (%acc: List[int32], %v: int32) -> List[int32] { Cons(%v, Cons(%v, %acc)) }, Nil, %xs)",
                      [1, 2, 3])
    assert ints(out) == [3, 3, 2, 2, 1, 1]


def test_concat_filter_rev_zip():
    out = on_int_list("""
  let %odd = fn (%v: int32) -> bool { equal(mod(%v, 2), 1) };
  (@concat(%xs, @rev(%xs)), @filter(%odd, %xs), @zip(%xs, @tl(%xs)))""", [1, 2, 3, 5])
    assert ints(out[0]) == [1, 2, 3, 5, 5, 3, 2, 1]
    assert ints(out[1]) == [1, 3, 5]
    # zip stops at the shorter list.
    assert [(int(a), int(b)) for a, b in to_python_list(out[2])] == [(1, 2), (2, 3), (3, 5)]


def test_map_accumr_and_map_accuml_follow_relay():
    out = on_int_list("""
  let %running = fn (%acc: int32, %v: int32) -> (int32, int32) { (add(%acc, %v), multiply(%v, 10)) };
  (@map_accumr(%running, 0, %xs), @map_accuml(%running, 0, %xs))""", [1, 2, 3])
    right, left = out
    assert int(right[0]) == 6 and ints(right[1]) == [10, 20, 30]
    # Relay's map_accuml hands back the outputs in reverse order.
    assert int(left[0]) == 6 and ints(left[1]) == [30, 20, 10]
    # With the accumulator in the outputs the direction shows: running sums from the right / left.
    out = on_int_list("""
  let %running = fn (%acc: int32, %v: int32) -> (int32, int32) { (add(%acc, %v), add(%acc, %v)) };
  (@map_accumr(%running, 0, %xs), @map_accuml(%running, 0, %xs))""", [1, 2, 3])
    assert ints(out[0][1]) == [6, 5, 3] and ints(out[1][1]) == [6, 3, 1]


def test_unfoldr_and_unfoldl():
    text = """
def @main(%n: int32) {
  let %count_down = fn (%i: int32) -> Option[(int32, int32)] {
    if (equal(%i, 0)) { None } else { Some((subtract(%i, 1), multiply(%i, 10))) }
  };
  (@unfoldr(%count_down, %n), @unfoldl(%count_down, %n))
}"""
    right, left = run(text, 4)
    assert ints(right) == [40, 30, 20, 10] and ints(left) == [10, 20, 30, 40]
    right, left = run(text, 0)
    assert ints(right) == [] and ints(left) == []


def test_sum_length_all_any():
    body = """
  let %positive = fn (%v: int32) -> bool { greater(%v, 0) };
  (@sum(%xs), @length(%xs), @all(%positive, %xs), @any(%positive, %xs))"""
    assert [int(v) for v in on_int_list(body, [3, -1, 4])] == [6, 3, 0, 1]
    assert [int(v) for v in on_int_list(body, [3, 1])] == [4, 2, 1, 1]
    assert [int(v) for v in on_int_list(body, [])] == [0, 0, 1, 0]


def test_tmap_and_size_on_a_tree_argument():
    text = """
def @main(%t: Tree[int32]) {
  (@size(%t), @tmap(fn (%v: int32) -> int32 { add(%v, 100) }, %t))
}"""
    leaf = make_tree(np.int32(3))
    tree = make_tree(np.int32(1), [make_tree(np.int32(2), [leaf, leaf]), leaf])
    size, mapped = run(text, tree)
    assert int(size) == 5

    def as_ints(node):
        value, children = node
        return int(value), [as_ints(c) for c in children]

    assert as_ints(tree_to_python(mapped)) == (101, [(102, [(103, []), (103, [])]), (103, [])])


def test_iterate():
    text = """
def @main(%x: int32, %n: int32) {
  @iterate(fn (%v: int32) -> int32 { multiply(%v, 3) }, %n)(%x)
}"""
    assert int(run(text, 2, 0)) == 2
    assert int(run(text, 2, 4)) == 2 * 3**4


def test_option_values_from_python():
    text = """
def @main(%o: Option[float32]) -> float32 {
  match (%o) { Some(%v) => %v, None => -1f, }
}"""
    assert run(text, make_some(np.float32(2.5))) == np.float32(2.5)
    assert run(text, make_none()) == np.float32(-1)
    with pytest.raises(ExecutionError, match="float32.*float64"):
        run(text, make_some(np.float64(2.5)))


def test_tail_recursive_prelude_loops_handle_long_lists():
    values = np.arange(10_000, dtype=np.int32)
    out = on_int_list("(@length(%xs), @sum(%xs), @hd(@rev(%xs)))", values)
    assert [int(v) for v in out] == [10_000, int(values.sum()), 9_999]


@settings(max_examples=30, deadline=None)
@given(values=st.lists(st.integers(-50, 50), max_size=12), k=st.integers(-50, 50))
def test_list_functions_agree_with_python_lists(values, k):
    body = """
  let %gt = fn (%v: int32) -> bool { greater(%v, %k) };
  let %shift = fn (%v: int32) -> int32 { subtract(%v, %k) };
  (@sum(%xs), @length(%xs), @rev(%xs), @filter(%gt, %xs), @map(%shift, %xs), @concat(%xs, %xs),
   @any(%gt, %xs), @all(%gt, %xs))"""
    text = "def @main(%xs: List[int32], %k: int32) {" + body + "}"
    out = run(text, i32_list(values), k)
    assert int(out[0]) == sum(values) and int(out[1]) == len(values)
    assert ints(out[2]) == values[::-1]
    assert ints(out[3]) == [v for v in values if v > k]
    assert ints(out[4]) == [v - k for v in values]
    assert ints(out[5]) == values + values
    assert bool(out[6]) == any(v > k for v in values) and bool(out[7]) == all(v > k for v in values)


def test_adt_values_flow_back_unchanged():
    out = on_int_list("%xs", [1, 2])
    assert isinstance(out, ADT) and out.constructor == "Cons" and ints(out) == [1, 2]


def test_a_program_redefining_what_a_prelude_function_it_uses_relies_on_is_refused():
    """The prelude's @length matches on the prelude's List and calls its @foldl: a program that defines its own
    List (constructors in another order) or @foldl and uses @length is a ParseError at its definition (it had
    mixed the two: the interpreter failed, the VM returned a count, the printed text read back differently);
    a program defining its own List or @foldl and using nothing of the prelude that needs them parses."""
    from tensorvm.errors import ParseError

    with pytest.raises(ParseError, match=r"2:3: type List is defined here and also by the prelude, whose @length"):
        tv.parse("type List[A] {\n  Nil,\n  Cons(A, List[A]),\n}\ndef @main() { @length(Cons(1, Nil)) }")
    with pytest.raises(ParseError, match=r"1:1: @foldl is defined here and also by the prelude, whose @length"):
        tv.parse("def @foldl(%x: int32) -> int32 { %x * 100 }\ndef @main() { (@foldl(2), @length(Cons(1, Nil))) }")
    own = tv.parse("type List[A] { Nil, Cons(A, List[A]), }\ndef @foldl(%x: int32) -> int32 { %x * 100 }\n"
                   "def @main() { match (Cons(@foldl(2), Nil)) { Cons(%x, _) => { %x }, Nil => { 0 }, } }")
    assert int(tv.create_executor("debug", own).evaluate()().numpy()) == 200
