"""Converters of ONNX control flow: ``If`` becomes an ``if``; ``Loop`` and ``Scan`` become recursive
global functions, so a loop whose trip count is only known at run time runs on the VM (where a
call in tail position reuses its frame).

The function made for a ``Loop`` takes the iteration number, the trip limit, the condition, the
loop-carried values, one accumulator per scan output and every outer value the body reads::

    def @loop(%i, %limit, %cond, %v..., %acc..., %captured...) {
      if (%i < %limit && %cond) {
        <body>;  @loop(%i + 1, %limit, %cond_out, %v_out..., append(%acc, %elem)..., %captured...)
      } else { (%v..., %acc...) }
    }

A scan output is collected as a list (the prelude's ``List``, newest slice first: one ``Cons`` per
iteration, no tensor copied) and stacked once after the loop, into one buffer the size of the iteration
count that a second recursive function fills row by row in place (``transform/update_in_place.py``): linear
in the number of iterations, where growing a tensor by ``concatenate`` every iteration was quadratic.
Loop-carried values whose shape changes between iterations get ``Any`` dims: the body is converted
once with the initial types and again with the differing dims generalized.
"""

from __future__ import annotations

import numpy as np

from ..errors import ModelImportError, TypeInferenceError, UnsupportedError
from ..ir.expr import Call, Clause, Function, Let, Match, PatternConstructor, PatternVar, PatternWildcard, Var
from ..ir.types import TensorType, TupleType
from .onnx_context import converter, generalize, join_types
from .onnx_lists import (
    as_list,
    is_list,
    is_option,
    joined_elem,
    list_adt,
    list_type,
    option_adt,
    option_type,
    rows_type,
    stacked,
    typed,
    widen_sequence,
)

INT64_MAX = np.iinfo(np.int64).max


def _scalar_bool(ctx, cond):
    cond = ctx.cast(cond, "bool")
    return cond if ctx.ndim(cond) == 0 else ctx.call("reshape", cond, newshape=())


def _single(ctx, outputs):
    return outputs[0] if len(outputs) == 1 else ctx.tuple(outputs)


def _check_joinable(tt, et) -> None:
    """An output of both branches: tensors of one rank and dtype, or sequences (tuples) of one length
    whose tensors are."""
    if isinstance(tt, TupleType) and isinstance(et, TupleType):
        if len(tt.fields) != len(et.fields):
            raise UnsupportedError(f"If: the branches produce sequences of {len(tt.fields)} and {len(et.fields)} "
                                   "tensors; tensorvm needs a sequence's length known at import")
        for a, b in zip(tt.fields, et.fields, strict=True):
            _check_joinable(a, b)
        return
    if (is_list(tt) and is_list(et)) or (is_option(tt) and is_option(et)):
        _check_joinable(tt.args[0], et.args[0])
        return
    if not isinstance(tt, TensorType) or not isinstance(et, TensorType):
        raise UnsupportedError(f"If: the branches produce {tt} and {et}; expected tensors or sequences of both")
    if tt.ndim != et.ndim or tt.dtype != et.dtype:
        raise UnsupportedError(f"If: the branches produce {tt!r} and {et!r}; tensorvm needs one rank and dtype")


@converter("If", 1)
def if_1(ctx, cond, *, then_branch, else_branch):
    condition = _scalar_bool(ctx, cond)
    known = ctx.value(condition)
    importer, scope = ctx.importer, ctx.scope
    if known is not None:  # a constant condition: only the taken branch exists
        taken = then_branch if bool(known) else else_branch
        outs = importer.import_branch(taken, scope)
        return outs if len(outs) > 1 else outs[0]
    then_outs = importer.import_branch(then_branch, scope)
    else_outs = importer.import_branch(else_branch, scope)
    if len(then_outs) != len(else_outs):
        raise TypeInferenceError(f"If: the branches have {len(then_outs)} and {len(else_outs)} outputs")
    for t, e in zip(then_outs, else_outs, strict=True):
        _check_joinable(ctx.type_of(t), ctx.type_of(e))
    node = ctx.if_(condition, _single(ctx, then_outs), _single(ctx, else_outs))
    if len(then_outs) == 1:
        return node
    return [ctx.get_item(node, i) for i in range(len(then_outs))]


def _declared_rank(value_info):
    tt = value_info.type.tensor_type if value_info.type.HasField("tensor_type") else None
    if tt is None or not tt.HasField("shape"):
        return None
    return len(tt.shape.dim)


