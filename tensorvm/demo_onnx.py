"""Demo: an ONNX model with a dynamic sequence axis, end to end.

Export a small PyTorch model (a self-attention tagger over token embeddings) with ``torch.onnx.export`` and a
dynamic ``seq`` axis (without torch: the same kind of model built with ``onnx.helper``), import it
with ``tv.frontend.from_onnx``, compile it for the VM, save the executable, load it back and run it
at two sequence lengths, checking each result against ONNX Runtime (or ONNX's reference evaluator).

    python -m tensorvm.demo_onnx        (``make demo`` calls ``run()``)
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings

import numpy as np

__all__ = ["run", "main"]

VOCAB, EMBED, HIDDEN, TAGS = 40, 16, 24, 5


def _export_torch(path: str) -> bool:
    try:
        import torch
    except ImportError:
        return False

    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, EMBED)
            self.qkv = torch.nn.Linear(EMBED, 3 * HIDDEN)
            self.norm = torch.nn.LayerNorm(HIDDEN)
            self.out = torch.nn.Linear(HIDDEN, TAGS)

        def forward(self, tokens):
            q, k, v = self.qkv(self.embed(tokens)).chunk(3, dim=-1)
            scores = q @ k.transpose(1, 2) / HIDDEN ** 0.5
            hidden = self.norm(torch.softmax(scores, dim=-1) @ v)
            return torch.softmax(self.out(torch.relu(hidden)), dim=-1)

    torch.manual_seed(0)
    model = Tagger().eval()
    example = torch.randint(0, VOCAB, (1, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (example,), path, input_names=["tokens"], output_names=["tags"],
                          dynamic_axes={"tokens": {1: "seq"}, "tags": {1: "seq"}}, dynamo=False, opset_version=17)
    return True


def _export_helper(path: str) -> None:
    """Without torch: embedding (Gather) -> MatMul -> Tanh -> MatMul -> Softmax, with a dynamic seq axis."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {
        "embedding": rng.standard_normal((VOCAB, EMBED)).astype("float32"),
        "w1": rng.standard_normal((EMBED, HIDDEN)).astype("float32") * 0.3,
        "w2": rng.standard_normal((HIDDEN, TAGS)).astype("float32") * 0.3,
    }
    nodes = [
        helper.make_node("Gather", ["embedding", "tokens"], ["embedded"], axis=0),
        helper.make_node("MatMul", ["embedded", "w1"], ["h"]),
        helper.make_node("Tanh", ["h"], ["a"]),
        helper.make_node("MatMul", ["a", "w2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["tags"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "tagger", [helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, "seq"])],
        [helper.make_tensor_value_info("tags", TensorProto.FLOAT, [1, "seq", TAGS])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _oracle(path: str):
    try:
        import onnxruntime

        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        return "ONNX Runtime", lambda feeds: session.run(None, feeds)[0]
    except ImportError:
        import onnx.reference

        evaluator = onnx.reference.ReferenceEvaluator(path)
        return "onnx.reference", lambda feeds: evaluator.run(None, feeds)[0]


def run(out=print) -> None:
    import tensorvm as tv
    from tensorvm.frontend import from_onnx

    with tempfile.TemporaryDirectory(prefix="tensorvm-demo-") as tmp:
        model_path = os.path.join(tmp, "tagger.onnx")
        if _export_torch(model_path):
            out("1. exported a PyTorch self-attention tagger with torch.onnx.export (dynamic axis 'seq')")
        else:
            _export_helper(model_path)
            out("1. built an ONNX tagger with onnx.helper (dynamic axis 'seq'; torch is not installed)")

        start = time.perf_counter()
        mod, params = from_onnx(model_path)
        out(f"2. imported it in {time.perf_counter() - start:.2f}s: "
            + "@main(" + ", ".join(f"%{p.name_hint}: {p.type_annotation}" for p in mod["main"].params) + ")")

        start = time.perf_counter()
        exe = tv.vm.compile(mod, target="python", params=params)
        exe_path = os.path.join(tmp, "tagger.tvx")
        exe.save(exe_path)
        stats = exe.stats()
        out(f"3. compiled for the VM in {time.perf_counter() - start:.2f}s ({stats['num_instructions']} instructions, "
            f"{stats['num_kernels']} kernels) and saved {os.path.getsize(exe_path)} bytes to tagger.tvx")

        vm = tv.vm.VirtualMachine(tv.vm.load_executable(exe_path))
        out("4. loaded the executable back")
        oracle_name, oracle = _oracle(model_path)
        rng = np.random.default_rng(7)
        for seq in (5, 13):
            tokens = rng.integers(0, VOCAB, (1, seq)).astype("int64")
            tags = vm.invoke("main", tokens).numpy()
            expected = oracle({"tokens": tokens})
            err = float(np.abs(tags - expected).max())
            out(f"5. seq={seq:2d}: output {tags.shape}, predicted tags {tags.argmax(-1)[0].tolist()}, "
                f"max |difference| vs {oracle_name} = {err:.1e}")
            if err > 1e-4:
                raise AssertionError(f"the demo's result differs from {oracle_name} by {err}")


def main() -> None:
    print("== ONNX import with a dynamic axis ==")
    run()


if __name__ == "__main__":
    main()
