"""Helpers for declaring an op's library kernel (``LibraryKernel.arguments``): dtype codes and shape
arithmetic over the kernel's te dims. The C side is ``tensorvm/codegen/lib/tv_lib.h``."""

from __future__ import annotations

import math

from ..te.expr import INDEX_DTYPE, as_expr, const, eq

__all__ = ["DTYPE_CODES", "dtype_code", "product", "axis_split", "same_dims"]

# The order of tv_lib.h's TV_DTYPE_* codes.
DTYPE_CODES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
               "float32", "float64")


def dtype_code(dtype: str) -> int:
    """The ``TV_DTYPE_*`` code a library function receives for an array of ``dtype``."""
    return DTYPE_CODES.index(dtype)


def product(dims):
    """The product of te dims (1 for none)."""
    return math.prod(dims, start=const(1, INDEX_DTYPE))


def axis_split(shape: tuple, axis: int) -> tuple:
    """``(outer, n, inner)``: the array seen as three dims, ``axis`` in the middle."""
    return product(shape[:axis]), shape[axis], product(shape[axis + 1:])


def same_dims(op: str, a: tuple, b: tuple, what: str, at_most: bool = False) -> list:
    """Entry checks that the dims ``a`` equal (``at_most``: do not exceed) the dims ``b``, pairwise."""
    relation = "be at most" if at_most else "equal"
    return [(as_expr(x) <= y if at_most else eq(x, y), f"{op}: {what} dim {axis} must {relation} the other's")
            for axis, (x, y) in enumerate(zip(a, b, strict=True))]
