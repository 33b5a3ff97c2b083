"""Profiling and benchmarking results of the VM.

``VirtualMachine.profile`` runs a program with every kernel and VM operation (``VM::AllocStorage``,
``VM::AllocTensor``, ``VM::AllocTensorReg``, ``VM::ShapeOf``, ``VM::ReshapeTensor``) wrapped by a
``ProfileRecorder`` timer, and returns a ``ProfileReport``: one row per name with its call count, total
and mean microseconds, share of the run, and the argument shapes seen. ``str(report)`` is a table;
``csv()`` and ``json()`` export it. ``VirtualMachine.benchmark`` returns a ``BenchmarkResult``.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["ProfileRecorder", "ProfileRow", "ProfileReport", "BenchmarkResult"]

_MAX_SHAPES = 8  # distinct argument-shape signatures kept per row


class ProfileRecorder:
    """Collects call counts, time and argument shapes per name."""

    def __init__(self):
        self.entries: dict[str, list] = {}  # name -> [kind, calls, total_ns, shapes]
        self.overhead = [0]  # ns spent recording (subtracted from the run's total)

    def reset(self) -> None:
        """Forget what was recorded (in place: the timed wrappers keep their entries)."""
        for entry in self.entries.values():
            entry[1] = entry[2] = 0
            entry[3].clear()
        self.overhead[0] = 0

    def timed(self, fn, name: str, kind: str):
        """``fn`` wrapped to record each call under ``name``."""
        entry = self.entries.setdefault(name, [kind, 0, 0, []])
        overhead = self.overhead
        clock = time.perf_counter_ns

        def call(*args):
            start = clock()
            try:
                return fn(*args)
            finally:
                end = clock()
                entry[1] += 1
                entry[2] += end - start
                shapes = entry[3]
                if len(shapes) < _MAX_SHAPES:
                    signature = _signature(args)
                    if signature not in shapes:
                        shapes.append(signature)
                overhead[0] += clock() - end
        return call


def _signature(args) -> str:
    parts = []
    for a in args:
        if isinstance(a, np.ndarray):
            if a.dtype == np.uint8 and type(a).__name__ == "Storage":
                parts.append(f"storage[{a.size}B]")
            else:
                parts.append(f"{a.dtype.name}[{', '.join(map(str, a.shape))}]")
        elif isinstance(a, tuple):
            parts.append(f"({', '.join(map(str, a))})")
        elif isinstance(a, np.dtype):
            parts.append(a.name)
        else:
            parts.append(str(a))
    return ", ".join(parts)


@dataclass(frozen=True)
class ProfileRow:
    name: str
    kind: str  # "kernel" or "vm"
    calls: int
    total_us: float
    mean_us: float
    share_pct: float
    arg_shapes: tuple = field(default=())


@dataclass
class ProfileReport:
    """A profile of one run: rows sorted by total time, plus the run's total and configuration."""

    rows: list
    total_us: float
    function: str = "main"
    exec_mode: str = "bytecode"
    result: object = field(default=None, repr=False, compare=False)

    @classmethod
    def from_recorder(cls, recorder: ProfileRecorder, total_ns: int, function: str, exec_mode: str,
                      result=None) -> ProfileReport:
        total_us = max(total_ns - recorder.overhead[0], 0) / 1000.0
        rows = []
        for name, (kind, calls, ns, shapes) in recorder.entries.items():
            if calls == 0:
                continue
            us = ns / 1000.0
            rows.append(ProfileRow(name, kind, calls, us, us / calls,
                                   100.0 * us / total_us if total_us else 0.0, tuple(shapes)))
        rows.sort(key=lambda r: -r.total_us)
        return cls(rows, total_us, function, exec_mode, result)

    # --- access -----------------------------------------------------------------------------------
    def row(self, name: str) -> ProfileRow:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no row {name!r}; rows: {', '.join(r.name for r in self.rows)}")

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.rows]

    @property
    def kernel_us(self) -> float:
        return sum(r.total_us for r in self.rows if r.kind == "kernel")

    @property
    def vm_op_us(self) -> float:
        return sum(r.total_us for r in self.rows if r.kind == "vm")

    # --- output -----------------------------------------------------------------------------------
    def table(self) -> str:
        header = ("Name", "Calls", "Total (us)", "Mean (us)", "Share (%)", "Argument Shapes")
        body = [(r.name, str(r.calls), f"{r.total_us:.2f}", f"{r.mean_us:.2f}", f"{r.share_pct:.1f}",
                 "; ".join(r.arg_shapes)) for r in self.rows]
        rest = self.total_us - self.kernel_us - self.vm_op_us
        body.append(("(dispatch and other VM work)", "", f"{rest:.2f}", "",
                     f"{100.0 * rest / self.total_us if self.total_us else 0.0:.1f}", ""))
        body.append(("Total", "", f"{self.total_us:.2f}", "", "100.0", ""))
        widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header) - 1)]

        def line(cells):
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))) \
                + "  " + cells[-1]
        rule = "-" * (sum(widths) + 2 * len(widths) + 15)
        return "\n".join([f"VM profile of {self.function} (exec_mode={self.exec_mode})", line(header), rule,
                          *(line(r) for r in body[:-2]), rule, *(line(r) for r in body[-2:])])

    def __str__(self) -> str:
        return self.table()

    def csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["name", "kind", "calls", "total_us", "mean_us", "share_pct", "arg_shapes"])
        for r in self.rows:
            writer.writerow([r.name, r.kind, r.calls, f"{r.total_us:.3f}", f"{r.mean_us:.3f}",
                             f"{r.share_pct:.2f}", "; ".join(r.arg_shapes)])
        return out.getvalue()

    def json(self) -> str:
        return json.dumps({
            "configuration": {"Executor": "VM", "function": self.function, "exec_mode": self.exec_mode},
            "total_us": self.total_us,
            "rows": [{**asdict(r), "arg_shapes": list(r.arg_shapes)} for r in self.rows],
        }, indent=2)

    @classmethod
    def from_json(cls, text: str) -> ProfileReport:
        data = json.loads(text)
        rows = [ProfileRow(**{**r, "arg_shapes": tuple(r["arg_shapes"])}) for r in data["rows"]]
        config = data.get("configuration", {})
        return cls(rows, data["total_us"], config.get("function", "main"), config.get("exec_mode", "bytecode"))


@dataclass(frozen=True)
class BenchmarkResult:
    """Seconds per call, one entry per repeat."""

    results: tuple

    def __init__(self, results):
        object.__setattr__(self, "results", tuple(float(r) for r in results))

    @property
    def mean(self) -> float:
        return statistics.fmean(self.results)

    @property
    def median(self) -> float:
        return statistics.median(self.results)

    @property
    def min(self) -> float:
        return min(self.results)

    @property
    def max(self) -> float:
        return max(self.results)

    @property
    def std(self) -> float:
        return statistics.pstdev(self.results)

    def __str__(self) -> str:
        return (f"median {self.median * 1e6:.2f} us, min {self.min * 1e6:.2f} us, max {self.max * 1e6:.2f} us, "
                f"mean {self.mean * 1e6:.2f} us (std {self.std * 1e6:.2f} us, {len(self.results)} repeats)")
