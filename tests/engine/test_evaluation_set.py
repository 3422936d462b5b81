"""An evaluation's files are written as one set (``sciformer.engine.report.write_evaluation_set``):
an earlier evaluation stays whole until the new predictions are complete, a failure at any point
leaves either the whole old set or no set (never new predictions beside an old metrics.json), and
a signal that ends the process inside an import still removes what the evaluation started."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from sciformer.engine import report
from sciformer.engine.metrics import scores_from_confusion
from sciformer.engine.report import PREDICTIONS_RECORD, write_evaluation_set
from sciformer.utils.atomic import stale_stages

SCORES = scores_from_confusion(np.array([[3, 1], [0, 4]]))
NAMES = ["a", "b"]


def _exporter(files: dict[str, str], fail_after: int | None = None):
    """An export that writes ``files`` into the stage, failing after ``fail_after`` of them."""
    def export(stage: Path) -> dict[str, object]:
        for i, (name, text) in enumerate(files.items()):
            if fail_after is not None and i == fail_after:
                raise OSError(28, "No space left on device")
            (stage / name).write_text(text)
        return {"written": sorted(files)}
    return export


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones too) -> its text."""
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def _predictions(folder: Path) -> dict[str, str]:
    """The exported files of ``folder/predictions`` -> their text; its record must name exactly them."""
    files = _snapshot(folder / "predictions")
    record = json.loads(files.pop(PREDICTIONS_RECORD))
    assert record["files"] == sorted(files) and record["folders"] == []
    return files


@pytest.fixture
def earlier(tmp_path: Path) -> Path:
    """A folder holding a whole earlier evaluation and a file of the user's."""
    out = tmp_path / "eval"
    write_evaluation_set(out, "test", SCORES, NAMES, {"round": 1}, _exporter({"old_pred.npy": "old", "shared.png": "old"}))
    (out / "notes.txt").write_text("mine\n")
    return out


def test_a_new_set_replaces_the_whole_old_one(earlier: Path) -> None:
    payload = write_evaluation_set(earlier, "test", SCORES, NAMES, {"round": 2}, _exporter({"shared.png": "new", "new_pred.npy": "new"}))
    assert payload["round"] == 2 and payload["written"] == ["new_pred.npy", "shared.png"]
    assert json.loads((earlier / "metrics.json").read_text())["round"] == 2
    assert _predictions(earlier) == {"new_pred.npy": "new", "shared.png": "new"}  # the old-only file is gone too
    assert sorted(p.name for p in earlier.iterdir()) == ["confusion_matrix.csv", "metrics.json", "notes.txt", "per_class.csv", "predictions"]


@pytest.mark.parametrize("fail_after", [0, 1])
def test_a_failed_export_leaves_the_earlier_evaluation_whole(earlier: Path, fail_after: int) -> None:
    before = _snapshot(earlier)
    with pytest.raises(OSError):
        write_evaluation_set(earlier, "test", SCORES, NAMES, {"round": 2}, _exporter({"x.npy": "new", "shared.png": "new"}, fail_after))
    assert _snapshot(earlier) == before  # byte for byte, and no stage folder left


