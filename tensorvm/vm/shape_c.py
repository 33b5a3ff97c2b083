"""C shape functions of fused primitives, traced from the ops' shape logic (target "c").

``emit_shape_func(prim, is_input, name)`` composes the shape logic of the primitive's ops over its body
the way ``kernel_python.build_shape_func_tuples`` composes their Python shape functions (same rules:
by-shape and by-data inputs, data read from parameters or constants, an op whose data inputs are
computed inside the group contributes its static type, every computed shape is checked against the
static dims of the op's type), but over symbolic dims (``tensorvm.op.shape_logic``): each op's logic
is traced once, its checks become C tests and its output dims C locals. The rank of every value is
static and attrs are constants, so the function is specialised for this primitive, like its kernel.

The C ABI (``codegen/lib/tv_shape.h``)::

    int32_t NAME(const int64_t* const* shapes, const void* const* data, int64_t* const* out);
    extern const char* const NAME_messages[];   /* message k for return code TV_SHAPE_ERROR_BASE + k */

``shapes[i]`` holds the dims of flat input ``i`` (a tuple-typed parameter contributes one per field),
``data[i]`` its data when the input is read by data (else NULL); ``out[j]`` receives the dims of flat
output ``j``. No Python is involved, so a native caller (issue 19's native mode) calls it directly.
A return code whose message index is in ``ShapeFuncC.deferred`` means "a case outside the traced form"
(``shape_logic.supported``, e.g. dyn.reshape's -2 read from data): the VM then runs the Python shape
function for that call; a native caller reports it as unsupported.

A primitive containing an op whose logic does not trace (``OpDef.shape_logic_traceable`` unset, or a
logic that branches on a symbolic dim) raises ``ShapeLogicTraceError``: the VM keeps the Python shape
function for it and ``exe.stats()`` lists it with the reason.
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError, TensorVMError, UnsupportedError
from ..ir.expr import Call, Constant, Function, Op, Tuple, TupleGetItem, Var
from ..ir.types import TensorType, TupleType
from ..op.registry import get_op
from ..op.shape_logic import (
    OVERFLOW_FLAG,
    Bin,
    CCall,
    DataArg,
    Leaf,
    Not,
    Select,
    ShapeLogicTraceError,
    Sym,
    c_expr,
    require,
    tracing,
)
from ..transform.fuse_ops import flatten_tensor_types
from ..transform.to_anf import known_type, post_order_iter
from .kernel_abi import ERROR_BASE, CShapeFunction, ShapeFuncC  # noqa: F401 - (moved there)
from .kernel_python import (
    _children_with_vars,
    _flat_count,
    _param_type,
    _prepare,
    _primitive_label,
    _shape_tree,
)

__all__ = ["ShapeFuncC", "emit_shape_func", "CShapeFunction", "SHAPE_LIBRARY"]

#: The library file every C shape function includes.
SHAPE_LIBRARY = "tv_shape.h"


def _flatten(tree) -> list:
    if isinstance(tree, list):
        return [s for t in tree for s in _flatten(t)]
    return [tree]


class _Emitter:
    def __init__(self):
        self.lines: list[str] = []
        self.messages: list[str] = []
        self.counter = 0
        self.calls: dict = {}
        self.deferred: set = set()  # message indices meaning "outside the traced form: ask the host"

    def hoist(self, value):
        """``value`` with each call of a C primitive (a pass over data) computed once, into a local, at
        its first use (after the checks before it, e.g. that a divisor is not zero)."""
        if isinstance(value, CCall):
            key = c_expr(value)
            if key not in self.calls:
                self.calls[key] = self._local(CCall(value.fn, tuple(self.hoist(a) for a in value.args), value.is_float))
            return self.calls[key]
        if isinstance(value, Bin):
            return Bin(value.op, self.hoist(value.a), self.hoist(value.b))
        if isinstance(value, Not):
            return Not(self.hoist(value.a))
        if isinstance(value, Select):
            return Select(self.hoist(value.cond), self.hoist(value.a), self.hoist(value.b))
        return value

    def check(self, cond, message: str, kind: str = "error"):
        if not isinstance(cond, Sym):
            if not cond:  # fails whatever the input: the Python shape function raises it at run time
                raise ShapeLogicTraceError(f"a check fails for every input: {message}")
            return
        cond = self.hoist(cond)
        if kind == "defer":
            self.deferred.add(len(self.messages))
        self.lines.append(f"  if (!{c_expr(cond)}) return TV_SHAPE_ERROR_BASE + {len(self.messages)};")
        self.messages.append(message)

    def bind(self, value):
        """A local holding ``value`` (a Sym), so later expressions refer to it instead of repeating it."""
        if not isinstance(value, Sym) or isinstance(value, Leaf):
            return value
        value = self.hoist(value)
        return value if isinstance(value, Leaf) else self._local(value)

    def _local(self, value) -> Leaf:
        self.counter += 1
        name = f"v{self.counter}"
        self.lines.append(f"  const {'double' if value.is_float else 'int64_t'} {name} = {c_expr(value)};")
        return Leaf(name, value.is_float)


def _param_entry(em: _Emitter, ty, by_data: bool, flat: list):
    """(shape tree, data tree or None) of a parameter whose flat inputs are ``flat`` (consumed). A dim
    static in the parameter's type is checked once on entry and is a constant from then on (so the
    ops' checks fold, and a logic needing a static dim, e.g. gather_nd's index depth, traces)."""
    if isinstance(ty, TupleType):
        parts = [_param_entry(em, f, by_data, flat) for f in ty.fields]
        return [p[0] for p in parts], ([p[1] for p in parts] if by_data else None)
    index = flat.pop(0)
    shape = []
    for axis, dim in enumerate(ty.shape):
        leaf = Leaf(f"shapes[{index}][{axis}]")
        if isinstance(dim, int):
            em.check(leaf == dim, f"input {index} does not have its type's dim {axis} = {dim} ({ty})")
            shape.append(dim)
        else:
            shape.append(leaf)
    shape = tuple(shape)
    return shape, (DataArg(shape, ty.dtype, pointer=f"data[{index}]") if by_data else None)


def _op_entry(em: _Emitter, node: Call, arg_entries: list):
    opdef = get_op(node.op)
    name = opdef.name
    ty = known_type(node)
    tensor_types = flatten_tensor_types(ty)
    static = all(isinstance(t, TensorType) and t.is_static for t in tensor_types)
    static_entry = (_shape_tree(ty, [tuple(t.shape) for t in tensor_types]), None) if static else None
    if opdef.shape_func is None:
        if static_entry is None:
            raise UnsupportedError(f"op {name} has no shape function, so it cannot have a dynamic output shape")
        return static_entry
    if opdef.shape_logic is None or not opdef.shape_logic_traceable:
        raise ShapeLogicTraceError(f"{name}: no traceable shape logic")
    args = []
    for j, (shape, data) in enumerate(arg_entries):
        if opdef.input_needs_data(j):
            if data is None:
                if static_entry is not None:
                    return static_entry
                raise UnsupportedError(f"{name}: its shape function needs the data of input {j}, which is not "
                                       f"available in this composed shape function")
            args.append(data)
        else:
            args.append(shape)
    attrs = opdef.normalize_attrs(node.attrs)
    with tracing(name) as trace:
        try:
            result = opdef.shape_logic(name, attrs, args, ShapeError)
        except ShapeLogicTraceError:
            raise
        except TensorVMError as err:
            raise ShapeLogicTraceError(f"{name}: its shape logic fails while tracing: {err}") from None
        except (TypeError, AttributeError, IndexError, ValueError) as err:
            raise ShapeLogicTraceError(f"{name}: its shape logic does not trace: {type(err).__name__}: {err}") \
                from None
    shapes = list(result) if isinstance(result, list) else [result]
    if len(shapes) != len(tensor_types):
        raise ShapeLogicTraceError(f"{name}: the logic gives {len(shapes)} shapes for type {ty}")
    for cond, message, kind in trace.requires:
        em.check(cond, message, kind)
    out = []
    for shape, tty in zip(shapes, tensor_types):
        shape = tuple(shape)
        if any(not isinstance(d, (int, np.integer, Sym)) or isinstance(d, bool) or (isinstance(d, Sym) and d.is_float)
               for d in shape):
            raise ShapeLogicTraceError(f"{name}: the logic gives the non-integer dims {shape}")
        if not isinstance(tty, TensorType) or len(shape) != tty.ndim:
            raise ShapeLogicTraceError(f"{name}: the logic gives rank {len(shape)} for type {tty}")
        shape = tuple(em.bind(d) if isinstance(d, Sym) else int(d) for d in shape)
        for d, s in zip(shape, tty.shape):
            if isinstance(s, int):
                with tracing(name) as static_trace:
                    require(d == s, f"{name}: the computed output shape does not match its type {tty}", ShapeError)
                for cond, message, kind in static_trace.requires:
                    em.check(cond, message, kind)
        out.append(shape)
    return _shape_tree(ty, out), None


def emit_shape_func(prim: Function, is_input: tuple, name: str) -> ShapeFuncC:
    """The C shape function ``name`` of ``prim`` (see the module doc); ``ShapeLogicTraceError`` or
    ``UnsupportedError`` when one of its ops cannot be traced."""
    prim = _prepare(prim)
    is_input = tuple(bool(f) for f in is_input)
    if len(is_input) != len(prim.params):
        raise UnsupportedError(f"is_input has {len(is_input)} flags for {len(prim.params)} parameters")
    em = _Emitter()
    entries: dict = {}
    flat_is_input, in_ranks, in_dtypes, position = [], [], [], 0
    for param, flag in zip(prim.params, is_input):
        ty = _param_type(param)
        count = _flat_count(ty)
        entries[param] = _param_entry(em, ty, flag, list(range(position, position + count)))
        for t in flatten_tensor_types(ty):
            if not isinstance(t, TensorType):
                raise UnsupportedError(f"parameter %{param.name_hint} of type {ty} is not a tensor or tuple of them")
            flat_is_input.append(flag)
            in_ranks.append(t.ndim)
            in_dtypes.append(t.dtype)
        position += count
    for node in post_order_iter(prim.body, _children_with_vars):
        if node in entries:
            continue
        if isinstance(node, Call) and isinstance(node.op, Op):
            entries[node] = _op_entry(em, node, [entries[a] for a in node.args])
        elif isinstance(node, Constant):
            data = np.asarray(node.data)
            entries[node] = (tuple(data.shape), DataArg.of_array(data))
        elif isinstance(node, Tuple):
            fields = [entries[f] for f in node.fields]
            datas = [d for _, d in fields]
            entries[node] = ([s for s, _ in fields], datas if all(d is not None for d in datas) else None)
        elif isinstance(node, TupleGetItem):
            shape, data = entries[node.tuple_value]
            entries[node] = (shape[node.index], data[node.index] if data is not None else None)
        elif isinstance(node, Var):
            raise UnsupportedError(f"free variable %{node.name_hint} in a primitive function")
        else:
            raise UnsupportedError(f"a primitive function cannot contain {type(node).__name__} nodes")
    ret_type = prim.ret_type or known_type(prim.body)
    result = _flatten(entries[prim.body][0])
    out_ranks = tuple(t.ndim for t in flatten_tensor_types(ret_type))
    for j, (shape, rank) in enumerate(zip(result, out_ranks)):
        if len(shape) != rank:
            raise ShapeLogicTraceError(f"result {j} has rank {len(shape)}, its type rank {rank}")
        em.lines.extend(f"  out[{j}][{k}] = {c_expr(d)};" for k, d in enumerate(shape))
    label = _primitive_label(prim)
    # (a dim or size that overflowed int64 on the way: an error, whatever else the dims say)
    em.lines.append(f"  if ({OVERFLOW_FLAG}) return TV_SHAPE_ERROR_BASE + {len(em.messages)};")
    em.messages.append(f"{label}: a dim or size overflows int64 (the inputs ask for a shape too large)")
    messages = tuple(em.messages)
    table = ", ".join(_c_string(m) for m in messages) or "0"
    text = (f"/* shape function of {_comment(label)} */\n"
            f"const char* const {name}_messages[] = {{{table}}};\n"
            f"int32_t {name}(const int64_t* const* shapes, const void* const* data, int64_t* const* out) {{\n"
            f"  (void)shapes;\n  (void)data;\n  (void)out;\n  int {OVERFLOW_FLAG} = 0;\n"
            + "".join(line + "\n" for line in em.lines) + "  return 0;\n}\n")
    return ShapeFuncC(name, text, messages, frozenset(em.deferred), tuple(flat_is_input), tuple(in_ranks), tuple(in_dtypes), out_ranks,
                      label)


def _c_string(text: str) -> str:
    escaped = text.encode("ascii", "backslashreplace").decode().replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\n", "\\n") + '"'


def _comment(text: str) -> str:
    return text.replace("*/", "* /")
