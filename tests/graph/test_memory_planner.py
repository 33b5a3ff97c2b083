"""The static memory planner: placement algorithms against an independent overlap check, hand-computed
plans, lifetimes of lowered programs, and the storage-id view."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from programs import PROGRAMS  # noqa: E402

import tensorvm as tv  # noqa: E402
from tensorvm.transform.memory_planner import (  # noqa: E402
    PLANNER_ALGORITHMS,
    MemoryPlanError,
    TensorLifetime,
    lower_static,
    plan_memory,
    static_lifetimes,
    static_schedule,
)

ALGORITHMS = [a for a in PLANNER_ALGORITHMS]


def _align(n, a):
    return -(-max(n, 1) // a) * a


def assert_no_live_overlap(lifetimes, plan):
    """The test's own check (independent of ``plan.check``): follow aliases to their roots, take each
    root's live range as the union over its aliases, and require disjoint bytes for every pair of
    intermediate roots live at a common step."""
    by_name = {lt.name: lt for lt in lifetimes}

    def root(name):
        while by_name[name].alias_of is not None:
            name = by_name[name].alias_of
        return name

    groups = {}
    for lt in lifetimes:
        g = groups.setdefault(root(lt.name), {"lo": lt.first_use, "hi": lt.last_use, "size": 0, "ext": False})
        g["lo"], g["hi"] = min(g["lo"], lt.first_use), max(g["hi"], lt.last_use)
        g["size"] = max(g["size"], _align(lt.size_bytes, plan.alignment))
        g["ext"] |= lt.kind != "intermediate"
    placed = {r: g for r, g in groups.items() if not g["ext"]}
    for name in by_name:  # an alias sits exactly on its root
        if root(name) in placed:
            assert plan.offsets[name] == plan.offsets[root(name)]
        else:
            assert name not in plan.offsets  # never-overwritten tensors stay out of the workspace
    for r, g in placed.items():
        off = plan.offsets[r]
        assert off % plan.alignment == 0 and off + g["size"] <= plan.total_bytes
    for (ra, a), (rb, b) in itertools.combinations(placed.items(), 2):
        if a["lo"] <= b["hi"] and b["lo"] <= a["hi"]:
            oa, ob = plan.offsets[ra], plan.offsets[rb]
            assert oa + a["size"] <= ob or ob + b["size"] <= oa, f"{ra} and {rb} overlap while both live"
    # storage ids: members of one intermediate sid are never live together (aliases aside)
    by_sid = {}
    for name, sid in plan.storage_ids.items():
        by_sid.setdefault(sid, set()).add(root(name))
    for roots in by_sid.values():
        for ra, rb in itertools.combinations(sorted(roots), 2):
            a, b = groups[ra], groups[rb]
            assert not (a["lo"] <= b["hi"] and b["lo"] <= a["hi"]), f"{ra} and {rb} share a sid while live"


@st.composite
def lifetime_sets(draw):
    n = draw(st.integers(1, 14))
    steps = draw(st.integers(1, 10))
    result = []
    for i in range(n):
        lo = draw(st.integers(0, steps))
        hi = draw(st.integers(lo, steps))
        alias = None
        if result and draw(st.booleans()) and draw(st.booleans()):
            alias = draw(st.sampled_from(result)).name
        kind = draw(st.sampled_from(["intermediate"] * 6 + ["input", "param", "output"]))
        result.append(TensorLifetime(f"t{i}", draw(st.integers(0, 3000)), lo, hi, alias, kind))
    return result


@settings(max_examples=40, deadline=None)
@given(lifetime_sets(), st.sampled_from([1, 16, 64]))
def test_every_algorithm_gives_a_valid_plan_never_above_the_sum(lifetimes, alignment):
    for algorithm in ALGORITHMS:
        plan = plan_memory(lifetimes, algorithm, alignment=alignment, iterations=30)
        assert_no_live_overlap(lifetimes, plan)
        plan.check()
        assert plan.lower_bound_bytes <= plan.total_bytes <= plan.unplanned_bytes
    unplanned = plan_memory(lifetimes, "no_reuse", alignment=alignment)
    assert unplanned.total_bytes == unplanned.unplanned_bytes


def test_gap_filling_beats_usmp_placement_on_a_hand_computed_case():
    # A (10 B) and B (8 B) are live together at step 0, so B goes above A at 10; C (6 B) is live only
    # with B at step 1. USMP puts C above B (18..24); the gap below B (A is dead by then) fits it.
    lifetimes = [TensorLifetime("A", 10, 0, 0), TensorLifetime("B", 8, 0, 1), TensorLifetime("C", 6, 1, 1)]
    gaps = plan_memory(lifetimes, "greedy_by_size", alignment=1)
    usmp = plan_memory(lifetimes, "greedy_by_size", alignment=1, fill_gaps=False)
    assert (gaps.offsets, gaps.total_bytes) == ({"A": 0, "B": 10, "C": 0}, 18)
    assert (usmp.offsets, usmp.total_bytes) == ({"A": 0, "B": 10, "C": 18}, 24)
    assert gaps.lower_bound_bytes == 18 and gaps.unplanned_bytes == 24
    # A and C share offset 0 at disjoint times: one storage id, sized for the larger
    assert gaps.storage_ids["A"] == gaps.storage_ids["C"] != gaps.storage_ids["B"]
    assert gaps.storage_sizes[gaps.storage_ids["A"]] == 10


def test_greedy_by_conflicts_orders_by_conflicts_first():
    # D conflicts with everyone, so by_conflicts places it first at 0; by_size places the 100-byte E first.
    lifetimes = [TensorLifetime("D", 8, 0, 3), TensorLifetime("E", 100, 0, 0), TensorLifetime("F", 8, 1, 1),
                 TensorLifetime("G", 8, 2, 3)]
    by_conflicts = plan_memory(lifetimes, "greedy_by_conflicts", alignment=1)
    by_size = plan_memory(lifetimes, "greedy_by_size", alignment=1)
    assert by_conflicts.offsets["D"] == 0 and by_size.offsets["E"] == 0
    assert by_size.offsets["D"] == 100
    for plan in (by_conflicts, by_size):
        assert_no_live_overlap(lifetimes, plan)


def test_alias_extends_its_roots_lifetime():
    # R views A until step 3, so B (live at step 2) must not take A's bytes even though A's own last use is 1.
    lifetimes = [TensorLifetime("A", 64, 0, 1), TensorLifetime("R", 64, 1, 3, alias_of="A"),
                 TensorLifetime("B", 64, 2, 2)]
    plan = plan_memory(lifetimes, "greedy_by_size")
    assert plan.offsets["R"] == plan.offsets["A"] != plan.offsets["B"]
    assert plan.total_bytes == 128
    # without the alias B could reuse A's bytes
    plain = plan_memory([TensorLifetime("A", 64, 0, 1), TensorLifetime("B", 64, 2, 2)], "greedy_by_size")
    assert plain.total_bytes == 64


def test_inputs_params_outputs_and_their_aliases_are_never_reused():
    lifetimes = [TensorLifetime("x", 64, 0, 0, kind="input"), TensorLifetime("t", 64, 0, 1),
                 TensorLifetime("y", 64, 1, 1, alias_of="t", kind="output"), TensorLifetime("u", 64, 1, 2),
                 TensorLifetime("w", 32, 0, 2, kind="param")]
    plan = plan_memory(lifetimes, "greedy_by_size").check()
    assert set(plan.offsets) == {"u"}  # t is an output (through its alias y): out of the workspace
    assert plan.storage_ids["t"] == plan.storage_ids["y"]
    assert plan.storage_kinds[plan.storage_ids["t"]] == "output"
    assert len({plan.storage_ids[n] for n in ("x", "t", "u", "w")}) == 4
    assert plan.external_bytes == {"input": 64, "output": 64, "param": 32}
    assert plan.total_bytes == 64
    report = plan.report()
    assert "output" in report and "t, y" in report and "workspace: 64 bytes" in report


def test_check_catches_a_corrupted_plan():
    lifetimes = [TensorLifetime("A", 64, 0, 1), TensorLifetime("B", 64, 1, 2)]
    plan = plan_memory(lifetimes, "greedy_by_size").check()
    plan.offsets["B"] = plan.offsets["A"]
    with pytest.raises(MemoryPlanError, match="overlap"):
        plan.check()


@pytest.mark.parametrize("bad, message", [
    ([TensorLifetime("A", 8, 2, 1)], "after last_use"),
    ([TensorLifetime("A", -1, 0, 1)], "non-negative"),
    ([TensorLifetime("A", 8, 0, 1), TensorLifetime("A", 8, 0, 1)], "twice"),
    ([TensorLifetime("A", 8, 0, 1, alias_of="nope")], "unknown tensor"),
    ([TensorLifetime("A", 8, 0, 1, alias_of="B"), TensorLifetime("B", 8, 0, 1, alias_of="A")], "cycle"),
    ([TensorLifetime("A", 8, 0, 1, kind="weird")], "kind"),
])
def test_invalid_lifetimes_are_refused(bad, message):
    with pytest.raises(MemoryPlanError, match=message):
        plan_memory(bad)


def test_unknown_algorithm_and_workspace_limit():
    lifetimes = [TensorLifetime("A", 64, 0, 1), TensorLifetime("B", 64, 1, 2)]
    with pytest.raises(tv.UnsupportedError, match="greedy_by_size"):
        plan_memory(lifetimes, "magic")
    with pytest.raises(MemoryPlanError, match="limit is 100 bytes"):
        plan_memory(lifetimes, workspace_limit=100)
    assert plan_memory(lifetimes, workspace_limit=128).total_bytes == 128


def test_hill_climb_reaches_the_lower_bound_where_greedy_does_not():
    # a, b, d are live together at step 0: 3 + 2 + 4 = 9 bytes is the lower bound. Greedy by size
    # (d 0..4, a 4..7, c 0..3, f 7..9, b 9..11, e 9..11) needs 11; a better order packs into 9.
    lifetimes = [TensorLifetime("a", 3, 0, 3), TensorLifetime("b", 2, 0, 2), TensorLifetime("c", 3, 4, 4),
                 TensorLifetime("d", 4, 0, 0), TensorLifetime("e", 2, 3, 4), TensorLifetime("f", 2, 2, 4)]
    greedy = plan_memory(lifetimes, "greedy_by_size", alignment=1)
    assert greedy.total_bytes == 11 and greedy.lower_bound_bytes == 9
    assert greedy.offsets == {"d": 0, "a": 4, "c": 0, "f": 7, "b": 9, "e": 9}
    climbed = plan_memory(lifetimes, "hill_climb", alignment=1)
    assert climbed.total_bytes == 9
    assert_no_live_overlap(lifetimes, climbed)
    assert plan_memory(lifetimes, "best", alignment=1).total_bytes == 9


# --- lifetimes of lowered programs ----------------------------------------------------------------
def _program(name):
    return next(p for p in PROGRAMS if p.name == name)


def test_static_lifetimes_of_the_small_cnn_by_hand():
    # the corpus's small CNN with an average pool, which (unlike its max pool) stays a kernel of its own
    text = _program("small_cnn").text.replace("nn.max_pool2d", "nn.avg_pool2d")
    lowered = lower_static(tv.parse(text))
    by_name = {lt.name: lt for lt in static_lifetimes(lowered)}
    # steps: 0 conv+relu -> x1, 1 avg_pool -> x2, 2 batch_flatten (a view) -> x3, 3 dense -> x4 (the result)
    assert (by_name["x1"].first_use, by_name["x1"].last_use) == (0, 1)
    assert (by_name["x2"].first_use, by_name["x2"].last_use) == (1, 2)
    assert by_name["x3"].alias_of == "x2" and (by_name["x3"].first_use, by_name["x3"].last_use) == (2, 3)
    assert by_name["x1"].size_bytes == 2 * 4 * 8 * 8 * 4 and by_name["x2"].size_bytes == 2 * 4 * 4 * 4 * 4
    assert by_name["x4"].kind == "output" and by_name["x"].kind == "input" and by_name["wd"].kind == "input"
    plan = plan_memory(list(by_name.values()))
    assert_no_live_overlap(list(by_name.values()), plan)
    assert plan.total_bytes == 2048 + 512  # x1 and x2 are live together at step 1


def test_chain_of_elementwise_ops_reuses_memory():
    # Unfused (opt_level 0) a chain of 6 ops: at most two intermediates live at once, so two blocks suffice.
    mod = tv.parse("""
