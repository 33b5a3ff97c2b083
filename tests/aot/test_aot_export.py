"""The Model Library Format export: layout, metadata.json, parameters and the source IR."""

import json
import tarfile

import numpy as np
import pytest
from programs import PROGRAMS

import tensorvm as tv
import tensorvm.aot as aot
from tensorvm.errors import FormatError
from tensorvm.graph.params import load_params


def _mlp():
    program = next(p for p in PROGRAMS if p.name == "static_mlp")
    x, w1, b1, w2, b2 = program.args_fn()
    params = {"w1": w1, "b1": b1, "w2": w2, "b2": b2}
    return program.parse(), params


def test_layout_and_metadata(tmp_path):
    mod, params = _mlp()
    net = aot.build(mod, name="net", params=params)
    other = aot.build(tv.parse('#[version = "0.0.5"]\ndef @main(%a: Tensor[(3), int32]) { add(%a, %a) }'),
                      name="other", workspace="external")
    path = aot.export_model_library_format([net, other], tmp_path / "models.tar")
    with tarfile.open(path) as tar:
        names = set(tar.getnames())
        members = {m.name: m for m in tar.getmembers()}
        read = lambda name: tar.extractfile(name).read()  # noqa: E731
        for name in ("metadata.json", "codegen/host/src/tvmgen_net.c", "codegen/host/src/tvmgen_net_params.c",
                     "codegen/host/include/tvmgen_net.h", "codegen/host/src/tvmgen_other.c",
                     "codegen/host/include/tvmgen_other.h", "parameters/net.params", "parameters/other.params",
                     "src/net.relay", "src/other.relay", "runtime/include/tensorvm_aot.h",
                     "runtime/src/tensorvm_aot.c"):
            assert name in names, name
        assert all(m.uid == 0 and m.gid == 0 and m.uname == "root" for m in members.values())
        meta = json.loads(read("metadata.json"))
        assert read("codegen/host/src/tvmgen_net.c").decode() == net.sources["tvmgen_net.c"]
        saved = load_params(read("parameters/net.params"))
        relay = read("src/net.relay").decode()
    assert meta["version"] == 7 and set(meta["modules"]) == {"net", "other"}
    entry = meta["modules"]["net"]
    assert entry["executors"] == ["aot"] and entry["target"] == ["c"] and entry["style"] == "full-model"
    main = entry["memory"]["functions"]["main"][0]
    assert main["workspace_size_bytes"] == net.workspace_size
    assert main["constants_size_bytes"] == sum(v.nbytes for v in params.values())
    assert main["io_size_bytes"] == 4 * 8 * 4 + 4 * 3 * 4
    assert main["inputs"] == {"x": {"dtype": "float32", "shape": [4, 8], "size": 128}}
    assert main["outputs"] == {"output": {"dtype": "float32", "shape": [4, 3], "size": 48}}
    kernels = entry["memory"]["functions"]["operator_functions"]
    assert {k["function_name"] for k in kernels} == {k.name for k in net.kernels}
    assert entry["tensorvm"]["run_function"] == "tvmgen_net_run"
    assert meta["modules"]["other"]["tensorvm"]["workspace_external"] is True
    assert set(saved) == set(params)
    for name, value in params.items():
        np.testing.assert_array_equal(saved[name], value)
    assert tv.structural_equal(tv.parse(relay), mod)


def test_gzip_and_single_module(tmp_path):
    mod, params = _mlp()
    path = aot.build(mod, name="net", params=params).export(tmp_path / "net.tar.gz")
    with tarfile.open(path, "r:gz") as tar:
        assert "codegen/host/include/tvmgen_net.h" in tar.getnames()


def test_duplicate_names_and_bad_input_are_refused(tmp_path):
    mod, params = _mlp()
    net = aot.build(mod, name="net", params=params)
    with pytest.raises(FormatError, match="unique"):
        aot.export_model_library_format([net, net], tmp_path / "x.tar")
    with pytest.raises(FormatError, match="AOTModule"):
        aot.export_model_library_format(["net"], tmp_path / "x.tar")


def test_object_sizes_reports_every_source():
    mod, params = _mlp()
    module = aot.build(mod, name="net", params=params)
    sizes = aot.object_sizes(module)
    assert set(sizes) == {"tvmgen_net.c", "tvmgen_net_params.c", "tensorvm_aot.c"}
    assert all(entry["file_bytes"] > 0 for entry in sizes.values())
    params_entry = sizes["tvmgen_net_params.c"]
    if params_entry["text"] is not None:  # binutils size: the constants are read-only data (counted as text)
        assert params_entry["text"] + params_entry["data"] >= module.constants_size
