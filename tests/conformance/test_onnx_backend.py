"""ONNX's backend conformance suite (onnx 1.23.2, pinned) against tensorvm's importer and VM.

Selected: the node tests of the issue's core ops (direct and ``_expanded``), and the ``simple``,
``pytorch-converted``, ``pytorch-operator`` and ``real`` (light CNN) model tests; CPU only. A model
with an op that has no converter, or with a dtype tensorvm lacks, is skipped with the reason (see
``tvm_onnx_backend.py``). Everything excluded or expected to fail below says why. Per-op counts:
``python tests/conformance/report.py``.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("onnx")

import onnx.backend.test  # noqa: E402
from tvm_onnx_backend import TensorVMBackend, cached_tests, node_test_info  # noqa: E402

backend_test = onnx.backend.test.BackendTest(TensorVMBackend, __name__)

# ---- selection ----------------------------------------------------------------------------------------
_NODE_TESTS = sorted(node_test_info())
for _name in _NODE_TESTS:
    backend_test.include(rf"^{re.escape(_name)}_cpu$")
for _kind in ("simple", "pytorch-converted", "pytorch-operator", "real"):
    for _case in cached_tests(_kind):
        backend_test.include(rf"^{re.escape(_case.name)}_cpu$")

# ---- expected failures, each with its reason ------------------------------------------------------------
XFAIL = {
    # Training-mode dropout with a nonzero ratio draws random masks: the recorded outputs come from NumPy's
    # generator; tensorvm raises an ExecutionError instead of guessing.
    r"^test_training_dropout(_default|_mask|_default_mask)?_cpu$": "random dropout masks",
    # float16 end to end through the expanded Attention graph: 2 of 192 outputs differ from the reference
    # by one float16 ulp (about 5e-4), just over the suite's rtol of 1e-3 at those values.
    r"^test_attention_4d_causal_fp16_expanded_cpu$": "float16 rounding in the expanded graph",
}
for _pattern in XFAIL:
    backend_test.xfail(_pattern)

# No exclusions: what tensorvm cannot run (ops without a converter, dtypes such as bfloat16, float8 and
# strings, sequence inputs) is skipped by the backend itself, with the reason.

globals().update(backend_test.test_cases)
