"""The ``tensorvm`` command: compile (ONNX and Relay text), run, inspect, bench; errors are one line and a
non-zero exit, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tensorvm.cli import main, parse_shape
from tensorvm.codegen import build
from tensorvm.codegen.build import default_target
from tensorvm.ir.types import Any, SymDim

RELAY = """
def @main(%x: Tensor[(?, 3), float32], %y: Tensor[(3), float32]) {
  %0 = add(%x, %y);
  (multiply(%0, %0), sum(%0))
}
"""


@pytest.fixture
def relay_model(tmp_path):
    path = tmp_path / "model.rly"
    path.write_text(RELAY)
    return path


def _onnx_model(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = np.arange(12, dtype="float32").reshape(4, 3) / 10
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "w"], ["h"]), helper.make_node("Relu", ["h"], ["out"])], "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path, w


def test_parse_shape():
    assert parse_shape("input=1,?,128") == ("input", [1, Any(), 128])
    assert parse_shape("x=batch,3") == ("x", [SymDim("batch"), 3])


def test_compile_run_inspect_bench_a_relay_model(relay_model, tmp_path, capsys):
    exe = tmp_path / "model.tvx"
    assert main(["compile", str(relay_model), "-o", str(exe), "-q"]) == 0
    assert "wrote" in capsys.readouterr().out
    x = np.arange(6, dtype="float32").reshape(2, 3)
    y = np.array([1, -1, 0.5], "float32")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    out_file = tmp_path / "out.npz"
    assert main(["run", str(exe), "--input", f"x={tmp_path / 'x.npy'}", "--input", f"y={tmp_path / 'y.npy'}",
                 "--output", str(out_file)]) == 0
    printed = capsys.readouterr().out
    assert "output 0: shape (2, 3) float32" in printed and "output 1: shape () float32" in printed
    with np.load(out_file) as saved:
        np.testing.assert_allclose(saved["output_0"], (x + y) ** 2)
        np.testing.assert_allclose(saved["output_1"], (x + y).sum(), rtol=1e-6)
    assert main(["inspect", str(exe), "--bytecode"]) == 0
    printed = capsys.readouterr().out
    assert "main(x, y)" in printed and "kernels:" in printed and "instructions:" in printed
    assert main(["bench", str(exe), "--input", f"x={tmp_path / 'x.npy'}", "--input", f"y={tmp_path / 'y.npy'}",
                 "--repeat", "3", "--warmup", "1"]) == 0
    assert "3 runs after 1 warm-up" in capsys.readouterr().out


def test_compile_an_onnx_model_with_a_shape_override(tmp_path, capsys):
    path, w = _onnx_model(tmp_path)
    exe = tmp_path / "m.tvx"
    assert main(["compile", str(path), "-o", str(exe), "--shape", "input=?,4"]) == 0
    err = capsys.readouterr().err
    assert "importing" in err and f"compiling for target '{default_target()}'" in err  # progress lines
    assert "by default" in err
    x = np.random.default_rng(0).standard_normal((5, 4)).astype("float32")
    np.savez(tmp_path / "inputs.npz", input=x)
    out_file = tmp_path / "o.npz"
    assert main(["run", str(exe), "--input", str(tmp_path / "inputs.npz"), "--output", str(out_file)]) == 0
    with np.load(out_file) as saved:
        np.testing.assert_allclose(saved["output_0"], np.maximum(x @ w, 0), rtol=1e-5)


@pytest.mark.parametrize("argv, message", [
    (["run", "missing.tvx"], "no such file"),
    (["compile", "missing.onnx"], "no such file"),
    (["compile", "{model}", "--shape", "x=1,two words"], "a dim must be"),
])
def test_errors_are_one_line_with_a_nonzero_exit(argv, message, relay_model, capsys):
    argv = [a.replace("{model}", str(relay_model)) for a in argv]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tensorvm: error:") and message in err[0]


def test_a_wrong_input_is_a_clear_error(relay_model, tmp_path, capsys):
    exe = tmp_path / "model.tvx"
    assert main(["compile", str(relay_model), "-o", str(exe), "-q"]) == 0
    np.save(tmp_path / "x.npy", np.ones((2, 3), "float32"))
    assert main(["run", str(exe), "--input", f"x={tmp_path / 'x.npy'}"]) == 1
    assert "missing input(s) y" in capsys.readouterr().err
    np.save(tmp_path / "y.npy", np.ones((4,), "float32"))  # wrong shape
    assert main(["run", str(exe), "--input", f"x={tmp_path / 'x.npy'}", "--input", f"y={tmp_path / 'y.npy'}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tensorvm: error:" in err[0]


def test_unreadable_executable_and_the_module_entry_point(tmp_path):
    junk = tmp_path / "junk.tvx"
    junk.write_bytes(b"not an executable at all")
    result = subprocess.run([sys.executable, "-m", "tensorvm.cli", "inspect", str(junk)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.startswith("tensorvm: error: FormatError") and "Traceback" not in result.stderr


@pytest.mark.skipif(__import__("shutil").which("cc") is None, reason="target c needs a C compiler")
def test_compile_for_target_c(relay_model, tmp_path, capsys):
    exe = tmp_path / "model_c.tvx"
    assert main(["compile", str(relay_model), "-o", str(exe), "--target", "c", "-q"]) == 0
    assert "target c" in capsys.readouterr().out
    np.save(tmp_path / "x.npy", np.ones((4, 3), "float32"))
    np.save(tmp_path / "y.npy", np.full(3, 2, "float32"))
    out_file = tmp_path / "out.npz"
    assert main(["run", str(exe), "--input", f"x={tmp_path / 'x.npy'}", "--input", f"y={tmp_path / 'y.npy'}",
                 "--output", str(out_file)]) == 0
    with np.load(out_file) as saved:
        np.testing.assert_allclose(saved["output_0"], np.full((4, 3), 9, "float32"))


LOOP = """
def @halve(%i: int32, %x: Tensor[(?, 3), float32]) -> Tensor[(?, 3), float32] {
  if (equal(%i, 0)) { %x } else { @halve(subtract(%i, 1), multiply(%x, 0.5f)) }
}
def @main(%x: Tensor[(?, 3), float32]) { @halve(3, %x) }
"""


@pytest.mark.skipif(not build.have_compiler(), reason="target c needs a C compiler")
@pytest.mark.parametrize("option, mode", [([], "native"), (["--exec-mode", "bytecode"], "bytecode")])
def test_compile_picks_native_mode_for_a_loop_unless_told(tmp_path, capsys, option, mode):
    """``tensorvm compile``: exec mode "auto" by default (native for a program with control flow, on target
    c), ``--exec-mode`` to choose; the file runs in that mode and gives the loop's result."""
    model = tmp_path / "loop.rly"
    model.write_text(LOOP)
    exe = tmp_path / "loop.tvx"
    assert main(["compile", str(model), "-o", str(exe), "--target", "c", "-q", *option]) == 0
    assert f"exec mode {mode}" in capsys.readouterr().out
    from tensorvm.vm import load_executable

    assert load_executable(str(exe)).exec_mode == mode
    np.save(tmp_path / "x.npy", np.full((2, 3), 8, "float32"))
    out_file = tmp_path / "out.npz"
    assert main(["run", str(exe), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(out_file)]) == 0
    with np.load(out_file) as saved:
        np.testing.assert_allclose(saved["output_0"], np.ones((2, 3), "float32"))


