"""``GraphModule``: runs a graph JSON over preallocated storage, one pre-bound kernel call per node.

Setup (once): the JSON is validated (``parse_graph_json``), every storage id gets memory — the
intermediates one aligned workspace at the planner's ``storage_offset``s when the JSON has them
(else one buffer per storage id sized by its largest entry, as TVM does), each input, param and
output storage a buffer of its own — and every entry becomes a NumPy view into it. Each ``tvm_op``
node becomes ``(kernel, [input views..., output views...])`` — for a generated C kernel, a call
pre-bound to the views' pointers, checked once here instead of on every call; ``__nop`` (reshape)
nodes are views of their input and cost nothing. ``run()`` is then just
``for kernel, args in ops: kernel(*args)``.

``get_output`` returns the output entry itself (overwritten by the next run, as in TVM); pass
``out=`` or copy it to keep it. ``set_input`` copies; ``set_input_zero_copy`` rebinds the input's
views to the caller's array (and so does ``set_output_zero_copy`` for an output).

Threads: the buffers are the module's, so its methods run one at a time (a lock; C kernels run without
the GIL). ``run_from_values`` (what ``create_executor("graph")`` calls) sets, runs and copies under the
lock in one go, so one executor may be shared by threads; a ``set_input`` / ``run`` / ``get_output``
sequence is not atomic: give each thread its own module (``GraphModule(factory)``).
"""

from __future__ import annotations

import functools
import threading
import time

import numpy as np

from ..errors import ExecutionError, FormatError, ShapeError
from ..runtime.ndarray import NDArray
from .integrity import loads_json, verify
from .params import MAX_NDIM as _MAX_NDIM
from .params import PARAM_DTYPES, load_params

__all__ = ["GraphModule", "GraphSpec", "parse_graph_json"]

_TOP_KEYS = {"nodes", "arg_nodes", "node_row_ptr", "heads", "attrs"}
_REQUIRED_OP_ATTRS = ("func_name", "num_inputs", "num_outputs", "flatten_data")
_ALIGNMENT = 64
GRAPH_FORMAT = "tensorvm-graph"
GRAPH_FORMAT_VERSION = 2  # 2: metadata.checksum
_MAX_TOTAL_BYTES = 1 << 40  # a graph whose entries need more in all is a corrupt file, not a model
_MAX_NODE_OUTPUTS = 1 << 16
_MAX_TREE_DEPTH = 64  # nesting of the tuple structures in metadata


# --- the JSON reader ----------------------------------------------------------------------------
class GraphSpec:
    """A validated graph JSON: nodes, entries (shape, dtype, storage id, optional offset), heads."""

    def __init__(self):
        self.nodes: list = []  # dicts: op, name, inputs [(nid, index)], attrs
        self.arg_nodes: list = []
        self.node_row_ptr: list = []
        self.heads: list = []  # (nid, index)
        self.shapes: list = []
        self.dtypes: list = []
        self.storage_ids: list = []
        self.storage_offsets: list | None = None
        self.metadata: dict = {}

    def entry_id(self, nid: int, index: int) -> int:
        return self.node_row_ptr[nid] + index

    @property
    def num_entries(self) -> int:
        return self.node_row_ptr[-1]

    def entry_nbytes(self, eid: int) -> int:
        return _entry_nbytes(self.shapes[eid], self.dtypes[eid])


def _fail(what: str, message: str) -> FormatError:
    return FormatError(f"{what}: {message}")


def _int_attr(value, what: str, field: str) -> int:
    # A plain decimal string (attrs are strings, as TVM writes them): no signs, spaces, underscores
    # or thousands of digits, which int() would accept or choke on.
    if isinstance(value, str) and 0 < len(value) <= 18 and value.isascii() and value.isdigit():
        return int(value)
    raise _fail(what, f"{field} must be a decimal integer string, got {str(value)[:80]!r}")


def _typed_list(attrs: dict, key: str, tag: str, what: str, count: int):
    value = attrs.get(key)
    if not (isinstance(value, list) and len(value) == 2 and value[0] == tag and isinstance(value[1], list)):
        raise _fail(what, f'attrs["{key}"] must be ["{tag}", [...]], got {str(value)[:80]}')
    if len(value[1]) != count:
        raise _fail(what, f'attrs["{key}"] has {len(value[1])} entries for {count} node outputs')
    return value[1]


