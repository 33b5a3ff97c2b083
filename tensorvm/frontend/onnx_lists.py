"""Converters of ONNX's sequence ops (lists of tensors), and the lists a ``Loop`` grows.

A sequence whose length is known at import is a tuple of its tensors: SequenceEmpty, SequenceConstruct,
SequenceInsert, SequenceErase, SequenceAt, SequenceLength, SplitToSequence, ConcatFromSequence and
SequenceMap (its body imported once per element). The tensors may differ in shape (ONNX allows it); they
share a dtype. A position is a constant or a run-time scalar: a constant one is checked at import, a
run-time one picks the tensors with ``if`` chains (their types joined: differing dims become ``Any``, so
a run-time position over tensors of different ranks is refused) and is an index error at run time when
out of range, never wrapped.

A sequence a ``Loop`` carries and changes the length of (``xs.append(h)`` in a loop) becomes the
prelude's ``List``, newest tensor first, of one rank and dtype (``widen_sequence``): appending is a
``Cons``; SequenceLength and SequenceAt walk it (tail loops ``@seq_length``, ``@seq_at``; a position -k
needs no length); ConcatFromSequence stacks it into one buffer (``stacked``: the scan outputs' helper) and
moves the new axis, or without a new axis writes each tensor into its rows of one buffer (their lengths
along the axis may differ); SequenceInsert and SequenceErase at positions move the tensors before the
place onto a prefix (``@seq_insert``, ``@seq_erase``); SequenceMap walks the lists together (``@seq_map``).
SplitToSequence into a run-time number of parts builds such a list (``@split_parts``). A sequence graph
input is a List in order, and so is a List graph output: ``in_order`` reverses them at the boundary.
"""

from __future__ import annotations

import numpy as np

from ..errors import ModelImportError, TypeInferenceError, UnsupportedError
from ..ir.expr import (
    Call,
    Clause,
    Function,
    Let,
    Match,
    PatternConstructor,
    PatternVar,
    PatternWildcard,
    Tuple,
    Var,
)
from ..ir.types import Any, GlobalTypeVar, TensorType, TupleType, TypeCall
from .onnx_context import converter, generalize
from .onnx_shape import _int64, run_time_index, slice_10, split_sizes, squeeze_axes, unsqueeze_axes


def _items(ctx, seq, op: str) -> list:
    ty = ctx.type_of(seq)
    if not isinstance(ty, TupleType):
        raise UnsupportedError(f"{op}: expected a sequence of a length known at import, got a value of type {ty}")
    return [ctx.get_item(seq, i) for i in range(len(ty.fields))]


def _sequence(ctx, items: list) -> Tuple:
    dtypes = {ctx.dtype(t) for t in items}
    if len(dtypes) > 1:
        raise TypeInferenceError(f"a sequence's tensors share one dtype, got {sorted(dtypes)}")
    return ctx.tuple(items)


def _position(ctx, position, count: int, extra: int, op: str):
    """``position`` (valid in [-count, count + extra), a negative one counting back from ``count``) as a
    Python int when constant (checked), else as a run-time int64 place (``run_time_index``)."""
    value = ctx.value(position)
    if value is None:
        return run_time_index(ctx, position, count, extra)
    if value.size != 1:
        raise ModelImportError(f"{op}: expected a scalar position, got shape {value.shape}")
    index = int(value.reshape(()))
    if not -count <= index < count + extra:
        raise ModelImportError(f"{op}: position {index} is out of range [{-count}, {count + extra - 1}] for a "
                               f"sequence of {count} tensors")
    return index + count if index < 0 else index


def _pick(ctx, place, choices: list):
    """``choices[place]`` for a run-time int64 ``place`` in [0, len(choices)): an ``if`` chain."""
    out = choices[-1]
    for k in range(len(choices) - 2, -1, -1):
        out = ctx.if_(ctx.call("equal", place, ctx.constant(np.array(k, np.int64))), choices[k], out)
    return out


def _before(ctx, place, k: int):
    """Whether the run-time ``place`` is after position ``k`` (``k < place``), as a scalar bool."""
    return ctx.call("less", ctx.constant(np.array(k, np.int64)), place)


# A split into more parts than this is a List even when their number is known at import: a tuple is unrolled
# at import (an expression per part, and SequenceMap imports its body per part), and the number of parts
# comes from a dim, not from anything the model file has to hold.
MAX_TUPLE_PARTS = 256


@converter("SequenceEmpty", 11)
def sequence_empty_11(ctx, *, dtype=None):
    return ctx.tuple([])


@converter("SequenceConstruct", 11)
def sequence_construct_11(ctx, *inputs):
    return _sequence(ctx, list(inputs))


@converter("SequenceLength", 11)
def sequence_length_11(ctx, input_sequence):
    if is_list(ctx.type_of(input_sequence)):
        return list_length(ctx, input_sequence)
    return ctx.constant(np.array(len(_items(ctx, input_sequence, "SequenceLength")), np.int64))


