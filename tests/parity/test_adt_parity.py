"""Parity with TVM's ADT tests (``test_vm.py``'s prelude list suite and ``test_adt.py``): the prelude's
functions, nested patterns, clause order, options, trees and user-defined ADTs, on every executor, with
answers computed on plain Python lists."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from parity_harness import KINDS, Runner
from programs import Con, check_result

from tensorvm.errors import ExecutionError
from tensorvm.prelude import make_list, make_tree
from tensorvm.runtime.object import ADT


def i32_list(values) -> ADT:
    return make_list([np.int32(v) for v in values])


def i32s(values) -> list:
    return [np.int32(v) for v in values]


INT_LIST = "def @main(%xs: List[int32]) {{ {body} }}"


def on_list(run, body: str, values):
    return run(INT_LIST.format(body=body), i32_list(values))


# --- constructors, hd, tl, nth, update ---------------------------------------------------------------
def test_list_constructor_builds_nested_cells(run):
    text = "def @main() -> List[int32] { Cons(3, Cons(2, Cons(1, Nil))) }"
    result = run(text)
    assert isinstance(result, ADT) and len(result.fields) == 2
    assert isinstance(result.fields[1], ADT) and len(result.fields[1].fields) == 2
    check_result(result, i32s([3, 2, 1]))


def test_hd(run):
    check_result(on_list(run, "@hd(%xs)", [5, 6]), np.int32(5))


def test_tl(run):
    check_result(on_list(run, "@tl(%xs)", [5, 6, 7]), i32s([6, 7]))


def test_tl_of_an_empty_list_is_an_error(run):
    with pytest.raises(ExecutionError):
        on_list(run, "@tl(%xs)", [])


def test_hd_of_an_empty_list_is_an_error(run):
    with pytest.raises(ExecutionError):
        on_list(run, "@hd(%xs)", [])


def test_nth(run):
    values = [10, 11, 12, 13]
    text = "def @main(%xs: List[int32], %n: int32) -> int32 { @nth(%xs, %n) }"
    for n in (0, 2, 3):
        check_result(run(text, i32_list(values), n), np.int32(values[n]))
    with pytest.raises(ExecutionError):
        run(text, i32_list(values), 4)


def test_update(run):
    text = "def @main(%xs: List[int32], %n: int32, %v: int32) { @update(%xs, %n, %v) }"
    check_result(run(text, i32_list([1, 2, 3]), 1, 20), i32s([1, 20, 3]))
    check_result(run(text, i32_list([1, 2, 3]), 0, -1), i32s([-1, 2, 3]))


# --- whole-list functions ----------------------------------------------------------------------------
def test_length(run):
    for values in ([], [4], [1, 2, 3, 4, 5]):
        check_result(on_list(run, "@length(%xs)", values), np.int32(len(values)))


def test_map(run):
    body = "@map(fn (%x: int32) -> int32 { multiply(%x, %x) }, %xs)"
    check_result(on_list(run, body, [1, -2, 3]), i32s([1, 4, 9]))


def test_foldl_and_foldr_keep_their_order(run):
    # subtraction is not associative: foldl(-, 0, [1,2,3]) = ((0-1)-2)-3; foldr(-, 0, ...) = 1-(2-(3-0))
    values = [1, 2, 3]
    foldl = on_list(run, "@foldl(fn (%acc: int32, %x: int32) -> int32 { subtract(%acc, %x) }, 0, %xs)", values)
    foldr = on_list(run, "@foldr(fn (%x: int32, %acc: int32) -> int32 { subtract(%x, %acc) }, 0, %xs)", values)
    check_result(foldl, np.int32(((0 - 1) - 2) - 3))
    check_result(foldr, np.int32(1 - (2 - (3 - 0))))


def test_foldr1(run):
    body = "@foldr1(fn (%x: int32, %acc: int32) -> int32 { subtract(%x, %acc) }, %xs)"
    check_result(on_list(run, body, [10, 4, 1]), np.int32(10 - (4 - 1)))


def test_sum(run):
    check_result(on_list(run, "@sum(%xs)", [3, 4, -10]), np.int32(-3))
    check_result(on_list(run, "@sum(%xs)", []), np.int32(0))


def test_filter(run):
    body = "@filter(fn (%x: int32) -> bool { greater(%x, 2) }, %xs)"
    check_result(on_list(run, body, [1, 5, 2, 3, 0]), i32s([5, 3]))


def test_zip_stops_at_the_shorter_list(run):
    text = "def @main(%xs: List[int32], %ys: List[float32]) { @zip(%xs, %ys) }"
    floats = [np.float32(0.5), np.float32(1.5)]
    result = run(text, i32_list([1, 2, 3]), make_list(floats))
    check_result(result, [(np.int32(1), floats[0]), (np.int32(2), floats[1])])


def test_rev(run):
    check_result(on_list(run, "@rev(%xs)", [1, 2, 3]), i32s([3, 2, 1]))


def test_concat(run):
    check_result(on_list(run, "@concat(%xs, Cons(9, Nil))", [1, 2]), i32s([1, 2, 9]))


def test_all_and_any(run):
    positive = "fn (%x: int32) -> bool { greater(%x, 0) }"
    body = f"(@all({positive}, %xs), @any({positive}, %xs))"
    check_result(on_list(run, body, [1, 2]), (np.bool_(True), np.bool_(True)))
    check_result(on_list(run, body, [1, -2]), (np.bool_(False), np.bool_(True)))
    check_result(on_list(run, body, []), (np.bool_(True), np.bool_(False)))


COUNT_DOWN = "fn (%n: int32) -> Option[(int32, int32)] { if (greater(%n, 0)) { Some((subtract(%n, 1), %n)) } " \
             "else { None } }"


def test_unfoldr_and_unfoldl(run):
    text = f"def @main(%n: int32) {{ (@unfoldr({COUNT_DOWN}, %n), @unfoldl({COUNT_DOWN}, %n)) }}"
    check_result(run(text, 3), (i32s([3, 2, 1]), i32s([1, 2, 3])))


def test_map_accumr_and_map_accuml(run):
    # running sums from either end; accuml returns its outputs last-first, as Relay's does
    step = "fn (%acc: int32, %x: int32) -> (int32, int32) { let %s = add(%acc, %x); (%s, %s) }"
    body = f"(@map_accumr({step}, 0, %xs), @map_accuml({step}, 0, %xs))"
    result = on_list(run, body, [1, 2, 3])
    check_result(result, ((np.int32(6), i32s([6, 5, 3])), (np.int32(6), i32s([6, 3, 1]))))


def test_tmap_and_size_on_a_rose_tree(run):
    text = """def @main(%t: Tree[int32]) {
  (@tmap(fn (%x: int32) -> int32 { multiply(%x, 10) }, %t), @size(%t))
}"""
    tree = make_tree(np.int32(1), [make_tree(np.int32(2)), make_tree(np.int32(3), [make_tree(np.int32(4))])])
    expected_tree = Con("Rose", np.int32(10), [Con("Rose", np.int32(20), []),
                                               Con("Rose", np.int32(30), [Con("Rose", np.int32(40), [])])])
    check_result(run(text, tree), (expected_tree, np.int32(4)), run.module(text))


def test_iterate_composes_a_function_n_times(run):
    text = "def @main(%n: int32, %x: int32) -> int32 { @iterate(fn (%v: int32) -> int32 { multiply(%v, 2) }, %n)(%x) }"
    check_result(run(text, 0, 3), np.int32(3))
    check_result(run(text, 4, 3), np.int32(48))


def test_compose_and_flip_and_id(run):
    text = """def @main(%x: int32) -> (int32, int32, int32) {
  let %minus = fn (%a: int32, %b: int32) -> int32 { subtract(%a, %b) };
  let %inc = fn (%a: int32) -> int32 { add(%a, 1) };
  let %neg = fn (%a: int32) -> int32 { negative(%a) };
  (@compose(%neg, %inc)(%x), @flip(%minus)(%x, 10), @id(%x))
}"""
    check_result(run(text, 5), (np.int32(-6), np.int32(10 - 5), np.int32(5)))


def test_option_some_and_none(run):
    text = """def @main(%x: int32) -> int32 {
  let %o = if (greater(%x, 0)) { Some(%x) } else { None };
  match (%o) { Some(%v) => multiply(%v, 2), None => -1, }
}"""
    check_result(run(text, 4), np.int32(8))
    check_result(run(text, -4), np.int32(-1))


def test_option_returned_to_python(run):
    text = "def @main(%x: float32) -> (Option[float32], Option[float32]) { (Some(%x), None) }"
    result = run(text, np.float32(2))
    check_result(result, (Con("Some", np.float32(2)), Con("None")), run.module(text))


# --- lists of tensors, nested lists, lists built in Python ----------------------------------------
def test_list_of_dynamic_tensors(run):
    text = """def @main(%xs: List[Tensor[(?), float32]]) -> List[float32] {
  @map(fn (%t: Tensor[(?), float32]) -> float32 { sum(%t) }, %xs)
}"""
    tensors = [np.arange(n, dtype="float32") for n in (1, 3, 4)]
    check_result(run(text, make_list(tensors)), [np.float32(t.sum()) for t in tensors])


def test_nested_list_lengths(run):
    text = """def @main(%xss: List[List[int32]]) -> List[int32] {
  @map(fn (%xs: List[int32]) -> int32 { @length(%xs) }, %xss)
}"""
    nested = make_list([i32_list([1, 2]), i32_list([]), i32_list([3, 4, 5])])
    check_result(run(text, nested), i32s([2, 0, 3]))


def test_list_built_with_module_constructors(run):
    text = "def @main(%xs: List[float32]) -> float32 { @foldl(fn (%a: float32, %b: float32) { add(%a, %b) }, 0f, %xs) }"
    mod = run.module(text)
    cons, nil = mod.constructor("Cons"), mod.constructor("Nil")
    value = cons(np.float32(1.5), cons(np.float32(2.5), nil()))
    check_result(run(text, value), np.float32(4))


@settings(max_examples=15, deadline=None)
@given(values=st.lists(st.integers(-50, 50), max_size=6), kind=st.sampled_from(KINDS))
def test_list_functions_agree_with_python(values, kind):
    body = """(@sum(@map(fn (%x: int32) -> int32 { multiply(%x, 3) }, %xs)), @rev(%xs),
  @filter(fn (%x: int32) -> bool { less(%x, 0) }, %xs), @length(%xs))"""
    result = on_list(Runner(kind), body, values)
    expected = (np.int32(3 * sum(values)), i32s(values[::-1]), i32s([v for v in values if v < 0]),
                np.int32(len(values)))
    check_result(result, expected)


# --- user-defined ADTs and patterns ------------------------------------------------------------------
SHAPES = """
type Shape {
  Circle(float32),
  Rect(float32, float32),
  Empty,
}
def @area(%s: Shape) -> float32 {
  match (%s) {
    Circle(%r) => multiply(3f, multiply(%r, %r)),
    Rect(%w, %h) => multiply(%w, %h),
    Empty => 0f,
  }
}
def @main(%which: int32, %a: float32, %b: float32) -> float32 {
  let %s = if (equal(%which, 0)) { Circle(%a) } else { if (equal(%which, 1)) { Rect(%a, %b) } else { Empty } };
  @area(%s)
}"""


def test_user_adt_with_three_constructors(run):
    check_result(run(SHAPES, 0, np.float32(2), np.float32(5)), np.float32(12))
    check_result(run(SHAPES, 1, np.float32(2), np.float32(5)), np.float32(10))
    check_result(run(SHAPES, 2, np.float32(2), np.float32(5)), np.float32(0))


NESTED_PATTERNS = """
def @classify(%xs: List[int32]) -> int32 {
  match (%xs) {
    Cons(%a, Cons(%b, Cons(_, _))) => add(multiply(%a, 100), %b),
    Cons(%a, Cons(_, Nil)) => multiply(%a, 10),
    Cons(%a, Nil) => %a,
    Nil => -1,
  }
}
def @main(%xs: List[int32]) -> int32 { @classify(%xs) }"""


def test_nested_constructor_patterns(run):
    for values, expected in (([7, 8, 9, 10], 708), ([7, 8, 9], 708), ([7, 8], 70), ([7], 7), ([], -1)):
        check_result(run(NESTED_PATTERNS, i32_list(values)), np.int32(expected))


def test_the_first_matching_clause_wins(run):
    # the wildcard comes first, so the later, more specific clause never runs
    text = """def @main(%xs: List[int32]) -> int32 {
  match (%xs) { _ => 1, Cons(_, _) => 2, Nil => 3, }
}"""
    check_result(run(text, i32_list([4])), np.int32(1))
    later = """def @main(%xs: List[int32]) -> int32 {
  match (%xs) { Cons(_, Nil) => 1, Cons(_, _) => 2, _ => 3, }
}"""
    for values, expected in (([4], 1), ([4, 5], 2), ([], 3)):
        check_result(run(later, i32_list(values)), np.int32(expected))


def test_tuple_patterns_with_nested_constructors(run):
    text = """def @main(%p: (List[int32], (int32, Option[int32]))) -> int32 {
  match (%p) {
    (Cons(%h, _), (%k, Some(%v))) => add(add(%h, %k), %v),
    (Nil, (%k, _)) => %k,
    (_, (_, None)) => -1,
  }
}"""
    some_five = ADT(0, (np.int32(5),), constructor="Some")
    none = ADT(1, (), constructor="None")
    check_result(run(text, (i32_list([1, 2]), (np.int32(10), some_five))), np.int32(16))
    check_result(run(text, (i32_list([]), (np.int32(10), none))), np.int32(10))
    check_result(run(text, (i32_list([3]), (np.int32(10), none))), np.int32(-1))


def test_incomplete_match_fails_at_run_time_only_when_nothing_matches(run):
    text = """def @main(%o: Option[int32]) -> int32 { match? (%o) { Some(%v) => %v, } }"""
    check_result(run(text, ADT(0, (np.int32(3),), constructor="Some")), np.int32(3))
    with pytest.raises(ExecutionError):
        run(text, ADT(1, (), constructor="None"))


def test_recursive_user_tree(run):
    text = """
