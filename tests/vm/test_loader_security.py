"""Hostile executables (issue 16, defects 2 and 3): no code runs from file strings, every size is bounded
by the file, parameters are never written, and every malformed file is a ``FormatError``.

Each hostile file is built by editing the bytes of a real executable (then resealing its checksum), the
way an attacker would, not through ``Executable`` objects that the saver might refuse.
"""

from __future__ import annotations

import ast
import dataclasses
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.errors import ExecutionError, FormatError, TensorVMError
from tensorvm.vm import VirtualMachine, load_executable
from tensorvm.vm import bytecode as bc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tvx_edit import join as _join  # noqa: E402
from tvx_edit import split as _split  # noqa: E402

ADD = "def @main(%xin: Tensor[(2), float32]) { add(%xin, %xin) }"


# --- editing files the way an attacker would ------------------------------------------------------
def _string(s: str) -> bytes:
    data = s.encode()
    return struct.pack("<I", len(data)) + data


def _replace_string(data: bytes, old: str, new: str, tags=(b"GLOB", b"ADTS", b"PRIM", b"CODE")) -> bytes:
    """Every length-prefixed string ``old`` in the sections ``tags`` replaced by ``new`` (checksum resealed)."""
    header, sections = _split(data)
    edited = [(tag, payload.replace(_string(old), _string(new)) if tag in tags else payload)
              for tag, payload in sections]
    assert edited != sections, f"{old!r} not found"
    return _join(header, edited)


def _canary_payload(marker: Path, in_body: bool = False) -> str:
    """Python that writes ``marker`` when a name holding it is pasted into a comment of generated code: in
    a function body (kernel names) the statement lines are indented for us; on a ``def`` line (function and
    parameter names) it ends the function, runs at module level and opens a new function."""
    write = f"open({str(marker)!r}, 'w').write('pwned')"
    return f"\n{write}\n#" if in_body else f"\n    pass\n{write}\ndef _g():  #"


# --- defect 2: file strings never become code ----------------------------------------------------
@pytest.mark.parametrize("where", ["function", "parameter", "kernel"])
def test_names_from_the_file_never_run_as_code_in_compiled_mode(tmp_path, where):
    """A newline in a name used to break out of a comment of the generated Python and run the rest of the
    name when the VM was built (function and parameter names) or at each call (kernel names)."""
    marker = tmp_path / "canary"
    exe = tv.vm.compile(tv.parse(ADD), exec_mode="compiled")
    data = exe.save_bytes()
    payload = _canary_payload(marker, in_body=where == "kernel")
    if where == "kernel":  # the kernel table's entry (name, kind 0, source), not the primitive function
        header, sections = _split(data)
        entry = _string("fused_add") + b"\x00" + _string("fused_add")
        sections = [(t, p.replace(entry, _string("fused_add" + payload) + b"\x00" + _string("fused_add"))
                     if t == b"PRIM" else p) for t, p in sections]
        assert entry in dict(_split(data)[1])[b"PRIM"]
        hostile = _join(header, sections)
    else:
        old = "main" if where == "function" else "xin"
        hostile = _replace_string(data, old, old + payload, tags=(b"GLOB", b"CODE"))
    try:
        loaded = load_executable(hostile)
        vm = VirtualMachine(loaded)
        vm.invoke(loaded.functions[0].name, np.ones(2, "float32"))
    except tv.errors.TensorVMError:
        pass
    assert not marker.exists(), "a name from the file ran as Python code"


def test_hostile_names_are_rejected_at_load_with_format_error(tmp_path):
    data = tv.vm.compile(tv.parse(ADD), exec_mode="compiled").save_bytes()
    for bad in ["x\ny", "x'y", 'x"y', "x y", "", "x" * 5000, "x#", "é", "x.", "a..b"]:
        with pytest.raises(FormatError, match="name"):
            load_executable(_replace_string(data, "xin", bad, tags=(b"GLOB",)))


