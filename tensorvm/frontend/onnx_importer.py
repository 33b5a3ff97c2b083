"""``from_onnx``: an ONNX model (a ``ModelProto`` or a path) to an ``IRModule`` and its parameters.

The graph becomes ``@main``: its inputs are parameters (named as ``main_param_names`` says) typed
from the model (``dim_param`` -> a named ``SymDim``, an unknown dim -> ``Any``; ``shape=``/``dtype=``
override them), its initializers are constants (``freeze_params=True``) or extra parameters whose
values are returned in ``params``, and each node goes through the converter registered for its op
type and the model's opset (``onnx_context.converter``). Subgraphs of ``If`` become branches of an
``if``; the bodies of ``Loop`` and ``Scan`` become recursive global functions (see ``onnx_control``).

Before converting anything the whole model (subgraphs included) is checked for ops without a
converter, so an unsupported model fails with one error that lists every such op and its nodes.

A malformed model is a ``ModelImportError`` (a ``FormatError``) naming the node and what was
expected vs what came: attributes are checked against the ONNX schema of the op (kinds, required
ones), inputs against the converter's arity, tensors' data against their declared shape (before
anything is allocated), subgraph nesting against ``MAX_GRAPH_NESTING``, and any other exception a
converter raises becomes a ``ModelImportError`` naming the node (the original is its ``__cause__``).
External data is read only for a model given as a path, and only from regular files inside the
model's directory (no absolute paths, ``..`` or symlinks leading out), within each file's size.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import numpy as np

from ..errors import FormatError, ModelImportError, TensorVMError, UnsupportedError
from ..ir.expr import Constant, Expr, Function, GlobalVar, Var
from ..ir.module import IRModule
from ..ir.types import Any, SymDim, TensorType, normalize_dtype
from .onnx_context import BuildContext, converter_parameters, lookup_converter, onnx_dtype
from .onnx_lists import in_order, list_type, option_type

__all__ = ["from_onnx", "onnx_param_names", "OnnxImporter", "unsupported_ops", "sanitize_name"]

_ONNX_DOMAINS = ("", "ai.onnx")

# If/Loop/Scan bodies nest; real models use a few levels. A deeper model is refused (the walks over
# subgraphs recurse once per level).
MAX_GRAPH_NESTING = 16


def _onnx():
    try:
        import onnx
    except ImportError:  # pragma: no cover - onnx is a test/bench extra
        raise UnsupportedError("the ONNX importer needs the 'onnx' package (pip install onnx)") from None
    return onnx


def sanitize_name(name: str, prefix: str = "v") -> str:
    """A name usable in the text format: letters, digits and underscores, not starting with a digit."""
    if not isinstance(name, str):  # (a protobuf string field that is not UTF-8: _check_text)
        _check_text([name], "name or symbolic dim")
    clean = re.sub(r"[^0-9A-Za-z_]", "_", name) or prefix
    if clean[0].isdigit():
        clean = f"{prefix}{clean}"
    return clean


def _unique_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base_1``, ``base_2``, ... if taken; the name returned is added to ``taken``."""
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def main_param_names(graph, freeze_params: bool = True) -> dict[str, str]:
    """ONNX name -> name of the ``@main`` parameter it becomes, for the graph's inputs (and, with
    ``freeze_params=False``, its initializers), in parameter order.

    A name valid in the text format (``[A-Za-z0-9_]+``, not starting with a digit) is kept, so a user's
    valid name always means that input. Any other is sanitized (``x.1`` -> ``x_1``) and, if that name is
    taken, suffixed (``x_1_1``) in graph order: parameters must stay distinct, as the VM, ``params`` and
    ``tensorvm run --input`` bind them by name."""
    initializers = list(dict.fromkeys(init.name for init in graph.initializer))
    inputs = [inp.name for inp in graph.input if inp.name not in set(initializers)]
    named = [(name, "v") for name in inputs] + ([] if freeze_params else [(name, "p") for name in initializers])
    taken = {name for name, prefix in named if sanitize_name(name, prefix) == name}
    return {name: name if name in taken else _unique_name(sanitize_name(name, prefix), taken)
            for name, prefix in named}


