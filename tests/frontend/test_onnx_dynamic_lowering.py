"""ONNX forms whose axes, pads, split sizes or training flag are run-time tensors (graph inputs) lower to
core ops (the ``dyn.*`` ops of ``op/dynamic.py`` among them) that run natively on target c: no NumPy
fallback, and target c, target python and the interpreter agree with ONNX's reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from test_onnx_core_lowering import check_lowered, make_model  # noqa: E402
from test_onnx_importer import ops_of, reference  # noqa: E402

import tensorvm as tv  # noqa: E402
from tensorvm.errors import ExecutionError, ModelImportError, ShapeError, UnsupportedError  # noqa: E402
from tensorvm.frontend import from_onnx  # noqa: E402
from tensorvm.op import get_op, op_names  # noqa: E402

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
X = (np.arange(3 * 4 * 5, dtype=np.float32).reshape(3, 4, 5) * 0.37 - 7).astype(np.float32)


def test_no_onnx_data_movement_op_is_registered():
    """ONNX-only semantics are not core ops: onnx.matmul is the one onnx.* op left."""
    assert [n for n in op_names() if n.startswith("onnx.")] == ["onnx.matmul"]


@pytest.mark.parametrize("axes", [[0, -1], [1], [3, 0, 2]])
@pytest.mark.parametrize("dynamic_shape", [False, True])
def test_unsqueeze_with_run_time_axes(axes, dynamic_shape):
    node = helper.make_node("Unsqueeze", ["x", "axes"], ["y"])
    shape = ["a", 4, "b"] if dynamic_shape else list(X.shape)
    model = make_model([node], [("x", F32, shape), ("axes", I64, [len(axes)])], [("y", F32, None)])
    check_lowered(model, X, np.array(axes, np.int64), ops=("dyn.unsqueeze",))


def test_unsqueeze_with_axes_of_unknown_length_is_unsupported():
    node = helper.make_node("Unsqueeze", ["x", "axes"], ["y"])
    model = make_model([node], [("x", F32, [3, 4, 5]), ("axes", I64, ["k"])], [("y", F32, None)])
    with pytest.raises(UnsupportedError, match="'axes'"):
        from_onnx(model)


def test_unsqueeze_with_a_repeated_run_time_axis_is_an_error():
    node = helper.make_node("Unsqueeze", ["x", "axes"], ["y"])
    model = make_model([node], [("x", F32, [3, 4, 5]), ("axes", I64, [2])], [("y", F32, None)])
    mod, params = from_onnx(model)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params))
    with pytest.raises(ShapeError, match="repeated"):
        vm.invoke("main", X, np.array([1, 1], np.int64))


@pytest.mark.parametrize("split", [[1, 3], [4, 0], [0, 4]])
@pytest.mark.parametrize("dynamic_shape", [False, True])
def test_split_with_run_time_sizes(split, dynamic_shape):
    node = helper.make_node("Split", ["x", "split"], ["y0", "y1"], axis=1)
    shape = ["a", "b", 5] if dynamic_shape else list(X.shape)
    model = make_model([node], [("x", F32, shape), ("split", I64, [2])], [("y0", F32, None), ("y1", F32, None)])
    check_lowered(model, X, np.array(split, np.int64), ops=("dyn.split",))


def test_split_of_a_dynamic_dim_into_equal_parts():
    node = helper.make_node("Split", ["x"], ["y0", "y1", "y2"], axis=-1, num_outputs=3)
    model = make_model([node], [("x", F32, [3, 4, "n"])], [(f"y{i}", F32, None) for i in range(3)])
    check_lowered(model, X, ops=("dyn.split",))  # 5 -> 2, 2, 1


def test_split_sizes_that_do_not_add_up_are_an_error():
    node = helper.make_node("Split", ["x", "split"], ["y0", "y1"], axis=1)
    model = make_model([node], [("x", F32, [3, 4, 5]), ("split", I64, [2])], [("y0", F32, None), ("y1", F32, None)])
    mod, params = from_onnx(model)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params))
    with pytest.raises(ShapeError, match="add up"):
        vm.invoke("main", X, np.array([1, 2], np.int64))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[1, 0, 2, 2, 3, 1], [-1, 1, 0, 1, -2, 3], [0, 0, 0, 0, 0, 0]])
def test_pad_with_run_time_pads(mode, pads):
    node = helper.make_node("Pad", ["x", "pads", "value"], ["y"], mode=mode)
    model = make_model([node], [("x", F32, ["a", 4, 5]), ("pads", I64, [6]), ("value", F32, [])], [("y", F32, None)])
    args = (X, np.array(pads, np.int64), np.array(2.5, np.float32))
    # ONNX Runtime is the oracle: the reference evaluator rejects negative pads. (ONNX Runtime's reflect
    # pads are at most the axis length - 1; dyn.pad reflects again beyond, as np.pad does.)
    check_lowered(model, *args, ops=("dyn.pad",), expected=reference(model, *args, oracle="ort"))


def test_pad_with_pads_of_unknown_length():
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="edge")
    model = make_model([node], [("x", F32, [3, 4, 5]), ("pads", I64, ["n"])], [("y", F32, None)])
    args = (X, np.array([1, 0, -2, 0, 2, 1], np.int64))
    check_lowered(model, *args, ops=("dyn.pad",), expected=reference(model, *args, oracle="ort"))
    mod, params = from_onnx(model)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params))
    with pytest.raises(ShapeError, match="2 x rank"):
        vm.invoke("main", X, np.array([1, 0], np.int64))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_with_run_time_axes(mode):
    node = helper.make_node("Pad", ["x", "pads", "value", "axes"], ["y"], mode=mode)
    inputs = [("x", F32, [3, 4, 5]), ("pads", I64, [4]), ("value", F32, []), ("axes", I64, [2])]
    model = make_model([node], inputs, [("y", F32, None)])
    args = (X, np.array([2, -1, 1, 1], np.int64), np.array(-1, np.float32), np.array([-1, 0], np.int64))
    check_lowered(model, *args, ops=("dyn.pad",), expected=reference(model, *args, oracle="ort"))


@pytest.mark.parametrize("pads, mode", [([1, -1, 0, 0, 2, -2], "constant"), ([2, 0, 0, 7, 0, 1], "wrap")])
def test_pad_with_constant_pads_beyond_nn_pad(pads, mode):
    """Negative pads and wrap mode are dyn.pad with constant pads: the exact type is known."""
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)
    model = make_model([node], [("x", F32, [3, 4, 5])], [("y", F32, None)], {"pads": np.array(pads, np.int64)})
    check_lowered(model, X, ops=("dyn.pad",), expected=reference(model, X, oracle="ort"))


MODES = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
         "ReduceSumSquare", "ReduceLogSumExp", "ReduceLogSum"]


@pytest.mark.parametrize("op_type", MODES)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_with_run_time_axes(op_type, keepdims):
    node = helper.make_node(op_type, ["x", "axes"], ["y"], keepdims=keepdims)
    x = np.abs(X) / 10 + 0.5 if op_type in ("ReduceProd", "ReduceLogSum") else X
    model = make_model([node], [("x", F32, ["a", 4, "b"]), ("axes", I64, [2])], [("y", F32, None)])
    for axes in ([0, -1], [2, 1]):
        check_lowered(model, x, np.array(axes, np.int64), ops=("dyn.reduce",), rtol=1e-5)


@pytest.mark.parametrize("noop", [0, 1])
def test_reduce_with_run_time_empty_axes(noop):
    node = helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=1, noop_with_empty_axes=noop)
    model = make_model([node], [("x", F32, [3, 4, 5]), ("axes", I64, ["k"])], [("y", F32, None)])
    check_lowered(model, X, np.zeros(0, np.int64), ops=("dyn.reduce",))
    check_lowered(model, X, np.array([1], np.int64), ops=("dyn.reduce",))


@pytest.mark.parametrize("op_type", MODES)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_over_no_axes_keeps_its_elementwise_part(op_type, keepdims):
    """noop_with_empty_axes=1 without axes reduces over no axes: what is left is the reduction's elementwise
    part (ReduceL1 and ReduceL2 abs, ReduceSumSquare the square, ReduceLogSum log; the input itself for the
    others), not the input unchanged."""
    node = helper.make_node(op_type, ["x"], ["y"], keepdims=keepdims, noop_with_empty_axes=1)
    x = np.abs(X) / 10 + 0.5 if op_type == "ReduceLogSum" else X
    model = make_model([node], [("x", F32, [3, 4, 5])], [("y", F32, None)])
    check_lowered(model, x, rtol=1e-5)


@pytest.mark.parametrize("op_type", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceMean"])
def test_reduce_over_an_empty_axis_gives_the_identity(op_type):
    node = helper.make_node(op_type, ["x", "axes"], ["y"], keepdims=0)
    model = make_model([node], [("x", TensorProto.INT32, [2, 0, 3])], [("y", TensorProto.INT32, None)],
                       {"axes": np.array([1], np.int64)})
    x = np.zeros((2, 0, 3), np.int32)
    identity = {"ReduceSum": 0, "ReduceMax": np.iinfo(np.int32).min, "ReduceMin": np.iinfo(np.int32).max,
                "ReduceProd": 1, "ReduceMean": 0}[op_type]
    check_lowered(model, x, ops=("dyn.reduce",), expected=[np.full((2, 3), identity, np.int32)])


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_resize_to_sizes_keeping_the_aspect_ratio_samples_with_one_scale(policy, mode):
    """Resize (opset 18) to ``sizes`` with keep_aspect_ratio_policy: every resized axis is sampled with the
    one kept ratio (min / max of sizes / input), not with its own output / input (which the rounding of
    each output dim makes differ: 4 x 6 to at most 5 x 5 is 3 x 5, ratio 5/6, but 3/4 and 5/6 per axis),
    against ONNX's reference evaluator."""
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode, axes=[2, 3],
                            keep_aspect_ratio_policy=policy)
    model = make_model([node], [("x", F32, [1, 2, "h", "w"])], [("y", F32, None)], {"sizes": np.array([5, 5], np.int64)})
    for shape in ((1, 2, 4, 6), (1, 2, 7, 3)):
        check_lowered(model, np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32), rtol=1e-5,
                      atol=1e-6)  # (the reference sums its cubic taps in float32)


