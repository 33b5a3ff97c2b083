"""Annotation ops: markers for the compiler that leave values unchanged.

``annotation.stop_fusion(x)`` is ``x``, and a fusion boundary: FuseOps never puts it, nor anything on
either side of it, in one group with the other side (its pattern is opaque), then removes it, so it
costs no kernel. The interpreter (and any pipeline without FuseOps) runs it as a copy.
"""

from __future__ import annotations

from ..te.tensor import compute
from ._common import identity_logic
from .registry import OpPattern
from .transform import define_shaped

STOP_FUSION = "annotation.stop_fusion"


def _stop_fusion_compute(attrs, inputs, out_type):
    """A copy: only reached when a stop_fusion outlives FuseOps (which removes them)."""
    (x,) = inputs
    return [compute(x.shape, lambda *i: x[i], "stop_fusion")]


define_shaped(
    STOP_FUSION, 1, identity_logic, lambda attrs, shape, x: x.copy(),
    OpPattern.OPAQUE, compute=_stop_fusion_compute,
    doc="The tensor unchanged; nothing fuses across it (FuseOps removes it after grouping).",
)
