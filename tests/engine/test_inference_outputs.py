"""``predict``'s output plan, checked before anything is loaded: never an input file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sciformer.engine.inference import plan_outputs
from sciformer.errors import SciformerError

SUFFIXES = (".npy", ".npz", ".ply")


def test_a_hard_link_to_the_input_is_the_input(tmp_path: Path) -> None:
    """A hard link passed every path comparison; with --overwrite its name was replaced."""
    scan = tmp_path / "room.npy"
    scan.write_bytes(b"points")
    os.link(scan, tmp_path / "link.npy")
    assert os.path.samefile(scan, tmp_path / "link.npy")  # oracle: the OS says it is the same file
    with pytest.raises(SciformerError, match="is an input file"):
        plan_outputs([scan], tmp_path / "link.npy", SUFFIXES, overwrite=True)
    os.symlink(scan, tmp_path / "sym.npy")
    with pytest.raises(SciformerError, match="is an input file"):
        plan_outputs([scan], tmp_path / "sym.npy", SUFFIXES, overwrite=True)
    (tmp_path / "other.npy").write_bytes(b"x")  # a different existing file: --overwrite may replace it
    assert plan_outputs([scan], tmp_path / "other.npy", SUFFIXES, overwrite=True) == [(scan, tmp_path / "other.npy")]
