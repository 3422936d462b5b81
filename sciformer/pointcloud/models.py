"""Point Transformer (v1) models, registered in :data:`sciformer.registry.MODELS`.

Both models take the packed batch of the point-cloud datasets (``coord`` (N, 3), ``feat``
(N, C) with C possibly 0, ``offset`` (B,), ShapeNetPart adds ``category`` (B,)) and
return logits:

- ``point_transformer_cls``: encoder, global average pooling per cloud, MLP head
  -> (B, num_classes).
- ``point_transformer_seg``: U-Net of encoder stages and decoders -> (N, num_classes);
  with ``use_category`` the one-hot object category joins the head input (ShapeNetPart).

An encoder stage is a :class:`~sciformer.pointcloud.layers.TransitionDown` (FPS to
1/stride of each cloud and kNN max-pooling, or Linear-BN-ReLU for stride 1) followed by
``blocks`` :class:`~sciformer.attention.point_block.PointTransformerBlock` sharing one
kNN index (k neighbours, self included); ``downsample: grid`` replaces FPS by PTv2-style
voxel pooling (``grid_sizes``, one per stage with stride > 1), and ``attention: ptv2``
replaces the v1 vector attention by PTv2's grouped vector attention
(:class:`~sciformer.attention.grouped.GroupedVectorAttention`, ``channels / share_planes``
groups, optional ``pe_multiplier`` and ``attn_drop``); together they give a PTv2-style
network. Defaults are the paper's
segmentation network:
channels 32/64/128/256/512, blocks 1/2/3/5/2, strides 1/4/4/4/4, k 16, share_planes 8.
``k`` is one neighbour count or one per stage (the reference network: ``[8, 16, 16, 16, 16]``).
Input features are ``feat`` with the coordinates appended (``use_coord_as_feature``).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor, nn

from sciformer.attention.point_block import PointTransformerBlock
from sciformer.contracts import DataInfo
from sciformer.errors import ConfigError, DataError
from sciformer.geometry.pyg import as_packed_batch
from sciformer.pointcloud.layers import (
    ClassificationHead,
    GridPoolDown,
    Level,
    SegmentationHead,
    TransitionDown,
    TransitionUp,
    segment_mean,
    stage_neighbours,
)
from sciformer.registry import MODELS

__all__ = [
    "PointTransformerClassifier",
    "PointTransformerClsConfig",
    "PointTransformerEncoder",
    "PointTransformerSegConfig",
    "PointTransformerSegmenter",
    "input_level",
]


# --------------------------------------------------------------------------- configs
class PointTransformerConfig(BaseModel):
    """Encoder parameters shared by the classification and segmentation models."""

    model_config = ConfigDict(extra="forbid")

    channels: list[int] = Field(default_factory=lambda: [32, 64, 128, 256, 512], min_length=1)
    blocks: list[int] = Field(default_factory=lambda: [1, 2, 3, 5, 2], min_length=1)
    strides: list[int] = Field(default_factory=lambda: [1, 4, 4, 4, 4], min_length=1)
    k: int | list[int] = 16  # neighbours of attention and of transition down, self included; one per stage or one for all
    share_planes: int = Field(8, ge=1)  # channels sharing one attention weight
    use_coord_as_feature: bool = True  # append coord (3) to feat
    drop_path: float = Field(0.0, ge=0.0, lt=1.0)  # stochastic depth, linearly increasing
    memory_efficient: bool = True  # chunked attention with recomputation (see PointTransformerLayer)
    chunk_size: int | None = Field(None, ge=1)  # points per attention chunk; None: automatic
    downsample: Literal["fps", "grid"] = "fps"  # stages with stride > 1: FPS + kNN max (PTv1) or voxel pooling (PTv2)
    grid_sizes: list[float] | None = None  # downsample grid: voxel edge of each stage with stride > 1
    attention: Literal["ptv1", "ptv2"] = "ptv1"  # vector attention (PTv1) or grouped vector attention (PTv2)
    pe_multiplier: bool = False  # ptv2: relative position also multiplies the query-key relation
    attn_drop: float = Field(0.0, ge=0.0, lt=1.0)  # ptv2: dropout on attention weights

    def stage_k(self) -> list[int]:
        """Neighbour count of every stage (``k`` repeated when it is one integer)."""
        return [self.k] * len(self.channels) if isinstance(self.k, int) else list(self.k)

    def block_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of every :class:`PointTransformerBlock` of the network."""
        if self.attention == "ptv2":
            return {"attention": "ptv2", "share_planes": self.share_planes, "pe_multiplier": self.pe_multiplier,
                    "attn_drop": self.attn_drop, "chunk_size": self.chunk_size}
        return {"share_planes": self.share_planes, "memory_efficient": self.memory_efficient, "chunk_size": self.chunk_size}

    @model_validator(mode="after")
    def _check_stages(self) -> PointTransformerConfig:
        n = len(self.channels)
        downs = sum(s > 1 for s in self.strides)
        if self.attention == "ptv1" and (self.pe_multiplier or self.attn_drop):
            raise ValueError("pe_multiplier and attn_drop belong to attention 'ptv2'")
        if self.downsample == "grid" and (self.grid_sizes is None or len(self.grid_sizes) != downs or min(self.grid_sizes, default=1) <= 0):
            raise ValueError(f"downsample 'grid' needs grid_sizes: {downs} positive voxel sizes, one per stage with stride > 1, got {self.grid_sizes}")
        if len(self.blocks) != n or len(self.strides) != n:
            raise ValueError(f"channels, blocks and strides need one entry per stage; got {n}, {len(self.blocks)} and {len(self.strides)}")
        ks = self.stage_k()
        if len(ks) != n or min(ks) < 1:
            raise ValueError(f"k: expected a positive integer or one per stage ({n}), got {self.k}")
        for name, values, low in (("channels", self.channels, 1), ("blocks", self.blocks, 0), ("strides", self.strides, 1)):
            if any(v < low for v in values):
                raise ValueError(f"{name} must be >= {low} everywhere, got {values}")
        for c, b in zip(self.channels, self.blocks):
            if b and c % self.share_planes:
                raise ValueError(f"share_planes={self.share_planes} must divide every stage width with blocks, not {c}")
        return self


