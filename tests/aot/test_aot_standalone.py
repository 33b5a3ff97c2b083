"""AOT models in a C application: two different models' headers in one ``main.c``, linked into one
executable with ``cc``, run on inputs written to files; outputs compared with the interpreter.
Built once plainly (``-O2 -Wall -Werror``) and once with ``-fsanitize=address,undefined``."""

import os
import shutil
import subprocess

import numpy as np
import pytest
from aot_harness import compile_application, read_outputs, write_application, write_inputs
from programs import PROGRAMS

import tensorvm as tv
import tensorvm.aot as aot

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")

SCRATCH_MODEL = """
def @main(%x: Tensor[(4, 10000), float32], %t: (Tensor[(3), int32], Tensor[(3), int32])) {
  %0 = sum(%x, axis=[0]);
  %1 = reshape(%x, newshape=[40000]);
  (multiply(%0, 0.5f), %t.1, add(%t.0, %t.1), %1)
}
"""


def _program(name):
    return next(p for p in PROGRAMS if p.name == name)


def _models():
    """(AOTModule, the module, the flat inputs, @main's arguments) for three different models:
    linked params + internal workspace; params + external workspace; kernel scratch + tuple I/O."""
    mlp = _program("static_mlp")
    x, w1, b1, w2, b2 = mlp.args_fn()
    mlp_mod = mlp.parse()
    mlp_aot = aot.build(mlp_mod, name="mlp", params={"w1": w1, "b1": b1, "w2": w2, "b2": b2})
    cnn = _program("small_cnn")
    cx, cw, cwd = cnn.args_fn()
    cnn_mod = cnn.parse()
    cnn_aot = aot.build(cnn_mod, name="cnn", params={"w": cw, "wd": cwd}, workspace="external", planner="hill_climb")
    scratch_mod = tv.parse('#[version = "0.0.5"]\n' + SCRATCH_MODEL)
    sx = np.random.default_rng(3).standard_normal((4, 10000)).astype("float32")
    st = (np.array([1, 2, 3], "int32"), np.array([-5, 0, 7], "int32"))
    scratch_aot = aot.build(scratch_mod, name="sum", workspace="external")
    return [
        (mlp_aot, tv.create_executor("debug", mlp_mod, params={"w1": w1, "b1": b1, "w2": w2, "b2": b2}), [x], (x,)),
        (cnn_aot, tv.create_executor("debug", cnn_mod, params={"w": cw, "wd": cwd}), [cx], (cx,)),
        (scratch_aot, tv.create_executor("debug", scratch_mod), [sx, *st], (sx, st)),
    ]


def _flat(value):
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in _flat(v)]
    return [value.numpy()]


def _run_application(tmp_path, flags, env=None):
    models = _models()
    layout = write_application([m for m, *_ in models], tmp_path)
    exe = compile_application(layout, tmp_path / "app", flags)
    data = tmp_path / "data"
    data.mkdir()
    for m, _, flat_inputs, _ in models:
        write_inputs(m, data, flat_inputs)
    result = subprocess.run([str(exe), str(data)], capture_output=True, text=True, timeout=300,
                            env={**os.environ, **(env or {})})
    assert result.returncode == 0, f"the application failed:\n{result.stdout}\n{result.stderr}"
    assert "AOT_TEST_SUCCESS" in result.stdout
    assert "runtime error" not in result.stderr and "ERROR: AddressSanitizer" not in result.stderr, result.stderr
    for m, executor, _, args in models:
        outputs = read_outputs(m, data)
        expected = _flat(executor.evaluate()(*args))
        assert len(outputs) == len(expected)
        for got, want in zip(outputs, expected):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return result


def test_two_models_in_one_c_program(tmp_path):
    _run_application(tmp_path, ["-O2", "-std=c11", "-Wall", "-Werror"])


def test_two_models_in_one_c_program_under_sanitizers(tmp_path):
    flags = ["-O1", "-g", "-std=c11", "-Wall", "-Werror", "-fsanitize=address,undefined",
             "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    if subprocess.run(["cc", *flags, str(probe), "-o", str(tmp_path / "probe")], capture_output=True).returncode:
        pytest.skip("the C compiler cannot build with -fsanitize=address,undefined here")
    (tmp_path / "probe").unlink()
    _run_application(tmp_path, flags, env={"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
                                           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"})


def test_models_compile_with_openmp_when_available(tmp_path):
    """The OpenMP pragmas kept under #ifdef _OPENMP compile cleanly too."""
    probe = tmp_path / "omp.c"
    probe.write_text("#include <omp.h>\nint main(void) { return omp_get_max_threads() > 0 ? 0 : 1; }\n")
    if subprocess.run(["cc", "-fopenmp", str(probe), "-o", str(tmp_path / "omp")], capture_output=True).returncode:
        pytest.skip("no OpenMP")
    (tmp_path / "omp").unlink()
    _run_application(tmp_path, ["-O2", "-std=gnu11", "-Wall", "-Werror", "-fopenmp"])
