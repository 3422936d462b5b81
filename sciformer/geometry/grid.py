"""Grid (voxel) pooling per cloud of a packed batch, with the map back to the input points."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from sciformer.errors import DataError
from sciformer.geometry._validate import (
    check_choice,
    check_nonempty,
    check_offset,
    check_points,
)

REDUCE = ("max", "mean")
ORIGIN = ("min", "zero")


class GridPooled(NamedTuple):
    """Result of :func:`grid_pool`.

    Shapes:
        coord: (V, D) mean coordinate of the points in each voxel.
        feat: (V, C) max or mean of their features; None without input features.
        offset: (B,) int64 cumulative ends of the pooled clouds.
        cluster: (N,) int64 voxel of each input point; ``grid_unpool(x, cluster)`` unpools.
        count: (V,) int64 number of points in each voxel.
        index: (V,) int64 lowest input index in each voxel (grid *sampling*: a real point).
    """

    coord: torch.Tensor
    feat: torch.Tensor | None
    offset: torch.Tensor
    cluster: torch.Tensor
    count: torch.Tensor
    index: torch.Tensor


def grid_pool(
    coord: torch.Tensor,
    voxel_size: float | Sequence[float],
    offset: torch.Tensor | None = None,
    feat: torch.Tensor | None = None,
    *,
    reduce: str = "max",
    origin: str = "min",
) -> GridPooled:
    """Pool the points of each cloud falling into the same voxel into one point.

    Point :math:`p` of cloud :math:`b` falls into voxel
    :math:`\\lfloor (p - o_b) / \\text{voxel\\_size} \\rfloor` (computed in float64), where the
    origin :math:`o_b` is the cloud's minimum corner (``origin="min"``, PTv2's grid pooling)
    or 0 (``origin="zero"``, a lattice shared by all clouds, as Pointcept's ``GridSample``).
    Voxels never merge points of different clouds. Voxels are ordered by cloud, then
    lexicographically by voxel coordinate. Pooled coordinates are the mean of the voxel's
    points; features are their max (PTv2) or mean. Gradients flow to ``coord`` and ``feat``.

    Args:
        coord: points of the packed batch.
        voxel_size: edge length, one for all axes or one per axis (> 0).
        offset: cumulative cloud ends; ``None`` for one cloud.
        feat: per-point features to pool, or None.
        reduce: ``"max"`` or ``"mean"`` for the features.
        origin: ``"min"`` or ``"zero"``.

    Shapes:
        coord: (N, D), offset: (B,), feat: (N, C)
        -> coord (V, D), feat (V, C), offset (B,), cluster (N,), count (V,), index (V,)
    """
    coord = check_points(coord, "coord")
    _, sizes = check_offset(offset, coord.shape[0], "offset", coord.device)
    check_nonempty(sizes, "coord")
    check_choice(reduce, "reduce", REDUCE)
    check_choice(origin, "origin", ORIGIN)
    n, dim = coord.shape
    if feat is not None and (not isinstance(feat, torch.Tensor) or feat.ndim != 2 or feat.shape[0] != n):
        raise DataError(f"feat must be a tensor of shape ({n}, C), got {getattr(feat, 'shape', type(feat).__name__)}")
    size = _voxel_size(voxel_size, dim, coord.device)  # (D,) float64
    device = coord.device
    b_count = len(sizes)

    with torch.no_grad():
        batch = torch.repeat_interleave(torch.arange(b_count, device=device), torch.tensor(sizes, device=device))
        c64 = coord.detach().to(torch.float64)
        if origin == "min":
            if b_count == 1:
                lo = c64.min(dim=0, keepdim=True).values  # (1, D), broadcast
            else:
                lo = torch.full((b_count, dim), math.inf, dtype=torch.float64, device=device)
                lo = lo.scatter_reduce(0, batch.unsqueeze(1).expand(-1, dim), c64, "amin")  # (B, D)
                lo = lo.index_select(0, batch)  # (N, D)
            cell = _cells(torch.floor((c64 - lo) / size))  # (N, D) >= 0
        else:
            cell = _cells(torch.floor(c64 / size))
            cell -= cell.min(dim=0).values  # shift to >= 0; membership unchanged
    return _pool(batch, cell, b_count, coord, feat, reduce)


def pool_cells(
    cell: torch.Tensor,
    offset: torch.Tensor | None,
    coord: torch.Tensor,
    feat: torch.Tensor | None = None,
    *,
    reduce: str = "max",
) -> GridPooled:
    """:func:`grid_pool` on integer voxels given per point (e.g. grid cells ``// stride``).

    The points of a cloud with equal ``cell`` rows become one point, exactly as
    :func:`grid_pool` pools the voxels it computes; ``coord`` (any positions) is averaged.

    Shapes:
        cell: (N, D) int64 >= 0, offset: (B,), coord: (N, E), feat: (N, C)
        -> coord (V, E), feat (V, C), offset (B,), cluster (N,), count (V,), index (V,)
    """
    if not isinstance(cell, torch.Tensor) or cell.ndim != 2 or cell.dtype != torch.int64:
        raise DataError(f"cell must be an int64 tensor of shape (N, D), got {getattr(cell, 'dtype', type(cell).__name__)} {tuple(getattr(cell, 'shape', ()))}")
    n = cell.shape[0]
    _, sizes = check_offset(offset, n, "offset", cell.device)
    check_nonempty(sizes, "cell")
    check_choice(reduce, "reduce", REDUCE)
    if coord.shape[0] != n or (feat is not None and (feat.ndim != 2 or feat.shape[0] != n)):
        raise DataError(f"coord and feat must have one row per cell ({n}), got {tuple(coord.shape)} and {tuple(getattr(feat, 'shape', ()))}")
    if n and int(cell.min()) < 0:
        raise DataError(f"cell must be >= 0, got a minimum of {int(cell.min())}")
    with torch.no_grad():
        batch = torch.repeat_interleave(torch.arange(len(sizes), device=cell.device), torch.tensor(sizes, device=cell.device))
    return _pool(batch, cell, len(sizes), coord, feat, reduce)


def _pool(batch: torch.Tensor, cell: torch.Tensor, b_count: int, coord: torch.Tensor,
          feat: torch.Tensor | None, reduce: str) -> GridPooled:
    """Pool the points of equal (cloud, cell); see :func:`grid_pool`.

    Shapes:
        batch: (N,), cell: (N, D) int64 >= 0, coord: (N, E), feat: (N, C) -> GridPooled
    """
    n = cell.shape[0]
    with torch.no_grad():
        order, new_run = _sort_cells(batch, cell)  # (N,), (N,) bool: first point of each voxel
        first = new_run.nonzero().flatten()  # (V,) positions in sorted order
        count = torch.diff(first, append=first.new_tensor([n]))  # (V,)
        cluster = torch.empty_like(order).index_copy_(0, order, torch.cumsum(new_run, 0) - 1)  # (N,)
        index = order[first]  # stable sort: the lowest input index of each voxel
        new_offset = torch.cumsum(torch.bincount(batch[index], minlength=b_count), dim=0)

    pooled_coord = segment_mean(coord, cluster, count)
    pooled_feat = None
    if feat is not None:
        pooled_feat = segment_mean(feat, cluster, count) if reduce == "mean" else segment_max(feat, cluster, count.shape[0])
    return GridPooled(pooled_coord, pooled_feat, new_offset, cluster, count, index)


class _SegmentMax(torch.autograd.Function):
    """Column-wise max per segment; the gradient is shared by a segment's tied maxima.

    The same values and gradient as ``scatter_reduce(..., "amax", include_self=False)``,
    whose backward on CPU is several times slower than this one (one compare, one
    index_add, one gather).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, segment: torch.Tensor, num: int) -> torch.Tensor:  # type: ignore[override]
        out = x.new_zeros((num, x.shape[1])).scatter_reduce_(
            0, segment.unsqueeze(1).expand_as(x), x, "amax", include_self=False
        )  # (S, C)
        ctx.save_for_backward(x, segment, out)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        x, segment, out = ctx.saved_tensors
        hit = (x == out.index_select(0, segment)).to(grad.dtype)  # (N, C) 1 where x is its segment's max
        ties = grad.new_zeros(out.shape).index_add_(0, segment, hit)  # (S, C) maxima per segment and column
        return hit.mul_((grad / ties.clamp_min(1)).index_select(0, segment)), None, None  # (N, C)


def segment_max(x: torch.Tensor, segment: torch.Tensor, num: int) -> torch.Tensor:
    """Column-wise max of the rows of ``x`` per segment (an empty segment gives zeros).

    Differentiable: a segment's gradient goes to the rows holding its maximum, shared
    equally among ties (as ``scatter_reduce``'s ``"amax"``).

    Shapes:
        x: (N, C), segment: (N,) int64 in [0, num) -> (num, C)
    """
    segment = segment.to(x.device)
    if not x.requires_grad or not torch.is_grad_enabled():
        return x.new_zeros((num, x.shape[1])).scatter_reduce_(0, segment.unsqueeze(1).expand_as(x), x, "amax", include_self=False)
    return _SegmentMax.apply(x, segment, num)


def grid_unpool(pooled: torch.Tensor, cluster: torch.Tensor) -> torch.Tensor:
    """Copy each voxel's value back to the points it pooled (the inverse map of :func:`grid_pool`).

    Shapes:
        pooled: (V, C), cluster: (N,) -> (N, C)
    """
    return pooled[cluster]


def _cells(floor: torch.Tensor) -> torch.Tensor:
    """Integer voxel coordinates of float64 ``floor`` values, in the same order per axis.

    Beyond int64 (a point 1e20 voxels away, e.g. a FLT_MAX no-data point) a cast would wrap
    and merge far voxels with near ones; there each axis is replaced by its dense rank.

    Shapes: floor (N, D) float64 -> (N, D) int64
    """
    if float(floor.abs().max()) < 2.0**62:
        return floor.to(torch.int64)
    return torch.stack([torch.unique(col, return_inverse=True)[1] for col in floor.unbind(dim=1)], dim=1)


def _sort_cells(batch: torch.Tensor, cell: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable order of the points by (cloud, voxel) and a mask of each run's first point.

    Shapes:
        batch: (N,), cell: (N, D) int64 >= 0 -> order: (N,), new_run: (N,) bool
    """
    extent = [int(e) + 1 for e in cell.max(dim=0).values.tolist()]
    total = (int(batch[-1]) + 1) * math.prod(extent)
    if total < 2**62:  # one integer key per point: (cloud, cell) linearised, x-major
        key = batch
        for axis in range(cell.shape[1]):
            key = key * extent[axis] + cell[:, axis]
        if total < 2**31:
            key = key.to(torch.int32)  # sorts about twice as fast
        key, order = torch.sort(key, stable=True)
        change = key[1:] != key[:-1]
    else:  # huge lattice: stable sorts column by column (least significant first)
        columns = [batch] + list(cell.unbind(dim=1))
        order = torch.arange(len(batch), device=batch.device)
        for col in reversed(columns):
            order = order[torch.sort(col[order], stable=True).indices]
        rows = torch.stack([col[order] for col in columns], dim=1)
        change = (rows[1:] != rows[:-1]).any(dim=1)
    return order, torch.cat([change.new_ones(1), change])


def segment_mean(x: torch.Tensor, segment: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Mean of the rows of ``x`` per segment (differentiable); an empty segment gives zeros.

    The one segment mean: voxels of :func:`grid_pool` (``segment = cluster``) and whole
    clouds of a packed batch (``segment = offset_to_batch(offset)``,
    ``count = offset_to_sizes(offset)``: global average pooling).

    Shapes:
        x: (N, C), segment: (N,) int64 in [0, S), count: (S,) rows per segment -> (S, C)
    """
    segment = segment.to(x.device)
    count = count.to(x.device)
    if x.shape[1] < 8:  # few columns (coordinates): accumulate along a contiguous row per column
        total = x.new_zeros((x.shape[1], count.shape[0])).index_add(1, segment, x.T.contiguous()).T  # (S, C)
    else:
        total = x.new_zeros((count.shape[0], x.shape[1])).index_add(0, segment, x)  # (S, C)
    return total / count.clamp_min(1).unsqueeze(1).to(x.dtype)


def _voxel_size(voxel_size: object, dim: int, device: torch.device) -> torch.Tensor:
    values = [voxel_size] if isinstance(voxel_size, (int, float)) else voxel_size
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    if (
        not isinstance(values, (list, tuple))
        or len(values) not in (1, dim)
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        or not all(math.isfinite(v) and v > 0 for v in values)
    ):
        raise DataError(f"voxel_size must be one positive number or {dim} of them, got {voxel_size!r}")
    return torch.tensor(list(values) * (dim if len(values) == 1 else 1), dtype=torch.float64, device=device)