class PointTransformerClsConfig(PointTransformerConfig):
    """``model:`` parameters of ``point_transformer_cls``."""

    head_hidden: list[int] = Field(default_factory=lambda: [256, 128])
    dropout: float = Field(0.5, ge=0.0, lt=1.0)  # head dropout


class PointTransformerSegConfig(PointTransformerConfig):
    """``model:`` parameters of ``point_transformer_seg``."""

    decoder_blocks: int = Field(1, ge=0)  # attention blocks after each transition up
    use_category: bool | None = None  # one-hot category into the head; None: when the data has categories
    dropout: float = Field(0.0, ge=0.0, lt=1.0)  # head dropout


# --------------------------------------------------------------------------- input
def input_level(batch: dict[str, Any], in_channels: int, use_coord: bool) -> Level:
    """Check the packed batch and build the input level: features ``[feat, coord]``.

    With no channels at all (no ``feat`` channels and ``use_coord=False``) the feature is
    a constant 1 per point.

    Shapes:
        batch["coord"]: (N, 3), batch["feat"]: (N, C) or absent, batch["offset"]: (B,)
        -> Level(coord (N, 3), feat (N, max(1, C + 3 * use_coord)), offset (B,))
    """
    if not isinstance(batch, dict) or "coord" not in batch or "offset" not in batch:
        raise DataError("batch: expected a dict with 'coord' (N, 3), 'feat' (N, C) and 'offset' (B,)")
    coord, offset = batch["coord"], batch["offset"]
    if not torch.is_tensor(coord) or coord.ndim != 2 or coord.shape[1] != 3 or coord.shape[0] == 0:
        raise DataError(f"batch['coord']: expected shape (N, 3) with N > 0, got {tuple(getattr(coord, 'shape', ()))}")
    coord = coord.float() if not coord.is_floating_point() or coord.dtype == torch.float64 else coord
    n = coord.shape[0]
    offset = torch.as_tensor(offset, dtype=torch.int64, device=coord.device)
    if offset.ndim != 1 or offset.numel() == 0 or int(offset[-1]) != n:
        raise DataError(f"batch['offset']: expected cumulative cloud ends ending at N={n}, got {offset.tolist()[:8]}")
    feat = batch.get("feat")
    if feat is None:
        feat = coord.new_zeros((n, 0))
    if not torch.is_tensor(feat) or feat.ndim != 2 or feat.shape[0] != n or feat.shape[1] != in_channels:
        raise DataError(f"batch['feat']: expected shape ({n}, {in_channels}), got {tuple(getattr(feat, 'shape', ()))}")
    parts = [feat.to(coord.dtype)] + ([coord] if use_coord else [])
    x = torch.cat(parts, dim=1)  # (N, C + 3)
    if x.shape[1] == 0:
        x = coord.new_ones((n, 1))  # (N, 1)
    return Level(coord, x, offset)


