"""Loaded points and the rows of their file (rows left out by the reader in between)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from sciformer.data.pointcloud.file_rows import file_rows, loaded_file_rows
from sciformer.data.pointcloud.sample import collate_points
from sciformer.data.pointcloud.scenes import ArrayScene, SceneEvalDataset, predict_scene
from sciformer.errors import DataError


@pytest.mark.parametrize("seed", range(5))
def test_loaded_points_map_to_the_rows_not_left_out(seed: int) -> None:
    rng = np.random.default_rng(seed)
    total = int(rng.integers(1, 60))
    left = np.unique(rng.integers(0, total, size=int(rng.integers(0, total))))
    rows = loaded_file_rows((left, total))
    np.testing.assert_array_equal(rows, np.delete(np.arange(total), left))  # oracle: np.delete
    pred = rng.integers(0, 5, size=len(rows))
    out = file_rows(pred, (left, total))
    np.testing.assert_array_equal(out[left], -1)
    np.testing.assert_array_equal(out[rows], pred)
    assert loaded_file_rows(None) is None and file_rows(pred, None) is pred


class LeftOutScene(ArrayScene):
    """A scene whose file had rows the reader left out."""

    def __init__(self, sample: dict, left_out: tuple[np.ndarray, int] | None) -> None:
        super().__init__(sample, "scan")
        self.left_out = left_out

    def left_out_rows(self, index: int) -> tuple[np.ndarray, int] | None:
        return self.left_out


@pytest.mark.parametrize("views", [{}, {"overlap": 0.5, "views": [None]}])
def test_a_non_finite_score_names_the_file_row(views: dict) -> None:
    """The error names the point by its row in the file: with rows left out before and among
    the points, the loaded point the message names without them, mapped through np.delete."""
    n = 500
    coord = np.random.default_rng(3).uniform([0, 0, 0], [20, 10, 3], size=(n, 3))
    sample = {"coord": coord, "label": np.zeros(n, dtype=np.int64)}

    def predict(batch: dict) -> torch.Tensor:
        logits = torch.zeros(len(batch["coord"]), 3)
        logits[int(batch["coord"][:, 2].argmax()), 1] = float("nan")  # the highest point of each batch
        return logits

    def named(left_out: tuple[np.ndarray, int] | None) -> int:
        dataset = SceneEvalDataset(LeftOutScene(sample, left_out), grid_size=None, max_points=120, part_z="min",
                                   transform=None, features=[], seed=0)
        with pytest.raises(DataError) as err:
            predict_scene(dataset, 0, predict, collate_points, batch_size=2, num_classes=3, **views)
        return int(re.search(r"\(first: point (\d+)\)", str(err.value)).group(1))

    loaded = named(None)  # every row loaded: the point's position
    left = np.concatenate([np.arange(7), np.arange(10, 600, 3)])  # 7 rows before the first point, more between
    total = n + len(left)
    assert named((left, total)) == np.delete(np.arange(total), left)[loaded]
