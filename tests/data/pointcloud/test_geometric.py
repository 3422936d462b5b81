"""Per-point geometric features against explicit neighbourhoods (scipy cKDTree + numpy
eigvalsh), and as the ``geometric`` input feature of las_tiles (cache, checkpoint, predict)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.spatial import cKDTree

from sciformer.contracts import BuildContext
from sciformer.data.pointcloud import geometric
from sciformer.data.pointcloud.io import read_point_file
from sciformer.data.pointcloud.lidar import LasTilesConfig, build_las_tiles, predict_las_file
from sciformer.engine.metrics import label_scorer
from sciformer.errors import DataError

SPLITS = {"train_files": ["a.las"], "val_files": ["c.las"], "test_files": ["d.las"]}


def oracle_row(coord: np.ndarray, i: int, scales: tuple[int, ...], cells: tuple[float, ...]) -> np.ndarray:
    """Point ``i``'s features from first principles: its k nearest points by cKDTree, the
    biased covariance by np.cov, eigenvalues by eigvalsh, the normal from eigh of that
    one matrix, the local ground by sorting the z of every point of each of the 3 x 3 cells."""
    tree = cKDTree(coord)
    row = []
    for k in scales:
        _, idx = tree.query(coord[i], k=k)
        nb = coord[idx]  # (k, 3)
        cov = np.cov(nb.T, bias=True)  # (3, 3)
        l3, l2, l1 = np.maximum(np.linalg.eigvalsh(cov), 1e-12)
        s = l1 + l2 + l3
        e = np.array([l1, l2, l3]) / s
        normal = np.linalg.eigh(cov)[1][:, 0]
        row += [(l1 - l2) / l1, (l2 - l3) / l1, l3 / l1, (e[0] * e[1] * e[2]) ** (1 / 3), (l1 - l3) / l1,
                -np.sum(e * np.log(e)), l3 / s, np.log(1 + s), 1 - abs(normal[2]),
                np.log(1 + np.ptp(nb[:, 2])), np.log(1 + np.std(nb[:, 2]))]
    for cell in cells:
        ij = np.floor((coord[:, :2] - coord[:, :2].min(axis=0)) / cell)  # (n, 2)
        lows = []
        for di in (-1, 0, 1):
            for dj in (-1, 0, 1):
                z = np.sort(coord[np.all(ij == ij[i] + [di, dj], axis=1), 2])
                if len(z):
                    lows.append(z[int(np.floor(0.05 * (len(z) - 1)))])
        h = coord[i, 2] - min(lows)
        row.append(np.sign(h) * np.log(1 + abs(h)))
    return np.array(row)


def check_against_oracle(coord: np.ndarray, rows: np.ndarray, scales: tuple[int, ...] = (8, 20),
                         cells: tuple[float, ...] = (2.0,)) -> None:
    feats = geometric.geometric_features(coord, scales, cells, chunk=len(coord) // 3 + 1)
    assert feats.shape == (len(coord), geometric.channels(scales, cells)) == (len(coord), 11 * len(scales) + len(cells))
    for i in rows:
        np.testing.assert_allclose(feats[i], oracle_row(coord, i, scales, cells), rtol=1e-4, atol=1e-5)


def test_matches_explicit_neighbourhoods_synthetic() -> None:
    rng = np.random.default_rng(0)
    coord = rng.uniform(0, 20, size=(600, 3)) * [1, 1, 0.3] + [600000.0, 5e6, 100.0]  # georeferenced
    coord[:3, 2] -= 40.0  # low noise points: below the ground the 5 % quantile keeps
    check_against_oracle(coord, np.r_[0, rng.choice(600, 12, replace=False)])


def test_matches_explicit_neighbourhoods_real_tile(fakes) -> None:
    coord = read_point_file(fakes.real_path("lidar", "las_warsaw_small.las"))["coord"]
    rng = np.random.default_rng(1)
    check_against_oracle(coord, rng.choice(len(coord), 10, replace=False), scales=(10, 25, 50), cells=(5.0, 40.0))


def test_shapes_read_as_expected() -> None:
    rng = np.random.default_rng(2)
    line = np.c_[np.linspace(0, 50, 200), np.zeros(200), np.zeros(200)] + rng.normal(0, 1e-3, (200, 3))
    plane = np.c_[np.stack(np.meshgrid(np.arange(20.0), np.arange(20.0)), -1).reshape(-1, 2), np.zeros(400)]
    f_line = geometric.geometric_features(line, (10,), (5.0,))
    f_plane = geometric.geometric_features(plane, (10,), (5.0,))
    assert f_line[:, 0].min() > 0.99  # linearity
    assert f_plane[:, 2].max() < 1e-9  # no scattering out of the plane
    assert f_plane[:, 8].max() < 1e-6  # horizontal: verticality 0
    np.testing.assert_allclose(f_plane[:, -1], 0.0, atol=1e-12)  # flat: no height above the local minimum


@pytest.fixture
def root(tmp_path: Path, fakes) -> Path:
    root = tmp_path / "tiles"
    fakes.las(root / "a.las", n=1200, seed=1)
    fakes.las(root / "c.las", n=500, seed=3)
    fakes.las(root / "d.las", n=900, seed=4, rgb=False)
    return root


def geometric_oracle(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Class scores read off geometric channels (feat = [intensity, geometric...])."""
    return batch["feat"][:, 1:5] * torch.tensor([1.0, 1.3, 0.7, 1.1])  # (N, 4)


