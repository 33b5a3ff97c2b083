"""FuseOps: grouping by op pattern, checked structurally and by running both versions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lowered_eval import assert_same, interpret, parse

import tensorvm as tv
from tensorvm.ir.expr import Call, Function, Op
from tensorvm.op import get_op
from tensorvm.op.registry import OpPattern
from tensorvm.transform.fuse_ops import FuseOps
from tensorvm.transform.infer_type import InferType
from tensorvm.transform.to_anf import post_order_iter


def fuse(mod, **kwargs):
    return FuseOps(**kwargs)(InferType()(mod))


def primitives(mod, name="main") -> list[Function]:
    """The primitive functions called in a global, in dataflow order of their calls."""
    return [n.op for n in post_order_iter(mod[name].body)
            if isinstance(n, Call) and isinstance(n.op, Function) and n.op.is_primitive]


def op_names(prim: Function) -> list[str]:
    return [n.op.name for n in post_order_iter(prim.body) if isinstance(n, Call) and isinstance(n.op, Op)]


def groups(mod, name="main") -> list[list[str]]:
    return [op_names(p) for p in primitives(mod, name)]


def check_same_result(before, after, *args):
    assert_same(interpret(after, *args), interpret(before, *args))


def test_dense_bias_tanh_becomes_one_primitive():
    before = parse("""
def @main(%x: Tensor[(4, 8), float32], %w: Tensor[(16, 8), float32], %b: Tensor[(16), float32]) {
  tanh(add(nn.dense(%x, %w), %b))
}""")
    after = fuse(before)
    expected = parse("""
def @main(%x: Tensor[(4, 8), float32], %w: Tensor[(16, 8), float32], %b: Tensor[(16), float32]) {
  %2 = fn (%p0: Tensor[(4, 8), float32], %p1: Tensor[(16, 8), float32], %p2: Tensor[(16), float32],
           Primitive=1) -> Tensor[(4, 16), float32] {
    %0 = nn.dense(%p0, %p1);
    %1 = add(%0, %p2);
    tanh(%1)
  };
  %2(%x, %w, %b)
}""")
    tv.assert_structural_equal(after["main"], expected["main"])
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype("float32") for s in [(4, 8), (16, 8), (16,)]]
    check_same_result(before, after, *args)
    np.testing.assert_allclose(interpret(after, *args), np.tanh(args[0] @ args[1].T + args[2]), rtol=1e-5)


def test_elementwise_diamond_fuses_through_its_post_dominator():
    before = parse("""
def @main(%x: Tensor[(?, 3), float32]) {
  %0 = exp(%x);
  %1 = add(%0, 1f);
  %2 = multiply(%0, 2f);
  subtract(%1, %2)
}""")
    after = fuse(before)
    (group,) = groups(after)
    assert sorted(group) == ["add", "exp", "multiply", "subtract"]
    x = np.linspace(-1, 1, 6, dtype="float32").reshape(2, 3)
    check_same_result(before, after, x)


def test_value_escaping_into_a_tuple_is_a_group_output():
    before = parse("""
def @main(%x: Tensor[(2, 3), float32], %y: Tensor[(2, 3), float32]) {
  %0 = add(%x, %y);
  (%0, exp(%0))
}""")
    after = fuse(before)
    assert sorted(groups(after)) == [["add"], ["exp"]]
    x, y = np.ones((2, 3), "float32"), np.full((2, 3), 2, "float32")
    check_same_result(before, after, x, y)


def test_two_complex_ops_never_share_a_group():
    before = parse("""
