"""The shared program suite: Relay programs with inputs and independently computed answers.

Every executor's tests iterate over ``PROGRAMS``::

    for program in PROGRAMS:
        mod = program.parse()
        args = program.args_fn()
        result = executor(mod)(*args)
        if program.error: expect program.error[0], message matching program.error[1] (None: any)
        elif program.expected_fn: check_result(result, program.expected_fn(*args), mod,
                                               rtol=program.rtol, atol=program.atol)

Import it as ``from programs import PROGRAMS, check_result`` (pytest puts ``tests/`` on the path).

``expected_fn`` computes the answer with NumPy/Python, never with tensorvm; it is ``None`` when
the interpreter is the oracle (then compare executors with each other). Expected values use
Python forms: arrays (with the expected dtype), tuples, Python lists for prelude ``List``s, and
``Con("Some", x)`` for other ADT values (a ``Rose`` tree is ``Con("Rose", value, [children])``).

Tags: ``static`` (fixed shapes, no control flow, closures or ADTs: fit for the graph executor
and AOT), ``dynamic`` (``?`` dims), ``data_dependent`` (output shapes depend on values),
``control`` (``if``), ``recursion``, ``closure``, ``adt`` (prelude or user ADTs), ``tuple``
(tuples in or out), ``error`` (running must raise ``error``). Arguments from ``args_fn`` are
NumPy arrays/scalars with exact dtypes, Python tuples for tuple parameters, and ``ADT`` values
(``tensorvm.prelude.make_list``) for ADT parameters.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tensorvm.errors import ExecutionError, ShapeError

F32 = np.float32
HEADER = '#[version = "0.0.5"]\n'


@dataclass(frozen=True)
class Con:
    """An expected ADT value other than a ``List``: constructor name and fields."""

    name: str
    fields: tuple = ()

    def __init__(self, name: str, *fields):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "fields", fields)


@dataclass(frozen=True)
class Program:
    name: str
    text: str
    args_fn: Callable[[], tuple]
    expected_fn: Callable | None
    tags: frozenset = field(default_factory=frozenset)
    error: tuple | None = None  # (exception type, regex fragment of the message or None for any)
    rtol: float = 1e-5
    atol: float = 1e-6
    entry: str = "main"

    def parse(self):
        import tensorvm as tv

        return tv.parse(HEADER + self.text)

    def required_ops(self) -> list[str]:
        """Operator names called in the text (identifiers applied to arguments, not @globals,
        %vars, keywords or Constructors)."""
        names = set()
        for match in _CALLEE.finditer(self.text):
            name = match.group(1)
            if name not in _KEYWORDS and not name[0].isupper():
                names.add(name)
        return sorted(names)

    def missing_ops(self) -> list[str]:
        from tensorvm.op import is_registered

        return [name for name in self.required_ops() if not is_registered(name)]


_CALLEE = re.compile(r"(?<![@%\w.])([A-Za-z_][\w.]*)\s*\(")
_KEYWORDS = {"fn", "if", "else", "let", "match", "ref", "ref_read", "ref_write", "meta", "def", "type"}


# --- checking results ----------------------------------------------------------------------------------
def check_result(actual, expected, mod=None, rtol: float = 1e-5, atol: float = 1e-6, path: str = "result"):
    """Assert ``actual`` (an executor's result) equals ``expected`` (in the Python forms above)."""
    from tensorvm.runtime.object import ADT

    if isinstance(expected, list):
        items = []
        value = actual
        cons_tag, nil_tag = _tag(mod, "Cons", 0), _tag(mod, "Nil", 1)
        while True:
            assert isinstance(value, ADT), f"{path}: expected a List, got {type(value).__name__}"
            if value.tag == nil_tag:
                break
            assert value.tag == cons_tag, f"{path}: expected Cons or Nil, got tag {value.tag}"
            items.append(value.fields[0])
            value = value.fields[1]
        assert len(items) == len(expected), f"{path}: expected a List of {len(expected)}, got {len(items)}"
        for i, (a, e) in enumerate(zip(items, expected, strict=True)):
            check_result(a, e, mod, rtol, atol, f"{path}[{i}]")
        return
    if isinstance(expected, Con):
        assert isinstance(actual, ADT), f"{path}: expected {expected.name}(...), got {type(actual).__name__}"
        assert actual.tag == _tag(mod, expected.name, actual.tag), f"{path}: expected {expected.name}, got tag {actual.tag}"
        if actual.constructor is not None:
            assert actual.constructor == expected.name, f"{path}: expected {expected.name}, got {actual.constructor}"
        assert len(actual.fields) == len(expected.fields), f"{path}: wrong number of fields"
        for i, (a, e) in enumerate(zip(actual.fields, expected.fields, strict=True)):
            check_result(a, e, mod, rtol, atol, f"{path}.{expected.name}[{i}]")
        return
    if isinstance(expected, tuple):
        assert isinstance(actual, tuple), f"{path}: expected a tuple, got {type(actual).__name__}"
        assert len(actual) == len(expected), f"{path}: expected {len(expected)} fields, got {len(actual)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            check_result(a, e, mod, rtol, atol, f"{path}.{i}")
        return
    expected = np.asarray(expected)
    array = np.asarray(actual.numpy() if hasattr(actual, "numpy") else actual)
    assert array.shape == expected.shape, f"{path}: shape {array.shape}, expected {expected.shape}"
    assert array.dtype == expected.dtype, f"{path}: dtype {array.dtype}, expected {expected.dtype}"
    if expected.dtype.kind == "f":
        np.testing.assert_allclose(array, expected, rtol=rtol, atol=atol, err_msg=path)
    else:
        np.testing.assert_array_equal(array, expected, err_msg=path)


def _tag(mod, name: str, default: int) -> int:
    if mod is None:
        return default
    ctor = mod.find_constructor(name)
    return default if ctor is None else ctor.tag


# --- helpers for inputs and expectations ----------------------------------------------------------------
def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def _normal(name: str, *shapes, dtype=F32) -> tuple:
    rng = _rng(name)
    return tuple(rng.standard_normal(s).astype(dtype) for s in shapes)


def _relu(x):
    return np.maximum(x, 0)


def _conv2d_nchw(x, w, pad):
    """Direct convolution: sum over kernel offsets of shifted input windows (stride 1)."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out_h, out_w = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    out = np.zeros((n, o, out_h, out_w), dtype=np.float64)
    for i in range(kh):
        for j in range(kw):
            window = xp[:, :, i:i + out_h, j:j + out_w].astype(np.float64)
            out += np.einsum("nchw,oc->nohw", window, w[:, :, i, j].astype(np.float64))
    return out.astype(x.dtype)


def _max_pool_2x2(x):
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _layer_norm(x, gamma, beta, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return ((x - mean) / np.sqrt(var + eps) * gamma + beta).astype(x.dtype)


def i32(v):
    return np.asarray(v, dtype=np.int32)


def f32(v):
    return np.asarray(v, dtype=np.float32)


PROGRAMS: list[Program] = []


def program(name, text, args_fn, expected_fn, tags, **kwargs) -> Program:
    p = Program(name, text, args_fn, expected_fn, frozenset(tags.split()), **kwargs)
    PROGRAMS.append(p)
    return p


# --- static programs -----------------------------------------------------------------------------------
program(
    "concatenate_and_where_of_loads_static",
    """
def @main(%x: Tensor[(2, 3), float32], %y: Tensor[(2, 3), float32]) -> (Tensor[(4, 3), float32], Tensor[(2, 3), float32]) {
  %0 = concatenate((%x, %y), axis=0);
  %1 = where(greater(%x, 0f), %x, multiply(%y, 2f));
  (%0, %1)
}
""",
    lambda: _normal("concatenate_and_where_of_loads_static", (2, 3), (2, 3)),
    lambda x, y: (np.concatenate([x, y]), np.where(x > 0, x, y * np.float32(2))),
    "static",
)

program(
    "add_broadcast_static",
    """
def @main(%x: Tensor[(3, 4), float32], %y: Tensor[(1, 4), float32]) -> Tensor[(3, 4), float32] {
  add(%x, %y)
}
""",
    lambda: _normal("add_broadcast_static", (3, 4), (1, 4)),
    lambda x, y: x + y,
    "static",
)

program(
    "reinterpret_float_bits",
    """
def @main(%x: Tensor[(2, 5), float32]) -> Tensor[(2, 5), int32] {
  %0 = reinterpret(multiply(%x, 2f), dtype="int32");
  bitwise_and(right_shift(%0, 23), 255)
}
""",
    lambda: _normal("reinterpret_float_bits", (2, 5)),
    lambda x: ((x * np.float32(2)).view(np.int32) >> 23) & 255,  # (the biased exponents)
    "static",
)

program(
    "reinterpret_dynamic_round_trip",
    """
def @main(%x: Tensor[(?), int64]) -> Tensor[(?), int64] {
  %0 = reinterpret(%x, dtype="float64");
  reinterpret(negative(%0), dtype="int64")
}
""",
    lambda: (np.array([4607182418800017408, 0, -4616189618054758400, 123456789], np.int64),),
    lambda x: (-(x.view(np.float64))).view(np.int64),
    "dynamic",
)

program(
    "let_scalar_arith",
    """
def @main(%a: float32, %b: float32) -> float32 {
  let %s = add(%a, %b);
  let %d = subtract(%a, %b);
  multiply(%s, %d)
}
""",
    lambda: (f32(3.5), f32(-1.25)),
    lambda a, b: f32((a + b) * (a - b)),
    "static",
)

program(
    "tuple_out_static",
    """
def @main(%x: Tensor[(2, 3), float32], %y: Tensor[(2, 3), float32]) -> (Tensor[(2, 3), float32], Tensor[(2, 3), float32]) {
  %0 = add(%x, %y);
  %1 = multiply(%0, %y);
  (%0, %1)
}
""",
    lambda: _normal("tuple_out_static", (2, 3), (2, 3)),
    lambda x, y: (x + y, (x + y) * y),
    "static tuple",
)

program(
    "nested_tuple_in_out",
    """
def @main(%t: ((Tensor[(2, 2), float32], Tensor[(2, 2), float32]), Tensor[(2, 2), float32])) {
  %0 = %t.0;
  %1 = add(%0.0, %t.1);
  %2 = multiply(%0.1, %t.1);
  ((%1, %2), %0.0)
}
""",
    lambda: _nested_tuple_args(),
    lambda t: ((t[0][0] + t[1], t[0][1] * t[1]), t[0][0]),
    "static tuple",
)

def _nested_tuple_args():
    a, b, c = _normal("nested_tuple_in_out", (2, 2), (2, 2), (2, 2))
    return (((a, b), c),)


program(
    "static_mlp",
    """
def @main(%x: Tensor[(4, 8), float32], %w1: Tensor[(16, 8), float32], %b1: Tensor[(16), float32],
          %w2: Tensor[(3, 16), float32], %b2: Tensor[(3), float32]) -> Tensor[(4, 3), float32] {
  %0 = nn.dense(%x, %w1);
  %1 = nn.bias_add(%0, %b1);
  %2 = nn.relu(%1);
  %3 = nn.dense(%2, %w2);
  %4 = nn.bias_add(%3, %b2);
  nn.relu(%4)
}
""",
    lambda: _normal("static_mlp", (4, 8), (16, 8), (16,), (3, 16), (3,)),
    lambda x, w1, b1, w2, b2: _relu(_relu(x @ w1.T + b1) @ w2.T + b2),
    "static",
    rtol=1e-4, atol=1e-5,
)

program(
    "small_cnn",
    """
def @main(%x: Tensor[(2, 1, 8, 8), float32], %w: Tensor[(4, 1, 3, 3), float32],
          %wd: Tensor[(5, 64), float32]) -> Tensor[(2, 5), float32] {
  %0 = nn.conv2d(%x, %w, padding=[1, 1], channels=4, kernel_size=[3, 3]);
  %1 = nn.relu(%0);
  %2 = nn.max_pool2d(%1, pool_size=[2, 2], strides=[2, 2]);
  %3 = nn.batch_flatten(%2);
  nn.dense(%3, %wd)
}
""",
    lambda: _normal("small_cnn", (2, 1, 8, 8), (4, 1, 3, 3), (5, 64)),
    lambda x, w, wd: _max_pool_2x2(_relu(_conv2d_nchw(x, w, 1))).reshape(2, 64) @ wd.T,
    "static",
    rtol=1e-4, atol=1e-5,
)

# --- dynamic shapes through every op family --------------------------------------------------------------
program(
    "dynamic_broadcast_chain",
    """
def @main(%x: Tensor[(?, 1), float32], %y: Tensor[(1, ?), float32], %z: Tensor[(?), float32]) {
  %0 = add(%x, %y);
  %1 = multiply(%0, %z);
  subtract(%1, %x)
}
""",
    lambda: _normal("dynamic_broadcast_chain", (5, 1), (1, 3), (3,)),
    lambda x, y, z: (x + y) * z - x,
    "dynamic",
)

program(
    "dynamic_elementwise",
    """
def @main(%x: Tensor[(?, ?), float32]) {
  %0 = exp(negative(%x));
  %1 = sqrt(abs(%x));
  %2 = tanh(%x);
  %3 = sigmoid(%x);
  add(add(%0, %1), multiply(%2, %3))
}
""",
    lambda: _normal("dynamic_elementwise", (3, 7)),
    lambda x: np.exp(-x) + np.sqrt(np.abs(x)) + np.tanh(x) * (1 / (1 + np.exp(-x))),
    "dynamic",
    rtol=1e-5, atol=1e-5,
)

program(
    "dynamic_clip_where_cast",
    """
def @main(%x: Tensor[(?), float32], %y: Tensor[(?), float32]) {
  %0 = greater(%x, %y);
  %1 = where(%0, %x, %y);
  %2 = clip(%1, a_min=-0.5f, a_max=0.5f);
  (%2, cast(%0, dtype="int32"))
}
""",
    lambda: _normal("dynamic_clip_where_cast", (9,), (9,)),
    lambda x, y: (np.clip(np.where(x > y, x, y), -0.5, 0.5).astype(F32), (x > y).astype(np.int32)),
    "dynamic tuple",
)

program(
    "dynamic_reduce",
    """
def @main(%x: Tensor[(?, ?, 4), float32]) {
  %0 = sum(%x, axis=[1]);
  %1 = mean(%x, axis=[0, 2], keepdims=True);
  %2 = max(%x);
  (%0, %1, %2)
}
""",
    lambda: _normal("dynamic_reduce", (2, 5, 4)),
    lambda x: (x.sum(axis=1), x.mean(axis=(0, 2), keepdims=True), np.asarray(x.max())),
    "dynamic tuple",
    rtol=1e-5, atol=1e-5,
)

program(
    "dynamic_dense_bias",
    """
def @main(%x: Tensor[(?, 8), float32], %w: Tensor[(4, 8), float32], %b: Tensor[(4), float32]) {
  %0 = nn.dense(%x, %w);
  add(%0, %b)
}
""",
    lambda: _normal("dynamic_dense_bias", (6, 8), (4, 8), (4,)),
    lambda x, w, b: x @ w.T + b,
    "dynamic",
    rtol=1e-5, atol=1e-5,
)

program(
    "dynamic_batch_matmul",
    """
def @main(%x: Tensor[(?, 3, 4), float32], %y: Tensor[(?, 5, 4), float32]) {
  nn.batch_matmul(%x, %y)
}
""",
    lambda: _normal("dynamic_batch_matmul", (2, 3, 4), (2, 5, 4)),
    lambda x, y: np.einsum("bik,bjk->bij", x, y),
    "dynamic",
    rtol=1e-5, atol=1e-5,
)

program(
    "dynamic_conv2d_batch",
    """
def @main(%x: Tensor[(?, 2, 6, 6), float32], %w: Tensor[(3, 2, 3, 3), float32]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1], channels=3, kernel_size=[3, 3]);
  nn.relu(%0)
}
""",
    lambda: _normal("dynamic_conv2d_batch", (3, 2, 6, 6), (3, 2, 3, 3)),
    lambda x, w: _relu(_conv2d_nchw(x, w, 1)),
    "dynamic",
    rtol=1e-4, atol=1e-5,
)

program(
    "dynamic_softmax_layer_norm",
    """