def test_las_tiles_geometric_rows_cache_and_predict(root: Path, ctx: BuildContext, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = LasTilesConfig(root=str(root), features=["intensity", "geometric"], eval_max_points=400, **SPLITS)
    task = build_las_tiles(cfg, ctx)
    assert task.info.in_channels == 1 + 35
    state = task.state()
    assert state["geometric"] == {"version": geometric.VERSION, "scales": [10, 25, 50], "cells": [5.0, 40.0]}
    tiles = task.dataset("train").tiles
    arrays = tiles.arrays(0)
    whole = geometric.geometric_features(read_point_file(root / "a.las")["coord"])
    rows = np.array([5, 17, 400, 1100])
    np.testing.assert_array_equal(tiles.sample(0, arrays, rows)["geometric"], whole[rows])  # a crop takes rows
    item = task.dataset("train")[0]
    assert item["feat"].shape[1] == 36 and np.isfinite(item["feat"]).all()

    score = label_scorer(task.info.class_names, task.ignore_index)
    task.export_predictions(geometric_oracle, tmp_path / "eval", batch_size=2, export=None, score=score)
    evaluated = np.load(tmp_path / "eval" / "d_pred.npy")
    assert len(np.unique(evaluated)) > 1  # the scores do depend on the features

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("recomputed instead of read from the cache")

    monkeypatch.setattr("sciformer.data.pointcloud.geometric.geometric_features", refuse)
    build_las_tiles(cfg, ctx).dataset("test").source.load(0)  # cached per tile
    monkeypatch.undo()

    saved = torch.load(_save(state, tmp_path), weights_only=True)  # the checkpoint carries the recipe
    predicted = np.load(predict_las_file(cfg, saved, geometric_oracle, root / "d.las", tmp_path / "d.npy", batch_size=2))
    np.testing.assert_array_equal(predicted, evaluated)  # predict on the file reproduces evaluation
    with pytest.raises(DataError, match="geometric features of version 0"):
        predict_las_file(cfg, {**saved, "geometric": {**saved["geometric"], "version": 0}}, geometric_oracle,
                         root / "d.las", tmp_path / "e.npy", batch_size=2)


def _save(state: dict, tmp_path: Path) -> Path:
    path = tmp_path / "state.pt"
    torch.save(state, path)
    return path


def test_local_ground_memory_follows_points_not_extent() -> None:
    """An outlier 10^30 m away (a corrupt LAS record) neither allocates a grid over the extent
    nor, beyond the cloud's lower corner (the grid's origin), changes the other points' local
    ground (oracle: the cloud without it); one below the corner still gives finite heights."""
    rng = np.random.default_rng(3)
    coord = rng.uniform(0, 60, size=(2000, 3)) * [1, 1, 0.1]
    far = np.vstack([coord, [[1e30, 3e38, 4.0]]])
    h = geometric.height_above_local_min(far, 5.0)
    np.testing.assert_array_equal(h[:-1], geometric.height_above_local_min(coord, 5.0))
    assert h[-1] == 0.0  # alone in its cell: its own ground
    assert np.isfinite(geometric.height_above_local_min(np.vstack([coord, [[-1e30, -3e38, 4.0]]]), 5.0)).all()


def test_features_as_recorded_over_a_given_mask() -> None:
    """A dataset's own usable-point mask (e.g. points with a NaN intensity dropped in training)
    decides which points the neighbourhoods see; the others get 0 (oracle: the features of
    the masked cloud alone)."""
    rng = np.random.default_rng(4)
    coord = rng.uniform(0, 30, size=(400, 3))
    usable = np.ones(400, dtype=bool)
    usable[[3, 77, 200]] = False
    out = geometric.features_as_recorded(coord, geometric.geometric_state(), usable=usable)
    np.testing.assert_array_equal(out[usable], geometric.geometric_features(coord[usable]))
    assert not out[~usable].any()

