"""The converter registry and the building context that ONNX converters write IR with.

A converter is one function per ``(op_type, since_version)``, registered with ``@converter``; the
importer calls the one with the largest version not above the model's opset. Its parameters mirror
the ONNX node: the inputs positionally (``None`` for an omitted optional input), then the attributes
as keywords named exactly like the ONNX attributes, e.g.::

    @converter("Conv", 1, 11)
    def conv_1(ctx, X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
               pads=None, strides=None): ...

``ctx.call(op_name, *args, **attrs)`` builds a call of a registered op. It types the call at once
with the op's type relation (so converters can read ``ctx.type_of(x)``) and folds it when every
argument is a constant, which is how shape arithmetic on static dims disappears at import time.
Shape arithmetic on dynamic dims is tracked element by element (``shape_entries``): a ``Shape`` of a
``(?, 128)`` tensor is known to be ``[dim 0 of x, 128]``, so ``Gather(Shape(x), 1)`` folds to 128
and a ``Reshape`` to ``[dim 0 of x, 12, 64]`` becomes a static ``reshape`` with Relay's copy code 0.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import TensorVMError, TypeInferenceError, UnsupportedError
from ..ir.attrs import Attrs
from ..ir.expr import Call, Constant, Expr, If, Op, Tuple, TupleGetItem, Var
from ..ir.types import Any, SymDim, TensorType, TupleType, Type, TypeCall
from ..op.registry import get_op

__all__ = ["converter", "lookup_converter", "converter_versions", "DimOf", "BuildContext", "ONNX_DTYPES",
           "onnx_dtype"]

# op_type -> sorted [(since_version, function)]
_CONVERTERS: dict[str, list[tuple[int, Callable]]] = {}

# ONNX TensorProto element types that tensorvm can hold.
ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
               9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64"}
_ONNX_DTYPE_NAMES = {0: "undefined", 8: "string", 14: "complex64", 15: "complex128", 16: "bfloat16",
                     17: "float8e4m3fn", 18: "float8e4m3fnuz", 19: "float8e5m2", 20: "float8e5m2fnuz",
                     21: "uint4", 22: "int4", 23: "float4e2m1", 24: "float8e8m0", 25: "uint2", 26: "int2"}

# Folding at import time is skipped when it would create a constant much larger than its inputs.
_FOLD_LIMIT = 1 << 20
# A converter that writes a computation out at import time (a tap, a pivot, an index map per element)
# does so only up to this many elements: the count comes from dims a model file may declare at any size.
UNROLL_LIMIT = 1 << 20


def check_unrolled(op: str, count: int, what: str) -> None:
    """The project's error for a computation ``op`` would write out for ``count`` elements, too many."""
    if count > UNROLL_LIMIT:
        raise UnsupportedError(f"{op}: {what} is {count}; tensorvm writes at most {UNROLL_LIMIT} out at import")


def onnx_dtype(elem_type: int, what: str) -> str:
    """The tensorvm dtype of an ONNX element type; an unsupported one is an ``UnsupportedError``."""
    try:
        return ONNX_DTYPES[int(elem_type)]
    except KeyError:
        name = _ONNX_DTYPE_NAMES.get(int(elem_type), str(elem_type))
        raise UnsupportedError(f"{what}: ONNX element type {name} is not supported; tensorvm supports "
                               f"{', '.join(sorted(set(ONNX_DTYPES.values())))}") from None


def converter(op_type: str, *since_versions: int):
    """Register the decorated function as the converter of ``op_type`` from each given opset on."""

    def register(fn):
        table = _CONVERTERS.setdefault(op_type, [])
        for version in since_versions:
            if any(v == version for v, _ in table):
                raise ValueError(f"converter {op_type} version {version} is registered twice")
            table.append((version, fn))
        table.sort(key=lambda item: item[0])
        return fn

    return register


def lookup_converter(op_type: str, opset: int) -> Callable | None:
    """The converter with the largest since_version <= ``opset``, or None."""
    best = None
    for version, fn in _CONVERTERS.get(op_type, ()):
        if version <= opset:
            best = fn
    return best


