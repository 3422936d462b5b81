"""Label ids that are not 1..K ({3, 17, 40}): the head has a class per id up to the largest, but a
class without a training pixel is never predicted, by the run's test metrics and map, ``sciformer
predict``, ``sciformer evaluate`` and ``model.predict`` alike (probability exactly 0); a checkpoint
without the record (an older one) predicts every class, as before.

The oracle is the run's own split file: the ids that hold a training pixel."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from synthetic import make_hsi_scene, write_tiny_hsi_config

import sciformer
from sciformer.cli import main

IDS = (3, 17, 40)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("sparse_ids")
    cube, gt, _ = make_hsi_scene(h=20, w=24, bands=8, classes=3, block=4)
    sparse = np.zeros_like(gt)
    for k, v in enumerate(IDS, start=1):
        sparse[gt == k] = v
    np.save(root / "cube.npy", cube)
    np.save(root / "gt.npy", sparse)
    write_tiny_hsi_config(root, "source: cube.npy, label_path: gt.npy", name="sparse", band_group_size=4)
    assert main(["train", "-c", str(root / "tiny.yaml"), "-o", str(root / "run")]) == 0
    with np.load(root / "run" / "splits.npz") as splits:
        trained = sorted(int(v) for v in np.unique(splits["train"]) if v > 0)  # the oracle
    assert trained == list(IDS)
    return {"root": root, "run": root / "run", "trained": trained}


def never_predicted(probs: np.ndarray, trained: list[int]) -> None:
    """(H, W, K) probabilities: exactly 0 for every class id (1-based) without training pixels."""
    others = [k - 1 for k in range(1, probs.shape[-1] + 1) if k not in trained]
    assert probs.shape[-1] == max(IDS) and len(others) == max(IDS) - len(IDS)
    assert np.all(probs[..., others] == 0.0)


def test_checkpoint_records_the_trained_classes(run: dict[str, object]) -> None:
    state = torch.load(Path(run["run"]) / "checkpoints" / "best.pt", weights_only=True)["data_state"]
    assert [k + 1 for k in state["trained_classes"]] == run["trained"]


def test_run_map_and_test_metrics_hold_trained_classes_only(run: dict[str, object]) -> None:
    label_map = np.load(Path(run["run"]) / "predictions" / "map.npy")
    assert set(np.unique(label_map)) <= set(run["trained"])
    with open(Path(run["run"]) / "confusion_matrix.csv") as fh:
        rows = list(csv.reader(fh))
    predicted = np.asarray([[float(v) for v in r[1:]] for r in rows[1:]]).sum(axis=0)  # (K,) per predicted class
    assert {i + 1 for i in np.nonzero(predicted)[0]} <= set(run["trained"])


def test_predict_cli_and_api_never_give_an_untrained_class(run: dict[str, object], tmp_path: Path) -> None:
    root = Path(run["root"])
    assert main(["predict", "--checkpoint", str(run["run"]), "-i", str(root / "cube.npy"), "-o", str(tmp_path / "m.npy"),
                 "--probabilities"]) == 0
    assert set(np.unique(np.load(tmp_path / "m.npy"))) <= set(run["trained"])
    never_predicted(np.load(tmp_path / "m_probabilities.npy"), run["trained"])
    pred = sciformer.load(run["run"]).predict(np.load(root / "cube.npy"))
    assert set(np.unique(pred.labels + 1)) <= set(run["trained"])
    never_predicted(pred.probabilities, run["trained"])


def test_evaluate_never_gives_an_untrained_class(run: dict[str, object], tmp_path: Path) -> None:
    assert main(["evaluate", "--checkpoint", str(run["run"]), "-o", str(tmp_path / "ev")]) == 0
    assert set(np.unique(np.load(tmp_path / "ev" / "predictions" / "map.npy"))) <= set(run["trained"])


def test_a_checkpoint_without_the_record_predicts_every_class(run: dict[str, object], tmp_path: Path) -> None:
    state = torch.load(Path(run["run"]) / "checkpoints" / "best.pt", weights_only=True)
    state["data_state"].pop("trained_classes", None)
    torch.save(state, tmp_path / "old.pt")
    assert main(["predict", "--checkpoint", str(tmp_path / "old.pt"), "-i", str(Path(run["root"]) / "cube.npy"),
                 "-o", str(tmp_path / "m.npy"), "--probabilities"]) == 0
    assert np.all(np.load(tmp_path / "m_probabilities.npy") > 0)  # every class has a (small) probability, as before


def per_class_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_per_class_csv_joins_the_maps_by_label_id(run: dict[str, object], tmp_path: Path) -> None:
    """``label_id`` is the id of the maps (17 is the class at index 16); ``class_id`` stays the 0-based index.
    The oracle: the test pixels of each id in the run's split file, and the run's map."""
    assert main(["evaluate", "--checkpoint", str(run["run"]), "-o", str(tmp_path / "ev")]) == 0
    with np.load(Path(run["run"]) / "splits.npz") as splits:
        test = splits["test"]  # (H, W) label ids of the test pixels, 0 elsewhere
    for folder in (Path(run["run"]), tmp_path / "ev"):
        rows = per_class_rows(folder / "per_class.csv")
        assert list(rows[0]) == ["class_id", "class", "accuracy", "iou", "support", "label_id"]  # older columns first, as before
        assert [int(r["class_id"]) for r in rows] == list(range(max(IDS)))
        by_id = {int(r["label_id"]): r for r in rows}
        assert set(by_id) == set(range(1, max(IDS) + 1))
        for v in IDS:
            assert int(by_id[v]["support"]) == int((test == v).sum()) > 0
        assert {int(r["label_id"]) for r in rows if int(r["support"])} == set(IDS)
        assert set(np.unique(np.load(folder / "predictions" / "map.npy"))) <= set(by_id)
