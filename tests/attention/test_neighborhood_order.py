"""Spatial order of the neighbourhood layer's gathers: when it applies, that it is a
permutation that brings neighbours close, and that the layer's results do not depend on it."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from neighborhood_cases import CONFIGS, assert_same_run, make_cloud, randomize_norms, run
from scipy.spatial import cKDTree

import sciformer.attention._neighborhood_order as order_mod
from sciformer.attention._neighborhood_order import (
    gather_order,
    inverse_permutation,
    permute_rows,
    scattered_index,
)
from sciformer.attention.neighborhood import PointTransformerLayer
from sciformer.geometry.point_order import spatial_order


def knn(pts: np.ndarray, k: int) -> torch.Tensor:
    return torch.from_numpy(cKDTree(pts).query(pts, k=k)[1]).long()


def test_a_shuffled_cloud_is_scattered_and_its_morton_order_is_not() -> None:
    pts = np.random.default_rng(0).random((8192, 3))
    idx = knn(pts, 16)
    assert scattered_index(idx, 256)  # C = 64 float32 rows
    order = gather_order(torch.from_numpy(pts), idx, 256)
    assert order is not None and torch.equal(order.sort().values, torch.arange(8192))
    inv = inverse_permutation(order)
    renumbered = inv[idx[order]]  # the same graph on the reordered points
    dist = (renumbered - torch.arange(8192).unsqueeze(1)).abs().double().median()
    assert dist * 256 <= order_mod.SPREAD_BYTES / 8  # neighbours now lie close in memory
    assert not scattered_index(renumbered, 256)
    assert not scattered_index(knn(pts[spatial_order(pts)], 16), 256)


def test_small_or_batched_clouds_keep_their_order() -> None:
    rng = np.random.default_rng(1)
    assert not scattered_index(knn(rng.random((900, 3)), 16), 256)  # 900 rows of 256 B fit
    clouds = [knn(rng.random((128, 3)), 16) + 128 * b for b in range(64)]  # ModelNet-like batch
    assert not scattered_index(torch.cat(clouds), 256)
    assert not scattered_index(torch.empty(0, 16, dtype=torch.long), 256)
    assert gather_order(torch.rand(900, 3), knn(rng.random((900, 3)), 8), 256) is None


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_no_order_for_non_finite_coordinates(bad: float) -> None:
    pts = np.random.default_rng(2).random((8192, 3))
    idx = knn(pts, 8)
    pos = torch.from_numpy(pts)
    pos[17, 1] = bad
    assert scattered_index(idx, 256) and gather_order(pos, idx, 256) is None


def test_inverse_permutation_matches_argsort() -> None:
    order = torch.randperm(1000, generator=torch.Generator().manual_seed(3))
    assert torch.equal(inverse_permutation(order), torch.from_numpy(np.argsort(order.numpy())))


def test_permute_rows_is_differentiable_twice() -> None:
    gen = torch.Generator().manual_seed(4)
    order = torch.randperm(7, generator=gen)
    inv = inverse_permutation(order)
    t = torch.randn(7, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.equal(permute_rows(t, order, inv), t[order])
    assert torch.autograd.gradcheck(lambda x: permute_rows(x, order, inv) ** 3, (t,))
    assert torch.autograd.gradgradcheck(lambda x: permute_rows(x, order, inv) ** 3, (t,))


def _reordering(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    monkeypatch.setattr(order_mod, "SPREAD_BYTES", 0 if on else 1 << 62)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("kwargs", CONFIGS)
def test_layer_results_do_not_depend_on_the_order(monkeypatch: pytest.MonkeyPatch, kwargs, train) -> None:
    """Output (in input order), every gradient and the running statistics agree with the
    layer run in the input order, in float64."""
    n, k, c = 160, 8, 16
    pos, idx = make_cloud(n, k, seed=5)
    torch.manual_seed(0)
    layer = PointTransformerLayer(c, **copy.deepcopy(kwargs), chunk_size=37).double()
    randomize_norms(layer)
    other = copy.deepcopy(layer)
    layer.train(train), other.train(train)
    x, gout = torch.randn(n, c, dtype=torch.float64), torch.randn(n, c, dtype=torch.float64)
    _reordering(monkeypatch, True)
    assert gather_order(pos, idx, 16 * 8) is not None  # the reordered path runs
    a = run(layer, x, pos, idx, gout)
    _reordering(monkeypatch, False)
    b = run(other, x, pos, idx, gout)
    assert_same_run(a, b, atol=1e-10, rtol=1e-9)
    for (name, ta), (_, tb) in zip(layer.named_buffers(), other.named_buffers()):
        torch.testing.assert_close(ta, tb, atol=1e-12, rtol=1e-12, msg=name)


def test_compiled_float32_layer_reordered_matches_input_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped path: float32, compiled stages, a cloud big and scattered enough to be
    reordered by the default test; against the same layer with reordering off."""
    n, k, c = 6000, 16, 64
    pos, idx = make_cloud(n, k, seed=6, dtype=torch.float32)
    assert gather_order(pos, idx, c * 4) is not None  # the default threshold applies here
    torch.manual_seed(0)
    layer = PointTransformerLayer(c, c, share_planes=8)
    other = copy.deepcopy(layer)
    x, gout = torch.randn(n, c), torch.randn(n, c)
    a = run(layer, x, pos, idx, gout)
    _reordering(monkeypatch, False)
    b = run(other, x, pos, idx, gout)
    scale = max(float(t.abs().max()) for t in (a[0], a[1], a[2]))
    assert_same_run(a, b, atol=2e-5 * scale, rtol=1e-4)


def test_coordinates_whose_span_overflows_give_what_the_input_order_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    n, k, c = 300, 8, 16
    pos, idx = make_cloud(n, k, seed=7)
    top = torch.finfo(torch.float64).max
    pos = (pos - 0.5) * top
    pos[0], pos[1] = top, -top  # finite; the span overflows float64
    torch.manual_seed(0)
    layer = PointTransformerLayer(c).double()
    other = copy.deepcopy(layer)
    x = torch.randn(n, c, dtype=torch.float64)
    _reordering(monkeypatch, True)
    assert gather_order(pos, idx, c * 8) is not None
    a = layer(x, pos, idx)
    _reordering(monkeypatch, False)
    b = other(x, pos, idx)
    torch.testing.assert_close(a, b, equal_nan=True)