@converter("SequenceAt", 11)
def sequence_at_11(ctx, input_sequence, position):
    if is_list(ctx.type_of(input_sequence)):  # (newest first: place p is count - 1 - p from the head)
        known = ctx.value(position)
        if known is not None and known.size == 1 and int(known.reshape(())) < 0:  # (-k: k - 1 from the head,
            back = -int(known.reshape(())) - 1  # past the list's end: seq_at's match fails, naming it)
            return _list_at(ctx, input_sequence, ctx.constant(np.array(back, np.int64)))
        count = list_length(ctx, input_sequence)
        place = run_time_index(ctx, position, count)
        last = ctx.call("subtract", count, ctx.constant(np.array(1, np.int64)))
        return _list_at(ctx, input_sequence, ctx.call("subtract", last, place))
    items = _items(ctx, input_sequence, "SequenceAt")
    if not items:
        raise ModelImportError("SequenceAt: the sequence is empty")
    place = _position(ctx, position, len(items), 0, "SequenceAt")
    return items[place] if isinstance(place, int) else _pick(ctx, place, items)


@converter("SequenceInsert", 11)
def sequence_insert_11(ctx, input_sequence, tensor, position=None):
    ty = ctx.type_of(input_sequence)
    if is_list(ty):  # (an append is a Cons: newest first)
        out_type = list_type(joined_elem([ty.args[0], ctx.type_of(tensor)], "SequenceInsert"))
        if out_type != ty:
            raise UnsupportedError(f"SequenceInsert: a {ctx.type_of(tensor)} into a {ty}")
        if position is None:
            cons, _ = list_adt(ctx.importer)
            grown = typed(Call(cons, (tensor, input_sequence)), out_type)
            return grown
        count = list_length(ctx, input_sequence)  # (place p in [0, n]: n - p tensors are newer)
        place = run_time_index(ctx, position, count, extra=1)
        return _list_edit(ctx, input_sequence, ctx.call("subtract", count, place), tensor)
    items = _items(ctx, input_sequence, "SequenceInsert")
    n = len(items)
    place = n if position is None else _position(ctx, position, n, 1, "SequenceInsert")
    if isinstance(place, int):
        return _sequence(ctx, items[:place] + [tensor] + items[place:])
    # out[j] is items[j] before the place, the tensor at it, items[j - 1] after it
    out = []
    for j in range(n + 1):
        at_or_after = tensor if j == 0 else ctx.if_(
            ctx.call("equal", place, ctx.constant(np.array(j, np.int64))), tensor, items[j - 1])
        out.append(at_or_after if j == n else ctx.if_(_before(ctx, place, j), items[j], at_or_after))
    return _sequence(ctx, out)


@converter("SequenceErase", 11)
def sequence_erase_11(ctx, input_sequence, position=None):
    if is_list(ctx.type_of(input_sequence)):
        if position is None:  # (the newest: the head)
            return _list_edit(ctx, input_sequence, ctx.constant(np.array(0, np.int64)))
        count = list_length(ctx, input_sequence)
        place = run_time_index(ctx, position, count)
        last = ctx.call("subtract", count, ctx.constant(np.array(1, np.int64)))
        return _list_edit(ctx, input_sequence, ctx.call("subtract", last, place))
    items = _items(ctx, input_sequence, "SequenceErase")
    n = len(items)
    if not n:
        raise ModelImportError("SequenceErase: the sequence is empty")
    place = n - 1 if position is None else _position(ctx, position, n, 0, "SequenceErase")
    if isinstance(place, int):
        return _sequence(ctx, items[:place] + items[place + 1:])
    # out[j] is items[j] before the erased place, items[j + 1] from it on
    return _sequence(ctx, [ctx.if_(_before(ctx, place, j), items[j], items[j + 1]) for j in range(n - 1)])


