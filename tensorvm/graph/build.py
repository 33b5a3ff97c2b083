"""``tv.graph.build``: a static module to a graph JSON, its parameters and a kernel library.

The pipeline: ``lower_static`` (the VM lowering up to, not including, ManifestAlloc: fold, fuse,
A-normal form, lambda lifting), ``static_schedule`` (the kernel calls in order over named tensors),
``plan_memory`` (storage ids and workspace offsets), then the JSON writer. A program with a dynamic
dim, control flow, closures, recursion or ADTs is refused with an ``UnsupportedError`` that points
to the VM.

The kernel library keeps the primitive functions as Relay text and (re)builds its kernels from it:
target ``"python"`` with ``tensorvm.vm.kernel_python.build_kernel``, target ``"c"`` with the VM's
``tensorvm.vm.kernel_c.build_c_library`` (the C code generator's ``lower_primitive`` per kernel,
one library compiled by cc and cached), so both executors run the very same kernels. Saving never writes code that loading would
execute: a saved library is the text of its primitive functions (plus the generated C for reading).
A kernel the C generator cannot compile yet falls back to NumPy; ``lib.fallback`` names it and why.
"""

from __future__ import annotations

import os
import zipfile
import zlib

import numpy as np

from ..errors import ExecutionError, FormatError, TensorVMError, UnsupportedError
from ..executor import CompiledExecutor
from ..ir.expr import Function, GlobalVar
from ..ir.module import IRModule
from ..transform.memory_planner import lower_static, plan_memory, static_schedule
from .graph_module import (
    GRAPH_FORMAT,
    GRAPH_FORMAT_VERSION,
    check_against_library,
    check_params,
    parse_graph_json,
)
from .integrity import loads_json, seal, verify
from .params import load_params, save_params

__all__ = ["build", "load", "GraphFactory", "KernelLibrary", "GraphExecutor", "GRAPH_TARGETS"]

GRAPH_TARGETS = ("python", "c")
LIB_FORMAT = "tensorvm-kernel-library"
LIB_FORMAT_VERSION = 2  # 2: a checksum
_MEMBERS = ("graph.json", "params.bin", "lib.json")
_MAX_MEMBER_BYTES = 1 << 32  # refuse absurd archive members before reading them


# --- the kernel library -------------------------------------------------------------------------
class KernelLibrary:
    """Kernels by name, each ``kernel(*inputs, *outputs)`` in destination-passing style."""

    def __init__(self, target: str, primitives: dict, kernels: dict, source: str | None = None,
                 fallback: dict | None = None):
        self.target = target
        self.primitives = dict(primitives)
        self.kernels = dict(kernels)
        self.source = source  # the generated C (target "c"), for reading
        self.fallback = dict(fallback or {})  # name -> why it runs on NumPy

    @classmethod
    def build(cls, primitives: dict, target: str = "python") -> KernelLibrary:
        if target not in GRAPH_TARGETS:
            raise UnsupportedError(f"unknown graph target {target!r}; expected one of {', '.join(GRAPH_TARGETS)}")
        from ..vm.kernel_python import build_kernel

        if target == "python":
            return cls(target, primitives, {name: build_kernel(prim) for name, prim in primitives.items()})
        from ..vm.kernel_c import build_c_library  # the VM's target "c" library: the same kernels

        library = build_c_library(primitives)
        return cls(target, primitives, library.kernels, library.source or None, library.fallbacks)

    def __getitem__(self, name: str):
        try:
            return self.kernels[name]
        except KeyError:
            raise ExecutionError(f"the kernel library has no function {name!r}; it has "
                                 f"{', '.join(sorted(self.kernels)) or 'none'}") from None

    def __contains__(self, name: str) -> bool:
        return name in self.kernels

    @property
    def names(self) -> list:
        return list(self.kernels)

    def to_json(self) -> str:
        text = str(IRModule({GlobalVar(name): prim for name, prim in self.primitives.items()}))
        doc = {"format": LIB_FORMAT, "version": LIB_FORMAT_VERSION, "target": self.target,
               "kernels": list(self.primitives), "primitives": text}
        return seal(doc, doc)

    @classmethod
    def from_json(cls, text: str, what: str = "lib.json") -> KernelLibrary:
        from ..parser import parse

        data = loads_json(text, what)
        if not isinstance(data, dict) or data.get("format") != LIB_FORMAT:
            raise FormatError(f"{what}: not a tensorvm kernel library (format {str(_peek(data, 'format'))[:40]!r}, "
                              f"expected {LIB_FORMAT!r})")
        if data.get("version") != LIB_FORMAT_VERSION:
            raise FormatError(f"{what}: library format version {str(data.get('version'))[:20]} is not supported "
                              f"(this build reads {LIB_FORMAT_VERSION}; version 1 had no checksum: build and save "
                              f"the module again)")
        verify(data, data, what)
        target, names, text = data.get("target"), data.get("kernels"), data.get("primitives")
        if target not in GRAPH_TARGETS or not isinstance(names, list) or not isinstance(text, str) \
                or set(data) != {"format", "version", "checksum", "target", "kernels", "primitives"}:
            raise FormatError(f"{what}: expected exactly 'format', 'version', 'checksum', 'target' (one of "
                              f"{GRAPH_TARGETS}), 'kernels' (a list) and 'primitives' (Relay text), got "
                              f"{str(sorted(data))[:120]}")
        try:
            mod = parse(text, source_name=what, prelude=False)
        except TensorVMError as err:
            raise FormatError(f"{what}: the primitive functions do not parse: {err}") from None
        except RecursionError:
            raise FormatError(f"{what}: the primitive functions are nested too deeply to parse") from None
        primitives = {}
        for name in names:
            if not isinstance(name, str) or name not in mod or not mod[name].is_primitive:
                raise FormatError(f"{what}: kernel {str(name)[:80]!r} has no primitive function in the library text")
            if name in primitives:
                raise FormatError(f"{what}: kernel {name!r} is listed twice")
            primitives[name] = mod[name]
        try:
            return cls.build(primitives, target)
        except TensorVMError as err:
            raise FormatError(f"{what}: the kernels cannot be built from the library text: {err}") from None