def @main(%x: Tensor[(?, 6), float32], %gamma: Tensor[(6), float32], %beta: Tensor[(6), float32]) {
  %0 = nn.softmax(%x, axis=-1);
  %1 = nn.layer_norm(%x, %gamma, %beta, axis=-1);
  (%0, %1)
}
""",
    lambda: _normal("dynamic_softmax_layer_norm", (4, 6), (6,), (6,)),
    lambda x, g, b: (_softmax(x), _layer_norm(x, g, b)),
    "dynamic tuple",
    rtol=1e-4, atol=1e-5,
)

program(
    "dynamic_reshape_transpose",
    """
def @main(%x: Tensor[(?, 6), float32]) {
  %0 = reshape(%x, newshape=[-1, 2, 3]);
  transpose(%0, axes=[0, 2, 1])
}
""",
    lambda: _normal("dynamic_reshape_transpose", (4, 6)),
    lambda x: x.reshape(-1, 2, 3).transpose(0, 2, 1),
    "dynamic",
)

program(
    "dynamic_concatenate_split",
    """
def @main(%x: Tensor[(?, 3), float32], %y: Tensor[(?, 3), float32]) {
  %0 = concatenate((%x, %y), axis=0);
  %1 = split(%0, indices_or_sections=[1, 2], axis=1);
  (%0, %1.0, %1.2)
}
""",
    lambda: _normal("dynamic_concatenate_split", (2, 3), (4, 3)),
    lambda x, y: (np.concatenate([x, y]), np.concatenate([x, y])[:, :1], np.concatenate([x, y])[:, 2:]),
    "dynamic tuple",
)

program(
    "dynamic_take_strided_slice",
    """
