"""A small loader fuzz run (tests/fuzz/loader_fuzz.py) for the executable format: no defects allowed."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loader_fuzz  # noqa: E402


def test_mutated_executables_load_correctly_or_fail_clearly():
    start = time.monotonic()
    # Seeds take ~10 s (C builds hit the cache). A 10 s case limit: a mutation that turns recursion into
    # unbounded recursion is a valid program (run-timeout), stopped before it exhausts the 2 GiB limit
    # (where it ends depends on what allocation fails first; the campaign reports that at 20 s).
    report = loader_fuzz.run_campaign(("tvx",), mutations=400, workers=1, seed=16, timeout=10,
                                      time_budget=25)["tvx"]
    assert report.tried >= 100, report.summary()
    assert report.defects == 0, report.summary()
    assert report.classes["clear-error"] > 0 and report.classes["accepted-correct"] > 0, report.summary()
    assert time.monotonic() - start < 60


def test_the_oracle_catches_a_wrong_result_and_the_canary():
    """The classifier itself: an unsealed file computing something else is a wrong result (a checksum
    bypass), a sealed one a valid different program."""
    seed = loader_fuzz.Seed("params", "p", b"", (), loader_fuzz.normalize((1.0,)))
    import tensorvm as tv

    data = tv.graph.save_params({"a": 2.0})
    for sealed, want in ((False, "wrong-result"), (True, "accepted-different"), (None, "accepted-different")):
        case = loader_fuzz.Case("params", "p", data, "test", sealed)
        assert loader_fuzz._execute(case, seed, Path("."))[0] == want
    case = loader_fuzz.Case("params", "p", b"junk", "test", True)
    assert loader_fuzz._execute(case, seed, Path("."))[0] == "clear-error"
