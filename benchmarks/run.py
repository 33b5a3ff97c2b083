"""tensorvm against PyTorch and ONNX Runtime: LSTM, Tree-LSTM, BERT, MLP and a CNN, at 1 and 2 threads.

    .venv/bin/python benchmarks/run.py            # the full suite (``make bench``), < 20 minutes
    .venv/bin/python benchmarks/run.py --quick    # a ~2-minute smoke run (fewer cases, shorter timing)
    .venv/bin/python benchmarks/run.py --models lstm,mlp-b1 --threads 1

For every model and thread count it starts one worker process per runtime (see ``harness.py``),
builds the model in each (tensorvm compiles it: target "c" when available, else "python", said in
the table), checks every runtime's outputs against the reference peer's, times all runtimes
interleaved, profiles tensorvm's VM, and records each process's peak resident memory. It writes
``results/latest.md`` (tables), ``results/latest.json`` (everything) and ``results/latest.png``
(charts); ``--quick`` writes ``results/quick.*`` instead. The exit status is 1 when an output was wrong
or a runtime failed unexpectedly (a feature that is not built yet is reported as "n/a", not a failure).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import harness  # noqa: E402
import models  # noqa: E402
from models.common import TENSORVM  # noqa: E402

#: A first call at least this slow serves as the estimate of the call time (no extra estimating call).
SLOW_CALL_S = 0.5
#: Cells whose interquartile range exceeds this fraction of the median are marked as noisy.
NOISY_SPREAD = 0.25
CACHE = Path(os.environ.get("TENSORVM_BENCH_CACHE") or Path.home() / ".cache" / "tensorvm-bench")


class Settings:
    """Repetition policy: every (case, runtime) gets about ``budget_s`` of timed calls, at least
    ``min_reps`` and at most ``max_reps``, spread over ``rounds`` interleaved rounds."""

    def __init__(self, quick: bool, budget_s: float | None):
        self.quick = quick
        self.budget_s = budget_s if budget_s is not None else (0.25 if quick else 1.5)
        self.min_reps = 3 if quick else 7
        self.max_reps = 200 if quick else 1000
        self.rounds = 3 if quick else 5
        self.case_cap_s = 2.0 if quick else 6.0  # timed seconds per (case, runtime) for slow calls
        self.setup_timeout_s = 1200.0


# --- machine and versions ------------------------------------------------------------------------------
def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return float("nan")


def _git_revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        # (the results of an earlier run, which this one overwrites, do not make the code uncommitted)
        dirty = subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no",
                                "--", ".", ":!benchmarks/results"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        return (rev or "unknown") + (" + uncommitted changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _kernel_width() -> str:
    """The vectors tensorvm's C kernels are built with here and why (``host.width_why``: the ISA's, or the
    FMA datapath's where narrower; ``$TENSORVM_HOST`` pins either); the workers inherit the environment."""
    try:
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from tensorvm.codegen import host as hostmod

        return hostmod.width_why(hostmod.host())
    except Exception as err:  # (a report line: never the reason a run fails)
        return f"unknown ({type(err).__name__})"


def machine_info(thread_counts, settings: Settings) -> dict:
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "kernel_width": _kernel_width(),
        "cpu": _cpu_model(), "logical_cpus": os.cpu_count(), "memory_gb": round(_memory_gb(), 1),
        "os": platform.platform(), "python": platform.python_version(),
        "versions": {name: _version(name) for name in
                     ("tensorvm", "numpy", "torch", "onnxruntime", "onnx", "transformers")},
        "tensorvm_revision": _git_revision(), "threads": list(thread_counts), "quick": settings.quick,
        "budget_s": settings.budget_s, "min_reps": settings.min_reps, "max_reps": settings.max_reps,
        "rounds": settings.rounds, "case_cap_s": settings.case_cap_s, "load_start": _load_average(),
    }


def _load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


