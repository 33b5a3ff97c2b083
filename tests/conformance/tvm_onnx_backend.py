"""The tensorvm backend for ONNX's backend test suite, and the test selection shared by
``test_onnx_backend.py`` and ``report.py``.

``prepare`` imports the model with ``tv.frontend.from_onnx`` (the importer's defaults, float32 accumulation
included: what users get) and compiles it for the VM on target "c", the generated C kernels users run
(``TENSORVM_ONNX_TARGET=python`` selects the NumPy kernels instead); ``run`` invokes ``main``. The kernel
cache (``~/.cache/tensorvm``) serves every case whose C library an earlier case or run already built. A model that uses an op without a converter, or a
dtype tensorvm does not have (strings, bfloat16, float8, sequences...), is *skipped* with the reason
(``unittest.SkipTest``), never reported as a pass.
"""

from __future__ import annotations

import functools
import os
import tempfile
import unittest

import numpy as np

onnx = __import__("onnx")
from onnx.backend.base import Backend, BackendRep  # noqa: E402
from onnx.backend.test import runner as onnx_runner  # noqa: E402
from onnx.backend.test.loader import load_model_tests as _load_model_tests  # noqa: E402

import tensorvm as tv  # noqa: E402
from tensorvm.errors import UnsupportedError  # noqa: E402
from tensorvm.frontend import from_onnx, unsupported_ops  # noqa: E402
from tensorvm.frontend.onnx_context import ONNX_DTYPES  # noqa: E402
from tensorvm.prelude import make_list, make_none, make_some, to_python_list  # noqa: E402
from tensorvm.runtime import ADT  # noqa: E402

# The core op set.
CORE_OPS = frozenset("""
Add Sub Mul Div Pow Neg Abs Sqrt Reciprocal Exp Log Erf Tanh Sigmoid Relu LeakyRelu Elu Gelu HardSigmoid
HardSwish Softplus PRelu Clip Min Max Sum Mean Floor Ceil Round Sign Mod Sin Cos Equal Less LessOrEqual Greater
GreaterOrEqual Not And Or Where IsNaN IsInf MatMul Gemm Einsum Softmax LogSoftmax LayerNormalization
BatchNormalization InstanceNormalization GroupNormalization LRN Dropout Identity Conv ConvTranspose MaxPool
AveragePool GlobalAveragePool GlobalMaxPool Resize DepthToSpace SpaceToDepth LSTM GRU RNN Attention
RotaryEmbedding RMSNormalization Trilu CumSum Shape Size Reshape Flatten Squeeze Unsqueeze Transpose Concat Split
Slice Gather GatherElements GatherND ScatterElements ScatterND Expand Tile Pad Range ConstantOfShape Constant Cast
CastLike OneHot ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL2 ReduceSumSquare ReduceLogSumExp
ArgMax ArgMin NonMaxSuppression TopK NonZero RoiAlign Compress Unique If Loop Scan
QuantizeLinear DequantizeLinear DynamicQuantizeLinear MatMulInteger ConvInteger QLinearMatMul QLinearConv
LpNormalization ReverseSequence Swish SwiGLU CumProd HannWindow HammingWindow BlackmanWindow CenterCropPad TensorScatter
NegativeLogLikelihoodLoss SoftmaxCrossEntropyLoss DFT STFT MaxUnpool AffineGrid Optional OptionalHasElement
OptionalGetElement MelWeightMatrix Det SequenceEmpty SequenceConstruct SequenceInsert SequenceErase SequenceAt
SequenceLength SplitToSequence ConcatFromSequence SequenceMap CausalConvWithState LinearAttention Col2Im DeformConv
MaxRoiPool BitCast
""".split())

TARGET = os.environ.get("TENSORVM_ONNX_TARGET", "c")

# The dtypes of the goal ("direct node tests with float32/int32/int64/bool I/O").
GOAL_ELEM_TYPES = frozenset({1, 6, 7, 9})

# The real-model tests write their inputs under $ONNX_HOME: keep that out of the home directory.
os.environ.setdefault("ONNX_HOME", os.path.join(tempfile.gettempdir(), "tensorvm-onnx-home"))


@functools.cache
def cached_tests(kind: str):
    """``load_model_tests(kind)`` once per process (building the node cases takes seconds)."""
    return _load_model_tests(kind=kind)


def _cached_loader(data_dir=None, kind=None, test_kwargs=None):
    if data_dir is None and test_kwargs is None and kind is not None:
        return cached_tests(kind)
    return _load_model_tests(data_dir=data_dir, kind=kind, test_kwargs=test_kwargs)


# BackendTest loads every kind; let it reuse the cached cases.
onnx_runner.load_model_tests = _cached_loader


