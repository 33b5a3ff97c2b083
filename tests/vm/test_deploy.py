"""The deployable runtime (docs/deploy.md): a saved target-"c" executable loads and runs on its prebuilt
kernel library without importing the compiler; on a miss (C hash, CPU features, an untrusted embedded
library, a tampered description) it is rebuilt by the compiler, or refused with a clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.codegen.build import have_compiler, reset_toolchain
from tensorvm.errors import FormatError, UnsupportedError
from tensorvm.vm import VirtualMachine, load_executable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tvx_edit import join, split  # noqa: E402

pytestmark = pytest.mark.skipif(not have_compiler(), reason="no C compiler on this machine")

ROOT = Path(__file__).resolve().parents[2]

MLP = """
def @main(%x: Tensor[(?, 16), float32], %w1: Tensor[(32, 16), float32], %b1: Tensor[(32), float32],
          %w2: Tensor[(8, 32), float32]) {
  %0 = nn.relu(add(nn.dense(%x, %w1), %b1));
  nn.dense(%0, %w2)
}
"""

# control flow (a recursive loop with a branch) and a shape that grows at run time (a C shape function)
LOOP = """
def @loop(%i: int32, %n: int32, %x: Tensor[(?, 4), float32]) -> Tensor[(?, 4), float32] {
  if (less(%i, %n)) {
    @loop(add(%i, 1), %n, concatenate((tanh(%x), %x), axis=0))
  } else {
    %x
  }
}
def @main(%x: Tensor[(?, 4), float32], %n: int32) { @loop(0, %n, %x) }
"""

# What load_executable + VirtualMachine may import for these programs: the package, its errors, the IR's
# types (parameter types are checked), the runtime and the VM's loader; nothing of the parser, type
# inference, op registry, tensor expressions, code generator, NumPy kernels or shape-function tracer.
ALLOWED = {
    "tensorvm", "tensorvm.errors", "tensorvm.ir", "tensorvm.ir.types",
    "tensorvm.runtime", "tensorvm.runtime.blas", "tensorvm.runtime.convert", "tensorvm.runtime.library",
    "tensorvm.runtime.memory", "tensorvm.runtime.placement",
    "tensorvm.runtime.ndarray", "tensorvm.runtime.object", "tensorvm.runtime.stack",
    "tensorvm.vm", "tensorvm.vm.bytecode", "tensorvm.vm.compiled", "tensorvm.vm.compiler", "tensorvm.vm.decoded",
    "tensorvm.vm.executable",
    "tensorvm.vm.fastcall", "tensorvm.vm.kernel_abi", "tensorvm.vm.kernel_c", "tensorvm.vm.native_mode",
    "tensorvm.vm.serialize",
    "tensorvm.vm.shape_plan", "tensorvm.vm.specialize", "tensorvm.vm.vm",
}

_RUNNER = """
import json, sys
import numpy as np
import tensorvm as tv
exe = tv.vm.load_executable(sys.argv[1])
vm = tv.vm.VirtualMachine(exe)
args = [np.load(p) for p in sys.argv[2:]]
outs = [vm.run(*args).numpy().tolist() for _ in range(2)]  # the second call runs on what the first built
print(json.dumps({"modules": sorted(m for m in sys.modules if m.startswith("tensorvm")), "outs": outs,
                  "origin": exe.c_library.origin}))
