"""Hostile executables (issue 16, defects 2 and 3): no code runs from file strings, every size is bounded
by the file, parameters are never written, and every malformed file is a ``FormatError``.

Each hostile file is built by editing the bytes of a real executable (then resealing its checksum), the
way an attacker would, not through ``Executable`` objects that the saver might refuse.
"""

from __future__ import annotations

import hashlib
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.errors import FormatError
from tensorvm.vm import VirtualMachine, load_executable
from tensorvm.vm.serialize import MAGIC

ADD = "def @main(%xin: Tensor[(2), float32]) { add(%xin, %xin) }"


# --- editing files the way an attacker would ------------------------------------------------------
def _split(data: bytes) -> tuple[bytes, list]:
    """``(header bytes, [(tag, payload), ...])`` of an executable's bytes (checksum dropped)."""
    pos = len(MAGIC) + 8
    for _ in range(2):  # exec mode, target
        pos += 4 + struct.unpack_from("<I", data, pos)[0]
    header, sections, end = data[:pos], [], len(data) - 32
    while pos < end:
        tag, size = bytes(data[pos:pos + 4]), struct.unpack_from("<Q", data, pos + 4)[0]
        sections.append((tag, bytes(data[pos + 12:pos + 12 + size])))
        pos += 12 + size
    return header, sections


def _join(header: bytes, sections: list) -> bytes:
    body = header + b"".join(tag + struct.pack("<Q", len(payload)) + payload for tag, payload in sections)
    return body + hashlib.sha256(body).digest()


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
    for bad in ["x\ny", "x'y", 'x"y', "x y", "", "1x", "x" * 5000, "x#", "é"]:
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
    assert "canary" not in exe.as_python()
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
