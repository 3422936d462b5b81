"""Point Transformer layers besides attention: transition down/up, pooling, heads.

Everything works on packed batches (clouds concatenated, ``offset`` (B,) cumulative
ends) and keeps the three tensors of a level together in :class:`Level`::

    level = Level(coord, feat, offset)                     # (N, 3), (N, C), (B,)
    down = TransitionDown(32, 64, stride=4, k=16)(level)  # N/4 points per cloud, 64 ch
    up = TransitionUp(64, 32)(down, level)                # back to N points, 32 ch

Attention blocks live in :mod:`sciformer.attention.neighborhood`; the kNN index of a
stage is computed once by :func:`stage_neighbours` and shared by its blocks.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from sciformer.attention._neighborhood_norm import batchnorm_fold, uses_batch_stats
from sciformer.errors import ConfigError, DataError
from sciformer.geometry import (
    fps,
    grid_pool,
    interpolate,
    knn,
    offset_to_batch,
    offset_to_sizes,
)
from sciformer.geometry import segment_mean as segment_mean_by_index
from sciformer.pointcloud._edge_select import selected_edges


class Level(NamedTuple):
    """The points of one resolution level of a packed batch.

    Shapes:
        coord: (N, 3) float; feat: (N, C) float; offset: (B,) int64 cumulative cloud ends.
    """

    coord: Tensor
    feat: Tensor
    offset: Tensor


def linear_bn_relu(in_channels: int, out_channels: int) -> nn.Sequential:
    """``Linear(bias=False)-BatchNorm1d-ReLU`` on rows: (n, in_channels) -> (n, out_channels)."""
    return nn.Sequential(nn.Linear(in_channels, out_channels, bias=False), nn.BatchNorm1d(out_channels), nn.ReLU(inplace=True))


def stage_neighbours(coord: Tensor, offset: Tensor, k: int) -> Tensor:
    """kNN index of a stage, self included, computed once and shared by the stage's blocks.

    A cloud with fewer than ``k`` points repeats its nearest neighbours (``fill="nearest"``),
    so the result of a cloud never depends on the other clouds of the batch.

    Shapes:
        coord: (N, 3), offset: (B,) -> (N, k) int64 into [0, N)
    """
    idx, _ = knn(coord, None, k, offset, fill="nearest")  # (N, k)
    return idx


def segment_mean(x: Tensor, offset: Tensor) -> Tensor:
    """Mean of the rows of each cloud of a packed batch (global average pooling), through
    :func:`sciformer.geometry.segment_mean` with one segment per cloud.

    Shapes:
        x: (N, C), offset: (B,) -> (B, C)
    """
    return segment_mean_by_index(x, offset_to_batch(offset), offset_to_sizes(offset))  # (B, C)


def fps_start(coord: Tensor, offset: Tensor) -> Tensor:
    """Per-cloud FPS start: the point farthest from its cloud's centroid (index within the cloud).

    Unlike a fixed index it does not depend on the order of the points, so a model using it
    is equivariant to permutations of the points within each cloud (barring exact ties).

    Shapes:
        coord: (N, 3), offset: (B,) -> (B,) int64
    """
    with torch.no_grad():
        c = coord.detach().to(torch.float64)
        batch = offset_to_batch(offset).to(c.device)  # (N,)
        centre = segment_mean(c, offset)  # (B, 3)
        dist = (c - centre[batch]).square().sum(dim=1)  # (N,)
        best = torch.full((offset.shape[0],), -1.0, dtype=torch.float64, device=c.device)
        best = best.scatter_reduce(0, batch, dist, "amax")  # (B,)
        rows = torch.arange(c.shape[0], device=c.device)
        first = torch.full_like(best, float(c.shape[0]))
        first = first.scatter_reduce(0, batch, torch.where(dist == best[batch], rows.to(c.dtype), float(c.shape[0])), "amin")
        starts = first.to(torch.int64) - (offset.to(c.device) - offset_to_sizes(offset).to(c.device))  # (B,)
    return starts.cpu()


class TransitionDown(nn.Module):
    r"""Down-sampling by farthest point sampling and kNN max-pooling (PTv1 transition down).

    ``stride == 1``: :math:`y_i = \mathrm{ReLU}(\mathrm{BN}(W x_i))` on the same points.

    ``stride > 1``: FPS picks :math:`\max(1, \lfloor n_b / s \rfloor)` points :math:`i` per
    cloud (start: the point farthest from the centroid, see :func:`fps_start`); each gathers
    its ``k`` nearest points :math:`j` of the full cloud (itself included) and

    .. math::
        y_i = \max_{j \in \mathcal{N}(i)} \mathrm{ReLU}\big(\mathrm{BN}(W [p_j - p_i,\ x_j])\big)

    with BatchNorm over all edges.

    Shapes:
        level.coord: (N, 3), level.feat: (N, in_channels), level.offset: (B,)
        -> Level(coord (M, 3), feat (M, out_channels), offset (B,)), M = sum of sampled counts
    """

    def __init__(self, in_channels: int, out_channels: int, *, stride: int = 1, k: int = 16) -> None:
        super().__init__()
        if stride < 1 or k < 1:
            raise ConfigError(f"TransitionDown needs stride >= 1 and k >= 1, got stride={stride}, k={k}")
        self.stride, self.k = stride, k
        self.in_channels, self.out_channels = in_channels, out_channels
        if stride == 1:
            self.mlp = linear_bn_relu(in_channels, out_channels)
        else:
            self.mlp = linear_bn_relu(in_channels + 3, out_channels)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, stride={self.stride}, k={self.k}"

    def forward(self, level: Level) -> Level:
        coord, feat, offset = level
        if self.stride == 1:
            return Level(coord, self.mlp(feat), offset)  # (N, C_out)
        sampled = fps(coord, offset, ratio=1.0 / self.stride, start=fps_start(coord, offset))
        new_coord = coord[sampled.index]  # (M, 3)
        new_offset = sampled.offset.to(offset.device)  # (B,)
        idx, _ = knn(new_coord, coord, self.k, new_offset, offset, fill="nearest")  # (M, k)
        m, k = idx.shape
        linear, norm, _ = self.mlp
        # h_ij = W [p_j - p_i, x_j] = (W_x x)_j + W_p (p_j - p_i): the feature part runs once
        # per source point (N rows) instead of once per edge (M k rows).
        w_p, w_x = linear.weight[:, :3], linear.weight[:, 3:]  # (C_out, 3), (C_out, C_in)
        rel = coord[idx] - new_coord.unsqueeze(1)  # (M, k, 3)
        f = torch.matmul(feat, w_x.t())  # (N, C_out)
        # BatchNorm is s * h + t per channel and ReLU is monotone, so the max over j of
        # ReLU(s h_ij + t) is ReLU(s h_ij* + t) at the j* maximising sign(s) h_ij: only the
        # selected edges enter autograd; the statistics over all edges come in the same pass.
        # sign(scale) = sign(BN weight); a zero weight ties every edge: the first, as torch.max picks
        direction = norm.weight.detach().sign() if norm.weight is not None else torch.ones(f.shape[1], device=f.device)
        h, mean, var = selected_edges(f, rel, w_p, idx, direction, stats=uses_batch_stats(norm))  # (M, C_out), (C_out,) x 2
        scale, shift = batchnorm_fold(norm, mean, var, m * k, f.dtype)  # (C_out,) each
        return Level(new_coord, torch.relu(scale * h + shift), new_offset)  # (M, C_out)


class GridPoolDown(nn.Module):
    r"""Down-sampling by voxel pooling (PTv2 grid pooling).

    :math:`h = \mathrm{ReLU}(\mathrm{BN}(W x))` per point, then per voxel of edge
    ``grid_size`` (per cloud, origin at the cloud's minimum corner) the max of :math:`h`
    and the mean of the coordinates. ``cluster`` (N,) maps every input point to its voxel.

    Shapes:
        level: coord (N, 3), feat (N, in_channels), offset (B,)
        -> (Level(coord (V, 3), feat (V, out_channels), offset (B,)), cluster (N,) int64)
    """

    def __init__(self, in_channels: int, out_channels: int, *, grid_size: float) -> None:
        super().__init__()
        if not grid_size > 0:
            raise ConfigError(f"GridPoolDown.grid_size must be > 0, got {grid_size}")
        self.grid_size = float(grid_size)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.mlp = linear_bn_relu(in_channels, out_channels)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, grid_size={self.grid_size:g}"

    def forward(self, level: Level) -> tuple[Level, Tensor]:
        coord, feat, offset = level
        h = self.mlp(feat)  # (N, C_out)
        pooled = grid_pool(coord, self.grid_size, offset, h, reduce="max")
        return Level(pooled.coord, pooled.feat, pooled.offset), pooled.cluster  # (V, ...), (N,)


class TransitionUp(nn.Module):
    r"""Up-sampling by 3-NN inverse-distance interpolation plus a skip connection (PTv1).

    Decoder level (``skip_channels`` given):

    .. math::
        y_i = \mathrm{ReLU}(\mathrm{BN}(W_s s_i)) + \sum_{j \in 3NN(i)} w_{ij}\,
              \mathrm{ReLU}(\mathrm{BN}(W_c x_j))

    with :math:`s` the encoder (skip) features of the fine points, :math:`x` the coarse
    features and :math:`w_{ij}` normalised inverse distances.

    Deepest level (``skip_channels=None``): no interpolation; each point's features are
    concatenated with its cloud's global mean passed through ``Linear(C, C)-ReLU``, then
    ``Linear(2C, C)-BN-ReLU``.

    Shapes:
        coarse: coord (M, 3), feat (M, in_channels), offset (B,);
        fine: coord (N, 3), feat (N, skip_channels), offset (B,)
        -> Level(fine.coord, (N, out_channels), fine.offset)
        deepest: coarse (M, C) -> Level(coarse.coord, (M, C), coarse.offset)
    """

    def __init__(self, in_channels: int, out_channels: int | None = None, *, skip_channels: int | None = None) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.head = skip_channels is None
        if self.head:
            self.out_channels = in_channels
            self.global_mlp = nn.Sequential(nn.Linear(in_channels, in_channels), nn.ReLU(inplace=True))
            self.mlp = linear_bn_relu(2 * in_channels, in_channels)
        else:
            if out_channels is None:
                raise ConfigError("TransitionUp: out_channels is needed with skip_channels")
            self.out_channels = out_channels
            self.skip = linear_bn_relu(skip_channels, out_channels)
            self.coarse = linear_bn_relu(in_channels, out_channels)

    def forward(self, coarse: Level, fine: Level | None = None) -> Level:
        if self.head:
            coord, feat, offset = coarse
            g = self.global_mlp(segment_mean(feat, offset))  # (B, C)
            batch = offset_to_batch(offset).to(feat.device)  # (M,)
            return Level(coord, self.mlp(torch.cat([feat, g[batch]], dim=1)), offset)  # (M, C)
        if fine is None:
            raise DataError("TransitionUp: a decoder level needs the fine (skip) level")
        up = interpolate(coarse.coord, self.coarse(coarse.feat), fine.coord, coarse.offset, fine.offset)  # (N, C_out)
        return Level(fine.coord, self.skip(fine.feat) + up, fine.offset)  # (N, C_out)


class ClassificationHead(nn.Module):
    r"""MLP head of a cloud descriptor: ``(Linear-BN-ReLU-Dropout) x len(hidden)`` then ``Linear``.

    PTv1 uses hidden widths (256, 128) with dropout 0.5.

    Shapes:
        x: (B, in_channels) -> (B, num_classes)
    """

    def __init__(self, in_channels: int, num_classes: int, hidden: tuple[int, ...] = (256, 128), dropout: float = 0.5) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_channels
        for h in hidden:
            layers += [nn.Linear(width, h, bias=False), nn.BatchNorm1d(h), nn.ReLU(inplace=True), nn.Dropout(dropout)]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.mlp = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.mlp(x)  # (B, num_classes)


class SegmentationHead(nn.Module):
    r"""Per-point head ``Linear-BN-ReLU-[Dropout]-Linear`` with an optional cloud condition.

    With ``num_conditions > 0`` (ShapeNetPart: the object category) the one-hot vector of
    each point's cloud condition is concatenated to its features first:
    :math:`y_i = W_2\,\mathrm{ReLU}(\mathrm{BN}(W_1 [x_i, e_{c(b(i))}]))`.

    Shapes:
        x: (N, in_channels), offset: (B,), condition: (B,) int64 in [0, num_conditions)
        -> (N, num_classes)
    """

    def __init__(self, in_channels: int, num_classes: int, *, num_conditions: int = 0, dropout: float = 0.0) -> None:
        super().__init__()
        self.num_conditions = num_conditions
        width = in_channels + num_conditions
        self.mlp = nn.Sequential(
            nn.Linear(width, in_channels, bias=False), nn.BatchNorm1d(in_channels), nn.ReLU(inplace=True),
            nn.Dropout(dropout), nn.Linear(in_channels, num_classes),
        )

    def forward(self, x: Tensor, offset: Tensor, condition: Tensor | None = None) -> Tensor:
        if self.num_conditions:
            if condition is None:
                raise DataError(f"batch: this model needs 'category' (B,) with values in [0, {self.num_conditions})")
            condition = torch.as_tensor(condition, device=x.device).reshape(-1).long()  # (B,)
            if condition.shape[0] != offset.shape[0] or (condition.numel() and (int(condition.min()) < 0 or int(condition.max()) >= self.num_conditions)):
                raise DataError(f"batch['category']: expected {offset.shape[0]} values in [0, {self.num_conditions}), got {condition.tolist()[:8]}")
            onehot = nn.functional.one_hot(condition, self.num_conditions).to(x.dtype)  # (B, K)
            x = torch.cat([x, onehot[offset_to_batch(offset).to(x.device)]], dim=1)  # (N, C + K)
        return self.mlp(x)  # (N, num_classes)