def _as_declared(ctx, value, value_info):
    """A scalar as the body declares it (some exporters use shape [1] for the counter and condition)."""
    if _declared_rank(value_info) == 1 and ctx.ndim(value) == 0:
        return ctx.call("expand_dims", value, axis=0)
    return value


def _widen(declared, produced):
    """``declared`` with every dim that ``produced`` does not match turned into ``Any``; a carried
    sequence whose length the body changes becomes a ``List`` (``onnx_lists.widen_sequence``)."""
    sequence = widen_sequence(declared, produced)
    return sequence if sequence is not None else join_types(declared, produced)


def _convert_body(ctx, body, fixed_types, carried_types, tries=3):
    """Import ``body`` with the given parameter types, widening carried types until they are stable.

    Returns (params, outputs, captured, carried_types)."""
    importer = ctx.importer
    for _ in range(tries):
        params, outs, captured = importer.import_body(body, ctx.scope, list(fixed_types) + list(carried_types))
        produced = [ctx.type_of(o) for o in outs[1:1 + len(carried_types)]] if len(fixed_types) == 2 else \
            [ctx.type_of(o) for o in outs[:len(carried_types)]]
        widened = [_widen(c, p) for c, p in zip(carried_types, produced, strict=True)]
        if widened == list(carried_types):
            return params, outs, captured, carried_types
        carried_types = widened
    raise TypeInferenceError("the loop body's carried values do not settle on a type")


def _tensor_types(ctx, values, what):
    types = []
    for v in values:
        ty = ctx.type_of(v)
        if not isinstance(ty, TensorType):
            raise UnsupportedError(f"{what}: only tensor values are supported (not sequences or optionals)")
        types.append(generalize(ty))
    return types


@converter("Loop", 1)
def loop_1(ctx, M=None, cond=None, *v_initial, body):
    importer = ctx.importer
    n_carried = len(v_initial)
    n_scan = len(body.output) - 1 - n_carried
    if n_scan < 0:
        raise TypeInferenceError(f"Loop: the body has {len(body.output)} outputs for {n_carried} carried values")
    scalar_i64, scalar_bool = TensorType((), "int64"), TensorType((), "bool")
    iter_decl = TensorType((1,), "int64") if _declared_rank(body.input[0]) == 1 else scalar_i64
    cond_decl = TensorType((1,), "bool") if _declared_rank(body.input[1]) == 1 else scalar_bool
    carried_types = [generalize(ctx.type_of(v)) for v in v_initial]  # (tensors, or sequences: onnx_lists)
    params, outs, captured, carried_types = _convert_body(ctx, body, [iter_decl, cond_decl], carried_types)
    v_initial = [as_list(ctx, v, ty.args[0]) if is_list(ty) else v for v, ty in zip(v_initial, carried_types,
                                                                                   strict=True)]
    iter_param, cond_param, carried_params = params[0], params[1], params[2:]
    scan_elems = outs[1 + n_carried:]
    elem_types = [ctx.type_of(e) for e in scan_elems]
    for ty in elem_types:
        if not isinstance(ty, TensorType):
            raise UnsupportedError("Loop: only tensor scan outputs are supported (not sequences or optionals)")
    acc_types = [list_type(ty) for ty in elem_types]
    cons, nil = list_adt(importer) if scan_elems else (None, None)

    i = Var("i", scalar_i64)
    limit = Var("limit", scalar_i64)
    go = Var("cond", scalar_bool)
    accs = [Var(f"acc{k}", t) for k, t in enumerate(acc_types)]
    captured_vars = [var for var, _ in captured.values()]
    captured_values = [outer for _, outer in captured.values()]
    gv = importer.fresh_global("loop")
    ret_type = TupleType(tuple(carried_types) + tuple(acc_types) + (scalar_i64,))  # (and the iterations run)

    new_accs = []
    for acc, elem in zip(accs, scan_elems, strict=True):  # (the slice in front: newest first)
        grown = Call(cons, (elem, acc))
        grown.with_type(acc.type_annotation)
        new_accs.append(grown)
    next_i = ctx.call("add", i, ctx.constant(np.array(1, np.int64)))
    recurse = Call(gv, (next_i, limit, _scalar_bool(ctx, outs[0])) + tuple(outs[1:1 + n_carried])
                   + tuple(new_accs) + tuple(captured_vars))
    recurse.with_type(ret_type)
    step = recurse
    # The body reads its counter and condition through its own (declared) parameters.
    step = Let(cond_param, _as_declared(ctx, go, body.input[1]), step)
    step = Let(iter_param, _as_declared(ctx, i, body.input[0]), step)
    step.with_type(ret_type)
    done = ctx.tuple(list(carried_params) + accs + [i])
    keep_going = ctx.call("logical_and", ctx.call("less", i, limit), go)
    fn_body = ctx.if_(keep_going, step, done)
    fn = Function((i, limit, go) + tuple(carried_params) + tuple(accs) + tuple(captured_vars), fn_body, ret_type)
    importer.globals[gv] = fn

    trip = _scalar(ctx, ctx.cast(M, "int64")) if M is not None else ctx.constant(np.array(INT64_MAX, np.int64))
    start_cond = _scalar_bool(ctx, cond) if cond is not None else ctx.constant(np.array(True))
    init_accs = [nil] * len(acc_types)  # (Nil: the lists start empty)
    call = Call(gv, (ctx.constant(np.array(0, np.int64)), trip, start_cond) + tuple(v_initial) + tuple(init_accs)
                + tuple(captured_values))
    call.with_type(ret_type)
    count = ctx.get_item(call, n_carried + n_scan)
    results = [ctx.get_item(call, k) for k in range(n_carried)]
    results += [stacked(ctx, ctx.get_item(call, n_carried + k), count, ty) for k, ty in enumerate(elem_types)]
    return results if len(results) != 1 else results[0]