def @main(%x: Tensor[(?, 4), float32], %idx: Tensor[(?), int32]) {
  %0 = take(%x, %idx, axis=0);
  %1 = strided_slice(%x, begin=[1, 0], end=[3, 4], strides=[1, 2]);
  (%0, %1)
}
""",
    lambda: (_normal("dynamic_take_strided_slice", (5, 4))[0], i32([4, 0, 2, 2])),
    lambda x, idx: (x[idx], x[1:3, 0:4:2]),
    "dynamic tuple",
)

program(
    "shape_of_take",
    """
def @main(%x: Tensor[(?, ?), float32]) {
  %0 = shape_of(%x, dtype="int32");
  take(%0, 1)
}
""",
    lambda: _normal("shape_of_take", (3, 5)),
    lambda x: i32(5),
    "dynamic data_dependent",
)

program(
    "dynamic_matmul",
    """
def @main(%x: Tensor[(?, 4), float32], %y: Tensor[(4, ?), float32]) {
  nn.matmul(%x, %y)
}
""",
    lambda: _normal("dynamic_matmul", (3, 4), (4, 5)),
    lambda x, y: x @ y,
    "dynamic",
    rtol=1e-5, atol=1e-5,
)

program(
    "dynamic_cnn_pools",
    """
def @main(%x: Tensor[(?, 2, 8, 8), float32], %w: Tensor[(4, 2, 3, 3), float32], %wd: Tensor[(3, 4), float32]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1], channels=4, kernel_size=[3, 3]);
  %1 = nn.relu(%0);
  %2 = nn.avg_pool2d(%1, pool_size=[2, 2], strides=[2, 2]);
  %3 = nn.global_avg_pool2d(%2);
  %4 = nn.batch_flatten(%3);
  nn.dense(%4, %wd)
}
""",
    lambda: _normal("dynamic_cnn_pools", (3, 2, 8, 8), (4, 2, 3, 3), (3, 4)),
    lambda x, w, wd: _relu(_conv2d_nchw(x, w, 1)).reshape(3, 4, 4, 2, 4, 2).mean(axis=(3, 5)).mean(axis=(2, 3)) @ wd.T,
    "dynamic",
    rtol=1e-4, atol=1e-5,
)

program(
    "dynamic_creation_like",
    """
