"""Kernel threads with and without other work on the machine, beside ONNX Runtime in the same run.

    .venv/bin/python benchmarks/threads_under_load.py [--threads 1,2] [--calls 200] [--rounds 5]
        [--models mlp-b1,mlp-b32,attention-b1[,bert-small][,mobilenetv3]]

Each model is one ONNX file (built here with ``onnx.helper``, or for ``bert-small`` exported from PyTorch
as ``benchmarks/models/bert.py`` does, 16 tokens, or for ``mobilenetv3`` / ``resnet18`` the corpus's
export that ``benchmarks/run.py`` left in its cache, batch 1; random weights, nothing downloaded) that
both runtimes load: tensorvm compiles it for target "c", ONNX Runtime runs it with its CPU provider.
For each thread count (``tv.set_num_threads`` and ORT's ``intra_op_num_threads``) the two runtimes are
timed alternately in rounds (so that a change in the machine's load hits both), first on the machine as
it is ("quiet"), then with a background load: one process per ``--load`` count spinning in a busy loop.
The table gives median milliseconds per call and the ratio tensorvm / ONNX Runtime; the last column
is how much slower tensorvm got under the load (loaded / quiet). Outputs are checked against each other.
Nothing here asserts a time: it is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import background_load  # noqa: E402

import tensorvm as tv  # noqa: E402


def _dense_chain(batch: int, width: int, layers: int, seed: int = 0):
    """ONNX MatMul + Add + Relu layers on a (batch, width) input."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        b = rng.standard_normal(width).astype(np.float32) / 10
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"r{i}"])]
        prev = f"r{i}"
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [batch, width])], inits)
    x = rng.standard_normal((batch, width)).astype(np.float32)
    return graph, {"x": x}


def _attention(batch: int, length: int, width: int, heads: int, seed: int = 0):
    """One self-attention block with a residual and layer norm (the shape of a small BERT layer)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    head = width // heads

    def weight(name, *shape):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32),
                                             name))
        return name

    def const(name, values, dtype=np.int64):
        inits.append(numpy_helper.from_array(np.asarray(values, dtype), name))
        return name

    inits: list = []
    node = helper.make_node
    nodes = []
    split_shape = const("split_shape", [batch, length, heads, head])
    merge_shape = const("merge_shape", [batch, length, width])
    for name in ("q", "k", "v"):
        nodes += [node("MatMul", ["x", weight(f"w{name}", width, width)], [f"{name}0"]),
                  node("Reshape", [f"{name}0", split_shape], [f"{name}1"]),
                  node("Transpose", [f"{name}1"], [f"{name}2"], perm=[0, 2, 3, 1] if name == "k" else [0, 2, 1, 3])]
    scale = numpy_helper.from_array(np.array(1 / np.sqrt(head), np.float32), "scale")
    inits.append(scale)
    nodes += [node("MatMul", ["q2", "k2"], ["s0"]), node("Mul", ["s0", "scale"], ["s1"]),
              node("Softmax", ["s1"], ["p"], axis=-1), node("MatMul", ["p", "v2"], ["c0"]),
              node("Transpose", ["c0"], ["c1"], perm=[0, 2, 1, 3]), node("Reshape", ["c1", merge_shape], ["c2"]),
              node("MatMul", ["c2", weight("wo", width, width)], ["o"]), node("Add", ["o", "x"], ["r"]),
              node("LayerNormalization", ["r", const("gamma", np.ones(width), np.float32),
                                          const("beta", np.zeros(width), np.float32)], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "attention",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, length, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, length, width])], inits)
    return graph, {"x": rng.standard_normal((batch, length, width)).astype(np.float32)}


MODELS = {
    "mlp-b1": lambda: _dense_chain(1, 256, 6),
    "mlp-b32": lambda: _dense_chain(32, 512, 4),
    "attention-b1": lambda: _attention(1, 32, 256, 4),
}


def _bert_small(directory: Path, length: int = 16):
    """BERT small (4 layers x 256, random weights) exported from PyTorch, as the benchmark suite does."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from models import bert

    bert.export(bert.CONFIGS["bert-small"], directory, "bert-small")
    return directory / "bert-small.onnx", {"input_ids": bert.make_input_ids(length)}


