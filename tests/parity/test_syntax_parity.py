"""The full Relay text syntax, end to end: every construct of ``docs/text-format.md`` parses, prints back
to a structurally equal module (``tv.parse(str(mod))``), type-checks, and runs on every executor with the
answer computed by hand or with NumPy. References run everywhere (on the VM, those that leave their
function are cells)."""

from __future__ import annotations

import base64
import json
import struct

import numpy as np
import pytest
from parity_harness import HEADER, parse
from programs import PROGRAMS as SUITE
from programs import Con, check_result

import tensorvm as tv
from tensorvm.errors import ParseError, TensorVMError
from tensorvm.prelude import make_list

F32 = np.float32
I32 = np.int32

# name -> (text, args, expected)
PROGRAMS: dict[str, tuple] = {}


def program(name, text, args, expected):
    assert name not in PROGRAMS, name
    PROGRAMS[name] = (text, args, expected)


program("polymorphic_fn_with_type_params", """
def @main(%x: int32, %y: float32) -> (int32, float32) {
  let %ident = fn [A](%v: A) -> A { %v };
  (%ident(%x), %ident(%y))
}""", (I32(3), F32(1.5)), (I32(3), F32(1.5)))

program("global_with_type_params_and_explicit_type_args", """
def @pair[A, B](%a: A, %b: B) -> (A, B) { (%a, %b) }
def @main(%x: int32) -> (int32, (int32, int32)) {
  @pair[int32, (int32, int32)](%x, (%x, 7))
}""", (I32(2),), (I32(2), (I32(2), I32(7))))

program("let_with_annotations_and_shadowing", """
def @main(%x: Tensor[(2), float32]) -> Tensor[(2), float32] {
  let %y: Tensor[(2), float32] = add(%x, 1f);
  let %y: Tensor[(2), float32] = multiply(%y, %y);
  let %unused: _ = 5;
  %y
}""", (np.array([1, 2], F32),), np.array([4, 9], F32))

program("graph_bindings_share_nodes", """
def @main(%x: float32) -> float32 {
  %0 = add(%x, 1f);
  %1 = multiply(%0, %0);
  %named = subtract(%1, %0)
  %named
}""", (F32(2),), F32(9 - 3))

program("recursive_let_bound_function", """
def @main(%n: int32) -> int32 {
  let %fact = fn (%i: int32) -> int32 {
    if (less_equal(%i, 1)) { 1 } else { multiply(%i, %fact(subtract(%i, 1))) }
  };
  %fact(%n)
}""", (I32(6),), I32(720))

program("else_if_chain", """
def @main(%x: int32) -> int32 {
  if (less(%x, 0)) { -1 } else if (equal(%x, 0)) { 0 } else { 1 }
}""", (I32(-5),), I32(-1))

program("tuples_empty_single_nested_and_projections", """
def @make(%x: int32) -> ((int32,), (), (int32, (int32, int32))) {
  ((%x,), (), (%x, (add(%x, 1), add(%x, 2))))
}
def @main(%x: int32) -> (int32, int32, int32) {
  let %t = @make(%x);
  (%t.0.0, %t.2.1.1, @make(%x).2.1.0)
}""", (I32(10),), (I32(10), I32(12), I32(11)))

program("parenthesised_let_sequence", """
def @main(%x: int32) -> int32 {
  add((let %y = multiply(%x, 2); %y), (let %z = 1; add(%z, %x)).0)
}""".replace("(let %z = 1; add(%z, %x)).0", "((let %z = 1; add(%z, %x)),).0"), (I32(4),), I32(8 + 5))

program("function_attributes_and_fn_typed_parameters", """
def @apply(%f: fn (int32) -> int32, %x: int32) -> int32 { %f(%x) }
def @main(%x: int32) -> int32 {
  let %inc = fn (%v: int32, Inline=1) -> int32 { add(%v, 1) };
  @apply(%inc, %x)
}""", (I32(41),), I32(42))

program("user_type_without_params_and_forward_references", """
def @main(%x: Tensor[(3), float32]) -> Tensor[(3), float32] { @unbox(@box(%x)) }
def @unbox(%b: Box) -> Tensor[(3), float32] { match (%b) { MkBox(%t) => %t, } }
def @box(%t: Tensor[(3), float32]) -> Box { MkBox(%t) }
type Box { MkBox(Tensor[(3), float32]) }""", (np.array([1, 2, 3], F32),), np.array([1, 2, 3], F32))

