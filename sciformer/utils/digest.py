"""SHA-256 digests of files, read in blocks (never whole into memory)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import BinaryIO

BLOCK = 1 << 20  # bytes read at a time


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of the whole file."""
    with open(path, "rb") as handle:
        return stream_sha256(handle)


def stream_sha256(handle: BinaryIO) -> str:
    """Hex SHA-256 of what is left to read in an open binary file."""
    digest = hashlib.sha256()
    for block in iter(lambda: handle.read(BLOCK), b""):
        digest.update(block)
    return digest.hexdigest()


def ends_sha256(path: Path, span: int = 1 << 13) -> str:
    """Hex SHA-256 of the file's size, its first and its last ``span`` bytes: a cheap first
    test of equal content (equal files give equal digests; different ones almost never do
    unless they differ only in the middle)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        size = handle.seek(0, 2)
        digest.update(size.to_bytes(8, "little"))
        handle.seek(0)
        digest.update(handle.read(span))
        if size > span:
            handle.seek(max(span, size - span))
            digest.update(handle.read(span))
    return digest.hexdigest()
