"""What the importer tests of single ONNX ops share: a checked one-graph model, and its tensorvm VMs in
both exec modes (one executable each, called over several shapes)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

import tensorvm as tv

EXEC_MODES = ("bytecode", "native")


def onnx_model(nodes, inputs, outputs, inits=(), opset: int = 13, ir_version: int = 8):
    """``nodes`` as a model (opset ``opset`` of the default domain), checked by ONNX's checker."""
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    onnx.checker.check_model(model)
    return model


def tensorvm_runs(model):
    """(exec mode, run) for each exec mode of target c: ``run(*inputs)`` -> the outputs as NumPy arrays."""
    mod, params = tv.frontend.from_onnx(model)
    for mode in EXEC_MODES:
        vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params, exec_mode=mode))

        def run(*inputs, vm=vm):
            result = vm.invoke("main", *inputs)
            results = [result] if hasattr(result, "numpy") else list(result)
            return [np.asarray(r.numpy()) for r in results]

        yield mode, run