def onnx_param_names(model, freeze_params: bool = True) -> dict[str, str]:
    """What ``from_onnx(model, freeze_params=...)`` names the parameters of ``main``: ONNX input (and unfrozen
    initializer) name -> parameter name (the name for ``vm.run(name=...)``, ``params`` and ``tensorvm run
    --input name=...``), in parameter order. See ``main_param_names`` for the rule."""
    onnx_model, _ = _load_model(model)
    check_model(onnx_model)
    return main_param_names(onnx_model.graph, freeze_params)


def _load_model(model):
    """``(ModelProto, directory of its external data or None)``. External data is never loaded here:
    ``tensor_to_array`` reads it, checked, and only for a model given as a path."""
    onnx = _onnx()
    if isinstance(model, onnx.ModelProto):
        return model, None
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.exists(path):
            raise FormatError(f"from_onnx: no such file {path!r}")
        try:
            return onnx.load(path, load_external_data=False), os.path.dirname(os.path.abspath(path))
        except Exception as err:  # protobuf raises its own DecodeError
            raise FormatError(f"from_onnx: {path!r} is not a readable ONNX model: {err}") from None
    if isinstance(model, (bytes, bytearray)):
        try:
            return onnx.load_from_string(bytes(model)), None
        except Exception as err:
            raise FormatError(f"from_onnx: the bytes are not an ONNX model: {err}") from None
    raise TypeError(f"from_onnx expects an onnx.ModelProto, a path or bytes, got {type(model).__name__}")


def model_opset(model) -> int:
    for entry in model.opset_import:
        if entry.domain in _ONNX_DOMAINS:
            return int(entry.version)
    return 1


def check_model(model) -> None:
    """Model-level checks: a graph, a known opset, subgraphs nested at most ``MAX_GRAPH_NESTING`` deep."""
    onnx = _onnx()
    if not model.HasField("graph"):
        raise ModelImportError("the ONNX model has no graph")
    opset, newest = model_opset(model), onnx.defs.onnx_opset_version()
    if not 1 <= opset <= newest:
        raise ModelImportError(f"the ONNX model's opset is {opset}; expected 1 to {newest} (what onnx "
                               f"{onnx.__version__} knows)")
    _check_text([entry.domain for entry in model.opset_import], "an opset import's domain")
    pending = [(model.graph, 0)]
    while pending:
        graph, depth = pending.pop()
        _check_names(graph)
        for index, node in enumerate(graph.node):
            for sub in _subgraphs(node):
                if depth + 1 > MAX_GRAPH_NESTING:
                    raise ModelImportError(f"ONNX node {node.name or '#' + str(index)!r} ({node.op_type}): "
                                           f"subgraphs nest more than {MAX_GRAPH_NESTING} levels deep")
                pending.append((sub, depth + 1))


def _check_text(values, what: str) -> None:
    """protobuf hands a string field that is not UTF-8 over as bytes: a name must be text."""
    for value in values:
        if not isinstance(value, str):
            raise ModelImportError(f"the ONNX model's {what} is not UTF-8 text: {bytes(value)[:40]!r}")


def _check_names(graph) -> None:
    """The names a graph's values, nodes and attributes go by are text (``_check_text``)."""
    _check_text([graph.name], "graph name")
    for kind, values in (("graph input", graph.input), ("graph output", graph.output),
                         ("value_info", graph.value_info)):
        _check_text([v.name for v in values], f"{kind} name")
    _check_text([t.name for t in graph.initializer], "initializer name")
    for node in graph.node:
        _check_text([node.name, node.op_type, node.domain], "node name, op type or domain")
        _check_text(node.input, f"node {node.name!r} input name")
        _check_text(node.output, f"node {node.name!r} output name")
        _check_text([a.name for a in node.attribute], f"node {node.name!r} attribute name")


