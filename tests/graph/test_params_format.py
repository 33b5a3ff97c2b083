"""The binary params format: round trips of every dtype and shape, and every kind of corrupt file."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tensorvm as tv
from tensorvm.graph.params import PARAM_DTYPES, PARAMS_MAGIC, load_params, save_params

arrays = st.sampled_from(PARAM_DTYPES).flatmap(
    lambda dtype: hnp.arrays(np.dtype(dtype), hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)))


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.text(min_size=0, max_size=12), arrays, max_size=5))
def test_round_trip_preserves_names_dtypes_shapes_and_bits(params):
    loaded = load_params(save_params(params))
    assert list(loaded) == list(params)
    for name, array in params.items():
        got = loaded[name]
        assert got.dtype == array.dtype and got.shape == array.shape
        assert got.tobytes() == np.ascontiguousarray(array).tobytes()  # bit-exact, NaNs included
        assert got.flags.writeable


def test_layout_matches_the_documentation():
    data = save_params({"w": np.array([[1, 2, 3]], dtype="int16")})
    assert data[:8] == PARAMS_MAGIC
    version, count = struct.unpack_from("<IQ", data, 8)
    assert (version, count) == (1, 1)
    pos = 20
    (name_len,) = struct.unpack_from("<I", data, pos)
    assert data[pos + 4:pos + 4 + name_len] == b"w"
    pos += 4 + name_len
    assert data[pos] == len("int16") and data[pos + 1:pos + 6] == b"int16"
    pos += 6
    ndim, d0, d1 = struct.unpack_from("<Iqq", data, pos)
    assert (ndim, d0, d1) == (2, 1, 3)
    pos += 4 + 16
    (nbytes,) = struct.unpack_from("<Q", data, pos)
    assert nbytes == 6 and data[pos + 8:pos + 14] == np.array([1, 2, 3], "<i2").tobytes()
    (checksum,) = struct.unpack_from("<I", data, pos + 14)
    assert checksum == zlib.crc32(data[:pos + 14]) and len(data) == pos + 18


def _resealed(body: bytes) -> bytes:
    """``body`` with a correct checksum, so the reader gets past the CRC to the field checks."""
    return body + struct.pack("<I", zlib.crc32(body))


def _body(params):
    return save_params(params)[:-4]


@pytest.mark.parametrize("make, message", [
    (lambda: b"", "too short"),
    (lambda: b"NOTPARAM" + bytes(20), "not a tensorvm parameter file"),
    (lambda: _resealed(PARAMS_MAGIC + struct.pack("<IQ", 7, 0)), "version 7"),
    (lambda: save_params({"a": np.ones(3, "float32")})[:-9], "checksum|truncated"),
    (lambda: _resealed(_body({"a": np.ones(3, "float32")})[:-3]), "truncated"),
    (lambda: _resealed(_body({"a": np.ones(3, "float32")}) + b"xx"), "unexpected bytes"),
    (lambda: _resealed(_body({"a": np.ones(3, "float32")}).replace(b"float32", b"float99")), "unknown dtype"),
    (lambda: _resealed(_body({"a": np.ones(3, "float32")}).replace(struct.pack("<Q", 12), struct.pack("<Q", 8))),
     "needs 12"),
    (lambda: _resealed(PARAMS_MAGIC + struct.pack("<IQ", 1, 2) + _body({"a": np.ones(1, "int8")})[20:] * 2),
     "appears twice"),
    # a zero-size tensor whose other dim is 2**63-1: no bytes to read, but NumPy cannot shape it
    (lambda: _resealed(_body({"a": np.ones((0, 1), "float32")}).replace(struct.pack("<qq", 0, 1),
                                                                        struct.pack("<qq", 0, 2**63 - 1))),
     "nonzero product"),
    (lambda: _resealed(_body({"a": np.ones((0, 1), "float32")}).replace(struct.pack("<qq", 0, 1),
                                                                        struct.pack("<qq", 0, 2**62))),
     "nonzero product"),  # 2**62 elements of 4 bytes
])
def test_corrupt_files_raise_format_error(make, message):
    with pytest.raises(tv.FormatError, match=message):
        load_params(make())


def test_any_flipped_byte_is_detected():
    data = bytearray(save_params({"w": np.arange(10, dtype="float32"), "b": np.ones(2, "int64")}))
    for position in range(0, len(data), 7):
        corrupt = bytearray(data)
        corrupt[position] ^= 0x40
        with pytest.raises(tv.FormatError):
            load_params(bytes(corrupt))


def test_unsupported_values_are_refused_when_saving():
    with pytest.raises(tv.FormatError, match="complex128"):
        save_params({"z": np.ones(2, complex)})
    with pytest.raises(tv.FormatError, match="names must be strings"):
        save_params({3: np.ones(2)})