def @main(%x: Tensor[(?, ?), float32], %v: float32) {
  %0 = zeros_like(%x);
  %1 = ones_like(%x);
  %2 = full_like(%x, %v);
  %3 = ones(shape=[2, 3], dtype="int32");
  (add(%0, %2), subtract(%1, %x), %3)
}
""",
    lambda: (_normal("dynamic_creation_like", (2, 5))[0], f32(7.5)),
    lambda x, v: (np.full_like(x, v), np.ones_like(x) - x, np.ones((2, 3), np.int32)),
    "dynamic tuple",
)

program(
    "dynamic_sort_cumsum",
    """
def @main(%x: Tensor[(?), float32]) {
  (sort(%x), argsort(%x, dtype="int32"), cumsum(%x, axis=0))
}
""",
    lambda: (_rng("dynamic_sort_cumsum").permutation(9).astype(F32) - 4,),
    lambda x: (np.sort(x), np.argsort(x, kind="stable").astype(np.int32), np.cumsum(x).astype(F32)),
    "dynamic tuple",
)

program(
    "dynamic_shape_ops",
    """
def @main(%x: Tensor[(?, 3), float32]) {
  %0 = expand_dims(%x, axis=1);
  %1 = squeeze(%0, axis=[1]);
  %2 = stack((%x, %1), axis=0);
  %3 = tile(%x, reps=[1, 2]);
  %4 = repeat(%x, repeats=2, axis=0);
  (%0, %2, %3, %4)
}
""",
    lambda: _normal("dynamic_shape_ops", (2, 3)),
    lambda x: (x[:, None, :], np.stack([x, x]), np.tile(x, (1, 2)), np.repeat(x, 2, axis=0)),
    "dynamic tuple",
)

# --- data-dependent output shapes -------------------------------------------------------------------------
program(
    "arange_from_shape",
    """
def @main(%x: Tensor[(?), float32]) {
  %0 = shape_of(%x, dtype="int32");
  %1 = take(%0, 0);
  %2 = arange(0, %1, 1, dtype="int32");
  add(%2, 1)
}
""",
    lambda: _normal("arange_from_shape", (6,)),
    lambda x: np.arange(1, 7, dtype=np.int32),
    "dynamic data_dependent",
)

program(
    "arange_float_args",
    """
def @main(%start: float32, %stop: float32, %step: float32) {
  arange(%start, %stop, %step, dtype="float32")
}
""",
    lambda: (f32(1.0), f32(4.0), f32(0.5)),
    lambda a, b, s: np.arange(1.0, 4.0, 0.5, dtype=F32),
    "dynamic data_dependent",
)

program(
    "argwhere_positive",
    """
def @main(%x: Tensor[(?, ?), float32]) {
  argwhere(greater(%x, 0f))
}
""",
    lambda: _normal("argwhere_positive", (4, 5)),
    lambda x: np.argwhere(x > 0).astype(np.int32),
    "dynamic data_dependent",
)

program(
    "topk_values_indices",
    """
def @main(%x: Tensor[(?, 6), float32]) {
  %0 = topk(%x, k=3, axis=-1, ret_type="both", is_ascend=False, dtype="int32");
  (%0.0, %0.1)
}
""",
    lambda: (np.stack([_rng("topk").permutation(6) for _ in range(3)]).astype(F32),),
    lambda x: (-np.sort(-x, axis=-1)[:, :3], np.argsort(-x, axis=-1, kind="stable")[:, :3].astype(np.int32)),
    "dynamic data_dependent tuple",
)

# --- control flow and recursion -----------------------------------------------------------------------
program(
    "if_on_tensor_condition",
    """
