"""Integrity checksums of the graph executor's JSON files (``graph.json``, ``lib.json``).

A document carries ``"checksum": "sha256:<64 hex digits>"`` (in ``graph.json`` under
``metadata``, in ``lib.json`` at the top level): the SHA-256 of the document's canonical form
without that field — ``json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)``
as UTF-8. The canonical form makes the checksum independent of whitespace and key order, so the
files stay readable and may be re-indented, while any change to a value is detected.
"""

from __future__ import annotations

import hashlib
import json

from ..errors import FormatError

__all__ = ["CHECKSUM_PREFIX", "checksum_of", "seal", "verify", "loads_json"]

CHECKSUM_PREFIX = "sha256:"


def _canonical(doc) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("utf-8")


def checksum_of(doc: dict, holder: dict) -> str:
    """The checksum of ``doc`` with ``holder["checksum"]`` left out (``holder`` is ``doc`` or inside it)."""
    saved = holder.pop("checksum", None)
    try:
        return CHECKSUM_PREFIX + hashlib.sha256(_canonical(doc)).hexdigest()
    finally:
        if saved is not None:
            holder["checksum"] = saved


def seal(doc: dict, holder: dict) -> str:
    """``doc`` as readable JSON text with its checksum stored in ``holder["checksum"]``."""
    holder["checksum"] = checksum_of(doc, holder)
    return json.dumps(doc, indent=1)


def verify(doc: dict, holder: dict, what: str) -> None:
    """Raise ``FormatError`` unless ``holder["checksum"]`` is the checksum of ``doc``."""
    stored = holder.get("checksum")
    if not isinstance(stored, str) or not stored.startswith(CHECKSUM_PREFIX):
        raise FormatError(f'{what}: expected a checksum "{CHECKSUM_PREFIX}<64 hex digits>", got {str(stored)[:80]!r}')
    actual = checksum_of(doc, holder)
    if stored != actual:
        raise FormatError(f"{what}: checksum mismatch (stored {stored[:23]}..., the content gives {actual[:23]}...): "
                          f"the file was edited or corrupted")


def loads_json(text, what: str):
    """``json.loads`` whose every failure — bad syntax, nesting deeper than the parser's stack, an
    integer of more digits than Python converts, bytes that are not UTF-8 — is a ``FormatError``."""
    try:
        return json.loads(text)
    except RecursionError:
        raise FormatError(f"{what}: expected JSON nested at most a few hundred levels deep, got deeper "
                          f"nesting") from None
    except (ValueError, TypeError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise FormatError(f"{what}: not valid JSON ({err})") from None
