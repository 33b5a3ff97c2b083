"""Malformed ONNX models fail with the importer's own error (``ModelImportError``, a ``FormatError``)
naming the node and what was expected vs what came; never a TypeError, IndexError, OverflowError, a
huge allocation, or a read of a file outside the model's directory."""

from __future__ import annotations

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tensorvm.errors import FormatError, ModelImportError, TensorVMError  # noqa: E402
from tensorvm.frontend import from_onnx  # noqa: E402

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def make_model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def raw_tensor(name, dims, data: bytes, data_type=F32):
    """A TensorProto as a file may hold it, unchecked (onnx.helper refuses inconsistent ones)."""
    tensor = TensorProto(name=name, data_type=data_type, dims=dims)
    tensor.raw_data = data
    return tensor


def import_error(model, *words):
    """The model must fail with ModelImportError whose message holds every word."""
    with pytest.raises(ModelImportError) as info:
        from_onnx(model)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    return info.value


def test_the_importer_error_is_a_format_error():
    assert issubclass(ModelImportError, FormatError) and issubclass(ModelImportError, TensorVMError)


def test_loop_without_body_names_the_node_and_the_missing_attribute():
    node = helper.make_node("Loop", ["M", "c", "x"], ["y"], name="the_loop")
    model = make_model([node], [("M", I64, []), ("c", TensorProto.BOOL, []), ("x", F32, [2])], [("y", F32, [2])])
    import_error(model, "the_loop", "Loop", "body")


def test_an_int_where_a_list_is_expected():
    node = helper.make_node("Transpose", ["x"], ["y"], name="tr", perm=1)
    model = make_model([node], [("x", F32, [2, 3])], [("y", F32, [3, 2])])
    import_error(model, "tr", "Transpose", "perm", "INTS", "INT")


@pytest.mark.parametrize("index", [-5, 7])
def test_gather_out_of_range_index_on_a_shape(index):
    shape = helper.make_node("Shape", ["x"], ["s"], name="shape")
    const = helper.make_node("Constant", [], ["i"], name="idx", value=numpy_helper.from_array(np.array(index, np.int64)))
    gather = helper.make_node("Gather", ["s", "i"], ["y"], name="gather_bad", axis=0)
    model = make_model([shape, const, gather], [("x", F32, [2, 3])], [("y", I64, [])])
    import_error(model, "gather_bad", "Gather", "[-2, 1]", str(index))


def test_gather_out_of_range_constant_index_is_not_wrapped():
    # "wrap" would silently take element 1 for -5 (ONNX Runtime rejects it)
    gather = helper.make_node("Gather", ["x", "i"], ["y"], name="g", axis=1)
    model = make_model([gather], [("x", F32, [2, 3])], [("y", F32, [2])],
                       [numpy_helper.from_array(np.array(-5, np.int64), "i")])
    import_error(model, "'g'", "[-3, 2]", "-5")


def test_a_converter_failure_is_wrapped_with_its_cause(monkeypatch):
    from tensorvm.frontend import onnx_importer

    def broken(ctx, x):
        raise KeyError("boom")

    monkeypatch.setattr(onnx_importer, "lookup_converter", lambda op_type, opset: broken)
    node = helper.make_node("Relu", ["x"], ["y"], name="r0")
    model = make_model([node], [("x", F32, [2])], [("y", F32, [2])])
    err = import_error(model, "'r0'", "Relu", "KeyError", "boom")
    assert isinstance(err.__cause__, KeyError)


@pytest.mark.parametrize("dim", [2 ** 62, 2 ** 40])
def test_a_huge_declared_initializer_does_not_allocate(dim):
    init = raw_tensor("w", [dim], b"\0\0\0\0")
    node = helper.make_node("Add", ["x", "w"], ["y"], name="add")
    model = make_model([node], [("x", F32, [1])], [("y", F32, [1])], [init])
    import_error(model, "'w'", str(dim), "4 bytes")


def test_initializer_shape_disagreeing_with_its_data():
    init = raw_tensor("w", [3], np.zeros(2, np.float32).tobytes())
    node = helper.make_node("Add", ["x", "w"], ["y"], name="add")
    model = make_model([node], [("x", F32, [3])], [("y", F32, [3])], [init])
    import_error(model, "'w'", "12", "8")


def test_typed_values_disagreeing_with_the_dims():
    init = TensorProto(name="w", data_type=F32, dims=[2 ** 62], float_data=[1.0])
    node = helper.make_node("Add", ["x", "w"], ["y"], name="add")
    model = make_model([node], [("x", F32, [1])], [("y", F32, [1])], [init])
    import_error(model, "'w'", str(2 ** 62), "got 1")


@pytest.mark.parametrize("op", ["ConstantOfShape", "MaxPool"])
def test_huge_sizes_in_shapes_and_attributes_are_project_errors(op):
    big = 2 ** 62
    if op == "ConstantOfShape":
        shape = helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(np.array([big, big], np.int64)))
        model = make_model([shape, helper.make_node(op, ["s"], ["y"], name="n")], [], [("y", F32, None)])
    else:
        model = make_model([helper.make_node(op, ["x"], ["y"], name="n", kernel_shape=[big, big])],
                           [("x", F32, [1, 1, 4, 4])], [("y", F32, None)])
    with pytest.raises(TensorVMError, match=f"'n' \\({op}\\)"):
        from_onnx(model)