program("mutual_recursion", """
def @is_even(%n: int32) -> bool { if (equal(%n, 0)) { True } else { @is_odd(subtract(%n, 1)) } }
def @is_odd(%n: int32) -> bool { if (equal(%n, 0)) { False } else { @is_even(subtract(%n, 1)) } }
def @main(%n: int32) -> (bool, bool) { (@is_even(%n), @is_odd(%n)) }""", (I32(7),), (np.bool_(False), np.bool_(True)))

program("match_incomplete_nested_and_wildcards", """
type Pair[A] { MkPair(A, A), }
def @main(%l: List[Pair[int32]]) -> int32 {
  match? (%l) {
    Cons(MkPair(%a, _), Cons(MkPair(_, %b: int32), _)) => subtract(%a, %b),
    Cons(MkPair(%a, %b), Nil) => add(%a, %b),
  }
}""", None, None)  # arguments need the module's constructors; see the dedicated test

program("patterns_on_tuples", """
def @main(%x: int32) -> int32 {
  let %t = ((%x, 1), 2);
  match (%t) { ((%a, _), %c) => add(%a, %c), }
}""", (I32(5),), I32(7))

program("all_dtype_suffixes_and_negative_literals", """
def @main() {
  (-2, 3i8, -4i16, 5i64, 6u8, 7u16, 8u32, 9u64, 1.5f, -2f32, 2.5f16, -3.25f64, 1e-05f, True, False)
}""", (), (I32(-2), np.int8(3), np.int16(-4), np.int64(5), np.uint8(6), np.uint16(7), np.uint32(8), np.uint64(9),
           F32(1.5), F32(-2), np.float16(2.5), np.float64(-3.25), F32(1e-05), np.bool_(True), np.bool_(False)))

program("special_floats", """
def @main() -> (bool, bool, bool) {
  (isinf(inf), isinf(-inff64), isnan(nanf16))
}""", (), (np.bool_(True), np.bool_(True), np.bool_(True)))

program("comments_everywhere", """
// a line comment
def @main(%x /* the input */: int32) -> int32 { /* a /* nested */ block comment */
  add(%x, 1) // trailing
  /* ty=int32 */
}""", (I32(1),), I32(2))

program("call_attributes_of_every_kind", """
def @main(%x: Tensor[(1, 2, 4, 4), float32], %w: Tensor[(3, 2, 3, 3), float32]) {
  %0 = nn.conv2d(%x, %w, strides=[1, 1], padding=[1, 1, 1, 1], channels=3, kernel_size=[3, 3],
                 data_layout="NCHW", kernel_layout=OIHW, out_dtype="");
  %1 = nn.leaky_relu(%0, alpha=0.25f);
  %2 = sum(%1, axis=None, keepdims=True, exclude=False);
  %3 = nn.pad(%x, pad_width=[[0, 0], [0, 0], [1, 0], [0, 0]]);
  %4 = clip(%3, a_min=-inff, a_max=0.5f);
  (cast(%2, dtype=float64), sum(%4, axis=[-1]), squeeze(%2, axis=[-1, 0]), nn.softmax(%x, axis=-2))
}""", None, None)  # checked against NumPy in the dedicated test

program("closures_returning_closures", """
def @main(%a: float32) -> float32 {
  let %adder = fn (%x: float32) -> fn (float32) -> float32 { fn (%y: float32) -> float32 { add(%x, %y) } };
  let %add_a = %adder(%a);
  %add_a(%add_a(1f))
}""", (F32(2.5),), F32(6))

program("symbolic_dims", """
def @main(%x: Tensor[(n, 2), float32], %y: Tensor[(n, 2), float32]) -> Tensor[(n, 2), float32] {
  subtract(%x, %y)
}""", (np.ones((3, 2), F32), np.full((3, 2), 2, F32)), np.full((3, 2), -1, F32))


program("closure_captures_a_graph_binding_used_across_branches", """
def @main(%x: float32) -> float32 {
  %0 = exp(%x);
  %1 = fn (%y: float32) -> float32 { add(%y, %0) };
  %2 = if (greater(%x, 0f)) { %1(%0) } else { %0 };
  add(%2, %1(1f))
}""", (F32(0.5),), F32(3 * np.exp(np.float32(0.5)) + 1))

