"""Canonical JSON and content digests: the pure core every key is built from."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def canonical_json(value: Any) -> bytes:
    """Serialise ``value`` so that equal data always gives equal bytes.

    Keys are sorted, separators carry no whitespace and text is UTF-8, so dict
    insertion order and formatting never change a hash.
    """
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    """Return the lowercase hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def canonical_hash(value: Any) -> str:
    """Return the sha256 hex digest of ``canonical_json(value)``."""
    return sha256_hex(canonical_json(value))


def sha256_file(path: Path) -> str:
    """Return the sha256 hex digest of a file, read in chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_chunks(chunks: Iterable[bytes]) -> str:
    """Return the sha256 hex digest of a stream of chunks."""
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk)
    return h.hexdigest()
