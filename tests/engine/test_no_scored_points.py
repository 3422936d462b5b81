"""A test split whose labels are all ignored (a SemanticKITTI scan labelled 0 throughout): the run
and ``evaluate`` succeed (exit 0), metrics.json holds null scores, the console says there were no
scored points, and the figures are drawn; nothing formats a missing score as a number."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sciformer.cli import main
from sciformer.engine.evaluation import every_point_line
from sciformer.engine.metrics import NO_SCORED_POINTS, ConfusionMatrix, format_table

EXPERIMENT = Path(__file__).resolve().parents[2] / "experiments" / "point_scenes_semantickitti.yaml"
TINY = ["train.epochs=1", "train.threads=1", "train.progress=never", "data.crop_points=1500", "data.loop=1",
        "data.grid_size=0.5", "data.eval_max_points=20000", "model.channels=[16,32,64,128]"]


def test_tables_say_no_scored_points_instead_of_formatting_none() -> None:
    scores = ConfusionMatrix(3).compute()  # nothing counted
    text = format_table(scores, ["a", "b", "c"], title="test results")
    assert NO_SCORED_POINTS in text and "nan" not in text.lower()
    full = {"oa": None, "miou": None, "points": 0, "scenes": 1}
    assert "no scored points" in every_point_line(full, None)
    assert "OA 75.00  mIoU 12.50" in every_point_line({**full, "oa": 0.75, "miou": 0.125}, None)


def test_train_and_evaluate_on_a_test_scan_without_a_scored_point(data_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    scans = data_root / "semantickitti_scans"
    if not scans.is_dir():
        pytest.skip("real SemanticKITTI scans absent (set SCIFORMER_DATA)")
    root = tmp_path / "scans"
    shutil.copytree(scans, root)
    labels = root / "demo_000700_labels.npy"
    zero = np.zeros_like(np.load(labels))
    labels.chmod(0o644)
    np.save(labels, zero)  # label 0, unlabeled: ignored everywhere
    run = tmp_path / "run"
    assert main(["train", "-c", str(EXPERIMENT), "-o", str(run), f"data.root={root}", *TINY]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.err and NO_SCORED_POINTS in out.out and "every point" in out.out
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["oa"] is None and metrics["miou"] is None and metrics["full_resolution"]["points"] == 0
    assert (run / "curves.png").is_file() and (run / "confusion_matrix.png").is_file()
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(tmp_path / "ev")]) == 0
    out = capsys.readouterr()
    assert "no scored points (every label is ignored)" in out.out and (tmp_path / "ev" / "metrics.json").is_file()


@pytest.mark.parametrize("val", [[], ["data.val_files=[]"]])
def test_a_training_split_without_a_labelled_point_is_refused_before_training(
        data_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture, val: list[str]) -> None:
    """SemanticKITTI labels saved whole (instance id in the upper 16 bits): no training label is a
    class id of the table, so every training point is ignored. Refused in one line before any
    epoch (it trained on nothing: loss 0, and with no validation a run that looked finished)."""
    scans = data_root / "semantickitti_scans"
    if not scans.is_dir():
        pytest.skip("real SemanticKITTI scans absent (set SCIFORMER_DATA)")
    root = tmp_path / "scans"
    shutil.copytree(scans, root)
    for name in ("seq01_000000", "seq01_000001"):
        labels = root / f"{name}_labels.npy"
        raw = np.load(labels).reshape(-1).astype(np.uint32)
        labels.chmod(0o644)
        np.save(labels, raw | ((np.arange(len(raw), dtype=np.uint32) % 14 + 1) << 16))  # instance ids 1..14 above
    run = tmp_path / "run"
    assert main(["train", "-c", str(EXPERIMENT), "-o", str(run), f"data.root={root}", *TINY, *val]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no training point has a class of data.classes" in err[0], err
    assert "labels unmapped: ids 65" in err[0] and "lower 16 bits" in err[0]
    assert not (run / "checkpoints" / "last.pt").exists() and not (run / "metrics.json").exists()
