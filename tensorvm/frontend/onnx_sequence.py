"""Converters of ONNX's fused recurrent layers (LSTM, GRU, RNN) and transformer blocks (Attention,
RotaryEmbedding).

LSTM, GRU and RNN become IR loops with the input projection hoisted out (``onnx_recurrent``); they
stay one opaque op (``nn.lstm`` / ``nn.gru`` / ``nn.rnn``; on target c a C library call) only when the
number of directions (``W``'s first dim) or the hidden size is not known at import time.
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedError
from .onnx_context import converter
from .onnx_recurrent import convert_recurrent


def _or_empty(ctx, value, dtype):
    return value if value is not None else ctx.constant(np.zeros((0,), dtype))


def _rnn_attrs(activation_alpha, activation_beta, activations, clip, direction, hidden_size, layout):
    if hidden_size is None:
        raise UnsupportedError("the hidden_size attribute is required")
    return dict(hidden_size=hidden_size, direction=direction, activations=tuple(activations or ()),
                activation_alpha=tuple(activation_alpha or ()), activation_beta=tuple(activation_beta or ()),
                clip=clip, layout=layout)


def _hidden(ctx, hidden_size, R):
    """``hidden_size``, or R's last dim when the attribute is omitted."""
    if hidden_size is None and ctx.ndim(R) == 3 and isinstance(ctx.shape(R)[2], int):
        return ctx.shape(R)[2]
    return hidden_size


def _outputs(ctx, out, count):
    return [ctx.get_item(out, i) for i in range(count)]


def _recurrent(ctx, kind, opaque, inputs, attrs):
    """The layer as an IR loop (``onnx_recurrent``), or the opaque op where the loop cannot be built.

    ``opaque()`` builds the opaque call; it also stands in for an output ``Y`` that the model does not
    read (an unreachable expression, so it never reaches the module)."""
    outs = convert_recurrent(ctx, kind, *inputs, **attrs)
    if outs is None:
        return _outputs(ctx, opaque(), _OUTPUT_COUNTS[kind])
    if outs[0] is None:
        outs[0] = ctx.get_item(opaque(), 0)
    return outs


_OUTPUT_COUNTS = {"lstm": 3, "gru": 2, "rnn": 2}


@converter("LSTM", 7)
def lstm_7(ctx, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
           activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
           hidden_size=None, input_forget=0, layout=0):
    def opaque():
        dtype = ctx.dtype(X)
        return ctx.call("nn.lstm", X, W, R, _or_empty(ctx, B, dtype), _or_empty(ctx, sequence_lens, "int32"),
                        _or_empty(ctx, initial_h, dtype), _or_empty(ctx, initial_c, dtype), _or_empty(ctx, P, dtype),
                        input_forget=bool(input_forget),
                        **_rnn_attrs(activation_alpha, activation_beta, activations, clip, direction,
                                     _hidden(ctx, hidden_size, R), layout))

    return _recurrent(ctx, "lstm", opaque, (X, W, R, B, sequence_lens, initial_h, initial_c, P), dict(
        hidden_size=hidden_size, direction=direction, activations=activations, activation_alpha=activation_alpha,
        activation_beta=activation_beta, clip=clip, layout=layout, input_forget=input_forget))


@converter("GRU", 7)
def gru_7(ctx, X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
          activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None,
          linear_before_reset=0, layout=0):
    def opaque():
        dtype = ctx.dtype(X)
        return ctx.call("nn.gru", X, W, R, _or_empty(ctx, B, dtype), _or_empty(ctx, sequence_lens, "int32"),
                        _or_empty(ctx, initial_h, dtype), linear_before_reset=bool(linear_before_reset),
                        **_rnn_attrs(activation_alpha, activation_beta, activations, clip, direction,
                                     _hidden(ctx, hidden_size, R), layout))

    return _recurrent(ctx, "gru", opaque, (X, W, R, B, sequence_lens, initial_h), dict(
        hidden_size=hidden_size, direction=direction, activations=activations, activation_alpha=activation_alpha,
        activation_beta=activation_beta, clip=clip, layout=layout, linear_before_reset=linear_before_reset))


@converter("RNN", 7)
def rnn_7(ctx, X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
          activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None, layout=0):
    def opaque():
        dtype = ctx.dtype(X)
        return ctx.call("nn.rnn", X, W, R, _or_empty(ctx, B, dtype), _or_empty(ctx, sequence_lens, "int32"),
                        _or_empty(ctx, initial_h, dtype),
                        **_rnn_attrs(activation_alpha, activation_beta, activations, clip, direction,
                                     _hidden(ctx, hidden_size, R), layout))

    return _recurrent(ctx, "rnn", opaque, (X, W, R, B, sequence_lens, initial_h), dict(
        hidden_size=hidden_size, direction=direction, activations=activations, activation_alpha=activation_alpha,
        activation_beta=activation_beta, clip=clip, layout=layout))


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