def @main(%x: Tensor[(2, 1, 6, 6), float32], %w: Tensor[(3, 1, 3, 3), float32], %b: Tensor[(3), float32],
          %w2: Tensor[(4, 3, 3, 3), float32]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1]);
  %1 = nn.bias_add(%0, %b);
  %2 = nn.relu(%1);
  nn.conv2d(%2, %w2)
}""")
    after = fuse(before)
    assert groups(after) == [["nn.conv2d", "nn.bias_add", "nn.relu"], ["nn.conv2d"]]
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s).astype("float32") for s in [(2, 1, 6, 6), (3, 1, 3, 3), (3,), (4, 3, 3, 3)]]
    check_same_result(before, after, *args)


_CONV_POOL = """
def @main(%x: Tensor[(1, 2, 8, 10), DTYPE], %w: Tensor[(3, 2, KH, KW), DTYPE], %b: Tensor[(3), DTYPE]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1], CONV);
  %1 = nn.relu(nn.bias_add(%0, %b));
  POOL(%1, POOL_ATTRS)
}"""


def _conv_pool(dtype="float32", kernel=(3, 3), conv="strides=[1, 1]", pool="nn.max_pool2d",
               pool_attrs="pool_size=[2, 2], strides=[2, 2]"):
    text = _CONV_POOL.replace("DTYPE", dtype).replace("KH", str(kernel[0])).replace("KW", str(kernel[1]))
    return parse(text.replace("CONV", conv).replace("POOL_ATTRS", pool_attrs).replace("POOL", pool))


def _conv_pool_args(mod, seed=2):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal([int(d) for d in p.type_annotation.shape]).astype(p.type_annotation.dtype)
            for p in mod["main"].params]


def test_a_2x2_max_pool_joins_the_convolution_group_it_follows():
    """The direct convolution kernel pools its tiles, so the pool is not a kernel of its own."""
    before = _conv_pool()
    after = fuse(before)
    assert groups(after) == [["nn.conv2d", "nn.bias_add", "nn.relu", "nn.max_pool2d"]]
    check_same_result(before, after, *_conv_pool_args(before))
    # right after the convolution too, with no epilogue in between
    direct = parse("""
def @main(%x: Tensor[(1, 2, 8, 8), float32], %w: Tensor[(3, 2, 3, 3), float32]) {
  nn.max_pool2d(nn.conv2d(%x, %w), pool_size=[2, 2], strides=[2, 2])
}""")
    assert groups(fuse(direct)) == [["nn.conv2d", "nn.max_pool2d"]]


@pytest.mark.parametrize("case", [
    dict(pool_attrs="pool_size=[3, 3], strides=[2, 2]"),
    dict(pool_attrs="pool_size=[2, 2], strides=[1, 1]"),
    dict(pool_attrs="pool_size=[2, 2], strides=[2, 2], padding=[1, 1]"),
    dict(pool_attrs="pool_size=[2, 2], strides=[2, 2], ceil_mode=True"),
    dict(pool="nn.avg_pool2d"),
    dict(conv="strides=[2, 2]"),
    dict(conv="dilation=[2, 2]"),
    dict(kernel=(1, 1)),
    dict(dtype="float64"),
], ids=["3x3-pool", "stride-1-pool", "padded-pool", "ceil-mode", "avg-pool", "strided-conv", "dilated-conv",
        "1x1-conv", "float64"])
def test_other_pools_and_convolutions_keep_the_pool_apart(case):
    before = _conv_pool(**case)
    after = fuse(before)
    pool = case.get("pool", "nn.max_pool2d")
    assert groups(after) == [["nn.conv2d", "nn.bias_add", "nn.relu"], [pool]]
    check_same_result(before, after, *_conv_pool_args(before))


def test_a_pool_does_not_join_when_the_unpooled_map_is_used_elsewhere():
    before = parse("""
