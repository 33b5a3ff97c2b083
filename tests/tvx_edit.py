"""Editing saved executables the way an attacker would: split into sections, change, join and reseal."""

from __future__ import annotations

import hashlib
import struct

from tensorvm.vm.serialize import MAGIC


def split(data: bytes) -> tuple[bytes, list]:
    """``(header bytes, [(tag, payload), ...])`` of an executable's bytes (checksum dropped)."""
    pos = len(MAGIC) + 8
    for _ in range(2):  # exec mode, target
        pos += 4 + struct.unpack_from("<I", data, pos)[0]
    header, sections, end = data[:pos], [], len(data) - 32
    while pos < end:
        tag, size = bytes(data[pos:pos + 4]), struct.unpack_from("<Q", data, pos + 4)[0]
        sections.append((tag, bytes(data[pos + 12:pos + 12 + size])))
        pos += 12 + size
    return header, sections


def join(header: bytes, sections: list) -> bytes:
    body = header + b"".join(tag + struct.pack("<Q", len(payload)) + payload for tag, payload in sections)
    return body + hashlib.sha256(body).digest()
