"""The corpus's sequence models: GPT-2 (transformers ``GPT2LMHeadModel``, 2 layers, hidden 128) on a whole
prompt and as one decode step with a KV cache, a bidirectional 2-layer ``nn.GRU``, and the DistilBERT,
RoBERTa and T5 encoders from small transformers configs with a padding mask. Random weights, eager
attention; batch and sequence axes dynamic."""

from __future__ import annotations

from .common import Case
from .corpus import OnnxModel, onnx_group, padding_mask, rng, token_ids

GPT2 = {"n_layer": 2, "n_embd": 128, "n_head": 2, "n_positions": 1024, "vocab_size": 50257}


def _gpt2_model(torch):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(attn_implementation="eager", **GPT2)
    return GPT2LMHeadModel(config)


def _gpt2_prompt(torch):
    class Prompt(torch.nn.Module):
        """The logits of every position of a prompt, no cache."""

        def __init__(self):
            super().__init__()
            self.model = _gpt2_model(torch)

        def forward(self, input_ids):
            # (an explicit all-ones mask: without one, transformers traces a packed-sequence check
            # through aten::diff, which has no ONNX export)
            return self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False).logits

    return Prompt()


def _gpt2_decode(torch):
    from transformers import DynamicCache

    class Decode(torch.nn.Module):
        """One decode step: a new token per sequence and the cached keys/values of every layer;
        returns its logits and the grown cache."""

        def __init__(self):
            super().__init__()
            self.model = _gpt2_model(torch)

        def forward(self, input_ids, *past):
            pairs = [(past[2 * i], past[2 * i + 1]) for i in range(len(past) // 2)]
            cache = DynamicCache(pairs, config=self.model.config)
            out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True)
            present = []
            for layer in out.past_key_values.layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    return Decode()


PAST_NAMES = tuple(f"past_{kind}_{i}" for i in range(GPT2["n_layer"]) for kind in ("key", "value"))
PRESENT_NAMES = tuple(name.replace("past", "present") for name in PAST_NAMES)
HEAD_DIM = GPT2["n_embd"] // GPT2["n_head"]


def _decode_feeds(case):
    batch, past = case.x
    feeds = {"input_ids": token_ids("gpt2-step", batch, 1, GPT2["vocab_size"])}
    generator = rng("gpt2-past", batch, past)
    for name in PAST_NAMES:
        feeds[name] = generator.standard_normal((batch, GPT2["n_head"], past, HEAD_DIM)).astype("float32")
    return feeds


GPT2_PROMPT = OnnxModel(
    key="gpt2", title="GPT-2 (2 layers, hidden 128, LM head), no cache", build=_gpt2_prompt,
    inputs=("input_ids",), outputs=("logits",),
    dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}},
    tvm_shape={"input_ids": [None, None]},
    cases=(Case("b1s8", "batch 1, 8 tokens", 8), Case("b1s64", "batch 1, 64 tokens", 64),
           Case("b4s32", "batch 4, 32 tokens", 128)),
    feeds=lambda case: {"input_ids": token_ids("gpt2", *_batch_seq(case), GPT2["vocab_size"])},
    unit="token", atol=1e-3, rtol=1e-3)
GPT2_DECODE = OnnxModel(
    key="gpt2-decode", title="GPT-2 (2 layers, hidden 128, LM head), decode step with KV cache",
    build=_gpt2_decode, inputs=("input_ids", *PAST_NAMES), outputs=("logits", *PRESENT_NAMES),
    dynamic_axes={"input_ids": {0: "batch"}, "logits": {0: "batch"},
                  **{n: {0: "batch", 2: "past"} for n in PAST_NAMES},
                  **{n: {0: "batch", 2: "total"} for n in PRESENT_NAMES}},
    tvm_shape={"input_ids": [None, 1], **{n: [None, GPT2["n_head"], None, HEAD_DIM] for n in PAST_NAMES}},
    cases=(Case("b1p16", "batch 1, 16 cached", 1, x=(1, 16)), Case("b1p128", "batch 1, 128 cached", 1, x=(1, 128)),
           Case("b2p64", "batch 2, 64 cached", 2, x=(2, 64))),
    feeds=_decode_feeds, example="b1p128", unit="token", atol=1e-3, rtol=1e-3, exec_modes=("bytecode", "native"),
    description="one new token per sequence, the past keys/values of both layers as inputs")