def @main(%x: Tensor[(1, 2, 8, 8), float32], %w: Tensor[(3, 2, 3, 3), float32]) {
  %0 = nn.relu(nn.conv2d(%x, %w, padding=[1, 1]));
  (nn.max_pool2d(%0, pool_size=[2, 2], strides=[2, 2]), %0)
}""")
    after = fuse(before)
    assert groups(after) == [["nn.conv2d", "nn.relu"], ["nn.max_pool2d"]]
    check_same_result(before, after, *_conv_pool_args(before))


_ATTENTION = """
def @main(%q: Tensor[(1, ?, 4, 8), DTYPE], %k: Tensor[(1, ?, 4, 8), DTYPE], %v: Tensor[(1, ?, 4, 8), DTYPE]) {
  %0 = onnx.matmul(transpose(%q, axes=[0, 2, 1, 3]), transpose(%k, axes=K_AXES));
  %1 = nn.softmax(multiply(%0, 0.5f), axis=-1);
  transpose(onnx.matmul(%1, transpose(%v, axes=[0, 2, 1, 3])), axes=OUT_AXES)
}"""


def _attention(dtype="float32", k_axes="[0, 2, 3, 1]", out_axes="[0, 2, 1, 3]"):
    return parse(_ATTENTION.replace("DTYPE", dtype).replace("K_AXES", k_axes).replace("OUT_AXES", out_axes)
                 .replace("0.5f", {"float32": "0.5f", "float16": "0.5f16", "float64": "0.5f64"}[dtype]))


def _attention_args(seq=5, dtype="float32"):
    rng = np.random.default_rng(seq)
    return [rng.standard_normal((1, seq, 4, 8)).astype(dtype) for _ in range(3)]


def test_transposes_around_a_batched_product_join_its_group():
    """A product reads a transposed operand, and writes a transposed result, in place (strided BLAS)."""
    before = _attention()
    after = fuse(before)
    assert groups(after) == [["transpose", "transpose", "onnx.matmul", "multiply"], ["nn.softmax"],
                             ["transpose", "onnx.matmul", "transpose"]]
    check_same_result(before, after, *_attention_args())
    # nn.batch_matmul, and a static reshape before the transpose
    bmm = parse("""
def @main(%x: Tensor[(3, 4, 8), float32], %y: Tensor[(12, 8), float32]) {
  nn.batch_matmul(%x, transpose(reshape(%y, newshape=[3, 4, 8]), axes=[0, 2, 1]), transpose_b=False)
}""")
    fused = fuse(bmm)
    assert groups(fused) == [["reshape", "transpose", "nn.batch_matmul"]]
    rng = np.random.default_rng(3)
    check_same_result(bmm, fused, rng.standard_normal((3, 4, 8)).astype("float32"),
                      rng.standard_normal((12, 8)).astype("float32"))


@pytest.mark.parametrize("case, expected", [
    # the result's last axis moved: its rows would need a column stride
    (dict(out_axes="[0, 1, 3, 2]"), [["transpose", "transpose", "onnx.matmul", "multiply"], ["nn.softmax"],
                                     ["transpose", "onnx.matmul"], ["transpose"]]),
    # no BLAS product for this dtype
    (dict(dtype="float16"), [["transpose"], ["transpose"], ["onnx.matmul", "multiply"], ["nn.softmax"],
                             ["transpose"], ["onnx.matmul"], ["transpose"]]),
], ids=["result-rows-strided", "float16"])
def test_transposes_a_product_cannot_read_in_place_stay_apart(case, expected):
    before = _attention(**case)
    after = fuse(before)
    assert groups(after) == expected
    args = _attention_args(dtype=case.get("dtype", "float32"))
    check_same_result(before, after, *args)


def test_a_transpose_moving_the_last_axis_to_the_batch_stays_apart():
    """Its matrices would have no unit stride, which BLAS needs."""
    before = parse("""
def @main(%x: Tensor[(4, 4, 4), float32], %y: Tensor[(4, 4, 4), float32]) {
  nn.batch_matmul(%x, transpose(%y, axes=[2, 0, 1]), transpose_b=False)
}""")
    after = fuse(before)
    assert groups(after) == [["transpose"], ["nn.batch_matmul"]]
    rng = np.random.default_rng(5)
    check_same_result(before, after, *(rng.standard_normal((4, 4, 4)).astype("float32") for _ in range(2)))


def test_a_transpose_with_another_use_or_a_computed_input_stays_apart():
    before = parse("""
def @main(%x: Tensor[(2, 4, 8), float32], %y: Tensor[(2, 8, 4), float32]) {
  %0 = transpose(%y, axes=[0, 2, 1]);
  %1 = transpose(exp(%y), axes=[0, 2, 1]);
  (nn.batch_matmul(%x, %0, transpose_b=True), nn.batch_matmul(%x, %1, transpose_b=True), %0)
}""")
    after = fuse(before)
    assert groups(after) == [["transpose"], ["nn.batch_matmul"], ["exp", "transpose"], ["nn.batch_matmul"]]
    rng = np.random.default_rng(4)
    check_same_result(before, after, rng.standard_normal((2, 4, 8)).astype("float32"),
                      rng.standard_normal((2, 8, 4)).astype("float32"))


def test_reduction_takes_elementwise_prologue_and_epilogue_but_not_a_second_reduction():
    before = parse("""
