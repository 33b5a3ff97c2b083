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
import json
import threading
import time

import numpy as np

from ..errors import ExecutionError, FormatError, ShapeError
from ..runtime.ndarray import NDArray
from .params import PARAM_DTYPES, load_params

__all__ = ["GraphModule", "GraphSpec", "parse_graph_json"]

_TOP_KEYS = {"nodes", "arg_nodes", "node_row_ptr", "heads", "attrs"}
_REQUIRED_OP_ATTRS = ("func_name", "num_inputs", "num_outputs", "flatten_data")
_ALIGNMENT = 64
_MAX_ENTRY_BYTES = 1 << 40  # a larger entry is a corrupt graph, not a model


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


def _fail(what: str, message: str) -> FormatError:
    return FormatError(f"{what}: {message}")


def _int_attr(value, what: str, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _fail(what, f"{field} must be an integer string, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise _fail(what, f"{field} must be an integer string, got {value!r}") from None


def _typed_list(attrs: dict, key: str, tag: str, what: str, count: int):
    value = attrs.get(key)
    if not (isinstance(value, list) and len(value) == 2 and value[0] == tag and isinstance(value[1], list)):
        raise _fail(what, f'attrs["{key}"] must be ["{tag}", [...]], got {str(value)[:80]}')
    if len(value[1]) != count:
        raise _fail(what, f'attrs["{key}"] has {len(value[1])} entries for {count} node outputs')
    return value[1]


def parse_graph_json(text: str, what: str = "graph json") -> GraphSpec:
    """Validate a graph executor JSON (TVM's layout, see docs/graph-format.md); ``FormatError`` if bad."""
    try:
        graph = json.loads(text)
    except (json.JSONDecodeError, TypeError) as err:
        raise _fail(what, f"not valid JSON ({err})") from None
    if not isinstance(graph, dict):
        raise _fail(what, f"expected a JSON object, got {type(graph).__name__}")
    missing = _TOP_KEYS - set(graph)
    if missing:
        raise _fail(what, f"missing key(s) {', '.join(sorted(missing))}")
    unknown = set(graph) - _TOP_KEYS - {"metadata"}
    if unknown:
        raise _fail(what, f"unknown key(s) {', '.join(sorted(unknown))}")
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
            raise _fail(what, f'{where}: op must be "null" or "tvm_op", got {op!r}')
        if not isinstance(name, str):
            raise _fail(what, f"{where}: name must be a string")
        raw_inputs = node.get("inputs", [])
        if not isinstance(raw_inputs, list):
            raise _fail(what, f"{where} ({name}): inputs must be a list")
        inputs = []
        for item in raw_inputs:
            if not (isinstance(item, list) and len(item) in (2, 3) and all(type(v) is int for v in item)):
                raise _fail(what, f"{where} ({name}): an input must be [node_id, index, version], got {item!r}")
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
            if not isinstance(attrs["func_name"], str) or not attrs["func_name"]:
                raise _fail(what, f"{where} ({name}): func_name must be a non-empty string")
            num_inputs = _int_attr(attrs["num_inputs"], what, f"{where} num_inputs")
            num_outputs = _int_attr(attrs["num_outputs"], what, f"{where} num_outputs")
            _int_attr(attrs["flatten_data"], what, f"{where} flatten_data")
            if num_inputs != len(inputs):
                raise _fail(what, f"{where} ({name}): num_inputs is {num_inputs} but it has {len(inputs)} inputs")
            if num_outputs < 1:
                raise _fail(what, f"{where} ({name}): num_outputs must be at least 1")
            if attrs["func_name"] == "__nop" and (num_inputs != 1 or num_outputs != 1):
                raise _fail(what, f"{where} ({name}): a __nop node has one input and one output")
            outputs_of.append(num_outputs)
        spec.nodes.append({"op": op, "name": name, "inputs": inputs, "attrs": attrs})
    row_ptr = graph["node_row_ptr"]
    expected = [0]
    for n in outputs_of:
        expected.append(expected[-1] + n)
    if row_ptr != expected:
        raise _fail(what, f"node_row_ptr must be the prefix sums of the node outputs {expected[:8]}..., "
                          f"got {str(row_ptr)[:80]}")
    spec.node_row_ptr = expected
    arg_nodes = graph["arg_nodes"]
    if not isinstance(arg_nodes, list) or any(type(a) is not int or not 0 <= a < len(spec.nodes)
                                              or spec.nodes[a]["op"] != "null" for a in arg_nodes):
        raise _fail(what, "arg_nodes must list the indices of null nodes")
    spec.arg_nodes = list(arg_nodes)
    for head in graph["heads"] if isinstance(graph["heads"], list) else [None]:
        if not (isinstance(head, list) and len(head) in (2, 3) and all(type(v) is int for v in head)
                and 0 <= head[0] < len(spec.nodes) and 0 <= head[1] < outputs_of[head[0]]):
            raise _fail(what, f"a head must be [node_id, index, version] naming a node output, got {head!r}")
        spec.heads.append((head[0], head[1]))
    attrs = graph["attrs"]
    if not isinstance(attrs, dict):
        raise _fail(what, "attrs must be an object")
    count = spec.num_entries
    shapes = _typed_list(attrs, "shape", "list_shape", what, count)
    dtypes = _typed_list(attrs, "dltype", "list_str", what, count)
    sids = _typed_list(attrs, "storage_id", "list_int", what, count)
    for eid, (shape, dtype, sid) in enumerate(zip(shapes, dtypes, sids)):
        if not isinstance(shape, list) or any(type(d) is not int or d < 0 for d in shape):
            raise _fail(what, f"entry {eid}: a shape must be a list of non-negative ints, got {shape!r}")
        if dtype not in PARAM_DTYPES:
            raise _fail(what, f"entry {eid}: unknown dltype {dtype!r}; expected one of {', '.join(PARAM_DTYPES)}")
        if type(sid) is not int or sid < 0:
            raise _fail(what, f"entry {eid}: storage_id must be a non-negative int, got {sid!r}")
        nbytes = np.dtype(dtype).itemsize
        for d in shape:
            nbytes *= d
        if nbytes > _MAX_ENTRY_BYTES:
            raise _fail(what, f"entry {eid}: shape {shape} of {dtype} needs {nbytes} bytes, more than the "
                              f"{_MAX_ENTRY_BYTES} allowed")
    spec.shapes, spec.dtypes, spec.storage_ids = [tuple(s) for s in shapes], list(dtypes), list(sids)
    if "storage_offset" in attrs:
        offsets = _typed_list(attrs, "storage_offset", "list_int", what, count)
        if any(type(o) is not int or o < -1 for o in offsets):
            raise _fail(what, "storage_offset entries must be ints >= -1")
        spec.storage_offsets = list(offsets)
    for key, value in attrs.items():
        if key not in ("shape", "dltype", "storage_id", "storage_offset"):
            if not (isinstance(value, list) and len(value) == 2 and value[0] in ("list_int", "size_t", "list_str")):
                raise _fail(what, f'unknown attr "{key}" of an unsupported type')
    metadata = graph.get("metadata", {})
    spec.metadata = metadata if isinstance(metadata, dict) else {}
    return spec


# --- the executor -------------------------------------------------------------------------------
def _aligned_buffer(nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + _ALIGNMENT, dtype=np.uint8)
    start = (-raw.ctypes.data) % _ALIGNMENT
    return raw[start:start + nbytes]


def _entry_nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


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
        self._workspace = _aligned_buffer(workspace_bytes)
        buffers = {}
        for key, size in sizes.items():
            off = offsets.get(key, -1)
            buffers[key] = self._workspace[off:off + size] if off >= 0 else _aligned_buffer(size)
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
        np.copyto(out.numpy() if isinstance(out, NDArray) else out, array)
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