def _subgraphs(node):
    onnx = _onnx()
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def unsupported_ops(model) -> list[tuple[str, list[str]]]:
    """``[(op description, [node names])]`` for every node (subgraphs too) without a converter."""
    from . import onnx_converters  # noqa: F401 - registers the converters

    opset = model_opset(model)
    found: dict[str, list[str]] = {}

    def walk(graph):
        for index, node in enumerate(graph.node):
            if node.domain not in _ONNX_DOMAINS:
                key = f"{node.domain}.{node.op_type}"
            elif lookup_converter(node.op_type, opset) is None:
                key = node.op_type
            else:
                key = None
            if key is not None:
                found.setdefault(key, []).append(node.name or f"#{index}")
            for sub in _subgraphs(node):
                walk(sub)

    walk(model.graph)
    return list(found.items())


def _attribute_value(attr, base_dir=None):
    onnx = _onnx()

    kind = attr.type
    A = onnx.AttributeProto
    if kind == A.FLOAT:
        return float(attr.f)
    if kind == A.INT:
        return int(attr.i)
    if kind == A.STRING:
        return attr.s.decode("utf-8", errors="replace")
    if kind == A.TENSOR:
        return tensor_to_array(attr.t, base_dir)
    if kind == A.GRAPH:
        return attr.g
    if kind == A.FLOATS:
        return [float(v) for v in attr.floats]
    if kind == A.INTS:
        return [int(v) for v in attr.ints]
    if kind == A.STRINGS:
        return [s.decode("utf-8", errors="replace") for s in attr.strings]
    if kind == A.GRAPHS:
        return list(attr.graphs)
    if kind == A.TYPE_PROTO:
        return attr.tp
    if kind == A.SPARSE_TENSOR:
        raise UnsupportedError(f"attribute {attr.name}: sparse tensors are not supported")
    raise ModelImportError(f"attribute {attr.name}: expected a known attribute kind, got kind {kind}")


def value_type(proto, what: str):
    """The IR type of an ONNX TypeProto: a tensor (its rank must be known; dims not given are ``Any``), a
    sequence of tensors (a prelude ``List``) or an optional (a prelude ``Option``)."""
    kind = proto.WhichOneof("value")
    if kind == "tensor_type":
        tt = proto.tensor_type
        if not tt.HasField("shape"):
            raise UnsupportedError(f"{what}: a tensor of unknown rank")
        dims = tuple(int(d.dim_value) if d.HasField("dim_value") else Any() for d in tt.shape.dim)
        return TensorType(dims, onnx_dtype(tt.elem_type, what))
    if kind == "sequence_type":
        elem = value_type(proto.sequence_type.elem_type, what)
        if not isinstance(elem, TensorType):
            raise UnsupportedError(f"{what}: a sequence of {elem}; tensorvm's sequences hold tensors")
        return list_type(elem)
    if kind == "optional_type":
        return option_type(value_type(proto.optional_type.elem_type, what))
    raise UnsupportedError(f"{what}: a {kind} value is not supported")


_TYPED_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def tensor_to_array(tensor, base_dir=None) -> np.ndarray:
    """An initializer or Constant tensor as a NumPy array. Unsupported element types raise; the data
    must hold exactly the elements the dims declare (checked before anything is allocated)."""
    from onnx import TensorProto, numpy_helper

    what = f"tensor {tensor.name!r}"
    dtype = np.dtype(onnx_dtype(tensor.data_type, what))
    dims = [int(d) for d in tensor.dims]
    if any(d < 0 for d in dims):
        raise ModelImportError(f"{what}: expected non-negative dims, got {dims}")
    count = int(np.prod(dims, dtype=object)) if dims else 1
    if tensor.data_location == TensorProto.EXTERNAL:
        tensor = _with_external_data(tensor, base_dir, count * dtype.itemsize)
    elif tensor.HasField("raw_data"):
        if len(tensor.raw_data) != count * dtype.itemsize:
            raise ModelImportError(f"{what}: dims {dims} ({dtype.name}) need {count * dtype.itemsize} bytes of "
                                   f"data, got {len(tensor.raw_data)} bytes")
    else:
        held = sum(len(getattr(tensor, field)) for field in _TYPED_FIELDS)
        if held != count:
            raise ModelImportError(f"{what}: dims {dims} need {count} values, got {held}")
    try:
        array = numpy_helper.to_array(tensor)
    except Exception as err:
        raise ModelImportError(f"{what} cannot be read: {err}") from err
    return array if array.flags.c_contiguous else array.copy(order="C")