@pytest.mark.parametrize("mode, nearest_mode", [("nearest", "round_prefer_floor"), ("nearest", "ceil"),
                                                ("linear", "floor")])
def test_resize_11_with_tf_half_pixel_for_nn(mode, nearest_mode):
    """Opset 11's coordinate_transformation_mode tf_half_pixel_for_nn: x_original = (x + 0.5) / scale,
    half_pixel without its - 0.5; an axis of scale 1 keeps its positions. Against ONNX Runtime (the
    reference evaluator lacks the mode)."""
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode=mode, nearest_mode=nearest_mode,
                            coordinate_transformation_mode="tf_half_pixel_for_nn")
    model = make_model([node], [("x", F32, [1, 2, 3, 4])], [("y", F32, None)],
                       {"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 0.75], np.float32)}, opset=11)
    x = np.random.default_rng(3).standard_normal((1, 2, 3, 4)).astype(np.float32)
    check_lowered(model, x, ops=("image.resize",), expected=reference(model, x, oracle="ort"), rtol=1e-5,
                  atol=1e-6)


@pytest.mark.parametrize("mode, transform", [("linear", "align_corners"), ("cubic", "align_corners"),
                                             ("linear", "tf_crop_and_resize")])
def test_resize_by_a_scale_that_rounds_the_output_from_pytorch_divides_by_the_output_length(mode, transform):
    """PyTorch's align_corners (what its exporter writes for F.interpolate(scale_factor=s, align_corners=True))
    divides by the output's own length less one (2 rows from 5 at scale 0.5: by 1), as ONNX Runtime does for
    every model; so does tf_crop_and_resize. Against ONNX Runtime, three shapes through one executable. A model
    from another producer keeps the spec's unrounded length (ONNX's own tests: 4 columns at 0.6 divide by 1.4),
    against ONNX's reference evaluator."""
    roi = np.array([0, 0, 0.1, 0.2, 1, 1, 0.9, 0.7], np.float32) if transform == "tf_crop_and_resize" else np.zeros(0, np.float32)
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode=mode, coordinate_transformation_mode=transform)
    model = make_model([node], [("x", F32, ["n", 2, "h", "w"])], [("y", F32, None)],
                       {"roi": roi, "scales": np.array([1, 1, 0.5, 1.5], np.float32)}, opset=13)
    spec = type(model)()
    spec.CopyFrom(model)
    model.producer_name = "pytorch"
    for shape in ((2, 2, 5, 7), (1, 2, 9, 9), (1, 2, 8, 3)):
        x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
        check_lowered(model, x, ops=("image.resize",), expected=reference(model, x, oracle="ort"), rtol=1e-5,
                      atol=1e-5)
        if transform == "align_corners":
            check_lowered(spec, x, ops=("image.resize",), expected=reference(spec, x), rtol=1e-5, atol=1e-5)


def test_split_sizes_must_add_up_to_the_axis():
    """Split's sizes (known at import) must add up to the axis, as ONNX Runtime checks: refused at import for a
    static axis, a ShapeError at run time for a dynamic one (the last part had silently taken the rest; torch
    exports x.split(2, 1) with the sizes of the traced length), on every executor."""
    node = helper.make_node("Split", ["x", "s"], ["a", "b", "c"], axis=1)
    outputs = [(k, F32, None) for k in "abc"]
    model = make_model([node], [("x", F32, [2, "n", 3])], outputs, {"s": np.array([2, 2, 2], np.int64)}, opset=13)
    mod, params = from_onnx(model)
    runs = [tv.vm.VirtualMachine(tv.vm.compile(mod, target=t, exec_mode=m, params=params)).run
            for t, m in (("c", "bytecode"), ("c", "native"), ("python", "bytecode"))]
    for run in runs:
        x = np.arange(36, dtype=np.float32).reshape(2, 6, 3)
        for got, want in zip(run(x), np.split(x, 3, axis=1), strict=True):
            np.testing.assert_array_equal(got.numpy(), want)
        for n in (5, 7):
            with pytest.raises(ShapeError, match="add up to the axis size"):
                run(np.zeros((2, n, 3), np.float32))
    static = make_model([node], [("x", F32, [2, 5, 3])], outputs, {"s": np.array([2, 2, 2], np.int64)}, opset=13)
    with pytest.raises(ModelImportError, match="adding up to the axis size 5"):
        from_onnx(static)


@pytest.mark.parametrize("k_known", [True, False])
def test_top_k_of_zero_selects_nothing(k_known):
    """TopK with K = 0 (known at import or a run-time input) gives empty values and indices along the axis;
    Relay's topk takes k < 1 for the whole axis."""
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1)
    outputs = [("values", F32, None), ("indices", I64, None)]
    if k_known:
        model = make_model([node], [("x", F32, [3, 4, 5])], outputs, {"k": np.array([0], np.int64)})
        check_lowered(model, X, ops=("topk",))
        return
    model = make_model([node], [("x", F32, [3, 4, 5]), ("k", I64, [1])], outputs)
    for k in (0, 3):
        check_lowered(model, X, np.array([k], np.int64), ops=("topk",))