def @main(%x: Tensor[(?), float32]) {
  %0 = sum(%x);
  if (greater(%0, 0f)) {
    multiply(%x, 2f)
  } else {
    negative(%x)
  }
}
""",
    lambda: (f32([1.0, -3.0, 0.5]),),
    lambda x: x * 2 if x.sum() > 0 else -x,
    "dynamic control",
)

program(
    "if_on_bool_param",
    """
def @main(%flag: bool, %x: Tensor[(3), float32]) {
  if (%flag) {
    add(%x, 1f)
  } else {
    subtract(%x, 1f)
  }
}
""",
    lambda: (np.bool_(False), f32([1, 2, 3])),
    lambda flag, x: x + 1 if flag else x - 1,
    "control",
)

program(
    "if_branches_differ_in_shape",
    """
def @main(%x: Tensor[(?, 2), float32], %twice: bool) -> Tensor[(?, 2), float32] {
  if (%twice) {
    concatenate((%x, %x), axis=0)
  } else {
    %x
  }
}
""",
    lambda: (_normal("if_branches_differ_in_shape", (3, 2))[0], np.bool_(True)),
    lambda x, twice: np.concatenate([x, x]) if twice else x,
    "dynamic control",
)

program(
    "mutual_recursion_even_odd",
    """
def @is_even(%n: int32) -> bool {
  if (equal(%n, 0)) { True } else { @is_odd(subtract(%n, 1)) }
}

def @is_odd(%n: int32) -> bool {
  if (equal(%n, 0)) { False } else { @is_even(subtract(%n, 1)) }
}

def @main(%a: int32, %b: int32) {
  (@is_even(%a), @is_odd(%b))
}
""",
    lambda: (i32(501), i32(501)),
    lambda a, b: (np.bool_(int(a) % 2 == 0), np.bool_(int(b) % 2 == 1)),
    "recursion control tuple",
)

_SUM_UP = """
def @sum_up(%i: int32) -> int32 {
  %0 = equal(%i, 0);
  if (%0) {
    %i
  } else {
    %1 = subtract(%i, 1);
    %2 = @sum_up(%1);
    add(%2, %i)
  }
}
"""

program(
    "sum_up_recursion",
    _SUM_UP + """
def @main(%n: int32) -> int32 {
  @sum_up(%n)
}
""",
    lambda: (i32(100),),
    lambda n: i32(int(n) * (int(n) + 1) // 2),
    "recursion control",
)

program(
    "tail_loop_1000_steps",
    """
def @loop(%i: int32, %acc: int32) -> int32 {
  if (equal(%i, 0)) {
    %acc
  } else {
    @loop(subtract(%i, 1), add(%acc, %i))
  }
}

def @main(%n: int32) -> int32 {
  @loop(%n, 0)
}
""",
    lambda: (i32(1000),),
    lambda n: i32(int(n) * (int(n) + 1) // 2),
    "recursion control",
)

program(
    "tensor_while_loop",
    """
def @main(%x: Tensor[(?), float32], %n: int32) {
  let %loop = fn (%i: int32, %v: Tensor[(?), float32]) -> Tensor[(?), float32] {
    if (less(%i, %n)) {
      %loop(add(%i, 1), add(multiply(%v, 0.5f), 1f))
    } else {
      %v
    }
  };
  %loop(0, %x)
}
""",
    lambda: (f32([0.0, 4.0, -8.0]), i32(6)),
    lambda x, n: _iterate(lambda v: (v * F32(0.5) + F32(1)).astype(F32), x, int(n)),
    "recursion closure control dynamic",
)


def _iterate(f, value, times):
    for _ in range(times):
        value = f(value)
    return value


program(
    "grow_by_concatenate",
    """
def @grow(%acc: Tensor[(?, 2), float32], %row: Tensor[(1, 2), float32], %i: int32) -> Tensor[(?, 2), float32] {
  if (equal(%i, 0)) {
    %acc
  } else {
    %0 = multiply(%row, cast(%i, dtype="float32"));
    @grow(concatenate((%acc, %0), axis=0), %row, subtract(%i, 1))
  }
}

def @main(%start: Tensor[(1, 2), float32], %row: Tensor[(1, 2), float32], %n: int32) {
  @grow(%start, %row, %n)
}
""",
    lambda: (f32([[0, 0]]), f32([[1, 10]]), i32(10)),
    lambda start, row, n: np.concatenate([start] + [row * k for k in range(int(n), 0, -1)]).astype(F32),
    "recursion control dynamic",
)

program(
    "data_dependent_loop_count",
    """
def @double_until(%x: Tensor[(?), float32], %limit: float32, %steps: int32) -> (Tensor[(?), float32], int32) {
  if (greater_equal(sum(%x), %limit)) {
    (%x, %steps)
  } else {
    @double_until(multiply(%x, 2f), %limit, add(%steps, 1))
  }
}

def @main(%x: Tensor[(?), float32], %limit: float32) {
  @double_until(%x, %limit, 0)
}
""",
    lambda: (f32([0.25, 0.5, 0.25]), f32(100.0)),
    lambda x, limit: _double_until(x, limit),
    "recursion control dynamic tuple",
)


def _double_until(x, limit):
    steps = 0
    while x.sum() < limit:
        x, steps = (x * 2).astype(F32), steps + 1
    return x, i32(steps)


# --- closures -----------------------------------------------------------------------------------------
program(
    "closure_captures_variables",
    """
def @main(%x: Tensor[(?), float32], %k: float32) {
  let %scale = multiply(%k, 2f);
  let %shift = fn (%y: Tensor[(?), float32]) -> Tensor[(?), float32] {
    add(multiply(%y, %scale), %k)
  };
  (%shift(%x), %shift(negative(%x)))
}
""",
    lambda: (f32([1, 2, 3]), f32(0.5)),
    lambda x, k: (x * (k * 2) + k, -x * (k * 2) + k),
    "closure dynamic tuple",
)

program(
    "references_shared_by_closures",
    """
def @bump(%r: ref(Tensor[(?), float32]), %by: Tensor[(?), float32]) -> () {
  ref_write(%r, add(ref_read(%r), %by))
}