def @main(%x: Tensor[(?, 4), float32]) {
  %0 = exp(%x);
  %1 = sum(%0, axis=[1]);
  %2 = sqrt(%1);
  sum(%2)
}""")
    after = fuse(before)
    assert groups(after) == [["exp", "sum", "sqrt"], ["sum"]]
    x = np.arange(8, dtype="float32").reshape(2, 4) / 8
    check_same_result(before, after, x)


def test_injective_ops_fuse_into_each_other_and_into_a_reduction():
    before = parse("""
def @main(%x: Tensor[(2, 3, 4), float32]) {
  %0 = transpose(%x, axes=[0, 2, 1]);
  %1 = reshape(%0, newshape=[8, 3]);
  max(%1, axis=[0])
}""")
    after = fuse(before)
    assert groups(after) == [["transpose", "reshape", "max"]]
    check_same_result(before, after, np.arange(24, dtype="float32").reshape(2, 3, 4))


def test_layer_norm_with_elementwise_follows_its_registered_pattern():
    before = parse("""
def @main(%x: Tensor[(?, 6), float32], %g: Tensor[(6), float32], %b: Tensor[(6), float32]) {
  %0 = add(%x, %x);
  %1 = nn.layer_norm(%0, %g, %b);
  %2 = multiply(%1, 2f);
  tanh(%2)
}""")
    after = fuse(before)
    if get_op("nn.layer_norm").pattern == OpPattern.OUT_ELEMWISE_FUSABLE:
        assert groups(after) == [["add"], ["nn.layer_norm", "multiply", "tanh"]]
    else:  # an opaque layer_norm stands alone; the elementwise epilogue still fuses
        assert get_op("nn.layer_norm").pattern == OpPattern.OPAQUE
        assert groups(after) == [["add"], ["nn.layer_norm"], ["multiply", "tanh"]]
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(s).astype("float32") for s in [(3, 6), (6,), (6,)]]
    check_same_result(before, after, *args)


def test_reshape_only_groups_are_marked():
    before = parse("""
def @main(%x: Tensor[(2, 3, 4), float32]) {
  %0 = reshape(%x, newshape=[6, 4]);
  %1 = expand_dims(%0, axis=0);
  %2 = squeeze(%1, axis=[0]);
  %3 = add(%2, 1f);
  (%2, %3)
}""")
    after = fuse(before)
    prims = primitives(after)
    marked = [op_names(p) for p in prims if p.attrs.get("reshape_only")]
    assert marked == [["reshape", "expand_dims", "squeeze"]]
    assert [op_names(p) for p in prims if not p.attrs.get("reshape_only")] == [["add"]]
    check_same_result(before, after, np.arange(24, dtype="float32").reshape(2, 3, 4))


def test_dynamic_data_dependent_ops_stand_alone():
    before = parse("""
def @main(%x: Tensor[(?), float32]) {
  %0 = add(%x, %x);
  %1 = greater(%0, 0f);
  %2 = argwhere(%1);
  add(%2, 1)
}""")
    after = fuse(before)
    assert groups(after) == [["add", "greater"], ["argwhere"], ["add"]]
    check_same_result(before, after, np.array([1, -2, 3, 0], "float32"))


def test_data_dependent_op_is_fusable_when_its_output_is_static():
    # dyn.reshape reads its second input's data; with a dynamic result it must stand alone, with a
    # constant new shape its result is static and it fuses like any injective op.
    dynamic = parse("""
