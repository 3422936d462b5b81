"""The one atomic writer: fsync + rename, files left with the mode a plain open() gives."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from sciformer.utils.atomic import (
    atomic_open,
    atomic_write_bytes,
    atomic_write_text,
    atomic_write_with,
    current_umask,
)


@pytest.fixture
def umask():
    """Set a umask for the test, restore the previous one after."""
    previous = os.umask(0o022)
    os.umask(previous)

    def set_mask(mask: int) -> int:
        os.umask(mask)
        return mask

    yield set_mask
    os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _plain_open_mode(path: Path) -> int:
    with open(path, "w") as handle:  # the oracle: what a plain open gives
        handle.write("x")
    mode = _mode(path)
    path.unlink()
    return mode


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002, 0o077])
def test_new_files_get_the_plain_open_mode(tmp_path: Path, umask, mask: int) -> None:
    umask(mask)
    assert current_umask() == mask
    expected = _plain_open_mode(tmp_path / "oracle")
    assert expected == 0o666 & ~mask
    atomic_write_text(tmp_path / "a.txt", "hello")
    atomic_write_bytes(tmp_path / "b.bin", b"\x00\x01")
    atomic_write_with(tmp_path / "c.npy", lambda p: np.save(p, np.arange(3)))
    for name in ("a.txt", "b.bin", "c.npy"):
        assert _mode(tmp_path / name) == expected, name
    assert (tmp_path / "a.txt").read_text() == "hello"
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), np.arange(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin", "c.npy"]  # no temporaries left


def test_overwrite_keeps_the_existing_mode(tmp_path: Path, umask) -> None:
    umask(0o022)
    path = tmp_path / "shared.txt"
    path.write_text("old")
    path.chmod(0o664)
    atomic_write_text(path, "new")
    assert _mode(path) == 0o664 and path.read_text() == "new"


def test_failed_write_leaves_the_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    atomic_write_text(path, "previous")
    with pytest.raises(RuntimeError), atomic_open(path) as handle:
        handle.write("partial")
        raise RuntimeError("killed")
    assert path.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]
