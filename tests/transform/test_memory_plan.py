"""MemoryPlan: static storages coalesced by liveness; an independent checker verifies that tensors
live at the same time never share bytes, and the strict evaluator verifies the results."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from lowered_eval import LoweredEvaluator, assert_same, check_lowered, interpret, memory_ops, parse

from tensorvm.ir.expr import Call, Constant, Function, If, Match, Op, Tuple, TupleGetItem, Var
from tensorvm.transform.memory_plan import MemoryPlan, plan_offsets
from tensorvm.transform.to_anf import flatten_lets
from tensorvm.transform.vm_pipeline import lower_for_vm


# --- an independent overlap checker ------------------------------------------------------------
def _vars_in(expr) -> set:
    found, stack, seen = set(), [expr], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, Var):
            found.add(node)
        for name in ("op", "value", "body", "cond", "true_branch", "false_branch", "tuple_value", "data", "ref"):
            child = getattr(node, name, None)
            if child is not None and not isinstance(child, (str, np.ndarray)):
                stack.append(child)
        for name in ("args", "fields"):
            stack.extend(getattr(node, name, ()) or ())
        if isinstance(node, Match):
            stack.extend(c.rhs for c in node.clauses)
    return found


def check_no_live_overlap(fn: Function) -> int:
    """Assert no two simultaneously live tensors of one storage overlap; return how many share one."""
    shared = 0
    blocks = [fn.body.body if fn.attrs.get("Closure") else fn.body]
    while blocks:
        bindings, tail = flatten_lets(blocks.pop())
        for _, value in bindings + [(None, tail)]:
            if isinstance(value, If):
                blocks += [value.true_branch, value.false_branch]
            elif isinstance(value, Match):
                blocks += [c.rhs for c in value.clauses]
        uses = [_vars_in(value) for _, value in bindings] + [_vars_in(tail)]
        aliases = {}  # var -> the vars that view its memory: copies, reshapes, tuples holding it, projections
        for var, value in bindings:
            sources = []
            if isinstance(value, Var):
                sources = [value]
            elif isinstance(value, Call) and isinstance(value.op, Op) and value.op.name == "vm.reshape_tensor":
                sources = [value.args[0]]
            elif isinstance(value, Tuple):
                sources = [f for f in value.fields if isinstance(f, Var)]
            elif isinstance(value, TupleGetItem):
                sources = [value.tuple_value]
            for source in sources:
                aliases.setdefault(source, []).append(var)

        def views(v, aliases=aliases):
            seen, stack = set(), [v]
            while stack:
                u = stack.pop()
                if u not in seen:
                    seen.add(u)
                    stack.extend(aliases.get(u, ()))
            return seen

        tensors = []
        for k, (var, value) in enumerate(bindings):
            if isinstance(value, Call) and isinstance(value.op, Op) and value.op.name == "memory.alloc_tensor" \
                    and isinstance(value.args[1], Constant) and isinstance(value.args[2], Constant):
                nbytes = int(np.prod(value.args[2].data)) * np.dtype(value.attrs["dtype"]).itemsize
                start = int(value.args[1].data)
                mine = views(var)
                last = max([k] + [j for j, u in enumerate(uses) if u & mine])
                tensors.append((value.args[0], start, start + nbytes, k, last, var))
        for i, a in enumerate(tensors):
            for b in tensors[i + 1:]:
                if a[0] is not b[0]:
                    continue
                shared += 1
                bytes_overlap = a[1] < b[2] and b[1] < a[2]
                time_overlap = a[3] <= b[4] and b[3] <= a[4]
                assert not (bytes_overlap and time_overlap), \
                    f"%{a[5].name_hint} and %{b[5].name_hint} overlap in memory while both live"
    return shared


def static_storages(fn: Function) -> list:
    return [c for _, c in memory_ops(fn.body) if c.op.name == "memory.alloc_storage"
            and isinstance(c.args[0], Constant)]


MLP = """
def @main(%x: Tensor[(8, 16), float32], %w1: Tensor[(32, 16), float32], %w2: Tensor[(32, 32), float32],
          %w3: Tensor[(32, 32), float32], %w4: Tensor[(4, 32), float32], %b: Tensor[(32), float32]) {
  %0 = nn.relu(nn.bias_add(nn.dense(%x, %w1), %b));
  %1 = nn.relu(nn.bias_add(nn.dense(%0, %w2), %b));
  %2 = nn.relu(nn.bias_add(nn.dense(%1, %w3), %b));
  %3 = nn.relu(nn.bias_add(nn.dense(%2, %w2), %b));
  nn.dense(%3, %w4)
}"""


def _mlp_args():
    rng = np.random.default_rng(0)
    shapes = [(8, 16), (32, 16), (32, 32), (32, 32), (4, 32), (32,)]
    return [rng.standard_normal(s).astype("float32") / 4 for s in shapes]


def test_mlp_intermediates_are_coalesced():
    before = parse(MLP)
    unplanned = lower_for_vm(before, memory_plan=False)
    planned = lower_for_vm(before)
    check_lowered(planned)
    before_allocs, after_allocs = static_storages(unplanned["main"]), static_storages(planned["main"])
    assert len(after_allocs) < len(before_allocs)
    total = lambda allocs: sum(int(c.args[0].data) for c in allocs)  # noqa: E731
    assert total(after_allocs) < total(before_allocs)
    # Four 8x32 intermediates, at most two live at once (a kernel's input and output): two slots.
    arena = max(after_allocs, key=lambda c: int(c.args[0].data))
    assert int(arena.args[0].data) == 2 * 8 * 32 * 4
    assert check_no_live_overlap(planned["main"]) > 0
    args = _mlp_args()
    expected = interpret(before, *args)
    ev_unplanned, ev_planned = LoweredEvaluator(unplanned), LoweredEvaluator(planned)
    assert_same(ev_planned.run("main", *args), expected, rtol=1e-4, atol=1e-5)
    assert_same(ev_unplanned.run("main", *args), expected, rtol=1e-4, atol=1e-5)
    assert ev_planned.storage_bytes < ev_unplanned.storage_bytes


def test_escaping_tensors_are_never_reused_and_share_a_storage_when_they_escape_together():
    before = parse("""
