"""Kernels for target "python": a primitive function becomes a NumPy callable.

``build_kernel(prim)`` returns ``kernel(*ins, *outs)`` in destination-passing style: the inputs are
the primitive's arguments flattened (a tuple-typed argument contributes one array per field, in
order), the outputs one preallocated array per (flattened) result field; the kernel writes its
results into them and returns nothing. A primitive that is a single elementwise op with a NumPy
ufunc equivalent writes straight into the output with ``out=``; anything else runs its ops'
reference kernels in order and copies the result into the output (the root op still writes with
``out=`` when it can).

``build_shape_func(prim, is_input)`` returns ``shape_func(*ins, *outs)``: input ``i`` is the
argument's data when ``is_input[i]`` else its int64 shape tensor (one per field of a tuple-typed
argument); the outputs are int64 1-D tensors, one per result field, that receive the result
shapes. ``build_shape_func_tuples`` is the same computation over tuples (``shape_func(*ins) ->
shapes``, memoized when no input is read by data), which the VM uses where it keeps shapes as
tuples. It composes the shape functions of the primitive's ops over its body: a data-independent op
gets its inputs' shapes, a data-dependent op gets the data of its inputs (parameters or constants);
an op with a static type whose data inputs are computed inside the group contributes its static
shape. Every computed shape is checked against the static dims of the op's type (type inference
is optimistic about ``?`` against a static dim). A shape that does not fit raises ``ShapeError``
naming the op.

Both are generated once per primitive as small Python functions (text we generate ourselves,
compiled with ``exec``; nothing read from a file is ever executed).
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import ShapeError, UnsupportedError
from ..ir.expr import Call, Constant, Expr, Function, GlobalVar, Let, Op, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.types import TensorType, TupleType
from ..op.registry import get_op
from ..transform.fuse_ops import flatten_tensor_types
from ..transform.to_anf import TypedMutator, known_type, post_order_iter, primitive_children, rebuild_function
from .kernel_abi import SHAPE_CACHE_MAX_DATA, SHAPE_CACHE_SIZE, dps_shape_func, memoized_shape_func  # noqa: F401

_children_with_vars = functools.partial(primitive_children, with_let_vars=True)

__all__ = ["build_kernel", "build_shape_func", "build_shape_func_tuples", "memoized_shape_func", "dps_shape_func",
           "UFUNC_OPS"]

# Ops whose reference kernel equals a NumPy ufunc on operands of one dtype (the dtypes listed).
_FLOAT = ("float16", "float32", "float64")
_NUMERIC = _FLOAT + ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_ALL = _NUMERIC + ("bool",)
UFUNC_OPS = {
    "add": (np.add, _NUMERIC), "subtract": (np.subtract, _NUMERIC), "multiply": (np.multiply, _NUMERIC),
    "divide": (np.true_divide, _FLOAT), "maximum": (np.maximum, _ALL), "minimum": (np.minimum, _ALL),
    "negative": (np.negative, _NUMERIC), "abs": (np.abs, _NUMERIC), "exp": (np.exp, _FLOAT),
    "log": (np.log, _FLOAT), "sqrt": (np.sqrt, _FLOAT), "tanh": (np.tanh, _FLOAT), "sin": (np.sin, _FLOAT),
    "cos": (np.cos, _FLOAT), "equal": (np.equal, _ALL), "not_equal": (np.not_equal, _ALL),
    "less": (np.less, _ALL), "less_equal": (np.less_equal, _ALL), "greater": (np.greater, _ALL),
    "greater_equal": (np.greater_equal, _ALL), "logical_and": (np.logical_and, ("bool",)),
    "logical_or": (np.logical_or, ("bool",)), "logical_not": (np.logical_not, ("bool",)),
    "copy": (np.copyto, None),
}


class _InlineLets(TypedMutator):
    def visit_let(self, let: Let):
        while isinstance(let, Let):
            self.memo[let.var] = self.visit(let.value)
            let = let.body
        return self.visit(let)


def _prepare(prim: Function) -> Function:
    """Type the primitive's body if needed (one rebuilt from text carries only its annotations) and
    inline its lets, so the body is a DAG of calls, tuples and projections over the parameters."""
    if getattr(prim.body, "_checked_type", None) is None:
        from ..transform.infer_type import infer_type

        mod = infer_type(IRModule({GlobalVar("primitive"): prim}))
        prim = mod["primitive"]
    if any(isinstance(n, Let) for n in post_order_iter(prim.body, _children_with_vars)):
        prim = rebuild_function(prim, _InlineLets().visit(prim.body))
    return prim


def _param_type(param: Var):
    return param.type_annotation or known_type(param)


def _flat_count(ty) -> int:
    return len(flatten_tensor_types(ty))


def _structure(ty, names: list) -> str:
    """Python source rebuilding a (nested) tuple value of type ``ty`` from flat names (consumed)."""
    if isinstance(ty, TupleType):
        parts = [_structure(f, names) for f in ty.fields]
        return "(" + "".join(p + ", " for p in parts) + ")"
    return names.pop(0)


def _flat_paths(ty, prefix: str) -> list[str]:
    """Python expressions reaching each tensor of a value of type ``ty`` named ``prefix``."""
    if isinstance(ty, TupleType):
        return [p for i, f in enumerate(ty.fields) for p in _flat_paths(f, f"{prefix}[{i}]")]
    return [prefix]


class _Source:
    """Builds the text of one generated function and the namespace it refers to."""

    def __init__(self):
        self.lines: list[str] = []
        self.namespace: dict = {"np": np, "ShapeError": ShapeError}
        self.counter = 0

    def name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def global_(self, prefix: str, value) -> str:
        name = self.name(prefix)
        self.namespace[name] = value
        return name

    def compile(self, fn_name: str, params: list[str], filename: str):
        text = f"def {fn_name}({', '.join(params)}):\n" + "".join(f"    {line}\n" for line in self.lines or ["pass"])
        code = compile(text, filename, "exec")
        exec(code, self.namespace)  # our own generated text, never file content
        fn = self.namespace[fn_name]
        fn.__source__ = text
        return fn


def _check_input(value, dims: tuple, where: str, name: str) -> None:
    shape = np.shape(value)
    if len(shape) != len(dims) or any(d is not None and d != n for d, n in zip(dims, shape)):
        raise ShapeError(f"{where}: argument {name} must have the shape {dims} (None: any), got {shape}")


def _store_checked(out: np.ndarray, value, where: str) -> None:
    value = np.asarray(value)
    if value.shape != out.shape:
        raise ShapeError(f"{where}: the kernel produced shape {value.shape} but its output was allocated as {out.shape}")
    np.copyto(out, value, casting="unsafe")


def _ufunc_for(call: Call):
    """The NumPy ufunc computing this op call exactly, or None."""
    entry = UFUNC_OPS.get(call.op.name)
    if entry is None or call.attrs:
        return None
    ufunc, dtypes = entry
    types = [known_type(a) for a in call.args]
    if not all(isinstance(t, TensorType) for t in types) or len({t.dtype for t in types}) != 1:
        return None
    if dtypes is not None and types[0].dtype not in dtypes:
        return None
    return ufunc


def build_kernel(prim: Function):
    """The DPS NumPy kernel of a primitive function: ``kernel(*flat_inputs, *flat_outputs)``."""
    prim = _prepare(prim)
    src = _Source()
    arg_names: list[str] = []
    value_of: dict[Expr, str] = {}
    src.namespace["check_input"] = _check_input
    where = src.global_("WHERE", f"kernel of {_primitive_label(prim)}")
    for i, param in enumerate(prim.params):
        ty = _param_type(param)
        flat = [f"a{i}_{j}" for j in range(_flat_count(ty))]
        arg_names.extend(flat)
        for name, tty in zip(flat, flatten_tensor_types(ty)):
            # the static dims the kernel was built for, as a C kernel checks them (typing may have been
            # optimistic: a ? met a declared static dim, and NumPy would broadcast where C would refuse)
            if isinstance(tty, TensorType) and any(isinstance(d, int) for d in tty.shape):
                dims = tuple(d if isinstance(d, int) else None for d in tty.shape)
                src.lines.append(f"check_input({name}, {dims!r}, {where}, {param.name_hint!r})")
        if isinstance(ty, TupleType):
            value_of[param] = f"p{i}"
            src.lines.append(f"p{i} = {_structure(ty, list(flat))}")
        else:
            value_of[param] = flat[0]
    ret_type = prim.ret_type or known_type(prim.body)
    out_names = [f"o{j}" for j in range(_flat_count(ret_type))]
    src.namespace["store"] = _store_checked

    body = prim.body
    root_ufunc = _ufunc_for(body) if isinstance(body, Call) and isinstance(body.op, Op) else None
    for node in post_order_iter(body, _children_with_vars):
        if node in value_of:
            continue
        if node is body and root_ufunc is not None:
            continue  # written straight into the output below
        value_of[node] = _emit_node(src, node, value_of)
    if root_ufunc is not None:
        args = ", ".join(value_of[a] for a in body.args)
        if root_ufunc is np.copyto:
            src.lines.append(f"np.copyto(o0, {args})")
        else:
            # NumPy reports a broadcast failure as ValueError; report it like the op's own kernel.
            src.lines += ["try:", f"    {src.global_('U', root_ufunc)}({args}, out=o0)",
                          "except ValueError as err:",
                          f"    raise ShapeError({body.op.name!r} + ': ' + str(err)) from None"]
    else:
        result = value_of[body]
        for out, path in zip(out_names, _flat_paths(ret_type, result)):
            src.lines.append(f"store({out}, {path}, {where})")
    return src.compile("kernel", arg_names + out_names, f"<kernel {_primitive_label(prim)}>")


def _emit_node(src: _Source, node: Expr, value_of: dict) -> str:
    if isinstance(node, Constant):
        return src.global_("C", np.asarray(node.data))
    if isinstance(node, Var):
        raise UnsupportedError(f"free variable %{node.name_hint} in a primitive function")
    name = src.name("v")
    if isinstance(node, Call) and isinstance(node.op, Op):
        opdef = get_op(node.op)
        kernel = src.global_("K", opdef.kernel)
        attrs = src.global_("A", opdef.normalize_attrs(node.attrs))
        args = "".join(", " + value_of[a] for a in node.args)
        src.lines.append(f"{name} = {kernel}({attrs}{args})")
    elif isinstance(node, Tuple):
        src.lines.append(f"{name} = (" + "".join(value_of[f] + ", " for f in node.fields) + ")")
    elif isinstance(node, TupleGetItem):
        src.lines.append(f"{name} = {value_of[node.tuple_value]}[{node.index}]")
    else:
        raise UnsupportedError(f"a primitive function cannot contain {type(node).__name__} nodes")
    return name


def _primitive_label(prim: Function) -> str:
    names = [n.op.name for n in post_order_iter(prim.body, _children_with_vars) if isinstance(n, Call) and isinstance(n.op, Op)]
    return "primitive(" + ", ".join(names) + ")"


# --- shape functions ---------------------------------------------------------------------------
def _static_shapes(ty) -> list:
    return [tuple(t.shape) for t in flatten_tensor_types(ty)]


def _check_against_type(op: str, shapes: list, ty) -> None:
    """A computed shape must agree with the static dims of the op's type (typing was optimistic)."""
    for shape, tty in zip(shapes, flatten_tensor_types(ty)):
        if not isinstance(tty, TensorType):
            continue
        if len(shape) != tty.ndim or any(isinstance(d, int) and d != s for d, s in zip(tty.shape, shape)):
            raise ShapeError(f"{op}: the computed output shape {tuple(shape)} does not match its type {tty}")


