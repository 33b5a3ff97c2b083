"""The operator registry and the builder API for calls.

``tensorvm.op.add(x, y)`` and ``tensorvm.op.nn.conv2d(x, w, padding=[1, 1])`` build calls of
registered ops (attributes are checked); ``get_op(name)`` returns an op's definition.
"""

from __future__ import annotations

# Importing these modules registers their ops, each complete at its definition (compute and strategy
# included): after ``import tensorvm.op`` every op has all its parts.
from . import (  # noqa: F401
    algorithm,
    annotation,
    creation,
    dynamic,
    image,
    memory,
    nn,
    nn_relay,
    onnx_ops,
    recurrent,
    reduce,
    relay_forms,
    tensor,
    transform,
    transform_relay,
    vision,
)
from .registry import (  # noqa: F401
    REQUIRED,
    AttrDef,
    OpDef,
    OpPattern,
    get_op,
    is_registered,
    make_call,
    op_names,
    register_op,
    snapshot_definitions,
)

snapshot_definitions()  # the package's ops as it defines them (``registry.unchanged_since_registered``)


class _Namespace:
    """``tensorvm.op.nn`` etc.: attribute access builds calls of ``<prefix>.<name>``."""

    def __init__(self, prefix: str):
        self._prefix = prefix

    def __getattr__(self, name: str):
        full = f"{self._prefix}.{name}"
        if is_registered(full):
            return lambda *args, **attrs: make_call(full, *args, **attrs)
        if any(op.startswith(full + ".") for op in op_names()):
            return _Namespace(full)
        raise AttributeError(f"no operator {full}")


def _install_namespaces() -> None:
    """Make ``tensorvm.op.nn`` etc. build calls even where a submodule of that name defines the ops."""
    for prefix in {name.split(".")[0] for name in op_names() if "." in name}:
        globals()[prefix] = _Namespace(prefix)


_install_namespaces()


def __getattr__(name: str):
    if is_registered(name):
        return lambda *args, **attrs: make_call(name, *args, **attrs)
    if any(op.startswith(name + ".") for op in op_names()):
        return _Namespace(name)
    raise AttributeError(f"module tensorvm.op has no operator or attribute {name!r}")
