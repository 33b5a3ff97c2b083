"""Relay ops declared as other ops (``tensorvm.op.relay_forms``): conv1d/conv3d and their pools, the fast_*
approximations, scatter/scatter_add, l2_normalize and layout_transform, written as TVM's tests write them;
and what Relay's argsort, topk and sequence_mask allow beyond integers (float indices, float lengths), and the
shape=None attribute TVM prints on the dyn creation ops.

Oracles: eager PyTorch for convolutions and pools (its functions state the same arithmetic), NumPy for
the rest; every result also on the reference interpreter and the VM (target c in bytecode and native mode,
target python), with weights given as arguments and as constants (which weight packing sees).
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.errors import TypeInferenceError

torch = pytest.importorskip("torch")
F = torch.nn.functional

RUNS = (("c", "bytecode"), ("c", "native"), ("python", "bytecode"))


def _results(text: str, args: list, params: dict | None = None) -> list:
    mod = tv.parse(text)
    outs = [tv.create_executor("debug", mod).evaluate()(*args, *(params or {}).values()).numpy()]
    for target, mode in RUNS:
        exe = tv.vm.compile(mod, target=target, exec_mode=mode, params=params)
        outs.append(tv.vm.VirtualMachine(exe).run(*args).numpy())
    return outs


def _check(text: str, args: list, expected: np.ndarray, params: dict | None = None, tol: float = 1e-5):
    for got in _results(text, args, params):
        assert got.shape == expected.shape and got.dtype == expected.dtype
        np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


def _normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


@pytest.mark.parametrize("layout", ["NCW", "NWC"])
def test_conv1d_against_torch(layout):
    rng = np.random.default_rng(1)
    x, w = _normal(rng, 2, 4, 11), _normal(rng, 6, 2, 3)  # (N, C, W), (O, I/groups, W)
    expected = F.conv1d(F.pad(_t(x), (1, 2)), _t(w), stride=2, dilation=2, groups=2).numpy()
    data = x if layout == "NCW" else x.transpose(0, 2, 1)
    weight = w if layout == "NCW" else w.transpose(2, 1, 0)  # OIW or WIO
    kernel_layout = "OIW" if layout == "NCW" else "WIO"
    want = expected if layout == "NCW" else expected.transpose(0, 2, 1)
    text = (f"def @main(%x: Tensor[{tuple(data.shape)}, float32], %w: Tensor[{tuple(weight.shape)}, float32]) "
            f"{{ nn.conv1d(%x, %w, strides=[2], padding=[1, 2], dilation=[2], groups=2, channels=6, "
            f"kernel_size=[3], data_layout=\"{layout}\", kernel_layout=\"{kernel_layout}\") }}")
    _check(text, [data, weight], want)
    _check(text, [data], want, params={"w": weight})  # (a constant weight: packed after legalization)


def test_conv1d_of_a_dynamic_length():
    rng = np.random.default_rng(2)
    w = _normal(rng, 5, 3, 4)
    mod = tv.parse("def @main(%x: Tensor[(1, 3, ?), float32], %w: Tensor[(5, 3, 4), float32]) "
                   "{ nn.conv1d(%x, %w, padding=[1]) }")
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c"))
    for length in (4, 9, 30):
        x = _normal(rng, 1, 3, length)
        np.testing.assert_allclose(vm.run(x, w).numpy(), F.conv1d(_t(x), _t(w), padding=1).numpy(), rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("op, ceil, count_pad", [("max", False, False), ("max", True, False), ("avg", False, True),
                                                 ("avg", True, False)])
def test_pool1d_against_torch(op, ceil, count_pad):
    rng = np.random.default_rng(3)
    x = _normal(rng, 2, 3, 10)
    attrs = f"pool_size=[3], strides=[2], padding=[1], ceil_mode={ceil}"
    if op == "avg":
        attrs += f", count_include_pad={count_pad}"
        expected = F.avg_pool1d(_t(x), 3, 2, 1, ceil_mode=ceil, count_include_pad=count_pad).numpy()
    else:
        expected = F.max_pool1d(_t(x), 3, 2, 1, ceil_mode=ceil).numpy()
    _check(f"def @main(%x: Tensor[(2, 3, 10), float32]) {{ nn.{op}_pool1d(%x, {attrs}) }}", [x], expected)
    # NWC: the same numbers, channels last
    _check(f"def @main(%x: Tensor[(2, 10, 3), float32]) {{ nn.{op}_pool1d(%x, {attrs}, layout=\"NWC\") }}",
           [x.transpose(0, 2, 1).copy()], expected.transpose(0, 2, 1))


@pytest.mark.parametrize("op", ["avg", "max"])
def test_adaptive_pool1d_against_torch(op):
    x = _normal(np.random.default_rng(4), 2, 3, 10)
    fn = F.adaptive_avg_pool1d if op == "avg" else F.adaptive_max_pool1d
    _check(f"def @main(%x: Tensor[(2, 3, 10), float32]) {{ nn.adaptive_{op}_pool1d(%x, output_size=[4]) }}", [x],
           fn(_t(x), 4).numpy())


def test_conv3d_and_its_transpose_against_torch():
    rng = np.random.default_rng(5)
    x, w = _normal(rng, 1, 4, 5, 6, 7), _normal(rng, 6, 2, 3, 3, 2)
    expected = F.conv3d(_t(x), _t(w), stride=(1, 2, 1), padding=(1, 0, 1), dilation=(1, 1, 2), groups=2).numpy()
    _check("def @main(%x: Tensor[(1, 4, 5, 6, 7), float32], %w: Tensor[(6, 2, 3, 3, 2), float32]) { nn.conv3d(%x, %w, "
           "strides=[1, 2, 1], padding=[1, 0, 1], dilation=[1, 1, 2], groups=2, channels=6, kernel_size=[3, 3, 2]) }",
           [x, w], expected, tol=1e-4)
    wt = _normal(rng, 4, 3, 2, 3, 3)  # (C_in, C_out/groups, D, H, W): IODHW
    expected = F.conv_transpose3d(_t(x), _t(wt), stride=2, padding=1, output_padding=1).numpy()
    _check("def @main(%x: Tensor[(1, 4, 5, 6, 7), float32], %w: Tensor[(4, 3, 2, 3, 3), float32]) { "
           "nn.conv3d_transpose(%x, %w, strides=[2, 2, 2], padding=[1, 1, 1], output_padding=[1, 1, 1]) }",
           [x, wt], expected, tol=1e-4)


@pytest.mark.parametrize("op", ["max", "avg"])
def test_pool3d_against_torch(op):
    x = _normal(np.random.default_rng(6), 1, 2, 6, 7, 5)
    if op == "max":
        expected = F.max_pool3d(_t(x), (3, 2, 2), (2, 2, 1), (1, 1, 0), ceil_mode=True).numpy()
        attrs = "ceil_mode=True"
    else:
        expected = F.avg_pool3d(_t(x), (3, 2, 2), (2, 2, 1), (1, 1, 0), count_include_pad=False).numpy()
        attrs = "count_include_pad=False"
    _check(f"def @main(%x: Tensor[(1, 2, 6, 7, 5), float32]) {{ nn.{op}_pool3d(%x, pool_size=[3, 2, 2], "
           f"strides=[2, 2, 1], padding=[1, 1, 0, 1, 1, 0], {attrs}) }}", [x], expected)


def test_fast_approximations_are_the_exact_functions():
    import math

    x = np.linspace(-4, 4, 17, dtype=np.float32).reshape(1, 17)
    exact = {"fast_exp": np.exp(x), "fast_tanh": np.tanh(x), "fast_erf": np.vectorize(math.erf)(x).astype(np.float32)}
    for name, want in exact.items():
        _check(f"def @main(%x: Tensor[(1, 17), float32]) {{ {name}(%x) }}", [x], want)
    shifted = np.exp(x - x.max(axis=1, keepdims=True))
    _check("def @main(%x: Tensor[(1, 17), float32]) { nn.fast_softmax(%x, axis=1) }", [x],
           shifted / shifted.sum(axis=1, keepdims=True))


def test_scatter_and_scatter_add_are_scatter_elements():
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    indices = np.array([[0, 2], [1, 1], [2, 0]], np.int64)
    updates = np.array([[10, 20], [30, 40], [50, 60]], np.float32)
    replaced, added = data.copy(), data.copy()
    for i in range(3):
        for j in range(2):
            replaced[i, indices[i, j]] = updates[i, j]
            added[i, indices[i, j]] += updates[i, j]
    sig = "%d: Tensor[(3, 4), float32], %i: Tensor[(3, 2), int64], %u: Tensor[(3, 2), float32]"
    _check(f"def @main({sig}) {{ scatter(%d, %i, %u, axis=1) }}", [data, indices, updates], replaced)
    _check(f"def @main({sig}) {{ scatter_add(%d, %i, %u, axis=1) }}", [data, indices, updates], added)


def test_l2_normalize_and_layout_transform():
    x = np.random.default_rng(7).standard_normal((2, 3, 4, 5)).astype(np.float32)
    x[1] = 0  # (the floor eps keeps zeros finite)
    norms = np.sqrt(np.maximum((x * x).sum(axis=(1, 3), keepdims=True), 1e-6))
    _check("def @main(%x: Tensor[(2, 3, 4, 5), float32]) { nn.l2_normalize(%x, eps=1e-6, axis=[1, 3]) }", [x],
           x / norms)
    _check("def @main(%x: Tensor[(2, 3, 4, 5), float32]) { layout_transform(%x, src_layout=\"NCHW\", "
           "dst_layout=\"NHWC\") }", [x], x.transpose(0, 2, 3, 1))
    with pytest.raises(TypeInferenceError, match="only a permutation"):
        tv.transform.InferType()(tv.parse("def @main(%x: Tensor[(2, 4, 4, 5), float32]) { layout_transform(%x, "
                                          "src_layout=\"NCHW\", dst_layout=\"NCHW4c\") }"))


# ---- what Relay's ops allow beyond the common case -------------------------------------------------------

@pytest.mark.parametrize("sig", ["(3, 7)", "(?, 7)"])
def test_argsort_and_topk_return_float_indices_when_asked(sig):
    """Relay's argsort/topk take dtype="float32" for the indices (TVM's tests loop over it): the sort's
    integer indices, cast."""
    x = np.random.default_rng(8).standard_normal((3, 7)).astype(np.float32)
    order = np.argsort(x, axis=1, kind="stable")
    descending = np.argsort(-x, axis=1, kind="stable")[:, :3]
    _check(f'def @main(%x: Tensor[{sig}, float32]) {{ argsort(%x, axis=1, dtype="float32") }}', [x],
           order.astype(np.float32))
    _check(f'def @main(%x: Tensor[{sig}, float32]) {{ topk(%x, k=3, axis=1, ret_type="indices", dtype="float64") }}',
           [x], descending.astype(np.float64))
    _check(f'def @main(%x: Tensor[{sig}, float32]) {{ %0 = topk(%x, k=3, axis=1, dtype="float32"); (%0.0 + %0.1) }}',
           [x], np.take_along_axis(x, descending, 1) + descending.astype(np.float32))


@pytest.mark.parametrize("sig", ["(5, 4, 3)", "(?, 4, 3)"])
def test_sequence_mask_takes_float_lengths(sig):
    """A float valid_length (TVM's test passes float32 lengths): a step is kept where it is below the length,
    compared as a float (2.5 keeps steps 0, 1 and 2)."""
    x = np.random.default_rng(9).standard_normal((5, 4, 3)).astype(np.float32)
    lengths = np.array([0, 2.5, 5, 3], np.float32)
    expected = np.where((np.arange(5)[:, None] < lengths[None, :])[..., None], x, np.float32(-1))
    _check(f"def @main(%x: Tensor[{sig}, float32], %l: Tensor[(4), float32]) {{ sequence_mask(%x, %l, mask_value=-1f) }}",
           [x, lengths], expected)


def test_dyn_ops_take_the_shape_none_attribute_tvm_prints():
    """TVM prints dyn.full/zeros/ones/broadcast_to with shape=None (their shape is an argument): the text
    parses, prints back and runs; a shape given there is refused."""
    from tensorvm.errors import ParseError

    shape = np.array([2, 3], np.int64)
    _check('def @main(%v: float32, %s: Tensor[(2), int64]) { dyn.full(%v, %s, shape=None, dtype="float32") }',
           [np.float32(2), shape], np.full((2, 3), 2, np.float32))
    _check('def @main(%s: Tensor[(2), int64]) { dyn.ones(%s, shape=None, dtype="float32") }', [shape],
           np.ones((2, 3), np.float32))
    _check("def @main(%x: Tensor[(1, 3), float32], %s: Tensor[(2), int64]) { dyn.broadcast_to(%x, %s, shape=None) }",
           [np.arange(3, dtype=np.float32).reshape(1, 3), shape], np.broadcast_to(np.arange(3, dtype=np.float32), (2, 3)))
    text = 'def @main(%s: Tensor[(2), int64]) { dyn.zeros(%s, shape=None, dtype="float32") }'
    assert tv.structural_equal(tv.parse(text), tv.parse(str(tv.parse(text))))
    with pytest.raises(ParseError, match="only shape=None"):
        tv.parse('def @main(%s: Tensor[(2), int64]) { dyn.zeros(%s, shape=[2, 3], dtype="float32") }')


def test_cross_entropy_and_invert_permutation():
    rng = np.random.default_rng(10)
    logits = rng.standard_normal((4, 5)).astype(np.float32)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    targets = np.eye(5, dtype=np.float32)[[0, 3, 1, 4]]
    sig = "%p: Tensor[(4, 5), float32], %t: Tensor[(4, 5), float32]"
    _check(f"def @main({sig}) {{ nn.cross_entropy(%p, %t) }}", [probs, targets],
           np.float32(-(np.log(probs) * targets).sum() / 4), tol=1e-5)
    _check(f"def @main({sig}) {{ nn.cross_entropy_with_logits(%p, %t) }}", [logits, targets],
           np.float32(-(logits * targets).sum() / 4), tol=1e-5)
    perm = np.array([3, 0, 4, 1, 2], np.int32)
    inverse = np.empty_like(perm)
    inverse[perm] = np.arange(5, dtype=np.int32)
    _check("def @main(%x: Tensor[(?), int32]) { invert_permutation(%x) }", [perm], inverse)


def test_conv3d_channels_last_conv1d_mixed_integers_and_contradicting_attributes():
    """TVM's test_conv3d_ndhwc_run layouts (NDHWC data, DHWIO weight); test_conv1d_infer_type's uint8 data with
    an int8 weight into int32; channels/kernel_size contradicting the weight refused, as Relay's Conv3DRel does."""
    rng = np.random.default_rng(11)
    x, w = _normal(rng, 1, 3, 5, 6, 4), _normal(rng, 5, 3, 3, 3, 2)  # NCDHW, OIDHW
    expected = F.conv3d(_t(x), _t(w), padding=1).numpy()
    _check('def @main(%x: Tensor[(1, 5, 6, 4, 3), float32], %w: Tensor[(3, 3, 2, 3, 5), float32]) { nn.conv3d(%x, %w, '
           'padding=[1, 1, 1], data_layout="NDHWC", kernel_layout="DHWIO") }',
           [x.transpose(0, 2, 3, 4, 1).copy(), w.transpose(2, 3, 4, 1, 0).copy()], expected.transpose(0, 2, 3, 4, 1),
           tol=1e-4)
    data = rng.integers(0, 255, (1, 4, 9), dtype=np.uint8)
    weight = rng.integers(-128, 127, (2, 4, 3), dtype=np.int8)
    want = np.stack([np.stack([(data[0, :, t:t + 3].astype(np.int64) * weight[o]).sum() for t in range(7)])
                     for o in range(2)])[None].astype(np.int32)
    _check('def @main(%x: Tensor[(1, 4, 9), uint8], %w: Tensor[(2, 4, 3), int8]) { nn.conv1d(%x, %w, out_dtype="int32") }',
           [data, weight], want)
    for attrs in ("channels=7", "kernel_size=[2, 2, 2]"):
        with pytest.raises(TypeInferenceError, match="but the weight"):
            tv.transform.InferType()(tv.parse(f"def @main(%x: Tensor[(1, 3, 5, 6, 4), float32], "
                                              f"%w: Tensor[(5, 3, 3, 3, 2), float32]) {{ nn.conv3d(%x, %w, {attrs}) }}"))