def input_channels(in_channels: int, use_coord: bool) -> int:
    """Width of :func:`input_level`'s features for ``in_channels`` feat channels."""
    return max(1, in_channels + (3 if use_coord else 0))


# --------------------------------------------------------------------------- encoder
MIN_BATCHNORM_POINTS = 8  # below this many points in a training batch, a stage's BatchNorm is unstable (measured: gradients of 1e8 and more)


class EncoderStage(nn.Module):
    r"""Transition down (or grid pooling) then ``blocks`` Point Transformer blocks sharing one kNN index.

    .. math::
        x^{(0)} = \mathrm{TD}(x),\qquad x^{(l+1)} = \mathrm{PTB}_l(x^{(l)}, p, \mathrm{knn}_k(p))

    Shapes:
        level: coord (N, 3), feat (N, in_channels), offset (B,)
        -> (Level(coord (M, 3), feat (M, out_channels), offset (B,)), idx (M, k) or None)
    """

    def __init__(self, in_channels: int, out_channels: int, *, blocks: int, stride: int, k: int, drop_path: list[float],
                 grid_size: float | None = None, **block_kwargs: Any) -> None:
        super().__init__()
        self.k = k
        self.down: nn.Module
        if grid_size is not None and stride > 1:
            self.down = GridPoolDown(in_channels, out_channels, grid_size=grid_size)
        else:
            self.down = TransitionDown(in_channels, out_channels, stride=stride, k=k)
        self.blocks = nn.ModuleList(PointTransformerBlock(out_channels, drop_path=dp, **block_kwargs) for dp in drop_path[:blocks])

    def forward(self, level: Level) -> tuple[Level, Tensor | None]:
        out = self.down(level)
        level = out[0] if isinstance(self.down, GridPoolDown) else out  # grid pooling also returns the voxel map
        m = level.coord.shape[0]
        if self.training and m < MIN_BATCHNORM_POINTS:
            warnings.warn(f"a down-sampled stage keeps {m} points for the whole batch ({level.offset.numel()} clouds): "
                          "BatchNorm statistics over so few points make gradients explode (the loss soon becomes NaN); "
                          "use larger clouds or batches, or fewer / smaller model.strides", RuntimeWarning, stacklevel=2)
        if not len(self.blocks):
            return level, None
        idx = stage_neighbours(level.coord, level.offset, self.k)  # (M, k)
        x = level.feat  # (M, C)
        for block in self.blocks:
            x = block(x, level.coord, idx)  # (M, C)
        return Level(level.coord, x, level.offset), idx