@pytest.fixture
def restore_threads():
    previous = build._NUM_THREADS[0]
    yield
    build.set_num_threads(previous)


@pytest.mark.skipif(__import__("shutil").which("cc") is None, reason="target c needs a C compiler")
@pytest.mark.parametrize("threads", [1, 2])
def test_threads_option_sets_the_budget_the_kernels_use(relay_model, tmp_path, capsys, restore_threads, threads):
    exe = tmp_path / "model_c.tvx"
    assert main(["compile", str(relay_model), "-o", str(exe), "--target", "c", "-q", "--threads", str(threads)]) == 0
    assert build.get_num_threads() == threads
    other = 3 - threads
    assert main(["inspect", str(exe), "--threads", str(other)]) == 0
    assert build.get_num_threads() == other
    if build.find_toolchain().openmp:  # the loaded library reports what its OpenMP loops use
        assert f"{other} thread(s)" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["0", "-2", "two"])
def test_threads_option_rejects_a_non_positive_count(relay_model, capsys, bad):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(relay_model), "--threads", bad])
    assert exit_info.value.code == 2 and "positive integer" in capsys.readouterr().err


def test_compile_without_a_compiler_defaults_to_python(relay_model, tmp_path, capsys, monkeypatch):
    def no_compiler():
        raise build.CompilerError("codegen: no C compiler found (looked for 'nocc')")

    monkeypatch.delenv("TENSORVM_TARGET", raising=False)
    monkeypatch.setattr(build, "find_toolchain", no_compiler)
    assert main(["compile", str(relay_model), "-o", str(tmp_path / "m.tvx")]) == 0
    captured = capsys.readouterr()
    assert "target python" in captured.out and "no usable C compiler" in captured.err


