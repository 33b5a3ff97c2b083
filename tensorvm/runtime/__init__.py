"""The runtime: tensors (NDArray), storage and allocators, ADT and closure values, kernel libraries.

Imports nothing of the compiler, so a deployed executable needs only this package and ``vm``'s loader.
"""

from .object import ADT, Closure, RefValue  # noqa: F401
