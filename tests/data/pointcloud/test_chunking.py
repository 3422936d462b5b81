"""Chunked whole-cloud prediction: chunk plans, merging, test-time views, scene integration."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from sciformer.contracts import DataInfo
from sciformer.data.pointcloud.chunking import detached_points, plan_chunks, predict_chunked, tta_views
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
    _, keep, inverse, _, _ = dataset._scene(0)
    np.testing.assert_array_equal(merged, colour[keep].argmax(axis=1)[inverse])


@pytest.mark.parametrize("bad_value", [float("nan"), float("inf")])
@pytest.mark.parametrize("max_points", [None, 120])
def test_non_finite_scores_are_one_line_naming_a_poisoned_point(bad_value: float, max_points: int | None) -> None:
    """A point whose scores are not finite is refused, wherever it falls among the chunks,
    and named by its number in the user's file (``point_ids``), not by its chunk row."""
    coord = cloud(500, seed=3)
    poisoned = np.array([417, 33, 250])  # rows of the sample; the file numbers them 10x
    good = pointwise_predict()

    def predict(batch, value=bad_value):
        logits = good(batch).clone()  # (N, 4)
        logits[np.isin(batch["coord"][:, 0].numpy(), coord[poisoned, 0].astype(np.float32)), 1] = value
        return logits

    pattern = r"^the model gives non-finite scores for (\d) point\(s\) of a chunk \(first: point (\d+)\); "
    with pytest.raises(DataError, match=pattern) as err:
        predict_chunked(predict, {"coord": coord}, keep_coord, num_classes=4, max_points=max_points,
                        overlap=0.25, point_ids=np.arange(500) * 10)
    count, first = re.match(pattern, str(err.value)).groups()
    assert "\n" not in str(err.value) and int(first) in poisoned * 10
    if max_points is None:  # one chunk holds them all
        assert (count, first) == ("3", "330")
    with pytest.raises(DataError, match=r"\(first: point 33\)"):  # without ids: the sample's row
        predict_chunked(predict, {"coord": coord}, keep_coord, num_classes=4, max_points=None)
    # a logit of -inf is a probability of 0, not an error
    probs = predict_chunked(lambda b: predict(b, -float("inf")), {"coord": coord}, keep_coord, num_classes=4,
                            max_points=max_points)
    assert np.isfinite(probs).all() and (probs[poisoned, 1] == 0).all()


def with_outliers(coord: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``coord`` with gross outliers put in among its rows: a no-data x of 1e6, a z of
    -9999 (far below the ground) and a y near float32's limit. Returns (cloud, their rows)."""
    extra = np.array([[1e6, 5.0, 1.0], [3.0, 4.0, -9999.0], [8.0, -3.0e38, 2.0], [1e6, 1e6, 1e6]])
    rows = np.array([5, 400, 401, len(coord) + 3])  # rows they take in the result
    cloud = np.insert(coord, rows - np.arange(4), extra, axis=0)  # (n + 4, 3)
    assert np.array_equal(cloud[rows], extra)
    return cloud, rows


def test_gross_outliers_are_detached_and_change_nothing_else() -> None:
    coord = cloud(3000, seed=4)
    dirty, rows = with_outliers(coord)
    rest = np.setdiff1d(np.arange(len(dirty)), rows)
    assert np.array_equal(np.sort(np.concatenate(detached_points(dirty))), rows)
    assert detached_points(coord) == []
    for max_points, overlap in ((None, 0.25), (700, 0.25), (700, 0.0)):
        clean, mixed = plan_chunks(coord, max_points, overlap), plan_chunks(dirty, max_points, overlap)
        kept = [c for c in mixed if not np.isin(c.index, rows).any()]
        alone = [c for c in mixed if np.isin(c.index, rows).any()]
        assert [(rest[c.index].tolist(), c.core) for c in clean] == [(c.index.tolist(), c.core) for c in kept]
        assert all(np.isin(c.index, rows).all() and c.core == len(c.index) for c in alone)  # no context
    # and the prediction of every other point is the clean one, with centring that a
    # single far point would otherwise drag
    centred = lambda sample: keep_coord(CenterShift(z="min")(sample))  # noqa: E731
    expected = predict_chunked(pointwise_predict(), {"coord": coord}, centred, num_classes=4, max_points=700)
    probs = predict_chunked(pointwise_predict(), {"coord": dirty}, centred, num_classes=4, max_points=700)
    np.testing.assert_array_equal(probs[rest], expected)
    assert np.isfinite(probs).all()


def test_scene_evaluation_keeps_gross_outliers_apart() -> None:
    """Evaluation predicts the other points of a scene with gross outliers exactly as without
    them, in the single pass and with test views (where it must equal ``predict``)."""
    coord = cloud(900, seed=4)
    dirty, rows = with_outliers(coord)
    rest = np.setdiff1d(np.arange(len(dirty)), rows)

    def scene(points: np.ndarray) -> SceneEvalDataset:
        return SceneEvalDataset(ArrayScene({"coord": points, "label": np.zeros(len(points), dtype=np.int64)}, "toy"),
                                grid_size=0.3, max_points=150, part_z="min", transform=None, features=[], seed=0)

    predict = pointwise_predict(3)  # of the recentred coordinates: a moved centre would show
    for views in ({}, {"overlap": 0.5, "views": tta_views(rotations=2)}):
        clean = predict_scene(scene(coord), 0, predict, collate_points, batch_size=4, num_classes=3, **views)
        mixed = predict_scene(scene(dirty), 0, predict, collate_points, batch_size=4, num_classes=3, **views)
        assert mixed.shape == (len(dirty),) and (mixed >= 0).all()
        np.testing.assert_array_equal(mixed[rest], clean)
    _, keep, inverse, parts, clouds = scene(dirty)._scene(0)
    assert len(clouds) == 1 + 3 and np.array_equal(np.sort(keep[clouds[0].stop:]), rows)  # x (2 points), z, y
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(keep))) and np.array_equal(keep[inverse[rows]], rows)