program("nullary_constructor_with_parens_and_explicit_type_args", """
def @main(%x: int32) -> (List[int32], Option[int32]) { (Cons(%x, Nil()), Some[int32](%x)) }""",
        (I32(3),), ([I32(3)], Con("Some", I32(3))))

program("recursive_let_inside_a_match_arm", """
def @main(%l: List[int32]) -> int32 {
  match (%l) {
    Cons(%h, _) => {
      let %count = fn (%i: int32) -> int32 { if (less(%i, %h)) { %count(add(%i, 1)) } else { %i } };
      %count(0)
    },
    Nil => -1,
  }
}""", (make_list([I32(4)]),), I32(4))

program("unsuffixed_float_literals", """
def @main() { (1e3, 2.5, -0.0, 1e-05) }""", (), (F32(1000), F32(2.5), F32(-0.0), F32(1e-05)))


program("def_attributes_and_projection_of_a_parenthesised_tuple", """
def @helper(%x: int32, hint="double") -> int32 { add(%x, %x) }
def @main(%x: int32) -> int32 { ((1, 2, @helper(%x))).2 }""", (I32(4),), I32(8))

program("polymorphic_function_type_annotation", """
def @main(%x: int32, %y: float32) -> (int32, float32) {
  let %ident: fn [A](A) -> A = fn [A](%v: A) -> A { %v };
  (%ident(%x), %ident(%y))
}""", (I32(1), F32(2)), (I32(1), F32(2)))

program("string_attribute_with_a_json_escape", r"""
def @main(%x: Tensor[(1, 2, 2, 2), float32]) { nn.avg_pool2d(%x, pool_size=[2, 2], layout="\u004eCHW") }""",
        (np.arange(8, dtype=F32).reshape(1, 2, 2, 2),), np.array([1.5, 5.5], F32).reshape(1, 2, 1, 1))


RUNNABLE = [name for name, (_, args, _) in PROGRAMS.items() if args is not None]


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_text_round_trips(name):
    text = PROGRAMS[name][0]
    mod = parse(text)
    again = tv.parse(str(mod))
    tv.assert_structural_equal(mod, again)
    typed = tv.transform.InferType()(mod)
    typed_again = tv.parse(typed.astext(show_types=True))  # the /* ty=... */ comments are ignored
    tv.assert_structural_equal(mod, typed_again)


@pytest.mark.parametrize("name", RUNNABLE)
def test_text_runs(run, name):
    text, args, expected = PROGRAMS[name]
    check_result(run(text, *args), expected, run.module(text))


def test_nested_patterns_with_module_constructors(run):
    text = PROGRAMS["match_incomplete_nested_and_wildcards"][0]
    mod = run.module(text)
    cons, nil, pair = (mod.constructor(n) for n in ("Cons", "Nil", "MkPair"))

    def pairs(*items):
        value = nil()
        for a, b in reversed(items):
            value = cons(pair(I32(a), I32(b)), value)
        return value

    check_result(run(text, pairs((10, 1), (2, 3), (4, 5))), I32(10 - 3))
    check_result(run(text, pairs((10, 1))), I32(11))
    with pytest.raises(TensorVMError):
        run(text, pairs())


def test_attribute_kinds_reach_the_ops(run):
    text = PROGRAMS["call_attributes_of_every_kind"][0]
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 2, 4, 4)).astype(F32), rng.standard_normal((3, 2, 3, 3)).astype(F32)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = np.zeros((1, 3, 4, 4))
    for p in range(3):
        for q in range(3):
            conv += np.einsum("nchw,oc->nohw", xp[:, :, p:p + 4, q:q + 4], w[:, :, p, q])
    leaky = np.where(conv > 0, conv, 0.25 * conv)
    padded = np.minimum(np.pad(x, ((0, 0), (0, 0), (1, 0), (0, 0))), 0.5)
    total = leaky.sum().reshape(1, 1, 1, 1)
    e = np.exp(x - x.max(axis=-2, keepdims=True))
    expected = (total.astype(np.float64), padded.sum(axis=-1).astype(F32), total.reshape(1, 1).astype(F32),
                (e / e.sum(axis=-2, keepdims=True)).astype(F32))
    check_result(run(text, x, w), expected, rtol=1e-4, atol=1e-4)


