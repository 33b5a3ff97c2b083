"""Loading graph files is safe (issue 16, defect 5): graph.json and lib.json carry a checksum, every
plan is checked with the planner's own ``StaticMemoryPlan.check``, every size is bounded, and every
malformed graph, params or library file is a ``FormatError`` naming what was expected — never a
wrong answer, a crash or a MemoryError/RecursionError."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorvm as tv
import tensorvm.graph as tg
from tensorvm.graph.integrity import seal

# Three kernels: a = x w^T is live while b = a w^T is computed and until the last kernel reads it.
CHAIN = """def @main(%x: Tensor[(4, 8), float32], %w: Tensor[(8, 8), float32]) {
  %0 = nn.dense(%x, %w);
  %1 = nn.dense(%0, %w);
  %2 = nn.dense(%1, %w);
  add(%0, %2)
}"""
A, B = 2, 3  # the entries of %0 and %1 (after the inputs x, w)


def _inputs():
    rng = np.random.default_rng(16)
    return rng.standard_normal((4, 8)).astype("float32"), rng.standard_normal((8, 8)).astype("float32")


def _expected(x, w):
    a = x @ w.T
    return a + (a @ w.T) @ w.T


@pytest.fixture(scope="module")
def chain():
    return tg.build(tv.parse(CHAIN))


def _run(factory):
    x, w = _inputs()
    m = tg.GraphModule(factory)
    m.run(x=x, w=w)
    return m.get_output(0).numpy()


def _graph(factory) -> dict:
    return json.loads(factory.graph_json)


def _resealed(graph: dict) -> str:
    """A deliberate edit with a correct checksum: the validation behind the checksum must catch it."""
    return seal(graph, graph["metadata"])


def _tvm_style(graph: dict) -> str:
    """The same graph without tensorvm's metadata (no checksum), as a hand-written or TVM graph."""
    graph = dict(graph)
    graph.pop("metadata")
    return json.dumps(graph)


def test_the_chain_runs_right(chain):
    x, w = _inputs()
    np.testing.assert_allclose(_run(chain), _expected(x, w), rtol=1e-4, atol=1e-4)


# --- the checksum --------------------------------------------------------------------------------
def test_a_saved_graph_is_sealed_and_any_edit_is_detected(chain, tmp_path):
    directory = Path(chain.save(tmp_path / "net"))
    graph = json.loads((directory / "graph.json").read_text())
    assert graph["metadata"]["version"] == 2 and graph["metadata"]["checksum"].startswith("sha256:")
    # Re-indenting changes no value: still loads.
    (directory / "graph.json").write_text(json.dumps(graph, indent=4, sort_keys=True))
    np.testing.assert_allclose(_run(tg.load(directory)), _expected(*_inputs()), rtol=1e-4, atol=1e-4)
    # The last kernel reads b instead of a: same shape, a wrong answer without the checksum.
    graph["nodes"][-1]["inputs"][0] = [B + 1, 0, 0]
    (directory / "graph.json").write_text(json.dumps(graph, indent=1))
    with pytest.raises(tv.FormatError, match="checksum mismatch"):
        tg.load(directory)


def test_an_edited_library_is_detected(chain, tmp_path):
    directory = Path(chain.save(tmp_path / "net"))
    lib = json.loads((directory / "lib.json").read_text())
    assert lib["version"] == 2 and lib["checksum"].startswith("sha256:")
    lib["primitives"] = lib["primitives"].replace("add(", "subtract(")
    (directory / "lib.json").write_text(json.dumps(lib))
    with pytest.raises(tv.FormatError, match="lib.json: checksum mismatch"):
        tg.load(directory)


def test_old_and_unsealed_graphs(chain, tmp_path):
    directory = Path(chain.save(tmp_path / "net"))
    graph = _graph(chain)
    graph["metadata"]["version"] = 1
    del graph["metadata"]["checksum"]
    (directory / "graph.json").write_text(json.dumps(graph))
    with pytest.raises(tv.FormatError, match="version 1 has no checksum .* build the module again"):
        tg.load(directory)
    # A graph without tensorvm metadata: GraphModule runs it (validated), tg.load wants a sealed file.
    (directory / "graph.json").write_text(_tvm_style(_graph(chain)))
    with pytest.raises(tv.FormatError, match="expected metadata with format \"tensorvm-graph\" and a checksum"):
        tg.load(directory)
    unsealed = tg.GraphFactory(_tvm_style(_graph(chain)), {}, chain.lib)
    np.testing.assert_allclose(_run(unsealed), _expected(*_inputs()), rtol=1e-4, atol=1e-4)


