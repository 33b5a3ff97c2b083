"""AOT for dynamic programs (``tv.aot.build(mod, dynamic=True)``, docs/aot_dynamic.md): the suite's
Tree-LSTM and LSTM (benchmarks/models) as standalone C libraries, linked with the C application
``tests/aot/dynamic_main.c`` (``-Wall -Werror``), which builds trees with the constructors, runs sequences
of three lengths and error cases, through its own counting allocator (every block must come back).
Oracle: the interpreter (``tv.create_executor("debug", mod)``) on the same inputs. Built once plainly and
once under ``-fsanitize=address,undefined`` with leak detection."""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models import lstm, treelstm  # noqa: E402
from programs import PROGRAMS  # noqa: E402

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="needs a C compiler (cc)")
MAIN = Path(__file__).parent / "dynamic_main.c"

TREE_I, TREE_H = 12, 10
LSTM_I, LSTM_H = 6, 32  # (w_hh: 16 KB, a constant written as bytes; w_ih: 3 KB, as values)
LENGTHS = (1, 4, 9, 0)  # (and an empty sequence)
PLAIN = ["-std=c11", "-O2", "-Wall", "-Werror", *tv.aot.dynamic.C_FLAGS]
SANITIZE = ["-std=c11", "-O0", "-g", "-Wall", "-Werror", *tv.aot.dynamic.C_FLAGS, "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]


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
                 tv.aot.build(lstm_mod, name="lstm", params=lstm_params, dynamic=True),
                 tv.aot.build(lstm_mod, name="lstmb", params=lstm_params, dynamic=True, constants="blob"),
                 tv.aot.build(tv.parse(MISC), name="misc", dynamic=True)]
    sources = []
    for library in libraries:
        sources += library.write_sources(directory)["sources"]
    data = directory / "data"
    data.mkdir()
    (data / "lstmb.params").write_bytes(libraries[2].blob)
    trees = treelstm.make_trees(4, TREE_I, min_nodes=1, max_nodes=9, seed=3)
    trees.append(("leaf", np.ones((1, TREE_I), np.float32)))
    lines = [f"{len(trees)} {TREE_I}"]
    for tree in trees:
        treelstm.tree_lines(tree, lines)
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


