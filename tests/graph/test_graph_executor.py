"""The graph executor: the shared static programs on both targets against the interpreter, the JSON
layout, the GraphModule API, save/load, refusals, and the debug executor."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from programs import PROGRAMS, _conv2d_nchw, _max_pool_2x2, _relu, check_result  # noqa: E402

import tensorvm as tv  # noqa: E402
import tensorvm.graph as tg  # noqa: E402
from tensorvm.graph.build import KernelLibrary  # noqa: E402
from tensorvm.graph.integrity import seal  # noqa: E402

STATIC = [p for p in PROGRAMS if "static" in p.tags]
NOT_STATIC = [p for p in PROGRAMS if "static" not in p.tags]
TARGETS = ["python", "c"]


def _program(name):
    return next(p for p in PROGRAMS if p.name == name)


def _interpret(program, args):
    return tv.create_executor("debug", program.parse()).evaluate()(*args)


def _as_numpy_tree(value):
    if isinstance(value, tuple):
        return tuple(_as_numpy_tree(v) for v in value)
    return np.asarray(value.numpy() if hasattr(value, "numpy") else value)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("program", STATIC, ids=lambda p: p.name)
def test_static_program_matches_the_interpreter(program, target):
    args = program.args_fn()
    expected = _as_numpy_tree(_interpret(program, args))
    run = tv.create_executor("graph", program.parse(), target=target).evaluate()
    result = run(*args)
    check_result(result, expected, rtol=program.rtol, atol=program.atol)
    if program.expected_fn is not None:
        check_result(result, program.expected_fn(*args), rtol=program.rtol, atol=program.atol)
    again = run(*args)  # a second run on the same storage gives the same answer
    check_result(again, expected, rtol=program.rtol, atol=program.atol)


@pytest.mark.parametrize("program", NOT_STATIC, ids=lambda p: p.name)
def test_dynamic_control_flow_and_adt_programs_are_refused(program):
    with pytest.raises(tv.UnsupportedError, match="VM") as info:
        tg.build(program.parse())
    assert "tv.vm.compile" in str(info.value)


def test_refusal_names_what_is_not_static():
    with pytest.raises(tv.UnsupportedError, match=r"parameter %x has the dynamic type"):
        tg.build(tv.parse("def @main(%x: Tensor[(?, 2), float32]) { add(%x, %x) }"))
    with pytest.raises(tv.UnsupportedError, match="if expression"):
        tg.build(tv.parse("def @main(%c: bool, %x: float32) { if (%c) { %x } else { negative(%x) } }"))


# --- the JSON ------------------------------------------------------------------------------------
def test_graph_json_has_the_graph_executor_layout():
    program = _program("small_cnn")
    x, w, wd = program.args_fn()
    factory = tg.build(program.parse(), params={"w": w, "wd": wd})
    graph = json.loads(factory.graph_json)
    assert set(graph) == {"nodes", "arg_nodes", "node_row_ptr", "heads", "attrs", "metadata"}
    nodes = graph["nodes"]
    # conv2d + relu + max_pool2d is one kernel (the pool joins the convolution's group)
    assert [n["op"] for n in nodes] == ["null"] * 3 + ["tvm_op"] * 3
    assert graph["arg_nodes"] == [0, 1, 2]
    assert [n["name"] for n in nodes[:3]] == ["x", "p0", "p1"]  # the input, then the bound params
    assert set(factory.params) == {"p0", "p1"}
    np.testing.assert_array_equal(factory.params["p0"], w)
    for node in nodes[3:]:
        attrs = node["attrs"]
        assert all(isinstance(attrs[k], str) for k in ("func_name", "num_inputs", "num_outputs", "flatten_data"))
        assert int(attrs["num_inputs"]) == len(node["inputs"])
        assert all(len(i) == 3 for i in node["inputs"])
    nop = next(n for n in nodes[3:] if n["attrs"]["func_name"] == "__nop")
    assert nop["name"] == "fused_nn_batch_flatten"
    assert graph["node_row_ptr"] == list(range(len(nodes) + 1))  # one output per node
    assert graph["heads"] == [[5, 0, 0]]
    attrs = graph["attrs"]
    assert attrs["shape"][0] == "list_shape" and attrs["dltype"][0] == "list_str"
    assert attrs["storage_id"][0] == "list_int"
    shapes, sids = attrs["shape"][1], attrs["storage_id"][1]
    assert shapes == [[2, 1, 8, 8], [4, 1, 3, 3], [5, 64], [2, 4, 4, 4], [2, 64], [2, 5]]
    assert sids[4] == sids[3]  # the reshape view shares its input's storage
    assert len(set(sids[:3])) == 3 and sids[5] not in sids[:5]  # inputs, params, output: their own storage


def test_a_hand_written_tvm_style_graph_runs_with_its_own_library():
    # The minimal graph of TVM's runtime tests: a null x and a tvm_op calling "myadd", no storage_offset.
    graph = {
        "nodes": [{"op": "null", "name": "x", "inputs": []},
                  {"op": "tvm_op", "name": "add", "inputs": [[0, 0, 0]],
                   "attrs": {"func_name": "myadd", "num_inputs": "1", "num_outputs": "1", "flatten_data": "0"}}],
        "arg_nodes": [0], "node_row_ptr": [0, 1, 2], "heads": [[1, 0, 0]],
        "attrs": {"shape": ["list_shape", [[4], [4]]], "dltype": ["list_str", ["float32", "float32"]],
                  "storage_id": ["list_int", [0, 1]]},
    }

    def myadd(x, out):
        np.add(x, 1, out=out)

    lib = KernelLibrary("python", {}, {"myadd": myadd})
    module = tg.GraphModule(tg.GraphFactory(json.dumps(graph), {}, lib))
    module.run(x=np.arange(4, dtype="float32"))
    np.testing.assert_array_equal(module.get_output(0).numpy(), np.arange(4, dtype="float32") + 1)


def _resealed(graph: dict) -> str:
    """``graph`` as JSON with a correct checksum, so the reader gets past it to the field checks."""
    return seal(graph, graph["metadata"]) if isinstance(graph.get("metadata"), dict) else json.dumps(graph)


@pytest.mark.parametrize("mutate, message", [
    (lambda g: g.pop("heads"), "missing key"),
    (lambda g: g.update(extra=1), "unknown key"),
    (lambda g: g["nodes"][-1].update(op="call"), "op must be"),
    (lambda g: g["nodes"][-1]["attrs"].pop("flatten_data"), "flatten_data is missing"),
    (lambda g: g["nodes"][-1].update(inputs=[[5, 0, 0]]), "earlier node"),
    (lambda g: g.update(node_row_ptr=[0, 1, 2, 4]), "node_row_ptr"),
    (lambda g: g["attrs"]["dltype"][1].__setitem__(0, "complex64"), "dltype"),
    (lambda g: g["attrs"]["shape"][1].pop(), "entries"),
    (lambda g: g.update(heads=[[2, 1, 0]]), "head"),
    (lambda g: g.update(arg_nodes=[2]), "arg_nodes"),
    (lambda g: g["attrs"]["shape"][1].__setitem__(0, [1 << 30, 1 << 30]), "at most"),
])
def test_malformed_graph_json_is_a_format_error(mutate, message):
    graph = json.loads(tg.build(_program("add_broadcast_static").parse()).graph_json)
    mutate(graph)
    with pytest.raises(tv.FormatError, match=message):
        tg.parse_graph_json(_resealed(graph))
    with pytest.raises(tv.FormatError, match="not valid JSON"):
        tg.parse_graph_json("{nodes")


# --- GraphModule API ------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=TARGETS)
def mlp_factory(request):
    return tg.build(_program("static_mlp").parse(), target=request.param)


def test_module_api_inputs_outputs_and_info(mlp_factory):
    program = _program("static_mlp")
    x, w1, b1, w2, b2 = program.args_fn()
    m = tg.GraphModule(mlp_factory)
    assert m.get_num_inputs() == 5 and m.get_num_outputs() == 1
    assert m.get_input_info() == {"shape": {"x": (4, 8), "w1": (16, 8), "b1": (16,), "w2": (3, 16), "b2": (3,)},
                                  "dtype": {n: "float32" for n in ("x", "w1", "b1", "w2", "b2")}}
    assert m.get_output_info() == {"shape": {"output_0": (4, 3)}, "dtype": {"output_0": "float32"}}
    assert m.get_input_index("w2") == 3
    m.set_input("x", x)  # by name
    m.set_input(1, w1)  # by index
    m.set_input(b1=b1, w2=w2, b2=b2)  # several by keyword
    x[...] = 0  # set_input copied: changing the source afterwards changes nothing
    m.run()
    expected = program.expected_fn(*program.args_fn())
    np.testing.assert_allclose(m.get_output(0).numpy(), expected, rtol=1e-4, atol=1e-5)
    out = np.empty((4, 3), "float32")
    m.get_output(0, out=out)
    np.testing.assert_array_equal(out, m.get_output(0).numpy())
    np.testing.assert_array_equal(m.get_input("w1").numpy(), w1)
    result = m.benchmark(number=3, repeat=2)
    assert len(result.results) == 2 and result.min > 0


def test_zero_copy_input_is_read_live(mlp_factory):
    program = _program("static_mlp")
    x, w1, b1, w2, b2 = program.args_fn()
    m = tg.GraphModule(mlp_factory)
    m.set_input(w1=w1, b1=b1, w2=w2, b2=b2)
    live = np.zeros_like(x)
    m.set_input_zero_copy("x", live)
    live[...] = x  # written after binding: the graph reads it
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), program.expected_fn(x, w1, b1, w2, b2),
                               rtol=1e-4, atol=1e-5)
    target = np.empty((4, 3), "float32")
    m.set_output_zero_copy(0, target)
    live[...] = 2 * x
    m.run()
    np.testing.assert_allclose(target, program.expected_fn(2 * x, w1, b1, w2, b2), rtol=1e-4, atol=1e-5)
    with pytest.raises(tv.ExecutionError, match="C-contiguous"):
        m.set_input_zero_copy("x", np.zeros((8, 4), "float32").T)


def test_input_errors_name_the_input(mlp_factory):
    m = tg.GraphModule(mlp_factory)
    with pytest.raises(tv.ShapeError, match=r"input 'x' must have shape \(4, 8\)"):
        m.set_input("x", np.zeros((4, 9), "float32"))
    with pytest.raises(tv.ExecutionError, match="dtype float32, got float64"):
        m.set_input("x", np.zeros((4, 8)))
    with pytest.raises(tv.ExecutionError, match="no input named 'nope'"):
        m.set_input("nope", 1)
    with pytest.raises(tv.ExecutionError, match="out of range"):
        m.set_input(7, 1)
    with pytest.raises(tv.ExecutionError, match="out of range"):
        m.get_output(1)
    with pytest.raises(tv.ExecutionError, match="got None"):
        m.set_input("x", None)


SORT_AND_CUMSUM = """
def @main(%x: Tensor[(2, 5), float32]) { (add(sort(%x, axis=1), 1f), cumsum(%x, axis=1)) }"""


def test_c_target_runs_library_calls_in_c():
    """sort and cumsum have no tensor expression: their kernels call C library functions."""
    x = np.random.default_rng(4).standard_normal((2, 5)).astype("float32")
    factory = tg.build(tv.parse(SORT_AND_CUMSUM), target="c")
    assert not factory.lib.fallback
    m = tg.GraphModule(factory)
    m.run(x=x)
    np.testing.assert_array_equal(m.get_output(0).numpy(), np.sort(x, axis=1) + np.float32(1))
    np.testing.assert_array_equal(m.get_output(1).numpy(), np.cumsum(x, axis=1))


def test_c_target_runs_ops_without_a_c_compute_on_numpy_and_says_so(monkeypatch):
    from tensorvm.op import get_op

    for name in ("sort", "cumsum"):  # (their kernels are library calls: take them away)
        monkeypatch.setattr(get_op(name), "library", None)
    mod = tv.parse(SORT_AND_CUMSUM)
    x = np.random.default_rng(3).standard_normal((2, 5)).astype("float32")
    factory = tg.build(mod, target="c")
    assert factory.lib.fallback and all("compute" in why for why in factory.lib.fallback.values())
    assert factory.lib.source  # the kernels that do have a compute are generated C
    m = tg.GraphModule(factory)
    m.run(x=x)
    np.testing.assert_allclose(m.get_output(0).numpy(), np.sort(x, axis=1) + 1, rtol=1e-6)
    np.testing.assert_allclose(m.get_output(1).numpy(), np.cumsum(x, axis=1), rtol=1e-5, atol=1e-6)


def test_identity_output_is_the_input_and_params_can_be_reloaded():
    mod = tv.parse("""