def test_what_is_not_detached() -> None:
    coord = cloud(3000, seed=5)
    far_cluster = np.vstack([coord, cloud(40, seed=6) + [0.0, 0.0, 50.0]])  # 1.3 % of the points: real structure
    assert detached_points(far_cluster) == []
    # 3,000 points: 9 per end searched (more than 0.1 %), so the gap must be 5x the extent (3 m in z)
    assert detached_points(np.vstack([coord, [[10.0, 5.0, 6.5]]])) == []  # 3.5 m above the top
    assert detached_points(np.vstack([coord, [[10.0, 5.0, 19.0]]])) == [np.array([3000])]  # 16 m above
    big = cloud(10000, seed=11)  # 10 per end = 0.1 %: the gap is the extent itself
    assert detached_points(np.vstack([big, [[10.0, 5.0, 5.5]]])) == []  # 2.5 m above a 3 m high cloud
    assert detached_points(np.vstack([big, [[10.0, 5.0, 6.5]]])) == [np.array([10000])]  # 3.5 m
    assert detached_points(np.vstack([coord[:15], [[1e6, 0.0, 0.0]]])) == [np.array([15])]  # 16 points: measured
    assert detached_points(np.vstack([coord[:14], [[1e6, 0.0, 0.0]]])) == []  # 15: too few to tell
    assert detached_points(np.vstack([coord[:15], [[30.0, 0.0, 0.0]]])) == []  # small cloud: 1.5x its extent is not enough
    rng = np.random.default_rng(7)
    for size in (16, 20, 50, 200, 999, 1000, 5000):  # ordinary clouds, small and large, detach nothing
        for _ in range(40):
            assert detached_points(rng.random((size, 3))) == []
            assert detached_points(rng.standard_normal((size, 3))) == []


def test_flat_axes_still_detach_a_no_data_point() -> None:
    """The gap is measured against at least 1 % of the widest extent: a flat axis is no excuse."""
    flat = cloud(3000, seed=8)
    flat[:, 2] = 0.0
    assert detached_points(flat) == []
    assert detached_points(np.vstack([flat, [[3.0, 4.0, 0.05]]])) == []  # 5 cm above a 20 m wide plane
    assert detached_points(np.vstack([flat, [[3.0, 4.0, -9999.0]]])) == [np.array([3000])]
    bump = np.vstack([flat, [[3.0, 4.0, 0.2], [3.1, 4.0, 0.2], [3.2, 4.0, 0.2]]])  # 3 points 20 cm above the plane
    assert detached_points(bump) == []
    same = np.ones((100, 3))  # one repeated point: no extent to measure a gap against
    assert detached_points(same) == [] and detached_points(np.vstack([same, [[1e6, 1.0, 1.0]]])) == []


def test_a_no_data_fill_on_many_points_is_one_group() -> None:
    """The usual no-data value is repeated: 0.2-5 % of the points at x = 1e6 are still detached
    (the copies of an end's extreme value widen the search), at any cloud size."""
    for n, copies in ((6000, 14), (6000, 290), (1500, 2), (999, 9), (20000, 40)):
        coord = cloud(n, seed=n)
        coord[-copies:, 0] = 1e6
        assert [g.tolist() for g in detached_points(coord)] == [list(range(n - copies, n))], (n, copies)
    coord = cloud(6000, seed=10)
    coord[:400, 0] = 1e6  # 6.7 %: more than a fill of outliers, left alone
    assert detached_points(coord) == []


def test_real_clouds_detach_nothing(data_root) -> None:
    """The LiDAR tiles and SemanticKITTI scans of the README are chunked as before."""
    from sciformer.data.pointcloud.io import read_point_file

    paths = sorted((data_root / "lidar").glob("*.la[sz]")) + sorted((data_root / "semantickitti_scans").glob("*_points.npy"))
    if not paths:
        pytest.skip("real point clouds absent (set SCIFORMER_DATA)")
    for path in paths:
        coord = np.asarray(read_point_file(path)["coord"], dtype=np.float64)[:, :3]
        assert detached_points(coord) == [], path.name


@pytest.mark.parametrize("views", [{}, {"overlap": 0.5, "views": [None]}])
def test_scene_evaluation_refuses_non_finite_scores(views: dict) -> None:
    """A diverged model's NaN scores are one line naming the point, in both evaluation paths,
    never a class-0 prediction that metrics would count."""
    coord = cloud(600, seed=9)
    dataset = SceneEvalDataset(ArrayScene({"coord": coord, "label": np.zeros(600, dtype=np.int64)}, "toy"),
                               grid_size=None, max_points=150, part_z="min", transform=None, features=[], seed=0)
    good = pointwise_predict(3)

    def predict(batch: dict) -> torch.Tensor:
        logits = good(batch).clone()  # (N, 3)
        logits[int(batch["coord"][:, 2].argmax()), 0] = float("nan")  # the highest point of each batch
        return logits

    with pytest.raises(DataError, match=r"^the model gives non-finite scores for \d+ point\(s\) of a chunk \(first: point \d+\);"):
        predict_scene(dataset, 0, predict, collate_points, batch_size=2, num_classes=3, **views)
    assert predict_scene(dataset, 0, good, collate_points, batch_size=2, num_classes=3, **views).shape == (600,)