def @main(%x: Tensor[(?), float32], %n: int32) -> (Tensor[(?), float32], Tensor[(?), float32], int32) {
  let %acc = ref(%x);
  let %count = ref(0);
  let %step = fn (%v: Tensor[(?), float32]) -> () {
    let %_ = @bump(%acc, %v);
    ref_write(%count, add(ref_read(%count), 1))
  };
  let %pair = (%acc, %step);
  let %cells = Cons(%acc, Cons(ref(%x), Nil));
  let %_1 = %pair.1(%x);
  let %_2 = %step(multiply(%x, 2f));
  let %first = match (%cells) { Cons(%c, _) => ref_read(%c), Nil => %x, };
  let %again = ref_read(%pair.0);
  let %_3 = ref_write(%pair.0, zeros_like(%x));
  (%first, add(%again, ref_read(%acc)), add(ref_read(%count), %n))
}
""",
    lambda: (f32([1.0, -2.0, 0.5]), i32(10)),
    lambda x, n: (x * 4, x * 4, i32(int(n) + 2)),
    "closure ref adt tuple dynamic",
)

program(
    "reference_cell_written_in_a_loop",
    """
def @main(%x: Tensor[(?), float32], %n: int32) -> Tensor[(?), float32] {
  let %acc = ref(%x);
  let %add = fn (%v: Tensor[(?), float32]) -> () { ref_write(%acc, add(ref_read(%acc), %v)) };
  let %loop = fn (%i: int32) -> () {
    if (less(%i, %n)) { let %_ = %add(multiply(%x, cast(%i, dtype="float32"))); %loop(add(%i, 1)) } else { () }
  };
  let %_ = %loop(0);
  ref_read(%acc)
}
""",
    lambda: (f32([1.0, -2.0, 0.5]), i32(5)),
    lambda x, n: x * np.float32(1 + int(n) * (int(n) - 1) // 2),
    "closure ref recursion dynamic",
)

program(
    "reference_cell_holding_the_closure_that_reads_it",
    """
def @main(%x: Tensor[(?), float32], %n: int32) -> Tensor[(?), float32] {
  let %y = multiply(%x, 2f);
  let %r = ref(fn (%k: int32) -> Tensor[(?), float32] { %y });
  let %f = fn (%k: int32) -> Tensor[(?), float32] {
    if (greater(%k, 0)) { add(ref_read(%r)(subtract(%k, 1)), %y) } else { %y }
  };
  let %u = ref_write(%r, %f);
  ref_read(%r)(%n)
}
""",
    lambda: (f32([1.0, -2.0, 0.5, 3.0]), i32(3)),
    lambda x, n: x * np.float32(2 * (int(n) + 1)),
    "closure ref recursion dynamic",
)

program(
    "reference_counter_returned_with_its_closure",
    """
def @counter(%start: int32) -> (fn () -> int32, ref(int32)) {
  let %cell = ref(%start);
  (fn () -> int32 { let %_ = ref_write(%cell, add(ref_read(%cell), 1)); ref_read(%cell) }, %cell)
}

def @main(%start: int32) -> (int32, int32, int32) {
  let %made = @counter(%start);
  let %next = %made.0;
  let %a = %next();
  let %b = %next();
  let %c = @counter(100).0();
  let %_ = ref_write(%made.1, 50);
  (%a, add(%b, %c), %next())
}
""",
    lambda: (i32(3),),
    lambda start: (i32(int(start) + 1), i32(int(start) + 2 + 101), i32(51)),
    "closure ref tuple",
)

program(
    "shared_effect_runs_where_its_scope_binds_it",
    # %0 (a call that writes the cell) is used in the if's true branch and after the if: it runs once,
    # before the if (the innermost scope holding every use), on either branch; ref_read after the if
    # sees its write even when the false branch did not use it
    """
def @bump(%r: ref(int32)) -> int32 {
  let %old = ref_read(%r);
  let %u = ref_write(%r, add(%old, 1));
  %old
}

def @main(%c: bool) -> (int32, int32, int32) {
  let %r = ref(10);
  %0 = @bump(%r);
  %1 = if (%c) { multiply(%0, 2) } else { 0 };
  (%1, ref_read(%r), %0)
}
""",
    lambda: (np.bool_(False),),
    lambda c: (i32(20 if c else 0), i32(11), i32(10)),
    "ref",
)

program(
    "loop_through_a_closure_of_no_arguments_in_tail_position",
    """
def @main(%n: int32, %x: Tensor[(?), float32]) -> Tensor[(?), float32] {
  let %i = ref(0);
  let %acc = ref(%x);
  let %step = ref(fn () -> Tensor[(?), float32] { %x });
  let %u = ref_write(%step, fn () -> Tensor[(?), float32] {
    if (less(ref_read(%i), %n)) {
      let %a = ref_write(%i, add(ref_read(%i), 1));
      let %b = ref_write(%acc, add(ref_read(%acc), %x));
      ref_read(%step)()
    } else {
      ref_read(%acc)
    }
  });
  ref_read(%step)()
}
""",
    lambda: (i32(4), f32([1.0, -2.0, 0.5])),
    lambda n, x: x * np.float32(int(n) + 1),
    "closure ref loop dynamic",
)

program(
    "symbolic_dims_bound_per_call",
    # n is @g's own: the first call binds it to 4, the second to 1, so the sum of the two results
    # broadcasts (4, 3) with (1, 3); a caller typing both as one (n, 3) had a kernel for equal shapes
    """
def @g(%x: Tensor[(n, 3), float32], %y: Tensor[(n, 3), float32]) -> Tensor[(n, 3), float32] {
  multiply(%x, %y)
}