META_TEXT = """
def @main(%x: Tensor[(2, 3), float32]) -> Tensor[(2, 3), float32] {
  add(%x, meta[relay.Constant][0])
}
#[metadata]
{"relay.Constant": [{"dtype": "float32", "shape": [2, 3], "data": "AAAAAAAAgD8AAABAAABAQAAAgEAAAKBA"}]}
"""


def test_meta_constants_from_the_metadata_section(run):
    mod = tv.parse(HEADER + META_TEXT)
    tv.assert_structural_equal(mod, tv.parse(str(mod)))
    x = np.ones((2, 3), F32)
    check_result(run(mod, x), x + np.arange(6, dtype=F32).reshape(2, 3))


def test_meta_constants_given_by_the_caller(run):
    text = "def @main(%x: Tensor[(2), int64]) { (add(%x, meta[relay.Constant][0]), meta[Constant][1]) }"
    mod = tv.parse(HEADER + text, meta=[np.array([5, -5], "int64"), np.float64(0.5)])
    printed = str(mod)
    assert "#[metadata]" in printed
    tv.assert_structural_equal(mod, tv.parse(printed))
    check_result(run(mod, np.array([1, 2], "int64")), (np.array([6, -3], "int64"), np.float64(0.5)))


def tvm_ndarray_b64(array: np.ndarray) -> str:
    """An array in TVM's NDArray binary format (magic, reserved, CPU device, rank, DLDataType, shape,
    byte size, data), base64-encoded, as TVM's printer puts it in "b64ndarrays"."""
    code = {"i": 0, "u": 1, "f": 2, "b": 1}[array.dtype.kind]  # DLDataType codes; bool is a 1-bit uint
    bits = 1 if array.dtype.kind == "b" else array.dtype.itemsize * 8
    header = struct.pack("<QQiiiBBH", 0xDD5E40F096B4A13F, 0, 1, 0, array.ndim, code, bits, 1)
    body = struct.pack(f"<{array.ndim}q", *array.shape) + struct.pack("<q", array.nbytes) + array.tobytes()
    return base64.b64encode(header + body).decode()


def tvm_metadata(*arrays) -> str:
    """The #[metadata] section TVM prints: a serialized object graph whose root Map holds the constants."""
    nodes = [{"type_key": ""}, {"type_key": "Map", "keys": ["relay.Constant"], "data": [2]},
             {"type_key": "Array", "data": [3 + i for i in range(len(arrays))]}]
    nodes += [{"type_key": "relay.Constant", "attrs": {"_checked_type_": "0", "data": str(i), "span": "0",
                                                         "virtual_device_": "0"}} for i in range(len(arrays))]
    return json.dumps({"root": 1, "nodes": nodes, "b64ndarrays": [tvm_ndarray_b64(a) for a in arrays],
                       "attrs": {"tvm_version": "0.8.0"}}, indent=2)


def test_metadata_printed_by_tvm(run):
    weights = np.arange(6, dtype=F32).reshape(2, 3)
    flags = np.array([True, False, True])
    text = f"""#[version = "0.0.5"]
def @main(%x: Tensor[(2, 3), float32]) {{
  %0 = add(%x, meta[relay.Constant][0] /* ty=Tensor[(2, 3), float32] */) /* ty=Tensor[(2, 3), float32] */;
  (%0, logical_not(meta[relay.Constant][1]), meta[relay.Constant][2])
}}
#[metadata]
{tvm_metadata(weights, flags, np.array([-7], "int64"))}
"""
    mod = tv.parse(text)
    x = np.ones((2, 3), F32)
    check_result(run(mod, x), (x + weights, ~flags, np.array([-7], "int64")))
    broken = text.replace(tvm_ndarray_b64(weights), tvm_ndarray_b64(weights)[:-8])
    with pytest.raises(ParseError, match="constant 0"):
        tv.parse(broken)


def test_free_var_lines_make_the_main_function(run):
    mod = tv.parse(HEADER + """
free_var %x: Tensor[(?, 3), float32];
free_var %y: float32;
multiply(%x, %y)
""")
    assert [p.name_hint for p in mod["main"].params] == ["x", "y"]
    x = np.arange(6, dtype=F32).reshape(2, 3)
    check_result(run(mod, x, F32(3)), x * 3)
    check_result(run(mod, y=F32(-1), x=x), -x)  # by parameter name


