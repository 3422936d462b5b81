"""Radius (ball) query on packed batches, with a cap on the neighbour count."""

from __future__ import annotations

import math

import torch

from sciformer.errors import DataError
from sciformer.geometry.knn import Neighbours, neighbour_search


def radius(
    query: torch.Tensor,
    support: torch.Tensor | None,
    r: float,
    max_neighbors: int = 32,
    query_offset: torch.Tensor | None = None,
    support_offset: torch.Tensor | None = None,
    *,
    include_self: bool = True,
    fill: str = "sentinel",
    backend: str = "auto",
) -> Neighbours:
    """Support points within distance ``r`` of each query point, at most ``max_neighbors``.

    Returns the ``max_neighbors`` *nearest* support points of the query's cloud with
    :math:`\\lVert q_i - s_j \\rVert_2 \\le r`, sorted by distance. (PointNet++'s ball query
    keeps the first ones in index order instead, and torch_cluster's radius an arbitrary
    subset; the nearest ones are the same on every backend.) Rows with fewer neighbours are
    completed according to ``fill``:

    - ``"sentinel"`` (default): index -1, distance ``inf``; count with ``(index >= 0).sum(1)``.
    - ``"nearest"``: repeat the row's nearest neighbour (PointNet++ pads with its first one);
      a row with no neighbour at all keeps the sentinel.
    - ``"error"``: raise DataError if any row has fewer than ``max_neighbors`` neighbours.

    All other conventions (Euclidean distances, packed batches, ``include_self``, duplicates,
    backends) are those of :func:`sciformer.geometry.knn`.

    Shapes:
        query: (M, D), support: (N, D), query_offset: (B,), support_offset: (B,)
        -> index: (M, max_neighbors) int64 into support, dist: (M, max_neighbors)
    """
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or r < 0:
        raise DataError(f"radius r must be a finite number >= 0, got {r!r}")
    return neighbour_search(
        query, support, max_neighbors, query_offset, support_offset,
        radius=float(r), include_self=include_self, fill=fill, backend=backend, caller="radius",
    )