# --- the plan ------------------------------------------------------------------------------------
def _set_entry(graph, eid, sid=None, offset=None):
    if sid is not None:
        graph["attrs"]["storage_id"][1][eid] = sid
    if offset is not None:
        graph["attrs"]["storage_offset"][1][eid] = offset


PLAN_EDITS = {
    # b in a's storage while both are live
    "shared_storage": (lambda g: _set_entry(g, B, sid=g["attrs"]["storage_id"][1][A], offset=0),
                       "share storage|overlap in bytes|larger than"),
    # b's bytes overlap a's in the workspace
    "overlapping_offset": (lambda g: _set_entry(g, B, offset=64), "overlap in bytes"),
    # b written into the input x
    "into_an_input": (lambda g: _set_entry(g, B, sid=g["attrs"]["storage_id"][1][0], offset=-1),
                      "input storage .* is shared|intermediate .* has no offset|larger than"),
    # b at an offset far beyond the workspace: an allocation of a petabyte before
    "huge_offset": (lambda g: _set_entry(g, B, offset=1 << 50), "storage_offset must be|larger than"),
    "beyond_the_workspace": (lambda g: _set_entry(g, B, offset=256), "larger than|outside"),
    # the output in the workspace, where the next run would overwrite it
    "output_in_the_workspace": (lambda g: _set_entry(g, 4, offset=0), "storage_offset 0, but storage"),
}


@pytest.mark.parametrize("sealed", [True, False], ids=["resealed", "tvm_style"])
@pytest.mark.parametrize("edit", PLAN_EDITS, ids=list(PLAN_EDITS))
def test_an_edited_memory_plan_is_refused(chain, edit, sealed):
    mutate, message = PLAN_EDITS[edit]
    graph = _graph(chain)
    mutate(graph)
    text = _resealed(graph) if sealed else _tvm_style(graph)
    with pytest.raises(tv.FormatError, match=message):
        tg.GraphModule(tg.GraphFactory(text, {}, chain.lib))


def test_storage_ids_without_offsets_are_checked_for_lifetimes(chain):
    graph = _graph(chain)
    del graph["attrs"]["storage_offset"]
    sids = graph["attrs"]["storage_id"][1]
    sids[B] = sids[A]  # TVM-style: one buffer per storage id, shared by two live tensors
    with pytest.raises(tv.FormatError, match=r"'entry 2 \(fused_nn_dense\)' .* and 'entry 3 \(fused_nn_dense_1\)' .* "
                                             r"overlap in bytes while both live"):
        tg.GraphModule(tg.GraphFactory(_tvm_style(graph), {}, chain.lib))


# --- sizes, nesting, attrs -----------------------------------------------------------------------
GRAPH_EDITS = {
    "huge_dims": (lambda g: g["attrs"]["shape"][1].__setitem__(0, [1 << 62, 1 << 62]), "at most"),
    "many_dims": (lambda g: g["attrs"]["shape"][1].__setitem__(0, [1] * 100), "at most 32"),
    "huge_storage_id": (lambda g: g["attrs"]["storage_id"][1].__setitem__(A, 1 << 60), "storage_id must be"),
    "num_outputs_spaces": (lambda g: g["nodes"][-1]["attrs"].__setitem__("num_outputs", " 1"), "decimal integer"),
    "num_inputs_digits": (lambda g: g["nodes"][-1]["attrs"].__setitem__("num_inputs", "9" * 5000), "decimal integer"),
    "num_outputs_huge": (lambda g: g["nodes"][-1]["attrs"].__setitem__("num_outputs", "99999999"), "between 1 and"),
    "flatten_2": (lambda g: g["nodes"][-1]["attrs"].__setitem__("flatten_data", "2"), "flatten_data must be"),
    "attr_not_a_string": (lambda g: g["nodes"][-1]["attrs"].__setitem__("extra", [1]), "must be a string"),
    "deep_output_structure": (lambda g: g["metadata"].__setitem__("output_structure", json.loads("[" * 200 + "0" + "]" * 200)),
                              "at most 64 levels"),
    "output_structure_index": (lambda g: g["metadata"].__setitem__("output_structure", 7), "every head index"),
    "input_structure_name": (lambda g: g["metadata"]["input_structure"].__setitem__("x", "w"), "every input once"),
    "duplicate_input_names": (lambda g: g["nodes"][1].__setitem__("name", "x"), "distinct names"),
    "arg_nodes_missing_one": (lambda g: g.__setitem__("arg_nodes", [0]), "each null node once"),
    "alignment": (lambda g: g["metadata"].__setitem__("alignment", 3), "power of two"),
    "nop_grows": (lambda g: (g["nodes"][-1]["attrs"].__setitem__("func_name", "__nop"),
                             g["nodes"][-1]["attrs"].__setitem__("num_inputs", "1"),
                             g["nodes"][-1].__setitem__("inputs", [[A, 0, 0]]),
                             g["attrs"]["shape"][1].__setitem__(4, [4, 9])), "keeps dtype and element count"),
}