REFS = """
def @main(%x: int32) -> (int32, int32) {
  let %r: ref(int32) = ref(%x);
  let %before = ref_read(%r);
  let %_ = ref_write(%r, add(%before, 10));
  (%before, ref_read(%r))
}"""

REF_COUNTER = """
def @main(%n: int32) -> int32 {
  let %counter = ref(0);
  let %loop = fn (%i: int32) -> () {
    if (less(%i, %n)) {
      let %_ = ref_write(%counter, add(ref_read(%counter), %i));
      %loop(add(%i, 1))
    } else { () }
  };
  let %_ = %loop(0);
  ref_read(%counter)
}"""


def test_a_reference_local_to_its_function_runs_everywhere(run):
    # (LocalRefsToValues: read and written only where it is created, it becomes values for the VM)
    tv.assert_structural_equal(parse(REFS), tv.parse(str(parse(REFS))))
    check_result(run(REFS, 5), (I32(5), I32(15)))


def test_a_reference_captured_by_a_closure_runs_everywhere(run):
    """A reference that leaves its function (captured by a recursive closure) is a cell on the VM too."""
    mod = parse(REF_COUNTER)
    tv.assert_structural_equal(mod, tv.parse(str(mod)))
    check_result(run(REF_COUNTER, 5), I32(0 + 1 + 2 + 3 + 4))
    check_result(run(REF_COUNTER, 0), I32(0))


@pytest.mark.parametrize("name", ["references_shared_by_closures", "reference_counter_returned_with_its_closure"])
def test_references_shared_by_closures_tuples_lists_and_returned(run, name):
    """Cells shared by closures, passed to a global, kept in a tuple and a list, and returned with a closure
    (the program suite's, tests/programs.py): every executor against the values computed by hand."""
    program = next(p for p in SUITE if p.name == name)
    args = program.args_fn()
    check_result(run(program.text, *args), program.expected_fn(*args))


@pytest.mark.parametrize("text, fragment", [
    ("def @main(%x: int32) { add(%x, %y) }", "undefined variable %y"),
    ("def @main(%x: int32) { add(%x 1) }", "expected"),
    ("def @main() { 300u8 }", "300u8"),
    ("def @main() { 2q8 }", "q8"),
    ("def @main() { /* never closed }", "unterminated comment"),
    ("def @main() { no_such_op(1) }", "no_such_op"),
    ("def @main(%x: Tensor[(2), float32]) { nn.softmax(%x, bogus=1) }", "bogus"),
    ("def @main(%l: List[int32]) { match (%l) { D(%x) => %x, } }", "unknown constructor 'D'"),
])
def test_parse_errors_have_positions(text, fragment):
    with pytest.raises(ParseError, match=fragment) as info:
        tv.parse(HEADER + text)
    assert info.value.line >= 1 and info.value.column >= 1


def test_printed_typed_module_parses_and_runs_the_same(run):
    text = """
def @main(%x: Tensor[(?, 2), float32]) -> (Tensor[(?, 2), float32], int32) {
  let %l = Cons(%x, Cons(%x, Nil));
  (add(@hd(%l), 1f), @length(%l))
}"""
    mod = tv.transform.InferType()(parse(text))
    printed = mod.astext(show_types=True)
    assert "/* ty=" in printed
    reparsed = tv.parse(printed)
    x = np.ones((3, 2), F32)
    check_result(run(reparsed, x), (x + 1, I32(2)))


CALLERS_CELL = """
def @main(%r: ref(Tensor[(2), float32]), %k: float32) -> Tensor[(2), float32] {
  let %scale = fn () -> () { ref_write(%r, multiply(ref_read(%r), %k)) };
  let %_ = %scale();
  add(ref_read(%r), 1f)
}"""


def test_a_reference_the_caller_passes_is_written_through(run):
    """A cell given by the caller is the program's: its writes are seen by the caller after the call (its
    content converted as a tensor argument: a wrong dtype is an error naming the cell)."""
    from tensorvm.runtime.object import RefValue

    cell = RefValue(np.array([1.0, 2.0], F32))
    check_result(run(CALLERS_CELL, cell, F32(3)), np.array([4.0, 7.0], F32))
    np.testing.assert_array_equal(np.asarray(getattr(cell.value, "numpy", lambda: cell.value)()), [3.0, 6.0])
    with pytest.raises(TensorVMError, match=r"r'?\.value"):
        run(CALLERS_CELL, RefValue(np.array([1, 2], np.int64)), F32(3))