def test_softplus_of_large_inputs_is_finite():
    """Softplus as max(x, 0) + log1p(exp(-|x|)): log(1 + exp(x)) overflowed float32 to inf from x = 88.7 on,
    where softplus is x itself, and lost every digit below x = -17 (where it is exp(x), not 0)."""
    x = np.array([[-1000, -100, -20, -1, 0, 1, 20, 80, 89, 100, 1000, 3e38]], np.float32)
    model = make_model([helper.make_node("Softplus", ["x"], ["y"])], [("x", F32, [1, "n"])], [("y", F32, None)])
    check_lowered(model, x, expected=[np.logaddexp(np.float32(0), x)], rtol=1e-6)


def test_gather_with_an_index_out_of_range_at_run_time_is_an_error():
    """Gather's indices known only at run time: those in [-n, n) pick their element (negative ones from the
    end), one outside is an ExecutionError on every executor (it had wrapped around: index 3 of 3 elements
    gave the first, as an embedding lookup of an unknown token would give another token's row)."""
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=0)
    model = make_model([node], [("x", F32, [3, 2]), ("i", I64, ["k"])], [("y", F32, None)])
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    check_lowered(model, x, np.array([2, -3, 0, -1], np.int64))
    mod, params = from_onnx(model)
    runs = [tv.vm.VirtualMachine(tv.vm.compile(mod, target=target, params=params)).invoke for target in ("c", "python")]
    runs.append(lambda name, *args: tv.create_executor("debug", mod).evaluate()(*args))
    for run in runs:
        for bad in (3, -4, 1000):
            with pytest.raises(ExecutionError, match="out of range"):
                run("main", x, np.array([0, bad], np.int64))