def _cached_build(name: str, directory: Path, sources: list, flags: list, extra: tuple = ()) -> Path:
    """``cc flags -I<directory>/include sources extra -o OUT``, cached in the kernel cache by the hash of
    everything it is built from (headers, sources, flags, the compiler's version)."""
    from tensorvm.codegen.build import cache_dir

    version = subprocess.run([CC, "--version"], capture_output=True, text=True).stdout
    texts = [p.read_bytes() for p in sorted((directory / "include").iterdir())]
    texts += [p.read_bytes() for p in sorted(MAIN.parent.glob("*.h"))]  # (tree_text.h)
    texts += [Path(p).read_bytes() for p in sources] + [" ".join([*flags, *extra]).encode(), version.encode()]
    key = hashlib.sha256(b"\0".join(texts)).hexdigest()[:24]
    out = cache_dir() / f"aotdyn_test_{name}_{key}"
    if not out.exists():
        partial = directory / f"{out.name}.build"
        command = [CC, *flags, f"-I{directory / 'include'}", *map(str, sources), *extra, "-o", str(partial)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[:6000]
        staged = out.with_name(f"{out.name}.{os.getpid()}.tmp")
        shutil.copy2(partial, staged)
        os.replace(staged, out)  # (the cache only ever holds complete builds)
    return out


def _build(app, flags) -> Path:
    """The application built with flags."""
    return _cached_build("app", app["directory"], [MAIN, *app["sources"]], [*flags, f"-I{MAIN.parent}"],
                         ("-lm", "-lpthread"))


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
    for name in ("lstm", "lstmb"):  # (constants embedded; from the params blob)
        got = _outputs(app["data"] / f"{name}_out.txt")
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


def test_the_params_blob_is_checked_and_every_corruption_tried_is_refused(app):
    """dynamic_main.c loads the LSTM's constants from its blob; before that, every truncation and bit flip of
    the header and table and a sample of the data's (also under ASan, next test) must be TVD_ERR_FORMAT."""
    _run(app, PLAIN)
    errors = _errors(app)
    argument, fmt = 6, 8  # TVD_ERR_ARGUMENT, TVD_ERR_FORMAT (tensorvm_dynamic.h)
    size = len(app["libraries"][2].blob)
    assert errors["blob_not_loaded"][0] == argument and "params are not loaded" in errors["blob_not_loaded"][1]
    assert errors["blob_no_file"][0] == fmt and "cannot open" in errors["blob_no_file"][1]
    # a directory: a FORMAT error before any allocation (it had asked the allocator for LONG_MAX bytes)
    assert errors["blob_directory"][0] == fmt and "cannot read" in errors["blob_directory"][1]
    assert errors["blob_truncated"] == (fmt, f"load_params: the params blob says it has {size} bytes, got {size - 64} "
                                             f"(truncated or padded)")
    assert errors["blob_header_truncated"][0] == fmt and "fewer than its 80-byte header" in errors["blob_header_truncated"][1]
    assert errors["blob_magic"][0] == fmt and "expected the magic TVDPARAM" in errors["blob_magic"][1]
    assert errors["blob_version"] == (fmt, "load_params: params blob version 3, this library reads version 1")
    assert errors["blob_hash"][0] == fmt and "belongs to another program" in errors["blob_hash"][1]
    assert errors["blob_checksum"][0] == fmt and "checksum does not match" in errors["blob_checksum"][1]
    assert errors["blob_count"][0] == fmt and "constants, this library has" in errors["blob_count"][1]
    refused, blob_size = map(int, errors["blob_refused"][1].split()), size
    assert next(iter(refused)) > 3000
    assert errors["blob_load"] == (0, "") and errors["blob_run"] == (0, "")
    assert errors["blob_twice"][0] == argument and "loaded already" in errors["blob_twice"][1]
    assert blob_size % 64 == 0


def test_the_c_application_sees_the_argument_checks_of_named_dims_and_closures(app):
    _run(app, PLAIN)
    errors = _errors(app)
    assert errors["misc_tree_ok"] == (0, "")
    assert errors["misc_tree_vs_x"] == (6, "@tree_plus: parameter %x: expected Tensor[(n, 2), float32], got a tensor "
                                           "of shape (5, 2): dimension 0 is n = 5, but @tree_plus: parameter %t has n = 3")
    assert errors["misc_leaves_differ"] == (6, "@tree_plus: parameter %t: expected Tensor[(n, 2), float32], got a "
                                               "tensor of shape (4, 2): dimension 0 is n = 4, but @tree_plus: parameter "
                                               "%t has n = 3")
    assert errors["misc_pair_fields_differ"] == (6, "@pair_plus: parameter %p: expected Tensor[(n), float32], got a "
                                                    "tensor of shape (4): dimension 0 is n = 4, but @pair_plus: "
                                                    "parameter %p has n = 3")
    assert errors["misc_pair_vs_x"] == (6, "@pair_plus: parameter %x: expected Tensor[(n), float32], got a tensor of "
                                           "shape (2): dimension 0 is n = 2, but @pair_plus: parameter %p has n = 3")
    assert errors["misc_rows_ctor"] == (6, "Rows.Rows: field 1: expected Tensor[(n), float32], got a tensor of shape "
                                           "(4): dimension 0 is n = 4, but Rows.Rows: field 0 has n = 3")
    assert errors["misc_rows_vs_x"] == (6, "@rows: parameter %x: expected Tensor[(n, 2), float32], got a tensor of "
                                           "shape (5, 2): dimension 0 is n = 5, but @rows: parameter %r has n = 3")
    assert errors["misc_closure_arity"][0] == 6 and "expected a function of 1 argument(s)" in \
        errors["misc_closure_arity"][1] and "got a closure of 2 argument(s)" in errors["misc_closure_arity"][1]
    assert errors["misc_closure_types"][0] == 6 and "got a closure of another signature fn (Tensor[(?), int32]) -> " \
        "Tensor[(?), int32]" in errors["misc_closure_types"][1]


def test_clean_under_address_and_undefined_sanitizers_with_leak_detection(app, tmp_path):
    probe = tmp_path / "probe.c"
    probe.write_text("#include <stdlib.h>\nint main(void) { void* p = malloc(4); free(p); return 0; }\n")
    built = subprocess.run([CC, *SANITIZE, str(probe), "-o", str(tmp_path / "probe")], capture_output=True)
    if built.returncode or subprocess.run([str(tmp_path / "probe")], capture_output=True).returncode:
        pytest.skip("the sanitizer runtime (libasan/libubsan) is absent: cannot build with -fsanitize=address,undefined")
    _run(app, SANITIZE, env={"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
                             "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"})
    _check_outputs(app)


def test_the_library_exports_only_its_prefix(app):
    """Two models link into one application: every strong global symbol is tvd_<name>_... (and the unit is
    warning-free under -Wextra too)."""
    for source in app["sources"]:
        obj = _cached_build("object", app["directory"], [source], ["-std=c11", "-O0", "-Wall", "-Wextra", "-Werror",
                                                                    "-c"])
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
    lstm_c = app["libraries"][1].sources["lstm.c"]  # (both ways of writing constants are in the C app's run)
    assert "unsigned char bytes[16384]; float values[4096]; }" in lstm_c
    assert re.search(r"float tvd_c\d+\[768\] = {", lstm_c)


def test_a_c_name_taken_by_the_api_is_refused():
    mod = tv.parse("""
def @release(%x: Tensor[(2), float32]) { add(%x, %x) }
def @main(%x: Tensor[(2), float32]) { @release(%x) }
""")
    with pytest.raises(UnsupportedError, match="tvd_m_release"):
        tv.aot.build(mod, name="m", dynamic=True)


def test_constants_must_be_embed_or_blob_and_blob_is_for_dynamic_only():
    mod = tv.parse("def @main(%x: Tensor[(2), float32]) { add(%x, %x) }")
    with pytest.raises(UnsupportedError, match="constants must be 'embed' or 'blob', got 'file'"):
        tv.aot.build(mod, name="m", dynamic=True, constants="file")
    with pytest.raises(UnsupportedError, match="constants='blob' is for dynamic=True"):
        tv.aot.build(mod, name="m", constants="blob")


def test_the_blob_holds_the_constants_and_the_c_only_their_shapes(app):
    """Layout (docs/aot_dynamic.md): a table of 64-aligned constants within the file, as many bytes as the
    embedded library's constants (that they are the right bytes: the C application's LSTM outputs); the C of the
    blob library has no weights; the hash in the blob is the one in the C."""
    embedded, blob = app["libraries"][1], app["libraries"][2]
    data = blob.blob
    count = int(np.frombuffer(data[12:16], "<u4")[0])
    table = np.frombuffer(data[80:80 + 16 * count], "<u8").reshape(count, 2)
    assert all(offset % 64 == 0 and offset + nbytes <= len(data) for offset, nbytes in table)
    assert int(table[:, 1].sum()) == blob.constants_size == embedded.constants_size > 16384
    assert len(embedded.sources["lstm.c"]) - len(blob.sources["lstmb.c"]) > 3 * blob.constants_size  # (>= 4 chars a byte)
    digest = ", ".join(map(str, data[40:72]))
    assert f"tvd_program_hash[32] = {{{digest}}};" in blob.sources["lstmb.c"]


# --- more programs, called through ctypes from the library built as a shared object -------------------
MISC = """
def @total(%xs: List[Tensor[(3), float32]], %acc: Tensor[(3), float32]) -> Tensor[(3), float32] {
  match (%xs) { Cons(%h, %t) => @total(%t, add(%acc, %h)), Nil => %acc }
}
def @sum_list(%xs: List[Tensor[(3), float32]]) -> Tensor[(3), float32] {
  @total(%xs, zeros(shape=[3], dtype="float32"))
}
def @make(%k: float32) -> fn (Tensor[(?), float32]) -> Tensor[(?), float32] {
  fn (%t: Tensor[(?), float32]) -> Tensor[(?), float32] { multiply(%t, %k) }
}
def @apply(%f: fn (Tensor[(?), float32]) -> Tensor[(?), float32], %x: Tensor[(?), float32]) -> Tensor[(?), float32] {
  %f(%x)
}
def @divide(%x: Tensor[(?), int32], %y: Tensor[(?), int32]) -> Tensor[(?), int32] { floor_divide(%x, %y) }
def @loop(%i: int32, %acc: int32) -> int32 {
  if (equal(%i, 0)) { %acc } else { @loop(subtract(%i, 1), add(%acc, %i)) }
}
def @ident(%x: Tensor[(?), float32]) -> Tensor[(?), float32] { %x }
def @two() -> float32 { 2f }
def @range(%n: int32, %acc: List[int32]) -> List[int32] {
  if (equal(%n, 0)) { %acc } else { @range(subtract(%n, 1), Cons(%n, %acc)) }
}
def @scale_rows(%x: Tensor[(n, 2), float32], %v: Tensor[(n), float32]) -> Tensor[(n, 2), float32] {
  multiply(%x, expand_dims(%v, axis=1))
}
def @main(%x: Tensor[(?), float32]) -> Tensor[(?), float32] { @apply(@make(2f), %x) }
type Tree[A] { Leaf(A), Node(Tree[A], Tree[A]) }
def @tree_sum(%t: Tree[Tensor[(n, 2), float32]]) -> Tensor[(n, 2), float32] {
  match (%t) { Leaf(%x) => %x, Node(%l, %r) => add(@tree_sum(%l), @tree_sum(%r)) }
}
def @tree_plus(%t: Tree[Tensor[(n, 2), float32]], %x: Tensor[(n, 2), float32]) -> Tensor[(n, 2), float32] {
  add(@tree_sum(%t), %x)
}
def @pair_plus(%p: (Tensor[(n), float32], Tensor[(n), float32]), %x: Tensor[(n), float32]) -> Tensor[(n), float32] {
  add(add(%p.0, %p.1), %x)
}
type Rows { Rows(Tensor[(n, 2), float32], Tensor[(n), float32]) }
def @rows(%r: Rows, %x: Tensor[(n, 2), float32]) -> Tensor[(n, 2), float32] {
  match (%r) { Rows(%a, %b) => add(%a, %x) }
}
def @make_add() -> fn (Tensor[(?), float32], Tensor[(?), float32]) -> Tensor[(?), float32] {
  fn (%a: Tensor[(?), float32], %b: Tensor[(?), float32]) -> Tensor[(?), float32] { add(%a, %b) }
}
def @make_neg() -> fn (Tensor[(?), int32]) -> Tensor[(?), int32] {
  fn (%a: Tensor[(?), int32]) -> Tensor[(?), int32] { negative(%a) }
}"""
# (the program suite's cell written in a loop, tests/programs.py, as @cells)
MISC += next(p for p in PROGRAMS if p.name == "reference_cell_written_in_a_loop").text.replace("@main", "@cells")
# (a closure stored in the cell it captures: a cycle, tests/programs.py, as @knot)
MISC += next(p for p in PROGRAMS if p.name == "reference_cell_holding_the_closure_that_reads_it").text.replace(
    "@main", "@knot")


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_CODES = {"f": 2, "i": 0, "u": 1}


class _Lib:
    """The misc library through ctypes: every function returns its status; values are c_void_p."""

    def __init__(self, path: Path):
        self.dll = ctypes.CDLL(str(path))
        self.model = ctypes.c_void_p()
        assert self.fn("create")(None, ctypes.byref(self.model)) == 0
        self.keep = []

    def fn(self, name):
        f = getattr(self.dll, f"tvd_misc_{name}")
        if name in ("last_error",):
            f.restype = ctypes.c_char_p
        elif name in ("field",):
            f.restype = ctypes.c_void_p
        elif name in ("tag",):
            f.restype = ctypes.c_int64
        elif name not in ("release", "destroy", "memory_stats"):
            f.restype = ctypes.c_int32
        return f

    def tensor(self, array) -> _DLTensor:
        array = np.ascontiguousarray(array) if np.ndim(array) else np.array(array)  # (0-d stays 0-d)
        shape = (ctypes.c_int64 * max(array.ndim, 1))(*array.shape)
        self.keep.append((array, shape))
        return _DLTensor(array.ctypes.data, 1, 0, array.ndim, _CODES[array.dtype.kind], array.dtype.itemsize * 8, 1,
                         shape, None, 0)

    def value(self, array):
        out = ctypes.c_void_p()
        assert self.fn("tensor")(self.model, ctypes.byref(self.tensor(array)), ctypes.byref(out)) == 0
        return out

    def call(self, name, *args):
        result = ctypes.c_void_p()
        converted = [ctypes.byref(self.tensor(a)) if isinstance(a, np.ndarray) else a for a in args]
        rc = self.fn(name)(self.model, *converted, ctypes.byref(result))
        return rc, result, self.fn("last_error")(self.model).decode()

    def numpy(self, value, dtype="float32"):
        t = _DLTensor()
        assert self.fn("tensor_get")(value, ctypes.byref(t)) == 0
        shape = tuple(t.shape[i] for i in range(t.ndim))
        count = int(np.prod(shape, dtype=np.int64))
        buffer = (ctypes.c_char * (count * np.dtype(dtype).itemsize)).from_address(t.data)
        return np.frombuffer(buffer, dtype=dtype).reshape(shape), t

    def release(self, value):
        self.fn("release")(value)

    def live_bytes(self) -> int:
        stats = (ctypes.c_int64 * 7)()
        self.fn("memory_stats")(self.model, stats)
        return stats[3]


@pytest.fixture(scope="module")
def misc(tmp_path_factory):
    directory = tmp_path_factory.mktemp("aotdyn_misc")
    library = tv.aot.build(tv.parse(MISC), name="misc", dynamic=True)
    layout = library.write_sources(directory)
    flags = ["-std=c11", "-O1", "-Wall", "-Werror", "-shared", "-fPIC", *tv.aot.dynamic.C_FLAGS]
    so = _cached_build("misc", directory, layout["sources"], flags, ("-lm", "-lpthread"))
    lib = _Lib(so)
    yield lib, tv.create_executor("debug", tv.parse(MISC))
    lib.fn("destroy")(lib.model)


def _list(lib, arrays):
    """A List built with the constructors, last element first."""
    nil = ctypes.c_void_p()
    assert lib.fn("List_Nil")(lib.model, ctypes.byref(nil)) == 0
    tail = nil
    for array in reversed(arrays):
        head, cell = lib.value(array), ctypes.c_void_p()
        assert lib.fn("List_Cons")(lib.model, head, tail, ctypes.byref(cell)) == 0, lib.fn("last_error")(lib.model)
        lib.release(head)
        lib.release(tail)
        tail = cell
    return tail


def test_a_list_built_in_c_long_lists_in_constant_stack_and_a_wrong_element(misc):
    lib, oracle = misc
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(3).astype("float32") for _ in range(5)]
    xs = _list(lib, arrays)
    rc, result, message = lib.call("sum_list", xs)
    assert rc == 0, message
    np.testing.assert_allclose(lib.numpy(result)[0], np.sum(arrays, axis=0), rtol=1e-5)
    lib.release(result)
    lib.release(xs)
    long = _list(lib, [np.ones(3, "float32")] * 100_000)  # (checked along the list, summed by a tail loop)
    rc, result, message = lib.call("sum_list", long)
    assert rc == 0, message
    np.testing.assert_allclose(lib.numpy(result)[0], np.full(3, 100_000, "float32"))
    lib.release(result)
    lib.release(long)
    wrong = _list(lib, [np.ones(3, "float32"), np.ones(4, "float32")])  # (Cons takes any A: checked at the call)
    rc, result, message = lib.call("sum_list", wrong)
    assert rc == 6 and "expected Tensor[(3), float32], got a tensor of dtype code 2 bits 32, shape (4)" in message
    assert not result
    lib.release(wrong)
    assert lib.live_bytes() == 0