def @main(%x: Tensor[(3), float32], %w: Tensor[(3), float32]) { (%x, multiply(%x, %w)) }""")
    w = np.array([1, 2, 3], "float32")
    factory = tg.build(mod, params={"w": w})
    m = tg.GraphModule(factory)
    x = np.array([4, 5, 6], "float32")
    m.set_input_zero_copy("x", x)
    m.run()
    np.testing.assert_array_equal(m.get_output(0).numpy(), x)  # the input itself comes back
    np.testing.assert_array_equal(m.get_output(1).numpy(), x * w)
    (param_name,) = factory.params
    m.load_params(tg.save_params({param_name: np.array([2, 2, 2], "float32"), "unknown": np.zeros(1)}))
    m.run()
    np.testing.assert_array_equal(m.get_output(1).numpy(), x * 2)


def test_executor_binds_params_by_name_and_keeps_results_across_runs():
    program = _program("static_mlp")
    x, w1, b1, w2, b2 = program.args_fn()
    run = tv.create_executor("graph", program.parse(), params={"w1": w1, "b2": b2}).evaluate()
    first = run(x, b1=b1, w2=w2)
    second = run(2 * x, b1, w2)
    np.testing.assert_allclose(first.numpy(), program.expected_fn(x, w1, b1, w2, b2), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(second.numpy(), program.expected_fn(2 * x, w1, b1, w2, b2), rtol=1e-4, atol=1e-5)


def test_memory_of_the_module_follows_the_plan():
    program = _program("small_cnn")
    factory = tg.build(program.parse())
    m = tg.GraphModule(factory)
    plan = factory.memory_plan
    assert m.memory_stats()["workspace"] == plan.total_bytes == 512  # the pooled map; flatten is a view of it
    # inputs (512 + 144 + 1280) and the output (40) sit outside the workspace
    assert m.memory_stats()["separate"] == 512 + 144 + 1280 + 40


# --- save / load ---------------------------------------------------------------------------------
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("archive", [False, True])
def test_save_load_round_trip(tmp_path, target, archive):
    program = _program("small_cnn")
    x, w, wd = program.args_fn()
    factory = tg.build(program.parse(), target=target, params={"w": w, "wd": wd})
    path = factory.save(tmp_path / ("net.tvgraph" if archive else "net"))
    loaded = tg.load(path)
    assert loaded.graph_json == factory.graph_json and loaded.lib.target == target
    assert set(loaded.params) == set(factory.params)
    m = tg.GraphModule(loaded)
    m.run(x=x)
    np.testing.assert_allclose(m.get_output(0).numpy(), program.expected_fn(x, w, wd), rtol=1e-4, atol=1e-5)


def test_corrupt_saved_graphs_are_format_errors(tmp_path):
    factory = tg.build(_program("add_broadcast_static").parse())
    directory = Path(factory.save(tmp_path / "net"))
    (directory / "lib.json").write_text('{"format": "tensorvm-kernel-library", "version": 99}')
    with pytest.raises(tv.FormatError, match="version 99"):
        tg.load(directory)
    (directory / "lib.json").write_text("not json")
    with pytest.raises(tv.FormatError, match="not valid JSON"):
        tg.load(directory)
    (directory / "lib.json").unlink()
    with pytest.raises(tv.FormatError, match="missing lib.json"):
        tg.load(directory)
    archive = Path(factory.save(tmp_path / "net.tvgraph"))
    archive.write_bytes(archive.read_bytes()[:100])
    with pytest.raises(tv.FormatError, match="not a saved graph archive"):
        tg.load(archive)
    with pytest.raises(tv.FormatError, match="no such file"):
        tg.load(tmp_path / "missing.tvgraph")


# --- debug mode ----------------------------------------------------------------------------------
def test_debug_mode_times_every_node_and_keeps_every_output(tmp_path):
    program = _program("small_cnn")
    x, w, wd = program.args_fn()
    factory = tg.build(program.parse())
    dbg = tg.GraphModule(factory, debug=True)
    assert isinstance(dbg, tg.GraphModuleDebug)
    dbg.dump_root = tmp_path / "dump"
    result = dbg.run(number=2, repeat=2, x=x, w=w, wd=wd)
    assert [r.node for r in result.rows] == ["fused_nn_conv2d_nn_relu_nn_max_pool2d", "fused_nn_batch_flatten",
                                             "fused_nn_dense"]
    assert [r.op for r in result.rows][1] == "__nop"
    assert all(len(r.measurements_us) == 2 for r in result.rows)
    assert abs(sum(r.share for r in result.rows) - 1) < 1e-9
    table = result.table()
    for column in ("Node Name", "Ops", "Time(us)", "Time(%)", "Shape", "Inputs", "Outputs", "Measurements(us)"):
        assert column in table
    assert "(2, 4, 4, 4)" in table
    trace = result.chrome_trace()
    assert [e["name"] for e in trace["traceEvents"]] == [r.node for r in result.rows]
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in trace["traceEvents"])
    starts = [e["ts"] for e in trace["traceEvents"]]
    assert starts == sorted(starts)
    # every intermediate stays readable: check the pooled map against NumPy
    pooled = dbg.debug_get_output("fused_nn_conv2d_nn_relu_nn_max_pool2d").numpy()
    np.testing.assert_allclose(pooled, _max_pool_2x2(_relu(_conv2d_nchw(x, w, 1))), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(pooled.reshape(2, 64) @ wd.T, dbg.get_output(0).numpy(), rtol=1e-4, atol=1e-5)
    dumped = tg.load_param_file(tmp_path / "dump" / "output_tensors.params")
    np.testing.assert_array_equal(dumped["fused_nn_conv2d_nn_relu_nn_max_pool2d:0"], pooled)
    assert json.loads((tmp_path / "dump" / "_tvmdbg_execution_trace.json").read_text()) == trace
    assert (tmp_path / "dump" / "_tvmdbg_graph_dump.json").exists()
    trace_file = result.save_chrome_trace(tmp_path / "trace.json")
    assert json.loads(Path(trace_file).read_text())["traceEvents"]


def test_get_output_into_a_wrong_array_and_an_unreadable_params_file_are_the_projects_errors(tmp_path):
    """get_output(i, out=...) with an array of another shape, dtype or read-only is an ExecutionError (NumPy's
    broadcast or cast errors had escaped); a params path that is a
    directory or missing is a FormatError (OSErrors had escaped)."""
    from tensorvm.errors import ExecutionError, FormatError

    m = tg.GraphModule(tg.build(tv.parse("def @main(%x: Tensor[(2, 3), float32]) { exp(%x) }"), target="python"))
    m.set_input("x", np.zeros((2, 3), np.float32))
    m.run()
    readonly = np.empty((2, 3), np.float32)
    readonly.flags.writeable = False
    for out in (np.empty((3, 2), np.float32), np.empty((2, 3), np.int32), np.empty((1, 3), np.float32), readonly):
        with pytest.raises(ExecutionError, match="out must be a writable array"):
            m.get_output(0, out=out)
    good = np.empty((2, 3), np.float32)
    assert m.get_output(0, out=good) is good and np.array_equal(good, np.ones((2, 3), np.float32))
    for path in (tmp_path, tmp_path / "missing.params"):
        with pytest.raises(FormatError, match="cannot read params file"):
            tg.load_param_file(path)