@pytest.mark.parametrize("opset, mode, padding, align", [
    (16, "bilinear", "zeros", 0), (16, "bilinear", "reflection", 1), (16, "nearest", "border", 0),
    (16, "nearest", "reflection", 0), (16, "bicubic", "border", 1), (16, "bicubic", "zeros", 0),
    (20, "linear", "border", 1), (20, "cubic", "reflection", 0), (20, "nearest", "zeros", 1)])
def test_grid_sample_matches_onnxruntime(opset, mode, padding, align):
    """GridSample (opset 16's mode names and opset 20's) as image.grid_sample over the grid with its coordinates
    moved first, against onnxruntime (PyTorch's sampling: ONNX's reference evaluator pads cubic taps
    differently at the border), grid points inside and outside [-1, 1], two shapes through one executable."""
    ort = pytest.importorskip("onnxruntime")
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=padding, align_corners=align)
    model = make_model([node], [("x", F32, ["n", 3, "h", "w"]), ("g", F32, ["n", "ho", "wo", 2])], [("y", F32, None)],
                       opset=opset)
    mod, params = from_onnx(model)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(opset + len(mode) + align)
    for shape, grid_shape in (((2, 3, 5, 7), (2, 4, 6, 2)), ((1, 3, 9, 4), (1, 3, 2, 2))):
        x = rng.standard_normal(shape).astype(np.float32)
        grid = rng.uniform(-1.3, 1.3, grid_shape).astype(np.float32)
        want = session.run(None, {"x": x, "g": grid})[0]
        np.testing.assert_allclose(vm.invoke("main", x, grid).numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op_type, low, high", [("Asin", -1, 1), ("Acos", -1, 1), ("Atan", -50, 50), ("Sinh", -9, 9),
                                                ("Cosh", -9, 9), ("Asinh", -50, 50), ("Acosh", 1, 50),
                                                ("Atanh", -0.99, 0.99), ("Mish", -30, 100)])
