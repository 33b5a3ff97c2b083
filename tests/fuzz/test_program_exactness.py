"""The program generator's exactness invariant (see ``program_gen``): every float32 value that decides
control flow or an integer result (an ``if`` condition, ``argmax``, ``argwhere``'s comparison) is exact,
so executors that round differently (another summation order, another ``tanh``) cannot legitimately
take another branch. The oracle: the interpreter runs each program in float32 and, rewritten, in float64;
an exact value is the same in both, a rounded one (``tanh``, ``mean`` by 3, a division by 3, a sum
whose exact value is 1.00000003) almost never is.
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import program_fuzz as pf  # noqa: E402
from program_gen import programs  # noqa: E402

import tensorvm as tv  # noqa: E402
from tensorvm import interpreter  # noqa: E402

DECIDING_OPS = ("greater", "less_equal", "argmax")  # on floats: conditions, argwhere's mask, argmax


def _as_float64(text: str) -> str:
    text = text.replace("float32", "float64")
    return re.sub(r"(?<![\w.])(-?\d+(?:\.\d+)?)f(?![\w])", r"\1f64", text)


def _deciding_values(text: str, args: list, monkeypatch) -> list[np.ndarray]:
    """The float inputs of the deciding ops, in the order the interpreter runs them."""
    seen: list[np.ndarray] = []
    run_op = interpreter.run_op

    def recording(name, attrs, op_args, call=None):
        if name in DECIDING_OPS and np.asarray(op_args[0]).dtype.kind == "f":
            seen.append(np.array(op_args[0], copy=True))
        return run_op(name, attrs, op_args, call)

    with monkeypatch.context() as m:
        m.setattr(interpreter, "run_op", recording)
        tv.create_executor("debug", tv.transform.InferType()(tv.parse(text))).evaluate()(*args)
    return seen


def test_float64_rewrite_keeps_literals_apart_from_names():
    assert _as_float64('clip(%v1, a_min=-2f, a_max=2.5f) Tensor[(2), float32] add(%v12f, 0f)') \
        == 'clip(%v1, a_min=-2f64, a_max=2.5f64) Tensor[(2), float64] add(%v12f, 0f64)'


def test_values_deciding_control_flow_are_exact(monkeypatch):
    decided = refused = 0

    @settings(max_examples=200, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck), phases=(Phase.generate,), print_blob=False)
    @given(programs("full"))
    def check(case):
        nonlocal decided, refused
        rng = np.random.default_rng(case.seed)
        env = pf.shape_sets(case, rng)[0]
        args = pf.inputs(case, env, rng)
        try:
            single = _deciding_values(case.text, args, monkeypatch)
        except tv.errors.TensorVMError:
            refused += 1
            return  # a program the interpreter refuses is the campaign's business, not this test's
        double = _deciding_values(_as_float64(case.text), [a.astype(np.float64) for a in args], monkeypatch)
        assert len(single) == len(double), case.text
        for a, b in zip(single, double):
            assert np.array_equal(a, b.astype(np.float32)) and np.array_equal(b, b.astype(np.float32)), \
                f"an inexact value decides control flow: float32 {a} vs float64 {b}\n{case.text}"
        decided += len(single)

    check()
    assert decided >= 60  # the programs really had conditions, argmax and argwhere to check
