"""Run-time values other than tensors: ADT values (tuples are tag 0), closures and references."""

from __future__ import annotations

__all__ = ["ADT", "Closure", "RefValue", "write_ref"]


class ADT:
    """An algebraic data type value: a constructor ``tag`` and its ``fields``.

    Tuples inside the VM are ADTs with tag 0; executors hand tuples back to Python as ``tuple``.
    ``constructor`` is the constructor's name when known (for printing and debugging).
    """

    __slots__ = ("tag", "fields", "constructor")

    def __init__(self, tag: int, fields=(), constructor: str | None = None):
        self.tag = int(tag)
        self.fields = tuple(fields)
        self.constructor = constructor

    def __len__(self) -> int:
        return len(self.fields)

    def __getitem__(self, index: int):
        return self.fields[index]

    def __iter__(self):
        return iter(self.fields)

    def __repr__(self) -> str:
        name = self.constructor or f"tag{self.tag}"
        if not self.fields:
            return name
        return f"{name}(" + ", ".join(repr(f) for f in self.fields) + ")"


class Closure:
    """A VM closure: the index of its lowered function and the captured values."""

    __slots__ = ("func_index", "free_vars", "name")

    def __init__(self, func_index: int, free_vars=(), name: str = ""):
        self.func_index = func_index
        self.free_vars = tuple(free_vars)
        self.name = name

    def __repr__(self) -> str:
        return f"Closure({self.name or self.func_index}, captured={len(self.free_vars)})"


class RefValue:
    """A mutable reference cell (``ref``/``ref_read``/``ref_write``)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    @property
    def fields(self) -> tuple:
        """``(value,)``: the VM reads a cell as the one field of an ADT (``GetField``, bytecode.REF_TAG)."""
        return (self.value,)

    def __repr__(self) -> str:
        return f"RefValue({self.value!r})"


def write_ref(cell, value) -> None:
    """``ref_write`` in the VM: ``value`` into ``cell``, which a file's bytecode may make any value."""
    if cell.__class__ is not RefValue:
        from ..errors import ExecutionError

        raise ExecutionError(f"ref_write: expected a reference, got {type(cell).__name__}")
    cell.value = value
