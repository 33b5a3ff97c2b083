"""Shared machinery for the TVM-parity tests (``conftest.py`` exposes the ``run`` fixture from here).

Every behavioural test runs through the public API on each way of executing a module:

* ``debug``: ``tv.create_executor("debug", mod).evaluate()`` (the reference interpreter);
* ``vm``: ``tv.create_executor("vm", mod).evaluate()``;
* ``bytecode`` / ``compiled``: ``tv.vm.compile(mod, exec_mode=...)`` + ``tv.vm.VirtualMachine``;
* ``bytecode_saved`` / ``compiled_saved``: the same after ``exe.save_bytes()`` /
  ``tv.vm.load_executable`` (the binary format round trip).

Tests take the ``run`` fixture (parametrized over those kinds) and call ``run(text, *args)``; the
result is compared with an oracle computed independently (NumPy or plain Python) by
``check_result`` from the shared program suite. Parsing and compiling are cached per text, so the six
kinds of one test share the work. ``xfail_on(request, run, kinds, reason)`` marks a known failure of
some executors as a strict xfail.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: programs

import tensorvm as tv  # noqa: E402
from tensorvm.ir.module import IRModule  # noqa: E402

HEADER = '#[version = "0.0.5"]\n'
KINDS = ("debug", "vm", "bytecode", "compiled", "bytecode_saved", "compiled_saved")
VM_KINDS = KINDS[1:]

_MODULES: dict[str, IRModule] = {}
_EXECUTABLES: dict = {}


def parse(text: str) -> IRModule:
    """``tv.parse`` with the version header, cached per text (modules are not mutated by running)."""
    if text not in _MODULES:
        _MODULES[text] = tv.parse(HEADER + text)
    return _MODULES[text]


def executable(mod: IRModule, mode: str, saved: bool):
    key = (id(mod), mode, saved)
    if key not in _EXECUTABLES:
        if saved:
            exe = tv.vm.load_executable(executable(mod, mode, False).save_bytes())
        else:
            exe = tv.vm.compile(mod, exec_mode=mode)
        _EXECUTABLES[key] = (mod, exe)  # keep mod alive so its id stays unique
    return _EXECUTABLES[key][1]


class Runner:
    """Runs a module's entry function on one kind of executor."""

    def __init__(self, kind: str):
        self.kind = kind

    def __repr__(self) -> str:
        return f"Runner({self.kind})"

    @property
    def is_vm(self) -> bool:
        return self.kind != "debug"

    def module(self, source) -> IRModule:
        return source if isinstance(source, IRModule) else parse(source)

    def function(self, source, entry: str = "main"):
        """The entry function as a Python callable on this executor."""
        mod = self.module(source)
        if self.kind in ("debug", "vm"):
            if entry != "main":
                mod = mod.copy()
                mod.add("main", mod[entry])
            return tv.create_executor(self.kind, mod).evaluate()
        mode = "compiled" if self.kind.startswith("compiled") else "bytecode"
        machine = tv.vm.VirtualMachine(executable(mod, mode, self.kind.endswith("_saved")))
        return lambda *args, **kwargs: machine.invoke(entry, *args, **kwargs)

    def __call__(self, source, *args, entry: str = "main", **kwargs):
        return self.function(source, entry)(*args, **kwargs)


@pytest.fixture(params=KINDS)
def run(request) -> Runner:
    return Runner(request.param)


def xfail_on(request, runner: Runner, kinds, reason: str) -> None:
    """Mark the running test as a strict expected failure when ``runner`` is one of ``kinds``."""
    if runner.kind in kinds:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