def test_inverse_and_hyperbolic_trigonometry_and_mish(op_type, low, high):
    """The ONNX ops that were refused as unsupported, against ONNX's reference evaluator (NumPy) on every
    executor, a dynamic length."""
    x = np.random.default_rng(len(op_type)).uniform(low, high, (1, 37)).astype(np.float32)
    model = make_model([helper.make_node(op_type, ["x"], ["y"])], [("x", F32, [1, "n"])], [("y", F32, None)])
    check_lowered(model, x, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [TensorProto.UINT8, TensorProto.UINT32, TensorProto.UINT64])
def test_bit_shift(direction, dtype):
    """BitShift of unsigned integers by a broadcast amount, against ONNX's reference evaluator."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    bits = np.dtype(np_dtype).itemsize * 8
    rng = np.random.default_rng(bits)
    x = rng.integers(0, np.iinfo(np_dtype).max, (3, 5), dtype=np_dtype)
    amount = rng.integers(0, bits, (1, 5)).astype(np_dtype)
    node = helper.make_node("BitShift", ["x", "s"], ["y"], direction=direction)
    model = make_model([node], [("x", dtype, ["m", 5]), ("s", dtype, [1, 5])], [("y", dtype, None)])
    check_lowered(model, x, amount)


@pytest.mark.parametrize("op_type, identity", [("ReduceMax", -np.inf), ("ReduceMin", np.inf)])
def test_max_and_min_over_a_symbolic_dim_that_is_empty_at_run_time(op_type, identity):
    """ONNX 18's identity of an empty max / min when the reduced dim is symbolic in the model (it was a
    ShapeError there, and -inf / +inf only where the dim was a static 0); the same executable also reduces
    that dim when it is not empty."""
    node = helper.make_node(op_type, ["x", "axes"], ["y"], keepdims=0)
    model = make_model([node], [("x", F32, [2, "n"])], [("y", F32, None)], {"axes": np.array([1], np.int64)})
    check_lowered(model, np.zeros((2, 0), np.float32), expected=[np.full(2, identity, np.float32)])
    x = np.random.default_rng(3).standard_normal((2, 5)).astype(np.float32)
    check_lowered(model, x, expected=[x.max(axis=1) if op_type == "ReduceMax" else x.min(axis=1)])


@pytest.mark.parametrize("op_type", ["ReduceMax", "ReduceMin"])
def test_bool_reduce_with_run_time_axes(op_type):
    node = helper.make_node(op_type, ["x", "axes"], ["y"], keepdims=0)
    model = make_model([node], [("x", BOOL, [3, 4]), ("axes", I64, [1])], [("y", BOOL, None)], opset=20)
    x = np.array([[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]], bool)
    check_lowered(model, x, np.array([1], np.int64), ops=("dyn.reduce",))


@pytest.mark.parametrize("op_type, identity", [("ReduceMax", False), ("ReduceMin", True)])
def test_bool_reduce_over_an_empty_axis(op_type, identity):
    node = helper.make_node(op_type, ["x", "axes"], ["y"], keepdims=1)
    model = make_model([node], [("x", BOOL, [2, 0, 4])], [("y", BOOL, None)], {"axes": np.array([1], np.int64)},
                       opset=20)
    check_lowered(model, np.zeros((2, 0, 4), bool), ops=("dyn.reduce",), expected=[np.full((2, 1, 4), identity)])


def test_reduce_keepdims_0_with_axes_of_unknown_length_is_unsupported():
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)
    model = make_model([node], [("x", F32, [3, 4, 5]), ("axes", I64, ["k"])], [("y", F32, None)])
    with pytest.raises(UnsupportedError, match="'axes'"):
        from_onnx(model)


@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("dtype", [F32, TensorProto.INT32])
def test_cumsum_with_a_run_time_axis(exclusive, reverse, dtype):
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    model = make_model([node], [("x", dtype, ["a", 4, 5]), ("axis", I64, [])], [("y", dtype, None)])
    x = X if dtype == F32 else np.arange(60, dtype=np.int32).reshape(3, 4, 5) - 20
    for axis in (0, -2, 2):
        check_lowered(model, x, np.array(axis, np.int64), ops=("dyn.cumsum",), rtol=1e-5)


def test_cumsum_with_an_out_of_range_run_time_axis_is_an_error():
    node = helper.make_node("CumSum", ["x", "axis"], ["y"])
    model = make_model([node], [("x", F32, [3, 4, 5]), ("axis", I64, [])], [("y", F32, None)])
    mod, params = from_onnx(model)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params))
    with pytest.raises(ShapeError, match="out of range"):
        vm.invoke("main", X, np.array(3, np.int64))


def _dropout_model():
    node = helper.make_node("Dropout", ["x", "ratio", "training"], ["y", "mask"])
    inputs = [("x", F32, ["a", 4, 5]), ("ratio", F32, []), ("training", BOOL, [])]
    return make_model([node], inputs, [("y", F32, None), ("mask", BOOL, None)])


@pytest.mark.parametrize("ratio, training", [(0.5, False), (0.0, True), (0.0, False)])
def test_dropout_with_a_run_time_training_flag(ratio, training):
    check_lowered(_dropout_model(), X, np.array(ratio, np.float32), np.array(training), ops=("dyn.nn.dropout",))


def test_random_training_dropout_is_an_error_on_target_c():
    mod, params = from_onnx(_dropout_model())
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params))
    with pytest.raises((ExecutionError, ShapeError), match="random"):
        vm.invoke("main", X, np.array(0.5, np.float32), np.array(True))


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("is_sorted", [1, 0])
def test_unique_along_an_axis_is_core_ops(axis, is_sorted):
    x = np.array([[[1, 2], [1, 2], [0, 5]], [[1, 2], [1, 2], [0, 5]], [[3, 1], [3, 1], [0, 5]],
                  [[1, 2], [1, 2], [0, 5]]], np.float32)
    node = helper.make_node("Unique", ["x"], ["y", "indices", "inverse", "counts"], axis=axis, sorted=is_sorted)
    outputs = [("y", F32, None)] + [(n, I64, None) for n in ("indices", "inverse", "counts")]
    model = make_model([node], [("x", F32, ["n", 3, 2])], outputs)
    # The oracle: NumPy's unique along the axis, reordered by first occurrence when unsorted.
    values, first, inverse, counts = np.unique(x, axis=axis, return_index=True, return_inverse=True,
                                               return_counts=True)
    if not is_sorted:
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        values, first, counts, inverse = np.take(values, order, axis=axis), first[order], counts[order], \
            rank[inverse.reshape(-1)]
    expected = [values, first.astype(np.int64), inverse.reshape(-1).astype(np.int64), counts.astype(np.int64)]
    check_lowered(model, x, ops=("unique",), expected=expected)
    assert "onnx.unique" not in ops_of(from_onnx(model)[0])


def test_dyn_ops_have_computes():
    for name in ("dyn.unsqueeze", "dyn.split", "dyn.pad", "dyn.reduce", "dyn.cumsum", "dyn.nn.dropout"):
        assert get_op(name).compute is not None, name


@pytest.mark.parametrize("mode", ["reflect", "wrap"])
def test_run_time_pads_wider_than_the_axis_fold_as_numpy_pad(mode):
    """dyn.pad reflects (or wraps) again where a pad exceeds the axis, as np.pad does (ONNX Runtime
    rejects such reflect pads; the oracle is NumPy)."""
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)
    model = make_model([node], [("x", F32, ["n", 2]), ("pads", I64, [4])], [("y", F32, None)])
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    pads = np.array([5, 3, 4, 6], np.int64)
    expected = np.pad(x, [(5, 4), (3, 6)], mode=mode)
    check_lowered(model, x, pads, ops=("dyn.pad",), expected=[expected])
    one = np.ones((1, 2), np.float32)  # a one-element axis reflects to itself
    check_lowered(model, one, pads, ops=("dyn.pad",), expected=[np.pad(one, [(5, 4), (3, 6)], mode=mode)])


@pytest.mark.parametrize("axis_shape", [[1], ["k"]])
def test_cumsum_with_a_one_element_run_time_axis(axis_shape):
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], reverse=1)
    model = make_model([node], [("x", F32, [3, 4, 5]), ("axis", I64, axis_shape)], [("y", F32, None)])
    # (ONNX says a 0-d axis; the reference evaluator rejects this form: NumPy is the oracle)
    expected = np.flip(np.cumsum(np.flip(X, 1), 1), 1)
    check_lowered(model, X, np.array([1], np.int64), ops=("dyn.cumsum",), rtol=1e-5, expected=[expected])


def test_edge_padding_of_an_empty_axis_is_an_error():
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="edge")
    model = make_model([node], [("x", F32, ["n", 2]), ("pads", I64, [4])], [("y", F32, None)])
    mod, params = from_onnx(model)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params))
    with pytest.raises(ShapeError, match="no elements"):
        vm.invoke("main", np.zeros((0, 2), np.float32), np.array([1, 0, 0, 0], np.int64))
    with pytest.raises(ShapeError, match="no elements"):  # (cropped away, then padded)
        vm.invoke("main", np.ones((2, 2), np.float32), np.array([1, 0, -2, 0], np.int64))


def test_integer_mean_over_run_time_axes_rounds_toward_zero():
    """As the static ReduceMean (core mean) and ONNX's reference do."""
    node = helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0)
    model = make_model([node], [("x", TensorProto.INT32, [2, 3]), ("axes", I64, [1])],
                       [("y", TensorProto.INT32, None)])
    x = np.array([[-3, -2, -2], [7, 1, 0]], np.int32)
    check_lowered(model, x, np.array([1], np.int64), ops=("dyn.reduce",), expected=[np.array([-2, 2], np.int32)])
