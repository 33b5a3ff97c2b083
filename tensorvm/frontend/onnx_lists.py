"""Converters of ONNX's sequence ops (lists of tensors) whose length is known at import: a sequence is a
tuple of its tensors.

SequenceEmpty, SequenceConstruct, SequenceInsert, SequenceErase, SequenceAt, SequenceLength,
SplitToSequence, ConcatFromSequence and SequenceMap (its body imported once per element). The tensors may differ in shape (ONNX allows it); they share a
dtype. A position is a constant or a run-time scalar: a constant one is checked at import, a run-time one
picks the tensors with ``if`` chains (their types joined: differing dims become ``Any``, so a run-time
position over tensors of different ranks is refused) and is an index error at run time when out of range,
never wrapped. A sequence whose length depends on run-time values (one grown in a ``Loop``, split into a
run-time number of parts) is refused by name, as are sequences as graph inputs or outputs.
"""

from __future__ import annotations

import numpy as np

from ..errors import ModelImportError, TypeInferenceError, UnsupportedError
from ..ir.expr import Tuple
from ..ir.types import TupleType
from .onnx_context import converter
from .onnx_shape import _int64, run_time_index, split_sizes, squeeze_axes, unsqueeze_axes


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


def _position(ctx, position, low: int, high: int, count: int, op: str):
    """``position`` (valid in [low, high), negative counting back from ``count``) as a Python int when
    constant (checked), else as a run-time int64 place (an index error at run time when out of range)."""
    value = ctx.value(position)
    if value is None:
        return run_time_index(ctx, position, low, high, count)
    if value.size != 1:
        raise ModelImportError(f"{op}: expected a scalar position, got shape {value.shape}")
    index = int(value.reshape(()))
    if not low <= index < high:
        raise ModelImportError(f"{op}: position {index} is out of range [{low}, {high - 1}] for a sequence of "
                               f"{count} tensors")
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


@converter("SequenceEmpty", 11)
def sequence_empty_11(ctx, *, dtype=None):
    return ctx.tuple([])


@converter("SequenceConstruct", 11)
def sequence_construct_11(ctx, *inputs):
    return _sequence(ctx, list(inputs))


@converter("SequenceLength", 11)
def sequence_length_11(ctx, input_sequence):
    return ctx.constant(np.array(len(_items(ctx, input_sequence, "SequenceLength")), np.int64))


@converter("SequenceAt", 11)
def sequence_at_11(ctx, input_sequence, position):
    items = _items(ctx, input_sequence, "SequenceAt")
    if not items:
        raise ModelImportError("SequenceAt: the sequence is empty")
    place = _position(ctx, position, -len(items), len(items), len(items), "SequenceAt")
    return items[place] if isinstance(place, int) else _pick(ctx, place, items)


@converter("SequenceInsert", 11)
def sequence_insert_11(ctx, input_sequence, tensor, position=None):
    items = _items(ctx, input_sequence, "SequenceInsert")
    n = len(items)
    place = n if position is None else _position(ctx, position, -n, n + 1, n, "SequenceInsert")
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
    items = _items(ctx, input_sequence, "SequenceErase")
    n = len(items)
    if not n:
        raise ModelImportError("SequenceErase: the sequence is empty")
    place = n - 1 if position is None else _position(ctx, position, -n, n, n, "SequenceErase")
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
    if not isinstance(dim, int):
        raise UnsupportedError(f"SplitToSequence: the number of parts depends on axis {axis}'s run-time length")
    if split is None:  # parts of one, the axis dropped unless keepdims
        parts = split_sizes(ctx, input, axis, [1] * dim, dim) if dim else []
        return _sequence(ctx, parts if keepdims else [squeeze_axes(ctx, p, [axis]) for p in parts])
    size = ctx.value(split)
    if size is None:
        raise UnsupportedError("SplitToSequence: the number of parts depends on a run-time split size")
    size = int(np.asarray(size).reshape(()))
    if size <= 0:
        raise ModelImportError(f"SplitToSequence: the split size must be positive, got {size}")
    sizes = [size] * (dim // size) + ([dim % size] if dim % size else [])
    return _sequence(ctx, split_sizes(ctx, input, axis, sizes, len(sizes)) if sizes else [])


@converter("ConcatFromSequence", 11)
def concat_from_sequence_11(ctx, input_sequence, *, axis, new_axis=0):
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
    (a tensor input is given to every application): the body imported once per element."""
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
    if len(body.input) != 1 + len(additional_inputs):
        raise ModelImportError(f"SequenceMap: the body takes {len(body.input)} inputs, the node gives "
                               f"{1 + len(additional_inputs)}")
    applied = [ctx.importer.import_branch(body, ctx.scope, [item, *(column[i] for column in columns)])
               for i, item in enumerate(items)]
    outputs = [_sequence(ctx, [outs[k] for outs in applied]) for k in range(len(body.output))]
    return outputs if len(outputs) != 1 else outputs[0]
