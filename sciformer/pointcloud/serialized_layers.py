"""Point Transformer V3 layers besides attention: levels with grid cells, stage context,
grid pooling / unpooling between stages.

A v3 level carries the integer grid cell of every point next to its coordinates, so
that serialization (:mod:`sciformer.geometry.serialization`) and pooling agree: pooling
by ``stride`` maps cell ``g`` to ``g // stride`` (:func:`sciformer.geometry.grid_pool`
on the cells), and the map from points to pooled points (``cluster``) is kept for
unpooling instead of being recomputed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, overload

import torch
from torch import Tensor, nn

from sciformer.attention import NeighborBasis, SerializedContext, norm_layer
from sciformer.errors import ConfigError
from sciformer.geometry import knn, serialization_order
from sciformer.geometry.grid import pool_cells


class SerialLevel(NamedTuple):
    """The points of one resolution level, with their grid cells.

    Shapes:
        coord: (N, 3) float; feat: (N, C); offset: (B,) int64; grid: (N, 3) int64 cells >= 0
    """

    coord: Tensor
    feat: Tensor
    offset: Tensor
    grid: Tensor


def linear_bn_gelu(in_channels: int, out_channels: int) -> nn.Sequential:
    """``Linear -> BatchNorm -> GELU`` on rows: (n, in_channels) -> (n, out_channels)."""
    return nn.Sequential(nn.Linear(in_channels, out_channels), norm_layer("batch", out_channels), nn.GELU())


class SerialOrders(Sequence[Tensor]):
    """The permutations of a level along ``orders``, each computed on first use and kept.

    A stage with fewer blocks than orders uses only the first ones (block ``b`` uses order
    ``b mod len(orders)``), so the curves of the other orders are never computed.

    Shapes:
        grid: (N, 3) int64, offset: (B,) -> ``self[i]``: (N,) int64 permutation
    """

    def __init__(self, grid: Tensor, offset: Tensor, orders: Sequence[str]) -> None:
        self.grid, self.offset, self.names = grid, offset, list(orders)
        self._perms: dict[int, Tensor] = {}

    def __len__(self) -> int:
        return len(self.names)

    @overload
    def __getitem__(self, i: int) -> Tensor: ...
    @overload
    def __getitem__(self, i: slice) -> list[Tensor]: ...
    def __getitem__(self, i: int | slice) -> Tensor | list[Tensor]:
        if isinstance(i, slice):
            return [self[j] for j in range(len(self))[i]]
        i = range(len(self))[i]  # negative indices, IndexError past the end
        if i not in self._perms:
            self._perms[i] = serialization_order(self.grid, self.offset, self.names[i])  # (N,)
        return self._perms[i]


def stage_context(level: SerialLevel, orders: list[str], cpe_k: int, cell: float) -> SerializedContext:
    """Serialization orders and the CPE's kNN basis of one stage, shared by its blocks.

    ``cell`` is the stage's voxel edge: the CPE kernel sees offsets in cell units. The
    orders are serialized lazily (:class:`SerialOrders`): only those a block uses.
    """
    perms = SerialOrders(level.grid, level.offset, orders)
    basis = None
    if cpe_k > 0:
        idx, _ = knn(level.coord, None, cpe_k, level.offset, fill="nearest")  # (N, k) self included
        basis = NeighborBasis.build(level.coord, idx, cell, level.feat.dtype)
    return SerializedContext(perms, level.offset, basis)


class SerializedPooling(nn.Module):
    r"""Grid pooling by ``stride`` on the cells (PTv3's serialized pooling without spconv).

    :math:`h = W x` per point; the points whose cells agree after ``g // stride`` (per
    cloud) become one point with the max of :math:`h`, the mean coordinate and the cell
    ``g // stride``; then BatchNorm and GELU. Returns the map ``cluster`` (N,) from each
    input point to its pooled point.

    Shapes:
        level: coord (N, 3), feat (N, in_channels), offset (B,), grid (N, 3)
        -> (SerialLevel with V points and out_channels, cluster (N,) int64 into [0, V))
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 2) -> None:
        super().__init__()
        if stride < 2:
            raise ConfigError(f"stride: expected an integer >= 2, got {stride}")
        self.stride = stride
        self.proj = nn.Linear(in_channels, out_channels)
        self.norm = norm_layer("batch", out_channels)
        self.act = nn.GELU()

    def forward(self, level: SerialLevel) -> tuple[SerialLevel, Tensor]:
        h = self.proj(level.feat)  # (N, C_out)
        cells = torch.div(level.grid, self.stride, rounding_mode="floor")  # (N, 3)
        pooled = pool_cells(cells, level.offset, level.coord, h, reduce="max")  # grid_pool on the cells
        assert pooled.feat is not None
        feat = self.act(self.norm(pooled.feat))  # (V, C_out)
        return SerialLevel(pooled.coord, feat, pooled.offset.to(level.offset.device), cells[pooled.index]), pooled.cluster

    def extra_repr(self) -> str:
        return f"stride={self.stride}"


class SerializedUnpooling(nn.Module):
    r"""Unpooling through the kept cluster map plus a skip connection (PTv3).

    .. math::
        y_i = \mathrm{GELU}(\mathrm{BN}(W_c x_{c(i)})) + \mathrm{GELU}(\mathrm{BN}(W_s s_i))

    with :math:`c(i)` the pooled point of fine point i and :math:`s` the fine level's features.

    Shapes:
        coarse: feat (V, in_channels); fine: feat (N, skip_channels); cluster: (N,)
        -> fine level with feat (N, out_channels)
    """

    def __init__(self, in_channels: int, skip_channels: int, out_channels: int) -> None:
        super().__init__()
        self.proj = linear_bn_gelu(in_channels, out_channels)
        self.proj_skip = linear_bn_gelu(skip_channels, out_channels)

    def forward(self, coarse: SerialLevel, fine: SerialLevel, cluster: Tensor) -> SerialLevel:
        up = self.proj(coarse.feat).index_select(0, cluster)  # (N, C_out)
        return fine._replace(feat=up + self.proj_skip(fine.feat))  # (N, C_out)