def _scalar(ctx, x):
    return x if ctx.ndim(x) == 0 else ctx.call("reshape", x, newshape=())


@converter("Scan", 9)
def scan_9(ctx, *inputs, body, num_scan_inputs, scan_input_axes=None, scan_input_directions=None,
           scan_output_axes=None, scan_output_directions=None):
    if not 1 <= num_scan_inputs <= len(inputs):
        raise ModelImportError(f"Scan: expected num_scan_inputs in [1, {len(inputs)}] (the node's inputs), got "
                               f"{num_scan_inputs}")
    n_state = len(inputs) - num_scan_inputs
    states, scan_inputs = inputs[:n_state], inputs[n_state:]
    in_axes = [a % ctx.ndim(x) for a, x in zip(scan_input_axes or [0] * num_scan_inputs, scan_inputs, strict=True)]
    n_scan_out = len(body.output) - n_state
    out_axes = list(scan_output_axes or [0] * n_scan_out)
    out_dirs = list(scan_output_directions or [0] * n_scan_out)
    elem_types = []
    for x, axis in zip(scan_inputs, in_axes, strict=True):
        ty = generalize(ctx.tensor_type(x))
        elem_types.append(TensorType(ty.shape[:axis] + ty.shape[axis + 1:], ty.dtype))
    scan = _scan_function(ctx, body, _tensor_types(ctx, states, "Scan"), elem_types,
                          [generalize(ctx.type_of(x)) for x in scan_inputs], in_axes,
                          list(scan_input_directions or [0] * num_scan_inputs))
    trip = ctx.dim_value(scan_inputs[0], in_axes[0])
    call = scan.call(ctx, trip, list(states), list(scan_inputs), scan.captured_values)
    results = [ctx.get_item(call, k) for k in range(n_state)]
    for k in range(n_scan_out):
        out = stacked(ctx, ctx.get_item(call, n_state + k), trip, scan.scan_types[k])
        if out_dirs[k]:
            out = ctx.call("reverse", out, axis=0)
        axis = out_axes[k] % ctx.ndim(out)
        if axis:
            order = list(range(1, axis + 1)) + [0] + list(range(axis + 1, ctx.ndim(out)))
            out = ctx.call("transpose", out, axes=tuple(order))
        results.append(out)
    return results if len(results) != 1 else results[0]


