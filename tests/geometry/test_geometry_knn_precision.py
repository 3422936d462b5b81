"""kNN precision where a cloud is large against its point spacing, checked against cKDTree in
float64 on the same points: brute force (the GPU default without torch_cluster, the CPU
default above 12 dimensions) and the KD-tree path that lays many clouds out in one tree."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from geometry_oracles import knn_oracle

from sciformer.geometry import knn, radius

KD_BACKENDS = ["pykdtree", "scipy"]


def _clusters_far_apart(rng: np.random.Generator, n: int = 400, dim: int = 3) -> np.ndarray:
    """Two 1 mm clusters 1 km apart: |s|^2 is 1e12 times the squared spacing."""
    centres = np.zeros((2, dim))
    centres[1, 0] = 1000.0
    return centres[rng.integers(0, 2, n)] + rng.normal(size=(n, dim)) * 1e-3


def _assert_same_distances(dist: torch.Tensor, ref: np.ndarray, rel: float) -> None:
    """Distances equal the oracle's row by row (the sets agree up to ties and rounding)."""
    got = dist.double().numpy()
    np.testing.assert_allclose(got, ref, rtol=rel, atol=rel * float(np.median(ref[:, -1])))


@pytest.mark.parametrize("backend", ["brute", "auto", *KD_BACKENDS])
def test_far_apart_clusters_in_float32(backend: str) -> None:
    pts = _clusters_far_apart(np.random.default_rng(0)).astype(np.float32)
    x = torch.from_numpy(pts)
    off = np.array([len(pts)])
    _, ref = knn_oracle(pts.astype(np.float64), pts.astype(np.float64), 4, off, off)
    found = knn(x, None, 4, backend=backend)
    assert (found.dist[:, 0] == 0).all()  # every point finds itself
    _assert_same_distances(found.dist, ref[0], 1e-5)


def test_small_object_in_a_large_float32_tile_by_brute_force() -> None:
    rng = np.random.default_rng(1)
    ground = rng.random((4000, 3)) * [100, 100, 5] - [50, 50, 0]  # a 100 m tile, centred
    thing = rng.normal(size=(500, 3)) * 0.005 + [45, 45, 1]  # a 5 mm-spaced object near a corner
    pts = np.concatenate([ground, thing]).astype(np.float32)
    off = np.array([len(pts)])
    _, ref = knn_oracle(pts.astype(np.float64), pts.astype(np.float64), 8, off, off)
    _assert_same_distances(knn(torch.from_numpy(pts), None, 8, backend="brute").dist, ref[0], 1e-5)


def test_high_dimensional_far_apart_clusters() -> None:
    pts = _clusters_far_apart(np.random.default_rng(2), dim=16).astype(np.float32)
    found = knn(torch.from_numpy(pts), None, 1)  # auto: brute force above 12 dimensions
    assert (found.dist[:, 0] == 0).all()


def test_radius_by_brute_force_finds_what_a_kd_tree_finds() -> None:
    x = torch.from_numpy(_clusters_far_apart(np.random.default_rng(3)).astype(np.float32))
    brute = radius(x, None, 0.002, 8, backend="brute")
    tree = radius(x, None, 0.002, 8, backend="pykdtree")
    assert int((brute.index >= 0).sum()) == int((tree.index >= 0).sum()) > len(x)
    assert torch.equal(brute.index.sort(dim=1).values, tree.index.sort(dim=1).values)


@pytest.mark.parametrize("backend", KD_BACKENDS)
def test_a_far_stray_point_in_one_cloud_costs_another_cloud_nothing(backend: str) -> None:
    """Many clouds share one tree, each shifted by a multiple of the largest diagonal; a stray
    point 1e9 away would round a 0.1 mm-spaced cloud's coordinates there."""
    rng = np.random.default_rng(4)
    survey = np.concatenate([rng.random((100, 3)) * 100, [[1e9, 0, 0]]])
    fine = rng.random((100, 3)) * 0.01
    pts = np.concatenate([survey, fine])
    off = np.array([101, 201])
    _, ref = knn_oracle(pts, pts, 4, off, off)
    found = knn(torch.from_numpy(pts), None, 4, torch.from_numpy(off), backend=backend)
    np.testing.assert_array_equal(found.dist[101:].numpy(), ref[1])


@pytest.mark.parametrize("backend", KD_BACKENDS)
def test_float64_distances_of_many_small_clouds_are_exact(backend: str) -> None:
    rng = np.random.default_rng(5)
    sizes = [300, 50, 200, 120]
    pts = np.concatenate([rng.normal(size=(s, 3)) * 10 ** rng.uniform(-3, 2) + rng.normal(size=3) * 100 for s in sizes])
    off = np.cumsum(sizes)
    idx_ref, ref = knn_oracle(pts, pts, 6, off, off)
    found = knn(torch.from_numpy(pts), None, 6, torch.from_numpy(off), backend=backend)
    np.testing.assert_allclose(found.dist.numpy(), np.concatenate(ref), rtol=1e-15, atol=0)


@pytest.mark.parametrize("separation", [1e3, 1e4, 1e5])
def test_brute_force_on_clusters_far_apart_in_float64(separation: float) -> None:
    """Ranking by |s|^2 - 2 q.s cancels even in float64 once clusters are 1e4-1e5 m apart; the
    3-D brute force sums coordinate differences instead."""
    rng = np.random.default_rng(6)
    pts = np.concatenate([rng.normal(size=(200, 3)) * 1e-3, rng.normal(size=(200, 3)) * 1e-3 + [separation, 0, 0]])
    off = np.array([len(pts)])
    _, ref = knn_oracle(pts, pts, 8, off, off)
    found = knn(torch.from_numpy(pts), None, 8, backend="brute")
    np.testing.assert_allclose(found.dist.numpy(), ref[0], rtol=1e-9, atol=0)
    hits = radius(torch.from_numpy(pts), None, 3e-4, 16, backend="brute")
    tree = radius(torch.from_numpy(pts), None, 3e-4, 16, backend="scipy")
    assert int((hits.index >= 0).sum()) == int((tree.index >= 0).sum())


@pytest.mark.parametrize("backend", KD_BACKENDS)
def test_points_exactly_at_the_radius_in_a_batch_of_clouds(backend: str) -> None:
    """Lattices of spacing r: the axis neighbours lie at r (up to the coordinates' rounding); the
    layout of many clouds in one tree must not decide the bound by its own rounding."""
    rng = np.random.default_rng(1)
    for _ in range(25):
        rng.normal(size=3)
    h = 2.9
    lattice = np.stack(np.meshgrid(*[np.arange(4)] * 3, indexing="ij"), -1).reshape(-1, 3) * h
    pts = np.concatenate([lattice + rng.normal(size=3) * 1000 * (b + 1) for b in range(5)])
    off = np.cumsum([64] * 5)
    d = np.sqrt(np.square(pts[:, None] - pts[None]).sum(-1))
    same = np.kron(np.eye(5, dtype=bool), np.ones((64, 64), dtype=bool))
    expected = ((d <= h) & same).sum(1)
    found = radius(torch.from_numpy(pts), None, h, 64, torch.from_numpy(off), backend=backend)
    np.testing.assert_array_equal((found.index >= 0).sum(1).numpy(), expected)
