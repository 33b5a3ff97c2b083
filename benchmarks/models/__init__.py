"""The benchmarked models: each module defines one model in tensorvm's IR (or as an ONNX import) and
its peers (PyTorch eager, TorchScript, ONNX Runtime), all with the same weights.

``groups(quick=False)`` returns the ``ModelGroup`` of every benchmark in report order: the five models
of the original suite, then the real-model corpus (``vision``, ``text``: PyTorch models exported to
ONNX with dynamic axes). ``--quick`` uses fewer cases (the same models).
"""

from __future__ import annotations

from . import bert, cnn, lstm, mlp, text, treelstm, vision
from .common import Case, ModelGroup, NotAvailable, RuntimeSpec  # noqa: F401

__all__ = ["groups", "group_by_key", "Case", "ModelGroup", "RuntimeSpec", "NotAvailable"]


def groups(quick: bool = False) -> list[ModelGroup]:
    if quick:
        return [
            lstm.group(seq_lengths=(32,)),
            treelstm.group(num_trees=4),
            bert.group("bert-small", seq_lengths=(16, 64)),
            mlp.group(1),
            mlp.group(64),
            cnn.group(),
        ] + vision.groups(quick) + text.groups(quick)
    return [
        lstm.group(),
        treelstm.group(),
        bert.group("bert-small"),
        bert.group("bert-base"),
        mlp.group(1),
        mlp.group(64),
        cnn.group(),
    ] + vision.groups() + text.groups()


def group_by_key(key: str, quick: bool = False) -> ModelGroup:
    for grp in groups(quick):
        if grp.key == key:
            return grp
    raise KeyError(f"no benchmark model {key!r}; known: {', '.join(g.key for g in groups(quick))}")
