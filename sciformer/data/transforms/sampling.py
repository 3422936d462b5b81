"""Point selection transforms: dropout, shuffling, fixed-size sampling, grid sampling, crops."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from sciformer.data.transforms.base import (
    Sample,
    Transform,
    index_points,
    num_points,
    point_keys,
)
from sciformer.errors import ConfigError, DataError


class RandomDropout(Transform):
    """With probability ``p``, drop a fraction ``ratio`` of the points (at least one kept).

    Shapes: per-point arrays (n, ...) -> (m, ...), m = n - floor(n * ratio).
    """

    random = True

    keeps_points = False

    def __init__(self, ratio: float = 0.2, p: float = 0.5) -> None:
        if not 0 <= ratio < 1:
            raise ConfigError(f"RandomDropout.ratio must be in [0, 1), got {ratio}")
        self.ratio = float(ratio)
        self.p = float(p)

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        rng = self._rng(rng)
        n = num_points(sample)
        if n == 0 or rng.random() >= self.p:
            return sample
        keep = max(1, n - int(n * self.ratio))
        index = np.sort(rng.choice(n, keep, replace=False))  # (m,)
        return index_points(sample, index)


class ShufflePoints(Transform):
    """Randomly permute the points.

    Shapes: per-point arrays (n, ...) -> (n, ...).
    """

    random = True

    keeps_points = False

    def __init__(self) -> None:
        pass

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        rng = self._rng(rng)
        return index_points(sample, rng.permutation(num_points(sample)))


class RandomSample(Transform):
    """Keep ``n`` random points (without replacement; with replacement only if fewer).

    Shapes: per-point arrays (m, ...) -> (n, ...).
    """

    random = True

    keeps_points = False

    def __init__(self, n: int) -> None:
        if n <= 0:
            raise ConfigError(f"RandomSample.n must be positive, got {n}")
        self.n = int(n)

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        rng = self._rng(rng)
        m = num_points(sample)
        if m == 0:
            raise DataError("RandomSample: empty point cloud (0 points)")
        index = rng.choice(m, self.n, replace=m < self.n)  # (n,)
        return index_points(sample, index)


class FixedPoints(Transform):
    """Keep the first ``n`` points (deterministic); fewer points are repeated cyclically.

    Shapes: per-point arrays (m, ...) -> (n, ...).
    """

    keeps_points = False

    def __init__(self, n: int) -> None:
        if n <= 0:
            raise ConfigError(f"FixedPoints.n must be positive, got {n}")
        self.n = int(n)

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        m = num_points(sample)
        if m == 0:
            raise DataError("FixedPoints: empty point cloud (0 points)")
        return index_points(sample, np.arange(self.n) % m)


def point_values(sample: Sample, first: Sequence[str] = ()) -> list[np.ndarray]:
    """The numeric per-point arrays of ``sample`` but ``coord``, to break ties between points
    (:func:`grid_sample_indices`): those named in ``first`` (the model's features) in that
    order, then the others by name, so equal inputs to the model come before the labels."""
    keys = [k for k in point_keys(sample) if k != "coord" and np.asarray(sample[k]).dtype.kind in "biuf"]
    ordered = [k for k in first if k in keys] + sorted(k for k in keys if k not in first)
    return [np.asarray(sample[k]) for k in ordered]


def _central_points(coord: np.ndarray, size: float, inverse: np.ndarray, m: int,
                    ties: Sequence[np.ndarray]) -> np.ndarray:
    """The point of each voxel nearest its centre, ties broken by the smallest (x, y, z,
    then ``ties`` columns) lexicographically: chosen by value, never by row, so any order of
    the rows picks points of the same values. O(n) but for the tied voxels.

    Shapes: coord (n, d) float64, inverse (n,) -> keep (m,)
    """
    offset = coord - coord.min(axis=0)  # (n, d), then in place: in voxel units ...
    offset /= size
    offset -= np.floor(offset)
    offset -= 0.5  # ... from the voxel's centre
    dist = np.einsum("ij,ij->i", offset, offset)  # (n,)
    nearest = np.full(m, np.inf)  # (m,)
    np.minimum.at(nearest, inverse, dist)
    cand = np.flatnonzero(dist == nearest[inverse])  # (k,) at least one per voxel
    keep = np.empty(m, dtype=np.int64)  # (m,)
    keep[inverse[cand]] = cand
    if len(cand) > m:  # ties at the smallest distance: lexicographic by value
        tied = np.bincount(inverse[cand], minlength=m) > 1  # (m,)
        cand = cand[tied[inverse[cand]]]
        columns = [coord[cand, j] for j in range(coord.shape[1])]
        for t in ties:
            t = np.asarray(t)[cand]
            columns += [t] if t.ndim == 1 else list(t.reshape(len(cand), -1).T)
        cand = cand[np.lexsort([*columns[::-1], inverse[cand]])]  # by voxel, then the values
        first = np.r_[True, inverse[cand[1:]] != inverse[cand[:-1]]]  # (k,)
        keep[inverse[cand[first]]] = cand[first]
    return keep


def grid_sample_indices(
    coord: np.ndarray, size: float, rng: np.random.Generator | None = None, ties: Sequence[np.ndarray] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """One point per occupied voxel of edge ``size`` (voxels from :func:`sciformer.geometry.grid_pool`).

    Voxels are anchored at the cloud's minimum corner and computed in float64.
    Without ``rng`` each voxel keeps the point nearest its centre, equal distances
    going to the lexicographically smallest (x, y, z, then the per-point arrays ``ties``,
    e.g. the features): chosen by the points' values, so the kept values, and all that
    is predicted from them, do not depend on the order of the rows. With ``rng``, a
    uniformly random one. Returns ``keep`` (m,) original indices ordered
    by voxel and ``inverse`` (n,) with ``keep[inverse[i]]`` in the voxel of point i,
    so values on the kept points map back to every point as ``values[inverse]``.
    """
    from sciformer.geometry import grid_pool

    if not size > 0:
        raise ConfigError(f"grid size must be positive, got {size}")
    n = coord.shape[0]
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    c64 = np.ascontiguousarray(coord, dtype=np.float64)  # (n, d)
    pooled = grid_pool(torch.from_numpy(c64), float(size))
    inverse = pooled.cluster.numpy()  # (n,)
    count = pooled.count.numpy()  # (m,)
    if rng is None:
        return _central_points(c64, float(size), inverse, len(count), ties), inverse
    order = np.argsort(inverse, kind="stable")  # (n,) points grouped by voxel
    starts = np.cumsum(count) - count  # (m,)
    keep = order[starts + (rng.random(len(count)) * count).astype(np.int64)]
    return keep, inverse


class GridSample(Transform):
    """Keep one point per voxel of edge ``size`` (random in ``train`` mode; in ``test``, the
    point nearest the voxel's centre, ties broken by value: see :func:`grid_sample_indices`).

    Stores ``inverse`` (n_original,) so predictions on the kept points map back to
    every original point (``pred[inverse]``); repeated grid sampling composes it.

    Shapes: per-point arrays (n, ...) -> (m, ...); inverse (n_original,).
    """

    keeps_points = False

    def __init__(self, size: float = 0.04, mode: Literal["train", "test"] = "train") -> None:
        if size <= 0:
            raise ConfigError(f"GridSample.size must be positive, got {size}")
        if mode not in ("train", "test"):
            raise ConfigError(f"GridSample.mode must be 'train' or 'test', not {mode!r}")
        self.size = float(size)
        self.mode = mode
        self.random = mode == "train"

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        if num_points(sample) == 0:
            raise DataError("GridSample: empty point cloud (0 points)")
        rng = self._rng(rng) if self.mode == "train" else None
        ties = point_values(sample) if rng is None else []
        keep, inverse = grid_sample_indices(sample["coord"], self.size, rng, ties)
        out = index_points(sample, keep)
        previous = sample.get("inverse")
        out["inverse"] = inverse if previous is None else inverse[previous]
        return out


class SphereCrop(Transform):
    """Keep the ``n`` points nearest to a centre: a random point (``random``) or the bbox centre.

    Clouds with at most ``n`` points are unchanged.

    Shapes: per-point arrays (m, ...) -> (min(m, n), ...).
    """

    random = True

    keeps_points = False

    def __init__(self, n: int = 80000, mode: Literal["random", "center"] = "random") -> None:
        if n <= 0:
            raise ConfigError(f"SphereCrop.n must be positive, got {n}")
        if mode not in ("random", "center"):
            raise ConfigError(f"SphereCrop.mode must be 'random' or 'center', not {mode!r}")
        self.n = int(n)
        self.mode = mode

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        m = num_points(sample)
        if m <= self.n:
            return sample
        coord = sample["coord"]  # (m, 3)
        if self.mode == "random":
            centre = coord[self._rng(rng).integers(m)]
        else:
            centre = (coord.min(axis=0) + coord.max(axis=0)) / 2.0
        dist = np.sum((coord - centre) ** 2, axis=1)  # (m,)
        index = np.sort(np.argpartition(dist, self.n - 1)[: self.n])  # (n,)
        return index_points(sample, index)

