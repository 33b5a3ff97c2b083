"""0-d values through AOT and the graph executor: folded constant results, computed results, 0-d
inputs and tuples of 0-d values keep the interpreter's shape ``()`` (issue 16, defect 7)."""

import numpy as np
import pytest

import tensorvm as tv

SCALAR_PROGRAMS = [
    ("folded_add", "def @main() { add(1, 1) }", []),
    ("folded_float_add", "def @main() { add(1f, 2f) }", []),
    ("folded_projection", "def @main() { (1, 2).0 }", []),
    ("let_bound_constant", "def @main() { let %a = 3f; %a }", []),
    ("folded_ones", "def @main() { ones(shape=[], dtype=float32) }", []),
    ("tuple_of_folded", "def @main() { (add(1f, 1f), 2f) }", []),
    ("nested_tuple_of_folded", "def @main() { ((1, 2), (3f,)) }", []),
    ("scalar_input", "def @main(%x: float32) { add(%x, 1f) }", [np.float32(2.5)]),
    ("scalar_identity", "def @main(%x: int32) { %x }", [np.int32(7)]),
    ("scalar_tuple_mixed", "def @main(%x: float32) { (%x, multiply(%x, %x), 4f) }", [np.float32(-1.5)]),
    ("scalar_tuple_input", "def @main(%t: (float32, float32)) { add(%t.0, %t.1) }",
     [(np.float32(1.25), np.float32(2.0))]),
]


def _tree(value):
    if isinstance(value, tuple):
        return tuple(_tree(v) for v in value)
    return np.asarray(value.numpy() if hasattr(value, "numpy") else value)


def _assert_same(got, expected, where):
    if isinstance(expected, tuple):
        assert isinstance(got, tuple) and len(got) == len(expected), where
        for i, (g, e) in enumerate(zip(got, expected)):
            _assert_same(g, e, f"{where}.{i}")
        return
    got = np.asarray(got)
    assert got.shape == expected.shape, f"{where}: shape {got.shape}, the interpreter gives {expected.shape}"
    assert got.dtype == expected.dtype, f"{where}: dtype {got.dtype}, the interpreter gives {expected.dtype}"
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("executor", ["aot", "graph"])
@pytest.mark.parametrize("name, source, args", SCALAR_PROGRAMS, ids=[p[0] for p in SCALAR_PROGRAMS])
def test_zero_d_values_keep_their_shape(name, source, args, executor):
    mod = tv.parse(source)
    expected = _tree(tv.create_executor("debug", mod).evaluate()(*args))
    got = _tree(tv.create_executor(executor, mod).evaluate()(*args))
    _assert_same(got, expected, f"{name} on {executor}")
