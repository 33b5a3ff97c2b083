"""``NDArray``: tensorvm's tensor value, a thin zero-copy wrapper over a NumPy array.

The wrapped array may be a view into a VM storage block; ``numpy()`` returns that array without
copying (copy it if you keep it across VM calls that reuse storage).
"""

from __future__ import annotations

import numpy as np

__all__ = ["NDArray", "array", "empty"]


class NDArray:
    __slots__ = ("_data",)

    def __init__(self, data):
        if isinstance(data, NDArray):
            data = data._data
        elif not isinstance(data, np.ndarray):
            data = np.asarray(data)
        self._data = data

    @classmethod
    def wrap(cls, data: np.ndarray) -> NDArray:
        """An NDArray over ``data`` (a NumPy array, not copied), without the constructor's checks: the
        runtimes' way to hand out results."""
        out = object.__new__(cls)
        out._data = data
        return out

    # --- conversion ----------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        return self._data

    asnumpy = numpy

    def __array__(self, dtype=None, copy=None):
        if dtype is not None and np.dtype(dtype) != self._data.dtype:
            return self._data.astype(dtype)
        return self._data.copy() if copy else self._data

    def copyto(self, target):
        """Copy into ``target`` (an NDArray or NumPy array of the same shape), or return a fresh copy."""
        if target is None:
            return NDArray(self._data.copy())
        dst = target.numpy() if isinstance(target, NDArray) else target
        np.copyto(dst, self._data)
        return target

    def copyfrom(self, source):
        np.copyto(self._data, np.asarray(source.numpy() if isinstance(source, NDArray) else source))
        return self

    # --- properties ----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self._data.shape

    @property
    def dtype(self) -> str:
        return self._data.dtype.name

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return self._data.size

    @property
    def nbytes(self) -> int:
        return self._data.nbytes

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"tv.NDArray(shape={self.shape}, dtype={self.dtype},\n{self._data!r})"

    # --- DLPack interop (NumPy >= 1.22 implements the protocol) --------------------------------
    def __dlpack__(self, *args, **kwargs):
        return self._data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._data.__dlpack_device__()

    @classmethod
    def from_dlpack(cls, obj) -> NDArray:
        return cls(np.from_dlpack(obj))


def array(data, dtype=None) -> NDArray:
    """An NDArray holding a copy of ``data``."""
    return NDArray(np.array(data.numpy() if isinstance(data, NDArray) else data, dtype=dtype))


def empty(shape, dtype="float32") -> NDArray:
    return NDArray(np.empty(shape, dtype=dtype))