def @main(%x: Tensor[(6), float32], %s: Tensor[(2), int64]) {
  exp(dyn.reshape(add(%x, %x), %s))
}""")
    assert groups(fuse(dynamic)) == [["add"], ["dyn.reshape"], ["exp"]]
    static = tv.ir.IRModule.from_expr(_static_dyn_reshape())
    assert groups(fuse(static)) == [["add", "dyn.reshape", "exp"]]
    x = np.arange(6, dtype="float32")
    check_same_result(dynamic, fuse(dynamic), x, np.array([2, 3], "int64"))
    check_same_result(static, fuse(static), x)


def _static_dyn_reshape():
    x = tv.ir.var("x", shape=(6,))
    shape = tv.ir.const(np.array([3, 2], "int64"))
    return Function((x,), tv.op.exp(tv.op.dyn.reshape(tv.op.add(x, x), shape)))


def test_fuse_opt_level_zero_puts_each_op_alone():
    before = parse("""
def @main(%x: Tensor[(?, 3), float32]) {
  negative(exp(add(%x, 1f)))
}""")
    after = fuse(before, fuse_opt_level=0)
    assert groups(after) == [["add"], ["exp"], ["negative"]]
    check_same_result(before, after, np.ones((2, 3), "float32"))


def test_max_depth_bounds_group_size():
    text = "def @main(%x: Tensor[(?), float32]) {\n  " + "".join(
        f"%{i} = add({'%x' if i == 0 else f'%{i - 1}'}, 1f);\n  " for i in range(10)) + "exp(%9)\n}"
    before = parse(text)
    after = fuse(before, max_depth=4)
    sizes = [len(g) for g in groups(after)]
    assert all(s <= 4 for s in sizes) and sum(sizes) == 11 and len(sizes) >= 3
    check_same_result(before, after, np.arange(3, dtype="float32"))


def test_nested_function_bodies_are_separate_regions():
    before = parse("""
def @main(%x: Tensor[(?), float32]) {
  %0 = exp(%x);
  let %f = fn (%y: Tensor[(?), float32]) { negative(add(%y, %0)) };
  %f(%0)
}""")
    after = fuse(before)
    outer = groups(after)
    assert ["exp"] in outer and ["add", "negative"] in outer and len(outer) == 2
    # exp, used inside the closure too, stays one node (a group output of the outer region), and the
    # closure's ops fuse among themselves.
    exp_calls = [n for n in post_order_iter(after["main"].body) if isinstance(n, Call)
                 and isinstance(n.op, Function) and op_names(n.op) == ["exp"]]
    assert len(exp_calls) == 1
    check_same_result(before, after, np.array([0.5, 1.0], "float32"))


def test_tuple_fields_and_projections_fuse_into_injective_consumers():
    before = parse("""
def @main(%x: Tensor[(?, 4), float32], %y: Tensor[(?, 4), float32]) {
  %0 = exp(%x);
  %1 = concatenate((%0, %y), axis=0);
  %2 = split(%1, indices_or_sections=2, axis=1);
  add(%2.0, %2.1)
}""")
    after = fuse(before)
    assert groups(after) == [["exp", "concatenate", "split", "add"]]
    x, y = np.ones((2, 4), "float32"), np.full((3, 4), 2, "float32")
    check_same_result(before, after, x, y)


def test_every_op_call_ends_in_a_primitive_and_input_is_unchanged():
    before = parse("""
