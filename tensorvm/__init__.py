"""tensorvm: a compiler and virtual machine for dynamic machine-learning programs.

    import tensorvm as tv
    mod = tv.parse('def @main(%x: Tensor[(?, 2), float32]) { add(%x, %x) }')
    tv.create_executor("debug", mod).evaluate()(np.ones((3, 2), "float32"))
"""

from __future__ import annotations

import importlib
import importlib.util

from .errors import (  # noqa: F401
    AttrError,
    ExecutionError,
    FormatError,
    ModelImportError,
    ParseError,
    ShapeError,
    TensorVMError,
    TypeInferenceError,
    UnsupportedError,
)

__version__ = "0.1.0"

# Everything but the errors is imported when first used (``import tensorvm`` stays light: a deployed
# executable loads with the runtime and the VM's loader only, docs/deploy.md).
_LAZY = {
    "ir": ("tensorvm.ir", None),
    "op": ("tensorvm.op", None),
    "Any": ("tensorvm.ir.types", "Any"),
    "SymDim": ("tensorvm.ir.types", "SymDim"),
    "TensorType": ("tensorvm.ir.types", "TensorType"),
    "TupleType": ("tensorvm.ir.types", "TupleType"),
    "IRModule": ("tensorvm.ir.module", "IRModule"),
    "parse": ("tensorvm.parser", "parse"),
    "transform": ("tensorvm.transform", None),
    "interpreter": ("tensorvm.interpreter", None),
    "create_executor": ("tensorvm.executor", "create_executor"),
    "runtime": ("tensorvm.runtime", None),
    "NDArray": ("tensorvm.runtime.ndarray", "NDArray"),
    "nd": ("tensorvm.runtime.ndarray", None),
    "ADT": ("tensorvm.runtime.object", "ADT"),
    "Closure": ("tensorvm.runtime.object", "Closure"),
    "vm": ("tensorvm.vm", None),
    "graph": ("tensorvm.graph", None),
    "aot": ("tensorvm.aot", None),
    "frontend": ("tensorvm.frontend", None),
    "te": ("tensorvm.te", None),
    "codegen": ("tensorvm.codegen", None),
    "set_num_threads": ("tensorvm.runtime.library", "set_num_threads"),
    "get_num_threads": ("tensorvm.runtime.library", "get_num_threads"),
    "prelude": ("tensorvm.prelude", None),
    "structural_equal": ("tensorvm.ir.structural", "structural_equal"),
    "structural_hash": ("tensorvm.ir.structural", "structural_hash"),
    "assert_structural_equal": ("tensorvm.ir.structural", "assert_structural_equal"),
}


# ``from tensorvm import *``: the errors and the names the package imported eagerly before it was lazy
__all__ = ["AttrError", "ExecutionError", "FormatError", "ModelImportError", "ParseError", "ShapeError",
           "TensorVMError", "TypeInferenceError", "UnsupportedError", "ir", "op", "Any", "IRModule", "SymDim",
           "TensorType", "TupleType"]


def __getattr__(name: str):
    if name in _LAZY:
        module_name, attr = _LAZY[name]
        module = importlib.import_module(module_name)
        value = module if attr is None else getattr(module, attr)
        globals()[name] = value
        return value
    return _submodule(name)


def _submodule(name: str):
    """A submodule used as an attribute (``tv.parser``), imported now."""
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