def test_wrong_number_of_inputs_names_the_node():
    node = helper.make_node("Relu", ["x", "x"], ["y"], name="relu2")
    model = make_model([node], [("x", F32, [2])], [("y", F32, [2])])
    with pytest.raises(TensorVMError, match="relu2"):
        from_onnx(model)


def test_negative_attribute_out_of_range():
    node = helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=9)
    model = make_model([node], [("x", F32, [2, 3])], [("y", F32, [2, 3])])
    with pytest.raises(TensorVMError, match="sm"):
        from_onnx(model)


def _nested_if(depth):
    def leaf(out):
        return helper.make_graph([helper.make_node("Identity", ["x"], [out])], "leaf", [],
                                 [helper.make_tensor_value_info(out, F32, [1])])

    graph = leaf("o0")
    for level in range(depth):  # (only the 'then' branches nest: the model stays linear in depth)
        node = helper.make_node("If", ["c"], [f"o{level + 1}"], name=f"if{level}", then_branch=graph,
                                else_branch=leaf(f"o{level + 1}"))
        graph = helper.make_graph([node], f"g{level}", [], [helper.make_tensor_value_info(f"o{level + 1}", F32, [1])])
    top = helper.make_graph(list(graph.node), "top",
                            [helper.make_tensor_value_info("x", F32, [1]),
                             helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                            list(graph.output))
    return helper.make_model(top, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_subgraph_nesting_is_bounded():
    from_onnx(_nested_if(3))  # shallow nesting imports
    import_error(_nested_if(20), "if", "nest", "16")


def test_missing_graph_and_bad_opset():
    import_error(onnx.ModelProto(ir_version=9), "graph")
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    import_error(make_model([node], [("x", F32, [2])], [("y", F32, [2])], opset=10 ** 6), "opset", str(10 ** 6))
    import_error(make_model([node], [("x", F32, [2])], [("y", F32, [2])], opset=0), "opset")


# ---- external data ------------------------------------------------------------------------------

def _external_model(location, length=12, offset=None):
    init = TensorProto(name="w", data_type=F32, dims=[3])
    init.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("length", str(length)), ("offset", None if offset is None else str(offset))):
        if value is not None:
            entry = init.external_data.add()
            entry.key, entry.value = key, value
    node = helper.make_node("Add", ["x", "w"], ["y"], name="add")
    return make_model([node], [("x", F32, [3])], [("y", F32, [3])], [init])


def test_external_data_next_to_a_model_file_is_read(tmp_path):
    np.arange(3, dtype=np.float32).tofile(tmp_path / "w.bin")
    path = tmp_path / "m.onnx"
    path.write_bytes(_external_model("w.bin").SerializeToString())
    mod, _ = from_onnx(str(path))
    assert "main" in mod


def test_bytes_never_read_external_data_from_the_current_directory(tmp_path, monkeypatch):
    np.arange(3, dtype=np.float32).tofile(tmp_path / "w.bin")
    monkeypatch.chdir(tmp_path)
    import_error(_external_model("w.bin").SerializeToString(), "external", "'w'")
    import_error(_external_model("w.bin"), "external", "'w'")  # a ModelProto neither


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin", "link.bin"])
def test_external_data_must_stay_inside_the_model_directory(tmp_path, location):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    np.arange(3, dtype=np.float32).tofile(tmp_path / "secret.bin")
    os.symlink(tmp_path / "secret.bin", model_dir / "link.bin")
    path = model_dir / "m.onnx"
    path.write_bytes(_external_model(location).SerializeToString())
    import_error(str(path), "'w'", location)


def test_external_data_beyond_the_file_end(tmp_path):
    np.arange(3, dtype=np.float32).tofile(tmp_path / "w.bin")
    path = tmp_path / "m.onnx"
    path.write_bytes(_external_model("w.bin", length=12, offset=8).SerializeToString())
    import_error(str(path), "'w'", "w.bin")


def test_a_value_used_before_it_is_defined_names_the_node():
    nodes = [helper.make_node("Relu", ["t"], ["y"], name="first"), helper.make_node("Relu", ["x"], ["t"], name="second")]
    model = make_model(nodes, [("x", F32, [2])], [("y", F32, [2])])
    import_error(model, "'first'", "'t'", "before it is defined")


@pytest.mark.parametrize("op, expected", [("LeakyRelu", "expected FLOAT, got UNDEFINED"), ("Relu", "known attribute kind")])
def test_an_attribute_without_a_kind(op, expected):
    node = helper.make_node(op, ["x"], ["y"], name="n1")
    node.attribute.add(name="alpha")  # kind UNDEFINED, as a file may have it
    model = make_model([node], [("x", F32, [2])], [("y", F32, [2])])
    import_error(model, "'n1'", expected)


@pytest.mark.parametrize("op, inputs", [("Expand", ["x", "s"]), ("Reshape", ["x", "s"]), ("Tile", ["x", "s"]),
                                        ("ConstantOfShape", ["s"])])
def test_a_run_time_shape_of_absurd_length_is_refused_quickly(op, inputs):
    # found by a mutation loop: a declared length of 2**31 made the type relation build 2**31 dims
    node = helper.make_node(op, inputs, ["y"], name="n")
    model = make_model([node], [("x", F32, [1]), ("s", I64, [2 ** 31])][2 - len(inputs):], [("y", F32, None)])
    import_error(model, "'n'", op, "at most 64", str(2 ** 31))


def test_scan_with_an_absurd_num_scan_inputs():
    body = helper.make_graph([helper.make_node("Add", ["s", "r"], ["so"]), helper.make_node("Identity", ["so"], ["o"])],
                             "body", [helper.make_tensor_value_info("s", F32, [2]), helper.make_tensor_value_info("r", F32, [2])],
                             [helper.make_tensor_value_info("so", F32, [2]), helper.make_tensor_value_info("o", F32, [2])])
    node = helper.make_node("Scan", ["init", "xs"], ["final", "partial"], name="scan", body=body,
                            num_scan_inputs=2 ** 31)
    model = make_model([node], [("init", F32, [2]), ("xs", F32, [3, 2])], [("final", F32, [2]), ("partial", F32, [3, 2])])
    import_error(model, "'scan'", "num_scan_inputs", "[1, 2]", str(2 ** 31))


def test_split_num_outputs_must_match_the_outputs():
    node = helper.make_node("Split", ["x"], ["a", "b"], name="sp", num_outputs=2 ** 31)
    model = make_model([node], [("x", F32, [4])], [("a", F32, [2]), ("b", F32, [2])], opset=18)
    import_error(model, "'sp'", "num_outputs", "2 outputs", str(2 ** 31))


def test_a_converter_failure_inside_a_branch_names_both_nodes_and_keeps_its_cause(monkeypatch):
    from tensorvm.frontend import onnx_importer

    original = onnx_importer.lookup_converter

    def broken(ctx, x):
        raise KeyError("boom")

    monkeypatch.setattr(onnx_importer, "lookup_converter",
                        lambda op_type, opset: broken if op_type == "Relu" else original(op_type, opset))
    branch = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="inner")], "b", [],
                               [helper.make_tensor_value_info("r", F32, [2])])
    node = helper.make_node("If", ["c"], ["y"], name="outer", then_branch=branch, else_branch=branch)
    model = make_model([node], [("x", F32, [2]), ("c", TensorProto.BOOL, [])], [("y", F32, [2])])
    err = import_error(model, "'outer' (If)", "'inner' (Relu)", "KeyError")
    assert isinstance(err.__cause__, KeyError)