def @main(%x: Tensor[(16, 16), float32]) -> Tensor[(16, 16), float32] {
  %0 = exp(%x); %1 = negative(%0); %2 = exp(%1); %3 = negative(%2); %4 = exp(%3); negative(%4)
}""")
    lowered = lower_static(mod, opt_level=0)
    schedule = static_schedule(lowered)
    assert len(schedule.steps) == 6
    lifetimes = schedule.lifetimes()
    for algorithm in ALGORITHMS:
        plan = plan_memory(lifetimes, algorithm)
        assert_no_live_overlap(lifetimes, plan)
        assert plan.unplanned_bytes == 5 * 1024
        if algorithm != "no_reuse":
            assert plan.total_bytes == 2 * 1024


@pytest.mark.parametrize("program", [p for p in PROGRAMS if "static" in p.tags], ids=lambda p: p.name)
def test_plans_of_every_static_program(program):
    lifetimes = static_lifetimes(lower_static(program.parse()))
    for algorithm in ALGORITHMS:
        plan = plan_memory(lifetimes, algorithm)
        assert_no_live_overlap(lifetimes, plan)
        assert plan.total_bytes <= plan.unplanned_bytes


@pytest.mark.parametrize("program", [p for p in PROGRAMS if "static" not in p.tags], ids=lambda p: p.name)
def test_non_static_programs_are_refused_pointing_to_the_vm(program):
    with pytest.raises(tv.UnsupportedError, match=r"static.*VM|VM"):
        static_lifetimes(lower_static(program.parse()))


@settings(max_examples=60, deadline=None)
@given(lifetime_sets(), st.sampled_from([1, 16]), st.data())
def test_check_finds_a_live_overlap_exactly_when_one_exists(lifetimes, alignment, data):
    """``check`` (a sweep comparing each block with its live neighbours) against every pair: roots
    moved to random aligned offsets overlap while live exactly when ``check`` says so."""
    plan = plan_memory(lifetimes, "greedy_by_size", alignment=alignment)
    by_name = {lt.name: lt for lt in lifetimes}

    def root(name):
        while by_name[name].alias_of is not None:
            name = by_name[name].alias_of
        return name

    moved = {r: data.draw(st.integers(0, 8)) * alignment * 16 for r in {root(n) for n in plan.offsets}}
    plan.offsets = {name: moved[root(name)] for name in plan.offsets}
    plan.total_bytes = 1 << 20
    # a storage id per block, so only the byte check can fail
    plan.storage_ids = {name: i for i, name in enumerate(plan.storage_ids)}
    plan.storage_sizes = [by_name[n].size_bytes for n in plan.storage_ids]
    plan.storage_kinds = ["intermediate" if n in plan.offsets else by_name[root(n)].kind for n in plan.storage_ids]
    plan.storage_kinds = ["intermediate" if k == "intermediate" else "output" for k in plan.storage_kinds]
    try:
        assert_no_live_overlap(lifetimes, plan)
        overlapping = False
    except AssertionError as err:
        overlapping = "overlap while both live" in str(err)
        if not overlapping:
            raise
    if overlapping:
        with pytest.raises(MemoryPlanError, match="overlap in bytes while both live"):
            plan.check()
    else:
        try:
            plan.check()
        except MemoryPlanError as err:
            assert "overlap" not in str(err), err
