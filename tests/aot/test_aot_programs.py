"""Every static program of the shared suite through AOT (compiled with cc, run via the loader),
checked against the reference interpreter and the suite's NumPy answer; every other program refused."""

import numpy as np
import pytest
from programs import PROGRAMS, check_result

import tensorvm as tv
import tensorvm.aot as aot
from tensorvm.errors import UnsupportedError

STATIC = [p for p in PROGRAMS if "static" in p.tags]
OTHERS = [p for p in PROGRAMS if "static" not in p.tags]


def _interpret(program, args):
    return tv.create_executor("debug", program.parse()).evaluate(program.entry)(*args)


def test_the_suite_has_static_programs():
    assert len(STATIC) >= 5


@pytest.mark.parametrize("workspace", ["internal", "external"])
@pytest.mark.parametrize("program", STATIC, ids=lambda p: p.name)
def test_static_program_matches_interpreter(program, workspace):
    mod = program.parse()
    args = program.args_fn()
    runner = aot.build(mod, name="prog", workspace=workspace).load()
    result = runner(*args)
    expected = _interpret(program, args)
    check_result(result, _as_python(expected), mod, rtol=program.rtol, atol=program.atol)
    if program.expected_fn is not None:
        check_result(result, program.expected_fn(*args), mod, rtol=program.rtol, atol=program.atol)


@pytest.mark.parametrize("program", STATIC, ids=lambda p: p.name)
def test_static_program_through_create_executor(program):
    mod = program.parse()
    args = program.args_fn()
    result = tv.create_executor("aot", mod).evaluate()(*args)
    check_result(result, _as_python(_interpret(program, args)), mod, rtol=program.rtol, atol=program.atol)


def test_params_are_linked_and_named():
    program = next(p for p in STATIC if p.name == "static_mlp")
    mod = program.parse()
    x, w1, b1, w2, b2 = program.args_fn()
    params = {"w1": w1, "b1": b1, "w2": w2, "b2": b2}
    module = aot.build(mod, name="mlp", params=params)
    assert [t.name for t in module.inputs] == ["x"]
    assert set(module.constants) == set(params)
    for name, value in params.items():
        np.testing.assert_array_equal(module.constants[name], value)
    assert "static const _Alignas(16) float tvmgen_mlp_w1[128]" in module.sources["tvmgen_mlp_params.c"]
    result = tv.create_executor("aot", mod, params=params).evaluate()(x)
    check_result(result, program.expected_fn(x, w1, b1, w2, b2), mod, rtol=program.rtol, atol=program.atol)


@pytest.mark.parametrize("program", OTHERS, ids=lambda p: p.name)
def test_non_static_programs_are_refused(program):
    with pytest.raises(UnsupportedError, match="AOT: .*(VM|vm)"):
        aot.build(program.parse(), name="refused")


def _as_python(value):
    if isinstance(value, tuple):
        return tuple(_as_python(v) for v in value)
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)
