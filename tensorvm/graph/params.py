"""The binary parameter format of the graph executor: named tensors, never pickle.

Layout (all integers little-endian; documented in ``docs/graph-format.md``)::

    magic      8 bytes   b"TVMPARAM"
    version    u32       1
    count      u64       number of tensors
    count x:
      name     u32 length + UTF-8 bytes
      dtype    u8 length + ASCII bytes (one of PARAM_DTYPES)
      ndim     u32, then ndim x i64 dims (each >= 0)
      nbytes   u64 (must equal prod(dims) * itemsize)
      data     nbytes raw bytes, C order, little-endian
    checksum   u32       CRC-32 of every byte before it

Anything else — a wrong magic, an unknown version or dtype, a truncated record, a size that does
not add up, a duplicate name, trailing bytes or a checksum mismatch — raises ``FormatError``.
"""

from __future__ import annotations

import math
import os
import struct
import zlib

import numpy as np

from ..errors import FormatError

__all__ = ["PARAMS_MAGIC", "PARAMS_VERSION", "PARAM_DTYPES", "save_params", "load_params",
           "save_param_file", "load_param_file"]

PARAMS_MAGIC = b"TVMPARAM"
PARAMS_VERSION = 1
PARAM_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64")
MAX_NDIM = 32  # also the graph JSON's bound
MAX_BYTES = 2**62  # of a shape, zero dims read as 1 (NumPy's limit on shapes is 2**63 bytes)


def _as_array(value, name: str) -> np.ndarray:
    if hasattr(value, "numpy") and callable(value.numpy):
        value = value.numpy()
    array = np.asarray(value)
    if array.dtype.name not in PARAM_DTYPES:
        raise FormatError(f"parameter {name!r}: dtype {array.dtype} cannot be saved; expected one of "
                          f"{', '.join(PARAM_DTYPES)}")
    return array


def save_params(params: dict) -> bytes:
    """Serialize ``{name: array}`` (arrays, ``NDArray``s or array-likes) to bytes."""
    if not isinstance(params, dict):
        raise FormatError(f"save_params expects a dict of name -> array, got {type(params).__name__}")
    chunks = [PARAMS_MAGIC, struct.pack("<IQ", PARAMS_VERSION, len(params))]
    for name, value in params.items():
        if not isinstance(name, str):
            raise FormatError(f"parameter names must be strings, got {name!r}")
        array = _as_array(value, name)
        encoded = name.encode("utf-8")
        dtype = array.dtype.name.encode("ascii")
        data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
        chunks.append(struct.pack("<I", len(encoded)) + encoded)
        chunks.append(struct.pack("<B", len(dtype)) + dtype)
        chunks.append(struct.pack(f"<I{array.ndim}q", array.ndim, *array.shape))
        chunks.append(struct.pack("<Q", len(data)) + data)
    body = b"".join(chunks)
    return body + struct.pack("<I", zlib.crc32(body) & 0xFFFFFFFF)


class _Reader:
    def __init__(self, data: bytes, what: str):
        self.data, self.pos, self.what = data, 0, what

    def take(self, n: int, field: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise FormatError(f"{self.what}: truncated while reading {field} at byte {self.pos} "
                              f"(needs {n} bytes, {len(self.data) - self.pos} left)")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt: str, field: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), field))


def load_params(data, what: str = "params") -> dict:
    """Parse bytes written by ``save_params`` into ``{name: np.ndarray}`` (fresh, writable arrays)."""
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    if not isinstance(data, bytes):
        raise FormatError(f"{what}: expected bytes, got {type(data).__name__}")
    if len(data) < len(PARAMS_MAGIC) + 16:
        raise FormatError(f"{what}: {len(data)} bytes is too short for a parameter file")
    if data[:len(PARAMS_MAGIC)] != PARAMS_MAGIC:
        raise FormatError(f"{what}: not a tensorvm parameter file (magic {data[:8]!r}, expected {PARAMS_MAGIC!r})")
    body, (checksum,) = data[:-4], struct.unpack("<I", data[-4:])
    reader = _Reader(body, what)
    reader.take(len(PARAMS_MAGIC), "magic")
    version, count = reader.unpack("<IQ", "header")
    if version != PARAMS_VERSION:
        raise FormatError(f"{what}: format version {version} is not supported (this build reads {PARAMS_VERSION})")
    if zlib.crc32(body) & 0xFFFFFFFF != checksum:
        raise FormatError(f"{what}: checksum mismatch (the file is corrupted)")
    params = {}
    for index in range(count):
        where = f"tensor {index}"
        (name_len,) = reader.unpack("<I", f"{where} name length")
        try:
            name = reader.take(name_len, f"{where} name").decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(f"{what}: {where} has a name that is not UTF-8") from None
        where = f"tensor {name!r}"
        (dtype_len,) = reader.unpack("<B", f"{where} dtype length")
        dtype = reader.take(dtype_len, f"{where} dtype").decode("ascii", "replace")
        if dtype not in PARAM_DTYPES:
            raise FormatError(f"{what}: {where} has unknown dtype {dtype!r}; expected one of {', '.join(PARAM_DTYPES)}")
        (ndim,) = reader.unpack("<I", f"{where} rank")
        if ndim > MAX_NDIM:
            raise FormatError(f"{what}: {where} has rank {ndim}, more than {MAX_NDIM}")
        shape = reader.unpack(f"<{ndim}q", f"{where} shape")
        if any(d < 0 for d in shape):
            raise FormatError(f"{what}: {where} has a negative dim in shape {shape}")
        itemsize = np.dtype(dtype).itemsize
        if math.prod(max(d, 1) for d in shape) * itemsize > MAX_BYTES:  # zero-size too: NumPy cannot shape it
            raise FormatError(f"{what}: {where} has shape {tuple(shape)} of {dtype}; expected dims whose nonzero "
                              f"product is at most {MAX_BYTES} bytes")
        (nbytes,) = reader.unpack("<Q", f"{where} size")
        expected = int(np.prod(shape, dtype=object)) * itemsize if shape else itemsize
        if nbytes != expected:
            raise FormatError(f"{what}: {where} has {nbytes} data bytes but shape {tuple(shape)} of {dtype} "
                              f"needs {expected}")
        raw = reader.take(nbytes, f"{where} data")
        if name in params:
            raise FormatError(f"{what}: tensor name {name!r} appears twice")
        array = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)
        params[name] = array.astype(np.dtype(dtype), copy=True)  # native byte order, writable
    if reader.pos != len(body):
        raise FormatError(f"{what}: {len(body) - reader.pos} unexpected bytes after the last tensor")
    return params


def save_param_file(path, params: dict) -> None:
    with open(os.fspath(path), "wb") as f:
        f.write(save_params(params))


def load_param_file(path) -> dict:
    try:
        with open(os.fspath(path), "rb") as f:
            data = f.read()
    except OSError as err:
        raise FormatError(f"cannot read params file {os.fspath(path)!r}: {err.strerror or err}") from None
    return load_params(data, what=os.fspath(path))