# --- artifacts ----------------------------------------------------------------------------------------
def artifact_dir(group, quick: bool, log) -> tuple[Path, str]:
    """The group's prepared files (ONNX exports), made once and cached; ``(dir, error or "")``."""
    stamp = "-".join(f"{p}{_version(p)}" for p in ("torch", "transformers", "onnx"))
    directory = CACHE / f"{group.artifact_key or group.key}-{stamp}"
    if group.prepare is None or (directory / "complete").exists():
        return directory, ""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    print(f"  preparing {group.key} (ONNX export) ...", flush=True)
    command = [sys.executable, str(HERE / "harness.py"), "prepare", "--group", group.key, "--dir", str(directory)]
    if quick:
        command.append("--quick")
    done = subprocess.run(command, stdout=log, stderr=log, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0 or not (directory / "complete").exists():
        return directory, f"preparing the ONNX export failed (status {done.returncode}; see the log)"
    return directory, ""


# --- one model at one thread count ---------------------------------------------------------------------
def run_group(group, threads: int, first_pass: bool, settings: Settings, scratch: Path, artifacts: Path,
              prepare_error: str, log, timed_out: dict | None = None) -> dict:
    """One model at one thread count. ``timed_out`` maps ``(group, runtime)`` to the thread count at which
    that runtime went over the model's budget: it is not started again (and gets entries here)."""
    timed_out = {} if timed_out is None else timed_out
    result = {"runtimes": {}}
    workers = {}
    for spec in group.runtimes:
        entry = {"label": spec.label, "family": spec.family, "status": "ok", "cases": {}}
        result["runtimes"][spec.key] = entry
        if (group.key, spec.key) in timed_out:
            entry.update(status="timeout", message=f"not run: over the budget at {timed_out[group.key, spec.key]}")
            _say(f"    {spec.label}: {entry['message']}")
            continue
        kernel_cache = scratch / "kernels" / f"{group.key}-{spec.key}"
        kernel_cache.mkdir(parents=True, exist_ok=True)
        worker = harness.Worker(group.key, spec.key, threads, artifacts, settings.quick,
                                env_extra={"TENSORVM_CACHE_DIR": str(kernel_cache)},
                                second_compile=first_pass, log=log, budget_s=group.budget_s)
        started = time.perf_counter()
        try:
            reply = worker.request({"cmd": "setup"}, timeout_s=settings.setup_timeout_s)
        except harness.WorkerError as err:
            entry.update(status=err.status, message=err.message, detail=err.detail[-2000:])
            if prepare_error and err.status == "error":
                entry["message"] = f"{prepare_error}; {err.message}"
            entry.update(worker.close())
            _say(f"    {spec.label}: {err.status}: {err.message}")
            continue
        entry["setup_wall_s"] = time.perf_counter() - started
        entry["info"] = reply["info"]
        entry["label"] = spec.label_for(reply["info"])
        entry["rss_start_mb"], entry["rss_setup_mb"] = reply["rss_start_mb"], reply["rss_setup_mb"]
        workers[spec.key] = worker
        info = reply["info"]
        compile_note = ""
        if "compile_cold_s" in info:
            compile_note = f", compile {info['compile_cold_s']:.2f} s ({info.get('target')})"
        _say(f"    {entry['label']}: ready in {entry['setup_wall_s']:.1f} s{compile_note}")

    for case in group.cases:
        _run_case(group, case, workers, result, settings, scratch, threads)

    # Where the time goes: tensorvm's VM profile of the largest case (first pass only).
    if first_pass:
        for key, worker in workers.items():
            entry = result["runtimes"][key]
            if entry["family"] != TENSORVM or entry["status"] != "ok":
                continue
            try:
                profile = worker.request({"cmd": "profile", "case": group.cases[-1].name}, timeout_s=600)["profile"]
            except harness.WorkerError as err:
                profile = {"error": err.message}
            if profile:
                entry["profile"] = {"case": group.cases[-1].name, **profile}

    for key, worker in workers.items():
        result["runtimes"][key].update(worker.close())
    for key, entry in result["runtimes"].items():
        if entry["status"] == "timeout" and (group.key, key) not in timed_out:
            timed_out[group.key, key] = f"{threads} thread{'s' if threads > 1 else ''} ({entry['message']})"
    return result


def _run_case(group, case, workers: dict, result: dict, settings: Settings, scratch: Path, threads: int):
    runtimes = result["runtimes"]
    alive = {k: w for k, w in workers.items() if runtimes[k]["status"] == "ok"}
    first_call = {}
    for key, worker in list(alive.items()):  # the first call: warm-up, outputs for the check
        path = scratch / f"{group.key}-t{threads}-{key}-{case.name}.npz"
        try:
            reply = worker.request({"cmd": "check", "case": case.name, "path": str(path)},
                                   timeout_s=settings.setup_timeout_s)
            first_call[key] = reply["seconds"]
            if reply.get("info"):  # the worker fell back to another target
                runtimes[key]["info"] = reply["info"]
                runtimes[key]["label"] = next(s for s in group.runtimes if s.key == key).label_for(reply["info"])
                _say(f"    {runtimes[key]['label']}: {reply['info'].get('fallback')}")
        except harness.WorkerError as err:
            _fail(runtimes[key], err, case)
            alive.pop(key)
    outputs = {}
    for key in alive:
        with np.load(scratch / f"{group.key}-t{threads}-{key}-{case.name}.npz") as data:
            outputs[key] = [data[f"arr_{i}"] for i in range(len(data.files))]
    reference = group.reference if group.reference in outputs else next(
        (k for k in outputs if runtimes[k]["family"] != TENSORVM), None)
    for key in alive:
        check = {"reference": reference, "ok": None, "max_abs_err": None, "reason": "no reference ran"}
        if reference is not None and key != reference:
            got = outputs[key]
            if group.align is not None:
                got = group.align(got, outputs[reference], group.atol, group.rtol)
            check = {"reference": reference, **harness.compare_outputs(got, outputs[reference], group.atol, group.rtol)}
        elif key == reference:
            check = {"reference": reference, "ok": True, "max_abs_err": 0.0, "reason": "is the reference"}
        runtimes[key]["cases"][case.name] = {"check": check, "first_call_s": first_call[key]}
        if check["ok"] is False:
            _say(f"    {runtimes[key]['label']} {case.name}: WRONG OUTPUT: {check['reason']}")

    estimates, reps, warmup, timeouts = {}, {}, {}, {}
    for key, worker in list(alive.items()):  # one warm call to estimate the per-call time
        if first_call[key] >= SLOW_CALL_S:  # slow enough that the first call is a fair estimate
            estimates[key] = first_call[key]
        else:
            try:  # (the median of 3: one call can hit a stall and set the repetitions 100x too low)
                estimates[key] = float(np.median(worker.request({"cmd": "time", "case": case.name, "reps": 3},
                                                                timeout_s=max(600.0, 60 * first_call[key]))["samples"]))
            except harness.WorkerError as err:
                _fail(runtimes[key], err, case)
                alive.pop(key)
                continue
            finally:
                harness.wait_until_idle(worker.process.pid)
        reps[key] = harness.repetitions(estimates[key], settings.budget_s, settings.min_reps, settings.max_reps,
                                        settings.case_cap_s)
        warmup[key] = 1 if estimates[key] < harness.WARMUP_LIMIT_S else 0
        timeouts[key] = max(300.0, 20 * estimates[key] * (reps[key] / settings.rounds + 1))
    samples = harness.interleaved_timing(alive, case.name, reps, settings.rounds, warmup, timeouts)
    for key, values in samples.items():
        if isinstance(values, harness.WorkerError):
            _fail(runtimes[key], values, case)
            continue
        stats = harness.summarize(values)
        stats["per_unit_us"] = stats["median"] / case.units * 1e6
        runtimes[key]["cases"][case.name].update(stats)
    line = ", ".join(f"{runtimes[k]['label']} {runtimes[k]['cases'][case.name]['per_unit_us']:.1f}"
                     for k in alive if "per_unit_us" in runtimes[k]["cases"].get(case.name, {}))
    _say(f"    {case.label}: us/{group.unit}: {line}")


def _fail(entry: dict, err: harness.WorkerError, case) -> None:
    entry.update(status=err.status, message=f"{case.name}: {err.message}", detail=err.detail[-2000:])
    _say(f"    {entry['label']}: {err.status} in {case.name}: {err.message}")


def _say(text: str) -> None:
    print(text, flush=True)


# --- main -------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer cases, short timing")
    parser.add_argument("--threads", default=None, help="comma-separated thread counts (default 1,2; quick: 1)")
    parser.add_argument("--models", default=None,
                        help="comma-separated model keys, or 'corpus' / 'suite' for the real-model corpus / the "
                             "original five (default: all)")
    parser.add_argument("--budget", type=float, default=None, help="seconds of timed calls per case and runtime")
    parser.add_argument("--model-budget", type=float, default=None,
                        help="seconds one runtime may spend on one corpus model per thread count (default 300; "
                             "quick 180); over it, the worker and its children are killed and the row says timeout")
    parser.add_argument("--out", default=None, help="output prefix (default results/latest or results/quick)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, outputs)")
    parser.add_argument("--background-load", type=int, default=0, metavar="N",
                        help="N processes spinning in a busy loop for the whole run (the issue's 'one busy core': "
                             "1), so that every runtime is measured beside other work (default 0)")
    args = parser.parse_args(argv)

    settings = Settings(args.quick, args.budget)
    thread_counts = [int(t) for t in (args.threads or ("1" if args.quick else "1,2")).split(",")]
    groups = models.groups(args.quick)
    if args.models:
        wanted = []
        for key in args.models.split(","):  # "corpus" and "suite" stand for their models
            if key in ("corpus", "suite"):
                wanted += [g.key for g in groups if g.corpus == (key == "corpus")]
            else:
                wanted.append(key)
        unknown = set(wanted) - {g.key for g in groups}
        if unknown:
            parser.error(f"unknown model(s) {', '.join(sorted(unknown))}; known: {', '.join(g.key for g in groups)}")
        groups = [g for g in groups if g.key in wanted]
    if args.model_budget is not None:
        groups = [dataclasses.replace(g, budget_s=args.model_budget) if g.corpus else g for g in groups]
    out = Path(args.out) if args.out else HERE / "results" / ("quick" if args.quick else "latest")
    out.parent.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="tensorvm-bench-"))
    log_path = scratch / "workers.log"
    meta = machine_info(thread_counts, settings)
    meta["background_load"] = args.background_load
    _say(f"tensorvm benchmarks ({'quick' if args.quick else 'full'}): {meta['cpu']}, {meta['logical_cpus']} CPUs; "
         f"threads {thread_counts}; log {log_path}")
    busy = (meta["load_start"] or [0])[0]
    if busy > 0.5 * (meta["logical_cpus"] or 1) and not args.background_load:
        _say(f"warning: the machine is busy (load average {busy:.1f} on {meta['logical_cpus']} CPUs): "
             "timings will be noisy, 2-thread ones especially")
    report = {"meta": meta, "groups": []}
    with open(log_path, "w") as log, harness.background_load(args.background_load):
        prepared = {}
        for group in groups:
            prepared[group.key] = artifact_dir(group, args.quick, log)
        for group in groups:
            report["groups"].append({
                "key": group.key, "title": group.title, "unit": group.unit, "reference": group.reference,
                "description": group.description, "show_per_inference": group.show_per_inference,
                "corpus": group.corpus, "budget_s": group.budget_s if math.isfinite(group.budget_s) else None,
                "cases": [{"name": c.name, "label": c.label, "units": c.units, "x": c.x} for c in group.cases],
                "prepare_error": prepared[group.key][1], "passes": {},
            })
        timed_out: dict = {}
        for index, threads in enumerate(thread_counts):
            for group, entry in zip(groups, report["groups"]):
                _say(f"== {group.title} · {threads} thread{'s' if threads > 1 else ''}")
                directory, error = prepared[group.key]
                group_started = time.perf_counter()
                entry["passes"][str(threads)] = run_group(group, threads, index == 0, settings, scratch, directory,
                                                          error, log, timed_out)
                entry["passes"][str(threads)]["elapsed_s"] = round(time.perf_counter() - group_started, 1)
    meta["elapsed_s"] = round(time.perf_counter() - started, 1)
    meta["load_end"] = _load_average()

    out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=float))
    write_markdown(report, out.with_suffix(".md"))
    chart_error = write_chart(report, out.with_suffix(".png"))
    if chart_error:
        _say(f"chart not written: {chart_error}")
    problems = failures(report)
    for line in corpus_summary_lines(corpus_rows(report)):
        _say(line)
    _say(f"wrote {out.with_suffix('.md')} in {meta['elapsed_s']:.0f} s")
    for note in fallbacks(report):
        _say(f"note: {note}")
    for problem in problems:
        _say(f"PROBLEM: {problem}")
    if args.keep or problems:
        _say(f"scratch directory kept: {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if problems else 0


# --- the report -----------------------------------------------------------------------------------------
def _fmt_us(us: float | None) -> str:
    if us is None:
        return "—"
    if us >= 100_000:
        return f"{us / 1000:,.0f} ms"
    if us >= 10_000:
        return f"{us / 1000:.1f} ms"
    if us >= 100:
        return f"{us:,.0f} µs"
    return f"{us:.1f} µs" if us >= 10 else f"{us:.2f} µs"


def _fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "—"
    return f"{ratio:.2f}×" if ratio < 10 else f"{ratio:.0f}×"


def _latency(entry: dict, case: str) -> float | None:
    return entry["cases"].get(case, {}).get("per_unit_us")


def _cell(entry: dict, case: dict, group: dict) -> str:
    values = entry["cases"].get(case["name"], {})
    if entry["status"] != "ok" and "per_unit_us" not in values:
        return entry["status"] if entry["status"] in ("n/a", "timeout") else "error"
    if "per_unit_us" not in values:
        return "—"
    text = _fmt_us(values["per_unit_us"])
    if group["show_per_inference"]:
        text += f" ({values['median'] * 1e3:,.1f} ms)"
    if values.get("spread", 0.0) > NOISY_SPREAD:
        text += " †"
    if values.get("check", {}).get("ok") is False:
        text += " **WRONG**"
    return text


def _target(entry: dict) -> str:
    info = entry.get("info", {})
    if "target" not in info:
        return "—"
    return info["target"] + (" (c n/a)" if info.get("fallback") else "")


def _compile(entry: dict, first: dict | None) -> str:
    info = (first or entry).get("info", {})
    if "compile_cold_s" in info:
        cached = info.get("compile_cached_s")
        return f"{info['compile_cold_s']:.2f} / " + (f"{cached:.2f}" if cached is not None else "—")
    if "build_s" in info:
        return f"load {info['build_s']:.2f}"
    return "—"


def _outputs(entry: dict) -> str:
    checks = [v["check"] for v in entry["cases"].values() if "check" in v]
    if not checks:
        return "—"
    wrong = [c for c in checks if c["ok"] is False]
    if wrong:
        return f"**WRONG**: {wrong[0]['reason']}"
    if all(c.get("reason") == "is the reference" for c in checks):
        return "reference"
    errors = [c["max_abs_err"] for c in checks if c.get("max_abs_err") is not None]
    if not errors:
        return "unchecked"
    return f"ok ({max(errors):.0e})"


def _best(result: dict, case: str, family_is_tvm: bool):
    best = None
    for entry in result["runtimes"].values():
        if (entry["family"] == TENSORVM) != family_is_tvm:
            continue
        values = entry["cases"].get(case, {})
        if "per_unit_us" not in values or values.get("check", {}).get("ok") is False:
            continue
        if best is None or values["per_unit_us"] < best[1]:
            best = (entry["label"], values["per_unit_us"])
    return best


def _threads_label(threads: str) -> str:
    return f"{threads} thread" + ("s" if threads != "1" else "")


def write_markdown(report: dict, path: Path) -> None:
    meta = report["meta"]
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    lines = [
        "# tensorvm benchmarks" + (" (quick smoke run)" if meta["quick"] else ""), "",
        f"- date: {meta['date']}; run took {meta.get('elapsed_s', 0) / 60:.1f} min",
        f"- machine: {meta['cpu']}, {meta['logical_cpus']} logical CPUs, {meta['memory_gb']} GB RAM; {meta['os']}",
        f"- tensorvm's C kernels: {meta.get('kernel_width', 'unknown')}",
        f"- software: Python {meta['python']}; {versions}; tensorvm revision {meta['tensorvm_revision']}",
        f"- threads: {', '.join(map(str, meta['threads']))} (the same count for every runtime: OMP/OpenBLAS/MKL "
        "variables, `torch.set_num_threads`, ORT `intra_op_num_threads`)",
        f"- method: one process per runtime; after a warm-up call, about {meta['budget_s']:g} s of calls per case "
        f"and runtime ({meta['min_reps']}-{meta['max_reps']} calls) in {meta['rounds']} interleaved rounds; "
        "latency = median of the per-call times; every runtime's outputs are checked against the reference "
        "peer's in the same run; peak RSS is the worker process's `ru_maxrss` (after imports, build, compile "
        "and runs); compile = `tv.vm.compile` (or building the graph/AOT executor) with an empty kernel cache "
        "(cold), and of a freshly built module in the same process with the kernel libraries cached on disk "
        "(cached); ONNX import time is not included.",
        "- ratio = tensorvm latency / peer latency: below 1 tensorvm is faster. † marks a noisy cell: the "
        f"interquartile range of its calls exceeds {NOISY_SPREAD:.0%} of the median.",
        f"- load average (1, 5, 15 min) at the start: {meta.get('load_start')}, at the end: {meta.get('load_end')} "
        f"(on {meta['logical_cpus']} CPUs; a load above the thread count means other processes competed "
        "and the numbers are less reliable).",
    ]
    if meta.get("background_load"):
        lines.append(f"- background load: {meta['background_load']} process(es) spinning in a busy loop for the "
                     "whole run (deliberate: every runtime measured beside other work).")
    lines.append("")
    rows = corpus_rows(report)
    if rows:
        lines += corpus_markdown(report, rows)
    lines += ["## Summary", ""]
    threads_list = [str(t) for t in meta["threads"]]
    for threads in threads_list:
        lines += [f"### {_threads_label(threads)}", "",
                  "| model | case | tensorvm (fastest) | latency | peer (fastest) | latency | ratio |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for group in report["groups"]:
            result = group["passes"].get(threads)
            if result is None:
                continue
            for case in group["cases"]:
                tvm, peer = _best(result, case["name"], True), _best(result, case["name"], False)
                ratio = tvm[1] / peer[1] if tvm and peer else None
                lines.append(f"| {group['title']} | {case['label']} (per {group['unit']}) | "
                             f"{tvm[0] if tvm else 'none ran'} | {_fmt_us(tvm[1]) if tvm else '—'} | "
                             f"{peer[0] if peer else 'none ran'} | {_fmt_us(peer[1]) if peer else '—'} | "
                             f"{_fmt_ratio(ratio)} |")
        lines.append("")

    for group in report["groups"]:
        lines += [f"## {group['title']}", ""]
        if group["description"]:
            lines += [f"{group['description'][:1].upper()}{group['description'][1:]}. Latency per {group['unit']}"
                      + (" (and per inference)" if group["show_per_inference"] else "") + ".", ""]
        first = group["passes"].get(threads_list[0], {}).get("runtimes", {})
        for threads in threads_list:
            result = group["passes"].get(threads)
            if result is None:
                continue
            cases = group["cases"]
            lines += [f"### {_threads_label(threads)}", "",
                      "| runtime | " + " | ".join(c["label"] for c in cases)
                      + " | peak RSS (MB) | compile cold / cached (s) | target | outputs |",
                      "| --- |" + " --- |" * (len(cases) + 4)]
            for key, entry in result["runtimes"].items():
                rss = f"{entry['peak_rss_mb']:,.0f}" if entry.get("peak_rss_mb") and entry["status"] != "n/a" else "—"
                lines.append(f"| {entry['label']} | " + " | ".join(_cell(entry, c, group) for c in cases)
                             + f" | {rss} | {_compile(entry, first.get(key))} | {_target(entry)} | "
                             f"{_outputs(entry) if entry['status'] != 'n/a' else 'n/a'} |")
            ratio_rows = []
            for tvm in result["runtimes"].values():
                if tvm["family"] != TENSORVM or not tvm["cases"]:
                    continue
                for peer in result["runtimes"].values():
                    if peer["family"] == TENSORVM or not peer["cases"]:
                        continue
                    cells = []
                    for c in cases:
                        a, b = _latency(tvm, c["name"]), _latency(peer, c["name"])
                        cells.append(_fmt_ratio(a / b) if a and b else "—")
                    ratio_rows.append(f"| {tvm['label']} | {peer['label']} | " + " | ".join(cells) + " |")
            if ratio_rows:
                lines += ["", "| ratio: tensorvm runtime | / peer | " + " | ".join(c["label"] for c in cases) + " |",
                          "| --- | --- |" + " --- |" * len(cases)] + ratio_rows
            lines.append("")

    lines += ["## Where the time goes (tensorvm VM profile, first thread count)", ""]
    for group in report["groups"]:
        result = group["passes"].get(threads_list[0], {})
        for entry in result.get("runtimes", {}).values():
            profile = entry.get("profile")
            if not profile:
                continue
            if "error" in profile:
                lines += [f"- {group['title']} · {entry['label']}: profiling failed: {profile['error']}", ""]
                continue
            total = profile["total_us"] or 1.0
            lines += [f"### {group['title']} · {entry['label']} · {profile['case']}", "",
                      f"One call: {total / 1000:,.2f} ms; kernels {100 * profile['kernel_us'] / total:.0f}%, "
                      f"VM operations (allocation, shape_of, reshape) {100 * profile['vm_op_us'] / total:.0f}%, "
                      f"dispatch and the rest {100 * profile['other_us'] / total:.0f}% "
                      f"({profile['num_rows']} distinct kernels/ops).", "",
                      "| kernel or VM op | calls | total (ms) | share | first argument shapes |",
                      "| --- | --- | --- | --- | --- |"]
            for row in profile["rows"]:
                lines.append(f"| `{row['name']}` | {row['calls']} | {row['total_us'] / 1000:,.2f} | "
                             f"{100 * row['total_us'] / total:.1f}% | {row['shape'][:90]} |")
            lines.append("")

    notes = []
    for group in report["groups"]:
        if group.get("prepare_error"):
            notes.append(f"- {group['title']}: {group['prepare_error']}")
        seen = set()
        for threads in threads_list:
            for entry in group["passes"].get(threads, {}).get("runtimes", {}).values():
                message = None
                if entry["status"] != "ok":
                    message = f"{entry['status']}: {entry.get('message', '')}"
                elif entry.get("info", {}).get("fallback"):
                    message = f"fell back to target python ({entry['info']['fallback']})"
                if message and (entry["label"], message) not in seen:
                    seen.add((entry["label"], message))
                    notes.append(f"- {group['title']} · {entry['label']}: {message}")
    if notes:
        lines += ["## Notes: rows not measured, fallbacks", ""] + notes + [""]
    path.write_text("\n".join(lines))


# --- the real-model corpus --------------------------------------------------------------------------
CORPUS_PEER = "ort"  # the corpus's ratio is tensorvm / ONNX Runtime


def _fastest_tensorvm(runtimes: dict, case: str) -> str:
    """The key of the fastest tensorvm runtime ("tvm", or "tvm-<exec mode>") with a correct result for
    ``case`` ("tvm" when none has one, so that its status explains the row)."""
    def median(key):
        values = runtimes[key].get("cases", {}).get(case, {})
        ok = values.get("check", {}).get("ok") is not False
        return values["median"] if ok and "median" in values else float("inf")

    keys = [k for k in runtimes if k == "tvm" or k.startswith("tvm-")]
    timed = [k for k in keys if median(k) < float("inf")]
    return min(timed, key=median) if timed else "tvm"


def corpus_rows(report: dict) -> list[dict]:
    """One row per corpus model, case and thread count: the latency (ms per call, median) of tensorvm,
    ONNX Runtime and PyTorch eager, the ratio tensorvm / ONNX Runtime, tensorvm's error against the
    reference, and why a row has no ratio (timeout, error, wrong output)."""
    rows = []
    for group in report["groups"]:
        if not group.get("corpus"):
            continue
        first = next(iter(group["passes"].values()), {}).get("runtimes", {})
        for threads, result in group["passes"].items():
            runtimes = result["runtimes"]
            for case in group["cases"]:
                row = {"model": group["key"], "title": group["title"], "case": case["label"], "threads": int(threads)}
                best = _fastest_tensorvm(runtimes, case["name"])  # (a model may measure several exec modes)
                row["tvm_runtime"] = best
                for key in ("tvm", "ort", "torch"):
                    entry = runtimes.get(best if key == "tvm" else key, {})
                    values = entry.get("cases", {}).get(case["name"], {})
                    row[f"{key}_ms"] = values["median"] * 1e3 if "median" in values else None
                    row[f"{key}_noisy"] = values.get("spread", 0.0) > NOISY_SPREAD
                    if key == "tvm":
                        check = values.get("check", {})
                        row.update(ok=check.get("ok"), max_abs_err=check.get("max_abs_err"),
                                   max_rel_err=check.get("max_rel_err"), check_reason=check.get("reason", ""),
                                   status=entry.get("status", "missing"), message=entry.get("message", ""))
                info = first.get(best, {}).get("info", {})
                row["compile_cold_s"], row["compile_cached_s"] = info.get("compile_cold_s"), info.get("compile_cached_s")
                ratio = None
                if row["tvm_ms"] and row["ort_ms"] and row["ok"] is not False:
                    ratio = row["tvm_ms"] / row["ort_ms"]
                row["ratio"] = ratio
                if ratio is None:
                    row["reason"] = ("wrong output: " + row["check_reason"] if row["ok"] is False
                                     else f"{row['status']}: {row['message']}" if row["status"] != "ok"
                                     else "no ONNX Runtime time" if row["tvm_ms"] else "not timed")
                rows.append(row)
    return rows


def corpus_summary(rows: list[dict]) -> dict:
    """Geometric mean of the ratios per thread count and over all rows, the worst row, and the rows
    without a ratio."""
    def geomean(values):
        values = [v for v in values if v and v > 0]
        return math.exp(sum(map(math.log, values)) / len(values)) if values else None

    measured = [r for r in rows if r["ratio"] is not None]
    by_threads = {t: geomean(r["ratio"] for r in measured if r["threads"] == t)
                  for t in sorted({r["threads"] for r in rows})}
    return {"geomean": geomean(r["ratio"] for r in measured), "geomean_by_threads": by_threads,
            "worst": max(measured, key=lambda r: r["ratio"]) if measured else None,
            "unmeasured": [r for r in rows if r["ratio"] is None], "rows": len(rows)}


def _row_name(row: dict) -> str:
    return f"{row['model']} {row['case']}, {_threads_label(str(row['threads']))}"


def corpus_summary_lines(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    summary = corpus_summary(rows)
    lines = []
    if summary["geomean"] is not None:
        per = ", ".join(f"{_threads_label(str(t))} {_fmt_ratio(g)}" for t, g in summary["geomean_by_threads"].items()
                        if g is not None)
        worst = summary["worst"]
        lines.append(f"corpus: tensorvm / ONNX Runtime geometric mean {_fmt_ratio(summary['geomean'])} over "
                     f"{summary['rows'] - len(summary['unmeasured'])} rows ({per}); worst row {_row_name(worst)}: "
                     f"{_fmt_ratio(worst['ratio'])} ({worst['tvm_ms']:.3g} vs {worst['ort_ms']:.3g} ms)")
    seen = set()
    for row in summary["unmeasured"]:
        key = (row["model"], row["threads"], row["reason"])
        if key not in seen:
            seen.add(key)
            lines.append(f"corpus: no ratio for {row['model']} ({_threads_label(str(row['threads']))}): {row['reason']}")
    return lines


def _ms(value: float | None, noisy: bool = False) -> str:
    return "—" if value is None else _fmt_us(value * 1e3) + (" †" if noisy else "")


def _err(value: float | None) -> str:
    return "—" if value is None else f"{value:.1e}"


def corpus_markdown(report: dict, rows: list[dict]) -> list[str]:
    summary = corpus_summary(rows)
    lines = ["## Real-model corpus: tensorvm against ONNX Runtime", "",
             "PyTorch models with random weights exported to ONNX with dynamic axes; tensorvm imports each with "
             "`tv.frontend.from_onnx` and compiles ONE VM executable (target c) that runs every case. Latency: "
             "median ms per call; ratio = tensorvm / ONNX Runtime (below 1 tensorvm is faster); error: tensorvm "
             "against ONNX Runtime, max |error| and max |error| / max |reference|; compile: cold (empty kernel "
             "cache) / cached (s). A runtime that spends more than the model's budget is killed with its "
             f"children and its row says where. † marks a noisy cell (interquartile range over {NOISY_SPREAD:.0%} "
             f"of the median); the load average at the start was {report['meta'].get('load_start')} on "
             f"{report['meta'].get('logical_cpus')} CPUs"
             + (f", with {report['meta']['background_load']} busy background process(es) for the whole run."
                if report['meta'].get('background_load') else "."), ""]
    for line in corpus_summary_lines(rows):
        lines.append("- " + line.removeprefix("corpus: "))
    lines += ["", "| model | case | threads | tensorvm | ONNX Runtime | PyTorch eager | ratio | max abs / rel error "
              "| compile cold / cached (s) |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    worst = summary["worst"]
    for row in rows:
        ratio = _fmt_ratio(row["ratio"]) if row["ratio"] is not None else row["reason"][:120]
        if row is worst:
            ratio = f"**{ratio}** (worst)"
        if row["ok"] is False:
            ratio = f"**WRONG**: {row['check_reason'][:120]}"
        compile_text = "—"
        if row["compile_cold_s"] is not None:
            cached = row["compile_cached_s"]
            compile_text = f"{row['compile_cold_s']:.1f} / " + (f"{cached:.2f}" if cached is not None else "—")
        lines.append(f"| {row['title']} | {row['case']} | {row['threads']} | {_ms(row['tvm_ms'], row['tvm_noisy'])} | "
                     f"{_ms(row['ort_ms'], row['ort_noisy'])} | {_ms(row['torch_ms'], row['torch_noisy'])} | {ratio} | "
                     f"{_err(row['max_abs_err'])} / {_err(row['max_rel_err'])} | {compile_text} |")
    lines += ["", "### tensorvm executables (`exe.stats()`)", "",
              "| model | kernels | C kernels | NumPy fallbacks | VM instructions (most frequent) | C source (KB) "
              "| C compile (s) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    fallback_notes = []
    for group in report["groups"]:
        if not group.get("corpus"):
            continue
        info = next(iter(group["passes"].values()), {}).get("runtimes", {}).get("tvm", {}).get("info", {})
        exe = info.get("exe")
        if not exe or "error" in exe:
            lines.append(f"| {group['key']} | — | — | — | {(exe or {}).get('error', 'not compiled')} | — | — |")
            continue
        top = ", ".join(f"{k} {v}" for k, v in list(exe["top_opcodes"].items())[:4])
        source = f"{exe['c_source_bytes'] / 1024:,.0f}" if exe.get("c_source_bytes") is not None else "—"
        c_compile = f"{exe['c_compile_s']:.1f}" if exe.get("c_compile_s") is not None else "—"
        lines.append(f"| {group['key']} | {exe['kernels']} | {exe['c_kernels']} | {len(exe['numpy_fallbacks'])} | "
                     f"{exe['instructions']} ({top}) | {source} | {c_compile} |")
        fallback_notes += [f"- {group['key']}: `{name}`: {why}" for name, why in exe["numpy_fallbacks"].items()]
    if fallback_notes:
        lines += ["", "NumPy fallbacks (kernels target c could not compile):", ""] + fallback_notes
    return lines + [""]


def write_chart(report: dict, path: Path) -> str:
    """The PNG: µs/token against sequence length for BERT, bars per model for the rest. Returns an
    error message when matplotlib is missing or nothing was measured, else ""."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        return f"matplotlib is not installed ({err})"
    threads_list = [str(t) for t in report["meta"]["threads"]]
    line_groups = [g for g in report["groups"] if all(c["x"] is not None for c in g["cases"])
                   and g["show_per_inference"]]
    bar_groups = [g for g in report["groups"] if g not in line_groups]
    panels = len(line_groups) + (1 if bar_groups else 0)
    if panels == 0:
        return "nothing to plot"
    fig, axes = plt.subplots(panels, 1, figsize=(12, 4.2 * panels + (1.2 if bar_groups else 0)), squeeze=False)
    colors: dict = {}

    def color(label):
        # tab20 holds ten hues in dark/light pairs: use the dark ones first so neighbours differ in hue
        index = len(colors) % 20
        return colors.setdefault(label, plt.get_cmap("tab20")((2 * index) % 20 + (index >= 10)))

    for ax, group in zip(axes[:, 0], line_groups):
        for t_index, threads in enumerate(threads_list):
            for entry in group["passes"].get(threads, {}).get("runtimes", {}).values():
                points = [(c["x"], _latency(entry, c["name"])) for c in group["cases"]]
                points = [(x, y) for x, y in points if y]
                if points:
                    ax.plot(*zip(*points), marker="o", color=color(entry["label"]),
                            linestyle="-" if t_index == 0 else "--",
                            label=f"{entry['label']} ({_threads_label(threads)})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel("µs per token")
        ax.set_title(group["title"])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    if bar_groups:
        ax = axes[-1, 0]
        threads = threads_list[0]
        position, ticks, tick_labels, labelled = 0.0, [], [], set()
        for group in bar_groups:
            for case in group["cases"]:
                entries = [e for e in group["passes"].get(threads, {}).get("runtimes", {}).values()
                           if _latency(e, case["name"])]
                if not entries:
                    continue
                start = position
                for entry in entries:
                    label = entry["label"]
                    ax.bar(position, _latency(entry, case["name"]), width=0.8, color=color(label),
                           label=label if label not in labelled else None,
                           hatch="//" if entry["family"] != TENSORVM else None)
                    labelled.add(label)
                    position += 1
                ticks.append((start + position - 1) / 2)
                tick_labels.append(f"{group['key']}\n{case['label']}\n(µs/{group['unit']})")
                position += 1.5
        ax.set_xticks(ticks)
        ax.set_xticklabels(tick_labels, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("latency (µs per unit, log)")
        ax.set_title(f"latency per model ({_threads_label(threads)}; hatched: peers)")
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return ""


def fallbacks(report: dict) -> list[str]:
    """tensorvm runtimes that ran on another target than the first choice, and why."""
    notes = set()
    for group in report["groups"]:
        for result in group["passes"].values():
            for key, entry in result["runtimes"].items():
                if entry.get("info", {}).get("fallback"):
                    notes.add(f"{group['key']}/{key}: target {entry['info']['target']} "
                              f"({entry['info']['fallback']})")
    return sorted(notes)


def failures(report: dict) -> list[str]:
    """Wrong outputs and unexpected runtime errors (not "n/a")."""
    problems = []
    for group in report["groups"]:
        for threads, result in group["passes"].items():
            for key, entry in result["runtimes"].items():
                where = f"{group['key']}/{key}/{threads} thread(s)"
                if entry["status"] == "error":
                    problems.append(f"{where}: {entry.get('message')}")
                for case, values in entry["cases"].items():
                    if values.get("check", {}).get("ok") is False:
                        problems.append(f"{where} {case}: wrong output ({values['check']['reason']})")
    return problems


if __name__ == "__main__":
    sys.exit(main())
