"""Real exported models: PyTorch modules (and a BERT-style encoder from ``transformers`` with random
weights) exported by ``torch.onnx.export`` with dynamic batch/sequence axes, imported once, compiled for
the VM and run at several sequence lengths; the oracle is ONNX Runtime."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import tensorvm as tv  # noqa: E402
import tensorvm.frontend  # noqa: E402, F401
from tensorvm.ir.types import SymDim  # noqa: E402

SEQ_LENGTHS = (1, 5, 11)
BATCH = 2


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(16, 32)
        self.out = torch.nn.Linear(32, 4)

    def forward(self, x):
        return torch.softmax(self.out(torch.nn.functional.gelu(self.hidden(x))), dim=-1)


class SmallCNN(torch.nn.Module):
    """Conv/BN/ReLU/pool over a 1-channel "spectrogram" whose width is the dynamic sequence axis."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.conv2 = torch.nn.Conv2d(4, 8, 3, padding=1, stride=(2, 1))
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv1(x)))
        y = torch.nn.functional.max_pool2d(torch.relu(self.conv2(y)), (2, 1))
        return self.head(y.mean(dim=(2, 3)))


class Recurrent(torch.nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(input_size=6, hidden_size=8, num_layers=2, batch_first=True, bidirectional=True)
        self.head = torch.nn.Linear(16, 2)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out)


class BertEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertModel

        config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=32)
        self.bert = BertModel(config)

    def forward(self, input_ids, attention_mask):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state, out.pooler_output


def _float_input(shape):
    return lambda rng, seq: rng.standard_normal(shape(seq)).astype("float32")


MODELS = {
    "mlp": (MLP, {"x": _float_input(lambda s: (BATCH, s, 16))}, {"x": {0: "batch", 1: "seq"}}),
    "cnn": (SmallCNN, {"x": _float_input(lambda s: (BATCH, 1, 8, s))}, {"x": {0: "batch", 3: "seq"}}),
    "lstm": (lambda: Recurrent(torch.nn.LSTM), {"x": _float_input(lambda s: (BATCH, s, 6))},
             {"x": {0: "batch", 1: "seq"}}),
    "gru": (lambda: Recurrent(torch.nn.GRU), {"x": _float_input(lambda s: (BATCH, s, 6))},
            {"x": {0: "batch", 1: "seq"}}),
    "bert": (BertEncoder, {
        "input_ids": lambda rng, seq: rng.integers(0, 50, (BATCH, seq)).astype("int64"),
        "attention_mask": lambda rng, seq: np.concatenate(
            [np.ones((BATCH, seq - seq // 3), "int64"), np.zeros((BATCH, seq // 3), "int64")], axis=1),
    }, {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def exported(request, tmp_path_factory):
    name = request.param
    if name == "bert":
        pytest.importorskip("transformers")
    factory, inputs, axes = MODELS[name]
    torch.manual_seed(0)
    model = factory().eval()
    rng = np.random.default_rng(0)
    example = tuple(torch.from_numpy(make(rng, 4)) for make in inputs.values())
    path = tmp_path_factory.mktemp("onnx") / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, example, str(path), input_names=list(inputs), dynamic_axes=axes, dynamo=False,
                          opset_version=17)
    mod, params = tv.frontend.from_onnx(str(path))
    exe = tv.vm.compile(mod, target="python", params=params)
    return name, path, mod, exe, inputs, params


def test_dynamic_axes_become_symbolic_dims(exported):
    name, _, mod, _, inputs, _ = exported
    main = mod["main"]
    assert [p.name_hint for p in main.params] == list(inputs)
    for param in main.params:
        dims = param.type_annotation.shape
        assert dims[0] == SymDim("batch")
        assert SymDim("seq") in dims


def test_matches_onnxruntime_at_several_sequence_lengths(exported):
    name, path, mod, exe, inputs, _ = exported
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    vm = tv.vm.VirtualMachine(exe)
    rng = np.random.default_rng(1)
    for seq in SEQ_LENGTHS:
        if name == "cnn" and seq < 1:
            continue
        feeds = {key: make(rng, seq) for key, make in inputs.items()}
        expected = session.run(None, feeds)
        interpreted = tv.create_executor("debug", mod).evaluate()(*feeds.values())
        first = interpreted[0] if isinstance(interpreted, tuple) else interpreted
        np.testing.assert_allclose(first.numpy(), expected[0], rtol=1e-4, atol=1e-5, err_msg="interpreter")
        out = vm.invoke("main", *feeds.values())
        outs = out if isinstance(out, tuple) else (out,)
        assert len(outs) == len(expected)
        for got, want in zip(outs, expected, strict=True):
            got = got.numpy()
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{name} at seq={seq}")


# Ops of a real model that still run on NumPy on target c because they have no compute yet.
_FALLBACK_OPS: dict = {}  # model name -> the op it still runs on NumPy (strict xfail); none left


def test_runs_natively_on_target_c(exported, request):
    """Every fused group of the imported model has a C kernel (``exe.stats()`` lists no NumPy fallback),
    and the C build agrees with ONNX Runtime."""
    name, path, mod, _, inputs, params = exported
    if name in _FALLBACK_OPS:
        request.applymarker(pytest.mark.xfail(strict=True, reason=_FALLBACK_OPS[name]))
    exe = tv.vm.compile(mod, target="c", params=params)
    feeds = {key: make(np.random.default_rng(2), 5) for key, make in inputs.items()}
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    out = tv.vm.VirtualMachine(exe).invoke("main", *feeds.values())
    for got, want in zip(out if isinstance(out, tuple) else (out,), expected, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5, err_msg=f"{name} on target c")
    assert exe.stats()["kernel_library"]["numpy_fallbacks"] == {}


def test_demo_runs_end_to_end():
    from tensorvm.demo_onnx import run

    lines = []
    run(out=lines.append)
    assert lines[0].startswith("1. ") and any("saved" in line for line in lines)
    runs = [line for line in lines if line.startswith("5. ")]
    assert len(runs) == 2 and all("max |difference|" in line for line in runs)
