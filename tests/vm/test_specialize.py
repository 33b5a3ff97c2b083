"""Straight-line dynamic functions run specialized to their parameters' shapes (``vm/specialize.py``): the
shape slice runs once per shape, the body after it. The oracles are NumPy and each program's expected value,
checked on every call before, at and after specialization, with results of earlier calls kept and
re-checked (a specialized call must not write into a tensor it handed out)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.errors import ShapeError
from tensorvm.vm import VirtualMachine
from tensorvm.vm import vm as vm_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from programs import PROGRAMS, check_result  # noqa: E402

MODES = ["bytecode", "compiled"]


def _parse(text: str):
    return tv.parse('#[version = "0.0.5"]\n' + text)


def _snapshot(value):
    """A deep copy of a result's tensors, to compare with later."""
    if isinstance(value, (tuple, list)):
        return type(value)(_snapshot(v) for v in value)
    if hasattr(value, "fields"):
        return tuple(_snapshot(v) for v in value.fields)
    return np.array(value.numpy() if hasattr(value, "numpy") else value, copy=True)


def _same(value, snapshot) -> bool:
    if isinstance(snapshot, tuple):
        fields = value.fields if hasattr(value, "fields") else value
        return all(_same(v, s) for v, s in zip(fields, snapshot, strict=True))
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    return array.shape == snapshot.shape and np.array_equal(array, snapshot, equal_nan=True)


_RUNNABLE = [p for p in PROGRAMS if not p.error and p.expected_fn is not None]


@pytest.mark.parametrize("mode", MODES)
def test_every_program_gives_the_same_answer_on_repeated_calls(mode):
    specialized = 0
    for program in _RUNNABLE:
        mod = program.parse()
        vm = VirtualMachine(tv.vm.compile(mod, exec_mode=mode))
        args = program.args_fn()
        expected = program.expected_fn(*args)
        kept = []
        for _ in range(3):  # generic, specializing, specialized
            result = vm.invoke(program.entry, *args)
            check_result(result, expected, mod, program.rtol, program.atol, path=program.name)
            kept.append((result, _snapshot(result)))
        assert all(_same(r, s) for r, s in kept), f"{program.name}: a later call changed an earlier result"
        specialized += bool(vm._function(program.entry).specialized)
    assert specialized >= 5  # the dynamic straight-line programs of the corpus


CHAIN = """
def @main(%x: Tensor[(?, 3), float32], %y: Tensor[(1, 3), float32]) {
  %0 = add(%x, %y);
  %1 = multiply(%0, %y);
  %2 = concatenate((%1, %x), axis=0);
  %3 = reshape(%2, newshape=[-1, 2]);
  %4 = shape_of(%3, dtype="int64");
  %5 = take(%4, 0);
  %6 = arange(0, %5, 1, dtype="int64");
  (%3, %6)
}
"""


def _chain(x, y):
    out = np.concatenate([(x + y) * y, x]).reshape(-1, 2)
    return out, np.arange(out.shape[0], dtype=np.int64)


# (on target "c" exec mode "compiled" is native mode, which does not specialize: docs/native_mode.md)
@pytest.mark.parametrize(("mode", "target"), [("bytecode", "python"), ("bytecode", "c"), ("compiled", "python")])
def test_shapes_interleave_and_results_stay_owned_by_the_caller(mode, target):
    vm = VirtualMachine(tv.vm.compile(_parse(CHAIN), target=target, exec_mode=mode))
    rng = np.random.default_rng(0)
    y = rng.standard_normal((1, 3)).astype("float32")
    kept = []
    for n in (4, 2, 4, 6, 2, 4, 6, 8, 4):  # shapes seen once, twice and more, in turns
        x = rng.standard_normal((n, 3)).astype("float32")
        out, ids = vm.invoke("main", x, y)
        want_out, want_ids = _chain(x, y)
        np.testing.assert_allclose(out.numpy(), want_out, rtol=1e-6)
        np.testing.assert_array_equal(ids.numpy(), want_ids)
        kept.append((out.numpy(), want_out, ids.numpy(), want_ids))
        ids.numpy()[:] = -1  # the caller owns the result: scribbling on it must not reach the next call
    for out, want_out, _, _ in kept:
        np.testing.assert_allclose(out, want_out, rtol=1e-6)
    assert set(vm._function("main").specialized) == {((4, 3), (1, 3)), ((2, 3), (1, 3)), ((6, 3), (1, 3))}


