"""Chunked whole-cloud prediction: chunk plans, merging, test-time views, scene integration."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sciformer.contracts import DataInfo
from sciformer.data.pointcloud.chunking import plan_chunks, predict_chunked, tta_views
from sciformer.data.pointcloud.sample import assemble_features, collate_points
from sciformer.data.pointcloud.scenes import ArrayScene, SceneEvalDataset, predict_scene
from sciformer.data.transforms import CenterShift
from sciformer.errors import DataError
from sciformer.registry import MODELS


def cloud(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform([0, 0, 0], [20, 10, 3], size=(n, 3))  # (n, 3)


def test_plan_chunks_covers_every_point_once_by_cores() -> None:
    coord = cloud(1000)
    chunks = plan_chunks(coord, 150, overlap=0.5)
    cores = np.concatenate([c.index[: c.core] for c in chunks])
    assert np.array_equal(np.sort(cores), np.arange(1000))
    assert all(len(c.index) <= 150 and len(np.unique(c.index)) == len(c.index) for c in chunks)
    assert all(len(c.index) > c.core for c in chunks)  # every chunk got context
    assert all(c.core <= 100 for c in chunks)
    disjoint = plan_chunks(coord, 150, overlap=0.0)
    assert sum(len(c.index) for c in disjoint) == 1000
    single = plan_chunks(coord, 1000)
    assert len(single) == 1 and np.array_equal(single[0].index, np.arange(1000))
    assert len(plan_chunks(coord, None)) == 1
    with pytest.raises(DataError, match="max_points"):
        plan_chunks(coord, 0)


def test_context_points_are_the_nearest_to_the_core() -> None:
    coord = cloud(600, seed=1)
    for chunk in plan_chunks(coord, 100, overlap=0.25):
        core, context = chunk.index[: chunk.core], chunk.index[chunk.core :]
        lo, hi = coord[core, :2].min(0), coord[core, :2].max(0)
        gap = np.maximum(np.maximum(lo - coord[:, :2], coord[:, :2] - hi), 0).max(1)
        outside = np.setdiff1d(np.arange(600), chunk.index)
        assert gap[context].max() <= gap[outside].min() + 1e-12


def pointwise_predict(num_classes: int = 4):
    """Logits from each point's own radius in x-y (rotation- and chunk-independent)."""

    def predict(batch: dict) -> torch.Tensor:
        r = batch["coord"][:, :2].double().norm(dim=1, keepdim=True)  # (N, 1)
        return torch.cat([torch.sin(r * (i + 1)) for i in range(num_classes)], dim=1).float()  # (N, C)

    return predict


def keep_coord(sample: dict) -> dict:
    return assemble_features(sample, [], "test chunk")


def test_chunked_pointwise_prediction_is_independent_of_chunking() -> None:
    coord = cloud(800, seed=2) - np.array([10.0, 5.0, 0.0])
    predict = pointwise_predict()
    expected = torch.softmax(predict(collate_points([keep_coord({"coord": coord})])), dim=1).numpy()
    for max_points, overlap in ((None, 0.25), (120, 0.0), (120, 0.5)):
        probs = predict_chunked(predict, {"coord": coord}, keep_coord, num_classes=4, max_points=max_points,
                                overlap=overlap, batch_size=3)
        np.testing.assert_allclose(probs, expected, atol=1e-5)
    # z-rotations and x-mirroring keep the radius: the merged views agree too
    views = tta_views(rotations=4, flip=True)
    assert len(views) == 8 and views[0] is None
    probs = predict_chunked(predict, {"coord": coord}, keep_coord, num_classes=4, max_points=200, views=views)
    np.testing.assert_allclose(probs, expected, atol=1e-5)


def test_chunked_model_prediction_equals_single_pass() -> None:
    torch.manual_seed(0)
    entry = MODELS.get("point_transformer_seg")
    info = DataInfo(3, ["a", "b", "c"], 0, task="segmentation")
    model = entry.builder(entry.config(channels=[16, 32], blocks=[1, 1], strides=[1, 4], k=8), info).eval()

    def predict(batch: dict) -> torch.Tensor:
        return model(batch)

    def prepare(sample: dict) -> dict:
        return assemble_features(CenterShift()(sample), [], "chunk")

    coord = cloud(300, seed=3)
    with torch.no_grad():
        single = torch.softmax(model(collate_points([prepare({"coord": coord})])), dim=1).numpy()
    probs = predict_chunked(predict, {"coord": coord}, prepare, num_classes=3, max_points=300)
    np.testing.assert_allclose(probs, single, atol=1e-6)
    chunked = predict_chunked(predict, {"coord": coord}, prepare, num_classes=3, max_points=80, overlap=0.5)
    assert chunked.shape == (300, 3)
    np.testing.assert_allclose(chunked.sum(axis=1), 1.0, atol=1e-5)
    with pytest.raises(DataError, match="logits"):
        predict_chunked(lambda b: torch.zeros(2, 3), {"coord": coord}, prepare, num_classes=3, max_points=300)


def test_scene_prediction_with_overlap_maps_back_to_every_point() -> None:
    coord = cloud(900, seed=4) - np.array([10.0, 5.0, 0.0])
    colour = np.random.default_rng(0).uniform(size=(900, 3)).astype(np.float32)
    sample = {"coord": coord, "colour": colour, "label": np.zeros(900, dtype=np.int64)}

    def predict(batch: dict) -> torch.Tensor:
        return batch["feat"] * 10.0  # class = the brightest colour channel of each point

    dataset = SceneEvalDataset(ArrayScene(sample, "toy"), grid_size=0.3, max_points=150, part_z="min",
                               transform=None, features=["colour"], seed=0)
    plain = predict_scene(dataset, 0, predict, collate_points, batch_size=4, num_classes=3)
    merged = predict_scene(dataset, 0, predict, collate_points, batch_size=4, num_classes=3, overlap=0.5,
                           views=tta_views(rotations=2))
    assert plain.shape == merged.shape == (900,)
    np.testing.assert_array_equal(plain, merged)
    _, keep, inverse, _ = dataset._scene(0)
    np.testing.assert_array_equal(merged, colour[keep].argmax(axis=1)[inverse])
