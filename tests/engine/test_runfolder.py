"""A new run never writes over, beside or instead of a user's files (``sciformer.engine.runfolder``)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from sciformer.cli import main
from sciformer.engine.runfolder import RunFolderError, check_new_run_dir

# Names a user's folder may hold, run-file names among them (a run must not take those either).
USER_NAMES = ["config.yaml", "metrics.csv", "env.json", "train.log", "notes.txt", ".notes.tmp1", ".hidden",
              "splits.npz", "checkpoints/best.pt", "checkpoints/mine.pt", "predictions/a.ply", "data/x.las"]


def _snapshot(folder: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every entry under ``folder``: its bytes (None for folders and special files) and mtime."""
    out = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        out[str(path.relative_to(folder))] = (data, st.st_mtime_ns)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_train_refuses_a_folder_with_user_files_and_touches_nothing(toy_config: Path, tmp_path: Path, seed: int,
                                                                    capsys: pytest.CaptureFixture) -> None:
    rng = random.Random(seed)
    folder = tmp_path / "mine"
    folder.mkdir()
    for name in rng.sample(USER_NAMES, rng.randint(1, 4)):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(f"user data {name}\n")
    if seed % 3 == 0:
        os.mkfifo(folder / "pipe")  # a special file is never opened
    if seed % 2 == 0:
        (folder / "link").symlink_to(tmp_path / "elsewhere")
    before = _snapshot(folder)
    assert main(["train", "-c", str(toy_config), "-o", str(folder), "train.epochs=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("is not a sciformer run" in err[0] or "already holds a run" in err[0]), err
    assert _snapshot(folder) == before


def test_pretrain_refuses_a_folder_with_user_files(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "pretrain.json").write_text("{}\n")
    before = _snapshot(folder)
    with pytest.raises(RunFolderError, match="is not a sciformer run"):
        check_new_run_dir(folder, resume_hint=False)
    assert _snapshot(folder) == before


def test_an_unfinished_run_folder_is_taken_over(toy_config: Path, tmp_path: Path) -> None:
    """What a run killed before its first checkpoint leaves (lock, records, a temporary) is replaced."""
    run = tmp_path / "run"
    run.mkdir()
    for name in (".lock", "config.yaml", "env.json", "train.log", "metrics.csv", ".env.json.x1y2.tmp"):
        (run / name).write_text("stale\n")
    (run / "checkpoints").mkdir()
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.epochs=1"]) == 0
    assert (run / "checkpoints" / "best.pt").is_file() and (run / "metrics.json").is_file()
    assert "stale" not in (run / "config.yaml").read_text() and not (run / ".env.json.x1y2.tmp").exists()


@pytest.mark.parametrize("finished", ["metrics.json", "checkpoints/best.pt", "checkpoints/last.pt"])
def test_a_folder_with_a_run_result_is_refused(tmp_path: Path, finished: str) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".lock").write_text("")
    (run / finished).write_text("result\n")
    with pytest.raises(RunFolderError, match="already holds a run") as info:
        check_new_run_dir(run)
    assert ("--resume" in str(info.value)) == finished.endswith("last.pt")


def test_absent_and_empty_folders_are_accepted(tmp_path: Path) -> None:
    check_new_run_dir(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    check_new_run_dir(tmp_path / "empty")


def test_a_failed_run_leaves_no_folder_it_created(toy_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Failing after the lock (fp16 on a CPU) removes the run folder and the parents it created, not older ones."""
    (tmp_path / "old").mkdir()
    for out in (tmp_path / "nest" / "a" / "b", tmp_path / "old" / "a" / "b"):
        assert main(["train", "-c", str(toy_config), "-o", str(out), "train.amp=fp16"]) == 2
        assert "fp16 needs a CUDA device" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old", "toy.yaml"]
    assert list((tmp_path / "old").iterdir()) == []