def test_closures_go_out_and_back_in(misc):
    lib, oracle = misc
    k = np.array(3.0, "float32")
    rc, scale, message = lib.call("make", k)
    assert rc == 0 and lib.fn("is_closure")(scale) == 1, message
    k[...] = 100  # (the closure captured the argument: it keeps a copy, not the caller's buffer)
    x = np.arange(5, dtype="float32")
    rc, result, message = lib.call("apply", scale, x)
    assert rc == 0, message
    np.testing.assert_allclose(lib.numpy(result)[0], x * 3)
    lib.release(result)
    not_a_function = lib.value(x)
    rc, result, message = lib.call("apply", not_a_function, x)
    assert rc == 6 and "expected a function" in message
    lib.release(not_a_function)
    lib.release(scale)
    rc, result, message = lib.call("main", x)
    np.testing.assert_allclose(lib.numpy(result)[0], oracle.evaluate()(x).numpy())
    lib.release(result)
    assert lib.live_bytes() == 0


def test_kernel_errors_name_the_kernel_and_the_function(misc):
    lib, _ = misc
    rc, result, message = lib.call("divide", np.array([4, 5], "int32"), np.array([2, 0], "int32"))
    assert rc == 1 and "integer division by zero" in message and "'divide' at pc" in message, message
    rc, result, message = lib.call("divide", np.array([4, 5], "int32"), np.array([2, 3, 4], "int32"))
    assert rc == 2, message  # (shapes that do not broadcast: a shape error)
    rc, result, message = lib.call("divide", np.array([4, 5], "int32"), np.array([2, 3], "int32"))
    assert rc == 0 and lib.numpy(result, "int32")[0].tolist() == [2, 1]
    lib.release(result)