def test_generated_code_holds_no_file_string_even_for_unvalidated_executables(tmp_path):
    """The compiled mode passes names as values: an in-memory executable with odd names (never loaded from
    a file) still generates code that does not contain them."""
    marker = tmp_path / "canary"
    exe = tv.vm.compile(tv.parse(ADD), exec_mode="compiled")
    main = exe.functions[0]
    exe.functions[0] = type(main)(main.name, ("evil" + _canary_payload(marker),), main.instructions,
                                  main.register_file_size, main.param_types, main.ret_type)
    exe.primitives[0] = type(exe.primitives[0])("evil" + _canary_payload(marker, True), "kernel",
                                                exe.primitives[0].source, (), 1, 1)
    tree = ast.parse(exe.as_python())  # the names are in comments only (escaped), never in the code
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "open"]
    result = VirtualMachine(exe).invoke("main", np.ones(2, "float32"))
    np.testing.assert_array_equal(result.numpy(), np.full(2, 2, "float32"))
    assert not marker.exists()


def test_cli_run_of_a_hostile_file_runs_no_code(tmp_path):
    marker = tmp_path / "canary"
    exe = tv.vm.compile(tv.parse(ADD), exec_mode="compiled")
    path = tmp_path / "evil.tvx"
    header, sections = _split(exe.save_bytes())
    entry = _string("fused_add") + b"\x00" + _string("fused_add")
    path.write_bytes(_join(header, [(t, p.replace(entry, _string("fused_add" + _canary_payload(marker, True)) + b"\x00"
                                                  + _string("fused_add"))) for t, p in sections]))
    np.save(tmp_path / "x.npy", np.ones(2, "float32"))
    proc = subprocess.run([sys.executable, "-m", "tensorvm.cli", "run", str(path), "--input",
                           f"xin={tmp_path / 'x.npy'}"],
                          capture_output=True, text=True, timeout=120)
    assert not marker.exists(), proc.stdout + proc.stderr
    assert "FormatError" in proc.stderr or "name" in proc.stderr, textwrap.shorten(proc.stderr, 400)


# --- defect 3: sizes bounded by the file, parameters never written, FormatError for everything -------
DENSE = """
def @main(%x: Tensor[(?, 3), float32], %w: Tensor[(4, 3), float32]) {
  %0 = nn.dense(%x, %w, units=4);
  nn.relu(%0)
}
"""


def _edited(exe, edit) -> bytes:
    """``exe``'s file with function main replaced by ``edit(main)`` (the saver does not verify)."""
    loaded = load_executable(exe.save_bytes())
    index = loaded.global_map["main"]
    loaded.functions[index] = edit(loaded.functions[index])
    return loaded.save_bytes()


def _with(fn, **changes):
    fields = dict(name=fn.name, params=fn.params, instructions=fn.instructions,
                  register_file_size=fn.register_file_size, param_types=fn.param_types, ret_type=fn.ret_type)
    fields.update(changes)
    return bc.VMFunction(**fields)


@pytest.fixture(scope="module")
def dense_exe():
    return tv.vm.compile(tv.parse(DENSE))


def test_a_huge_register_file_size_is_a_format_error(dense_exe):
    """2^28 registers passed the verifier and the VM allocated them (2 GiB) at each call."""
    data = _edited(dense_exe, lambda fn: _with(fn, register_file_size=1 << 28))
    with pytest.raises(FormatError, match="register file size"):
        load_executable(data)


def _dense_args():
    rng = np.random.default_rng(1)
    return rng.standard_normal((2, 3)).astype("float32"), rng.standard_normal((4, 3)).astype("float32")


def _output_into(dense_exe, reg: int):
    def edit(fn):
        code = list(fn.instructions)
        pc = next(i for i, ins in enumerate(code) if isinstance(ins, bc.InvokePacked)
                  and dense_exe.primitives[ins.packed_index].kind == "kernel")
        ins = code[pc]
        code[pc] = bc.InvokePacked(ins.packed_index, ins.arity, ins.output_size, (*ins.inputs, reg))
        return _with(fn, instructions=tuple(code))

    return edit


def test_a_kernel_output_in_a_parameter_register_is_a_format_error(dense_exe):
    """Naming parameter $1 (not the kernel's first input) as a kernel's output wrote into the caller's
    array and returned uninitialised memory."""
    x, w = _dense_args()
    before = w.copy()
    with pytest.raises(FormatError, match="writes into parameter \\$1"):
        loaded = load_executable(_edited(dense_exe, _output_into(dense_exe, 1)))
        VirtualMachine(loaded).invoke("main", x, w)
    np.testing.assert_array_equal(w, before)


