"""Converters of the ops of recurrent-state language models (Mamba, Gated DeltaNet): CausalConvWithState
and LinearAttention, whose state carries from one call to the next (prefill, then decode steps).

``CausalConvWithState`` is the depthwise causal convolution over ``past_state ++ input`` (zeros without a
past): a sum of ``k`` shifted slices times the kernel's taps (static slice bounds whatever the length),
one fused elementwise kernel; ``present_state`` is the last ``k - 1`` positions.

``LinearAttention`` is a loop over the tokens (a recursive step function, as the recurrent layers of
``onnx_recurrent``): the heads unpacked and the sequence put first, each step decays the state
``(B, H_kv, d_k, d_v)`` by ``exp(g_t)`` (gated rules), corrects the value by what the state already
retrieves for ``k_t`` (delta rules), adds ``k_t v_t^T``, and reads ``scale q_t^T S`` with each group of
query heads sharing its key/value head (GQA), writing the token's row of the output in place. The
arithmetic is float32 whatever the inputs' dtype, as ONNX's reference computes it; the output has the
query's dtype and the state the past state's (the query's without one).
"""

from __future__ import annotations

import numpy as np

from ..errors import ModelImportError, TypeInferenceError
from ..ir.expr import Call, Function, Var
from ..ir.types import TensorType, TupleType
from .onnx_context import check_unrolled, converter, generalize
from .onnx_elementwise import _swish

F32 = "float32"


@converter("CausalConvWithState", 27)
def causal_conv_with_state_27(ctx, input, weight, bias=None, past_state=None, *, activation="none"):  # noqa: A002
    if activation not in ("none", "silu", "swish"):
        raise ModelImportError(f"CausalConvWithState: activation {activation!r}; expected none, silu or swish")
    if ctx.ndim(input) != 3 or ctx.ndim(weight) != 3:
        raise TypeInferenceError(f"CausalConvWithState: input and weight must be rank 3, got {ctx.shape(input)} "
                                 f"and {ctx.shape(weight)}")
    k = ctx.shape(weight)[2]
    if not isinstance(k, int) or k < 1:
        raise TypeInferenceError(f"CausalConvWithState: the kernel size (weight's last dim) must be static, got {k}")
    check_unrolled("CausalConvWithState", k, "the kernel size (a term per tap)")
    dtype = ctx.dtype(input)
    # float16 data: the taps summed in float32 and rounded once, as the reference's convolution
    wide = F32 if dtype == "float16" else dtype
    if past_state is None:
        batch, channels = ctx.shape(input)[:2]
        if all(isinstance(d, int) for d in (batch, channels)):
            past_state = ctx.constant(np.zeros((batch, channels, k - 1), dtype))
        else:
            shape = ctx.shape_vector([ctx.dim_value(input, 0), ctx.dim_value(input, 1), k - 1])
            past_state = ctx.call("dyn.zeros", shape, dtype=dtype)
    padded = ctx.call("concatenate", ctx.tuple([past_state, input]), axis=2)
    taps = ctx.call("reshape", ctx.cast(weight, wide), newshape=(-1, k))  # (C, k)
    wide_padded = ctx.cast(padded, wide)
    out = None
    for j in range(k):  # output position t reads padded[t + j] with tap j
        end = j - (k - 1)
        window = ctx.call("strided_slice", wide_padded, begin=(j,), end=(end if end < 0 else 2**62,), axes=(2,))
        tap = ctx.call("expand_dims", ctx.call("strided_slice", taps, begin=(j,), end=(j + 1,), axes=(1,)), axis=0)
        term = ctx.call("multiply", window, tap)
        out = term if out is None else ctx.call("add", out, term)
    if bias is not None:
        out = ctx.call("add", out, ctx.call("reshape", ctx.cast(bias, wide), newshape=(1, -1, 1)))
    out = ctx.cast(out, dtype)
    if activation != "none":  # (in float32, as the reference)
        out = ctx.cast(_swish(ctx, ctx.cast(out, F32), 1.0), dtype)
    present = ctx.call("strided_slice", padded, begin=(-(k - 1),), end=(2**62,), axes=(2,)) if k > 1 else \
        ctx.call("strided_slice", padded, begin=(0,), end=(0,), axes=(2,))
    return [out, present]


