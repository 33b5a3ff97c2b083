"""The generated C: interface, symbols, linked constants, memory, edge cases and errors.

Results are compared with the reference interpreter (or with the exact input bytes for constants).
"""

import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorvm as tv
import tensorvm.aot as aot
from tensorvm.errors import ExecutionError, ShapeError, TensorVMError, UnsupportedError
from tensorvm.transform.memory_planner import PLANNER_ALGORITHMS, plan_memory, static_lifetimes

HEADER = '#[version = "0.0.5"]\n'

MLP4 = """
def @main(%x: Tensor[(8, 32), float32], %w1: Tensor[(64, 32), float32], %w2: Tensor[(64, 64), float32],
          %w3: Tensor[(64, 64), float32], %w4: Tensor[(10, 64), float32]) {
  %0 = nn.relu(nn.dense(%x, %w1));
  %1 = nn.relu(nn.dense(%0, %w2));
  %2 = nn.relu(nn.dense(%1, %w3));
  nn.dense(%2, %w4)
}
"""


def parse(text):
    return tv.parse(HEADER + text)


def interpret(mod, *args):
    value = tv.create_executor("debug", mod).evaluate()(*args)
    return _numpy(value)


def _numpy(value):
    if isinstance(value, tuple):
        return tuple(_numpy(v) for v in value)
    return value.numpy()


def assert_same(actual, expected, rtol=1e-5, atol=1e-5):
    if isinstance(expected, tuple):
        assert isinstance(actual, tuple) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, rtol, atol)
        return
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


# --- the C interface ---------------------------------------------------------------------------------
def test_header_declares_structs_macros_and_run():
    m = aot.build(parse(MLP4), name="net4")
    header = m.sources["tvmgen_net4.h"]
    for line in ("#define TVMGEN_NET4_X_SIZE 1024", "#define TVMGEN_NET4_W1_SIZE 8192",
                 "#define TVMGEN_NET4_OUTPUT_SIZE 320", f"#define TVMGEN_NET4_WORKSPACE_SIZE {m.workspace_size}",
                 "struct tvmgen_net4_inputs {", "  void* x;", "struct tvmgen_net4_outputs {", "  void* output;",
                 "int32_t tvmgen_net4_run(struct tvmgen_net4_inputs* inputs, struct tvmgen_net4_outputs* outputs);",
                 "extern const tvaot_model_t tvmgen_net4_model;", '#include "tensorvm_aot.h"'):
        assert line in header, line
    model_c = m.sources["tvmgen_net4.c"]
    assert f"static _Alignas(16) uint8_t tvmgen_net4_workspace[{m.workspace_size}];" in model_c
    # Every kernel is static and every call is checked, in order.
    calls = [line.strip() for line in model_c.splitlines() if line.strip().startswith("rc = tvmgen_net4_")]
    assert len(calls) == 4
    assert model_c.count("if (rc != 0) return TVAOT_KERNEL_ERROR(") == 4
    for kernel in m.kernels:
        assert f"static TVAOT_NOINLINE int32_t {kernel.name}(" in model_c
    assert "malloc" not in model_c.split("/* ---- kernels")[0]


def test_external_workspace_interface():
    m = aot.build(parse(MLP4), name="ext", workspace="external")
    header = m.sources["tvmgen_ext.h"]
    assert ("int32_t tvmgen_ext_run(struct tvmgen_ext_inputs* inputs, struct tvmgen_ext_outputs* outputs, "
            "void* workspace);") in header
    assert "#define TVMGEN_EXT_WORKSPACE_EXTERNAL 1" in header
    assert "tvmgen_ext_workspace[" not in m.sources["tvmgen_ext.c"]  # no static buffer
    runner = m.load()
    assert runner.descriptor()["workspace_external"] is True
    args = [rand(8, 32, seed=1), rand(64, 32, seed=2), rand(64, 64, seed=3), rand(64, 64, seed=4),
            rand(10, 64, seed=5)]
    assert_same(runner(*args), interpret(parse(MLP4), *args), rtol=1e-4, atol=1e-4)


