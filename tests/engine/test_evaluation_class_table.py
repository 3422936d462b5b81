"""A ``data.classes`` override against the checkpoint's class table, on the real LAS tiles: one
rule for ``evaluate``, ``predict`` and ``sciformer.load(...).predict``. The model's class k is
the checkpoint's k-th class, so other names or another order are refused in one line naming
both; other codes for the same classes (relabelled data) are honoured with a note.

Oracles: the tile's ASPRS codes mapped through the recoded table with numpy, scored against
the per-point predictions the run itself exported (a confusion matrix in numpy); and the LAS
written without an override, with the one recoded code replaced."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import sciformer
from sciformer.cli import main
from sciformer.errors import CheckpointError

laspy = pytest.importorskip("laspy")
TILE = "file_with_both_wkt_and_geotiff_vlrs"  # the experiment's test tile
REORDERED = "data.classes={vegetation: [3, 4, 5], ground: [2], building: [6], other: []}"
TRAINED_ORDER = "ground, vegetation, building, other"


@pytest.fixture(scope="module")
def run(tiny_lidar_run: Path) -> Path:
    return tiny_lidar_run  # trained once for the suite (tests/conftest.py)


def _refused(capsys: pytest.CaptureFixture, code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1, err
    assert f"the checkpoint's model predicts {TRAINED_ORDER}, in that order" in err, err
    assert "data.classes lists the classes vegetation, ground, building, other" in err, err
    return err


def test_evaluate_refuses_a_reordered_table(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["evaluate", "--checkpoint", str(run), "-o", str(tmp_path / "ev"), REORDERED])
    assert "class 0 is 'vegetation' here, 'ground' in the checkpoint" in _refused(capsys, code)
    assert not (tmp_path / "ev").exists()  # refused before anything is written


def test_evaluate_refuses_renamed_classes(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    renamed = "data.classes={ground: [2], trees: [3, 4, 5], building: [6], other: []}"
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(tmp_path / "ev"), renamed]) != 0
    assert "class 1 is 'trees' here, 'vegetation' in the checkpoint" in capsys.readouterr().err


def test_evaluate_scores_a_recoded_table_on_the_recoded_labels(run: Path, data_root: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    recoded = {"ground": [2], "vegetation": [3, 4], "building": [5, 6], "other": []}  # code 5 counts as building
    text = "{" + ", ".join(f"{k}: {v}" for k, v in recoded.items()) + "}"
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(tmp_path / "ev"), f"data.classes={text}"]) == 0
    assert "note: data.classes recodes the checkpoint's classes (vegetation [3, 4, 5] -> [3, 4]; building [6] -> [5, 6])" \
        in capsys.readouterr().err
    full = json.loads((tmp_path / "ev" / "metrics.json").read_text())["full_resolution"]
    pred = np.load(run / "predictions" / f"{TILE}_pred.npy").reshape(-1)  # the run's own test predictions, every point
    np.testing.assert_array_equal(np.load(tmp_path / "ev" / "predictions" / f"{TILE}_pred.npy").reshape(-1), pred)
    table = np.full(256, 3)  # unmapped: other
    for label, codes in enumerate(recoded.values()):
        table[codes] = label
    truth = table[np.asarray(laspy.read(data_root / "lidar" / f"{TILE}.las").classification)]  # (n,)
    confusion = np.bincount(truth * 4 + pred, minlength=16).reshape(4, 4)  # (truth, predicted)
    iou = np.diag(confusion) / (confusion.sum(0) + confusion.sum(1) - np.diag(confusion))
    assert full["points"] == len(truth)
    assert full["oa"] == pytest.approx(np.trace(confusion) / confusion.sum())
    assert full["miou"] == pytest.approx(np.nanmean(iou))
    assert full["per_class"]["building"]["support"] == int(np.isin(truth, 2).sum()) == int(np.isin(
        laspy.read(data_root / "lidar" / f"{TILE}.las").classification, [5, 6]).sum())


def test_predict_refuses_a_reordered_table(run: Path, data_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "r.las"
    code = main(["predict", "--checkpoint", str(run), "-i", str(data_root / "lidar" / "las_warsaw_small.las"), "-o", str(out), REORDERED])
    _refused(capsys, code)
    assert not out.exists()


def test_predict_writes_a_recoded_table_s_codes(run: Path, data_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    tile = data_root / "lidar" / "las_warsaw_small.las"
    plain, recoded = tmp_path / "plain.las", tmp_path / "c11.las"
    assert main(["predict", "--checkpoint", str(run), "-i", str(tile), "-o", str(plain)]) == 0
    assert main(["predict", "--checkpoint", str(run), "-i", str(tile), "-o", str(recoded),
                 "data.classes={ground: [11, 2], vegetation: [3, 4, 5], building: [6], other: []}"]) == 0
    assert "note: data.classes recodes the checkpoint's classes (ground [2] -> [11, 2])" in capsys.readouterr().err
    a = np.asarray(laspy.read(plain).classification)
    b = np.asarray(laspy.read(recoded).classification)
    assert 2 in a and 2 not in b
    np.testing.assert_array_equal(b, np.where(a == 2, 11, a))  # the same predictions, ground written as its first code, 11


def test_python_api_follows_the_same_rule(run: Path, data_root: Path, capsys: pytest.CaptureFixture) -> None:
    tile = data_root / "lidar" / "las_warsaw_small.las"
    with pytest.raises(CheckpointError, match=f"predicts {TRAINED_ORDER}, in that order"):
        sciformer.load(run, overrides=[REORDERED]).predict(tile)
    plain = sciformer.load(run).predict(tile)
    capsys.readouterr()
    recoded = sciformer.load(run, overrides={"data.classes": {"ground": [2], "vegetation": [3, 4, 5], "building": [7], "other": []}})
    pred = recoded.predict(tile)
    assert "building [6] -> [7]" in capsys.readouterr().err
    assert pred.class_names == plain.class_names == TRAINED_ORDER.split(", ")
    np.testing.assert_array_equal(pred.labels, plain.labels)
