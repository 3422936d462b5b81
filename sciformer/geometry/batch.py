"""Packed batches of point clouds and conversions to and from PyTorch Geometric.

A packed batch concatenates clouds of different sizes along the first dimension, without
padding, and describes them by ``offset``: the cumulative end of each cloud, an int64
tensor of shape (B,), as in the reference Point Transformer code. Sizes ``[3, 5]`` give
``offset = [3, 8]``; cloud ``b`` is ``coord[offset[b-1]:offset[b]]`` (with ``offset[-1]``
read as 0 for ``b = 0``). PyG describes the same batch by a ``batch`` vector (N,) holding
each point's cloud id; the functions here convert between the two.

torch_geometric is imported only inside :func:`to_pyg` and :func:`from_pyg`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from sciformer.errors import DataError

if TYPE_CHECKING:
    from torch_geometric.data import Batch
from sciformer.geometry._validate import check_offset


class PackedPoints(NamedTuple):
    """A packed batch: points of all clouds concatenated, plus cloud ends.

    Shapes:
        coord: (N, D) coordinates.
        offset: (B,) int64 cumulative cloud ends, ``offset[-1] == N``.
        feat: (N, C) per-point features, or None.
    """

    coord: torch.Tensor
    offset: torch.Tensor
    feat: torch.Tensor | None = None


def sizes_to_offset(sizes: Sequence[int] | torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
    """Cloud sizes -> offset (cumulative ends). ``[3, 5] -> [3, 8]``.

    Shapes:
        sizes: (B,) -> offset: (B,) int64
    """
    sizes_t = torch.as_tensor(sizes, dtype=torch.int64, device=device)
    if sizes_t.ndim != 1 or bool((sizes_t < 0).any()):
        raise DataError(f"sizes must be a 1-D sequence of non-negative integers, got {sizes!r}")
    return torch.cumsum(sizes_t, dim=0)


def offset_to_sizes(offset: torch.Tensor) -> torch.Tensor:
    """Offset (cumulative ends) -> cloud sizes. ``[3, 8] -> [3, 5]``.

    Shapes:
        offset: (B,) -> sizes: (B,) int64
    """
    offset = torch.as_tensor(offset, dtype=torch.int64)
    return torch.diff(offset, prepend=offset.new_zeros(1))


def offset_to_batch(offset: torch.Tensor) -> torch.Tensor:
    """Offset -> PyG-style batch vector holding each point's cloud id. ``[3, 5] -> [0,0,0,1,1,1,1,1]``.

    Shapes:
        offset: (B,) -> batch: (N,) int64, N = offset[-1]
    """
    offset = torch.as_tensor(offset, dtype=torch.int64)
    sizes = offset_to_sizes(offset)
    return torch.repeat_interleave(torch.arange(len(offset), device=offset.device), sizes)


def batch_to_offset(batch: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
    """PyG batch vector (sorted cloud ids) -> offset.

    ``batch_size`` (default ``batch.max() + 1``) allows trailing empty clouds. The vector
    must be sorted, as PyG's collation produces it; anything else raises DataError.

    Shapes:
        batch: (N,) integer, non-decreasing -> offset: (B,) int64
    """
    if not isinstance(batch, torch.Tensor) or batch.ndim != 1 or batch.is_floating_point():
        raise DataError("batch must be a 1-D integer tensor of cloud ids")
    batch = batch.to(torch.int64)
    if batch.numel() and (int(batch[0]) < 0 or bool((batch[1:] < batch[:-1]).any())):
        raise DataError("batch must be sorted and non-negative (points of one cloud contiguous)")
    n_clouds = int(batch[-1]) + 1 if batch.numel() else 0
    if batch_size is None:
        batch_size = n_clouds
    elif batch_size < n_clouds:
        raise DataError(f"batch_size={batch_size} but batch holds cloud id {n_clouds - 1}")
    return torch.cumsum(torch.bincount(batch, minlength=batch_size), dim=0)


def pack(coords: Sequence[torch.Tensor], feats: Sequence[torch.Tensor] | None = None) -> PackedPoints:
    """Concatenate a list of clouds into a packed batch (the collate step).

    Shapes:
        coords: B tensors (n_b, D) -> coord (N, D), offset (B,); feats likewise (n_b, C) -> (N, C).
    """
    if len(coords) == 0:
        raise DataError("pack needs at least one cloud")
    coord = torch.cat(list(coords), dim=0)
    offset = sizes_to_offset([len(c) for c in coords], device=coord.device)
    feat = None
    if feats is not None:
        if len(feats) != len(coords) or any(len(f) != len(c) for f, c in zip(feats, coords)):
            raise DataError("feats must give one (n_b, C) tensor per cloud, with the cloud's point count")
        feat = torch.cat(list(feats), dim=0)
    return PackedPoints(coord, offset, feat)


def unpack(x: torch.Tensor, offset: torch.Tensor) -> list[torch.Tensor]:
    """Split a packed tensor back into per-cloud views.

    Shapes:
        x: (N, ...) -> B tensors (n_b, ...)
    """
    _, sizes = check_offset(offset, x.shape[0], "offset", x.device)
    return list(torch.split(x, sizes, dim=0))


def to_pyg(coord: torch.Tensor, offset: torch.Tensor | None = None, feat: torch.Tensor | None = None, **fields: Any) -> Batch:
    """Packed batch -> ``torch_geometric.data.Batch`` with ``pos``, ``x`` and extra per-point fields.

    Extra keyword tensors of length N (e.g. ``y=labels``) are split per cloud like ``pos``.

    Shapes:
        coord: (N, D), offset: (B,), feat: (N, C) -> Batch(pos (N, D), x (N, C), batch (N,), ptr (B+1,))
    """
    try:
        from torch_geometric.data import Batch, Data
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("to_pyg needs torch_geometric: pip install 'sciformer[pointcloud]'") from exc
    _, sizes = check_offset(offset, coord.shape[0], "offset", coord.device)
    parts: dict[str, list[torch.Tensor]] = {"pos": list(torch.split(coord, sizes))}
    if feat is not None:
        parts["x"] = list(torch.split(feat, sizes))
    for key, value in fields.items():
        if not isinstance(value, torch.Tensor) or value.shape[0] != coord.shape[0]:
            raise DataError(f"to_pyg field {key!r} must be a tensor with {coord.shape[0]} rows")
        parts[key] = list(torch.split(value, sizes))
    data = [Data(**{key: chunks[b] for key, chunks in parts.items()}) for b in range(len(sizes))]
    return Batch.from_data_list(data)


def from_pyg(data: Any) -> PackedPoints:
    """``torch_geometric.data.Data`` or ``Batch`` -> packed batch (coord=``pos``, feat=``x``).

    A ``Data`` without a ``batch`` attribute is one cloud. Clouds must be contiguous, as PyG
    collation makes them.

    Shapes:
        data.pos: (N, D), data.x: (N, C) or None, data.batch: (N,) -> coord (N, D), offset (B,), feat
    """
    pos = getattr(data, "pos", None)
    if not isinstance(pos, torch.Tensor):
        raise DataError("from_pyg needs a Data/Batch with a `pos` tensor of shape (N, D)")
    batch = getattr(data, "batch", None)
    if batch is None:
        offset = torch.tensor([pos.shape[0]], dtype=torch.int64, device=pos.device)
    else:
        num_graphs = getattr(data, "num_graphs", None)
        offset = batch_to_offset(batch, int(num_graphs) if num_graphs is not None else None)
    return PackedPoints(pos, offset, getattr(data, "x", None))