class PointTransformerEncoder(nn.Module):
    """Stages of :class:`EncoderStage`; returns every level (finest first) and its kNN index.

    Shapes:
        level: coord (N, 3), feat (N, in_channels), offset (B,)
        -> S levels (coord (N_s, 3), feat (N_s, channels[s]), offset (B,)), S indices (N_s, k) or None
    """

    def __init__(self, in_channels: int, cfg: PointTransformerConfig) -> None:
        super().__init__()
        total = sum(cfg.blocks)
        rates = torch.linspace(0, cfg.drop_path, total).tolist() if total else []
        block_kwargs = cfg.block_kwargs()
        grids = iter(cfg.grid_sizes or []) if cfg.downsample == "grid" else None
        stages, width, used = [], in_channels, 0
        for c, b, s, k in zip(cfg.channels, cfg.blocks, cfg.strides, cfg.stage_k()):
            grid = next(grids) if grids is not None and s > 1 else None
            stages.append(EncoderStage(width, c, blocks=b, stride=s, k=k, drop_path=rates[used : used + b], grid_size=grid, **block_kwargs))
            width, used = c, used + b
        self.stages = nn.ModuleList(stages)

    def forward(self, level: Level) -> tuple[list[Level], list[Tensor | None]]:
        levels, indices = [], []
        for stage in self.stages:
            level, idx = stage(level)
            levels.append(level)
            indices.append(idx)
        return levels, indices