def test_a_kernel_writing_its_first_input_parameter_never_writes_the_callers_array(dense_exe):
    """An update's form (output = first input = a parameter, which the function then owns: an update run
    in place) is accepted from a file, but the VM copies the caller's array for an owned parameter: a
    dense written into its (2, 3) input is a shape error and the caller's array is unchanged."""
    x, w = _dense_args()
    before = x.copy()
    loaded = load_executable(_edited(dense_exe, _output_into(dense_exe, 0)))
    with pytest.raises(TensorVMError):
        VirtualMachine(loaded).invoke("main", x, w)
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("kind", ["move", "storage"])
def test_parameters_are_never_overwritten_or_viewed_as_storage(dense_exe, kind):
    def edit(fn):
        code = list(fn.instructions)
        if kind == "move":  # overwrite $1 (w) with $0
            code.insert(0, bc.Move(0, 1))
        else:  # a tensor viewing the caller's array as its storage
            pc = next(i for i, ins in enumerate(code) if isinstance(ins, (bc.AllocTensor, bc.AllocTensorReg)))
            code[pc] = dataclasses.replace(code[pc], storage=0)
        return _with(fn, instructions=tuple(code))

    with pytest.raises(FormatError, match="parameter register|storage allocated"):
        load_executable(_edited(dense_exe, edit))


