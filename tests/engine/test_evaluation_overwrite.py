"""``sciformer evaluate --overwrite`` replaces an earlier *evaluation's* files, never a user's.

An evaluation records in ``predictions/`` (:data:`~sciformer.engine.report.PREDICTIONS_RECORD`)
every file and folder it exported there. ``--overwrite`` replaces exactly such a set; a
``predictions/`` holding anything no evaluation recorded is refused in one line before any data
is read, naming the first such entry. Decided for an evaluation an older sciformer wrote (no
record): it is refused the same way (its files cannot be told from a user's); the user moves
``predictions/`` away. A run's own folder (training's final evaluation, a resumed run) still
replaces its whole ``predictions/``, recorded or not.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from sciformer.cli import main
from sciformer.engine import builders
from sciformer.engine.evaluation import check_evaluation_dir
from sciformer.engine.metrics import scores_from_confusion
from sciformer.engine.report import PREDICTIONS_RECORD, unrecorded_entry, unrecorded_table, write_evaluation_set
from sciformer.errors import SciformerError
from sciformer.utils.atomic import stale_stages

SCORES = scores_from_confusion(np.array([[3, 1], [0, 4]]))
NAMES = ["a", "b"]


def _files(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones too) -> its text."""
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def _export(files: dict[str, str]):
    def export(stage: Path) -> None:
        for name, text in files.items():
            (stage / name).parent.mkdir(parents=True, exist_ok=True)
            (stage / name).write_text(text)
    return export


@pytest.fixture
def run(toy_run: Path) -> Path:
    return toy_run


@pytest.fixture
def exporting(toy_blobs_class: type, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The toy task exports ``pred_<n>.npy`` (n counts its evaluations) into ``predictions/``."""
    done: list[str] = []

    def export_predictions(self, predict, out_dir: Path, *args, **kwargs) -> dict:
        done.append(f"pred_{len(done) + 1}.npy")
        (out_dir / "sub").mkdir()
        (out_dir / "sub" / done[-1]).write_text("new")
        return {}

    monkeypatch.setattr(toy_blobs_class, "export_predictions", export_predictions)
    return done


def test_a_users_file_in_predictions_is_refused_and_kept(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    (out / "predictions").mkdir(parents=True)
    (out / "predictions" / "keep.txt").write_text("precious\n")
    (out / "metrics.json").write_text('{"mine": 1}\n')
    before = _files(out)

    def no_data(*args, **kwargs):
        raise AssertionError("data read before the folder was checked")

    monkeypatch.setattr(builders, "build_task", no_data)
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "predictions/keep.txt" in err[0] and "move it" in err[0], err
    assert _files(out) == before and sorted(os.listdir(out)) == ["metrics.json", "predictions"]


def test_a_second_overwrite_replaces_exactly_the_earlier_evaluation(run: Path, tmp_path: Path, exporting: list[str],
                                                                     capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(out)]) == 0
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(out), "--overwrite"]) == 0
    files = _files(out / "predictions")
    record = json.loads(files.pop(PREDICTIONS_RECORD))
    assert files == {"sub/pred_2.npy": "new"}  # only the new set: nothing of the earlier one stays beside it
    assert record["files"] == ["sub/pred_2.npy"] and record["folders"] == ["sub"]
    assert sorted(os.listdir(out)) == ["confusion_matrix.csv", "metrics.json", "per_class.csv", "predictions"]
    (out / "predictions" / "sub" / "mine.txt").write_text("mine")  # a user's file inside a recorded folder
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(out), "--overwrite"]) == 2
    assert "predictions/sub/mine.txt" in capsys.readouterr().err
    assert (out / "predictions" / "sub" / "mine.txt").read_text() == "mine" and len(exporting) == 2


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("mine", [{"per_class.csv": "my precious\n"}, {"metrics.json": '{"mine": 1}\n', "per_class.csv": "x\n"}])
def test_a_users_tables_in_a_folder_without_an_evaluation_are_refused_and_kept(
        run: Path, tmp_path: Path, capsys: pytest.CaptureFixture, mine: dict[str, str], overwrite: bool) -> None:
    """A folder holding files named like an evaluation's tables that no evaluation wrote (no
    evaluation's metrics.json, no recorded predictions/): refused in one line, --overwrite or not."""
    out = tmp_path / "out"
    out.mkdir()
    for name, text in mine.items():
        (out / name).write_text(text)
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(out), *(["--overwrite"] if overwrite else [])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no earlier sciformer evaluation" in err[0] and "an earlier evaluation)" not in err[0], err
    assert _files(out) == mine