class _ScanFunction:
    """``@scan(i, length, states..., accs..., inputs..., captured...)``, made from a Scan's body: steps
    ``i`` to ``length`` - 1 of the scan (an input's element of step ``i`` a ``take`` along its axis, from
    the end for a reversed one), each scan output collected in a List; returns (states..., Lists...)."""

    def __init__(self, gv, ret_type, n_accs, captured_values, state_types, scan_types):
        self.gv, self.ret_type, self.n_accs = gv, ret_type, n_accs
        self.captured_values, self.state_types, self.scan_types = captured_values, state_types, scan_types

    def call(self, ctx, trip, states: list, scan_inputs: list, captured: list):
        _, nil = list_adt(ctx.importer)
        call = Call(self.gv, (ctx.constant(np.array(0, np.int64)), trip) + tuple(states) + (nil,) * self.n_accs
                    + tuple(scan_inputs) + tuple(captured))
        call.with_type(self.ret_type)
        return call


def _scan_function(ctx, body, state_types, elem_types, input_types, in_axes, in_dirs) -> _ScanFunction:
    importer = ctx.importer
    n_state = len(state_types)
    scalar_i64 = TensorType((), "int64")
    i = Var("i", scalar_i64)
    length = Var("length", scalar_i64)
    full_inputs = [Var(f"scan_in{k}", ty) for k, ty in enumerate(input_types)]
    for _ in range(3):
        params, outs, captured = importer.import_body(body, ctx.scope, list(state_types) + elem_types)
        produced = [ctx.type_of(o) for o in outs[:n_state]]
        widened = [_widen(c, p) for c, p in zip(state_types, produced, strict=True)]
        if widened == list(state_types):
            break
        state_types = widened
    else:
        raise TypeInferenceError("Scan: the body's state values do not settle on a type")
    state_params, elem_params = params[:n_state], params[n_state:]
    scan_elems = outs[n_state:]
    scan_types = [ctx.tensor_type(e, "scan output") for e in scan_elems]
    acc_types = [list_type(ty) for ty in scan_types]
    accs = [Var(f"acc{k}", t) for k, t in enumerate(acc_types)]
    captured_vars = [var for var, _ in captured.values()]
    gv = importer.fresh_global("scan")
    ret_type = TupleType(tuple(state_types) + tuple(acc_types))

    cons, _ = list_adt(importer)
    new_accs = []
    for acc, elem in zip(accs, scan_elems, strict=True):  # (the slice in front: newest first)
        grown = Call(cons, (elem, acc))
        grown.with_type(acc.type_annotation)
        new_accs.append(grown)
    next_i = ctx.call("add", i, ctx.constant(np.array(1, np.int64)))
    recurse = Call(gv, (next_i, length) + tuple(outs[:n_state]) + tuple(new_accs) + tuple(full_inputs)
                   + tuple(captured_vars))
    recurse.with_type(ret_type)
    step = recurse
    last = ctx.call("subtract", ctx.call("subtract", length, i), ctx.constant(np.array(1, np.int64)))
    for param, full, axis, direction in zip(elem_params, full_inputs, in_axes, in_dirs, strict=True):
        index = last if direction else i
        step = Let(param, ctx.call("take", full, index, axis=axis, mode="fast"), step)
    step.with_type(ret_type)
    done = ctx.tuple(list(state_params) + accs)
    fn_body = ctx.if_(ctx.call("less", i, length), step, done)
    importer.globals[gv] = Function((i, length) + tuple(state_params) + tuple(accs) + tuple(full_inputs)
                                    + tuple(captured_vars), fn_body, ret_type)
    return _ScanFunction(gv, ret_type, len(acc_types), [outer for _, outer in captured.values()],
                         list(state_types), scan_types)


