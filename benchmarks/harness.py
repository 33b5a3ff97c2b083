"""The benchmark harness: one worker process per runtime, interleaved timing, correctness, memory.

Why processes: every runtime (a tensorvm executor, PyTorch, TorchScript, ONNX Runtime) runs in a
worker process of its own, started with the thread count fixed in its environment before anything is
imported (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``; PyTorch also gets
``torch.set_num_threads``, ONNX Runtime ``intra_op_num_threads``). So

* each process's peak resident memory (``ru_maxrss``) is that runtime's alone;
* thread pools never compete: PyTorch's OpenMP threads keep spinning after a parallel region, and
  in one process with NumPy's OpenBLAS threads that made 2-thread NumPy kernels 20x slower;
* a crash or a hang of one runtime cannot take the others down.

Timing is still *interleaved*: the orchestrator asks each worker in turn for a batch of repetitions,
rotating the order every round, so slow drifts of the machine (frequency, noisy neighbours) spread
over all runtimes alike. Between batches it pauses briefly so that the previous worker's spinning
threads go to sleep. Each batch starts with an untimed warm-up call (for calls under 50 ms); every
call is timed on its own with ``perf_counter`` and the report uses the median of all of them.

The protocol is one JSON object per line: commands on the worker's stdin, replies on a private copy
of its original stdout (fd 1 itself is pointed at stderr, so libraries that print cannot corrupt it).
Outputs for the correctness check travel as ``.npz`` files in the run's scratch directory.

    python benchmarks/harness.py worker --group lstm --runtime tvm-ir-vm --threads 1 --artifacts DIR
    python benchmarks/harness.py prepare --group lstm --dir DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "TENSORVM_NUM_THREADS")
#: After a worker's batch, the next one waits until that worker's threads are idle: OpenBLAS's threads
#: spin ~0.12 s after the last call and ONNX Runtime's ~0.04 s (measured), and a 0.05 s pause had let
#: them take a core from whichever runtime came next (2-thread rows up to 1.6x off). Idle: under
#: IDLE_SHARE of one CPU over IDLE_WINDOW_S; waited for at most IDLE_LIMIT_S.
IDLE_WINDOW_S = 0.01
IDLE_SHARE = 0.05
IDLE_LIMIT_S = 0.5
#: The pause where a process's CPU time cannot be read (no /proc).
SWITCH_PAUSE_S = 0.15
#: Calls slower than this get no untimed warm-up call at the start of a batch.
WARMUP_LIMIT_S = 0.05


# --- statistics and correctness (pure functions, unit-tested) -----------------------------------------
def summarize(samples) -> dict:
    """Median, quartiles, min, mean and count of per-call times (seconds)."""
    values = np.asarray(list(samples), dtype=np.float64)
    if values.size == 0:
        raise ValueError("summarize: no samples")
    q1, median, q3 = np.percentile(values, [25, 50, 75])
    return {"median": float(median), "q1": float(q1), "q3": float(q3), "min": float(values.min()),
            "mean": float(values.mean()), "n": int(values.size),
            "spread": float((q3 - q1) / median) if median > 0 else 0.0}


def compare_outputs(got: list, ref: list, atol: float, rtol: float) -> dict:
    """Whether ``got`` matches ``ref`` array by array: same element count, finite, and
    ``|got - ref| <= atol + rtol * max|ref|``; ``max_rel_err`` is the worst ``max|got - ref| / max|ref|``
    over the outputs. Shapes may differ by unit dims (a ``(1, H)`` state
    against PyTorch's ``(1, 1, H)``), never in element count."""
    if len(got) != len(ref):
        return {"ok": False, "max_abs_err": None, "reason": f"{len(got)} outputs, expected {len(ref)}"}
    worst = worst_rel = 0.0
    for index, (g, r) in enumerate(zip(got, ref)):
        g, r = np.asarray(g), np.asarray(r)
        if g.size != r.size:
            return {"ok": False, "max_abs_err": None,
                    "reason": f"output {index} has shape {g.shape}, expected {r.shape}"}
        g = g.reshape(-1).astype(np.float64)
        r = r.reshape(-1).astype(np.float64)
        if not np.all(np.isfinite(g)):
            return {"ok": False, "max_abs_err": None, "reason": f"output {index} has non-finite values"}
        err = float(np.max(np.abs(g - r))) if g.size else 0.0
        scale = float(np.max(np.abs(r))) if r.size else 0.0
        bound = atol + rtol * scale
        worst = max(worst, err)
        worst_rel = max(worst_rel, err / scale if scale > 0 else (0.0 if err == 0 else math.inf))
        if err > bound:
            return {"ok": False, "max_abs_err": worst, "max_rel_err": worst_rel,
                    "reason": f"output {index}: max |error| {err:.3g} > {bound:.3g}"}
    return {"ok": True, "max_abs_err": worst, "max_rel_err": worst_rel, "reason": ""}


def align_detections(got: list, ref: list, atol: float, rtol: float) -> list:
    """``got``'s detections ``(boxes (n, 4), scores (n,), labels (n,))`` put in ``ref``'s order: each
    reference detection takes the unused one of ``got`` with its label and a score within tolerance whose
    box is closest. Detections whose scores tie to rounding may come in either order from two runtimes
    (NMS and top-k sort by score); an unmatched detection stays where it was, for the check to flag."""
    boxes, scores, labels = (np.asarray(a) for a in got)
    ref_boxes, ref_scores, ref_labels = (np.asarray(a) for a in ref)
    if boxes.shape != ref_boxes.shape or scores.shape != ref_scores.shape or labels.shape != ref_labels.shape:
        return list(got)
    bound = atol + rtol * (float(np.max(np.abs(ref_scores))) if ref_scores.size else 0.0)
    order = np.full(len(ref_scores), -1)
    used = np.zeros(len(scores), bool)
    for r in range(len(ref_scores)):
        fits = np.flatnonzero(~used & (labels == ref_labels[r]) & (np.abs(scores - ref_scores[r]) <= bound))
        if fits.size:
            best = fits[np.argmin(np.abs(boxes[fits] - ref_boxes[r]).max(axis=1))]
            order[r], used[best] = best, True
    order[order < 0] = np.flatnonzero(~used)  # unmatched rows keep their relative order
    return [boxes[order], scores[order], labels[order]]


def thread_environment(threads: int, base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    for name in THREAD_VARIABLES:
        env[name] = str(threads)
    return env


def current_rss_mb() -> float:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


# --- the worker (runs in its own process) -------------------------------------------------------------
def _load_group(key: str, quick: bool):
    sys.path.insert(0, str(HERE))
    from models import group_by_key

    return group_by_key(key, quick)


def worker_main(args) -> int:
    # Replies go to a private copy of stdout; fd 1 now points at stderr so stray prints stay harmless.
    reply_stream = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.path.insert(0, str(ROOT))

    def reply(obj):
        reply_stream.write(json.dumps(obj) + "\n")
        reply_stream.flush()

    group = _load_group(args.group, args.quick)
    spec = group.runtime(args.runtime)
    ctx = {"threads": args.threads, "artifacts": Path(args.artifacts), "compile_twice": not args.no_second_compile}
    runner = None
    calls: dict = {}
    for line in sys.stdin:
        command = json.loads(line)
        kind = command["cmd"]
        try:
            if kind == "setup":
                from models.common import NotAvailable

                rss_before = current_rss_mb()
                try:
                    runner = spec.make(group, ctx)
                    info = runner.setup()
                except NotAvailable as err:
                    reply({"ok": False, "status": "n/a", "message": str(err)})
                    continue
                calls = {case.name: runner.call(case) for case in group.cases}
                getattr(runner, "ready", lambda: None)()
                reply({"ok": True, "info": info, "rss_start_mb": rss_before, "rss_setup_mb": current_rss_mb()})
            elif kind == "check":
                start = time.perf_counter()
                update = None
                try:
                    raw = calls[command["case"]]()
                except Exception as err:
                    # tensorvm with target "c" failing at run time: retry with target "python", noted.
                    update = runner.fall_back(err) if hasattr(runner, "fall_back") else None
                    if update is None:
                        raise
                    print(f"falling back after: {traceback.format_exc()}", file=sys.stderr)
                    calls = {case.name: runner.call(case) for case in group.cases}
                    start = time.perf_counter()
                    raw = calls[command["case"]]()
                seconds = time.perf_counter() - start
                outputs = runner.outputs(raw)
                np.savez(command["path"], *outputs)
                reply({"ok": True, "seconds": seconds, "info": update})
            elif kind == "time":
                call = calls[command["case"]]
                for _ in range(command.get("warmup", 0)):
                    call()
                clock = time.perf_counter
                samples = []
                for _ in range(command["reps"]):
                    start = clock()
                    call()
                    samples.append(clock() - start)
                reply({"ok": True, "samples": samples})
            elif kind == "profile":
                reply({"ok": True, "profile": runner.profile(group.case(command["case"]))})
            elif kind == "exit":
                usage = resource.getrusage(resource.RUSAGE_SELF)
                reply({"ok": True, "peak_rss_mb": peak_rss_mb(), "cpu_s": usage.ru_utime + usage.ru_stime})
                return 0
            else:
                reply({"ok": False, "status": "error", "message": f"unknown command {kind!r}"})
        except Exception as err:  # reported to the orchestrator, which marks the row as an error
            reply({"ok": False, "status": "error", "message": f"{type(err).__name__}: {err}",
                   "traceback": traceback.format_exc()})
    return 0


# --- the orchestrator's side -----------------------------------------------------------------------
class WorkerError(Exception):
    def __init__(self, status: str, message: str, detail: str = ""):
        super().__init__(message)
        self.status, self.message, self.detail = status, message, detail


class Worker:
    """A worker process for one (model group, runtime, thread count)."""

    def __init__(self, group_key: str, runtime_key: str, threads: int, artifacts: Path, quick: bool,
                 env_extra: dict | None = None, second_compile: bool = True, log=None,
                 budget_s: float = math.inf, command: list | None = None):
        if command is None:  # (tests give another program speaking the same line protocol)
            command = [sys.executable, str(Path(__file__).resolve()), "worker", "--group", group_key,
                       "--runtime", runtime_key, "--threads", str(threads), "--artifacts", str(artifacts)]
            if quick:
                command.append("--quick")
            if not second_compile:
                command.append("--no-second-compile")
        env = thread_environment(threads)
        env.update(env_extra or {})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
        self.name = f"{group_key}/{runtime_key}/t{threads}"
        self.log = log
        # its own session: a timeout kills the whole process group (a C compiler's cc1 outlives its driver)
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=log if log is not None else subprocess.DEVNULL,
                                        env=env, text=True, bufsize=1, cwd=str(ROOT), start_new_session=True)
        self.budget_s = budget_s
        self.spent_s = 0.0  # seconds spent waiting for this worker's answers (counted against budget_s)

    def kill(self) -> None:
        """Kill the worker and everything it started (its process group)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            self.process.kill()
        self.process.wait()

    def request(self, command: dict, timeout_s: float | None = None) -> dict:
        if self.process.poll() is not None:
            raise WorkerError("error", f"worker {self.name} exited with status {self.process.returncode}")
        try:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            raise WorkerError("error", f"worker {self.name} died (see the log)") from None
        remaining = self.budget_s - self.spent_s
        over_budget = timeout_s is None or remaining < timeout_s
        wait_s = remaining if over_budget else timeout_s
        started = time.perf_counter()
        if math.isfinite(wait_s):
            ready, _, _ = select.select([self.process.stdout], [], [], max(wait_s, 0.0))
            if not ready:
                self.spent_s += time.perf_counter() - started
                self.kill()
                if over_budget:
                    raise WorkerError("timeout", f"over the time budget of {self.budget_s:.0f} s "
                                                 f"(in {command['cmd']!r}; worker and its children killed)")
                raise WorkerError("error", f"worker {self.name} did not answer {command['cmd']!r} "
                                           f"within {timeout_s:.0f} s (killed)")
        line = self.process.stdout.readline()
        self.spent_s += time.perf_counter() - started
        if not line:
            status = self.process.wait(timeout=10)
            raise WorkerError("error", f"worker {self.name} died with status {status} (see the log)")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise WorkerError(reply.get("status", "error"), reply.get("message", "?"), reply.get("traceback", ""))
        return reply

    def close(self) -> dict:
        """Ask the worker to exit; returns its peak RSS and CPU time (empty if it is gone)."""
        result = {}
        try:
            result = self.request({"cmd": "exit"})
        except (WorkerError, OSError, ValueError):
            pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
        return result


def repetitions(estimate_s: float, budget_s: float, min_reps: int, max_reps: int, cap_s: float = math.inf,
                floor_reps: int = 3) -> int:
    """How many timed calls fit in ``budget_s`` given one call takes ``estimate_s``, clamped to
    ``[min_reps, max_reps]``; slow calls get fewer than ``min_reps`` (never below ``floor_reps``) so
    that one case of one runtime takes at most about ``cap_s``."""
    if estimate_s <= 0 or not math.isfinite(estimate_s):
        return max_reps
    reps = int(min(max_reps, max(min_reps, math.ceil(budget_s / estimate_s))))
    if reps * estimate_s > cap_s:
        reps = max(floor_reps, int(cap_s / estimate_s))
    return reps


@contextlib.contextmanager
def background_load(count: int):
    """``count`` processes spinning in a busy loop while the block runs (the "one busy core" the corpus is
    also measured beside), killed and reaped when it ends, however it ends."""
    processes = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        if processes:
            time.sleep(0.2)  # let the load reach the scheduler
        yield processes
    finally:
        for process in processes:
            process.kill()
            process.wait()


def _cpu_ns(pid: int) -> int | None:
    """CPU time (ns) used so far by all threads of process ``pid`` (Linux schedstat), or None."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total


def wait_until_idle(pid: int, window_s: float = IDLE_WINDOW_S, limit_s: float = IDLE_LIMIT_S, *,
                    cpu_ns=_cpu_ns, clock=time.perf_counter, sleep=time.sleep) -> float:
    """Return once process ``pid`` used under ``IDLE_SHARE`` of a CPU over ``window_s`` (its thread pools
    stopped spinning), or after ``limit_s``; returns the seconds waited. (``cpu_ns``, ``clock`` and
    ``sleep`` are replaceable, so that tests need not depend on how a loaded machine schedules.)"""
    start = clock()
    last = cpu_ns(pid)
    if last is None:
        sleep(SWITCH_PAUSE_S)
        return clock() - start
    while clock() - start < limit_s:
        sleep(window_s)
        now = cpu_ns(pid)
        if now is None or now - last < IDLE_SHARE * window_s * 1e9:
            break
        last = now
    return clock() - start


def interleaved_timing(workers: dict, case: str, reps: dict, rounds: int, warmup: dict,
                       timeout_s: dict | None = None) -> dict:
    """Times ``case`` on every worker: ``rounds`` rounds, each giving every worker (in an order rotated
    per round) a batch of its ``reps[key] / rounds`` calls. Returns ``{key: samples}``; a worker that
    fails gets a ``WorkerError`` instead of samples."""
    samples = {key: [] for key in workers}
    keys = list(workers)
    for round_index in range(rounds):
        order = keys[round_index % len(keys):] + keys[:round_index % len(keys)]
        for key in order:
            if isinstance(samples[key], WorkerError):
                continue
            batch = max(1, math.ceil(reps[key] / rounds))
            try:
                reply = workers[key].request({"cmd": "time", "case": case, "reps": batch, "warmup": warmup[key]},
                                             timeout_s=(timeout_s or {}).get(key))
                samples[key].extend(reply["samples"])
            except WorkerError as err:
                samples[key] = err
            wait_until_idle(workers[key].process.pid)
    return samples


# --- prepare: artifacts that need PyTorch (ONNX exports, state dicts) ---------------------------------
def prepare_main(args) -> int:
    sys.path.insert(0, str(ROOT))
    group = _load_group(args.group, args.quick)
    directory = Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    group.prepare(directory)
    (directory / "complete").write_text(json.dumps({"group": group.key, "time": time.time()}))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    worker = sub.add_parser("worker", help="serve one runtime (spoken to by run.py)")
    worker.add_argument("--group", required=True)
    worker.add_argument("--runtime", required=True)
    worker.add_argument("--threads", type=int, required=True)
    worker.add_argument("--artifacts", required=True)
    worker.add_argument("--quick", action="store_true")
    worker.add_argument("--no-second-compile", action="store_true")
    prepare = sub.add_parser("prepare", help="write a group's artifacts (ONNX exports)")
    prepare.add_argument("--group", required=True)
    prepare.add_argument("--dir", required=True)
    prepare.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    return worker_main(args) if args.mode == "worker" else prepare_main(args)


if __name__ == "__main__":
    sys.exit(main())