type BTree { Leaf(int32), Node(BTree, BTree), }
def @depth(%t: BTree) -> int32 {
  match (%t) {
    Leaf(_) => 1,
    Node(%l, %r) => add(1, maximum(@depth(%l), @depth(%r))),
  }
}
def @total(%t: BTree) -> int32 {
  match (%t) { Leaf(%v) => %v, Node(%l, %r) => add(@total(%l), @total(%r)), }
}
def @main(%v: int32) -> (int32, int32) {
  let %t = Node(Leaf(%v), Node(Node(Leaf(1), Leaf(2)), Leaf(3)));
  (@depth(%t), @total(%t))
}"""
    check_result(run(text, 10), (np.int32(4), np.int32(16)))


def test_adt_holding_a_closure(run):
    text = """
type Boxed { MkBoxed(fn (int32) -> int32), }
def @main(%x: int32) -> int32 {
  let %b = MkBoxed(fn (%v: int32) -> int32 { multiply(%v, %x) });
  match (%b) { MkBoxed(%f) => %f(7), }
}"""
    check_result(run(text, 6), np.int32(42))


NAT = """
type Nat { Z, S(Nat), }
def @nat_to_int(%n: Nat) -> int32 { match (%n) { Z => 0, S(%m) => add(1, @nat_to_int(%m)), } }
def @int_to_nat(%i: int32) -> Nat { if (equal(%i, 0)) { Z } else { S(@int_to_nat(subtract(%i, 1))) } }
def @plus(%a: Nat, %b: Nat) -> Nat { match (%a) { Z => %b, S(%m) => S(@plus(%m, %b)), } }
def @double(%n: Nat) -> Nat { match (%n) { Z => Z, S(%m) => S(S(@double(%m))), } }
def @main(%a: int32, %b: int32) -> (int32, int32) {
  let %x = @int_to_nat(%a);
  (@nat_to_int(@plus(%x, @int_to_nat(%b))), @nat_to_int(@double(%x)))
}"""


def test_peano_naturals(run):
    # test_adt.py's Nat: recursion through nested nullary and unary constructors
    check_result(run(NAT, 3, 4), (np.int32(7), np.int32(6)))
    check_result(run(NAT, 0, 0), (np.int32(0), np.int32(0)))


def test_long_lists_through_non_tail_recursion(run):
    text = """def @main(%l: List[int32]) -> (int32, int32) {
  (@length(%l), @sum(@map(fn (%x: int32) -> int32 { add(%x, 1) }, %l)))
}"""
    values = list(range(1500))
    check_result(run(text, i32_list(values)), (np.int32(1500), np.int32(sum(values) + 1500)))


def test_a_list_longer_than_python_recursion_goes_in_and_comes_back(run):
    """A list of 200,000 elements as an argument (checked against ``List[int32]``) and as a result: the
    conversions walk values with a stack of their own (``runtime.convert.rebuild``); they recursed, and
    Python's recursion limit ended lists of about 62,000 elements going in and 125,000 coming out with a
    RecursionError on every executor."""
    from tensorvm.prelude import to_python_list

    text = "def @main(%l: List[int32]) -> (int32, List[int32]) { (@length(%l), %l) }"
    values = list(range(200_000))
    length, back = run(text, i32_list(values))
    assert int(length.numpy()) == len(values)
    assert [int(np.asarray(v.numpy() if hasattr(v, "numpy") else v)) for v in to_python_list(back)] == values


# --- ADT arguments are checked against the parameter's type -----------------------------------------
def test_python_numbers_in_an_adt_argument_take_the_element_dtype(run):
    text = "def @main(%l: List[float64]) -> float64 { @hd(%l) }"
    check_result(run(text, make_list([1.5])), np.float64(1.5))


def test_adt_argument_with_wrong_element_dtype_is_rejected(run):
    text = "def @main(%l: List[float32]) -> List[float32] { @map(fn (%x: float32) -> float32 { negative(%x) }, %l) }"
    with pytest.raises(ExecutionError, match="parameter.*l.*float32"):
        run(text, make_list([np.int32(1)]))


def test_adt_argument_of_another_type_is_rejected(run):
    text = """def @main(%o: Option[int32], %l: List[int32]) -> int32 {
  match (%o) { Some(%x) => add(%x, @length(%l)), None => 0, }
}"""
    with pytest.raises(ExecutionError, match="parameter.*o"):
        run(text, make_list([np.int32(1)]), make_list([]))
