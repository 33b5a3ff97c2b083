"""The real-model corpus's code (benchmarks/models/{corpus,vision,vision_nets,text}.py, run.py's corpus
report, harness.py's budget): pure functions against hand values or ONNX Runtime, nothing timed.

The corpus models themselves are checked by every benchmark run (tensorvm and PyTorch against ONNX
Runtime); here: the detector's NMS against ONNX Runtime's, its anchors by hand, the reordering of tied
detections, the summary's geometric mean and worst row, and that a worker over its budget is killed
with its children.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import harness  # noqa: E402
import run  # noqa: E402


def test_compare_outputs_reports_the_relative_error():
    ref = [np.array([2.0, -4.0], np.float32), np.array([10.0], np.float32)]
    got = [np.array([2.0, -3.9], np.float32), np.array([10.5], np.float32)]
    check = harness.compare_outputs(got, ref, atol=1.0, rtol=0.0)
    assert check["ok"]
    assert check["max_abs_err"] == pytest.approx(0.5)
    assert check["max_rel_err"] == pytest.approx(max(0.1 / 4.0, 0.5 / 10.0), rel=1e-5)


def _detections(rng, n=12, classes=3):
    boxes = rng.uniform(0, 100, size=(n, 4)).astype(np.float32)
    scores = np.sort(rng.uniform(0.2, 0.9, size=n).astype(np.float32))[::-1].copy()
    labels = rng.integers(1, classes + 1, size=n).astype(np.int64)
    return [boxes, scores, labels]


def test_align_detections_undoes_a_swap_of_tied_detections():
    ref = _detections(np.random.default_rng(0))
    ref[1][3:5] = 0.5  # two detections whose scores tie ...
    ref[2][3:5] = 2
    order = np.arange(12)
    order[[3, 4]] = order[[4, 3]]  # ... come in the other order from the other runtime
    got = [a[order].copy() for a in ref]
    got[1][3] += 1e-7
    assert not harness.compare_outputs(got, ref, 1e-3, 1e-3)["ok"]
    aligned = harness.align_detections(got, ref, 1e-3, 1e-3)
    assert harness.compare_outputs(aligned, ref, 1e-3, 1e-3)["ok"]


def test_align_detections_leaves_a_wrong_detection_to_be_flagged():
    ref = _detections(np.random.default_rng(1))
    got = [a.copy() for a in ref]
    got[0][5] += 7.0  # a box that is off
    got[2][8] = 9  # a wrong label
    aligned = harness.align_detections(got, ref, 1e-3, 1e-3)
    check = harness.compare_outputs(aligned, ref, 1e-3, 1e-3)
    assert not check["ok"]
    assert check["max_abs_err"] >= 7.0 - 1e-4


def _report(rows):
    """A run report holding one corpus model with cases ``a``/``b`` at the given thread counts; ``rows``
    maps (threads, case) to (tensorvm ms, ORT ms) or a tensorvm status."""
    passes = {}
    for (threads, case), value in rows.items():
        runtimes = passes.setdefault(str(threads), {"runtimes": {
            "tvm": {"label": "tensorvm", "family": "tensorvm", "status": "ok", "cases": {},
                    "info": {"compile_cold_s": 5.0, "compile_cached_s": 0.5}},
            "ort": {"label": "ORT", "family": "peer", "status": "ok", "cases": {}},
            "torch": {"label": "torch", "family": "peer", "status": "ok", "cases": {}}}})["runtimes"]
        if isinstance(value, str):
            runtimes["tvm"].update(status="timeout", message=value)
            runtimes["ort"]["cases"][case] = {"median": 1e-3}
            continue
        tvm_ms, ort_ms = value
        runtimes["tvm"]["cases"][case] = {"median": tvm_ms / 1e3, "check": {"ok": True, "max_abs_err": 1e-6,
                                                                             "max_rel_err": 1e-7, "reason": ""}}
        runtimes["ort"]["cases"][case] = {"median": ort_ms / 1e3}
    return {"meta": {"load_start": [0.1, 0.1, 0.1], "logical_cpus": 2}, "groups": [
        {"key": "suite-model", "corpus": False, "passes": {}, "cases": []},
        {"key": "m", "title": "model m", "corpus": True, "passes": passes,
         "cases": [{"name": "a", "label": "case a"}, {"name": "b", "label": "case b"}]}]}


def test_corpus_summary_gives_the_geometric_mean_and_the_worst_row():
    report = _report({(1, "a"): (2.0, 1.0), (1, "b"): (1.0, 2.0), (2, "a"): (8.0, 1.0), (2, "b"): (1.0, 1.0)})
    rows = run.corpus_rows(report)
    assert len(rows) == 4 and {r["model"] for r in rows} == {"m"}
    summary = run.corpus_summary(rows)
    assert summary["geomean"] == pytest.approx((2.0 * 0.5 * 8.0 * 1.0) ** 0.25)
    assert summary["geomean_by_threads"] == {1: pytest.approx(1.0), 2: pytest.approx(math.sqrt(8.0))}
    assert (summary["worst"]["threads"], summary["worst"]["case"], summary["worst"]["ratio"]) == (2, "case a", 8.0)
    assert not summary["unmeasured"]
    text = "\n".join(run.corpus_markdown(report, rows))
    assert "**8.00×** (worst)" in text and "5.0 / 0.50" in text


def test_a_timed_out_row_has_no_ratio_and_says_why():
    report = _report({(1, "a"): (3.0, 1.0), (2, "a"): "over the time budget of 300 s (in 'check')"})
    rows = run.corpus_rows(report)
    summary = run.corpus_summary(rows)
    assert summary["geomean"] == pytest.approx(3.0)
    reasons = [(r["threads"], r["case"], r["reason"]) for r in summary["unmeasured"]]
    assert reasons[0] == (1, "case b", "not timed")  # (the report has no numbers for it)
    assert [r[:2] for r in reasons[1:]] == [(2, "case a"), (2, "case b")]
    assert all(r[2].startswith("timeout: over the time budget of 300 s") for r in reasons[1:])
    assert any("no ratio for m (2 threads): timeout" in line for line in run.corpus_summary_lines(rows))


def test_a_wrong_tensorvm_output_gives_no_ratio():
    report = _report({(1, "a"): (1.0, 1.0)})
    report["groups"][1]["passes"]["1"]["runtimes"]["tvm"]["cases"]["a"]["check"] = {
        "ok": False, "max_abs_err": 3.0, "reason": "output 0: max |error| 3 > 0.001"}
    (row, _) = run.corpus_rows(report)
    assert row["ratio"] is None and row["reason"].startswith("wrong output")


def test_the_fastest_correct_exec_mode_gives_the_row():
    """A model measured in several exec modes ("tvm", "tvm-native") gets, per case, the fastest one whose
    output is correct; a faster wrong one is not chosen."""
    report = _report({(1, "a"): (4.0, 2.0), (1, "b"): (4.0, 2.0)})
    runtimes = report["groups"][1]["passes"]["1"]["runtimes"]
    runtimes["tvm-native"] = {"label": "tensorvm native", "family": "tensorvm", "status": "ok", "info": {}, "cases": {
        "a": {"median": 1e-3, "check": {"ok": True, "max_abs_err": 0.0, "max_rel_err": 0.0, "reason": ""}},
        "b": {"median": 1e-3, "check": {"ok": False, "max_abs_err": 3.0, "reason": "wrong"}}}}
    row_a, row_b = run.corpus_rows(report)
    assert (row_a["tvm_runtime"], row_a["ratio"]) == ("tvm-native", pytest.approx(0.5))
    assert (row_b["tvm_runtime"], row_b["ratio"]) == ("tvm", pytest.approx(2.0))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in status)
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads process states from Linux /proc")
def test_a_worker_over_its_budget_is_killed_with_its_children(tmp_path):
    """A worker that never answers (and started a child, as a C compiler's cc1) is killed with the
    whole process group once its budget is spent; the row's status is "timeout"."""
    pid_file = tmp_path / "child.pid"
    script = ("import subprocess, sys, pathlib; child = subprocess.Popen(['sleep', '120']); "
              f"pathlib.Path({str(pid_file)!r}).write_text(str(child.pid)); sys.stdin.readline(); "
              "import time; time.sleep(120)")
    worker = harness.Worker("fake", "fake", 1, tmp_path, False, budget_s=2.0,
                            command=[sys.executable, "-c", script])
    with pytest.raises(harness.WorkerError) as caught:
        worker.request({"cmd": "setup"}, timeout_s=600)
    assert caught.value.status == "timeout" and "budget of 2 s" in caught.value.message
    assert worker.process.poll() is not None
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
    with pytest.raises(harness.WorkerError):  # a dead worker answers nothing more
        worker.request({"cmd": "exit"})


# --- the detector's pieces ----------------------------------------------------------------------------
torch = pytest.importorskip("torch")


def test_ssd_anchors_by_hand():
    from models.vision_nets import ssd_anchors

    anchors = ssd_anchors((2, 1), image=100, min_ratio=0.2, max_ratio=0.9)
    assert anchors.shape == ((4 + 1) * 6, 4)
    # the first cell of the 2x2 map: centre (25, 25); scale 0.2, then sqrt(0.2 * 0.9), then ratio 2 and 3
    np.testing.assert_allclose(anchors[0], [25, 25, 20, 20], rtol=1e-6)
    np.testing.assert_allclose(anchors[1], [25, 25, 100 * math.sqrt(0.18), 100 * math.sqrt(0.18)], rtol=1e-6)
    np.testing.assert_allclose(anchors[2], [25, 25, 20 * math.sqrt(2), 20 / math.sqrt(2)], rtol=1e-6)
    np.testing.assert_allclose(anchors[5], [25, 25, 20 / math.sqrt(3), 20 * math.sqrt(3)], rtol=1e-6)
    np.testing.assert_allclose(anchors[6, :2], [75, 25])  # the next cell along x
    # the 1x1 map: scale 0.9 and sqrt(0.9 * 1.0); ratio boxes clipped to the image
    np.testing.assert_allclose(anchors[24], [50, 50, 90, 90], rtol=1e-6)
    np.testing.assert_allclose(anchors[26], [50, 50, 100, 90 / math.sqrt(2)], rtol=1e-6)


def test_make_divisible_by_hand():
    from models.vision_nets import make_divisible

    assert [make_divisible(v) for v in (4, 16, 18, 60, 144)] == [8, 16, 24, 64, 144]


def test_nms_reference_by_hand():
    from models.vision_nets import nms_reference

    boxes = np.array([[[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [0, 0, 10, 10.5]]], np.float32)
    scores = np.array([[[0.9, 0.8, 0.7, 0.0005], [0.1, 0.95, 0.2, 0.3]]], np.float32)
    selected = nms_reference(boxes, scores, max_per_class=5, iou_threshold=0.5, score_threshold=0.001)
    # class 0: box 1 overlaps box 0 (IoU 81/119 > 0.5), box 3 is under the score threshold
    # class 1: box 1; box 3 (IoU with box 1: 85.5 / 119.5 > 0.5) suppressed; box 2; box 0 (IoU 0.68) suppressed
    assert selected.tolist() == [[0, 0, 0], [0, 0, 2], [0, 1, 1], [0, 1, 2]]
    assert nms_reference(boxes, scores, 1, 0.5, 0.001).tolist() == [[0, 0, 0], [0, 1, 1]]


def test_nms_reference_matches_onnx_runtime():
    ort = pytest.importorskip("onnxruntime")
    from models.vision_nets import nms_reference
    from onnx import TensorProto, helper

    rng = np.random.default_rng(4)
    corner = rng.uniform(0, 80, size=(2, 60, 2))
    boxes = np.concatenate([corner, corner + rng.uniform(2, 30, size=(2, 60, 2))], -1).astype(np.float32)
    scores = rng.uniform(0, 1, size=(2, 3, 60)).astype(np.float32)
    names = ["boxes", "scores", "max", "iou", "threshold"]
    types = [TensorProto.FLOAT, TensorProto.FLOAT, TensorProto.INT64, TensorProto.FLOAT, TensorProto.FLOAT]
    graph = helper.make_graph([helper.make_node("NonMaxSuppression", names, ["selected"])], "nms",
                              [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, types)],
                              [helper.make_tensor_value_info("selected", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for limit, iou, threshold in ((100, 0.5, 0.0), (7, 0.3, 0.4)):
        (expected,) = session.run(None, {"boxes": boxes, "scores": scores, "max": np.array([limit]),
                                         "iou": np.array([iou], np.float32),
                                         "threshold": np.array([threshold], np.float32)})
        np.testing.assert_array_equal(nms_reference(boxes, scores, limit, iou, threshold), expected)


def test_padding_mask_mixes_padded_and_full_rows():
    from models.corpus import padding_mask

    mask = padding_mask(3, 8)
    assert mask.tolist() == [[1] * 8, [1] * 5 + [0] * 3, [1] * 2 + [0] * 6]
    assert padding_mask(2, 2).tolist() == [[1, 1], [1, 0]]


def test_corpus_models_are_listed_and_selectable():
    import models

    keys = {g.key for g in models.groups() if g.corpus}
    assert {"resnet18", "mobilenetv3", "ssdlite", "gpt2", "gpt2-decode", "gru", "distilbert", "roberta",
            "t5-encoder"} <= keys
    for grp in models.groups():
        if grp.corpus:
            keys = {r.key for r in grp.runtimes}
            assert {"tvm", "ort", "torch"} <= keys and grp.reference == "ort"
            assert all(k in ("tvm", "ort", "torch", "tvm-native", "tvm-compiled") for k in keys), keys
            assert math.isfinite(grp.budget_s) and len(grp.cases) >= 2
    assert "tvm-native" in {r.key for r in next(g for g in models.groups() if g.key == "gru").runtimes}
    assert os.path.basename(run.__file__) == "run.py"


def test_conv_layers_builds_the_other_checkouts_kernel_from_its_files(tmp_path):
    """``conv_layers.py --against`` times another checkout's packed kernel: its library text comes from
    that checkout's files, not from the C library files already read (c_emit caches them by name: the
    "other" kernel had been this one's, their ratio 1 whatever the change)."""
    import shutil

    import conv_layers

    from tensorvm.codegen import c_emit

    here = conv_layers.library_source()
    other = tmp_path / "lib"
    shutil.copytree(c_emit.LIBRARY_DIR, other)
    marker = "/* another checkout's packed convolution */\n"
    (other / "tv_vconv.h").write_text(marker + (other / "tv_vconv.h").read_text())
    assert marker in conv_layers.library_source(other)
    assert marker not in here and conv_layers.library_source() == here
