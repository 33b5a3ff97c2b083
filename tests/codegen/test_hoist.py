"""Vectorizable inner loops (tensorvm.codegen.hoist): invariant checks run once per row, and a broadcast
read on a dynamic dim is unswitched into copies with affine addresses. Every copy is run here (one
dynamic kernel, broadcast and not at run time) against NumPy, and the checks still fail where they must."""

from __future__ import annotations

import numpy as np
import pytest

from tensorvm import te
from tensorvm.codegen.loop_ir import VECTORIZED, For, IfThenElse, LetStmt, Store, walk_stmts
from tensorvm.codegen.lower import lower
from tensorvm.codegen.module import build_module
from tensorvm.errors import ExecutionError, ShapeError
from tensorvm.op._compute import broadcast_read, broadcast_shape
from tensorvm.te.expr import Call, Select
from tensorvm.te.tensor import walk


def _inner_loops(func):
    return [s for s in walk_stmts(func.body) if isinstance(s, For) and s.kind == VECTORIZED]


def _inner_exprs(loop):
    for s in walk_stmts(loop.body):
        if isinstance(s, Store):
            yield s.index
            yield s.value
        elif isinstance(s, LetStmt):
            yield s.value


def _gate():
    n, m, p, q = te.var("n"), te.var("m"), te.var("p"), te.var("q")
    a, b = te.placeholder((n, m), "float32", "a"), te.placeholder((p, q), "float32", "b")
    shape, requires = broadcast_shape("mul", a.shape, b.shape)
    out = te.compute(shape, lambda i, j: te.sigmoid(broadcast_read(a, (i, j), shape))
                     * broadcast_read(b, (i, j), shape), "gate", requires)
    return [a, b], out


def _gate3():
    """Three operands: three column conditions, more than are unswitched in every combination."""
    n, m, p, q, r, s = (te.var(x) for x in "nmpqrs")
    a, b, c = (te.placeholder(shape, "float32", name) for shape, name in (((n, m), "a"), ((p, q), "b"), ((r, s), "c")))
    shape, requires = broadcast_shape("gate3", a.shape, b.shape, c.shape)
    out = te.compute(shape, lambda i, j: (broadcast_read(a, (i, j), shape) + broadcast_read(b, (i, j), shape))
                     * broadcast_read(c, (i, j), shape), "gate3", requires)
    return [a, b, c], out


def _take_rows(lim=None):
    """``data[idx[i], j]`` with the fast index check (``lim``: only columns j < lim read, else 0)."""
    n, d, k = te.var("n"), te.var("d"), te.var("k")
    data, idx = te.placeholder((n, d), "float32", "data"), te.placeholder((k,), "int64", "idx")
    if lim is None:
        out = te.compute((k, d), lambda i, j: data[te.index_check(idx[i], n), j] * 2.0, "rows")
    else:
        out = te.compute((k, d), lambda i, j: te.select(j < lim, data[te.index_check(idx[i], n), j], 0.0), "rows")
    return [data, idx], out


@pytest.fixture(scope="module")
def module():
    gate_in, gate = _gate()
    take_in, take = _take_rows()
    guarded_in, guarded = _take_rows(lim=0)
    gate3_in, gate3 = _gate3()
    return build_module([lower("gate", gate_in, [gate]), lower("gate3", gate3_in, [gate3]),
                         lower("take_rows", take_in, [take]),
                         lower("guarded_take", guarded_in, [guarded])])


def test_broadcast_reads_are_unswitched_into_affine_copies():
    inputs, out = _gate()
    loops = _inner_loops(lower("gate", inputs, [out]))
    assert len(loops) >= 4  # one copy per combination of the two column conditions (m == 1, q == 1)
    for loop in loops:  # no copy chooses an index per element
        assert not any(isinstance(n, Select) for e in _inner_exprs(loop) for n in walk(e))


