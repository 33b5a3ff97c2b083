"""``nn.lstm_cell`` and ``nn.gru_cell`` (tensorvm/op/recurrent.py): the NumPy kernel, the type relation and
shape function (``check_op``), and the generated C kernel (target "c", bytecode VM and native mode, 1 and 2
threads, after save/load) against an oracle written here from the ONNX formulas, in double precision."""

from __future__ import annotations

import numpy as np
import pytest
from op_testing import check_op

import tensorvm as tv
from tensorvm.codegen.build import have_compiler
from tensorvm.errors import TypeInferenceError
from tensorvm.vm import VirtualMachine, load_executable


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _oracle(op, x, r, state, rb=None, clip=None):
    """ONNX's LSTM (gates iofc, c' then h = o tanh(c')) / GRU (gates zrh, linear_before_reset=1, Rb_h = rb)
    cell."""
    x, r, state = (np.asarray(a, np.float64) for a in (x, r, state))
    hidden = state.shape[1]

    def part(a, k):
        return a[:, k * hidden:(k + 1) * hidden]

    def bound(v):
        return v if clip is None else np.clip(v, -clip, clip)

    if op == "nn.lstm_cell":
        i, o, f = (_sigmoid(bound(part(x, k) + part(r, k))) for k in range(3))
        c = f * state + i * np.tanh(bound(part(x, 3) + part(r, 3)))
        return o * np.tanh(c), c
    z, s = (_sigmoid(bound(part(x, k) + part(r, k))) for k in range(2))
    n = np.tanh(bound(part(x, 2) + s * (part(r, 2) + np.asarray(rb, np.float64))))
    return ((1 - z) * n + z * state,)


def _inputs(op, batch, hidden, dtype="float32", seed=0):
    gates = 4 if op == "nn.lstm_cell" else 3
    rng = np.random.default_rng(seed + batch * 100 + hidden)
    shapes = [(batch, gates * hidden), (batch, gates * hidden), (batch, hidden)] + [(hidden,)] * (gates == 3)
    return [rng.uniform(-3, 3, shape).astype(dtype) for shape in shapes]