def @main(%x: Tensor[(4), float32]) {
  %0 = exp(%x);
  %1 = (%0, negative(%x));
  %2 = tanh(%x);
  %3 = sqrt(%2);
  (%1, %3)
}""")
    planned = lower_for_vm(before, opt_level=0)
    check_no_live_overlap(planned["main"])
    tensors = [(var, call) for var, call in memory_ops(planned["main"].body) if call.op.name == "memory.alloc_tensor"]
    by_storage = {}
    for var, call in tensors:
        by_storage.setdefault(call.args[0], []).append((int(call.args[1].data), var))
    # exp, negative and sqrt results all escape in the result: one storage, side by side, never reused;
    # tanh's result is the only contained one, and a single candidate needs no arena
    shared = [placed for placed in by_storage.values() if len(placed) > 1]
    assert len(shared) == 1 and sorted(offset for offset, _ in shared[0]) == [0, 64, 128]
    assert all(placed == [(0, placed[0][1])] for placed in by_storage.values() if len(placed) == 1)
    x = np.array([0.5, 1, 2, 3], "float32")
    assert_same(LoweredEvaluator(planned).run("main", x), interpret(before, x))


def test_a_tuple_handed_to_kernels_does_not_make_its_fields_escape():
    before = parse("""
def @main(%x: Tensor[(8, 4), float32]) {
  %0 = split(exp(%x), indices_or_sections=2, axis=0);
  %1 = add(%0.0, %0.1);
  %2 = multiply(%0.1, %1);
  negative(%2)
}""")
    planned = lower_for_vm(before, opt_level=0)
    assert check_no_live_overlap(planned["main"]) > 0
    storages = static_storages(planned["main"])
    # everything but the result lives in the arena: the arena plus the result's own storage
    assert len(storages) == 2
    x = np.linspace(-1, 1, 32, dtype="float32").reshape(8, 4)
    assert_same(LoweredEvaluator(planned).run("main", x), interpret(before, x))


def test_tail_call_arguments_share_one_storage_per_step():
    before = parse("""