def _peek(data, key):
    return data.get(key) if isinstance(data, dict) else None


# --- the factory --------------------------------------------------------------------------------
class GraphFactory:
    """What ``build`` returns: ``graph_json`` (str), ``params`` ({name: array}), ``lib``.

    ``memory_plan`` is the planner's result (``None`` after ``load``); ``factory["default"]()`` or
    ``GraphModule(factory)`` creates an executor.
    """

    def __init__(self, graph_json: str, params: dict, lib: KernelLibrary, memory_plan=None):
        self.graph_json = graph_json
        self.params = dict(params)
        self.lib = lib
        self.memory_plan = memory_plan

    def get_graph_json(self) -> str:
        return self.graph_json

    def get_params(self) -> dict:
        return dict(self.params)

    def get_lib(self) -> KernelLibrary:
        return self.lib

    @property
    def target(self) -> str:
        return self.lib.target

    def __getitem__(self, name: str):
        if name != "default":
            raise KeyError(f"a graph factory has only the 'default' module, not {name!r}")
        from .graph_module import GraphModule

        return lambda debug=False: GraphModule(self, debug=debug)

    def _members(self) -> dict:
        members = {"graph.json": self.graph_json.encode("utf-8"), "params.bin": save_params(self.params),
                   "lib.json": self.lib.to_json().encode("utf-8")}
        if self.lib.source:
            members["lib.c"] = self.lib.source.encode("utf-8")  # for reading only; never loaded
        return members

    def save(self, path) -> str:
        """Write the graph, the params and the library: into a directory (a path without a suffix,
        or an existing directory) as ``graph.json``, ``params.bin``, ``lib.json`` (and ``lib.c``),
        or into a single zip archive of the same files (a path with a suffix, e.g. ``net.tvgraph``)."""
        path = os.fspath(path)
        members = self._members()
        if os.path.isdir(path) or not os.path.splitext(path)[1]:
            os.makedirs(path, exist_ok=True)
            for name, data in members.items():
                with open(os.path.join(path, name), "wb") as f:
                    f.write(data)
        else:
            with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
                for name, data in members.items():
                    archive.writestr(name, data)
        return path


def load(path) -> GraphFactory:
    """Read what ``GraphFactory.save`` wrote (a directory or an archive); bad files raise ``FormatError``."""
    path = os.fspath(path)
    members = {}
    if os.path.isdir(path):
        for name in _MEMBERS:
            member = os.path.join(path, name)
            if not os.path.isfile(member):
                raise FormatError(f"{path}: missing {name} (a saved graph has {', '.join(_MEMBERS)})")
            with open(member, "rb") as f:
                members[name] = f.read()
    elif os.path.isfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                infos = {info.filename: info for info in archive.infolist()}
                for name in _MEMBERS:
                    if name not in infos:
                        raise FormatError(f"{path}: missing {name} in the archive")
                    if infos[name].file_size > _MAX_MEMBER_BYTES:
                        raise FormatError(f"{path}: {name} claims {infos[name].file_size} bytes")
                    members[name] = archive.read(name)
        # zipfile reports damage in many ways: bad headers, a deflate stream zlib rejects, an
        # unknown compression method, the "encrypted" flag (RuntimeError) ...
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, zlib.error,
                NotImplementedError, RuntimeError) as err:
            raise FormatError(f"{path}: not a saved graph archive ({err})") from None
    else:
        raise FormatError(f"{path}: no such file or directory")
    try:
        graph_json = members["graph.json"].decode("utf-8")
        lib_json = members["lib.json"].decode("utf-8")
    except UnicodeDecodeError:
        raise FormatError(f"{path}: graph.json or lib.json is not UTF-8") from None
    # Validate now, not at first use: each file, then the three against each other.
    spec = parse_graph_json(graph_json, what=f"{path}/graph.json", require_checksum=True)
    params = load_params(members["params.bin"], what=f"{path}/params.bin")
    lib = KernelLibrary.from_json(lib_json, what=f"{path}/lib.json")
    check_params(spec, params, what=f"{path}/graph.json")
    check_against_library(spec, lib, what=f"{path}/graph.json")
    return GraphFactory(graph_json, params, lib)