def @main(%a: Tensor[(4, 3), float32], %c: Tensor[(1, 3), float32]) {
  add(@g(%a, %a), @g(%c, %c))
}
""",
    lambda: _normal("symbolic_dims_bound_per_call", (4, 3), (1, 3)),
    lambda a, c: a * a + c * c,
    "",
)

_BUMP = """
def @bump(%r: ref(float32), %x: Tensor[(1, 2), float32]) -> Tensor[(1, 2), float32] {
  let %u = ref_write(%r, add(ref_read(%r), 1f));
  %x
}
"""

program(
    "folding_and_simplifying_keep_the_effects_of_what_they_drop",
    # FoldConstant had folded (e, c).1 to c and shape_of(e) to a constant, SimplifyExpr reshape_like(x, e) to
    # x, each dropping e's write to the cell (the VM runs them; the interpreter does not)
    _BUMP + """
def @g(%r: ref(float32), %x: Tensor[(1, 2), float32]) {
  ((@bump(%r, %x), 2f).1, shape_of(@bump(%r, %x)), reshape_like(cast_like(%x, @bump(%r, %x)), @bump(%r, %x)))
}

def @main(%x: Tensor[(1, 2), float32]) {
  let %r = ref(0f);
  let %t = @g(%r, %x);
  (%t.0, %t.1, %t.2, ref_read(%r))
}
""",
    lambda: (f32([[1.0, 2.0]]),),
    lambda x: (f32(2.0), i32([1, 2]), x, f32(4.0)),
    "ref",
)

program(
    "stacked_products_leave_an_effect_after_the_read_before_it",
    # two one-row products of one constant weight stack into one computed where the first was; the second's
    # input (a call that writes the cell) must still run after the read between them
    _BUMP + """
def @g(%r: ref(float32), %a: Tensor[(1, 2), float32], %b: Tensor[(1, 2), float32]) {
  %w = ones(shape=[3, 2], dtype="float32");
  %d1 = nn.dense(%a, %w);
  %v = ref_read(%r);
  %d2 = nn.dense(@bump(%r, %b), ones(shape=[3, 2], dtype="float32"));
  (%d1, %v, %d2)
}

def @main(%a: Tensor[(1, 2), float32], %b: Tensor[(1, 2), float32]) {
  let %r = ref(0f);
  let %t = @g(%r, %a, %b);
  (%t.0, %t.1, %t.2, ref_read(%r))
}
""",
    lambda: (f32([[1.0, 2.0]]), f32([[3.0, 5.0]])),
    lambda a, b: (np.full((1, 3), a.sum(), np.float32), f32(0.0), np.full((1, 3), b.sum(), np.float32), f32(1.0)),
    "ref",
)

program(
    "common_subexpressions_stay_in_the_scope_of_their_let",
    # %0 (a graph binding used in a branch and outside it) equals a let-bound call inside the branch and the
    # closure: EliminateCommonSubexpr had read %0 as that let's variable everywhere, outside its scope too
    """
def @main(%c: bool, %x: float32) {
  %0 = add(%x, 1f);
  %1 = if (%c) { let %v = add(%x, 1f); multiply(%v, %0) } else { %0 };
  let %f = fn () { let %w = add(%x, 1f); multiply(%w, %0) };
  (%1, %f(), %0)
}
""",
    lambda: (np.bool_(False), f32(2.0)),
    lambda c, x: (f32((x + 1) * (x + 1) if c else x + 1), f32((x + 1) * (x + 1)), f32(x + 1)),
    "control closure",
)

program(
    "a_constructor_used_as_a_value_at_two_types",
    # one Some node passed to a polymorphic @app at float32 and at int32: EtaExpand had made one function of
    # both uses, which type inference then refused
    """
def @app[A, B](%f: fn (A) -> B, %x: A) -> B { %f(%x) }

def @main(%x: float32, %i: int32) {
  (@app(Some, %x), @app(Some, %i))
}
""",
    lambda: (f32(2.0), i32(3)),
    lambda x, i: (Con("Some", x), Con("Some", i)),
    "adt closure",
)

program(
    "currying",
    """
def @main(%a: int32, %b: int32) -> int32 {
  let %curried = fn (%x: int32) -> fn (int32) -> int32 {
    fn (%y: int32) -> int32 {
      subtract(%x, %y)
    }
  };
  let %from_a = %curried(%a);
  add(%from_a(%b), %curried(1)(2))
}
""",
    lambda: (i32(10), i32(4)),
    lambda a, b: i32((a - b) + (1 - 2)),
    "closure",
)

program(
    "compose_and_iterate",
    """
def @main(%x: Tensor[(2), float32]) {
  let %inc = fn (%v: Tensor[(2), float32]) -> Tensor[(2), float32] { add(%v, 1f) };
  let %dbl = fn (%v: Tensor[(2), float32]) -> Tensor[(2), float32] { multiply(%v, 2f) };
  let %both = @compose(%inc, %dbl);
  let %thrice = @iterate(%dbl, 3);
  (%both(%x), %thrice(%x))
}
""",
    lambda: (f32([1.5, -2.0]),),
    lambda x: (x * 2 + 1, x * 8),
    "closure adt recursion tuple",
)

# --- ADTs and the prelude -----------------------------------------------------------------------------
program(
    "list_map_foldl",
    """
def @main(%a: Tensor[(?), float32], %b: Tensor[(?), float32], %c: Tensor[(?), float32]) {
  let %xs = Cons(%a, Cons(%b, Cons(%c, Nil)));
  let %doubled = @map(fn (%t: Tensor[(?), float32]) -> Tensor[(?), float32] { multiply(%t, 2f) }, %xs);
  let %total = @foldl(fn (%acc: Tensor[(?), float32], %t: Tensor[(?), float32]) -> Tensor[(?), float32] {
    add(%acc, %t)
  }, zeros_like(%a), %doubled);
  (%doubled, %total)
}
""",
    lambda: _normal("list_map_foldl", (4,), (4,), (4,)),
    lambda a, b, c: ([a * 2, b * 2, c * 2], ((np.zeros_like(a) + a * 2) + b * 2) + c * 2),
    "adt closure recursion tuple dynamic",
)

program(
    "list_sum_length_nth",
    """
def @main(%x: int32, %y: int32, %z: int32) {
  let %xs = Cons(%x, Cons(%y, Cons(%z, Nil)));
  (@sum(%xs), @length(%xs), @nth(%xs, 1), @hd(@rev(%xs)))
}
""",
    lambda: (i32(7), i32(-2), i32(30)),
    lambda x, y, z: (i32(x + y + z), i32(3), y, z),
    "adt recursion tuple",
)

program(
    "list_filter_foldr_concat",
    """
