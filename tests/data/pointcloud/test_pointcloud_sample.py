"""Samples and packed batches: feature assembly, collation, offsets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sciformer.data.pointcloud.sample import (
    assemble_features,
    check_features,
    collate_points,
    split_by_offset,
)
from sciformer.errors import DataError


def item(n: int, c: int = 2, label: object = None, category: int | None = None) -> dict[str, np.ndarray]:
    out = {"coord": np.full((n, 3), n, np.float32), "feat": np.ones((n, c), np.float32)}
    if label is not None:
        out["label"] = np.asarray(label, dtype=np.int64)
    if category is not None:
        out["category"] = np.int64(category)
    return out


def test_collate_segmentation_offsets() -> None:
    batch = collate_points([item(3, label=[0, 1, 2], category=4), item(5, label=[-1] * 5, category=1)])
    assert batch["coord"].shape == (8, 3) and batch["coord"].dtype == torch.float32
    assert batch["feat"].shape == (8, 2)
    assert batch["offset"].tolist() == [3, 8] and batch["offset"].dtype == torch.int64
    assert batch["target"].tolist() == [0, 1, 2, -1, -1, -1, -1, -1]
    assert batch["category"].tolist() == [4, 1]


def test_collate_classification_and_zero_channels() -> None:
    batch = collate_points([item(4, c=0, label=7), item(2, c=0, label=1), item(1, c=0, label=0)])
    assert batch["target"].tolist() == [7, 1, 0] and batch["target"].dtype == torch.int64
    assert batch["feat"].shape == (7, 0)
    assert batch["offset"].tolist() == [4, 6, 7]
    assert "category" not in batch


@pytest.mark.parametrize(
    ("items", "needle"),
    [
        ([], "empty batch"),
        ([item(3), item(2, c=3)], "item 1 has 3 feature channels, item 0 has 2"),
        ([item(0)], "item 0 'coord'"),
        ([item(3, label=[0, 1])], "item 0 'label' has shape (2,)"),
        ([item(3, label=1), item(2)], "item 1 has no 'label'"),
        ([{"coord": np.zeros((2, 3))}], "item 0 has no 'feat'"),
    ],
)
def test_collate_bad_input(items: list[dict[str, np.ndarray]], needle: str) -> None:
    with pytest.raises(DataError) as e:
        collate_points(items)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_split_by_offset() -> None:
    parts = split_by_offset(np.arange(8), np.array([3, 8]))
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4, 5, 6, 7]]


def test_assemble_features() -> None:
    sample = {
        "coord": np.array([[0, 0, 1], [1, 1, 3]], np.float64),
        "colour": np.full((2, 3), 0.5, np.float32),
        "intensity": np.array([0.1, 0.2], np.float32),
        "label": np.array([1, 2]),
        "inverse": np.arange(5),
    }
    out = assemble_features(sample, ["coord", "colour", "intensity", "height"])
    assert set(out) == {"coord", "feat", "label"}
    assert out["coord"].dtype == np.float32 and out["feat"].dtype == np.float32 and out["label"].dtype == np.int64
    np.testing.assert_allclose(out["feat"][1], [1, 1, 3, 0.5, 0.5, 0.5, 0.2, 2.0])
    assert assemble_features(sample, [])["feat"].shape == (2, 0)
    with pytest.raises(DataError) as e:
        assemble_features(sample, ["normal"], "room 3")
    assert "room 3: feature 'normal' is not available" in str(e.value)
    with pytest.raises(DataError) as e:
        assemble_features({"coord": np.zeros((0, 3))}, [], "tile.las")
    assert "tile.las: empty point cloud" in str(e.value)


def test_check_features() -> None:
    assert check_features(["xyz", "rgb"]) == ["coord", "colour"]
    with pytest.raises(ValueError, match="did you mean 'normal'"):
        check_features(["normals2"], ["coord", "normal"])
    with pytest.raises(ValueError, match="listed twice"):
        check_features(["color", "colour"])