def converter_versions() -> dict[str, list[int]]:
    return {op: [v for v, _ in table] for op, table in sorted(_CONVERTERS.items())}


def converter_parameters(fn: Callable) -> tuple[int, int | None, set]:
    """(required inputs, max inputs or None for variadic, keyword attribute names) of a converter."""
    cached = getattr(fn, "_onnx_params", None)
    if cached is not None:
        return cached
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())[1:]  # skip ctx
    required, maximum, keywords = 0, 0, set()
    for p in params:
        if p.kind == p.POSITIONAL_OR_KEYWORD or p.kind == p.POSITIONAL_ONLY:
            maximum += 1
            if p.default is p.empty:
                required += 1
        elif p.kind == p.VAR_POSITIONAL:
            maximum = None
        elif p.kind == p.KEYWORD_ONLY:
            keywords.add(p.name)
    result = (required, maximum, keywords)
    fn._onnx_params = result
    return result


@dataclass(frozen=True)
class DimOf:
    """An element of a shape value that is ``tensor.shape[axis]`` at run time (the dim is not static)."""

    tensor: Expr
    axis: int
    dim: object  # the tensor's typed dim: Any or SymDim


class BuildContext:
    """Builds typed IR for one graph; knows constant values and partially known shape values."""

    def __init__(self, opset: int, param_values: dict | None = None):
        self.opset = opset
        # Values of parameter Vars (freeze_params=False): read for structural inputs only.
        self.param_values: dict[Var, np.ndarray] = param_values if param_values is not None else {}
        self._entries: dict[int, tuple[Expr, list]] = {}

    # ---- types and values -----------------------------------------------------------------------
    def type_of(self, expr: Expr) -> Type:
        ty = getattr(expr, "_checked_type", None)
        if ty is not None:
            return ty
        if isinstance(expr, Constant):
            return expr.with_type(expr.type).checked_type
        if isinstance(expr, Var) and expr.type_annotation is not None:
            return expr.with_type(expr.type_annotation).checked_type
        if isinstance(expr, Tuple):
            return expr.with_type(TupleType(tuple(self.type_of(f) for f in expr.fields))).checked_type
        if isinstance(expr, TupleGetItem):
            return expr.with_type(self.type_of(expr.tuple_value).fields[expr.index]).checked_type
        raise TypeInferenceError(f"the ONNX importer does not know the type of {type(expr).__name__}")

    def tensor_type(self, expr: Expr, what: str = "input") -> TensorType:
        ty = self.type_of(expr)
        if not isinstance(ty, TensorType):
            raise TypeInferenceError(f"expected a tensor {what}, got a value of type {ty!r}")
        return ty

    def dtype(self, expr: Expr) -> str:
        return self.tensor_type(expr).dtype

    def shape(self, expr: Expr) -> tuple:
        return tuple(self.tensor_type(expr).shape)

    def ndim(self, expr: Expr) -> int:
        return len(self.tensor_type(expr).shape)

    def value(self, expr: Expr | None) -> np.ndarray | None:
        """The value of a constant (or of a frozen parameter), else None."""
        if isinstance(expr, Constant):
            return expr.data
        if isinstance(expr, Var) and expr in self.param_values:
            return self.param_values[expr]
        return None

    def int_list(self, expr: Expr | None) -> list[int] | None:
        """A 0-d or 1-d integer value as a list of ints when every element is known, else None."""
        if expr is None:
            return None
        entries = self.shape_entries(expr)
        if entries is not None and all(isinstance(e, int) for e in entries):
            return list(entries)
        return None

    def require_ints(self, expr: Expr, what: str) -> list[int]:
        values = self.int_list(expr)
        if values is None:
            raise UnsupportedError(f"{what} must be known when the model is imported (a constant or a static "
                                   f"shape), but it is computed at run time")
        return values

    def scalar_value(self, expr: Expr | None):
        value = self.value(expr)
        if value is None or value.size != 1:
            return None
        return value.reshape(()).item()

    # ---- shape values tracked element by element -------------------------------------------------
    def shape_entries(self, expr: Expr) -> list | None:
        """A 0-d/1-d integer tensor's elements: ints where known, ``DimOf`` for dynamic dims."""
        value = self.value(expr)
        if value is not None:
            if value.ndim <= 1 and np.issubdtype(value.dtype, np.integer):
                return [int(v) for v in value.reshape(-1)]
            return None
        found = self._entries.get(id(expr))
        if found is not None and found[0] is expr:
            return list(found[1])
        return None

    def with_entries(self, expr: Expr, entries: list) -> Expr:
        """Record the (partially known) elements of the 1-d int ``expr``; fold it if all are known."""
        if all(isinstance(e, int) for e in entries):
            ty = self.tensor_type(expr)
            data = np.array(entries, dtype=ty.dtype).reshape([len(entries)] if ty.ndim else [])
            return self.constant(data)
        self._entries[id(expr)] = (expr, list(entries))
        return expr

    # ---- building ---------------------------------------------------------------------------------
    def constant(self, value, dtype: str | None = None) -> Constant:
        data = np.asarray(value, dtype=dtype) if dtype is not None else np.asarray(value)
        c = Constant(data)
        c.with_type(c.type)
        return c

    def call(self, op_name: str, *args: Expr, fold: bool = True, **attrs) -> Expr:
        """A typed call of a registered op (folded to a constant when every argument is constant)."""
        opdef = get_op(op_name)
        if opdef.num_inputs >= 0 and len(args) != opdef.num_inputs:
            raise TypeInferenceError(f"{op_name} takes {opdef.num_inputs} argument(s), got {len(args)}")
        norm = opdef.normalize_attrs(Attrs(attrs))
        arg_types = [self.type_of(a) for a in args]
        consts = [a.data if isinstance(a, Constant) else None for a in args]
        out_type = opdef.type_rel(arg_types, norm, consts)
        node = Call(Op(op_name), tuple(args), Attrs(attrs))
        node.with_type(out_type)
        if fold and all(isinstance(a, Constant) for a in args) and _small_enough(out_type, args):
            folded = self._fold(opdef, norm, args, out_type)
            if folded is not None:
                return folded
        return node

    def _fold(self, opdef, attrs, args, out_type) -> Expr | None:
        try:
            result = opdef.kernel(attrs, *[a.data for a in args])
        except TensorVMError:
            return None  # leave it to run time, where the error names the call
        if isinstance(out_type, TupleType):
            if not isinstance(result, (tuple, list)) or len(result) != len(out_type.fields):
                return None
            fields = [self._fold_value(r, t) for r, t in zip(result, out_type.fields, strict=True)]
            if any(f is None for f in fields):
                return None
            return self.tuple(fields)
        return self._fold_value(result, out_type)

    def _fold_value(self, result, ty) -> Constant | None:
        if not isinstance(ty, TensorType):
            return None
        data = np.asarray(result)
        if data.dtype.name != ty.dtype:
            data = data.astype(ty.dtype)
        if data.ndim != ty.ndim:
            return None
        return self.constant(data)

    def tuple(self, fields) -> Tuple:
        node = Tuple(tuple(fields))
        self.type_of(node)
        return node

    def get_item(self, value: Expr, index: int) -> Expr:
        if isinstance(value, Tuple):
            return value.fields[index]
        node = TupleGetItem(value, index)
        self.type_of(node)
        return node

    def if_(self, cond: Expr, then_expr: Expr, else_expr: Expr) -> Expr:
        node = If(cond, then_expr, else_expr)
        node.with_type(join_types(self.type_of(then_expr), self.type_of(else_expr)))
        return node

    # ---- frequently used shortcuts ---------------------------------------------------------------
    def cast(self, x: Expr, dtype: str) -> Expr:
        return x if self.dtype(x) == dtype else self.call("cast", x, dtype=dtype)

    def shape_of(self, x: Expr, dtype: str = "int64") -> Expr:
        """``shape_of(x)`` with its elements tracked (folded when x's shape is static)."""
        shape = self.shape(x)
        entries = [d if isinstance(d, int) else DimOf(x, i, d) for i, d in enumerate(shape)]
        if all(isinstance(e, int) for e in entries):
            return self.constant(np.array(entries, dtype=dtype))
        return self.with_entries(self.call("shape_of", x, dtype=dtype), entries)

    def indices(self, count: Expr) -> Expr:
        """0, 1, ..., count - 1 as int64 (``count``: an int64 scalar, a constant or a run-time value)."""
        zero, one = (self.constant(np.array(v, np.int64)) for v in (0, 1))
        return self.call("arange", zero, count, one, dtype="int64")

    def divisor(self, x: Expr) -> Expr:
        """x with its zeros replaced by ones: a divisor that raises no 0 / 0 (the caller gives those
        elements their value)."""
        zero, one = (self.constant(np.array(v, self.dtype(x))) for v in (0, 1))
        return self.call("where", self.call("equal", x, zero), one, x)

    def dim_value(self, x: Expr, axis: int, dtype: str = "int64") -> Expr:
        """x.shape[axis] as a 0-d tensor (a constant when static)."""
        shape = self.shape(x)
        if isinstance(shape[axis], int):
            return self.constant(np.array(shape[axis], dtype=dtype))
        taken = self.call("take", self.shape_of(x, dtype), self.constant(np.array(axis, "int64")), axis=0)
        return self.with_entries(taken, [DimOf(x, axis, shape[axis])])

    def shape_vector(self, entries: list, dtype: str = "int64") -> Expr:
        """A 1-d tensor from elements that are ints, ``DimOf`` or 0-d/1-d int exprs."""
        if all(isinstance(e, int) for e in entries):
            return self.constant(np.array(entries, dtype=dtype).reshape(len(entries)))
        pieces, tracked, run = [], [], []
        for e in entries:
            if isinstance(e, int):
                run.append(e)
                tracked.append(e)
                continue
            if run:
                pieces.append(self.constant(np.array(run, dtype=dtype)))
                run = []
            if isinstance(e, DimOf):
                piece = self.call("expand_dims", self.cast(self.dim_value(e.tensor, e.axis, dtype), dtype), axis=0)
                tracked.append(e)
            else:
                piece = self.cast(e, dtype)
                if self.ndim(piece) == 0:
                    piece = self.call("expand_dims", piece, axis=0)
                sub = self.shape_entries(e)
                tracked.extend(sub if sub is not None else [None] * _static_len(self, piece))
            pieces.append(piece)
        if run:
            pieces.append(self.constant(np.array(run, dtype=dtype)))
        out = pieces[0] if len(pieces) == 1 else self.call("concatenate", self.tuple(pieces), axis=0)
        if any(t is None for t in tracked):
            return out
        return self.with_entries(out, tracked)

    def expand_to_rank(self, x: Expr, ndim: int) -> Expr:
        """Prepend unit dims so that x has rank ``ndim`` (NumPy broadcasting alignment)."""
        missing = ndim - self.ndim(x)
        if missing <= 0:
            return x
        return self.call("expand_dims", x, axis=0, num_newaxis=missing)

    # ---- which outputs of the node being converted the model reads ---------------------------------
    def outputs_used(self, op_type: str, inputs: list) -> list[bool] | None:
        """Per output of the node being converted: does the model read it (as any node's input, in any
        graph, or as a graph output)? None when that cannot be told (then build every output).

        For converters whose outputs cost work of their own (an LSTM's ``Y``). ``inputs`` are the
        converter's inputs in ONNX order (``None`` for an omitted one). The node is ``self.node`` when
        the importer sets it; otherwise it is found as the not yet converted node of ``op_type`` whose
        inputs are exactly these expressions (several such nodes: an output counts as read if any of
        theirs is)."""
        importer = getattr(self, "importer", None)
        if importer is None:
            return None
        node = getattr(self, "node", None)
        candidates = [node] if node is not None and node.op_type == op_type else \
            self._unconverted_nodes(op_type, inputs, importer.model.graph)
        if not candidates or len({len(n.output) for n in candidates}) != 1:
            return None
        read = self._read_names(importer.model)
        return [any(n.output[i] and n.output[i] in read for n in candidates)
                for i in range(len(candidates[0].output))]

    def _read_names(self, model) -> frozenset:
        cached = getattr(self, "_read_names_cache", None)
        if cached is not None and cached[0] is model:
            return cached[1]
        names: set[str] = set()
        for graph in _all_graphs(model.graph):
            names.update(out.name for out in graph.output)
            for node in graph.node:
                names.update(node.input)
        result = frozenset(names)
        self._read_names_cache = (model, result)
        return result

    def _unconverted_nodes(self, op_type: str, inputs: list, root) -> list:
        inputs = list(inputs)
        while inputs and inputs[-1] is None:
            inputs.pop()
        scope = getattr(self, "scope", None)
        found = []
        for graph in _all_graphs(root):
            for node in graph.node:
                if node.op_type != op_type:
                    continue
                names = list(node.input)
                while names and not names[-1]:
                    names.pop()
                if len(names) != len(inputs):
                    continue
                if not all((value is None) if not name else _peek(scope, name) is value
                           for name, value in zip(names, inputs, strict=True)):
                    continue
                if any(name and _peek(scope, name) is not _MISSING for name in node.output):
                    continue  # already converted
                found.append(node)
        return found


