"""The one atomic writer: fsync + rename, files left with the mode a plain open() gives."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from sciformer.utils.atomic import (
    atomic_folder,
    atomic_open,
    atomic_write_bytes,
    atomic_write_text,
    atomic_write_with,
    current_umask,
    temporary_of,
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


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_atomic_folder_gets_the_plain_mkdir_mode(tmp_path: Path, umask, mask: int) -> None:
    umask(mask)
    (tmp_path / "oracle").mkdir()  # the oracle: what a plain mkdir gives
    expected = _mode(tmp_path / "oracle")
    (tmp_path / "oracle").rmdir()
    with atomic_folder(tmp_path / "cache" / "entry") as tmp:
        np.save(tmp / "a.npy", np.arange(3))
        assert not (tmp_path / "cache" / "entry").exists()  # nothing at the final name before the block ends
    folder = tmp_path / "cache" / "entry"
    assert _mode(folder) == expected
    assert _mode(folder / "a.npy") == 0o666 & ~mask
    assert sorted(p.name for p in folder.parent.iterdir()) == ["entry"]


def test_failed_atomic_folder_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), atomic_folder(tmp_path / "entry") as tmp:
        (tmp / "part.npy").write_bytes(b"x")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_temporary_of_recognises_the_names_the_writer_gives_and_nothing_else(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Oracle: the temporaries atomic_write_text really creates (caught when the write fails), not a pattern copy."""
    seen: list[str] = []
    real_replace = os.replace

    def failing_replace(src, dst):  # the write fails after the temporary exists: record its name
        seen.append(Path(src).name)
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    for name in ("config.yaml", "last.pt", "map.HDR", "notes"):
        with pytest.raises(OSError):
            atomic_write_text(tmp_path / name, "x")
    monkeypatch.setattr(os, "replace", real_replace)
    assert [temporary_of(n) for n in seen] == ["config.yaml", "last.pt", "map.HDR", "notes"]
    for lookalike in (".plan.tmpl", ".notes.tmp", ".notes.abc.tmp", "config.yaml.abcd1234.tmp", ".x.ABCD1234.tmp.yaml", ".x.abcd12345.tmp"):
        assert temporary_of(lookalike) is None, lookalike