@pytest.mark.parametrize("shape_a, shape_b", [
    ((3, 37), (3, 37)), ((1, 37), (3, 37)), ((3, 1), (3, 37)), ((3, 37), (1, 1)), ((1, 1), (3, 37)),
    ((3, 1), (1, 37)), ((1, 37), (3, 1)), ((1, 1), (1, 1)), ((0, 37), (1, 37)), ((3, 0), (3, 1)),
])
def test_one_dynamic_kernel_broadcasts_or_not_at_run_time(module, shape_a, shape_b):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(shape_a).astype("float32"), rng.standard_normal(shape_b).astype("float32")
    expected = (1 / (1 + np.exp(-a.astype("float64")))) * b
    out = np.empty(expected.shape, "float32")
    module["gate"](a, b, out)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shapes", [
    ((4, 33), (4, 33), (4, 33)), ((4, 33), (1, 33), (4, 33)), ((4, 1), (4, 33), (1, 33)), ((1, 1), (1, 1), (1, 1)),
    ((4, 33), (4, 33), (4, 1)), ((1, 33), (4, 1), (1, 1)),
])
def test_fast_copy_and_general_loop_beyond_the_unswitch_bound(module, shapes):
    inputs, out = _gate3()
    loops = _inner_loops(lower("gate3", inputs, [out]))
    assert sum(not any(isinstance(n, Select) for e in _inner_exprs(loop) for n in walk(e)) for loop in loops) >= 1
    rng = np.random.default_rng(2)
    a, b, c = (rng.standard_normal(s).astype("float32") for s in shapes)
    expected = (a + b) * c
    result = np.empty(expected.shape, "float32")
    module["gate3"](a, b, c, result)
    np.testing.assert_allclose(result, expected, rtol=1e-6)


def test_broadcast_mismatch_still_raises(module):
    a, b = np.ones((3, 4), "float32"), np.ones((3, 5), "float32")
    with pytest.raises(ShapeError, match="cannot broadcast"):
        module["gate"](a, b, np.empty((3, 4), "float32"))


def test_index_check_runs_once_per_row():
    inputs, out = _take_rows()
    func = lower("take_rows", inputs, [out])
    loops = [s for s in walk_stmts(func.body) if isinstance(s, For) and s.loop_var.name == "j"]
    assert loops
    for loop in loops:
        assert not any(isinstance(n, Call) and n.name == "index_check" for e in _inner_exprs(loop) for n in walk(e))
    guards = [s for s in walk_stmts(func.body) if isinstance(s, IfThenElse)]
    assert guards  # the hoisted check (which reads idx) runs only when the row loop runs


@pytest.mark.parametrize("rows, width", [(4, 19), (1, 1), (5, 0)])
def test_fast_take_with_hoisted_check_matches_numpy(module, rows, width):
    rng = np.random.default_rng(1)
    data = rng.standard_normal((rows, width)).astype("float32")
    for idx in (np.array(v, "int64") for v in ([0], [rows - 1, -rows, -1], [])):
        out = np.empty((len(idx), width), "float32")
        module["take_rows"](data, idx, out)
        np.testing.assert_array_equal(out, data[idx] * 2.0)


@pytest.mark.parametrize("bad", [4, -5, 100])
def test_fast_take_out_of_range_still_raises(module, bad):
    data = np.ones((4, 8), "float32")
    idx = np.array([0, bad, 1], "int64")
    with pytest.raises(ExecutionError, match="out of range|index"):
        module["take_rows"](data, idx, np.empty((3, 8), "float32"))


def test_check_under_a_branch_not_taken_is_not_hoisted(module):
    # Every element takes the select's 0 branch: the index is never read, so it is never checked.
    data, idx = np.ones((4, 8), "float32"), np.array([0, 99], "int64")
    out = np.full((2, 8), 7.0, "float32")
    module["guarded_take"](data, idx, out)
    np.testing.assert_array_equal(out, np.zeros((2, 8), "float32"))
