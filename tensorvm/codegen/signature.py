"""What a generated kernel depends on, as one key; and the memo of planned kernels keyed by it.

Invariant: two primitive functions get the same ``kernel_key`` only when the code generator would make
the same kernel of them (same C text, same variants, same external plans). The key hashes

- the primitive's signature (``primitive_signature``): its Relay text (ops, attrs, parameter and result
  types with every static dim and dtype; dynamic dims as ``?`` or their names) and the dtype, shape and
  bytes of every constant in it (the text alone could print two constants alike);
- the C function name the kernel gets (it is in the C text);
- ``generator_stamp()``: a digest of the package's own source (every ``.py``, ``.c`` and ``.h`` file of
  ``tensorvm``), so an edited generator, op compute or C library never matches an old key;
- ``codegen_settings()``: everything outside the function that changes what is generated: the host
  description (``host.host()``, fake or detected; its measured timings by the rounded thresholds they
  give, ``host.codegen_view``), whether kernel variants are on, the BLAS mode, the
  variant pins (``calibrate``), the C toolchain's fingerprint and features, and the value of every
  upper-case module constant of the loaded code generator, op and te modules (a bound such as
  ``MAX_INLINED_NODES`` changed at run time changes the key);
- ``op_definitions(names)``: the definition of each op the function calls (every field of its
  ``OpDef``: flags, attrs, and its compute, strategy and shape logic by module, name and identity), so
  an op registered, replaced or changed at run time never matches a kernel of its old definition.

The identities make a key of this process only; the key kept on disk for other processes
(``kernel_manifest``) has none, and exists only when every op is the package's own and holds the very
objects it was registered with (``registry.unchanged_since_registered``: its code is then the stamp's).

A wrong hit would be a silent wrong answer, so each ingredient has a test that changing it misses
(``tests/codegen/test_signature.py``).

``PLANS`` memoizes, per process, what lowering made of a key: the ``KernelPlan`` and its emitted C
(``EmittedKernel`` per function), so compiling a model again (a fresh import of the same file, another
executable with the same fused groups) skips lowering and C emission for every kernel it has seen.
It holds at most 1024 entries, least recently used out first (MobileNetV3-small's 57 kernels and 58
shape functions hold 2.8 MB).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
import sys
import threading
from collections import OrderedDict
from pathlib import Path

__all__ = ["primitive_signature", "primitive_ops", "op_definitions", "generator_stamp", "codegen_settings",
           "kernel_key", "PlanMemo", "PLANS"]

_PACKAGE = Path(__file__).resolve().parent.parent
_STAMP: list = []


def generator_stamp() -> str:
    """A digest of every ``.py``, ``.c`` and ``.h`` file of the ``tensorvm`` package (computed once per
    process: the code that generates kernels does not change under a running program)."""
    if not _STAMP:
        digest = hashlib.sha256()
        files = sorted(p for p in _PACKAGE.rglob("*") if p.suffix in (".py", ".c", ".h") and p.is_file())
        for path in files:
            digest.update(str(path.relative_to(_PACKAGE)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
        _STAMP.append(digest.hexdigest())
    return _STAMP[0]


def codegen_settings() -> str:
    """The settings outside a primitive function that change the kernel made of it (see the module doc)."""
    from . import blas, calibrate
    from .build import find_toolchain
    from .host import codegen_view
    from .strategy import variants_enabled

    toolchain = find_toolchain()
    with calibrate._LOCK:
        pins = sorted(calibrate._PINS.items())
    env_pins = calibrate.os.environ.get("TENSORVM_VARIANT", "")
    return "\n".join([
        codegen_view(), f"variants={variants_enabled()}", f"blas={blas.mode()}", f"pins={pins}|{env_pins}",
        f"toolchain={toolchain.fingerprint}|openmp={toolchain.openmp}|simd={toolchain.simd_pragmas}"
        f"|float16={toolchain.float16}|python={bool(toolchain.python_include)}",
        _module_constants(),
    ])


_CONSTANT = re.compile(r"_?[A-Z][A-Z0-9_]*\Z")
_SETTING_MODULES = ("tensorvm.codegen.", "tensorvm.op.", "tensorvm.te.", "tensorvm.vm.shape_c", "tensorvm.vm.kernel_c")


def _module_constants() -> str:
    """``name=value`` of the upper-case int/float/str/bool/tuple constants of the code generator's modules."""
    parts = []
    for name in sorted(n for n in sys.modules if n.startswith(_SETTING_MODULES)):
        module = sys.modules[name]
        for key, value in sorted(vars(module).items()):
            if _CONSTANT.match(key) and isinstance(value, (bool, int, float, str, tuple)):
                parts.append(f"{name}.{key}={_token(value, False)}")  # (no addresses: the same in every process)
    return "\n".join(parts)