# --- build --------------------------------------------------------------------------------------
def build(mod, target: str | None = None, params: dict | None = None, opt_level: int = 3,
          planner: str = "greedy_by_size", alignment: int = 64) -> GraphFactory:
    """Compile ``mod`` (an ``IRModule`` or a ``Function`` for ``main``) for the graph executor.

    Without ``target``, ``"c"`` when a C compiler is found, else ``"python"``, as ``tv.vm.compile``
    (``tensorvm.codegen.build.default_target``: ``$TENSORVM_TARGET`` chooses). ``params`` binds parameters
    of ``main`` by name to constants (they become graph params); ``planner`` is a ``plan_memory`` algorithm.
    """
    if target is None:
        from ..codegen.build import default_target

        target = default_target()
    if target not in GRAPH_TARGETS:
        raise UnsupportedError(f"unknown graph target {target!r}; expected one of {', '.join(GRAPH_TARGETS)}")
    if isinstance(mod, Function):
        mod = IRModule.from_expr(mod)
    if not isinstance(mod, IRModule):
        raise TypeError(f"tv.graph.build expects an IRModule or a Function, got {type(mod).__name__}")
    lowered = lower_static(mod, params, opt_level, target=target)
    schedule = static_schedule(lowered)
    plan = plan_memory(schedule.lifetimes(), planner, alignment).check()
    graph_json = graph_json_of(schedule, plan)
    kernel_names = {s.func_name for s in schedule.steps if not s.reshape_only}
    lib = KernelLibrary.build({n: p for n, p in schedule.primitives.items() if n in kernel_names}, target)
    params_out = {name: np.array(value, copy=True) for name, value in schedule.params.items()}
    return GraphFactory(graph_json, params_out, lib, plan)


def graph_json_of(schedule, plan) -> str:
    """The graph executor JSON of a static schedule with its memory plan (see docs/graph-format.md)."""
    nodes, entry_of, shapes, dtypes, sids, offsets = [], {}, [], [], [], []

    def add_entry(tensor_name: str, nid: int, index: int):
        tensor = schedule.tensors[tensor_name]
        entry_of[tensor_name] = (nid, index)
        shapes.append(list(tensor.shape))
        dtypes.append(tensor.dtype)
        sid = plan.storage_ids[tensor_name]
        sids.append(sid)
        offset = plan.storage_offsets[sid]
        offsets.append(-1 if offset is None else offset)

    for name in list(schedule.inputs) + list(schedule.params):
        nodes.append({"op": "null", "name": name, "inputs": []})
        add_entry(name, len(nodes) - 1, 0)
    arg_nodes = list(range(len(nodes)))
    used_names = {n["name"] for n in nodes}
    for step in schedule.steps:
        name, k = step.func_name, 1
        while name in used_names:
            name, k = f"{step.func_name}_{k}", k + 1
        used_names.add(name)
        attrs = {"func_name": "__nop" if step.reshape_only else step.func_name,
                 "num_inputs": str(len(step.inputs)), "num_outputs": str(len(step.outputs)), "flatten_data": "0"}
        if step.reshape_only:
            attrs["original_func"] = step.func_name
        nodes.append({"op": "tvm_op", "name": name, "attrs": attrs,
                      "inputs": [[*entry_of[t], 0] for t in step.inputs]})
        for index, tensor_name in enumerate(step.outputs):
            add_entry(tensor_name, len(nodes) - 1, index)
    row_ptr = [0]
    for node in nodes:
        row_ptr.append(row_ptr[-1] + (1 if node["op"] == "null" else int(node["attrs"]["num_outputs"])))
    graph = {
        "nodes": nodes,
        "arg_nodes": arg_nodes,
        "node_row_ptr": row_ptr,
        "heads": [[*entry_of[t], 0] for t in schedule.outputs],
        "attrs": {"shape": ["list_shape", shapes], "dltype": ["list_str", dtypes],
                  "storage_id": ["list_int", sids], "storage_offset": ["list_int", offsets]},
        "metadata": {"format": GRAPH_FORMAT, "version": GRAPH_FORMAT_VERSION, "planner": plan.algorithm,
                     "alignment": plan.alignment, "workspace_bytes": plan.total_bytes,
                     "inputs": list(schedule.inputs), "params": list(schedule.params),
                     "input_structure": _jsonable(schedule.input_structure),
                     "output_structure": _jsonable(schedule.output_structure)},
    }
    return seal(graph, graph["metadata"])


def _jsonable(tree):
    if isinstance(tree, dict):
        return {k: _jsonable(v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return [_jsonable(t) for t in tree]
    return tree


# --- create_executor("graph", ...) --------------------------------------------------------------
class GraphExecutor(CompiledExecutor):
    """``create_executor("graph", mod, target=..., params=...)``: builds ``@main`` and runs it
    (``build`` binds the params itself: they become graph params)."""

    kind = "graph"

    def _build(self, mod: IRModule):
        from .graph_module import GraphModule

        module = GraphModule(build(mod, target=self.target, params=self.build_params or None))
        return module.run_from_values
