"""Which ops have a C shape function: the "C shape function" column of ``tensorvm ops``.

An op's shape function is compiled to C (``tensorvm.vm.shape_c``) when its shape logic is traceable
(``OpDef.shape_logic_traceable``). ``NOT_TRACED`` says why each other op run by the VM keeps the Python
shape function; tests/ops/test_shape_logic.py checks that it is exact, so it only shrinks. An op the VM
never runs inside a fused primitive needs no C shape function at all ("n.a."): the VM's own
instructions' ops, and an op that Legalize replaces before the VM.
"""

from __future__ import annotations

from .registry import OpDef

#: op -> why its shape function is not (yet) a traceable logic (empty: every op the VM runs has one).
NOT_TRACED: dict = {}


def not_run_by_the_vm(opdef: OpDef) -> str:
    """Why the VM never runs ``opdef`` in a fused primitive (so it needs no C shape function), or ''."""
    if opdef.kind == "dialect":
        return "an op of the VM's own instructions or memory planning, never inside a fused primitive"
    if opdef.legalize is not None and opdef.compute is None and opdef.library is None:
        return "Legalize replaces it before the VM (its Python shape function serves the interpreter)"
    return ""


def c_shape_function(opdef: OpDef) -> tuple[str, str]:
    """``("yes", "")``, ``("no", reason)`` or ``("n.a.", reason)``: whether ``opdef`` has a C shape function."""
    reason = not_run_by_the_vm(opdef)
    if reason:
        return "n.a.", reason
    if opdef.shape_logic_traceable:
        return "yes", ""
    return "no", NOT_TRACED.get(opdef.name, "not traceable, and missing from shape_coverage.NOT_TRACED")
