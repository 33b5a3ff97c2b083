"""CausalConvWithState and LinearAttention (``frontend/onnx_state.py``) as a recurrent-state model runs
them: one executable with a run-time batch and length, a prefill then decode steps fed the state the
call before returned, against ONNX's reference evaluator doing the same (bytecode and native)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnx_cases import onnx_model, tensorvm_runs

import tensorvm as tv
from tensorvm.errors import ModelImportError

VI = helper.make_tensor_value_info
F = TensorProto.FLOAT
rng = np.random.default_rng(0)


def _prefill_then_decode(model, first: dict, steps: list, state_names: dict):
    """Run ``first`` then each of ``steps`` (feeds without the state), each fed the state outputs
    (``state_names``: output -> input) of the call before, on the reference and on tensorvm."""
    reference = ReferenceEvaluator(model)
    outputs = [o.name for o in model.graph.output]
    for mode, run in tensorvm_runs(model):
        want_state, got_state = {}, {}
        for feeds in [first, *steps]:
            want = reference.run(None, {**feeds, **want_state})
            given = {**feeds, **got_state}  # (tensorvm is fed its own state, not the reference's)
            got = run(*[given[i.name] for i in model.graph.input])
            for name, g, w in zip(outputs, got, want, strict=True):
                assert g.shape == w.shape and g.dtype == w.dtype, (mode, name)
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{mode} {name}")
            want_state = {state_names[n]: w for n, w in zip(outputs, want, strict=True) if n in state_names}
            got_state = {state_names[n]: g for n, g in zip(outputs, got, strict=True) if n in state_names}


@pytest.mark.parametrize("activation, k, bias", [("none", 4, True), ("silu", 3, False), ("swish", 1, True)])
def test_causal_conv_prefill_then_decode(activation, k, bias):
    inputs = ["x", "w", "b" if bias else "", "past"]
    model = onnx_model([helper.make_node("CausalConvWithState", inputs, ["y", "present"], activation=activation)],
                       [VI("x", F, ["B", 6, "T"]), VI("past", F, ["B", 6, k - 1])],
                       [VI("y", F, ["B", 6, "T"]), VI("present", F, ["B", 6, k - 1])],
                       inits=[helper.make_tensor("w", F, [6, 1, k], rng.standard_normal(6 * k).astype(np.float32))]
                       + ([helper.make_tensor("b", F, [6], rng.standard_normal(6).astype(np.float32))] if bias else []),
                       opset=27, ir_version=13)
    batch = 2
    first = {"x": rng.standard_normal((batch, 6, 5)).astype(np.float32),
             "past": np.zeros((batch, 6, k - 1), np.float32)}
    steps = [{"x": rng.standard_normal((batch, 6, t)).astype(np.float32)} for t in (1, 1, 3)]
    _prefill_then_decode(model, first, steps, {"present": "past"})


@pytest.mark.parametrize("rule, q_heads, kv_heads, per_key_decay", [
    ("linear", 2, 2, False), ("gated", 4, 2, True), ("delta", 2, 1, False), ("gated_delta", 4, 2, False),
    ("gated_delta", 3, 3, True)])
def test_linear_attention_prefill_then_decode(rule, q_heads, kv_heads, per_key_decay):
    d_k, d_v = 4, 3
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    inputs = ["q", "k", "v", "past", "g" if gated else "", "beta" if delta else ""]
    while inputs[-1] == "":
        inputs.pop()
    decay_width = kv_heads * d_k if per_key_decay else kv_heads
    graph_inputs = [VI("q", F, ["B", "T", q_heads * d_k]), VI("k", F, ["B", "T", kv_heads * d_k]),
                    VI("v", F, ["B", "T", kv_heads * d_v]), VI("past", F, ["B", kv_heads, d_k, d_v])]
    graph_inputs += [VI("g", F, ["B", "T", decay_width])] if gated else []
    graph_inputs += [VI("beta", F, ["B", "T", kv_heads])] if delta else []
    model = onnx_model([helper.make_node("LinearAttention", inputs, ["y", "present"], update_rule=rule,
                                         q_num_heads=q_heads, kv_num_heads=kv_heads)], graph_inputs,
                       [VI("y", F, ["B", "T", q_heads * d_v]), VI("present", F, ["B", kv_heads, d_k, d_v])],
                       opset=27, ir_version=13)

    def feeds(batch, tokens):
        out = {"q": rng.standard_normal((batch, tokens, q_heads * d_k)).astype(np.float32),
               "k": rng.standard_normal((batch, tokens, kv_heads * d_k)).astype(np.float32) / 2,
               "v": rng.standard_normal((batch, tokens, kv_heads * d_v)).astype(np.float32)}
        if gated:
            out["g"] = -rng.uniform(0.05, 0.5, (batch, tokens, decay_width)).astype(np.float32)
        if delta:
            out["beta"] = rng.uniform(0.1, 0.9, (batch, tokens, kv_heads)).astype(np.float32)
        return out

    first = {**feeds(2, 5), "past": np.zeros((2, kv_heads, d_k, d_v), np.float32)}
    steps = [feeds(2, t) for t in (1, 1, 2)]
    _prefill_then_decode(model, first, steps, {"present": "past"})


def test_linear_attention_refuses_mismatched_rules_and_heads():
    def model(rule, inputs, q_heads=2, kv_heads=2):
        graph_inputs = [VI(n, F, [1, 2, 8]) for n in inputs if n]
        return onnx_model([helper.make_node("LinearAttention", inputs, ["y", "s"], update_rule=rule,
                                            q_num_heads=q_heads, kv_num_heads=kv_heads)], graph_inputs,
                          [VI("y", F, [1, 2, 8]), VI("s", F, [1, 2, 4, 4])], opset=27, ir_version=13)
    with pytest.raises(ModelImportError, match="needs decay"):
        tv.frontend.from_onnx(model("gated", ["q", "k", "v"]))
    with pytest.raises(ModelImportError, match="takes no beta"):
        tv.frontend.from_onnx(model("linear", ["q", "k", "v", "", "", "beta"]))
    with pytest.raises(ModelImportError, match="positive multiple"):
        tv.frontend.from_onnx(model("linear", ["q", "k", "v"], q_heads=3, kv_heads=2))
