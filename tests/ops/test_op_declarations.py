"""Every registered op is declared completely, in one place, by importing ``tensorvm.op`` alone.

One case per op checks the parts it needs: a type relation, a NumPy kernel, attribute defaults that
normalize, a shape function (every kernel op, since any input may be dynamic; a dialect op when its
output shape reads data), and a compute, a named library call or a legalization into other ops unless
it is a compiler dialect op (``kind="dialect"``). Ops without one today are listed in ``PENDING`` with
the reason; their case is a strict xfail, so it fails as soon as the op gets one and the entry must go.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tensorvm.op import REQUIRED, get_op, op_names
from tensorvm.op.registry import OP_KINDS

_DATA_SHAPED = "its output shape comes from input values (the compute must read the dims from out_type)"

# The ops still without a compute or a library call, each with the reason: their case is a strict xfail,
# so it fails as soon as the op gets one and its entry must go (issue 17: every op native on target c).
PENDING = {
}

# The ops tensorvm declares (a test may register an op of its own, e.g. tests/test_text_format.py).
_OPS = [name for name in op_names() if get_op(name).defined_in.startswith("tensorvm.op.")]


def _compute_cases():
    return [pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=PENDING[name]))
            if name in PENDING else name for name in _OPS]


@pytest.mark.parametrize("name", _OPS)
def test_op_declares_its_parts(name):
    opdef = get_op(name)
    assert opdef.kind in OP_KINDS
    assert callable(opdef.type_rel), f"{name}: no type relation"
    assert callable(opdef.kernel), f"{name}: no NumPy kernel"
    # (an op Legalize replaces before every compiled path, e.g. nn.conv1d, needs none: the interpreter runs its kernel)
    legalized = callable(opdef.legalize) and opdef.compute is None and opdef.library is None
    needs_shape_func = opdef.kind == "kernel" and not legalized or opdef.is_data_dependent
    assert not needs_shape_func or callable(opdef.shape_func), f"{name}: no shape function"
    assert len({a.name for a in opdef.attrs}) == len(opdef.attrs), f"{name}: an attribute is declared twice"
    # The defaults normalize (converted once, a converted value is stable), and a call giving only
    # the required attributes is complete.
    for adef in opdef.attrs:
        if adef.default is not REQUIRED and adef.default is not None and adef.convert is not None:
            value = adef.convert(adef.default)
            assert adef.convert(value) == value, f"{name}: attribute {adef.name}'s default does not normalize"
    if not any(a.default is REQUIRED for a in opdef.attrs):
        assert set(opdef.normalize_attrs({})) == {a.name for a in opdef.attrs}


@pytest.mark.parametrize("name", _compute_cases())
def test_op_has_a_compute_or_a_library_call(name):
    opdef = get_op(name)
    if opdef.kind == "dialect":
        assert opdef.compute is None, f"{name}: a dialect op is lowered by the compiler, never a kernel"
        return
    # ``legalize``: the op becomes other ops before the VM compiles it (``unique``: a sort, then a count).
    assert callable(opdef.compute) or opdef.library is not None or callable(opdef.legalize), \
        f"{name}: no compute, no library call and no legalization"


def test_pending_names_only_registered_kernel_ops():
    stale = [name for name in PENDING if name not in _OPS or get_op(name).kind != "kernel"]
    assert stale == []


def test_dialect_ops_are_the_compiler_dialect():
    assert {name for name in _OPS if get_op(name).kind == "dialect"} == \
        {name for name in _OPS if name.split(".")[0] in ("memory", "vm")}


def test_every_op_the_shared_programs_call_is_registered():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from programs import PROGRAMS

    assert {p.name: p.missing_ops() for p in PROGRAMS if p.missing_ops()} == {}


def test_importing_the_registry_alone_attaches_computes_and_strategies():
    """A fresh interpreter importing only ``tensorvm.op`` sees every part (no import side effect of the
    code generator needed), and the registry does not import the code generator."""
    code = ("import sys, tensorvm.op as op; "
            "print(op.get_op('add').compute is not None, op.get_op('nn.dense').strategy is not None, "
            "op.get_op('nn.softmax').strategy is not None, 'tensorvm.codegen' in sys.modules)")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root,
                         env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == ["True", "True", "True", "False"]