def test_a_tail_loop_of_60000_steps_and_results_the_caller_owns(misc):
    lib, oracle = misc
    rc, result, message = lib.call("loop", np.array(60_000, "int32"), np.array(0, "int32"))
    assert rc == 0, message
    assert int(lib.numpy(result, "int32")[0]) == 60_000 * 60_001 // 2
    lib.release(result)
    x = np.arange(4, dtype="float32")
    rc, result, message = lib.call("ident", x)  # the result is the argument: copied, not the caller's buffer
    got, view = lib.numpy(result)
    assert view.data != x.ctypes.data and got.tolist() == x.tolist()
    lib.release(result)
    rc, result, message = lib.call("two")  # the result is a constant: a writable copy
    got, view = lib.numpy(result)
    assert got == 2
    ctypes.c_float.from_address(view.data).value = 7.0
    lib.release(result)
    rc, result, message = lib.call("two")
    assert lib.numpy(result)[0] == 2
    lib.release(result)
    assert lib.live_bytes() == 0


def test_reference_cells_written_by_closures_in_the_c_library(misc):
    """A reference a recursive closure's callee writes (a cell, docs/architecture.md) in the standalone
    library: the interpreter's values, and every cell freed with its call."""
    lib, oracle = misc
    x = np.array([1.0, -2.0, 0.5], "float32")
    for n in (0, 1, 4, 30):
        rc, result, message = lib.call("cells", x, np.array(n, "int32"))
        assert rc == 0, message
        got, _ = lib.numpy(result)
        np.testing.assert_allclose(got, oracle.evaluate("cells")(x, np.int32(n)).numpy(), rtol=1e-6)
        lib.release(result)
    assert lib.live_bytes() == 0