def _shape_tree(ty, shapes: list):
    """Group a flat list of shapes by a (nested) tuple type: tuple types give lists."""
    if isinstance(ty, TupleType):
        return [_shape_tree(f, shapes) for f in ty.fields]
    return shapes.pop(0)


def _flatten_tree(tree) -> list:
    if isinstance(tree, list):
        return [s for t in tree for s in _flatten_tree(t)]
    return [tree]


def _shape_error(opdef, err: ShapeError) -> ShapeError:
    text = str(err)
    return ShapeError(text if text.startswith(opdef.name) else f"{opdef.name}: {text}")


def _op_step(opdef, attrs, node: Call, arg_slots: list, dst: int):
    """A closure computing one op's output shape(s) into ``vals[dst]`` from its inputs' entries.

    An entry is ``(shape tree, data or None)``. An op with a static type falls back to it when its
    shape function needs data computed inside the group (or has no shape function)."""
    ty = known_type(node)
    static = all(isinstance(t, TensorType) and t.is_static for t in flatten_tensor_types(ty))
    static_entry = (_shape_tree(ty, _static_shapes(ty)), None) if static else None
    if opdef.shape_func is None:
        if static_entry is None:
            raise UnsupportedError(f"op {opdef.name} has no shape function, so it cannot have a dynamic output shape")
        return lambda vals: vals.__setitem__(dst, static_entry)
    shape_func, name = opdef.shape_func, opdef.name
    needs_data = [opdef.input_needs_data(j) for j in range(len(arg_slots))]
    plan = list(zip(arg_slots, needs_data, range(len(arg_slots))))
    single = isinstance(ty, TensorType)
    rank = ty.ndim if single else None
    static_dims = [(i, d) for i, d in enumerate(ty.shape) if isinstance(d, int)] if single else None

    def step(vals):
        args = []
        for slot, need, j in plan:
            shape, data = vals[slot]
            if need:
                if data is None:
                    if static_entry is not None:
                        vals[dst] = static_entry
                        return
                    raise UnsupportedError(f"{name}: its shape function needs the data of input {j}, which is not "
                                           f"available in this composed shape function")
                args.append(data)
            else:
                args.append(shape)
        try:
            shapes = shape_func(attrs, args)
        except ShapeError as err:
            raise _shape_error(opdef, err) from None
        if single:
            shape = tuple(int(d) for d in shapes[0])
            if len(shape) != rank or any(shape[i] != d for i, d in static_dims):
                raise ShapeError(f"{name}: the computed output shape {shape} does not match its type {ty}")
            vals[dst] = (shape, None)
        else:
            shapes = [tuple(int(d) for d in s) for s in shapes]
            _check_against_type(name, shapes, ty)
            vals[dst] = (_shape_tree(ty, shapes), None)

    return step


