"""ONNX sequence ops (``frontend/onnx_lists.py``: a sequence of a length known at import is a tuple)
against ONNX Runtime, with run-time positions over every valid place (bytecode and native); positions
out of range are errors, at import when constant and at run time otherwise. (ONNX Runtime rather than
ONNX's reference evaluator: the reference wraps an insert at position n, the end, around to the front,
where the spec and ONNX Runtime append.)"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx_cases import onnx_model, tensorvm_runs

import tensorvm as tv
from tensorvm.errors import ExecutionError, ModelImportError, ShapeError, UnsupportedError
from tensorvm.prelude import make_list, to_python_list

VI = helper.make_tensor_value_info
F, I64 = TensorProto.FLOAT, TensorProto.INT64
node = helper.make_node
rng = np.random.default_rng(0)


def _tensors():
    """Three tensors of one rank and different first dims (a sequence may hold differing shapes)."""
    return {"a": rng.standard_normal((2, 3)).astype(np.float32), "b": rng.standard_normal((1, 3)).astype(np.float32),
            "c": rng.standard_normal((4, 3)).astype(np.float32)}


ABC = [VI("a", F, [2, 3]), VI("b", F, [1, 3]), VI("c", F, [4, 3])]


def _check(model, feeds_list):
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for mode, run in tensorvm_runs(model):
        for feeds in feeds_list:
            want = reference.run(None, feeds)
            got = run(*feeds.values())
            for g, w in zip(got, want, strict=True):
                assert g.dtype == w.dtype and g.shape == w.shape, (mode, feeds)
                # (atol: a sum of O(1) values near cancellation, one float32 rounding apart from ORT's)
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=f"{mode} {feeds}")


def test_sequence_at_a_run_time_position_over_tensors_of_different_shapes():
    nodes = [node("SequenceConstruct", ["a", "b", "c"], ["s"]), node("SequenceAt", ["s", "p"], ["y"]),
             node("SequenceLength", ["s"], ["n"])]
    model = onnx_model(nodes, ABC + [VI("p", I64, [])], [VI("y", F, ["r", 3]), VI("n", I64, [])], opset=18)
    _check(model, [{**_tensors(), "p": np.array(p, np.int64)} for p in range(-3, 3)])
    for _, run in tensorvm_runs(model):
        for p in (3, -4):
            with pytest.raises(ExecutionError, match="out of range"):
                run(*_tensors().values(), np.array(p, np.int64))


@pytest.mark.parametrize("new_axis", [0, 1])
def test_insert_and_erase_at_run_time_positions_then_concatenate(new_axis):
    same = [VI(name, F, [2, 3]) for name in "abc"]  # (new_axis stacks: one shape)
    nodes = [node("SequenceConstruct", ["a", "b"], ["s"]), node("SequenceInsert", ["s", "c", "p"], ["t"]),
             node("SequenceErase", ["t", "q"], ["u"]),
             node("ConcatFromSequence", ["t"], ["y"], axis=-1 if new_axis else 0, new_axis=new_axis),
             node("ConcatFromSequence", ["u"], ["z"], axis=0, new_axis=new_axis)]
    model = onnx_model(nodes, same + [VI("p", I64, []), VI("q", I64, [])],
                       [VI("y", F, ["d0", "d1", "d2"][:2 + new_axis]), VI("z", F, ["e0", "e1", "e2"][:2 + new_axis])],
                       opset=18)
    feeds = []
    for p in range(-2, 3):  # every place of an insert into 2 tensors
        for q in range(-3, 3):  # every place of an erase from 3
            tensors = {k: rng.standard_normal((2, 3)).astype(np.float32) for k in "abc"}
            feeds.append({**tensors, "p": np.array(p, np.int64), "q": np.array(q, np.int64)})
    _check(model, feeds)
    for _, run in tensorvm_runs(model):
        arrays = [np.ones((2, 3), np.float32)] * 3
        with pytest.raises(ExecutionError, match="out of range"):
            run(*arrays, np.array(3, np.int64), np.array(0, np.int64))
        with pytest.raises(ExecutionError, match="out of range"):
            run(*arrays, np.array(0, np.int64), np.array(-4, np.int64))


def test_constant_positions_and_appends():
    nodes = [node("SequenceEmpty", [], ["e"]), node("SequenceInsert", ["e", "a"], ["s1"]),
             node("SequenceInsert", ["s1", "b", "zero"], ["s2"]), node("SequenceInsert", ["s2", "c"], ["s3"]),
             node("SequenceErase", ["s3"], ["s4"]), node("SequenceAt", ["s4", "minus1"], ["y"]),
             node("ConcatFromSequence", ["s3"], ["z"], axis=0)]
    inits = [helper.make_tensor("zero", I64, [], [0]), helper.make_tensor("minus1", I64, [], [-1])]
    model = onnx_model(nodes, ABC, [VI("y", F, [2, 3]), VI("z", F, [7, 3])], inits=inits, opset=18)
    _check(model, [_tensors()])


@pytest.mark.parametrize("keepdims", [0, 1])
def test_split_to_sequence_by_ones_sizes_and_run_time_sizes(keepdims):
    nodes = [node("SplitToSequence", ["x"], ["ones"], axis=1, keepdims=keepdims),
             node("SplitToSequence", ["x", "two"], ["twos"], axis=0),
             node("SplitToSequence", ["x", "sizes"], ["parts"], axis=0),
             node("ConcatFromSequence", ["ones"], ["y1"], axis=-1, new_axis=0 if keepdims else 1),
             node("SequenceAt", ["twos", "last"], ["y2"]), node("SequenceLength", ["twos"], ["n2"]),
             node("SequenceAt", ["parts", "at"], ["y3"])]
    inits = [helper.make_tensor("two", I64, [], [2]), helper.make_tensor("last", I64, [], [-1])]
    model = onnx_model(nodes, [VI("x", F, [5, 3]), VI("sizes", I64, [3]), VI("at", I64, [])],
                       [VI("y1", F, ["r1", "c1"]), VI("y2", F, ["r2", 3]),
                        VI("n2", I64, []), VI("y3", F, ["r3", 3])],
                       inits=inits, opset=18)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    _check(model, [{"x": x, "sizes": np.array(s, np.int64), "at": np.array(a, np.int64)}
                   for s, a in (([1, 2, 2], 0), ([0, 5, 0], 1), ([3, 1, 1], -1))])


def test_a_sequence_output_is_a_tuple_of_its_tensors():
    model = onnx_model([node("SplitToSequence", ["x"], ["s"], axis=0, keepdims=0)], [VI("x", F, [3, 2])],
                       [helper.make_tensor_sequence_value_info("s", F, None)], opset=18)
    x = rng.standard_normal((3, 2)).astype(np.float32)
    mod, params = tv.frontend.from_onnx(model)
    got = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params)).invoke("main", x)
    assert len(got) == 3
    for part, row in zip(got, x, strict=True):
        np.testing.assert_array_equal(part.numpy(), row)


@pytest.mark.parametrize("shapes,axis", [([(2, 3, 4), (2, 1, 4), (2, 5, 4)], 1), ([(2, 3, 1), (2, 3, 4)], -1),
                                         ([(3,), (1,), (4,)], 0), ([(1, 2, 2), (3, 2, 2)], 0)])
def test_concatenating_a_run_time_sequence_whose_tensors_differ_along_the_axis(shapes, axis):
    """ConcatFromSequence without a new axis over a List (a sequence input): the tensors' lengths along the
    axis may differ (ONNX allows it; the stacking buffer had required one shape), in every exec mode and
    for 0 to 3 tensors; other dims that differ are a shape error at run time."""
    rank, rng = len(shapes[0]), np.random.default_rng(7)  # (its own draws: the module's stay as they were)
    model = onnx_model([node("ConcatFromSequence", ["s"], ["y"], axis=axis)],
                       [helper.make_tensor_sequence_value_info("s", F, [None] * rank)],
                       [VI("y", F, [None] * rank)], opset=18)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for mode, run in tensorvm_runs(model):
        for count in range(1, len(shapes) + 1):
            tensors = [rng.standard_normal(sh).astype(np.float32) for sh in shapes[:count]]
            want = reference.run(None, {"s": tensors})[0]
            got = run(make_list(tensors))[0]
            assert got.shape == want.shape, (mode, count)
            np.testing.assert_array_equal(got, want, err_msg=f"{mode} {count}")
        assert run(make_list([]))[0].shape[axis] == 0
        if rank > 1:
            other = (axis + 1) % rank
            bad = [np.zeros(shapes[0], np.float32),
                   np.zeros([d + (a == other) for a, d in enumerate(shapes[0])], np.float32)]
            with pytest.raises(ShapeError):
                run(make_list(bad))


def test_a_sequence_input_of_unknown_rank_takes_its_tensors_dims_from_shape():
    """ONNX often declares a sequence input without its tensors' shape: the import says to give it, and with
    ``shape={name: dims}`` (or only a dtype override, where the rank is declared) runs as ONNX Runtime."""
    model = onnx_model([node("SequenceInsert", ["s", "x"], ["t"]), node("ConcatFromSequence", ["t"], ["y"], axis=0)],
                       [helper.make_tensor_sequence_value_info("s", F, None), VI("x", F, [None, 3])],
                       [VI("y", F, [None, 3])], opset=18)
    with pytest.raises(UnsupportedError, match="'s' is a sequence of tensors of unknown rank.*shape="):
        tv.frontend.from_onnx(model)
    mod, params = tv.frontend.from_onnx(model, shape={"s": [None, 3]})
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params))
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(8)  # (its own draws: the module's stay as they were)
    tensors = [rng.standard_normal(shape).astype(np.float32) for shape in ((2, 3), (1, 3), (4, 3))]
    for count in (0, 1, 3):
        x = rng.standard_normal((2, 3)).astype(np.float32)
        want = reference.run(None, {"s": tensors[:count], "x": x})[0]
        np.testing.assert_array_equal(vm.invoke("main", make_list(tensors[:count]), x).numpy(), want)
    ranked = onnx_model([node("SequenceLength", ["s"], ["n"])], [helper.make_tensor_sequence_value_info("s", F, [2])],
                        [VI("n", I64, [])], opset=18)
    mod, _ = tv.frontend.from_onnx(ranked, dtype={"s": "float64"})
    assert "List[Tensor[(2), float64]]" in mod.astext()
    assert int(tv.vm.VirtualMachine(tv.vm.compile(mod, target="c")).invoke(
        "main", make_list([np.zeros(2), np.ones(2)])).numpy()) == 2


def test_what_cannot_be_a_tuple_is_refused_by_name():
    bad_at = onnx_model([node("SequenceConstruct", ["a", "b"], ["s"]), node("SequenceAt", ["s", "p"], ["y"])],
                        ABC[:2], [VI("y", F, ["r", 3])], inits=[helper.make_tensor("p", I64, [], [2])], opset=18)
    with pytest.raises(ModelImportError, match=r"SequenceAt: position 2 is out of range \[-2, 1\]"):
        tv.frontend.from_onnx(bad_at)
    mixed = onnx_model([node("SequenceConstruct", ["a", "k"], ["s"])], [VI("a", F, [2]), VI("k", I64, [])],
                       [helper.make_tensor_sequence_value_info("s", F, None)], opset=18)
    with pytest.raises(Exception, match="share one dtype"):
        tv.frontend.from_onnx(mixed)


def test_sequence_map_applies_its_body_to_each_element_with_tensors_and_sequences_beside_it():
    body = helper.make_graph(
        [node("Add", ["elem", "bias"], ["shifted"]), node("Mul", ["shifted", "other"], ["y"]),
         node("ReduceSum", ["elem"], ["total"], keepdims=0)], "body",
        [VI("elem", F, ["r", 3]), VI("bias", F, [3]), VI("other", F, ["r", 3])],
        [VI("y", F, ["r", 3]), VI("total", F, [])])
    nodes = [node("SplitToSequence", ["x", "sizes"], ["xs"], axis=0),
             node("SplitToSequence", ["z", "sizes"], ["zs"], axis=0),
             node("SequenceMap", ["xs", "bias", "zs"], ["ys", "totals"], body=body),
             node("ConcatFromSequence", ["ys"], ["y"], axis=0),
             node("ConcatFromSequence", ["totals"], ["t"], axis=0, new_axis=1)]
    model = onnx_model(nodes, [VI("x", F, [6, 3]), VI("z", F, [6, 3]), VI("sizes", I64, [3]), VI("bias", F, [3])],
                       [VI("y", F, [6, 3]), VI("t", F, [3])], opset=18)
    feeds = [{"x": rng.standard_normal((6, 3)).astype(np.float32), "z": rng.standard_normal((6, 3)).astype(np.float32),
              "sizes": np.array(s, np.int64), "bias": rng.standard_normal(3).astype(np.float32)}
             for s in ([1, 2, 3], [6, 0, 0], [2, 2, 2])]
    _check(model, feeds)


def test_if_branches_give_sequences_of_one_length_or_are_refused():
    def branch(names, name):
        return helper.make_graph([node("SequenceConstruct", names, ["s_" + name])], name, [],
                                 [helper.make_tensor_sequence_value_info("s_" + name, F, None)])

    def model(else_names):
        nodes = [node("If", ["cond"], ["s"], then_branch=branch(["a", "b"], "then"),
                      else_branch=branch(else_names, "else")), node("ConcatFromSequence", ["s"], ["y"], axis=0)]
        return onnx_model(nodes, [VI("cond", TensorProto.BOOL, [])] + ABC, [VI("y", F, ["r", 3])], opset=18)

    feeds = [{"cond": np.array(c), **_tensors()} for c in (True, False)]
    _check(model(["c", "a"]), feeds)
    with pytest.raises(UnsupportedError, match="sequences of 2 and 3 tensors"):
        tv.frontend.from_onnx(model(["a", "b", "c"]))


def _growing_loop_model(reads_inside: bool):
    """A Loop appending one (1, 3) tensor per iteration to a sequence that starts empty (TorchScript's
    ``xs.append(h)`` in a loop); after it: the length, the last and a run-time-chosen tensor, and both
    concatenations. With ``reads_inside`` the body also reads the newest tensor back (``xs[-1]``)."""
    body_nodes = [node("Identity", ["cond_in"], ["cond_out"]), node("Add", ["h_in", "step"], ["h_out"]),
                  node("SequenceInsert", ["seq_in", "h_out"], ["seq_out"])]
    if reads_inside:
        body_nodes += [node("SequenceAt", ["seq_out", "minus1"], ["newest"]),
                       node("Mul", ["newest", "two"], ["scan"])]
    else:
        body_nodes += [node("Identity", ["h_out"], ["scan"])]
    body = helper.make_graph(
        body_nodes, "body",
        [VI("i", I64, []), VI("cond_in", TensorProto.BOOL, []), VI("h_in", F, [1, 3]),
         helper.make_tensor_sequence_value_info("seq_in", F, None)],
        [VI("cond_out", TensorProto.BOOL, []), VI("h_out", F, [1, 3]),
         helper.make_tensor_sequence_value_info("seq_out", F, None), VI("scan", F, [1, 3])],
        [helper.make_tensor("minus1", I64, [], [-1]), helper.make_tensor("two", F, [], [2.0])])
    nodes = [node("SequenceEmpty", [], ["empty"], dtype=F),
             node("Loop", ["M", "", "h0", "empty"], ["h", "seq", "scans"], body=body),
             node("SequenceLength", ["seq"], ["n"]), node("SequenceAt", ["seq", "p"], ["picked"]),
             node("ConcatFromSequence", ["seq"], ["stacked"], axis=1, new_axis=1),
             node("ConcatFromSequence", ["seq"], ["joined"], axis=0)]
    return onnx_model(nodes, [VI("M", I64, []), VI("h0", F, [1, 3]), VI("step", F, [1, 3]), VI("p", I64, [])],
                      [VI("n", I64, []), VI("picked", F, [1, 3]), VI("stacked", F, [1, "T", 3]),
                       VI("joined", F, ["T", 3]), VI("scans", F, ["T", 1, 3])], opset=17)


@pytest.mark.parametrize("reads_inside", [False, True])
def test_a_sequence_grown_in_a_loop_is_a_list(reads_inside):
    model = _growing_loop_model(reads_inside)
    h0, step = np.array([[1, -2, 3]], np.float32), np.array([[0.5, 0.25, -1]], np.float32)
    _check(model, [{"M": np.array(m, np.int64), "h0": h0, "step": step, "p": np.array(p, np.int64)}
                   for m, p in ((1, 0), (5, -5), (5, 4), (40, 17), (40, -1))])
    for _, run in tensorvm_runs(model):
        with pytest.raises(ExecutionError, match="out of range"):
            run(np.array(3, np.int64), h0, step, np.array(3, np.int64))
        with pytest.raises(ExecutionError, match="out of range"):
            run(np.array(3, np.int64), h0, step, np.array(-4, np.int64))


@pytest.mark.parametrize("keepdims", [0, 1])
def test_a_run_time_number_of_parts_is_a_list_returned_in_order(keepdims):
    """SplitToSequence by a run-time size (or of a run-time length into parts of one) gives a List; as a
    graph output it comes back oldest first, as ONNX Runtime returns the sequence."""
    nodes = [node("SplitToSequence", ["x", "k"], ["by_k"], axis=1),
             node("SplitToSequence", ["x"], ["ones"], axis=0, keepdims=keepdims),
             node("SequenceLength", ["by_k"], ["n"]), node("SequenceAt", ["by_k", "p"], ["picked"]),
             node("ConcatFromSequence", ["ones"], ["back"], axis=0, new_axis=1 - keepdims)]
    model = onnx_model(nodes, [VI("x", F, ["r", "c"]), VI("k", I64, []), VI("p", I64, [])],
                       [helper.make_tensor_sequence_value_info("by_k", F, None), VI("n", I64, []),
                        VI("picked", F, ["r", "w"]), VI("back", F, ["r", "c"])], opset=18)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    mod, params = tv.frontend.from_onnx(model)
    for mode in ("bytecode", "native"):
        vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params, exec_mode=mode))
        for rows, cols, k, p in ((2, 7, 3, 2), (3, 4, 4, 0), (1, 5, 9, -1), (4, 6, 1, -6)):
            x = rng.standard_normal((rows, cols)).astype(np.float32)
            feeds = {"x": x, "k": np.array(k, np.int64), "p": np.array(p, np.int64)}
            want = reference.run(None, feeds)
            parts, n, picked, back = vm.invoke("main", *feeds.values())
            got_parts = [t.numpy() for t in to_python_list(parts)]
            assert len(got_parts) == len(want[0]) == int(n.numpy()) == int(want[1]), mode
            for g, w in zip(got_parts, want[0], strict=True):
                np.testing.assert_array_equal(g, w)
            np.testing.assert_array_equal(picked.numpy(), want[2])
            np.testing.assert_array_equal(back.numpy(), want[3])
        with pytest.raises(ExecutionError, match="out of range"):  # (a size of 0 would never end)
            vm.invoke("main", np.ones((2, 3), np.float32), np.array(0, np.int64), np.array(0, np.int64))


def test_a_sequence_input_is_a_list_and_edits_at_run_time_positions():
    """A sequence graph input (a prelude List, in order) with an insert and an erase at run-time positions,
    every valid one, against ONNX Runtime; out of range an error."""
    seq_type = helper.make_tensor_sequence_value_info
    nodes = [node("SequenceInsert", ["xs", "t", "p"], ["inserted"]), node("SequenceErase", ["xs", "q"], ["erased"]),
             node("SequenceErase", ["xs"], ["popped"]), node("SequenceLength", ["inserted"], ["n"])]
    model = onnx_model(nodes, [seq_type("xs", F, ["r", 2]), VI("t", F, ["s", 2]), VI("p", I64, []), VI("q", I64, [])],
                       [seq_type("inserted", F, ["r", 2]), seq_type("erased", F, ["r", 2]),
                        seq_type("popped", F, ["r", 2]), VI("n", I64, [])], opset=18)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    mod, params = tv.frontend.from_onnx(model)
    tensors = [rng.standard_normal((k, 2)).astype(np.float32) for k in (1, 3, 2)]
    t = rng.standard_normal((4, 2)).astype(np.float32)
    for mode in ("bytecode", "native"):
        vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params, exec_mode=mode))
        for p in range(-3, 4):
            q = p if p < 3 else -1
            want = reference.run(None, {"xs": tensors, "t": t, "p": np.array(p, np.int64), "q": np.array(q, np.int64)})
            got = vm.invoke("main", make_list(tensors), t, np.array(p, np.int64), np.array(q, np.int64))
            for g, w in zip(got[:3], want[:3], strict=True):
                got_list = [x.numpy() for x in to_python_list(g)]
                assert len(got_list) == len(w), (mode, p)
                for a, b in zip(got_list, w, strict=True):
                    np.testing.assert_array_equal(a, b)
            assert int(got[3].numpy()) == int(want[3]) == 4
        for p, q in ((4, 0), (0, 3), (-4, 0), (0, -4)):
            with pytest.raises(ExecutionError, match="out of range"):
                vm.invoke("main", make_list(tensors), t, np.array(p, np.int64), np.array(q, np.int64))


def test_sequence_map_over_lists_zips_them_and_reads_outer_values():
    seq_type = helper.make_tensor_sequence_value_info
    body = helper.make_graph(
        [node("Add", ["a", "b"], ["s"]), node("Mul", ["s", "scale"], ["y"]), node("Shape", ["a"], ["shape"])],
        "body", [VI("a", F, ["n", 2]), VI("b", F, ["n", 2])], [VI("y", F, ["n", 2]), VI("shape", I64, [2])])
    model = onnx_model([node("SequenceMap", ["xs", "ys"], ["outs", "shapes"], body=body)],
                       [seq_type("xs", F, ["n", 2]), seq_type("ys", F, ["n", 2])],
                       [seq_type("outs", F, ["n", 2]), seq_type("shapes", I64, [2])],
                       inits=[helper.make_tensor("scale", F, [], [3.0])], opset=18)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    mod, params = tv.frontend.from_onnx(model)
    for mode in ("bytecode", "native"):
        vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params, exec_mode=mode))
        for lengths in ((1,), (2, 4, 1), ()):
            xs = [rng.standard_normal((k, 2)).astype(np.float32) for k in lengths]
            ys = [rng.standard_normal((k, 2)).astype(np.float32) for k in lengths]
            got = vm.invoke("main", make_list(xs), make_list(ys))
            if not lengths:
                assert to_python_list(got[0]) == [] and to_python_list(got[1]) == []
                continue
            want = reference.run(None, {"xs": xs, "ys": ys})
            for g, w in zip(got, want, strict=True):
                got_list = [x.numpy() for x in to_python_list(g)]
                assert len(got_list) == len(w), mode
                for a, b in zip(got_list, w, strict=True):
                    np.testing.assert_allclose(a, b, rtol=1e-6)
        with pytest.raises(ExecutionError, match="seq_map"):  # (lists of different lengths)
            vm.invoke("main", make_list([np.ones((1, 2), np.float32)] * 2), make_list([np.ones((1, 2), np.float32)]))


def test_a_split_into_many_parts_is_a_list_not_an_unrolled_tuple():
    """The number of parts comes from a dim, not from anything the file holds: past MAX_TUPLE_PARTS the
    split is a List walked at run time (the import stays small), with the same result."""
    from tensorvm.frontend.onnx_lists import MAX_TUPLE_PARTS

    rows = 4 * MAX_TUPLE_PARTS + 1
    model = onnx_model([node("SplitToSequence", ["x"], ["s"], axis=0, keepdims=0),
                        node("ConcatFromSequence", ["s"], ["y"], axis=0, new_axis=1),
                        node("SequenceLength", ["s"], ["n"])],
                       [VI("x", F, [rows, 2])], [VI("y", F, [rows, 2]), VI("n", I64, [])], opset=18)
    mod, _ = tv.frontend.from_onnx(model)
    assert len(str(mod)) < 20000  # (one walk, not an expression per part)
    x = rng.standard_normal((rows, 2)).astype(np.float32)
    for mode, run in tensorvm_runs(model):
        y, n = run(x)
        np.testing.assert_array_equal(y, x, err_msg=mode)
        assert int(n) == rows
