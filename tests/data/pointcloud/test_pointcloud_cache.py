"""Preprocessing caches: stable keys and atomically written array folders."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from sciformer.data.pointcloud.cache import (
    cache_key,
    file_identity,
    load_arrays,
    save_arrays_atomic,
)


def test_cache_key_stable_and_sensitive(tmp_path: Path) -> None:
    assert cache_key("v1", tmp_path, 1024) == cache_key("v1", str(tmp_path), 1024)
    assert cache_key("v1", tmp_path, 1024) != cache_key("v1", tmp_path, 2048)
    assert len(cache_key("x")) == 16


def test_file_identity_changes_with_content(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("1")
    first = file_identity(path)
    path.write_text("12")
    assert file_identity(path) != first


def test_file_identity_changes_when_rewrite_restores_size_and_mtime(tmp_path: Path) -> None:
    """A rewrite of the same size whose modification time is put back (os.utime, cp -p,
    rsync -a, tar x) is a different file to a cache: the change time and inode tell it apart."""
    path = tmp_path / "scan.bin"
    path.write_bytes(b"ab")
    st = path.stat()
    first = file_identity(path)
    time.sleep(0.05)  # past the clock tick of the inode's timestamps
    path.write_bytes(b"cd")  # same inode, same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns
    second = file_identity(path)
    assert second != first
    other = tmp_path / "other.bin"  # cp -p of another file of that size over it: a new inode
    other.write_bytes(b"ef")
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, path)
    assert file_identity(path) not in (first, second)


def test_save_and_load_arrays(tmp_path: Path) -> None:
    folder = tmp_path / "c" / "room"
    save_arrays_atomic(folder, {"coord": np.ones((4, 3), np.float32), "label": np.arange(4)}, {"points": 4})
    assert sorted(os.listdir(folder)) == ["coord.npy", "label.npy", "meta.json"]
    assert sorted(os.listdir(folder.parent)) == ["room"]  # no temp folder left
    loaded = load_arrays(folder, ["coord", "label", "colour"])
    assert set(loaded) == {"coord", "label"} and isinstance(loaded["coord"], np.memmap)
    np.testing.assert_array_equal(loaded["label"], np.arange(4))
    # a second writer finding the folder complete leaves it as it is
    save_arrays_atomic(folder, {"coord": np.zeros((1, 3))}, {"points": 1})
    assert load_arrays(folder, ["coord"])["coord"].shape == (4, 3)