def test_data_dependent_shapes_are_not_fixed_by_the_input_shape():
    vm = VirtualMachine(tv.vm.compile(_parse("""
def @main(%x: Tensor[(?), int32]) {
  %u = unique(%x);
  %n = shape_of(%u.0);
  (add(%u.0, 1), %n)
}""")))
    inputs = [np.array(v, "int32") for v in ([3, 1, 3, 2], [5, 5, 5, 5], [1, 2, 3, 4], [7, 7, 1, 1])] * 2
    for x in inputs:  # one input shape, outputs of 1 to 4 elements
        values, count = vm.invoke("main", x)
        np.testing.assert_array_equal(values.numpy(), np.unique(x) + 1)
        np.testing.assert_array_equal(count.numpy(), [len(np.unique(x))])


@pytest.mark.parametrize("mode", MODES)
def test_a_shape_error_found_by_the_slice_is_located_and_the_vm_stays_usable(mode):
    vm = VirtualMachine(tv.vm.compile(_parse("""
def @main(%x: Tensor[(?, 3), float32]) {
  %0 = add(%x, 1f);
  reshape(%0, newshape=[-1, 4])
}"""), exec_mode=mode))
    bad = np.ones((3, 3), "float32")
    for _ in range(3):  # generic, then the slice of the would-be specialization
        with pytest.raises(ShapeError, match="main"):
            vm.invoke("main", bad)
    good = np.arange(24, dtype="float32").reshape(8, 3)
    for _ in range(3):
        np.testing.assert_allclose(vm.invoke("main", good).numpy(), (good + 1).reshape(-1, 4))


def test_specialized_shapes_are_bounded(monkeypatch):
    monkeypatch.setattr(vm_module, "_SPECIALIZE_LIMIT", 3)
    vm = VirtualMachine(tv.vm.compile(_parse(CHAIN)))
    y = np.ones((1, 3), "float32")
    for n in range(1, 9):
        for _ in range(2):
            x = np.full((n, 3), n, "float32")
            np.testing.assert_allclose(vm.invoke("main", x, y)[0].numpy(), _chain(x, y)[0])
    info = vm._function("main")
    assert len(info.specialized) == 3 and len(info.sightings) <= 3
    assert set(info.specialized) == {((n, 3), (1, 3)) for n in (6, 7, 8)}  # the most recent ones


def test_profiles_and_instruments_still_see_every_instruction():
    vm = VirtualMachine(tv.vm.compile(_parse(CHAIN)))
    x, y = np.ones((4, 3), "float32"), np.ones((1, 3), "float32")
    for _ in range(3):
        vm.invoke("main", x, y)
    report = vm.profile("main", x, y)
    assert any("ShapeOf" in row.name for row in report.rows)
    seen = []
    vm.set_instrument(lambda name, *_: seen.append(name))
    vm.invoke("main", x, y)
    assert seen and any("shape_func" in name for name in seen)


# --- the arena: intermediate buffers made once per shape -------------------------------------------
CNN_LIKE = """
def @main(%x: Tensor[(N, 2, 8, 8), float32], %w: Tensor[(4, 2, 3, 3), float32], %wd: Tensor[(3, 64), float32]) {
  %0 = nn.relu(nn.conv2d(%x, %w, padding=[1, 1]));
  %1 = nn.max_pool2d(%0, pool_size=[2, 2], strides=[2, 2]);
  %2 = exp(negative(%1));
  %3 = nn.batch_flatten(%2);
  nn.dense(%3, %wd)
}
"""


def _cnn_like(x, w, wd):
    from tensorvm.op.registry import get_op

    conv = get_op("nn.conv2d")
    y = np.maximum(conv.kernel(conv.normalize_attrs({"padding": [1, 1, 1, 1]}), x, w), 0)
    pooled = y.reshape(y.shape[0], 4, 4, 2, 4, 2).max(axis=(3, 5))
    return np.exp(-pooled).reshape(y.shape[0], -1) @ wd.T


def _body_allocations(vm) -> list:
    """The allocations a specialized call still runs (bytecode instructions outside the slice)."""
    from tensorvm.vm import bytecode as bc

    info = vm._function("main")
    code = vm.exe.functions[info.index].instructions
    return [code[pc] for pc, ins in enumerate(code) if pc not in info.shape_slice.body_skip
            and isinstance(ins, (bc.AllocStorage, bc.AllocTensor, bc.AllocTensorReg))]