def test_ops_reports_every_op_and_its_parts(capsys):
    from tensorvm.op import get_op, op_names

    assert main(["ops"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header, rows, summary = lines[0].split(), [line.split() for line in lines[1:-1]], lines[-1]
    assert header == ["op", "pattern", "compute", "shape_func", "c_shape_func", "strategy", "file"]
    by_op = {row[0]: row for row in rows}
    assert sorted(by_op) == op_names()
    assert by_op["add"] == ["add", "broadcast", "te", "python", "yes", "no", "tensorvm/op/tensor.py"]
    assert by_op["nn.dense"][2:] == ["te", "python", "yes", "yes", "tensorvm/op/nn.py"]
    assert by_op["sort"][2] == "library"
    assert by_op["unique"][2:5] == ["legalize", "python", "n.a."]  # (legalized: the VM never runs it)
    assert by_op["vm.shape_of"][4] == "n.a."
    assert by_op["memory.kill"][2] == "dialect"
    # The counts, from the registry itself.
    ops = [get_op(name) for name in op_names()]
    missing = [d.name for d in ops if d.kind == "kernel" and d.compute is None and d.library is None
               and d.legalize is None]
    with_compute = sum(d.kind == "kernel" and d.compute is not None for d in ops)
    assert summary.startswith(f"{len(ops)} ops: compute te {with_compute}, ")
    assert f"MISSING {len(missing)};" in summary
    assert f"strategy {sum(d.strategy is not None for d in ops)}" in summary
    traced = [d.name for d in ops if d.shape_logic_traceable]
    not_applicable = [d.name for d in ops if d.kind == "dialect" or (d.legalize is not None and d.compute is None
                                                                     and d.library is None)]
    assert "unique" in not_applicable and "nn.conv1d" in not_applicable
    assert f"C shape function {len(traced)}, no {len(ops) - len(traced) - len(not_applicable)}, " \
           f"n.a. {len(not_applicable)};" in summary

    assert main(["ops", "--missing"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:-1]]
    assert listed == missing

    assert main(["ops", "--why"]) == 0
    why = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:-1]}
    assert "(Legalize replaces it before the VM" in why["unique"] and "(" not in why["add"]


TWO_FUNCTIONS = """
def @main(%x: Tensor[(3), float32]) { %x }
def @double(%a: Tensor[(?), float32]) { add(%a, %a) }
"""


@pytest.fixture
def two_functions(tmp_path):
    """An executable (target python: the CLI's input handling is the same on every target) whose second
    function has other parameters than main, and an input file for each."""
    model = tmp_path / "two.rly"
    model.write_text(TWO_FUNCTIONS)
    exe = tmp_path / "two.tvx"
    assert main(["compile", str(model), "-o", str(exe), "--target", "python", "-q"]) == 0
    np.save(tmp_path / "a.npy", np.arange(4, dtype="float32"))
    np.save(tmp_path / "x.npy", np.ones(3, "float32"))
    return exe


