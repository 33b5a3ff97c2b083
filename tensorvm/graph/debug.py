"""``GraphModuleDebug``: the graph executor with per-node timing, a table and a Chrome trace.

In debug mode every entry has memory of its own (no reuse), so after a run each node's output can
be read back with ``debug_get_output`` (TVM's debug executor reuses storage and cannot promise
that). ``run(number, repeat)`` times each node separately — ``number`` calls per measurement,
``repeat`` measurements — and also records one sequential pass with timestamps for the trace. It
returns a ``DebugResult``: ``str(result)`` / ``result.table()`` prints the columns of TVM's debug
executor (Node Name, Ops, Time(us), Time(%), Shape, Inputs, Outputs, Measurements(us)),
``result.chrome_trace()`` is a Chrome ``about:tracing`` / Perfetto JSON object, and with
``dump_root`` the run writes ``_tvmdbg_execution_trace.json``, ``_tvmdbg_graph_dump.json`` and
``output_tensors.params`` (every node output, in the params format) there.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import ExecutionError
from ..runtime.ndarray import NDArray
from .graph_module import GraphModule, _one_at_a_time
from .params import save_params

__all__ = ["GraphModuleDebug", "DebugResult", "NodeTiming"]


@dataclass
class NodeTiming:
    """One row of the debug table."""

    node: str
    op: str  # the kernel's func_name ("__nop" for a reshape view)
    time_us: float  # mean of the measurements
    share: float  # fraction of the summed node times
    shapes: list  # output shapes
    num_inputs: int
    num_outputs: int
    measurements_us: list = field(default_factory=list)


@dataclass
class DebugResult:
    """Per-node timings of a debug run, plus the sequential trace."""

    rows: list
    trace: list  # (node, op, start_us, duration_us, shapes) of one sequential pass
    total_us: float

    def table(self, sort_by_time: bool = True) -> str:
        rows = sorted(self.rows, key=lambda r: -r.time_us) if sort_by_time else self.rows
        header = ("Node Name", "Ops", "Time(us)", "Time(%)", "Shape", "Inputs", "Outputs", "Measurements(us)")
        body = [(r.node, r.op, f"{r.time_us:.2f}", f"{100 * r.share:.2f}",
                 ", ".join(str(tuple(s)) for s in r.shapes), str(r.num_inputs), str(r.num_outputs),
                 "[" + ", ".join(f"{m:.2f}" for m in r.measurements_us) + "]") for r in rows]
        body.append(("Total", "", f"{self.total_us:.2f}", "100.00", "", "", "", ""))
        widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
        sep = "  "
        lines = [sep.join(h.ljust(w) for h, w in zip(header, widths)),
                 sep.join("-" * w for w in widths)]
        lines += [sep.join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in body]
        return "\n".join(lines)

    __str__ = table

    def chrome_trace(self) -> dict:
        """The sequential pass as Chrome trace events (``ph: "X"``, microseconds)."""
        events = [{"name": node, "cat": op, "ph": "X", "ts": round(start, 3), "dur": round(dur, 3),
                   "pid": 1, "tid": 1, "args": {"shapes": [list(s) for s in shapes]}}
                  for node, op, start, dur, shapes in self.trace]
        return {"traceEvents": events, "displayTimeUnit": "ns"}

    def save_chrome_trace(self, path) -> str:
        with open(os.fspath(path), "w") as f:
            json.dump(self.chrome_trace(), f)
        return os.fspath(path)


class GraphModuleDebug(GraphModule):
    """A ``GraphModule`` that times every node (also ``GraphModule(factory, debug=True)``)."""

    def __init__(self, factory, debug: bool = True, dump_root=None):
        super().__init__(factory, debug=True)
        self.dump_root = dump_root
        spec = self._spec
        self._op_index_of_node = {nid: i for i, nid in enumerate(self._op_nodes)}
        self._timed_nodes = [nid for nid, node in enumerate(spec.nodes) if node["op"] == "tvm_op"]

    def _node_info(self, nid: int):
        spec = self._spec
        node = spec.nodes[nid]
        count = int(node["attrs"]["num_outputs"])
        shapes = [spec.shapes[spec.entry_id(nid, k)] for k in range(count)]
        return node["name"], node["attrs"]["func_name"], shapes, len(node["inputs"]), count

    @_one_at_a_time
    def run_individual(self, number: int = 10, repeat: int = 1) -> list:
        """Per ``tvm_op`` node (in graph order), ``repeat`` measurements of seconds per call."""
        if number < 1 or repeat < 1:
            raise ValueError(f"number and repeat must be >= 1, got {number} and {repeat}")
        GraphModule.run(self)  # warm-up and valid inputs for every node
        clock = time.perf_counter
        results = []
        for nid in self._timed_nodes:
            op_index = self._op_index_of_node.get(nid)
            if op_index is None:  # a __nop view: nothing runs
                results.append([0.0] * repeat)
                continue
            fn, args = self._ops[op_index]
            times = []
            for _ in range(repeat):
                start = clock()
                for _ in range(number):
                    fn(*args)
                times.append((clock() - start) / number)
            results.append(times)
        return results

    @_one_at_a_time
    def run(self, number: int = 1, repeat: int = 1, **inputs) -> DebugResult:
        """Set ``inputs``, time every node, and return a ``DebugResult`` (see the module docstring)."""
        if inputs:
            self.set_input(**inputs)
        measured = self.run_individual(number, repeat)
        trace, clock, origin = [], time.perf_counter, time.perf_counter()
        for nid in self._timed_nodes:  # one sequential pass, timestamped, for the trace
            name, op, shapes, _, _ = self._node_info(nid)
            op_index = self._op_index_of_node.get(nid)
            start = clock()
            if op_index is not None:
                fn, args = self._ops[op_index]
                fn(*args)
            trace.append((name, op, (start - origin) * 1e6, (clock() - start) * 1e6, shapes))
        means = [statistics.fmean(t) * 1e6 for t in measured]
        total = sum(means)
        rows = []
        for nid, times, mean in zip(self._timed_nodes, measured, means):
            name, op, shapes, n_in, n_out = self._node_info(nid)
            rows.append(NodeTiming(name, op, mean, mean / total if total > 0 else 0.0, shapes, n_in, n_out,
                                   [t * 1e6 for t in times]))
        result = DebugResult(rows, trace, total)
        if self.dump_root is not None:
            self._dump(result)
        return result

    profile = run

    def debug_get_output(self, node, out=None):
        """The first output of ``node`` (a name or a node index) after the last run."""
        spec = self._spec
        if isinstance(node, str):
            matches = [nid for nid, n in enumerate(spec.nodes) if n["name"] == node]
            if not matches:
                raise ExecutionError(f"the graph has no node named {node!r}")
            nid = matches[0]
        elif isinstance(node, (int, np.integer)) and 0 <= node < len(spec.nodes):
            nid = int(node)
        else:
            raise ExecutionError(f"debug_get_output expects a node name or an index below {len(spec.nodes)}, "
                                 f"got {node!r}")
        array = self._entries[spec.entry_id(nid, 0)]
        if out is None:
            return NDArray(array.copy())
        np.copyto(out.numpy() if isinstance(out, NDArray) else out, array)
        return out

    def _dump(self, result: DebugResult) -> None:
        root = os.fspath(self.dump_root)
        os.makedirs(root, exist_ok=True)
        result.save_chrome_trace(os.path.join(root, "_tvmdbg_execution_trace.json"))
        graph = json.loads(self.factory.graph_json)
        times = {r.node: r.time_us for r in result.rows}
        for node in graph["nodes"]:
            if node["name"] in times:
                node.setdefault("attrs", {})["time_us"] = f"{times[node['name']]:.3f}"
        with open(os.path.join(root, "_tvmdbg_graph_dump.json"), "w") as f:
            json.dump(graph, f, indent=1)
        spec = self._spec
        tensors = {}
        for nid in self._timed_nodes:
            for k in range(int(spec.nodes[nid]["attrs"]["num_outputs"])):
                tensors[f"{spec.nodes[nid]['name']}:{k}"] = self._entries[spec.entry_id(nid, k)]
        with open(os.path.join(root, "output_tensors.params"), "wb") as f:
            f.write(save_params(tensors))