_MISSING = object()


def _peek(scope, name: str):
    """The value ``name`` has in ``scope`` (or an enclosing scope), without capturing it; else _MISSING."""
    while scope is not None:
        if name in scope.values:
            return scope.values[name]
        if name in scope.captured:
            return scope.captured[name][0]
        scope = scope.parent
    return _MISSING


def _all_graphs(graph):
    """``graph`` and every subgraph in it (attributes of type GRAPH / GRAPHS), depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _all_graphs(attr.g)
            for sub in attr.graphs:
                yield from _all_graphs(sub)


def _static_len(ctx: BuildContext, vec: Expr) -> int:
    (length,) = ctx.shape(vec)
    return length if isinstance(length, int) else 0


def _small_enough(out_type, args) -> bool:
    inputs = sum(a.data.size for a in args)
    types = out_type.fields if isinstance(out_type, TupleType) else (out_type,)
    total = 0
    for ty in types:
        if not isinstance(ty, TensorType) or not all(isinstance(d, int) for d in ty.shape):
            return True  # unknown size (data-dependent): the kernel decides; such results are small here
        total += int(np.prod(ty.shape, dtype=np.int64))
    return total <= max(_FOLD_LIMIT, 4 * inputs)


def join_dims(a, b):
    return a if a == b else Any()


def join_types(a: Type, b: Type) -> Type:
    """The type of a value that is either ``a`` or ``b`` (if-branches): differing dims become ``Any``."""
    if isinstance(a, TensorType) and isinstance(b, TensorType):
        if a.dtype != b.dtype or a.ndim != b.ndim:
            raise TypeInferenceError(f"the two branches produce different types: {a!r} and {b!r}")
        return TensorType(tuple(join_dims(x, y) for x, y in zip(a.shape, b.shape, strict=True)), a.dtype)
    if isinstance(a, TupleType) and isinstance(b, TupleType) and len(a.fields) == len(b.fields):
        return TupleType(tuple(join_types(x, y) for x, y in zip(a.fields, b.fields, strict=True)))
    if isinstance(a, TypeCall) and isinstance(b, TypeCall) and a.func == b.func and len(a.args) == len(b.args):
        return TypeCall(a.func, tuple(join_types(x, y) for x, y in zip(a.args, b.args, strict=True)))
    if a == b:
        return a
    raise TypeInferenceError(f"the two branches produce different types: {a!r} and {b!r}")


def generalize(ty: Type) -> Type:
    """``ty`` with every symbolic dim replaced by ``Any`` (for loop-carried values)."""
    if isinstance(ty, TensorType):
        return TensorType(tuple(Any() if isinstance(d, SymDim) else d for d in ty.shape), ty.dtype)
    if isinstance(ty, TupleType):
        return TupleType(tuple(generalize(f) for f in ty.fields))
    return ty
