"""ONNX's backend conformance suite (onnx 1.23.2, pinned) against tensorvm's importer and VM, on target c
(``TENSORVM_ONNX_TARGET=python``: on NumPy kernels) with the importer's default accumulation.

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
from tvm_onnx_backend import TARGET, TensorVMBackend, cached_tests, node_test_info  # noqa: E402

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
    # generator; tensorvm raises an error instead of guessing (dyn.nn.dropout: an entry check on target c).
    r"^test_training_dropout(_default|_mask|_default_mask)?_cpu$": "random dropout masks",
    # float16 end to end through the expanded Attention graph: 2 of 192 outputs differ from the reference
    # by one float16 ulp (about 5e-4), just over the suite's rtol of 1e-3 at those values.
    r"^test_attention_4d_causal_fp16_expanded_cpu$": "float16 rounding in the expanded graph",
    # The recorded outputs are NumPy's inverse FFT in single precision (complex64 in, complex64 out: they
    # match it exactly); tensorvm's DFT computes in float64, and where the exact value is 0 the
    # reference's own rounding (1.9e-7) is just over the suite's atol of 1e-7 (double precision differs
    # from the recording by up to 1.5e-6 elsewhere, within its rtol).
    r"^test_dft_inverse(_opset19)?_cpu$": "the recording's single-precision FFT rounding",
    # With output_shape, ONNX's reference writes the indices into the shape inferred from the attributes
    # and pads that to output_shape; ONNX Runtime and PyTorch (whose MaxPool indices address the original
    # image) index the output_shape tensor itself, and so does tensorvm (the same result without it).
    r"^test_maxunpool_export_with_output_shape_cpu$": "indices address output_shape, as in ONNX Runtime",
    # AffineGrid's function body squeezes, without axes, a value whose dims are known only at run time
    # there: the result's rank would depend on the data, and a tensorvm type has a static rank (the op
    # itself, not expanded, passes).
    r"^test_affine_grid_(2d|2d_align_corners|3d_align_corners)_expanded_cpu$": "Squeeze without axes of run-time dims",
    # A sequence of tensors of more than one rank: loop13_seq declares its input sequence's tensors as
    # scalars (rank 0) and inserts 1-d slices; loop16_seq_none starts from a sequence holding one scalar and
    # inserts 1-d slices. A tensorvm sequence is a List of one tensor type (rank fixed, dims free).
    r"^test_loop13_seq_cpu$": "a sequence of tensors of differing ranks",
    r"^test_loop16_seq_none_cpu$": "a sequence of tensors of differing ranks",
}
if TARGET == "c":
    # float16 end to end through the expanded grouped-query Attention graph: 1 of 576 outputs differs from the
    # reference by one float16 ulp (4.9e-4, relative 1.03e-3), just over the suite's rtol of 1e-3.
    XFAIL[r"^test_attention_4d_gqa_with_past_and_present_fp16_expanded_cpu$"] = "float16 rounding in the expanded graph"
else:
    # squeezenet's constant weights make every class's logit equal (reference: 0.001 each); NumPy's float32
    # convolution rounds some output channels one ulp differently, and the softmax of those huge logits
    # gives 1/40 to 40 classes and ~0 to the rest. (The C kernels round every channel alike and pass;
    # from_onnx(accumulate_dtype="float64") passes on NumPy too.)
    XFAIL[r"^test_squeezenet_cpu$"] = "float32 rounding differs between channels of the NumPy convolution"
for _pattern in XFAIL:
    backend_test.xfail(_pattern)

# No exclusions: what tensorvm cannot run (ops without a converter, dtypes such as bfloat16, float8 and
# strings) is skipped by the backend itself, with the reason. A sequence input whose tensors' rank the model
# leaves unknown is compiled at its first run with the rank of the tensors given (``from_onnx(shape=...)``).
# A sequence output comes back as a tuple of its tensors (a prelude List, in order, when its length is
# known only at run time).

globals().update(backend_test.test_cases)
