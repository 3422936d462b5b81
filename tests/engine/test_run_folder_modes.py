"""Run-folder files are readable as a plain open() would leave them (umask), not 0600."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sciformer.cli import main


def test_run_folder_files_get_the_umask_mode(toy_config: Path, tmp_path: Path) -> None:
    previous = os.umask(0o027)
    try:
        run = tmp_path / "run"
        assert main(["train", "--config", str(toy_config), "--output-dir", str(run), "train.epochs=1"]) == 0
        with open(tmp_path / "oracle", "w") as handle:  # what a plain open gives under this umask
            handle.write("x")
    finally:
        os.umask(previous)
    expected = stat.S_IMODE((tmp_path / "oracle").stat().st_mode)
    assert expected == 0o640
    names = ["config.yaml", "env.json", "metrics.csv", "metrics.json", "per_class.csv", "confusion_matrix.csv",
             "checkpoints/last.pt", "checkpoints/best.pt"]
    modes = {name: oct(stat.S_IMODE((run / name).stat().st_mode)) for name in names}
    assert modes == {name: oct(expected) for name in names}
