"""``sciformer evaluate`` holds its output folder while it writes it (``sciformer.engine.evaluation``):
a second evaluation into the folder is refused, one that finished there meanwhile is not written
over, and a failed evaluation leaves neither a lock file nor a folder it created."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sciformer.cli import main
from sciformer.engine import evaluation, report
from sciformer.engine.evaluation import EVALUATION_LOCK
from sciformer.engine.folder_lock import drop_folder_lock, open_folder_lock


@pytest.fixture
def run(toy_run: Path) -> Path:
    return toy_run


def _one_error_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("overwrite", [False, True])
def test_an_evaluation_into_a_folder_being_evaluated_is_refused(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                overwrite: bool) -> None:
    out = tmp_path / "eval"
    held = open_folder_lock(out, EVALUATION_LOCK)  # another evaluation is writing here
    argv = ["evaluate", "--checkpoint", str(run), "-o", str(out)] + (["--overwrite"] if overwrite else [])
    assert main(argv) == 2
    assert "being written by another sciformer process" in _one_error_line(capsys)
    assert sorted(p.name for p in out.iterdir()) == [EVALUATION_LOCK]  # nothing of ours written
    drop_folder_lock(out, EVALUATION_LOCK, held)
    assert main(argv) == 0  # free again
    assert (out / "metrics.json").is_file() and not (out / EVALUATION_LOCK).exists()


def test_an_evaluation_finished_there_while_waiting_for_the_lock_is_kept(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "eval"
    real = evaluation.open_folder_lock

    def after_another(folder: Path, name: str, **kwargs):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.json").write_text('{"split": "test", "miou_rule": "", "theirs": true}\n')  # finished between the first check and the lock
        return real(folder, name, **kwargs)

    monkeypatch.setattr(evaluation, "open_folder_lock", after_another)
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(out)]) == 2
    assert "already holds metrics.json" in _one_error_line(capsys)
    assert json.loads((out / "metrics.json").read_text())["theirs"] is True
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json"]  # the lock file went


@pytest.mark.parametrize("existing", [False, True])
def test_a_failed_evaluation_leaves_no_lock_and_no_folder_it_created(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                     monkeypatch: pytest.MonkeyPatch, existing: bool) -> None:
    out = tmp_path / "new" / "deeper" / "eval"
    if existing:
        out.mkdir(parents=True)
        (out / "notes.txt").write_text("mine\n")

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "write_evaluation", fail)
    with pytest.raises(OSError):
        evaluation.evaluate_checkpoints([run], [], out)
    if existing:  # the user's folder stays, with only what was there (the toy task exports no predictions)
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
        assert (out / "notes.txt").read_text() == "mine\n"
    else:  # the folders it created go, up to the first that was there before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "toy.yaml"]
    monkeypatch.undo()
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(tmp_path / "later")]) == 0
    assert not (tmp_path / "later" / EVALUATION_LOCK).exists()
