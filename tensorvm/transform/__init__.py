"""Passes, one per file; each file's docstring states the invariant that holds after it.

Every public name of every module in this package is reachable as ``tensorvm.transform.<name>``
(e.g. ``InferType``), loaded on first use.
"""

from __future__ import annotations

import importlib
import pkgutil

from .pass_infra import FunctionPass, ModulePass, Pass, Sequential, function_pass, module_pass  # noqa: F401


def __getattr__(name: str):
    if name.startswith("_"):
        raise AttributeError(name)
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            globals()[name] = value
            return value
    raise AttributeError(f"module tensorvm.transform has no pass or attribute {name!r}")