def test_descriptor_read_back_from_the_library_matches_the_build():
    text = """
def @main(%a: Tensor[(2, 3), float32], %t: (Tensor[(4), int32], bool)) {
  (add(%a, %a), %t.1, cast(%t.0, dtype="int64"))
}"""
    m = aot.build(parse(text), name="desc")
    d = m.load().descriptor()
    assert d["name"] == "desc" and d["abi_version"] == 1
    assert [(t["name"], t["dtype"], t["shape"], t["size_bytes"]) for t in d["inputs"]] == \
        [("a", "float32", [2, 3], 24), ("t_0", "int32", [4], 16), ("t_1", "bool", [], 1)]
    assert [(t["name"], t["dtype"], t["shape"]) for t in d["outputs"]] == \
        [("output0", "float32", [2, 3]), ("output1", "bool", []), ("output2", "int64", [4])]
    assert [(t["dtype_code"], t["dtype_bits"]) for t in d["inputs"]] == [(2, 32), (0, 32), (6, 8)]
    assert d["workspace_size"] == m.workspace_size and d["constants_size"] == m.constants_size
    args = (rand(2, 3), (np.array([1, -2, 3, 4], "int32"), np.array(True)))
    assert_same(m.load()(*args), interpret(parse(text), *args))


@pytest.mark.skipif(shutil.which("nm") is None, reason="binutils nm is not installed")
def test_only_prefixed_global_symbols_and_no_malloc(tmp_path):
    text = """
def @main(%x: Tensor[(4, 10000), float32], %w: Tensor[(10000), float32]) {
  %0 = sum(%x, axis=[0]);
  multiply(%0, %w)
}"""
    m = aot.build(parse(text), name="sym", params={"w": rand(10000)})
    assert any(k.scratch_bytes for k in m.kernels), "expected a kernel with workspace scratch"
    layout = m.write_sources(tmp_path)
    defined, undefined = set(), set()
    for source in layout["sources"]:
        if "runtime" in source.parts:
            continue
        obj = tmp_path / (source.stem + ".o")
        subprocess.run(["cc", "-O2", "-std=c11", "-Wall", "-Werror", "-c", *[f"-I{d}" for d in layout["include_dirs"]],
                        str(source), "-o", str(obj)], check=True, capture_output=True)
        out = subprocess.run(["nm", "-g", str(obj)], check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            (undefined if parts[-2] == "U" else defined).add(parts[-1])
    assert defined and all(s.startswith("tvmgen_sym_") for s in defined), defined
    assert {"tvmgen_sym_run", "tvmgen_sym_set_num_threads", "tvmgen_sym_model", "tvmgen_sym_constants"} <= defined
    assert not undefined & {"malloc", "calloc", "realloc", "free"}, undefined


# --- linked constants ----------------------------------------------------------------------------------
def test_constants_of_every_dtype_are_linked_exactly():
    values = {
        "f": np.array([0.1, -0.0, np.nan, np.inf, -np.inf, 1e-45, 3.4e38], "float32"),
        "d": np.array([0.1, -1e300, np.nan, 5e-324], "float64"),
        "i": np.array([np.iinfo(np.int32).min, -1, 0, 2**31 - 1], "int32"),
        "l": np.array([np.iinfo(np.int64).min, 2**63 - 1], "int64"),
        "s": np.array([-128, 127], "int8"), "u": np.array([0, 255], "uint8"),
        "w": np.array([2**32 - 1], "uint32"), "q": np.array([2**64 - 1], "uint64"),
        "b": np.array([True, False]), "h": np.array([1.5, -np.inf, 65504], "float16"),
    }
    sig = ", ".join(f"%{k}: Tensor[({v.shape[0]}), {v.dtype}]" for k, v in values.items())
    mod = parse(f"def @main({sig}) {{ ({', '.join('%' + k for k in values)}) }}")
    m = aot.build(mod, name="consts", params=values)
    assert m.inputs == () and "void* unused_;" in m.sources["tvmgen_consts.h"]
    outputs = m.load()()
    for (name, value), out in zip(values.items(), outputs):
        assert out.dtype == value.dtype and out.tobytes() == value.tobytes(), name


def test_equal_constants_are_linked_once():
    text = """
def @main(%x: Tensor[(3, 3), float32], %a: Tensor[(3, 3), float32], %b: Tensor[(3, 3), float32]) {
  add(multiply(%x, %a), %b)
}"""
    same = rand(3, 3, seed=7)
    m = aot.build(parse(text), name="dedup", params={"a": same, "b": same.copy()})
    assert len(m.constants) == 1
    x = rand(3, 3, seed=8)
    assert_same(m.load()(x), x * same + same)


# --- memory -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("planner", ["greedy_by_size", "greedy_by_conflicts", "hill_climb", "linear_scan", "no_reuse"])
def test_workspace_is_planned_and_reused(planner):
    mod = parse(MLP4)
    m = aot.build(mod, name="plan", planner=planner)
    plan = m.memory_plan.check()
    assert m.workspace_size == plan.total_bytes
    # three 8x64 float32 intermediates; the first and the third never live at once
    assert plan.unplanned_bytes == 3 * 8 * 64 * 4
    if planner == "no_reuse":
        assert m.workspace_size == plan.unplanned_bytes
    else:
        assert m.workspace_size == 2 * 8 * 64 * 4
    args = [rand(8, 32, seed=1), rand(64, 32, seed=2), rand(64, 64, seed=3), rand(64, 64, seed=4),
            rand(10, 64, seed=5)]
    assert_same(m.load()(*args), interpret(mod, *args), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("planner", ["greedy_by_size", "greedy_by_conflicts", "hill_climb"])
def test_workspace_equals_the_graph_plan_of_the_same_lifetimes(planner):
    """Without kernel scratch, AOT's workspace is the shared planner's plan of the static lifetimes."""
    from tensorvm.transform.memory_planner import lower_static

    mod = parse(MLP4)
    m = aot.build(mod, name="same", planner=planner, alignment=64)
    reference = plan_memory(static_lifetimes(lower_static(mod)), planner, alignment=64)
    assert m.workspace_size == reference.total_bytes


def test_kernel_scratch_comes_from_the_workspace():
    text = """
def @main(%x: Tensor[(4, 10000), float32]) {
  %0 = sum(%x, axis=[0]);
  %1 = sum(%x, axis=[1]);
  (%0, multiply(%1, 2f))
}"""
    mod = parse(text)
    m = aot.build(mod, name="scratch")
    scratch = [k for k in m.kernels if k.scratch_bytes]
    assert scratch and scratch[0].scratch_bytes >= 10000 * 4
    assert m.workspace_size >= scratch[0].scratch_bytes
    assert not m.reentrant
    x = rand(4, 10000, seed=3)
    assert_same(m.load()(x), interpret(mod, x), rtol=1e-4, atol=1e-3)


# --- outputs that are not fresh kernel results ---------------------------------------------------------
def test_outputs_that_are_inputs_constants_duplicates_and_views():
    text = """
def @main(%x: Tensor[(2, 6), float32], %c: Tensor[(3), int32]) {
  %0 = exp(%x);
  %1 = reshape(%0, newshape=[3, 4]);
  %2 = reshape(%x, newshape=[12]);
  %3 = nn.batch_flatten(%1);
  (%0, %x, %c, %0, %1, %2, add(%3, 1f))
}"""
    mod = parse(text)
    c = np.array([5, -6, 7], "int32")
    m = aot.build(mod, name="outs", params={"c": c})
    x = rand(2, 6, seed=4)
    assert len(m.inputs) == 1 and len(m.outputs) == 7
    assert_same(m.load()(x), interpret(mod, x, c))


def test_scalar_program_and_reshape_views_feeding_later_kernels():
    text = """
def @main(%x: Tensor[(4, 4), float32], %s: float32) {
  %0 = nn.dense(%x, %x);
  %1 = reshape(%0, newshape=[16]);
  %2 = nn.softmax(%1);
  %3 = sum(%2);
  multiply(%3, %s)
}"""
    mod = parse(text)
    x, s = rand(4, 4, seed=9), np.float32(1.5)
    m = aot.build(mod, name="views")
    assert any(step.kernel == "" for step in m.steps), "the reshape should be a view, not a kernel call"
    assert_same(m.load()(x, s), interpret(mod, x, s))


# --- random dataflow graphs --------------------------------------------------------------------------
_BINARY = ["add", "subtract", "multiply", "maximum"]


@st.composite
def dataflow_programs(draw):
    rows, cols = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    n_inputs = draw(st.integers(1, 3))
    values = [f"%x{i}" for i in range(n_inputs)]
    lines = []
    for k in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(_BINARY + ["exp", "dense"]))
        a, b = draw(st.sampled_from(values)), draw(st.sampled_from(values))
        if op == "exp":
            expr = f"tanh({a})"
        elif op == "dense" and rows == cols:
            expr = f"nn.dense({a}, {b})"
        else:
            expr = f"{op if op != 'dense' else 'add'}({a}, {b})"
        lines.append(f"  %{k} = {expr};")
        values.append(f"%{k}")
    outs = draw(st.lists(st.sampled_from(values), min_size=1, max_size=4))
    result = outs[0] if len(outs) == 1 else f"({', '.join(outs)})"
    params = ", ".join(f"%x{i}: Tensor[({rows}, {cols}), float32]" for i in range(n_inputs))
    text = f"def @main({params}) {{\n" + "\n".join(lines) + f"\n  {result}\n}}"
    return text, [rand(rows, cols, seed=i + 11) for i in range(n_inputs)], draw(st.sampled_from(PLANNER_ALGORITHMS))


@settings(max_examples=10, deadline=None)
@given(dataflow_programs())
def test_random_dataflow_graphs_match_interpreter(case):
    text, args, planner = case
    mod = parse(text)
    m = aot.build(mod, name="rand", planner=planner)
    m.memory_plan.check()
    assert m.workspace_size <= m.memory_plan.unplanned_bytes or planner == "linear_scan"
    assert_same(m.load()(*args), interpret(mod, *args), rtol=1e-4, atol=1e-4)


# --- errors ------------------------------------------------------------------------------------------
def test_bad_arguments_are_refused_clearly():
    runner = aot.build(parse("def @main(%x: Tensor[(2, 2), float32]) { exp(%x) }"), name="args").load()
    with pytest.raises(ExecutionError, match="input x must be float32, got float64"):
        runner(np.ones((2, 2)))
    with pytest.raises(ShapeError, match=r"input x must have shape \(2, 2\), got \(3, 2\)"):
        runner(np.ones((3, 2), "float32"))
    with pytest.raises(ExecutionError, match="missing argument"):
        runner()
    with pytest.raises(ExecutionError, match="no parameter named 'y'"):
        runner(y=np.ones((2, 2), "float32"))
    np.testing.assert_allclose(runner(x=np.zeros((2, 2), "float32")), np.ones((2, 2), "float32"))


def test_kernel_failure_names_the_kernel():
    mod = parse("def @main(%x: Tensor[(4), int32], %y: Tensor[(4), int32]) { divide(%x, %y) }")
    runner = aot.build(mod, name="div").load()
    x, y = np.arange(4, dtype="int32"), np.array([1, 2, 0, 1], "int32")
    with pytest.raises(ExecutionError, match="tvmgen_div_fused_divide .*division by zero"):
        runner(x, y)
    with pytest.raises(ExecutionError, match="division by zero"):
        interpret(mod, x, y)


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "2net"}, "model name must be an ASCII C identifier"),
    ({"name": "n-et"}, "model name must be an ASCII C identifier"),
    ({"workspace": "heap"}, "workspace must be 'internal' or 'external'"),
    ({"planner": "magic"}, "unknown planner"),
    ({"target": "cuda"}, "target must be 'c'"),
    ({"alignment": 12}, "alignment must be a power of two"),
])
def test_bad_build_options(kwargs, message):
    with pytest.raises(UnsupportedError, match=message):
        aot.build(parse("def @main(%x: float32) { %x }"), **kwargs)