"""


def _mlp_args(batch: int):
    rng = np.random.default_rng(batch)
    return [rng.standard_normal(s).astype("float32") for s in ((batch, 16), (32, 16), (32,), (8, 32))]


def _mlp_reference(x, w1, b1, w2):
    return np.maximum(x @ w1.T + b1, 0) @ w2.T


def _loop_reference(x, n):
    for _ in range(int(n)):
        x = np.concatenate([np.tanh(x), x], axis=0)
    return x


def _run_fresh(path: Path, args: list, tmp_path: Path, **env) -> dict:
    files = []
    for i, a in enumerate(args):
        files.append(str(tmp_path / f"arg{i}.npy"))
        np.save(files[-1], a)
    result = subprocess.run([sys.executable, "-c", _RUNNER, str(path), *files], capture_output=True, text=True,
                            timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("program, args, reference, exec_mode", [
    (MLP, _mlp_args(5), _mlp_reference, "bytecode"),
    (LOOP, [np.linspace(-1, 1, 8, dtype="float32").reshape(2, 4), np.int32(3)], _loop_reference, "bytecode"),
    (LOOP, [np.linspace(-1, 1, 8, dtype="float32").reshape(2, 4), np.int32(4)], _loop_reference, "compiled"),
    (LOOP, [np.linspace(-1, 1, 8, dtype="float32").reshape(2, 4), np.int32(4)], _loop_reference, "native"),
    (MLP, _mlp_args(3), _mlp_reference, "native"),
], ids=["mlp", "loop", "loop-compiled", "loop-native", "mlp-native"])
def test_a_saved_executable_runs_in_a_fresh_interpreter_importing_only_the_runtime(program, args, reference,
                                                                                  exec_mode, tmp_path):
    path = tmp_path / "model.tvx"
    tv.vm.compile(tv.parse(program), target="c", exec_mode=exec_mode).save(path)
    got = _run_fresh(path, args, tmp_path)
    assert got["origin"] == "kernel cache"
    assert set(got["modules"]) <= ALLOWED, sorted(set(got["modules"]) - ALLOWED)
    for out in got["outs"]:
        np.testing.assert_allclose(np.asarray(out, "float32"), reference(*args), rtol=1e-5, atol=1e-5)


def test_a_new_batch_size_runs_on_the_prebuilt_library(tmp_path):
    path = tmp_path / "mlp.tvx"
    tv.vm.compile(tv.parse(MLP), target="c").save(path)
    exe = load_executable(path)
    assert exe.c_library.origin == "kernel cache"
    vm = VirtualMachine(exe)
    for batch in (1, 7, 64):
        args = _mlp_args(batch)
        np.testing.assert_allclose(vm.run(*args).numpy(), _mlp_reference(*args), rtol=1e-5, atol=1e-5)
    # wrong shapes are still the VM's / the kernels' clear errors
    with pytest.raises(tv.ShapeError):
        vm.run(np.ones((2, 15), "float32"), *_mlp_args(2)[1:])


def test_scalar_constants_and_scalar_data_keep_their_rank_on_the_prebuilt_library(tmp_path):
    """A 0-d constant kernel input (topk's k) and a 0-d tensor a shape function reads (a run-time k) pass
    through the KABI section and the prebuilt calls as 0-d (``np.ascontiguousarray`` made them 1-d)."""
    text = """
def @main(%x: Tensor[(?), float32], %k: int64) { (topk(%x, 3i64), topk(%x, %k)) }"""
    path = tmp_path / "topk.tvx"
    tv.vm.compile(tv.parse(text), target="c").save(path)
    exe = load_executable(path)
    assert exe.c_library.origin == "kernel cache", exe.c_library.load_reason
    x = np.array([3, 1, 4, 1, 5, 9, 2, 6], "float32")
    (values, indices), (values2, _) = VirtualMachine(exe).run(x, np.array(2, "int64"))
    np.testing.assert_array_equal(values.numpy(), [9, 6, 5])
    np.testing.assert_array_equal(indices.numpy(), [5, 7, 4])
    np.testing.assert_array_equal(values2.numpy(), [9, 6])


def test_without_the_fast_caller_the_prebuilt_kernels_are_called_checked_through_ctypes(tmp_path, monkeypatch):
    from tensorvm.vm.kernel_abi import CheckedKernel

    path = tmp_path / "mlp.tvx"
    tv.vm.compile(tv.parse(MLP), target="c").save(path)
    monkeypatch.setenv("TENSORVM_NATIVE", "0")  # no fastcall extension
    exe = load_executable(path)
    assert exe.c_library.origin == "kernel cache"
    kernels = list(exe.c_library.kernels.values())
    assert kernels and all(isinstance(k, CheckedKernel) for k in kernels)
    args = _mlp_args(6)
    np.testing.assert_allclose(VirtualMachine(exe).run(*args).numpy(), _mlp_reference(*args), rtol=1e-5, atol=1e-5)
    kernel = kernels[0]
    n_in = kernel.abi.num_inputs - len(kernel.abi.constants)
    bad = [np.zeros((2,) * rank, "float64") for _, rank, _ in kernel.abi.buffers[:n_in]]
    with pytest.raises(tv.ExecutionError, match="must have dtype"):
        kernel(*bad, *[np.zeros((2,) * rank, dtype) for dtype, rank, _ in kernel.abi.buffers[kernel.abi.num_inputs:]])


def test_a_native_executable_runs_its_bytecode_where_the_bridge_cannot_be_built(tmp_path, monkeypatch):
    """Native mode's entry point is a CPython extension built on each machine; on one without a compiler
    (stood for by the bridge's recorded failure) a native-mode executable saved with its library embedded
    runs its bytecode through the dispatch loop on the same kernels, with a warning, and says so in
    exec_stats (it had raised UnsupportedError). Oracle: the interpreter."""
    from tensorvm.vm import native_mode

    mod = tv.parse("def @f(%i: int32) -> int32 { if (equal(%i, 0)) { %i } else { add(@f(subtract(%i, 1)), %i) } }\n"
                   "def @main(%i: int32) -> int32 { @f(%i) }")
    path = tmp_path / "rec.tvx"
    tv.vm.compile(mod, target="c", exec_mode="native").save(path, embed_library=True)
    monkeypatch.setattr(native_mode, "_MODULE", [RuntimeError("codegen: no C compiler found (for the test)")])
    exe = load_executable(path, trust_library=True)
    assert exe.exec_mode == "native"
    with pytest.warns(RuntimeWarning, match="runs the executable's bytecode in the dispatch loop"):
        vm = VirtualMachine(exe)
    want = tv.create_executor("debug", mod).evaluate()(np.int32(10)).numpy()
    assert vm.run(np.int32(10)).numpy() == want == 55
    stats = vm.exec_stats()
    assert stats["exec_mode"] == "bytecode" and "no C compiler found" in stats["native_unavailable"]


def _saved_on_a_cpu_lacking_a_feature(tmp_path, monkeypatch):
    """A saved MLP, and the running CPU faked to lack one feature its library was built for."""
    exe = tv.vm.compile(tv.parse(MLP), target="c")
    features = exe.c_library.abi.manifest.features
    if not features:
        pytest.skip("the kernels are built without -march=native here: they need no CPU feature")
    path = tmp_path / "mlp.tvx"
    exe.save(path)
    lacking = features[-1]
    monkeypatch.setenv("TENSORVM_CPU_FEATURES", " ".join(f for f in features if f != lacking))
    return path, lacking


def test_a_cpu_without_the_librarys_features_rebuilds_and_says_why(tmp_path, monkeypatch):
    path, lacking = _saved_on_a_cpu_lacking_a_feature(tmp_path, monkeypatch)
    loaded = load_executable(path)
    lib = loaded.stats()["kernel_library"]
    assert lib["origin"] == "compiled" and lacking in lib["load_reason"] and "lacks" in lib["load_reason"]
    args = _mlp_args(3)
    np.testing.assert_allclose(VirtualMachine(loaded).run(*args).numpy(), _mlp_reference(*args), rtol=1e-5,
                               atol=1e-5)


def test_without_a_compiler_the_missing_cpu_features_are_a_clear_error(tmp_path, monkeypatch):
    path, lacking = _saved_on_a_cpu_lacking_a_feature(tmp_path, monkeypatch)
    monkeypatch.setenv("TENSORVM_CC", str(tmp_path / "no-such-compiler"))
    reset_toolchain()
    try:
        with pytest.raises(UnsupportedError, match=f"CPU features this CPU lacks \\({lacking}\\)"):
            load_executable(path)
    finally:
        monkeypatch.delenv("TENSORVM_CC")
        reset_toolchain()


def test_an_embedded_library_is_loaded_only_when_trusted(tmp_path, monkeypatch):
    exe = tv.vm.compile(tv.parse(MLP), target="c")
    data = exe.save_bytes(embed_library=True)
    assert len(data) > len(exe.save_bytes()) + exe.c_library.abi.manifest.library_size - 64
    args = _mlp_args(4)
    # the local cache built this very library: used without any trust (the embedded copy is not needed)
    assert load_executable(data).c_library.origin == "kernel cache"
    for name in ("cache1", "cache2"):  # another machine: an empty cache (a rebuild fills it)
        (tmp_path / name).mkdir(mode=0o700)
    monkeypatch.setenv("TENSORVM_CACHE_DIR", str(tmp_path / "cache1"))
    trusted = load_executable(data, trust_library=True)
    assert trusted.c_library.origin.startswith("embedded")
    monkeypatch.setenv("TENSORVM_CACHE_DIR", str(tmp_path / "cache2"))
    untrusted = load_executable(data)
    lib = untrusted.stats()["kernel_library"]
    assert lib["origin"] == "compiled" and "trust_library=True" in lib["load_reason"]
    for loaded in (untrusted, trusted):
        np.testing.assert_allclose(VirtualMachine(loaded).run(*args).numpy(), _mlp_reference(*args), rtol=1e-5,
                                   atol=1e-5)


def test_a_tampered_embedded_library_is_a_format_error():
    data = tv.vm.compile(tv.parse(MLP), target="c").save_bytes(embed_library=True)
    header, sections = split(data)
    tampered = [(t, p[:100] + bytes([p[100] ^ 1]) + p[101:] if t == b"KLIB" else p) for t, p in sections]
    with pytest.raises(FormatError, match="KLIB section"):
        load_executable(join(header, tampered), trust_library=True)
    with pytest.raises(FormatError, match="KLIB section without its KABI"):
        load_executable(join(header, [(t, p) for t, p in sections if t != b"KABI"]), trust_library=True)


def test_a_changed_c_text_or_description_is_never_run_on_the_prebuilt_library(tmp_path):
    exe = tv.vm.compile(tv.parse(MLP), target="c")
    header, sections = split(exe.save_bytes(embed_library=True))
    args = _mlp_args(3)

    def load(new_sections, **kwargs):
        loaded = load_executable(join(header, new_sections), **kwargs)
        np.testing.assert_allclose(VirtualMachine(loaded).run(*args).numpy(), _mlp_reference(*args), rtol=1e-5,
                                   atol=1e-5)
        return loaded.stats()["kernel_library"]

    # the C text changed (a comment appended): its hash is not the manifest's, even a trusted library is not used
    c_changed = [(t, _clib(p, "/* changed */\n") if t == b"CLIB" else p) for t, p in sections]
    lib = load(c_changed, trust_library=True)
    assert lib["origin"] == "compiled" and "does not hash" in lib["load_reason"]
    # the calling description changed (a static dim of a kernel buffer): not what the cache's build recorded
    kabi = dict(sections)[b"KABI"]
    altered = kabi.replace(b"\x07\x00\x00\x00float32", b"\x07\x00\x00\x00float64", 1)  # a buffer's dtype
    assert altered != kabi
    lib = load([(t, altered if t == b"KABI" else p) for t, p in sections])
    assert lib["origin"] == "compiled" and "not trusted" in lib["load_reason"]


def test_a_native_library_runs_only_the_program_it_was_generated_from():
    """Native mode's library holds the program's functions: a file whose program differs from the one the
    library's C names (here a constant: the loop starts at 1, not 0) is rebuilt, never run on it."""
    loop_from_one = LOOP.replace("@loop(0, %n, %x)", "@loop(1, %n, %x)")
    first = tv.vm.compile(tv.parse(LOOP), target="c", exec_mode="native")
    second = tv.vm.compile(tv.parse(loop_from_one), target="c", exec_mode="native")
    x, n = np.linspace(-1, 1, 8, dtype="float32").reshape(2, 4), np.int32(3)
    loaded = load_executable(first.save_bytes())
    assert loaded.c_library.origin == "kernel cache", loaded.c_library.load_reason
    np.testing.assert_allclose(VirtualMachine(loaded).run(x, n).numpy(), _loop_reference(x, n), rtol=1e-6)
    header, sections = split(second.save_bytes())
    library = dict(split(first.save_bytes())[1])
    swapped = [(t, library[t] if t in (b"CLIB", b"KABI") else p) for t, p in sections]
    loaded = load_executable(join(header, swapped))
    lib = loaded.stats()["kernel_library"]
    assert lib["origin"] == "compiled" and "not generated from this file's program" in lib["load_reason"]
    np.testing.assert_allclose(VirtualMachine(loaded).run(x, n).numpy(), _loop_reference(x, n - 1), rtol=1e-6)


def test_a_trusted_embedded_native_library_runs_profiles_and_instruments(tmp_path, monkeypatch):
    """On another machine (an empty cache): the embedded library runs the program natively; its profile
    is timed in C and an instrument callback sees the prebuilt kernels, as on a freshly built library."""
    exe = tv.vm.compile(tv.parse(LOOP), target="c", exec_mode="native")
    data = exe.save_bytes(embed_library=True)
    (tmp_path / "cache").mkdir(mode=0o700)
    monkeypatch.setenv("TENSORVM_CACHE_DIR", str(tmp_path / "cache"))
    loaded = load_executable(data, trust_library=True)
    assert loaded.c_library.origin.startswith("embedded"), loaded.c_library.load_reason
    x, n = np.linspace(-1, 1, 8, dtype="float32").reshape(2, 4), np.int32(3)
    vm = VirtualMachine(loaded)
    np.testing.assert_allclose(vm.run(x, n).numpy(), _loop_reference(x, n), rtol=1e-6)
    report = vm.profile("main", x, n)
    want = VirtualMachine(exe.with_exec_mode("bytecode")).profile("main", x, n)
    assert {r.name: r.calls for r in report.rows} == {r.name: r.calls for r in want.rows if r.kind == "kernel"}
    seen = []
    vm.set_instrument(lambda name, before, ret, *args: seen.append(name))
    np.testing.assert_allclose(vm.run(x, n).numpy(), _loop_reference(x, n), rtol=1e-6)
    assert len(seen) == 2 * sum(r.calls for r in report.rows)


def test_native_errors_on_the_prebuilt_library_are_the_bytecode_vm_s():
    text = "def @main(%x: Tensor[(?), int32], %y: Tensor[(?), int32]) { floor_divide(%x, %y) }"
    exe = load_executable(tv.vm.compile(tv.parse(text), target="c", exec_mode="native").save_bytes())
    assert exe.c_library.origin == "kernel cache", exe.c_library.load_reason
    vm, reference = VirtualMachine(exe), VirtualMachine(exe.with_exec_mode("bytecode"))
    x = np.array([7, -7, 9], "int32")
    np.testing.assert_array_equal(vm.run(x, np.array([2, 2, 4], "int32")).numpy(), [3, -4, 2])
    for y, error in ((np.array([2, 0, 1], "int32"), tv.ExecutionError), (np.array([1, 2], "int32"), tv.ShapeError)):
        with pytest.raises(error) as native_error:
            vm.run(x, y)
        with pytest.raises(error):
            reference.run(x, y)
        assert "main" in str(native_error.value)


def _clib(payload: bytes, extra: str) -> bytes:
    import struct

    n = struct.unpack_from("<I", payload, 0)[0]
    text = payload[4:4 + n] + extra.encode()
    return struct.pack("<I", len(text)) + text + payload[4 + n:]


# an ADT argument (the prelude's List) walked by a recursive match, as in a Tree-LSTM
LIST_SUM = """
def @total(%xs: List[Tensor[(?, 4), float32]], %acc: Tensor[(?, 4), float32]) -> Tensor[(?, 4), float32] {
  match (%xs) {
    Cons(%h, %t) => @total(%t, add(%acc, tanh(%h))),
    Nil => %acc,
  }
}
def @main(%xs: List[Tensor[(?, 4), float32]], %x: Tensor[(?, 4), float32]) { @total(%xs, %x) }
"""

# An ADT-typed parameter is checked against the ADT's definition, rebuilt from the file: the IR's data
# classes (expressions, attrs) are imported for it; still nothing of the compiler.
ALLOWED_WITH_ADTS = ALLOWED | {"tensorvm.ir.expr", "tensorvm.ir.attrs"}

_LIST_RUNNER = """
import json, sys
import numpy as np
import tensorvm as tv
from tensorvm.runtime import ADT
exe = tv.vm.load_executable(sys.argv[1])
tags = {name: tag for adt in exe.adts for tag, (name, _) in enumerate(adt.constructors)}
*items, x = [np.load(p) for p in sys.argv[2:]]
xs = ADT(tags["Nil"], (), constructor="Nil")
for item in reversed(items):
    xs = ADT(tags["Cons"], (item, xs), constructor="Cons")
out = tv.vm.VirtualMachine(exe).run(xs, x).numpy().tolist()
print(json.dumps({"modules": sorted(m for m in sys.modules if m.startswith("tensorvm")), "out": out,
                  "origin": exe.c_library.origin}))
"""


def test_an_adt_argument_runs_on_the_prebuilt_library_without_the_compiler(tmp_path):
    path = tmp_path / "list.tvx"
    tv.vm.compile(tv.parse(LIST_SUM), target="c").save(path)
    rng = np.random.default_rng(0)
    items = [rng.standard_normal((3, 4)).astype("float32") for _ in range(5)]
    x = np.zeros((3, 4), "float32")
    files = []
    for i, a in enumerate([*items, x]):
        files.append(str(tmp_path / f"arg{i}.npy"))
        np.save(files[-1], a)
    result = subprocess.run([sys.executable, "-c", _LIST_RUNNER, str(path), *files], capture_output=True, text=True,
                            timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout.splitlines()[-1])
    assert got["origin"] == "kernel cache"
    assert set(got["modules"]) <= ALLOWED_WITH_ADTS, sorted(set(got["modules"]) - ALLOWED_WITH_ADTS)
    np.testing.assert_allclose(np.asarray(got["out"], "float32"), x + sum(np.tanh(i) for i in items), rtol=1e-5,
                               atol=1e-5)
