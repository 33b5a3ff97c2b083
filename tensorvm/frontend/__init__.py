"""Importers of models from other frameworks: ONNX (``from_onnx``).

    mod, params = tv.frontend.from_onnx("model.onnx", shape={"input": [tv.Any(), 3, 224, 224]})
    exe = tv.vm.compile(mod, target="python", params=params)
"""

from __future__ import annotations

from .onnx_importer import from_onnx, onnx_param_names, unsupported_ops  # noqa: F401

__all__ = ["from_onnx", "onnx_param_names", "unsupported_ops"]