def _with_external_data(tensor, base_dir, nbytes: int):
    """A copy of ``tensor`` holding its external data as raw_data, read from a file inside ``base_dir``."""
    what = f"tensor {tensor.name!r}"
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location", "")
    if base_dir is None:
        raise ModelImportError(f"{what}: its data is external ({location!r}); external data is read only for "
                               f"a model given as a path, got the model as bytes or a ModelProto")
    root = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(root, location))
    if (not location or os.path.isabs(location) or ".." in re.split(r"[\\/]", location)
            or os.path.commonpath([root, path]) != root or not os.path.isfile(path)):
        raise ModelImportError(f"{what}: external data location {location!r}: expected a file inside the model's "
                               f"directory (no absolute path, '..' or symlink leading out)")
    size = os.path.getsize(path)
    try:
        offset = int(info.get("offset", "0"))
        length = int(info.get("length", str(size - offset)))
    except ValueError:
        raise ModelImportError(f"{what}: external data offset/length must be integers, got "
                               f"{info.get('offset')!r}/{info.get('length')!r}") from None
    if offset < 0 or length != nbytes or offset + length > size:
        raise ModelImportError(f"{what}: external data in {location!r}: expected {nbytes} bytes within the file's "
                               f"{size}, got offset {offset} and length {length}")
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    copy = type(tensor)()
    copy.CopyFrom(tensor)
    del copy.external_data[:]
    copy.data_location = type(tensor).DEFAULT
    copy.raw_data = data
    return copy


def _dim_from_override(value, input_name: str):
    if value is None or isinstance(value, Any) or value in ("?", -1):
        return Any()
    if isinstance(value, SymDim):
        return value
    if isinstance(value, str):
        return SymDim(sanitize_name(value, "d"))
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0:
        return int(value)
    raise TypeError(f"from_onnx: shape of input {input_name!r}: expected int, None, '?', a name or tv.Any(), "
                    f"got {value!r}")


def _check_attributes(node, opset: int) -> None:
    """The node's attributes against the op's ONNX schema: each of the kind it declares, required ones given."""
    onnx = _onnx()
    if node.domain not in _ONNX_DOMAINS:
        return
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
    except Exception:  # noqa: BLE001 - no schema (an op newer than onnx): the converter checks alone
        return
    kind_name = onnx.AttributeProto.AttributeType.Name
    given = set()
    for attr in node.attribute:
        given.add(attr.name)
        declared = schema.attributes.get(attr.name)
        if declared is not None and attr.type != declared.type:
            got = kind_name(attr.type) if attr.type in onnx.AttributeProto.AttributeType.values() else str(attr.type)
            raise ModelImportError(f"attribute {attr.name}: expected {kind_name(declared.type)}, got {got}")
    missing = sorted(name for name, declared in schema.attributes.items() if declared.required and name not in given)
    if missing:
        raise ModelImportError(f"expected the attribute(s) {', '.join(missing)}, got none")


def _required_keywords(fn) -> set:
    """The converter's keyword-only parameters without a default: attributes the node must have."""
    import inspect

    cached = getattr(fn, "_onnx_required", None)
    if cached is None:
        cached = {p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind == p.KEYWORD_ONLY and p.default is p.empty}
        fn._onnx_required = cached
    return cached


class Scope:
    """ONNX names visible in one graph. At a function boundary (a loop body) a name from an enclosing
    graph comes in as an extra parameter of the function (recorded in ``captured``)."""

    def __init__(self, importer: OnnxImporter, parent: Scope | None = None, boundary: bool = False):
        self.importer = importer
        self.parent = parent
        self.boundary = boundary
        self.values: dict[str, Expr] = {}
        self.captured: dict[str, tuple[Var, Expr]] = {}

    def lookup(self, name: str) -> Expr:
        if name in self.values:
            return self.values[name]
        if self.parent is None:
            raise ModelImportError(f"the ONNX graph uses the value {name!r} before it is defined; expected it to be "
                                   f"a graph input, an initializer or an earlier node's output")
        outer = self.parent.lookup(name)
        if not self.boundary or isinstance(outer, Constant):
            return outer
        if name not in self.captured:
            ty = self.importer.ctx.type_of(outer)
            self.captured[name] = (Var(sanitize_name(name), ty), outer)
        return self.captured[name][0]


