"""Pass/skip/fail counts per ONNX op of the conformance suite (``test_onnx_backend.py``).

    python tests/conformance/report.py [-m "not slow"] [extra pytest args]

Runs the suite in this process (pytest plugin that records every outcome), maps each test to the
op it tests (the node under test; for ``_expanded`` tests, the op of the expanded function), and
prints a table per op plus totals, including the issue's goal: the direct node tests of the core
ops with float32/int32/int64/bool inputs and outputs.
"""

from __future__ import annotations

import os
import sys
from collections import Counter, defaultdict

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


class OutcomeRecorder:
    def __init__(self):
        self.outcomes: dict[str, str] = {}
        self.reasons: dict[str, str] = {}

    def pytest_runtest_logreport(self, report):
        name = report.nodeid.rsplit("::", 1)[-1]
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            outcome = report.outcome
            if hasattr(report, "wasxfail"):
                outcome = "xfail" if report.skipped else "xpass"
            self.outcomes[name] = outcome
            if report.outcome != "passed":
                crash = getattr(report.longrepr, "reprcrash", None)
                text = crash.message if crash is not None else str(report.longrepr or "")
                self.reasons[name] = " ".join(text.split())[:220]


def main(argv: list[str]) -> int:
    from tvm_onnx_backend import model_test_ops, node_test_info

    recorder = OutcomeRecorder()
    args = [os.path.join(HERE, "test_onnx_backend.py"), "-q", "-p", "no:warnings", "-p", "no:cacheprovider",
            "-k", "_cpu", *argv]
    code = pytest.main(args, plugins=[recorder])
    info = node_test_info()
    per_op: dict[str, Counter] = defaultdict(Counter)
    goal = Counter()
    kinds = Counter()
    model_ops = {}
    for kind in ("simple", "pytorch-converted", "pytorch-operator", "real"):
        for name, ops in model_test_ops(kind).items():
            model_ops[name] = (kind, ops)
    for test, outcome in recorder.outcomes.items():
        base = test[:-4] if test.endswith("_cpu") else test
        if base in info:
            entry = info[base]
            column = "expanded" if entry["expanded"] else "direct"
            per_op[entry["op"]][f"{column}:{outcome}"] += 1
            kinds[f"node-{column}:{outcome}"] += 1
            if entry["goal"]:
                goal[outcome] += 1
        elif base in model_ops:
            kinds[f"{model_ops[base][0]}:{outcome}"] += 1
    try:
        from tabulate import tabulate
    except ImportError:  # pragma: no cover
        tabulate = None
    rows = []
    for op in sorted(per_op):
        c = per_op[op]
        rows.append([op] + [c[f"{col}:{o}"] for col in ("direct", "expanded")
                            for o in ("passed", "skipped", "failed", "xfail")])
    headers = ["op", "pass", "skip", "fail", "xfail", "exp pass", "exp skip", "exp fail", "exp xfail"]
    print()
    print(tabulate(rows, headers=headers) if tabulate else "\n".join(map(str, [headers] + rows)))
    print()
    for key in sorted(kinds):
        print(f"{key}: {kinds[key]}")
    total = sum(goal.values())
    if total:
        print(f"\ngoal (direct node tests of core ops with float32/int32/int64/bool I/O): "
              f"{goal['passed']}/{total} passed ({100 * goal['passed'] / total:.1f}%), "
              f"{goal['skipped']} skipped, {goal['failed']} failed, {goal['xfail']} xfail")
    failures = [(t, r) for t, r in recorder.reasons.items() if recorder.outcomes[t] == "failed"]
    if failures:
        print("\nfailures:")
        for t, r in sorted(failures):
            print(f"  {t}: {r}")
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
