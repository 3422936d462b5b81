"""The neighbour-index contract shared by every neighbourhood form (PTv1, PTv2, CPE).

A neighbour index ``idx`` (N, k) holds, for each of N query points, k indices into M
source points (the point itself included by convention, as ``sciformer.geometry.knn``
returns it). ``-1`` marks padding: a padded entry takes no part in the attention (its
weight is zero, it enters no statistic), and a point with no valid neighbour outputs
zeros. Both :class:`~sciformer.attention.neighborhood.PointTransformerLayer` and
:class:`~sciformer.attention.grouped.GroupedVectorAttention` follow this rule.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sciformer.errors import DataError

__all__ = ["check_neighbor_index", "check_points", "has_padding", "narrow_positions"]


def check_neighbor_index(
    idx: Tensor, num_queries: int, num_sources: int, name: str = "idx", *, allow_padding: bool = False
) -> Tensor:
    """Validate a neighbour index and return it as a contiguous int64 tensor.

    Raises :class:`~sciformer.errors.DataError` (one line) unless ``idx`` is an integer
    tensor of shape (num_queries, k), k >= 1, with values in [0, num_sources) (or -1,
    padding, with ``allow_padding``).

    Shapes:
        idx: (N, k) -> (N, k) int64
    """
    if not isinstance(idx, Tensor):
        raise DataError(f"{name} must be a torch.Tensor of shape (N, k), got {type(idx).__name__}")
    if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
        raise DataError(f"{name} must be an integer tensor (int64), got dtype {idx.dtype}")
    if idx.ndim != 2 or idx.shape[0] != num_queries or idx.shape[1] < 1:
        raise DataError(
            f"{name} must have shape (N={num_queries}, k>=1), got {tuple(idx.shape)}"
        )
    if idx.numel() > 0:
        lo_t, hi_t = torch.aminmax(idx)
        lo, hi = int(lo_t), int(hi_t)
        low = -1 if allow_padding else 0
        if lo < low or hi >= num_sources:
            padding = " (-1 = padding)" if allow_padding else ""
            raise DataError(
                f"{name} values must lie in [{low}, {num_sources}){padding}, got min {lo} and max {hi}"
            )
    return idx.to(torch.long).contiguous()


def check_points(x: Tensor, pos: Tensor, in_channels: int) -> None:
    """Validate packed point features (N, in_channels) and coordinates (N, 3) on one device."""
    if not isinstance(x, Tensor) or x.ndim != 2 or x.shape[1] != in_channels:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise DataError(f"x must have shape (N, in_channels={in_channels}), got {shape}")
    if x.shape[0] == 0:
        raise DataError("x must contain at least one point, got 0 rows")
    if not x.dtype.is_floating_point:
        raise DataError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    if not isinstance(pos, Tensor) or pos.ndim != 2 or pos.shape != (x.shape[0], 3):
        shape = tuple(pos.shape) if isinstance(pos, Tensor) else type(pos).__name__
        raise DataError(f"pos must have shape (N={x.shape[0]}, 3), got {shape}")
    if pos.device != x.device:
        raise DataError(f"pos is on {pos.device} but x is on {x.device}; expected one device")




def has_padding(idx: Tensor) -> bool:
    """Whether a checked neighbour index holds any ``-1`` (padding) entry."""
    return idx.numel() > 0 and bool((idx < 0).any())


def narrow_positions(pos: Tensor, dtype: torch.dtype) -> Tensor:
    """Positions in the features' ``dtype`` with their offsets kept: wider positions (float64
    UTM coordinates beside float32 features) are first moved to their bounding box's centre,
    in their own precision, so that the narrowing rounds at the cloud's extent, not at 5e6 m
    (0.5 m in float32). The layers use only offsets ``p_j - p_i``, which the move keeps.

    Shapes:
        pos: (N, 3) -> (N, 3)
    """
    if pos.dtype == dtype or pos.shape[0] == 0 or not pos.is_floating_point() or torch.finfo(pos.dtype).bits <= torch.finfo(dtype).bits:
        return pos.to(dtype)
    fixed = pos.detach()
    finite = fixed.isfinite()  # (N, 3): a NaN row must not move every other row
    lo = torch.where(finite, fixed, float("inf")).amin(dim=0)  # (3,)
    hi = torch.where(finite, fixed, float("-inf")).amax(dim=0)
    centre = torch.where(lo <= hi, (lo + hi) / 2, torch.zeros_like(lo))  # (3,)
    return (pos - centre).to(dtype)  # (N, 3)