class OnnxImporter:
    """Converts one model; holds the build context and the global functions made for loops."""

    def __init__(self, model, shape=None, dtype=None, freeze_params: bool = True, accumulate_dtype=None,
                 progress=None, base_dir=None):
        check_model(model)
        self.model = model
        self.base_dir = base_dir  # where external data may be read from (None: nowhere)
        self.opset = model_opset(model)
        self.shape_overrides = dict(shape or {})
        self.dtype_override = dtype
        self.freeze_params = freeze_params
        self.ctx = BuildContext(self.opset)
        self.ctx.importer = self
        self.ctx.accumulate_dtype = normalize_dtype(accumulate_dtype) if accumulate_dtype else None
        self.globals: dict[GlobalVar, Function] = {}
        self.type_defs: dict = {}  # ADTs the converters use (a Loop's scan outputs: the prelude's List)
        self.list_helpers: dict = {}  # (kind, type) -> the global function onnx_lists made for it
        self._global_names: set[str] = {"main"}
        self.params: dict[str, np.ndarray] = {}
        self.param_names = main_param_names(model.graph, freeze_params)  # ONNX name -> @main parameter name
        self.progress = progress  # progress(text) for long imports (the tensorvm command)

    # ---- names ---------------------------------------------------------------------------------
    def fresh_global(self, hint: str) -> GlobalVar:
        return GlobalVar(_unique_name(sanitize_name(hint, "g"), self._global_names))

    # ---- the model -------------------------------------------------------------------------------
    def run(self) -> tuple[IRModule, dict]:
        missing = unsupported_ops(self.model)
        if missing:
            listed = "; ".join(f"{op} (node{'s' if len(nodes) > 1 else ''} {', '.join(map(repr, nodes[:5]))}"
                               f"{', ...' if len(nodes) > 5 else ''})" for op, nodes in missing)
            raise UnsupportedError(f"the ONNX model (opset {self.opset}) uses {len(missing)} unsupported "
                                   f"op type(s): {listed}")
        graph = self.model.graph
        scope = Scope(self)
        params: list[Var] = []
        initializers = {init.name: init for init in graph.initializer}
        for inp in graph.input:
            if inp.name in initializers:
                continue
            var = Var(self.param_names[inp.name], self._input_type(inp))
            scope.values[inp.name] = in_order(self.ctx, var)  # (a List: newest first inside)
            params.append(var)
        unknown = set(self.shape_overrides) - {inp.name for inp in graph.input} - {v.name_hint for v in params}
        if unknown:
            raise TypeError(f"from_onnx: shape= names unknown inputs {sorted(unknown)}; the model's inputs are "
                            f"{[v.name_hint for v in params]}")
        for name, init in initializers.items():
            array = tensor_to_array(init, self.base_dir)
            if self.freeze_params:
                scope.values[name] = self.ctx.constant(array)
            else:
                var = Var(self.param_names[name], TensorType(array.shape, array.dtype.name))
                self.ctx.param_values[var] = array
                self.params[var.name_hint] = array
                scope.values[name] = var
                params.append(var)
        outputs = [in_order(self.ctx, out) for out in self.convert_graph(graph, scope)]
        body = outputs[0] if len(outputs) == 1 else self.ctx.tuple(outputs)
        main = Function(tuple(params), body)
        mod = IRModule()
        for tdef in self.type_defs.values():
            mod.add_type(tdef)
        for gv, fn in self.globals.items():
            mod.add(gv, fn)
        mod.add("main", main)
        return mod, dict(self.params)

    def _input_type(self, inp):
        seq = inp.type.sequence_type.elem_type if inp.type.HasField("sequence_type") else None
        if seq is not None and seq.HasField("tensor_type") and self._overridden(inp.name):
            # a sequence of tensors whose dims or dtype the caller gives (those of each tensor; ONNX often
            # leaves a sequence's rank unknown)
            return list_type(self._tensor_input_type(inp.name, seq.tensor_type, "each tensor of the sequence"))
        if seq is not None or inp.type.HasField("optional_type"):
            # a sequence is a prelude List of its tensors (in order at the boundary: onnx_lists.in_order), an
            # optional a prelude Option
            if seq is not None and seq.HasField("tensor_type") and not seq.tensor_type.HasField("shape"):
                raise UnsupportedError(f"graph input {inp.name!r} is a sequence of tensors of unknown rank; give "
                                       f"the dims of its tensors with shape={{{inp.name!r}: [...]}}")
            return value_type(inp.type, f"graph input {inp.name!r}")
        if not inp.type.HasField("tensor_type"):
            kind = inp.type.WhichOneof("value")
            raise UnsupportedError(f"graph input {inp.name!r}: tensor and sequence inputs are supported, got a "
                                   f"{kind}")
        return self._tensor_input_type(inp.name, inp.type.tensor_type, "the tensor")

    def _overridden(self, name: str) -> bool:
        keys = (name, self.param_names[name])
        override = self.dtype_override
        return (any(k in self.shape_overrides for k in keys)
                or (isinstance(override, Mapping) and any(k in override for k in keys)))

    def _tensor_input_type(self, name: str, tt, what: str) -> TensorType:
        """The type of input ``name``'s tensors (``tt``: their TensorTypeProto; ``what`` they are, for errors)
        with the caller's dtype and shape overrides."""
        dtype = onnx_dtype(tt.elem_type, f"graph input {name!r}")
        override = self.dtype_override
        if isinstance(override, Mapping):
            override = override.get(name, override.get(self.param_names[name]))
        if override is not None:
            dtype = normalize_dtype(override)
        key = name if name in self.shape_overrides else self.param_names[name]
        if key in self.shape_overrides:
            dims = tuple(_dim_from_override(d, name) for d in self.shape_overrides[key])
            return TensorType(dims, dtype)
        if not tt.HasField("shape"):
            raise UnsupportedError(f"graph input {name!r}: {what} has no shape (not even a rank); give one with "
                                   f"shape={{{name!r}: [...]}}")
        dims = []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and d.dim_value >= 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                dims.append(SymDim(sanitize_name(d.dim_param, "d")))
            else:
                dims.append(Any())
        return TensorType(tuple(dims), dtype)

    # ---- graphs ----------------------------------------------------------------------------------
    def convert_graph(self, graph, scope: Scope) -> list[Expr]:
        """Convert the nodes of ``graph`` into ``scope``; return its outputs' expressions."""
        for init in graph.initializer:
            if init.name not in scope.values:
                scope.values[init.name] = self.ctx.constant(tensor_to_array(init, self.base_dir))
        report = self.progress if scope.parent is None and self.progress is not None else None
        step = max(len(graph.node) // 10, 1)
        for index, node in enumerate(graph.node):
            self.convert_node(node, index, scope)
            if report is not None and (index + 1) % step == 0:
                report(f"converted {index + 1}/{len(graph.node)} nodes")
        return [scope.lookup(out.name) for out in graph.output]

    def convert_node(self, node, index: int, scope: Scope) -> None:
        label = f"ONNX node {node.name or '#' + str(index)!r} ({node.op_type})"
        fn = lookup_converter(node.op_type, self.opset)
        previous, previous_node = getattr(self.ctx, "scope", None), getattr(self.ctx, "node", None)
        self.ctx.scope, self.ctx.node = scope, node  # (node: for converters asking which outputs are read)
        try:
            inputs = [scope.lookup(name) if name else None for name in node.input]
            while inputs and inputs[-1] is None:
                inputs.pop()
            _check_attributes(node, self.opset)
            attrs = {a.name: _attribute_value(a, self.base_dir) for a in node.attribute}
            required, maximum, keywords = converter_parameters(fn)
            unknown = sorted(set(attrs) - keywords)
            if unknown:
                raise UnsupportedError(f"attribute(s) {', '.join(unknown)} not supported")
            missing = sorted(_required_keywords(fn) - set(attrs))
            if missing:
                raise ModelImportError(f"expected the attribute(s) {', '.join(missing)}, got none")
            if len(inputs) < required or (maximum is not None and len(inputs) > maximum):
                expected = f"{required}" if maximum == required else f"{required} to {maximum or 'any'}"
                raise ModelImportError(f"expected {expected} inputs, got {len(inputs)}")
            self.ctx.num_outputs = len(node.output)
            result = fn(self.ctx, *inputs, **attrs)
        except TensorVMError as err:
            raise type(err)(f"{label}: {err}") from err.__cause__  # (a converter failure's original, if any)
        except Exception as err:  # a converter tripped on a malformed node: say which node
            raise ModelImportError(f"{label}: expected a well-formed {node.op_type} node; converting it raised "
                                   f"{type(err).__name__}: {err}") from err
        finally:
            self.ctx.scope, self.ctx.node = previous, previous_node
        outputs = list(result) if isinstance(result, (list, tuple)) else [result]
        for i, name in enumerate(node.output):
            if not name:
                continue
            if i >= len(outputs) or outputs[i] is None:
                raise UnsupportedError(f"{label}: output {i} ({name!r}) is not supported")
            scope.values[name] = outputs[i]

    def import_branch(self, graph, scope: Scope, inputs: list | None = None) -> list[Expr]:
        """A subgraph that sees the enclosing values directly (an ``If`` branch; with ``inputs``, the
        expressions its graph inputs stand for: a ``SequenceMap`` body applied to one element)."""
        branch = Scope(self, scope)
        for inp, value in zip(graph.input, inputs or (), strict=inputs is not None):
            branch.values[inp.name] = value
        return self.convert_graph(graph, branch)

    def import_body(self, graph, scope: Scope, param_types: list) -> tuple[list[Var], list[Expr], dict]:
        """A subgraph that becomes a function body (a loop): its inputs become parameters of the given
        types, and enclosing values it uses are captured as extra parameters.

        Returns (params, outputs, captured {name: (Var, outer expr)})."""
        body_scope = Scope(self, scope, boundary=True)
        params = []
        for inp, ty in zip(graph.input, param_types, strict=True):
            var = Var(sanitize_name(inp.name), ty)
            body_scope.values[inp.name] = var
            params.append(var)
        outputs = self.convert_graph(graph, body_scope)
        return params, outputs, body_scope.captured


def from_onnx(model, shape: Mapping | None = None, dtype=None, freeze_params: bool = True,
              accumulate_dtype: str | None = None, progress=None):
    """Import an ONNX model: ``(IRModule, params)``.

    ``model`` is an ``onnx.ModelProto``, a path or the serialized bytes. ``shape`` maps input names to
    dims (ints; ``None``/``"?"``/``-1``/``tv.Any()`` for unknown; a string for a named symbolic dim),
    overriding the model's. ``dtype`` overrides the inputs' dtype (one name, or a dict per input).
    With ``freeze_params`` the initializers become constants and ``params`` is empty; otherwise they
    are parameters of ``main`` and ``params`` maps their names to values (pass it to
    ``tv.vm.compile(..., params=params)``). ``accumulate_dtype="float64"`` makes 2-d convolutions of
    float32 data accumulate in float64 (slower; results that do not depend on the BLAS blocking).
    ``progress(text)``, if given, is called with short status lines during a long import.

    ``main``'s parameters keep the ONNX names that are valid in the text format; another name is
    rewritten (``input.1`` -> ``input_1``, ``x.1`` -> ``x_1_1`` when an input ``x_1`` exists), so every
    parameter has its own name. ``onnx_param_names(model)`` gives the mapping, ONNX name -> parameter
    name: the name to pass to ``vm.run(name=...)`` or ``tensorvm run --input name=...``. ``shape`` and
    ``dtype`` take either name.
    """
    onnx_model, base_dir = _load_model(model)
    from . import onnx_converters  # noqa: F401 - registers the converters

    importer = OnnxImporter(onnx_model, shape=shape, dtype=dtype, freeze_params=freeze_params,
                            accumulate_dtype=accumulate_dtype, progress=progress, base_dir=base_dir)
    mod, params = importer.run()
    if progress is not None:
        progress("type checking")
    from ..transform.infer_type import infer_type

    try:
        mod = infer_type(mod)
    except TensorVMError as err:
        raise type(err)(f"from_onnx: the imported module does not type-check: {err}") from None
    return mod, params