@pytest.mark.parametrize("op", ["DeformConv", "MaxRoiPool", "CausalConvWithState", "Det"])
def test_converters_that_write_out_per_element_refuse_huge_declared_sizes(op):
    """A declared dim sets how much these converters write out at import: past the limit it is the
    project's error naming the node, not a hang or a MemoryError."""
    big = 2 ** 40
    if op == "DeformConv":
        node = helper.make_node(op, ["x", "w", "off"], ["y"], name="n")
        inputs = [("x", F32, [1, 1, big, 4]), ("w", F32, [1, 1, 3, 3]), ("off", F32, [1, 18, big - 2, 2])]
    elif op == "MaxRoiPool":
        node = helper.make_node(op, ["x", "rois"], ["y"], name="n", pooled_shape=[2, 2])
        inputs = [("x", F32, [1, 1, big, 4]), ("rois", F32, [3, 5])]
    elif op == "CausalConvWithState":
        node = helper.make_node(op, ["x", "w"], ["y", "s"], name="n")
        inputs = [("x", F32, [1, 2, 8]), ("w", F32, [2, 1, big])]
    else:
        node = helper.make_node(op, ["x"], ["y"], name="n")
        inputs = [("x", F32, [big, big])]
    outputs = [("y", F32, None)] + ([("s", F32, None)] if op == "CausalConvWithState" else [])
    opset = {"DeformConv": 22, "MaxRoiPool": 13, "CausalConvWithState": 27, "Det": 13}[op]
    model = make_model([node], inputs, outputs, opset=opset)
    with pytest.raises(TensorVMError, match=f"'n' \\({op}\\).*at most"):
        from_onnx(model)


@pytest.mark.parametrize("name", [b"xin", b"relu_node", b"LeakyRelu", b"alpha", b"batch"])
def test_a_name_that_is_not_utf8_is_an_import_error(name):
    """protobuf hands a string field holding invalid UTF-8 over as bytes (the loader fuzzer flipped a bit of
    an input's name, then a symbolic dim's; the importer raised TypeError from its name cleaner): every
    name is checked."""
    node = helper.make_node("LeakyRelu", ["xin"], ["y"], name="relu_node", alpha=0.5)
    data = make_model([node], [("xin", F32, ["batch"])], [("y", F32, ["batch"])]).SerializeToString()
    assert name in data
    import_error(data.replace(name, b"\xff" + name[1:]), "not UTF-8")
