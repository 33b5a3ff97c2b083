"""The executable: binary format round trips, the loader's checks (fuzzed), listings and statistics."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorvm as tv
from tensorvm.errors import FormatError
from tensorvm.ir.types import Any, FuncType, GlobalTypeVar, SymDim, TensorType, TupleType, TypeCall, TypeVar
from tensorvm.vm import VirtualMachine, load_executable
from tensorvm.vm import bytecode as bc
from tensorvm.vm.serialize import FORMAT_VERSION, MAGIC, text_to_type, type_to_text

SUM_UP = """
def @main(%i: int32) -> int32 {
  @sum_up(%i)
}
def @sum_up(%i1: int32) -> int32 {
  %0 = equal(%i1, 0);
  if (%0) { %i1 } else { %1 = subtract(%i1, 1); %2 = @sum_up(%1); add(%2, %i1) }
}
"""

PROGRAM = """
type Shape { Circle(float32), Rect(float32, float32), }
def @area(%s: Shape) -> float32 {
  match (%s) { Circle(%r) => multiply(3f, multiply(%r, %r)), Rect(%w, %h) => multiply(%w, %h), }
}
def @main(%x: Tensor[(?, 3), float32], %w: Tensor[(3, 4), float32], %b: Tensor[(4), float32]) {
  %0 = nn.dense(%x, transpose(%w), units=4);
  %1 = add(%0, %b);
  (nn.relu(%1), @area(Rect(2f, 5f)), shape_of(%x))
}
"""


@pytest.fixture(scope="module")
def sum_up_exe():
    return tv.vm.compile(tv.parse(SUM_UP))


@pytest.fixture(scope="module")
def program_exe():
    return tv.vm.compile(tv.parse(PROGRAM))


def _program_args():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((5, 3)).astype("float32"), rng.standard_normal((3, 4)).astype("float32"),
            rng.standard_normal(4).astype("float32"))


def _program_expected(x, w, b):
    return np.maximum(x @ w + b, 0), np.float32(10.0), np.array(x.shape, "int64")


def _run_program(exe):
    x, w, b = _program_args()
    relu, area, shape = VirtualMachine(exe).invoke("main", x, w, b)
    want = _program_expected(x, w, b)
    np.testing.assert_allclose(relu.numpy(), want[0], rtol=1e-5, atol=1e-6)
    assert area.numpy() == want[1]
    np.testing.assert_array_equal(shape.numpy(), want[2])


def test_sum_up_listing_matches_the_talk(sum_up_exe):
    text = sum_up_exe.as_text()
    listing = text.split("sum_up(i1):")[1].split("\n\n")[0]
    ops = [line.split(":", 1)[1].split()[0] for line in listing.strip().splitlines()[1:]]
    # the talk's sum_up: a kernel for equal, if, recursion through invoke, kernels for subtract and add
    for op in ("alloc_storage", "alloc_tensor", "invoke_packed", "load_consti", "if", "goto", "invoke", "move",
               "ret"):
        assert op in ops
    assert ops.index("if") < ops.index("invoke") and ops[-1] == "ret"
    assert "invoke $" in listing and "VMFunc[" in listing
    assert "main(i):" in text
    assert VirtualMachine(sum_up_exe).invoke("main", 10).numpy() == 55


def test_stats_count_functions_instructions_constants_and_kernels(sum_up_exe):
    stats = sum_up_exe.stats()
    assert stats["num_functions"] == 2
    assert stats["num_instructions"] == sum(len(f.instructions) for f in sum_up_exe.functions)
    assert stats["instructions_by_opcode"]["InvokePacked"] == 3
    assert stats["num_kernels"] == 3 and all(k.startswith("fused_") for k in stats["kernels"])
    assert stats["constant_bytes"] == sum(c.nbytes for c in sum_up_exe.constants)
    assert "InvokePacked: 3" in str(stats)


@pytest.mark.parametrize("how", ["bytes", "path", "file"])
def test_save_and_load_round_trip(program_exe, how, tmp_path):
    data = program_exe.save_bytes()
    if how == "bytes":
        loaded = load_executable(data)
    elif how == "path":
        program_exe.save(tmp_path / "model.tvx")
        loaded = load_executable(tmp_path / "model.tvx")
    else:
        with open(tmp_path / "m.tvx", "wb") as f:
            f.write(data)
        with open(tmp_path / "m.tvx", "rb") as f:
            loaded = load_executable(f)
    assert loaded.as_text() == program_exe.as_text()
    assert loaded.save_bytes() == data  # the format is deterministic
    assert [f.param_types for f in loaded.functions] == [f.param_types for f in program_exe.functions]
    assert loaded.adts == program_exe.adts
    _run_program(loaded)
    _run_program(loaded.with_exec_mode("compiled"))


def test_header_layout_and_clear_errors(sum_up_exe, tmp_path):
    data = sum_up_exe.save_bytes()
    assert data[:8] == MAGIC and struct.unpack_from("<I", data, 8)[0] == FORMAT_VERSION
    assert hashlib.sha256(data[:-32]).digest() == data[-32:]
    with pytest.raises(FormatError, match="bad magic"):
        load_executable(b"PK\x03\x04" + data[4:])
    newer = bytearray(data)
    struct.pack_into("<I", newer, 8, FORMAT_VERSION + 1)
    with pytest.raises(FormatError, match=f"version {FORMAT_VERSION + 1}"):
        load_executable(bytes(newer))
    with pytest.raises(FormatError, match="checksum"):
        load_executable(data[:-40] + data[-32:])
    with pytest.raises(FormatError, match="only 5 bytes"):
        load_executable(b"hello")
    with pytest.raises(FormatError, match="cannot read"):
        load_executable(tmp_path / "missing.tvx")


def _resealed(body: bytes) -> bytes:
    return body + hashlib.sha256(body).digest()


@given(data=st.data())
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzzed_files_load_or_raise_format_error(sum_up_exe, data):
    """Corrupt bytes (with the checksum recomputed so the structural checks run), truncate, or splice:
    loading must either succeed with a verified executable or raise FormatError, nothing else."""
    original = _SUM_UP_BYTES.setdefault("v", sum_up_exe.save_bytes())
    body = bytearray(original[:-32])
    kind = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete", "random"]))
    if kind == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            pos = data.draw(st.integers(12, len(body) - 1))
            body[pos] ^= data.draw(st.integers(1, 255))
        blob = _resealed(bytes(body))
    elif kind == "truncate":
        blob = original[:data.draw(st.integers(0, len(original) - 1))]
    elif kind == "insert":
        pos = data.draw(st.integers(12, len(body)))
        blob = _resealed(bytes(body[:pos]) + data.draw(st.binary(min_size=1, max_size=16)) + bytes(body[pos:]))
    elif kind == "delete":
        pos = data.draw(st.integers(12, len(body) - 1))
        blob = _resealed(bytes(body[:pos]) + bytes(body[pos + data.draw(st.integers(1, 16)):]))
    else:
        blob = MAGIC + struct.pack("<I", FORMAT_VERSION) + data.draw(st.binary(max_size=200))
        blob = _resealed(blob) if data.draw(st.booleans()) else blob
    try:
        exe = load_executable(blob)
    except FormatError:
        return
    exe.verify()  # a mutation that survived the loader must still be well-formed bytecode


_SUM_UP_BYTES: dict = {}


def test_loader_rejects_bytecode_that_would_index_out_of_range(sum_up_exe):
    exe = tv.vm.load_executable(sum_up_exe.save_bytes())
    main = exe.function("main")
    bad_main = bc.VMFunction("main", main.params, (bc.Invoke(1, (0,), 9), bc.Ret(9)), 2,
                             main.param_types, main.ret_type)  # register 9 of 2
    exe.functions[exe.global_map["main"]] = bad_main
    with pytest.raises(FormatError, match="register"):
        load_executable(exe.save_bytes())


def test_primitive_text_is_parsed_not_executed(sum_up_exe):
    exe = load_executable(sum_up_exe.save_bytes())
    for info in exe.primitives:
        assert exe.prim_texts[info.source].lstrip().startswith("#[version")
    # a primitive whose text is not Relay fails to load with a FormatError
    exe.prim_texts[exe.primitives[0].source] = "__import__('os').system('echo pwned')"
    exe.prim_functions.clear()
    with pytest.raises(FormatError, match="cannot rebuild primitive"):
        load_executable(exe.save_bytes())


dims = st.one_of(st.integers(0, 9), st.just(Any()), st.sampled_from([SymDim("n"), SymDim("batch")]))
dtypes = st.sampled_from(["float32", "int64", "bool", "uint8", "float16"])
tensor_types = st.builds(lambda shape, dtype: TensorType(tuple(shape), dtype), st.lists(dims, max_size=4), dtypes)
types = st.recursive(
    tensor_types,
    lambda inner: st.one_of(
        st.builds(lambda fs: TupleType(tuple(fs)), st.lists(inner, max_size=3)),
        st.builds(lambda args: TypeCall(GlobalTypeVar("List"), tuple(args)), st.lists(inner, min_size=1, max_size=2)),
        st.builds(lambda args, ret: FuncType(tuple(args), ret), st.lists(inner, max_size=2), inner),
    ),
    max_leaves=6,
)


@given(types)
@settings(max_examples=50, deadline=None)
def test_type_text_round_trip(ty):
    assert text_to_type(type_to_text(ty), {"List"}) == ty


def test_type_text_names_type_variables_and_adts():
    ty = text_to_type("fn (A, Tree[A]) -> (A,)", {"Tree"})
    assert isinstance(ty.arg_types[0], TypeVar) and ty.arg_types[0] is ty.ret_type.fields[0]
    assert ty.arg_types[1] == TypeCall(GlobalTypeVar("Tree"), (ty.arg_types[0],))
    with pytest.raises(FormatError):
        text_to_type("Tensor[(1, 2), complex64]")
    with pytest.raises(FormatError):
        text_to_type("Tensor[(1, 2) float32")


# --- ADT definitions (section ATYP, format version 3) ----------------------------------------------
ADT_PROGRAM = """
type Pair[A, B] { MkPair(A, List[B]), Single(fn (A) -> B), Empty, }
def @first(%p: Pair[float32, int32]) -> float32 {
  match (%p) { MkPair(%a, _) => %a, Single(_) => 0f, Empty => -1f, }
}
def @main(%p: Pair[float32, int32]) -> float32 { @first(%p) }
"""


def _sections(data: bytes) -> tuple[int, dict]:
    """``(offset of the first section, {tag: (start, end) of the section including its header})``."""
    pos = len(MAGIC) + 8
    for _ in range(2):  # exec mode, target
        pos += 4 + struct.unpack_from("<I", data, pos)[0]
    first, found, body_end = pos, {}, len(data) - 32
    while pos < body_end:
        tag, size = bytes(data[pos:pos + 4]), struct.unpack_from("<Q", data, pos + 4)[0]
        found[tag] = (pos, pos + 12 + size)
        pos += 12 + size
    return first, found


def _without_section(data: bytes, tag: bytes, version: int) -> bytes:
    _, found = _sections(data)
    start, end = found[tag]
    body = bytearray(data[:start] + data[end:-32])
    struct.pack_into("<I", body, len(MAGIC), version)
    return _resealed(bytes(body))


def test_adt_definitions_survive_save_and_load():
    exe = tv.vm.compile(tv.parse(ADT_PROGRAM))
    pair = next(a for a in exe.adts if a.name == "Pair")
    assert pair.type_vars == ("A", "B")
    assert pair.field_types == (("A", "List[B]"), ("fn (A) -> B",), ())
    data = exe.save_bytes()
    assert b"ATYP" in _sections(data)[1]
    loaded = load_executable(data)
    assert loaded.adts == exe.adts and loaded.save_bytes() == data
    tdef = loaded.type_definitions()[GlobalTypeVar("Pair")]
    a, b = tdef.type_vars
    mk_pair, single, empty = tdef.constructors
    assert mk_pair.inputs[0] is a and mk_pair.inputs[1] == TypeCall(GlobalTypeVar("List"), (b,))
    assert mk_pair.inputs[1].args[0] is b and single.inputs[0] == FuncType((a,), b) and empty.inputs == ()
    mk = tv.parse(ADT_PROGRAM).constructor("MkPair")
    make_list = tv.prelude.make_list
    # the loaded definitions check arguments: Python numbers take the field types, wrong dtypes fail
    assert VirtualMachine(loaded).invoke("main", mk(2.5, make_list([1, 2]))).numpy() == np.float32(2.5)
    with pytest.raises(tv.ExecutionError, match=r"parameter 'p'\.MkPair\[1\]\.Cons\[0\] expects int32"):
        VirtualMachine(loaded).invoke("main", mk(np.float32(1), make_list([np.float32(1)])))


def test_a_version_2_file_without_adt_types_loads_and_runs_unchecked():
    exe = tv.vm.compile(tv.parse(ADT_PROGRAM))
    old = _without_section(exe.save_bytes(), b"ATYP", 2)
    loaded = load_executable(old)
    assert all(a.field_types is None for a in loaded.adts) and loaded.type_definitions() == {}
    mk = tv.parse(ADT_PROGRAM).constructor("MkPair")
    result = VirtualMachine(loaded).invoke("main", mk(np.float32(4), tv.prelude.make_list([])))
    assert result.numpy() == np.float32(4)
    # ATYP is a version-3 section
    newer = bytearray(exe.save_bytes()[:-32])
    struct.pack_into("<I", newer, len(MAGIC), 2)
    with pytest.raises(FormatError, match="unknown section b'ATYP'"):
        load_executable(_resealed(bytes(newer)))


@pytest.mark.parametrize("bad, message", [
    ("Tensor[(2,), complex64]", "unknown dtype"),
    ("C", "undeclared type variables"),
])
def test_bad_adt_types_are_format_errors(bad, message):
    exe = tv.vm.compile(tv.parse(ADT_PROGRAM))
    exe.adts = [tv.vm.AdtInfo(a.name, a.constructors, a.type_vars, (("A", bad), ("fn (A) -> B",), ()))
                if a.name == "Pair" else a for a in exe.adts]
    with pytest.raises(FormatError, match=message):
        load_executable(exe.save_bytes())


@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_fuzzed_adt_types_load_or_raise_format_error(data):
    original = _SUM_UP_BYTES.setdefault("adt", tv.vm.compile(tv.parse(ADT_PROGRAM)).save_bytes())
    start, end = _sections(original)[1][b"ATYP"]
    body = bytearray(original[:-32])
    for _ in range(data.draw(st.integers(1, 3))):
        body[data.draw(st.integers(start + 12, end - 1))] ^= data.draw(st.integers(1, 255))
    try:
        exe = load_executable(_resealed(bytes(body)))
    except FormatError:
        return
    exe.type_definitions()  # what loaded must rebuild


def test_a_type_nested_as_deep_as_type_inference_allows_saves_and_loads():
    """The loader's bound on type text is type inference's own (MAX_TYPE_NESTING), so what compiles also loads;
    a deeper text is a FormatError."""
    from tensorvm.transform.infer_type import MAX_TYPE_NESTING
    from tensorvm.vm.serialize import MAX_TYPE_DEPTH

    depth = MAX_TYPE_NESTING - 1
    mod = tv.parse("def @main(%x: " + "(" * depth + "int32" + ",)" * depth + ") { %x }")
    arg = np.int32(3)
    for _ in range(depth):
        arg = (arg,)
    result = VirtualMachine(load_executable(tv.vm.compile(mod, target="python").save_bytes())).run(arg)
    for _ in range(depth):
        (result,) = result
    assert int(result.numpy()) == 3
    with pytest.raises(FormatError, match="nested deeper than"):
        text_to_type("(" * (MAX_TYPE_DEPTH + 2) + "int32" + ",)" * (MAX_TYPE_DEPTH + 2))
