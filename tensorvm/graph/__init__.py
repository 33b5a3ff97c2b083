"""The graph executor: static programs as a JSON graph, a parameter blob and a kernel library.

    factory = tv.graph.build(mod, target="python", params={"w": w})   # or target="c"
    m = tv.graph.GraphModule(factory)          # debug=True: per-node timing (GraphModuleDebug)
    m.set_input("x", x); m.run(); y = m.get_output(0).numpy()
    factory.save("net.tvgraph"); factory = tv.graph.load("net.tvgraph")

Memory comes from the static planner (``tensorvm.transform.memory_planner``); the formats are
described in ``docs/graph-format.md``.
"""

from __future__ import annotations

from .build import GRAPH_TARGETS, GraphExecutor, GraphFactory, KernelLibrary, build, load  # noqa: F401
from .debug import DebugResult, GraphModuleDebug, NodeTiming  # noqa: F401
from .graph_module import GraphModule, GraphSpec, parse_graph_json  # noqa: F401
from .params import load_param_file, load_params, save_param_file, save_params  # noqa: F401

__all__ = ["build", "load", "GraphFactory", "KernelLibrary", "GraphModule", "GraphModuleDebug", "DebugResult",
           "NodeTiming", "GraphSpec", "parse_graph_json", "save_params", "load_params", "save_param_file",
           "load_param_file", "GraphExecutor", "GRAPH_TARGETS"]