def test_a_named_dim_has_one_value_across_the_parameters(misc):
    lib, oracle = misc
    x, v = np.arange(6, dtype="float32").reshape(3, 2), np.array([1, 2, 3], "float32")
    rc, result, message = lib.call("scale_rows", x, v)
    assert rc == 0, message
    np.testing.assert_allclose(lib.numpy(result)[0], oracle.evaluate("scale_rows")(x, v).numpy())
    lib.release(result)
    rc, result, message = lib.call("scale_rows", x, np.ones(4, "float32"))
    assert rc == 6 and ("@scale_rows: parameter %v: expected Tensor[(n), float32], got a tensor of shape (4): "
                        "dimension 0 is n = 4, but @scale_rows: parameter %x has n = 3") in message, message
    assert not result and lib.live_bytes() == 0


def _tree(lib, spec):
    """A Tree[Tensor] built with the constructors from ("leaf", array) / ("node", left, right)."""
    out = ctypes.c_void_p()
    if spec[0] == "leaf":
        x = lib.value(spec[1])
        assert lib.fn("Tree_Leaf")(lib.model, x, ctypes.byref(out)) == 0, lib.fn("last_error")(lib.model)
        lib.release(x)
    else:
        left, right = _tree(lib, spec[1]), _tree(lib, spec[2])
        assert lib.fn("Tree_Node")(lib.model, left, right, ctypes.byref(out)) == 0, lib.fn("last_error")(lib.model)
        lib.release(left)
        lib.release(right)
    return out