@converter("Scan", 8)
def scan_8(ctx, sequence_lens=None, *inputs, body, num_scan_inputs, directions=None):
    """Opset 8's Scan: every state and scan input has a batch axis first (a scan input's sequence axis
    second), the body sees one batch entry, and ``sequence_lens`` (per entry, in [1, the sequence axis's
    length] as ONNX Runtime requires; all of it when absent) says how many steps each runs; a scan
    output's steps past its entry's length are zeros. A
    recursive ``@scan8`` walks the batch, running the scan function of opset 9's Scan on each entry's slices
    (``_scan_function``) and collecting each entry's final states and stacked outputs in Lists, stacked
    after it."""
    if not 1 <= num_scan_inputs <= len(inputs):
        raise ModelImportError(f"Scan: expected num_scan_inputs in [1, {len(inputs)}] (the node's inputs after "
                               f"sequence_lens), got {num_scan_inputs}")
    importer = ctx.importer
    n_state = len(inputs) - num_scan_inputs
    states, scan_inputs = list(inputs[:n_state]), list(inputs[n_state:])
    if any(ctx.ndim(x) < 1 for x in states) or any(ctx.ndim(x) < 2 for x in scan_inputs):
        raise ModelImportError("Scan (opset 8): expected a batch axis first on every state and a sequence axis "
                               "after it on every scan input, got ranks "
                               f"{[ctx.ndim(x) for x in states]} and {[ctx.ndim(x) for x in scan_inputs]}")
    in_dirs = list(directions or [0] * num_scan_inputs)
    if len(in_dirs) != num_scan_inputs:
        raise ModelImportError(f"Scan: expected {num_scan_inputs} directions, got {len(in_dirs)}")
    full_types = [generalize(ctx.tensor_type(v)) for v in states + scan_inputs]

    def drop(ty, count):
        return TensorType(ty.shape[count:], ty.dtype)

    state_types = [drop(ty, 1) for ty in full_types[:n_state]]
    entry_types = [drop(ty, 1) for ty in full_types[n_state:]]
    scan = _scan_function(ctx, body, state_types, [drop(ty, 2) for ty in full_types[n_state:]], entry_types,
                          [0] * num_scan_inputs, in_dirs)
    scalar_i64 = TensorType((), "int64")
    seq = ctx.dim_value(scan_inputs[0], 1)
    cons, nil = list_adt(importer)

    # @scan8(b, n, seq, lens, states..., inputs..., final Lists..., output Lists..., captured...)
    b, n, seq_var = Var("b", scalar_i64), Var("n", scalar_i64), Var("seq", scalar_i64)
    lens = None if sequence_lens is None else Var("lens", generalize(ctx.tensor_type(sequence_lens)))
    full_vars = [Var(f"full{k}", ty) for k, ty in enumerate(full_types)]
    captured_vars = [Var(f"captured{k}", ctx.type_of(v)) for k, v in enumerate(scan.captured_values)]
    rows_types = [rows_type(ty) for ty in scan.scan_types]
    final_lists = [Var(f"finals{k}", list_type(ty)) for k, ty in enumerate(scan.state_types)]
    output_lists = [Var(f"outputs{k}", list_type(ty)) for k, ty in enumerate(rows_types)]
    at_b = [ctx.call("take", v, b, axis=0, mode="fast") for v in full_vars]
    if lens is None:
        trip = seq_var
    else:  # (a length outside [1, seq], as ONNX Runtime's, is an index error: a place past the places 0 .. seq)
        given = ctx.cast(ctx.call("take", lens, b, axis=0, mode="fast"), "int64")
        past = ctx.call("add", seq_var, ctx.constant(np.array(1, np.int64)))
        place = ctx.call("where", ctx.call("less", given, ctx.constant(np.array(1, np.int64))), past, given)
        trip = ctx.call("take", ctx.call("arange", ctx.constant(np.array(0, np.int64)), past,
                                         ctx.constant(np.array(1, np.int64)), dtype="int64"), place, axis=0,
                        mode="fast")
    entry = Var("entry", scan.ret_type)
    length = Var("length", scalar_i64)
    grown = []
    for k, lst in enumerate(final_lists):
        grown.append(typed(Call(cons, (ctx.get_item(entry, k), lst)), lst.type_annotation))
    for k, (lst, ty) in enumerate(zip(output_lists, scan.scan_types, strict=True)):
        rows = stacked(ctx, ctx.get_item(entry, n_state + k), length, ty)
        if lens is not None:  # zeros after the entry's steps, up to the sequence axis's length
            dims = [ctx.call("expand_dims", ctx.call("subtract", seq_var, length), axis=0)]
            if ty.ndim:
                dims.append(ctx.call("take", ctx.shape_of(rows), ctx.constant(np.arange(1, ty.ndim + 1)), axis=0))
            pad_shape = ctx.call("concatenate", ctx.tuple(dims), axis=0) if ty.ndim else dims[0]
            zeros = ctx.call("dyn.zeros", pad_shape, dtype=ty.dtype)
            rows = ctx.call("concatenate", ctx.tuple([rows, zeros]), axis=0)
        grown.append(typed(Call(cons, (rows, lst)), lst.type_annotation))
    gv = importer.fresh_global("scan8")
    lens_params = (lens,) if lens is not None else ()
    ret_type = TupleType(tuple(v.type_annotation for v in final_lists + output_lists))
    recurse = typed(Call(gv, (ctx.call("add", b, ctx.constant(np.array(1, np.int64))), n, seq_var)
                               + lens_params + tuple(full_vars) + tuple(grown) + tuple(captured_vars)), ret_type)
    step = Let(length, trip, Let(entry, scan.call(ctx, length, at_b[:n_state], at_b[n_state:], captured_vars),
                                 recurse))
    step.with_type(ret_type)
    done = ctx.tuple(final_lists + output_lists)
    importer.globals[gv] = Function((b, n, seq_var) + lens_params + tuple(full_vars) + tuple(final_lists)
                                    + tuple(output_lists) + tuple(captured_vars),
                                    ctx.if_(ctx.call("less", b, n), step, done), ret_type)
    batch = ctx.dim_value(states[0] if states else scan_inputs[0], 0)
    lens_args = (sequence_lens,) if sequence_lens is not None else ()
    call = typed(Call(gv, (ctx.constant(np.array(0, np.int64)), batch, seq) + lens_args
                            + tuple(states + scan_inputs) + (nil,) * (len(final_lists) + len(output_lists))
                            + tuple(scan.captured_values)), ret_type)
    results = [stacked(ctx, ctx.get_item(call, k), batch, ty) for k, ty in enumerate(scan.state_types)]
    results += [stacked(ctx, ctx.get_item(call, n_state + k), batch, ty) for k, ty in enumerate(rows_types)]
    return results if len(results) != 1 else results[0]