@pytest.mark.parametrize("target", ["python", "c"])
@pytest.mark.parametrize("batch", ["2", "?"], ids=["static", "dynamic"])
def test_intermediate_buffers_are_made_once_per_shape(batch, target):
    """A static function (and a dynamic one, per shape) keeps its intermediates' buffers after the second
    call: the body allocates only the result. Every call is checked against NumPy, earlier results are
    re-checked, and results of different calls never share memory."""
    vm = VirtualMachine(tv.vm.compile(_parse(CNN_LIKE.replace("N", batch)), target=target))
    rng = np.random.default_rng(3)
    w, wd = rng.standard_normal((4, 2, 3, 3)).astype("float32"), rng.standard_normal((3, 64)).astype("float32")
    kept = []
    for n in (2, 2, 2, 2):
        x = rng.standard_normal((n, 2, 8, 8)).astype("float32")
        out = vm.invoke("main", x, w, wd).numpy()
        np.testing.assert_allclose(out, _cnn_like(x, w, wd), rtol=1e-4, atol=1e-5)
        kept.append((out, _cnn_like(x, w, wd)))
    for out, want in kept:
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    assert not any(np.shares_memory(a[0], b[0]) for i, a in enumerate(kept) for b in kept[i + 1:])
    (body,) = vm._function("main").specialized.values()
    # only the result's storage and tensor are made per call
    assert [type(ins).__name__ for ins in _body_allocations(vm)] in (["AllocStorage", "AllocTensor"],
                                                                     ["AllocStorage", "AllocTensorReg"])
    assert body.arena_bytes >= 2 * 4 * 4 * 4 * 4  # at least the pooled map


CHAIN_OF_PRODUCTS = """
def @main(%x: Tensor[(?, 64), float32], %w: Tensor[(64, 64), float32]) {
  %0 = nn.dense(%x, %w);
  %1 = nn.dense(%0, %w);
  %2 = nn.dense(%1, %w);
  sum(%2, axis=[1])
}
"""


@pytest.mark.parametrize("target", ["python", "c"])
def test_the_arena_is_placed_storages_of_disjoint_spans_share_bytes(target):
    """Three products in a chain: the first's output is dead once the second has read it, so the third's
    may take its bytes; the arena holds two of the three intermediates (one buffer each would be three),
    and every call, with that shape or another, is right, earlier results unchanged."""
    vm = VirtualMachine(tv.vm.compile(_parse(CHAIN_OF_PRODUCTS), target=target))
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((64, 64)) / 8).astype("float32")
    kept = []
    for n in (5, 5, 5, 3, 3, 5):
        x = rng.standard_normal((n, 64)).astype("float32")
        want = (x @ w.T @ w.T @ w.T).sum(axis=1)
        out = vm.invoke("main", x, w).numpy()
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
        kept.append((out, want))
    for out, want in kept:
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    body = vm._function("main").specialized[((5, 64), (64, 64))]
    one = 5 * 64 * 4
    assert 2 * one <= body.arena_bytes < 3 * one


def test_arenas_are_bounded_in_bytes(monkeypatch):
    """Past ``_ARENA_LIMIT`` bytes of kept buffers, older specialized shapes are dropped (the newest stays);
    answers stay right throughout."""
    vm = VirtualMachine(tv.vm.compile(_parse(CNN_LIKE.replace("N", "?"))))
    rng = np.random.default_rng(4)
    w, wd = rng.standard_normal((4, 2, 3, 3)).astype("float32"), rng.standard_normal((3, 64)).astype("float32")
    x1 = rng.standard_normal((1, 2, 8, 8)).astype("float32")
    for _ in range(2):
        vm.invoke("main", x1, w, wd)
    one = vm._function("main").specialized[((1, 2, 8, 8), (4, 2, 3, 3), (3, 64))].arena_bytes
    monkeypatch.setattr(vm_module, "_ARENA_LIMIT", int(one * 4.5))  # room for batch 1 and 3, not 1, 3, 5
    for n in (3, 3, 5, 5, 1, 3, 5):
        x = rng.standard_normal((n, 2, 8, 8)).astype("float32")
        np.testing.assert_allclose(vm.invoke("main", x, w, wd).numpy(), _cnn_like(x, w, wd), rtol=1e-4, atol=1e-5)
        info = vm._function("main")
        assert sum(b.arena_bytes for b in info.specialized.values()) <= int(one * 4.5) or len(info.specialized) == 1
