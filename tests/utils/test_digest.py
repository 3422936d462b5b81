"""File digests against hashlib on the whole bytes, around the block and span sizes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from sciformer.utils.digest import BLOCK, ends_sha256, file_sha256

SPAN = 1 << 13  # ends_sha256's default


@pytest.mark.parametrize("size", [0, 1, SPAN - 1, SPAN, SPAN + 1, 2 * SPAN, 2 * SPAN + 7, BLOCK, BLOCK + 3, 3 * BLOCK - 1])
def test_file_sha256_is_the_sha256_of_the_bytes(tmp_path: Path, size: int) -> None:
    data = bytes((i * 7 + size) % 251 for i in range(size))
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("size", [1, SPAN, SPAN + 1, 2 * SPAN, 2 * SPAN + 1, 5 * SPAN])
def test_ends_sha256_sees_the_size_and_both_ends(tmp_path: Path, size: int) -> None:
    data = bytearray((i * 13) % 256 for i in range(size))
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(data)
    b.write_bytes(data)
    assert ends_sha256(a) == ends_sha256(b)  # equal files, equal digests
    for at in {0, size - 1}:  # a change in the first or the last byte shows
        changed = bytearray(data)
        changed[at] ^= 1
        b.write_bytes(changed)
        assert ends_sha256(a) != ends_sha256(b)
    b.write_bytes(data + b"\0")  # so does one byte more
    assert ends_sha256(a) != ends_sha256(b)
    if size > 2 * SPAN:  # the middle is not read: only file_sha256 tells these apart
        changed = bytearray(data)
        changed[size // 2] ^= 1
        b.write_bytes(changed)
        assert ends_sha256(a) == ends_sha256(b) and file_sha256(a) != file_sha256(b)