def test_the_compiler_never_writes_parameters_so_real_programs_verify():
    """The rules above hold for what the compiler emits (kill_register of a parameter is allowed)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from programs import PROGRAMS

    checked = 0
    for program in PROGRAMS[:40]:
        exe = tv.vm.compile(program.parse())
        load_executable(exe.save_bytes())  # verifies every function
        checked += 1
    assert checked >= 20


@pytest.mark.parametrize("text", [
    "(" * 5000 + ")" * 5000,
    "fn () -> " * 3000 + "float32",
    "List[" * 2000 + "float32" + "]" * 2000,
    "Tensor[(" + "9" * 5000 + ",), float32]",
])
def test_deep_or_huge_type_text_is_a_format_error(dense_exe, text):
    from tensorvm.vm.serialize import text_to_type

    with pytest.raises(FormatError):
        text_to_type(text, {"List"})
    header, sections = _split(dense_exe.save_bytes())
    glob = dict(sections)[b"GLOB"]
    good = _string("Tensor[(4, 3), float32]")
    assert good in glob
    hostile = _join(header, [(t, p.replace(good, _string(text)) if t == b"GLOB" else p) for t, p in sections])
    with pytest.raises(FormatError):
        load_executable(hostile)


def test_a_huge_constant_shape_is_a_format_error():
    exe = tv.vm.compile(tv.parse(ADD))
    header, sections = _split(exe.save_bytes())
    # a zero-size constant whose other dims multiply out past 2^63 (accepted before: 0 data bytes)
    cnst = struct.pack("<I", 1) + _string("float32") + struct.pack("<I", 3) + struct.pack(
        "<3q", 0, 1 << 62, 1 << 62) + struct.pack("<Q", 0)
    hostile = _join(header, [(t, cnst if t == b"CNST" else p) for t, p in sections])
    with pytest.raises(FormatError, match="too large"):
        load_executable(hostile)


@pytest.mark.parametrize("target", ["python", "c"])
def test_a_primitive_text_that_does_not_type_check_is_a_format_error_naming_it(dense_exe, target):
    if target == "c":
        from tensorvm.codegen.build import have_compiler

        if not have_compiler():
            pytest.skip("target c needs a C compiler")
        dense_exe = tv.vm.compile(tv.parse(DENSE), target="c")
    header, sections = _split(dense_exe.save_bytes())
    source = next(p.source for p in dense_exe.primitives if p.kind == "kernel")
    text = dense_exe.primitive_text(source)
    assert "nn.dense" in text
    bad = text.replace("nn.dense(", "nn.dense(%p0, ", 1)  # one argument too many
    sections = [(t, p.replace(_string(text), _string(bad)) if t == b"PRIM" else p) for t, p in sections]
    hostile = _join(header, sections)
    assert hostile != dense_exe.save_bytes()
    if target == "c":
        # The prebuilt library (found in the kernel cache) does not need the primitive texts: they are read
        # only to rebuild it, which a file without its library description (KABI) must do.
        x, w = np.arange(6, dtype="float32").reshape(2, 3) - 2, np.ones((4, 3), "float32")
        out = tv.vm.VirtualMachine(load_executable(hostile)).invoke("main", x, w).numpy()
        np.testing.assert_allclose(out, np.maximum(x @ w.T, 0), rtol=1e-6)
        hostile = _join(header, [(t, p) for t, p in sections if t != b"KABI"])
    with pytest.raises(FormatError, match=source):
        load_executable(hostile)


@pytest.mark.parametrize("mode", ["bytecode", "compiled", "native"])
def test_a_reference_write_to_a_value_that_is_not_a_cell_is_an_error(mode):
    """A file may put ``ref_write`` (AllocADT of bytecode.REF_WRITE_TAG) on any register: writing a tensor or
    a tuple is an ExecutionError in every exec mode, and a reference instruction of the wrong field count
    is a format error at load."""
    exe = tv.vm.compile(tv.parse("def @main(%x: Tensor[(2), float32]) { (%x, %x) }"), target="c",
                        exec_mode="bytecode")

    def edit(fn):  # main(x): r = (x, x); ref_write(x, r); ref_write(r, x)
        size = fn.register_file_size
        code = [bc.AllocADT(0, (0, 0), size), bc.AllocADT(bc.REF_WRITE_TAG, (0, size), size + 1),
                bc.AllocADT(bc.REF_WRITE_TAG, (size, 0), size + 2), bc.Ret(size)]
        return _with(fn, instructions=tuple(code), register_file_size=size + 3)

    loaded = load_executable(_edited(exe, edit)).with_exec_mode(mode)
    with pytest.raises(ExecutionError, match="ref_write: expected a reference"):
        VirtualMachine(loaded).invoke("main", np.ones(2, np.float32))

    def wrong_count(fn):
        return _with(fn, instructions=(bc.AllocADT(bc.REF_TAG, (0, 0), 1), bc.Ret(1)), register_file_size=2)

    with pytest.raises(FormatError, match="reference cell takes 1 field"):
        load_executable(_edited(exe, wrong_count))


@pytest.mark.parametrize("index", [2, 1 << 31, (1 << 32) + 1, -1 + (1 << 63)])
@pytest.mark.parametrize("mode", ["bytecode", "native"])
def test_a_field_index_past_the_value_s_fields_is_an_error(index, mode):
    """A file's GetField index is any 64-bit value: native mode had passed it to C as a 32-bit int, and
    2^31 became negative and read before the fields (the loader fuzzer's crash, SIGSEGV)."""
    exe = tv.vm.compile(tv.parse("def @main(%x: Tensor[(2), float32]) { let %t = (%x, %x); %t.1 }"),
                        target="c", exec_mode="bytecode")

    def edit(fn):
        size = fn.register_file_size
        code = (bc.AllocADT(0, (0, 0), size), bc.GetField(size, index, size + 1), bc.Ret(size + 1))
        return _with(fn, instructions=code, register_file_size=size + 2)

    loaded = load_executable(_edited(exe, edit)).with_exec_mode(mode)
    with pytest.raises(ExecutionError, match="field"):
        VirtualMachine(loaded).invoke("main", np.ones(2, np.float32))


@pytest.mark.parametrize("mode", ["bytecode", "native"])
def test_returning_a_register_never_written_is_an_execution_error(mode):
    """A file returning an empty register (a mutated Ret, or a value killed before its use): native mode's
    bridge had raised ValueError, not the project's error (the loader fuzzer's find)."""
    exe = tv.vm.compile(tv.parse("def @main(%x: Tensor[(2), float32]) { add(%x, %x) }"), target="c",
                        exec_mode="bytecode")

    def edit(fn):  # (a register file the instructions can name: $1 is written by nothing)
        return _with(fn, instructions=(bc.Ret(1),), register_file_size=2)

    loaded = load_executable(_edited(exe, edit)).with_exec_mode(mode)
    with pytest.raises(TensorVMError):
        VirtualMachine(loaded).invoke("main", np.ones(2, np.float32))