def _struct_step(node, slot_of: dict, dst: int):
    if isinstance(node, Tuple):
        field_slots = [slot_of[f] for f in node.fields]

        def tuple_step(vals):
            fields = [vals[i] for i in field_slots]
            datas = [d for _, d in fields]
            vals[dst] = ([sh for sh, _ in fields], datas if all(d is not None for d in datas) else None)

        return tuple_step
    src, index = slot_of[node.tuple_value], node.index

    def get_step(vals):
        shape, data = vals[src]
        vals[dst] = (shape[index], data[index] if data is not None else None)

    return get_step


def _as_shape_tuple(value) -> tuple:
    """A by-shape input as a tuple of ints (the VM passes tuples; an int64 shape tensor is converted)."""
    if value.__class__ is tuple:
        return value
    return tuple(np.asarray(value).tolist())


def _param_loader(ty, by_data: bool):
    """Turn a parameter's flat inputs into its (shape tree, data) entry."""
    if isinstance(ty, TensorType):
        if by_data:
            return lambda flat: (flat[0].shape, flat[0])
        return lambda flat: (_as_shape_tuple(flat[0]), None)
    if by_data:
        return lambda flat: (_shape_tree(ty, [np.shape(a) for a in flat]), _shape_tree(ty, list(flat)))
    return lambda flat: (_shape_tree(ty, [_as_shape_tuple(a) for a in flat]), None)


