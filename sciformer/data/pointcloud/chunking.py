"""Prediction of huge point clouds in bounded memory: overlapping chunks, merged softmax, TTA.

A cloud of any size is covered by *chunks* of at most ``max_points`` points. Each chunk is
a compact *core* (the cloud split by recursive median cuts, see
:func:`partition_points`) plus its nearest surrounding
points as context (``overlap``: context points per core point), so points near a core's
border are also seen with their neighbourhood from another chunk. The softmax of every
chunk (and of every test-time view) is summed per original point and normalised::

    probs = predict_chunked(predict, sample, prepare, num_classes=8, max_points=100_000)
    labels = probs.argmax(axis=1)                    # (n,)

Memory is bounded by one batch of chunks plus the (n, num_classes) accumulator, whatever
the size of the cloud.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sciformer.contracts import Batch, PredictFn
from sciformer.data.pointcloud.sample import collate_points
from sciformer.data.transforms import (
    RandomFlip,
    RandomRotate,
    Sample,
    Transform,
    grid_sample_indices,
    index_points,
)
from sciformer.errors import DataError

__all__ = ["Chunk", "check_finite_scores", "detached_points", "grid_parts", "partition_points", "plan_chunks", "split_detached", "predict_chunked", "tta_views"]


def detached_points(coord: np.ndarray, share: float = 0.001, gap: float = 1.0, small_gap: float = 5.0) -> list[np.ndarray]:
    """Gross outliers: the points beyond an empty gap at either end of an axis.

    Along each axis, among the ``share`` of points at either end, the sorted coordinates
    are searched for a step wider than ``gap`` times the extent of the remaining points
    (that extent is taken as at least 10 % of the widest axis's, so a flat axis keeps a
    scale); the points beyond it are *detached* (a no-data value such as 1e6 or -9999, a
    stray return far below the ground). At least min(1 % of the points, 9) are searched per
    end; where that is more than ``share``, the step must exceed ``small_gap`` times the
    extent. Copies of an end's extreme value (a no-data fill repeated on many points) widen
    the search by their count, up to 5 % of the points. Chunks are centred on their bounding
    box (:class:`~sciformer.data.transforms.CenterShift`) and voxel grids anchored at their
    minimum corner, so one such point would move every other point far from where the
    model saw points in training; detached points are predicted as clouds of their own
    instead. Clouds of fewer than 16 points, or of one repeated point, detach nothing.
    O(n) per axis.

    Shapes: coord (n, d) -> index arrays (sorted, disjoint), one per detached group;
    usually none.
    """
    n = coord.shape[0]
    groups: list[np.ndarray] = []
    if n < 16:
        return groups
    tail = max(int(share * n), min(n // 100, 9), 1)
    if tail > int(share * n):  # more than the share searched: ask for a far wider gap
        gap = small_gap
    ends, extents = [], []
    for axis in range(coord.shape[1]):
        values = np.asarray(coord[:, axis], dtype=np.float64)  # (n,)
        repeats = (np.count_nonzero(values == values.min()), np.count_nonzero(values == values.max()))
        lo, hi = (tail + r - 1 if r <= 0.05 * n else tail for r in repeats)  # a repeated no-data fill counts as one
        if lo + hi >= n - 1:
            continue
        part = np.argpartition(values, (lo, n - 1 - hi))  # the lo + 1 lowest and hi + 1 highest at the ends
        low, high = part[: lo + 1], part[n - 1 - hi :]
        low, high = low[np.argsort(values[low], kind="stable")], high[np.argsort(values[high], kind="stable")]
        ends.append((values, low, high))
        extents.append(values[high[0]] - values[low[-1]])
    if not extents or not max(extents) > 0:  # one repeated point (or NaN): nothing to measure against
        return groups
    floor = 0.1 * max(extents)
    taken = np.zeros(n, dtype=bool)
    for (values, low, high), extent in zip(ends, extents, strict=True):
        width = gap * max(extent, floor)
        if not width > 0:  # NaN coordinates
            continue
        low_cut = np.flatnonzero(np.diff(values[low]) > width)  # step i lies between low[i] and low[i + 1]
        high_cut = np.flatnonzero(np.diff(values[high]) > width)
        found = ([low[: low_cut[-1] + 1]] if len(low_cut) else []) + ([high[high_cut[0] + 1 :]] if len(high_cut) else [])
        for idx in found:
            idx = idx[~taken[idx]]
            if len(idx):
                taken[idx] = True
                groups.append(np.sort(idx).astype(np.int64))
    return groups


def _median_parts(coord: np.ndarray, max_points: int | None) -> list[np.ndarray]:
    """Recursive median cuts along the longer horizontal extent into parts of at most
    ``max_points`` (one part when None or when the cloud fits)."""
    n = coord.shape[0]
    if not max_points or n <= max_points:
        return [np.arange(n)]
    parts: list[np.ndarray] = []
    stack = [np.arange(n)]
    while stack:
        idx = stack.pop()
        if len(idx) <= max_points:
            parts.append(idx)
            continue
        xy = coord[idx, :2]  # (k, 2)
        axis = int(np.argmax(xy.max(axis=0) - xy.min(axis=0)))
        half = len(idx) // 2
        order = np.argpartition(xy[:, axis], half)
        stack.extend([idx[order[half:]], idx[order[:half]]])
    return parts


def split_detached(coord: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """(rest, groups): the indices of the points kept together, and the detached groups."""
    groups = detached_points(coord)
    if not groups:
        return np.arange(coord.shape[0]), groups
    keep = np.ones(coord.shape[0], dtype=bool)
    for group in groups:
        keep[group] = False
    return np.flatnonzero(keep), groups


def grid_parts(coord: np.ndarray, grid_size: float | None,
               ties: Sequence[np.ndarray] = ()) -> tuple[np.ndarray, np.ndarray, list[slice]]:
    """Grid sampling that keeps gross outliers (:func:`detached_points`) apart: the other
    points and each detached group are sampled on grids of their own, each anchored at its
    own minimum corner, so a far point moves no other point's voxel.

    Returns ``keep`` (m,) rows of ``coord`` (the point of each voxel nearest its centre, ties
    broken by the values of ``coord`` and then of ``ties``, per-point arrays such as the
    features: the same values whatever the order of the rows), ``inverse`` (n,)
    each row's position in ``keep``, and one slice of ``keep`` per cloud to predict apart:
    the other points first, then each detached group. Without detached points this is
    :func:`~sciformer.data.transforms.grid_sample_indices` of the whole cloud.
    """
    n = coord.shape[0]
    rest, groups = split_detached(coord)
    keeps, slices = [], []
    inverse = np.empty(n, dtype=np.int64)  # (n,)
    start = 0
    for rows in [rest, *groups]:
        if grid_size:
            whole = len(rows) == n
            keep, inv = grid_sample_indices(coord if whole else coord[rows], grid_size,
                                            ties=ties if whole else [t[rows] for t in ties])
        else:
            keep, inv = np.arange(len(rows)), np.arange(len(rows))
        keeps.append(rows[keep])
        inverse[rows] = start + inv
        slices.append(slice(start, start + len(keep)))
        start += len(keep)
    return np.concatenate(keeps).astype(np.int64), inverse, slices


def _pieces(index: np.ndarray, max_points: int | None) -> list[np.ndarray]:
    """``index`` cut into consecutive pieces of at most ``max_points``."""
    step = max_points or len(index)
    return [index[i : i + step] for i in range(0, len(index), step)]


def partition_points(coord: np.ndarray, max_points: int | None) -> list[np.ndarray]:
    """Split points into compact parts of at most ``max_points`` (all in one part when None).

    Parts come from recursive median splits along the longer horizontal extent, so
    they are balanced (more than ``max_points / 2`` points each) and spatially
    compact. Gross outliers (:func:`detached_points`) form parts of their own, last.
    Returns index arrays into ``coord`` that cover every point once.
    """
    rest, groups = split_detached(coord)
    parts = [rest[p] for p in _median_parts(coord[rest], max_points)]
    return parts + [piece for group in groups for piece in _pieces(group, max_points)]


@dataclass(frozen=True)
class Chunk:
    """One chunk: ``index`` (m,) int64 positions into the cloud, its ``core`` points first."""

    index: np.ndarray
    core: int


def plan_chunks(coord: np.ndarray, max_points: int | None, overlap: float = 0.25) -> list[Chunk]:
    """Chunks of at most ``max_points`` points whose cores cover every point exactly once.

    Cores hold at most ``max_points / (1 + overlap)`` points; each gets ``overlap`` times
    its size of the points closest to its horizontal bounding box (Chebyshev distance in
    x, y) as context, so a chunk never exceeds ``max_points``. ``max_points=None`` or a cloud that fits gives one chunk of
    every point in input order. Gross outliers (:func:`detached_points`) are chunks of
    their own, last, without context, and never context of another chunk.

    Shapes:
        coord: (n, 3) -> chunks with index (m_i,), m_i <= max_points
    """
    coord = np.asarray(coord)
    if coord.ndim != 2 or coord.shape[1] < 2 or coord.shape[0] == 0:
        raise DataError(f"plan_chunks: coord must have shape (n, 3) with n > 0, got {coord.shape}")
    if max_points is not None and max_points < 1:
        raise DataError(f"plan_chunks: max_points must be >= 1 or None, got {max_points}")
    if not 0.0 <= overlap:
        raise DataError(f"plan_chunks: overlap must be >= 0, got {overlap}")
    rest, groups = split_detached(coord)
    detached = [Chunk(piece, len(piece)) for group in groups for piece in _pieces(group, max_points)]
    n = len(rest)
    if max_points is None or n <= max_points:
        return [Chunk(rest.astype(np.int64), n), *detached]
    core_points = max(1, int(max_points / (1.0 + overlap)))
    xy = np.ascontiguousarray(coord[rest, :2], dtype=np.float64)  # (n, 2) detached points are never context
    chunks = []
    in_core = np.zeros(n, dtype=bool)
    for core in _median_parts(coord[rest], core_points):
        core = np.sort(core).astype(np.int64)
        extra = min(int(overlap * len(core)), max_points - len(core), n - len(core))
        if extra <= 0:
            chunks.append(Chunk(rest[core], len(core)))
            continue
        lo, hi = xy[core].min(axis=0), xy[core].max(axis=0)  # (2,)
        gap = np.maximum(np.maximum(lo - xy, xy - hi), 0.0).max(axis=1)  # (n,) distance to the box
        in_core[core] = True
        gap[in_core] = np.inf
        in_core[core] = False
        context = np.argpartition(gap, extra - 1)[:extra]  # (extra,) nearest non-core points
        chunks.append(Chunk(rest[np.concatenate([core, np.sort(context)])], len(core)))
    return chunks + detached


def tta_views(rotations: int = 1, flip: bool = False) -> list[Transform | None]:
    """Test-time views: ``rotations`` equal turns about z (the first is the identity), each
    also mirrored in x when ``flip``. ``None`` stands for the unchanged input."""
    if rotations < 1:
        raise DataError(f"tta_views: rotations must be >= 1, got {rotations}")
    views: list[Transform | None] = []
    for i in range(rotations):
        angle = 360.0 * i / rotations
        turn = RandomRotate(axis="z", angle=(angle, angle), p=1.0) if i else None
        views.append(turn)
        if flip:
            mirror = RandomFlip(axes=("x",), p=1.0)
            views.append(mirror if turn is None else _Both(turn, mirror))
    return views


class _Both(Transform):
    """Two deterministic transforms in order (a rotated and mirrored view)."""

    def __init__(self, first: Transform, second: Transform) -> None:
        self.first, self.second = first, second

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        return self.second(self.first(sample, rng), rng)


def check_finite_scores(probs: np.ndarray, rows: np.ndarray, point_ids: np.ndarray | None) -> None:
    """DataError naming the first point whose probabilities are not finite.

    Shapes: probs (N, C), rows (N,) their rows in the cloud.
    """
    bad = ~np.isfinite(probs).all(axis=1)  # (N,)
    if bad.any():
        bad_rows = np.unique(rows[bad])  # (b,) sorted
        first = int(bad_rows[0] if point_ids is None else np.asarray(point_ids)[bad_rows].min())
        raise DataError(f"the model gives non-finite scores for {len(bad_rows)} point(s) of a chunk (first: point {first}); "
                        "has the model diverged (see its validation loss), or are there coordinates or feature values far "
                        "outside the training data's range, e.g. a no-data fill?")


def predict_chunked(
    predict: PredictFn,
    sample: Sample,
    prepare: Callable[[Sample], Sample],
    *,
    num_classes: int,
    max_points: int | None,
    overlap: float = 0.25,
    batch_size: int = 1,
    views: Sequence[Transform | None] = (None,),
    collate: Callable[[list[Sample]], Batch] = collate_points,
    progress: Callable[[int, int], None] | None = None,
    point_ids: np.ndarray | None = None,
) -> np.ndarray:
    """Class probabilities of every point of a cloud, predicted chunk by chunk.

    Args:
        predict: batch dict -> logits (N, num_classes) (the model in eval mode).
        sample: the whole cloud: ``coord`` (n, 3) and any per-point arrays.
        prepare: a chunk's raw sample -> a model-ready item (centring, features), as the
            dataset makes its items; it must keep every point in order.
        num_classes: logits per point.
        max_points: chunk size bound (cores plus context); None: one chunk.
        overlap: context points per core point (0: disjoint chunks).
        batch_size: chunks per model call.
        views: test-time views (:func:`tta_views`), applied to each chunk before
            ``prepare``; ``None`` is the unchanged chunk.
        collate: items -> batch dict.
        progress: called with (done, total) model calls.
        point_ids: (n,) the points' numbers as the user knows them (rows of the file),
            for error messages; None: their rows in ``sample``.

    Raises:
        DataError: the model gives non-finite scores for some point (inputs far outside
            the training data's range); nothing is returned for a partly NaN cloud.

    Returns:
        (n, num_classes) float32: the summed softmax of every chunk and view covering a
        point, divided by their count (rows sum to 1).
    """
    coord = np.asarray(sample["coord"])  # (n, 3)
    n = coord.shape[0]
    if not views:
        raise DataError("predict_chunked: views must hold at least one view (None is the unchanged input)")
    chunks = plan_chunks(coord, max_points, overlap)
    total = np.zeros((n, num_classes), dtype=np.float32)  # (n, C) summed softmax
    count = np.zeros(n, dtype=np.float32)  # (n,) chunks x views seen
    jobs = [(chunk, view) for chunk in chunks for view in views]
    step = max(1, int(batch_size))
    calls = (len(jobs) + step - 1) // step
    for call, start in enumerate(range(0, len(jobs), step)):
        part = jobs[start : start + step]
        items = []
        for chunk, view in part:
            piece = index_points(sample, chunk.index)
            if view is not None:
                piece = view(piece, np.random.default_rng(0))
            item = prepare(piece)
            if np.asarray(item["coord"]).shape[0] != len(chunk.index):
                raise DataError(f"predict_chunked: prepare changed a chunk of {len(chunk.index)} points into {np.asarray(item['coord']).shape[0]}; it must keep every point")
            items.append(item)
        batch = collate(items)
        with torch.no_grad():
            logits = predict(batch).detach().float()  # (N, C)
        if tuple(logits.shape) != (int(batch["offset"][-1]), num_classes):
            raise DataError(f"predict returned logits of shape {tuple(logits.shape)}, expected ({int(batch['offset'][-1])}, {num_classes})")
        probs = torch.softmax(logits, dim=1).cpu().numpy()  # (N, C)
        check_finite_scores(probs, np.concatenate([chunk.index for chunk, _ in part]), point_ids)
        first = 0
        for chunk, _ in part:
            m = len(chunk.index)
            total[chunk.index] += probs[first : first + m]  # a chunk never repeats a point
            count[chunk.index] += 1.0
            first += m
        if progress is not None:
            progress(call + 1, calls)
    return total / np.maximum(count, 1.0)[:, None]
