"""ONNX converters emit core ops (no ``onnx.*`` op in the imported module), which run natively: every case
runs on target c (NumPy fallbacks only for the core ops in ``NO_COMPUTE_YET``), on target python and on the
interpreter, against ONNX's reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402
from test_onnx_importer import make_model as make_model_17  # noqa: E402
from test_onnx_importer import ops_of as op_names  # noqa: E402

import tensorvm as tv  # noqa: E402
from tensorvm.frontend import from_onnx  # noqa: E402

F32, I64 = TensorProto.FLOAT, TensorProto.INT64

# Core ops these converters emit that have no compute or library call yet: the C build runs them on
# NumPy. Each must leave this set once it has one (cumsum and unique did).
NO_COMPUTE_YET: set = set()


def make_model(nodes, inputs, outputs, initializers=(), opset=18):
    return make_model_17(nodes, inputs, outputs, initializers, opset)


def check_lowered(model, *args, ops=(), expected=None, rtol=1e-6, atol=0.0):
    """Import ``model``: no onnx.* op, each of ``ops`` present; then every executor matches the reference,
    and the C build has a C kernel for every fused group but those of ops in ``NO_COMPUTE_YET``."""
    mod, params = from_onnx(model)
    names = op_names(mod)
    assert not {n for n in names if n.startswith("onnx.")}, names
    assert set(ops) <= names, names
    names_in = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    if expected is None:
        expected = ReferenceEvaluator(model).run(None, dict(zip(names_in, args, strict=True)))
    exe_c = tv.vm.compile(mod, target="c", params=params)
    fallbacks = exe_c.stats()["kernel_library"]["numpy_fallbacks"]
    assert all(any(f"operator {op} has" in why for op in NO_COMPUTE_YET & names) for why in fallbacks.values()), \
        fallbacks
    results = {target: tv.vm.VirtualMachine(exe).invoke("main", *args)
               for target, exe in (("c", exe_c), ("python", tv.vm.compile(mod, target="python", params=params)))}
    bound = [params[p.name_hint] for p in mod["main"].params[len(args):]]
    results["interpreter"] = tv.create_executor("debug", mod).evaluate()(*args, *bound)
    for where, out in results.items():
        outs = [o.numpy() for o in out] if isinstance(out, tuple) else [out.numpy()]
        assert len(outs) == len(expected), where
        for got, want in zip(outs, expected, strict=True):
            assert got.shape == want.shape, (where, got.shape, want.shape)
            assert got.dtype == want.dtype, (where, got.dtype, want.dtype)
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=where)


X = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ([1, -4], [3, 100], [0, 2], [1, 2]),             # axes known: only those dims become run-time ones
    ([-1], [-100], [1], [-2]),                       # a negative step clamped at the start
    ([0, 1], [2, 9223372036854775807], None, None),  # no axes: the first len(starts) axes
])
def test_slice_with_run_time_bounds_is_dyn_strided_slice(starts, ends, axes, steps):
    inputs = [("x", F32, list(X.shape)), ("starts", I64, [len(starts)]), ("ends", I64, [len(ends)])]
    args = [X, np.array(starts, np.int64), np.array(ends, np.int64)]
    names = ["x", "starts", "ends"]
    initializers = {}
    if axes is not None:  # constant axes and steps: an initializer the importer reads
        initializers["axes"] = np.array(axes, np.int64)
        names.append("axes")
    if steps is not None:
        initializers["steps"] = np.array(steps, np.int64)
        names.append("steps")
    node = helper.make_node("Slice", names, ["y"])
    model = make_model([node], inputs, [("y", F32, None)], initializers)
    check_lowered(model, *args, ops=("dyn.strided_slice",))


def test_slice_with_run_time_axes():
    """Axes known only at run time (negative ones too) pick which dims the bounds slice."""
    names = ["x", "starts", "ends", "axes", "steps"]
    inputs = [("x", F32, list(X.shape))] + [(n, I64, [2]) for n in names[1:]]
    node = helper.make_node("Slice", names, ["y"])
    model = make_model([node], inputs, [("y", F32, None)])
    args = [X, np.array([4, 1], np.int64), np.array([-1, 100], np.int64), np.array([-1, 0], np.int64),
            np.array([1, 2], np.int64)]
    check_lowered(model, *args, ops=("dyn.strided_slice",))


@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum_with_a_constant_axis_is_core_cumsum(exclusive, reverse):
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    model = make_model([node], [("x", F32, [4, 5, 6])], [("y", F32, None)], {"axis": np.array(-2, np.int64)})
    check_lowered(model, X, ops=("cumsum",) + (("reverse",) if reverse else ()))


@pytest.mark.parametrize("depth_known", [True, False])
def test_one_hot_is_core_one_hot(depth_known):
    """Negative indices count from depth; out-of-range ones give a row of off values."""
    node = helper.make_node("OneHot", ["indices", "depth", "values"], ["y"], axis=1)
    indices = np.array([[0, -1, 3], [7, -4, 2]], np.int64)
    inputs = [("indices", I64, [2, 3])]
    initializers = {"values": np.array([-2.0, 5.0], np.float32)}
    args = [indices]
    if depth_known:
        initializers["depth"] = np.array(4.0, np.float32)  # (any numeric type)
    else:
        inputs.append(("depth", I64, []))
        args.append(np.array(4, np.int64))
    model = make_model([node], inputs, [("y", F32, None)], initializers)
    mod, _ = from_onnx(model)
    assert ("one_hot" if depth_known else "dyn.one_hot") in op_names(mod)
    if depth_known:  # (dyn.one_hot has no compute yet)
        check_lowered(model, *args)
    else:
        expected = ReferenceEvaluator(model).run(None, {"indices": indices, "depth": args[1]})[0]
        got = tv.vm.VirtualMachine(tv.vm.compile(mod, target="python")).invoke("main", *args).numpy()
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("is_sorted", [0, 1])
def test_unique_without_axis_is_core_unique(is_sorted):
    node = helper.make_node("Unique", ["x"], ["y", "indices", "inverse", "counts"], sorted=is_sorted)
    outputs = [("y", F32, None)] + [(n, I64, None) for n in ("indices", "inverse", "counts")]
    model = make_model([node], [("x", F32, [2, 4])], outputs)
    # By hand (the reference evaluator fails on sorted=0): the flattened input is 3 1 3 2 1 1 5 2.
    if is_sorted:
        expected = [[1, 2, 3, 5], [1, 3, 0, 6], [2, 0, 2, 1, 0, 0, 3, 1], [3, 2, 2, 1]]
    else:
        expected = [[3, 1, 2, 5], [0, 1, 3, 6], [0, 1, 0, 2, 1, 1, 3, 2], [2, 3, 2, 1]]
    expected = [np.array(expected[0], np.float32)] + [np.array(e, np.int64) for e in expected[1:]]
    check_lowered(model, np.array([[3, 1, 3, 2], [1, 1, 5, 2]], np.float32), ops=("unique",), expected=expected)


@pytest.mark.parametrize("op_type, core", [("ReduceMax", "any"), ("ReduceMin", "all")])
def test_bool_max_and_min_reductions_are_any_and_all(op_type, core):
    node = helper.make_node(op_type, ["x", "axes"], ["y"], keepdims=0)
    model = make_model([node], [("x", TensorProto.BOOL, [3, 4])], [("y", TensorProto.BOOL, None)],
                       {"axes": np.array([1], np.int64)}, opset=20)
    x = np.array([[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]], bool)
    check_lowered(model, x, ops=(core,))


@pytest.mark.parametrize("base, exponent", [(np.int64, np.float32), (np.int32, np.float64), (np.uint8, np.float16),
                                            (np.float16, np.float32)])
def test_pow_computes_in_the_common_dtype_of_its_operands(base, exponent):
    """Pow with an exponent of another dtype (opset 12 on) computes np.power(x, y).astype(x.dtype), as the
    reference op does: an integer base to a float exponent is not taken to the exponent truncated."""
    t = {np.dtype(d): helper.np_dtype_to_tensor_dtype(np.dtype(d)) for d in (base, exponent)}
    model = make_model([helper.make_node("Pow", ["x", "y"], ["z"])],
                       [("x", t[np.dtype(base)], [5]), ("y", t[np.dtype(exponent)], [5])], [("z", t[np.dtype(base)], None)],
                       opset=15)
    check_lowered(model, np.array([5, 2, 9, 10, 3], base), np.array([1.7, 0.5, 0.5, 2.4, 1], exponent), rtol=1e-3)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, 3])
@pytest.mark.parametrize("declared", [[1, 0, 5], ["a", "b", "c"], ["a", 0, 5], [1, "b", 5], [1, 0, "c"]])
def test_flatten_of_a_zero_size_input(axis, declared):
    """Flatten's two dims are the products of the leading and of the trailing dims, known or run-time: a -1 in
    their place is undetermined when the input has no elements (and a run-time 0 in dyn.reshape copied the
    input's dim). Against NumPy: the reference evaluator's Flatten reshapes to (-1, trailing) and fails."""
    model = make_model([helper.make_node("Flatten", ["x"], ["y"], axis=axis)], [("x", F32, declared)],
                       [("y", F32, None)])
    x = np.zeros((1, 0, 5), np.float32)
    axis = axis + x.ndim if axis < 0 else axis
    check_lowered(model, x, expected=[x.reshape(int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))])
