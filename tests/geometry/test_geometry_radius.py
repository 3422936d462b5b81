"""Radius query against scipy cKDTree.query_ball_point, per cloud of packed batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from geometry_oracles import ball_oracle, random_batch

from sciformer.errors import DataError
from sciformer.geometry import radius
from sciformer.geometry.knn import available_backends

BACKENDS = ["brute", "scipy"] + (["pykdtree"] if available_backends()["pykdtree"] else [])


def expected_rows(rows, cap):
    """The ``cap`` nearest members of each ball, as (set of indices, sorted distances)."""
    return [({i for _, i in row[:cap]}, [d for d, _ in row[:cap]]) for row in rows]


@pytest.mark.parametrize("backend", BACKENDS + ["auto"])
def test_radius_matches_ball_query_oracle(backend):
    rng = np.random.default_rng(0)
    support, s_off = random_batch(rng, [80, 300, 45])
    query, q_off = random_batch(rng, [25, 40, 10])
    query[25:40] = support[80:95]  # some queries inside their cloud
    r, cap = 1.2, 10
    res = radius(
        torch.from_numpy(query), torch.from_numpy(support), r, cap,
        torch.from_numpy(q_off), torch.from_numpy(s_off), backend=backend,
    )
    assert res.index.shape == (75, cap)
    counts = (res.index >= 0).sum(dim=1).tolist()
    oracle = ball_oracle(query, support, r, q_off, s_off)
    assert any(len(row) > cap for row in oracle) and any(len(row) < cap for row in oracle)
    for row, (want_set, want_dist), count in zip(range(75), expected_rows(oracle, cap), counts):
        assert count == len(want_set)
        assert set(res.index[row, :count].tolist()) == want_set
        np.testing.assert_allclose(res.dist[row, :count].numpy(), want_dist, atol=1e-9)
        assert bool((res.index[row, count:] == -1).all()) and bool(torch.isinf(res.dist[row, count:]).all())
        assert bool((res.dist[row, :count] <= r).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_radius_fill_policies_and_empty_balls(backend):
    pts = torch.tensor([[0.0, 0, 0], [0.1, 0, 0], [0.25, 0, 0], [5.0, 0, 0]], dtype=torch.float64)
    far = torch.tensor([[100.0, 0, 0]], dtype=torch.float64)
    q = torch.cat([pts, far])
    sent = radius(q, pts, 0.2, 4, backend=backend)
    assert sent.index.tolist() == [[0, 1, -1, -1], [1, 0, 2, -1], [2, 1, -1, -1], [3, -1, -1, -1], [-1, -1, -1, -1]]
    near = radius(q, pts, 0.2, 4, fill="nearest", backend=backend)
    assert near.index.tolist() == [[0, 1, 0, 0], [1, 0, 2, 1], [2, 1, 2, 2], [3, 3, 3, 3], [-1, -1, -1, -1]]
    assert near.dist[1].tolist() == pytest.approx([0.0, 0.1, 0.15, 0.0])
    with pytest.raises(DataError, match="row 0 has only 2 of 4 neighbours within r=0.2"):
        radius(q, pts, 0.2, 4, fill="error", backend=backend)
    no_self = radius(pts, None, 0.2, 3, include_self=False, backend=backend)
    assert no_self.index.tolist() == [[1, -1, -1], [0, 2, -1], [1, -1, -1], [-1, -1, -1]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_radius_is_inclusive_and_zero_radius_finds_duplicates(backend):
    pts = torch.tensor([[0.0, 0, 0], [0.5, 0, 0], [0.0, 0, 0], [1.0, 0, 0]], dtype=torch.float64)
    at_r = radius(pts[:1], pts, 0.5, 4, backend=backend)
    assert set(at_r.index[0, :3].tolist()) == {0, 1, 2}  # distance exactly r is inside
    dup = radius(pts, None, 0.0, 3, backend=backend)
    assert set(dup.index[0, :2].tolist()) == {0, 2} and int(dup.index[0, 2]) == -1
    assert dup.index[1].tolist() == [1, -1, -1]


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "1", None])
def test_radius_bad_r(bad):
    with pytest.raises(DataError, match="radius r"):
        radius(torch.rand(5, 3), None, bad, 4)