@pytest.mark.parametrize("command", ["run", "bench"])
def test_run_and_bench_take_the_inputs_of_the_chosen_function(two_functions, tmp_path, capsys, command):
    extra = ["--output", str(tmp_path / "out.npz")] if command == "run" else ["--repeat", "2", "--warmup", "0"]
    assert main([command, str(two_functions), "--function", "double", "--input", f"a={tmp_path / 'a.npy'}",
                 *extra]) == 0
    if command == "run":
        with np.load(tmp_path / "out.npz") as saved:
            np.testing.assert_array_equal(saved["output_0"], np.arange(4, dtype="float32") * 2)
    capsys.readouterr()
    # main's parameter is not double's, and the error names the function
    assert main([command, str(two_functions), "--function", "double", "--input", f"x={tmp_path / 'x.npy'}"]) == 1
    assert "unknown input(s) x; double takes a" in capsys.readouterr().err
    assert main([command, str(two_functions), "--function", "nope"]) == 1
    assert "--function nope: no VM function 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("option, bad, expected", [("--repeat", "0", "positive integer"),
                                                   ("--repeat", "-3", "positive integer"),
                                                   ("--warmup", "-1", "integer >= 0")])
def test_bench_rejects_a_repeat_below_one_and_a_negative_warmup(two_functions, tmp_path, capsys, option, bad,
                                                                 expected):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", str(two_functions), "--input", f"x={tmp_path / 'x.npy'}", option, bad])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and f"argument {option}: expected" in err and expected in err
    assert main(["bench", str(two_functions), "--input", f"x={tmp_path / 'x.npy'}", "--repeat", "1",
                 "--warmup", "0"]) == 0
    assert "1 runs after 0 warm-up" in capsys.readouterr().out


def test_run_prints_the_npz_file_it_really_wrote(two_functions, tmp_path, capsys):
    assert main(["run", str(two_functions), "--input", f"x={tmp_path / 'x.npy'}",
                 "--output", str(tmp_path / "out")]) == 0
    assert f"wrote {tmp_path / 'out.npz'}\n" in capsys.readouterr().out
    assert (tmp_path / "out.npz").exists() and not (tmp_path / "out").exists()


def test_an_input_of_another_byte_order_is_converted(two_functions, tmp_path, capsys):
    swapped = np.dtype("float32").newbyteorder()  # (">f4" on a little-endian machine)
    np.save(tmp_path / "swapped.npy", np.array([1.5, -2, 3], swapped))
    assert main(["run", str(two_functions), "--input", f"x={tmp_path / 'swapped.npy'}",
                 "--output", str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as saved:
        assert saved["output_0"].dtype == np.float32
        np.testing.assert_array_equal(saved["output_0"], [1.5, -2, 3])


def test_compiling_a_file_that_is_not_a_model_names_the_expected_formats(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.ones(3, "float32"))
    assert main(["compile", str(tmp_path / "x.npy"), "-q"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expected Relay text or an ONNX model" in err[0]
    assert "starts with b" in err[0] and "\\x93NUMPY" in err[0]  # (what the file looked like)


@pytest.mark.parametrize("second", ["x={dir}/y.npy", "{dir}/both.npz"])
def test_an_input_given_twice_is_an_error(two_functions, tmp_path, capsys, second):
    np.save(tmp_path / "y.npy", np.zeros(3, "float32"))
    np.savez(tmp_path / "both.npz", x=np.zeros(3, "float32"))
    second = second.format(dir=tmp_path)
    assert main(["run", str(two_functions), "--input", f"x={tmp_path / 'x.npy'}", "--input", second]) == 1
    err = capsys.readouterr().err
    assert f"--input {second}: 'x' is already given by --input x={tmp_path / 'x.npy'}" in err
