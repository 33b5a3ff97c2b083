"""Converters of ONNX's fused recurrent layers (LSTM, GRU, RNN) and transformer blocks (Attention,
RotaryEmbedding)."""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedError
from .onnx_context import converter


def _or_empty(ctx, value, dtype):
    return value if value is not None else ctx.constant(np.zeros((0,), dtype))


def _rnn_attrs(activation_alpha, activation_beta, activations, clip, direction, hidden_size, layout):
    if hidden_size is None:
        raise UnsupportedError("the hidden_size attribute is required")
    return dict(hidden_size=hidden_size, direction=direction, activations=tuple(activations or ()),
                activation_alpha=tuple(activation_alpha or ()), activation_beta=tuple(activation_beta or ()),
                clip=clip, layout=layout)


def _outputs(ctx, out, count):
    return [ctx.get_item(out, i) for i in range(count)]


@converter("LSTM", 7)
def lstm_7(ctx, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
           activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
           hidden_size=None, input_forget=0, layout=0):
    dtype = ctx.dtype(X)
    out = ctx.call("nn.lstm", X, W, R, _or_empty(ctx, B, dtype), _or_empty(ctx, sequence_lens, "int32"),
                   _or_empty(ctx, initial_h, dtype), _or_empty(ctx, initial_c, dtype), _or_empty(ctx, P, dtype),
                   input_forget=bool(input_forget),
                   **_rnn_attrs(activation_alpha, activation_beta, activations, clip, direction, hidden_size, layout))
    return _outputs(ctx, out, 3)


@converter("GRU", 7)
def gru_7(ctx, X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
          activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None,
          linear_before_reset=0, layout=0):
    dtype = ctx.dtype(X)
    out = ctx.call("nn.gru", X, W, R, _or_empty(ctx, B, dtype), _or_empty(ctx, sequence_lens, "int32"),
                   _or_empty(ctx, initial_h, dtype), linear_before_reset=bool(linear_before_reset),
                   **_rnn_attrs(activation_alpha, activation_beta, activations, clip, direction, hidden_size, layout))
    return _outputs(ctx, out, 2)


@converter("RNN", 7)
def rnn_7(ctx, X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
          activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None, layout=0):
    dtype = ctx.dtype(X)
    out = ctx.call("nn.rnn", X, W, R, _or_empty(ctx, B, dtype), _or_empty(ctx, sequence_lens, "int32"),
                   _or_empty(ctx, initial_h, dtype),
                   **_rnn_attrs(activation_alpha, activation_beta, activations, clip, direction, hidden_size, layout))
    return _outputs(ctx, out, 2)


@converter("Attention", 23)
def attention_23(ctx, Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
                 is_causal=0, kv_num_heads=0, q_num_heads=0, qk_matmul_output_mode=0, scale=None, softcap=0.0,
                 softmax_precision=0, left_window_size=-1, right_window_size=-1):
    dtype = ctx.dtype(Q)
    out = ctx.call("nn.attention", Q, K, V, _or_empty(ctx, attn_mask, dtype), _or_empty(ctx, past_key, dtype),
                   _or_empty(ctx, past_value, dtype), _or_empty(ctx, nonpad_kv_seqlen, "int64"),
                   is_causal=bool(is_causal), kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
                   qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=float(softcap),
                   softmax_precision=softmax_precision, left_window_size=left_window_size,
                   right_window_size=right_window_size)
    return _outputs(ctx, out, 4)


@converter("RotaryEmbedding", 23)
def rotary_embedding_23(ctx, X, cos_cache, sin_cache, position_ids=None, *, interleaved=0, num_heads=0,
                        rotary_embedding_dim=0):
    return ctx.call("nn.rotary_embedding", X, cos_cache, sin_cache, _or_empty(ctx, position_ids, "int64"),
                    interleaved=bool(interleaved), num_heads=num_heads, rotary_embedding_dim=rotary_embedding_dim)