def @main(%x: int32, %y: int32, %z: int32) {
  let %xs = Cons(%x, Cons(%y, Cons(%z, Nil)));
  let %positive = @filter(fn (%v: int32) -> bool { greater(%v, 0) }, %xs);
  let %copy = @foldr(fn (%v: int32, %acc: List[int32]) -> List[int32] { Cons(%v, %acc) }, Nil, %xs);
  (%positive, @concat(%copy, %positive), @update(%xs, 2, 99))
}
""",
    lambda: (i32(5), i32(-3), i32(8)),
    lambda x, y, z: ([x, z], [x, y, z, x, z], [x, y, i32(99)]),
    "adt recursion closure tuple",
)

program(
    "list_argument_map_sum",
    """
def @main(%xs: List[Tensor[(?), float32]]) -> List[float32] {
  @map(fn (%t: Tensor[(?), float32]) -> float32 { sum(%t) }, %xs)
}
""",
    lambda: (_make_list([f32([1, 2]), f32([3, 4, 5]), f32([])]),),
    lambda xs: [f32(3), f32(12), f32(0)],
    "adt dynamic recursion closure",
)


def _make_list(values):
    from tensorvm.prelude import make_list

    return make_list(values)


program(
    "global_as_function_value",
    """
def @square(%v: int32) -> int32 {
  multiply(%v, %v)
}

def @main(%a: int32, %b: int32) {
  let %f = @square;
  (@map(@square, Cons(%a, Cons(%b, Nil))), %f(%b))
}
""",
    lambda: (i32(3), i32(-4)),
    lambda a, b: ([a * a, b * b], b * b),
    "adt recursion closure tuple",
)

program(
    "zip_map_accum_unfold",
    """
def @main(%n: int32) {
  let %count_down = fn (%i: int32) -> Option[(int32, int32)] {
    if (equal(%i, 0)) { None } else { Some((subtract(%i, 1), %i)) }
  };
  let %down = @unfoldr(%count_down, %n);
  let %up = @unfoldl(%count_down, %n);
  let %running = fn (%acc: int32, %v: int32) -> (int32, int32) { (add(%acc, %v), add(%acc, %v)) };
  (@zip(%down, %up), @map_accumr(%running, 0, %down), @map_accuml(%running, 0, %down))
}
""",
    lambda: (i32(3),),
    lambda n: (
        [(i32(3), i32(1)), (i32(2), i32(2)), (i32(1), i32(3))],
        (i32(6), [i32(6), i32(3), i32(1)]),
        (i32(6), [i32(6), i32(5), i32(3)]),
    ),
    "adt recursion closure tuple",
)

program(
    "option_match",
    """
def @safe_log(%x: float32) -> Option[float32] {
  if (greater(%x, 0f)) { Some(log(%x)) } else { None }
}

def @main(%a: float32, %b: float32) {
  let %fa = @safe_log(%a);
  let %fb = @safe_log(%b);
  let %or_zero = fn (%o: Option[float32]) -> float32 {
    match (%o) {
      Some(%v) => %v,
      None => 0f,
    }
  };
  (%fa, %fb, add(%or_zero(%fa), %or_zero(%fb)))
}
""",
    lambda: (f32(2.0), f32(-1.0)),
    lambda a, b: (Con("Some", f32(np.log(a))), Con("None"), f32(np.log(a))),
    "adt control closure tuple",
)

program(
    "tree_tmap_size",
    """
def @main(%v: float32) {
  let %leaf = Rose(%v, Nil);
  let %mid = Rose(add(%v, 1f), Cons(%leaf, Cons(%leaf, Nil)));
  let %root = Rose(0f, Cons(%mid, Cons(%leaf, Nil)));
  let %mapped = @tmap(fn (%x: float32) -> float32 { multiply(%x, 10f) }, %root);
  (@size(%root), %mapped)
}
""",
    lambda: (f32(2.0),),
    lambda v: (i32(5), Con("Rose", f32(0), [
        Con("Rose", f32((v + 1) * 10), [Con("Rose", f32(v * 10), []), Con("Rose", f32(v * 10), [])]),
        Con("Rose", f32(v * 10), []),
    ])),
    "adt recursion closure tuple",
)

program(
    "nested_match_flatten",
    """
def @flatten(%xss: List[List[int32]]) -> List[int32] {
  match (%xss) {
    Nil => Nil,
    Cons(%xs, %rest) => {
      match (%xs) {
        Nil => @flatten(%rest),
        Cons(%h, %t) => Cons(%h, @flatten(Cons(%t, %rest))),
      }
    },
  }
}

def @main(%a: int32, %b: int32) {
  @flatten(Cons(Cons(%a, Cons(%b, Nil)), Cons(Nil, Cons(Cons(%b, Nil), Nil))))
}
""",
    lambda: (i32(1), i32(2)),
    lambda a, b: [a, b, b],
    "adt recursion",
)

# --- errors -----------------------------------------------------------------------------------------------
program(
    "broadcast_mismatch_error",
    """
def @main(%x: Tensor[(?, 2), float32], %y: Tensor[(?, 2), float32]) {
  add(%x, %y)
}
""",
    lambda: (np.ones((3, 2), F32), np.ones((4, 2), F32)),
    None,
    "dynamic error",
    error=(ShapeError, "broadcast"),
)

program(
    "empty_list_head_error",
    """
def @main(%x: int32) {
  @hd(@filter(fn (%v: int32) -> bool { greater(%v, %x) }, Cons(1, Cons(2, Nil))))
}
""",
    lambda: (i32(5),),
    None,
    "adt error",
    error=(ExecutionError, None),  # executors word a failed match differently
)

PROGRAMS_BY_NAME = {p.name: p for p in PROGRAMS}
assert len(PROGRAMS_BY_NAME) == len(PROGRAMS), "program names must be unique"