# ---- optionals: the prelude's Option (an omitted input is known absent at import) ------------------------
def _option_of(ctx, value, op: str):
    """``value`` as an optional: an Option as is; a tensor or a sequence as present (Some)."""
    ty = ctx.type_of(value)
    if is_option(ty):
        return value
    if not (isinstance(ty, TensorType) or is_list(ty)
            or (isinstance(ty, TupleType) and all(isinstance(f, TensorType) for f in ty.fields))):
        raise UnsupportedError(f"{op}: a {ty!r} input is not supported")
    if isinstance(ty, TupleType):  # (an optional sequence is an optional List, whatever its length)
        if not ty.fields:
            raise UnsupportedError(f"{op}: an empty sequence, whose tensors' type is unknown")
        value = as_list(ctx, value, joined_elem(list(ty.fields), op))
        ty = ctx.type_of(value)
    some, _ = option_adt(ctx.importer)
    node = Call(some, (value,))
    node.with_type(option_type(ty))
    return node


@converter("Optional", 15)
def optional_15(ctx, input=None, *, type=None):  # noqa: A002
    if input is not None:
        return _option_of(ctx, input, "Optional")
    if type is None:
        raise ModelImportError("Optional: an empty optional needs its type attribute")
    from .onnx_importer import value_type

    ty = option_type(value_type(type, "Optional: type"))
    # (None through a one-line function returning it: the call carries the optional's type, where the
    # constructor node itself is shared by every use)
    gv = ctx.importer.fresh_global("optional_none")
    ctx.importer.globals[gv] = Function((), option_adt(ctx.importer)[1], ty)
    call = Call(gv, ())
    call.with_type(ty)
    return call


@converter("OptionalHasElement", 15)
def optional_has_element_15(ctx, input=None):  # noqa: A002
    if input is None:
        return ctx.constant(np.array(False))
    option = _option_of(ctx, input, "OptionalHasElement")
    if not is_option(ctx.type_of(input)):
        return ctx.constant(np.array(True))
    some, none = option_adt(ctx.importer)
    node = Match(option, (Clause(PatternConstructor(some, (PatternWildcard(),)), ctx.constant(np.array(True))),
                          Clause(PatternConstructor(none, ()), ctx.constant(np.array(False)))))
    node.with_type(TensorType((), "bool"))
    return node


@converter("OptionalGetElement", 15)
def optional_get_element_15(ctx, input):  # noqa: A002
    ty = ctx.type_of(input)
    if not is_option(ty):
        _option_of(ctx, input, "OptionalGetElement")  # (the check)
        return ctx.call("copy", input) if isinstance(ty, TensorType) else input
    some, _ = option_adt(ctx.importer)
    inner = Var("value", ty.args[0])
    node = Match(input, (Clause(PatternConstructor(some, (PatternVar(inner),)), inner),), complete=False)
    node.with_type(ty.args[0])  # (an empty optional fails the match: an error)
    return node
