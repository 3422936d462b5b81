"""Point selection transforms: dropout, shuffling, fixed-size sampling, grid sampling, crops."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from sciformer.data.transforms.base import (
    Sample,
    Transform,
    index_points,
    num_points,
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


def grid_sample_indices(
    coord: np.ndarray, size: float, rng: np.random.Generator | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One point per occupied voxel of edge ``size`` (voxels from :func:`sciformer.geometry.grid_pool`).

    Voxels are anchored at the cloud's minimum corner and computed in float64.
    Without ``rng`` the lowest-index point of each voxel is kept (deterministic);
    with it, a uniformly random one. Returns ``keep`` (m,) original indices ordered
    by voxel and ``inverse`` (n,) with ``keep[inverse[i]]`` in the voxel of point i,
    so values on the kept points map back to every point as ``values[inverse]``.
    """
    from sciformer.geometry import grid_pool

    if not size > 0:
        raise ConfigError(f"grid size must be positive, got {size}")
    n = coord.shape[0]
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pooled = grid_pool(torch.from_numpy(np.ascontiguousarray(coord, dtype=np.float64)), float(size))
    inverse = pooled.cluster.numpy()  # (n,)
    if rng is None:
        return pooled.index.numpy(), inverse
    count = pooled.count.numpy()  # (m,)
    order = np.argsort(inverse, kind="stable")  # (n,) points grouped by voxel
    starts = np.cumsum(count) - count  # (m,)
    keep = order[starts + (rng.random(len(count)) * count).astype(np.int64)]
    return keep, inverse


class GridSample(Transform):
    """Keep one point per voxel of edge ``size`` (random in ``train`` mode, first in ``test``).

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
        keep, inverse = grid_sample_indices(sample["coord"], self.size, rng)
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