def _tree_value(mod, spec):
    if spec[0] == "leaf":
        return mod.constructor("Leaf")(spec[1])
    return mod.constructor("Node")(_tree_value(mod, spec[1]), _tree_value(mod, spec[2]))


def _interpreter_error(oracle, name, *args) -> str:
    """The interpreter's refusal of these arguments (it must refuse them: the C library's checks are its)."""
    from tensorvm.errors import TensorVMError

    with pytest.raises(TensorVMError) as info:
        oracle.evaluate(name)(*args)
    return str(info.value)


@pytest.mark.parametrize("case", ["ok", "leaves_differ", "tree_vs_x", "deep_leaf_differs"])
def test_named_dims_inside_adt_fields_bind_across_parameters(misc, case):
    lib, oracle = misc
    mod = tv.parse(MISC)
    a, b = np.ones((3, 2), "float32"), np.full((3, 2), 2, "float32")
    x = np.arange(6, dtype="float32").reshape(3, 2)
    spec = ("node", ("leaf", a), ("node", ("leaf", b), ("leaf", a)))
    if case == "leaves_differ":
        spec = ("node", ("leaf", a), ("leaf", np.ones((4, 2), "float32")))
    elif case == "tree_vs_x":
        x = np.ones((5, 2), "float32")
    elif case == "deep_leaf_differs":
        spec = ("node", ("leaf", a), ("node", ("leaf", b), ("leaf", np.ones((2, 2), "float32"))))
    tree = _tree(lib, spec)
    rc, result, message = lib.call("tree_plus", tree, x)
    if case == "ok":
        assert rc == 0, message
        want = oracle.evaluate("tree_plus")(_tree_value(mod, spec), x).numpy()
        np.testing.assert_allclose(lib.numpy(result)[0], want)
        lib.release(result)
    else:
        assert "n =" in _interpreter_error(oracle, "tree_plus", _tree_value(mod, spec), x)
        assert rc == 6 and not result, message
        got, bound = {"leaves_differ": ("(4, 2)", 3), "tree_vs_x": ("(5, 2)", 3), "deep_leaf_differs": ("(2, 2)", 3)}[case]
        where = "@tree_plus: parameter %x" if case == "tree_vs_x" else "@tree_plus: parameter %t"
        assert (f"{where}: expected Tensor[(n, 2), float32], got a tensor of shape {got}: dimension 0 is "
                f"n = {got[1]}, but @tree_plus: parameter %t has n = {bound}") in message, message
    lib.release(tree)
    assert lib.live_bytes() == 0


@pytest.mark.parametrize("case", ["ok", "fields_differ", "pair_vs_x"])
def test_named_dims_inside_tuple_fields_bind_across_parameters(misc, case):
    lib, oracle = misc
    p0, p1, x = np.ones(3, "float32"), np.arange(3, dtype="float32"), np.full(3, 5, "float32")
    if case == "fields_differ":
        p1 = np.arange(4, dtype="float32")
    elif case == "pair_vs_x":
        x = np.ones(2, "float32")
    v0, v1, pair = lib.value(p0), lib.value(p1), ctypes.c_void_p()
    assert lib.fn("tuple")(lib.model, 2, (ctypes.c_void_p * 2)(v0, v1), ctypes.byref(pair)) == 0
    lib.release(v0)
    lib.release(v1)
    rc, result, message = lib.call("pair_plus", pair, x)
    if case == "ok":
        assert rc == 0, message
        np.testing.assert_allclose(lib.numpy(result)[0], oracle.evaluate("pair_plus")((p0, p1), x).numpy())
        lib.release(result)
    else:
        assert "n =" in _interpreter_error(oracle, "pair_plus", (p0, p1), x)
        got, where = ("(4)", "%p") if case == "fields_differ" else ("(2)", "%x")
        assert rc == 6 and not result and (f"@pair_plus: parameter {where}: expected Tensor[(n), float32], got a tensor "
                                           f"of shape {got}: dimension 0 is n = {got[1]}, but @pair_plus: parameter %p "
                                           f"has n = 3") in message, message
    lib.release(pair)
    assert lib.live_bytes() == 0