@converter("SplitToSequence", 11)
def split_to_sequence_11(ctx, input, split=None, *, axis=0, keepdims=1):  # noqa: A002
    ndim = ctx.ndim(input)
    if not -ndim <= axis < ndim:
        raise ModelImportError(f"SplitToSequence: axis {axis} is out of range for rank {ndim}")
    axis %= ndim
    dim = ctx.shape(input)[axis]
    if split is not None and ctx.ndim(split) == 1:  # the sizes: as many parts as the split has entries
        count = ctx.shape(split)[0]
        if not isinstance(count, int):
            raise UnsupportedError("SplitToSequence: the number of parts (the split's length) is only known at "
                                   "run time")
        sizes = ctx.int_list(split)
        if sizes is not None:
            if isinstance(dim, int) and sum(sizes) != dim:
                raise ModelImportError(f"SplitToSequence: split sizes {sizes} do not add up to the axis' {dim}")
            return _sequence(ctx, split_sizes(ctx, input, axis, sizes, count) if count else [])
        parts = ctx.call("dyn.split", input, _int64(ctx, split), axis=axis, num_outputs=count)
        return _sequence(ctx, [ctx.get_item(parts, i) for i in range(count)])
    known = ctx.value(split) if split is not None else np.array(1)
    size = None if known is None else int(np.asarray(known).reshape(()))
    if size is not None and size <= 0:
        raise ModelImportError(f"SplitToSequence: the split size must be positive, got {size}")
    if not isinstance(dim, int) or size is None or -(-dim // size) > MAX_TUPLE_PARTS:  # (a List)
        chunk = ctx.constant(np.array(1, np.int64)) if split is None else _int64(ctx, split)
        return _split_list(ctx, input, axis, chunk, squeeze=split is None and not keepdims)
    if split is None:  # parts of one, the axis dropped unless keepdims
        parts = split_sizes(ctx, input, axis, [1] * dim, dim) if dim else []
        return _sequence(ctx, parts if keepdims else [squeeze_axes(ctx, p, [axis]) for p in parts])
    sizes = [size] * (dim // size) + ([dim % size] if dim % size else [])
    return _sequence(ctx, split_sizes(ctx, input, axis, sizes, len(sizes)) if sizes else [])


@converter("ConcatFromSequence", 11)
def concat_from_sequence_11(ctx, input_sequence, *, axis, new_axis=0):
    ty = ctx.type_of(input_sequence)
    if is_list(ty):
        return _concat_list(ctx, input_sequence, ty.args[0], axis, new_axis)
    items = _items(ctx, input_sequence, "ConcatFromSequence")
    if not items:
        raise ModelImportError("ConcatFromSequence: the sequence is empty")
    ndim = ctx.ndim(items[0]) + (1 if new_axis else 0)
    if not -ndim <= axis < ndim:
        raise ModelImportError(f"ConcatFromSequence: axis {axis} is out of range for rank {ndim}")
    axis %= ndim
    if new_axis:
        items = [unsqueeze_axes(ctx, t, [axis]) for t in items]
    if len(items) == 1:
        return ctx.call("copy", items[0])
    return ctx.call("concatenate", ctx.tuple(items), axis=axis)


@converter("SequenceMap", 17)
def sequence_map_17(ctx, input_sequence, *additional_inputs, body):
    """Each output sequence's i-th tensor is the body's output for the i-th tensors of the input sequences
    (a tensor input is given to every application): the body imported once per element of a sequence of
    a length known at import; over a List, a loop applying the body imported once (``_map_lists``)."""
    if len(body.input) != 1 + len(additional_inputs):
        raise ModelImportError(f"SequenceMap: the body takes {len(body.input)} inputs, the node gives "
                               f"{1 + len(additional_inputs)}")
    if any(is_list(ctx.type_of(v)) for v in (input_sequence, *additional_inputs)):
        return _map_lists(ctx, body, [input_sequence, *additional_inputs])
    items = _items(ctx, input_sequence, "SequenceMap")
    columns = []
    for extra in additional_inputs:
        if isinstance(ctx.type_of(extra), TupleType):
            extra_items = _items(ctx, extra, "SequenceMap")
            if len(extra_items) != len(items):
                raise ModelImportError(f"SequenceMap: sequences of {len(items)} and {len(extra_items)} tensors")
            columns.append(extra_items)
        else:
            columns.append([extra] * len(items))
    applied = [ctx.importer.import_branch(body, ctx.scope, [item, *(column[i] for column in columns)])
               for i, item in enumerate(items)]
    outputs = [_sequence(ctx, [outs[k] for outs in applied]) for k in range(len(body.output))]
    return outputs if len(outputs) != 1 else outputs[0]


# ---- sequences whose length is known only at run time: the prelude's List, newest tensor first ----------
def rows_type(elem_type: TensorType) -> TensorType:
    """Tensors of ``elem_type`` stacked along a new first axis of a run-time length."""
    return TensorType((Any(),) + tuple(generalize(elem_type).shape), elem_type.dtype)


def _no_rows(ctx, elem_type: TensorType):
    """No tensor stacked: 0 rows, and 0 for every dim not known at import."""
    dims = [0] + [d if isinstance(d, int) else 0 for d in elem_type.shape]
    return ctx.constant(np.zeros(dims, dtype=elem_type.dtype))


def _prelude_adt(importer, name: str) -> tuple:
    """The constructors of the prelude's ADT ``name``, its definition added to the imported module on
    first use."""
    if name not in importer.type_defs:
        from ..prelude import prelude_module

        importer.type_defs[name] = prelude_module().get_type(name)
    return importer.type_defs[name].constructors


def list_adt(importer):
    """The prelude's ``List``: (Cons, Nil)."""
    return _prelude_adt(importer, "List")


def typed(node, ty):
    """``node`` with its checked type set (the converters type what they build as they go)."""
    node.with_type(ty)
    return node


def list_type(elem_type: TensorType) -> TypeCall:
    return TypeCall(GlobalTypeVar("List"), (generalize(elem_type),))


def stacked(ctx, slices, count, elem_type: TensorType):
    """The scan output from its slices (a List, newest first) and the iteration count: one buffer of
    ``count`` rows (the newest slice's shape) filled from the last row up by a recursive function whose
    ``scatter_nd`` runs in place; no iteration gives ``_no_rows``'s empty tensor."""
    elem_type = generalize(elem_type)
    stack = _helper(ctx.importer, "stack", elem_type, lambda: _build_stack(ctx, elem_type))
    call = typed(Call(stack, (slices, count)), rows_type(elem_type))
    return call


def _build_stack(ctx, elem_type: TensorType):
    """``@scan_stack(xs, n)`` and the ``@scan_fill`` it calls, for slices of ``elem_type``."""
    importer = ctx.importer
    cons, nil = list_adt(importer)
    slices_type, out_type = list_type(elem_type), rows_type(elem_type)
    scalar_i64 = TensorType((), "int64")
    one = ctx.constant(np.array(1, np.int64))

    fill = importer.fresh_global("scan_fill")  # @fill(xs, i, buf): row i from xs's head, then i - 1 ...
    xs, i, buf = Var("xs", slices_type), Var("i", scalar_i64), Var("buf", out_type)
    head, rest = Var("x", generalize(elem_type)), Var("rest", slices_type)
    written = ctx.call("scatter_nd", buf, ctx.call("expand_dims", i, axis=0), head)
    step = typed(Call(fill, (rest, ctx.call("subtract", i, one), written)), out_type)
    fill_body = Match(xs, (Clause(PatternConstructor(cons, (PatternVar(head), PatternVar(rest))), step),
                           Clause(PatternConstructor(nil, ()), buf)))
    fill_body.with_type(out_type)
    importer.globals[fill] = Function((xs, i, buf), fill_body, out_type)

    stack = importer.fresh_global("scan_stack")  # @stack(xs, n): the buffer shaped by the newest slice
    xs2, n = Var("xs", slices_type), Var("n", scalar_i64)
    newest = Var("x", generalize(elem_type))
    shape = ctx.call("concatenate", ctx.tuple([ctx.call("expand_dims", n, axis=0),
                                               ctx.shape_of(newest)]), axis=0)
    fresh = ctx.call("dyn.zeros", shape, dtype=elem_type.dtype)
    start = typed(Call(fill, (xs2, ctx.call("subtract", n, one), fresh)), out_type)
    empty = _no_rows(ctx, elem_type)
    stack_body = Match(xs2, (Clause(PatternConstructor(cons, (PatternVar(newest), PatternWildcard())), start),
                             Clause(PatternConstructor(nil, ()), empty)))
    stack_body.with_type(out_type)
    importer.globals[stack] = Function((xs2, n), stack_body, out_type)
    return stack


def is_list(ty) -> bool:
    """Whether ``ty`` is a run-time-length sequence (a ``List`` of tensors)."""
    return isinstance(ty, TypeCall) and ty.func.name == "List"


def as_list(ctx, seq, elem_type: TensorType):
    """A sequence as a ``List`` of ``elem_type`` (newest first): a tuple's tensors consed from the first."""
    ty = ctx.type_of(seq)
    if is_list(ty):
        return seq
    cons, _ = list_adt(ctx.importer)
    out_type = list_type(elem_type)
    out = _empty_list(ctx, out_type)
    for item in _items(ctx, seq, "a sequence"):
        out = typed(Call(cons, (item, out)), out_type)
    return out


def _empty_list(ctx, list_ty):
    """``Nil`` as a value of ``list_ty``: a call of ``@seq_nil``, a function returning it (the call carries
    the type, where the constructor node itself is shared by every use)."""
    gv = _helper(ctx.importer, "nil", list_ty, lambda: _build_nil(ctx, list_ty))
    return typed(Call(gv, ()), list_ty)


def _build_nil(ctx, list_ty):
    gv = ctx.importer.fresh_global("seq_nil")
    ctx.importer.globals[gv] = Function((), list_adt(ctx.importer)[1], list_ty)
    return gv


def joined_elem(ctx_types: list, what: str) -> TensorType:
    """One tensor type for every tensor a sequence may hold: dims that differ become ``Any``."""
    joined = None
    for ty in ctx_types:
        if not isinstance(ty, TensorType):
            raise UnsupportedError(f"{what}: a sequence of {ty}; tensorvm's sequences hold tensors")
        ty = generalize(ty)
        if joined is None:
            joined = ty
            continue
        if ty.dtype != joined.dtype or ty.ndim != joined.ndim:
            raise UnsupportedError(f"{what}: a sequence of {joined} and {ty}; a run-time-length sequence needs "
                                   "one rank and dtype")
        joined = TensorType(tuple(a if a == b else Any() for a, b in zip(joined.shape, ty.shape, strict=True)),
                            joined.dtype)
    return joined


def widen_sequence(declared, produced):
    """The type a loop-carried sequence settles on: a tuple whose length the body changes becomes a
    ``List`` of its tensors' joined type; None when ``declared`` is no sequence."""
    if not (isinstance(declared, TupleType) or is_list(declared)):
        return None
    if declared == produced:
        return declared
    parts = []
    for ty in (declared, produced):
        if isinstance(ty, TupleType):
            parts.extend(ty.fields)
        elif is_list(ty):
            parts.append(ty.args[0])
        else:
            raise UnsupportedError(f"Loop: a carried sequence becomes a {ty}")
    if not parts:
        return declared
    return list_type(joined_elem(parts, "Loop"))


def _helper(importer, kind: str, ty, build):
    """The importer's one helper function ``kind`` for the type ``ty`` (built by ``build()`` on first use)."""
    key = (kind, ty)
    if key not in importer.list_helpers:
        importer.list_helpers[key] = build()
    return importer.list_helpers[key]


def _length_function(ctx, list_ty):
    return _helper(ctx.importer, "length", list_ty, lambda: _build_length(ctx, list_ty))


def _build_length(ctx, list_ty):
    """``@seq_length(xs, n)``: n plus the length of xs (a tail loop over the list)."""
    importer = ctx.importer
    cons, nil = list_adt(importer)
    gv = importer.fresh_global("seq_length")
    scalar_i64 = TensorType((), "int64")
    xs, n, rest = Var("xs", list_ty), Var("n", scalar_i64), Var("rest", list_ty)
    step = typed(Call(gv, (rest, ctx.call("add", n, ctx.constant(np.array(1, np.int64))))), scalar_i64)
    body = Match(xs, (Clause(PatternConstructor(cons, (PatternWildcard(), PatternVar(rest))), step),
                      Clause(PatternConstructor(nil, ()), n)))
    body.with_type(scalar_i64)
    importer.globals[gv] = Function((xs, n), body, scalar_i64)
    return gv


def list_length(ctx, xs):
    gv = _length_function(ctx, ctx.type_of(xs))
    call = typed(Call(gv, (xs, ctx.constant(np.array(0, np.int64)))), TensorType((), "int64"))
    return call


def _list_at(ctx, xs, from_head):
    """The tensor ``from_head`` places after the newest (a run-time int64 already checked to be in range):
    ``@seq_at``, a tail loop over the list (its match has no ``Nil`` arm: the check made it unreachable)."""
    list_ty = ctx.type_of(xs)
    elem_ty = list_ty.args[0]
    gv = _helper(ctx.importer, "at", list_ty, lambda: _build_at(ctx, list_ty))
    call = typed(Call(gv, (xs, from_head)), elem_ty)
    return call


def _build_at(ctx, list_ty):
    """``@seq_at(xs, k)``: the k-th tensor from the head."""
    importer = ctx.importer
    cons, _ = list_adt(importer)
    elem_ty = list_ty.args[0]
    gv = importer.fresh_global("seq_at")
    scalar_i64 = TensorType((), "int64")
    ys, k = Var("xs", list_ty), Var("k", scalar_i64)
    head, rest = Var("x", elem_ty), Var("rest", list_ty)
    deeper = typed(Call(gv, (rest, ctx.call("subtract", k, ctx.constant(np.array(1, np.int64))))), elem_ty)
    found = ctx.if_(ctx.call("equal", k, ctx.constant(np.array(0, np.int64))), head, deeper)
    body = Match(ys, (Clause(PatternConstructor(cons, (PatternVar(head), PatternVar(rest))), found),), complete=False)
    body.with_type(elem_ty)
    importer.globals[gv] = Function((ys, k), body, elem_ty)
    return gv


def _list_edit(ctx, xs, from_head, inserted=None):
    """``xs`` with ``inserted`` put before the tensor ``from_head`` places after the newest (from_head may
    be the length: after the oldest), or without that tensor (``inserted`` None): ``@seq_insert`` /
    ``@seq_erase``, tail loops moving the tensors they pass onto a prefix, then ``@seq_reversed`` puts the
    prefix back in front."""
    list_ty = ctx.type_of(xs)
    kind = "erase" if inserted is None else "insert"
    gv = _helper(ctx.importer, kind, list_ty, lambda: _build_edit(ctx, list_ty, kind))
    cons, nil = list_adt(ctx.importer)
    args = (xs, from_head) + (() if inserted is None else (inserted,)) + (nil,)
    call = typed(Call(gv, args), list_ty)
    return call


def _build_edit(ctx, list_ty, kind: str):
    importer = ctx.importer
    cons, nil = list_adt(importer)
    reverse = _helper(importer, "reverse", list_ty, lambda: _build_reverse(ctx, list_ty))
    gv = importer.fresh_global(f"seq_{kind}")
    scalar_i64 = TensorType((), "int64")
    xs, k, prefix, rest = Var("xs", list_ty), Var("k", scalar_i64), Var("prefix", list_ty), Var("rest", list_ty)
    head = Var("x", list_ty.args[0])
    t = Var("t", list_ty.args[0]) if kind == "insert" else None

    moved = typed(Call(cons, (head, prefix)), list_ty)
    deeper = typed(Call(gv, (rest, ctx.call("subtract", k, ctx.constant(np.array(1, np.int64))))
                         + ((t,) if t is not None else ()) + (moved,)), list_ty)
    at_k = ctx.call("equal", k, ctx.constant(np.array(0, np.int64)))
    if kind == "insert":  # (k == 0: here; the Nil arm is reached only with k == 0, the list's end)
        here = typed(Call(reverse, (prefix, typed(Call(cons, (t, xs)), list_ty))), list_ty)
        walk = Match(xs, (Clause(PatternConstructor(cons, (PatternVar(head), PatternVar(rest))), deeper),
                          Clause(PatternConstructor(nil, ()), here)))
        walk.with_type(list_ty)
        body = ctx.if_(at_k, here, walk)
        params = (xs, k, t, prefix)
    else:
        dropped = typed(Call(reverse, (prefix, rest)), list_ty)
        body = Match(xs, (Clause(PatternConstructor(cons, (PatternVar(head), PatternVar(rest))),
                                 ctx.if_(at_k, dropped, deeper)),), complete=False)
        body.with_type(list_ty)
        params = (xs, k, prefix)
    importer.globals[gv] = Function(params, body, list_ty)
    return gv


def _concat_list(ctx, xs, elem_type: TensorType, axis: int, new_axis: int):
    """ConcatFromSequence of a run-time-length sequence. With a new axis its tensors (of one shape) are
    stacked in one buffer (``stacked``) and the new axis moved into place; without one they may differ
    along ``axis`` (ONNX allows it): ``@concat_list`` writes each into its rows of one buffer."""
    rank = elem_type.ndim + (1 if new_axis else 0)
    if not -rank <= axis < rank:
        raise ModelImportError(f"ConcatFromSequence: axis {axis} is out of range for rank {rank}")
    axis %= rank
    if not new_axis:
        elem_type = generalize(elem_type)
        concat = _helper(ctx.importer, "concat", (elem_type, axis), lambda: _build_concat(ctx, elem_type, axis))
        rows = typed(Call(concat, (xs,)), _axis_first(elem_type, axis))  # (the axis first)
        if not axis:
            return rows
        return ctx.call("transpose", rows, axes=tuple(range(1, axis + 1)) + (0,) + tuple(range(axis + 1, rank)))
    rows = stacked(ctx, xs, list_length(ctx, xs), elem_type)  # (count, *shape)
    if axis:
        order = list(range(1, axis + 1)) + [0] + list(range(axis + 1, elem_type.ndim + 1))
        rows = ctx.call("transpose", rows, axes=tuple(order))
    return rows


def _axis_first(elem_type: TensorType, axis: int) -> TensorType:
    """The type of tensors of ``elem_type`` concatenated along ``axis``, moved first."""
    rest = tuple(d for a, d in enumerate(elem_type.shape) if a != axis)
    return TensorType((Any(),) + rest, elem_type.dtype)


def _build_concat(ctx, elem_type: TensorType, axis: int):
    """``@concat_list(xs)``: the tensors of ``xs`` (newest first) concatenated in order along ``axis``, the
    axis moved first; ``@concat_extent`` sums their lengths along it (a tail loop), and ``@concat_fill``
    writes each from the newest, ending where the one after it begins (``scatter_nd`` of its rows). The
    other dims must agree: ``scatter_nd`` checks them, a shape error at run time."""
    importer = ctx.importer
    cons, nil = list_adt(importer)
    xs_type, out_type, scalar_i64 = list_type(elem_type), _axis_first(elem_type, axis), TensorType((), "int64")
    at_axis = ctx.constant(np.array(axis, np.int64))
    moved = tuple([axis] + [a for a in range(elem_type.ndim) if a != axis])

    def length(x):
        return ctx.call("take", ctx.shape_of(x), at_axis, axis=0)

    extent = importer.fresh_global("concat_extent")  # @extent(xs, n): n plus the lengths along axis
    xs, n, head, rest = Var("xs", xs_type), Var("n", scalar_i64), Var("x", elem_type), Var("rest", xs_type)
    step = typed(Call(extent, (rest, ctx.call("add", n, length(head)))), scalar_i64)
    body = Match(xs, (Clause(PatternConstructor(cons, (PatternVar(head), PatternVar(rest))), step),
                      Clause(PatternConstructor(nil, ()), n)))
    importer.globals[extent] = Function((xs, n), typed(body, scalar_i64), scalar_i64)

    fill = importer.fresh_global("concat_fill")  # @fill(xs, end, buf): xs's head into rows [end - len, end)
    xs, end, buf, head, rest = (Var("xs", xs_type), Var("end", scalar_i64), Var("buf", out_type),
                                Var("x", elem_type), Var("rest", xs_type))
    start = ctx.call("subtract", end, length(head))
    rows = ctx.call("expand_dims", ctx.call("arange", start, end, ctx.constant(np.array(1, np.int64)),
                                            dtype="int64"), axis=0)
    data = ctx.call("transpose", head, axes=moved) if axis else head
    step = typed(Call(fill, (rest, start, ctx.call("scatter_nd", buf, rows, data))), out_type)
    body = Match(xs, (Clause(PatternConstructor(cons, (PatternVar(head), PatternVar(rest))), step),
                      Clause(PatternConstructor(nil, ()), buf)))
    importer.globals[fill] = Function((xs, end, buf), typed(body, out_type), out_type)

    concat = importer.fresh_global("concat_list")  # @concat(xs): the buffer shaped by the newest tensor
    xs, newest = Var("xs", xs_type), Var("x", elem_type)
    total = typed(Call(extent, (xs, ctx.constant(np.array(0, np.int64)))), scalar_i64)
    dims = [ctx.call("expand_dims", total, axis=0)]
    if elem_type.ndim > 1:
        others = ctx.constant(np.array(moved[1:], np.int64))
        dims.append(ctx.call("take", ctx.shape_of(newest), others, axis=0))
    shape = ctx.call("concatenate", ctx.tuple(dims), axis=0) if len(dims) > 1 else dims[0]
    start = typed(Call(fill, (xs, total, ctx.call("dyn.zeros", shape, dtype=elem_type.dtype))), out_type)
    empty = ctx.constant(np.zeros([0] + [d if isinstance(d, int) else 0 for d in out_type.shape[1:]],
                                  dtype=elem_type.dtype))
    body = Match(xs, (Clause(PatternConstructor(cons, (PatternVar(newest), PatternWildcard())), start),
                      Clause(PatternConstructor(nil, ()), empty)))
    importer.globals[concat] = Function((xs,), typed(body, out_type), out_type)
    return concat


def _split_list(ctx, x, axis: int, size, squeeze: bool):
    """SplitToSequence into parts of a run-time ``size`` (the last one shorter) along ``axis``: a List built
    by ``@split_parts``, a tail loop slicing part after part (newest first, like every such list). A size
    below 1 is an index error at run time (it would never end)."""
    i64 = np.int64
    size = size if ctx.ndim(size) == 0 else ctx.call("reshape", size, newshape=())
    positive = ctx.call("take", ctx.constant(np.array([0], i64)),
                        ctx.call("where", ctx.call("greater", size, ctx.constant(np.array(0, i64))),
                                 ctx.constant(np.array(0, i64)), ctx.constant(np.array(1, i64))), axis=0, mode="fast")
    size = ctx.call("add", size, positive)  # (+ 0: the check runs first)
    part_type = generalize(ctx.tensor_type(x))
    part_type = TensorType(tuple(Any() if a == axis else d for a, d in enumerate(part_type.shape)), part_type.dtype)
    if squeeze:
        part_type = TensorType(part_type.shape[:axis] + part_type.shape[axis + 1:], part_type.dtype)
    slices_type = list_type(part_type)
    importer = ctx.importer
    cons, nil = list_adt(importer)
    gv = importer.fresh_global("split_parts")
    scalar_i64 = TensorType((), "int64")
    data = Var("x", generalize(ctx.tensor_type(x)))
    start, step, length, acc = (Var("start", scalar_i64), Var("size", scalar_i64), Var("length", scalar_i64),
                                Var("acc", slices_type))
    end = ctx.call("minimum", ctx.call("add", start, step), length)
    part = slice_10(ctx, data, ctx.call("expand_dims", start, axis=0), ctx.call("expand_dims", end, axis=0),
                    ctx.constant(np.array([axis], i64)))
    if squeeze:
        part = ctx.call("squeeze", part, axis=(axis,))
    grown = typed(Call(cons, (part, acc)), slices_type)
    again = typed(Call(gv, (data, end, step, length, grown)), slices_type)
    body = ctx.if_(ctx.call("less", start, length), again, acc)
    importer.globals[gv] = Function((data, start, step, length, acc), body, slices_type)
    call = typed(Call(gv, (x, ctx.constant(np.array(0, i64)), size, ctx.dim_value(x, axis), nil)), slices_type)
    return call


def option_adt(importer):
    """The prelude's ``Option``: (Some, None)."""
    return _prelude_adt(importer, "Option")


def option_type(inner) -> TypeCall:
    return TypeCall(GlobalTypeVar("Option"), (inner,))


def is_option(ty) -> bool:
    return isinstance(ty, TypeCall) and ty.func.name == "Option"


def in_order(ctx, value):
    """A List reversed: a graph output (newest first inside) into the order of its sequence, oldest first,
    as the caller reads it (``tensorvm.prelude.to_python_list``); a graph input (in order) into the newest
    first order inside; an optional List likewise inside its ``Some``. Anything else as is."""
    ty = ctx.type_of(value)
    if is_option(ty) and is_list(ty.args[0]):
        some, none = option_adt(ctx.importer)
        inner = Var("xs", ty.args[0])
        clauses = (Clause(PatternConstructor(some, (PatternVar(inner),)), typed(Call(some, (in_order(ctx, inner),)), ty)),
                   Clause(PatternConstructor(none, ()), none))
        return typed(Match(value, clauses), ty)
    if not is_list(ty):
        return value
    gv = _helper(ctx.importer, "reverse", ty, lambda: _build_reverse(ctx, ty))
    cons, nil = list_adt(ctx.importer)
    call = typed(Call(gv, (value, nil)), ty)
    return call


def _build_reverse(ctx, list_ty):
    """``@seq_reversed(xs, acc)``: xs reversed onto acc (a tail loop)."""
    importer = ctx.importer
    cons, nil = list_adt(importer)
    gv = importer.fresh_global("seq_reversed")
    xs, acc, rest = Var("xs", list_ty), Var("acc", list_ty), Var("rest", list_ty)
    head = Var("x", list_ty.args[0])
    moved = typed(Call(cons, (head, acc)), list_ty)
    step = typed(Call(gv, (rest, moved)), list_ty)
    body = Match(xs, (Clause(PatternConstructor(cons, (PatternVar(head), PatternVar(rest))), step),
                      Clause(PatternConstructor(nil, ()), acc)))
    body.with_type(list_ty)
    importer.globals[gv] = Function((xs, acc), body, list_ty)
    return gv


def _map_lists(ctx, body, inputs: list):
    """SequenceMap over Lists (a sequence of a length known at import among them becomes a List too):
    ``@seq_map`` walks them together, binds the body's inputs to their heads (and to the tensor inputs),
    and conses the body's outputs onto one list per output; those come out oldest first and are reversed.
    Lists of different lengths fail the walk's match (an error naming ``seq_map``)."""
    importer = ctx.importer
    cons, nil = list_adt(importer)
    is_sequence = [isinstance(ctx.type_of(v), TupleType) or is_list(ctx.type_of(v)) for v in inputs]
    values, param_types = [], []
    for value, sequence in zip(inputs, is_sequence, strict=True):
        ty = ctx.type_of(value)
        if sequence:
            elem = ty.args[0] if is_list(ty) else joined_elem(list(ty.fields), "SequenceMap")
            value = as_list(ctx, value, elem)
            param_types.append(elem)
        else:
            param_types.append(generalize(ctx.tensor_type(value, "SequenceMap input")))
        values.append(value)
    body_params, outs, captured = importer.import_body(body, ctx.scope, param_types)
    out_types = [list_type(joined_elem([ctx.type_of(o)], "SequenceMap")) for o in outs]
    gv = importer.fresh_global("seq_map")
    walked = [Var(f"xs{k}", ctx.type_of(v)) if s else Var(f"t{k}", param_types[k])
              for k, (v, s) in enumerate(zip(values, is_sequence, strict=True))]
    captured_vars = [var for var, _ in captured.values()]
    accs = [Var(f"acc{k}", t) for k, t in enumerate(out_types)]
    ret_type = TupleType(tuple(out_types))
    rests = {k: Var(f"rest{k}", ctx.type_of(values[k])) for k, s in enumerate(is_sequence) if s}
    grown = []
    for acc, out, ty in zip(accs, outs, out_types, strict=True):
        node = typed(Call(cons, (out, acc)), ty)
        grown.append(node)
    step = Call(gv, tuple(rests.get(k, walked[k]) for k in range(len(walked))) + tuple(captured_vars) + tuple(grown))
    step.with_type(ret_type)
    # bind the body's inputs: a head for a sequence, the tensor itself otherwise
    heads = {k: body_params[k] for k in rests}
    expr = step
    for k in range(len(walked) - 1, -1, -1):
        if k not in rests:
            expr = Let(body_params[k], walked[k], expr)
            expr.with_type(ret_type)
    first = min(rests)
    for k in sorted(rests, reverse=True):  # (the first list's match has the Nil arm: the walk's end)
        clauses = [Clause(PatternConstructor(cons, (PatternVar(heads[k]), PatternVar(rests[k]))), expr)]
        if k == first:
            clauses.append(Clause(PatternConstructor(nil, ()), ctx.tuple(accs)))
        expr = typed(Match(walked[k], tuple(clauses), complete=k == first), ret_type)
    importer.globals[gv] = Function(tuple(walked) + tuple(captured_vars) + tuple(accs), expr, ret_type)
    call = Call(gv, tuple(values) + tuple(outer for _, outer in captured.values()) + (nil,) * len(accs))
    call.with_type(ret_type)
    results = [in_order(ctx, ctx.get_item(call, k)) for k in range(len(outs))]  # (oldest first -> newest first)
    return results if len(results) != 1 else results[0]