def _heads_first_in_time(ctx, x, heads: int, what: str):
    """(B, T, H*D) -> (T, B, H, D) in float32."""
    width = ctx.shape(x)[2]
    if not isinstance(width, int) or width % heads:
        raise TypeInferenceError(f"LinearAttention: {what}'s last dim {width} is not a static multiple of {heads} heads")
    x = ctx.call("reshape", ctx.cast(x, F32), newshape=(0, 0, heads, width // heads))
    return ctx.call("transpose", x, axes=(1, 0, 2, 3))


@converter("LinearAttention", 27)
def linear_attention_27(ctx, query, key, value, past_state=None, decay=None, beta=None, *, chunk_size=64,
                        kv_num_heads=None, q_num_heads=None, scale=0.0, update_rule="gated_delta"):
    if update_rule not in ("linear", "gated", "delta", "gated_delta"):
        raise ModelImportError(f"LinearAttention: update_rule {update_rule!r}; expected linear, gated, delta or "
                               "gated_delta")
    if q_num_heads is None or kv_num_heads is None:
        raise ModelImportError("LinearAttention: q_num_heads and kv_num_heads are required")
    if q_num_heads <= 0 or kv_num_heads <= 0 or q_num_heads % kv_num_heads:
        raise ModelImportError(f"LinearAttention: q_num_heads {q_num_heads} must be a positive multiple of "
                               f"kv_num_heads {kv_num_heads}")
    gated, delta = update_rule in ("gated", "gated_delta"), update_rule in ("delta", "gated_delta")
    for name, given, wanted in (("decay", decay, gated), ("beta", beta, delta)):
        if (given is not None) != wanted:
            raise ModelImportError(f"LinearAttention: update_rule {update_rule!r} {'needs' if wanted else 'takes no'} "
                                   f"{name} input")
    for name, x in (("query", query), ("key", key), ("value", value)):
        if ctx.ndim(x) != 3:
            raise TypeInferenceError(f"LinearAttention: {name} must be rank 3 (B, T, H*D), got {ctx.shape(x)}")
    q = _heads_first_in_time(ctx, query, q_num_heads, "query")
    k = _heads_first_in_time(ctx, key, kv_num_heads, "key")
    v = _heads_first_in_time(ctx, value, kv_num_heads, "value")
    d_k, d_v = ctx.shape(q)[3], ctx.shape(v)[3]
    if ctx.shape(k)[3] != d_k:
        raise TypeInferenceError(f"LinearAttention: key heads of {ctx.shape(k)[3]}, query heads of {d_k}")
    group = q_num_heads // kv_num_heads
    inputs = {"q": q, "k": k, "v": v}
    if gated:
        last = ctx.shape(decay)[2]
        if last not in (kv_num_heads, kv_num_heads * d_k):
            raise TypeInferenceError(f"LinearAttention: decay's last dim {last} must be kv_num_heads or "
                                     "kv_num_heads * d_k")
        inputs["g"] = ctx.call("exp", _heads_first_in_time(ctx, decay, kv_num_heads, "decay"))
    if delta:
        last = ctx.shape(beta)[2]
        if last not in (kv_num_heads, 1):
            raise TypeInferenceError(f"LinearAttention: beta's last dim {last} must be kv_num_heads or 1")
        inputs["beta"] = _heads_first_in_time(ctx, beta, last, "beta")
    state_dtype = ctx.dtype(past_state) if past_state is not None else ctx.dtype(query)
    batch = ctx.shape(query)[0]
    state_shape = (batch, kv_num_heads, d_k, d_v)
    if past_state is not None:
        state0 = ctx.cast(past_state, F32)
    elif isinstance(batch, int):
        state0 = ctx.constant(np.zeros(state_shape, F32))
    else:
        state0 = ctx.call("dyn.zeros", ctx.shape_vector([ctx.dim_value(query, 0), kv_num_heads, d_k, d_v]), dtype=F32)
    scale_value = float(scale) if scale else 1.0 / float(np.sqrt(d_k))
    tokens = ctx.dim_value(q, 0)
    rows = ctx.call("dyn.zeros", ctx.shape_vector([tokens, ctx.dim_value(q, 1), q_num_heads, d_v]), dtype=F32)
    state, out = _token_loop(ctx, inputs, state0, rows, tokens, group, scale_value)
    out = ctx.call("reshape", ctx.call("transpose", out, axes=(1, 0, 2, 3)), newshape=(0, 0, q_num_heads * d_v))
    return [ctx.cast(out, ctx.dtype(query)), ctx.cast(state, state_dtype)]


def _token_loop(ctx, inputs: dict, state0, rows0, tokens, group: int, scale: float):
    """The recurrence over the tokens as a recursive step function: (final state, output rows)."""
    importer = ctx.importer
    gv = importer.fresh_global("linear_attention")
    scalar_i64 = TensorType((), "int64")
    t, length = Var("t", scalar_i64), Var("length", scalar_i64)
    state_type = generalize(ctx.type_of(state0))
    rows_type = generalize(ctx.type_of(rows0))
    state, rows = Var("state", state_type), Var("rows", rows_type)
    params = {name: Var(name, generalize(ctx.type_of(x))) for name, x in inputs.items()}
    ret_type = TupleType((state_type, rows_type))

    def at(name):  # the token's slice (t < length here: "clip" never moves it)
        return ctx.call("take", params[name], t, axis=0, mode="clip")

    k_t, v_t = at("k"), at("v")
    s = state
    if "g" in params:  # S *= exp(g_t), over d_v
        s = ctx.call("multiply", s, ctx.call("expand_dims", at("g"), axis=-1))
    if "beta" in params:  # v_t <- beta_t (v_t - S^T k_t)
        retrieved = ctx.call("sum", ctx.call("multiply", s, ctx.call("expand_dims", k_t, axis=-1)), axis=(2,))
        v_t = ctx.call("multiply", at("beta"), ctx.call("subtract", v_t, retrieved))
    s = ctx.call("add", s, ctx.call("multiply", ctx.call("expand_dims", k_t, axis=-1),
                                    ctx.call("expand_dims", v_t, axis=-2)))
    # read: query head h uses key/value head h // group
    q_t = ctx.call("reshape", at("q"), newshape=(0, -1, group, ctx.shape(params["q"])[3]))  # (B, H_kv, group, d_k)
    read = ctx.call("sum", ctx.call("multiply", ctx.call("expand_dims", q_t, axis=-1),
                                    ctx.call("expand_dims", s, axis=2)), axis=(3,))  # (B, H_kv, group, d_v)
    read = ctx.call("multiply", ctx.call("reshape", read, newshape=(0, -1, ctx.shape(s)[3])),
                    ctx.constant(np.array(scale, np.float32)))
    new_rows = ctx.call("scatter_nd", rows, ctx.call("expand_dims", t, axis=0), read)
    next_t = ctx.call("add", t, ctx.constant(np.array(1, np.int64)))
    names = list(params)
    recurse = Call(gv, (next_t, length, s, new_rows) + tuple(params[n] for n in names))
    recurse.with_type(ret_type)
    body = ctx.if_(ctx.call("less", t, length), recurse, ctx.tuple([state, rows]))
    importer.globals[gv] = Function((t, length, state, rows) + tuple(params[n] for n in names), body, ret_type)
    call = Call(gv, (ctx.constant(np.array(0, np.int64)), tokens, state0, rows0) + tuple(inputs[n] for n in names))
    call.with_type(ret_type)
    return ctx.get_item(call, 0), ctx.get_item(call, 1)

