"""Per-point geometric features of a whole point cloud (Weinmann et al. 2015; CANUPO).

What LiDAR classifiers outside deep learning run on, and an input feature of the
``las_tiles`` dataset (``data.features: [geometric, ...]``): for every point, the
covariance eigenvalues :math:`\\lambda_1 \\ge \\lambda_2 \\ge \\lambda_3` of its ``k``
nearest neighbours (itself included) at each of several scales give

    linearity (l1 - l2) / l1, planarity (l2 - l3) / l1, scattering l3 / l1,
    omnivariance cbrt(e1 e2 e3), anisotropy (l1 - l3) / l1, eigenentropy -sum e log e,
    change of curvature l3 / (l1 + l2 + l3), log1p(l1 + l2 + l3), verticality 1 - |n_z|,
    log1p(z range), log1p(z standard deviation)

(``e = lambda / sum(lambda)``, ``n`` the eigenvector of the smallest eigenvalue), and one
last channels, one per cell size (5 m: the terrain nearby; 40 m: reaches the ground
beside a large roof): the signed log1p of the height above the local ground (the lowest,
over the 3 x 3 block of ``cell``-metre 2-D cells around the point, of each cell's 5 % z
quantile). Metric quantities go through log1p so that
every channel stays O(1) for a network whatever the terrain (a forest's splits do not
change under a monotone map). Computed once per whole tile, before any crop or grid
sampling, so a crop and a prediction on the user's file see the same values.
``benchmarks/bench_point_baselines.py`` feeds the same features to a random forest.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sciformer.data.pointcloud.cache import cache_key, load_arrays, save_arrays_atomic
from sciformer.data.pointcloud.fields import usable_coords
from sciformer.errors import DataError
from sciformer.geometry import knn

SCALES: tuple[int, ...] = (10, 25, 50)  # neighbours per scale
CELLS: tuple[float, ...] = (5.0, 40.0)  # metres: 2-D cells of the local ground (3 x 3 cells around each point)
LOW_QUANTILE = 0.05  # a cell's ground: this quantile of its z (robust to a few low noise points)
EIGEN_NAMES = ("linearity", "planarity", "scattering", "omnivariance", "anisotropy", "eigenentropy",
               "curvature_change", "log_sum", "verticality", "log_z_range", "log_z_std")
_MAX_CELL = 2**30  # cell index cap per axis (ids of two axes fit in int64)
VERSION = 2  # bump when the definition changes (cache keys and checkpoints carry it)


def channels(scales: Sequence[int] = SCALES, cells: Sequence[float] = CELLS) -> int:
    """Number of feature channels: 11 per scale plus one local height per cell size."""
    return len(EIGEN_NAMES) * len(scales) + len(cells)


def eigen_features(neighbours: np.ndarray) -> np.ndarray:
    """The 11 eigenvalue features of each neighbourhood.

    Shapes: neighbours (n, k, 3) float64 -> (n, 11) float64.
    """
    k = neighbours.shape[1]
    centred = neighbours - neighbours.mean(axis=1, keepdims=True)  # (n, k, 3)
    cov = np.einsum("nki,nkj->nij", centred, centred) / k  # (n, 3, 3)
    vals, vecs = np.linalg.eigh(cov)  # ascending (n, 3), (n, 3, 3)
    vals = np.clip(vals, 1e-12, None)
    l3, l2, l1 = vals[:, 0], vals[:, 1], vals[:, 2]
    total = l1 + l2 + l3  # (n,)
    e = vals / total[:, None]  # (n, 3)
    normal_z = np.abs(vecs[:, 2, 0])  # z of the smallest eigenvector (n,)
    z = neighbours[..., 2]  # (n, k)
    return np.stack([
        (l1 - l2) / l1, (l2 - l3) / l1, l3 / l1,
        np.cbrt(e.prod(axis=1)), (l1 - l3) / l1,
        -(e * np.log(e)).sum(axis=1), l3 / total, np.log1p(total),
        1.0 - normal_z, np.log1p(z.max(axis=1) - z.min(axis=1)), np.log1p(z.std(axis=1)),
    ], axis=1)


def height_above_local_min(coord: np.ndarray, cell: float = CELLS[0], quantile: float = LOW_QUANTILE) -> np.ndarray:
    """z minus the local ground: the lowest, over the 3 x 3 block of ``cell``-metre cells
    around each point, of each cell's low z (its ``quantile``: the point of rank
    ``floor(quantile * (count - 1))`` in z order, so that a few low noise points in a
    cell do not lower the ground of every point around them; the minimum below 1 / quantile
    points). Negative for points below that ground.

    Only occupied cells are stored (memory grows with the points, never with the cloud's
    extent: one outlier kilometres away costs one cell); cell indices saturate at
    :data:`_MAX_CELL` cells from the cloud's corner, far beyond any real survey.

    Shapes: coord (n, 3) -> (n,).
    """
    steps = np.floor((coord[:, :2] - coord[:, :2].min(axis=0)) / cell)  # (n, 2) float, >= 0
    ij = np.minimum(steps, _MAX_CELL).astype(np.int64) + 1  # (n, 2) one cell of margin each side
    width = _MAX_CELL + 3
    flat = ij[:, 0] * width + ij[:, 1]  # (n,) cell id
    order = np.lexsort((coord[:, 2], flat))  # by cell, then z
    cells, first, count = np.unique(flat[order], return_index=True, return_counts=True)  # sorted cell ids
    low = coord[order[first + np.floor(quantile * (count - 1)).astype(np.int64)], 2]  # (cells,)
    block = np.full(len(cells), np.inf)  # (cells,) lowest ground over each cell's 3 x 3 block
    for di in (-1, 0, 1):
        for dj in (-1, 0, 1):
            other = cells + di * width + dj  # (cells,) neighbour ids
            at = np.minimum(np.searchsorted(cells, other), len(cells) - 1)  # (cells,)
            block = np.minimum(block, np.where(cells[at] == other, low[at], np.inf))
    return coord[:, 2] - block[np.searchsorted(cells, flat)]


def geometric_features(coord: np.ndarray, scales: Sequence[int] = SCALES, cells: Sequence[float] = CELLS,
                       chunk: int = 131072) -> np.ndarray:
    """Every geometric feature of one whole cloud (see the module docstring).

    Neighbours come from one kNN search at the largest scale (:func:`sciformer.geometry.knn`,
    rows sorted by distance); each smaller scale takes its first ``k`` columns. Scales
    above the cloud's size use every point. Queries run in chunks of ``chunk`` points.

    Shapes: coord (n, 3) float64 (finite) -> (n, channels(scales, cells)) float32.
    """
    coord = np.asarray(coord, dtype=np.float64)  # (n, 3)
    n = len(coord)
    local = coord - coord.min(axis=0)  # (n, 3) small numbers for the search
    support = torch.from_numpy(local)
    k_max = min(max(scales), n)
    out = np.empty((n, channels(scales, cells)), dtype=np.float32)  # (n, F)
    eigen = len(EIGEN_NAMES) * len(scales)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        index = knn(support[start:stop], support, k_max).index.numpy()  # (m, k_max)
        neighbours = local[index]  # (m, k_max, 3)
        parts = [eigen_features(neighbours[:, : min(k, n)]) for k in scales]  # each (m, 11)
        out[start:stop, :eigen] = np.concatenate(parts, axis=1)
    for c, cell in enumerate(cells):
        height = height_above_local_min(coord, cell)  # (n,)
        out[:, eigen + c] = np.sign(height) * np.log1p(np.abs(height))
    return out


def geometric_state(scales: Sequence[int] = SCALES, cells: Sequence[float] = CELLS) -> dict[str, object]:
    """What a checkpoint records so that prediction computes the same features."""
    return {"version": VERSION, "scales": [int(k) for k in scales], "cells": [float(c) for c in cells]}


def cached_geometric_features(coord: np.ndarray, cache_root: Path, *identity: Any) -> np.ndarray:
    """:func:`geometric_features` of a whole cloud, computed once into a folder of ``cache_root``
    keyed by ``identity`` and the feature parameters: ``identity`` must determine ``coord``
    (the source file's identity, and whatever decides which of its points are kept).

    Shapes: coord (n, 3) -> (n, channels()) float32 (memory-mapped).
    """
    state = geometric_state()
    folder = cache_root / cache_key(*identity, state)
    if not (folder / "meta.json").is_file():
        save_arrays_atomic(folder, {"geometric": geometric_features(coord)}, {"source": [str(i) for i in identity], **state})
    return load_arrays(folder, ["geometric"])["geometric"]


def features_as_recorded(coord: np.ndarray, recorded: dict[str, object], usable: np.ndarray | None = None) -> np.ndarray:
    """Geometric features of a file's points as a checkpoint recorded them (:func:`geometric_state`):
    computed over the ``usable`` points (default: those whose coordinates are in the model's
    range, :func:`~sciformer.data.pointcloud.fields.usable_coords`, the rule prediction uses;
    a dataset that also drops points with an invalid feature passes its own mask, so that prediction sees the neighbourhoods training saw),
    0 for the others. A checkpoint of another :data:`VERSION` is a
    one-line DataError.

    Shapes: coord (n, 3) -> (n, channels(recorded scales, recorded cells)) float32.
    """
    if recorded.get("version") != VERSION:
        raise DataError(f"checkpoint: geometric features of version {recorded.get('version')}, this sciformer computes "
                        f"version {VERSION}; retrain, or predict with the sciformer that trained it")
    scales = [int(k) for k in recorded["scales"]]  # type: ignore[union-attr]
    cells = [float(c) for c in recorded["cells"]]  # type: ignore[union-attr]
    coord = np.asarray(coord, dtype=np.float64)  # (n, 3)
    if usable is None:
        usable = usable_coords(coord)  # (n,) False for NaN / Inf
    out = np.zeros((len(coord), channels(scales, cells)), dtype=np.float32)  # (n, F)
    if usable.any():
        out[usable] = geometric_features(coord[usable], scales, cells)
    return out