def _batch_seq(case) -> tuple[int, int]:
    batch, seq = case.name[1:].split("s")
    return int(batch), int(seq)


GRU_INPUT, GRU_HIDDEN = 64, 128


def _gru(torch):
    class BiGRU(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = torch.nn.GRU(GRU_INPUT, GRU_HIDDEN, num_layers=2, bidirectional=True, batch_first=True)

        def forward(self, x):
            return self.gru(x)

    return BiGRU()


GRU = OnnxModel(
    key="gru", title=f"bidirectional 2-layer GRU (input {GRU_INPUT}, hidden {GRU_HIDDEN})", build=_gru,
    inputs=("x",), outputs=("output", "h_n"),
    dynamic_axes={"x": {0: "batch", 1: "seq"}, "output": {0: "batch", 1: "seq"}, "h_n": {1: "batch"}},
    tvm_shape={"x": [None, None, GRU_INPUT]},
    cases=(Case("b3s40", "batch 3, 40 steps", 120), Case("b2s200", "batch 2, 200 steps", 400)),
    feeds=lambda case: {"x": rng("gru", *_batch_seq(case)).standard_normal(
        (*_batch_seq(case), GRU_INPUT)).astype("float32")},
    unit="token", atol=1e-4, rtol=1e-3, description="torch nn.GRU (batch first) exported as ONNX GRU nodes",
    exec_modes=("bytecode", "native"))

ENCODERS = {
    "distilbert": ("DistilBERT (4 layers, hidden 256)", "DistilBertConfig", "DistilBertModel", 30522,
                   {"n_layers": 4, "dim": 256, "n_heads": 4, "hidden_dim": 1024}),
    "roberta": ("RoBERTa (4 layers, hidden 256)", "RobertaConfig", "RobertaModel", 50265,
                {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024}),
    "t5-encoder": ("T5 encoder (4 layers, d_model 256)", "T5Config", "T5EncoderModel", 32128,
                   {"num_layers": 4, "d_model": 256, "d_kv": 64, "num_heads": 4, "d_ff": 1024}),
}


def _encoder(key):
    title, config_name, model_name, vocab, config = ENCODERS[key]

    def build(torch):
        import transformers

        cfg = getattr(transformers, config_name)(vocab_size=vocab, attn_implementation="eager", **config)
        kwargs = {"add_pooling_layer": False} if model_name == "RobertaModel" else {}
        model = getattr(transformers, model_name)(cfg, **kwargs)

        class Encoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, input_ids, attention_mask):
                return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

        return Encoder()

    # RoBERTa's ids 0-2 are special (1 is padding: its position ids skip it); draw from 3 up
    low = 3 if key == "roberta" else 0
    return OnnxModel(
        key=key, title=title, build=build, inputs=("input_ids", "attention_mask"), outputs=("last_hidden_state",),
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                      "last_hidden_state": {0: "batch", 1: "seq"}},
        tvm_shape={"input_ids": [None, None], "attention_mask": [None, None]},
        cases=(Case("b1s16", "batch 1, 16 tokens", 16), Case("b1s128", "batch 1, 128 tokens", 128),
               Case("b4s64", "batch 4, 64 tokens (padded)", 256)),
        feeds=lambda case: {"input_ids": token_ids(key, *_batch_seq(case), vocab - low) + low,
                            "attention_mask": padding_mask(*_batch_seq(case))},
        example="b4s64", unit="token", atol=2e-3, rtol=2e-3,
        description="input ids and a padding mask (batch 4: rows padded by 0, 3, 6, 9 tokens), both axes dynamic")


def groups(quick: bool = False) -> list:
    models = [GPT2_PROMPT, GPT2_DECODE, GRU] + [_encoder(k) for k in ENCODERS]
    if quick:
        return [onnx_group(m, quick, m.cases[:2] if m is GRU else m.cases[:1]) for m in models]
    return [onnx_group(m) for m in models]
