"""lower_for_vm end to end: every program of the shared suite, lowered and run by the strict
lowered-code evaluator, matches its expected value (or the interpreter), and has the contract's form."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from lowered_eval import LoweredEvaluator, assert_same, check_lowered, interpret, parse

from tensorvm.ir.expr import Call, Function, Op
from tensorvm.runtime.object import ADT
from tensorvm.transform.to_anf import post_order_iter
from tensorvm.transform.vm_pipeline import lower_for_vm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from programs import PROGRAMS, check_result  # noqa: E402


def _run(program, lowered, args):
    evaluator = LoweredEvaluator(lowered)
    if program.error is not None:
        exc, pattern = program.error
        with pytest.raises(exc, match=pattern):
            evaluator.run(program.entry, *args)
        return
    result = evaluator.run(program.entry, *args)
    if program.expected_fn is not None:
        check_result(result, program.expected_fn(*args), lowered, program.rtol, program.atol)
    else:
        assert_same(result, interpret(program.parse(), *args, name=program.entry), program.rtol, program.atol)


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_shared_program_lowers_and_runs(program):
    lowered = lower_for_vm(program.parse())
    check_lowered(lowered)
    _run(program, lowered, program.args_fn())


@pytest.mark.parametrize("program", [p for p in PROGRAMS if {"dynamic", "control"} & p.tags][:8],
                         ids=lambda p: p.name)
def test_shared_program_without_fusion_or_planning(program):
    lowered = lower_for_vm(program.parse(), opt_level=0, memory_plan=False)
    check_lowered(lowered)
    _run(program, lowered, program.args_fn())


def test_params_are_bound_before_lowering():
    mod = parse("""
def @main(%x: Tensor[(?, 3), float32], %w: Tensor[(2, 3), float32]) {
  nn.dense(%x, %w)
}""")
    w = np.arange(6, dtype="float32").reshape(2, 3)
    lowered = lower_for_vm(mod, params={"w": w})
    assert [p.name_hint for p in lowered["main"].params] == ["x"]
    x = np.ones((4, 3), "float32")
    assert_same(LoweredEvaluator(lowered).run("main", x), x @ w.T)


def test_lowering_does_not_touch_its_input():
    mod = parse("""
def @main(%x: Tensor[(?), float32]) {
  let %f = fn (%y: Tensor[(?), float32]) { exp(%y) };
  %f(negative(%x))
}""")
    text = mod.astext(show_types=False)
    lower_for_vm(mod)
    assert mod.astext(show_types=False) == text


def test_a_large_graph_lowers_without_recursion_trouble():
    # A 40-layer dynamic-batch MLP with residual adds: 200 ops in one chain.
    lines = ["def @main(%x: Tensor[(?, 16), float32], %w: Tensor[(16, 16), float32], %b: Tensor[(16), float32]) {"]
    prev = "%x"
    for i in range(40):
        lines += [f"  %d{i} = nn.dense({prev}, %w);", f"  %b{i} = nn.bias_add(%d{i}, %b);",
                  f"  %r{i} = nn.relu(%b{i});", f"  %s{i} = add(%r{i}, {prev});",
                  f"  %n{i} = multiply(%s{i}, 0.5f);"]
        prev = f"%n{i}"
    text = "\n".join(lines) + f"\n  {prev}\n}}"
    mod = parse(_renumber(text))
    lowered = lower_for_vm(mod)
    check_lowered(lowered)
    calls = [n for n in post_order_iter(lowered["main"].body)
             if isinstance(n, Call) and isinstance(n.op, Op) and n.op.name == "vm.invoke_tvm_op"]
    assert len(calls) == 40  # one kernel per layer: dense with its whole elementwise epilogue
    assert not any(isinstance(n, Function) for n in post_order_iter(lowered["main"].body))
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype("float32") / 4 for s in [(3, 16), (16, 16), (16,)]]
    assert_same(LoweredEvaluator(lowered).run("main", *args), interpret(mod, *args), rtol=1e-4, atol=1e-5)


def _renumber(text: str) -> str:
    """Graph bindings must be numbered %0, %1, ...: rename the readable names in order."""
    import re

    names = []
    for m in re.finditer(r"%([a-z]\d+) =", text):
        names.append(m.group(1))
    mapping = {name: str(i) for i, name in enumerate(names)}
    return re.sub(r"%([a-z]\d+)\b", lambda m: "%" + mapping.get(m.group(1), m.group(1)), text)


def test_constructor_used_as_a_value_is_eta_expanded_and_lifted():
    mod = parse("""
def @main(%l: List[int32]) {
  @map(Some, @map(negative, %l))
}""")
    lowered = lower_for_vm(mod)
    check_lowered(lowered)
    cons, nil = lowered.constructor("Cons"), lowered.constructor("Nil")
    lst = cons(np.array(1, "int32"), cons(np.array(2, "int32"), ADT(nil.tag, (), constructor="Nil")))
    result = LoweredEvaluator(lowered).run("main", lst)
    expected = interpret(mod, lst)
    assert_same(result, expected)
    assert result.fields[0].constructor == "Some" and int(result.fields[0].fields[0]) == -1


_STAGED = ["closure_captures_variables", "grow_by_concatenate", "list_map_foldl", "dynamic_concatenate_split",
           "mutual_recursion_even_odd", "tuple_out_static", "argwhere_positive", "option_match"]


@pytest.mark.parametrize("name", _STAGED)
def test_every_pass_before_manifest_alloc_keeps_the_meaning(name):
    from programs import PROGRAMS_BY_NAME

    from tensorvm.transform.vm_pipeline import vm_passes

    program = PROGRAMS_BY_NAME[name]
    mod = program.parse()
    args = program.args_fn()
    expected = interpret(mod, *args, name=program.entry)
    for p in vm_passes():
        if p.name == "ManifestAlloc":
            break
        mod = p(mod)
        assert_same(interpret(mod, *args, name=program.entry), expected, program.rtol, program.atol)