def _graph_ops(graph) -> set:
    ops = set()
    for node in graph.node:
        ops.add(node.op_type)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                ops |= _graph_ops(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    ops |= _graph_ops(g)
    return ops


def _io_elem_types(model) -> list:
    out = []
    for v in list(model.graph.input) + list(model.graph.output):
        out.append(v.type.tensor_type.elem_type if v.type.HasField("tensor_type") else -1)
    return out


def node_test_info() -> dict:
    """name -> {op, expanded, goal} for every node test whose op is a core op.

    ``op`` is the op under test: the single node of a direct test (or, for a multi-node direct
    test, its core op), and for ``_expanded`` tests the op of the test they expand."""
    cases = {t.name: t for t in cached_tests("node")}
    info = {}
    for name, case in cases.items():
        if case.model is None:
            continue
        expanded = "_expanded" in name
        if expanded:
            base = cases.get(name.split("_expanded")[0])
            if base is None or base.model is None:
                continue
            ops = [n.op_type for n in base.model.graph.node]
        else:
            ops = [n.op_type for n in case.model.graph.node]
        core = [op for op in ops if op in CORE_OPS]
        if not core:
            continue
        op = ops[0] if ops[0] in CORE_OPS else core[0]
        goal = (not expanded) and all(t in GOAL_ELEM_TYPES for t in _io_elem_types(case.model))
        info[name] = {"op": op, "expanded": expanded, "goal": goal}
    return info


def model_test_ops(kind: str) -> dict:
    """name -> sorted op types, for the file-based model tests of ``kind``."""
    out = {}
    for case in cached_tests(kind):
        if case.model_dir:
            model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
            out[case.name] = sorted(_graph_ops(model.graph))
        else:
            out[case.name] = ["(real model)"]
    return out


def _unsupported_type(proto, name: str) -> str | None:
    """Why a graph input or output of this TypeProto cannot be given to or read from tensorvm, or None:
    tensors, sequences of tensors of a known rank (tuples or prelude Lists) and optionals of either."""
    kind = proto.WhichOneof("value")
    if kind == "optional_type":
        return _unsupported_type(proto.optional_type.elem_type, name)
    if kind == "sequence_type":
        elem = proto.sequence_type.elem_type
        if not elem.HasField("tensor_type"):
            return f"{name!r} is a sequence of {elem.WhichOneof('value')}"
        if not elem.tensor_type.HasField("shape"):  # (an input's rank comes from the data: _unknown_ranks)
            return _unsupported_type(onnx.helper.make_tensor_type_proto(elem.tensor_type.elem_type, []), name)
        return _unsupported_type(elem, name)
    if kind != "tensor_type":
        return f"{name!r} is a {kind}, not a tensor"
    if proto.tensor_type.elem_type not in ONNX_DTYPES:
        return f"{name!r} has element type {onnx.TensorProto.DataType.Name(proto.tensor_type.elem_type)}"
    return None


def _unsupported_io(model) -> str | None:
    for v in list(model.graph.input) + list(model.graph.output):
        reason = _unsupported_type(v.type, v.name)
        if reason:
            return reason
    return None


def _to_vm(value, proto):
    """An input as the VM takes it: an optional as a prelude Option, a sequence as a prelude List."""
    kind = proto.WhichOneof("value")
    if kind == "optional_type":
        return make_none() if value is None else make_some(_to_vm(value, proto.optional_type.elem_type))
    if kind == "sequence_type":
        return make_list([np.asarray(t) for t in value])
    return np.asarray(value)


def _from_vm(value, proto):
    """An output as ONNX's runner reads it: None for an empty optional, a list of arrays for a sequence."""
    kind = proto.WhichOneof("value")
    if kind == "optional_type":
        return None if value.constructor == "None" else _from_vm(value.fields[0], proto.optional_type.elem_type)
    if isinstance(value, ADT):  # (a sequence whose length is known only at run time: a List)
        return [_from_vm(v, proto.sequence_type.elem_type) for v in to_python_list(value)]
    if isinstance(value, (list, tuple)):
        return [_from_vm(v, proto.sequence_type.elem_type) for v in value]
    return np.asarray(value.numpy() if hasattr(value, "numpy") else value)


def _unknown_ranks(graph) -> list:
    """Names of the graph inputs that are sequences of tensors of unknown rank."""
    return [v.name for v in graph.input if v.type.HasField("sequence_type")
            and v.type.sequence_type.elem_type.HasField("tensor_type")
            and not v.type.sequence_type.elem_type.tensor_type.HasField("shape")]


def _compile(model, shape=None):
    try:
        mod, params = from_onnx(model, shape=shape)
    except UnsupportedError as err:
        if "element type" in str(err) or "not supported; tensorvm supports" in str(err):
            raise unittest.SkipTest(str(err)) from None
        raise
    return tv.vm.compile(mod, target=TARGET, params=params)


class TensorVMRep(BackendRep):
    """``exe`` compiled, or None when a sequence input's rank is unknown: then the first run compiles it with
    that input's tensors' rank (every dim unknown) as a user would give it, ``from_onnx(shape=...)``."""

    def __init__(self, exe, model):
        self.model = model
        self.vm = None if exe is None else tv.vm.VirtualMachine(exe)
        initializers = {init.name for init in model.graph.initializer}
        self.names = [v.name for v in model.graph.input if v.name not in initializers]
        self.inputs = [v.type for v in model.graph.input if v.name not in initializers]
        self.outputs = [v.type for v in model.graph.output]

    def run(self, inputs, **kwargs):
        given = inputs if isinstance(inputs, (list, tuple)) else [inputs]
        if self.vm is None:
            shape, unknown = {}, set(_unknown_ranks(self.model.graph))
            for name, value in zip(self.names, given, strict=True):
                if name in unknown:
                    ranks = {np.ndim(t) for t in value}
                    if len(ranks) != 1:
                        raise unittest.SkipTest(f"input {name!r}: a sequence of tensors of ranks {sorted(ranks)}")
                    shape[name] = [None] * ranks.pop()
            self.vm = tv.vm.VirtualMachine(_compile(self.model, shape))
        out = self.vm.invoke("main", *[_to_vm(x, t) for x, t in zip(given, self.inputs, strict=True)])
        outs = list(out) if len(self.outputs) > 1 else [out]
        return [_from_vm(o, t) for o, t in zip(outs, self.outputs, strict=True)]


class TensorVMBackend(Backend):
    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs):
        missing = unsupported_ops(model)
        if missing:
            raise unittest.SkipTest("unsupported op(s): " + ", ".join(op for op, _ in missing))
        bad_io = _unsupported_io(model)
        if bad_io:
            raise unittest.SkipTest(f"unsupported input/output: {bad_io}")
        return TensorVMRep(None if _unknown_ranks(model.graph) else _compile(model), model)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"
