"""The SSD detector's postprocessing kernels on its shapes: ``topk`` over 90 x 3234 class scores
(k = 300) and ``vision.all_class_non_max_suppression`` over 90 classes x 300 candidates: tensorvm's C
library calls, topk against its NumPy kernel (NMS's NumPy kernel is a Python loop: too slow to time;
its output is checked on the first 8 classes).

    .venv/bin/python benchmarks/detection_kernels.py

Scores: a softmax over 91 random logits per anchor (the background class dropped), as the untrained
SSDlite of the corpus sees; boxes: random boxes in a 320 x 320 image. One thread; interleaved rounds,
best and median call (the machine may be shared). The C and NumPy outputs must be equal.
"""

from __future__ import annotations

import time

import numpy as np

import tensorvm as tv
from tensorvm.codegen.fused import build_fused_module
from tensorvm.ir.attrs import Attrs
from tensorvm.ir.expr import Call, Function, Op, Var
from tensorvm.ir.types import TensorType
from tensorvm.op import get_op

CLASSES, ANCHORS, K = 90, 3234, 300
NMS = "vision.all_class_non_max_suppression"


def _primitive(op: str, arrays, attrs: dict) -> Function:
    params = [Var(f"p{i}", TensorType(a.shape, a.dtype.name)) for i, a in enumerate(arrays)]
    return Function(params, Call(Op(op), tuple(params), Attrs(attrs)), attrs={"Primitive": 1})


def _inputs():
    rng = np.random.default_rng(0)
    logits = np.exp(rng.normal(0, 1, (ANCHORS, CLASSES + 1)))
    scores = np.ascontiguousarray((logits / logits.sum(1, keepdims=True))[:, 1:].T).astype("float32")
    order = np.argsort(-scores, axis=1, kind="stable")[:, :K]
    corner = rng.uniform(0, 300, (ANCHORS, 2))
    boxes = np.concatenate([corner, np.minimum(corner + rng.uniform(5, 80, (ANCHORS, 2)), 320)], 1)
    nms = [boxes.astype("float32")[order], np.take_along_axis(scores, order, 1)[:, None, :].copy(),
           np.array([K], np.int64), np.array([0.55], np.float32), np.array([0.001], np.float32)]
    return {"topk": ([scores], {"k": K, "axis": 1, "dtype": "int64"}), NMS: (nms, {})}


def _time(call, rounds: int = 15, calls: int = 4) -> list:
    return [min(_once(call) for _ in range(calls)) for _ in range(rounds)]


def _once(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main():
    tv.set_num_threads(1)
    cases = _inputs()
    names = {op: op.replace(".", "_") for op in cases}  # (C function names)
    kernels = build_fused_module({names[op]: _primitive(op, arrays, attrs) for op, (arrays, attrs) in cases.items()})[1]
    print(f"{'kernel':<40} {'C best / median ms':>20} {'NumPy best / median ms':>24} {'C / NumPy':>10}")
    for op, (arrays, attrs) in cases.items():
        timed = op == "topk"
        checked = arrays if timed else [arrays[0][:8], arrays[1][:8], *arrays[2:]]
        reference = get_op(op).kernel(Attrs(attrs), *checked)
        reference = reference if isinstance(reference, tuple) else (reference,)
        outputs = [np.empty(np.shape(r), np.asarray(r).dtype) for r in reference]
        if timed:
            kernels[names[op]](*arrays, *outputs)
        else:  # (a second kernel for the 8 classes' shapes)
            part = build_fused_module({"part": _primitive(op, checked, attrs)})[1]["part"]
            part(*checked, *outputs)
        for out, ref in zip(outputs, reference, strict=True):
            np.testing.assert_array_equal(out, ref)
        if not timed:
            outputs = [np.empty((CLASSES * K, 3), np.int64), np.empty(1, np.int64)]
        c_times, numpy_times = [], []
        for _ in range(3):  # interleaved
            c_times += _time(lambda: kernels[names[op]](*arrays, *outputs))  # noqa: B023
            if timed:
                numpy_times += _time(lambda: get_op(op).kernel(Attrs(attrs), *arrays), rounds=2, calls=1)  # noqa: B023
        c, n = np.array(c_times) * 1e3, np.array(numpy_times) * 1e3
        peer = f"{n.min():11.2f} / {np.median(n):10.2f} {np.median(c) / np.median(n):10.3f}" if timed else ""
        print(f"{op + ' ' + 'x'.join(map(str, arrays[0].shape)):<40} {c.min():9.2f} / {np.median(c):8.2f} {peer}")


if __name__ == "__main__":
    main()
