"""The differential program fuzzer's budget in ``make test`` (``make fuzz`` runs the long campaign).

Random well-typed programs (``program_gen``) run on the interpreter, the oracle, and on every executor
that accepts them (``program_fuzz.EXECUTORS``), each called three times per shape set on three shape
sets; every result must equal the interpreter's and stay unchanged after later calls. The examples are
derandomized (a fixed sequence, no example database) so a CI failure reproduces locally; a failure
prints the shrunk program, which pastes into ``test_program_regressions.py``.
"""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis.errors import NoSuchExample

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import program_fuzz as pf  # noqa: E402
from program_gen import programs  # noqa: E402

from tensorvm.codegen.build import have_compiler  # noqa: E402

# examples per flavor, tuned to about a minute each on one core (compiling C kernels dominates)
BUDGET = {"static": 25, "dataflow": 35, "full": 30}


def _settings(max_examples: int, phases=(Phase.generate, Phase.shrink)):
    return settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck), phases=phases, print_blob=False)


@pytest.mark.parametrize("flavor", sorted(BUDGET))
def test_programs_agree_with_the_interpreter(flavor):
    stats = pf.Stats()

    @_settings(BUDGET[flavor])
    @given(programs(flavor))
    def check(case):
        mismatches = pf.run_case(case, stats)
        assert not mismatches, pf.report(case, mismatches)

    check()
    # the run really ran programs on the executors (a budget that checks nothing cannot fail)
    assert stats.combinations >= BUDGET[flavor] * pf.CALLS_PER_SET * 8


def test_static_programs_reach_the_graph_executor_and_aot():
    """Static programs are not refused by the static executors (else they would go untested)."""
    stats = pf.Stats()

    @_settings(5, phases=(Phase.generate,))
    @given(programs("static"))
    def check(case):
        pf.run_case(case, stats, {k: v for k, v in pf.EXECUTORS.items() if k in ("graph-python", "aot")})

    check()
    assert stats.not_applicable == {} and stats.combinations == 5 * 2 * pf.CALLS_PER_SET * pf.SHAPE_SETS


def test_dynamic_programs_are_refused_clearly_by_the_static_executors():
    """The graph executor and AOT refuse a dynamic program with UnsupportedError (not applicable), which
    ``run_case`` counts; any other exception would be a mismatch."""
    stats = pf.Stats()

    @_settings(5, phases=(Phase.generate,))
    @given(programs("full"))
    def check(case):
        if case.variables:
            assert not pf.run_case(case, stats, {k: v for k, v in pf.EXECUTORS.items() if k.startswith(("graph", "aot"))})

    check()
    assert sum(stats.not_applicable.values()) > 0


def test_the_fuzzer_finds_the_reintroduced_specialization_defect():
    """Issue 16's defect 1 (a specialized body's preset values overwritten by tensors the memory planner
    placed on the same bytes), put back by ``broken_specialization``: the fuzzer must report a mismatch
    within its budget, on the VM alone."""
    executors = {"vm-python-bytecode": pf.EXECUTORS["vm-python-bytecode"]}

    def fails(case) -> bool:
        return bool(pf.run_case(case, pf.Stats(), executors))

    with pf.broken_specialization():
        try:
            case = find(programs("dataflow"), fails, settings=_settings(600, phases=(Phase.generate,)))
        except NoSuchExample:
            pytest.fail("the fuzzer missed the reintroduced specialization defect in 600 programs")
    # the program it found is fine once the defect is gone again (when the tree has the fix)
    from tensorvm.vm.specialize import ShapeSlice

    if "private" in ShapeSlice.__dataclass_fields__:
        assert not fails(case), case.text


@pytest.mark.skipif(not have_compiler(), reason="the defect shows only in C kernels (NumPy's read all inputs first)")
@pytest.mark.parametrize("executor, breakage", [("vm-c-bytecode", pf.broken_arena_placement),
                                                ("vm-c-native", pf.broken_native_arena)])
def test_the_fuzzer_finds_a_misplaced_arena(executor, breakage):
    """Arena storages whose spans are too short, so that a kernel's output may share bytes with an input it
    still reads: on the bytecode VM an off-by-one in a specialized body's spans (``broken_arena_placement``:
    the last use taken as exclusive), in native mode spans that forget a slot's uses after the first
    (``broken_native_arena``; native spans also cover the allocations between uses, where that off-by-one
    changes nothing). The fuzzer must report a mismatch within its budget, and the program it found must
    pass once the defect is gone."""
    executors = {executor: pf.EXECUTORS[executor]}
    tried = []

    def fails(case) -> bool:
        tried.append(case)
        return bool(pf.run_case(case, pf.Stats(), executors))

    with breakage():
        try:
            case = find(programs("dataflow"), fails, settings=_settings(600, phases=(Phase.generate,)))
        except NoSuchExample:
            pytest.fail(f"the fuzzer missed the misplaced arena in {len(tried)} programs")
    assert not fails(case), case.text


def test_an_earlier_result_that_changes_is_reported():
    """The runner's aliasing check itself: an executor handing back the same buffer every call (so an
    earlier result changes under a later call) is a mismatch even though each result is right when
    returned."""
    import numpy as np
    from program_gen import Case, Dim, Param

    import tensorvm as tv

    case = Case('#[version = "0.0.5"]\ndef @main(%p1: Tensor[(?), float32]) {\n  negative(%p1)\n}\n',
                (Param("%p1", (Dim.var(0),), "Tensor[(?), float32]"),), (0,), 7)

    def aliasing(mod):
        run = tv.create_executor("debug", mod).evaluate()
        buffers: dict = {}

        def call(x):
            value = run(x).numpy()
            out = buffers.setdefault(value.shape, np.empty_like(value))
            out[...] = value
            return out
        return call

    mismatches = pf.run_case(case, pf.Stats(), {"aliasing": aliasing})
    assert mismatches and all("changed after this call" in m.what for m in mismatches)


def test_the_campaign_prints_its_counts(tmp_path, capsys):
    import program_campaign

    status = program_campaign.main(["--programs", "4", "--flavor", "static", "--executors",
                                    "vm-python-bytecode,graph-python", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "campaign: 4 programs" in out and "program x executor x call combinations checked, 0 mismatches" in out
