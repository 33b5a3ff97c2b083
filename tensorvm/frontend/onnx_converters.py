"""Imports every module of ONNX converters, which registers them (``onnx_context.converter``)."""

from __future__ import annotations

from ..op import onnx_ops  # noqa: F401 - the ops the converters build
from . import (  # noqa: F401
    onnx_control,
    onnx_detection,
    onnx_elementwise,
    onnx_lists,
    onnx_nn,
    onnx_quantize,
    onnx_sequence,
    onnx_shape,
    onnx_signal,
    onnx_state,
)
