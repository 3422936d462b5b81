"""Independent references for the geometry tests: scipy cKDTree and plain numpy/python loops.

Nothing here imports sciformer, so a bug in the library cannot hide in its own oracle.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree


def random_batch(rng: np.random.Generator, sizes: list[int], dim: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Packed float64 clouds of the given sizes (each at its own place and scale) and their offset."""
    parts = [rng.normal(size=(n, dim)) * rng.uniform(0.5, 3.0) + rng.uniform(-10, 10, size=dim) for n in sizes]
    return np.concatenate(parts), np.cumsum(sizes)


def clouds(offset: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each cloud."""
    ends = [int(e) for e in offset]
    return list(zip([0] + ends[:-1], ends))


def knn_oracle(query, support, k, q_offset, s_offset):
    """Per-cloud cKDTree kNN in float64: indices (global) and distances, (M, min(k, n)) per cloud."""
    out_idx, out_dist = [], []
    for (q0, q1), (s0, s1) in zip(clouds(q_offset), clouds(s_offset)):
        kk = min(k, s1 - s0)
        d, i = cKDTree(support[s0:s1]).query(query[q0:q1], k=kk)
        out_idx.append(np.asarray(i).reshape(q1 - q0, kk) + s0)
        out_dist.append(np.asarray(d).reshape(q1 - q0, kk))
    return out_idx, out_dist


def ball_oracle(query, support, r, q_offset, s_offset):
    """Per query point: the sorted list of (distance, global index) within r of its cloud."""
    rows = []
    for (q0, q1), (s0, s1) in zip(clouds(q_offset), clouds(s_offset)):
        tree = cKDTree(support[s0:s1])
        for qi, members in zip(range(q0, q1), tree.query_ball_point(query[q0:q1], r)):
            d = np.linalg.norm(support[s0:s1][members] - query[qi], axis=1) if members else np.zeros(0)
            rows.append(sorted(zip(d.tolist(), [m + s0 for m in members])))
    return rows


def fps_reference(points: np.ndarray, m: int, start: int) -> list[int]:
    """Textbook FPS in float64: farthest from the picked set, lowest index on ties, no repeats."""
    pts = points.astype(np.float64)
    n = len(pts)
    picked = [start]
    best = ((pts - pts[start]) ** 2).sum(axis=1)
    taken = np.zeros(n, dtype=bool)
    taken[start] = True
    while len(picked) < m:
        candidates = np.where(taken, -1.0, best)
        j = int(np.flatnonzero(candidates == candidates.max())[0])
        picked.append(j)
        taken[j] = True
        best = np.minimum(best, ((pts - pts[j]) ** 2).sum(axis=1))
    return picked


def fps_is_valid(points: np.ndarray, order: list[int], start: int, rtol: float = 1e-5) -> bool:
    """Whether ``order`` is *a* farthest point sequence from ``start`` (any tie-breaking)."""
    pts = points.astype(np.float64)
    if order[0] != start or len(set(order)) != len(order):
        return False
    best = ((pts - pts[start]) ** 2).sum(axis=1)
    taken = np.zeros(len(pts), dtype=bool)
    taken[start] = True
    for j in order[1:]:
        top = np.where(taken, -1.0, best).max()
        if taken[j] or best[j] < top - rtol * max(top, 1e-30):
            return False
        taken[j] = True
        best = np.minimum(best, ((pts - pts[j]) ** 2).sum(axis=1))
    return True


def grid_oracle(points, offset, size, feat=None, origin="min"):
    """Voxel pooling with numpy: dict (cloud, voxel tuple) -> member indices, plus pooled values."""
    groups: dict[tuple, list[int]] = {}
    for b, (s0, s1) in enumerate(clouds(offset)):
        lo = points[s0:s1].min(axis=0) if origin == "min" else np.zeros(points.shape[1])
        cells = np.floor((points[s0:s1] - lo) / size).astype(np.int64)
        for i, cell in enumerate(cells):
            groups.setdefault((b, *cell.tolist()), []).append(s0 + i)
    keys = sorted(groups)
    coord = np.stack([points[groups[key]].mean(axis=0) for key in keys])
    fmax = fmean = None
    if feat is not None:
        fmax = np.stack([feat[groups[key]].max(axis=0) for key in keys])
        fmean = np.stack([feat[groups[key]].mean(axis=0) for key in keys])
    return keys, groups, coord, fmax, fmean


def interpolation_oracle(coarse, feat, fine, c_offset, f_offset, k=3, eps=1e-8):
    """Plain loop over fine points: brute distances to the same cloud's coarse points."""
    out = np.zeros((len(fine), feat.shape[1]))
    for (c0, c1), (f0, f1) in zip(clouds(c_offset), clouds(f_offset)):
        for i in range(f0, f1):
            d = np.sqrt(((coarse[c0:c1] - fine[i]) ** 2).sum(axis=1))
            nearest = np.argsort(d, kind="stable")[:k]
            w = 1.0 / (d[nearest] + eps)
            out[i] = (w[:, None] * feat[c0:c1][nearest]).sum(axis=0) / w.sum()
    return out
