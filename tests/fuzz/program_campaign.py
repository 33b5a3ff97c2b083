"""A long differential fuzzing campaign (``make fuzz``): random programs on the interpreter and every
executor until a budget of programs or minutes is spent; prints programs, calls, executors, checked
program x executor x call combinations and mismatches, and saves each failing program, shrunk by
Hypothesis against the executors that failed, to ``--out`` (a ``.rly`` file that parses as is, with
the mismatches in a comment on top).

    python tests/fuzz/program_campaign.py --minutes 30
    python tests/fuzz/program_campaign.py --programs 2000 --seed 7 --out fuzz-failures
    python tests/fuzz/program_campaign.py --programs 300 --flavor dataflow --executors vm-python-bytecode \\
        --break specialize     # a reintroduced defect: must report mismatches
    python tests/fuzz/program_campaign.py --programs 300 --flavor dataflow --break arena
    python tests/fuzz/program_campaign.py --programs 300 --flavor dataflow --executors vm-c-native --break native-arena
    python tests/fuzz/program_campaign.py --replay fuzz-failures/*.rly

Exit status 1 when any mismatch (or a program the interpreter rejects) was found.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import program_fuzz as pf  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from program_gen import FLAVORS, programs  # noqa: E402

CHUNK = 50  # programs per Hypothesis run (a failure ends its run, after shrinking)
SHRINK_STEPS = 150  # programs tried while shrinking one failure (each may compile C)
# reintroduced defects (``--break``): each must make the campaign report mismatches
_BREAKAGES = {"specialize": pf.broken_specialization, "arena": pf.broken_arena_placement,
              "native-arena": pf.broken_native_arena}


def campaign(max_programs: int | None, minutes: float | None, first_seed: int, flavor: str | None,
             executors: dict, out: str, log=print) -> pf.Stats:
    stats = pf.Stats()
    start = time.monotonic()
    oracle_errors = 0

    def budget_left() -> bool:
        if max_programs is not None and stats.programs >= max_programs:
            return False
        return minutes is None or time.monotonic() - start < minutes * 60

    run_seed = first_seed
    while budget_left():
        try:
            _hypothesis_run(run_seed, flavor, executors, stats, budget_left)
        except pf.OracleError as err:
            oracle_errors += 1
            _save(out, run_seed, f"oracle error: {err}", None)
            log(f"seed {run_seed}: {str(err).splitlines()[0]}")
        except _Found as found:
            case, mismatches = found.args
            path = _save(out, run_seed, "\n".join(str(m) for m in mismatches), case)
            log(f"seed {run_seed}: mismatch, shrunk program saved to {path}\n{pf.report(case, mismatches)}")
        run_seed += 1
        log(f"[{(time.monotonic() - start) / 60:.1f} min] {stats.summary()}")
    stats.oracle_errors = oracle_errors
    return stats


class _Found(Exception):
    """A run's shrunk failing program and its mismatches."""


def _hypothesis_run(run_seed: int, flavor, executors: dict, stats: pf.Stats, budget_left) -> None:
    """Up to ``CHUNK`` programs from Hypothesis seed ``run_seed``; on a mismatch Hypothesis shrinks the
    program (running only the executors that failed, preferring target python, uncounted; at most
    ``SHRINK_STEPS`` tries) and ``_Found`` carries the result."""
    state = {"focus": None, "last": None, "tries": 0}

    @settings(max_examples=CHUNK, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              phases=(Phase.generate, Phase.shrink), print_blob=False)
    @seed(run_seed)
    @given(programs(flavor))
    def one(case):
        if state["focus"] is None:
            if not budget_left():
                return
            result = (case, pf.run_case(case, stats, executors))
        elif state["tries"] >= SHRINK_STEPS:  # enough: only the smallest failure so far still fails
            result = state["last"] if case.text == state["last"][0].text else (case, [])
        else:
            state["tries"] += 1
            result = (case, pf.run_case(case, pf.Stats(), state["focus"]))
        if result[1]:
            if state["focus"] is None:
                failed = {m.executor for m in result[1]}
                python = {name for name in failed if "-python" in name}
                state["focus"] = {name: executors[name] for name in sorted(python or failed)[:2]}
            state["last"] = result
            raise AssertionError(pf.report(*result))  # one raise site: Hypothesis sees one failure

    try:
        one()
    except Exception as err:  # noqa: BLE001 - a mismatch (or several kinds Hypothesis tells apart)
        if state["last"] is None or isinstance(err, pf.OracleError):
            raise
        raise _Found(*state["last"]) from None


def _save(out: str, run_seed: int, what: str, case) -> str:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"program-seed{run_seed}.rly")
    header = "".join(f"// {line}\n" for line in what.splitlines())
    with open(path, "w") as f:
        f.write(header + (case.text if case is not None else ""))
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=None, help="stop after this many programs")
    parser.add_argument("--minutes", type=float, default=None, help="stop after this many minutes")
    parser.add_argument("--seed", type=int, default=0, help="the first Hypothesis seed (one per run of 50)")
    parser.add_argument("--flavor", choices=FLAVORS, default=None, help="only programs of this flavor")
    parser.add_argument("--executors", default=",".join(pf.EXECUTORS),
                        help=f"comma-separated subset of {', '.join(pf.EXECUTORS)}")
    parser.add_argument("--out", default="fuzz-failures", help="directory for shrunk failing programs")
    parser.add_argument("--replay", nargs="+", metavar="FILE", default=None,
                        help="run saved programs (.rly) instead of generating any")
    parser.add_argument("--break", dest="breakage", choices=tuple(_BREAKAGES), default=None,
                        help="reintroduce a known defect (the run must then report mismatches)")
    args = parser.parse_args(argv)
    if args.programs is None and args.minutes is None:
        args.programs = 200
    names = [n for n in args.executors.split(",") if n]
    unknown = [n for n in names if n not in pf.EXECUTORS]
    if unknown:
        parser.error(f"unknown executors {unknown}; expected some of {', '.join(pf.EXECUTORS)}")
    executors = {n: pf.EXECUTORS[n] for n in names}
    breakage = _BREAKAGES[args.breakage]() if args.breakage else contextlib.nullcontext()
    start = time.monotonic()
    with breakage:
        if args.replay:
            stats = pf.Stats()
            stats.oracle_errors = 0
            for path in args.replay:
                with open(path) as f:
                    case = pf.case_from_text(f.read(), seed=args.seed)
                mismatches = pf.run_case(case, stats, executors)
                print(f"{path}: " + ("ok" if not mismatches else "\n" + pf.report(case, mismatches)))
        else:
            stats = campaign(args.programs, args.minutes, args.seed, args.flavor, executors, args.out)
    print(f"\ncampaign: {stats.summary()} in {(time.monotonic() - start) / 60:.1f} min"
          f"{'' if not stats.oracle_errors else f'; {stats.oracle_errors} programs rejected by the oracle'}")
    print("constructs (programs using each): " + ", ".join(f"{k} {v}" for k, v in sorted(stats.features.items())))
    return 1 if stats.mismatches or stats.oracle_errors else 0


if __name__ == "__main__":
    sys.exit(main())