def @main(%c: bool, %x: Tensor[(?), float32]) {
  if (%c) { exp(%x) } else { %0 = negative(%x); (%0, %0).1 }
}""")
    typed = InferType()(before)
    text_before = str(typed)
    after = FuseOps()(typed)
    assert str(typed) == text_before  # the pass returns a new module
    for node in post_order_iter(after["main"].body):
        if isinstance(node, Call) and isinstance(node.op, Op):
            pytest.fail(f"op {node.op.name} outside a primitive")
    for c in (True, False):
        check_same_result(before, after, np.array(c), np.array([1.0, 2.0], "float32"))


# --- random elementwise/broadcast DAGs ----------------------------------------------------------
_UNARY = ["exp", "negative", "tanh", "sigmoid"]
_BINARY = ["add", "subtract", "multiply", "maximum"]


@st.composite
def random_dag(draw):
    """A random graph of unary/binary ops and reductions over two dynamic inputs, as Relay text."""
    names = ["%x", "%y"]
    lines = []
    for i in range(draw(st.integers(1, 9))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "sum"]))
        a = draw(st.sampled_from(names))
        if kind == "unary":
            expr = f"{draw(st.sampled_from(_UNARY))}({a})"
        elif kind == "binary":
            expr = f"{draw(st.sampled_from(_BINARY))}({a}, {draw(st.sampled_from(names))})"
        else:
            expr = f"add({a}, sum({a}, axis=[1], keepdims=True))"
        lines.append(f"%{i} = {expr};")
        names.append(f"%{i}")
    outs = draw(st.lists(st.sampled_from(names[2:]), min_size=1, max_size=2, unique=True))
    result = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"
    return ("def @main(%x: Tensor[(?, 3), float32], %y: Tensor[(?, 3), float32]) {\n  "
            + "\n  ".join(lines) + f"\n  {result}\n}}")


@settings(max_examples=30, deadline=None)
@given(random_dag(), st.integers(1, 3))
def test_random_graphs_keep_their_meaning(text, rows):
    before = parse(text)
    after = fuse(before)
    rng = np.random.default_rng(rows)
    x, y = (rng.standard_normal((rows, 3)).astype("float32") for _ in range(2))
    check_same_result(before, after, x, y)
    for node in post_order_iter(after["main"].body):
        assert not (isinstance(node, Call) and isinstance(node.op, Op)), "an op call outside a primitive"


# ---- annotation.stop_fusion ------------------------------------------------------------------------

STOP_FUSION_CHAIN = """
def @main(%x: Tensor[(2, 3), float32], %y: Tensor[(2, 3), float32]) {
  %0 = add(%x, %y);
  %1 = annotation.stop_fusion(%0);
  %2 = exp(%1);
  multiply(%2, %1)
}"""


def _without_stop_fusion(text: str) -> str:
    return text.replace("annotation.stop_fusion(%0)", "%0")


def _all_op_names(mod) -> list[str]:
    return [n.op.name for n in post_order_iter(mod["main"].body) if isinstance(n, Call) and isinstance(n.op, Op)]


def test_stop_fusion_is_a_boundary_and_is_removed():
    # without it the chain is one group; with it, the add stands alone and the rest fuses after it
    assert groups(fuse(parse(_without_stop_fusion(STOP_FUSION_CHAIN)))) == [["add", "exp", "multiply"]]
    before = parse(STOP_FUSION_CHAIN)
    after = fuse(before)
    assert groups(after) == [["add"], ["exp", "multiply"]]
    assert "annotation.stop_fusion" not in _all_op_names(after) + sum(groups(after), [])
    x, y = np.random.default_rng(0).standard_normal((2, 2, 3)).astype("float32")
    check_same_result(before, after, x, y)


def test_stop_fusion_between_elementwise_ops_gives_two_kernels_on_target_c():
    x, y = np.random.default_rng(1).standard_normal((2, 2, 3)).astype("float32")
    want = np.exp(x + y) * (x + y)
    kernels = {}
    for text in (STOP_FUSION_CHAIN, _without_stop_fusion(STOP_FUSION_CHAIN)):
        mod = tv.parse(text)
        exe = tv.vm.compile(mod, target="c")
        stats = exe.stats()
        assert stats["kernel_library"]["numpy_fallbacks"] == {}
        kernels[text] = stats["kernels"]
        got = tv.vm.VirtualMachine(exe).invoke("main", x, y).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5)
        for kind in ("debug", "graph"):
            np.testing.assert_allclose(tv.create_executor(kind, mod).evaluate()(x, y).numpy(), want, rtol=1e-5)
    assert len(kernels[STOP_FUSION_CHAIN]) == 2
    assert len(kernels[_without_stop_fusion(STOP_FUSION_CHAIN)]) == 1


def test_stop_fusion_of_a_parameter_and_under_lets():
    before = parse("""
def @main(%x: Tensor[(4), float32]) {
  let %a = annotation.stop_fusion(%x);
  let %b = annotation.stop_fusion(negative(%a));
  (annotation.stop_fusion(%b), %b)
}""")
    after = fuse(before)
    assert groups(after) == [["negative"]]
    assert "annotation.stop_fusion" not in _all_op_names(after)
    check_same_result(before, after, np.arange(4, dtype="float32"))