@pytest.mark.parametrize("edit", GRAPH_EDITS, ids=list(GRAPH_EDITS))
def test_malformed_fields_are_format_errors(chain, edit):
    mutate, message = GRAPH_EDITS[edit]
    graph = _graph(chain)
    mutate(graph)
    with pytest.raises(tv.FormatError, match=message):
        tg.parse_graph_json(_resealed(graph))


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"nodes": ' + "[" * 5000, "1" * 5000, "\udcff"])
def test_deep_or_huge_json_is_a_format_error(text):
    with pytest.raises(tv.FormatError, match="JSON"):
        tg.parse_graph_json(text)


def test_deep_library_json_is_a_format_error(chain, tmp_path):
    directory = Path(chain.save(tmp_path / "net"))
    (directory / "lib.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(tv.FormatError, match="lib.json: expected JSON nested"):
        tg.load(directory)


def test_kernels_are_checked_against_the_library(chain):
    graph = _graph(chain)
    graph["nodes"][-1]["attrs"]["func_name"] = "no_such_kernel"
    with pytest.raises(tv.FormatError, match="'no_such_kernel', which the kernel library does not have"):
        tg.GraphModule(tg.GraphFactory(_resealed(graph), {}, chain.lib))
    graph = _graph(chain)
    graph["nodes"][-1]["attrs"]["func_name"] = graph["nodes"][-2]["attrs"]["func_name"]  # another signature
    graph["nodes"][-1]["inputs"].pop()
    graph["nodes"][-1]["attrs"]["num_inputs"] = "2"
    with pytest.raises(tv.FormatError, match="takes and returns"):
        tg.GraphModule(tg.GraphFactory(_resealed(graph), {}, chain.lib))


# --- params ---------------------------------------------------------------------------------------
def test_params_must_be_the_graphs_params(tmp_path):
    x, w = _inputs()
    factory = tg.build(tv.parse(CHAIN), params={"w": w})
    directory = Path(factory.save(tmp_path / "net"))
    good = (directory / "params.bin").read_bytes()
    np.testing.assert_allclose(tg.GraphModule(tg.load(directory)).run_from_values(["x"], [x]), _expected(x, w),
                               rtol=1e-4, atol=1e-4)
    (directory / "params.bin").write_bytes(tg.save_params({}))  # the weight left out: garbage before
    with pytest.raises(tv.FormatError, match="expected the params"):
        tg.load(directory)
    (directory / "params.bin").write_bytes(tg.save_params({"p0": np.zeros((8, 4), "float32")}))
    with pytest.raises(tv.FormatError, match=r"param 'p0' must be float32\[8, 8\]"):
        tg.load(directory)
    body = good[:-4]
    (directory / "params.bin").write_bytes(body[:20] + struct.pack("<I", 1 << 31) + body[24:]
                                           + struct.pack("<I", zlib.crc32(body[:20] + struct.pack("<I", 1 << 31)
                                                                          + body[24:])))
    with pytest.raises(tv.FormatError, match="truncated"):
        tg.load(directory)


# --- a small mutation loop ------------------------------------------------------------------------
BOUNDARY = [-1, 0, 1, 2, 63, 64, 65, 255, 256, 2**31, 2**32, 2**63 - 1, 2**64, 10**30]


def _int_paths(obj, path=()):
    if type(obj) is int:
        yield path
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _int_paths(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _int_paths(v, path + (i,))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_resealed_int_mutations_load_right_or_are_format_errors(chain, data):
    """Any int of the graph but the wiring (a node's inputs, the heads: an edit there is another
    valid program) replaced by a boundary value, the checksum recomputed: the graph either loads
    and gives the right answer, or is refused with a FormatError."""
    graph = _graph(chain)
    paths = [p for p in _int_paths(graph) if "inputs" not in p and "heads" not in p]
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        holder = graph
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = data.draw(st.sampled_from(BOUNDARY + [holder[path[-1]] + 1]))
    try:
        result = _run(tg.GraphFactory(_resealed(graph), {}, chain.lib))
    except tv.FormatError:
        return
    np.testing.assert_allclose(result, _expected(*_inputs()), rtol=1e-4, atol=1e-4)


# --- the cost of checking -------------------------------------------------------------------------
def _wide_graph(n: int) -> str:
    """One kernel with ``n`` scalar outputs, all read by a last kernel: ``n`` tensors live at once."""
    count = n + 2
    graph = {
        "nodes": [{"op": "null", "name": "x", "inputs": []},
                  {"op": "tvm_op", "name": "k", "inputs": [[0, 0, 0]],
                   "attrs": {"func_name": "k", "num_inputs": "1", "num_outputs": str(n), "flatten_data": "0"}},
                  {"op": "tvm_op", "name": "sink", "inputs": [[1, i, 0] for i in range(n)],
                   "attrs": {"func_name": "s", "num_inputs": str(n), "num_outputs": "1", "flatten_data": "0"}}],
        "arg_nodes": [0], "node_row_ptr": [0, 1, 1 + n, count], "heads": [[2, 0, 0]],
        "attrs": {"shape": ["list_shape", [[]] * count], "dltype": ["list_str", ["float32"] * count],
                  "storage_id": ["list_int", list(range(count))],
                  "storage_offset": ["list_int", [-1] + [4 * i for i in range(n)] + [-1]]}}
    return json.dumps(graph)


def _view_chain(n: int) -> str:
    """A kernel followed by ``n`` reshape views of views."""
    count = n + 2
    nodes = [{"op": "null", "name": "x", "inputs": []},
             {"op": "tvm_op", "name": "k", "inputs": [[0, 0, 0]],
              "attrs": {"func_name": "k", "num_inputs": "1", "num_outputs": "1", "flatten_data": "0"}}]
    nodes += [{"op": "tvm_op", "name": f"v{i}", "inputs": [[i + 1, 0, 0]],
               "attrs": {"func_name": "__nop", "num_inputs": "1", "num_outputs": "1", "flatten_data": "0"}}
              for i in range(n)]
    graph = {"nodes": nodes, "arg_nodes": [0], "node_row_ptr": list(range(count + 1)), "heads": [[n + 1, 0, 0]],
             "attrs": {"shape": ["list_shape", [[4]] * count], "dltype": ["list_str", ["float32"] * count],
                       "storage_id": ["list_int", [0] + [1] * (n + 1)], "storage_offset": ["list_int", [-1] * count]}}
    return json.dumps(graph)


@pytest.mark.parametrize("text", [_wide_graph(20_000), _view_chain(20_000)], ids=["wide", "view_chain"])
def test_checking_a_large_graph_takes_time_linear_in_its_size(text):
    # Comparing every pair of live tensors took ~50 s of CPU for the wide graph (0.8 MB of JSON), and
    # walking every view's alias chain as long for the chain; both take about 1 s now. A loader
    # must not hang on a small file.
    import time

    start = time.perf_counter()
    tg.parse_graph_json(text)
    assert time.perf_counter() - start < 20


# --- archives ---------------------------------------------------------------------------------------
def _patched_archive(path: Path, patch) -> None:
    """Apply ``patch(data, info, data_start)`` to the bytes of the archive's graph.json member."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("graph.json")
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack_from("<HH", data, info.header_offset + 26)
    patch(data, info, info.header_offset + 30 + name_len + extra_len)
    path.write_bytes(bytes(data))


def _garble_deflate(data, info, start):
    data[start + 8:start + 40] = bytes((7 + 13 * k) % 256 for k in range(32))


def _set_method(data, info, start):  # an unknown compression method, in both headers
    struct.pack_into("<H", data, info.header_offset + 8, 99)
    central = next(i for i in range(len(data) - 46) if data[i:i + 4] == b"PK\x01\x02"
                   and data[i + 46:i + 56] == b"graph.json")
    struct.pack_into("<H", data, central + 10, 99)


def _set_encrypted(data, info, start):  # the "encrypted" flag, in both headers
    flags = struct.unpack_from("<H", data, info.header_offset + 6)[0] | 1
    struct.pack_into("<H", data, info.header_offset + 6, flags)
    central = next(i for i in range(len(data) - 46) if data[i:i + 4] == b"PK\x01\x02"
                   and data[i + 46:i + 56] == b"graph.json")
    struct.pack_into("<H", data, central + 8, flags)


@pytest.mark.parametrize("patch", [_garble_deflate, _set_method, _set_encrypted],
                         ids=["garbled_deflate", "unknown_method", "encrypted"])
def test_a_damaged_archive_is_a_format_error(chain, tmp_path, patch):
    path = Path(chain.save(tmp_path / "net.tvgraph"))
    _patched_archive(path, patch)
    with pytest.raises(tv.FormatError, match="not a saved graph archive"):
        tg.load(path)
