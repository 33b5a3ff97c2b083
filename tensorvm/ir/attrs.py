"""Immutable attribute dictionaries for calls and functions.

Values are normalized so that equal attributes compare equal: lists become tuples (recursively),
NumPy scalars become Python numbers. ``attrs.axis`` and ``attrs["axis"]`` both work.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def normalize_attr_value(value):
    if isinstance(value, (list, tuple)):
        return tuple(normalize_attr_value(v) for v in value)
    if isinstance(value, np.ndarray):
        return normalize_attr_value(value.tolist())
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


class Attrs(Mapping):
    """A frozen, hashable mapping from attribute name to value."""

    __slots__ = ("_items", "_hash")

    def __init__(self, items: Mapping | None = None, **kwargs):
        merged = dict(items or {})
        merged.update(kwargs)
        object.__setattr__(self, "_items", {k: normalize_attr_value(v) for k, v in merged.items()})
        object.__setattr__(self, "_hash", None)

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self):
        return len(self._items)

    def __getattr__(self, name):
        try:
            return self._items[name]
        except KeyError:
            raise AttributeError(f"no attribute {name!r}; have {sorted(self._items)}") from None

    def __setattr__(self, name, value):
        raise AttributeError("Attrs are immutable")

    def __eq__(self, other):
        if isinstance(other, Attrs):
            return self._items == other._items
        if isinstance(other, Mapping):
            return self._items == {k: normalize_attr_value(v) for k, v in other.items()}
        return NotImplemented

    def __hash__(self):
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(tuple(sorted(self._items.items(), key=lambda kv: kv[0]))))
        return self._hash

    def with_(self, **updates) -> Attrs:
        return Attrs(self._items, **updates)

    def __repr__(self):
        return "Attrs(" + ", ".join(f"{k}={v!r}" for k, v in self._items.items()) + ")"