def test_what_counts_as_an_evaluations_tables(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_evaluation_set(out, "test", SCORES, NAMES, {}, _export({"a.npy": "x"}))
    assert unrecorded_table(out) is None  # a finished evaluation
    (out / "metrics.json").unlink()  # one cut short before its metrics.json: its recorded predictions vouch for it
    assert unrecorded_table(out) is None
    (out / "predictions" / PREDICTIONS_RECORD).unlink()
    assert unrecorded_table(out) == "per_class.csv"
    (out / "per_class.csv").unlink()
    (out / "per_class.csv").symlink_to(tmp_path)  # not a regular file: not an evaluation's
    assert unrecorded_table(out) == "per_class.csv"


def test_an_evaluation_written_before_miou_rule_was_recorded_counts(tmp_path: Path) -> None:
    """metrics.json of sciformer versions before miou_rule (split and the scores only), a shape
    dataset's (no predictions/): --overwrite replaces it as before; a user's own metrics.json does not count."""
    import json

    out = tmp_path / "out"
    write_evaluation_set(out, "test", SCORES, NAMES, {}, _export({"a.npy": "x"}))
    metrics = json.loads((out / "metrics.json").read_text())
    metrics.pop("miou_rule")
    (out / "metrics.json").write_text(json.dumps(metrics))
    shutil.rmtree(out / "predictions")
    assert unrecorded_table(out) is None
    (out / "metrics.json").write_text(json.dumps({"split": "test", "note": "mine"}))
    assert unrecorded_table(out) == "metrics.json"


@pytest.mark.parametrize("record", [None, "not json", '{"files": ["a.npy"]}'])
def test_an_unrecorded_or_unreadably_recorded_set_is_refused(tmp_path: Path, record: str | None) -> None:
    """An older sciformer's evaluation (no record), or a record that cannot be read: refused."""
    out = tmp_path / "out"
    (out / "predictions").mkdir(parents=True)
    (out / "predictions" / "a.npy").write_text("old")
    if record is not None:
        (out / "predictions" / PREDICTIONS_RECORD).write_text(record)
    with pytest.raises(SciformerError, match="holds predictions/"):
        check_evaluation_dir(out, overwrite=True)
    assert (out / "predictions" / "a.npy").read_text() == "old"


def test_what_a_record_covers(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert unrecorded_entry(out) is None  # nothing there
    (out / "predictions").mkdir(parents=True)
    assert unrecorded_entry(out) is None  # an empty folder: nothing to lose
    write_evaluation_set(out, "test", SCORES, NAMES, {}, _export({"a.npy": "x", "d/b.npy": "y"}))
    assert unrecorded_entry(out) is None
    check_evaluation_dir(out, overwrite=True)
    (out / "predictions" / "a.npy").unlink()
    assert unrecorded_entry(out) is None  # part of the set: still only an evaluation's files
    (out / "predictions" / "a.npy").symlink_to(tmp_path)  # a link where a recorded file was: not ours
    assert unrecorded_entry(out) == "predictions/a.npy"
    (out / "predictions" / "a.npy").unlink()
    (out / "predictions" / "e").mkdir()  # an empty folder of the user's
    assert unrecorded_entry(out) == "predictions/e"


def test_a_link_named_predictions_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "theirs").mkdir()
    (out / "predictions").symlink_to(tmp_path / "theirs")
    with pytest.raises(SciformerError, match="holds predictions,"):
        check_evaluation_dir(out, overwrite=True)


def test_a_file_added_while_evaluating_is_kept_and_the_earlier_set_stays(tmp_path: Path) -> None:
    """The check is made again just before the swap: a failure there removes only the stage."""
    out = tmp_path / "out"
    write_evaluation_set(out, "test", SCORES, NAMES, {"round": 1}, _export({"a.npy": "old"}))
    before = _files(out)

    def export(stage: Path) -> None:
        (stage / "a.npy").write_text("new")
        (out / "predictions" / "late.txt").write_text("theirs")  # dropped in meanwhile

    with pytest.raises(SciformerError, match="predictions/late.txt"):
        write_evaluation_set(out, "test", SCORES, NAMES, {"round": 2}, export, only_recorded=True)
    assert _files(out) == {**before, "predictions/late.txt": "theirs"} and not stale_stages(out / "predictions")


def test_a_runs_own_predictions_are_replaced_recorded_or_not(tmp_path: Path) -> None:
    """Training's final evaluation (a resumed run, one an older sciformer made): the run's folder is its own."""
    run = tmp_path / "run"
    (run / "predictions").mkdir(parents=True)
    (run / "predictions" / "old_map.npy").write_text("old")  # no record
    write_evaluation_set(run, "test", SCORES, NAMES, {}, _export({"map.npy": "new"}))
    assert sorted(_files(run / "predictions")) == [PREDICTIONS_RECORD, "map.npy"]