def test_named_dims_in_a_monomorphic_adt_bind_in_its_constructor_and_across_parameters(misc):
    lib, oracle = misc
    mod = tv.parse(MISC)
    a, b, x = np.ones((3, 2), "float32"), np.arange(3, dtype="float32"), np.full((3, 2), 4, "float32")
    va, vb, v4, rows = lib.value(a), lib.value(b), lib.value(np.ones(4, "float32")), ctypes.c_void_p()
    make = lib.fn("Rows_Rows")
    assert "n =" in _interpreter_error(oracle, "rows", mod.constructor("Rows")(a, np.ones(4, "float32")), x)
    assert make(lib.model, va, v4, ctypes.byref(rows)) == 6 and not rows
    assert ("Rows.Rows: field 1: expected Tensor[(n), float32], got a tensor of shape (4): dimension 0 is n = 4, but "
            "Rows.Rows: field 0 has n = 3") in lib.fn("last_error")(lib.model).decode()
    assert make(lib.model, va, vb, ctypes.byref(rows)) == 0
    rc, result, message = lib.call("rows", rows, x)
    assert rc == 0, message
    np.testing.assert_allclose(lib.numpy(result)[0], oracle.evaluate("rows")(mod.constructor("Rows")(a, b), x).numpy())
    lib.release(result)
    wide = np.ones((5, 2), "float32")
    assert "n =" in _interpreter_error(oracle, "rows", mod.constructor("Rows")(a, b), wide)
    rc, result, message = lib.call("rows", rows, wide)
    assert rc == 6 and not result and ("@rows: parameter %x: expected Tensor[(n, 2), float32], got a tensor of shape "
                                       "(5, 2): dimension 0 is n = 5, but @rows: parameter %r has n = 3") in message
    for value in (va, vb, v4, rows):
        lib.release(value)
    assert lib.live_bytes() == 0


def test_a_function_parameter_checks_the_closures_arity_and_types(misc):
    """Each closure records its VM function; the program's closure-making functions are known at build time, so
    the check accepts exactly those whose signature fits the parameter's function type."""
    lib, _ = misc
    x = np.arange(3, dtype="float32")
    rc, add2, message = lib.call("make_add")
    assert rc == 0, message
    rc, result, message = lib.call("apply", add2, x)
    assert rc == 6 and not result, message
    assert ("@apply: parameter %f: expected a function of 1 argument(s) fn (Tensor[(?), float32]) -> Tensor[(?), "
            "float32], got a closure of 2 argument(s) fn (Tensor[(?), float32], Tensor[(?), float32]) -> "
            "Tensor[(?), float32] (VM function 'make_add_") in message, message
    rc, neg, message = lib.call("make_neg")
    assert rc == 0, message
    rc, result, message = lib.call("apply", neg, x)
    assert rc == 6 and not result, message
    assert ("@apply: parameter %f: expected a function fn (Tensor[(?), float32]) -> Tensor[(?), float32], got a "
            "closure of another signature fn (Tensor[(?), int32]) -> Tensor[(?), int32] (VM function 'make_neg") \
        in message, message
    rc, scale, message = lib.call("make", np.array(2.0, "float32"))
    rc, result, message = lib.call("apply", scale, x)
    assert rc == 0 and lib.numpy(result)[0].tolist() == (2 * x).tolist(), message
    for value in (add2, neg, scale, result):
        lib.release(value)
    assert lib.live_bytes() == 0


