"""BERT encoders (transformers ``BertModel`` with random weights), batch 1, dynamic sequence length.

The model is built from a ``BertConfig`` (base: 12 layers, hidden 768; small: 4 layers, hidden 256),
seeded, without the pooler, with eager attention; it is exported once with ``torch.onnx.export``
with a dynamic sequence axis, and tensorvm imports that file with ``tv.frontend.from_onnx`` giving the
sequence dim as ``?``: one compiled executable serves every length. Input: ``input_ids (1, seq)``
int64; output: ``last_hidden_state (1, seq, hidden)``. PyTorch eager runs the same weights (loaded from
the saved state dict), ONNX Runtime the same file.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import numpy as np

from .common import (
    PEER,
    TENSORVM,
    Case,
    ModelGroup,
    OrtRunner,
    RuntimeSpec,
    TensorVMRunner,
    TorchRunner,
    import_from_onnx,
    rng_for,
)

CONFIGS = {
    "bert-base": {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
                  "intermediate_size": 3072},
    "bert-small": {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                   "intermediate_size": 1024},
}
SEQ_LENGTHS = (16, 64, 128, 256)
VOCAB_SIZE = 30522


def bert_config(config: dict, vocab_size: int = VOCAB_SIZE):
    from transformers import BertConfig

    return BertConfig(vocab_size=vocab_size, max_position_embeddings=512, hidden_act="gelu",
                      attn_implementation="eager", **config)


@functools.cache
def _encoder_class():
    import torch

    class Encoder(torch.nn.Module):
        """``BertModel`` (no pooler) returning ``last_hidden_state`` only."""

        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids):
            return self.bert(input_ids=input_ids).last_hidden_state

    return Encoder


def torch_bert(torch, config: dict, state_path: Path | None = None, seed: int = 0, vocab_size: int = VOCAB_SIZE):
    """The encoder; weights from ``state_path`` when given, else a seeded random init."""
    from transformers import BertModel

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = BertModel(bert_config(config, vocab_size), add_pooling_layer=False)
    if state_path is not None:
        model.load_state_dict(torch.load(str(state_path), weights_only=True))
    return _encoder_class()(model).eval()


def make_input_ids(length: int, vocab_size: int = VOCAB_SIZE, seed: int = 0) -> np.ndarray:
    return rng_for("bert-ids", length, seed).integers(0, vocab_size, size=(1, length), dtype=np.int64)


def export(config: dict, directory: Path, name: str, vocab_size: int = VOCAB_SIZE) -> None:
    """Writes ``{name}.pt`` (state dict) and ``{name}.onnx`` (dynamic sequence axis ``seq``)."""
    import torch

    module = torch_bert(torch, config, vocab_size=vocab_size)
    torch.save(module.bert.state_dict(), str(directory / f"{name}.pt"))
    example = torch.from_numpy(make_input_ids(8, vocab_size))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (example,), str(directory / f"{name}.onnx"), input_names=["input_ids"],
                          output_names=["last_hidden_state"],
                          dynamic_axes={"input_ids": {1: "seq"}, "last_hidden_state": {1: "seq"}},
                          opset_version=17, dynamo=False)


def group(key: str, seq_lengths=SEQ_LENGTHS, vocab_size: int = VOCAB_SIZE) -> ModelGroup:
    config = CONFIGS[key]
    cases = tuple(Case(f"seq{n}", f"{n} tokens", n, x=n) for n in seq_lengths)
    ids = functools.cache(lambda n: make_input_ids(n, vocab_size))

    def tvm_runner(exec_mode):
        return lambda grp, ctx: TensorVMRunner(
            lambda: import_from_onnx(ctx["artifacts"] / f"{key}.onnx", shape={"input_ids": [1, None]}),
            lambda case, mod: [(ids(case.units),)], compile_twice=ctx.get("compile_twice", True),
            exec_mode=exec_mode)

    def torch_runner(grp, ctx):
        return TorchRunner(lambda torch: torch_bert(torch, config, ctx["artifacts"] / f"{key}.pt",
                                                    vocab_size=vocab_size),
                           lambda case, torch: [(torch.from_numpy(ids(case.units)),)], ctx["threads"])

    def ort_runner(grp, ctx):
        return OrtRunner(ctx["artifacts"] / f"{key}.onnx", lambda case: [{"input_ids": ids(case.units)}],
                         ctx["threads"])

    runtimes = (
        RuntimeSpec("tvm-onnx-vm", "tensorvm ONNX import · VM", TENSORVM, tvm_runner("bytecode")),
        RuntimeSpec("tvm-onnx-vm-compiled", "tensorvm ONNX import · VM compiled", TENSORVM, tvm_runner("compiled")),
        RuntimeSpec("torch", "PyTorch eager", PEER, torch_runner),
        RuntimeSpec("ort", "ONNX Runtime", PEER, ort_runner),
    )
    c = config
    return ModelGroup(
        key=key, title=(f"BERT {key.split('-')[1]} ({c['num_hidden_layers']} layers, hidden {c['hidden_size']}, "
                        f"{c['num_attention_heads']} heads), batch 1"),
        unit="token", cases=cases, runtimes=runtimes, reference="torch", atol=2e-3, rtol=2e-3,
        prepare=lambda directory: export(config, directory, key, vocab_size),
        artifact_key=f"{key}-{vocab_size}", show_per_inference=True,
        description="one executable for every sequence length (ONNX import with a dynamic sequence dim)")