def build_shape_func_tuples(prim: Function, is_input: tuple):
    """The composed shape function of a primitive over tuples: ``shape_func(*ins) -> (shape, ...)``.

    By-shape inputs are tuples of ints (int64 shape tensors are accepted too), data inputs arrays; the
    result holds one tuple per flattened output. The function is pure in its input shapes and data, so
    results are memoized (a dict lookup instead of re-running the ops' shape functions), keyed by the
    shapes and by the values of small data inputs (a new shape, slice bounds); errors are never cached. The function carries ``flat_is_input`` (one flag per flat
    input) and ``num_outputs``.
    """
    prim = _prepare(prim)
    is_input = tuple(bool(f) for f in is_input)
    if len(is_input) != len(prim.params):
        raise UnsupportedError(f"is_input has {len(is_input)} flags for {len(prim.params)} parameters")
    param_types = [_param_type(p) for p in prim.params]
    counts = [_flat_count(t) for t in param_types]
    ret_type = prim.ret_type or known_type(prim.body)
    out_ranks = tuple(t.ndim for t in flatten_tensor_types(ret_type))
    slot_of: dict = {p: i for i, p in enumerate(prim.params)}
    loaders, pos = [], 0
    for i, (ty, count, flag) in enumerate(zip(param_types, counts, is_input)):
        loaders.append((i, pos, pos + count, _param_loader(ty, flag)))
        pos += count
    n_in = pos
    constants, steps = [], []
    for node in post_order_iter(prim.body, _children_with_vars):
        if node in slot_of:
            continue
        dst = len(slot_of)
        if isinstance(node, Call) and isinstance(node.op, Op):
            opdef = get_op(node.op)
            steps.append(_op_step(opdef, opdef.normalize_attrs(node.attrs), node, [slot_of[a] for a in node.args],
                                  dst))
        elif isinstance(node, Constant):
            constants.append((dst, (tuple(node.data.shape), np.asarray(node.data))))
        elif isinstance(node, (Tuple, TupleGetItem)):
            steps.append(_struct_step(node, slot_of, dst))
        else:
            raise UnsupportedError(f"a primitive function cannot contain {type(node).__name__} nodes")
        slot_of[node] = dst
    n_slots, result_slot, single_result = len(slot_of), slot_of[prim.body], isinstance(ret_type, TensorType)
    label = _primitive_label(prim)

    def compute(*inputs) -> tuple:
        if len(inputs) != n_in:
            raise ShapeError(f"shape function of {label}: expected {n_in} inputs, got {len(inputs)}")
        vals = [None] * n_slots
        for i, start, stop, load in loaders:
            vals[i] = load(inputs[start:stop])
        for i, entry in constants:
            vals[i] = entry
        for step in steps:
            step(vals)
        tree = vals[result_slot][0]
        result = (tree,) if single_result else tuple(_flatten_tree(tree))
        for shape, rank in zip(result, out_ranks):
            if len(shape) != rank:
                raise ShapeError(f"shape function of {label}: result shape {shape} does not have rank {rank}")
        return result

    flat_is_input = tuple(flag for flag, count in zip(is_input, counts) for _ in range(count))
    return memoized_shape_func(compute, flat_is_input, out_ranks, label)


def build_shape_func(prim: Function, is_input: tuple):
    """The composed shape function of a primitive in destination-passing style:
    ``shape_func(*ins, *out_shapes)`` writes each result shape into its int64 1-D output tensor.

    The tuple form (``build_shape_func_tuples``) is attached as ``shape_func.tuple_form``; the VM calls it
    directly where it keeps shapes in registers as tuples."""
    return dps_shape_func(build_shape_func_tuples(prim, is_input))
