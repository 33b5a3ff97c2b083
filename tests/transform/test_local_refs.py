"""LocalRefsToValues: references that stay in the function creating them run on every executor, with the
interpreter's results (each program's answer is also computed here in NumPy); references that leave
their function are left for the VM to refuse with its error."""

from __future__ import annotations

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.ir.expr import RefCreate, RefRead, RefWrite
from tensorvm.transform.local_refs import LocalRefsToValues
from tensorvm.transform.to_anf import post_order_iter

HEADER = '#[version = "0.0.5"]\n'

STRAIGHT = """
def @main(%x: Tensor[(2, 3), float32]) {
  let %r = ref(%x);
  ref_write(%r, add(ref_read(%r), 1f));
  let %a = ref_read(%r);
  ref_write(%r, multiply(%a, ref_read(%r)));
  (ref_read(%r), %a, ref_write(%r, %x))
}
"""

BRANCHES = """
def @main(%x: Tensor[(?, 3), float32], %n: int32) {
  let %r = ref(%x);
  let %k = ref(0);
  let %c = if (greater(%n, 2)) {
    ref_write(%r, concatenate((ref_read(%r), %x), axis=0));
    if (greater(%n, 4)) { ref_write(%k, 2); 10 } else { ref_write(%k, 1); 20 }
  } else {
    let %local = ref(multiply(%x, 2f));
    ref_write(%local, add(ref_read(%local), 1f));
    ref_write(%r, ref_read(%local));
    30
  };
  ref_write(%k, add(ref_read(%k), %c));
  (ref_read(%r), ref_read(%k), shape_of(ref_read(%r)))
}
"""

MATCH = """
type Shape { Square(float32), Rect(float32, float32), Empty, }
def @area(%s: Shape) -> float32 {
  let %acc = ref(0f);
  let %sides = ref(0);
  match (%s) {
    Square(%a) => { ref_write(%acc, multiply(%a, %a)); ref_write(%sides, 4) },
    Rect(%a, %b) => { ref_write(%acc, multiply(%a, %b)); ref_write(%sides, 4) },
    Empty => (),
  };
  add(ref_read(%acc), cast(ref_read(%sides), dtype="float32"))
}
def @main(%a: float32, %b: float32) {
  (@area(Square(%a)), @area(Rect(%a, %b)), @area(Empty))
}
"""

RECURSION = """
def @sum_to(%n: int32, %x: Tensor[(?), float32]) -> Tensor[(?), float32] {
  let %r = ref(%x);
  if (greater(%n, 0)) {
    ref_write(%r, add(ref_read(%r), cast(%n, dtype="float32")));
    @sum_to(subtract(%n, 1), ref_read(%r))
  } else {
    ref_read(%r)
  }
}
def @main(%x: Tensor[(?), float32], %n: int32) {
  let %scale = fn (%y: Tensor[(?), float32]) {
    let %s = ref(%y);
    ref_write(%s, multiply(ref_read(%s), 2f));
    ref_read(%s)
  };
  %scale(@sum_to(%n, %x))
}
"""

ESCAPING = """
def @main(%x: Tensor[(2), float32]) {
  let %r = ref(%x);
  let %bump = fn () { ref_write(%r, add(ref_read(%r), 1f)) };
  %bump();
  %bump();
  ref_read(%r)
}
"""


def _executors(static: bool) -> list:
    kinds = ["vm", "bytecode", "native", "bytecode_saved", "native_saved", "python"]
    return kinds + (["graph", "aot"] if static else [])


def _run(kind: str, mod, *args):
    if kind == "debug":
        return tv.create_executor("debug", mod=mod).evaluate()(*args)
    if kind == "vm":
        return tv.create_executor("vm", mod=mod, target="c").evaluate()(*args)
    if kind in ("graph", "aot"):
        return tv.create_executor(kind, mod=mod).evaluate()(*args)
    if kind == "python":
        exe = tv.vm.compile(mod, target="python")
    else:
        exe = tv.vm.compile(mod, target="c", exec_mode="native" if kind.startswith("native") else "bytecode")
    if kind.endswith("_saved"):
        exe = tv.vm.load_executable(exe.save_bytes())
    return tv.vm.VirtualMachine(exe).invoke("main", *args)


def _values(result) -> list:
    """The leaves of a result, as NumPy values (tuples and ADT fields in order)."""
    if hasattr(result, "numpy"):
        return [np.asarray(result.numpy())]
    if isinstance(result, (np.ndarray, np.generic, int, float)):
        return [np.asarray(result)]
    return [leaf for item in result for leaf in _values(item)]


def _check(text: str, args: tuple, expected: list, static: bool = False) -> None:
    mod = tv.parse(HEADER + text)
    for kind in ["debug", *_executors(static)]:
        got = _values(_run(kind, mod, *args))
        assert len(got) == len(expected), kind
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-6, err_msg=kind)


def test_straight_line_references():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = x + 1
    _check(STRAIGHT, (x,), [a * a, a], static=True)  # (ref_write's value is (): no leaf)


@pytest.mark.parametrize("n", [1, 3, 5])
def test_references_written_in_branches(n):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    if n > 2:
        r, k = np.concatenate([x, x]), (2 if n > 4 else 1) + (10 if n > 4 else 20)
    else:
        r, k = x * 2 + 1, 30
    _check(BRANCHES, (x, np.int32(n)), [r, np.int32(k), np.array(r.shape, np.int64)])


def test_references_written_in_match_arms():
    a, b = np.float32(3.0), np.float32(0.5)
    _check(MATCH, (a, b), [a * a + 4, a * b + 4, np.float32(0)])


@pytest.mark.parametrize("n", [0, 4])
def test_local_references_in_recursion_and_in_a_closure(n):
    x = np.array([1.0, -2.0, 0.5], np.float32)
    _check(RECURSION, (x, np.int32(n)), [(x + sum(range(1, n + 1))) * 2])


def test_the_pass_removes_every_local_reference():
    for text in (STRAIGHT, BRANCHES, MATCH, RECURSION):
        mod = LocalRefsToValues()(tv.parse(HEADER + text))
        for fn in mod.functions.values():
            assert not any(isinstance(n, (RefCreate, RefRead, RefWrite)) for n in post_order_iter(fn.body))


@pytest.mark.parametrize("mode", ["bytecode", "native"])
def test_a_reference_captured_by_a_closure_stays_a_cell_on_the_vm(mode):
    mod = tv.parse(HEADER + ESCAPING)
    kept = LocalRefsToValues()(mod)["main"]
    assert any(isinstance(n, RefCreate) for n in post_order_iter(kept.body))
    x = np.array([1.0, 2.0], np.float32)
    np.testing.assert_array_equal(tv.create_executor("debug", mod=mod).evaluate()(x).numpy(), x + 2)
    exe = tv.vm.compile(mod, target="c", exec_mode=mode)
    assert "ref $" in exe.as_text() and "ref_write $" in exe.as_text()  # (bytecode.REF_TAG, REF_WRITE_TAG)
    np.testing.assert_array_equal(tv.vm.VirtualMachine(exe).run(x).numpy(), x + 2)
