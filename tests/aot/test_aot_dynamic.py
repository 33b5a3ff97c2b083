"""AOT for dynamic programs (``tv.aot.build(mod, dynamic=True)``, docs/aot_dynamic.md): the suite's
Tree-LSTM and LSTM (benchmarks/models) as standalone C libraries, linked with the C application
``tests/aot/dynamic_main.c`` (``-Wall -Werror``), which builds trees with the constructors, runs sequences
of three lengths and error cases, through its own counting allocator (every block must come back).
Oracle: the interpreter (``tv.create_executor("debug", mod)``) on the same inputs. Built once plainly and
once under ``-fsanitize=address,undefined`` with leak detection."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.errors import UnsupportedError

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from models import lstm, treelstm  # noqa: E402

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="needs a C compiler (cc)")
MAIN = Path(__file__).parent / "dynamic_main.c"

TREE_I, TREE_H = 12, 10
LSTM_I, LSTM_H = 6, 8
LENGTHS = (1, 4, 9)
PLAIN = ["-std=c11", "-O2", "-Wall", "-Werror"]
SANITIZE = ["-std=c11", "-O0", "-g", "-Wall", "-Werror", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer"]


def _write_tree(tree, out: list):
    if tree[0] == "leaf":
        out.append("L " + " ".join(f"{v:.9g}" for v in tree[1].reshape(-1)))
    else:
        out.append("N")
        _write_tree(tree[1], out)
        _write_tree(tree[2], out)
        out.append(" ".join(f"{v:.9g}" for v in tree[3].reshape(-1)))


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """The two libraries' sources, the inputs and the interpreter's outputs."""
    directory = tmp_path_factory.mktemp("aotdyn")
    tree_w = treelstm.make_weights(TREE_I, TREE_H)
    tree_mod = tv.parse(treelstm.treelstm_relay_text(TREE_I, TREE_H))
    lstm_w = lstm.make_weights(LSTM_I, LSTM_H)
    lstm_params = {"w_ih": lstm_w["w_ih"], "w_hh": lstm_w["w_hh"], "bias": lstm_w["b_ih"] + lstm_w["b_hh"]}
    lstm_mod = tv.parse(lstm.lstm_relay_text(LSTM_I, LSTM_H))
    libraries = [tv.aot.build(tree_mod, name="tree", params=tree_w, dynamic=True),
                 tv.aot.build(lstm_mod, name="lstm", params=lstm_params, dynamic=True)]
    sources = []
    for library in libraries:
        sources += library.write_sources(directory)["sources"]
    data = directory / "data"
    data.mkdir()
    trees = treelstm.make_trees(4, TREE_I, min_nodes=1, max_nodes=9, seed=3)
    trees.append(("leaf", np.ones((1, TREE_I), np.float32)))
    lines = [f"{len(trees)} {TREE_I}"]
    for tree in trees:
        _write_tree(tree, lines)
    (data / "trees.txt").write_text("\n".join(lines) + "\n")
    run_tree = tv.create_executor("debug", tree_mod, params=tree_w).evaluate()
    tree_expected = [run_tree(treelstm.tree_value(tree_mod, t)) for t in trees]
    sequences = [lstm.make_sequence(LSTM_I, n, seed=n) for n in LENGTHS]
    lines = [f"{len(sequences)} {LSTM_I}"]
    for xs in sequences:
        lines.append(f"{xs.shape[0]} " + " ".join(f"{v:.9g}" for v in xs.reshape(-1)))
    (data / "lstm.txt").write_text("\n".join(lines) + "\n")
    run_lstm = tv.create_executor("debug", lstm_mod, params=lstm_params).evaluate()
    lstm_expected = [run_lstm(xs) for xs in sequences]
    (data / "sizes.txt").write_text(f"{TREE_I} {LSTM_I}\n")
    return {"directory": directory, "sources": sources, "data": data, "tree": tree_expected,
            "lstm": lstm_expected, "libraries": libraries}


def _build(app, flags) -> Path:
    """The application built with flags, cached in the kernel cache by the hash of everything it is built from
    (the generated sources and headers, the main, the flags, the compiler's version)."""
    from tensorvm.codegen.build import cache_dir

    version = subprocess.run([CC, "--version"], capture_output=True, text=True).stdout
    texts = [p.read_bytes() for p in sorted((app["directory"] / "include").iterdir())]
    texts += [Path(p).read_bytes() for p in app["sources"]] + [MAIN.read_bytes(), " ".join(flags).encode(),
                                                               version.encode()]
    key = hashlib.sha256(b"\0".join(texts)).hexdigest()[:24]
    exe = cache_dir() / f"aotdyn_test_app_{key}"
    if not exe.exists():
        partial = app["directory"] / f"app-{key}"
        command = [CC, *flags, f"-I{app['directory'] / 'include'}", str(MAIN), *map(str, app["sources"]), "-o",
                   str(partial), "-lm", "-lpthread"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[:6000]
        staged = exe.with_name(f"{exe.name}.{os.getpid()}.tmp")
        shutil.copy2(partial, staged)
        os.replace(staged, exe)  # (the cache only ever holds complete builds)
    return exe


def _run(app, flags, env=None):
    exe = _build(app, flags)
    result = subprocess.run([str(exe), str(app["data"])], capture_output=True, text=True, timeout=300,
                            env={**os.environ, **(env or {})})
    assert result.returncode == 0, f"the application failed:\n{result.stdout}\n{result.stderr[-6000:]}"
    assert "DYNAMIC_TEST_SUCCESS" in result.stdout
    assert "runtime error" not in result.stderr and "AddressSanitizer" not in result.stderr, result.stderr
    return result


def _outputs(path: Path) -> list:
    return [np.array([float(v) for v in line.split()], np.float32) for line in path.read_text().splitlines()]


def _check_outputs(app):
    got = _outputs(app["data"] / "trees_out.txt")
    want = [np.asarray(part.numpy()).reshape(-1) for h_c in app["tree"] for part in h_c]
    assert len(got) == len(want) == 2 * len(app["tree"])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    got = _outputs(app["data"] / "lstm_out.txt")
    want = [np.asarray(part.numpy()).reshape(-1) for h_c in app["lstm"] for part in h_c]
    assert len(got) == len(want) == 2 * len(LENGTHS)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _errors(app) -> dict:
    out = {}
    for line in (app["data"] / "errors.txt").read_text().splitlines():
        name, code, message = (line.split(" ", 2) + [""])[:3]
        out[name] = (int(code), message)
    return out


def test_tree_lstm_and_lstm_in_a_c_application_match_the_interpreter(app):
    _run(app, PLAIN)
    _check_outputs(app)


def test_errors_come_back_as_codes_and_messages(app):
    _run(app, PLAIN)
    errors = _errors(app)
    argument, depth, memory = 6, 5, 7  # TVD_ERR_ARGUMENT, TVD_ERR_DEPTH, TVD_ERR_MEMORY (tensorvm_dynamic.h)
    assert errors["lstm_rank"][0] == argument and "rank 3, got rank 2" in errors["lstm_rank"][1]
    assert errors["lstm_dtype"][0] == argument and "bits 32, got code 2 bits 64" in errors["lstm_dtype"][1]
    assert errors["lstm_shape"][0] == argument and f"dimension 2 must be {LSTM_I}" in errors["lstm_shape"][1]
    assert errors["lstm_null_data"][0] == argument and "NULL" in errors["lstm_null_data"][1]
    assert errors["lstm_null_result"][0] == argument and "result is NULL" in errors["lstm_null_result"][1]
    assert errors["lstm_after_errors"] == (0, "")
    assert errors["tree_not_a_tree"][0] == argument and "expected a value of type Tree, got a tensor" in \
        errors["tree_not_a_tree"][1]
    assert errors["leaf_field_shape"][0] == argument and "Tree.Leaf: field 0" in errors["leaf_field_shape"][1]
    assert errors["node_child_not_a_tree"][0] == argument and "expected a value of type Tree, got a tuple" in \
        errors["node_child_not_a_tree"][1]
    assert errors["tree_depth"][0] == depth and "recursion deeper than 3 nested calls" in errors["tree_depth"][1]
    assert "tree_lstm" in errors["tree_depth"][1]  # (names the VM function)
    assert errors["tree_shallow_ok"] == (0, "")
    assert errors["tree_memory_limit"][0] == memory and "out of memory" in errors["tree_memory_limit"][1]


def test_clean_under_address_and_undefined_sanitizers_with_leak_detection(app, tmp_path):
    probe = tmp_path / "probe.c"
    probe.write_text("#include <stdlib.h>\nint main(void) { void* p = malloc(4); free(p); return 0; }\n")
    built = subprocess.run([CC, *SANITIZE, str(probe), "-o", str(tmp_path / "probe")], capture_output=True)
    if built.returncode or subprocess.run([str(tmp_path / "probe")], capture_output=True).returncode:
        pytest.skip("the sanitizer runtime (libasan/libubsan) is absent: cannot build with -fsanitize=address,undefined")
    _run(app, SANITIZE, env={"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
                             "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"})
    _check_outputs(app)


def test_the_library_exports_only_its_prefix(app, tmp_path):
    """Two models link into one application: every strong global symbol is tvd_<name>_..."""
    for source in app["sources"]:
        obj = tmp_path / (Path(source).stem + ".o")
        built = subprocess.run([CC, "-std=c11", "-O1", f"-I{app['directory'] / 'include'}", "-c", str(source), "-o",
                                str(obj)], capture_output=True, text=True)
        assert built.returncode == 0, built.stderr[:4000]
        nm = shutil.which("nm")
        if nm is None:
            pytest.skip("no nm to list the symbols")
        symbols = subprocess.run([nm, "-g", "--defined-only", str(obj)], capture_output=True, text=True).stdout
        strong = [line.split()[-1] for line in symbols.splitlines() if line.split()[1] in "TDB"]
        assert strong and all(s.startswith(f"tvd_{Path(source).stem}_") for s in strong), strong


def test_the_header_declares_constructors_tags_and_entry_points(app):
    tree = app["libraries"][0]
    header = tree.sources["tree.h"]
    assert "int32_t tvd_tree_Tree_Node(tvd_model* m, tvd_value* f0, tvd_value* f1, tvd_value* f2, tvd_value** out);" \
        in header
    assert "#define TVD_TREE_TREE_LEAF" in header
    assert "int32_t tvd_tree_main(tvd_model* m, tvd_value* tree, tvd_value** result);" in header
    lstm_header = app["libraries"][1].sources["lstm.h"]
    assert "int32_t tvd_lstm_main(tvd_model* m, const tvd_tensor* xs, tvd_value** result);" in lstm_header
    assert "Python.h" not in tree.sources["tree.c"] and "PyObject" not in tree.sources["tree.c"]  # no CPython


def test_a_c_name_taken_by_the_api_is_refused():
    mod = tv.parse("""
def @release(%x: Tensor[(2), float32]) { add(%x, %x) }
def @main(%x: Tensor[(2), float32]) { @release(%x) }
""")
    with pytest.raises(UnsupportedError, match="tvd_m_release"):
        tv.aot.build(mod, name="m", dynamic=True)