def _corpus_cnn(name: str):
    """A corpus CNN's ONNX export (``benchmarks/run.py --models NAME`` makes it) and a batch-1 image."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from compile_time import SHAPES, find_onnx

    path = find_onnx(name, None)
    if path is None:
        raise SystemExit(f"no ONNX export of {name}: run benchmarks/run.py --models {name} first")
    dims = [1 if d is None else d for d in SHAPES[name]["images"]]
    return path, {"images": np.random.default_rng(0).standard_normal(dims).astype(np.float32)}


def _onnx_file(name: str, directory: Path):
    from onnx import helper

    if name == "bert-small":  # (needs PyTorch and transformers)
        return _bert_small(directory)
    if name in ("mobilenetv3", "resnet18"):
        return _corpus_cnn(name)
    graph, inputs = MODELS[name]()
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = directory / f"{name}.onnx"
    path.write_bytes(model.SerializeToString())
    return path, inputs


class _Runtimes:
    """One model on both runtimes; ``call(key)`` runs it once."""

    def __init__(self, path: Path, inputs: dict, threads: int):
        import onnx
        import onnxruntime as ort

        self.inputs = inputs
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        mod, params = tv.frontend.from_onnx(onnx.load(str(path)))
        self.vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params))
        self.args = [inputs[p.name_hint] for p in mod["main"].params]

    def call(self, key: str):
        if key == "tensorvm":
            return np.asarray(self.vm.invoke("main", *self.args).numpy())
        return self.session.run(None, self.inputs)[0]


def _time(runtimes: _Runtimes, calls: int, rounds: int) -> dict:
    """Median ms per call of each runtime, rounds alternating between them."""
    samples: dict = {"tensorvm": [], "onnxruntime": []}
    for key in samples:
        for _ in range(3):
            runtimes.call(key)  # warm-up
    for r in range(rounds):
        for key in (list(samples) if r % 2 == 0 else list(samples)[::-1]):
            start = time.perf_counter()
            for _ in range(calls):
                runtimes.call(key)
            samples[key].append((time.perf_counter() - start) * 1e3 / calls)
    return {key: statistics.median(values) for key, values in samples.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--calls", type=int, default=100, help="calls per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--load", type=int, default=1, help="busy background processes in the loaded runs")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path, inputs = _onnx_file(name, Path(tmp))
            for threads in (int(t) for t in args.threads.split(",")):
                tv.set_num_threads(threads)
                runtimes = _Runtimes(path, inputs, threads)
                np.testing.assert_allclose(runtimes.call("tensorvm"), runtimes.call("onnxruntime"), rtol=1e-3,
                                           atol=1e-4)
                quiet = _time(runtimes, args.calls, args.rounds)
                with background_load(args.load):
                    loaded = _time(runtimes, args.calls, args.rounds)
                rows.append((name, threads, quiet, loaded))
                print(f"# {name} threads={threads} done", file=sys.stderr, flush=True)
    print(f"| model | threads | quiet tensorvm ms | quiet ORT ms | ratio | loaded ({args.load} busy) tensorvm ms "
          "| loaded ORT ms | ratio | tensorvm loaded/quiet | ORT loaded/quiet |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, threads, quiet, loaded in rows:
        print(f"| {name} | {threads} | {quiet['tensorvm']:.3f} | {quiet['onnxruntime']:.3f} "
              f"| {quiet['tensorvm'] / quiet['onnxruntime']:.2f} | {loaded['tensorvm']:.3f} "
              f"| {loaded['onnxruntime']:.3f} | {loaded['tensorvm'] / loaded['onnxruntime']:.2f} "
              f"| {loaded['tensorvm'] / quiet['tensorvm']:.2f} | {loaded['onnxruntime'] / quiet['onnxruntime']:.2f} |")


if __name__ == "__main__":
    main()