def _tree_leaves(tree, leaf_type, what: str, field: str) -> list:
    """The leaves of a tree of nested lists (iteratively: a deep tree is an error, not a RecursionError)."""
    leaves, stack = [], [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > _MAX_TREE_DEPTH:
            raise _fail(what, f"metadata {field} must be nested at most {_MAX_TREE_DEPTH} levels deep")
        if isinstance(node, list):
            stack.extend((child, depth + 1) for child in reversed(node))
        elif type(node) is leaf_type:
            leaves.append(node)
        else:
            raise _fail(what, f"metadata {field} must be a tree of lists of {leaf_type.__name__}s, got "
                              f"{str(node)[:80]!r}")
    return leaves


def parse_graph_json(text: str, what: str = "graph json", require_checksum: bool = False) -> GraphSpec:
    """Validate a graph executor JSON (TVM's layout, see docs/graph-format.md); ``FormatError`` if bad.

    A tensorvm graph (``metadata.format`` ``"tensorvm-graph"``) must be of the current version and
    carry a correct checksum; a graph without tensorvm metadata (a hand-written or TVM one) has no
    checksum and is accepted unless ``require_checksum`` (``tv.graph.load`` requires it). Either way
    the structure, every size and the memory plan (``StaticMemoryPlan.check``) are validated.
    """
    graph = loads_json(text, what)
    if not isinstance(graph, dict):
        raise _fail(what, f"expected a JSON object, got {type(graph).__name__}")
    missing = _TOP_KEYS - set(graph)
    if missing:
        raise _fail(what, f"missing key(s) {', '.join(sorted(missing))}")
    unknown = set(graph) - _TOP_KEYS - {"metadata"}
    if unknown:
        raise _fail(what, f"unknown key(s) {', '.join(sorted(unknown)[:8])}")
    metadata = _checked_header(graph, what, require_checksum)
    spec = GraphSpec()
    if not isinstance(graph["nodes"], list) or not graph["nodes"]:
        raise _fail(what, "nodes must be a non-empty list")
    outputs_of = []
    for nid, node in enumerate(graph["nodes"]):
        where = f"node {nid}"
        if not isinstance(node, dict):
            raise _fail(what, f"{where} must be an object")
        op, name = node.get("op"), node.get("name")
        if op not in ("null", "tvm_op"):
            raise _fail(what, f'{where}: op must be "null" or "tvm_op", got {str(op)[:80]!r}')
        if not isinstance(name, str):
            raise _fail(what, f"{where}: name must be a string")
        name = name if len(name) <= 80 else name[:80] + "..."  # for messages; spec keeps the full name

        raw_inputs = node.get("inputs", [])
        if not isinstance(raw_inputs, list):
            raise _fail(what, f"{where} ({name}): inputs must be a list")
        inputs = []
        for item in raw_inputs:
            if not (isinstance(item, list) and len(item) in (2, 3) and all(type(v) is int for v in item)):
                raise _fail(what, f"{where} ({name}): an input must be [node_id, index, version], got "
                                  f"{str(item)[:80]}")
            src, index = item[0], item[1]
            if not 0 <= src < nid or not 0 <= index < outputs_of[src]:
                raise _fail(what, f"{where} ({name}): input {item!r} does not name an output of an earlier node")
            inputs.append((src, index))
        attrs = node.get("attrs", node.get("attr", {}))
        if not isinstance(attrs, dict):
            raise _fail(what, f"{where} ({name}): attrs must be an object")
        if op == "null":
            if inputs:
                raise _fail(what, f"{where} ({name}): a null node takes no inputs")
            outputs_of.append(1)
        else:
            for key in _REQUIRED_OP_ATTRS:
                if key not in attrs:
                    raise _fail(what, f"{where} ({name}): a tvm_op needs attrs {', '.join(_REQUIRED_OP_ATTRS)}; "
                                      f"{key} is missing")
            func_name = attrs["func_name"]
            if not isinstance(func_name, str) or not func_name:
                raise _fail(what, f"{where} ({name}): func_name must be a non-empty string")
            num_inputs = _int_attr(attrs["num_inputs"], what, f"{where} num_inputs")
            num_outputs = _int_attr(attrs["num_outputs"], what, f"{where} num_outputs")
            if _int_attr(attrs["flatten_data"], what, f"{where} flatten_data") not in (0, 1):
                raise _fail(what, f"{where} ({name}): flatten_data must be \"0\" or \"1\", got {attrs['flatten_data']!r}")
            if num_inputs != len(inputs):
                raise _fail(what, f"{where} ({name}): num_inputs is {num_inputs} but it has {len(inputs)} inputs")
            if not 1 <= num_outputs <= _MAX_NODE_OUTPUTS:
                raise _fail(what, f"{where} ({name}): num_outputs must be between 1 and {_MAX_NODE_OUTPUTS}, "
                                  f"got {num_outputs}")
            if func_name == "__nop" and (num_inputs != 1 or num_outputs != 1):
                raise _fail(what, f"{where} ({name}): a __nop node has one input and one output")
            for key, value in attrs.items():
                if not isinstance(value, str):
                    raise _fail(what, f"{where} ({name}): attr {str(key)[:40]!r} must be a string, got "
                                      f"{str(value)[:80]!r}")
            outputs_of.append(num_outputs)
        spec.nodes.append({"op": op, "name": node["name"], "inputs": inputs, "attrs": attrs})
    row_ptr = graph["node_row_ptr"]
    expected = [0]
    for n in outputs_of:
        expected.append(expected[-1] + n)
    if row_ptr != expected:
        raise _fail(what, f"node_row_ptr must be the prefix sums of the node outputs {expected[:8]}..., "
                          f"got {str(row_ptr)[:80]}")
    spec.node_row_ptr = expected
    null_nodes = [nid for nid, node in enumerate(spec.nodes) if node["op"] == "null"]
    arg_nodes = graph["arg_nodes"]
    if not isinstance(arg_nodes, list) or sorted(a for a in arg_nodes if type(a) is int) != null_nodes \
            or len(arg_nodes) != len(null_nodes):
        raise _fail(what, f"arg_nodes must list each null node once ({null_nodes[:8]}), got {str(arg_nodes)[:80]}")
    spec.arg_nodes = list(arg_nodes)
    names = [spec.nodes[n]["name"] for n in null_nodes]
    if len(set(names)) != len(names):
        raise _fail(what, f"the null nodes (inputs and params) must have distinct names, got {names[:8]}")
    for head in graph["heads"] if isinstance(graph["heads"], list) else [None]:
        if not (isinstance(head, list) and len(head) in (2, 3) and all(type(v) is int for v in head)
                and 0 <= head[0] < len(spec.nodes) and 0 <= head[1] < outputs_of[head[0]]):
            raise _fail(what, f"a head must be [node_id, index, version] naming a node output, got {str(head)[:80]}")
        spec.heads.append((head[0], head[1]))
    _read_entries(spec, graph["attrs"], what)
    spec.metadata = _checked_metadata(metadata, spec, what)
    _check_plan(spec, what)
    return spec


def _checked_header(graph: dict, what: str, require_checksum: bool) -> dict | None:
    """The metadata of a tensorvm graph, its version and checksum verified; ``None`` for a graph
    without tensorvm metadata (refused when a checksum is required)."""
    metadata = graph.get("metadata")
    fmt = metadata.get("format") if isinstance(metadata, dict) else None
    if fmt != GRAPH_FORMAT:
        if require_checksum:
            raise _fail(what, f'expected metadata with format "{GRAPH_FORMAT}" and a checksum (a graph saved by '
                              f"tensorvm), got {'format ' + repr(fmt)[:40] if fmt is not None else 'none'}")
        return None  # a hand-written or TVM graph: its metadata (if any) is not ours, and is ignored
    version = metadata.get("version")
    if type(version) is int and version == 1:
        raise _fail(what, f"graph format version 1 has no checksum and is no longer read (this build reads version "
                          f"{GRAPH_FORMAT_VERSION}); build the module again with tv.graph.build and save it")
    if version != GRAPH_FORMAT_VERSION:
        raise _fail(what, f"graph format version {str(version)[:20]} is not supported (this build reads "
                          f"{GRAPH_FORMAT_VERSION})")
    verify(graph, metadata, what)
    return metadata


def _read_entries(spec: GraphSpec, attrs, what: str) -> None:
    """Shapes, dtypes, storage ids and offsets of every entry: each size bounded, a view the size of its input."""
    if not isinstance(attrs, dict):
        raise _fail(what, "attrs must be an object")
    count = spec.num_entries
    shapes = _typed_list(attrs, "shape", "list_shape", what, count)
    dtypes = _typed_list(attrs, "dltype", "list_str", what, count)
    sids = _typed_list(attrs, "storage_id", "list_int", what, count)
    total = 0
    for eid, (shape, dtype, sid) in enumerate(zip(shapes, dtypes, sids)):
        if not isinstance(shape, list) or len(shape) > _MAX_NDIM or any(type(d) is not int or d < 0 for d in shape):
            raise _fail(what, f"entry {eid}: a shape must be a list of at most {_MAX_NDIM} non-negative ints, "
                              f"got {str(shape)[:80]}")
        if dtype not in PARAM_DTYPES:
            raise _fail(what, f"entry {eid}: unknown dltype {str(dtype)[:40]!r}; expected one of {', '.join(PARAM_DTYPES)}")
        if type(sid) is not int or not 0 <= sid < count:
            raise _fail(what, f"entry {eid}: storage_id must be an int in [0, {count}) (one per entry at most), "
                              f"got {str(sid)[:40]}")
        nbytes = _entry_nbytes(shape, dtype)
        total += nbytes
        if total > _MAX_TOTAL_BYTES:
            raise _fail(what, f"entry {eid}: shape {str(shape)[:80]} of {dtype} needs {nbytes} bytes, {total} with "
                              f"the entries before it; expected at most {_MAX_TOTAL_BYTES} in all")
    spec.shapes, spec.dtypes, spec.storage_ids = [tuple(s) for s in shapes], list(dtypes), list(sids)
    if "storage_offset" in attrs:
        offsets = _typed_list(attrs, "storage_offset", "list_int", what, count)
        for eid, off in enumerate(offsets):
            if type(off) is not int or not -1 <= off <= _MAX_TOTAL_BYTES:
                raise _fail(what, f"entry {eid}: storage_offset must be -1 or a byte offset up to "
                                  f"{_MAX_TOTAL_BYTES}, got {str(off)[:40]}")
        first_offset: dict = {}
        for eid, (sid, off) in enumerate(zip(spec.storage_ids, offsets)):
            if first_offset.setdefault(sid, off) != off:
                raise _fail(what, f"entry {eid}: storage_offset {off} differs from {first_offset[sid]}, the offset of "
                                  f"another entry of storage {sid}")
        spec.storage_offsets = list(offsets)
    for key, value in attrs.items():
        if key not in ("shape", "dltype", "storage_id", "storage_offset"):
            if not (isinstance(value, list) and len(value) == 2 and value[0] in ("list_int", "size_t", "list_str")):
                raise _fail(what, f'unknown attr "{str(key)[:40]}" of an unsupported type')
    for nid, node in enumerate(spec.nodes):
        if node["op"] == "tvm_op" and node["attrs"]["func_name"] == "__nop":
            src, out = spec.entry_id(*node["inputs"][0]), spec.entry_id(nid, 0)
            if spec.dtypes[src] != spec.dtypes[out] \
                    or _num_elements(spec.shapes[src]) != _num_elements(spec.shapes[out]):
                raise _fail(what, f"node {nid} ({node['name'][:80]}): a __nop (reshape) keeps dtype and element count, "
                                  f"but it turns {spec.dtypes[src]}{list(spec.shapes[src])} into "
                                  f"{spec.dtypes[out]}{list(spec.shapes[out])}")


def _checked_metadata(metadata: dict | None, spec: GraphSpec, what: str) -> dict:
    """A tensorvm graph's metadata, every field checked against the graph; ``{}`` for other graphs."""
    if metadata is None:
        return {}
    arg_names = [spec.nodes[n]["name"] for n in spec.arg_nodes]
    inputs, params = metadata.get("inputs"), metadata.get("params")
    if not (isinstance(inputs, list) and isinstance(params, list) and inputs + params == arg_names):
        raise _fail(what, f"metadata inputs + params must be the names of arg_nodes in order {arg_names[:8]}, got "
                          f"{str(inputs)[:60]} + {str(params)[:60]}")
    alignment = metadata.get("alignment")
    if type(alignment) is not int or not 1 <= alignment <= 4096 or alignment & (alignment - 1):
        raise _fail(what, f"metadata alignment must be a power of two up to 4096, got {str(alignment)[:40]}")
    workspace = metadata.get("workspace_bytes")
    if type(workspace) is not int or not 0 <= workspace <= _MAX_TOTAL_BYTES:
        raise _fail(what, f"metadata workspace_bytes must be an int in [0, {_MAX_TOTAL_BYTES}], got {str(workspace)[:40]}")
    if not isinstance(metadata.get("planner"), str):
        raise _fail(what, f"metadata planner must be a string, got {str(metadata.get('planner'))[:40]}")
    structure = metadata.get("input_structure")
    if not isinstance(structure, dict):
        raise _fail(what, f"metadata input_structure must be an object, got {str(structure)[:80]}")
    leaves = []
    for name, tree in structure.items():
        leaves += [tree] if isinstance(tree, str) else _tree_leaves(tree, str, what, f"input_structure[{name!r}]")
    if sorted(leaves) != sorted(inputs) or len(set(leaves)) != len(leaves):
        raise _fail(what, f"metadata input_structure must use every input once ({inputs[:8]}), got {sorted(leaves)[:8]}")
    output_leaves = _tree_leaves(metadata.get("output_structure"), int, what, "output_structure")
    if sorted(output_leaves) != list(range(len(spec.heads))):
        raise _fail(what, f"metadata output_structure must use every head index 0..{len(spec.heads) - 1} once, got "
                          f"{sorted(output_leaves)[:8]}")
    return metadata


def _check_plan(spec: GraphSpec, what: str) -> None:
    """Run the planner's own ``StaticMemoryPlan.check`` on the plan the file states.

    Lifetimes are rebuilt from the graph (one step per ``tvm_op``, as the planner counts them):
    inputs, params and heads live for the whole run and need a storage of their own; a ``__nop``
    output in its input's storage is an alias. A graph without ``storage_offset`` gets one block
    per storage id, so the check then verifies that entries sharing an id are never live together.
    """
    from ..transform.memory_planner import MemoryPlanError, StaticMemoryPlan, TensorLifetime

    count = spec.num_entries
    names = [f"entry {spec.node_row_ptr[nid] + k} ({node['name'][:40]})" for nid, node in enumerate(spec.nodes)
             for k in range(spec.node_row_ptr[nid + 1] - spec.node_row_ptr[nid])]
    params = set(spec.metadata.get("params", ()))
    kind = ["intermediate"] * count
    for nid in spec.arg_nodes:
        kind[spec.entry_id(nid, 0)] = "param" if spec.nodes[nid]["name"] in params else "input"
    for nid, index in spec.heads:
        eid = spec.entry_id(nid, index)
        if kind[eid] == "intermediate":
            kind[eid] = "output"
    first, last, alias = [0] * count, [0] * count, [None] * count
    step = -1
    for nid, node in enumerate(spec.nodes):
        if node["op"] != "tvm_op":
            continue
        step += 1
        in_eids = [spec.entry_id(*i) for i in node["inputs"]]
        for eid in in_eids:
            last[eid] = max(last[eid], step)
        for eid in range(spec.node_row_ptr[nid], spec.node_row_ptr[nid + 1]):
            first[eid] = last[eid] = step
            if node["attrs"]["func_name"] == "__nop" and spec.storage_ids[eid] == spec.storage_ids[in_eids[0]]:
                alias[eid] = in_eids[0]
    end = step + 1
    lifetimes = tuple(
        TensorLifetime(names[e], spec.entry_nbytes(e), 0 if kind[e] != "intermediate" else first[e],
                       end if kind[e] != "intermediate" else last[e], None if alias[e] is None else names[alias[e]],
                       kind[e]) for e in range(count))
    alignment = spec.metadata.get("alignment", 1)
    # The kind of a storage: external if any tensor of it (or of a view's root) is never overwritten.
    root = list(range(count))
    for e in range(count):
        if alias[e] is not None:
            root[e] = root[alias[e]]  # a view comes after its input
    rank = {"intermediate": 0, "param": 1, "input": 2, "output": 3}
    group_kind: dict = {}
    for e in range(count):
        if rank[kind[e]] > rank[group_kind.get(root[e], "intermediate")]:
            group_kind[root[e]] = kind[e]
    compact: dict = {}  # file storage id -> dense id
    sizes, kinds, storage_offsets = [], [], []
    for e, sid in enumerate(spec.storage_ids):
        if sid not in compact:
            compact[sid] = len(sizes)
            sizes.append(0)
            kinds.append("intermediate")
            storage_offsets.append(None)
        c = compact[sid]
        sizes[c] = max(sizes[c], spec.entry_nbytes(e))
        k = group_kind.get(root[e], "intermediate")
        if rank[k] > rank[kinds[c]]:
            kinds[c] = k
    aligned = [-(-max(size, 1) // alignment) * alignment for size in sizes]
    no_reuse = sum(a for a, k in zip(aligned, kinds) if k == "intermediate")
    if spec.storage_offsets is not None:
        for e, sid in enumerate(spec.storage_ids):
            c, off = compact[sid], spec.storage_offsets[e]
            if (off >= 0) != (kinds[c] == "intermediate"):
                raise _fail(what, f"entry {e}: storage_offset {off}, but storage {sid} holds "
                                  f"{'only intermediates (expected an offset >= 0)' if off < 0 else kinds[c] + 's (expected -1: a storage of its own)'}")
            storage_offsets[c] = off if off >= 0 else None
        total = spec.metadata.get("workspace_bytes",
                                  max((o + a for o, a in zip(storage_offsets, aligned) if o is not None), default=0))
        if total > no_reuse:
            raise _fail(what, f"the workspace of {total} bytes is larger than the {no_reuse} bytes its intermediates "
                              f"need without any reuse")
    else:  # one block per storage id, one after another
        total = 0
        for c, k in enumerate(kinds):
            if k == "intermediate":
                storage_offsets[c], total = total, total + aligned[c]
    offsets = {names[e]: storage_offsets[compact[sid]] for e, sid in enumerate(spec.storage_ids)
               if storage_offsets[compact[sid]] is not None}
    storage_ids = {names[e]: compact[sid] for e, sid in enumerate(spec.storage_ids)}
    plan = StaticMemoryPlan("file", alignment, lifetimes, offsets, storage_ids, sizes, storage_offsets, kinds,
                            total, no_reuse, 0)
    try:
        plan.check()
    except MemoryPlanError as err:
        raise _fail(what, f"the memory plan is invalid: {err}") from None


# --- the graph against its library and params ----------------------------------------------------
def check_against_library(spec: GraphSpec, lib, what: str = "graph json") -> None:
    """Every kernel a node names is in ``lib``; when the library knows the kernel's primitive
    function, the node's inputs and outputs have exactly its parameter and result types."""
    from ..transform.fuse_ops import flatten_tensor_types
    from ..transform.to_anf import known_type

    kernels = getattr(lib, "kernels", None)
    primitives = getattr(lib, "primitives", {}) or {}
    for nid, node in enumerate(spec.nodes):
        if node["op"] != "tvm_op" or node["attrs"]["func_name"] == "__nop":
            continue
        name = node["attrs"]["func_name"]
        if kernels is not None and name not in kernels:
            raise _fail(what, f"node {nid} ({node['name'][:80]}) calls {name[:80]!r}, which the kernel library does not "
                              f"have; it has {', '.join(sorted(kernels)[:8]) or 'none'}")
        prim = primitives.get(name)
        if prim is None:
            continue
        try:
            want = [t for p in prim.params for t in flatten_tensor_types(p.type_annotation or known_type(p))] + \
                list(flatten_tensor_types(prim.ret_type or known_type(prim.body)))
            want = [(tuple(t.shape), t.dtype) for t in want]
        except (AttributeError, TypeError):
            raise _fail(what, f"kernel {name!r} has no complete type signature in the library") from None
        eids = [spec.entry_id(*i) for i in node["inputs"]] + \
            list(range(spec.node_row_ptr[nid], spec.node_row_ptr[nid + 1]))
        got = [(spec.shapes[e], spec.dtypes[e]) for e in eids]
        if got != want or node["attrs"]["flatten_data"] != "0":
            raise _fail(what, f"node {nid} ({node['name'][:80]}): kernel {name[:80]!r} takes and returns "
                              f"{_signature(want)} (flatten_data \"0\"), but the node has {_signature(got)} "
                              f"(flatten_data {node['attrs']['flatten_data']!r})")


def _signature(types) -> str:
    text = ", ".join(f"{dtype}{list(shape)}" for shape, dtype in types)
    return text if len(text) < 200 else text[:200] + "..."


def check_params(spec: GraphSpec, params: dict, what: str = "graph json") -> None:
    """``params`` are exactly the graph's params (when its metadata lists them), each of its entry's
    shape and dtype: a param left out would be read as uninitialized memory."""
    by_name = {spec.nodes[n]["name"]: spec.entry_id(n, 0) for n in spec.arg_nodes}
    listed = spec.metadata.get("params")
    if listed is not None and set(listed) != set(params):
        raise _fail(what, f"expected the params {sorted(listed)[:8]}, got {sorted(params)[:8]}")
    for name, value in params.items():
        eid = by_name.get(name)
        if eid is None:
            continue  # unknown names are skipped, as in TVM
        array = np.asarray(value)
        if array.shape != spec.shapes[eid] or array.dtype.name != spec.dtypes[eid]:
            raise _fail(what, f"param {name!r} must be {spec.dtypes[eid]}{list(spec.shapes[eid])}, got "
                              f"{array.dtype.name}{list(array.shape)}")


# --- the executor -------------------------------------------------------------------------------
def _aligned_buffer(nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + _ALIGNMENT, dtype=np.uint8)
    start = (-raw.ctypes.data) % _ALIGNMENT
    return raw[start:start + nbytes]


def _num_elements(shape) -> int:
    n = 1
    for d in shape:
        n *= d  # Python ints: a huge shape gives a huge count, not an int64 overflow
    return n


def _entry_nbytes(shape, dtype) -> int:
    return _num_elements(shape) * np.dtype(dtype).itemsize


def _one_at_a_time(method):
    """``method`` run holding the module's lock (re-entrant: methods call each other)."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return locked


class GraphModule:
    """Runs a ``GraphFactory`` (``tv.graph.build``'s result). ``debug=True`` gives a ``GraphModuleDebug``."""

    def __new__(cls, factory=None, debug: bool = False, **kwargs):
        if debug and cls is GraphModule:
            from .debug import GraphModuleDebug

            return super().__new__(GraphModuleDebug)
        return super().__new__(cls)

    def __init__(self, factory, debug: bool = False):
        self.factory = factory
        self.lib = factory.lib
        self._lock = threading.RLock()  # see the module docstring (threads)
        self._spec = spec = parse_graph_json(factory.graph_json)
        self._debug_storage = debug  # every entry its own memory, so every node output stays inspectable
        params = factory.params
        self.param_names = [spec.nodes[n]["name"] for n in spec.arg_nodes if spec.nodes[n]["name"] in params]
        self.input_names = [spec.nodes[n]["name"] for n in spec.arg_nodes if spec.nodes[n]["name"] not in params]
        self._input_eid = {spec.nodes[n]["name"]: spec.entry_id(n, 0) for n in spec.arg_nodes}
        self._head_eids = [spec.entry_id(nid, index) for nid, index in spec.heads]
        check_against_library(spec, self.lib)
        check_params(spec, params)
        self._setup_storage()
        self._setup_ops()
        for name, value in params.items():
            if name in self._input_eid:
                self._copy_into(name, value)

    # --- setup ------------------------------------------------------------------------------------
    def _storage_keys(self) -> list:
        """Which memory each entry lives in: its storage id, or (debug) its own key; a ``__nop``
        output shares its input's memory when the two have the same storage id."""
        spec = self._spec
        keys = [("sid", sid) for sid in spec.storage_ids] if not self._debug_storage \
            else [("entry", eid) for eid in range(spec.num_entries)]
        for nid, node in enumerate(spec.nodes):
            if node["op"] == "tvm_op" and node["attrs"]["func_name"] == "__nop":
                src = spec.entry_id(*node["inputs"][0])
                out = spec.entry_id(nid, 0)
                if spec.storage_ids[src] == spec.storage_ids[out] \
                        and _entry_nbytes(spec.shapes[out], spec.dtypes[out]) \
                        <= _entry_nbytes(spec.shapes[src], spec.dtypes[src]):
                    keys[out] = keys[src]
        return keys

    def _setup_storage(self) -> None:
        spec = self._spec
        self._keys = keys = self._storage_keys()
        sizes: dict = {}
        for eid, key in enumerate(keys):
            sizes[key] = max(sizes.get(key, 0), _entry_nbytes(spec.shapes[eid], spec.dtypes[eid]))
        offsets: dict = {}
        if spec.storage_offsets is not None and not self._debug_storage:
            for eid, key in enumerate(keys):
                off = spec.storage_offsets[eid]
                if offsets.setdefault(key, off) != off:
                    raise FormatError(f"graph json: entries of storage {key[1]} disagree on storage_offset")
        workspace_bytes = max((off + sizes[k] for k, off in offsets.items() if off >= 0), default=0)
        try:
            self._workspace = _aligned_buffer(workspace_bytes)
            buffers = {}
            for key, size in sizes.items():
                off = offsets.get(key, -1)
                buffers[key] = self._workspace[off:off + size] if off >= 0 else _aligned_buffer(size)
        except MemoryError:
            raise ExecutionError(f"the graph needs {workspace_bytes + sum(sizes.values())} bytes of storage, more "
                                 f"than can be allocated here") from None
        self._buffers = buffers
        self._entries = [self._view(buffers[keys[eid]], eid) for eid in range(spec.num_entries)]
        self._storage_bytes = {"workspace": workspace_bytes,
                               "separate": sum(size for k, size in sizes.items() if offsets.get(k, -1) < 0)}

    def _view(self, buffer: np.ndarray, eid: int) -> np.ndarray:
        shape, dtype = self._spec.shapes[eid], np.dtype(self._spec.dtypes[eid])
        return buffer[:_entry_nbytes(shape, dtype)].view(dtype).reshape(shape)

    def _setup_ops(self) -> None:
        spec = self._spec
        self._calls = []  # (kernel, args list) in node order: the source of truth
        self._ops = []  # what run() calls: (kernel, args) or, pre-bound, (zero-argument call, ())
        self._op_nodes = []  # node id of each op
        self._users: dict = {}  # entry id -> [(op index, arg position, flatten)]
        for nid, node in enumerate(spec.nodes):
            if node["op"] != "tvm_op":
                continue
            attrs = node["attrs"]
            in_eids = [spec.entry_id(*i) for i in node["inputs"]]
            out_eids = [spec.entry_id(nid, k) for k in range(int(attrs["num_outputs"]))]
            if attrs["func_name"] == "__nop":
                if self._keys[out_eids[0]] == self._keys[in_eids[0]]:
                    continue  # a view of its input: nothing to run
                fn, flatten = _copy_reshaped, False
            else:
                fn, flatten = self.lib[attrs["func_name"]], int(attrs["flatten_data"]) != 0
            args = []
            for position, eid in enumerate(in_eids + out_eids):
                self._users.setdefault(eid, []).append((len(self._ops), position, flatten))
                args.append(self._entries[eid].reshape(-1) if flatten else self._entries[eid])
            self._calls.append((fn, args))
            self._ops.append(_fast_call(fn, args))
            self._op_nodes.append(nid)

    # --- inputs -----------------------------------------------------------------------------------
    def _resolve_input(self, key) -> str:
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            if not 0 <= key < len(self.input_names):
                raise ExecutionError(f"input index {key} is out of range; the graph has {len(self.input_names)} "
                                     f"input(s)")
            return self.input_names[key]
        if isinstance(key, str):
            if key not in self._input_eid:
                raise ExecutionError(f"the graph has no input named {key!r}; inputs: "
                                     f"{', '.join(self.input_names) or 'none'}")
            return key
        raise ExecutionError(f"an input key must be a name or an index, got {type(key).__name__}")

    def _checked_array(self, name: str, value) -> np.ndarray:
        eid = self._input_eid[name]
        shape, dtype = self._spec.shapes[eid], np.dtype(self._spec.dtypes[eid])
        if isinstance(value, NDArray):
            value = value.numpy()
        if value is None:
            raise ExecutionError(f"input {name!r} needs a value, got None")
        if isinstance(value, (np.ndarray, np.generic)):
            array = np.asarray(value)
            if array.dtype != dtype:
                raise ExecutionError(f"input {name!r} must have dtype {dtype}, got {array.dtype}")
        else:
            try:
                array = np.asarray(value, dtype=dtype)
            except (TypeError, ValueError) as err:
                raise ExecutionError(f"input {name!r}: cannot convert {type(value).__name__} to {dtype} ({err})") \
                    from None
        if array.shape != shape:
            raise ShapeError(f"input {name!r} must have shape {shape}, got {array.shape}")
        return array

    def _copy_into(self, name: str, value) -> None:
        np.copyto(self._entries[self._input_eid[name]], self._checked_array(name, value))

    @_one_at_a_time
    def set_input(self, key=None, value=None, **params) -> None:
        """Copy ``value`` into input ``key`` (a name or an index); keyword arguments set several
        inputs (or params) by name, largest first as TVM does."""
        if key is not None:
            self._copy_into(self._resolve_input(key), value)
        for name in sorted(params, key=lambda n: -np.asarray(params[n]).size):
            self._copy_into(self._resolve_input(name), params[name])

    @_one_at_a_time
    def set_input_zero_copy(self, key, value) -> None:
        """Let the graph read input ``key`` straight from ``value`` (a C-contiguous array of the exact
        dtype and shape); later changes to ``value`` are seen by later runs."""
        name = self._resolve_input(key)
        array = self._checked_array(name, value)
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise ExecutionError(f"set_input_zero_copy({name!r}) needs a C-contiguous NumPy array")
        self._rebind(self._input_eid[name], array)

    @_one_at_a_time
    def set_output_zero_copy(self, index: int, value) -> None:
        """Let the kernels write output ``index`` straight into ``value`` (writable, C-contiguous,
        exact dtype and shape)."""
        eid = self._head_eid(index)
        array = value.numpy() if isinstance(value, NDArray) else value
        shape, dtype = self._spec.shapes[eid], np.dtype(self._spec.dtypes[eid])
        if not isinstance(array, np.ndarray) or array.dtype != dtype or array.shape != shape \
                or not array.flags.c_contiguous or not array.flags.writeable:
            raise ExecutionError(f"set_output_zero_copy({index}) needs a writable C-contiguous {dtype} array of "
                                 f"shape {shape}")
        input_keys = {self._keys[e] for e in self._input_eid.values()}
        if self._keys[eid] in input_keys:
            raise ExecutionError(f"output {index} shares memory with an input or param of the graph; "
                                 f"set that input instead")
        self._rebind(eid, array)

    def _rebind(self, eid: int, array: np.ndarray) -> None:
        """Point every entry sharing ``eid``'s memory at ``array`` (reshaped), and every op using them."""
        key = self._keys[eid]
        sharing = [other for other, other_key in enumerate(self._keys) if other_key == key]
        needed = max(_entry_nbytes(self._spec.shapes[o], self._spec.dtypes[o]) for o in sharing)
        if needed > array.nbytes:
            raise ExecutionError(f"the array ({array.nbytes} bytes) is smaller than the {needed}-byte storage "
                                 f"it would replace")
        flat = array.reshape(-1).view(np.uint8)
        touched = set()
        for other in sharing:
            view = self._view(flat, other) if other != eid else array
            self._entries[other] = view
            for op_index, position, flatten in self._users.get(other, ()):
                self._calls[op_index][1][position] = view.reshape(-1) if flatten else view
                touched.add(op_index)
        for op_index in touched:  # pre-bound calls hold pointers: bind them again
            self._ops[op_index] = _fast_call(*self._calls[op_index])

    def get_input(self, key) -> NDArray:
        return NDArray(self._entries[self._input_eid[self._resolve_input(key)]])

    def get_input_index(self, name: str) -> int:
        return self.input_names.index(self._resolve_input(name))

    def get_num_inputs(self) -> int:
        """The number of data inputs (params bound at build time are not counted)."""
        return len(self.input_names)

    def get_input_info(self) -> dict:
        """``{"shape": {name: shape}, "dtype": {name: dtype}}`` of the data inputs."""
        eids = {name: self._input_eid[name] for name in self.input_names}
        return {"shape": {n: self._spec.shapes[e] for n, e in eids.items()},
                "dtype": {n: self._spec.dtypes[e] for n, e in eids.items()}}

    @_one_at_a_time
    def load_params(self, params) -> None:
        """Copy params in: bytes in the params format (``tv.graph.params``) or a dict of arrays."""
        if isinstance(params, (bytes, bytearray, memoryview)):
            params = load_params(bytes(params))
        if not isinstance(params, dict):
            raise ExecutionError(f"load_params expects bytes or a dict, got {type(params).__name__}")
        for name, value in params.items():
            if name in self._input_eid:  # unknown names are skipped, as in TVM
                self._copy_into(name, value)

    # --- outputs ----------------------------------------------------------------------------------
    def _head_eid(self, index: int) -> int:
        if not isinstance(index, (int, np.integer)) or not 0 <= index < len(self._head_eids):
            raise ExecutionError(f"output index {index!r} is out of range; the graph has "
                                 f"{len(self._head_eids)} output(s)")
        return self._head_eids[index]

    @_one_at_a_time
    def get_output(self, index: int, out=None):
        """Output ``index``: the entry itself (overwritten by the next run), or copied into ``out``."""
        array = self._entries[self._head_eid(index)]
        if out is None:
            return NDArray(array)
        target = out.numpy() if isinstance(out, NDArray) else out
        if not isinstance(target, np.ndarray) or target.shape != array.shape or target.dtype != array.dtype \
                or not target.flags.writeable:
            raise ExecutionError(f"get_output: output {index} is a {array.dtype} tensor of shape {array.shape}; "
                                 f"out must be a writable array of that shape and dtype, got "
                                 f"{_array_text(target)}")
        np.copyto(target, array)
        return out

    def get_num_outputs(self) -> int:
        return len(self._head_eids)

    def get_output_info(self) -> dict:
        """``{"shape": {"output_i": shape}, "dtype": {"output_i": dtype}}``."""
        return {"shape": {f"output_{i}": self._spec.shapes[e] for i, e in enumerate(self._head_eids)},
                "dtype": {f"output_{i}": self._spec.dtypes[e] for i, e in enumerate(self._head_eids)}}

    # --- running ----------------------------------------------------------------------------------
    @_one_at_a_time
    def run(self, **inputs) -> None:
        if inputs:
            self.set_input(**inputs)
        for fn, args in self._ops:
            fn(*args)

    @_one_at_a_time
    def run_from_values(self, names: list, values: list):
        """Set the parameters ``names`` of ``main`` (tuples allowed, flattened as the graph's inputs),
        run, and return copies of the outputs in ``main``'s result structure."""
        structure = self._spec.metadata.get("input_structure") or {n: n for n in names}
        for name, value in zip(names, values, strict=True):
            self._set_tree(structure.get(name, name), value, name)
        self.run()
        outputs = [self._entries[e].copy() for e in self._head_eids]
        tree = self._spec.metadata.get("output_structure", 0 if len(outputs) == 1 else list(range(len(outputs))))
        return _build_tree(tree, outputs)

    def _set_tree(self, tree, value, where: str) -> None:
        if isinstance(tree, str):
            self._copy_into(self._resolve_input(tree), value)
            return
        if not isinstance(value, (tuple, list)) or len(value) != len(tree):
            raise ExecutionError(f"argument {where} must be a tuple of {len(tree)} field(s), got "
                                 f"{type(value).__name__}")
        for i, (sub, v) in enumerate(zip(tree, value)):
            self._set_tree(sub, v, f"{where}.{i}")

    @_one_at_a_time
    def benchmark(self, number: int = 10, repeat: int = 5, **inputs):
        """Seconds per ``run()``: ``repeat`` batches of ``number`` runs after one warm-up
        (a ``BenchmarkResult``: mean, median, min, max, std)."""
        from ..vm.profiler import BenchmarkResult

        if number < 1 or repeat < 1:
            raise ValueError(f"number and repeat must be >= 1, got {number} and {repeat}")
        if inputs:
            self.set_input(**inputs)
        ops = self._ops
        self.run()
        results = []
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(number):
                for fn, args in ops:
                    fn(*args)
            results.append((time.perf_counter() - start) / number)
        return BenchmarkResult(results)

    # --- memory -----------------------------------------------------------------------------------
    def memory_stats(self) -> dict:
        """Bytes held: the shared workspace, the separate storages (inputs, params, outputs; every
        entry in debug mode), and their total."""
        stats = dict(self._storage_bytes)
        stats["total"] = stats["workspace"] + stats["separate"]
        return stats

    @property
    def num_nodes(self) -> int:
        return len(self._spec.nodes)


def _fast_call(kernel, args: list) -> tuple:
    """``(call, ())`` with the kernel pre-bound to these arrays when it can be, else ``(kernel, args)``.

    A generated C kernel checks dtypes, shapes and contiguity and extracts pointers on every call
    (~10 us); over fixed views all of that can be done once. A kernel with a ``bind(*arrays)`` method
    binds itself; a ``FusedKernel`` is checked here once with the same rules and then called
    through its ctypes entry directly. If anything does not fit, the normal call is kept, and it
    reports the problem when run.
    """
    bind = getattr(kernel, "bind", None)
    if callable(bind):
        return bind(*args), ()
    if type(kernel).__name__ == "FusedKernel":
        call = _prebind_fused(kernel, args)
        if call is not None:
            return call, ()
    return kernel, args


def _prebind_fused(kernel, args: list):
    inner = getattr(kernel, "kernel", None)
    if not all(hasattr(inner, a) for a in ("_fn", "_specs", "_dim_positions", "_raise")):
        return None
    split = len(args) - kernel.num_outputs
    arrays = list(args[:split]) + list(getattr(kernel, "_constants", ())) + list(args[split:])
    if len(arrays) != len(inner._specs):
        return None
    for array, (_, dtype, ndim, static, is_output) in zip(arrays, inner._specs):
        if type(array) is not np.ndarray or array.dtype != dtype or array.ndim != ndim \
                or not array.flags.c_contiguous or (is_output and not array.flags.writeable) \
                or any(array.shape[axis] != size for axis, size in static):
            return None
    raw_args = tuple(a.ctypes.data for a in arrays) + tuple(arrays[p].shape[axis] for p, axis in inner._dim_positions)
    fn, fail = inner._fn, inner._raise

    def call():
        code = fn(*raw_args)
        if code:
            fail(code, arrays)  # ``arrays`` also keeps the views (and so the pointers) alive

    return call


def _copy_reshaped(src: np.ndarray, dst: np.ndarray) -> None:
    np.copyto(dst, src.reshape(dst.shape))


def _build_tree(tree, outputs: list):
    if isinstance(tree, int):
        return outputs[tree]
    return tuple(_build_tree(t, outputs) for t in tree)


def _array_text(value) -> str:
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} array of shape {value.shape}{'' if value.flags.writeable else ' (read-only)'}"
    return f"a {type(value).__name__}"