def test_tensor_names_that_clash_in_c_are_refused():
    clash = parse("def @main(%t: (float32, float32), %t_0: float32) { add(%t.0, %t_0) }")
    with pytest.raises(UnsupportedError, match="clash after sanitizing"):
        aot.build(clash, name="clash")
    macro = parse("def @main(%workspace: float32) { %workspace }")
    with pytest.raises(UnsupportedError, match="clashes with another macro"):
        aot.build(macro, name="clash")


def test_c_keywords_are_renamed():
    m = aot.build(parse("def @main(%int: float32, %float: float32) { add(%int, %float) }"), name="kw")
    assert [t.name for t in m.inputs] == ["int_", "float_"]
    assert float(m.load()(np.float32(1), np.float32(2))) == 3.0


def test_refusals_point_to_the_vm():
    with pytest.raises(TensorVMError, match="AOT: .*dynamic.*VM"):
        aot.build(parse("def @main(%x: Tensor[(?, 2), float32]) { exp(%x) }"))
    with pytest.raises(UnsupportedError, match="AOT: .*if.*VM"):
        aot.build(parse("def @main(%c: bool, %x: float32) { if (%c) { %x } else { negative(%x) } }"))
    with pytest.raises(UnsupportedError, match="AOT expects an IRModule"):
        aot.build("def @main() { 1 }")


def test_models_with_the_same_name_in_one_process_keep_their_own_constants():
    mod = parse("def @main(%x: Tensor[(3), float32], %c: Tensor[(3), float32]) { add(%x, %c) }")
    x = np.zeros(3, "float32")
    first = tv.create_executor("aot", mod, params={"c": np.full(3, 1, "float32")}).evaluate()
    second = tv.create_executor("aot", mod, params={"c": np.full(3, 2, "float32")}).evaluate()
    np.testing.assert_array_equal(first(x).numpy(), np.full(3, 1, "float32"))
    np.testing.assert_array_equal(second(x).numpy(), np.full(3, 2, "float32"))
    np.testing.assert_array_equal(first(x).numpy(), np.full(3, 1, "float32"))