def _token(value, identities: bool):
    """A printable stand-in for a field of an op definition (functions and objects by module and name,
    and by identity when ``identities``)."""
    if value is None or isinstance(value, (bool, int, float, str, enum.Enum)):
        return repr(value)
    if isinstance(value, (tuple, list, frozenset)):
        return "(" + ",".join(_token(v, identities) for v in value) + ")"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ",".join(f"{f.name}={_token(getattr(value, f.name), identities)}" for f in dataclasses.fields(value)
                          if not f.name.startswith("_"))
        return f"{type(value).__qualname__}({fields})"
    module = getattr(value, "__module__", None) or type(value).__module__
    name = getattr(value, "__qualname__", None) or type(value).__qualname__
    return f"{module}.{name}" + (f"#{id(value)}" if identities else "")


def op_definitions(names) -> tuple[str, str, bool]:
    """``(token, stable token, portable)`` for the ops ``names``: the tokens cover every field of each
    definition, the first with the identities of its functions and objects (a key of this process), the
    second without (a key for the disk); ``portable`` when each op is defined in the package and holds
    the very objects it was registered with (then the stamp covers its code)."""
    from ..op.registry import get_op, unchanged_since_registered

    tokens, stable, portable = [], [], True
    for name in sorted(set(names)):
        opdef = get_op(name)
        token = _token(opdef, True)
        portable = portable and unchanged_since_registered(name) and opdef.defined_in.startswith("tensorvm.")
        tokens.append(f"{name}:{token}")
        stable.append(f"{name}:{_token(opdef, False)}")
    return "\n".join(tokens), "\n".join(stable), portable


def primitive_ops(prim) -> list:
    """The names of the ops ``prim`` calls."""
    from ..ir.expr import Call, Op
    from ..transform.to_anf import post_order_iter

    return [n.op.name for n in post_order_iter(prim.body) if isinstance(n, Call) and isinstance(n.op, Op)]


def primitive_signature(prim) -> bytes:
    """The Relay text of ``prim`` followed by the dtype, shape and bytes of each constant in it."""
    import numpy as np

    from ..ir.expr import Constant, GlobalVar
    from ..ir.module import IRModule
    from ..ir.printer import module_to_str
    from ..transform.to_anf import post_order_iter

    digest = hashlib.sha256(module_to_str(IRModule({GlobalVar("f"): prim})).encode())
    for node in post_order_iter(prim.body):
        if isinstance(node, Constant):
            data = np.ascontiguousarray(node.data)
            digest.update(f"\0{data.dtype.str}{data.shape}\0".encode())
            digest.update(data.tobytes())
    return digest.digest()


def kernel_key(signature: bytes, c_name: str, settings: str, kind: str = "kernel") -> str:
    """The key of the kernel named ``c_name`` made of a primitive with ``signature`` under ``settings``."""
    digest = hashlib.sha256(f"{kind}\0{generator_stamp()}\0{settings}\0{c_name}\0".encode())
    digest.update(signature)
    return digest.hexdigest()


class PlanMemo:
    """A bounded (least recently used first out), thread-safe map ``key -> what lowering made``."""

    def __init__(self, capacity: int = 1024):
        self.capacity = capacity
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str):
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return value

    def contains(self, key: str) -> bool:
        with self._lock:
            return key in self._items

    def put(self, key: str, value) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._items)


PLANS = PlanMemo()
