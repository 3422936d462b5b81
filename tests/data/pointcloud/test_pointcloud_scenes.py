"""Whole scenes: partitions, prediction on every original point (scored by the engine's metrics)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sciformer.data.pointcloud.chunking import partition_points
from sciformer.data.pointcloud.sample import collate_points
from sciformer.data.pointcloud.scenes import (
    SceneEvalDataset,
    SceneSource,
    scene_predictions,
)
from sciformer.data.transforms import Compose
from sciformer.engine.metrics import label_scorer
from sciformer.errors import DataError


def test_partition_points_balanced_and_complete() -> None:
    coord = np.random.default_rng(0).uniform(0, 100, size=(1000, 3))
    parts = partition_points(coord, 300)
    assert all(150 <= len(p) <= 300 for p in parts)
    assert sorted(np.concatenate(parts).tolist()) == list(range(1000))
    assert len(partition_points(coord, None)) == 1 and len(partition_points(coord, 1000)) == 1


class _Toy(SceneSource):
    """Two scenes on a line; label = 1 where x > 5."""

    def __init__(self) -> None:
        self.coords = [np.column_stack([np.linspace(0, 10, n), np.zeros(n), np.zeros(n)]) for n in (101, 57)]

    def __len__(self) -> int:
        return 2

    def name(self, index: int) -> str:
        return f"toy_{index}"

    def key(self, index: int) -> str:
        return f"toy-{index}-{len(self.coords[index])}"

    def load(self, index: int) -> dict[str, np.ndarray]:
        c = self.coords[index] + 1000.0  # far from the origin: parts are recentred
        label = (self.coords[index][:, 0] > 5).astype(np.int64)
        label[0] = -1  # an ignored point
        return {"coord": c, "label": label, "colour": np.full((len(c), 3), 0.5)}


def _oracle(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    # recentred coordinates no longer tell the side; use the voxel labels the batch carries
    return torch.nn.functional.one_hot(batch["target"].clamp(min=0), 2).float()


def test_scene_eval_maps_back_to_every_point(tmp_path: Path) -> None:
    ds = SceneEvalDataset(_Toy(), grid_size=0.5, max_points=8, part_z="min", transform=None,
                          features=["coord"], seed=0, cache_dir=tmp_path)
    assert len(ds) > 2
    for i in range(len(ds)):
        sample = ds[i]
        assert len(sample["coord"]) <= 8
        assert np.abs(sample["coord"]).max() < 10  # recentred, not at 1000
    score = label_scorer(["low", "high"])
    pairs = list(scene_predictions(ds, _oracle, collate_points, batch_size=3, class_names=["low", "high"], out_dir=tmp_path / "out"))
    assert [len(label) for label, _ in pairs] == [101, 57]  # every original point, per scene
    metrics = score(pairs)
    assert metrics["points"] == 101 + 57 - 2  # every original point except the ignored ones
    assert metrics["oa"] > 0.95  # voxel representative labels mapped back through the inverse
    pred = np.load(tmp_path / "out" / "toy_0_pred.npy")
    assert pred.shape == (101,)
    assert (tmp_path / "out" / "toy_1.ply").is_file()
    # without grid sampling the mapping is exact
    exact = SceneEvalDataset(_Toy(), grid_size=None, max_points=20, part_z="min", transform=None,
                             features=[], seed=0, cache_dir=None)
    m = score(scene_predictions(exact, _oracle, collate_points, batch_size=4, class_names=["low", "high"]))
    assert m["oa"] == 1.0 and m["miou"] == 1.0
    # the part counts are cached by scene key
    assert len(list((tmp_path / "scene_parts").glob("*.json"))) == 1


def test_scene_eval_rejects_point_changing_transforms(tmp_path: Path) -> None:
    from sciformer.data.transforms import RandomDropout, ShufflePoints

    ds = SceneEvalDataset(_Toy(), grid_size=None, max_points=None, part_z="min",
                          transform=Compose([RandomDropout(0.5, p=1.0), ShufflePoints()]), features=[], seed=0)
    with pytest.raises(DataError) as e:
        ds[0]
    assert "must keep every point" in str(e.value)



def test_the_readme_names_the_prediction_files_a_scene_gets(tmp_path: Path) -> None:
    """The run-folder listing of README.md names what ``predictions/`` holds per point scene
    (it said ``<scene>.npy``: the file is ``<scene>_pred.npy``)."""
    import re

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    listed = set()
    for token in re.findall(r"^\s+predictions/(<scene>\S*)", readme, flags=re.MULTILINE):
        first, *others = token.split("|")  # "<scene>.ply|.npy" lists <scene>.ply and <scene>.npy
        stem = first[: first.index(".")] if "." in first else first
        listed |= {first, *(stem + other for other in others)}
    ds = SceneEvalDataset(_Toy(), grid_size=None, max_points=None, part_z="min", transform=None, features=[], seed=0)
    list(scene_predictions(ds, _oracle, collate_points, batch_size=4, class_names=["low", "high"], out_dir=tmp_path, write_png=True))
    written = {p.name.replace("toy_0", "<scene>") for p in tmp_path.iterdir() if p.name.startswith("toy_0")}
    assert written == {"<scene>.ply", "<scene>_pred.npy", "<scene>.png"}
    assert listed == written


class _Shuffled(SceneSource):
    """One scene on a 1/8 lattice (points equally near a voxel's centre), with repeated rows and
    rows at one place with other intensities and labels, its rows in the order ``order``."""

    def __init__(self, order: np.ndarray | None = None) -> None:
        g = np.random.default_rng(1)
        coord = g.integers(0, 40, size=(300, 3)) / 8.0  # (300, 3)
        intensity = g.integers(0, 3, size=300).astype(np.float32)
        twins = g.integers(0, 300, 50)
        self.coord = np.vstack([coord, coord[twins]])  # (350, 3)
        self.intensity = np.concatenate([intensity, intensity[twins] + (np.arange(50) % 2)])
        self.label = g.integers(0, 2, size=350)  # repeated rows may disagree on their label
        self.order = np.arange(350) if order is None else order

    def __len__(self) -> int:
        return 1

    def name(self, index: int) -> str:
        return "shuffled"

    def key(self, index: int) -> str:
        return f"shuffled-{self.order[:5]}"

    def load(self, index: int) -> dict[str, np.ndarray]:
        o = self.order
        return {"coord": self.coord[o], "intensity": self.intensity[o], "label": self.label[o]}


def _by_value(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    feat = batch["feat"].double()  # (N, 4) coord, intensity
    return torch.sin(feat @ torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 2.5], [4.0, -3.0]], dtype=torch.float64)).float()


def test_scene_evaluation_does_not_depend_on_the_order_of_the_rows() -> None:
    """Items, their labels and every point's prediction are the same for any order of the file's
    rows (the lowest row once represented each voxel: 1 % of a SemanticKITTI scan's classes
    and the test metrics changed with the order of the points)."""
    def run(order: np.ndarray | None) -> tuple[list[dict[str, np.ndarray]], np.ndarray]:
        ds = SceneEvalDataset(_Shuffled(order), grid_size=0.5, max_points=40, part_z="min", transform=None,
                              features=["coord", "intensity"], seed=0)
        ((_, pred),) = scene_predictions(ds, _by_value, collate_points, batch_size=3, class_names=["a", "b"],
                                         overlap=0.5)
        return [ds[i] for i in range(len(ds))], pred

    items, base = run(None)
    assert 0 < base.mean() < 1
    for seed in range(3):
        perm = np.random.default_rng(seed).permutation(350)
        items2, pred = run(perm)
        np.testing.assert_array_equal(pred, base[perm])
        for a, b in zip(items, items2, strict=True):
            for name in ("coord", "feat", "label"):
                np.testing.assert_array_equal(a[name], b[name])
