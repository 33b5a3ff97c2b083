"""The loader fuzz campaign (tests/fuzz/loader_fuzz.py) with a large budget.

    python tests/fuzz/loader_campaign.py --targets tvx --mutations 10000 --workers 2 --out fuzz-out

prints, per target, the mutations tried, the count of each outcome class and examples of each defect
class; every defect example is saved under ``--out/<target>/<class>/`` (the mutated file and what
happened) for reproduction. Exit status 1 when a target has defects.

    python tests/fuzz/loader_campaign.py --replay fuzz-out/tvx/exception/0.bin

runs one saved example again in this process (no limits) and prints its outcome and traceback.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loader_fuzz  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="tvx", help=f"comma-separated, of {','.join(loader_fuzz.TARGETS)}")
    parser.add_argument("--mutations", type=int, default=10000, help="mutations per target")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per case")
    parser.add_argument("--mem-gb", type=float, default=2.0, help="address-space limit of a worker")
    parser.add_argument("--time-budget", type=float, default=None, help="seconds per target at most")
    parser.add_argument("--out", default="loader-fuzz-out", help="where defect examples are saved")
    parser.add_argument("--replay", help="a saved example (.bin, with its .txt beside it) to run again")
    args = parser.parse_args(argv)
    if args.replay:
        return replay(Path(args.replay))
    targets = [t for t in args.targets.split(",") if t]
    unknown = set(targets) - set(loader_fuzz.TARGETS)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}")
    start = time.monotonic()
    reports = loader_fuzz.run_campaign(targets, args.mutations, args.workers, args.seed, args.timeout,
                                       int(args.mem_gb * (1 << 30)), args.time_budget,
                                       log=lambda line: print(line, flush=True))
    out = Path(args.out)
    for report in reports.values():
        print(report.summary())
        report.save_examples(out)
    print(f"total {time.monotonic() - start:.0f} s; defect examples in {out}/")
    return int(any(r.defects for r in reports.values()))


def replay(path: Path) -> int:
    info = dict(line.split(" ", 1) for line in path.with_suffix(".txt").read_text().splitlines()[:5] if " " in line)
    target, seed_name = info["target"], info["seed"]
    seed = next(s for s in loader_fuzz.SEEDS[target]() if s.name == seed_name)
    sealed = {"True": True, "False": False}.get(info.get("sealed", "None"))
    case = loader_fuzz.Case(target, seed_name, path.read_bytes(), info.get("mutation", "?"), sealed)
    outcome, detail = loader_fuzz._execute(case, seed, Path(tempfile.mkdtemp(prefix="tensorvm-replay-")))
    print(f"{outcome}\n{detail}")
    return int(outcome in loader_fuzz.DEFECTS)


if __name__ == "__main__":
    sys.exit(main())