def @loop(%i: int32, %a: Tensor[(2), float32], %b: Tensor[(2), float32]) -> Tensor[(2), float32] {
  if (equal(%i, 0)) { add(%a, %b) } else { @loop(subtract(%i, 1), tanh(%b), exp(%a)) }
}
def @main(%x: Tensor[(2), float32]) { @loop(3, %x, %x) }
""")
    planned = lower_for_vm(before, opt_level=0)
    branch = flatten_lets(planned["loop"].body)[1]
    assert isinstance(branch, If)
    storages = [c for _, c in memory_ops(branch.false_branch) if c.op.name == "memory.alloc_storage"]
    assert len(storages) == 1 and int(storages[0].args[0].data) == 3 * 64  # i - 1, tanh(b), exp(a)
    x = np.array([0.25, -0.5], "float32")
    assert_same(LoweredEvaluator(planned).run("main", x), interpret(before, x))


def test_branches_are_planned_separately_and_uses_inside_count():
    before = parse("""
def @main(%c: bool, %x: Tensor[(4), float32]) {
  %0 = exp(%x);
  %1 = negative(%0);
  %2 = sqrt(%0);
  %3 = if (%c) {
    %4 = add(%0, %2);
    %5 = multiply(%4, %4);
    %6 = tanh(%5);
    subtract(%6, %0)
  } else {
    add(%2, 1f)
  };
  multiply(%3, 2f)
}""")
    planned = lower_for_vm(before, opt_level=0)
    check_lowered(planned)
    assert check_no_live_overlap(planned["main"]) > 0
    (_, branch), = [(v, c) for v, c in flatten_lets(planned["main"].body)[0] if isinstance(c, If)]
    true_allocs = [c for _, c in memory_ops(branch.true_branch) if c.op.name == "memory.alloc_storage"]
    # The branch's three temporaries share an arena of two 64-byte slots; its result escapes.
    assert sorted(int(c.args[0].data) for c in true_allocs) == [16, 128]
    x = np.array([0.1, 0.2, 0.3, 0.4], "float32")
    for c in (True, False):
        assert_same(LoweredEvaluator(planned).run("main", np.array(c), x), interpret(before, np.array(c), x))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20), st.integers(1, 300)), min_size=1, max_size=25))
def test_offsets_never_overlap_for_overlapping_lifetimes(raw):
    intervals = [(min(a, b), max(a, b), size) for a, b, size in raw]
    offsets, total = plan_offsets(intervals)
    assert total <= sum(size for _, _, size in intervals)
    for i, (s1, e1, z1) in enumerate(intervals):
        assert offsets[i] + z1 <= total
        for j in range(i + 1, len(intervals)):
            s2, e2, z2 = intervals[j]
            if s1 <= e2 and s2 <= e1:
                assert offsets[i] + z1 <= offsets[j] or offsets[j] + z2 <= offsets[i]


# --- random static programs ----------------------------------------------------------------------
@st.composite
def static_program(draw):
    names = ["%x"]
    lines = []
    for i in range(draw(st.integers(2, 10))):
        a, b = draw(st.sampled_from(names)), draw(st.sampled_from(names))
        kind = draw(st.sampled_from(["unary", "binary", "binary", "if", "tuple"]))
        if kind == "unary":
            expr = f"{draw(st.sampled_from(['exp', 'negative', 'tanh']))}({a})"
        elif kind == "binary":
            expr = f"{draw(st.sampled_from(['add', 'multiply', 'subtract']))}({a}, {b})"
        elif kind == "if":
            expr = f"if (%c) {{ negative(add({a}, {b})) }} else {{ exp({a}) }}"
        else:
            expr = f"(tanh({a}), {b}).{draw(st.integers(0, 1))}"
        lines.append(f"%{i} = {expr};")
        names.append(f"%{i}")
    result = names[-1] if draw(st.booleans()) else f"({names[-1]}, {draw(st.sampled_from(names[1:]))})"
    return "def @main(%c: bool, %x: Tensor[(3, 2), float32]) {\n  " + "\n  ".join(lines) + f"\n  {result}\n}}"


@settings(max_examples=30, deadline=None)
@given(static_program(), st.booleans(), st.integers(0, 1))
def test_random_programs_plan_safely(text, cond, opt_level):
    before = parse(text)
    planned = lower_for_vm(before, opt_level=opt_level)
    check_lowered(planned)
    check_no_live_overlap(planned["main"])
    x = np.array([[0.5, -1.0], [2.0, 0.25], [-0.75, 1.5]], "float32")
    assert_same(LoweredEvaluator(planned).run("main", np.array(cond), x), interpret(before, np.array(cond), x))


def test_plan_is_a_new_module():
    unplanned = lower_for_vm(parse(MLP), memory_plan=False)
    text = str(unplanned)
    MemoryPlan()(unplanned)
    assert str(unplanned) == text


