"""Spatial order of a cloud for the neighbourhood layer's gathers (CPU).

Each query of :class:`~sciformer.attention.neighborhood.PointTransformerLayer` reads the
rows of its k neighbours from per-point arrays (keys, values, their gradients). When the
points are stored in a spatially scattered order (uniform samples, shuffled or
beam-by-beam scans) and the arrays outgrow the core's cache, nearly every such read misses
it. The layer then runs on the points in Morton order (``spatial_order`` of
:mod:`sciformer.geometry.knn_backends`) and puts its output back in input order; the
permutation costs a few per-point copies and one pass over the index.

The test looks at the index itself: the median distance, in rows, between a query and its
neighbours on a sample of queries, times the bytes of one row. Clouds that are already
coherent (Morton-ordered, scan lines, grids) or small enough for the cache (a batch of
ModelNet clouds, each stored contiguously) keep their order and cost nothing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from sciformer.geometry.point_order import spatial_order

SPREAD_BYTES = 256 << 10  # median neighbour-row distance above which reads leave the L2 cache
SAMPLE_ROWS = 1024  # queries sampled by the test


def scattered_index(idx: Tensor, row_bytes: int) -> bool:
    """Whether queries read neighbour rows that lie far apart in memory: the median
    distance between a query's row and its neighbours' rows, times ``row_bytes``, is above
    ``SPREAD_BYTES`` (on ``SAMPLE_ROWS`` evenly spaced queries).

    Shapes:
        idx: (N, k) int64, no padding
    """
    n = idx.shape[0]
    if n * row_bytes <= SPREAD_BYTES or idx.numel() == 0:
        return False
    rows = torch.arange(0, n, max(1, n // SAMPLE_ROWS), device=idx.device)  # (S,)
    dist = (idx.index_select(0, rows) - rows.unsqueeze(1)).abs()  # (S, k)
    return int(dist.reshape(-1).median()) * row_bytes > SPREAD_BYTES


def gather_order(pos: Tensor, idx: Tensor, row_bytes: int) -> Tensor | None:
    """A Morton order of the points when the index is scattered on a CPU, else None.

    Shapes:
        pos: (N, 3); idx: (N, k) -> (N,) int64 or None
    """
    if pos.device.type != "cpu" or not scattered_index(idx, row_bytes):
        return None
    if not bool(torch.isfinite(pos).all()):
        return None  # no order to find (the output is not finite anyway)
    return torch.from_numpy(spatial_order(pos.detach().to(torch.float64).numpy()))


def inverse_permutation(order: Tensor) -> Tensor:
    """``inv`` with ``inv[order[i]] = i``.

    Shapes:
        order: (N,) -> (N,)
    """
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device=order.device)
    return inv


class _PermuteRows(torch.autograd.Function):
    """Rows of a tensor in a permuted order; the gradient goes back by the inverse
    permutation (a gather, where ``index_select``'s backward would scatter-add)."""

    @staticmethod
    def forward(ctx: Any, t: Tensor, order: Tensor, inverse: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(order, inverse)
        return t.index_select(0, order)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        order, inverse = ctx.saved_tensors
        return _PermuteRows.apply(grad, inverse, order), None, None


def permute_rows(t: Tensor, order: Tensor, inverse: Tensor) -> Tensor:
    """``t[order]`` for a permutation ``order`` with inverse ``inverse`` (differentiable,
    twice as well).

    Shapes:
        t: (N, *F); order, inverse: (N,) -> (N, *F)
    """
    return _PermuteRows.apply(t, order, inverse)
