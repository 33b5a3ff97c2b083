"""The benchmark models (benchmarks/models/) at tiny sizes against PyTorch, so they cannot silently rot.

Each IR model runs on tensorvm's VM (target "python") and is compared with the PyTorch module the
benchmark uses as its peer, built from the same weights; the LSTM also checks that one executable
serves several sequence lengths. Also checked: the tree generator's node counts and the harness's
statistics helpers.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import harness  # noqa: E402
from models import cnn, lstm, mlp, treelstm  # noqa: E402

import tensorvm as tv  # noqa: E402

torch = pytest.importorskip("torch")


def run_vm(mod, params, *args, exec_mode="bytecode"):
    exe = tv.vm.compile(mod, target="python", params=params, exec_mode=exec_mode)
    return tv.vm.VirtualMachine(exe)


def to_numpy(value):
    return [np.asarray(v.numpy()) for v in (value if isinstance(value, tuple) else (value,))]


@pytest.mark.parametrize("exec_mode", ["bytecode", "compiled"])
def test_lstm_ir_matches_torch_for_several_lengths_with_one_executable(exec_mode):
    input_size, hidden = 8, 6
    weights = lstm.make_weights(input_size, hidden, seed=3)
    mod, params = lstm.build_ir(input_size, hidden, weights)
    vm = run_vm(mod, params, exec_mode=exec_mode)
    reference = lstm.torch_lstm(torch, weights)
    cell_loop = lstm.torch_cell_loop(torch, weights)
    for length in (1, 4, 9):
        xs = lstm.make_sequence(input_size, length, seed=length)
        h, c = to_numpy(vm.invoke("main", xs))
        with torch.no_grad():
            h_ref, c_ref = (t.numpy() for t in reference(torch.from_numpy(xs)))
            h_loop, _ = (t.numpy() for t in cell_loop(torch.from_numpy(xs)))
        np.testing.assert_allclose(h, h_ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(c, c_ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(h_loop, h_ref, rtol=1e-5, atol=1e-6)


def test_lstm_empty_sequence_returns_the_zero_state():
    weights = lstm.make_weights(4, 3)
    mod, params = lstm.build_ir(4, 3, weights)
    h, c = to_numpy(run_vm(mod, params).invoke("main", np.zeros((0, 1, 4), np.float32)))
    assert h.shape == c.shape == (1, 3) and not h.any() and not c.any()


def test_lstm_rejects_a_wrong_input_size():
    weights = lstm.make_weights(4, 3)
    mod, params = lstm.build_ir(4, 3, weights)
    with pytest.raises(tv.errors.TensorVMError):
        run_vm(mod, params).invoke("main", np.zeros((2, 1, 5), np.float32))


def test_tree_lstm_ir_matches_the_recursive_torch_model():
    input_size, hidden = 7, 5
    weights = treelstm.make_weights(input_size, hidden, seed=1)
    mod, params = treelstm.build_ir(input_size, hidden, weights)
    vm = run_vm(mod, params)
    node = treelstm.torch_tree_lstm(torch, weights)
    trees = treelstm.make_trees(4, input_size, min_nodes=1, max_nodes=9, seed=2)
    trees.append(("leaf", np.ones((1, input_size), np.float32)))
    for tree in trees:
        h, c = to_numpy(vm.invoke("main", treelstm.tree_value(mod, tree)))
        with torch.no_grad():
            h_ref, c_ref = (t.numpy() for t in node(treelstm.torch_tree(torch, tree)))
        np.testing.assert_allclose(h, h_ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(c, c_ref, rtol=1e-5, atol=1e-6)


def test_tree_lstm_leaf_by_hand():
    """A single leaf: c = sigmoid(i) * tanh(u), h = sigmoid(o) * tanh(c), computed in NumPy."""
    weights = treelstm.make_weights(3, 2)
    mod, params = treelstm.build_ir(3, 2, weights)
    x = np.array([[0.5, -1.0, 2.0]], np.float32)
    h, c = to_numpy(run_vm(mod, params).invoke("main", treelstm.tree_value(mod, ("leaf", x))))
    i, o, u = np.split(x @ weights["w_iou"].T + weights["b_iou"], 3, axis=1)
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    c_ref = sig(i) * np.tanh(u)
    np.testing.assert_allclose(c, c_ref, rtol=1e-5)
    np.testing.assert_allclose(h, sig(o) * np.tanh(c_ref), rtol=1e-5)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 60), st.integers(0, 40), st.integers(0, 1000))
def test_random_trees_have_node_counts_in_range(low, span, seed):
    high = low + span
    if (low + 2) // 2 > (high + 1) // 2:  # no odd count in [low, high]
        with pytest.raises(ValueError):
            treelstm.make_trees(3, 2, low, high, seed)
        return
    for tree in treelstm.make_trees(3, 2, low, high, seed):
        n = treelstm.count_nodes(tree)
        assert low <= n <= high and n % 2 == 1


@pytest.mark.parametrize("batch", [1, 3])
def test_mlp_ir_matches_torch(batch):
    layers = (12, 8, 8, 4)
    weights = mlp.make_weights(layers)
    mod, params = tv.parse(mlp.mlp_relay_text(batch, layers)), weights
    x = mlp.make_input(batch, layers[0])
    (out,) = to_numpy(run_vm(mod, params).invoke("main", x))
    with torch.no_grad():
        ref = mlp.torch_mlp(torch, weights, layers)(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_cnn_ir_matches_torch():
    channels, image = (3, 4, 5, 6), 8
    weights = cnn.make_weights(channels, classes=3)
    mod = tv.parse(cnn.cnn_relay_text(2, image, channels, classes=3))
    x = cnn.make_input(2, image)
    (out,) = to_numpy(run_vm(mod, weights).invoke("main", x))
    with torch.no_grad():
        ref = cnn.torch_cnn(torch, weights, channels, classes=3)(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_bert_onnx_import_matches_torch_when_the_frontend_exists(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("onnx")
    try:
        from tensorvm.frontend import from_onnx  # noqa: F401
    except ImportError:
        pytest.skip("tensorvm.frontend.from_onnx is not built yet")
    from models import bert

    config = {"num_hidden_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 32}
    bert.export(config, tmp_path, "tiny", vocab_size=50)
    from models.common import import_from_onnx

    mod, params = import_from_onnx(tmp_path / "tiny.onnx", shape={"input_ids": [1, None]})
    vm = run_vm(mod, params)
    model = bert.torch_bert(torch, config, tmp_path / "tiny.pt", vocab_size=50)
    for length in (3, 11):
        ids = bert.make_input_ids(length, vocab_size=50)
        (out,) = to_numpy(vm.invoke("main", ids))
        with torch.no_grad():
            ref = model(torch.from_numpy(ids)).numpy()
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_compare_outputs_flags_wrong_and_misshaped_results():
    ref = [np.array([1.0, 2.0, 3.0], np.float32)]
    assert harness.compare_outputs([ref[0] + 1e-6], ref, atol=1e-4, rtol=1e-3)["ok"]
    bad = harness.compare_outputs([ref[0] + np.array([0, 0, 0.5], np.float32)], ref, atol=1e-4, rtol=1e-3)
    assert not bad["ok"] and bad["max_abs_err"] == pytest.approx(0.5)
    assert not harness.compare_outputs([np.zeros(4, np.float32)], ref, atol=1, rtol=1)["ok"]
    assert not harness.compare_outputs([], ref, atol=1, rtol=1)["ok"]
    assert not harness.compare_outputs([np.array([np.nan, 2, 3], np.float32)], ref, atol=1, rtol=1)["ok"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(1e-6, 10.0), min_size=1, max_size=50))
def test_summary_statistics_match_numpy(samples):
    stats = harness.summarize(samples)
    assert stats["median"] == pytest.approx(float(np.median(samples)))
    assert stats["min"] == pytest.approx(min(samples))
    assert stats["q1"] <= stats["median"] <= stats["q3"]
    assert stats["n"] == len(samples)


class _FakeProcess:
    """A process whose CPU time grows by ``share`` of a CPU per second of a fake clock that only
    ``sleep`` advances: the idle wait's decisions without the machine's scheduling in them."""

    def __init__(self, share: float):
        self.share, self.now = share, 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float):
        self.now += seconds

    def cpu_ns(self, pid) -> int:
        return int(self.share * self.now * 1e9)


@pytest.mark.parametrize("share, waited", [(1.0, 0.5), (harness.IDLE_SHARE * 2, 0.5), (0.0, 0.1),
                                           (harness.IDLE_SHARE / 2, 0.1)])
def test_switching_waits_for_a_spinning_worker_and_not_for_an_idle_one(share, waited):
    """The harness's pause between workers: a process that keeps a CPU busy is waited for up to the
    limit; an idle one ends the wait after one window (a fake clock: no timing in the test)."""
    process = _FakeProcess(share)
    assert harness.wait_until_idle(1, window_s=0.1, limit_s=0.5, cpu_ns=process.cpu_ns, clock=process.clock,
                                   sleep=process.sleep) == pytest.approx(waited)


def test_a_gone_process_ends_the_wait_after_the_switch_pause():
    clock = _FakeProcess(0.0)
    assert harness.wait_until_idle(1, cpu_ns=lambda pid: None, clock=clock.clock,
                                   sleep=clock.sleep) == pytest.approx(harness.SWITCH_PAUSE_S)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="per-thread CPU time comes from Linux /proc")
def test_cpu_time_is_read_from_a_live_process_and_not_from_a_gone_one():
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert isinstance(harness._cpu_ns(child.pid), int)
    finally:
        child.kill()
        child.wait()
    assert harness._cpu_ns(child.pid) is None  # gone: no CPU time to read


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="per-process CPU time comes from Linux /proc")
def test_the_background_load_spins_during_the_block_and_is_gone_after_it_even_on_an_error():
    with pytest.raises(RuntimeError, match="inside"):
        with harness.background_load(2) as busy:
            assert len(busy) == 2 and all(p.poll() is None for p in busy)
            before = [harness._cpu_ns(p.pid) for p in busy]
            time.sleep(0.3)
            assert all(harness._cpu_ns(p.pid) > b for p, b in zip(busy, before))  # they burn CPU
            raise RuntimeError("inside")
    assert all(p.poll() is not None for p in busy) and all(harness._cpu_ns(p.pid) is None for p in busy)
    with harness.background_load(0) as none:
        assert none == []


@pytest.mark.parametrize("target, ran", [("c", "native"), ("python", "compiled")])
def test_the_vm_compiled_row_is_named_for_the_exec_mode_that_ran(target, ran):
    """Exec mode "compiled" is native mode on target c: the one row says "native" there and "compiled" on
    target python (a fall back), and the recurrent models list no second row for native mode."""
    from models.common import RuntimeSpec, TensorVMRunner

    weights = lstm.make_weights(8, 6, seed=1)
    runner = TensorVMRunner(lambda: lstm.build_ir(8, 6, weights), lambda case, mod: [], exec_mode="compiled",
                            targets=(target,), compile_twice=False)
    info = runner.setup()
    assert (info["target"], info["exec_mode"]) == (target, ran)
    spec = RuntimeSpec("tvm-ir-vm-compiled", "tensorvm IR · VM compiled", "tensorvm", lambda grp, ctx: runner)
    assert spec.label_for(info) == f"tensorvm IR · VM {ran}"
    assert RuntimeSpec("ort", "ONNX Runtime", "peer", spec.make).label_for(info) == "ONNX Runtime"
    for module in (lstm, treelstm):
        labels = [r.label for r in module.group().runtimes]
        assert "tensorvm IR · VM compiled" in labels and "tensorvm IR · VM native" not in labels


@pytest.mark.parametrize("isa", [None, "portable"])
def test_the_interleave_experiment_builds_and_its_fused_pass_matches_the_separate_one(tmp_path, isa):
    """benchmarks/lstm_interleave.c (warning-clean) checks the fused pass's final h against tensorvm's order
    before it times anything: short sequences, a partial last block and one token, at the host's instance
    and the 16-byte one (the 64-byte one builds in about 30 s of CPU here: run by hand)."""
    import subprocess

    import lstm_interleave

    from tensorvm.codegen import host

    params = host.gemm_params(host.isa_host(isa) if isa else None)
    exe = lstm_interleave.build(tmp_path, params)
    for tokens in (1, 7, 2 * max(1, params.mr - 2) + 3):
        done = subprocess.run([str(exe), str(tokens), "1", "20", "24"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert f"T={tokens} I=20 H=24" in done.stdout