@pytest.mark.parametrize("failing", ["per_class.csv", "confusion_matrix.csv", "metrics.json"])
def test_a_failure_after_the_swap_leaves_no_set(earlier: Path, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    """Once the new predictions are in, a failure removes them with the tables: never new
    predictions beside an old (or missing) metrics.json; the user's file stays."""
    real = report.atomic_write_text

    def write(path, text):
        if Path(path).name == failing:
            raise OSError(28, "No space left on device")
        real(path, text)

    monkeypatch.setattr(report, "atomic_write_text", write)
    with pytest.raises(OSError):
        write_evaluation_set(earlier, "test", SCORES, NAMES, {"round": 2}, _exporter({"new_pred.npy": "new"}))
    assert sorted(p.name for p in earlier.iterdir()) == ["notes.txt"]


def test_an_export_of_no_files_leaves_no_predictions_folder(earlier: Path) -> None:
    write_evaluation_set(earlier, "test", SCORES, NAMES, {"round": 2}, lambda stage: None)
    assert not (earlier / "predictions").exists()  # the old predictions were not this evaluation's
    assert json.loads((earlier / "metrics.json").read_text())["round"] == 2


def test_stages_an_interrupted_process_left_are_removed_and_nothing_else(earlier: Path) -> None:
    for name in (".predictions.sciformer-stage-abcd1234", ".predictions.sciformer-old-0123abcd"):
        (earlier / name).mkdir()
        (earlier / name / "half.npy").write_text("half")
    users = [".predictions.partial-abcd1234", ".predictions.replaced-12345678", ".photos.sciformer-stage-abcd1234",
             ".predictions.sciformer-stage-mine", ".predictions.sciformer-old-ABCDEFGH"]
    for name in users:  # names a user may give: kept with their files
        (earlier / name).mkdir()
        (earlier / name / "mine.txt").write_text("mine")
    (earlier / ".predictions.sciformer-stage-fedc4321").write_text("a file, not a stage")
    assert {p.name for p in stale_stages(earlier / "predictions")} == {".predictions.sciformer-stage-abcd1234",
                                                                       ".predictions.sciformer-old-0123abcd"}
    write_evaluation_set(earlier, "test", SCORES, NAMES, {}, _exporter({"p.npy": "new"}))
    hidden = sorted(p.name for p in earlier.iterdir() if p.name.startswith("."))
    assert hidden == sorted([*users, ".predictions.sciformer-stage-fedc4321"])
    assert all((earlier / name / "mine.txt").read_text() == "mine" for name in users)


def test_an_old_metrics_json_that_cannot_be_removed_keeps_the_old_set_whole(earlier: Path) -> None:
    """metrics.json a folder of the user's (unlink fails): the new set is not swapped in and
    nothing of the old one goes; nor is the user's folder emptied."""
    (earlier / "metrics.json").unlink()
    (earlier / "metrics.json").mkdir()
    (earlier / "metrics.json" / "theirs.txt").write_text("theirs")
    before = _snapshot(earlier)
    with pytest.raises(OSError):
        write_evaluation_set(earlier, "test", SCORES, NAMES, {}, _exporter({"p.npy": "new"}))
    assert _snapshot(earlier) == before


def test_a_predictions_folder_that_cannot_be_moved_is_left_alone(earlier: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The swap fails (a mount point: EBUSY): the old predictions stay, the folder holds no metrics.json."""
    from sciformer.utils import atomic

    def busy(src, dst):
        raise OSError(16, "Device or resource busy", str(src))

    before = _snapshot(earlier / "predictions")
    monkeypatch.setattr(atomic.os, "rename", busy)
    with pytest.raises(OSError):
        write_evaluation_set(earlier, "test", SCORES, NAMES, {}, _exporter({"p.npy": "new"}))
    monkeypatch.undo()
    assert _snapshot(earlier / "predictions") == before
    assert sorted(p.name for p in earlier.iterdir()) == ["notes.txt", "predictions"]


def test_a_linked_predictions_folder_is_replaced_never_followed(earlier: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.npy").write_text("theirs")
    shutil.rmtree(earlier / "predictions")
    (earlier / "predictions").symlink_to(target)
    write_evaluation_set(earlier, "test", SCORES, NAMES, {}, _exporter({"p.npy": "new"}))
    assert not (earlier / "predictions").is_symlink() and _predictions(earlier) == {"p.npy": "new"}
    assert _snapshot(target) == {"keep.npy": "theirs"}


# A signal that lands inside an import ends the process with os._exit (see engine/signals.py):
# the registered cleanups must run first. The module imported sends SIGTERM to its own process.
ABRUPT = """
import os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from sciformer.engine import signals
from sciformer.engine.report import PREDICTIONS_RECORD, write_evaluation_set
from sciformer.engine.metrics import scores_from_confusion
import numpy as np
signals.terminate_as_interrupt(process=True)
out = Path(sys.argv[1])
def export(stage):
    (stage / "half.npy").write_text("half")
    import sends_sigterm  # noqa: F401 - the signal lands inside this import
    return {}
write_evaluation_set(out, "test", scores_from_confusion(np.eye(2, dtype=np.int64)), ["a", "b"], {}, export)
print("not reached")
"""


def test_a_signal_inside_an_import_still_removes_the_stage(earlier: Path, tmp_path: Path) -> None:
    module = tmp_path / "mods"
    module.mkdir()
    (module / "sends_sigterm.py").write_text(textwrap.dedent("""
        import os, signal, time
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            time.sleep(0.01)
    """))
    before = _snapshot(earlier)
    proc = subprocess.run([sys.executable, "-c", ABRUPT, str(earlier), str(module)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip() == "sciformer: interrupted" and "not reached" not in proc.stdout
    assert _snapshot(earlier) == before  # the stage went, the earlier evaluation is whole
    assert not stale_stages(earlier)



KILLED_AFTER_SWAP = """
import os, signal, sys
from pathlib import Path
import numpy as np
from sciformer.engine import report
from sciformer.engine.metrics import scores_from_confusion
def killed(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)  # nothing runs after this: no handler, no finally
report.write_evaluation = killed
def export(stage):
    (stage / "new.npy").write_text("new")
report.write_evaluation_set(Path(sys.argv[1]), "test", scores_from_confusion(np.eye(2, dtype=np.int64)), ["a", "b"], {}, export)
"""


def test_a_kill_after_the_new_predictions_are_in_leaves_no_old_metrics(earlier: Path) -> None:
    """SIGKILL between the swap and the tables: the old metrics.json must already be gone."""
    proc = subprocess.run([sys.executable, "-c", KILLED_AFTER_SWAP, str(earlier)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert proc.returncode == -9, proc.stderr
    assert _predictions(earlier) == {"new.npy": "new"}  # with its record: a later --overwrite may replace it
    assert not (earlier / "metrics.json").exists()