# --------------------------------------------------------------------------- models
class PointTransformerClassifier(nn.Module):
    r"""Point Transformer classification network.

    .. math::
        z_b = \frac{1}{|P_b|}\sum_{i \in P_b} \mathrm{Enc}(x, p)_i,\qquad
        \mathrm{logits}_b = \mathrm{MLP}(z_b)

    over the points :math:`P_b` of the coarsest level of cloud b.

    Shapes:
        batch: coord (N, 3), feat (N, in_channels), offset (B,) -> (B, num_classes)
    """

    def __init__(self, cfg: PointTransformerClsConfig, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.in_channels, self.use_coord = in_channels, cfg.use_coord_as_feature
        self.encoder = PointTransformerEncoder(input_channels(in_channels, self.use_coord), cfg)
        self.head = ClassificationHead(cfg.channels[-1], num_classes, tuple(cfg.head_hidden), cfg.dropout)

    def forward(self, batch: dict[str, Any]) -> Tensor:
        batch = as_packed_batch(batch)  # a PyG Data/Batch (pos, x, batch) works too
        level = input_level(batch, self.in_channels, self.use_coord)
        levels, _ = self.encoder(level)
        pooled = segment_mean(levels[-1].feat, levels[-1].offset)  # (B, C)
        return self.head(pooled)  # (B, num_classes)


class DecoderStage(nn.Module):
    r"""Transition up (interpolation + skip, or the deepest level's global context) then blocks.

    Shapes:
        coarse: (M, in_channels) level; fine: (N, skip_channels) level or None (deepest);
        idx: (N, k) or None -> Level(feat (N, out_channels))
    """

    def __init__(self, in_channels: int, out_channels: int, *, skip_channels: int | None, blocks: int, k: int, **block_kwargs: Any) -> None:
        super().__init__()
        self.k = k
        self.up = TransitionUp(in_channels, out_channels, skip_channels=skip_channels)
        self.blocks = nn.ModuleList(PointTransformerBlock(self.up.out_channels, **block_kwargs) for _ in range(blocks))

    def forward(self, coarse: Level, fine: Level | None, idx: Tensor | None) -> Level:
        level = self.up(coarse, fine)
        if not len(self.blocks):
            return level
        if idx is None:
            idx = stage_neighbours(level.coord, level.offset, self.k)  # (N, k)
        x = level.feat
        for block in self.blocks:
            x = block(x, level.coord, idx)  # (N, C)
        return Level(level.coord, x, level.offset)


class PointTransformerSegmenter(nn.Module):
    r"""Point Transformer U-Net for per-point classification.

    Encoder levels :math:`E_1..E_S` (finest first); the decoder starts at
    :math:`D_S = \mathrm{Up}_{head}(E_S)` and goes :math:`D_s = \mathrm{Up}(D_{s+1}, E_s)`,
    each followed by ``decoder_blocks`` attention blocks (kNN index shared with the
    encoder level); the head maps :math:`D_1` (plus the one-hot category) to logits.

    Shapes:
        batch: coord (N, 3), feat (N, in_channels), offset (B,), category (B,) when used
        -> (N, num_classes)
    """

    def __init__(self, cfg: PointTransformerSegConfig, in_channels: int, num_classes: int, num_categories: int = 0) -> None:
        super().__init__()
        self.in_channels, self.use_coord = in_channels, cfg.use_coord_as_feature
        self.encoder = PointTransformerEncoder(input_channels(in_channels, self.use_coord), cfg)
        block_kwargs = cfg.block_kwargs()
        ch, ks = cfg.channels, cfg.stage_k()
        decoders = [DecoderStage(ch[-1], ch[-1], skip_channels=None, blocks=cfg.decoder_blocks, k=ks[-1], **block_kwargs)]
        for s in range(len(ch) - 2, -1, -1):
            decoders.append(DecoderStage(ch[s + 1], ch[s], skip_channels=ch[s], blocks=cfg.decoder_blocks, k=ks[s], **block_kwargs))
        self.decoders = nn.ModuleList(decoders)
        self.num_categories = num_categories
        self.head = SegmentationHead(ch[0], num_classes, num_conditions=num_categories, dropout=cfg.dropout)

    def forward(self, batch: dict[str, Any]) -> Tensor:
        batch = as_packed_batch(batch)  # a PyG Data/Batch (pos, x, batch) works too
        level = input_level(batch, self.in_channels, self.use_coord)
        levels, indices = self.encoder(level)
        x = self.decoders[0](levels[-1], None, indices[-1])
        for decoder, fine, idx in zip(self.decoders[1:], levels[-2::-1], indices[-2::-1]):
            x = decoder(x, fine, idx)
        return self.head(x.feat, x.offset, batch.get("category") if self.num_categories else None)  # (N, num_classes)


# --------------------------------------------------------------------------- builders
def _check_task(info: DataInfo, expected: str, name: str) -> None:
    task = info.task
    if task is not None and task != expected:
        raise ConfigError(f"model.name: '{name}' is a {expected} model but the data is a {task} task")


def category_count(use_category: bool | None, info: DataInfo) -> int:
    """Object categories a segmenter conditions on: all of the data's when ``use_category`` is
    None (part segmentation), none when False; True without categories is a ConfigError."""
    categories = info.category_names or []
    use = bool(categories) if use_category is None else use_category
    if use and not categories:
        raise ConfigError("model.use_category: the data has no object categories (DataInfo.category_names)")
    return len(categories) if use else 0


@MODELS.register("point_transformer_cls", config=PointTransformerClsConfig)
def build_point_transformer_cls(cfg: PointTransformerClsConfig, info: DataInfo) -> nn.Module:
    """Point Transformer classifier: encoder, average pooling per cloud, MLP head."""
    _check_task(info, "classification", "point_transformer_cls")
    return PointTransformerClassifier(cfg, info.in_channels, info.num_classes)


@MODELS.register("point_transformer_seg", config=PointTransformerSegConfig)
def build_point_transformer_seg(cfg: PointTransformerSegConfig, info: DataInfo) -> nn.Module:
    """Point Transformer U-Net segmenter (optional one-hot category for part segmentation)."""
    _check_task(info, "segmentation", "point_transformer_seg")
    return PointTransformerSegmenter(cfg, info.in_channels, info.num_classes, num_categories=category_count(cfg.use_category, info))