def test_parameter_names_that_are_c_keywords_or_locals_are_renamed(tmp_path):
    mod = tv.parse("""
def @main(%int: Tensor[(2), float32], %rc: Tensor[(2), float32], %args: Tensor[(2), float32]) {
  add(add(%int, %rc), %args)
}
""")
    library = tv.aot.build(mod, name="kw", dynamic=True)
    header = library.sources["kw.h"]
    layout = library.write_sources(tmp_path)
    checked = subprocess.run([CC, "-std=c11", "-fsyntax-only", "-Wall", "-Werror", f"-I{tmp_path / 'include'}",
                              str(layout["sources"][0])], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr[:4000]
    assert ("int32_t tvd_kw_main(tvd_model* m, const tvd_tensor* int_, const tvd_tensor* rc_, const tvd_tensor* args_, "
            "tvd_value** result);") in header


def test_a_cycle_through_a_cell_is_freed_by_the_c_library(misc):
    """A closure stored in the cell it captures (recursion through a reference): a cycle that reference
    counting alone never frees; the library's collector frees it, and the tensor it held, with the call."""
    lib, oracle = misc
    x = np.linspace(-1, 1, 1000, dtype="float32")
    for n in range(6):
        rc, result, message = lib.call("knot", x, np.array(n, "int32"))
        assert rc == 0, message
        np.testing.assert_allclose(lib.numpy(result)[0], oracle.evaluate("knot")(x, np.int32(n)).numpy(), rtol=1e-6)
        lib.release(result)
        assert lib.live_bytes() == 0, f"call {n}: the cycle's tensor is still held"


def test_a_list_of_a_million_cells_made_by_the_program_is_checked_and_freed_in_constant_stack(misc):
    """Releasing a long list used to recurse once per cell in the runtime's free (a crash past the C stack)."""
    lib, _ = misc
    nil = ctypes.c_void_p()
    assert lib.fn("List_Nil")(lib.model, ctypes.byref(nil)) == 0
    rc, cells, message = lib.call("range", np.array(1_000_000, "int32"), nil)
    assert rc == 0, message
    first = ctypes.c_void_p(lib.fn("field")(cells, 0))  # (borrowed)
    second = ctypes.c_void_p(lib.fn("field")(ctypes.c_void_p(lib.fn("field")(cells, 1)), 0))
    assert int(lib.numpy(first, "int32")[0]) == 1 and int(lib.numpy(second, "int32")[0]) == 2
    rc, same, message = lib.call("range", np.array(0, "int32"), ctypes.c_void_p(cells.value))  # (checked cell by cell)
    assert rc == 0 and same.value == cells.value, message
    lib.release(same)
    lib.release(cells)
    lib.release(nil)
    assert lib.live_bytes() == 0


def test_with_openmp_the_application_runs_the_same(app, tmp_path):
    """-fopenmp makes the kernels' pragmas live (and their temporaries on worker threads come from the C heap)."""
    probe = tmp_path / "omp.c"
    probe.write_text("#include <omp.h>\nint main(void) { return omp_get_max_threads() > 0 ? 0 : 1; }\n")
    if subprocess.run([CC, "-fopenmp", str(probe), "-o", str(tmp_path / "omp")], capture_output=True).returncode:
        pytest.skip("no OpenMP in this C compiler")
    _run(app, ["-std=gnu11", "-O1", "-Wall", "-Werror", "-fopenmp", *tv.aot.dynamic.C_FLAGS],
         env={"OMP_NUM_THREADS": "2"})
    _check_outputs(app)


def test_an_empty_tensor_may_have_no_data(misc):
    lib, _ = misc
    shape = (ctypes.c_int64 * 1)(0)
    empty = _DLTensor(None, 1, 0, 1, 2, 32, 1, shape, None, 0)
    result = ctypes.c_void_p()
    assert lib.fn("ident")(lib.model, ctypes.byref(empty), ctypes.byref(result)) == 0, lib.fn("last_error")(lib.model)
    got, view = lib.numpy(result)
    assert got.shape == (0,)
    lib.release(result)
    empty.device_type = 2  # (not a CPU tensor)
    assert lib.fn("ident")(lib.model, ctypes.byref(empty), ctypes.byref(result)) == 6
    assert b"expected a CPU tensor" in lib.fn("last_error")(lib.model)


@pytest.mark.parametrize("text", [
    # a run-time-shaped concatenate: its parallel chunk function carries TV_SELECT_OF_LOADS before its
    # static, and had been made "static inline TV_SELECT_OF_LOADS static" (a hard error)
    "def @main(%a: Tensor[(?, 3), float32], %b: Tensor[(?, 3), float32]) { concatenate((%a, %b), axis=0) }",
    # an argmax keeps its value beside its index: a local only written (-Wunused-but-set-variable)
    "def @main(%x: Tensor[(?), int32]) { (argmax(%x), argmin(%x, axis=[0], keepdims=True)) }",
])
def test_the_library_of_any_kernel_compiles_with_all_warnings_as_errors(tmp_path, text):
    """docs/aot_dynamic.md: the C compiles warning-free with -Wall -Wextra -Werror under -std=c11 (the
    static AOT unit of the argmax too)."""
    library = tv.aot.build(tv.parse(text), name="w", dynamic=True)
    layout = library.write_sources(tmp_path / "dynamic")
    checked = subprocess.run([CC, "-std=c11", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                              f"-I{tmp_path / 'dynamic' / 'include'}", str(layout["sources"][0])],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr[:4000]
    if "?" in text.split("{")[0] and "argmax" in text:
        static = tv.aot.build(tv.parse(text.replace("(?)", "(6)")), name="w")
        layout = static.write_sources(tmp_path / "static")
        for source in layout["sources"]:
            if "runtime" in source.parts:
                continue
            checked = subprocess.run([CC, "-std=c11", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                                      *[f"-I{d}" for d in layout["include_dirs"]], str(source)],
                                     capture_output=True, text=True)
            assert checked.returncode == 0, checked.stderr[:4000]