OPS = ["nn.lstm_cell", "nn.gru_cell"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("batch, hidden", [(1, 1), (1, 5), (3, 7), (2, 33), (0, 4)])
@pytest.mark.parametrize("clip", [None, 0.7])
def test_numpy_kernel_types_and_shape_function(op, batch, hidden, clip):
    inputs = _inputs(op, batch, hidden)
    want = tuple(w.astype(np.float32) for w in _oracle(op, *inputs, clip=clip))
    check_op(op, inputs, {"clip": clip}, expected=want if len(want) > 1 else want[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", OPS)
def test_mismatched_shapes_and_dtypes_are_type_errors(op):
    x, r, state, *rb = (tv.ir.types.TensorType(a.shape, "float32") for a in _inputs(op, 3, 5))
    rel = tv.op.get_op(op).type_rel
    t = tv.ir.types.TensorType
    with pytest.raises(TypeInferenceError, match="x's dim 1"):
        rel([t((3, 21), "float32"), r, state, *rb], {})
    with pytest.raises(TypeInferenceError, match="batch dims of r"):
        rel([x, t((2, r.shape[1]), "float32"), state, *rb], {})
    with pytest.raises(TypeInferenceError, match="one float dtype"):
        rel([x, r, t(state.shape, "float64"), *rb], {})
    with pytest.raises(TypeInferenceError, match="2-d"):
        rel([t((15,), "float32"), r, state, *rb], {})
    if rb:
        with pytest.raises(TypeInferenceError, match="rb's dim 0"):
            rel([x, r, state, t((4,), "float32")], {})
        with pytest.raises(TypeInferenceError, match="rb must be 1-d"):
            rel([x, r, state, t((1, 5), "float32")], {})


def _program(op, dtype, clip):
    """A function of dynamic batch applying the cell, and (LSTM) returning both states."""
    gates = 4 if op == "nn.lstm_cell" else 3
    rb = ", %rb" if gates == 3 else ""
    call = f"{op}(%x, %r, %s{rb}" + ("" if clip is None else f", clip={clip}") + ")"
    param = f", %rb: Tensor[(?,), {dtype}]" if gates == 3 else ""
    ret = f"(Tensor[(?, ?), {dtype}], Tensor[(?, ?), {dtype}])" if gates == 4 else f"Tensor[(?, ?), {dtype}]"
    return tv.parse(f"""
def @main(%x: Tensor[(?, ?), {dtype}], %r: Tensor[(?, ?), {dtype}], %s: Tensor[(?, ?), {dtype}]{param}) -> {ret} {{
  {call}
}}
""")


def _values(result):
    items = result if isinstance(result, (tuple, list)) else (result,)
    return [np.asarray(v.numpy() if hasattr(v, "numpy") else v) for v in items]


@pytest.mark.skipif(not have_compiler(), reason="target c compiles C (no C compiler here)")
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype, tol", [("float32", 2e-6), ("float64", 1e-12), ("float16", 2e-3)])
def test_generated_kernel_matches_the_oracle(op, dtype, tol):
    for clip in (None, 0.7):
        exe = tv.vm.compile(_program(op, dtype, clip), target="c", exec_mode="native")
        loaded = load_executable(exe.save_bytes())
        for mode in ("bytecode", "native"):
            for which in (exe, loaded):
                vm = VirtualMachine(which.with_exec_mode(mode))
                for batch, hidden in ((1, 1), (1, 5), (3, 7), (2, 33), (1, 512)):
                    inputs = _inputs(op, batch, hidden, dtype)
                    want = _oracle(op, *inputs, clip=clip)
                    got = _values(vm.invoke("main", *inputs))
                    for g, w in zip(got, want, strict=True):
                        assert g.dtype == np.dtype(dtype)
                        np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"{mode} {batch}x{hidden}")


@pytest.mark.skipif(not have_compiler(), reason="target c compiles C (no C compiler here)")
@pytest.mark.parametrize("threads", [1, 2])
def test_generated_kernel_at_one_and_two_threads(threads):
    from tensorvm.codegen import build

    previous = build._NUM_THREADS[0]
    build.set_num_threads(threads)
    try:
        _check_threaded(seed=threads)
    finally:
        build.set_num_threads(previous)


def _check_threaded(seed):
    for op in OPS:
        # 64 x 96 elements: the kernel runs as a parallel loop (in chunks on the kernels' pool)
        vm = VirtualMachine(tv.vm.compile(_program(op, "float32", None), target="c"))
        inputs = _inputs(op, 64, 96, seed=seed)
        for g, w in zip(_values(vm.invoke("main", *inputs)), _oracle(op, *inputs), strict=True):
            np.testing.assert_allclose(g, w, rtol=2e-6, atol=2e-6)


@pytest.mark.skipif(not have_compiler(), reason="target c compiles C (no C compiler here)")
def test_a_wrong_width_is_an_error_at_run_time():
    vm = VirtualMachine(tv.vm.compile(_program("nn.lstm_cell", "float32", None), target="c"))
    x, r, state = _inputs("nn.lstm_cell", 2, 5)
    with pytest.raises(tv.errors.TensorVMError):
        vm.invoke("main", x[:, :-1], r[:, :-1], state)
    vm = VirtualMachine(tv.vm.compile(_program("nn.gru_cell", "float32", None), target="c"))
    x, r, h, rb = _inputs("nn.gru_cell", 2, 5)
    with pytest.raises(tv.errors.TensorVMError):
        vm.invoke("main", x, r, h, rb[:-1])


@pytest.mark.parametrize("clip", [-0.5, float("nan")])
def test_a_negative_clip_is_an_attribute_error(clip):
    with pytest.raises(tv.errors.AttrError, match="clip"):
        tv.op.get_op("nn.lstm_cell").normalize_attrs({"clip": clip})


@pytest.mark.parametrize("op", OPS)
def test_the_numpy_kernel_does_not_broadcast_a_batch_of_one(op):
    # Regression: the kernel broadcast r of batch 1 against x of batch 2 where the C kernel and the shape
    # function raise (tests/ops/test_shape_logic.py found it).
    x, r, state, *rb = _inputs(op, 2, 3)
    with pytest.raises(tv.errors.ShapeError, match="batch dims of r"):
        tv.op.get_op(op).kernel({}, x, r[:1], state, *rb)


def _to_iofc(a, order):
    """``a``'s gate blocks, laid out in ``order``, rearranged into ONNX's ``iofc``."""
    blocks = np.split(np.asarray(a), 4, axis=1)
    return np.concatenate([blocks[order.index(g)] for g in "iofc"], axis=1)


@pytest.mark.parametrize("order", ["ifco", "cfoi", "iofc"])
def test_the_gate_order_attribute(order):
    # PyTorch's order (ifco) and an arbitrary one: the kernels read the blocks where `gates` puts them
    x, r, state = _inputs("nn.lstm_cell", 3, 7, seed=5)
    want = _oracle("nn.lstm_cell", _to_iofc(x, order), _to_iofc(r, order), state)
    for got, w in zip(tv.op.get_op("nn.lstm_cell").kernel(
            tv.op.get_op("nn.lstm_cell").normalize_attrs({"gates": order}), x, r, state), want, strict=True):
        np.testing.assert_allclose(got, w, rtol=2e-6, atol=2e-6)
    if not have_compiler():
        return
    mod = tv.parse(f"""
def @main(%x: Tensor[(?, ?), float32], %r: Tensor[(?, ?), float32], %s: Tensor[(?, ?), float32]) {{
  nn.lstm_cell(%x, %r, %s, gates="{order}")
}}
""")
    for mode in ("bytecode", "native"):
        vm = VirtualMachine(tv.vm.compile(mod, target="c", exec_mode="native").with_exec_mode(mode))
        for g, w in zip(_values(vm.invoke("main", x, r, state)), want, strict=True):
            np.testing.assert_allclose(g, w, rtol=2e-6, atol=2e-6, err_msg=mode)


@pytest.mark.parametrize("order", ["ifc", "iofo", "iofcx", ""])
def test_a_gate_order_that_is_not_a_permutation_is_an_attribute_error(order):
    with pytest.raises(tv.errors.AttrError, match="gates"):
        tv.op.get_op("nn.lstm_cell").normalize_attrs({"gates": order})
