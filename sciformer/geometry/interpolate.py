"""Inverse-distance interpolation from a coarse cloud to a fine one (PTv1 transition up)."""

from __future__ import annotations

import torch

from sciformer.errors import DataError
from sciformer.geometry._validate import check_points, check_positive_int
from sciformer.geometry.knn import knn


def interpolation_weights(
    coarse_coord: torch.Tensor,
    fine_coord: torch.Tensor,
    coarse_offset: torch.Tensor | None = None,
    fine_offset: torch.Tensor | None = None,
    *,
    k: int = 3,
    eps: float = 1e-8,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` nearest coarse points of each fine point and their inverse-distance weights.

    .. math::
        w_{ij} = \\frac{1 / (d_{ij} + \\epsilon)}{\\sum_{l} 1 / (d_{il} + \\epsilon)}

    with Euclidean distances :math:`d_{ij}` to the ``k`` nearest coarse points of the same
    cloud (PTv1's ``pointops.interpolation``). A coarse cloud with fewer than ``k`` points
    uses all of them: missing entries get index 0 and weight 0. Compute once and reuse with
    :func:`interpolate` when several feature tensors share the same clouds.

    Shapes:
        coarse_coord: (M, D), fine_coord: (N, D), coarse_offset / fine_offset: (B,)
        -> index: (N, k) int64 into the coarse points, weight: (N, k), rows summing to 1
    """
    k = check_positive_int(k, "k")
    coarse_coord = check_points(coarse_coord, "coarse_coord")  # named here; knn would say support
    fine_coord = check_points(fine_coord, "fine_coord", dim=coarse_coord.shape[1])
    index, dist = knn(fine_coord, coarse_coord, k, fine_offset, coarse_offset, fill="sentinel", backend=backend)
    missing = index < 0
    recip = (1.0 / (dist + eps)).masked_fill(missing, 0.0)  # (N, k)
    weight = recip / recip.sum(dim=1, keepdim=True)
    return index.masked_fill(missing, 0), weight


def interpolate(
    coarse_coord: torch.Tensor,
    coarse_feat: torch.Tensor,
    fine_coord: torch.Tensor,
    coarse_offset: torch.Tensor | None = None,
    fine_offset: torch.Tensor | None = None,
    *,
    k: int = 3,
    eps: float = 1e-8,
    weights: tuple[torch.Tensor, torch.Tensor] | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Features of a coarse cloud carried to a fine cloud by k-NN inverse-distance weighting.

    :math:`f_i = \\sum_j w_{ij} \\, x_j` over the ``k`` (default 3) nearest coarse points
    :math:`j` of fine point :math:`i` in the same cloud; weights as in
    :func:`interpolation_weights` (pass ``weights=`` to reuse them). Differentiable with
    respect to ``coarse_feat``; the weights carry no gradient to the coordinates.

    Shapes:
        coarse_coord: (M, D), coarse_feat: (M, C), fine_coord: (N, D), offsets: (B,)
        -> (N, C) in coarse_feat's dtype
    """
    coarse_coord = check_points(coarse_coord, "coarse_coord")
    fine_coord = check_points(fine_coord, "fine_coord", dim=coarse_coord.shape[1])
    m = coarse_coord.shape[0]
    if not isinstance(coarse_feat, torch.Tensor) or coarse_feat.ndim != 2 or coarse_feat.shape[0] != m:
        got = tuple(coarse_feat.shape) if isinstance(coarse_feat, torch.Tensor) else type(coarse_feat).__name__
        raise DataError(f"coarse_feat must have shape ({m}, C), got {got}")
    if weights is None:
        weights = interpolation_weights(
            coarse_coord, fine_coord, coarse_offset, fine_offset, k=k, eps=eps, backend=backend
        )
    index, weight = weights
    if index.shape[0] != fine_coord.shape[0]:
        raise DataError(f"weights are for {index.shape[0]} fine points, fine_coord has {fine_coord.shape[0]}")
    # Weighted sum of k gathered rows without an (N, k, C) intermediate.
    return torch.nn.functional.embedding_bag(
        index, coarse_feat, per_sample_weights=weight.to(coarse_feat.dtype), mode="sum"
    )
